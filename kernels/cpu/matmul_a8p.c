/*
 * cpu: KERN_Q4_0_A8 and KERN_Q4_1_A8 -- Q4_0 / Q4_1 weights repacked in
 * groups of 8 rows, times activations quantized to 8 bits per 32-block
 * (cpu_a8_begin), in integers. The served SmolLM2 file is Q4_1: this is
 * its decode path, so it gets llama.cpp's repacking trick (one vpmaddubsw
 * covers 8 rows x 4 weights; no horizontal sums).
 *
 * Recipe, the same on every path (portable C, AVX2, AVX-512 VNNI), for any
 * thread count and any number of tokens in a call. For one row and one
 * token, over the 32-blocks b in order, from acc = mt = 0:
 *   - isum_b = sum over the block of u_k q_k, exact in integers, u_k the
 *     stored nibble (Q4_0: then isum_b -= 8 * sum of the block's q);
 *   - acc = fma(d_b * dx_b, (float)isum_b, acc);
 *   - Q4_1: mt = fma(m_b, sx_b, mt), sx_b = dx_b * (float)(sum of q);
 *   - out = acc + mt (Q4_0: acc).
 *
 * Layout (private to this backend): rows in groups of 8, the last padded
 * with zero rows (scale 0). A group is, per block b: the 8 rows' fp16 d
 * (16 bytes), for Q4_1 their fp16 m (16 bytes), then 4 chunks of 32
 * bytes: byte 4i + k of chunk c holds, for row i, element 4c + k of the
 * block in its low nibble and element 4(c + 4) + k in its high nibble. A
 * group is 8 rows' bytes, so a view at a multiple of 16 rows sits where it
 * would in the plain type.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define PG 8      /* rows per group */
#define PG_TASK 4 /* groups per task: 32 rows */
#define PG_TB 64  /* tokens per cache block */

int cpu_is_a8p(kern_dtype dt) { return dt == KERN_Q4_0_A8 || dt == KERN_Q4_1_A8; }

static size_t blk_bytes(kern_dtype dt) { return dt == KERN_Q4_1_A8 ? 160 : 144; }
static size_t group_bytes(kern_dtype dt, int64_t cols) { return (size_t)(cols / 32) * blk_bytes(dt); }

/* ---- packing ---- */

typedef struct pk_args {
    const kern_weight *h;
    uint8_t *dst;
    kern_dtype to;
} pk_args;

static void pk_task(void *arg, int g) {
    const pk_args *a = arg;
    const kern_weight *h = a->h;
    int64_t ld = h->ld ? h->ld : h->cols;
    int nb = (int)(h->cols / 32), q41 = a->to == KERN_Q4_1_A8;
    size_t bb = blk_bytes(a->to), sb = q41 ? 20 : 18; /* source block bytes */
    uint8_t *grp = a->dst + (size_t)g * group_bytes(a->to, h->cols);
    for (int i = 0; i < PG; i++) {
        int64_t r = (int64_t)g * PG + i;
        const uint8_t *src = r < h->rows ? (const uint8_t *)h->data + kern_dtype_bytes(h->dtype, r * ld) : NULL;
        for (int b = 0; b < nb; b++) {
            uint8_t *o = grp + (size_t)b * bb, *ch = o + (q41 ? 32 : 16);
            if (!src) {
                memset(o + 2 * i, 0, 2);
                if (q41) memset(o + 16 + 2 * i, 0, 2);
                for (int c = 0; c < 4; c++) memset(ch + 32 * c + 4 * i, 0x88, 4);
                continue;
            }
            const uint8_t *s = src + (size_t)b * sb, *qs = s + (q41 ? 4 : 2);
            memcpy(o + 2 * i, s, 2);
            if (q41) memcpy(o + 16 + 2 * i, s + 2, 2);
            int u[32];
            for (int k = 0; k < 16; k++) {
                u[k] = qs[k] & 15;
                u[k + 16] = qs[k] >> 4;
            }
            for (int c = 0; c < 4; c++)
                for (int k = 0; k < 4; k++) ch[32 * c + 4 * i + k] = (uint8_t)(u[4 * c + k] | u[4 * (c + 4) + k] << 4);
        }
    }
}

int cpu_pack_a8p(kern_backend *be, const kern_weight *host, kern_dtype to, kern_weight *dev) {
    if (host->dtype != kern_dtype_plain(to))
        return kern_fail(be, "upload_quantized: cannot make %s from %s", kern_dtype_name(to), kern_dtype_name(host->dtype));
    int64_t groups = (host->rows + PG - 1) / PG;
    size_t bytes = (size_t)groups * group_bytes(to, host->cols);
    uint8_t *buf = cpu_mem_alloc(be, bytes ? bytes : 64);
    if (!buf || cpu_owned_add(be, buf)) {
        free(buf);
        return kern_fail(be, "upload_quantized: out of memory for (%lld, %lld) %s", (long long)host->rows,
                         (long long)host->cols, kern_dtype_name(to));
    }
    pk_args a = {host, buf, to};
    if (groups > 0) cpu_parallel_for(be, (int)groups, pk_task, &a);
    *dev = (kern_weight){buf, to, host->rows, host->cols, 0};
    return 0;
}

static float ldh(const uint8_t *p) { return kern_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Row r as fp32: quant.c's values (Q4_0 (u - 8) * d, Q4_1 u * d + m). */
void cpu_a8p_row(const kern_weight *w, int64_t r, float *dst) {
    int nb = (int)(w->cols / 32), i = (int)(r % PG), q41 = w->dtype == KERN_Q4_1_A8;
    const uint8_t *grp = (const uint8_t *)w->data + (size_t)(r / PG) * group_bytes(w->dtype, w->cols);
    for (int b = 0; b < nb; b++) {
        const uint8_t *o = grp + (size_t)b * blk_bytes(w->dtype), *ch = o + (q41 ? 32 : 16);
        float d = ldh(o + 2 * i), m = q41 ? ldh(o + 16 + 2 * i) : 0;
        for (int c = 0; c < 4; c++)
            for (int k = 0; k < 4; k++) {
                int v = ch[32 * c + 4 * i + k];
                if (q41) {
                    dst[32 * b + 4 * c + k] = (float)(v & 15) * d + m;
                    dst[32 * b + 4 * (c + 4) + k] = (float)(v >> 4) * d + m;
                } else {
                    dst[32 * b + 4 * c + k] = (float)((v & 15) - 8) * d;
                    dst[32 * b + 4 * (c + 4) + k] = (float)((v >> 4) - 8) * d;
                }
            }
    }
}

/* ---- the kernels: T tokens x one group ---- */

typedef cpu_a8_acts pk_acts; /* q, dx, sx and qs (per block: sum of q) */

typedef struct pk_tile {
    kern_dtype dt;
    const uint8_t *grp;
    const pk_acts *a;
    int t0, T, nvalid;
    float *o;
    size_t ldo;
} pk_tile;

static void tile_c(const pk_tile *p) {
    int q41 = p->dt == KERN_Q4_1_A8;
    size_t bb = blk_bytes(p->dt);
    for (int t = 0; t < p->T; t++) {
        const pk_acts *a = p->a;
        const int8_t *q = a->q + (size_t)(p->t0 + t) * a->K;
        const float *dx = a->dx + (size_t)(p->t0 + t) * a->nb, *sx = a->sx + (size_t)(p->t0 + t) * a->nb;
        const int32_t *qs = a->qs + (size_t)(p->t0 + t) * a->nb;
        for (int i = 0; i < p->nvalid; i++) {
            float acc = 0, mt = 0;
            for (int b = 0; b < a->nb; b++) {
                const uint8_t *o = p->grp + (size_t)b * bb, *ch = o + (q41 ? 32 : 16);
                int32_t s = 0;
                for (int c = 0; c < 4; c++)
                    for (int k = 0; k < 4; k++) {
                        int v = ch[32 * c + 4 * i + k];
                        s += (v & 15) * q[32 * b + 4 * c + k] + (v >> 4) * q[32 * b + 4 * (c + 4) + k];
                    }
                if (!q41) s -= 8 * qs[b];
                acc = fmaf(ldh(o + 2 * i) * dx[b], (float)s, acc);
                if (q41) mt = fmaf(ldh(o + 16 + 2 * i), sx[b], mt);
            }
            p->o[(size_t)t * p->ldo + i] = q41 ? acc + mt : acc;
        }
    }
}

#define INL static inline __attribute__((always_inline))

#define PK_ATTR __attribute__((target("avx2,fma,f16c")))
#define PK_SUF(x) x##_avx2
/* the 16-bit pair sums of u (<= 15) times q add up over 8 quads without
 * overflow (8 x 2 x 15 x 127 < 32768); widened once per block */
#define PK_ZERO() _mm256_setzero_si256()
#define PK_ACC(s, u, x) _mm256_add_epi16((s), _mm256_maddubs_epi16((u), (x)))
#define PK_FIN(s) _mm256_madd_epi16((s), _mm256_set1_epi16(1))
#include "kernels/cpu/matmul_a8p_simd.h"
#undef PK_ATTR
#undef PK_SUF
#undef PK_ACC
#undef PK_FIN

#define PK_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define PK_SUF(x) x##_vnni
#define PK_ACC(s, u, x) _mm256_dpbusd_epi32((s), (u), (x))
#define PK_FIN(s) (s)
#include "kernels/cpu/matmul_a8p_simd.h"
#undef PK_ATTR
#undef PK_SUF
#undef PK_ACC
#undef PK_FIN
#undef PK_ZERO

/* ---- the op ---- */

typedef struct pk_args2 {
    const kern_weight *w;
    const pk_acts *a;
    float *out;
    int n, tt;
    void (*tile)(const pk_tile *);
} pk_args2;

static void pk_mm_task(void *arg, int task) {
    const pk_args2 *a = arg;
    const kern_weight *w = a->w;
    int rows = (int)w->rows, ng = (rows + PG - 1) / PG;
    int g0 = task * PG_TASK, g1 = g0 + PG_TASK < ng ? g0 + PG_TASK : ng;
    for (int t0 = 0; t0 < a->n; t0 += PG_TB) {
        int t1 = t0 + PG_TB < a->n ? t0 + PG_TB : a->n;
        for (int g = g0; g < g1; g++)
            for (int t = t0; t < t1; t += a->tt) {
                pk_tile p = {w->dtype,
                             (const uint8_t *)w->data + (size_t)g * group_bytes(w->dtype, w->cols),
                             a->a,
                             t,
                             t1 - t < a->tt ? t1 - t : a->tt,
                             rows - g * PG < PG ? rows - g * PG : PG,
                             a->out + (size_t)t * rows + (size_t)g * PG,
                             (size_t)rows};
                a->tile(&p);
            }
    }
}

int cpu_matmul_a8p(kern_backend *be, float *out, const float *in, const kern_weight *w, int n) {
    pk_acts acts;
    int path = CPU_A8_C, rc = cpu_a8_begin(be, in, w, n, 0, &acts, &path);
    if (rc) return rc < 0 ? -1 : 0;
    static void (*const tiles[])(const pk_tile *) = {tile_c, tile_avx2, tile_vnni};
    pk_args2 a = {w, &acts, out, n, path == CPU_A8_C ? 1 : 4, tiles[path]};
    int ng = (int)((w->rows + PG - 1) / PG);
    cpu_parallel_for(be, (ng + PG_TASK - 1) / PG_TASK, pk_mm_task, &a);
    return 0;
}
