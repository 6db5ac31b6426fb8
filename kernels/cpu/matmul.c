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
#include <string.h>

#include "kernels/cpu/cpu.h"

#define MM_ROWS 16

typedef struct mm_args {
    float *out;
    const float *in;
    const kern_weight *w;
    int n;
    int failed; /* set by a task that could not allocate */
} mm_args;

/* The dot kernels keep 8 independent partial sums (lanes), written with
 * gcc's vector extension so the lane structure is explicit: baseline x86
 * runs it as two SSE registers, the AVX2 clone (picked by the loader on
 * machines that have it) as one. The arithmetic is the same in both -- per
 * lane a[k]*b[k] added in k order, no FMA contraction (ISO C mode), one fixed
 * final reduction -- so results depend neither on the machine nor on how
 * many tokens share a call: the batch invariance the server relies on. */
typedef float mm_v8 __attribute__((vector_size(32)));
#define MM_CLONES __attribute__((target_clones("avx2", "default")))
#define MM_REDUCE(c) (((c[0] + c[4]) + (c[1] + c[5])) + ((c[2] + c[6]) + (c[3] + c[7])))

/* Unaligned load (a macro: a function returning a 32-byte vector would have
 * a different ABI in the AVX2 clone). */
#define MM_LOAD(v, p) memcpy(&(v), (p), sizeof(mm_v8))

MM_CLONES float cpu_dot(const float *a, const float *b, int len) {
    mm_v8 acc = {0};
    int k = 0;
    for (; k + 8 <= len; k += 8) {
        mm_v8 x, w;
        MM_LOAD(x, a + k);
        MM_LOAD(w, b + k);
        acc += x * w;
    }
    float s = MM_REDUCE(acc);
    for (; k < len; k++) s += a[k] * b[k];
    return s;
}

/* Four tokens against one weight row: each weight vector is loaded once for
 * four products; per token the operations are exactly cpu_dot's. */
MM_CLONES static void mm_dot4(const float *a0, const float *a1, const float *a2, const float *a3, const float *b,
                              int len, float *out, size_t stride) {
    mm_v8 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
    int k = 0;
    for (; k + 8 <= len; k += 8) {
        mm_v8 w, x0, x1, x2, x3;
        MM_LOAD(w, b + k);
        MM_LOAD(x0, a0 + k);
        MM_LOAD(x1, a1 + k);
        MM_LOAD(x2, a2 + k);
        MM_LOAD(x3, a3 + k);
        c0 += x0 * w;
        c1 += x1 * w;
        c2 += x2 * w;
        c3 += x3 * w;
    }
    float s0 = MM_REDUCE(c0), s1 = MM_REDUCE(c1), s2 = MM_REDUCE(c2), s3 = MM_REDUCE(c3);
    for (; k < len; k++) {
        s0 += a0[k] * b[k];
        s1 += a1[k] * b[k];
        s2 += a2[k] * b[k];
        s3 += a3[k] * b[k];
    }
    out[0] = s0;
    out[stride] = s1;
    out[2 * stride] = s2;
    out[3 * stride] = s3;
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
    int i = 0;
    for (; i + 4 <= a->n; i += 4) {
        const float *x = a->in + (size_t)i * cols;
        float *o = a->out + (size_t)i * rows;
        for (int r = r0; r < r1; r++)
            mm_dot4(x, x + cols, x + 2 * (size_t)cols, x + 3 * (size_t)cols, wf + (size_t)(r - r0) * cols, cols, o + r,
                    (size_t)rows);
    }
    for (; i < a->n; i++) {
        const float *x = a->in + (size_t)i * cols;
        float *o = a->out + (size_t)i * rows;
        for (int r = r0; r < r1; r++) o[r] = cpu_dot(x, wf + (size_t)(r - r0) * cols, cols);
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
