/*
 * kernels/cpu against straightforward double-precision formulas written
 * here, for every op in the table and every weight dtype. The model oracle
 * (test_model) only exercises bf16 weights; this covers f16/f32 paths, odd
 * shapes, GQA and cache offsets directly.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/cpu/cpu.h"
#include "tests/unit/testutil.h"
#include "weights/weights.h"

static uint64_t rng_state;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* binary16 encoding of normal values (test data stays in range). */
static uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    if (e <= 0) return (uint16_t)sign; /* flush tiny test values */
    uint32_t r = (man >> 13) + ((man >> 12) & 1);
    return (uint16_t)(sign | (((uint32_t)e << 10) + r));
}

typedef struct wbuf {
    kern_weight w;
    float *ref; /* the exact values the weight holds, as fp32 */
    void *raw;
} wbuf;

static void make_weight(wbuf *b, kern_dtype dt, int rows, int cols) {
    size_t n = (size_t)rows * cols;
    b->ref = malloc(n * sizeof(float));
    b->raw = malloc(n * kern_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        float v = frand();
        if (dt == KERN_F32) {
            ((float *)b->raw)[i] = v;
            b->ref[i] = v;
        } else if (dt == KERN_BF16) {
            uint16_t h = f32_to_bf16(v);
            ((uint16_t *)b->raw)[i] = h;
            b->ref[i] = kern_bf16_to_f32(h);
        } else {
            uint16_t h = f32_to_f16(v);
            ((uint16_t *)b->raw)[i] = h;
            b->ref[i] = kern_f16_to_f32(h);
        }
    }
    b->w = (kern_weight){b->raw, dt, rows, cols, 0};
}

static void free_weight(wbuf *b) {
    free(b->ref);
    free(b->raw);
}

static float *rand_vec(size_t n) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = frand();
    return v;
}

static const kern_ops *ops;
static kern_backend *be;

static void setup(void) {
    char err[256];
    rng_state = 12345;
    ck_assert_msg(kern_backend_create("cpu", 3, 0, &ops, &be, err, sizeof err) == 0, "%s", err);
}
static void teardown(void) { kern_backend_destroy(ops, be); }

START_TEST(test_f16_conversion) {
    ck_assert(kern_f16_to_f32(0x3c00) == 1.0f);
    ck_assert(kern_f16_to_f32(0xc000) == -2.0f);
    ck_assert(kern_f16_to_f32(0x7bff) == 65504.0f);
    ck_assert(kern_f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    ck_assert(kern_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    ck_assert(isinf(kern_f16_to_f32(0x7c00)) && kern_f16_to_f32(0xfc00) < 0);
    ck_assert(isnan(kern_f16_to_f32(0x7e00)));
    ck_assert(signbit(kern_f16_to_f32(0x8000)) && kern_f16_to_f32(0x8000) == 0.0f);
    ck_assert(kern_bf16_to_f32(0x3f80) == 1.0f);
}
END_TEST

START_TEST(test_matmul_all_dtypes) {
    const kern_dtype dts[] = {KERN_F32, KERN_F16, KERN_BF16};
    const int shapes[][3] = {{1, 37, 19}, {7, 16, 64}, {33, 50, 131}}; /* n, rows, cols */
    for (size_t d = 0; d < 3; d++) {
        for (size_t s = 0; s < 3; s++) {
            int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
            wbuf w;
            make_weight(&w, dts[d], rows, cols);
            float *x = rand_vec((size_t)n * cols);
            float *out = ops->alloc(be, (size_t)n * rows * sizeof(float));
            ck_assert_int_eq(ops->matmul(be, out, x, &w.w, n), 0);
            for (int i = 0; i < n; i++) {
                for (int r = 0; r < rows; r++) {
                    double ref = 0, mag = 0;
                    for (int k = 0; k < cols; k++) {
                        ref += (double)x[(size_t)i * cols + k] * w.ref[(size_t)r * cols + k];
                        mag += fabs((double)x[(size_t)i * cols + k] * w.ref[(size_t)r * cols + k]);
                    }
                    ck_assert_msg(fabs(out[(size_t)i * rows + r] - ref) <= 1e-6 * mag + 1e-7,
                                  "%s n=%d (%d,%d): out[%d,%d]=%g ref %g", kern_dtype_name(dts[d]), n, rows, cols, i,
                                  r, out[(size_t)i * rows + r], ref);
                }
            }
            ops->free(be, out);
            free(x);
            free_weight(&w);
        }
    }
}
END_TEST

START_TEST(test_matmul_rejects_alias) {
    wbuf w;
    make_weight(&w, KERN_F32, 4, 4);
    float *x = rand_vec(4);
    ck_assert_int_ne(ops->matmul(be, x, x, &w.w, 1), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(be), "alias"));
    free(x);
    free_weight(&w);
}
END_TEST

START_TEST(test_rmsnorm) {
    int rows = 5, dim = 48;
    wbuf w;
    make_weight(&w, KERN_BF16, 1, dim);
    float *x = rand_vec((size_t)rows * dim), *orig = malloc((size_t)rows * dim * sizeof(float));
    memcpy(orig, x, (size_t)rows * dim * sizeof(float));
    ck_assert_int_eq(ops->rmsnorm(be, x, x, &w.w, rows, dim, 1e-5f), 0); /* in place */
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)orig[r * dim + i] * orig[r * dim + i];
        double inv = 1.0 / sqrt(ss / dim + 1e-5);
        for (int i = 0; i < dim; i++)
            ck_assert(fabs(x[r * dim + i] - orig[r * dim + i] * inv * w.ref[i]) < 1e-5);
    }
    ck_assert_int_ne(ops->rmsnorm(be, x, x, &w.w, rows, dim + 1, 1e-5f), 0);
    free(x);
    free(orig);
    free_weight(&w);
}
END_TEST

START_TEST(test_rope) {
    int n = 3, heads = 2, hd = 16;
    int32_t pos[3] = {0, 7, 4000};
    double theta = 1e6;
    const kern_rope rope = {.theta = theta};
    float *x = rand_vec((size_t)n * heads * hd), *orig = malloc((size_t)n * heads * hd * sizeof(float));
    memcpy(orig, x, (size_t)n * heads * hd * sizeof(float));
    ck_assert_int_eq(ops->rope(be, x, pos, n, heads, hd, &rope), 0);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < hd / 2; i++) {
                double f = pos[t] * pow(theta, -2.0 * i / hd);
                const float *o = orig + (t * heads + h) * hd;
                const float *v = x + (t * heads + h) * hd;
                double a = o[i] * cos(f) - o[i + hd / 2] * sin(f);
                double b = o[i + hd / 2] * cos(f) + o[i] * sin(f);
                /* fp32 angles at position 4000 carry ~4000*2^-24 rad of error */
                ck_assert_msg(fabs(v[i] - a) < 1e-3 && fabs(v[i + hd / 2] - b) < 1e-3, "t=%d h=%d i=%d", t, h, i);
            }
    ck_assert_int_ne(ops->rope(be, x, pos, n, heads, 15, &rope), 0);
    free(x);
    free(orig);
}
END_TEST

#define ROPE_L3(th, old)                                                                                               \
    {                                                                                                                  \
        .theta = (th), .type = KERN_ROPE_LLAMA3, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,             \
        .original_max_position_embeddings = (old)                                                                      \
    }

/* Llama 3.1's scaling against its definition in double (HF's
 * _compute_llama3_parameters): the llama-rope-scaled fixture's parameters
 * (original context 32) on 16-wide heads and Llama-3.1-8B's on 128-wide
 * ones, each with frequencies in all three regimes. */
START_TEST(test_rope_llama3) {
    const kern_rope ropes[] = {ROPE_L3(1e4, 32), ROPE_L3(5e5, 8192)};
    const int hds[] = {16, 128};
    const int32_t pos[] = {0, 1, 7, 31, 33, 61, 500, 20000};
    const int n = 8, heads = 2;
    for (int ri = 0; ri < 2; ri++) {
        const kern_rope *r = &ropes[ri];
        const kern_rope plain = {.theta = r->theta};
        int hd = hds[ri], half = hd / 2, regimes[3] = {0};
        size_t cnt = (size_t)n * heads * hd;
        float *x = rand_vec(cnt), *orig = malloc(cnt * sizeof(float)), *px = malloc(cnt * sizeof(float));
        memcpy(orig, x, cnt * sizeof(float));
        memcpy(px, x, cnt * sizeof(float));
        ck_assert_int_eq(ops->rope(be, x, pos, n, heads, hd, r), 0);
        ck_assert_int_eq(ops->rope(be, px, pos, n, heads, hd, &plain), 0);
        double lo_wl = r->original_max_position_embeddings / r->low_freq_factor;
        double hi_wl = r->original_max_position_embeddings / r->high_freq_factor, off_plain = 0;
        for (int i = 0; i < half; i++) {
            double inv = pow(r->theta, -2.0 * i / hd), wl = 2 * M_PI / inv, f;
            if (wl < hi_wl) {
                f = inv, regimes[0]++;
            } else if (wl > lo_wl) {
                f = inv / r->factor, regimes[1]++;
            } else {
                double sm = (r->original_max_position_embeddings / wl - r->low_freq_factor) /
                            (r->high_freq_factor - r->low_freq_factor);
                f = (1 - sm) * inv / r->factor + sm * inv, regimes[2]++;
            }
            ck_assert_msg(fabs(kern_rope_inv_freq(r, i, hd) - f) <= 1e-6 * f, "hd %d i %d", hd, i);
            for (int t = 0; t < n; t++)
                for (int h = 0; h < heads; h++) {
                    size_t at = ((size_t)t * heads + h) * hd;
                    const float *o = orig + at, *v = x + at;
                    double ang = pos[t] * f;
                    double a = o[i] * cos(ang) - o[i + half] * sin(ang);
                    double b = o[i + half] * cos(ang) + o[i] * sin(ang);
                    /* fp32 frequency and angle: a few ulps of the angle */
                    double tol = 2e-6 + 1e-6 * ang;
                    ck_assert_msg(fabs(v[i] - a) <= tol && fabs(v[i + half] - b) <= tol, "hd %d t %d h %d i %d", hd, t,
                                  h, i);
                    off_plain = fmax(off_plain, fabs(v[i] - px[at + (size_t)i]));
                }
        }
        ck_assert_msg(regimes[0] && regimes[1] && regimes[2], "hd %d: regimes %d %d %d", hd, regimes[0], regimes[1],
                      regimes[2]);
        ck_assert(off_plain > 0.1); /* the scaling changes the rotation */
        free(x);
        free(orig);
        free(px);
    }
    /* a llama3 rope with a zero blend band is refused by name */
    kern_rope bad = ROPE_L3(1e4, 32);
    bad.high_freq_factor = bad.low_freq_factor;
    float v[16] = {0};
    ck_assert_int_ne(ops->rope(be, v, pos, 1, 1, 16, &bad), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(be), "rope: llama3 needs"));
}
END_TEST

/* add_rmsnorm is defined as add() then rmsnorm(): on the cpu backend it must
 * give the same bits in x and out, for every weight dtype, odd dims (which
 * the GPU path handles without vectors) and y aliasing x. */
START_TEST(test_add_rmsnorm_matches_unfused) {
    const kern_dtype dts[] = {KERN_BF16, KERN_F16, KERN_F32};
    const int shapes[][2] = {{1, 4096}, {7, 4096}, {3, 1000}, {5, 1}, {4, 17}, {2, 64}, {9, 4100}, {0, 8}};
    const float epss[] = {1e-6f, 1e-5f};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int rows = shapes[s][0], dim = shapes[s][1];
        size_t cnt = (size_t)rows * dim, bytes = (cnt + 1) * sizeof(float);
        for (int alias = 0; alias < 2; alias++) {
            kern_dtype dt = dts[(s + (size_t)alias) % 3];
            float eps = epss[(s + (size_t)alias) % 2];
            wbuf w;
            make_weight(&w, dt, 1, dim);
            float *x = rand_vec(cnt + 1), *y = alias ? x : rand_vec(cnt + 1);
            for (size_t i = 0; i < cnt; i++) x[i] *= 4.0f; /* a residual stream larger than the update */
            float *xr = malloc(bytes), *out = malloc(bytes), *ref = malloc(bytes);
            memcpy(xr, x, bytes);
            const float *yr = alias ? xr : y;
            ck_assert_int_eq(ops->add(be, xr, yr, cnt), 0);
            ck_assert_int_eq(ops->rmsnorm(be, ref, xr, &w.w, rows, dim, eps), 0);
            ck_assert_msg(ops->add_rmsnorm(be, x, y, out, &w.w, rows, dim, eps) == 0, "%s", kern_last_error(be));
            ck_assert_msg(memcmp(x, xr, cnt * sizeof(float)) == 0, "x differs: (%d, %d) %s%s", rows, dim,
                          kern_dtype_name(dt), alias ? " y == x" : "");
            ck_assert_msg(memcmp(out, ref, cnt * sizeof(float)) == 0, "out differs: (%d, %d) %s%s", rows, dim,
                          kern_dtype_name(dt), alias ? " y == x" : "");
            free(xr);
            free(out);
            free(ref);
            if (!alias) free(y);
            free(x);
            free_weight(&w);
        }
    }
}
END_TEST

START_TEST(test_add_rmsnorm_errors) {
    int rows = 3, dim = 24;
    wbuf w;
    make_weight(&w, KERN_BF16, 1, dim);
    float *x = rand_vec((size_t)rows * dim), *y = rand_vec((size_t)rows * dim), *out = rand_vec((size_t)rows * dim);
    ck_assert_int_ne(ops->add_rmsnorm(be, x, y, out, &w.w, rows, dim + 1, 1e-6f), 0);
    ck_assert_str_eq(kern_last_error(be), "add_rmsnorm: weight is (1, 24), expected (1, 25)");
    ck_assert_int_ne(ops->add_rmsnorm(be, x, y, x, &w.w, rows, dim, 1e-6f), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(be), "must not alias"));
    ck_assert_int_ne(ops->add_rmsnorm(be, x, y, y, &w.w, rows, dim, 1e-6f), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(be), "must not alias"));
    ck_assert_int_ne(ops->add_rmsnorm(be, x, y, out, &w.w, -1, dim, 1e-6f), 0);
    ck_assert_str_eq(kern_last_error(be), "add_rmsnorm: bad shape (-1, 24)");
    ck_assert_int_ne(ops->add_rmsnorm(be, x, y, out, &w.w, rows, 0, 1e-6f), 0);
    ck_assert_str_eq(kern_last_error(be), "add_rmsnorm: bad shape (3, 0)");
    /* nothing was touched by the refused calls: x still equals its copy */
    float *xc = malloc((size_t)rows * dim * sizeof(float));
    memcpy(xc, x, (size_t)rows * dim * sizeof(float));
    ck_assert_int_ne(ops->add_rmsnorm(be, x, y, x, &w.w, rows, dim, 1e-6f), 0);
    ck_assert_int_eq(memcmp(x, xc, (size_t)rows * dim * sizeof(float)), 0);
    free(xc);
    free(x);
    free(y);
    free(out);
    free_weight(&w);
}
END_TEST

/* qk_norm_rope is defined as rmsnorm(q), rmsnorm(k), rope(q), rope(k): on
 * the cpu backend the same bits, for Qwen3-8B's geometry (32/8 heads of 128,
 * also as a tp shard), odd half widths, tiny heads and far positions. */
START_TEST(test_qk_norm_rope_matches_unfused) {
    const struct {
        int n, hq, hkv, hd;
        kern_rope rope;
    } cases[] = {
        {1, 32, 8, 128, {.theta = 1e6}}, {5, 32, 8, 128, {.theta = 1e6}}, {3, 16, 8, 64, {.theta = 1e6}},
        {4, 4, 2, 16, {.theta = 1e4}},   {2, 3, 1, 80, {.theta = 1e4}},   {6, 4, 4, 10, {.theta = 1e4}},
        {3, 2, 2, 2, {.theta = 1e4}},    {2, 5, 0, 6, {.theta = 1e6}},    {1, 8, 1, 256, {.theta = 1e6}},
        {0, 4, 2, 16, {.theta = 1e4}},   {7, 4, 2, 16, ROPE_L3(1e4, 32)}, {5, 32, 8, 128, ROPE_L3(5e5, 8192)},
    };
    const int32_t far[] = {0, 1, 7, 4000, 30000, 131071, 40961};
    const kern_dtype dts[] = {KERN_BF16, KERN_F16, KERN_F32};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        int n = cases[ci].n, hq = cases[ci].hq, hkv = cases[ci].hkv, hd = cases[ci].hd;
        size_t nq = (size_t)n * hq * hd, nk = (size_t)n * hkv * hd;
        float eps = ci % 2 ? 1e-6f : 1e-5f;
        wbuf qw, kw;
        make_weight(&qw, dts[ci % 3], 1, hd);
        make_weight(&kw, dts[(ci + 1) % 3], 1, hd);
        int32_t *pos = malloc(((size_t)n + 1) * sizeof *pos);
        for (int t = 0; t < n; t++) pos[t] = t < 7 ? far[(ci + (size_t)t) % 7] : (int32_t)(rng_state >> 45);
        float *q = rand_vec(nq + 1), *k = rand_vec(nk + 1);
        for (size_t i = 0; i < nq; i++) q[i] *= 3.0f; /* projections are not unit-scaled */
        float *qr = malloc((nq + 1) * sizeof(float)), *kr = malloc((nk + 1) * sizeof(float));
        memcpy(qr, q, (nq + 1) * sizeof(float));
        memcpy(kr, k, (nk + 1) * sizeof(float));
        ck_assert_int_eq(ops->rmsnorm(be, qr, qr, &qw.w, n * hq, hd, eps), 0);
        ck_assert_int_eq(ops->rmsnorm(be, kr, kr, &kw.w, n * hkv, hd, eps), 0);
        ck_assert_int_eq(ops->rope(be, qr, pos, n, hq, hd, &cases[ci].rope), 0);
        ck_assert_int_eq(ops->rope(be, kr, pos, n, hkv, hd, &cases[ci].rope), 0);
        ck_assert_msg(ops->qk_norm_rope(be, q, k, &qw.w, &kw.w, pos, n, hq, hkv, hd, eps, &cases[ci].rope) == 0, "%s",
                      kern_last_error(be));
        ck_assert_msg(memcmp(q, qr, nq * sizeof(float)) == 0, "q differs: n=%d hq=%d hkv=%d hd=%d", n, hq, hkv, hd);
        ck_assert_msg(memcmp(k, kr, nk * sizeof(float)) == 0, "k differs: n=%d hq=%d hkv=%d hd=%d", n, hq, hkv, hd);
        free(q);
        free(k);
        free(qr);
        free(kr);
        free(pos);
        free_weight(&qw);
        free_weight(&kw);
    }
}
END_TEST

START_TEST(test_qk_norm_rope_errors) {
    wbuf w16, w8;
    make_weight(&w16, KERN_BF16, 1, 16);
    make_weight(&w8, KERN_BF16, 1, 8);
    int32_t pos[2] = {3, 4};
    float *q = rand_vec(2 * 4 * 16), *k = rand_vec(2 * 2 * 16);
    const kern_rope r4 = {.theta = 1e4};
    ck_assert_int_ne(ops->qk_norm_rope(be, q, k, &w16.w, &w16.w, pos, 2, 4, 2, 15, 1e-6f, &r4), 0);
    ck_assert_str_eq(kern_last_error(be), "qk_norm_rope: head_dim 15 is odd or not positive");
    ck_assert_int_ne(ops->qk_norm_rope(be, q, k, &w16.w, &w16.w, pos, 2, 4, 2, 0, 1e-6f, &r4), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(be), "head_dim 0"));
    ck_assert_int_ne(ops->qk_norm_rope(be, q, k, &w8.w, &w16.w, pos, 2, 4, 2, 16, 1e-6f, &r4), 0);
    ck_assert_str_eq(kern_last_error(be), "qk_norm_rope: q_norm weight is (1, 8), expected (1, 16)");
    ck_assert_int_ne(ops->qk_norm_rope(be, q, k, &w16.w, &w8.w, pos, 2, 4, 2, 16, 1e-6f, &r4), 0);
    ck_assert_str_eq(kern_last_error(be), "qk_norm_rope: k_norm weight is (1, 8), expected (1, 16)");
    ck_assert_int_ne(ops->qk_norm_rope(be, q, k, &w16.w, &w16.w, pos, -1, 4, 2, 16, 1e-6f, &r4), 0);
    ck_assert_str_eq(kern_last_error(be), "qk_norm_rope: bad shape n=-1 hq=4 hkv=2");
    ck_assert_int_ne(ops->qk_norm_rope(be, q, k, &w16.w, &w16.w, pos, 2, 4, -2, 16, 1e-6f, &r4), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(be), "bad shape"));
    kern_rope bad = {.theta = 1e4,
                     .type = KERN_ROPE_LLAMA3,
                     .factor = 0.5,
                     .low_freq_factor = 1,
                     .high_freq_factor = 4,
                     .original_max_position_embeddings = 32};
    ck_assert_int_ne(ops->qk_norm_rope(be, q, k, &w16.w, &w16.w, pos, 2, 4, 2, 16, 1e-6f, &bad), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(be), "qk_norm_rope: llama3 needs factor >= 1"));
    bad = (kern_rope){.theta = 1e4, .type = (kern_rope_type)7};
    ck_assert_int_ne(ops->qk_norm_rope(be, q, k, &w16.w, &w16.w, pos, 2, 4, 2, 16, 1e-6f, &bad), 0);
    ck_assert_str_eq(kern_last_error(be), "qk_norm_rope: unknown rope type");
    free(q);
    free(k);
    free_weight(&w16);
    free_weight(&w8);
}
END_TEST

/* Paged attention: two sequences (GQA 4:1) with queries starting at pos0 > 0,
 * their keys spread over interleaved, out-of-order blocks written through
 * kv_store, checked against a double-precision computation over the keys in
 * logical order. */
START_TEST(test_attention_paged_gqa) {
    enum { HQ = 8, HKV = 2, HD = 16, BS = 4, NBLK = 16 };
    const int kvd = HKV * HD, qd = HQ * HD;
    const int pos0[2] = {5, 0}, nq[2] = {7, 10};
    /* seq 0 uses blocks 9, 2, 14; seq 1 uses 3, 11, 0 (interleaved, unsorted) */
    const int32_t table[2][3] = {{9, 2, 14}, {3, 11, 0}};
    float scale = 0.25f;
    float *kc = ops->alloc(be, (size_t)NBLK * BS * kvd * sizeof(float));
    float *vc = ops->alloc(be, (size_t)NBLK * BS * kvd * sizeof(float));
    for (size_t i = 0; i < (size_t)NBLK * BS * kvd; i++) kc[i] = vc[i] = 1e6f; /* junk where nothing was stored */
    float *klog[2], *vlog[2];
    for (int s = 0; s < 2; s++) {
        int len = pos0[s] + nq[s];
        klog[s] = rand_vec((size_t)len * kvd);
        vlog[s] = rand_vec((size_t)len * kvd);
        int32_t slots[32];
        for (int p = 0; p < len; p++) slots[p] = table[s][p / BS] * BS + p % BS;
        ck_assert_int_eq(ops->kv_store(be, kc, vc, klog[s], vlog[s], slots, len, HKV, HD, KERN_KV_F32), 0);
    }
    int32_t q_start[3] = {0, nq[0], nq[0] + nq[1]};
    kern_attn_batch b = {2, q_start, pos0, &table[0][0], 3, BS};
    float *q = rand_vec((size_t)q_start[2] * qd), *out = ops->alloc(be, (size_t)q_start[2] * qd * sizeof(float));
    ck_assert_int_eq(ops->attention(be, out, q, kc, vc, &b, HQ, HKV, HD, scale, KERN_KV_F32), 0);
    double sc[32];
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < nq[s]; i++)
            for (int h = 0; h < HQ; h++) {
                int g = h / (HQ / HKV), L = pos0[s] + i + 1, row = q_start[s] + i;
                double mx = -INFINITY, sum = 0;
                for (int t = 0; t < L; t++) {
                    double d = 0;
                    for (int c = 0; c < HD; c++) d += (double)q[(size_t)row * qd + h * HD + c] * klog[s][t * kvd + g * HD + c];
                    sc[t] = d * scale;
                    if (sc[t] > mx) mx = sc[t];
                }
                for (int t = 0; t < L; t++) sum += sc[t] = exp(sc[t] - mx);
                for (int c = 0; c < HD; c++) {
                    double o = 0;
                    for (int t = 0; t < L; t++) o += sc[t] / sum * vlog[s][t * kvd + g * HD + c];
                    ck_assert_msg(fabs(out[(size_t)row * qd + h * HD + c] - o) < 1e-5, "s=%d i=%d h=%d c=%d", s, i, h, c);
                }
            }
    /* bad geometry is refused with a message */
    ck_assert_int_ne(ops->attention(be, out, q, kc, vc, &b, 6, 4, HD, scale, KERN_KV_F32), 0);
    int32_t far[2] = {40, 0};
    kern_attn_batch bad = {2, q_start, far, &table[0][0], 3, BS};
    ck_assert_int_ne(ops->attention(be, out, q, kc, vc, &bad, HQ, HKV, HD, scale, KERN_KV_F32), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(be), "beyond"));
    int32_t neg = -1;
    ck_assert_int_ne(ops->kv_store(be, kc, vc, klog[0], vlog[0], &neg, 1, HKV, HD, KERN_KV_F32), 0);
    for (int s = 0; s < 2; s++) {
        free(klog[s]);
        free(vlog[s]);
    }
    free(q);
    ops->free(be, out);
    ops->free(be, kc);
    ops->free(be, vc);
}
END_TEST

/* A column slice of a row-major matrix (ld > cols), as the row-parallel
 * layers of tensor parallelism use, multiplies like the dense copy. */
START_TEST(test_matmul_strided_view) {
    const kern_dtype dts[] = {KERN_F32, KERN_F16, KERN_BF16};
    for (size_t d = 0; d < 3; d++) {
        wbuf full;
        make_weight(&full, dts[d], 12, 40);
        int c0 = 8, nc = 24;
        size_t es = kern_dtype_size(dts[d]);
        kern_weight view = {(const char *)full.raw + c0 * es, dts[d], 12, nc, 40};
        float *dense = malloc((size_t)12 * nc * sizeof(float));
        for (int r = 0; r < 12; r++)
            for (int c = 0; c < nc; c++) dense[r * nc + c] = full.ref[r * 40 + c0 + c];
        kern_weight dv = {dense, KERN_F32, 12, nc, 0};
        float *x = rand_vec(3 * nc), o1[36], o2[36];
        ck_assert_int_eq(ops->matmul(be, o1, x, &view, 3), 0);
        ck_assert_int_eq(ops->matmul(be, o2, x, &dv, 3), 0);
        ck_assert_int_eq(memcmp(o1, o2, sizeof o1), 0);
        free(x);
        free(dense);
        free_weight(&full);
    }
}
END_TEST

START_TEST(test_elementwise_and_embedding) {
    float g[4] = {-3.0f, 0.0f, 0.5f, 20.0f}, u[4] = {1.0f, 2.0f, -2.0f, 0.5f}, o[4];
    ck_assert_int_eq(ops->silu_mul(be, o, g, u, 4), 0);
    for (int i = 0; i < 4; i++) ck_assert(fabs(o[i] - g[i] / (1.0 + exp(-(double)g[i])) * u[i]) < 1e-6);
    float a[3] = {1, 2, 3}, b[3] = {0.5f, -2, 10};
    ck_assert_int_eq(ops->add(be, a, b, 3), 0);
    ck_assert(a[0] == 1.5f && a[1] == 0.0f && a[2] == 13.0f);
    wbuf t;
    make_weight(&t, KERN_F16, 10, 6);
    int32_t ids[3] = {9, 0, 9};
    float e[18];
    ck_assert_int_eq(ops->embedding(be, e, &t.w, ids, 3), 0);
    for (int i = 0; i < 3; i++)
        for (int c = 0; c < 6; c++) ck_assert(e[i * 6 + c] == t.ref[ids[i] * 6 + c]);
    int32_t bad[1] = {10};
    ck_assert_int_ne(ops->embedding(be, e, &t.w, bad, 1), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(be), "out of range"));
    free_weight(&t);
}
END_TEST

/* Every output element is computed by exactly one thread in a fixed order,
 * so results must not depend on the thread count. */
START_TEST(test_thread_count_invariance) {
    const kern_ops *ops1;
    kern_backend *be1;
    char err[256];
    ck_assert(kern_backend_create("cpu", 1, 0, &ops1, &be1, err, sizeof err) == 0);
    wbuf w;
    make_weight(&w, KERN_BF16, 70, 40);
    float *x = rand_vec(9 * 40), *o3 = malloc(9 * 70 * sizeof(float)), *o1 = malloc(9 * 70 * sizeof(float));
    ck_assert_int_eq(ops->matmul(be, o3, x, &w.w, 9), 0);
    ck_assert_int_eq(ops1->matmul(be1, o1, x, &w.w, 9), 0);
    ck_assert_int_eq(memcmp(o1, o3, 9 * 70 * sizeof(float)), 0);
    kern_backend_destroy(ops1, be1);
    free(x);
    free(o1);
    free(o3);
    free_weight(&w);
}
END_TEST

/* A token's output row must not depend on which other tokens share the
 * call (groups of four take another code path than the remainder): the
 * server's greedy outputs are batch-invariant because of this. */
START_TEST(test_matmul_batch_invariant) {
    wbuf w;
    make_weight(&w, KERN_BF16, 33, 77);
    float *x = rand_vec(7 * 77), all[7 * 33], one[33];
    ck_assert_int_eq(ops->matmul(be, all, x, &w.w, 7), 0);
    for (int i = 0; i < 7; i++) {
        ck_assert_int_eq(ops->matmul(be, one, x + i * 77, &w.w, 1), 0);
        ck_assert_int_eq(memcmp(one, all + i * 33, sizeof one), 0);
    }
    free(x);
    free_weight(&w);
}
END_TEST

/* fuse_rows: the rows of the parts in order, an owned copy (the parts may
 * go first), and one matmul against it equals the parts' matmuls laid end
 * to end, bit for bit. */
START_TEST(test_fuse_rows) {
    const kern_dtype dts[] = {KERN_F32, KERN_F16, KERN_BF16};
    for (size_t d = 0; d < 3; d++) {
        wbuf a, b, c;
        make_weight(&a, dts[d], 19, 40);
        make_weight(&b, dts[d], 5, 40);
        make_weight(&c, dts[d], 16, 40);
        kern_weight pa, pb, pc, f;
        ck_assert_int_eq(ops->upload_weight(be, &a.w, &pa), 0);
        ck_assert_int_eq(ops->upload_weight(be, &b.w, &pb), 0);
        pc = c.w;
        pc.ld = 40; /* ld == cols counts as dense */
        const kern_weight *parts[3] = {&pa, &pb, &pc};
        ck_assert_int_eq(ops->fuse_rows(be, parts, 3, &f), 0);
        ck_assert(f.dtype == dts[d] && f.rows == 40 && f.cols == 40 && f.ld == 0);
        ck_assert(f.data != a.raw && f.data != b.raw && f.data != c.raw);
        float *x = rand_vec(40), sep[40], fused[40];
        ck_assert_int_eq(ops->matmul(be, sep, x, &pa, 1), 0);
        ck_assert_int_eq(ops->matmul(be, sep + 19, x, &pb, 1), 0);
        ck_assert_int_eq(ops->matmul(be, sep + 24, x, &pc, 1), 0);
        ops->free_weight(be, &pa);
        ops->free_weight(be, &pb);
        size_t es = kern_dtype_size(dts[d]);
        ck_assert_int_eq(memcmp(f.data, a.raw, 19 * 40 * es), 0);
        ck_assert_int_eq(memcmp((const char *)f.data + 19 * 40 * es, b.raw, 5 * 40 * es), 0);
        ck_assert_int_eq(memcmp((const char *)f.data + 24 * 40 * es, c.raw, 16 * 40 * es), 0);
        free_weight(&a); /* the fused copy does not alias the parts */
        free_weight(&b);
        ck_assert_int_eq(ops->matmul(be, fused, x, &f, 1), 0);
        ck_assert_int_eq(memcmp(sep, fused, sizeof sep), 0);
        /* a fused weight is a weight like any other: it fuses again */
        const kern_weight *again[2] = {&f, &c.w};
        kern_weight f2;
        ck_assert_int_eq(ops->fuse_rows(be, again, 2, &f2), 0);
        ck_assert_int_eq((int)f2.rows, 56);
        ck_assert_int_eq(memcmp((const char *)f2.data + 40 * 40 * es, c.raw, 16 * 40 * es), 0);
        ops->free_weight(be, &f2);
        ops->free_weight(be, &f);
        ck_assert_ptr_null(f.data);
        free(x);
        free_weight(&c);
    }
    /* a backend-owned part (random_weight) may be freed after fusing */
    kern_weight r1, r2, f;
    ck_assert_int_eq(ops->random_weight(be, &r1, 3, 8, 0, 0, 8, 1, 0.f, 1.f), 0);
    ck_assert_int_eq(ops->random_weight(be, &r2, 2, 8, 3, 0, 8, 1, 0.f, 1.f), 0);
    const kern_weight *rp[2] = {&r1, &r2};
    ck_assert_int_eq(ops->fuse_rows(be, rp, 2, &f), 0);
    float want[40];
    memcpy(want, r1.data, 24 * sizeof(float));
    memcpy(want + 24, r2.data, 16 * sizeof(float));
    ops->free_weight(be, &r1);
    ops->free_weight(be, &r2);
    ck_assert_int_eq(memcmp(f.data, want, sizeof want), 0);
    ops->free_weight(be, &f);
}
END_TEST

START_TEST(test_fuse_rows_errors) {
    wbuf a, b, h;
    make_weight(&a, KERN_BF16, 4, 16);
    make_weight(&b, KERN_BF16, 3, 12);
    make_weight(&h, KERN_F16, 3, 16);
    kern_weight out = {0}, strided = {a.raw, KERN_BF16, 4, 8, 16}, empty = {NULL, KERN_BF16, 2, 16, 0};
    const kern_weight *cols[2] = {&a.w, &b.w}, *dt[2] = {&a.w, &h.w}, *st[2] = {&a.w, &strided},
                      *none[2] = {&a.w, NULL}, *nodata[1] = {&empty};
    static const struct {
        int n;
        const char *want;
    } cases[] = {{2, "part 1 has 12 columns, part 0 has 16"}, {2, "part 1 is f16, part 0 is bf16"},
                 {2, "part 1 is strided"}, {2, "part 1 has no data"}, {1, "part 0 has no data"},
                 {0, "at least one part"}, {-1, "at least one part"}};
    const kern_weight *const *args[] = {cols, dt, st, none, nodata, cols, cols};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ck_assert_int_ne(ops->fuse_rows(be, args[i], cases[i].n, &out), 0);
        ck_assert_msg(strstr(kern_last_error(be), cases[i].want), "case %zu: %s", i, kern_last_error(be));
        ck_assert_msg(strstr(kern_last_error(be), "fuse_rows"), "%s", kern_last_error(be));
        ck_assert_ptr_null(out.data); /* untouched on error */
    }
    ck_assert_int_ne(ops->fuse_rows(be, NULL, 1, &out), 0);
    free_weight(&a);
    free_weight(&b);
    free_weight(&h);
}
END_TEST

/* ---- quantized weights (kern_ops.upload_quantized) ----
 * Random blocks with sane fp16 scales; their fp32 values come from
 * weights/ (ggml's dequantization, tested there against the gguf package),
 * an implementation independent of kernels/cpu. */
/* The first 5 have exact kernels too; the Q5 types only integer ones. */
static const kern_dtype qdts[] = {KERN_Q8_0, KERN_Q4_0, KERN_Q4_1, KERN_Q4_K, KERN_Q6_K, KERN_Q5_0, KERN_Q5_1, KERN_Q5_K};
static const weights_dtype qwdts[] = {WEIGHTS_Q8_0, WEIGHTS_Q4_0, WEIGHTS_Q4_1, WEIGHTS_Q4_K,
                                      WEIGHTS_Q6_K, WEIGHTS_Q5_0, WEIGHTS_Q5_1, WEIGHTS_Q5_K};

static void put_h(uint8_t *p, float v) {
    uint16_t h = f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* rows x cols of dtype qdts[q] in b->raw, their values in b->ref. */
static void make_qweight(wbuf *b, int q, int rows, int cols) {
    kern_dtype dt = qdts[q];
    size_t bb = kern_dtype_block_bytes(dt), nb = (size_t)rows * cols / kern_dtype_block(dt);
    uint8_t *raw = malloc(nb * bb);
    for (size_t i = 0; i < nb * bb; i++) raw[i] = (uint8_t)(frand() * 128 + 128);
    for (size_t i = 0; i < nb; i++) {
        uint8_t *blk = raw + i * bb;
        switch (dt) {
        case KERN_Q4_1:
        case KERN_Q5_1:
            put_h(blk, 0.01f + 0.02f * frand());
            put_h(blk + 2, 0.05f * frand());
            break;
        case KERN_Q8_0:
        case KERN_Q4_0:
        case KERN_Q5_0: put_h(blk, 0.01f + 0.02f * frand()); break;
        case KERN_Q4_K:
        case KERN_Q5_K:
            put_h(blk, 0.002f * (1.5f + frand()));
            put_h(blk + 2, 0.002f * (1.5f + frand()));
            break;
        case KERN_Q6_K: put_h(blk + 208, 0.001f * (1.5f + frand())); break;
        default: break;
        }
    }
    b->raw = raw;
    b->ref = malloc((size_t)rows * cols * sizeof(float));
    char err[256];
    ck_assert_msg(weights_dequantize(qwdts[q], raw, (size_t)rows * cols, b->ref, err, sizeof err) == 0, "%s", err);
    b->w = (kern_weight){raw, dt, rows, cols, 0};
}

/* A quantized weight gives exactly the bits of its dequantized fp32 copy,
 * for every token count (the register path at n < 8, the widened row
 * groups above), and is close to the double-precision product. */
START_TEST(test_matmul_quantized_equals_dequantized) {
    const int ns[] = {1, 5, 12, 70};
    for (int q = 0; q < 5; q++) {
        int rows = 37, cols = 512;
        wbuf w;
        make_qweight(&w, q, rows, cols);
        kern_weight dev, wf = {w.ref, KERN_F32, rows, cols, 0};
        ck_assert_int_eq(ops->upload_quantized(be, &w.w, qdts[q], &dev), 0);
        for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
            int n = ns[s];
            float *x = rand_vec((size_t)n * cols), *oq = malloc((size_t)n * rows * 4), *of = malloc((size_t)n * rows * 4);
            ck_assert_int_eq(ops->matmul(be, oq, x, &dev, n), 0);
            ck_assert_int_eq(ops->matmul(be, of, x, &wf, n), 0);
            ck_assert_msg(memcmp(oq, of, (size_t)n * rows * 4) == 0, "%s n=%d differs from fp32", kern_dtype_name(qdts[q]),
                          n);
            for (int i = 0; i < n; i++)
                for (int r = 0; r < rows; r++) {
                    double ref = 0, mag = 0;
                    for (int k = 0; k < cols; k++) {
                        double p = (double)x[(size_t)i * cols + k] * w.ref[(size_t)r * cols + k];
                        ref += p;
                        mag += fabs(p);
                    }
                    ck_assert(fabs(oq[(size_t)i * rows + r] - ref) <= 1e-6 * mag + 1e-7);
                }
            /* batch invariance across the two paths */
            float one[37];
            for (int i = 0; i < n; i += 3) {
                ck_assert_int_eq(ops->matmul(be, one, x + (size_t)i * cols, &dev, 1), 0);
                ck_assert_int_eq(memcmp(one, oq + (size_t)i * rows, sizeof one), 0);
            }
            free(x);
            free(oq);
            free(of);
        }
        /* embedding rows of a quantized table are its dequantized rows */
        int32_t ids[2] = {36, 3};
        float emb[2 * 512];
        ck_assert_int_eq(ops->embedding(be, emb, &dev, ids, 2), 0);
        ck_assert_int_eq(memcmp(emb, w.ref + 36 * 512, 512 * 4), 0);
        ck_assert_int_eq(memcmp(emb + 512, w.ref + 3 * 512, 512 * 4), 0);
        ops->free_weight(be, &dev);
        free_weight(&w);
    }
}
END_TEST

/* A column slice of a quantized matrix (ld = the full width, whole blocks)
 * equals the same columns of the dequantized matrix. */
START_TEST(test_matmul_quantized_strided) {
    for (int q = 0; q < 5; q++) {
        int rows = 9, cols = 768, bl = kern_dtype_block(qdts[q]), c0 = 256, nc = 512;
        wbuf w;
        make_qweight(&w, q, rows, cols);
        ck_assert_int_eq(c0 % bl, 0);
        kern_weight view = {(const uint8_t *)w.raw + kern_dtype_bytes(qdts[q], c0), qdts[q], rows, nc, cols}, dev;
        ck_assert_int_eq(ops->upload_quantized(be, &view, qdts[q], &dev), 0);
        kern_weight fview = {w.ref + c0, KERN_F32, rows, nc, cols};
        float *x = rand_vec(3 * (size_t)nc), oq[27], of[27];
        ck_assert_int_eq(ops->matmul(be, oq, x, &dev, 3), 0);
        ck_assert_int_eq(ops->matmul(be, of, x, &fview, 3), 0);
        ck_assert_int_eq(memcmp(oq, of, sizeof oq), 0);
        free(x);
        free_weight(&w);
    }
}
END_TEST

/* Every instruction-set path computes the same bits (ECHO_CPU_ISA caps the
 * path of a backend made afterwards); shapes with K % 16 tails too. */
START_TEST(test_matmul_isa_paths_agree) {
    const char *caps[] = {"scalar", "avx2"};
    const int ns[] = {1, 6, 13};
    for (int c = 0; c < 2; c++) {
        const kern_ops *o2;
        kern_backend *b2;
        char err[256];
        setenv("ECHO_CPU_ISA", caps[c], 1);
        ck_assert(kern_backend_create("cpu", 2, 0, &o2, &b2, err, sizeof err) == 0);
        unsetenv("ECHO_CPU_ISA");
        for (int d = 0; d < 8; d++) {
            wbuf w;
            int rows = 21, cols = d < 3 ? 179 : 256; /* 179: 5 blocks of 32, a lone 16-chunk, a tail */
            if (d < 3)
                make_weight(&w, (kern_dtype[]){KERN_F32, KERN_F16, KERN_BF16}[d], rows, cols);
            else
                make_qweight(&w, d - 3, rows, cols);
            for (size_t s = 0; s < 3; s++) {
                int n = ns[s];
                float *x = rand_vec((size_t)n * cols), *a = malloc((size_t)n * rows * 4), *b = malloc((size_t)n * rows * 4);
                ck_assert_int_eq(ops->matmul(be, a, x, &w.w, n), 0);
                ck_assert_int_eq(o2->matmul(b2, b, x, &w.w, n), 0);
                ck_assert_msg(memcmp(a, b, (size_t)n * rows * 4) == 0, "%s: %s n=%d differs", caps[c],
                              kern_dtype_name(w.w.dtype), n);
                free(x);
                free(a);
                free(b);
            }
            free_weight(&w);
        }
        kern_backend_destroy(o2, b2);
    }
}
END_TEST

/* Attention's vector paths (four keys per pass, output kept in registers
 * across keys) give the portable path's bits, for head sizes with and
 * without a tail after 64-float chunks. */
/* A second cpu backend on the portable path (ECHO_CPU_ISA=scalar). */
/* A backend whose paths are capped at `cap` (ECHO_CPU_ISA). */
static void isa_backend(const char *cap, const kern_ops **o, kern_backend **b) {
    char err[256];
    setenv("ECHO_CPU_ISA", cap, 1);
    ck_assert_msg(kern_backend_create("cpu", 2, 0, o, b, err, sizeof err) == 0, "%s", err);
    unsetenv("ECHO_CPU_ISA");
}

static void scalar_backend(const kern_ops **o, kern_backend **b) { isa_backend("scalar", o, b); }

/* An attention test's random keys, values and queries and its two caches. */
static void free_att(float *k, float *v, float *q, void *kc, void *vc) {
    free(k);
    free(v);
    free(q);
    ops->free(be, kc);
    ops->free(be, vc);
}

/* A query's attention has the same bits whether its task holds it alone
 * (decode: keys and values read in place), with two others (in place) or
 * with the whole prompt (packed), on the vector path and the portable one. */
START_TEST(test_attention_decode_equals_prefill) {
    const kern_ops *o2;
    kern_backend *b2;
    scalar_backend(&o2, &b2);
    const kern_ops *os[2] = {ops, o2};
    kern_backend *bs[2] = {be, b2};
    enum { HQ = 4, HKV = 2, HD = 64, BS = 4, NB = 8 };
    const int kvd = HKV * HD, qd = HQ * HD, pos0 = 2, nq = 11, len = pos0 + nq;
    float *kc = ops->alloc(be, (size_t)NB * BS * kvd * 4), *vc = ops->alloc(be, (size_t)NB * BS * kvd * 4);
    float *k = rand_vec((size_t)len * kvd), *v = rand_vec((size_t)len * kvd), *q = rand_vec((size_t)nq * qd);
    int32_t slots[32], table[NB] = {6, 1, 7, 0, 2, 3, 4, 5};
    for (int p = 0; p < len; p++) slots[p] = table[p / BS] * BS + p % BS;
    ck_assert_int_eq(ops->kv_store(be, kc, vc, k, v, slots, len, HKV, HD, KERN_KV_F32), 0);
    float *all = malloc((size_t)nq * qd * 4), *one = malloc((size_t)3 * qd * 4);
    for (int x = 0; x < 2; x++) {
        int32_t q_start[2] = {0, nq};
        kern_attn_batch b = {1, q_start, &pos0, table, NB, BS};
        ck_assert_int_eq(os[x]->attention(bs[x], all, q, kc, vc, &b, HQ, HKV, HD, 0.125f, KERN_KV_F32), 0);
        for (int i = 0; i < nq; i++)
            for (int m = 1; m <= 3 && i + m <= nq; m += 2) { /* 1 or 3 queries from row i */
                int32_t qs[2] = {0, m}, p0 = pos0 + i;
                kern_attn_batch d = {1, qs, &p0, table, NB, BS};
                ck_assert_int_eq(os[x]->attention(bs[x], one, q + (size_t)i * qd, kc, vc, &d, HQ, HKV, HD, 0.125f, KERN_KV_F32), 0);
                ck_assert_msg(memcmp(one, all + (size_t)i * qd, (size_t)m * qd * 4) == 0,
                              "path %d: %d queries from row %d differ from the prompt's", x, m, i);
            }
    }
    free(all);
    free(one);
    free_att(k, v, q, kc, vc);
    kern_backend_destroy(o2, b2);
}
END_TEST

/* Decode reads keys and values in place: a group's query heads against
 * each key (cpu_scores_ld), their p·v up to four at a time (cpu_wsum_m),
 * and with few tasks one query head per task. Every shape of that gives
 * the portable path's prefill bits: groups of 1, 3, 4, 5 and 9 heads (over
 * the four of one register pass), head sizes with a tail (72, 40), one
 * thread (whole groups) and three (a head per task), and two sequences
 * in one batch with a cache block boundary mid-run. */
START_TEST(test_attention_decode_shapes) {
    static const int shapes[][3] = {{9, 3, 64}, {4, 1, 72}, {10, 2, 40}, {9, 1, 16}, {2, 2, 128}};
    const kern_ops *ref_o, *o1, *o3;
    kern_backend *ref_b, *b1, *b3;
    char err[256];
    scalar_backend(&ref_o, &ref_b);
    ck_assert_msg(kern_backend_create("cpu", 1, 0, &o1, &b1, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(kern_backend_create("cpu", 3, 0, &o3, &b3, err, sizeof err) == 0, "%s", err);
    const kern_ops *os[2] = {o1, o3};
    kern_backend *bs[2] = {b1, b3};
    for (size_t x = 0; x < sizeof shapes / sizeof *shapes; x++) {
        enum { BS = 8, NB = 12, NS = 2 };
        const int hq = shapes[x][0], hkv = shapes[x][1], hd = shapes[x][2], kvd = hkv * hd, qd = hq * hd;
        /* two sequences: 13 and 29 positions, blocks interleaved in the cache */
        const int len[NS] = {13, 29};
        int32_t table[NS][NB / 2] = {{5, 0, 9, 3, 11, 7}, {1, 10, 2, 8, 4, 6}};
        float *kc = ref_o->alloc(ref_b, (size_t)NB * BS * kvd * 4), *vc = ref_o->alloc(ref_b, (size_t)NB * BS * kvd * 4);
        for (int sq = 0; sq < NS; sq++) {
            float *k = rand_vec((size_t)len[sq] * kvd), *v = rand_vec((size_t)len[sq] * kvd);
            int32_t slots[32];
            for (int p = 0; p < len[sq]; p++) slots[p] = table[sq][p / BS] * BS + p % BS;
            ck_assert_int_eq(ref_o->kv_store(ref_b, kc, vc, k, v, slots, len[sq], hkv, hd, KERN_KV_F32), 0);
            free(k);
            free(v);
        }
        float *q = rand_vec((size_t)(len[0] + len[1]) * qd);
        float *ref = malloc((size_t)(len[0] + len[1]) * qd * 4), *got = malloc((size_t)NS * qd * 4);
        /* the reference: both prompts whole (packed) on the portable path */
        int32_t q_start[NS + 1] = {0, len[0], len[0] + len[1]}, pos0[NS] = {0, 0};
        kern_attn_batch all = {NS, q_start, pos0, &table[0][0], NB / 2, BS};
        ck_assert_int_eq(ref_o->attention(ref_b, ref, q, kc, vc, &all, hq, hkv, hd, 0.11f, KERN_KV_F32), 0);
        for (int y = 0; y < 2; y++)
            for (int i = 3; i < 13; i += 4) { /* both sequences decode position i (and 16 + i) */
                int32_t ds[NS + 1] = {0, 1, 2}, dp[NS] = {i, 16 + i};
                float qq[2 * 9 * 128];
                memcpy(qq, q + (size_t)i * qd, (size_t)qd * 4);
                memcpy(qq + qd, q + (size_t)(len[0] + 16 + i) * qd, (size_t)qd * 4);
                kern_attn_batch d = {NS, ds, dp, &table[0][0], NB / 2, BS};
                ck_assert_int_eq(os[y]->attention(bs[y], got, qq, kc, vc, &d, hq, hkv, hd, 0.11f, KERN_KV_F32), 0);
                ck_assert_msg(memcmp(got, ref + (size_t)i * qd, (size_t)qd * 4) == 0,
                              "hq %d hkv %d hd %d, %d thread(s): seq 0 position %d differs from the prompt's", hq,
                              hkv, hd, y ? 3 : 1, i);
                ck_assert_msg(memcmp(got + qd, ref + (size_t)(len[0] + 16 + i) * qd, (size_t)qd * 4) == 0,
                              "hq %d hkv %d hd %d, %d thread(s): seq 1 position %d differs from the prompt's", hq,
                              hkv, hd, y ? 3 : 1, 16 + i);
            }
        free(q);
        free(ref);
        free(got);
        ref_o->free(ref_b, kc);
        ref_o->free(ref_b, vc);
    }
    kern_backend_destroy(ref_o, ref_b);
    kern_backend_destroy(o1, b1);
    kern_backend_destroy(o3, b3);
}
END_TEST

/* Same bits, NaN or not. */
static int same_f32(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0; }

/* Attention's softmax and the logits' sum of exponentials: the vector
 * paths (glibc's expf and exp four lanes at a time in double) give the
 * portable path's bits on rows of every length mod 8, with values far
 * below the max (libm's range: lanes out of it), -inf and NaN; and
 * cpu_expf / cpu_exp give libm's bits (expf checked over every float when
 * written, exp over 2e9 samples; here spread samples), so attention's and
 * the log-sum-exp's bits did not move. */
START_TEST(test_exp_paths_agree) {
#if defined(__GLIBC__) && defined(__x86_64__)
    for (uint64_t u = 0; u < (1ull << 32); u += 65521) {
        uint32_t v = (uint32_t)u;
        float x;
        memcpy(&x, &v, 4);
        ck_assert_msg(same_f32(cpu_expf(x), expf(x)), "cpu_expf(%a) = %a, libm %a", x, cpu_expf(x), expf(x));
    }
    static const float edge[] = {0.0f, -0.0f, -87.9f, -88.0f, -103.0f, -103.5f, -104.0f, -150.0f, 88.7f, 89.0f, -INFINITY};
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++)
        ck_assert_msg(same_f32(cpu_expf(edge[i]), expf(edge[i])), "cpu_expf(%a) differs from libm", edge[i]);
    /* cpu_exp: a spread of double bit patterns (both signs, all exponents) */
    for (uint64_t u = 0; u < (1ull << 63); u += (1ull << 41) + 12345) {
        for (int sg = 0; sg < 2; sg++) {
            uint64_t v = u | (uint64_t)sg << 63;
            double x, p, r;
            memcpy(&x, &v, 8);
            p = cpu_exp(x);
            r = exp(x);
            ck_assert_msg((isnan(p) && isnan(r)) || memcmp(&p, &r, 8) == 0, "cpu_exp(%a) = %a, libm %a", x, p, r);
        }
    }
#endif
    if (cpu_isa_detect() < CPU_ISA_AVX2) return; /* one path only */
    srand(7);
    float a[80], b[80];
    for (int t = 0; t < 3000; t++) {
        int len = 1 + t % 75;
        float spread = t % 3 == 0 ? 3.0f : t % 3 == 1 ? 40.0f : 400.0f;
        for (int p = 0; p < len; p++) {
            a[p] = spread * ((float)rand() / (float)RAND_MAX - 0.5f);
            if (t % 50 == 7 && p == len / 2) a[p] = -INFINITY;
            if (t % 97 == 3 && p == len - 1) a[p] = NAN;
        }
        memcpy(b, a, (size_t)len * 4);
        cpu_softmax(CPU_ISA_AVX2, a, len, 0.125f);
        cpu_softmax(CPU_ISA_SCALAR, b, len, 0.125f);
        for (int p = 0; p < len; p++)
            ck_assert_msg(same_f32(a[p], b[p]), "row %d (len %d): [%d] %a vs portable %a", t, len, p, a[p], b[p]);
        /* the logits' sum of exponentials, below its max by up to 600
         * (beyond 512: lanes out of the vector range) */
        for (int p = 0; p < len; p++) a[p] = 1.5f * spread * ((float)rand() / (float)RAND_MAX - 0.5f);
        float mx = a[0];
        for (int p = 1; p < len; p++) mx = a[p] > mx ? a[p] : mx;
        double ea = cpu_exp_sum(CPU_ISA_AVX2, a, len, mx), eb = cpu_exp_sum(CPU_ISA_SCALAR, a, len, mx);
        ck_assert_msg(memcmp(&ea, &eb, 8) == 0, "row %d (len %d): exp sum %a vs portable %a", t, len, ea, eb);
    }
}
END_TEST

START_TEST(test_attention_isa_paths_agree) {
    const int hds[] = {128, 80};
    const kern_ops *o2;
    kern_backend *b2;
    scalar_backend(&o2, &b2);
    for (int d = 0; d < 2; d++) {
        enum { HQ = 4, HKV = 2, BS = 4, NB = 8 };
        int hd = hds[d], kvd = HKV * hd, qd = HQ * hd, pos0 = 3, nq = 9, len = pos0 + nq;
        float *kc = ops->alloc(be, (size_t)NB * BS * kvd * 4), *vc = ops->alloc(be, (size_t)NB * BS * kvd * 4);
        float *k = rand_vec((size_t)len * kvd), *v = rand_vec((size_t)len * kvd), *q = rand_vec((size_t)nq * qd);
        int32_t slots[16], table[NB] = {5, 1, 7, 0, 2, 3, 4, 6}, q_start[2] = {0, nq};
        for (int p = 0; p < len; p++) slots[p] = table[p / BS] * BS + p % BS;
        ck_assert_int_eq(ops->kv_store(be, kc, vc, k, v, slots, len, HKV, hd, KERN_KV_F32), 0);
        kern_attn_batch b = {1, q_start, &pos0, table, NB, BS};
        float *a = malloc((size_t)nq * qd * 4), *c = malloc((size_t)nq * qd * 4);
        ck_assert_int_eq(ops->attention(be, a, q, kc, vc, &b, HQ, HKV, hd, 0.088f, KERN_KV_F32), 0);
        ck_assert_int_eq(o2->attention(b2, c, q, kc, vc, &b, HQ, HKV, hd, 0.088f, KERN_KV_F32), 0);
        ck_assert_msg(memcmp(a, c, (size_t)nq * qd * 4) == 0, "hd %d: vector and portable attention differ", hd);
        free(a);
        free(c);
        free_att(k, v, q, kc, vc);
    }
    kern_backend_destroy(o2, b2);
}
END_TEST

/* upload_quantized to Q8_0 rounds as ggml does: the bytes equal the gguf
 * package's quantize() of the same values (computed at test time). */
START_TEST(test_quantize_q8_0_matches_gguf) {
    int rows = 6, cols = 96;
    float *v = rand_vec((size_t)rows * cols);
    v[5] = 0;
    for (int k = 0; k < 32; k++) v[cols + k] = 0; /* an all-zero block */
    v[2 * cols + 7] = 3.5f;                        /* a block with a large value */
    char *dir = tu_mkdtemp(), in[512], out[512], cmd[2048];
    snprintf(in, sizeof in, "%s/x.f32", dir);
    snprintf(out, sizeof out, "%s/q.bin", dir);
    ck_assert_int_eq(tu_write_file(in, v, (size_t)rows * cols * 4), 0);
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import numpy as np, gguf; "
             "x = np.fromfile('%s', dtype=np.float32).reshape(%d, %d); "
             "open('%s', 'wb').write(gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0).tobytes())\"",
             in, rows, cols, out);
    int st;
    free(tu_run(cmd, &st));
    ck_assert_msg(st == 0, "python3 gguf quantize failed");
    size_t len;
    char *ref = tu_read_file(out, &len);
    ck_assert_ptr_nonnull(ref);
    ck_assert_uint_eq(len, kern_dtype_bytes(KERN_Q8_0, (int64_t)rows * cols));
    kern_weight host = {v, KERN_F32, rows, cols, 0}, dev;
    ck_assert_int_eq(ops->upload_quantized(be, &host, KERN_Q8_0, &dev), 0);
    ck_assert_int_eq(dev.dtype, KERN_Q8_0);
    ck_assert_int_eq(memcmp(dev.data, ref, len), 0);
    /* bf16 input, strided: rows read through the view */
    uint16_t *hb = malloc((size_t)rows * 128 * 2);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < 128; k++) hb[r * 128 + k] = f32_to_bf16(k < cols ? v[r * cols + k] : 9.0f);
    kern_weight hv = {hb, KERN_BF16, rows, cols, 128}, d2;
    ck_assert_int_eq(ops->upload_quantized(be, &hv, KERN_Q8_0, &d2), 0);
    ops->free_weight(be, &d2);
    /* errors: not a quantized target, cols not whole blocks, a type it cannot make */
    kern_weight odd = {v, KERN_F32, 2, 40, 0};
    ck_assert_int_ne(ops->upload_quantized(be, &host, KERN_F32, &d2), 0);
    ck_assert_int_ne(ops->upload_quantized(be, &odd, KERN_Q8_0, &d2), 0);
    ck_assert_int_ne(ops->upload_quantized(be, &host, KERN_Q4_K, &d2), 0);
    ops->free_weight(be, &dev);
    free(hb);
    free(ref);
    free(v);
    tu_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- KERN_Q8_0_A8: Q8_0 weights x activations quantized to 8 bits ----
 * The recipe (docs/bench-forward.md, "8-bit activations") written out once
 * more on the raw Q8_0 bytes, independently of kernels/cpu/matmul_q8.c. */
static void ref_q8a8(const float *x, int n, const uint8_t *raw, int rows, int cols, float *out) {
    int nb = cols / 32;
    int8_t *q = malloc((size_t)cols);
    float *dx = malloc((size_t)nb * sizeof *dx);
    for (int t = 0; t < n; t++) {
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)t * cols + 32 * b;
            float amax = 0;
            int finite = 1;
            for (int k = 0; k < 32; k++) {
                finite &= isfinite(xb[k]) != 0;
                amax = fmaxf(amax, fabsf(xb[k]));
            }
            float d = finite ? amax / 127.0f : NAN, id = d > 0 ? 1.0f / d : 0.0f;
            for (int k = 0; k < 32; k++) {
                float v = xb[k] * id;
                v = v < 127.0f ? v : 127.0f;
                v = v > -127.0f ? v : -127.0f;
                q[32 * b + k] = (int8_t)lrintf(v);
            }
            dx[b] = d;
        }
        for (int r = 0; r < rows; r++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = raw + ((size_t)r * nb + b) * 34;
                int32_t s = 0;
                for (int k = 0; k < 32; k++) s += (int8_t)blk[2 + k] * q[32 * b + k];
                float dw = kern_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
                acc = fmaf(dw * dx[b], (float)s, acc);
            }
            out[(size_t)t * rows + r] = acc;
        }
    }
    free(q);
    free(dx);
}

/* Every path (AVX-512 VNNI where the machine has it, AVX2, portable C)
 * gives the recipe's bits for every token count, so also batch-invariant;
 * the result is within the activation rounding's bound of the exact
 * product; a view at a 16-row boundary and embedding rows read the packed
 * layout right; NaN and infinity reach the output. */
START_TEST(test_matmul_q8a8) {
    const char *caps[] = {"avx512", "avx2", "scalar"};
    const int shapes[][2] = {{37, 512}, {16, 96}, {5, 1024}}; /* rows; cols (96: an odd number of blocks) */
    const int ns[] = {1, 2, 5, 9, 12, 70};
    for (int c = 0; c < 3; c++) {
        const kern_ops *o2;
        kern_backend *b2;
        isa_backend(caps[c], &o2, &b2);
        for (int sh = 0; sh < 3; sh++) {
            int rows = shapes[sh][0], cols = shapes[sh][1];
            wbuf w;
            make_qweight(&w, 0, rows, cols);
            kern_weight dev;
            ck_assert_int_eq(o2->upload_quantized(b2, &w.w, KERN_Q8_0_A8, &dev), 0);
            ck_assert_int_eq(dev.dtype, KERN_Q8_0_A8);
            for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
                int n = ns[s];
                float *x = rand_vec((size_t)n * cols), *o = malloc((size_t)n * rows * 4), *ref = malloc((size_t)n * rows * 4);
                for (int k = 0; k < 32 && n > 1; k++) x[cols + k] = 0; /* an all-zero block */
                x[3] = 40.0f;                                          /* one large value */
                ck_assert_int_eq(o2->matmul(b2, o, x, &dev, n), 0);
                ref_q8a8(x, n, w.raw, rows, cols, ref);
                ck_assert_msg(memcmp(o, ref, (size_t)n * rows * 4) == 0, "%s: %dx%d n=%d differs from the recipe",
                              caps[c], rows, cols, n);
                /* within the rounding of the activations: |x - dx q| <= dx / 2 per element */
                for (int i = 0; i < n; i++)
                    for (int r = 0; r < rows; r++) {
                        double exact = 0, bound = 0;
                        for (int b = 0; b < cols / 32; b++) {
                            double amax = 0, wsum = 0;
                            for (int k = 32 * b; k < 32 * b + 32; k++) {
                                exact += (double)x[(size_t)i * cols + k] * w.ref[(size_t)r * cols + k];
                                amax = fmax(amax, fabs(x[(size_t)i * cols + k]));
                                wsum += fabs(w.ref[(size_t)r * cols + k]);
                            }
                            bound += amax / 254 * wsum;
                        }
                        ck_assert_msg(fabs(o[(size_t)i * rows + r] - exact) <= 1.001 * bound + 1e-5,
                                      "%s n=%d: %g vs %g, bound %g", caps[c], n, o[(size_t)i * rows + r], exact, bound);
                    }
                free(x);
                free(o);
                free(ref);
            }
            /* a view of the rows from 16 on, as a tied lm_head is */
            if (rows > 16) {
                kern_weight v = {(const uint8_t *)dev.data + kern_dtype_bytes(KERN_Q8_0_A8, 16 * (int64_t)cols),
                                 KERN_Q8_0_A8, rows - 16, cols, 0};
                float *x = rand_vec((size_t)2 * cols), *o = malloc((size_t)2 * rows * 4), *ov = malloc((size_t)2 * rows * 4);
                ck_assert_int_eq(o2->matmul(b2, o, x, &dev, 2), 0);
                ck_assert_int_eq(o2->matmul(b2, ov, x, &v, 2), 0);
                for (int t = 0; t < 2; t++)
                    ck_assert_int_eq(memcmp(ov + (size_t)t * (rows - 16), o + (size_t)t * rows + 16, (size_t)(rows - 16) * 4), 0);
                free(x);
                free(o);
                free(ov);
            }
            /* embedding rows are the Q8_0 values */
            int32_t ids[3] = {rows - 1, 0, rows / 2};
            float *emb = malloc((size_t)3 * cols * 4);
            ck_assert_int_eq(o2->embedding(b2, emb, &dev, ids, 3), 0);
            for (int i = 0; i < 3; i++)
                ck_assert_int_eq(memcmp(emb + (size_t)i * cols, w.ref + (size_t)ids[i] * cols, (size_t)cols * 4), 0);
            free(emb);
            /* non-finite activations reach every output of their token */
            float *x = rand_vec((size_t)2 * cols), o[2 * 37];
            x[cols - 1] = NAN;
            x[cols + 5] = INFINITY;
            ck_assert_int_eq(o2->matmul(b2, o, x, &dev, 2), 0);
            for (int t = 0; t < 2; t++)
                for (int r = 0; r < rows; r++) ck_assert_msg(isnan(o[t * rows + r]), "%s t=%d r=%d", caps[c], t, r);
            free(x);
            o2->free_weight(b2, &dev);
            free_weight(&w);
        }
        kern_backend_destroy(o2, b2);
    }
}
END_TEST

/* KERN_Q8_0_A8 from F32 rows equals it from their Q8_0 bytes (the same
 * rounding: upload_quantized to Q8_0, tested against the gguf package);
 * from a column slice it is the recipe on those columns; what cannot be
 * made or multiplied is refused. */
START_TEST(test_q8a8_upload) {
    int rows = 20, cols = 128;
    float *v = rand_vec((size_t)rows * cols), *x = rand_vec(3 * (size_t)cols), a[60], b[60];
    kern_weight host = {v, KERN_F32, rows, cols, 0}, q8, p1, p2;
    ck_assert_int_eq(ops->upload_quantized(be, &host, KERN_Q8_0, &q8), 0);
    ck_assert_int_eq(ops->upload_quantized(be, &host, KERN_Q8_0_A8, &p1), 0);
    ck_assert_int_eq(ops->upload_quantized(be, &q8, KERN_Q8_0_A8, &p2), 0);
    ck_assert_int_eq(ops->matmul(be, a, x, &p1, 3), 0);
    ck_assert_int_eq(ops->matmul(be, b, x, &p2, 3), 0);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    kern_weight col = {p1.data, KERN_Q8_0_A8, rows, 64, cols}, d;
    ck_assert_int_ne(ops->matmul(be, a, x, &col, 1), 0);
    ck_assert_msg(strstr(kern_last_error(be), "column view"), "%s", kern_last_error(be));
    wbuf w4;
    make_qweight(&w4, 1, 4, 64);
    ck_assert_int_ne(ops->upload_quantized(be, &w4.w, KERN_Q8_0_A8, &d), 0);
    ck_assert_msg(strstr(kern_last_error(be), "cannot make q8_0_a8 from q4_0"), "%s", kern_last_error(be));
    ck_assert_int_ne(ops->upload_weight(be, &p1, &d), 0);
    /* from a column slice of Q8_0 rows (ld = the full width), as a row-parallel layer's */
    wbuf ws;
    make_qweight(&ws, 0, 9, 768);
    kern_weight view = {(const uint8_t *)ws.raw + kern_dtype_bytes(KERN_Q8_0, 256), KERN_Q8_0, 9, 512, 768}, pv;
    ck_assert_int_eq(ops->upload_quantized(be, &view, KERN_Q8_0_A8, &pv), 0);
    uint8_t *sub = malloc((size_t)9 * 16 * 34);
    for (int r = 0; r < 9; r++) memcpy(sub + (size_t)r * 16 * 34, (const uint8_t *)ws.raw + ((size_t)r * 24 + 8) * 34, 16 * 34);
    float *xs = rand_vec(4 * 512), os[36], rs[36];
    ck_assert_int_eq(ops->matmul(be, os, xs, &pv, 4), 0);
    ref_q8a8(xs, 4, sub, 9, 512, rs);
    ck_assert_int_eq(memcmp(os, rs, sizeof os), 0);
    ops->free_weight(be, &pv);
    free(sub);
    free(xs);
    free_weight(&ws);
    free_weight(&w4);
    ops->free_weight(be, &q8);
    ops->free_weight(be, &p1);
    ops->free_weight(be, &p2);
    free(v);
    free(x);
}
END_TEST

/* ---- KERN_Q4_0_A8 / Q4_1_A8 / Q4_K_A8 / Q6_K_A8 / Q5_0_A8 / Q5_1_A8 /
 * Q5_K_A8: ggml blocks x 8-bit activations ----
 * The recipe written out once more from the raw bytes (ggml's block
 * layouts), independently of the kernels (matmul_a8p.c's repacked
 * layouts): per row and token, block by block, acc = fma(dw * dx, the
 * block's integer sum of ls * w * q, acc) (ls: Q6_K's int8 scale per 16
 * elements, else 1), mins summed apart, acc + mins. */
static float a8h(const uint8_t *p) { return kern_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Element k (0..31) of 32-block b of a row as an integer; its lane scale;
 * the block's scale and min. */
static void a8_ref_block(kern_dtype dt, const uint8_t *row, int b, int *w, int *ls, float *dw, float *mn) {
    *mn = 0;
    for (int k = 0; k < 32; k++) ls[k / 4] = 1;
    if (dt == KERN_Q4_0 || dt == KERN_Q4_1) {
        int q41 = dt == KERN_Q4_1;
        const uint8_t *p = row + (size_t)b * (q41 ? 20 : 18), *qs = p + (q41 ? 4 : 2);
        *dw = a8h(p);
        if (q41) *mn = a8h(p + 2);
        for (int k = 0; k < 32; k++) w[k] = (k < 16 ? qs[k] & 15 : qs[k - 16] >> 4) - (q41 ? 0 : 8);
    } else if (dt == KERN_Q4_K) {
        const uint8_t *p = row + (size_t)(b / 8) * 144, *s = p + 4;
        int j = b % 8;
        int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        *dw = a8h(p) * (float)sc;
        *mn = -(a8h(p + 2) * (float)m);
        for (int k = 0; k < 32; k++) w[k] = j % 2 ? p[16 + 32 * (j / 2) + k] >> 4 : p[16 + 32 * (j / 2) + k] & 15;
    } else if (dt == KERN_Q5_0 || dt == KERN_Q5_1) { /* ggml's dequantize_row_q5_0 / q5_1 */
        int q51 = dt == KERN_Q5_1;
        const uint8_t *p = row + (size_t)b * (q51 ? 24 : 22), *qs = p + (q51 ? 8 : 6);
        uint32_t qh = (uint32_t)p[q51 ? 4 : 2] | (uint32_t)p[q51 ? 5 : 3] << 8 | (uint32_t)p[q51 ? 6 : 4] << 16 |
                      (uint32_t)p[q51 ? 7 : 5] << 24;
        *dw = a8h(p);
        if (q51) *mn = a8h(p + 2);
        for (int j = 0; j < 16; j++) {
            w[j] = ((qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10)) - (q51 ? 0 : 16);
            w[j + 16] = ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - (q51 ? 0 : 16);
        }
    } else if (dt == KERN_Q5_K) { /* ggml's dequantize_row_q5_K: 64 elements (two sub-blocks) per step */
        const uint8_t *p = row + (size_t)(b / 8) * 176, *s = p + 4, *qh = p + 16, *ql = p + 48;
        int j = b % 8, step = j / 2, high = j % 2;
        int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        *dw = a8h(p) * (float)sc;
        *mn = -(a8h(p + 2) * (float)m);
        uint8_t u = (uint8_t)((high ? 2 : 1) << (2 * step));
        for (int l = 0; l < 32; l++)
            w[l] = (high ? ql[32 * step + l] >> 4 : ql[32 * step + l] & 0xf) + (qh[l] & u ? 16 : 0);
    } else { /* Q6_K: element e of the super-block from ql/qh as ggml's dequantize_row_q6_K */
        const uint8_t *p = row + (size_t)(b / 8) * 210;
        for (int k = 0; k < 32; k++) {
            int e = 32 * (b % 8) + k, half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
            const uint8_t *ql = p + 64 * half, *qh = p + 128 + 32 * half;
            int lo = quarter == 0 ? ql[l] & 15 : quarter == 1 ? ql[l + 32] & 15 : quarter == 2 ? ql[l] >> 4 : ql[l + 32] >> 4;
            w[k] = (lo | ((qh[l] >> (2 * quarter)) & 3) << 4) - 32;
            ls[k / 4] = (int8_t)p[192 + e / 16];
        }
        *dw = a8h(p + 208);
    }
}

static int a8_has_min(kern_dtype dt) { return dt == KERN_Q4_1 || dt == KERN_Q4_K || dt == KERN_Q5_1 || dt == KERN_Q5_K; }

static void ref_a8(kern_dtype dt, const float *x, int n, const uint8_t *raw, int rows, int cols, size_t row_bytes,
                   float *out) {
    int nb = cols / 32;
    int8_t *q = malloc((size_t)cols);
    float *dx = malloc((size_t)nb * sizeof *dx);
    int *qs = malloc((size_t)nb * sizeof *qs);
    for (int t = 0; t < n; t++) {
        for (int b = 0; b < nb; b++) { /* test_matmul_q8a8's activation recipe */
            const float *xb = x + (size_t)t * cols + 32 * b;
            float amax = 0;
            int finite = 1;
            for (int k = 0; k < 32; k++) {
                finite &= isfinite(xb[k]) != 0;
                amax = fmaxf(amax, fabsf(xb[k]));
            }
            float d = finite ? amax / 127.0f : NAN, id = d > 0 ? 1.0f / d : 0.0f;
            qs[b] = 0;
            for (int k = 0; k < 32; k++) {
                float v = xb[k] * id;
                v = v < 127.0f ? v : 127.0f;
                v = v > -127.0f ? v : -127.0f;
                q[32 * b + k] = (int8_t)lrintf(v);
                qs[b] += q[32 * b + k];
            }
            dx[b] = d;
        }
        for (int r = 0; r < rows; r++) {
            float acc = 0, mt = 0; /* block by block */
            for (int b = 0; b < nb; b++) {
                int w[32], ls[8], s = 0;
                float dw, mn;
                a8_ref_block(dt, raw + (size_t)r * row_bytes, b, w, ls, &dw, &mn);
                for (int k = 0; k < 32; k++) s += ls[k / 4] * w[k] * q[32 * b + k];
                acc = fmaf(dw * dx[b], (float)s, acc);
                if (a8_has_min(dt)) mt = fmaf(mn, dx[b] * (float)qs[b], mt);
            }
            out[(size_t)t * rows + r] = a8_has_min(dt) ? acc + mt : acc;
        }
    }
    free(q);
    free(dx);
    free(qs);
}

/* Each integer kernel (AVX-512 VNNI where the machine has it, AVX2,
 * portable C) gives the recipe's bits for every token count (so
 * batch-invariant) and on 1 and 2 threads; the result lies within the
 * activation rounding's bound of the exact product (the recipe is the
 * product); a column view (a row-parallel slice) reads its columns;
 * embedding rows are the plain type's values; NaN reaches the output. */
START_TEST(test_matmul_a8) {
    const char *caps[] = {"avx512", "avx2", "scalar"};
    const int ns[] = {1, 2, 3, 5, 9, 70};
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni"))
        printf("test_matmul_a8: no AVX-512 VNNI on this machine: its kernels are compiled, not run here\n");
    for (int c = 0; c < 3; c++)
        for (int th = 1; th <= 2; th++) {
            const kern_ops *o2;
            kern_backend *b2;
            char err[256];
            setenv("ECHO_CPU_ISA", caps[c], 1);
            ck_assert_msg(kern_backend_create("cpu", th, 0, &o2, &b2, err, sizeof err) == 0, "%s", err);
            unsetenv("ECHO_CPU_ISA");
            for (int qi = 1; qi < 8; qi++) {
                kern_dtype dt = qdts[qi], a8 = kern_dtype_a8(dt);
                int rows = 37, cols = kern_dtype_block(dt) == 256 ? 768 : 288; /* odd numbers of 32-blocks: 9 */
                if (dt == KERN_Q4_K) cols = 512;
                wbuf w;
                make_qweight(&w, qi, rows, cols);
                kern_weight dev;
                ck_assert_int_eq(o2->upload_quantized(b2, &w.w, a8, &dev), 0);
                ck_assert_int_eq(dev.dtype, a8);
                size_t rb = kern_dtype_bytes(dt, cols);
                for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
                    int n = ns[s];
                    float *x = rand_vec((size_t)n * cols), *o = malloc((size_t)n * rows * 4),
                          *ref = malloc((size_t)n * rows * 4);
                    for (int k = 0; k < 32 && n > 1; k++) x[cols + k] = 0; /* an all-zero block */
                    x[3] = 40.0f;                                          /* one large value */
                    ck_assert_int_eq(o2->matmul(b2, o, x, &dev, n), 0);
                    ref_a8(dt, x, n, w.raw, rows, cols, rb, ref);
                    for (size_t i = 0; i < (size_t)n * rows; i++)
                        ck_assert_msg(memcmp(o + i, ref + i, 4) == 0, "%s %s %d thr: %dx%d n=%d out %zu: %.9g vs recipe %.9g",
                                      kern_dtype_name(a8), caps[c], th, rows, cols, n, i, o[i], ref[i]);
                    for (int i = 0; i < n; i++)
                        for (int r = 0; r < rows; r++) {
                            double exact = 0, bound = 0;
                            for (int b = 0; b < cols / 32; b++) {
                                double amax = 0, wsum = 0;
                                for (int k = 32 * b; k < 32 * b + 32; k++) {
                                    exact += (double)x[(size_t)i * cols + k] * w.ref[(size_t)r * cols + k];
                                    amax = fmax(amax, fabs(x[(size_t)i * cols + k]));
                                    wsum += fabs(w.ref[(size_t)r * cols + k]);
                                }
                                bound += amax / 254 * wsum;
                            }
                            ck_assert_msg(fabs(o[(size_t)i * rows + r] - exact) <= 1.001 * bound + 1e-4,
                                          "%s n=%d: %g vs %g, bound %g", kern_dtype_name(a8), n, o[(size_t)i * rows + r],
                                          exact, bound);
                        }
                    free(x);
                    free(o);
                    free(ref);
                }
                /* a column view: the second half of the blocks (ld = the full width) */
                int kb = kern_dtype_block(dt), half = cols / kb / 2 * kb;
                kern_weight view = {(const uint8_t *)w.raw + kern_dtype_bytes(dt, half), dt, rows, cols - half, cols}, pv;
                ck_assert_int_eq(o2->upload_quantized(b2, &view, a8, &pv), 0);
                float *x = rand_vec((size_t)3 * (cols - half)), ov[3 * 37], rv[3 * 37];
                ck_assert_int_eq(o2->matmul(b2, ov, x, &pv, 3), 0);
                ref_a8(dt, x, 3, (const uint8_t *)w.raw + kern_dtype_bytes(dt, half), rows, cols - half, rb, rv);
                ck_assert_msg(memcmp(ov, rv, sizeof ov) == 0, "%s %s: column view", kern_dtype_name(a8), caps[c]);
                /* a row view at 16 rows (a tied head's slice at tp > 1) sits where the plain type's would */
                kern_weight rview = {(const uint8_t *)dev.data + kern_dtype_bytes(a8, 16 * (int64_t)cols), a8, rows - 16,
                                     cols, 0};
                float *xr = rand_vec((size_t)2 * cols), orv[2 * 21], rrv[2 * 21];
                ck_assert_int_eq(o2->matmul(b2, orv, xr, &rview, 2), 0);
                ref_a8(dt, xr, 2, (const uint8_t *)w.raw + 16 * rb, rows - 16, cols, rb, rrv);
                ck_assert_msg(memcmp(orv, rrv, sizeof orv) == 0, "%s %s: row view", kern_dtype_name(a8), caps[c]);
                free(xr);
                /* embedding rows: the plain type's values */
                int32_t ids[2] = {rows - 1, 3};
                float *emb = malloc((size_t)2 * cols * 4);
                ck_assert_int_eq(o2->embedding(b2, emb, &dev, ids, 2), 0);
                for (int i = 0; i < 2; i++)
                    ck_assert_int_eq(memcmp(emb + (size_t)i * cols, w.ref + (size_t)ids[i] * cols, (size_t)cols * 4), 0);
                free(emb);
                /* a non-finite activation reaches every output of its token */
                x[1] = NAN;
                ck_assert_int_eq(o2->matmul(b2, ov, x, &pv, 2), 0);
                for (int r = 0; r < rows; r++) ck_assert_msg(isnan(ov[r]) && !isnan(ov[rows + r]), "%s r=%d", caps[c], r);
                free(x);
                o2->free_weight(b2, &pv);
                o2->free_weight(b2, &dev);
                /* the Q5 types have no exact kernel: kept only as their _A8 dtype */
                if (qi >= 5) {
                    ck_assert_int_ne(o2->upload_quantized(b2, &w.w, dt, &dev), 0);
                    ck_assert_msg(strstr(kern_last_error(b2), "only as"), "%s", kern_last_error(b2));
                }
                free_weight(&w);
            }
            kern_backend_destroy(o2, b2);
        }
}
END_TEST


/* Weights of 2 MiB and more become dense copies on 2 MiB-aligned blocks
 * (huge pages, kernels/cpu/mem.c), byte for byte, strided views included;
 * smaller ones, and every one with ECHO_CPU_HUGEPAGES=0, alias the host
 * view; a bad value of the variable is refused. */
START_TEST(test_upload_huge_pages) {
    const int64_t rows = 1024, cols = 1024, ld = 2048; /* a (1024, 1024) bf16 view of a (1024, 2048) matrix: 2 MiB */
    uint16_t *host = malloc((size_t)rows * ld * sizeof *host);
    ck_assert_ptr_nonnull(host);
    for (int64_t i = 0; i < rows * ld; i++) host[i] = (uint16_t)(i * 2654435761u >> 16);
    kern_weight h = {host, KERN_BF16, rows, cols, ld}, d;
    ck_assert_int_eq(ops->upload_weight(be, &h, &d), 0);
    ck_assert_ptr_ne(d.data, host);
    ck_assert_uint_eq((uintptr_t)d.data % ((uintptr_t)2 << 20), 0);
    ck_assert(d.ld == 0 || d.ld == cols);
    for (int64_t r = 0; r < rows; r++)
        ck_assert_int_eq(memcmp((const uint16_t *)d.data + r * cols, host + r * ld, (size_t)cols * 2), 0);
    /* the same products as the aliased view */
    float *x = rand_vec((size_t)cols), *o1 = ops->alloc(be, (size_t)rows * 4), *o2 = ops->alloc(be, (size_t)rows * 4);
    ck_assert_int_eq(ops->matmul(be, o1, x, &h, 1), 0);
    ck_assert_int_eq(ops->matmul(be, o2, x, &d, 1), 0);
    ck_assert_int_eq(memcmp(o1, o2, (size_t)rows * 4), 0);
    ops->free_weight(be, &d);
    kern_weight small = {host, KERN_BF16, 16, cols, ld};
    ck_assert_int_eq(ops->upload_weight(be, &small, &d), 0);
    ck_assert_ptr_eq(d.data, host);
    ops->free_weight(be, &d);
    void *big = ops->alloc(be, (size_t)3 << 20);
    ck_assert_ptr_nonnull(big);
    ck_assert_uint_eq((uintptr_t)big % ((uintptr_t)2 << 20), 0);
    ck_assert_int_eq(((const char *)big)[((size_t)3 << 20) - 1], 0); /* zeroed */
    ops->free(be, big);

    const kern_ops *o;
    kern_backend *b;
    char err[256];
    setenv("ECHO_CPU_HUGEPAGES", "0", 1);
    ck_assert_msg(kern_backend_create("cpu", 1, 0, &o, &b, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(o->upload_weight(b, &h, &d), 0);
    ck_assert_ptr_eq(d.data, host);
    o->free_weight(b, &d);
    kern_backend_destroy(o, b);
    setenv("ECHO_CPU_HUGEPAGES", "yes", 1);
    ck_assert_int_ne(kern_backend_create("cpu", 1, 0, &o, &b, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "ECHO_CPU_HUGEPAGES"));
    unsetenv("ECHO_CPU_HUGEPAGES");
    ops->free(be, o1);
    ops->free(be, o2);
    free(x);
    free(host);
}
END_TEST

START_TEST(test_backend_selection_errors) {
    const kern_ops *o;
    kern_backend *b;
    char err[256];
    ck_assert_int_ne(kern_backend_create("tpu", 1, 0, &o, &b, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "tpu"));
#ifndef ECHO_HAVE_CUDA
    ck_assert_int_ne(kern_backend_create("cuda", 1, 0, &o, &b, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "--device cpu"));
#endif
}
END_TEST

/* The pool under many short regions, as a decode step runs them: every
 * task of every region runs exactly once and before the region returns,
 * whether the workers poll (the default), sleep at once (spin 0), or wake
 * up after the caller has run every task itself; also the host parallel-for
 * of kernels.h. Regions alternate tiny ones with ones that sleep, so that
 * workers both miss regions and join them. */
typedef struct pool_probe {
    int region;
    atomic_int hits[16];
    atomic_int stale; /* a task that ran for another region */
    int *seen;        /* region a task last ran for */
    pthread_t caller;
} pool_probe;

static void pool_probe_task(void *arg, int t) {
    pool_probe *p = arg;
    if (p->seen[t] != p->region - 1) atomic_fetch_add(&p->stale, 1);
    p->seen[t] = p->region;
    atomic_fetch_add(&p->hits[t], 1);
    /* a slow worker (the caller must wait for it), and then workers past
     * their poll, asleep for the next region */
    if (p->region % 97 == 0 && !pthread_equal(pthread_self(), p->caller)) usleep(300);
}

START_TEST(test_pool_many_regions) {
    const char *spins[] = {NULL, "0", "5"};
    for (int v = 0; v < 3; v++) {
        if (spins[v])
            setenv("ECHO_POOL_SPIN_US", spins[v], 1);
        else
            unsetenv("ECHO_POOL_SPIN_US");
        const kern_ops *ops;
        kern_backend *pb;
        char err[256];
        ck_assert_msg(kern_backend_create("cpu", 3, 0, &ops, &pb, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(kern_host_threads(pb), 3);
        int seen[16];
        for (int t = 0; t < 16; t++)
            seen[t] = 0;
        pool_probe p = {.seen = seen, .caller = pthread_self()};
        for (int r = 1; r <= 3000; r++) {
            p.region = r;
            for (int t = 0; t < 16; t++)
                atomic_store(&p.hits[t], 0);
            kern_host_parallel(pb, 16, pool_probe_task, &p);
            for (int t = 0; t < 16; t++)
                ck_assert_msg(atomic_load(&p.hits[t]) == 1, "spin %s region %d task %d ran %d times",
                              spins[v] ? spins[v] : "default", r, t, atomic_load(&p.hits[t]));
        }
        ck_assert_int_eq(atomic_load(&p.stale), 0);
        kern_backend_destroy(ops, pb);
    }
    unsetenv("ECHO_POOL_SPIN_US");
}
END_TEST

int main(void) {
    Suite *s = suite_create("kernels-cpu");
    TCase *tc = tcase_create("ops");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_f16_conversion);
    tcase_add_test(tc, test_matmul_all_dtypes);
    tcase_add_test(tc, test_matmul_rejects_alias);
    tcase_add_test(tc, test_rmsnorm);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_rope_llama3);
    tcase_add_test(tc, test_add_rmsnorm_matches_unfused);
    tcase_add_test(tc, test_add_rmsnorm_errors);
    tcase_add_test(tc, test_qk_norm_rope_matches_unfused);
    tcase_add_test(tc, test_qk_norm_rope_errors);
    tcase_add_test(tc, test_fuse_rows);
    tcase_add_test(tc, test_fuse_rows_errors);
    tcase_add_test(tc, test_attention_paged_gqa);
    tcase_add_test(tc, test_matmul_strided_view);
    tcase_add_test(tc, test_elementwise_and_embedding);
    tcase_add_test(tc, test_thread_count_invariance);
    tcase_add_test(tc, test_pool_many_regions);
    tcase_add_test(tc, test_matmul_batch_invariant);
    tcase_add_test(tc, test_backend_selection_errors);
    tcase_add_test(tc, test_upload_huge_pages);
    tcase_add_test(tc, test_matmul_quantized_equals_dequantized);
    tcase_add_test(tc, test_matmul_quantized_strided);
    tcase_add_test(tc, test_matmul_isa_paths_agree);
    tcase_add_test(tc, test_attention_isa_paths_agree);
    tcase_add_test(tc, test_attention_decode_equals_prefill);
    tcase_add_test(tc, test_attention_decode_shapes);
    tcase_add_test(tc, test_exp_paths_agree);
    tcase_add_test(tc, test_quantize_q8_0_matches_gguf);
    tcase_add_test(tc, test_matmul_q8a8);
    tcase_add_test(tc, test_q8a8_upload);
    tcase_add_test(tc, test_matmul_a8);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
