/*
 * cuda: causal GQA attention of a batch of sequences over a paged KV cache,
 * and the cache store. Twin of kernels/cpu/attention.c (kern_attn_batch in
 * kernels/kernels.h). The full contract and the design (dispatch, key
 * splits, staged tables, the kernels) are in docs/cuda-attention.md.
 *
 *   kv_store: rows i < n of k, v (n, kvdim) bf16 to rows slots[i] of kc,
 *     vc, exactly; slots is a host array, each checked >= 0 before launch.
 *   attention: q, out (q_start[n_seqs], hq*hd) bf16; kc, vc (n_blocks *
 *     block_size, hkv*hd) bf16, addressed through block_table. Per (row,
 *     head): out = softmax(q·kᵀ·scale)·v over positions 0..p (causal, by
 *     absolute position); query head h reads KV head h / (hq/hkv). fp32
 *     scores, softmax and sum (the tensor-core path rounds P to bf16), out
 *     rounded to bf16. Host-validated like the cpu twin (same messages),
 *     plus every block-table entry read must be >= 0. hd <= 256,
 *     hq <= 65535; out must not overlap q, kc, vc; rows outside every
 *     sequence are left untouched.
 *   Host arrays are staged by the op (reusable on return); in graph mode a
 *   sequence's table is staged whole, so staged sizes follow the batch's
 *   shape only.
 *   Batch-invariant: a (row, head) depends only on its own sequence, the
 *   table's capacity and the device — whatever else is in the batch, and
 *   eager or graph alike.
 *
 * Paths: head_dim 64/128 with 16-byte aligned q, out, kc, vc take the fast
 * paths (prompt chunks of >= ATT_PF_MIN_ROWS rows: tiled tensor-core
 * prefill kernel; other rows: decode kernel, split over keys by the table's
 * capacity, then combine); anything else takes the simple kernel.
 */
#include <limits.h>
#include <math.h>
#include <mma.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

#define ATT_WARPS 4
#define ATT_MAX_HD 256

/* Prefill (tiled tensor-core) path. */
#define ATT_PF_ROWS 64     /* query rows per tile (ATT_PF_WARPS warps x 16) */
#define ATT_PF_KEYS 64     /* keys per K/V tile */
#define ATT_PF_WARPS 4     /* 16 query rows each */
#define ATT_PF_MIN_ROWS 16 /* sequences with fewer rows take the decode path */

/* Decode (split-K) path. */
#define ATT_DEC_THREADS 128
#define ATT_DEC_UNROLL 2       /* keys per lane group per iteration */
#define ATT_SPLIT_MIN_KEYS 256 /* a split holds at least this many keys */
#define ATT_SPLIT_MAX 64
#define ATT_SPLIT_ALIGN 64 /* split boundaries are multiples of this */

#define ATT_LOG2E 1.4426950408889634f

namespace wmma = nvcuda::wmma;

/* ---- kv_store ---- */

/* blockIdx.x = row i, blockIdx.y = 0 (keys) or 1 (values); `words` units of
 * T per row (T = uint4 when rows are 16-byte aligned, else bf16). */
#define KV_STORE_THREADS 128

template <typename T>
__global__ void __launch_bounds__(KV_STORE_THREADS)
    cuda_kv_store_kernel(T *kc, T *vc, const T *k, const T *v, const int32_t *slots, size_t words) {
    const T *src = (blockIdx.y ? v : k) + (size_t)blockIdx.x * words;
    T *dst = (blockIdx.y ? vc : kc) + (size_t)slots[blockIdx.x] * words;
    for (size_t c = threadIdx.x; c < words; c += blockDim.x)
        dst[c] = src[c];
}

/* The cache types this backend implements so far: bf16 only (kernels.h,
 * kern_kv_dtype; the others are another change's). */
static int cuda_kv_supported(kern_backend *be, const char *op, kern_kv_dtype dt) {
    if (dt == KERN_KV_BF16) return 0;
    return kern_fail(be, "%s: KV cache dtype %s is not implemented on cuda yet (use --kv-cache-dtype bf16)", op,
                     dt == KERN_KV_F32 ? "fp32" : dt == KERN_KV_F16 ? "fp16" : dt == KERN_KV_Q8_0 ? "q8_0" : "native");
}

int cuda_kv_store(kern_backend *be, void *kc, void *vc, const void *k, const void *v, const int32_t *slots, int n,
                  int hkv, int hd, kern_kv_dtype dt) {
    if (cuda_kv_supported(be, "kv_store", dt)) return -1;
    int kvdim = hkv * hd;
    if (n < 0 || hkv < 0 || hd < 0) return kern_fail(be, "kv_store: bad shape n=%d kvdim=%d", n, kvdim);
    for (int i = 0; i < n; i++)
        if (slots[i] < 0) return kern_fail(be, "kv_store: negative cache slot %d", slots[i]);
    if (n == 0 || kvdim == 0) return 0;
    if (cuda_enter(be)) return -1;
    const int32_t *dslots = NULL;
    if (cuda_stage_i32(be, slots, (size_t)n, &dslots)) return -1;
    if (cuda_replaying(be)) return 0;
    cudaStream_t st = cuda_get(be)->stream;
    dim3 grid((unsigned)n, 2);
    size_t bytes = (size_t)kvdim * sizeof(bf16);
    uintptr_t al = (uintptr_t)kc | (uintptr_t)vc | (uintptr_t)k | (uintptr_t)v;
    if (bytes % 16 == 0 && al % 16 == 0)
        cuda_kv_store_kernel<uint4><<<grid, KV_STORE_THREADS, 0, st>>>((uint4 *)kc, (uint4 *)vc, (const uint4 *)k,
                                                                       (const uint4 *)v, dslots, bytes / 16);
    else
        cuda_kv_store_kernel<bf16><<<grid, KV_STORE_THREADS, 0, st>>>((bf16 *)kc, (bf16 *)vc, (const bf16 *)k,
                                                                      (const bf16 *)v, dslots, (size_t)kvdim);
    CUDA_LAUNCH_TRY(be, "cuda_kv_store_kernel");
    return 0;
}

/* ---- attention: the simple kernel ---- */

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

/* ---- fast paths: helpers ---- */

/* 8 bf16 (one 16-byte load) to fp32: a bf16 is the top half of its fp32. */
__device__ __forceinline__ void att_unpack8(uint4 u, float *f) {
    f[0] = __uint_as_float(u.x << 16);
    f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16);
    f[3] = __uint_as_float(u.y & 0xffff0000u);
    f[4] = __uint_as_float(u.z << 16);
    f[5] = __uint_as_float(u.z & 0xffff0000u);
    f[6] = __uint_as_float(u.w << 16);
    f[7] = __uint_as_float(u.w & 0xffff0000u);
}

/* Two floats rounded to bf16 (nearest even), the first in the low half
 * (the lower address). */
__device__ __forceinline__ unsigned att_pack2(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    /* assembled from the halves: reading v through an unsigned * would be
     * type punning, undefined in C++ (g++ -O2 warns in tests/emu) */
    return (unsigned)__bfloat16_as_ushort(v.x) | (unsigned)__bfloat16_as_ushort(v.y) << 16;
}

/* ---- prefill kernel ---- */

/* Dynamic shared memory of att_prefill_kernel<HD>, byte offsets. Every row
 * is padded by 16 bytes so the rows a WMMA load touches start on different
 * banks; every region and every fragment's address is a multiple of 32
 * bytes (WMMA's alignment rule), every leading dimension a multiple of 16
 * bytes. */
template <int HD> struct att_pf_smem {
    static constexpr int LDK = HD + 8;          /* bf16 per K/V (and Q) row */
    static constexpr int LDS = ATT_PF_KEYS + 4; /* fp32 per S row */
    static constexpr int LDP = ATT_PF_KEYS + 8; /* bf16 per P row */
    static constexpr size_t K_OFF = 0;
    static constexpr size_t V_OFF = K_OFF + (size_t)ATT_PF_KEYS * LDK * 2;
    static constexpr size_t S_OFF = V_OFF + (size_t)ATT_PF_KEYS * LDK * 2;
    static constexpr size_t P_OFF = S_OFF + (size_t)ATT_PF_ROWS * LDS * 4;
    static constexpr size_t C_OFF = P_OFF + (size_t)ATT_PF_ROWS * LDP * 2;
    static constexpr size_t BYTES = C_OFF + (size_t)ATT_PF_ROWS * 4;
    static_assert(ATT_PF_ROWS == ATT_PF_KEYS, "the Q tile is staged in the K tile's space");
    static_assert(ATT_PF_ROWS == 16 * ATT_PF_WARPS, "one 16-row WMMA strip per warp");
    static_assert(ATT_PF_KEYS == 64, "softmax: two lanes per row, 32 columns each");
    static_assert(HD % 64 == 0, "output staging: 64 columns per pass");
    static_assert(V_OFF % 128 == 0 && S_OFF % 128 == 0 && P_OFF % 128 == 0 && C_OFF % 128 == 0,
                  "32-byte aligned regions");
    static_assert((16 * LDK * 2) % 32 == 0 && (16 * LDS * 4) % 32 == 0 && (16 * LDP * 2) % 32 == 0,
                  "32-byte aligned 16-row strips");
};

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> att_frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> att_frag_bt; /* Kᵀ */
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> att_frag_b;  /* V */
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> att_frag_c;

/* One block per (tile of up to ATT_PF_ROWS rows of one sequence, query
 * head): tiles[4*blockIdx.x ..] = (first row, rows, position of the first
 * row, table offset), blockIdx.y = head. Design: docs/cuda-attention.md. */
template <int HD>
__global__ void __launch_bounds__(ATT_PF_WARPS * 32)
    att_prefill_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ q, const bf16 *__restrict__ kc,
                       const bf16 *__restrict__ vc, const int32_t *__restrict__ tiles,
                       const int32_t *__restrict__ tables, int block_size, int hq, int hkv, float scale_log2) {
    typedef att_pf_smem<HD> L;
    constexpr int THREADS = ATT_PF_WARPS * 32;
    constexpr int CH = HD / 8;                      /* 16-byte chunks per row */
    constexpr int KS = HD / 16;                     /* k steps of Q·Kᵀ = column tiles of O */
    constexpr int PER = ATT_PF_KEYS * CH / THREADS; /* chunks per thread of a K or V tile */
    static_assert(ATT_PF_KEYS * CH % THREADS == 0, "whole K/V tile per pass");
    static_assert(att_frag_c::num_elements * 4 <= 32, "row map packs 4 bits per accumulator element");

    extern __shared__ __align__(128) unsigned char att_smem[];
    bf16 *sK = (bf16 *)(att_smem + L::K_OFF), *sV = (bf16 *)(att_smem + L::V_OFF);
    float *sS = (float *)(att_smem + L::S_OFF), *sC = (float *)(att_smem + L::C_OFF);
    bf16 *sP = (bf16 *)(att_smem + L::P_OFF);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t *tl = tiles + 4 * (size_t)blockIdx.x;
    const int row0 = tl[0], nrows = tl[1], p0 = tl[2];
    const int32_t *bt = tables + tl[3];
    const int h = blockIdx.y, kvh = h / (hq / hkv);
    const size_t qdim = (size_t)hq * HD, kvdim = (size_t)hkv * HD;
    const int p_last = p0 + nrows - 1; /* the last key any row of the tile sees */

    /* this warp's strips */
    float *sSw = sS + warp * 16 * L::LDS, *sCw = sC + warp * 16;
    bf16 *sPw = sP + warp * 16 * L::LDP;

    /* Q tile into the K space; rows past the tile are zero */
    for (int i = tid; i < ATT_PF_ROWS * CH; i += THREADS) {
        const int r = i / CH, c = (i % CH) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < nrows) v = *(const uint4 *)(q + (size_t)(row0 + r) * qdim + (size_t)h * HD + c);
        *(uint4 *)(sK + r * L::LDK + c) = v;
    }
    /* the accumulator row map: entry (r, c) = r, loaded as a fragment */
    for (int e = lane; e < 256; e += 32)
        sSw[(e >> 4) * L::LDS + (e & 15)] = (float)(e >> 4);
    __syncwarp();
    unsigned rowmap = 0;
    {
        att_frag_c f;
        wmma::load_matrix_sync(f, sSw, L::LDS, wmma::mem_row_major);
#pragma unroll
        for (int i = 0; i < att_frag_c::num_elements; i++)
            rowmap |= ((unsigned)f.x[i] & 15u) << (4 * i);
    }
    __syncthreads();
    att_frag_a fq[KS];
#pragma unroll
    for (int k = 0; k < KS; k++)
        wmma::load_matrix_sync(fq[k], sK + warp * 16 * L::LDK + k * 16, L::LDK);
    __syncthreads(); /* the K tile loads overwrite the Q tile */

    /* softmax state: lane pair (2r, 2r+1) owns row r of the warp's strip */
    const int rl = lane >> 1, half = lane & 1;
    const int trow = warp * 16 + rl; /* row within the tile */
    const int pos = trow < nrows ? p0 + trow : -1;
    const int wrows = min(max(nrows - warp * 16, 0), 16);
    const int wpos_max = wrows > 0 ? p0 + warp * 16 + wrows - 1 : -1; /* -1: an idle warp */
    float m = -INFINITY, l = 0.0f;
    att_frag_c fo[KS];
#pragma unroll
    for (int j = 0; j < KS; j++)
        wmma::fill_fragment(fo[j], 0.0f);

    const int nkt = p_last / ATT_PF_KEYS + 1;
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * ATT_PF_KEYS;
        /* K and V tiles: all cache offsets first, then the loads of a tile
         * back to back so they are in flight together */
        size_t src[PER];
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int i = tid + j * THREADS, t = k0 + i / CH;
            src[j] = t <= p_last ? ((size_t)bt[t / block_size] * block_size + (size_t)(t % block_size)) * kvdim +
                                       (size_t)kvh * HD + (size_t)(i % CH) * 8
                                 : ~(size_t)0;
        }
        uint4 buf[PER];
#pragma unroll
        for (int j = 0; j < PER; j++)
            buf[j] = src[j] != ~(size_t)0 ? *(const uint4 *)(kc + src[j]) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int i = tid + j * THREADS;
            *(uint4 *)(sK + (i / CH) * L::LDK + (i % CH) * 8) = buf[j];
        }
#pragma unroll
        for (int j = 0; j < PER; j++)
            buf[j] = src[j] != ~(size_t)0 ? *(const uint4 *)(vc + src[j]) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int i = tid + j * THREADS;
            *(uint4 *)(sV + (i / CH) * L::LDK + (i % CH) * 8) = buf[j];
        }
        __syncthreads();

        /* warp-uniform: does some row of the warp see a key of this tile? */
        if (k0 <= wpos_max) {
            /* S = Q·Kᵀ for the 16-key slices some row of the warp sees; the
             * others keep stale values, which the mask below never reads */
#pragma unroll
            for (int j = 0; j < ATT_PF_KEYS / 16; j++) {
                if (k0 + 16 * j <= wpos_max) {
                    att_frag_c fs;
                    wmma::fill_fragment(fs, 0.0f);
#pragma unroll
                    for (int k = 0; k < KS; k++) {
                        att_frag_bt fk;
                        wmma::load_matrix_sync(fk, sK + j * 16 * L::LDK + k * 16, L::LDK);
                        wmma::mma_sync(fs, fq[k], fk, fs);
                    }
                    wmma::store_matrix_sync(sSw + j * 16, fs, L::LDS, wmma::mem_row_major);
                }
            }
            __syncwarp();
            /* online softmax of row rl over this tile; lane `half` takes the
             * columns c = 2i + half */
            float tmax = -INFINITY;
#pragma unroll 8
            for (int i = 0; i < ATT_PF_KEYS / 2; i++) {
                const int c = 2 * i + half;
                if (k0 + c <= pos) tmax = fmaxf(tmax, sSw[rl * L::LDS + c] * scale_log2);
            }
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
            const float m_new = fmaxf(m, tmax);
            /* a row that has seen no key yet (or a row past the tile) keeps
             * m = -inf; subtracting 0 then gives p = 0, corr = 0, no NaN */
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float corr = exp2f(m - m_use);
            float rsum = 0.0f;
#pragma unroll 8
            for (int i = 0; i < ATT_PF_KEYS / 2; i++) {
                const int c = 2 * i + half;
                float p = 0.0f;
                if (k0 + c <= pos) p = exp2f(sSw[rl * L::LDS + c] * scale_log2 - m_use);
                const bf16 pb = __float2bfloat16_rn(p);
                sPw[rl * L::LDP + c] = pb;
                rsum += __bfloat162float(pb);
            }
            rsum += __shfl_xor_sync(0xffffffffu, rsum, 1);
            l = l * corr + rsum;
            m = m_new;
            if (half == 0) sCw[rl] = corr;
            __syncwarp();
            /* O *= corr per row, then O += P·V */
#pragma unroll
            for (int j = 0; j < KS; j++)
#pragma unroll
                for (int i = 0; i < att_frag_c::num_elements; i++)
                    fo[j].x[i] *= sCw[(rowmap >> (4 * i)) & 15u];
#pragma unroll
            for (int k = 0; k < ATT_PF_KEYS / 16; k++) {
                if (k0 + 16 * k <= wpos_max) { /* else P is 0 there */
                    att_frag_a fp;
                    wmma::load_matrix_sync(fp, sPw + k * 16, L::LDP);
#pragma unroll
                    for (int j = 0; j < KS; j++) {
                        att_frag_b fv;
                        wmma::load_matrix_sync(fv, sV + k * 16 * L::LDK + j * 16, L::LDK);
                        wmma::mma_sync(fo[j], fp, fv, fo[j]);
                    }
                }
            }
        }
        __syncthreads(); /* the next tile overwrites K and V */
    }

    /* out = O / l, through the S strip, 64 columns per pass */
    if (half == 0) sCw[rl] = l > 0.0f ? 1.0f / l : 0.0f;
    __syncwarp();
#pragma unroll
    for (int j = 0; j < KS; j++)
#pragma unroll
        for (int i = 0; i < att_frag_c::num_elements; i++)
            fo[j].x[i] *= sCw[(rowmap >> (4 * i)) & 15u];
#pragma unroll
    for (int hp = 0; hp < HD / 64; hp++) {
#pragma unroll
        for (int j = 0; j < 4; j++)
            wmma::store_matrix_sync(sSw + j * 16, fo[hp * 4 + j], L::LDS, wmma::mem_row_major);
        __syncwarp();
        if (trow < nrows) {
            const float *s = sSw + rl * L::LDS + half * 32;
            bf16 *o = out + (size_t)(row0 + trow) * qdim + (size_t)h * HD + hp * 64 + half * 32;
#pragma unroll
            for (int c = 0; c < 32; c += 8)
                *(uint4 *)(o + c) = make_uint4(att_pack2(s[c], s[c + 1]), att_pack2(s[c + 2], s[c + 3]),
                                               att_pack2(s[c + 4], s[c + 5]), att_pack2(s[c + 6], s[c + 7]));
        }
        __syncwarp(); /* the next pass overwrites the strip */
    }
}

/* ---- decode kernel ---- */

/* One block per (item, group of GT query heads): items[5*blockIdx.x ..] =
 * (row, first key, end key, table offset, partial slot or -1), blockIdx.y =
 * head group (heads GT*y .. GT*y+GT-1, one KV head since GT divides
 * hq/hkv). Design: docs/cuda-attention.md. */
template <int HD, int GT>
__global__ void __launch_bounds__(ATT_DEC_THREADS)
    att_decode_kernel(bf16 *__restrict__ out, float *__restrict__ part_acc, float2 *__restrict__ part_ml,
                      const bf16 *__restrict__ q, const bf16 *__restrict__ kc, const bf16 *__restrict__ vc,
                      const int32_t *__restrict__ items, const int32_t *__restrict__ tables, int block_size, int hq,
                      int hkv, float scale_log2) {
    constexpr int LPK = HD / 8;               /* lanes per key: 8 dimensions each */
    constexpr int KG = ATT_DEC_THREADS / LPK; /* key groups per block */
    constexpr int U = ATT_DEC_UNROLL;
    static_assert(LPK <= 32 && 32 % LPK == 0, "a key group lies inside one warp");
    __shared__ float sm_m[KG * GT], sm_l[KG * GT], sm_w[KG * GT], sm_L[GT];
    __shared__ __align__(16) float sm_acc[KG * GT * HD];

    const int tid = threadIdx.x, g = tid / LPK, sub = tid % LPK;
    const int32_t *it = items + 5 * (size_t)blockIdx.x;
    const int row = it[0], kb = it[1], ke = it[2], pslot = it[4];
    const int32_t *bt = tables + it[3];
    const int h0 = blockIdx.y * GT, kvh = h0 / (hq / hkv);
    if (kb >= ke) {
        /* an empty split (only split rows have them): the combine skips
         * m = -inf partials and never reads their acc; the whole block
         * leaves together, before any barrier */
        if (pslot >= 0 && tid < GT) part_ml[(size_t)pslot * hq + h0 + tid] = make_float2(-INFINITY, 0.0f);
        return;
    }
    const size_t qdim = (size_t)hq * HD, kvdim = (size_t)hkv * HD;
    const size_t koff = (size_t)kvh * HD + (size_t)sub * 8;

    float qf[GT][8], acc[GT][8], m[GT], l[GT];
#pragma unroll
    for (int gh = 0; gh < GT; gh++) {
        att_unpack8(*(const uint4 *)(q + (size_t)row * qdim + (size_t)(h0 + gh) * HD + sub * 8), qf[gh]);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            qf[gh][e] *= scale_log2;
            acc[gh][e] = 0.0f;
        }
        m[gh] = -INFINITY;
        l[gh] = 0.0f;
    }

    /* the trip count is the same for every thread (shuffles need the whole
     * warp); keys past the end are masked */
    for (int base = kb; base < ke; base += KG * U) {
        uint4 kr[U], vr[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int t = base + g + KG * u;
            ok[u] = t < ke;
            kr[u] = vr[u] = make_uint4(0u, 0u, 0u, 0u);
            if (ok[u]) {
                const size_t off = ((size_t)bt[t / block_size] * block_size + (size_t)(t % block_size)) * kvdim + koff;
                kr[u] = *(const uint4 *)(kc + off);
                vr[u] = *(const uint4 *)(vc + off);
            }
        }
        float s[U][GT], vf[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float kf[8];
            att_unpack8(kr[u], kf);
            att_unpack8(vr[u], vf[u]);
#pragma unroll
            for (int gh = 0; gh < GT; gh++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    d += qf[gh][e] * kf[e];
#pragma unroll
                for (int off = LPK / 2; off > 0; off >>= 1)
                    d += __shfl_xor_sync(0xffffffffu, d, off);
                s[u][gh] = ok[u] ? d : -INFINITY;
            }
        }
#pragma unroll
        for (int gh = 0; gh < GT; gh++) {
            float mx = s[0][gh];
#pragma unroll
            for (int u = 1; u < U; u++)
                mx = fmaxf(mx, s[u][gh]);
            const float mn = fmaxf(m[gh], mx);
            /* mn = -inf: the group has seen no key yet, nothing to update */
            if (mn != -INFINITY) {
                const float corr = exp2f(m[gh] - mn); /* m = -inf: 0 */
                float p[U], ps = 0.0f;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    p[u] = exp2f(s[u][gh] - mn); /* masked: 0 */
                    ps += p[u];
                }
                l[gh] = l[gh] * corr + ps;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    float a = acc[gh][e] * corr;
#pragma unroll
                    for (int u = 0; u < U; u++)
                        a += p[u] * vf[u][e];
                    acc[gh][e] = a;
                }
                m[gh] = mn;
            }
        }
    }

    /* merge the key groups */
#pragma unroll
    for (int gh = 0; gh < GT; gh++) {
        if (sub == 0) {
            sm_m[g * GT + gh] = m[gh];
            sm_l[g * GT + gh] = l[gh];
        }
        float4 *d = (float4 *)(sm_acc + (g * GT + gh) * HD + sub * 8);
        d[0] = make_float4(acc[gh][0], acc[gh][1], acc[gh][2], acc[gh][3]);
        d[1] = make_float4(acc[gh][4], acc[gh][5], acc[gh][6], acc[gh][7]);
    }
    __syncthreads();
    if (tid < GT) {
        /* the item holds >= 1 key and group 0 takes the first: M is finite */
        const int gh = tid;
        float M = -INFINITY, Lsum = 0.0f;
        for (int j = 0; j < KG; j++)
            M = fmaxf(M, sm_m[j * GT + gh]);
        for (int j = 0; j < KG; j++) {
            const float mj = sm_m[j * GT + gh];
            const float w = mj == -INFINITY ? 0.0f : exp2f(mj - M); /* groups that saw no key */
            sm_w[j * GT + gh] = w;
            Lsum += sm_l[j * GT + gh] * w;
        }
        sm_L[gh] = Lsum;
        if (pslot >= 0) part_ml[(size_t)pslot * hq + h0 + gh] = make_float2(M, Lsum);
    }
    __syncthreads();
    for (int i = tid; i < GT * HD; i += ATT_DEC_THREADS) {
        const int gh = i / HD, d = i % HD;
        float o = 0.0f;
#pragma unroll
        for (int j = 0; j < KG; j++)
            o += sm_w[j * GT + gh] * sm_acc[(j * GT + gh) * HD + d];
        if (pslot < 0)
            out[(size_t)row * qdim + (size_t)(h0 + gh) * HD + d] = __float2bfloat16_rn(o / sm_L[gh]);
        else
            part_acc[((size_t)pslot * hq + h0 + gh) * HD + d] = o;
    }
}

/* One block of HD threads per (split row, head): comb[3*blockIdx.x ..] =
 * (row, first partial slot, splits), blockIdx.y = head. */
template <int HD>
__global__ void __launch_bounds__(HD)
    att_combine_kernel(bf16 *__restrict__ out, const float *__restrict__ part_acc, const float2 *__restrict__ part_ml,
                       const int32_t *__restrict__ comb, int hq) {
    const int32_t *c = comb + 3 * (size_t)blockIdx.x;
    const int row = c[0], p0 = c[1], np = c[2], h = blockIdx.y, d = threadIdx.x;
    float M = -INFINITY;
    for (int j = 0; j < np; j++)
        M = fmaxf(M, part_ml[(size_t)(p0 + j) * hq + h].x);
    float Lsum = 0.0f, o = 0.0f;
    for (int j = 0; j < np; j++) {
        const float2 ml = part_ml[(size_t)(p0 + j) * hq + h];
        if (ml.x == -INFINITY) continue; /* an empty split; split 0 always holds key 0, so M is finite */
        const float w = exp2f(ml.x - M);
        Lsum += ml.y * w;
        o += part_acc[((size_t)(p0 + j) * hq + h) * HD + d] * w;
    }
    out[(size_t)row * hq * HD + (size_t)h * HD + d] = __float2bfloat16_rn(o / Lsum);
}

/* ---- host: the fast paths ---- */

/* The split of every decode-path row of a batch whose block tables hold
 * cap = max_blocks * block_size positions and whose per-row grid is
 * `groups` blocks: the number of splits (1: not split) and the keys per
 * split (a multiple of ATT_SPLIT_ALIGN). It depends on the capacity and
 * the device, never on a row's length (docs/cuda-attention.md). */
static int att_splits(int64_t cap, int groups, int sms, int64_t *chunk) {
    *chunk = cap;
    int64_t want = (2 * (int64_t)sms + groups - 1) / groups; /* splits for ~2 blocks per SM */
    int64_t n = cap / ATT_SPLIT_MIN_KEYS;
    if (n < 1) n = 1;
    if (n > want) n = want;
    if (n > ATT_SPLIT_MAX) n = ATT_SPLIT_MAX;
    if (n < 2) return 1;
    int64_t per = (cap + n - 1) / n;
    per = (per + ATT_SPLIT_ALIGN - 1) / ATT_SPLIT_ALIGN * ATT_SPLIT_ALIGN;
    int splits = (int)((cap + per - 1) / per);
    if (splits < 2) return 1;
    *chunk = per;
    return splits;
}

/* The split-K partials: grown on demand, never shrunk. */
static int att_part_reserve(kern_backend *be, size_t bytes, float **p) {
    cuda_impl *impl = cuda_get(be);
    if (bytes > impl->att_part_bytes) {
        size_t want = impl->att_part_bytes * 2 > bytes ? impl->att_part_bytes * 2 : bytes;
        if (want < ((size_t)1 << 20)) want = (size_t)1 << 20;
        /* kernels enqueued earlier may still use the old buffer */
        CUDA_TRY(be, cudaStreamSynchronize(impl->stream));
        impl->graph_epoch++; /* graphs captured with the old buffer must not replay */
        void *old = impl->att_part, *d = NULL;
        impl->att_part = NULL;
        impl->att_part_bytes = 0;
        if (old) CUDA_TRY(be, cudaFree(old));
        CUDA_TRY(be, cudaMalloc(&d, want));
        impl->att_part = (float *)d;
        impl->att_part_bytes = want;
    }
    *p = impl->att_part;
    return 0;
}

/* Allow the prefill kernel more than the default 48 KB of dynamic shared
 * memory (once per backend; `bit` names the instance). */
template <int HD> static int att_prefill_smem(kern_backend *be, unsigned bit) {
    cuda_impl *impl = cuda_get(be);
    constexpr size_t bytes = att_pf_smem<HD>::BYTES;
    if constexpr (bytes > 48 * 1024) {
        if (!(impl->att_smem_set & bit)) {
            CUDA_TRY(be, cudaFuncSetAttribute(att_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)bytes));
            impl->att_smem_set |= bit;
        }
    }
    return 0;
}

template <int HD>
static int att_launch(kern_backend *be, bf16 *out, const bf16 *q, const bf16 *kc, const bf16 *vc, const int32_t *dtab,
                      const int32_t *dtiles, int ntiles, const int32_t *ditems, int nitems, const int32_t *dcomb,
                      int ncomb, float *part, int nparts, int bs, int hq, int hkv, int gt, float scale_log2) {
    if (cuda_replaying(be)) return 0;
    cudaStream_t st = cuda_get(be)->stream;
    if (ntiles > 0) {
        if (att_prefill_smem<HD>(be, HD == 64 ? 1u : 2u)) return -1;
        dim3 grid((unsigned)ntiles, (unsigned)hq);
        att_prefill_kernel<HD><<<grid, ATT_PF_WARPS * 32, att_pf_smem<HD>::BYTES, st>>>(out, q, kc, vc, dtiles, dtab,
                                                                                        bs, hq, hkv, scale_log2);
        CUDA_LAUNCH_TRY(be, "att_prefill_kernel");
    }
    float *pacc = part;
    float2 *pml = part ? (float2 *)(part + (size_t)nparts * hq * HD) : NULL;
    if (nitems > 0) {
        dim3 grid((unsigned)nitems, (unsigned)(hq / gt));
        const unsigned th = ATT_DEC_THREADS;
        if (gt == 8)
            att_decode_kernel<HD, 8>
                <<<grid, th, 0, st>>>(out, pacc, pml, q, kc, vc, ditems, dtab, bs, hq, hkv, scale_log2);
        else if (gt == 4)
            att_decode_kernel<HD, 4>
                <<<grid, th, 0, st>>>(out, pacc, pml, q, kc, vc, ditems, dtab, bs, hq, hkv, scale_log2);
        else if (gt == 2)
            att_decode_kernel<HD, 2>
                <<<grid, th, 0, st>>>(out, pacc, pml, q, kc, vc, ditems, dtab, bs, hq, hkv, scale_log2);
        else
            att_decode_kernel<HD, 1>
                <<<grid, th, 0, st>>>(out, pacc, pml, q, kc, vc, ditems, dtab, bs, hq, hkv, scale_log2);
        CUDA_LAUNCH_TRY(be, "att_decode_kernel");
    }
    if (ncomb > 0) {
        dim3 grid((unsigned)ncomb, (unsigned)hq);
        att_combine_kernel<HD><<<grid, HD, 0, st>>>(out, pacc, pml, dcomb, hq);
        CUDA_LAUNCH_TRY(be, "att_combine_kernel");
    }
    return 0;
}

/* hd 64 or 128, 16-byte aligned operands, batch validated, nq > 0, the
 * device entered; nt = the block-table entries the batch uses. */
static int att_fast(kern_backend *be, void *out, const void *q, const void *kc, const void *vc,
                    const kern_attn_batch *b, int hq, int hkv, int hd, float scale, int64_t nt) {
    cuda_impl *impl = cuda_get(be);
    const int bs = b->block_size, G = hq / hkv;
    /* query heads per decode block: the most of 8, 4, 2, 1 that divides the
     * GQA group, so a block's heads share one KV head */
    const int gt = G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
    const int groups = hq / gt, sms = impl->sm_count > 0 ? impl->sm_count : 1;
    const int pad = impl->graph_mode != CUDA_GRAPH_OFF; /* whole tables: sizes fixed by the shape */
    int64_t chunk = 0;
    const int ns = att_splits((int64_t)b->max_blocks * bs, groups, sms, &chunk);

    int64_t ntiles = 0, nitems = 0, ncomb = 0, nparts = 0;
    if (pad) nt = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int n = b->q_start[s + 1] - b->q_start[s];
        if (n == 0) continue;
        if (pad) nt += b->max_blocks;
        if (n >= ATT_PF_MIN_ROWS) {
            ntiles += (n + ATT_PF_ROWS - 1) / ATT_PF_ROWS;
            continue;
        }
        nitems += (int64_t)n * ns;
        if (ns > 1) {
            ncomb += n;
            nparts += (int64_t)n * ns;
        }
    }
    const int64_t total = nt + 4 * ntiles + 5 * nitems + 3 * ncomb;
    if (total > INT_MAX || nparts * hq > INT_MAX)
        return kern_fail(be, "attention: batch tables of %lld values too large", (long long)total);
    float *part = NULL;
    if (nparts > 0 && att_part_reserve(be, (size_t)nparts * hq * (hd + 2) * sizeof(float), &part)) return -1;

    int32_t *tab = NULL;
    if (cuda_stage_begin(be, (size_t)total, &tab)) return -1;
    int32_t *tiles = tab + nt, *items = tiles + 4 * ntiles, *comb = items + 5 * nitems;
    int32_t toff = 0, ti = 0, ii = 0, ci = 0, pi = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const int n = b->q_start[s + 1] - b->q_start[s], r0 = b->q_start[s], p0 = b->pos0[s];
        if (n == 0) continue;
        const int used = pad ? b->max_blocks : (p0 + n + bs - 1) / bs;
        memcpy(tab + toff, b->block_table + (size_t)s * b->max_blocks, (size_t)used * sizeof(int32_t));
        if (n >= ATT_PF_MIN_ROWS) {
            for (int k = (n - 1) / ATT_PF_ROWS; k >= 0; k--, ti++) { /* last tile (most keys) first */
                const int first = k * ATT_PF_ROWS;
                tiles[4 * ti] = r0 + first;
                tiles[4 * ti + 1] = n - first < ATT_PF_ROWS ? n - first : ATT_PF_ROWS;
                tiles[4 * ti + 2] = p0 + first;
                tiles[4 * ti + 3] = toff;
            }
        } else {
            for (int j = 0; j < n; j++) {
                const int64_t len = p0 + j + 1;
                if (ns > 1) {
                    comb[3 * ci] = r0 + j;
                    comb[3 * ci + 1] = pi;
                    comb[3 * ci + 2] = ns;
                    ci++;
                }
                for (int k = 0; k < ns; k++, ii++) {
                    /* unsplit: chunk = cap >= len; an empty range (kb >= ke) is an empty partial */
                    const int64_t kb = (int64_t)k * chunk, ke = (int64_t)(k + 1) * chunk;
                    items[5 * ii] = r0 + j;
                    items[5 * ii + 1] = (int32_t)(kb < len ? kb : len);
                    items[5 * ii + 2] = (int32_t)(ke < len ? ke : len);
                    items[5 * ii + 3] = toff;
                    items[5 * ii + 4] = ns > 1 ? pi + k : -1;
                }
                if (ns > 1) pi += ns;
            }
        }
        toff += used;
    }
    const int32_t *dtab = NULL;
    if (cuda_stage_commit(be, (size_t)total, &dtab)) return -1;
    const int32_t *dtiles = dtab + nt, *ditems = dtiles + 4 * ntiles, *dcomb = ditems + 5 * nitems;

    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *k = (const bf16 *)kc, *v = (const bf16 *)vc;
    const float sl = scale * ATT_LOG2E;
    if (hd == 64)
        return att_launch<64>(be, o, qq, k, v, dtab, dtiles, (int)ntiles, ditems, (int)nitems, dcomb, (int)ncomb, part,
                              (int)nparts, bs, hq, hkv, gt, sl);
    return att_launch<128>(be, o, qq, k, v, dtab, dtiles, (int)ntiles, ditems, (int)nitems, dcomb, (int)ncomb, part,
                           (int)nparts, bs, hq, hkv, gt, sl);
}

/* ---- the op ---- */

int cuda_attention(kern_backend *be, void *out, const void *q, const void *kc, const void *vc, const kern_attn_batch *b,
                   int hq, int hkv, int hd, float scale, kern_kv_dtype dt) {
    if (cuda_kv_supported(be, "attention", dt)) return -1;
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
    const uintptr_t al = (uintptr_t)out | (uintptr_t)q | (uintptr_t)kc | (uintptr_t)vc;
    if ((hd == 64 || hd == 128) && al % 16 == 0) return att_fast(be, out, q, kc, vc, b, hq, hkv, hd, scale, nt);

    /* the simple path: its batch tables, built straight in the pinned
     * staging buffer; whole tables in graph mode (sizes fixed by the shape) */
    const int pad = cuda_get(be)->graph_mode != CUDA_GRAPH_OFF;
    if (pad) {
        nt = 0;
        for (int s = 0; s < b->n_seqs; s++)
            if (b->q_start[s + 1] > b->q_start[s]) nt += b->max_blocks;
        if (3 * nq + nt > INT_MAX)
            return kern_fail(be, "attention: batch tables of %lld values too large", (long long)(3 * nq + nt));
    }
    size_t total = (size_t)(3 * nq + nt);
    int32_t *info = NULL;
    if (cuda_stage_begin(be, total, &info)) return -1;
    int32_t *tab = info + 3 * nq;
    int32_t r = 0, toff = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int n = b->q_start[s + 1] - b->q_start[s];
        if (n == 0) continue;
        int used = pad ? b->max_blocks : (b->pos0[s] + n + bs - 1) / bs;
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
    if (cuda_replaying(be)) return 0;

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
