/*
 * server/: the logits-processor chain and sampling. A request's plan holds
 * the chain: the rows of PROCESSORS it uses, in table order, picked once
 * when the request is built (openai.c, srv_logits_plan). The scheduler runs
 * the chain on each sampling row, then samples and records logprobs here.
 *
 * Order (as vLLM): logprobs are read on the raw row (the model's
 * distribution); then repetition penalty, presence / frequency, logit_bias,
 * min_tokens, min_p, the grammar's mask; then temperature, top-k, top-p and
 * the draw (eng_sample).
 *
 * To add a processor: one row below — `on` (the request asks for it),
 * `full` (this step it may rewrite logits anywhere in the vocabulary, so
 * the engine's top candidates cannot stand in for the row; NULL: never),
 * `apply` (rewrite the row in place).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

static int always(const srv_server *s, const srv_req *r) {
    (void)s, (void)r;
    return 1;
}

/* vLLM's repetition penalty over prompt + output tokens. */
static int rep_on(const srv_server *s, const srv_req *r) {
    (void)s;
    return r->rep_penalty != 1.0f;
}
static void rep_apply(srv_server *s, srv_req *r, float *row) {
    srv_logits_scratch *x = &s->sch.lx;
    if (++x->stamp == 0) {
        memset(x->mark, 0, (size_t)s->mc.vocab_size * sizeof *x->mark);
        x->stamp = 1;
    }
    for (int i = 0; i < r->n_all; i++) {
        int32_t t = r->all[i];
        if (x->mark[t] == x->stamp) continue;
        x->mark[t] = x->stamp;
        row[t] = row[t] > 0 ? row[t] / r->rep_penalty : row[t] * r->rep_penalty;
    }
}

/* OpenAI's: logit -= frequency * count + presence * (count > 0), over the output tokens. */
static int pf_on(const srv_server *s, const srv_req *r) {
    (void)s;
    return r->presence != 0 || r->frequency != 0;
}
static void pf_apply(srv_server *s, srv_req *r, float *row) {
    srv_logits_scratch *x = &s->sch.lx;
    if (++x->stamp2 == 0) {
        memset(x->mark2, 0, (size_t)s->mc.vocab_size * sizeof *x->mark2);
        x->stamp2 = 1;
    }
    for (int i = r->n_prompt; i < r->n_all; i++) {
        int32_t t = r->all[i];
        if (x->mark2[t] != x->stamp2) {
            x->mark2[t] = x->stamp2;
            x->cnt[t] = 0;
        }
        x->cnt[t]++;
    }
    for (int i = r->n_prompt; i < r->n_all; i++) {
        int32_t t = r->all[i];
        if (x->cnt[t] == 0) continue; /* already applied */
        row[t] -= r->frequency * (float)x->cnt[t] + r->presence;
        x->cnt[t] = 0;
    }
}

static int bias_on(const srv_server *s, const srv_req *r) {
    (void)s;
    return r->n_bias > 0;
}
static void bias_apply(srv_server *s, srv_req *r, float *row) {
    (void)s;
    for (int i = 0; i < r->n_bias; i++)
        row[r->bias_ids[i]] += r->bias_vals[i];
}

/* min_tokens: EOS and the stop ids are masked until that many are out. */
static int mint_on(const srv_server *s, const srv_req *r) {
    (void)s;
    return r->min_tokens > 0;
}
static int mint_full(const srv_server *s, const srv_req *r) {
    return r->n_all - r->n_prompt < r->min_tokens && (s->mc.n_eos > 0 || r->n_stop_ids > 0);
}
static void mint_apply(srv_server *s, srv_req *r, float *row) {
    if (r->n_all - r->n_prompt >= r->min_tokens) return;
    for (int i = 0; i < s->mc.n_eos; i++)
        row[s->mc.eos_ids[i]] = -INFINITY;
    for (int i = 0; i < r->n_stop_ids; i++)
        row[r->stop_ids[i]] = -INFINITY;
}

/* vLLM's min_p on the tempered distribution: p_i < min_p * p_max
 * <=> logit_i < max + T * ln(min_p) */
static int minp_on(const srv_server *s, const srv_req *r) {
    (void)s;
    return r->min_p > 0;
}
static void minp_apply(srv_server *s, srv_req *r, float *row) {
    if (r->sp.temperature <= 0) return;
    int V = s->mc.vocab_size;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (row[i] > mx) mx = row[i];
    float cut = mx + r->sp.temperature * logf(r->min_p);
    for (int i = 0; i < V; i++)
        if (row[i] < cut) row[i] = -INFINITY;
}

/* Constrained decoding: tokens the request's grammar does not allow next
 * get -inf, after the other processors and before temperature, top-k and
 * top-p, so greedy and sampled decoding alike pick an allowed token; not
 * inside a thinking block (the answer's grammar, not the thinking's). The
 * time it takes is the per-token cost /metrics reports. */
static int gram_on(const srv_server *s, const srv_req *r) {
    (void)s;
    return r->gram || r->gm;
}
static void gram_apply(srv_server *s, srv_req *r, float *row) {
    if (!r->gm || !srv_think_gate(r)) return;
    uint32_t *gmask = s->sch.lx.gmask;
    double t0 = srv_now();
    char err[256];
    int rc = gram_matcher_fill(r->gm, gmask, err, sizeof err);
    if (rc > 0) srv_think_mask(s, r, gmask);
    if (rc > 0) gram_mask_apply(row, (size_t)s->mc.vocab_size, gmask);
    if (rc < 0) srv_log(s, SRV_LOG_ERROR, "grammar mask: %s", err); /* the token is checked after sampling */
    double dt = srv_now() - t0;
    pthread_mutex_lock(&s->met.mu);
    srv_hist_observe(&s->met.grammar_mask, dt);
    pthread_mutex_unlock(&s->met.mu);
}

static const srv_lproc PROCESSORS[] = {
    {"repetition_penalty", rep_on, always, rep_apply},
    {"presence_frequency", pf_on, always, pf_apply},
    {"logit_bias", bias_on, always, bias_apply},
    {"min_tokens", mint_on, mint_full, mint_apply},
    {"min_p", minp_on, always, minp_apply},
    {"grammar", gram_on, always, gram_apply},
};
_Static_assert(sizeof PROCESSORS / sizeof PROCESSORS[0] <= SRV_MAX_LPROCS, "srv_req.chain holds every row");

void srv_logits_plan(const srv_server *s, srv_req *r) {
    r->n_chain = 0;
    for (size_t i = 0; i < sizeof PROCESSORS / sizeof PROCESSORS[0]; i++)
        if (PROCESSORS[i].on(s, r)) r->chain[r->n_chain++] = &PROCESSORS[i];
}

int srv_logits_cands(const srv_server *s, const srv_req *r) {
    for (int i = 0; i < r->n_chain; i++)
        if (r->chain[i]->full && r->chain[i]->full(s, r)) return 0;
    return eng_cands_needed(&r->sp, r->want_logprobs ? r->top_logprobs : 0, s->mc.vocab_size);
}

void srv_logits_sample_row(srv_server *s, srv_req *r, float *row, srv_tokrec *rec, int32_t x) {
    int V = s->mc.vocab_size;
    double *lp = s->sch.lx.lp;
    memset(rec, 0, sizeof *rec);
    int need_lp = r->want_logprobs || r->want_cum;
    if (need_lp) eng_log_softmax(row, V, lp); /* raw model distribution, as vLLM */
    for (int i = 0; i < r->n_chain; i++)
        r->chain[i]->apply(s, r, row);
    rec->token = x >= 0 ? eng_sample_draft(row, V, &r->sp, &r->rng, x) : eng_sample(row, V, &r->sp, &r->rng);
    if (need_lp) rec->logprob = (float)lp[rec->token];
    if (r->want_logprobs && r->top_logprobs > 0) {
        int k = eng_top_k(lp, V, r->top_logprobs, rec->top_ids);
        rec->n_top = k;
        for (int i = 0; i < k; i++)
            rec->top_lp[i] = (float)lp[rec->top_ids[i]];
    }
}

void srv_logits_sample_cands(srv_server *s, srv_req *r, const eng_cands *c, srv_tokrec *rec, int32_t x) {
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

void srv_logits_prompt(srv_server *s, srv_req *r, const float *row, int pos) {
    int V = s->mc.vocab_size;
    double *lp = s->sch.lx.lp;
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

int srv_logits_scratch_init(srv_logits_scratch *x, int vocab) {
    size_t V = (size_t)vocab;
    x->lp = malloc(V * sizeof *x->lp);
    x->mark = calloc(V, sizeof *x->mark);
    x->mark2 = calloc(V, sizeof *x->mark2);
    x->cnt = calloc(V, sizeof *x->cnt);
    x->gmask = malloc(gram_mask_words(V) * sizeof *x->gmask);
    return x->lp && x->mark && x->mark2 && x->cnt && x->gmask ? 0 : -1;
}

void srv_logits_scratch_free(srv_logits_scratch *x) {
    free(x->lp);
    free(x->mark);
    free(x->mark2);
    free(x->cnt);
    free(x->gmask);
    memset(x, 0, sizeof *x);
}
