/*
 * kernels/kv.h — the KV cache's storage types (kern_kv_dtype, kernels.h):
 * the scalar reference of how one (cache row, kv head) is written by
 * kern_ops.kv_store and read back by kern_ops.attention. Every backend
 * writes exactly kern_kv_store_ref's bytes and reads exactly
 * kern_kv_load_ref's values; tests hold both backends to it bit for bit.
 * Host and device code share it (KERN_HD), so a CUDA kernel may call these
 * functions as they are. The layouts and the rotation are specified in
 * kernels.h (above kv_store); docs/kv-cache.md says why.
 *
 * Floating point here must be IEEE: correctly rounded division, no
 * fast-math, no fma contraction (each expression below has at most one
 * rounding per operation as written).
 */
#ifndef ECHO_KERNELS_KV_H
#define ECHO_KERNELS_KV_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* The largest head_dim a cache type takes (the reference's stack buffer). */
#define KERN_KV_MAX_HD 512
#define KERN_KV_Q8_BLOCK 32

/* Bytes of one kv head of one cache row: F32 4*hd, BF16/F16 2*hd, Q8_0
 * hd int8 values then hd/32 fp16 scales (34 bytes per 32 values, as
 * ggml's block_q8_0). 0 for KERN_KV_NATIVE or an unknown type. */
static inline KERN_HD size_t kern_kv_head_bytes(kern_kv_dtype dt, int hd) {
    switch (dt) {
    case KERN_KV_F32: return (size_t)hd * 4;
    case KERN_KV_BF16:
    case KERN_KV_F16: return (size_t)hd * 2;
    case KERN_KV_Q8_0: return (size_t)hd + (size_t)(hd / KERN_KV_Q8_BLOCK) * 2;
    default: return 0;
    }
}
/* Bytes of one cache row (hkv heads end to end). */
static inline KERN_HD size_t kern_kv_row_bytes(kern_kv_dtype dt, int hkv, int hd) {
    return (size_t)hkv * kern_kv_head_bytes(dt, hd);
}

/* NULL when a cache of type dt can hold heads of hd values, else why not. */
static inline const char *kern_kv_invalid(kern_kv_dtype dt, int hd) {
    if (dt < KERN_KV_F32 || dt > KERN_KV_Q8_0) return "unknown KV cache dtype";
    if (hd <= 0 || hd > KERN_KV_MAX_HD) return "head_dim out of range [1, 512]";
    if (dt == KERN_KV_Q8_0 && (hd < KERN_KV_Q8_BLOCK || (hd & (hd - 1))))
        return "q8_0 needs a head_dim that is a power of two >= 32 (its Walsh-Hadamard rotation and 32-value blocks)";
    return NULL;
}

static inline const char *kern_kv_dtype_name(kern_kv_dtype dt) {
    switch (dt) {
    case KERN_KV_NATIVE: return "native";
    case KERN_KV_F32: return "fp32";
    case KERN_KV_BF16: return "bf16";
    case KERN_KV_F16: return "fp16";
    case KERN_KV_Q8_0: return "q8_0";
    }
    return "?";
}

/* fp32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN. */
static inline KERN_HD uint16_t kern_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* fp32 -> IEEE binary16 bits, round to nearest even, subnormals kept,
 * overflow to inf, NaN stays a NaN (ggml and F16C's conversion). */
static inline KERN_HD uint16_t kern_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {                                  /* below 2^-14: a subnormal half */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)rintf(a * 16777216.0f)); /* units of 2^-24, exact, then RNE */
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1); /* round the 13 dropped bits to even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* IEEE binary16 bits -> fp32 (exact; kern_f16_to_f32's values). */
static inline KERN_HD float kern_kv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    float f;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        f = (float)man * 5.9604644775390625e-8f; /* man * 2^-24, exact */
        memcpy(&u, &f, 4);
        u |= sign;
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}

/* The rotation's normalisation: 1/sqrt(hd) in double, rounded once to
 * fp32 (0.125f for hd 64, 0.088388346f for hd 128). */
static inline KERN_HD float kern_kv_rotate_scale(int hd) { return (float)(1.0 / sqrt((double)hd)); }

/* In place, the orthonormal Walsh-Hadamard transform of one head's hd
 * values (hd a power of two), in exactly this order: butterflies of
 * stride len = 1, 2, 4, ..., hd/2, each pair (a, b) = (x[i], x[i+len]),
 * i % (2*len) < len, becoming (a + b, a - b) in fp32; then every value
 * multiplied by kern_kv_rotate_scale(hd) (one rounding). The matrix is
 * Sylvester's H[i][j] = (-1)^popcount(i & j) / sqrt(hd): symmetric and
 * orthonormal, so (Hq)·(Hk) = q·k and applying it twice is the identity up
 * to rounding. */
static inline KERN_HD void kern_kv_rotate(float *x, int hd) {
    for (int len = 1; len < hd; len *= 2)
        for (int i = 0; i < hd; i += 2 * len)
            for (int j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    const float s = kern_kv_rotate_scale(hd);
    for (int j = 0; j < hd; j++) x[j] *= s;
}

/* ggml's quantize_row_q8_0_ref on one head (hd a multiple of 32), into
 * the cache's head layout: for block b, amax = max |x| (fmaxf of fabsf),
 * d = amax / 127, id = d != 0 ? 1 / d : 0 (fp32 divisions),
 * q[j] = (int8)roundf(x[j] * id) (half away from zero); the quants go to
 * dst[32b .. 32b+31], kern_f32_to_f16(d) little-endian to dst[hd + 2b]. */
static inline KERN_HD void kern_kv_quantize_q8_0(uint8_t *dst, const float *x, int hd) {
    for (int b = 0; b < hd / KERN_KV_Q8_BLOCK; b++) {
        const float *xb = x + b * KERN_KV_Q8_BLOCK;
        float amax = 0.0f;
        for (int j = 0; j < KERN_KV_Q8_BLOCK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < KERN_KV_Q8_BLOCK; j++)
            dst[b * KERN_KV_Q8_BLOCK + j] = (uint8_t)(int8_t)roundf(xb[j] * id);
        uint16_t h = kern_f32_to_f16(d);
        dst[hd + 2 * b] = (uint8_t)(h & 0xff);
        dst[hd + 2 * b + 1] = (uint8_t)(h >> 8);
    }
}

/* Write one kv head (x: hd fp32 values; a bf16 backend widens its
 * activations first, exactly) to its kern_kv_head_bytes(dt, hd) bytes at
 * dst. key: 1 for the key cache (q8_0 keys are rotated by kern_kv_rotate
 * before quantization), 0 for values. dt is never KERN_KV_NATIVE here. */
static inline KERN_HD void kern_kv_store_ref(kern_kv_dtype dt, int key, const float *x, int hd, void *dst) {
    uint8_t *d = (uint8_t *)dst;
    switch (dt) {
    case KERN_KV_F32: memcpy(d, x, (size_t)hd * 4); return;
    case KERN_KV_BF16:
    case KERN_KV_F16:
        for (int j = 0; j < hd; j++) {
            uint16_t h = dt == KERN_KV_BF16 ? kern_f32_to_bf16(x[j]) : kern_f32_to_f16(x[j]);
            d[2 * j] = (uint8_t)(h & 0xff);
            d[2 * j + 1] = (uint8_t)(h >> 8);
        }
        return;
    case KERN_KV_Q8_0:
        if (key) {
            float r[KERN_KV_MAX_HD];
            memcpy(r, x, (size_t)hd * 4);
            kern_kv_rotate(r, hd);
            kern_kv_quantize_q8_0(d, r, hd);
        } else {
            kern_kv_quantize_q8_0(d, x, hd);
        }
        return;
    default: return;
    }
}

/* Read one stored kv head back as the hd fp32 values attention uses:
 * F32 as is, BF16/F16 widened exactly, Q8_0 value j = fp32(scale of its
 * block) * (float)q[j] (one rounding). Q8_0 keys come back rotated (the
 * attention rotates the query instead of un-rotating keys). */
static inline KERN_HD void kern_kv_load_ref(kern_kv_dtype dt, const void *src, int hd, float *x) {
    const uint8_t *s = (const uint8_t *)src;
    switch (dt) {
    case KERN_KV_F32: memcpy(x, s, (size_t)hd * 4); return;
    case KERN_KV_BF16:
    case KERN_KV_F16:
        for (int j = 0; j < hd; j++) {
            uint16_t h = (uint16_t)(s[2 * j] | s[2 * j + 1] << 8);
            if (dt == KERN_KV_F16) {
                x[j] = kern_kv_f16_to_f32(h);
            } else {
                uint32_t u = (uint32_t)h << 16;
                memcpy(&x[j], &u, 4);
            }
        }
        return;
    case KERN_KV_Q8_0:
        for (int b = 0; b < hd / KERN_KV_Q8_BLOCK; b++) {
            float d = kern_kv_f16_to_f32((uint16_t)(s[hd + 2 * b] | s[hd + 2 * b + 1] << 8));
            for (int j = b * KERN_KV_Q8_BLOCK; j < (b + 1) * KERN_KV_Q8_BLOCK; j++) x[j] = d * (float)(int8_t)s[j];
        }
        return;
    default: return;
    }
}

#endif
