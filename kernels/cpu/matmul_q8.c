/*
 * cpu: matmul with KERN_Q8_0_A8 weights -- Q8_0 weights times activations
 * quantized to 8 bits per 32-block, multiplied in integers (llama.cpp's
 * numerics for Q8_0; docs/bench-forward.md, "8-bit activations").
 *
 * Recipe, the same on every path (so the bits depend neither on the
 * instruction set nor on the tokens sharing a call):
 *   - each activation block of 32 is quantized: dx = amax / 127 (NaN if
 *     the block holds a NaN or an infinity), id = dx > 0 ? 1 / dx : 0,
 *     q = round-half-even(clamp(x * id, -127, 127)), clamp as
 *     v < 127 ? v : 127, then v > -127 ? v : -127;
 *   - out[t][r] = acc after, for blocks b in order,
 *     acc = fma(dw[r][b] * dx[t][b], (float)idot, acc), from acc = 0, where
 *     idot = sum of w[r][k] * q[t][k] over the block, exact in integers.
 *
 * Layout (private to this backend): rows in groups of KERN_ROW_GROUP = 16,
 * the last one padded with zero rows. A group of nb = cols / 32 blocks is
 * the nb x 16 fp16 scales (block-major), then nb x 8 quads of 64 bytes:
 * quad j of block b holds, for row i, w[i][32b + 4j .. 32b + 4j + 3] + 128
 * as unsigned bytes (what vpdpbusd multiplies). A group is the bytes of 16
 * Q8_0 rows, so a view starting at a row that is a multiple of 16 sits at
 * the offset it would have in Q8_0.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define G 16             /* rows per group: KERN_ROW_GROUP */
#define Q8_TASK_GROUPS 4 /* groups per task: 64 output rows */
#define Q8_TB 64         /* tokens per cache block */
#ifndef Q8_PF
#define Q8_PF 2048 /* bytes a 1-2 token tile prefetches ahead */
#endif

_Static_assert(G == KERN_ROW_GROUP, "the packed group is kernels.h's row group");

/* ---- packing (upload) ---- */

static size_t group_bytes(int64_t cols) {
    return (size_t)(cols / 32) * 34 * G;
}

typedef struct pack_args {
    const kern_weight *host;
    uint8_t *dst;
    int failed;
} pack_args;

/* One group: its rows as Q8_0 bytes (the host's, or quantized from fp32),
 * scattered into the packed layout. */
static void pack_task(void *arg, int g) {
    pack_args *a = arg;
    const kern_weight *h = a->host;
    int64_t cols = h->cols, ld = h->ld ? h->ld : cols;
    int nb = (int)(cols / 32);
    size_t row_bytes = (size_t)nb * 34;
    uint8_t *grp = a->dst + (size_t)g * group_bytes(cols), *quads = grp + (size_t)nb * 32;
    uint8_t *tmp = NULL;
    float *row = NULL;
    if (h->dtype != KERN_Q8_0) {
        tmp = malloc(row_bytes);
        row = malloc((size_t)cols * sizeof *row);
        if (!tmp || !row) {
            a->failed = 1;
            free(tmp);
            free(row);
            return;
        }
    }
    for (int i = 0; i < G; i++) {
        int64_t r = (int64_t)g * G + i;
        const uint8_t *src = NULL;
        if (r < h->rows && h->dtype == KERN_Q8_0) {
            src = (const uint8_t *)h->data + kern_dtype_bytes(KERN_Q8_0, r * ld);
        } else if (r < h->rows) {
            cpu_load_plain_rows(row, h, r, 1);
            cpu_quantize_q8_0(row, cols, tmp);
            src = tmp;
        }
        for (int b = 0; b < nb; b++) {
            uint8_t *sc = grp + (size_t)b * 32 + 2 * i, *qb = quads + (size_t)b * 512 + 4 * i;
            if (!src) { /* padding: scale 0, weights 0 */
                sc[0] = sc[1] = 0;
                for (int j = 0; j < 8; j++)
                    memset(qb + 64 * j, 0x80, 4);
                continue;
            }
            const uint8_t *blk = src + (size_t)b * 34;
            sc[0] = blk[0];
            sc[1] = blk[1];
            for (int j = 0; j < 8; j++)
                for (int k = 0; k < 4; k++)
                    qb[64 * j + k] = (uint8_t)(blk[2 + 4 * j + k] ^ 0x80);
        }
    }
    free(tmp);
    free(row);
}

int cpu_pack_q8a8(kern_backend *be, const kern_weight *host, kern_weight *dev) {
    if (host->dtype != KERN_Q8_0 && kern_dtype_block(host->dtype) != 1)
        return kern_fail(be, "upload_quantized: cannot make %s from %s", kern_dtype_name(KERN_Q8_0_A8),
                         kern_dtype_name(host->dtype));
    int64_t groups = (host->rows + G - 1) / G;
    size_t bytes = (size_t)groups * group_bytes(host->cols);
    uint8_t *buf = cpu_mem_alloc(be, bytes ? bytes : 64);
    if (!buf || cpu_owned_add(be, buf)) {
        free(buf);
        return kern_fail(be, "upload_quantized: out of memory for (%lld, %lld) %s", (long long)host->rows,
                         (long long)host->cols, kern_dtype_name(KERN_Q8_0_A8));
    }
    pack_args a = {host, buf, 0};
    if (groups > 0) cpu_parallel_for(be, (int)groups, pack_task, &a);
    if (a.failed) {
        cpu_owned_release(be, buf);
        return kern_fail(be, "upload_quantized: out of memory packing (%lld, %lld)", (long long)host->rows,
                         (long long)host->cols);
    }
    *dev = (kern_weight){buf, KERN_Q8_0_A8, host->rows, host->cols, 0};
    return 0;
}

void cpu_q8a8_row(const kern_weight *w, int64_t r, float *dst) {
    int nb = (int)(w->cols / 32), i = (int)(r % G);
    const uint8_t *grp = (const uint8_t *)w->data + (size_t)(r / G) * group_bytes(w->cols);
    const uint8_t *quads = grp + (size_t)nb * 32;
    for (int b = 0; b < nb; b++) {
        uint16_t h;
        memcpy(&h, grp + (size_t)b * 32 + 2 * i, 2);
        float d = kern_f16_to_f32(h);
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < 4; k++) /* quant.c's Q8_0 value: d * q */
                dst[32 * b + 4 * j + k] = d * (float)(int8_t)(quads[(size_t)b * 512 + 64 * j + 4 * i + k] ^ 0x80);
    }
}

/* ---- activations ---- */

typedef cpu_a8_acts qact; /* corr: -128 * sum of the block's q (the +128 of the weights) */

static inline float clamp127(float v) {
    v = v < 127.0f ? v : 127.0f;
    return v > -127.0f ? v : -127.0f;
}

static void quant_row_c(const float *x, int nb, int8_t *q, float *dx, int32_t *corr) {
    for (int b = 0; b < nb; b++, x += 32, q += 32) {
        float amax = 0, bad = 0;
        for (int k = 0; k < 32; k++) {
            float a = fabsf(x[k]);
            amax = a > amax ? a : amax;
            bad += x[k] * 0.0f; /* NaN for a NaN or an infinity, else +-0 */
        }
        float d = amax / 127.0f + bad, id = d > 0 ? 1.0f / d : 0.0f;
        int32_t s = 0;
        for (int k = 0; k < 32; k++) {
            q[k] = (int8_t)(int)nearbyintf(clamp127(x[k] * id));
            s += q[k];
        }
        dx[b] = d;
        corr[b] = -128 * s;
    }
}

#define A512Q __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define A256Q __attribute__((target("avx2,fma,f16c")))
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))

A512Q static void quant_row_512(const float *x, int nb, int8_t *q, float *dx, int32_t *corr) {
    const __m512 zero = _mm512_setzero_ps(), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    for (int b = 0; b < nb; b++, x += 32, q += 32) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float bad = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_mul_ps(v0, zero), _mm512_mul_ps(v1, zero)));
        float d = amax / 127.0f + bad, id = d > 0 ? 1.0f / d : 0.0f;
        __m512 iv = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(_mm512_mul_ps(v0, iv), hi), lo));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(_mm512_mul_ps(v1, iv), hi), lo));
        _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
        dx[b] = d;
        corr[b] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

A256Q static void quant_row_256(const float *x, int nb, int8_t *q, float *dx, int32_t *corr) {
    const __m256 zero = _mm256_setzero_ps(), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int b = 0; b < nb; b++, x += 32, q += 32) {
        __m256 v[4], m = zero, z = zero;
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            m = _mm256_max_ps(m, _mm256_and_ps(v[i], absm));
            z = _mm256_add_ps(z, _mm256_mul_ps(v[i], zero));
        }
        float mm[8], zz[8], amax = 0, bad = 0;
        _mm256_storeu_ps(mm, m);
        _mm256_storeu_ps(zz, z);
        for (int i = 0; i < 8; i++) {
            amax = mm[i] > amax ? mm[i] : amax;
            bad += zz[i];
        }
        float d = amax / 127.0f + bad, id = d > 0 ? 1.0f / d : 0.0f;
        __m256 iv = _mm256_set1_ps(id);
        int32_t s = 0;
        for (int i = 0; i < 4; i++) {
            __m256i qi = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(_mm256_mul_ps(v[i], iv), hi), lo));
            int32_t t[8];
            _mm256_storeu_si256((__m256i *)t, qi);
            for (int k = 0; k < 8; k++) {
                q[8 * i + k] = (int8_t)t[k];
                s += t[k];
            }
        }
        dx[b] = d;
        corr[b] = -128 * s;
    }
}

typedef struct quant_args {
    const float *in;
    qact *a;
    int n, isa, per;
} quant_args;

static void quant_task(void *arg, int task) {
    quant_args *qa = arg;
    qact *a = qa->a;
    int t1 = (task + 1) * qa->per < qa->n ? (task + 1) * qa->per : qa->n;
    for (int t = task * qa->per; t < t1; t++) {
        const float *x = qa->in + (size_t)t * a->K;
        int8_t *q = a->q + (size_t)t * a->K;
        float *dx = a->dx + (size_t)t * a->nb;
        int32_t *corr = a->corr + (size_t)t * a->nb;
        if (qa->isa >= CPU_ISA_AVX512)
            quant_row_512(x, a->nb, q, dx, corr);
        else if (qa->isa >= CPU_ISA_AVX2)
            quant_row_256(x, a->nb, q, dx, corr);
        else
            quant_row_c(x, a->nb, q, dx, corr);
    }
}

int cpu_a8_begin(kern_backend *be, const float *in, const kern_weight *w, int n, int views, cpu_a8_acts *a,
                 int *path) {
    int bl = kern_dtype_block(w->dtype);
    int64_t ld = w->ld ? w->ld : w->cols;
    if (!views && ld != w->cols)
        return kern_fail(be, "matmul: a %s weight cannot be a column view", kern_dtype_name(w->dtype));
    if (w->cols % bl || ld % bl)
        return kern_fail(be, "matmul: %s weight (%lld, %lld): not whole blocks", kern_dtype_name(w->dtype),
                         (long long)w->rows, (long long)w->cols);
    if (n <= 0 || w->rows <= 0) return 1;
    int K = (int)w->cols, nb = K / 32, isa = cpu_isa(be);
    size_t qb = ((size_t)n * K + 63) & ~(size_t)63, fb = ((size_t)n * nb * sizeof(float) + 63) & ~(size_t)63;
    char *scratch = cpu_scratch(be, qb + 4 * fb);
    if (!scratch) return kern_fail(be, "matmul: out of memory quantizing %d x %d activations", n, K);
    *a = (cpu_a8_acts){(int8_t *)scratch,
                       (float *)(scratch + qb),
                       (int32_t *)(scratch + qb + fb),
                       (int32_t *)(scratch + qb + 2 * fb),
                       (float *)(scratch + qb + 3 * fb),
                       K,
                       nb};
    quant_args qa = {in, a, n, isa, 8};
    int nq = (n + qa.per - 1) / qa.per;
    if (nq > 1)
        cpu_parallel_for(be, nq, quant_task, &qa);
    else
        quant_task(&qa, 0);
    for (size_t i = 0; i < (size_t)n * nb; i++) {
        a->qs[i] = a->corr[i] / -128;
        a->sx[i] = a->dx[i] * (float)a->qs[i];
    }
    *path = isa >= CPU_ISA_AVX512 && ((const cpu_impl *)be->impl)->vnni ? CPU_A8_VNNI
            : isa >= CPU_ISA_AVX2                                      ? CPU_A8_AVX2
                                                                       : CPU_A8_C;
    return 0;
}

/* ---- the kernels: T tokens x one group of 16 rows ---- */

typedef struct q8_tile {
    const uint8_t *grp; /* the group */
    const qact *a;
    int t0, T, nb, nvalid; /* first token, tokens, blocks, rows of the group that exist */
    float *o;              /* out + t0 * ldo + the group's first row */
    size_t ldo;
} q8_tile;

static void tile_c(const q8_tile *p) {
    const uint8_t *quads = p->grp + (size_t)p->nb * 32;
    for (int t = 0; t < p->T; t++) {
        const int8_t *q = p->a->q + (size_t)(p->t0 + t) * p->a->K;
        const float *dx = p->a->dx + (size_t)(p->t0 + t) * p->nb;
        for (int i = 0; i < p->nvalid; i++) {
            float acc = 0;
            for (int b = 0; b < p->nb; b++) {
                int32_t s = 0;
                for (int j = 0; j < 8; j++)
                    for (int k = 0; k < 4; k++)
                        s += (int32_t)(int8_t)(quads[(size_t)b * 512 + 64 * j + 4 * i + k] ^ 0x80) *
                             q[32 * b + 4 * j + k];
                uint16_t h;
                memcpy(&h, p->grp + (size_t)b * 32 + 2 * i, 2);
                acc = fmaf(kern_f16_to_f32(h) * dx[b], (float)s, acc);
            }
            p->o[(size_t)t * p->ldo + i] = acc;
        }
    }
}

/* AVX-512 VNNI: one vpdpbusd per quad and token (16 rows x 4 bytes); two
 * integer accumulators per token (even and odd quads) halve the chain. */
VNNI INL void tile_vnni_t(const int T, const q8_tile *p) {
    const uint8_t *sc = p->grp, *quads = p->grp + (size_t)p->nb * 32;
    const qact *a = p->a;
    const int8_t *q[8];
    const float *dx[8];
    const int32_t *corr[8];
    __m512 acc[8];
    for (int t = 0; t < T; t++) {
        q[t] = a->q + (size_t)(p->t0 + t) * a->K;
        dx[t] = a->dx + (size_t)(p->t0 + t) * p->nb;
        corr[t] = a->corr + (size_t)(p->t0 + t) * p->nb;
        acc[t] = _mm512_setzero_ps();
    }
    for (int b = 0; b < p->nb; b++) {
        const uint8_t *qb = quads + (size_t)b * 512;
        if (T <= 2)
            for (int l = 0; l < 8; l++)
                _mm_prefetch((const char *)qb + Q8_PF + 64 * l, _MM_HINT_T0);
        __m512i s0[8], s1[8];
        for (int t = 0; t < T; t++) {
            s0[t] = _mm512_set1_epi32(corr[t][b]);
            s1[t] = _mm512_setzero_si512();
        }
        for (int j = 0; j < 8; j += 2) {
            __m512i w0 = _mm512_loadu_si512(qb + 64 * j), w1 = _mm512_loadu_si512(qb + 64 * j + 64);
            for (int t = 0; t < T; t++) {
                int32_t x0, x1;
                memcpy(&x0, q[t] + 32 * b + 4 * j, 4);
                memcpy(&x1, q[t] + 32 * b + 4 * j + 4, 4);
                s0[t] = _mm512_dpbusd_epi32(s0[t], w0, _mm512_set1_epi32(x0));
                s1[t] = _mm512_dpbusd_epi32(s1[t], w1, _mm512_set1_epi32(x1));
            }
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + (size_t)b * 32)));
        for (int t = 0; t < T; t++) {
            __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(dx[t][b]));
            acc[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_add_epi32(s0[t], s1[t])), acc[t]);
        }
    }
    __mmask16 m = (__mmask16)((1u << p->nvalid) - 1);
    for (int t = 0; t < T; t++)
        _mm512_mask_storeu_ps(p->o + (size_t)t * p->ldo, m, acc[t]);
}

VNNI static void tile_vnni(const q8_tile *p) {
    switch (p->T) {
    case 8: tile_vnni_t(8, p); return;
    case 7: tile_vnni_t(7, p); return;
    case 6: tile_vnni_t(6, p); return;
    case 5: tile_vnni_t(5, p); return;
    case 4: tile_vnni_t(4, p); return;
    case 3: tile_vnni_t(3, p); return;
    case 2: tile_vnni_t(2, p); return;
    default: tile_vnni_t(1, p); return;
    }
}

/* AVX2: no vpdpbusd; vpmaddubsw on |w| and q with w's sign, pairs of
 * 16-bit products (|w| <= 128, |q| <= 127: no saturation), then vpmaddwd.
 * Rows 0-7 and 8-15 in two registers. */
A256Q INL void tile_256_t(const int T, const q8_tile *p) {
    const uint8_t *sc = p->grp, *quads = p->grp + (size_t)p->nb * 32;
    const qact *a = p->a;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[4][2];
    for (int t = 0; t < T; t++)
        acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int b = 0; b < p->nb; b++) {
        const uint8_t *qb = quads + (size_t)b * 512;
        if (T <= 2)
            for (int l = 0; l < 8; l++)
                _mm_prefetch((const char *)qb + Q8_PF + 64 * l, _MM_HINT_T0);
        __m256i s[4][2];
        for (int t = 0; t < T; t++)
            s[t][0] = s[t][1] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++)
            for (int h = 0; h < 2; h++) {
                __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qb + 64 * j + 32 * h)), flip);
                __m256i aw = _mm256_abs_epi8(w);
                for (int t = 0; t < T; t++) {
                    int32_t x;
                    memcpy(&x, a->q + (size_t)(p->t0 + t) * a->K + 32 * b + 4 * j, 4);
                    __m256i pr = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(x), w));
                    s[t][h] = _mm256_add_epi32(s[t][h], _mm256_madd_epi16(pr, ones));
                }
            }
        __m128i hb = _mm_loadu_si128((const __m128i *)(sc + (size_t)b * 32));
        __m128i hb1 = _mm_loadu_si128((const __m128i *)(sc + (size_t)b * 32 + 16));
        __m256 dw0 = _mm256_cvtph_ps(hb), dw1 = _mm256_cvtph_ps(hb1);
        for (int t = 0; t < T; t++) {
            __m256 d = _mm256_set1_ps(a->dx[(size_t)(p->t0 + t) * p->nb + b]);
            acc[t][0] = _mm256_fmadd_ps(_mm256_mul_ps(dw0, d), _mm256_cvtepi32_ps(s[t][0]), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(_mm256_mul_ps(dw1, d), _mm256_cvtepi32_ps(s[t][1]), acc[t][1]);
        }
    }
    for (int t = 0; t < T; t++) {
        float o[16];
        _mm256_storeu_ps(o, acc[t][0]);
        _mm256_storeu_ps(o + 8, acc[t][1]);
        memcpy(p->o + (size_t)t * p->ldo, o, (size_t)p->nvalid * sizeof *o);
    }
}

A256Q static void tile_256(const q8_tile *p) {
    switch (p->T) {
    case 4: tile_256_t(4, p); return;
    case 3: tile_256_t(3, p); return;
    case 2: tile_256_t(2, p); return;
    default: tile_256_t(1, p); return;
    }
}

/* ---- the op ---- */

typedef struct q8_args {
    const kern_weight *w;
    const qact *a;
    float *out;
    int n, tt; /* tokens; tokens per tile */
    void (*tile)(const q8_tile *);
} q8_args;

static void q8_task(void *arg, int task) {
    const q8_args *a = arg;
    const kern_weight *w = a->w;
    int rows = (int)w->rows, nb = (int)(w->cols / 32);
    int g0 = task * Q8_TASK_GROUPS, ng = (rows + G - 1) / G;
    int g1 = g0 + Q8_TASK_GROUPS < ng ? g0 + Q8_TASK_GROUPS : ng;
    for (int t0 = 0; t0 < a->n; t0 += Q8_TB) {
        int t1 = t0 + Q8_TB < a->n ? t0 + Q8_TB : a->n;
        for (int g = g0; g < g1; g++) {
            int nvalid = rows - g * G < G ? rows - g * G : G;
            for (int t = t0; t < t1; t += a->tt) {
                q8_tile p = {(const uint8_t *)w->data + (size_t)g * group_bytes(w->cols),
                             a->a,
                             t,
                             t1 - t < a->tt ? t1 - t : a->tt,
                             nb,
                             nvalid,
                             a->out + (size_t)t * rows + (size_t)g * G,
                             (size_t)rows};
                a->tile(&p);
            }
        }
    }
}

int cpu_matmul_q8a8(kern_backend *be, float *out, const float *in, const kern_weight *w, int n) {
    qact a;
    int path = CPU_A8_C, rc = cpu_a8_begin(be, in, w, n, 0, &a, &path);
    if (rc) return rc < 0 ? -1 : 0;
    static void (*const tiles[])(const q8_tile *) = {tile_c, tile_256, tile_vnni};
    q8_args ma = {w, &a, out, n, (const int[]){1, 4, 8}[path], tiles[path]};
    int ng = (int)((w->rows + G - 1) / G);
    cpu_parallel_for(be, (ng + Q8_TASK_GROUPS - 1) / Q8_TASK_GROUPS, q8_task, &ma);
    return 0;
}
