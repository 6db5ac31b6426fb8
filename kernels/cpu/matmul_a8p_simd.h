/*
 * The vector body of matmul_a8p.c, included once per target: PK_ATTR,
 * PK_SUF (name suffix), PK_VNNI (1: vpdpbusd into 32-bit sums; 0: AVX2's
 * vpmaddubsw into 16-bit sums, widened before they can overflow). Private
 * to matmul_a8p.c.
 */

/* A ggml block's 8 rows of high bits, moved to bits 4 (hb 1) or 4..5
 * (hb 2) of element 4c + k's byte (lo) or element 4(c + 4) + k's (hi). */
PK_ATTR INL __m256i PK_SUF(shift16)(__m256i v, const int s) {
    return s > 0 ? _mm256_slli_epi16(v, s) : s < 0 ? _mm256_srli_epi16(v, -s) : v;
}

/* T tokens x one group of a type (kind, sub, hb, off as in pk_type). */
PK_ATTR INL void PK_SUF(tile_t)(const int kind, const int sub, const int hb, const int off, const int head,
                                   const int T, const pk_tile *p) {
    const pk_acts *a = p->a;
    const size_t gb = (size_t)PG * kern_dtype_block_bytes(p->ty->dt); /* a group's bytes per ggml block */
    const size_t bodyb = (size_t)32 * hb + 128;
    const int8_t *q[4];
    const float *dx[4], *sx[4];
    const int32_t *qs[4], *qlo[4];
    __m256 acc[4], mt[4];
    for (int t = 0; t < T; t++) {
        q[t] = a->q + (size_t)(p->t0 + t) * a->K;
        dx[t] = a->dx + (size_t)(p->t0 + t) * a->nb;
        sx[t] = a->sx + (size_t)(p->t0 + t) * a->nb;
        qs[t] = a->qs + (size_t)(p->t0 + t) * a->nb;
        qlo[t] = kind == PK_K6 ? p->qlo + (size_t)(p->t0 + t) * a->nb : NULL;
        acc[t] = mt[t] = _mm256_setzero_ps();
    }
    const __m256i f = _mm256_set1_epi8(15);
#if !PK_VNNI
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    const int nsb = a->nb / sub;
    for (int s = 0; s < nsb; s++) {
        const uint8_t *hd = p->grp + (size_t)s * gb;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hd));
        const __m256 dm = kind == PK_DM || kind == PK_K ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd + 16))) : d;
        for (int j = 0; j < sub; j++) {
            const int b = s * sub + j;
            const uint8_t *bd = hd + head + (size_t)j * bodyb, *nib = bd + 32 * hb;
            if (T <= 2) _mm_prefetch((const char *)bd + 1024, _MM_HINT_T0), _mm_prefetch((const char *)bd + 1088, _MM_HINT_T0);
            __m256 dw = d, mn = dm;
            __m256i sc0 = _mm256_setzero_si256(), sc1 = sc0;
            if (kind == PK_K) {
                __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(hd + 32 + 8 * j)));
                __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(hd + 96 + 8 * (j >> 1))));
                hi = _mm256_srli_epi32(hi, 4 * (j & 1));
                __m256i sc = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(15)),
                                             _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4));
                __m256i m = _mm256_or_si256(_mm256_srli_epi32(lo, 4),
                                            _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(12)), 2));
                dw = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
                mn = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(m));
            }
            if (kind == PK_K6) {
                sc0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(hd + 16 + 16 * j)));
                sc1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(hd + 24 + 16 * j)));
            }
            __m256i s0[4], s1[4];
#if !PK_VNNI
            __m256i h0[4], h1[4];
#endif
            for (int t = 0; t < T; t++) {
                s0[t] = s1[t] = _mm256_setzero_si256();
#if !PK_VNNI
                h0[t] = h1[t] = _mm256_setzero_si256();
#endif
            }
            __m256i qh0 = _mm256_setzero_si256(), qh1 = qh0;
            if (hb >= 1) qh0 = _mm256_loadu_si256((const __m256i *)bd);
            if (hb == 2) qh1 = _mm256_loadu_si256((const __m256i *)(bd + 32));
            for (int c = 0; c < 4; c++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(nib + 32 * c));
                __m256i lo = _mm256_and_si256(x, f), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), f);
                if (hb == 1) {
                    const __m256i b4 = _mm256_set1_epi8(16);
                    lo = _mm256_or_si256(lo, _mm256_and_si256(PK_SUF(shift16)(qh0, 4 - c), b4));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(PK_SUF(shift16)(qh0, -c), b4));
                }
                if (hb == 2) {
                    const __m256i b45 = _mm256_set1_epi8(0x30);
                    lo = _mm256_or_si256(lo, _mm256_and_si256(PK_SUF(shift16)(qh0, 4 - 2 * c), b45));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(PK_SUF(shift16)(qh1, 4 - 2 * c), b45));
                }
                for (int t = 0; t < T; t++) {
                    int32_t x0, x1;
                    memcpy(&x0, q[t] + 32 * b + 4 * c, 4);
                    memcpy(&x1, q[t] + 32 * b + 4 * (c + 4), 4);
                    const __m256i v0 = _mm256_set1_epi32(x0), v1 = _mm256_set1_epi32(x1);
#if PK_VNNI
                    s0[t] = _mm256_dpbusd_epi32(s0[t], lo, v0);
                    if (kind == PK_K6)
                        s1[t] = _mm256_dpbusd_epi32(s1[t], hi, v1);
                    else
                        s0[t] = _mm256_dpbusd_epi32(s0[t], hi, v1);
#else
                    h0[t] = _mm256_add_epi16(h0[t], _mm256_maddubs_epi16(lo, v0));
                    if (kind == PK_K6)
                        h1[t] = _mm256_add_epi16(h1[t], _mm256_maddubs_epi16(hi, v1));
                    else
                        h0[t] = _mm256_add_epi16(h0[t], _mm256_maddubs_epi16(hi, v1));
                    if (hb == 0 ? c == 3 : (c & 1)) {
                        s0[t] = _mm256_add_epi32(s0[t], _mm256_madd_epi16(h0[t], ones));
                        h0[t] = _mm256_setzero_si256();
                        if (kind == PK_K6) {
                            s1[t] = _mm256_add_epi32(s1[t], _mm256_madd_epi16(h1[t], ones));
                            h1[t] = _mm256_setzero_si256();
                        }
                    }
#endif
                }
            }
            for (int t = 0; t < T; t++) {
                __m256i is = s0[t];
                if (kind == PK_K6) {
                    __m256i a0 = _mm256_sub_epi32(s0[t], _mm256_set1_epi32(32 * qlo[t][b]));
                    __m256i a1 = _mm256_sub_epi32(s1[t], _mm256_set1_epi32(32 * (qs[t][b] - qlo[t][b])));
                    is = _mm256_add_epi32(_mm256_mullo_epi32(a0, sc0), _mm256_mullo_epi32(a1, sc1));
                } else if (off) {
                    is = _mm256_sub_epi32(is, _mm256_set1_epi32(off * qs[t][b]));
                }
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(dx[t][b])), _mm256_cvtepi32_ps(is), acc[t]);
                if (kind == PK_DM) mt[t] = _mm256_fmadd_ps(mn, _mm256_set1_ps(sx[t][b]), mt[t]);
                if (kind == PK_K) mt[t] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(sx[t][b]), mt[t]);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        float v[8];
        _mm256_storeu_ps(v, kind == PK_DM || kind == PK_K ? _mm256_add_ps(acc[t], mt[t]) : acc[t]);
        memcpy(p->o + (size_t)t * p->ldo, v, (size_t)p->nvalid * sizeof *v);
    }
}

/* The type's constants, then the token count, as compile-time values. */
PK_ATTR static void PK_SUF(tile)(const pk_tile *p) {
#define PK_T(KIND, SUB, HB, OFF, HEAD, T) PK_SUF(tile_t)(KIND, SUB, HB, OFF, HEAD, T, p)
#define PK_CASE(DT, SUB, HB, OFF, KIND, HEAD)                                                                  \
    case DT:                                                                                                  \
        switch (p->T) {                                                                                       \
        case 4: PK_T(KIND, SUB, HB, OFF, HEAD, 4); return;                                                    \
        case 3: PK_T(KIND, SUB, HB, OFF, HEAD, 3); return;                                                    \
        case 2: PK_T(KIND, SUB, HB, OFF, HEAD, 2); return;                                                    \
        default: PK_T(KIND, SUB, HB, OFF, HEAD, 1); return;                                                   \
        }
    switch (p->ty->dt) {
        PK_TYPES(PK_CASE)
    default: return;
    }
#undef PK_CASE
#undef PK_T
}
