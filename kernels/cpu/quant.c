/*
 * cpu: the block-quantized weight types, element by element (the portable
 * path and the reference the vector loaders in matmul.c must equal).
 *
 * Each value is computed with the float operations, in the order, that
 * ggml's dequantize_row_* uses (and weights/quant.c, tested against the
 * gguf package): Q8_0, Q4_0 and Q5_0 d*q, Q4_1 and Q5_1 d*q + m (two
 * roundings), Q4_K and Q5_K (d*sc)*q - dmin*m, Q6_K (d*sc)*q. ISO C mode does not contract a*b + c
 * into an fma, so a weight dequantized here is the fp32 value the model
 * used to hold for it, bit for bit.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static float ldh(const uint8_t *p) { return kern_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

void cpu_k_scale_min(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One block (kern_dtype_block(dt) elements) at b into y. */
static void deq_block(kern_dtype dt, const uint8_t *b, float *y) {
    switch (dt) {
    case KERN_Q8_0: {
        float d = ldh(b);
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
        break;
    }
    case KERN_Q4_0: {
        float d = ldh(b);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[2 + j] & 0x0f) - 8) * d;
            y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
        }
        break;
    }
    case KERN_Q4_1: {
        float d = ldh(b), m = ldh(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[4 + j] & 0x0f) * d + m;
            y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
        break;
    }
    case KERN_Q4_K:
    case KERN_Q5_K: { /* Q5_K: the fifth bit of element l of sub-block j is bit j of qh[l] */
        int q5 = dt == KERN_Q5_K;
        float d = ldh(b), dmin = ldh(b + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            cpu_k_scale_min(b + 4, j, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            const uint8_t *q = b + (q5 ? 48 : 16) + 32 * (j / 2);
            int sh = 4 * (j & 1);
            for (int l = 0; l < 32; l++)
                y[32 * j + l] = d1 * (float)(((q[l] >> sh) & 0x0f) | (q5 ? ((b[16 + l] >> j) & 1) << 4 : 0)) - m1;
        }
        break;
    }
    case KERN_Q5_0:
    case KERN_Q5_1: {
        int q51 = dt == KERN_Q5_1;
        float d = ldh(b), m = q51 ? ldh(b + 2) : 0;
        const uint8_t *qh = b + (q51 ? 4 : 2), *qs = qh + 4;
        for (int j = 0; j < 32; j++) {
            int v = ((j < 16 ? qs[j] : qs[j - 16] >> 4) & 0x0f) | ((qh[j / 8] >> (j % 8)) & 1) << 4;
            y[j] = q51 ? (float)v * d + m : (float)(v - 16) * d;
        }
        break;
    }
    case KERN_Q6_K: {
        float d = ldh(b + 208);
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int l = 0; l < 32; l++) {
                    int lo = (b[64 * h + l + 32 * (s & 1)] >> (4 * (s >> 1))) & 0x0f;
                    int hi = (b[128 + 32 * h + l] >> (2 * s)) & 3;
                    float ds = d * (float)(int8_t)b[192 + 8 * h + 2 * s + l / 16];
                    y[128 * h + 32 * s + l] = ds * (float)((lo | (hi << 4)) - 32);
                }
        break;
    }
    default: break;
    }
}

void cpu_dequant(kern_dtype dt, const void *src, int64_t first, int64_t n, float *dst) {
    const uint8_t *s = src;
    dt = kern_dtype_plain(dt); /* an 8-bit-activation dtype holds the plain blocks */
    switch (dt) {
    case KERN_F32: memcpy(dst, s + 4 * first, (size_t)n * 4); return;
    case KERN_BF16:
    case KERN_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * (first + i), 2);
            dst[i] = dt == KERN_BF16 ? kern_bf16_to_f32(h) : kern_f16_to_f32(h);
        }
        return;
    default: break;
    }
    int bl = kern_dtype_block(dt);
    size_t bb = kern_dtype_block_bytes(dt);
    float tmp[256];
    for (int64_t i = 0; i < n;) {
        int64_t e = first + i, blk = e / bl, off = e % bl, take = bl - off < n - i ? bl - off : n - i;
        deq_block(dt, s + (size_t)blk * bb, tmp);
        memcpy(dst + i, tmp + off, (size_t)take * sizeof *dst);
        i += take;
    }
}

/* fp32 -> fp16 bits, round to nearest even (ggml stores Q8_0 scales so). */
/* safetensors does not promise aligned tensor data (HF pads headers to 8
 * bytes, other writers need not), so weights are read through memcpy
 * (cpu_dequant); gcc turns it into plain (unaligned-safe) loads. */
void cpu_load_plain_rows(float *dst, const kern_weight *w, int64_t r0, int64_t nrows) {
    int64_t cols = w->cols, ld = w->ld ? w->ld : cols;
    for (int64_t r = 0; r < nrows; r++)
        cpu_dequant(w->dtype, (const char *)w->data + kern_dtype_bytes(w->dtype, (r0 + r) * ld), 0, cols,
                    dst + r * cols);
}

static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {                                  /* below 2^-14: subnormal half */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f)); /* units of 2^-24, RNE */
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1); /* round the 13 dropped bits to even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x / d) (half away
 * from zero), d stored as fp16. */
void cpu_quantize_q8_0(const float *x, int64_t n, uint8_t *dst) {
    for (int64_t b = 0; b < n / 32; b++, x += 32, dst += 34) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = f32_to_f16(d);
        dst[0] = (uint8_t)(h & 0xff);
        dst[1] = (uint8_t)(h >> 8);
        for (int j = 0; j < 32; j++) dst[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}
