/*
 * cpu: RMSNorm over rows, Qwen3 flavour (weight multiplies directly, no +1).
 * The mean of squares accumulates in double: for a 4096-wide row an fp32 sum
 * would drift by ~1e-6 relative, which shows up in logit comparisons.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

int cpu_rmsnorm(kern_backend *be, void *out, const void *in, const kern_weight *w, int rows, int dim,
                float eps) {
    if (w->rows != 1 || w->cols != dim)
        return kern_fail(be, "rmsnorm: weight is (%lld, %lld), expected (1, %d)", (long long)w->rows,
                         (long long)w->cols, dim);
    float *wf = malloc((size_t)dim * sizeof *wf);
    if (!wf) return kern_fail(be, "rmsnorm: out of memory");
    cpu_load_rows(wf, w, 0, 1);
    const float *x = in;
    float *o = out;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *or = o + (size_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
        for (int i = 0; i < dim; i++) or[i] = wf[i] * (xr[i] * inv);
    }
    free(wf);
    return 0;
}
