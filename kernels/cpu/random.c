/*
 * cpu: random_weight — a backend-owned fp32 weight filled from the counter
 * hash kern_random_u (kernels/kernels.h), for benchmarks and smoke runs of
 * model shapes that have no checkpoint files ("random:" models, model/).
 * Each value depends only on (seed, global index), so the rows are filled
 * in parallel and a shard equals the same slice of the unsharded matrix.
 */
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

typedef struct rw_args {
    float *out;
    int64_t rows, cols, row0, col0, full_cols;
    uint64_t seed;
    float offset, scale;
    int ntasks;
} rw_args;

static void rw_task(void *p, int task) {
    const rw_args *a = p;
    int64_t r0 = a->rows * task / a->ntasks, r1 = a->rows * (task + 1) / a->ntasks;
    for (int64_t r = r0; r < r1; r++) {
        float *o = a->out + (size_t)r * (size_t)a->cols;
        uint64_t base = (uint64_t)(a->row0 + r) * (uint64_t)a->full_cols + (uint64_t)a->col0;
        for (int64_t c = 0; c < a->cols; c++) o[c] = a->offset + a->scale * kern_random_u(a->seed, base + (uint64_t)c);
    }
}

int cpu_random_weight(kern_backend *be, kern_weight *dev, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                      int64_t full_cols, uint64_t seed, float offset, float scale) {
    if (rows < 1 || cols < 1 || row0 < 0 || col0 < 0 || full_cols < col0 + cols || rows > ((int64_t)1 << 40) / cols)
        return kern_fail(be, "random_weight: bad shape (%lld, %lld) at (%lld, %lld) of %lld columns", (long long)rows,
                         (long long)cols, (long long)row0, (long long)col0, (long long)full_cols);
    float *out = cpu_mem_alloc(be, (size_t)rows * (size_t)cols * sizeof *out);
    if (!out)
        return kern_fail(be, "random_weight: out of memory for (%lld, %lld) fp32", (long long)rows, (long long)cols);
    int nt = cpu_nthreads(be) * 4;
    if (nt > rows) nt = (int)rows;
    rw_args a = {out, rows, cols, row0, col0, full_cols, seed, offset, scale, nt};
    cpu_parallel_for(be, nt, rw_task, &a);
    if (cpu_owned_add(be, out)) {
        free(out);
        return kern_fail(be, "random_weight: out of memory");
    }
    *dev = (kern_weight){out, KERN_F32, rows, cols, 0};
    return 0;
}
