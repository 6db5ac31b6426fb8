/*
 * cpu: causal GQA attention of a batch of sequences over a paged KV cache,
 * and the cache store. One task per (sequence, kv head with its group of
 * query heads, block of queries). Softmax in fp32 after subtracting the
 * row maximum (exp.c); the normaliser accumulates in double so long
 * contexts keep the small weights.
 * Each query row is computed the same way whatever else is in the batch, so
 * results are batch-invariant (the server's greedy outputs rely on it).
 * q·k and the weighted sum of v use fmas (matmul.c's cpu_dot, cpu_axpy,
 * through its tiles and register sums): the same bits on every instruction
 * set.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kv.h"

#define ATT_QBLOCK 64
#define ATT_GMAX 8 /* query heads per cpu_wsum_m call (it takes them four at a time) */
#define ATT_PACK_MIN 4 /* queries in a task from which it packs its kv head's keys and values */

typedef struct kvs_args {
    uint8_t *kc, *vc;
    const float *k, *v;
    const int32_t *slots;
    int n, hkv, hd, ntasks;
    kern_kv_dtype dt;
} kvs_args;

/* Rows [n*task/ntasks, n*(task+1)/ntasks), each head as kern_kv_store_ref
 * writes it (the reference is the implementation: a store is a small
 * share of a step, and its bytes are then the contract's by construction). */
static void kvs_task(void *arg, int task) {
    const kvs_args *a = arg;
    size_t hb = kern_kv_head_bytes(a->dt, a->hd), rb = (size_t)a->hkv * hb, kvdim = (size_t)a->hkv * a->hd;
    for (int i = a->n * task / a->ntasks; i < a->n * (task + 1) / a->ntasks; i++)
        for (int h = 0; h < a->hkv; h++) {
            size_t dst = (size_t)a->slots[i] * rb + (size_t)h * hb, src = (size_t)i * kvdim + (size_t)h * a->hd;
            kern_kv_store_ref(a->dt, 1, a->k + src, a->hd, a->kc + dst);
            kern_kv_store_ref(a->dt, 0, a->v + src, a->hd, a->vc + dst);
        }
}

int cpu_kv_store(kern_backend *be, void *kc, void *vc, const void *k, const void *v, const int32_t *slots, int n,
                 int hkv, int hd, kern_kv_dtype dt) {
    const char *why = dt == KERN_KV_NATIVE ? "unresolved (KERN_KV_NATIVE)" : kern_kv_invalid(dt, hd);
    if (why) return kern_fail(be, "kv_store: KV cache dtype %s: %s", kern_kv_dtype_name(dt), why);
    for (int i = 0; i < n; i++)
        if (slots[i] < 0) return kern_fail(be, "kv_store: negative cache slot %d", slots[i]);
    int kvdim = hkv * hd;
    if (dt == KERN_KV_F32) {
        float *K = kc, *V = vc;
        const float *ks = k, *vs = v;
        for (int i = 0; i < n; i++) {
            memcpy(K + (size_t)slots[i] * kvdim, ks + (size_t)i * kvdim, (size_t)kvdim * sizeof(float));
            memcpy(V + (size_t)slots[i] * kvdim, vs + (size_t)i * kvdim, (size_t)kvdim * sizeof(float));
        }
        return 0;
    }
    int nt = n < 64 ? 1 : 4 * cpu_nthreads(be);
    if (nt > n) nt = n;
    if (nt <= 0) return 0;
    kvs_args a = {kc, vc, k, v, slots, n, hkv, hd, nt, dt};
    if (nt == 1)
        kvs_task(&a, 0);
    else
        cpu_parallel_for(be, nt, kvs_task, &a);
    return 0;
}

typedef struct att_task_ref {
    int seq, head, q0, q1; /* rows q0..q1-1 of sequence seq, for kv head `head` */
    int g0, ng;            /* its query heads g0 .. g0+ng-1 of the group */
} att_task_ref;

typedef struct att_args {
    float *out;
    const float *q;
    const uint8_t *kc, *vc;
    size_t row_bytes, head_bytes; /* kern_kv_row_bytes, kern_kv_head_bytes */
    kern_kv_dtype dt;
    const kern_attn_batch *b;
    const att_task_ref *tasks;
    int hq, hkv, hd;
    float scale;
    int isa;
    int failed;
} att_args;

/* rows n of hd query values (ldq apart) into dst (hd apart), each rotated
 * as q8_0's keys are (kernels.h, kern_kv_dtype) */
static void att_rotate(float *dst, const float *q, size_t ldq, int n, int hd) {
    for (int i = 0; i < n; i++) {
        memcpy(dst + (size_t)i * hd, q + (size_t)i * ldq, (size_t)hd * sizeof *dst);
        kern_kv_rotate(dst + (size_t)i * hd, hd);
    }
}

static void att_task(void *arg, int task) {
    att_args *a = arg;
    const att_task_ref *t = &a->tasks[task];
    const kern_attn_batch *b = a->b;
    const int kvh = t->head, G = t->ng, h0 = kvh * (a->hq / a->hkv) + t->g0;
    int hd = a->hd, qdim = a->hq * hd, bs = b->block_size;
    const int wide = a->dt == KERN_KV_F32, rot = a->dt == KERN_KV_Q8_0;
    const int32_t *table = b->block_table + (size_t)t->seq * b->max_blocks;
    int pos_first = b->pos0[t->seq] + (t->q0 - b->q_start[t->seq]);
    int maxlen = pos_first + (t->q1 - t->q0);
    int nqb = t->q1 - t->q0;
    /* This kv head's keys and values, packed: in the cache they sit kvdim
     * floats apart (often 4 KiB, so every row maps to the same L1 sets) and
     * every query of the task reads them all. Fewer than ATT_PACK_MIN
     * queries (decode) read them in place: packing would read and write
     * every key and value once more than the queries read them. A 16- or
     * 8-bit cache is widened while packing; in place, every type is read
     * as stored by kvcache.c's decode kernels. */
    const int pack = nqb >= ATT_PACK_MIN;
    /* the block's scores (maxlen apart) for one head at a time when
     * packed, for the whole group in place (each key read once for it) */
    const size_t sn = (size_t)nqb * maxlen;
    float *s = malloc((pack ? 1 : (size_t)G) * sn * sizeof *s);
    const float **krow = malloc((size_t)maxlen * sizeof *krow), **vrow = malloc((size_t)maxlen * sizeof *vrow);
    const uint8_t **kb = malloc((size_t)maxlen * sizeof *kb), **vb = malloc((size_t)maxlen * sizeof *vb);
    float *kv = pack ? malloc(2 * (size_t)maxlen * hd * sizeof *kv) : NULL;
    float *qr = rot ? malloc((size_t)(pack ? nqb : G) * hd * sizeof *qr) : NULL;
    if (!s || !krow || !vrow || !kb || !vb || (pack && !kv) || (rot && !qr)) {
        a->failed = 1;
        goto out;
    }
    /* Resolve the block table once per task rather than per query (block
     * by block: no division per position). */
    for (int p = 0, off = 0, blk = 0; p < maxlen; p++) {
        if (off == bs) {
            off = 0;
            blk++;
        }
        size_t row = (size_t)table[blk] * bs + (size_t)off++;
        kb[p] = a->kc + row * a->row_bytes + (size_t)kvh * a->head_bytes;
        vb[p] = a->vc + row * a->row_bytes + (size_t)kvh * a->head_bytes;
        krow[p] = (const float *)kb[p];
        vrow[p] = (const float *)vb[p];
    }
    if (pack)
        for (int p = 0, run; p < maxlen; p += run) {
            run = bs - p % bs;
            if (run > maxlen - p) run = maxlen - p;
            float *kp = kv + (size_t)p * hd, *vp = kv + ((size_t)maxlen + p) * hd;
            if (wide) {
                for (int r = 0; r < run; r++) {
                    memcpy(kp + (size_t)r * hd, krow[p + r], (size_t)hd * sizeof *kp);
                    memcpy(vp + (size_t)r * hd, vrow[p + r], (size_t)hd * sizeof *vp);
                }
            } else { /* a run's rows are consecutive cache rows */
                cpu_kv_load_rows(a->isa, a->dt, kb[p], a->row_bytes, run, hd, kp, (size_t)hd);
                cpu_kv_load_rows(a->isa, a->dt, vb[p], a->row_bytes, run, hd, vp, (size_t)hd);
            }
            for (int r = 0; r < run; r++) {
                krow[p + r] = kp + (size_t)r * hd;
                vrow[p + r] = vp + (size_t)r * hd;
            }
        }
    /* In place: the group's G query heads (hd apart) against every key of
     * the sequence, read as stored through the row pointers (kvcache.c:
     * cpu_dot's bits on kern_kv_load_ref's values, each key widened in
     * registers). */
    if (!pack)
        for (int i = t->q0; i < t->q1; i++) {
            const float *qi = a->q + (size_t)i * qdim + (size_t)h0 * hd;
            if (rot) {
                att_rotate(qr, qi, (size_t)hd, G, hd);
                qi = qr;
            }
            cpu_kv_scores(a->isa, a->dt, qi, (size_t)hd, G, kb, pos_first + (i - t->q0) + 1, hd,
                          s + (size_t)(i - t->q0) * maxlen, sn);
        }
    for (int g = 0; g < G; g++) {
        const int h = h0 + g;
        float *sh = pack ? s : s + g * sn;
        /* all the block's q·k at once (the causal tail of the last rows is
         * computed and ignored), then each query on its own */
        if (pack) {
            const float *qh = a->q + (size_t)t->q0 * qdim + (size_t)h * hd;
            size_t ldq = (size_t)qdim;
            if (rot) {
                att_rotate(qr, qh, ldq, nqb, hd);
                qh = qr;
                ldq = (size_t)hd;
            }
            cpu_scores(a->isa, qh, ldq, nqb, kv, maxlen, hd, sh, (size_t)maxlen);
        }
        for (int i = t->q0; i < t->q1; i++) {
            float *o = a->out + (size_t)i * qdim + (size_t)h * hd;
            float *sr = sh + (size_t)(i - t->q0) * maxlen;
            int len = pos_first + (i - t->q0) + 1;
            cpu_softmax(a->isa, sr, len, a->scale);
            memset(o, 0, (size_t)hd * sizeof *o);
        }
        if (!pack) continue; /* p·v for the whole group below */
        /* p·v four queries at a time (each value row read once for the four) */
        int i = t->q0;
        for (; i + 4 <= t->q1; i += 4) {
            float *o4[4];
            const float *w4[4];
            int n4[4];
            for (int j = 0; j < 4; j++) {
                o4[j] = a->out + (size_t)(i + j) * qdim + (size_t)h * hd;
                w4[j] = sh + (size_t)(i + j - t->q0) * maxlen;
                n4[j] = pos_first + (i + j - t->q0) + 1;
            }
            cpu_wsum4(a->isa, o4, w4, vrow, n4, hd);
        }
        for (; i < t->q1; i++)
            cpu_wsum(a->isa, a->out + (size_t)i * qdim + (size_t)h * hd, sh + (size_t)(i - t->q0) * maxlen, vrow,
                     pos_first + (i - t->q0) + 1, hd);
    }
    /* In place: each query's G heads over the same value rows, read as
     * stored (cpu_wsum's bits on kern_kv_load_ref's values), each row
     * widened once for up to four heads. */
    for (int i = t->q0; !pack && i < t->q1; i++) {
        float *o[ATT_GMAX];
        const float *w[ATT_GMAX];
        for (int g0 = 0; g0 < G; g0 += ATT_GMAX) {
            int m = G - g0 < ATT_GMAX ? G - g0 : ATT_GMAX;
            for (int g = 0; g < m; g++) {
                o[g] = a->out + (size_t)i * qdim + (size_t)(h0 + g0 + g) * hd;
                w[g] = s + (size_t)(g0 + g) * sn + (size_t)(i - t->q0) * maxlen;
            }
            cpu_kv_wsum(a->isa, a->dt, o, w, m, vb, pos_first + (i - t->q0) + 1, hd);
        }
    }
out:
    free(s);
    free(krow);
    free(vrow);
    free(kb);
    free(vb);
    free(kv);
    free(qr);
}

int cpu_attention(kern_backend *be, void *out, const void *q, const void *kc, const void *vc, const kern_attn_batch *b,
                  int hq, int hkv, int hd, float scale, kern_kv_dtype dt) {
    const char *why = dt == KERN_KV_NATIVE ? "unresolved (KERN_KV_NATIVE)" : kern_kv_invalid(dt, hd);
    if (why) return kern_fail(be, "attention: KV cache dtype %s: %s", kern_kv_dtype_name(dt), why);
    if (hkv <= 0 || hq % hkv)
        return kern_fail(be, "attention: %d query heads not a multiple of %d kv heads", hq, hkv);
    if (b->block_size <= 0 || b->max_blocks <= 0) return kern_fail(be, "attention: bad paging geometry");
    int ntasks = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int n = b->q_start[s + 1] - b->q_start[s];
        if (n < 0 || b->pos0[s] < 0) return kern_fail(be, "attention: sequence %d has a negative length", s);
        if (b->pos0[s] + n > b->max_blocks * b->block_size)
            return kern_fail(be, "attention: sequence %d reaches position %d beyond its %d blocks", s, b->pos0[s] + n,
                             b->max_blocks);
        ntasks += hkv * ((n + ATT_QBLOCK - 1) / ATT_QBLOCK);
    }
    if (ntasks == 0) return 0;
    /* Few tasks (decode of a small batch: as many as kv heads) leave
     * threads idle (3 tasks on 2 threads: 2/3 of them busy); then a query
     * head is a task, reading its group's keys again (from L2) for a
     * balanced split. Each head's bits are the same either way. */
    const int G = hq / hkv, split = ntasks < 2 * cpu_nthreads(be) ? G : 1;
    ntasks *= split;
    att_task_ref *tasks = malloc((size_t)ntasks * sizeof *tasks);
    if (!tasks) return kern_fail(be, "attention: out of memory");
    int k = 0;
    for (int s = 0; s < b->n_seqs; s++)
        for (int h = 0; h < hkv; h++) /* a task: one kv head and its group of query heads */
            for (int q0 = b->q_start[s]; q0 < b->q_start[s + 1]; q0 += ATT_QBLOCK) {
                int q1 = q0 + ATT_QBLOCK < b->q_start[s + 1] ? q0 + ATT_QBLOCK : b->q_start[s + 1];
                for (int g = 0; g < split; g++)
                    tasks[k++] = (att_task_ref){s, h, q0, q1, g * (G / split), G / split};
            }
    att_args a = {out,  q,     kc, vc, kern_kv_row_bytes(dt, hkv, hd), kern_kv_head_bytes(dt, hd), dt, b, tasks, hq,
                  hkv,  hd,    scale, cpu_isa(be), 0};
    cpu_parallel_for(be, ntasks, att_task, &a);
    free(tasks);
    if (a.failed) return kern_fail(be, "attention: out of memory for scores");
    return 0;
}
