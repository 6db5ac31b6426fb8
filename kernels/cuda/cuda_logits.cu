/* cuda: logits reduction (STUB, being written). */
#include "kernels/cuda/cuda.h"

int cuda_logits_topk(kern_backend *be, const void *, int, int, int, int32_t *, float *, float *) {
    return kern_fail(be, "logits_topk: not implemented");
}
