/*
 * engine/ — turns a model into generated tokens.
 *
 * Contract (this version: one sequence at a time, tp = 1)
 *   - eng_generate() prefills the whole prompt in one batched forward pass,
 *     then decodes one token per step until max_tokens, an EOS id (unless
 *     ignore_eos) or a callback asks to stop.
 *   - Every step reports the chosen token, its natural-log probability under
 *     the model's full-vocabulary distribution (log_softmax of the raw
 *     logits, before temperature), and the top-k (id, logprob) pairs sorted
 *     by descending logprob, ties by ascending id.
 *   - temperature == 0 is greedy (argmax, lowest id wins a tie, like
 *     torch.argmax); temperature > 0 samples from softmax(logits / T) with a
 *     generator seeded by `seed`, so runs are reproducible.
 *   - Library code: returns status, writes messages into the caller's buffer.
 */
#ifndef ECHO_ENGINE_H
#define ECHO_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

#define ENG_MAX_TOP_LOGPROBS 64

typedef struct eng_gen_params {
    int max_tokens;   /* >= 0 */
    float temperature; /* >= 0; 0 = greedy */
    uint64_t seed;
    int top_logprobs; /* 0..ENG_MAX_TOP_LOGPROBS */
    int ignore_eos;
} eng_gen_params;

typedef struct eng_step {
    int32_t token;
    double logprob;
    int n_top;
    int32_t top_ids[ENG_MAX_TOP_LOGPROBS];
    double top_logprobs[ENG_MAX_TOP_LOGPROBS];
} eng_step;

/* Called once per generated token; return non-zero to stop early. */
typedef int (*eng_step_cb)(void *user, const eng_step *step);

/* Why generation ended. */
typedef enum eng_finish { ENG_FINISH_LENGTH = 0, ENG_FINISH_EOS, ENG_FINISH_CALLBACK } eng_finish;

int eng_generate(model *m, const int32_t *prompt, int n_prompt, const eng_gen_params *p, eng_step_cb cb,
                 void *user, eng_finish *finish, char *err, size_t errlen);

/* log_softmax of `logits` (n values) into `out` (double precision). */
void eng_log_softmax(const float *logits, int n, double *out);
/* Indices of the k largest values, descending, ties by ascending index. */
int eng_top_k(const double *vals, int n, int k, int32_t *ids);

#endif
