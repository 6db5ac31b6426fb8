/*
 * engine/: single-sequence generation with logprobs (see engine.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

void eng_log_softmax(const float *logits, int n, double *out) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++) out[i] = (double)logits[i] - lse;
}

/* Partial selection: k is small (<= 64), so an insertion into a sorted
 * window of k beats sorting the whole vocabulary. */
int eng_top_k(const double *vals, int n, int k, int32_t *ids) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    int have = 0;
    for (int i = 0; i < n; i++) {
        if (have == k && !(vals[i] > vals[ids[k - 1]])) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && vals[i] > vals[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    return have;
}

/* splitmix64: tiny, seedable, statistically adequate for sampling. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t pick_token(const float *logits, const double *lp, int n, float temperature, uint64_t *rng) {
    if (temperature <= 0) {
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    /* p_i ∝ exp(lp_i / T); lp is already max-shifted so the largest term is
     * exp(<= 0) and nothing overflows. */
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (lp[i] > mx) mx = lp[i];
    for (int i = 0; i < n; i++) sum += exp((lp[i] - mx) / temperature);
    double u = (double)(rng_next(rng) >> 11) * 0x1.0p-53 * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp((lp[i] - mx) / temperature);
        if (u < acc) return i;
    }
    return n - 1;
}

static int is_eos(const model_config *c, int32_t t) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == t) return 1;
    return 0;
}

int eng_generate(model *m, const int32_t *prompt, int n_prompt, const eng_gen_params *p, eng_step_cb cb,
                 void *user, eng_finish *finish, char *err, size_t errlen) {
    const model_config *c = model_get_config(m);
    model_seq *seq = NULL;
    float *logits = NULL;
    double *lp = NULL;
    int rc = -1;
    *finish = ENG_FINISH_LENGTH;
    if (n_prompt <= 0) {
        snprintf(err, errlen, "empty prompt: at least one token is needed");
        return -1;
    }
    if (p->max_tokens < 0 || p->top_logprobs < 0 || p->top_logprobs > ENG_MAX_TOP_LOGPROBS ||
        !(p->temperature >= 0) || !isfinite(p->temperature)) {
        snprintf(err, errlen, "invalid generation parameters (max_tokens >= 0, 0 <= top_logprobs <= %d, temperature >= 0)",
                 ENG_MAX_TOP_LOGPROBS);
        return -1;
    }
    long long need = (long long)n_prompt + p->max_tokens;
    if (need > c->max_position_embeddings) {
        snprintf(err, errlen, "prompt (%d tokens) + max_tokens (%d) exceeds the model's context of %d tokens", n_prompt,
                 p->max_tokens, c->max_position_embeddings);
        return -1;
    }
    if (p->max_tokens == 0) return 0;
    if (model_seq_create(m, (int)need, &seq, err, errlen)) return -1;
    logits = malloc((size_t)c->vocab_size * sizeof *logits);
    lp = malloc((size_t)c->vocab_size * sizeof *lp);
    if (!logits || !lp) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    uint64_t rng = p->seed;
    if (model_forward(m, seq, prompt, n_prompt, MODEL_LOGITS_LAST, logits, err, errlen)) goto out;
    for (int step = 0;; step++) {
        eng_step st;
        eng_log_softmax(logits, c->vocab_size, lp);
        st.token = pick_token(logits, lp, c->vocab_size, p->temperature, &rng);
        st.logprob = lp[st.token];
        st.n_top = eng_top_k(lp, c->vocab_size, p->top_logprobs, st.top_ids);
        for (int i = 0; i < st.n_top; i++) st.top_logprobs[i] = lp[st.top_ids[i]];
        if (cb && cb(user, &st)) {
            *finish = ENG_FINISH_CALLBACK;
            break;
        }
        if (!p->ignore_eos && is_eos(c, st.token)) {
            *finish = ENG_FINISH_EOS;
            break;
        }
        if (step + 1 >= p->max_tokens) break;
        if (model_forward(m, seq, &st.token, 1, MODEL_LOGITS_LAST, logits, err, errlen)) goto out;
    }
    rc = 0;
out:
    free(lp);
    free(logits);
    model_seq_free(seq);
    return rc;
}
