/*
 * cpu: out(n, w.rows) = in(n, w.cols) · wᵀ in fp32, for every weight dtype
 * (F32, BF16, F16 and the block-quantized ones, read as they are stored).
 *
 * Numerics (the same on every path, so results depend neither on the
 * machine nor on how many tokens share a call -- the batch invariance the
 * server relies on): a dot product of length K keeps 16 lanes; lane l
 * accumulates acc = fma(x[k], w[k], acc) over k = 16c + l in c order, where
 * w[k] is the weight as fp32 (bf16/f16 widened, quantized blocks
 * dequantized exactly as quant.c does, which is ggml's dequantization);
 * then a fixed tree: a[i] = acc[i] + acc[i+8], b[i] = a[i] + a[i+4],
 * (b0 + b2) + (b1 + b3); then the K % 16 tail with sequential fmas. So a
 * quantized weight gives the bits its dequantized fp32 copy would give.
 *
 * Paths: AVX-512 (16 lanes in one register), AVX2+FMA (two), and portable C
 * (fmaf). Weights are widened in registers, never through a buffer, and a
 * register tile of TT tokens x TR rows loads each weight vector once for TT
 * tokens and each activation vector once for TR rows. Work is split in
 * tasks of MM_RB output rows; inside a task, tokens go in blocks of MM_TB
 * so the task's weight rows and the block's activations stay in L2.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define MM_RB 64 /* output rows per task */
#define MM_TB 60 /* tokens per cache block: ten 6-token tiles */
#define MM_DEQ_MIN 8 /* tokens from which a quantized row group is widened once per block */
#define MM_PF_AHEAD 2048 /* bytes: how far ahead a few-token tile prefetches its weight rows */
/* The wide AVX-512 tile of prefills: MM_WT tokens x MM_WR rows (MM_WR
 * divides 4), fewer widenings per fma than the 4 x 4 tile. */
#ifndef MM_WT
#define MM_WT 6
#define MM_WR 4
#endif

/* ---- portable C: the reference every vector path must equal ---- */

static float hsum16(const float *acc) {
    float a[8], b[4];
    for (int i = 0; i < 8; i++) a[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static float dot_c(const float *x, const float *w, int len) {
    float acc[16] = {0};
    int k = 0;
    for (; k + 16 <= len; k += 16)
        for (int l = 0; l < 16; l++) acc[l] = fmaf(x[k + l], w[k + l], acc[l]);
    float s = hsum16(acc);
    for (; k < len; k++) s = fmaf(x[k], w[k], s);
    return s;
}

/* One weight element as fp32 (the K % 16 tail of F32/BF16/F16 rows). */
static float w_elem(kern_dtype dt, const uint8_t *row, int k) {
    float v;
    cpu_dequant(dt, row, k, 1, &v);
    return v;
}

/* Few tokens: memory-bound, and the hardware prefetcher lags behind the
 * rows (half the speed without this for Q8_0, 13-20 % for bf16 on 2 MiB
 * pages). A tile of T <= 2 tokens prefetches the row group about
 * MM_PF_AHEAD bytes ahead (rows are contiguous when dense) over its loop,
 * *step bytes per pair of 16-element chunks; 0: no prefetch. */
static inline const char *pf_plan(int T, int R, const uint8_t *w, size_t ws, int nc, size_t *step) {
    const size_t group = (size_t)R * ws, ahead = group >= MM_PF_AHEAD ? 1 : (MM_PF_AHEAD + group - 1) / group;
    size_t st = T <= 2 && nc >= 2 ? (group + (size_t)nc / 2 - 1) / ((size_t)nc / 2) : 0;
    *step = (st + 63) & ~(size_t)63;
    return (const char *)w + ahead * group;
}

static inline __attribute__((always_inline)) void pf_pair(const char *pf, size_t step, int pair) {
    if (step == 64) /* one row of one token: a line per pair */
        _mm_prefetch(pf + (size_t)pair * 64, _MM_HINT_T0);
    else if (step)
        for (size_t o = 0; o < step; o += 64) _mm_prefetch(pf + (size_t)pair * step + o, _MM_HINT_T0);
}

/* ---- AVX-512 ---- */

#define A512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))

A512 INL float h16_512(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The f16 at p in every lane (vpbroadcastw + vcvtph2ps: fewer shuffles
 * than a scalar conversion and a broadcast). */
A512 INL __m512 h16x16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)h));
}

A512 INL float hsum512(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

/* Elements 16c .. 16c+15 of a row of dtype dt, as fp32: the dense dtypes
 * and Q6_K (Q8_0, Q4_0, Q4_1 and Q4_K come in pairs of chunks through
 * ld512x2, which shares a block's scales). */
A512 INL __m512 ld512(const int dt, const uint8_t *r, int c) {
    switch (dt) {
    case KERN_F32: return _mm512_loadu_ps((const float *)r + 16 * c);
    case KERN_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)(r + 32 * c));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case KERN_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + 32 * c)));
    case KERN_Q6_K: {
        const uint8_t *b = r + 210 * (c >> 4);
        int e0 = 16 * (c & 15), hh = e0 >> 7, s = (e0 & 127) >> 5, l0 = e0 & 31;
        __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 64 * hh + l0 + 32 * (s & 1))));
        __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 128 + 32 * hh + l0)));
        lo = _mm512_and_si512(_mm512_srli_epi32(lo, 4 * (s >> 1)), _mm512_set1_epi32(15));
        hi = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 2 * s), _mm512_set1_epi32(3)), 4);
        __m512i q = _mm512_sub_epi32(_mm512_or_si512(lo, hi), _mm512_set1_epi32(32));
        float ds = h16_512(b + 208) * (float)(int8_t)b[192 + 8 * hh + 2 * s + (l0 >> 4)];
        return _mm512_mul_ps(_mm512_set1_ps(ds), _mm512_cvtepi32_ps(q));
    }
    }
    return _mm512_setzero_ps();
}

/* Chunks 2p and 2p+1 at once: for the 32-element blocks (and Q4_K's
 * 32-element sub-blocks) they share a block's scales, computed once. */
A512 INL void ld512x2(const int dt, const uint8_t *r, int p, __m512 *v0, __m512 *v1) {
    switch (dt) {
    case KERN_Q8_0: {
        const uint8_t *b = r + 34 * p;
        __m512 d = h16x16(b);
        *v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)))), d);
        *v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)))), d);
        return;
    }
    case KERN_Q4_0:
    case KERN_Q4_1: {
        int q41 = dt == KERN_Q4_1;
        const uint8_t *b = r + (q41 ? 20 : 18) * p;
        __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + (q41 ? 4 : 2))));
        __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(q, 4);
        __m512 d = h16x16(b);
        if (!q41) {
            __m512i e = _mm512_set1_epi32(8);
            *v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(lo, e)), d);
            *v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(hi, e)), d);
        } else {
            __m512 m = h16x16(b + 2);
            *v0 = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(lo), d), m);
            *v1 = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(hi), d), m);
        }
        return;
    }
    case KERN_Q4_K: {
        const uint8_t *b = r + 144 * (p >> 3);
        int j = p & 7, sc, m;
        cpu_k_scale_min(b + 4, j, &sc, &m);
        __m512 d1 = _mm512_set1_ps(h16_512(b) * (float)sc), m1 = _mm512_set1_ps(h16_512(b + 2) * (float)m);
        const uint8_t *q = b + 16 + 32 * (j >> 1);
        __m512i f = _mm512_set1_epi32(15);
        __m512i a = _mm512_and_si512(_mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q)),
                                                       4 * (j & 1)), f);
        __m512i e = _mm512_and_si512(
            _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))), 4 * (j & 1)), f);
        *v0 = _mm512_sub_ps(_mm512_mul_ps(d1, _mm512_cvtepi32_ps(a)), m1);
        *v1 = _mm512_sub_ps(_mm512_mul_ps(d1, _mm512_cvtepi32_ps(e)), m1);
        return;
    }
    default:
        *v0 = ld512(dt, r, 2 * p);
        *v1 = ld512(dt, r, 2 * p + 1);
        return;
    }
}

/* T tokens (rows of x, ldx apart) x R weight rows (ws bytes apart) into
 * out[t * ldo + r]. */
A512 INL void tile512(const int dt, const int T, const int R, const float *x, size_t ldx, const uint8_t *w,
                      size_t ws, int K, float *o, size_t ldo) {
    __m512 acc[MM_WT > 4 ? MM_WT : 4][4];
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) acc[t][r] = _mm512_setzero_ps();
    int nc = K / 16, c = 0;
    size_t pf_step;
    const char *pf = pf_plan(T, R, w, ws, nc, &pf_step);
    for (; c + 2 <= nc; c += 2) {
        pf_pair(pf, pf_step, c / 2);
        __m512 w0[4], w1[4];
        for (int r = 0; r < R; r++) ld512x2(dt, w + r * ws, c >> 1, &w0[r], &w1[r]);
        for (int t = 0; t < T; t++) {
            __m512 x0 = _mm512_loadu_ps(x + t * ldx + 16 * c);
            for (int r = 0; r < R; r++) acc[t][r] = _mm512_fmadd_ps(x0, w0[r], acc[t][r]);
            __m512 x1 = _mm512_loadu_ps(x + t * ldx + 16 * c + 16);
            for (int r = 0; r < R; r++) acc[t][r] = _mm512_fmadd_ps(x1, w1[r], acc[t][r]);
        }
    }
    for (; c < nc; c++) { /* an odd chunk: F32/BF16/F16 rows only (blocks come in pairs of chunks) */
        __m512 wv[4];
        for (int r = 0; r < R; r++) wv[r] = ld512(dt, w + r * ws, c);
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_loadu_ps(x + t * ldx + 16 * c);
            for (int r = 0; r < R; r++) acc[t][r] = _mm512_fmadd_ps(xv, wv[r], acc[t][r]);
        }
    }
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) {
            float s = hsum512(acc[t][r]);
            for (int k = 16 * nc; k < K; k++) s = fmaf(x[t * ldx + k], w_elem(dt, w + r * ws, k), s);
            o[t * ldo + r] = s;
        }
}

#define TILE512_DT(DT, NAME)                                                                                  \
    A512 static void NAME(int T, int R, const float *x, size_t ldx, const uint8_t *w, size_t ws, int K, float *o, \
                          size_t ldo) {                                                                       \
        if (R == 4 && T > 1) { /* one token: a row at a time below (one memory stream: faster decode) */     \
            switch (T) {                                                                                      \
            case 4: tile512(DT, 4, 4, x, ldx, w, ws, K, o, ldo); return;                                      \
            case 3: tile512(DT, 3, 4, x, ldx, w, ws, K, o, ldo); return;                                      \
            case 2: tile512(DT, 2, 4, x, ldx, w, ws, K, o, ldo); return;                                      \
            default: tile512(DT, 1, 4, x, ldx, w, ws, K, o, ldo); return;                                     \
            }                                                                                                 \
        }                                                                                                     \
        for (int r = 0; r < R; r++) switch (T) {                                                              \
            case 4: tile512(DT, 4, 1, x, ldx, w + r * ws, ws, K, o + r, ldo); break;                          \
            case 3: tile512(DT, 3, 1, x, ldx, w + r * ws, ws, K, o + r, ldo); break;                          \
            case 2: tile512(DT, 2, 1, x, ldx, w + r * ws, ws, K, o + r, ldo); break;                          \
            default: tile512(DT, 1, 1, x, ldx, w + r * ws, ws, K, o + r, ldo); break;                         \
            }                                                                                                 \
    }                                                                                                         \
    A512 __attribute__((unused)) static void NAME##_w(const float *x, size_t ldx, const uint8_t *w, size_t ws,  \
                                                      int K, float *o, size_t ldo) {                          \
        tile512(DT, MM_WT, MM_WR, x, ldx, w, ws, K, o, ldo);                                                  \
    }                                                                                                         \
    A512 __attribute__((unused)) static void NAME##_deq(const uint8_t *w, size_t ws, int R, int K, float *buf) { \
        for (int r = 0; r < R; r++)                                                                           \
            for (int p = 0; p < K / 32; p++) {                                                                \
                __m512 v0, v1;                                                                                \
                ld512x2(DT, w + r * ws, p, &v0, &v1);                                                         \
                _mm512_storeu_ps(buf + (size_t)r * K + 32 * p, v0);                                           \
                _mm512_storeu_ps(buf + (size_t)r * K + 32 * p + 16, v1);                                      \
            }                                                                                                 \
    }

TILE512_DT(KERN_F32, t512_f32)
TILE512_DT(KERN_BF16, t512_bf16)
TILE512_DT(KERN_F16, t512_f16)
TILE512_DT(KERN_Q8_0, t512_q8_0)
TILE512_DT(KERN_Q4_0, t512_q4_0)
TILE512_DT(KERN_Q4_1, t512_q4_1)
TILE512_DT(KERN_Q4_K, t512_q4_k)
TILE512_DT(KERN_Q6_K, t512_q6_k)

A512 static float dot512(const float *a, const float *b, int len) {
    __m512 acc = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= len; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), acc);
    float s = hsum512(acc);
    for (; k < len; k++) s = fmaf(a[k], b[k], s);
    return s;
}

/* ---- AVX2 + FMA: the 16 lanes as two registers (lanes 0-7, 8-15) ---- */

#define A256 __attribute__((target("avx2,fma,f16c")))

typedef struct v16 {
    __m256 lo, hi;
} v16;

A256 INL float h16_256(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

A256 INL float hsum256(v16 v) {
    __m256 a = _mm256_add_ps(v.lo, v.hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

A256 INL __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

A256 INL v16 ld256(const int dt, const uint8_t *r, int c) {
    v16 v;
    switch (dt) {
    case KERN_F32:
        v.lo = _mm256_loadu_ps((const float *)r + 16 * c);
        v.hi = _mm256_loadu_ps((const float *)r + 16 * c + 8);
        return v;
    case KERN_BF16: {
        const uint8_t *p = r + 32 * c;
        v.lo = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
        v.hi = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16))), 16));
        return v;
    }
    case KERN_F16: {
        const uint8_t *p = r + 32 * c;
        v.lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        v.hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
        return v;
    }
    case KERN_Q8_0: {
        const uint8_t *b = r + 34 * (c >> 1), *q = b + 2 + 16 * (c & 1);
        __m256 d = _mm256_set1_ps(h16_256(b));
        v.lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))), d);
        v.hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8)))), d);
        return v;
    }
    case KERN_Q4_0:
    case KERN_Q4_1: {
        int q41 = dt == KERN_Q4_1;
        const uint8_t *b = r + (q41 ? 20 : 18) * (c >> 1), *q = b + (q41 ? 4 : 2);
        __m256i a = u8x8(q), e = u8x8(q + 8), f = _mm256_set1_epi32(15);
        a = (c & 1) ? _mm256_srli_epi32(a, 4) : _mm256_and_si256(a, f);
        e = (c & 1) ? _mm256_srli_epi32(e, 4) : _mm256_and_si256(e, f);
        __m256 d = _mm256_set1_ps(h16_256(b));
        if (!q41) {
            a = _mm256_sub_epi32(a, _mm256_set1_epi32(8));
            e = _mm256_sub_epi32(e, _mm256_set1_epi32(8));
            v.lo = _mm256_mul_ps(_mm256_cvtepi32_ps(a), d);
            v.hi = _mm256_mul_ps(_mm256_cvtepi32_ps(e), d);
        } else {
            __m256 m = _mm256_set1_ps(h16_256(b + 2));
            v.lo = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a), d), m);
            v.hi = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(e), d), m);
        }
        return v;
    }
    case KERN_Q4_K: {
        const uint8_t *b = r + 144 * (c >> 4);
        int cc = c & 15, j = cc >> 1, sc, m;
        cpu_k_scale_min(b + 4, j, &sc, &m);
        __m256 d1 = _mm256_set1_ps(h16_256(b) * (float)sc), m1 = _mm256_set1_ps(h16_256(b + 2) * (float)m);
        const uint8_t *q = b + 16 + 32 * (j >> 1) + 16 * (cc & 1);
        __m256i f = _mm256_set1_epi32(15);
        __m256i a = _mm256_and_si256(_mm256_srli_epi32(u8x8(q), 4 * (j & 1)), f);
        __m256i e = _mm256_and_si256(_mm256_srli_epi32(u8x8(q + 8), 4 * (j & 1)), f);
        v.lo = _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(a)), m1);
        v.hi = _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(e)), m1);
        return v;
    }
    case KERN_Q6_K: {
        const uint8_t *b = r + 210 * (c >> 4);
        int e0 = 16 * (c & 15), hh = e0 >> 7, s = (e0 & 127) >> 5, l0 = e0 & 31;
        const uint8_t *pl = b + 64 * hh + l0 + 32 * (s & 1), *ph = b + 128 + 32 * hh + l0;
        __m256 ds = _mm256_set1_ps(h16_256(b + 208) * (float)(int8_t)b[192 + 8 * hh + 2 * s + (l0 >> 4)]);
        __m256i f = _mm256_set1_epi32(15), t3 = _mm256_set1_epi32(3), o32 = _mm256_set1_epi32(32);
        for (int half = 0; half < 2; half++) {
            __m256i lo = _mm256_and_si256(_mm256_srli_epi32(u8x8(pl + 8 * half), 4 * (s >> 1)), f);
            __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u8x8(ph + 8 * half), 2 * s), t3), 4);
            __m256 y = _mm256_mul_ps(ds, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_or_si256(lo, hi), o32)));
            if (half)
                v.hi = y;
            else
                v.lo = y;
        }
        return v;
    }
    }
    v.lo = v.hi = _mm256_setzero_ps();
    return v;
}

A256 INL void tile256(const int dt, const int T, const int R, const float *x, size_t ldx, const uint8_t *w,
                      size_t ws, int K, float *o, size_t ldo) {
    v16 acc[4][2];
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) acc[t][r].lo = acc[t][r].hi = _mm256_setzero_ps();
    int nc = K / 16;
    size_t pf_step;
    const char *pf = pf_plan(T, R, w, ws, nc, &pf_step);
    for (int c = 0; c < nc; c++) {
        if (!(c & 1)) pf_pair(pf, pf_step, c / 2);
        v16 wv[2];
        for (int r = 0; r < R; r++) wv[r] = ld256(dt, w + r * ws, c);
        for (int t = 0; t < T; t++) {
            __m256 xl = _mm256_loadu_ps(x + t * ldx + 16 * c), xh = _mm256_loadu_ps(x + t * ldx + 16 * c + 8);
            for (int r = 0; r < R; r++) {
                acc[t][r].lo = _mm256_fmadd_ps(xl, wv[r].lo, acc[t][r].lo);
                acc[t][r].hi = _mm256_fmadd_ps(xh, wv[r].hi, acc[t][r].hi);
            }
        }
    }
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) {
            float s = hsum256(acc[t][r]);
            for (int k = 16 * nc; k < K; k++) s = fmaf(x[t * ldx + k], w_elem(dt, w + r * ws, k), s);
            o[t * ldo + r] = s;
        }
}

#define TILE256_DT(DT, NAME)                                                                                  \
    A256 static void NAME(int T, int R, const float *x, size_t ldx, const uint8_t *w, size_t ws, int K, float *o, \
                          size_t ldo) {                                                                       \
        if (R == 2 && T == 2) {                                                                               \
            tile256(DT, 2, 2, x, ldx, w, ws, K, o, ldo);                                                      \
            return;                                                                                           \
        }                                                                                                     \
        /* one token: a row at a time, one stream through memory (faster at                                  \
         * batch-1 decode than rows side by side; each row's sum is the same) */                              \
        for (int r = 0; r < R; r++) {                                                                         \
            if (T == 2)                                                                                       \
                tile256(DT, 2, 1, x, ldx, w + r * ws, ws, K, o + r, ldo);                                     \
            else                                                                                              \
                tile256(DT, 1, 1, x, ldx, w + r * ws, ws, K, o + r, ldo);                                     \
        }                                                                                                     \
    }                                                                                                         \
    A256 __attribute__((unused)) static void NAME##_w(const float *x, size_t ldx, const uint8_t *w, size_t ws,  \
                                                      int K, float *o, size_t ldo) {                          \
        tile256(DT, 4, 1, x, ldx, w, ws, K, o, ldo);                                                          \
    }                                                                                                         \
    A256 __attribute__((unused)) static void NAME##_deq(const uint8_t *w, size_t ws, int R, int K, float *buf) { \
        for (int r = 0; r < R; r++)                                                                           \
            for (int c = 0; c < K / 16; c++) {                                                                \
                v16 v = ld256(DT, w + r * ws, c);                                                             \
                _mm256_storeu_ps(buf + (size_t)r * K + 16 * c, v.lo);                                         \
                _mm256_storeu_ps(buf + (size_t)r * K + 16 * c + 8, v.hi);                                     \
            }                                                                                                 \
    }

TILE256_DT(KERN_F32, t256_f32)
TILE256_DT(KERN_BF16, t256_bf16)
TILE256_DT(KERN_F16, t256_f16)
TILE256_DT(KERN_Q8_0, t256_q8_0)
TILE256_DT(KERN_Q4_0, t256_q4_0)
TILE256_DT(KERN_Q4_1, t256_q4_1)
TILE256_DT(KERN_Q4_K, t256_q4_k)
TILE256_DT(KERN_Q6_K, t256_q6_k)

A256 static float dot256(const float *a, const float *b, int len) {
    v16 acc = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int k = 0;
    for (; k + 16 <= len; k += 16) {
        acc.lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc.lo);
        acc.hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc.hi);
    }
    float s = hsum256(acc);
    for (; k < len; k++) s = fmaf(a[k], b[k], s);
    return s;
}

A512 static void axpy512(float *y, float a, const float *x, int len) {
    __m512 av = _mm512_set1_ps(a);
    int k = 0;
    for (; k + 16 <= len; k += 16)
        _mm512_storeu_ps(y + k, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + k), _mm512_loadu_ps(y + k)));
    for (; k < len; k++) y[k] = fmaf(a, x[k], y[k]);
}

A256 static void axpy256(float *y, float a, const float *x, int len) {
    __m256 av = _mm256_set1_ps(a);
    int k = 0;
    for (; k + 8 <= len; k += 8)
        _mm256_storeu_ps(y + k, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + k), _mm256_loadu_ps(y + k)));
    for (; k < len; k++) y[k] = fmaf(a, x[k], y[k]);
}

/* Attention's p·v with cpu_axpy's exact operations: the weighted sum of
 * value rows kept in registers across keys instead of stored after each. */
A512 static void wsum512(float *o, const float *w, const float *const *v, int n, int len) {
    int c = 0;
    for (; c + 64 <= len; c += 64) {
        __m512 o0 = _mm512_loadu_ps(o + c), o1 = _mm512_loadu_ps(o + c + 16), o2 = _mm512_loadu_ps(o + c + 32),
               o3 = _mm512_loadu_ps(o + c + 48);
        for (int p = 0; p < n; p++) {
            __m512 wv = _mm512_set1_ps(w[p]);
            o0 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v[p] + c), o0);
            o1 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v[p] + c + 16), o1);
            o2 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v[p] + c + 32), o2);
            o3 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(v[p] + c + 48), o3);
        }
        _mm512_storeu_ps(o + c, o0);
        _mm512_storeu_ps(o + c + 16, o1);
        _mm512_storeu_ps(o + c + 32, o2);
        _mm512_storeu_ps(o + c + 48, o3);
    }
    if (c < len)
        for (int p = 0; p < n; p++) axpy512(o + c, w[p], v[p] + c, len - c);
}


/* M (1..4) queries against nk keys ldk floats apart, one key at a time:
 * dot256's lanes, tree and tail for every pair, without the matmul tile's
 * weight prefetch (keys in place are short rows far apart). */
A256 INL void scoresm256(const int M, const float *q, size_t ldq, const float *k, size_t ldk, int nk, int K,
                         float *out, size_t ldo) {
    const int nc = K / 16;
    for (int p = 0; p < nk; p++, k += ldk) {
        v16 acc[4];
        for (int j = 0; j < M; j++) acc[j].lo = acc[j].hi = _mm256_setzero_ps();
        for (int c = 0; c < nc; c++) {
            __m256 kl = _mm256_loadu_ps(k + 16 * c), kh = _mm256_loadu_ps(k + 16 * c + 8);
            for (int j = 0; j < M; j++) {
                acc[j].lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * ldq + 16 * c), kl, acc[j].lo);
                acc[j].hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * ldq + 16 * c + 8), kh, acc[j].hi);
            }
        }
        for (int j = 0; j < M; j++) {
            float s = hsum256(acc[j]);
            for (int e = 16 * nc; e < K; e++) s = fmaf(q[j * ldq + e], k[e], s);
            out[j * ldo + p] = s;
        }
    }
}

A256 static void scores256(const float *q, size_t ldq, int nq, const float *k, size_t ldk, int nk, int K, float *out,
                           size_t ldo) {
    for (int i = 0; i < nq; i += 4) {
        const float *qi = q + (size_t)i * ldq;
        float *oi = out + (size_t)i * ldo;
        switch (nq - i < 4 ? nq - i : 4) {
        case 4: scoresm256(4, qi, ldq, k, ldk, nk, K, oi, ldo); break;
        case 3: scoresm256(3, qi, ldq, k, ldk, nk, K, oi, ldo); break;
        case 2: scoresm256(2, qi, ldq, k, ldk, nk, K, oi, ldo); break;
        default: scoresm256(1, qi, ldq, k, ldk, nk, K, oi, ldo); break;
        }
    }
}

/* cpu_wsum on AVX2 with the sums in registers: 64 columns (eight
 * registers) at a time, the rest through axpy256; the same fmas in the
 * same order as axpy256 over the keys. */
A256 static void wsum256(float *o, const float *w, const float *const *v, int n, int len) {
    int c = 0;
    for (; c + 64 <= len; c += 64) {
        __m256 a[8];
        for (int j = 0; j < 8; j++) a[j] = _mm256_loadu_ps(o + c + 8 * j);
        for (int p = 0; p < n; p++) {
            __m256 wv = _mm256_set1_ps(w[p]);
            for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v[p] + c + 8 * j), a[j]);
        }
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(o + c + 8 * j, a[j]);
    }
    if (c < len)
        for (int p = 0; p < n; p++) axpy256(o + c, w[p], v[p] + c, len - c);
}

/* M (1..4) outputs over the same n value rows, 16 columns at a time: each
 * value vector loaded once for the M. */
A256 INL void wsumm256(const int M, float *const *o, const float *const *w, const float *const *v, int n, int len) {
    int c = 0;
    for (; c + 16 <= len; c += 16) {
        __m256 a[4][2];
        for (int j = 0; j < M; j++) {
            a[j][0] = _mm256_loadu_ps(o[j] + c);
            a[j][1] = _mm256_loadu_ps(o[j] + c + 8);
        }
        for (int p = 0; p < n; p++) {
            __m256 v0 = _mm256_loadu_ps(v[p] + c), v1 = _mm256_loadu_ps(v[p] + c + 8);
            for (int j = 0; j < M; j++) {
                __m256 wv = _mm256_set1_ps(w[j][p]);
                a[j][0] = _mm256_fmadd_ps(wv, v0, a[j][0]);
                a[j][1] = _mm256_fmadd_ps(wv, v1, a[j][1]);
            }
        }
        for (int j = 0; j < M; j++) {
            _mm256_storeu_ps(o[j] + c, a[j][0]);
            _mm256_storeu_ps(o[j] + c + 8, a[j][1]);
        }
    }
    if (c < len)
        for (int j = 0; j < M; j++)
            for (int p = 0; p < n; p++) axpy256(o[j] + c, w[j][p], v[p] + c, len - c);
}

A256 static void wsumg256(int m, float *const *o, const float *const *w, const float *const *v, int n, int len) {
    switch (m) {
    case 4: wsumm256(4, o, w, v, n, len); return;
    case 3: wsumm256(3, o, w, v, n, len); return;
    case 2: wsumm256(2, o, w, v, n, len); return;
    default: wsumm256(1, o, w, v, n, len); return;
    }
}

/* Four queries' p·v over their first n keys (then each goes on alone):
 * each value row loaded once for the four. */
A512 static void wsum4_512(float *const *o, const float *const *w, const float *const *v, int n, int len) {
    int c = 0;
    for (; c + 32 <= len; c += 32) {
        __m512 a[4][2];
        for (int j = 0; j < 4; j++) {
            a[j][0] = _mm512_loadu_ps(o[j] + c);
            a[j][1] = _mm512_loadu_ps(o[j] + c + 16);
        }
        for (int p = 0; p < n; p++) {
            __m512 v0 = _mm512_loadu_ps(v[p] + c), v1 = _mm512_loadu_ps(v[p] + c + 16);
            for (int j = 0; j < 4; j++) {
                __m512 wv = _mm512_set1_ps(w[j][p]);
                a[j][0] = _mm512_fmadd_ps(wv, v0, a[j][0]);
                a[j][1] = _mm512_fmadd_ps(wv, v1, a[j][1]);
            }
        }
        for (int j = 0; j < 4; j++) {
            _mm512_storeu_ps(o[j] + c, a[j][0]);
            _mm512_storeu_ps(o[j] + c + 16, a[j][1]);
        }
    }
    if (c < len)
        for (int j = 0; j < 4; j++)
            for (int p = 0; p < n; p++) axpy512(o[j] + c, w[j][p], v[p] + c, len - c);
}

void cpu_wsum4(int isa, float *const *o, const float *const *w, const float *const *v, const int *n, int len) {
    int m = n[0];
    for (int j = 1; j < 4; j++) m = n[j] < m ? n[j] : m;
    if (isa >= CPU_ISA_AVX512)
        wsum4_512(o, w, v, m, len);
    else if (isa >= CPU_ISA_AVX2)
        wsumg256(4, o, w, v, m, len);
    else
        for (int j = 0; j < 4; j++) cpu_wsum(isa, o[j], w[j], v, m, len);
    for (int j = 0; j < 4; j++) cpu_wsum(isa, o[j], w[j] + m, v + m, n[j] - m, len);
}

void cpu_wsum_m(int isa, float *const *o, const float *const *w, const float *const *v, int m, int n, int len) {
    for (int j = 0; j < m; j += 4) {
        int k = m - j < 4 ? m - j : 4;
        if (isa >= CPU_ISA_AVX512 && k == 4) {
            wsum4_512(o + j, w + j, v, n, len);
        } else if (isa >= CPU_ISA_AVX2 && isa < CPU_ISA_AVX512) {
            wsumg256(k, o + j, w + j, v, n, len);
        } else {
            for (int i = j; i < j + k; i++) cpu_wsum(isa, o[i], w[i], v, n, len);
        }
    }
}

void cpu_wsum(int isa, float *o, const float *w, const float *const *v, int n, int len) {
    if (isa >= CPU_ISA_AVX512) {
        wsum512(o, w, v, n, len);
        return;
    }
    if (isa >= CPU_ISA_AVX2) {
        wsum256(o, w, v, n, len);
        return;
    }
    for (int p = 0; p < n; p++) cpu_axpy(isa, o, w[p], v[p], len);
}

void cpu_axpy(int isa, float *y, float a, const float *x, int len) {
    if (isa >= CPU_ISA_AVX512) {
        axpy512(y, a, x, len);
    } else if (isa >= CPU_ISA_AVX2) {
        axpy256(y, a, x, len);
    } else {
        for (int k = 0; k < len; k++) y[k] = fmaf(a, x[k], y[k]);
    }
}

float cpu_dot(int isa, const float *a, const float *b, int len) {
    if (isa >= CPU_ISA_AVX512) return dot512(a, b, len);
    if (isa >= CPU_ISA_AVX2) return dot256(a, b, len);
    return dot_c(a, b, len);
}

/* ---- the op ---- */

typedef void (*mm_tile_fn)(int T, int R, const float *x, size_t ldx, const uint8_t *w, size_t ws, int K, float *o,
                           size_t ldo);

typedef void (*mm_deq_fn)(const uint8_t *w, size_t ws, int R, int K, float *buf);
typedef void (*mm_wide_fn)(const float *x, size_t ldx, const uint8_t *w, size_t ws, int K, float *o, size_t ldo);

typedef struct mm_args {
    float *out;
    const float *in;
    const kern_weight *w;
    int n, isa;
    mm_tile_fn tile, tile_f32;
    mm_deq_fn deq; /* quantized weights at n >= MM_DEQ_MIN (AVX-512, AVX2) */
    mm_wide_fn wide, wide_f32; /* wt x wr tiles of many tokens (AVX-512 6 x 4, AVX2 4 x 1) */
    int wt, wr;
    int tt, tr; /* the tile's tokens and rows */
    size_t ws;  /* bytes between weight rows */
    int failed; /* set by a (portable-path) task that could not allocate */
} mm_args;

static mm_deq_fn mm_pick_deq(int isa, kern_dtype dt) {
    static const mm_deq_fn d512[] = {NULL,         NULL,         NULL,         t512_q8_0_deq,
                                     t512_q4_0_deq, t512_q4_1_deq, t512_q4_k_deq, t512_q6_k_deq};
    static const mm_deq_fn d256[] = {NULL,         NULL,         NULL,         t256_q8_0_deq,
                                     t256_q4_0_deq, t256_q4_1_deq, t256_q4_k_deq, t256_q6_k_deq};
    if ((unsigned)dt >= sizeof d512 / sizeof *d512 || isa < CPU_ISA_AVX2) return NULL;
    return isa >= CPU_ISA_AVX512 ? d512[dt] : d256[dt];
}

static mm_wide_fn mm_pick_wide(int isa, kern_dtype dt) {
    if (isa >= CPU_ISA_AVX512)
        return dt == KERN_F32 ? t512_f32_w : dt == KERN_BF16 ? t512_bf16_w : dt == KERN_F16 ? t512_f16_w : NULL;
    if (isa >= CPU_ISA_AVX2)
        return dt == KERN_F32 ? t256_f32_w : dt == KERN_BF16 ? t256_bf16_w : dt == KERN_F16 ? t256_f16_w : NULL;
    return NULL;
}

static mm_tile_fn mm_pick(int isa, kern_dtype dt) {
    static const mm_tile_fn t512[] = {t512_f32, t512_f16, t512_bf16, t512_q8_0, t512_q4_0, t512_q4_1, t512_q4_k,
                                      t512_q6_k};
    static const mm_tile_fn t256[] = {t256_f32, t256_f16, t256_bf16, t256_q8_0, t256_q4_0, t256_q4_1, t256_q4_k,
                                      t256_q6_k};
    if ((unsigned)dt >= sizeof t512 / sizeof *t512) return NULL;
    return isa >= CPU_ISA_AVX512 ? t512[dt] : isa >= CPU_ISA_AVX2 ? t256[dt] : NULL;
}

/* The portable path: the task's rows widened once into a buffer, then the
 * reference dot per (token, row). */
static void mm_task_c(mm_args *a, int r0, int r1) {
    int K = (int)a->w->cols, rows = (int)a->w->rows;
    float *wf = malloc((size_t)(r1 - r0) * (size_t)K * sizeof *wf);
    if (!wf) {
        a->failed = 1;
        return;
    }
    cpu_load_rows(wf, a->w, r0, r1 - r0);
    for (int i = 0; i < a->n; i++)
        for (int r = r0; r < r1; r++)
            a->out[(size_t)i * rows + r] = dot_c(a->in + (size_t)i * K, wf + (size_t)(r - r0) * K, K);
    free(wf);
}

static void mm_task(void *arg, int task) {
    mm_args *a = arg;
    int K = (int)a->w->cols, rows = (int)a->w->rows;
    int r0 = task * MM_RB, r1 = r0 + MM_RB < rows ? r0 + MM_RB : rows;
    if (!a->tile) {
        mm_task_c(a, r0, r1);
        return;
    }
    const uint8_t *W = a->w->data;
    /* Many tokens of a quantized weight: the task's rows are dequantized
     * once into a buffer (the same fp32 values the registers would hold, so
     * the same bits; at most MM_RB x K floats, L2-sized) and the fp32 tiles
     * run on it for every token block. */
    float *buf = NULL;
    if (a->deq && a->n >= MM_DEQ_MIN) {
        buf = malloc((size_t)(r1 - r0) * K * sizeof *buf);
        if (!buf) {
            a->failed = 1;
            return;
        }
        for (int r = r0; r < r1; r += a->tr) {
            int R = r1 - r < a->tr ? r1 - r : a->tr;
            a->deq(W + (size_t)r * a->ws, a->ws, R, K, buf + (size_t)(r - r0) * K);
        }
    }
    const uint8_t *base = buf ? (const uint8_t *)buf : W;
    size_t ws = buf ? (size_t)K * sizeof *buf : a->ws;
    int rb = buf ? r0 : 0; /* the first row held at base */
    mm_tile_fn tile = buf ? a->tile_f32 : a->tile;
    mm_wide_fn wide = buf ? a->wide_f32 : a->wide;
    for (int t0 = 0; t0 < a->n; t0 += MM_TB) {
        int t1 = t0 + MM_TB < a->n ? t0 + MM_TB : a->n;
        for (int r = r0; r < r1; r += a->tr) {
            int R = r1 - r < a->tr ? r1 - r : a->tr;
            const uint8_t *wr = base + (size_t)(r - rb) * ws;
            for (int t = t0; t < t1;) {
                const float *x = a->in + (size_t)t * K;
                float *o = a->out + (size_t)t * rows + r;
                if (wide && R == a->tr && t1 - t >= a->wt) {
                    for (int rr = 0; rr < R; rr += a->wr)
                        wide(x, (size_t)K, wr + (size_t)rr * ws, ws, K, o + rr, (size_t)rows);
                    t += a->wt;
                    continue;
                }
                int T = t1 - t < a->tt ? t1 - t : a->tt;
                tile(T, R, x, (size_t)K, wr, ws, K, o, (size_t)rows);
                t += T;
            }
        }
    }
    free(buf);
}

int cpu_matmul(kern_backend *be, void *out, const void *in, const kern_weight *w, int n) {
    if (out == in) return kern_fail(be, "matmul: out must not alias in");
    if (w->dtype == KERN_Q8_0_A8) return cpu_matmul_q8a8(be, out, in, w, n);
    if (cpu_is_a8p(w->dtype)) return cpu_matmul_a8p(be, out, in, w, n);
    int bl = kern_dtype_block(w->dtype);
    size_t bb = kern_dtype_block_bytes(w->dtype);
    int64_t ld = w->ld ? w->ld : w->cols;
    if (!bb || w->cols % bl || ld % bl)
        return kern_fail(be, "matmul: weight (%lld, %lld) of dtype %s: bad dtype or not whole blocks",
                         (long long)w->rows, (long long)w->cols, kern_dtype_name(w->dtype));
    int isa = cpu_isa(be);
    mm_args a = {out,
                 in,
                 w,
                 n,
                 isa,
                 mm_pick(isa, w->dtype),
                 mm_pick(isa, KERN_F32),
                 mm_pick_deq(isa, w->dtype),
                 mm_pick_wide(isa, w->dtype),
                 mm_pick_wide(isa, KERN_F32),
                 isa >= CPU_ISA_AVX512 ? MM_WT : 4,
                 isa >= CPU_ISA_AVX512 ? MM_WR : 1,
                 0,
                 0,
                 kern_dtype_bytes(w->dtype, ld),
                 0};
    a.tt = isa >= CPU_ISA_AVX512 ? 4 : 2;
    a.tr = isa >= CPU_ISA_AVX512 ? 4 : 2;
    int ntasks = (int)((w->rows + MM_RB - 1) / MM_RB);
    cpu_parallel_for(be, ntasks, mm_task, &a);
    if (a.failed) return kern_fail(be, "matmul: out of memory for a %dx%lld weight block", MM_RB,
                                   (long long)w->cols);
    return 0;
}

/* Attention's q·kᵀ for a block of queries: out[i * ldo + p] = cpu_dot(q_i,
 * k_p, hd) for i < nq, p < nk (k rows ldk apart), through the matmul
 * tiles (four queries share each key load): the same bits as cpu_dot. */
void cpu_scores_ld(int isa, const float *q, size_t ldq, int nq, const float *k, size_t ldk, int nk, int hd, float *out,
                   size_t ldo) {
    mm_tile_fn tile = mm_pick(isa, KERN_F32);
    if (!tile) {
        for (int i = 0; i < nq; i++)
            for (int p = 0; p < nk; p++) out[(size_t)i * ldo + p] = dot_c(q + (size_t)i * ldq, k + (size_t)p * ldk, hd);
        return;
    }
    if (isa == CPU_ISA_AVX2 && ldk != (size_t)hd) {
        scores256(q, ldq, nq, k, ldk, nk, hd, out, ldo);
        return;
    }
    int tt = isa >= CPU_ISA_AVX512 ? 4 : 2, tr = tt;
    for (int p = 0; p < nk; p += tr) {
        int R = nk - p < tr ? nk - p : tr;
        for (int i = 0; i < nq; i += tt) {
            int T = nq - i < tt ? nq - i : tt;
            tile(T, R, q + (size_t)i * ldq, ldq, (const uint8_t *)(k + (size_t)p * ldk), ldk * sizeof(float), hd,
                 out + (size_t)i * ldo + p, ldo);
        }
    }
}

void cpu_scores(int isa, const float *q, size_t ldq, int nq, const float *k, int nk, int hd, float *out, size_t ldo) {
    cpu_scores_ld(isa, q, ldq, nq, k, (size_t)hd, nk, hd, out, ldo);
}
