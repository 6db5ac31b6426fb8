/*
 * cuda: RMSNorm over rows, Qwen3 flavour (weight multiplies directly, no +1).
 *
 * Contract (twin of kernels/cpu/rmsnorm.c): in, out (rows, dim) bf16; w is a
 * (1, dim) bf16 device weight (any other shape is rejected with the cpu
 * twin's message). Per row r:
 *   out[r] = w * (in[r] * inv),  inv = 1 / sqrt(mean(in[r]^2) + eps),
 * with the sum of squares reduced in fp32 across the block and inv formed in
 * double from it, like the cpu twin (whose sum is a sequential double sum).
 * In place OK (out == in): each thread rewrites only the elements it read.
 * One block per row; rows may be tokens (dim = hidden) or heads
 * (rows = n * heads, dim = head_dim, the q/k norms).
 */
#include "kernels/cuda/cuda.h"

__global__ void __launch_bounds__(CUDA_THREADS)
    cuda_rmsnorm_kernel(bf16 *out, const bf16 *in, const bf16 *w, int dim, float eps) {
    const bf16 *x = in + (size_t)blockIdx.x * dim;
    bf16 *o = out + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float v = __bfloat162float(x[c]);
        ss += v * v;
    }
    float total = cuda_block_sum(ss);
    float inv = (float)(1.0 / sqrt((double)total / dim + (double)eps));
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        o[c] = __float2bfloat16_rn(__bfloat162float(w[c]) * (__bfloat162float(x[c]) * inv));
}

int cuda_rmsnorm(kern_backend *be, void *out, const void *in, const kern_weight *w, int rows, int dim, float eps) {
    if (cuda_check_weight(be, "rmsnorm", w)) return -1;
    if (w->rows != 1 || w->cols != dim)
        return kern_fail(be, "rmsnorm: weight is (%lld, %lld), expected (1, %d)", (long long)w->rows,
                         (long long)w->cols, dim);
    if (rows < 0 || dim <= 0) return kern_fail(be, "rmsnorm: bad shape (%d, %d)", rows, dim);
    if (rows == 0) return 0;
    if (cuda_enter(be)) return -1;
    if (cuda_replaying(be)) return 0;
    /* whole warps only (the reductions shuffle with a full mask) */
    int threads = dim >= CUDA_THREADS ? CUDA_THREADS : ((dim + 31) / 32) * 32;
    cuda_rmsnorm_kernel<<<rows, threads, 0, cuda_get(be)->stream>>>((bf16 *)out, (const bf16 *)in,
                                                                    (const bf16 *)w->data, dim, eps);
    CUDA_LAUNCH_TRY(be, "cuda_rmsnorm_kernel");
    return 0;
}
