/*
 * cuda: logits_topk — per row of bf16 logits, the exact k largest values
 * (ties by ascending column) and the row's log-sum-exp (see kernels.h).
 *
 * One block per row, a radix select on the values' 16 bits: a bf16 maps
 * to a 16-bit key whose unsigned order is the values' order (-0 is folded
 * onto +0 so equal values have equal keys, as the cpu twin compares them).
 *   pass 1  row max, inf/nan flag, histogram of the keys' high byte;
 *           warp 0 finds the byte B holding the k-th largest key
 *   pass 2  sum of expf(x - max), histogram of the low byte of the keys
 *           whose high byte is B; warp 0 finds the threshold key T, the
 *           count n_gt of keys > T (< k) and need = k - n_gt keys == T
 *   pass 3  collect: every key > T (an atomic slot each), and the first
 *           `need` keys == T in column order (a block-wide ordered count
 *           per tile of blockDim columns, until enough were taken)
 *   sort    the k candidates by rank: thread t counts the candidates that
 *           precede it in (value desc, column asc) order.
 * Histograms aggregate each warp's equal bins with __match_any_sync (a
 * row's values crowd into a few exponents, so plain shared atomics would
 * serialise). The row is read three times; it is L2-resident for any
 * vocabulary slice. Results go to the device scratch, then to the host
 * arrays, and the stream is synchronised.
 */
#include <math.h>

#include "kernels/cuda/cuda.h"

#define TOPK_THREADS 1024
#define TOPK_WARPS (TOPK_THREADS / 32)

/* Order-preserving 16-bit key of a bf16 bit pattern: positives above
 * negatives, larger magnitude higher for positives and lower for
 * negatives. -0 becomes +0; NaN becomes 0, below -inf (0x007f). */
__device__ __forceinline__ unsigned topk_key(unsigned short b) {
    unsigned u = b;
    if ((u & 0x7f80u) == 0x7f80u && (u & 0x007fu)) return 0;
    if ((u & 0x7fffu) == 0) u = 0;
    return (u & 0x8000u) ? (~u & 0xffffu) : (u | 0x8000u);
}

__device__ __forceinline__ float topk_f32(unsigned short b) {
    return __uint_as_float((unsigned)b << 16);
}

/* hist[bin] += 1 for every lane whose bin >= 0; all 32 lanes must call. */
__device__ __forceinline__ void topk_hist_add(unsigned *hist, int bin, int lane) {
    unsigned peers = __match_any_sync(0xffffffffu, bin);
    if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
}

/* Warp 0: the bin b of a 256-bin histogram such that fewer than `need`
 * entries lie in bins above b and at least `need` in bins >= b
 * (1 <= need <= total). Writes b and the count above it. */
__device__ void topk_select_bin(const unsigned *hist, unsigned need, int lane, unsigned *out_bin,
                                unsigned *out_above) {
    unsigned s = 0;
    for (int j = 0; j < 8; j++) s += hist[lane * 8 + j];
    unsigned incl = s; /* becomes the sum over lanes lane..31 */
    for (int off = 1; off < 32; off <<= 1) {
        unsigned t = __shfl_down_sync(0xffffffffu, incl, off);
        if (lane + off < 32) incl += t;
    }
    unsigned above = incl - s; /* entries in the bins of higher lanes */
    if (above < need && need <= incl) {
        for (int b = lane * 8 + 7; b >= lane * 8; b--) {
            if (above + hist[b] >= need) {
                *out_bin = (unsigned)b;
                *out_above = above;
                break;
            }
            above += hist[b];
        }
    }
}

__global__ void __launch_bounds__(TOPK_THREADS)
    cuda_logits_topk_kernel(const unsigned short *logits, int vocab, int k, int32_t *ids, float *vals, float *lse) {
    __shared__ unsigned hist[256];
    __shared__ float red[TOPK_WARPS];
    __shared__ unsigned warp_eq[TOPK_WARPS];
    __shared__ unsigned cand_key[KERN_TOPK_MAX];
    __shared__ int cand_id[KERN_TOPK_MAX];
    __shared__ unsigned s_bin, s_above, s_ngt;
    __shared__ float s_max, s_sum;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned short *x = logits + (size_t)blockIdx.x * (size_t)vocab;

    /* pass 1: max of the finite values, the inf/nan flag, high-byte histogram */
    for (int i = tid; i < 256; i += TOPK_THREADS) hist[i] = 0;
    if (tid == 0) s_ngt = 0;
    __syncthreads();
    float mx = -INFINITY;
    int bad = 0;
    /* every thread runs the same number of iterations: the warp-wide
     * match/ballot below need all lanes */
    for (int base = 0; base < vocab; base += TOPK_THREADS) {
        int i = base + tid, bin = -1;
        if (i < vocab) {
            unsigned short b = x[i];
            if ((b & 0x7f80u) == 0x7f80u)
                bad = 1;
            else
                mx = fmaxf(mx, topk_f32(b));
            bin = (int)(topk_key(b) >> 8);
        }
        topk_hist_add(hist, bin, lane);
    }
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (lane == 0) red[warp] = mx;
    const int any_bad = __syncthreads_or(bad); /* also completes hist and red */
    if (warp == 0) {
        float v = red[lane];
        for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (lane == 0) s_max = v;
        topk_select_bin(hist, (unsigned)k, lane, &s_bin, &s_above);
    }
    __syncthreads();
    const unsigned hi = s_bin, gt_hi = s_above;
    const float row_max = s_max;
    __syncthreads(); /* everyone has read hist's result before it is cleared */
    for (int i = tid; i < 256; i += TOPK_THREADS) hist[i] = 0;
    __syncthreads();

    /* pass 2: sum of exp(x - max), low-byte histogram within high byte `hi` */
    float sum = 0.0f;
    for (int base = 0; base < vocab; base += TOPK_THREADS) {
        int i = base + tid, bin = -1;
        if (i < vocab) {
            unsigned short b = x[i];
            if ((b & 0x7f80u) != 0x7f80u) sum += expf(topk_f32(b) - row_max);
            unsigned key = topk_key(b);
            if ((key >> 8) == hi) bin = (int)(key & 0xffu);
        }
        topk_hist_add(hist, bin, lane);
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        float v = red[lane];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) s_sum = v;
        topk_select_bin(hist, (unsigned)k - gt_hi, lane, &s_bin, &s_above);
    }
    __syncthreads();
    const unsigned thr = (hi << 8) | s_bin;      /* the k-th largest key */
    const unsigned n_gt = gt_hi + s_above;       /* keys > thr: fewer than k */
    const unsigned need = (unsigned)k - n_gt;    /* keys == thr to take, >= 1 */

    /* pass 3: collect the candidates */
    unsigned taken = 0; /* keys == thr seen in earlier tiles; the same in every thread */
    for (int base = 0; base < vocab; base += TOPK_THREADS) {
        int i = base + tid;
        unsigned key = 0;
        if (i < vocab) {
            key = topk_key(x[i]);
            if (key > thr) {
                unsigned slot = atomicAdd(&s_ngt, 1u);
                cand_key[slot] = key;
                cand_id[slot] = i;
            }
        }
        if (taken >= need) continue; /* block-uniform */
        int eq = i < vocab && key == thr;
        unsigned bal = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) warp_eq[warp] = (unsigned)__popc(bal);
        __syncthreads();
        unsigned before = taken, tile = 0;
        for (int w = 0; w < TOPK_WARPS; w++) {
            unsigned c = warp_eq[w];
            if (w < warp) before += c;
            tile += c;
        }
        before += (unsigned)__popc(bal & ((1u << lane) - 1u));
        if (eq && before < need) {
            cand_key[n_gt + before] = key;
            cand_id[n_gt + before] = i;
        }
        taken += tile;
        __syncthreads(); /* warp_eq is rewritten by the next tile */
    }
    __syncthreads();

    /* sort: rank of each candidate in (value desc, column asc) order */
    if (tid < k) {
        unsigned kt = cand_key[tid];
        int it = cand_id[tid], pos = 0;
        for (int j = 0; j < k; j++) {
            unsigned kj = cand_key[j];
            pos += kj > kt || (kj == kt && cand_id[j] < it);
        }
        size_t o = (size_t)blockIdx.x * (size_t)k + (size_t)pos;
        ids[o] = it;
        vals[o] = topk_f32(x[it]);
    }
    if (tid == 0) lse[blockIdx.x] = any_bad ? __int_as_float(0x7fc00000) : row_max + logf(s_sum);
}

int cuda_logits_topk(kern_backend *be, const void *logits, int rows, int vocab, int k, int32_t *ids, float *vals,
                     float *lse) {
    if (rows < 0 || vocab < 1) return kern_fail(be, "logits_topk: bad shape (%d rows, vocab %d)", rows, vocab);
    if (k < 1 || k > KERN_TOPK_MAX || k > vocab)
        return kern_fail(be, "logits_topk: k = %d outside 1..min(vocab %d, %d)", k, vocab, KERN_TOPK_MAX);
    if (cuda_no_graph(be, "logits_topk")) return -1;
    if (rows == 0) return 0;
    if (!logits || !ids || !vals || !lse) return kern_fail(be, "logits_topk: NULL array");
    cuda_impl *impl = cuda_get(be);
    if (cuda_enter(be)) return -1;
    size_t nk = (size_t)rows * (size_t)k;
    void *tmp;
    /* ids (rows, k) | vals (rows, k) | lse (rows), all 4-byte values */
    if (cuda_tmp_reserve(be, (2 * nk + (size_t)rows) * 4, &tmp)) return -1;
    int32_t *d_ids = (int32_t *)tmp;
    float *d_vals = (float *)(d_ids + nk), *d_lse = d_vals + nk;
    cuda_logits_topk_kernel<<<(unsigned)rows, TOPK_THREADS, 0, impl->stream>>>((const unsigned short *)logits, vocab,
                                                                                k, d_ids, d_vals, d_lse);
    CUDA_LAUNCH_TRY(be, "cuda_logits_topk_kernel");
    CUDA_TRY(be, cudaMemcpyAsync(ids, d_ids, nk * sizeof(int32_t), cudaMemcpyDeviceToHost, impl->stream));
    CUDA_TRY(be, cudaMemcpyAsync(vals, d_vals, nk * sizeof(float), cudaMemcpyDeviceToHost, impl->stream));
    CUDA_TRY(be, cudaMemcpyAsync(lse, d_lse, (size_t)rows * sizeof(float), cudaMemcpyDeviceToHost, impl->stream));
    CUDA_TRY(be, cudaStreamSynchronize(impl->stream));
    return 0;
}
