/*
 * cpu: the KV cache's storage types (kernels.h, kern_kv_dtype). kv_store
 * writes kernels/kv.h's reference bytes; attention widens a few cache rows
 * of one kv head at a time into an fp32 tile (cpu_kv_load_rows) and runs
 * the fp32 kernels on it, so a 16- or 8-bit cache is read at its own width
 * and never copied whole. The widening is exact (bf16/fp16) or one fp32
 * multiply (q8_0): every isa gives kern_kv_load_ref's values.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kv.h"

#define A512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define A256 __attribute__((target("avx2,fma,f16c")))

static void load_c(kern_kv_dtype dt, const uint8_t *src, size_t ld, int n, int hd, float *dst, size_t ldd) {
    for (int r = 0; r < n; r++) kern_kv_load_ref(dt, src + (size_t)r * ld, hd, dst + (size_t)r * ldd);
}

A256 static void load256(kern_kv_dtype dt, const uint8_t *src, size_t ld, int n, int hd, float *dst, size_t ldd) {
    for (int r = 0; r < n; r++) {
        const uint8_t *s = src + (size_t)r * ld;
        float *d = dst + (size_t)r * ldd;
        int j = 0;
        switch (dt) {
        case KERN_KV_BF16:
            for (; j + 8 <= hd; j += 8) {
                __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + 2 * j)));
                _mm256_storeu_ps(d + j, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
            }
            break;
        case KERN_KV_F16:
            for (; j + 8 <= hd; j += 8) _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * j))));
            break;
        case KERN_KV_Q8_0:
            for (; j < hd; j += KERN_KV_Q8_BLOCK) {
                __m256 sc = _mm256_set1_ps(kern_kv_f16_to_f32((uint16_t)(s[hd + j / 16] | s[hd + j / 16 + 1] << 8)));
                for (int u = 0; u < KERN_KV_Q8_BLOCK; u += 8) {
                    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(s + j + u)));
                    _mm256_storeu_ps(d + j + u, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(q)));
                }
            }
            break;
        default: memcpy(d, s, (size_t)hd * 4); j = hd; break;
        }
        if (j < hd) { /* a tail of a 16-bit head: the reference, element by element */
            float t[KERN_KV_MAX_HD];
            kern_kv_load_ref(dt, s, hd, t);
            memcpy(d + j, t + j, (size_t)(hd - j) * 4);
        }
    }
}

A512 static void load512(kern_kv_dtype dt, const uint8_t *src, size_t ld, int n, int hd, float *dst, size_t ldd) {
    if (dt != KERN_KV_Q8_0 && hd % 16) {
        load256(dt, src, ld, n, hd, dst, ldd);
        return;
    }
    for (int r = 0; r < n; r++) {
        const uint8_t *s = src + (size_t)r * ld;
        float *d = dst + (size_t)r * ldd;
        switch (dt) {
        case KERN_KV_BF16:
            for (int j = 0; j < hd; j += 16) {
                __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + 2 * j)));
                _mm512_storeu_ps(d + j, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
            }
            break;
        case KERN_KV_F16:
            for (int j = 0; j < hd; j += 16)
                _mm512_storeu_ps(d + j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 2 * j))));
            break;
        case KERN_KV_Q8_0:
            for (int j = 0; j < hd; j += KERN_KV_Q8_BLOCK) {
                __m512 sc = _mm512_set1_ps(kern_kv_f16_to_f32((uint16_t)(s[hd + j / 16] | s[hd + j / 16 + 1] << 8)));
                for (int u = 0; u < KERN_KV_Q8_BLOCK; u += 16) {
                    __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + j + u)));
                    _mm512_storeu_ps(d + j + u, _mm512_mul_ps(sc, _mm512_cvtepi32_ps(q)));
                }
            }
            break;
        default: memcpy(d, s, (size_t)hd * 4); break;
        }
    }
}

void cpu_kv_load_rows(int isa, kern_kv_dtype dt, const uint8_t *src, size_t ld, int n, int hd, float *dst,
                      size_t ldd) {
    if (isa >= CPU_ISA_AVX512)
        load512(dt, src, ld, n, hd, dst, ldd);
    else if (isa >= CPU_ISA_AVX2)
        load256(dt, src, ld, n, hd, dst, ldd);
    else
        load_c(dt, src, ld, n, hd, dst, ldd);
}

/* ---- decode attention read as stored ----
 * cpu_kv_scores and cpu_kv_wsum: q·k and the weighted sum of v straight
 * from the cache rows (any kern_kv_dtype, fp32 included), each 16-value
 * chunk widened in registers as kern_kv_load_ref widens it. The bits are
 * cpu_dot's (16 fma lanes, hsum16's tree) and cpu_axpy's (fmas in
 * position order) on the widened values. Several positions' 16-lane
 * sums are reduced together by shuffles that add exactly the pairs hsum16
 * adds, in its order. */

/* Portable, and any head_dim that is not whole 16-value chunks: each row
 * widened by the reference, then cpu_dot / cpu_axpy. */
static void scores_ref(int isa, kern_kv_dtype dt, const float *q, size_t ldq, int nq, const uint8_t *const *k, int nk,
                       int hd, float *out, size_t ldo) {
    float x[KERN_KV_MAX_HD];
    for (int p = 0; p < nk; p++) {
        kern_kv_load_ref(dt, k[p], hd, x);
        for (int i = 0; i < nq; i++) out[(size_t)i * ldo + p] = cpu_dot(isa, q + (size_t)i * ldq, x, hd);
    }
}

static void wsum_ref(int isa, kern_kv_dtype dt, float *const *o, const float *const *w, int m, const uint8_t *const *v,
                     int n, int hd) {
    float x[KERN_KV_MAX_HD];
    for (int p = 0; p < n; p++) {
        kern_kv_load_ref(dt, v[p], hd, x);
        for (int j = 0; j < m; j++) cpu_axpy(isa, o[j], w[j][p], x, hd);
    }
}

#define INL static inline __attribute__((always_inline))

/* q8_0: the fp16 scale of the 32-value block holding chunk c (16 values) */
INL uint16_t q8_scale_bits(const uint8_t *r, int hd, int c) {
    return (uint16_t)(r[hd + (c >> 1) * 2] | r[hd + (c >> 1) * 2 + 1] << 8);
}

/* Prefetch the bytes of chunks c0 .. c0+nc-1 of a stored row (and a q8_0
 * row's scales): rows in place are a head's share of cache rows kvdim
 * apart, a stride the hardware prefetcher follows too late to keep a
 * decode's loads from waiting on memory. */
INL void kv_prefetch(const int dt, const uint8_t *r, int hd, int c0, int nc) {
    const int w = dt == KERN_KV_F32 ? 64 : dt == KERN_KV_Q8_0 ? 16 : 32; /* bytes per chunk */
    for (int o = w * c0; o < w * (c0 + nc); o += 64) _mm_prefetch((const char *)r + o, _MM_HINT_T0);
    if (dt == KERN_KV_Q8_0) _mm_prefetch((const char *)r + hd + (c0 >> 1) * 2, _MM_HINT_T0);
}
#define KV_PF_AHEAD 16 /* rows */

/* values 16c .. 16c+15 of a stored row, widened */
A512 INL __m512 wide512(const int dt, const uint8_t *r, int hd, int c) {
    switch (dt) {
    case KERN_KV_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r + 32 * c))), 16));
    case KERN_KV_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + 32 * c)));
    case KERN_KV_Q8_0: {
        __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)q8_scale_bits(r, hd, c)));
        return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(r + 16 * c)))));
    }
    default: return _mm512_loadu_ps((const float *)r + 16 * c);
    }
}

A512 INL float hsum512(__m512 v) { /* hsum16's tree */
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

/* hsum16 of 16 registers at once: lane p of the result is hsum512(v[p]).
 * Level 1 adds lanes i and i+8 (two positions per register), level 2 i
 * and i+4 (four per register, one per 128-bit quarter), level 3 b0+b2 and
 * b1+b3, level 4 c0+c1: hsum16's additions, so its bits. */
A512 INL __m512 hsum512x16(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) {
        __m512 x = v[2 * i], y = v[2 * i + 1];
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
    } /* a[i]: quarters (v2i lanes 0-3, 4-7, v2i+1 0-3, 4-7) of the 8 partial sums */
    for (int i = 0; i < 4; i++) {
        __m512 x = a[2 * i], y = a[2 * i + 1];
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
    } /* b[i]: quarter k holds v[4i+k]'s b0..b3 */
    for (int i = 0; i < 2; i++) {
        __m512 x = b[2 * i], y = b[2 * i + 1];
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
    } /* c[i]: quarter k is (c0, c1) of v[8i+k], then of v[8i+4+k] */
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* lane 4k+j of r is v[4j+k]: transpose the 4x4 */
    const __m512i t = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(t, r);
}

A512 INL void scores512_dt(const int dt, const float *q, size_t ldq, int nq, const uint8_t *const *k, int nk, int hd,
                           float *out, size_t ldo) {
    const int nc = hd / 16;
    int p = 0;
    for (; p + 16 <= nk; p += 16) {
        for (int r = 0; r < 16 && p + KV_PF_AHEAD + r < nk; r++) kv_prefetch(dt, k[p + KV_PF_AHEAD + r], hd, 0, nc);
        for (int i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * ldq;
            __m512 acc[16];
            for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
            for (int c = 0; c < nc; c++) {
                __m512 qc = _mm512_loadu_ps(qi + 16 * c);
                for (int r = 0; r < 16; r++) acc[r] = _mm512_fmadd_ps(qc, wide512(dt, k[p + r], hd, c), acc[r]);
            }
            _mm512_storeu_ps(out + (size_t)i * ldo + p, hsum512x16(acc));
        }
    }
    for (; p < nk; p++)
        for (int i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * ldq;
            __m512 acc = _mm512_setzero_ps();
            for (int c = 0; c < nc; c++) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qi + 16 * c), wide512(dt, k[p], hd, c), acc);
            out[(size_t)i * ldo + p] = hsum512(acc);
        }
}

/* M (1..4) outputs, NC (1..4) chunks of 16 columns from column 16*c0,
 * summed over all n rows in registers. */
A512 INL void wsum512_dt(const int dt, const int M, const int NC, float *const *o, const float *const *w,
                         const uint8_t *const *v, int n, int hd, int c0) {
    __m512 a[4][4];
    for (int j = 0; j < M; j++)
        for (int c = 0; c < NC; c++) a[j][c] = _mm512_loadu_ps(o[j] + 16 * (c0 + c));
    for (int p = 0; p < n; p++) {
        __m512 x[4];
        if (p + KV_PF_AHEAD < n) kv_prefetch(dt, v[p + KV_PF_AHEAD], hd, c0, NC);
        for (int c = 0; c < NC; c++) x[c] = wide512(dt, v[p], hd, c0 + c);
        for (int j = 0; j < M; j++) {
            __m512 wv = _mm512_set1_ps(w[j][p]);
            for (int c = 0; c < NC; c++) a[j][c] = _mm512_fmadd_ps(wv, x[c], a[j][c]);
        }
    }
    for (int j = 0; j < M; j++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(o[j] + 16 * (c0 + c), a[j][c]);
}

A512 INL void wsum512_m(const int dt, const int M, float *const *o, const float *const *w, const uint8_t *const *v,
                        int n, int hd) {
    int c = 0, nc = hd / 16;
    for (; c + 4 <= nc; c += 4) wsum512_dt(dt, M, 4, o, w, v, n, hd, c);
    for (; c < nc; c++) wsum512_dt(dt, M, 1, o, w, v, n, hd, c);
}

A512 INL void wsum512_all(const int dt, float *const *o, const float *const *w, int m, const uint8_t *const *v, int n,
                          int hd) {
    for (int j = 0; j < m; j += 4) switch (m - j < 4 ? m - j : 4) {
        case 4: wsum512_m(dt, 4, o + j, w + j, v, n, hd); break;
        case 3: wsum512_m(dt, 3, o + j, w + j, v, n, hd); break;
        case 2: wsum512_m(dt, 2, o + j, w + j, v, n, hd); break;
        default: wsum512_m(dt, 1, o + j, w + j, v, n, hd); break;
        }
}

/* dt a compile-time constant in each instance */
#define KV_DISPATCH(FN, ...)                                                                                           \
    switch (dt) {                                                                                                      \
    case KERN_KV_BF16: FN(KERN_KV_BF16, __VA_ARGS__); break;                                                           \
    case KERN_KV_F16: FN(KERN_KV_F16, __VA_ARGS__); break;                                                             \
    case KERN_KV_Q8_0: FN(KERN_KV_Q8_0, __VA_ARGS__); break;                                                           \
    default: FN(KERN_KV_F32, __VA_ARGS__); break;                                                                      \
    }

A512 static void scores512(kern_kv_dtype dt, const float *q, size_t ldq, int nq, const uint8_t *const *k, int nk, int hd,
                           float *out, size_t ldo) {
    KV_DISPATCH(scores512_dt, q, ldq, nq, k, nk, hd, out, ldo)
}

A512 static void wsum512(kern_kv_dtype dt, float *const *o, const float *const *w, int m, const uint8_t *const *v, int n,
                         int hd) {
    KV_DISPATCH(wsum512_all, o, w, m, v, n, hd)
}

/* ---- AVX2: a 16-value chunk as two registers (lanes 0-7, 8-15) ---- */

A256 INL void wide256(const int dt, const uint8_t *r, int hd, int c, __m256 *lo, __m256 *hi) {
    switch (dt) {
    case KERN_KV_BF16: {
        __m128i h0 = _mm_loadu_si128((const __m128i *)(r + 32 * c)), h1 = _mm_loadu_si128((const __m128i *)(r + 32 * c + 16));
        *lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16));
        *hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16));
        return;
    }
    case KERN_KV_F16:
        *lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 32 * c)));
        *hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 32 * c + 16)));
        return;
    case KERN_KV_Q8_0: {
        __m256 d = _mm256_cvtph_ps(_mm_set1_epi16((short)q8_scale_bits(r, hd, c)));
        *lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(r + 16 * c)))));
        *hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(r + 16 * c + 8)))));
        return;
    }
    default:
        *lo = _mm256_loadu_ps((const float *)r + 16 * c);
        *hi = _mm256_loadu_ps((const float *)r + 16 * c + 8);
        return;
    }
}

/* hsum16 of four (lo, hi) sums at once: lane p of the result (p < 4) is
 * the reduction of position p, the same additions as hsum16. */
A256 INL __m128 hsum256x4(const __m256 *lo, const __m256 *hi) {
    __m256 a[4], b[2];
    for (int i = 0; i < 4; i++) a[i] = _mm256_add_ps(lo[i], hi[i]); /* lanes i + i+8 */
    for (int i = 0; i < 2; i++) /* i + i+4: halves (position 2i, 2i+1) */
        b[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    /* b0+b2, b1+b3: half h of c is (c0, c1) of position h, then of 2+h */
    __m256 c = _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* c0 + c1: half h holds positions h, 2+h in lanes 0, 1 */
    __m256 d = _mm256_add_ps(_mm256_shuffle_ps(c, c, _MM_SHUFFLE(2, 2, 2, 0)), _mm256_shuffle_ps(c, c, _MM_SHUFFLE(3, 3, 3, 1)));
    __m128 d0 = _mm256_castps256_ps128(d), d1 = _mm256_extractf128_ps(d, 1); /* (p0, p2, ..), (p1, p3, ..) */
    return _mm_unpacklo_ps(d0, d1); /* p0 p1 p2 p3 */
}

A256 INL float hsum256(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

A256 INL void scores256_dt(const int dt, const float *q, size_t ldq, int nq, const uint8_t *const *k, int nk, int hd,
                           float *out, size_t ldo) {
    const int nc = hd / 16;
    int p = 0;
    for (; p + 4 <= nk; p += 4) {
        for (int r = 0; r < 4 && p + KV_PF_AHEAD + r < nk; r++) kv_prefetch(dt, k[p + KV_PF_AHEAD + r], hd, 0, nc);
        for (int i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * ldq;
            __m256 lo[4], hi[4];
            for (int r = 0; r < 4; r++) lo[r] = hi[r] = _mm256_setzero_ps();
            for (int c = 0; c < nc; c++) {
                __m256 ql = _mm256_loadu_ps(qi + 16 * c), qh = _mm256_loadu_ps(qi + 16 * c + 8);
                for (int r = 0; r < 4; r++) {
                    __m256 xl, xh;
                    wide256(dt, k[p + r], hd, c, &xl, &xh);
                    lo[r] = _mm256_fmadd_ps(ql, xl, lo[r]);
                    hi[r] = _mm256_fmadd_ps(qh, xh, hi[r]);
                }
            }
            _mm_storeu_ps(out + (size_t)i * ldo + p, hsum256x4(lo, hi));
        }
    }
    for (; p < nk; p++)
        for (int i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * ldq;
            __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
            for (int c = 0; c < nc; c++) {
                __m256 xl, xh;
                wide256(dt, k[p], hd, c, &xl, &xh);
                lo = _mm256_fmadd_ps(_mm256_loadu_ps(qi + 16 * c), xl, lo);
                hi = _mm256_fmadd_ps(_mm256_loadu_ps(qi + 16 * c + 8), xh, hi);
            }
            out[(size_t)i * ldo + p] = hsum256(lo, hi);
        }
}

/* M (1..2) outputs, NC (1..2) chunks of 16 columns from column 16*c0 */
A256 INL void wsum256_dt(const int dt, const int M, const int NC, float *const *o, const float *const *w,
                         const uint8_t *const *v, int n, int hd, int c0) {
    __m256 a[2][4];
    for (int j = 0; j < M; j++)
        for (int c = 0; c < 2 * NC; c++) a[j][c] = _mm256_loadu_ps(o[j] + 16 * c0 + 8 * c);
    for (int p = 0; p < n; p++) {
        __m256 x[4];
        if (p + KV_PF_AHEAD < n) kv_prefetch(dt, v[p + KV_PF_AHEAD], hd, c0, NC);
        for (int c = 0; c < NC; c++) wide256(dt, v[p], hd, c0 + c, &x[2 * c], &x[2 * c + 1]);
        for (int j = 0; j < M; j++) {
            __m256 wv = _mm256_set1_ps(w[j][p]);
            for (int c = 0; c < 2 * NC; c++) a[j][c] = _mm256_fmadd_ps(wv, x[c], a[j][c]);
        }
    }
    for (int j = 0; j < M; j++)
        for (int c = 0; c < 2 * NC; c++) _mm256_storeu_ps(o[j] + 16 * c0 + 8 * c, a[j][c]);
}

A256 INL void wsum256_all(const int dt, float *const *o, const float *const *w, int m, const uint8_t *const *v, int n,
                          int hd) {
    const int nc = hd / 16;
    for (int j = 0; j < m; j += 2) {
        const int two = m - j >= 2;
        int c = 0;
        for (; c + 2 <= nc; c += 2) {
            if (two)
                wsum256_dt(dt, 2, 2, o + j, w + j, v, n, hd, c);
            else
                wsum256_dt(dt, 1, 2, o + j, w + j, v, n, hd, c);
        }
        for (; c < nc; c++) {
            if (two)
                wsum256_dt(dt, 2, 1, o + j, w + j, v, n, hd, c);
            else
                wsum256_dt(dt, 1, 1, o + j, w + j, v, n, hd, c);
        }
    }
}

A256 static void scores256(kern_kv_dtype dt, const float *q, size_t ldq, int nq, const uint8_t *const *k, int nk, int hd,
                           float *out, size_t ldo) {
    KV_DISPATCH(scores256_dt, q, ldq, nq, k, nk, hd, out, ldo)
}

A256 static void wsum256(kern_kv_dtype dt, float *const *o, const float *const *w, int m, const uint8_t *const *v, int n,
                         int hd) {
    KV_DISPATCH(wsum256_all, o, w, m, v, n, hd)
}

void cpu_kv_scores(int isa, kern_kv_dtype dt, const float *q, size_t ldq, int nq, const uint8_t *const *k, int nk,
                   int hd, float *out, size_t ldo) {
    if (hd % 16 || hd > KERN_KV_MAX_HD)
        scores_ref(isa, dt, q, ldq, nq, k, nk, hd, out, ldo);
    else if (isa >= CPU_ISA_AVX512)
        scores512(dt, q, ldq, nq, k, nk, hd, out, ldo);
    else if (isa >= CPU_ISA_AVX2)
        scores256(dt, q, ldq, nq, k, nk, hd, out, ldo);
    else
        scores_ref(isa, dt, q, ldq, nq, k, nk, hd, out, ldo);
}

void cpu_kv_wsum(int isa, kern_kv_dtype dt, float *const *o, const float *const *w, int m, const uint8_t *const *v,
                 int n, int hd) {
    if (hd % 16 || hd > KERN_KV_MAX_HD)
        wsum_ref(isa, dt, o, w, m, v, n, hd);
    else if (isa >= CPU_ISA_AVX512)
        wsum512(dt, o, w, m, v, n, hd);
    else if (isa >= CPU_ISA_AVX2)
        wsum256(dt, o, w, m, v, n, hd);
    else
        wsum_ref(isa, dt, o, w, m, v, n, hd);
}
