/*
 * engine/: prompt-lookup drafting for speculative decoding (see engine.h,
 * docs/speculative.md). The draft's verification is an ordinary step
 * (eng_item.draft) and its acceptance the sampler's (eng_sample_draft).
 */
#include "engine/spec.h"

int eng_spec_ngram(const int32_t *toks, int n, const eng_spec_params *p, int kmax, int32_t *out) {
    if (!p || p->draft_max <= 0 || kmax <= 0 || n < 2) return 0;
    if (kmax > p->draft_max) kmax = p->draft_max;
    for (int g = p->ngram_max; g >= p->ngram_min && g >= 1; g--) {
        if (g >= n) continue;
        const int32_t *tail = toks + n - g;
        /* latest first: the most recent context predicts best (an edit
         * copying code, a quote being continued) */
        for (int j = n - g - 1; j >= 0; j--) {
            int k = 0;
            while (k < g && toks[j + k] == tail[k]) k++;
            if (k < g) continue;
            int avail = n - (j + g), m = avail < kmax ? avail : kmax;
            for (int i = 0; i < m; i++) out[i] = toks[j + g + i];
            return m;
        }
    }
    return 0;
}

int eng_spec_next_k(int k, int n, int accepted, int draft_max) {
    if (n <= 0) return k;
    k = accepted == n ? 2 * k : accepted + 1;
    return k < 1 ? 1 : k > draft_max ? draft_max : k;
}
