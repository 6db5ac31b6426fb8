/* cpu: logits reduction (STUB, being written). */
#include "kernels/cpu/cpu.h"

int cpu_logits_topk(kern_backend *be, const void *logits, int rows, int vocab, int k, int32_t *ids, float *vals,
                    float *lse) {
    (void)logits, (void)rows, (void)vocab, (void)k, (void)ids, (void)vals, (void)lse;
    return kern_fail(be, "logits_topk: not implemented");
}
