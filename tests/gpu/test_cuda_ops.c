/*
 * gpu_test_cuda_ops: every op of the kern_ops table on the cuda backend
 * against the cpu backend (the fp32 oracle), on random inputs.
 *
 * Inputs are rounded to bf16 on the host first, so both backends see the
 * same values; activations reach either backend only through the op table
 * (upload_weight + an identity embedding gather), results come back through
 * to_host_f32. Each case prints one line
 *     op  shape  rel_err=‖cuda − cpu‖₂/‖cpu‖₂  PASS|FAIL
 * and the exit status is 0 when all pass, 1 when any fails, 77 when there is
 * no GPU (or no cuda backend in this build): "no GPU: skipped".
 *
 * Shapes cover Qwen3-8B-like attention (GQA 4:1, head_dim 128) over a paged
 * KV cache: batches of several sequences of different lengths with
 * pos0 > 0, interleaved block tables (seq 0 on blocks 3,0,5, seq 1 on 1,4),
 * block sizes 16 and 4, MQA, MHA, a sequence with no rows, long decode
 * contexts, and a batch-invariance check (a sequence alone gives the same
 * bits as in a batch). The cache is written through kv_store (the history in
 * one call, the batch's new rows in another) over a cache pre-filled with
 * garbage, so a wrong block mapping shows. Weights are also given as
 * strided views (ld > cols: the column slices of tensor-parallel
 * row-parallel layers) to matmul and embedding (which checks the upload
 * exactly, including a multi-chunk F16 conversion). Odd sizes (head_dim 80,
 * 1000x200 matmul, 2-byte-aligned matmul operands) and the tiny fixture
 * models (hidden 64, head_dim 16) are covered too. Weights are tested as
 * BF16, F16 and F32 (cuda converts F16 and F32 to bf16 on upload). Host
 * integer arrays go through the backend's asynchronous staging: 24 ops in a
 * row with their own positions and no synchronisation between must each
 * read their own (the staging ring reuses a buffer only after its copy ran),
 * and so must a graph launched back to back with new positions (its arena
 * is rewritten only after the previous launch's upload ran). Every KV cache
 * type (kern_kv_dtype: fp32, bf16, fp16, q8_0 with its rotated keys):
 * kv_store byte for byte against kern_kv_store_ref (kernels/kv.h), on both
 * backends, and attention over each type against the cpu op on the same
 * type, on every cuda attention path.
 *
 * Usage: gpu_test_cuda_ops [--device-index N] [--self-check] [--bench] [--emu]
 * --self-check runs the cpu backend in place of cuda (a harness check that
 * needs no GPU: every case must then pass, the exact ones with 0 error).
 * --bench then times attention (printed, not asserted): causal prefill
 * TFLOP/s of 2048 and 8192 tokens and decode GB/s of 64 sequences x 4096
 * positions, Qwen3-8B heads (small sizes with --self-check).
 * --emu is for the CPU emulator of tests/emu (make test-emu), where every
 * CUDA thread is a coroutine: cases whose emulated work is above a budget
 * print "skipped (--emu: too large to emulate)" instead of running, the rest
 * run unchanged. Work is counted in elements the kernels touch (matmul: in
 * multiply-adds, cuBLASLt being emulated on the host; attention: query
 * heads x the keys each row sees), see the EMU_* limits; the small
 * attention specs marked "emu-sized" keep every attention path covered
 * there: the simple kernel, the tiled tensor-core prefill at head_dim 64 and
 * 128, split-K decode with the combine, mixed batches, batch invariance and
 * paging.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
#include "kernels/kv.h"

#define TOL 2e-2

typedef struct bk {
    const kern_ops *ops;
    kern_backend *be;
} bk;

static bk g_cpu, g_gpu;
static int g_fail, g_cases, g_skipped;
static int g_emu; /* --emu: skip cases too large for the CPU emulator */

/* --emu budgets (see the file comment) */
#define EMU_MAX_ELEMS 300000.0 /* elementwise, norm, rope, gather, top-k, upload conversions */
#define EMU_MAX_MACS 2e7       /* matmul (n x rows x cols) */
#define EMU_MAX_ATT 12000.0    /* attention: hq x sum over rows of the keys each row sees */

/* ---- host helpers ---- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
/* uniform in [-a, a) */
static float frand(float a) {
    return a * (2.0f * (float)(rnd32() & 0xffffff) / 16777216.0f - 1.0f);
}

static uint16_t f32_to_bf16_bits(float x) {
    union {
        float f;
        uint32_t u;
    } v = {.f = x};
    uint32_t lsb = (v.u >> 16) & 1;
    v.u += 0x7fffu + lsb;
    return (uint16_t)(v.u >> 16);
}
static float bf16r(float x) {
    return kern_bf16_to_f32(f32_to_bf16_bits(x));
}

/* n random bf16-representable floats in [-a, a) */
static float *rand_f32(size_t n, float a) {
    float *p = malloc(n * sizeof *p + 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = bf16r(frand(a));
    return p;
}

/* A host weight of the given dtype filled with random values; *raw owns the
 * storage. F16 bits are drawn directly (magnitudes 2^-5 .. 2). */
static kern_weight rand_weight(kern_dtype dt, int64_t rows, int64_t cols, float a, void **raw) {
    size_t n = (size_t)(rows * cols);
    kern_weight w = {NULL, dt, rows, cols, 0};
    if (dt == KERN_F32) {
        *raw = rand_f32(n, a);
    } else {
        uint16_t *p = malloc(n * sizeof *p + 2);
        if (!p) exit(1);
        for (size_t i = 0; i < n; i++) {
            if (dt == KERN_BF16) {
                p[i] = f32_to_bf16_bits(frand(a));
            } else {
                uint32_t r = rnd32();
                uint16_t sign = (uint16_t)((r & 1) << 15), exp = (uint16_t)(10 + (r >> 1) % 7),
                         man = (uint16_t)((r >> 4) & 0x3ff);
                p[i] = (uint16_t)(sign | (exp << 10) | man);
            }
        }
        *raw = p;
    }
    w.data = *raw;
    return w;
}

/* Columns [c0, c0+cols) of a row-major (rows, ld) host weight: a strided
 * view like the column slices of row-parallel layers. */
static kern_weight col_view(kern_weight full, int64_t c0, int64_t cols) {
    kern_weight w = full;
    w.data = (const char *)full.data + (size_t)c0 * kern_dtype_size(full.dtype);
    w.cols = cols;
    w.ld = full.cols;
    return w;
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

static void report(const char *op, const char *shape, double err, double tol) {
    int ok = err <= tol;
    g_cases++;
    if (!ok) g_fail++;
    printf("%-12s %-52s rel_err=%.3e %s\n", op, shape, err, ok ? "PASS" : "FAIL");
    fflush(stdout);
}

static void report_bool(const char *op, const char *shape, int ok, const char *why) {
    g_cases++;
    if (!ok) g_fail++;
    printf("%-12s %-52s %-17s %s%s%s\n", op, shape, "-", ok ? "PASS" : "FAIL", ok ? "" : ": ", ok ? "" : why);
    fflush(stdout);
}

/* With --emu, a case of more than `limit` units of work is reported as
 * skipped; returns 1 when the caller must not run it. */
static int emu_skip(const char *op, const char *shape, double work, double limit) {
    if (!g_emu || work <= limit) return 0;
    g_skipped++;
    printf("%-12s %-52s skipped (--emu: too large to emulate)\n", op, shape);
    fflush(stdout);
    return 1;
}

/* ---- backend helpers (everything through the op table) ---- */

#define BK_TRY(b, call)                                                                                                \
    do {                                                                                                               \
        if ((call) != 0) {                                                                                             \
            fprintf(stderr, "[%s] %s failed: %s\n", (b)->ops->name, #call, kern_last_error((b)->be));                  \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

static size_t es(const bk *b) {
    return kern_dtype_size(b->ops->act_dtype);
}
static void *at(const bk *b, void *base, size_t elems) {
    return (char *)base + elems * es(b);
}

/* An activation buffer of `cap_rows` rows holding `rows` rows of host data
 * (rest zero): upload the data as a weight and gather it with ids 0..rows-1. */
static void *act_from_host(bk *b, const float *data, int rows, int cols, int cap_rows) {
    kern_weight host = {data, KERN_F32, rows, cols, 0}, dev = {0};
    int32_t *ids = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *ids);
    void *buf = b->ops->alloc(b->be, (size_t)cap_rows * cols * es(b));
    if (!ids || !buf) {
        fprintf(stderr, "[%s] alloc failed: %s\n", b->ops->name, kern_last_error(b->be));
        goto fail;
    }
    for (int i = 0; i < rows; i++)
        ids[i] = i;
    if (rows > 0) {
        BK_TRY(b, b->ops->upload_weight(b->be, &host, &dev));
        BK_TRY(b, b->ops->embedding(b->be, buf, &dev, ids, rows));
        b->ops->free_weight(b->be, &dev);
    }
    free(ids);
    return buf;
fail:
    if (dev.data) b->ops->free_weight(b->be, &dev);
    if (buf) b->ops->free(b->be, buf);
    free(ids);
    return NULL;
}

static float *to_host(bk *b, const void *src, size_t n) {
    float *h = malloc(n * sizeof *h + 4);
    if (!h) return NULL;
    if (b->ops->to_host_f32(b->be, h, src, n) != 0) {
        fprintf(stderr, "[%s] to_host_f32 failed: %s\n", b->ops->name, kern_last_error(b->be));
        free(h);
        return NULL;
    }
    return h;
}

static void release(bk *b, void *p) {
    if (p) b->ops->free(b->be, p);
}

/* Run `fn` on both backends, compare the host results. */
typedef float *(*case_fn)(bk *b, void *arg, size_t *n);

static void compare(const char *op, const char *shape, case_fn fn, void *arg, double tol) {
    size_t nc = 0, ng = 0;
    float *rc = fn(&g_cpu, arg, &nc);
    float *rg = fn(&g_gpu, arg, &ng);
    if (!rc || !rg || nc != ng) {
        report_bool(op, shape, 0, !rc ? "cpu run failed" : !rg ? "cuda run failed" : "size mismatch");
    } else {
        report(op, shape, rel_err(rg, rc, nc), tol);
    }
    free(rc);
    free(rg);
}

/* ---- cases ---- */

typedef struct emb_case {
    kern_weight table;
    const int32_t *ids;
    int n;
} emb_case;

static float *run_embedding(bk *b, void *arg, size_t *n) {
    emb_case *c = arg;
    kern_weight dev = {0};
    void *out = NULL;
    float *h = NULL;
    BK_TRY(b, b->ops->upload_weight(b->be, &c->table, &dev));
    out = b->ops->alloc(b->be, (size_t)c->n * c->table.cols * es(b));
    if (!out) goto fail;
    BK_TRY(b, b->ops->embedding(b->be, out, &dev, c->ids, c->n));
    *n = (size_t)c->n * c->table.cols;
    h = to_host(b, out, *n);
fail:
    release(b, out);
    if (dev.data) b->ops->free_weight(b->be, &dev);
    return h;
}

typedef struct norm_case {
    const float *x;
    kern_weight w;
    int rows, dim, in_place;
} norm_case;

static float *run_rmsnorm(bk *b, void *arg, size_t *n) {
    norm_case *c = arg;
    kern_weight dev = {0};
    void *in = NULL, *out = NULL;
    float *h = NULL;
    BK_TRY(b, b->ops->upload_weight(b->be, &c->w, &dev));
    if (!(in = act_from_host(b, c->x, c->rows, c->dim, c->rows))) goto fail;
    if (c->in_place) {
        out = in;
        in = NULL;
    } else if (!(out = b->ops->alloc(b->be, (size_t)c->rows * c->dim * es(b)))) {
        goto fail;
    }
    BK_TRY(b, b->ops->rmsnorm(b->be, out, in ? in : out, &dev, c->rows, c->dim, 1e-6f));
    *n = (size_t)c->rows * c->dim;
    h = to_host(b, out, *n);
fail:
    release(b, in);
    release(b, out);
    if (dev.data) b->ops->free_weight(b->be, &dev);
    return h;
}

typedef struct mm_case {
    const float *x;
    kern_weight w;
    int n;
    int misalign; /* place in/out one element past an aligned address */
} mm_case;

static float *run_matmul(bk *b, void *arg, size_t *n) {
    mm_case *c = arg;
    kern_weight dev = {0};
    void *in = NULL, *out = NULL;
    float *h = NULL;
    int R = (int)c->w.rows, C = (int)c->w.cols, off = c->misalign ? 1 : 0;
    BK_TRY(b, b->ops->upload_weight(b->be, &c->w, &dev));
    if (off) {
        /* input row data starts at element 1 of the buffer: shift by one element */
        float *shifted = calloc((size_t)c->n * C + 1, sizeof *shifted);
        if (!shifted) goto fail;
        memcpy(shifted + 1, c->x, (size_t)c->n * C * sizeof *shifted);
        in = act_from_host(b, shifted, 1, c->n * C + 1, 1);
        free(shifted);
    } else {
        in = act_from_host(b, c->x, c->n, C, c->n);
    }
    if (!in || !(out = b->ops->alloc(b->be, ((size_t)c->n * R + 1) * es(b)))) goto fail;
    BK_TRY(b, b->ops->matmul(b->be, at(b, out, (size_t)off), at(b, in, (size_t)off), &dev, c->n));
    *n = (size_t)c->n * R;
    {
        float *all = to_host(b, out, *n + 1);
        if (all) {
            h = malloc(*n * sizeof *h + 4);
            if (h) memcpy(h, all + off, *n * sizeof *h);
            free(all);
        }
    }
fail:
    release(b, in);
    release(b, out);
    if (dev.data) b->ops->free_weight(b->be, &dev);
    return h;
}

typedef struct rope_case {
    const float *x;
    const int32_t *pos;
    int n, heads, hd;
    kern_rope rope;
} rope_case;

static float *run_rope(bk *b, void *arg, size_t *n) {
    rope_case *c = arg;
    void *x = NULL;
    float *h = NULL;
    int dim = c->heads * c->hd;
    if (!(x = act_from_host(b, c->x, c->n, dim, c->n))) goto fail;
    BK_TRY(b, b->ops->rope(b->be, x, c->pos, c->n, c->heads, c->hd, &c->rope));
    *n = (size_t)c->n * dim;
    h = to_host(b, x, *n);
fail:
    release(b, x);
    return h;
}

/* A batch over a paged KV cache of n_blocks * bs rows. Sequence s has
 * history positions 0 .. pos0[s]-1 and, when it is in `mask`, n[s] new rows
 * at positions pos0[s] .. pos0[s]+n[s]-1 (else it joins the batch with no
 * rows). k, v hold each sequence's pos0[s]+n[s] positions, sequence after
 * sequence; q holds every sequence's n[s] rows, sequence after sequence. */
typedef struct att_case {
    int hq, hkv, hd, bs, n_blocks, n_seqs, max_blocks;
    const int32_t *n, *pos0, *table; /* table: (n_seqs, max_blocks) */
    const float *q, *k, *v;
    const float *junk_k, *junk_v; /* (n_blocks*bs, hkv*hd): what the cache held before */
    unsigned mask;
    kern_kv_dtype dt; /* the cache's type; KERN_KV_NATIVE: each backend's own (junk_k/v then fill it) */
} att_case;

/* A cache buffer of `bytes` (rounded up to 4) holding garbage: floats in
 * [-8, 8) from a generator of its own (the other cases' streams stay as
 * they are), whose bytes read as any cache type's. */
static void *junk_cache(bk *b, size_t bytes, uint64_t seed) {
    size_t n = (bytes + 3) / 4 * 4 / es(b);
    float *h = malloc(n * sizeof *h + 4);
    if (!h) return NULL;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        h[i] = 16.0f * (float)(x >> 40) / 16777216.0f - 8.0f;
    }
    void *d = act_from_host(b, h, 1, (int)n, 1);
    free(h);
    return d;
}

/* The `bytes` (a multiple of 4) of a backend buffer as they are: through
 * to_host_f32, whose widening of bf16 (cuda) or copy of fp32 (cpu) keeps
 * every bit. */
static int raw_to_host(bk *b, const void *dev, size_t bytes, uint8_t *out) {
    size_t n = bytes / es(b);
    float *h = to_host(b, dev, n);
    if (!h) return -1;
    if (es(b) == 4) {
        memcpy(out, h, bytes);
    } else {
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &h[i], 4);
            out[2 * i] = (uint8_t)(u >> 16);
            out[2 * i + 1] = (uint8_t)(u >> 24);
        }
    }
    free(h);
    return 0;
}

/* Like model/decoder.c's attention: the history reaches the cache through one kv_store,
 * the batch's new rows through another, then one attention call. */
static float *run_attention(bk *b, void *arg, size_t *nout) {
    att_case *c = arg;
    void *q = NULL, *kc = NULL, *vc = NULL, *hk = NULL, *hv = NULL, *nk = NULL, *nv = NULL, *out = NULL;
    float *h = NULL, *hkh = NULL, *hvh = NULL, *nkh = NULL, *nvh = NULL, *qh = NULL;
    int32_t *hslots = NULL, *nslots = NULL, *q_start = NULL;
    int kvd = c->hkv * c->hd, qd = c->hq * c->hd, S = c->n_seqs;
    int nh = 0, nq = 0;
    for (int s = 0; s < S; s++) {
        nh += c->pos0[s];
        if (c->mask >> s & 1) nq += c->n[s];
    }
    hkh = malloc(((size_t)nh * kvd + 1) * sizeof *hkh);
    hvh = malloc(((size_t)nh * kvd + 1) * sizeof *hvh);
    nkh = malloc(((size_t)nq * kvd + 1) * sizeof *nkh);
    nvh = malloc(((size_t)nq * kvd + 1) * sizeof *nvh);
    qh = malloc(((size_t)nq * qd + 1) * sizeof *qh);
    hslots = malloc(((size_t)nh + 1) * sizeof *hslots);
    nslots = malloc(((size_t)nq + 1) * sizeof *nslots);
    q_start = malloc(((size_t)S + 1) * sizeof *q_start);
    if (!hkh || !hvh || !nkh || !nvh || !qh || !hslots || !nslots || !q_start) goto fail;
    {
        int ih = 0, in = 0;
        size_t kvoff = 0, qoff = 0; /* rows of c->k/v and c->q before sequence s */
        for (int s = 0; s < S; s++) {
            const int32_t *bt = c->table + (size_t)s * c->max_blocks;
            int inb = c->mask >> s & 1;
            q_start[s] = in;
            for (int p = 0; p < c->pos0[s] + (inb ? c->n[s] : 0); p++) {
                int32_t slot = bt[p / c->bs] * c->bs + p % c->bs;
                int hist = p < c->pos0[s];
                float *dk = hist ? hkh + (size_t)ih * kvd : nkh + (size_t)in * kvd;
                float *dv = hist ? hvh + (size_t)ih * kvd : nvh + (size_t)in * kvd;
                memcpy(dk, c->k + (kvoff + p) * kvd, (size_t)kvd * sizeof *dk);
                memcpy(dv, c->v + (kvoff + p) * kvd, (size_t)kvd * sizeof *dv);
                if (hist) {
                    hslots[ih++] = slot;
                } else {
                    memcpy(qh + (size_t)in * qd, c->q + (qoff + p - c->pos0[s]) * qd, (size_t)qd * sizeof *qh);
                    nslots[in++] = slot;
                }
            }
            kvoff += (size_t)c->pos0[s] + c->n[s];
            qoff += (size_t)c->n[s];
        }
        q_start[S] = in;
    }
    int cache_rows = c->n_blocks * c->bs;
    const kern_kv_dtype dt = kern_kv_resolve(b->ops, c->dt);
    if (c->dt == KERN_KV_NATIVE) {
        if (!(kc = act_from_host(b, c->junk_k, cache_rows, kvd, cache_rows)) ||
            !(vc = act_from_host(b, c->junk_v, cache_rows, kvd, cache_rows)))
            goto fail;
    } else {
        size_t bytes = (size_t)cache_rows * kern_kv_row_bytes(dt, c->hkv, c->hd);
        if (!(kc = junk_cache(b, bytes, 1)) || !(vc = junk_cache(b, bytes, 2))) goto fail;
    }
    if (!(hk = act_from_host(b, hkh, nh, kvd, nh + 1)) || !(hv = act_from_host(b, hvh, nh, kvd, nh + 1)) ||
        !(nk = act_from_host(b, nkh, nq, kvd, nq + 1)) || !(nv = act_from_host(b, nvh, nq, kvd, nq + 1)) ||
        !(q = act_from_host(b, qh, nq, qd, nq + 1)))
        goto fail;
    if (!(out = b->ops->alloc(b->be, ((size_t)nq + 1) * qd * es(b)))) goto fail;
    BK_TRY(b, b->ops->kv_store(b->be, kc, vc, hk, hv, hslots, nh, c->hkv, c->hd, dt));
    BK_TRY(b, b->ops->kv_store(b->be, kc, vc, nk, nv, nslots, nq, c->hkv, c->hd, dt));
    kern_attn_batch ab = {S, q_start, c->pos0, c->table, c->max_blocks, c->bs};
    BK_TRY(b, b->ops->attention(b->be, out, q, kc, vc, &ab, c->hq, c->hkv, c->hd, 1.0f / sqrtf((float)c->hd), dt));
    *nout = (size_t)nq * qd;
    h = to_host(b, out, *nout);
fail:
    release(b, q);
    release(b, kc);
    release(b, vc);
    release(b, hk);
    release(b, hv);
    release(b, nk);
    release(b, nv);
    release(b, out);
    free(hkh);
    free(hvh);
    free(nkh);
    free(nvh);
    free(qh);
    free(hslots);
    free(nslots);
    free(q_start);
    return h;
}

typedef struct ew_case {
    const float *a, *b;
    int rows, cols;
    int kind; /* 0 silu_mul, 1 silu_mul in place, 2 add */
} ew_case;

static float *run_elementwise(bk *b, void *arg, size_t *n) {
    ew_case *c = arg;
    void *x = NULL, *y = NULL, *out = NULL;
    float *h = NULL;
    size_t cnt = (size_t)c->rows * c->cols;
    if (!(x = act_from_host(b, c->a, c->rows, c->cols, c->rows)) ||
        !(y = act_from_host(b, c->b, c->rows, c->cols, c->rows)))
        goto fail;
    if (c->kind == 0) {
        if (!(out = b->ops->alloc(b->be, cnt * es(b)))) goto fail;
        BK_TRY(b, b->ops->silu_mul(b->be, out, x, y, cnt));
    } else if (c->kind == 1) {
        BK_TRY(b, b->ops->silu_mul(b->be, x, x, y, cnt));
    } else {
        BK_TRY(b, b->ops->add(b->be, x, y, cnt));
    }
    *n = cnt;
    h = to_host(b, out ? out : x, cnt);
fail:
    release(b, x);
    release(b, y);
    release(b, out);
    return h;
}

typedef struct bias_case {
    const float *x; /* (rows, dim) */
    kern_weight b;  /* (1, dim) */
    int rows, dim;
} bias_case;

static float *run_add_bias(bk *b, void *arg, size_t *n) {
    bias_case *c = arg;
    kern_weight dev = {0};
    void *x = NULL;
    float *h = NULL;
    BK_TRY(b, b->ops->upload_weight(b->be, &c->b, &dev));
    if (!(x = act_from_host(b, c->x, c->rows, c->dim, c->rows))) goto fail;
    BK_TRY(b, b->ops->add_bias(b->be, x, &dev, c->rows, c->dim));
    *n = (size_t)c->rows * c->dim;
    h = to_host(b, x, *n);
fail:
    release(b, x);
    if (dev.data) b->ops->free_weight(b->be, &dev);
    return h;
}

typedef struct copy_case {
    const float *src; /* (rows, cols) */
    int rows, cols, dst_row, overlap;
} copy_case;

/* copy rows into a bigger buffer at a row offset; with `overlap`, then
 * move the block by one row inside that buffer (memmove semantics). */
static float *run_copy(bk *b, void *arg, size_t *n) {
    copy_case *c = arg;
    void *src = NULL, *dst = NULL;
    float *h = NULL;
    int cap = c->dst_row + c->rows + 2;
    size_t row = (size_t)c->cols;
    if (!(src = act_from_host(b, c->src, c->rows, c->cols, c->rows))) goto fail;
    if (!(dst = b->ops->alloc(b->be, (size_t)cap * row * es(b)))) goto fail;
    BK_TRY(b, b->ops->copy(b->be, at(b, dst, c->dst_row * row), src, (size_t)c->rows * row));
    if (c->overlap)
        BK_TRY(b, b->ops->copy(b->be, at(b, dst, (c->dst_row + 1) * row), at(b, dst, c->dst_row * row),
                               (size_t)c->rows * row));
    *n = (size_t)cap * row;
    h = to_host(b, dst, *n);
fail:
    release(b, src);
    release(b, dst);
    return h;
}

/* ---- the suite ---- */

static void test_alloc(void) {
    size_t n = 12345;
    void *p = g_gpu.ops->alloc(g_gpu.be, n * es(&g_gpu));
    float *h = p ? to_host(&g_gpu, p, n) : NULL;
    int ok = h != NULL;
    for (size_t i = 0; ok && i < n; i++)
        ok = h[i] == 0.0f;
    report_bool("alloc", "12345 zero-initialised", ok, p ? "not zero" : kern_last_error(g_gpu.be));
    free(h);
    release(&g_gpu, p);
}

static void test_embedding(void) {
    const kern_dtype dts[] = {KERN_BF16, KERN_F16, KERN_F32};
    const int shapes[][2] = {{1000, 4096}, {384, 64}};
    const int ns[] = {1, 37};
    char shape[128];
    for (size_t s = 0; s < 2; s++)
        for (size_t d = 0; d < 3; d++)
            for (size_t k = 0; k < 2; k++) {
                void *raw;
                int V = shapes[s][0], H = shapes[s][1], n = ns[k];
                kern_weight t = rand_weight(dts[d], V, H, 1.0f, &raw);
                int32_t *ids = malloc((size_t)n * sizeof *ids);
                for (int i = 0; i < n; i++)
                    ids[i] = i == 0 ? V - 1 : (int32_t)(rnd32() % (uint32_t)V);
                emb_case c = {t, ids, n};
                snprintf(shape, sizeof shape, "table %dx%d %s n=%d", V, H, kern_dtype_name(dts[d]), n);
                /* bf16 tables are gathered exactly; f16/f32 are rounded to bf16 on upload */
                if (!emu_skip("embedding", shape, (double)V * H + (double)n * H, EMU_MAX_ELEMS))
                    compare("embedding", shape, run_embedding, &c, dts[d] == KERN_BF16 ? 0.0 : TOL);
                free(ids);
                free(raw);
            }
    /* strided views: the upload must gather exactly the slice's columns
     * (the F16 one converts in two chunks of whole rows) */
    struct {
        int V, H, ld, c0;
        kern_dtype dt;
    } views[] = {
        {384, 64, 128, 64, KERN_BF16},      {384, 64, 128, 64, KERN_F16},       {384, 64, 128, 0, KERN_F32},
        {1000, 4096, 5000, 904, KERN_BF16}, {8200, 2048, 4096, 2048, KERN_F16},
    };
    for (size_t i = 0; i < sizeof views / sizeof *views; i++) {
        void *raw;
        int V = views[i].V, n = 37;
        kern_weight full = rand_weight(views[i].dt, V, views[i].ld, 1.0f, &raw);
        kern_weight t = col_view(full, views[i].c0, views[i].H);
        int32_t ids[37];
        for (int j = 0; j < n; j++)
            ids[j] = j == 0 ? V - 1 : j == 1 ? V / 2 : j == 2 ? 0 : (int32_t)(rnd32() % (uint32_t)V);
        emb_case c = {t, ids, n};
        snprintf(shape, sizeof shape, "table %dx%d of ld %d at col %d %s n=%d", V, views[i].H, views[i].ld, views[i].c0,
                 kern_dtype_name(views[i].dt), n);
        if (!emu_skip("embedding", shape, (double)V * views[i].ld, EMU_MAX_ELEMS))
            compare("embedding", shape, run_embedding, &c, views[i].dt == KERN_BF16 ? 0.0 : TOL);
        free(raw);
    }
    /* an out-of-range id fails with a message, on both */
    void *raw;
    kern_weight t = rand_weight(KERN_BF16, 10, 8, 1.0f, &raw);
    int32_t bad[2] = {3, 10};
    int ok = 1;
    bk *bs[2] = {&g_cpu, &g_gpu};
    for (int i = 0; i < 2; i++) {
        kern_weight dev = {0};
        void *out = bs[i]->ops->alloc(bs[i]->be, 64 * es(bs[i]));
        if (bs[i]->ops->upload_weight(bs[i]->be, &t, &dev) != 0 || !out) {
            ok = 0;
        } else {
            int rc = bs[i]->ops->embedding(bs[i]->be, out, &dev, bad, 2);
            ok &= rc == -1 && strstr(kern_last_error(bs[i]->be), "out of range") != NULL;
        }
        if (dev.data) bs[i]->ops->free_weight(bs[i]->be, &dev);
        release(bs[i], out);
    }
    report_bool("embedding", "id 10 of 10 rows -> error", ok, "no error or wrong message");
    free(raw);
}

static void test_rmsnorm(void) {
    struct {
        int rows_per_tok, dim, in_place;
        kern_dtype wdt;
    } cases[] = {
        {1, 4096, 0, KERN_BF16}, {1, 4096, 1, KERN_F32}, {32, 128, 1, KERN_BF16}, /* q_norm per head */
        {8, 128, 1, KERN_F16},   {1, 64, 0, KERN_BF16},  {4, 16, 1, KERN_BF16},   /* fixture */
        {1, 1000, 0, KERN_BF16},
    };
    const int ns[] = {1, 37};
    char shape[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int k = 0; k < 2; k++) {
            int rows = cases[i].rows_per_tok * ns[k], dim = cases[i].dim;
            void *raw;
            kern_weight w = rand_weight(cases[i].wdt, 1, dim, 1.5f, &raw);
            float *x = rand_f32((size_t)rows * dim, 3.0f);
            norm_case c = {x, w, rows, dim, cases[i].in_place};
            snprintf(shape, sizeof shape, "(%d, %d) w %s%s", rows, dim, kern_dtype_name(cases[i].wdt),
                     cases[i].in_place ? " in place" : "");
            if (!emu_skip("rmsnorm", shape, (double)rows * dim, EMU_MAX_ELEMS))
                compare("rmsnorm", shape, run_rmsnorm, &c, TOL);
            free(x);
            free(raw);
        }
}

static void test_matmul(void) {
    struct {
        int R, C;
        kern_dtype wdt;
        int misalign;
        int ld, c0; /* ld > 0: the weight is columns [c0, c0+C) of a (R, ld) matrix */
    } cases[] = {
        {1024, 4096, KERN_BF16, 0, 0, 0}, /* k/v proj (8 kv heads x 128) of a 4096 model */
        {4096, 1024, KERN_BF16, 0, 0, 0}, /* down-proj-like: long k */
        {1000, 200, KERN_BF16, 0, 0, 0},  /* odd sizes */
        {512, 256, KERN_F32, 0, 0, 0},
        {512, 256, KERN_F16, 0, 0, 0},
        {384, 64, KERN_BF16, 0, 0, 0},  /* fixture lm_head */
        {128, 64, KERN_BF16, 0, 0, 0},  /* fixture gate/up */
        {64, 128, KERN_BF16, 0, 0, 0},  /* fixture down */
        {300, 100, KERN_BF16, 1, 0, 0}, /* 2-byte aligned in/out */
        /* strided views: the column slices of row-parallel layers */
        {4096, 1024, KERN_BF16, 0, 4096, 2048}, /* o_proj of a 4096 model, rank 2 of tp 4 */
        {1024, 768, KERN_F32, 0, 3072, 768},    /* down_proj slice, converted on upload */
        {64, 64, KERN_F16, 0, 128, 64},         /* fixture down_proj, rank 1 of tp 2 */
        {300, 100, KERN_BF16, 1, 333, 7},       /* odd stride and offset, misaligned in/out */
        {512, 256, KERN_F32, 0, 256, 0},        /* ld == cols given explicitly */
    };
    const int ns[] = {1, 37};
    char shape[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int k = 0; k < 2; k++) {
            int R = cases[i].R, C = cases[i].C, n = ns[k], ld = cases[i].ld;
            void *raw;
            kern_weight w = rand_weight(cases[i].wdt, R, ld ? ld : C, 0.5f, &raw);
            if (ld) w = col_view(w, cases[i].c0, C);
            float *x = rand_f32((size_t)n * C, 1.0f);
            mm_case c = {x, w, n, cases[i].misalign};
            int off = snprintf(shape, sizeof shape, "n=%d w=(%d, %d) %s%s", n, R, C, kern_dtype_name(cases[i].wdt),
                               cases[i].misalign ? " misaligned" : "");
            if (ld) snprintf(shape + off, sizeof shape - (size_t)off, " ld=%d c0=%d", ld, cases[i].c0);
            if (!emu_skip("matmul", shape, (double)n * R * C + (double)R * (ld ? ld : C), EMU_MAX_MACS))
                compare("matmul", shape, run_matmul, &c, TOL);
            free(x);
            free(raw);
        }
    /* aliasing is rejected on both */
    int ok = 1;
    bk *bs[2] = {&g_cpu, &g_gpu};
    void *raw;
    kern_weight w = rand_weight(KERN_BF16, 8, 8, 1.0f, &raw);
    for (int i = 0; i < 2; i++) {
        kern_weight dev = {0};
        void *buf = bs[i]->ops->alloc(bs[i]->be, 64 * es(bs[i]));
        if (!buf || bs[i]->ops->upload_weight(bs[i]->be, &w, &dev) != 0)
            ok = 0;
        else
            ok &= bs[i]->ops->matmul(bs[i]->be, buf, buf, &dev, 1) == -1;
        if (dev.data) bs[i]->ops->free_weight(bs[i]->be, &dev);
        release(bs[i], buf);
    }
    report_bool("matmul", "out == in -> error", ok, "aliasing accepted");
    free(raw);
}

/* Llama 3.1's rope scaling (Llama-3.1-8B's parameters), and the
 * llama-rope-scaled fixture's, whose short original context puts its
 * 16-wide heads in all three regimes. */
#define ROPE_L3(th, old)                                                                                               \
    {                                                                                                                  \
        .theta = (th), .type = KERN_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,             \
        .original_max_position_embeddings = (old)                                                                      \
    }
#define ROPE_L31 ROPE_L3(5e5, 8192)
#define ROPE_L3_FIX ROPE_L3(1e4, 32)
/* YaRN: Qwen3's (factor 4 over 32,768; attention factor 0.1 ln 4 + 1) and
 * the qwen3-yarn fixture's (original context 32, so the ramp is inside
 * head_dim 32's frequencies) */
#define ROPE_YARN(th, old)                                                                                             \
    {                                                                                                                  \
        .theta = (th), .type = KERN_ROPE_YARN, .factor = 4, .original_max_position_embeddings = (old),                 \
        .beta_fast = 32, .beta_slow = 1, .attention_factor = 1.1386294361119891, .truncate = 1                         \
    }
#define ROPE_YARN_Q3 ROPE_YARN(1e6, 32768)
#define ROPE_YARN_FIX ROPE_YARN(1e4, 32)
/* plain RoPE for the checks that are not about frequencies */
static const kern_rope ROPE_1E4 = {.theta = 1e4};

static void test_rope(void) {
    struct {
        int n, pos0, heads, hd;
        kern_rope rope;
    } cases[] = {
        {1, 0, 32, 128, {.theta = 1e6}},    {37, 0, 32, 128, {.theta = 1e6}},   {1, 1000, 8, 128, {.theta = 1e6}},
        {37, 1000, 8, 128, {.theta = 1e6}}, {5, 30000, 4, 128, {.theta = 1e6}}, {37, 5, 4, 16, {.theta = 1e4}},
        {1, 40, 2, 16, {.theta = 1e4}},     {3, 7, 3, 80, {.theta = 1e4}},      {37, 0, 8, 128, ROPE_L31},
        {5, 30000, 4, 128, ROPE_L31},       {37, 20, 4, 16, ROPE_L3_FIX},       {5, 100000, 4, 128, ROPE_YARN_Q3},
        {37, 20, 4, 32, ROPE_YARN_FIX},
    };
    char shape[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int n = cases[i].n, dim = cases[i].heads * cases[i].hd;
        float *x = rand_f32((size_t)n * dim, 2.0f);
        int32_t *pos = malloc((size_t)n * sizeof *pos);
        for (int t = 0; t < n; t++)
            pos[t] = cases[i].pos0 + t;
        rope_case c = {x, pos, n, cases[i].heads, cases[i].hd, cases[i].rope};
        snprintf(shape, sizeof shape, "n=%d pos0=%d heads=%d hd=%d theta=%g%s", n, cases[i].pos0, cases[i].heads,
                 cases[i].hd, cases[i].rope.theta,
                 cases[i].rope.type == KERN_ROPE_LLAMA3 ? " llama3" : cases[i].rope.type == KERN_ROPE_YARN ? " yarn" : "");
        if (!emu_skip("rope", shape, (double)n * dim, EMU_MAX_ELEMS)) compare("rope", shape, run_rope, &c, TOL);
        free(x);
        free(pos);
    }
}

/* Host integer arrays (positions, ids, tables) reach the device through the
 * backend's staging: pinned buffers copied asynchronously. Many ops in a row
 * with different arrays and no synchronisation between them must each read
 * their own values, so a staging buffer is reused only after its copy ran.
 * `calls` rope calls on separate buffers, positions call*7 + t, issued back
 * to back once every buffer exists; the outputs, call after call. */
typedef struct stage_case {
    const float *x; /* calls * n rows of heads*hd */
    int calls, n, heads, hd;
} stage_case;

static float *run_stage_ring(bk *b, void *arg, size_t *nout) {
    stage_case *c = arg;
    int dim = c->heads * c->hd;
    size_t per = (size_t)c->n * dim;
    void **x = calloc((size_t)c->calls, sizeof *x);
    int32_t *pos = malloc((size_t)c->calls * c->n * sizeof *pos);
    float *h = NULL;
    if (!x || !pos) goto fail;
    for (int i = 0; i < c->calls; i++)
        if (!(x[i] = act_from_host(b, c->x + (size_t)i * per, c->n, dim, c->n))) goto fail;
    for (int i = 0; i < c->calls; i++) {
        int32_t *p = pos + (size_t)i * c->n;
        for (int t = 0; t < c->n; t++)
            p[t] = i * 7 + t;
        BK_TRY(b, b->ops->rope(b->be, x[i], p, c->n, c->heads, c->hd, &ROPE_1E4));
    }
    if (!(h = malloc((size_t)c->calls * per * sizeof *h))) goto fail;
    for (int i = 0; i < c->calls; i++) {
        float *part = to_host(b, x[i], per);
        if (!part) {
            free(h);
            h = NULL;
            goto fail;
        }
        memcpy(h + (size_t)i * per, part, per * sizeof *part);
        free(part);
    }
    *nout = (size_t)c->calls * per;
fail:
    for (int i = 0; x && i < c->calls; i++)
        release(b, x[i]);
    free(x);
    free(pos);
    return h;
}

static void test_stage_ring(void) {
    stage_case c = {NULL, 24, 3, 2, 16};
    float *x = rand_f32((size_t)c.calls * c.n * c.heads * c.hd, 2.0f);
    c.x = x;
    compare("staging", "24 rope calls, own positions each, no sync between", run_stage_ring, &c, TOL);
    free(x);
}

/* A graph replayed back to back: each launch uploads the step's staged
 * arrays into the graph's arena, so the next step may rewrite the arena's
 * host side only once that upload ran. `steps` launches of one captured
 * rope step, in place, with new positions each and no synchronisation
 * between, against the same ropes run eagerly on cpu. */
static void test_graph_restage(void) {
    const char *shape = "4 launches of a rope step, new positions, no sync";
    if (!g_gpu.ops->graph_begin) {
        g_skipped++;
        printf("%-12s %-52s skipped (no graphs on the %s backend)\n", "graph", shape, g_gpu.ops->name);
        return;
    }
    enum { N = 3, HEADS = 2, HD = 16, STEPS = 4 };
    float *x0 = rand_f32((size_t)N * HEADS * HD, 2.0f);
    void *xc = act_from_host(&g_cpu, x0, N, HEADS * HD, N), *xg = act_from_host(&g_gpu, x0, N, HEADS * HD, N);
    int replays = 0, ok = xc && xg;
    for (int step = 0; ok && step < STEPS; step++) {
        int32_t pos[N];
        for (int t = 0; t < N; t++)
            pos[t] = step * 5 + t;
        int rep = 0;
        ok = g_cpu.ops->rope(g_cpu.be, xc, pos, N, HEADS, HD, &ROPE_1E4) == 0;
        ok = ok && g_gpu.ops->graph_begin(g_gpu.be, 0x67726170ull, &rep) == 0;
        if (!ok) break;
        replays += rep;
        if (g_gpu.ops->rope(g_gpu.be, xg, pos, N, HEADS, HD, &ROPE_1E4) != 0) {
            g_gpu.ops->graph_abort(g_gpu.be);
            ok = 0;
            break;
        }
        ok = g_gpu.ops->graph_end(g_gpu.be) == 0 && g_gpu.ops->graph_launch(g_gpu.be) == 0;
    }
    float *hc = ok ? to_host(&g_cpu, xc, (size_t)N * HEADS * HD) : NULL;
    float *hg = ok ? to_host(&g_gpu, xg, (size_t)N * HEADS * HD) : NULL;
    if (!hc || !hg)
        report_bool("graph", shape, 0, kern_last_error(g_gpu.be));
    else
        report("graph", shape, rel_err(hg, hc, (size_t)N * HEADS * HD), TOL);
    char why[64];
    snprintf(why, sizeof why, "%d of %d steps replayed", replays, STEPS - 1);
    report_bool("graph", "every step after the first is a replay", replays == STEPS - 1, why);
    g_gpu.ops->graph_drop_all(g_gpu.be);
    free(hc);
    free(hg);
    release(&g_cpu, xc);
    release(&g_gpu, xg);
    free(x0);
}

#define ATT_MAX_SEQS 8

typedef struct att_spec {
    int hq, hkv, hd, bs, n_seqs;
    int n[ATT_MAX_SEQS], pos0[ATT_MAX_SEQS];
    int n_blocks;     /* with explicit tables; else 3 spare blocks beyond those used */
    int blocks[4][4]; /* the explicit tables */
    int explicit_tables;
    int checks; /* ATT_INV: each sequence alone == in the batch; ATT_PAGED: paged == one block each */
    int extra_blocks; /* table entries beyond the used ones + 2 (a long-capacity table) */
} att_spec;

#define ATT_INV 1
#define ATT_PAGED 2
#define ATT_BOTH (ATT_INV | ATT_PAGED)

static int att_used(const att_spec *t, int s) {
    return (t->pos0[s] + t->n[s] + t->bs - 1) / t->bs;
}

/* Fill an att_case from a spec: tables (explicit or a random permutation of
 * the blocks, padded with -1), random q/k/v and a garbage cache. */
static void att_build(const att_spec *t, att_case *c, int32_t **n, int32_t **pos0, int32_t **table, float **q,
                      float **k, float **v, float **jk, float **jv) {
    int S = t->n_seqs, used_total = 0, max_used = 0, rows_q = 0, rows_kv = 0;
    for (int s = 0; s < S; s++) {
        int u = att_used(t, s);
        used_total += u;
        if (u > max_used) max_used = u;
        rows_q += t->n[s];
        rows_kv += t->pos0[s] + t->n[s];
    }
    int n_blocks = t->explicit_tables ? t->n_blocks : used_total + 3;
    int max_blocks = max_used + 2 + t->extra_blocks; /* trailing -1 entries must never be read */
    *n = malloc((size_t)S * sizeof **n);
    *pos0 = malloc((size_t)S * sizeof **pos0);
    *table = malloc((size_t)S * max_blocks * sizeof **table);
    int *perm = malloc((size_t)n_blocks * sizeof *perm);
    if (!*n || !*pos0 || !*table || !perm) exit(1);
    for (int i = 0; i < n_blocks; i++)
        perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rnd32() % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    int next = 0;
    for (int s = 0; s < S; s++) {
        (*n)[s] = t->n[s];
        (*pos0)[s] = t->pos0[s];
        for (int j = 0; j < max_blocks; j++)
            (*table)[(size_t)s * max_blocks + j] = j >= att_used(t, s)  ? -1
                                                   : t->explicit_tables ? t->blocks[s][j]
                                                                        : perm[next++];
    }
    free(perm);
    int kvd = t->hkv * t->hd, qd = t->hq * t->hd;
    *q = rand_f32((size_t)rows_q * qd + 1, 2.0f);
    *k = rand_f32((size_t)rows_kv * kvd + 1, 2.0f);
    *v = rand_f32((size_t)rows_kv * kvd + 1, 1.0f);
    *jk = rand_f32((size_t)n_blocks * t->bs * kvd, 8.0f);
    *jv = rand_f32((size_t)n_blocks * t->bs * kvd, 8.0f);
    *c = (att_case){t->hq, t->hkv, t->hd, t->bs, n_blocks, S, max_blocks, *n, *pos0, *table, *q, *k, *v, *jk, *jv, ~0u,
                    KERN_KV_NATIVE};
}

/* One spec (number i of its list, for the messages) over a cache of type
 * dt (KERN_KV_NATIVE: each backend's own): cuda against the cpu op, then
 * the spec's batch-invariance and paging checks on cuda. */
static void att_check(const att_spec *t, size_t i, kern_kv_dtype dt) {
    char shape[160];
    char tag[16] = "";
    if (dt != KERN_KV_NATIVE) snprintf(tag, sizeof tag, "%s ", kern_kv_dtype_name(dt));
    att_case c;
    int32_t *n, *pos0, *table;
    float *q, *k, *v, *jk, *jv;
    int off = dt == KERN_KV_NATIVE ? 0 : snprintf(shape, sizeof shape, "%s ", kern_kv_dtype_name(dt));
    off += snprintf(shape + off, sizeof shape - (size_t)off, "hq=%d hkv=%d hd=%d bs=%d (n,pos0)=", t->hq, t->hkv, t->hd,
                    t->bs);
    for (int s = 0; s < t->n_seqs && off < (int)sizeof shape; s++)
        off += snprintf(shape + off, sizeof shape - (size_t)off, "%s%d,%d", s ? " " : "", t->n[s], t->pos0[s]);
    double work = 0; /* heads x the keys each row sees */
    for (int s = 0; s < t->n_seqs; s++)
        work += (double)t->hq * t->n[s] * (t->pos0[s] + t->n[s]);
    if (emu_skip("attention", shape, work, EMU_MAX_ATT)) return; /* and its batch/paging checks */
    att_build(t, &c, &n, &pos0, &table, &q, &k, &v, &jk, &jv);
    c.dt = dt;
    compare("attention", shape, run_attention, &c, TOL);
    /* batch invariance: each sequence alone gives the bits it gets in the batch */
    if (t->n_seqs > 1 && (t->checks & ATT_INV)) {
        size_t nfull = 0, row0 = 0, qd = (size_t)t->hq * t->hd;
        float *full = run_attention(&g_gpu, &c, &nfull);
        int ok = full != NULL;
        for (int s = 0; ok && s < t->n_seqs; s++) {
            if (t->n[s] > 0) {
                att_case one = c;
                one.mask = 1u << s;
                size_t n1 = 0;
                float *r = run_attention(&g_gpu, &one, &n1);
                ok = r && n1 == (size_t)t->n[s] * qd && memcmp(r, full + row0 * qd, n1 * sizeof *r) == 0;
                free(r);
            }
            row0 += (size_t)t->n[s];
        }
        free(full);
        snprintf(shape, sizeof shape, "%scase %zu: each sequence alone == in the batch", tag, i);
        report_bool("attention", shape, ok, "results depend on the batch");
    }
    /* the paging is only addressing: one block per sequence gives the same bits (a block of the
     * table's whole capacity, since the decode split is cut from the capacity) */
    if (t->checks & ATT_PAGED) {
        att_case flat = c;
        int S = t->n_seqs, maxlen = c.max_blocks * c.bs;
        int32_t *ftab = malloc((size_t)S * sizeof *ftab);
        float *fk = rand_f32((size_t)S * maxlen * t->hkv * t->hd, 8.0f);
        float *fv = rand_f32((size_t)S * maxlen * t->hkv * t->hd, 8.0f);
        for (int s = 0; s < S; s++)
            ftab[s] = S - 1 - s;
        flat.bs = maxlen;
        flat.n_blocks = S;
        flat.max_blocks = 1;
        flat.table = ftab;
        flat.junk_k = fk;
        flat.junk_v = fv;
        size_t n1 = 0, n2 = 0;
        float *paged = run_attention(&g_gpu, &c, &n1), *contig = run_attention(&g_gpu, &flat, &n2);
        int ok = paged && contig && n1 == n2 && memcmp(paged, contig, n1 * sizeof *paged) == 0;
        snprintf(shape, sizeof shape, "%scase %zu: paged == one block per sequence", tag, i);
        report_bool("attention", shape, ok, "the result depends on the block layout");
        free(paged);
        free(contig);
        free(ftab);
        free(fk);
        free(fv);
    }
    free(n);
    free(pos0);
    free(table);
    free(q);
    free(k);
    free(v);
    free(jk);
    free(jv);
}

static void test_attention(void) {
    const att_spec specs[] = {
        /* GQA 4:1, the interleaved tables of the brief: seq 0 on 3,0,5 (crossing a block inside its rows),
         * seq 1 on 1,4, seq 2 on 6; block 2 holds garbage */
        {32, 8, 128, 16, 3, {5, 4, 1}, {30, 20, 0}, 7, {{3, 0, 5}, {1, 4}, {6}}, 1, ATT_BOTH, 0},
        /* block size 4, a seq with no rows */
        {32, 8, 128, 4, 4, {37, 1, 5, 0}, {0, 100, 17, 5}, 0, {{0}}, 0, ATT_BOTH, 0},
        /* decode batch, long contexts */
        {32, 8, 128, 16, 4, {1, 1, 1, 1}, {700, 1000, 0, 15}, 0, {{0}}, 0, ATT_BOTH, 0},
        {32, 8, 128, 16, 1, {37}, {100}, 0, {{0}}, 0, 0, 0},         /* one prefill chunk */
        {8, 1, 128, 4, 3, {7, 2, 1}, {3, 9, 0}, 0, {{0}}, 0, 0, 0},  /* MQA */
        {4, 1, 256, 16, 2, {3, 1}, {10, 40}, 0, {{0}}, 0, 0, 0},     /* MQA, widest head */
        {4, 2, 16, 16, 2, {37, 5}, {0, 3}, 0, {{0}}, 0, 0, 0},       /* fixture */
        {4, 2, 16, 4, 3, {1, 12, 3}, {37, 0, 3}, 0, {{0}}, 0, 0, 0}, /* fixture, block size 4 */
        {8, 8, 64, 4, 1, {7}, {20}, 0, {{0}}, 0, 0, 0},              /* MHA */
        {4, 2, 80, 16, 2, {2, 3}, {5, 0}, 0, {{0}}, 0, 0, 0},        /* head_dim not a multiple of 32 */
        /* The cuda fast paths (hd 64/128): chunks of >= 16 rows on the tiled tensor-core kernel (tiles of 64
         * rows, K/V tiles of 64 keys), other rows on the decode kernel, split over blocks by the table's
         * capacity (max_blocks * block_size >= 512 keys) and combined. Every boundary against the cpu twin: */
        /* Qwen3-8B prefill chunk at pos0 0 (4 full tiles + 44 rows), then after 1000 positions of history */
        {32, 8, 128, 16, 1, {300}, {0}, 0, {{0}}, 0, ATT_PAGED, 0},
        {32, 8, 128, 32, 1, {300}, {1000}, 0, {{0}}, 0, ATT_PAGED, 0},
        {16, 2, 64, 16, 1, {300}, {1000}, 0, {{0}}, 0, 0, 0}, /* hd 64, GQA 8 */
        /* GQA 8, hd 128: tiles of 64 + 2 rows, and 64 + 1 rows starting one short of a key tile edge */
        {32, 4, 128, 32, 2, {130, 65}, {0, 63}, 0, {{0}}, 0, ATT_INV, 0},
        {8, 8, 128, 32, 2, {100, 16}, {37, 5}, 0, {{0}}, 0, 0, 0}, /* MHA; 16 rows: the smallest tiled chunk */
        {8, 8, 64, 16, 1, {77}, {64}, 0, {{0}}, 0, 0, 0},          /* MHA hd 64, a chunk starting on a tile edge */
        /* decode batches of 8 sequences, contexts 1 .. 8192 (split-K, short rows with empty splits) */
        {32, 8, 128, 16, 8, {1, 1, 1, 1, 1, 1, 1, 1}, {0, 1, 255, 511, 1000, 2047, 4096, 8191}, 0, {{0}}, 0, ATT_INV, 0},
        {16, 2, 64, 32, 8, {1, 1, 1, 1, 1, 1, 1, 1}, {8191, 4095, 3000, 1023, 512, 63, 2, 0}, 0, {{0}}, 0, ATT_INV, 0},
        {8, 8, 128, 16, 8, {1, 1, 1, 1, 1, 1, 1, 1}, {5000, 3, 700, 1, 2500, 0, 6000, 100}, 0, {{0}}, 0, 0, 0}, /* MHA */
        /* mixed: decodes, prefill chunks (77, 130, exactly 16 rows), short chunks of 5 and 15 rows (decode
         * path, long rows split), a sequence with no rows */
        {32, 8, 128, 16, 8, {1, 77, 1, 130, 5, 0, 16, 15}, {3000, 0, 0, 500, 2000, 40, 16, 600}, 0, {{0}}, 0, ATT_BOTH, 0},
        /* head_dim 80: the simple kernel for every shape, a chunk and a long row included */
        {8, 2, 80, 16, 2, {40, 1}, {10, 1500}, 0, {{0}}, 0, 0, 0},
        /* short rows in a long-capacity table: the decode split is cut from the capacity (max_blocks *
         * block_size), so most splits of the short rows are empty partials the combine skips */
        {32, 8, 128, 16, 4, {1, 1, 1, 1}, {0, 5, 300, 2000}, 0, {{0}}, 0, ATT_BOTH, 600},
        {16, 2, 64, 32, 3, {1, 1, 3}, {3, 700, 64}, 0, {{0}}, 0, ATT_BOTH, 300},
        /* emu-sized (few heads, within EMU_MAX_ATT) versions of the fast paths: tiled prefill at hd 128 (20
         * and exactly 16 rows) and hd 64 (70 rows: two tiles, crossing a key tile), split-K decode of hd 128
         * in 3 splits plus the combine, decode of hd 64 with empty splits, and a mixed batch */
        {4, 2, 128, 16, 2, {20, 16}, {5, 40}, 0, {{0}}, 0, ATT_BOTH, 0},
        {2, 2, 64, 16, 1, {70}, {10}, 0, {{0}}, 0, ATT_PAGED, 0},
        {4, 1, 128, 16, 3, {1, 1, 2}, {600, 5, 900}, 0, {{0}}, 0, ATT_BOTH, 0},
        {8, 2, 64, 32, 3, {1, 1, 3}, {3, 700, 64}, 0, {{0}}, 0, ATT_BOTH, 300},
        {4, 1, 128, 16, 3, {1, 17, 0}, {300, 3, 5}, 0, {{0}}, 0, ATT_BOTH, 0},
    };
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
        att_check(&specs[i], i, KERN_KV_NATIVE);

    /* bad batches fail with the cpu twin's messages, on both */
    bk *bs[2] = {&g_cpu, &g_gpu};
    int ok_heads = 1, ok_beyond = 1, ok_slot = 1;
    for (int i = 0; i < 2; i++) {
        bk *b = bs[i];
        void *buf = b->ops->alloc(b->be, 4096 * es(b)), *kc = b->ops->alloc(b->be, 4096 * es(b));
        if (!buf || !kc) {
            ok_heads = ok_beyond = ok_slot = 0;
        } else {
            int32_t q_start[2] = {0, 3}, pos0[1] = {6}, table[2] = {0, 1}, slots[2] = {1, -1};
            kern_attn_batch ab = {1, q_start, pos0, table, 2, 4}; /* positions 6..8 of 2 blocks of 4 */
            int rc = b->ops->attention(b->be, buf, buf, kc, kc, &ab, 6, 4, 16, 0.25f, kern_kv_resolve(b->ops, KERN_KV_NATIVE));
            ok_heads &= rc == -1 && strstr(kern_last_error(b->be), "not a multiple") != NULL;
            rc = b->ops->attention(b->be, buf, buf, kc, kc, &ab, 4, 2, 16, 0.25f, kern_kv_resolve(b->ops, KERN_KV_NATIVE));
            ok_beyond &= rc == -1 && strstr(kern_last_error(b->be), "beyond its 2 blocks") != NULL;
            rc = b->ops->kv_store(b->be, kc, kc, buf, buf, slots, 2, 2, 16, kern_kv_resolve(b->ops, KERN_KV_NATIVE));
            ok_slot &= rc == -1 && strstr(kern_last_error(b->be), "negative cache slot -1") != NULL;
        }
        release(b, buf);
        release(b, kc);
    }
    report_bool("attention", "hq 6, hkv 4 -> error", ok_heads, "no error or wrong message");
    report_bool("attention", "position 8 of 2 blocks of 4 -> error", ok_beyond, "no error or wrong message");
    report_bool("kv_store", "slot -1 -> error", ok_slot, "no error or wrong message");
}

/* ---- the KV cache types (kern_kv_dtype, kernels/kv.h) ---- */

/* kv_store of every type writes kern_kv_store_ref's bytes, on both
 * backends: n rows of k, v to scattered slots of a garbage cache, every
 * other byte of the cache untouched. The rows hold bf16 values (what cuda
 * stores: the reference widens them exactly) with the awkward ones: fp16
 * overflow and subnormals, an all-zero head (q8_0 scale 0), a one-channel
 * outlier (what the q8_0 key rotation spreads), negative zero. */
static void test_kv_store_types(void) {
    static const struct {
        int n, hkv, hd;
    } shapes[] = {{5, 2, 64}, {3, 3, 128}, {4, 1, 32}, {2, 2, 256}, {2, 1, 512}, {3, 2, 80}, {2, 3, 16}};
    static const kern_kv_dtype types[] = {KERN_KV_F32, KERN_KV_BF16, KERN_KV_F16, KERN_KV_Q8_0};
    bk *bks[2] = {&g_cpu, &g_gpu};
    char shape[96];
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int n = shapes[si].n, hkv = shapes[si].hkv, hd = shapes[si].hd, kvd = hkv * hd, rows = 3 * n + 2;
        float *x[2];
        for (int kv = 0; kv < 2; kv++) {
            x[kv] = rand_f32((size_t)n * kvd, 3.0f);
            for (int j = 0; j < hd; j++) {
                x[kv][j] = 0.0f;                                           /* row 0, head 0: all zero */
                x[kv][(size_t)kvd * (n - 1) + j] = bf16r(frand(1e-6f));     /* last row: fp16 subnormals */
            }
            if (n > 2) {
                x[kv][kvd + 1] = bf16r(70000.0f); /* row 1: beyond fp16's range, an outlier channel */
                x[kv][kvd + 2] = -0.0f;
                x[kv][2 * kvd + hd - 1] = -300.0f;
            }
        }
        int32_t *slots = malloc((size_t)n * sizeof *slots);
        if (!slots) exit(1);
        for (int i = 0; i < n; i++)
            slots[i] = (3 * i + 2 * (int)si + 1) % rows; /* distinct, out of order */
        for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
            const kern_kv_dtype dt = types[ti];
            if (kern_kv_invalid(dt, hd)) continue;
            const size_t rb = kern_kv_row_bytes(dt, hkv, hd), hb = kern_kv_head_bytes(dt, hd);
            const size_t bytes = ((size_t)rows * rb + 3) / 4 * 4;
            for (int bi = 0; bi < 2; bi++) {
                bk *b = bks[bi];
                void *kc = NULL, *vc = NULL, *k = NULL, *v = NULL;
                uint8_t *before = malloc(2 * bytes), *after = malloc(2 * bytes), *want = malloc(2 * bytes);
                int ok = before && after && want;
                ok = ok && (kc = junk_cache(b, bytes, 3 + si)) && (vc = junk_cache(b, bytes, 4 + si)) &&
                     (k = act_from_host(b, x[0], n, kvd, n)) && (v = act_from_host(b, x[1], n, kvd, n));
                ok = ok && !raw_to_host(b, kc, bytes, before) && !raw_to_host(b, vc, bytes, before + bytes);
                if (ok && b->ops->kv_store(b->be, kc, vc, k, v, slots, n, hkv, hd, dt) != 0) {
                    fprintf(stderr, "[%s] kv_store %s failed: %s\n", b->ops->name, kern_kv_dtype_name(dt),
                            kern_last_error(b->be));
                    ok = 0;
                }
                ok = ok && !raw_to_host(b, kc, bytes, after) && !raw_to_host(b, vc, bytes, after + bytes);
                size_t bad = 0, first = 0;
                if (ok) {
                    memcpy(want, before, 2 * bytes);
                    for (int kv = 0; kv < 2; kv++)
                        for (int i = 0; i < n; i++)
                            for (int h = 0; h < hkv; h++)
                                kern_kv_store_ref(dt, kv == 0, x[kv] + (size_t)i * kvd + (size_t)h * hd, hd,
                                                  want + (size_t)kv * bytes + (size_t)slots[i] * rb + (size_t)h * hb);
                    for (size_t j = 0; j < 2 * bytes; j++)
                        if (after[j] != want[j] && !bad++) first = j;
                }
                snprintf(shape, sizeof shape, "[%s] %s n=%d hkv=%d hd=%d", b->ops->name, kern_kv_dtype_name(dt), n,
                         hkv, hd);
                char why[96];
                snprintf(why, sizeof why, "%zu bytes differ from kern_kv_store_ref, first at %zu", bad, first);
                report_bool("kv_store", shape, ok && !bad, ok ? why : "run failed");
                release(b, kc);
                release(b, vc);
                release(b, k);
                release(b, v);
                free(before);
                free(after);
                free(want);
            }
        }
        free(slots);
        free(x[0]);
        free(x[1]);
    }
}

/* Attention over each cache type: cuda against the cpu op on the same type
 * (which is, bit for bit, the fp32 attention over kern_kv_load_ref's values
 * and, for q8_0, the rotated queries: tests/unit/test_kvcache.c), within
 * the bf16 tolerance, on every cuda path: the tiled prefill (hd 64, 128),
 * split-K decode with the combine (GQA groups of 1, 2 and 4 heads per
 * block, empty splits), mixed batches, the simple kernel (hd 32, 80, 256,
 * block size 4), GQA, explicit interleaved tables; the batch-invariance and
 * paging checks on the fast paths. Emu-sized throughout. */
static void test_attention_types(void) {
    const att_spec specs[] = {
        {4, 2, 128, 16, 3, {5, 4, 1}, {30, 20, 0}, 7, {{3, 0, 5}, {1, 4}, {6}}, 1, 0, 0}, /* explicit tables */
        {4, 2, 128, 16, 2, {20, 16}, {5, 40}, 0, {{0}}, 0, ATT_BOTH, 0},                   /* prefill hd 128 */
        {2, 2, 64, 16, 1, {70}, {10}, 0, {{0}}, 0, ATT_PAGED, 0},                          /* prefill hd 64 */
        {4, 1, 128, 16, 3, {1, 1, 2}, {600, 5, 900}, 0, {{0}}, 0, ATT_BOTH, 0},            /* split-K, 4 heads */
        {8, 2, 64, 32, 3, {1, 1, 3}, {3, 700, 64}, 0, {{0}}, 0, ATT_INV, 300},             /* empty splits */
        {4, 2, 128, 16, 2, {1, 1}, {40, 300}, 0, {{0}}, 0, 0, 0},                          /* 2 heads per block */
        {2, 2, 64, 16, 2, {1, 1}, {100, 30}, 0, {{0}}, 0, 0, 0},                           /* MHA decode */
        {4, 1, 128, 16, 3, {1, 17, 0}, {300, 3, 5}, 0, {{0}}, 0, ATT_BOTH, 0},             /* mixed */
        {4, 1, 256, 16, 2, {3, 1}, {10, 40}, 0, {{0}}, 0, 0, 0},                           /* simple, hd 256 */
        {4, 2, 32, 4, 2, {5, 1}, {7, 20}, 0, {{0}}, 0, 0, 0},                              /* simple, hd 32 */
        {4, 2, 80, 16, 2, {2, 3}, {5, 0}, 0, {{0}}, 0, 0, 0},                              /* simple, hd 80 */
    };
    static const kern_kv_dtype types[] = {KERN_KV_F32, KERN_KV_BF16, KERN_KV_F16, KERN_KV_Q8_0};
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
            if (!kern_kv_invalid(types[ti], specs[i].hd)) att_check(&specs[i], i, types[ti]);

    /* a type that cannot hold the heads, and an unresolved type, fail with a message on both */
    bk *bks[2] = {&g_cpu, &g_gpu};
    int ok_q8 = 1, ok_att = 1;
    for (int i = 0; i < 2; i++) {
        bk *b = bks[i];
        void *buf = b->ops->alloc(b->be, 4096 * es(b)), *kc = b->ops->alloc(b->be, 4096 * es(b));
        if (!buf || !kc) {
            ok_q8 = ok_att = 0;
        } else {
            int32_t q_start[2] = {0, 1}, pos0[1] = {0}, table[1] = {0}, slots[1] = {0};
            kern_attn_batch ab = {1, q_start, pos0, table, 1, 4};
            int rc = b->ops->kv_store(b->be, kc, kc, buf, buf, slots, 1, 1, 48, KERN_KV_Q8_0);
            ok_q8 &= rc == -1 && strstr(kern_last_error(b->be), "power of two") != NULL;
            rc = b->ops->attention(b->be, buf, buf, kc, kc, &ab, 2, 1, 48, 0.25f, KERN_KV_Q8_0);
            ok_att &= rc == -1 && strstr(kern_last_error(b->be), "power of two") != NULL;
        }
        release(b, buf);
        release(b, kc);
    }
    report_bool("kv_store", "q8_0 head_dim 48 -> error", ok_q8, "no error or wrong message");
    report_bool("attention", "q8_0 head_dim 48 -> error", ok_att, "no error or wrong message");
}

/* ---- attention timing (--bench: printed, not asserted) ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds per attention call on `b`: n_seqs sequences of n rows at
 * positions pos0.., each on its own run of blocks of 16, over zero-filled
 * buffers (the values do not change the work). -1 on failure. */
static double att_time(bk *b, int n_seqs, int n, int pos0, int hq, int hkv, int hd, int reps) {
    const int bs = 16, nb = (pos0 + n + bs - 1) / bs;
    size_t rows = (size_t)n_seqs * n, cache_rows = (size_t)n_seqs * nb * bs;
    int32_t *q_start = malloc(((size_t)n_seqs + 1) * sizeof *q_start), *p0 = malloc((size_t)n_seqs * sizeof *p0);
    int32_t *table = malloc((size_t)n_seqs * nb * sizeof *table);
    void *q = b->ops->alloc(b->be, rows * hq * hd * es(b)), *out = b->ops->alloc(b->be, rows * hq * hd * es(b));
    void *kc = b->ops->alloc(b->be, cache_rows * hkv * hd * es(b)),
         *vc = b->ops->alloc(b->be, cache_rows * hkv * hd * es(b));
    double t = -1;
    float one;
    if (!q_start || !p0 || !table || !q || !out || !kc || !vc) {
        fprintf(stderr, "[%s] bench allocation failed: %s\n", b->ops->name, kern_last_error(b->be));
        goto fail;
    }
    for (int s = 0; s <= n_seqs; s++)
        q_start[s] = s * n;
    for (int s = 0; s < n_seqs; s++) {
        p0[s] = pos0;
        for (int j = 0; j < nb; j++)
            table[(size_t)s * nb + j] = s * nb + j;
    }
    kern_attn_batch ab = {n_seqs, q_start, p0, table, nb, bs};
    const float scale = 1.0f / sqrtf((float)hd);
    /* warm-up (first-call setup), then reps calls back to back; to_host_f32 synchronises */
    BK_TRY(b, b->ops->attention(b->be, out, q, kc, vc, &ab, hq, hkv, hd, scale, kern_kv_resolve(b->ops, KERN_KV_NATIVE)));
    BK_TRY(b, b->ops->to_host_f32(b->be, &one, out, 1));
    double t0 = now_s();
    for (int r = 0; r < reps; r++)
        BK_TRY(b, b->ops->attention(b->be, out, q, kc, vc, &ab, hq, hkv, hd, scale, kern_kv_resolve(b->ops, KERN_KV_NATIVE)));
    BK_TRY(b, b->ops->to_host_f32(b->be, &one, out, 1));
    t = (now_s() - t0) / reps;
fail:
    release(b, q);
    release(b, out);
    release(b, kc);
    release(b, vc);
    free(q_start);
    free(p0);
    free(table);
    return t;
}

static void bench_attention(int small) {
    bk *b = &g_gpu;
    const int hq = 32, hkv = 8, hd = 128;
    const int pf[2] = {small ? 256 : 2048, small ? 512 : 8192};
    for (int i = 0; i < 2; i++) {
        int n = pf[i];
        double t = att_time(b, 1, n, 0, hq, hkv, hd, small ? 1 : n > 4096 ? 5 : 20);
        double flops = 4.0 * n * n * hd * hq / 2; /* causal: half of q·kᵀ and p·v */
        if (t > 0)
            printf("bench attention [%s] prefill %d tokens, hq %d hkv %d hd %d: %9.3f ms %8.2f TFLOP/s\n", b->ops->name,
                   n, hq, hkv, hd, t * 1e3, flops / t * 1e-12);
        else
            printf("bench attention [%s] prefill %d tokens: failed\n", b->ops->name, n);
    }
    int seqs = small ? 8 : 64, ctx = small ? 512 : 4096;
    double t = att_time(b, seqs, 1, ctx - 1, hq, hkv, hd, small ? 1 : 20);
    double bytes = 2.0 * seqs * ctx * hkv * hd * es(b); /* K and V of every position, read once */
    if (t > 0)
        printf("bench attention [%s] decode %d seqs x %d positions, hq %d hkv %d hd %d: %9.3f ms %8.1f GB/s (K/V)\n",
               b->ops->name, seqs, ctx, hq, hkv, hd, t * 1e3, bytes / t * 1e-9);
    else
        printf("bench attention [%s] decode %d seqs x %d positions: failed\n", b->ops->name, seqs, ctx);
    fflush(stdout);
}

/* Qwen2's q/k/v bias: one row (decode), many rows, an odd width. */
static void test_add_bias(void) {
    const int rows[] = {1, 37, 5}, dims[] = {1024, 256, 33};
    char shape[128];
    for (int k = 0; k < 3; k++) {
        float *x = rand_f32((size_t)rows[k] * dims[k], 4.0f), *bv = rand_f32((size_t)dims[k], 1.0f);
        bias_case c = {x, {bv, KERN_F32, 1, dims[k], 0}, rows[k], dims[k]};
        snprintf(shape, sizeof shape, "(%d, %d)", rows[k], dims[k]);
        if (!emu_skip("add_bias", shape, (double)rows[k] * dims[k], EMU_MAX_ELEMS))
            compare("add_bias", shape, run_add_bias, &c, TOL);
        free(x);
        free(bv);
    }
}

static void test_elementwise(void) {
    const int ns[] = {1, 37};
    char shape[128];
    for (int k = 0; k < 2; k++)
        for (int kind = 0; kind < 3; kind++) {
            int rows = ns[k], cols = kind == 2 ? 4096 : 3072;
            float *a = rand_f32((size_t)rows * cols, 6.0f), *b = rand_f32((size_t)rows * cols, 2.0f);
            ew_case c = {a, b, rows, cols, kind};
            snprintf(shape, sizeof shape, "(%d, %d)%s", rows, cols, kind == 1 ? " in place" : "");
            if (!emu_skip(kind == 2 ? "add" : "silu_mul", shape, (double)rows * cols, EMU_MAX_ELEMS))
                compare(kind == 2 ? "add" : "silu_mul", shape, run_elementwise, &c, TOL);
            free(a);
            free(b);
        }
}

static void test_copy(void) {
    struct {
        int rows, cols, dst_row, overlap;
    } cases[] = {{1, 1024, 100, 0}, {37, 1024, 0, 0}, {37, 1024, 13, 1}, {5, 32, 3, 0}};
    char shape[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        float *src = rand_f32((size_t)cases[i].rows * cases[i].cols, 1.0f);
        copy_case c = {src, cases[i].rows, cases[i].cols, cases[i].dst_row, cases[i].overlap};
        snprintf(shape, sizeof shape, "(%d, %d) at row %d%s", cases[i].rows, cases[i].cols, cases[i].dst_row,
                 cases[i].overlap ? " + overlapping move" : "");
        if (!emu_skip("copy", shape, (double)cases[i].rows * cases[i].cols, EMU_MAX_ELEMS))
            compare("copy", shape, run_copy, &c, 0.0);
        free(src);
    }
}

/* ---- fused ops: each against the cpu twin, and against the unfused ops on
 * the backend under test (the definition the fused op must keep) ---- */

/* `cnt` values of host data as an activation buffer, starting `off`
 * elements into it (off = 1: 2-byte aligned rows on cuda). */
static void *act_flat(bk *b, const float *data, size_t cnt, size_t off) {
    float *shifted = calloc(cnt + off + 1, sizeof *shifted);
    if (!shifted) return NULL;
    memcpy(shifted + off, data, cnt * sizeof *shifted);
    void *p = act_from_host(b, shifted, 1, (int)(cnt + off), 1);
    free(shifted);
    return p;
}

typedef struct addnorm_case {
    const float *x, *y; /* (rows, dim) */
    kern_weight w;
    int rows, dim;
    int misalign; /* x, y and out one element past an aligned address: the element path */
    int unfused;  /* add() then rmsnorm() in place of add_rmsnorm() */
} addnorm_case;

/* x after the call, then out: 2 * rows * dim values. */
static float *run_add_rmsnorm(bk *b, void *arg, size_t *n) {
    addnorm_case *c = arg;
    kern_weight dev = {0};
    void *x = NULL, *y = NULL, *out = NULL;
    float *h = NULL, *hx = NULL, *ho = NULL;
    size_t cnt = (size_t)c->rows * c->dim, off = c->misalign ? 1 : 0;
    BK_TRY(b, b->ops->upload_weight(b->be, &c->w, &dev));
    if (!(x = act_flat(b, c->x, cnt, off)) || !(y = act_flat(b, c->y, cnt, off)) ||
        !(out = b->ops->alloc(b->be, (cnt + off + 1) * es(b))))
        goto fail;
    if (c->unfused) {
        BK_TRY(b, b->ops->add(b->be, at(b, x, off), at(b, y, off), cnt));
        BK_TRY(b, b->ops->rmsnorm(b->be, at(b, out, off), at(b, x, off), &dev, c->rows, c->dim, 1e-6f));
    } else {
        BK_TRY(b, b->ops->add_rmsnorm(b->be, at(b, x, off), at(b, y, off), at(b, out, off), &dev, c->rows, c->dim,
                                      1e-6f));
    }
    if (!(hx = to_host(b, x, cnt + off)) || !(ho = to_host(b, out, cnt + off))) goto fail;
    if (!(h = malloc(2 * cnt * sizeof *h + 4))) goto fail;
    memcpy(h, hx + off, cnt * sizeof *h);
    memcpy(h + cnt, ho + off, cnt * sizeof *h);
    *n = 2 * cnt;
fail:
    free(hx);
    free(ho);
    release(b, x);
    release(b, y);
    release(b, out);
    if (dev.data) b->ops->free_weight(b->be, &dev);
    return h;
}

static void test_add_rmsnorm(void) {
    struct {
        int rows, dim, misalign;
        kern_dtype wdt;
    } cases[] = {
        {1, 4096, 0, KERN_BF16},  {37, 4096, 0, KERN_BF16}, /* hidden 4096: 16-byte vectors */
        {37, 4096, 1, KERN_F32},  {1, 4096, 1, KERN_BF16},  /* the same rows 2-byte aligned: element path */
        {5, 1000, 0, KERN_BF16},  {37, 1000, 0, KERN_F16},  /* dim % 8 != 0: element path */
        {3, 4100, 0, KERN_BF16},                            /* dim % 4 == 0 but not % 8 */
        {37, 64, 0, KERN_BF16},   {4, 8, 0, KERN_BF16},     /* fixture hidden; one vector per row */
        {2, 12, 0, KERN_BF16},    {1, 5120, 0, KERN_BF16},  /* tiny; more vectors than threads */
        {7, 2056, 0, KERN_BF16},                            /* 257 vectors: a ragged last pass */
    };
    char shape[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rows = cases[i].rows, dim = cases[i].dim;
        size_t cnt = (size_t)rows * dim;
        void *raw;
        kern_weight w = rand_weight(cases[i].wdt, 1, dim, 1.5f, &raw);
        float *x = rand_f32(cnt, 6.0f), *y = rand_f32(cnt, 2.0f);
        addnorm_case c = {x, y, w, rows, dim, cases[i].misalign, 0};
        snprintf(shape, sizeof shape, "(%d, %d) w %s%s: x, out", rows, dim, kern_dtype_name(cases[i].wdt),
                 cases[i].misalign ? " misaligned" : "");
        if (emu_skip("add_rmsnorm", shape, (double)cnt, EMU_MAX_ELEMS)) { /* and its unfused checks */
            free(x);
            free(y);
            free(raw);
            continue;
        }
        compare("add_rmsnorm", shape, run_add_rmsnorm, &c, TOL);
        /* == add() then rmsnorm() on the same backend: x bit for bit; out
         * up to the fp32 order of the sum of squares, which can move inv
         * across a bf16 rounding boundary for a few elements (~1e-5) */
        addnorm_case u = c;
        u.unfused = 1;
        size_t nf = 0, nu = 0;
        float *rf = run_add_rmsnorm(&g_gpu, &c, &nf), *ru = run_add_rmsnorm(&g_gpu, &u, &nu);
        int ok = rf && ru && nf == nu;
        snprintf(shape, sizeof shape, "(%d, %d)%s: x == add()", rows, dim, cases[i].misalign ? " misaligned" : "");
        report_bool("add_rmsnorm", shape, ok && memcmp(rf, ru, cnt * sizeof *rf) == 0,
                    ok ? "x differs from add()" : "run failed");
        snprintf(shape, sizeof shape, "(%d, %d)%s: out vs add()+rmsnorm()", rows, dim,
                 cases[i].misalign ? " misaligned" : "");
        report("add_rmsnorm", shape, ok ? rel_err(rf + cnt, ru + cnt, cnt) : INFINITY, 1e-3);
        free(rf);
        free(ru);
        free(x);
        free(y);
        free(raw);
    }
    /* bad calls fail with the same messages on both */
    bk *bs[2] = {&g_cpu, &g_gpu};
    int ok_shape = 1, ok_alias = 1;
    void *raw;
    kern_weight w = rand_weight(KERN_BF16, 1, 64, 1.0f, &raw);
    for (int i = 0; i < 2; i++) {
        bk *b = bs[i];
        kern_weight dev = {0};
        void *x = b->ops->alloc(b->be, 256 * es(b)), *y = b->ops->alloc(b->be, 256 * es(b));
        if (!x || !y || b->ops->upload_weight(b->be, &w, &dev) != 0) {
            ok_shape = ok_alias = 0;
        } else {
            int rc = b->ops->add_rmsnorm(b->be, x, y, at(b, x, 128), &dev, 2, 63, 1e-6f);
            ok_shape &= rc == -1 && strcmp(kern_last_error(b->be), "add_rmsnorm: weight is (1, 64), expected (1, 63)") == 0;
            rc = b->ops->add_rmsnorm(b->be, x, y, y, &dev, 2, 64, 1e-6f);
            ok_alias &= rc == -1 && strstr(kern_last_error(b->be), "must not alias") != NULL;
        }
        if (dev.data) b->ops->free_weight(b->be, &dev);
        release(b, x);
        release(b, y);
    }
    report_bool("add_rmsnorm", "w (1, 64) for dim 63 -> error", ok_shape, "no error or wrong message");
    report_bool("add_rmsnorm", "out == y -> error", ok_alias, "no error or wrong message");
    free(raw);
}

typedef struct qknr_case {
    const float *q, *k; /* (n, hq*hd), (n, hkv*hd) */
    kern_weight qw, kw;
    const int32_t *pos;
    int n, hq, hkv, hd;
    kern_rope rope;
    int unfused; /* rmsnorm() of q and k, then rope() of both */
} qknr_case;

/* q after the call, then k: n * (hq + hkv) * hd values. */
static float *run_qk_norm_rope(bk *b, void *arg, size_t *n) {
    qknr_case *c = arg;
    kern_weight dq = {0}, dk = {0};
    void *q = NULL, *k = NULL;
    float *h = NULL, *hq = NULL, *hk = NULL;
    size_t nq = (size_t)c->n * c->hq * c->hd, nk = (size_t)c->n * c->hkv * c->hd;
    const float eps = 1e-6f;
    BK_TRY(b, b->ops->upload_weight(b->be, &c->qw, &dq));
    BK_TRY(b, b->ops->upload_weight(b->be, &c->kw, &dk));
    if (!(q = act_from_host(b, c->q, c->n, c->hq * c->hd, c->n)) ||
        !(k = act_from_host(b, c->k, c->n, c->hkv * c->hd, c->n)))
        goto fail;
    if (c->unfused) {
        BK_TRY(b, b->ops->rmsnorm(b->be, q, q, &dq, c->n * c->hq, c->hd, eps));
        BK_TRY(b, b->ops->rmsnorm(b->be, k, k, &dk, c->n * c->hkv, c->hd, eps));
        BK_TRY(b, b->ops->rope(b->be, q, c->pos, c->n, c->hq, c->hd, &c->rope));
        BK_TRY(b, b->ops->rope(b->be, k, c->pos, c->n, c->hkv, c->hd, &c->rope));
    } else {
        BK_TRY(b, b->ops->qk_norm_rope(b->be, q, k, &dq, &dk, c->pos, c->n, c->hq, c->hkv, c->hd, eps, &c->rope));
    }
    if (!(hq = to_host(b, q, nq)) || !(hk = to_host(b, k, nk))) goto fail;
    if (!(h = malloc((nq + nk) * sizeof *h + 4))) goto fail;
    memcpy(h, hq, nq * sizeof *h);
    memcpy(h + nq, hk, nk * sizeof *h);
    *n = nq + nk;
fail:
    free(hq);
    free(hk);
    release(b, q);
    release(b, k);
    if (dq.data) b->ops->free_weight(b->be, &dq);
    if (dk.data) b->ops->free_weight(b->be, &dk);
    return h;
}

static void test_qk_norm_rope(void) {
    struct {
        int n, pos0, hq, hkv, hd; /* pos0 < 0: scattered positions (a decode batch) */
        kern_rope rope;
        kern_dtype wdt;
    } cases[] = {
        {1, 0, 32, 8, 128, {.theta = 1e6}, KERN_BF16},
        {37, 0, 32, 8, 128, {.theta = 1e6}, KERN_BF16}, /* Qwen3-8B */
        {37, 1000, 32, 8, 128, {.theta = 1e6}, KERN_F32},
        {5, 30000, 32, 8, 128, {.theta = 1e6}, KERN_BF16},
        {6, -1, 32, 8, 128, {.theta = 1e6}, KERN_BF16},
        {1, 1000, 16, 8, 64, {.theta = 1e6}, KERN_BF16}, /* 16/8 heads of 64 */
        {37, 5, 16, 8, 64, {.theta = 1e6}, KERN_F16},
        {8, 0, 4, 1, 256, {.theta = 1e6}, KERN_BF16}, /* MQA, widest head */
        {37, 5, 4, 2, 16, {.theta = 1e4}, KERN_BF16},
        {3, 7, 3, 1, 80, {.theta = 1e4}, KERN_BF16}, /* fixture; half 40 */
        {4, 100, 8, 8, 64, {.theta = 1e4}, KERN_BF16},
        {2, 3, 5, 1, 2, {.theta = 1e4}, KERN_BF16}, /* MHA; hd 2 */
        {6, -1, 32, 8, 128, ROPE_L31, KERN_BF16},
        {37, 20, 4, 2, 16, ROPE_L3_FIX, KERN_BF16}, /* llama3 */
        {6, -1, 32, 8, 128, ROPE_YARN_Q3, KERN_BF16}, /* Qwen3-8B with YaRN */
        {37, 20, 4, 2, 32, ROPE_YARN_FIX, KERN_BF16},
    };
    char shape[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int n = cases[i].n, hq = cases[i].hq, hkv = cases[i].hkv, hd = cases[i].hd;
        void *rq, *rk;
        kern_weight qw = rand_weight(cases[i].wdt, 1, hd, 1.5f, &rq), kw = rand_weight(cases[i].wdt, 1, hd, 1.5f, &rk);
        float *q = rand_f32((size_t)n * hq * hd, 3.0f), *k = rand_f32((size_t)n * hkv * hd, 3.0f);
        int32_t *pos = malloc((size_t)n * sizeof *pos);
        for (int t = 0; t < n; t++)
            pos[t] = cases[i].pos0 >= 0 ? cases[i].pos0 + t : (int32_t)(rnd32() % 40000u);
        qknr_case c = {q, k, qw, kw, pos, n, hq, hkv, hd, cases[i].rope, 0};
        int off = snprintf(shape, sizeof shape, "n=%d ", n);
        off += cases[i].pos0 >= 0 ? snprintf(shape + off, sizeof shape - (size_t)off, "pos0=%d", cases[i].pos0)
                                  : snprintf(shape + off, sizeof shape - (size_t)off, "pos scattered");
        snprintf(shape + off, sizeof shape - (size_t)off, " hq=%d hkv=%d hd=%d %s%s", hq, hkv, hd,
                 kern_dtype_name(cases[i].wdt),
                 cases[i].rope.type == KERN_ROPE_LLAMA3 ? " llama3" : cases[i].rope.type == KERN_ROPE_YARN ? " yarn" : "");
        if (emu_skip("qk_norm_rope", shape, (double)n * (hq + hkv) * hd, EMU_MAX_ELEMS)) { /* and the unfused check */
            free(q);
            free(k);
            free(pos);
            free(rq);
            free(rk);
            continue;
        }
        compare("qk_norm_rope", shape, run_qk_norm_rope, &c, TOL);
        /* against rmsnorm() + rope() on the same backend: equal up to the
         * bf16 rounding the fused op skips between norm and rotation */
        qknr_case u = c;
        u.unfused = 1;
        size_t nf = 0, nu = 0;
        float *rf = run_qk_norm_rope(&g_gpu, &c, &nf), *ru = run_qk_norm_rope(&g_gpu, &u, &nu);
        snprintf(shape + off, sizeof shape - (size_t)off, " hq=%d hkv=%d hd=%d vs unfused", hq, hkv, hd);
        report("qk_norm_rope", shape, rf && ru && nf == nu ? rel_err(rf, ru, nf) : INFINITY, TOL);
        free(rf);
        free(ru);
        free(q);
        free(k);
        free(pos);
        free(rq);
        free(rk);
    }
    /* bad calls fail with the same messages on both */
    bk *bs[2] = {&g_cpu, &g_gpu};
    int ok_odd = 1, ok_w = 1;
    void *r16, *r8;
    kern_weight w16 = rand_weight(KERN_BF16, 1, 16, 1.0f, &r16), w8 = rand_weight(KERN_BF16, 1, 8, 1.0f, &r8);
    int32_t pos[2] = {3, 4};
    for (int i = 0; i < 2; i++) {
        bk *b = bs[i];
        kern_weight d16 = {0}, d8 = {0};
        void *q = b->ops->alloc(b->be, 256 * es(b)), *k = b->ops->alloc(b->be, 256 * es(b));
        if (!q || !k || b->ops->upload_weight(b->be, &w16, &d16) != 0 || b->ops->upload_weight(b->be, &w8, &d8) != 0) {
            ok_odd = ok_w = 0;
        } else {
            int rc = b->ops->qk_norm_rope(b->be, q, k, &d16, &d16, pos, 2, 4, 2, 15, 1e-6f, &ROPE_1E4);
            ok_odd &= rc == -1 && strstr(kern_last_error(b->be), "head_dim 15 is odd") != NULL;
            rc = b->ops->qk_norm_rope(b->be, q, k, &d16, &d8, pos, 2, 4, 2, 16, 1e-6f, &ROPE_1E4);
            ok_w &= rc == -1 &&
                    strcmp(kern_last_error(b->be), "qk_norm_rope: k_norm weight is (1, 8), expected (1, 16)") == 0;
        }
        if (d16.data) b->ops->free_weight(b->be, &d16);
        if (d8.data) b->ops->free_weight(b->be, &d8);
        release(b, q);
        release(b, k);
    }
    report_bool("qk_norm_rope", "head_dim 15 -> error", ok_odd, "no error or wrong message");
    report_bool("qk_norm_rope", "k_norm (1, 8) for hd 16 -> error", ok_w, "no error or wrong message");
    free(r16);
    free(r8);
}

/* logits_topk: both backends reduce the same bf16-representable rows (the
 * cpu twin holds them as fp32, cuda as bf16, equal values), so ids and vals
 * must agree EXACTLY, ties included (both break them by ascending column);
 * lse is fp32-summed on cuda, double on cpu. Rows with inf/nan must give
 * NaN lse on both; a bad k must fail on both. */
static void test_logits_topk(void) {
    struct {
        int rows, vocab, k, kind; /* kind 0: spread, 1: five values (ties), 2: +0/-0 only, 3: non-finite rows */
    } cases[] = {{1, 151936, 64, 0}, {4, 37984, 20, 0}, {3, 1000, 1, 1}, {5, 4096, 64, 1},
                 {2, 50, 50, 0},     {1, 151936, 64, 2}, {2, 4099, 64, 2}, {3, 3000, 8, 3}};
    char shape[128];
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        int rows = cases[ci].rows, vocab = cases[ci].vocab, k = cases[ci].k, kind = cases[ci].kind;
        size_t n = (size_t)rows * vocab, nk = (size_t)rows * k;
        snprintf(shape, sizeof shape, "(%d, %d) k %d %s", rows, vocab, k,
                 kind == 0 ? "spread" : kind == 1 ? "ties" : kind == 2 ? "+0/-0" : "inf/nan rows");
        if (emu_skip("logits_topk", shape, (double)n, EMU_MAX_ELEMS)) continue;
        float *x = rand_f32(n, 12.0f);
        for (size_t i = 0; kind == 1 && i < n; i++) x[i] = (float)(rnd32() % 5) - 2.0f;
        for (size_t i = 0; kind == 2 && i < n; i++) x[i] = (rnd32() & 1) ? 0.0f : -0.0f;
        if (kind == 3) { /* row 0 finite, row 1 one +inf, row 2 one nan */
            x[(size_t)vocab + 17] = INFINITY;
            x[(size_t)2 * vocab + vocab - 1] = NAN;
        }
        bk *bs[2] = {&g_cpu, &g_gpu};
        int32_t *ids[2] = {malloc(nk * sizeof(int32_t)), malloc(nk * sizeof(int32_t))};
        float *vals[2] = {malloc(nk * sizeof(float)), malloc(nk * sizeof(float))};
        float *lse[2] = {malloc((size_t)rows * sizeof(float)), malloc((size_t)rows * sizeof(float))};
        int ok = 1;
        for (int bi = 0; bi < 2; bi++) {
            bk *b = bs[bi];
            void *dx = act_from_host(b, x, rows, vocab, rows);
            if (!dx || !ids[bi] || !vals[bi] || !lse[bi] ||
                b->ops->logits_topk(b->be, dx, rows, vocab, k, ids[bi], vals[bi], lse[bi]) != 0) {
                fprintf(stderr, "[%s] logits_topk failed: %s\n", b->ops->name, kern_last_error(b->be));
                ok = 0;
            }
            release(b, dx);
        }
        double lse_err = 0;
        for (int r = 0; ok && r < rows; r++) {
            int finite = kind != 3 || r == 0;
            if (!finite) {
                ok &= isnan(lse[0][r]) && isnan(lse[1][r]);
                continue; /* ids/vals of such a row are unspecified */
            }
            for (int j = 0; j < k; j++) {
                size_t o = (size_t)r * k + (size_t)j;
                ok &= ids[0][o] == ids[1][o] && vals[0][o] == vals[1][o];
            }
            double d = fabs((double)lse[1][r] - lse[0][r]) / fmax(1.0, fabs(lse[0][r]));
            if (isnan(d) || d > lse_err) lse_err = d; /* a NaN sticks */
        }
        snprintf(shape, sizeof shape, "(%d, %d) k %d %s: ids, vals", rows, vocab, k,
                 kind == 0 ? "spread" : kind == 1 ? "ties" : kind == 2 ? "+0/-0" : "inf/nan rows");
        report_bool("logits_topk", shape, ok, "ids/vals differ from the cpu twin, or a non-finite row's lse not NaN");
        snprintf(shape, sizeof shape, "(%d, %d) k %d: lse |d|/max(1,|lse|)", rows, vocab, k);
        report("logits_topk", shape, ok ? lse_err : INFINITY, 5e-5);
        for (int bi = 0; bi < 2; bi++) {
            free(ids[bi]);
            free(vals[bi]);
            free(lse[bi]);
        }
        free(x);
    }
    /* k outside 1..min(vocab, KERN_TOPK_MAX) fails on both */
    bk *bs[2] = {&g_cpu, &g_gpu};
    int ok_k = 1;
    float x[100];
    for (int i = 0; i < 100; i++) x[i] = (float)i;
    for (int bi = 0; bi < 2; bi++) {
        bk *b = bs[bi];
        int32_t ids[KERN_TOPK_MAX + 1];
        float vals[KERN_TOPK_MAX + 1], lse[1];
        void *dx = act_from_host(b, x, 1, 100, 1);
        ok_k &= dx && b->ops->logits_topk(b->be, dx, 1, 100, KERN_TOPK_MAX + 1, ids, vals, lse) == -1 &&
                strstr(kern_last_error(b->be), "k = 65") != NULL;
        ok_k &= dx && b->ops->logits_topk(b->be, dx, 1, 20, 21, ids, vals, lse) == -1;
        release(b, dx);
    }
    report_bool("logits_topk", "k 65, k > vocab -> error", ok_k, "no error or wrong message");
}

/* ---- fuse_rows ----
 * The fused weight against its parts on the SAME backend: its rows, read
 * back through an identity embedding gather (exact for bf16 weights into
 * bf16 activations, and for any weight into fp32), must equal the parts'
 * rows end to end bit for bit, after the parts were freed. A one-row
 * matmul against it is compared with the parts' matmuls laid end to end
 * within TOL (cuBLASLt may pick another algorithm for another m; the cpu
 * twin is exact). */

/* All rows of a backend weight as host fp32 (NULL on failure). */
static float *weight_rows(bk *b, const kern_weight *w) {
    size_t n = (size_t)w->rows * (size_t)w->cols;
    int32_t *ids = malloc((size_t)w->rows * sizeof *ids);
    void *buf = b->ops->alloc(b->be, n * es(b));
    float *h = NULL;
    if (!ids || !buf) goto fail;
    for (int64_t i = 0; i < w->rows; i++)
        ids[i] = (int32_t)i;
    BK_TRY(b, b->ops->embedding(b->be, buf, w, ids, (int)w->rows));
    h = to_host(b, buf, n);
fail:
    release(b, buf);
    free(ids);
    return h;
}

/* h(1, cols)·wᵀ as host fp32 at out (w->rows values); 0 or -1. */
static int matmul_row(bk *b, const float *h, const kern_weight *w, float *out) {
    int rc = -1;
    void *in = act_from_host(b, h, 1, (int)w->cols, 1), *o = b->ops->alloc(b->be, (size_t)w->rows * es(b));
    float *r = NULL;
    if (!in || !o) goto fail;
    BK_TRY(b, b->ops->matmul(b->be, o, in, w, 1));
    if (!(r = to_host(b, o, (size_t)w->rows))) goto fail;
    memcpy(out, r, (size_t)w->rows * sizeof *out);
    rc = 0;
fail:
    free(r);
    release(b, in);
    release(b, o);
    return rc;
}

static void test_fuse_rows(void) {
    struct {
        int n_parts;
        int64_t rows[3], cols;
        kern_dtype wdt;
        const char *what;
    } cases[] = {
        {3, {64, 32, 32}, 64, KERN_BF16, "fixture q|k|v"},
        {2, {128, 128}, 64, KERN_BF16, "fixture gate|up"},
        {3, {1024, 256, 256}, 4096, KERN_BF16, "8B-like q|k|v, tp 4"},
        {2, {3072, 3072}, 4096, KERN_BF16, "8B-like gate|up, tp 4"},
        {3, {40, 8, 8}, 100, KERN_F32, "f32 parts (bf16 on cuda)"},
        {1, {7}, 33, KERN_F16, "one f16 part"},
    };
    char shape[128];
    bk *b = &g_gpu;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int np = cases[i].n_parts, ok = 0;
        int64_t cols = cases[i].cols, total = 0;
        void *raw[3] = {NULL, NULL, NULL};
        kern_weight dev[3] = {{0}}, fused = {0};
        const kern_weight *parts[3];
        for (int p = 0; p < np; p++) total += cases[i].rows[p];
        snprintf(shape, sizeof shape, "%d parts -> (%lld, %lld) %s: %s", np, (long long)total, (long long)cols,
                 kern_dtype_name(cases[i].wdt), cases[i].what);
        if (emu_skip("fuse_rows", shape, (double)total * cols, EMU_MAX_ELEMS)) continue;
        float *want = malloc((size_t)total * cols * sizeof *want), *want_mm = malloc((size_t)total * sizeof *want_mm);
        float *got = NULL, *got_mm = malloc((size_t)total * sizeof *got_mm), *x = rand_f32((size_t)cols, 1.0f);
        const char *why = "out of memory";
        if (!want || !want_mm || !got_mm) goto done;
        why = "upload or read back failed";
        for (int p = 0, r0 = 0; p < np; p++) {
            kern_weight host = rand_weight(cases[i].wdt, cases[i].rows[p], cols, 0.5f, &raw[p]);
            if (b->ops->upload_weight(b->be, &host, &dev[p])) goto done;
            parts[p] = &dev[p];
            float *rows = weight_rows(b, &dev[p]);
            if (!rows) goto done;
            memcpy(want + (size_t)r0 * cols, rows, (size_t)cases[i].rows[p] * cols * sizeof *want);
            free(rows);
            if (matmul_row(b, x, &dev[p], want_mm + r0)) goto done;
            r0 += (int)cases[i].rows[p];
        }
        why = "fuse_rows failed";
        if (b->ops->fuse_rows(b->be, parts, np, &fused)) {
            fprintf(stderr, "[%s] fuse_rows: %s\n", b->ops->name, kern_last_error(b->be));
            goto done;
        }
        why = "wrong shape";
        if (fused.rows != total || fused.cols != cols || (fused.ld != 0 && fused.ld != cols)) goto done;
        for (int p = 0; p < np; p++) /* the fused copy must not need them */
            b->ops->free_weight(b->be, &dev[p]);
        why = "read back failed";
        if (!(got = weight_rows(b, &fused)) || matmul_row(b, x, &fused, got_mm)) goto done;
        why = "rows differ from the parts'";
        ok = memcmp(got, want, (size_t)total * cols * sizeof *got) == 0;
    done:
        snprintf(shape, sizeof shape, "%d parts -> (%lld, %lld) %s: %s", np, (long long)total, (long long)cols,
                 kern_dtype_name(cases[i].wdt), cases[i].what);
        report_bool("fuse_rows", shape, ok, why);
        if (ok) {
            snprintf(shape, sizeof shape, "n=1 fused (%lld, %lld) vs parts", (long long)total, (long long)cols);
            report("fuse_rows mm", shape, rel_err(got_mm, want_mm, (size_t)total), TOL);
        }
        for (int p = 0; p < np; p++) {
            if (dev[p].data) b->ops->free_weight(b->be, &dev[p]);
            free(raw[p]);
        }
        if (fused.data) b->ops->free_weight(b->be, &fused);
        free(want);
        free(want_mm);
        free(got);
        free(got_mm);
        free(x);
    }
    /* errors: mismatched columns, no parts */
    void *ra, *rb;
    kern_weight ha = rand_weight(KERN_BF16, 4, 16, 0.5f, &ra), hb = rand_weight(KERN_BF16, 4, 12, 0.5f, &rb);
    kern_weight da = {0}, db = {0}, out = {0};
    int ok_cols = 0, ok_none = 0;
    if (b->ops->upload_weight(b->be, &ha, &da) == 0 && b->ops->upload_weight(b->be, &hb, &db) == 0) {
        const kern_weight *mixed[2] = {&da, &db};
        ok_cols = b->ops->fuse_rows(b->be, mixed, 2, &out) == -1 && !out.data &&
                  strstr(kern_last_error(b->be), "part 1 has 12 columns") != NULL;
        ok_none = b->ops->fuse_rows(b->be, mixed, 0, &out) == -1 && !out.data &&
                  strstr(kern_last_error(b->be), "at least one part") != NULL;
    }
    report_bool("fuse_rows", "cols 16 + 12 -> error", ok_cols, "no error or wrong message");
    report_bool("fuse_rows", "0 parts -> error", ok_none, "no error or wrong message");
    if (da.data) b->ops->free_weight(b->be, &da);
    if (db.data) b->ops->free_weight(b->be, &db);
    free(ra);
    free(rb);
}

int main(int argc, char **argv) {
    char err[512];
    int dev = 0, self = 0, bench = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device-index") == 0 && i + 1 < argc) {
            dev = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--self-check") == 0) {
            self = 1;
        } else if (strcmp(argv[i], "--bench") == 0) {
            bench = 1;
        } else if (strcmp(argv[i], "--emu") == 0) {
            g_emu = 1;
        } else {
            fprintf(stderr, "usage: %s [--device-index N] [--self-check] [--bench] [--emu]\n", argv[0]);
            return 2;
        }
    }
    if (kern_backend_create(self ? "cpu" : "cuda", 0, dev, &g_gpu.ops, &g_gpu.be, err, sizeof err) != 0) {
        if (strstr(err, "no usable CUDA device") || strstr(err, "no cuda backend")) {
            printf("no GPU: skipped (%s)\n", err);
            return 77;
        }
        fprintf(stderr, "cuda backend: %s\n", err);
        return 1;
    }
    if (kern_backend_create("cpu", 0, 0, &g_cpu.ops, &g_cpu.be, err, sizeof err) != 0) {
        fprintf(stderr, "cpu backend: %s\n", err);
        kern_backend_destroy(g_gpu.ops, g_gpu.be);
        return 1;
    }
    printf("cuda act_dtype=%s, cpu act_dtype=%s, tolerance %.0e\n", kern_dtype_name(g_gpu.ops->act_dtype),
           kern_dtype_name(g_cpu.ops->act_dtype), TOL);
    test_alloc();
    test_embedding();
    test_rmsnorm();
    test_matmul();
    test_rope();
    test_stage_ring();
    test_graph_restage();
    test_attention();
    test_kv_store_types();
    test_attention_types();
    test_elementwise();
    test_add_bias();
    test_copy();
    test_add_rmsnorm();
    test_qk_norm_rope();
    test_logits_topk();
    test_fuse_rows();
    if (bench) bench_attention(self);
    kern_backend_destroy(g_gpu.ops, g_gpu.be);
    kern_backend_destroy(g_cpu.ops, g_cpu.be);
    if (g_skipped) printf("%d cases skipped (--emu: too large to emulate)\n", g_skipped);
    printf("%d of %d cases passed\n", g_cases - g_fail, g_cases);
    return g_fail ? 1 : 0;
}
