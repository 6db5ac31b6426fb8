/*
 * echo-serve: OpenAI-compatible HTTP server over the engine (see
 * server/server.h and server/README.md).
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "server/server.h"
#include "tools/cli.h"

#define PROG "echo-serve"

static const char *USAGE =
    "usage: echo-serve --model NAME|DIR [options]\n"
    "\n"
    "Serve a Qwen3 model over an OpenAI-compatible HTTP API (/v1/completions,\n"
    "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics).\n"
    "\n"
    "  --model NAME|DIR             model folder, or a name looked up in $ECHO_MODEL_DIR/NAME,\n"
    "                               ./models/NAME and the Hugging Face cache\n"
    "                               (qwen3-8b -> models--Qwen--Qwen3-8B/snapshots/<rev>), or a random\n"
    "                               model of a published shape, no files (speed and memory tests only):\n"
    "                               random:qwen3-8b[,layers=N][,seed=S] (also qwen3-0.6b); needs\n"
    "                               --tokenizer\n"
    "  --tokenizer DIR              tokenizer.json + tokenizer_config.json from DIR instead of the model\n"
    "                               folder (e.g. tests/fixtures/tokenizer/qwen3, Qwen3's own)\n"
    "  --tp N                       tensor-parallel ranks (default 1)\n"
    "  --device auto|cuda|cpu       backend (default auto: cuda when built and usable, else cpu)\n"
    "  --allreduce auto|auto:echo3|echo|echo-nofb|int4|bf16|exact|echo3  all-reduce of the row-parallel\n"
    "                               layers when --tp > 1 (default auto: measured at start-up, the fastest\n"
    "                               of exact, bf16 and echo (auto:echo3: and echo3) per call size, the\n"
    "                               plan line says which; echo: --echo-codec's 4.5-bit codes with error feedback;\n"
    "                               echo-nofb: the same codec without feedback; int4: the paper's int4\n"
    "                               codec, G 64, no feedback; bf16: 16-bit sums; exact: fp32;\n"
    "                               echo3: hnf3-g256 3-bit codes with feedback, 3.46 bits/value; on a GPU the last call exact)\n"
    "  --echo-codec NAME[-gG]       codec of echo/echo-nofb: int4, hadamard, hsub6, out2 or hout2 (default\n"
    "                               hout2-g128, docs/accuracy.md); -gG sets the group too\n"
    "  --transport auto|local|nccl  all-reduce transport when --tp > 1 (default auto: on cuda, nccl\n"
    "                               with one GPU per rank when there are --tp GPUs, else local:\n"
    "                               every rank on GPU 0)\n"
    "  --cuda-graphs                decode steps through CUDA graphs (cuda; recorded once per batch\n"
    "                               size, then replayed; same tokens; at --tp > 1 the nccl\n"
    "                               transport's all-reduces are captured too). Off by default; no\n"
    "                               effect on cpu or with --transport local at --tp > 1 (a note\n"
    "                               says so)\n"
    "  --echo-min-bytes N     all-reduce messages below N bytes take the exact path (default 0)\n"
    "  --echo-group G         values per scale group, 16..256 (default: the codec's, 128 for hout2)\n"
    "  --quantize q8_0              quantize F32/F16/BF16 matrices to Q8_0 at load (cpu; ggml's rounding)\n"
    "  --act-quant auto|none|q8_0   q8_0: the quantized matrices (a GGUF's Q8_0/Q4_*/Q5_*/Q6_K,\n"
    "                               --quantize's) multiply activations quantized to 8 bits per 32-block,\n"
    "                               in integers, as llama.cpp does (cpu; faster, not the dequantized\n"
    "                               weights' bits). auto (default): on a GGUF's quantized matrices;\n"
    "                               none: the exact path. The start-up plan says which ran\n"
    "  --overlap auto|off|N         prefill overlap at --tp > 1 on cpu: a step of >= 128 tokens runs as\n"
    "                               N micro-batches, one's all-reduce on a communication thread while\n"
    "                               the next computes (exact/bf16 bits unchanged). auto (default): 2\n"
    "                               under mpirun, off for ranks as threads. The start-up plan says which\n"
    "  --oneshot auto|off|BYTES     one-shot all-reduce (every rank's message to every rank, one network\n"
    "                               step) for calls of <= BYTES of fp32 at --tp > 1 on cpu (exact bits\n"
    "                               unchanged). auto (default): 8192 under mpirun, off for ranks as\n"
    "                               threads. The start-up plan says which\n"
    "  --threads N                  cpu threads in total (default: all online CPUs)\n"
    "  --host ADDR                  numeric address to bind (default 127.0.0.1)\n"
    "  --port N                     port (default 8000; 0 = any free port, printed at start)\n"
    "  --served-model-name NAME     model id in the API (default: the folder's name)\n"
    "  --max-num-seqs N             requests decoded together (default 8)\n"
    "  --max-num-batched-tokens N   tokens per step, the chunked-prefill budget (default 512)\n"
    "  --max-model-len N            longest prompt + completion (default min(model, 4096))\n"
    "  --rope-scaling SPEC          replace the config's rope scaling: none, yarn:FACTOR[:ORIG_CONTEXT]\n"
    "                               (e.g. yarn:4: Qwen3 to 131,072 tokens; ORIG_CONTEXT default: the\n"
    "                               config's max_position_embeddings) or a JSON rope_scaling object.\n"
    "                               Default: the config's own (Qwen: turn YaRN on only for long inputs)\n"
    "  --num-kv-blocks N            KV blocks of 16 tokens (default: what --kv-cache-memory holds, at\n"
    "                               most max-num-seqs full sequences)\n"
    CLI_KV_HELP
    "  --no-prefix-caching          recompute every prompt from its first token (default: full KV\n"
    "                               blocks of earlier prompts are kept while memory allows and a\n"
    "                               prompt sharing their prefix reuses them; usage reports\n"
    "                               prompt_tokens_details.cached_tokens)\n"
    CLI_SPEC_HELP
    CLI_SPEC_SERVE_HELP
    "                         (/metrics: echo:spec_decode_*; timings.speculative per response)\n"
    "  --max-queue N                waiting requests before 503 (default 256)\n"
    "  --max-connections N          simultaneous HTTP connections (default 256)\n"
    "  --timeout S                  close idle connections after S seconds (default 30)\n"
    "  --request-deadline S         a request's headers and body must arrive within S seconds, else its\n"
    "                               connection is closed (slow clients; default 30)\n"
    "  --max-connections-per-client N   connections from one client address; 503 beyond\n"
    "                               (default max-connections / 2)\n"
    "  --max-body-bytes N           request body limit, 413 beyond (default 8388608)\n"
    "  --drain-seconds S            on SIGINT/SIGTERM, let running requests finish this long (default 5)\n"
    "  --api-key KEY                require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize\n"
    "                               (also read from $ECHO_API_KEY)\n"
    "  --grammar-compiles N         structured-output grammars compiled at once, each on its own\n"
    "                               thread (1 xgrammar thread, nice 19, 64 MiB stack); others wait\n"
    "                               (default 2)\n"
    "  --grammar-compile-timeout S  a request's grammar must compile (queue wait included) within S\n"
    "                               seconds, else 503 and the compile is abandoned (default 10).\n"
    "                               Fixed budgets, checked before compiling (400 beyond): JSON schema\n"
    "                               nesting 32 (through $refs), 2000 nodes after $ref resolution,\n"
    "                               256 $refs, 256 properties with 16 KiB of names, 1024 enum\n"
    "                               values, 64 KiB of const/enum/pattern text; 1024 choices of\n"
    "                               64 KiB in all;\n"
    "                               a regex or grammar of 64 KiB. Worst accepted compile measured\n"
    "                               on SmolLM2 (2-core VM): 2.0 s, +32 MB (docs/structured-outputs.md)\n"
    "  --log-level debug|info|warning|error   (default info)\n"
    "  --reasoning-parser auto|none|qwen3|deepseek_r1   split a thinking model's <think> block from its\n"
    "                               answer into the reasoning field (default auto: qwen3 when the chat\n"
    "                               template writes <think>, deepseek_r1 when its generation prompt\n"
    "                               opens the block, else none; none: the raw text in content)\n"
    "  --reasoning-field reasoning_content|reasoning|both   name of the thinking in chat answers and\n"
    "                               stream deltas (default reasoning_content: llama.cpp, DeepSeek, the\n"
    "                               Vercel AI SDK, OpenCode; reasoning: vLLM's name)\n"
    "  --reasoning-budget N         close the thinking block after N thinking tokens (the end marker is\n"
    "                               emitted); a request's thinking_budget overrides it (default: none)\n"
    "  --tool-call-parser auto|hermes|qwen3_coder|mistral   tool-call syntax (default auto: from the\n"
    "                               chat template, hermes when it names none)\n"
    "  --debug-load-delay S         testing: wait S seconds before loading (503 state)\n"
    "  --debug-request-fields       testing: accept the request field debug_force_output (the output's\n"
    "                               first tokens are that text's; default off: a 400)\n"
    "  -h, --help                   this help\n"
    "\n"
    "Exit status: 0 after a clean shutdown (SIGINT/SIGTERM), 1 runtime error, 2 usage error.\n";

static volatile sig_atomic_t g_stop = 0; /* the only thing the signal handler touches */

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

/* Greedy examples (temperature 0): a small model sampled at the API's
 * default temperature 1 answers a new user's first question with noise. */
static void print_examples(const char *host, int port, const char *name, const char *key) {
    char auth[512] = "";
    if (key) snprintf(auth, sizeof auth, " -H 'Authorization: Bearer %s'", key);
    const char *h = strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 ? "127.0.0.1" : host;
    printf("\necho-serve is ready on http://%s:%d (model \"%s\")\n\n", h, port, name);
    printf("  curl http://%s:%d/v1/chat/completions%s -H 'Content-Type: application/json' \\\n"
           "    -d '{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of "
           "France?\"}], \"max_tokens\": 32, \"temperature\": 0}'\n\n",
           h, port, auth, name);
    printf("  python3 -c 'from openai import OpenAI\n"
           "c = OpenAI(base_url=\"http://%s:%d/v1\", api_key=\"%s\")\n"
           "for ch in c.chat.completions.create(model=\"%s\", stream=True, max_tokens=32, temperature=0,\n"
           "        messages=[{\"role\": \"user\", \"content\": \"Name three primary colors.\"}]):\n"
           "    print(ch.choices[0].delta.content or \"\", end=\"\", flush=True)\n"
           "print()'\n\n",
           h, port, key ? key : "none", name);
    printf("  metrics: curl http://%s:%d/metrics    stop: Ctrl-C\n\n", h, port);
    fflush(stdout);
}

enum {
    O_MODEL = 256,
    O_TP,
    O_DEVICE,
    O_ALLRED,
    O_TRANSPORT,
    O_HOST,
    O_PORT,
    O_NAME,
    O_SEQS,
    O_BTOK,
    O_MLEN,
    O_ROPE,
    O_TOKENIZER,
    O_KVB,
    O_QUEUE,
    O_CONNS,
    O_TIMEOUT,
    O_BODY,
    O_DRAIN,
    O_KEY,
    O_LOG,
    O_GCOMPILES,
    O_GTIMEOUT,
    O_THREADS,
    O_LDELAY,
    O_MINB,
    O_GROUP,
    O_GRAPHS,
    O_NO_PREFIX,
    O_DEADLINE,
    O_PERCLIENT,
    O_CODEC,
    O_QUANT,
    O_ACTQ,
    O_OVERLAP,
    O_ONESHOT,
    O_RZ_PARSER,
    O_RZ_FIELD,
    O_RZ_BUDGET,
    O_TOOL_PARSER,
    O_DEBUG_FIELDS,
    O_KVDT,
    O_KVMEM,
    O_SPEC,
    O_SPEC_MIN,
    O_SPEC_MAX,
    O_SPEC_DRAFT,
    O_SPEC_BATCH,
    O_GPUUTIL
};
static const struct option opts[] = {
    {"model", required_argument, 0, O_MODEL},
    {"tp", required_argument, 0, O_TP},
    {"device", required_argument, 0, O_DEVICE},
    {"allreduce", required_argument, 0, O_ALLRED},
    {"transport", required_argument, 0, O_TRANSPORT},
    {"cuda-graphs", no_argument, 0, O_GRAPHS},
    {"no-prefix-caching", no_argument, 0, O_NO_PREFIX},
    {"speculative", required_argument, 0, O_SPEC},
    {"spec-ngram-min", required_argument, 0, O_SPEC_MIN},
    {"spec-ngram-max", required_argument, 0, O_SPEC_MAX},
    {"spec-draft-max", required_argument, 0, O_SPEC_DRAFT},
    {"spec-max-batch", required_argument, 0, O_SPEC_BATCH},
    {"echo-min-bytes", required_argument, 0, O_MINB},
    {"echo-group", required_argument, 0, O_GROUP},
    {"echo-codec", required_argument, 0, O_CODEC},
    {"quantize", required_argument, 0, O_QUANT},
    {"act-quant", required_argument, 0, O_ACTQ},
    {"overlap", required_argument, 0, O_OVERLAP},
    {"oneshot", required_argument, 0, O_ONESHOT},
    {"host", required_argument, 0, O_HOST},
    {"port", required_argument, 0, O_PORT},
    {"served-model-name", required_argument, 0, O_NAME},
    {"max-num-seqs", required_argument, 0, O_SEQS},
    {"max-num-batched-tokens", required_argument, 0, O_BTOK},
    {"max-model-len", required_argument, 0, O_MLEN},
    {"rope-scaling", required_argument, 0, O_ROPE},
    {"tokenizer", required_argument, 0, O_TOKENIZER},
    {"num-kv-blocks", required_argument, 0, O_KVB},
    {"kv-cache-dtype", required_argument, 0, O_KVDT},
    {"kv-cache-memory", required_argument, 0, O_KVMEM},
    {"gpu-memory-utilization", required_argument, 0, O_GPUUTIL},
    {"max-queue", required_argument, 0, O_QUEUE},
    {"max-connections", required_argument, 0, O_CONNS},
    {"timeout", required_argument, 0, O_TIMEOUT},
    {"request-deadline", required_argument, 0, O_DEADLINE},
    {"max-connections-per-client", required_argument, 0, O_PERCLIENT},
    {"max-body-bytes", required_argument, 0, O_BODY},
    {"drain-seconds", required_argument, 0, O_DRAIN},
    {"api-key", required_argument, 0, O_KEY},
    {"log-level", required_argument, 0, O_LOG},
    {"grammar-compiles", required_argument, 0, O_GCOMPILES},
    {"grammar-compile-timeout", required_argument, 0, O_GTIMEOUT},
    {"threads", required_argument, 0, O_THREADS},
    {"debug-load-delay", required_argument, 0, O_LDELAY},
    {"reasoning-parser", required_argument, 0, O_RZ_PARSER},
    {"reasoning-field", required_argument, 0, O_RZ_FIELD},
    {"reasoning-budget", required_argument, 0, O_RZ_BUDGET},
    {"tool-call-parser", required_argument, 0, O_TOOL_PARSER},
    {"debug-request-fields", no_argument, 0, O_DEBUG_FIELDS},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* The command line into *o and *model; exits on a usage error, returns 1
 * after --help. */
static int parse_args(int argc, char **argv, srv_options *o, const char **model) {
    int c;
    opterr = 0;
    cli_spec spec = CLI_SPEC_INIT;
    int li = 0;
    while ((c = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        switch (c) {
        case O_MODEL: *model = optarg; break;
        case O_TP: o->tp = (int)cli_long(PROG, optarg, "--tp", 1, 64); break;
        case O_DEVICE:
            o->device = cli_choice(PROG, optarg, "--device", cli_devices());
            break;
        case O_TRANSPORT: o->transport = cli_choice(PROG, optarg, "--transport", cli_transports()); break;
        case O_GRAPHS: o->cuda_graphs = 1; break;
        case O_NO_PREFIX: o->no_prefix_caching = 1; break;
        case O_SPEC:
        case O_SPEC_MIN:
        case O_SPEC_MAX:
        case O_SPEC_BATCH:
        case O_SPEC_DRAFT: cli_spec_flag(PROG, opts[li].name, optarg, &spec); break;
        case O_ALLRED:
            o->allreduce_auto = cli_allreduce(PROG, optarg, &o->allreduce);
            break;
        case O_CODEC: o->echo_codec = (echo_codec_id)cli_echo_codec(PROG, optarg, &o->echo_group); break;
        case O_QUANT:
            cli_choice(PROG, optarg, "--quantize", (const char *const[]){"q8_0", NULL});
            o->quantize = ENG_QUANT_Q8_0;
            break;
        case O_ACTQ:
            o->act_quant = cli_act_quant(PROG, optarg);
            break;
        case O_OVERLAP: o->overlap = cli_overlap(PROG, optarg); break;
        case O_ONESHOT: o->oneshot = cli_oneshot(PROG, optarg); break;
        case O_MINB: o->echo_min_bytes = (size_t)cli_long(PROG, optarg, "--echo-min-bytes", 0, 1L << 40); break;
        case O_GROUP: o->echo_group = (int)cli_long(PROG, optarg, "--echo-group", 16, 256); break;
        case O_HOST: o->host = optarg; break;
        case O_PORT: o->port = (int)cli_long(PROG, optarg, "--port", 0, 65535); break;
        case O_NAME:
            if (!*optarg) cli_usage_error(PROG, "%s", "--served-model-name must not be empty");
            o->served_model_name = optarg;
            break;
        case O_SEQS: o->max_num_seqs = (int)cli_long(PROG, optarg, "--max-num-seqs", 1, 4096); break;
        case O_BTOK: o->max_num_batched_tokens = (int)cli_long(PROG, optarg, "--max-num-batched-tokens", 1, 1 << 20); break;
        case O_MLEN: o->max_model_len = (int)cli_long(PROG, optarg, "--max-model-len", 1, 1 << 24); break;
        case O_ROPE: o->rope_scaling = cli_rope_scaling(PROG, optarg); break;
        case O_TOKENIZER:
            if (!*optarg) cli_usage_error(PROG, "%s", "--tokenizer must not be empty");
            o->tokenizer = optarg;
            break;
        case O_KVB: o->kv_blocks = (int)cli_long(PROG, optarg, "--num-kv-blocks", 1, 1 << 30); break;
        case O_KVDT: o->kv_dtype = cli_kv_dtype(PROG, optarg); break;
        case O_KVMEM: o->kv_cache_memory = cli_kv_memory(PROG, optarg); break;
        case O_GPUUTIL: o->gpu_memory_utilization = cli_gpu_util(PROG, optarg); break;
        case O_QUEUE: o->max_waiting = (int)cli_long(PROG, optarg, "--max-queue", 1, 1 << 20); break;
        case O_CONNS: o->max_connections = (int)cli_long(PROG, optarg, "--max-connections", 1, 65536); break;
        case O_TIMEOUT: o->timeout_s = (int)cli_long(PROG, optarg, "--timeout", 1, 86400); break;
        case O_DEADLINE: o->request_deadline_s = cli_double(PROG, optarg, "--request-deadline", 0.1, 86400); break;
        case O_PERCLIENT:
            o->max_conn_per_client = (int)cli_long(PROG, optarg, "--max-connections-per-client", 1, 65536);
            break;
        case O_BODY: o->max_body_bytes = (size_t)cli_long(PROG, optarg, "--max-body-bytes", 1024, 1L << 34); break;
        case O_DRAIN: o->drain_s = cli_double(PROG, optarg, "--drain-seconds", 0, 86400); break;
        case O_KEY:
            if (!*optarg) cli_usage_error(PROG, "%s", "--api-key must not be empty");
            o->api_key = optarg;
            break;
        case O_LDELAY: o->load_delay_s = cli_double(PROG, optarg, "--debug-load-delay", 0, 3600); break;
        case O_RZ_PARSER:
            o->reasoning_parser = cli_choice(PROG, optarg, "--reasoning-parser",
                                            (const char *const[]){"auto", "none", "qwen3", "deepseek_r1", NULL});
            break;
        case O_RZ_FIELD: {
            static const char *const fields[] = {"reasoning_content", "reasoning", "both", NULL};
            const char *f = cli_choice(PROG, optarg, "--reasoning-field", fields);
            o->reasoning_field = !strcmp(f, "reasoning_content") ? 0 : !strcmp(f, "reasoning") ? 1 : 2;
            break;
        }
        case O_RZ_BUDGET:
            o->reasoning_budget = (int)cli_long(PROG, optarg, "--reasoning-budget", 0, INT_MAX);
            o->has_reasoning_budget = 1;
            break;
        case O_TOOL_PARSER:
            o->tool_call_parser = cli_choice(PROG, optarg, "--tool-call-parser",
                                            (const char *const[]){"auto", "hermes", "qwen3_coder", "mistral", NULL});
            break;
        case O_DEBUG_FIELDS: o->debug_request_fields = 1; break;
        case O_THREADS: o->threads = (int)cli_long(PROG, optarg, "--threads", 1, 1024); break;
        case O_GCOMPILES: o->grammar_compiles = (int)cli_long(PROG, optarg, "--grammar-compiles", 1, 64); break;
        case O_GTIMEOUT:
            o->grammar_timeout_s = cli_double(PROG, optarg, "--grammar-compile-timeout", 0.1, 3600);
            break;
        case O_LOG:
            if (!strcmp(optarg, "debug"))
                o->log_level = SRV_LOG_DEBUG;
            else if (!strcmp(optarg, "info"))
                o->log_level = SRV_LOG_INFO;
            else if (!strcmp(optarg, "warning"))
                o->log_level = SRV_LOG_WARNING;
            else if (!strcmp(optarg, "error"))
                o->log_level = SRV_LOG_ERROR;
            else
                cli_usage_error(PROG, "--log-level expects debug, info, warning or error, got '%s'", optarg);
            break;
        case 'h': cli_help(USAGE); return 1;
        case '?':
        default: cli_usage_error(PROG, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) cli_usage_error(PROG, "unexpected argument '%s'", argv[optind]);
    cli_spec_finish(PROG, &spec);
    o->spec = spec.p;
    o->spec_max_batch = spec.max_batch;
    if (!*model) cli_usage_error(PROG, "%s", "--model NAME|DIR is required");
    if (!o->api_key && getenv("ECHO_API_KEY") && *getenv("ECHO_API_KEY")) o->api_key = getenv("ECHO_API_KEY");
    return 0;
}

/* Serve until SIGINT or SIGTERM, then drain and stop: the exit status. */
static int serve(srv_options *o, const char *dir) {
    char err[4096];
    /* SIGINT/SIGTERM stay blocked everywhere (threads inherit the mask)
     * and are taken only in sigsuspend() below: no lost wake-up. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);

    srv_server *s = NULL;
    if (srv_create(o, &s, err, sizeof err)) {
        fprintf(stderr, "echo-serve: error: %s\n", err);
        return 1;
    }
    srv_log(s, SRV_LOG_INFO, "listening on http://%s:%d (/health is 503 until the model is loaded)", o->host,
            srv_port(s));
    if (srv_load(s, err, sizeof err)) {
        fprintf(stderr, "echo-serve: error: %s\n", err);
        srv_destroy(s);
        return 1;
    }
    /* Machine-readable line for scripts (port 0 picks a free port). */
    srv_log(s, SRV_LOG_WARNING, "ready on port %d", srv_port(s));
    if (strstr(dir, "demo-model"))
        srv_log(s, SRV_LOG_INFO,
                "note: this is the bundled DEMO model (random Qwen3-architecture weights with the "
                "real Qwen3 tokenizer): its text is gibberish by design. Use --model for a real one.");
    print_examples(o->host, srv_port(s), srv_model_name(s), o->api_key);
    while (!g_stop)
        sigsuspend(&old);
    srv_log(s, SRV_LOG_INFO, "signal received: draining in-flight requests, then exiting");
    srv_shutdown(s);
    int compiling = srv_grammar_compiles_running(s);
    srv_destroy(s);
    fprintf(stderr, "echo-serve: stopped\n");
    if (compiling) { /* within the drain time, whatever xgrammar is doing */
        fflush(NULL);
        _exit(0);
    }
    return 0;
}

int main(int argc, char **argv) {
    cli_procs_start(PROG); /* under mpirun: ranks > 0 follow rank 0 and exit there */
    srv_options o = {.host = "127.0.0.1",
                     .port = 8000,
                     .device = "auto",
                     .tp = 1,
                     .allreduce = ECHO_PRESET_ECHO,
                     .allreduce_auto = ENG_ALLREDUCE_AUTO,
                     .drain_s = 5,
                     .grammar_compiles = 2,
                     .grammar_timeout_s = 10,
                     .act_quant = ENG_ACT_AUTO,
                     .kv_dtype = KERN_KV_BF16,
                     .kv_cache_memory = ENG_KV_MEMORY_AUTO,
                     .log_level = SRV_LOG_INFO};
    const char *model = NULL;
    if (parse_args(argc, argv, &o, &model)) return 0;
    char dir[4096], err[4096];
    if (srv_resolve_model(model, dir, sizeof dir, err, sizeof err)) {
        fprintf(stderr, "echo-serve: error: %s\n", err);
        return 1;
    }
    o.model_dir = dir;
    return serve(&o, dir);
}
