/*
 * comm/codec/echo_codec.h — private to comm/: the arithmetic of the Echo group
 * codec, written once for C and CUDA (every function is __host__ __device__
 * under nvcc), so the cpu loops in codec.c and the kernels in echo_cuda.cu
 * compute bit-identical codes, scales, outputs and residuals.
 *
 * Format (docs/echo.md has the full wire layout and the error bound):
 *   - A group is G consecutive values (G a power of two, 16..256).
 *   - Its scale s is a bf16, s = absmax/7 rounded UP to bf16, so that
 *     |y|/s < 7.5 for every value of the group and the code never clips by
 *     more than rounding does. bf16 rather than fp16: it spans the whole
 *     fp32 range, so tiny (subnormal) and huge groups need no special
 *     exponent handling; its 8-bit mantissa costs at most 2^-7 of the code
 *     range, which rounding the scale up turns into a slightly larger s.
 *   - Codes q = round-half-even(fl(y/s)) in [-7, 7] (two's-complement
 *     nibble, 0x8 is never emitted), two per byte, element 2j in the low
 *     nibble.
 *   - Dequantized value q*s is exact in fp32 (3-bit times 8-bit
 *     significands; s is a multiple of 2^-133, far above fp32's 2^-149
 *     grid), and y - q*s is exact too (Sterbenz: q*s is within a factor of
 *     two of y whenever q != 0). That is what makes the error-feedback
 *     telescoping exact up to the fp32 adds, and makes FMA contraction by
 *     nvcc harmless.
 *   - A group whose absmax is inf/nan or >= 2^127 gets the poison scale
 *     (bf16 NaN). Decoding it yields NaN, so a bad value anywhere propagates
 *     to every rank's output in-band, and every rank reports the same error.
 *     |y| < 2^127 also guarantees 7*s cannot overflow.
 */
#ifndef ECHO_COMM_CODEC_H
#define ECHO_COMM_CODEC_H

#include <stdint.h>
#include <string.h>

#include "comm/echo.h" /* ECHO_MAX_GROUP */

#ifdef __CUDACC__
#define ECHO_HD static inline __host__ __device__
#else
#define ECHO_HD static inline
#endif

#define ECHO_QMAX 7                          /* symmetric 4-bit range [-7, 7] */
#define ECHO_SCALE_POISON ((uint16_t)0x7fc0) /* bf16 quiet NaN */
#define ECHO_LIMIT_BITS 0x7f000000u          /* |y| bits at 2^127: the codec's range */
#define ECHO_INF_BITS 0x7f800000u

ECHO_HD uint32_t echo_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

ECHO_HD float echo_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

ECHO_HD uint32_t echo_abs_bits(float f) {
    return echo_f32_bits(f) & 0x7fffffffu;
}

/* Round-to-nearest-even to an integer-valued float: add and subtract
 * 1.5*2^23, exact for |v| < 2^22 (the codec only calls it with |v| < 7.5),
 * and it vectorizes on plain SSE2. The device does the same two IEEE adds
 * (the _rn intrinsics are never contracted or reordered) rather than rintf:
 * rintf(-0.3) is -0 where the adds give +0, and for y = -0 in a group with a
 * non-zero scale the residual y - q*s would then be +0 on the GPU and -0 on
 * the cpu. */
ECHO_HD float echo_rint(float v) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(__fadd_rn(v, 12582912.0f), 12582912.0f);
#else
    return (v + 12582912.0f) - 12582912.0f;
#endif
}

/* IEEE round-to-nearest division on both sides (nvcc would otherwise be
 * free to use an approximate reciprocal under fast-math flags). */
ECHO_HD float echo_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/* bf16 <-> fp32. Round to nearest even; NaN stays NaN whatever its payload
 * (the carry of the rounding add must not turn a NaN into +-0 or inf). */
ECHO_HD uint16_t echo_f32_to_bf16(float f) {
    uint32_t u = echo_f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > ECHO_INF_BITS ? nan : r);
}

ECHO_HD float echo_bf16_to_f32(uint16_t h) {
    return echo_bits_f32((uint32_t)h << 16);
}

/* The bf16 scale of a group from its absmax (as |.| bits): absmax/7 rounded
 * up to bf16; 0 for an all-zero group; the poison scale when absmax is
 * inf/nan or >= 2^127. Rounding up means |y|/s <= 7 up to the one rounding of
 * the division, and when absmax/7 underflows the result is the smallest bf16
 * subnormal 2^-133 rather than 0, so the division by s stays defined. */
ECHO_HD uint16_t echo_scale_from_absbits(uint32_t absbits) {
    if (absbits >= ECHO_LIMIT_BITS) return ECHO_SCALE_POISON;
    if (absbits == 0) return 0;
    uint32_t q = echo_f32_bits(echo_div(echo_bits_f32(absbits), (float)ECHO_QMAX));
    uint32_t up = (q + 0xffffu) >> 16;
    return (uint16_t)(up ? up : 1u);
}

/* The scale of a whole group y[0..G): echo_scale_from_absbits of its absmax. */
ECHO_HD uint16_t echo_group_scale(const float *y, int G) {
    uint32_t m = 0;
    for (int i = 0; i < G; i++) {
        uint32_t a = echo_abs_bits(y[i]);
        m = a > m ? a : m;
    }
    return echo_scale_from_absbits(m);
}

ECHO_HD int echo_scale_is_poison(uint16_t s) {
    return (s & 0x7f80u) == 0x7f80u;
}

/* The code of y in a group of (decoded, positive, finite) scale s, as an
 * integer-valued float (so the residual y - q*s needs no int round trip).
 * No clamp is needed: s >= fl(absmax/7) makes |y/s| <= 7(1 + 2^-17) even
 * when absmax/7 is subnormal (its absolute rounding error 2^-150 is then at
 * most 2^-17 of s >= 2^-133), so |fl(y/s)| < 7.5 and rint gives |q| <= 7.
 * docs/echo.md, "Codec", has the proof; the codec tests check the range. */
ECHO_HD float echo_code(float y, float s) {
    return echo_rint(echo_div(y, s));
}

ECHO_HD int echo_quant(float y, float s) {
    return (int)echo_code(y, s);
}

ECHO_HD uint8_t echo_pack2(int lo, int hi) {
    return (uint8_t)(((unsigned)lo & 15u) | (((unsigned)hi & 15u) << 4));
}

/* Sign-extend the nibbles (arithmetic shifts of a signed byte). */
ECHO_HD int echo_nib_lo(uint8_t b) {
    return (int)(int8_t)(uint8_t)(b << 4) >> 4;
}
ECHO_HD int echo_nib_hi(uint8_t b) {
    return (int)(int8_t)b >> 4;
}

/* ---- the Hadamard codec's rotation (ECHO_CODEC_HADAMARD) ----
 * A group y of G values is coded as int4 in the rotated basis
 * u = H D y, H the Sylvester Walsh-Hadamard matrix of order G (entries
 * +-1, unnormalised), D a fixed diagonal of random signs (echo_had_neg; the
 * same on every rank and every call, so ranks can add rotated values and
 * rotate the sum back once: y = D H u / G). An outlier channel is spread
 * over the G rotated values, so it no longer sets one scale that flattens
 * its group's other values to zero. The butterflies are fp32 adds in a
 * fixed order and 1/G is a power of two, so host and device give the same
 * bits; each butterfly's inputs are fixed by the stage before it, so the
 * order of butterflies within a stage does not matter. */
ECHO_HD int echo_had_neg(int i) {
    uint32_t h = (uint32_t)i * 0x9e3779b1u + 0x7f4a7c15u;
    h ^= h >> 15;
    h *= 0x85ebca77u;
    h ^= h >> 13;
    return (int)(h & 1u);
}

ECHO_HD float echo_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

ECHO_HD float echo_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

ECHO_HD float echo_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* IEEE square root (correctly rounded on both sides). */
ECHO_HD float echo_sqrt(float a) {
#ifdef __CUDA_ARCH__
    return __fsqrt_rn(a);
#else
    return __builtin_sqrtf(a);
#endif
}

/* v = H v in place (G a power of two). */
ECHO_HD void echo_fwht(float *v, int G) {
    for (int h = 1; h < G; h *= 2)
        for (int i = 0; i < G; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = v[j], b = v[j + h];
                v[j] = echo_add(a, b);
                v[j + h] = echo_sub(a, b);
            }
}

/* v = H D v: into the rotated basis. */
ECHO_HD void echo_had_fwd(float *v, int G) {
    for (int i = 0; i < G; i++)
        if (echo_had_neg(i)) v[i] = -v[i];
    echo_fwht(v, G);
}

/* v = D H v / G: back (exact inverse up to the adds' rounding). */
ECHO_HD void echo_had_inv(float *v, int G) {
    echo_fwht(v, G);
    float inv = 1.0f / (float)G;
    for (int i = 0; i < G; i++)
        v[i] = echo_mul(v[i], echo_had_neg(i) ? -inv : inv);
}

/* ---- the hsub6 codec (ECHO_CODEC_HSUB6): finer scales at 4.5 bits ----
 * Each 16 values (a sub-group) are rotated by H16 D (as above, G = 16) and
 * get their own scale, stored in 6 bits as quarter octaves below the bf16
 * scale of their group of G (G = 64, 128 or 256): s_k = S * 2^(-e_k/4)
 * rounded up to bf16, e_k in [0, 63], the largest e_k with 7 s_k >= the
 * sub-group's absmax (so codes stay in [-7, 7]: sub-groups of small values
 * get small steps whatever the group's largest value). A group's scale
 * record is S (bf16, 2 bytes, little-endian) then its G/16 exponents, four
 * per 3 bytes (e0 | e1 << 6 | e2 << 12 | e3 << 18, little-endian):
 * 2 + 3G/64 bytes, so 4 + 16/G + 3/8 bits per value (4.5 at G = 128).
 * s_k is a bf16, so q*s_k and y - q*s_k are exact as for int4. */
#define ECHO_SUB 16
#define ECHO_SUB_EMAX 63

ECHO_HD int echo_hsub_rec_bytes(int G) {
    return 2 + 3 * G / 64;
}

/* 2^(-r/4), r in 0..3, as fp32 constants */
ECHO_HD float echo_qoct(int r) {
    return r == 0 ? 1.0f : r == 1 ? 0.840896415f : r == 2 ? 0.707106781f : 0.594603558f;
}

/* S * 2^(-e/4) rounded up to bf16 (never 0), S a positive finite bf16 value. */
ECHO_HD float echo_sub_scale(float S, int e) {
    float v = echo_mul(echo_mul(S, echo_qoct(e & 3)), echo_bits_f32((uint32_t)(127 - (e >> 2)) << 23));
    uint32_t up = (echo_f32_bits(v) + 0xffffu) >> 16;
    return echo_bf16_to_f32((uint16_t)(up ? up : 1u));
}

/* The largest e in [0, 63] with 7 s(e) >= a (7 s is exact: 8 x 3 bits); s is
 * non-increasing in e, so a binary search. e = 0 (s = S) when none. */
ECHO_HD int echo_sub_exp(float S, float a) {
    int e = 0;
    for (int b = 32; b; b >>= 1)
        if (e + b <= ECHO_SUB_EMAX && echo_mul(echo_sub_scale(S, e + b), 7.0f) >= a) e += b;
    return e;
}

ECHO_HD int echo_hsub_get_exp(const uint8_t *rec, int k) {
    const uint8_t *t = rec + 2 + 3 * (k / 4);
    uint32_t w = (uint32_t)t[0] | ((uint32_t)t[1] << 8) | ((uint32_t)t[2] << 16);
    return (int)((w >> (6 * (k % 4))) & 63u);
}

/* Code one group y[0..G) (rotated, zero padding included): codes (G/2
 * bytes) and its scale record; when r != NULL, r[0..n) = y - q*s (an
 * all-zero group keeps y, a poisoned one 0, as echo_code's groups). Returns
 * the group's scale bits (poison when its absmax is inf/nan or >= 2^127). */
ECHO_HD uint16_t echo_hsub_encode_group(const float *y, int G, uint8_t *codes, uint8_t *rec, float *r, int n) {
    uint16_t sb = echo_group_scale(y, G);
    rec[0] = (uint8_t)(sb & 0xffu);
    rec[1] = (uint8_t)(sb >> 8);
    for (int t = 0; t < 3 * G / 64; t++)
        rec[2 + t] = 0;
    if (sb == 0 || echo_scale_is_poison(sb)) {
        for (int j = 0; j < G / 2; j++)
            codes[j] = 0;
        if (r)
            for (int i = 0; i < n; i++)
                r[i] = sb == 0 ? y[i] : 0.0f;
        return sb;
    }
    float S = echo_bf16_to_f32(sb);
    for (int k = 0; k < G / ECHO_SUB; k++) {
        const float *v = y + k * ECHO_SUB;
        uint32_t am = 0;
        for (int i = 0; i < ECHO_SUB; i++) {
            uint32_t a = echo_abs_bits(v[i]);
            am = a > am ? a : am;
        }
        int e = echo_sub_exp(S, echo_bits_f32(am));
        float s = echo_sub_scale(S, e);
        uint8_t *t = rec + 2 + 3 * (k / 4);
        uint32_t w = (uint32_t)t[0] | ((uint32_t)t[1] << 8) | ((uint32_t)t[2] << 16);
        w |= (uint32_t)e << (6 * (k % 4));
        t[0] = (uint8_t)w;
        t[1] = (uint8_t)(w >> 8);
        t[2] = (uint8_t)(w >> 16);
        for (int i = 0; i < ECHO_SUB; i += 2) {
            float q0 = echo_code(v[i], s), q1 = echo_code(v[i + 1], s);
            codes[(k * ECHO_SUB + i) / 2] = echo_pack2((int)q0, (int)q1);
            int i0 = k * ECHO_SUB + i;
            if (r && i0 < n) r[i0] = echo_sub(v[i], echo_mul(q0, s));
            if (r && i0 + 1 < n) r[i0 + 1] = echo_sub(v[i + 1], echo_mul(q1, s));
        }
    }
    return sb;
}

/* v[0..G) = decode of one group; returns its scale bits (for the poison check). */
ECHO_HD uint16_t echo_hsub_decode_group(const uint8_t *codes, const uint8_t *rec, int G, float *v) {
    uint16_t sb = (uint16_t)(rec[0] | (rec[1] << 8));
    float S = echo_bf16_to_f32(sb);
    int ok = sb != 0 && !echo_scale_is_poison(sb);
    for (int k = 0; k < G / ECHO_SUB; k++) {
        /* a poisoned group decodes to NaN, a zero one to 0, as int4's */
        float s = ok ? echo_sub_scale(S, echo_hsub_get_exp(rec, k)) : S;
        for (int i = 0; i < ECHO_SUB; i += 2) {
            uint8_t b = codes[(k * ECHO_SUB + i) / 2];
            v[k * ECHO_SUB + i] = echo_mul((float)echo_nib_lo(b), s);
            v[k * ECHO_SUB + i + 1] = echo_mul((float)echo_nib_hi(b), s);
        }
    }
    return sb;
}

/* ---- the out2 codec (ECHO_CODEC_OUT2): outliers in 16 bits ----
 * In each group of G (64..256) the two values of largest |y| travel as bf16
 * (round to nearest even) with their indices; the others are int4 codes
 * under a bf16 scale set by the third largest |y|, so one or two outlier
 * channels no longer flatten their group. Record: S, o1, o2 (bf16 each),
 * i1, i2 (one byte each): 8 bytes, 4 + 64/G bits per value (4.5 at 128).
 * The outliers' codes are 0. y - bf16(y) is exact (bf16(y) is within a
 * factor of two of y), so the residual is exact as for int4. */
#define ECHO_FORM_INT4 0 /* codes, then one bf16 scale per group */
#define ECHO_FORM_HSUB 1 /* codes, then hsub6 records */
#define ECHO_FORM_OUT2 2 /* codes, then out2 records */
#define ECHO_OUT2_REC 8

/* The two outliers of out2 and hout2: i1 the first index of the largest
 * |y|, i2 the first of the largest among the others (G >= 2); returns the
 * largest |y| as bits (the poison test). */
ECHO_HD uint32_t echo_top2(const float *y, int G, int *i1_out, int *i2_out) {
    uint32_t m = 0, a1 = 0, a2;
    int i1 = 0, i2;
    for (int i = 0; i < G; i++) {
        uint32_t a = echo_abs_bits(y[i]);
        m = a > m ? a : m;
        if (a > a1) {
            a1 = a;
            i1 = i;
        }
    }
    i2 = i1 == 0 ? 1 : 0;
    a2 = echo_abs_bits(y[i2]);
    for (int i = 0; i < G; i++) {
        uint32_t a = echo_abs_bits(y[i]);
        if (i != i1 && a > a2) {
            a2 = a;
            i2 = i;
        }
    }
    *i1_out = i1;
    *i2_out = i2;
    return m;
}

ECHO_HD uint16_t echo_out2_encode_group(const float *y, int G, uint8_t *codes, uint8_t *rec, float *r, int n) {
    int i1, i2;
    uint32_t m = echo_top2(y, G, &i1, &i2);
    uint32_t m3 = 0;
    for (int i = 0; i < G; i++) {
        uint32_t a = echo_abs_bits(y[i]);
        if (i != i1 && i != i2) m3 = a > m3 ? a : m3;
    }
    /* poison: any value the codec cannot carry poisons the whole group */
    uint16_t sb = m >= ECHO_LIMIT_BITS ? ECHO_SCALE_POISON : echo_scale_from_absbits(m3);
    int ok = sb != 0 && !echo_scale_is_poison(sb);
    uint16_t o1 = echo_scale_is_poison(sb) ? ECHO_SCALE_POISON : echo_f32_to_bf16(y[i1]);
    uint16_t o2 = echo_scale_is_poison(sb) ? ECHO_SCALE_POISON : echo_f32_to_bf16(y[i2]);
    rec[0] = (uint8_t)sb, rec[1] = (uint8_t)(sb >> 8);
    rec[2] = (uint8_t)o1, rec[3] = (uint8_t)(o1 >> 8);
    rec[4] = (uint8_t)o2, rec[5] = (uint8_t)(o2 >> 8);
    rec[6] = (uint8_t)i1, rec[7] = (uint8_t)i2;
    float s = echo_bf16_to_f32(sb);
    for (int i = 0; i < G; i += 2) {
        float q0 = ok && i != i1 && i != i2 ? echo_code(y[i], s) : 0.0f;
        float q1 = ok && i + 1 != i1 && i + 1 != i2 ? echo_code(y[i + 1], s) : 0.0f;
        codes[i / 2] = echo_pack2((int)q0, (int)q1);
        if (!r) continue;
        for (int t = 0; t < 2; t++) {
            int k = i + t;
            if (k >= n) continue;
            float q = t ? q1 : q0;
            if (echo_scale_is_poison(sb))
                r[k] = 0.0f;
            else if (k == i1)
                r[k] = echo_sub(y[k], echo_bf16_to_f32(o1));
            else if (k == i2)
                r[k] = echo_sub(y[k], echo_bf16_to_f32(o2));
            else
                r[k] = sb == 0 ? y[k] : echo_sub(y[k], echo_mul(q, s));
        }
    }
    return sb;
}

ECHO_HD uint16_t echo_out2_decode_group(const uint8_t *codes, const uint8_t *rec, int G, float *v) {
    uint16_t sb = (uint16_t)(rec[0] | (rec[1] << 8));
    uint16_t o1 = (uint16_t)(rec[2] | (rec[3] << 8)), o2 = (uint16_t)(rec[4] | (rec[5] << 8));
    float s = echo_bf16_to_f32(sb);
    for (int i = 0; i < G; i += 2) {
        v[i] = echo_mul((float)echo_nib_lo(codes[i / 2]), s);
        v[i + 1] = echo_mul((float)echo_nib_hi(codes[i / 2]), s);
    }
    v[rec[6] % G] = echo_bf16_to_f32(o1);
    v[rec[7] % G] = echo_bf16_to_f32(o2);
    return sb;
}

/* ---- the hout2 codec (ECHO_CODEC_HOUT2): both ----
 * out2's two outliers leave the group first (bf16 + index, as out2), then
 * the rest is rotated by H D over the whole group (as hadamard) and coded
 * as int4 under one bf16 scale. The residual is taken in the input basis
 * (y minus the decoded, rotated-back group), so it is not exact: it carries
 * the inverse rotation's fp32 rounding too. Same 8-byte record as out2. */
#define ECHO_FORM_HOUT2 3

/* ---- the hnf3 codec (ECHO_CODEC_HNF3): 3-bit normal-float codes ----
 * hout2's outliers and rotation (the two largest |y| in bf16 with their
 * indices; H D over the rest of the group), then each rotated value u gets
 * one of 8 levels: the MSE-optimal (Lloyd-Max) quantizer of a unit Gaussian,
 * +-0.2451, +-0.7560, +-1.3440, +-2.1520, times the group's RMS s (rotated
 * values are near-Gaussian; the error is about 0.035 s^2 per value where
 * int4-style absmax levels at 3 bits would leave about 0.063 s^2). A code
 * c is 3 bits: sign (4) | level index (0..3), the index the number of
 * decision thresholds (0.5006, 1.0500, 1.7480: midpoints of the levels) at
 * or below |u / s|; 8 codes per 3 bytes, code j of the 8 at bits 3j of the
 * 24-bit little-endian word. Codes take 3G/8 bytes, before the records.
 * Record: s (bf16, round to nearest; the poison scale as hout2's), o1, o2,
 * i1, i2 as hout2's: 8 bytes, so 3 + 64/G bits per value (3.25 at 256).
 * s is an RMS, so the sum of squares is taken in a fixed order every
 * implementation repeats (echo_nf3_rms), on u scaled by a power of two
 * that brings its largest |u| into [1, 2) (no overflow, exact). */
#define ECHO_FORM_HNF3 4
#define ECHO_NF3_T1 0.5006f
#define ECHO_NF3_T2 1.0500f
#define ECHO_NF3_T3 1.7480f

/* The level of code c (0..7) in units of s. */
ECHO_HD float echo_nf3_level(int c) {
    float m = (c & 3) == 0 ? 0.2451f : (c & 3) == 1 ? 0.7560f : (c & 3) == 2 ? 1.3440f : 2.1520f;
    return c & 4 ? -m : m;
}

/* The code of t = u / s. */
ECHO_HD int echo_nf3_code(float t) {
    float a = t < 0.0f ? -t : t;
    return (t < 0.0f ? 4 : 0) | ((a >= ECHO_NF3_T1) + (a >= ECHO_NF3_T2) + (a >= ECHO_NF3_T3));
}

ECHO_HD void echo_nf3_put(uint8_t *codes, int i, int c) {
    uint8_t *t = codes + 3 * (i / 8);
    int b = 3 * (i % 8);
    uint32_t w = (uint32_t)t[0] | ((uint32_t)t[1] << 8) | ((uint32_t)t[2] << 16);
    w = (w & ~(7u << b)) | ((uint32_t)c << b);
    t[0] = (uint8_t)w, t[1] = (uint8_t)(w >> 8), t[2] = (uint8_t)(w >> 16);
}

ECHO_HD int echo_nf3_get(const uint8_t *codes, int i) {
    const uint8_t *t = codes + 3 * (i / 8);
    uint32_t w = (uint32_t)t[0] | ((uint32_t)t[1] << 8) | ((uint32_t)t[2] << 16);
    return (int)((w >> (3 * (i % 8))) & 7u);
}

/* The bf16 RMS of u[0..G) (G a multiple of 8), mu its largest |u| as bits
 * (< 2^127, > 0): 8 partial sums of squares, lane l over u[8j + l] in
 * order of j, then summed (0+4, 2+6, 1+5, 3+7 as a tree); sqrt(sum / G)
 * scaled back; never 0. */
ECHO_HD uint16_t echo_nf3_rms(const float *u, int G, uint32_t mu) {
    int e = (int)(mu >> 23);
    e = e < 1 ? 1 : e;
    float p = echo_bits_f32((uint32_t)(254 - e) << 23), back = echo_bits_f32((uint32_t)e << 23);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < G; j += 8)
        for (int l = 0; l < 8; l++) {
            float v = echo_mul(u[j + l], p);
            acc[l] = echo_add(acc[l], echo_mul(v, v));
        }
    for (int l = 0; l < 4; l++)
        acc[l] = echo_add(acc[l], acc[l + 4]);
    for (int l = 0; l < 2; l++)
        acc[l] = echo_add(acc[l], acc[l + 2]);
    float sum = echo_add(acc[0], acc[1]);
    uint16_t h = echo_f32_to_bf16(echo_mul(echo_sqrt(echo_div(sum, (float)G)), back));
    return h ? h : (uint16_t)1u;
}

/* hout2 (nf3 = 0) and hnf3 (nf3 = 1): v = the decoded group, rotated back,
 * the outliers patched in. */
ECHO_HD void echo_hrot_finish(const uint8_t *codes, uint16_t sb, uint16_t o1, uint16_t o2, int i1, int i2, int G,
                              float *v, int nf3) {
    float s = echo_bf16_to_f32(sb);
    for (int i = 0; i < G; i += 2) {
        int c0 = nf3 ? echo_nf3_get(codes, i) : echo_nib_lo(codes[i / 2]);
        int c1 = nf3 ? echo_nf3_get(codes, i + 1) : echo_nib_hi(codes[i / 2]);
        v[i] = echo_mul(nf3 ? echo_nf3_level(c0) : (float)c0, s);
        v[i + 1] = echo_mul(nf3 ? echo_nf3_level(c1) : (float)c1, s);
    }
    echo_had_inv(v, G);
    v[i1 % G] = echo_bf16_to_f32(o1);
    v[i2 % G] = echo_bf16_to_f32(o2);
}

ECHO_HD uint16_t echo_hrot_encode_group(const float *y, int G, uint8_t *codes, uint8_t *rec, float *r, int n,
                                        int nf3) {
    int i1, i2;
    uint32_t m = echo_top2(y, G, &i1, &i2);
    float u[ECHO_MAX_GROUP];
    for (int i = 0; i < G; i++)
        u[i] = i == i1 || i == i2 ? 0.0f : y[i];
    echo_had_fwd(u, G);
    uint32_t mu = 0;
    for (int i = 0; i < G; i++) {
        uint32_t a = echo_abs_bits(u[i]);
        mu = a > mu ? a : mu;
    }
    uint16_t sb = m >= ECHO_LIMIT_BITS || mu >= ECHO_LIMIT_BITS ? ECHO_SCALE_POISON
                  : !nf3 || !mu                                 ? echo_scale_from_absbits(mu)
                                                                : echo_nf3_rms(u, G, mu);
    int poison = echo_scale_is_poison(sb), ok = sb != 0 && !poison;
    uint16_t o1 = poison ? ECHO_SCALE_POISON : echo_f32_to_bf16(y[i1]);
    uint16_t o2 = poison ? ECHO_SCALE_POISON : echo_f32_to_bf16(y[i2]);
    rec[0] = (uint8_t)sb, rec[1] = (uint8_t)(sb >> 8);
    rec[2] = (uint8_t)o1, rec[3] = (uint8_t)(o1 >> 8);
    rec[4] = (uint8_t)o2, rec[5] = (uint8_t)(o2 >> 8);
    rec[6] = (uint8_t)i1, rec[7] = (uint8_t)i2;
    float s = echo_bf16_to_f32(sb);
    /* a zero or poisoned scale: codes 0 (decoded as 0 * 0 or NaN; hnf3's
     * level 0.2451 * 0 = 0 too) */
    for (int i = 0; i < G; i += 2) {
        float t0 = ok ? echo_div(u[i], s) : 0.0f, t1 = ok ? echo_div(u[i + 1], s) : 0.0f;
        if (!nf3) {
            codes[i / 2] = echo_pack2((int)echo_rint(t0), (int)echo_rint(t1));
            continue;
        }
        if (i % 8 == 0) codes[3 * (i / 8)] = codes[3 * (i / 8) + 1] = codes[3 * (i / 8) + 2] = 0;
        echo_nf3_put(codes, i, ok ? echo_nf3_code(t0) : 0);
        echo_nf3_put(codes, i + 1, ok ? echo_nf3_code(t1) : 0);
    }
    if (!r) return sb;
    if (poison) {
        for (int i = 0; i < n; i++)
            r[i] = 0.0f;
        return sb;
    }
    echo_hrot_finish(codes, sb, o1, o2, i1, i2, G, u, nf3);
    for (int i = 0; i < n; i++)
        r[i] = echo_sub(y[i], u[i]);
    return sb;
}

ECHO_HD uint16_t echo_hrot_decode_group(const uint8_t *codes, const uint8_t *rec, int G, float *v, int nf3) {
    uint16_t sb = (uint16_t)(rec[0] | (rec[1] << 8));
    echo_hrot_finish(codes, sb, (uint16_t)(rec[2] | (rec[3] << 8)), (uint16_t)(rec[4] | (rec[5] << 8)), rec[6], rec[7],
                     G, v, nf3);
    return sb;
}

ECHO_HD uint16_t echo_hout2_encode_group(const float *y, int G, uint8_t *codes, uint8_t *rec, float *r, int n) {
    return echo_hrot_encode_group(y, G, codes, rec, r, n, 0);
}

ECHO_HD uint16_t echo_hout2_decode_group(const uint8_t *codes, const uint8_t *rec, int G, float *v) {
    return echo_hrot_decode_group(codes, rec, G, v, 0);
}

ECHO_HD uint16_t echo_hnf3_encode_group(const float *y, int G, uint8_t *codes, uint8_t *rec, float *r, int n) {
    return echo_hrot_encode_group(y, G, codes, rec, r, n, 1);
}

ECHO_HD uint16_t echo_hnf3_decode_group(const uint8_t *codes, const uint8_t *rec, int G, float *v) {
    return echo_hrot_decode_group(codes, rec, G, v, 1);
}

/* ---- int4 as a record form (ECHO_FORM_INT4) ----
 * The int4 codec's group with its bf16 scale as the record: what the int4
 * loops (codec_scalar.c, which the host runs for this form: bf16 input and
 * bf16-rounded residuals besides) compute with an fp32 residual. A zero
 * group's residual is y itself, a poisoned one's 0. */
ECHO_HD uint16_t echo_int4_encode_group(const float *y, int G, uint8_t *codes, uint8_t *rec, float *r, int n) {
    uint16_t sb = echo_group_scale(y, G);
    int ok = sb != 0 && !echo_scale_is_poison(sb);
    float s = echo_bf16_to_f32(sb);
    rec[0] = (uint8_t)sb, rec[1] = (uint8_t)(sb >> 8);
    for (int i = 0; i < G; i += 2) {
        float q0 = ok ? echo_code(y[i], s) : 0.0f, q1 = ok ? echo_code(y[i + 1], s) : 0.0f;
        codes[i / 2] = echo_pack2((int)q0, (int)q1);
        for (int t = 0; r && t < 2; t++)
            if (i + t < n) r[i + t] = ok ? echo_sub(y[i + t], echo_mul(t ? q1 : q0, s)) : sb ? 0.0f : y[i + t];
    }
    return sb;
}

ECHO_HD uint16_t echo_int4_decode_group(const uint8_t *codes, const uint8_t *rec, int G, float *v) {
    uint16_t sb = (uint16_t)(rec[0] | (rec[1] << 8));
    float s = echo_bf16_to_f32(sb);
    for (int i = 0; i < G; i += 2) {
        v[i] = echo_mul((float)echo_nib_lo(codes[i / 2]), s);
        v[i + 1] = echo_mul((float)echo_nib_hi(codes[i / 2]), s);
    }
    return sb;
}

/* ---- The wire forms: one row (descriptor) per form ----
 *   X(id, name, code_bits, record bytes of a group of G, encode_group,
 *     decode_group, avx2, avx512)
 * A group of G values travels as G * code_bits / 8 code bytes (in the
 * message's code area, before every record) and one record, which starts
 * with the group's bf16 scale (the loops read it as the poison mark). The
 * group functions are the reference arithmetic (C and CUDA): the host's
 * scalar loops (codec_scalar.c) and the CUDA kernels (echo_cuda.cu) reach
 * them only through echo_rec_encode_group / echo_rec_decode_group below.
 * avx2 / avx512 name each ISA's loops over whole groups, ECHO_FAST(stem,
 * min_group) for stem_enc / stem_dec (codec_cpu.h), or ECHO_NO_FAST: the
 * scalar loops; the host table (forms.c) is built from these rows, and
 * nothing else in comm/ lists forms. So a new form is its id, its group
 * functions and one row here (its loops optional); a codec using it is one
 * row of comm/preset.c's codec table. A build's ECHO_EXTRA_FORMS_FILE,
 * which defines ECHO_EXTRA_FORMS, adds rows (tests/toy/toy_codec.h). A form
 * no row knows encodes and decodes as poison (the call then fails on every
 * rank as not finite): never as another form. The host runs its own int4
 * loops for ECHO_FORM_INT4 (bf16 input and residuals); its row gives the
 * layout and a reference. */
#define ECHO_REC_FORMS(X)                                                                                              \
    X(ECHO_FORM_INT4, "int4", 4, 2, echo_int4_encode_group, echo_int4_decode_group, ECHO_NO_FAST, ECHO_NO_FAST)       \
    X(ECHO_FORM_HSUB, "hsub6", 4, echo_hsub_rec_bytes(G), echo_hsub_encode_group, echo_hsub_decode_group,             \
      ECHO_FAST(echo_avx2_hsub, 64), ECHO_FAST(echo_avx2_hsub, 64))                                                    \
    X(ECHO_FORM_OUT2, "out2", 4, ECHO_OUT2_REC, echo_out2_encode_group, echo_out2_decode_group,                       \
      ECHO_FAST(echo_avx2_out2, 16), ECHO_FAST(echo_avx512_out2, 16))                                                  \
    X(ECHO_FORM_HOUT2, "hout2", 4, ECHO_OUT2_REC, echo_hout2_encode_group, echo_hout2_decode_group,                   \
      ECHO_FAST(echo_avx2_hout2, 16), ECHO_FAST(echo_avx512_hout2, 16))                                                \
    X(ECHO_FORM_HNF3, "hnf3", 3, ECHO_OUT2_REC, echo_hnf3_encode_group, echo_hnf3_decode_group,                       \
      ECHO_FAST(echo_avx2_hnf3, 64), ECHO_FAST(echo_avx512_hnf3, 64))
#ifdef ECHO_EXTRA_FORMS_FILE
#include ECHO_EXTRA_FORMS_FILE /* its group functions, and ECHO_EXTRA_FORMS' rows */
#endif
#ifndef ECHO_EXTRA_FORMS
#define ECHO_EXTRA_FORMS(X)
#endif
#define ECHO_ALL_FORMS(X) ECHO_REC_FORMS(X) ECHO_EXTRA_FORMS(X)

ECHO_HD int echo_rec_bytes(int form, int G) {
    (void)G;
    switch (form) {
#define ECHO_X(id, name, bits, rb, enc, dec, avx2, avx512)                                                             \
    case id: return rb;
        ECHO_ALL_FORMS(ECHO_X)
#undef ECHO_X
    default: return 0;
    }
}

/* Bits of one value's code in wire form `form` (0 for an unknown form). */
ECHO_HD int echo_form_code_bits(int form) {
    switch (form) {
#define ECHO_X(id, name, bits, rb, enc, dec, avx2, avx512)                                                             \
    case id: return bits;
        ECHO_ALL_FORMS(ECHO_X)
#undef ECHO_X
    default: return 0;
    }
}

/* Code bytes of n values (n a multiple of 8) in wire form `form`. */
ECHO_HD size_t echo_form_code_bytes(int form, size_t n) {
    return n * (size_t)echo_form_code_bits(form) / 8;
}

/* 1 when a row knows `form`. */
ECHO_HD int echo_form_known(int form) {
    return echo_form_code_bits(form) > 0;
}

ECHO_HD uint16_t echo_rec_encode_group(int form, const float *y, int G, uint8_t *codes, uint8_t *rec, float *r, int n) {
    switch (form) {
#define ECHO_X(id, name, bits, rb, enc, dec, avx2, avx512)                                                             \
    case id: return enc(y, G, codes, rec, r, n);
        ECHO_ALL_FORMS(ECHO_X)
#undef ECHO_X
    default:
        /* no code bytes to clear (an unknown form has none); its scale is poison */
        (void)codes, (void)rec;
        for (int i = 0; r && i < n; i++)
            r[i] = 0.0f;
        return ECHO_SCALE_POISON;
    }
}

ECHO_HD uint16_t echo_rec_decode_group(int form, const uint8_t *codes, const uint8_t *rec, int G, float *v) {
    switch (form) {
#define ECHO_X(id, name, bits, rb, enc, dec, avx2, avx512)                                                             \
    case id: return dec(codes, rec, G, v);
        ECHO_ALL_FORMS(ECHO_X)
#undef ECHO_X
    default:
        (void)codes, (void)rec;
        for (int i = 0; i < G; i++)
            v[i] = echo_bf16_to_f32(ECHO_SCALE_POISON);
        return ECHO_SCALE_POISON;
    }
}

#endif
