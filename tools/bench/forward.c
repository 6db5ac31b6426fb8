/*
 * echo-bench forward: the engine's own speed on one model, without a server
 * in between: prefill throughput, decode throughput beside the memory
 * roofline, and time to first token (docs/bench-forward.md).
 *
 * Everything goes through the public engine API (eng_step, eng_sample) on
 * whatever backend --device names, so the same numbers come out of the cpu
 * backend in CI (tiny shapes) and the cuda backend on a GPU. The cuda
 * backend's to_host_f32 synchronises its stream, and eng_step returns only
 * after the logits are on the host, so a wall-clock interval around eng_step
 * includes the device's work.
 *
 * Phases, in this order, on one engine:
 *   prefill  per length L: one sequence of L random ids in one eng_step
 *            asking for the last row's logits; one untimed warm-up, then
 *            --iters timed runs (median). FLOPs per run, counting a
 *            multiply-add as 2 and ignoring norms, RoPE and softmax:
 *              2 * P_layers * L                  every linear layer, per token
 *            + 2 * V * H                         lm_head, one row (LOGITS_LAST)
 *            + 4 * L^2 * hq * hd * layers / 2    q·kᵀ and p·v (2 * L^2 * hq * hd
 *                                                each), halved for causality
 *            with P_layers = layers * (H*(qd + 2*kvd) + qd*H + 3*H*I),
 *            qd = hq*hd, kvd = hkv*hd.
 *   decode   per batch B: B sequences prefilled with --decode-prompt tokens
 *            (one step), one untimed decode step, then --decode-steps steps of
 *            B items of one random token each (all asking for logits):
 *            tokens/s = B * steps / time.
 *   roofline the bandwidth of ops->copy on a backend of the same device
 *            (2 * bytes / time: each byte is read and written); on cpu
 *            instead the read bandwidth of --threads threads each summing
 *            its share of a 1 GiB buffer (a streaming read: what a decode
 *            step does with the weights). For each
 *            B the tokens/s a step would reach if it only streamed its bytes
 *            at that bandwidth:
 *              bytes/step = weight bytes read per step + B * ctx * kv bytes/token
 *            where the weights read per step are rank 0's weight_bytes
 *            (eng_get_rank_info) less the embedding table, of which a step
 *            reads only B rows (a tied head reads it as lm_head instead: then
 *            it stays), ctx is the mean context length over the timed steps,
 *            and kv bytes/token = layers * 2 * hkv * hd * activation size.
 *   fma peak (cpu) --threads threads each running independent vector fmas
 *            in registers for ~0.3 s (AVX-512, else AVX2, else nothing):
 *            the yardstick of prefill FLOP/s beside the matmul peak.
 *   ttft     one request of --ttft-len tokens on the idle engine: eng_step
 *            start to the first token from eng_sample (greedy); median of
 *            --iters runs after a warm-up.
 * Token ids are random (splitmix64 of --seed); logits are checked finite.
 * --model may name a folder or a random model ("random:qwen3-8b", model/):
 * then the weights are generated in device memory and no file is read.
 */
#include <getopt.h>
#include <immintrin.h>
#include <jansson.h>
#include <pthread.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/budget.h"
#include "engine/engine.h"
#include "engine/report.h"
#include "engine/sample.h"
#include "kernels/kernels.h"
#include "kernels/kv.h"
#include "model/model.h"
#include "tools/bench/bench.h"
#include "tools/cli.h"

#define FW_MAX_LIST 16

typedef struct fw_opts {
    const char *model, *device;
    int tp, threads, iters, json;
    int cuda_graphs;          /* eng_config.cuda_graphs */
    int quantize;             /* eng_config.quantize */
    int act_quant;            /* eng_config.act_quant */
    kern_kv_dtype kv_dtype;   /* eng_config.kv_dtype */
    const char *rope_scaling; /* eng_config.rope_scaling */
    int overlap;              /* eng_config.overlap */
    long oneshot;             /* eng_config.oneshot */
    echo_preset allreduce;    /* eng_config.allreduce (tp > 1) */
    int allreduce_auto;       /* eng_config.allreduce_auto (--allreduce auto, auto:echo3) */
    int echo_group;           /* eng_config.echo_group, 0 = default */
    echo_codec_id echo_codec; /* eng_config.echo_codec, 0 = default */
    long echo_min_bytes;      /* eng_config.echo_min_bytes */
    int prefill[FW_MAX_LIST], n_prefill;
    int batch[FW_MAX_LIST], n_batch;
    int decode_steps, decode_prompt, ttft_len;
    long copy_bytes; /* 0: 1 GiB on a device, 256 MiB on cpu */
    int gemm_dim;    /* -1: default (8192 on a device, 1024 on cpu); 0: skip */
    unsigned long long seed;
} fw_opts;

typedef struct fw_prefill {
    int len;
    double s, flop;
} fw_prefill;

typedef struct fw_decode {
    int batch, steps;
    double s, bytes_per_step;
} fw_decode;

static double fw_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t fw_rng(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fw_tokens(int32_t *ids, int n, int vocab, uint64_t *s) {
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(fw_rng(s) % (uint64_t)vocab);
}

static int fw_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double fw_median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, fw_cmp);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static int fw_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static int fw_usage_error(const char *fmt, const char *a) { return bench_usage_error("forward", fmt, a); }

/* "512,2048,8192" -> up to FW_MAX_LIST integers in [1, hi]; -1 when malformed. */
static int fw_parse_list(const char *s, long hi, int *out, int *n) {
    char tmp[256];
    if (snprintf(tmp, sizeof tmp, "%s", s) >= (int)sizeof tmp) return -1;
    *n = 0;
    for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        long v;
        if (*n == FW_MAX_LIST || cli_parse_long(t, 1, hi, &v)) return -1;
        out[(*n)++] = (int)v;
    }
    return *n ? 0 : -1;
}

/* "4096", "64K", "256M", "1G" (binary multiples) in [lo, hi]; -1 when malformed. */
static int fw_parse_size(const char *s, long lo, long hi, long *out) {
    char tmp[64];
    size_t n = strlen(s);
    long mult = 1;
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, s, n + 1);
    switch (tmp[n - 1]) {
    case 'K':
    case 'k': mult = 1L << 10; break;
    case 'M':
    case 'm': mult = 1L << 20; break;
    case 'G':
    case 'g': mult = 1L << 30; break;
    default: break;
    }
    if (mult > 1) tmp[n - 1] = 0;
    long v;
    if (cli_parse_long(tmp, 1, hi / mult, &v) || v * mult < lo) return -1;
    *out = v * mult;
    return 0;
}

static const char FW_USAGE[] =
    "usage: echo-bench forward --model DIR [--device cpu|cuda|auto] [--tp N] [--prefill 512,2048,8192]\n"
    "                          [--decode-batch 1,16,64] [--decode-steps N] [--decode-prompt N]\n"
    "                          [--ttft-len 2048] [--iters N] [--threads N] [--copy-bytes N] [--seed S] [--json]\n"
    "                          [--gemm-dim N] [--cuda-graphs] [--quantize q8_0]\n"
    "\n"
    "Prefill tokens/s and TFLOP/s per prompt length, decode tokens/s per batch beside the memory\n"
    "roofline (weight bytes / measured ops->copy bandwidth), and TTFT of one prompt, on the engine.\n"
    "  --model DIR         Hugging Face Qwen3 folder, or a random model generated in device memory\n"
    "                      (random:qwen3-8b[,layers=N][,seed=S]; also qwen3-0.6b, tiny, tiny-hd128)\n"
    "  --device D          cpu (default), cuda, or auto (cuda when a GPU is visible)\n"
    "  --tp N              tensor-parallel ranks (default 1; under mpirun -np N one per process)\n"
    "  --allreduce MODE    exact (default), bf16, int4 (the paper's codec), echo, echo-nofb, echo3, or\n"
    "                      auto / auto:echo3 (measured at start-up: the JSON's allreduce_auto says\n"
    "                      what it chose and why): the all-reduce at tp > 1\n"
    "  --echo-group G      values per scale group of int4/echo (default: the codec's)\n"
    "  --echo-codec NAME   codec of int4/echo from the codec table, NAME-gG sets G too (default: comm/'s)\n"
    "  --echo-min-bytes N  messages below N bytes take the exact path (default 0)\n"
    "  --prefill L,...     prompt lengths, one sequence each (default 512,2048,8192)\n"
    "  --decode-batch B,.. decode batch sizes (default 1,16,64)\n"
    "  --decode-steps N    timed decode steps per batch size (default 32)\n"
    "  --decode-prompt N   prompt tokens of each decoding sequence (default 16)\n"
    "  --ttft-len N        prompt of the TTFT request (default 2048; 0 skips it)\n"
    "  --iters N           timed runs per prefill length and of TTFT, median reported (default 3)\n"
    "  --threads N         cpu threads (default: all)\n"
    "  --copy-bytes N[KMG] buffer of the bandwidth measurement (default 1 GiB: ops->copy on a GPU, a\n"
    "                      streaming read by --threads threads on cpu)\n"
    "  --quantize q8_0     quantize F32/F16/BF16 matrices to Q8_0 at load (cpu; eng_config.quantize)\n"
    "  --act-quant auto|none|q8_0  q8_0: the quantized matrices multiply 8-bit activations in\n"
    "                      integers, as llama.cpp does (cpu; eng_config.act_quant). auto (default):\n"
    "                      on a GGUF's quantized matrices; none: the exact path\n"
    "  --kv-cache-dtype auto|fp32|bf16|fp16|q8_0  what the KV cache stores (default auto: bf16)\n"
    "  --rope-scaling SPEC none, yarn:FACTOR[:ORIGINAL] or a JSON rope_scaling object (as echo-serve):\n"
    "                      the positions past max_position_embeddings a long --decode-prompt needs\n"
    "                      (e.g. SmolLM2 at 16k: yarn:4)\n"
    "  --overlap auto|off|N  prefill overlap at --tp > 1 on cpu (eng_config.overlap): prompts of >= 128\n"
    "                      tokens as N micro-batches; auto (default): 2 under mpirun, else off\n"
    "  --oneshot auto|off|BYTES  one-shot all-reduce for calls of <= BYTES of fp32 at --tp > 1 on cpu\n"
    "                      (eng_config.oneshot); auto (default): 8192 under mpirun, else off\n"
    "  --seed S            random token ids (default 0)\n"
    "  --gemm-dim N        the matmul peak: ops->matmul of N x N by N x N, the yardstick of prefill\n"
    "                      TFLOP/s (default 8192 on a GPU, 1024 on cpu; 0 skips it)\n"
    "  --cuda-graphs       decode steps through CUDA graphs (eng_config.cuda_graphs: cuda; each batch\n"
    "                      size is recorded once, then replayed; 3 warm-up steps instead of 1; at\n"
    "                      --tp > 1 over nccl the all-reduces are captured too). Off by default; no\n"
    "                      effect on cpu or with --transport local at --tp > 1 (a note says so)\n"
    "  --json              one JSON object instead of the table\n"
    "Exit status: 0 ok, 1 runtime error, 2 usage error.\n";

/* Options: first eng_config's (fw_engine_opt), then the measurements'
 * (fw_measure_opt). */
enum {
    O_MODEL = 1000,
    O_DEVICE,
    O_TP,
    O_GRAPHS,
    O_QUANT,
    O_ACTQ,
    O_KVDT,
    O_ALLRED,
    O_EGROUP,
    O_EMINB,
    O_ECODEC,
    O_OVERLAP,
    O_ONESHOT,
    O_ROPE,
    O_PREFILL, /* the first measurement option */
    O_BATCH,
    O_STEPS,
    O_PROMPT,
    O_TTFT,
    O_ITERS,
    O_THREADS,
    O_COPY,
    O_SEED,
    O_GEMM,
    O_JSON,
    O_HELP
};
static const struct option fw_longopts[] = {
    {"model", required_argument, 0, O_MODEL},
    {"device", required_argument, 0, O_DEVICE},
    {"tp", required_argument, 0, O_TP},
    {"prefill", required_argument, 0, O_PREFILL},
    {"decode-batch", required_argument, 0, O_BATCH},
    {"decode-steps", required_argument, 0, O_STEPS},
    {"decode-prompt", required_argument, 0, O_PROMPT},
    {"ttft-len", required_argument, 0, O_TTFT},
    {"iters", required_argument, 0, O_ITERS},
    {"threads", required_argument, 0, O_THREADS},
    {"copy-bytes", required_argument, 0, O_COPY},
    {"seed", required_argument, 0, O_SEED},
    {"gemm-dim", required_argument, 0, O_GEMM},
    {"json", no_argument, 0, O_JSON},
    {"cuda-graphs", no_argument, 0, O_GRAPHS},
    {"quantize", required_argument, 0, O_QUANT},
    {"act-quant", required_argument, 0, O_ACTQ},
    {"kv-cache-dtype", required_argument, 0, O_KVDT},
    {"allreduce", required_argument, 0, O_ALLRED},
    {"echo-group", required_argument, 0, O_EGROUP},
    {"echo-min-bytes", required_argument, 0, O_EMINB},
    {"echo-codec", required_argument, 0, O_ECODEC},
    {"overlap", required_argument, 0, O_OVERLAP},
    {"oneshot", required_argument, 0, O_ONESHOT},
    {"rope-scaling", required_argument, 0, O_ROPE},
    {"help", no_argument, 0, O_HELP},
    {0, 0, 0, 0},
};

/* One option of the engine's configuration (the model, the device, the
 * all-reduce, quantization, the KV cache): 0, or 2 after a usage error. */
static int fw_engine_opt(int c, const char *a, fw_opts *o) {
    long v;
    switch (c) {
    case O_MODEL: o->model = a; return 0;
    case O_DEVICE:
        o->device = a;
        return kern_backend_find(a) ? 0 : fw_usage_error("--device: expected auto or a backend's name, got '%s'", a);
    case O_TP:
        if (cli_parse_long(a, 1, 64, &v)) return fw_usage_error("--tp: expected 1..64, got '%s'", a);
        o->tp = (int)v;
        return 0;
    case O_ALLRED:
        if (echo_allreduce_parse(a, &o->allreduce, &o->allreduce_auto)) {
            char msg[256], names[128];
            snprintf(msg, sizeof msg, "--allreduce: expected auto, auto:echo3 or one of %s, got '%%s'",
                     echo_preset_names(names, sizeof names, ", "));
            return fw_usage_error(msg, a);
        }
        return 0;
    case O_EGROUP:
        if (cli_parse_long(a, 16, 256, &v)) return fw_usage_error("--echo-group: expected 16..256, got '%s'", a);
        o->echo_group = (int)v;
        return 0;
    case O_ECODEC: {
        int g = 0;
        if (echo_codec_parse(a, &o->echo_codec, &g))
            return fw_usage_error("--echo-codec: expected a codec of the table, optionally -gG, got '%s'", a);
        if (g) o->echo_group = g;
        return 0;
    }
    case O_EMINB:
        if (cli_parse_long(a, 0, 1L << 40, &v))
            return fw_usage_error("--echo-min-bytes: expected a byte count, got '%s'", a);
        o->echo_min_bytes = v;
        return 0;
    case O_GRAPHS: o->cuda_graphs = 1; return 0;
    case O_QUANT:
        o->quantize = ENG_QUANT_Q8_0;
        return strcmp(a, "q8_0") ? fw_usage_error("--quantize: expected q8_0, got '%s'", a) : 0;
    case O_OVERLAP:
        if (!strcmp(a, "auto"))
            o->overlap = 0;
        else if (!strcmp(a, "off"))
            o->overlap = -1;
        else if (cli_parse_long(a, 1, 8, &v) == 0)
            o->overlap = (int)v;
        else
            return fw_usage_error("--overlap: expected auto, off or a count 1..8, got '%s'", a);
        return 0;
    case O_ONESHOT:
        if (!strcmp(a, "auto"))
            o->oneshot = ENG_ONESHOT_AUTO;
        else if (!strcmp(a, "off"))
            o->oneshot = ENG_ONESHOT_OFF;
        else if (cli_parse_long(a, 1, 1L << 30, &v) == 0)
            o->oneshot = v;
        else
            return fw_usage_error("--oneshot: expected auto, off or a byte count 1..1073741824, got '%s'", a);
        return 0;
    case O_ACTQ:
        return cli_parse_act_quant(a, &o->act_quant)
                   ? fw_usage_error("--act-quant: expected auto, none or q8_0, got '%s'", a)
                   : 0;
    case O_KVDT:
        return cli_parse_kv_dtype(a, &o->kv_dtype)
                   ? fw_usage_error("--kv-cache-dtype: expected auto, fp32, bf16, fp16 or q8_0, got '%s'", a)
                   : 0;
    case O_ROPE: o->rope_scaling = a; return 0;
    default: return 0;
    }
}

/* One option of what is measured and how (lengths, batches, repetitions,
 * yardsticks, output): 0, or 2 after a usage error. */
static int fw_measure_opt(int c, const char *a, fw_opts *o) {
    long v;
    switch (c) {
    case O_PREFILL:
        if (fw_parse_list(a, 1 << 20, o->prefill, &o->n_prefill))
            return fw_usage_error("--prefill: expected up to 16 comma-separated lengths in 1..1048576, got '%s'", a);
        return 0;
    case O_BATCH:
        if (fw_parse_list(a, 65536, o->batch, &o->n_batch))
            return fw_usage_error("--decode-batch: expected up to 16 comma-separated sizes in 1..65536, got '%s'", a);
        return 0;
    case O_STEPS:
        if (cli_parse_long(a, 1, 100000, &v)) return fw_usage_error("--decode-steps: expected 1..100000, got '%s'", a);
        o->decode_steps = (int)v;
        return 0;
    case O_PROMPT:
        if (cli_parse_long(a, 1, 1 << 20, &v))
            return fw_usage_error("--decode-prompt: expected 1..1048576, got '%s'", a);
        o->decode_prompt = (int)v;
        return 0;
    case O_TTFT:
        if (cli_parse_long(a, 0, 1 << 20, &v)) return fw_usage_error("--ttft-len: expected 0..1048576, got '%s'", a);
        o->ttft_len = (int)v;
        return 0;
    case O_ITERS:
        if (cli_parse_long(a, 1, 1000, &v)) return fw_usage_error("--iters: expected 1..1000, got '%s'", a);
        o->iters = (int)v;
        return 0;
    case O_THREADS:
        if (cli_parse_long(a, 1, 4096, &v)) return fw_usage_error("--threads: expected 1..4096, got '%s'", a);
        o->threads = (int)v;
        return 0;
    case O_COPY:
        if (fw_parse_size(a, 4096, 1L << 36, &o->copy_bytes))
            return fw_usage_error("--copy-bytes: expected 4K..64G (K, M, G suffixes), got '%s'", a);
        return 0;
    case O_SEED:
        if (cli_parse_long(a, 0, 0x7fffffffL, &v)) return fw_usage_error("--seed: expected 0..2147483647, got '%s'", a);
        o->seed = (unsigned long long)v;
        return 0;
    case O_GEMM:
        if (cli_parse_long(a, 0, 32768, &v)) return fw_usage_error("--gemm-dim: expected 0..32768, got '%s'", a);
        o->gemm_dim = (int)v;
        return 0;
    case O_JSON: o->json = 1; return 0;
    default: return 0;
    }
}

/* The command line into *o: 0, -1 after --help, 2 after a usage error
 * (printed). */
static int fw_parse(int argc, char **argv, fw_opts *o) {
    char **av = argv; /* argv[0] is the subcommand name */
    int ac = argc, c, rc = 0;
    bench_getopt_reset();
    while (!rc && (c = getopt_long(ac, av, ":h", fw_longopts, NULL)) != -1) {
        if (c == 'h' || c == O_HELP) {
            fputs(FW_USAGE, stdout);
            rc = -1;
        } else if (c >= O_MODEL && c < O_PREFILL)
            rc = fw_engine_opt(c, optarg, o);
        else if (c >= O_PREFILL && c < O_HELP)
            rc = fw_measure_opt(c, optarg, o);
        else
            rc = bench_getopt_error("forward", c, av);
    }
    if (!rc && optind < ac) rc = fw_usage_error("unexpected argument '%s'", av[optind]);
    if (!rc && !o->model) rc = fw_usage_error("%s", "--model DIR is required");
    return rc;
}

/* Copy bandwidth of `device` through its op table: one calibration copy,
 * then enough copies for ~0.3 s, timed to a synchronising to_host_f32 of one
 * value (ops->copy only enqueues on a device). Bytes/s counts each copied
 * byte twice (read + write). Also returns the activation size. */
static int fw_copy_bandwidth(const char *device, int threads, size_t bytes, double *bps, size_t *act_size, char *err,
                             size_t errlen) {
    const kern_ops *ops = NULL;
    kern_backend *be = NULL;
    void *a = NULL, *b = NULL;
    float one;
    int status = -1;
    if (kern_backend_create(device, threads, 0, &ops, &be, err, errlen)) return -1;
    size_t es = kern_dtype_size(ops->act_dtype), n = bytes / es;
    *act_size = es;
    a = ops->alloc(be, n * es);
    b = ops->alloc(be, n * es);
    if (!a || !b) {
        snprintf(err, errlen, "copy bandwidth: cannot allocate 2 x %zu bytes: %s", n * es, kern_last_error(be));
        goto out;
    }
    /* first touch and clocks up, then calibrate */
    if (ops->copy(be, b, a, n) || ops->to_host_f32(be, &one, b, 1)) goto op_fail;
    double t0 = fw_now();
    if (ops->copy(be, a, b, n) || ops->to_host_f32(be, &one, a, 1)) goto op_fail;
    double t1 = fw_now() - t0;
    int reps = t1 > 0 ? (int)(0.3 / t1) : 200;
    reps = reps < 3 ? 3 : (reps > 200 ? 200 : reps);
    t0 = fw_now();
    for (int i = 0; i < reps; i++)
        if (ops->copy(be, i % 2 ? a : b, i % 2 ? b : a, n)) goto op_fail;
    if (ops->to_host_f32(be, &one, a, 1)) goto op_fail;
    double t = fw_now() - t0;
    *bps = 2.0 * (double)(n * es) * reps / t;
    status = 0;
    goto out;
op_fail:
    snprintf(err, errlen, "copy bandwidth: %s", kern_last_error(be));
out:
    if (a) ops->free(be, a);
    if (b) ops->free(be, b);
    kern_backend_destroy(ops, be);
    return status;
}

/* ---- cpu yardsticks: streaming read bandwidth and FMA peak ---- */

typedef struct fw_thr {
    const uint64_t *buf;
    size_t n; /* uint64 words of this thread's share */
    int reps, isa;
    double flops;
    uint64_t sink; /* keeps the reads alive */
} fw_thr;

typedef uint64_t fw_v4 __attribute__((vector_size(32)));

/* Sum the share `reps` times with four independent 32-byte lanes (the
 * compiler's plain vector loads: no memcpy, no stores). */
static void *fw_read_thread(void *arg) {
    fw_thr *t = arg;
    fw_v4 a = {0}, b = {0}, c = {0}, d = {0};
    for (int r = 0; r < t->reps; r++)
        for (size_t i = 0; i + 16 <= t->n; i += 16) {
            fw_v4 x, y, z, w;
            memcpy(&x, t->buf + i, 32);
            memcpy(&y, t->buf + i + 4, 32);
            memcpy(&z, t->buf + i + 8, 32);
            memcpy(&w, t->buf + i + 12, 32);
            a += x;
            b += y;
            c += z;
            d += w;
        }
    fw_v4 s = a + b + c + d;
    t->sink = s[0] + s[1] + s[2] + s[3];
    return NULL;
}

/* Read bandwidth with `threads` threads, each summing its contiguous share
 * of a `bytes` buffer, best of five passes: bytes / time. The buffer comes
 * from the cpu backend's alloc, so it sits on the pages the weights sit on
 * (2 MiB ones unless ECHO_CPU_HUGEPAGES=0: docs/bench-forward.md). */
static int fw_read_bandwidth(int threads, size_t bytes, double *bps, char *err, size_t errlen) {
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    size_t words = bytes / 8 / (size_t)(16 * threads) * (size_t)(16 * threads);
    uint64_t *buf = NULL;
    const kern_ops *ops = NULL;
    kern_backend *be = NULL;
    if (kern_backend_create("cpu", 1, 0, &ops, &be, err, errlen)) return -1;
    fw_thr *t = calloc((size_t)threads, sizeof *t);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    if (!t || !th || !(buf = ops->alloc(be, words * 8))) {
        free(t);
        free(th);
        kern_backend_destroy(ops, be);
        snprintf(err, errlen, "read bandwidth: cannot allocate %zu bytes", words * 8);
        return -1;
    }
    for (size_t i = 0; i < words; i++)
        buf[i] = i;
    double best = 0;
    int status = 0;
    for (int pass = 0; pass < 5 && !status; pass++) {
        double t0 = fw_now();
        int started = 0;
        for (int i = 0; i < threads; i++) {
            t[i] = (fw_thr){buf + words / threads * i, words / threads, 1, 0, 0, 0};
            if (pthread_create(&th[i], NULL, fw_read_thread, &t[i])) {
                snprintf(err, errlen, "read bandwidth: cannot start a thread");
                status = -1;
                break;
            }
            started++;
        }
        for (int i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        double dt = fw_now() - t0;
        if (!status && dt > 0 && words * 8 / dt > best) best = (double)(words * 8) / dt;
    }
    *bps = best;
    ops->free(be, buf);
    kern_backend_destroy(ops, be);
    free(t);
    free(th);
    return status;
}

#define FW_FMA_LOOP(V, FMA, SET1)                                                                                      \
    V a0 = SET1(1.0f), a1 = SET1(1.1f), a2 = SET1(1.2f), a3 = SET1(1.3f), a4 = SET1(1.4f), a5 = SET1(1.5f),            \
      a6 = SET1(1.6f), a7 = SET1(1.7f), a8 = SET1(1.8f), a9 = SET1(1.9f), a10 = SET1(2.0f), a11 = SET1(2.1f);          \
    V m = SET1(0.999999f), c = SET1(1e-7f);                                                                            \
    for (long i = 0; i < n; i++) {                                                                                     \
        a0 = FMA(a0, m, c), a1 = FMA(a1, m, c), a2 = FMA(a2, m, c), a3 = FMA(a3, m, c);                                \
        a4 = FMA(a4, m, c), a5 = FMA(a5, m, c), a6 = FMA(a6, m, c), a7 = FMA(a7, m, c);                                \
        a8 = FMA(a8, m, c), a9 = FMA(a9, m, c), a10 = FMA(a10, m, c), a11 = FMA(a11, m, c);                            \
    }                                                                                                                  \
    V s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;                                                 \
    float f;                                                                                                           \
    memcpy(&f, &s, 4);

__attribute__((target("avx512f"))) static float fw_fma512(long n) {
    FW_FMA_LOOP(__m512, _mm512_fmadd_ps, _mm512_set1_ps)
    return f;
}
__attribute__((target("avx2,fma"))) static float fw_fma256(long n) {
    FW_FMA_LOOP(__m256, _mm256_fmadd_ps, _mm256_set1_ps)
    return f;
}

static void *fw_fma_thread(void *arg) {
    fw_thr *t = arg;
    const long n = 1L << 22;
    double t0 = fw_now(), dt;
    long done = 0;
    float sink = 0;
    do {
        sink += t->isa == 2 ? fw_fma512(n) : fw_fma256(n);
        done += n;
        dt = fw_now() - t0;
    } while (dt < 0.3);
    t->flops = (double)done * 12 * (t->isa == 2 ? 16 : 8) * 2 / dt;
    t->sink = (uint64_t)(sink != 0);
    return NULL;
}

/* Sum over `threads` threads of fp32 vector-FMA throughput (0 when the
 * machine has neither AVX-512 nor AVX2+FMA). */
static double fw_fma_peak(int threads) {
    __builtin_cpu_init();
    int isa = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!isa) return 0;
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    fw_thr *t = calloc((size_t)threads, sizeof *t);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    double sum = 0;
    int started = 0;
    if (t && th)
        for (; started < threads; started++) {
            t[started].isa = isa;
            if (pthread_create(&th[started], NULL, fw_fma_thread, &t[started])) break;
        }
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        sum += t[i].flops;
    }
    free(t);
    free(th);
    return sum;
}

/* The matmul peak of `device` through its op table (the yardstick of the
 * prefill TFLOP/s): out(d, d) = in(d, d) · w(d, d)ᵀ with a random weight,
 * one warm-up (cuBLASLt picks and caches its plan), then enough runs for
 * ~0.5 s, timed to a synchronising to_host_f32 of one value. */
static int fw_gemm_peak(const char *device, int threads, int d, double *flops, char *err, size_t errlen) {
    const kern_ops *ops = NULL;
    kern_backend *be = NULL;
    void *in = NULL, *out = NULL;
    kern_weight w = {0};
    float one;
    int status = -1;
    if (kern_backend_create(device, threads, 0, &ops, &be, err, errlen)) return -1;
    size_t es = kern_dtype_size(ops->act_dtype), n = (size_t)d * d;
    in = ops->alloc(be, n * es);
    out = ops->alloc(be, n * es);
    if (!in || !out || ops->random_weight(be, &w, d, d, 0, 0, d, 1, 0.0f, 0.03f)) {
        snprintf(err, errlen, "gemm peak: cannot allocate %d x %d operands: %s", d, d, kern_last_error(be));
        goto out;
    }
    if (ops->matmul(be, out, in, &w, d) || ops->to_host_f32(be, &one, out, 1)) goto op_fail;
    double t0 = fw_now();
    if (ops->matmul(be, out, in, &w, d) || ops->to_host_f32(be, &one, out, 1)) goto op_fail;
    double t1 = fw_now() - t0;
    int reps = t1 > 0 ? (int)(0.5 / t1) : 50;
    reps = reps < 2 ? 2 : (reps > 200 ? 200 : reps);
    t0 = fw_now();
    for (int i = 0; i < reps; i++)
        if (ops->matmul(be, out, in, &w, d)) goto op_fail;
    if (ops->to_host_f32(be, &one, out, 1)) goto op_fail;
    *flops = 2.0 * (double)d * d * d * reps / (fw_now() - t0);
    status = 0;
    goto out;
op_fail:
    snprintf(err, errlen, "gemm peak: %s", kern_last_error(be));
out:
    if (w.data) ops->free_weight(be, &w);
    if (in) ops->free(be, in);
    if (out) ops->free(be, out);
    kern_backend_destroy(ops, be);
    return status;
}

/* One forward of `n` fresh sequences of `len` random tokens each, logits of
 * the last row of each; the sequences are freed unless `keep` receives them. */
static int fw_prefill_seqs(eng *e, int n, int len, int vocab, uint64_t *rng, int32_t *ids, eng_item *items,
                           float *logits, int *keep, double *sec, char *err, size_t errlen) {
    int status = -1, made = 0;
    int *sq = keep ? keep : malloc((size_t)n * sizeof *sq);
    if (!sq) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (; made < n; made++) {
        if (eng_seq_new(e, &sq[made], err, errlen)) goto out;
        fw_tokens(ids + (size_t)made * len, len, vocab, rng);
        items[made] = (eng_item){sq[made], ids + (size_t)made * len, len, ENG_LOGITS_LAST};
    }
    double t0 = fw_now();
    int rc = eng_step(e, items, n, logits, err, errlen);
    *sec = fw_now() - t0;
    if (rc == ENG_ENOSPACE) snprintf(err, errlen, "not enough KV blocks for %d x %d tokens", n, len);
    status = rc ? -1 : 0;
out:
    if (!keep || status)
        for (int i = 0; i < made; i++)
            eng_seq_free(e, sq[i]);
    if (!keep) free(sq);
    return status;
}

/* One run: the model's shape, the sizes it needs, the yardsticks, the
 * engine and its buffers, and what was measured. */
typedef struct fw_run {
    fw_opts o;
    model_config mc;
    int max_b, max_len;           /* largest decode batch; longest sequence */
    long long batch_tok, kv_blocks; /* tokens of the largest step; KV blocks */
    int on_cpu;
    size_t act_size, copy_bytes;
    double bps, fma_peak, peak; /* bandwidth (B/s), fma and matmul peaks (FLOP/s) */
    int gd;                     /* matmul peak's dimension, 0: skipped */
    eng *e;
    float *logits;
    int32_t *ids;
    eng_item *items;
    int *seqs;
    double *runs;
    uint64_t rng;
    double load_s;
    eng_rank_info ri;          /* rank 0's, after the load */
    double read_bytes, kv_tok; /* weight bytes a decode step reads; KV bytes per token */
    fw_prefill pre[FW_MAX_LIST];
    fw_decode dec[FW_MAX_LIST];
    double ttft_s;
    int finite;
    char err[1024];
} fw_run;

#define FW_BLOCK 16 /* KV block size */

/* The model's config and the engine's sizes: the longest sequence any
 * phase makes, the largest step, the KV blocks. */
static int fw_size(fw_run *r) {
    const fw_opts *o = &r->o;
    if (model_config_load(o->model, &r->mc, r->err, sizeof r->err) ||
        model_config_rope_override(&r->mc, o->rope_scaling, r->err, sizeof r->err))
        return -1;
    int max_pre = 0, max_b = 0;
    for (int i = 0; i < o->n_prefill; i++)
        max_pre = o->prefill[i] > max_pre ? o->prefill[i] : max_pre;
    for (int i = 0; i < o->n_batch; i++)
        max_b = o->batch[i] > max_b ? o->batch[i] : max_b;
    int dec_len = o->decode_prompt + (o->cuda_graphs ? 3 : 1) + o->decode_steps; /* prompt, warm-up steps, timed steps */
    int max_len = max_pre > o->ttft_len ? max_pre : o->ttft_len;
    max_len = max_len > dec_len ? max_len : dec_len;
    if (max_len > r->mc.max_position_embeddings) {
        snprintf(r->err, sizeof r->err, "%d tokens exceed the model's max_position_embeddings %d", max_len,
                 r->mc.max_position_embeddings);
        return -1;
    }
    long long blocks_pre = (max_len + FW_BLOCK - 1) / FW_BLOCK,
              blocks_dec = (long long)max_b * ((dec_len + FW_BLOCK - 1) / FW_BLOCK);
    long long batch_tok = (long long)max_b * o->decode_prompt;
    if (batch_tok < max_len) batch_tok = max_len;
    if (blocks_dec > (1 << 30) || batch_tok > (1 << 24)) {
        snprintf(r->err, sizeof r->err, "batch %d x %d tokens is too large", max_b, dec_len);
        return -1;
    }
    r->max_b = max_b;
    r->max_len = max_len;
    r->batch_tok = batch_tok;
    r->kv_blocks = blocks_pre > blocks_dec ? blocks_pre : blocks_dec;
    return 0;
}

/* Bandwidth and peaks, first, while the device holds nothing else. On cpu
 * the roofline is a streaming read (a decode step reads its weights); the
 * copy on a small buffer only gives the activation size there. */
static int fw_yardsticks(fw_run *r) {
    const fw_opts *o = &r->o;
    r->on_cpu = kern_backend_find(o->device)->host;
    r->copy_bytes = o->copy_bytes ? (size_t)o->copy_bytes : (size_t)1 << 30;
    if (fw_copy_bandwidth(o->device, o->threads, r->on_cpu ? (size_t)1 << 20 : r->copy_bytes, &r->bps, &r->act_size,
                          r->err, sizeof r->err) ||
        (r->on_cpu && fw_read_bandwidth(o->threads, r->copy_bytes, &r->bps, r->err, sizeof r->err)))
        return -1;
    if (r->on_cpu) r->fma_peak = fw_fma_peak(o->threads);
    r->gd = o->gemm_dim >= 0 ? o->gemm_dim : (r->on_cpu ? 1024 : 8192);
    return r->gd > 0 && fw_gemm_peak(o->device, o->threads, r->gd, &r->peak, r->err, sizeof r->err) ? -1 : 0;
}

/* The engine sized by fw_size, its step buffers, and what a decode step
 * reads (see the top of this file). */
static int fw_open(fw_run *r) {
    const fw_opts *o = &r->o;
    eng_config ec = {.model_dir = o->model,
                     .device = o->device,
                     .tp = o->tp,
                     .allreduce = o->allreduce,
                     .allreduce_auto = o->allreduce_auto,
                     .echo_group = o->echo_group,
                     .echo_codec = o->echo_codec,
                     .echo_min_bytes = (size_t)o->echo_min_bytes,
                     .threads = o->threads,
                     .kv_block_size = FW_BLOCK,
                     .max_model_len = r->max_len,
                     .max_num_seqs = r->max_b,
                     .max_batch_tokens = (int)r->batch_tok,
                     /* each prompt one pass, as before passes were cut at
                      * C (engine.h): a TTFT is one eng_step of one prompt */
                     .pass_tokens = (int)r->batch_tok,
                     .kv_blocks = (int)r->kv_blocks,
                     .cuda_graphs = o->cuda_graphs,
                     .quantize = o->quantize,
                     .act_quant = o->act_quant,
                     .kv_dtype = o->kv_dtype,
                     .rope_scaling = o->rope_scaling,
                     .overlap = o->overlap,
                     .oneshot = o->oneshot};
    double t0 = fw_now();
    if (eng_create(&ec, &r->e, r->err, sizeof r->err)) return -1;
    r->load_s = fw_now() - t0;
    if (eng_graphs_note(r->e)) fprintf(stderr, "echo-bench forward: note: %s\n", eng_graphs_note(r->e));
    const int V = r->mc.vocab_size;
    r->logits = malloc((size_t)r->max_b * V * sizeof *r->logits);
    r->ids = malloc((size_t)r->batch_tok * sizeof *r->ids);
    r->items = malloc((size_t)r->max_b * sizeof *r->items);
    r->seqs = malloc((size_t)r->max_b * sizeof *r->seqs);
    r->runs = malloc((size_t)o->iters * sizeof *r->runs);
    if (!r->logits || !r->ids || !r->items || !r->seqs || !r->runs) {
        snprintf(r->err, sizeof r->err, "out of memory");
        return -1;
    }
    eng_get_rank_info(r->e, 0, &r->ri);
    r->read_bytes = (double)r->ri.weight_bytes - (r->mc.tie_word_embeddings ? 0.0 : (double)r->ri.embed_bytes);
    /* the cache's bytes per token on this rank, as its type stores them */
    r->kv_tok = (double)eng_kv_block_bytes(eng_get_config(r->e), &r->mc) / FW_BLOCK;
    return 0;
}

/* Prefill per length: a warm-up, then --iters timed runs (median), and
 * the FLOPs of one run (see the top of this file). */
static int fw_run_prefill(fw_run *r) {
    const model_config *mc = &r->mc;
    const int V = mc->vocab_size, H = mc->hidden_size, L = mc->num_layers;
    double qd = (double)mc->num_heads * mc->head_dim, kvd = (double)mc->num_kv_heads * mc->head_dim;
    double p_layers = (double)L * (H * (qd + 2 * kvd) + qd * H + 3.0 * H * mc->intermediate_size);
    for (int i = 0; i < r->o.n_prefill; i++) {
        int len = r->o.prefill[i];
        double s;
        if (fw_prefill_seqs(r->e, 1, len, V, &r->rng, r->ids, r->items, r->logits, NULL, &s, r->err, sizeof r->err))
            return -1;
        r->finite &= fw_finite(r->logits, (size_t)V);
        for (int it = 0; it < r->o.iters; it++)
            if (fw_prefill_seqs(r->e, 1, len, V, &r->rng, r->ids, r->items, r->logits, NULL, &r->runs[it], r->err,
                                sizeof r->err))
                return -1;
        r->pre[i].len = len;
        r->pre[i].s = fw_median(r->runs, r->o.iters);
        r->pre[i].flop = 2 * p_layers * len + 2.0 * V * H + 4.0 * len * (double)len * qd * L / 2;
    }
    return 0;
}

/* Decode per batch size: B sequences prefilled, warm-up steps, then
 * --decode-steps timed steps of one token per sequence. */
static int fw_run_decode(fw_run *r) {
    const int V = r->mc.vocab_size;
    for (int i = 0; i < r->o.n_batch; i++) {
        int B = r->o.batch[i];
        double s;
        if (fw_prefill_seqs(r->e, B, r->o.decode_prompt, V, &r->rng, r->ids, r->items, r->logits, r->seqs, &s, r->err,
                            sizeof r->err))
            return -1;
        double t = 0;
        /* untimed warm-up steps; with graphs the first steps of a batch size
         * record it (a capture that must first grow a buffer is retried) */
        const int warm = r->o.cuda_graphs ? 3 : 1;
        for (int step = 0; step < warm + r->o.decode_steps; step++) {
            fw_tokens(r->ids, B, V, &r->rng);
            for (int b = 0; b < B; b++)
                r->items[b] = (eng_item){r->seqs[b], r->ids + b, 1, ENG_LOGITS_LAST};
            double ts = fw_now();
            int rc = eng_step(r->e, r->items, B, r->logits, r->err, sizeof r->err);
            if (step >= warm) t += fw_now() - ts;
            if (rc) {
                if (rc == ENG_ENOSPACE) snprintf(r->err, sizeof r->err, "not enough KV blocks for decode batch %d", B);
                for (int b = 0; b < B; b++)
                    eng_seq_free(r->e, r->seqs[b]);
                return -1;
            }
        }
        r->finite &= fw_finite(r->logits, (size_t)B * V);
        for (int b = 0; b < B; b++)
            eng_seq_free(r->e, r->seqs[b]);
        double ctx = r->o.decode_prompt + 1 + warm + (r->o.decode_steps - 1) / 2.0; /* mean context of the timed steps */
        r->dec[i] = (fw_decode){B, r->o.decode_steps, t, r->read_bytes + B * ctx * r->kv_tok};
    }
    return 0;
}

/* TTFT: one --ttft-len prompt on the idle engine to its first greedy
 * token, a warm-up then the median of --iters. */
static int fw_run_ttft(fw_run *r) {
    const int V = r->mc.vocab_size;
    eng_sampling greedy = {0, 0, 1.0f, 0};
    eng_rng er;
    eng_rng_seed(&er, 0);
    for (int it = -1; it < r->o.iters; it++) { /* it -1 warms up */
        int seq;
        if (eng_seq_new(r->e, &seq, r->err, sizeof r->err)) return -1;
        fw_tokens(r->ids, r->o.ttft_len, V, &r->rng);
        eng_item item = {seq, r->ids, r->o.ttft_len, ENG_LOGITS_LAST};
        double ts = fw_now();
        int rc = eng_step(r->e, &item, 1, r->logits, r->err, sizeof r->err);
        int32_t tok = rc ? -1 : eng_sample(r->logits, V, &greedy, &er);
        double dt = fw_now() - ts;
        eng_seq_free(r->e, seq);
        if (rc || tok < 0 || tok >= V) {
            if (!rc) snprintf(r->err, sizeof r->err, "TTFT: sampled token %d out of range", (int)tok);
            return -1;
        }
        if (it >= 0) r->runs[it] = dt;
    }
    r->ttft_s = fw_median(r->runs, r->o.iters);
    return 0;
}

/* The all-reduce's plan into the JSON: the preset's codec (int4 fixes its
 * own), G, bits, feedback. */
static void fw_json_allreduce(const fw_run *r, json_t *root) {
    eng *e = r->e;
    json_object_set_new(root, "allreduce",
                        json_string(r->o.tp > 1 ? echo_preset_name(eng_get_config(e)->allreduce) : "none"));
    json_t *au = cli_allreduce_auto_json(e);
    if (au) json_object_set_new(root, "allreduce_auto", au);
    const eng_config *ecfg = eng_get_config(e);
    echo_config pc = {0};
    if (eng_allreduce_config(e, &pc)) echo_preset_config(ecfg->allreduce, ecfg->echo_codec, ecfg->echo_group, &pc);
    const echo_codec_info *ci = echo_codec_get(pc.codec);
    json_object_set_new(root, "echo_codec", json_string(ci->name));
    json_object_set_new(root, "echo_group", json_integer(pc.group_size));
    json_object_set_new(root, "echo_feedback", json_boolean(r->o.tp > 1 && pc.feedback));
    json_object_set_new(root, "bits_per_value", json_real(r->o.tp < 2 ? 32.0 : echo_config_bits(&pc)));
    if (r->o.tp > 1) {
        char desc[256];
        echo_config_describe(ecfg->allreduce, &pc, desc, sizeof desc);
        json_object_set_new(root, "allreduce_plan", json_string(desc));
    }
}

/* --json: the configuration, the yardsticks and each phase's figures as
 * one object (docs/bench-forward.md). */
static int fw_report_json(fw_run *r) {
    const fw_opts *o = &r->o;
    const model_config *mc = &r->mc;
    eng *e = r->e;
    const double bps = r->bps, peak = r->peak, fma_peak = r->fma_peak;
    const eng_rank_info ri = r->ri;
    json_t *root = json_object(), *jp = json_array(), *jd = json_array();
    json_object_set_new(root, "model", json_string(o->model));
    json_object_set_new(root, "device", json_string(o->device));
    json_object_set_new(root, "tp", json_integer(o->tp));
    fw_json_allreduce(r, root);
    json_object_set_new(root, "cuda_graphs", json_boolean(o->cuda_graphs && !eng_graphs_note(e)));
    json_object_set_new(root, "graph_steps", json_integer(eng_graph_steps(e)));
    long nt = eng_get_config(e)->threads > 0 ? eng_get_config(e)->threads : sysconf(_SC_NPROCESSORS_ONLN);
    json_object_set_new(root, "threads", json_integer(r->on_cpu ? nt : 0));
    json_object_set_new(root, "config",
                        json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b}", "vocab_size", mc->vocab_size,
                                  "hidden_size", mc->hidden_size, "intermediate_size", mc->intermediate_size,
                                  "num_layers", mc->num_layers, "num_heads", mc->num_heads, "num_kv_heads",
                                  mc->num_kv_heads, "head_dim", mc->head_dim, "tie_word_embeddings",
                                  mc->tie_word_embeddings));
    json_object_set_new(root, "activations", json_string(r->act_size == 2 ? "bf16" : "fp32"));
    json_object_set_new(root, "load_s", json_real(r->load_s));
    json_object_set_new(root, "weight_bytes", json_integer((json_int_t)ri.weight_bytes));
    json_object_set_new(root, "weight_bytes_read_per_step", json_real(r->read_bytes));
    json_object_set_new(root, "kv_bytes_per_token", json_real(r->kv_tok));
    json_object_set_new(root, "kv_cache_dtype", json_string(kern_kv_dtype_name(eng_get_config(e)->kv_dtype)));
    json_object_set_new(root, "copy_bytes", json_integer((json_int_t)r->copy_bytes));
    json_object_set_new(root, r->on_cpu ? "read_gbps" : "copy_gbps", json_real(bps / 1e9));
    json_object_set_new(root, "quantize", json_string(o->quantize ? "q8_0" : "none"));
    json_object_set_new(root, "act_quant", json_string(ri.act_q8_matrices ? "q8_0" : "none"));
    json_object_set_new(root, "overlap", json_integer(eng_overlap_k(e)));
    json_object_set_new(root, "oneshot_bytes", json_integer((json_int_t)eng_oneshot_bytes(e)));
    json_object_set_new(root, "act_q8_matrices", json_integer(ri.act_q8_matrices));
    if (fma_peak > 0) json_object_set_new(root, "fma_peak_gflops", json_real(fma_peak / 1e9));
    if (r->gd > 0) {
        json_object_set_new(root, "gemm_dim", json_integer(r->gd));
        json_object_set_new(root, "gemm_peak_tflops", json_real(peak / 1e12));
    }
    for (int i = 0; i < o->n_prefill; i++) {
        const fw_prefill *p = &r->pre[i];
        json_array_append_new(jp, json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "tokens", p->len, "ms", p->s * 1e3,
                                            "tokens_per_s", p->len / p->s, "tflop", p->flop / 1e12, "tflops",
                                            p->flop / p->s / 1e12, "gemm_peak_pct",
                                            peak > 0 ? 100 * p->flop / p->s / peak : 0.0, "fma_peak_pct",
                                            fma_peak > 0 ? 100 * p->flop / p->s / fma_peak : 0.0));
    }
    for (int i = 0; i < o->n_batch; i++) {
        const fw_decode *d = &r->dec[i];
        double tps = d->batch * d->steps / d->s, roof = d->batch * bps / d->bytes_per_step;
        json_array_append_new(jd, json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:f}", "batch", d->batch, "steps",
                                            d->steps, "ms_per_step", d->s / d->steps * 1e3, "tokens_per_s", tps,
                                            "bytes_per_step", d->bytes_per_step, "roofline_tokens_per_s", roof,
                                            "roofline_pct", 100 * tps / roof));
    }
    json_object_set_new(root, "prefill", jp);
    json_object_set_new(root, "decode", jd);
    if (o->ttft_len > 0)
        json_object_set_new(root, "ttft", json_pack("{s:i, s:f}", "tokens", o->ttft_len, "ms", r->ttft_s * 1e3));
    json_object_set_new(root, "iters", json_integer(o->iters));
    json_object_set_new(root, "logits_finite", json_boolean(r->finite));
    char *txt = json_dumps(root, JSON_PRESERVE_ORDER | JSON_INDENT(1) | JSON_REAL_PRECISION(6));
    json_decref(root);
    if (!txt) {
        snprintf(r->err, sizeof r->err, "out of memory");
        return -1;
    }
    printf("%s\n", txt);
    free(txt);
    return 0;
}

/* The table: a header of the configuration and yardsticks, then a row per
 * prefill length and per decode batch, then TTFT. */
static void fw_report_table(const fw_run *r) {
    const fw_opts *o = &r->o;
    const model_config *mc = &r->mc;
    const double bps = r->bps, peak = r->peak, fma_peak = r->fma_peak;
    const size_t copy_bytes = r->copy_bytes;
    const int gd = r->gd;
    const eng_rank_info ri = r->ri;
    const int graphs_on = o->cuda_graphs && !eng_graphs_note(r->e);
    printf("# echo-bench forward: %s on %s, tp %d, %s activations; %d layers, hidden %d, vocab %d%s\n", o->model,
           o->device, o->tp, r->act_size == 2 ? "bf16" : "fp32", mc->num_layers, mc->hidden_size, mc->vocab_size,
           graphs_on ? "; decode through CUDA graphs" : "");
    printf("# KV cache %s, %.0f bytes per token per rank\n", kern_kv_dtype_name(eng_get_config(r->e)->kv_dtype),
           r->kv_tok);
    if (r->on_cpu)
        printf("# weights %.3f GB held%s, %.3f GB read per decode step; read bandwidth %.1f GB/s (%zu MiB "
               "streamed by %ld threads); load %.1f s\n",
               ri.weight_bytes / 1e9,
               o->quantize           ? (ri.act_q8_matrices ? " (q8_0, 8-bit activations)" : " (q8_0)")
               : ri.act_q8_matrices ? " (8-bit activations)"
                                    : "",
               r->read_bytes / 1e9, bps / 1e9, copy_bytes >> 20,
               o->threads > 0 ? (long)o->threads : sysconf(_SC_NPROCESSORS_ONLN), r->load_s);
    else
        printf("# weights %.3f GB held, %.3f GB read per decode step; copy bandwidth %.1f GB/s (ops->copy of "
               "%zu MiB, 2 x bytes / time); load %.1f s\n",
               ri.weight_bytes / 1e9, r->read_bytes / 1e9, bps / 1e9, copy_bytes >> 20, r->load_s);
    if (gd > 0) printf("# matmul peak %.3f TFLOP/s (ops->matmul %d x %d x %d)\n", peak / 1e12, gd, gd, gd);
    if (fma_peak > 0) printf("# fma peak %.3f TFLOP/s (fp32 vector fmas in registers, all threads)\n", fma_peak / 1e12);
    printf("# prefill (median of %d)  %8s %10s %10s %9s %7s %7s\n", o->iters, "tokens", "ms", "tok/s", "TFLOP/s",
           "% peak", "% fma");
    for (int i = 0; i < o->n_prefill; i++) {
        const fw_prefill *p = &r->pre[i];
        printf("  %-22s %8d %10.2f %10.1f %9.3f %6.1f%% %6.1f%%\n", "", p->len, p->s * 1e3, p->len / p->s,
               p->flop / p->s / 1e12, peak > 0 ? 100 * p->flop / p->s / peak : 0.0,
               fma_peak > 0 ? 100 * p->flop / p->s / fma_peak : 0.0);
    }
    printf("# decode (%3d steps)       %8s %10s %10s %9s %8s\n", o->decode_steps, "batch", "ms/step", "tok/s",
           "roof t/s", "% roof");
    for (int i = 0; i < o->n_batch; i++) {
        const fw_decode *d = &r->dec[i];
        double tps = d->batch * d->steps / d->s, roof = d->batch * bps / d->bytes_per_step;
        printf("  %-22s %8d %10.3f %10.1f %9.1f %7.1f%%\n", "", d->batch, d->s / d->steps * 1e3, tps, roof,
               100 * tps / roof);
    }
    if (o->ttft_len > 0)
        printf("# ttft (median of %d)     %8d tokens %10.2f ms (eng_step + greedy eng_sample, idle engine)\n", o->iters,
               o->ttft_len, r->ttft_s * 1e3);
    if (!r->finite) printf("# WARNING: non-finite logits\n");
}

int bench_forward_main(int argc, char **argv) {
    cli_procs_start("echo-bench forward"); /* under mpirun: ranks > 0 follow rank 0 and exit there */
    fw_run run = {.o = {.device = "cpu",
                        .act_quant = ENG_ACT_AUTO,
                        .kv_dtype = KERN_KV_BF16,
                        .tp = 1,
                        .gemm_dim = -1,
                        .iters = 3,
                        .decode_steps = 32,
                        .decode_prompt = 16,
                        .ttft_len = 2048,
                        .prefill = {512, 2048, 8192},
                        .n_prefill = 3,
                        .batch = {1, 16, 64},
                        .n_batch = 3},
                  .finite = 1};
    fw_run *r = &run;
    int status = 1, rc = fw_parse(argc, argv, &r->o);
    if (rc) return rc < 0 ? 0 : rc;
    r->o.device = kern_backend_find(r->o.device)->name; /* "auto" resolved */
    r->rng = r->o.seed;
    if (fw_size(r) || fw_yardsticks(r) || fw_open(r) || fw_run_prefill(r) || fw_run_decode(r) ||
        (r->o.ttft_len > 0 && fw_run_ttft(r)))
        goto fail;
    if (!r->finite) fprintf(stderr, "echo-bench forward: warning: non-finite logits (random weights overflowed?)\n");
    if (r->o.json ? fw_report_json(r) : (fw_report_table(r), 0)) goto fail;
    status = 0;
    goto out;
fail:
    fprintf(stderr, "echo-bench forward: %s\n", r->err);
out:
    eng_destroy(r->e);
    free(r->logits);
    free(r->ids);
    free(r->items);
    free(r->seqs);
    free(r->runs);
    return status;
}
