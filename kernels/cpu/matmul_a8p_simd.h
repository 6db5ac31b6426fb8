/*
 * The vector body of matmul_a8p.c, included once per target: PK_ATTR,
 * PK_SUF (name suffix), PK_ACC(s, u, x) (add the products of unsigned
 * bytes u and signed bytes x to the accumulator s), PK_FIN(s) (s as eight
 * 32-bit row sums). Private to matmul_a8p.c.
 */

PK_ATTR INL void PK_SUF(tile_t)(const kern_dtype dt, const int T, const pk_tile *p) {
    const int q41 = dt == KERN_Q4_1_A8;
    const pk_acts *a = p->a;
    const size_t bb = q41 ? 160 : 144;
    const int8_t *q[4];
    const float *dx[4], *sx[4];
    const int32_t *qs[4];
    __m256 acc[4], mt[4];
    for (int t = 0; t < T; t++) {
        q[t] = a->q + (size_t)(p->t0 + t) * a->K;
        dx[t] = a->dx + (size_t)(p->t0 + t) * a->nb;
        sx[t] = a->sx + (size_t)(p->t0 + t) * a->nb;
        qs[t] = a->qs + (size_t)(p->t0 + t) * a->nb;
        acc[t] = mt[t] = _mm256_setzero_ps();
    }
    const __m256i f = _mm256_set1_epi8(15);
    for (int b = 0; b < a->nb; b++) {
        const uint8_t *o = p->grp + (size_t)b * bb, *ch = o + (q41 ? 32 : 16);
        if (T <= 2) _mm_prefetch((const char *)o + 1024, _MM_HINT_T0), _mm_prefetch((const char *)o + 1088, _MM_HINT_T0);
        __m256i s[4];
        for (int t = 0; t < T; t++) s[t] = PK_ZERO();
        for (int c = 0; c < 4; c++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(ch + 32 * c));
            __m256i lo = _mm256_and_si256(x, f), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), f);
            for (int t = 0; t < T; t++) {
                int32_t x0, x1;
                memcpy(&x0, q[t] + 32 * b + 4 * c, 4);
                memcpy(&x1, q[t] + 32 * b + 4 * (c + 4), 4);
                s[t] = PK_ACC(s[t], lo, _mm256_set1_epi32(x0));
                s[t] = PK_ACC(s[t], hi, _mm256_set1_epi32(x1));
            }
        }
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
        __m256 m = q41 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16))) : d;
        for (int t = 0; t < T; t++) {
            __m256i is = PK_FIN(s[t]);
            if (!q41) is = _mm256_sub_epi32(is, _mm256_set1_epi32(8 * qs[t][b]));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(dx[t][b])), _mm256_cvtepi32_ps(is), acc[t]);
            if (q41) mt[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(sx[t][b]), mt[t]);
        }
    }
    for (int t = 0; t < T; t++) {
        float v[8];
        _mm256_storeu_ps(v, q41 ? _mm256_add_ps(acc[t], mt[t]) : acc[t]);
        memcpy(p->o + (size_t)t * p->ldo, v, (size_t)p->nvalid * sizeof *v);
    }
}

PK_ATTR static void PK_SUF(tile)(const pk_tile *p) {
#define PK_CASES(DT)                                                                                           \
    switch (p->T) {                                                                                           \
    case 4: PK_SUF(tile_t)(DT, 4, p); return;                                                                 \
    case 3: PK_SUF(tile_t)(DT, 3, p); return;                                                                 \
    case 2: PK_SUF(tile_t)(DT, 2, p); return;                                                                 \
    default: PK_SUF(tile_t)(DT, 1, p); return;                                                                \
    }
    if (p->dt == KERN_Q4_1_A8) PK_CASES(KERN_Q4_1_A8)
    PK_CASES(KERN_Q4_0_A8)
#undef PK_CASES
}
