/*
 * server/reasoning.c's splitter and server/tools.c's tool-call format rows
 * (hermes, qwen3_coder, mistral) on texts cut at every byte, and on the
 * pieces the real Qwen3 tokenizer's incremental decoder hands the server.
 *
 * Expected values are written out by hand here (the split of each text, the
 * calls in it), never computed by the code under test. A split must not
 * depend on where the text was cut; a stream's hold-back must never let a
 * byte of a call out as content.
 */
#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"
#include "tests/unit/testutil.h"
#include "tokenizer/tokenizer.h"

typedef struct rz_case {
    const char *parser; /* qwen3 / deepseek_r1 */
    srv_rz_state state;
    const char *stop; /* tool-call marker, or NULL */
    const char *text;
    const char *reason, *content;
    int opened;
} rz_case;

/* clang-format off */
static const rz_case RZ[] = {
    {"qwen3", SRV_RZ_START, NULL, "<think>\nR1\n</think>\n\nA", "\nR1\n", "\n\nA", 1},
    {"qwen3", SRV_RZ_START, NULL, "<think></think>", "", "", 1},
    {"qwen3", SRV_RZ_START, NULL, "Hello <think>x</think>", "", "Hello <think>x</think>", 0},
    {"qwen3", SRV_RZ_START, NULL, "<thi", "", "<thi", 0},
    {"qwen3", SRV_RZ_START, NULL, "<thinking>", "", "<thinking>", 0},
    {"qwen3", SRV_RZ_START, NULL, "<think>unfinished </thi", "unfinished </thi", "", 1},
    {"qwen3", SRV_RZ_START, NULL, "<think>a<</think>b</think>", "a<", "b</think>", 1},
    {"qwen3", SRV_RZ_START, NULL, "<think>\xc3\xa9\xe4\xb8\xad</think>\xf0\x9f\x98\x80", "\xc3\xa9\xe4\xb8\xad",
     "\xf0\x9f\x98\x80", 1},
    {"qwen3", SRV_RZ_START, "<tool_call>", "<think>plan<tool_call>\n{}\n</tool_call>", "plan",
     "<tool_call>\n{}\n</tool_call>", 1},
    {"qwen3", SRV_RZ_START, "<tool_call>", "<think>a <tool_cal b</think>c", "a <tool_cal b", "c", 1},
    {"qwen3", SRV_RZ_START, NULL, "<think>plan<tool_call>x</think>y", "plan<tool_call>x", "y", 1},
    {"deepseek_r1", SRV_RZ_THINK, NULL, "R</think>A", "R", "A", 1},
    {"deepseek_r1", SRV_RZ_THINK, NULL, "<think>R</think>A", "R", "A", 1},
    {"deepseek_r1", SRV_RZ_THINK, NULL, "<thinR</think>A", "<thinR", "A", 1},
    {"deepseek_r1", SRV_RZ_THINK, NULL, "never closed", "never closed", "", 1},
    {"deepseek_r1", SRV_RZ_THINK, "[TOOL_CALLS]", "x[TOOL_CALLS][]", "x", "[TOOL_CALLS][]", 1},
    {"qwen3", SRV_RZ_CONTENT, NULL, "<think>a</think>b", "", "<think>a</think>b", 0},
};
/* clang-format on */

/* Split text with cuts at the given offsets (sorted, within the text). */
static void split_at(const rz_case *c, const size_t *cuts, int n_cuts, srv_text *r, srv_text *ct, int *opened) {
    srv_reasoner z;
    srv_reasoner_init(&z, srv_reason_format_named(c->parser), c->state, c->stop);
    size_t at = 0, len = strlen(c->text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        ck_assert_int_eq(srv_reasoner_feed(&z, c->text + at, to - at, r, ct), 0);
        at = to;
    }
    ck_assert_int_eq(srv_reasoner_flush(&z, r, ct), 0);
    *opened = z.opened;
}

static void expect(const rz_case *c, srv_text *r, srv_text *ct, int opened, const char *how) {
    ck_assert_msg(r->len == strlen(c->reason) && (!r->len || !memcmp(r->p, c->reason, r->len)),
                  "%s, %s: reasoning '%.*s', want '%s'", c->text, how, (int)r->len, r->p ? r->p : "", c->reason);
    ck_assert_msg(ct->len == strlen(c->content) && (!ct->len || !memcmp(ct->p, c->content, ct->len)),
                  "%s, %s: content '%.*s', want '%s'", c->text, how, (int)ct->len, ct->p ? ct->p : "", c->content);
    ck_assert_msg(opened == c->opened, "%s, %s: opened %d", c->text, how, opened);
    srv_text_free(r);
    srv_text_free(ct);
}

START_TEST(reasoner_every_cut) {
    for (size_t k = 0; k < sizeof RZ / sizeof *RZ; k++) {
        const rz_case *c = &RZ[k];
        size_t len = strlen(c->text);
        srv_text r = {0}, ct = {0};
        int opened;
        split_at(c, NULL, 0, &r, &ct, &opened);
        expect(c, &r, &ct, opened, "whole");
        /* one cut at every byte, two cuts at every pair */
        for (size_t i = 0; i <= len; i++) {
            split_at(c, &i, 1, &r, &ct, &opened);
            expect(c, &r, &ct, opened, "one cut");
            for (size_t j = i; j <= len; j++) {
                size_t cuts[2] = {i, j};
                split_at(c, cuts, 2, &r, &ct, &opened);
                expect(c, &r, &ct, opened, "two cuts");
            }
        }
        /* byte by byte */
        size_t *all = malloc((len + 1) * sizeof *all);
        for (size_t i = 0; i < len; i++)
            all[i] = i;
        split_at(c, all, (int)len, &r, &ct, &opened);
        expect(c, &r, &ct, opened, "byte by byte");
        free(all);
    }
}
END_TEST

/* The real Qwen3 tokenizer: a text encoded, then decoded token by token as
 * the scheduler does (tok_stream, special tokens skipped): <think>,
 * </think> and <tool_call> are added tokens that are not special, so they
 * reach the splitter as whole pieces. */
START_TEST(reasoner_qwen3_token_stream) {
    tok_tokenizer *t = NULL;
    char err[512] = "";
    ck_assert_msg(tok_load_dir(TU_FIXTURES "/tokenizer/qwen3", &t, err, sizeof err) == 0, "%s", err);
    static const char *text = "<think>\nThe user greets; answer briefly. \xe4\xbd\xa0\xe5\xa5\xbd\n</think>\n\n"
                              "Hello!<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    int32_t *ids = NULL;
    size_t n = 0;
    ck_assert(tok_encode(t, text, strlen(text), 0, &ids, &n, err, sizeof err) == TOK_OK);
    ck_assert_int_eq(ids[0], 151667); /* <think>: one token */
    tok_stream *ds = tok_stream_new(t, 1);
    srv_reasoner z;
    srv_reasoner_init(&z, srv_reason_format_named("qwen3"), SRV_RZ_START, "<tool_call>");
    srv_text r = {0}, ct = {0};
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t pl;
        ck_assert(tok_stream_push(ds, ids[i], &p, &pl, err, sizeof err) == TOK_OK);
        ck_assert_int_eq(srv_reasoner_feed(&z, p, pl, &r, &ct), 0);
    }
    const char *p;
    size_t pl;
    tok_stream_finish(ds, &p, &pl);
    srv_reasoner_feed(&z, p, pl, &r, &ct);
    srv_reasoner_flush(&z, &r, &ct);
    ck_assert_str_eq(r.p, "\nThe user greets; answer briefly. \xe4\xbd\xa0\xe5\xa5\xbd\n");
    ck_assert_str_eq(ct.p, "\n\nHello!<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
    srv_text_free(&r);
    srv_text_free(&ct);
    tok_stream_free(ds);
    free(ids);
    tok_free(t);
}
END_TEST

/* ---- tool-call formats ---- */

typedef struct tc_case {
    const char *fmt;
    const char *text;
    const char *calls;   /* JSON: [[name, arguments object], ...], or NULL: no call */
    const char *content; /* the text before the first call, as it is (what a stream sent) */
} tc_case;

/* clang-format off */
static const tc_case TC[] = {
    {"hermes", "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
     "[[\"get_weather\", {\"city\": \"Paris\", \"days\": 3}]]", "Sure.\n"},
    {"hermes", "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1]}}\n</tool_call>",
     "[[\"a\", {}], [\"b\", {\"x\": [1]}]]", ""},
    {"hermes", "no call <tool_call>\n{\"nam\": 1}\n</tool_call>", NULL, NULL},
    {"qwen3_coder", "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
     "[[\"get_weather\", {\"city\": \"New York\", \"days\": 3}]]", "Let me check.\n"},
    {"qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=opts>\n{\"metric\": true}\n</parameter>\n<parameter=flag>\ntrue\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>",
     "[[\"get_weather\", {\"city\": \"42\", \"opts\": {\"metric\": true}, \"flag\": true, \"extra\": \"7\"}], [\"noop\", {}]]", ""},
    {"qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nmulti\nline\n</parameter>\n</function>\n</tool_call> after",
     "[[\"get_weather\", {\"city\": \"multi\\nline\"}]]", ""},
    {"qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\n Rome \n</parameter>\n<parameter=days> 2 </parameter>\n</function>\n</tool_call>",
     "[[\"get_weather\", {\"city\": \"Rome\", \"days\": 2}]]", ""},
    {"qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis", NULL, NULL},
    {"mistral", "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 1}}, {\"name\": \"noop\", \"arguments\": {}}]",
     "[[\"get_weather\", {\"city\": \"Paris\", \"days\": 1}], [\"noop\", {}]]", ""},
    {"mistral", "Checking. [TOOL_CALLS] {\"name\": \"noop\", \"arguments\": {}} done",
     "[[\"noop\", {}]]", "Checking. "},
    {"mistral", "[TOOL_CALLS][{\"name\": 5}]", NULL, NULL},
};
/* clang-format on */

/* get_weather's schema: city a string, days an integer, opts an object,
 * flag a boolean; "extra" is not in it (stays a string). */
static json_t *tools_json(void) {
    json_error_t je;
    json_t *t = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
                           "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
                           "{\"type\": \"integer\"}, \"opts\": {\"type\": \"object\"}, \"flag\": {\"type\": "
                           "\"boolean\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": \"noop\"}}]",
                           0, &je);
    ck_assert_msg(t, "%s", je.text);
    return t;
}

static void check_calls(const tc_case *c, json_t *calls, const char *content, size_t clen) {
    if (!c->calls) {
        ck_assert_msg(calls == NULL, "%s: %s: calls found in a text without a well-formed one", c->fmt, c->text);
        return;
    }
    ck_assert_msg(calls != NULL, "%s: %s: no calls", c->fmt, c->text);
    json_error_t je;
    json_t *want = json_loads(c->calls, 0, &je);
    ck_assert_msg(want, "%s", je.text);
    ck_assert_int_eq(json_array_size(calls), json_array_size(want));
    for (size_t i = 0; i < json_array_size(want); i++) {
        json_t *got = json_array_get(calls, i), *w = json_array_get(want, i);
        json_t *fn = json_object_get(got, "function");
        ck_assert_str_eq(json_string_value(json_object_get(got, "type")), "function");
        ck_assert_str_eq(json_string_value(json_object_get(fn, "name")), json_string_value(json_array_get(w, 0)));
        json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, &je);
        ck_assert_msg(args && json_equal(args, json_array_get(w, 1)), "%s: call %zu arguments %s", c->text, i,
                      json_string_value(json_object_get(fn, "arguments")));
        json_decref(args);
    }
    json_decref(want);
    ck_assert_msg(clen == strlen(c->content) && !memcmp(content, c->content, clen), "%s: content '%.*s' want '%s'",
                  c->text, (int)clen, content, c->content);
}

START_TEST(tool_formats_parse) {
    json_t *tools = tools_json();
    for (size_t k = 0; k < sizeof TC / sizeof *TC; k++) {
        const tc_case *c = &TC[k];
        const srv_tool_format *f = srv_tool_format_named(c->fmt);
        ck_assert_ptr_nonnull(f);
        char *content = NULL;
        size_t clen = 0;
        json_t *calls = srv_tool_calls_parse_typed(f, tools, c->text, strlen(c->text), "x", &content, &clen);
        check_calls(c, calls, content, clen);
        json_decref(calls);
        free(content);
    }
    json_decref(tools);
}
END_TEST

/* Streams: the text arrives in pieces cut at every byte (after a thinking
 * block the splitter removes), the answer so far goes through the row's
 * hold-back rule, and what it lets out must never reach into the first
 * call; at the end the calls parse as from the whole text. */
START_TEST(tool_formats_stream_every_cut) {
    json_t *tools = tools_json();
    for (size_t k = 0; k < sizeof TC / sizeof *TC; k++) {
        const tc_case *c = &TC[k];
        const srv_tool_format *f = srv_tool_format_named(c->fmt);
        char full[2048];
        snprintf(full, sizeof full, "<think>\nweigh it\n</think>\n\n%s", c->text);
        size_t len = strlen(full);
        const char *first = strstr(c->text, f->begin); /* where the answer's first call may start */
        size_t call_at = first ? (size_t)(first - c->text) + 2 : strlen(c->text) + 2; /* "\n\n" before it */
        for (size_t cut = 0; cut <= len; cut++) {
            srv_reasoner z;
            srv_reasoner_init(&z, srv_reason_format_named("qwen3"), SRV_RZ_START, f->begin);
            srv_text r = {0}, ct = {0};
            size_t sent = 0;
            const size_t pieces[3][2] = {{0, cut}, {cut, len}, {len, len}};
            for (int i = 0; i < 3; i++) {
                ck_assert_int_eq(srv_reasoner_feed(&z, full + pieces[i][0], pieces[i][1] - pieces[i][0], &r, &ct), 0);
                if (i == 2) srv_reasoner_flush(&z, &r, &ct);
                size_t safe = f->hold(f, ct.p, ct.len);
                ck_assert_msg(safe <= ct.len && safe <= call_at, "%s cut %zu: %zu bytes let out, the call is at %zu",
                              c->text, cut, safe, call_at);
                if (safe > sent) sent = safe;
            }
            ck_assert_str_eq(r.p, "\nweigh it\n");
            char *content = NULL;
            size_t clen = 0;
            json_t *calls = srv_tool_calls_parse_typed(f, tools, ct.p + 2, ct.len - 2, "x", &content, &clen);
            check_calls(c, calls, content, clen);
            /* with no call the held-back text goes out whole at the end */
            if (!calls) ck_assert(sent <= ct.len);
            json_decref(calls);
            free(content);
            srv_text_free(&r);
            srv_text_free(&ct);
        }
    }
    json_decref(tools);
}
END_TEST

/* The rows, and the names the flags take. */
START_TEST(format_rows) {
    ck_assert_ptr_nonnull(srv_tool_format_named("hermes"));
    ck_assert_ptr_nonnull(srv_tool_format_named("qwen3_coder"));
    ck_assert_ptr_nonnull(srv_tool_format_named("mistral"));
    ck_assert_ptr_null(srv_tool_format_named("llama3"));
    ck_assert_ptr_nonnull(srv_reason_format_named("qwen3"));
    ck_assert_ptr_nonnull(srv_reason_format_named("deepseek_r1"));
    ck_assert_ptr_null(srv_reason_format_named("none"));
    /* the hold-back stops short of a partial marker at the end */
    const srv_tool_format *m = srv_tool_format_named("mistral");
    ck_assert_uint_eq(m->hold(m, "abc[TOOL_", 9), 3);
    ck_assert_uint_eq(m->hold(m, "abc[TOOLS", 9), 9);
    const srv_tool_format *q = srv_tool_format_named("qwen3_coder");
    ck_assert_uint_eq(q->hold(q, "x<tool_call>\n<function=", 23), 1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("reasoning");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, reasoner_every_cut);
    tcase_add_test(tc, reasoner_qwen3_token_stream);
    tcase_add_test(tc, tool_formats_parse);
    tcase_add_test(tc, tool_formats_stream_every_cut);
    tcase_add_test(tc, format_rows);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
