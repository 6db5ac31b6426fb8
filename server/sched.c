/*
 * server/: the scheduler thread — continuous batching over eng_step().
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
 * its rows are taken in order until the first rejection (server/spec.c,
 * take_draft).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Publish the end of a request and drop the scheduler's reference. */
static void req_finish(srv_server *s, srv_req *r, srv_finish fin, const char *msg) {
    double t = srv_now();
    if (r->seq >= 0) {
        eng_seq_free(s->eng, r->seq);
        r->seq = -1;
    }
    /* Metrics first: a client that has its last byte must find its request
     * counted when it reads /metrics right after. */
    pthread_mutex_lock(&s->met.mu);
    s->met.success[fin]++;
    if (fin == SRV_FIN_STOP || fin == SRV_FIN_LENGTH) {
        srv_hist_observe(&s->met.e2e, t - r->t_arrive);
        if (r->n_toks > 0) srv_hist_observe(&s->met.decode, r->t_last - r->t_first);
        if (r->t_sched > 0) srv_hist_observe(&s->met.inference, t - r->t_sched);
        srv_hist_observe(&s->met.req_prompt, r->n_prompt);
        srv_hist_observe(&s->met.req_gen, r->n_toks);
    }
    pthread_mutex_unlock(&s->met.mu);
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    r->finish = fin;
    r->t_done = t;
    if (msg) snprintf(r->errmsg, sizeof r->errmsg, "%s", msg);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    srv_group_notify(r->grp);
    srv_req_unref(r);
}

/* Append bytes to a growable buffer; -1 when out of memory. */
static int buf_append(char **buf, size_t *len, size_t *cap, const char *p, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *len + n + 1)
            nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb) return -1;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

/* Longest proper prefix of any stop string that the generated text ends
 * with: that much text is held back until the next token decides it. */
static size_t stop_holdback(const srv_req *r) {
    size_t hold = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t L = r->stop_len[i];
        for (size_t k = L - 1; k > hold; k--) {
            if (k <= r->gen_len && memcmp(r->gen + r->gen_len - k, r->stop[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    return hold;
}

/* Earliest stop-string match starting at or after `from`, or -1; *which
 * gets the matching string's index. */
static long long stop_find(const srv_req *r, size_t from, int *which) {
    long long best = -1;
    for (int i = 0; i < r->n_stop; i++) {
        size_t L = r->stop_len[i];
        size_t st = from >= L - 1 ? from - (L - 1) : 0;
        if (r->gen_len < st + L) continue;
        const char *p = memmem(r->gen + st, r->gen_len - st, r->stop[i], L);
        if (p && (best < 0 || p - r->gen < best)) {
            best = p - r->gen;
            *which = i;
        }
    }
    return best;
}

/* Handle one sampled token: record it, detokenize, check stop conditions.
 * Returns the finish reason, or SRV_FIN_NONE to continue. */
static srv_finish req_on_token(srv_server *s, srv_req *r, const srv_tokrec *rec, double t) {
    int32_t tok = rec->token;
    int n_out = r->n_all - r->n_prompt + 1; /* generated tokens including this one */
    int is_eos = 0, is_stop_id = 0;
    for (int i = 0; i < s->mc.n_eos; i++)
        is_eos |= tok == s->mc.eos_ids[i];
    for (int i = 0; i < r->n_stop_ids; i++)
        is_stop_id |= tok == r->stop_ids[i];
    r->all[r->n_all++] = tok;
    if (r->want_cum) r->cum_logprob += rec->logprob;
    /* vLLM's stop_reason: the stop_token_ids entry (not EOS) that ended it */
    if (is_stop_id && !(is_eos && !r->ignore_eos)) r->stop_tok = tok;
    srv_finish fin = SRV_FIN_NONE;
    size_t before = r->gen_len;
    int oom = 0;
    if ((is_eos && !r->ignore_eos) || is_stop_id) {
        fin = SRV_FIN_STOP; /* the stop token's own text is not shown */
    } else {
        const char *txt;
        size_t n;
        char err[128];
        if (tok_stream_push(r->ds, tok, &txt, &n, err, sizeof err) == TOK_OK && n)
            oom |= buf_append(&r->gen, &r->gen_len, &r->gen_cap, txt, n);
    }
    if (fin == SRV_FIN_NONE && n_out >= r->max_tokens) fin = SRV_FIN_LENGTH;
    if (fin == SRV_FIN_NONE && r->n_all >= s->max_model_len) fin = SRV_FIN_LENGTH;
    if (fin != SRV_FIN_NONE) {
        const char *txt;
        size_t n;
        tok_stream_finish(r->ds, &txt, &n);
        if (n) oom |= buf_append(&r->gen, &r->gen_len, &r->gen_cap, txt, n);
    }
    size_t emit_to;
    /* min_tokens holds off stop strings too, as it holds off EOS. */
    int which = -1;
    long long at = r->n_stop && n_out >= r->min_tokens ? stop_find(r, before, &which) : -1;
    if (at >= 0) {
        r->stop_str = which;
        r->stop_tok = -1;
        r->gen_len = (size_t)at;
        emit_to = (size_t)at;
        fin = SRV_FIN_STOP;
    } else {
        emit_to = fin != SRV_FIN_NONE ? r->gen_len : r->gen_len - stop_holdback(r);
    }
    if (emit_to < r->sent) emit_to = r->sent;

    pthread_mutex_lock(&r->mu);
    if (r->n_toks == r->cap_toks) {
        int nc = r->cap_toks ? 2 * r->cap_toks : 16;
        srv_tokrec *nt = realloc(r->toks, (size_t)nc * sizeof *nt);
        if (nt) {
            r->toks = nt;
            r->cap_toks = nc;
        }
    }
    if (r->n_toks < r->cap_toks)
        r->toks[r->n_toks++] = *rec;
    else
        oom = 1;
    if (emit_to > r->sent) oom |= buf_append(&r->text, &r->text_len, &r->text_cap, r->gen + r->sent, emit_to - r->sent);
    r->sent = emit_to;
    int first = r->n_toks == 1;
    double prev = r->t_last;
    if (first) r->t_first = t;
    r->t_last = t;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    srv_group_notify(r->grp);

    pthread_mutex_lock(&s->met.mu);
    s->met.generation_tokens++;
    if (first) {
        srv_hist_observe(&s->met.ttft, t - r->t_arrive);
        srv_hist_observe(&s->met.prefill, t - r->t_sched);
    } else {
        srv_hist_observe(&s->met.itl, t - prev);
    }
    pthread_mutex_unlock(&s->met.mu);
    if (oom && fin == SRV_FIN_NONE) fin = SRV_FIN_ERROR;
    return fin;
}

/* vLLM's repetition penalty over prompt + output tokens, then min_tokens. */
static void apply_processors(srv_server *s, srv_req *r, float *row) {
    srv_sched *q = &s->sch;
    if (r->rep_penalty != 1.0f) {
        if (++q->stamp == 0) {
            memset(q->mark, 0, (size_t)s->mc.vocab_size * sizeof *q->mark);
            q->stamp = 1;
        }
        for (int i = 0; i < r->n_all; i++) {
            int32_t t = r->all[i];
            if (q->mark[t] == q->stamp) continue;
            q->mark[t] = q->stamp;
            row[t] = row[t] > 0 ? row[t] / r->rep_penalty : row[t] * r->rep_penalty;
        }
    }
    int n_out = r->n_all - r->n_prompt;
    if (r->presence != 0 || r->frequency != 0) {
        /* OpenAI's: logit -= frequency * count + presence * (count > 0), over the output tokens */
        if (++q->stamp2 == 0) {
            memset(q->mark2, 0, (size_t)s->mc.vocab_size * sizeof *q->mark2);
            q->stamp2 = 1;
        }
        for (int i = r->n_prompt; i < r->n_all; i++) {
            int32_t t = r->all[i];
            if (q->mark2[t] != q->stamp2) {
                q->mark2[t] = q->stamp2;
                q->cnt[t] = 0;
            }
            q->cnt[t]++;
        }
        for (int i = r->n_prompt; i < r->n_all; i++) {
            int32_t t = r->all[i];
            if (q->cnt[t] == 0) continue; /* already applied */
            row[t] -= r->frequency * (float)q->cnt[t] + r->presence;
            q->cnt[t] = 0;
        }
    }
    for (int i = 0; i < r->n_bias; i++)
        row[r->bias_ids[i]] += r->bias_vals[i];
    if (n_out < r->min_tokens) {
        for (int i = 0; i < s->mc.n_eos; i++)
            row[s->mc.eos_ids[i]] = -INFINITY;
        for (int i = 0; i < r->n_stop_ids; i++)
            row[r->stop_ids[i]] = -INFINITY;
    }
    if (r->min_p > 0 && r->sp.temperature > 0) {
        /* vLLM's min_p on the tempered distribution: p_i < min_p * p_max
         * <=> logit_i < max + T * ln(min_p) */
        int V = s->mc.vocab_size;
        float mx = -INFINITY;
        for (int i = 0; i < V; i++)
            if (row[i] > mx) mx = row[i];
        float cut = mx + r->sp.temperature * logf(r->min_p);
        for (int i = 0; i < V; i++)
            if (row[i] < cut) row[i] = -INFINITY;
    }
}

/* Constrained decoding: tokens the request's grammar does not allow next
 * get -inf, after the other processors and before temperature, top-k and
 * top-p (eng_sample), so greedy and sampled decoding alike pick an allowed
 * token. The time it takes is the per-token cost /metrics reports. */
static void apply_grammar(srv_server *s, srv_req *r, float *row) {
    double t0 = srv_now();
    char err[256];
    int rc = gram_matcher_fill(r->gm, s->sch.gmask, err, sizeof err);
    if (rc > 0) srv_think_mask(s, r, s->sch.gmask);
    if (rc > 0) gram_mask_apply(row, (size_t)s->mc.vocab_size, s->sch.gmask);
    if (rc < 0) srv_log(s, SRV_LOG_ERROR, "grammar mask: %s", err); /* the token is checked after sampling */
    double dt = srv_now() - t0;
    pthread_mutex_lock(&s->met.mu);
    srv_hist_observe(&s->met.grammar_mask, dt);
    pthread_mutex_unlock(&s->met.mu);
}

/* x >= 0: a draft token under verification, accepted or not by
 * eng_sample_draft's rule on the processed row (server/spec.c). */
static void sample_row(srv_server *s, srv_req *r, float *row, srv_tokrec *rec, int32_t x) {
    int V = s->mc.vocab_size;
    memset(rec, 0, sizeof *rec);
    int need_lp = r->want_logprobs || r->want_cum;
    if (need_lp) eng_log_softmax(row, V, s->sch.lp); /* raw model distribution, as vLLM */
    apply_processors(s, r, row);
    if (r->gm && srv_think_gate(r)) apply_grammar(s, r, row); /* the answer's grammar, not the thinking's */
    rec->token = x >= 0 ? eng_sample_draft(row, V, &r->sp, &r->rng, x) : eng_sample(row, V, &r->sp, &r->rng);
    if (need_lp) rec->logprob = (float)s->sch.lp[rec->token];
    if (r->want_logprobs) {
        if (r->top_logprobs > 0) {
            int k = eng_top_k(s->sch.lp, V, r->top_logprobs, rec->top_ids);
            rec->n_top = k;
            for (int i = 0; i < k; i++)
                rec->top_lp[i] = (float)s->sch.lp[rec->top_ids[i]];
        }
    }
}

/* Candidates the request's next token needs (eng_cands_needed), or 0 when
 * it needs the full row: the repetition penalty and min_tokens' masking of
 * EOS / stop ids rewrite logits anywhere in the vocabulary before
 * sampling, so the top candidates of the raw row would not be those of the
 * processed one. */
static int req_cands(const srv_server *s, const srv_req *r) {
    if (r->gm) return 0; /* the grammar's mask may exclude any of the top candidates */
    if (r->rep_penalty != 1.0f || r->presence != 0 || r->frequency != 0 || r->min_p > 0 || r->n_bias) return 0;
    if (r->n_all - r->n_prompt < r->min_tokens && (s->mc.n_eos > 0 || r->n_stop_ids > 0)) return 0;
    return eng_cands_needed(&r->sp, r->want_logprobs ? r->top_logprobs : 0, s->mc.vocab_size);
}

/* sample_row's twin on candidates: the same token (eng_sample_cands) and
 * logprobs (val - lse over the raw row) without the vocabulary-sized row. */
static void sample_cands(srv_server *s, srv_req *r, const eng_cands *c, srv_tokrec *rec, int32_t x) {
    memset(rec, 0, sizeof *rec);
    rec->token = x >= 0 ? eng_sample_cands_draft(c, s->mc.vocab_size, &r->sp, &r->rng, x)
                        : eng_sample_cands(c, s->mc.vocab_size, &r->sp, &r->rng);
    if (r->want_logprobs || r->want_cum) rec->logprob = (float)eng_cands_logprob(c, rec->token);
    if (r->want_logprobs) {
        int k = r->top_logprobs < c->k ? r->top_logprobs : c->k;
        rec->n_top = k;
        for (int i = 0; i < k; i++) {
            rec->top_ids[i] = c->ids[i];
            rec->top_lp[i] = (float)((double)c->vals[i] - c->lse);
        }
    }
}

/* Logprob, rank and top-k of prompt token `pos` under `row` (the logits
 * at pos - 1), into r->prompt_lp[pos]. */
static void prompt_logprob(srv_server *s, srv_req *r, const float *row, int pos) {
    int V = s->mc.vocab_size;
    double *lp = s->sch.lp;
    eng_log_softmax(row, V, lp);
    srv_tokrec *rec = &r->prompt_lp[pos];
    int32_t tok = r->prompt[pos];
    rec->token = tok;
    rec->logprob = (float)lp[tok];
    int rank = 1;
    for (int i = 0; i < V; i++)
        rank += lp[i] > lp[tok];
    rec->rank = rank;
    rec->n_top = r->plp_k > 0 ? eng_top_k(lp, V, r->plp_k, rec->top_ids) : 0;
    for (int i = 0; i < rec->n_top; i++)
        rec->top_lp[i] = (float)lp[rec->top_ids[i]];
}

/* Prompt-logprob rows per step: SRV_PLP_ROWS, or C when the engine cuts
 * passes at multiples of C (a prompt chunk must reach one). */
int srv_plp_rows(const srv_server *s) {
    int c = eng_pass_tokens(s->eng);
    return c > SRV_PLP_ROWS ? c : SRV_PLP_ROWS;
}

static void publish_gauges(srv_server *s) {
    eng_kv_usage u;
    eng_kv_get_usage(s->eng, &u);
    echo_stats cs;
    eng_comm_stats(s->eng, &cs);
    pthread_mutex_lock(&s->met.mu);
    s->met.running = s->sch.n_running;
    s->met.waiting = s->sch.n_waiting;
    s->met.kv_usage = u.total_blocks ? (double)(u.total_blocks - u.free_blocks) / u.total_blocks : 0;
    s->met.kv = u;
    s->met.comm = cs;
    pthread_mutex_unlock(&s->met.mu);
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
    /* Gauges before the client is released (see req_finish). */
    publish_gauges(s);
    req_finish(s, r, fin, msg);
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
                req_finish(s, r, SRV_FIN_ABORT, "cancelled");
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
        publish_gauges(s);
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

/* A sampled token through the thinking budget and the grammar, then
 * req_on_token (reasoning.c tracks the thinking block). */
static srv_finish take_token(srv_server *s, srv_req *r, srv_tokrec *rec, double t) {
    int forced = srv_think_override(s, r, rec); /* the thinking budget's end marker */
    if (r->gm && !srv_think_accept(s, r, rec->token)) {
        /* Every token was masked (min_tokens or ignore_eos held off the only
         * allowed stop, or the grammar engine failed): never emit a token the
         * grammar refuses. A complete text ends as if EOS was sampled. */
        if (!gram_matcher_complete(r->gm) || s->mc.n_eos == 0) {
            r->gram_failed = 1;
            return SRV_FIN_ERROR;
        }
        memset(rec, 0, sizeof *rec);
        rec->token = s->mc.eos_ids[0];
        r->ignore_eos = 0;
    }
    size_t gen0 = r->gen_len;
    srv_finish fin = req_on_token(s, r, rec, t);
    srv_think_track(r, gen0, rec->token, forced == 2);
    return fin;
}

/* A verified draft (ENG_LOGITS_VERIFY, server/spec.c): row j samples output
 * token j with the draft's token j as x, through the same processors,
 * grammar and stop checks as a plain decode, until a rejection, a finish or
 * the row after the draft; then the rejected tail's KV goes. `row0` /
 * `frow0`: the item's first candidates row / full row (full: its rows came
 * back whole). */
static srv_finish take_draft(srv_server *s, srv_req *r, const eng_item *it, int full, int row0, int frow0, double t) {
    srv_sched *q = &s->sch;
    const int nd = it->n_tokens - 1;
    int acc = 0;
    srv_finish fin = SRV_FIN_NONE;
    for (int j = 0; j <= nd && fin == SRV_FIN_NONE; j++) {
        int32_t x = j < nd ? r->spec_draft[j] : -1;
        srv_tokrec rec;
        if (full)
            sample_row(s, r, q->logits + (size_t)(frow0 + j) * s->mc.vocab_size, &rec, x);
        else
            sample_cands(s, r, &q->cands[row0 + j], &rec, x);
        fin = take_token(s, r, &rec, t);
        if (x < 0 || rec.token != x) break;
        acc++;
    }
    srv_spec_done(s, r, nd, acc);
    if (fin == SRV_FIN_NONE) {
        r->n_cached = r->n_all - 1; /* the fed token and the accepted draft */
        if (eng_seq_truncate(s->eng, r->seq, r->n_cached)) fin = SRV_FIN_ERROR;
    }
    return fin;
}

static void *sched_main(void *arg) {
    srv_server *s = arg;
    srv_sched *q = &s->sch;
    const eng_config *ec = eng_get_config(s->eng);
    const int V = s->mc.vocab_size;
    char err[512];
    while (!admit(s)) {
        /* Cancelled running requests (client gone, or drain time over). */
        int drain_over = 0;
        pthread_mutex_lock(&q->mu);
        drain_over = q->stopping && srv_now() > q->drain_deadline;
        pthread_mutex_unlock(&q->mu);
        for (int i = q->n_running - 1; i >= 0; i--)
            if (drain_over || atomic_load(&q->running[i]->cancelled)) finish_running(s, i, SRV_FIN_ABORT, "cancelled");
        if (q->n_running == 0) {
            publish_gauges(s);
            continue;
        }
        /* Batch: decodes first, then prompt chunks, within the budget. A
         * request that wants prompt logprobs takes its prompt rows whole
         * (ENG_LOGITS_ALL), at most srv_plp_rows of them per step. Prompt
         * chunks end where eng_prompt_chunk cuts, so that a prompt's logits
         * are those of any other path (engine.h, "Passes"); there the
         * engine runs decodes in a pass of their own, and they leave the
         * prompt budget whole (a prompt never waits for a full C). */
        const int canon = eng_pass_tokens(s->eng) > 0;
        int n = 0, budget = ec->max_batch_tokens, plp_rows = srv_plp_rows(s), any_all = 0, step_tokens = 0;
        /* Drafts (server/spec.c) ride with the decodes and share the step's
         * tokens: one stays for every decode not batched yet; where the
         * decodes have a pass of their own that pass has the whole budget. */
        int n_dec = 0, dec_budget = ec->max_batch_tokens;
        for (int i = 0; i < q->n_running; i++) n_dec += q->running[i]->n_all - q->running[i]->n_cached == 1;
        const int n_decoding = n_dec;
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
                    any_all = 1;
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
                step_tokens += chunk;
            }
        }
        /* Each request whose next token the candidates decide takes the
         * candidates path; the others get their full rows in the same step.
         * A step with prompt-logprob rows takes full rows for all. */
        int kmax = 0;
        for (int k = 0; k < n; k++) {
            eng_logits lg = q->items[k].logits;
            int kr = !any_all && (lg == ENG_LOGITS_LAST || lg == ENG_LOGITS_VERIFY)
                         ? req_cands(s, q->running[q->item_req[k]])
                         : -1;
            q->full[k] = kr == 0;
            if (kr > kmax) kmax = kr;
        }
        publish_gauges(s);
        int rc = kmax ? eng_step_cands(s->eng, q->items, n, kmax, q->cands, q->full, q->logits, err, sizeof err)
                      : eng_step(s->eng, q->items, n, q->logits, err, sizeof err);
        /* Finish reasons by running index; applied from the end so the
         * indices stay valid while requests leave the batch. */
        srv_finish *fins = q->fins;
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
            continue;
        }
        pthread_mutex_lock(&s->met.mu);
        srv_hist_observe(&s->met.iter_tokens, step_tokens);
        pthread_mutex_unlock(&s->met.mu);
        double t = srv_now();
        int row = 0, frow = 0; /* logits row; full row (packed when kmax) */
        for (int k = 0; k < n; k++) {
            srv_req *r = q->running[q->item_req[k]];
            const eng_item *it = &q->items[k];
            int p0 = r->n_cached;
            r->n_cached += it->n_tokens;
            float *last = NULL; /* the row that samples the next token */
            if (it->logits == ENG_LOGITS_VERIFY) {
                int full = !kmax || q->full[k];
                fins[q->item_req[k]] = take_draft(s, r, it, full, row, frow, t);
                row += it->n_tokens;
                frow += full ? it->n_tokens : 0;
                continue;
            }
            if (it->logits == ENG_LOGITS_ALL) {
                for (int j = 0; j < it->n_tokens; j++) {
                    float *rw = q->logits + (size_t)(frow + j) * V;
                    if (p0 + j + 1 < r->n_prompt) prompt_logprob(s, r, rw, p0 + j + 1);
                }
                last = q->logits + (size_t)(frow + it->n_tokens - 1) * V;
                frow += it->n_tokens;
                if (r->n_cached >= r->n_prompt) {
                    pthread_mutex_lock(&r->mu);
                    r->plp_done = 1;
                    pthread_mutex_unlock(&r->mu);
                    srv_group_notify(r->grp);
                }
                if (r->n_cached < r->n_all) continue; /* a prompt chunk before the last */
            } else if (it->logits != ENG_LOGITS_LAST) {
                continue;
            }
            if (r->n_all == r->n_prompt) {
                pthread_mutex_lock(&s->met.mu);
                s->met.prompt_tokens += (uint64_t)r->n_prompt;
                pthread_mutex_unlock(&s->met.mu);
                if (r->max_tokens == 0) { /* echo: score the prompt only */
                    fins[q->item_req[k]] = SRV_FIN_LENGTH;
                    continue;
                }
            }
            srv_tokrec rec;
            if (last)
                sample_row(s, r, last, &rec, -1);
            else if (!kmax || q->full[k])
                sample_row(s, r, q->logits + (size_t)frow++ * V, &rec, -1);
            else
                sample_cands(s, r, &q->cands[row], &rec, -1);
            if (!last) row++;
            fins[q->item_req[k]] = take_token(s, r, &rec, t);
        }
        for (int i = q->n_running - 1; i >= 0; i--)
            if (fins[i] != SRV_FIN_NONE)
                finish_running(s, i, fins[i],
                               fins[i] != SRV_FIN_ERROR     ? NULL
                               : q->running[i]->gram_failed ? "no token the grammar allows"
                                                            : "out of memory");
    }
    publish_gauges(s);
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
    q->lp = malloc(V * sizeof *q->lp);
    q->mark = calloc(V, sizeof *q->mark);
    q->mark2 = calloc(V, sizeof *q->mark2);
    q->cnt = calloc(V, sizeof *q->cnt);
    q->gmask = malloc(gram_mask_words(V) * sizeof *q->gmask);
    if (!q->mark2 || !q->cnt || !q->running || !q->items || !q->item_req || !q->fins || !q->logits || !q->cands || !q->full || !q->lp ||
        !q->mark || !q->gmask) {
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
        req_finish(s, r, SRV_FIN_ABORT, "server shutting down");
    }
    q->tail = NULL;
    q->n_waiting = 0;
}
