/*
 * cpu: embedding gather, silu_mul, add. Memory-bound and cheap next to the
 * matmuls, so they run on the calling thread.
 */
#include <math.h>

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

void *cpu_stream(kern_backend *be) {
    (void)be;
    return NULL; /* no stream: host ops complete before they return */
}
