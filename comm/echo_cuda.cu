/*
 * comm/echo_cuda.cu — the cuda twin of codec.c's host compute: phase 1,
 * phase 2 and finish as kernels on device memory, plus the helpers of the
 * exact paths of the nccl transport and of the local transport on device
 * memory. Same steps, same order, same inline arithmetic
 * (comm/echo_codec.h), so a rank on the GPU produces the bits a rank on the
 * host would.
 *
 * Mapping: one thread per code byte (two values); the G/2 threads of a group
 * reduce its absmax with warp shuffles (and shared memory when G/2 > 32), so
 * a 256-thread block holds whole groups (G <= 256) and shard boundaries
 * (multiples of L, itself a multiple of G) fall between groups. Threads
 * without data still take part in the reductions and leave afterwards.
 *
 * Non-finite input travels in-band as a poisoned scale (echo_codec.h);
 * finish records the first element of a poisoned group with atomicMin and
 * reads it back with one stream synchronisation per call (the host needs
 * the answer to return an error).
 *
 * No file-scope device state: the per-rank flag lives in compute_state.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* nvcc is not given -DECHO_HAVE_CUDA (only the C files are). */
#ifndef ECHO_HAVE_CUDA
#define ECHO_HAVE_CUDA 1
#endif
extern "C" {
#include "comm/echo_internal.h"
}
#include "comm/echo_codec.h"

#define ECHO_THREADS 256
#define ECHO_NO_BAD 0xffffffffffffffffull

typedef struct wire_ptrs {
    uint8_t *p[ECHO_MAX_RANKS];
} wire_ptrs;

typedef struct wire_cptrs {
    const uint8_t *p[ECHO_MAX_RANKS];
} wire_cptrs;

typedef struct cuda_state {
    unsigned long long *d_bad; /* device: first bad element, ECHO_NO_BAD if none */
    unsigned long long *h_bad; /* pinned host mirror */
} cuda_state;

/* ---- error checks: record "cuda: FILE:LINE: CALL: NAME (message)" ---- */

static int cuda_fail(char *err, size_t errlen, const char *file, int line, const char *call, cudaError_t e) {
    snprintf(err, errlen, "cuda: %s:%d: %s: %s (%s)", file, line, call, cudaGetErrorName(e), cudaGetErrorString(e));
    return -1;
}

#define ECHO_CUDA_TRY(call)                                                                                            \
    do {                                                                                                               \
        cudaError_t echo_e_ = (call);                                                                                  \
        if (echo_e_ != cudaSuccess) return cuda_fail(err, errlen, __FILE__, __LINE__, #call, echo_e_);                 \
    } while (0)

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

/* Largest |.| bits over the G/2 threads of this thread's group. Every
 * thread of the block must call it (shuffles, and __syncthreads for G > 64;
 * G is uniform over the launch). */
__device__ static uint32_t group_absmax(uint32_t a, int G, uint32_t *smem) {
    int half = G / 2, w = half < 32 ? half : 32;
    for (int o = w / 2; o > 0; o >>= 1)
        a = max(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (half > 32) {
        if ((threadIdx.x & 31) == 0) smem[threadIdx.x / 32] = a;
        __syncthreads();
        int first = (int)(threadIdx.x / half) * (half / 32);
        a = 0;
        for (int k = 0; k < half / 32; k++)
            a = max(a, smem[first + k]);
    }
    return a;
}

/* Decoded value of element i of a shard message (L values). */
__device__ static inline float deq(const uint8_t *w, size_t L, int G, size_t i) {
    uint8_t b = w[i / 2];
    int q = (i & 1) ? echo_nib_hi(b) : echo_nib_lo(b);
    return (float)q * echo_bf16_to_f32(((const uint16_t *)(w + L / 2))[i / (size_t)G]);
}

/* Code the pair (y0, y1) of a group with scale bits sb into byte `byte` of
 * message w (and the scale, by the group's first thread); residuals as the
 * host computes them. */
__device__ static inline void encode_pair(float y0, float y1, uint16_t sb, uint8_t *w, size_t L, int G, size_t off,
                                          float *r, size_t n_left, int bf16_out) {
    float s = echo_bf16_to_f32(sb), q0 = 0, q1 = 0;
    int ok = sb != 0 && !echo_scale_is_poison(sb);
    if (ok) {
        q0 = echo_code(y0, s);
        q1 = echo_code(y1, s);
    }
    w[off / 2] = echo_pack2((int)q0, (int)q1);
    if (off % (size_t)G == 0) ((uint16_t *)(w + L / 2))[off / (size_t)G] = sb;
    if (!r) return;
    float o0 = q0 * s, o1 = q1 * s;
    if (bf16_out) {
        o0 = echo_bf16_to_f32(echo_f32_to_bf16(o0));
        o1 = echo_bf16_to_f32(echo_f32_to_bf16(o1));
    }
    if (n_left > 0) r[0] = ok ? y0 - o0 : (sb == 0 ? y0 : 0.0f);
    if (n_left > 1) r[1] = ok ? y1 - o1 : (sb == 0 ? y1 : 0.0f);
}

/* ---- kernels ---- */

/* Phase 1 over the padded message (N*L values, one thread per pair). */
template <typename T>
__global__ void echo_phase1_kernel(const T *x, float *res, int res_valid, size_t count, size_t L, int G, int N, int own,
                                   wire_ptrs send) {
    __shared__ uint32_t smem[ECHO_THREADS / 32];
    size_t e = 2 * (blockIdx.x * (size_t)blockDim.x + threadIdx.x);
    size_t c = e / L, off = e - c * L;
    int act = c < (size_t)N && (int)c != own && e - e % (size_t)G < count;
    float y0 = 0, y1 = 0;
    if (act) {
        if (e < count) y0 = res_valid ? ld(x, e) + res[e] : ld(x, e);
        if (e + 1 < count) y1 = res_valid ? ld(x, e + 1) + res[e + 1] : ld(x, e + 1);
    }
    uint32_t a = group_absmax(max(echo_abs_bits(y0), echo_abs_bits(y1)), G, smem);
    if (!act) return;
    encode_pair(y0, y1, echo_scale_from_absbits(a), send.p[c], L, G, off, res ? res + e : NULL,
                e < count ? count - e : 0, 0);
}

/* Phase 2 on the owner's shard (len values at offset `base`). */
template <typename T>
__global__ void echo_phase2_kernel(const T *x, wire_cptrs recv, float *g, int g_valid, size_t len, size_t base,
                                   size_t L, int G, int N, int own, uint8_t *out, int bf16_out) {
    __shared__ uint32_t smem[ECHO_THREADS / 32];
    size_t e = 2 * (blockIdx.x * (size_t)blockDim.x + threadIdx.x);
    int act = e < L && e - e % (size_t)G < len;
    float z[2] = {0, 0};
    for (int k = 0; k < 2 && act; k++) {
        size_t i = e + (size_t)k;
        if (i >= len) break;
        /* fixed order j = 0..N-1, own shard raw: the host's order */
        float S = 0;
        for (int j = 0; j < N; j++) {
            float v = j == own ? ld(x, base + i) : deq(recv.p[j], L, G, i);
            S = j == 0 ? v : S + v;
        }
        z[k] = g_valid ? S + g[i] : S;
    }
    uint32_t a = group_absmax(max(echo_abs_bits(z[0]), echo_abs_bits(z[1])), G, smem);
    if (!act) return;
    encode_pair(z[0], z[1], echo_scale_from_absbits(a), out, L, G, e, g ? g + e : NULL, e < len ? len - e : 0,
                bf16_out);
}

/* Every rank: decode every shard into buf. */
template <typename T>
__global__ void echo_finish_kernel(wire_cptrs gathered, T *buf, size_t count, size_t L, int G,
                                   unsigned long long *bad) {
    size_t e = 2 * (blockIdx.x * (size_t)blockDim.x + threadIdx.x);
    if (e >= count) return;
    size_t c = e / L, off = e - c * L;
    const uint8_t *w = gathered.p[c];
    uint16_t sb = ((const uint16_t *)(w + L / 2))[off / (size_t)G];
    float s = echo_bf16_to_f32(sb);
    uint8_t b = w[off / 2];
    st(buf, e, (float)echo_nib_lo(b) * s);
    if (e + 1 < count) st(buf, e + 1, (float)echo_nib_hi(b) * s);
    if (echo_scale_is_poison(sb) && off % (size_t)G == 0) atomicMin(bad, (unsigned long long)e);
}

/* The local transport's exact path, owner: the host's order (local.c,
 * host_mem_sum): each rank's input, then its residual, rank by rank, fp32
 * adds only (nothing for nvcc to contract). */
typedef struct rank_srcs {
    const void *x[ECHO_MAX_RANKS];
    const float *res[ECHO_MAX_RANKS];
} rank_srcs;

template <typename T> __global__ void echo_sum_ranks_kernel(rank_srcs src, int N, float *sum, size_t n) {
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
__global__ void echo_store_checked_kernel(const float *in, T *buf, size_t n, unsigned long long *bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = in[i];
        st(buf, i, v);
        if (echo_abs_bits(v) >= ECHO_INF_BITS) atomicMin(bad, (unsigned long long)i);
    }
}

template <typename T> __global__ void echo_widen_add_kernel(const T *buf, const float *res, float *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = ld(buf, i) + res[i];
}

template <typename T> __global__ void echo_narrow_kernel(const float *in, T *buf, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st(buf, i, in[i]);
}

template <typename T> __global__ void echo_check_finite_kernel(const T *buf, size_t n, unsigned long long *bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (echo_abs_bits(ld(buf, i)) >= ECHO_INF_BITS) atomicMin(bad, (unsigned long long)i);
}

/* ---- launchers ---- */

static unsigned blocks_for(size_t threads) {
    return (unsigned)((threads + ECHO_THREADS - 1) / ECHO_THREADS);
}

/* Grid-stride kernels: enough blocks to fill an H100-class GPU. */
static unsigned blocks_stride(size_t n) {
    size_t b = (n + ECHO_THREADS - 1) / ECHO_THREADS;
    return (unsigned)(b < 4096 ? (b ? b : 1) : 4096);
}

static cuda_state *state_of(echo_comm *c) {
    return (cuda_state *)c->compute_state;
}

static int cuda_phase1(echo_comm *c, const echo_plan *p, const void *x, float *res, int res_valid, uint8_t *const *send,
                       size_t *bad, void *stream, char *err, size_t errlen) {
    *bad = ECHO_NO_INDEX; /* known only after finish synchronises */
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    wire_ptrs w;
    for (int j = 0; j < ECHO_MAX_RANKS; j++)
        w.p[j] = j < p->nranks ? send[j] : NULL;
    unsigned nb = blocks_for((size_t)p->nranks * p->shard / 2);
    cudaStream_t s = (cudaStream_t)stream;
    if (p->dt == ECHO_F32)
        echo_phase1_kernel<<<nb, ECHO_THREADS, 0, s>>>((const float *)x, res, res_valid, p->count, p->shard, p->group,
                                                       p->nranks, c->rank, w);
    else
        echo_phase1_kernel<<<nb, ECHO_THREADS, 0, s>>>((const uint16_t *)x, res, res_valid, p->count, p->shard,
                                                       p->group, p->nranks, c->rank, w);
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
    unsigned nb = blocks_for(p->shard / 2);
    cudaStream_t s = (cudaStream_t)stream;
    if (p->dt == ECHO_F32)
        echo_phase2_kernel<<<nb, ECHO_THREADS, 0, s>>>((const float *)x, w, g, g_valid, len, base, p->shard, p->group,
                                                       p->nranks, c->rank, out, 0);
    else
        echo_phase2_kernel<<<nb, ECHO_THREADS, 0, s>>>((const uint16_t *)x, w, g, g_valid, len, base, p->shard,
                                                       p->group, p->nranks, c->rank, out, 1);
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

/* Clear the flag and enqueue the finish kernel. */
static int finish_enqueue(echo_comm *c, const echo_plan *p, const uint8_t *const *gathered, void *buf, void *stream,
                          char *err, size_t errlen) {
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    cudaStream_t s = (cudaStream_t)stream;
    wire_cptrs w;
    for (int j = 0; j < ECHO_MAX_RANKS; j++)
        w.p[j] = j < p->nranks ? gathered[j] : NULL;
    ECHO_CUDA_TRY(cudaMemsetAsync(state_of(c)->d_bad, 0xff, sizeof(unsigned long long), s));
    unsigned nb = blocks_for((p->count + 1) / 2);
    if (p->dt == ECHO_F32)
        echo_finish_kernel<<<nb, ECHO_THREADS, 0, s>>>(w, (float *)buf, p->count, p->shard, p->group,
                                                       state_of(c)->d_bad);
    else
        echo_finish_kernel<<<nb, ECHO_THREADS, 0, s>>>(w, (uint16_t *)buf, p->count, p->shard, p->group,
                                                       state_of(c)->d_bad);
    ECHO_CUDA_TRY(cudaGetLastError());
    return 0;
}

static int cuda_finish(echo_comm *c, const echo_plan *p, const uint8_t *const *gathered, void *buf, size_t *bad,
                       void *stream, char *err, size_t errlen) {
    if (finish_enqueue(c, p, gathered, buf, stream, err, errlen)) return -1;
    return read_bad(c, bad, (cudaStream_t)stream, err, errlen);
}

static int cuda_alloc(echo_comm *c, size_t bytes, void **out, char *err, size_t errlen) {
    *out = NULL;
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    ECHO_CUDA_TRY(cudaMalloc(out, bytes ? bytes : 1));
    ECHO_CUDA_TRY(cudaMemset(*out, 0, bytes));
    return 0;
}

static void cuda_free(echo_comm *c, void *p) {
    if (!p) return;
    cudaSetDevice(c->device);
    cudaFree(p);
}

static int cuda_comm_init(echo_comm *c, char *err, size_t errlen) {
    cuda_state *cs = (cuda_state *)calloc(1, sizeof *cs);
    if (!cs) {
        snprintf(err, errlen, "echo: out of memory");
        return -1;
    }
    c->compute_state = cs;
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    ECHO_CUDA_TRY(cudaMalloc((void **)&cs->d_bad, sizeof *cs->d_bad));
    ECHO_CUDA_TRY(cudaMallocHost((void **)&cs->h_bad, sizeof *cs->h_bad));
    return 0;
}

static void cuda_comm_fini(echo_comm *c) {
    cuda_state *cs = state_of(c);
    if (!cs) return;
    cudaSetDevice(c->device);
    if (cs->d_bad) cudaFree(cs->d_bad);
    if (cs->h_bad) cudaFreeHost(cs->h_bad);
    free(cs);
    c->compute_state = NULL;
}

extern "C" const echo_compute_ops echo_cuda_compute = {
    "cuda", cuda_phase1, cuda_phase2, cuda_finish, cuda_alloc, cuda_free, cuda_comm_init, cuda_comm_fini,
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
    ECHO_CUDA_TRY(cudaMemsetAsync(state_of(c)->d_bad, 0xff, sizeof(unsigned long long), s));
    if (n) {
        if (dt == ECHO_F32)
            echo_check_finite_kernel<<<blocks_stride(n), ECHO_THREADS, 0, s>>>((const float *)buf, n,
                                                                               state_of(c)->d_bad);
        else
            echo_check_finite_kernel<<<blocks_stride(n), ECHO_THREADS, 0, s>>>((const uint16_t *)buf, n,
                                                                               state_of(c)->d_bad);
        ECHO_CUDA_TRY(cudaGetLastError());
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
