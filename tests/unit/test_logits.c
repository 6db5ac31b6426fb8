/*
 * kernels/cpu: logits_topk, the reduction that replaces full logits rows on
 * the host by the top candidates and the log-sum-exp (kernels.h).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/unit/testutil.h"

typedef struct bk {
    const kern_ops *ops;
    kern_backend *be;
} bk;

static bk open_cpu(int threads) {
    bk b = {0};
    char err[256];
    ck_assert_msg(kern_backend_create("cpu", threads, 0, &b.ops, &b.be, err, sizeof err) == 0, "%s", err);
    return b;
}

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* A row of `n` values. kind 0: continuous in [-8, 8); 1: few distinct
 * values (many ties); 2: huge magnitudes (a plain exp would overflow);
 * 3: +0 and -0 only. */
static void fill_row(float *x, int n, int kind) {
    for (int i = 0; i < n; i++) {
        switch (kind) {
        case 0: x[i] = (float)(rnd() % 1600000) / 100000.0f - 8.0f; break;
        case 1: x[i] = (float)(rnd() % 5) * 0.5f - 1.0f; break;
        case 2: x[i] = 5000.0f + (float)(rnd() % 1000) / 10.0f; break;
        default: x[i] = (rnd() & 1) ? 0.0f : -0.0f; break;
        }
    }
}

/* Brute force: every column sorted by (value desc, column asc). */
static const float *g_sort_row;
static int by_value_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = g_sort_row[i], y = g_sort_row[j];
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : i > j;
}

static double ref_lse(const float *x, int n) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

/* Run the op and check it against the brute force, row by row. */
static void check_rows(bk *b, const float *x, int rows, int vocab, int k) {
    int32_t *ids = malloc((size_t)rows * k * sizeof *ids), *order = malloc((size_t)vocab * sizeof *order);
    float *vals = malloc((size_t)rows * k * sizeof *vals), *lse = malloc((size_t)rows * sizeof *lse);
    ck_assert(ids && order && vals && lse);
    ck_assert_msg(b->ops->logits_topk(b->be, x, rows, vocab, k, ids, vals, lse) == 0, "%s", kern_last_error(b->be));
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * vocab;
        for (int i = 0; i < vocab; i++) order[i] = i;
        g_sort_row = xr;
        qsort(order, (size_t)vocab, sizeof *order, by_value_desc);
        for (int j = 0; j < k; j++) {
            ck_assert_msg(ids[(size_t)r * k + j] == order[j], "vocab %d k %d row %d rank %d: id %d, expected %d",
                          vocab, k, r, j, ids[(size_t)r * k + j], order[j]);
            ck_assert(vals[(size_t)r * k + j] == xr[order[j]]);
        }
        double ref = ref_lse(xr, vocab);
        /* double accumulation rounded once: within one float rounding */
        ck_assert_msg(fabs((double)lse[r] - ref) <= 1e-7 * fmax(1.0, fabs(ref)), "vocab %d row %d: lse %.9g vs %.12g",
                      vocab, r, lse[r], ref);
    }
    free(ids);
    free(order);
    free(vals);
    free(lse);
}

START_TEST(test_topk_matches_sort) {
    bk b = open_cpu(3);
    rng_state = 0x1234567ull;
    /* 40000 and 151936 span several 16384-column chunks (the merge) */
    const int vocabs[] = {1, 7, 64, 100, 384, 16385, 40000, 151936};
    const int ks[] = {1, 2, 5, 32, 63, 64};
    for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
        int vocab = vocabs[vi], rows = vocab > 50000 ? 2 : 3;
        float *x = malloc((size_t)rows * vocab * sizeof *x);
        ck_assert_ptr_nonnull(x);
        for (int kind = 0; kind < 3; kind++) {
            for (int r = 0; r < rows; r++) fill_row(x + (size_t)r * vocab, vocab, (kind + r) % 3);
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
                if (ks[ki] <= vocab) check_rows(&b, x, rows, vocab, ks[ki]);
            if (vocab < 64) check_rows(&b, x, rows, vocab, vocab); /* the whole row */
        }
        free(x);
    }
    kern_backend_destroy(b.ops, b.be);
}
END_TEST

/* Equal values keep ascending column order, inside a chunk, across chunk
 * boundaries and for +0 / -0 (equal as floats). */
START_TEST(test_topk_ties) {
    bk b = open_cpu(2);
    rng_state = 42;
    enum { V = 50000 };
    float *x = malloc((size_t)V * sizeof *x);
    ck_assert_ptr_nonnull(x);
    fill_row(x, V, 1); /* five values, ~10000 columns each */
    check_rows(&b, x, 1, V, 64);
    fill_row(x, V, 3);
    check_rows(&b, x, 1, V, 64);
    /* a tie straddling the first chunk boundary, above everything else */
    for (int i = 0; i < V; i++) x[i] = -1.0f;
    x[16390] = x[16383] = x[3] = 2.0f;
    x[40000] = 3.0f;
    int32_t ids[5];
    float vals[5], lse;
    ck_assert(b.ops->logits_topk(b.be, x, 1, V, 5, ids, vals, &lse) == 0);
    const int32_t want[5] = {40000, 3, 16383, 16390, 0};
    for (int j = 0; j < 5; j++) ck_assert_int_eq(ids[j], want[j]);
    ck_assert(vals[0] == 3.0f && vals[3] == 2.0f && vals[4] == -1.0f);
    free(x);
    kern_backend_destroy(b.ops, b.be);
}
END_TEST

/* k is 1..min(vocab, KERN_TOPK_MAX); outside that the op fails with a
 * message (it does not clip: the output stride is k). rows == 0 is a
 * no-op. */
START_TEST(test_topk_k_limits) {
    bk b = open_cpu(1);
    float x[2 * 10];
    for (int i = 0; i < 20; i++) x[i] = (float)(i % 10);
    int32_t ids[2 * KERN_TOPK_MAX + 2];
    float vals[2 * KERN_TOPK_MAX + 2], lse[2];
    ck_assert_int_eq(b.ops->logits_topk(b.be, x, 2, 10, 10, ids, vals, lse), 0);
    for (int j = 0; j < 10; j++) ck_assert_int_eq(ids[10 + j], 9 - j);
    ck_assert_int_eq(b.ops->logits_topk(b.be, x, 2, 10, 11, ids, vals, lse), -1);
    ck_assert_msg(strstr(kern_last_error(b.be), "k = 11") != NULL, "%s", kern_last_error(b.be));
    ck_assert_int_eq(b.ops->logits_topk(b.be, x, 2, 10, 0, ids, vals, lse), -1);
    float *big = calloc(1000, sizeof *big);
    ck_assert_int_eq(b.ops->logits_topk(b.be, big, 1, 1000, KERN_TOPK_MAX + 1, ids, vals, lse), -1);
    ck_assert_int_eq(b.ops->logits_topk(b.be, big, 1, 1000, KERN_TOPK_MAX, ids, vals, lse), 0);
    for (int j = 0; j < KERN_TOPK_MAX; j++) ck_assert_int_eq(ids[j], j); /* all equal: columns ascend */
    ck_assert(fabs(lse[0] - log(1000.0)) < 1e-6);
    ck_assert_int_eq(b.ops->logits_topk(b.be, big, 1, 0, 1, ids, vals, lse), -1);
    ids[0] = -7;
    ck_assert_int_eq(b.ops->logits_topk(b.be, big, 0, 1000, 3, ids, vals, lse), 0);
    ck_assert_int_eq(ids[0], -7); /* nothing written */
    free(big);
    kern_backend_destroy(b.ops, b.be);
}
END_TEST

/* A row with inf or nan gets lse = NaN (the engine fails the step on it);
 * its ids stay in range; the other rows are unaffected. */
START_TEST(test_topk_nonfinite) {
    bk b = open_cpu(2);
    enum { V = 20000, R = 5 };
    float *x = malloc((size_t)R * V * sizeof *x);
    ck_assert_ptr_nonnull(x);
    rng_state = 7;
    for (int r = 0; r < R; r++) fill_row(x + (size_t)r * V, V, 0);
    x[(size_t)1 * V + 17000] = NAN;
    x[(size_t)2 * V + 5] = INFINITY;
    x[(size_t)3 * V + 19999] = -INFINITY;
    for (int i = 0; i < V; i++) x[(size_t)4 * V + i] = NAN;
    int32_t ids[R * 8];
    float vals[R * 8], lse[R];
    ck_assert(b.ops->logits_topk(b.be, x, R, V, 8, ids, vals, lse) == 0);
    ck_assert(isfinite(lse[0]));
    ck_assert(fabs(lse[0] - ref_lse(x, V)) <= 1e-6 * fabs(ref_lse(x, V)));
    for (int r = 1; r < R; r++) ck_assert_msg(isnan(lse[r]), "row %d: lse %g", r, lse[r]);
    for (int i = 0; i < R * 8; i++) ck_assert(ids[i] >= 0 && ids[i] < V);
    /* +inf is the largest value: it still ranks first */
    ck_assert_int_eq(ids[2 * 8], 5);
    free(x);
    kern_backend_destroy(b.ops, b.be);
}
END_TEST

/* lse against a double reference on rows where the shift matters, and the
 * same bits whatever the thread count (fixed chunking). */
START_TEST(test_topk_lse_and_threads) {
    bk b1 = open_cpu(1), b4 = open_cpu(4);
    enum { V = 151936, R = 3, K = 64 };
    float *x = malloc((size_t)R * V * sizeof *x);
    ck_assert_ptr_nonnull(x);
    rng_state = 99;
    fill_row(x, V, 0);
    fill_row(x + V, V, 2);                                   /* exp(5000) overflows without the max shift */
    for (int i = 0; i < V; i++) x[2 * (size_t)V + i] = -1e4f; /* flat and very negative */
    x[2 * (size_t)V + 123456] = -9990.0f;
    int32_t i1[R * K], i4[R * K];
    float v1[R * K], v4[R * K], l1[R], l4[R];
    ck_assert(b1.ops->logits_topk(b1.be, x, R, V, K, i1, v1, l1) == 0);
    ck_assert(b4.ops->logits_topk(b4.be, x, R, V, K, i4, v4, l4) == 0);
    ck_assert(memcmp(i1, i4, sizeof i1) == 0 && memcmp(v1, v4, sizeof v1) == 0 && memcmp(l1, l4, sizeof l1) == 0);
    for (int r = 0; r < R; r++) {
        double ref = ref_lse(x + (size_t)r * V, V);
        ck_assert_msg(fabs((double)l1[r] - ref) <= 1e-7 * fabs(ref), "row %d: %.9g vs %.12g", r, l1[r], ref);
    }
    ck_assert_int_eq(i1[2 * K], 123456);
    check_rows(&b4, x, R, V, K);
    free(x);
    kern_backend_destroy(b1.ops, b1.be);
    kern_backend_destroy(b4.ops, b4.be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("logits");
    TCase *tc = tcase_create("topk");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_topk_matches_sort);
    tcase_add_test(tc, test_topk_ties);
    tcase_add_test(tc, test_topk_k_limits);
    tcase_add_test(tc, test_topk_nonfinite);
    tcase_add_test(tc, test_topk_lse_and_threads);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
