/*
 * engine/: single-request generation on top of eng_step / eng_step_cands
 * (see generate.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "engine/seq.h"

static int in_list(const int32_t *ids, int n, int32_t t) {
    for (int i = 0; i < n; i++)
        if (ids[i] == t) return 1;
    return 0;
}

/* The request's parameters against the engine: 0, or -1 with a message. */
static int check_params(const eng_config *ec, int n_prompt, const eng_gen_params *p, char *err, size_t errlen) {
    if (n_prompt <= 0) {
        snprintf(err, errlen, "empty prompt: at least one token is needed");
        return -1;
    }
    if (p->max_tokens < 0 || p->top_logprobs < 0 || p->top_logprobs > ENG_MAX_TOP_LOGPROBS ||
        !(p->sampling.temperature >= 0) || !isfinite(p->sampling.temperature) || p->sampling.top_k < 0 ||
        !(p->sampling.top_p > 0 && p->sampling.top_p <= 1)) {
        snprintf(err, errlen,
                 "invalid generation parameters (max_tokens >= 0, 0 <= top_logprobs <= %d, temperature >= 0, "
                 "top_k >= 0, 0 < top_p <= 1)",
                 ENG_MAX_TOP_LOGPROBS);
        return -1;
    }
    long long need = (long long)n_prompt + p->max_tokens;
    if (need > ec->max_model_len) {
        snprintf(err, errlen, "prompt (%d tokens) + max_tokens (%d) exceeds the context of %d tokens", n_prompt,
                 p->max_tokens, ec->max_model_len);
        return -1;
    }
    if (p->spec.draft_max < 0 || p->spec.draft_max > ENG_SPEC_DRAFT_LIMIT ||
        (p->spec.draft_max > 0 && !(1 <= p->spec.ngram_min && p->spec.ngram_min <= p->spec.ngram_max))) {
        snprintf(err, errlen, "invalid speculative parameters (draft_max %d in 0..%d, 1 <= ngram_min %d <= ngram_max %d)",
                 p->spec.draft_max, ENG_SPEC_DRAFT_LIMIT, p->spec.ngram_min, p->spec.ngram_max);
        return -1;
    }
    return 0;
}

/* Output token j of a step from its logits row (full, in logits + j rows,
 * with lp as log_softmax scratch) or its candidates (kc > 0): drawn by
 * eng_sample, or by the rejection rule against draft token x (x >= 0), with
 * its logprob and the top_logprobs. */
static void pick(const eng_gen_params *p, int vocab, int kc, const eng_cands *cds, const float *logits, double *lp,
                 int j, int32_t x, eng_rng *rng, eng_step_out *st) {
    if (kc) {
        const eng_cands *cd = &cds[j];
        st->token = x >= 0 ? eng_sample_cands_draft(cd, vocab, &p->sampling, rng, x)
                           : eng_sample_cands(cd, vocab, &p->sampling, rng);
        st->logprob = eng_cands_logprob(cd, st->token);
        st->n_top = p->top_logprobs < cd->k ? p->top_logprobs : cd->k;
        for (int i = 0; i < st->n_top; i++) {
            st->top_ids[i] = cd->ids[i];
            st->top_logprobs[i] = (double)cd->vals[i] - cd->lse;
        }
    } else {
        const float *row = logits + (size_t)j * vocab;
        eng_log_softmax(row, vocab, lp);
        st->token = x >= 0 ? eng_sample_draft(row, vocab, &p->sampling, rng, x)
                           : eng_sample(row, vocab, &p->sampling, rng);
        st->logprob = lp[st->token];
        st->n_top = eng_top_k(lp, vocab, p->top_logprobs, st->top_ids);
        for (int i = 0; i < st->n_top; i++) st->top_logprobs[i] = lp[st->top_ids[i]];
    }
}

int eng_generate(eng *e, const int32_t *prompt, int n_prompt, const eng_gen_params *p, eng_token_cb cb, void *user,
                 eng_finish *finish, char *err, size_t errlen) {
    const model_config *c = eng_model_config(e);
    const eng_config *ec = eng_get_config(e);
    float *logits = NULL;
    double *lp = NULL;
    eng_cands *cds = NULL;
    int32_t *ctx = NULL, *feed = NULL, *draft = NULL;
    int seq = -1, rc = -1;
    *finish = ENG_FINISH_LENGTH;
    if (check_params(ec, n_prompt, p, err, errlen)) return -1;
    if (p->max_tokens == 0) return 0;
    if (eng_seq_new(e, &seq, err, errlen)) return -1;
    /* Candidates when they suffice (the same tokens as the full row, see
     * eng_cands_needed): no vocabulary-sized row crosses to the host. */
    const int kc = eng_cands_needed(&p->sampling, p->top_logprobs, c->vocab_size);
    const int rows = 1 + (p->spec.draft_max > 0 ? p->spec.draft_max : 0); /* logits rows of a step at most */
    cds = malloc((size_t)rows * sizeof *cds);
    ctx = malloc(((size_t)n_prompt + (size_t)p->max_tokens) * sizeof *ctx);
    feed = malloc((size_t)rows * sizeof *feed);
    draft = malloc((size_t)rows * sizeof *draft);
    if (!kc) {
        logits = malloc((size_t)rows * (size_t)c->vocab_size * sizeof *logits);
        lp = malloc((size_t)c->vocab_size * sizeof *lp);
    }
    if (!cds || !ctx || !feed || !draft || (!kc && (!logits || !lp))) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    eng_rng rng;
    eng_rng_seed(&rng, p->sampling.seed);
    /* Chunked prefill: a prompt longer than one step's token budget
     * (max_batch_tokens) runs as several steps; only the last asks for
     * logits. Each chunk attends to the cache the earlier ones filled; chunks
     * end at eng_prompt_chunk's cuts, so the logits are those of any other
     * path (engine.h, "Passes"). */
    eng_item it;
    for (int done = 0; done < n_prompt;) {
        int chunk = eng_prompt_chunk(e, done, n_prompt - done, ec->max_batch_tokens);
        int last = done + chunk == n_prompt;
        it = (eng_item){seq, prompt + done, chunk, last ? ENG_LOGITS_LAST : ENG_LOGITS_NONE};
        if (!last ? eng_step(e, &it, 1, NULL, err, errlen)
            : kc  ? eng_step_cands(e, &it, 1, kc, cds, NULL, NULL, err, errlen)
                  : eng_step(e, &it, 1, logits, err, errlen))
            goto out;
        done += chunk;
    }
    /* Decode. Each step feeds the last token and, with speculation, a draft
     * behind it (prompt lookup over prompt + output): row j of the step
     * decides output token j, accepting draft[j] by eng_sample_draft's
     * rule; the first rejection ends the round, the row after the last
     * accepted draft token gives one more, and the KV of the rejected
     * draft tokens is dropped. Without a draft a step is the plain decode. */
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof *ctx);
    int n_ctx = n_prompt, nrows = 1, nd = 0, produced = 0, kcap = p->spec.draft_max;
    for (;;) {
        int j = 0, stop = 0, acc = 0;
        for (; j < nrows && !stop; j++) {
            eng_step_out st;
            int32_t x = j < nd ? draft[j] : -1;
            pick(p, c->vocab_size, kc, cds, logits, lp, j, x, &rng, &st);
            ctx[n_ctx++] = st.token;
            produced++;
            acc += x >= 0 && st.token == x;
            if (cb && cb(user, &st)) {
                *finish = ENG_FINISH_CALLBACK;
                stop = 1;
            } else if (!p->ignore_eos && in_list(c->eos_ids, c->n_eos, st.token)) {
                *finish = ENG_FINISH_EOS;
                stop = 1;
            } else if (in_list(p->stop_ids, p->n_stop_ids, st.token)) {
                *finish = ENG_FINISH_STOP;
                stop = 1;
            } else if (produced >= p->max_tokens) {
                stop = 1;
            } else if (x >= 0 && st.token != x) {
                j++;
                break; /* rejected: the draft ends here */
            }
        }
        if (p->spec_stats) p->spec_stats[2] += acc;
        kcap = eng_spec_next_k(kcap, nd, acc, p->spec.draft_max);
        if (stop) break;
        /* j rows were used: the fed token and j - 1 accepted draft tokens
         * stay in the cache, the rest of the draft goes */
        if (nd && eng_seq_truncate(e, seq, n_ctx - 1)) {
            snprintf(err, errlen, "speculative decoding: cannot drop the rejected draft");
            goto out;
        }
        int room = p->max_tokens - produced - 1; /* the step's last row gives one more token */
        if (room > ec->max_batch_tokens - 1) room = ec->max_batch_tokens - 1;
        if (room > kcap) room = kcap;
        nd = p->spec.draft_max > 0 ? eng_spec_ngram(ctx, n_ctx, &p->spec, room, draft) : 0;
        if (p->spec_stats) {
            p->spec_stats[0]++;
            p->spec_stats[1] += nd;
        }
        feed[0] = ctx[n_ctx - 1];
        memcpy(feed + 1, draft, (size_t)nd * sizeof *feed);
        nrows = 1 + nd;
        it = (eng_item){seq, feed, nrows, nd ? ENG_LOGITS_VERIFY : ENG_LOGITS_LAST};
        if (kc ? eng_step_cands(e, &it, 1, kc, cds, NULL, NULL, err, errlen)
               : eng_step(e, &it, 1, logits, err, errlen))
            goto out;
    }
    rc = 0;
out:
    eng_seq_free(e, seq);
    free(cds);
    free(ctx);
    free(feed);
    free(draft);
    free(lp);
    free(logits);
    return rc;
}
