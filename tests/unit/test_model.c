/*
 * model/ + engine/ against the independent oracle: logits and greedy
 * continuations recorded by HF transformers (tests/fixtures/make_reference.py)
 * for several tiny random Qwen3 models. Also config parsing and the
 * echo-generate CLI contract.
 */
#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/report.h"
#include "engine/sample.h"
#include "engine/step.h" /* the step runner: a whole pass of a model */
#include "kernels/kernels.h"
#include "model/model.h"
#include "tests/unit/testutil.h"

#define MODELS_DIR TU_FIXTURES "/models"
#define MAX_MODELS 32

/* ---- reference fixtures ---- */

typedef struct ref_prompt {
    int n_prompt, n_greedy;
    int32_t *prompt, *greedy;
    const float *logits; /* rows × vocab */
    int rows, first_pos;
} ref_prompt;

typedef struct ref_model {
    char dir[512];
    int vocab;
    int n_prompts;
    ref_prompt *p;
    char *bin; /* whole reference.bin */
    json_t *json;
} ref_model;

static int32_t *json_ids(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *ids = malloc((size_t)(*n ? *n : 1) * sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return ids;
}

/* `model` is a fixture folder, or the model.gguf inside one. */
static void ref_load(const char *model, ref_model *r) {
    char path[1024], dir[512];
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s", model);
    snprintf(dir, sizeof dir, "%s", model);
    size_t dl = strlen(dir);
    if (dl > 11 && !strcmp(dir + dl - 11, "/model.gguf")) dir[dl - 11] = 0;
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_error_t je;
    r->json = json_load_file(path, 0, &je);
    ck_assert_msg(r->json != NULL, "%s: %s", path, je.text);
    r->vocab = (int)json_integer_value(json_object_get(r->json, "vocab_size"));
    snprintf(path, sizeof path, "%s/reference.bin", dir);
    size_t len;
    r->bin = tu_read_file(path, &len);
    ck_assert_msg(r->bin && len >= 16 && memcmp(r->bin, "ECHR", 4) == 0, "%s: bad header", path);
    uint32_t ver;
    uint64_t nfl;
    memcpy(&ver, r->bin + 4, 4);
    memcpy(&nfl, r->bin + 8, 8);
    ck_assert_uint_eq(ver, 1);
    ck_assert_uint_eq(len, 16 + nfl * 4);
    const float *data = (const float *)(r->bin + 16);
    json_t *ps = json_object_get(r->json, "prompts");
    r->n_prompts = (int)json_array_size(ps);
    ck_assert_int_ge(r->n_prompts, 4);
    r->p = calloc((size_t)r->n_prompts, sizeof *r->p);
    for (int i = 0; i < r->n_prompts; i++) {
        json_t *e = json_array_get(ps, (size_t)i);
        ref_prompt *p = &r->p[i];
        p->prompt = json_ids(json_object_get(e, "prompt"), &p->n_prompt);
        p->greedy = json_ids(json_object_get(e, "greedy"), &p->n_greedy);
        p->rows = (int)json_integer_value(json_object_get(e, "logits_rows"));
        p->first_pos = (int)json_integer_value(json_object_get(e, "logits_first_position"));
        uint64_t off = (uint64_t)json_integer_value(json_object_get(e, "logits_offset"));
        ck_assert_uint_le(off + (uint64_t)p->rows * r->vocab, nfl);
        p->logits = data + off;
        ck_assert_int_eq(p->n_greedy, 32);
    }
}

static void ref_free(ref_model *r) {
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->p[i].prompt);
        free(r->p[i].greedy);
    }
    free(r->p);
    free(r->bin);
    json_decref(r->json);
}

static int list_models(char names[][256]) {
    DIR *d = opendir(MODELS_DIR);
    ck_assert_msg(d != NULL, "cannot open %s", MODELS_DIR);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_MODELS) {
        char p[1280];
        snprintf(p, sizeof p, "%s/%s/reference.json", MODELS_DIR, e->d_name);
        FILE *f = fopen(p, "r");
        if (!f) continue;
        fclose(f);
        if (strlen(e->d_name) > 200) continue;
        /* a GGUF fixture is its model.gguf, opened as a file */
        snprintf(p, sizeof p, "%s/%s/model.gguf", MODELS_DIR, e->d_name);
        int gguf = access(p, F_OK) == 0;
        snprintf(names[n++], 256, "%s/%.200s%s", MODELS_DIR, e->d_name, gguf ? "/model.gguf" : "");
    }
    closedir(d);
    return n;
}

static eng *open_engine(const char *dir, int tp, echo_preset mode, int max_len) {
    char err[1024];
    eng_config c = {.model_dir = dir, .tp = tp, .allreduce = mode, .threads = 2, .max_model_len = max_len,
                    .max_num_seqs = 4};
    eng *e;
    ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s: %s", dir, err);
    return e;
}

/* Full forward over prompt + greedy continuation in one step; returns
 * (n, vocab) logits for every position. */
static float *full_forward(eng *e, const ref_prompt *p, int vocab) {
    char err[1024];
    int n = p->n_prompt + p->n_greedy, seq;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    memcpy(ids, p->prompt, (size_t)p->n_prompt * sizeof *ids);
    if (p->n_greedy) memcpy(ids + p->n_prompt, p->greedy, (size_t)p->n_greedy * sizeof *ids);
    ck_assert(eng_seq_new(e, &seq, err, sizeof err) == 0);
    float *all = malloc((size_t)n * vocab * sizeof *all);
    eng_item it = {seq, ids, n, ENG_LOGITS_ALL};
    ck_assert_msg(eng_step(e, &it, 1, all, err, sizeof err) == 0, "%s", err);
    eng_seq_free(e, seq);
    free(ids);
    return all;
}

/* ---- oracle tests ---- */

START_TEST(test_fixtures_present) {
    char names[MAX_MODELS][256];
    int n = list_models(names);
    /* make_reference.py writes seven Qwen3, four Llama and a Qwen2 model,
     * make_gguf_models.py two GGUF ones; fewer means fixtures are missing. */
    ck_assert_int_ge(n, 14);
    int gguf = 0;
    for (int i = 0; i < n; i++) gguf += strstr(names[i], ".gguf") != NULL;
    ck_assert_int_eq(gguf, 2);
}
END_TEST

START_TEST(test_logits_match_reference) {
    char names[MAX_MODELS][256];
    int nm = list_models(names);
    for (int mi = 0; mi < nm; mi++) {
        ref_model r;
        ref_load(names[mi], &r);
        eng *e = open_engine(names[mi], 1, ECHO_PRESET_EXACT, 64);
        ck_assert_int_eq(eng_model_config(e)->vocab_size, r.vocab);
        double worst = 0;
        for (int i = 0; i < r.n_prompts; i++) {
            const ref_prompt *p = &r.p[i];
            float *all = full_forward(e, p, r.vocab);
            double er = tu_rel_err(all + (size_t)p->first_pos * r.vocab, p->logits, (size_t)p->rows * r.vocab);
            ck_assert_msg(er <= 1e-4, "%s prompt %d: relative logits error %.3g > 1e-4", names[mi], i, er);
            worst = er > worst ? er : worst;
            free(all);
        }
        printf("oracle: %-36s worst relative logits error %.2e over %d prompts\n", names[mi], worst, r.n_prompts);
        eng_destroy(e);
        ref_free(&r);
    }
}
END_TEST

static int collect_tokens(void *user, const eng_step_out *st) {
    int32_t **cur = user;
    *(*cur)++ = st->token;
    return 0;
}

START_TEST(test_greedy_matches_reference) {
    char names[MAX_MODELS][256];
    int nm = list_models(names);
    for (int mi = 0; mi < nm; mi++) {
        ref_model r;
        ref_load(names[mi], &r);
        eng *e = open_engine(names[mi], 1, ECHO_PRESET_EXACT, 64);
        for (int i = 0; i < r.n_prompts; i++) {
            const ref_prompt *p = &r.p[i];
            int32_t out[64], *cur = out;
            char err[1024];
            eng_gen_params gp = {.max_tokens = p->n_greedy, .sampling = {.top_p = 1}, .ignore_eos = 1};
            eng_finish fin;
            ck_assert_msg(eng_generate(e, p->prompt, p->n_prompt, &gp, collect_tokens, &cur, &fin, err, sizeof err) == 0,
                          "%s", err);
            ck_assert_int_eq((int)(cur - out), p->n_greedy);
            for (int t = 0; t < p->n_greedy; t++)
                ck_assert_msg(out[t] == p->greedy[t], "%s prompt %d: step %d got %d, reference %d", names[mi], i, t,
                              out[t], p->greedy[t]);
        }
        eng_destroy(e);
        ref_free(&r);
    }
}
END_TEST

/* Prefill + one-token decode steps must give the logits of a full
 * recomputation: this is what catches KV-cache position or layout bugs. */
START_TEST(test_decode_equals_full_recompute) {
    char names[MAX_MODELS][256];
    int nm = list_models(names);
    for (int mi = 0; mi < nm; mi++) {
        ref_model r;
        ref_load(names[mi], &r);
        for (int i = 0; i < r.n_prompts; i++) {
            const ref_prompt *p = &r.p[i];
            int n = p->n_prompt + p->n_greedy, seq;
            /* the sequence limit is exactly n, so the last check can overflow it */
            eng *e = open_engine(names[mi], 1, ECHO_PRESET_EXACT, n);
            float *all = full_forward(e, p, r.vocab);
            float *step = malloc((size_t)r.vocab * sizeof *step);
            char err[1024];
            ck_assert(eng_seq_new(e, &seq, err, sizeof err) == 0);
            eng_item it = {seq, p->prompt, p->n_prompt, ENG_LOGITS_LAST};
            ck_assert_msg(eng_step(e, &it, 1, step, err, sizeof err) == 0, "%s", err);
            double er = tu_rel_err(step, all + (size_t)(p->n_prompt - 1) * r.vocab, (size_t)r.vocab);
            ck_assert_msg(er <= 1e-5, "%s prompt %d: prefill last row error %.3g", names[mi], i, er);
            for (int t = 0; t < p->n_greedy; t++) {
                it = (eng_item){seq, &p->greedy[t], 1, ENG_LOGITS_LAST};
                ck_assert_msg(eng_step(e, &it, 1, step, err, sizeof err) == 0, "%s", err);
                er = tu_rel_err(step, all + (size_t)(p->n_prompt + t) * r.vocab, (size_t)r.vocab);
                ck_assert_msg(er <= 1e-5, "%s prompt %d: decode step %d error %.3g > 1e-5", names[mi], i, t, er);
            }
            ck_assert_int_eq(eng_seq_len(e, seq), n);
            /* The sequence is full: one more token must be refused, not written. */
            it = (eng_item){seq, &p->greedy[0], 1, ENG_LOGITS_LAST};
            ck_assert(eng_step(e, &it, 1, step, err, sizeof err) != 0);
            ck_assert_msg(strstr(err, "max model length") != NULL, "%s", err);
            ck_assert_int_eq(eng_seq_len(e, seq), n);
            eng_destroy(e);
            free(step);
            free(all);
        }
        ref_free(&r);
    }
}
END_TEST

/* ---- config parsing ---- */

static const char *BASE_CFG =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":100,\"hidden_size\":64,"
    "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":2,\"head_dim\":32,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000,"
    "\"tie_word_embeddings\":true,\"eos_token_id\":99%s}";

static int parse_with(const char *extra, const char *gen, model_config *c, char *err) {
    char buf[2048];
    snprintf(buf, sizeof buf, BASE_CFG, extra);
    return model_config_parse(buf, gen, c, err, 512);
}

START_TEST(test_config_fields) {
    model_config c;
    char err[512];
    ck_assert_msg(parse_with("", "{\"eos_token_id\":[98,99]}", &c, err) == 0, "%s", err);
    ck_assert_int_eq(c.head_dim, 32); /* honoured even though 4*32 != 64 */
    ck_assert_int_eq(c.num_kv_heads, 2);
    ck_assert(c.tie_word_embeddings);
    ck_assert(fabs(c.rope.theta - 1e6) < 1e-9);
    ck_assert_int_eq(c.rope.type, KERN_ROPE_DEFAULT);
    ck_assert_int_eq(c.n_eos, 2);
    ck_assert_int_eq(c.eos_ids[0], 99);
    ck_assert_int_eq(c.eos_ids[1], 98);
    /* transformers 5 keeps rope_theta inside rope_parameters */
    char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
             "\"num_hidden_layers\":1,\"num_attention_heads\":2,"
             "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":5000.0}}");
    ck_assert_msg(model_config_parse(buf, NULL, &c, err, sizeof err) == 0, "%s", err);
    ck_assert(fabs(c.rope.theta - 5000.0) < 1e-9);
    ck_assert_int_eq(c.head_dim, 4);     /* default hidden / heads */
    ck_assert_int_eq(c.num_kv_heads, 2); /* default = heads */
    ck_assert(!c.tie_word_embeddings);
}
END_TEST

/* Llama 3.1's rope scaling as transformers 4.x writes it (rope_scaling,
 * top-level rope_theta) and as 5.x does (rope_parameters); rope_scaling
 * wins when both are present, as in transformers 5. Refusals: test_config_errors. */
START_TEST(test_config_rope_llama3) {
    model_config c;
    char err[512];
    const char *forms[] = {
        ",\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,"
        "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}",
        ",\"rope_theta\":7,\"rope_parameters\":{\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
        "\"original_max_position_embeddings\":8192,\"rope_theta\":500000.0,\"rope_type\":\"llama3\"}",
        ",\"rope_theta\":500000.0,\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":3.0},"
        "\"rope_scaling\":{\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
        "\"original_max_position_embeddings\":8192,\"type\":\"llama3\"}",
    };
    for (size_t i = 0; i < sizeof forms / sizeof *forms; i++) {
        ck_assert_msg(parse_with(forms[i], NULL, &c, err) == 0, "form %zu: %s", i, err);
        ck_assert_int_eq(c.rope.type, KERN_ROPE_LLAMA3);
        ck_assert(c.rope.theta == 500000.0 && c.rope.factor == 8.0 && c.rope.low_freq_factor == 1.0);
        ck_assert(c.rope.high_freq_factor == 4.0 && c.rope.original_max_position_embeddings == 8192.0);
    }
    /* original_max_position_embeddings defaults to max_position_embeddings (transformers 5) */
    ck_assert_msg(parse_with(",\"max_position_embeddings\":4096,\"rope_scaling\":{\"rope_type\":\"llama3\","
                             "\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4}",
                             NULL, &c, err) == 0,
                  "%s", err);
    ck_assert(c.rope.original_max_position_embeddings == 4096.0 && c.rope.theta == 1e6);
}
END_TEST

/* YaRN as Qwen's model card writes it ("type": "yarn" in rope_scaling) and
 * as transformers 5 does (rope_parameters), with HF's defaults (beta_fast
 * 32, beta_slow 1, truncate, attention factor 0.1 ln(factor) + 1, which
 * for factor 4 is 1.1386294361119891) and the context lengthened to
 * original x factor (vLLM's rule); the optional keys; --rope-scaling. */
START_TEST(test_config_rope_yarn) {
    model_config c;
    char err[512];
    const char *forms[] = {
        ",\"max_position_embeddings\":40960,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0,"
        "\"original_max_position_embeddings\":32768}",
        ",\"max_position_embeddings\":40960,\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4,"
        "\"original_max_position_embeddings\":32768,\"rope_theta\":1000000}",
    };
    for (size_t i = 0; i < sizeof forms / sizeof *forms; i++) {
        ck_assert_msg(parse_with(forms[i], NULL, &c, err) == 0, "form %zu: %s", i, err);
        ck_assert_int_eq(c.rope.type, KERN_ROPE_YARN);
        ck_assert(c.rope.theta == 1e6 && c.rope.factor == 4.0 && c.rope.original_max_position_embeddings == 32768.0);
        ck_assert(c.rope.beta_fast == 32 && c.rope.beta_slow == 1 && c.rope.truncate == 1);
        ck_assert_msg(fabs(c.rope.attention_factor - 1.1386294361119891) < 1e-15, "%.17g", c.rope.attention_factor);
        ck_assert_int_eq(c.max_position_embeddings, 131072);
    }
    /* mscale / mscale_all_dim: (0.1*1*ln 8 + 1) / (0.1*0.5*ln 8 + 1) = 1.2079441541679836 / 1.1039720770839918 */
    ck_assert_msg(parse_with(",\"max_position_embeddings\":128,\"rope_scaling\":{\"rope_type\":\"yarn\","
                             "\"factor\":8,\"original_max_position_embeddings\":16,\"beta_fast\":16,\"beta_slow\":2,"
                             "\"mscale\":1,\"mscale_all_dim\":0.5,\"truncate\":false}",
                             NULL, &c, err) == 0,
                  "%s", err);
    ck_assert(c.rope.beta_fast == 16 && c.rope.beta_slow == 2 && c.rope.truncate == 0);
    ck_assert_msg(fabs(c.rope.attention_factor - 1.2079441541679836 / 1.1039720770839918) < 1e-15, "%.17g",
                  c.rope.attention_factor);
    /* an explicit attention_factor wins; no factor: max_position_embeddings / original */
    ck_assert(parse_with(",\"max_position_embeddings\":1000,\"rope_scaling\":{\"rope_type\":\"yarn\","
                         "\"original_max_position_embeddings\":250,\"attention_factor\":0.75}",
                         NULL, &c, err) == 0);
    ck_assert(c.rope.factor == 4.0 && c.rope.attention_factor == 0.75);
    /* --rope-scaling on a config without scaling (Qwen3-8B's: 40960 positions, theta 1e6) */
    ck_assert(parse_with(",\"max_position_embeddings\":40960", NULL, &c, err) == 0);
    ck_assert_int_eq(c.rope.type, KERN_ROPE_DEFAULT);
    ck_assert_msg(model_config_rope_override(&c, "yarn:4:32768", err, sizeof err) == 0, "%s", err);
    ck_assert(c.rope.type == KERN_ROPE_YARN && c.rope.factor == 4 && c.rope.theta == 1e6);
    ck_assert(c.rope.original_max_position_embeddings == 32768 && c.max_position_embeddings == 131072);
    ck_assert(parse_with(",\"max_position_embeddings\":40960", NULL, &c, err) == 0);
    ck_assert(model_config_rope_override(&c, "{\"rope_type\":\"yarn\",\"factor\":2,\"beta_fast\":8}", err,
                                         sizeof err) == 0);
    ck_assert(c.rope.factor == 2 && c.rope.beta_fast == 8 && c.rope.original_max_position_embeddings == 40960);
    ck_assert_int_eq(c.max_position_embeddings, 81920);
    ck_assert(model_config_rope_override(&c, "none", err, sizeof err) == 0 && c.rope.type == KERN_ROPE_DEFAULT);
    ck_assert(model_config_rope_override(&c, NULL, err, sizeof err) == 0);
    static const char *const bad[][2] = {{"yarn", "expected none, yarn:FACTOR"},
                                         {"yarn:4x", "expected none"},
                                         {"yarn:0.5", "yarn needs factor >= 1"},
                                         {"{\"rope_type\":\"dynamic\"}", "'dynamic' is not supported"},
                                         {"{oops", "not a JSON object"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_msg(model_config_rope_override(&c, bad[i][0], err, sizeof err) != 0, "%s accepted", bad[i][0]);
        ck_assert_msg(strstr(err, "--rope-scaling") && strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
}
END_TEST

/* YaRN in GGUF metadata as gguf-py's writers put it (make_gguf_fixtures.py
 * --yarn-only): factor 4 over 32,768, beta 16 / 2, attn_factor 0.5, which
 * llama.cpp multiplies into 0.1 ln 4 + 1; the context becomes 131,072. No
 * factor, or another scaling type: refused by name. */
START_TEST(test_config_gguf_yarn) {
    char path[512], err[512];
    weights_set *ws;
    model_config c;
    snprintf(path, sizeof path, "%s/gguf/yarn-ok.gguf", TU_FIXTURES);
    ck_assert_msg(weights_open(path, &ws, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(model_config_from_gguf(ws, &c, err, sizeof err) == 0, "%s", err);
    weights_close(ws);
    ck_assert_int_eq(c.rope.type, KERN_ROPE_YARN);
    ck_assert(c.rope.theta == 1e6 && c.rope.factor == 4 && c.rope.original_max_position_embeddings == 32768);
    ck_assert(c.rope.beta_fast == 16 && c.rope.beta_slow == 2 && c.rope.truncate == 1);
    ck_assert_msg(fabs(c.rope.attention_factor - 0.5 * 1.1386294361119891) < 1e-15, "%.17g", c.rope.attention_factor);
    ck_assert_int_eq(c.max_position_embeddings, 131072);
    static const char *const bad[][2] = {{"yarn-nofactor", "rope.scaling.factor"}, {"yarn-longrope", "'longrope'"}};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/gguf/%s.gguf", TU_FIXTURES, bad[i][0]);
        ck_assert_msg(weights_open(path, &ws, err, sizeof err) == 0, "%s", err);
        ck_assert(model_config_from_gguf(ws, &c, err, sizeof err) != 0);
        weights_close(ws);
        ck_assert_msg(strstr(err, bad[i][1]) != NULL, "%s: %s", bad[i][0], err);
    }
}
END_TEST

/* The YaRN fixtures (transformers' own YaRN, positions past the original
 * context) at tp 2: each rank rotates its heads with the same
 * frequencies and attention factor. tp 1 is test_logits_match_reference. */
START_TEST(test_yarn_reference_tp2) {
    static const char *const names[] = {"qwen3-yarn", "llama-yarn"};
    for (size_t mi = 0; mi < 2; mi++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", MODELS_DIR, names[mi]);
        ref_model r;
        ref_load(dir, &r);
        eng *e = open_engine(dir, 2, ECHO_PRESET_EXACT, 64);
        ck_assert_int_eq(eng_model_config(e)->rope.type, KERN_ROPE_YARN);
        double worst = 0;
        for (int i = 0; i < r.n_prompts; i++) {
            const ref_prompt *p = &r.p[i];
            ck_assert_int_gt(p->n_prompt + p->n_greedy, (int)eng_model_config(e)->rope.original_max_position_embeddings);
            float *all = full_forward(e, p, r.vocab);
            double er = tu_rel_err(all + (size_t)p->first_pos * r.vocab, p->logits, (size_t)p->rows * r.vocab);
            ck_assert_msg(er <= 1e-4, "%s tp 2 prompt %d: relative logits error %.3g > 1e-4", names[mi], i, er);
            worst = er > worst ? er : worst;
            free(all);
        }
        printf("oracle tp 2: %-24s worst relative logits error %.2e over %d prompts\n", names[mi], worst, r.n_prompts);
        eng_destroy(e);
        ref_free(&r);
    }
}
END_TEST

/* --rope-scaling reaches every rank's model (eng_config.rope_scaling ->
 * model_load): the qwen3-yarn fixture's weights in a folder whose
 * config.json has no scaling, run with "yarn:4:32", give transformers'
 * YaRN logits at tp 1 and 2; "none" on the fixture itself takes the
 * scaling away (the logits move far from the reference). */
static double yarn_worst(const char *dir, const char *spec, int tp, const ref_model *r) {
    char err[1024];
    eng_config c = {.model_dir = dir, .tp = tp, .allreduce = ECHO_PRESET_EXACT, .threads = 2, .max_model_len = 64,
                    .max_num_seqs = 4, .rope_scaling = spec};
    eng *e;
    ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s: %s", dir, err);
    ck_assert_int_eq(eng_model_config(e)->rope.type, strcmp(spec, "none") ? KERN_ROPE_YARN : KERN_ROPE_DEFAULT);
    double worst = 0;
    for (int i = 0; i < r->n_prompts; i++) {
        const ref_prompt *p = &r->p[i];
        float *all = full_forward(e, p, r->vocab);
        double er = tu_rel_err(all + (size_t)p->first_pos * r->vocab, p->logits, (size_t)p->rows * r->vocab);
        worst = er > worst ? er : worst;
        free(all);
    }
    eng_destroy(e);
    return worst;
}

START_TEST(test_rope_scaling_override) {
    char src[512], tmp[] = "/tmp/echo-yarn-XXXXXX", path[1024], target[1024];
    snprintf(src, sizeof src, "%s/qwen3-yarn", MODELS_DIR);
    ck_assert_ptr_nonnull(mkdtemp(tmp));
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(cfg);
    json_object_del(cfg, "rope_scaling");
    json_object_set_new(cfg, "rope_parameters", json_pack("{s:s,s:f}", "rope_type", "default", "rope_theta", 10000.0));
    snprintf(path, sizeof path, "%s/config.json", tmp);
    ck_assert_int_eq(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
    static const char *const links[] = {"model.safetensors", "generation_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(target, sizeof target, "%s/%s", src, links[i]);
        char *abs = realpath(target, NULL);
        snprintf(path, sizeof path, "%s/%s", tmp, links[i]);
        ck_assert_int_eq(symlink(abs, path), 0);
        free(abs);
    }
    ref_model r;
    ref_load(src, &r);
    double plain = yarn_worst(src, "none", 1, &r);
    ck_assert_msg(plain > 1e-2, "without its scaling the fixture is only %.3g away", plain);
    for (int tp = 1; tp <= 2; tp++) {
        double er = yarn_worst(tmp, "yarn:4:32", tp, &r);
        printf("--rope-scaling yarn:4:32 on a config without scaling, tp %d: worst relative logits error %.2e "
               "(none: %.2e)\n", tp, er, plain);
        ck_assert_msg(er <= 1e-4, "tp %d: relative logits error %.3g > 1e-4", tp, er);
    }
    ref_free(&r);
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp, links[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/config.json", tmp);
    unlink(path);
    rmdir(tmp);
}
END_TEST

/* model_pass_sites: Megatron tensor parallelism leaves two row-parallel
 * projections per decoder layer in each of these families (HF's
 * self_attn.o_proj and mlp.down_proj), so two all-reduces per layer. */
START_TEST(test_pass_sites) {
    const char *archs[] = {"Qwen3ForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM"};
    char buf[1024], err[512];
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++) {
        model_config c;
        snprintf(buf, sizeof buf,
                 "{\"architectures\":[\"%s\"],\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
                 "\"num_hidden_layers\":3,\"num_attention_heads\":2}",
                 archs[i]);
        ck_assert_msg(model_config_parse(buf, NULL, &c, err, sizeof err) == 0, "%s: %s", archs[i], err);
        ck_assert_int_eq(model_pass_sites(&c), 6);
    }
    model_config r;
    ck_assert_msg(model_random_parse("random:tiny,layers=5", &r, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(model_pass_sites(&r), 10);
    model_config none = {.num_layers = 4}; /* no family: no pass */
    ck_assert_int_eq(model_pass_sites(&none), -1);
    none.arch = "mistral";
    ck_assert_int_eq(model_pass_sites(&none), -1);
    ck_assert_int_eq(model_pass_sites(NULL), -1);
}
END_TEST

START_TEST(test_config_errors) {
    model_config c;
    char err[512];
    struct {
        const char *json, *expect;
    } cases[] = {
        {"{\"architectures\":[\"MistralForCausalLM\"],\"vocab_size\":10}", "MistralForCausalLM"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":8}", "vocab_size"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],", "malformed JSON"},
        {"[1,2]", "malformed JSON"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":\"big\"}", "vocab_size"},
        {"{\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":-5}", "vocab_size"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ck_assert_msg(model_config_parse(cases[i].json, NULL, &c, err, sizeof err) != 0, "case %zu accepted", i);
        ck_assert_msg(strstr(err, cases[i].expect), "case %zu: '%s' lacks '%s'", i, err, cases[i].expect);
    }
    struct {
        const char *extra, *expect;
    } bad[] = {
        {",\"attention_bias\":true", "attention_bias"},
        {",\"use_sliding_window\":true", "sliding_window"},
        {",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":0.5}", "yarn needs factor >= 1"},
        {",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":\"4\"}", "rope_scaling.factor must be a number"},
        {",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,\"truncate\":1}", "truncate must be a boolean"},
        {",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,\"attention_factor\":-1}", "positive attention"},
        /* rope: llama3 with bad parameters, other types by name */
        {",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"high_freq_factor\":4}", "low_freq_factor"},
        {",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,\"high_freq_factor\":4}",
         "llama3 needs"},
        {",\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":0.5,\"low_freq_factor\":1,"
         "\"high_freq_factor\":4}",
         "rope_parameters: llama3 needs factor >= 1"},
        {",\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2}", "'dynamic'"},
        {",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}", "'linear'"},
        {",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4,\"beta_fast\":-2}", "rope_parameters: yarn needs"},
        {",\"rope_parameters\":{\"rope_type\":\"longrope\"}", "'longrope'"},
        {",\"hidden_act\":\"gelu\"", "gelu"},
        {",\"num_key_value_heads\":3", "multiple"},
        {",\"head_dim\":33", "even"},
        {",\"rms_norm_eps\":0", "rms_norm_eps"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        /* duplicate keys: the later value wins in jansson, which is what we test */
        ck_assert_msg(parse_with(bad[i].extra, NULL, &c, err) != 0, "bad case %zu accepted", i);
        ck_assert_msg(strstr(err, bad[i].expect), "bad case %zu: '%s' lacks '%s'", i, err, bad[i].expect);
    }
    ck_assert(parse_with("", "{\"eos_token_id\":[100]}", &c, err) != 0);
    ck_assert_ptr_nonnull(strstr(err, "eos_token_id"));
    ck_assert(model_config_load("/nonexistent-dir", &c, err, sizeof err) != 0);
    ck_assert_ptr_nonnull(strstr(err, "config.json"));
}
END_TEST

/* A config that disagrees with the weights must fail naming the tensor. */
START_TEST(test_shape_mismatch_names_tensor) {
    char *dir = tu_mkdtemp();
    char path[1024], cmd[2048], err[1024];
    snprintf(cmd, sizeof cmd,
             "cp %s/tied/model.safetensors %s/ && sed 's/\"intermediate_size\": *[0-9]*/\"intermediate_size\": 96/' "
             "%s/tied/config.json > %s/config.json",
             MODELS_DIR, dir, MODELS_DIR, dir);
    ck_assert_int_eq(system(cmd), 0);
    eng_config c = {.model_dir = dir, .tp = 1, .threads = 1};
    eng *e = NULL;
    ck_assert(eng_create(&c, &e, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "mlp.gate_proj.weight") != NULL, "%s", err);
    /* and a missing weights file is named too */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(remove(path), 0);
    ck_assert(eng_create(&c, &e, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "model.safetensors") != NULL, "%s", err);
    tu_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- engine helpers ---- */

START_TEST(test_log_softmax_and_top_k) {
    float lg[6] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 2.0f};
    double lp[6], sum = 0;
    eng_log_softmax(lg, 6, lp);
    for (int i = 0; i < 6; i++) sum += exp(lp[i]);
    ck_assert(fabs(sum - 1.0) < 1e-12);
    ck_assert(fabs((lp[1] - lp[0]) - 2.0) < 1e-12);
    int32_t ids[6];
    ck_assert_int_eq(eng_top_k(lp, 6, 4, ids), 4);
    ck_assert_int_eq(ids[0], 1); /* tie 1 vs 2: lower id first */
    ck_assert_int_eq(ids[1], 2);
    ck_assert_int_eq(ids[2], 5);
    ck_assert_int_eq(ids[3], 0);
    ck_assert_int_eq(eng_top_k(lp, 6, 0, ids), 0);
    ck_assert_int_eq(eng_top_k(lp, 6, 10, ids), 6);
    ck_assert_int_eq(ids[5], 3);
}
END_TEST

/* ---- echo-generate CLI contract ---- */

static const char *bin_dir(void) {
    const char *b = getenv("ECHO_BIN");
    return b ? b : "bin";
}

START_TEST(test_cli_json_matches_reference) {
    char names[MAX_MODELS][256];
    int nm = list_models(names);
    for (int mi = 0; mi < nm; mi++) {
        ref_model r;
        ref_load(names[mi], &r);
        const ref_prompt *p = &r.p[r.n_prompts - 1];
        char cmd[16384], ids[4096] = "";
        size_t o = 0;
        for (int i = 0; i < p->n_prompt; i++)
            o += (size_t)snprintf(ids + o, sizeof ids - o, "%s%d", i ? "," : "", p->prompt[i]);
        snprintf(cmd, sizeof cmd,
                 "%s/echo-generate --model %s --prompt-tokens %s --max-tokens 32 --temperature 0 "
                 "--top-logprobs 5 --ignore-eos --json --threads 2 --act-quant none --kv-cache-dtype fp32",
                 bin_dir(), names[mi], ids);
        int st;
        char *out = tu_run(cmd, &st);
        ck_assert_msg(st == 0 && out, "%s failed (%d)", cmd, st);
        json_error_t je;
        json_t *root = json_loads(out, 0, &je);
        ck_assert_msg(root != NULL, "bad JSON: %s", je.text);
        json_t *toks = json_object_get(root, "tokens"), *steps = json_object_get(root, "steps");
        ck_assert_int_eq((int)json_array_size(json_object_get(root, "prompt_tokens")), p->n_prompt);
        ck_assert_int_eq((int)json_array_size(toks), 32);
        ck_assert_int_eq((int)json_array_size(steps), 32);
        for (int t = 0; t < 32; t++)
            ck_assert_int_eq(json_integer_value(json_array_get(toks, (size_t)t)), p->greedy[t]);
        /* logprobs of the first step against log_softmax of the reference
         * logits at the last prompt position */
        int row = p->n_prompt - 1 - p->first_pos;
        double *lp = malloc((size_t)r.vocab * sizeof *lp);
        eng_log_softmax(p->logits + (size_t)row * r.vocab, r.vocab, lp);
        json_t *s0 = json_array_get(steps, 0);
        ck_assert(fabs(json_real_value(json_object_get(s0, "logprob")) - lp[p->greedy[0]]) < 1e-3);
        json_t *top = json_object_get(s0, "top_logprobs");
        ck_assert_int_eq((int)json_array_size(top), 5);
        double prev = 1;
        for (size_t k = 0; k < 5; k++) {
            json_t *pair = json_array_get(top, k);
            int id = (int)json_integer_value(json_array_get(pair, 0));
            double v = json_real_value(json_array_get(pair, 1));
            ck_assert(v <= prev);
            ck_assert(fabs(v - lp[id]) < 1e-3);
            prev = v;
        }
        ck_assert_int_eq(json_integer_value(json_array_get(json_array_get(top, 0), 0)), p->greedy[0]);
        free(lp);
        json_decref(root);
        free(out);
        ref_free(&r);
    }
}
END_TEST

START_TEST(test_cli_usage_errors) {
    char cmd[1024];
    int st;
    const char *bad[] = {
        "--bogus", "--model", "--model X --prompt-tokens 1,a", "--model X --prompt-tokens 1 --max-tokens -1",
        "--model X --prompt-tokens 1 --temperature nan", "--model X --prompt-tokens 1 --device tpu",
        "--model X --prompt-tokens 1 --top-logprobs 65", "--prompt-tokens 1",
        "--model X --prompt-tokens 1 --tp 0", "--model X --prompt-tokens 1 --allreduce fp8",
        "--model X --chat", "--model X --prompt-tokens 1 --prompt hi", "--model X --prompt-tokens 1 --chat",
        "--model X --prompt hi --no-thinking", "--model X --prompt-tokens 1 --transport pigeon",
        "--model X --prompt-tokens 1 --transport",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cmd, sizeof cmd, "%s/echo-generate %s 2>&1", bin_dir(), bad[i]);
        free(tu_run(cmd, &st));
        ck_assert_msg(st == 2, "'%s' exited %d, want 2", bad[i], st);
    }
    snprintf(cmd, sizeof cmd, "%s/echo-generate --help", bin_dir());
    char *help = tu_run(cmd, &st);
    ck_assert_int_eq(st, 0);
    const char *flags[] = {"--model", "--prompt-tokens", "--max-tokens", "--temperature", "--top-logprobs",
                           "--ignore-eos", "--json", "--seed", "--device", "--tp", "--allreduce", "--prompt",
                           "--chat", "--threads", "--tokenizer", "--no-thinking", "--transport", "--cuda-graphs"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) ck_assert_msg(strstr(help, flags[i]), "%s", flags[i]);
    free(help);
    /* runtime errors: exit 1 with a message */
    snprintf(cmd, sizeof cmd, "%s/echo-generate --model /nonexistent --prompt-tokens 1 2>&1", bin_dir());
    char *o = tu_run(cmd, &st);
    ck_assert_int_eq(st, 1);
    ck_assert_ptr_nonnull(strstr(o, "config.json"));
    free(o);
    snprintf(cmd, sizeof cmd, "%s/echo-generate --model %s/tied --prompt-tokens 1,384 2>&1", bin_dir(), MODELS_DIR);
    o = tu_run(cmd, &st);
    ck_assert_int_eq(st, 1);
    ck_assert_ptr_nonnull(strstr(o, "out of range"));
    free(o);
}
END_TEST

/* --prompt/--chat go through the tokenizer; expected ids were produced by
 * HF tokenizers / transformers.apply_chat_template on the same files. */
static json_t *run_json(const char *args) {
    char cmd[4096];
    int st;
    snprintf(cmd, sizeof cmd, "%s/echo-generate --model %s/realvocab --tokenizer %s/tokenizer/qwen3 %s --json", bin_dir(),
             MODELS_DIR, TU_FIXTURES, args);
    char *out = tu_run(cmd, &st);
    ck_assert_msg(st == 0 && out, "%s exited %d", cmd, st);
    json_t *root = json_loads(out, 0, NULL);
    ck_assert_msg(root != NULL, "not JSON: %s", out);
    free(out);
    return root;
}

static void assert_ids(json_t *arr, const int32_t *want, size_t n) {
    ck_assert_int_eq(json_array_size(arr), n);
    for (size_t i = 0; i < n; i++) ck_assert_int_eq(json_integer_value(json_array_get(arr, i)), want[i]);
}

START_TEST(test_cli_text_prompt_and_chat) {
    static const int32_t hello[] = {9707, 11, 1879};
    json_t *r = run_json("--prompt 'Hello, world' --max-tokens 4 --ignore-eos");
    assert_ids(json_object_get(r, "prompt_tokens"), hello, 3);
    ck_assert_int_eq(json_array_size(json_object_get(r, "tokens")), 4);
    ck_assert(json_is_string(json_object_get(r, "text")));
    json_decref(r);
    static const int32_t chat[] = {151644, 872, 198, 13048, 1052, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271};
    r = run_json("--chat --no-thinking --prompt 'Hi there' --max-tokens 2");
    assert_ids(json_object_get(r, "prompt_tokens"), chat, sizeof chat / sizeof *chat);
    json_decref(r);
    /* a text prompt needs a tokenizer; the fixture folder has none */
    char cmd[1024];
    int st;
    snprintf(cmd, sizeof cmd, "%s/echo-generate --model %s/tied --prompt hi 2>&1", bin_dir(), MODELS_DIR);
    char *o = tu_run(cmd, &st);
    ck_assert_int_eq(st, 1);
    ck_assert_ptr_nonnull(strstr(o, "tokenizer"));
    free(o);
}
END_TEST

/* Without --ignore-eos generation stops at the first EOS id (from
 * generation_config.json), reported as the last token; stop ids likewise. */
START_TEST(test_stops_at_eos) {
    ref_model r;
    char dir[512], cmd[2048], err[1024];
    snprintf(dir, sizeof dir, "%s/tied", MODELS_DIR);
    ref_load(dir, &r);
    const ref_prompt *p = &r.p[0];
    int32_t eos = p->greedy[4];
    int first = 0;
    while (p->greedy[first] != eos) first++;
    char *tmp = tu_mkdtemp();
    snprintf(cmd, sizeof cmd,
             "cp %s/config.json %s/model.safetensors %s/ && echo '{\"eos_token_id\": [%d]}' > %s/generation_config.json",
             dir, dir, tmp, eos, tmp);
    ck_assert_int_eq(system(cmd), 0);
    eng *e = open_engine(tmp, 1, ECHO_PRESET_EXACT, 64);
    int32_t out[64], *cur = out;
    eng_gen_params gp = {.max_tokens = 32, .sampling = {.top_p = 1}};
    eng_finish fin;
    ck_assert(eng_generate(e, p->prompt, p->n_prompt, &gp, collect_tokens, &cur, &fin, err, sizeof err) == 0);
    ck_assert_int_eq(fin, ENG_FINISH_EOS);
    ck_assert_int_eq((int)(cur - out), first + 1);
    ck_assert_int_eq(out[first], eos);
    /* --ignore-eos runs to max_tokens; a stop id ends it instead */
    int32_t stop = p->greedy[9];
    int first_stop = 0;
    while (p->greedy[first_stop] != stop) first_stop++;
    gp.ignore_eos = 1;
    gp.stop_ids = &stop;
    gp.n_stop_ids = 1;
    cur = out;
    ck_assert(eng_generate(e, p->prompt, p->n_prompt, &gp, collect_tokens, &cur, &fin, err, sizeof err) == 0);
    ck_assert_int_eq(fin, ENG_FINISH_STOP);
    ck_assert_int_eq((int)(cur - out), first_stop + 1);
    eng_destroy(e);
    tu_rmtree(tmp);
    free(tmp);
    ref_free(&r);
}
END_TEST

/* ---- random models ("random:SHAPE", no files) ---- */

START_TEST(test_random_model_spec) {
    model_config c;
    char err[512];
    uint64_t seed = 0;
    ck_assert_msg(model_config_load("random:qwen3-8b", &c, err, sizeof err) == 0, "%s", err);
    /* the published Qwen/Qwen3-8B config.json */
    ck_assert_int_eq(c.hidden_size, 4096);
    ck_assert_int_eq(c.intermediate_size, 12288);
    ck_assert_int_eq(c.num_layers, 36);
    ck_assert_int_eq(c.num_heads, 32);
    ck_assert_int_eq(c.num_kv_heads, 8);
    ck_assert_int_eq(c.head_dim, 128);
    ck_assert_int_eq(c.vocab_size, 151936);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_msg(model_random_parse("random:qwen3-0.6b,layers=3,seed=42", &c, &seed, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.num_layers, 3);
    ck_assert_int_eq(c.hidden_size, 1024);
    ck_assert_int_eq(c.tie_word_embeddings, 1);
    ck_assert_uint_eq(seed, 42);
    /* the CI-sized shape with Qwen3's head_dim (heads * head_dim != hidden) */
    ck_assert_msg(model_random_parse("random:tiny-hd128", &c, &seed, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.head_dim, 128);
    ck_assert_int_eq(c.num_heads, 4);
    ck_assert_int_eq(c.num_kv_heads, 2);
    ck_assert_int_eq(c.vocab_size, 512);
    ck_assert_msg(model_config_load("random:nope", &c, err, sizeof err) != 0, "random:nope accepted");
    ck_assert_msg(strstr(err, "known: qwen3-8b, qwen3-0.6b, tiny, tiny-hd128;"), "message \"%s\" lacks the list", err);
    const char *bad[][2] = {{"random:huge", "unknown shape"},
                            {"random:", "unknown shape"},
                            {"random:tiny,layers=0", "layers must be"},
                            {"random:tiny,layers=x", "layers must be"},
                            {"random:tiny,seed=-1", "seed must be"},
                            {"random:tiny,color=red", "unknown option"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        ck_assert_msg(model_config_load(bad[i][0], &c, err, sizeof err) != 0, "%s accepted", bad[i][0]);
        ck_assert_msg(strstr(err, bad[i][1]), "%s: message \"%s\" lacks \"%s\"", bad[i][0], err, bad[i][1]);
    }
    ck_assert(!model_is_random("tests/fixtures/models/tied"));
}
END_TEST

/* A shard of a random weight is the same slice of the unsharded weight,
 * and the values look uniform on [-1, 1) scaled. */
START_TEST(test_random_weight_shards) {
    const kern_ops *ops;
    kern_backend *be;
    char err[512];
    ck_assert_msg(kern_backend_create("cpu", 2, 0, &ops, &be, err, sizeof err) == 0, "%s", err);
    kern_weight full, part;
    ck_assert(ops->random_weight(be, &full, 40, 30, 0, 0, 30, 7, 0.5f, 2.0f) == 0);
    ck_assert(ops->random_weight(be, &part, 10, 12, 17, 5, 30, 7, 0.5f, 2.0f) == 0);
    const float *f = full.data, *p = part.data;
    for (int r = 0; r < 10; r++)
        for (int c = 0; c < 12; c++) ck_assert_float_eq(p[r * 12 + c], f[(17 + r) * 30 + 5 + c]);
    double sum = 0, sq = 0, lo = 1e9, hi = -1e9;
    for (int i = 0; i < 1200; i++) {
        double v = (f[i] - 0.5) / 2.0;
        sum += v, sq += v * v;
        lo = v < lo ? v : lo, hi = v > hi ? v : hi;
    }
    double mean = sum / 1200, var = sq / 1200 - mean * mean;
    ck_assert_msg(fabs(mean) < 0.05 && fabs(var - 1.0 / 3) < 0.03 && lo >= -1 && hi < 1 && hi - lo > 1.9,
                  "mean %g var %g range [%g, %g]", mean, var, lo, hi);
    kern_weight other;
    ck_assert(ops->random_weight(be, &other, 40, 30, 0, 0, 30, 8, 0.5f, 2.0f) == 0);
    ck_assert(memcmp(other.data, full.data, 40 * 30 * sizeof(float)) != 0); /* the seed matters */
    ck_assert(ops->random_weight(be, &part, 10, 12, 0, 20, 30, 7, 0.f, 1.f) != 0); /* past full_cols */
    ck_assert_msg(strstr(kern_last_error(be), "bad shape"), "%s", kern_last_error(be));
    ops->free_weight(be, &other);
    ops->free_weight(be, &full);
    kern_backend_destroy(ops, be); /* part: released with the backend (ASan checks) */
}
END_TEST

/* The same random model at tp 1, 2 and 4 (exact all-reduce): shards are
 * slices of one model, so the logits agree like a checkpoint's do. */
START_TEST(test_random_model_tp) {
    const char *spec = "random:tiny,layers=3,seed=9";
    ref_prompt p = {0};
    int32_t prompt[] = {5, 17, 300, 2, 511, 64};
    p.prompt = prompt;
    p.n_prompt = 6;
    float *base = NULL;
    const int V = 512;
    for (int tp = 1; tp <= 4; tp *= 2) {
        eng *e = open_engine(spec, tp, ECHO_PRESET_EXACT, 64);
        ck_assert_int_eq(eng_model_config(e)->vocab_size, V);
        float *l = full_forward(e, &p, V);
        for (int i = 0; i < 6 * V; i++) ck_assert_msg(isfinite(l[i]), "non-finite logit at tp %d", tp);
        if (!base) {
            base = l;
        } else {
            double rel = tu_rel_err(l, base, (size_t)6 * V);
            ck_assert_msg(rel < 1e-5, "tp %d vs tp 1: relative error %g", tp, rel);
            free(l);
        }
        eng_destroy(e);
    }
    eng *e = open_engine("random:tiny,layers=3,seed=10", 1, ECHO_PRESET_EXACT, 64);
    float *l = full_forward(e, &p, V);
    ck_assert_msg(tu_rel_err(l, base, (size_t)6 * V) > 0.1, "another seed gives the same model");
    free(l);
    free(base);
    eng_destroy(e);
}
END_TEST

static eng *open_engine_q8(const char *dir, int tp, int act, char *err, size_t errlen);

/* --quantize q8_0 on a random model quantizes its matrices as a
 * checkpoint's would be (it used to be ignored there): well under a third
 * of the fp32 bytes, logits near the fp32 model's, tp 2 equal to tp 1
 * within fp32 reordering; --act-quant q8_0 then applies and moves them
 * again. */
START_TEST(test_random_model_quantize) {
    const char *spec = "random:tiny,layers=3,seed=9";
    int32_t prompt[] = {5, 17, 300, 2, 511, 64};
    ref_prompt p = {.prompt = prompt, .n_prompt = 6};
    const int V = 512;
    char err[1024];
    eng *e[4] = {open_engine(spec, 1, ECHO_PRESET_EXACT, 64), open_engine_q8(spec, 1, ENG_ACT_NONE, err, sizeof err),
                 open_engine_q8(spec, 1, ENG_ACT_Q8, err, sizeof err), open_engine_q8(spec, 2, ENG_ACT_NONE, err, sizeof err)};
    float *l[4];
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(e[i], "engine %d: %s", i, err);
        l[i] = full_forward(e[i], &p, V);
    }
    eng_rank_info r0, r1;
    eng_get_rank_info(e[0], 0, &r0);
    eng_get_rank_info(e[1], 0, &r1);
    size_t n = (size_t)6 * V;
    double q = tu_rel_err(l[1], l[0], n), a = tu_rel_err(l[2], l[1], n), t = tu_rel_err(l[3], l[1], n);
    printf("random quantize: weights %zu -> %zu bytes; logits q8_0 vs fp32 %.2e, 8-bit activations %.2e, tp 2 %.2e\n",
           r0.weight_bytes, r1.weight_bytes, q, a, t);
    ck_assert_msg(r1.weight_bytes * 3 < r0.weight_bytes, "%zu vs %zu bytes", r1.weight_bytes, r0.weight_bytes);
    ck_assert_msg(q > 1e-6 && q < 0.1, "q8_0 vs fp32 %g", q);
    ck_assert_msg(a > 1e-6 && a < 0.1, "8-bit activations vs q8_0 %g", a);
    ck_assert_msg(t < 1e-5, "tp 2 vs tp 1 %g", t);
    for (int i = 0; i < 4; i++) {
        free(l[i]);
        eng_destroy(e[i]);
    }
}
END_TEST

/* ---- fused decode weights (model_load_opts.fuse_weights) ----
 * The cpu matmul computes each output row on its own with one fixed
 * reduction order, so h·[wq; wk; wv]ᵀ holds exactly the bits of the three
 * separate products: fused and unfused engines must give identical logits,
 * both on the one-token path (fused matmuls) and on steps of several rows
 * (the views into the fused weights). */
static eng *open_engine_fuse(const char *dir, int tp, int fuse) {
    char err[1024];
    eng_config c = {.model_dir = dir, .tp = tp, .allreduce = ECHO_PRESET_EXACT, .threads = 2, .max_model_len = 128,
                    .max_num_seqs = 4, .fuse_weights = fuse};
    eng *e;
    ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s: %s", dir, err);
    return e;
}

/* One step of the same items on both engines; the logits must be equal bits. */
static void step_both(eng *const e[2], const eng_item *items, int n, int rows, int vocab, const char *what) {
    char err[1024];
    float *l[2];
    for (int f = 0; f < 2; f++) {
        l[f] = malloc((size_t)rows * vocab * sizeof *l[f]);
        ck_assert_msg(eng_step(e[f], items, n, l[f], err, sizeof err) == 0, "%s: %s", what, err);
    }
    ck_assert_msg(memcmp(l[0], l[1], (size_t)rows * vocab * sizeof *l[0]) == 0, "%s: fused logits differ", what);
    free(l[0]);
    free(l[1]);
}

/* An engine with --quantize q8_0 and --act-quant `act` (tp 1), or NULL
 * with the message in err. */
static eng *open_engine_q8(const char *dir, int tp, int act, char *err, size_t errlen) {
    eng_config c = {.model_dir = dir, .tp = tp, .allreduce = ECHO_PRESET_EXACT, .threads = 2, .max_model_len = 128,
                    .max_num_seqs = 4, .quantize = ENG_QUANT_Q8_0, .act_quant = act};
    eng *e;
    return eng_create(&c, &e, err, errlen) ? NULL : e;
}

/* 8-bit activations (--act-quant q8_0) on every fixture with every matrix
 * in Q8_0 (a GGUF's Q8_0 tensors as they are, the rest --quantize'd): the
 * logits move away from the weight-only Q8_0 engine's (the option takes
 * effect) but stay within ACT_Q8_TOL of the reference, one-token decode
 * steps give the full recomputation's bits (batch invariance), and tp 2
 * stays close to tp 1 (below). */
#define ACT_Q8_TOL 0.12
/* act: ENG_ACT_Q8_0_ONLY (the Q8_0 matrices alone, bounded also by 2.5 x
 * the weight-only Q8_0 engine's error) or ENG_ACT_Q8 (also a GGUF's
 * Q4_0/Q4_1/Q4_K/Q6_K matrices: the integer kernels, matmul_a8p.c; bounded
 * by ACT_Q8_TOL, the weight-only error being far smaller there). */
static void act_q8_fixtures(int act) {
    char names[MAX_MODELS][256], err[1024];
    int nm = list_models(names);
    for (int mi = 0; mi < nm; mi++) {
        ref_model r;
        ref_load(names[mi], &r);
        eng *ew = open_engine_q8(names[mi], 1, ENG_ACT_NONE, err, sizeof err);
        ck_assert_msg(ew, "%s: %s", names[mi], err);
        eng *ea = open_engine_q8(names[mi], 1, act, err, sizeof err);
        ck_assert_msg(ea, "%s: %s", names[mi], err);
        double worst_w = 0, worst_a = 0, worst_move = 0;
        int same = 0, total = 0;
        for (int i = 0; i < r.n_prompts; i++) {
            const ref_prompt *p = &r.p[i];
            size_t cnt = (size_t)p->rows * r.vocab;
            float *lw = full_forward(ew, p, r.vocab), *la = full_forward(ea, p, r.vocab);
            double ew_ = tu_rel_err(lw + (size_t)p->first_pos * r.vocab, p->logits, cnt);
            double ea_ = tu_rel_err(la + (size_t)p->first_pos * r.vocab, p->logits, cnt);
            double mv = tu_rel_err(la, lw, (size_t)(p->n_prompt + p->n_greedy) * r.vocab);
            worst_w = ew_ > worst_w ? ew_ : worst_w;
            worst_a = ea_ > worst_a ? ea_ : worst_a;
            worst_move = mv > worst_move ? mv : worst_move;
            ck_assert_msg(mv > 1e-6, "%s prompt %d: 8-bit activations changed nothing (%.3g)", names[mi], i, mv);
            /* greedy argmax agreement with the reference continuation, position by position */
            for (int t = 0; t < p->n_greedy; t++) {
                const float *row = la + (size_t)(p->n_prompt - 1 + t) * r.vocab;
                int best = 0;
                for (int v = 1; v < r.vocab; v++) best = row[v] > row[best] ? v : best;
                same += best == p->greedy[t];
                total++;
            }
            /* decode steps = full recomputation, bit for bit */
            int seq;
            float *step = malloc((size_t)r.vocab * sizeof *step);
            ck_assert(eng_seq_new(ea, &seq, err, sizeof err) == 0);
            eng_item it = {seq, p->prompt, p->n_prompt, ENG_LOGITS_LAST};
            ck_assert_msg(eng_step(ea, &it, 1, step, err, sizeof err) == 0, "%s", err);
            ck_assert(memcmp(step, la + (size_t)(p->n_prompt - 1) * r.vocab, (size_t)r.vocab * 4) == 0);
            for (int t = 0; t < p->n_greedy && t < 4; t++) {
                it = (eng_item){seq, &p->greedy[t], 1, ENG_LOGITS_LAST};
                ck_assert_msg(eng_step(ea, &it, 1, step, err, sizeof err) == 0, "%s", err);
                ck_assert_msg(memcmp(step, la + (size_t)(p->n_prompt + t) * r.vocab, (size_t)r.vocab * 4) == 0,
                              "%s prompt %d: decode step %d is not the full recomputation's bits", names[mi], i, t);
            }
            eng_seq_free(ea, seq);
            free(step);
            free(lw);
            free(la);
        }
        printf("act-q8: %-36s logits error weight-only Q8_0 %.2e, 8-bit activations %.2e (moved %.2e); "
               "argmax = reference %d/%d\n",
               names[mi], worst_w, worst_a, worst_move, same, total);
        ck_assert_msg(worst_a <= ACT_Q8_TOL && (act == ENG_ACT_Q8 || worst_a <= 2.5 * worst_w),
                      "%s: 8-bit activations, logits error %.3g (weight-only %.3g)", names[mi], worst_a, worst_w);
        ck_assert_msg(same >= total * 85 / 100, "%s: argmax = reference at %d of %d positions", names[mi], same, total);
        /* tp 2: where every rank's slices are whole 32-blocks (the weight-only
         * engines agree), the same blocks are quantized the same way and only
         * the order of the sums differs; but an activation that sits on a
         * rounding boundary may round the other way, and on deep random
         * models that moves the logits (tied: 1e-7 up to the position of
         * one such flip, then 1e-2). Bounded by half of what 8-bit
         * activations move them at all. */
        eng *e2 = open_engine_q8(names[mi], 2, act, err, sizeof err);
        eng *ew2 = e2 ? open_engine_q8(names[mi], 2, ENG_ACT_NONE, err, sizeof err) : NULL;
        if (ew2) {
            const ref_prompt *p = &r.p[r.n_prompts - 1];
            size_t cnt = (size_t)(p->n_prompt + p->n_greedy) * r.vocab;
            float *l1 = full_forward(ea, p, r.vocab), *l2 = full_forward(e2, p, r.vocab);
            float *w1 = full_forward(ew, p, r.vocab), *w2 = full_forward(ew2, p, r.vocab);
            double ea2 = tu_rel_err(l2, l1, cnt), ew2_ = tu_rel_err(w2, w1, cnt);
            printf("act-q8: %-36s tp 2 vs tp 1: weight-only %.2e, 8-bit activations %.2e\n", names[mi], ew2_, ea2);
            if (ew2_ <= 1e-5)
                ck_assert_msg(ea2 <= 0.5 * worst_move, "%s: tp 2 vs tp 1 %.3g, 8-bit activations moved %.3g", names[mi],
                              ea2, worst_move);
            free(l1);
            free(l2);
            free(w1);
            free(w2);
        }
        if (ew2) eng_destroy(ew2);
        if (e2) eng_destroy(e2);
        eng_destroy(ew);
        eng_destroy(ea);
        ref_free(&r);
    }
}

START_TEST(test_act_q8_fixtures) { act_q8_fixtures(ENG_ACT_Q8_0_ONLY); }
END_TEST

START_TEST(test_act_a8_fixtures) { act_q8_fixtures(ENG_ACT_Q8); }
END_TEST

/* --act-quant auto puts every quantized matrix of a GGUF on the integer
 * kernels, the Q5 types included, and none on none. The counts are the
 * fixtures' 2-D block-quantized tensors, read from the files with the gguf
 * package (gguf-llama: Q8_0 3, Q4_K 2, Q6_K 2, Q4_1 2, Q4_0, Q5_K, Q5_0,
 * Q5_1 1 each; gguf-qwen3: the same with Q6_K 3; F16 and BF16 1 each,
 * not counted). */
START_TEST(test_act_auto_gguf_types) {
    const struct {
        const char *name;
        int quantized;
    } cases[] = {{"gguf-llama", 13}, {"gguf-qwen3", 14}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[512], err[1024];
        snprintf(dir, sizeof dir, "%s/%s/model.gguf", MODELS_DIR, cases[i].name);
        for (int act = ENG_ACT_NONE; act <= ENG_ACT_AUTO; act += ENG_ACT_AUTO) {
            eng_config c = {.model_dir = dir, .tp = 1, .threads = 1, .max_model_len = 64, .max_num_seqs = 1,
                            .act_quant = act};
            eng *e;
            ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s: %s", dir, err);
            eng_rank_info ri;
            eng_get_rank_info(e, 0, &ri);
            ck_assert_msg(ri.act_q8_matrices == (act ? cases[i].quantized : 0), "%s act %d: %d matrices", cases[i].name,
                          act, ri.act_q8_matrices);
            eng_destroy(e);
        }
    }
}
END_TEST

/* 8-bit activations where nothing is Q8_0, or on a backend that keeps no
 * Q8_0 weights (cuda has no upload_quantized), are refused with the reason. */
START_TEST(test_act_q8_refused) {
    char err[1024];
    eng_config c = {.model_dir = "random:tiny,layers=2", .tp = 1, .threads = 1, .max_model_len = 64,
                    .max_num_seqs = 1, .act_quant = ENG_ACT_Q8};
    eng *e;
    ck_assert_int_ne(eng_create(&c, &e, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "no Q8_0 matrix"), "%s", err);
    const kern_ops *cpu = NULL;
    kern_backend *be = NULL;
    ck_assert_msg(kern_backend_create("cpu", 1, 0, &cpu, &be, err, sizeof err) == 0, "%s", err);
    kern_ops noq = *cpu;
    noq.upload_quantized = NULL;
    model_load_opts o = {&noq, be, NULL, 0, 1, NULL, 16, 4, 0, 0, 1, KERN_KV_NATIVE, NULL};
    model *m = NULL;
    ck_assert_int_ne(model_load("random:tiny,layers=2", &o, &m, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "does not keep Q8_0 weights"), "%s", err);
    ck_assert_ptr_null(m);
    kern_backend_destroy(cpu, be);
}
END_TEST

START_TEST(test_fused_weights_bit_identical) {
    char names[MAX_MODELS][256], err[1024], what[600];
    int nm = list_models(names);
    ck_assert_int_ge(nm, 4);
    for (int mi = 0; mi < nm; mi++) {
        ref_model r;
        ref_load(names[mi], &r);
        model_config mc;
        ck_assert_msg(model_config_load(names[mi], &mc, err, sizeof err) == 0, "%s", err);
        for (int tp = 1; tp <= 3; tp++) {
            if (model_check_tp(&mc, tp, err, sizeof err)) continue; /* llama-tp3 splits at 3, not 2 */
            eng *e[2] = {open_engine_fuse(names[mi], tp, ENG_FUSE_OFF), open_engine_fuse(names[mi], tp, ENG_FUSE_ON)};
            /* auto is off on cpu; the forced values are kept */
            ck_assert_int_eq(eng_get_config(e[0])->fuse_weights, ENG_FUSE_OFF);
            ck_assert_int_eq(eng_get_config(e[1])->fuse_weights, ENG_FUSE_ON);
            /* one sequence: prefill, then one-token decode steps (the fused matmuls) */
            for (int i = 0; i < 2; i++) {
                const ref_prompt *p = &r.p[i];
                int seq[2];
                for (int f = 0; f < 2; f++) ck_assert(eng_seq_new(e[f], &seq[f], err, sizeof err) == 0);
                ck_assert_int_eq(seq[0], seq[1]);
                eng_item it = {seq[0], p->prompt, p->n_prompt, ENG_LOGITS_LAST};
                snprintf(what, sizeof what, "%.200s tp %d prompt %d prefill", names[mi], tp, i);
                step_both(e, &it, 1, 1, r.vocab, what);
                for (int t = 0; t < 8 && t < p->n_greedy; t++) {
                    it = (eng_item){seq[0], &p->greedy[t], 1, ENG_LOGITS_LAST};
                    snprintf(what, sizeof what, "%.200s tp %d prompt %d decode %d", names[mi], tp, i, t);
                    step_both(e, &it, 1, 1, r.vocab, what);
                }
                for (int f = 0; f < 2; f++) eng_seq_free(e[f], seq[0]);
            }
            /* three sequences decoding together: steps of 3 rows (the views) */
            int seqs[3];
            eng_item items[3];
            for (int s = 0; s < 3; s++) {
                int other;
                ck_assert(eng_seq_new(e[0], &seqs[s], err, sizeof err) == 0);
                ck_assert(eng_seq_new(e[1], &other, err, sizeof err) == 0);
                ck_assert_int_eq(seqs[s], other);
                items[s] = (eng_item){seqs[s], r.p[s].prompt, r.p[s].n_prompt, ENG_LOGITS_LAST};
            }
            snprintf(what, sizeof what, "%.200s tp %d batch prefill", names[mi], tp);
            step_both(e, items, 3, 3, r.vocab, what);
            for (int t = 0; t < 4; t++) {
                for (int s = 0; s < 3; s++) items[s] = (eng_item){seqs[s], &r.p[s].greedy[t], 1, ENG_LOGITS_LAST};
                snprintf(what, sizeof what, "%.200s tp %d batch decode %d", names[mi], tp, t);
                step_both(e, items, 3, 3, r.vocab, what);
            }
            /* and one sequence alone again: back on the fused matmuls */
            items[0] = (eng_item){seqs[0], &r.p[0].greedy[4], 1, ENG_LOGITS_LAST};
            snprintf(what, sizeof what, "%.200s tp %d single after batch", names[mi], tp);
            step_both(e, items, 1, 1, r.vocab, what);
            eng_destroy(e[0]);
            eng_destroy(e[1]);
        }
        ref_free(&r);
    }
}
END_TEST

/* The model's side on a random model (backend-owned parts, so fusing frees
 * them: ASan checks the views are never freed), tp 1: the same bytes held,
 * identical logits for a one-token step and a multi-row step. */
START_TEST(test_fused_weights_model) {
    const kern_ops *cpu = NULL;
    kern_backend *be = NULL;
    char err[512];
    ck_assert_msg(kern_backend_create("cpu", 2, 0, &cpu, &be, err, sizeof err) == 0, "%s", err);
    const char *spec = "random:tiny,layers=2,seed=12";
    model *m[2] = {NULL, NULL};
    for (int f = 0; f < 2; f++) {
        model_load_opts o = {cpu, be, NULL, 0, 1, NULL, 16, 4, f, 0, 0, KERN_KV_NATIVE, NULL};
        ck_assert_msg(model_load(spec, &o, &m[f], err, sizeof err) == 0, "%s", err);
    }
    ck_assert_uint_eq(model_weight_bytes(m[0]), model_weight_bytes(m[1]));
    const int V = model_get_config(m[0])->vocab_size;
    int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float *l[2] = {malloc((size_t)4 * V * sizeof(float)), malloc((size_t)4 * V * sizeof(float))};
    /* 4 tokens (the views), then 3 one-token steps (the fused weights) */
    int32_t toks[4] = {3, 14, 15, 92}, qs4[2] = {0, 4}, pos0 = 0, rows4[4] = {0, 1, 2, 3};
    model_batch b = {1, toks, qs4, &pos0, table, 8, rows4, 4, NULL, NULL};
    eng_runner run[2] = {{.m = m[0], .ops = cpu, .be = be}, {.m = m[1], .ops = cpu, .be = be}};
    for (int f = 0; f < 2; f++) ck_assert_msg(eng_run_step(&run[f], &b, l[f], err, sizeof err) == 0, "%s", err);
    ck_assert(memcmp(l[0], l[1], (size_t)4 * V * sizeof(float)) == 0);
    for (int t = 0; t < 3; t++) {
        int32_t tok = 65 + t, qs1[2] = {0, 1}, p = 4 + t, row = 0;
        model_batch d = {1, &tok, qs1, &p, table, 8, &row, 1, NULL, NULL};
        for (int f = 0; f < 2; f++) ck_assert_msg(eng_run_step(&run[f], &d, l[f], err, sizeof err) == 0, "%s", err);
        ck_assert_msg(memcmp(l[0], l[1], (size_t)V * sizeof(float)) == 0, "decode %d: fused logits differ", t);
    }
    model_free(m[0]);
    model_free(m[1]);
    free(l[0]);
    free(l[1]);
    kern_backend_destroy(cpu, be);
}
END_TEST

/* ---- graphs: the step runner's side, through a cpu op table with fake graph ops ----
 * The cpu backend has no graphs (NULL entries: steps run eagerly). Here
 * the graph entries are stubs around the cpu ops, so the runner's routing is
 * visible: which steps ask for a graph, and that a failed graph_end or
 * graph_launch or a refused graph_begin falls back to the eager pass with
 * the same logits. On
 * cpu the ops inside "graph mode" really run (a real backend runs nothing
 * there), and a fallback runs them again: the same values are recomputed
 * and the cache rows rewritten with the same values. */
typedef struct fake_graphs {
    int begin, end, abort_, launch, drop_all;
    int mode; /* 0: all succeed, 1: graph_end fails, 2: graph_begin answers 1 (no graph), 3: graph_launch fails */
    uint64_t last_key;
} fake_graphs;
static fake_graphs g_fake; /* the stubs get only the backend: test state lives here */

static int fake_graph_begin(kern_backend *be, uint64_t key, int *replaying) {
    (void)be;
    g_fake.begin++;
    g_fake.last_key = key;
    *replaying = 0;
    return g_fake.mode == 2 ? 1 : 0;
}
static int fake_graph_end(kern_backend *be) {
    (void)be;
    g_fake.end++;
    return g_fake.mode == 1 ? -1 : 0;
}
static void fake_graph_abort(kern_backend *be) {
    (void)be;
    g_fake.abort_++;
}
static int fake_graph_launch(kern_backend *be) {
    (void)be;
    g_fake.launch++;
    return g_fake.mode == 3 ? -1 : 0;
}
static void fake_graph_drop_all(kern_backend *be) {
    (void)be;
    g_fake.drop_all++;
}

START_TEST(test_model_graph_routing) {
    const kern_ops *cpu = NULL;
    kern_backend *be = NULL;
    char err[512];
    ck_assert_msg(kern_backend_create("cpu", 2, 0, &cpu, &be, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(cpu->graph_begin == NULL && cpu->graph_end == NULL && cpu->graph_abort == NULL &&
                      cpu->graph_launch == NULL && cpu->graph_drop_all == NULL,
                  "the cpu backend has no graphs");
    kern_ops fake = *cpu;
    fake.graph_begin = fake_graph_begin;
    fake.graph_end = fake_graph_end;
    fake.graph_abort = fake_graph_abort;
    fake.graph_launch = fake_graph_launch;
    fake.graph_drop_all = fake_graph_drop_all;
    const char *spec = "random:tiny,layers=2,seed=4";
    model *mg = NULL, *me = NULL;
    model_load_opts og = {&fake, be, NULL, 0, 1, NULL, 16, 4, 0, 0, 0, KERN_KV_NATIVE, NULL}, oe = {cpu, be, NULL, 0, 1, NULL, 16, 4, 0, 0, 0, KERN_KV_NATIVE, NULL};
    ck_assert_msg(model_load(spec, &og, &mg, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(model_load(spec, &oe, &me, err, sizeof err) == 0, "%s", err);
    eng_runner rg = {.m = mg, .ops = &fake, .be = be, .graphs = 1}, re = {.m = me, .ops = cpu, .be = be};
    const int V = model_get_config(mg)->vocab_size, MB = 8;
    /* two sequences on blocks 0..7 and 8..15 of each model's own cache */
    int32_t table[2 * 8];
    for (int i = 0; i < 16; i++) table[i] = i;
    float *lg = malloc((size_t)2 * V * sizeof *lg), *le = malloc((size_t)2 * V * sizeof *le);
    /* prefill: 5 and 3 tokens, not decode-only: no graph asked */
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8}, qs[3] = {0, 5, 8}, pos0[2] = {0, 0}, rows[2] = {4, 7};
    model_batch b = {2, toks, qs, pos0, table, MB, rows, 2, NULL, NULL};
    ck_assert_msg(eng_run_step(&rg, &b, lg, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eng_run_step(&re, &b, le, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(g_fake.begin, 0);
    ck_assert(memcmp(lg, le, (size_t)2 * V * sizeof *lg) == 0);
    /* decode steps: modes 0 (graph), 1 (graph_end fails: eager), 2 (no graph: eager), 3 (graph_launch
     * fails: eager), 0 again */
    static const int modes[] = {0, 1, 2, 3, 0};
    int32_t dq[3] = {0, 1, 2}, drows[2] = {0, 1}, dpos[2] = {5, 3};
    for (int t = 0; t < 5; t++) {
        fake_graphs before = g_fake;
        g_fake.mode = modes[t];
        int32_t dt[2] = {10 + t, 20 + t};
        model_batch d = {2, dt, dq, dpos, table, MB, drows, 2, NULL, NULL};
        ck_assert_msg(eng_run_step(&rg, &d, lg, err, sizeof err) == 0, "step %d: %s", t, err);
        ck_assert_msg(eng_run_step(&re, &d, le, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(memcmp(lg, le, (size_t)2 * V * sizeof *lg) == 0, "step %d (mode %d): logits differ", t,
                      modes[t]);
        ck_assert_int_eq(g_fake.begin, before.begin + 1);
        ck_assert_int_eq(g_fake.end, before.end + (modes[t] != 2));
        ck_assert_int_eq(g_fake.launch, before.launch + (modes[t] == 0 || modes[t] == 3));
        ck_assert_int_eq(g_fake.abort_, before.abort_ + (modes[t] == 1 || modes[t] == 3));
        dpos[0]++;
        dpos[1]++;
    }
    ck_assert_int_eq(rg.graph_steps, 2);
    ck_assert_int_eq(re.graph_steps, 0);
    /* the key holds the batch size and the logits rows */
    ck_assert_int_eq((int)(g_fake.last_key & 0xffff), 2);
    ck_assert_int_eq((int)(g_fake.last_key >> 16 & 0xffff), 2);
    /* logits rows not 0..r-1, or layer states: eager, no graph asked */
    int begins = g_fake.begin;
    int32_t one_row[1] = {1}, dt[2] = {30, 31};
    model_batch d = {2, dt, dq, dpos, table, MB, one_row, 1, NULL, NULL};
    ck_assert_msg(eng_run_step(&rg, &d, lg, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(g_fake.begin, begins);
    /* eng_runner_drop_graphs goes to the backend's graph_drop_all, once;
     * none on cpu: nothing to drop */
    ck_assert_int_eq(g_fake.drop_all, 0);
    eng_runner_drop_graphs(&rg);
    eng_runner_drop_graphs(&re);
    ck_assert_int_eq(g_fake.drop_all, 1);
    /* a step that outgrows the activation buffers drops the graphs before
     * freeing the buffers they address (once), and is still right */
    int32_t big[24], bq[2] = {0, 24}, bpos[1] = {0}, brow[1] = {23}; /* 8 blocks of 4 tokens hold 32 */
    for (int i = 0; i < 24; i++) big[i] = 40 + i;
    model_batch bb = {1, big, bq, bpos, table + 8, MB, brow, 1, NULL, NULL};
    ck_assert_msg(eng_run_step(&rg, &bb, lg, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eng_run_step(&re, &bb, le, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(g_fake.drop_all, 2);
    ck_assert(memcmp(lg, le, (size_t)V * sizeof *lg) == 0);
    ck_assert_msg(eng_run_step(&rg, &bb, lg, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(g_fake.drop_all, 2); /* no growth, no drop */
    model_free(mg);
    model_free(me);
    kern_backend_destroy(cpu, be);
    free(lg);
    free(le);
}
END_TEST

/* The engine flag: a note on cpu (no graphs there), and the same logits. */
START_TEST(test_engine_graphs_flag_cpu) {
    char err[1024];
    int32_t prompt[] = {5, 17, 300, 2, 511, 64}, tok = 9;
    float *l[2];
    for (int g = 0; g < 2; g++) {
        eng_config c = {.model_dir = "random:tiny,layers=2,seed=5", .device = "cpu", .tp = 1, .threads = 2,
                        .max_model_len = 64, .max_num_seqs = 2, .cuda_graphs = g};
        eng *e = NULL;
        ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s", err);
        if (g) {
            ck_assert(eng_graphs_note(e) != NULL);
            ck_assert_msg(strstr(eng_graphs_note(e), "no effect") != NULL, "%s", eng_graphs_note(e));
        } else {
            ck_assert(eng_graphs_note(e) == NULL);
        }
        const int V = eng_model_config(e)->vocab_size;
        int seq;
        l[g] = malloc((size_t)V * sizeof *l[g]);
        ck_assert(eng_seq_new(e, &seq, err, sizeof err) == 0);
        eng_item it = {seq, prompt, 6, ENG_LOGITS_LAST};
        ck_assert_msg(eng_step(e, &it, 1, l[g], err, sizeof err) == 0, "%s", err);
        it = (eng_item){seq, &tok, 1, ENG_LOGITS_LAST};
        ck_assert_msg(eng_step(e, &it, 1, l[g], err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(eng_graph_steps(e), 0);
        eng_seq_free(e, seq);
        eng_destroy(e);
        if (g) ck_assert(memcmp(l[0], l[1], (size_t)V * sizeof *l[0]) == 0);
    }
    free(l[0]);
    free(l[1]);
}
END_TEST

/* The all-reduce transport is chosen, or refused with a reason. */
START_TEST(test_engine_transport_choice) {
    char err[1024];
    eng *e = NULL;
    const char *dir = "tests/fixtures/models/tied";
    eng_config c = {.model_dir = dir, .tp = 2, .threads = 2, .max_model_len = 32, .transport = "local"};
    ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(eng_get_config(e)->transport, "local");
    eng_destroy(e);
    c.transport = NULL; /* auto: threads over host memory on cpu */
    ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(eng_get_config(e)->transport, "local");
    eng_destroy(e);
    const char *bad[][2] = {{"nccl", "needs --device cuda"}, {"carrier-pigeon", "unknown all-reduce transport"}};
    for (int i = 0; i < 2; i++) {
        c.transport = bad[i][0];
        err[0] = 0;
        ck_assert(eng_create(&c, &e, err, sizeof err) != 0);
        ck_assert_msg(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
    if (kern_gpu_count() == 0) { /* this machine: a missing GPU names the way out */
        eng_config g = {.model_dir = dir, .device = "cuda", .tp = 2, .max_model_len = 32};
        err[0] = 0;
        ck_assert(eng_create(&g, &e, err, sizeof err) != 0);
        ck_assert_msg(strstr(err, "--device cpu"), "%s", err);
        g.transport = "nccl";
        ck_assert(eng_create(&g, &e, err, sizeof err) != 0);
        ck_assert_msg(strstr(err, "--device cpu") || strstr(err, "GPUs"), "%s", err);
    }
}
END_TEST

/* eng_generate prefills a prompt longer than one step's token budget in
 * chunks: the same tokens and logprobs as one pass (the cache the earlier
 * chunks filled is what the later ones attend to). */
START_TEST(test_generate_chunked_prefill) {
    char err[1024];
    ref_model r;
    ref_load(MODELS_DIR "/gqa4-deep", &r);
    for (int budget = 0; budget <= 3; budget += 3) { /* 0: the default (one pass); 3: chunks of 3 */
        eng_config c = {.model_dir = r.dir, .threads = 2, .max_model_len = 128, .max_num_seqs = 1,
                        .max_batch_tokens = budget};
        eng *e;
        ck_assert_msg(eng_create(&c, &e, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < r.n_prompts; i++) {
            const ref_prompt *p = &r.p[i];
            int32_t out[64], *cur = out;
            eng_gen_params gp = {.max_tokens = p->n_greedy, .sampling = {.top_p = 1}, .ignore_eos = 1};
            eng_finish fin;
            ck_assert_msg(eng_generate(e, p->prompt, p->n_prompt, &gp, collect_tokens, &cur, &fin, err, sizeof err) == 0,
                          "budget %d: %s", budget, err);
            ck_assert_int_eq((int)(cur - out), p->n_greedy);
            for (int j = 0; j < p->n_greedy; j++)
                ck_assert_msg(out[j] == p->greedy[j], "budget %d prompt %d (%d tokens) step %d: %d vs HF %d", budget,
                              i, p->n_prompt, j, out[j], p->greedy[j]);
        }
        eng_destroy(e);
    }
    ref_free(&r);
}
END_TEST

static Suite *model_suite(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("oracle");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_fixtures_present);
    tcase_add_test(tc, test_logits_match_reference);
    tcase_add_test(tc, test_yarn_reference_tp2);
    tcase_add_test(tc, test_rope_scaling_override);
    tcase_add_test(tc, test_greedy_matches_reference);
    tcase_add_test(tc, test_decode_equals_full_recompute);
    tcase_add_test(tc, test_stops_at_eos);
    tcase_add_test(tc, test_fused_weights_bit_identical);
    tcase_add_test(tc, test_act_q8_fixtures);
    tcase_add_test(tc, test_act_a8_fixtures);
    suite_add_tcase(s, tc);
    TCase *tcc = tcase_create("config");
    tcase_add_test(tcc, test_config_fields);
    tcase_add_test(tcc, test_config_rope_llama3);
    tcase_add_test(tcc, test_config_rope_yarn);
    tcase_add_test(tcc, test_config_gguf_yarn);
    tcase_add_test(tcc, test_pass_sites);
    tcase_add_test(tcc, test_config_errors);
    tcase_add_test(tcc, test_shape_mismatch_names_tensor);
    tcase_add_test(tcc, test_log_softmax_and_top_k);
    tcase_add_test(tcc, test_random_model_spec);
    tcase_add_test(tcc, test_random_weight_shards);
    tcase_add_test(tcc, test_random_model_tp);
    tcase_add_test(tcc, test_engine_transport_choice);
    tcase_add_test(tcc, test_generate_chunked_prefill);
    tcase_add_test(tcc, test_model_graph_routing);
    tcase_add_test(tcc, test_fused_weights_model);
    tcase_add_test(tcc, test_engine_graphs_flag_cpu);
    tcase_add_test(tcc, test_act_q8_refused);
    tcase_add_test(tcc, test_act_auto_gguf_types);
    tcase_add_test(tcc, test_random_model_quantize);
    suite_add_tcase(s, tcc);
    TCase *cli = tcase_create("cli");
    tcase_set_timeout(cli, 600);
    tcase_add_test(cli, test_cli_json_matches_reference);
    tcase_add_test(cli, test_cli_usage_errors);
    tcase_add_test(cli, test_cli_text_prompt_and_chat);
    suite_add_tcase(s, cli);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(model_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
