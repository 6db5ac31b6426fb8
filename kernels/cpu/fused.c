/* cpu: fused ops (STUB, being written). */
#include "kernels/cpu/cpu.h"

int cpu_add_rmsnorm(kern_backend *be, void *x, const void *y, void *out, const kern_weight *w, int rows, int dim,
                    float eps) {
    (void)x, (void)y, (void)out, (void)w, (void)rows, (void)dim, (void)eps;
    return kern_fail(be, "add_rmsnorm: not implemented");
}

int cpu_qk_norm_rope(kern_backend *be, void *q, void *k, const kern_weight *qw, const kern_weight *kw,
                     const int32_t *pos, int n, int hq, int hkv, int hd, float eps, double theta) {
    (void)q, (void)k, (void)qw, (void)kw, (void)pos, (void)n, (void)hq, (void)hkv, (void)hd, (void)eps, (void)theta;
    return kern_fail(be, "qk_norm_rope: not implemented");
}
