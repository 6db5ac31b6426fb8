/*
 * cpu: out(n, w.rows) = in(n, w.cols) · wᵀ in fp32.
 *
 * Work is split into blocks of MM_ROWS output features. A block converts its
 * weight rows to fp32 once and reuses them for every input row, so a prefill
 * of n tokens converts each weight once, not n times. The dot product keeps
 * 8 independent partial sums: that is what lets gcc vectorize it without
 * -ffast-math (no reassociation of a single sum is needed).
 */
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

#define MM_ROWS 16

typedef struct mm_args {
    float *out;
    const float *in;
    const kern_weight *w;
    int n;
    int failed; /* set by a task that could not allocate */
} mm_args;

static float mm_dot(const float *restrict a, const float *restrict b, int len) {
    float acc[8] = {0};
    int k = 0;
    for (; k + 8 <= len; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[k + l] * b[k + l];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; k < len; k++) s += a[k] * b[k];
    return s;
}

static void mm_task(void *arg, int task) {
    mm_args *a = arg;
    int cols = (int)a->w->cols, rows = (int)a->w->rows;
    int r0 = task * MM_ROWS, r1 = r0 + MM_ROWS < rows ? r0 + MM_ROWS : rows;
    float *wf = malloc((size_t)(r1 - r0) * cols * sizeof *wf);
    if (!wf) {
        a->failed = 1;
        return;
    }
    cpu_load_rows(wf, a->w, r0, r1 - r0);
    for (int i = 0; i < a->n; i++) {
        const float *x = a->in + (size_t)i * cols;
        float *o = a->out + (size_t)i * rows;
        for (int r = r0; r < r1; r++) o[r] = mm_dot(x, wf + (size_t)(r - r0) * cols, cols);
    }
    free(wf);
}

int cpu_matmul(kern_backend *be, void *out, const void *in, const kern_weight *w, int n) {
    if (out == in) return kern_fail(be, "matmul: out must not alias in");
    mm_args a = {out, in, w, n, 0};
    int ntasks = (int)((w->rows + MM_ROWS - 1) / MM_ROWS);
    cpu_parallel_for(be, ntasks, mm_task, &a);
    if (a.failed) return kern_fail(be, "matmul: out of memory for a %dx%lld weight block", MM_ROWS,
                                   (long long)w->cols);
    return 0;
}
