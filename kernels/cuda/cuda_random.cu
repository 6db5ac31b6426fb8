/*
 * cuda: random_weight — a bf16 weight generated on the device from the
 * counter hash kern_random_u (kernels/kernels.h), the cpu twin's values
 * rounded to bf16. Used for "random:" models (model/), so a GPU benchmark
 * of a Qwen3-8B shape needs no 16 GB file: generation runs at memory speed.
 */
#include "kernels/cuda/cuda.h"

__global__ void __launch_bounds__(CUDA_THREADS)
    cuda_random_weight_kernel(bf16 *out, int64_t rows, int64_t cols, int64_t row0, int64_t col0, int64_t full_cols,
                              uint64_t seed, float offset, float scale) {
    const size_t count = (size_t)rows * (size_t)cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)cols, c = i % (size_t)cols;
        uint64_t g = (uint64_t)(row0 + (int64_t)r) * (uint64_t)full_cols + (uint64_t)col0 + c;
        out[i] = __float2bfloat16_rn(offset + scale * kern_random_u(seed, g));
    }
}

int cuda_random_weight(kern_backend *be, kern_weight *dev, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                       int64_t full_cols, uint64_t seed, float offset, float scale) {
    if (rows < 1 || cols < 1 || row0 < 0 || col0 < 0 || full_cols < col0 + cols || rows > ((int64_t)1 << 40) / cols)
        return kern_fail(be, "random_weight: bad shape (%lld, %lld) at (%lld, %lld) of %lld columns", (long long)rows,
                         (long long)cols, (long long)row0, (long long)col0, (long long)full_cols);
    if (cuda_no_graph(be, "random_weight") || cuda_enter(be)) return -1;
    size_t count = (size_t)rows * (size_t)cols;
    void *d = NULL;
    CUDA_TRY(be, cudaMalloc(&d, count * sizeof(bf16)));
    cuda_random_weight_kernel<<<cuda_blocks(count, CUDA_THREADS), CUDA_THREADS, 0, cuda_get(be)->stream>>>(
        (bf16 *)d, rows, cols, row0, col0, full_cols, seed, offset, scale);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        cudaFree(d);
        return cuda_fail_rt(be, __FILE__, __LINE__, "launch cuda_random_weight_kernel", e);
    }
    *dev = kern_weight{d, KERN_BF16, rows, cols, 0};
    return 0;
}
