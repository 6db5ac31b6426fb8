/*
 * comm/codec/echo_cuda.cu — the cuda twin of codec.c's host compute: phase 1,
 * phase 2 and finish as kernels on device memory, plus the helpers of the
 * exact paths of the nccl transport and of the local transport on device
 * memory. Same steps, same order, same inline arithmetic
 * (comm/codec/echo_codec.h), so a rank on the GPU produces the bits a rank on the
 * host would.
 *
 * Mapping of the codec kernels (bandwidth-bound: a few flops per byte):
 *   - Phase 1 and phase 2: a lane owns a chunk of 8 consecutive values (one
 *     16-byte load of bf16, two of fp32; residuals two 16-byte loads and
 *     stores; its 4 code bytes one 32-bit access). A group of G values is
 *     G/8 consecutive, aligned lanes of one warp (2 lanes at G = 16, the
 *     whole warp at G = 256), which reduce its absmax with G/8-wide xor
 *     shuffles: no shared memory, no block barrier.
 *   - Finish has no reduction: a thread owns 16 values (one 8-byte load of
 *     codes, 16-byte stores), always inside one group since 16 divides G.
 *   - Grids: blockIdx.y is the shard (a shard is L values, a multiple of G,
 *     so chunks never straddle shards or groups and no 64-bit division by L
 *     is needed); blockIdx.x a grid-stride loop over the shard's chunks.
 *     The grid holds as many blocks as the device keeps resident (SM count
 *     times the kernel's occupancy, queried once per comm), so one wave
 *     fills the GPU.
 *   - Vector accesses need aligned pointers and whole chunks; a lane whose
 *     pointer is misaligned (a caller's buf at an odd offset, an all-gather
 *     message at an odd multiple of 2 bytes) or whose chunk holds the ragged
 *     end of a shard falls back to scalar accesses of the same values. The
 *     per-value arithmetic is the same either way, and values past the end
 *     of the data are zeros that take part in the group's absmax and codes
 *     exactly as the host's zero padding does.
 *
 * Non-finite input travels in-band as a poisoned scale (echo_codec.h);
 * finish records the first element of a poisoned group with atomicMin and
 * reads it back with one stream synchronisation per call (the host needs
 * the answer to return an error).
 *
 * No file-scope device state: the per-rank flag and the grid sizes live in
 * compute_state.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* nvcc is not given -DECHO_HAVE_CUDA (only the C files are). */
#ifndef ECHO_HAVE_CUDA
#define ECHO_HAVE_CUDA 1
#endif
extern "C" {
#include "comm/echo_internal.h"
}
#include "comm/codec/echo_codec.h"

#define ECHO_THREADS 256
#define ECHO_NO_BAD 0xffffffffffffffffull

/* Values per lane: phase 1 and 2 (a power of two >= 8 so that a chunk is a
 * whole number of 16-byte bf16 loads, and <= 16 = ECHO_MIN_GROUP so that a
 * group spans at least one lane), finish (16: a chunk stays in one group). */
#define ECHO_CODE_V 8
#define ECHO_CODE_LGV 3
#define ECHO_FINISH_V 16

typedef struct wire_ptrs {
    uint8_t *p[ECHO_MAX_RANKS];
} wire_ptrs;

typedef struct wire_cptrs {
    const uint8_t *p[ECHO_MAX_RANKS];
} wire_cptrs;

/* The codec kernels, for the resident-block table below. */
enum { K_PHASE1, K_PHASE2, K_FINISH, K_COUNT };

typedef struct cuda_state {
    unsigned long long *d_bad; /* device: first bad element, ECHO_NO_BAD if none */
    unsigned long long *h_bad; /* pinned host mirror */
    /* Deferred worlds: one flag per site, cleared at the first call of a
     * pass (pass_arm) and read once at its end (pass_read). */
    unsigned long long *d_site_bad, *h_site_bad;
    int n_site_flags;
    /* Blocks of ECHO_THREADS threads of each codec kernel (by dtype: 0 f32,
     * 1 bf16) that the whole device holds at once: SM count times the
     * kernel's occupancy. A grid of this size fills the GPU in one wave; more
     * blocks would run as a partial second wave, too few to saturate HBM. */
    unsigned resident[K_COUNT][2];
    /* Rotating codecs (echo_plan.rotate): the call's values rotated (phase
     * 1, read again by phase 2), then the decoded sum (finish); one padded
     * message of fp32, like the host compute's c->rot. */
    float *d_rot;
} cuda_state;

/* ---- error checks: record "cuda: FILE:LINE: CALL: NAME (message)" ---- */

/* (ECHO_CUDA_TRY is in echo_internal.h: the C files of comm/ use it too)
 * The error is reported here, so it is cleared as the thread's last error:
 * the next launch check (cudaGetLastError) would report it as its own. */
extern "C" int echo_cuda_fail(char *err, size_t errlen, const char *file, int line, const char *call, int e) {
    cudaError_t ce = (cudaError_t)e;
    cudaGetLastError();
    snprintf(err, errlen, "cuda: %s:%d: %s: %s (%s)", file, line, call, cudaGetErrorName(ce), cudaGetErrorString(ce));
    return -1;
}

/* ---- device helpers ---- */

__device__ static inline float ld(const float *x, size_t i) {
    return x[i];
}
__device__ static inline float ld(const uint16_t *x, size_t i) {
    return echo_bf16_to_f32(x[i]);
}
__device__ static inline void st(float *x, size_t i, float v) {
    x[i] = v;
}
__device__ static inline void st(uint16_t *x, size_t i, float v) {
    x[i] = echo_f32_to_bf16(v);
}

__device__ static inline uint32_t umax32(uint32_t a, uint32_t b) {
    return a > b ? a : b;
}

/* The alignment of p in bytes (its lowest set address bit), capped at cap. */
__device__ static inline int align_of(const void *p, int cap) {
    uintptr_t a = (uintptr_t)p & (uintptr_t)(cap - 1);
    return a ? (int)(a & (~a + 1)) : cap;
}

/* Values in a chunk: v[0..V) = p[0..m) as fp32, zeros past m. `vec`: p is
 * 16-byte aligned (the caller checks the base pointer of the shard; a chunk
 * is a multiple of 16 bytes, so every chunk keeps it) and the chunk is
 * whole, so 16-byte loads; else one scalar load per value. */
template <int V> __device__ static inline void load_vals(const float *p, bool vec, int m, float *v) {
    if (vec && m == V) {
#pragma unroll
        for (int t = 0; t < V; t += 4) {
            float4 f = *reinterpret_cast<const float4 *>(p + t);
            v[t] = f.x;
            v[t + 1] = f.y;
            v[t + 2] = f.z;
            v[t + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int t = 0; t < V; t++)
            v[t] = t < m ? p[t] : 0.0f;
    }
}

/* bf16: element 2k is the low half of 32-bit word k (little-endian). */
template <int V> __device__ static inline void load_vals(const uint16_t *p, bool vec, int m, float *v) {
    if (vec && m == V) {
#pragma unroll
        for (int t = 0; t < V; t += 8) {
            uint4 u = *reinterpret_cast<const uint4 *>(p + t);
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[t + 2 * k] = echo_bf16_to_f32((uint16_t)(w[k] & 0xffffu));
                v[t + 2 * k + 1] = echo_bf16_to_f32((uint16_t)(w[k] >> 16));
            }
        }
    } else {
#pragma unroll
        for (int t = 0; t < V; t++)
            v[t] = t < m ? echo_bf16_to_f32(p[t]) : 0.0f;
    }
}

/* p[0..m) = v[0..m) (rounded to bf16 for uint16_t); `vec` as in load_vals. */
template <int V> __device__ static inline void store_vals(float *p, bool vec, int m, const float *v) {
    if (vec && m == V) {
#pragma unroll
        for (int t = 0; t < V; t += 4)
            *reinterpret_cast<float4 *>(p + t) = make_float4(v[t], v[t + 1], v[t + 2], v[t + 3]);
    } else {
#pragma unroll
        for (int t = 0; t < V; t++)
            if (t < m) p[t] = v[t];
    }
}

template <int V> __device__ static inline void store_vals(uint16_t *p, bool vec, int m, const float *v) {
    if (vec && m == V) {
#pragma unroll
        for (int t = 0; t < V; t += 8) {
            uint32_t w[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                w[k] = (uint32_t)echo_f32_to_bf16(v[t + 2 * k]) | ((uint32_t)echo_f32_to_bf16(v[t + 2 * k + 1]) << 16);
            *reinterpret_cast<uint4 *>(p + t) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    } else {
#pragma unroll
        for (int t = 0; t < V; t++)
            if (t < m) p[t] = echo_f32_to_bf16(v[t]);
    }
}

/* The code bytes of a chunk as NW little-endian 32-bit words (byte b of the
 * chunk is bits 8(b%4).. of word b/4). `al` is the alignment of p, at most
 * 4 * NW (what every chunk of the message keeps): a message placed at an
 * odd multiple of 2 bytes (an all-gather of messages of an odd number of
 * scales) is read in 16-bit halves. */
template <int NW> __device__ static inline void load_words(const uint8_t *p, int al, uint32_t *w) {
    if (NW == 2 && al >= 8) {
        uint2 u = *reinterpret_cast<const uint2 *>(p);
        w[0] = u.x;
        w[NW - 1] = u.y;
    } else if (al >= 4) {
#pragma unroll
        for (int k = 0; k < NW; k++)
            w[k] = reinterpret_cast<const uint32_t *>(p)[k];
    } else if (al >= 2) {
        const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
#pragma unroll
        for (int k = 0; k < NW; k++)
            w[k] = (uint32_t)h[2 * k] | ((uint32_t)h[2 * k + 1] << 16);
    } else {
#pragma unroll
        for (int k = 0; k < NW; k++)
            w[k] = (uint32_t)p[4 * k] | ((uint32_t)p[4 * k + 1] << 8) | ((uint32_t)p[4 * k + 2] << 16) |
                   ((uint32_t)p[4 * k + 3] << 24);
    }
}

template <int NW> __device__ static inline void store_words(uint8_t *p, int al, const uint32_t *w) {
    if (NW == 2 && al >= 8) {
        *reinterpret_cast<uint2 *>(p) = make_uint2(w[0], w[NW - 1]);
    } else if (al >= 4) {
#pragma unroll
        for (int k = 0; k < NW; k++)
            reinterpret_cast<uint32_t *>(p)[k] = w[k];
    } else if (al >= 2) {
        uint16_t *h = reinterpret_cast<uint16_t *>(p);
#pragma unroll
        for (int k = 0; k < NW; k++) {
            h[2 * k] = (uint16_t)(w[k] & 0xffffu);
            h[2 * k + 1] = (uint16_t)(w[k] >> 16);
        }
    } else {
#pragma unroll
        for (int k = 0; k < NW; k++)
#pragma unroll
            for (int b = 0; b < 4; b++)
                p[4 * k + b] = (uint8_t)(w[k] >> (8 * b));
    }
}

/* The signed code of value t of a chunk whose code words are w. */
__device__ static inline int code_at(const uint32_t *w, int t) {
    uint8_t b = (uint8_t)(w[t / 8] >> (8 * ((t / 2) % 4)));
    return (t & 1) ? echo_nib_hi(b) : echo_nib_lo(b);
}

/* Largest a over the P lanes that share this lane's group: P is a power of
 * two <= 32 and the group's lanes are the aligned run of P lanes of the warp
 * holding this one. Only those lanes take part (the mask), and they all call
 * this together: a group is all in or all out of each loop iteration. */
__device__ static inline uint32_t group_max(uint32_t a, int P) {
    unsigned lane = threadIdx.x & 31u;
    unsigned mask = P >= 32 ? 0xffffffffu : ((1u << P) - 1u) << (lane & ~(unsigned)(P - 1));
    for (int o = P / 2; o > 0; o >>= 1)
        a = umax32(a, __shfl_xor_sync(mask, a, o));
    return a;
}

/* Code the chunk y[0..V) of a group of scale bits sb: code words cw (V/8),
 * residuals r = y - output as the host computes them (output q*s, rounded
 * to bf16 when the call's activations are bf16: phase 2's g accounts for
 * the output rounding); an all-zero group keeps y, a poisoned one 0. */
template <int V>
__device__ static inline void encode_vals(const float *y, uint16_t sb, bool bf16_out, uint32_t *cw, float *r) {
    float s = echo_bf16_to_f32(sb);
    bool ok = sb != 0 && !echo_scale_is_poison(sb);
#pragma unroll
    for (int k = 0; k < V / 8; k++)
        cw[k] = 0;
#pragma unroll
    for (int t = 0; t < V; t += 2) {
        float q0 = 0, q1 = 0;
        if (ok) {
            q0 = echo_code(y[t], s);
            q1 = echo_code(y[t + 1], s);
        }
        /* byte t/2 of the chunk: word t/8, bits 8 * ((t/2) % 4) = 4 * (t % 8) */
        cw[t / 8] |= (uint32_t)echo_pack2((int)q0, (int)q1) << (4 * (t % 8));
        float o0 = q0 * s, o1 = q1 * s;
        if (bf16_out) {
            o0 = echo_bf16_to_f32(echo_f32_to_bf16(o0));
            o1 = echo_bf16_to_f32(echo_f32_to_bf16(o1));
        }
        r[t] = ok ? y[t] - o0 : (sb == 0 ? y[t] : 0.0f);
        r[t + 1] = ok ? y[t + 1] - o1 : (sb == 0 ? y[t + 1] : 0.0f);
    }
}

/* Code the chunk y[0..V) at value i of a message (k = i / V) as phase 1 and
 * phase 2 both do: the group's scale from the absmax over its P lanes,
 * the code words into w (alignment wal), the scale by the group's first
 * lane; r as encode_vals. Every lane of the group calls it together. */
template <int V>
__device__ static inline void code_chunk(const float *y, int P, int lg, bool bf16_out, size_t i, size_t k, uint8_t *w,
                                         int wal, uint16_t *scales, float *r) {
    uint32_t a = 0;
#pragma unroll
    for (int t = 0; t < V; t++)
        a = umax32(a, echo_abs_bits(y[t]));
    uint16_t sb = echo_scale_from_absbits(group_max(a, P));
    uint32_t cw[V / 8];
    encode_vals<V>(y, sb, bf16_out, cw, r);
    store_words<V / 8>(w + i / 2, wal, cw);
    if ((k & (size_t)(P - 1)) == 0) scales[i >> lg] = sb;
}

/* Values of a chunk that lie in the data: min(n - i, V), 0 past the end. */
template <int V> __device__ static inline int chunk_len(size_t n, size_t i) {
    return i >= n ? 0 : n - i < (size_t)V ? (int)(n - i) : V;
}

/* ---- kernels ---- */

/* Phase 1: blockIdx.y enumerates the shards this rank codes (those holding
 * data, 0..ceil(count/L)-1, without its own); blockIdx.x strides over the
 * chunks of the shard's groups that hold data (groups past the end of the
 * message are never coded, as on the host). */
template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS)
    echo_phase1_kernel(const T *x, float *res, int res_valid, size_t count, size_t L, int lg, int own, wire_ptrs send) {
    const int V = ECHO_CODE_V, P = 1 << (lg - ECHO_CODE_LGV);
    int c = (int)blockIdx.y;
    c += c >= own;
    size_t start = (size_t)c * L, n = count - start < L ? count - start : L;
    size_t K = ((n + ((size_t)1 << lg) - 1) >> lg) << (lg - ECHO_CODE_LGV);
    const T *xs = x + start;
    float *rs = res ? res + start : NULL;
    const float *rin = res_valid ? rs : NULL;
    uint8_t *w = send.p[c];
    uint16_t *scales = reinterpret_cast<uint16_t *>(w + L / 2);
    bool xv = align_of(xs, 16) == 16, rv = align_of(rs, 16) == 16;
    int wal = align_of(w, 4);
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < K; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = k * V;
        int m = chunk_len<V>(n, i);
        float y[V], r[V];
        load_vals<V>(xs + i, xv, m, y);
        if (rin) {
            load_vals<V>(rin + i, rv, m, r);
#pragma unroll
            for (int t = 0; t < V; t++)
                if (t < m) y[t] = y[t] + r[t];
        }
        code_chunk<V>(y, P, lg, false, i, k, w, wal, scales, r);
        if (rs) store_vals<V>(rs + i, rv, m, r);
    }
}

/* Phase 2 on the owner's shard (xs: its len raw values; the peers' messages
 * in recv). Per value, S = sum over j = 0..N-1 in that order of (j == own ?
 * x : decoded peer j), the host's order; the peers' code words and scales
 * are loaded four ranks at a time ahead of their adds, so that the loads
 * overlap. The output message is coded like phase 1; g (len values) is
 * the carried residual, read when g_valid and rewritten when not NULL. */
template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS)
    echo_phase2_kernel(const T *xs, wire_cptrs recv, float *g, int g_valid, size_t len, size_t L, int lg, int N,
                       int own, uint8_t *out) {
    const int V = ECHO_CODE_V, P = 1 << (lg - ECHO_CODE_LGV), U = 4;
    const bool bf16_out = sizeof(T) == 2;
    size_t K = ((len + ((size_t)1 << lg) - 1) >> lg) << (lg - ECHO_CODE_LGV);
    const float *gin = g_valid ? g : NULL;
    uint16_t *scales = reinterpret_cast<uint16_t *>(out + L / 2);
    bool xv = align_of(xs, 16) == 16, gv = align_of(g, 16) == 16;
    int oal = align_of(out, 4);
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < K; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = k * V;
        int m = chunk_len<V>(len, i);
        float xo[V], gi[V], S[V];
        load_vals<V>(xs + i, xv, m, xo);
        if (gin) load_vals<V>(gin + i, gv, m, gi);
#pragma unroll
        for (int t = 0; t < V; t++)
            S[t] = 0.0f;
        for (int j0 = 0; j0 < N; j0 += U) {
            uint32_t cw[U][V / 8];
            uint16_t sj[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int j = j0 + u;
                sj[u] = 0;
#pragma unroll
                for (int q = 0; q < V / 8; q++)
                    cw[u][q] = 0;
                if (j < N && j != own) {
                    const uint8_t *wj = recv.p[j];
                    load_words<V / 8>(wj + i / 2, align_of(wj, 4), cw[u]);
                    sj[u] = reinterpret_cast<const uint16_t *>(wj + L / 2)[i >> lg];
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                int j = j0 + u;
                if (j >= N) break;
                float s = echo_bf16_to_f32(sj[u]);
#pragma unroll
                for (int t = 0; t < V; t++) {
                    float v = j == own ? xo[t] : (float)code_at(cw[u], t) * s;
                    S[t] = j == 0 ? v : S[t] + v;
                }
            }
        }
        /* z = S (+ g) inside the shard, the host's zero padding past it */
        float z[V], r[V];
#pragma unroll
        for (int t = 0; t < V; t++)
            z[t] = t < m ? (gin ? S[t] + gi[t] : S[t]) : 0.0f;
        code_chunk<V>(z, P, lg, bf16_out, i, k, out, oal, scales, r);
        if (g) store_vals<V>(g + i, gv, m, r);
    }
}

/* Every rank: decode every shard into buf. blockIdx.y is the shard (those
 * holding data), blockIdx.x strides over its 16-value chunks; the first
 * chunk of a poisoned group reports the group's first element. */
template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS)
    echo_finish_kernel(wire_cptrs gathered, T *buf, size_t count, size_t L, int lg, unsigned long long *bad) {
    const int V = ECHO_FINISH_V;
    size_t start = (size_t)blockIdx.y * L, n = count - start < L ? count - start : L;
    size_t K = (n + V - 1) / V;
    const uint8_t *w = gathered.p[blockIdx.y];
    const uint16_t *scales = reinterpret_cast<const uint16_t *>(w + L / 2);
    T *o = buf + start;
    bool ov = align_of(o, 16) == 16;
    int wal = align_of(w, 8);
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < K; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = k * V;
        int m = chunk_len<V>(n, i);
        uint32_t cw[V / 8];
        load_words<V / 8>(w + i / 2, wal, cw);
        uint16_t sb = scales[i >> lg];
        float s = echo_bf16_to_f32(sb), v[V];
#pragma unroll
        for (int t = 0; t < V; t++)
            v[t] = (float)code_at(cw, t) * s;
        store_vals<V>(o + i, ov, m, v);
        if (echo_scale_is_poison(sb) && (i & (((size_t)1 << lg) - 1)) == 0)
            atomicMin(bad, (unsigned long long)(start + i));
    }
}

/* The local transport's exact path, owner: the host's order (local.c,
 * host_mem_sum): each rank's input, then its residual, rank by rank, fp32
 * adds only (nothing for nvcc to contract). */
typedef struct rank_srcs {
    const void *x[ECHO_MAX_RANKS];
    const float *res[ECHO_MAX_RANKS];
} rank_srcs;

template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS) echo_sum_ranks_kernel(rank_srcs src, int N, float *sum, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float S = 0;
        for (int j = 0; j < N; j++) {
            float v = ld((const T *)src.x[j], i);
            S = j == 0 ? v : S + v;
            if (src.res[j]) S = S + src.res[j][i];
        }
        sum[i] = S;
    }
}

/* buf = in rounded to T; the first index whose fp32 value is not finite
 * (the host's echo_cpu_store tests the fp32 sum, not the rounded output). */
template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS)
    echo_store_checked_kernel(const float *in, T *buf, size_t n, unsigned long long *bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = in[i];
        st(buf, i, v);
        if (echo_abs_bits(v) >= ECHO_INF_BITS) atomicMin(bad, (unsigned long long)i);
    }
}

template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS)
    echo_widen_add_kernel(const T *buf, const float *res, float *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = ld(buf, i) + res[i];
}

template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS) echo_narrow_kernel(const float *in, T *buf, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st(buf, i, in[i]);
}

template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS)
    echo_check_finite_kernel(const T *buf, size_t n, unsigned long long *bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (echo_abs_bits(ld(buf, i)) >= ECHO_INF_BITS) atomicMin(bad, (unsigned long long)i);
}

/* ---- rotating codecs (echo_plan.rotate) ----
 * The int4 kernels above run unchanged on rotated values in fp32; these
 * rotate into and out of the basis with comm/codec/echo_codec.h's echo_had_fwd /
 * echo_had_inv, the host's arithmetic. A thread owns one group and
 * rotates it in place in global memory: correct and simple, not yet tuned
 * (a group per warp with shuffles would be the fast form). */
template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS)
    echo_rot_fwd_kernel(const T *x, float *y, size_t count, size_t ngroups, int G) {
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < ngroups; g += (size_t)gridDim.x * blockDim.x) {
        size_t off = g * (size_t)G;
        float *v = y + off;
        for (int i = 0; i < G; i++)
            v[i] = off + (size_t)i < count ? ld(x, off + (size_t)i) : 0.0f;
        echo_had_fwd(v, G);
    }
}

template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS)
    echo_rot_inv_kernel(float *y, T *buf, size_t count, size_t ngroups, int G) {
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < ngroups; g += (size_t)gridDim.x * blockDim.x) {
        size_t off = g * (size_t)G;
        float *v = y + off;
        echo_had_inv(v, G);
        for (int i = 0; i < G && off + (size_t)i < count; i++)
            st(buf, off + (size_t)i, v[i]);
    }
}

__global__ void __launch_bounds__(ECHO_THREADS) echo_unrot_kernel(float *r, size_t ngroups, int G) {
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < ngroups; g += (size_t)gridDim.x * blockDim.x)
        echo_had_inv(r + g * (size_t)G, G);
}

/* ---- record forms (echo_plan.form: every row of comm/codec/echo_codec.h's
 * form table, a build's extra rows included): a thread codes or decodes one
 * group of G values with the row's group functions (echo_rec_encode_group /
 * echo_rec_decode_group), the host's arithmetic; values are the staged fp32
 * copy (d_rot), whole groups. Simple, not tuned. A shard's wire message:
 * the codes of its L values (echo_form_code_bytes: L * code_bits / 8), then
 * L/G records. */
template <typename T>
__global__ void __launch_bounds__(ECHO_THREADS) echo_stage_kernel(const T *x, float *y, size_t count, size_t np) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < np; i += (size_t)gridDim.x * blockDim.x)
        y[i] = i < count ? ld(x, i) : 0.0f;
}

__global__ void __launch_bounds__(ECHO_THREADS)
    echo_rec_phase1_kernel(int form, const float *y, float *res, int res_valid, size_t count, size_t L, int G, int own,
                           wire_ptrs send) {
    int c = (int)blockIdx.y;
    c += c >= own;
    size_t start = (size_t)c * L, n = count - start < L ? count - start : L, K = n / (size_t)G;
    size_t rb = (size_t)echo_rec_bytes(form, G), cg = echo_form_code_bytes(form, (size_t)G),
           cl = echo_form_code_bytes(form, L);
    uint8_t *w = send.p[c];
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < K; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = start + k * (size_t)G;
        float t[ECHO_MAX_GROUP];
        for (int q = 0; q < G; q++)
            t[q] = res && res_valid ? y[i + q] + res[i + q] : y[i + q];
        echo_rec_encode_group(form, t, G, w + k * cg, w + cl + k * rb, res ? res + i : NULL, G);
    }
}

/* Owner: S = sum over j = 0..N-1 in that order of (j == own ? ys : decoded
 * peer j), + g when g_valid; coded into out; g = residual. */
__global__ void __launch_bounds__(ECHO_THREADS)
    echo_rec_phase2_kernel(int form, const float *ys, wire_cptrs recv, float *g, int g_valid, size_t len, size_t L,
                           int G, int N, int own, uint8_t *out) {
    size_t K = len / (size_t)G, rb = (size_t)echo_rec_bytes(form, G), cg = echo_form_code_bytes(form, (size_t)G),
           cl = echo_form_code_bytes(form, L);
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < K; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = k * (size_t)G;
        float S[ECHO_MAX_GROUP], v[ECHO_MAX_GROUP];
        for (int j = 0; j < N; j++) {
            if (j == own)
                for (int q = 0; q < G; q++)
                    v[q] = ys[i + q];
            else
                echo_rec_decode_group(form, recv.p[j] + k * cg, recv.p[j] + cl + k * rb, G, v);
            for (int q = 0; q < G; q++)
                S[q] = j == 0 ? v[q] : S[q] + v[q];
        }
        if (g && g_valid)
            for (int q = 0; q < G; q++)
                S[q] = S[q] + g[i + q];
        echo_rec_encode_group(form, S, G, out + k * cg, out + cl + k * rb, g ? g + i : NULL, G);
    }
}

/* Every rank: decode every shard's groups into y; a poisoned group reports
 * its first element. */
__global__ void __launch_bounds__(ECHO_THREADS)
    echo_rec_finish_kernel(int form, wire_cptrs gathered, float *y, size_t count, size_t L, int G,
                           unsigned long long *bad) {
    size_t start = (size_t)blockIdx.y * L, n = count - start < L ? count - start : L, K = n / (size_t)G;
    size_t rb = (size_t)echo_rec_bytes(form, G), cg = echo_form_code_bytes(form, (size_t)G),
           cl = echo_form_code_bytes(form, L);
    const uint8_t *w = gathered.p[blockIdx.y];
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < K; k += (size_t)gridDim.x * blockDim.x) {
        uint16_t sb = echo_rec_decode_group(form, w + k * cg, w + cl + k * rb, G,
                                            y + start + k * (size_t)G);
        if (echo_scale_is_poison(sb)) atomicMin(bad, (unsigned long long)(start + k * (size_t)G));
    }
}

/* ---- launchers ---- */

/* Grid-stride kernels: enough blocks to fill an H100-class GPU. */
static unsigned blocks_stride(size_t n) {
    size_t b = (n + ECHO_THREADS - 1) / ECHO_THREADS;
    return (unsigned)(b < 4096 ? (b ? b : 1) : 4096);
}

static cuda_state *state_of(echo_comm *c) {
    return (cuda_state *)c->compute_state;
}

/* log2 of the group size (a power of two, validated at world creation). */
static int log2_group(int G) {
    int lg = 0;
    while ((1 << lg) < G)
        lg++;
    return lg;
}

/* Blocks per shard for a codec kernel over `shards` shards of at most
 * `chunks` chunks each: the device's resident blocks shared among the
 * shards, and no more than the chunks need. */
static unsigned grid_x(const cuda_state *cs, int kernel, echo_dtype dt, size_t chunks, unsigned shards) {
    size_t need = (chunks + ECHO_THREADS - 1) / ECHO_THREADS, fill = cs->resident[kernel][dt == ECHO_BF16] / shards;
    if (fill < 1) fill = 1;
    if (need < 1) need = 1;
    return (unsigned)(need < fill ? need : fill);
}

static int cuda_phase1(echo_comm *c, const echo_plan *p, const void *x, float *res, int res_valid, uint8_t *const *send,
                       size_t *bad, void *stream, char *err, size_t errlen) {
    *bad = ECHO_NO_INDEX; /* known only after finish synchronises */
    /* shards holding data, then those this rank codes (all but its own) */
    size_t with_data = (p->count + p->shard - 1) / p->shard;
    unsigned shards = (unsigned)(with_data - ((size_t)c->rank < with_data));
    /* a rotating codec rotates the own shard even when it codes no other */
    if (shards == 0 && !echo_plan_staged(p)) return 0;
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    wire_ptrs w;
    for (int j = 0; j < ECHO_MAX_RANKS; j++)
        w.p[j] = j < p->nranks ? send[j] : NULL;
    int lg = log2_group(p->group);
    cudaStream_t s = (cudaStream_t)stream;
    if (echo_plan_staged(p)) {
        /* the whole message, own shard included (phase 2 sums it staged) */
        cuda_state *cs = state_of(c);
        size_t np = echo_plan_pad(p, p->count);
        if (p->rotate) {
            size_t ng = np / (size_t)p->rotate;
            if (p->dt == ECHO_F32)
                echo_rot_fwd_kernel<float>
                    <<<blocks_stride(ng), ECHO_THREADS, 0, s>>>((const float *)x, cs->d_rot, p->count, ng, p->rotate);
            else
                echo_rot_fwd_kernel<uint16_t><<<blocks_stride(ng), ECHO_THREADS, 0, s>>>((const uint16_t *)x, cs->d_rot,
                                                                                         p->count, ng, p->rotate);
        } else if (p->dt == ECHO_F32) {
            echo_stage_kernel<float>
                <<<blocks_stride(np), ECHO_THREADS, 0, s>>>((const float *)x, cs->d_rot, p->count, np);
        } else {
            echo_stage_kernel<uint16_t>
                <<<blocks_stride(np), ECHO_THREADS, 0, s>>>((const uint16_t *)x, cs->d_rot, p->count, np);
        }
        ECHO_CUDA_TRY(cudaGetLastError());
        if (shards == 0) return 0;
        if (p->form) {
            dim3 hgrid(blocks_stride(p->shard / (size_t)p->group), shards);
            echo_rec_phase1_kernel<<<hgrid, ECHO_THREADS, 0, s>>>(p->form, cs->d_rot, res, res_valid, np, p->shard,
                                                                  p->group, c->rank, w);
            ECHO_CUDA_TRY(cudaGetLastError());
            return 0;
        }
        dim3 rgrid(grid_x(cs, K_PHASE1, ECHO_F32, p->shard / ECHO_CODE_V, shards), shards);
        echo_phase1_kernel<float>
            <<<rgrid, ECHO_THREADS, 0, s>>>(cs->d_rot, res, res_valid, np, p->shard, lg, c->rank, w);
        ECHO_CUDA_TRY(cudaGetLastError());
        return 0;
    }
    dim3 grid(grid_x(state_of(c), K_PHASE1, p->dt, p->shard / ECHO_CODE_V, shards), shards);
    if (p->dt == ECHO_F32)
        echo_phase1_kernel<float>
            <<<grid, ECHO_THREADS, 0, s>>>((const float *)x, res, res_valid, p->count, p->shard, lg, c->rank, w);
    else
        echo_phase1_kernel<uint16_t>
            <<<grid, ECHO_THREADS, 0, s>>>((const uint16_t *)x, res, res_valid, p->count, p->shard, lg, c->rank, w);
    ECHO_CUDA_TRY(cudaGetLastError());
    return 0;
}

static int cuda_phase2(echo_comm *c, const echo_plan *p, const void *x, const uint8_t *const *recv, float *g,
                       int g_valid, uint8_t *out, void *stream, char *err, size_t errlen) {
    size_t len = echo_plan_len(p, c->rank), base = (size_t)c->rank * p->shard;
    if (len == 0) return 0;
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    wire_cptrs w;
    for (int j = 0; j < ECHO_MAX_RANKS; j++)
        w.p[j] = j < p->nranks ? recv[j] : NULL;
    int lg = log2_group(p->group);
    cudaStream_t s = (cudaStream_t)stream;
    if (echo_plan_staged(p)) {
        /* staged fp32, whole groups (g does not see the output rounding, as on the host) */
        if (p->form) {
            size_t lp = echo_plan_pad(p, len);
            echo_rec_phase2_kernel<<<blocks_stride(lp / (size_t)p->group), ECHO_THREADS, 0, s>>>(
                p->form, state_of(c)->d_rot + base, w, g, g_valid, lp, p->shard, p->group, p->nranks, c->rank, out);
            ECHO_CUDA_TRY(cudaGetLastError());
            return 0;
        }
        unsigned rb = grid_x(state_of(c), K_PHASE2, ECHO_F32, p->shard / ECHO_CODE_V, 1);
        echo_phase2_kernel<float><<<rb, ECHO_THREADS, 0, s>>>(
            state_of(c)->d_rot + base, w, g, g_valid, echo_plan_pad(p, len), p->shard, lg, p->nranks, c->rank, out);
        ECHO_CUDA_TRY(cudaGetLastError());
        return 0;
    }
    unsigned nb = grid_x(state_of(c), K_PHASE2, p->dt, p->shard / ECHO_CODE_V, 1);
    if (p->dt == ECHO_F32)
        echo_phase2_kernel<float><<<nb, ECHO_THREADS, 0, s>>>((const float *)x + base, w, g, g_valid, len, p->shard, lg,
                                                              p->nranks, c->rank, out);
    else
        echo_phase2_kernel<uint16_t><<<nb, ECHO_THREADS, 0, s>>>((const uint16_t *)x + base, w, g, g_valid, len,
                                                                 p->shard, lg, p->nranks, c->rank, out);
    ECHO_CUDA_TRY(cudaGetLastError());
    return 0;
}

/* Read the flag back: the one synchronisation of a call. */
static int read_bad(echo_comm *c, size_t *bad, cudaStream_t s, char *err, size_t errlen) {
    cuda_state *cs = state_of(c);
    ECHO_CUDA_TRY(cudaMemcpyAsync(cs->h_bad, cs->d_bad, sizeof *cs->h_bad, cudaMemcpyDeviceToHost, s));
    ECHO_CUDA_TRY(cudaStreamSynchronize(s));
    *bad = *cs->h_bad == ECHO_NO_BAD ? ECHO_NO_INDEX : (size_t)*cs->h_bad;
    return 0;
}

/* Where this call records its first non-finite element: the call's own
 * flag, cleared here, or in a deferred world the site's flag of the pass
 * (cleared by pass_arm, read by pass_read). */
static int bad_flag(echo_comm *c, cudaStream_t s, unsigned long long **flag, char *err, size_t errlen) {
    cuda_state *cs = state_of(c);
    if (c->w->cfg.deferred) {
        if (c->last_site < 0 || c->last_site >= cs->n_site_flags) {
            snprintf(err, errlen, "echo: internal: site %d has no non-finite flag", c->last_site);
            return -1;
        }
        *flag = cs->d_site_bad + c->last_site;
        return 0;
    }
    ECHO_CUDA_TRY(cudaMemsetAsync(cs->d_bad, 0xff, sizeof(unsigned long long), s));
    *flag = cs->d_bad;
    return 0;
}

/* Enqueue the finish kernel (after choosing and clearing its flag). */
static int finish_enqueue(echo_comm *c, const echo_plan *p, const uint8_t *const *gathered, void *buf, void *stream,
                          char *err, size_t errlen) {
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    cudaStream_t s = (cudaStream_t)stream;
    wire_cptrs w;
    for (int j = 0; j < ECHO_MAX_RANKS; j++)
        w.p[j] = j < p->nranks ? gathered[j] : NULL;
    unsigned long long *flag = NULL;
    if (bad_flag(c, s, &flag, err, errlen)) return -1;
    unsigned shards = (unsigned)((p->count + p->shard - 1) / p->shard); /* those holding data */
    if (shards == 0) return 0;
    int lg = log2_group(p->group);
    if (echo_plan_staged(p)) {
        cuda_state *cs = state_of(c);
        size_t np = echo_plan_pad(p, p->count), ng = p->rotate ? np / (size_t)p->rotate : 0;
        if (p->form) {
            dim3 hgrid(blocks_stride(p->shard / (size_t)p->group), shards);
            echo_rec_finish_kernel<<<hgrid, ECHO_THREADS, 0, s>>>(p->form, w, cs->d_rot, np, p->shard, p->group, flag);
        } else {
            dim3 rgrid(grid_x(cs, K_FINISH, ECHO_F32, p->shard / ECHO_FINISH_V, shards), shards);
            echo_finish_kernel<float><<<rgrid, ECHO_THREADS, 0, s>>>(w, cs->d_rot, np, p->shard, lg, flag);
        }
        ECHO_CUDA_TRY(cudaGetLastError());
        if (!p->rotate) {
            if (p->dt == ECHO_F32)
                echo_narrow_kernel<float>
                    <<<blocks_stride(p->count), ECHO_THREADS, 0, s>>>(cs->d_rot, (float *)buf, p->count);
            else
                echo_narrow_kernel<uint16_t>
                    <<<blocks_stride(p->count), ECHO_THREADS, 0, s>>>(cs->d_rot, (uint16_t *)buf, p->count);
        } else if (p->dt == ECHO_F32) {
            echo_rot_inv_kernel<float>
                <<<blocks_stride(ng), ECHO_THREADS, 0, s>>>(cs->d_rot, (float *)buf, p->count, ng, p->rotate);
        } else {
            echo_rot_inv_kernel<uint16_t>
                <<<blocks_stride(ng), ECHO_THREADS, 0, s>>>(cs->d_rot, (uint16_t *)buf, p->count, ng, p->rotate);
        }
        ECHO_CUDA_TRY(cudaGetLastError());
        return 0;
    }
    dim3 grid(grid_x(state_of(c), K_FINISH, p->dt, p->shard / ECHO_FINISH_V, shards), shards);
    if (p->dt == ECHO_F32)
        echo_finish_kernel<float><<<grid, ECHO_THREADS, 0, s>>>(w, (float *)buf, p->count, p->shard, lg, flag);
    else
        echo_finish_kernel<uint16_t><<<grid, ECHO_THREADS, 0, s>>>(w, (uint16_t *)buf, p->count, p->shard, lg, flag);
    ECHO_CUDA_TRY(cudaGetLastError());
    return 0;
}

static int cuda_finish(echo_comm *c, const echo_plan *p, const uint8_t *const *gathered, void *buf, size_t *bad,
                       void *stream, char *err, size_t errlen) {
    if (finish_enqueue(c, p, gathered, buf, stream, err, errlen)) return -1;
    if (c->w->cfg.deferred) {
        *bad = ECHO_NO_INDEX; /* known at echo_end_pass */
        return 0;
    }
    return read_bad(c, bad, (cudaStream_t)stream, err, errlen);
}

static int cuda_pass_arm(echo_comm *c, void *stream, char *err, size_t errlen) {
    cuda_state *cs = state_of(c);
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    ECHO_CUDA_TRY(
        cudaMemsetAsync(cs->d_site_bad, 0xff, (size_t)cs->n_site_flags * sizeof *cs->d_site_bad, (cudaStream_t)stream));
    return 0;
}

static int cuda_pass_read(echo_comm *c, void *stream, int *site, size_t *bad, char *err, size_t errlen) {
    cuda_state *cs = state_of(c);
    cudaStream_t s = (cudaStream_t)stream;
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    ECHO_CUDA_TRY(cudaMemcpyAsync(cs->h_site_bad, cs->d_site_bad, (size_t)cs->n_site_flags * sizeof *cs->h_site_bad,
                                  cudaMemcpyDeviceToHost, s));
    ECHO_CUDA_TRY(cudaStreamSynchronize(s));
    *site = -1;
    *bad = ECHO_NO_INDEX;
    for (int i = 0; i < cs->n_site_flags; i++)
        if (cs->h_site_bad[i] != ECHO_NO_BAD) {
            *site = i;
            *bad = (size_t)cs->h_site_bad[i];
            break;
        }
    return 0;
}

static int cuda_alloc(echo_comm *c, size_t bytes, void **out, char *err, size_t errlen) {
    *out = NULL;
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    ECHO_CUDA_TRY(cudaMalloc(out, bytes ? bytes : 1));
    ECHO_CUDA_TRY(cudaMemset(*out, 0, bytes));
    /* cudaMemset runs on the legacy stream, which the ranks' non-blocking
     * streams do not wait for: finish it here so that the memory is zero
     * for them, as the contract says */
    ECHO_CUDA_TRY(cudaStreamSynchronize(0));
    return 0;
}

static void cuda_free(echo_comm *c, void *p) {
    if (!p) return;
    cudaSetDevice(c->device);
    cudaFree(p);
}

/* Resident blocks of `kernel` on a device of `sms` SMs (at least one per SM,
 * so a grid is never empty). */
template <typename K> static int resident_blocks(K kernel, int sms, unsigned *out, char *err, size_t errlen) {
    int per_sm = 0;
    ECHO_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, ECHO_THREADS, 0));
    *out = (unsigned)(sms * (per_sm > 0 ? per_sm : 1));
    return 0;
}

static void cuda_comm_fini(echo_comm *c);

static int cuda_comm_setup(echo_comm *c, cuda_state *cs, char *err, size_t errlen) {
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    ECHO_CUDA_TRY(cudaMalloc((void **)&cs->d_bad, sizeof *cs->d_bad));
    ECHO_CUDA_TRY(cudaMallocHost((void **)&cs->h_bad, sizeof *cs->h_bad));
    if (c->w->cfg.deferred) {
        size_t n = (size_t)c->w->cfg.n_sites;
        ECHO_CUDA_TRY(cudaMalloc((void **)&cs->d_site_bad, n * sizeof *cs->d_site_bad));
        ECHO_CUDA_TRY(cudaMallocHost((void **)&cs->h_site_bad, n * sizeof *cs->h_site_bad));
        cs->n_site_flags = c->w->cfg.n_sites;
    }
    const echo_world *w = c->w;
    const echo_codec_info *ci = echo_codec_get(w->cfg.codec);
    if ((ci->rotate || ci->form) && w->nranks > 1 && !ci->lossless)
        ECHO_CUDA_TRY(cudaMalloc((void **)&cs->d_rot, w->max_plan.shard * (size_t)w->nranks * sizeof(float)));
    int sms = 0;
    ECHO_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c->device));
    if (sms < 1) sms = 1;
    if (resident_blocks(echo_phase1_kernel<float>, sms, &cs->resident[K_PHASE1][0], err, errlen) ||
        resident_blocks(echo_phase1_kernel<uint16_t>, sms, &cs->resident[K_PHASE1][1], err, errlen) ||
        resident_blocks(echo_phase2_kernel<float>, sms, &cs->resident[K_PHASE2][0], err, errlen) ||
        resident_blocks(echo_phase2_kernel<uint16_t>, sms, &cs->resident[K_PHASE2][1], err, errlen) ||
        resident_blocks(echo_finish_kernel<float>, sms, &cs->resident[K_FINISH][0], err, errlen) ||
        resident_blocks(echo_finish_kernel<uint16_t>, sms, &cs->resident[K_FINISH][1], err, errlen))
        return -1;
    return 0;
}

static int cuda_comm_init(echo_comm *c, char *err, size_t errlen) {
    cuda_state *cs = (cuda_state *)calloc(1, sizeof *cs);
    if (!cs) {
        snprintf(err, errlen, "echo: out of memory");
        return -1;
    }
    c->compute_state = cs;
    if (cuda_comm_setup(c, cs, err, errlen)) {
        cuda_comm_fini(c); /* echo.c calls comm_fini only after a successful comm_init */
        return -1;
    }
    return 0;
}

static void cuda_comm_fini(echo_comm *c) {
    cuda_state *cs = state_of(c);
    if (!cs) return;
    cudaSetDevice(c->device);
    if (cs->d_bad) cudaFree(cs->d_bad);
    if (cs->h_bad) cudaFreeHost(cs->h_bad);
    if (cs->d_site_bad) cudaFree(cs->d_site_bad);
    if (cs->h_site_bad) cudaFreeHost(cs->h_site_bad);
    if (cs->d_rot) cudaFree(cs->d_rot);
    free(cs);
    c->compute_state = NULL;
}

static int cuda_unrotate(echo_comm *c, float *res, size_t n, int group, void *stream, char *err, size_t errlen) {
    size_t ng = n / (size_t)group;
    if (ng == 0) return 0;
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    echo_unrot_kernel<<<blocks_stride(ng), ECHO_THREADS, 0, (cudaStream_t)stream>>>(res, ng, group);
    ECHO_CUDA_TRY(cudaGetLastError());
    return 0;
}

extern "C" const echo_compute_ops echo_cuda_compute = {
    "cuda",         cuda_phase1,    cuda_phase2,   cuda_finish,    cuda_alloc,    cuda_free,
    cuda_comm_init, cuda_comm_fini, cuda_pass_arm, cuda_pass_read, cuda_unrotate,
};

/* ---- exact-path helpers for the nccl transport ---- */

extern "C" int echo_cuda_widen_add(echo_comm *c, const void *buf, echo_dtype dt, const float *res, float *out, size_t n,
                                   void *stream, char *err, size_t errlen) {
    if (n == 0) return 0;
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == ECHO_F32)
        echo_widen_add_kernel<<<blocks_stride(n), ECHO_THREADS, 0, s>>>((const float *)buf, res, out, n);
    else
        echo_widen_add_kernel<<<blocks_stride(n), ECHO_THREADS, 0, s>>>((const uint16_t *)buf, res, out, n);
    ECHO_CUDA_TRY(cudaGetLastError());
    return 0;
}

extern "C" int echo_cuda_narrow(echo_comm *c, const float *in, void *buf, echo_dtype dt, size_t n, void *stream,
                                char *err, size_t errlen) {
    if (n == 0) return 0;
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    cudaStream_t s = (cudaStream_t)stream;
    if (dt == ECHO_F32)
        echo_narrow_kernel<<<blocks_stride(n), ECHO_THREADS, 0, s>>>(in, (float *)buf, n);
    else
        echo_narrow_kernel<<<blocks_stride(n), ECHO_THREADS, 0, s>>>(in, (uint16_t *)buf, n);
    ECHO_CUDA_TRY(cudaGetLastError());
    return 0;
}

extern "C" int echo_cuda_check_finite(echo_comm *c, const void *buf, echo_dtype dt, size_t n, size_t *bad, void *stream,
                                      char *err, size_t errlen) {
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    cudaStream_t s = (cudaStream_t)stream;
    unsigned long long *flag = NULL;
    if (bad_flag(c, s, &flag, err, errlen)) return -1;
    if (n) {
        if (dt == ECHO_F32)
            echo_check_finite_kernel<<<blocks_stride(n), ECHO_THREADS, 0, s>>>((const float *)buf, n, flag);
        else
            echo_check_finite_kernel<<<blocks_stride(n), ECHO_THREADS, 0, s>>>((const uint16_t *)buf, n, flag);
        ECHO_CUDA_TRY(cudaGetLastError());
    }
    if (c->w->cfg.deferred) {
        *bad = ECHO_NO_INDEX; /* known at echo_end_pass */
        return 0;
    }
    return read_bad(c, bad, s, err, errlen);
}

extern "C" int echo_cuda_finish_async(echo_comm *c, const echo_plan *p, const uint8_t *const *gathered, void *buf,
                                      void *stream, char *err, size_t errlen) {
    return finish_enqueue(c, p, gathered, buf, stream, err, errlen);
}

/* ---- exact-path helpers for the local transport on device memory ---- */

extern "C" int echo_cuda_sum_ranks(echo_comm *c, int nranks, echo_dtype dt, const void *const *x,
                                   const float *const *res, size_t n, float *sum, void *stream, char *err,
                                   size_t errlen) {
    if (n == 0) return 0;
    if (nranks < 1 || nranks > ECHO_MAX_RANKS) {
        snprintf(err, errlen, "echo: internal: %d ranks to sum", nranks);
        return -1;
    }
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    cudaStream_t s = (cudaStream_t)stream;
    rank_srcs src;
    for (int j = 0; j < ECHO_MAX_RANKS; j++) {
        src.x[j] = j < nranks ? x[j] : NULL;
        src.res[j] = j < nranks ? res[j] : NULL;
    }
    if (dt == ECHO_F32)
        echo_sum_ranks_kernel<float><<<blocks_stride(n), ECHO_THREADS, 0, s>>>(src, nranks, sum, n);
    else
        echo_sum_ranks_kernel<uint16_t><<<blocks_stride(n), ECHO_THREADS, 0, s>>>(src, nranks, sum, n);
    ECHO_CUDA_TRY(cudaGetLastError());
    return 0;
}

extern "C" int echo_cuda_store_checked(echo_comm *c, const float *in, void *buf, echo_dtype dt, size_t n, size_t *bad,
                                       void *stream, char *err, size_t errlen) {
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    cudaStream_t s = (cudaStream_t)stream;
    ECHO_CUDA_TRY(cudaMemsetAsync(state_of(c)->d_bad, 0xff, sizeof(unsigned long long), s));
    if (n) {
        if (dt == ECHO_F32)
            echo_store_checked_kernel<<<blocks_stride(n), ECHO_THREADS, 0, s>>>(in, (float *)buf, n,
                                                                                state_of(c)->d_bad);
        else
            echo_store_checked_kernel<<<blocks_stride(n), ECHO_THREADS, 0, s>>>(in, (uint16_t *)buf, n,
                                                                                state_of(c)->d_bad);
        ECHO_CUDA_TRY(cudaGetLastError());
    }
    return read_bad(c, bad, s, err, errlen);
}
