/*
 * The Jinja chat-template interpreter (tokenizer/jinja*.c) against jinja2:
 * tests/fixtures/chat_templates/{cases,expr_cases}.jsonl hold what jinja2
 * renders, in transformers' environment (tests/fixtures/jinja_reference.py),
 * for the shipped templates x conversations and for one snippet per
 * feature. Every output must be equal byte for byte; every case where
 * jinja2 raises must fail here too. Also: the Qwen3 template through the
 * interpreter equals transformers and the built-in template (tok_chat_apply) on the
 * tokenizer suite's chat fixture; garbage and hostile templates fail
 * cleanly within the limits; one compiled template renders from threads.
 */
#include <check.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/testutil.h"
#include "tokenizer/tokenizer.h"

#define TDIR TU_FIXTURES "/chat_templates"

static json_t *load_jsonl(const char *path) {
    json_t *arr = tu_load_jsonl(path);
    ck_assert_msg(arr != NULL, "%s: unreadable or not JSONL", path);
    return arr;
}

/* Compile + render; returns TOK_OK with *out, or the first error code. */
static int render_src(const char *src, size_t n, const char *ctx, char **out, size_t *ol, char *err, size_t errlen) {
    tok_template *t;
    *out = NULL;
    int rc = tok_template_compile(src, n, &t, err, errlen);
    if (rc != TOK_OK) return rc;
    rc = tok_template_render(t, ctx, ctx ? strlen(ctx) : 0, out, ol, err, errlen);
    tok_template_free(t);
    return rc;
}

/* One fixture record: returns 1 when it matches jinja2. */
static int check_case(const char *src, size_t srclen, json_t *rec, const char *label) {
    char *ctx = json_dumps(json_object_get(rec, "context"), JSON_COMPACT);
    char *out, err[512] = "";
    size_t ol = 0;
    int rc = render_src(src, srclen, ctx, &out, &ol, err, sizeof err);
    json_t *want = json_object_get(rec, "output");
    int ok;
    if (want) {
        ok = rc == TOK_OK && ol == json_string_length(want) && !memcmp(out, json_string_value(want), ol);
        if (!ok)
            fprintf(stderr, "MISMATCH %s\n--- got (rc %d: %s)\n%s\n--- want\n%s\n", label, rc, err, out ? out : "",
                    json_string_value(want));
    } else {
        ok = rc != TOK_OK && err[0];
        if (!ok) fprintf(stderr, "EXPECTED ERROR %s (%s), got:\n%s\n", label, json_string_value(json_object_get(rec, "error")), out);
    }
    free(out);
    free(ctx);
    return ok;
}

START_TEST(test_chat_cases) {
    json_t *recs = load_jsonl(TDIR "/cases.jsonl");
    size_t n = json_array_size(recs), ok = 0;
    ck_assert_uint_ge(n, 200);
    const char *cur_name = NULL;
    char *src = NULL;
    size_t srclen = 0, per_ok = 0, per_n = 0;
    for (size_t i = 0; i <= n; i++) {
        json_t *rec = json_array_get(recs, i);
        const char *tf = rec ? json_string_value(json_object_get(rec, "template")) : NULL;
        if (!tf || !cur_name || strcmp(tf, cur_name)) {
            if (cur_name) fprintf(stderr, "template %-15s %zu of %zu cases equal jinja2\n", cur_name, per_ok, per_n);
            if (!tf) break;
            free(src);
            char path[512];
            snprintf(path, sizeof path, TDIR "/%s", tf);
            src = tu_read_file(path, &srclen);
            ck_assert_msg(src != NULL, "cannot read %s", path);
            cur_name = tf;
            per_ok = per_n = 0;
        }
        char label[256];
        snprintf(label, sizeof label, "%s %s", tf, json_string_value(json_object_get(rec, "name")));
        int good = check_case(src, srclen, rec, label);
        ok += good;
        per_ok += good;
        per_n++;
    }
    free(src);
    ck_assert_uint_eq(ok, n);
    json_decref(recs);
}
END_TEST

START_TEST(test_expr_cases) {
    json_t *recs = load_jsonl(TDIR "/expr_cases.jsonl");
    size_t n = json_array_size(recs), ok = 0;
    ck_assert_uint_ge(n, 80);
    for (size_t i = 0; i < n; i++) {
        json_t *rec = json_array_get(recs, i);
        json_t *src = json_object_get(rec, "source");
        char label[256];
        snprintf(label, sizeof label, "#%zu %s: %.150s", i, json_string_value(json_object_get(rec, "feature")),
                 json_string_value(src));
        ok += check_case(json_string_value(src), json_string_length(src), rec, label);
    }
    fprintf(stderr, "expression cases: %zu of %zu equal jinja2\n", ok, n);
    ck_assert_uint_eq(ok, n);
    json_decref(recs);
}
END_TEST

/* Random nestings (jinja_reference.py random_cases): never silently
 * different. Where jinja2 prints, the interpreter prints the same or fails
 * (generators consumed lazily by jinja2 are the known source of such
 * failures); where jinja2 raises, it fails too. */
START_TEST(test_random_exprs) {
    json_t *recs = load_jsonl(TDIR "/expr_random.jsonl");
    size_t n = json_array_size(recs), same = 0, both_fail = 0, we_fail = 0, wrong = 0;
    ck_assert_uint_ge(n, 500);
    char *ctx = json_dumps(json_object_get(json_array_get(recs, 0), "context"), JSON_COMPACT);
    for (size_t i = 1; i < n; i++) {
        json_t *rec = json_array_get(recs, i), *src = json_object_get(rec, "source"), *want = json_object_get(rec, "output");
        char *out, err[512] = "";
        size_t ol = 0;
        int rc = render_src(json_string_value(src), json_string_length(src), ctx, &out, &ol, err, sizeof err);
        if (rc != TOK_OK) {
            ck_assert_msg(err[0], "failure without a message: %s", json_string_value(src));
            if (want) we_fail++;
            else both_fail++;
        } else if (want && ol == json_string_length(want) && !memcmp(out, json_string_value(want), ol)) {
            same++;
        } else {
            wrong++;
            fprintf(stderr, "SILENTLY DIFFERENT #%zu %s\n--- got\n%s\n--- want\n%s\n", i, json_string_value(src), out,
                    want ? json_string_value(want) : json_string_value(json_object_get(rec, "error")));
        }
        free(out);
    }
    fprintf(stderr, "random expressions: %zu equal, %zu fail in both, %zu fail only here, %zu silently different\n", same,
            both_fail, we_fail, wrong);
    ck_assert_uint_eq(wrong, 0);
    ck_assert_uint_le(we_fail * 20, n); /* at most 5% loud failures where jinja2 prints */
    free(ctx);
    json_decref(recs);
}
END_TEST

/* The tokenizer suite's chat fixture (transformers apply_chat_template with
 * Qwen3's template) through the interpreter from the fixture file and
 * through tok_chat_apply, which renders tokenizer/chat.c's built-in copy. */
START_TEST(test_qwen3_vs_builtin) {
    json_t *recs = load_jsonl(TU_FIXTURES "/tokenizer/qwen3_chat.jsonl");
    size_t n = json_array_size(recs), ok = 0, srclen;
    ck_assert_uint_ge(n, 20);
    char *src = tu_read_file(TDIR "/qwen3.jinja", &srclen), err[512];
    ck_assert_ptr_nonnull(src);
    tok_template *t;
    ck_assert_int_eq(tok_template_compile(src, srclen, &t, err, sizeof err), TOK_OK);
    for (size_t r = 0; r < n; r++) {
        json_t *rec = json_array_get(recs, r);
        json_t *msgs = json_object_get(rec, "messages"), *tools = json_object_get(rec, "tools");
        /* context as apply_chat_template builds it: tools parsed, None when empty */
        json_t *ctx = json_object();
        json_object_set(ctx, "messages", msgs);
        json_t *jt = json_array();
        for (size_t i = 0; i < json_array_size(tools); i++)
            json_array_append_new(jt, json_loads(json_string_value(json_array_get(tools, i)), 0, NULL));
        json_object_set_new(ctx, "tools", json_array_size(jt) ? jt : json_null());
        if (!json_array_size(jt)) json_decref(jt);
        json_object_set(ctx, "add_generation_prompt", json_object_get(rec, "add_generation_prompt"));
        json_object_set(ctx, "enable_thinking", json_object_get(rec, "enable_thinking"));
        char *cj = json_dumps(ctx, JSON_COMPACT), *out;
        size_t ol;
        ck_assert_int_eq(tok_template_render(t, cj, strlen(cj), &out, &ol, err, sizeof err), TOK_OK);

        /* the built-in template on the same record */
        size_t nm = json_array_size(msgs), nt = json_array_size(tools), nc = 0;
        tok_chat_message *m = calloc(nm ? nm : 1, sizeof *m);
        const char **tj = calloc(nt ? nt : 1, sizeof *tj);
        tok_tool_call *calls = calloc(64, sizeof *calls);
        for (size_t i = 0; i < nm; i++) {
            json_t *jm = json_array_get(msgs, i);
            m[i].role = json_string_value(json_object_get(jm, "role"));
            m[i].content = json_string_value(json_object_get(jm, "content"));
            m[i].reasoning_content = json_string_value(json_object_get(jm, "reasoning_content"));
            json_t *tc = json_object_get(jm, "tool_calls");
            m[i].tool_calls = calls + nc;
            for (size_t k = 0; k < json_array_size(tc) && nc < 64; k++) {
                json_t *f = json_object_get(json_array_get(tc, k), "function");
                calls[nc].name = json_string_value(json_object_get(f, "name"));
                calls[nc].arguments = json_string_value(json_object_get(f, "arguments"));
                nc++;
                m[i].n_tool_calls++;
            }
        }
        for (size_t i = 0; i < nt; i++) tj[i] = json_string_value(json_array_get(tools, i));
        tok_chat_options opt = {json_is_true(json_object_get(rec, "add_generation_prompt")),
                                json_is_true(json_object_get(rec, "enable_thinking")), tj, nt};
        char *builtin;
        size_t hl;
        ck_assert_int_eq(tok_chat_apply(m, nm, &opt, &builtin, &hl, err, sizeof err), TOK_OK);
        json_t *want = json_object_get(rec, "text");
        int good = ol == json_string_length(want) && !memcmp(out, json_string_value(want), ol) && hl == ol &&
                   !memcmp(builtin, out, ol);
        if (!good) fprintf(stderr, "qwen3 #%zu:\n--- interpreter\n%s\n--- built-in\n%s\n--- transformers\n%s\n", r, out, builtin, json_string_value(want));
        ok += good;
        free(builtin);
        free(m);
        free(tj);
        free(calls);
        free(out);
        free(cj);
        json_decref(ctx);
    }
    fprintf(stderr, "qwen3 interpreter == built-in == transformers: %zu of %zu\n", ok, n);
    ck_assert_uint_eq(ok, n);
    tok_template_free(t);
    free(src);
    json_decref(recs);
}
END_TEST

/* Errors carry a message; hostile templates hit a limit instead of hanging. */
START_TEST(test_errors_and_limits) {
    static const struct {
        const char *src;
        int compile_fails;
        const char *needle; /* in the message */
    } cases[] = {
        {"{% raw %}x{% endraw %}", 1, "raw"},
        {"{% include 'x' %}", 1, "include"},
        {"{% extends 'x' %}", 1, "extends"},
        {"{% with a = 1 %}{% endwith %}", 1, "with"},
        {"{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}", 0, "caller"},
        {"{% for x in l recursive %}{% endfor %}", 1, "recursive"},
        {"{{ x | nosuch }}", 1, "nosuch"},
        {"line1\nline2\n{{ x is nosuch }}", 1, "line 3"},
        {"{{ f(*args) }}", 1, "args"},
        {"{{ 99999999999999999999 }}", 1, "integer"},
        {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", 0, "budget"},
        {"{{ 'x' * 100000000 }}", 0, "long"},
        {"{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", 0, ""},
        {"{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", 0, "recursion"},
        {"{{ raise_exception('boom') }}", 0, "boom"},
        {"{{ 2 ** 64 }}", 0, "overflow"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tok_template *t = NULL;
        char err[512] = "", *out = NULL;
        size_t ol;
        int rc = tok_template_compile(cases[i].src, strlen(cases[i].src), &t, err, sizeof err);
        if (cases[i].compile_fails) {
            ck_assert_msg(rc == TOK_EFORMAT && t == NULL, "case %zu should not compile", i);
        } else {
            ck_assert_msg(rc == TOK_OK, "case %zu: %s", i, err);
            rc = tok_template_render(t, "{}", 2, &out, &ol, err, sizeof err);
            ck_assert_msg(rc == TOK_EINVAL && out == NULL, "case %zu should fail to render", i);
            tok_template_free(t);
        }
        ck_assert_msg(err[0] && strstr(err, cases[i].needle), "case %zu: message '%s' lacks '%s'", i, err, cases[i].needle);
    }
    /* deep nesting */
    size_t n = 20000;
    char *deep = malloc(2 * n + 8);
    strcpy(deep, "{{ ");
    for (size_t i = 0; i < n; i++) deep[3 + i] = '(';
    deep[3 + n] = '1';
    for (size_t i = 0; i < n; i++) deep[4 + n + i] = ')';
    strcpy(deep + 4 + 2 * n, " }}");
    tok_template *t;
    char err[256];
    ck_assert_int_eq(tok_template_compile(deep, strlen(deep), &t, err, sizeof err), TOK_EFORMAT);
    free(deep);
    /* parameter lists hold up to 32 names, in macros and call blocks alike */
    for (int call = 0; call < 2; call++)
        for (int np = 32; np <= 33; np++) {
            char src[512];
            size_t k = (size_t)snprintf(src, sizeof src, "%s", call ? "{% call(" : "{% macro m(");
            for (int i = 0; i < np; i++) k += (size_t)snprintf(src + k, sizeof src - k, "%sp%d", i ? "," : "", i);
            snprintf(src + k, sizeof src - k, "%s", call ? ") m() %}x{% endcall %}" : ") %}x{% endmacro %}");
            err[0] = 0;
            int rc = tok_template_compile(src, strlen(src), &t, err, sizeof err);
            if (np == 32) {
                ck_assert_msg(rc == TOK_OK, "%d names: %s", np, err);
                tok_template_free(t);
            } else {
                ck_assert_int_eq(rc, TOK_EFORMAT);
                ck_assert_msg(strstr(err, call ? "too many caller parameters" : "too many macro parameters"), "%s", err);
            }
        }
    /* bad arguments and contexts */
    ck_assert_int_eq(tok_template_compile("\xff", 1, &t, err, sizeof err), TOK_EINVAL);
    ck_assert_int_eq(tok_template_compile("{{ x }}", 7, &t, err, sizeof err), TOK_OK);
    char *out;
    size_t ol;
    ck_assert_int_eq(tok_template_render(t, "[1]", 3, &out, &ol, err, sizeof err), TOK_EINVAL);
    ck_assert_int_eq(tok_template_render(t, "{", 1, &out, &ol, err, sizeof err), TOK_EINVAL);
    ck_assert_int_eq(tok_template_render(t, NULL, 0, &out, &ol, err, sizeof err), TOK_OK);
    ck_assert_str_eq(out, "");
    free(out);
    ck_assert_int_eq(tok_template_render(t, "{\"x\": \"a\\u0000b\"}", 17, &out, &ol, err, sizeof err), TOK_OK);
    ck_assert_uint_eq(ol, 3);
    ck_assert(!memcmp(out, "a\0b", 3));
    free(out);
    tok_template_free(t);
    tok_template_free(NULL);
}
END_TEST

/* Mutated templates (byte flips, truncations, splices) never crash. */
START_TEST(test_garbage) {
    static const char *const files[] = {"qwen3.jinja", "llama3.jinja", "features.jinja", "qwen2.5.jinja"};
    const char *ctx = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\","
                      "\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]}],"
                      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"add_generation_prompt\":true}";
    uint64_t rng = 42;
    size_t compiled = 0, rendered = 0, total = 0;
    for (size_t fi = 0; fi < sizeof files / sizeof *files; fi++) {
        char path[256];
        size_t len;
        snprintf(path, sizeof path, TDIR "/%s", files[fi]);
        char *src = tu_read_file(path, &len);
        ck_assert_ptr_nonnull(src);
        char *m = malloc(len + 1);
        static const char alphabet[] = "{}%#-+()[]|.,:'\"=~ \nabcxyz019_";
        for (int it = 0; it < 300; it++) {
            memcpy(m, src, len);
            size_t ml = len;
            int edits = 1 + (int)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 60);
            for (int e = 0; e < edits; e++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                size_t pos = (rng >> 33) % ml;
                switch ((rng >> 20) % 3) {
                case 0: m[pos] = alphabet[(rng >> 8) % (sizeof alphabet - 1)]; break;
                case 1: ml = pos + 1; break;
                default: memmove(m + pos, m + pos + 1, ml - pos - 1), ml--; break;
                }
                if (!ml) ml = 1;
            }
            tok_template *t;
            char err[256], *out;
            size_t ol;
            total++;
            if (tok_template_compile(m, ml, &t, err, sizeof err) != TOK_OK) {
                ck_assert(err[0]);
                continue;
            }
            compiled++;
            int rc = tok_template_render(t, ctx, strlen(ctx), &out, &ol, err, sizeof err);
            if (rc == TOK_OK) rendered++, free(out);
            else ck_assert(err[0]);
            tok_template_free(t);
        }
        free(m);
        free(src);
    }
    fprintf(stderr, "garbage: %zu mutated templates, %zu compiled, %zu rendered\n", total, compiled, rendered);
}
END_TEST

/* Deep recursion stays within a 1 MiB thread stack (the depth limits bound
 * the C recursion of the evaluator). */
static void *thr_deep(void *p) {
    int *rc = p;
    static char src[4096];
    size_t k = 0;
    k += (size_t)snprintf(src + k, sizeof src - k, "{%% macro r(n) %%}{{ r(");
    for (int i = 0; i < 40; i++) src[k++] = '(';
    k += (size_t)snprintf(src + k, sizeof src - k, "n + 1");
    for (int i = 0; i < 40; i++) src[k++] = ')';
    k += (size_t)snprintf(src + k, sizeof src - k, ") | string | trim }}{%% endmacro %%}{{ r(0) }}");
    tok_template *t;
    char err[256], *out;
    size_t ol;
    rc[0] = tok_template_compile(src, k, &t, err, sizeof err);
    if (rc[0] == TOK_OK) {
        rc[1] = tok_template_render(t, "{}", 2, &out, &ol, err, sizeof err);
        tok_template_free(t);
    }
    return NULL;
}

START_TEST(test_small_stack) {
    pthread_attr_t at;
    pthread_t th;
    int rc[2] = {-99, -99};
    ck_assert_int_eq(pthread_attr_init(&at), 0);
    ck_assert_int_eq(pthread_attr_setstacksize(&at, 1 << 20), 0);
    ck_assert_int_eq(pthread_create(&th, &at, thr_deep, rc), 0);
    pthread_join(th, NULL);
    pthread_attr_destroy(&at);
    ck_assert_int_eq(rc[0], TOK_OK);
    ck_assert_int_eq(rc[1], TOK_EINVAL); /* macro recursion limit, not a stack overflow */
}
END_TEST

typedef struct {
    const tok_template *t;
    const char *ctx, *want;
    int bad;
} thr_arg;

static void *thr_render(void *p) {
    thr_arg *a = p;
    for (int i = 0; i < 200; i++) {
        char *out, err[256];
        size_t ol;
        if (tok_template_render(a->t, a->ctx, strlen(a->ctx), &out, &ol, err, sizeof err) != TOK_OK) {
            a->bad++;
            continue;
        }
        a->bad += strcmp(out, a->want) != 0;
        free(out);
    }
    return NULL;
}

START_TEST(test_threads) {
    size_t len;
    char *src = tu_read_file(TDIR "/features.jinja", &len), err[256], *want;
    ck_assert_ptr_nonnull(src);
    tok_template *t;
    ck_assert_int_eq(tok_template_compile(src, len, &t, err, sizeof err), TOK_OK);
    const char *ctx = "{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"hi\"},"
                      "{\"role\":\"assistant\",\"content\":\"yo\"}],\"tools\":null,\"bos_token\":\"<s>\",\"add_generation_prompt\":true}";
    size_t ol;
    ck_assert_int_eq(tok_template_render(t, ctx, strlen(ctx), &want, &ol, err, sizeof err), TOK_OK);
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){t, ctx, want, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, thr_render, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(args[i].bad, 0);
    }
    free(want);
    tok_template_free(t);
    free(src);
}
END_TEST

static Suite *jinja_suite(void) {
    Suite *s = suite_create("jinja");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_chat_cases);
    tcase_add_test(tc, test_expr_cases);
    tcase_add_test(tc, test_random_exprs);
    tcase_add_test(tc, test_qwen3_vs_builtin);
    suite_add_tcase(s, tc);
    tc = tcase_create("robustness");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_errors_and_limits);
    tcase_add_test(tc, test_garbage);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_small_stack);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(jinja_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
