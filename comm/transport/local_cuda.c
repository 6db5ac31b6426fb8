/*
 * comm/transport/local_cuda.c — the `local` transport on device memory: the ranks are
 * threads of this process that share one GPU (for tests of tensor
 * parallelism on a single device). local.c runs the schedule, barriers and
 * agreement checks exactly as on host memory; this file supplies the device
 * side of its echo_local_mem table (cudaMalloc'd buffers on the world's GPU,
 * a stream synchronisation before every barrier, the exact path's sum and
 * store kernels from echo_cuda.cu), and the codec work is echo_cuda_compute.
 * Same schedule and the same inline codec arithmetic as the host transport,
 * so both give the same bits.
 *
 * Correctness over speed: every barrier costs a stream synchronisation, and
 * all ranks' kernels share the GPU.
 *
 * Status: compiles and links; it has not run on a GPU yet
 * (tests/gpu/test_cuda_comm.c is the check). Without CUDA the file provides
 * echo_world_create_local_device as a clear failure.
 */
#include <stdio.h>
#include <stdlib.h>

#include "comm/echo_internal.h"
#include "comm/transport/transport.h"

#ifndef ECHO_HAVE_CUDA

int echo_world_create_local_device(int nranks, int device, const echo_config *cfg, echo_world **out, char *err,
                                   size_t errlen) {
    (void)nranks, (void)device, (void)cfg;
    *out = NULL;
    snprintf(err, errlen,
             "echo: the local transport on device memory needs a build with CUDA (make CUDA=1); this build has "
             "none: use echo_world_create_local (ranks on host memory)");
    return -1;
}

#else

#include <cuda_runtime.h>

/* Threads may differ from call to call: select the device every time. */
static int dev_alloc(int device, size_t bytes, void **out, char *err, size_t errlen) {
    *out = NULL;
    ECHO_CUDA_TRY(cudaSetDevice(device));
    ECHO_CUDA_TRY(cudaMalloc(out, bytes ? bytes : 1));
    return 0;
}

static void dev_free(int device, void *p) {
    if (!p) return;
    cudaSetDevice(device);
    cudaFree(p);
}

/* Everything this rank enqueued (the caller's kernels that produced its
 * buffer, its phase kernels) is complete: peers may read what it wrote, and
 * it has finished reading theirs. */
static int dev_sync(echo_comm *c, void *stream, char *err, size_t errlen) {
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    ECHO_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return 0;
}

static const echo_local_mem local_device_mem = {
    .device_memory = 1,
    .alloc = dev_alloc,
    .free = dev_free,
    .sync = dev_sync,
    .sum = echo_cuda_sum_ranks,
    .store = echo_cuda_store_checked,
};

int echo_world_create_local_device(int nranks, int device, const echo_config *cfg, echo_world **out, char *err,
                                   size_t errlen) {
    *out = NULL;
    if (device < 0) {
        snprintf(err, errlen, "echo: local device transport: device %d is not a GPU index", device);
        return -1;
    }
    /* A sanity bound far above any activation message (2^36 values); the
     * codec kernels are grid-stride, so it is not a launch limit. */
    if (cfg && cfg->max_count > ((size_t)1 << 36)) {
        snprintf(err, errlen, "echo: local device transport: max_count %zu exceeds 2^36", cfg->max_count);
        return -1;
    }
    /* Configuration errors first, whatever the machine has. */
    echo_world *probe;
    if (echo_world_alloc(nranks, cfg, &probe, err, errlen)) return -1;
    echo_world_free(probe);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        snprintf(err, errlen,
                 "echo: local device transport: no usable CUDA device found (%s); use echo_world_create_local "
                 "(ranks on host memory)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices");
        cudaGetLastError(); /* clear the error for later callers */
        return -1;
    }
    if (device >= count) {
        snprintf(err, errlen, "echo: local device transport: cuda device %d does not exist (%d device%s found)", device,
                 count, count == 1 ? "" : "s");
        return -1;
    }
    ECHO_CUDA_TRY(cudaSetDevice(device));
    return echo_local_world_create(nranks, device, &local_device_mem, &echo_cuda_compute, cfg, out, err, errlen);
}

#endif
