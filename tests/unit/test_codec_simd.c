/*
 * The host codec's vector tables (comm/codec/codec_cpu.h) against the scalar
 * reference, bit for bit. The scalar table is itself checked against the
 * codec's independent arithmetic in test_comm.c (section 1); here every
 * other table must give exactly its bytes: codes, scales, residuals,
 * decoded values (NaN payloads included, but for values that went through
 * a rotation: cmp_f32), the number of poisoned groups and the first bad
 * element, and must write nothing past the message. The staged codecs'
 * loops (rotation both ways, the out2 / hout2 / hsub6 records) are swept
 * the same way.
 *
 * Inputs are random and adversarial, group by group: Gaussian values over
 * many decades, all-zero groups with signed zeros, subnormals, values at the
 * top of the codec's range (just below 2^127 and at it), inf/nan anywhere
 * (also brought in by the residual), exact ties of y/s at k + 1/2, and raw
 * random bits. Every group size 16..256, counts around multiples of 8 and
 * of the group, fp32 and bf16 input, with and without residual, both
 * residual roundings. On a CPU without AVX2 the comparison is skipped (and
 * says so); the dispatch test still runs.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/codec/codec.h"
#include "comm/codec/codec_cpu.h"
#include "comm/codec/echo_codec.h"
#include "tests/unit/testutil.h"

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_unif(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0);
}

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One value of a group of kind `kind`, element i of G. */
static float gen_value(uint64_t *s, int kind, int i, int G, int decade) {
    float u = rng_unif(s);
    switch (kind) {
    case 0: /* ordinary, 2^-120 .. 2^120, and signed zeros among them */
        if ((rng_next(s) & 15) == 0) return (rng_next(s) & 1) ? -0.0f : 0.0f;
        return u * powf(2.0f, (float)decade);
    case 1: return (rng_next(s) & 1) ? -0.0f : 0.0f;
    case 2: return bits_f((uint32_t)(rng_next(s) & 0x807fffffu)); /* subnormals and zeros */
    case 3:                                                       /* top of the range: just below 2^127 (legal) */
        return bits_f((0x7effffffu - (uint32_t)(rng_next(s) % 4096)) | (rng_next(s) & 1 ? 0x80000000u : 0));
    case 4: { /* ties: k + 1/2 with absmax 7 (scale 1), times a power of two */
        int k = (int)(rng_next(s) % 15) - 7;
        float v = i == G / 2 ? 7.0f : (float)k + ((rng_next(s) & 1) ? 0.5f : 0.0f);
        if (v > 7.0f) v = 7.0f;
        return ldexpf(v, decade);
    }
    case 5: return bits_f((uint32_t)rng_next(s)); /* raw bits: nan, inf, huge, anything */
    case 6:                                       /* mostly ordinary with one poison value */
        if (i == (int)(rng_next(s) % (uint64_t)G) && (rng_next(s) & 3) == 0) {
            const uint32_t bad[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f812345u,
                                    0xffffffffu, 0x7f000000u, 0xff000000u, 0x7f7fffffu};
            return bits_f(bad[rng_next(s) % 8]);
        }
        return u;
    case 8: /* sparse: signed zeros but for the first (decade & 3) values and, for some
             * decades, the last: the top-2 search among zeros (one non-zero at 0) */
        if (i < (decade & 3) || ((decade & 4) && i == G - 1)) return u == 0.0f ? 1.0f : u;
        return (rng_next(s) & 1) ? -0.0f : 0.0f;
    default: /* smallest values: the scale floor 2^-133 */
        return bits_f((uint32_t)(rng_next(s) % 8) | (rng_next(s) & 1 ? 0x80000000u : 0));
    }
}

/* n values, each group of G its own kind and decade. */
static void gen(float *x, size_t n, int G, uint64_t seed, int kinds_mask) {
    uint64_t s = seed;
    int kind = 0, decade = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % (size_t)G == 0) {
            do
                kind = (int)(rng_next(&s) % 9);
            while (!(kinds_mask >> kind & 1));
            decade = (int)(rng_next(&s) % 241) - 120;
        }
        x[i] = gen_value(&s, kind, (int)(i % (size_t)G), G, decade);
    }
}

#define CANARY 64 /* bytes past each output that must stay untouched */

static void *alloc_fill(size_t bytes, uint8_t fill) {
    uint8_t *p = malloc(bytes + CANARY);
    ck_assert_ptr_nonnull(p);
    memset(p, fill, bytes + CANARY);
    return p;
}

static const int groups[] = {16, 32, 64, 128, 256};

static size_t counts_for(int G, size_t *c) {
    size_t k = 0;
    const size_t fixed[] = {0, 1, 7, 8, 9, 15, 17, 1000, 4099};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
        c[k++] = fixed[i];
    c[k++] = (size_t)G - 1;
    c[k++] = (size_t)G;
    c[k++] = (size_t)G + 1;
    c[k++] = 3 * (size_t)G + 5;
    c[k++] = 8 * (size_t)G;
    c[k++] = 8 * (size_t)G + 8;
    c[k++] = 8 * (size_t)G - 3;
    return k;
}

/* Encode one input with both tables; everything must match. */
static void cmp_encode(const echo_cpu_codec *t, const void *x, echo_dtype dt, const float *res0, int res_mode,
                       echo_resid rmode, size_t n, int G, const char *what) {
    size_t ng = (n + (size_t)G - 1) / (size_t)G, cb = ng * (size_t)G / 2, rb = n * sizeof(float);
    uint8_t *c0 = alloc_fill(cb, 0x5a), *c1 = alloc_fill(cb, 0x5a);
    uint16_t *s0 = alloc_fill(ng * 2, 0x5a), *s1 = alloc_fill(ng * 2, 0x5a);
    float *r0 = NULL, *r1 = NULL;
    if (res_mode) { /* 1: residual written only; 2: carried in and written */
        r0 = alloc_fill(rb, 0x5a);
        r1 = alloc_fill(rb, 0x5a);
        memcpy(r0, res0, rb);
        memcpy(r1, res0, rb);
    }
    size_t b0 = 12345, b1 = 54321;
    size_t p0 = echo_cpu_codec_scalar.encode(x, dt, r0, res_mode == 2, rmode, n, G, c0, s0, &b0);
    size_t p1 = t->encode(x, dt, r1, res_mode == 2, rmode, n, G, c1, s1, &b1);
    ck_assert_msg(p0 == p1, "%s: poisoned groups %zu vs %zu", what, p0, p1);
    ck_assert_msg(b0 == b1, "%s: first bad element %zu vs %zu", what, b0, b1);
    for (size_t g = 0; g < ng; g++)
        ck_assert_msg(s0[g] == s1[g], "%s: scale of group %zu: %04x vs %04x", what, g, s0[g], s1[g]);
    ck_assert_msg(memcmp(s1, s0, ng * 2 + CANARY) == 0, "%s: scales past the end", what);
    for (size_t j = 0; j < cb; j++)
        ck_assert_msg(c0[j] == c1[j], "%s: code byte %zu (group %zu): %02x vs %02x", what, j, 2 * j / (size_t)G, c0[j],
                      c1[j]);
    ck_assert_msg(memcmp(c1, c0, cb + CANARY) == 0, "%s: codes past the end", what);
    if (res_mode) {
        for (size_t i = 0; i < n; i++) {
            uint32_t a, b;
            memcpy(&a, r0 + i, 4);
            memcpy(&b, r1 + i, 4);
            ck_assert_msg(a == b, "%s: residual %zu: %08x vs %08x", what, i, a, b);
        }
        ck_assert_msg(memcmp(r1, r0, rb + CANARY) == 0, "%s: residual past the end", what);
    }
    free(c0);
    free(c1);
    free(s0);
    free(s1);
    free(r0);
    free(r1);
}

static int have_avx2(void) {
#ifdef ECHO_HAVE_CODEC_AVX2
    if (__builtin_cpu_supports("avx2")) return 1;
#endif
    return 0;
}

static int have_avx512(void) {
#ifdef ECHO_HAVE_CODEC_AVX512
    if (echo_cpu_codec_avx512_ok()) return 1;
#endif
    return 0;
}

/* The vector tables this machine can run (besides the scalar one). */
static int vector_tables(const echo_cpu_codec **out) {
    int k = 0;
#ifdef ECHO_HAVE_CODEC_AVX2
    if (have_avx2())
        out[k++] = &echo_cpu_codec_avx2;
    else
        fprintf(stderr, "test_codec_simd: no AVX2 on this CPU; its table is not compared\n");
#endif
#ifdef ECHO_HAVE_CODEC_AVX512
    if (have_avx512())
        out[k++] = &echo_cpu_codec_avx512;
    else
        fprintf(stderr, "test_codec_simd: no AVX-512 (F, BW, VL, DQ) on this CPU; its table is not compared\n");
#endif
    (void)out;
    if (!k) fprintf(stderr, "test_codec_simd: no vector codec on this CPU; nothing to compare\n");
    return k;
}

/* A form no row of echo_codec.h's wire-form table knows never reaches
 * another form's encoder: every table (scalar and vector) codes each group
 * as poison and decodes NaN, so the call fails on every rank. */
START_TEST(test_unknown_form_is_poison) {
    const echo_cpu_codec *tabs[3] = {&echo_cpu_codec_scalar};
    int nt = 1 + vector_tables(tabs + 1);
    enum { N = 512, G = 128, FORM = 99 };
    ck_assert(!echo_form_known(FORM));
    ck_assert(echo_form_known(ECHO_FORM_OUT2) && echo_form_known(ECHO_FORM_HSUB) && echo_form_known(ECHO_FORM_INT4));
    float y[N], res[N], out[N];
    uint8_t codes[N / 2], recs[64];
    for (int i = 0; i < N; i++)
        y[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int t = 0; t < nt; t++) {
        size_t bad = 0;
        memset(recs, 0, sizeof recs);
        ck_assert_msg(echo_cpu_rec_encode(tabs[t], FORM, y, res, 0, N, G, codes, recs, &bad) == N / G,
                      "%s: an unknown form was coded as a known one", tabs[t]->name);
        ck_assert_uint_eq(bad, 0);
        echo_cpu_rec_decode(tabs[t], FORM, codes, recs, N, G, out, 0);
        for (int i = 0; i < N; i++)
            ck_assert_msg(isnan(out[i]), "%s: element %d of an unknown form decoded to %g", tabs[t]->name, i,
                          (double)out[i]);
    }
}
END_TEST

START_TEST(test_dispatch) {
    const char *cap = getenv("ECHO_CODEC_ISA");
    const char *want = have_avx512() ? "avx512" : have_avx2() ? "avx2" : "scalar";
    if (cap && !strcmp(cap, "scalar")) want = "scalar";
    if (cap && !strcmp(cap, "avx2") && have_avx2()) want = "avx2";
    const echo_cpu_codec *b = echo_cpu_codec_best();
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_eq(b, echo_cpu_codec_best()); /* a pure function */
    ck_assert_str_eq(b->name, want);
    /* the cap, set and cleared again */
    char *saved = cap ? strdup(cap) : NULL;
    setenv("ECHO_CODEC_ISA", "scalar", 1);
    ck_assert_str_eq(echo_cpu_codec_best()->name, "scalar");
    setenv("ECHO_CODEC_ISA", "avx2", 1);
    ck_assert_str_eq(echo_cpu_codec_best()->name, have_avx2() ? "avx2" : "scalar");
    setenv("ECHO_CODEC_ISA", "anything", 1);
    ck_assert_str_eq(echo_cpu_codec_best()->name, have_avx512() ? "avx512" : have_avx2() ? "avx2" : "scalar");
    if (saved)
        setenv("ECHO_CODEC_ISA", saved, 1);
    else
        unsetenv("ECHO_CODEC_ISA");
    free(saved);
    /* The entry points the host compute calls go through the best table:
     * same bits as the scalar one on an ordinary input. */
    float x[300], r0[300], r1[300];
    uint8_t c0[160], c1[160];
    uint16_t s0[20], s1[20];
    size_t b0, b1;
    gen(x, 300, 64, 7, 0x01);
    for (int i = 0; i < 300; i++)
        r0[i] = r1[i] = x[(i * 7) % 300] * 0.01f;
    ck_assert_uint_eq(echo_cpu_encode(x, ECHO_F32, r0, 1, ECHO_RESID_F32, 300, 64, c0, s0, &b0), 0);
    ck_assert_uint_eq(echo_cpu_codec_scalar.encode(x, ECHO_F32, r1, 1, ECHO_RESID_F32, 300, 64, c1, s1, &b1), 0);
    ck_assert(memcmp(c0, c1, 160) == 0 && memcmp(s0, s1, 10) == 0 && memcmp(r0, r1, sizeof r0) == 0);
}
END_TEST

/* Input kinds per test: the ordinary ones, then each adversarial one mixed in. */
static const int kind_masks[] = {0x01, 0x03, 0x05, 0x09, 0x11, 0x21, 0x41, 0x81, 0xff, 0x100};

/* One case of the sweeps below: table t, group G, count n (the ci-th of
 * counts_for), input kinds kind_masks[ki]; returns the comparisons made. */
typedef size_t (*case_fn)(const echo_cpu_codec *t, int G, size_t ci, size_t n, size_t ki);

/* fn over every vector table, group size, count and input kind: at least
 * min_tests comparisons when there is a vector table. */
static void sweep(case_fn fn, size_t min_tests) {
    const echo_cpu_codec *tabs[4];
    int nt = vector_tables(tabs);
    size_t counts[32], ntests = 0;
    for (int ti = 0; ti < nt; ti++)
        for (int gi = 0; gi < 5; gi++) {
            size_t nc = counts_for(groups[gi], counts);
            for (size_t ci = 0; ci < nc; ci++)
                for (size_t ki = 0; ki < sizeof kind_masks / sizeof *kind_masks; ki++)
                    ntests += fn(tabs[ti], groups[gi], ci, counts[ci], ki);
        }
    if (nt) ck_assert_uint_ge(ntests, min_tests);
}

static size_t encode_case(const echo_cpu_codec *t, int G, size_t ci, size_t n, size_t ki) {
    size_t ntests = 0;
    uint64_t seed = 1000003u * (uint64_t)G + 7919u * ci + ki;
    float *x = malloc((n + 1) * 4), *res = malloc((n + 1) * 4);
    uint16_t *xb = malloc((n + 1) * 2);
    gen(x, n, G, seed, kind_masks[ki]);
    /* residual: small against x mostly, sometimes of another kind (it can bring inf in) */
    gen(res, n, G, seed ^ 0xabcdef, ki == 8 ? 0xff : 0x01);
    for (size_t i = 0; i < n; i++) {
        if (ki != 8) res[i] *= 0x1p-8f * fabsf(x[i]);
        xb[i] = echo_f32_to_bf16(x[i]);
    }
    for (int dti = 0; dti < 2; dti++)
        for (int rm = 0; rm < 3; rm++)
            for (int rr = 0; rr < 2; rr++) {
                char what[160];
                snprintf(what, sizeof what, "%s G=%d n=%zu kinds=%#x %s res=%d rmode=%s", t->name, G, n, kind_masks[ki],
                         dti ? "bf16" : "f32", rm, rr ? "bf16" : "f32");
                cmp_encode(t, dti ? (const void *)xb : x, dti ? ECHO_BF16 : ECHO_F32, res, rm,
                           rr ? ECHO_RESID_BF16 : ECHO_RESID_F32, n, G, what);
                ntests++;
            }
    free(x);
    free(res);
    free(xb);
    return ntests;
}

START_TEST(test_encode_matches_scalar) {
    sweep(encode_case, 5000);
}
END_TEST

/* Codes and scales as they come off the wire: any byte, any scale (zero,
 * subnormal, huge, poison, other NaNs and inf). */
static void gen_wire(uint8_t *codes, uint16_t *scales, size_t ng, int G, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < ng * (size_t)G / 2; i++)
        codes[i] = (uint8_t)rng_next(&s);
    for (size_t g = 0; g < ng; g++) {
        uint64_t r = rng_next(&s);
        switch (r % 8) {
        case 0: scales[g] = 0; break;
        case 1: scales[g] = (uint16_t)(1 + (r >> 8) % 127); break; /* subnormal */
        case 2: scales[g] = ECHO_SCALE_POISON; break;
        case 3: scales[g] = (uint16_t)(0x7f00 + (r >> 8) % 0x7f); break; /* huge: products overflow */
        case 4: scales[g] = (uint16_t)(r >> 16); break;                  /* anything, NaN/inf included */
        default: scales[g] = echo_f32_to_bf16(ldexpf(1.0f + (float)((r >> 8) % 128) / 128, (int)((r >> 20) % 60) - 30));
        }
    }
}

START_TEST(test_decode_matches_scalar) {
    const echo_cpu_codec *tabs[4];
    int nt = vector_tables(tabs);
    size_t counts[32], ntests = 0;
    for (int ti = 0; ti < nt; ti++)
        for (int gi = 0; gi < 5; gi++) {
            int G = groups[gi];
            size_t nc = counts_for(G, counts);
            for (size_t ci = 0; ci < nc; ci++)
                for (int rep = 0; rep < 4; rep++) {
                    size_t n = counts[ci], ng = (n + (size_t)G - 1) / (size_t)G, fb = n * 4;
                    uint64_t seed = 31337u * (uint64_t)G + 101u * ci + (uint64_t)rep;
                    uint8_t *codes = malloc(ng * (size_t)G / 2 + 1);
                    uint16_t *scales = malloc(ng * 2 + 2);
                    float *acc = malloc(fb + 4);
                    gen_wire(codes, scales, ng, G, seed);
                    /* accumulators of every kind, NaNs with payloads included */
                    gen(acc, n, G, seed ^ 0x5555, rep == 3 ? 0xff : 0x61);
                    char what[128];
                    for (int a = 0; a < 2; a++) {
                        snprintf(what, sizeof what, "%s decode G=%d n=%zu rep=%d accumulate=%d", tabs[ti]->name, G, n,
                                 rep, a);
                        float *o0 = alloc_fill(fb, 0x5a), *o1 = alloc_fill(fb, 0x5a);
                        memcpy(o0, acc, fb);
                        memcpy(o1, acc, fb);
                        echo_cpu_codec_scalar.decode(codes, scales, n, G, o0, a);
                        tabs[ti]->decode(codes, scales, n, G, o1, a);
                        for (size_t i = 0; i < n; i++) {
                            uint32_t u0, u1;
                            memcpy(&u0, o0 + i, 4);
                            memcpy(&u1, o1 + i, 4);
                            ck_assert_msg(u0 == u1, "%s: value %zu: %08x vs %08x", what, i, u0, u1);
                        }
                        ck_assert_msg(memcmp(o0, o1, fb + CANARY) == 0, "%s: past the end", what);
                        free(o0);
                        free(o1);
                        ntests++;
                    }
                    for (int dti = 0; dti < 2; dti++) {
                        echo_dtype dt = dti ? ECHO_BF16 : ECHO_F32;
                        size_t ob = n * echo_dtype_size(dt), b0 = 1, b1 = 2;
                        snprintf(what, sizeof what, "%s decode_store G=%d n=%zu rep=%d %s", tabs[ti]->name, G, n, rep,
                                 dti ? "bf16" : "f32");
                        uint8_t *o0 = alloc_fill(ob, 0x5a), *o1 = alloc_fill(ob, 0x5a);
                        size_t p0 = echo_cpu_codec_scalar.decode_store(codes, scales, n, G, o0, dt, &b0);
                        size_t p1 = tabs[ti]->decode_store(codes, scales, n, G, o1, dt, &b1);
                        ck_assert_msg(p0 == p1 && b0 == b1, "%s: poisoned %zu/%zu, first bad %zu/%zu", what, p0, p1, b0,
                                      b1);
                        for (size_t i = 0; i < ob; i++)
                            ck_assert_msg(o0[i] == o1[i], "%s: byte %zu: %02x vs %02x", what, i, o0[i], o1[i]);
                        ck_assert_msg(memcmp(o0, o1, ob + CANARY) == 0, "%s: past the end", what);
                        free(o0);
                        free(o1);
                        ntests++;
                    }
                    free(codes);
                    free(scales);
                    free(acc);
                }
        }
    if (nt) ck_assert_uint_gt(ntests, 1000);
}
END_TEST

/* n fp32 values at a and b bit for bit, and the CANARY bytes after them
 * untouched. After a rotation (nan_any) two NaNs match whatever their
 * payloads: a butterfly over two NaNs returns one of them, and which one
 * is the compiler's choice of operand order (it treats the add as
 * commutative), in the scalar reference as here; the cuda kernels give the
 * canonical NaN. Every other value must match bit for bit. */
static void cmp_f32(const float *a, const float *b, size_t n, int nan_any, const char *what, const char *part) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u0, u1;
        memcpy(&u0, a + i, 4);
        memcpy(&u1, b + i, 4);
        int nans = nan_any && (u0 & 0x7fffffffu) > 0x7f800000u && (u1 & 0x7fffffffu) > 0x7f800000u;
        ck_assert_msg(u0 == u1 || nans, "%s: %s %zu: %08x vs %08x", what, part, i, u0, u1);
    }
    ck_assert_msg(memcmp(a + n, b + n, CANARY) == 0, "%s: %s past the end", what, part);
}

/* The same for n bf16 values. */
static void cmp_bf16(const uint16_t *a, const uint16_t *b, size_t n, const char *what, const char *part) {
    for (size_t i = 0; i < n; i++) {
        int nans = (a[i] & 0x7fffu) > 0x7f80u && (b[i] & 0x7fffu) > 0x7f80u;
        ck_assert_msg(a[i] == b[i] || nans, "%s: %s %zu: %04x vs %04x", what, part, i, a[i], b[i]);
    }
    ck_assert_msg(memcmp(a + n, b + n, CANARY) == 0, "%s: %s past the end", what, part);
}

static void cmp_u8(const uint8_t *a, const uint8_t *b, size_t n, const char *what, const char *part) {
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(a[i] == b[i], "%s: %s byte %zu: %02x vs %02x", what, part, i, a[i], b[i]);
    ck_assert_msg(memcmp(a, b, n + CANARY) == 0, "%s: %s past the end", what, part);
}

static float *dup_f32(const float *x, size_t n) {
    float *p = alloc_fill(n * 4, 0x5a);
    memcpy(p, x, n * 4);
    return p;
}

/* The rotation of the rotating codecs, both ways, every output mode. */
static size_t rotation_case(const echo_cpu_codec *t, int G, size_t ci, size_t n, size_t ki) {
    size_t np = (n + (size_t)G - 1) / (size_t)G * (size_t)G, ntests = 0;
    size_t npx = np + (ci & 1 ? (size_t)G : 0); /* padding past a whole group too */
    uint64_t seed = 7777u * (uint64_t)G + 131u * ci + ki;
    float *x = malloc((n + 1) * 4), *in = malloc((np + 1) * 4), *acc = malloc((n + 1) * 4);
    uint16_t *xb = malloc((n + 1) * 2);
    gen(x, n, G, seed, kind_masks[ki]);
    gen(in, np, G, seed ^ 0x1234, kind_masks[ki]);
    gen(acc, n, G, seed ^ 0x4321, ki == 8 ? 0xff : 0x01);
    for (size_t i = 0; i < n; i++)
        xb[i] = echo_f32_to_bf16(x[i]);
    char what[160];
    for (int dti = 0; dti < 2; dti++) {
        echo_dtype dt = dti ? ECHO_BF16 : ECHO_F32;
        snprintf(what, sizeof what, "%s rot_fwd G=%d n=%zu np=%zu kinds=%#x %s", t->name, G, n, npx, kind_masks[ki],
                 dti ? "bf16" : "f32");
        float *o0 = alloc_fill(npx * 4, 0x5a), *o1 = alloc_fill(npx * 4, 0x5a);
        echo_cpu_codec_scalar.rot_fwd(dti ? (const void *)xb : x, dt, n, npx, G, o0);
        t->rot_fwd(dti ? (const void *)xb : x, dt, n, npx, G, o1);
        cmp_f32(o0, o1, npx, 1, what, "value");
        free(o0);
        free(o1);
        ntests++;
    }
    snprintf(what, sizeof what, "%s add n=%zu kinds=%#x", t->name, n, kind_masks[ki]);
    float *a0 = dup_f32(acc, n), *a1 = dup_f32(acc, n);
    echo_cpu_codec_scalar.add(x, n, a0);
    t->add(x, n, a1);
    cmp_f32(a0, a1, n, 0, what, "value");
    free(a0);
    free(a1);
    /* out: none, fp32, fp32 accumulated, bf16 */
    for (int mode = 0; mode < 4; mode++) {
        echo_dtype dt = mode == 3 ? ECHO_BF16 : ECHO_F32;
        size_t ob = n * echo_dtype_size(dt);
        snprintf(what, sizeof what, "%s rot_inv G=%d n=%zu kinds=%#x mode=%d", t->name, G, n, kind_masks[ki], mode);
        float *i0 = dup_f32(in, np), *i1 = dup_f32(in, np);
        uint8_t *o0 = alloc_fill(ob, 0x5a), *o1 = alloc_fill(ob, 0x5a);
        if (mode == 2) {
            memcpy(o0, acc, ob);
            memcpy(o1, acc, ob);
        }
        echo_cpu_codec_scalar.rot_inv(i0, n, G, mode ? o0 : NULL, dt, mode == 2);
        t->rot_inv(i1, n, G, mode ? o1 : NULL, dt, mode == 2);
        cmp_f32(i0, i1, np, 1, what, "in place");
        if (mode == 3)
            cmp_bf16((const uint16_t *)o0, (const uint16_t *)o1, n, what, "out");
        else
            cmp_f32((const float *)o0, (const float *)o1, n, 1, what, "out");
        free(i0);
        free(i1);
        free(o0);
        free(o1);
        ntests++;
    }
    free(x);
    free(in);
    free(acc);
    free(xb);
    return ntests;
}

START_TEST(test_rotation_matches_scalar) {
    sweep(rotation_case, 2000);
}
END_TEST

static const struct {
    int form, min_group;
    const char *name;
} rec_forms[] = {{ECHO_FORM_OUT2, 64, "out2"},
                 {ECHO_FORM_HOUT2, 16, "hout2"},
                 {ECHO_FORM_HSUB, 64, "hsub6"},
                 {ECHO_FORM_HNF3, 64, "hnf3"}};

/* Decode one wire message (n values, maybe a partial last group) with both
 * tables, into and onto out. */
static void cmp_rec_decode(const echo_cpu_codec *t, int form, const uint8_t *codes, const uint8_t *recs, size_t n,
                           int G, const float *acc, const char *what0) {
    char what[200];
    for (int a = 0; a < 2; a++) {
        snprintf(what, sizeof what, "%s decode n=%zu accumulate=%d", what0, n, a);
        float *o0 = dup_f32(acc, n), *o1 = dup_f32(acc, n);
        echo_cpu_rec_decode(&echo_cpu_codec_scalar, form, codes, recs, n, G, o0, a);
        echo_cpu_rec_decode(t, form, codes, recs, n, G, o1, a);
        cmp_f32(o0, o1, n, form == ECHO_FORM_HOUT2 || form == ECHO_FORM_HNF3, what, "value");
        free(o0);
        free(o1);
    }
}

/* The record forms (out2, hout2, hsub6): encode with every residual use,
 * then decode what was encoded and random wire bytes (any scale, outlier
 * and index byte). */
START_TEST(test_records_match_scalar) {
    const echo_cpu_codec *tabs[4];
    int nt = vector_tables(tabs);
    const size_t ngs[] = {1, 2, 3, 8, 9, 17};
    size_t ntests = 0;
    for (int ti = 0; ti < nt; ti++)
        for (size_t fi = 0; fi < sizeof rec_forms / sizeof *rec_forms; fi++)
            for (int gi = 0; gi < 5; gi++) {
                int G = groups[gi], form = rec_forms[fi].form;
                if (G < rec_forms[fi].min_group) continue;
                size_t rb = (size_t)echo_rec_bytes(form, G);
                for (size_t ni = 0; ni < sizeof ngs / sizeof *ngs; ni++)
                    for (size_t ki = 0; ki < sizeof kind_masks / sizeof *kind_masks; ki++) {
                        /* cb: the form's code bytes (3n/8 for hnf3); the buffers hold n/2 for gen_wire */
                        size_t ng = ngs[ni], n = ng * (size_t)G, cb = echo_form_code_bytes(form, n);
                        uint64_t seed = 4241u * (uint64_t)G + 17u * ni + ki + 100003u * fi;
                        float *y = malloc(n * 4), *res = malloc(n * 4), *acc = malloc(n * 4);
                        gen(y, n, G, seed, kind_masks[ki]);
                        gen(res, n, G, seed ^ 0xabcdef, ki == 8 ? 0xff : 0x01);
                        gen(acc, n, G, seed ^ 0x777, ki == 8 ? 0xff : 0x61);
                        for (size_t i = 0; ki != 8 && i < n; i++)
                            res[i] *= 0x1p-8f * fabsf(y[i]);
                        /* with the ties kind, sub-group k's largest |y| is 7 S 2^-(k%4): 7 s(e) meets it
                         * exactly at e = 4(k%4), where hsub6's search must take >= */
                        for (size_t i = 0; ki == 4 && i < n; i++)
                            y[i] = ldexpf(y[i], -(int)(i / ECHO_SUB % 4));
                        char what[160];
                        uint8_t *c0 = alloc_fill(n / 2, 0x5a), *c1 = alloc_fill(n / 2, 0x5a);
                        uint8_t *e0 = alloc_fill(ng * rb, 0x5a), *e1 = alloc_fill(ng * rb, 0x5a);
                        for (int rm = 0; rm < 3; rm++) { /* residual: none, written only, carried in and written */
                            snprintf(what, sizeof what, "%s %s G=%d n=%zu kinds=%#x res=%d", tabs[ti]->name,
                                     rec_forms[fi].name, G, n, kind_masks[ki], rm);
                            float *r0 = rm ? dup_f32(res, n) : NULL, *r1 = rm ? dup_f32(res, n) : NULL;
                            size_t b0 = 1, b1 = 2;
                            size_t p0 = echo_cpu_rec_encode(&echo_cpu_codec_scalar, form, y, r0, rm == 2, n, G, c0, e0, &b0);
                            size_t p1 = echo_cpu_rec_encode(tabs[ti], form, y, r1, rm == 2, n, G, c1, e1, &b1);
                            ck_assert_msg(p0 == p1 && b0 == b1, "%s: poisoned %zu/%zu, first bad %zu/%zu", what, p0, p1,
                                          b0, b1);
                            cmp_u8(c0, c1, cb, what, "codes");
                            cmp_u8(e0, e1, ng * rb, what, "records");
                            if (rm) cmp_f32(r0, r1, n, 0, what, "residual");
                            free(r0);
                            free(r1);
                            ntests++;
                        }
                        cmp_rec_decode(tabs[ti], form, c0, e0, n, G, acc, what);
                        /* random wire: any byte, scales of every kind (gen_wire's) */
                        uint16_t *sc = malloc(ng * 2);
                        gen_wire(c0, sc, ng, G, seed ^ 0x99);
                        uint64_t s = seed;
                        for (size_t g = 0; g < ng; g++) {
                            for (size_t k = 0; k < rb; k++)
                                e0[g * rb + k] = (uint8_t)rng_next(&s);
                            e0[g * rb] = (uint8_t)sc[g];
                            e0[g * rb + 1] = (uint8_t)(sc[g] >> 8);
                        }
                        cmp_rec_decode(tabs[ti], form, c0, e0, n, G, acc, what);
                        cmp_rec_decode(tabs[ti], form, c0, e0, n - 3, G, acc, what); /* partial last group */
                        ntests += 3;
                        free(sc);
                        free(c0);
                        free(c1);
                        free(e0);
                        free(e1);
                        free(y);
                        free(res);
                        free(acc);
                    }
            }
    if (nt) ck_assert_uint_gt(ntests, 1000);
}
END_TEST

/* The scales of test_records_at_code_boundaries: */
static const int boundary_exps[] = {0, 1, 2, 3, 20, 100, 126, 127, 128, 160, 200, 240, 248};

/* Group g's scale there: every bf16 mantissa (g % 128) at each exponent, 0 made 1. */
static uint16_t boundary_scale(size_t g) {
    uint16_t sb = (uint16_t)(boundary_exps[g / 128] << 7 | (g % 128));
    return sb ? sb : 1;
}

/* The codes at and next to every half-integer y/s (the reciprocal's
 * check in codec_avx512.c must catch each), over every bf16 mantissa of
 * the scale at many exponents, subnormal scales included: out2 codes y/s
 * directly (two outliers of 7.5 s first, then 7 s setting the scale s),
 * hout2 the same groups rotated, int4 the same values under 7 s. */
START_TEST(test_records_at_code_boundaries) {
    const echo_cpu_codec *tabs[4];
    int nt = vector_tables(tabs);
    const int G = 128;
    size_t ng = 128 * sizeof boundary_exps / sizeof *boundary_exps, n = ng * (size_t)G, ntests = 0;
    float *y = malloc(n * 4), *res = malloc(n * 4);
    for (size_t g = 0; g < ng; g++) {
        float sc = echo_bf16_to_f32(boundary_scale(g)), *v = y + g * (size_t)G;
        v[0] = 7.5f * sc, v[1] = -7.5f * sc, v[2] = 7.0f * sc;
        for (int i = 3; i < G; i++) {
            int b = (i - 3) / 9, st = (i - 3) % 9 - 4; /* boundary b: +-(b/2 + 1/2), st steps off it */
            float h = (float)(b / 2) + 0.5f;
            if (h > 6.5f) h = 6.5f;
            float t = (b & 1 ? -h : h) * sc;
            for (; st > 0; st--)
                t = nextafterf(t, INFINITY);
            for (; st < 0; st++)
                t = nextafterf(t, -INFINITY);
            v[i] = t;
        }
    }
    for (size_t i = 0; i < n; i++)
        res[i] = 0.0f;
    const int forms[] = {ECHO_FORM_OUT2, ECHO_FORM_HOUT2};
    for (int ti = 0; ti < nt; ti++)
        for (int fi = 0; fi < 2; fi++) {
            char what[96];
            snprintf(what, sizeof what, "%s %s at code boundaries", tabs[ti]->name, fi ? "hout2" : "out2");
            size_t cb = n / 2, rb = ng * ECHO_OUT2_REC, b0 = 1, b1 = 2;
            uint8_t *c0 = alloc_fill(cb, 0x5a), *c1 = alloc_fill(cb, 0x5a);
            uint8_t *e0 = alloc_fill(rb, 0x5a), *e1 = alloc_fill(rb, 0x5a);
            float *r0 = dup_f32(res, n), *r1 = dup_f32(res, n);
            size_t p0 = echo_cpu_rec_encode(&echo_cpu_codec_scalar, forms[fi], y, r0, 1, n, G, c0, e0, &b0);
            size_t p1 = echo_cpu_rec_encode(tabs[ti], forms[fi], y, r1, 1, n, G, c1, e1, &b1);
            /* (hout2's rotated sums overflow at the largest scales: poisoned, alike) */
            ck_assert_msg(p0 == p1 && b0 == b1 && (fi || p0 == 0), "%s: poisoned %zu/%zu", what, p0, p1);
            cmp_u8(c0, c1, cb, what, "codes");
            cmp_u8(e0, e1, rb, what, "records");
            cmp_f32(r0, r1, n, 0, what, "residual");
            for (size_t g = 0; fi == 0 && g < ng; g++) /* the scale is s: the boundaries were hit */
                ck_assert_msg(e0[g * ECHO_OUT2_REC + 6] == 0 && e0[g * ECHO_OUT2_REC + 7] == 1, "%s: outliers of %zu",
                              what, g);
            free(c0);
            free(c1);
            free(e0);
            free(e1);
            free(r0);
            free(r1);
            ntests++;
        }
    /* int4 on the same boundaries: 7 s (not two outliers) sets the scale s */
    for (size_t g = 0; g < ng; g++) {
        float sc = echo_bf16_to_f32(boundary_scale(g));
        y[g * (size_t)G] = 7.0f * sc, y[g * (size_t)G + 1] = -7.0f * sc, y[g * (size_t)G + 2] = 0.0f;
    }
    { /* the scale is s: the boundaries are hit */
        uint8_t *c = malloc(n / 2);
        uint16_t *sc = malloc(ng * 2);
        size_t b;
        ck_assert_uint_eq(echo_cpu_codec_scalar.encode(y, ECHO_F32, NULL, 0, ECHO_RESID_F32, n, G, c, sc, &b), 0);
        for (size_t g = 0; g < ng; g++)
            ck_assert_msg(sc[g] == boundary_scale(g), "int4 at code boundaries: scale of %zu", g);
        free(c);
        free(sc);
    }
    for (int ti = 0; ti < nt; ti++) {
        char what[96];
        snprintf(what, sizeof what, "%s int4 at code boundaries", tabs[ti]->name);
        cmp_encode(tabs[ti], y, ECHO_F32, res, 2, ECHO_RESID_F32, n, G, what);
        ntests++;
    }
    /* hout2 decoded where codec_avx512.c's exact inverse rotation stops (s
     * at 2^125 / G) and around it, with the largest sums of codes (all -8,
     * all 7) and mixed ones, zero, subnormal, negative and non-finite scales */
    const uint16_t scales[] = {0x7a7f, 0x7a80, 0x7a81, 0x7a00, 0x7a01, 0x79ff, 0x7aff, 0x7b00, 0x7b7f, 0x7b80, 0x0001,
                               0x007f, 0x0080, 0x3f80, 0x0000, 0x8000, 0x8001, 0xfa7f, 0x7f80, 0xff80, 0x7fc0, 0x7f7f};
    const uint8_t fills[] = {0x88, 0x77, 0x78, 0x87, 0x8f, 0x00};
    const size_t nsc = sizeof scales / sizeof *scales, dg = nsc * sizeof fills / sizeof *fills;
    for (int dgi = 0; dgi < 3; dgi++) {
        int DG = dgi == 0 ? 16 : dgi == 1 ? 128 : 256;
        uint8_t *codes = malloc(dg * (size_t)DG / 2), *recs = malloc(dg * ECHO_OUT2_REC);
        float *acc = malloc(dg * (size_t)DG * 4);
        for (size_t g = 0; g < dg; g++) {
            uint16_t sb = scales[g % nsc];
            memset(codes + g * (size_t)DG / 2, fills[g / nsc], (size_t)DG / 2);
            uint8_t r8[ECHO_OUT2_REC] = {(uint8_t)sb, (uint8_t)(sb >> 8), 0x80, 0x3f, 0x00, 0xc0, (uint8_t)g, 5};
            memcpy(recs + g * ECHO_OUT2_REC, r8, sizeof r8);
        }
        gen(acc, dg * (size_t)DG, DG, 99, 0x01);
        for (int ti = 0; ti < nt; ti++) {
            char what[96];
            snprintf(what, sizeof what, "%s hout2 G=%d decode at the exact inverse's edges", tabs[ti]->name, DG);
            cmp_rec_decode(tabs[ti], ECHO_FORM_HOUT2, codes, recs, dg * (size_t)DG, DG, acc, what);
            ntests++;
        }
        free(codes);
        free(recs);
        free(acc);
    }
    free(y);
    free(res);
    if (nt) ck_assert_uint_ge(ntests, 3);
}
END_TEST

/* A group size outside 16..256 (never reaches the codec through the API,
 * which validates it) still behaves as the scalar table does. */
START_TEST(test_bad_group_matches_scalar) {
    const echo_cpu_codec *tabs[4];
    int nt = vector_tables(tabs);
    float x[64] = {1.0f}, r[64] = {0};
    uint8_t c[64];
    uint16_t s[8];
    for (int ti = 0; ti < nt; ti++) {
        size_t b0, b1;
        size_t p0 = echo_cpu_codec_scalar.encode(x, ECHO_F32, r, 1, ECHO_RESID_F32, 64, 48, c, s, &b0);
        size_t p1 = tabs[ti]->encode(x, ECHO_F32, r, 1, ECHO_RESID_F32, 64, 48, c, s, &b1);
        ck_assert(p0 == p1 && b0 == b1);
        p0 = echo_cpu_codec_scalar.decode_store(c, s, 64, 48, x, ECHO_F32, &b0);
        p1 = tabs[ti]->decode_store(c, s, 64, 48, x, ECHO_F32, &b1);
        ck_assert(p0 == p1 && b0 == b1);
    }
}
END_TEST

/* The wire-form table (echo_codec.h's rows, forms.c's descriptors) agrees
 * with itself and with the codec table (comm/preset.c): each form's code
 * bytes are G * code_bits / 8, and a lossy codec's group bytes are its
 * form's codes plus its record. */
START_TEST(test_form_table) {
    int n;
    const echo_form_desc *d = echo_form_all(&n);
    ck_assert_int_ge(n, 5);
    for (int k = 0; k < n; k++) {
        ck_assert_ptr_eq(echo_form_get(d[k].id), &d[k]); /* ids unique */
        ck_assert(d[k].name && d[k].code_bits >= 1 && d[k].code_bits <= 8);
        ck_assert_int_eq(echo_form_code_bits(d[k].id), d[k].code_bits);
        ck_assert(echo_form_known(d[k].id));
        for (int gi = 0; gi < 5; gi++) {
            int G = groups[gi];
            ck_assert_int_eq(d[k].rec_bytes(G), echo_rec_bytes(d[k].id, G));
            ck_assert_int_ge(d[k].rec_bytes(G), 2); /* every record starts with the bf16 scale */
            ck_assert_uint_eq(echo_form_code_bytes(d[k].id, (size_t)G), (size_t)G * (size_t)d[k].code_bits / 8);
        }
        for (int i = 0; i < ECHO_ISA_COUNT; i++) {
            const echo_form_fast *f = &d[k].fast[i];
            ck_assert_msg(!f->enc == !f->dec, "%s: isa %d has half a fast path", d[k].name, i);
            ck_assert(!f->enc || (i != ECHO_ISA_SCALAR && f->min_group >= ECHO_MIN_GROUP &&
                                  f->min_group <= ECHO_MAX_GROUP && !(f->min_group & (f->min_group - 1))));
        }
    }
    ck_assert_ptr_null(echo_form_get(99));
    for (int id = ECHO_CODEC_DEFAULT + 1; id < ECHO_CODEC_COUNT; id++) {
        const echo_codec_info *ci = echo_codec_get((echo_codec_id)id);
        if (ci->lossless) continue;
        const echo_form_desc *f = echo_form_get(ci->form);
        ck_assert_msg(f != NULL, "codec %s: form %d has no row", ci->name, ci->form);
        ck_assert_msg(ci->code_bits == f->code_bits, "codec %s: %d code bits, its form %d", ci->name, ci->code_bits,
                      f->code_bits);
        for (int G = ci->min_group; G <= ECHO_MAX_GROUP; G *= 2)
            ck_assert_msg(echo_codec_group_bytes((echo_codec_id)id, G) ==
                              (size_t)G * (size_t)f->code_bits / 8 + (size_t)f->rec_bytes(G),
                          "codec %s G=%d: group bytes %zu", ci->name, G, echo_codec_group_bytes((echo_codec_id)id, G));
    }
}
END_TEST

/* The int4 row's group functions are the int4 codec (echo_codec_encode /
 * _decode, the host's own loops): the same wire bytes, residuals and
 * values, an all-zero group included. */
START_TEST(test_int4_row_is_the_int4_codec) {
    const echo_form_desc *d = echo_form_get(ECHO_FORM_INT4);
    ck_assert_ptr_nonnull(d);
    for (int gi = 0; gi < 5; gi++) {
        int G = groups[gi];
        enum { NG = 9 };
        size_t n = NG * (size_t)G;
        float *x = malloc(n * 4), *r0 = malloc(n * 4), *r1 = malloc(n * 4), *o0 = malloc(n * 4), *o1 = malloc(n * 4);
        uint8_t *wire = malloc(n / 2 + 2 * NG), *codes = malloc(n / 2), *recs = malloc(2 * NG);
        gen(x, n, G, 77u + (uint64_t)G, 0x95);
        for (int i = 0; i < G; i++)
            x[3 * (size_t)G + (size_t)i] = (i & 1) ? -0.0f : 0.0f;
        for (size_t i = 0; i < n; i++)
            r0[i] = r1[i] = 0x1p-9f * rng_unif(&(uint64_t){i + 1});
        char err[200];
        ck_assert_msg(!echo_codec_encode(x, r0, n, G, wire, err, sizeof err), "%s", err);
        for (size_t g = 0; g < NG; g++) {
            float y[ECHO_MAX_GROUP];
            for (int i = 0; i < G; i++)
                y[i] = x[g * (size_t)G + (size_t)i] + r1[g * (size_t)G + (size_t)i];
            d->enc_group(y, G, codes + g * (size_t)G / 2, recs + 2 * g, r1 + g * (size_t)G, G);
            d->dec_group(codes + g * (size_t)G / 2, recs + 2 * g, G, o1 + g * (size_t)G);
        }
        echo_codec_decode(wire, n, G, o0, 0);
        ck_assert_msg(!memcmp(wire, codes, n / 2) && !memcmp(wire + n / 2, recs, 2 * NG), "G=%d: wire bytes differ", G);
        ck_assert_msg(!memcmp(r0, r1, n * 4), "G=%d: residuals differ", G);
        ck_assert_msg(!memcmp(o0, o1, n * 4), "G=%d: decoded values differ", G);
        free(x), free(r0), free(r1), free(o0), free(o1), free(wire), free(codes), free(recs);
    }
}
END_TEST

/* hnf3 decodes in the AVX-512 table's own loop (not AVX2's), bit for bit
 * the scalar one's: coded groups (every residual use) and random codes,
 * outliers and index bytes under finite scales (no NaN latitude here). */
START_TEST(test_hnf3_avx512_decode) {
#ifdef ECHO_HAVE_CODEC_AVX512
    ck_assert(echo_form_get(ECHO_FORM_HNF3)->fast[ECHO_ISA_AVX512].dec == echo_avx512_hnf3_dec);
    if (!have_avx512()) {
        fprintf(stderr, "test_codec_simd: no AVX-512; hnf3's AVX-512 decode not run\n");
        return;
    }
    const int gs[] = {64, 128, 256};
    for (int gi = 0; gi < 3; gi++)
        for (int kind = 0; kind < 2; kind++)
            for (int a = 0; a < 2; a++) {
                int G = gs[gi];
                enum { NG = 11 };
                size_t n = NG * (size_t)G, cb = n / 8 * 3;
                float *y = malloc(n * 4), *acc = malloc(n * 4), *o0 = malloc(n * 4), *o1 = malloc(n * 4);
                uint8_t *codes = malloc(cb), *recs = malloc(NG * ECHO_OUT2_REC);
                uint64_t s = 1234u + (uint64_t)G * 7u + (uint64_t)kind;
                gen(acc, n, G, s ^ 0x55, 0x01);
                if (kind == 0) {
                    gen(y, n, G, s, 0x95);
                    size_t bad;
                    ck_assert_uint_eq(echo_scalar_rec_encode(ECHO_FORM_HNF3, y, NULL, 0, n, G, codes, recs, &bad), 0);
                } else {
                    for (size_t i = 0; i < cb; i++)
                        codes[i] = (uint8_t)rng_next(&s);
                    for (size_t g = 0; g < NG; g++) {
                        uint8_t *r = recs + g * ECHO_OUT2_REC;
                        uint16_t sc = echo_f32_to_bf16(ldexpf(1.0f + 0.5f * rng_unif(&s), (int)(rng_next(&s) % 80) - 40));
                        uint16_t o1 = echo_f32_to_bf16(rng_unif(&s) * 100.0f), o2 = echo_f32_to_bf16(rng_unif(&s));
                        uint8_t r8[8] = {(uint8_t)sc, (uint8_t)(sc >> 8), (uint8_t)o1, (uint8_t)(o1 >> 8),
                                         (uint8_t)o2, (uint8_t)(o2 >> 8), (uint8_t)rng_next(&s), (uint8_t)rng_next(&s)};
                        memcpy(r, r8, 8);
                    }
                }
                memcpy(o0, acc, n * 4);
                memcpy(o1, acc, n * 4);
                echo_scalar_rec_decode(ECHO_FORM_HNF3, codes, recs, n, G, o0, a);
                echo_cpu_rec_decode(&echo_cpu_codec_avx512, ECHO_FORM_HNF3, codes, recs, n, G, o1, a);
                for (size_t i = 0; i < n; i++)
                    ck_assert_msg(!memcmp(&o0[i], &o1[i], 4), "G=%d kind=%d accumulate=%d: value %zu: %a vs %a", G,
                                  kind, a, i, (double)o0[i], (double)o1[i]);
                free(y), free(acc), free(o0), free(o1), free(codes), free(recs);
            }
#else
    fprintf(stderr, "test_codec_simd: no AVX-512 table in this build\n");
#endif
}
END_TEST

int main(void) {
    Suite *s = suite_create("codec_simd");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_dispatch);
    tcase_add_test(tc, test_encode_matches_scalar);
    tcase_add_test(tc, test_decode_matches_scalar);
    tcase_add_test(tc, test_bad_group_matches_scalar);
    tcase_add_test(tc, test_rotation_matches_scalar);
    tcase_add_test(tc, test_records_match_scalar);
    tcase_add_test(tc, test_records_at_code_boundaries);
    tcase_add_test(tc, test_unknown_form_is_poison);
    tcase_add_test(tc, test_form_table);
    tcase_add_test(tc, test_int4_row_is_the_int4_codec);
    tcase_add_test(tc, test_hnf3_avx512_decode);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
