/*
 * engine/: host-side sampling and logprob helpers (see engine.h).
 */
#include <math.h>
#include <stdlib.h>

#include "engine/sample.h"

void eng_log_softmax(const float *logits, int n, double *out) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++) out[i] = (double)logits[i] - lse;
}

/* Partial selection: k is small next to the vocabulary, so insertion into a
 * sorted window of k beats sorting everything. */
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
static uint64_t rng_next(eng_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void eng_rng_seed(eng_rng *r, uint64_t seed) { r->s = seed; }

static double rng_uniform(eng_rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

typedef struct cand {
    double p;
    int32_t id;
} cand;

static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

/* The k largest logits, descending (ties: lower id first), by insertion
 * into a window of k: O(V) for the small k that sampling uses, where sorting
 * a 152k vocabulary per token would cost tens of milliseconds. */
static int top_k_logits(const float *logits, int vocab, int k, cand *c) {
    int have = 0;
    for (int i = 0; i < vocab; i++) {
        float v = logits[i];
        if (have == k && !(v > (float)c[k - 1].p)) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && v > (float)c[j - 1].p) {
            c[j] = c[j - 1];
            j--;
        }
        c[j].p = v;
        c[j].id = i;
    }
    return have;
}

/* The tail every sampling path shares (eng_sample on full rows,
 * eng_sample_cands on candidates): c[0..n) hold the logits of the tokens
 * still in play in .p, mx is the row maximum. `desc`: c is sorted by logit
 * descending, ties by id (a top-k window); else c is in ascending id order
 * (the whole row), and top_p sorts it first. Logits become unnormalised
 * probabilities exp((l - mx) / T); top_p keeps the smallest prefix whose
 * mass reaches top_p (always >= 1 token); one uniform draw picks by walking
 * the cumulative sum in c's order. With a draft token x >= 0 (the
 * speculative rule, eng_sample_draft): a first draw accepts x with its
 * probability; a rejection zeroes x and the usual draw picks among the
 * rest. */
static int32_t sample_from(cand *c, int n, int desc, double mx, const eng_sampling *p, eng_rng *rng, int32_t x) {
    for (int i = 0; i < n; i++) c[i].p = exp((c[i].p - mx) / p->temperature);
    if (p->top_p > 0 && p->top_p < 1) {
        if (!desc) qsort(c, (size_t)n, sizeof *c, cand_desc);
        double tot = 0, acc = 0;
        for (int i = 0; i < n; i++) tot += c[i].p;
        int keep = 0;
        while (keep < n) {
            acc += c[keep++].p;
            if (acc >= p->top_p * tot) break;
        }
        n = keep;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += c[i].p;
    if (x >= 0) {
        int at = -1;
        for (int i = 0; i < n && at < 0; i++)
            if (c[i].id == x) at = i;
        if (at >= 0) {
            if (rng_uniform(rng) * sum < c[at].p) return x;
            sum -= c[at].p;
            c[at].p = 0;
            if (!(sum > 0)) return x; /* x held all the mass (rounding): nothing else can be drawn */
        }
    }
    double u = rng_uniform(rng) * sum, acc = 0;
    int32_t pick = -1;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) {
            pick = c[i].id;
            break;
        }
    }
    /* u at the very top (rounding): the last token, or after a rejection
     * the last one still in play */
    if (pick < 0 && x < 0) pick = c[n - 1].id;
    for (int i = n - 1; pick < 0 && i >= 0; i--)
        if (c[i].id != x) pick = c[i].id;
    return pick;
}

static int32_t sample_row(const float *logits, int vocab, const eng_sampling *p, eng_rng *rng, int32_t x) {
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    if (!(p->temperature > 0) || p->top_k == 1) return best;
    int limited = p->top_k > 0 && p->top_k < vocab;
    cand *c = malloc((size_t)(limited ? p->top_k : vocab) * sizeof *c);
    if (!c) return best; /* out of memory: greedy is still a valid token */
    int n;
    if (limited) {
        n = top_k_logits(logits, vocab, p->top_k, c);
    } else {
        n = vocab;
        for (int i = 0; i < vocab; i++) {
            c[i].id = i;
            c[i].p = logits[i];
        }
    }
    int32_t pick = sample_from(c, n, limited, logits[best], p, rng, x);
    free(c);
    return pick;
}

int32_t eng_sample(const float *logits, int vocab, const eng_sampling *p, eng_rng *rng) {
    return sample_row(logits, vocab, p, rng, -1);
}

int32_t eng_sample_draft(const float *logits, int vocab, const eng_sampling *p, eng_rng *rng, int32_t x) {
    return sample_row(logits, vocab, p, rng, x);
}

int eng_cands_needed(const eng_sampling *p, int top_logprobs, int vocab) {
    if (vocab <= 0 || top_logprobs < 0 || top_logprobs > KERN_TOPK_MAX) return 0;
    if (vocab <= KERN_TOPK_MAX) return vocab; /* every id is a candidate */
    int need;
    if (!(p->temperature > 0) || p->top_k == 1)
        need = 1;
    else if (p->top_k >= 1 && p->top_k <= KERN_TOPK_MAX)
        need = p->top_k; /* top_k < vocab here: eng_sample's top-k window */
    else
        return 0; /* top_k off or beyond the candidates: the whole row is in play */
    return need > top_logprobs ? need : top_logprobs;
}

static int cand_id_asc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t sample_cands(const eng_cands *cd, int vocab, const eng_sampling *p, eng_rng *rng, int32_t x) {
    if (cd->k <= 0) return 0;
    /* ids[0] is the largest logit, lowest id on a tie: eng_sample's argmax */
    if (!(p->temperature > 0) || p->top_k == 1) return cd->ids[0];
    int limited = p->top_k > 0 && p->top_k < vocab;
    int n = limited && p->top_k < cd->k ? p->top_k : cd->k;
    cand c[KERN_TOPK_MAX];
    for (int i = 0; i < n; i++) {
        c[i].id = cd->ids[i];
        c[i].p = cd->vals[i];
    }
    /* Without a top-k window eng_sample walks the whole row in id order;
     * here the candidates are the whole row (eng_cands_needed), so put them
     * in that order for the same cumulative sums. */
    if (!limited) qsort(c, (size_t)n, sizeof *c, cand_id_asc);
    return sample_from(c, n, limited, cd->vals[0], p, rng, x);
}

int32_t eng_sample_cands(const eng_cands *cd, int vocab, const eng_sampling *p, eng_rng *rng) {
    return sample_cands(cd, vocab, p, rng, -1);
}

int32_t eng_sample_cands_draft(const eng_cands *cd, int vocab, const eng_sampling *p, eng_rng *rng, int32_t x) {
    return sample_cands(cd, vocab, p, rng, x);
}

double eng_cands_logprob(const eng_cands *c, int32_t id) {
    for (int i = 0; i < c->k; i++)
        if (c->ids[i] == id) return (double)c->vals[i] - c->lse;
    return NAN;
}
