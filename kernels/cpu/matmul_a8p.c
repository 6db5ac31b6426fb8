/*
 * cpu: the block-quantized GGUF types repacked at load in groups of 8 rows
 * (KERN_Q4_0_A8, Q4_1_A8, Q5_0_A8, Q5_1_A8, Q4_K_A8, Q5_K_A8, Q6_K_A8),
 * times activations quantized to 8 bits per 32-block (cpu_a8_begin), in
 * integers. One layout family and one kernel body for all of them; a type
 * is one row of pk_types (docs/bench-forward.md, "Repacked layouts").
 *
 * Recipe, the same for every type and on every path (portable C, AVX2,
 * AVX-512 VNNI), for any thread count and any number of tokens in a call.
 * For one row and one token, over the 32-blocks b in order, from
 * acc = mt = 0:
 *   - isum_b = sum over the block of ls_k * w_k * q_k, exact in integers:
 *     w_k the integer weight (Q4_0 nibble - 8, Q5_0 5-bit value - 16, Q6_K
 *     6-bit value - 32, the others unsigned), ls_k Q6_K's int8 scale of
 *     the 16 elements k lies in (1 for the others), q_k the activation;
 *   - acc = fma(dw_b * dx_b, (float)isum_b, acc), dw_b the block's scale
 *     as fp32: d, or for Q4_K / Q5_K d * (float)sc_j (exact);
 *   - the types with a min: mt = fma(mn_b, sx_b, mt), mn_b = m (Q4_1,
 *     Q5_1) or -(dmin * (float)m_j) (Q4_K, Q5_K), sx_b = dx_b * sum(q);
 *   - out = acc + mt (the types without a min: acc).
 * Scales and mins are vectors over the 8 rows: no horizontal sums.
 *
 * Layout (private to this backend): rows in groups of 8, the last padded
 * with zero rows (scale 0, weight 0). A group holds, per ggml block (one
 * 32-block, or a 256-super-block of 8 of them), a head, then per 32-block
 * its high bits (hb x 32 bytes) and its nibbles (128 bytes):
 *   - nibbles: 4 chunks of 32 bytes; byte 4i + k of chunk c holds, for row
 *     i, the low 4 bits of u (= w + off, unsigned) of element 4c + k in its
 *     low nibble and of element 4(c + 4) + k in its high nibble;
 *   - hb 1 (Q5): byte 4i + k: bit c the fifth bit of element 4c + k, bit
 *     4 + c that of element 4(c + 4) + k;
 *   - hb 2 (Q6_K): bytes 0..31, byte 4i + k, bits 2c..2c+1: bits 4..5 of
 *     element 4c + k; bytes 32..63 the same for element 4(c + 4) + k;
 *   - heads: PK_D the 8 rows' fp16 d; PK_DM d then m; PK_K d, dmin (fp16),
 *     64 bytes (j, i): sc & 15 | (m & 15) << 4, 32 bytes (j / 2, i): nibble
 *     j & 1 holds sc >> 4 | (m >> 4) << 2; PK_K6 d (fp16), then per
 *     32-block j the 8 rows' int8 scale of elements 0..15, then of 16..31.
 * A group takes exactly 8 rows' bytes of the plain type, so a view at a
 * multiple of 16 rows sits where it would in the plain type.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define PG 8      /* rows per group */
#define PG_TASK 4 /* groups per task: 32 rows */
#define PG_TB 64  /* tokens per cache block */

enum { PK_D, PK_DM, PK_K, PK_K6 };

/* One row per type: the one place a type's layout is described. */
typedef struct pk_type {
    kern_dtype dt;
    int sub;  /* 32-blocks per ggml block */
    int hb;   /* bits above the nibble: 0, 1 (Q5), 2 (Q6_K) */
    int off;  /* u = w + off */
    int kind; /* the head: PK_D, PK_DM, PK_K, PK_K6 */
    int head; /* bytes of a group's head per ggml block */
} pk_type;

/* X(dtype, sub, hb, off, kind, head): the table, and the kernels'
 * compile-time cases (matmul_a8p_simd.h), from one list. */
#define PK_TYPES(X)                                                                                            \
    X(KERN_Q4_0_A8, 1, 0, 8, PK_D, 16)                                                                        \
    X(KERN_Q4_1_A8, 1, 0, 0, PK_DM, 32)                                                                       \
    X(KERN_Q5_0_A8, 1, 1, 16, PK_D, 16)                                                                       \
    X(KERN_Q5_1_A8, 1, 1, 0, PK_DM, 32)                                                                       \
    X(KERN_Q5_K_A8, 8, 1, 0, PK_K, 128)                                                                       \
    X(KERN_Q4_K_A8, 8, 0, 0, PK_K, 128)                                                                       \
    X(KERN_Q6_K_A8, 8, 2, 32, PK_K6, 144)

#define PK_ROW(DT, SUB, HB, OFF, KIND, HEAD) {DT, SUB, HB, OFF, KIND, HEAD},
static const pk_type pk_types[] = {PK_TYPES(PK_ROW)};
#undef PK_ROW
#define PK_NTYPES ((int)(sizeof pk_types / sizeof *pk_types))

static const pk_type *pk_find(kern_dtype dt) {
    for (int i = 0; i < PK_NTYPES; i++)
        if (pk_types[i].dt == dt) return &pk_types[i];
    return NULL;
}

int cpu_is_a8p(kern_dtype dt) { return pk_find(dt) != NULL; }

/* Bytes of one 32-block's body; of a group per ggml block (8 rows of the
 * plain type: the head plus the bodies fill it exactly). */
static size_t body_bytes(const pk_type *ty) { return (size_t)32 * ty->hb + 128; }
static size_t group_bytes(const pk_type *ty, int64_t cols) {
    return (size_t)(cols / kern_dtype_block(ty->dt)) * PG * kern_dtype_block_bytes(ty->dt);
}


/* ---- one 32-block of one row: from the plain bytes, from the group ---- */

typedef struct pk_blk {
    int u[32];     /* w + off */
    uint16_t d, m; /* fp16 bits: d; m (PK_DM) or dmin (PK_K) */
    int sc, mn;    /* PK_K: 6-bit scale and min */
    int s6[2];     /* PK_K6: the int8 scales of elements 0..15, 16..31 */
} pk_blk;

static uint16_t h16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* 32-block b of a row of the plain type (ggml's layouts). */
static void src_blk(kern_dtype dt, const uint8_t *row, int b, pk_blk *o) {
    memset(o, 0, sizeof *o);
    switch (dt) {
    case KERN_Q4_0_A8:
    case KERN_Q4_1_A8: {
        int q41 = dt == KERN_Q4_1_A8;
        const uint8_t *p = row + (size_t)b * (q41 ? 20 : 18), *qs = p + (q41 ? 4 : 2);
        o->d = h16(p);
        if (q41) o->m = h16(p + 2);
        for (int k = 0; k < 16; k++) {
            o->u[k] = qs[k] & 15;
            o->u[k + 16] = qs[k] >> 4;
        }
        return;
    }
    case KERN_Q4_K_A8: {
        const uint8_t *p = row + (size_t)144 * (b / 8);
        int j = b % 8;
        o->d = h16(p);
        o->m = h16(p + 2);
        cpu_k_scale_min(p + 4, j, &o->sc, &o->mn);
        for (int k = 0; k < 32; k++) o->u[k] = (p[16 + 32 * (j / 2) + k] >> (4 * (j & 1))) & 15;
        return;
    }
    case KERN_Q5_K_A8: { /* the fifth bit of element l of sub-block j: bit j of qh[l] */
        const uint8_t *p = row + (size_t)176 * (b / 8);
        int j = b % 8;
        o->d = h16(p);
        o->m = h16(p + 2);
        cpu_k_scale_min(p + 4, j, &o->sc, &o->mn);
        for (int k = 0; k < 32; k++) o->u[k] = ((p[48 + 32 * (j / 2) + k] >> (4 * (j & 1))) & 15) | ((p[16 + k] >> j) & 1) << 4;
        return;
    }
    case KERN_Q5_0_A8:
    case KERN_Q5_1_A8: { /* the fifth bit of element k: bit k of the 32-bit qh */
        int q51 = dt == KERN_Q5_1_A8;
        const uint8_t *p = row + (size_t)(q51 ? 24 : 22) * b, *qh = p + (q51 ? 4 : 2), *qs = qh + 4;
        o->d = h16(p);
        if (q51) o->m = h16(p + 2);
        for (int k = 0; k < 32; k++) o->u[k] = ((k < 16 ? qs[k] : qs[k - 16] >> 4) & 15) | ((qh[k / 8] >> (k % 8)) & 1) << 4;
        return;
    }
    case KERN_Q6_K_A8: {
        const uint8_t *p = row + (size_t)210 * (b / 8);
        int bb = b % 8, h = bb / 4, s = bb % 4;
        for (int k = 0; k < 32; k++)
            o->u[k] = ((p[64 * h + k + 32 * (s & 1)] >> (4 * (s >> 1))) & 15) | ((p[128 + 32 * h + k] >> (2 * s)) & 3) << 4;
        o->s6[0] = (int8_t)p[192 + 2 * bb];
        o->s6[1] = (int8_t)p[193 + 2 * bb];
        o->d = h16(p + 208);
        return;
    }
    default: return;
    }
}

/* Where 32-block b of a group starts: its ggml block's head, its body. */
static const uint8_t *grp_head(const pk_type *ty, const uint8_t *grp, int b) {
    return grp + (size_t)(b / ty->sub) * PG * kern_dtype_block_bytes(ty->dt);
}
static const uint8_t *grp_body(const pk_type *ty, const uint8_t *grp, int b) {
    return grp_head(ty, grp, b) + ty->head + (size_t)(b % ty->sub) * body_bytes(ty);
}

/* 32-block b of row i of a group (the inverse of pk_task). */
static void grp_blk(const pk_type *ty, const uint8_t *grp, int i, int b, pk_blk *o) {
    const uint8_t *hd = grp_head(ty, grp, b), *bd = grp_body(ty, grp, b), *nib = bd + 32 * ty->hb;
    int j = b % ty->sub;
    memset(o, 0, sizeof *o);
    o->d = h16(hd + 2 * i);
    if (ty->kind == PK_DM || ty->kind == PK_K) o->m = h16(hd + 16 + 2 * i);
    if (ty->kind == PK_K) {
        int lo = hd[32 + 8 * j + i], hi = hd[96 + 8 * (j / 2) + i] >> (4 * (j & 1));
        o->sc = (lo & 15) | (hi & 3) << 4;
        o->mn = lo >> 4 | (hi >> 2 & 3) << 4;
    }
    if (ty->kind == PK_K6) {
        o->s6[0] = (int8_t)hd[16 + 16 * j + i];
        o->s6[1] = (int8_t)hd[24 + 16 * j + i];
    }
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 4; k++) {
            int v = nib[32 * c + 4 * i + k], lo = v & 15, hi = v >> 4;
            if (ty->hb == 1) {
                int h = bd[4 * i + k];
                lo |= (h >> c & 1) << 4;
                hi |= (h >> (4 + c) & 1) << 4;
            } else if (ty->hb == 2) {
                lo |= (bd[4 * i + k] >> (2 * c) & 3) << 4;
                hi |= (bd[32 + 4 * i + k] >> (2 * c) & 3) << 4;
            }
            o->u[4 * c + k] = lo;
            o->u[4 * (c + 4) + k] = hi;
        }
}

/* ---- packing ---- */

typedef struct pk_args {
    const kern_weight *h;
    uint8_t *dst;
    const pk_type *ty;
} pk_args;

static void put_blk(const pk_type *ty, uint8_t *grp, int i, int b, const pk_blk *s) {
    uint8_t *hd = (uint8_t *)grp_head(ty, grp, b), *bd = (uint8_t *)grp_body(ty, grp, b), *nib = bd + 32 * ty->hb;
    int j = b % ty->sub;
    if (j == 0) { /* the ggml block's own fields */
        memcpy(hd + 2 * i, &s->d, 2);
        if (ty->kind == PK_DM || ty->kind == PK_K) memcpy(hd + 16 + 2 * i, &s->m, 2);
    }
    if (ty->kind == PK_K) {
        hd[32 + 8 * j + i] = (uint8_t)((s->sc & 15) | (s->mn & 15) << 4);
        uint8_t *h = hd + 96 + 8 * (j / 2) + i;
        *h = (uint8_t)((*h & (j & 1 ? 0x0f : 0xf0)) | ((s->sc >> 4) | (s->mn >> 4) << 2) << (4 * (j & 1)));
    }
    if (ty->kind == PK_K6) {
        hd[16 + 16 * j + i] = (uint8_t)s->s6[0];
        hd[24 + 16 * j + i] = (uint8_t)s->s6[1];
    }
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 4; k++) {
            int lo = s->u[4 * c + k], hi = s->u[4 * (c + 4) + k];
            nib[32 * c + 4 * i + k] = (uint8_t)((lo & 15) | (hi & 15) << 4);
            if (ty->hb == 1) {
                uint8_t *h = bd + 4 * i + k;
                *h = (uint8_t)((*h & ~(1 << c | 1 << (4 + c))) | (lo >> 4) << c | (hi >> 4) << (4 + c));
            } else if (ty->hb == 2) {
                uint8_t *h0 = bd + 4 * i + k, *h1 = bd + 32 + 4 * i + k;
                *h0 = (uint8_t)((*h0 & ~(3 << (2 * c))) | (lo >> 4) << (2 * c));
                *h1 = (uint8_t)((*h1 & ~(3 << (2 * c))) | (hi >> 4) << (2 * c));
            }
        }
}

static void pk_task(void *arg, int g) {
    const pk_args *a = arg;
    const kern_weight *h = a->h;
    const pk_type *ty = a->ty;
    int64_t ld = h->ld ? h->ld : h->cols;
    int nb = (int)(h->cols / 32);
    uint8_t *grp = a->dst + (size_t)g * group_bytes(ty, h->cols);
    memset(grp, 0, group_bytes(ty, h->cols));
    for (int i = 0; i < PG; i++) {
        int64_t r = (int64_t)g * PG + i;
        const uint8_t *src = r < h->rows ? (const uint8_t *)h->data + kern_dtype_bytes(h->dtype, r * ld) : NULL;
        for (int b = 0; b < nb; b++) {
            pk_blk s;
            if (src) {
                src_blk(ty->dt, src, b, &s);
            } else { /* a padding row: scale 0, weight 0 */
                memset(&s, 0, sizeof s);
                for (int k = 0; k < 32; k++) s.u[k] = ty->off;
            }
            put_blk(ty, grp, i, b, &s);
        }
    }
}

int cpu_pack_a8p(kern_backend *be, const kern_weight *host, kern_dtype to, kern_weight *dev) {
    const pk_type *ty = pk_find(to);
    if (!ty || host->dtype != kern_dtype_plain(to))
        return kern_fail(be, "upload_quantized: cannot make %s from %s", kern_dtype_name(to), kern_dtype_name(host->dtype));
    int64_t groups = (host->rows + PG - 1) / PG;
    size_t bytes = (size_t)groups * group_bytes(ty, host->cols);
    uint8_t *buf = cpu_mem_alloc(be, bytes ? bytes : 64);
    if (!buf || cpu_owned_add(be, buf)) {
        free(buf);
        return kern_fail(be, "upload_quantized: out of memory for (%lld, %lld) %s", (long long)host->rows,
                         (long long)host->cols, kern_dtype_name(to));
    }
    pk_args a = {host, buf, ty};
    if (groups > 0) cpu_parallel_for(be, (int)groups, pk_task, &a);
    *dev = (kern_weight){buf, to, host->rows, host->cols, 0};
    return 0;
}

/* Row r as fp32: quant.c's values, with its float operations (Q4_0, Q5_0
 * (u - off) * d; Q4_1, Q5_1 u * d + m; Q4_K, Q5_K (d * sc) * u - dmin * m;
 * Q6_K (d * sc) * (u - 32)). */
void cpu_a8p_row(const kern_weight *w, int64_t r, float *dst) {
    const pk_type *ty = pk_find(w->dtype);
    int nb = (int)(w->cols / 32), i = (int)(r % PG);
    const uint8_t *grp = (const uint8_t *)w->data + (size_t)(r / PG) * group_bytes(ty, w->cols);
    for (int b = 0; b < nb; b++) {
        pk_blk s;
        grp_blk(ty, grp, i, b, &s);
        float d = kern_f16_to_f32(s.d), m = kern_f16_to_f32(s.m), *y = dst + 32 * b;
        for (int k = 0; k < 32; k++) switch (ty->kind) {
            case PK_D: y[k] = (float)(s.u[k] - ty->off) * d; break;
            case PK_DM: y[k] = (float)s.u[k] * d + m; break;
            case PK_K: {
                float d1 = d * (float)s.sc, m1 = m * (float)s.mn;
                y[k] = d1 * (float)s.u[k] - m1;
                break;
            }
            default: y[k] = (d * (float)s.s6[k / 16]) * (float)(s.u[k] - 32); break;
            }
    }
}

/* ---- the kernels: T tokens x one group ---- */

typedef cpu_a8_acts pk_acts; /* q, dx, sx and qs (per block: sum of q) */

typedef struct pk_tile {
    const pk_type *ty;
    const uint8_t *grp;
    const pk_acts *a;
    const int32_t *qlo; /* PK_K6: per token and block, the sum of q over elements 0..15 */
    int t0, T, nvalid;
    float *o;
    size_t ldo;
} pk_tile;

static int has_min(const pk_type *ty) { return ty->kind == PK_DM || ty->kind == PK_K; }

static void tile_c(const pk_tile *p) {
    const pk_type *ty = p->ty;
    const pk_acts *a = p->a;
    for (int t = 0; t < p->T; t++) {
        const int8_t *q = a->q + (size_t)(p->t0 + t) * a->K;
        const float *dx = a->dx + (size_t)(p->t0 + t) * a->nb, *sx = a->sx + (size_t)(p->t0 + t) * a->nb;
        for (int i = 0; i < p->nvalid; i++) {
            float acc = 0, mt = 0;
            for (int b = 0; b < a->nb; b++) {
                pk_blk s;
                grp_blk(ty, p->grp, i, b, &s);
                int32_t is = 0;
                for (int k = 0; k < 32; k++)
                    is += (ty->kind == PK_K6 ? s.s6[k / 16] : 1) * (s.u[k] - ty->off) * q[32 * b + k];
                float d = kern_f16_to_f32(s.d), dw = ty->kind == PK_K ? d * (float)s.sc : d;
                acc = fmaf(dw * dx[b], (float)is, acc);
                if (ty->kind == PK_DM) mt = fmaf(kern_f16_to_f32(s.m), sx[b], mt);
                if (ty->kind == PK_K) mt = fmaf(-(kern_f16_to_f32(s.m) * (float)s.mn), sx[b], mt);
            }
            p->o[(size_t)t * p->ldo + i] = has_min(ty) ? acc + mt : acc;
        }
    }
}

#define INL static inline __attribute__((always_inline))

#define PK_ATTR __attribute__((target("avx2,fma,f16c")))
#define PK_SUF(x) x##_avx2
/* AVX2 adds vpmaddubsw's 16-bit pair sums up before widening them, as many
 * as cannot overflow: 8 for 4-bit weights (8 x 2 x 15 x 127 < 32768), 4
 * for 5-bit (4 x 2 x 31 x 127), 2 for 6-bit (2 x 2 x 63 x 127) */
#define PK_VNNI 0
#include "kernels/cpu/matmul_a8p_simd.h"
#undef PK_ATTR
#undef PK_SUF
#undef PK_VNNI

#define PK_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define PK_SUF(x) x##_vnni
#define PK_VNNI 1
#include "kernels/cpu/matmul_a8p_simd.h"
#undef PK_ATTR
#undef PK_SUF
#undef PK_VNNI

/* ---- the op ---- */

typedef struct pk_args2 {
    const kern_weight *w;
    const pk_type *ty;
    const pk_acts *a;
    const int32_t *qlo;
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
                pk_tile p = {a->ty,
                             (const uint8_t *)w->data + (size_t)g * group_bytes(a->ty, w->cols),
                             a->a,
                             a->qlo,
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
    const pk_type *ty = pk_find(w->dtype);
    int32_t *qlo = NULL;
    if (ty->kind == PK_K6) { /* Q6_K's two scales per block want the first half's sum of q apart */
        size_t nq = (size_t)n * acts.nb;
        qlo = malloc(nq * sizeof *qlo);
        if (!qlo) return kern_fail(be, "matmul: out of memory for %zu block sums", nq);
        for (size_t i = 0; i < nq; i++) {
            int32_t s = 0;
            for (int k = 0; k < 16; k++) s += acts.q[32 * i + k];
            qlo[i] = s;
        }
    }
    static void (*const tiles[])(const pk_tile *) = {tile_c, tile_avx2, tile_vnni};
    pk_args2 a = {w, ty, &acts, qlo, out, n, path == CPU_A8_C ? 1 : 4, tiles[path]};
    int ng = (int)((w->rows + PG - 1) / PG);
    cpu_parallel_for(be, (ng + PG_TASK - 1) / PG_TASK, pk_mm_task, &a);
    free(qlo);
    return 0;
}
