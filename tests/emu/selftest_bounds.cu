/*
 * tests/emu/selftest_bounds.cu — CUDA source that selftest.cpp links after
 * translate.py rewrote it like the product's kernels: its kernel declares
 * __launch_bounds__(64), so translate.py gives it the bounds check, and a
 * launch of more threads must abort as a GPU refuses it.
 */
#include <cuda_runtime.h>

#define SELFTEST_BOUND 64

template <typename T> __global__ void __launch_bounds__(SELFTEST_BOUND, 2) selftest_bounded_kernel(T *out) {
    out[threadIdx.x] = (T)(threadIdx.x + 1);
}

/* launch with `threads` threads per block on the legacy stream */
void selftest_launch_bounded(int *out, unsigned threads) {
    selftest_bounded_kernel<<<1, threads>>>(out);
}
