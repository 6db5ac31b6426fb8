/*
 * Dequantization of the dtypes weights/ hands out: F32, F16, BF16 and the
 * ggml block formats. See weights/weights.h for the contract and
 * docs/gguf.md for the block layouts.
 *
 * Numerics: every value is computed with the same float32 operations in the
 * same order as ggml's dequantize_row_* (and the gguf Python package's
 * quants.py, which the tests compare against), so results are bit-identical:
 *   Q8_0, Q4_0, Q5_0:  d * q
 *   Q4_1, Q5_1:        d * q + m            (two roundings)
 *   Q4_K, Q5_K:        (d * sc) * q - (dmin * m)
 *   Q6_K:              (d * sc) * q
 * That needs `a * b + c` not to be contracted into an fma: gcc does not
 * contract in ISO C mode (-std=c11, the build's), and clang is told below.
 */
#include <stdio.h>
#include <string.h>

#include "weights/internal.h"
#include "weights/weights.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define QK 32   /* elements per block of the 32-element formats */
#define QK_K 256 /* elements per K-quant super-block */

static const struct {
    weights_dtype dt;
    int64_t block;
    size_t bytes;
} TRAITS[] = {
    {WEIGHTS_F32, 1, 4},       {WEIGHTS_F16, 1, 2},       {WEIGHTS_BF16, 1, 2},      {WEIGHTS_F64, 1, 8},
    {WEIGHTS_I64, 1, 8},       {WEIGHTS_I32, 1, 4},       {WEIGHTS_I16, 1, 2},       {WEIGHTS_I8, 1, 1},
    {WEIGHTS_U8, 1, 1},        {WEIGHTS_BOOL, 1, 1},      {WEIGHTS_F8_E4M3, 1, 1},   {WEIGHTS_F8_E5M2, 1, 1},
    {WEIGHTS_U16, 1, 2},       {WEIGHTS_U32, 1, 4},       {WEIGHTS_U64, 1, 8},
    /* d (fp16) + 32 x int8 */
    {WEIGHTS_Q8_0, QK, 34},
    /* d + 16 bytes of nibbles */
    {WEIGHTS_Q4_0, QK, 18},
    /* d, m + nibbles */
    {WEIGHTS_Q4_1, QK, 20},
    /* d + 32 high bits + nibbles */
    {WEIGHTS_Q5_0, QK, 22},
    /* d, m + high bits + nibbles */
    {WEIGHTS_Q5_1, QK, 24},
    /* d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles */
    {WEIGHTS_Q4_K, QK_K, 144},
    /* as Q4_K + 32 bytes of high bits */
    {WEIGHTS_Q5_K, QK_K, 176},
    /* 128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8 scales, d */
    {WEIGHTS_Q6_K, QK_K, 210},
};
#define NTRAITS (sizeof TRAITS / sizeof TRAITS[0])

int64_t weights_dtype_block(weights_dtype dt) {
    for (size_t i = 0; i < NTRAITS; i++)
        if (TRAITS[i].dt == dt) return TRAITS[i].block;
    return 0;
}

size_t weights_dtype_block_bytes(weights_dtype dt) {
    for (size_t i = 0; i < NTRAITS; i++)
        if (TRAITS[i].dt == dt) return TRAITS[i].bytes;
    return 0;
}

/* ---------------------------------------------------------- scalar loads */

/* Little-endian loads through bytes: data in the mmap has no alignment
 * promise inside a block (a Q4_1 block is 20 bytes). */
static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE half to float, exact for every input (subnormals, inf, NaN payload). */
static float f16_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: man * 2^-24, exact in float */
        float v = (float)man * bits_f32(0x33800000u); /* 2^-24 */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static float ldf16(const uint8_t *p) { return f16_f32(ld16(p)); }

/* ------------------------------------------------------------ the blocks */

/* Each dequantizes `nb` consecutive blocks from `x` into `y`. */

static void deq_f32(const uint8_t *x, size_t n, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = bits_f32(ld32(x + 4 * i));
}

static void deq_f16(const uint8_t *x, size_t n, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = ldf16(x + 2 * i);
}

static void deq_bf16(const uint8_t *x, size_t n, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = bits_f32((uint32_t)ld16(x + 2 * i) << 16);
}

static void deq_q8_0(const uint8_t *x, size_t nb, float *y) {
    for (size_t b = 0; b < nb; b++, x += 34, y += QK) {
        float d = ldf16(x);
        for (int j = 0; j < QK; j++) y[j] = (float)(int8_t)x[2 + j] * d;
    }
}

static void deq_q4_0(const uint8_t *x, size_t nb, float *y) {
    for (size_t b = 0; b < nb; b++, x += 18, y += QK) {
        float d = ldf16(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)((qs[j] & 0x0f) - 8) * d;
            y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const uint8_t *x, size_t nb, float *y) {
    for (size_t b = 0; b < nb; b++, x += 20, y += QK) {
        float d = ldf16(x), m = ldf16(x + 2);
        const uint8_t *qs = x + 4;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)(qs[j] & 0x0f) * d + m;
            y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

static void deq_q5_0(const uint8_t *x, size_t nb, float *y) {
    for (size_t b = 0; b < nb; b++, x += 22, y += QK) {
        float d = ldf16(x);
        uint32_t qh = ld32(x + 2); /* bit j: the fifth bit of element j */
        const uint8_t *qs = x + 6;
        for (int j = 0; j < QK / 2; j++) {
            int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)(lo - 16) * d;
            y[j + QK / 2] = (float)(hi - 16) * d;
        }
    }
}

static void deq_q5_1(const uint8_t *x, size_t nb, float *y) {
    for (size_t b = 0; b < nb; b++, x += 24, y += QK) {
        float d = ldf16(x), m = ldf16(x + 2);
        uint32_t qh = ld32(x + 4);
        const uint8_t *qs = x + 8;
        for (int j = 0; j < QK / 2; j++) {
            int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)lo * d + m;
            y[j + QK / 2] = (float)hi * d + m;
        }
    }
}

/* Q4_K/Q5_K: eight 6-bit scales and eight 6-bit mins packed in 12 bytes:
 * sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scales) and 4..7 (mins);
 * sub-blocks 4..7 take 4 low bits from bytes 8..11 (scale: low nibble, min:
 * high nibble) and 2 high bits from the top of bytes 0..3 / 4..7. */
static void k_scale_min(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void deq_q4_k(const uint8_t *x, size_t nb, float *y) {
    for (size_t b = 0; b < nb; b++, x += 144) {
        float d = ldf16(x), dmin = ldf16(x + 2);
        const uint8_t *scales = x + 4, *qs = x + 16;
        /* 32 bytes of nibbles serve two sub-blocks: low nibbles, then high. */
        for (int j = 0; j < 8; j++, y += 32) {
            int sc, m;
            k_scale_min(scales, j, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            const uint8_t *q = qs + 32 * (j / 2);
            int shift = 4 * (j & 1);
            for (int l = 0; l < 32; l++) y[l] = d1 * (float)((q[l] >> shift) & 0x0f) - m1;
        }
    }
}

static void deq_q5_k(const uint8_t *x, size_t nb, float *y) {
    for (size_t b = 0; b < nb; b++, x += 176) {
        float d = ldf16(x), dmin = ldf16(x + 2);
        const uint8_t *scales = x + 4, *qh = x + 16, *qs = x + 48;
        for (int j = 0; j < 8; j++, y += 32) {
            int sc, m;
            k_scale_min(scales, j, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            const uint8_t *q = qs + 32 * (j / 2);
            int shift = 4 * (j & 1);
            /* bit j of qh[l] is the fifth bit of element l of sub-block j */
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4);
                y[l] = d1 * (float)v - m1;
            }
        }
    }
}

static void deq_q6_k(const uint8_t *x, size_t nb, float *y) {
    for (size_t b = 0; b < nb; b++, x += 210) {
        const uint8_t *ql = x, *qh = x + 128;
        const int8_t *sc = (const int8_t *)(x + 192);
        float d = ldf16(x + 208);
        /* Two halves of 128 elements; in each, element 32*s + l takes its
         * low nibble from ql[l + 32*(s&1)] (s<2: low, s>=2: high nibble) and
         * its two high bits from qh[l] bits 2s..2s+1; one scale per 16. */
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int s = 0; s < 4; s++) {
                for (int l = 0; l < 32; l++) {
                    int lo = (ql[l + 32 * (s & 1)] >> (4 * (s >> 1))) & 0x0f;
                    int hi = (qh[l] >> (2 * s)) & 3;
                    int q = (lo | (hi << 4)) - 32;
                    float ds = d * (float)sc[2 * s + l / 16];
                    y[32 * s + l] = ds * (float)q;
                }
            }
        }
    }
}

/* Dequantize `n` elements (whole blocks, checked by callers). */
static int deq(weights_dtype dt, const uint8_t *x, size_t n, float *y) {
    switch (dt) {
    case WEIGHTS_F32: deq_f32(x, n, y); return 0;
    case WEIGHTS_F16: deq_f16(x, n, y); return 0;
    case WEIGHTS_BF16: deq_bf16(x, n, y); return 0;
    case WEIGHTS_Q8_0: deq_q8_0(x, n / QK, y); return 0;
    case WEIGHTS_Q4_0: deq_q4_0(x, n / QK, y); return 0;
    case WEIGHTS_Q4_1: deq_q4_1(x, n / QK, y); return 0;
    case WEIGHTS_Q5_0: deq_q5_0(x, n / QK, y); return 0;
    case WEIGHTS_Q5_1: deq_q5_1(x, n / QK, y); return 0;
    case WEIGHTS_Q4_K: deq_q4_k(x, n / QK_K, y); return 0;
    case WEIGHTS_Q5_K: deq_q5_k(x, n / QK_K, y); return 0;
    case WEIGHTS_Q6_K: deq_q6_k(x, n / QK_K, y); return 0;
    default: return -1;
    }
}

static int deq_supported(weights_dtype dt) {
    return dt == WEIGHTS_F32 || dt == WEIGHTS_F16 || dt == WEIGHTS_BF16 || weights_dtype_is_quantized(dt);
}

int weights_dequantize(weights_dtype dt, const void *src, size_t n, float *dst, char *err, size_t errlen) {
    if (!deq_supported(dt)) {
        weights_priv_err(err, errlen, "weights_dequantize", NULL, "dtype %s cannot be dequantized",
                         weights_dtype_name(dt));
        return -1;
    }
    size_t blk = (size_t)weights_dtype_block(dt);
    if (n % blk != 0) {
        weights_priv_err(err, errlen, "weights_dequantize", NULL, "%zu elements of %s: not a multiple of %zu", n,
                         weights_dtype_name(dt), blk);
        return -1;
    }
    if (n && (!src || !dst)) {
        weights_priv_err(err, errlen, "weights_dequantize", NULL, "invalid arguments");
        return -1;
    }
    return deq(dt, src, n, dst);
}

int weights_read_rows_f32(const weights_tensor *t, int64_t r0, int64_t nr, float *out, char *err,
                          size_t errlen) {
    if (!t || !t->name || t->ndim < 0 || t->ndim > WEIGHTS_MAX_DIMS) {
        weights_priv_err(err, errlen, "(weights)", NULL, "invalid arguments to weights_read_rows_f32");
        return -1;
    }
    const char *file = t->file ? t->file : "(weights)";
    if (!deq_supported(t->dtype)) {
        weights_priv_err(err, errlen, file, t->name, "dtype %s cannot be read as fp32",
                         weights_dtype_name(t->dtype));
        return -1;
    }
    /* rows = product of all dims but the last; checked against nbytes so a
     * hand-made tensor cannot send the reads outside its data. */
    uint64_t row_len = t->ndim ? (uint64_t)t->shape[t->ndim - 1] : 1, rows = 1;
    for (int i = 0; i + 1 < t->ndim; i++) {
        uint64_t d = (uint64_t)t->shape[i];
        if (t->shape[i] < 0 || (d && rows > UINT64_MAX / d)) goto bad_shape;
        rows *= d;
    }
    if (t->ndim && t->shape[t->ndim - 1] < 0) goto bad_shape;
    uint64_t blk = (uint64_t)weights_dtype_block(t->dtype), bb = weights_dtype_block_bytes(t->dtype);
    if (row_len % blk) {
        weights_priv_err(err, errlen, file, t->name, "row length %llu is not a multiple of the %s block (%llu)",
                         (unsigned long long)row_len, weights_dtype_name(t->dtype), (unsigned long long)blk);
        return -1;
    }
    uint64_t row_bytes = row_len / blk * bb;
    if (row_len > UINT64_MAX / bb || (row_bytes && rows > SIZE_MAX / row_bytes) || rows * row_bytes != t->nbytes)
        goto bad_shape;
    if (r0 < 0 || nr < 0 || (uint64_t)r0 > rows || (uint64_t)nr > rows - (uint64_t)r0) {
        weights_priv_err(err, errlen, file, t->name, "rows [%lld, %lld + %lld) outside the tensor's %llu rows",
                         (long long)r0, (long long)r0, (long long)nr, (unsigned long long)rows);
        return -1;
    }
    if (nr == 0) return 0;
    if (!out || !t->data) {
        weights_priv_err(err, errlen, file, t->name, "invalid arguments to weights_read_rows_f32");
        return -1;
    }
    const uint8_t *src = (const uint8_t *)t->data + (size_t)((uint64_t)r0 * row_bytes);
    return deq(t->dtype, src, (size_t)((uint64_t)nr * row_len), out);

bad_shape:
    weights_priv_err(err, errlen, file, t->name, "shape does not match its %zu bytes of %s", t->nbytes,
                     weights_dtype_name(t->dtype));
    return -1;
}
