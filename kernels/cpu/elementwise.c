/*
 * cpu: embedding gather, silu_mul, add. Memory-bound and cheap next to the
 * matmuls, so they run on the calling thread, except silu_mul's expf.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

int cpu_embedding(kern_backend *be, void *out, const kern_weight *table, const int32_t *ids, int n) {
    float *o = out;
    size_t dim = (size_t)table->cols;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= table->rows)
            return kern_fail(be, "embedding: token id %d out of range [0, %lld)", ids[i], (long long)table->rows);
        cpu_load_rows(o + (size_t)i * dim, table, ids[i], 1);
    }
    return 0;
}

typedef struct silu_args {
    float *o;
    const float *g, *u;
    size_t count;
} silu_args;

#define SILU_SPAN 16384 /* elements per task: each element is independent */

static void silu_task(void *arg, int task) {
    silu_args *a = arg;
    size_t i0 = (size_t)task * SILU_SPAN, i1 = i0 + SILU_SPAN < a->count ? i0 + SILU_SPAN : a->count;
    for (size_t i = i0; i < i1; i++) a->o[i] = a->g[i] / (1.0f + expf(-a->g[i])) * a->u[i];
}

/* The one elementwise op with real work per element (expf): split across
 * the pool for prefill-sized counts; the same bits either way. */
int cpu_silu_mul(kern_backend *be, void *out, const void *gate, const void *up, size_t count) {
    silu_args a = {out, gate, up, count};
    cpu_parallel_for(be, (int)((count + SILU_SPAN - 1) / SILU_SPAN), silu_task, &a);
    return 0;
}

int cpu_add(kern_backend *be, void *x, const void *y, size_t count) {
    (void)be;
    float *a = x;
    const float *b = y;
    for (size_t i = 0; i < count; i++) a[i] += b[i];
    return 0;
}

int cpu_add_bias(kern_backend *be, void *x, const kern_weight *b, int rows, int dim) {
    if (b->rows != 1 || b->cols != dim)
        return kern_fail(be, "add_bias: bias is (%lld, %lld), expected (1, %d)", (long long)b->rows,
                         (long long)b->cols, dim);
    float *bf = malloc((size_t)(dim > 0 ? dim : 1) * sizeof *bf);
    if (!bf) return kern_fail(be, "add_bias: out of memory");
    cpu_load_rows(bf, b, 0, 1);
    float *a = x;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < dim; i++) a[(size_t)r * dim + i] += bf[i];
    free(bf);
    return 0;
}

void *cpu_stream(kern_backend *be) {
    (void)be;
    return NULL; /* no stream: host ops complete before they return */
}
