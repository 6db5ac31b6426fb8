/*
 * comm/codec/codec_scalar.c — the host codec's reference loops
 * (echo_cpu_codec_scalar, comm/codec/codec_cpu.h): portable C over
 * comm/codec/echo_codec.h's arithmetic, which the CUDA kernels
 * (echo_cuda.cu) and the SIMD tables (codec_avx2.c, codec_avx512.c) match
 * bit for bit. The SIMD files call these loops for what they leave (a
 * partial last group, a group size they do not specialise); nothing here
 * calls them or codec.c, so the files depend one way.
 *
 * These are the hot loops of the local transport on CPUs without AVX2 and
 * must vectorize: every group loop is written over a compile-time G (the
 * switch at the bottom of each entry point instantiates 16..256),
 * straight-line, with the per-element work in small passes over a G-value
 * stack buffer, so gcc vectorizes them even at -O2 with its "very cheap"
 * cost model (check with -fopt-info-vec; docs/echo.md records the report).
 * Absmax is an integer max over |x| bits: it vectorizes without -ffast-math
 * and catches inf/nan in the same pass (their bits are the largest).
 */
#include <string.h>

#include "comm/codec/codec_cpu.h"
#include "comm/codec/echo_codec.h"
#include "comm/echo_internal.h"

#define ECHO_INLINE static inline __attribute__((always_inline))


/* y[0..G) = x (+ res), zero-padded past n; returns the largest |y| as bits
 * (fused here to save a pass over y). */
ECHO_INLINE uint32_t load_group(float *restrict y, const void *x, echo_dtype dt, const float *restrict res, size_t n,
                                int G) {
    int32_t m = 0; /* |y| bits < 2^31: a signed max (cheaper on SSE2) */
    if (n == (size_t)G) {
        if (dt == ECHO_F32) {
            const float *xf = x;
            if (res)
                for (int i = 0; i < G; i++) {
                    y[i] = xf[i] + res[i];
                    int32_t a = (int32_t)echo_abs_bits(y[i]);
                    m = a > m ? a : m;
                }
            else
                for (int i = 0; i < G; i++) {
                    y[i] = xf[i];
                    int32_t a = (int32_t)echo_abs_bits(y[i]);
                    m = a > m ? a : m;
                }
        } else {
            const uint16_t *xb = x;
            if (res)
                for (int i = 0; i < G; i++) {
                    y[i] = echo_bf16_to_f32(xb[i]) + res[i];
                    int32_t a = (int32_t)echo_abs_bits(y[i]);
                    m = a > m ? a : m;
                }
            else
                for (int i = 0; i < G; i++) {
                    y[i] = echo_bf16_to_f32(xb[i]);
                    int32_t a = (int32_t)echo_abs_bits(y[i]);
                    m = a > m ? a : m;
                }
        }
        return (uint32_t)m;
    }
    for (size_t i = 0; i < n; i++) {
        float v = dt == ECHO_F32 ? ((const float *)x)[i] : echo_bf16_to_f32(((const uint16_t *)x)[i]);
        y[i] = res ? v + res[i] : v;
        int32_t a = (int32_t)echo_abs_bits(y[i]);
        m = a > m ? a : m;
    }
    for (size_t i = n; i < (size_t)G; i++)
        y[i] = 0.0f;
    return (uint32_t)m;
}

/* Code one group of G values (padding included) whose largest |y| has bits
 * m; when res != NULL write the first n residuals y - output, output being
 * q*s as rounded by rmode. */
ECHO_INLINE uint16_t encode_group(const float *restrict y, uint32_t m, int G, uint8_t *restrict codes,
                                  float *restrict res, echo_resid rmode, size_t n) {
    uint16_t sb = echo_scale_from_absbits(m);
    if (sb == 0 || echo_scale_is_poison(sb)) {
        /* All zero: codes 0 and the residual is y itself (+-0). Poisoned: the
         * call fails and the pass is aborted; keep the residual finite. */
        memset(codes, 0, (size_t)G / 2);
        if (res)
            for (size_t i = 0; i < n; i++)
                res[i] = sb == 0 ? y[i] : 0.0f;
        return sb;
    }
    float s = echo_bf16_to_f32(sb);
    float q[ECHO_MAX_GROUP];
    for (int i = 0; i < G; i++)
        q[i] = echo_code(y[i], s);
    for (int j = 0; j < G / 2; j++)
        codes[j] = echo_pack2((int)q[2 * j], (int)q[2 * j + 1]);
    if (!res) return sb;
    if (n == (size_t)G) {
        if (rmode == ECHO_RESID_F32)
            for (int i = 0; i < G; i++)
                res[i] = y[i] - q[i] * s;
        else
            for (int i = 0; i < G; i++)
                res[i] = y[i] - echo_bf16_to_f32(echo_f32_to_bf16(q[i] * s));
    } else {
        for (size_t i = 0; i < n; i++) {
            float o = q[i] * s;
            res[i] = y[i] - (rmode == ECHO_RESID_F32 ? o : echo_bf16_to_f32(echo_f32_to_bf16(o)));
        }
    }
    return sb;
}

/* v[0..G) = decode of one group. */
ECHO_INLINE void decode_group(const uint8_t *restrict codes, uint16_t sb, int G, float *restrict v) {
    float s = echo_bf16_to_f32(sb);
    for (int j = 0; j < G / 2; j++) {
        v[2 * j] = (float)echo_nib_lo(codes[j]) * s;
        v[2 * j + 1] = (float)echo_nib_hi(codes[j]) * s;
    }
}

ECHO_INLINE size_t encode_impl(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t n,
                               int G, uint8_t *codes, uint16_t *scales, size_t *bad) {
    size_t ng = (n + (size_t)G - 1) / (size_t)G, npoison = 0, esz = echo_dtype_size(xdt);
    float y[ECHO_MAX_GROUP];
    *bad = ECHO_NO_INDEX;
    for (size_t g = 0; g < ng; g++) {
        size_t off = g * (size_t)G, m = n - off < (size_t)G ? n - off : (size_t)G;
        uint32_t amax = load_group(y, (const char *)x + off * esz, xdt, res && res_valid ? res + off : NULL, m, G);
        uint16_t sb = encode_group(y, amax, G, codes + off / 2, res ? res + off : NULL, rmode, m);
        scales[g] = sb;
        if (echo_scale_is_poison(sb)) {
            if (!npoison++) {
                /* The first offending element, for the message (slow path). */
                size_t k = 0;
                while (k + 1 < m && echo_abs_bits(y[k]) < ECHO_LIMIT_BITS)
                    k++;
                *bad = off + k;
            }
        }
    }
    return npoison;
}

ECHO_INLINE void decode_impl(const uint8_t *codes, const uint16_t *scales, size_t n, int G, float *out,
                             int accumulate) {
    size_t ng = (n + (size_t)G - 1) / (size_t)G;
    float v[ECHO_MAX_GROUP];
    for (size_t g = 0; g < ng; g++) {
        size_t off = g * (size_t)G;
        decode_group(codes + off / 2, scales[g], G, v);
        float *o = out + off;
        if (n - off >= (size_t)G) {
            if (accumulate)
                for (int i = 0; i < G; i++)
                    o[i] += v[i];
            else
                for (int i = 0; i < G; i++)
                    o[i] = v[i];
        } else {
            for (size_t i = 0; i < n - off; i++)
                o[i] = accumulate ? o[i] + v[i] : v[i];
        }
    }
}

ECHO_INLINE size_t decode_store_impl(const uint8_t *codes, const uint16_t *scales, size_t n, int G, void *out,
                                     echo_dtype dt, size_t *bad) {
    size_t ng = (n + (size_t)G - 1) / (size_t)G, npoison = 0;
    float v[ECHO_MAX_GROUP];
    *bad = ECHO_NO_INDEX;
    for (size_t g = 0; g < ng; g++) {
        size_t off = g * (size_t)G, m = n - off < (size_t)G ? n - off : (size_t)G;
        if (echo_scale_is_poison(scales[g]) && !npoison++) *bad = off;
        decode_group(codes + off / 2, scales[g], G, v);
        if (dt == ECHO_F32) {
            float *o = (float *)out + off;
            if (m == (size_t)G)
                for (int i = 0; i < G; i++)
                    o[i] = v[i];
            else
                for (size_t i = 0; i < m; i++)
                    o[i] = v[i];
        } else {
            uint16_t *o = (uint16_t *)out + off;
            if (m == (size_t)G)
                for (int i = 0; i < G; i++)
                    o[i] = echo_f32_to_bf16(v[i]);
            else
                for (size_t i = 0; i < m; i++)
                    o[i] = echo_f32_to_bf16(v[i]);
        }
    }
    return npoison;
}

/* Instantiate an _impl for every legal G, so the group loops see a constant. */
#define ECHO_FOR_EACH_G(CALL)                                                                                          \
    switch (group) {                                                                                                   \
    case 16: CALL(16);                                                                                                 \
    case 32: CALL(32);                                                                                                 \
    case 64: CALL(64);                                                                                                 \
    case 128: CALL(128);                                                                                               \
    case 256: CALL(256);                                                                                               \
    default: break;                                                                                                    \
    }

static size_t scalar_encode(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t n,
                            int group, uint8_t *codes, uint16_t *scales, size_t *bad) {
#define ENC(G) return encode_impl(x, xdt, res, res_valid, rmode, n, G, codes, scales, bad)
    ECHO_FOR_EACH_G(ENC)
#undef ENC
    *bad = 0;
    return 1; /* unreachable: groups are validated at world creation */
}

static void scalar_decode(const uint8_t *codes, const uint16_t *scales, size_t n, int group, float *out,
                          int accumulate) {
#define DEC(G)                                                                                                         \
    decode_impl(codes, scales, n, G, out, accumulate);                                                                 \
    return
    ECHO_FOR_EACH_G(DEC)
#undef DEC
}

static size_t scalar_decode_store(const uint8_t *codes, const uint16_t *scales, size_t n, int group, void *out,
                                  echo_dtype dt, size_t *bad) {
#define DST(G) return decode_store_impl(codes, scales, n, G, out, dt, bad)
    ECHO_FOR_EACH_G(DST)
#undef DST
    *bad = 0;
    return 1;
}

size_t echo_scalar_rec_encode(int form, const float *y, float *res, int res_valid, size_t n, int G, uint8_t *codes,
                              uint8_t *recs, size_t *bad) {
    size_t rb = (size_t)echo_rec_bytes(form, G), npoison = 0;
    float t[ECHO_MAX_GROUP];
    *bad = ECHO_NO_INDEX;
    for (size_t off = 0; off < n; off += (size_t)G) {
        const float *v = y + off;
        if (res && res_valid) {
            for (int i = 0; i < G; i++)
                t[i] = y[off + (size_t)i] + res[off + (size_t)i];
            v = t;
        }
        uint16_t sb =
            echo_rec_encode_group(form, v, G, codes + echo_form_code_bytes(form, off), recs + off / (size_t)G * rb,
                                  res ? res + off : NULL, G);
        if (echo_scale_is_poison(sb) && !npoison++) *bad = off;
    }
    return npoison;
}

void echo_scalar_rec_decode(int form, const uint8_t *codes, const uint8_t *recs, size_t n, int G, float *out,
                              int accumulate) {
    size_t rb = (size_t)echo_rec_bytes(form, G);
    float v[ECHO_MAX_GROUP];
    for (size_t off = 0; off < n; off += (size_t)G) {
        echo_rec_decode_group(form, codes + echo_form_code_bytes(form, off), recs + off / (size_t)G * rb, G, v);
        size_t m = n - off < (size_t)G ? n - off : (size_t)G;
        if (accumulate)
            for (size_t i = 0; i < m; i++)
                out[off + i] += v[i];
        else
            for (size_t i = 0; i < m; i++)
                out[off + i] = v[i];
    }
}


/* The runtime-length loops below work in blocks of ECHO_BLOCK values with a
 * constant inner trip count (and a scalar tail), which gcc vectorizes at -O2
 * where a loop of unknown length would need -O3's epilogues. */
#define ECHO_BLOCK 256

ECHO_INLINE void load_block(const void *x, echo_dtype dt, size_t n, float *restrict out, int accumulate) {
    if (dt == ECHO_F32) {
        const float *restrict xf = x;
        if (accumulate)
            for (size_t i = 0; i < n; i++)
                out[i] += xf[i];
        else
            for (size_t i = 0; i < n; i++)
                out[i] = xf[i];
    } else {
        const uint16_t *restrict xb = x;
        if (accumulate)
            for (size_t i = 0; i < n; i++)
                out[i] += echo_bf16_to_f32(xb[i]);
        else
            for (size_t i = 0; i < n; i++)
                out[i] = echo_bf16_to_f32(xb[i]);
    }
}

void echo_cpu_load(const void *x, echo_dtype dt, size_t n, float *out, int accumulate) {
    size_t esz = echo_dtype_size(dt), b = 0;
    for (; b + ECHO_BLOCK <= n; b += ECHO_BLOCK)
        load_block((const char *)x + b * esz, dt, ECHO_BLOCK, out + b, accumulate);
    load_block((const char *)x + b * esz, dt, n - b, out + b, accumulate);
}

static void scalar_add(const float *in, size_t n, float *out) {
    echo_cpu_load(in, ECHO_F32, n, out, 1);
}


/* ---- rotating codecs (echo_plan.rotate): the int4 loops above run on the
 * rotated values (comm/codec/echo_codec.h, echo_had_fwd), whole groups, padding
 * included; residuals stay in the rotated basis. ---- */

/* The rotation with G a compile-time constant (instantiated through
 * ECHO_FOR_EACH_G), so that the butterflies unroll and vectorize. The same
 * fp32 operations in the same order as echo_had_fwd / echo_had_inv (a
 * product by -1 is the negation, by +-1/G the same product), so the bits
 * are theirs and the cuda kernels'. */
ECHO_INLINE void fwht_g(float *restrict v, int G) {
    for (int h = 1; h < G; h *= 2)
        for (int i = 0; i < G; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

/* ECHO_LANES groups at once, transposed (t[i][l] = value i of group l), so
 * that every butterfly is a vector op over the lanes whatever the stage.
 * Each value sees the same adds in the same order as in fwht_g. */
#define ECHO_LANES 8
typedef float echo_lanes __attribute__((vector_size(ECHO_LANES * sizeof(float)))); /* GCC vector: lane-wise IEEE ops */
ECHO_INLINE void fwht_lanes(echo_lanes *t, int G) {
    for (int h = 1; h < G; h *= 2)
        for (int i = 0; i < G; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                echo_lanes a = t[j], b = t[j + h];
                t[j] = a + b;
                t[j + h] = a - b;
            }
}

/* sg[i] = +-1 (D), si[i] = +-1/G (D / G) */
ECHO_INLINE void had_tables(int G, float *sg, float *si) {
    float inv = 1.0f / (float)G;
    for (int i = 0; i < G; i++) {
        sg[i] = echo_had_neg(i) ? -1.0f : 1.0f;
        si[i] = echo_had_neg(i) ? -inv : inv;
    }
}

/* out[0..np) = the rotation of x[0..n) (dt) zero-padded to np (a multiple
 * of G, >= n), block by block. */
ECHO_INLINE void rot_fwd_impl(const void *x, echo_dtype dt, size_t n, size_t np, int G, float *out) {
    float sg[ECHO_MAX_GROUP], si[ECHO_MAX_GROUP];
    had_tables(G, sg, si);
    size_t off = 0;
    if (dt == ECHO_F32) {
        echo_lanes t[ECHO_MAX_GROUP];
        const size_t blk = (size_t)G * ECHO_LANES;
        for (; off + blk <= n; off += blk) {
            const float *xf = (const float *)x + off;
            for (int l = 0; l < ECHO_LANES; l++)
                for (int i = 0; i < G; i++)
                    t[i][l] = xf[(size_t)l * (size_t)G + (size_t)i] * sg[i];
            fwht_lanes(t, G);
            for (int l = 0; l < ECHO_LANES; l++)
                for (int i = 0; i < G; i++)
                    out[off + (size_t)l * (size_t)G + (size_t)i] = t[i][l];
        }
    }
    for (; off < np; off += (size_t)G) {
        float *restrict v = out + off;
        size_t m = off >= n ? 0 : n - off < (size_t)G ? n - off : (size_t)G;
        if (m == (size_t)G && dt == ECHO_F32) {
            const float *xf = (const float *)x + off;
            for (int i = 0; i < G; i++)
                v[i] = xf[i] * sg[i];
        } else {
            for (size_t i = 0; i < m; i++)
                v[i] =
                    (dt == ECHO_F32 ? ((const float *)x)[off + i] : echo_bf16_to_f32(((const uint16_t *)x)[off + i])) *
                    sg[i];
            for (size_t i = m; i < (size_t)G; i++)
                v[i] = 0.0f * sg[i];
        }
        fwht_g(v, G);
    }
}

/* in[0..pad(n)) = its inverse rotation, in place; out[0..n) (dt) = in
 * rounded to dt when out != NULL; accumulate: out (fp32) += in. */
ECHO_INLINE void rot_inv_impl(float *in, size_t n, int G, void *out, echo_dtype dt, int accumulate) {
    float sg[ECHO_MAX_GROUP], si[ECHO_MAX_GROUP];
    had_tables(G, sg, si);
    size_t off = 0;
    if (dt == ECHO_F32 || !out) {
        echo_lanes t[ECHO_MAX_GROUP];
        const size_t blk = (size_t)G * ECHO_LANES;
        for (; off + blk <= n; off += blk) {
            for (int l = 0; l < ECHO_LANES; l++)
                for (int i = 0; i < G; i++)
                    t[i][l] = in[off + (size_t)l * (size_t)G + (size_t)i];
            fwht_lanes(t, G);
            for (int l = 0; l < ECHO_LANES; l++) {
                float *v = in + off + (size_t)l * (size_t)G;
                for (int i = 0; i < G; i++)
                    v[i] = t[i][l] * si[i];
            }
            if (!out) continue;
            float *o = (float *)out + off;
            if (accumulate)
                for (size_t i = 0; i < blk; i++)
                    o[i] += in[off + i];
            else
                memcpy(o, in + off, blk * sizeof(float));
        }
    }
    for (; off < n; off += (size_t)G) {
        float *restrict v = in + off;
        size_t m = n - off < (size_t)G ? n - off : (size_t)G;
        fwht_g(v, G);
        for (int i = 0; i < G; i++)
            v[i] = v[i] * si[i];
        if (!out) continue;
        if (dt == ECHO_F32) {
            float *o = (float *)out + off;
            for (size_t i = 0; i < m; i++)
                o[i] = accumulate ? o[i] + v[i] : v[i];
        } else {
            uint16_t *o = (uint16_t *)out + off;
            for (size_t i = 0; i < m; i++)
                o[i] = echo_f32_to_bf16(v[i]);
        }
    }
}

static void scalar_rot_fwd(const void *x, echo_dtype dt, size_t n, size_t np, int group, float *out) {
#define RF(G)                                                                                                          \
    rot_fwd_impl(x, dt, n, np, G, out);                                                                                \
    return
    ECHO_FOR_EACH_G(RF)
#undef RF
}

static void scalar_rot_inv(float *in, size_t n, int group, void *out, echo_dtype dt, int accumulate) {
#define RI(G)                                                                                                          \
    rot_inv_impl(in, n, G, out, dt, accumulate);                                                                       \
    return
    ECHO_FOR_EACH_G(RI)
#undef RI
}

const echo_cpu_codec echo_cpu_codec_scalar = {
    .name = "scalar",
    .isa = ECHO_ISA_SCALAR,
    .encode = scalar_encode,
    .decode = scalar_decode,
    .decode_store = scalar_decode_store,
    .rot_fwd = scalar_rot_fwd,
    .rot_inv = scalar_rot_inv,
    .add = scalar_add,
};
