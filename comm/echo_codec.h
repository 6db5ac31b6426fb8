/*
 * comm/echo_codec.h — private to comm/: the arithmetic of the Echo group
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

#endif
