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
 * Shapes cover Qwen3-8B-like attention (GQA 4:1, head_dim 128, n = 1 and
 * n = 37, pos0 = 0 and > 0), odd sizes (head_dim 80, 1000x200 matmul,
 * 2-byte-aligned matmul operands) and the tiny fixture models (hidden 64,
 * head_dim 16). Weights are tested as BF16, F16 and F32 (cuda converts F16
 * and F32 to bf16 on upload).
 *
 * Usage: gpu_test_cuda_ops [--device-index N] [--self-check]
 * --self-check runs the cpu backend in place of cuda (a harness check that
 * needs no GPU: every case must then pass, the exact ones with 0 error).
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

#define TOL 2e-2

typedef struct bk {
    const kern_ops *ops;
    kern_backend *be;
} bk;

static bk g_cpu, g_gpu;
static int g_fail, g_cases;

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
    kern_weight w = {NULL, dt, rows, cols};
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
    kern_weight host = {data, KERN_F32, rows, cols}, dev = {0};
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
    double theta;
} rope_case;

static float *run_rope(bk *b, void *arg, size_t *n) {
    rope_case *c = arg;
    void *x = NULL;
    float *h = NULL;
    int dim = c->heads * c->hd;
    if (!(x = act_from_host(b, c->x, c->n, dim, c->n))) goto fail;
    BK_TRY(b, b->ops->rope(b->be, x, c->pos, c->n, c->heads, c->hd, c->theta));
    *n = (size_t)c->n * dim;
    h = to_host(b, x, *n);
fail:
    release(b, x);
    return h;
}

typedef struct att_case {
    const float *q, *k, *v; /* q: (n, hq*hd); k, v: (pos0+n, hkv*hd) */
    int n, pos0, hq, hkv, hd;
} att_case;

/* The KV cache is built like model/qwen3.c does it: the first pos0 rows
 * are there already, the n new rows arrive through ops->copy at an element
 * offset. */
static float *run_attention(bk *b, void *arg, size_t *n) {
    att_case *c = arg;
    void *q = NULL, *kc = NULL, *vc = NULL, *kn = NULL, *vn = NULL, *out = NULL;
    float *h = NULL;
    int kvd = c->hkv * c->hd, qd = c->hq * c->hd, cap = c->pos0 + c->n + 3;
    size_t old = (size_t)c->pos0 * kvd;
    if (!(q = act_from_host(b, c->q, c->n, qd, c->n))) goto fail;
    if (!(kc = act_from_host(b, c->k, c->pos0, kvd, cap)) || !(vc = act_from_host(b, c->v, c->pos0, kvd, cap)))
        goto fail;
    if (!(kn = act_from_host(b, c->k + old, c->n, kvd, c->n)) || !(vn = act_from_host(b, c->v + old, c->n, kvd, c->n)))
        goto fail;
    BK_TRY(b, b->ops->copy(b->be, at(b, kc, old), kn, (size_t)c->n * kvd));
    BK_TRY(b, b->ops->copy(b->be, at(b, vc, old), vn, (size_t)c->n * kvd));
    if (!(out = b->ops->alloc(b->be, (size_t)c->n * qd * es(b)))) goto fail;
    BK_TRY(b,
           b->ops->attention(b->be, out, q, kc, vc, c->n, c->pos0, c->hq, c->hkv, c->hd, 1.0f / sqrtf((float)c->hd)));
    *n = (size_t)c->n * qd;
    h = to_host(b, out, *n);
fail:
    release(b, q);
    release(b, kc);
    release(b, vc);
    release(b, kn);
    release(b, vn);
    release(b, out);
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
                compare("embedding", shape, run_embedding, &c, dts[d] == KERN_BF16 ? 0.0 : TOL);
                free(ids);
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
    } cases[] = {
        {1024, 4096, KERN_BF16, 0}, /* k/v proj (8 kv heads x 128) of a 4096 model */
        {4096, 1024, KERN_BF16, 0}, /* down-proj-like: long k */
        {1000, 200, KERN_BF16, 0},  /* odd sizes */
        {512, 256, KERN_F32, 0},    {512, 256, KERN_F16, 0}, {384, 64, KERN_BF16, 0}, /* fixture lm_head */
        {128, 64, KERN_BF16, 0},                                                      /* fixture gate/up */
        {64, 128, KERN_BF16, 0},                                                      /* fixture down */
        {300, 100, KERN_BF16, 1},                                                     /* 2-byte aligned in/out */
    };
    const int ns[] = {1, 37};
    char shape[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int k = 0; k < 2; k++) {
            int R = cases[i].R, C = cases[i].C, n = ns[k];
            void *raw;
            kern_weight w = rand_weight(cases[i].wdt, R, C, 0.5f, &raw);
            float *x = rand_f32((size_t)n * C, 1.0f);
            mm_case c = {x, w, n, cases[i].misalign};
            snprintf(shape, sizeof shape, "n=%d w=(%d, %d) %s%s", n, R, C, kern_dtype_name(cases[i].wdt),
                     cases[i].misalign ? " misaligned" : "");
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

static void test_rope(void) {
    struct {
        int n, pos0, heads, hd;
        double theta;
    } cases[] = {
        {1, 0, 32, 128, 1e6},    {37, 0, 32, 128, 1e6}, {1, 1000, 8, 128, 1e6}, {37, 1000, 8, 128, 1e6},
        {5, 30000, 4, 128, 1e6}, {37, 5, 4, 16, 1e4},   {1, 40, 2, 16, 1e4},    {3, 7, 3, 80, 1e4},
    };
    char shape[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int n = cases[i].n, dim = cases[i].heads * cases[i].hd;
        float *x = rand_f32((size_t)n * dim, 2.0f);
        int32_t *pos = malloc((size_t)n * sizeof *pos);
        for (int t = 0; t < n; t++)
            pos[t] = cases[i].pos0 + t;
        rope_case c = {x, pos, n, cases[i].heads, cases[i].hd, cases[i].theta};
        snprintf(shape, sizeof shape, "n=%d pos0=%d heads=%d hd=%d theta=%g", n, cases[i].pos0, cases[i].heads,
                 cases[i].hd, cases[i].theta);
        compare("rope", shape, run_rope, &c, TOL);
        free(x);
        free(pos);
    }
}

static void test_attention(void) {
    struct {
        int n, pos0, hq, hkv, hd;
    } cases[] = {
        {1, 0, 32, 8, 128},   {37, 0, 32, 8, 128}, {1, 100, 32, 8, 128}, {37, 100, 32, 8, 128}, /* GQA 4:1 */
        {1, 700, 16, 4, 128}, {5, 3, 4, 2, 16},    {37, 0, 4, 2, 16},                           /* fixture */
        {7, 20, 8, 8, 64},                                                                      /* MHA */
        {3, 10, 4, 1, 256},                                                                     /* MQA, widest head */
        {2, 5, 4, 2, 80}, /* head_dim not a multiple of 32 */
    };
    char shape[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int n = cases[i].n, p0 = cases[i].pos0, hq = cases[i].hq, hkv = cases[i].hkv, hd = cases[i].hd;
        float *q = rand_f32((size_t)n * hq * hd, 2.0f);
        float *k = rand_f32((size_t)(p0 + n) * hkv * hd, 2.0f);
        float *v = rand_f32((size_t)(p0 + n) * hkv * hd, 1.0f);
        att_case c = {q, k, v, n, p0, hq, hkv, hd};
        snprintf(shape, sizeof shape, "n=%d pos0=%d hq=%d hkv=%d hd=%d", n, p0, hq, hkv, hd);
        compare("attention", shape, run_attention, &c, TOL);
        free(q);
        free(k);
        free(v);
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
        compare("copy", shape, run_copy, &c, 0.0);
        free(src);
    }
}

int main(int argc, char **argv) {
    char err[512];
    int dev = 0, self = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device-index") == 0 && i + 1 < argc) {
            dev = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--self-check") == 0) {
            self = 1;
        } else {
            fprintf(stderr, "usage: %s [--device-index N] [--self-check]\n", argv[0]);
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
    test_attention();
    test_elementwise();
    test_copy();
    kern_backend_destroy(g_gpu.ops, g_gpu.be);
    kern_backend_destroy(g_cpu.ops, g_cpu.be);
    printf("%d of %d cases passed\n", g_cases - g_fail, g_cases);
    return g_fail ? 1 : 0;
}
