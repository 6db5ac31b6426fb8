/*
 * cpu: causal GQA attention for one sequence against its KV cache.
 * One task per (query head, block of queries). Softmax in fp32 after
 * subtracting the row maximum; the normaliser accumulates in double so long
 * contexts do not lose the small weights.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define ATT_QBLOCK 16

typedef struct att_args {
    float *out;
    const float *q, *kc, *vc;
    int n, pos0, hq, hkv, hd;
    float scale;
    int failed;
} att_args;

static void att_task(void *arg, int task) {
    att_args *a = arg;
    int nqb = (a->n + ATT_QBLOCK - 1) / ATT_QBLOCK;
    int h = task / nqb, qb = task % nqb;
    int kvh = h / (a->hq / a->hkv);
    int hd = a->hd, qdim = a->hq * hd, kvdim = a->hkv * hd;
    int i0 = qb * ATT_QBLOCK, i1 = i0 + ATT_QBLOCK < a->n ? i0 + ATT_QBLOCK : a->n;
    float *s = malloc((size_t)(a->pos0 + i1) * sizeof *s);
    if (!s) {
        a->failed = 1;
        return;
    }
    for (int i = i0; i < i1; i++) {
        const float *q = a->q + (size_t)i * qdim + (size_t)h * hd;
        float *o = a->out + (size_t)i * qdim + (size_t)h * hd;
        int len = a->pos0 + i + 1;
        float mx = -INFINITY;
        for (int t = 0; t < len; t++) {
            const float *k = a->kc + (size_t)t * kvdim + (size_t)kvh * hd;
            float d = 0;
            for (int c = 0; c < hd; c++) d += q[c] * k[c];
            s[t] = d * a->scale;
            if (s[t] > mx) mx = s[t];
        }
        double sum = 0;
        for (int t = 0; t < len; t++) {
            s[t] = expf(s[t] - mx);
            sum += s[t];
        }
        float inv = (float)(1.0 / sum);
        memset(o, 0, (size_t)hd * sizeof *o);
        for (int t = 0; t < len; t++) {
            const float *v = a->vc + (size_t)t * kvdim + (size_t)kvh * hd;
            float p = s[t] * inv;
            for (int c = 0; c < hd; c++) o[c] += p * v[c];
        }
    }
    free(s);
}

int cpu_attention(kern_backend *be, void *out, const void *q, const void *kc, const void *vc, int n, int pos0,
                  int hq, int hkv, int hd, float scale) {
    if (hkv <= 0 || hq % hkv) return kern_fail(be, "attention: %d query heads not a multiple of %d kv heads", hq, hkv);
    if (n <= 0) return 0;
    att_args a = {out, q, kc, vc, n, pos0, hq, hkv, hd, scale, 0};
    int nqb = (n + ATT_QBLOCK - 1) / ATT_QBLOCK;
    cpu_parallel_for(be, hq * nqb, att_task, &a);
    if (a.failed) return kern_fail(be, "attention: out of memory for %d scores", pos0 + n);
    return 0;
}
