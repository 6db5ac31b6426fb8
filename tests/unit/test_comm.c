/*
 * comm/ (Echo) on the local transport, against an fp64 sum and against the
 * codec's own arithmetic reproduced here from the public codec calls.
 *
 *   1. codec: per-element error <= s/2, exact wire size, residual bits,
 *      zero groups, dynamic range, subnormals, inf/nan/out-of-range.
 *   2. every rank's output bit-identical in every mode and dtype; exact
 *      within recursive-summation rounding of the fp64 sum.
 *   3. one int4 call reproduced bit for bit and within its per-element
 *      bound (docs/echo.md, "One call").
 *   4. depth independence: K chained calls (K up to 144); echo's
 *      accumulated error stays within the one-call bound, int4's grows like
 *      sqrt(K) (docs/echo.md, "Depth").
 *   5. pass/slot lifecycle, size policy, errors, statistics.
 * Rank threads never call ck_assert (Check's longjmp is per process): they
 * record status and messages, the test thread asserts.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/codec/codec.h"
#include "comm/echo.h"
#include "comm/codec/echo_codec.h"
#include "comm/echo_internal.h" /* the local transport's memory table (section 6) */
#include "comm/transport/transport.h"
#include "tests/comm_preset.h"
#include "tests/unit/testutil.h"

#define MAXN 8

/* ---- deterministic inputs: a counter-based generator, so any thread can
 * regenerate any rank's input of any call ---- */

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float unif(uint64_t seed, uint64_t call, uint64_t rank, uint64_t i) {
    uint64_t h = mix(seed * 0x100000001b3ull ^ mix(call * 131 + rank) ^ (i * 0x9e3779b97f4a7c15ull));
    return (float)((h >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

static void gen(float *x, size_t n, uint64_t seed, uint64_t call, uint64_t rank) {
    for (size_t i = 0; i < n; i++)
        x[i] = unif(seed, call, rank, i);
}

/* ---- a world and its ranks ---- */

typedef struct harness {
    int n;
    echo_world *w;
    echo_comm *c[MAXN];
} harness;

static void h_init(harness *h, int n, echo_config cfg) {
    char err[256];
    memset(h, 0, sizeof *h);
    h->n = n;
    ck_assert_msg(echo_world_create_local(n, &cfg, &h->w, err, sizeof err) == 0, "%s", err);
    for (int r = 0; r < n; r++)
        ck_assert_msg(echo_comm_create(h->w, r, &h->c[r], err, sizeof err) == 0, "%s", err);
}

static void h_free(harness *h) {
    for (int r = 0; r < h->n; r++)
        echo_comm_destroy(h->c[r]);
    echo_world_destroy(h->w);
}

/* One collective step on every rank: optionally begin a pass, then call. */
typedef struct step {
    harness *h;
    int begin;
    int site[MAXN];
    size_t count[MAXN];
    echo_dtype dt;
    void *buf[MAXN];
    int rc[MAXN];
    char err[MAXN][320];
} step;

typedef struct rank_arg {
    step *s;
    int r;
} rank_arg;

static void *step_rank(void *p) {
    rank_arg *a = p;
    step *s = a->s;
    int r = a->r;
    s->rc[r] = 0;
    if (s->begin) s->rc[r] = echo_begin_pass(s->h->c[r], ECHO_PASS_EAGER, s->err[r], sizeof s->err[r]);
    if (!s->rc[r])
        s->rc[r] =
            echo_allreduce(s->h->c[r], s->site[r], s->buf[r], s->count[r], s->dt, NULL, s->err[r], sizeof s->err[r]);
    return NULL;
}

static void run_step(step *s) {
    pthread_t t[MAXN];
    rank_arg a[MAXN];
    for (int r = 0; r < s->h->n; r++) {
        a[r] = (rank_arg){s, r};
        ck_assert_int_eq(pthread_create(&t[r], NULL, step_rank, &a[r]), 0);
    }
    for (int r = 0; r < s->h->n; r++)
        pthread_join(t[r], NULL);
}

/* All ranks call `site` with the same count. */
static void call_all(harness *h, int begin, int site, size_t count, echo_dtype dt, void **buf, step *s) {
    memset(s, 0, sizeof *s);
    s->h = h;
    s->begin = begin;
    s->dt = dt;
    for (int r = 0; r < h->n; r++) {
        s->site[r] = site;
        s->count[r] = count;
        s->buf[r] = buf[r];
    }
    run_step(s);
}

static void assert_all_ok(const step *s) {
    for (int r = 0; r < s->h->n; r++)
        ck_assert_msg(s->rc[r] == 0, "rank %d: %s", r, s->err[r]);
}

static void assert_all_fail(const step *s, const char *needle) {
    for (int r = 0; r < s->h->n; r++) {
        ck_assert_msg(s->rc[r] != 0, "rank %d unexpectedly succeeded", r);
        ck_assert_msg(strstr(s->err[r], needle), "rank %d: '%s' lacks '%s'", r, s->err[r], needle);
    }
}

static uint16_t to_bf16(float f) {
    return echo_f32_to_bf16(f);
}
static float from_bf16(uint16_t h) {
    return echo_bf16_to_f32(h);
}

/* ================= 1. codec ================= */

static const int groups[] = {16, 32, 64, 128, 256};

/* Encode/decode x (with and without residual) and check every promise. */
static void check_codec(const float *x, size_t n, int G) {
    char err[256];
    size_t wb = echo_codec_wire_bytes(n, G), ng = (n + G - 1) / G;
    ck_assert_uint_eq(wb, ng * ((size_t)G / 2 + 2));
    uint8_t *wire = malloc(wb + 16);
    float *out = malloc((n + 1) * sizeof *out), *res = calloc(n + 1, sizeof *res);
    memset(wire, 0xA5, wb + 16);
    ck_assert_msg(echo_codec_encode(x, res, n, G, wire, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 16; i++)
        ck_assert_uint_eq(wire[wb + i], 0xA5); /* nothing past the wire size */
    echo_codec_decode(wire, n, G, out, 0);
    for (size_t g = 0; g < ng; g++) {
        float s = echo_codec_group_scale(wire, n, G, g);
        size_t m = n - g * G < (size_t)G ? n - g * G : (size_t)G;
        float amax = 0;
        for (size_t i = 0; i < m; i++)
            amax = fmaxf(amax, fabsf(x[g * G + i]));
        ck_assert(isfinite(s) && s >= 0);
        /* 7s covers the absmax; rounding the scale up costs < 2^-7. */
        ck_assert_msg((double)s * 7 >= (double)amax * (1 - 1e-7), "7s=%g < absmax %g", (double)s * 7, (double)amax);
        if (amax > 1e-37f) ck_assert((double)s <= (double)amax / 7 * (1 + 1.0 / 128) * (1 + 1e-7));
        if (amax == 0) ck_assert(s == 0);
        int qmax = 0;
        for (size_t i = 0; i < m; i++) {
            size_t e = g * G + i;
            uint8_t b = wire[e / 2];
            int q = e % 2 ? echo_nib_hi(b) : echo_nib_lo(b);
            ck_assert(q >= -7 && q <= 7);
            qmax = abs(q) > qmax ? abs(q) : qmax;
            ck_assert(out[e] == (float)q * s); /* decode is q*s, exactly */
            double d = fabs((double)x[e] - out[e]);
            ck_assert_msg(d <= (double)s * (0.5 + 0x1p-21), "elem %zu: |%g - %g| > s/2 = %g", e, (double)x[e],
                          (double)out[e], (double)s / 2);
            ck_assert(res[e] == x[e] - out[e]); /* residual is the exact rounding error */
        }
        if (amax > 1e-37f) ck_assert_int_eq(qmax, 7); /* the largest value uses the full range */
        for (size_t i = m; i < (size_t)G; i++) {      /* padding codes are zero */
            size_t e = g * G + i;
            ck_assert_int_eq(e % 2 ? echo_nib_hi(wire[e / 2]) : echo_nib_lo(wire[e / 2]), 0);
        }
    }
    /* Error feedback: encoding again with the residual codes x + res. */
    float *y = malloc((n + 1) * sizeof *y), *res2 = malloc((n + 1) * sizeof *res2), *out2 = malloc((n + 1) * 4);
    for (size_t i = 0; i < n; i++) {
        y[i] = x[i] + res[i];
        res2[i] = res[i];
    }
    ck_assert(echo_codec_encode(x, res2, n, G, wire, err, sizeof err) == 0);
    echo_codec_decode(wire, n, G, out2, 0);
    for (size_t i = 0; i < n; i++)
        ck_assert(res2[i] == y[i] - out2[i]);
    /* decode accumulate adds */
    for (size_t i = 0; i < n; i++)
        out[i] = 1.0f;
    echo_codec_decode(wire, n, G, out, 1);
    for (size_t i = 0; i < n; i++)
        ck_assert(out[i] == 1.0f + out2[i]);
    free(y);
    free(res2);
    free(out2);
    free(wire);
    free(out);
    free(res);
}

START_TEST(test_codec_bound_and_size) {
    const size_t counts[] = {1, 15, 17, 1000, 4099};
    for (int seed = 1; seed <= 3; seed++)
        for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
            for (int gi = 0; gi < 5; gi++) {
                size_t n = counts[ci];
                float *x = malloc(n * sizeof *x);
                /* mixed magnitudes: each group its own decade */
                for (size_t i = 0; i < n; i++)
                    x[i] = unif(seed, ci, gi, i) * powf(10.0f, (float)((i / 37) % 9) - 4.0f);
                check_codec(x, n, groups[gi]);
                free(x);
            }
}
END_TEST

START_TEST(test_codec_edge_cases) {
    char err[256];
    float x[256];
    /* all zero, and signed zeros */
    for (int i = 0; i < 64; i++)
        x[i] = i % 2 ? -0.0f : 0.0f;
    check_codec(x, 64, 32);
    /* huge dynamic range inside a group: the small values round to 0, within s/2 */
    for (int i = 0; i < 64; i++)
        x[i] = i == 5 ? 1e30f : (i % 3 ? 1e-30f : -3e-20f);
    check_codec(x, 64, 64);
    /* across groups: a 1e-30 group keeps full relative accuracy beside a 1e30 group */
    for (int i = 0; i < 128; i++)
        x[i] = unif(9, 0, 0, i) * (i < 64 ? 1e-30f : 1e30f);
    check_codec(x, 128, 64);
    /* near the top of the range (|x| < 2^127): 7s must not overflow */
    for (int i = 0; i < 32; i++)
        x[i] = (i % 2 ? -1.7e38f : 1.6e38f) * (0.5f + 0.01f * (float)i);
    check_codec(x, 32, 32);
    /* subnormals: groups of 1e-40, of the smallest subnormal, mixed with zero */
    for (int i = 0; i < 96; i++)
        x[i] = i < 32 ? 1e-40f * unif(3, 1, 0, i) : (i < 64 ? (i % 2 ? 1.4e-45f : -1.4e-45f) : (i % 5 ? 0 : 3e-39f));
    check_codec(x, 96, 32);
    uint8_t wire[256];
    ck_assert(echo_codec_encode(x, NULL, 32, 32, wire, err, sizeof err) == 0);
    ck_assert(echo_codec_group_scale(wire, 32, 32, 0) > 0); /* never a zero scale for a nonzero group */

    /* non-finite and out-of-range input: detected and reported with its position */
    const float bad[] = {INFINITY, -INFINITY, NAN, 3e38f, -2e38f};
    for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
        for (int i = 0; i < 100; i++)
            x[i] = unif(4, b, 0, i);
        x[77] = bad[b];
        ck_assert(echo_codec_encode(x, NULL, 100, 32, wire, err, sizeof err) != 0);
        ck_assert_msg(strstr(err, "element 77"), "%s", err);
    }
    /* a residual that turns a finite input non-finite is caught too */
    float res[4] = {0, INFINITY, 0, 0}, x4[4] = {1, 2, 3, 4};
    ck_assert(echo_codec_encode(x4, res, 4, 16, wire, err, sizeof err) != 0);
    /* illegal group sizes */
    ck_assert_uint_eq(echo_codec_wire_bytes(100, 48), 0);
    ck_assert_uint_eq(echo_codec_wire_bytes(100, 8), 0);
    ck_assert_uint_eq(echo_codec_wire_bytes(100, 512), 0);
    ck_assert(echo_codec_encode(x, NULL, 10, 48, wire, err, sizeof err) != 0);
    ck_assert_ptr_nonnull(strstr(err, "48"));
    /* wire cost: G/2 bytes + a 16-bit scale per group */
    ck_assert_uint_eq(echo_codec_wire_bytes(1 << 20, 32) * 8, (size_t)(1 << 20) * 9 / 2); /* 4.5 bits */
    ck_assert_uint_eq(echo_codec_wire_bytes(1 << 20, 64) * 32, (size_t)(1 << 20) * 17);   /* 4.25 bits */
    ck_assert_uint_eq(echo_codec_wire_bytes(0, 64), 0);
}
END_TEST

START_TEST(test_codec_arithmetic) {
    /* bf16: round to nearest even, and NaN stays NaN whatever its payload */
    ck_assert_uint_eq(to_bf16(1.0f), 0x3f80);
    uint32_t u = 0x3f808000u; /* halfway: ties to even (down) */
    float f;
    memcpy(&f, &u, 4);
    ck_assert_uint_eq(to_bf16(f), 0x3f80);
    u = 0x3f818000u; /* halfway: ties to even (up) */
    memcpy(&f, &u, 4);
    ck_assert_uint_eq(to_bf16(f), 0x3f82);
    const uint32_t nans[] = {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0x7fc00000u};
    for (int i = 0; i < 4; i++) {
        memcpy(&f, &nans[i], 4);
        ck_assert(isnan(from_bf16(to_bf16(f))));
    }
    ck_assert(isinf(from_bf16(to_bf16(INFINITY))));
    /* scale: rounded up to bf16, floor at the smallest bf16 subnormal */
    ck_assert_uint_eq(echo_scale_from_absbits(0), 0);
    ck_assert_uint_eq(echo_scale_from_absbits(1), 1); /* 2^-149 / 7 underflows: 2^-133 instead */
    ck_assert(echo_scale_is_poison(echo_scale_from_absbits(echo_abs_bits(INFINITY))));
    ck_assert(echo_scale_is_poison(echo_scale_from_absbits(echo_abs_bits(NAN))));
    ck_assert(echo_scale_is_poison(echo_scale_from_absbits(ECHO_LIMIT_BITS)));
    ck_assert(!echo_scale_is_poison(echo_scale_from_absbits(ECHO_LIMIT_BITS - 1)));
    ck_assert_float_eq(from_bf16(echo_scale_from_absbits(echo_abs_bits(7.0f))), 1.0f);
    /* codes: round half to even, symmetric, clamped */
    ck_assert_int_eq(echo_quant(2.5f, 1.0f), 2);
    ck_assert_int_eq(echo_quant(3.5f, 1.0f), 4);
    ck_assert_int_eq(echo_quant(-2.5f, 1.0f), -2);
    ck_assert_int_eq(echo_quant(7.49f, 1.0f), 7);
    ck_assert_int_eq(echo_quant(-7.49f, 1.0f), -7);
    for (int lo = -7; lo <= 7; lo++)
        for (int hi = -7; hi <= 7; hi++) {
            uint8_t b = echo_pack2(lo, hi);
            ck_assert_int_eq(echo_nib_lo(b), lo);
            ck_assert_int_eq(echo_nib_hi(b), hi);
        }
}
END_TEST

/* ================= 2. bit-identical replicas; exact ================= */

static const int rank_counts[] = {2, 3, 4, 8};

START_TEST(test_replicas_identical_and_exact) {
    const size_t counts[] = {1, 7, 1000, 4097};
    /* modes exact, int4, echo with the int4 codec, then int4 and echo with
     * hadamard (G = 32), then with hsub6 and out2 (G = 64) */
    for (int ni = 0; ni < 4; ni++)
        for (int mv = 0; mv < 11; mv++)
            for (int dti = 0; dti < 2; dti++) {
                int n = rank_counts[ni], mode = mv < 3 ? mv : 1 + (mv - 3) % 2;
                echo_codec_id codec = mv < 3   ? ECHO_CODEC_INT4
                                      : mv < 5 ? ECHO_CODEC_HADAMARD
                                      : mv < 7 ? ECHO_CODEC_HSUB6
                                      : mv < 9 ? ECHO_CODEC_OUT2
                                               : ECHO_CODEC_HOUT2;
                echo_dtype dt = dti ? ECHO_BF16 : ECHO_F32;
                harness h;
                /* hout2 also below 64 (6 bits per value at G = 16) */
                int G = mv < 5 ? 32 : mv == 9 ? 16 : mv == 10 ? 32 : 64;
                h_init(&h, n, test_echo_cfg((echo_preset)mode, G, 0, 4, 4097, 0, codec));
                for (size_t ci = 0; ci < 4; ci++) {
                    size_t m = counts[ci];
                    void *buf[MAXN];
                    float *x[MAXN];
                    for (int r = 0; r < n; r++) {
                        x[r] = malloc(m * sizeof(float));
                        gen(x[r], m, 100 + ci, mode, r);
                        buf[r] = malloc(m * 4);
                        for (size_t i = 0; i < m; i++) {
                            if (dt == ECHO_BF16) {
                                ((uint16_t *)buf[r])[i] = to_bf16(x[r][i]);
                                x[r][i] = from_bf16(((uint16_t *)buf[r])[i]);
                            } else {
                                ((float *)buf[r])[i] = x[r][i];
                            }
                        }
                    }
                    step s;
                    /* echo keeps one count per pass: a new pass per count */
                    call_all(&h, 1, 0, m, dt, buf, &s);
                    assert_all_ok(&s);
                    size_t esz = dt == ECHO_BF16 ? 2 : 4;
                    for (int r = 1; r < n; r++)
                        ck_assert_msg(memcmp(buf[0], buf[r], m * esz) == 0, "%s/%s n=%d m=%zu: rank %d differs",
                                      echo_preset_name((echo_preset)mode), echo_codec_get(codec)->name, n, m, r);
                    if (mode == ECHO_PRESET_EXACT) {
                        for (size_t i = 0; i < m; i++) {
                            double sum = 0, mag = 0;
                            for (int r = 0; r < n; r++) {
                                sum += x[r][i];
                                mag += fabs(x[r][i]);
                            }
                            double o = dt == ECHO_BF16 ? from_bf16(((uint16_t *)buf[0])[i]) : ((float *)buf[0])[i];
                            /* recursive fp32 summation: gamma_{N-1} sum|x|; bf16 adds its rounding */
                            double tol =
                                (n - 1) * 0x1p-24 * mag * (1 + 1e-6) + (dt == ECHO_BF16 ? 0x1p-8 * fabs(o) : 0);
                            ck_assert_msg(fabs(o - sum) <= tol, "exact n=%d i=%zu: %g vs %g", n, i, o, sum);
                        }
                    }
                    for (int r = 0; r < n; r++) {
                        free(x[r]);
                        free(buf[r]);
                    }
                }
                h_free(&h);
            }
}
END_TEST

/* Workers (echo_comm_set_workers) split each message at whole groups: the
 * same bits as the rank's thread alone, whatever the threads' order, and
 * the same first bad element. The runner starts nthreads - 1 threads per
 * call, which claim tasks from a counter, so spans finish out of order. */
typedef struct wk_job {
    echo_task_fn fn;
    void *arg;
    int ntasks;
    atomic_int next;
    atomic_int ran;
} wk_job;

static void *wk_thread(void *p) {
    wk_job *j = p;
    for (int t; (t = atomic_fetch_add(&j->next, 1)) < j->ntasks;) {
        j->fn(j->arg, t);
        atomic_fetch_add(&j->ran, 1);
    }
    return NULL;
}

static void wk_run(void *ctx, int ntasks, echo_task_fn fn, void *arg) {
    int nt = *(const int *)ctx;
    wk_job j = {fn, arg, ntasks, 0, 0};
    pthread_t t[8];
    for (int i = 0; i < nt - 1; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, wk_thread, &j), 0);
    wk_thread(&j);
    for (int i = 0; i < nt - 1; i++)
        pthread_join(t[i], NULL);
    ck_assert_int_eq(atomic_load(&j.ran), ntasks);
}

/* Two ranks of one int4 call, with and without workers: the same bits. */
static void workers_case(const echo_workers *wk, size_t m, int n) {
    harness h[2];
    void *buf[2][MAXN];
    float *x = malloc(m * sizeof(float));
    step s[2];
    for (int v = 0; v < 2; v++) {
        h_init(&h[v], n, test_echo_cfg(ECHO_PRESET_ECHO, 64, 0, 1, m, 0, ECHO_CODEC_INT4));
        for (int r = 0; r < n; r++) {
            if (v) echo_comm_set_workers(h[v].c[r], wk);
            gen(x, m, 3, 0, (uint64_t)r);
            buf[v][r] = malloc(m * sizeof(float));
            memcpy(buf[v][r], x, m * sizeof(float));
        }
        call_all(&h[v], 1, 0, m, ECHO_F32, buf[v], &s[v]);
        assert_all_ok(&s[v]);
    }
    for (int r = 0; r < n; r++) {
        ck_assert_msg(memcmp(buf[0][r], buf[1][r], m * sizeof(float)) == 0, "m=%zu rank %d: workers changed the bits",
                      m, r);
        for (int v = 0; v < 2; v++)
            free(buf[v][r]);
    }
    for (int v = 0; v < 2; v++)
        h_free(&h[v]);
    free(x);
}

START_TEST(test_workers_same_bits) {
    static int three = 3;
    const echo_workers wk = {3, wk_run, &three};
    /* many threads announced (three run): the span table caps the split
     * without leaving values out (shards of 2^20 values, 64 spans each) */
    const echo_workers many = {64, wk_run, &three};
    workers_case(&many, ((size_t)2 << 20) + 37, 2);
    const struct {
        echo_codec_id codec;
        int G;
    } cs[] = {{ECHO_CODEC_INT4, 64},  {ECHO_CODEC_HADAMARD, 32}, {ECHO_CODEC_HSUB6, 64},
              {ECHO_CODEC_OUT2, 128}, {ECHO_CODEC_HOUT2, 128}};
    for (int n = 2; n <= 4; n++)
        for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++)
            for (int dti = 0; dti < 2; dti++) {
                echo_dtype dt = dti ? ECHO_BF16 : ECHO_F32;
                size_t m = (size_t)n * 70001 + 37, esz = dti ? 2 : 4; /* 4 spans a shard, a partial group */
                harness h[2];
                for (int v = 0; v < 2; v++) {
                    h_init(&h[v], n, test_echo_cfg(ECHO_PRESET_ECHO, cs[k].G, 0, 2, m, 0, cs[k].codec));
                    for (int r = 0; v && r < n; r++)
                        echo_comm_set_workers(h[v].c[r], &wk);
                }
                void *buf[2][MAXN];
                float *x = malloc(m * sizeof(float));
                for (int v = 0; v < 2; v++)
                    for (int r = 0; r < n; r++)
                        buf[v][r] = malloc(m * esz);
                /* two passes of two sites (residuals carried), then a NaN in a late span */
                for (int call = 0; call < 5; call++) {
                    step s[2];
                    for (int v = 0; v < 2; v++) {
                        for (int r = 0; r < n; r++) {
                            gen(x, m, 7 + (uint64_t)call, (uint64_t)k, (uint64_t)r);
                            if (call == 4 && r == 1) x[m - 3 * m / (size_t)(4 * n)] = NAN;
                            for (size_t i = 0; i < m; i++)
                                if (dti)
                                    ((uint16_t *)buf[v][r])[i] = to_bf16(x[i]);
                                else
                                    ((float *)buf[v][r])[i] = x[i];
                        }
                        call_all(&h[v], call % 2 == 0, call % 2, m, dt, buf[v], &s[v]);
                    }
                    for (int r = 0; r < n; r++) {
                        const char *what = echo_codec_get(cs[k].codec)->name;
                        ck_assert_msg(s[0].rc[r] == s[1].rc[r], "%s n=%d call %d rank %d: rc %d vs %d", what, n, call,
                                      r, s[0].rc[r], s[1].rc[r]);
                        if (call == 4) {
                            ck_assert_msg(s[1].rc[r] != 0 && !strcmp(s[0].err[r], s[1].err[r]),
                                          "%s n=%d rank %d: '%s' vs '%s'", what, n, r, s[0].err[r], s[1].err[r]);
                            continue;
                        }
                        ck_assert_msg(s[1].rc[r] == 0, "%s: %s", what, s[1].err[r]);
                        ck_assert_msg(memcmp(buf[0][r], buf[1][r], m * esz) == 0,
                                      "%s/%s n=%d call %d rank %d: workers changed the bits", what,
                                      dti ? "bf16" : "f32", n, call, r);
                    }
                }
                for (int v = 0; v < 2; v++) {
                    for (int r = 0; r < n; r++)
                        free(buf[v][r]);
                    h_free(&h[v]);
                }
                free(x);
            }
}
END_TEST

/* ================= 3. one call: reproduced and bounded ================= */

/* The int4 schedule rebuilt from the public codec: every rank codes its
 * whole message (groups lie on the same global grid as the shards', which
 * start at multiples of G), the owner of shard c sums in order j = 0..N-1
 * (its own x raw), codes the sum, everyone decodes. Also the per-element
 * bound B_e = (sum_{j != c} s_j + s_z) / 2. */
static void int4_reference(int n, int G, size_t m, float *const *x, float *out, double *bound) {
    char err[256];
    size_t L = (m + (size_t)n * G - 1) / ((size_t)n * G) * G;
    uint8_t *w[MAXN];
    float *deq[MAXN];
    for (int j = 0; j < n; j++) {
        w[j] = malloc(echo_codec_wire_bytes(m, G));
        deq[j] = malloc(m * sizeof(float));
        ck_assert(echo_codec_encode(x[j], NULL, m, G, w[j], err, sizeof err) == 0);
        echo_codec_decode(w[j], m, G, deq[j], 0);
    }
    float *S = malloc(L * sizeof *S);
    uint8_t *wz = malloc(echo_codec_wire_bytes(L, G));
    for (int c = 0; c < n; c++) {
        size_t off = (size_t)c * L;
        if (off >= m) break;
        size_t len = m - off < L ? m - off : L;
        for (size_t i = 0; i < len; i++) {
            S[i] = c == 0 ? x[0][off + i] : deq[0][off + i];
            for (int j = 1; j < n; j++)
                S[i] += j == c ? x[j][off + i] : deq[j][off + i];
        }
        ck_assert(echo_codec_encode(S, NULL, len, G, wz, err, sizeof err) == 0);
        echo_codec_decode(wz, len, G, out + off, 0);
        for (size_t i = 0; i < len; i++) {
            double b = echo_codec_group_scale(wz, len, G, i / G);
            for (int j = 0; j < n; j++)
                if (j != c) b += echo_codec_group_scale(w[j], m, G, (off + i) / G);
            bound[off + i] = b / 2;
        }
    }
    for (int j = 0; j < n; j++) {
        free(w[j]);
        free(deq[j]);
    }
    free(S);
    free(wz);
}

START_TEST(test_one_call_bound) {
    const int gs[] = {32, 64, 256};
    for (int ni = 0; ni < 4; ni++)
        for (int gi = 0; gi < 3; gi++)
            for (int seed = 1; seed <= 2; seed++) {
                int n = rank_counts[ni], G = gs[gi];
                size_t m = 3 * (size_t)n * G + 37 * seed; /* not a multiple of G*N */
                harness hi, he;
                h_init(&hi, n, test_echo_cfg(ECHO_PRESET_NOFB, G, 0, 2, m, 0, ECHO_CODEC_INT4));
                h_init(&he, n, test_echo_cfg(ECHO_PRESET_ECHO, G, 0, 2, m, 0, ECHO_CODEC_INT4));
                float *x[MAXN];
                void *bi[MAXN], *be[MAXN];
                for (int r = 0; r < n; r++) {
                    x[r] = malloc(m * 4);
                    /* a heavy channel every 97 values, like activation outliers */
                    for (size_t i = 0; i < m; i++)
                        x[r][i] = unif(seed, G, r, i) * (i % 97 == 5 ? 30.0f : 1.0f);
                    bi[r] = malloc(m * 4);
                    be[r] = malloc(m * 4);
                    memcpy(bi[r], x[r], m * 4);
                    memcpy(be[r], x[r], m * 4);
                }
                float *ref = malloc(m * 4);
                double *bound = malloc(m * sizeof *bound);
                int4_reference(n, G, m, x, ref, bound);
                step s;
                call_all(&hi, 1, 0, m, ECHO_F32, bi, &s);
                assert_all_ok(&s);
                call_all(&he, 1, 0, m, ECHO_F32, be, &s);
                assert_all_ok(&s);
                /* bit for bit the reference; echo's first call of a pass is int4 */
                ck_assert(memcmp(bi[0], ref, m * 4) == 0);
                ck_assert(memcmp(be[0], ref, m * 4) == 0);
                for (size_t i = 0; i < m; i++) {
                    double sum = 0, mag = 0;
                    for (int r = 0; r < n; r++) {
                        sum += x[r][i];
                        mag += fabs(x[r][i]) + bound[i];
                    }
                    double e = fabs(((float *)bi[0])[i] - sum);
                    /* B_e (with the division's 2^-21 slack) + fp32 summation */
                    double tol = bound[i] * (1 + 0x1p-20) + n * 0x1p-24 * mag;
                    ck_assert_msg(e <= tol, "n=%d G=%d i=%zu: error %g > bound %g", n, G, i, e, tol);
                }
                for (int r = 0; r < n; r++) {
                    free(x[r]);
                    free(bi[r]);
                    free(be[r]);
                }
                free(ref);
                free(bound);
                h_free(&hi);
                h_free(&he);
            }
}
END_TEST

/* The hadamard codec, one call: u = H D x per group (H unnormalised,
 * computed here in fp64 from its definition H[i][k] = (-1)^popcount(i & k)),
 * int4 on u, the sum rotated back by D H / G. An error e in the rotated
 * basis becomes D H e / G, so each output of group g errs by at most the
 * mean of its group's rotated bounds: B_g = (sum_{j != c} s_j,g + s_z,g) / 2
 * with s = absmax/7 rounded up to bf16 (<= absmax (1 + 2^-7) / 7). The
 * owner's sum absmax is bounded by the exact sum's plus the phase-1 errors.
 * On inputs with outlier channels its error is well below int4's. */
/* u[0..G) = the rotation of x[off..off+G) in blocks of R (R divides G). */
static void had_rotate64(const double *x, size_t m, size_t off, int G, int R, double *u) {
    for (int b = 0; b < G; b += R)
        for (int i = 0; i < R; i++) {
            u[b + i] = 0;
            for (int k = 0; k < R; k++) {
                size_t at = off + (size_t)b + (size_t)k;
                double v = at < m ? x[at] : 0.0;
                if (echo_had_neg(k)) v = -v;
                u[b + i] += __builtin_popcount((unsigned)(i & k)) & 1 ? -v : v;
            }
        }
}

/* hsub6 too: its 16-value scales are at most its group's, so the same
 * bound holds with rotation blocks of 16 and the group's absmax; and out2
 * (R = 1, no rotation): its scale comes from the third largest |value|,
 * and its two outliers err by one bf16 rounding, far below the bound. */
START_TEST(test_hadamard_one_call_bound) {
    /* hout2 (R = G): removing its two outliers moves a rotated value by at
     * most their |sum|, so its scale is bounded with 2 max|y| added */
    const int gs[] = {16, 32, 64, 64, 128, 256, 64, 128, 256, 64, 128};
    for (int ni = 0; ni < 3; ni++)
        for (int gi = 0; gi < 11; gi++) {
            int n = rank_counts[ni], G = gs[gi], R = gi < 3 || gi >= 9 ? G : gi < 6 ? 16 : 1, hout = gi >= 9;
            echo_codec_id codec = gi < 3   ? ECHO_CODEC_HADAMARD
                                  : gi < 6 ? ECHO_CODEC_HSUB6
                                  : gi < 9 ? ECHO_CODEC_OUT2
                                           : ECHO_CODEC_HOUT2;
            size_t m = 3 * (size_t)n * G + 37; /* a ragged last group */
            harness hh, hi;
            h_init(&hh, n, test_echo_cfg(ECHO_PRESET_NOFB, G, 0, 2, m, 0, codec));
            h_init(&hi, n, test_echo_cfg(ECHO_PRESET_NOFB, G, 0, 2, m, 0, ECHO_CODEC_INT4));
            double *xd[MAXN], *sum = calloc(m, sizeof(double));
            void *bh[MAXN], *bi[MAXN];
            for (int r = 0; r < n; r++) {
                xd[r] = malloc(m * sizeof(double));
                bh[r] = malloc(m * 4);
                bi[r] = malloc(m * 4);
                for (size_t i = 0; i < m; i++) {
                    float v = unif(3, (uint64_t)G, (uint64_t)r, i) * (i % 97 == 5 ? 30.0f : 1.0f);
                    ((float *)bh[r])[i] = ((float *)bi[r])[i] = v;
                    xd[r][i] = v;
                    sum[i] += v;
                }
            }
            step s;
            call_all(&hh, 1, 0, m, ECHO_F32, bh, &s);
            assert_all_ok(&s);
            call_all(&hi, 1, 0, m, ECHO_F32, bi, &s);
            assert_all_ok(&s);
            size_t L = (m + (size_t)n * G - 1) / ((size_t)n * G) * G;
            double u[256], eh2 = 0, ei2 = 0, sigma = (1 + 0x1p-7) * (1 + 0x1p-20) / 7;
            for (size_t off = 0; off < m; off += (size_t)G) {
                int c = (int)(off / L); /* the group's owner */
                double sumq = 0, mag = 0;
                for (int j = 0; j < n; j++) {
                    had_rotate64(xd[j], m, off, G, R, u);
                    double a = 0, top = 0;
                    for (int k = 0; k < G; k++)
                        a = fmax(a, fabs(u[k]));
                    for (size_t k = off; k < m && k < off + (size_t)G; k++)
                        top = fmax(top, fabs(xd[j][k]));
                    if (hout) a += 2 * top;
                    mag += a;
                    if (j != c) sumq += sigma * a;
                }
                had_rotate64(sum, m, off, G, R, u);
                double az = 0, topz = 0;
                for (int k = 0; k < G; k++)
                    az = fmax(az, fabs(u[k]));
                for (size_t k = off; k < m && k < off + (size_t)G; k++)
                    topz = fmax(topz, fabs(sum[k]));
                /* the owner's sum holds the phase-1 errors too (<= sumq/2 per value) */
                if (hout) az += 2 * (topz + sumq / 2) + G * sumq / 2;
                double B = (sumq + sigma * (az + sumq / 2)) / 2;
                /* fp32 butterflies, sums and inverse: log2(G) + n roundings of terms <= mag */
                double tol = B + 64 * 0x1p-24 * mag;
                for (size_t i = off; i < m && i < off + (size_t)G; i++) {
                    double e = fabs(((float *)bh[0])[i] - sum[i]), ei = ((float *)bi[0])[i] - sum[i];
                    ck_assert_msg(e <= tol, "%s n=%d G=%d i=%zu: error %g > bound %g", echo_codec_get(codec)->name, n,
                                  G, i, e, tol);
                    eh2 += e * e;
                    ei2 += ei * ei;
                }
            }
            /* outliers every 97 values: the rotation spreads them */
            ck_assert_msg(eh2 < 0.75 * ei2, "%s n=%d G=%d: error^2 %g vs int4 %g", echo_codec_get(codec)->name, n, G,
                          eh2, ei2);
            for (int r = 0; r < n; r++) {
                free(xd[r]);
                free(bh[r]);
                free(bi[r]);
            }
            free(sum);
            h_free(&hh);
            h_free(&hi);
        }
}
END_TEST

/* The codec table: names, groups, wire bits per value. */
START_TEST(test_codec_table) {
    echo_codec_id id;
    int g;
    ck_assert(echo_codec_parse("int4", &id, &g) == 0 && id == ECHO_CODEC_INT4 && g == 0);
    ck_assert(echo_codec_parse("hadamard-g32", &id, &g) == 0 && id == ECHO_CODEC_HADAMARD && g == 32);
    ck_assert(echo_codec_parse("hadamard-g48", &id, &g) == -1);
    ck_assert(echo_codec_parse("hadamard-g", &id, &g) == -1);
    ck_assert(echo_codec_parse("int4-g512", &id, &g) == -1);
    ck_assert(echo_codec_parse("nf4", &id, &g) == -1);
    ck_assert(echo_codec_get(ECHO_CODEC_DEFAULT) == echo_codec_get(ECHO_DEFAULT_CODEC));
    ck_assert(echo_codec_get(ECHO_CODEC_COUNT) == NULL);
    ck_assert_str_eq(echo_codec_get(ECHO_CODEC_HADAMARD)->name, "hadamard");
    ck_assert_double_eq(echo_codec_bits(ECHO_CODEC_INT4, 64), 4.25);
    ck_assert_double_eq(echo_codec_bits(ECHO_CODEC_HADAMARD, 32), 4.5);
    ck_assert_double_eq(echo_codec_bits(ECHO_CODEC_INT4, 48), 0);
    /* the wire form the table promises is what a call moves */
    for (int k = ECHO_CODEC_INT4; k < ECHO_CODEC_COUNT; k++) {
        const echo_codec_info *ci = echo_codec_get((echo_codec_id)k);
        ck_assert_double_eq(echo_codec_bits((echo_codec_id)k, 128),
                            ci->code_bits + (8.0 * ci->scale_bytes + ci->sub_bits * 128 / 16) / 128);
    }
    /* hsub6: 4.5 bits at its default G = 128, 6-bit scales per 16 values, G >= 64 */
    ck_assert_double_eq(echo_codec_bits(ECHO_CODEC_HSUB6, 0), 4.5);
    ck_assert_double_eq(echo_codec_bits(ECHO_CODEC_HSUB6, 256), 4.4375);
    ck_assert_uint_eq(echo_codec_group_bytes(ECHO_CODEC_HSUB6, 128), 72);
    ck_assert_double_eq(echo_codec_bits(ECHO_CODEC_HSUB6, 32), 0);
    ck_assert(echo_codec_parse("hsub6-g32", &id, &g) == -1);
    ck_assert(echo_codec_parse("hsub6-g256", &id, &g) == 0 && id == ECHO_CODEC_HSUB6 && g == 256);
    /* out2: two bf16 outliers + index bytes + the scale: 8 bytes per group */
    ck_assert_double_eq(echo_codec_bits(ECHO_CODEC_OUT2, 0), 4.5);
    ck_assert_uint_eq(echo_codec_group_bytes(ECHO_CODEC_OUT2, 256), 136);
}
END_TEST

/* ================= 4. depth independence ================= */

/* The worst-case one-call bound b* per element for inputs |x| <= X
 * (docs/echo.md, "Depth"): residuals obey rho1 <= e*sigma*(X + rho1) in
 * phase 1 and rho2 <= e*sigma*(Smax + rho2) in phase 2, with sigma the
 * scale/absmax bound and e = 1/2 + 2^-21; the error of any call sequence of
 * a pass is minus the total residual left by its last call. */
static double one_call_bound(int n, double X) {
    double sigma = (1 + 0x1p-7) * (1 + 0x1p-24) / 7, es = (0.5 + 0x1p-21) * sigma;
    double rho1 = es * X / (1 - es);
    double smax = (X + (n - 1) * (X + 2 * rho1)) * (1 + n * 0x1p-23);
    double rho2 = es * smax / (1 - es);
    return (n - 1) * rho1 + rho2;
}

typedef struct chain {
    harness *h;
    int K;
    size_t m;
    uint64_t seed;
    float *buf[MAXN];
    double *acc_out, *acc_exact;
    double *E;      /* E[k] = ||sum_{<=k} out - sum_{<=k} exact|| */
    double *e_call; /* ||out_k - exact_k|| */
    int rc[MAXN];
    char err[MAXN][320];
} chain;

typedef struct chain_arg {
    chain *ch;
    int r;
} chain_arg;

static void *chain_rank(void *p) {
    chain_arg *a = p;
    chain *ch = a->ch;
    int r = a->r, n = ch->h->n;
    size_t m = ch->m;
    echo_comm *c = ch->h->c[r];
    float *tmp = r == 0 ? malloc(m * sizeof *tmp) : NULL;
    ch->rc[r] = echo_begin_pass(c, ECHO_PASS_EAGER, ch->err[r], sizeof ch->err[r]);
    for (int k = 0; k < ch->K && !ch->rc[r]; k++) {
        gen(ch->buf[r], m, ch->seed, (uint64_t)k, (uint64_t)r);
        ch->rc[r] = echo_allreduce(c, k, ch->buf[r], m, ECHO_F32, NULL, ch->err[r], sizeof ch->err[r]);
        if (ch->rc[r] || r != 0) continue;
        /* rank 0 keeps the books while the others wait in the next call */
        double E = 0, e1 = 0;
        for (size_t i = 0; i < m; i++) {
            double ex = 0;
            for (int j = 0; j < n; j++)
                ex += unif(ch->seed, (uint64_t)k, (uint64_t)j, i);
            ch->acc_out[i] += ch->buf[0][i];
            ch->acc_exact[i] += ex;
            double d = ch->acc_out[i] - ch->acc_exact[i], d1 = ch->buf[0][i] - ex;
            E += d * d;
            e1 += d1 * d1;
        }
        ch->E[k] = sqrt(E);
        ch->e_call[k] = sqrt(e1);
    }
    free(tmp);
    return NULL;
}

static void run_chain(harness *h, int K, size_t m, uint64_t seed, double *E, double *e_call) {
    chain ch = {.h = h, .K = K, .m = m, .seed = seed, .E = E, .e_call = e_call};
    ch.acc_out = calloc(m, sizeof(double));
    ch.acc_exact = calloc(m, sizeof(double));
    for (int r = 0; r < h->n; r++)
        ch.buf[r] = malloc(m * sizeof(float));
    pthread_t t[MAXN];
    chain_arg a[MAXN];
    for (int r = 0; r < h->n; r++) {
        a[r] = (chain_arg){&ch, r};
        ck_assert_int_eq(pthread_create(&t[r], NULL, chain_rank, &a[r]), 0);
    }
    for (int r = 0; r < h->n; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < h->n; r++) {
        ck_assert_msg(ch.rc[r] == 0, "rank %d: %s", r, ch.err[r]);
        free(ch.buf[r]);
    }
    free(ch.acc_out);
    free(ch.acc_exact);
}

START_TEST(test_depth_independence) {
    const int K = 144; /* two Qwen3-8B passes: 36 layers x 2 sites x 2 */
    for (int ni = 0; ni < 20; ni++) {
        /* the int4 codec, then hadamard, hsub6, out2, hout2 */
        echo_codec_id codec = ni < 4    ? ECHO_CODEC_INT4
                              : ni < 8  ? ECHO_CODEC_HADAMARD
                              : ni < 12 ? ECHO_CODEC_HSUB6
                              : ni < 16 ? ECHO_CODEC_OUT2
                                        : ECHO_CODEC_HOUT2;
        int n = rank_counts[ni % 4], G = ni % 4 == 1 ? (ni >= 8 ? 64 : 32) : 0;
        size_t m = 4096 + 77 * (size_t)n; /* not a multiple of G*N */
        uint64_t seed = 7 + (uint64_t)ni;
        harness he, hq;
        h_init(&he, n, test_echo_cfg(ECHO_PRESET_ECHO, G, 0, K, m, 0, codec));
        h_init(&hq, n, test_echo_cfg(ECHO_PRESET_NOFB, G, 0, K, m, 0, codec));
        double Ee[144], ee[144], Eq[144], eq[144];
        run_chain(&he, K, m, seed, Ee, ee);
        run_chain(&hq, K, m, seed, Eq, eq);
        /* typical one-call error: rms over the int4 calls */
        double ebar = 0, esum = 0;
        for (int k = 0; k < K; k++)
            ebar += eq[k] * eq[k];
        ebar = sqrt(ebar / K);
        double bstar = one_call_bound(n, 1.0) * sqrt((double)m) * (1 + 1e-3);
        /* hadamard: the residuals obey the same recursion in the rotated
         * basis, where |u| <= G X (H unnormalised); back in the input basis
         * D H / G has 2-norm 1/sqrt(G), so the bound grows by sqrt(G) */
        if (codec == ECHO_CODEC_HADAMARD) bstar *= sqrt((double)(G ? G : echo_codec_default_group(codec)));
        /* hsub6: rotation blocks of 16, scales no larger than the group's */
        if (codec == ECHO_CODEC_HSUB6) bstar *= 4;
        /* hout2: rotation blocks of G, and the two outliers out of the scale */
        if (codec == ECHO_CODEC_HOUT2) bstar *= sqrt((double)(G ? G : echo_codec_default_group(codec))) * 3;
        for (int k = 0; k < K; k++) {
            /* echo: within the worst-case one-call bound at every depth, and
             * within 1.3x a typical single call (the carried residual
             * enlarges the scales by at most ~8%) */
            ck_assert_msg(Ee[k] <= bstar, "n=%d depth %d: echo error %g > one-call bound %g", n, k + 1, Ee[k], bstar);
            ck_assert_msg(Ee[k] <= 1.3 * ebar, "n=%d depth %d: echo error %g > 1.3 x one call %g", n, k + 1, Ee[k],
                          ebar);
            /* int4: independent errors add in quadrature, so ||sum err|| ~ sqrt(K) ebar */
            esum += eq[k] * eq[k];
            double ratio = Eq[k] / sqrt(esum);
            if (k >= 15) ck_assert_msg(ratio > 0.8 && ratio < 1.25, "n=%d depth %d: int4 ratio %g", n, k + 1, ratio);
        }
        double g = Eq[K - 1] / (sqrt((double)K) * ebar);
        ck_assert_msg(g > 0.8 && g < 1.25, "n=%d: int4 error at K=%d is %g x sqrt(K) x one call", n, K, g);
        ck_assert_msg(Eq[K - 1] > 5 * Ee[K - 1], "n=%d: int4 %g vs echo %g at K=%d", n, Eq[K - 1], Ee[K - 1], K);
        /* (hadamard's worst-case bound is sqrt(G) looser than a typical call) */
        if (codec == ECHO_CODEC_INT4)
            ck_assert_msg(Eq[K - 1] > bstar, "n=%d: int4 at K=%d (%g) should exceed echo's bound (%g)", n, K, Eq[K - 1],
                          bstar);
        h_free(&he);
        h_free(&hq);
    }
}
END_TEST

/* ================= 5. lifecycle, policy, errors, stats ================= */

static void **bufs_f32(int n, size_t m, uint64_t seed, void **buf) {
    for (int r = 0; r < n; r++) {
        buf[r] = malloc(m * 4 + 4);
        gen(buf[r], m, seed, 0, r);
    }
    return buf;
}

static void free_bufs(int n, void **buf) {
    for (int r = 0; r < n; r++)
        free(buf[r]);
}

START_TEST(test_lifecycle_errors) {
    const int n = 3;
    const size_t m = 1000;
    harness h;
    h_init(&h, n, test_echo_cfg(ECHO_PRESET_ECHO, 32, 0, 6, m, 0, 0));
    void *buf[MAXN];
    bufs_f32(n, m, 5, buf);
    step s;
    echo_stats st;

    /* no pass begun */
    call_all(&h, 0, 0, m, ECHO_F32, buf, &s);
    assert_all_fail(&s, "echo_begin_pass");
    /* sites in order, skipping allowed */
    call_all(&h, 1, 0, m, ECHO_F32, buf, &s);
    assert_all_ok(&s);
    call_all(&h, 0, 2, m, ECHO_F32, buf, &s);
    assert_all_ok(&s);
    /* repeated and decreasing sites */
    call_all(&h, 0, 2, m, ECHO_F32, buf, &s);
    assert_all_fail(&s, "sites must increase");
    call_all(&h, 0, 1, m, ECHO_F32, buf, &s);
    assert_all_fail(&s, "sites must increase");
    /* out of range */
    call_all(&h, 0, 6, m, ECHO_F32, buf, &s);
    assert_all_fail(&s, "n_sites");
    call_all(&h, 0, -1, m, ECHO_F32, buf, &s);
    assert_all_fail(&s, "outside");
    /* oversize */
    call_all(&h, 0, 3, m + 1, ECHO_F32, buf, &s);
    assert_all_fail(&s, "max_count");
    /* echo: the count is fixed within a pass */
    call_all(&h, 0, 3, m - 1, ECHO_F32, buf, &s);
    assert_all_fail(&s, "differs");
    /* the failed calls changed nothing: the pass goes on */
    call_all(&h, 0, 3, m, ECHO_F32, buf, &s);
    assert_all_ok(&s);
    echo_get_stats(h.c[0], &st);
    ck_assert_uint_eq(st.calls[ECHO_PRESET_ECHO], 3);
    /* a new pass takes a new count */
    call_all(&h, 1, 0, m - 1, ECHO_F32, buf, &s);
    assert_all_ok(&s);
    /* a stream on the host transport */
    char err[256];
    ck_assert(echo_begin_pass(h.c[0], ECHO_PASS_EAGER, err, sizeof err) == 0);
    ck_assert(echo_allreduce(h.c[0], 0, buf[0], m, ECHO_F32, (void *)1, err, sizeof err) != 0);
    ck_assert_ptr_nonnull(strstr(err, "stream"));
    /* bad dtype and NULL buffer */
    ck_assert(echo_allreduce(h.c[0], 0, buf[0], m, (echo_dtype)7, NULL, err, sizeof err) != 0);
    ck_assert(echo_allreduce(h.c[0], 0, NULL, m, ECHO_F32, NULL, err, sizeof err) != 0);
    /* comm creation errors */
    echo_comm *c2;
    ck_assert(echo_comm_create(h.w, 1, &c2, err, sizeof err) != 0);
    ck_assert_ptr_nonnull(strstr(err, "already"));
    ck_assert(echo_comm_create(h.w, 3, &c2, err, sizeof err) != 0);
    /* slot memory: one message of fp32 (padded to N*G), echo only */
    ck_assert_uint_eq(echo_comm_slot_bytes(h.c[0]), (size_t)11 * 32 * n * 4); /* L = ceil(1000/96)*32 */
    free_bufs(n, buf);
    h_free(&h);

    /* config errors */
    echo_world *w;
    const echo_config bad[] = {
        test_echo_cfg(ECHO_PRESET_ECHO, 48, 0, 4, 100, 0, 0),
        test_echo_cfg(ECHO_PRESET_ECHO, 8, 0, 4, 100, 0, 0),
        test_echo_cfg(ECHO_PRESET_ECHO, 512, 0, 4, 100, 0, 0),
        test_echo_cfg(ECHO_PRESET_ECHO, 0, 0, 0, 100, 0, 0),
        test_echo_cfg(ECHO_PRESET_ECHO, 0, 0, 4, 0, 0, 0),
        test_echo_cfg((echo_preset)9, 0, 0, 4, 100, 0, 0),
        /* deferred completion is the nccl transport's; local meets at every call */
        test_echo_cfg(ECHO_PRESET_ECHO, 0, 0, 4, 100, 1, 0),
        /* feedback with an exact codec: there is no error to feed back */
        {.codec = ECHO_CODEC_NONE, .feedback = 1, .n_sites = 4, .max_count = 100},
        {.codec = ECHO_CODEC_BF16, .feedback = 1, .n_sites = 4, .max_count = 100},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(echo_world_create_local(2, &bad[i], &w, err, sizeof err) != 0, "config %zu accepted", i);
    echo_config ok = test_echo_cfg(ECHO_PRESET_NOFB, 0, 0, 4, 100, 0, 0);
    ck_assert(echo_world_create_local(0, &ok, &w, err, sizeof err) != 0);
    ck_assert(echo_world_create_local(ECHO_MAX_RANKS + 1, &ok, &w, err, sizeof err) != 0);
    ck_assert(echo_world_create_local(2, &ok, &w, err, sizeof err) == 0);
    echo_config got;
    echo_world_get_config(w, &got);
    ck_assert_int_eq(got.group_size, echo_codec_default_group(ECHO_CODEC_DEFAULT));
    ck_assert_int_eq(got.codec, ECHO_DEFAULT_CODEC);
    ck_assert_int_eq(echo_world_nranks(w), 2);
    echo_comm *ci;
    ck_assert(echo_comm_create(w, 0, &ci, err, sizeof err) == 0);
    ck_assert_uint_eq(echo_comm_slot_bytes(ci), 0); /* int4 keeps no residual */
    echo_comm_destroy(ci);
    echo_world_destroy(w);
#ifndef ECHO_HAVE_CUDA
    int dev[2] = {0, 1};
    ck_assert(echo_world_create_nccl(2, dev, &ok, &w, err, sizeof err) != 0);
    ck_assert_ptr_nonnull(strstr(err, "CUDA"));
#endif
}
END_TEST

START_TEST(test_reset_and_abort) {
    const int n = 4;
    const size_t m = 777;
    harness h;
    h_init(&h, n, test_echo_cfg(ECHO_PRESET_ECHO, 16, 0, 4, m, 0, ECHO_CODEC_INT4));
    void *buf[MAXN], *out1[MAXN];
    step s;
    /* two passes over the same inputs give the same outputs: begin_pass clears the residual */
    for (int pass = 0; pass < 2; pass++) {
        for (int site = 0; site < 3; site++) {
            for (int r = 0; r < n; r++) {
                buf[r] = malloc(m * 4);
                gen(buf[r], m, 11, (uint64_t)site, (uint64_t)r);
            }
            call_all(&h, site == 0, site, m, ECHO_F32, buf, &s);
            assert_all_ok(&s);
            if (pass == 0 && site == 2) {
                memcpy(out1, buf, sizeof buf);
                continue;
            }
            if (pass == 1 && site == 2) {
                ck_assert(memcmp(buf[0], out1[0], m * 4) == 0);
                free_bufs(n, out1);
            }
            free_bufs(n, buf);
        }
    }
    /* a non-finite input on one rank: every rank fails the same call, the
     * owner's message names its element, the pass is aborted everywhere */
    const float bad[] = {NAN, INFINITY, 2.5e38f};
    for (int b = 0; b < 3; b++) {
        for (int r = 0; r < n; r++) {
            buf[r] = malloc(m * 4);
            gen(buf[r], m, 12, 0, (uint64_t)r);
        }
        ((float *)buf[2])[5] = bad[b]; /* shard 0: rank 2 codes it in phase 1 */
        call_all(&h, 1, 0, m, ECHO_F32, buf, &s);
        assert_all_fail(&s, "aborted");
        ck_assert_msg(strstr(s.err[2], "input element 5"), "%s", s.err[2]);
        ck_assert(isnan(((float *)buf[0])[5])); /* never silently made finite */
        call_all(&h, 0, 1, m, ECHO_F32, buf, &s);
        assert_all_fail(&s, "aborted by an earlier error");
        /* its own shard enters unquantized; the sum carries the NaN */
        for (int r = 0; r < n; r++)
            gen(buf[r], m, 12, 1, (uint64_t)r);
        ((float *)buf[0])[3] = bad[b];
        call_all(&h, 1, 0, m, ECHO_F32, buf, &s);
        assert_all_fail(&s, "not finite");
        free_bufs(n, buf);
    }
    /* the rotating codecs: a bad input poisons its rotated group, which every
     * rank reports (the message names the group's first element) */
    for (int k = 0; k < 2; k++) {
        harness hr;
        h_init(&hr, n,
               test_echo_cfg(ECHO_PRESET_ECHO, k ? 128 : 16, 0, 4, m, 0, k ? ECHO_CODEC_HSUB6 : ECHO_CODEC_HADAMARD));
        for (int r = 0; r < n; r++) {
            buf[r] = malloc(m * 4);
            gen(buf[r], m, 12, 0, (uint64_t)r);
        }
        ((float *)buf[2])[5] = INFINITY;
        call_all(&hr, 1, 0, m, ECHO_F32, buf, &s);
        assert_all_fail(&s, "aborted");
        ck_assert_msg(strstr(s.err[2], "input element 0"), "%s", s.err[2]);
        ck_assert(isnan(((float *)buf[0])[5]));
        free_bufs(n, buf);
        /* and the next pass works */
        for (int r = 0; r < n; r++) {
            buf[r] = malloc(m * 4);
            gen(buf[r], m, 12, 1, (uint64_t)r);
        }
        call_all(&hr, 1, 0, m, ECHO_F32, buf, &s);
        assert_all_ok(&s);
        free_bufs(n, buf);
        h_free(&hr);
    }
    /* finite inputs whose fp32 sum overflows */
    for (int r = 0; r < n; r++) {
        buf[r] = malloc(m * 4);
        gen(buf[r], m, 13, 0, (uint64_t)r);
        ((float *)buf[r])[600] = 1.5e38f;
    }
    call_all(&h, 1, 0, m, ECHO_F32, buf, &s);
    assert_all_fail(&s, "not finite");
    /* a new pass works again */
    for (int r = 0; r < n; r++)
        gen(buf[r], m, 13, 1, (uint64_t)r);
    call_all(&h, 1, 0, m, ECHO_F32, buf, &s);
    assert_all_ok(&s);
    /* ranks that disagree fail together instead of mixing messages */
    step d;
    memset(&d, 0, sizeof d);
    d.h = &h;
    d.dt = ECHO_F32;
    for (int r = 0; r < n; r++) {
        d.site[r] = r == 3 ? 2 : 1;
        d.count[r] = m;
        d.buf[r] = buf[r];
    }
    run_step(&d);
    assert_all_fail(&d, "disagree");
    free_bufs(n, buf);
    h_free(&h);

    /* exact mode reports a non-finite sum too (every rank alike) */
    h_init(&h, 2, test_echo_cfg(ECHO_PRESET_EXACT, 0, 0, 2, 64, 0, 0));
    for (int r = 0; r < 2; r++) {
        buf[r] = calloc(64, 4);
        ((float *)buf[r])[10] = r ? -INFINITY : INFINITY;
    }
    call_all(&h, 1, 0, 64, ECHO_F32, buf, &s);
    assert_all_fail(&s, "element 10");
    free_bufs(2, buf);
    h_free(&h);
}
END_TEST

START_TEST(test_size_policy_and_stats) {
    const int n = 4;
    const size_t m = 4 * 32 * 10; /* a multiple of N*G: wire cost is exact */
    /* min_bytes 4000: the fp32 call (5120 B) is quantized, the bf16 call of
     * the same count (2560 B) takes the exact path */
    for (int mv = 0; mv < 10; mv++) {
        int mode = 1 + mv % 2; /* int4, echo; with the int4 codec, then hadamard, hsub6, out2, hout2 (G = 64) */
        echo_codec_id codec = mv < 2   ? ECHO_CODEC_INT4
                              : mv < 4 ? ECHO_CODEC_HADAMARD
                              : mv < 6 ? ECHO_CODEC_HSUB6
                              : mv < 8 ? ECHO_CODEC_OUT2
                                       : ECHO_CODEC_HOUT2;
        int G = mv >= 4 ? 64 : 32;
        harness h;
        h_init(&h, n, test_echo_cfg((echo_preset)mode, G, 4000, 4, m, 0, codec));
        void *buf[MAXN];
        float *x[MAXN];
        double *sum_exact = calloc(m, sizeof(double)), *sum_out = calloc(m, sizeof(double));
        step s;
        for (int site = 0; site < 2; site++) {
            echo_dtype dt = site == 0 ? ECHO_F32 : ECHO_BF16;
            for (int r = 0; r < n; r++) {
                x[r] = malloc(m * 4);
                buf[r] = malloc(m * 4);
                gen(x[r], m, 21, (uint64_t)site, (uint64_t)r);
                for (size_t i = 0; i < m; i++) {
                    if (dt == ECHO_BF16) {
                        ((uint16_t *)buf[r])[i] = to_bf16(x[r][i]);
                        x[r][i] = from_bf16(((uint16_t *)buf[r])[i]);
                    } else {
                        ((float *)buf[r])[i] = x[r][i];
                    }
                }
            }
            call_all(&h, site == 0, site, m, dt, buf, &s);
            assert_all_ok(&s);
            double e2 = 0, r2 = 0;
            for (size_t i = 0; i < m; i++) {
                double ex = 0;
                for (int r = 0; r < n; r++)
                    ex += x[r][i];
                double o = dt == ECHO_BF16 ? from_bf16(((uint16_t *)buf[0])[i]) : ((float *)buf[0])[i];
                e2 += (o - ex) * (o - ex);
                r2 += ex * ex;
                sum_exact[i] += ex;
                sum_out[i] += o;
            }
            for (int r = 0; r < n; r++) {
                echo_site_stats ss;
                char err[128];
                ck_assert(echo_get_site_stats(h.c[r], site, &ss, err, sizeof err) == 0);
                ck_assert_uint_eq(ss.calls, 1);
            }
            /* the error against the fp64 sum of the inputs: the quantized
             * call 0 has some; int4's exact call 1 only bf16 rounding (echo's
             * adds call 0's residual, checked below) */
            if (site == 0) ck_assert_msg(e2 > 1e-6 * r2, "quantized call: rel err^2 %g", e2 / r2);
            if (site == 1 && mode == ECHO_PRESET_NOFB)
                ck_assert_msg(e2 <= r2 / (128.0 * 128.0), "exact bf16 call: rel err^2 %g", e2 / r2);
            for (int r = 0; r < n; r++) {
                free(x[r]);
                free(buf[r]);
            }
        }
        /* echo: the residual of call 0 entered the exact call 1, so the sum
         * of outputs is exact up to fp32/bf16 rounding; int4 keeps call 0's error */
        double E = 0, E0 = 0;
        for (size_t i = 0; i < m; i++) {
            E += (sum_out[i] - sum_exact[i]) * (sum_out[i] - sum_exact[i]);
            E0 += sum_exact[i] * sum_exact[i];
        }
        if (mode == ECHO_PRESET_ECHO)
            ck_assert_msg(sqrt(E / E0) < 0.01, "echo after exact call: rel err %g", sqrt(E / E0));
        else
            ck_assert_msg(sqrt(E / E0) > 0.03, "int4: rel err %g", sqrt(E / E0));
        echo_stats st;
        echo_get_stats(h.c[0], &st);
        /* the path's name: the int4 codec without feedback is the int4 preset */
        int lab = mode == ECHO_PRESET_NOFB && codec == ECHO_CODEC_INT4 ? ECHO_PRESET_INT4 : mode;
        ck_assert_uint_eq(st.calls[lab], 1);
        ck_assert_uint_eq(st.calls[ECHO_PRESET_EXACT], 1);
        /* wire: 2(N-1) shard messages per rank; the table's bits per value
         * (4.5 at G = 32, 4.625 for hsub6 at G = 64) */
        double busvals = 2.0 * (n - 1) / n * m;
        ck_assert_double_eq_tol(8.0 * st.wire_bytes[lab] / busvals, echo_codec_bits(codec, G), 1e-12);
        ck_assert_double_eq_tol(8.0 * st.wire_bytes[ECHO_PRESET_EXACT] / busvals, 16.0, 1e-12);
        free(sum_exact);
        free(sum_out);
        h_free(&h);
    }
    /* one rank: nothing to reduce, the buffer is untouched */
    harness h1;
    h_init(&h1, 1, test_echo_cfg(ECHO_PRESET_ECHO, 0, 0, 2, 100, 0, 0));
    void *b1[1];
    bufs_f32(1, 100, 3, b1);
    float keep[100];
    memcpy(keep, b1[0], sizeof keep);
    step s;
    call_all(&h1, 1, 0, 100, ECHO_F32, b1, &s);
    assert_all_ok(&s);
    ck_assert(memcmp(keep, b1[0], sizeof keep) == 0);
    ck_assert_uint_eq(echo_comm_slot_bytes(h1.c[0]), 0);
    free_bufs(1, b1);
    h_free(&h1);
    /* mode names */
    echo_preset md;
    ck_assert(echo_preset_parse("echo", &md) == 0 && md == ECHO_PRESET_ECHO);
    ck_assert(echo_preset_parse("int4", &md) == 0 && md == ECHO_PRESET_INT4);
    ck_assert(echo_preset_parse("echo-nofb", &md) == 0 && md == ECHO_PRESET_NOFB);
    ck_assert(echo_preset_parse("exact", &md) == 0 && md == ECHO_PRESET_EXACT);
    ck_assert(echo_preset_parse("fp8", &md) != 0);
    ck_assert_str_eq(echo_preset_name(ECHO_PRESET_INT4), "int4");
    ck_assert_str_eq(echo_preset_name(ECHO_PRESET_NOFB), "echo-nofb");
    /* int4 is the paper's codec, G 64 by default; another codec without
     * feedback is echo-nofb, and int4 refuses one */
    echo_config p4 = {0};
    ck_assert(echo_preset_config(ECHO_PRESET_INT4, 0, 0, &p4) == 0);
    ck_assert(p4.codec == ECHO_CODEC_INT4 && p4.feedback == 0 && p4.group_size == ECHO_DEFAULT_GROUP);
    ck_assert(echo_preset_config(ECHO_PRESET_INT4, ECHO_CODEC_INT4, 32, &p4) == 0 && p4.group_size == 32);
    ck_assert(echo_preset_config(ECHO_PRESET_INT4, ECHO_CODEC_HADAMARD, 0, &p4) == -1);
    ck_assert(echo_preset_codec(ECHO_PRESET_INT4) == ECHO_CODEC_INT4);
    ck_assert(echo_preset_codec(ECHO_PRESET_ECHO) == ECHO_CODEC_DEFAULT);
    char desc[128];
    echo_preset_describe(ECHO_PRESET_INT4, 0, 0, desc, sizeof desc);
    ck_assert_str_eq(desc, "int4: int4-g64, 4.250 bits/value, error feedback off");
    echo_preset_describe(ECHO_PRESET_ECHO, 0, 0, desc, sizeof desc);
    ck_assert_str_eq(desc, "echo: hout2-g128, 4.500 bits/value, error feedback on, the last 2 calls of a pass bf16");
    echo_preset_describe(ECHO_PRESET_NOFB, ECHO_CODEC_HADAMARD, 32, desc, sizeof desc);
    ck_assert_str_eq(desc, "echo-nofb: hadamard-g32, 4.500 bits/value, error feedback off");
    echo_preset_describe(ECHO_PRESET_EXACT, 0, 0, desc, sizeof desc);
    ck_assert_str_eq(desc, "exact: fp32, 32 bits/value");
    /* presets: codec x feedback; G from the named codec whatever the preset */
    echo_config pc = {0};
    ck_assert(echo_preset_config(ECHO_PRESET_ECHO, ECHO_CODEC_INT4, 0, &pc) == 0);
    ck_assert(pc.codec == ECHO_CODEC_INT4 && pc.feedback == 1 && pc.group_size == ECHO_DEFAULT_GROUP);
    ck_assert(echo_preset_config(ECHO_PRESET_NOFB, 0, 32, &pc) == 0);
    ck_assert(pc.codec == ECHO_CODEC_DEFAULT && pc.feedback == 0 && pc.group_size == 32);
    ck_assert(echo_preset_config(ECHO_PRESET_EXACT, ECHO_CODEC_INT4, 0, &pc) == 0);
    ck_assert(pc.codec == ECHO_CODEC_NONE && pc.feedback == 0 && pc.group_size == ECHO_DEFAULT_GROUP);
    ck_assert(echo_preset_config(ECHO_PRESET_BF16, 0, 0, &pc) == 0 && pc.codec == ECHO_CODEC_BF16 && !pc.feedback);
    ck_assert(!pc.tail_sites); /* only echo has a tail */
    ck_assert(echo_preset_config(ECHO_PRESET_ECHO, 0, 0, &pc) == 0 && pc.tail_sites == 2 && pc.tail_codec == ECHO_CODEC_BF16);
    ck_assert(echo_preset_config(ECHO_PRESET_NOFB, 0, 0, &pc) == 0 && !pc.tail_sites);
    ck_assert(echo_preset_config(ECHO_PRESET_INT4, 0, 0, &pc) == 0 && !pc.tail_sites);
    ck_assert(echo_preset_config(ECHO_PRESET_COUNT, 0, 0, &pc) == -1);
    echo_codec_id pid;
    int pg;
    ck_assert(echo_codec_parse("none", &pid, &pg) == 0 && pid == ECHO_CODEC_NONE);
    ck_assert(echo_codec_parse("bf16", &pid, &pg) == 0 && pid == ECHO_CODEC_BF16 && echo_codec_get(pid)->host_only);
    ck_assert_double_eq(echo_codec_bits(ECHO_CODEC_BF16, 0), 16);
}
END_TEST

/* The tail policy (echo_config.tail_sites): the last K sites of a pass go
 * bf16 (or exact) whatever the world's codec, take the residual carried in
 * and leave none; a pass's bits/value average over its sites. */
static void tail_pass(echo_config cfg, int n, size_t m, float **out, echo_stats *st) {
    harness h;
    h_init(&h, n, cfg);
    void *buf[MAXN];
    step s;
    for (int site = 0; site < cfg.n_sites; site++) {
        for (int r = 0; r < n; r++) {
            buf[r] = out[r] + (size_t)site * m;
            gen(buf[r], m, 77, (uint64_t)site, (uint64_t)r);
        }
        call_all(&h, site == 0, site, m, ECHO_F32, buf, &s);
        assert_all_ok(&s);
    }
    if (st) echo_get_stats(h.c[0], st);
    h_free(&h);
}

START_TEST(test_tail_policy) {
    const int n = 3, S = 4;
    const size_t m = 3 * 128 * 4 + 40; /* a ragged last group */
    float *o[4][MAXN]; /* [no tail, bf16 tail, exact tail, bf16 world][rank], S calls each */
    for (int v = 0; v < 4; v++)
        for (int r = 0; r < n; r++)
            o[v][r] = malloc(S * m * sizeof(float));
    echo_config c0 = test_echo_cfg(ECHO_PRESET_ECHO, 128, 0, S, m, 0, ECHO_CODEC_HOUT2);
    echo_config cb = c0, ce = c0;
    cb.tail_sites = 2, cb.tail_codec = ECHO_CODEC_BF16;
    ce.tail_sites = 2, ce.tail_codec = ECHO_CODEC_NONE;
    echo_stats s0, sb, se;
    tail_pass(c0, n, m, o[0], &s0);
    tail_pass(cb, n, m, o[1], &sb);
    tail_pass(ce, n, m, o[2], &se);
    /* calls and wire: 2 coded, 2 bf16 (16 bits/value) or exact */
    ck_assert_uint_eq(s0.calls[ECHO_PRESET_ECHO], 4);
    ck_assert_uint_eq(sb.calls[ECHO_PRESET_ECHO], 2);
    ck_assert_uint_eq(sb.calls[ECHO_PRESET_BF16], 2);
    ck_assert_uint_eq(se.calls[ECHO_PRESET_ECHO], 2);
    ck_assert_uint_eq(se.calls[ECHO_PRESET_EXACT], 2);
    ck_assert_uint_eq(sb.wire_bytes[ECHO_PRESET_BF16], 2 * 2 * (n - 1) * (size_t)(((m + n * 128 - 1) / (n * 128)) * 128) * 2);
    /* the first two calls are the plain codec's bits */
    for (int r = 0; r < n; r++) {
        ck_assert(memcmp(o[0][r], o[1][r], 2 * m * sizeof(float)) == 0);
        ck_assert(memcmp(o[0][r], o[2][r], 2 * m * sizeof(float)) == 0);
    }
    /* the last call takes no residual (call 2 left none): a bf16 world's
     * bits, an exact world's bits */
    echo_config w16 = test_echo_cfg(ECHO_PRESET_BF16, 128, 0, 1, m, 0, 0);
    echo_config wex = test_echo_cfg(ECHO_PRESET_EXACT, 128, 0, 1, m, 0, 0);
    float *one[MAXN];
    for (int r = 0; r < n; r++)
        one[r] = malloc(m * sizeof(float));
    for (int k = 0; k < 2; k++) {
        harness h;
        h_init(&h, n, k ? wex : w16);
        void *buf[MAXN];
        step s;
        for (int r = 0; r < n; r++) {
            buf[r] = one[r];
            gen(one[r], m, 77, (uint64_t)(S - 1), (uint64_t)r);
        }
        call_all(&h, 1, 0, m, ECHO_F32, buf, &s);
        assert_all_ok(&s);
        h_free(&h);
        for (int r = 0; r < n; r++)
            ck_assert_msg(memcmp(one[r], o[k ? 2 : 1][r] + (S - 1) * m, m * sizeof(float)) == 0,
                          "%s tail: last call differs from a %s world's", k ? "exact" : "bf16", k ? "exact" : "bf16");
    }
    /* call 2 took call 1's residual: the sum of the outputs over the pass is
     * the exact sum up to bf16 rounding; without the tail call 3's codec
     * error stays in it */
    double E[3] = {0}, E0 = 0;
    for (size_t i = 0; i < m; i++) {
        double ex = 0, got[3] = {0};
        for (int site = 0; site < S; site++) {
            for (int r = 0; r < n; r++)
                ex += unif(77, (uint64_t)site, (uint64_t)r, i);
            for (int v = 0; v < 3; v++)
                got[v] += o[v][0][(size_t)site * m + i];
        }
        for (int v = 0; v < 3; v++)
            E[v] += (got[v] - ex) * (got[v] - ex);
        E0 += ex * ex;
    }
    ck_assert_msg(sqrt(E[0] / E0) > 0.02, "no tail: rel err %g", sqrt(E[0] / E0));
    ck_assert_msg(sqrt(E[1] / E0) < 0.005, "bf16 tail: rel err %g", sqrt(E[1] / E0));
    ck_assert_msg(sqrt(E[2] / E0) < 1e-5, "exact tail: rel err %g", sqrt(E[2] / E0));
    for (int r = 0; r < n; r++) {
        free(one[r]);
        for (int v = 0; v < 4; v++)
            free(o[v][r]);
    }
    /* bits over a pass, and what a log says */
    echo_config p60 = {0};
    ck_assert(echo_preset_config(ECHO_PRESET_ECHO, ECHO_CODEC_HOUT2, 128, &p60) == 0);
    p60.n_sites = 60, p60.tail_sites = 2, p60.tail_codec = ECHO_CODEC_BF16;
    ck_assert_double_eq_tol(echo_config_bits(&p60), (58 * 4.5 + 2 * 16) / 60.0, 1e-12);
    char desc[256];
    echo_config_describe(ECHO_PRESET_ECHO, &p60, desc, sizeof desc);
    ck_assert_str_eq(desc, "echo: hout2-g128, 4.500 bits/value, error feedback on, the last 2 of 60 calls of a pass "
                           "bf16: 4.883 bits/value over a pass");
    p60.tail_codec = ECHO_CODEC_NONE;
    ck_assert_double_eq_tol(echo_config_bits(&p60), (58 * 4.5 + 2 * 32) / 60.0, 1e-12);
    p60.tail_sites = 0;
    ck_assert_double_eq_tol(echo_config_bits(&p60), 4.5, 1e-12);
    /* $ECHO_TAIL overrides; bad values and bad tails are refused */
    int k;
    echo_codec_id tc;
    char err[160];
    setenv("ECHO_TAIL", "3:exact", 1);
    ck_assert(echo_config_tail(&p60, &k, &tc, err, sizeof err) == 0 && k == 3 && tc == ECHO_CODEC_NONE);
    ck_assert_double_eq_tol(echo_config_bits(&p60), (57 * 4.5 + 3 * 32) / 60.0, 1e-12);
    setenv("ECHO_TAIL", "4", 1);
    ck_assert(echo_config_tail(&p60, &k, &tc, err, sizeof err) == 0 && k == 4 && tc == ECHO_CODEC_BF16);
    setenv("ECHO_TAIL", "2:fp8", 1);
    ck_assert(echo_config_tail(&p60, &k, &tc, err, sizeof err) == -1 && strstr(err, "ECHO_TAIL"));
    setenv("ECHO_TAIL", "61", 1);
    ck_assert(echo_config_tail(&p60, &k, &tc, err, sizeof err) == -1 && strstr(err, "outside"));
    echo_world *w = NULL;
    setenv("ECHO_TAIL", "5", 1); /* more than the world's 4 sites */
    ck_assert(echo_world_create_local(n, &c0, &w, err, sizeof err) == -1 && strstr(err, "outside"));
    unsetenv("ECHO_TAIL");
    echo_config bad = c0;
    bad.tail_sites = 1, bad.tail_codec = ECHO_CODEC_INT4;
    ck_assert(echo_world_create_local(n, &bad, &w, err, sizeof err) == -1 && strstr(err, "tail"));
}
END_TEST

/* A rank that fails outside the collective aborts it: the peers already
 * waiting (and those arriving later) fail with a message instead of hanging;
 * after clearing, the next pass works on every rank. */
typedef struct abort_arg {
    harness *h;
    int r, abort_me;
    float *buf;
    int rc;
    char err[320];
} abort_arg;

static void *abort_rank(void *p) {
    abort_arg *a = p;
    a->rc = echo_begin_pass(a->h->c[a->r], ECHO_PASS_EAGER, a->err, sizeof a->err);
    if (a->abort_me) {
        usleep(20000); /* let the peers block in the collective first */
        echo_abort(a->h->c[a->r]);
        a->rc = -1;
        return NULL;
    }
    if (!a->rc) a->rc = echo_allreduce(a->h->c[a->r], 0, a->buf, 1000, ECHO_F32, NULL, a->err, sizeof a->err);
    if (!a->rc) a->rc = echo_allreduce(a->h->c[a->r], 1, a->buf, 1000, ECHO_F32, NULL, a->err, sizeof a->err);
    return NULL;
}

START_TEST(test_abort_wakes_peers) {
    const echo_preset modes[] = {ECHO_PRESET_EXACT, ECHO_PRESET_ECHO};
    for (int m = 0; m < 2; m++) {
        echo_config cfg = test_echo_cfg(modes[m], 0, 0, 4, 1000, 0, 0);
        harness h;
        h_init(&h, 3, cfg);
        float bufs[3][1000];
        for (int round = 0; round < 2; round++) {
            pthread_t t[3];
            abort_arg a[3];
            for (int r = 0; r < 3; r++) {
                gen(bufs[r], 1000, 7, 0, (uint64_t)r);
                a[r] = (abort_arg){&h, r, round == 0 && r == 2, bufs[r], 0, ""};
                ck_assert_int_eq(pthread_create(&t[r], NULL, abort_rank, &a[r]), 0);
            }
            for (int r = 0; r < 3; r++)
                pthread_join(t[r], NULL);
            if (round == 0) {
                for (int r = 0; r < 2; r++) {
                    ck_assert_int_eq(a[r].rc, -1);
                    ck_assert_msg(strstr(a[r].err, "aborted") != NULL, "rank %d: %s", r, a[r].err);
                }
                char why[64] = "";
                ck_assert_int_eq(echo_world_usable(h.w, why, sizeof why),
                                 1); /* aborted, not dead: clearing re-arms it */
                echo_world_clear_abort(h.w);
            } else {
                for (int r = 0; r < 3; r++)
                    ck_assert_msg(a[r].rc == 0, "rank %d: %s", r, a[r].err);
                ck_assert_int_eq(memcmp(bufs[0], bufs[1], sizeof bufs[0]), 0);
                ck_assert_int_eq(memcmp(bufs[0], bufs[2], sizeof bufs[0]), 0);
            }
        }
        h_free(&h);
    }
}
END_TEST

/* A disagreement fails the call on every rank right after the first
 * barrier; a rank that then went straight on to its next call must not
 * overwrite its post before a slower peer has read it (the ranks would
 * meet at barriers of different calls and hang or mix calls). Each rank
 * alternates disagreeing and agreeing calls without any join between. */
typedef struct race_arg {
    harness *h;
    int r, rounds;
    float *buf;
    int bad_round;
    char err[400];
} race_arg;

static void *race_rank(void *p) {
    race_arg *a = p;
    echo_comm *c = a->h->c[a->r];
    a->bad_round = -1;
    for (int i = 0; i < a->rounds && a->bad_round < 0; i++) {
        size_t m = a->r == 2 ? 99 : 100; /* rank 2 disagrees */
        char e[320] = "";
        if (echo_begin_pass(c, ECHO_PASS_EAGER, e, sizeof e) || echo_allreduce(c, 0, a->buf, m, ECHO_F32, NULL, e, sizeof e) == 0 ||
            !strstr(e, "disagree")) {
            a->bad_round = i;
            snprintf(a->err, sizeof a->err, "disagreeing call: %s", e);
            continue;
        }
        gen(a->buf, 100, 3, (uint64_t)i, (uint64_t)a->r); /* sums in place: fresh inputs stay finite */
        if (echo_begin_pass(c, ECHO_PASS_EAGER, e, sizeof e) || echo_allreduce(c, 0, a->buf, 100, ECHO_F32, NULL, e, sizeof e) != 0) {
            a->bad_round = i;
            snprintf(a->err, sizeof a->err, "agreeing call: %s", e);
        }
    }
    if (a->bad_round >= 0) echo_abort(c); /* the peers fail instead of waiting for this rank */
    return NULL;
}

START_TEST(test_disagreement_then_next_call) {
    const echo_preset modes[] = {ECHO_PRESET_EXACT, ECHO_PRESET_NOFB};
    for (int mi = 0; mi < 2; mi++) {
        harness h;
        h_init(&h, 3, test_echo_cfg(modes[mi], 16, 0, 2, 100, 0, 0));
        float bufs[3][100];
        pthread_t t[3];
        race_arg a[3];
        for (int r = 0; r < 3; r++) {
            gen(bufs[r], 100, 3, 0, (uint64_t)r);
            a[r] = (race_arg){&h, r, 300, bufs[r], -1, ""};
            ck_assert_int_eq(pthread_create(&t[r], NULL, race_rank, &a[r]), 0);
        }
        for (int r = 0; r < 3; r++)
            pthread_join(t[r], NULL);
        for (int r = 0; r < 3; r++)
            ck_assert_msg(a[r].bad_round < 0, "%s rank %d round %d: %s", echo_preset_name(modes[mi]), r, a[r].bad_round,
                          a[r].err);
        h_free(&h);
    }
}
END_TEST

/* ================= one-shot schedule (echo_config.oneshot_bytes) =================
 * Exact one-shot gives the two-shot's bits (the same sum order); a 4-bit
 * codec one-shot gives every rank the same bits, within one coding of each
 * input (no second coding of the sum), with the residual carried over a
 * pass; a NaN on one rank and a rank's other site fail every rank; the
 * stats count (N-1) whole messages per call; messages over the threshold
 * keep the two-shot bits. */
static void os_inputs(int n, size_t m, echo_dtype dt, uint64_t seed, int call, void **buf, float **x) {
    for (int r = 0; r < n; r++) {
        x[r] = malloc(m * sizeof(float));
        buf[r] = malloc(m * 4);
        gen(x[r], m, seed, (uint64_t)call, (uint64_t)r);
        for (size_t i = 0; i < m; i++) {
            if (dt == ECHO_BF16) {
                ((uint16_t *)buf[r])[i] = to_bf16(x[r][i]);
                x[r][i] = from_bf16(((uint16_t *)buf[r])[i]);
            } else {
                ((float *)buf[r])[i] = x[r][i];
            }
        }
    }
}

static void os_free(int n, void **buf, float **x) {
    for (int r = 0; r < n; r++) {
        free(buf[r]);
        free(x[r]);
    }
}

START_TEST(test_oneshot) {
    const size_t counts[] = {1, 7, 300, 1037};
    for (int ni = 0; ni < 3; ni++) {
        int n = rank_counts[ni];
        for (int dti = 0; dti < 2; dti++) {
            echo_dtype dt = dti ? ECHO_BF16 : ECHO_F32;
            size_t esz = dti ? 2 : 4;
            /* exact: one-shot == two-shot, bit for bit */
            harness h2, h1;
            echo_config cfg = test_echo_cfg(ECHO_PRESET_EXACT, 0, 0, 4, 1037, 0, 0);
            h_init(&h2, n, cfg);
            cfg.oneshot_bytes = 1037 * 4;
            h_init(&h1, n, cfg);
            for (size_t ci = 0; ci < 4; ci++) {
                size_t m = counts[ci];
                void *b2[MAXN], *b1[MAXN];
                float *x2[MAXN], *x1[MAXN];
                os_inputs(n, m, dt, 40 + ci, 0, b2, x2);
                os_inputs(n, m, dt, 40 + ci, 0, b1, x1);
                step s;
                call_all(&h2, 1, 0, m, dt, b2, &s);
                assert_all_ok(&s);
                call_all(&h1, 1, 0, m, dt, b1, &s);
                assert_all_ok(&s);
                for (int r = 0; r < n; r++)
                    ck_assert_msg(!memcmp(b1[r], b2[r], m * esz), "exact n=%d m=%zu rank %d: one-shot != two-shot", n,
                                  m, r);
                echo_stats st;
                echo_get_stats(h1.c[0], &st);
                ck_assert_uint_eq(st.calls[ECHO_PRESET_EXACT], ci + 1);
                os_free(n, b2, x2);
                os_free(n, b1, x1);
            }
            echo_stats st;
            echo_get_stats(h1.c[0], &st);
            /* (N-1) fp32 messages of the whole count per call */
            ck_assert_uint_eq(st.wire_bytes[ECHO_PRESET_EXACT], (uint64_t)(n - 1) * (1 + 7 + 300 + 1037) * 4);
            h_free(&h2);
            h_free(&h1);
            /* echo (hout2 and int4 codecs), a pass of 3 calls (the residual
             * carried): every rank's output is the reference built here from
             * the public codec calls (each rank's input plus its residual
             * coded, the N decodes summed in rank order, rounded to dt), and
             * in total over the counts no farther from the fp64 sum than the
             * two-shot schedule on the same inputs (one coding of each input
             * instead of two) */
            for (int cv = 0; cv < 2; cv++) {
                echo_codec_id codec = cv ? ECHO_CODEC_INT4 : ECHO_CODEC_HOUT2;
                harness h, ht;
                cfg = test_echo_cfg(ECHO_PRESET_ECHO, 0, 0, 4, 1037, 0, codec);
                h_init(&ht, n, cfg);
                cfg.oneshot_bytes = 1037 * 4;
                h_init(&h, n, cfg);
                double e1 = 0, e2 = 0;
                for (size_t ci = 0; ci < 4; ci++) {
                    size_t m = counts[ci];
                    float *rres[MAXN], *wire = malloc(m * 2 + 4096), *ysum = malloc(m * 4 + 4096);
                    for (int r = 0; r < n; r++)
                        rres[r] = calloc(m + 256, sizeof(float));
                    for (int k = 0; k < 3; k++) {
                        void *b[MAXN], *bt[MAXN];
                        float *x[MAXN], *xt[MAXN];
                        os_inputs(n, m, dt, 60 + ci, k, b, x);
                        os_inputs(n, m, dt, 60 + ci, k, bt, xt);
                        step s;
                        call_all(&h, k == 0, k, m, dt, b, &s);
                        assert_all_ok(&s);
                        call_all(&ht, k == 0, k, m, dt, bt, &s);
                        assert_all_ok(&s);
                        char e[160];
                        for (int r = 0; r < n; r++) {
                            ck_assert(!echo_codec_encode_as(codec, x[r], rres[r], m, echo_codec_default_group(codec),
                                                            wire, e, sizeof e));
                            ck_assert(!echo_codec_decode_as(codec, wire, m, echo_codec_default_group(codec), ysum, r > 0,
                                                            e, sizeof e));
                        }
                        for (int r = 0; r < n; r++)
                            for (size_t i = 0; i < m; i++) {
                                int same = dt == ECHO_BF16 ? ((uint16_t *)b[r])[i] == to_bf16(ysum[i])
                                                           : ((float *)b[r])[i] == ysum[i];
                                ck_assert_msg(same, "echo/%s n=%d m=%zu call %d rank %d i=%zu: not the reference",
                                              echo_codec_get(codec)->name, n, m, k, r, i);
                            }
                        for (size_t i = 0; i < m; i++) {
                            double ref = 0;
                            for (int r = 0; r < n; r++)
                                ref += x[r][i];
                            double o = dt == ECHO_BF16 ? from_bf16(((uint16_t *)b[0])[i]) : ((float *)b[0])[i];
                            double t = dt == ECHO_BF16 ? from_bf16(((uint16_t *)bt[0])[i]) : ((float *)bt[0])[i];
                            e1 += (o - ref) * (o - ref);
                            e2 += (t - ref) * (t - ref);
                        }
                        os_free(n, b, x);
                        os_free(n, bt, xt);
                    }
                    for (int r = 0; r < n; r++)
                        free(rres[r]);
                    free(wire);
                    free(ysum);
                }
                ck_assert_msg(e1 <= e2 && e1 > 0, "echo/%s n=%d: one-shot squared error %g vs two-shot %g",
                              echo_codec_get(codec)->name, n, e1, e2);
                h_free(&ht);
                /* a NaN on the last rank fails every rank alike; the next pass works */
                void *b[MAXN];
                float *x[MAXN];
                os_inputs(n, 300, dt, 7, 0, b, x);
                if (dt == ECHO_F32)
                    ((float *)b[n - 1])[5] = NAN;
                else
                    ((uint16_t *)b[n - 1])[5] = 0x7fc0;
                step s;
                call_all(&h, 1, 0, 300, dt, b, &s);
                assert_all_fail(&s, "inf/nan");
                for (int r = 0; r < n; r++)
                    ck_assert(echo_pass_failed_alike(h.c[r]));
                os_free(n, b, x);
                os_inputs(n, 300, dt, 8, 0, b, x);
                call_all(&h, 1, 0, 300, dt, b, &s);
                assert_all_ok(&s);
                /* another site on the last rank: every rank fails */
                memset(&s, 0, sizeof s);
                s.h = &h;
                s.begin = 1;
                s.dt = dt;
                for (int r = 0; r < n; r++) {
                    s.site[r] = r == n - 1 ? 2 : 1;
                    s.count[r] = 300;
                    s.buf[r] = b[r];
                }
                run_step(&s);
                assert_all_fail(&s, "disagree");
                call_all(&h, 1, 0, 300, dt, b, &s);
                assert_all_ok(&s);
                os_free(n, b, x);
                h_free(&h);
            }
        }
    }
    /* above the threshold: the two-shot's bits */
    harness ha, hb;
    echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, 0, 0, 4, 4097, 0, 0);
    h_init(&ha, 3, cfg);
    cfg.oneshot_bytes = 1000 * 4;
    h_init(&hb, 3, cfg);
    void *ba[MAXN], *bb[MAXN];
    float *xa[MAXN], *xb[MAXN];
    os_inputs(3, 4097, ECHO_F32, 9, 0, ba, xa);
    os_inputs(3, 4097, ECHO_F32, 9, 0, bb, xb);
    step s;
    call_all(&ha, 1, 0, 4097, ECHO_F32, ba, &s);
    assert_all_ok(&s);
    call_all(&hb, 1, 0, 4097, ECHO_F32, bb, &s);
    assert_all_ok(&s);
    for (int r = 0; r < 3; r++)
        ck_assert(!memcmp(ba[r], bb[r], 4097 * 4));
    os_free(3, ba, xa);
    os_free(3, bb, xb);
    h_free(&ha);
    h_free(&hb);
}
END_TEST

/* ================= 6. local transport on device memory ================= */

/* This suite runs on machines without a GPU and in builds without CUDA:
 * there echo_world_create_local_device must fail cleanly, say why, and
 * point at the host path. (On a GPU the transport's results are checked
 * against the host transport by tests/gpu/test_cuda_comm.c.) */
/* ---- echo_end_pass: the graphed pass's vote, launch and retry, and the
 * abort unless every rank failed alike (docs/echo.md §10). The local
 * transport has no deferred group: one rank votes with itself, more
 * ranks cannot vote (graphs need nccl). ---- */
static int launches;
static int count_launch(void *arg, char *err, size_t errlen) {
    (void)err, (void)errlen;
    launches++;
    return *(int *)arg;
}

START_TEST(test_pass_end) {
    const size_t m = 256;
    char err[320];
    int launch_rc = 0;
    float *x = malloc(m * 4);
    gen(x, m, 21, 0, 0);
    harness h;
    h_init(&h, 1, test_echo_cfg(ECHO_PRESET_ECHO, 32, 0, 4, m, 0, 0));
    echo_comm *c = h.c[0];
    /* eager: the calls run, no launch */
    echo_pass_end end = {.launch = count_launch, .arg = &launch_rc};
    launches = 0;
    ck_assert_msg(echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(echo_allreduce(c, 0, x, m, ECHO_F32, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(echo_end_pass(c, NULL, &end, err, sizeof err), 0);
    ck_assert_int_eq(launches, 0);
    /* a captured pass whose rank holds a graph: launched once */
    ck_assert_msg(echo_begin_pass(c, ECHO_PASS_CAPTURE, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(echo_allreduce(c, 0, x, m, ECHO_F32, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(echo_end_pass(c, NULL, &end, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(launches, 1);
    ck_assert_int_eq(end.aborted, 0);
    /* no graph held: 1, nothing launched, the pass taken back (its calls
     * need a new pass) */
    echo_pass_end none = {0};
    ck_assert_msg(echo_begin_pass(c, ECHO_PASS_CAPTURE, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(echo_end_pass(c, NULL, &none, err, sizeof err), 1);
    ck_assert_int_eq(launches, 1);
    ck_assert(echo_allreduce(c, 1, x, m, ECHO_F32, NULL, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "echo_begin_pass"), "%s", err);
    ck_assert_msg(echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(echo_allreduce(c, 0, x, m, ECHO_F32, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(echo_end_pass(c, NULL, &none, err, sizeof err), 0);
    /* a failed launch fails the pass and aborts the world */
    launch_rc = -1;
    ck_assert_msg(echo_begin_pass(c, ECHO_PASS_CAPTURE, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(echo_end_pass(c, NULL, &end, err, sizeof err), -1);
    ck_assert_int_eq(launches, 2);
    ck_assert_int_eq(end.aborted, 1);
    echo_world_clear_abort(h.w);
    /* replay needs a deferred world; an unknown mode is refused */
    ck_assert(echo_begin_pass(c, ECHO_PASS_REPLAY, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "deferred"), "%s", err);
    ck_assert(echo_begin_pass(c, (echo_pass_mode)7, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "mode"), "%s", err);
    h_free(&h);

    /* two ranks: a failure every rank reported alike (a non-finite input)
     * leaves the world as it is; a failure of one rank's own aborts it */
    const int n = 2;
    h_init(&h, n, test_echo_cfg(ECHO_PRESET_ECHO, 32, 0, 4, m, 0, 0));
    void *buf[MAXN];
    step st;
    for (int r = 0; r < n; r++) {
        buf[r] = malloc(m * 4);
        gen(buf[r], m, 22, 0, (uint64_t)r);
    }
    ((float *)buf[1])[3] = NAN;
    call_all(&h, 1, 0, m, ECHO_F32, buf, &st);
    assert_all_fail(&st, "aborted");
    for (int r = 0; r < n; r++) {
        echo_pass_end f = {.failed = 1};
        ck_assert_int_eq(echo_end_pass(h.c[r], NULL, &f, err, sizeof err), -1);
        ck_assert_msg(f.aborted == 0, "rank %d aborted a world every rank failed alike", r);
    }
    for (int r = 0; r < n; r++)
        gen(buf[r], m, 22, 1, (uint64_t)r);
    call_all(&h, 1, 0, m, ECHO_F32, buf, &st);
    assert_all_ok(&st);
    echo_pass_end f = {.failed = 1};
    ck_assert_msg(echo_begin_pass(h.c[0], ECHO_PASS_EAGER, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(echo_end_pass(h.c[0], NULL, &f, err, sizeof err), -1);
    ck_assert_int_eq(f.aborted, 1);
    call_all(&h, 1, 0, m, ECHO_F32, buf, &st);
    assert_all_fail(&st, "abort");
    echo_world_clear_abort(h.w);
    call_all(&h, 1, 0, m, ECHO_F32, buf, &st);
    assert_all_ok(&st);
    /* a graphed pass on a transport without a vote fails and aborts */
    ck_assert_msg(echo_begin_pass(h.c[0], ECHO_PASS_CAPTURE, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(echo_end_pass(h.c[0], NULL, &end, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no vote"), "%s", err);
    ck_assert_int_eq(end.aborted, 1);
    free_bufs(n, buf);
    h_free(&h);
    free(x);
}
END_TEST

START_TEST(test_local_device_unavailable) {
    char err[320] = "";
    echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, 0, 0, 4, 1000, 0, 0);
    echo_world *w = (echo_world *)&cfg; /* must come back NULL on failure */
    int rc = echo_world_create_local_device(2, 0, &cfg, &w, err, sizeof err);
#ifndef ECHO_HAVE_CUDA
    ck_assert_int_eq(rc, -1);
    ck_assert_ptr_null(w);
    ck_assert_msg(strstr(err, "CUDA=1") && strstr(err, "echo_world_create_local"), "%s", err);
#else
    if (rc == 0) {
        echo_world_destroy(w); /* a GPU is present: the GPU program checks it */
    } else {
        ck_assert_ptr_null(w);
        ck_assert_msg(strstr(err, "no usable CUDA device") && strstr(err, "echo_world_create_local"), "%s", err);
    }
    /* argument and configuration errors come first, GPU or not */
    w = (echo_world *)&cfg;
    ck_assert(echo_world_create_local_device(2, -1, &cfg, &w, err, sizeof err) != 0);
    ck_assert_ptr_null(w);
    ck_assert_msg(strstr(err, "device -1"), "%s", err);
    echo_config huge = cfg;
    huge.max_count = ((size_t)1 << 36) + 1;
    ck_assert(echo_world_create_local_device(2, 0, &huge, &w, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "2^36"), "%s", err);
    ck_assert(echo_world_create_local_device(0, 0, &cfg, &w, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "ranks"), "%s", err);
    echo_config badg = cfg;
    badg.group_size = 48;
    ck_assert(echo_world_create_local_device(2, 0, &badg, &w, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "group size"), "%s", err);
#endif
    /* the host path is unaffected */
    ck_assert_msg(echo_world_create_local(2, &cfg, &w, err, sizeof err) == 0, "%s", err);
    echo_world_destroy(w);
}
END_TEST

/* The device transport is local.c's schedule over a memory table
 * (echo_local_mem). Here that table is a stand-in on host memory that
 * claims device memory: it counts the stream synchronisations the schedule
 * asks for and can fail one, so the device-only logic of local.c runs on
 * the cpu: streams are accepted and handed to every hook, each barrier is
 * preceded by a sync, the exact path goes through the table's sum and
 * store, the results are the host transport's bits, and a rank whose device
 * step fails aborts the world instead of leaving its peers waiting. */
typedef struct fake_stream {
    int rank;
    int syncs, sums, stores;
    int fail_at; /* fail the sync with this 1-based number (0: never) */
} fake_stream;

static int fake_alloc(int device, size_t bytes, void **out, char *err, size_t errlen) {
    (void)device;
    *out = malloc(bytes ? bytes : 1);
    if (!*out) snprintf(err, errlen, "fake: out of memory");
    return *out ? 0 : -1;
}

static void fake_free(int device, void *p) {
    (void)device;
    free(p);
}

static int fake_sync(echo_comm *c, void *stream, char *err, size_t errlen) {
    fake_stream *fs = stream;
    (void)c;
    if (++fs->syncs == fs->fail_at) {
        snprintf(err, errlen, "fake: device error on rank %d", fs->rank);
        return -1;
    }
    return 0;
}

static int fake_sum(echo_comm *c, int nranks, echo_dtype dt, const void *const *x, const float *const *res, size_t n,
                    float *sum, void *stream, char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    ((fake_stream *)stream)->sums++;
    for (int j = 0; j < nranks; j++) {
        echo_cpu_load(x[j], dt, n, sum, j > 0);
        if (res[j]) echo_cpu_load(res[j], ECHO_F32, n, sum, 1);
    }
    return 0;
}

static int fake_store(echo_comm *c, const float *in, void *buf, echo_dtype dt, size_t n, size_t *bad, void *stream,
                      char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    ((fake_stream *)stream)->stores++;
    echo_cpu_store(in, n, buf, dt, bad);
    return 0;
}

static const echo_local_mem fake_device_mem = {
    .device_memory = 1,
    .alloc = fake_alloc,
    .free = fake_free,
    .sync = fake_sync,
    .sum = fake_sum,
    .store = fake_store,
};

typedef struct fake_arg {
    harness *h;
    int r, begin, ncalls;
    size_t count;
    echo_dtype dt;
    void *buf[4];
    fake_stream *fs;
    int rc;
    char err[320];
} fake_arg;

static void *fake_rank(void *p) {
    fake_arg *a = p;
    a->rc = 0;
    if (a->begin) a->rc = echo_begin_pass(a->h->c[a->r], ECHO_PASS_EAGER, a->err, sizeof a->err);
    for (int k = 0; k < a->ncalls && !a->rc; k++)
        a->rc = echo_allreduce(a->h->c[a->r], k, a->buf[k], a->count, a->dt, a->fs, a->err, sizeof a->err);
    return NULL;
}

/* Every rank runs `ncalls` calls of one pass on its own buffers. */
static void fake_run(harness *h, fake_arg *a, fake_stream *fs, size_t count, echo_dtype dt, int ncalls,
                     void *bufs[][4]) {
    pthread_t t[MAXN];
    for (int r = 0; r < h->n; r++) {
        a[r] = (fake_arg){.h = h, .r = r, .begin = 1, .ncalls = ncalls, .count = count, .dt = dt, .fs = &fs[r]};
        for (int k = 0; k < ncalls; k++)
            a[r].buf[k] = bufs ? bufs[r][k] : NULL;
        ck_assert_int_eq(pthread_create(&t[r], NULL, fake_rank, &a[r]), 0);
    }
    for (int r = 0; r < h->n; r++)
        pthread_join(t[r], NULL);
}

START_TEST(test_local_device_schedule_on_cpu) {
    enum { N = 3, K = 3 };
    const size_t m = 1001;
    const echo_preset modes[] = {ECHO_PRESET_EXACT, ECHO_PRESET_NOFB, ECHO_PRESET_ECHO};
    char err[320];
    for (int mi = 0; mi < 3; mi++)
        for (int dti = 0; dti < 2; dti++) {
            echo_dtype dt = dti ? ECHO_BF16 : ECHO_F32;
            size_t esz = dti ? 2 : 4;
            echo_config cfg = test_echo_cfg(modes[mi], 32, 0, K, m, 0, 0);
            harness hd, hh;
            memset(&hd, 0, sizeof hd);
            hd.n = N;
            ck_assert_msg(
                echo_local_world_create(N, 5, &fake_device_mem, &echo_host_compute, &cfg, &hd.w, err, sizeof err) == 0,
                "%s", err);
            for (int r = 0; r < N; r++) {
                ck_assert_msg(echo_comm_create(hd.w, r, &hd.c[r], err, sizeof err) == 0, "%s", err);
                ck_assert_int_eq(hd.c[r]->device, 5); /* every rank on the world's device */
            }
            h_init(&hh, N, cfg);
            /* the same inputs through both worlds, K calls of one pass */
            void *bd[N][4], *bh[N][4];
            for (int r = 0; r < N; r++)
                for (int k = 0; k < K; k++) {
                    bd[r][k] = malloc(m * esz);
                    bh[r][k] = malloc(m * esz);
                    for (size_t i = 0; i < m; i++) {
                        float v = unif(11, (uint64_t)k, (uint64_t)r, i);
                        if (dti)
                            ((uint16_t *)bd[r][k])[i] = to_bf16(v);
                        else
                            ((float *)bd[r][k])[i] = v;
                    }
                    memcpy(bh[r][k], bd[r][k], m * esz);
                }
            fake_stream fs[N];
            fake_arg a[N];
            memset(fs, 0, sizeof fs);
            for (int r = 0; r < N; r++)
                fs[r].rank = r;
            fake_run(&hd, a, fs, m, dt, K, bd);
            for (int r = 0; r < N; r++) {
                ck_assert_msg(a[r].rc == 0, "%s %s rank %d: %s", echo_preset_name(modes[mi]), dti ? "bf16" : "f32", r,
                              a[r].err);
                /* a sync before each of the two barriers of every call */
                ck_assert_int_eq(fs[r].syncs, 2 * K);
                ck_assert_int_eq(fs[r].stores, modes[mi] == ECHO_PRESET_EXACT ? K : 0);
                ck_assert_int_eq(fs[r].sums, modes[mi] == ECHO_PRESET_EXACT ? K : 0);
            }
            for (int k = 0; k < K; k++) {
                step s;
                void *b[MAXN];
                for (int r = 0; r < N; r++)
                    b[r] = bh[r][k];
                call_all(&hh, k == 0, k, m, dt, b, &s);
                assert_all_ok(&s);
                for (int r = 0; r < N; r++)
                    ck_assert_msg(memcmp(bd[r][k], bh[r][k], m * esz) == 0, "%s %s call %d rank %d differs",
                                  echo_preset_name(modes[mi]), dti ? "bf16" : "f32", k, r);
            }

            /* rank 1 fails its second sync (before barrier B of call 0):
             * it reports its own error, the peers waiting at B fail
             * "aborted" instead of hanging; after clearing, all works */
            memset(fs, 0, sizeof fs);
            for (int r = 0; r < N; r++)
                fs[r].rank = r;
            fs[1].fail_at = 2;
            fake_run(&hd, a, fs, m, dt, K, bd);
            for (int r = 0; r < N; r++) {
                ck_assert_int_eq(a[r].rc, -1);
                ck_assert_msg(strstr(a[r].err, r == 1 ? "fake: device error on rank 1" : "aborted"), "rank %d: %s", r,
                              a[r].err);
            }
            echo_world_clear_abort(hd.w);
            fs[1].fail_at = 0;
            fake_run(&hd, a, fs, m, dt, K, bd);
            for (int r = 0; r < N; r++)
                ck_assert_msg(a[r].rc == 0, "after clear, rank %d: %s", r, a[r].err);

            for (int r = 0; r < N; r++)
                for (int k = 0; k < K; k++) {
                    free(bd[r][k]);
                    free(bh[r][k]);
                }
            h_free(&hd);
            h_free(&hh);
        }
}
END_TEST

/* The name lists --help and messages print come from the tables: every row,
 * in row order, with the separator between (not before) names, cut to the
 * buffer and always terminated; echo_world_create's unknown-name message
 * lists the same rows. */
START_TEST(test_table_names) {
    char buf[512], want[512];
    size_t at = 0;
    want[0] = 0;
    for (int i = 0; echo_transport_at(i); i++)
        at += (size_t)snprintf(want + at, sizeof want - at, "%s%s", i ? ", " : "", echo_transport_at(i)->name);
    ck_assert_str_eq(echo_transport_names(buf, sizeof buf, ", "), want);
    ck_assert_msg(!strncmp(want, "local, nccl, mpi", 16), "%s", want);
    for (int lossy = 0; lossy < 2; lossy++) {
        at = 0;
        want[0] = 0;
        for (int k = ECHO_CODEC_DEFAULT + 1; k < ECHO_CODEC_COUNT; k++)
            if (!lossy || !echo_codec_get((echo_codec_id)k)->lossless)
                at += (size_t)snprintf(want + at, sizeof want - at, "%s%s", at ? "|" : "",
                                       echo_codec_get((echo_codec_id)k)->name);
        ck_assert_str_eq(echo_codec_names(buf, sizeof buf, "|", lossy), want);
    }
    ck_assert(strstr(buf, "hout2") && !strstr(buf, "none") && !strstr(buf, "bf16"));
    at = 0;
    want[0] = 0;
    for (int k = 0; k < ECHO_PRESET_COUNT; k++)
        at += (size_t)snprintf(want + at, sizeof want - at, "%s%s", k ? "," : "", echo_preset_name((echo_preset)k));
    ck_assert_str_eq(echo_preset_names(buf, sizeof buf, ","), want);
    /* every listed name parses back */
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        echo_preset p;
        ck_assert_msg(echo_preset_parse(tok, &p) == 0, "%s", tok);
    }
    char small[8];
    memset(small, 'x', sizeof small);
    ck_assert(echo_transport_names(small, sizeof small, ", ") == small);
    ck_assert_str_eq(small, "local, ");
    memset(small, 'x', sizeof small);
    echo_transport_names(small, 0, ", ");
    ck_assert_int_eq(small[0], 'x');
    echo_transport_names(small, 1, ", ");
    ck_assert_str_eq(small, "");

    echo_config cfg = {.codec = ECHO_CODEC_NONE, .n_sites = 1, .max_count = 64};
    echo_world_opts o = {.nranks = 2, .device = -1};
    echo_world *w = (echo_world *)&cfg;
    char err[256];
    ck_assert(echo_world_create("bogus", &o, &cfg, &w, err, sizeof err) != 0);
    ck_assert(w == NULL);
    snprintf(want, sizeof want, "echo: unknown transport 'bogus' (%s)", echo_transport_names(buf, sizeof buf, ", "));
    ck_assert_str_eq(err, want);
}
END_TEST


/* ---- hnf3 and echo3 (issue 30: a preset at <= 3.5 bits/value) ----
 * The spec, written here independently of comm/codec/echo_codec.h: after
 * the two outliers leave (bf16 + index) and the rest is rotated (H D,
 * had_rotate64), each rotated value u travels as the 3-bit code c (bits 3j
 * of each 24-bit little-endian word of 8) of the level L[c] * s nearest to
 * u, L the 8-level Lloyd-Max quantizer of a unit Gaussian and s the bf16
 * RMS of the group's rotated values. */
static const double nf3_levels[8] = {0.2451, 0.7560, 1.3440, 2.1520, -0.2451, -0.7560, -1.3440, -2.1520};

/* A standard normal from the test's own generator (Box-Muller). */
static double gauss(uint64_t seed, uint64_t i) {
    double a = (unif(seed, 1, 0, i) + 1.0) / 2.0, b = (unif(seed, 2, 0, i) + 1.0) / 2.0;
    return sqrt(-2.0 * log(a > 1e-12 ? a : 1e-12)) * cos(6.283185307179586 * b);
}

START_TEST(test_hnf3_codec) {
    /* the table and the preset users name */
    echo_codec_id id;
    int g;
    ck_assert(echo_codec_parse("hnf3-g256", &id, &g) == 0 && id == ECHO_CODEC_HNF3 && g == 256);
    ck_assert(echo_codec_parse("hnf3-g32", &id, &g) == -1); /* G >= 64 */
    ck_assert_double_eq(echo_codec_bits(ECHO_CODEC_HNF3, 256), 3.25);
    ck_assert_double_eq(echo_codec_bits(ECHO_CODEC_HNF3, 128), 3.5);
    ck_assert(!echo_codec_get(ECHO_CODEC_HNF3)->host_only); /* the cuda backend codes it too */
    echo_preset p;
    ck_assert(echo_preset_parse("echo3", &p) == 0 && p == ECHO_PRESET_ECHO3);
    echo_config pc = {.n_sites = 60};
    ck_assert(echo_preset_config(ECHO_PRESET_ECHO3, 0, 0, &pc) == 0);
    ck_assert(pc.codec == ECHO_CODEC_HNF3 && pc.feedback && pc.group_size == 256 && pc.tail_sites == 1 &&
              pc.tail_codec == ECHO_CODEC_BF16);
    ck_assert(echo_preset_config(ECHO_PRESET_ECHO3, ECHO_CODEC_HOUT2, 0, &pc) == -1);
    unsetenv("ECHO_TAIL");
    /* SmolLM2's pass: 59 calls at 3 + 64/256 bits, one at 16 */
    ck_assert(fabs(echo_config_bits(&pc) - (59 * 3.25 + 16) / 60) < 1e-12);
    ck_assert(echo_config_bits(&pc) <= 3.5);

    /* the wire against the spec, and the error on Gaussian and outlier inputs */
    const int gs[] = {64, 128, 256};
    for (int gi = 0; gi < 3; gi++)
        for (int kind = 0; kind < 2; kind++) {
            int G = gs[gi];
            size_t ng = 64, m = ng * (size_t)G, gb = echo_codec_group_bytes(ECHO_CODEC_HNF3, G);
            ck_assert_uint_eq(gb, (size_t)G * 3 / 8 + 8);
            float *x = malloc(m * 4), *y = malloc(m * 4);
            double *xd = malloc(m * sizeof(double)), u[256], e2 = 0, x2 = 0;
            uint8_t *wire = malloc(ng * gb);
            for (size_t i = 0; i < m; i++) {
                x[i] = (float)gauss(7 + (uint64_t)G, i);
                if (kind && i % 61 == 3) x[i] *= 40.0f; /* outlier channels */
                xd[i] = x[i];
            }
            char err[256];
            ck_assert_msg(!echo_codec_encode_as(ECHO_CODEC_HNF3, x, NULL, m, G, wire, err, sizeof err), "%s", err);
            ck_assert(!echo_codec_decode_as(ECHO_CODEC_HNF3, wire, m, G, y, 0, err, sizeof err));
            const uint8_t *codes = wire, *recs = wire + m / 8 * 3;
            for (size_t k = 0; k < ng; k++) {
                const uint8_t *rec = recs + k * 8;
                int i1 = rec[6], i2 = rec[7];
                double s = from_bf16((uint16_t)(rec[0] | rec[1] << 8));
                /* the outliers: the two largest |x| */
                double a3 = 0;
                for (int i = 0; i < G; i++)
                    if (i != i1 && i != i2) a3 = fmax(a3, fabs(xd[k * G + i]));
                ck_assert(i1 != i2 && fabs(xd[k * G + i1]) >= a3 && fabs(xd[k * G + i2]) >= a3);
                double xo[256];
                for (int i = 0; i < G; i++)
                    xo[i] = i == i1 || i == i2 ? 0.0 : xd[k * G + i];
                had_rotate64(xo, (size_t)G, 0, G, G, u);
                double ss = 0;
                for (int i = 0; i < G; i++)
                    ss += u[i] * u[i];
                ck_assert_msg(fabs(s - sqrt(ss / G)) <= 0x1p-8 * s, "G=%d group %zu: scale %g vs rms %g", G, k, s,
                              sqrt(ss / G));
                double v[256];
                for (int i = 0; i < G; i++) {
                    const uint8_t *t = codes + k * (size_t)G * 3 / 8 + 3 * (i / 8);
                    uint32_t w = (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16;
                    int c = (int)(w >> (3 * (i % 8)) & 7);
                    double dc = fabs(u[i] / s - nf3_levels[c]);
                    for (int c2 = 0; c2 < 8; c2++)
                        ck_assert_msg(dc <= fabs(u[i] / s - nf3_levels[c2]) + 1e-4,
                                      "G=%d group %zu value %d: code %d, level %d is nearer", G, k, i, c, c2);
                    v[i] = nf3_levels[c] * s;
                }
                /* the decoder: D H v / G, the outliers' bf16 values patched in */
                for (int j = 0; j < G; j++) {
                    double d = 0;
                    for (int i = 0; i < G; i++)
                        d += __builtin_popcount((unsigned)(i & j)) & 1 ? -v[i] : v[i];
                    d = (echo_had_neg(j) ? -d : d) / G;
                    if (j == i1) d = from_bf16((uint16_t)(rec[2] | rec[3] << 8));
                    if (j == i2) d = from_bf16((uint16_t)(rec[4] | rec[5] << 8));
                    ck_assert_msg(fabs(y[k * G + j] - d) <= 1e-5 * (s + fabs(d)), "G=%d group %zu value %d: decoded %g, spec %g",
                                  G, k, j, y[k * G + j], d);
                }
            }
            for (size_t i = 0; i < m; i++) {
                e2 += (y[i] - xd[i]) * (y[i] - xd[i]);
                x2 += xd[i] * xd[i];
            }
            /* Lloyd-Max at 3 bits: relative MSE 0.0345 on a Gaussian (rel. RMS 0.186); rotation
             * and the removed outliers take a little off. An absmax-scaled 7-level code
             * would give about 0.25, a wrong level more than 0.19. */
            double rel = sqrt(e2 / x2);
            ck_assert_msg(kind ? rel < 0.12 : rel > 0.16 && rel < 0.185, "G=%d kind %d: relative error %g", G, kind,
                          rel);
            free(x);
            free(y);
            free(xd);
            free(wire);
        }

    /* echo3 through the local transport: ranks agree, the tail's call is
     * bf16, feedback keeps the sum of a pass's outputs close */
    const int n = 3, S = 4;
    const size_t m = 3 * 256 * 4 + 40; /* a ragged last group */
    echo_config c3 = {.n_sites = S, .max_count = m};
    ck_assert(echo_preset_config(ECHO_PRESET_ECHO3, 0, 0, &c3) == 0);
    float *o[MAXN];
    for (int r = 0; r < n; r++)
        o[r] = malloc(S * m * sizeof(float));
    echo_stats st;
    tail_pass(c3, n, m, o, &st);
    ck_assert_uint_eq(st.calls[ECHO_PRESET_ECHO3], 3);
    ck_assert_uint_eq(st.calls[ECHO_PRESET_BF16], 1);
    for (int r = 1; r < n; r++)
        ck_assert(memcmp(o[0], o[r], S * m * sizeof(float)) == 0);
    double e2 = 0, x2 = 0;
    for (size_t i = 0; i < m; i++) {
        double sum = 0, ex = 0;
        for (int site = 0; site < S; site++) {
            sum += o[0][(size_t)site * m + i];
            for (int r = 0; r < n; r++)
                ex += unif(77, (uint64_t)site, (uint64_t)r, i);
        }
        e2 += (sum - ex) * (sum - ex);
        x2 += ex * ex;
    }
    /* the last call takes back the error left before it: bf16 rounding only */
    ck_assert_msg(sqrt(e2 / x2) < 0x1p-6, "echo3 pass error %g", sqrt(e2 / x2));
    for (int r = 0; r < n; r++)
        free(o[r]);
}
END_TEST

/* ---- --allreduce auto: the policy on fixed figures (comm/auto.c) ----
 * Codec speeds per thread rounded from echo_auto_measure_codecs on this
 * machine (AVX-512; bf16, echo = hout2-g128, echo3 = hnf3-g256), halved for
 * a lab host (4 hosts share 2 cores). The expected picks are worked by hand
 * from the cost model in comm/auto.c's header (two-shot, N = 4, a 512-token
 * chunk of hidden 1024 = 2 MiB, n = 524288 values), e.g. 1 Gbit/s:
 * exact 2*0.1 ms + 3.15 MB / 120 MB/s = 26.4 ms; bf16 13.3 + codec 0.8 =
 * 14.2 ms; echo 3.7 + codec 1.1 = 5.0 ms -> echo. */
static echo_auto_figures auto_cell(int nranks, double bw, double lat, int lab, int threads) {
    echo_auto_figures f = {.nranks = nranks, .threads = threads, .call_bytes = {4096, 512.0 * 1024 * 4}};
    double h = lab ? 0.5 : 1;
    const double enc[4] = {0, 2000e6, 1600e6, 1000e6}, dec[4] = {0, 10000e6, 5000e6, 2500e6};
    for (int i = 0; i < 4; i++) f.encode_vps[i] = enc[i] * h, f.decode_vps[i] = dec[i] * h;
    for (int k = 0; k < ECHO_AUTO_CLASSES; k++) f.link[k] = (echo_auto_link){lat, bw};
    return f;
}

static int lossless(echo_preset p) { return p == ECHO_PRESET_EXACT || p == ECHO_PRESET_BF16; }

START_TEST(test_auto_policy_cells) {
    char err[256];
    echo_auto_choice c;
    /* threads on one machine (SmolLM2 tp 3: hidden 576): memory at 10 GB/s,
     * 5 us a step; exact 0.17 ms, bf16 0.29, echo 0.36 -> lossless, no overlap */
    echo_auto_figures f = auto_cell(3, 10e9, 5e-6, 0, 1);
    f.shared_memory = 1;
    f.call_bytes[ECHO_AUTO_SMALL] = 576 * 4, f.call_bytes[ECHO_AUTO_LARGE] = 512.0 * 576 * 4;
    ck_assert(echo_auto_pick(&f, 1, &c, err, sizeof err) == 0);
    ck_assert(lossless(c.preset[ECHO_AUTO_LARGE]) && lossless(c.preset[ECHO_AUTO_SMALL]));
    ck_assert_int_eq(c.overlap_k, 1);
    /* per-host lab, unshaped (veth, ~3 GB/s, 30 us): exact 1.1 ms, bf16 1.4,
     * echo 1.34 -> exact */
    f = auto_cell(4, 3e9, 30e-6, 1, 1);
    ck_assert(echo_auto_pick(&f, 0, &c, err, sizeof err) == 0);
    ck_assert_int_eq(c.preset[ECHO_AUTO_LARGE], ECHO_PRESET_EXACT);
    ck_assert_int_eq(c.preset[ECHO_AUTO_SMALL], ECHO_PRESET_EXACT);
    ck_assert_int_eq(c.overlap_k, 2); /* a network, compute unknown */
    /* 10 Gbit/s lab (1.19 GB/s, 50 us): exact 2.74, bf16 2.24, echo 1.42 -> echo */
    f = auto_cell(4, 1.19e9, 50e-6, 1, 1);
    ck_assert(echo_auto_pick(&f, 0, &c, err, sizeof err) == 0);
    ck_assert_int_eq(c.preset[ECHO_AUTO_LARGE], ECHO_PRESET_ECHO);
    /* 1 Gbit/s (120 MB/s, 100 us): echo; a decode call (4 KB): exact
     * two-shot 0.25 ms, one-shot 0.20; echo one-shot 0.12 -> one-shot */
    f = auto_cell(4, 120e6, 100e-6, 1, 1);
    ck_assert(echo_auto_pick(&f, 0, &c, err, sizeof err) == 0);
    ck_assert_int_eq(c.preset[ECHO_AUTO_LARGE], ECHO_PRESET_ECHO);
    ck_assert_int_eq(c.oneshot[ECHO_AUTO_SMALL], 1);
    ck_assert(c.est_s[ECHO_AUTO_LARGE][0] > 0.025 && c.est_s[ECHO_AUTO_LARGE][0] < 0.028);
    /* compute-matched: 1 Gbit/s x 0.5 / C for hosts of C = 4, 8, 16 cores:
     * echo; echo3 when allowed (3.25 bits against 4.5, the wire dominating) */
    for (int cores = 4; cores <= 16; cores *= 2) {
        f = auto_cell(4, 125e6 * 0.5 / cores, 100e-6, 1, 1);
        ck_assert(echo_auto_pick(&f, 0, &c, err, sizeof err) == 0);
        ck_assert_int_eq(c.preset[ECHO_AUTO_LARGE], ECHO_PRESET_ECHO);
        ck_assert(isnan(c.est_s[ECHO_AUTO_LARGE][3]));
        ck_assert(echo_auto_pick(&f, 1, &c, err, sizeof err) == 0);
        ck_assert_int_eq(c.preset[ECHO_AUTO_LARGE], ECHO_PRESET_ECHO3);
    }
    /* the small class runs the large class's codec or exact, never a third */
    for (int i = 0; i < 50; i++) {
        f = auto_cell(2 + i % 5, 1e6 * (1 + i * 97 % 5000), 1e-6 * (i * 37 % 300), i & 1, 1 + i % 3);
        ck_assert(echo_auto_pick(&f, i & 2, &c, err, sizeof err) == 0);
        ck_assert(c.preset[ECHO_AUTO_SMALL] == ECHO_PRESET_EXACT || c.preset[ECHO_AUTO_SMALL] == c.preset[ECHO_AUTO_LARGE]);
        ck_assert(!(c.oneshot[ECHO_AUTO_SMALL] && c.preset[ECHO_AUTO_SMALL] == ECHO_PRESET_BF16));
    }
}
END_TEST

START_TEST(test_auto_policy_overlap_and_errors) {
    char err[256];
    echo_auto_choice c;
    /* 1 Gbit/s, echo's large call ~5 ms: compute of the same size -> overlap
     * (T(1) = 10 ms, T(2) = 5 + 2.5 + 0.2); compute far below the call ->
     * off (T(2) - T(1) = 0.2 ms of latency against 0.005 ms saved) */
    echo_auto_figures f = auto_cell(4, 120e6, 100e-6, 1, 1);
    f.compute_s = 5e-3;
    ck_assert(echo_auto_pick(&f, 0, &c, err, sizeof err) == 0);
    ck_assert(c.overlap_k >= 2);
    f.compute_s = 1e-5;
    ck_assert(echo_auto_pick(&f, 0, &c, err, sizeof err) == 0);
    ck_assert_int_eq(c.overlap_k, 1);
    /* figures that make no sense are refused, with a message */
    f = auto_cell(1, 1e9, 1e-5, 0, 1);
    ck_assert(echo_auto_pick(&f, 0, &c, err, sizeof err) == -1 && strstr(err, "ranks"));
    f = auto_cell(4, 0, 1e-5, 0, 1);
    ck_assert(echo_auto_pick(&f, 0, &c, err, sizeof err) == -1 && strstr(err, "link"));
    f = auto_cell(4, NAN, 1e-5, 0, 1);
    ck_assert(echo_auto_pick(&f, 0, &c, err, sizeof err) == -1);
    /* what --allreduce takes */
    echo_preset p = ECHO_PRESET_BF16;
    int am = -1;
    ck_assert(echo_allreduce_parse("auto", &p, &am) == 0 && am == 1 && p == ECHO_PRESET_BF16);
    ck_assert(echo_allreduce_parse("auto:echo3", &p, &am) == 0 && am == 2);
    ck_assert(echo_allreduce_parse("echo3", &p, &am) == 0 && am == 0 && p == ECHO_PRESET_ECHO3);
    ck_assert(echo_allreduce_parse("auto:int4", &p, &am) == -1);
    ck_assert(echo_allreduce_parse("autox", &p, &am) == -1);
    /* the measurements give figures the policy takes */
    f = (echo_auto_figures){.nranks = 2, .threads = 1, .call_bytes = {4096, 1 << 20}};
    ck_assert(echo_auto_measure_codecs(&f, err, sizeof err) == 0);
    for (int i = 1; i < ECHO_AUTO_CANDIDATES; i++) ck_assert(f.encode_vps[i] > 1e6 && f.decode_vps[i] > 1e6);
    ck_assert(f.encode_vps[0] == 0);
    echo_auto_measure_memory(&f);
    ck_assert(f.shared_memory && f.link[ECHO_AUTO_LARGE].bytes_per_s > 1e8);
    ck_assert(echo_auto_pick(&f, 0, &c, err, sizeof err) == 0);
    char d[1024];
    echo_auto_describe(&f, &c, d, sizeof d);
    ck_assert(strstr(d, "auto: calls <= 64 KB") && strstr(d, "shared memory"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("echo");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_codec_bound_and_size);
    tcase_add_test(tc, test_codec_edge_cases);
    tcase_add_test(tc, test_codec_arithmetic);
    tcase_add_test(tc, test_replicas_identical_and_exact);
    tcase_add_test(tc, test_workers_same_bits);
    tcase_add_test(tc, test_one_call_bound);
    tcase_add_test(tc, test_hadamard_one_call_bound);
    tcase_add_test(tc, test_codec_table);
    tcase_add_test(tc, test_table_names);
    tcase_add_test(tc, test_depth_independence);
    tcase_add_test(tc, test_lifecycle_errors);
    tcase_add_test(tc, test_reset_and_abort);
    tcase_add_test(tc, test_abort_wakes_peers);
    tcase_add_test(tc, test_size_policy_and_stats);
    tcase_add_test(tc, test_tail_policy);
    tcase_add_test(tc, test_hnf3_codec);
    tcase_add_test(tc, test_disagreement_then_next_call);
    tcase_add_test(tc, test_pass_end);
    tcase_add_test(tc, test_oneshot);
    tcase_add_test(tc, test_local_device_unavailable);
    tcase_add_test(tc, test_local_device_schedule_on_cpu);
    tcase_add_test(tc, test_auto_policy_cells);
    tcase_add_test(tc, test_auto_policy_overlap_and_errors);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
