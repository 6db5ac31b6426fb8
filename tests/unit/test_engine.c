/*
 * engine/: tensor parallelism (exact all-reduce reproduces one rank),
 * batched steps, the paged KV cache and sampling.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/budget.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/overlap.h"
#include "engine/report.h"
#include "engine/sample.h"
#include "engine/seq.h"
#include "kernels/kv.h"
#include "tests/unit/testutil.h"

#define MODELS TU_FIXTURES "/models"

static const char *ALL_MODELS[] = {"tied",      "untied-sharded", "wide-head",
                                   "gqa4-deep", "realvocab",      "llama-gqa",
                                   "llama-tp3", "gguf-llama/model.gguf", "gguf-qwen3/model.gguf",
                                   "qwen2-bias", "llama3-rope", "qwen3-yarn", "llama-yarn"};

static eng *open_eng(const char *name, int tp, echo_preset mode, int max_seqs, int kv_blocks, char *err) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", MODELS, name);
    eng_config c = {.model_dir = dir, .tp = tp, .allreduce = mode, .threads = 2, .max_model_len = 128,
                    .max_num_seqs = max_seqs, .kv_blocks = kv_blocks, .kv_block_size = 4};
    eng *e = NULL;
    if (eng_create(&c, &e, err, 1024)) return NULL;
    return e;
}

/* Deterministic pseudo-random prompt of n ids below vocab. */
static void make_prompt(int32_t *ids, int n, int vocab, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        ids[i] = (int32_t)((seed >> 8) % (unsigned)vocab);
    }
}

/* Prefill `n` tokens then decode 6 greedy tokens; returns all LAST logits
 * rows (7, vocab) and the greedy tokens. */
static float *run_alone(eng *e, const int32_t *prompt, int n, int32_t *greedy) {
    const int V = eng_model_config(e)->vocab_size;
    char err[1024];
    int seq;
    float *out = malloc((size_t)7 * V * sizeof *out);
    ck_assert(eng_seq_new(e, &seq, err, sizeof err) == 0);
    eng_item it = {seq, prompt, n, ENG_LOGITS_LAST};
    ck_assert_msg(eng_step(e, &it, 1, out, err, sizeof err) == 0, "%s", err);
    eng_sampling greedy_p = {.temperature = 0, .top_p = 1};
    for (int t = 0; t < 6; t++) {
        greedy[t] = eng_sample(out + (size_t)t * V, V, &greedy_p, NULL);
        it = (eng_item){seq, &greedy[t], 1, ENG_LOGITS_LAST};
        ck_assert_msg(eng_step(e, &it, 1, out + (size_t)(t + 1) * V, err, sizeof err) == 0, "%s", err);
    }
    eng_seq_free(e, seq);
    return out;
}

START_TEST(test_tp_exact_reproduces_tp1) {
    char err[1024];
    for (size_t mi = 0; mi < sizeof ALL_MODELS / sizeof *ALL_MODELS; mi++) {
        eng *e1 = open_eng(ALL_MODELS[mi], 1, ECHO_PRESET_EXACT, 2, 0, err);
        ck_assert_msg(e1 != NULL, "%s", err);
        const model_config *c = eng_model_config(e1);
        int32_t prompt[23], g1[6], gt[6];
        make_prompt(prompt, 23, c->vocab_size, 7u + (unsigned)mi);
        float *ref = run_alone(e1, prompt, 23, g1);
        for (int tp = 2; tp <= 4; tp++) {
            if (model_check_tp(c, tp, err, sizeof err)) {
                /* realvocab has 2 heads: tp 3 and 4 must be refused with a reason */
                eng *bad = open_eng(ALL_MODELS[mi], tp, ECHO_PRESET_EXACT, 2, 0, err);
                ck_assert(bad == NULL);
                ck_assert_msg(strstr(err, "--tp") != NULL, "%s", err);
                continue;
            }
            eng *et = open_eng(ALL_MODELS[mi], tp, ECHO_PRESET_EXACT, 2, 0, err);
            ck_assert_msg(et != NULL, "%s tp %d: %s", ALL_MODELS[mi], tp, err);
            float *got = run_alone(et, prompt, 23, gt);
            double e = tu_rel_err(got, ref, (size_t)7 * c->vocab_size);
            ck_assert_msg(e <= 1e-5, "%s tp %d: relative logits error %.3g > 1e-5", ALL_MODELS[mi], tp, e);
            for (int t = 0; t < 6; t++) ck_assert_int_eq(gt[t], g1[t]);
            echo_stats st;
            eng_comm_stats(et, &st);
            /* 7 passes x 2 sites per layer x tp ranks, all through the exact path */
            ck_assert_uint_eq(st.calls[ECHO_PRESET_EXACT], (uint64_t)7 * 2 * c->num_layers * tp);
            free(got);
            eng_destroy(et);
        }
        free(ref);
        eng_destroy(e1);
    }
}
END_TEST

/* int4 and echo at tp 2 change the logits (they really quantize), stay
 * finite, and echo's error feedback leaves the logits closer to exact than
 * int4 does. (Tight statements about one all-reduce live in test_comm.) */
/* All-position logits of one prefill (teacher-forced: every mode sees the
 * same tokens). */
static float *prefill_all(eng *e, const int32_t *prompt, int n) {
    const int V = eng_model_config(e)->vocab_size;
    char err[1024];
    int seq;
    float *out = malloc((size_t)n * V * sizeof *out);
    ck_assert(eng_seq_new(e, &seq, err, sizeof err) == 0);
    eng_item it = {seq, prompt, n, ENG_LOGITS_ALL};
    ck_assert_msg(eng_step(e, &it, 1, out, err, sizeof err) == 0, "%s", err);
    eng_seq_free(e, seq);
    return out;
}

START_TEST(test_tp_quantized_modes_run) {
    enum { N = 48, V = 512 };
    char err[1024];
    eng *ex = open_eng("gqa4-deep", 1, ECHO_PRESET_EXACT, 1, 0, err);
    ck_assert_msg(ex != NULL, "%s", err);
    int32_t prompt[N];
    make_prompt(prompt, N, V, 99);
    float *ref = prefill_all(ex, prompt, N);
    const echo_preset modes[] = {ECHO_PRESET_NOFB, ECHO_PRESET_ECHO};
    double er[2];
    for (int k = 0; k < 2; k++) {
        eng *e = open_eng("gqa4-deep", 2, modes[k], 1, 0, err);
        ck_assert_msg(e != NULL, "%s", err);
        float *got = prefill_all(e, prompt, N);
        er[k] = tu_rel_err(got, ref, (size_t)N * V);
        for (size_t i = 0; i < (size_t)N * V; i++) ck_assert(isfinite(got[i]));
        ck_assert_msg(er[k] > 0, "%s changed nothing", echo_preset_name(modes[k]));
        echo_stats st;
        eng_comm_stats(e, &st);
        /* one pass, 2 sites x 12 layers, 2 ranks; echo sends the last layer's
         * 2 sites in bf16 (its tail policy) */
        int tail = modes[k] == ECHO_PRESET_ECHO ? ECHO_TAIL_SITES : 0;
        ck_assert_uint_eq(st.calls[modes[k]], (uint64_t)(2 * 12 - tail) * 2);
        ck_assert_uint_eq(st.calls[ECHO_PRESET_BF16], (uint64_t)tail * 2);
        free(got);
        eng_destroy(e);
    }
    ck_assert_msg(er[1] < er[0], "echo logits error %.3g not below int4's %.3g", er[1], er[0]);
    free(ref);
    eng_destroy(ex);
}
END_TEST

/* A batch mixing prompts of different lengths with decode steps of other
 * sequences gives every sequence the logits it gets alone. */
START_TEST(test_batch_equals_alone) {
    char err[1024];
    eng *e = open_eng("gqa4-deep", 2, ECHO_PRESET_EXACT, 4, 0, err);
    ck_assert_msg(e != NULL, "%s", err);
    const int V = eng_model_config(e)->vocab_size;
    int lens[4] = {9, 1, 30, 14};
    int32_t prompts[4][32], greedy[4][6];
    float *alone[4];
    for (int s = 0; s < 4; s++) {
        make_prompt(prompts[s], lens[s], V, 100u + (unsigned)s);
        alone[s] = run_alone(e, prompts[s], lens[s], greedy[s]);
    }
    /* staggered: seq s starts prefill at step s, then decodes its greedy tokens */
    int seq[4], step_of[4] = {0, 0, 0, 0};
    for (int s = 0; s < 4; s++) ck_assert(eng_seq_new(e, &seq[s], err, sizeof err) == 0);
    float *out = malloc((size_t)4 * V * sizeof *out);
    for (int round = 0; round < 10; round++) {
        eng_item it[4];
        int idx[4], n = 0;
        for (int s = 0; s < 4; s++) {
            if (round < s || step_of[s] > 6) continue;
            if (step_of[s] == 0)
                it[n] = (eng_item){seq[s], prompts[s], lens[s], ENG_LOGITS_LAST};
            else
                it[n] = (eng_item){seq[s], &greedy[s][step_of[s] - 1], 1, ENG_LOGITS_LAST};
            idx[n++] = s;
        }
        if (!n) continue;
        ck_assert_msg(eng_step(e, it, n, out, err, sizeof err) == 0, "%s", err);
        for (int k = 0; k < n; k++) {
            int s = idx[k];
            double er = tu_rel_err(out + (size_t)k * V, alone[s] + (size_t)step_of[s] * V, (size_t)V);
            ck_assert_msg(er <= 1e-5, "seq %d step %d: batched vs alone %.3g", s, step_of[s], er);
            step_of[s]++;
        }
    }
    for (int s = 0; s < 4; s++) {
        ck_assert_int_eq(step_of[s], 7);
        eng_seq_free(e, seq[s]);
        free(alone[s]);
    }
    free(out);
    eng_destroy(e);
}
END_TEST

/* Passes under a layout-dependent all-reduce (engine.h, "Passes"), C = 8:
 * a prompt's logits (every row, and the candidates) are the same bits
 * whether it is stepped whole, in eng_prompt_chunk's chunks, or beside
 * other prompts and decodes in one step, for echo, int4 and bf16; and a bad
 * step changes nothing. */
static eng *open_pass(echo_preset mode, char *err) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/gqa4-deep", MODELS);
    eng_config c = {.model_dir = dir, .tp = 2, .allreduce = mode, .threads = 2, .max_model_len = 128,
                    .max_num_seqs = 4, .kv_block_size = 4, .max_batch_tokens = 32, .pass_tokens = 8};
    eng *e = NULL;
    return eng_create(&c, &e, err, 1024) ? NULL : e;
}

START_TEST(test_passes_fixed_by_position) {
    const echo_preset modes[] = {ECHO_PRESET_ECHO, ECHO_PRESET_NOFB, ECHO_PRESET_BF16};
    char err[1024];
    for (int m = 0; m < 3; m++) {
        eng *e = open_pass(modes[m], err);
        ck_assert_msg(e != NULL, "%s", err);
        ck_assert_int_eq(eng_pass_tokens(e), 8);
        const int V = eng_model_config(e)->vocab_size, n = 21;
        int32_t pa[21], pb[13], dec = 5;
        make_prompt(pa, n, V, 7u);
        make_prompt(pb, 13, V, 8u);
        float *whole = malloc((size_t)n * V * sizeof(float)), *got = malloc((size_t)(n + 14) * V * sizeof(float));
        int sa, sb, sc;
        /* reference: prompt A whole, alone */
        ck_assert(eng_seq_new(e, &sa, err, sizeof err) == 0);
        eng_item it = {sa, pa, n, ENG_LOGITS_ALL};
        ck_assert_msg(eng_step(e, &it, 1, whole, err, sizeof err) == 0, "%s", err);
        eng_seq_free(e, sa);
        /* A in eng_prompt_chunk's chunks with a budget of 11 */
        ck_assert(eng_seq_new(e, &sa, err, sizeof err) == 0);
        for (int done = 0; done < n;) {
            int c = eng_prompt_chunk(e, done, n - done, 11);
            ck_assert_int_gt(c, 0);
            ck_assert(done + c == n || (done + c) % 8 == 0);
            it = (eng_item){sa, pa + done, c, ENG_LOGITS_ALL};
            ck_assert_msg(eng_step(e, &it, 1, got + (size_t)done * V, err, sizeof err) == 0, "%s", err);
            done += c;
        }
        ck_assert_msg(!memcmp(got, whole, (size_t)n * V * sizeof(float)), "mode %d: chunked differs", m);
        eng_seq_free(e, sa);
        /* A beside B's prompt and C's decode, all in one step: 21 + 13 + 1 tokens > max_batch_tokens */
        ck_assert(eng_seq_new(e, &sc, err, sizeof err) == 0);
        it = (eng_item){sc, pb, 3, ENG_LOGITS_NONE};
        ck_assert_msg(eng_step(e, &it, 1, NULL, err, sizeof err) == 0, "%s", err);
        ck_assert(eng_seq_new(e, &sb, err, sizeof err) == 0);
        ck_assert(eng_seq_new(e, &sa, err, sizeof err) == 0);
        eng_item three[3] = {{sb, pb, 13, ENG_LOGITS_LAST}, {sa, pa, n, ENG_LOGITS_ALL}, {sc, &dec, 1, ENG_LOGITS_LAST}};
        ck_assert_msg(eng_step(e, three, 3, got, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(!memcmp(got + (size_t)V, whole, (size_t)n * V * sizeof(float)), "mode %d: batched differs", m);
        ck_assert_int_eq(eng_seq_len(e, sa), n);
        ck_assert_int_eq(eng_seq_len(e, sc), 4);
        /* candidates of the same rows: the same top values */
        eng_seq_free(e, sa);
        eng_seq_free(e, sb);
        ck_assert(eng_seq_new(e, &sa, err, sizeof err) == 0);
        ck_assert(eng_seq_new(e, &sb, err, sizeof err) == 0);
        eng_cands *cd = malloc((size_t)(n + 2) * sizeof *cd);
        three[0] = (eng_item){sb, pb, 13, ENG_LOGITS_LAST};
        three[1] = (eng_item){sa, pa, n, ENG_LOGITS_ALL};
        three[2] = (eng_item){sc, &dec, 1, ENG_LOGITS_LAST};
        ck_assert_msg(eng_step_cands(e, three, 3, 4, cd, NULL, NULL, err, sizeof err) == 0, "%s", err);
        for (int t = 0; t < n; t++) {
            const float *row = whole + (size_t)t * V;
            float mx = row[0];
            for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
            ck_assert_msg(cd[1 + t].vals[0] == mx, "mode %d row %d: candidates differ", m, t);
        }
        free(cd);
        /* a bad id in the last item: the whole step is refused before its
         * first pass, nothing changes */
        eng_seq_free(e, sa);
        eng_seq_free(e, sb);
        ck_assert(eng_seq_new(e, &sa, err, sizeof err) == 0);
        ck_assert(eng_seq_new(e, &sb, err, sizeof err) == 0);
        eng_kv_usage u0, u1;
        eng_kv_get_usage(e, &u0);
        int32_t badb[13];
        memcpy(badb, pb, sizeof badb);
        eng_item two[2] = {{sa, pa, n, ENG_LOGITS_NONE}, {sb, badb, 13, ENG_LOGITS_NONE}};
        badb[12] = V; /* out of range: step_check refuses the whole step first */
        ck_assert(eng_step(e, two, 2, NULL, err, sizeof err) != 0);
        eng_kv_get_usage(e, &u1);
        ck_assert_int_eq(u1.free_blocks, u0.free_blocks);
        ck_assert_int_eq(eng_seq_len(e, sa), 0);
        ck_assert_int_eq(eng_seq_len(e, sb), 0);
        eng_seq_free(e, sa);
        eng_seq_free(e, sb);
        eng_seq_free(e, sc);
        free(whole);
        free(got);
        eng_destroy(e);
    }
}
END_TEST

/* Prefill overlap (engine/overlap.h): a step run as pipelined micro-batches
 * gives the serial step's logits bits for exact and bf16 (every row of two
 * prompts cut mid-sequence, beside a decode item, then greedy decodes), at
 * tp 2, 3 and 4 with 2 and 3 micro-batches; the extra micro-batches' calls
 * are counted (the overlap ran); echo stays as close to exact as without
 * overlap. */
static eng *open_overlap(const char *name, int tp, echo_preset mode, int overlap, char *err) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", MODELS, name);
    eng_config c = {.model_dir = dir, .tp = tp, .allreduce = mode, .threads = tp, .max_model_len = 128,
                    .max_num_seqs = 4, .kv_block_size = 4, .max_batch_tokens = 64, .pass_tokens = 64,
                    .overlap = overlap, .overlap_min_rows = 4};
    eng *e = NULL;
    return eng_create(&c, &e, err, 1024) ? NULL : e;
}

/* Prompts A (21 tokens, all rows) and B (13, last row) and C's decode in
 * one step, then 3 greedy decodes of A; logits (21 + 2 + 3 rows) in out. */
static void overlap_run(eng *e, float *out) {
    const int V = eng_model_config(e)->vocab_size;
    char err[1024];
    int32_t pa[21], pb[13], dec = 5;
    make_prompt(pa, 21, V, 11u);
    make_prompt(pb, 13, V, 12u);
    int sa, sb, sc;
    ck_assert(eng_seq_new(e, &sc, err, sizeof err) == 0);
    eng_item it = {sc, pb, 3, ENG_LOGITS_NONE};
    ck_assert_msg(eng_step(e, &it, 1, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert(eng_seq_new(e, &sa, err, sizeof err) == 0);
    ck_assert(eng_seq_new(e, &sb, err, sizeof err) == 0);
    eng_item three[3] = {{sa, pa, 21, ENG_LOGITS_ALL}, {sc, &dec, 1, ENG_LOGITS_LAST}, {sb, pb, 13, ENG_LOGITS_LAST}};
    ck_assert_msg(eng_step(e, three, 3, out, err, sizeof err) == 0, "%s", err);
    eng_sampling greedy = {.temperature = 0, .top_p = 1};
    int32_t tok = eng_sample(out + (size_t)20 * V, V, &greedy, NULL);
    for (int t = 0; t < 3; t++) {
        it = (eng_item){sa, &tok, 1, ENG_LOGITS_LAST};
        float *row = out + (size_t)(23 + t) * V;
        ck_assert_msg(eng_step(e, &it, 1, row, err, sizeof err) == 0, "%s", err);
        tok = eng_sample(row, V, &greedy, NULL);
    }
    eng_seq_free(e, sa);
    eng_seq_free(e, sb);
    eng_seq_free(e, sc);
}

START_TEST(test_overlap_bits) {
    const char *models[] = {"gqa4-deep", "llama-tp3", "qwen2-bias"};
    const echo_preset modes[] = {ECHO_PRESET_EXACT, ECHO_PRESET_BF16};
    char err[1024];
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++)
        for (int tp = 2; tp <= 4; tp++)
            for (int m = 0; m < 2; m++) {
                eng *off = open_overlap(models[mi], tp, modes[m], ENG_OVERLAP_OFF, err);
                if (!off) {
                    ck_assert_msg(strstr(err, "--tp") != NULL, "%s", err); /* a tp the model cannot split */
                    continue;
                }
                ck_assert_int_eq(eng_overlap_k(off), 1);
                const model_config *c = eng_model_config(off);
                const int V = c->vocab_size, rows = 26;
                float *ref = malloc((size_t)rows * V * sizeof *ref), *got = malloc((size_t)rows * V * sizeof *got);
                overlap_run(off, ref);
                for (int k = 2; k <= 3; k++) {
                    eng *on = open_overlap(models[mi], tp, modes[m], k, err);
                    ck_assert_msg(on != NULL, "%s", err);
                    ck_assert_int_eq(eng_overlap_k(on), k);
                    overlap_run(on, got);
                    ck_assert_msg(!memcmp(got, ref, (size_t)rows * V * sizeof *ref),
                                  "%s tp %d %s: %d micro-batches change the logits", models[mi], tp,
                                  echo_preset_name(modes[m]), k);
                    /* calls: C's 3-token step and the decodes (one pass each), and
                     * the 35-token step as k micro-batches; bf16 cuts that step
                     * into passes (engine.h "Passes"): the decode item alone,
                     * then A and B, k micro-batches each */
                    echo_stats st;
                    eng_comm_stats(on, &st);
                    uint64_t passes = modes[m] == ECHO_PRESET_BF16 ? 1 + 3 + 1 + 2 * (uint64_t)k : 1 + 3 + (uint64_t)k;
                    ck_assert_uint_eq(st.calls[modes[m]], passes * 2 * c->num_layers * tp);
                    eng_destroy(on);
                }
                free(ref);
                free(got);
                eng_destroy(off);
            }
}
END_TEST

/* Echo with overlap: each micro-batch has its own residual chain, and the
 * logits stay as close to exact as the serial pass's. */
/* --oneshot's policy (eng_config.oneshot): auto is on for processes on
 * host memory only; off and tp 1 never; a count is taken as given. */
START_TEST(test_oneshot_plan) {
    ck_assert_uint_eq(eng_oneshot_plan(ENG_ONESHOT_AUTO, 3, 1, 1), ENG_ONESHOT_AUTO_BYTES);
    ck_assert_uint_eq(eng_oneshot_plan(ENG_ONESHOT_AUTO, 3, 0, 1), 0);
    ck_assert_uint_eq(eng_oneshot_plan(ENG_ONESHOT_AUTO, 3, 1, 0), 0);
    ck_assert_uint_eq(eng_oneshot_plan(ENG_ONESHOT_AUTO, 1, 1, 1), 0);
    ck_assert_uint_eq(eng_oneshot_plan(ENG_ONESHOT_OFF, 4, 1, 1), 0);
    ck_assert_uint_eq(eng_oneshot_plan(4096, 2, 0, 1), 4096);
    ck_assert_uint_eq(eng_oneshot_plan(4096, 2, 1, 0), 0);
}
END_TEST

START_TEST(test_overlap_echo_accuracy) {
    char err[1024];
    eng *ex = open_overlap("gqa4-deep", 2, ECHO_PRESET_EXACT, ENG_OVERLAP_OFF, err);
    ck_assert_msg(ex != NULL, "%s", err);
    const int V = eng_model_config(ex)->vocab_size, rows = 26;
    float *ref = malloc((size_t)rows * V * sizeof *ref), *ser = malloc((size_t)rows * V * sizeof *ser),
          *ovl = malloc((size_t)rows * V * sizeof *ovl);
    overlap_run(ex, ref);
    eng_destroy(ex);
    eng *e1 = open_overlap("gqa4-deep", 2, ECHO_PRESET_ECHO, ENG_OVERLAP_OFF, err);
    eng *e2 = open_overlap("gqa4-deep", 2, ECHO_PRESET_ECHO, 2, err);
    ck_assert_msg(e1 && e2, "%s", err);
    overlap_run(e1, ser);
    overlap_run(e2, ovl);
    /* only the prefill rows: the decodes may follow other greedy tokens */
    double es = tu_rel_err(ser, ref, (size_t)23 * V), eo = tu_rel_err(ovl, ref, (size_t)23 * V);
    ck_assert_msg(eo > 0 && es > 0, "echo quantized nothing");
    ck_assert_msg(eo <= 1.5 * es + 1e-6, "echo with overlap: rel err %.3g vs %.3g serial", eo, es);
    echo_stats st;
    eng_comm_stats(e2, &st);
    ck_assert_uint_gt(st.calls[ECHO_PRESET_ECHO], 0);
    eng_destroy(e1);
    eng_destroy(e2);
    free(ref);
    free(ser);
    free(ovl);
}
END_TEST

/* Exact on threads keeps one pass per step (its sum does not depend on the
 * message), and C is never above max_batch_tokens. */
START_TEST(test_passes_exact_unchanged) {
    char err[1024];
    eng *e = open_pass(ECHO_PRESET_EXACT, err);
    ck_assert_msg(e != NULL, "%s", err);
    ck_assert_int_eq(eng_pass_tokens(e), 0);
    ck_assert_int_eq(eng_prompt_chunk(e, 3, 40, 11), 11);
    eng_destroy(e);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/gqa4-deep", MODELS);
    eng_config c = {.model_dir = dir, .tp = 2, .allreduce = ECHO_PRESET_ECHO, .threads = 2, .max_model_len = 128,
                    .max_batch_tokens = 16};
    ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(eng_pass_tokens(e), 16);
    ck_assert_int_eq(eng_get_config(e)->pass_tokens, 16);
    ck_assert_int_eq(eng_prompt_chunk(e, 3, 40, 16), 13);
    ck_assert_int_eq(eng_prompt_chunk(e, 3, 40, 12), 0);
    ck_assert_int_eq(eng_prompt_chunk(e, 3, 10, 12), 10);
    eng_destroy(e);
}
END_TEST

/* Blocks of two sequences interleave (A0 B0 A1 B1 ...), so a wrong block
 * table would make one read the other's keys; freed blocks are reused and
 * must not leak the previous owner's state. */
START_TEST(test_kv_paging_no_leakage) {
    char err[1024];
    eng *e = open_eng("tied", 1, ECHO_PRESET_EXACT, 3, 64, err);
    ck_assert_msg(e != NULL, "%s", err);
    const int V = eng_model_config(e)->vocab_size;
    int32_t pa[40], pb[40], pc[40], ga[6], gb[6], gc[6];
    make_prompt(pa, 40, V, 1);
    make_prompt(pb, 40, V, 2);
    make_prompt(pc, 40, V, 3);
    float *ra = run_alone(e, pa, 40, ga), *rb = run_alone(e, pb, 40, gb), *rc = run_alone(e, pc, 40, gc);
    int a, b;
    ck_assert(eng_seq_new(e, &a, err, sizeof err) == 0);
    ck_assert(eng_seq_new(e, &b, err, sizeof err) == 0);
    float out[2 * 384];
    /* feed 4 tokens (one block) at a time to each in turn */
    for (int off = 0; off < 40; off += 4) {
        eng_item it[2] = {{a, pa + off, 4, ENG_LOGITS_LAST}, {b, pb + off, 4, ENG_LOGITS_LAST}};
        ck_assert_msg(eng_step(e, it, 2, out, err, sizeof err) == 0, "%s", err);
    }
    ck_assert(tu_rel_err(out, ra, (size_t)V) <= 1e-5);
    ck_assert(tu_rel_err(out + V, rb, (size_t)V) <= 1e-5);
    eng_kv_usage u;
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.free_blocks, 64 - 20);
    /* free A; C reuses A's blocks and must see only its own keys */
    eng_seq_free(e, a);
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.free_blocks, 64 - 10);
    int c;
    ck_assert(eng_seq_new(e, &c, err, sizeof err) == 0);
    eng_item ic = {c, pc, 40, ENG_LOGITS_LAST};
    ck_assert(eng_step(e, &ic, 1, out, err, sizeof err) == 0);
    ck_assert(tu_rel_err(out, rc, (size_t)V) <= 1e-5);
    eng_seq_free(e, b);
    eng_seq_free(e, c);
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.free_blocks, 64);
    free(ra);
    free(rb);
    free(rc);
    eng_destroy(e);
}
END_TEST

START_TEST(test_kv_exhaustion_reported) {
    char err[1024];
    eng *e = open_eng("tied", 1, ECHO_PRESET_EXACT, 3, 5, err); /* 5 blocks of 4 tokens */
    ck_assert_msg(e != NULL, "%s", err);
    int32_t p[24];
    make_prompt(p, 24, 384, 5);
    int a, b;
    float out[384];
    ck_assert(eng_seq_new(e, &a, err, sizeof err) == 0);
    ck_assert(eng_seq_new(e, &b, err, sizeof err) == 0);
    eng_item it = {a, p, 16, ENG_LOGITS_LAST}; /* 4 blocks */
    ck_assert(eng_step(e, &it, 1, out, err, sizeof err) == 0);
    eng_item big = {b, p, 8, ENG_LOGITS_LAST}; /* needs 2, 1 free */
    ck_assert_int_eq(eng_step(e, &big, 1, out, err, sizeof err), ENG_ENOSPACE);
    ck_assert_ptr_nonnull(strstr(err, "KV blocks"));
    ck_assert_int_eq(eng_seq_len(e, b), 0);
    eng_kv_usage u;
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.free_blocks, 1); /* nothing taken by the refused step */
    /* a batch that does not fit is refused whole: A's decode is not applied either */
    eng_item both[2] = {{a, p + 16, 1, ENG_LOGITS_NONE}, {b, p, 8, ENG_LOGITS_NONE}};
    ck_assert_int_eq(eng_step(e, both, 2, out, err, sizeof err), ENG_ENOSPACE);
    ck_assert_int_eq(eng_seq_len(e, a), 16);
    /* sequence slots run out too */
    int c, d;
    ck_assert(eng_seq_new(e, &c, err, sizeof err) == 0);
    ck_assert_int_eq(eng_seq_new(e, &d, err, sizeof err), ENG_ENOSPACE);
    /* bad items are errors, not crashes */
    eng_item dup[2] = {{a, p, 1, ENG_LOGITS_NONE}, {a, p, 1, ENG_LOGITS_NONE}};
    ck_assert_int_eq(eng_step(e, dup, 2, out, err, sizeof err), -1);
    eng_item unknown = {17, p, 1, ENG_LOGITS_NONE};
    ck_assert_int_eq(eng_step(e, &unknown, 1, out, err, sizeof err), -1);
    int32_t bad_tok = 384;
    eng_item badt = {a, &bad_tok, 1, ENG_LOGITS_NONE};
    ck_assert_int_eq(eng_step(e, &badt, 1, out, err, sizeof err), -1);
    ck_assert_int_eq(eng_seq_len(e, a), 16);
    eng_destroy(e);
}
END_TEST

/* ---- sampling ---- */

START_TEST(test_sampling_reproducible_and_topk1) {
    float lg[50];
    for (int i = 0; i < 50; i++) lg[i] = (float)sin(i * 1.7) * 2;
    eng_sampling p = {.temperature = 0.9f, .top_k = 0, .top_p = 1, .seed = 0};
    int32_t a[64], b[64];
    eng_rng r1, r2;
    eng_rng_seed(&r1, 42);
    eng_rng_seed(&r2, 42);
    for (int i = 0; i < 64; i++) a[i] = eng_sample(lg, 50, &p, &r1);
    for (int i = 0; i < 64; i++) b[i] = eng_sample(lg, 50, &p, &r2);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    int differs = 0;
    eng_rng_seed(&r2, 43);
    for (int i = 0; i < 64; i++) differs |= eng_sample(lg, 50, &p, &r2) != a[i];
    ck_assert(differs);
    int32_t best = 0;
    for (int i = 1; i < 50; i++)
        if (lg[i] > lg[best]) best = i;
    p.top_k = 1;
    for (int i = 0; i < 32; i++) ck_assert_int_eq(eng_sample(lg, 50, &p, &r1), best);
    p.top_k = 0;
    p.temperature = 0;
    ck_assert_int_eq(eng_sample(lg, 50, &p, &r1), best);
}
END_TEST

/* Empirical frequencies over many draws match the filtered, renormalised
 * softmax; filtered-out tokens never appear. */
START_TEST(test_sampling_distributions) {
    enum { V = 8, N = 40000 };
    const float lg[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};
    struct {
        int top_k;
        float top_p;
    } cases[] = {{0, 1.0f}, {3, 1.0f}, {0, 0.7f}, {5, 0.9f}};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        eng_sampling p = {.temperature = 1.3f, .top_k = cases[ci].top_k, .top_p = cases[ci].top_p};
        double prob[V], tot = 0;
        for (int i = 0; i < V; i++) tot += prob[i] = exp((lg[i] - lg[0]) / 1.3);
        /* expected support: top_k first, then the smallest prefix reaching top_p of what is left */
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
        int count[V] = {0};
        eng_rng r;
        eng_rng_seed(&r, 1000 + ci);
        for (int k = 0; k < N; k++) count[eng_sample(lg, V, &p, &r)]++;
        for (int i = 0; i < V; i++) {
            double expect = i < n ? prob[i] / z : 0;
            double f = (double)count[i] / N;
            /* 5 standard deviations of a binomial proportion */
            double tol = 5 * sqrt(expect * (1 - expect) / N) + 1e-9;
            ck_assert_msg(fabs(f - expect) <= tol, "case %zu token %d: freq %.4f expected %.4f", ci, i, f, expect);
        }
    }
}
END_TEST

START_TEST(test_engine_config_errors) {
    char err[1024];
    eng_config c = {.model_dir = MODELS "/tied", .tp = 3};
    eng *e = NULL;
    ck_assert(eng_create(&c, &e, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "--tp 3") != NULL, "%s", err);
    c.tp = 1;
    c.max_model_len = 1 << 20;
    ck_assert(eng_create(&c, &e, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "max_position_embeddings") != NULL, "%s", err);
    c.max_model_len = 0;
    c.tp = 2;
    c.device = "cuda";
    ck_assert(eng_create(&c, &e, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "--device cpu") != NULL, "%s", err);
}
END_TEST

/* The accuracy report on the 36-layer fixture at tp 4: echo keeps more
 * top-1 agreement with exact than its codec without feedback (echo-nofb)
 * and ends with a smaller
 * residual-stream error (issue acceptance; numbers in docs/echo.md). */
START_TEST(test_echo_eval_deep) {
    const char *bin = getenv("ECHO_BIN") ? getenv("ECHO_BIN") : "bin";
    char cmd[1024];
    int st;
    snprintf(cmd, sizeof cmd,
             "%s/echo-eval --model %s/deep36 --tp 4 --modes echo-nofb,echo --random-prompts 3 --prompt-len 24 "
             "--gen-tokens 8 --threads 2 --json",
             bin, MODELS);
    char *out = tu_run(cmd, &st);
    ck_assert_msg(st == 0 && out, "%s exited %d", cmd, st);
    json_t *root = json_loads(out, 0, NULL);
    ck_assert_msg(root != NULL, "not JSON: %s", out);
    json_t *modes = json_object_get(root, "modes");
    ck_assert_int_eq(json_array_size(modes), 2);
    json_t *i4 = json_array_get(modes, 0), *ec = json_array_get(modes, 1);
    ck_assert_str_eq(json_string_value(json_object_get(i4, "mode")), "echo-nofb");
    ck_assert_str_eq(json_string_value(json_object_get(ec, "mode")), "echo");
    ck_assert(json_is_false(json_object_get(i4, "feedback")) && json_is_true(json_object_get(ec, "feedback")));
    double t_i4 = json_real_value(json_object_get(i4, "top1_agreement"));
    double t_ec = json_real_value(json_object_get(ec, "top1_agreement"));
    json_t *li4 = json_object_get(i4, "layer_rel_err"), *lec = json_object_get(ec, "layer_rel_err");
    ck_assert_int_eq(json_array_size(li4), 36);
    double f_i4 = json_real_value(json_array_get(li4, 35)), f_ec = json_real_value(json_array_get(lec, 35));
    ck_assert_msg(t_ec >= t_i4, "top-1: echo %.3f < int4 %.3f", t_ec, t_i4);
    ck_assert_msg(f_ec < f_i4, "final-layer error: echo %.3g >= int4 %.3g", f_ec, f_i4);
    ck_assert(json_real_value(json_object_get(ec, "kl_mean")) > 0);
    json_decref(root);
    free(out);
    /* echo-generate drives the same engine at tp 4 */
    snprintf(cmd, sizeof cmd,
             "%s/echo-generate --model %s/gqa4-deep --prompt-tokens 5,6,7 --tp 4 --allreduce echo --max-tokens 4 "
             "--json --threads 2",
             bin, MODELS);
    out = tu_run(cmd, &st);
    ck_assert_msg(st == 0 && out && strstr(out, "\"tokens\""), "%s exited %d", cmd, st);
    free(out);
}
END_TEST

/* A copy of the tied fixture whose tensor `name` starts with NaN: a corrupt
 * checkpoint that still parses. Caller removes and frees the folder. */
static char *corrupt_tensor(const char *name) {
    char *dir = tu_mkdtemp(), path[1024], cmd[2048];
    snprintf(cmd, sizeof cmd, "cp %s/tied/config.json %s/tied/model.safetensors %s/", MODELS, MODELS, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    char *buf = tu_read_file(path, &len);
    ck_assert_ptr_nonnull(buf);
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    json_t *h = json_loadb(buf + 8, (size_t)hlen, 0, NULL);
    json_t *off = json_object_get(json_object_get(h, name), "data_offsets");
    ck_assert_ptr_nonnull(off);
    size_t b0 = 8 + (size_t)hlen + (size_t)json_integer_value(json_array_get(off, 0));
    const unsigned char nan_bf16[2] = {0xc0, 0x7f};
    memcpy(buf + b0, nan_bf16, 2); /* first element */
    ck_assert_int_eq(tu_write_file(path, buf, len), 0);
    json_decref(h);
    free(buf);
    return dir;
}

static char *corrupt_model(void) {
    return corrupt_tensor("model.norm.weight");
}

/* An engine on `dir` at `tp` with one sequence whose 3-token prompt `it`
 * is ready to step. */
static eng *one_seq_engine(const char *dir, int tp, echo_preset mode, int *seq, eng_item *it) {
    static const int32_t ids[3] = {1, 2, 3};
    char err[1024];
    eng_config c = {.model_dir = dir, .tp = tp, .threads = tp, .max_model_len = 64, .max_num_seqs = 1,
                    .allreduce = mode};
    eng *e;
    ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s", err);
    ck_assert(eng_seq_new(e, seq, err, sizeof err) == 0);
    *it = (eng_item){*seq, ids, 3, ENG_LOGITS_LAST};
    return e;
}

/* Weights that hold NaN give a clear error instead of a silently wrong
 * token, and change no state. */
START_TEST(test_nonfinite_logits_reported) {
    char *dir = corrupt_model(), err[1024];
    int seq;
    eng_item it;
    eng *e = one_seq_engine(dir, 1, ECHO_PRESET_EXACT, &seq, &it);
    float out[384];
    ck_assert_int_eq(eng_step(e, &it, 1, out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "non-finite") != NULL, "%s", err);
    ck_assert_int_eq(eng_seq_len(e, seq), 0);
    eng_kv_usage u;
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.free_blocks, u.total_blocks);
    eng_destroy(e);
    tu_rmtree(dir);
    free(dir);
}
END_TEST

/* A NaN that reaches an all-reduce (layer 0's o_proj, row-parallel) at
 * tp 2: every rank reports the non-finite sum at the same call, so the step
 * fails without aborting the all-reduce world (eng_comm_resets stays 0: on
 * nccl an abort re-creates the communicators), and again on the next step,
 * with nothing left held. */
START_TEST(test_nonfinite_allreduce_no_reset) {
    char *dir = corrupt_tensor("model.layers.0.self_attn.o_proj.weight"), err[1024];
    for (int mode = 0; mode < 3; mode++) {
        int seq;
        eng_item it;
        eng *e = one_seq_engine(dir, 2, (echo_preset)mode, &seq, &it);
        float out[384];
        for (int step = 0; step < 2; step++) {
            ck_assert_int_eq(eng_step(e, &it, 1, out, err, sizeof err), -1);
            ck_assert_msg(strstr(err, "not finite") || strstr(err, "inf/nan"), "mode %d: %s", mode, err);
            ck_assert_msg(!strstr(err, "aborted because another rank"), "mode %d: %s", mode, err);
            ck_assert_int_eq(eng_seq_len(e, seq), 0);
        }
        ck_assert_int_eq(eng_comm_resets(e), 0);
        eng_destroy(e);
    }
    tu_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- candidates (eng_step_cands) ---- */

/* The candidates of one full row, by brute force: eng_top_k of the row
 * (ties by ascending id) and the double log-sum-exp eng_log_softmax uses. */
static void row_cands(const float *row, int V, int k, eng_cands *c) {
    double *lp = malloc((size_t)V * sizeof *lp);
    ck_assert_ptr_nonnull(lp);
    eng_log_softmax(row, V, lp);
    c->k = eng_top_k(lp, V, k, c->ids);
    for (int i = 0; i < c->k; i++) c->vals[i] = row[c->ids[i]];
    c->lse = (double)row[c->ids[0]] - lp[c->ids[0]];
    free(lp);
}

/* got (from the engine) against the full row it must summarise. */
static void check_cands(const eng_cands *got, const float *row, int V, int k, const char *what) {
    eng_cands want;
    row_cands(row, V, k, &want);
    ck_assert_msg(got->k == want.k, "%s: %d candidates, expected %d", what, got->k, want.k);
    for (int i = 0; i < want.k; i++) {
        ck_assert_msg(got->ids[i] == want.ids[i], "%s: rank %d id %d, expected %d", what, i, got->ids[i],
                      want.ids[i]);
        ck_assert_msg(got->vals[i] == want.vals[i], "%s: rank %d value %.9g, expected %.9g", what, i, got->vals[i],
                      want.vals[i]);
    }
    ck_assert_msg(fabs(got->lse - want.lse) <= 1e-5, "%s: lse %.9g, log_softmax's %.9g", what, got->lse, want.lse);
}

/* eng_step_cands gives, at tp 1, 2 and 4 (exact all-reduce), the top-k of
 * the rows eng_step gives (same ids, same values: the same forward) and
 * their log-sum-exp; a batch mixing a full-row item with candidate items
 * gives each what it gets alone. realvocab's 151936 ids span several
 * reduction chunks and are split across ranks. */
START_TEST(test_step_cands_match_full) {
    const char *models[] = {"tied", "gqa4-deep", "realvocab"};
    char err[1024], what[128];
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        for (int tp = 1; tp <= 4; tp *= 2) {
            eng *e = open_eng(models[mi], tp, ECHO_PRESET_EXACT, 3, 0, err);
            if (!e) {
                ck_assert_msg(tp == 4 && strstr(err, "--tp"), "%s tp %d: %s", models[mi], tp, err);
                continue;
            }
            const int V = eng_model_config(e)->vocab_size;
            const int k = mi == 0 ? 7 : KERN_TOPK_MAX;
            int32_t prompt[19], greedy[6];
            make_prompt(prompt, 19, V, 31u + (unsigned)mi);
            float *ref = run_alone(e, prompt, 19, greedy); /* 7 rows: prefill + 6 decodes */
            /* alone, candidates only */
            int seq;
            eng_cands cd[3];
            ck_assert(eng_seq_new(e, &seq, err, sizeof err) == 0);
            for (int t = 0; t < 7; t++) {
                eng_item it = t == 0 ? (eng_item){seq, prompt, 19, ENG_LOGITS_LAST}
                                     : (eng_item){seq, &greedy[t - 1], 1, ENG_LOGITS_LAST};
                ck_assert_msg(eng_step_cands(e, &it, 1, k, cd, NULL, NULL, err, sizeof err) == 0, "%s", err);
                snprintf(what, sizeof what, "%s tp %d step %d", models[mi], tp, t);
                check_cands(&cd[0], ref + (size_t)t * V, V, k, what);
                ck_assert_int_eq(cd[0].ids[0], t < 6 ? greedy[t] : cd[0].ids[0]);
            }
            ck_assert_int_eq(eng_seq_len(e, seq), 19 + 6);
            eng_seq_free(e, seq);
            /* mixed batch: item 0 full row, items 1 and 2 candidates */
            int sq[3];
            for (int i = 0; i < 3; i++) ck_assert(eng_seq_new(e, &sq[i], err, sizeof err) == 0);
            float *full = malloc((size_t)V * sizeof *full);
            const unsigned char want_full[3] = {1, 0, 0};
            eng_item it3[3] = {{sq[0], prompt, 19, ENG_LOGITS_LAST},
                               {sq[1], prompt, 19, ENG_LOGITS_LAST},
                               {sq[2], prompt, 5, ENG_LOGITS_NONE}};
            ck_assert_msg(eng_step_cands(e, it3, 3, k, cd, want_full, full, err, sizeof err) == 0, "%s", err);
            snprintf(what, sizeof what, "%s tp %d mixed batch", models[mi], tp);
            ck_assert(memcmp(full, ref, (size_t)V * sizeof *full) == 0);
            check_cands(&cd[0], ref, V, k, what);
            check_cands(&cd[1], ref, V, k, what);
            for (int i = 0; i < 3; i++) eng_seq_free(e, sq[i]);
            free(full);
            free(ref);
            eng_destroy(e);
        }
    }
}
END_TEST

/* Bad k and a corrupt model: the step fails and every sequence and block
 * stays as it was, at tp 1 and 2. */
START_TEST(test_step_cands_errors_roll_back) {
    char err[1024];
    eng *e = open_eng("tied", 1, ECHO_PRESET_EXACT, 2, 0, err);
    ck_assert_msg(e != NULL, "%s", err);
    int seq;
    int32_t p[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    eng_cands cd[2];
    ck_assert(eng_seq_new(e, &seq, err, sizeof err) == 0);
    eng_item it = {seq, p, 9, ENG_LOGITS_LAST};
    ck_assert_int_eq(eng_step_cands(e, &it, 1, 0, cd, NULL, NULL, err, sizeof err), -1);
    ck_assert_int_eq(eng_step_cands(e, &it, 1, KERN_TOPK_MAX + 1, cd, NULL, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "candidates") != NULL, "%s", err);
    ck_assert_int_eq(eng_step_cands(e, &it, 1, 3, NULL, NULL, NULL, err, sizeof err), -1);
    const unsigned char flag = 1;
    ck_assert_int_eq(eng_step_cands(e, &it, 1, 3, cd, &flag, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no array") != NULL, "%s", err);
    ck_assert_int_eq(eng_seq_len(e, seq), 0);
    eng_kv_usage u;
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.free_blocks, u.total_blocks);
    eng_destroy(e);

    char *dir = corrupt_model();
    for (int tp = 1; tp <= 2; tp++) {
        eng_config c = {.model_dir = dir, .tp = tp, .allreduce = ECHO_PRESET_EXACT, .threads = 2, .max_model_len = 64,
                        .max_num_seqs = 2};
        ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s", err);
        int a, b;
        ck_assert(eng_seq_new(e, &a, err, sizeof err) == 0);
        ck_assert(eng_seq_new(e, &b, err, sizeof err) == 0);
        eng_item two[2] = {{a, p, 9, ENG_LOGITS_LAST}, {b, p, 4, ENG_LOGITS_NONE}};
        ck_assert_int_eq(eng_step_cands(e, two, 2, 5, cd, NULL, NULL, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "non-finite") != NULL, "tp %d: %s", tp, err);
        float row[384];
        const unsigned char fl[2] = {1, 0};
        ck_assert_int_eq(eng_step_cands(e, two, 2, 5, cd, fl, row, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "non-finite") != NULL, "tp %d: %s", tp, err);
        ck_assert_int_eq(eng_seq_len(e, a), 0);
        ck_assert_int_eq(eng_seq_len(e, b), 0);
        eng_kv_get_usage(e, &u);
        ck_assert_int_eq(u.free_blocks, u.total_blocks);
        eng_destroy(e);
    }
    tu_rmtree(dir);
    free(dir);
}
END_TEST

/* eng_sample_cands picks exactly eng_sample's token, seed after seed,
 * whenever eng_cands_needed says the candidates suffice: greedy, top_k
 * windows with and without top_p, rows full of ties, and a vocabulary
 * small enough that every id is a candidate (top_k off, top_p on or off).
 * The generator advances the same way on both paths. */
START_TEST(test_sample_cands_identical) {
    const float temps[] = {0.0f, 0.3f, 0.8f, 1.5f};
    const int top_ks[] = {0, 1, 2, 5, 20, 64, 100};
    const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.05f};
    const int vocabs[] = {1000, 50};
    int checked = 0;
    for (int vi = 0; vi < 2; vi++) {
        const int V = vocabs[vi];
        float *row = malloc((size_t)V * sizeof *row);
        for (int kind = 0; kind < 2; kind++) {
            unsigned seed = 77u + (unsigned)(vi * 2 + kind);
            for (int i = 0; i < V; i++) {
                seed = seed * 1103515245u + 12345u;
                /* kind 1: eight distinct values, so top-k windows cut through ties */
                row[i] = kind ? (float)((seed >> 16) % 8) * 0.75f : (float)((seed >> 8) % 100000) / 7000.0f - 6.0f;
            }
            for (size_t ti = 0; ti < sizeof temps / sizeof *temps; ti++)
                for (size_t ki = 0; ki < sizeof top_ks / sizeof *top_ks; ki++)
                    for (size_t pi = 0; pi < sizeof top_ps / sizeof *top_ps; pi++) {
                        eng_sampling sp = {.temperature = temps[ti], .top_k = top_ks[ki], .top_p = top_ps[pi]};
                        int k = eng_cands_needed(&sp, 3, V);
                        int exact = temps[ti] == 0 || top_ks[ki] == 1 || V <= KERN_TOPK_MAX ||
                                    (top_ks[ki] >= 1 && top_ks[ki] <= KERN_TOPK_MAX);
                        ck_assert_int_eq(k > 0, exact);
                        if (!k) continue;
                        ck_assert(k >= 3 && k <= KERN_TOPK_MAX);
                        eng_cands cd;
                        row_cands(row, V, k, &cd);
                        for (uint64_t s = 0; s < 40; s++) {
                            eng_rng r1, r2;
                            eng_rng_seed(&r1, s * 7919 + 1);
                            eng_rng_seed(&r2, s * 7919 + 1);
                            for (int draw = 0; draw < 3; draw++) {
                                int32_t a = eng_sample(row, V, &sp, &r1), b = eng_sample_cands(&cd, V, &sp, &r2);
                                ck_assert_msg(a == b, "V %d kind %d T %g top_k %d top_p %g seed %llu: %d vs %d", V,
                                              kind, temps[ti], top_ks[ki], top_ps[pi], (unsigned long long)s, a, b);
                                ck_assert(r1.s == r2.s);
                                ck_assert(fabs(eng_cands_logprob(&cd, b) - ((double)row[b] - cd.lse)) == 0);
                                checked++;
                            }
                        }
                    }
        }
        free(row);
    }
    ck_assert_int_gt(checked, 10000);
    eng_sampling off = {.temperature = 1, .top_k = 0, .top_p = 1};
    ck_assert_int_eq(eng_cands_needed(&off, 0, 151936), 0);    /* the whole row is in play */
    off.top_k = 50;
    ck_assert_int_eq(eng_cands_needed(&off, 65, 151936), 0);   /* more top_logprobs than candidates */
    ck_assert_int_eq(eng_cands_needed(&off, 60, 151936), 60);
    eng_cands one = {.k = 1, .ids = {9}, .vals = {2.0f}, .lse = 2.5};
    ck_assert(isnan(eng_cands_logprob(&one, 8)));
    ck_assert(fabs(eng_cands_logprob(&one, 9) + 0.5) < 1e-12);
}
END_TEST

/* eng_generate takes the candidates path for these parameters: its tokens
 * are those of a hand-written full-row loop (eng_step, eng_sample,
 * eng_log_softmax), its logprobs within the fp32 lse's rounding. */
typedef struct gen_rec {
    int n;
    eng_step_out st[12];
} gen_rec;
static int gen_cb(void *user, const eng_step_out *st) {
    gen_rec *g = user;
    g->st[g->n++] = *st;
    return 0;
}

START_TEST(test_generate_cands_equals_full) {
    char err[1024];
    eng *e = open_eng("gqa4-deep", 2, ECHO_PRESET_EXACT, 2, 0, err);
    ck_assert_msg(e != NULL, "%s", err);
    const int V = eng_model_config(e)->vocab_size;
    int32_t prompt[11];
    make_prompt(prompt, 11, V, 5);
    const eng_sampling sps[] = {{.temperature = 0, .top_p = 1},
                                {.temperature = 0.8f, .top_k = 20, .top_p = 1},
                                {.temperature = 1.2f, .top_k = 64, .top_p = 0.7f}};
    float *row = malloc((size_t)V * sizeof *row);
    double *lp = malloc((size_t)V * sizeof *lp);
    for (size_t si = 0; si < sizeof sps / sizeof *sps; si++) {
        for (uint64_t seed = 1; seed <= 4; seed++) {
            eng_gen_params gp = {.max_tokens = 12, .sampling = sps[si], .top_logprobs = 5, .ignore_eos = 1};
            gp.sampling.seed = seed;
            ck_assert(eng_cands_needed(&gp.sampling, gp.top_logprobs, V) > 0);
            gen_rec g = {0};
            eng_finish fin;
            ck_assert_msg(eng_generate(e, prompt, 11, &gp, gen_cb, &g, &fin, err, sizeof err) == 0, "%s", err);
            ck_assert_int_eq(g.n, 12);
            /* the reference loop on full rows */
            int seq;
            eng_rng rng;
            eng_rng_seed(&rng, seed);
            ck_assert(eng_seq_new(e, &seq, err, sizeof err) == 0);
            eng_item it = {seq, prompt, 11, ENG_LOGITS_LAST};
            for (int t = 0; t < 12; t++) {
                ck_assert_msg(eng_step(e, &it, 1, row, err, sizeof err) == 0, "%s", err);
                eng_log_softmax(row, V, lp);
                int32_t tok = eng_sample(row, V, &gp.sampling, &rng);
                ck_assert_msg(g.st[t].token == tok, "sampling %zu seed %llu step %d: %d vs %d", si,
                              (unsigned long long)seed, t, g.st[t].token, tok);
                ck_assert(fabs(g.st[t].logprob - lp[tok]) <= 1e-5);
                int32_t top[5];
                ck_assert_int_eq(g.st[t].n_top, eng_top_k(lp, V, 5, top));
                for (int i = 0; i < 5; i++) {
                    ck_assert_int_eq(g.st[t].top_ids[i], top[i]);
                    ck_assert(fabs(g.st[t].top_logprobs[i] - lp[top[i]]) <= 1e-5);
                }
                it = (eng_item){seq, &g.st[t].token, 1, ENG_LOGITS_LAST};
            }
            eng_seq_free(e, seq);
        }
    }
    free(row);
    free(lp);
    eng_destroy(e);
}
END_TEST

/* ---- automatic prefix cache ---- */

static eng *open_pc(const char *name, int tp, echo_preset mode, int kv_blocks, int off, char *err) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", MODELS, name);
    eng_config c = {.model_dir = dir,
                    .tp = tp,
                    .allreduce = mode,
                    .threads = 2,
                    .max_model_len = 128,
                    .max_num_seqs = 4,
                    .kv_blocks = kv_blocks,
                    .kv_block_size = 4,
                    .no_prefix_cache = off};
    eng *e = NULL;
    if (eng_create(&c, &e, err, 1024)) return NULL;
    return e;
}

/* A sequence for prompt[0..n) through eng_seq_new_prefix: steps what was
 * not reused (all logits rows of it), then `dec` greedy decode steps.
 * Returns the rows, (n - reused + dec, V); *reused as mapped. The sequence
 * is left live in *seq when keep, else freed. */
static float *pc_run(eng *e, const int32_t *prompt, int n, int max_reuse, int dec, int *reused, int keep, int *seq) {
    const int V = eng_model_config(e)->vocab_size;
    char err[1024];
    int s;
    ck_assert_msg(eng_seq_new_prefix(e, prompt, n, max_reuse, &s, reused, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(eng_seq_len(e, s), *reused);
    int rows = n - *reused;
    float *out = malloc((size_t)(rows + dec) * V * sizeof *out);
    eng_item it = {s, prompt + *reused, rows, ENG_LOGITS_ALL};
    ck_assert_msg(eng_step(e, &it, 1, out, err, sizeof err) == 0, "%s", err);
    eng_sampling g = {.temperature = 0, .top_p = 1};
    for (int t = 0; t < dec; t++) {
        int32_t tok = eng_sample(out + (size_t)(rows - 1 + t) * V, V, &g, NULL);
        it = (eng_item){s, &tok, 1, ENG_LOGITS_LAST};
        ck_assert_msg(eng_step(e, &it, 1, out + (size_t)(rows + t) * V, err, sizeof err) == 0, "%s", err);
    }
    if (keep)
        *seq = s;
    else
        eng_seq_free(e, s);
    return out;
}

/* Exact mode: the logits of every computed position and of the decode
 * steps equal, bit for bit, those of an engine without the cache that
 * computed the whole prompt, at tp 1, 2 and 4, for the same prompt again,
 * a longer prompt sharing a prefix, and a strict prefix of a cached one. */
START_TEST(test_prefix_cache_exact) {
    static const char *models[] = {"gqa4-deep", "llama-gqa", "gguf-qwen3/model.gguf"};
    char err[1024];
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        for (int tp = 1; tp <= 4; tp *= 2) {
            eng *on = open_pc(models[mi], tp, ECHO_PRESET_EXACT, 0, 0, err);
            ck_assert_msg(on != NULL, "%s tp %d: %s", models[mi], tp, err);
            eng *off = open_pc(models[mi], tp, ECHO_PRESET_EXACT, 0, 1, err);
            ck_assert_msg(off != NULL, "%s", err);
            const int V = eng_model_config(on)->vocab_size;
            int32_t p[40];
            make_prompt(p, 40, V, 31u + (unsigned)mi);
            /* prompts: P (23), P again, P[0..21) + other tail (33), P[0..14) (strict prefix),
             * the longer one again, P[0..24) twice (whole blocks: the last one is recomputed) */
            int32_t longer[33];
            memcpy(longer, p, 21 * sizeof *p);
            make_prompt(longer + 21, 12, V, 77u);
            struct {
                const int32_t *ids;
                int n, want;
            } cases[] = {{p, 23, 0},       {p, 23, 20}, {longer, 33, 20}, {p, 14, 12},
                         {longer, 33, 32}, {p, 24, 20}, {p, 24, 20}};
            for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
                int r_on, r_off;
                float *a = pc_run(on, cases[k].ids, cases[k].n, -1, 3, &r_on, 0, NULL);
                float *b = pc_run(off, cases[k].ids, cases[k].n, -1, 3, &r_off, 0, NULL);
                ck_assert_int_eq(r_off, 0);
                ck_assert_msg(r_on == cases[k].want, "%s tp %d case %zu: reused %d, want %d", models[mi], tp, k, r_on,
                              cases[k].want);
                int rows = cases[k].n - r_on;
                /* b's rows start at position 0: the last `rows` prompt rows, then the decodes */
                ck_assert_msg(!memcmp(a, b + (size_t)r_on * V, (size_t)(rows + 3) * V * sizeof *a),
                              "%s tp %d case %zu: logits with the cache differ from without", models[mi], tp, k);
                free(a);
                free(b);
            }
            eng_kv_usage u;
            eng_kv_get_usage(on, &u);
            ck_assert_int_eq(u.free_blocks, u.total_blocks); /* nothing held, cached blocks are free */
            ck_assert_int_eq(u.evictable_blocks, u.cached_blocks);
            ck_assert_int_eq(u.prefix_queries, 7);
            ck_assert_int_eq(u.prefix_hit_tokens, 20 + 20 + 12 + 32 + 20 + 20);
            eng_kv_get_usage(off, &u);
            ck_assert_int_eq(u.cached_blocks, 0);
            eng_destroy(on);
            eng_destroy(off);
        }
    }
}
END_TEST

/* ---- KV cache types and the memory budget (kernels.h kern_kv_dtype) ---- */

static eng *open_kv(const char *name, int tp, kern_kv_dtype dt, int off, size_t budget, int max_len, char *err) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", MODELS, name);
    eng_config c = {.model_dir = dir,
                    .tp = tp,
                    .allreduce = ECHO_PRESET_EXACT,
                    .threads = 2,
                    .max_model_len = max_len,
                    .max_num_seqs = 4,
                    .kv_block_size = 4,
                    .kv_dtype = dt,
                    .kv_cache_memory = budget,
                    .no_prefix_cache = off};
    eng *e = NULL;
    if (eng_create(&c, &e, err, 1024)) return NULL;
    return e;
}

/* Every cache type: with the exact all-reduce, prompts served on cached
 * blocks give the bits of an engine without the cache (the stored rows are
 * a deterministic function of the token's k/v), at tp 1 and 2 (ranks as
 * threads); fp32 named explicitly is the native (oracle) path; and the
 * narrow types stay near fp32's logits. wide-head has head_dim 32 (q8_0's
 * smallest), gguf-qwen3 a GGUF's. */
START_TEST(test_kv_types_prefix_cache_exact) {
    static const char *models[] = {"wide-head", "gguf-qwen3/model.gguf"};
    static const kern_kv_dtype dts[] = {KERN_KV_F32, KERN_KV_BF16, KERN_KV_F16, KERN_KV_Q8_0};
    char err[1024];
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        float *base = NULL, *tp1 = NULL;
        for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
            for (int tp = 1; tp <= 2; tp++) {
                eng *on = open_kv(models[mi], tp, dts[d], 0, 0, 128, err);
                ck_assert_msg(on != NULL, "%s %d tp %d: %s", models[mi], (int)dts[d], tp, err);
                if (kern_kv_invalid(dts[d], eng_model_config(on)->head_dim)) {
                    eng_destroy(on);
                    continue;
                }
                eng *off = open_kv(models[mi], tp, dts[d], 1, 0, 128, err);
                ck_assert_msg(off != NULL, "%s", err);
                ck_assert_int_eq(eng_get_config(on)->kv_dtype, dts[d]);
                const int V = eng_model_config(on)->vocab_size;
                int32_t p[40];
                make_prompt(p, 40, V, 41u + (unsigned)mi);
                int r0, r1, r2;
                float *a0 = pc_run(on, p, 23, -1, 3, &r0, 0, NULL); /* fills the cache */
                float *a = pc_run(on, p, 31, -1, 3, &r1, 0, NULL);  /* 20 tokens from it */
                float *b = pc_run(off, p, 31, -1, 3, &r2, 0, NULL);
                ck_assert_int_eq(r1, 20);
                ck_assert_int_eq(r2, 0);
                ck_assert_msg(!memcmp(a, b + (size_t)20 * V, (size_t)(11 + 3) * V * sizeof *a),
                              "%s %s tp %d: logits on cached blocks differ from a whole pass", models[mi],
                              kern_kv_dtype_name(dts[d]), tp);
                size_t nb = (size_t)(31 + 3) * V;
                if (tp == 1) {
                    free(tp1);
                    tp1 = b;
                    b = NULL;
                }
                if (dts[d] == KERN_KV_F32 && tp == 1) { /* fp32 named == the native cache, bit for bit */
                    eng *nat = open_kv(models[mi], 1, KERN_KV_NATIVE, 1, 0, 128, err);
                    ck_assert_msg(nat != NULL, "%s", err);
                    int rn;
                    float *n = pc_run(nat, p, 31, -1, 3, &rn, 0, NULL);
                    ck_assert(!memcmp(n, tp1, nb * sizeof *n));
                    base = n;
                    eng_destroy(nat);
                } else if (tp == 1) { /* close to fp32: the narrow type's rounding only */
                    double worst = 0;
                    for (size_t i = 0; i < nb; i++) worst = fmax(worst, fabs((double)tp1[i] - base[i]));
                    fprintf(stderr, "kv %s %s: max |logit - fp32 logit| %g\n", models[mi], kern_kv_dtype_name(dts[d]), worst);
                    ck_assert_msg(worst < (dts[d] == KERN_KV_Q8_0 ? 1.0 : 0.3), "%s %s: logits %g from fp32's",
                                  models[mi], kern_kv_dtype_name(dts[d]), worst);
                }
                free(a0);
                free(a);
                free(b);
                eng_destroy(on);
                eng_destroy(off);
            }
        free(base);
        free(tp1);
    }
}
END_TEST

/* The budget sizes the pool: N blocks' bytes (from the config, by hand:
 * 2 x layers x block x kv heads x head_dim x 2 bytes of bf16) give N
 * blocks, a large one stops at max_num_seqs full sequences, and one that
 * cannot hold max_model_len is a start-up error naming both numbers. */
START_TEST(test_kv_budget) {
    char err[1024];
    /* wide-head: 3 layers, 2 kv heads of 32 */
    const size_t tok = 2 * 3 * 2 * 32 * 2, blk = 4 * tok;
    eng *e = open_kv("wide-head", 1, KERN_KV_BF16, 0, 40 * blk + blk / 2, 128, err);
    ck_assert_msg(e != NULL, "%s", err);
    eng_kv_usage u;
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.total_blocks, 40);
    ck_assert_uint_eq(u.block_bytes, blk);
    eng_destroy(e);
    e = open_kv("wide-head", 1, KERN_KV_BF16, 0, (size_t)1 << 30, 128, err);
    ck_assert_msg(e != NULL, "%s", err);
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.total_blocks, 4 * 128 / 4);
    eng_destroy(e);
    /* q8_0: 2 x 3 x 2 x 34 bytes per token; 31 blocks hold 124 < 128 tokens */
    const size_t qblk = 4 * (2 * 3 * 2 * 34);
    e = open_kv("wide-head", 1, KERN_KV_Q8_0, 0, 31 * qblk, 128, err);
    ck_assert(e == NULL);
    ck_assert_msg(strstr(err, "--max-model-len 128") && strstr(err, "holds 124 tokens") &&
                      strstr(err, "--kv-cache-memory") && strstr(err, "408 bytes per token"),
                  "%s", err);
    /* 32 blocks hold exactly 128 */
    e = open_kv("wide-head", 1, KERN_KV_Q8_0, 0, 32 * qblk, 128, err);
    ck_assert_msg(e != NULL, "%s", err);
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.total_blocks, 32);
    eng_destroy(e);
    /* a head_dim q8_0 cannot take: the start-up error names the flag */
    e = open_kv("tied", 1, KERN_KV_Q8_0, 0, 0, 64, err);
    ck_assert(e == NULL);
    ck_assert_msg(strstr(err, "--kv-cache-dtype q8_0") && strstr(err, "head_dim is 16"), "%s", err);
}
END_TEST

/* --gpu-memory-utilization's arithmetic on fixed inputs, worked by hand
 * (no GPU needed): util x total, less what is in use at start, less each
 * rank's weights and activations, shared by the ranks on the GPU; the
 * weight estimate of Qwen3-8B's shape at tp 4 counted from its published
 * config by hand. */
START_TEST(test_gpu_kv_budget) {
    const size_t G = (size_t)1 << 30;
    /* 80 GiB, 0.9: 72 GiB; 1 GiB in use; 16 GiB weights + 2 GiB act: 53 GiB */
    ck_assert_uint_eq(eng_gpu_kv_budget(0.9, 80 * G, 79 * G, 16 * G, 2 * G, 1), 53 * G);
    /* the same GPU shared by 4 ranks of 4 + 1 GiB: 72 - 1 - 20 = 51, / 4 */
    ck_assert_uint_eq(eng_gpu_kv_budget(0.9, 80 * G, 79 * G, 4 * G, 1 * G, 4), 51 * G / 4);
    /* 0.5 of 10 GiB with 5 GiB used by others: nothing left */
    ck_assert_uint_eq(eng_gpu_kv_budget(0.5, 10 * G, 5 * G, 1, 1, 1), 0);
    /* out of (0, 1], free above total, no ranks: 0 */
    ck_assert_uint_eq(eng_gpu_kv_budget(0.0, 10 * G, 10 * G, 0, 0, 1), 0);
    ck_assert_uint_eq(eng_gpu_kv_budget(1.5, 10 * G, 10 * G, 0, 0, 1), 0);
    ck_assert_uint_eq(eng_gpu_kv_budget(0.9, 10 * G, 11 * G, 0, 0, 1), 0);
    ck_assert_uint_eq(eng_gpu_kv_budget(0.9, 10 * G, 10 * G, 0, 0, 0), 0);
    /* util 1.0 of an idle GPU, no weights: all of it */
    ck_assert_uint_eq(eng_gpu_kv_budget(1.0, 10 * G, 10 * G, 0, 0, 1), 10 * G);
    /* Qwen3-8B (V 151936, H 4096, I 12288, 36 layers, 32 q / 8 kv heads of
     * 128, untied) at tp 4, per rank, bf16: embedding V*H whole, head V/4*H,
     * per layer q and o 2*1024*H, k and v 2*256*H, mlp 3*3072*H, norms 2*H +
     * 2*128, the final norm H */
    model_config mc = {.vocab_size = 151936, .hidden_size = 4096, .intermediate_size = 12288, .num_layers = 36,
                       .num_heads = 32, .num_kv_heads = 8, .head_dim = 128, .max_position_embeddings = 40960};
    eng_config c = {.tp = 4};
    const size_t H = 4096, layer = 2 * 1024 * H + 2 * 256 * H + 3 * 3072 * H + 2 * H + 256;
    const size_t want = 2 * (151936 * H + H + 151936 / 4 * H + 36 * layer);
    ck_assert_uint_eq(eng_gpu_weight_bytes(&c, &mc), want);
    /* activations grow with the tokens per step */
    eng_config c2 = {.tp = 4, .max_batch_tokens = 8192};
    ck_assert(eng_gpu_activation_bytes(&c2, &mc) > eng_gpu_activation_bytes(&c, &mc));
}
END_TEST

/* Blocks are touched in order: the pool reports the blocks ever handed out
 * and those holding data, and reuses a freed block before a fresh one. */
START_TEST(test_kv_touched_blocks) {
    char err[1024];
    eng *e = open_kv("wide-head", 1, KERN_KV_BF16, 1, 0, 64, err);
    ck_assert_msg(e != NULL, "%s", err);
    const int V = eng_model_config(e)->vocab_size;
    int32_t p[16];
    make_prompt(p, 16, V, 3u);
    for (int round = 0; round < 3; round++) {
        int r;
        free(pc_run(e, p, 16, -1, 0, &r, 0, NULL)); /* 4 blocks, freed again */
        eng_kv_usage u;
        eng_kv_get_usage(e, &u);
        ck_assert_int_eq(u.touched_blocks, 4);
        ck_assert_int_eq(u.used_blocks, 0);
    }
    eng_destroy(e);
}
END_TEST

/* The same prefix twice in one step: neither finds the other (nothing is
 * registered before a step computed it), both compute it, the second copy
 * stays out of the cache, and the next request maps the first. A request
 * that needs the prompt's logprobs (max_reuse 0) maps nothing. */
START_TEST(test_prefix_cache_same_step) {
    char err[1024];
    eng *e = open_pc("tied", 1, ECHO_PRESET_EXACT, 32, 0, err);
    ck_assert_msg(e != NULL, "%s", err);
    const int V = eng_model_config(e)->vocab_size;
    int32_t p[17];
    make_prompt(p, 17, V, 5);
    int a, b, ra, rb;
    ck_assert(eng_seq_new_prefix(e, p, 17, -1, &a, &ra, err, sizeof err) == 0);
    ck_assert(eng_seq_new_prefix(e, p, 17, -1, &b, &rb, err, sizeof err) == 0);
    ck_assert_int_eq(ra + rb, 0);
    float *out = malloc((size_t)2 * V * sizeof *out);
    eng_item it[2] = {{a, p, 17, ENG_LOGITS_LAST}, {b, p, 17, ENG_LOGITS_LAST}};
    ck_assert_msg(eng_step(e, it, 2, out, err, sizeof err) == 0, "%s", err);
    ck_assert(!memcmp(out, out + V, (size_t)V * sizeof *out));
    eng_kv_usage u;
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.cached_blocks, 4); /* 16 of 17 tokens in full blocks, once */
    ck_assert_int_eq(u.free_blocks, 32 - 10);
    eng_seq_free(e, a);
    eng_seq_free(e, b);
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.free_blocks, 32);
    ck_assert_int_eq(u.evictable_blocks, 4);
    int c, rc;
    ck_assert(eng_seq_new_prefix(e, p, 17, -1, &c, &rc, err, sizeof err) == 0);
    ck_assert_int_eq(rc, 16);
    ck_assert_int_eq(eng_seq_blocks(e, c), 4);
    eng_seq_free(e, c);
    /* prompt logprobs: nothing mapped, nothing looked up */
    ck_assert(eng_seq_new_prefix(e, p, 17, 0, &c, &rc, err, sizeof err) == 0);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(eng_prefix_peek(e, p, 17, -1, NULL), 16);
    ck_assert_int_eq(eng_prefix_peek(e, p, 17, 9, NULL), 8);
    eng_seq_free(e, c);
    free(out);
    eng_destroy(e);
}
END_TEST

/* Eviction: a block a running sequence mapped is never evicted (a step
 * that would need it gets ENG_ENOSPACE); unheld cached blocks are taken
 * when memory runs out, a chain's last block first; the freed sequence's
 * cache survives partly and still gives exact logits. */
START_TEST(test_prefix_cache_eviction) {
    char err[1024];
    eng *e = open_pc("tied", 1, ECHO_PRESET_EXACT, 12, 0, err); /* 12 blocks of 4 tokens */
    ck_assert_msg(e != NULL, "%s", err);
    eng *ref = open_pc("tied", 1, ECHO_PRESET_EXACT, 12, 1, err);
    ck_assert_msg(ref != NULL, "%s", err);
    const int V = eng_model_config(e)->vocab_size;
    int32_t p[23], q[40];
    make_prompt(p, 23, V, 11);
    make_prompt(q, 40, V, 12);
    int r, a;
    free(pc_run(e, p, 23, -1, 0, &r, 0, NULL)); /* 5 full blocks cached, 1 partial freed */
    eng_kv_usage u;
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.cached_blocks, 5);
    ck_assert_int_eq(u.evictable_blocks, 5);
    /* A maps those 5 and computes 3 tokens into a 6th: 6 available */
    float *ra = pc_run(e, p, 23, -1, 0, &r, 1, &a);
    ck_assert_int_eq(r, 20);
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.free_blocks, 6);
    ck_assert_int_eq(eng_prefix_peek(e, p, 23, -1, NULL), 20);
    int b, rb;
    ck_assert(eng_seq_new_prefix(e, q, 40, -1, &b, &rb, err, sizeof err) == 0);
    float *out = malloc((size_t)V * sizeof *out);
    eng_item big = {b, q, 28, ENG_LOGITS_LAST}; /* 7 blocks: only A's would do */
    ck_assert_int_eq(eng_step(e, &big, 1, out, err, sizeof err), ENG_ENOSPACE);
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.evicted_blocks, 0);
    ck_assert_int_eq(u.cached_blocks, 5);
    /* A's decode on its mapped blocks is still exact */
    int32_t nx = 7;
    eng_item dec = {a, &nx, 1, ENG_LOGITS_LAST};
    ck_assert(eng_step(e, &dec, 1, out, err, sizeof err) == 0);
    int32_t pn[24];
    memcpy(pn, p, sizeof p);
    pn[23] = 7;
    float *want = pc_run(ref, pn, 24, -1, 0, &r, 0, NULL);
    ck_assert(!memcmp(out, want + (size_t)23 * V, (size_t)V * sizeof *out));
    free(want);
    /* A leaves: its own block is free (7 now), its 5 mapped ones
     * evictable; B's 28 tokens take the 7 free ones, evicting nothing */
    eng_seq_free(e, a);
    ck_assert(eng_step(e, &big, 1, out, err, sizeof err) == 0);
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.evicted_blocks, 0);
    ck_assert_int_eq(u.free_blocks, 12 - 7);
    ck_assert_int_eq(eng_prefix_peek(e, p, 23, -1, NULL), 20);
    /* KV full: B's 40 tokens need 10 blocks, 3 more than it holds: 3
     * evictions, the chain's last blocks first, leave its first 2 */
    eng_item rest = {b, q + 28, 12, ENG_LOGITS_LAST};
    ck_assert(eng_step(e, &rest, 1, out, err, sizeof err) == 0);
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.free_blocks, 2);
    ck_assert_int_eq(u.evicted_blocks, 3);
    ck_assert_int_eq(eng_prefix_peek(e, p, 23, -1, NULL), 8);
    eng_item more = {b, q, 12, ENG_LOGITS_LAST}; /* would need 3 */
    ck_assert_int_eq(eng_step(e, &more, 1, out, err, sizeof err), ENG_ENOSPACE);
    eng_seq_free(e, b);
    eng_kv_get_usage(e, &u);
    ck_assert_int_eq(u.free_blocks, 12);
    /* what is left of P's chain still gives the exact logits */
    float *got = pc_run(e, p, 23, -1, 2, &r, 0, NULL);
    ck_assert_int_eq(r, 8);
    float *full = pc_run(ref, p, 23, -1, 2, &r, 0, NULL);
    ck_assert(!memcmp(got, full + (size_t)8 * V, (size_t)(15 + 2) * V * sizeof *got));
    free(got);
    free(full);
    free(ra);
    free(out);
    eng_destroy(ref);
    eng_destroy(e);
}
END_TEST

/* A lossy all-reduce (echo) runs with the cache: finite, and no farther
 * from the logits computed without it than echo itself is from exact (the
 * cached KV is an earlier pass's, with that pass's rounding). */
START_TEST(test_prefix_cache_echo) {
    char err[1024];
    eng *on = open_pc("gqa4-deep", 2, ECHO_PRESET_ECHO, 0, 0, err);
    ck_assert_msg(on != NULL, "%s", err);
    eng *off = open_pc("gqa4-deep", 2, ECHO_PRESET_ECHO, 0, 1, err);
    ck_assert_msg(off != NULL, "%s", err);
    const int V = eng_model_config(on)->vocab_size;
    int32_t p[30];
    make_prompt(p, 30, V, 3);
    int r;
    free(pc_run(on, p, 21, -1, 0, &r, 0, NULL));
    float *a = pc_run(on, p, 30, -1, 0, &r, 0, NULL);
    ck_assert_int_eq(r, 20);
    float *b = pc_run(off, p, 30, -1, 0, &r, 0, NULL);
    eng *ex = open_pc("gqa4-deep", 2, ECHO_PRESET_EXACT, 0, 1, err);
    ck_assert_msg(ex != NULL, "%s", err);
    float *x = pc_run(ex, p, 30, -1, 0, &r, 0, NULL);
    for (size_t i = 0; i < (size_t)10 * V; i++)
        ck_assert(isfinite(a[i]));
    double er = tu_rel_err(a, b + (size_t)20 * V, (size_t)10 * V);
    double ee = tu_rel_err(b + (size_t)20 * V, x + (size_t)20 * V, (size_t)10 * V);
    ck_assert_msg(er > 0 && er < 2 * ee, "echo, cache vs none: relative logits error %.3g; echo vs exact %.3g", er, ee);
    free(a);
    free(b);
    free(x);
    eng_destroy(ex);
    eng_destroy(on);
    eng_destroy(off);
}
END_TEST

int main(void) {
    Suite *s = suite_create("engine");
    TCase *tp = tcase_create("tensor-parallel");
    tcase_set_timeout(tp, 600);
    tcase_add_test(tp, test_tp_exact_reproduces_tp1);
    tcase_add_test(tp, test_tp_quantized_modes_run);
    tcase_add_test(tp, test_batch_equals_alone);
    tcase_add_test(tp, test_echo_eval_deep);
    tcase_add_test(tp, test_passes_fixed_by_position);
    tcase_add_test(tp, test_passes_exact_unchanged);
    tcase_add_test(tp, test_overlap_bits);
    tcase_add_test(tp, test_oneshot_plan);
    tcase_add_test(tp, test_overlap_echo_accuracy);
    suite_add_tcase(s, tp);
    TCase *kv = tcase_create("kv-cache");
    tcase_set_timeout(kv, 120);
    tcase_add_test(kv, test_kv_paging_no_leakage);
    tcase_add_test(kv, test_kv_exhaustion_reported);
    tcase_add_test(kv, test_engine_config_errors);
    tcase_add_test(kv, test_nonfinite_logits_reported);
    tcase_add_test(kv, test_nonfinite_allreduce_no_reset);
    suite_add_tcase(s, kv);
    TCase *sm = tcase_create("sampling");
    tcase_add_test(sm, test_sampling_reproducible_and_topk1);
    tcase_add_test(sm, test_sampling_distributions);
    tcase_add_test(sm, test_sample_cands_identical);
    suite_add_tcase(s, sm);
    TCase *cd = tcase_create("candidates");
    tcase_set_timeout(cd, 600);
    tcase_add_test(cd, test_step_cands_match_full);
    tcase_add_test(cd, test_step_cands_errors_roll_back);
    tcase_add_test(cd, test_generate_cands_equals_full);
    suite_add_tcase(s, cd);
    TCase *pc = tcase_create("prefix-cache");
    tcase_set_timeout(pc, 600);
    tcase_add_test(pc, test_prefix_cache_exact);
    tcase_add_test(pc, test_prefix_cache_same_step);
    tcase_add_test(pc, test_prefix_cache_eviction);
    tcase_add_test(pc, test_prefix_cache_echo);
    tcase_add_test(pc, test_kv_types_prefix_cache_exact);
    tcase_add_test(pc, test_kv_budget);
    tcase_add_test(pc, test_gpu_kv_budget);
    tcase_add_test(pc, test_kv_touched_blocks);
    suite_add_tcase(s, pc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
