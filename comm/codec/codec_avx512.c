/*
 * comm/codec/codec_avx512.c — the out2 / hout2 / hnf3 record loops and the int4
 * encode in AVX-512 intrinsics (echo_cpu_codec_avx512, comm/codec/codec_cpu.h); the
 * other entries are the AVX2 table's. echo_cpu_codec_best picks it at run
 * time.
 *
 * Contract: bit-identical to echo_cpu_codec_scalar, as the AVX2 table is
 * (the one latitude: which NaN a rotation's butterfly returns). Where this
 * file computes differently, it computes the same bits (docs/echo.md §8b
 * has the arguments):
 *   - A butterfly a + b / a - b inside a vector is one permute and one FMA,
 *     b * (+-1) + a: the product is exact, so the FMA rounds once, as the
 *     add or subtraction does.
 *   - The decoder's inverse rotation of q*s (hout2's residual and decode)
 *     runs on the integer codes: when 0 < s < 2^125 / G every partial sum
 *     of the scalar butterflies over q*s is an integer (|.| <= 8 G) times s,
 *     exact in fp32, so the reference's result is the one rounding of
 *     (H q) * (+-s/G); H q is exact in any order, and that product is exact
 *     too, so y - it may be one FNMADD. Other scales (0, huge, inf, NaN,
 *     negative: only from the wire) take the reference's order.
 *   - y/s is y * fl(1/s) where a check proves it gives the same code
 *     (quant), else a division.
 *   - The top-2 search is a max over 64-bit keys, |y| bits and the
 *     complemented index, which order as the reference's first-occurrence
 *     rules.
 *   - The code is the low nibble of the bits of y/s + 1.5*2^23 (the first
 *     add of echo_rint), so no conversion to int.
 *   - hnf3's levels are not integers: its decode and residual take the
 *     reference's order (q s, H, D / G), its codes are pext / pdep of
 *     bytes.
 * The encoders run phase by phase over a few groups (o2_enc_impl,
 * i4_enc_impl). Full groups with G in 16..256 are vectorized; a partial
 * last group goes to the scalar loops, hsub6 runs the AVX2 loops (the
 * form table's rows say which), and int4's
 * bf16 input, bf16-rounded residuals and all-zero or poisoned groups to
 * the AVX2 loop.
 */
#include "comm/codec/codec_cpu.h"

#ifdef ECHO_HAVE_CODEC_AVX512

#include <immintrin.h>
#include <string.h>

#include "comm/codec/echo_codec.h"

#ifndef ECHO_PF
#define ECHO_PF 1024
#endif
#define Z_TARGET "avx512f,avx512bw,avx512vl,avx512dq,fma,bmi,bmi2,popcnt"
#define Z_FN __attribute__((target(Z_TARGET)))
#define Z_INLINE static inline __attribute__((always_inline, target(Z_TARGET)))
/* Group loops unrolled whole, so that arrays of vectors stay in registers. */
#define UNROLL _Pragma("GCC unroll 32")
#define ZMAXV (ECHO_MAX_GROUP / 16)
/* The bf16 bits of 2^(125 - log2 G): scales below it invert exactly (inv_rot). */
#define SAFE_SB(G) ((unsigned)(252 - __builtin_ctz((unsigned)(G))) << 7)

/* The rotation's signs D, 16 values a row: neg as sign masks (-0.0 where
 * echo_had_neg), inv as D / G (echo_had_inv's multipliers). */
typedef struct {
    __m512 neg[ZMAXV], inv[ZMAXV];
} zhad;

Z_INLINE void zhad_init(zhad *d, int G) {
    const __m512 inv = _mm512_set1_ps(1.0f / (float)G);
    for (int j = 0; j < G / 16; j++) {
        /* echo_had_neg on 16 lanes */
        __m512i h = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                     _mm512_set1_epi32(16 * j));
        h = _mm512_add_epi32(_mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x9e3779b1u)), _mm512_set1_epi32(0x7f4a7c15));
        h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
        h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85ebca77u));
        h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
        d->neg[j] = _mm512_castsi512_ps(_mm512_slli_epi32(h, 31));
        d->inv[j] = _mm512_xor_ps(inv, d->neg[j]);
    }
}

/* The in-vector stages (spans 1, 2, 4, 8): lane l gets v[l] * sgn + v[l ^ h],
 * sgn = -1 where l & h (a - b), else +1 (a + b). */
Z_INLINE __m512 fwht_in(__m512 v) {
    const __m512 p = _mm512_set1_ps(1.0f), m = _mm512_set1_ps(-1.0f);
    const __m512 s1 = _mm512_mask_mov_ps(p, 0xaaaa, m), s2 = _mm512_mask_mov_ps(p, 0xcccc, m);
    const __m512 s4 = _mm512_mask_mov_ps(p, 0xf0f0, m), s8 = _mm512_mask_mov_ps(p, 0xff00, m);
    v = _mm512_fmadd_ps(v, s1, _mm512_permute_ps(v, 0xb1));
    v = _mm512_fmadd_ps(v, s2, _mm512_permute_ps(v, 0x4e));
    v = _mm512_fmadd_ps(v, s4, _mm512_shuffle_f32x4(v, v, 0xb1));
    return _mm512_fmadd_ps(v, s8, _mm512_shuffle_f32x4(v, v, 0x4e));
}

/* v = H v over V vectors (echo_fwht's stages in its order: every value
 * sees the in-vector spans, then 16, 32, ...). */
Z_INLINE void fwht(__m512 *v, int V) {
    UNROLL
    for (int j = 0; j < V; j++)
        v[j] = fwht_in(v[j]);
    UNROLL
    for (int h = 1; h < V; h *= 2) {
        UNROLL
        for (int i = 0; i < V; i += 2 * h) {
            UNROLL
            for (int j = i; j < i + h; j++) {
                __m512 a = v[j], b = v[j + h];
                v[j] = _mm512_add_ps(a, b);
                v[j + h] = _mm512_sub_ps(a, b);
            }
        }
    }
}

/* Largest of 16 non-negative int32 lanes, in every lane. */
Z_INLINE __m512i bmax16(__m512i v) {
    v = _mm512_max_epi32(v, _mm512_shuffle_i32x4(v, v, 0x4e));
    v = _mm512_max_epi32(v, _mm512_shuffle_i32x4(v, v, 0xb1));
    v = _mm512_max_epi32(v, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0x4e));
    return _mm512_max_epi32(v, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0xb1));
}

/* The indices of the first largest a (i1) and of the first largest of the
 * others (i2), as echo_hout2_encode_group finds them, and the largest a.
 * Each value becomes a 64-bit key, a << 32 | ~index: keys are unique and
 * order as (a, then the earlier index), so the largest key is i1's and the
 * second largest i2's (the second occurrence when the maximum repeats).
 * The group's top two keys come from a per-lane (largest, second) merge
 * across vectors, then across lanes: no mask registers and no branch
 * between a group's values and its outliers' indices. */
Z_INLINE void top2(const __m512i *a, int V, uint32_t *m1, int *i1, int *i2) {
    __m512i h[ZMAXV], l[ZMAXV];
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    UNROLL
    for (int j = 0; j < V; j++) {
        __m512i ic = _mm512_sub_epi32(_mm512_set1_epi32(-1 - 16 * j), lane); /* ~(16 j + lane) */
        /* which lanes pair up does not matter: each key carries its index */
        __m512i k0 = _mm512_unpacklo_epi32(ic, a[j]), k1 = _mm512_unpackhi_epi32(ic, a[j]);
        h[j] = _mm512_max_epu64(k0, k1);
        l[j] = _mm512_min_epu64(k0, k1);
    }
    UNROLL
    for (int s = 1; s < V; s *= 2) {
        UNROLL
        for (int j = 0; j + s < V; j += 2 * s) {
            __m512i nl = _mm512_max_epu64(_mm512_min_epu64(h[j], h[j + s]), _mm512_max_epu64(l[j], l[j + s]));
            h[j] = _mm512_max_epu64(h[j], h[j + s]);
            l[j] = nl;
        }
    }
    __m512i H = h[0], L = l[0];
    for (int step = 0; step < 3; step++) { /* 8 lanes -> 4 -> 2 -> 1 */
        __m512i ph = step == 0   ? _mm512_shuffle_i64x2(H, H, 0x4e)
                     : step == 1 ? _mm512_shuffle_i64x2(H, H, 0xb1)
                                 : _mm512_shuffle_epi32(H, (_MM_PERM_ENUM)0x4e);
        __m512i pl = step == 0   ? _mm512_shuffle_i64x2(L, L, 0x4e)
                     : step == 1 ? _mm512_shuffle_i64x2(L, L, 0xb1)
                                 : _mm512_shuffle_epi32(L, (_MM_PERM_ENUM)0x4e);
        L = _mm512_max_epu64(_mm512_min_epu64(H, ph), _mm512_max_epu64(L, pl));
        H = _mm512_max_epu64(H, ph);
    }
    uint64_t k1 = (uint64_t)_mm_cvtsi128_si64(_mm512_castsi512_si128(H));
    uint64_t k2 = (uint64_t)_mm_cvtsi128_si64(_mm512_castsi512_si128(L));
    *m1 = (uint32_t)(k1 >> 32);
    *i1 = (int)~(uint32_t)k1;
    *i2 = (int)~(uint32_t)k2;
}

/* o + v with o the first operand (codec_avx2.c's add_acc: the NaN payload
 * x86 returns is the first operand's; the scalar loop adds to o). */
Z_INLINE __m512 add_acc(__m512 o, __m512 v) {
    __m512 r;
    __asm__("vaddps %2, %1, %0" : "=v"(r) : "v"(o), "vm"(v));
    return r;
}

Z_INLINE float add_acc1(float o, float v) {
    float r;
    __asm__("vaddss %2, %1, %0" : "=v"(r) : "v"(o), "vm"(v));
    return r;
}

/* The decoded group D H (q s) / G for the integer-valued codes q[0..V)
 * and bf16 scale sb, in q; or, when yb != NULL, yb minus it (the residual).
 * nf3: q holds hnf3's levels (not integers), so the reference's order:
 * q s, H, D / G. */
Z_INLINE void inv_rot(__m512 *q, int V, uint16_t sb, const zhad *d, int G, const float *yb, int nf3) {
    float s = echo_bf16_to_f32(sb);
    if (__builtin_expect(!nf3 && (uint16_t)(sb - 1u) < SAFE_SB(G) - 1u, 1)) {
        /* 0 < s < 2^125 / G: exact up to the last product, which is exact too
         * (file comment), so y - it is one FNMADD */
        const __m512 sg = _mm512_set1_ps(s * (1.0f / (float)G));
        fwht(q, V);
        UNROLL
        for (int j = 0; j < V; j++) {
            __m512 m = _mm512_xor_ps(sg, d->neg[j]);
            q[j] = yb ? _mm512_fnmadd_ps(q[j], m, _mm512_load_ps(yb + 16 * j)) : _mm512_mul_ps(q[j], m);
        }
        return;
    }
    const __m512 sv = _mm512_set1_ps(s);
    UNROLL
    for (int j = 0; j < V; j++)
        q[j] = _mm512_mul_ps(q[j], sv);
    fwht(q, V);
    UNROLL
    for (int j = 0; j < V; j++) {
        q[j] = _mm512_mul_ps(q[j], d->inv[j]);
        if (yb) q[j] = _mm512_sub_ps(_mm512_load_ps(yb + 16 * j), q[j]);
    }
}

/* Store 16 codes (the low nibbles of t's lanes) at c, two per byte. */
Z_INLINE void pack16(uint8_t *c, __m512 t) {
    /* even lanes' nibble to bits 28..31, next to the odd lane's 0..3 */
    __m512i a = _mm512_sllv_epi32(_mm512_castps_si512(t), _mm512_set1_epi64(28));
    _mm_storel_epi64((__m128i *)c, _mm512_cvtepi64_epi8(_mm512_srli_epi64(a, 28)));
}

/* t[j] = fl(u[j] / s) + 1.5*2^23, echo_rint's first add (the code is its
 * low nibble, q = t - 1.5*2^23 the code as a float), for a positive normal
 * or subnormal scale s and |u/s| <= 7.5. The quotient is u * fl(1/s) when
 * that provably rounds to the same integer in every lane: the product is
 * within |u/s| 2^-23 < 2^-20 of u/s, fl(u/s) within 2^-21 of it, and
 * e - rint(e) is exact (Sterbenz), so |e - rint(e)| < 1/2 - 2^-16 leaves
 * rint(fl(u/s)) = rint(e). Else (about one group in 60 of Gaussian data,
 * and every one with a subnormal s, whose 1/s is inf) the group divides. */
Z_INLINE void quant(const __m512 *u, int V, float s, __m512 *t) {
    const __m512 c = _mm512_set1_ps(12582912.0f), r = _mm512_set1_ps(1.0f / s);
    __m512 dm = _mm512_setzero_ps();
    if (__builtin_expect(s >= 0x1p-126f, 1)) {
        UNROLL
        for (int j = 0; j < V; j++) {
            __m512 e = _mm512_mul_ps(u[j], r);
            t[j] = _mm512_add_ps(e, c);
            dm = _mm512_range_ps(dm, _mm512_sub_ps(e, _mm512_sub_ps(t[j], c)), 0x0b); /* max |.| */
        }
        if (__builtin_expect(_mm512_cmp_ps_mask(dm, _mm512_set1_ps(0.5f - 0x1p-16f), _CMP_LT_OQ) == 0xffff, 1)) return;
    }
    const __m512 sv = _mm512_set1_ps(s);
    UNROLL
    for (int j = 0; j < V; j++)
        t[j] = _mm512_add_ps(_mm512_div_ps(u[j], sv), c);
}

/* A group between the phases of o2_enc_impl. */
typedef struct {
    int i1, i2;      /* the outliers */
    uint32_t m;      /* the largest |y| bits */
    uint16_t sb;     /* the scale */
    uint16_t o1, o2; /* the outliers as bf16 */
    uint32_t mu;     /* the largest |u| bits (hnf3's RMS scaling) */
    float y1, y2;
} zgrp;

/* y = x (+ res when hr) of a group into yb, its |y| bits into a[0..G/16). */
Z_INLINE void load_y(const float *x, const float *res, int hr, int G, float *yb, __m512i *a) {
    const int V = G / 16;
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    for (int j = 0; ECHO_PF > 0 && j < V; j++) {
        _mm_prefetch((const char *)(x + 16 * j + ECHO_PF), _MM_HINT_T0);
        if (hr) _mm_prefetch((const char *)(res + 16 * j + ECHO_PF), _MM_HINT_T0);
    }
    UNROLL
    for (int j = 0; j < V; j++) {
        __m512 y = _mm512_loadu_ps(x + 16 * j);
        if (hr) y = _mm512_add_ps(y, _mm512_loadu_ps(res + 16 * j));
        _mm512_store_ps(yb + 16 * j, y);
        a[j] = _mm512_and_si512(_mm512_castps_si512(y), abs);
    }
}

/* Phase 1 of a group at x: y = x (+ res when hr) into yb, its outliers. */
Z_INLINE void enc_top2(const float *x, const float *res, int hr, int G, float *yb, zgrp *st) {
    __m512i a[ZMAXV];
    load_y(x, res, hr, G, yb, a);
    top2(a, G / 16, &st->m, &st->i1, &st->i2);
    st->y1 = yb[st->i1];
    st->y2 = yb[st->i2];
    /* the outliers leave the staged group (their residuals are patched in
     * last); the next phase's loads come a few groups later, when these
     * stores have long retired */
    yb[st->i1] = 0.0f;
    yb[st->i2] = 0.0f;
}

/* Phase 2: u = the group without its outliers (rotated for hout2) into ub,
 * the scale and the record. */
/* hnf3's scales: echo_nf3_rms of the nb (<= ZB) groups u[b] (mu: their
 * largest |u| bits), 8 partial sums each in the reference's order (8
 * lanes, j in order); the groups' chains interleave, so their adds
 * overlap. A group whose mu is 0 or at 2^127 gets 0 or poison. */
Z_INLINE void nf3_rms(const float (*u)[ECHO_MAX_GROUP], int nb, int G, const uint32_t *m, const uint32_t *mu,
                      uint16_t *sb) {
    __m256 acc[4], p[4];
    int e[4];
    for (int b = 0; b < 4; b++) {
        e[b] = b < nb ? (int)(mu[b] >> 23) : 1;
        e[b] = e[b] < 1 ? 1 : e[b] > 253 ? 253 : e[b];
        p[b] = _mm256_set1_ps(echo_bits_f32((uint32_t)(254 - e[b]) << 23));
        acc[b] = _mm256_setzero_ps();
    }
    /* all 4 chains (the groups past nb are finite scratch, unused), so
     * that the accumulators stay in registers */
    for (int j = 0; j < G / 8; j++) {
        UNROLL
        for (int b = 0; b < 4; b++) {
            __m256 v = _mm256_mul_ps(_mm256_load_ps(u[b] + 8 * j), p[b]);
            acc[b] = _mm256_add_ps(acc[b], _mm256_mul_ps(v, v));
        }
    }
    for (int b = 0; b < nb; b++) {
        float a[8] __attribute__((aligned(32)));
        _mm256_store_ps(a, acc[b]);
        float sum = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        uint16_t h = echo_f32_to_bf16(echo_sqrt(sum / (float)G) * echo_bits_f32((uint32_t)e[b] << 23));
        sb[b] = m[b] >= ECHO_LIMIT_BITS || mu[b] >= ECHO_LIMIT_BITS ? ECHO_SCALE_POISON : !mu[b] ? 0 : h ? h : 1u;
    }
}

/* The group's record from its scale sb. */
Z_INLINE void enc_record(zgrp *st, uint16_t sb, uint8_t *rec) {
    int poison = echo_scale_is_poison(sb);
    st->sb = sb;
    st->o1 = poison ? ECHO_SCALE_POISON : echo_f32_to_bf16(st->y1);
    st->o2 = poison ? ECHO_SCALE_POISON : echo_f32_to_bf16(st->y2);
    uint8_t r8[ECHO_OUT2_REC] = {(uint8_t)sb,     (uint8_t)(sb >> 8),     (uint8_t)st->o1, (uint8_t)(st->o1 >> 8),
                                 (uint8_t)st->o2, (uint8_t)(st->o2 >> 8), (uint8_t)st->i1, (uint8_t)st->i2};
    memcpy(rec, r8, sizeof r8);
}

Z_INLINE void enc_scale(const float *yb, int rot, int nf3, int G, const zhad *d, float *ub, zgrp *st, uint8_t *rec) {
    const int V = G / 16;
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    __m512 u[ZMAXV];
    UNROLL
    for (int j = 0; j < V; j++) {
        __m512 y = _mm512_load_ps(yb + 16 * j);
        u[j] = rot ? _mm512_xor_ps(y, d->neg[j]) : y; /* D: -0 for an outlier where it negates, as echo_had_fwd */
    }
    if (rot) fwht(u, V);
    __m512i mu = _mm512_setzero_si512();
    UNROLL
    for (int j = 0; j < V; j++) {
        _mm512_store_ps(ub + 16 * j, u[j]);
        mu = _mm512_max_epi32(mu, _mm512_and_si512(_mm512_castps_si512(u[j]), abs));
    }
    uint32_t mub = (uint32_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(bmax16(mu)));
    st->mu = mub;
    /* hnf3: the scale and record come after the batch's RMS (nf3_rms) */
    if (!nf3) enc_record(st, st->m >= ECHO_LIMIT_BITS ? ECHO_SCALE_POISON : echo_scale_from_absbits(mub), rec);
}

/* Phase 3: the codes, and res = y - the decoded group when hw. */
/* hnf3's codes of u / s (16 lanes), as int32: sign (4) | the number of
 * thresholds at or below |u / s| (echo_nf3_code). */
Z_INLINE __m512i nf3_code16(__m512 t) {
    const __m512i one = _mm512_set1_epi32(1);
    __m512 a = _mm512_abs_ps(t);
    __m512i c = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(t, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_set1_epi32(4));
    c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(ECHO_NF3_T1), _CMP_GE_OQ), c, one);
    c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(ECHO_NF3_T2), _CMP_GE_OQ), c, one);
    return _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(ECHO_NF3_T3), _CMP_GE_OQ), c, one);
}

Z_INLINE void enc_codes(const float *yb, const float *ub, float *res, int hw, int rot, int nf3, int G, const zhad *d,
                        const zgrp *st, uint8_t *codes) {
    const int V = G / 16;
    uint16_t sb = st->sb;
    int poison = echo_scale_is_poison(sb);
    if (__builtin_expect(sb == 0 || poison, 0)) {
        memset(codes, 0, nf3 ? (size_t)G / 8 * 3 : (size_t)G / 2);
        if (!hw) return;
        /* poisoned: residual 0; zero scale: the decoded group is +-0 (D)
         * but for the outliers, +0 for out2 */
        UNROLL
        for (int j = 0; j < V; j++) {
            __m512 y = _mm512_load_ps(yb + 16 * j);
            _mm512_storeu_ps(res + 16 * j, poison ? _mm512_setzero_ps() : rot ? _mm512_sub_ps(y, d->neg[j]) : y);
        }
        if (poison) return;
    } else if (nf3) {
        /* u / s divided (a threshold may sit between u * fl(1/s) and
         * fl(u / s)); 8 codes of 3 bits per 3 bytes: each code a byte,
         * then pext of their low 3 bits */
        const __m512 sv = _mm512_set1_ps(echo_bf16_to_f32(sb));
        const __m512 lv = _mm512_setr_ps(echo_nf3_level(0), echo_nf3_level(1), echo_nf3_level(2), echo_nf3_level(3),
                                         echo_nf3_level(4), echo_nf3_level(5), echo_nf3_level(6), echo_nf3_level(7),
                                         0, 0, 0, 0, 0, 0, 0, 0);
        __m512 q[ZMAXV], t[ZMAXV];
        /* u * fl(1/s) is within |u/s| 2^-22 of fl(u / s): the same side of
         * every threshold (and the same sign) unless some lane lies within
         * 2^-19 of one (|u/s| <= 1.75 + 2^-19 there) or below 2^-100; then,
         * and for a subnormal s (1/s = inf), the group divides */
        const float s = echo_bf16_to_f32(sb);
        int div = !(s >= 0x1p-126f);
        if (!div) {
            const __m512 r = _mm512_set1_ps(1.0f / s), eps = _mm512_set1_ps(0x1p-19f);
            __mmask16 near = 0;
            UNROLL
            for (int j = 0; j < V; j++) {
                t[j] = _mm512_mul_ps(_mm512_load_ps(ub + 16 * j), r);
                __m512 a = _mm512_abs_ps(t[j]);
                __m512 dm = _mm512_min_ps(_mm512_abs_ps(_mm512_sub_ps(a, _mm512_set1_ps(ECHO_NF3_T1))),
                                          _mm512_abs_ps(_mm512_sub_ps(a, _mm512_set1_ps(ECHO_NF3_T2))));
                dm = _mm512_min_ps(dm, _mm512_abs_ps(_mm512_sub_ps(a, _mm512_set1_ps(ECHO_NF3_T3))));
                near |= _mm512_cmp_ps_mask(dm, eps, _CMP_LE_OQ);
                /* tiny quotients: one may round to -0 where the other keeps its sign */
                near |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(0x1p-100f), _CMP_LT_OQ);
            }
            div = near != 0;
        }
        UNROLL
        for (int j = 0; div && j < V; j++)
            t[j] = _mm512_div_ps(_mm512_load_ps(ub + 16 * j), sv);
        UNROLL
        for (int j = 0; j < V; j++) {
            __m512i c = nf3_code16(t[j]);
            uint8_t b[16];
            _mm_storeu_si128((__m128i *)b, _mm512_cvtepi32_epi8(c));
            for (int h = 0; h < 2; h++) {
                uint64_t w8;
                memcpy(&w8, b + 8 * h, 8);
                uint32_t w = (uint32_t)_pext_u64(w8, 0x0707070707070707ull);
                uint8_t *t = codes + 6 * j + 3 * h;
                t[0] = (uint8_t)w, t[1] = (uint8_t)(w >> 8), t[2] = (uint8_t)(w >> 16);
            }
            q[j] = _mm512_permutexvar_ps(c, lv);
        }
        if (!hw) return;
        inv_rot(q, V, sb, d, G, yb, 1);
        UNROLL
        for (int j = 0; j < V; j++)
            _mm512_storeu_ps(res + 16 * j, q[j]);
    } else {
        const float s = echo_bf16_to_f32(sb);
        const __m512 c = _mm512_set1_ps(12582912.0f);
        __m512 q[ZMAXV], u[ZMAXV];
        UNROLL
        for (int j = 0; j < V; j++)
            u[j] = _mm512_load_ps(ub + 16 * j);
        quant(u, V, s, q);
        UNROLL
        for (int j = 0; j < V; j++) {
            pack16(codes + 8 * j, q[j]);
            q[j] = _mm512_sub_ps(q[j], c);
        }
        if (!hw) return;
        if (rot)
            inv_rot(q, V, sb, d, G, yb, 0);
        else {
            const __m512 sv = _mm512_set1_ps(s);
            UNROLL
            for (int j = 0; j < V; j++)
                q[j] = _mm512_sub_ps(_mm512_load_ps(yb + 16 * j), _mm512_mul_ps(q[j], sv));
        }
        UNROLL
        for (int j = 0; j < V; j++)
            _mm512_storeu_ps(res + 16 * j, q[j]);
    }
    res[st->i1] = st->y1 - echo_bf16_to_f32(st->o1);
    res[st->i2] = st->y2 - echo_bf16_to_f32(st->o2);
}

/* Whole out2 (rot = 0) or hout2 (rot = 1) groups: y = x (+ res when hr),
 * res = the residual when hw. ZB groups at a time, phase by phase: each
 * phase of a group is a chain of dependent steps (the top-2 search, the
 * rotation and the scale, the codes and the inverse rotation), and the
 * groups' chains are independent, so running a phase over ZB groups lets
 * the CPU overlap them. The staged y and u stay in L1. */
#define ZB 4
Z_INLINE size_t o2_enc_impl(const float *x, float *res, int hr, int hw, int rot, int nf3, size_t n, int G,
                            uint8_t *codes, uint8_t *recs, size_t *bad) {
    zhad d;
    if (rot) zhad_init(&d, G);
    float yb[ZB][ECHO_MAX_GROUP] __attribute__((aligned(64))), ub[ZB][ECHO_MAX_GROUP] __attribute__((aligned(64)));
    zgrp st[ZB];
    size_t npoison = 0, ng = n / (size_t)G;
    if (nf3) memset(ub, 0, sizeof ub); /* nf3_rms reads all ZB groups */
    for (size_t g0 = 0; g0 < ng; g0 += ZB) {
        int nb = ng - g0 < ZB ? (int)(ng - g0) : ZB;
        for (int b = 0; b < nb; b++) {
            size_t off = (g0 + (size_t)b) * (size_t)G;
            enc_top2(x + off, hr ? res + off : NULL, hr, G, yb[b], &st[b]);
        }
        for (int b = 0; b < nb; b++)
            enc_scale(yb[b], rot, nf3, G, &d, ub[b], &st[b], recs + (g0 + (size_t)b) * ECHO_OUT2_REC);
        if (nf3) {
            uint32_t m[ZB], mu[ZB];
            uint16_t sb[ZB];
            for (int b = 0; b < nb; b++)
                m[b] = st[b].m, mu[b] = st[b].mu;
            nf3_rms((const float (*)[ECHO_MAX_GROUP])ub, nb, G, m, mu, sb);
            for (int b = 0; b < nb; b++)
                enc_record(&st[b], sb[b], recs + (g0 + (size_t)b) * ECHO_OUT2_REC);
        }
        for (int b = 0; b < nb; b++) {
            size_t off = (g0 + (size_t)b) * (size_t)G;
            enc_codes(yb[b], ub[b], hw ? res + off : NULL, hw, rot, nf3, G, &d, &st[b],
                      codes + (nf3 ? off / 8 * 3 : off / 2));
            if (echo_scale_is_poison(st[b].sb) && !npoison++) *bad = off;
        }
    }
    return npoison;
}

/* The residual's use known at compile time. */
Z_INLINE size_t o2_enc_variants(const float *y, float *res, int res_valid, int rot, int nf3, size_t n, int G,
                                uint8_t *codes, uint8_t *recs, size_t *bad) {
    if (!res) return o2_enc_impl(y, res, 0, 0, rot, nf3, n, G, codes, recs, bad);
    if (res_valid) return o2_enc_impl(y, res, 1, 1, rot, nf3, n, G, codes, recs, bad);
    return o2_enc_impl(y, res, 0, 1, rot, nf3, n, G, codes, recs, bad);
}

/* ---- int4 (the paper's codec): encode ----
 * The same loops' pieces on int4 groups: y = x (+ res), one bf16 scale from
 * the largest |y|, the codes by quant (a checked reciprocal), the residual
 * y - q s as one FNMADD (q s is exact: 3 bits times a bf16). fp32 input and
 * residual only; bf16 input or a bf16-rounded residual, and groups that are
 * all zero or poisoned, go to the AVX2 loop. */

/* Phase 1 of an int4 group: y = x (+ res when hr) into yb; its largest |y| bits. */
Z_INLINE uint32_t i4_load(const float *x, const float *res, int hr, int G, float *yb) {
    __m512i a[ZMAXV], mx = _mm512_setzero_si512();
    load_y(x, res, hr, G, yb, a);
    UNROLL
    for (int j = 0; j < G / 16; j++)
        mx = _mm512_max_epu32(mx, a[j]);
    return (uint32_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(bmax16(mx)));
}

/* Phase 2: the codes of a group of positive finite scale sb, and res = y - q s when hw. */
Z_INLINE void i4_codes(const float *yb, float *res, int hw, int G, uint16_t sb, uint8_t *codes) {
    const int V = G / 16;
    const float s = echo_bf16_to_f32(sb);
    const __m512 c = _mm512_set1_ps(12582912.0f), sv = _mm512_set1_ps(s);
    __m512 y[ZMAXV], q[ZMAXV];
    UNROLL
    for (int j = 0; j < V; j++)
        y[j] = _mm512_load_ps(yb + 16 * j);
    quant(y, V, s, q);
    UNROLL
    for (int j = 0; j < V; j++) {
        pack16(codes + 8 * j, q[j]);
        if (hw) _mm512_storeu_ps(res + 16 * j, _mm512_fnmadd_ps(_mm512_sub_ps(q[j], c), sv, y[j]));
    }
}

/* Whole int4 groups of fp32 x, ZB at a time phase by phase (o2_enc_impl's
 * reasons); a group whose scale is 0 or poison is coded by the AVX2 loop. */
Z_INLINE size_t i4_enc_impl(const float *x, float *res, int hr, int hw, size_t ng, int G, uint8_t *codes,
                            uint16_t *scales, size_t *bad) {
    float yb[ZB][ECHO_MAX_GROUP] __attribute__((aligned(64)));
    size_t npoison = 0;
    for (size_t g0 = 0; g0 < ng; g0 += ZB) {
        int nb = ng - g0 < ZB ? (int)(ng - g0) : ZB;
        uint16_t sb[ZB];
        for (int b = 0; b < nb; b++) {
            size_t off = (g0 + (size_t)b) * (size_t)G;
            sb[b] = echo_scale_from_absbits(i4_load(x + off, hr ? res + off : NULL, hr, G, yb[b]));
        }
        for (int b = 0; b < nb; b++) {
            size_t off = (g0 + (size_t)b) * (size_t)G, k;
            if (__builtin_expect(sb[b] != 0 && !echo_scale_is_poison(sb[b]), 1)) {
                scales[g0 + (size_t)b] = sb[b];
                i4_codes(yb[b], hw ? res + off : NULL, hw, G, sb[b], codes + off / 2);
            } else if (echo_avx2_encode(x + off, ECHO_F32, hw ? res + off : NULL, hr, ECHO_RESID_F32, (size_t)G, G,
                                        codes + off / 2, scales + g0 + (size_t)b, &k) &&
                       !npoison++)
                *bad = off + k;
        }
    }
    return npoison;
}

Z_FN static size_t z_encode(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t n,
                            int group, uint8_t *codes, uint16_t *scales, size_t *bad) {
    if (xdt != ECHO_F32 || (res && rmode != ECHO_RESID_F32) || group < ECHO_MIN_GROUP || group > ECHO_MAX_GROUP)
        return echo_avx2_encode(x, xdt, res, res_valid, rmode, n, group, codes, scales, bad);
    const float *xf = x;
    size_t ng = n / (size_t)group, np = 0;
    int hr = res && res_valid, hw = res != NULL;
    *bad = ECHO_NO_INDEX;
    /* the residual's use known at compile time */
#define IE(G)                                                                                                          \
    np = hr   ? i4_enc_impl(xf, res, 1, 1, ng, G, codes, scales, bad)                                                  \
         : hw ? i4_enc_impl(xf, res, 0, 1, ng, G, codes, scales, bad)                                                  \
              : i4_enc_impl(xf, NULL, 0, 0, ng, G, codes, scales, bad)
    ECHO_CPU_FOR_EACH_G(group, IE, return echo_avx2_encode(x, xdt, res, res_valid, rmode, n, group, codes, scales, bad))
#undef IE
    size_t off = ng * (size_t)group, tb;
    if (off < n) { /* a partial last group */
        size_t tp = echo_avx2_encode(xf + off, ECHO_F32, res ? res + off : NULL, res_valid, rmode, n - off, group,
                                     codes + off / 2, scales + ng, &tb);
        if (tp && !np) *bad = off + tb;
        np += tp;
    }
    return np;
}

/* The V vectors of codes of one group (G / 2 bytes at c), sign-extended, as fp32. */
Z_INLINE void unpack(const uint8_t *c, int V, __m512 *q) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1));
    const __m512i nib = _mm512_set1_epi8(15);
    UNROLL
    for (int h = 0; h < (V + 7) / 8; h++) {
        int nb = V >= 8 ? 64 : 8 * V;
        __m512i b = _mm512_maskz_loadu_epi8(nb == 64 ? ~0ull : (1ull << nb) - 1, c + 64 * h);
        __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(b, nib));
        __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(b, 4), nib));
        /* 128-bit lane k: elements 32k .. 32k + 15, then 32k + 16 .. 32k + 31 */
        __m512i e[2] = {_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi)};
        UNROLL
        for (int j = 0; j < 8; j++) {
            if (8 * h + j >= V) break;
            __m128i x = j / 2 == 0   ? _mm512_castsi512_si128(e[j & 1])
                        : j / 2 == 1 ? _mm512_extracti32x4_epi32(e[j & 1], 1)
                        : j / 2 == 2 ? _mm512_extracti32x4_epi32(e[j & 1], 2)
                                     : _mm512_extracti32x4_epi32(e[j & 1], 3);
            q[8 * h + j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x));
        }
    }
}

/* hnf3's 16 codes at c (two 24-bit words, 6 bytes; echo_nf3_get) as
 * their levels (echo_nf3_level, in units of s): pdep spreads each word's
 * 3-bit codes into bytes, the encoder's pext backwards. */
Z_INLINE __m512 nf3_levels16(const uint8_t *c) {
    const __m512 lv = _mm512_setr_ps(echo_nf3_level(0), echo_nf3_level(1), echo_nf3_level(2), echo_nf3_level(3),
                                     echo_nf3_level(4), echo_nf3_level(5), echo_nf3_level(6), echo_nf3_level(7), 0, 0,
                                     0, 0, 0, 0, 0, 0);
    uint64_t w0 = (uint64_t)c[0] | ((uint64_t)c[1] << 8) | ((uint64_t)c[2] << 16);
    uint64_t w1 = (uint64_t)c[3] | ((uint64_t)c[4] << 8) | ((uint64_t)c[5] << 16);
    __m128i b = _mm_set_epi64x((long long)_pdep_u64(w1, 0x0707070707070707ull),
                               (long long)_pdep_u64(w0, 0x0707070707070707ull));
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(b), lv);
}

/* Full out2 / hout2 / hnf3 groups decoded, into out or added to it; the
 * outliers patched in afterwards, i1 then i2 (untrusted bytes: they may
 * coincide). hnf3's levels take the reference's order (inv_rot, nf3). */
Z_INLINE void o2_dec_impl(const uint8_t *codes, const uint8_t *recs, size_t ng, int G, int rot, int nf3, float *out,
                          int accumulate) {
    const int V = G / 16;
    zhad d;
    if (rot) zhad_init(&d, G);
    for (size_t g = 0; g < ng; g++) {
        const uint8_t *rec = recs + g * ECHO_OUT2_REC;
        uint16_t sb = (uint16_t)(rec[0] | (rec[1] << 8));
        int i1 = rec[6] % G, i2 = rec[7] % G;
        float *o = out + g * (size_t)G;
        for (int j = 0; ECHO_PF > 0 && j < V; j++)
            _mm_prefetch((const char *)(o + 16 * j + ECHO_PF), _MM_HINT_T0);
        float a1 = o[i1], a2 = o[i2];
        __m512 v[ZMAXV];
        if (nf3) {
            UNROLL
            for (int j = 0; j < V; j++)
                v[j] = nf3_levels16(codes + g * (size_t)G / 8 * 3 + 6 * (size_t)j);
        } else
            unpack(codes + g * (size_t)G / 2, V, v);
        if (rot)
            inv_rot(v, V, sb, &d, G, NULL, nf3);
        else {
            const __m512 sv = _mm512_set1_ps(echo_bf16_to_f32(sb));
            UNROLL
            for (int j = 0; j < V; j++)
                v[j] = _mm512_mul_ps(v[j], sv);
        }
        UNROLL
        for (int j = 0; j < V; j++)
            _mm512_storeu_ps(o + 16 * j, accumulate ? add_acc(_mm512_loadu_ps(o + 16 * j), v[j]) : v[j]);
        float o1 = echo_bf16_to_f32((uint16_t)(rec[2] | (rec[3] << 8)));
        float o2 = echo_bf16_to_f32((uint16_t)(rec[4] | (rec[5] << 8)));
        o[i1] = accumulate ? add_acc1(a1, o1) : o1;
        o[i2] = accumulate ? add_acc1(a2, o2) : o2;
    }
}

/* The record forms' loops, as echo_codec.h's rows name them (codec_avx2.c's
 * AVX2_FORM_LOOPS: whole groups, G in [the row's min_group, 256]). The
 * out2 family: (rotate, nf3) = out2 (0, 0), hout2 (1, 0), hnf3 (1, 1). */
#define Z_FORM_LOOPS(stem)                                                                                             \
    Z_FN size_t stem##_enc(const float *y, float *res, int res_valid, size_t n, int group, uint8_t *codes,             \
                           uint8_t *recs, size_t *bad) {                                                               \
        size_t np = 0;                                                                                                 \
        ECHO_CPU_FOR_EACH_G(group, Z_ENC_##stem, (void)0)                                                              \
        return np;                                                                                                     \
    }                                                                                                                  \
    Z_FN void stem##_dec(const uint8_t *codes, const uint8_t *recs, size_t ng, int group, float *out,                  \
                         int accumulate) {                                                                             \
        ECHO_CPU_FOR_EACH_G(group, Z_DEC_##stem, (void)0)                                                              \
    }
#define Z_ENC(rot, nf3, G) np = o2_enc_variants(y, res, res_valid, rot, nf3, n, G, codes, recs, bad)
#define Z_DEC(rot, nf3, G) o2_dec_impl(codes, recs, ng, G, rot, nf3, out, accumulate)
#define Z_ENC_echo_avx512_out2(G) Z_ENC(0, 0, G)
#define Z_DEC_echo_avx512_out2(G) Z_DEC(0, 0, G)
#define Z_ENC_echo_avx512_hout2(G) Z_ENC(1, 0, G)
#define Z_DEC_echo_avx512_hout2(G) Z_DEC(1, 0, G)
#define Z_ENC_echo_avx512_hnf3(G) Z_ENC(1, 1, G)
#define Z_DEC_echo_avx512_hnf3(G) Z_DEC(1, 1, G)
Z_FORM_LOOPS(echo_avx512_out2)
Z_FORM_LOOPS(echo_avx512_hout2)
Z_FORM_LOOPS(echo_avx512_hnf3)

int echo_cpu_codec_avx512_ok(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
}

const echo_cpu_codec echo_cpu_codec_avx512 = {
    .name = "avx512",
    .isa = ECHO_ISA_AVX512,
    .encode = z_encode,
    ECHO_CPU_CODEC_AVX2_SHARED, /* AVX2's decode, rotation and add */
};

#endif
