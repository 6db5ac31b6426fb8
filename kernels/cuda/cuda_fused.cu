/*
 * cuda: fused ops — the launches the GPU path saves per layer.
 *
 * Contract (twin of kernels/cpu/fused.c; see kernels/kernels.h):
 *   - add_rmsnorm: x += y (rows, dim), each sum in fp32 rounded to bf16 and
 *     written back to x — bit for bit what add() writes — then
 *     out = w * (x * inv), inv = 1 / sqrt(mean(x^2) + eps), from those
 *     rounded values, so it equals add() then rmsnorm() (up to the fp32
 *     order of the sum of squares, which both reduce across a block). One
 *     block per row. Rows move as 16-byte vectors (8 bf16) when x, y, out
 *     and w are 16-byte aligned and dim % 8 == 0 (then every row is too);
 *     otherwise element by element. out must not alias x or y (rejected when
 *     equal): out is written while the block still reads x.
 *   - qk_norm_rope: each head (hd values) of q (n, hq*hd) and k (n, hkv*hd)
 *     is RMS-normalised with qw / kw (1, hd) in fp32 — the same expression
 *     as rmsnorm(), inv formed in double from the fp32 sum — and rotated at
 *     the HOST position pos[t] like rope(): inv_freq from the shared table
 *     (cuda_rope_table, kern_rope_inv_freq like the cpu twin), angle
 *     (float)pos * inv_freq[i] in fp32, the precise sincosf. The normalised
 *     value stays fp32 into the rotation (one bf16 rounding fewer than
 *     rmsnorm() then rope()). One launch for q's and k's heads: a block per
 *     (token, group of QKNR_WARPS heads) builds the token's cos/sin table in
 *     shared memory once, then one warp per head normalises and rotates.
 */
#include <stdint.h>

#include "kernels/cuda/cuda.h"

#define QKNR_WARPS 4

/* A 32-bit word holds two bf16: the lower address in the low half. */
static __device__ __forceinline__ float bf16_lo(uint32_t u) {
    return __uint_as_float(u << 16);
}
static __device__ __forceinline__ float bf16_hi(uint32_t u) {
    return __uint_as_float(u & 0xffff0000u);
}
static __device__ __forceinline__ uint32_t bf16_pack(bf16 lo, bf16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}

/* One word of x + y, each sum rounded to bf16 as add() rounds it; the
 * squares of the rounded values go into *ss. */
static __device__ __forceinline__ uint32_t add_word(uint32_t xw, uint32_t yw, float *ss) {
    bf16 lo = __float2bfloat16_rn(bf16_lo(xw) + bf16_lo(yw));
    bf16 hi = __float2bfloat16_rn(bf16_hi(xw) + bf16_hi(yw));
    float l = __bfloat162float(lo), h = __bfloat162float(hi);
    *ss += l * l;
    *ss += h * h;
    return bf16_pack(lo, hi);
}

/* One word of w * (x * inv), rmsnorm()'s expression. */
static __device__ __forceinline__ uint32_t norm_word(uint32_t xw, uint32_t ww, float inv) {
    return bf16_pack(__float2bfloat16_rn(bf16_lo(ww) * (bf16_lo(xw) * inv)),
                     __float2bfloat16_rn(bf16_hi(ww) * (bf16_hi(xw) * inv)));
}

/* 16-byte path: dim % 8 == 0 and all four pointers 16-byte aligned. A
 * thread rereads in the second pass the vectors it wrote in the first (x is
 * not read through the non-coherent cache, so its own writes are seen). */
__global__ void __launch_bounds__(CUDA_THREADS)
    cuda_add_rmsnorm_vec_kernel(bf16 *x, const bf16 *y, bf16 *out, const bf16 *w, int dim, float eps) {
    const int nvec = dim / 8;
    uint4 *xv = reinterpret_cast<uint4 *>(x + (size_t)blockIdx.x * dim);
    const uint4 *yv = reinterpret_cast<const uint4 *>(y + (size_t)blockIdx.x * dim);
    uint4 *ov = reinterpret_cast<uint4 *>(out + (size_t)blockIdx.x * dim);
    const uint4 *wv = reinterpret_cast<const uint4 *>(w);
    float ss = 0.0f;
    for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
        uint4 a = xv[c], b = yv[c], s;
        s.x = add_word(a.x, b.x, &ss);
        s.y = add_word(a.y, b.y, &ss);
        s.z = add_word(a.z, b.z, &ss);
        s.w = add_word(a.w, b.w, &ss);
        xv[c] = s;
    }
    float total = cuda_block_sum(ss);
    float inv = (float)(1.0 / sqrt((double)total / dim + (double)eps));
    for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
        uint4 a = xv[c], g = wv[c], o;
        o.x = norm_word(a.x, g.x, inv);
        o.y = norm_word(a.y, g.y, inv);
        o.z = norm_word(a.z, g.z, inv);
        o.w = norm_word(a.w, g.w, inv);
        ov[c] = o;
    }
}

/* Element path for any dim and alignment. */
__global__ void __launch_bounds__(CUDA_THREADS)
    cuda_add_rmsnorm_kernel(bf16 *x, const bf16 *y, bf16 *out, const bf16 *w, int dim, float eps) {
    bf16 *xr = x + (size_t)blockIdx.x * dim;
    const bf16 *yr = y + (size_t)blockIdx.x * dim;
    bf16 *o = out + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        bf16 s = __float2bfloat16_rn(__bfloat162float(xr[c]) + __bfloat162float(yr[c]));
        xr[c] = s;
        float v = __bfloat162float(s);
        ss += v * v;
    }
    float total = cuda_block_sum(ss);
    float inv = (float)(1.0 / sqrt((double)total / dim + (double)eps));
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        o[c] = __float2bfloat16_rn(__bfloat162float(w[c]) * (__bfloat162float(xr[c]) * inv));
}

int cuda_add_rmsnorm(kern_backend *be, void *x, const void *y, void *out, const kern_weight *w, int rows, int dim,
                     float eps) {
    if (rows < 0 || dim <= 0) return kern_fail(be, "add_rmsnorm: bad shape (%d, %d)", rows, dim);
    if (cuda_check_weight(be, "add_rmsnorm", w)) return -1;
    if (w->rows != 1 || w->cols != dim)
        return kern_fail(be, "add_rmsnorm: weight is (%lld, %lld), expected (1, %d)", (long long)w->rows,
                         (long long)w->cols, dim);
    if (out == x || out == y) return kern_fail(be, "add_rmsnorm: out must not alias x or y");
    if (rows == 0) return 0;
    if (cuda_enter(be)) return -1;
    if (cuda_replaying(be)) return 0;
    cudaStream_t st = cuda_get(be)->stream;
    uintptr_t addr = (uintptr_t)x | (uintptr_t)y | (uintptr_t)out | (uintptr_t)w->data;
    if (dim % 8 == 0 && addr % 16 == 0) {
        int nvec = dim / 8;
        /* whole warps only (the reductions shuffle with a full mask) */
        int threads = nvec >= CUDA_THREADS ? CUDA_THREADS : ((nvec + 31) / 32) * 32;
        cuda_add_rmsnorm_vec_kernel<<<rows, threads, 0, st>>>((bf16 *)x, (const bf16 *)y, (bf16 *)out,
                                                              (const bf16 *)w->data, dim, eps);
        CUDA_LAUNCH_TRY(be, "cuda_add_rmsnorm_vec_kernel");
    } else {
        int threads = dim >= CUDA_THREADS ? CUDA_THREADS : ((dim + 31) / 32) * 32;
        cuda_add_rmsnorm_kernel<<<rows, threads, 0, st>>>((bf16 *)x, (const bf16 *)y, (bf16 *)out,
                                                          (const bf16 *)w->data, dim, eps);
        CUDA_LAUNCH_TRY(be, "cuda_add_rmsnorm_kernel");
    }
    return 0;
}

/* Grid (n, ceil((hq + hkv) / QKNR_WARPS)), QKNR_WARPS warps per block,
 * hd floats of dynamic shared memory. Heads h < hq are q's, the rest k's.
 * Within a warp, the sum pass reads every element of the head and the
 * rotation pass writes each element from exactly one lane (pair i, i+half
 * belongs to lane i % 32); the full-mask shuffles of the reduction order
 * every read of the first pass before any write of the second. */
__global__ void __launch_bounds__(32 * QKNR_WARPS)
    cuda_qk_norm_rope_kernel(bf16 *q, bf16 *k, const bf16 *qw, const bf16 *kw, const int32_t *pos,
                             const float *inv_freq, int hq, int hkv, int hd, float eps, float scale) {
    extern __shared__ float cs[]; /* cos at [0, half), sin at [half, hd) */
    const int t = blockIdx.x, half = hd / 2;
    const float p = (float)pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(p * inv_freq[i], &s, &c);
        cs[i] = c * scale; /* kern_rope_scale: YaRN's attention factor, else 1 */
        cs[half + i] = s * scale;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, h = blockIdx.y * QKNR_WARPS + (threadIdx.x >> 5);
    if (h >= hq + hkv) return; /* a whole warp, after the block's only barrier */
    bf16 *v;
    const bf16 *w;
    if (h < hq) {
        v = q + ((size_t)t * hq + h) * hd;
        w = qw;
    } else {
        v = k + ((size_t)t * hkv + (h - hq)) * hd;
        w = kw;
    }
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) {
        float a = __bfloat162float(v[i]);
        ss += a * a;
    }
    for (int off = 16; off > 0; off >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    float inv = (float)(1.0 / sqrt((double)ss / hd + (double)eps));
    for (int i = lane; i < half; i += 32) {
        float a = __bfloat162float(w[i]) * (__bfloat162float(v[i]) * inv);
        float b = __bfloat162float(w[i + half]) * (__bfloat162float(v[i + half]) * inv);
        float c = cs[i], s = cs[half + i];
        v[i] = __float2bfloat16_rn(a * c - b * s);
        v[i + half] = __float2bfloat16_rn(b * c + a * s);
    }
}

int cuda_qk_norm_rope(kern_backend *be, void *q, void *k, const kern_weight *qw, const kern_weight *kw,
                      const int32_t *pos, int n, int hq, int hkv, int hd, float eps, const kern_rope *rope) {
    if (hd <= 0 || hd % 2) return kern_fail(be, "qk_norm_rope: head_dim %d is odd or not positive", hd);
    if (hd > 2048) return kern_fail(be, "qk_norm_rope: head_dim %d out of range [2, 2048]", hd);
    if (n < 0 || hq < 0 || hkv < 0) return kern_fail(be, "qk_norm_rope: bad shape n=%d hq=%d hkv=%d", n, hq, hkv);
    /* grid.y counts groups of heads and is limited to 65535 */
    if ((long long)hq + hkv > 65535LL * QKNR_WARPS)
        return kern_fail(be, "qk_norm_rope: %d + %d heads exceed one launch", hq, hkv);
    if (cuda_check_weight(be, "qk_norm_rope", qw) || cuda_check_weight(be, "qk_norm_rope", kw)) return -1;
    if (qw->rows != 1 || qw->cols != hd)
        return kern_fail(be, "qk_norm_rope: q_norm weight is (%lld, %lld), expected (1, %d)", (long long)qw->rows,
                         (long long)qw->cols, hd);
    if (kw->rows != 1 || kw->cols != hd)
        return kern_fail(be, "qk_norm_rope: k_norm weight is (%lld, %lld), expected (1, %d)", (long long)kw->rows,
                         (long long)kw->cols, hd);
    if (n == 0 || hq + hkv == 0) return 0;
    if (cuda_enter(be)) return -1;
    const float *table = NULL;
    const int32_t *dpos = NULL;
    if (cuda_rope_table(be, "qk_norm_rope", rope, hd, &table) || cuda_stage_i32(be, pos, n, &dpos)) return -1;
    if (cuda_replaying(be)) return 0;
    dim3 grid((unsigned)n, (unsigned)((hq + hkv + QKNR_WARPS - 1) / QKNR_WARPS));
    cuda_qk_norm_rope_kernel<<<grid, 32 * QKNR_WARPS, (size_t)hd * sizeof(float), cuda_get(be)->stream>>>(
        (bf16 *)q, (bf16 *)k, (const bf16 *)qw->data, (const bf16 *)kw->data, dpos, table, hq, hkv, hd, eps,
        kern_rope_scale(rope));
    CUDA_LAUNCH_TRY(be, "cuda_qk_norm_rope_kernel");
    return 0;
}
