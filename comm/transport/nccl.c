/*
 * comm/transport/nccl.c — the `nccl` transport: one GPU per rank, all driven from
 * this process (communicators from ncclCommInitAll), buffers and residuals in
 * device memory, codec work by the cuda compute (echo_cuda.cu).
 *
 *   phase 1  grouped ncclSend/ncclRecv of the shard messages (all-to-all)
 *   phase 2  in-place ncclAllGather of the owners' messages
 *   exact    ncclAllReduce in the activation dtype; with a carried residual
 *            the sum is taken in fp32 (input widened, residual added,
 *            result rounded back) so the residual is not rounded away
 * Everything is enqueued on the caller's stream; the call waits for it
 * once at the end, by polling (nccl_wait), so that an abort can end the
 * wait, then reads whether a value was not finite (every rank decodes the
 * same bytes, so all ranks agree). int4/echo calls move only bytes through
 * NCCL, so they give the bits of the local transport; exact calls sum in
 * NCCL's order. In a deferred world (echo_config.deferred) calls only
 * enqueue: non-finite results go to a flag per site, and echo_end_pass does
 * the one abortable wait of the pass (nccl_wait_pass) and reads the flags.
 * Deferred calls may be captured in a CUDA graph; a replay is checked with
 * the peers on the host (nccl_note_call) and launched inside the rank's
 * NCCL section (nccl_external), so never on an aborted communicator.
 *
 * Ranks check on the host that they make the same call (nccl_begin_call)
 * and an abort (echo_abort, a failed rank, a disagreement) ends the
 * communicators; echo_world_clear_abort creates them anew. See "abort".
 *
 * With one rank per process (echo_world_create_nccl_procs) the world holds
 * only this process's communicator; the call check goes over MPI
 * (nccl_begin_call_procs) and nothing is deferred. See "across processes".
 *
 * Status: runs in CI on the CPU emulator (tests/emu: nccl_emu.cpp,
 * tests/gpu/test_cuda_comm.c part n); not yet on real GPUs; the per-process
 * form needs ncclCommInitRank, which the emulator has not, and is only
 * built. Without CUDA the file provides both constructors as clear
 * failures.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/echo_internal.h"
#include "comm/proc.h"
#include "comm/transport/transport.h"

#ifndef ECHO_HAVE_CUDA

int echo_world_create_nccl(int nranks, const int *devices, const echo_config *cfg, echo_world **out, char *err,
                           size_t errlen) {
    (void)nranks, (void)devices, (void)cfg;
    *out = NULL;
    snprintf(err, errlen, "echo: the nccl transport needs a build with CUDA (make CUDA=1)");
    return -1;
}
int echo_world_create_nccl_procs(int device, const echo_config *cfg, echo_world **out, char *err, size_t errlen) {
    return echo_world_create_nccl(1, &device, cfg, out, err, errlen);
}

#else

#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

/* Calls remembered per rank for the agreement check. Without deferral
 * ranks are at most one call apart (a rank finishes call k only after every
 * peer has posted its messages of call k); deferred, a rank's host may run
 * a whole pass ahead (it finishes pass P in echo_end_pass only after every
 * peer has enqueued all of P's calls). So n_sites + 2 slots per rank. */

typedef struct nccl_rec {
    uint64_t seq; /* 0: empty */
    echo_call call;
} nccl_rec;

typedef struct nccl_world {
    int devices[ECHO_MAX_RANKS];
    ncclComm_t comms[ECHO_MAX_RANKS]; /* NULL once aborted (and for other processes' ranks) */
    int procs;                        /* one rank per process: this process drives rank `me` only */
    int me;
    size_t stride;                    /* bytes between phase-1 messages (cache-line rounded) */

    /* Abort state, guarded by mu (aborted is also read without it while a
     * rank polls its stream). */
    pthread_mutex_t mu;
    atomic_int aborted;
    char reason[384];            /* why, for the peers' messages */
    int dead;                    /* clear_abort could not re-create the communicators */
    int in_nccl[ECHO_MAX_RANKS]; /* the rank's thread is inside an NCCL call or waiting on its stream */
    /* echo_vote: ranks arrive under mu; the last decides and bumps the
     * generation (results kept per generation parity: a rank cannot start
     * vote g+2 before every rank has left vote g+1, so g's stays) */
    pthread_cond_t vote_cv;
    uint64_t vote_gen;
    int vote_n, vote_val, vote_same, vote_result[2];
    /* The reaper (see "ending communicators"), guarded by mu: the comms
     * handed to it, whether its thread exists (joinable) and whether it is
     * still ending comms, which reap_cv announces the end of. */
    struct {
        ncclComm_t comm;
        int abort; /* ncclCommAbort, else ncclCommDestroy */
    } reap_q[ECHO_MAX_RANKS];
    int reap_n, reaper_on, reaper_busy;
    pthread_t reaper;
    pthread_cond_t reap_cv;
    double reap_wait_s; /* how long clear_abort / destroy wait for it */
    uint64_t seq[ECHO_MAX_RANKS];  /* calls posted by each rank */
    uint64_t seq0[ECHO_MAX_RANKS]; /* seq at the rank's echo_begin_pass (echo_discard_pass goes back to it) */
    int slots;                     /* records per rank */
    nccl_rec *rec;                 /* [rank][slot] */
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

/* Inside a rank's NCCL section (between nccl_enter and nccl_leave): a
 * failure aborts the world (peers would wait for this rank forever), and
 * the message says so. */
#define NCCL_RANK_TRY(c, call)                                                                                         \
    do {                                                                                                               \
        ncclResult_t nccl_r_ = (call);                                                                                 \
        if (nccl_r_ != ncclSuccess) {                                                                                  \
            nccl_fail(err, errlen, __FILE__, __LINE__, #call, nccl_r_);                                                \
            return nccl_section_failed(c, err, errlen);                                                                \
        }                                                                                                              \
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

/* ---- ending communicators ----
 *
 * NCCL (>= 2.26) frees the communicators of one ncclCommInitAll only once
 * every CUDA graph that captured an operation on any of them is destroyed:
 * the group's last ncclCommAbort / ncclCommDestroy waits for that
 * (commDestroySync in NCCL's src/init.cc polls until the comms'
 * localPersistentRefs reach 0), and so would the thread that called it:
 * the rank whose graphs it waits for, or any thread holding mu. So no
 * communicator is ended in place. end_comm_locked hands it to the world's
 * reaper thread, which ends the comms in turn; ncclCommAbort raises the
 * comm's abort flag before anything else, which ends its pending kernels,
 * so peers stop waiting at once even while the last end waits for graphs.
 * Those graphs are the caller's to destroy (echo.h: before
 * echo_world_clear_abort and echo_world_destroy), and both wait for the
 * reaper, at most reap_wait_s: past that some graph was kept alive, and
 * the world is declared dead rather than left hanging. */

static void *nccl_reaper(void *arg) {
    nccl_world *nw = arg;
    pthread_mutex_lock(&nw->mu);
    while (nw->reap_n > 0) {
        ncclComm_t comm = nw->reap_q[nw->reap_n - 1].comm;
        int abort = nw->reap_q[nw->reap_n - 1].abort;
        nw->reap_n--;
        pthread_mutex_unlock(&nw->mu);
        /* The result is of no use: the comm is gone either way. */
        (void)(abort ? ncclCommAbort(comm) : ncclCommDestroy(comm));
        pthread_mutex_lock(&nw->mu);
    }
    nw->reaper_busy = 0;
    pthread_cond_broadcast(&nw->reap_cv);
    pthread_mutex_unlock(&nw->mu);
    return NULL;
}

/* With mu held: rank r's comm leaves the world and goes to the reaper. */
static void end_comm_locked(nccl_world *nw, int r, int abort) {
    ncclComm_t comm = nw->comms[r];
    if (!comm) return;
    nw->comms[r] = NULL;
    nw->reap_q[nw->reap_n].comm = comm;
    nw->reap_q[nw->reap_n].abort = abort;
    nw->reap_n++;
    if (nw->reaper_busy) return; /* it looks at the queue again before it stops */
    if (nw->reaper_on) pthread_join(nw->reaper, NULL); /* stopped: returns at once */
    nw->reaper_on = 0;
    if (pthread_create(&nw->reaper, NULL, nccl_reaper, nw) == 0) {
        nw->reaper_on = nw->reaper_busy = 1;
        return;
    }
    /* No thread to be had: end it here. That can wait for graphs (above),
     * but only when this is the group's last comm. */
    nw->reap_n--;
    (void)(abort ? ncclCommAbort(comm) : ncclCommDestroy(comm));
}

/* With mu held: wait until the reaper has ended every comm handed to it,
 * at most reap_wait_s. 0 when it has, -1 when it still waits (for graphs). */
static int reap_wait_locked(nccl_world *nw) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + nw->reap_wait_s;
    until.tv_sec = (time_t)t;
    until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
    while (nw->reaper_busy)
        if (pthread_cond_timedwait(&nw->reap_cv, &nw->mu, &until) == ETIMEDOUT && nw->reaper_busy) return -1;
    if (nw->reaper_on) pthread_join(nw->reaper, NULL);
    nw->reaper_on = 0;
    return 0;
}

/* ---- abort ----
 *
 * Real NCCL returns from an enqueue at once; a rank waits for its peers on
 * its stream, and a peer that never comes makes that wait endless. So every
 * call ends by polling the stream (nccl_wait) while watching the world's
 * abort flag and the comm's asynchronous error, and a rank that sees either
 * aborts its own communicator (which ends its pending NCCL kernels) and
 * fails. A communicator is only ever handed to the reaper for its abort by
 * the thread of its rank, or by another thread while its rank is outside
 * every NCCL call and poll (in_nccl, under mu): then no thread uses it, and
 * ncclCommAbort ends whatever the rank left pending on its stream. Aborting
 * the idle comms at once (the aborting rank's own among them) is also what
 * wakes peers in an implementation whose collective calls block until every
 * rank has arrived (tests/emu's NCCL). The communicators are gone after an
 * abort: echo_world_clear_abort re-creates them. */

/* With mu held: abort the world (first reason wins) and every
 * communicator no thread is using. */
static void abort_locked(nccl_world *nw, int nranks, const char *why) {
    if (!atomic_load(&nw->aborted)) {
        snprintf(nw->reason, sizeof nw->reason, "%s", why);
        atomic_store(&nw->aborted, 1);
    }
    for (int r = 0; r < nranks; r++)
        if (!nw->in_nccl[r]) end_comm_locked(nw, r, 1);
    pthread_cond_broadcast(&nw->vote_cv); /* ranks waiting in a vote fail */
}

static int aborted_msg(const nccl_world *nw, char *err, size_t errlen) {
    if (nw->dead)
        snprintf(err, errlen, "echo: nccl world unusable: %s; destroy it and create a new one", nw->reason);
    else
        snprintf(err, errlen,
                 "echo: the collective was aborted because another rank failed (%s); the pass is aborted and the "
                 "world's NCCL communicators are gone until echo_world_clear_abort",
                 nw->reason);
    return -1;
}

/* With mu held, the world aborted: end this rank's comm if it is still
 * there (it was in use when the world was aborted, so nobody else could,
 * and it may hold work the rank enqueued before), and fail with why. */
static int abort_own_locked(nccl_world *nw, const echo_comm *c, char *err, size_t errlen) {
    end_comm_locked(nw, c->rank, 1);
    aborted_msg(nw, err, errlen);
    pthread_mutex_unlock(&nw->mu);
    return -1;
}

/* Enter this rank's NCCL section: fails if the world was aborted. */
static int nccl_enter(echo_comm *c, char *err, size_t errlen) {
    nccl_world *nw = nw_of(c);
    pthread_mutex_lock(&nw->mu);
    if (atomic_load(&nw->aborted) || !nw->comms[c->rank]) {
        if (!nw->reason[0]) snprintf(nw->reason, sizeof nw->reason, "communicator of rank %d is gone", c->rank);
        return abort_own_locked(nw, c, err, errlen);
    }
    nw->in_nccl[c->rank] = 1;
    pthread_mutex_unlock(&nw->mu);
    return 0;
}

/* Leave the section. If the world was aborted meanwhile, nobody aborted
 * this rank's comm (it was in use): do it now, before the thread goes off
 * to wait on something that is not abortable (a device-to-host copy behind
 * NCCL kernels that would never end), and fail. */
static int nccl_leave(echo_comm *c, char *err, size_t errlen) {
    nccl_world *nw = nw_of(c);
    pthread_mutex_lock(&nw->mu);
    nw->in_nccl[c->rank] = 0;
    if (atomic_load(&nw->aborted)) return abort_own_locked(nw, c, err, errlen);
    pthread_mutex_unlock(&nw->mu);
    return 0;
}

/* Something failed inside this rank's NCCL section (err holds it): abort
 * the world with this message as the reason unless it was aborted already
 * (then that reason is what the caller needs), abort this rank's comm, leave
 * the section. */
static int nccl_section_failed(echo_comm *c, char *err, size_t errlen) {
    nccl_world *nw = nw_of(c);
    pthread_mutex_lock(&nw->mu);
    int was = atomic_load(&nw->aborted);
    char why[384];
    snprintf(why, sizeof why, "rank %d: %s", c->rank, err);
    nw->in_nccl[c->rank] = 0;
    abort_locked(nw, c->w->nranks, why);
    if (was) aborted_msg(nw, err, errlen);
    pthread_mutex_unlock(&nw->mu);
    return -1;
}

/* Wait for this rank's stream (its NCCL kernels) without risking an endless
 * wait: poll, and give up when the world is aborted or NCCL reports an
 * asynchronous error. Spins briefly first (a call's wait is usually short),
 * then sleeps 20 us between polls. */
static int nccl_wait(echo_comm *c, cudaStream_t s, char *err, size_t errlen) {
    nccl_world *nw = nw_of(c);
    for (unsigned it = 0;; it++) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) return 0;
        /* "not ready" is also recorded as the thread's last error, which the
         * rank's next kernel launch check (cudaGetLastError) would report as
         * its own failure: clear it */
        if (e == cudaErrorNotReady) cudaGetLastError();
        if (e != cudaErrorNotReady) {
            echo_cuda_fail(err, errlen, __FILE__, __LINE__, "cudaStreamQuery(stream)", e);
            return nccl_section_failed(c, err, errlen);
        }
        if (atomic_load(&nw->aborted)) {
            snprintf(err, errlen, "aborted while waiting for the collective");
            return nccl_section_failed(c, err, errlen);
        }
        ncclResult_t ae = ncclSuccess;
        NCCL_RANK_TRY(c, ncclCommGetAsyncError(comm_of(c), &ae));
        if (ae != ncclSuccess && ae != ncclInProgress) {
            nccl_fail(err, errlen, __FILE__, __LINE__, "ncclCommGetAsyncError", ae);
            return nccl_section_failed(c, err, errlen);
        }
        if (it < 2000) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

static const char *dt_name(echo_dtype dt) {
    return dt == ECHO_F32 ? "f32" : "bf16";
}

/* The start of a call (its first NCCL section). Ranks cannot compare calls
 * over NCCL without an extra collective, and mismatched NCCL calls hang or
 * corrupt memory; but the ranks are threads of this process, so each posts
 * its call here, on the host, before enqueuing anything, and compares it
 * with the same call of every peer that posted first. The last rank to post
 * a call sees every other post, so a disagreement is always found, by a rank
 * that has not enqueued the call: it aborts the world instead, and the ranks
 * that did enqueue fail in nccl_wait. No barrier, no device work. */
static int call_mismatch(const echo_call *a, int ra, const echo_call *b, int rb, char *err, size_t errlen) {
    if (a->site == b->site && a->count == b->count && a->dt == b->dt && a->path == b->path) return 0;
    snprintf(err, errlen,
             "echo: ranks disagree: rank %d calls site %d with %zu %s values (%s path), rank %d site %d with %zu %s "
             "values (%s path); the pass is aborted",
             ra, a->site, a->count, dt_name(a->dt), echo_preset_name(a->path), rb, b->site, b->count, dt_name(b->dt),
             echo_preset_name(b->path));
    return -1;
}

static int nccl_begin_call_procs(echo_comm *c, const echo_call *call, char *err, size_t errlen);

static int nccl_begin_call(echo_comm *c, const echo_call *call, char *err, size_t errlen) {
    nccl_world *nw = nw_of(c);
    int me = c->rank, N = c->w->nranks;
    if (nw->procs) return nccl_begin_call_procs(c, call, err, errlen);
    if (nccl_enter(c, err, errlen)) return -1;
    pthread_mutex_lock(&nw->mu);
    uint64_t seq = ++nw->seq[me];
    size_t slot = (size_t)(seq % (uint64_t)nw->slots);
    nccl_rec *mine = &nw->rec[(size_t)me * (size_t)nw->slots + slot];
    mine->seq = seq;
    mine->call = *call;
    for (int j = 0; j < N; j++) {
        const nccl_rec *o = &nw->rec[(size_t)j * (size_t)nw->slots + slot];
        if (j == me || o->seq != seq) continue;
        if (call_mismatch(call, me, &o->call, j, err, errlen)) {
            nw->in_nccl[me] = 0;
            abort_locked(nw, N, err);
            pthread_mutex_unlock(&nw->mu);
            return -1;
        }
    }
    pthread_mutex_unlock(&nw->mu);
    return 0;
}

/* ---- world, comms ---- */

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
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    size_t N = (size_t)w->nranks;
    if (w->max_plan.wire) {
        ECHO_CUDA_TRY(cudaMalloc((void **)&nr->send, N * nw->stride));
        ECHO_CUDA_TRY(cudaMalloc((void **)&nr->recv, N * nw->stride));
        ECHO_CUDA_TRY(cudaMalloc((void **)&nr->gather, N * nw->stride));
    }
    if (w->cfg.feedback && w->exact_max > 0)
        ECHO_CUDA_TRY(cudaMalloc((void **)&nr->wide, w->exact_max * sizeof(float)));
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
    /* After an abort a comm may still have kernels pending: abort it. */
    pthread_mutex_lock(&nw->mu);
    for (int r = 0; r < w->nranks; r++)
        end_comm_locked(nw, r, atomic_load(&nw->aborted));
    int stuck = reap_wait_locked(nw);
    pthread_mutex_unlock(&nw->mu);
    w->tp_world = NULL;
    if (stuck) {
        /* The reaper still uses nw: leave both to it. */
        fprintf(stderr,
                "echo: nccl: the world's communicators are not freed after %.0f s: a CUDA graph that captured their "
                "all-reduces is still alive (destroy such graphs before echo_world_destroy); leaving them\n",
                nw->reap_wait_s);
        pthread_detach(nw->reaper);
        return;
    }
    pthread_mutex_destroy(&nw->mu);
    pthread_cond_destroy(&nw->vote_cv);
    pthread_cond_destroy(&nw->reap_cv);
    free(nw->rec);
    free(nw);
}

/* Bytes of the largest phase-1 or phase-2 message of w's calls (a shard's
 * wire form, at most the stride); 0 on a `none` world. */
static size_t nccl_p2p_max(const echo_world *w) {
    return w->max_plan.wire;
}

/* One warm-up group, driven from this thread for ranks r0..r1-1 (all of
 * them, or this process's one): p2p bytes to and from every peer, an
 * in-place all-gather of ag bytes per rank, and all-reduces of ar_f32 fp32
 * and ar_bf16 bf16 values (each kind skipped at 0). tmp[r] holds
 * 3 * nranks * max(p2p, ag) + 4 * ar_f32 bytes. */
static ncclResult_t warm_group(nccl_world *nw, int nranks, int r0, int r1, void *const *tmp, size_t p2p, size_t ag,
                               size_t ar_f32, size_t ar_bf16) {
    size_t m = p2p > ag ? p2p : ag;
    ncclResult_t g = ncclGroupStart();
    for (int r = r0; r < r1 && g == ncclSuccess; r++) {
        uint8_t *b = tmp[r];
        for (int j = 0; j < nranks && g == ncclSuccess && p2p; j++) {
            if (j == r) continue;
            g = ncclSend(b + (size_t)j * m, p2p, ncclUint8, j, nw->comms[r], NULL);
            if (g == ncclSuccess) g = ncclRecv(b + (size_t)(nranks + j) * m, p2p, ncclUint8, j, nw->comms[r], NULL);
        }
        uint8_t *gather = b + (size_t)(2 * nranks) * m;
        if (g == ncclSuccess && ag)
            g = ncclAllGather(gather + (size_t)r * ag, gather, ag, ncclUint8, nw->comms[r], NULL);
        float *ar = (float *)(b + (size_t)(3 * nranks) * m);
        if (g == ncclSuccess && ar_f32) g = ncclAllReduce(ar, ar, ar_f32, ncclFloat32, ncclSum, nw->comms[r], NULL);
        if (g == ncclSuccess && ar_bf16) g = ncclAllReduce(ar, ar, ar_bf16, ncclBfloat16, ncclSum, nw->comms[r], NULL);
    }
    ncclResult_t ge = ncclGroupEnd();
    return g == ncclSuccess ? ge : g;
}

/* Create the communicators and make transfers of every kind the calls use,
 * at every size class they can have (64 bytes, then x4 up to the largest
 * message), driven from this thread: NCCL sets connections up lazily, on
 * first use of an algorithm or of a channel to a peer (which one depends on
 * the size), and a connection set-up waits for the peer inside the NCCL
 * call, where no abort can reach it; inside a CUDA graph capture that one
 * rank abandoned, it would wait for good. After this a call's NCCL
 * functions only enqueue, unless NCCL picks at some size an algorithm none
 * of the sampled sizes got: NCCL_RUNTIME_CONNECT=0 has every one made at
 * init, at the cost of the memory of all of them. p2p_max: bytes of one
 * phase-1 / phase-2 message (0 on a `none` world, which has none);
 * ar_max: values the exact path can take (w->exact_max). */
static int nccl_warm(nccl_world *nw, int nranks, int r0, int r1, size_t p2p_max, size_t ar_max, char *err,
                     size_t errlen);

static int nccl_world_init_comms(nccl_world *nw, int nranks, size_t p2p_max, size_t ar_max, char *err,
                                 size_t errlen) {
    ncclResult_t rc = ncclCommInitAll(nw->comms, nranks, nw->devices);
    if (rc != ncclSuccess) {
        memset(nw->comms, 0, sizeof nw->comms);
        snprintf(err, errlen, "nccl: %s:%d: ncclCommInitAll over %d devices: %s", __FILE__, __LINE__, nranks,
                 ncclGetErrorString(rc));
        return -1;
    }
    if (nranks == 1) return 0;
    return nccl_warm(nw, nranks, 0, nranks, p2p_max, ar_max, err, errlen);
}

/* The warm-up of ranks r0..r1-1 (their comms exist); on failure their
 * comms are aborted. */
static int nccl_warm(nccl_world *nw, int nranks, int r0, int r1, size_t p2p_max, size_t ar_max, char *err,
                     size_t errlen) {
    /* The warm-up selects each rank's device in turn: leave the caller's
     * thread on the device it had (ncclCommInitAll does the same). */
    int saved = 0;
    ECHO_CUDA_TRY(cudaGetDevice(&saved));
    void *tmp[ECHO_MAX_RANKS] = {0};
    const size_t lo = 64, m = p2p_max > lo ? p2p_max : lo, ar = ar_max * 4 > lo ? ar_max * 4 : lo;
    size_t bytes = 3 * (size_t)nranks * m + ar;
    int ret = 0;
    for (int r = r0; r < r1 && !ret; r++) {
        cudaError_t e = cudaSetDevice(nw->devices[r]);
        if (e == cudaSuccess) e = cudaMalloc(&tmp[r], bytes);
        if (e == cudaSuccess) e = cudaMemset(tmp[r], 0, bytes);
        if (e != cudaSuccess) ret = echo_cuda_fail(err, errlen, __FILE__, __LINE__, "cudaMalloc(warm-up buffer)", e);
    }
    const size_t top = m > ar ? m : ar;
    for (size_t s = lo; !ret; s = s < top / 4 ? s * 4 : top) {
        size_t p = p2p_max ? (s < m ? s : m) : (s == lo ? lo : 0); /* exact worlds: one small p2p, all-gather */
        size_t a = s < ar ? s : ar;
        size_t bf = ar_max && a / 2 > ar_max ? ar_max : a / 2; /* bf16: up to ar_max values too */
        ncclResult_t g = warm_group(nw, nranks, r0, r1, tmp, p, p, a / 4, bf);
        if (g != ncclSuccess) ret = nccl_fail(err, errlen, __FILE__, __LINE__, "warm-up transfers", g);
        if (s == top) break;
    }
    for (int r = r0; r < r1 && !ret; r++) {
        cudaError_t e = cudaSetDevice(nw->devices[r]);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e != cudaSuccess)
            ret = echo_cuda_fail(err, errlen, __FILE__, __LINE__, "cudaDeviceSynchronize(warm-up)", e);
    }
    for (int r = r0; r < r1; r++)
        if (tmp[r]) {
            cudaSetDevice(nw->devices[r]);
            cudaFree(tmp[r]);
        }
    if (ret)
        for (int r = r0; r < r1; r++)
            if (nw->comms[r]) {
                ncclCommAbort(nw->comms[r]); /* new: no graph holds them */
                nw->comms[r] = NULL;
            }
    cudaError_t e = cudaSetDevice(saved);
    if (e != cudaSuccess && !ret) ret = echo_cuda_fail(err, errlen, __FILE__, __LINE__, "cudaSetDevice(saved)", e);
    return ret;
}

/* on = 1: echo_abort, or a compute step failed on a rank. on = 0:
 * echo_world_clear_abort, once every rank has returned: the aborted
 * communicators cannot be reused, so the remaining ones are aborted and all
 * are created anew (ncclCommInitAll from this thread). If that fails the
 * world stays unusable and every call says so. */
static void nccl_set_abort(echo_world *w, int on) {
    nccl_world *nw = w->tp_world;
    pthread_mutex_lock(&nw->mu);
    if (on) {
        abort_locked(nw, w->nranks, "echo_abort was called, or a rank's device work failed");
    } else if (atomic_load(&nw->aborted) && !nw->dead && nw->procs) {
        /* new communicators would need every process to take part */
        char was[200];
        snprintf(was, sizeof was, "%.190s", nw->reason);
        nw->dead = 1;
        snprintf(nw->reason, sizeof nw->reason,
                 "this process's NCCL communicator was aborted (%s); across processes it is not re-created in place: "
                 "restart the job",
                 was);
    } else if (atomic_load(&nw->aborted) && !nw->dead) {
        int busy = -1;
        for (int r = 0; r < w->nranks; r++)
            if (nw->in_nccl[r]) busy = r;
        char err[384];
        if (busy >= 0) {
            snprintf(err, sizeof err, "echo_world_clear_abort was called while rank %d was still inside a collective",
                     busy);
        } else {
            for (int r = 0; r < w->nranks; r++)
                end_comm_locked(nw, r, 1);
            if (reap_wait_locked(nw))
                snprintf(err, sizeof err,
                         "NCCL has not freed the aborted communicators after %.0f s: a CUDA graph that captured their "
                         "all-reduces is still alive (destroy such graphs before echo_world_clear_abort)",
                         nw->reap_wait_s);
            else if (!nccl_world_init_comms(nw, w->nranks, nccl_p2p_max(w), w->exact_max, err, sizeof err)) {
                atomic_store(&nw->aborted, 0);
                nw->reason[0] = 0;
                memset(nw->seq, 0, sizeof nw->seq);
                memset(nw->seq0, 0, sizeof nw->seq0);
                memset(nw->rec, 0, (size_t)w->nranks * (size_t)nw->slots * sizeof *nw->rec);
                nw->vote_n = 0; /* a vote the abort broke off */
                nw->vote_gen++;
                w->epoch++; /* device work captured with the old communicators must not run */
                busy = -2;
            }
        }
        if (busy != -2) {
            nw->dead = 1;
            snprintf(nw->reason, sizeof nw->reason, "re-creating the communicators after an abort failed: %.300s", err);
        }
    }
    pthread_mutex_unlock(&nw->mu);
}

static int nccl_usable(const echo_world *w, char *why, size_t len) {
    nccl_world *nw = w->tp_world;
    pthread_mutex_lock(&nw->mu);
    int dead = nw->dead;
    if (dead) snprintf(why, len, "%s", nw->reason);
    pthread_mutex_unlock(&nw->mu);
    return !dead;
}

/* ---- the exchanges ---- */

static uint8_t *nccl_p1_send(echo_comm *c, int peer) {
    return nr_of(c)->send + (size_t)peer * nw_of(c)->stride;
}

static const uint8_t *nccl_p1_recv(echo_comm *c, int peer) {
    return nr_of(c)->recv + (size_t)peer * nw_of(c)->stride;
}

/* Enqueued only: the wait is at the end of the call (nccl_p2_exchange). */
static int nccl_p1_exchange(echo_comm *c, const echo_plan *p, const echo_call *call, void *stream, char *err,
                            size_t errlen) {
    nccl_rank *nr = nr_of(c);
    size_t stride = nw_of(c)->stride;
    cudaStream_t s = stream;
    if (nccl_begin_call(c, call, err, errlen)) return -1;
    NCCL_RANK_TRY(c, ncclGroupStart());
    for (int j = 0; j < p->nranks; j++) {
        if (j == c->rank) continue;
        ncclResult_t r = ncclSend(nr->send + (size_t)j * stride, p->wire, ncclUint8, j, comm_of(c), s);
        if (r == ncclSuccess) r = ncclRecv(nr->recv + (size_t)j * stride, p->wire, ncclUint8, j, comm_of(c), s);
        if (r != ncclSuccess) {
            (void)ncclGroupEnd(); /* close the group; it carries the error and runs nothing */
            nccl_fail(err, errlen, __FILE__, __LINE__, "ncclSend/ncclRecv(phase 1)", r);
            return nccl_section_failed(c, err, errlen);
        }
    }
    NCCL_RANK_TRY(c, ncclGroupEnd());
    return nccl_leave(c, err, errlen);
}

/* The all-gather places owner j's message at j * wire. */
static uint8_t *nccl_p2_send(echo_comm *c, const echo_plan *p) {
    return nr_of(c)->gather + (size_t)c->rank * p->wire;
}

static const uint8_t *nccl_p2_recv(echo_comm *c, const echo_plan *p, int owner) {
    return nr_of(c)->gather + (size_t)owner * p->wire;
}

/* The call's last exchange: wait (abortably) for the stream, so that the
 * finish step's read-back never waits on a collective that cannot end;
 * deferred, the wait is echo_end_pass's (nccl_wait_pass). */
static int nccl_p2_exchange(echo_comm *c, const echo_plan *p, void *stream, char *err, size_t errlen) {
    nccl_rank *nr = nr_of(c);
    if (nccl_enter(c, err, errlen)) return -1;
    NCCL_RANK_TRY(c, ncclAllGather(nr->gather + (size_t)c->rank * p->wire, nr->gather, p->wire, ncclUint8, comm_of(c),
                                   (cudaStream_t)stream));
    if (!c->w->cfg.deferred && nccl_wait(c, (cudaStream_t)stream, err, errlen)) return -1;
    return nccl_leave(c, err, errlen);
}

static int nccl_exact(echo_comm *c, const echo_plan *p, const echo_call *call, void *buf, size_t *bad, void *stream,
                      char *err, size_t errlen) {
    nccl_rank *nr = nr_of(c);
    cudaStream_t s = stream;
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    if (nccl_begin_call(c, call, err, errlen)) return -1;
    if (call->res) {
        if (echo_cuda_widen_add(c, buf, p->dt, call->res, nr->wide, p->count, stream, err, errlen))
            return nccl_section_failed(c, err, errlen);
        NCCL_RANK_TRY(c, ncclAllReduce(nr->wide, nr->wide, p->count, ncclFloat32, ncclSum, comm_of(c), s));
        if (echo_cuda_narrow(c, nr->wide, buf, p->dt, p->count, stream, err, errlen))
            return nccl_section_failed(c, err, errlen);
    } else {
        NCCL_RANK_TRY(c, ncclAllReduce(buf, buf, p->count, p->dt == ECHO_F32 ? ncclFloat32 : ncclBfloat16, ncclSum,
                                       comm_of(c), s));
    }
    if (!c->w->cfg.deferred && nccl_wait(c, s, err, errlen)) return -1;
    if (nccl_leave(c, err, errlen)) return -1;
    return echo_cuda_check_finite(c, buf, p->dt, p->count, bad, stream, err, errlen);
}

/* ---- deferred completion (echo_end_pass) and graph replay ---- */

static int nccl_wait_pass(echo_comm *c, void *stream, char *err, size_t errlen) {
    ECHO_CUDA_TRY(cudaSetDevice(c->device));
    if (nccl_enter(c, err, errlen)) return -1;
    if (nccl_wait(c, (cudaStream_t)stream, err, errlen)) return -1;
    return nccl_leave(c, err, errlen);
}

static int nccl_note_call(echo_comm *c, const echo_call *call, char *err, size_t errlen) {
    if (nccl_begin_call(c, call, err, errlen)) return -1;
    return nccl_leave(c, err, errlen);
}

/* A graph holding this rank's NCCL kernels is launched inside the section:
 * never on an aborted communicator (its resources are freed), and a peer's
 * abort meanwhile leaves the comm to this thread, which aborts it on
 * leaving. A failed launch ran nothing, so the caller may make the calls
 * eagerly instead: the world is not aborted for it. */
static int nccl_external(echo_comm *c, int (*launch)(void *arg, char *err, size_t errlen), void *arg, char *err,
                         size_t errlen) {
    if (nccl_enter(c, err, errlen)) return -1;
    int rc = launch(arg, err, errlen);
    char lerr[384];
    if (nccl_leave(c, lerr, sizeof lerr)) {
        if (!rc) snprintf(err, errlen, "%s", lerr);
        return -1;
    }
    return rc;
}

static int nccl_vote(echo_comm *c, int mine, int *agreed, char *err, size_t errlen) {
    nccl_world *nw = nw_of(c);
    pthread_mutex_lock(&nw->mu);
    if (atomic_load(&nw->aborted)) {
        aborted_msg(nw, err, errlen);
        pthread_mutex_unlock(&nw->mu);
        return -1;
    }
    uint64_t gen = nw->vote_gen;
    if (nw->vote_n == 0) {
        nw->vote_val = mine;
        nw->vote_same = 1;
    } else if (mine != nw->vote_val) {
        nw->vote_same = 0;
    }
    if (++nw->vote_n == c->w->nranks) {
        nw->vote_result[gen & 1] = nw->vote_same && nw->vote_val != 0;
        nw->vote_n = 0;
        nw->vote_gen++;
        pthread_cond_broadcast(&nw->vote_cv);
    } else {
        while (nw->vote_gen == gen && !atomic_load(&nw->aborted))
            pthread_cond_wait(&nw->vote_cv, &nw->mu);
    }
    if (nw->vote_gen == gen) { /* aborted before every rank voted */
        aborted_msg(nw, err, errlen);
        pthread_mutex_unlock(&nw->mu);
        return -1;
    }
    *agreed = nw->vote_result[gen & 1];
    pthread_mutex_unlock(&nw->mu);
    return 0;
}

static void nccl_pass_begin(echo_comm *c) {
    nccl_world *nw = nw_of(c);
    pthread_mutex_lock(&nw->mu);
    nw->seq0[c->rank] = nw->seq[c->rank];
    pthread_mutex_unlock(&nw->mu);
}

/* The posts since pass_begin are taken back; the rank posts the same calls
 * again, which its peers compare with what they posted. */
static void nccl_pass_discard(echo_comm *c) {
    nccl_world *nw = nw_of(c);
    pthread_mutex_lock(&nw->mu);
    nw->seq[c->rank] = nw->seq0[c->rank];
    pthread_mutex_unlock(&nw->mu);
}

static const echo_deferred_ops nccl_deferred_ops = {
    .wait = nccl_wait_pass,
    .note_call = nccl_note_call,
    .external = nccl_external,
    .pass_begin = nccl_pass_begin,
    .pass_discard = nccl_pass_discard,
    .vote = nccl_vote,
};

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
    .set_abort = nccl_set_abort,
    .usable = nccl_usable,
    .deferred = &nccl_deferred_ops,
};

/* The world without communicators: checks, buffers, records. */
static int nccl_world_new(int nranks, const echo_config *cfg, echo_world **out, char *err, size_t errlen) {
    echo_world *w;
    *out = NULL;
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
    pthread_mutex_init(&nw->mu, NULL);
    pthread_cond_init(&nw->vote_cv, NULL);
    pthread_cond_init(&nw->reap_cv, NULL);
    const char *wait_s = getenv("ECHO_NCCL_FREE_WAIT_S");
    nw->reap_wait_s = wait_s && atof(wait_s) > 0 ? atof(wait_s) : 60.0;
    atomic_init(&nw->aborted, 0);
    nw->stride = (w->max_plan.wire + 255) / 256 * 256;
    nw->slots = w->cfg.n_sites + 2;
    nw->rec = calloc((size_t)nranks * (size_t)nw->slots, sizeof *nw->rec);
    if (!nw->rec) {
        snprintf(err, errlen, "echo: out of memory");
        echo_world_destroy(w);
        return -1;
    }
    *out = w;
    return 0;
}

int echo_world_create_nccl(int nranks, const int *devices, const echo_config *cfg, echo_world **out, char *err,
                           size_t errlen) {
    *out = NULL;
    if (!devices) {
        snprintf(err, errlen, "echo: nccl transport: no device list");
        return -1;
    }
    echo_world *w;
    if (nccl_world_new(nranks, cfg, &w, err, errlen)) return -1;
    nccl_world *nw = w->tp_world;
    for (int r = 0; r < nranks; r++)
        nw->devices[r] = devices[r];
    if (nccl_world_init_comms(nw, nranks, nccl_p2p_max(w), w->exact_max, err, errlen)) {
        echo_world_destroy(w);
        return -1;
    }
    *out = w;
    return 0;
}

/* ---- across processes ----
 * One rank per process: rank 0's ncclUniqueId reaches the others over MPI
 * (comm/proc.c), each process makes its own communicator with
 * ncclCommInitRank on its GPU, so the ranks may span hosts. The host-side
 * records of nccl_begin_call only see this process: calls are compared
 * over MPI instead (an all-gather of each rank's call before anything is
 * enqueued: every rank sees every call, so all fail alike, and none has
 * enqueued). No deferral, so no graphs and no vote; an abort ends this
 * process's communicator only, and the engine then ends the job
 * (echo_proc_abort), since peers inside an NCCL kernel cannot be reached.
 * The feature test is the multi-process API itself: a header without it
 * (the CPU emulator's) builds the failure below. */
#ifdef NCCL_UNIQUE_ID_BYTES
static int nccl_begin_call_procs(echo_comm *c, const echo_call *call, char *err, size_t errlen) {
    echo_call all[ECHO_MAX_RANKS];
    if (echo_proc_allgather(call, sizeof *call, all, err, errlen)) return -1;
    for (int j = 0; j < c->w->nranks; j++)
        if (j != c->rank && call_mismatch(call, c->rank, &all[j], j, err, errlen)) return -1;
    return nccl_enter(c, err, errlen);
}

int echo_world_create_nccl_procs(int device, const echo_config *cfg, echo_world **out, char *err, size_t errlen) {
    int n = echo_proc_count(), me = echo_proc_rank();
    *out = NULL;
    if (n < 2) {
        snprintf(err, errlen, "echo: the nccl transport across processes needs mpirun with 2 or more processes");
        return -1;
    }
    if (cfg && cfg->deferred) {
        snprintf(err, errlen, "echo: the nccl transport across processes runs eagerly (no deferred completion)");
        return -1;
    }
    echo_world *w;
    if (nccl_world_new(n, cfg, &w, err, errlen)) return -1;
    nccl_world *nw = w->tp_world;
    nw->procs = 1;
    nw->me = me;
    nw->devices[me] = device;
    /* every process takes part in the broadcast, even when rank 0 failed */
    struct {
        int32_t ok;
        ncclUniqueId id;
    } msg = {1, {{0}}};
    char why[256] = "";
    if (me == 0) {
        ncclResult_t r = ncclGetUniqueId(&msg.id);
        if (r != ncclSuccess) {
            msg.ok = 0;
            nccl_fail(why, sizeof why, __FILE__, __LINE__, "ncclGetUniqueId", r);
        }
    }
    int rc = echo_proc_bcast(&msg, sizeof msg, err, errlen);
    if (!rc && !msg.ok) {
        snprintf(err, errlen, "%s", me == 0 ? why : "echo: nccl: rank 0 could not make the ncclUniqueId");
        rc = -1;
    }
    cudaError_t ce = rc ? cudaSuccess : cudaSetDevice(device);
    if (!rc && ce != cudaSuccess) rc = echo_cuda_fail(err, errlen, __FILE__, __LINE__, "cudaSetDevice", ce);
    if (!rc) {
        ncclResult_t r = ncclCommInitRank(&nw->comms[me], n, msg.id, me);
        if (r != ncclSuccess) {
            nw->comms[me] = NULL;
            snprintf(err, errlen, "nccl: %s:%d: ncclCommInitRank (rank %d of %d, GPU %d): %s", __FILE__, __LINE__, me,
                     n, device, ncclGetErrorString(r));
            rc = -1;
        }
    }
    if (!rc) rc = nccl_warm(nw, n, me, me + 1, nccl_p2p_max(w), w->exact_max, err, errlen);
    if (rc) {
        echo_world_destroy(w);
        return -1;
    }
    *out = w;
    return 0;
}
#else
static int nccl_begin_call_procs(echo_comm *c, const echo_call *call, char *err, size_t errlen) {
    (void)c, (void)call;
    snprintf(err, errlen, "echo: nccl: no multi-process API in this build");
    return -1;
}

int echo_world_create_nccl_procs(int device, const echo_config *cfg, echo_world **out, char *err, size_t errlen) {
    (void)device, (void)cfg;
    *out = NULL;
    snprintf(err, errlen,
             "echo: this nccl.h has no ncclCommInitRank (the CPU emulator's?): the nccl transport across processes "
             "needs the real NCCL");
    return -1;
}
#endif

#endif
