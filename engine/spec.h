/*
 * engine/spec.h — speculative decoding's helpers (docs/speculative.md):
 * prompt-lookup drafts, the draft length's schedule, and the rejection
 * rule that keeps the output distribution unchanged. Verification itself
 * is a step (engine.h, ENG_LOGITS_VERIFY; engine/seq.h, eng_seq_truncate).
 */
#ifndef ECHO_ENGINE_SPEC_H
#define ECHO_ENGINE_SPEC_H

#include <stdint.h>

#include "engine/engine.h"
#include "engine/sample.h"

/* Prompt-lookup drafting: n-gram sizes ngram_min..ngram_max (largest
 * first), up to draft_max tokens per step; draft_max 0 = off. */
typedef struct eng_spec_params {
    int ngram_min, ngram_max, draft_max;
} eng_spec_params;
#define ENG_SPEC_NGRAM_MIN 2
#define ENG_SPEC_NGRAM_MAX 4
#define ENG_SPEC_DRAFT_MAX 8
#define ENG_SPEC_DRAFT_LIMIT 64 /* --spec-draft-max at most */
/* A draft for the sequence toks[0..n): for n-gram sizes g from ngram_max
 * down to ngram_min, the latest earlier occurrence of its last g tokens
 * (one ending before position n - 1) and up to kmax tokens that followed
 * it, into out. Returns the draft's length (0: no match). */
int eng_spec_ngram(const int32_t *toks, int n, const eng_spec_params *p, int kmax, int32_t *out);
/* The next draft's length at most after a draft of n tokens of which
 * `accepted` were taken, under a cap of k now (start: draft_max): doubled
 * after a draft taken whole, else what was accepted plus one, within
 * 1..draft_max. A rejected draft token costs a row of compute; on text that
 * does not repeat its context this keeps drafts at one token
 * (docs/speculative.md, "Cost"). */
int eng_spec_next_k(int k, int n, int accepted, int draft_max);
/* The speculative rejection rule for a deterministic draft token x on one
 * row: greedy (temperature 0 or top_k 1) returns the argmax (x accepted iff
 * it is the argmax; no draw); otherwise, with p the distribution eng_sample
 * draws from (temperature, top-k, top-p), x is accepted with probability
 * p(x) (one uniform draw), else the token is drawn from p with x removed,
 * renormalised (a second draw). The token returned is distributed as p
 * whatever x is, so speculation leaves the output distribution unchanged;
 * x was accepted iff the result equals x. */
int32_t eng_sample_draft(const float *logits, int vocab, const eng_sampling *p, eng_rng *rng, int32_t x);
/* The same over a row's candidates (as eng_sample_cands). */
int32_t eng_sample_cands_draft(const eng_cands *c, int vocab, const eng_sampling *p, eng_rng *rng, int32_t x);

#endif
