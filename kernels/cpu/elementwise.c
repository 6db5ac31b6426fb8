/*
 * cpu: embedding gather, silu_mul, add. Memory-bound and cheap next to the
 * matmuls, so they run on the calling thread.
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

int cpu_silu_mul(kern_backend *be, void *out, const void *gate, const void *up, size_t count) {
    (void)be;
    float *o = out;
    const float *g = gate, *u = up;
    for (size_t i = 0; i < count; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
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
