/*
 * engine/: host-side sampling and logprob helpers (see engine.h).
 */
#include <math.h>
#include <stdlib.h>

#include "engine/engine.h"

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

int32_t eng_sample(const float *logits, int vocab, const eng_sampling *p, eng_rng *rng) {
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    if (!(p->temperature > 0) || p->top_k == 1) return best;
    int limited = p->top_k > 0 && p->top_k < vocab;
    cand *c = malloc((size_t)(limited ? p->top_k : vocab) * sizeof *c);
    if (!c) return best; /* out of memory: greedy is still a valid token */
    double mx = logits[best];
    int n;
    if (limited) {
        /* candidates already sorted; turn logits into unnormalised probabilities */
        n = top_k_logits(logits, vocab, p->top_k, c);
        for (int i = 0; i < n; i++) c[i].p = exp((c[i].p - mx) / p->temperature);
    } else {
        /* softmax(logits / T), shifted by the maximum so nothing overflows */
        n = vocab;
        for (int i = 0; i < vocab; i++) {
            c[i].id = i;
            c[i].p = exp(((double)logits[i] - mx) / p->temperature);
        }
        if (p->top_p > 0 && p->top_p < 1) qsort(c, (size_t)vocab, sizeof *c, cand_desc);
    }
    if (p->top_p > 0 && p->top_p < 1) {
        double tot = 0, acc = 0;
        for (int i = 0; i < n; i++) tot += c[i].p;
        /* smallest prefix whose mass reaches top_p (always >= 1 token) */
        int keep = 0;
        while (keep < n) {
            acc += c[keep++].p;
            if (acc >= p->top_p * tot) break;
        }
        n = keep;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += c[i].p;
    double u = rng_uniform(rng) * sum, acc = 0;
    int32_t pick = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) {
            pick = c[i].id;
            break;
        }
    }
    free(c);
    return pick;
}
