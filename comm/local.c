/*
 * comm/local.c — the `local` transport: the ranks are threads of one
 * process and exchange through buffers owned by the world, in host memory
 * (device memory is future work: the same buffers, with the cuda compute).
 *
 * Buffers, sized at world creation for max_count:
 *   p1[src][dst]  phase-1 message of rank src for shard dst    N*N * stride bytes
 *   p2[owner]     phase-2 message of shard `owner`             N * stride bytes
 *   sum           exact path: the reduced message (fp32)       only as large as the exact path needs
 *   posts[rank]   each rank's call descriptor, one cache line each
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
 *     and B (exact path, track_error); the rank writes its buffer after B.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/echo_internal.h"

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
    size_t stride; /* bytes between wire messages: one shard message at max_count, cache-line rounded */
    uint8_t *p1;
    uint8_t *p2;
    float *sum;
    local_post *posts;
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
    free(lw->p1);
    free(lw->p2);
    free(lw->sum);
    free(lw->posts);
    free(lw);
    w->tp_world = NULL;
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
        while (gen == b->gen && !b->aborted) pthread_cond_wait(&b->cv, &b->mu);
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

/* Post this rank's call, wait for every rank, and check they all make the
 * same call. Every rank compares every post with its own, so a
 * disagreement fails the call on all ranks. */
static int post_and_wait(echo_comm *c, const echo_call *call, char *err, size_t errlen) {
    local_world *lw = lw_of(c);
    lw->posts[c->rank].call = *call;
    if (local_barrier(lw)) return aborted_msg(err, errlen);
    for (int j = 0; j < c->w->nranks; j++) {
        const echo_call *o = &lw->posts[j].call;
        if (o->site != call->site || o->count != call->count || o->dt != call->dt || o->mode != call->mode) {
            snprintf(err, errlen,
                     "echo: ranks disagree: rank %d calls site %d with %zu %s values (%s path), rank %d site %d "
                     "with %zu %s values (%s path); the pass is aborted",
                     c->rank, call->site, call->count, call->dt == ECHO_F32 ? "f32" : "bf16",
                     echo_mode_name(call->mode), j, o->site, o->count, o->dt == ECHO_F32 ? "f32" : "bf16",
                     echo_mode_name(o->mode));
            return -1;
        }
    }
    return 0;
}

static int local_p1_exchange(echo_comm *c, const echo_plan *p, const echo_call *call, void *stream, char *err,
                             size_t errlen) {
    (void)p, (void)stream;
    return post_and_wait(c, call, err, errlen);
}

static int local_p2_exchange(echo_comm *c, const echo_plan *p, void *stream, char *err, size_t errlen) {
    (void)p, (void)stream;
    if (local_barrier(lw_of(c))) return aborted_msg(err, errlen);
    return 0;
}

/* fp64 sum of the raw inputs (no residuals) over the own shard; peers'
 * buffers are readable between the barriers. */
static int local_exact_ref(echo_comm *c, const echo_plan *p, double *ref, char *err, size_t errlen) {
    (void)err, (void)errlen;
    local_world *lw = lw_of(c);
    size_t n = echo_plan_len(p, c->rank), off = (size_t)c->rank * p->shard, esz = echo_dtype_size(p->dt);
    float tmp[256];
    for (size_t i = 0; i < n; i++)
        ref[i] = 0;
    for (int j = 0; j < p->nranks; j++) {
        const char *x = (const char *)lw->posts[j].call.x + off * esz;
        for (size_t b = 0; b < n; b += 256) {
            size_t m = n - b < 256 ? n - b : 256;
            echo_cpu_load(x + b * esz, p->dt, m, tmp, 0);
            for (size_t i = 0; i < m; i++)
                ref[b + i] += tmp[i];
        }
    }
    return 0;
}

static int local_exact(echo_comm *c, const echo_plan *p, const echo_call *call, void *buf, double *ref, size_t *bad,
                       void *stream, char *err, size_t errlen) {
    (void)stream;
    local_world *lw = lw_of(c);
    *bad = ECHO_NO_INDEX;
    if (post_and_wait(c, call, err, errlen)) return -1;
    size_t n = echo_plan_len(p, c->rank), off = (size_t)c->rank * p->shard, esz = echo_dtype_size(p->dt);
    float *s = lw->sum + off;
    /* Fixed order j = 0..N-1: every replica of the result is this one sum. */
    for (int j = 0; j < p->nranks; j++) {
        const echo_call *o = &lw->posts[j].call;
        echo_cpu_load((const char *)o->x + off * esz, p->dt, n, s, j > 0);
        if (o->res) echo_cpu_load(o->res + off, ECHO_F32, n, s, 1);
    }
    if (ref) local_exact_ref(c, p, ref, err, errlen);
    if (local_barrier(lw)) return aborted_msg(err, errlen);
    echo_cpu_store(lw->sum, p->count, buf, p->dt, bad);
    return 0;
}

static const echo_transport_ops local_ops = {
    .name = "local",
    .device_memory = 0,
    .world_fini = local_world_fini,
    .p1_send = local_p1_send,
    .p1_exchange = local_p1_exchange,
    .p1_recv = local_p1_recv,
    .p2_send = local_p2_send,
    .p2_exchange = local_p2_exchange,
    .p2_recv = local_p2_recv,
    .exact = local_exact,
    .exact_ref = local_exact_ref,
    .set_abort = local_set_abort,
};

int echo_world_create_local(int nranks, const echo_config *cfg, echo_world **out, char *err, size_t errlen) {
    echo_world *w;
    if (echo_world_alloc(nranks, cfg, &w, err, errlen)) return -1;
    w->tp = &local_ops;
    w->compute = &echo_host_compute;
    local_world *lw = calloc(1, sizeof *lw);
    if (!lw) {
        snprintf(err, errlen, "echo: out of memory");
        echo_world_free(w);
        return -1;
    }
    w->tp_world = lw;
    if (pthread_mutex_init(&lw->bar.mu, NULL) != 0 || pthread_cond_init(&lw->bar.cv, NULL) != 0) {
        snprintf(err, errlen, "echo: cannot create a barrier for %d ranks", nranks);
        free(lw);
        echo_world_free(w);
        return -1;
    }
    lw->bar.n = nranks;
    const echo_plan *mp = &w->max_plan;
    size_t N = (size_t)nranks;
    lw->stride = (mp->wire + 63) / 64 * 64;
    lw->posts = alloc64(N * sizeof *lw->posts);
    if (!lw->posts) goto oom;
    if (nranks > 1 && cfg->mode != ECHO_MODE_EXACT) {
        lw->p1 = alloc64(N * N * lw->stride);
        lw->p2 = alloc64(N * lw->stride);
        if (!lw->p1 || !lw->p2) goto oom;
    }
    if (nranks > 1 && w->exact_max > 0) {
        echo_plan ep;
        echo_plan_init(&ep, w->exact_max, nranks, w->cfg.group_size, ECHO_BF16);
        lw->sum = alloc64(ep.shard * N * sizeof(float));
        if (!lw->sum) goto oom;
    }
    *out = w;
    return 0;
oom:
    snprintf(err, errlen, "echo: out of memory for the local transport's buffers (max_count %zu, %d ranks)",
             cfg->max_count, nranks);
    echo_world_destroy(w);
    return -1;
}
