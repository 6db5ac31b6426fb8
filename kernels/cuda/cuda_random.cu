/* cuda: random_weight (STUB, being written). */
#include "kernels/cuda/cuda.h"

int cuda_random_weight(kern_backend *be, kern_weight *, int64_t, int64_t, int64_t, int64_t, int64_t, uint64_t, float,
                       float) {
    return kern_fail(be, "random_weight: not implemented");
}
