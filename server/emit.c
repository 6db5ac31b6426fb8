/*
 * server/: a sampled token into the request's output — the thinking
 * budget's override and the grammar's verdict, then the stop matcher (EOS,
 * stop_token_ids, max_tokens, the context, stop strings with the text that
 * may begin one held back), detokenization and publishing to the client;
 * and the request's end, published.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

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
static srv_finish on_token(srv_server *s, srv_req *r, const srv_tokrec *rec, double t) {
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

/* A sampled token through the thinking budget and the grammar, then
 * on_token (reasoning.c tracks the thinking block). */
srv_finish srv_take_token(srv_server *s, srv_req *r, srv_tokrec *rec, double t) {
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
    srv_finish fin = on_token(s, r, rec, t);
    srv_think_track(r, gen0, rec->token, forced == 2);
    return fin;
}

/* Publish the end of a request and drop the scheduler's reference. */
void srv_req_finish(srv_server *s, srv_req *r, srv_finish fin, const char *msg) {
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
