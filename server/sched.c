/*
 * server/: the scheduler thread — continuous batching over eng_step(). It
 * admits, batches, steps and applies each request's plan (built once by
 * openai.c): the logits-processor chain and sampling (logits.c), the stop
 * matcher and publishing (emit.c), a draft's verification (spec.c).
 *
 * Each iteration: admit waiting requests while a sequence slot and the KV
 * blocks for prompt + max_tokens are free (reservation, so eng_step never
 * runs out of blocks mid-generation and nobody is preempted; the prompt's
 * cached prefix is mapped, not taken again, and cached blocks no request
 * holds count as free: eng_seq_new_prefix); drop cancelled
 * requests (their blocks return to the engine before the step); build one
 * batch — every decoding request's last token first, then prompt chunks in
 * admission order within the token budget; run the step; sample, detokenize
 * and publish each new token. Sampling rows are independent of the batch, and
 * with exact on threads the engine computes each row the same whatever else
 * is in the batch, so greedy output does not depend on concurrency; under
 * another all-reduce a prompt's rows still do not (engine.h, "Passes"),
 * decode rows do. With --speculative ngram a decode carries a draft and
 * its rows are taken in order until the first rejection (srv_spec_take).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/report.h"
#include "server/internal.h"

static int blocks_for(const srv_server *s, long long tokens) {
    return (int)((tokens + s->block_size - 1) / s->block_size);
}

int srv_sched_submit_many(srv_server *s, srv_req **rs, int k) {
    srv_sched *q = &s->sch;
    pthread_mutex_lock(&q->mu);
    if (q->stopping || q->n_waiting + k > s->opt.max_waiting) {
        pthread_mutex_unlock(&q->mu);
        return -1;
    }
    for (int i = 0; i < k; i++) {
        srv_req *r = rs[i];
        pthread_mutex_lock(&r->mu);
        r->refs++;
        pthread_mutex_unlock(&r->mu);
        r->next = NULL;
        if (q->tail)
            q->tail->next = r;
        else
            q->head = r;
        q->tail = r;
        q->n_waiting++;
    }
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int srv_sched_submit(srv_server *s, srv_req *r) {
    return srv_sched_submit_many(s, &r, 1);
}

/* Prompt-logprob rows per step: SRV_PLP_ROWS, or C when the engine cuts
 * passes at multiples of C (a prompt chunk must reach one). */
int srv_plp_rows(const srv_server *s) {
    int c = eng_pass_tokens(s->eng);
    return c > SRV_PLP_ROWS ? c : SRV_PLP_ROWS;
}

static void running_remove(srv_sched *q, int i) {
    for (int j = i + 1; j < q->n_running; j++)
        q->running[j - 1] = q->running[j];
    q->n_running--;
}

static void finish_running(srv_server *s, int i, srv_finish fin, const char *msg) {
    srv_sched *q = &s->sch;
    srv_req *r = q->running[i];
    running_remove(q, i);
    if (r->seq >= 0) {
        eng_seq_free(s->eng, r->seq);
        r->seq = -1;
    }
    /* Gauges before the client is released (see srv_req_finish). */
    srv_metrics_publish(s);
    srv_req_finish(s, r, fin, msg);
}

/* KV blocks the running requests may still take from the pool. */
static int pending_blocks(srv_server *s) {
    srv_sched *q = &s->sch;
    int n = 0;
    for (int i = 0; i < q->n_running; i++) {
        const srv_req *r = q->running[i];
        int left = blocks_for(s, (long long)r->n_prompt + r->max_tokens) - eng_seq_blocks(s->eng, r->seq);
        n += left > 0 ? left : 0;
    }
    return n;
}

/* Move waiting requests into the running batch while slots and KV blocks
 * allow. Returns 1 when the loop should exit (stopped and empty). */
static int admit(srv_server *s) {
    srv_sched *q = &s->sch;
    const int max_seqs = eng_get_config(s->eng)->max_num_seqs;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        /* cancelled while waiting */
        srv_req **pp = &q->head, *prev = NULL;
        while (*pp) {
            srv_req *r = *pp;
            int drop = atomic_load(&r->cancelled) || (q->stopping && srv_now() > q->drain_deadline);
            if (drop) {
                *pp = r->next;
                if (q->tail == r) q->tail = prev;
                q->n_waiting--;
                srv_req_finish(s, r, SRV_FIN_ABORT, "cancelled");
                continue;
            }
            prev = r;
            pp = &r->next;
        }
        if (q->head || q->n_running) break;
        if (q->stopping) {
            pthread_mutex_unlock(&q->mu);
            return 1;
        }
        pthread_mutex_unlock(&q->mu);
        srv_metrics_publish(s);
        pthread_mutex_lock(&q->mu);
        if (!q->head && !q->n_running && !q->stopping) pthread_cond_wait(&q->cv, &q->mu);
    }
    while (q->head && q->n_running < max_seqs) {
        srv_req *r = q->head;
        /* Reservation: the blocks every running request may still take
         * (up to prompt + max_tokens, less what it holds) plus this one's
         * must fit in what a step can take (free and evictable cached
         * blocks). Cached blocks it maps are not taken again, but the
         * evictable ones among them stop counting as free. A request that
         * wants prompt logprobs computes its prompt whole. */
        int max_reuse = r->plp_k >= 0 ? 0 : -1, evictable = 0;
        int hit = eng_prefix_peek(s->eng, r->prompt, r->n_prompt, max_reuse, &evictable);
        int need = blocks_for(s, (long long)r->n_prompt + r->max_tokens) - hit / s->block_size + evictable;
        eng_kv_usage u;
        eng_kv_get_usage(s->eng, &u);
        if (pending_blocks(s) + need > u.free_blocks) break; /* KV full: wait */
        int seq, reused;
        char err[128];
        if (eng_seq_new_prefix(s->eng, r->prompt, r->n_prompt, max_reuse, &seq, &reused, err, sizeof err) != 0) break;
        q->head = r->next;
        if (!q->head) q->tail = NULL;
        q->n_waiting--;
        r->seq = seq;
        r->n_cached = reused;
        atomic_store(&r->n_reused, reused);
        r->t_sched = srv_now();
        q->running[q->n_running++] = r;
        pthread_mutex_lock(&s->met.mu);
        srv_hist_observe(&s->met.queue, r->t_sched - r->t_arrive);
        pthread_mutex_unlock(&s->met.mu);
    }
    pthread_mutex_unlock(&q->mu);
    return 0;
}

/* Batch: decodes first, then prompt chunks, within the budget. A request
 * that wants prompt logprobs takes its prompt rows whole (ENG_LOGITS_ALL),
 * at most srv_plp_rows of them per step. Prompt chunks end where
 * eng_prompt_chunk cuts, so that a prompt's logits are those of any other
 * path (engine.h, "Passes"); there the engine runs decodes in a pass of
 * their own, and they leave the prompt budget whole (a prompt never waits
 * for a full C). Returns the items; *any_all: some take prompt rows. */
static int build_batch(srv_server *s, int *any_all, int *step_tokens) {
    srv_sched *q = &s->sch;
    const eng_config *ec = eng_get_config(s->eng);
    const int canon = eng_pass_tokens(s->eng) > 0;
    int n = 0, budget = ec->max_batch_tokens, plp_rows = srv_plp_rows(s);
    /* Drafts (server/spec.c) ride with the decodes and share the step's
     * tokens: one stays for every decode not batched yet; where the
     * decodes have a pass of their own that pass has the whole budget. */
    int n_dec = 0, dec_budget = ec->max_batch_tokens;
    for (int i = 0; i < q->n_running; i++) n_dec += q->running[i]->n_all - q->running[i]->n_cached == 1;
    const int n_decoding = n_dec;
    *any_all = *step_tokens = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < q->n_running && budget > 0; i++) {
            srv_req *r = q->running[i];
            int left = r->n_all - r->n_cached;
            if ((pass == 0) != (left == 1) || left <= 0) continue;
            int all = r->plp_k >= 0 && r->n_cached < r->n_prompt;
            if (all && plp_rows == 0) continue;
            int chunk = eng_prompt_chunk(s->eng, r->n_cached, left, all && plp_rows < budget ? plp_rows : budget);
            if (chunk == 0) continue;
            if (all) {
                plp_rows -= chunk;
                *any_all = 1;
            }
            eng_logits lg = all ? ENG_LOGITS_ALL : chunk == left ? ENG_LOGITS_LAST : ENG_LOGITS_NONE;
            if (pass == 0 && !all) {
                int *b = canon ? &dec_budget : &budget;
                int nd = srv_spec_draft(s, r, *b - --n_dec, n_decoding);
                if (canon) *b -= 1 + nd;
                chunk += nd;
                if (nd) lg = ENG_LOGITS_VERIFY;
            }
            q->items[n] = (eng_item){r->seq, r->all + r->n_cached, chunk, lg};
            q->item_req[n++] = i;
            if (!(canon && pass == 0)) budget -= chunk;
            *step_tokens += chunk;
        }
    }
    return n;
}

/* Item k's rows after the step: prompt logprobs, then the next token (or
 * a draft's) through the chain and the stop checks. *row / *frow: the
 * next candidates row / full row (packed when kmax). */
static srv_finish take_item(srv_server *s, int k, int kmax, int *row, int *frow, double t) {
    srv_sched *q = &s->sch;
    const int V = s->mc.vocab_size;
    srv_req *r = q->running[q->item_req[k]];
    const eng_item *it = &q->items[k];
    int p0 = r->n_cached;
    r->n_cached += it->n_tokens;
    float *last = NULL; /* the row that samples the next token */
    if (it->logits == ENG_LOGITS_VERIFY) {
        int full = !kmax || q->full[k];
        srv_finish fin = srv_spec_take(s, r, it, full, *row, *frow, t);
        *row += it->n_tokens;
        *frow += full ? it->n_tokens : 0;
        return fin;
    }
    if (it->logits == ENG_LOGITS_ALL) {
        for (int j = 0; j < it->n_tokens; j++) {
            float *rw = q->logits + (size_t)(*frow + j) * V;
            if (p0 + j + 1 < r->n_prompt) srv_logits_prompt(s, r, rw, p0 + j + 1);
        }
        last = q->logits + (size_t)(*frow + it->n_tokens - 1) * V;
        *frow += it->n_tokens;
        if (r->n_cached >= r->n_prompt) {
            pthread_mutex_lock(&r->mu);
            r->plp_done = 1;
            pthread_mutex_unlock(&r->mu);
            srv_group_notify(r->grp);
        }
        if (r->n_cached < r->n_all) return SRV_FIN_NONE; /* a prompt chunk before the last */
    } else if (it->logits != ENG_LOGITS_LAST) {
        return SRV_FIN_NONE;
    }
    if (r->n_all == r->n_prompt) {
        pthread_mutex_lock(&s->met.mu);
        s->met.prompt_tokens += (uint64_t)r->n_prompt;
        pthread_mutex_unlock(&s->met.mu);
        if (r->max_tokens == 0) return SRV_FIN_LENGTH; /* echo: score the prompt only */
    }
    srv_tokrec rec;
    if (last)
        srv_logits_sample_row(s, r, last, &rec, -1);
    else if (!kmax || q->full[k])
        srv_logits_sample_row(s, r, q->logits + (size_t)(*frow)++ * V, &rec, -1);
    else
        srv_logits_sample_cands(s, r, &q->cands[*row], &rec, -1);
    if (!last) (*row)++;
    return srv_take_token(s, r, &rec, t);
}

/* One engine step over the running batch, its tokens taken; finished
 * requests leave (from the end, so the indices stay valid). */
static void step_once(srv_server *s) {
    srv_sched *q = &s->sch;
    char err[512];
    int any_all, step_tokens;
    int n = build_batch(s, &any_all, &step_tokens);
    /* Each request whose next token the candidates decide takes the
     * candidates path; the others get their full rows in the same step.
     * A step with prompt-logprob rows takes full rows for all. */
    int kmax = 0;
    for (int k = 0; k < n; k++) {
        eng_logits lg = q->items[k].logits;
        int kr = !any_all && (lg == ENG_LOGITS_LAST || lg == ENG_LOGITS_VERIFY)
                     ? srv_logits_cands(s, q->running[q->item_req[k]])
                     : -1;
        q->full[k] = kr == 0;
        if (kr > kmax) kmax = kr;
    }
    srv_metrics_publish(s);
    int rc = kmax ? eng_step_cands(s->eng, q->items, n, kmax, q->cands, q->full, q->logits, err, sizeof err)
                  : eng_step(s->eng, q->items, n, q->logits, err, sizeof err);
    srv_finish *fins = q->fins; /* by running index */
    for (int i = 0; i < q->n_running; i++)
        fins[i] = SRV_FIN_NONE;
    if (rc != 0) {
        /* Reservation makes ENOSPACE impossible; any failure ends the
         * requests of this batch with an error, the server goes on. */
        srv_log(s, SRV_LOG_ERROR, "engine step failed (%d): %s", rc, err);
        char why[480];
        if (!atomic_load(&s->unusable) && !eng_usable(s->eng, why, sizeof why)) srv_set_unusable(s, why);
        for (int k = 0; k < n; k++)
            fins[q->item_req[k]] = SRV_FIN_ERROR;
        for (int i = q->n_running - 1; i >= 0; i--)
            if (fins[i] != SRV_FIN_NONE) finish_running(s, i, fins[i], err);
        return;
    }
    pthread_mutex_lock(&s->met.mu);
    srv_hist_observe(&s->met.iter_tokens, step_tokens);
    pthread_mutex_unlock(&s->met.mu);
    double t = srv_now();
    int row = 0, frow = 0;
    for (int k = 0; k < n; k++)
        fins[q->item_req[k]] = take_item(s, k, kmax, &row, &frow, t);
    for (int i = q->n_running - 1; i >= 0; i--)
        if (fins[i] != SRV_FIN_NONE)
            finish_running(s, i, fins[i],
                           fins[i] != SRV_FIN_ERROR     ? NULL
                           : q->running[i]->gram_failed ? "no token the grammar allows"
                                                        : "out of memory");
}

static void *sched_main(void *arg) {
    srv_server *s = arg;
    srv_sched *q = &s->sch;
    while (!admit(s)) {
        /* Cancelled running requests (client gone, or drain time over). */
        pthread_mutex_lock(&q->mu);
        int drain_over = q->stopping && srv_now() > q->drain_deadline;
        pthread_mutex_unlock(&q->mu);
        for (int i = q->n_running - 1; i >= 0; i--)
            if (drain_over || atomic_load(&q->running[i]->cancelled)) finish_running(s, i, SRV_FIN_ABORT, "cancelled");
        if (q->n_running == 0)
            srv_metrics_publish(s);
        else
            step_once(s);
    }
    srv_metrics_publish(s);
    return NULL;
}

int srv_sched_start(srv_server *s, char *err, size_t errlen) {
    srv_sched *q = &s->sch;
    const eng_config *ec = eng_get_config(s->eng);
    size_t V = (size_t)s->mc.vocab_size;
    q->running = calloc((size_t)ec->max_num_seqs, sizeof *q->running);
    q->items = calloc((size_t)ec->max_num_seqs, sizeof *q->items);
    q->item_req = calloc((size_t)ec->max_num_seqs, sizeof *q->item_req);
    q->fins = calloc((size_t)ec->max_num_seqs, sizeof *q->fins);
    /* a decode's rows: 1, or 1 + a draft (server/spec.c) */
    size_t rows = (size_t)ec->max_num_seqs * (1 + (size_t)(s->opt.spec.draft_max > 0 ? s->opt.spec.draft_max : 0));
    q->logits = malloc((rows + (size_t)srv_plp_rows(s)) * V * sizeof *q->logits);
    q->cands = malloc(rows * sizeof *q->cands);
    q->full = calloc((size_t)ec->max_num_seqs, sizeof *q->full);
    if (srv_logits_scratch_init(&q->lx, s->mc.vocab_size) || !q->running || !q->items || !q->item_req || !q->fins ||
        !q->logits || !q->cands || !q->full) {
        snprintf(err, errlen, "out of memory for the scheduler");
        return -1;
    }
    if (pthread_create(&q->thread, NULL, sched_main, s) != 0) {
        snprintf(err, errlen, "cannot start the scheduler thread");
        return -1;
    }
    q->started = 1;
    return 0;
}

void srv_sched_stop(srv_server *s) {
    srv_sched *q = &s->sch;
    pthread_mutex_lock(&q->mu);
    if (!q->stopping) {
        q->stopping = 1;
        q->drain_deadline = srv_now() + s->opt.drain_s;
    }
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (q->started) {
        pthread_join(q->thread, NULL);
        q->started = 0;
    }
    /* Never started (load failed): fail whatever was queued. */
    while (q->head) {
        srv_req *r = q->head;
        q->head = r->next;
        srv_req_finish(s, r, SRV_FIN_ABORT, "server shutting down");
    }
    q->tail = NULL;
    q->n_waiting = 0;
}
