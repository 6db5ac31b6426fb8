/*
 * comm/transport/mpi.c — the `mpi` transport: one rank per process, host memory, the
 * host compute. The schedule above it (echo.c) is the one `local` runs, so
 * int4, echo and bf16 give local's bits; only the moves differ:
 *
 *   agreement   MPI_Allgather of each rank's (site, count, dtype, path),
 *               before any data moves: a disagreement fails every rank at
 *               the same point and nothing else is communicated, so the
 *               ranks stay in step (local does the same at its barrier A)
 *   phase 1     MPI_Alltoallv of the shard messages (send[peer] -> recv[src],
 *               at a fixed stride; an empty shard moves no bytes)
 *   phase 2     MPI_Allgather of the owners' messages at the call's wire size
 *   exact       MPI_Allreduce of fp32 (x + residual), or with
 *               $ECHO_MPI_EXACT=twoshot an all-to-all of fp32 shards, an
 *               owner sum in rank order and an all-gather of the sums
 *   one-shot    each rank's whole message to every peer: N-1 MPI_Isend and
 *               N-1 MPI_Irecv, one MPI_Waitall (one network step)
 *
 * Collectives are blocking: MPI cannot interrupt them, so echo_abort is
 * local to the process (see echo.h) and a failed MPI call leaves the world
 * unusable (the ranks may be out of step). The communicator is a duplicate
 * of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so every MPI failure comes back
 * as a message instead of ending the job. Nothing here is static state:
 * the world owns the communicator and the buffers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/echo_internal.h"
#include "comm/transport/transport.h"

#ifdef ECHO_HAVE_MPI
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <time.h>

typedef struct mpi_world {
    MPI_Comm comm;
    int me;
    int twoshot;          /* exact path: 1 = two-shot fp32, 0 = MPI_Allreduce */
    int lazy;             /* echo_config.lazy_wait: nonblocking collectives, waits that sleep */
    int lazy_now;         /* this call waits lazily: lazy and a message of at least LAZY_MIN_BYTES */
    size_t stride;        /* bytes between phase-1 messages: the widest message, 64-byte rounded */
    uint8_t *send, *recv; /* phase 1: N * stride each */
    uint8_t *p2;          /* phase 2: N messages of the call's wire size */
    float *xsum;          /* exact path: this rank's x + residual in fp32, then the sum (N * shard values) */
    float *xrecv;         /* exact two-shot: the peers' fp32 shards of the own shard (N * shard values) */
    int *counts, *displs; /* N each, scratch for the v-collectives */
    uint8_t *os;          /* one-shot: N messages of the call's size, in rank order (an all-gather) */
    int aborted;          /* echo_abort was called in this process */
    int dead;             /* an MPI call failed: ranks may be out of step */
    char why[256];
} mpi_world;

static mpi_world *mw_of(const echo_world *w) {
    return w->tp_world;
}

/* An MPI call failed: say which, and mark the world unusable. */
static int mpi_fail(mpi_world *mw, int rc, const char *what, char *err, size_t errlen) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    snprintf(err, errlen, "echo: mpi: %s failed: %s", what, msg);
    if (mw) {
        mw->dead = 1;
        snprintf(mw->why, sizeof mw->why, "%s", err);
    }
    return -1;
}

#define MPI_TRY(mw, call)                                                                                              \
    do {                                                                                                               \
        int mpi_rc_ = (call);                                                                                          \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_fail((mw), mpi_rc_, #call, err, errlen);                                \
    } while (0)

/* echo_config.lazy_wait: the nonblocking twin of each collective, and a
 * wait that spins (MPI_Test) for its first LAZY_SPIN_S, then sleeps
 * LAZY_NAP_NS between tests, so that a thread waiting on its peers (the
 * engine's communication thread, engine/overlap.h) leaves the cores to the
 * compute beside it; the TCP transfers go on in the kernel meanwhile.
 * Only for calls of at least LAZY_MIN_BYTES (fp32): Open MPI's nonblocking
 * collectives (libnbc) advance one round per MPI_Test and each nap adds
 * ~100 us, so on a decode-size call (a few KB, 2 x layers per token) the
 * lazy wait was the slower one: SmolLM2 at tp 3, 3 hosts at 1 Gbit/s,
 * 11 tok/s lazy vs 25 blocking (docs/network.md). A prefill's calls are
 * >= 64 tokens x hidden x 4 bytes, far above. */
#define LAZY_SPIN_S 200e-6
#define LAZY_NAP_NS 50000L
#define LAZY_MIN_BYTES 65536

static double mpi_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int lazy_wait(MPI_Request *rq) {
    double t0 = mpi_now();
    for (;;) {
        int done = 0, rc = MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done) return rc;
        if (mpi_now() - t0 > LAZY_SPIN_S) nanosleep(&(struct timespec){0, LAZY_NAP_NS}, NULL);
    }
}

/* A collective: `blocking`, or on a lazy call `nb` (its nonblocking twin,
 * writing MPI_Request rq_) and lazy_wait; the same bytes either way. */
#define MPI_COLL(mw, blocking, nb)                                                                                     \
    do {                                                                                                               \
        int mpi_rc_;                                                                                                   \
        if (!(mw)->lazy_now) {                                                                                         \
            mpi_rc_ = (blocking);                                                                                      \
        } else {                                                                                                       \
            MPI_Request rq_;                                                                                           \
            mpi_rc_ = (nb);                                                                                            \
            if (mpi_rc_ == MPI_SUCCESS) mpi_rc_ = lazy_wait(&rq_);                                                     \
        }                                                                                                              \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_fail((mw), mpi_rc_, #blocking, err, errlen);                            \
    } while (0)

/* Fail fast, without communicating, when this process can no longer take
 * part in a collective. */
static int mpi_ready(mpi_world *mw, char *err, size_t errlen) {
    if (mw->dead) {
        snprintf(err, errlen, "echo: the mpi world is unusable: %s", mw->why);
        return -1;
    }
    if (mw->aborted) {
        snprintf(err, errlen,
                 "echo: the mpi world was aborted in this process (echo_abort); peers are woken only "
                 "by MPI_Abort");
        return -1;
    }
    return 0;
}

/* Every rank learns every rank's call; all fail alike when they differ. */
static int mpi_agree(echo_comm *c, const echo_call *call, char *err, size_t errlen) {
    mpi_world *mw = mw_of(c->w);
    int N = c->w->nranks;
    if (mpi_ready(mw, err, errlen)) return -1;
    /* every rank of a call decides alike (the agreement itself is small:
     * blocking unless the call is large, as the call's collectives) */
    mw->lazy_now = mw->lazy && call->count * sizeof(float) >= LAZY_MIN_BYTES;
    long long mine[4] = {call->site, (long long)call->count, call->dt, call->path};
    long long all[4 * ECHO_MAX_RANKS];
    MPI_COLL(mw, MPI_Allgather(mine, 4, MPI_LONG_LONG, all, 4, MPI_LONG_LONG, mw->comm),
             MPI_Iallgather(mine, 4, MPI_LONG_LONG, all, 4, MPI_LONG_LONG, mw->comm, &rq_));
    for (int j = 0; j < N; j++) {
        const long long *o = all + 4 * j;
        if (o[0] != mine[0] || o[1] != mine[1] || o[2] != mine[2] || o[3] != mine[3]) {
            snprintf(err, errlen,
                     "echo: ranks disagree: rank %d calls site %d with %zu %s values (%s path), rank %d site %lld "
                     "with %lld %s values (%s path); the pass is aborted",
                     c->rank, call->site, call->count, call->dt == ECHO_F32 ? "f32" : "bf16",
                     echo_preset_name(call->path), j, o[0], o[1], o[2] == ECHO_F32 ? "f32" : "bf16",
                     echo_preset_name((echo_preset)o[3]));
            return -1;
        }
    }
    return 0;
}

static int mpi_comm_init(echo_comm *c, char *err, size_t errlen) {
    mpi_world *mw = mw_of(c->w);
    if (c->rank != mw->me) {
        snprintf(err, errlen,
                 "echo: this process is rank %d of the mpi world; echo_comm_create takes that rank only (got %d)",
                 mw->me, c->rank);
        return -1;
    }
    c->device = -1;
    return 0;
}

static uint8_t *mpi_p1_send(echo_comm *c, int peer) {
    return mw_of(c->w)->send + (size_t)peer * mw_of(c->w)->stride;
}

static const uint8_t *mpi_p1_recv(echo_comm *c, int peer) {
    return mw_of(c->w)->recv + (size_t)peer * mw_of(c->w)->stride;
}

static int mpi_p1_exchange(echo_comm *c, const echo_plan *p, const echo_call *call, void *stream, char *err,
                           size_t errlen) {
    (void)stream;
    mpi_world *mw = mw_of(c->w);
    int N = c->w->nranks, me = c->rank;
    if (mpi_agree(c, call, err, errlen)) return -1;
    /* sender -> j only when shard j is not empty; receiver mirrors it with
     * its own shard, so the counts match pairwise */
    int sc[ECHO_MAX_RANKS], sd[ECHO_MAX_RANKS], rc[ECHO_MAX_RANKS], rd[ECHO_MAX_RANKS];
    int own = echo_plan_len(p, me) > 0;
    for (int j = 0; j < N; j++) {
        sd[j] = rd[j] = (int)((size_t)j * mw->stride);
        sc[j] = j != me && echo_plan_len(p, j) > 0 ? (int)p->wire : 0;
        rc[j] = j != me && own ? (int)p->wire : 0;
    }
    MPI_COLL(mw, MPI_Alltoallv(mw->send, sc, sd, MPI_BYTE, mw->recv, rc, rd, MPI_BYTE, mw->comm),
             MPI_Ialltoallv(mw->send, sc, sd, MPI_BYTE, mw->recv, rc, rd, MPI_BYTE, mw->comm, &rq_));
    return 0;
}

static uint8_t *mpi_p2_send(echo_comm *c, const echo_plan *p) {
    return mw_of(c->w)->p2 + (size_t)c->rank * p->wire;
}

static int mpi_p2_exchange(echo_comm *c, const echo_plan *p, void *stream, char *err, size_t errlen) {
    (void)stream;
    mpi_world *mw = mw_of(c->w);
    MPI_COLL(mw, MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, mw->p2, (int)p->wire, MPI_BYTE, mw->comm),
             MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, mw->p2, (int)p->wire, MPI_BYTE, mw->comm, &rq_));
    return 0;
}

static const uint8_t *mpi_p2_recv(echo_comm *c, const echo_plan *p, int owner) {
    return mw_of(c->w)->p2 + (size_t)owner * p->wire;
}

static int mpi_exact(echo_comm *c, const echo_plan *p, const echo_call *call, void *buf, size_t *bad, void *stream,
                     char *err, size_t errlen) {
    (void)stream;
    mpi_world *mw = mw_of(c->w);
    int N = c->w->nranks, me = c->rank;
    size_t M = p->count;
    *bad = ECHO_NO_INDEX;
    if (mpi_agree(c, call, err, errlen)) return -1;
    float *x = mw->xsum;
    echo_cpu_load(buf, p->dt, M, x, 0);
    if (call->res) echo_cpu_load(call->res, ECHO_F32, M, x, 1);
    if (!mw->twoshot) {
        MPI_COLL(mw, MPI_Allreduce(MPI_IN_PLACE, x, (int)M, MPI_FLOAT, MPI_SUM, mw->comm),
                 MPI_Iallreduce(MPI_IN_PLACE, x, (int)M, MPI_FLOAT, MPI_SUM, mw->comm, &rq_));
    } else {
        /* reduce-scatter as an all-to-all of fp32 shards, the owner's sum in
         * rank order j = 0..N-1 (local's order), then an all-gather */
        int sc[ECHO_MAX_RANKS], sd[ECHO_MAX_RANKS], rc[ECHO_MAX_RANKS], rd[ECHO_MAX_RANKS];
        size_t n = echo_plan_len(p, me), off = (size_t)me * p->shard;
        for (int j = 0; j < N; j++) {
            sc[j] = j != me ? (int)echo_plan_len(p, j) : 0;
            sd[j] = (int)((size_t)j * p->shard);
            rc[j] = j != me ? (int)n : 0;
            rd[j] = (int)((size_t)j * p->shard);
        }
        MPI_COLL(mw, MPI_Alltoallv(x, sc, sd, MPI_FLOAT, mw->xrecv, rc, rd, MPI_FLOAT, mw->comm),
                 MPI_Ialltoallv(x, sc, sd, MPI_FLOAT, mw->xrecv, rc, rd, MPI_FLOAT, mw->comm, &rq_));
        float *own = x + off;
        for (size_t i = 0; i < n; i++) {
            float s = 0;
            for (int j = 0; j < N; j++) {
                float v = j == me ? own[i] : mw->xrecv[(size_t)j * p->shard + i];
                s = j ? s + v : v;
            }
            own[i] = s;
        }
        for (int j = 0; j < N; j++) {
            mw->counts[j] = (int)echo_plan_len(p, j);
            mw->displs[j] = (int)((size_t)j * p->shard);
        }
        MPI_COLL(mw, MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, mw->counts, mw->displs, MPI_FLOAT, mw->comm),
                 MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, mw->counts, mw->displs, MPI_FLOAT, mw->comm,
                                 &rq_));
    }
    echo_cpu_store(x, M, buf, p->dt, bad);
    return 0;
}

/* One-shot: each rank's message straight to every peer (N-1 MPI_Isend and
 * N-1 MPI_Irecv into fixed-size slots of the world's largest one-shot
 * message), then one MPI_Waitall: one network step per call, where an
 * MPI_Allgather at 3 or 4 ranks takes two (Bruck, recursive doubling) and
 * its slots moved whole. Measured, SmolLM2 Q4_1 at tp 3, 3 hosts at
 * 1 Gbit/s, echo decode: see docs/network.md. The agreement travels in the
 * headers and echo.c checks it, so ranks that disagree on a call's site or
 * count (both one-shot) fail alike; a rank whose call is two-shot while a
 * peer's is one-shot is a count disagreement across the threshold, which
 * this exchange cannot see (the peers would wait on each other). The wait
 * is MPI_Waitall, never lazy: these calls are small (the threshold) and
 * complete in a spin; Open MPI yields between polls when the node is
 * oversubscribed (or with mpi_yield_when_idle, as scripts/hostlab.sh sets). */
#define OS_TAG 0x6f73 /* the one-shot's messages: the only point-to-point traffic on the world's communicator */

static uint8_t *mpi_os_send(echo_comm *c, size_t bytes) {
    (void)bytes;
    return mw_of(c->w)->os + (size_t)c->rank * c->w->os_msg_max;
}

static const uint8_t *mpi_os_recv(echo_comm *c, size_t bytes, int peer) {
    (void)bytes;
    return mw_of(c->w)->os + (size_t)peer * c->w->os_msg_max;
}

static int mpi_os_exchange(echo_comm *c, size_t bytes, const echo_call *call, char *err, size_t errlen) {
    (void)call;
    mpi_world *mw = mw_of(c->w);
    if (mpi_ready(mw, err, errlen)) return -1;
    int N = c->w->nranks, me = c->rank, k = 0;
    size_t slot = c->w->os_msg_max;
    MPI_Request rq[2 * ECHO_MAX_RANKS];
    for (int j = 0; j < N; j++)
        if (j != me) MPI_TRY(mw, MPI_Irecv(mw->os + (size_t)j * slot, (int)slot, MPI_BYTE, j, OS_TAG, mw->comm, &rq[k++]));
    for (int j = 0; j < N; j++)
        if (j != me)
            MPI_TRY(mw, MPI_Isend(mw->os + (size_t)me * slot, (int)bytes, MPI_BYTE, j, OS_TAG, mw->comm, &rq[k++]));
    MPI_TRY(mw, MPI_Waitall(k, rq, MPI_STATUSES_IGNORE));
    return 0;
}

static void mpi_set_abort(echo_world *w, int on) {
    mw_of(w)->aborted = on;
}

static int mpi_usable(const echo_world *w, char *why, size_t len) {
    const mpi_world *mw = mw_of(w);
    if (!mw->dead) return 1;
    snprintf(why, len, "%s", mw->why);
    return 0;
}

static void mpi_world_fini(echo_world *w) {
    mpi_world *mw = w->tp_world;
    if (!mw) return;
    int fin = 0;
    if (mw->comm != MPI_COMM_NULL && MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Comm_free(&mw->comm);
    free(mw->send);
    free(mw->recv);
    free(mw->p2);
    free(mw->xsum);
    free(mw->xrecv);
    free(mw->counts);
    free(mw->displs);
    free(mw->os);
    free(mw);
    w->tp_world = NULL;
}

static const echo_transport_ops mpi_ops = {
    .name = "mpi",
    .device_memory = 0,
    .comm_init = mpi_comm_init,
    .world_fini = mpi_world_fini,
    .p1_send = mpi_p1_send,
    .p1_exchange = mpi_p1_exchange,
    .p1_recv = mpi_p1_recv,
    .p2_send = mpi_p2_send,
    .p2_exchange = mpi_p2_exchange,
    .p2_recv = mpi_p2_recv,
    .exact = mpi_exact,
    .set_abort = mpi_set_abort,
    .usable = mpi_usable,
    .os_send = mpi_os_send,
    .os_exchange = mpi_os_exchange,
    .os_recv = mpi_os_recv,
};

static void *alloc64(size_t bytes) {
    size_t n = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n ? n : 64);
}

int echo_world_create_mpi(const echo_config *cfg, echo_world **out, char *err, size_t errlen) {
    *out = NULL;
    int inited = 0, fin = 0, level = 0, n = 0, me = 0;
    if (MPI_Initialized(&inited) != MPI_SUCCESS || !inited || MPI_Finalized(&fin) != MPI_SUCCESS || fin) {
        snprintf(err, errlen,
                 "echo: the mpi transport needs MPI initialised (MPI_Init_thread with "
                 "MPI_THREAD_FUNNELED or better) and not finalised");
        return -1;
    }
    if (MPI_Query_thread(&level) != MPI_SUCCESS || level < MPI_THREAD_FUNNELED) {
        snprintf(err, errlen, "echo: the mpi transport needs MPI_THREAD_FUNNELED or better (MPI_Init_thread)");
        return -1;
    }
    if (cfg && cfg->deferred) {
        snprintf(err, errlen, "echo: the mpi transport does not support deferred completion");
        return -1;
    }
    const char *impl = getenv("ECHO_MPI_EXACT");
    if (impl && *impl && strcmp(impl, "allreduce") && strcmp(impl, "twoshot")) {
        snprintf(err, errlen, "echo: ECHO_MPI_EXACT='%s' is neither 'allreduce' nor 'twoshot'", impl);
        return -1;
    }
    if (MPI_Comm_size(MPI_COMM_WORLD, &n) != MPI_SUCCESS || MPI_Comm_rank(MPI_COMM_WORLD, &me) != MPI_SUCCESS) {
        snprintf(err, errlen, "echo: mpi: cannot read the size and rank of MPI_COMM_WORLD");
        return -1;
    }
    echo_world *w;
    if (echo_world_alloc(n, cfg, &w, err, errlen)) return -1;
    w->tp = &mpi_ops;
    w->compute = &echo_host_compute;
    mpi_world *mw = calloc(1, sizeof *mw);
    if (!mw) {
        snprintf(err, errlen, "echo: out of memory");
        echo_world_free(w);
        return -1;
    }
    mw->comm = MPI_COMM_NULL;
    mw->me = me;
    mw->twoshot = impl && !strcmp(impl, "twoshot");
    mw->lazy = cfg && cfg->lazy_wait;
    w->tp_world = mw;
    /* From here on echo_world_destroy releases whatever was allocated. */
    size_t N = (size_t)n;
    const echo_plan *mp = &w->max_plan;
    mw->stride = (mp->wire + 63) / 64 * 64;
    echo_plan ep;
    echo_plan_init(&ep, w->exact_max, n, w->cfg.group_size, ECHO_BF16);
    /* MPI counts and displacements are ints */
    if (N * mw->stride > INT_MAX || ep.shard * N > INT_MAX || N * w->os_msg_max > INT_MAX) {
        snprintf(err, errlen,
                 "echo: max_count %zu is too large for the mpi transport's int counts (at most %d "
                 "bytes of messages per rank)",
                 cfg->max_count, INT_MAX);
        goto fail;
    }
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &mw->comm);
    if (rc != MPI_SUCCESS) {
        mw->comm = MPI_COMM_NULL;
        mpi_fail(NULL, rc, "MPI_Comm_dup", err, errlen);
        goto fail;
    }
    rc = MPI_Comm_set_errhandler(mw->comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        mpi_fail(NULL, rc, "MPI_Comm_set_errhandler", err, errlen);
        goto fail;
    }
    mw->counts = calloc(N, sizeof(int));
    mw->displs = calloc(N, sizeof(int));
    if (!mw->counts || !mw->displs) goto oom;
    if (n > 1 && mp->wire) {
        if (!(mw->send = alloc64(N * mw->stride)) || !(mw->recv = alloc64(N * mw->stride)) ||
            !(mw->p2 = alloc64(N * mw->stride)))
            goto oom;
    }
    if (n > 1 && w->os_msg_max && !(mw->os = alloc64(N * w->os_msg_max))) goto oom;
    if (n > 1 && w->exact_max > 0) {
        if (!(mw->xsum = alloc64(ep.shard * N * sizeof(float)))) goto oom;
        if (mw->twoshot && !(mw->xrecv = alloc64(ep.shard * N * sizeof(float)))) goto oom;
    }
    *out = w;
    return 0;
oom:
    snprintf(err, errlen, "echo: out of memory for the mpi transport's buffers (max_count %zu, %d ranks)",
             cfg->max_count, n);
fail:
    echo_world_destroy(w);
    return -1;
}

#else /* !ECHO_HAVE_MPI */

int echo_world_create_mpi(const echo_config *cfg, echo_world **out, char *err, size_t errlen) {
    (void)cfg;
    *out = NULL;
    snprintf(err, errlen,
             "echo: this build has no mpi transport (Open MPI was not found at build time: install "
             "openmpi-bin and libopenmpi-dev, then rebuild; see comm/README.md)");
    return -1;
}

#endif
