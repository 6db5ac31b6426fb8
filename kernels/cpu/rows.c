/*
 * cpu backend: a weight's rows as dense fp32, every dtype (the norms, the
 * embedding, the exact matmul and uploads read weights through this). The
 * packed _A8 layouts are read by their own files; everything else by
 * quant.c.
 */
#include "kernels/cpu/cpu.h"

void cpu_load_rows(float *dst, const kern_weight *w, int64_t r0, int64_t nrows) {
    int64_t cols = w->cols;
    if (w->dtype == KERN_Q8_0_A8) {
        for (int64_t r = 0; r < nrows; r++) cpu_q8a8_row(w, r0 + r, dst + r * cols);
        return;
    }
    if (cpu_is_a8p(w->dtype)) {
        for (int64_t r = 0; r < nrows; r++) cpu_a8p_row(w, r0 + r, dst + r * cols);
        return;
    }
    cpu_load_plain_rows(dst, w, r0, nrows);
}
