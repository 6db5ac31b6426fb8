/*
 * The vector body of matmul_a8.c, included once per target: A8_ATTR (the
 * target attribute), A8_SUF (name suffix), A8_DOT(a, b) (the eight lanes
 * P_l of unsigned bytes a times signed bytes b) and A8_DOTS(a, b, s16, s32)
 * (the same, each lane times its scale: 16-bit copies in s16, 32-bit in
 * s32). Private to matmul_a8.c.
 */

A8_ATTR INL float A8_SUF(h16)(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* matmul_a8.c's tree over the 16 lanes (lo: even blocks, hi: odd). */
A8_ATTR INL float A8_SUF(tree)(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

/* The 32 fifth bits of a Q5_0 / Q5_1 block (bit k: element k) as bytes
 * 16 or 0 (llama.cpp's bytes_from_bits_32). */
A8_ATTR INL __m256i A8_SUF(bit16)(const uint8_t *qh) {
    uint32_t x;
    memcpy(&x, qh, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i v = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf),
                                _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(16));
}

/* Block b: its weights as 32 bytes (unsigned for Q4_K, Q5_K, Q5_1, signed
 * for Q6_K, Q5_0), scale dw, min mn, Q6_K's lane scales. */
A8_ATTR INL __m256i A8_SUF(unpack)(const kern_dtype dt, const uint8_t *row, int b, float *dw, float *mn,
                                     __m256i *s16, __m256i *s32) {
    switch (dt) {
    case KERN_Q4_K_A8: {
        const uint8_t *p = row + (size_t)144 * (b >> 3);
        int j = b & 7, sc, m;
        cpu_k_scale_min(p + 4, j, &sc, &m);
        *dw = A8_SUF(h16)(p) * (float)sc;
        *mn = -(A8_SUF(h16)(p + 2) * (float)m);
        __m256i x = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * (j >> 1)));
        return _mm256_and_si256(_mm256_srli_epi16(x, 4 * (j & 1)), _mm256_set1_epi8(15));
    }
    case KERN_Q5_K_A8: {
        const uint8_t *p = row + (size_t)176 * (b >> 3);
        int j = b & 7, sc, m;
        cpu_k_scale_min(p + 4, j, &sc, &m);
        *dw = A8_SUF(h16)(p) * (float)sc;
        *mn = -(A8_SUF(h16)(p + 2) * (float)m);
        __m256i x = _mm256_loadu_si256((const __m256i *)(p + 48 + 32 * (j >> 1)));
        __m256i h = _mm256_loadu_si256((const __m256i *)(p + 16));
        __m256i lo = _mm256_and_si256(_mm256_srli_epi16(x, 4 * (j & 1)), _mm256_set1_epi8(15));
        __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j), _mm256_set1_epi8(1)), 4);
        return _mm256_or_si256(lo, hi);
    }
    case KERN_Q5_0_A8:
    case KERN_Q5_1_A8: {
        const int q51 = dt == KERN_Q5_1_A8;
        const uint8_t *p = row + (size_t)(q51 ? 24 : 22) * b, *qh = p + (q51 ? 4 : 2);
        *dw = A8_SUF(h16)(p);
        if (q51) *mn = A8_SUF(h16)(p + 2);
        __m128i x = _mm_loadu_si128((const __m128i *)(qh + 4));
        __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(15));
        u = _mm256_or_si256(u, A8_SUF(bit16)(qh));
        return q51 ? u : _mm256_sub_epi8(u, _mm256_set1_epi8(16));
    }
    default: { /* KERN_Q6_K_A8 */
        const uint8_t *p = row + (size_t)210 * (b >> 3);
        int bb = b & 7, h = bb >> 2, s = bb & 3;
        __m256i l = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32 * (s & 1)));
        __m256i hb = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
        __m256i lo = _mm256_and_si256(_mm256_srli_epi16(l, 4 * (s >> 1)), _mm256_set1_epi8(15));
        __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * s), _mm256_set1_epi8(3)), 4);
        int sc0 = (int8_t)p[192 + 2 * bb], sc1 = (int8_t)p[193 + 2 * bb];
        *s16 = _mm256_set_m128i(_mm_set1_epi16((short)sc1), _mm_set1_epi16((short)sc0));
        *s32 = _mm256_set_m128i(_mm_set1_epi32(sc1), _mm_set1_epi32(sc0));
        *dw = A8_SUF(h16)(p + 208);
        return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
    }
    }
}

/* Block b of R rows (ws bytes apart) for T tokens into their accumulators
 * acc[r * T + t] (b's parity) and mins mt[r * T + t]. */
A8_ATTR INL void A8_SUF(block)(const kern_dtype dt, const int T, const int R, const uint8_t *row, size_t ws, int b,
                                  const int8_t *const *q, const float *const *dx, const float *const *sx, __m256 *acc,
                                  float *mt) {
    const int sgn = dt == KERN_Q6_K_A8 || dt == KERN_Q5_0_A8;
    const int has_min = dt == KERN_Q4_K_A8 || dt == KERN_Q5_K_A8 || dt == KERN_Q5_1_A8;
    __m256i qv[4];
    for (int t = 0; t < T; t++) qv[t] = _mm256_loadu_si256((const __m256i *)(q[t] + 32 * b));
    for (int r = 0; r < R; r++) {
        float dw, mn = 0;
        __m256i s16 = _mm256_setzero_si256(), s32 = s16;
        __m256i w = A8_SUF(unpack)(dt, row + (size_t)r * ws, b, &dw, &mn, &s16, &s32);
        __m256i aw = sgn ? _mm256_abs_epi8(w) : w;
        for (int t = 0; t < T; t++) {
            __m256i x = sgn ? _mm256_sign_epi8(qv[t], w) : qv[t];
            __m256i p = dt == KERN_Q6_K_A8 ? A8_DOTS(aw, x, s16, s32) : A8_DOT(aw, x);
            acc[r * T + t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx[t][b]), _mm256_cvtepi32_ps(p), acc[r * T + t]);
            if (has_min) mt[r * T + t] = fmaf(mn, sx[t][b], mt[r * T + t]);
        }
    }
}

/* T tokens x R rows into o[t * ldo + r]. */
A8_ATTR INL void A8_SUF(tile_t)(const kern_dtype dt, const int T, const int R, const uint8_t *row, size_t ws,
                                   const a8_acts *a, int t0, float *o, size_t ldo) {
    const int8_t *q[4];
    const float *dx[4], *sx[4];
    __m256 ev[4], od[4];
    float mt[4];
    for (int t = 0; t < T; t++) {
        q[t] = a->q + (size_t)(t0 + t) * a->K;
        dx[t] = a->dx + (size_t)(t0 + t) * a->nb;
        sx[t] = a->sx + (size_t)(t0 + t) * a->nb;
    }
    for (int i = 0; i < R * T; i++) {
        ev[i] = od[i] = _mm256_setzero_ps();
        mt[i] = 0;
    }
    const size_t per = kern_dtype_block_bytes(dt); /* bytes per ggml block */
    const int sub = kern_dtype_block(dt) / 32;     /* 32-blocks per ggml block */
    int b = 0, nb = a->nb;
    for (; b + 2 <= nb; b += 2) {
        if (T <= 2)
            for (int r = 0; r < R; r++)
                _mm_prefetch((const char *)row + (size_t)r * ws + (size_t)(b / sub) * per + A8_PF, _MM_HINT_T0);
        A8_SUF(block)(dt, T, R, row, ws, b, q, dx, sx, ev, mt);
        A8_SUF(block)(dt, T, R, row, ws, b + 1, q, dx, sx, od, mt);
    }
    if (b < nb) A8_SUF(block)(dt, T, R, row, ws, b, q, dx, sx, ev, mt);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            o[(size_t)t * ldo + r] = A8_SUF(tree)(ev[r * T + t], od[r * T + t]) + mt[r * T + t];
}

/* T tokens x R rows: one token 4 rows at a time, two tokens 2, more 1. */
A8_ATTR static void A8_SUF(tile)(kern_dtype dt, int T, int R, const uint8_t *row, size_t ws, const a8_acts *a, int t0,
                                  float *o, size_t ldo) {
#define A8_ROWS(DT, TT, RR)                                                                                    \
    for (; r + RR <= R; r += RR) A8_SUF(tile_t)(DT, TT, RR, row + (size_t)r * ws, ws, a, t0, o + r, ldo);
#define A8_CASES(DT)                                                                                           \
    switch (T) {                                                                                              \
    case 4: A8_ROWS(DT, 4, 1) return;                                                                         \
    case 3: A8_ROWS(DT, 3, 1) return;                                                                         \
    case 2:                                                                                                   \
        A8_ROWS(DT, 2, 2)                                                                                     \
        A8_ROWS(DT, 2, 1)                                                                                     \
        return;                                                                                               \
    default:                                                                                                  \
        A8_ROWS(DT, 1, 2)                                                                                     \
        A8_ROWS(DT, 1, 1)                                                                                     \
        return;                                                                                               \
    }
    int r = 0;
    switch (dt) {
    case KERN_Q4_K_A8: A8_CASES(KERN_Q4_K_A8)
    case KERN_Q5_K_A8: A8_CASES(KERN_Q5_K_A8)
    case KERN_Q5_0_A8: A8_CASES(KERN_Q5_0_A8)
    case KERN_Q5_1_A8: A8_CASES(KERN_Q5_1_A8)
    default: A8_CASES(KERN_Q6_K_A8)
    }
#undef A8_CASES
#undef A8_ROWS
}
