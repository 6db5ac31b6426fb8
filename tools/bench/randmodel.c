/*
 * echo-bench randmodel: a Hugging Face-style Qwen3 folder with random bf16
 * weights, so a GPU machine that can reach nothing outside can still time a
 * model of a real shape (docs/bench-forward.md).
 *
 *   DIR/config.json             Qwen3ForCausalLM fields as the real
 *                               checkpoints of that shape have them
 *   DIR/generation_config.json  bos/eos ids
 *   DIR/model.safetensors       one file: header JSON padded with spaces so
 *                               the data starts 8-byte aligned, every tensor
 *                               at an 8-byte-aligned offset
 *
 * Values: linear layers and the embedding are N(0, 0.02) (Qwen3's
 * initializer_range), norms are 1.0, so activations keep a sane scale through
 * every layer. They are not trained weights: logits are noise and a benchmark
 * of them measures speed only.
 *
 * Speed: a 16 GB file must not dominate a 15-minute GPU loan, so values come
 * from a table of 4096 bf16 Gaussian quantiles (8 KiB: stays in L1)
 * indexed by 12 bits of an xorshift64* stream (five values per 64-bit draw),
 * filled by several threads into one 64 MiB buffer while this thread hands
 * the previous one to write(2). Each 1 MiB
 * chunk of the data area has its own stream seeded from (--seed, chunk
 * index), so the file is the same for any thread count. It is written as
 * model.safetensors.tmp and renamed when complete; config.json is written
 * last, so a folder with a config.json is whole.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "model/model.h"
#include "tools/bench/bench.h"
#include "tools/cli.h"

#define RM_CHUNK ((size_t)1 << 20) /* bytes per independent random stream */
#define RM_BUF ((size_t)64 << 20)  /* bytes per write(2); a multiple of RM_CHUNK */
#define RM_MAX_THREADS 64
#define RM_STD 0.02 /* Qwen3 initializer_range */
#define RM_TBITS 12 /* quantile table index bits */
#define RM_TSIZE (1 << RM_TBITS)
#define RM_TMASK (RM_TSIZE - 1)

/* A shape: its dimensions come from model/'s table of random-model shapes
 * (model_random_parse("random:NAME"): the published config.json values of
 * Qwen/Qwen3-8B and Qwen/Qwen3-0.6B, and a CI-sized tiny), so the files
 * written here and the in-memory random: models share one source; only the
 * bos id, which the engine never needs, is kept here. */
typedef struct rm_shape {
    const char *name;
    int bos;
    model_config c;
} rm_shape;

static const struct {
    const char *name;
    int bos;
} rm_bos[] = {{"qwen3-8b", 151643}, {"qwen3-0.6b", 151643}, {"tiny", 510}};

/* Fill *s for shape `name`; -1 if unknown. */
static int rm_shape_get(const char *name, rm_shape *s) {
    char spec[64], err[256];
    for (size_t i = 0; i < sizeof rm_bos / sizeof *rm_bos; i++) {
        if (strcmp(name, rm_bos[i].name)) continue;
        snprintf(spec, sizeof spec, "%s%s", MODEL_RANDOM_PREFIX, name);
        if (model_random_parse(spec, &s->c, NULL, err, sizeof err)) return -1;
        s->name = rm_bos[i].name;
        s->bos = rm_bos[i].bos;
        return 0;
    }
    return -1;
}

typedef struct rm_tensor {
    char name[96];
    int64_t rows, cols; /* rows == 0: a vector of cols values */
    size_t begin, end;  /* data_offsets */
    int is_norm;        /* filled with 1.0 instead of random values */
} rm_tensor;

typedef struct rm_fill {
    uint8_t *buf;
    size_t off, len; /* this buffer holds data bytes [off, off + len) */
    uint64_t seed;
    const uint16_t *table;
    int tid, nthreads;
} rm_fill;

static double rm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rm_mix(uint64_t z) { /* splitmix64 finaliser */
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint16_t rm_bf16(float f) { /* round to nearest even; inputs are finite */
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* table[i] = bf16(std * Phi^-1((i + 0.5) / 4096)): a 12-bit uniform index
 * then gives an N(0, std^2) value (discretised, tails cut at 3.5 sigma; bf16
 * keeps only 8 significant bits anyway). Bisection on erfc, once. */
static void rm_gauss_table(uint16_t *table, double std) {
    for (int i = 0; i < RM_TSIZE; i++) {
        double p = (i + 0.5) / RM_TSIZE, lo = -10, hi = 10;
        for (int it = 0; it < 64; it++) {
            double mid = 0.5 * (lo + hi);
            if (0.5 * erfc(-mid / sqrt(2.0)) < p)
                lo = mid;
            else
                hi = mid;
        }
        table[i] = rm_bf16((float)(std * 0.5 * (lo + hi)));
    }
}

/* Chunks c with c % nthreads == tid of the buffer: each from its own
 * xorshift64* stream seeded by (seed, global chunk index). */
static void *rm_fill_main(void *p) {
    const rm_fill *f = p;
    size_t first = f->off / RM_CHUNK, n = (f->len + RM_CHUNK - 1) / RM_CHUNK;
    for (size_t c = (size_t)f->tid; c < n; c += (size_t)f->nthreads) {
        uint64_t s = rm_mix(f->seed ^ rm_mix(first + c + 1)) | 1;
        size_t b0 = c * RM_CHUNK, b1 = b0 + RM_CHUNK < f->len ? b0 + RM_CHUNK : f->len;
        uint16_t *dst = (uint16_t *)(f->buf + b0);
        size_t nv = (b1 - b0) / 2, i = 0;
        for (; i + 5 <= nv; i += 5) {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            uint64_t r = (s * 0x2545f4914f6cdd1dull) >> 4; /* the top 60 bits */
            dst[i] = f->table[r & RM_TMASK];
            dst[i + 1] = f->table[(r >> 12) & RM_TMASK];
            dst[i + 2] = f->table[(r >> 24) & RM_TMASK];
            dst[i + 3] = f->table[(r >> 36) & RM_TMASK];
            dst[i + 4] = f->table[r >> 48];
        }
        for (; i < nv; i++)
            dst[i] = f->table[(s = rm_mix(s)) & RM_TMASK];
    }
    return NULL;
}

static int rm_usage_error(const char *fmt, const char *a) { return bench_usage_error("randmodel", fmt, a); }

static const char RM_USAGE[] =
    "usage: echo-bench randmodel --out DIR [--shape qwen3-8b|qwen3-0.6b|tiny] [--layers N] [--seed S]\n"
    "                            [--dtype bf16] [--threads N] [--force]\n"
    "\n"
    "Writes a Qwen3 model folder with random bf16 weights (config.json, generation_config.json,\n"
    "model.safetensors) that echo-generate, echo-serve and echo-bench forward load like a real one.\n"
    "  --shape S     qwen3-8b (16.4 GB), qwen3-0.6b (1.2 GB, tied head) or tiny (default; CI-sized)\n"
    "  --layers N    override the shape's layer count (e.g. fewer layers when the disk is small)\n"
    "  --seed S      random stream (default 0); the file is the same for any thread count\n"
    "  --dtype bf16  the only weight dtype written\n"
    "  --threads N   generator threads (default: online CPUs, at most 64)\n"
    "  --force       write into a non-empty DIR (overwrites the three files above)\n"
    "Exit status: 0 ok, 1 runtime error (disk full, I/O), 2 usage error.\n";

/* Non-empty: anything other than . and .. */
static int rm_dir_state(const char *dir, int *exists, int *nonempty) {
    DIR *d = opendir(dir);
    *exists = *nonempty = 0;
    if (!d) return errno == ENOENT ? 0 : -1;
    *exists = 1;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            *nonempty = 1;
            break;
        }
    closedir(d);
    return 0;
}

static int rm_mkdir_p(const char *dir) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) return -1;
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

static int rm_write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int rm_write_text(const char *dir, const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
}

/* The tensor list in file order, with 8-byte-aligned data offsets. Returns
 * the count, or -1 when out of memory. */
static int rm_tensors(const rm_shape *s, rm_tensor **out, size_t *data_bytes) {
    const model_config *c = &s->c;
    int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, hd = c->head_dim;
    int64_t qd = (int64_t)c->num_heads * hd, kvd = (int64_t)c->num_kv_heads * hd;
    int n = 3 + 11 * c->num_layers - c->tie_word_embeddings;
    rm_tensor *t = calloc((size_t)n, sizeof *t);
    if (!t) return -1;
    int k = 0;
#define RM_ADD(norm, r, c, ...)                                                                                        \
    do {                                                                                                               \
        snprintf(t[k].name, sizeof t[k].name, __VA_ARGS__);                                                            \
        t[k].rows = (r);                                                                                               \
        t[k].cols = (c);                                                                                               \
        t[k].is_norm = (norm);                                                                                         \
        k++;                                                                                                           \
    } while (0)
    RM_ADD(0, V, H, "model.embed_tokens.weight");
    for (int l = 0; l < c->num_layers; l++) {
        RM_ADD(1, 0, H, "model.layers.%d.input_layernorm.weight", l);
        RM_ADD(0, qd, H, "model.layers.%d.self_attn.q_proj.weight", l);
        RM_ADD(0, kvd, H, "model.layers.%d.self_attn.k_proj.weight", l);
        RM_ADD(0, kvd, H, "model.layers.%d.self_attn.v_proj.weight", l);
        RM_ADD(0, H, qd, "model.layers.%d.self_attn.o_proj.weight", l);
        RM_ADD(1, 0, hd, "model.layers.%d.self_attn.q_norm.weight", l);
        RM_ADD(1, 0, hd, "model.layers.%d.self_attn.k_norm.weight", l);
        RM_ADD(1, 0, H, "model.layers.%d.post_attention_layernorm.weight", l);
        RM_ADD(0, I, H, "model.layers.%d.mlp.gate_proj.weight", l);
        RM_ADD(0, I, H, "model.layers.%d.mlp.up_proj.weight", l);
        RM_ADD(0, H, I, "model.layers.%d.mlp.down_proj.weight", l);
    }
    RM_ADD(1, 0, H, "model.norm.weight");
    if (!c->tie_word_embeddings) RM_ADD(0, V, H, "lm_head.weight");
#undef RM_ADD
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t count = (size_t)(t[i].rows ? t[i].rows : 1) * (size_t)t[i].cols;
        t[i].begin = off;
        t[i].end = off + count * 2;
        off = (t[i].end + 7) & ~(size_t)7;
    }
    *out = t;
    *data_bytes = off;
    return n;
}

/* The safetensors header, padded with spaces so 8 + its length is a
 * multiple of 8. NULL when out of memory. */
static char *rm_header(const rm_tensor *t, int n, size_t *len) {
    size_t cap = 256 + (size_t)n * 192, pos = 0;
    char *h = malloc(cap);
    if (!h) return NULL;
    pos += (size_t)snprintf(h + pos, cap - pos, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        if (t[i].rows)
            pos += (size_t)snprintf(h + pos, cap - pos, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],", t[i].name,
                                    (long long)t[i].rows, (long long)t[i].cols);
        else
            pos += (size_t)snprintf(h + pos, cap - pos, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],", t[i].name,
                                    (long long)t[i].cols);
        pos += (size_t)snprintf(h + pos, cap - pos, "\"data_offsets\":[%zu,%zu]}", t[i].begin, t[i].end);
    }
    pos += (size_t)snprintf(h + pos, cap - pos, "}");
    while ((8 + pos) % 8)
        h[pos++] = ' ';
    h[pos] = 0;
    *len = pos;
    return h;
}

static void rm_config_json(const rm_shape *s, int layers, char *buf, size_t n) {
    snprintf(buf, n,
             "{\n"
             "  \"architectures\": [\"Qwen3ForCausalLM\"],\n"
             "  \"attention_bias\": false,\n"
             "  \"attention_dropout\": 0.0,\n"
             "  \"bos_token_id\": %d,\n"
             "  \"eos_token_id\": %d,\n"
             "  \"head_dim\": %d,\n"
             "  \"hidden_act\": \"silu\",\n"
             "  \"hidden_size\": %d,\n"
             "  \"initializer_range\": 0.02,\n"
             "  \"intermediate_size\": %d,\n"
             "  \"max_position_embeddings\": %d,\n"
             "  \"max_window_layers\": %d,\n"
             "  \"model_type\": \"qwen3\",\n"
             "  \"num_attention_heads\": %d,\n"
             "  \"num_hidden_layers\": %d,\n"
             "  \"num_key_value_heads\": %d,\n"
             "  \"rms_norm_eps\": 1e-06,\n"
             "  \"rope_scaling\": null,\n"
             "  \"rope_theta\": 1000000,\n"
             "  \"sliding_window\": null,\n"
             "  \"tie_word_embeddings\": %s,\n"
             "  \"torch_dtype\": \"bfloat16\",\n"
             "  \"transformers_version\": \"4.51.0\",\n"
             "  \"use_cache\": true,\n"
             "  \"use_sliding_window\": false,\n"
             "  \"vocab_size\": %d,\n"
             "  \"echo_random_weights\": \"echo-bench randmodel --shape %s\"\n"
             "}\n",
             s->bos, s->c.eos_ids[0], s->c.head_dim, s->c.hidden_size, s->c.intermediate_size,
             s->c.max_position_embeddings, layers, s->c.num_heads, layers, s->c.num_kv_heads,
             s->c.tie_word_embeddings ? "true" : "false", s->c.vocab_size, s->name);
}

/* Write the data area [0, data_bytes) after the header, buffer by buffer. */
/* One buffer being filled by nthreads threads (started[i] = 0: thread i
 * could not start and its chunks are filled by rm_fill_end). */
typedef struct rm_job {
    rm_fill f[RM_MAX_THREADS];
    pthread_t th[RM_MAX_THREADS];
    int started[RM_MAX_THREADS];
} rm_job;

static void rm_fill_begin(rm_job *j, uint8_t *buf, size_t off, size_t len, uint64_t seed, const uint16_t *table,
                          int nthreads) {
    for (int i = 0; i < nthreads; i++) {
        j->f[i] = (rm_fill){buf, off, len, seed, table, i, nthreads};
        j->started[i] = pthread_create(&j->th[i], NULL, rm_fill_main, &j->f[i]) == 0;
    }
}

/* Join the fillers, then set the norms to 1 and zero the alignment padding
 * that fall inside this buffer. */
static void rm_fill_end(rm_job *j, int nthreads, const rm_tensor *t, int n, size_t data_bytes) {
    for (int i = 0; i < nthreads; i++) {
        if (j->started[i])
            pthread_join(j->th[i], NULL);
        else
            rm_fill_main(&j->f[i]);
    }
    uint8_t *buf = j->f[0].buf;
    size_t off = j->f[0].off, len = j->f[0].len;
    uint16_t one = rm_bf16(1.0f);
    for (int i = 0; i < n; i++) {
        size_t b = t[i].begin > off ? t[i].begin : off;
        size_t e = t[i].end < off + len ? t[i].end : off + len;
        if (t[i].is_norm && b < e)
            for (size_t p = b; p < e; p += 2)
                memcpy(buf + (p - off), &one, 2);
        size_t pad_b = t[i].end > off ? t[i].end : off;
        size_t pad_e = i + 1 < n ? t[i + 1].begin : data_bytes;
        if (pad_e > off + len) pad_e = off + len;
        if (pad_b < pad_e) memset(buf + (pad_b - off), 0, pad_e - pad_b);
    }
}

/* Write the data area [0, data_bytes) after the header: the threads fill
 * buffer k+1 while this thread writes buffer k. */
static int rm_write_data(int fd, const rm_tensor *t, int n, size_t data_bytes, uint64_t seed, int nthreads,
                         const uint16_t *table, uint8_t *bufs[2]) {
    rm_job *j = calloc(2, sizeof *j);
    if (!j) return -1;
    int k = 0, status = 0;
    size_t off = 0, len = data_bytes < RM_BUF ? data_bytes : RM_BUF;
    if (len) rm_fill_begin(&j[0], bufs[0], 0, len, seed, table, nthreads);
    while (len) {
        rm_fill_end(&j[k], nthreads, t, n, data_bytes);
        size_t noff = off + len, nlen = data_bytes - noff < RM_BUF ? data_bytes - noff : RM_BUF;
        if (nlen) rm_fill_begin(&j[!k], bufs[!k], noff, nlen, seed, table, nthreads);
        if (!status && rm_write_all(fd, bufs[k], len)) status = -1; /* keep going: the fillers must be joined */
        if (status && nlen) {
            rm_fill_end(&j[!k], nthreads, t, n, data_bytes);
            break;
        }
        off = noff;
        len = nlen;
        k = !k;
    }
    free(j);
    return status;
}

int bench_randmodel_main(int argc, char **argv) {
    enum { O_OUT = 1000, O_SHAPE, O_LAYERS, O_SEED, O_DTYPE, O_THREADS, O_FORCE, O_HELP };
    static const struct option lo[] = {
        {"out", required_argument, 0, O_OUT},
        {"shape", required_argument, 0, O_SHAPE},
        {"layers", required_argument, 0, O_LAYERS},
        {"seed", required_argument, 0, O_SEED},
        {"dtype", required_argument, 0, O_DTYPE},
        {"threads", required_argument, 0, O_THREADS},
        {"force", no_argument, 0, O_FORCE},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    const char *out = NULL;
    rm_shape s;
    if (rm_shape_get("tiny", &s)) return 1; /* model/'s table always has it */
    long layers = 0, seed = 0, nthreads = 0;
    int force = 0, rc = 0;
    char **av = argv; /* argv[0] is the subcommand name */
    int ac = argc, c;
    bench_getopt_reset();
    while (!rc && (c = getopt_long(ac, av, ":h", lo, NULL)) != -1) {
        const char *a = optarg;
        switch (c) {
        case O_OUT: out = a; break;
        case O_SHAPE:
            if (rm_shape_get(a, &s)) rc = rm_usage_error("--shape: expected qwen3-8b, qwen3-0.6b or tiny, got '%s'", a);
            break;
        case O_LAYERS:
            if (cli_parse_long(a, 1, 1024, &layers)) rc = rm_usage_error("--layers: expected 1..1024, got '%s'", a);
            break;
        case O_SEED:
            if (cli_parse_long(a, 0, 0x7fffffffL, &seed))
                rc = rm_usage_error("--seed: expected 0..2147483647, got '%s'", a);
            break;
        case O_DTYPE:
            if (strcmp(a, "bf16")) rc = rm_usage_error("--dtype: only bf16 is written, got '%s'", a);
            break;
        case O_THREADS:
            if (cli_parse_long(a, 1, RM_MAX_THREADS, &nthreads))
                rc = rm_usage_error("--threads: expected 1..64, got '%s'", a);
            break;
        case O_FORCE: force = 1; break;
        case 'h':
        case O_HELP:
            fputs(RM_USAGE, stdout);
            rc = -1;
            break;
        default: rc = bench_getopt_error("randmodel", c, av); break;
        }
    }
    if (!rc && optind < ac) rc = rm_usage_error("unexpected argument '%s'", av[optind]);
    if (!rc && !out) rc = rm_usage_error("%s", "--out DIR is required");
    if (rc) return rc < 0 ? 0 : rc;

    if (layers) s.c.num_layers = (int)layers;
    if (!nthreads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n < 1 ? 1 : (n > RM_MAX_THREADS ? RM_MAX_THREADS : n);
    }
    int exists, nonempty;
    if (rm_dir_state(out, &exists, &nonempty)) {
        fprintf(stderr, "echo-bench randmodel: %s: %s\n", out, strerror(errno));
        return 1;
    }
    if (nonempty && !force) {
        fprintf(stderr, "echo-bench randmodel: %s is not empty; pass --force to write into it\n", out);
        return 1;
    }
    char index[4200];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", out);
    if (nonempty && access(index, F_OK) == 0) { /* weights_open would read the index, not our file */
        fprintf(stderr, "echo-bench randmodel: %s would shadow the new model.safetensors; remove it first\n", index);
        return 1;
    }
    if (!exists && rm_mkdir_p(out)) {
        fprintf(stderr, "echo-bench randmodel: mkdir %s: %s\n", out, strerror(errno));
        return 1;
    }

    rm_tensor *t = NULL;
    char *header = NULL, tmp[4200] = "", final[4200], text[4096];
    uint16_t *table = malloc(RM_TSIZE * sizeof *table);
    uint8_t *bufs[2] = {malloc(RM_BUF), malloc(RM_BUF)};
    size_t data_bytes = 0, hlen = 0;
    int n = rm_tensors(&s, &t, &data_bytes), fd = -1, status = 1;
    if (n < 0 || !table || !bufs[0] || !bufs[1] || !(header = rm_header(t, n, &hlen))) {
        fprintf(stderr, "echo-bench randmodel: out of memory\n");
        goto out;
    }
    rm_gauss_table(table, RM_STD);
    snprintf(tmp, sizeof tmp, "%s/model.safetensors.tmp", out);
    snprintf(final, sizeof final, "%s/model.safetensors", out);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "echo-bench randmodel: %s: %s\n", tmp, strerror(errno));
        goto out;
    }
    double t0 = rm_now();
    uint64_t hl = hlen; /* little-endian u64, as safetensors wants */
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(hl >> (8 * i));
    if (rm_write_all(fd, le, 8) || rm_write_all(fd, header, hlen) ||
        rm_write_data(fd, t, n, data_bytes, rm_mix((uint64_t)seed), (int)nthreads, table, bufs)) {
        fprintf(stderr, "echo-bench randmodel: writing %s: %s\n", tmp, strerror(errno));
        goto out;
    }
    if (close(fd)) {
        fd = -1;
        fprintf(stderr, "echo-bench randmodel: closing %s: %s\n", tmp, strerror(errno));
        goto out;
    }
    fd = -1;
    double dt = rm_now() - t0;
    if (rename(tmp, final)) {
        fprintf(stderr, "echo-bench randmodel: rename %s: %s\n", final, strerror(errno));
        goto out;
    }
    snprintf(text, sizeof text,
             "{\n  \"bos_token_id\": %d,\n  \"eos_token_id\": [%d, %d],\n  \"transformers_version\": \"4.51.0\"\n}\n",
             s.bos, s.c.eos_ids[0], s.bos);
    if (rm_write_text(out, "generation_config.json", text)) {
        fprintf(stderr, "echo-bench randmodel: %s/generation_config.json: %s\n", out, strerror(errno));
        goto out;
    }
    rm_config_json(&s, s.c.num_layers, text, sizeof text);
    if (rm_write_text(out, "config.json", text)) {
        fprintf(stderr, "echo-bench randmodel: %s/config.json: %s\n", out, strerror(errno));
        goto out;
    }
    double gb = (double)(8 + hlen + data_bytes) / 1e9;
    printf("randmodel: %s, %d layers, %d tensors, %.3f GB in %.2f s (%.2f GB/s, %ld threads) -> %s\n", s.name, s.c.num_layers,
           n, gb, dt, dt > 0 ? gb / dt : 0.0, nthreads, out);
    status = 0;
out:
    if (fd >= 0) close(fd);
    if (status && tmp[0]) unlink(tmp);
    free(t);
    free(header);
    free(table);
    free(bufs[0]);
    free(bufs[1]);
    return status;
}
