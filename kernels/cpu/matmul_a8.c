/*
 * cpu: matmul with KERN_Q4_K_A8, KERN_Q6_K_A8, KERN_Q5_0_A8, KERN_Q5_1_A8
 * and KERN_Q5_K_A8 weights -- ggml's blocks as stored, times activations
 * quantized to 8 bits per 32-block (cpu_a8_begin: matmul_q8.c's recipe),
 * multiplied in integers as llama.cpp does (docs/bench-forward.md,
 * "8-bit activations", "Integer kernels for every GGUF type").
 *
 * Recipe, one per type and the same on every path (portable C, AVX2,
 * AVX-512 VNNI), for any thread count and any number of tokens in a call.
 * For one row and one token, over the row's 32-element blocks b in order:
 *   - w_k are the block's integer weights: Q4_K the nibble (0..15), Q5_K
 *     and Q5_1 the 5-bit value (0..31), Q5_0 the 5-bit value - 16, Q6_K
 *     the 6-bit value - 32; q_k the activation's int8s, dx_b their scale,
 *     sx_b = dx_b * (float)(sum of the block's q);
 *   - lane l = 0..7: P_l = s_l * (w_4l q_4l + ... + w_4l+3 q_4l+3), exact in
 *     integers; s_l = 1, except Q6_K: the int8 scale of the 16 elements
 *     lane l lies in;
 *   - D_b = dw_b * dx_b, dw_b the block's scale as fp32 (Q4_K, Q5_K:
 *     d * sc_j, exact; Q5_0, Q5_1, Q6_K: d);
 *     acc[8 (b & 1) + l] = fma(D_b, (float)P_l, acc[8 (b & 1) + l]);
 *   - the types with a min per 32-block, mn_b = -(dmin * m_j) (Q4_K, Q5_K)
 *     or m (Q5_1), sum it apart: mt = fma(mn_b, sx_b, mt);
 *   - out = tree(acc) + mt, tree matmul.c's: a_i = acc_i + acc_i+8,
 *     b_i = a_i + a_i+4, (b_0 + b_2) + (b_1 + b_3).
 * The lanes are what vpmaddubsw + vpmaddwd (AVX2) and vpdpbusd (VNNI) leave
 * in a 32-bit lane, and even / odd blocks sit in two registers (or the two
 * halves of one), so every path does the same float operations on the
 * same values. Weights are read where they lie (the mmap or the huge-page
 * copy); a column view (ld) is a row-parallel layer's slice. (Q4_0 and
 * Q4_1 are repacked instead: matmul_a8p.c.)
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define A8_RB 32 /* output rows per task */
#define A8_TB 64 /* tokens per cache block */
#ifndef A8_PF
#define A8_PF 1024 /* bytes ahead a one- or two-token tile prefetches its row */
#endif

int cpu_is_a8(kern_dtype dt) {
    return !cpu_is_a8p(dt) && (dt == KERN_Q4_K_A8 || dt == KERN_Q6_K_A8 || dt == KERN_Q5_0_A8 || dt == KERN_Q5_1_A8 ||
                               dt == KERN_Q5_K_A8);
}

/* The types with a min per 32-block (summed apart, mt). */
static int a8_has_min(kern_dtype dt) { return dt == KERN_Q4_K_A8 || dt == KERN_Q5_K_A8 || dt == KERN_Q5_1_A8; }

typedef cpu_a8_acts a8_acts; /* the activations of a call: q, dx, sx */

/* ---- portable C: the reference ---- */

static float ldh(const uint8_t *p) { return kern_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static float tree16(const float *acc) {
    float a[8], b[4];
    for (int i = 0; i < 8; i++) a[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* Block b of a row: its integer weights w, lane scales ls, scale dw and
 * min mn (0 for the types without one). */
static void blk_c(kern_dtype dt, const uint8_t *row, int b, int *w, int *ls, float *dw, float *mn) {
    *mn = 0;
    for (int l = 0; l < 8; l++) ls[l] = 1;
    switch (dt) {
    case KERN_Q4_K_A8: {
        const uint8_t *p = row + (size_t)144 * (b / 8);
        int j = b % 8, sc, m;
        cpu_k_scale_min(p + 4, j, &sc, &m);
        *dw = ldh(p) * (float)sc;
        *mn = -(ldh(p + 2) * (float)m);
        for (int k = 0; k < 32; k++) w[k] = (p[16 + 32 * (j / 2) + k] >> (4 * (j & 1))) & 15;
        return;
    }
    case KERN_Q5_K_A8: {
        const uint8_t *p = row + (size_t)176 * (b / 8);
        int j = b % 8, sc, m;
        cpu_k_scale_min(p + 4, j, &sc, &m);
        *dw = ldh(p) * (float)sc;
        *mn = -(ldh(p + 2) * (float)m);
        for (int k = 0; k < 32; k++)
            w[k] = ((p[48 + 32 * (j / 2) + k] >> (4 * (j & 1))) & 15) | ((p[16 + k] >> j) & 1) << 4;
        return;
    }
    case KERN_Q5_0_A8:
    case KERN_Q5_1_A8: {
        int q51 = dt == KERN_Q5_1_A8;
        const uint8_t *p = row + (size_t)(q51 ? 24 : 22) * b, *qh = p + (q51 ? 4 : 2), *qs = qh + 4;
        *dw = ldh(p);
        if (q51) *mn = ldh(p + 2);
        for (int k = 0; k < 32; k++)
            w[k] = (((k < 16 ? qs[k] : qs[k - 16] >> 4) & 15) | ((qh[k / 8] >> (k % 8)) & 1) << 4) - (q51 ? 0 : 16);
        return;
    }
    case KERN_Q6_K_A8: {
        const uint8_t *p = row + (size_t)210 * (b / 8);
        int bb = b % 8, h = bb / 4, s = bb % 4;
        for (int k = 0; k < 32; k++) {
            int lo = (p[64 * h + k + 32 * (s & 1)] >> (4 * (s >> 1))) & 15;
            int hi = (p[128 + 32 * h + k] >> (2 * s)) & 3;
            w[k] = (lo | hi << 4) - 32;
        }
        for (int l = 0; l < 8; l++) ls[l] = (int8_t)p[192 + 2 * bb + (l >= 4)];
        *dw = ldh(p + 208);
        return;
    }
    default: *dw = 0; return;
    }
}

static float row_c(kern_dtype dt, const uint8_t *row, const a8_acts *a, int t) {
    const int8_t *q = a->q + (size_t)t * a->K;
    const float *dx = a->dx + (size_t)t * a->nb, *sx = a->sx + (size_t)t * a->nb;
    int has_min = a8_has_min(dt);
    float acc[16] = {0}, mt = 0;
    for (int b = 0; b < a->nb; b++) {
        int w[32], ls[8];
        float dw, mn;
        blk_c(dt, row, b, w, ls, &dw, &mn);
        float D = dw * dx[b];
        for (int l = 0; l < 8; l++) {
            int32_t s = 0;
            for (int i = 0; i < 4; i++) s += w[4 * l + i] * q[32 * b + 4 * l + i];
            acc[8 * (b & 1) + l] = fmaf(D, (float)(ls[l] * s), acc[8 * (b & 1) + l]);
        }
        if (has_min) mt = fmaf(mn, sx[b], mt);
    }
    return tree16(acc) + mt;
}

/* T tokens x R rows (ws bytes apart), into o[t * ldo + r]. */
typedef void (*a8_tile_fn)(kern_dtype dt, int T, int R, const uint8_t *row, size_t ws, const a8_acts *a, int t0,
                           float *o, size_t ldo);

static void tile_c(kern_dtype dt, int T, int R, const uint8_t *row, size_t ws, const a8_acts *a, int t0, float *o,
                   size_t ldo) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) o[(size_t)t * ldo + r] = row_c(dt, row + (size_t)r * ws, a, t0 + t);
}

/* ---- AVX2 and AVX-512 VNNI: one body (matmul_a8_simd.h), two targets ---- */

#define INL static inline __attribute__((always_inline))

#define A8_ATTR __attribute__((target("avx2,fma,f16c")))
#define A8_SUF(x) x##_avx2
/* P_l of unsigned a times signed b (pairs of 16-bit products cannot
 * saturate: |a| <= 32 after the sign trick, or <= 31; |b| <= 127) */
#define A8_DOT(a, b) _mm256_madd_epi16(_mm256_maddubs_epi16((a), (b)), _mm256_set1_epi16(1))
#define A8_DOTS(a, b, s16, s32) _mm256_madd_epi16(_mm256_maddubs_epi16((a), (b)), (s16))
#include "kernels/cpu/matmul_a8_simd.h"
#undef A8_ATTR
#undef A8_SUF
#undef A8_DOT
#undef A8_DOTS

#define A8_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define A8_SUF(x) x##_vnni
#define A8_DOT(a, b) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (a), (b))
#define A8_DOTS(a, b, s16, s32) _mm256_mullo_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), (a), (b)), (s32))
#include "kernels/cpu/matmul_a8_simd.h"
#undef A8_ATTR
#undef A8_SUF
#undef A8_DOT
#undef A8_DOTS

/* ---- the op ---- */

typedef struct a8_args {
    const kern_weight *w;
    const a8_acts *a;
    float *out;
    int n;
    size_t ws; /* bytes between rows */
    a8_tile_fn tile;
    int tt; /* tokens per tile */
} a8_args;

static void a8_task(void *arg, int task) {
    const a8_args *a = arg;
    int rows = (int)a->w->rows, r0 = task * A8_RB, r1 = r0 + A8_RB < rows ? r0 + A8_RB : rows;
    const uint8_t *W = a->w->data;
    for (int t0 = 0; t0 < a->n; t0 += A8_TB) {
        int t1 = t0 + A8_TB < a->n ? t0 + A8_TB : a->n;
        if (t1 - t0 <= 2) { /* decode: the task's rows side by side */
            a->tile(a->w->dtype, t1 - t0, r1 - r0, W + (size_t)r0 * a->ws, a->ws, a->a, t0,
                    a->out + (size_t)t0 * rows + r0, (size_t)rows);
            continue;
        }
        for (int r = r0; r < r1; r++)
            for (int t = t0; t < t1; t += a->tt) {
                int T = t1 - t < a->tt ? t1 - t : a->tt;
                a->tile(a->w->dtype, T, 1, W + (size_t)r * a->ws, a->ws, a->a, t, a->out + (size_t)t * rows + r,
                        (size_t)rows);
            }
    }
}

int cpu_matmul_a8(kern_backend *be, float *out, const float *in, const kern_weight *w, int n) {
    a8_acts acts;
    int path = CPU_A8_C, rc = cpu_a8_begin(be, in, w, n, 1, &acts, &path);
    if (rc) return rc < 0 ? -1 : 0;
    static const a8_tile_fn tiles[] = {tile_c, tile_avx2, tile_vnni};
    int64_t ld = w->ld ? w->ld : w->cols;
    a8_args a = {w, &acts, out, n, kern_dtype_bytes(w->dtype, ld), tiles[path], path == CPU_A8_C ? 1 : 4};
    cpu_parallel_for(be, (int)((w->rows + A8_RB - 1) / A8_RB), a8_task, &a);
    return 0;
}
