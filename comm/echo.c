/*
 * comm/echo.c — the Echo algorithm above the transports (the tables it
 * reads are in preset.c): configuration,
 * the per-rank pass state (begin_pass, increasing sites, the residual
 * carried from one call to the next), the size policy, the two-shot
 * schedule, statistics. See comm/echo.h for the contract and docs/echo.md
 * for the derivation.
 *
 * The schedule of one quantized call on rank i (N ranks, shard c owned by
 * rank c):
 *   phase 1   y = x + r; code every shard c != i into the message for rank
 *             c; r = y - decode                          (compute->phase1)
 *             all-to-all                                  (tp->p1_exchange)
 *   phase 2   S = own shard of x + decoded shards of the peers, in fp32;
 *             z = S + g; code; g = z - decode            (compute->phase2)
 *             all-gather                                  (tp->p2_exchange)
 *   finish    every rank decodes every shard into buf     (compute->finish)
 * Error reporting never breaks the collective: a value that cannot be coded
 * travels as a poisoned group and every rank finds it in `finish`, so all
 * ranks fail the same call.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/codec/codec.h"
#include "comm/codec/echo_codec.h"
#include "comm/echo_internal.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- worlds ---- */

int echo_world_alloc(int nranks, const echo_config *cfg, echo_world **out, char *err, size_t errlen) {
    *out = NULL;
    if (!cfg) {
        snprintf(err, errlen, "echo: no config");
        return -1;
    }
    if (nranks < 1 || nranks > ECHO_MAX_RANKS) {
        snprintf(err, errlen, "echo: %d ranks is outside [1, %d] (ECHO_MAX_RANKS)", nranks, ECHO_MAX_RANKS);
        return -1;
    }
    const echo_codec_info *ci = echo_codec_get(cfg->codec);
    if (!ci) {
        snprintf(err, errlen, "echo: unknown codec %d", (int)cfg->codec);
        return -1;
    }
    if (cfg->feedback && ci->lossless) {
        snprintf(err, errlen, "echo: error feedback needs a lossy codec; %s is exact and leaves no error to feed back",
                 ci->name);
        return -1;
    }
    int group = cfg->group_size ? cfg->group_size : ci->default_group;
    if (!echo_priv_group_valid(ci, group)) {
        snprintf(err, errlen, "echo: group size %d is not a power of two in [%d, %d] (codec %s)", group, ci->min_group,
                 ECHO_MAX_GROUP, ci->name);
        return -1;
    }
    if (cfg->n_sites < 1) {
        snprintf(err, errlen, "echo: n_sites must be at least 1 (got %d)", cfg->n_sites);
        return -1;
    }
    /* Bounds that keep every size computation (padded message, N*N wire
     * buffers, fp64 scratch) far from overflow on 64-bit size_t. */
    if (cfg->max_count == 0 || cfg->max_count > ((size_t)1 << 40)) {
        snprintf(err, errlen, "echo: max_count %zu is outside [1, 2^40]", cfg->max_count);
        return -1;
    }
    int tail_sites;
    echo_codec_id tail_codec;
    if (echo_config_tail(cfg, &tail_sites, &tail_codec, err, errlen)) return -1;
    echo_world *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "echo: out of memory");
        return -1;
    }
    w->cfg = *cfg;
    /* a lossless world has no error to keep from the logits */
    w->cfg.tail_sites = ci->lossless ? 0 : tail_sites;
    w->cfg.tail_codec = w->cfg.tail_sites ? tail_codec : ECHO_CODEC_NONE;
    w->cfg.group_size = group;
    if (w->cfg.codec == ECHO_CODEC_DEFAULT) w->cfg.codec = ECHO_DEFAULT_CODEC;
    w->cfg.feedback = cfg->feedback != 0;
    w->nranks = nranks;
    w->plain = ci->lossless && ci->code_bits == 32;
    w->path = echo_priv_preset_of(w->cfg.codec, w->cfg.feedback);
    /* bf16 is the smallest element: the widest message in elements. */
    echo_plan_init(&w->max_plan, cfg->max_count, nranks, group, ECHO_BF16);
    echo_priv_plan_codec(&w->max_plan, w->cfg.codec);
    /* The exact path takes every call of a `none` world, else only calls
     * below min_bytes (the size policy); its buffers are sized for that.
     * A `none` world moves no two-shot messages. */
    if (w->plain) {
        w->exact_max = cfg->max_count;
        w->max_plan.wire = 0;
    } else {
        w->exact_max = cfg->min_bytes / 2 < cfg->max_count ? cfg->min_bytes / 2 : cfg->max_count;
        /* the tail: exact (also bf16's fallback on device memory) at any
         * count; bf16's shard messages are wider than a 4-bit codec's */
        if (w->cfg.tail_sites) w->exact_max = cfg->max_count;
        if (w->cfg.tail_codec == ECHO_CODEC_BF16) {
            echo_plan bp = w->max_plan;
            echo_priv_plan_codec(&bp, ECHO_CODEC_BF16);
            if (bp.wire > w->max_plan.wire) w->max_plan.wire = bp.wire;
        }
    }
    /* the one-shot threshold, in bytes of fp32 values whatever the
     * activations' dtype (so the widest message, fp32 for exact, is the
     * threshold plus the header) */
    const char *os = getenv("ECHO_ONESHOT_BYTES");
    w->os_bytes = cfg->oneshot_bytes;
    if (os && *os) {
        char *end;
        unsigned long long v = strtoull(os, &end, 10);
        if (*end || v > ((unsigned long long)1 << 30)) {
            snprintf(err, errlen, "echo: ECHO_ONESHOT_BYTES='%s' is not a byte count up to 1 GiB", os);
            free(w);
            return -1;
        }
        w->os_bytes = (size_t)v;
    }
    if (w->os_bytes && nranks > 1 && (w->plain || !ci->lossless)) {
        /* The widest message the world's one-shot calls can send: exact
         * (fp32) in a `none` world or under the size policy, else coded
         * (the mpi transport moves every message at this size) */
        size_t n = w->os_bytes / 4 < cfg->max_count ? w->os_bytes / 4 : cfg->max_count;
        size_t a = w->plain || cfg->min_bytes || w->cfg.tail_sites ? echo_os_msg_bytes(n, ECHO_BF16, 1, w->cfg.codec, group) : 0;
        size_t b = w->plain ? 0 : echo_os_msg_bytes(n, ECHO_BF16, 0, w->cfg.codec, group);
        w->os_msg_max = ((a > b ? a : b) + 63) / 64 * 64;
    } else {
        w->os_bytes = 0; /* bf16 keeps two-shot; one rank moves nothing */
    }
    pthread_mutex_init(&w->mu, NULL);
    *out = w;
    return 0;
}

void echo_world_free(echo_world *w) {
    if (!w) return;
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void echo_world_destroy(echo_world *w) {
    if (!w) return;
    if (w->tp && w->tp->world_fini) w->tp->world_fini(w);
    echo_world_free(w);
}

void echo_world_get_config(const echo_world *w, echo_config *out) {
    *out = w->cfg;
    out->oneshot_bytes = w->os_bytes; /* resolved: $ECHO_ONESHOT_BYTES, 0 for bf16 and one rank */
    if (out->tail_codec == ECHO_CODEC_BF16 && w->tp && w->tp->device_memory) out->tail_codec = ECHO_CODEC_NONE;
}

int echo_world_nranks(const echo_world *w) {
    return w->nranks;
}

/* ---- comms ---- */

void echo_comm_set_workers(echo_comm *c, const echo_workers *w) {
    c->workers = w && w->run && w->nthreads > 1 ? *w : (echo_workers){0};
}

int echo_comm_create(echo_world *w, int rank, echo_comm **out, char *err, size_t errlen) {
    *out = NULL;
    if (!w || rank < 0 || rank >= w->nranks) {
        snprintf(err, errlen, "echo: rank %d is outside the world's [0, %d)", rank, w ? w->nranks : 0);
        return -1;
    }
    pthread_mutex_lock(&w->mu);
    int taken = w->has_comm[rank];
    w->has_comm[rank] = 1;
    pthread_mutex_unlock(&w->mu);
    if (taken) {
        snprintf(err, errlen, "echo: rank %d already has a comm in this world", rank);
        return -1;
    }
    int tp_ready = 0, compute_ready = 0;
    echo_comm *c = NULL;
    const echo_codec_info *ci = echo_codec_get(w->cfg.codec);
    if (ci->host_only && w->tp->device_memory) {
        /* e.g. the bf16 steps are host loops in this file (no kernels yet) */
        snprintf(err, errlen, "echo: codec %s runs on host transports only (local on host memory, mpi), not on %s",
                 ci->name, w->tp->name);
        goto fail;
    }
    if (ci->rotate && !w->compute->unrotate) {
        snprintf(err, errlen, "echo: codec %s needs rotation kernels the %s compute lacks", ci->name, w->compute->name);
        goto fail;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "echo: out of memory");
        goto fail;
    }
    c->w = w;
    c->rank = rank;
    c->device = -1;
    c->last_site = -1;
    const echo_plan *mp = &w->max_plan;
    size_t padded = mp->shard * (size_t)w->nranks;
    c->sites = calloc((size_t)w->cfg.n_sites, sizeof *c->sites);
    if (!c->sites) {
        snprintf(err, errlen, "echo: out of memory for %d site records", w->cfg.n_sites);
        goto fail;
    }
    /* transport first: it picks the device the compute allocates on */
    if (w->tp->comm_init && w->tp->comm_init(c, err, errlen)) goto fail;
    tp_ready = 1;
    if (w->compute->comm_init(c, err, errlen)) goto fail;
    compute_ready = 1;
    if (w->os_bytes && w->tp->os_exchange && !w->tp->device_memory) {
        size_t n = w->os_bytes / 4 < w->cfg.max_count ? w->os_bytes / 4 : w->cfg.max_count;
        n = (n + ECHO_MAX_GROUP - 1) / ECHO_MAX_GROUP * ECHO_MAX_GROUP; /* whole groups */
        if (!(c->os_y = malloc(n * sizeof(float)))) {
            snprintf(err, errlen, "echo: out of memory for the one-shot scratch (%zu values)", n);
            goto fail;
        }
    }
    if (w->cfg.feedback && w->nranks > 1) {
        c->res_bytes = padded * sizeof(float);
        if (w->compute->alloc(c, c->res_bytes, (void **)&c->res, err, errlen)) {
            c->res_bytes = 0;
            goto fail;
        }
    }
    *out = c;
    return 0;
fail:
    if (c) {
        if (c->res) w->compute->free(c, c->res);
        if (compute_ready) w->compute->comm_fini(c);
        if (tp_ready && w->tp->comm_fini) w->tp->comm_fini(c);
        free(c->os_y);
        free(c->sites);
        free(c);
    }
    pthread_mutex_lock(&w->mu);
    w->has_comm[rank] = 0;
    pthread_mutex_unlock(&w->mu);
    return -1;
}

void echo_comm_destroy(echo_comm *c) {
    if (!c) return;
    echo_world *w = c->w;
    if (c->res) w->compute->free(c, c->res);
    w->compute->comm_fini(c);
    if (w->tp->comm_fini) w->tp->comm_fini(c);
    free(c->os_y);
    free(c->sites);
    pthread_mutex_lock(&w->mu);
    w->has_comm[c->rank] = 0;
    pthread_mutex_unlock(&w->mu);
    free(c);
}

size_t echo_comm_slot_bytes(const echo_comm *c) {
    return c ? c->res_bytes : 0;
}

int echo_begin_pass(echo_comm *c, echo_pass_mode mode, char *err, size_t errlen) {
    if (!c) {
        snprintf(err, errlen, "echo: begin_pass on a NULL comm");
        return -1;
    }
    if (mode != ECHO_PASS_EAGER && mode != ECHO_PASS_CAPTURE && mode != ECHO_PASS_REPLAY) {
        snprintf(err, errlen, "echo: begin_pass: unknown mode %d", (int)mode);
        return -1;
    }
    /* Invalidating is enough: the first call of the pass reads the residual
     * as zero and overwrites all of it, so no memset per pass. */
    c->in_pass = 1;
    c->aborted = 0;
    c->last_site = -1;
    c->res_valid = 0;
    c->pass_count = 0;
    c->replay = 0;
    c->armed = 0;
    c->failed_alike = 0;
    c->mode = mode;
    if (c->w->tp->deferred) c->w->tp->deferred->pass_begin(c);
    return mode == ECHO_PASS_REPLAY ? echo_set_replay(c, 1, err, errlen) : 0;
}

int echo_pass_failed_alike(const echo_comm *c) {
    return c && c->failed_alike;
}

/* The deferred pass's one wait and its non-finite check (a no-op when
 * nothing was enqueued). */
static int wait_pass(echo_comm *c, void *stream, char *err, size_t errlen) {
    c->replay = 0;
    if (!c->w->cfg.deferred || !c->armed) return 0;
    c->armed = 0;
    if (c->aborted) {
        /* an earlier call of the pass failed and said why; its collectives
         * may be pending, and the world is aborted, so no wait */
        snprintf(err, errlen, "echo: end_pass of a pass aborted by an earlier error");
        return -1;
    }
    int site = -1;
    size_t bad = ECHO_NO_INDEX;
    if (c->w->tp->deferred->wait(c, stream, err, errlen)) {
        c->aborted = 1;
        c->res_valid = 0;
        return -1;
    }
    if (c->w->compute->pass_read(c, stream, &site, &bad, err, errlen)) {
        c->w->tp->set_abort(c->w, 1);
        c->aborted = 1;
        c->res_valid = 0;
        return -1;
    }
    if (site >= 0) {
        c->failed_alike = 1; /* every rank read the same flags: the outputs are bit-identical */
        snprintf(err, errlen,
                 "echo: element %zu of the all-reduce at site %d is not finite (an input on some rank is inf/nan "
                 "or |x| >= 2^127, or the fp32 sum overflowed); the pass is aborted",
                 bad, site);
        c->aborted = 1;
        c->res_valid = 0;
        return -1;
    }
    return 0;
}

/* A graphed pass: launch when every rank holds the same kind of graph
 * (1 captured, 2 replayed), else take the pass back (1). */
static int end_graph(echo_comm *c, const echo_pass_end *end, char *err, size_t errlen) {
    int mine = end && end->launch ? (c->mode == ECHO_PASS_REPLAY ? 2 : 1) : 0, agreed = 0;
    if (echo_vote(c, mine, &agreed, err, errlen)) return -1; /* the world was aborted */
    if (agreed) return echo_launch_external(c, end->launch, end->arg, err, errlen);
    echo_discard_pass(c);
    return 1;
}

int echo_end_pass(echo_comm *c, void *stream, echo_pass_end *end, char *err, size_t errlen) {
    if (!c) {
        snprintf(err, errlen, "echo: end_pass on a NULL comm");
        return -1;
    }
    if (end) end->aborted = 0;
    int rc = -1;
    if (!end || !end->failed) {
        rc = c->mode == ECHO_PASS_EAGER ? 0 : end_graph(c, end, err, errlen);
        c->mode = ECHO_PASS_EAGER;
        if (rc == 1) return 1;
        if (rc == 0) rc = wait_pass(c, stream, err, errlen);
    }
    /* Peers waiting for this rank in a collective must fail, not hang:
     * abort the world, unless every rank failed alike (on nccl an abort
     * costs re-creating the communicators). */
    if (rc && end && !c->failed_alike) {
        echo_abort(c);
        end->aborted = 1;
    }
    return rc;
}

int echo_set_replay(echo_comm *c, int on, char *err, size_t errlen) {
    if (!c) {
        snprintf(err, errlen, "echo: set_replay on a NULL comm");
        return -1;
    }
    if (on && !c->w->cfg.deferred) {
        snprintf(err, errlen, "echo: replaying calls from a graph needs a deferred world (echo_config.deferred, nccl)");
        return -1;
    }
    c->replay = on != 0;
    return 0;
}

int echo_launch_external(echo_comm *c, int (*launch)(void *arg, char *err, size_t errlen), void *arg, char *err,
                         size_t errlen) {
    if (!c || !launch) {
        snprintf(err, errlen, "echo: launch_external without a comm or a function");
        return -1;
    }
    if (!c->w->cfg.deferred) return launch(arg, err, errlen);
    return c->w->tp->deferred->external(c, launch, arg, err, errlen);
}

void echo_discard_pass(echo_comm *c) {
    if (!c) return;
    if (c->w->tp->deferred) c->w->tp->deferred->pass_discard(c);
    c->in_pass = 0;
    c->last_site = -1;
    c->res_valid = 0;
    c->replay = 0;
    c->armed = 0;
}

uint64_t echo_comm_epoch(const echo_comm *c) {
    return c ? c->w->epoch : 0;
}

int echo_vote(echo_comm *c, int mine, int *agreed, char *err, size_t errlen) {
    *agreed = 0;
    if (!c) {
        snprintf(err, errlen, "echo: vote on a NULL comm");
        return -1;
    }
    if (c->w->nranks == 1) {
        *agreed = mine != 0;
        return 0;
    }
    if (!c->w->tp->deferred) {
        snprintf(err, errlen, "echo: the %s transport has no vote (graphs need a deferred nccl world)", c->w->tp->name);
        return -1;
    }
    return c->w->tp->deferred->vote(c, mine, agreed, err, errlen);
}

void echo_abort(echo_comm *c) {
    if (!c) return;
    c->aborted = 1;
    c->res_valid = 0;
    c->w->tp->set_abort(c->w, 1);
}

void echo_world_clear_abort(echo_world *w) {
    if (w) w->tp->set_abort(w, 0);
}

int echo_world_usable(const echo_world *w, char *why, size_t len) {
    return !w || w->tp->usable(w, why, len);
}

void echo_get_stats(const echo_comm *c, echo_stats *out) {
    if (c)
        *out = c->stats;
    else
        memset(out, 0, sizeof *out);
}

int echo_get_site_stats(const echo_comm *c, int site, echo_site_stats *out, char *err, size_t errlen) {
    if (!c || site < 0 || site >= c->w->cfg.n_sites) {
        snprintf(err, errlen, "echo: site %d is outside [0, %d)", site, c ? c->w->cfg.n_sites : 0);
        return -1;
    }
    *out = c->sites[site];
    return 0;
}

/* ---- one call ---- */

static int bad_value(echo_comm *c, size_t bad_in, size_t bad_out, char *err, size_t errlen) {
    c->failed_alike = 1; /* every rank decoded the same poisoned group in this call */
    if (bad_in != ECHO_NO_INDEX)
        snprintf(err, errlen,
                 "echo: rank %d: input element %zu is inf/nan or exceeds the codec's range (|x| < 2^127); "
                 "the pass is aborted",
                 c->rank, bad_in);
    else
        snprintf(err, errlen,
                 "echo: element %zu of the all-reduce is not finite (an input on some rank is inf/nan or "
                 "|x| >= 2^127, or the fp32 sum overflowed); the pass is aborted",
                 bad_out);
    return -1;
}

/* A compute step failed on this rank alone (a device error; the host
 * compute never fails): abort the world as echo_abort does, so that peers
 * waiting in this collective fail instead of waiting for this rank. */
/* A sum with a non-finite element at `bad` (ECHO_NO_INDEX: none): every rank
 * holds the same sum, so the failure is alike everywhere. -1 with the message. */
static int sum_not_finite(echo_comm *c, size_t bad, const char *what, char *err, size_t errlen) {
    if (bad == ECHO_NO_INDEX) return 0;
    c->failed_alike = 1;
    snprintf(err, errlen,
             "echo: element %zu of the %s is not finite (an input is inf/nan or the fp32 sum overflowed); the pass "
             "is aborted",
             bad, what);
    return -1;
}

static int compute_failed(echo_comm *c) {
    c->w->tp->set_abort(c->w, 1);
    return -1;
}

static int run_quantized(echo_comm *c, const echo_plan *p, int site, void *buf, void *stream, char *err,
                         size_t errlen) {
    echo_world *w = c->w;
    const echo_transport_ops *t = w->tp;
    const echo_compute_ops *k = w->compute;
    int me = c->rank, N = p->nranks;
    float *res = w->cfg.feedback ? c->res : NULL;
    int res_valid = res && c->res_valid;
    uint8_t *send[ECHO_MAX_RANKS];
    const uint8_t *recv[ECHO_MAX_RANKS];
    size_t bad_in = ECHO_NO_INDEX, bad_out = ECHO_NO_INDEX;

    if (c->replay) {
        /* the device work is in the caller's graph */
        echo_call call = {site, p->count, p->dt, w->path, buf, NULL};
        if (t->deferred->note_call(c, &call, err, errlen)) return -1;
        c->res_valid = res != NULL;
        return 0;
    }
    for (int j = 0; j < N; j++)
        send[j] = j == me ? NULL : t->p1_send(c, j);
    if (k->phase1(c, p, buf, res, res_valid, send, &bad_in, stream, err, errlen)) return compute_failed(c);
    echo_call call = {site, p->count, p->dt, w->path, buf, NULL};
    if (t->p1_exchange(c, p, &call, stream, err, errlen)) return -1;

    for (int j = 0; j < N; j++)
        recv[j] = j == me ? NULL : t->p1_recv(c, j);
    if (k->phase2(c, p, buf, recv, res ? res + (size_t)me * p->shard : NULL, res_valid, t->p2_send(c, p), stream, err,
                  errlen))
        return compute_failed(c);
    if (t->p2_exchange(c, p, stream, err, errlen)) return -1;

    for (int j = 0; j < N; j++)
        recv[j] = t->p2_recv(c, p, j);
    if (k->finish(c, p, recv, buf, &bad_out, stream, err, errlen)) return compute_failed(c);
    if (bad_out != ECHO_NO_INDEX) return bad_value(c, bad_in, bad_out, err, errlen);
    c->res_valid = res != NULL;
    return 0;
}

/* ---- bf16: the 16-bit exact baseline (host memory) ----
 * The int4 schedule with another wire form: a shard travels as its values
 * rounded to bf16 (nearest even); the owner sums in fp32 in rank order,
 * its own shard rounded to bf16 as well (unlike int4: so an element's sum
 * does not depend on which rank owns it, that is on the message's length,
 * and a message cut in rows -- engine/overlap.h's micro-batches -- gives
 * the whole message's bits), and rounds the sum to bf16 once, so every
 * rank decodes the same bits. Plain loops on the inline conversions
 * of echo_codec.h, so this file needs no other compute code. */

static int bf16_is_special(uint16_t v) {
    return (v & 0x7f80u) == 0x7f80u; /* inf or nan */
}

/* wire[i] = bf16(x[i]) for n values of dt. */
static void bf16_narrow(const void *x, echo_dtype dt, size_t n, uint16_t *wire) {
    if (dt == ECHO_BF16)
        memcpy(wire, x, n * 2);
    else
        for (size_t i = 0; i < n; i++)
            wire[i] = echo_f32_to_bf16(((const float *)x)[i]);
}

/* rotate: the block size of the basis of a residual carried in (the tail
 * of a 4-bit world), which is added to this rank's input first; the call
 * leaves none (bf16's rounding is not fed forward). */
static int run_bf16(echo_comm *c, const echo_plan *p, int rotate, int site, void *buf, char *err, size_t errlen) {
    echo_world *w = c->w;
    const echo_transport_ops *t = w->tp;
    int me = c->rank, N = p->nranks;
    size_t esz = echo_dtype_size(p->dt), bad_out = ECHO_NO_INDEX;
    if (c->res && c->res_valid) {
        if (rotate &&
            w->compute->unrotate(c, c->res, echo_plan_pad(p, p->count), rotate, NULL, err, errlen))
            return compute_failed(c);
        if (p->dt == ECHO_F32)
            echo_cpu_load(c->res, ECHO_F32, p->count, (float *)buf, 1);
        else
            for (size_t i = 0; i < p->count; i++) {
                uint16_t *b = (uint16_t *)buf + i;
                *b = echo_f32_to_bf16(echo_bf16_to_f32(*b) + c->res[i]);
            }
    }
    c->res_valid = 0;
    for (int j = 0; j < N; j++) {
        size_t n = echo_plan_len(p, j), off = (size_t)j * p->shard;
        if (j != me && n) bf16_narrow((const char *)buf + off * esz, p->dt, n, (uint16_t *)t->p1_send(c, j));
    }
    echo_call call = {site, p->count, p->dt, w->path, buf, NULL};
    if (t->p1_exchange(c, p, &call, NULL, err, errlen)) return -1;
    size_t n = echo_plan_len(p, me), off = (size_t)me * p->shard;
    float *sum = c->scratch;
    uint16_t *out = (uint16_t *)t->p2_send(c, p);
    if (n) {
        /* fixed order j = 0..N-1, as the int4 phase 2 */
        for (int j = 0; j < N; j++) {
            const uint16_t *in = j == me ? NULL : (const uint16_t *)t->p1_recv(c, j);
            for (size_t i = 0; i < n; i++) {
                float v;
                if (in)
                    v = echo_bf16_to_f32(in[i]);
                else if (p->dt == ECHO_F32)
                    v = echo_bf16_to_f32(echo_f32_to_bf16(((const float *)buf)[off + i]));
                else
                    v = echo_bf16_to_f32(((const uint16_t *)buf)[off + i]);
                sum[i] = j ? sum[i] + v : v;
            }
        }
        for (size_t i = 0; i < n; i++)
            out[i] = echo_f32_to_bf16(sum[i]);
    }
    if (t->p2_exchange(c, p, NULL, err, errlen)) return -1;
    for (int s = 0; s < N; s++) {
        size_t m = echo_plan_len(p, s), o = (size_t)s * p->shard;
        const uint16_t *g = (const uint16_t *)t->p2_recv(c, p, s);
        for (size_t i = 0; i < m; i++) {
            if (bf16_is_special(g[i]) && bad_out == ECHO_NO_INDEX) bad_out = o + i;
            if (p->dt == ECHO_F32)
                ((float *)buf)[o + i] = echo_bf16_to_f32(g[i]);
            else
                ((uint16_t *)buf)[o + i] = g[i];
        }
    }
    if (bad_out != ECHO_NO_INDEX) return bad_value(c, ECHO_NO_INDEX, bad_out, err, errlen);
    return 0;
}

static int run_exact(echo_comm *c, const echo_plan *p, int site, void *buf, void *stream, char *err, size_t errlen) {
    echo_world *w = c->w;
    size_t bad = ECHO_NO_INDEX;
    /* A residual carried in is added to this rank's input, and the call
     * leaves none: the exact sum introduces no error to carry. */
    echo_call call = {site, p->count, p->dt, ECHO_PRESET_EXACT, buf, c->res && c->res_valid ? c->res : NULL};
    if (c->replay) {
        if (w->tp->deferred->note_call(c, &call, err, errlen)) return -1;
        c->res_valid = 0;
        return 0;
    }
    if (call.res && p->rotate &&
        w->compute->unrotate(c, c->res, echo_plan_pad(p, p->count), p->rotate, stream, err, errlen))
        return compute_failed(c);
    if (w->tp->exact(c, p, &call, buf, &bad, stream, err, errlen)) return -1;
    c->res_valid = 0;
    return sum_not_finite(c, bad, "exact all-reduce", err, errlen);
}

/* ---- the one-shot schedule (echo_config.oneshot_bytes) ----
 * Every rank sends one message, its whole input, to every other rank
 * (tp->os_exchange): exact, y = x (+ the residual carried in) in fp32; a
 * 4-bit codec, x coded with the residual (r = x + r - decode over every
 * value: there is no own shard here). Then every rank sums the N messages
 * in rank order j = 0..N-1, exact the values, a codec each one decoded
 * (its own too, so that every rank holds the same bits), and rounds the
 * sum to the buffer's dtype. Exact's sum is the two-shot owner's sum
 * (j = 0..N-1, fp32), value for value. The call's agreement and each
 * rank's first bad input travel in the message header: every rank sees
 * them all and fails alike. */
static int run_oneshot(echo_comm *c, const echo_plan *p, int site, void *buf, int exact, char *err, size_t errlen) {
    echo_world *w = c->w;
    const echo_transport_ops *t = w->tp;
    int N = p->nranks, rc = 0;
    size_t M = p->count, bad_out = ECHO_NO_INDEX;
    long long bad_in = -1;
    echo_preset path = exact ? ECHO_PRESET_EXACT : w->path;
    size_t bytes = echo_os_msg_bytes(M, p->dt, exact, w->cfg.codec, p->group);
    uint8_t *msg = t->os_send(c, bytes);
    float *y = c->os_y, *res = c->res;
    int res_valid = res && c->res_valid;
    echo_cpu_load(buf, p->dt, M, y, 0);
    if (exact) {
        if (res_valid) {
            if (p->rotate && w->compute->unrotate(c, res, echo_plan_pad(p, M), p->rotate, NULL, err, errlen))
                return compute_failed(c);
            echo_cpu_load(res, ECHO_F32, M, y, 1);
        }
        memcpy(msg + ECHO_OS_HEADER, y, M * sizeof(float));
    } else {
        char e2[160];
        /* the residual of the first call of a pass reads as zero */
        if (res && !res_valid) memset(res, 0, echo_plan_pad(p, M) * sizeof(float));
        if (echo_codec_encode_as(w->cfg.codec, y, res, M, p->group, msg + ECHO_OS_HEADER, e2, sizeof e2)) {
            bad_in = 0; /* the codec's range (rotated values) if no value is inf/nan */
            for (size_t i = 0; i < M; i++)
                if (!(fabsf(y[i]) < 0x1p127f)) {
                    bad_in = (long long)i;
                    break;
                }
        }
    }
    long long h[6] = {site, (long long)M, p->dt, path, bad_in, (long long)bytes};
    memcpy(msg, h, sizeof h);
    echo_call call = {site, M, p->dt, path, buf, NULL};
    if (t->os_exchange(c, bytes, &call, err, errlen)) return -1;
    for (int j = 0; j < N && !rc; j++) {
        long long o[6];
        memcpy(o, t->os_recv(c, bytes, j), sizeof o);
        if (o[0] != h[0] || o[1] != h[1] || o[2] != h[2] || o[3] != h[3] || o[5] != h[5]) {
            snprintf(err, errlen,
                     "echo: ranks disagree: rank %d calls site %d with %zu %s values (%s path, one-shot), rank %d "
                     "site %lld with %lld %s values (%s path); the pass is aborted",
                     c->rank, site, M, p->dt == ECHO_F32 ? "f32" : "bf16", echo_preset_name(path), j, o[0], o[1],
                     o[2] == ECHO_F32 ? "f32" : "bf16", echo_preset_name((echo_preset)o[3]));
            rc = -1;
        } else if (o[4] >= 0) {
            /* as the two-shot's poisoned group: the output holds NaN there */
            size_t g0 = (size_t)o[4] / (size_t)p->group * (size_t)p->group;
            for (size_t i = g0; i < M && i < g0 + (size_t)p->group; i++)
                if (p->dt == ECHO_F32)
                    ((float *)buf)[i] = NAN;
                else
                    ((uint16_t *)buf)[i] = 0x7fc0;
            c->failed_alike = 1; /* every rank read the same headers */
            snprintf(err, errlen,
                     "echo: rank %d: input element %lld is inf/nan or exceeds the codec's range (|x| < 2^127); "
                     "the pass is aborted",
                     j, o[4]);
            rc = -1;
        }
    }
    for (int j = 0; j < N && !rc; j++) {
        const uint8_t *m = t->os_recv(c, bytes, j) + ECHO_OS_HEADER;
        if (exact)
            echo_cpu_load(m, ECHO_F32, M, y, j > 0);
        else if (echo_codec_decode_as(w->cfg.codec, m, M, p->group, y, j > 0, err, errlen))
            rc = -1; /* cannot happen: the codec was checked at world creation */
    }
    if (!rc) echo_cpu_store(y, M, buf, p->dt, &bad_out);
    if (t->os_done && t->os_done(c, rc ? NULL : err, rc ? 0 : errlen)) return -1;
    if (rc) return -1;
    if (sum_not_finite(c, bad_out, "all-reduce", err, errlen)) return -1;
    c->res_valid = res != NULL && !exact;
    return 0;
}

int echo_allreduce(echo_comm *c, int site, void *buf, size_t count, echo_dtype dt, void *stream, char *err,
                   size_t errlen) {
    double t0 = now_s();
    if (!c) {
        snprintf(err, errlen, "echo: allreduce on a NULL comm");
        return -1;
    }
    echo_world *w = c->w;
    const echo_config *cfg = &w->cfg;
    /* Validation first: a failing check changes nothing and communicates
     * nothing, so when all ranks make the same (bad) call they all fail
     * alike and stay in step. */
    if (dt != ECHO_F32 && dt != ECHO_BF16) {
        snprintf(err, errlen, "echo: unknown dtype %d", (int)dt);
        return -1;
    }
    if (!c->in_pass) {
        snprintf(err, errlen, "echo: allreduce at site %d before any pass: call echo_begin_pass first", site);
        return -1;
    }
    if (c->aborted) {
        snprintf(err, errlen,
                 "echo: allreduce at site %d in a pass aborted by an earlier error: call "
                 "echo_begin_pass to start a new one",
                 site);
        return -1;
    }
    if (site < 0 || site >= cfg->n_sites) {
        snprintf(err, errlen, "echo: site %d is outside [0, %d) (echo_config.n_sites)", site, cfg->n_sites);
        return -1;
    }
    if (site <= c->last_site) {
        snprintf(err, errlen,
                 "echo: site %d called after site %d in the same pass: sites must increase within a pass "
                 "(call echo_begin_pass to start a new one)",
                 site, c->last_site);
        return -1;
    }
    if (count > cfg->max_count) {
        snprintf(err, errlen, "echo: count %zu exceeds max_count %zu the residual slots were sized for", count,
                 cfg->max_count);
        return -1;
    }
    if (count && !buf) {
        snprintf(err, errlen, "echo: NULL buffer for %zu values", count);
        return -1;
    }
    if (cfg->feedback && c->last_site >= 0 && count != c->pass_count) {
        snprintf(err, errlen,
                 "echo: count %zu at site %d differs from %zu, the count of this pass's earlier calls (the "
                 "residual carried between calls is laid out for it)",
                 count, site, c->pass_count);
        return -1;
    }
    if (stream && !w->tp->device_memory) {
        snprintf(err, errlen, "echo: a stream was given to the %s transport on host memory (pass NULL)", w->tp->name);
        return -1;
    }

    c->last_site = site;
    c->pass_count = count;
    size_t bytes = count * echo_dtype_size(dt);
    /* the tail policy: bf16 on host memory, else exact */
    int tail = cfg->tail_sites && site >= cfg->n_sites - cfg->tail_sites;
    int tail_bf16 = tail && cfg->tail_codec == ECHO_CODEC_BF16 && !w->tp->device_memory;
    /* the exact path: a `none` world, the size policy, or the tail */
    int exact = w->plain || bytes < cfg->min_bytes || w->nranks == 1 || count == 0 || (tail && !tail_bf16);
    echo_preset used = exact ? ECHO_PRESET_EXACT : tail_bf16 ? ECHO_PRESET_BF16 : w->path;
    /* the one-shot schedule for small messages (not bf16: its world has no
     * os_bytes), on host transports that have it */
    int oneshot = count * sizeof(float) <= w->os_bytes && c->os_y && !c->replay && !cfg->deferred;
    if (oneshot && tail_bf16) {
        tail_bf16 = 0, exact = 1;
        used = ECHO_PRESET_EXACT;
    }
    int rc = 0;
    if (w->nranks > 1 && count > 0) {
        echo_plan p;
        echo_plan_init(&p, count, w->nranks, cfg->group_size, dt);
        echo_priv_plan_codec(&p, cfg->codec);
        int rotate = p.rotate; /* the basis of the residual a tail call takes in */
        if (tail_bf16 && !exact && !oneshot) echo_priv_plan_codec(&p, ECHO_CODEC_BF16);
        if (exact && count > w->exact_max) {
            /* Cannot happen with min_bytes/2 >= count; kept as a guard. */
            snprintf(err, errlen, "echo: internal: exact path sized for %zu values, got %zu", w->exact_max, count);
            return -1;
        }
        if (cfg->deferred && !c->armed) {
            /* clear the pass's non-finite flags, on the stream (so inside a
             * graph captured from this pass) */
            if (!c->replay && w->compute->pass_arm(c, stream, err, errlen)) {
                rc = compute_failed(c);
                goto done;
            }
            c->armed = 1;
        }
        if (oneshot) /* the tail in one shot: exact (the schedule has no bf16 form) */
            rc = run_oneshot(c, &p, site, buf, exact || tail_bf16, err, errlen);
        else if (exact)
            rc = run_exact(c, &p, site, buf, stream, err, errlen);
        else if (tail_bf16)
            rc = run_bf16(c, &p, rotate, site, buf, err, errlen);
        else if (echo_codec_get(cfg->codec)->lossless)
            rc = run_bf16(c, &p, 0, site, buf, err, errlen); /* host only: never deferred nor replayed */
        else
            rc = run_quantized(c, &p, site, buf, stream, err, errlen);
    done:
        if (rc) {
            c->aborted = 1;
            c->res_valid = 0;
        } else {
            /* Wire accounting as NCCL would move it: reduce-scatter and
             * all-gather each send N-1 messages per rank: shard messages
             * (padded to whole groups) for the codec, ring chunks of
             * ceil(M/N) values for exact. */
            size_t chunk = (count + (size_t)w->nranks - 1) / (size_t)w->nranks;
            size_t per_msg = exact ? chunk * echo_dtype_size(dt) : p.wire;
            if (oneshot) /* one message of the whole count to each peer */
                c->stats.wire_bytes[used] += (uint64_t)(w->nranks - 1) *
                                             (echo_os_msg_bytes(count, dt, exact, cfg->codec, p.group) - ECHO_OS_HEADER);
            else
                c->stats.wire_bytes[used] += 2 * (uint64_t)(w->nranks - 1) * per_msg;
        }
    }
    if (!rc) {
        c->stats.calls[used]++;
        c->stats.seconds[used] += now_s() - t0;
        c->sites[site].calls++;
    }
    return rc;
}
