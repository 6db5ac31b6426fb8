/*
 * cpu: fused ops, the twins of the GPU path's fused kernels.
 *
 * Each op is defined as the unfused sequence it replaces (kernels/kernels.h),
 * and here it computes exactly that, bit for bit in fp32: the same
 * expressions, in the same order, as add() (elementwise.c), rmsnorm()
 * (rmsnorm.c) and rope() (rope.c). Fusing only saves passes over memory; on
 * fp32 activations the intermediate values written by the unfused ops are the
 * very values carried in registers here, so the model's cpu results do not
 * change when it switches to these ops. Like the unfused ops (memory-bound,
 * cheap next to the matmuls) they run on the calling thread.
 *
 * Why the order matters: the sum of squares is a sequential double sum over
 * the row, inv is formed in double and rounded to float, and each output is
 * w * (x * inv); the rotation uses HF's fp32 angle recipe. Any reordering
 * (a pairwise sum, w * x * inv) would move the last bits.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

/* rmsnorm.c's message for a weight of the wrong shape, prefixed by the op. */
static int check_norm_weight(kern_backend *be, const char *op, const char *which, const kern_weight *w, int dim) {
    if (w->rows != 1 || w->cols != dim)
        return kern_fail(be, "%s: %sweight is (%lld, %lld), expected (1, %d)", op, which, (long long)w->rows,
                         (long long)w->cols, dim);
    return 0;
}

int cpu_add_rmsnorm(kern_backend *be, void *x, const void *y, void *out, const kern_weight *w, int rows, int dim,
                    float eps) {
    if (rows < 0 || dim <= 0) return kern_fail(be, "add_rmsnorm: bad shape (%d, %d)", rows, dim);
    if (check_norm_weight(be, "add_rmsnorm", "", w, dim)) return -1;
    /* out is written while x is still being read (and y may be x) */
    if (out == x || out == y) return kern_fail(be, "add_rmsnorm: out must not alias x or y");
    if (rows == 0) return 0;
    float *wf = malloc((size_t)dim * sizeof *wf);
    if (!wf) return kern_fail(be, "add_rmsnorm: out of memory");
    cpu_load_rows(wf, w, 0, 1);
    float *xs = x;
    const float *ys = y;
    float *os = out;
    for (int r = 0; r < rows; r++) {
        float *xr = xs + (size_t)r * dim;
        const float *yr = ys + (size_t)r * dim;
        float *or = os + (size_t)r * dim;
        /* add() then rmsnorm()'s sum, in one pass: the sum reads the stored
         * fp32 sum, element by element in the same order */
        double ss = 0;
        for (int i = 0; i < dim; i++) {
            xr[i] += yr[i];
            ss += (double)xr[i] * xr[i];
        }
        float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
        for (int i = 0; i < dim; i++) or[i] = wf[i] * (xr[i] * inv);
    }
    free(wf);
    return 0;
}

/* rmsnorm() of one head in place, then rope()'s rotation of it with the
 * token's cos/sin table cs (cos in [0, half), sin in [half, 2*half)). The
 * normalised values are stored before the rotation reads them, exactly as
 * the unfused ops leave them in memory between the two calls. */
static void norm_rotate_head(float *v, const float *wf, const float *cs, int hd, float eps) {
    int half = hd / 2;
    double ss = 0;
    for (int i = 0; i < hd; i++) ss += (double)v[i] * v[i];
    float inv = (float)(1.0 / sqrt(ss / hd + (double)eps));
    for (int i = 0; i < hd; i++) v[i] = wf[i] * (v[i] * inv);
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half], c = cs[i], s = cs[half + i];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

int cpu_qk_norm_rope(kern_backend *be, void *q, void *k, const kern_weight *qw, const kern_weight *kw,
                     const int32_t *pos, int n, int hq, int hkv, int hd, float eps, const kern_rope *rope) {
    if (hd <= 0 || hd % 2) return kern_fail(be, "qk_norm_rope: head_dim %d is odd or not positive", hd);
    if (n < 0 || hq < 0 || hkv < 0) return kern_fail(be, "qk_norm_rope: bad shape n=%d hq=%d hkv=%d", n, hq, hkv);
    if (check_norm_weight(be, "qk_norm_rope", "q_norm ", qw, hd) ||
        check_norm_weight(be, "qk_norm_rope", "k_norm ", kw, hd))
        return -1;
    const char *why = kern_rope_invalid(rope);
    if (why) return kern_fail(be, "qk_norm_rope: %s", why);
    if (n == 0 || hq + hkv == 0) return 0;
    int half = hd / 2;
    /* qwf, kwf: the norm weights as fp32; inv_freq: rope()'s per-i factor
     * (kern_rope_inv_freq, so the same bits); cs: one token's cos/sin table */
    float *buf = malloc((size_t)(2 * hd + half + hd) * sizeof *buf);
    if (!buf) return kern_fail(be, "qk_norm_rope: out of memory");
    float *qwf = buf, *kwf = buf + hd, *inv_freq = buf + 2 * hd, *cs = inv_freq + half;
    cpu_load_rows(qwf, qw, 0, 1);
    cpu_load_rows(kwf, kw, 0, 1);
    for (int i = 0; i < half; i++)
        inv_freq[i] = kern_rope_inv_freq(rope, i, hd);
    float *qs = q, *ks = k, scale = kern_rope_scale(rope);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < half; i++) {
            float ang = (float)pos[t] * inv_freq[i];
            cs[i] = cosf(ang) * scale;
            cs[half + i] = sinf(ang) * scale;
        }
        for (int h = 0; h < hq; h++) norm_rotate_head(qs + ((size_t)t * hq + h) * hd, qwf, cs, hd, eps);
        for (int h = 0; h < hkv; h++) norm_rotate_head(ks + ((size_t)t * hkv + h) * hd, kwf, cs, hd, eps);
    }
    free(buf);
    return 0;
}
