/*
 * cuda: causal GQA attention of a batch of sequences over a paged KV cache,
 * and the cache store. Twin of kernels/cpu/attention.c (kern_attn_batch in
 * kernels/kernels.h). The full contract and the design (dispatch, key
 * splits, staged tables, the kernels) are in docs/cuda-attention.md.
 *
 *   The cache holds any kern_kv_dtype (F32, BF16, F16, Q8_0; layouts in
 *   kernels.h, scalar reference in kernels/kv.h); BF16 is the native one.
 *   kv_store: rows i < n of k, v (n, kvdim) bf16 to rows slots[i] of kc,
 *     vc, each kv head exactly as kern_kv_store_ref writes its fp32
 *     widening (BF16: the bits as they are; Q8_0 keys rotated by the
 *     Walsh-Hadamard butterflies of kern_kv_rotate, same order and scale);
 *     slots is a host array, each checked >= 0 before launch.
 *   attention: q, out (q_start[n_seqs], hq*hd) bf16; kc, vc (n_blocks *
 *     block_size rows of kern_kv_row_bytes) addressed through block_table,
 *     read in their stored type (no widened copy): every kernel converts
 *     the K/V it loads in registers (the prefill kernel then rounds them to
 *     bf16 in its shared-memory tile, the tensor cores' input). Q8_0: each
 *     query head is rotated in the kernel like the keys. Per (row, head):
 *     out = softmax(q·kᵀ·scale)·v over positions 0..p (causal, by
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
#include <cuda_fp16.h>
#include <mma.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/kv.h"

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

/* ---- the cache types (kern_kv_dtype, kernels/kv.h) ---- */

/* Bytes of one kv head of a cache of type KT (kern_kv_head_bytes). */
template <int KT> __host__ __device__ constexpr int att_head_bytes(int hd) {
    return KT == KERN_KV_F32 ? 4 * hd : KT == KERN_KV_Q8_0 ? hd + hd / KERN_KV_Q8_BLOCK * 2 : 2 * hd;
}

/* IEEE binary16 bits to fp32 (exact), by the conversion instruction. */
__device__ __forceinline__ float att_h2f_cvt(unsigned short b) {
    __half_raw r;
    r.x = b;
    return __half2float(__half(r));
}

/* The same in integer and fp32 operations (normal and subnormal halves
 * rebased by 2^112, exactly): with cvt, ptxas spills the decode kernel at
 * sm_80. */
__device__ __forceinline__ float att_h2f(unsigned short b) {
    const unsigned h = b;
    /* the exponent rebased by 2^112: exact for normal and subnormal halves */
    float f = __uint_as_float((h & 0x7fffu) << 13) * 0x1p112f;
    if ((h & 0x7c00u) == 0x7c00u) f = __uint_as_float(0x7f800000u | (h & 0x3ffu) << 13); /* inf, NaN */
    return __uint_as_float(__float_as_uint(f) | (h & 0x8000u) << 16);
}

/* The orthonormal Walsh-Hadamard rotation of one head, kern_kv_rotate's
 * fp32 operations in its order (butterflies of stride 1, 2, .., hd/2, then
 * x s), on a head spread over lanes. Each butterfly (a, b) -> (a + b,
 * a - b) is the same two roundings whichever lane computes it, so the
 * result is kern_kv_rotate's to the bit.
 * Contiguous: the W lanes of an aligned group hold E values each, lane
 * `sub` the values sub*E .. sub*E+E-1 (strides < E inside the lane, then
 * across lanes). The whole warp must call it. */
template <int E, int W> __device__ __forceinline__ void att_rotate(float *x, int sub, float s) {
#pragma unroll
    for (int len = 1; len < E; len *= 2)
#pragma unroll
        for (int i = 0; i < E; i += 2 * len)
#pragma unroll
            for (int j = i; j < i + len; j++) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
#pragma unroll
    for (int lo = 1; lo < W; lo *= 2) {
        const bool upper = (sub & lo) != 0; /* this lane holds b of the pair */
#pragma unroll
        for (int e = 0; e < E; e++) {
            const float o = __shfl_xor_sync(0xffffffffu, x[e], lo);
            x[e] = upper ? o - x[e] : x[e] + o;
        }
    }
#pragma unroll
    for (int e = 0; e < E; e++)
        x[e] *= s;
}

/* Strided: lane l of the warp holds values l + 32j, j < DPL (hd = 32 DPL):
 * strides < 32 across lanes first, then inside the lane. */
template <int DPL> __device__ __forceinline__ void att_rotate_strided(float *x, int lane, float s) {
#pragma unroll
    for (int lo = 1; lo < 32; lo *= 2) {
        const bool upper = (lane & lo) != 0;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            const float o = __shfl_xor_sync(0xffffffffu, x[j], lo);
            x[j] = upper ? o - x[j] : x[j] + o;
        }
    }
#pragma unroll
    for (int len = 1; len < DPL; len *= 2)
#pragma unroll
        for (int i = 0; i < DPL; i += 2 * len)
#pragma unroll
            for (int j = i; j < i + len; j++) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
#pragma unroll
    for (int j = 0; j < DPL; j++)
        x[j] *= s;
}

/* Value c of the kv head at hp, as kern_kv_load_ref reads it (hd: the
 * head's dimension, for the Q8_0 scales). Element-aligned hp. */
template <int KT> __device__ __forceinline__ float att_load1(const unsigned char *hp, int hd, int c) {
    if constexpr (KT == KERN_KV_BF16) return __bfloat162float(((const bf16 *)hp)[c]);
    if constexpr (KT == KERN_KV_F16) return att_h2f(((const unsigned short *)hp)[c]);
    if constexpr (KT == KERN_KV_F32) return ((const float *)hp)[c];
    const unsigned short d = ((const unsigned short *)(hp + hd))[c / KERN_KV_Q8_BLOCK];
    return att_h2f(d) * (float)(signed char)hp[c];
}

/* ---- kv_store ---- */

/* blockIdx.x = row i, blockIdx.y = 0 (keys) or 1 (values); `words` units of
 * T per row (T = uint4 when rows are 16-byte aligned, else bf16): the BF16
 * cache, a copy. */
#define KV_STORE_THREADS 128

template <typename T>
__global__ void __launch_bounds__(KV_STORE_THREADS)
    cuda_kv_store_kernel(T *kc, T *vc, const T *k, const T *v, const int32_t *slots, size_t words) {
    const T *src = (blockIdx.y ? v : k) + (size_t)blockIdx.x * words;
    T *dst = (blockIdx.y ? vc : kc) + (size_t)slots[blockIdx.x] * words;
    for (size_t c = threadIdx.x; c < words; c += blockDim.x)
        dst[c] = src[c];
}

/* F32 and F16 caches: rows of kvdim values, each widened to fp32 (exact)
 * and stored as kern_kv_store_ref does. Grid as above. */
template <int KT>
__global__ void __launch_bounds__(KV_STORE_THREADS)
    cuda_kv_store_wide_kernel(unsigned char *kc, unsigned char *vc, const bf16 *k, const bf16 *v,
                              const int32_t *slots, int kvdim) {
    const bf16 *src = (blockIdx.y ? v : k) + (size_t)blockIdx.x * kvdim;
    unsigned char *dst = (blockIdx.y ? vc : kc) + (size_t)slots[blockIdx.x] * att_head_bytes<KT>(kvdim);
    for (int c = threadIdx.x; c < kvdim; c += blockDim.x) {
        const float x = __bfloat162float(src[c]);
        if constexpr (KT == KERN_KV_F32)
            ((float *)dst)[c] = x;
        else
            ((unsigned short *)dst)[c] = kern_f32_to_f16(x);
    }
}

/* Q8_0 caches: one warp per kv head (hd = 32 DPL), lane l holding values
 * l + 32j, so block j of the head is the warp's j-th value: keys rotated
 * (att_rotate_strided, kern_kv_rotate's bits), then each block quantized
 * as kern_kv_quantize_q8_0 (its amax a max over lanes: exact, any order).
 * Grid as above; the block's warps take heads warp, warp + 4, ... */
template <int DPL>
__global__ void __launch_bounds__(KV_STORE_THREADS)
    cuda_kv_store_q8_kernel(unsigned char *kc, unsigned char *vc, const bf16 *k, const bf16 *v, const int32_t *slots,
                            int hkv, float rscale) {
    constexpr int HD = 32 * DPL, HB = att_head_bytes<KERN_KV_Q8_0>(HD);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, key = blockIdx.y == 0;
    const bf16 *src = (key ? k : v) + (size_t)blockIdx.x * hkv * HD;
    unsigned char *dst = (key ? kc : vc) + (size_t)slots[blockIdx.x] * hkv * HB;
    for (int h = warp; h < hkv; h += KV_STORE_THREADS / 32) { /* warp-uniform */
        float x[DPL];
#pragma unroll
        for (int j = 0; j < DPL; j++)
            x[j] = __bfloat162float(src[(size_t)h * HD + lane + 32 * j]);
        if (key) att_rotate_strided<DPL>(x, lane, rscale);
        unsigned char *hp = dst + (size_t)h * HB;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            float amax = fmaxf(0.0f, fabsf(x[j])); /* a NaN drops out here, as in the reference */
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            hp[32 * j + lane] = (unsigned char)(signed char)roundf(x[j] * id);
            if (lane == 0) {
                const uint16_t hb = kern_f32_to_f16(d);
                hp[HD + 2 * j] = (unsigned char)(hb & 0xff);
                hp[HD + 2 * j + 1] = (unsigned char)(hb >> 8);
            }
        }
    }
}

/* NULL when this backend can hold kv heads of hd values in a cache of
 * type dt, else why not. */
static const char *cuda_kv_invalid(kern_kv_dtype dt, int hd) {
    if (dt == KERN_KV_NATIVE) return "KV cache dtype native is not resolved (kern_kv_resolve)";
    return kern_kv_invalid(dt, hd);
}

int cuda_kv_store(kern_backend *be, void *kc, void *vc, const void *k, const void *v, const int32_t *slots, int n,
                  int hkv, int hd, kern_kv_dtype dt) {
    int kvdim = hkv * hd;
    if (n < 0 || hkv < 0 || hd < 0) return kern_fail(be, "kv_store: bad shape n=%d kvdim=%d", n, kvdim);
    for (int i = 0; i < n; i++)
        if (slots[i] < 0) return kern_fail(be, "kv_store: negative cache slot %d", slots[i]);
    if (n == 0 || kvdim == 0) return 0;
    const char *why = cuda_kv_invalid(dt, hd);
    if (why) return kern_fail(be, "kv_store: KV cache dtype %s, head_dim %d: %s", kern_kv_dtype_name(dt), hd, why);
    if (((uintptr_t)kc | (uintptr_t)vc) % (dt == KERN_KV_F32 ? 4 : 2))
        return kern_fail(be, "kv_store: %s cache not aligned to its values", kern_kv_dtype_name(dt));
    if (cuda_enter(be)) return -1;
    const int32_t *dslots = NULL;
    if (cuda_stage_i32(be, slots, (size_t)n, &dslots)) return -1;
    if (cuda_replaying(be)) return 0;
    cudaStream_t st = cuda_get(be)->stream;
    dim3 grid((unsigned)n, 2);
    unsigned char *kb = (unsigned char *)kc, *vb = (unsigned char *)vc;
    const bf16 *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    if (dt == KERN_KV_F32) {
        cuda_kv_store_wide_kernel<KERN_KV_F32><<<grid, KV_STORE_THREADS, 0, st>>>(kb, vb, kk, vv, dslots, kvdim);
    } else if (dt == KERN_KV_F16) {
        cuda_kv_store_wide_kernel<KERN_KV_F16><<<grid, KV_STORE_THREADS, 0, st>>>(kb, vb, kk, vv, dslots, kvdim);
    } else if (dt == KERN_KV_Q8_0) {
        const float rs = kern_kv_rotate_scale(hd);
        switch (hd / KERN_KV_Q8_BLOCK) { /* a power of two, 1 .. 16 (kern_kv_invalid) */
        case 1: cuda_kv_store_q8_kernel<1><<<grid, KV_STORE_THREADS, 0, st>>>(kb, vb, kk, vv, dslots, hkv, rs); break;
        case 2: cuda_kv_store_q8_kernel<2><<<grid, KV_STORE_THREADS, 0, st>>>(kb, vb, kk, vv, dslots, hkv, rs); break;
        case 4: cuda_kv_store_q8_kernel<4><<<grid, KV_STORE_THREADS, 0, st>>>(kb, vb, kk, vv, dslots, hkv, rs); break;
        case 8: cuda_kv_store_q8_kernel<8><<<grid, KV_STORE_THREADS, 0, st>>>(kb, vb, kk, vv, dslots, hkv, rs); break;
        default:
            cuda_kv_store_q8_kernel<16><<<grid, KV_STORE_THREADS, 0, st>>>(kb, vb, kk, vv, dslots, hkv, rs);
            break;
        }
    } else {
        size_t bytes = (size_t)kvdim * sizeof(bf16);
        uintptr_t al = (uintptr_t)kc | (uintptr_t)vc | (uintptr_t)k | (uintptr_t)v;
        if (bytes % 16 == 0 && al % 16 == 0)
            cuda_kv_store_kernel<uint4><<<grid, KV_STORE_THREADS, 0, st>>>((uint4 *)kc, (uint4 *)vc, (const uint4 *)k,
                                                                           (const uint4 *)v, dslots, bytes / 16);
        else
            cuda_kv_store_kernel<bf16><<<grid, KV_STORE_THREADS, 0, st>>>((bf16 *)kc, (bf16 *)vc, kk, vv, dslots,
                                                                          (size_t)kvdim);
    }
    CUDA_LAUNCH_TRY(be, "cuda_kv_store_kernel");
    return 0;
}

/* ---- attention: the simple kernel ---- */

template <int KT, int DPL> /* cache type; dims per lane: ceil(hd / 32) <= DPL (Q8_0: hd = 32 DPL) */
__global__ void __launch_bounds__(ATT_WARPS * 32)
    cuda_attention_kernel(bf16 *out, const bf16 *q, const unsigned char *kc, const unsigned char *vc,
                          const int32_t *info, const int32_t *tables, int block_size, int hq, int hkv, int hd,
                          float scale, float rscale) {
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][DPL * 32];
    const int r = blockIdx.x, h = blockIdx.y;
    const int row = info[3 * (size_t)r], pos = info[3 * (size_t)r + 1];
    const int32_t *bt = tables + info[3 * (size_t)r + 2];
    const int kvh = h / (hq / hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t qdim = (size_t)hq * hd, hb = (size_t)att_head_bytes<KT>(hd), rb = (size_t)hkv * hb;
    const bf16 *qp = q + (size_t)row * qdim + (size_t)h * hd;

    float qr[DPL], acc[DPL];
#pragma unroll
    for (int j = 0; j < DPL; j++) {
        int c = lane + 32 * j;
        qr[j] = c < hd ? __bfloat162float(qp[c]) : 0.0f;
        acc[j] = 0.0f;
    }
    if constexpr (KT == KERN_KV_Q8_0) att_rotate_strided<DPL>(qr, lane, rscale); /* as the keys were */
    float m = -INFINITY, l = 0.0f;
    const int len = pos + 1;
    for (int t = warp; t < len; t += ATT_WARPS) {
        const size_t crow = (size_t)bt[t / block_size] * block_size + (size_t)(t % block_size);
        const unsigned char *kp = kc + crow * rb + (size_t)kvh * hb;
        const unsigned char *vp = vc + crow * rb + (size_t)kvh * hb;
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            int c = lane + 32 * j;
            if (c < hd) d += qr[j] * att_load1<KT>(kp, hd, c);
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
            float v = c < hd ? att_load1<KT>(vp, hd, c) : 0.0f;
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

/* 8 consecutive values c .. c+7 (c a multiple of 8) of a kv head of a
 * cache of type KT, head_dim HD: `raw` what one lane loads (the loads of a
 * tile are issued back to back, converted after), `load` from the head's
 * first byte hp (16-byte aligned for F32/F16/BF16 heads, 4-byte for Q8_0
 * at HD 64, 8-byte at 128: the fast paths' caches), `unpack` to the fp32
 * values kern_kv_load_ref gives, `bf16x8` those rounded to bf16 (the
 * prefill tile; BF16: the bits as loaded). A zero raw reads as zeros. */
template <int KT, int HD> struct att_kv;

template <int HD> struct att_kv<KERN_KV_BF16, HD> {
    struct raw {
        uint4 u;
    };
    static __device__ __forceinline__ raw zero() { return {make_uint4(0u, 0u, 0u, 0u)}; }
    static __device__ __forceinline__ raw load(const unsigned char *hp, int c) {
        return {*(const uint4 *)(hp + 2 * c)};
    }
    static __device__ __forceinline__ void unpack(const raw &r, float *f) { att_unpack8(r.u, f); }
    static __device__ __forceinline__ uint4 bf16x8(const raw &r) { return r.u; }
};

template <int HD> struct att_kv<KERN_KV_F16, HD> {
    struct raw {
        uint4 u;
    };
    static __device__ __forceinline__ raw zero() { return {make_uint4(0u, 0u, 0u, 0u)}; }
    static __device__ __forceinline__ raw load(const unsigned char *hp, int c) {
        return {*(const uint4 *)(hp + 2 * c)};
    }
    static __device__ __forceinline__ void unpack(const raw &r, float *f) {
        f[0] = att_h2f((unsigned short)(r.u.x & 0xffffu));
        f[1] = att_h2f((unsigned short)(r.u.x >> 16));
        f[2] = att_h2f((unsigned short)(r.u.y & 0xffffu));
        f[3] = att_h2f((unsigned short)(r.u.y >> 16));
        f[4] = att_h2f((unsigned short)(r.u.z & 0xffffu));
        f[5] = att_h2f((unsigned short)(r.u.z >> 16));
        f[6] = att_h2f((unsigned short)(r.u.w & 0xffffu));
        f[7] = att_h2f((unsigned short)(r.u.w >> 16));
    }
    static __device__ __forceinline__ unsigned cvt2(unsigned w) {
        return att_pack2(att_h2f_cvt((unsigned short)(w & 0xffffu)), att_h2f_cvt((unsigned short)(w >> 16)));
    }
    /* by cvt: att_h2f's registers spill the prefill kernel */
    static __device__ __forceinline__ uint4 bf16x8(const raw &r) {
        return make_uint4(cvt2(r.u.x), cvt2(r.u.y), cvt2(r.u.z), cvt2(r.u.w));
    }
};

template <int HD> struct att_kv<KERN_KV_F32, HD> {
    struct raw {
        uint4 a, b; /* the fp32 bits */
    };
    static __device__ __forceinline__ raw zero() { return {make_uint4(0u, 0u, 0u, 0u), make_uint4(0u, 0u, 0u, 0u)}; }
    static __device__ __forceinline__ raw load(const unsigned char *hp, int c) {
        const uint4 *p = (const uint4 *)(hp + 4 * c);
        return {p[0], p[1]};
    }
    static __device__ __forceinline__ void unpack(const raw &r, float *f) {
        f[0] = __uint_as_float(r.a.x);
        f[1] = __uint_as_float(r.a.y);
        f[2] = __uint_as_float(r.a.z);
        f[3] = __uint_as_float(r.a.w);
        f[4] = __uint_as_float(r.b.x);
        f[5] = __uint_as_float(r.b.y);
        f[6] = __uint_as_float(r.b.z);
        f[7] = __uint_as_float(r.b.w);
    }
    static __device__ __forceinline__ uint4 bf16x8(const raw &r) {
        float f[8];
        unpack(r, f);
        return make_uint4(att_pack2(f[0], f[1]), att_pack2(f[2], f[3]), att_pack2(f[4], f[5]), att_pack2(f[6], f[7]));
    }
};

template <int HD> struct att_kv<KERN_KV_Q8_0, HD> {
    struct raw {
        unsigned q0, q1; /* quants c .. c+3, c+4 .. c+7 */
        unsigned short d; /* their block's fp16 scale */
    };
    static __device__ __forceinline__ raw zero() { return {0u, 0u, (unsigned short)0}; }
    static __device__ __forceinline__ raw load(const unsigned char *hp, int c) {
        const unsigned short d = ((const unsigned short *)(hp + HD))[c / KERN_KV_Q8_BLOCK];
        if constexpr (HD % 128 == 0) { /* 8-byte aligned heads */
            const uint2 q = *(const uint2 *)(hp + c);
            return {q.x, q.y, d};
        } else {
            const unsigned *p = (const unsigned *)(hp + c);
            return {p[0], p[1], d};
        }
    }
    static __device__ __forceinline__ void unpack(const raw &r, float *f) {
        const float d = att_h2f(r.d);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[i] = d * (float)(signed char)(r.q0 >> (8 * i));
            f[4 + i] = d * (float)(signed char)(r.q1 >> (8 * i));
        }
    }
    static __device__ __forceinline__ uint4 bf16x8(const raw &r) {
        float f[8];
        unpack(r, f);
        return make_uint4(att_pack2(f[0], f[1]), att_pack2(f[2], f[3]), att_pack2(f[4], f[5]), att_pack2(f[6], f[7]));
    }
};

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
template <int KT, int HD>
__global__ void __launch_bounds__(ATT_PF_WARPS * 32)
    att_prefill_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ q, const unsigned char *__restrict__ kc,
                       const unsigned char *__restrict__ vc, const int32_t *__restrict__ tiles,
                       const int32_t *__restrict__ tables, int block_size, int hq, int hkv, float scale_log2,
                       float rscale) {
    typedef att_pf_smem<HD> L;
    typedef att_kv<KT, HD> KV;
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
    constexpr size_t HB = (size_t)att_head_bytes<KT>(HD);
    const size_t qdim = (size_t)hq * HD, rb = (size_t)hkv * HB;
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
    if constexpr (KT == KERN_KV_Q8_0) {
        /* rotate each query head as the stored keys are (fp32, kern_kv_rotate's
         * bits), then round to bf16 for the tensor cores: each warp its 16
         * rows, a lane HD/32 values of a row */
        __syncthreads();
        constexpr int E = HD / 32;
        for (int r = warp * 16; r < warp * 16 + 16; r++) {
            bf16 *rp = sK + r * L::LDK + lane * E;
            float x[E];
#pragma unroll
            for (int e = 0; e < E; e++)
                x[e] = __bfloat162float(rp[e]);
            att_rotate<E, 32>(x, lane, rscale);
#pragma unroll
            for (int e = 0; e < E; e += 2)
                *(unsigned *)(rp + e) = att_pack2(x[e], x[e + 1]);
        }
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
        if constexpr (KT == KERN_KV_BF16) { /* the bf16 rows go as they are */
            size_t src[PER];
#pragma unroll
            for (int j = 0; j < PER; j++) {
                const int i = tid + j * THREADS, t = k0 + i / CH;
                src[j] = t <= p_last ? ((size_t)bt[t / block_size] * block_size + (size_t)(t % block_size)) * rb +
                                           (size_t)kvh * HB + (size_t)(i % CH) * 16
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
        } else {
            /* the other types are converted to bf16 on their way to shared
             * memory: the tile is the only widened copy. F32's 32-byte
             * chunks go in 4 passes (in 2, ptxas spills at HD 128). */
            size_t src[PER];
#pragma unroll
            for (int j = 0; j < PER; j++) {
                const int i = tid + j * THREADS, t = k0 + i / CH;
                src[j] = t <= p_last ? ((size_t)bt[t / block_size] * block_size + (size_t)(t % block_size)) * rb +
                                           (size_t)kvh * HB
                                     : ~(size_t)0;
            }
            constexpr int PASS = sizeof(typename KV::raw) > 16 ? 4 : 1, PP = PER / PASS;
            static_assert(PER % PASS == 0, "whole passes");
#pragma unroll
            for (int kv = 0; kv < 2; kv++) {
                const unsigned char *cache = kv ? vc : kc;
                bf16 *tile = kv ? sV : sK;
#pragma unroll
                for (int ps = 0; ps < PASS; ps++) {
                    typename KV::raw buf[PP];
#pragma unroll
                    for (int j = 0; j < PP; j++) {
                        const int jj = ps * PP + j;
                        buf[j] = src[jj] != ~(size_t)0 ? KV::load(cache + src[jj], ((tid + jj * THREADS) % CH) * 8)
                                                       : KV::zero();
                    }
#pragma unroll
                    for (int j = 0; j < PP; j++) {
                        const int i = tid + (ps * PP + j) * THREADS;
                        *(uint4 *)(tile + (i / CH) * L::LDK + (i % CH) * 8) = KV::bf16x8(buf[j]);
                    }
                    /* keeps the next pass's loads after these stores: in
                     * flight together they would need the registers of both */
                    if constexpr (PASS > 1) __syncwarp();
                }
            }
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
template <int KT, int HD, int GT>
__global__ void __launch_bounds__(ATT_DEC_THREADS)
    att_decode_kernel(bf16 *__restrict__ out, float *__restrict__ part_acc, float2 *__restrict__ part_ml,
                      const bf16 *__restrict__ q, const unsigned char *__restrict__ kc,
                      const unsigned char *__restrict__ vc, const int32_t *__restrict__ items,
                      const int32_t *__restrict__ tables, int block_size, int hq, int hkv, float scale_log2,
                      float rscale) {
    typedef att_kv<KT, HD> KV;
    constexpr int LPK = HD / 8;               /* lanes per key: 8 dimensions each */
    constexpr int KG = ATT_DEC_THREADS / LPK; /* key groups per block */
    /* keys in flight per lane group: ATT_DEC_UNROLL of 16 bytes per lane,
     * half as many of F32's 32 */
    constexpr int U = sizeof(typename KV::raw) > 16 ? ATT_DEC_UNROLL / 2 : ATT_DEC_UNROLL;
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
    constexpr size_t HB = (size_t)att_head_bytes<KT>(HD);
    const size_t qdim = (size_t)hq * HD, rb = (size_t)hkv * HB;
    const size_t koff = (size_t)kvh * HB;

    float qf[GT][8], acc[GT][8], m[GT], l[GT];
#pragma unroll
    for (int gh = 0; gh < GT; gh++) {
        att_unpack8(*(const uint4 *)(q + (size_t)row * qdim + (size_t)(h0 + gh) * HD + sub * 8), qf[gh]);
        if constexpr (KT == KERN_KV_Q8_0) att_rotate<8, LPK>(qf[gh], sub, rscale); /* as the keys were */
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
        typename KV::raw kr[U], vr[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int t = base + g + KG * u;
            ok[u] = t < ke;
            kr[u] = vr[u] = KV::zero();
            if (ok[u]) {
                const size_t off = ((size_t)bt[t / block_size] * block_size + (size_t)(t % block_size)) * rb + koff;
                kr[u] = KV::load(kc + off, sub * 8);
                vr[u] = KV::load(vc + off, sub * 8);
            }
        }
        float s[U][GT], vf[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float kf[8];
            KV::unpack(kr[u], kf);
            KV::unpack(vr[u], vf[u]);
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
template <int KT, int HD> static int att_prefill_smem(kern_backend *be, unsigned bit) {
    cuda_impl *impl = cuda_get(be);
    constexpr size_t bytes = att_pf_smem<HD>::BYTES;
    if constexpr (bytes > 48 * 1024) {
        if (!(impl->att_smem_set & bit)) {
            CUDA_TRY(be, cudaFuncSetAttribute(att_prefill_kernel<KT, HD>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
            impl->att_smem_set |= bit;
        }
    }
    return 0;
}

template <int KT, int HD>
static int att_launch(kern_backend *be, bf16 *out, const bf16 *q, const unsigned char *kc, const unsigned char *vc,
                      const int32_t *dtab, const int32_t *dtiles, int ntiles, const int32_t *ditems, int nitems,
                      const int32_t *dcomb, int ncomb, float *part, int nparts, int bs, int hq, int hkv, int gt,
                      float scale_log2) {
    if (cuda_replaying(be)) return 0;
    cudaStream_t st = cuda_get(be)->stream;
    const float rs = kern_kv_rotate_scale(HD); /* Q8_0's query rotation */
    if (ntiles > 0) {
        /* a bit per (type, head_dim) instance */
        if (att_prefill_smem<KT, HD>(be, 1u << (2 * (KT - KERN_KV_F32) + (HD == 64 ? 0 : 1)))) return -1;
        dim3 grid((unsigned)ntiles, (unsigned)hq);
        att_prefill_kernel<KT, HD><<<grid, ATT_PF_WARPS * 32, att_pf_smem<HD>::BYTES, st>>>(
            out, q, kc, vc, dtiles, dtab, bs, hq, hkv, scale_log2, rs);
        CUDA_LAUNCH_TRY(be, "att_prefill_kernel");
    }
    float *pacc = part;
    float2 *pml = part ? (float2 *)(part + (size_t)nparts * hq * HD) : NULL;
    if (nitems > 0) {
        dim3 grid((unsigned)nitems, (unsigned)(hq / gt));
        const unsigned th = ATT_DEC_THREADS;
        if (gt == 8)
            att_decode_kernel<KT, HD, 8>
                <<<grid, th, 0, st>>>(out, pacc, pml, q, kc, vc, ditems, dtab, bs, hq, hkv, scale_log2, rs);
        else if (gt == 4)
            att_decode_kernel<KT, HD, 4>
                <<<grid, th, 0, st>>>(out, pacc, pml, q, kc, vc, ditems, dtab, bs, hq, hkv, scale_log2, rs);
        else if (gt == 2)
            att_decode_kernel<KT, HD, 2>
                <<<grid, th, 0, st>>>(out, pacc, pml, q, kc, vc, ditems, dtab, bs, hq, hkv, scale_log2, rs);
        else
            att_decode_kernel<KT, HD, 1>
                <<<grid, th, 0, st>>>(out, pacc, pml, q, kc, vc, ditems, dtab, bs, hq, hkv, scale_log2, rs);
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
                    const kern_attn_batch *b, int hq, int hkv, int hd, float scale, int64_t nt, kern_kv_dtype dt) {
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
    const bf16 *qq = (const bf16 *)q;
    const unsigned char *k = (const unsigned char *)kc, *v = (const unsigned char *)vc;
    const float sl = scale * ATT_LOG2E;
#define ATT_LAUNCH(KT, HD)                                                                                             \
    att_launch<KT, HD>(be, o, qq, k, v, dtab, dtiles, (int)ntiles, ditems, (int)nitems, dcomb, (int)ncomb, part,       \
                       (int)nparts, bs, hq, hkv, gt, sl)
    switch (dt) {
    case KERN_KV_F32: return hd == 64 ? ATT_LAUNCH(KERN_KV_F32, 64) : ATT_LAUNCH(KERN_KV_F32, 128);
    case KERN_KV_F16: return hd == 64 ? ATT_LAUNCH(KERN_KV_F16, 64) : ATT_LAUNCH(KERN_KV_F16, 128);
    case KERN_KV_Q8_0: return hd == 64 ? ATT_LAUNCH(KERN_KV_Q8_0, 64) : ATT_LAUNCH(KERN_KV_Q8_0, 128);
    default: return hd == 64 ? ATT_LAUNCH(KERN_KV_BF16, 64) : ATT_LAUNCH(KERN_KV_BF16, 128);
    }
#undef ATT_LAUNCH
}

/* The simple kernel for dims per lane dpl (Q8_0: hd a power of two, so
 * dpl = hd / 32 exactly, its rotation's layout). */
template <int KT>
static void att_simple(dim3 grid, cudaStream_t st, int dpl, bf16 *o, const bf16 *q, const unsigned char *k,
                       const unsigned char *v, const int32_t *dinfo, const int32_t *dtab, int bs, int hq, int hkv,
                       int hd, float scale, float rs) {
    const int threads = ATT_WARPS * 32;
    if (dpl <= 1)
        cuda_attention_kernel<KT, 1><<<grid, threads, 0, st>>>(o, q, k, v, dinfo, dtab, bs, hq, hkv, hd, scale, rs);
    else if (dpl <= 2)
        cuda_attention_kernel<KT, 2><<<grid, threads, 0, st>>>(o, q, k, v, dinfo, dtab, bs, hq, hkv, hd, scale, rs);
    else if (dpl <= 4)
        cuda_attention_kernel<KT, 4><<<grid, threads, 0, st>>>(o, q, k, v, dinfo, dtab, bs, hq, hkv, hd, scale, rs);
    else
        cuda_attention_kernel<KT, 8><<<grid, threads, 0, st>>>(o, q, k, v, dinfo, dtab, bs, hq, hkv, hd, scale, rs);
}

/* ---- the op ---- */

int cuda_attention(kern_backend *be, void *out, const void *q, const void *kc, const void *vc, const kern_attn_batch *b,
                   int hq, int hkv, int hd, float scale, kern_kv_dtype dt) {
    if (hkv <= 0 || hq % hkv) return kern_fail(be, "attention: %d query heads not a multiple of %d kv heads", hq, hkv);
    if (b->block_size <= 0 || b->max_blocks <= 0) return kern_fail(be, "attention: bad paging geometry");
    if (hd <= 0 || hd > ATT_MAX_HD) return kern_fail(be, "attention: head_dim %d out of range [1, %d]", hd, ATT_MAX_HD);
    if (hq > 65535) return kern_fail(be, "attention: %d query heads (at most 65535)", hq);
    const char *why = cuda_kv_invalid(dt, hd);
    if (why) return kern_fail(be, "attention: KV cache dtype %s, head_dim %d: %s", kern_kv_dtype_name(dt), hd, why);
    if (((uintptr_t)kc | (uintptr_t)vc) % (dt == KERN_KV_F32 ? 4 : 2))
        return kern_fail(be, "attention: %s cache not aligned to its values", kern_kv_dtype_name(dt));
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
    if ((hd == 64 || hd == 128) && al % 16 == 0) return att_fast(be, out, q, kc, vc, b, hq, hkv, hd, scale, nt, dt);

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
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q;
    const unsigned char *k = (const unsigned char *)kc, *v = (const unsigned char *)vc;
    const int dpl = (hd + 31) / 32;
    const float rs = dt == KERN_KV_Q8_0 ? kern_kv_rotate_scale(hd) : 1.0f;
    switch (dt) {
    case KERN_KV_F32:
        att_simple<KERN_KV_F32>(grid, st, dpl, o, qq, k, v, dinfo, dtab, bs, hq, hkv, hd, scale, rs);
        break;
    case KERN_KV_F16:
        att_simple<KERN_KV_F16>(grid, st, dpl, o, qq, k, v, dinfo, dtab, bs, hq, hkv, hd, scale, rs);
        break;
    case KERN_KV_Q8_0:
        att_simple<KERN_KV_Q8_0>(grid, st, dpl, o, qq, k, v, dinfo, dtab, bs, hq, hkv, hd, scale, rs);
        break;
    default: att_simple<KERN_KV_BF16>(grid, st, dpl, o, qq, k, v, dinfo, dtab, bs, hq, hkv, hd, scale, rs); break;
    }
    CUDA_LAUNCH_TRY(be, "cuda_attention_kernel");
    return 0;
}
