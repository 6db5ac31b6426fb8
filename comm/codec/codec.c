/*
 * comm/codec/codec.c — the Echo group codec on host memory, and the host compute
 * table (phase 1, phase 2, finish) the schedule in echo.c runs for ranks
 * whose buffers are in host memory.
 *
 * Contract: the arithmetic is comm/codec/echo_codec.h's, so the cuda twin
 * (echo_cuda.cu) produces the same bits. These are the hot loops of the
 * local transport and must vectorize: every group loop is written over a
 * compile-time G (the switch at the bottom of each entry point instantiates
 * 16..256), straight-line, with the per-element work in small passes over a
 * G-value stack buffer, so gcc vectorizes them even at -O2 with its
 * "very cheap" cost model (check with -fopt-info-vec; docs/echo.md records
 * the report). Absmax is an integer max over |x| bits: it vectorizes without
 * -ffast-math and catches inf/nan in the same pass (their bits are the
 * largest).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/codec/codec.h"
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

/* the staged codecs' loops, further down */
static void scalar_rot_fwd(const void *x, echo_dtype dt, size_t n, size_t np, int group, float *out);
static void scalar_rot_inv(float *in, size_t n, int group, void *out, echo_dtype dt, int accumulate);
static size_t scalar_rec_encode(int form, const float *y, float *res, int res_valid, size_t n, int group,
                                uint8_t *codes, uint8_t *recs, size_t *bad);
static void scalar_rec_decode(int form, const uint8_t *codes, const uint8_t *recs, size_t n, int group, float *out,
                              int accumulate);
static void scalar_add(const float *in, size_t n, float *out);

const echo_cpu_codec echo_cpu_codec_scalar = {
    .name = "scalar",
    .encode = scalar_encode,
    .decode = scalar_decode,
    .decode_store = scalar_decode_store,
    .rot_fwd = scalar_rot_fwd,
    .rot_inv = scalar_rot_inv,
    .rec_encode = scalar_rec_encode,
    .rec_decode = scalar_rec_decode,
    .add = scalar_add,
};

/* __builtin_cpu_supports reads what libgcc's constructor found in cpuid,
 * getenv scans the environment: cheap enough to ask per call (a call codes
 * a whole message), and nothing here can be set or go stale. */
const echo_cpu_codec *echo_cpu_codec_best(void) {
    const char *cap = getenv("ECHO_CODEC_ISA");
    if (cap && !strcmp(cap, "scalar")) return &echo_cpu_codec_scalar;
#ifdef ECHO_HAVE_CODEC_AVX2
    if (!(cap && !strcmp(cap, "avx2")) && echo_cpu_codec_avx512_ok()) return &echo_cpu_codec_avx512;
    if (__builtin_cpu_supports("avx2")) return &echo_cpu_codec_avx2;
#endif
    return &echo_cpu_codec_scalar;
}

const char *echo_codec_host_isa(void) {
    return echo_cpu_codec_best()->name;
}

size_t echo_cpu_encode(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t n, int group,
                       uint8_t *codes, uint16_t *scales, size_t *bad) {
    return echo_cpu_codec_best()->encode(x, xdt, res, res_valid, rmode, n, group, codes, scales, bad);
}

void echo_cpu_decode(const uint8_t *codes, const uint16_t *scales, size_t n, int group, float *out, int accumulate) {
    echo_cpu_codec_best()->decode(codes, scales, n, group, out, accumulate);
}

size_t echo_cpu_decode_store(const uint8_t *codes, const uint16_t *scales, size_t n, int group, void *out,
                             echo_dtype dt, size_t *bad) {
    return echo_cpu_codec_best()->decode_store(codes, scales, n, group, out, dt, bad);
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

/* Returns the largest |.| bits of the block (inf/nan are the largest). */
ECHO_INLINE uint32_t store_block(const float *restrict in, size_t n, void *out, echo_dtype dt) {
    uint32_t mx = 0;
    if (dt == ECHO_F32) {
        float *restrict o = out;
        for (size_t i = 0; i < n; i++) {
            uint32_t a = echo_abs_bits(in[i]);
            mx = a > mx ? a : mx;
            o[i] = in[i];
        }
    } else {
        uint16_t *restrict o = out;
        for (size_t i = 0; i < n; i++) {
            uint32_t a = echo_abs_bits(in[i]);
            mx = a > mx ? a : mx;
            o[i] = echo_f32_to_bf16(in[i]);
        }
    }
    return mx;
}

void echo_cpu_store(const float *in, size_t n, void *out, echo_dtype dt, size_t *bad) {
    size_t esz = echo_dtype_size(dt);
    *bad = ECHO_NO_INDEX;
    for (size_t b = 0; b < n; b += ECHO_BLOCK) {
        size_t m = n - b;
        uint32_t mx = m >= ECHO_BLOCK ? store_block(in + b, ECHO_BLOCK, (char *)out + b * esz, dt)
                                      : store_block(in + b, m, (char *)out + b * esz, dt);
        if (mx >= ECHO_INF_BITS && *bad == ECHO_NO_INDEX) {
            size_t k = 0;
            while (echo_abs_bits(in[b + k]) < ECHO_INF_BITS)
                k++;
            *bad = b + k;
        }
    }
}

/* ---- public codec API ---- */

static int group_ok(int group) {
    return group >= ECHO_MIN_GROUP && group <= ECHO_MAX_GROUP && !(group & (group - 1));
}

size_t echo_codec_wire_bytes(size_t count, int group) {
    if (!group_ok(group)) return 0;
    size_t ng = (count + (size_t)group - 1) / (size_t)group;
    return ng * (size_t)group / 2 + 2 * ng;
}

int echo_codec_encode(const float *x, float *res, size_t count, int group, void *wire, char *err, size_t errlen) {
    if (!group_ok(group)) {
        snprintf(err, errlen, "codec: group size %d is not a power of two in [%d, %d]", group, ECHO_MIN_GROUP,
                 ECHO_MAX_GROUP);
        return -1;
    }
    size_t ng = (count + (size_t)group - 1) / (size_t)group, bad;
    uint8_t *codes = wire;
    uint16_t *scales = (uint16_t *)(codes + ng * (size_t)group / 2);
    if (echo_cpu_encode(x, ECHO_F32, res, res != NULL, ECHO_RESID_F32, count, group, codes, scales, &bad)) {
        float v = x[bad] + (res ? res[bad] : 0.0f);
        snprintf(err, errlen, "codec: value %g at element %zu is not finite or exceeds the codec's range (|x| < 2^127)",
                 (double)v, bad);
        return -1;
    }
    return 0;
}

void echo_codec_decode(const void *wire, size_t count, int group, float *out, int accumulate) {
    if (!group_ok(group)) return;
    size_t ng = (count + (size_t)group - 1) / (size_t)group;
    const uint8_t *codes = wire;
    echo_cpu_decode(codes, (const uint16_t *)(codes + ng * (size_t)group / 2), count, group, out, accumulate);
}

float echo_codec_group_scale(const void *wire, size_t count, int group, size_t g) {
    if (!group_ok(group)) return NAN;
    size_t ng = (count + (size_t)group - 1) / (size_t)group;
    if (g >= ng) return NAN;
    const uint16_t *scales = (const uint16_t *)((const uint8_t *)wire + ng * (size_t)group / 2);
    return echo_bf16_to_f32(scales[g]);
}

static void rot_fwd(const void *x, echo_dtype dt, size_t n, size_t np, int group, float *out);
static size_t enc_msg(const echo_plan *p, const void *y, echo_dtype ydt, float *res, int res_valid, echo_resid rmode,
                      size_t n, uint8_t *codes, uint8_t *scales, size_t *bad);
static void dec_msg(const echo_plan *p, const uint8_t *codes, const uint8_t *scales, size_t n, float *out,
                    int accumulate, size_t *bad);
static void rot_inv(float *in, size_t n, int group, void *out, echo_dtype dt, int accumulate);
static void stage_fwd(const echo_plan *p, const void *x, echo_dtype dt, size_t n, size_t np, float *out);
static void stage_inv(const echo_plan *p, float *in, size_t n, void *out, echo_dtype dt, int accumulate);

/* Rotating codecs go through a stack chunk of ECHO_ROT_CHUNK values (whole
 * groups): no allocation per call. */
#define ECHO_ROT_CHUNK 4096

int echo_codec_encode_as(echo_codec_id id, const float *x, float *res, size_t count, int group, void *wire, char *err,
                         size_t errlen) {
    const echo_codec_info *ci = echo_codec_get(id);
    size_t gb = echo_codec_group_bytes(id, group);
    if (!ci || !gb || ci->lossless) {
        snprintf(err, errlen, "codec: unknown codec %d (or not a 4-bit one) or group %d", (int)id, group);
        return -1;
    }
    if (!ci->rotate && ci->form == ECHO_FORM_INT4) return echo_codec_encode(x, res, count, group, wire, err, errlen);
    echo_plan p;
    echo_plan_init(&p, count, 1, group, ECHO_F32);
    p.rotate = ci->rotate < 0 ? group : ci->rotate;
    p.form = ci->form;
    size_t ng = (count + (size_t)group - 1) / (size_t)group, np = ng * (size_t)group;
    uint8_t *codes = wire, *scales = codes + echo_form_code_bytes(ci->form, np);
    size_t rb = gb - echo_form_code_bytes(ci->form, (size_t)group);
    float u[ECHO_ROT_CHUNK];
    size_t off = 0, b;
    if (!p.rotate) { /* out2, hout2: whole groups straight from x, only the ragged end staged */
        off = count / (size_t)group * (size_t)group;
        if (enc_msg(&p, x, ECHO_F32, res, res != NULL, ECHO_RESID_F32, off, codes, scales, &b)) {
            snprintf(err, errlen, "codec: value %g at element %zu is not finite or exceeds the codec's range", (double)x[b],
                     b);
            return -1;
        }
    }
    for (; off < np; off += ECHO_ROT_CHUNK) {
        size_t m = np - off < ECHO_ROT_CHUNK ? np - off : ECHO_ROT_CHUNK;
        size_t in = count - off < m ? count - off : m;
        stage_fwd(&p, x + off, ECHO_F32, in, m, u);
        if (enc_msg(&p, u, ECHO_F32, res ? res + off : NULL, res != NULL, ECHO_RESID_F32, m,
                    codes + echo_form_code_bytes(p.form, off),
                    scales + off / (size_t)group * rb, &b)) {
            snprintf(err, errlen,
                     "codec: rotated value %g at element %zu is not finite or exceeds the codec's range (|x| < "
                     "2^127 / G)",
                     (double)u[b], off + b);
            return -1;
        }
    }
    return 0;
}

int echo_codec_decode_as(echo_codec_id id, const void *wire, size_t count, int group, float *out, int accumulate,
                         char *err, size_t errlen) {
    const echo_codec_info *ci = echo_codec_get(id);
    size_t gb = echo_codec_group_bytes(id, group);
    if (!ci || !gb || ci->lossless) {
        snprintf(err, errlen, "codec: unknown codec %d (or not a 4-bit one) or group %d", (int)id, group);
        return -1;
    }
    if (!ci->rotate && ci->form == ECHO_FORM_INT4) {
        echo_codec_decode(wire, count, group, out, accumulate);
        return 0;
    }
    echo_plan p;
    echo_plan_init(&p, count, 1, group, ECHO_F32);
    p.rotate = ci->rotate < 0 ? group : ci->rotate;
    p.form = ci->form;
    size_t ng = (count + (size_t)group - 1) / (size_t)group, np = ng * (size_t)group;
    const uint8_t *codes = wire, *scales = codes + echo_form_code_bytes(ci->form, np);
    size_t rb = gb - echo_form_code_bytes(ci->form, (size_t)group);
    if (!p.rotate) { /* out2, hout2: no staging (a ragged last group decodes its first values) */
        dec_msg(&p, codes, scales, count, out, accumulate, NULL);
        return 0;
    }
    float u[ECHO_ROT_CHUNK];
    for (size_t off = 0; off < np; off += ECHO_ROT_CHUNK) {
        size_t m = np - off < ECHO_ROT_CHUNK ? np - off : ECHO_ROT_CHUNK;
        dec_msg(&p, codes + echo_form_code_bytes(p.form, off), scales + off / (size_t)group * rb, m, u, 0, NULL);
        stage_inv(&p, u, count - off < m ? count - off : m, out + off, ECHO_F32, accumulate);
    }
    return 0;
}

/* ---- host compute table ---- */

/* The scales of a shard's wire message follow its code bytes (L/2; 3L/8 for hnf3). */
static uint16_t *plan_scales(const echo_plan *p, const uint8_t *wire) {
    return (uint16_t *)(wire + echo_form_code_bytes(p->form, p->shard));
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

static void rot_fwd(const void *x, echo_dtype dt, size_t n, size_t np, int group, float *out) {
    echo_cpu_codec_best()->rot_fwd(x, dt, n, np, group, out);
}

static void rot_inv(float *in, size_t n, int group, void *out, echo_dtype dt, int accumulate) {
    echo_cpu_codec_best()->rot_inv(in, n, group, out, dt, accumulate);
}

/* The staged copy of a message (echo_plan_staged): rotated when the codec
 * rotates, else the values widened to fp32; zero-padded to np. */
static void stage_fwd(const echo_plan *p, const void *x, echo_dtype dt, size_t n, size_t np, float *out) {
    if (p->rotate) {
        rot_fwd(x, dt, n, np, p->rotate, out);
        return;
    }
    echo_cpu_load(x, dt, n, out, 0);
    for (size_t i = n; i < np; i++)
        out[i] = 0.0f;
}

/* out[0..n) (dt; or fp32 +=) from a staged copy (rotated back in place first). */
static void stage_inv(const echo_plan *p, float *in, size_t n, void *out, echo_dtype dt, int accumulate) {
    if (p->rotate) {
        rot_inv(in, n, p->rotate, out, dt, accumulate);
        return;
    }
    if (accumulate) {
        echo_cpu_codec_best()->add(in, n, out);
        return;
    }
    size_t bad;
    echo_cpu_store(in, n, out, dt, &bad);
}

static void scalar_add(const float *in, size_t n, float *out) {
    echo_cpu_load(in, ECHO_F32, n, out, 1);
}

static int host_unrotate(echo_comm *c, float *res, size_t n, int group, void *stream, char *err, size_t errlen) {
    (void)c, (void)stream, (void)err, (void)errlen;
    rot_inv(res, n / (size_t)group * (size_t)group, group, NULL, ECHO_F32, 0);
    return 0;
}

/* A message of n values (n a multiple of G for the hsub6 form): codes, then
 * the scales (int4: one bf16 per group; hsub6: one record per group). */
static size_t enc_msg(const echo_plan *p, const void *y, echo_dtype ydt, float *res, int res_valid, echo_resid rmode,
                      size_t n, uint8_t *codes, uint8_t *scales, size_t *bad) {
    if (p->form == ECHO_FORM_INT4)
        return echo_cpu_encode(y, ydt, res, res_valid, rmode, n, p->group, codes, (uint16_t *)scales, bad);
    /* record forms: fp32 staged values, whole groups, residuals fp32 */
    return echo_cpu_codec_best()->rec_encode(p->form, y, res, res_valid, n, p->group, codes, scales, bad);
}

static size_t scalar_rec_encode(int form, const float *y, float *res, int res_valid, size_t n, int G, uint8_t *codes,
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

/* out (fp32) = or += decode of n values; returns the first element of a
 * poisoned group in *bad (ECHO_NO_INDEX if none) when bad != NULL. */
static void dec_msg(const echo_plan *p, const uint8_t *codes, const uint8_t *scales, size_t n, float *out,
                    int accumulate, size_t *bad) {
    int G = p->group;
    if (bad) {
        *bad = ECHO_NO_INDEX;
        size_t rb = (size_t)echo_rec_bytes(p->form, G);
        for (size_t g = 0; g < (n + (size_t)G - 1) / (size_t)G; g++) {
            uint16_t sb = (uint16_t)(scales[g * rb] | (scales[g * rb + 1] << 8));
            if (echo_scale_is_poison(sb)) {
                *bad = g * (size_t)G;
                break;
            }
        }
    }
    if (p->form == ECHO_FORM_INT4)
        echo_cpu_decode(codes, (const uint16_t *)scales, n, G, out, accumulate);
    else
        echo_cpu_codec_best()->rec_decode(p->form, codes, scales, n, G, out, accumulate);
}

void echo_cpu_rec_decode_rest(int form, const uint8_t *codes, const uint8_t *recs, size_t ng, size_t n, int group,
                              float *out, int accumulate) {
    size_t off = ng * (size_t)group;
    if (off < n)
        scalar_rec_decode(form, codes + echo_form_code_bytes(form, off), recs + ng * (size_t)echo_rec_bytes(form, group), n - off, group,
                          out + off, accumulate);
}

static void scalar_rec_decode(int form, const uint8_t *codes, const uint8_t *recs, size_t n, int G, float *out,
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

/* ---- the phases' work, cut into spans of whole groups for the rank's
 * workers (echo_comm_set_workers). A span codes, sums or decodes its own
 * values only, so any split gives the same bits; the first bad element is
 * the first span's, spans being in message order. ---- */

#define HOST_SPAN_MIN 16384 /* values: smaller spans cost more to hand out than to code */
#define HOST_SPANS (2 * ECHO_MAX_RANKS) /* a job has at most one segment per shard */

typedef struct host_span {
    int s;          /* shard */
    size_t off;     /* first value, within the shard */
    size_t len;     /* values (whole groups but for a message's last) */
    size_t bad;     /* first bad element of the whole buffer, or ECHO_NO_INDEX */
} host_span;

typedef struct host_job {
    echo_comm *c;
    const echo_plan *p;
    void (*fn)(struct host_job *j, host_span *sp);
    host_span sp[HOST_SPANS];
    int n;
    /* the phase's arguments */
    const void *x;
    float *res;
    int res_valid;
    uint8_t *const *send;
    const uint8_t *const *msgs;
    uint8_t *out;
    void *buf;
} host_job;

/* Spans of n values of shard s: one without workers, else up to twice the
 * workers' threads, none under HOST_SPAN_MIN values, and never more than
 * the shard's share of HOST_SPANS (so every value gets a span). */
static void job_add(host_job *j, int s, size_t n) {
    size_t G = (size_t)j->p->group, k = 1;
    if (j->c->workers.nthreads > 1) {
        k = n / HOST_SPAN_MIN;
        size_t most = 2 * (size_t)j->c->workers.nthreads, share = HOST_SPANS / (size_t)j->p->nranks;
        most = most < share ? most : share;
        k = k < 1 ? 1 : k > most ? most : k;
    }
    size_t chunk = ((n + k - 1) / k + G - 1) / G * G;
    for (size_t o = 0; o < n; o += chunk)
        j->sp[j->n++] = (host_span){s, o, n - o < chunk ? n - o : chunk, ECHO_NO_INDEX};
}

static void job_task(void *arg, int t) {
    host_job *j = arg;
    j->fn(j, &j->sp[t]);
}

/* Run every span; the first bad element in message order. */
static size_t job_run(host_job *j) {
    if (j->n > 1 && j->c->workers.nthreads > 1)
        j->c->workers.run(j->c->workers.ctx, j->n, job_task, j);
    else
        for (int t = 0; t < j->n; t++)
            j->fn(j, &j->sp[t]);
    for (int t = 0; t < j->n; t++)
        if (j->sp[t].bad != ECHO_NO_INDEX) return j->sp[t].bad;
    return ECHO_NO_INDEX;
}

/* A span's codes and scales (or records) within a wire message. */
static uint8_t *span_codes(const echo_plan *p, const host_span *sp, const uint8_t *msg) {
    return (uint8_t *)msg + echo_form_code_bytes(p->form, sp->off);
}
static uint8_t *span_scales(const echo_plan *p, const host_span *sp, const uint8_t *msg) {
    return (uint8_t *)plan_scales(p, msg) + sp->off / (size_t)p->group * (size_t)echo_rec_bytes(p->form, p->group);
}

/* Phase 1 of one span: staged, its values rotated (or widened) into c->rot
 * (the own shard too: phase 2 sums it from there), then coded for shard s
 * unless it is the own one. */
static void phase1_span(host_job *j, host_span *sp) {
    const echo_plan *p = j->p;
    echo_comm *c = j->c;
    size_t at = (size_t)sp->s * p->shard + sp->off, esz = echo_dtype_size(p->dt), b;
    const void *x = (const char *)j->x + at * esz;
    echo_dtype xdt = p->dt;
    size_t in = p->count > at ? p->count - at : 0;
    /* a peer's whole fp32 groups of out2 / hout2 are coded from x itself:
     * the staged copy would be the same values */
    int direct = sp->s != c->rank && !p->rotate && p->dt == ECHO_F32 && in >= sp->len;
    if (echo_plan_staged(p) && !direct) {
        stage_fwd(p, x, p->dt, in < sp->len ? in : sp->len, sp->len, c->rot + at);
        x = c->rot + at;
        xdt = ECHO_F32;
    }
    if (sp->s == c->rank) return;
    if (enc_msg(p, x, xdt, j->res ? j->res + at : NULL, j->res_valid, ECHO_RESID_F32, sp->len,
                span_codes(p, sp, j->send[sp->s]), span_scales(p, sp, j->send[sp->s]), &b))
        sp->bad = at + b;
}

static int host_phase1(echo_comm *c, const echo_plan *p, const void *x, float *res, int res_valid, uint8_t *const *send,
                       size_t *bad, void *stream, char *err, size_t errlen) {
    (void)stream, (void)err, (void)errlen;
    host_job j = {.c = c, .p = p, .fn = phase1_span, .x = x, .res = res, .res_valid = res_valid, .send = send};
    for (int s = 0; s < p->nranks; s++) {
        size_t n = echo_plan_len(p, s);
        if (n && (s != c->rank || echo_plan_staged(p))) job_add(&j, s, echo_plan_staged(p) ? echo_plan_pad(p, n) : n);
    }
    *bad = job_run(&j);
    return 0;
}

/* Phase 2 of one span of the own shard: the sum over j = 0..N-1 in that
 * order (the cuda twin uses the same), own values raw, then coded. */
static void phase2_span(host_job *j, host_span *sp) {
    const echo_plan *p = j->p;
    echo_comm *c = j->c;
    size_t at = (size_t)c->rank * p->shard + sp->off, b;
    float *sum = c->scratch + sp->off;
    echo_dtype xdt = p->dt;
    const void *x = (const char *)j->x + at * echo_dtype_size(xdt);
    echo_resid rmode = p->dt == ECHO_BF16 ? ECHO_RESID_BF16 : ECHO_RESID_F32;
    if (echo_plan_staged(p)) {
        /* staged, whole groups; the output is rounded after the inverse
         * rotation, so g does not account for that rounding */
        x = c->rot + at;
        xdt = ECHO_F32;
        rmode = ECHO_RESID_F32;
    }
    for (int r = 0; r < p->nranks; r++) {
        if (r == c->rank)
            echo_cpu_load(x, xdt, sp->len, sum, r > 0);
        else
            dec_msg(p, span_codes(p, sp, j->msgs[r]), span_scales(p, sp, j->msgs[r]), sp->len, sum, r > 0, NULL);
    }
    /* a poisoned group travels in-band and is reported by finish */
    enc_msg(p, sum, ECHO_F32, j->res ? j->res + sp->off : NULL, j->res_valid, rmode, sp->len, span_codes(p, sp, j->out),
            span_scales(p, sp, j->out), &b);
}

static int host_phase2(echo_comm *c, const echo_plan *p, const void *x, const uint8_t *const *recv, float *g,
                       int g_valid, uint8_t *out, void *stream, char *err, size_t errlen) {
    (void)stream, (void)err, (void)errlen;
    size_t n = echo_plan_len(p, c->rank);
    if (n == 0) return 0;
    host_job j = {.c = c, .p = p, .fn = phase2_span, .x = x, .res = g, .res_valid = g_valid, .msgs = recv, .out = out};
    job_add(&j, c->rank, echo_plan_staged(p) ? echo_plan_pad(p, n) : n);
    job_run(&j);
    return 0;
}

/* Finish of one span: decoded (staged: into c->rot, then rotated back) and
 * rounded to the buffer's dtype. */
static void finish_span(host_job *j, host_span *sp) {
    const echo_plan *p = j->p;
    size_t at = (size_t)sp->s * p->shard + sp->off, esz = echo_dtype_size(p->dt), b;
    const uint8_t *msg = j->msgs[sp->s];
    void *out = (char *)j->buf + at * esz;
    size_t in = p->count - at; /* >= 1: a span starts inside the message */
    if (echo_plan_staged(p) && !p->rotate && p->dt == ECHO_F32) {
        /* out2 / hout2 into an fp32 buffer: no staged copy (a ragged last
         * group decodes its first values) */
        dec_msg(p, span_codes(p, sp, msg), span_scales(p, sp, msg), in < sp->len ? in : sp->len, out, 0, &b);
    } else if (echo_plan_staged(p)) {
        dec_msg(p, span_codes(p, sp, msg), span_scales(p, sp, msg), sp->len, j->c->rot + at, 0, &b);
        stage_inv(p, j->c->rot + at, in < sp->len ? in : sp->len, out, p->dt, 0);
    } else if (!echo_cpu_decode_store(span_codes(p, sp, msg), (const uint16_t *)span_scales(p, sp, msg), sp->len, p->group,
                                      out, p->dt, &b))
        b = ECHO_NO_INDEX;
    if (b != ECHO_NO_INDEX) sp->bad = at + b;
}

static int host_finish(echo_comm *c, const echo_plan *p, const uint8_t *const *gathered, void *buf, size_t *bad,
                       void *stream, char *err, size_t errlen) {
    (void)stream, (void)err, (void)errlen;
    host_job j = {.c = c, .p = p, .fn = finish_span, .msgs = gathered, .buf = buf};
    for (int s = 0; s < p->nranks; s++) {
        size_t n = echo_plan_len(p, s);
        if (n) job_add(&j, s, echo_plan_staged(p) ? echo_plan_pad(p, n) : n);
    }
    *bad = job_run(&j);
    return 0;
}

static int host_alloc(echo_comm *c, size_t bytes, void **out, char *err, size_t errlen) {
    (void)c;
    *out = calloc(1, bytes ? bytes : 1);
    if (!*out) {
        snprintf(err, errlen, "out of memory (%zu bytes)", bytes);
        return -1;
    }
    return 0;
}

static void host_free(echo_comm *c, void *p) {
    (void)c;
    free(p);
}

/* The owner's fp32 sum of one shard, when this world runs the two-shot
 * schedule. */
static int host_comm_init(echo_comm *c, char *err, size_t errlen) {
    const echo_world *w = c->w;
    if (!w->max_plan.wire || w->nranks == 1) return 0;
    c->scratch = malloc(w->max_plan.shard * sizeof(float) + 1);
    if (!c->scratch) {
        snprintf(err, errlen, "echo: out of memory for the %zu-value reduction scratch", w->max_plan.shard);
        return -1;
    }
    const echo_codec_info *ci = echo_codec_get(w->cfg.codec);
    if (ci->rotate || ci->form != ECHO_FORM_INT4) {
        size_t m = w->max_plan.shard * (size_t)w->nranks;
        c->rot = malloc(m * sizeof(float) + 1);
        if (!c->rot) {
            free(c->scratch);
            c->scratch = NULL;
            snprintf(err, errlen, "echo: out of memory for the %zu-value rotation scratch", m);
            return -1;
        }
    }
    return 0;
}

static void host_comm_fini(echo_comm *c) {
    free(c->scratch);
    free(c->rot);
    c->scratch = NULL;
    c->rot = NULL;
}

const echo_compute_ops echo_host_compute = {
    .name = "host",
    .phase1 = host_phase1,
    .phase2 = host_phase2,
    .finish = host_finish,
    .alloc = host_alloc,
    .free = host_free,
    .comm_init = host_comm_init,
    .comm_fini = host_comm_fini,
    .unrotate = host_unrotate,
};
