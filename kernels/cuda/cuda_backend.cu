/*
 * cuda backend: creation, memory ops and the op table.
 *
 * Contract (twin of kernels/cpu/cpu_backend.c; see kernels/kernels.h):
 *   - act_dtype is KERN_BF16: activation buffers hold bf16, row-major; every
 *     op computes in fp32 and rounds to bf16 (round-to-nearest-even) once,
 *     when it stores a result.
 *   - alloc: device memory (cudaMalloc), zero-filled before it is returned
 *     (memset on the stream, then the stream is synchronised), NULL on
 *     failure with the reason in kern_last_error(). free: cudaFree after the
 *     stream drained.
 *   - upload_weight: copies the host view to new, DENSE device memory,
 *     honouring the view's row stride ld (0 = cols; a column slice of a
 *     row-major matrix has ld = the full matrix's cols and is gathered with
 *     cudaMemcpy2D; ld < cols is rejected). BF16 weights are copied as they
 *     are; F16 and F32 weights are CONVERTED TO BF16 on upload (on the
 *     device, in chunks of whole rows; F32 rounds to nearest even), so every
 *     device weight the ops see is a dense (rows, cols) bf16 matrix (ld 0)
 *     and the ops reject any other dtype or stride. The cpu twin keeps the
 *     host dtype and view; expect bf16-rounding differences for F32/F16
 *     checkpoints. free_weight releases the copy.
 *   - to_host_f32: widens bf16 -> f32 on the device into a scratch buffer,
 *     copies it to the host and synchronises the stream.
 *   - copy: device-to-device copy of n bf16 activations on the stream
 *     (overlapping ranges are allowed, like the cpu twin's memmove).
 *   - Host pointers in op arguments (token ids, positions, cache slots, the
 *     attention batch's arrays) are copied to the device by the op itself
 *     through a ring of pinned staging buffers, asynchronously; the caller
 *     may reuse or free them as soon as the op returns.
 *   - Ops enqueue work on the backend's stream and return without waiting;
 *     errors in kernels surface at the next synchronising call
 *     (to_host_f32, alloc, free).
 *   - kern_cuda_create fails with "no usable CUDA device found ...; use
 *     --device cpu" when there is no GPU or driver; it never crashes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

/* ---- kernels ---- */

__global__ void __launch_bounds__(CUDA_THREADS) cuda_f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void __launch_bounds__(CUDA_THREADS) cuda_f16_to_bf16_kernel(bf16 *dst, const __half *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(__half2float(src[i]));
}

__global__ void __launch_bounds__(CUDA_THREADS) cuda_bf16_to_f32_kernel(float *dst, const bf16 *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

/* ---- memory ops ---- */

static void *cuda_alloc(kern_backend *be, size_t bytes) {
    cuda_impl *impl = cuda_get(be);
    void *p = NULL;
    size_t rounded = (bytes + 255) & ~(size_t)255;
    if (!rounded) rounded = 256;
    if (cuda_enter(be)) return NULL;
    cudaError_t e = cudaMalloc(&p, rounded);
    if (e != cudaSuccess) {
        kern_fail(be, "cuda: %s:%d: cudaMalloc of %zu bytes: %s (%s)", __FILE__, __LINE__, bytes, cudaGetErrorName(e),
                  cudaGetErrorString(e));
        return NULL;
    }
    e = cudaMemsetAsync(p, 0, rounded, impl->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(impl->stream);
    if (e != cudaSuccess) {
        cuda_fail_rt(be, __FILE__, __LINE__, "cudaMemsetAsync(p, 0, rounded, impl->stream)", e);
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(kern_backend *be, void *p) {
    if (!p || cuda_enter(be)) return;
    cudaError_t e = cudaStreamSynchronize(cuda_get(be)->stream);
    if (e != cudaSuccess) cuda_fail_rt(be, __FILE__, __LINE__, "cudaStreamSynchronize(stream)", e);
    e = cudaFree(p);
    if (e != cudaSuccess) cuda_fail_rt(be, __FILE__, __LINE__, "cudaFree(p)", e);
}

#define UPLOAD_CHUNK_ELEMS ((size_t)16 << 20) /* source elements converted per step */

/* Rows r0 .. r0+nr-1 of a host view (cols values each, ld apart, es bytes a
 * value) to dense device memory at dst, on the stream. */
static int upload_rows(kern_backend *be, void *dst, const kern_weight *host, size_t ld, size_t es, size_t r0,
                       size_t nr) {
    cudaStream_t st = cuda_get(be)->stream;
    size_t cols = (size_t)host->cols;
    const char *src = (const char *)host->data + r0 * ld * es;
    if (ld == cols)
        CUDA_TRY(be, cudaMemcpyAsync(dst, src, nr * cols * es, cudaMemcpyHostToDevice, st));
    else
        CUDA_TRY(be, cudaMemcpy2DAsync(dst, cols * es, src, ld * es, cols * es, nr, cudaMemcpyHostToDevice, st));
    return 0;
}

static int cuda_upload_weight(kern_backend *be, const kern_weight *host, kern_weight *dev) {
    cuda_impl *impl = cuda_get(be);
    size_t es = kern_dtype_size(host->dtype);
    if (es == 0) return kern_fail(be, "cuda: unsupported weight dtype %d", (int)host->dtype);
    if (host->rows < 0 || host->cols < 0) return kern_fail(be, "cuda: bad weight shape");
    if (host->ld != 0 && host->ld < host->cols)
        return kern_fail(be, "cuda: weight row stride %lld is less than its %lld columns", (long long)host->ld,
                         (long long)host->cols);
    if (cuda_enter(be)) return -1;
    size_t rows = (size_t)host->rows, cols = (size_t)host->cols, ld = host->ld ? (size_t)host->ld : cols;
    size_t count = rows * cols;
    size_t bytes = count * sizeof(bf16);
    int rc = 0;
    void *d = NULL, *stage = NULL;
    CUDA_TRY_GOTO(be, cudaMalloc(&d, bytes ? bytes : 256), rc, fail);
    if (host->dtype == KERN_BF16) {
        if (count && upload_rows(be, d, host, ld, es, 0, rows)) goto fail_rc;
    } else if (count) {
        /* whole rows per step, so a strided view converts like a dense one */
        size_t chunk_rows = UPLOAD_CHUNK_ELEMS / cols;
        if (chunk_rows < 1) chunk_rows = 1;
        if (chunk_rows > rows) chunk_rows = rows;
        CUDA_TRY_GOTO(be, cudaMalloc(&stage, chunk_rows * cols * es), rc, fail);
        for (size_t r0 = 0; r0 < rows; r0 += chunk_rows) {
            size_t nr = rows - r0 < chunk_rows ? rows - r0 : chunk_rows, m = nr * cols;
            if (upload_rows(be, stage, host, ld, es, r0, nr)) goto fail_rc;
            bf16 *dst = (bf16 *)d + r0 * cols;
            if (host->dtype == KERN_F32)
                cuda_f32_to_bf16_kernel<<<cuda_blocks(m, CUDA_THREADS), CUDA_THREADS, 0, impl->stream>>>(
                    dst, (const float *)stage, m);
            else
                cuda_f16_to_bf16_kernel<<<cuda_blocks(m, CUDA_THREADS), CUDA_THREADS, 0, impl->stream>>>(
                    dst, (const __half *)stage, m);
            CUDA_TRY_GOTO(be, cudaGetLastError(), rc, fail);
        }
    }
    CUDA_TRY_GOTO(be, cudaStreamSynchronize(impl->stream), rc, fail);
    if (stage) CUDA_TRY_GOTO(be, cudaFree(stage), rc, fail);
    stage = NULL;
    dev->data = d;
    dev->dtype = KERN_BF16;
    dev->rows = host->rows;
    dev->cols = host->cols;
    dev->ld = 0; /* dense */
    return 0;
fail_rc:
    rc = -1;
fail:
    cudaStreamSynchronize(impl->stream);
    if (stage) cudaFree(stage);
    if (d) cudaFree(d);
    return rc;
}

static void cuda_free_weight(kern_backend *be, kern_weight *dev) {
    if (dev->data) cuda_free(be, (void *)dev->data);
    dev->data = NULL;
}

static int cuda_to_host_f32(kern_backend *be, float *dst, const void *src, size_t n) {
    cuda_impl *impl = cuda_get(be);
    void *tmp;
    if (cuda_no_graph(be, "to_host_f32")) return -1;
    if (n == 0) return 0;
    if (cuda_enter(be) || cuda_tmp_reserve(be, n * sizeof(float), &tmp)) return -1;
    cuda_bf16_to_f32_kernel<<<cuda_blocks(n, CUDA_THREADS), CUDA_THREADS, 0, impl->stream>>>((float *)tmp,
                                                                                             (const bf16 *)src, n);
    CUDA_LAUNCH_TRY(be, "cuda_bf16_to_f32_kernel");
    CUDA_TRY(be, cudaMemcpyAsync(dst, tmp, n * sizeof(float), cudaMemcpyDeviceToHost, impl->stream));
    CUDA_TRY(be, cudaStreamSynchronize(impl->stream));
    return 0;
}

static int cuda_copy(kern_backend *be, void *dst, const void *src, size_t n) {
    cuda_impl *impl = cuda_get(be);
    size_t bytes = n * sizeof(bf16);
    if (n == 0 || dst == src) return 0;
    if (cuda_enter(be)) return -1;
    if (cuda_replaying(be)) return 0; /* no staging: nothing else to do */
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d < s + bytes && s < d + bytes) { /* overlap: go through the scratch */
        void *tmp;
        if (cuda_tmp_reserve(be, bytes, &tmp)) return -1;
        CUDA_TRY(be, cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, impl->stream));
        CUDA_TRY(be, cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, impl->stream));
        return 0;
    }
    CUDA_TRY(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl->stream));
    return 0;
}

void *cuda_stream(kern_backend *be) {
    return (void *)cuda_get(be)->stream;
}

/* ---- op table, create, destroy ---- */

/* Positional (C++17 has no designated initializers): the order of kern_ops. */
static const kern_ops cuda_ops = {
    "cuda",             /* name */
    KERN_BF16,          /* act_dtype */
    cuda_alloc,         /* alloc */
    cuda_free,          /* free */
    cuda_upload_weight, /* upload_weight */
    cuda_free_weight,   /* free_weight */
    cuda_to_host_f32,   /* to_host_f32 */
    cuda_copy,          /* copy */
    cuda_embedding,     /* embedding */
    cuda_rmsnorm,       /* rmsnorm */
    cuda_matmul,        /* matmul */
    cuda_rope,          /* rope */
    cuda_kv_store,      /* kv_store */
    cuda_attention,     /* attention */
    cuda_silu_mul,      /* silu_mul */
    cuda_add,           /* add */
    cuda_add_bias,      /* add_bias */
    cuda_add_rmsnorm,   /* add_rmsnorm */
    cuda_qk_norm_rope,  /* qk_norm_rope */
    cuda_logits_topk,   /* logits_topk */
    cuda_stream,        /* stream */
    cuda_random_weight, /* random_weight */
    cuda_fuse_rows,     /* fuse_rows */
    cuda_graph_begin,   /* graph_begin */
    cuda_graph_end,     /* graph_end */
    cuda_graph_abort,   /* graph_abort */
    cuda_graph_launch,  /* graph_launch */
    cuda_graph_drop_all, /* graph_drop_all */
    NULL,               /* upload_quantized: bf16/f16/f32 weights only */
    NULL,               /* alloc_kv: alloc */
    NULL,               /* free_kv: free */
};

static int cuda_init(kern_backend *be) {
    cuda_impl *impl = cuda_get(be);
    cudaDeviceProp prop;
    CUDA_TRY(be, cudaSetDevice(impl->device));
    CUDA_TRY(be, cudaGetDeviceProperties(&prop, impl->device));
    if (prop.major < 8)
        return kern_fail(be,
                         "cuda device %d (%s) has compute capability %d.%d; the cuda backend needs 8.0 or newer "
                         "(bf16); use --device cpu",
                         impl->device, prop.name, prop.major, prop.minor);
    /* A device this build has no kernel image for fails here, not mid-run. */
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, cuda_bf16_to_f32_kernel);
    if (e != cudaSuccess)
        return kern_fail(be,
                         "cuda: no kernel image for device %d (%s, compute capability %d.%d): %s; rebuild "
                         "with a matching -gencode or use --device cpu",
                         impl->device, prop.name, prop.major, prop.minor, cudaGetErrorString(e));
    CUDA_TRY(be, cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
    LT_TRY(be, cublasLtCreate(&impl->lt));
    CUDA_TRY(be, cudaMalloc(&impl->workspace, CUDA_WORKSPACE_BYTES));
    impl->workspace_bytes = CUDA_WORKSPACE_BYTES;
    impl->sm_count = prop.multiProcessorCount;
    for (int i = 0; i < CUDA_STAGE_SLOTS; i++)
        CUDA_TRY(be, cudaEventCreateWithFlags(&impl->stage[i].copied, cudaEventDisableTiming));
    return 0;
}

extern "C" int kern_cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: not an error here */
        return 0;
    }
    return count;
}

/* Free and total memory of one device, for the KV budget
 * (--gpu-memory-utilization): selects the device on the calling thread, as
 * kern_cuda_create does before its first allocation. */
extern "C" int kern_cuda_mem_info(int device_index, size_t *free_bytes, size_t *total_bytes, char *err,
                                  size_t errlen) {
    *free_bytes = *total_bytes = 0;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || device_index < 0 || device_index >= count) {
        snprintf(err, errlen, "cuda device %d: %s", device_index,
                 e != cudaSuccess ? cudaGetErrorString(e) : "no such device");
        cudaGetLastError();
        return -1;
    }
    if ((e = cudaSetDevice(device_index)) != cudaSuccess || (e = cudaMemGetInfo(free_bytes, total_bytes)) != cudaSuccess) {
        snprintf(err, errlen, "cuda device %d: cudaMemGetInfo: %s", device_index, cudaGetErrorString(e));
        cudaGetLastError();
        return -1;
    }
    return 0;
}

extern "C" int kern_cuda_create(int device_index, kern_backend **out, char *err, size_t errlen) {
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        snprintf(err, errlen, "no usable CUDA device found (%s); use --device cpu",
                 e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices");
        cudaGetLastError(); /* clear the error for later callers */
        return -1;
    }
    if (device_index < 0 || device_index >= count) {
        snprintf(err, errlen, "cuda device %d does not exist (%d device%s found)", device_index, count,
                 count == 1 ? "" : "s");
        return -1;
    }
    kern_backend *be = (kern_backend *)calloc(1, sizeof *be);
    cuda_impl *impl = (cuda_impl *)calloc(1, sizeof *impl);
    if (!be || !impl) {
        free(be);
        free(impl);
        snprintf(err, errlen, "cuda backend: out of memory");
        return -1;
    }
    be->ops = &cuda_ops;
    be->impl = impl;
    impl->device = device_index;
    if (cuda_init(be) != 0) {
        snprintf(err, errlen, "cuda backend: %s", be->err);
        kern_cuda_destroy(be);
        return -1;
    }
    *out = be;
    return 0;
}

extern "C" void kern_cuda_destroy(kern_backend *be) {
    if (!be) return;
    cuda_impl *impl = cuda_get(be);
    if (impl) {
        cudaSetDevice(impl->device);
        if (impl->stream) cudaStreamSynchronize(impl->stream);
        cuda_graphs_free(impl);
        cuda_mm_plans_clear(impl);
        if (impl->lt) cublasLtDestroy(impl->lt);
        if (impl->workspace) cudaFree(impl->workspace);
        cuda_stage_free(impl);
        for (int i = 0; i < CUDA_STAGE_SLOTS; i++)
            if (impl->stage[i].copied) cudaEventDestroy(impl->stage[i].copied);
        if (impl->tmp) cudaFree(impl->tmp);
        if (impl->rope_inv_freq) cudaFree(impl->rope_inv_freq);
        if (impl->att_part) cudaFree(impl->att_part);
        if (impl->stream) cudaStreamDestroy(impl->stream);
        free(impl);
    }
    free(be);
}
