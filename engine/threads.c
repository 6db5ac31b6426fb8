/*
 * engine/: ranks as threads, one row of the ranks table (internal.h;
 * proc.c has ranks as processes). Rank 0 runs on the thread that calls
 * eng_step(); ranks 1..tp-1 are persistent threads (rank_main, started
 * once every rank's model is loaded) woken once per step to run the step's
 * forward pass or drop their graphs. Also this process's own rank's job,
 * which both rows run.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "engine/internal.h"

/* What a rank's thread runs: the step's forward pass, or dropping its
 * graphs (ranks_rearm). */
enum { RANK_FORWARD, RANK_DROP_GRAPHS };

static void rank_job(eng_rank *r, int job, model_batch b) {
    if (job == RANK_DROP_GRAPHS) {
        eng_runner_drop_graphs(&r->run);
        return;
    }
    if (r != &r->e->ranks[0]) {
        b.layer_states = NULL; /* rank 0 reports; the stream is replicated */
        if (b.topk) b.topk = &r->topk; /* each rank fills its own candidates */
    }
    /* at tp > 1 a failed step aborts the world: peers must not wait for us in a collective */
    r->rc = eng_run_step(&r->run, &b, r->logits, r->err, sizeof r->err);
    /* Another process cannot be woken from a blocking collective: a rank
     * that failed on its own ends the job, saying why. */
    if (r->rc && r->e->procs && r->run.aborted) echo_proc_abort(1, r->err);
}

static void *rank_main(void *arg) {
    eng_rank *r = arg;
    eng *e = r->e;
    unsigned long seen = 0;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stop && e->generation == seen) pthread_cond_wait(&e->go_cv, &e->mu);
        if (e->stop) break;
        seen = e->generation;
        model_batch b = e->batch;
        int job = e->job;
        pthread_mutex_unlock(&e->mu);
        rank_job(r, job, b);
        pthread_mutex_lock(&e->mu);
        if (--e->pending == 0) pthread_cond_signal(&e->done_cv);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Wake ranks 1..tp-1 for `job` (e->batch). */
static void ranks_wake(eng *e, int job) {
    if (e->cfg.tp < 2) return;
    pthread_mutex_lock(&e->mu);
    e->job = job;
    e->pending = e->cfg.tp - 1;
    e->generation++;
    pthread_cond_broadcast(&e->go_cv);
    pthread_mutex_unlock(&e->mu);
}

static void ranks_wait(eng *e) {
    if (e->cfg.tp < 2) return;
    pthread_mutex_lock(&e->mu);
    while (e->pending > 0) pthread_cond_wait(&e->done_cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

/* Re-arm the world after a step that aborted it, once every rank has
 * returned. The one place of the rule "drop graphs before clear_abort":
 * NCCL frees the aborted communicators (and echo_world_clear_abort creates
 * new ones) only once every graph that captured their calls is destroyed,
 * and each rank drops its own on its thread, where its device is current. */
static void ranks_rearm(eng *e) {
    ranks_wake(e, RANK_DROP_GRAPHS);
    rank_job(&e->ranks[0], RANK_DROP_GRAPHS, e->batch);
    ranks_wait(e);
    if (echo_world_usable(e->world, NULL, 0)) { /* a dead one cannot be re-armed (eng_usable says so) */
        echo_world_clear_abort(e->world);
        for (int i = 1; i < e->ov_k; i++) echo_world_clear_abort(e->ov_worlds[i - 1]);
        e->comm_resets++;
    }
}

int eng_priv_rank_forward(eng *e, char *err, size_t errlen) {
    eng_rank *r = &e->ranks[e->me];
    rank_job(r, RANK_FORWARD, e->batch);
    if (r->rc) snprintf(err, errlen, "rank %d: %s", e->me, r->err);
    return r->rc ? -1 : 0;
}

/* ---- the threads row ---- */

static int threads_create(eng *e, char *err, size_t errlen) {
    for (int i = 1; i < e->cfg.tp; i++) {
        if (pthread_create(&e->ranks[i].thread, NULL, rank_main, &e->ranks[i]) != 0) {
            snprintf(err, errlen, "cannot start rank thread %d", i);
            return -1;
        }
        e->ranks[i].started = 1;
    }
    return 0;
}

static int threads_start_step(eng *e, const eng_step_shape *s, char *err, size_t errlen) {
    (void)s, (void)err, (void)errlen;
    ranks_wake(e, RANK_FORWARD);
    return 0;
}

static int threads_finish_step(eng *e, const eng_step_shape *s, char *err, size_t errlen) {
    (void)s;
    int tp = e->cfg.tp;
    rank_job(&e->ranks[0], RANK_FORWARD, e->batch);
    ranks_wait(e);
    /* Report the rank that failed first-hand, not the peers it aborted. */
    int first = -1;
    for (int i = 0; i < tp; i++) {
        if (e->ranks[i].rc && (first < 0 || (strstr(e->ranks[first].err, "aborted because another rank") &&
                                             !strstr(e->ranks[i].err, "aborted because another rank"))))
            first = i;
    }
    if (first < 0) return 0;
    snprintf(err, errlen, "rank %d: %s", first, e->ranks[first].err);
    int aborted = 0;
    for (int i = 0; i < tp; i++)
        aborted |= e->ranks[i].run.aborted;
    if (aborted) ranks_rearm(e);
    return -1;
}

static void threads_destroy(eng *e) {
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->go_cv);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; e->ranks && i < e->cfg.tp; i++)
        if (e->ranks[i].started) pthread_join(e->ranks[i].thread, NULL);
}

const eng_ranks_ops eng_priv_ranks_threads = {"threads", threads_create, threads_start_step, threads_finish_step,
                                              threads_destroy};
