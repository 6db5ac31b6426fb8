/*
 * tests/emu/selftest_translated.cu — CUDA source that selftest.cpp links
 * after translate.py rewrote it like the product's kernels:
 *  - a kernel declaring __launch_bounds__(64): translate.py gives it the
 *    bounds check, so a launch of more threads must abort as a GPU refuses it;
 *  - static __shared__ variables: translate.py makes them per-block storage,
 *    so every block starts with garbage, never the previous block's values,
 *    and an overrun is an ASan report.
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

/* Thread 0 of each block reads the shared array and scalar before anyone
 * wrote them (out[2b], out[2b+1]), then the block fills them, so a block
 * that ran after another reads that block's values unless each block has
 * its own storage. */
__global__ void __launch_bounds__(32) selftest_shared_kernel(unsigned *out) {
    __shared__ unsigned arr[32], scalar;
    __shared__ __align__(16) float aligned[4];
    if (threadIdx.x == 0) {
        out[3 * blockIdx.x] = arr[5];
        out[3 * blockIdx.x + 1] = scalar;
        out[3 * blockIdx.x + 2] = (unsigned)((size_t)aligned % 16);
    }
    __syncthreads();
    arr[threadIdx.x] = 1000 + blockIdx.x;
    if (threadIdx.x == 0) scalar = 2000 + blockIdx.x;
    __syncthreads();
    /* every thread sees the block's one copy */
    if (arr[(threadIdx.x + 1) % 32] != 1000 + blockIdx.x || scalar != 2000 + blockIdx.x) out[3 * blockIdx.x] = 7;
}

/* out: 3 words per block */
void selftest_launch_shared(unsigned *out, unsigned blocks) {
    selftest_shared_kernel<<<blocks, 32>>>(out);
}

/* not inlined, so UBSan cannot tell the object's size: only ASan sees a
 * store past the end */
__device__ __noinline__ void selftest_store(int *p, unsigned i, int v) {
    p[i] = v;
}

/* writes one element past a static __shared__ array */
__global__ void __launch_bounds__(32) selftest_shared_overrun_kernel(int *out) {
    __shared__ int tile[32];
    selftest_store(tile, threadIdx.x + 1, (int)threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = tile[threadIdx.x];
}

void selftest_launch_shared_overrun(int *out) {
    selftest_shared_overrun_kernel<<<1, 32>>>(out);
}
