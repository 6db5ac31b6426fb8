/*
 * echo-generate: one-shot generation from a Hugging Face Qwen3 folder.
 * The JSON output (--json) is a test contract; see --help.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/chat.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/report.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli.h"

#define PROG "echo-generate"

static const char *USAGE =
    "usage: echo-generate --model DIR (--prompt-tokens ID,ID,... | --prompt TEXT [--chat]) [options]\n"
    "\n"
    "Generate tokens from a model folder (config.json + safetensors) or a GGUF file.\n"
    "\n"
    "  --model DIR            model folder (config.json, generation_config.json, *.safetensors)\n"
    "  --prompt-tokens LIST   prompt as comma-separated token ids (each in [0, vocab_size))\n"
    "  --max-tokens N         tokens to generate (default 16)\n"
    "  --temperature T        0 = greedy (default); > 0 samples from softmax(logits/T)\n"
    "  --seed S               sampling seed (default 0); same seed, same tokens\n"
    "  --top-logprobs K       report the K most likely tokens per step (0..64, default 0)\n"
    "  --ignore-eos           do not stop at the model's EOS ids\n"
    "  --json                 print one JSON object:\n"
    "                         {\"prompt_tokens\":[..],\"tokens\":[..],\"steps\":[{\"token\":ID,\"logprob\":LP,\n"
    "                          \"top_logprobs\":[[ID,LP],..]},..]} (natural-log probabilities over the\n"
    "                         full vocabulary, top list sorted descending)\n"
    "  --device auto|cpu|cuda backend; auto (default) = cuda when a GPU is visible, else cpu\n"
    "  --threads N            cpu threads in total, split across ranks (default: all online CPUs)\n"
    "  --overlap auto|off|N   prefill overlap at --tp > 1 on cpu: a prompt of >= 128 tokens runs as N\n"
    "                         micro-batches, one's all-reduce behind the next one's compute (exact and\n"
    "                         bf16 bits unchanged). auto (default): 2 under mpirun, off for threads\n"
    "  --oneshot auto|off|BYTES one-shot all-reduce (one network step) for calls of <= BYTES of fp32\n"
    "                         at --tp > 1 on cpu (exact bits unchanged). auto (default): 8192 under\n"
    "                         mpirun, off for threads\n"
    "  --tp N                 tensor-parallel ranks (threads on the cpu backend; default 1)\n"
    "  --allreduce MODE       all-reduce of the row-parallel layers when --tp > 1: auto (default:\n"
    "                         measured at start-up, the fastest of exact, bf16 and echo per call size;\n"
    "                         auto:echo3 lets it pick echo3), or one forced:\n"
    "                         echo (the 4-bit codec of --echo-codec with error feedback),\n"
    "                         echo-nofb (that codec without feedback), int4 (the paper's int4 codec,\n"
    "                         no feedback), bf16 (16-bit sums), exact (fp32 sum), echo3 (hnf3-g256,\n"
    "                         3-bit codes with feedback, the last call bf16: 3.46 bits/value; on a GPU the last call exact)\n"
    "  --transport T          all-reduce transport when --tp > 1: auto (default) or a row below;\n"
    "                         cuda: nccl = rank i on GPU i, local = every rank on GPU 0\n"
    "  --cuda-graphs          decode steps through CUDA graphs (cuda; recorded once, then replayed;\n"
    "                         same tokens; at --tp > 1 the nccl transport's all-reduces are\n"
    "                         captured too). Off by default; no effect on cpu or with\n"
    "                         --transport local at --tp > 1 (a note says so)\n"
    "  --quantize q8_0        quantize F32/F16/BF16 matrices to Q8_0 at load (cpu; ggml's rounding)\n"
    "  --act-quant auto|none|q8_0  q8_0: the quantized matrices (a GGUF's Q8_0/Q4_*/Q5_*/Q6_K,\n"
    "                         --quantize's) multiply activations quantized to 8 bits per 32-block, in\n"
    "                         integers, as llama.cpp does (cpu; faster, not the dequantized weights'\n"
    "                         bits). auto (default): on a GGUF's quantized matrices; none: exact\n"
    CLI_KV_HELP
    "  --rope-scaling SPEC    replace the config's rope scaling: none, yarn:FACTOR[:ORIG_CONTEXT]\n"
    "                         (e.g. yarn:4: Qwen3 to 131,072 tokens; ORIG_CONTEXT default: the\n"
    "                         config's max_position_embeddings) or a JSON rope_scaling object.\n"
    "                         Default: the config's own (Qwen: turn YaRN on only for long inputs)\n"
    "  --echo-min-bytes N     messages below N bytes take the exact path (default 0)\n"
    "  --echo-group G         values per scale group, 16..256 (default: the codec's)\n"
    "  --echo-codec NAME      codec of echo/echo-nofb: int4, hadamard, hsub6, out2 or hout2; NAME-gG sets G\n"
    "                         (default: comm/ default, hout2-g128; docs/accuracy.md)\n"
    "  --top-k K              with --temperature > 0: sample among the K most likely (0 = off)\n"
    "  --top-p P              with --temperature > 0: nucleus sampling mass (default 1 = off)\n"
    "  --prompt TEXT          text prompt, encoded with the model's tokenizer\n"
    "  --chat                 wrap --prompt as a user turn of the model's chat template (Qwen3's when it has none)\n"
    "                         (with the assistant generation prompt)\n"
    "  --no-thinking          with --chat: enable_thinking=false (empty <think> block)\n"
    "  --tokenizer PATH       tokenizer folder or tokenizer.json / tokenizer.model file\n"
    "                         (default: the model folder); when one is found, the text of the\n"
    "                         generated tokens is printed (and \"text\" added to --json)\n"
    CLI_SPEC_HELP
    "                         (--json adds \"speculative\": steps, drafted, accepted)\n"
    "  --timing               --json adds \"timing\": prefill_s, decode_s, decode_tok_s after the\n"
    "                         first token (off by default so that two runs' JSON compare equal)\n"
    "  -h, --help             this help\n"
    "\n"
    "Exit status: 0 success, 1 runtime error (bad model, out of memory), 2 usage error.\n";

static int32_t *parse_ids(const char *s, int *n) {
    size_t cap = 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    *n = 0;
    const char *p = s;
    while (ids) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX) cli_usage_error(PROG, "--prompt-tokens: bad token id list '%s'", s);
        if ((size_t)*n == cap) {
            int32_t *nid = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!nid) break;
            ids = nid;
        }
        ids[(*n)++] = (int32_t)v;
        if (*end == 0) return ids;
        if (*end != ',') cli_usage_error(PROG, "--prompt-tokens: bad token id list '%s'", s);
        p = end + 1;
    }
    free(ids);
    fprintf(stderr, "echo-generate: out of memory\n");
    exit(1);
}

typedef struct gen_out {
    double t_first, t_last; /* when the first and the latest token came */
    json_t *tokens, *steps;
    int json;
    int count;
    tok_stream *stream; /* NULL without a tokenizer */
    char *text;         /* decoded text so far (--json) */
    size_t text_len;
} gen_out;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Append streamed text: printed at once in text mode, collected for --json. */
static void emit_text(gen_out *o, const char *t, size_t n) {
    if (!n) return;
    if (!o->json) {
        fwrite(t, 1, n, stdout);
        fflush(stdout);
        return;
    }
    char *nt = realloc(o->text, o->text_len + n + 1);
    if (!nt) return;
    memcpy(nt + o->text_len, t, n);
    o->text = nt;
    o->text_len += n;
    nt[o->text_len] = 0;
}

static int on_step(void *user, const eng_step_out *st) {
    gen_out *o = user;
    o->count++;
    o->t_last = now_s();
    if (o->count == 1) o->t_first = o->t_last;
    if (o->stream) {
        const char *t;
        size_t n;
        char err[256];
        if (tok_stream_push(o->stream, st->token, &t, &n, err, sizeof err) == TOK_OK) emit_text(o, t, n);
    } else if (!o->json) {
        printf("%d ", st->token);
        fflush(stdout);
    }
    if (!o->json) return 0;
    json_t *top = json_array();
    for (int i = 0; i < st->n_top; i++)
        json_array_append_new(top, json_pack("[i,f]", (json_int_t)st->top_ids[i], st->top_logprobs[i]));
    json_array_append_new(o->tokens, json_integer(st->token));
    json_array_append_new(o->steps,
                          json_pack("{s:i,s:f,s:o}", "token", (json_int_t)st->token, "logprob", st->logprob,
                                    "top_logprobs", top));
    return 0;
}

/* The tokenizer is optional when the prompt is given as ids: a folder
 * without tokenizer files is then fine and output stays numeric. */
static int load_tokenizer(const char *path, int optional, tok_tokenizer **tok, eng_chat_template *chat, char *err,
                          size_t errlen) {
    struct stat st;
    int rc;
    *tok = NULL;
    if (model_path_is_gguf(path) || (stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
        rc = eng_tokenizer_load(path, tok, chat, err, errlen);
        if (rc == ENG_TOK_MISSING && optional) return 0;
        return rc == 0 ? 0 : -1;
    } else {
        size_t l = strlen(path);
        if (l >= 6 && strcmp(path + l - 6, ".model") == 0)
            rc = tok_load_sentencepiece(path, tok, err, errlen);
        else
            rc = tok_load_json_file(path, NULL, tok, err, errlen);
    }
    return rc == TOK_OK ? 0 : -1;
}

enum {
    O_MODEL = 256,
    O_PTOK,
    O_MAXTOK,
    O_TEMP,
    O_SEED,
    O_TOPLP,
    O_IGNEOS,
    O_JSON,
    O_TIMING,
    O_DEVICE,
    O_THREADS,
    O_TP,
    O_ALLRED,
    O_PROMPT,
    O_CHAT,
    O_NOTHINK,
    O_TOKENIZER,
    O_MINB,
    O_GROUP,
    O_TOPK,
    O_TOPP,
    O_TRANSPORT,
    O_GRAPHS,
    O_QUANT,
    O_ACTQ,
    O_CODEC,
    O_OVERLAP,
    O_ONESHOT,
    O_KVDT,
    O_KVMEM,
    O_SPEC,
    O_SPEC_MIN,
    O_SPEC_MAX,
    O_SPEC_DRAFT,
    O_GPUUTIL,
    O_ROPE
};
static const struct option opts[] = {
    {"model", required_argument, 0, O_MODEL},
    {"prompt-tokens", required_argument, 0, O_PTOK},
    {"max-tokens", required_argument, 0, O_MAXTOK},
    {"temperature", required_argument, 0, O_TEMP},
    {"seed", required_argument, 0, O_SEED},
    {"top-logprobs", required_argument, 0, O_TOPLP},
    {"ignore-eos", no_argument, 0, O_IGNEOS},
    {"json", no_argument, 0, O_JSON},
    {"timing", no_argument, 0, O_TIMING},
    {"device", required_argument, 0, O_DEVICE},
    {"threads", required_argument, 0, O_THREADS},
    {"tp", required_argument, 0, O_TP},
    {"allreduce", required_argument, 0, O_ALLRED},
    {"transport", required_argument, 0, O_TRANSPORT},
    {"cuda-graphs", no_argument, 0, O_GRAPHS},
    {"quantize", required_argument, 0, O_QUANT},
    {"act-quant", required_argument, 0, O_ACTQ},
    {"overlap", required_argument, 0, O_OVERLAP},
    {"oneshot", required_argument, 0, O_ONESHOT},
    {"kv-cache-dtype", required_argument, 0, O_KVDT},
    {"kv-cache-memory", required_argument, 0, O_KVMEM},
    {"gpu-memory-utilization", required_argument, 0, O_GPUUTIL},
    {"rope-scaling", required_argument, 0, O_ROPE},
    {"prompt", required_argument, 0, O_PROMPT},
    {"chat", no_argument, 0, O_CHAT},
    {"no-thinking", no_argument, 0, O_NOTHINK},
    {"tokenizer", required_argument, 0, O_TOKENIZER},
    {"echo-min-bytes", required_argument, 0, O_MINB},
    {"echo-group", required_argument, 0, O_GROUP},
    {"echo-codec", required_argument, 0, O_CODEC},
    {"top-k", required_argument, 0, O_TOPK},
    {"top-p", required_argument, 0, O_TOPP},
    {"speculative", required_argument, 0, O_SPEC},
    {"spec-ngram-min", required_argument, 0, O_SPEC_MIN},
    {"spec-ngram-max", required_argument, 0, O_SPEC_MAX},
    {"spec-draft-max", required_argument, 0, O_SPEC_DRAFT},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* The command line, checked. */
typedef struct gen_args {
    const char *model_dir, *ptok, *allreduce, *prompt_text, *tok_path;
    int no_thinking, json, timing, chat;
    eng_gen_params gp;
    eng_config ec;
    cli_spec spec;
} gen_args;

/* The command line into *a; exits on a usage error, returns 1 after --help. */
static int parse_args(int argc, char **argv, gen_args *a) {
    *a = (gen_args){.gp = {.max_tokens = 16, .sampling = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0}},
                    .ec = {.device = "auto", .tp = 1, .allreduce = ECHO_PRESET_ECHO,
                           .allreduce_auto = ENG_ALLREDUCE_AUTO, .max_num_seqs = 1, .act_quant = ENG_ACT_AUTO,
                           .kv_dtype = KERN_KV_BF16, .kv_cache_memory = ENG_KV_MEMORY_AUTO},
                    .spec = CLI_SPEC_INIT};
    eng_gen_params *gp = &a->gp;
    eng_config *ec = &a->ec;
    int c, li = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        switch (c) {
        case O_MODEL: a->model_dir = optarg; break;
        case O_PTOK: a->ptok = optarg; break;
        case O_MAXTOK: gp->max_tokens = (int)cli_long(PROG, optarg, "--max-tokens", 0, 1 << 24); break;
        case O_TEMP: gp->sampling.temperature = (float)cli_double(PROG, optarg, "--temperature", 0, 1e4); break;
        case O_SEED: gp->sampling.seed = (uint64_t)cli_long(PROG, optarg, "--seed", 0, LONG_MAX); break;
        case O_TOPK: gp->sampling.top_k = (int)cli_long(PROG, optarg, "--top-k", 0, 1 << 24); break;
        case O_TOPP: {
            double v;
            if (cli_parse_double(optarg, 0, 1, &v) || v == 0)
                cli_usage_error(PROG, "--top-p expects a number in (0, 1], got '%s'", optarg);
            gp->sampling.top_p = (float)v;
            break;
        }
        case O_MINB: ec->echo_min_bytes = (size_t)cli_long(PROG, optarg, "--echo-min-bytes", 0, LONG_MAX); break;
        case O_GROUP: ec->echo_group = (int)cli_long(PROG, optarg, "--echo-group", 16, 256); break;
        case O_CODEC: ec->echo_codec = (echo_codec_id)cli_echo_codec(PROG, optarg, &ec->echo_group); break;
        case O_TOPLP: gp->top_logprobs = (int)cli_long(PROG, optarg, "--top-logprobs", 0, ENG_MAX_TOP_LOGPROBS); break;
        case O_IGNEOS: gp->ignore_eos = 1; break;
        case O_JSON: a->json = 1; break;
        case O_TIMING: a->timing = 1; break;
        case O_DEVICE:
            ec->device = cli_choice(PROG, optarg, "--device", cli_devices());
            break;
        case O_THREADS: ec->threads = (int)cli_long(PROG, optarg, "--threads", 1, 1024); break;
        case O_TP: ec->tp = (int)cli_long(PROG, optarg, "--tp", 1, 64); break;
        case O_TRANSPORT: ec->transport = cli_choice(PROG, optarg, "--transport", cli_transports()); break;
        case O_GRAPHS: ec->cuda_graphs = 1; break;
        case O_QUANT:
            cli_choice(PROG, optarg, "--quantize", (const char *const[]){"q8_0", NULL});
            ec->quantize = ENG_QUANT_Q8_0;
            break;
        case O_OVERLAP: ec->overlap = cli_overlap(PROG, optarg); break;
        case O_ONESHOT: ec->oneshot = cli_oneshot(PROG, optarg); break;
        case O_KVDT: ec->kv_dtype = cli_kv_dtype(PROG, optarg); break;
        case O_KVMEM: ec->kv_cache_memory = cli_kv_memory(PROG, optarg); break;
        case O_GPUUTIL: ec->gpu_memory_utilization = cli_gpu_util(PROG, optarg); break;
        case O_ROPE: ec->rope_scaling = cli_rope_scaling(PROG, optarg); break;
        case O_ACTQ:
            ec->act_quant = cli_act_quant(PROG, optarg);
            break;
        case O_ALLRED:
            ec->allreduce_auto = cli_allreduce(PROG, optarg, &ec->allreduce);
            a->allreduce = optarg;
            break;
        case O_SPEC:
        case O_SPEC_MIN:
        case O_SPEC_MAX:
        case O_SPEC_DRAFT: cli_spec_flag(PROG, opts[li].name, optarg, &a->spec); break;
        case O_PROMPT: a->prompt_text = optarg; break;
        case O_CHAT: a->chat = 1; break;
        case O_NOTHINK: a->no_thinking = 1; break;
        case O_TOKENIZER: a->tok_path = optarg; break;
        case 'h': cli_help(USAGE); return 1;
        case '?':
        default:
            cli_usage_error(PROG, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) cli_usage_error(PROG, "unexpected argument '%s'", argv[optind]);
    cli_spec_finish(PROG, &a->spec);
    gp->spec = a->spec.p;
    if (!a->model_dir) cli_usage_error(PROG, "%s", "--model DIR is required");
    if (!a->ptok == !a->prompt_text) cli_usage_error(PROG, "%s", "give exactly one of --prompt-tokens and --prompt");
    if (a->chat && !a->prompt_text) cli_usage_error(PROG, "%s", "--chat wraps --prompt TEXT; it needs --prompt");
    if (a->no_thinking && !a->chat) cli_usage_error(PROG, "%s", "--no-thinking only applies with --chat");
    if (a->allreduce && ec->tp == 1)
        fprintf(stderr, "echo-generate: note: --allreduce %s has no effect with --tp 1 (no all-reduce)\n", a->allreduce);
    if (gp->sampling.temperature == 0 && (gp->sampling.top_k || gp->sampling.top_p < 1))
        fprintf(stderr, "echo-generate: note: --top-k/--top-p have no effect with --temperature 0 (greedy)\n");
    return 0;
}

/* What one run holds; gen_free releases it. */
typedef struct gen_run {
    model_config cfg;
    tok_tokenizer *tok; /* NULL: numeric output */
    eng_chat_template chat_tpl;
    char *chat_text;    /* --chat: the rendered prompt */
    int32_t *prompt;
    int n_prompt;
    eng *e;
    gen_out out;
    long long spec_stats[3]; /* speculative steps, drafted, accepted */
} gen_run;

static void gen_free(gen_run *g) {
    json_decref(g->out.tokens);
    json_decref(g->out.steps);
    tok_stream_free(g->out.stream);
    free(g->out.text);
    free(g->chat_text);
    eng_chat_template_free(&g->chat_tpl);
    tok_free(g->tok);
    eng_destroy(g->e);
    free(g->prompt);
}

/* --chat: --prompt as a user turn, with the assistant generation prompt,
 * into g->chat_text. */
static int render_chat(const gen_args *a, gen_run *g, char *err, size_t errlen) {
    size_t len;
    if (g->chat_tpl.source) {
        /* the model's own template, as apply_chat_template renders it */
        json_t *ctx = json_pack("{s:[{s:s,s:s}],s:b,s:b}", "messages", "role", "user", "content", a->prompt_text,
                                "add_generation_prompt", 1, "enable_thinking", !a->no_thinking);
        char *ctx_text = ctx ? json_dumps(ctx, JSON_COMPACT) : NULL;
        json_decref(ctx);
        int r = ctx_text ? eng_chat_render(&g->chat_tpl, ctx_text, &g->chat_text, &len, err, errlen) : -1;
        if (!ctx_text) snprintf(err, errlen, "out of memory");
        free(ctx_text);
        return r ? -1 : 0;
    }
    /* no template shipped with the model: Qwen3's, built in */
    tok_chat_message msg = {.role = "user", .content = a->prompt_text};
    tok_chat_options co = {.add_generation_prompt = 1, .enable_thinking = !a->no_thinking};
    return tok_chat_apply(&msg, 1, &co, &g->chat_text, &len, err, errlen) ? -1 : 0;
}

/* The model's config, its tokenizer (when there is one) and the prompt as
 * ids, each in the model's vocabulary. */
static int load_prompt(const gen_args *a, gen_run *g, char *err, size_t errlen) {
    if (model_config_load(a->model_dir, &g->cfg, err, errlen) ||
        model_config_rope_override(&g->cfg, a->ec.rope_scaling, err, errlen))
        return -1;
    if (!a->tok_path && model_is_random(a->model_dir)) {
        /* a random model has no folder to find a tokenizer in */
        if (a->prompt_text) {
            snprintf(err, errlen, "%s has no tokenizer: --prompt needs --tokenizer PATH", a->model_dir);
            return -1;
        }
    } else if (load_tokenizer(a->tok_path ? a->tok_path : a->model_dir, !a->tok_path && !a->prompt_text, &g->tok,
                              &g->chat_tpl, err, errlen))
        return -1;
    if (a->prompt_text) {
        if (a->chat && render_chat(a, g, err, errlen)) return -1;
        const char *text = a->chat ? g->chat_text : a->prompt_text;
        size_t n;
        if (tok_encode(g->tok, text, strlen(text), 0, &g->prompt, &n, err, errlen)) return -1;
        if (n == 0 || n > INT32_MAX) {
            snprintf(err, errlen, "--prompt encodes to %zu tokens", n);
            return -1;
        }
        g->n_prompt = (int)n;
    }
    if (g->tok && !(g->out.stream = tok_stream_new(g->tok, 0))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < g->n_prompt; i++) {
        if (g->prompt[i] >= g->cfg.vocab_size) {
            snprintf(err, errlen, "prompt token %d is out of range [0, %d)", g->prompt[i], g->cfg.vocab_size);
            return -1;
        }
    }
    return 0;
}

/* The engine, sized for exactly this request: one sequence of prompt +
 * max_tokens positions, the prompt in one step. */
static int open_engine(gen_args *a, gen_run *g, char *err, size_t errlen) {
    eng_config *ec = &a->ec;
    long long need = (long long)g->n_prompt + a->gp.max_tokens;
    if (need > g->cfg.max_position_embeddings) {
        snprintf(err, errlen, "prompt (%d tokens) + max_tokens (%d) exceeds the model's context of %d tokens",
                 g->n_prompt, a->gp.max_tokens, g->cfg.max_position_embeddings);
        return -1;
    }
    ec->device = kern_backend_find(ec->device)->name; /* "auto" resolved */
    ec->model_dir = a->model_dir;
    ec->max_model_len = (int)need;
    ec->max_batch_tokens = g->n_prompt > 1 + a->gp.spec.draft_max ? g->n_prompt : 1 + a->gp.spec.draft_max; /* a verify step */
    if (eng_create(ec, &g->e, err, errlen)) return -1;
    if (eng_graphs_note(g->e)) fprintf(stderr, "echo-generate: note: %s\n", eng_graphs_note(g->e));
    for (int r = 0; !a->json && r < ec->tp; r++) {
        eng_rank_info ri;
        eng_get_rank_info(g->e, r, &ri);
        fprintf(stderr, "echo-generate: rank %d/%d (%s): weights %.1f MB, KV cache %.1f MB, all-reduce slots %.1f MB\n",
                r, ec->tp, ec->device, (double)ri.weight_bytes / 1e6, (double)ri.kv_bytes / 1e6,
                (double)ri.slot_bytes / 1e6);
    }
    return 0;
}

/* The detokenizer's held-back tail, once generation is over. */
static void finish_text(gen_out *o) {
    if (!o->stream) return;
    const char *t;
    size_t n;
    tok_stream_finish(o->stream, &t, &n);
    emit_text(o, t, n);
}

/* What the all-reduce ran (tp 1: none), the JSON's "allreduce". */
static json_t *allreduce_json(eng *e) {
    const eng_config *gc = eng_get_config(e);
    echo_config wc = {0};
    int on = !eng_allreduce_config(e, &wc);
    const echo_codec_info *ci = echo_codec_get(wc.codec);
    on = on && ci;
    return json_pack("{s:s,s:s,s:i,s:f,s:b,s:i}", "preset", on ? echo_preset_name(gc->allreduce) : "none", "codec",
                     on ? ci->name : "none", "group", on ? wc.group_size : 0, "bits_per_value",
                     on ? echo_config_bits(&wc) : 32.0, "feedback", on && wc.feedback, "tp", gc->tp);
}

/* --json: one object on stdout (the test contract, see --help); t1..t2 is
 * the generation. */
static int report_json(const gen_args *a, gen_run *g, double t1, double t2, char *err, size_t errlen) {
    gen_out *out = &g->out;
    json_t *ptoks = json_array();
    for (int i = 0; i < g->n_prompt; i++) json_array_append_new(ptoks, json_integer(g->prompt[i]));
    json_t *root = json_pack("{s:o,s:O,s:O}", "prompt_tokens", ptoks, "tokens", out->tokens, "steps", out->steps);
    json_object_set_new(root, "allreduce", allreduce_json(g->e));
    json_t *au = cli_allreduce_auto_json(g->e);
    if (au) json_object_set_new(root, "allreduce_auto", au);
    double dec = out->t_last - out->t_first;
    if (a->timing)
        json_object_set_new(root, "timing",
                            json_pack("{s:f,s:f,s:f}", "prefill_s", out->count ? out->t_first - t1 : t2 - t1,
                                      "decode_s", dec, "decode_tok_s", dec > 0 ? (out->count - 1) / dec : 0.0));
    const long long *ss = g->spec_stats;
    json_object_set_new(root, "speculative",
                        json_pack("{s:s,s:i,s:I,s:I,s:I}", "method", a->spec.on ? "ngram" : "none", "draft_max",
                                  a->gp.spec.draft_max, "steps", (json_int_t)ss[0], "drafted", (json_int_t)ss[1],
                                  "accepted", (json_int_t)ss[2]));
    if (out->stream) {
        finish_text(out);
        json_object_set_new(root, "text", json_stringn(out->text ? out->text : "", out->text_len));
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    puts(s);
    free(s);
    return 0;
}

/* Text mode: the rest of the text, then the run's summary on stderr; t0..t1
 * is the load, t1..t2 the generation. */
static void report_text(const gen_args *a, gen_run *g, eng_finish fin, double t0, double t1, double t2) {
    const gen_out *out = &g->out;
    const long long *ss = g->spec_stats;
    finish_text(&g->out);
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "echo-generate: %d prompt + %d generated tokens, load %.2fs, generate %.2fs (%s)\n", g->n_prompt,
            out->count, t1 - t0, t2 - t1, fin == ENG_FINISH_EOS ? "stopped at EOS" : "reached --max-tokens");
    if (out->count > 1)
        fprintf(stderr, "echo-generate: decode %.2f tok/s after the first token\n",
                (out->count - 1) / (out->t_last - out->t_first));
    if (a->spec.on)
        fprintf(stderr, "echo-generate: speculative ngram: %lld decode steps, %lld draft tokens, %lld accepted (%.1f%%)\n",
                ss[0], ss[1], ss[2], ss[1] ? 100.0 * (double)ss[2] / (double)ss[1] : 0.0);
    if (a->ec.tp > 1) {
        echo_stats st;
        eng_comm_stats(g->e, &st);
        uint64_t calls = 0, wire = 0;
        double secs = 0;
        for (int k = 0; k < ECHO_PRESET_COUNT; k++)
            calls += st.calls[k], wire += st.wire_bytes[k], secs += st.seconds[k];
        fprintf(stderr, "echo-generate: tp %d, %s all-reduce: %llu calls, %.1f MB sent, %.3fs (all ranks)\n", a->ec.tp,
                echo_preset_name(a->ec.allreduce), (unsigned long long)calls, (double)wire / 1e6, secs);
    }
}

int main(int argc, char **argv) {
    cli_procs_start(PROG); /* under mpirun: ranks > 0 follow rank 0 and exit there */
    gen_args a;
    if (parse_args(argc, argv, &a)) return 0;
    gen_run g = {.out = {.tokens = json_array(), .steps = json_array(), .json = a.json}};
    a.gp.spec_stats = g.spec_stats;
    if (a.ptok) g.prompt = parse_ids(a.ptok, &g.n_prompt);
    char err[1024];
    int rc = 1;
    eng_finish fin;
    double t0 = now_s();
    if (load_prompt(&a, &g, err, sizeof err) || open_engine(&a, &g, err, sizeof err)) goto done;
    double t1 = now_s();
    if (eng_generate(g.e, g.prompt, g.n_prompt, &a.gp, on_step, &g.out, &fin, err, sizeof err)) goto done;
    double t2 = now_s();
    if (a.json)
        rc = report_json(&a, &g, t1, t2, err, sizeof err) ? 1 : 0;
    else {
        report_text(&a, &g, fin, t0, t1, t2);
        rc = 0;
    }
done:
    if (rc) fprintf(stderr, "echo-generate: error: %s\n", err);
    gen_free(&g);
    return rc;
}
