/*
 * Private to kernels/cuda/: the cuda backend's state, the error-check
 * macros and the helpers the op files share. C++ (nvcc) only.
 *
 * Every CUDA runtime and cuBLASLt call goes through a check macro that, on
 * failure, records "cuda: FILE:LINE: CALL: ERROR_NAME (library message)"
 * into the backend's last-error buffer via kern_fail() and returns -1 (the
 * _GOTO variants set a status variable and jump to a cleanup label instead).
 * Nothing here exits or aborts.
 *
 * There is no file-scope device state: the device index, stream, cuBLASLt
 * handle and workspace, staging buffers and caches all live in cuda_impl,
 * one per backend (one per rank). Every entry point first makes the
 * backend's device current (cuda_enter), since a backend may be created on
 * one host thread and driven from another.
 */
#ifndef ECHO_KERNELS_CUDA_H
#define ECHO_KERNELS_CUDA_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* nvcc is not given -DECHO_HAVE_CUDA (only the C files are); this backend
 * needs the kern_cuda_* declarations, with C linkage. */
#ifndef ECHO_HAVE_CUDA
#define ECHO_HAVE_CUDA 1
#endif
extern "C" {
#include "kernels/backend_internal.h"
}

typedef __nv_bfloat16 bf16;

/* ---- error checks ---- */

/* A runtime call's error, reported here. It is also the thread's "last
 * error" until read, which the next launch check (cudaGetLastError) would
 * then report as its own: clear it (an error that is sticky stays, every
 * later call returns it). */
static inline int cuda_fail_rt(kern_backend *be, const char *file, int line, const char *call, cudaError_t e) {
    cudaGetLastError();
    return kern_fail(be, "cuda: %s:%d: %s: %s (%s)", file, line, call, cudaGetErrorName(e), cudaGetErrorString(e));
}

static inline int cuda_fail_lt(kern_backend *be, const char *file, int line, const char *call, cublasStatus_t s) {
    return kern_fail(be, "cuda: %s:%d: %s: %s (%s)", file, line, call, cublasLtGetStatusName(s),
                     cublasLtGetStatusString(s));
}

/* CUDA runtime call; on failure record it and return -1. */
#define CUDA_TRY(be, call)                                                                                             \
    do {                                                                                                               \
        cudaError_t cuda_try_e_ = (call);                                                                              \
        if (cuda_try_e_ != cudaSuccess) return cuda_fail_rt((be), __FILE__, __LINE__, #call, cuda_try_e_);             \
    } while (0)

/* CUDA runtime call; on failure record it, set rc = -1 and goto label. */
#define CUDA_TRY_GOTO(be, call, rc, label)                                                                             \
    do {                                                                                                               \
        cudaError_t cuda_try_e_ = (call);                                                                              \
        if (cuda_try_e_ != cudaSuccess) {                                                                              \
            (rc) = cuda_fail_rt((be), __FILE__, __LINE__, #call, cuda_try_e_);                                         \
            goto label;                                                                                                \
        }                                                                                                              \
    } while (0)

/* cuBLASLt call; on failure record it and return -1. */
#define LT_TRY(be, call)                                                                                               \
    do {                                                                                                               \
        cublasStatus_t lt_try_s_ = (call);                                                                             \
        if (lt_try_s_ != CUBLAS_STATUS_SUCCESS) return cuda_fail_lt((be), __FILE__, __LINE__, #call, lt_try_s_);       \
    } while (0)

/* cuBLASLt call; on failure record it, set rc = -1 and goto label. */
#define LT_TRY_GOTO(be, call, rc, label)                                                                               \
    do {                                                                                                               \
        cublasStatus_t lt_try_s_ = (call);                                                                             \
        if (lt_try_s_ != CUBLAS_STATUS_SUCCESS) {                                                                      \
            (rc) = cuda_fail_lt((be), __FILE__, __LINE__, #call, lt_try_s_);                                           \
            goto label;                                                                                                \
        }                                                                                                              \
    } while (0)

/* After a <<<...>>> launch: a bad configuration or missing kernel image is
 * reported here (faults inside the kernel surface at the next sync). */
#define CUDA_LAUNCH_TRY(be, kernel_name)                                                                               \
    do {                                                                                                               \
        cudaError_t cuda_try_e_ = cudaGetLastError();                                                                  \
        if (cuda_try_e_ != cudaSuccess)                                                                                \
            return cuda_fail_rt((be), __FILE__, __LINE__, "launch " kernel_name, cuda_try_e_);                         \
    } while (0)

/* ---- state ---- */

/* One cached cuBLASLt plan: descriptors plus the heuristic's algorithm for
 * one (m, n, k, pointer alignments) problem. dtypes are fixed (bf16 A/B/C/D,
 * fp32 compute and scale), so they are not part of the key. */
typedef struct cuda_mm_plan {
    int64_t m, n, k;
    uint32_t align_a, align_b, align_c;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    unsigned long long last_used;
} cuda_mm_plan;

#define CUDA_MM_PLANS 64

/* Staging for host int32 arrays (token ids, positions, cache slots, the
 * attention batch tables): a ring of pinned host + device buffer pairs, each
 * grown on its own when an array does not fit. A slot's event marks the end
 * of its last host->device copy; the pinned buffer is rewritten only after
 * it fired, and a slot's buffers are reallocated only after the stream
 * drained (kernels enqueued earlier may still read the device copy). A
 * staging whose values some slot already holds reuses that slot. */
typedef struct cuda_stage_slot {
    int32_t *host; /* pinned, cap values */
    int32_t *dev;  /* cap values */
    size_t cap;
    cudaEvent_t copied;
    size_t n; /* values of the last completed staging, 0 while being filled */
} cuda_stage_slot;

#define CUDA_STAGE_SLOTS 8
#define CUDA_WORKSPACE_BYTES ((size_t)32 << 20)

/* Graphs (kern_ops.graph_begin/end/launch/abort, cuda_graph.cu). A decode
 * step of one batch shape is captured once and then replayed: on replay the
 * model issues its usual op sequence, every op validates and fills its
 * staged arrays exactly as during the capture, and skips its launches
 * (cuda_replaying); graph_end then instantiates the capture or checks the
 * replay's stagings, and graph_launch uploads the staged arrays and
 * launches the graph. While in graph mode, staging does not use the ring:
 * it bump-allocates in the graph's ARENA (pinned host + device, in call
 * order), so every array lands at the address the captured kernels read. A
 * staging equal to an earlier one of the step (every layer stages the same
 * positions, cache slots and attention tables) is not stored again: the
 * capture records it as an alias, the kernels read the earlier copy, and a
 * replay checks that the values are still equal (else "diverged"). One copy
 * of the used prefix precedes each launch (outside the graph, in stream
 * order); the host rewrites the arena only after the
 * event recorded behind that copy fired. The capture records each
 * staging's (offset, values); a replay must stage exactly that sequence,
 * else "graph replay diverged" (the op fails, the caller runs eagerly and
 * the graph is dropped). */
typedef struct cuda_graph_stage {
    uint32_t off, n; /* int32 values */
    uint32_t alias;  /* 1: the values of the earlier staging at off, not stored again */
} cuda_graph_stage;

typedef struct cuda_graph {
    uint64_t key;
    int used_slot;          /* 1: the entry holds a key (a graph, or a failure count) */
    cudaGraphExec_t exec;   /* NULL until a capture succeeded */
    unsigned long long epoch; /* impl->graph_epoch when captured */
    int failures;           /* failed captures (an arena too small does not count) */
    int32_t *host, *dev;    /* the arena: cap values each */
    size_t cap, need;       /* need: values a capture wanted (grow before the next) */
    cudaEvent_t copied;     /* after the last upload of the arena */
    int copied_valid;
    cuda_graph_stage *rec;  /* the capture's stagings */
    size_t nrec, rec_cap;
    unsigned long long last_used;
} cuda_graph;

#define CUDA_GRAPHS 16
#define CUDA_GRAPH_MAX_FAILURES 2
#define CUDA_GRAPH_ARENA_MIN ((size_t)1 << 16) /* values */

enum { CUDA_GRAPH_OFF = 0, CUDA_GRAPH_CAPTURE, CUDA_GRAPH_REPLAY };

typedef struct cuda_impl {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;

    cuda_mm_plan plans[CUDA_MM_PLANS];
    int nplans;
    unsigned long long plan_tick;

    cuda_stage_slot stage[CUDA_STAGE_SLOTS];
    int stage_next; /* next slot to fill */

    void *tmp; /* device scratch: to_host_f32, overlapping copies */
    size_t tmp_bytes;

    float *rope_inv_freq; /* device, head_dim/2 values for (rope_key, rope_hd) */
    kern_rope rope_key;
    int rope_hd;

    int sm_count;          /* multiprocessors of the device: sizes attention's split-K */
    float *att_part;       /* device scratch: split-K partials of attention (cuda_attention.cu) */
    size_t att_part_bytes;
    unsigned att_smem_set; /* attention kernels whose large dynamic shared memory is enabled (bit per kernel) */

    /* graphs (cuda_graph.cu) */
    cuda_graph graphs[CUDA_GRAPHS];
    unsigned long long graph_tick;
    /* Bumped whenever a device buffer that captured kernels may address
     * is reallocated (tmp, att_part, the rope table): graphs captured
     * under an older epoch are re-captured. */
    unsigned long long graph_epoch;
    int graph_mode;       /* CUDA_GRAPH_OFF / _CAPTURE / _REPLAY */
    cuda_graph *graph_cur; /* the entry of the current capture or replay */
    size_t graph_used;    /* arena values handed out in this step */
    size_t graph_rec_i;   /* replay: stagings consumed */
    size_t graph_pending; /* offset of the staging between begin and commit */
    int graph_overflow;   /* capture: the arena was too small (the capture is measured, then discarded) */
    int32_t *graph_spill; /* host (malloc): where stagings beyond the arena go during such a capture */
    cuda_graph *graph_ready; /* graph_end succeeded, graph_launch not yet called */
    int graph_ready_fresh;   /* ... and it was captured in this step */
    size_t graph_spill_cap;
} cuda_impl;

static inline cuda_impl *cuda_get(kern_backend *be) {
    return (cuda_impl *)be->impl;
}

/* Make the backend's device current on the calling thread. */
static inline int cuda_enter(kern_backend *be) {
    CUDA_TRY(be, cudaSetDevice(cuda_get(be)->device));
    return 0;
}

/* The sum of v over the block, returned to every thread (rmsnorm and the
 * fused norm reduce the same way). blockDim.x is a multiple of 32 (the
 * shuffles use a full mask) and at most 1024; every thread of the block
 * must call it (again after a call is fine: each write follows a barrier
 * that every read of the previous call precedes). */
static __device__ __forceinline__ float cuda_block_sum(float v) {
    __shared__ float warp_sums[32];
    __shared__ float total;
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < nwarps ? warp_sums[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

/* In graph replay: the op has done its host work (validation, staging) and
 * must now return 0 without launching or copying anything; the graph holds
 * its launches. Checked by every op right before its first launch. */
static inline int cuda_replaying(kern_backend *be) {
    return cuda_get(be)->graph_mode == CUDA_GRAPH_REPLAY;
}

/* Ops that synchronise or copy to the host cannot be part of a graph. */
static inline int cuda_no_graph(kern_backend *be, const char *op) {
    if (cuda_get(be)->graph_mode != CUDA_GRAPH_OFF) return kern_fail(be, "%s: not allowed inside a cuda graph", op);
    return 0;
}

/* Threads per block of the element-wise and per-row kernels. Every kernel
 * declares its largest block with __launch_bounds__, so ptxas keeps its
 * registers within what one block of that size may use (a launch beyond
 * the bound is refused; the CUDA emulator of tests/emu aborts on it). */
#define CUDA_THREADS 256

/* Blocks for a 1-D grid-stride launch over `count` elements. */
static inline unsigned cuda_blocks(size_t count, unsigned threads) {
    size_t b = (count + threads - 1) / threads;
    if (b > (1u << 20)) b = 1u << 20;
    return b ? (unsigned)b : 1u;
}

/* Copy n host int32 values to the device (asynchronously, on the stream);
 * kernels enqueued on the stream from now until the ring comes back to the
 * slot behind *dev (at least CUDA_STAGE_SLOTS - 1 further stagings) read
 * these values, even when they run later (stream order). The host array may
 * be reused as soon as this returns. cuda_common.cu. */
int cuda_stage_i32(kern_backend *be, const int32_t *host, size_t n, const int32_t **dev);
/* The same in two steps, for arrays built in place: cuda_stage_begin returns
 * a pinned host buffer of at least n values (valid until the commit), the
 * caller fills n values, and cuda_stage_commit enqueues the copy. Nothing
 * may be staged between the two calls. cuda_common.cu. */
int cuda_stage_begin(kern_backend *be, size_t n, int32_t **host);
int cuda_stage_commit(kern_backend *be, size_t n, const int32_t **dev);
/* Ensure the device scratch holds `bytes`. cuda_common.cu. */
int cuda_tmp_reserve(kern_backend *be, size_t bytes, void **p);
/* Reject weights that did not come from upload_weight (bf16, dense).
 * cuda_common.cu. */
int cuda_check_weight(kern_backend *be, const char *op, const kern_weight *w);
/* Free the staging ring's buffers (not its events). cuda_common.cu. */
void cuda_stage_free(cuda_impl *impl);

/* The device table inv_freq[i] = kern_rope_inv_freq(rope, i, head_dim),
 * i < head_dim/2, computed on the host (so bit-identical to the cpu twin)
 * and cached in cuda_impl per (rope, head_dim); a change of either
 * synchronises the stream before the old table is freed. The pointer stays
 * valid until the next call with other values. Shared by rope and
 * qk_norm_rope, so both rotate by the same angles. Rejects an invalid rope
 * (kern_rope_invalid), naming `op`. cuda_rope.cu. */
int cuda_rope_table(kern_backend *be, const char *op, const kern_rope *rope, int head_dim, const float **table);

/* Graphs. cuda_graph.cu. Staging in graph mode (called by
 * cuda_stage_begin/commit), the op-table entries and teardown. */
int cuda_graph_stage_begin(kern_backend *be, size_t n, int32_t **host);
int cuda_graph_stage_commit(kern_backend *be, size_t n, const int32_t **dev);
int cuda_graph_begin(kern_backend *be, uint64_t key, int *replaying);
int cuda_graph_end(kern_backend *be);
void cuda_graph_abort(kern_backend *be);
int cuda_graph_launch(kern_backend *be);
void cuda_graph_drop_all(kern_backend *be);
void cuda_graphs_free(cuda_impl *impl);

/* Release every cached cuBLASLt plan. cuda_matmul.cu. */
void cuda_mm_plans_clear(cuda_impl *impl);

/* The ops, one file per family (names mirror kernels/cpu/). */
int cuda_embedding(kern_backend *be, void *out, const kern_weight *table, const int32_t *ids, int n);
int cuda_rmsnorm(kern_backend *be, void *out, const void *in, const kern_weight *w, int rows, int dim, float eps);
int cuda_matmul(kern_backend *be, void *out, const void *in, const kern_weight *w, int n);
int cuda_rope(kern_backend *be, void *x, const int32_t *pos, int n, int heads, int head_dim, const kern_rope *rope);
int cuda_kv_store(kern_backend *be, void *kc, void *vc, const void *k, const void *v, const int32_t *slots, int n,
                  int hkv, int hd, kern_kv_dtype dt);
int cuda_attention(kern_backend *be, void *out, const void *q, const void *kc, const void *vc, const kern_attn_batch *b,
                   int hq, int hkv, int hd, float scale, kern_kv_dtype dt);
int cuda_silu_mul(kern_backend *be, void *out, const void *gate, const void *up, size_t count);
int cuda_add(kern_backend *be, void *x, const void *y, size_t count);
int cuda_add_bias(kern_backend *be, void *x, const kern_weight *b, int rows, int dim);
int cuda_add_rmsnorm(kern_backend *be, void *x, const void *y, void *out, const kern_weight *w, int rows, int dim,
                     float eps);
int cuda_qk_norm_rope(kern_backend *be, void *q, void *k, const kern_weight *qw, const kern_weight *kw,
                      const int32_t *pos, int n, int hq, int hkv, int hd, float eps, const kern_rope *rope);
int cuda_logits_topk(kern_backend *be, const void *logits, int rows, int vocab, int k, int32_t *ids, float *vals,
                     float *lse);
void *cuda_stream(kern_backend *be);
int cuda_random_weight(kern_backend *be, kern_weight *dev, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                       int64_t full_cols, uint64_t seed, float offset, float scale);
int cuda_fuse_rows(kern_backend *be, const kern_weight *const *parts, int n_parts, kern_weight *out);

#endif
