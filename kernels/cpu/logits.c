/*
 * cpu: logits_topk — per row, the k largest logits (ties by ascending
 * column) and the row's log-sum-exp (see kernels.h).
 *
 * Exact: ids/vals are the true top-k of the fp32 row. A row is cut into
 * fixed chunks of TOPK_CHUNK columns so that one long row (a 152k
 * vocabulary at decode) still spreads over the pool; each (row, chunk) task
 * keeps its own sorted top-k, max and max-shifted sum, and the caller
 * merges the chunks of a row in chunk order. Chunk boundaries do not depend
 * on the thread count, so the result is the same on every machine.
 *
 * lse is accumulated in double (exp of x - max per value, chunk sums
 * rescaled to the row max) and rounded once to float, so it is the
 * correctly rounded log-sum-exp up to double's error. A row holding any
 * inf/nan gets lse = NaN; in such a row a NaN ranks as -inf in the
 * selection (ids stay within the row).
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

#define TOPK_CHUNK 16384

typedef struct topk_part {
    int n;      /* candidates held, <= k */
    int bad;    /* an inf or nan was seen */
    float mx;   /* largest finite value, -inf if none */
    double sum; /* sum of exp(x - mx) over the chunk's values */
    int32_t ids[KERN_TOPK_MAX];
    float vals[KERN_TOPK_MAX];
} topk_part;

typedef struct topk_job {
    const float *x;
    int vocab, k, nchunks;
    topk_part *parts; /* (rows, nchunks) */
    int isa;
} topk_job;

/* The selection order: larger value first, then smaller column. */
static int topk_better(float va, int32_t ia, float vb, int32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

static void topk_task(void *arg, int task) {
    const topk_job *j = arg;
    int row = task / j->nchunks, c = task % j->nchunks, k = j->k;
    int c0 = c * TOPK_CHUNK, c1 = c0 + TOPK_CHUNK < j->vocab ? c0 + TOPK_CHUNK : j->vocab;
    const float *x = j->x + (size_t)row * j->vocab;
    topk_part *p = &j->parts[task];
    float mx = -INFINITY;
    int have = 0, bad = 0;
    /* Columns ascend, and a value enters only when strictly larger than
     * what it passes, so equal values keep ascending column order. */
    for (int i = c0; i < c1; i++) {
        float v = x[i];
        if (!isfinite(v)) {
            bad = 1;
            if (isnan(v)) v = -INFINITY;
        } else if (v > mx) {
            mx = v;
        }
        if (have == k && !(v > p->vals[k - 1])) continue;
        int s = have < k ? have++ : k - 1;
        while (s > 0 && v > p->vals[s - 1]) {
            p->vals[s] = p->vals[s - 1];
            p->ids[s] = p->ids[s - 1];
            s--;
        }
        p->vals[s] = v;
        p->ids[s] = i;
    }
    /* exp(x - mx) in double, added in column order (cpu_exp_sum: glibc's
     * exp, four at a time on the vector paths, the same bits) */
    double sum = bad ? 0 : cpu_exp_sum(j->isa, x + c0, c1 - c0, mx);
    p->n = have;
    p->bad = bad;
    p->mx = mx;
    p->sum = sum;
}

int cpu_logits_topk(kern_backend *be, const void *logits, int rows, int vocab, int k, int32_t *ids, float *vals,
                    float *lse) {
    if (rows < 0 || vocab < 1)
        return kern_fail(be, "logits_topk: bad shape (%d rows, vocab %d)", rows, vocab);
    if (k < 1 || k > KERN_TOPK_MAX || k > vocab)
        return kern_fail(be, "logits_topk: k = %d outside 1..min(vocab %d, %d)", k, vocab, KERN_TOPK_MAX);
    if (rows == 0) return 0;
    if (!logits || !ids || !vals || !lse) return kern_fail(be, "logits_topk: NULL array");
    int nchunks = (vocab + TOPK_CHUNK - 1) / TOPK_CHUNK;
    if ((long long)rows * nchunks > (1 << 30)) return kern_fail(be, "logits_topk: %d rows is too many", rows);
    topk_job j = {logits, vocab, k, nchunks, malloc((size_t)rows * nchunks * sizeof(topk_part)), cpu_isa(be)};
    int *head = malloc((size_t)nchunks * sizeof *head); /* merge position per chunk */
    if (!j.parts || !head) {
        free(j.parts);
        free(head);
        return kern_fail(be, "logits_topk: out of memory for %d rows", rows);
    }
    cpu_parallel_for(be, rows * nchunks, topk_task, &j);
    for (int r = 0; r < rows; r++) {
        const topk_part *p = j.parts + (size_t)r * nchunks;
        /* log-sum-exp: rescale each chunk's sum to the row max, in chunk order */
        float mx = -INFINITY;
        int bad = 0;
        for (int c = 0; c < nchunks; c++) {
            bad |= p[c].bad;
            if (p[c].mx > mx) mx = p[c].mx;
        }
        double sum = 0;
        for (int c = 0; !bad && c < nchunks; c++) sum += p[c].sum * exp((double)p[c].mx - (double)mx);
        lse[r] = bad ? NAN : (float)((double)mx + log(sum));
        /* k-way merge of the chunks' sorted lists (each holds
         * min(k, its columns) values, together at least k) */
        int32_t *oi = ids + (size_t)r * k;
        float *ov = vals + (size_t)r * k;
        for (int c = 0; c < nchunks; c++) head[c] = 0;
        for (int t = 0; t < k; t++) {
            int best = -1;
            for (int c = 0; c < nchunks; c++) {
                if (head[c] >= p[c].n) continue;
                if (best < 0 || topk_better(p[c].vals[head[c]], p[c].ids[head[c]], p[best].vals[head[best]],
                                            p[best].ids[head[best]]))
                    best = c;
            }
            oi[t] = p[best].ids[head[best]];
            ov[t] = p[best].vals[head[best]];
            head[best]++;
        }
    }
    free(head);
    free(j.parts);
    return 0;
}
