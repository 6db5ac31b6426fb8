/*
 * engine/: single-request generation on top of eng_step / eng_step_cands
 * (see engine.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

static int in_list(const int32_t *ids, int n, int32_t t) {
    for (int i = 0; i < n; i++)
        if (ids[i] == t) return 1;
    return 0;
}

int eng_generate(eng *e, const int32_t *prompt, int n_prompt, const eng_gen_params *p, eng_token_cb cb, void *user,
                 eng_finish *finish, char *err, size_t errlen) {
    const model_config *c = eng_model_config(e);
    const eng_config *ec = eng_get_config(e);
    float *logits = NULL;
    double *lp = NULL;
    int seq = -1, rc = -1;
    *finish = ENG_FINISH_LENGTH;
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
    if (p->max_tokens == 0) return 0;
    if (eng_seq_new(e, &seq, err, errlen)) return -1;
    /* Candidates when they suffice (the same tokens as the full row, see
     * eng_cands_needed): no vocabulary-sized row crosses to the host. */
    const int kc = eng_cands_needed(&p->sampling, p->top_logprobs, c->vocab_size);
    eng_cands cd;
    if (!kc) {
        logits = malloc((size_t)c->vocab_size * sizeof *logits);
        lp = malloc((size_t)c->vocab_size * sizeof *lp);
        if (!logits || !lp) {
            snprintf(err, errlen, "out of memory");
            goto out;
        }
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
            : kc  ? eng_step_cands(e, &it, 1, kc, &cd, NULL, NULL, err, errlen)
                  : eng_step(e, &it, 1, logits, err, errlen))
            goto out;
        done += chunk;
    }
    for (int step = 0;; step++) {
        eng_step_out st;
        if (kc) {
            st.token = eng_sample_cands(&cd, c->vocab_size, &p->sampling, &rng);
            st.logprob = eng_cands_logprob(&cd, st.token);
            st.n_top = p->top_logprobs < cd.k ? p->top_logprobs : cd.k;
            for (int i = 0; i < st.n_top; i++) {
                st.top_ids[i] = cd.ids[i];
                st.top_logprobs[i] = (double)cd.vals[i] - cd.lse;
            }
        } else {
            eng_log_softmax(logits, c->vocab_size, lp);
            st.token = eng_sample(logits, c->vocab_size, &p->sampling, &rng);
            st.logprob = lp[st.token];
            st.n_top = eng_top_k(lp, c->vocab_size, p->top_logprobs, st.top_ids);
            for (int i = 0; i < st.n_top; i++) st.top_logprobs[i] = lp[st.top_ids[i]];
        }
        if (cb && cb(user, &st)) {
            *finish = ENG_FINISH_CALLBACK;
            break;
        }
        if (!p->ignore_eos && in_list(c->eos_ids, c->n_eos, st.token)) {
            *finish = ENG_FINISH_EOS;
            break;
        }
        if (in_list(p->stop_ids, p->n_stop_ids, st.token)) {
            *finish = ENG_FINISH_STOP;
            break;
        }
        if (step + 1 >= p->max_tokens) break;
        it = (eng_item){seq, &st.token, 1, ENG_LOGITS_LAST};
        if (kc ? eng_step_cands(e, &it, 1, kc, &cd, NULL, NULL, err, errlen)
               : eng_step(e, &it, 1, logits, err, errlen))
            goto out;
    }
    rc = 0;
out:
    eng_seq_free(e, seq);
    free(lp);
    free(logits);
    return rc;
}
