/*
 * The trained model end to end: SmolLM2-135M-Instruct, the Q4_1 GGUF that
 * `make serve` serves (scripts/fetch-model.sh; `make test` fetches it),
 * against Hugging Face transformers reading the same file with its own GGUF
 * loader (tests/fixtures/make_smollm2_reference.py): the prompt's token ids
 * from the GGUF's tokenizer, 32 greedy tokens, the first step's top-5
 * logprobs, at tp 1 and tp 3 (exact all-reduce), and the chat template;
 * with 8-bit activations (--act-quant q8_0) against the same recipe
 * applied to transformers' hidden state.
 *
 * The model path comes from $ECHO_GGUF_MODEL (make test sets it and then a
 * missing file fails); without it, the default path is tried and the test
 * is skipped, with a message, when the file is not there.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/chat.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "tests/unit/testutil.h"
#include "tokenizer/tokenizer.h"

#define DEFAULT_GGUF "build/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define REFERENCE TU_FIXTURES "/smollm2/reference.json"

static const char *model_path(void) {
    const char *p = getenv("ECHO_GGUF_MODEL");
    if (p && *p) {
        ck_assert_msg(access(p, R_OK) == 0, "$ECHO_GGUF_MODEL=%s is not readable", p);
        return p;
    }
    if (access(DEFAULT_GGUF, R_OK) == 0) return DEFAULT_GGUF;
    printf("SKIP trained-model tests: %s not found (scripts/fetch-model.sh fetches it)\n", DEFAULT_GGUF);
    return NULL;
}

typedef struct collect {
    int32_t ids[64];
    int n;
    eng_step_out first;
    int32_t first_ids[8];
    float first_lp[8];
} collect;

static int on_token(void *user, const eng_step_out *st) {
    collect *c = user;
    if (c->n == 0) {
        c->first = *st;
        for (int i = 0; i < st->n_top && i < 8; i++) {
            c->first_ids[i] = st->top_ids[i];
            c->first_lp[i] = st->top_logprobs[i];
        }
    }
    if (c->n < 64) c->ids[c->n++] = st->token;
    return 0;
}

/* tp ranks, exact all-reduce; act: 8-bit activations on the Q8_0 matrices
 * alone (ENG_ACT_Q8_0_ONLY: the Q8_0 embedding, the tied head; the Q4_1
 * layers keep their exact path, as the fixture's recipe does): then the first step's
 * top 5 is compared with the reference's first_top5_act_q8 (transformers'
 * hidden state through the same activation recipe in numpy) within
 * ACT_Q8_LP, and the greedy tokens must match HF's for at least
 * ACT_Q8_MIN_SAME tokens (measured: docs/bench-forward.md). */
#define ACT_Q8_LP 2e-4
#define ACT_Q8_MIN_SAME 24
static void check_run(const char *model, int tp, int act) {
    json_error_t je;
    json_t *ref = json_load_file(REFERENCE, 0, &je);
    ck_assert_msg(ref != NULL, "%s: %s", REFERENCE, je.text);
    char err[1024];
    tok_tokenizer *tok = NULL;
    ck_assert_msg(eng_tokenizer_load(model, &tok, NULL, err, sizeof err) == 0, "%s", err);
    eng_config c = {.model_dir = model, .tp = tp, .allreduce = ECHO_PRESET_EXACT, .threads = 2, .max_model_len = 256,
                    .max_num_seqs = 1, .act_quant = act ? ENG_ACT_Q8_0_ONLY : ENG_ACT_NONE};
    double worst = 0;
    int first_div = 1 << 30;
    eng *e = NULL;
    ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s", err);
    json_t *cases = json_object_get(ref, "cases"), *cs;
    size_t i;
    ck_assert_int_ge(json_array_size(cases), 3);
    json_array_foreach(cases, i, cs) {
        const char *prompt = json_string_value(json_object_get(cs, "prompt"));
        json_t *pids = json_object_get(cs, "prompt_ids"), *greedy = json_object_get(cs, "greedy");
        int32_t *ids = NULL;
        size_t n = 0;
        ck_assert(tok_encode(tok, prompt, strlen(prompt), 0, &ids, &n, err, sizeof err) == TOK_OK);
        ck_assert_int_eq(n, json_array_size(pids));
        for (size_t k = 0; k < n; k++)
            ck_assert_msg(ids[k] == json_integer_value(json_array_get(pids, k)), "case %zu token %zu: %d vs HF %d", i,
                          k, ids[k], (int)json_integer_value(json_array_get(pids, k)));
        collect col = {0};
        eng_gen_params gp = {.max_tokens = (int)json_array_size(greedy), .sampling = {.top_p = 1}, .ignore_eos = 1,
                             .top_logprobs = 5};
        eng_finish fin;
        ck_assert_msg(eng_generate(e, ids, (int)n, &gp, on_token, &col, &fin, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(col.n, (int)json_array_size(greedy));
        for (int t = 0; t < col.n; t++) {
            if (act && col.ids[t] != json_integer_value(json_array_get(greedy, (size_t)t))) {
                first_div = t < first_div ? t : first_div;
                break;
            }
            ck_assert_msg(col.ids[t] == json_integer_value(json_array_get(greedy, (size_t)t)),
                          "tp %d case %zu step %d: %d vs HF %d", tp, i, t, col.ids[t],
                          (int)json_integer_value(json_array_get(greedy, (size_t)t)));
        }
        json_t *top = json_object_get(cs, act ? "first_top5_act_q8" : "first_top5");
        ck_assert_int_eq(json_array_size(top), 5);
        for (size_t k = 0; k < json_array_size(top); k++) {
            json_t *pair = json_array_get(top, k);
            ck_assert_int_eq(col.first_ids[k], (int)json_integer_value(json_array_get(pair, 0)));
            double want = json_number_value(json_array_get(pair, 1)), d = fabs(col.first_lp[k] - want);
            worst = d > worst ? d : worst;
            ck_assert_msg(d < (act ? ACT_Q8_LP : 2e-4), "tp %d%s case %zu top %zu: logprob %.6f vs HF %.6f", tp,
                          act ? " act-q8" : "", i, k, col.first_lp[k], want);
        }
        free(ids);
    }
    printf("trained: tp %d%s: first-step top-5 logprobs within %.2e of the reference; greedy tokens = HF's%s%d\n", tp,
           act ? ", 8-bit activations" : "", worst, first_div < (1 << 30) ? " up to token " : ": all ",
           first_div < (1 << 30) ? first_div : 32);
    ck_assert_msg(first_div >= ACT_Q8_MIN_SAME, "act-q8: greedy diverges from HF at token %d", first_div);
    eng_destroy(e);
    tok_free(tok);
    json_decref(ref);
}

static void check_tp(const char *model, int tp) { check_run(model, tp, 0); }

START_TEST(test_smollm2_tp1) {
    const char *m = model_path();
    if (m) check_tp(m, 1);
}
END_TEST

START_TEST(test_smollm2_tp3) {
    const char *m = model_path();
    if (m) check_tp(m, 3);
}
END_TEST

START_TEST(test_smollm2_act_q8) {
    const char *m = model_path();
    if (m) {
        check_run(m, 1, 1);
        check_run(m, 3, 1);
    }
}
END_TEST

/* The GGUF's own chat template (Jinja, tokenizer.chat_template) through
 * the interpreter: SmolLM2's adds its default system turn. */
START_TEST(test_smollm2_chat_template) {
    const char *m = model_path();
    if (!m) return;
    char err[1024], *out = NULL;
    size_t len;
    tok_tokenizer *tok = NULL;
    eng_chat_template chat;
    ck_assert_msg(eng_tokenizer_load(m, &tok, &chat, err, sizeof err) == 0, "%s", err);
    ck_assert(chat.source != NULL);
    ck_assert_str_eq(chat.eos_token, "<|im_end|>");
    const char *ctx = "{\"messages\":[{\"role\":\"user\",\"content\":\"What is the capital of France?\"}],"
                      "\"add_generation_prompt\":true}";
    ck_assert_msg(eng_chat_render(&chat, ctx, &out, &len, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                          "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                          "<|im_start|>assistant\n");
    free(out);
    eng_chat_template_free(&chat);
    tok_free(tok);
}
END_TEST

int main(void) {
    Suite *s = suite_create("trained");
    TCase *tc = tcase_create("smollm2");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_smollm2_tp1);
    tcase_add_test(tc, test_smollm2_tp3);
    tcase_add_test(tc, test_smollm2_act_q8);
    tcase_add_test(tc, test_smollm2_chat_template);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
