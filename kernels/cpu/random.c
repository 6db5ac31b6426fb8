/* cpu: random_weight (STUB, being written). */
#include "kernels/cpu/cpu.h"

int cpu_random_weight(kern_backend *be, kern_weight *dev, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                      int64_t full_cols, uint64_t seed, float offset, float scale) {
    (void)dev, (void)rows, (void)cols, (void)row0, (void)col0, (void)full_cols, (void)seed, (void)offset, (void)scale;
    return kern_fail(be, "random_weight: not implemented");
}
