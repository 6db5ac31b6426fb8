/*
 * engine/sample.h — host-side sampling, reproducible per request seed, on
 * a full logits row (eng_step) or on a row's candidates (eng_step_cands),
 * and the logprob helpers.
 */
#ifndef ECHO_ENGINE_SAMPLE_H
#define ECHO_ENGINE_SAMPLE_H

#include <stdint.h>

#include "engine/engine.h"

typedef struct eng_sampling {
    float temperature; /* 0 = greedy (argmax; lowest id wins a tie) */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off; (0, 1] */
    uint64_t seed;
} eng_sampling;

/* Seeded generator state for one request. */
typedef struct eng_rng {
    uint64_t s;
} eng_rng;
void eng_rng_seed(eng_rng *r, uint64_t seed);

/* Pick a token from full-vocabulary logits. */
int32_t eng_sample(const float *logits, int vocab, const eng_sampling *p, eng_rng *rng);
/* Candidates per row that a request needs (for eng_step_cands), or 0 when
 * it needs the full row: greedy (temperature 0 or top_k 1) or
 * 1 <= top_k <= KERN_TOPK_MAX, and top_logprobs <= KERN_TOPK_MAX; a
 * vocabulary of at most KERN_TOPK_MAX always fits (every id is a
 * candidate). With that many candidates eng_sample_cands picks the token
 * eng_sample picks on the full row (same seed, same generator state) and
 * the top_logprobs are the first candidates. */
int eng_cands_needed(const eng_sampling *p, int top_logprobs, int vocab);
/* eng_sample over a row's candidates (vocab: the full vocabulary size).
 * Exact when c->k >= eng_cands_needed(p, 0, vocab); with fewer it samples
 * among the candidates only. Both paths share one routine. */
int32_t eng_sample_cands(const eng_cands *c, int vocab, const eng_sampling *p, eng_rng *rng);
/* Natural-log probability of `id` under the row's full distribution
 * (val - lse), or NAN when id is not a candidate. */
double eng_cands_logprob(const eng_cands *c, int32_t id);

/* log_softmax of `logits` (n values) into `out` (double precision). */
void eng_log_softmax(const float *logits, int n, double *out);
/* Indices of the k largest values, descending, ties by ascending index. */
int eng_top_k(const double *vals, int n, int k, int32_t *ids);

#endif
