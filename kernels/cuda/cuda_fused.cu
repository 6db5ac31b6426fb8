/* cuda: fused ops (STUB, being written). */
#include "kernels/cuda/cuda.h"

int cuda_add_rmsnorm(kern_backend *be, void *, const void *, void *, const kern_weight *, int, int, float) {
    return kern_fail(be, "add_rmsnorm: not implemented");
}

int cuda_qk_norm_rope(kern_backend *be, void *, void *, const kern_weight *, const kern_weight *, const int32_t *, int,
                      int, int, int, float, double) {
    return kern_fail(be, "qk_norm_rope: not implemented");
}
