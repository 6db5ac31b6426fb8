/*
 * engine/: speculative decoding (docs/speculative.md): prompt-lookup
 * drafts, the rejection rule's distribution, verification steps and the
 * rollback of rejected tokens (KV, blocks, prefix cache), and eng_generate
 * with drafts giving the tokens of plain decoding.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/report.h"
#include "engine/sample.h"
#include "engine/seq.h"
#include "engine/spec.h"
#include "tests/unit/testutil.h"

#define MODELS TU_FIXTURES "/models"

static eng *open_spec(const char *name, int tp, echo_preset mode, int prefix_off, char *err) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", MODELS, name);
    eng_config c = {.model_dir = dir, .tp = tp, .allreduce = mode, .threads = 2, .max_model_len = 160,
                    .max_num_seqs = 2, .kv_block_size = 4, .no_prefix_cache = prefix_off};
    eng *e = NULL;
    if (eng_create(&c, &e, err, 1024)) return NULL;
    return e;
}

/* Expected drafts worked out by hand from the rule: largest n-gram first,
 * its latest earlier occurrence, the tokens after it. */
START_TEST(test_ngram_drafts) {
    int32_t out[8];
    eng_spec_params p = {2, 4, 8};
    /* [4 6 7] occurs at 0 (followed by 1 5 6 7 2 ...); [6 7] last occurred at 5 (followed by 2 8 ...) */
    const int32_t a[] = {4, 6, 7, 1, 5, 6, 7, 2, 8, 4, 6, 7};
    int n = eng_spec_ngram(a, 12, &p, 8, out);
    ck_assert_int_eq(n, 8);
    const int32_t want3[] = {1, 5, 6, 7, 2, 8, 4, 6};
    ck_assert(!memcmp(out, want3, sizeof want3));
    eng_spec_params p2 = {2, 2, 8}; /* bigrams only: the latest [6 7] is at 5 */
    n = eng_spec_ngram(a, 12, &p2, 3, out);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(out[0], 2);
    ck_assert_int_eq(out[1], 8);
    ck_assert_int_eq(out[2], 4);
    /* draft_max caps kmax; the draft stops at the sequence's end */
    eng_spec_params p3 = {2, 4, 2};
    ck_assert_int_eq(eng_spec_ngram(a, 12, &p3, 8, out), 2);
    const int32_t b[] = {1, 2, 9, 1, 2};
    ck_assert_int_eq(eng_spec_ngram(b, 5, &p, 8, out), 3); /* [1 2] at 0: 9 1 2 */
    ck_assert_int_eq(out[0], 9);
    /* no earlier occurrence of any n-gram of 2..4: no draft */
    const int32_t c[] = {1, 2, 3, 4, 5, 6, 7, 1};
    ck_assert_int_eq(eng_spec_ngram(c, 8, &p, 8, out), 0);
    /* off, or no room */
    eng_spec_params off = {2, 4, 0};
    ck_assert_int_eq(eng_spec_ngram(a, 12, &off, 8, out), 0);
    ck_assert_int_eq(eng_spec_ngram(a, 12, &p, 0, out), 0);
    /* a run of one token: the trigram matches one position back, one token follows */
    const int32_t d[] = {5, 5, 5, 5};
    ck_assert_int_eq(eng_spec_ngram(d, 4, &p, 8, out), 1);
    ck_assert_int_eq(out[0], 5);
    /* the draft length policy: doubled after a draft taken whole, else accepted + 1, in 1..draft_max */
    ck_assert_int_eq(eng_spec_next_k(4, 4, 4, 8), 8);
    ck_assert_int_eq(eng_spec_next_k(8, 8, 8, 8), 8);
    ck_assert_int_eq(eng_spec_next_k(1, 1, 1, 8), 2);
    ck_assert_int_eq(eng_spec_next_k(8, 5, 2, 8), 3);
    ck_assert_int_eq(eng_spec_next_k(8, 3, 0, 8), 1);
    ck_assert_int_eq(eng_spec_next_k(3, 0, 0, 8), 3); /* no draft: unchanged */
}
END_TEST

/* The rejection rule leaves the distribution unchanged: with a draft token
 * x, eng_sample_draft's tokens follow p (temperature, top-k, top-p: the
 * support worked out here, as test_sampling_distributions does), x comes
 * back with probability p(x), and the candidates path agrees draw for
 * draw. Greedy returns the argmax and draws nothing. */
START_TEST(test_draft_rule_distribution) {
    enum { V = 8, N = 40000 };
    const float lg[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};
    struct {
        int top_k;
        float top_p;
        int32_t x;
    } cases[] = {{0, 1.0f, 0}, {0, 1.0f, 3}, {3, 1.0f, 1}, {3, 1.0f, 6}, {0, 0.7f, 2}, {5, 0.9f, 4}};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        eng_sampling p = {.temperature = 1.3f, .top_k = cases[ci].top_k, .top_p = cases[ci].top_p};
        double prob[V];
        for (int i = 0; i < V; i++) prob[i] = exp((lg[i] - lg[0]) / 1.3);
        int keep = p.top_k ? p.top_k : V;
        double kt = 0, acc = 0;
        for (int i = 0; i < keep; i++) kt += prob[i];
        int n = 0;
        while (n < keep) {
            acc += prob[n++];
            if (p.top_p < 1 && acc >= p.top_p * kt) break;
        }
        double z = 0;
        for (int i = 0; i < n; i++) z += prob[i];
        eng_cands cd = {.k = V, .lse = 0};
        for (int i = 0; i < V; i++) {
            cd.ids[i] = i;
            cd.vals[i] = lg[i];
        }
        int count[V] = {0};
        eng_rng r, rc;
        eng_rng_seed(&r, 77 + ci);
        eng_rng_seed(&rc, 77 + ci);
        for (int k = 0; k < N; k++) {
            int32_t t = eng_sample_draft(lg, V, &p, &r, cases[ci].x);
            ck_assert_int_eq(eng_sample_cands_draft(&cd, V, &p, &rc, cases[ci].x), t);
            count[t]++;
        }
        for (int i = 0; i < V; i++) {
            double expect = i < n ? prob[i] / z : 0;
            double f = (double)count[i] / N;
            double tol = 5 * sqrt(expect * (1 - expect) / N) + 1e-9;
            ck_assert_msg(fabs(f - expect) <= tol, "case %zu (x %d) token %d: freq %.4f expected %.4f", ci,
                          cases[ci].x, i, f, expect);
        }
    }
    eng_sampling g = {.temperature = 0, .top_p = 1};
    eng_rng r;
    eng_rng_seed(&r, 5);
    uint64_t before = r.s;
    ck_assert_int_eq(eng_sample_draft(lg, V, &g, &r, 3), 0);
    ck_assert_int_eq(eng_sample_draft(lg, V, &g, &r, 0), 0);
    ck_assert(r.s == before);
}
END_TEST

/* Greedy tokens and logits rows of plain decoding: prefill p[0..n), then
 * `dec` one-token steps. rows: (1 + dec, V). */
static void plain_run(eng *e, const int32_t *p, int n, int dec, int32_t *toks, float *rows) {
    const int V = eng_model_config(e)->vocab_size;
    char err[1024];
    int seq;
    ck_assert(eng_seq_new(e, &seq, err, sizeof err) == 0);
    eng_item it = {seq, p, n, ENG_LOGITS_LAST};
    ck_assert_msg(eng_step(e, &it, 1, rows, err, sizeof err) == 0, "%s", err);
    eng_sampling g = {.temperature = 0, .top_p = 1};
    for (int t = 0; t < dec; t++) {
        toks[t] = eng_sample(rows + (size_t)t * V, V, &g, NULL);
        it = (eng_item){seq, &toks[t], 1, ENG_LOGITS_LAST};
        ck_assert_msg(eng_step(e, &it, 1, rows + (size_t)(t + 1) * V, err, sizeof err) == 0, "%s", err);
    }
    toks[dec] = eng_sample(rows + (size_t)dec * V, V, &g, NULL);
    eng_seq_free(e, seq);
}

/* Verification steps with drafts that are partly right and partly wrong,
 * accepted greedily and the rest truncated: every produced token's row
 * equals plain decoding's bit for bit (rows do not depend on the batch
 * with exact on threads), so nothing of a rejected token stays in the
 * KV; the blocks held follow the length; with the prefix cache only the
 * prompt's full blocks are registered, and a prompt that continues with a
 * rejected draft maps no more than them. */
START_TEST(test_verify_rollback) {
    static const struct {
        const char *model;
        int tp;
    } cfgs[] = {{"gqa4-deep", 1}, {"llama-tp3", 3}, {"gguf-qwen3/model.gguf", 2}};
    enum { NP = 13, DEC = 24 };
    char err[1024];
    for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++) {
        eng *e = open_spec(cfgs[ci].model, cfgs[ci].tp, ECHO_PRESET_EXACT, 0, err);
        ck_assert_msg(e != NULL, "%s: %s", cfgs[ci].model, err);
        const int V = eng_model_config(e)->vocab_size, bs = 4;
        int32_t p[NP], ref[DEC + 1];
        for (int i = 0; i < NP; i++) p[i] = (int32_t)((i * 7 + 3) % V);
        float *rows = malloc((size_t)(DEC + 1) * V * sizeof *rows);
        float *vr = malloc((size_t)9 * V * sizeof *vr);
        plain_run(e, p, NP, DEC, ref, rows);
        eng_kv_usage u0;
        eng_kv_get_usage(e, &u0);
        int seq, reused;
        ck_assert(eng_seq_new_prefix(e, p, NP, -1, &seq, &reused, err, sizeof err) == 0);
        eng_item it = {seq, p + reused, NP - reused, ENG_LOGITS_LAST};
        ck_assert_msg(eng_step(e, &it, 1, vr, err, sizeof err) == 0, "%s", err);
        ck_assert(!memcmp(vr, rows, (size_t)V * sizeof *vr));
        eng_sampling g = {.temperature = 0, .top_p = 1};
        int32_t feed[9], made = 1; /* ref[0] is produced by the prefill */
        int32_t last = ref[0];
        /* drafts: `good` right tokens then `bad` wrong ones */
        const int plan[][2] = {{3, 2}, {0, 4}, {5, 0}, {1, 7}, {2, 1}, {0, 1}, {4, 3}};
        for (size_t k = 0; k < sizeof plan / sizeof *plan && made + 9 <= DEC; k++) {
            int good = plan[k][0], bad = plan[k][1], nd = good + bad;
            feed[0] = last;
            for (int j = 0; j < good; j++) feed[1 + j] = ref[made + j];
            for (int j = 0; j < bad; j++) feed[1 + good + j] = (ref[made + good + j] + 1 + j) % V;
            int len0 = eng_seq_len(e, seq);
            it = (eng_item){seq, feed, 1 + nd, nd ? ENG_LOGITS_VERIFY : ENG_LOGITS_LAST};
            ck_assert_msg(eng_step(e, &it, 1, vr, err, sizeof err) == 0, "%s", err);
            ck_assert_int_eq(eng_seq_len(e, seq), len0 + 1 + nd);
            int acc = 0;
            for (int j = 0; j <= nd; j++) {
                int32_t x = j < nd ? feed[1 + j] : -1;
                int32_t t = x >= 0 ? eng_sample_draft(vr + (size_t)j * V, V, &g, NULL, x)
                                   : eng_sample(vr + (size_t)j * V, V, &g, NULL);
                ck_assert_msg(!memcmp(vr + (size_t)j * V, rows + (size_t)(made + j) * V, (size_t)V * sizeof *vr),
                              "%s tp %d: verify row %d of step %zu differs from plain decoding", cfgs[ci].model,
                              cfgs[ci].tp, j, k);
                ck_assert_int_eq(t, ref[made + j]);
                last = t;
                if (x < 0 || t != x) break;
                acc++;
            }
            ck_assert_int_eq(acc, good);
            made += acc + 1;
            ck_assert_int_eq(eng_seq_truncate(e, seq, len0 + 1 + acc), 0);
            ck_assert_int_eq(eng_seq_len(e, seq), len0 + 1 + acc);
            ck_assert_int_eq(eng_seq_blocks(e, seq), (len0 + 1 + acc + bs - 1) / bs);
        }
        ck_assert_int_ge(made, 15);
        /* errors: past the length, or into the registered prompt blocks */
        int len = eng_seq_len(e, seq);
        ck_assert_int_eq(eng_seq_truncate(e, seq, len + 1), -1);
        ck_assert_int_eq(eng_seq_truncate(e, seq, NP / bs * bs - 1), -1);
        ck_assert_int_eq(eng_seq_len(e, seq), len);
        /* the prefix cache holds the prompt's full blocks, nothing decoded or drafted */
        eng_kv_usage u;
        eng_kv_get_usage(e, &u);
        ck_assert_int_eq(u.cached_blocks, NP / bs);
        int32_t cont[NP + 12];
        memcpy(cont, p, sizeof p);
        for (int j = 0; j < 12; j++) cont[NP + j] = ref[j];
        ck_assert_int_eq(eng_prefix_peek(e, cont, NP + 12, -1, NULL), NP / bs * bs);
        eng_seq_free(e, seq);
        eng_kv_get_usage(e, &u);
        ck_assert_int_eq(u.free_blocks, u.total_blocks);
        free(rows);
        free(vr);
        eng_destroy(e);
    }
}
END_TEST

typedef struct gen_rec {
    int32_t toks[256];
    double lp[256];
    int n;
} gen_rec;

static int rec_cb(void *user, const eng_step_out *st) {
    gen_rec *g = user;
    if (g->n < 256) {
        g->lp[g->n] = st->logprob;
        g->toks[g->n++] = st->token;
    }
    return 0;
}

static void gen(eng *e, const int32_t *p, int n, eng_gen_params *gp, gen_rec *out, eng_finish *fin) {
    char err[1024];
    memset(out, 0, sizeof *out);
    ck_assert_msg(eng_generate(e, p, n, gp, rec_cb, out, fin, err, sizeof err) == 0, "%s", err);
}

/* eng_generate with drafts: the greedy tokens (and their logprobs, bit for
 * bit with exact on threads) of plain decoding, on prompts that repeat
 * themselves (drafts are made and some accepted) at tp 1, 2 and 3; max_tokens
 * reached inside a draft gives exactly max_tokens tokens, the plain run's
 * prefix; a stop id inside a draft ends where the plain run ends; seeded
 * sampling gives the same tokens twice. */
START_TEST(test_generate_spec_equal) {
    static const struct {
        const char *model;
        int tp;
    } cfgs[] = {{"gqa4-deep", 1}, {"qwen2-bias", 2}, {"llama-tp3", 3}, {"gguf-llama/model.gguf", 1}, {"realvocab", 1}};
    char err[1024];
    for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++) {
        eng *e = open_spec(cfgs[ci].model, cfgs[ci].tp, ECHO_PRESET_EXACT, 0, err);
        ck_assert_msg(e != NULL, "%s: %s", cfgs[ci].model, err);
        const int V = eng_model_config(e)->vocab_size;
        long long accepted = 0;
        for (int pi = 0; pi < 4; pi++) {
            /* a phrase of 9 ids repeated three times, then its start */
            int32_t p[40];
            int n = 0;
            for (int r = 0; r < 3; r++)
                for (int i = 0; i < 9; i++) p[n++] = (int32_t)((i * 13 + pi * 5 + 1) % V);
            for (int i = 0; i < 3; i++) p[n++] = p[i];
            eng_gen_params plain = {.max_tokens = 48, .sampling = {.temperature = 0, .top_p = 1}, .ignore_eos = 1};
            eng_gen_params sp = plain;
            long long st[3] = {0, 0, 0};
            sp.spec = (eng_spec_params){2, 4, 8};
            sp.spec_stats = st;
            gen_rec a, b;
            eng_finish fa, fb;
            gen(e, p, n, &plain, &a, &fa);
            gen(e, p, n, &sp, &b, &fb);
            ck_assert_int_eq(a.n, 48);
            ck_assert_int_eq(b.n, 48);
            ck_assert_msg(!memcmp(a.toks, b.toks, sizeof a.toks), "%s tp %d prompt %d: tokens differ",
                          cfgs[ci].model, cfgs[ci].tp, pi);
            ck_assert_msg(!memcmp(a.lp, b.lp, sizeof a.lp), "%s tp %d prompt %d: logprobs differ", cfgs[ci].model,
                          cfgs[ci].tp, pi);
            ck_assert_int_eq(fa, fb);
            accepted += st[2];
            ck_assert_int_ge(st[1], st[2]);
            /* max_tokens inside a draft */
            for (int m = 1; m <= 12; m++) {
                sp.max_tokens = m;
                gen(e, p, n, &sp, &b, &fb);
                ck_assert_int_eq(b.n, m);
                ck_assert(!memcmp(a.toks, b.toks, (size_t)m * sizeof *b.toks));
            }
            /* a stop id met inside a draft: the one at position 9 (and wherever it comes first) */
            int32_t stop = a.toks[9];
            int first = 0;
            while (a.toks[first] != stop) first++;
            sp.max_tokens = 48;
            sp.stop_ids = &stop;
            sp.n_stop_ids = 1;
            gen(e, p, n, &sp, &b, &fb);
            ck_assert_int_eq(fb, ENG_FINISH_STOP);
            ck_assert_int_eq(b.n, first + 1);
            ck_assert(!memcmp(a.toks, b.toks, (size_t)(first + 1) * sizeof *b.toks));
            sp.stop_ids = NULL;
            sp.n_stop_ids = 0;
            /* seeded sampling with drafts: reproducible */
            sp.sampling = (eng_sampling){.temperature = 0.8f, .top_p = 0.95f, .seed = 42 + (uint64_t)pi};
            gen_rec s1, s2;
            gen(e, p, n, &sp, &s1, &fb);
            gen(e, p, n, &sp, &s2, &fb);
            ck_assert(s1.n == s2.n && !memcmp(s1.toks, s2.toks, sizeof s1.toks));
        }
        ck_assert_msg(accepted > 0, "%s: no draft token was ever accepted: the test tests nothing", cfgs[ci].model);
        eng_destroy(e);
    }
}
END_TEST

static unsigned long long comm_calls(const eng *e) {
    echo_stats st;
    eng_comm_stats(e, &st);
    unsigned long long n = 0;
    for (int k = 0; k < ECHO_PRESET_COUNT; k++) n += st.calls[k];
    return n;
}

/* Under a layout-dependent all-reduce (passes cut at multiples of C = 8) a
 * verified draft runs whole in the decode pass: a 5-token VERIFY item
 * across position 8 costs the all-reduce calls of one pass, where the same
 * tokens as a prompt chunk (ALL) are cut into two; with another sequence's
 * decode in the step it is still one pass. Every preset runs drafts with
 * eng_generate. */
START_TEST(test_verify_one_pass) {
    const echo_preset modes[] = {ECHO_PRESET_ECHO, ECHO_PRESET_INT4, ECHO_PRESET_BF16, ECHO_PRESET_NOFB};
    char err[1024];
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/gqa4-deep", MODELS);
        eng_config c = {.model_dir = dir, .tp = 2, .allreduce = modes[mi], .threads = 2, .max_model_len = 128,
                        .max_num_seqs = 4, .kv_block_size = 4, .max_batch_tokens = 32, .pass_tokens = 8};
        eng *e = NULL;
        ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(eng_pass_tokens(e), 8);
        const int V = eng_model_config(e)->vocab_size;
        int32_t p[11];
        for (int i = 0; i < 11; i++) p[i] = (int32_t)((i * 5 + 2) % V);
        float *rows = malloc((size_t)8 * V * sizeof *rows);
        int a, b;
        ck_assert(eng_seq_new(e, &a, err, sizeof err) == 0);
        ck_assert(eng_seq_new(e, &b, err, sizeof err) == 0);
        eng_item it[2] = {{a, p, 6, ENG_LOGITS_LAST}, {b, p, 6, ENG_LOGITS_LAST}};
        ck_assert_msg(eng_step(e, it, 2, rows, err, sizeof err) == 0, "%s", err);
        unsigned long long c0 = comm_calls(e);
        it[0] = (eng_item){a, p + 6, 5, ENG_LOGITS_ALL}; /* positions 6..10: two prompt passes */
        ck_assert_msg(eng_step(e, it, 1, rows, err, sizeof err) == 0, "%s", err);
        unsigned long long c1 = comm_calls(e), per_pass = (c1 - c0) / 2;
        ck_assert_int_eq(c1 - c0, 2 * per_pass);
        ck_assert_int_gt(per_pass, 0);
        it[0] = (eng_item){b, p + 6, 5, ENG_LOGITS_VERIFY};
        ck_assert_msg(eng_step(e, it, 1, rows, err, sizeof err) == 0, "%s", err);
        unsigned long long c2 = comm_calls(e);
        ck_assert_msg(c2 - c1 == per_pass, "preset %zu: a verify item took %llu calls, one pass is %llu", mi,
                      c2 - c1, per_pass);
        /* a decode and a verified draft together: still one pass */
        ck_assert_int_eq(eng_seq_truncate(e, b, 7), 0);
        int32_t one = p[7];
        it[0] = (eng_item){a, &one, 1, ENG_LOGITS_LAST};
        it[1] = (eng_item){b, p + 7, 4, ENG_LOGITS_VERIFY};
        ck_assert_msg(eng_step(e, it, 2, rows, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(comm_calls(e) - c2, per_pass);
        eng_seq_free(e, a);
        eng_seq_free(e, b);
        /* eng_generate with drafts under this preset: runs to max_tokens */
        int32_t q[30];
        for (int i = 0; i < 30; i++) q[i] = p[i % 10];
        eng_gen_params gp = {.max_tokens = 24, .sampling = {.temperature = 0, .top_p = 1}, .ignore_eos = 1,
                             .spec = {2, 4, 8}};
        gen_rec g;
        eng_finish fin;
        gen(e, q, 30, &gp, &g, &fin);
        ck_assert_int_eq(g.n, 24);
        free(rows);
        eng_destroy(e);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("spec");
    TCase *t = tcase_create("spec");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, test_ngram_drafts);
    tcase_add_test(t, test_draft_rule_distribution);
    tcase_add_test(t, test_verify_rollback);
    tcase_add_test(t, test_generate_spec_equal);
    tcase_add_test(t, test_verify_one_pass);
    suite_add_tcase(s, t);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
