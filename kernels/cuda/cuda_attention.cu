/*
 * cuda: causal GQA attention for one sequence against its KV cache.
 *
 * Contract (twin of kernels/cpu/attention.c): q (n, hq*hd) bf16 holds the
 * queries at positions pos0 .. pos0+n-1; kc, vc (>= pos0+n, hkv*hd) bf16 hold
 * keys/values of positions 0 .. pos0+n-1. Query head h reads KV head
 * h / (hq/hkv); the query at position p attends to positions 0..p.
 *   out(n, hq*hd) = softmax(q·kᵀ·scale) · v
 * Scores, softmax and the weighted sum are fp32; out is rounded to bf16.
 * hq must be a multiple of hkv (same message as the cpu twin), hd <= 256.
 * out must not overlap q, kc or vc.
 *
 * Kernel: one block of ATT_WARPS warps per (query, head), a straightforward
 * flash-style loop. Warp w takes keys w, w+ATT_WARPS, ...; per key the warp
 * forms q·k with lane-strided dimensions (c = lane + 32j, coalesced) and a
 * shuffle reduction, then updates its online softmax (running max m, sum l,
 * unnormalised accumulator acc). At the end the warps' (m, l, acc) are
 * merged through shared memory: M = max m_w, L = Σ l_w e^(m_w-M),
 * out = Σ acc_w e^(m_w-M) / L. Correctness first: no tiling of K/V in
 * shared memory, no split over the key axis across blocks.
 */
#include <math.h>

#include "kernels/cuda/cuda.h"

#define ATT_WARPS 4
#define ATT_MAX_HD 256

template <int DPL> /* dims per lane: ceil(hd / 32) <= DPL */
__global__ void __launch_bounds__(ATT_WARPS * 32)
    cuda_attention_kernel(bf16 *out, const bf16 *q, const bf16 *kc, const bf16 *vc, int pos0, int hq, int hkv, int hd,
                          float scale) {
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][DPL * 32];
    const int i = blockIdx.x, h = blockIdx.y;
    const int kvh = h / (hq / hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t qdim = (size_t)hq * hd, kvdim = (size_t)hkv * hd;
    const bf16 *qp = q + (size_t)i * qdim + (size_t)h * hd;

    float qr[DPL], acc[DPL];
#pragma unroll
    for (int j = 0; j < DPL; j++) {
        int c = lane + 32 * j;
        qr[j] = c < hd ? __bfloat162float(qp[c]) : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int len = pos0 + i + 1;
    for (int t = warp; t < len; t += ATT_WARPS) {
        const bf16 *kp = kc + (size_t)t * kvdim + (size_t)kvh * hd;
        const bf16 *vp = vc + (size_t)t * kvdim + (size_t)kvh * hd;
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            int c = lane + 32 * j;
            if (c < hd) d += qr[j] * __bfloat162float(kp[c]);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            d += __shfl_xor_sync(0xffffffffu, d, off);
        float s = d * scale;
        float mn = fmaxf(m, s);
        float corr = expf(m - mn); /* m = -inf on the first key: corr = 0 */
        float p = expf(s - mn);
        l = l * corr + p;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            int c = lane + 32 * j;
            float v = c < hd ? __bfloat162float(vp[c]) : 0.0f;
            acc[j] = acc[j] * corr + p * v;
        }
        m = mn;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < DPL; j++)
        sm_acc[warp][lane + 32 * j] = acc[j];
    __syncthreads();

    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++)
        M = fmaxf(M, sm_m[w]);
    float wt[ATT_WARPS], L = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        wt[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - M); /* warps that saw no key */
        L += sm_l[w] * wt[w];
    }
    const float invL = 1.0f / L;
    bf16 *op = out + (size_t)i * qdim + (size_t)h * hd;
    for (int c = threadIdx.x; c < hd; c += ATT_WARPS * 32) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            o += sm_acc[w][c] * wt[w];
        op[c] = __float2bfloat16_rn(o * invL);
    }
}

int cuda_attention(kern_backend *be, void *out, const void *q, const void *kc, const void *vc, int n, int pos0, int hq,
                   int hkv, int hd, float scale) {
    if (hkv <= 0 || hq % hkv) return kern_fail(be, "attention: %d query heads not a multiple of %d kv heads", hq, hkv);
    if (hd <= 0 || hd > ATT_MAX_HD) return kern_fail(be, "attention: head_dim %d out of range [1, %d]", hd, ATT_MAX_HD);
    if (pos0 < 0 || hq > 65535) return kern_fail(be, "attention: bad pos0 %d or %d heads", pos0, hq);
    if (n <= 0) return 0;
    if (cuda_enter(be)) return -1;
    cudaStream_t st = cuda_get(be)->stream;
    dim3 grid((unsigned)n, (unsigned)hq);
    const int threads = ATT_WARPS * 32;
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *k = (const bf16 *)kc, *v = (const bf16 *)vc;
    int dpl = (hd + 31) / 32;
    if (dpl <= 1)
        cuda_attention_kernel<1><<<grid, threads, 0, st>>>(o, qq, k, v, pos0, hq, hkv, hd, scale);
    else if (dpl <= 2)
        cuda_attention_kernel<2><<<grid, threads, 0, st>>>(o, qq, k, v, pos0, hq, hkv, hd, scale);
    else if (dpl <= 4)
        cuda_attention_kernel<4><<<grid, threads, 0, st>>>(o, qq, k, v, pos0, hq, hkv, hd, scale);
    else
        cuda_attention_kernel<8><<<grid, threads, 0, st>>>(o, qq, k, v, pos0, hq, hkv, hd, scale);
    CUDA_LAUNCH_TRY(be, "cuda_attention_kernel");
    return 0;
}
