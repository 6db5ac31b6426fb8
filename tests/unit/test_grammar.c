/*
 * grammar/ (xgrammar behind a C interface) on real vocabularies: SmolLM2's
 * byte-level BPE from its GGUF (build/models/SmolLM2-135M-Instruct.Q4_1.gguf
 * or $ECHO_SMOLLM2_GGUF; make check-suites fetches it, and this suite fails
 * without it), Qwen3's tokenizer.json and a SentencePiece model from the
 * fixtures.
 *
 * What is checked independently of xgrammar: texts the tokenizer encodes
 * are walked token by token through the mask (a conforming text's tokens
 * are all allowed, a non-conforming one hits a disallowed token); seeded
 * random walks over the allowed tokens end in text that PCRE2 matches
 * against the regex, that equals one of the choices, or that jansson parses
 * and that has the schema's required keys and enum values; the first mask
 * of a JSON grammar allows exactly the tokens whose bytes start with '{'
 * (computed here from the bytes); masked logits steer eng_sample.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/chat.h"
#include "engine/engine.h"
#include "engine/sample.h"
#include "grammar/grammar.h"
#include "tests/unit/testutil.h"
#include "tokenizer/tokenizer.h"

enum { T_SMOL, T_QWEN, T_SPM, N_TOKS };
static const char *const tok_names[N_TOKS] = {"smollm2", "qwen3", "sentencepiece"};

static tok_tokenizer *load_tok(int which) {
    tok_tokenizer *t = NULL;
    char err[512] = "";
    int rc;
    if (which == T_SMOL) {
        const char *gguf = getenv("ECHO_SMOLLM2_GGUF");
        if (!gguf) gguf = "build/models/SmolLM2-135M-Instruct.Q4_1.gguf";
        struct stat st;
        ck_assert_msg(stat(gguf, &st) == 0, "%s not found (make default-model, or set ECHO_SMOLLM2_GGUF)", gguf);
        rc = eng_tokenizer_load(gguf, &t, NULL, err, sizeof err);
    } else if (which == T_QWEN) {
        rc = tok_load_dir(TU_FIXTURES "/tokenizer/qwen3", &t, err, sizeof err);
    } else {
        rc = tok_load_sentencepiece(TU_FIXTURES "/tokenizer/spm/tokenizer.model", &t, err, sizeof err);
    }
    ck_assert_msg(rc == 0 && t, "%s: %s", tok_names[which], err);
    return t;
}

/* The vocab as the server builds it: each id's mid-sequence bytes. */
static gram_vocab *make_vocab(const tok_tokenizer *t, size_t vocab_size, int32_t *eos) {
    size_t n = tok_vocab_size(t);
    const char **p = calloc(n, sizeof *p);
    size_t *len = calloc(n, sizeof *len);
    ck_assert(p && len);
    for (size_t i = 0; i < n; i++)
        if (tok_token_bytes(t, (int32_t)i, &p[i], &len[i]) != 0) len[i] = 0;
    *eos = tok_eos_id(t);
    ck_assert_int_ge(*eos, 0);
    gram_vocab *v = NULL;
    char err[512] = "";
    int rc = gram_vocab_new(p, len, n, vocab_size, eos, 1, &v, err, sizeof err);
    ck_assert_msg(rc == GRAM_OK, "gram_vocab_new: %s", err);
    free(p);
    free(len);
    return v;
}

static gram_grammar *compile(gram_vocab *v, gram_kind k, const char *src) {
    gram_grammar *g = NULL;
    char err[512] = "";
    double sec = -1;
    int rc = gram_compile(v, k, src, src ? strlen(src) : 0, &g, &sec, err, sizeof err);
    ck_assert_msg(rc == GRAM_OK, "compile %d '%s': %s", (int)k, src ? src : "", err);
    ck_assert(sec >= 0);
    return g;
}

static int allowed(const uint32_t *mask, int32_t id) {
    return (mask[id / 32] >> (id % 32)) & 1u;
}

/* Walk text's tokens through a matcher: index of the first token the mask
 * disallows, or -1 when every token is allowed and accepted. *complete
 * receives whether the grammar is complete afterwards and EOS allowed. */
static int walk_text(const tok_tokenizer *t, const gram_grammar *g, size_t V, int32_t eos, const char *text,
                     int *complete) {
    int32_t *ids = NULL;
    size_t n = 0;
    char err[512];
    ck_assert_int_eq(tok_encode(t, text, strlen(text), 0, &ids, &n, err, sizeof err), TOK_OK);
    /* SentencePiece encodes a leading dummy-prefix space ("▁{") that a
     * generated continuation would not have: take the piece without it. */
    const char *p0;
    size_t n0;
    if (n && text[0] != ' ' && tok_token_bytes(t, ids[0], &p0, &n0) == 0 && n0 > 1 && p0[0] == ' ') {
        char piece[64];
        snprintf(piece, sizeof piece, "%.*s", (int)(n0 - 1), p0 + 1);
        int32_t id = tok_token_id(t, piece);
        ck_assert_msg(id >= 0, "no piece '%s'", piece);
        ids[0] = id;
    } else if (n && text[0] != ' ' && tok_token_bytes(t, ids[0], &p0, &n0) == 0 && n0 == 1 && p0[0] == ' ') {
        memmove(ids, ids + 1, --n * sizeof *ids);
    }
    gram_matcher *m = NULL;
    ck_assert_int_eq(gram_matcher_new(g, &m, err, sizeof err), GRAM_OK);
    uint32_t *mask = malloc(gram_mask_words(V) * sizeof *mask);
    ck_assert_ptr_nonnull(mask);
    int bad = -1;
    for (size_t i = 0; i < n && bad < 0; i++) {
        ck_assert_int_ge(gram_matcher_fill(m, mask, err, sizeof err), 0);
        if (!allowed(mask, ids[i])) {
            bad = (int)i;
            ck_assert_int_eq(gram_matcher_accept(m, ids[i]), 0); /* the matcher agrees */
            break;
        }
        ck_assert_int_eq(gram_matcher_accept(m, ids[i]), 1);
    }
    if (bad < 0) {
        ck_assert_int_ge(gram_matcher_fill(m, mask, err, sizeof err), 0);
        *complete = gram_matcher_complete(m) && allowed(mask, eos);
    }
    free(mask);
    free(ids);
    gram_matcher_free(m);
    return bad;
}

/* A seeded random walk over allowed tokens until only stopping is left or
 * (with prob. 1/2 per step) stopping is allowed. Returns the malloc'ed text
 * (NULL when max_steps ran out). */
static char *random_walk(const tok_tokenizer *t, const gram_grammar *g, size_t V, int32_t eos, uint64_t seed,
                         int max_steps) {
    char err[512];
    gram_matcher *m = NULL;
    ck_assert_int_eq(gram_matcher_new(g, &m, err, sizeof err), GRAM_OK);
    uint32_t *mask = malloc(gram_mask_words(V) * sizeof *mask);
    int32_t *ok = malloc(V * sizeof *ok);
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    ck_assert(mask && ok && text);
    eng_rng rng;
    eng_rng_seed(&rng, seed);
    int done = 0;
    for (int step = 0; step < max_steps && !done; step++) {
        ck_assert_int_ge(gram_matcher_fill(m, mask, err, sizeof err), 0);
        size_t n_ok = 0;
        for (size_t i = 0; i < V; i++)
            if (allowed(mask, (int32_t)i) && (int32_t)i != eos) ok[n_ok++] = (int32_t)i;
        int stop_ok = allowed(mask, eos);
        if (stop_ok) ck_assert(gram_matcher_complete(m));
        if (stop_ok && (n_ok == 0 || (seed + (uint64_t)step) % 2 == 0)) {
            ck_assert_int_eq(gram_matcher_accept(m, eos), 1);
            ck_assert(gram_matcher_terminated(m));
            done = 1;
            break;
        }
        ck_assert_msg(n_ok > 0, "no token allowed and no stop");
        float *row = malloc(V * sizeof *row);
        ck_assert_ptr_nonnull(row);
        for (size_t i = 0; i < V; i++)
            row[i] = 0;
        gram_mask_apply(row, V, mask); /* equal logits: a uniform draw over the allowed set */
        row[eos] = -INFINITY;
        eng_sampling sp = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = seed};
        int32_t pick = eng_sample(row, (int)V, &sp, &rng);
        free(row);
        ck_assert_msg(allowed(mask, pick), "sampler picked masked token %d", pick);
        ck_assert_int_eq(gram_matcher_accept(m, pick), 1);
        const char *p;
        size_t n;
        ck_assert_int_eq(tok_token_bytes(t, pick, &p, &n), 0);
        ck_assert(len + n + 1 < cap);
        memcpy(text + len, p, n);
        len += n;
    }
    text[len] = 0;
    free(mask);
    free(ok);
    gram_matcher_free(m);
    if (!done) {
        free(text);
        return NULL;
    }
    return text;
}

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"pattern\":\"^[a-z]{1,6}$\"},"
    "\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\"]},\"maxItems\":3},"
    "\"pos\":{\"type\":\"object\",\"properties\":{\"row\":{\"enum\":[1,2,3]}},\"required\":[\"row\"],"
    "\"additionalProperties\":false}},"
    "\"required\":[\"name\",\"color\",\"pos\"],\"additionalProperties\":false}";

/* The text a random walk produced must satisfy SCHEMA (checked by hand). */
static void check_schema_text(const char *text) {
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    ck_assert_msg(j && json_is_object(j), "not a JSON object: '%s'", text);
    const char *name = json_string_value(json_object_get(j, "name"));
    ck_assert_msg(name && strlen(name) >= 1 && strlen(name) <= 6, "name in '%s'", text);
    for (const char *c = name; *c; c++)
        ck_assert_msg(*c >= 'a' && *c <= 'z', "name pattern in '%s'", text);
    const char *color = json_string_value(json_object_get(j, "color"));
    ck_assert_msg(color && (!strcmp(color, "red") || !strcmp(color, "green") || !strcmp(color, "blue")),
                  "color in '%s'", text);
    json_t *pos = json_object_get(j, "pos");
    ck_assert_msg(json_is_object(pos) && json_object_size(pos) == 1, "pos in '%s'", text);
    json_int_t row = json_integer_value(json_object_get(pos, "row"));
    ck_assert_msg(row >= 1 && row <= 3, "pos.row in '%s'", text);
    json_t *tags = json_object_get(j, "tags");
    if (tags) ck_assert_msg(json_is_array(tags) && json_array_size(tags) <= 3, "tags in '%s'", text);
    json_t *ok = json_object_get(j, "ok");
    if (ok) ck_assert(json_is_boolean(ok));
    const char *key;
    json_t *val;
    json_object_foreach(j, key, val) {
        (void)val;
        ck_assert_msg(!strcmp(key, "name") || !strcmp(key, "color") || !strcmp(key, "ok") || !strcmp(key, "tags") ||
                          !strcmp(key, "pos"),
                      "extra key %s in '%s'", key, text);
    }
    json_decref(j);
}

/* Every tokenizer: conforming and non-conforming texts, random walks under
 * a schema, a regex and choices. The vocab is padded by 7 ids, as a model's
 * lm_head often is; padded ids are never allowed. */
START_TEST(test_real_vocabs) {
    int which = _i;
    tok_tokenizer *t = load_tok(which);
    size_t V = tok_vocab_size(t) + 7;
    int32_t eos;
    gram_vocab *v = make_vocab(t, V, &eos);
    ck_assert_uint_eq(gram_vocab_size(v), V);

    gram_grammar *g = compile(v, GRAM_JSON_SCHEMA, SCHEMA);
    int complete = 0;
    int bad = walk_text(t, g, V, eos, "{\"name\": \"abc\", \"color\": \"blue\", \"pos\": {\"row\": 2}}", &complete);
    ck_assert_msg(bad < 0, "%s: conforming text refused at token %d", tok_names[which], bad);
    ck_assert_msg(complete, "%s: conforming text not complete", tok_names[which]);
    /* wrong enum value, then a missing required key, then a bad pattern */
    ck_assert_int_ge(walk_text(t, g, V, eos, "{\"name\": \"abc\", \"color\": \"pink\"}", &complete), 0);
    complete = 1;
    ck_assert_int_lt(walk_text(t, g, V, eos, "{\"name\": \"abc\", \"color\": \"red\"", &complete), 0);
    ck_assert_msg(!complete, "an unclosed object is complete");
    ck_assert_int_ge(walk_text(t, g, V, eos, "{\"name\": \"ABC\"", &complete), 0);
    for (uint64_t seed = 1; seed <= 6; seed++) {
        char *text = random_walk(t, g, V, eos, seed, 300);
        ck_assert_msg(text != NULL, "%s: walk %d did not end", tok_names[which], (int)seed);
        check_schema_text(text);
        free(text);
    }
    gram_grammar_free(g);

    /* regex: PCRE2 judges the walks */
    const char *re = "[0-9]{3}-[a-z]{2,5}(\\.txt)?";
    g = compile(v, GRAM_REGEX, re);
    int ec;
    PCRE2_SIZE eo;
    char anchored[128];
    snprintf(anchored, sizeof anchored, "^(?:%s)$", re);
    pcre2_code *pc = pcre2_compile((PCRE2_SPTR)anchored, PCRE2_ZERO_TERMINATED, 0, &ec, &eo, NULL);
    ck_assert_ptr_nonnull(pc);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(pc, NULL);
    for (uint64_t seed = 1; seed <= 8; seed++) {
        char *text = random_walk(t, g, V, eos, seed, 64);
        ck_assert_ptr_nonnull(text);
        ck_assert_msg(pcre2_match(pc, (PCRE2_SPTR)text, strlen(text), 0, 0, md, NULL) >= 0, "%s: '%s' !~ %s",
                      tok_names[which], text, re);
        free(text);
    }
    ck_assert_int_lt(walk_text(t, g, V, eos, "123-abc.txt", &complete), 0);
    ck_assert(complete);
    ck_assert_int_ge(walk_text(t, g, V, eos, "12-abc", &complete), 0);
    pcre2_match_data_free(md);
    pcre2_code_free(pc);
    gram_grammar_free(g);

    /* choices, with quotes, a backslash and non-ASCII text */
    const char *choices[] = {"yes", "no \"way\"", "back\\slash", "caf\xc3\xa9"};
    g = compile(v, GRAM_CHOICE, "[\"yes\", \"no \\\"way\\\"\", \"back\\\\slash\", \"caf\\u00e9\"]");
    for (uint64_t seed = 1; seed <= 8; seed++) {
        char *text = random_walk(t, g, V, eos, seed, 64);
        ck_assert_ptr_nonnull(text);
        int hit = 0;
        for (size_t i = 0; i < 4; i++)
            hit |= !strcmp(text, choices[i]);
        ck_assert_msg(hit, "%s: '%s' is not a choice", tok_names[which], text);
        free(text);
    }
    ck_assert_int_ge(walk_text(t, g, V, eos, "maybe", &complete), 0);
    gram_grammar_free(g);

    gram_vocab_free(v);
    tok_free(t);
}
END_TEST

/* The first mask of the JSON-object grammar, recomputed from the bytes: a
 * token is allowed iff it is non-empty, starts with '{', and is not a
 * special token; padded ids and EOS are not allowed. */
START_TEST(test_first_mask_exact) {
    tok_tokenizer *t = load_tok(T_SMOL);
    size_t n = tok_vocab_size(t), V = n + 5;
    int32_t eos;
    gram_vocab *v = make_vocab(t, V, &eos);
    gram_grammar *g =
        compile(v, GRAM_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}");
    char err[256];
    gram_matcher *m = NULL;
    ck_assert_int_eq(gram_matcher_new(g, &m, err, sizeof err), GRAM_OK);
    uint32_t *mask = malloc(gram_mask_words(V) * sizeof *mask);
    ck_assert_int_eq(gram_matcher_fill(m, mask, err, sizeof err), 1);
    size_t n_allowed = 0, n_brace = 0;
    for (size_t i = 0; i < V; i++) {
        const char *p;
        size_t len;
        int brace = i < n && tok_token_bytes(t, (int32_t)i, &p, &len) == 0 && len > 0 && p[0] == '{';
        /* '{' alone or followed by what can start the object's body */
        int body_ok = brace && (len == 1 || p[1] == '"' || p[1] == '}');
        n_brace += body_ok;
        n_allowed += allowed(mask, (int32_t)i);
        if (!brace) ck_assert_msg(!allowed(mask, (int32_t)i), "token %zu allowed first", i);
        if (body_ok && len <= 2) ck_assert_msg(allowed(mask, (int32_t)i), "token %zu ('%.*s') refused", i, (int)len, p);
    }
    ck_assert_uint_ge(n_brace, 1);
    ck_assert_uint_ge(n_allowed, 1);
    /* gram_mask_apply: only allowed logits survive, and greedy picks the best of them */
    float *row = malloc(V * sizeof *row);
    for (size_t i = 0; i < V; i++)
        row[i] = (float)(i % 1000);
    gram_mask_apply(row, V, mask);
    for (size_t i = 0; i < V; i++)
        ck_assert(allowed(mask, (int32_t)i) ? row[i] == (float)(i % 1000) : row[i] == -INFINITY);
    eng_sampling sp = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0};
    eng_rng rng;
    eng_rng_seed(&rng, 1);
    ck_assert(allowed(mask, eng_sample(row, (int)V, &sp, &rng)));
    free(row);
    free(mask);
    gram_matcher_free(m);
    gram_grammar_free(g);
    gram_vocab_free(v);
    tok_free(t);
}
END_TEST

/* Bad sources are GRAM_EINVAL with a message, never a crash; the cache
 * returns a working grammar for a schema sent twice. */
START_TEST(test_errors_and_cache) {
    tok_tokenizer *t = load_tok(T_QWEN);
    size_t V = tok_vocab_size(t);
    int32_t eos;
    gram_vocab *v = make_vocab(t, V, &eos);
    static const struct {
        gram_kind k;
        const char *src;
    } bad[] = {
        {GRAM_JSON_SCHEMA, "{\"type\": "},
        {GRAM_JSON_SCHEMA, "[1, 2]"},
        {GRAM_REGEX, "([a-z]"},
        {GRAM_CHOICE, "{\"a\": 1}"},
        {GRAM_CHOICE, "[]"},
        {GRAM_CHOICE, "[\"a\", 3]"},
        {GRAM_CHOICE, "[\"\"]"},
        {GRAM_EBNF, "root ::= undefined_rule"},
        {GRAM_EBNF, "not a grammar"},
        {GRAM_STRUCTURAL, "{\"type\": \"nope\"}"},
        {(gram_kind)99, "x"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gram_grammar *g = (gram_grammar *)1;
        char err[512] = "";
        int rc = gram_compile(v, bad[i].k, bad[i].src, strlen(bad[i].src), &g, NULL, err, sizeof err);
        ck_assert_msg(rc == GRAM_EINVAL, "case %zu ('%s'): rc %d", i, bad[i].src, rc);
        ck_assert_ptr_null(g);
        ck_assert_msg(err[0], "case %zu: no message", i);
    }
    /* EBNF and the builtin JSON grammar compile and walk */
    gram_grammar *g = compile(v, GRAM_EBNF, "root ::= \"a\" [0-9]+ \"z\"");
    int complete;
    ck_assert_int_lt(walk_text(t, g, V, eos, "a123z", &complete), 0);
    ck_assert(complete);
    gram_grammar_free(g);
    g = compile(v, GRAM_JSON, NULL);
    ck_assert_int_lt(walk_text(t, g, V, eos, "{\"k\": [1, 2.5, null, \"s\"]}", &complete), 0);
    ck_assert(complete);
    ck_assert_int_ge(walk_text(t, g, V, eos, "[1]", &complete), 0);
    gram_grammar_free(g);
    /* cache: the same schema again compiles to a grammar that behaves the same */
    gram_grammar *g1 = compile(v, GRAM_JSON_SCHEMA, SCHEMA), *g2 = compile(v, GRAM_JSON_SCHEMA, SCHEMA);
    gram_grammar_free(g1); /* g2 outlives g1 */
    ck_assert_int_lt(
        walk_text(t, g2, V, eos, "{\"name\": \"z\", \"color\": \"red\", \"pos\": {\"row\": 3}}", &complete), 0);
    ck_assert(complete);
    gram_grammar_free(g2);
    /* bad vocab arguments */
    gram_vocab *v2 = (gram_vocab *)1;
    const char *tok[1] = {"a"};
    size_t len[1] = {1};
    int32_t stop = 5;
    char err[256];
    ck_assert_int_eq(gram_vocab_new(tok, len, 1, 0, NULL, 0, &v2, err, sizeof err), GRAM_EINVAL);
    ck_assert_ptr_null(v2);
    ck_assert_int_eq(gram_vocab_new(tok, len, 1, 1, &stop, 1, &v2, err, sizeof err), GRAM_EINVAL);
    ck_assert_ptr_null(v2);
    gram_vocab_free(v);
    tok_free(t);
}
END_TEST

int main(void) {
    Suite *s = suite_create("grammar");
    TCase *tc = tcase_create("grammar");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_real_vocabs, 0, N_TOKS);
    tcase_add_test(tc, test_first_mask_exact);
    tcase_add_test(tc, test_errors_and_cache);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
