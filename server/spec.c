/*
 * server/: speculative decoding in the scheduler (docs/speculative.md).
 * A decoding request gets a prompt-lookup draft (eng_spec_ngram) behind
 * its last token; the step verifies it (ENG_LOGITS_VERIFY: one row per
 * token) and srv_spec_take takes the rows in order through the usual sampling,
 * grammar and stop checks with eng_sample_draft's rule, stopping at the
 * first rejection; the rejected tail's KV is dropped (eng_seq_truncate).
 * Here: the draft, its length policy, and the counters.
 */
#include <stdio.h>
#include <string.h>

#include "server/internal.h"

int srv_spec_draft(srv_server *s, srv_req *r, int budget, int n_decoding) {
    const eng_spec_params *p = &s->opt.spec;
    r->spec_n = 0;
    if (p->draft_max <= 0) return 0;
    /* a wide batch already shares the weight stream: a draft's rows would be
     * extra compute there, not saved passes */
    if (s->opt.spec_max_batch > 0 && n_decoding > s->opt.spec_max_batch) return 0;
    if (r->spec_k <= 0) r->spec_k = p->draft_max;
    int n_out = r->n_all - r->n_prompt;
    int k = r->spec_k;
    /* the step's last row gives one more token: max_tokens, the context
     * and the step budget hold the draft plus that one */
    if (k > r->max_tokens - n_out - 1) k = r->max_tokens - n_out - 1;
    if (k > s->max_model_len - r->n_all) k = s->max_model_len - r->n_all;
    if (k > budget - 1) k = budget - 1;
    if (k <= 0) return 0;
    int n = eng_spec_ngram(r->all, r->n_all, p, k, r->spec_draft);
    /* behind the fed token, where the accepted tokens will land */
    memcpy(r->all + r->n_all, r->spec_draft, (size_t)n * sizeof *r->all);
    r->spec_n = n;
    return n;
}

void srv_spec_done(srv_server *s, srv_req *r, int n, int accepted) {
    r->spec_k = eng_spec_next_k(r->spec_k, n, accepted, s->opt.spec.draft_max);
    r->spec_steps++; /* read by the HTTP side once the request is done */
    r->spec_drafted += n;
    r->spec_accepted += accepted;
    pthread_mutex_lock(&s->met.mu);
    s->met.spec_drafts++;
    s->met.spec_draft_tokens += (uint64_t)n;
    s->met.spec_accepted_tokens += (uint64_t)accepted;
    srv_hist_observe(&s->met.spec_accepted, accepted);
    pthread_mutex_unlock(&s->met.mu);
}

json_t *srv_spec_timings(const srv_req *r) {
    if (r->spec_k <= 0) return NULL;
    long long st = r->spec_steps, d = r->spec_drafted, a = r->spec_accepted;
    return json_pack("{s:I,s:I,s:I,s:f}", "draft_steps", (json_int_t)st, "draft_tokens", (json_int_t)d,
                     "accepted_tokens", (json_int_t)a, "acceptance_rate", d ? (double)a / (double)d : 0.0);
}
/* A verified draft (ENG_LOGITS_VERIFY): row j samples output
 * token j with the draft's token j as x, through the same processors,
 * grammar and stop checks as a plain decode, until a rejection, a finish or
 * the row after the draft; then the rejected tail's KV goes. `row0` /
 * `frow0`: the item's first candidates row / full row (full: its rows came
 * back whole). */
srv_finish srv_spec_take(srv_server *s, srv_req *r, const eng_item *it, int full, int row0, int frow0, double t) {
    srv_sched *q = &s->sch;
    const int nd = it->n_tokens - 1;
    int acc = 0;
    srv_finish fin = SRV_FIN_NONE;
    for (int j = 0; j <= nd && fin == SRV_FIN_NONE; j++) {
        int32_t x = j < nd ? r->spec_draft[j] : -1;
        srv_tokrec rec;
        if (full)
            srv_logits_sample_row(s, r, q->logits + (size_t)(frow0 + j) * s->mc.vocab_size, &rec, x);
        else
            srv_logits_sample_cands(s, r, &q->cands[row0 + j], &rec, x);
        fin = srv_take_token(s, r, &rec, t);
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
