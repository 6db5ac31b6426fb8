/*
 * engine/generate.h — one request from prompt to finish on top of eng_step
 * (tools and tests; the server's scheduler batches many instead).
 */
#ifndef ECHO_ENGINE_GENERATE_H
#define ECHO_ENGINE_GENERATE_H

#include <stdint.h>

#include "engine/engine.h"
#include "engine/sample.h"
#include "engine/spec.h"

#define ENG_MAX_TOP_LOGPROBS 64

typedef struct eng_gen_params {
    int max_tokens; /* >= 0 */
    eng_sampling sampling;
    int top_logprobs; /* 0..ENG_MAX_TOP_LOGPROBS */
    int ignore_eos;
    const int32_t *stop_ids; /* extra stop tokens */
    int n_stop_ids;
    /* speculative decoding: drafts of up to spec.draft_max tokens
     * (0: off), verified in the decode step; the same greedy tokens */
    eng_spec_params spec;
    /* optional, filled in: decode steps, draft tokens proposed and accepted */
    long long *spec_stats; /* [3]: steps, drafted, accepted */
} eng_gen_params;

/* Per generated token: the token, its natural-log probability under the
 * model's full distribution (log_softmax of the raw logits, before
 * temperature), and the top-k (id, logprob) pairs, descending. */
typedef struct eng_step_out {
    int32_t token;
    double logprob;
    int n_top;
    int32_t top_ids[ENG_MAX_TOP_LOGPROBS];
    double top_logprobs[ENG_MAX_TOP_LOGPROBS];
} eng_step_out;

typedef int (*eng_token_cb)(void *user, const eng_step_out *st); /* non-zero stops */

typedef enum eng_finish { ENG_FINISH_LENGTH = 0, ENG_FINISH_EOS, ENG_FINISH_STOP, ENG_FINISH_CALLBACK } eng_finish;

/* Prefill the prompt (in chunks of at most max_batch_tokens, cut by
 * eng_prompt_chunk), then decode until max_tokens, an EOS id
 * (unless ignore_eos), a stop id, or the callback says stop. With
 * p->spec.draft_max > 0 each decode step verifies a prompt-lookup draft
 * (ENG_LOGITS_VERIFY; drafts fit max_tokens and max_batch_tokens - 1) and
 * the callback sees every accepted token in order. */
int eng_generate(eng *e, const int32_t *prompt, int n_prompt, const eng_gen_params *p, eng_token_cb cb, void *user,
                 eng_finish *finish, char *err, size_t errlen);

#endif
