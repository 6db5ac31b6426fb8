/*
 * comm/nccl.c — the `nccl` transport: one GPU per rank, all driven from
 * this process (communicators from ncclCommInitAll), buffers and residuals in
 * device memory, codec work by the cuda compute (echo_cuda.cu).
 *
 *   phase 1  grouped ncclSend/ncclRecv of the shard messages (all-to-all)
 *   phase 2  in-place ncclAllGather of the owners' messages
 *   exact    ncclAllReduce in the activation dtype; with a carried residual
 *            the sum is taken in fp32 (input widened, residual added,
 *            result rounded back) so the residual is not rounded away
 * Everything is enqueued on the caller's stream; the call synchronises it
 * once at the end to learn whether a value was not finite (every rank
 * decodes the same bytes, so all ranks agree).
 *
 * Status: compiles and links in CI; it runs only where GPUs are (no GPU was
 * available while it was written). track_error is not supported here.
 * Without CUDA the file provides echo_world_create_nccl as a clear failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/echo_internal.h"

#ifndef ECHO_HAVE_CUDA

int echo_world_create_nccl(int nranks, const int *devices, const echo_config *cfg, echo_world **out, char *err,
                           size_t errlen) {
    (void)nranks, (void)devices, (void)cfg;
    *out = NULL;
    snprintf(err, errlen, "echo: the nccl transport needs a build with CUDA (make CUDA=1)");
    return -1;
}

#else

#include <cuda_runtime.h>
#include <nccl.h>

typedef struct nccl_world {
    int devices[ECHO_MAX_RANKS];
    ncclComm_t comms[ECHO_MAX_RANKS];
    size_t stride; /* bytes between phase-1 messages (cache-line rounded) */
} nccl_world;

typedef struct nccl_rank {
    uint8_t *send;   /* N * stride: phase-1 messages out */
    uint8_t *recv;   /* N * stride: phase-1 messages in */
    uint8_t *gather; /* N * stride: phase-2 all-gather buffer */
    float *wide;     /* exact path with a carried residual: fp32 copy (exact_max values) */
} nccl_rank;

static int nccl_fail(char *err, size_t errlen, const char *file, int line, const char *call, ncclResult_t r) {
    snprintf(err, errlen, "nccl: %s:%d: %s: %s", file, line, call, ncclGetErrorString(r));
    return -1;
}

static int cuda_fail(char *err, size_t errlen, const char *file, int line, const char *call, cudaError_t e) {
    snprintf(err, errlen, "cuda: %s:%d: %s: %s (%s)", file, line, call, cudaGetErrorName(e), cudaGetErrorString(e));
    return -1;
}

#define NCCL_TRY(call)                                                                                                 \
    do {                                                                                                               \
        ncclResult_t nccl_r_ = (call);                                                                                 \
        if (nccl_r_ != ncclSuccess) return nccl_fail(err, errlen, __FILE__, __LINE__, #call, nccl_r_);                 \
    } while (0)

#define CUDA_TRY(call)                                                                                                 \
    do {                                                                                                               \
        cudaError_t cuda_e_ = (call);                                                                                  \
        if (cuda_e_ != cudaSuccess) return cuda_fail(err, errlen, __FILE__, __LINE__, #call, cuda_e_);                 \
    } while (0)

static nccl_world *nw_of(const echo_comm *c) {
    return c->w->tp_world;
}
static nccl_rank *nr_of(const echo_comm *c) {
    return c->tp_comm;
}
static ncclComm_t comm_of(const echo_comm *c) {
    return nw_of(c)->comms[c->rank];
}

static int nccl_comm_init(echo_comm *c, char *err, size_t errlen) {
    nccl_world *nw = nw_of(c);
    const echo_world *w = c->w;
    nccl_rank *nr = calloc(1, sizeof *nr);
    if (!nr) {
        snprintf(err, errlen, "echo: out of memory");
        return -1;
    }
    c->tp_comm = nr;
    c->device = nw->devices[c->rank];
    CUDA_TRY(cudaSetDevice(c->device));
    size_t N = (size_t)w->nranks;
    if (w->cfg.mode != ECHO_MODE_EXACT) {
        CUDA_TRY(cudaMalloc((void **)&nr->send, N * nw->stride));
        CUDA_TRY(cudaMalloc((void **)&nr->recv, N * nw->stride));
        CUDA_TRY(cudaMalloc((void **)&nr->gather, N * nw->stride));
    }
    if (w->cfg.mode == ECHO_MODE_ECHO && w->exact_max > 0)
        CUDA_TRY(cudaMalloc((void **)&nr->wide, w->exact_max * sizeof(float)));
    return 0;
}

static void nccl_comm_fini(echo_comm *c) {
    nccl_rank *nr = nr_of(c);
    if (!nr) return;
    cudaSetDevice(c->device);
    cudaFree(nr->send);
    cudaFree(nr->recv);
    cudaFree(nr->gather);
    cudaFree(nr->wide);
    free(nr);
    c->tp_comm = NULL;
}

static void nccl_world_fini(echo_world *w) {
    nccl_world *nw = w->tp_world;
    if (!nw) return;
    for (int r = 0; r < w->nranks; r++)
        if (nw->comms[r]) ncclCommDestroy(nw->comms[r]);
    free(nw);
    w->tp_world = NULL;
}

static uint8_t *nccl_p1_send(echo_comm *c, int peer) {
    return nr_of(c)->send + (size_t)peer * nw_of(c)->stride;
}

static const uint8_t *nccl_p1_recv(echo_comm *c, int peer) {
    return nr_of(c)->recv + (size_t)peer * nw_of(c)->stride;
}

static int nccl_p1_exchange(echo_comm *c, const echo_plan *p, const echo_call *call, void *stream, char *err,
                            size_t errlen) {
    (void)call; /* ranks cannot compare calls without another collective; NCCL hangs on mismatches */
    nccl_rank *nr = nr_of(c);
    size_t stride = nw_of(c)->stride;
    cudaStream_t s = stream;
    NCCL_TRY(ncclGroupStart());
    for (int j = 0; j < p->nranks; j++) {
        if (j == c->rank) continue;
        NCCL_TRY(ncclSend(nr->send + (size_t)j * stride, p->wire, ncclUint8, j, comm_of(c), s));
        NCCL_TRY(ncclRecv(nr->recv + (size_t)j * stride, p->wire, ncclUint8, j, comm_of(c), s));
    }
    NCCL_TRY(ncclGroupEnd());
    return 0;
}

/* The all-gather places owner j's message at j * wire. */
static uint8_t *nccl_p2_send(echo_comm *c, const echo_plan *p) {
    return nr_of(c)->gather + (size_t)c->rank * p->wire;
}

static const uint8_t *nccl_p2_recv(echo_comm *c, const echo_plan *p, int owner) {
    return nr_of(c)->gather + (size_t)owner * p->wire;
}

static int nccl_p2_exchange(echo_comm *c, const echo_plan *p, void *stream, char *err, size_t errlen) {
    nccl_rank *nr = nr_of(c);
    NCCL_TRY(ncclAllGather(nr->gather + (size_t)c->rank * p->wire, nr->gather, p->wire, ncclUint8, comm_of(c),
                           (cudaStream_t)stream));
    return 0;
}

static int nccl_exact(echo_comm *c, const echo_plan *p, const echo_call *call, void *buf, double *ref, size_t *bad,
                      void *stream, char *err, size_t errlen) {
    (void)ref;
    nccl_rank *nr = nr_of(c);
    cudaStream_t s = stream;
    CUDA_TRY(cudaSetDevice(c->device));
    if (call->res) {
        if (echo_cuda_widen_add(c, buf, p->dt, call->res, nr->wide, p->count, stream, err, errlen)) return -1;
        NCCL_TRY(ncclAllReduce(nr->wide, nr->wide, p->count, ncclFloat32, ncclSum, comm_of(c), s));
        if (echo_cuda_narrow(c, nr->wide, buf, p->dt, p->count, stream, err, errlen)) return -1;
    } else {
        NCCL_TRY(
            ncclAllReduce(buf, buf, p->count, p->dt == ECHO_F32 ? ncclFloat32 : ncclBfloat16, ncclSum, comm_of(c), s));
    }
    return echo_cuda_check_finite(c, buf, p->dt, p->count, bad, stream, err, errlen);
}

static const echo_transport_ops nccl_ops = {
    .name = "nccl",
    .device_memory = 1,
    .comm_init = nccl_comm_init,
    .comm_fini = nccl_comm_fini,
    .world_fini = nccl_world_fini,
    .p1_send = nccl_p1_send,
    .p1_exchange = nccl_p1_exchange,
    .p1_recv = nccl_p1_recv,
    .p2_send = nccl_p2_send,
    .p2_exchange = nccl_p2_exchange,
    .p2_recv = nccl_p2_recv,
    .exact = nccl_exact,
    .exact_ref = NULL,
};

int echo_world_create_nccl(int nranks, const int *devices, const echo_config *cfg, echo_world **out, char *err,
                           size_t errlen) {
    echo_world *w;
    *out = NULL;
    if (!devices) {
        snprintf(err, errlen, "echo: nccl transport: no device list");
        return -1;
    }
    if (cfg && cfg->track_error) {
        snprintf(err, errlen, "echo: track_error needs the local transport (the nccl one has no fp64 reference)");
        return -1;
    }
    /* A sanity bound far above any activation message (2^36 values); the
     * codec kernels are grid-stride, so it is not a launch limit. */
    if (cfg && cfg->max_count > ((size_t)1 << 36)) {
        snprintf(err, errlen, "echo: nccl transport: max_count %zu exceeds 2^36", cfg->max_count);
        return -1;
    }
    if (echo_world_alloc(nranks, cfg, &w, err, errlen)) return -1;
    w->tp = &nccl_ops;
    w->compute = &echo_cuda_compute;
    nccl_world *nw = calloc(1, sizeof *nw);
    if (!nw) {
        snprintf(err, errlen, "echo: out of memory");
        echo_world_free(w);
        return -1;
    }
    w->tp_world = nw;
    nw->stride = (w->max_plan.wire + 255) / 256 * 256;
    for (int r = 0; r < nranks; r++)
        nw->devices[r] = devices[r];
    ncclResult_t rc = ncclCommInitAll(nw->comms, nranks, nw->devices);
    if (rc != ncclSuccess) {
        snprintf(err, errlen, "nccl: ncclCommInitAll over %d devices: %s", nranks, ncclGetErrorString(rc));
        memset(nw->comms, 0, sizeof nw->comms);
        echo_world_destroy(w);
        return -1;
    }
    *out = w;
    return 0;
}

#endif
