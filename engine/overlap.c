/*
 * engine/: prefill overlap (see overlap.h): micro-batches pipelined
 * against a per-rank communication thread.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/overlap.h"

/* At most one call per micro-batch is in flight; the ring holds two rounds. */
#define OV_RING (2 * MODEL_MAX_MB)

typedef struct ov_job {
    int mb, site;
    void *buf;
    size_t count;
    echo_dtype dt;
    int rc;
    char err[256];
} ov_job;

struct eng_overlap {
    int k, min_rows;
    echo_comm *comm[MODEL_MAX_MB];
    echo_workers w0; /* comm[0]'s workers outside overlapped passes */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    ov_job ring[OV_RING];
    long issued, done; /* jobs handed over / completed, in order */
    int stop;
};

int eng_overlap_plan(int overlap, int tp, int procs, int host_memory) {
    if (tp < 2 || !host_memory || overlap == ENG_OVERLAP_OFF) return 1;
    if (overlap == ENG_OVERLAP_AUTO) return procs ? 2 : 1;
    return overlap < 1 ? 1 : overlap > MODEL_MAX_MB ? MODEL_MAX_MB : overlap;
}

static void *comm_main(void *arg) {
    eng_overlap *ov = arg;
    pthread_mutex_lock(&ov->mu);
    for (;;) {
        while (!ov->stop && ov->done == ov->issued) pthread_cond_wait(&ov->cv_job, &ov->mu);
        if (ov->stop) break;
        ov_job *j = &ov->ring[ov->done % OV_RING];
        pthread_mutex_unlock(&ov->mu);
        /* host memory only (eng_overlap_plan): no stream */
        j->rc = echo_allreduce(ov->comm[j->mb], j->site, j->buf, j->count, j->dt, NULL, j->err, sizeof j->err);
        pthread_mutex_lock(&ov->mu);
        ov->done++;
        pthread_cond_broadcast(&ov->cv_done);
    }
    pthread_mutex_unlock(&ov->mu);
    return NULL;
}

int eng_overlap_create(echo_comm *const *comms, int k, int min_rows, const echo_workers *w0, eng_overlap **out,
                       char *err, size_t errlen) {
    *out = NULL;
    if (k < 2 || k > MODEL_MAX_MB) {
        snprintf(err, errlen, "overlap: %d micro-batches (2..%d)", k, MODEL_MAX_MB);
        return -1;
    }
    eng_overlap *ov = calloc(1, sizeof *ov);
    if (!ov) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    ov->k = k;
    ov->min_rows = min_rows > 0 ? min_rows : ENG_OVERLAP_MIN_ROWS;
    memcpy(ov->comm, comms, (size_t)k * sizeof *comms);
    if (w0) ov->w0 = *w0;
    pthread_mutex_init(&ov->mu, NULL);
    pthread_cond_init(&ov->cv_job, NULL);
    pthread_cond_init(&ov->cv_done, NULL);
    if (pthread_create(&ov->thread, NULL, comm_main, ov) != 0) {
        ov->k = 1; /* the caller still owns the comms */
        eng_overlap_destroy(ov);
        snprintf(err, errlen, "overlap: cannot start the communication thread");
        return -1;
    }
    ov->started = 1;
    *out = ov;
    return 0;
}

void eng_overlap_destroy(eng_overlap *ov) {
    if (!ov) return;
    if (ov->started) {
        pthread_mutex_lock(&ov->mu);
        ov->stop = 1;
        pthread_cond_broadcast(&ov->cv_job);
        pthread_mutex_unlock(&ov->mu);
        pthread_join(ov->thread, NULL);
    }
    pthread_mutex_destroy(&ov->mu);
    pthread_cond_destroy(&ov->cv_job);
    pthread_cond_destroy(&ov->cv_done);
    for (int i = 1; i < ov->k; i++) echo_comm_destroy(ov->comm[i]);
    free(ov);
}

int eng_overlap_count(const eng_overlap *ov, const model_batch *b) {
    if (!ov || b->n_seqs <= 0) return 1;
    int n = b->q_start[b->n_seqs], k = n / ov->min_rows;
    return k < 2 ? 1 : k < ov->k ? k : ov->k;
}

void eng_overlap_add_stats(const eng_overlap *ov, echo_stats *s) {
    for (int i = 1; ov && i < ov->k; i++) {
        echo_stats x;
        echo_get_stats(ov->comm[i], &x);
        for (int p = 0; p < ECHO_PRESET_COUNT; p++) {
            s->calls[p] += x.calls[p];
            s->wire_bytes[p] += x.wire_bytes[p];
            s->seconds[p] += x.seconds[p];
        }
    }
}

/* Hand micro-batch mb's all-reduce of site `site` to the thread; returns its sequence number. */
static long issue(eng_overlap *ov, int mb, int site, void *buf, size_t count, echo_dtype dt) {
    pthread_mutex_lock(&ov->mu);
    long seq = ov->issued;
    ov->ring[seq % OV_RING] = (ov_job){.mb = mb, .site = site, .buf = buf, .count = count, .dt = dt};
    ov->issued++;
    pthread_cond_signal(&ov->cv_job);
    pthread_mutex_unlock(&ov->mu);
    return seq;
}

/* Wait for job `seq`; its rc (its message in err). */
static int wait_job(eng_overlap *ov, long seq, char *err, size_t errlen) {
    pthread_mutex_lock(&ov->mu);
    while (ov->done <= seq) pthread_cond_wait(&ov->cv_done, &ov->mu);
    pthread_mutex_unlock(&ov->mu);
    const ov_job *j = &ov->ring[seq % OV_RING];
    if (j->rc) snprintf(err, errlen, "%s", j->err);
    return j->rc;
}

int eng_overlap_pass(eng_overlap *ov, eng_runner *r, const model_batch *b, int k, char *err, size_t errlen) {
    model *m = r->m;
    /* the model's sites, in its order (model_pass_sites): the driver only pipelines them */
    const int S = model_pass_sites(model_get_config(m));
    echo_dtype dt = r->ops->act_dtype == KERN_F32 ? ECHO_F32 : ECHO_BF16;
    long seq[MODEL_MAX_MB];
    int begun = 0, compute_failed = 0, comm_failed[MODEL_MAX_MB] = {0}, failed = 0;
    for (int i = 0; i < k; i++) seq[i] = -1;
    if (S < 1) {
        snprintf(err, errlen, "overlap: the model has no all-reduce sites");
        compute_failed = failed = 1;
        goto end;
    }
    if (model_pass_split(m, b, k, err, errlen)) {
        compute_failed = failed = 1;
        goto end;
    }
    /* Every micro-batch's chain of sites is a pass of its own comm: its
     * residual starts clean. The thread is idle here. */
    for (; begun < k; begun++)
        if (echo_begin_pass(ov->comm[begun], ECHO_PASS_EAGER, err, errlen)) {
            compute_failed = failed = 1;
            goto end;
        }
    echo_comm_set_workers(ov->comm[0], NULL);
    /* The same order on every rank, so a call that fails on every rank
     * alike (a non-finite sum) is seen at the same point everywhere and the
     * ranks stop in step. */
    for (int s = 0; s <= S && !failed; s++) {
        for (int i = 0; i < k && !failed; i++) {
            if (s > 0) {
                if (wait_job(ov, seq[i], err, errlen)) {
                    comm_failed[i] = failed = 1;
                    break;
                }
                seq[i] = -1;
                if (model_pass_join(m, b, i, s - 1, err, errlen)) {
                    compute_failed = failed = 1;
                    break;
                }
            }
            if (s == S) continue;
            void *buf;
            size_t count;
            if (model_pass_part(m, b, i, s, &buf, &count, err, errlen)) {
                compute_failed = failed = 1;
                break;
            }
            seq[i] = issue(ov, i, s, buf, count, dt);
        }
    }
    /* What was handed over completes (the peers made the same calls). */
    for (int i = 0; i < k; i++) {
        char jerr[256];
        if (seq[i] >= 0 && wait_job(ov, seq[i], jerr, sizeof jerr)) {
            if (!failed) snprintf(err, errlen, "%s", jerr);
            comm_failed[i] = failed = 1;
        }
    }
    if (!failed && model_pass_tail(m, b, err, errlen)) compute_failed = failed = 1;
end:
    echo_comm_set_workers(ov->comm[0], &ov->w0);
    r->aborted = 0;
    for (int i = 0; i < k; i++) {
        char eerr[256];
        /* a pass that never began is ended as failed, which aborts its world */
        echo_pass_end e = {.failed = compute_failed || comm_failed[i] || i >= begun};
        int rc = echo_end_pass(ov->comm[i], NULL, &e, eerr, sizeof eerr);
        if (rc && !failed) snprintf(err, errlen, "%s", eerr);
        if (rc) failed = 1;
        if (e.aborted) r->aborted = 1;
    }
    return failed ? -1 : 0;
}
