/*
 * comm/transport/local.c — the `local` transport: the ranks are threads of one
 * process and exchange through buffers owned by the world. The buffers are
 * in host memory (echo_world_create_local, host compute) or on one GPU that
 * every rank shares (echo_world_create_local_device in local_cuda.c, cuda
 * compute). Both run this file's schedule; a small table (echo_local_mem)
 * says where the buffers live, how a rank completes its enqueued device
 * work before a barrier, and does the exact path's arithmetic.
 *
 * Buffers, sized at world creation for max_count:
 *   p1[src][dst]  phase-1 message of rank src for shard dst    N*N * stride bytes
 *   p2[owner]     phase-2 message of shard `owner`             N * stride bytes
 *   sum           exact path: the reduced message (fp32)       only as large as the exact path needs
 *   posts[rank]   each rank's call descriptor, one cache line each (host memory always)
 * The transport is zero-copy: a rank codes straight into p1[me][peer] and
 * the peer decodes from there.
 *
 * Two barriers per call (A after phase 1, B after phase 2) make reuse safe
 * without double buffering:
 *   - rank j writes p1[j][*] and posts[j] for call t+1 only after passing
 *     B(t); every reader of them for call t read them before reaching B(t).
 *   - owner c writes p2[c] (and sum) for call t+1 only after A(t+1), which no
 *     rank reaches before it finished reading p2 (and sum) of call t.
 *   - a rank's own buffer (and residual) is read by peers only between A
 *     and B (exact path); the rank writes its buffer after B.
 *   - a call the ranks disagree on fails on every rank right after A; they
 *     still meet at a barrier in place of B before leaving, so that the
 *     first rule holds for the posts of the failed call too.
 * On device memory "read" and "written" mean "completed on the GPU": a rank
 * synchronises its stream before each barrier (its kernels that wrote its
 * messages, its buffer or the sum, or read a peer's, are then done), and it
 * reads p2 and sum only in the last step of a call, which synchronises too
 * (the cuda compute's finish, the device store) before the call returns.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/echo_internal.h"
#include "comm/transport/transport.h"

typedef struct local_post {
    _Alignas(64) echo_call call;
} local_post;

/* A barrier that can be aborted: a rank that failed outside the collective
 * (an op error, out of memory) must not leave its peers waiting forever,
 * which a pthread_barrier_t would. */
typedef struct local_barrier_t {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, waiting;
    unsigned long gen;
    int aborted;
} local_barrier_t;

typedef struct local_world {
    local_barrier_t bar;
    const echo_local_mem *mem;
    int device;    /* GPU of every rank, -1 on host memory */
    size_t stride; /* bytes between wire messages: one shard message at max_count, cache-line rounded */
    uint8_t *p1;
    uint8_t *p2;
    float *sum;
    local_post *posts;
    uint8_t *os;      /* one-shot: N messages, os_stride apart (host memory only) */
    size_t os_stride;
} local_world;

static local_world *lw_of(const echo_comm *c) {
    return c->w->tp_world;
}

static void *alloc64(size_t bytes) {
    size_t n = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n ? n : 64);
}

static void local_world_fini(echo_world *w) {
    local_world *lw = w->tp_world;
    if (!lw) return;
    pthread_mutex_destroy(&lw->bar.mu);
    pthread_cond_destroy(&lw->bar.cv);
    lw->mem->free(lw->device, lw->p1);
    lw->mem->free(lw->device, lw->p2);
    lw->mem->free(lw->device, lw->sum);
    free(lw->os);
    free(lw->posts);
    free(lw);
    w->tp_world = NULL;
}

/* Every rank of the world works on the world's GPU (-1: host memory); the
 * compute allocates there after this. */
static int local_comm_init(echo_comm *c, char *err, size_t errlen) {
    (void)err, (void)errlen;
    c->device = lw_of(c)->device;
    return 0;
}

static uint8_t *local_p1_send(echo_comm *c, int peer) {
    local_world *lw = lw_of(c);
    return lw->p1 + ((size_t)c->rank * (size_t)c->w->nranks + (size_t)peer) * lw->stride;
}

static const uint8_t *local_p1_recv(echo_comm *c, int peer) {
    local_world *lw = lw_of(c);
    return lw->p1 + ((size_t)peer * (size_t)c->w->nranks + (size_t)c->rank) * lw->stride;
}

static uint8_t *local_p2_send(echo_comm *c, const echo_plan *p) {
    (void)p;
    return lw_of(c)->p2 + (size_t)c->rank * lw_of(c)->stride;
}

static const uint8_t *local_p2_recv(echo_comm *c, const echo_plan *p, int owner) {
    (void)p;
    return lw_of(c)->p2 + (size_t)owner * lw_of(c)->stride;
}

/* 0 when every rank arrived; -1 when the world was aborted before or while
 * this rank waited. */
static int local_barrier(local_world *lw) {
    local_barrier_t *b = &lw->bar;
    int rc = 0;
    pthread_mutex_lock(&b->mu);
    if (b->aborted) {
        rc = -1;
    } else if (++b->waiting == b->n) {
        b->waiting = 0;
        b->gen++;
        pthread_cond_broadcast(&b->cv);
    } else {
        unsigned long gen = b->gen;
        while (gen == b->gen && !b->aborted)
            pthread_cond_wait(&b->cv, &b->mu);
        if (gen == b->gen) rc = -1; /* woken by an abort, not by the last arrival */
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static void local_set_abort(echo_world *w, int on) {
    local_barrier_t *b = &((local_world *)w->tp_world)->bar;
    pthread_mutex_lock(&b->mu);
    b->aborted = on;
    b->waiting = 0;
    if (on) pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static int aborted_msg(char *err, size_t errlen) {
    snprintf(err, errlen, "echo: the collective was aborted because another rank failed");
    return -1;
}

/* A step of this rank alone failed inside the collective (a device error;
 * err holds it): abort the world so that peers waiting at, or arriving at,
 * a barrier of this call fail instead of waiting forever. */
static int rank_failed(echo_comm *c) {
    local_set_abort(c->w, 1);
    return -1;
}

/* Complete this rank's enqueued device work (nothing to do on host memory). */
static int local_sync(echo_comm *c, void *stream, char *err, size_t errlen) {
    const echo_local_mem *m = lw_of(c)->mem;
    if (m->sync && m->sync(c, stream, err, errlen)) return rank_failed(c);
    return 0;
}

/* Post this rank's call, wait for every rank, and check they all make the
 * same call. Every rank compares every post with its own, so a
 * disagreement fails the call on all ranks: whenever two posts differ,
 * some post differs from each rank's own. */
static int post_and_wait(echo_comm *c, const echo_call *call, char *err, size_t errlen) {
    local_world *lw = lw_of(c);
    lw->posts[c->rank].call = *call;
    if (local_barrier(lw)) return aborted_msg(err, errlen);
    for (int j = 0; j < c->w->nranks; j++) {
        const echo_call *o = &lw->posts[j].call;
        if (o->site != call->site || o->count != call->count || o->dt != call->dt || o->path != call->path) {
            snprintf(err, errlen,
                     "echo: ranks disagree: rank %d calls site %d with %zu %s values (%s path), rank %d site %d "
                     "with %zu %s values (%s path); the pass is aborted",
                     c->rank, call->site, call->count, call->dt == ECHO_F32 ? "f32" : "bf16",
                     echo_preset_name(call->path), j, o->site, o->count, o->dt == ECHO_F32 ? "f32" : "bf16",
                     echo_preset_name(o->path));
            /* Every rank leaves here, so this barrier stands in for B: a
             * rank that left at once could post its next call over the
             * post a slower peer has still to read, and the ranks would
             * then meet at barriers of different calls. The outcome is
             * the same if it is aborted meanwhile. */
            local_barrier(lw);
            return -1;
        }
    }
    return 0;
}

/* Phase 1 wrote this rank's messages (and residual) on its stream: complete
 * them before peers may decode them. */
static int local_p1_exchange(echo_comm *c, const echo_plan *p, const echo_call *call, void *stream, char *err,
                             size_t errlen) {
    (void)p;
    if (local_sync(c, stream, err, errlen)) return -1;
    return post_and_wait(c, call, err, errlen);
}

/* Phase 2 wrote this rank's shard message and read its peers' phase-1
 * messages: both must be complete before B (peers then decode the former
 * and overwrite the latter in their next call). */
static int local_p2_exchange(echo_comm *c, const echo_plan *p, void *stream, char *err, size_t errlen) {
    (void)p;
    if (local_sync(c, stream, err, errlen)) return -1;
    if (local_barrier(lw_of(c))) return aborted_msg(err, errlen);
    return 0;
}

static int local_exact(echo_comm *c, const echo_plan *p, const echo_call *call, void *buf, size_t *bad, void *stream,
                       char *err, size_t errlen) {
    local_world *lw = lw_of(c);
    const echo_local_mem *m = lw->mem;
    *bad = ECHO_NO_INDEX;
    /* Peers read this rank's buffer (and residual) after A: whatever the
     * caller enqueued to produce it must be complete first. */
    if (local_sync(c, stream, err, errlen)) return -1;
    if (post_and_wait(c, call, err, errlen)) return -1;
    size_t n = echo_plan_len(p, c->rank), off = (size_t)c->rank * p->shard, esz = echo_dtype_size(p->dt);
    if (n > 0) {
        const void *x[ECHO_MAX_RANKS];
        const float *res[ECHO_MAX_RANKS];
        for (int j = 0; j < p->nranks; j++) {
            const echo_call *o = &lw->posts[j].call;
            x[j] = (const char *)o->x + off * esz;
            res[j] = o->res ? o->res + off : NULL;
        }
        if (m->sum(c, p->nranks, p->dt, x, res, n, lw->sum + off, stream, err, errlen)) return rank_failed(c);
    }
    /* The sum is written and the peers' buffers are read before B: after
     * it, peers overwrite their buffers and read the whole sum. */
    if (local_sync(c, stream, err, errlen)) return -1;
    if (local_barrier(lw)) return aborted_msg(err, errlen);
    if (m->store(c, lw->sum, buf, p->dt, p->count, bad, stream, err, errlen)) return rank_failed(c);
    return 0;
}

/* One-shot (host memory): rank j writes os[j], every rank reads all of
 * them between the two barriers; no rank writes its next message before
 * every rank is past the second. */
static uint8_t *local_os_send(echo_comm *c, size_t bytes) {
    (void)bytes;
    return lw_of(c)->os + (size_t)c->rank * lw_of(c)->os_stride;
}

static const uint8_t *local_os_recv(echo_comm *c, size_t bytes, int peer) {
    (void)bytes;
    return lw_of(c)->os + (size_t)peer * lw_of(c)->os_stride;
}

static int local_os_exchange(echo_comm *c, size_t bytes, const echo_call *call, char *err, size_t errlen) {
    (void)bytes, (void)call;
    if (local_barrier(lw_of(c))) return aborted_msg(err, errlen);
    return 0;
}

static int local_os_done(echo_comm *c, char *err, size_t errlen) {
    if (local_barrier(lw_of(c))) return aborted_msg(err, errlen);
    return 0;
}

/* A local world cannot die: an abort is cleared by echo_world_clear_abort. */
static int local_usable(const echo_world *w, char *why, size_t len) {
    (void)w, (void)why, (void)len;
    return 1;
}

/* One table per memory: the schedule is the same, the flag differs. */
#define LOCAL_OPS(NAME, DEVICE_MEMORY)                                                                                 \
    {                                                                                                                  \
        .name = NAME, .device_memory = DEVICE_MEMORY, .comm_init = local_comm_init, .world_fini = local_world_fini,    \
        .p1_send = local_p1_send, .p1_exchange = local_p1_exchange, .p1_recv = local_p1_recv,                          \
        .p2_send = local_p2_send, .p2_exchange = local_p2_exchange, .p2_recv = local_p2_recv, .exact = local_exact,    \
        .set_abort = local_set_abort, .usable = local_usable,                                                          \
    }

static const echo_transport_ops local_host_ops = {
    .name = "local", .device_memory = 0, .comm_init = local_comm_init, .world_fini = local_world_fini,
    .p1_send = local_p1_send, .p1_exchange = local_p1_exchange, .p1_recv = local_p1_recv,
    .p2_send = local_p2_send, .p2_exchange = local_p2_exchange, .p2_recv = local_p2_recv, .exact = local_exact,
    .set_abort = local_set_abort, .usable = local_usable,
    .os_send = local_os_send, .os_exchange = local_os_exchange, .os_recv = local_os_recv, .os_done = local_os_done,
};
static const echo_transport_ops local_device_ops = LOCAL_OPS("local-device", 1);

int echo_local_world_create(int nranks, int device, const echo_local_mem *mem, const echo_compute_ops *compute,
                            const echo_config *cfg, echo_world **out, char *err, size_t errlen) {
    echo_world *w;
    *out = NULL;
    if (cfg && cfg->deferred) {
        /* its ranks meet on the host at every call: nothing to defer */
        snprintf(err, errlen,
                 "echo: deferred completion (echo_config.deferred) needs the nccl transport; the local one "
                 "synchronises the ranks at every call");
        return -1;
    }
    if (echo_world_alloc(nranks, cfg, &w, err, errlen)) return -1;
    w->tp = mem->device_memory ? &local_device_ops : &local_host_ops;
    w->compute = compute;
    local_world *lw = calloc(1, sizeof *lw);
    if (!lw) {
        snprintf(err, errlen, "echo: out of memory");
        echo_world_free(w);
        return -1;
    }
    if (pthread_mutex_init(&lw->bar.mu, NULL) != 0) {
        snprintf(err, errlen, "echo: cannot create a barrier for %d ranks", nranks);
        free(lw);
        echo_world_free(w);
        return -1;
    }
    if (pthread_cond_init(&lw->bar.cv, NULL) != 0) {
        snprintf(err, errlen, "echo: cannot create a barrier for %d ranks", nranks);
        pthread_mutex_destroy(&lw->bar.mu);
        free(lw);
        echo_world_free(w);
        return -1;
    }
    /* From here on echo_world_destroy releases whatever was allocated. */
    w->tp_world = lw;
    lw->bar.n = nranks;
    lw->mem = mem;
    lw->device = device;
    const echo_plan *mp = &w->max_plan;
    size_t N = (size_t)nranks;
    lw->stride = (mp->wire + 63) / 64 * 64;
    lw->posts = alloc64(N * sizeof *lw->posts);
    if (!lw->posts) {
        snprintf(err, errlen, "echo: out of memory for %d call posts", nranks);
        goto fail;
    }
    if (nranks > 1 && mp->wire) {
        if (mem->alloc(device, N * N * lw->stride, (void **)&lw->p1, err, errlen)) goto fail;
        if (mem->alloc(device, N * lw->stride, (void **)&lw->p2, err, errlen)) goto fail;
    }
    if (nranks > 1 && w->exact_max > 0) {
        echo_plan ep;
        echo_plan_init(&ep, w->exact_max, nranks, w->cfg.group_size, ECHO_BF16);
        if (mem->alloc(device, ep.shard * N * sizeof(float), (void **)&lw->sum, err, errlen)) goto fail;
    }
    if (!mem->device_memory && w->os_msg_max) {
        lw->os_stride = (w->os_msg_max + 63) / 64 * 64;
        if (!(lw->os = alloc64(N * lw->os_stride))) {
            snprintf(err, errlen, "echo: out of memory for the one-shot buffers (%zu bytes)", N * lw->os_stride);
            goto fail;
        }
    }
    *out = w;
    return 0;
fail:
    echo_world_destroy(w);
    return -1;
}

/* ---- host memory ---- */

static int host_mem_alloc(int device, size_t bytes, void **out, char *err, size_t errlen) {
    (void)device;
    *out = alloc64(bytes);
    if (!*out) {
        snprintf(err, errlen, "echo: out of memory for the local transport's buffers (%zu bytes)", bytes);
        return -1;
    }
    return 0;
}

static void host_mem_free(int device, void *p) {
    (void)device;
    free(p);
}

/* Fixed order j = 0..N-1, each input then its residual: every replica of
 * the result is this one sum (the device twin adds in the same order). */
static int host_mem_sum(echo_comm *c, int nranks, echo_dtype dt, const void *const *x, const float *const *res,
                        size_t n, float *sum, void *stream, char *err, size_t errlen) {
    (void)c, (void)stream, (void)err, (void)errlen;
    for (int j = 0; j < nranks; j++) {
        echo_cpu_load(x[j], dt, n, sum, j > 0);
        if (res[j]) echo_cpu_load(res[j], ECHO_F32, n, sum, 1);
    }
    return 0;
}

static int host_mem_store(echo_comm *c, const float *in, void *buf, echo_dtype dt, size_t n, size_t *bad, void *stream,
                          char *err, size_t errlen) {
    (void)c, (void)stream, (void)err, (void)errlen;
    echo_cpu_store(in, n, buf, dt, bad);
    return 0;
}

static const echo_local_mem local_host_mem = {
    .device_memory = 0,
    .alloc = host_mem_alloc,
    .free = host_mem_free,
    .sync = NULL,
    .sum = host_mem_sum,
    .store = host_mem_store,
};

int echo_world_create_local(int nranks, const echo_config *cfg, echo_world **out, char *err, size_t errlen) {
    return echo_local_world_create(nranks, -1, &local_host_mem, &echo_host_compute, cfg, out, err, errlen);
}
