/*
 * comm/codec/codec_avx2.c — the host codec's loops in AVX2 intrinsics
 * (echo_cpu_codec_avx2, comm/codec/codec_cpu.h), for CPUs that have it;
 * echo_cpu_codec_best picks it at run time.
 *
 * Contract: bit-identical to echo_cpu_codec_scalar (codec_scalar.c over
 * comm/codec/echo_codec.h) for every input: the same IEEE operations in the same
 * order on 8 lanes. The division y/s stays a division (a reciprocal would
 * change codes), rint is the same two adds of 1.5*2^23 (not vroundps, which
 * gives -0 where the adds give +0), and nothing here is built with FMA, so
 * no multiply-add can be contracted. Full groups are vectorized; a partial
 * last group, and group sizes outside 16..256, go to the scalar table.
 * One latitude: where a Walsh-Hadamard butterfly meets a NaN, which NaN
 * comes out (its payload and sign) is not fixed: the compiler orders a
 * commutative add's operands as it likes, in the scalar loops too, and the
 * cuda kernels give the canonical NaN. Every other value is bit-identical.
 *
 * Why intrinsics rather than the scalar source built for AVX2: gcc's
 * vectorization of the scalar loops leaves the nibble packing and
 * unpacking and the per-group reduction largely scalar, which holds encode
 * to a fraction of memory bandwidth (docs/echo.md, section 8).
 */
#include "comm/codec/codec_cpu.h"

#ifdef ECHO_HAVE_CODEC_AVX2

#include <immintrin.h>
#include <string.h>

#include "comm/codec/echo_codec.h"

#ifndef ECHO_PF
#define ECHO_PF 1024
#endif
#define AVX2_FN __attribute__((target("avx2")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2")))

/* 8 values of x (fp32 or bf16) at element i, as fp32. */
AVX2_INLINE __m256 load8(const void *x, echo_dtype dt, size_t i) {
    if (dt == ECHO_F32) return _mm256_loadu_ps((const float *)x + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* echo_rint on 8 lanes. */
AVX2_INLINE __m256 rint8(__m256 v) {
    const __m256 c = _mm256_set1_ps(12582912.0f);
    return _mm256_sub_ps(_mm256_add_ps(v, c), c);
}

/* echo_f32_to_bf16 on 8 lanes, the bf16 in the low half of each 32-bit lane. */
AVX2_INLINE __m256i bf16_8(__m256 f) {
    __m256i u = _mm256_castps_si256(f), hi = _mm256_srli_epi32(u, 16);
    __m256i r =
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    r = _mm256_srli_epi32(r, 16);
    __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256i isnan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32((int)ECHO_INF_BITS));
    return _mm256_blendv_epi8(r, nan, isnan);
}

/* echo_bf16_to_f32(echo_f32_to_bf16(f)) on 8 lanes. */
AVX2_INLINE __m256 round_bf16_8(__m256 f) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_8(f), 16));
}

/* 32 codes (int32 lanes in [-8, 7], element order q0, q1, q2, q3) packed two
 * per byte as echo_pack2 does: 16 bytes in element order. */
AVX2_INLINE __m128i pack32(__m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    /* Saturating packs to int8 (no value saturates); the 128-bit halves
     * interleave the inputs, but an element pair (2j, 2j+1) always stays
     * in one 16-bit lane: low half q0..q3[0..3], high half q0..q3[4..7]. */
    __m256i c = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    c = _mm256_and_si256(c, _mm256_set1_epi8(15));
    c = _mm256_or_si256(c, _mm256_srli_epi16(c, 4)); /* low byte of each 16-bit lane: lo | hi << 4 */
    /* those low bytes: codes 0,1,4,5,8,9,12,13 | 2,3,6,7,10,11,14,15 */
    c = _mm256_shuffle_epi8(c, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1, 0, 2, 4, 6,
                                                8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm_unpacklo_epi16(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

/* 32 (16 codes: n16 = 1) or 64 values' nibbles of `codes`, sign-extended, as
 * 8-value int32 vectors in element order. */
AVX2_INLINE void unpack32(const uint8_t *codes, int n16, __m256i q[4]) {
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
    const __m128i nib = _mm_set1_epi8(15);
    __m128i b = n16 ? _mm_loadl_epi64((const __m128i *)codes) : _mm_loadu_si128((const __m128i *)codes);
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, nib));
    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), nib));
    __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
    q[0] = _mm256_cvtepi8_epi32(e0);
    q[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8));
    q[2] = _mm256_cvtepi8_epi32(e1);
    q[3] = _mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8));
}

/* o + v with o as the first source operand. When both are NaN x86 returns
 * the first source's payload, and the scalar loop (o[i] += v[i]) keeps the
 * accumulator first; gcc treats _mm256_add_ps as commutative and would put
 * o second to fold its load, so the operand order is pinned here. */
AVX2_INLINE __m256 add_acc(__m256 o, __m256 v) {
    __m256 r;
    __asm__("vaddps %2, %1, %0" : "=x"(r) : "x"(o), "xm"(v));
    return r;
}

/* Largest of 8 non-negative int32 lanes. */
AVX2_INLINE uint32_t hmax8(__m256i m) {
    __m128i v = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    v = _mm_max_epi32(v, _mm_shuffle_epi32(v, 0x4e));
    v = _mm_max_epi32(v, _mm_shuffle_epi32(v, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(v);
}

/* One full group at element `off` of x: load_group + encode_group of
 * codec.c. hr: y = x + res (else y = x); hw: res = y - output. res is read
 * whole before it is written. *k = index in the group of the first value
 * out of range when the group is poisoned. */
AVX2_INLINE uint16_t enc_group(const void *x, echo_dtype dt, size_t off, float *res, int hr, int hw, echo_resid rmode,
                               int G, uint8_t *codes, size_t *k) {
    __m256 y[ECHO_MAX_GROUP / 8];
    __m256i mx = _mm256_setzero_si256();
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    /* The hardware prefetchers alone leave encode ~20% short of what the
     * caches can deliver (measured: docs/echo.md, section 8). */
    for (int j = 0; ECHO_PF > 0 && j < G / 8; j += 2) {
        _mm_prefetch((const char *)x + (off + 8 * (size_t)j + ECHO_PF) * echo_dtype_size(dt), _MM_HINT_T0);
        if (hr) _mm_prefetch((const char *)(res + 8 * j + ECHO_PF), _MM_HINT_T0);
    }
    for (int j = 0; j < G / 8; j++) {
        __m256 v = load8(x, dt, off + 8 * (size_t)j);
        if (hr) v = _mm256_add_ps(v, _mm256_loadu_ps(res + 8 * j));
        y[j] = v;
        mx = _mm256_max_epi32(mx, _mm256_and_si256(_mm256_castps_si256(v), abs));
    }
    uint16_t sb = echo_scale_from_absbits(hmax8(mx));
    if (sb == 0 || echo_scale_is_poison(sb)) {
        memset(codes, 0, (size_t)G / 2);
        if (sb) { /* the first offending element, as codec.c finds it */
            float yf[ECHO_MAX_GROUP];
            for (int j = 0; j < G / 8; j++)
                _mm256_storeu_ps(yf + 8 * j, y[j]);
            size_t i = 0;
            while (i + 1 < (size_t)G && echo_abs_bits(yf[i]) < ECHO_LIMIT_BITS)
                i++;
            *k = i;
        }
        if (hw)
            for (int j = 0; j < G / 8; j++)
                _mm256_storeu_ps(res + 8 * j, sb == 0 ? y[j] : _mm256_setzero_ps());
        return sb;
    }
    const __m256 s = _mm256_set1_ps(echo_bf16_to_f32(sb));
    for (int j = 0; j < G / 8; j += 4) {
        __m256i qi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                         _mm256_setzero_si256()};
        for (int t = 0; t < 4 && j + t < G / 8; t++) {
            __m256 q = rint8(_mm256_div_ps(y[j + t], s));
            qi[t] = _mm256_cvttps_epi32(q);
            if (hw) {
                __m256 o = _mm256_mul_ps(q, s);
                if (rmode == ECHO_RESID_BF16) o = round_bf16_8(o);
                _mm256_storeu_ps(res + 8 * (j + t), _mm256_sub_ps(y[j + t], o));
            }
        }
        __m128i b = pack32(qi[0], qi[1], qi[2], qi[3]);
        if (G == 16)
            _mm_storel_epi64((__m128i *)codes, b);
        else
            _mm_storeu_si128((__m128i *)(codes + j * 4), b);
    }
    return sb;
}

/* Horizontal maxima of 8 vectors of non-negative int32: lane g = max of m[g]. */
AVX2_INLINE __m256i hmax8x8(const __m256i m[8]) {
    __m256i t[4], u[2];
    for (int i = 0; i < 4; i++)
        t[i] = _mm256_max_epi32(_mm256_unpacklo_epi32(m[2 * i], m[2 * i + 1]),
                                _mm256_unpackhi_epi32(m[2 * i], m[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        u[i] = _mm256_max_epi32(_mm256_unpacklo_epi64(t[2 * i], t[2 * i + 1]),
                                _mm256_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    return _mm256_max_epi32(_mm256_permute2x128_si256(u[0], u[1], 0x20), _mm256_permute2x128_si256(u[0], u[1], 0x31));
}

/* Small groups (G = 16) spend as much on the per-group scale as on the
 * values, so 8 groups are coded at once: one transposed reduction for their
 * absmax and echo_scale_from_absbits on 8 lanes. Returns 0, having written
 * nothing, when a group of the 8 is all zero or poisoned: the caller then
 * codes them one by one. */
AVX2_INLINE int enc_batch8(const void *x, echo_dtype dt, size_t off, float *res, int hr, int hw, echo_resid rmode,
                           int G, uint8_t *codes, uint16_t *scales) {
    __m256 y[8 * 32 / 8]; /* 8 groups of G <= 32 */
    __m256i mx[8];
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    const int V = G / 8; /* vectors per group */
    for (int j = 0; ECHO_PF > 0 && j < 8 * V; j += 2) {
        _mm_prefetch((const char *)x + (off + 8 * (size_t)j + ECHO_PF) * echo_dtype_size(dt), _MM_HINT_T0);
        if (hr) _mm_prefetch((const char *)(res + 8 * j + ECHO_PF), _MM_HINT_T0);
    }
    for (int g = 0; g < 8; g++) {
        mx[g] = _mm256_setzero_si256();
        for (int j = g * V; j < (g + 1) * V; j++) {
            __m256 v = load8(x, dt, off + 8 * (size_t)j);
            if (hr) v = _mm256_add_ps(v, _mm256_loadu_ps(res + 8 * j));
            y[j] = v;
            mx[g] = _mm256_max_epi32(mx[g], _mm256_and_si256(_mm256_castps_si256(v), abs));
        }
    }
    /* echo_scale_from_absbits on 8 lanes (a finite here, so a/7 is the
     * scalar's division) */
    __m256i a = hmax8x8(mx);
    __m256i special = _mm256_or_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32((int)ECHO_LIMIT_BITS - 1)),
                                      _mm256_cmpeq_epi32(a, _mm256_setzero_si256()));
    if (!_mm256_testz_si256(special, special)) return 0;
    __m256i q = _mm256_castps_si256(_mm256_div_ps(_mm256_castsi256_ps(a), _mm256_set1_ps((float)ECHO_QMAX)));
    __m256i sb =
        _mm256_max_epi32(_mm256_srli_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(0xffff)), 16), _mm256_set1_epi32(1));
    __m128i sb16 = _mm_packus_epi32(_mm256_castsi256_si128(sb), _mm256_extracti128_si256(sb, 1));
    _mm_storeu_si128((__m128i *)scales, sb16);
    __m256 sv = _mm256_castsi256_ps(_mm256_slli_epi32(sb, 16));
    for (int j = 0; j < 8 * V; j += 4) {
        __m256i qi[4];
        for (int t = 0; t < 4; t++) {
            __m256 s = _mm256_permutevar8x32_ps(sv, _mm256_set1_epi32((j + t) / V));
            __m256 qf = rint8(_mm256_div_ps(y[j + t], s));
            qi[t] = _mm256_cvttps_epi32(qf);
            if (hw) {
                __m256 o = _mm256_mul_ps(qf, s);
                if (rmode == ECHO_RESID_BF16) o = round_bf16_8(o);
                _mm256_storeu_ps(res + 8 * (j + t), _mm256_sub_ps(y[j + t], o));
            }
        }
        _mm_storeu_si128((__m128i *)(codes + j * 4), pack32(qi[0], qi[1], qi[2], qi[3]));
    }
    return 1;
}

AVX2_INLINE size_t enc_impl(const void *x, echo_dtype dt, float *res, int hr, int hw, echo_resid rmode, size_t ng,
                            int G, uint8_t *codes, uint16_t *scales, size_t *bad) {
    size_t npoison = 0, g = 0;
    while (g < ng) {
        int batch = G == 16 && g + 8 <= ng;
        size_t off = g * (size_t)G;
        if (batch &&
            enc_batch8(x, dt, off, res + (hr || hw ? off : 0), hr, hw, rmode, G, codes + off / 2, scales + g)) {
            g += 8;
            continue;
        }
        /* one group at a time: a batch with a zero or poisoned group, the
         * groups after the last batch, every group when G >= 32 (batches of 8
         * measured slower there) */
        for (size_t end = batch ? g + 8 : ng; g < end; g++) {
            size_t k = 0;
            off = g * (size_t)G;
            uint16_t sb = enc_group(x, dt, off, res + (hr || hw ? off : 0), hr, hw, rmode, G, codes + off / 2, &k);
            scales[g] = sb;
            if (echo_scale_is_poison(sb) && !npoison++) *bad = off + k;
        }
    }
    return npoison;
}

/* The call patterns of the host compute and the public codec get loops
 * with the input type and the residual's use known at compile time (worth
 * ~10%); any other combination runs the general loop. */
AVX2_INLINE size_t enc_variants(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t ng,
                                int G, uint8_t *codes, uint16_t *scales, size_t *bad) {
    const echo_dtype F = ECHO_F32, B = ECHO_BF16;
    const echo_resid RF = ECHO_RESID_F32, RB = ECHO_RESID_BF16;
    int hr = res && res_valid, hw = res != NULL;
    if (xdt == F && !hw) return enc_impl(x, F, res, 0, 0, RF, ng, G, codes, scales, bad);
    if (xdt == F && hr && rmode == RF) return enc_impl(x, F, res, 1, 1, RF, ng, G, codes, scales, bad);
    if (xdt == F && hr && rmode == RB) return enc_impl(x, F, res, 1, 1, RB, ng, G, codes, scales, bad);
    if (xdt == B && hr && rmode == RF) return enc_impl(x, B, res, 1, 1, RF, ng, G, codes, scales, bad);
    return enc_impl(x, xdt, res, hr, hw, rmode, ng, G, codes, scales, bad);
}

AVX2_FN size_t echo_avx2_encode(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t n,
                                  int group, uint8_t *codes, uint16_t *scales, size_t *bad) {
    size_t ng = n / (size_t)(group > 0 ? group : 1), np;
    *bad = ECHO_NO_INDEX;
    switch (group) {
    case 16: np = enc_variants(x, xdt, res, res_valid, rmode, ng, 16, codes, scales, bad); break;
    case 32: np = enc_variants(x, xdt, res, res_valid, rmode, ng, 32, codes, scales, bad); break;
    case 64: np = enc_variants(x, xdt, res, res_valid, rmode, ng, 64, codes, scales, bad); break;
    case 128: np = enc_variants(x, xdt, res, res_valid, rmode, ng, 128, codes, scales, bad); break;
    case 256: np = enc_variants(x, xdt, res, res_valid, rmode, ng, 256, codes, scales, bad); break;
    default: return echo_cpu_codec_scalar.encode(x, xdt, res, res_valid, rmode, n, group, codes, scales, bad);
    }
    size_t off = ng * (size_t)group, tb;
    if (off < n) {
        size_t tp =
            echo_cpu_codec_scalar.encode((const char *)x + off * echo_dtype_size(xdt), xdt, res ? res + off : NULL,
                                         res_valid, rmode, n - off, group, codes + off / 2, scales + ng, &tb);
        if (tp && !np) *bad = off + tb;
        np += tp;
    }
    return np;
}

/* Every full group decoded, 8 values v at a time (elements i..i+7), and
 * BODY run on them: one loop per output mode, so that no mode test sits
 * inside the group loop. */
#define DEC_LOOP(G, BODY)                                                                                              \
    for (size_t g = 0; g < ng; g++) {                                                                                  \
        const __m256 s = _mm256_set1_ps(echo_bf16_to_f32(scales[g]));                                                  \
        for (int j = 0; j < (G) / 8; j += 4) {                                                                         \
            __m256i q[4];                                                                                              \
            unpack32(codes + g * (size_t)(G) / 2 + (size_t)j * 4, (G) == 16, q);                                       \
            for (int t = 0; t < 4 && j + t < (G) / 8; t++) {                                                           \
                __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(q[t]), s);                                                 \
                size_t i = g * (size_t)(G) + 8 * (size_t)(j + t);                                                      \
                BODY                                                                                                   \
            }                                                                                                          \
        }                                                                                                              \
    }

AVX2_INLINE void dec_impl(const uint8_t *codes, const uint16_t *scales, size_t ng, int G, float *out, int accumulate) {
    if (accumulate)
        DEC_LOOP(G, _mm256_storeu_ps(out + i, add_acc(_mm256_loadu_ps(out + i), v));)
    else
        DEC_LOOP(G, _mm256_storeu_ps(out + i, v);)
}

AVX2_FN void echo_avx2_decode(const uint8_t *codes, const uint16_t *scales, size_t n, int group, float *out,
                                int accumulate) {
    size_t ng = n / (size_t)(group > 0 ? group : 1);
    switch (group) {
    case 16: dec_impl(codes, scales, ng, 16, out, accumulate); break;
    case 32: dec_impl(codes, scales, ng, 32, out, accumulate); break;
    case 64: dec_impl(codes, scales, ng, 64, out, accumulate); break;
    case 128: dec_impl(codes, scales, ng, 128, out, accumulate); break;
    case 256: dec_impl(codes, scales, ng, 256, out, accumulate); break;
    default: echo_cpu_codec_scalar.decode(codes, scales, n, group, out, accumulate); return;
    }
    size_t off = ng * (size_t)group;
    if (off < n) echo_cpu_codec_scalar.decode(codes + off / 2, scales + ng, n - off, group, out + off, accumulate);
}

AVX2_INLINE size_t dst_impl(const uint8_t *codes, const uint16_t *scales, size_t ng, int G, void *out, echo_dtype dt,
                            size_t *bad) {
    size_t npoison = 0;
    for (size_t g = 0; g < ng; g++)
        if (echo_scale_is_poison(scales[g]) && !npoison++) *bad = g * (size_t)G;
    if (dt == ECHO_F32) {
        float *o = out;
        DEC_LOOP(G, _mm256_storeu_ps(o + i, v);)
    } else {
        uint16_t *o = out;
        /* bf16 lanes packed to 16 bits: packus is per 128-bit half, so the
         * halves of the 8 results come out as 0-3 | 4-7 in both halves. */
        DEC_LOOP(G, {
            __m256i b = bf16_8(v);
            __m256i p = _mm256_packus_epi32(b, b);
            _mm_storel_epi64((__m128i *)(o + i), _mm256_castsi256_si128(p));
            _mm_storel_epi64((__m128i *)(o + i + 4), _mm256_extracti128_si256(p, 1));
        })
    }
    return npoison;
}

AVX2_FN size_t echo_avx2_decode_store(const uint8_t *codes, const uint16_t *scales, size_t n, int group, void *out,
                                        echo_dtype dt, size_t *bad) {
    size_t ng = n / (size_t)(group > 0 ? group : 1), np;
    *bad = ECHO_NO_INDEX;
    switch (group) {
    case 16: np = dst_impl(codes, scales, ng, 16, out, dt, bad); break;
    case 32: np = dst_impl(codes, scales, ng, 32, out, dt, bad); break;
    case 64: np = dst_impl(codes, scales, ng, 64, out, dt, bad); break;
    case 128: np = dst_impl(codes, scales, ng, 128, out, dt, bad); break;
    case 256: np = dst_impl(codes, scales, ng, 256, out, dt, bad); break;
    default: return echo_cpu_codec_scalar.decode_store(codes, scales, n, group, out, dt, bad);
    }
    size_t off = ng * (size_t)group, tb;
    if (off < n) {
        size_t tp = echo_cpu_codec_scalar.decode_store(codes + off / 2, scales + ng, n - off, group,
                                                       (char *)out + off * echo_dtype_size(dt), dt, &tb);
        if (tp && !np) *bad = off + tb;
        np += tp;
    }
    return np;
}

/* ---- the staged codecs: the rotation (hadamard, hsub6) and the out2 /
 * hout2 records ----
 * A group's butterflies (echo_fwht: the same adds and subtractions on the
 * same operands, stage by stage in the same order) run in two passes over
 * the group, each on at most 8 vectors so that they stay in registers:
 * pass A on each 4 consecutive vectors (2 at G = 16: the in-vector stages
 * of span 1, 2, 4 and the cross-vector ones of span 8, 16), pass B on the
 * vectors 4 apart (span 32 .. G/2; none for G <= 32). A stage only pairs
 * values its pass holds together, and every value sees the stages in
 * order. Each pass takes the group's first step (the signs D) or last one
 * (D / G, the largest |.|) on the way. Named vectors rather than arrays:
 * gcc keeps an array of vectors in memory unless every loop over it is
 * unrolled first. */

/* Group loops unrolled whole: gcc's -O2 keeps loops of 8+ trips rolled. */
#define UNROLL _Pragma("GCC unroll 32")

/* An in-vector stage: sw is v with the partner lanes swapped, neg the sign
 * bit of the upper lane of each pair. The lower lane gets b + a (= a + b),
 * the upper a + (-b) (= a - b: IEEE defines the difference so), a the lower
 * lane and b the upper: one add instead of an add, a subtraction and a
 * blend. Only a NaN's payload can tell the orders apart, and those are not
 * part of the contract (test_codec_simd.c, cmp_f32). */
#define BFLY_IN(v, sw, neg) _mm256_add_ps(sw, _mm256_xor_ps(v, neg))

AVX2_INLINE __m256 fwht_in(__m256 v) {
    const __m256 n1 = _mm256_castsi256_ps(_mm256_setr_epi32(0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN));
    const __m256 n2 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, INT32_MIN, INT32_MIN, 0, 0, INT32_MIN, INT32_MIN));
    const __m256 n4 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, 0, 0, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN));
    v = BFLY_IN(v, _mm256_permute_ps(v, 0xb1), n1);
    v = BFLY_IN(v, _mm256_permute_ps(v, 0x4e), n2);
    return BFLY_IN(v, _mm256_permute2f128_ps(v, v, 1), n4);
}

/* A cross-vector butterfly: a, b = a + b, a - b. */
#define BF(a, b)                                                                                                       \
    do {                                                                                                               \
        __m256 t_ = (a);                                                                                               \
        (a) = _mm256_add_ps(t_, (b));                                                                                  \
        (b) = _mm256_sub_ps(t_, (b));                                                                                  \
    } while (0)

/* D as multipliers (+-1, codec.c's rot_fwd), as sign masks (echo_had_fwd's
 * negation) and D / G (+-1/G, echo_had_inv), 8 values a row. */
typedef struct {
    __m256 mul[ECHO_MAX_GROUP / 8], neg[ECHO_MAX_GROUP / 8], inv[ECHO_MAX_GROUP / 8];
} had_vecs;

AVX2_INLINE void had_vecs_init(had_vecs *d, int G) {
    const __m256 inv = _mm256_set1_ps(1.0f / (float)G), sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    for (int j = 0; j < G / 8; j++) {
        /* echo_had_neg on 8 lanes */
        __m256i h = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * j));
        h = _mm256_add_epi32(_mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x9e3779b1u)), _mm256_set1_epi32(0x7f4a7c15));
        h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
        h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x85ebca77u));
        h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
        __m256 neg = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 31)), sign);
        d->neg[j] = neg;
        d->mul[j] = _mm256_or_ps(one, neg);
        d->inv[j] = _mm256_or_ps(inv, neg);
    }
}

/* The optional steps a pass takes on each vector j of the group. */
typedef struct {
    const __m256 *mul, *neg; /* before: v * mul[j], v ^ neg[j] */
    const __m256 *inv;       /* after: v * inv[j] */
    __m256i *mx;             /* after: *mx = max(*mx, |v| bits) */
    const float *ysub;       /* last: store ysub - v rather than v */
} pass_ops;

AVX2_INLINE __m256 pass_pre(__m256 v, const pass_ops *o, int j) {
    if (o->mul) v = _mm256_mul_ps(v, o->mul[j]);
    if (o->neg) v = _mm256_xor_ps(v, o->neg[j]);
    return v;
}

AVX2_INLINE void pass_post(__m256 v, const pass_ops *o, int j, float *dst) {
    if (o->inv) v = _mm256_mul_ps(v, o->inv[j]);
    if (o->mx)
        *o->mx = _mm256_max_epi32(*o->mx, _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)));
    if (o->ysub) v = _mm256_sub_ps(_mm256_loadu_ps(o->ysub + 8 * j), v);
    _mm256_storeu_ps(dst + 8 * j, v);
}

/* Pass A from src (G values of dt) to dst (fp32; may be src); pre and
 * post are applied around it. */
AVX2_INLINE void pass_a(const void *src, echo_dtype dt, float *dst, int G, const pass_ops *pre, const pass_ops *post) {
    for (int q = 0; q < G / 8; q += 4) {
        __m256 v0 = fwht_in(pass_pre(load8(src, dt, 8 * (size_t)q), pre, q));
        __m256 v1 = fwht_in(pass_pre(load8(src, dt, 8 * (size_t)q + 8), pre, q + 1));
        BF(v0, v1);
        if (G > 16) {
            __m256 v2 = fwht_in(pass_pre(load8(src, dt, 8 * (size_t)q + 16), pre, q + 2));
            __m256 v3 = fwht_in(pass_pre(load8(src, dt, 8 * (size_t)q + 24), pre, q + 3));
            BF(v2, v3);
            BF(v0, v2);
            BF(v1, v3);
            pass_post(v2, post, q + 2, dst);
            pass_post(v3, post, q + 3, dst);
        }
        pass_post(v0, post, q, dst);
        pass_post(v1, post, q + 1, dst);
    }
}

/* Pass B (G >= 64) in place on b, post applied after it. */
AVX2_INLINE void pass_b(float *b, int G, const pass_ops *post) {
    const __m256 z = _mm256_setzero_ps();
    for (int r = 0; r < 4; r++) {
        const int k = G / 32; /* vectors 4 apart: 2, 4 or 8 */
        __m256 v0 = _mm256_loadu_ps(b + 8 * r), v1 = _mm256_loadu_ps(b + 8 * (r + 4));
        __m256 v2 = k > 2 ? _mm256_loadu_ps(b + 8 * (r + 8)) : z, v3 = k > 2 ? _mm256_loadu_ps(b + 8 * (r + 12)) : z;
        __m256 v4 = k > 4 ? _mm256_loadu_ps(b + 8 * (r + 16)) : z, v5 = k > 4 ? _mm256_loadu_ps(b + 8 * (r + 20)) : z;
        __m256 v6 = k > 4 ? _mm256_loadu_ps(b + 8 * (r + 24)) : z, v7 = k > 4 ? _mm256_loadu_ps(b + 8 * (r + 28)) : z;
        BF(v0, v1);
        if (k > 2) {
            BF(v2, v3);
            BF(v0, v2);
            BF(v1, v3);
        }
        if (k > 4) {
            BF(v4, v5);
            BF(v6, v7);
            BF(v4, v6);
            BF(v5, v7);
            BF(v0, v4);
            BF(v1, v5);
            BF(v2, v6);
            BF(v3, v7);
        }
        pass_post(v0, post, r, b);
        pass_post(v1, post, r + 4, b);
        if (k > 2) {
            pass_post(v2, post, r + 8, b);
            pass_post(v3, post, r + 12, b);
        }
        if (k > 4) {
            pass_post(v4, post, r + 16, b);
            pass_post(v5, post, r + 20, b);
            pass_post(v6, post, r + 24, b);
            pass_post(v7, post, r + 28, b);
        }
    }
}

/* dst = H (pre(src)), post applied to the result (dst may be src). */
AVX2_INLINE void fwht_pass(const void *src, echo_dtype dt, float *dst, int G, const pass_ops *pre,
                           const pass_ops *post) {
    const pass_ops none = {0};
    pass_a(src, dt, dst, G, pre, G > 32 ? &none : post);
    if (G > 32) pass_b(dst, G, post);
}

/* b[0..G) = D H src / G (echo_had_inv; b may be src). */
AVX2_INLINE void had_inv_buf(const float *src, float *b, const had_vecs *d, int G) {
    const pass_ops none = {0}, post = {.inv = d->inv};
    fwht_pass(src, ECHO_F32, b, G, &none, &post);
}

AVX2_INLINE void rotf_impl(const void *x, echo_dtype dt, size_t n, size_t np, int G, float *out) {
    had_vecs d;
    had_vecs_init(&d, G);
    const pass_ops pre = {.mul = d.mul}, none = {0};
    size_t off = 0, esz = echo_dtype_size(dt);
    for (; off + (size_t)G <= n; off += (size_t)G) {
        for (int j = 0; ECHO_PF > 0 && j < G / 8; j += 2)
            _mm_prefetch((const char *)x + (off + 8 * (size_t)j + ECHO_PF) * esz, _MM_HINT_T0);
        fwht_pass((const char *)x + off * esz, dt, out + off, G, &pre, &none);
    }
    if (off < np)
        echo_cpu_codec_scalar.rot_fwd((const char *)x + off * esz, dt, n > off ? n - off : 0, np - off, G, out + off);
}

/* 8 fp32 values as bf16 at o (echo_f32_to_bf16). */
AVX2_INLINE void store_bf16_8(uint16_t *o, __m256 v) {
    __m256i b = bf16_8(v);
    __m256i p = _mm256_packus_epi32(b, b); /* per 128-bit half: 0-3 | 4-7 */
    _mm_storel_epi64((__m128i *)o, _mm256_castsi256_si128(p));
    _mm_storel_epi64((__m128i *)(o + 4), _mm256_extracti128_si256(p, 1));
}

AVX2_INLINE void roti_impl(float *in, size_t n, int G, void *out, echo_dtype dt, int accumulate) {
    had_vecs d;
    had_vecs_init(&d, G);
    size_t off = 0;
    for (; off + (size_t)G <= n; off += (size_t)G) {
        had_inv_buf(in + off, in + off, &d, G);
        if (!out) continue;
        for (int j = 0; ECHO_PF > 0 && j < G / 8; j += 2)
            _mm_prefetch((char *)out + (off + 8 * (size_t)j + ECHO_PF) * echo_dtype_size(dt), _MM_HINT_T0);
        UNROLL
        for (int j = 0; j < G / 8; j++) {
            size_t i = off + 8 * (size_t)j;
            __m256 v = _mm256_loadu_ps(in + i);
            if (dt != ECHO_F32)
                store_bf16_8((uint16_t *)out + i, v);
            else if (accumulate)
                _mm256_storeu_ps((float *)out + i, add_acc(_mm256_loadu_ps((float *)out + i), v));
            else
                _mm256_storeu_ps((float *)out + i, v);
        }
    }
    if (off < n)
        echo_cpu_codec_scalar.rot_inv(in + off, n - off, G, out ? (char *)out + off * echo_dtype_size(dt) : NULL, dt,
                                      accumulate);
}


AVX2_FN void echo_avx2_rot_fwd(const void *x, echo_dtype dt, size_t n, size_t np, int group, float *out){
#define RF(G) rotf_impl(x, dt, n, np, G, out)
    ECHO_CPU_FOR_EACH_G(group, RF, echo_cpu_codec_scalar.rot_fwd(x, dt, n, np, group, out))
#undef RF
}

AVX2_FN void echo_avx2_rot_inv(float *in, size_t n, int group, void *out, echo_dtype dt, int accumulate){
#define RI(G) roti_impl(in, n, G, out, dt, accumulate)
    ECHO_CPU_FOR_EACH_G(group, RI, echo_cpu_codec_scalar.rot_inv(in, n, group, out, dt, accumulate))
#undef RI
}

/* Index of the first lane of a[0..G/8) equal to m (one exists). */
AVX2_INLINE int first_eq(const int32_t *a, int G, uint32_t m) {
    const __m256i mv = _mm256_set1_epi32((int)m);
    for (int j = 0; j < G / 8; j++) {
        int k = _mm256_movemask_ps(
            _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_load_si256((const __m256i *)(a + 8 * j)), mv)));
        if (k) return 8 * j + __builtin_ctz((unsigned)k);
    }
    return 0;
}

/* All-ones in lane i % 8 of a vector. */
AVX2_INLINE __m256i lane_mask(int i) {
    return _mm256_cmpeq_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(i & 7));
}

/* o + v on one lane, o the first operand (add_acc). */
AVX2_INLINE float add_acc1(float o, float v) {
    return _mm_cvtss_f32(_mm256_castps256_ps128(add_acc(_mm256_set1_ps(o), _mm256_set1_ps(v))));
}

/* hnf3's 8 codes of v (u / s) as int32 lanes: sign (4) | the number of
 * thresholds at or below |v| (echo_nf3_code). */
AVX2_INLINE __m256i nf3_code8(__m256 t) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_andnot_ps(sign, t);
    __m256i c = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(t, _mm256_setzero_ps(), _CMP_LT_OQ)),
                                 _mm256_set1_epi32(4));
    /* each true compare is -1: subtracting counts it */
    c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(ECHO_NF3_T1), _CMP_GE_OQ)));
    c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(ECHO_NF3_T2), _CMP_GE_OQ)));
    return _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(ECHO_NF3_T3), _CMP_GE_OQ)));
}

/* The levels of 8 codes, times s (echo_nf3_level(c) * s). */
AVX2_INLINE __m256 nf3_value8(__m256i c, __m256 s) {
    const __m256 lv = _mm256_setr_ps(echo_nf3_level(0), echo_nf3_level(1), echo_nf3_level(2), echo_nf3_level(3),
                                     echo_nf3_level(4), echo_nf3_level(5), echo_nf3_level(6), echo_nf3_level(7));
    return _mm256_mul_ps(_mm256_permutevar8x32_ps(lv, c), s);
}

/* The 8 codes of the 24-bit word at c (echo_nf3_get of 8 values). */
AVX2_INLINE __m256i nf3_unpack8(const uint8_t *c) {
    uint32_t w = (uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)),
                            _mm256_set1_epi32(7));
}

/* echo_nf3_rms of the group in u (mu: its largest |u| bits, 0 < mu < 2^127):
 * lane l of the vector sum is the scalar's partial sum l, in the same order. */
AVX2_INLINE uint16_t nf3_rms(const float *u, int G, uint32_t mu) {
    int e = (int)(mu >> 23);
    e = e < 1 ? 1 : e;
    const __m256 p = _mm256_set1_ps(echo_bits_f32((uint32_t)(254 - e) << 23));
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < G / 8; j++) {
        __m256 v = _mm256_mul_ps(_mm256_load_ps(u + 8 * j), p);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
    }
    float a[8] __attribute__((aligned(32)));
    _mm256_store_ps(a, acc);
    float b0 = a[0] + a[4], b1 = a[1] + a[5], b2 = a[2] + a[6], b3 = a[3] + a[7];
    float sum = (b0 + b2) + (b1 + b3);
    uint16_t h = echo_f32_to_bf16(echo_sqrt(sum / (float)G) * echo_bits_f32((uint32_t)e << 23));
    return h ? h : (uint16_t)1u;
}

/* One full out2 (rot = 0), hout2 (rot = 1) or hnf3 (rot = 1, nf3 = 1) group:
 * echo_out2_encode_group / echo_hout2_encode_group / echo_hnf3_encode_group
 * on y = x (+ res when hr); res = the residual when hw. out2 is hout2 without the rotation, bit for bit: its outliers'
 * codes are those of a zeroed value, its third largest |y| is the largest
 * once they are zeroed, and y - (+0) is y for the residual of a zero group.
 * The outliers' residuals are patched in afterwards with scalar stores. */
AVX2_INLINE uint16_t o2_enc_group(const float *x, float *res, int hr, int hw, int rot, int nf3, int G,
                                  const had_vecs *d, uint8_t *codes, uint8_t *rec) {
    float yb[ECHO_MAX_GROUP] __attribute__((aligned(32))), ub[ECHO_MAX_GROUP] __attribute__((aligned(32)));
    int32_t ab[ECHO_MAX_GROUP] __attribute__((aligned(32)));
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    __m256i mx = _mm256_setzero_si256();
    for (int j = 0; ECHO_PF > 0 && j < G / 8; j += 2) {
        _mm_prefetch((const char *)(x + 8 * j + ECHO_PF), _MM_HINT_T0);
        if (hr) _mm_prefetch((const char *)(res + 8 * j + ECHO_PF), _MM_HINT_T0);
    }
    UNROLL
    for (int j = 0; j < G / 8; j++) {
        __m256 y = _mm256_loadu_ps(x + 8 * j);
        if (hr) y = _mm256_add_ps(y, _mm256_loadu_ps(res + 8 * j));
        __m256i a = _mm256_and_si256(_mm256_castps_si256(y), abs);
        _mm256_store_ps(yb + 8 * j, y);
        _mm256_store_si256((__m256i *)(ab + 8 * j), a);
        mx = _mm256_max_epi32(mx, a);
    }
    /* the first largest |y| (integer compare: nan/inf are the largest), then
     * the first largest of the others */
    uint32_t m = hmax8(mx);
    int i1 = first_eq(ab, G, m);
    /* Vector read-modify-writes, not scalar stores: a vector load of a
     * scalar store that is still in flight stalls until it retires. */
    __m256i *ab1 = (__m256i *)(ab + (i1 & ~7));
    _mm256_store_si256(ab1, _mm256_or_si256(_mm256_load_si256(ab1), lane_mask(i1))); /* -1: below every |y| */
    mx = _mm256_setzero_si256();
    UNROLL
    for (int j = 0; j < G / 8; j++)
        mx = _mm256_max_epi32(mx, _mm256_load_si256((const __m256i *)(ab + 8 * j)));
    int i2 = first_eq(ab, G, hmax8(mx));
    float y1 = yb[i1], y2 = yb[i2];
    /* zero the outliers (restored in the residual below) */
    _mm256_store_ps(yb + (i1 & ~7),
                    _mm256_andnot_ps(_mm256_castsi256_ps(lane_mask(i1)), _mm256_load_ps(yb + (i1 & ~7))));
    _mm256_store_ps(yb + (i2 & ~7),
                    _mm256_andnot_ps(_mm256_castsi256_ps(lane_mask(i2)), _mm256_load_ps(yb + (i2 & ~7))));
    /* u = the group without its outliers (rotated for hout2) in ub; mu its largest |u| */
    mx = _mm256_setzero_si256();
    if (rot) {
        const pass_ops pre = {.neg = d->neg}, post = {.mx = &mx};
        fwht_pass(yb, ECHO_F32, ub, G, &pre, &post);
    } else {
        UNROLL
        for (int j = 0; j < G / 8; j++)
            mx = _mm256_max_epi32(mx, _mm256_and_si256(_mm256_load_si256((const __m256i *)(yb + 8 * j)), abs));
    }
    const float *u = rot ? ub : yb;
    uint32_t mu = hmax8(mx);
    uint16_t sb = m >= ECHO_LIMIT_BITS || mu >= ECHO_LIMIT_BITS ? ECHO_SCALE_POISON
                  : !nf3 || !mu                                 ? echo_scale_from_absbits(mu)
                                                                : nf3_rms(u, G, mu);
    int poison = echo_scale_is_poison(sb), ok = sb != 0 && !poison;
    uint16_t o1 = poison ? ECHO_SCALE_POISON : echo_f32_to_bf16(y1);
    uint16_t o2 = poison ? ECHO_SCALE_POISON : echo_f32_to_bf16(y2);
    rec[0] = (uint8_t)sb, rec[1] = (uint8_t)(sb >> 8);
    rec[2] = (uint8_t)o1, rec[3] = (uint8_t)(o1 >> 8);
    rec[4] = (uint8_t)o2, rec[5] = (uint8_t)(o2 >> 8);
    rec[6] = (uint8_t)i1, rec[7] = (uint8_t)i2;
    if (hw && poison) {
        UNROLL
        for (int j = 0; j < G / 8; j++)
            _mm256_storeu_ps(res + 8 * j, _mm256_setzero_ps());
    }
    if (!ok) {
        memset(codes, 0, nf3 ? (size_t)G / 8 * 3 : (size_t)G / 2);
        if (!hw || poison) return sb;
        /* a zero scale: the decoded group is 0 but for the outliers (q*s =
         * +0, rotated back to +-0) */
        UNROLL
        for (int j = 0; j < G / 8; j++)
            _mm256_store_ps(ub + 8 * j, _mm256_setzero_ps());
    } else if (nf3) {
        /* codes, 8 to a 24-bit word, and the decoded levels into ub */
        const __m256 s = _mm256_set1_ps(echo_bf16_to_f32(sb));
        const __m256i sh = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
        int32_t w[ECHO_MAX_GROUP] __attribute__((aligned(32)));
        UNROLL
        for (int j = 0; j < G / 8; j++) {
            __m256i c = nf3_code8(_mm256_div_ps(_mm256_load_ps(u + 8 * j), s));
            _mm256_store_si256((__m256i *)(w + 8 * j), _mm256_sllv_epi32(c, sh));
            if (hw) _mm256_store_ps(ub + 8 * j, nf3_value8(c, s));
        }
        for (int j = 0; j < G / 8; j++) {
            const int32_t *t = w + 8 * j;
            uint32_t v = (uint32_t)(t[0] | t[1] | t[2] | t[3] | t[4] | t[5] | t[6] | t[7]);
            codes[3 * j] = (uint8_t)v, codes[3 * j + 1] = (uint8_t)(v >> 8), codes[3 * j + 2] = (uint8_t)(v >> 16);
        }
        if (!hw) return sb;
    } else {
        /* codes, and the dequantized q*s into ub (the decoder's values before its inverse rotation) */
        const __m256 s = _mm256_set1_ps(echo_bf16_to_f32(sb));
        UNROLL
        for (int j = 0; j < G / 8; j += 4) {
            __m256i qi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                             _mm256_setzero_si256()};
            for (int t = 0; t < 4 && j + t < G / 8; t++) {
                __m256 q = rint8(_mm256_div_ps(_mm256_load_ps(u + 8 * (j + t)), s));
                qi[t] = _mm256_cvttps_epi32(q);
                if (hw) _mm256_store_ps(ub + 8 * (j + t), _mm256_mul_ps(q, s));
            }
            __m128i b = pack32(qi[0], qi[1], qi[2], qi[3]);
            if (G == 16)
                _mm_storel_epi64((__m128i *)codes, b);
            else
                _mm_storeu_si128((__m128i *)(codes + j * 4), b);
        }
        if (!hw) return sb;
    }
    /* the residual: y minus the decoded group (echo_hrot_finish; res is
     * pass A's scratch) */
    if (rot) {
        const pass_ops none = {0}, post = {.inv = d->inv, .ysub = yb};
        fwht_pass(ub, ECHO_F32, res, G, &none, &post);
    } else {
        UNROLL
        for (int j = 0; j < G / 8; j++)
            _mm256_storeu_ps(res + 8 * j, _mm256_sub_ps(_mm256_load_ps(yb + 8 * j), _mm256_load_ps(ub + 8 * j)));
    }
    res[i1] = y1 - echo_bf16_to_f32(o1);
    res[i2] = y2 - echo_bf16_to_f32(o2);
    return sb;
}

AVX2_INLINE size_t o2_enc_impl(const float *y, float *res, int hr, int hw, int rot, int nf3, size_t n, int G,
                               uint8_t *codes, uint8_t *recs, size_t *bad) {
    had_vecs d;
    if (rot) had_vecs_init(&d, G);
    size_t npoison = 0;
    for (size_t off = 0; off + (size_t)G <= n; off += (size_t)G) {
        uint16_t sb = o2_enc_group(y + off, hw ? res + off : NULL, hr, hw, rot, nf3, G, &d,
                                   codes + (nf3 ? off / 8 * 3 : off / 2), recs + off / (size_t)G * ECHO_OUT2_REC);
        if (echo_scale_is_poison(sb) && !npoison++) *bad = off;
    }
    return npoison;
}

/* out2 / hout2 / hnf3 with the residual's use known at compile time. */
AVX2_INLINE size_t o2_enc_variants(const float *y, float *res, int res_valid, int rot, int nf3, size_t n, int G,
                                   uint8_t *codes, uint8_t *recs, size_t *bad) {
    if (!res) return o2_enc_impl(y, res, 0, 0, rot, nf3, n, G, codes, recs, bad);
    if (res_valid) return o2_enc_impl(y, res, 1, 1, rot, nf3, n, G, codes, recs, bad);
    return o2_enc_impl(y, res, 0, 1, rot, nf3, n, G, codes, recs, bad);
}

/* ---- hsub6: a scale per 16 values under the group's bf16 one (G = 64,
 * 128, 256: 4, 8 or 16 sub-groups, one per lane) ---- */

/* echo_sub_scale on 8 lanes: S * 2^(-e/4) rounded up to bf16, never 0. */
AVX2_INLINE __m256 sub_scale8(__m256 S, __m256i e) {
    const __m256 qoct = _mm256_setr_ps(echo_qoct(0), echo_qoct(1), echo_qoct(2), echo_qoct(3), echo_qoct(0),
                                       echo_qoct(1), echo_qoct(2), echo_qoct(3));
    __m256 q = _mm256_permutevar8x32_ps(qoct, _mm256_and_si256(e, _mm256_set1_epi32(3)));
    __m256 p =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(127), _mm256_srli_epi32(e, 2)), 23));
    __m256i up = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_castps_si256(_mm256_mul_ps(_mm256_mul_ps(S, q), p)), _mm256_set1_epi32(0xffff)), 16);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_max_epi32(up, _mm256_set1_epi32(1)), 16));
}

/* echo_sub_exp on 8 lanes (a: the sub-groups' largest |y|, finite). Its
 * bound e + b <= 63 always holds: before step b, e <= 64 - 2b. */
AVX2_INLINE __m256i sub_exp8(__m256 S, __m256 a) {
    __m256i e = _mm256_setzero_si256();
    for (int b = 32; b; b >>= 1) {
        __m256i c = _mm256_add_epi32(e, _mm256_set1_epi32(b));
        __m256 ok = _mm256_cmp_ps(_mm256_mul_ps(sub_scale8(S, c), _mm256_set1_ps(7.0f)), a, _CMP_GE_OQ);
        e = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(e), _mm256_castsi256_ps(c), ok));
    }
    return e;
}

/* One full hsub6 group: echo_hsub_encode_group on y = x (+ res when hr),
 * res = the residual when hw. An all-zero or poisoned group goes to it. */
AVX2_INLINE uint16_t hsub_enc_group(const float *x, float *res, int hr, int hw, int G, uint8_t *codes, uint8_t *rec) {
    float yb[ECHO_MAX_GROUP] __attribute__((aligned(32)));
    __m256i sm[16];
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    const int K = G / ECHO_SUB;
    for (int j = 0; ECHO_PF > 0 && j < G / 8; j += 2) {
        _mm_prefetch((const char *)(x + 8 * j + ECHO_PF), _MM_HINT_T0);
        if (hr) _mm_prefetch((const char *)(res + 8 * j + ECHO_PF), _MM_HINT_T0);
    }
    for (int k = 0; k < 16; k++) {
        sm[k] = _mm256_setzero_si256();
        for (int t = 0; k < K && t < 2; t++) {
            __m256 y = _mm256_loadu_ps(x + 16 * k + 8 * t);
            if (hr) y = _mm256_add_ps(y, _mm256_loadu_ps(res + 16 * k + 8 * t));
            _mm256_store_ps(yb + 16 * k + 8 * t, y);
            sm[k] = _mm256_max_epi32(sm[k], _mm256_and_si256(_mm256_castps_si256(y), abs));
        }
    }
    __m256i am[2] = {hmax8x8(sm), hmax8x8(sm + 8)}; /* lane k: sub-group k's (8 + k's) largest |y| */
    uint16_t sb = echo_scale_from_absbits(hmax8(_mm256_max_epi32(am[0], am[1])));
    if (sb == 0 || echo_scale_is_poison(sb)) return echo_hsub_encode_group(yb, G, codes, rec, hw ? res : NULL, G);
    const __m256 S = _mm256_set1_ps(echo_bf16_to_f32(sb));
    __m256 sc[2];
    int32_t e[16] __attribute__((aligned(32)));
    for (int h = 0; h < 2; h++) {
        __m256i eh = sub_exp8(S, _mm256_castsi256_ps(am[h]));
        sc[h] = sub_scale8(S, eh);
        _mm256_store_si256((__m256i *)(e + 8 * h), eh);
    }
    rec[0] = (uint8_t)(sb & 0xffu);
    rec[1] = (uint8_t)(sb >> 8);
    for (int k = 0; k < K; k += 4) {
        uint32_t w = (uint32_t)e[k] | (uint32_t)e[k + 1] << 6 | (uint32_t)e[k + 2] << 12 | (uint32_t)e[k + 3] << 18;
        uint8_t *t = rec + 2 + 3 * (k / 4);
        t[0] = (uint8_t)w, t[1] = (uint8_t)(w >> 8), t[2] = (uint8_t)(w >> 16);
    }
    /* codes and residuals, two sub-groups (32 values) at a time */
    for (int k = 0; k < K; k += 2) {
        __m256i qi[4];
        for (int t = 0; t < 4; t++) {
            int kk = k + t / 2;
            __m256 s = _mm256_permutevar8x32_ps(sc[kk >> 3], _mm256_set1_epi32(kk & 7));
            __m256 y = _mm256_load_ps(yb + 16 * k + 8 * t);
            __m256 q = rint8(_mm256_div_ps(y, s));
            qi[t] = _mm256_cvttps_epi32(q);
            if (hw) _mm256_storeu_ps(res + 16 * k + 8 * t, _mm256_sub_ps(y, _mm256_mul_ps(q, s)));
        }
        _mm_storeu_si128((__m128i *)(codes + 8 * k), pack32(qi[0], qi[1], qi[2], qi[3]));
    }
    return sb;
}

AVX2_INLINE size_t hsub_enc_impl(const float *y, float *res, int hr, int hw, size_t n, int G, uint8_t *codes,
                                 uint8_t *recs, size_t *bad) {
    size_t npoison = 0, rb = (size_t)echo_hsub_rec_bytes(G);
    for (size_t off = 0; off + (size_t)G <= n; off += (size_t)G) {
        uint16_t sb =
            hsub_enc_group(y + off, hw ? res + off : NULL, hr, hw, G, codes + off / 2, recs + off / (size_t)G * rb);
        if (echo_scale_is_poison(sb) && !npoison++) *bad = off;
    }
    return npoison;
}

/* Full hsub6 groups decoded (echo_hsub_decode_group), into out or added to it. */
AVX2_INLINE void hsub_dec_impl(const uint8_t *codes, const uint8_t *recs, size_t ng, int G, float *out,
                               int accumulate) {
    const int K = G / ECHO_SUB, rb = echo_hsub_rec_bytes(G);
    for (size_t g = 0; g < ng; g++) {
        const uint8_t *rec = recs + g * (size_t)rb, *c = codes + g * (size_t)G / 2;
        uint16_t sb = (uint16_t)(rec[0] | (rec[1] << 8));
        const __m256 S = _mm256_set1_ps(echo_bf16_to_f32(sb));
        /* a poisoned group decodes to NaN, a zero one to 0, as int4's */
        int ok = sb != 0 && !echo_scale_is_poison(sb);
        int32_t e[16] __attribute__((aligned(32))) = {0};
        for (int k = 0; k < K; k++)
            e[k] = echo_hsub_get_exp(rec, k);
        __m256 sc[2] = {S, S};
        for (int h = 0; ok && h < 2; h++)
            sc[h] = sub_scale8(S, _mm256_load_si256((const __m256i *)(e + 8 * h)));
        float *o = out + g * (size_t)G;
        for (int j = 0; ECHO_PF > 0 && j < G / 8; j += 2)
            _mm_prefetch((const char *)(o + 8 * j + ECHO_PF), _MM_HINT_T0);
        for (int k = 0; k < K; k += 2) {
            __m256i q[4];
            unpack32(c + 8 * k, 0, q);
            for (int t = 0; t < 4; t++) {
                int kk = k + t / 2;
                __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(q[t]),
                                         _mm256_permutevar8x32_ps(sc[kk >> 3], _mm256_set1_epi32(kk & 7)));
                float *p = o + 16 * k + 8 * t;
                _mm256_storeu_ps(p, accumulate ? add_acc(_mm256_loadu_ps(p), v) : v);
            }
        }
    }
}

/* Full out2 / hout2 groups decoded (echo_out2_decode_group,
 * echo_hout2_decode_group), into out or added to it. The outliers are
 * patched in afterwards, i1 then i2 (untrusted bytes: they may coincide). */
AVX2_INLINE void o2_dec_impl(const uint8_t *codes, const uint8_t *recs, size_t ng, int G, int rot, int nf3,
                             float *out, int accumulate) {
    had_vecs d;
    if (rot) had_vecs_init(&d, G);
    float b[ECHO_MAX_GROUP] __attribute__((aligned(32)));
    for (size_t g = 0; g < ng; g++) {
        const uint8_t *rec = recs + g * ECHO_OUT2_REC, *c = codes + g * (size_t)G / (nf3 ? 8 : 2) * (nf3 ? 3 : 1);
        const __m256 s = _mm256_set1_ps(echo_bf16_to_f32((uint16_t)(rec[0] | (rec[1] << 8))));
        int i1 = rec[6] % G, i2 = rec[7] % G;
        float *o = out + g * (size_t)G;
        for (int j = 0; ECHO_PF > 0 && j < G / 8; j += 2)
            _mm_prefetch((const char *)(o + 8 * j + ECHO_PF), _MM_HINT_T0);
        float a1 = o[i1], a2 = o[i2];
        if (nf3) {
            UNROLL
            for (int j = 0; j < G / 8; j++)
                _mm256_store_ps(b + 8 * j, nf3_value8(nf3_unpack8(c + 3 * j), s));
        } else {
            UNROLL
            for (int j = 0; j < G / 8; j += 4) {
                __m256i q[4];
                unpack32(c + (size_t)j * 4, G == 16, q);
                _mm256_store_ps(b + 8 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(q[0]), s));
                _mm256_store_ps(b + 8 * j + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(q[1]), s));
                if (G == 16) continue;
                _mm256_store_ps(b + 8 * j + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(q[2]), s));
                _mm256_store_ps(b + 8 * j + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(q[3]), s));
            }
        }
        if (rot) had_inv_buf(b, b, &d, G);
        if (accumulate) {
            UNROLL
            for (int j = 0; j < G / 8; j++)
                _mm256_storeu_ps(o + 8 * j, add_acc(_mm256_loadu_ps(o + 8 * j), _mm256_load_ps(b + 8 * j)));
        } else {
            UNROLL
            for (int j = 0; j < G / 8; j++)
                _mm256_storeu_ps(o + 8 * j, _mm256_load_ps(b + 8 * j));
        }
        float o1 = echo_bf16_to_f32((uint16_t)(rec[2] | (rec[3] << 8)));
        float o2 = echo_bf16_to_f32((uint16_t)(rec[4] | (rec[5] << 8)));
        o[i1] = accumulate ? add_acc1(a1, o1) : o1;
        o[i2] = accumulate ? add_acc1(a2, o2) : o2;
    }
}

/* The record forms' loops, as echo_codec.h's rows name them (codec_cpu.h's
 * echo_rec_enc_fn / echo_rec_dec_fn: whole groups, G a power of two in
 * [the row's min_group, 256]; forms.c checks, and runs the rest scalar).
 * ENC(G) and DEC(G) call a family's loop with G a constant. */
#define AVX2_FORM_LOOPS(stem, ENC, DEC)                                                                                \
    AVX2_FN size_t stem##_enc(const float *y, float *res, int res_valid, size_t n, int group, uint8_t *codes,          \
                              uint8_t *recs, size_t *bad) {                                                            \
        size_t np = 0;                                                                                                 \
        ECHO_CPU_FOR_EACH_G(group, ENC, (void)0)                                                                       \
        return np;                                                                                                     \
    }                                                                                                                  \
    AVX2_FN void stem##_dec(const uint8_t *codes, const uint8_t *recs, size_t ng, int group, float *out,               \
                            int accumulate) {                                                                          \
        ECHO_CPU_FOR_EACH_G(group, DEC, (void)0)                                                                       \
    }
#define HSUB_ENC(G) np = hsub_enc_impl(y, res, res && res_valid, res != NULL, n, G, codes, recs, bad)
#define HSUB_DEC(G) hsub_dec_impl(codes, recs, ng, G, out, accumulate)
AVX2_FORM_LOOPS(echo_avx2_hsub, HSUB_ENC, HSUB_DEC)
/* the out2 family: (rotate, nf3) = out2 (0, 0), hout2 (1, 0), hnf3 (1, 1) */
#define O2_ENC(rot, nf3, G) np = o2_enc_variants(y, res, res_valid, rot, nf3, n, G, codes, recs, bad)
#define O2_DEC(rot, nf3, G) o2_dec_impl(codes, recs, ng, G, rot, nf3, out, accumulate)
#define OUT2_ENC(G) O2_ENC(0, 0, G)
#define OUT2_DEC(G) O2_DEC(0, 0, G)
#define HOUT2_ENC(G) O2_ENC(1, 0, G)
#define HOUT2_DEC(G) O2_DEC(1, 0, G)
#define HNF3_ENC(G) O2_ENC(1, 1, G)
#define HNF3_DEC(G) O2_DEC(1, 1, G)
AVX2_FORM_LOOPS(echo_avx2_out2, OUT2_ENC, OUT2_DEC)
AVX2_FORM_LOOPS(echo_avx2_hout2, HOUT2_ENC, HOUT2_DEC)
AVX2_FORM_LOOPS(echo_avx2_hnf3, HNF3_ENC, HNF3_DEC)

/* The accumulator is prefetched: the loads of out are what hold a staged
 * decode-accumulate back (one with out prefetched measured 0.8 of memcpy
 * against 0.6 without). */
AVX2_FN void echo_avx2_add(const float *in, size_t n, float *out) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (ECHO_PF > 0) _mm_prefetch((const char *)(out + i + ECHO_PF), _MM_HINT_T0);
        _mm256_storeu_ps(out + i, add_acc(_mm256_loadu_ps(out + i), _mm256_loadu_ps(in + i)));
        _mm256_storeu_ps(out + i + 8, add_acc(_mm256_loadu_ps(out + i + 8), _mm256_loadu_ps(in + i + 8)));
    }
    echo_cpu_codec_scalar.add(in + i, n - i, out + i);
}

const echo_cpu_codec echo_cpu_codec_avx2 = {
    .name = "avx2",
    .isa = ECHO_ISA_AVX2,
    .encode = echo_avx2_encode,
    ECHO_CPU_CODEC_AVX2_SHARED,
};

#endif
