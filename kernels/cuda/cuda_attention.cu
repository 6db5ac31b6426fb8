/*
 * cuda: causal GQA attention of a batch of sequences over a paged KV cache,
 * and the cache store.
 *
 * Contract (twin of kernels/cpu/attention.c; see kern_attn_batch in
 * kernels/kernels.h):
 *   - kv_store: rows i < n of k, v (n, kvdim) bf16 are copied to rows
 *     slots[i] of the caches kc, vc. slots is a HOST array: every slot is
 *     checked (>= 0, the cpu twin's message) before anything is launched,
 *     then it is staged to the device. The copy is exact.
 *   - attention: q, out (q_start[n_seqs], hq*hd) bf16; kc, vc the paged
 *     caches (n_blocks * block_size, hkv*hd) bf16. Row i of sequence s
 *     (q_start[s] <= i < q_start[s+1]) sits at position
 *     p = pos0[s] + i - q_start[s] and attends to positions 0..p; the key and
 *     value of position t of sequence s are cache row
 *     block_table[s*max_blocks + t/block_size]*block_size + t%block_size.
 *     Query head h reads KV head h / (hq/hkv).
 *       out = softmax(q·kᵀ·scale) · v   per (row, head)
 *     Scores, softmax and the weighted sum are fp32; out is rounded to bf16.
 *     The batch is validated on the host like the cpu twin (same messages:
 *     heads, paging geometry, negative lengths, positions beyond the
 *     sequence's blocks) and, since a device read cannot be bounds-checked,
 *     every block-table entry the batch will read must be >= 0. hd <= 256,
 *     hq <= 65535. out must not overlap q, kc or vc. Rows outside every
 *     sequence's range are left untouched (like the cpu twin).
 *   - All host arrays are staged to the device by the op (pinned ring, see
 *     cuda_stage_begin); the caller may reuse them as soon as it returns.
 *
 * Batch tables. On the host, attention builds one int32 array and stages it
 * in one copy:
 *     info[3r .. 3r+2] = (q/out row, position, offset of its table)  r < nq
 *     tables[...]      = for each sequence with rows, the block-table
 *                        entries its last row can reach (ceil(len/bs))
 * with nq the number of query rows in the batch; `tables` follows info.
 * So the kernel needs no search from row to sequence, and only the block
 * table entries in use cross the bus.
 *
 * Kernel: one block of ATT_WARPS warps per (query row, head), a
 * straightforward flash-style loop. Warp w takes keys w, w+ATT_WARPS, ...;
 * per key it resolves the cache row through the block table, forms q·k with
 * lane-strided dimensions (c = lane + 32j, coalesced) and a shuffle
 * reduction, then updates its online softmax (running max m, sum l,
 * unnormalised accumulator acc). At the end the warps' (m, l, acc) are
 * merged through shared memory: M = max m_w, L = Σ l_w e^(m_w-M),
 * out = Σ acc_w e^(m_w-M) / L. Each (row, head) is computed the same way
 * whatever else is in the batch (batch-invariant, like the cpu twin).
 * Correctness first: no tiling of K/V in shared memory, no split over the
 * key axis across blocks.
 */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

#define ATT_WARPS 4
#define ATT_MAX_HD 256

/* ---- kv_store ---- */

/* blockIdx.x = row i, blockIdx.y = 0 (keys) or 1 (values); `words` units of
 * T per row (T = uint4 when rows are 16-byte aligned, else bf16). */
template <typename T>
__global__ void cuda_kv_store_kernel(T *kc, T *vc, const T *k, const T *v, const int32_t *slots, size_t words) {
    const T *src = (blockIdx.y ? v : k) + (size_t)blockIdx.x * words;
    T *dst = (blockIdx.y ? vc : kc) + (size_t)slots[blockIdx.x] * words;
    for (size_t c = threadIdx.x; c < words; c += blockDim.x)
        dst[c] = src[c];
}

int cuda_kv_store(kern_backend *be, void *kc, void *vc, const void *k, const void *v, const int32_t *slots, int n,
                  int kvdim) {
    if (n < 0 || kvdim < 0) return kern_fail(be, "kv_store: bad shape n=%d kvdim=%d", n, kvdim);
    for (int i = 0; i < n; i++)
        if (slots[i] < 0) return kern_fail(be, "kv_store: negative cache slot %d", slots[i]);
    if (n == 0 || kvdim == 0) return 0;
    if (cuda_enter(be)) return -1;
    const int32_t *dslots = NULL;
    if (cuda_stage_i32(be, slots, (size_t)n, &dslots)) return -1;
    cudaStream_t st = cuda_get(be)->stream;
    dim3 grid((unsigned)n, 2);
    size_t bytes = (size_t)kvdim * sizeof(bf16);
    uintptr_t al = (uintptr_t)kc | (uintptr_t)vc | (uintptr_t)k | (uintptr_t)v;
    if (bytes % 16 == 0 && al % 16 == 0)
        cuda_kv_store_kernel<uint4>
            <<<grid, 128, 0, st>>>((uint4 *)kc, (uint4 *)vc, (const uint4 *)k, (const uint4 *)v, dslots, bytes / 16);
    else
        cuda_kv_store_kernel<bf16>
            <<<grid, 128, 0, st>>>((bf16 *)kc, (bf16 *)vc, (const bf16 *)k, (const bf16 *)v, dslots, (size_t)kvdim);
    CUDA_LAUNCH_TRY(be, "cuda_kv_store_kernel");
    return 0;
}

/* ---- attention ---- */

template <int DPL> /* dims per lane: ceil(hd / 32) <= DPL */
__global__ void __launch_bounds__(ATT_WARPS * 32)
    cuda_attention_kernel(bf16 *out, const bf16 *q, const bf16 *kc, const bf16 *vc, const int32_t *info,
                          const int32_t *tables, int block_size, int hq, int hkv, int hd, float scale) {
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][DPL * 32];
    const int r = blockIdx.x, h = blockIdx.y;
    const int row = info[3 * (size_t)r], pos = info[3 * (size_t)r + 1];
    const int32_t *bt = tables + info[3 * (size_t)r + 2];
    const int kvh = h / (hq / hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t qdim = (size_t)hq * hd, kvdim = (size_t)hkv * hd;
    const bf16 *qp = q + (size_t)row * qdim + (size_t)h * hd;

    float qr[DPL], acc[DPL];
#pragma unroll
    for (int j = 0; j < DPL; j++) {
        int c = lane + 32 * j;
        qr[j] = c < hd ? __bfloat162float(qp[c]) : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int len = pos + 1;
    for (int t = warp; t < len; t += ATT_WARPS) {
        const size_t crow = (size_t)bt[t / block_size] * block_size + (size_t)(t % block_size);
        const bf16 *kp = kc + crow * kvdim + (size_t)kvh * hd;
        const bf16 *vp = vc + crow * kvdim + (size_t)kvh * hd;
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
    bf16 *op = out + (size_t)row * qdim + (size_t)h * hd;
    for (int c = threadIdx.x; c < hd; c += ATT_WARPS * 32) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            o += sm_acc[w][c] * wt[w];
        op[c] = __float2bfloat16_rn(o * invL);
    }
}

int cuda_attention(kern_backend *be, void *out, const void *q, const void *kc, const void *vc, const kern_attn_batch *b,
                   int hq, int hkv, int hd, float scale) {
    if (hkv <= 0 || hq % hkv) return kern_fail(be, "attention: %d query heads not a multiple of %d kv heads", hq, hkv);
    if (b->block_size <= 0 || b->max_blocks <= 0) return kern_fail(be, "attention: bad paging geometry");
    if (hd <= 0 || hd > ATT_MAX_HD) return kern_fail(be, "attention: head_dim %d out of range [1, %d]", hd, ATT_MAX_HD);
    if (hq > 65535) return kern_fail(be, "attention: %d query heads (at most 65535)", hq);
    const int bs = b->block_size;
    /* validate like the cpu twin, and count rows and used table entries */
    int64_t nq = 0, nt = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int n = b->q_start[s + 1] - b->q_start[s];
        if (n < 0 || b->pos0[s] < 0) return kern_fail(be, "attention: sequence %d has a negative length", s);
        if ((int64_t)b->pos0[s] + n > (int64_t)b->max_blocks * bs)
            return kern_fail(be, "attention: sequence %d reaches position %lld beyond its %d blocks", s,
                             (long long)b->pos0[s] + n, b->max_blocks);
        if (n == 0) continue;
        if (b->q_start[s] < 0) return kern_fail(be, "attention: sequence %d starts at row %d", s, b->q_start[s]);
        int used = (b->pos0[s] + n + bs - 1) / bs;
        const int32_t *bt = b->block_table + (size_t)s * b->max_blocks;
        for (int j = 0; j < used; j++)
            if (bt[j] < 0) return kern_fail(be, "attention: sequence %d block %d is %d (negative)", s, j, bt[j]);
        nq += n;
        nt += used;
    }
    if (nq == 0) return 0;
    if (nq > INT_MAX || 3 * nq + nt > INT_MAX)
        return kern_fail(be, "attention: batch of %lld rows too large", (long long)nq);
    if (cuda_enter(be)) return -1;

    /* the batch tables, built straight in the pinned staging buffer */
    size_t total = (size_t)(3 * nq + nt);
    int32_t *info = NULL;
    if (cuda_stage_begin(be, total, &info)) return -1;
    int32_t *tab = info + 3 * nq;
    int32_t r = 0, toff = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int n = b->q_start[s + 1] - b->q_start[s];
        if (n == 0) continue;
        int used = (b->pos0[s] + n + bs - 1) / bs;
        memcpy(tab + toff, b->block_table + (size_t)s * b->max_blocks, (size_t)used * sizeof(int32_t));
        for (int j = 0; j < n; j++, r++) {
            info[3 * (size_t)r] = b->q_start[s] + j;
            info[3 * (size_t)r + 1] = b->pos0[s] + j;
            info[3 * (size_t)r + 2] = toff;
        }
        toff += used;
    }
    const int32_t *dinfo = NULL;
    if (cuda_stage_commit(be, total, &dinfo)) return -1;
    const int32_t *dtab = dinfo + 3 * nq;

    cudaStream_t st = cuda_get(be)->stream;
    dim3 grid((unsigned)nq, (unsigned)hq);
    const int threads = ATT_WARPS * 32;
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *k = (const bf16 *)kc, *v = (const bf16 *)vc;
    int dpl = (hd + 31) / 32;
    if (dpl <= 1)
        cuda_attention_kernel<1><<<grid, threads, 0, st>>>(o, qq, k, v, dinfo, dtab, bs, hq, hkv, hd, scale);
    else if (dpl <= 2)
        cuda_attention_kernel<2><<<grid, threads, 0, st>>>(o, qq, k, v, dinfo, dtab, bs, hq, hkv, hd, scale);
    else if (dpl <= 4)
        cuda_attention_kernel<4><<<grid, threads, 0, st>>>(o, qq, k, v, dinfo, dtab, bs, hq, hkv, hd, scale);
    else
        cuda_attention_kernel<8><<<grid, threads, 0, st>>>(o, qq, k, v, dinfo, dtab, bs, hq, hkv, hd, scale);
    CUDA_LAUNCH_TRY(be, "cuda_attention_kernel");
    return 0;
}
