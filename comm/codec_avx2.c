/*
 * comm/codec_avx2.c — the host codec's loops in AVX2 intrinsics
 * (echo_cpu_codec_avx2, comm/codec_cpu.h), for CPUs that have it;
 * echo_cpu_codec_best picks it at run time.
 *
 * Contract: bit-identical to echo_cpu_codec_scalar (codec.c over
 * comm/echo_codec.h) for every input: the same IEEE operations in the same
 * order on 8 lanes. The division y/s stays a division (a reciprocal would
 * change codes), rint is the same two adds of 1.5*2^23 (not vroundps, which
 * gives -0 where the adds give +0), and nothing here is built with FMA, so
 * no multiply-add can be contracted. Full groups are vectorized; a partial
 * last group, and group sizes outside 16..256, go to the scalar table.
 *
 * Why intrinsics rather than the scalar source built for AVX2: gcc's
 * vectorization of the scalar loops leaves the nibble packing and
 * unpacking and the per-group reduction largely scalar, which holds encode
 * to a fraction of memory bandwidth (docs/echo.md, section 8).
 */
#include "comm/codec_cpu.h"

#ifdef ECHO_HAVE_CODEC_AVX2

#include <immintrin.h>
#include <string.h>

#include "comm/echo_codec.h"

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

AVX2_FN static size_t avx2_encode(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t n,
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

AVX2_FN static void avx2_decode(const uint8_t *codes, const uint16_t *scales, size_t n, int group, float *out,
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

AVX2_FN static size_t avx2_decode_store(const uint8_t *codes, const uint16_t *scales, size_t n, int group, void *out,
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

const echo_cpu_codec echo_cpu_codec_avx2 = {
    .name = "avx2",
    .encode = avx2_encode,
    .decode = avx2_decode,
    .decode_store = avx2_decode_store,
};

#endif
