/*
 * cuda: embedding gather, silu_mul, add.
 *
 * Contract (twin of kernels/cpu/elementwise.c):
 *   - embedding: out(n, table.cols) = table[ids[i], :]. ids is a HOST array:
 *     every id is checked against [0, table.rows) on the host before anything
 *     is launched (same message as the cpu twin), then the ids are copied to
 *     the device asynchronously. table is a dense bf16 device weight (the
 *     replicated embedding; upload_weight made it dense even from a strided
 *     view), so the gather is an exact copy of row ids[i].
 *   - silu_mul: out = silu(gate) * up, silu(x) = x / (1 + e^-x), in fp32
 *     with the precise expf, rounded to bf16. In place OK (elementwise).
 *   - add: x += y, summed in fp32, rounded to bf16.
 *   - add_bias: x(rows, dim) += b per row (b a dense (1, dim) bf16 device
 *     weight), summed in fp32, rounded to bf16.
 * All enqueued on the stream; grid-stride loops over size_t counts.
 */
#include "kernels/cuda/cuda.h"

__global__ void __launch_bounds__(CUDA_THREADS)
    cuda_embedding_kernel(bf16 *out, const bf16 *table, const int32_t *ids, int64_t dim) {
    const bf16 *src = table + (size_t)ids[blockIdx.x] * (size_t)dim;
    bf16 *dst = out + (size_t)blockIdx.x * (size_t)dim;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
        dst[c] = src[c];
}

__global__ void __launch_bounds__(CUDA_THREADS)
    cuda_silu_mul_kernel(bf16 *out, const bf16 *gate, const bf16 *up, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]);
        out[i] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
    }
}

__global__ void __launch_bounds__(CUDA_THREADS) cuda_add_kernel(bf16 *x, const bf16 *y, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}

__global__ void __launch_bounds__(CUDA_THREADS)
    cuda_add_bias_kernel(bf16 *x, const bf16 *b, size_t count, int64_t dim) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + __bfloat162float(b[i % (size_t)dim]));
}

int cuda_add_bias(kern_backend *be, void *x, const kern_weight *b, int rows, int dim) {
    if (cuda_check_weight(be, "add_bias", b)) return -1;
    if (b->rows != 1 || b->cols != dim)
        return kern_fail(be, "add_bias: bias is (%lld, %lld), expected (1, %d)", (long long)b->rows,
                         (long long)b->cols, dim);
    size_t count = (size_t)(rows > 0 ? rows : 0) * (size_t)(dim > 0 ? dim : 0);
    if (count == 0) return 0;
    if (cuda_enter(be)) return -1;
    if (cuda_replaying(be)) return 0;
    cuda_add_bias_kernel<<<cuda_blocks(count, CUDA_THREADS), CUDA_THREADS, 0, cuda_get(be)->stream>>>(
        (bf16 *)x, (const bf16 *)b->data, count, (int64_t)dim);
    CUDA_LAUNCH_TRY(be, "cuda_add_bias_kernel");
    return 0;
}

int cuda_embedding(kern_backend *be, void *out, const kern_weight *table, const int32_t *ids, int n) {
    if (cuda_check_weight(be, "embedding", table)) return -1;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= table->rows)
            return kern_fail(be, "embedding: token id %d out of range [0, %lld)", ids[i], (long long)table->rows);
    if (n <= 0 || table->cols == 0) return 0;
    if (cuda_enter(be)) return -1;
    const int32_t *dids = NULL;
    if (cuda_stage_i32(be, ids, n, &dids)) return -1;
    if (cuda_replaying(be)) return 0;
    cuda_embedding_kernel<<<n, CUDA_THREADS, 0, cuda_get(be)->stream>>>((bf16 *)out, (const bf16 *)table->data, dids,
                                                                        table->cols);
    CUDA_LAUNCH_TRY(be, "cuda_embedding_kernel");
    return 0;
}

int cuda_silu_mul(kern_backend *be, void *out, const void *gate, const void *up, size_t count) {
    if (count == 0) return 0;
    if (cuda_enter(be)) return -1;
    if (cuda_replaying(be)) return 0;
    cuda_silu_mul_kernel<<<cuda_blocks(count, CUDA_THREADS), CUDA_THREADS, 0, cuda_get(be)->stream>>>(
        (bf16 *)out, (const bf16 *)gate, (const bf16 *)up, count);
    CUDA_LAUNCH_TRY(be, "cuda_silu_mul_kernel");
    return 0;
}

int cuda_add(kern_backend *be, void *x, const void *y, size_t count) {
    if (count == 0) return 0;
    if (cuda_enter(be)) return -1;
    if (cuda_replaying(be)) return 0;
    cuda_add_kernel<<<cuda_blocks(count, CUDA_THREADS), CUDA_THREADS, 0, cuda_get(be)->stream>>>(
        (bf16 *)x, (const bf16 *)y, count);
    CUDA_LAUNCH_TRY(be, "cuda_add_kernel");
    return 0;
}
