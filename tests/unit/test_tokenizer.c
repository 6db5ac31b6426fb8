/*
 * tokenizer/: equality with Hugging Face on the committed reference corpus
 * (encode, decode, streaming decode), the Qwen3 chat template against
 * transformers' output, malformed tokenizer.json files, invalid UTF-8,
 * SentencePiece against Python sentencepiece, folder auto-detection,
 * concurrent encode, the echo-tokenize CLI, and a model's chat template
 * compiled once at load (eng_tokenizer_load) or kept with why it did not. The reference files are
 * produced by tests/fixtures/make_tokenizer_reference.py; no Python here.
 */
#include <check.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/chat.h"
#include "engine/engine.h"
#include "tests/unit/testutil.h"
#include "tokenizer/tokenizer.h"

#define QWEN_DIR TU_FIXTURES "/tokenizer/qwen3"
#define SPM_DIR TU_FIXTURES "/tokenizer/spm"

/* The Qwen3 tokenizer is large; load it once per process (Check forks per
 * test, so each forked child inherits a loaded copy when loaded in main). */
static tok_tokenizer *g_qwen;

static tok_tokenizer *qwen(void) {
    ck_assert_msg(g_qwen != NULL, "Qwen3 tokenizer failed to load");
    return g_qwen;
}

/* Load a JSONL file as an array of objects. */
static json_t *load_jsonl(const char *path) {
    json_t *arr = tu_load_jsonl(path);
    ck_assert_msg(arr != NULL, "%s: unreadable or not JSONL", path);
    return arr;
}

static int32_t *json_ids(json_t *a, size_t *n) {
    *n = json_array_size(a);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    ck_assert_ptr_nonnull(ids);
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return ids;
}

static int valid_utf8(const char *s, size_t n) {
    json_t *j = json_stringn(s, n); /* jansson validates UTF-8 */
    int ok = j != NULL;
    json_decref(j);
    return ok;
}

/* Decode token by token; the concatenation must equal the full decode and
 * every chunk must be whole characters. */
static int stream_equals(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip, const char *want,
                         size_t wlen) {
    tok_stream *s = tok_stream_new(t, skip);
    ck_assert_ptr_nonnull(s);
    char *acc = malloc(wlen + 64 * (n + 1));
    size_t al = 0;
    char err[256];
    int ok = 1;
    for (size_t i = 0; i <= n; i++) {
        const char *txt;
        size_t tl;
        if (i < n) ck_assert_int_eq(tok_stream_push(s, ids[i], &txt, &tl, err, sizeof err), TOK_OK);
        else ck_assert_int_eq(tok_stream_finish(s, &txt, &tl), TOK_OK);
        if (!valid_utf8(txt, tl)) ok = 0;
        if (al + tl > wlen + 64 * (n + 1)) {
            ok = 0;
            break;
        }
        memcpy(acc + al, txt, tl);
        al += tl;
    }
    ok = ok && al == wlen && memcmp(acc, want, wlen) == 0;
    free(acc);
    tok_stream_free(s);
    return ok;
}

START_TEST(test_corpus_encode_decode_stream) {
    const tok_tokenizer *t = qwen();
    json_t *recs = load_jsonl(TU_FIXTURES "/tokenizer/qwen3_encode.jsonl");
    size_t nrec = json_array_size(recs), enc_ok = 0, dec_ok = 0, dec_skip_ok = 0, rt_ok = 0, st_ok = 0;
    ck_assert_uint_ge(nrec, 1000);
    char err[256];
    for (size_t r = 0; r < nrec; r++) {
        json_t *rec = json_array_get(recs, r);
        json_t *jt = json_object_get(rec, "text");
        const char *text = json_string_value(jt);
        size_t tlen = json_string_length(jt);
        size_t nwant;
        int32_t *want = json_ids(json_object_get(rec, "ids"), &nwant);
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(tok_encode(t, text, tlen, 0, &ids, &n, err, sizeof err), TOK_OK);
        if (n == nwant && !memcmp(ids, want, n * sizeof *ids)) enc_ok++;
        else fprintf(stderr, "encode mismatch #%zu (%s): %.80s\n", r,
                     json_string_value(json_object_get(rec, "src")), text);
        /* add_special: Qwen3's post-processor adds nothing. */
        int32_t *ids2;
        size_t n2;
        ck_assert_int_eq(tok_encode(t, text, tlen, 1, &ids2, &n2, err, sizeof err), TOK_OK);
        ck_assert(n2 == n && !memcmp(ids, ids2, n * sizeof *ids));
        free(ids2);
        json_t *jd = json_object_get(rec, "decoded"), *js = json_object_get(rec, "decoded_skip");
        char *out;
        size_t ol;
        ck_assert_int_eq(tok_decode(t, want, nwant, 0, &out, &ol, err, sizeof err), TOK_OK);
        if (ol == json_string_length(jd) && !memcmp(out, json_string_value(jd), ol)) dec_ok++;
        else fprintf(stderr, "decode mismatch #%zu\n", r);
        /* Round trip: the text itself, or its NFC form where NFC changes it. */
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t nl = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)tlen, &nfc,
                                           UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if ((ol == tlen && !memcmp(out, text, ol)) || (nl >= 0 && (size_t)nl == ol && !memcmp(out, nfc, ol)))
            rt_ok++;
        else fprintf(stderr, "round-trip mismatch #%zu\n", r);
        free(nfc);
        free(out);
        ck_assert_int_eq(tok_decode(t, want, nwant, 1, &out, &ol, err, sizeof err), TOK_OK);
        if (ol == json_string_length(js) && !memcmp(out, json_string_value(js), ol)) dec_skip_ok++;
        free(out);
        if (stream_equals(t, want, nwant, 0, json_string_value(jd), json_string_length(jd)) &&
            stream_equals(t, want, nwant, 1, json_string_value(js), json_string_length(js)))
            st_ok++;
        free(ids);
        free(want);
    }
    fprintf(stderr, "qwen3 corpus: %zu strings, encode %zu, decode %zu, decode(skip) %zu, round-trip %zu, "
                    "stream %zu\n", nrec, enc_ok, dec_ok, dec_skip_ok, rt_ok, st_ok);
    ck_assert_uint_eq(enc_ok, nrec);
    ck_assert_uint_eq(dec_ok, nrec);
    ck_assert_uint_eq(dec_skip_ok, nrec);
    ck_assert_uint_eq(rt_ok, nrec);
    ck_assert_uint_eq(st_ok, nrec);
    json_decref(recs);
}
END_TEST

START_TEST(test_decode_random_ids) {
    /* Random ids split characters across tokens and include unknown ids:
     * U+FFFD placement must follow Rust's from_utf8_lossy exactly. */
    const tok_tokenizer *t = qwen();
    json_t *recs = load_jsonl(TU_FIXTURES "/tokenizer/qwen3_decode.jsonl");
    size_t nrec = json_array_size(recs), ok = 0;
    char err[256];
    for (size_t r = 0; r < nrec; r++) {
        json_t *rec = json_array_get(recs, r);
        size_t n;
        int32_t *ids = json_ids(json_object_get(rec, "ids"), &n);
        for (int skip = 0; skip < 2; skip++) {
            json_t *jd = json_object_get(rec, skip ? "decoded_skip" : "decoded");
            char *out;
            size_t ol;
            ck_assert_int_eq(tok_decode(t, ids, n, skip, &out, &ol, err, sizeof err), TOK_OK);
            int good = ol == json_string_length(jd) && !memcmp(out, json_string_value(jd), ol) &&
                       stream_equals(t, ids, n, skip, out, ol);
            ok += good;
            if (!good) fprintf(stderr, "random decode mismatch #%zu skip=%d\n", r, skip);
            free(out);
        }
        free(ids);
    }
    fprintf(stderr, "qwen3 random-id decode: %zu of %zu\n", ok, 2 * nrec);
    ck_assert_uint_eq(ok, 2 * nrec);
    json_decref(recs);
}
END_TEST

/* The ByteLevel token name of a single byte (GPT-2's bytes_to_unicode). */
static void byte_token_name(unsigned b, char name[4]) {
    unsigned n = 0, cp = 0;
    for (unsigned x = 0; x <= b; x++) {
        int printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
        cp = printable ? x : 256 + n++;
    }
    if (cp < 0x80) {
        name[0] = (char)cp;
        name[1] = 0;
    } else {
        name[0] = (char)(0xC0 | (cp >> 6));
        name[1] = (char)(0x80 | (cp & 0x3F));
        name[2] = 0;
    }
}

START_TEST(test_stream_split_character) {
    /* "é" = C3 A9 and "😀" = F0 9F 98 80 fed one byte token at a time. */
    const tok_tokenizer *t = qwen();
    const unsigned char bytes[] = {0xC3, 0xA9, 0xF0, 0x9F, 0x98, 0x80, 'x'};
    const size_t expect_len[] = {0, 2, 0, 0, 0, 4, 1};
    const size_t expect_pending[] = {1, 0, 1, 2, 3, 0, 0}; /* tok_stream_pending after each */
    char err[256], name[4];
    tok_stream *s = tok_stream_new(t, 0);
    ck_assert_ptr_nonnull(s);
    const char *txt;
    size_t tl;
    for (size_t i = 0; i < sizeof bytes; i++) {
        byte_token_name(bytes[i], name);
        int32_t id = tok_token_id(t, name);
        ck_assert_int_ge(id, 0);
        ck_assert_int_eq(tok_stream_push(s, id, &txt, &tl, err, sizeof err), TOK_OK);
        ck_assert_uint_eq(tl, expect_len[i]);
        ck_assert_uint_eq(tok_stream_pending(s), expect_pending[i]);
    }
    ck_assert_int_eq(tok_stream_finish(s, &txt, &tl), TOK_OK);
    ck_assert_uint_eq(tl, 0);
    /* An invalid continuation: F0 then 'x' gives U+FFFD then 'x' at once. */
    byte_token_name(0xF0, name);
    ck_assert_int_eq(tok_stream_push(s, tok_token_id(t, name), &txt, &tl, err, sizeof err), TOK_OK);
    ck_assert_uint_eq(tl, 0);
    ck_assert_int_eq(tok_stream_push(s, tok_token_id(t, "x"), &txt, &tl, err, sizeof err), TOK_OK);
    ck_assert_uint_eq(tl, 4);
    ck_assert(!memcmp(txt, "\xEF\xBF\xBDx", 4));
    ck_assert_uint_eq(tok_stream_pending(s), 0);
    /* An incomplete character at the end becomes one U+FFFD. */
    ck_assert_int_eq(tok_stream_push(s, tok_token_id(t, name), &txt, &tl, err, sizeof err), TOK_OK);
    byte_token_name(0x9F, name);
    ck_assert_int_eq(tok_stream_push(s, tok_token_id(t, name), &txt, &tl, err, sizeof err), TOK_OK);
    ck_assert_uint_eq(tl, 0);
    ck_assert_int_eq(tok_stream_finish(s, &txt, &tl), TOK_OK);
    ck_assert_uint_eq(tl, 3);
    ck_assert(!memcmp(txt, "\xEF\xBF\xBD", 3));
    ck_assert_uint_eq(tok_stream_pending(s), 0);
    tok_stream_free(s);
}
END_TEST

START_TEST(test_queries) {
    const tok_tokenizer *t = qwen();
    ck_assert_str_eq(tok_kind(t), "bpe");
    ck_assert_int_eq(tok_token_id(t, "<|im_start|>"), 151644);
    ck_assert_int_eq(tok_token_id(t, "<|im_end|>"), 151645);
    ck_assert_int_eq(tok_eos_id(t), 151645);
    ck_assert_int_eq(tok_token_id(t, "Hello"), 9707);
    ck_assert_int_eq(tok_token_id(t, "no-such-token-xyz"), -1);
    ck_assert(tok_is_special(t, 151644));
    ck_assert(!tok_is_special(t, tok_token_id(t, "<tool_call>")));
    ck_assert(!tok_is_special(t, 9707));
    ck_assert_uint_eq(tok_vocab_size(t), 151669);
}
END_TEST

START_TEST(test_invalid_utf8) {
    /* Documented choice: invalid UTF-8 input is an error naming the offset. */
    const tok_tokenizer *t = qwen();
    static const char *bad[] = {"ab\xff", "\xc0\xaf", "x\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\x80"};
    static const size_t off[] = {2, 0, 1, 0, 0, 0};
    char err[256];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 7;
        ck_assert_int_eq(tok_encode(t, bad[i], strlen(bad[i]), 0, &ids, &n, err, sizeof err), TOK_EINVAL);
        ck_assert_ptr_null(ids);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", off[i]);
        ck_assert_msg(strstr(err, want) != NULL, "%s", err);
    }
    /* Empty input: zero ids, non-NULL array. */
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tok_encode(t, "", 0, 0, &ids, &n, err, sizeof err), TOK_OK);
    ck_assert_ptr_nonnull(ids);
    ck_assert_uint_eq(n, 0);
    free(ids);
}
END_TEST

typedef struct {
    const tok_tokenizer *t;
    json_t *recs;
    int start;
    int bad;
} thr_arg;

static void *thr_encode(void *p) {
    thr_arg *a = p;
    char err[256];
    size_t nrec = json_array_size(a->recs);
    for (size_t k = 0; k < nrec; k++) {
        json_t *rec = json_array_get(a->recs, (k + (size_t)a->start * 97) % nrec);
        json_t *jt = json_object_get(rec, "text");
        json_t *ji = json_object_get(rec, "ids");
        int32_t *ids;
        size_t n;
        if (tok_encode(a->t, json_string_value(jt), json_string_length(jt), 0, &ids, &n, err, sizeof err)) {
            a->bad++;
            continue;
        }
        if (n != json_array_size(ji)) a->bad++;
        else
            for (size_t i = 0; i < n; i++)
                if (ids[i] != json_integer_value(json_array_get(ji, i))) {
                    a->bad++;
                    break;
                }
        free(ids);
    }
    return NULL;
}

START_TEST(test_concurrent_encode) {
    json_t *recs = load_jsonl(TU_FIXTURES "/tokenizer/qwen3_encode.jsonl");
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){qwen(), recs, i, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, thr_encode, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(args[i].bad, 0);
    }
    json_decref(recs);
}
END_TEST

/* ---------- chat template ---------- */

START_TEST(test_chat_template) {
    json_t *recs = load_jsonl(TU_FIXTURES "/tokenizer/qwen3_chat.jsonl");
    size_t nrec = json_array_size(recs), ok = 0;
    ck_assert_uint_ge(nrec, 20);
    char err[256];
    for (size_t r = 0; r < nrec; r++) {
        json_t *rec = json_array_get(recs, r);
        json_t *msgs = json_object_get(rec, "messages"), *tools = json_object_get(rec, "tools");
        size_t nm = json_array_size(msgs), nt = json_array_size(tools);
        tok_chat_message *m = calloc(nm ? nm : 1, sizeof *m);
        const char **tj = calloc(nt ? nt : 1, sizeof *tj);
        tok_tool_call *calls = calloc(64, sizeof *calls);
        size_t nc = 0;
        for (size_t i = 0; i < nm; i++) {
            json_t *jm = json_array_get(msgs, i);
            m[i].role = json_string_value(json_object_get(jm, "role"));
            m[i].content = json_string_value(json_object_get(jm, "content"));
            m[i].reasoning_content = json_string_value(json_object_get(jm, "reasoning_content"));
            json_t *tc = json_object_get(jm, "tool_calls");
            m[i].tool_calls = calls + nc;
            for (size_t k = 0; k < json_array_size(tc); k++) {
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
        char *out;
        size_t ol;
        ck_assert_int_eq(tok_chat_apply(m, nm, &opt, &out, &ol, err, sizeof err), TOK_OK);
        json_t *jt = json_object_get(rec, "text");
        if (ol == json_string_length(jt) && !memcmp(out, json_string_value(jt), ol)) ok++;
        else fprintf(stderr, "chat mismatch #%zu:\n--- got\n%s\n--- want\n%s\n", r, out, json_string_value(jt));
        free(out);
        free(m);
        free(tj);
        free(calls);
    }
    fprintf(stderr, "qwen3 chat template: %zu of %zu renderings equal\n", ok, nrec);
    ck_assert_uint_eq(ok, nrec);
    json_decref(recs);
}
END_TEST

START_TEST(test_chat_then_encode) {
    /* The rendered prompt tokenizes with the ChatML markers as single ids. */
    tok_chat_message m[] = {{"system", "You are helpful.", NULL, NULL, 0}, {"user", "Hi", NULL, NULL, 0}};
    tok_chat_options opt = {1, 0, NULL, 0};
    char *out, err[256];
    size_t ol;
    ck_assert_int_eq(tok_chat_apply(m, 2, &opt, &out, &ol, err, sizeof err), TOK_OK);
    ck_assert_str_eq(out, "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                          "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tok_encode(qwen(), out, ol, 0, &ids, &n, err, sizeof err), TOK_OK);
    ck_assert_int_eq(ids[0], 151644);
    free(ids);
    free(out);
    ck_assert_int_eq(tok_chat_apply(NULL, 0, NULL, &out, &ol, err, sizeof err), TOK_EINVAL);
}
END_TEST

/* What transformers renders for this context with Qwen3's template
 * (test_chat_then_encode's string). */
#define CHAT_CTX                                                                                                    \
    "{\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"},{\"role\":\"user\",\"content\":\"Hi\"}]," \
    "\"add_generation_prompt\":true,\"enable_thinking\":false}"
#define CHAT_OUT                                                                                                    \
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"     \
    "<think>\n\n</think>\n\n"

static void render_twice(const eng_chat_template *chat) {
    char *out = NULL, err[512];
    size_t ol;
    for (int i = 0; i < 2; i++) { /* the one compiled template, rendered again */
        ck_assert_msg(eng_chat_render(chat, CHAT_CTX, &out, &ol, err, sizeof err) == 0, "%s", err);
        ck_assert_str_eq(out, CHAT_OUT);
        free(out);
    }
}

START_TEST(test_chat_template_compiled_once) {
    char err[512];
    tok_tokenizer *tok = NULL;
    eng_chat_template chat;
    /* the fixture folder's own template (Qwen3's) */
    ck_assert_msg(eng_tokenizer_load(QWEN_DIR, &tok, &chat, err, sizeof err) == 0, "%s", err);
    ck_assert_ptr_nonnull(chat.source);
    ck_assert_ptr_nonnull(chat.compiled);
    ck_assert_ptr_null(chat.compile_err);
    render_twice(&chat);
    eng_chat_template_free(&chat);
    tok_free(tok);
    /* the built-in one, the default source */
    ck_assert_msg(eng_chat_template_builtin(&chat, err, sizeof err) == 0, "%s", err);
    ck_assert_ptr_nonnull(chat.compiled);
    render_twice(&chat);
    eng_chat_template_free(&chat);
    /* a template the interpreter cannot compile: no load error, every render says why */
    char *dir = tu_mkdtemp(), path[512], src[600];
    size_t n;
    char *tj = tu_read_file(QWEN_DIR "/tokenizer.json", &n);
    ck_assert_ptr_nonnull(tj);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ck_assert_int_eq(tu_write_file(path, tj, n), 0);
    free(tj);
    const char *cfg = "{\"eos_token\": \"<|im_end|>\", \"chat_template\": \"{% frobnicate %}\"}";
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    ck_assert_int_eq(tu_write_file(path, cfg, strlen(cfg)), 0);
    ck_assert_msg(eng_tokenizer_load(dir, &tok, &chat, err, sizeof err) == 0, "%s", err);
    ck_assert_ptr_null(chat.compiled);
    ck_assert_ptr_nonnull(chat.compile_err);
    ck_assert_msg(strstr(chat.compile_err, "frobnicate") != NULL, "%s", chat.compile_err);
    char *out = NULL;
    size_t ol;
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(eng_chat_render(&chat, CHAT_CTX, &out, &ol, err, sizeof err), -1);
        ck_assert_str_eq(err, chat.compile_err);
    }
    /* the same words as compiling it here */
    tok_template *t = NULL;
    snprintf(src, sizeof src, "%s", chat.source);
    ck_assert_int_ne(tok_template_compile(src, strlen(src), &t, err, sizeof err), TOK_OK);
    ck_assert_str_eq(err, chat.compile_err);
    eng_chat_template_free(&chat);
    tok_free(tok);
    tu_rmtree(dir);
    free(dir);
}
END_TEST

/* ---------- malformed files ---------- */

static int load_str(const char *json, char *err, size_t errlen) {
    tok_tokenizer *t = NULL;
    int rc = tok_load_json_mem(json, strlen(json), &t, err, errlen);
    if (rc == TOK_OK) ck_assert_ptr_nonnull(t);
    else ck_assert_ptr_null(t);
    tok_free(t);
    return rc;
}

#define MINI_PRE                                                                                    \
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"   \
    "\"decoder\":{\"type\":\"ByteLevel\"},"

START_TEST(test_malformed) {
    char err[256];
    struct {
        const char *json, *msg;
    } cases[] = {
        {"{", "bad JSON"},
        {"", "bad JSON"},
        {"[1,2]", "not an object"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", "unsupported model type 'WordPiece'"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "unsupported model type"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}," MINI_PRE "\"x\":0}", "missing \"merges\""},
        {"{\"model\":{\"type\":\"BPE\",\"merges\":[]}}", "missing \"vocab\""},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\",\"b\"]]}," MINI_PRE "\"x\":0}",
         "not in vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[42]}," MINI_PRE "\"x\":0}", "merges[0]"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}," MINI_PRE "\"x\":0}", "bad id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
         "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}}",
         "regex"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":null}", "no decoder"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}," MINI_PRE
         "\"normalizer\":{\"type\":\"BertNormalizer\"}}",
         "unsupported normalizer"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
         "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"WordPiece\"}}",
         "unsupported decoder"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}," MINI_PRE
         "\"added_tokens\":[{\"id\":\"x\"}]}",
         "added_tokens[0]"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}," MINI_PRE "\"x\":0}", "empty vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999},\"merges\":[]}," MINI_PRE "\"x\":0}",
         "too large"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        err[0] = 0;
        int rc = load_str(cases[i].json, err, sizeof err);
        ck_assert_msg(rc != TOK_OK, "case %zu loaded", i);
        ck_assert_msg(strstr(err, cases[i].msg) != NULL, "case %zu: '%s' lacks '%s'", i, err, cases[i].msg);
    }
    /* A minimal valid file works end to end. */
    ck_assert_int_eq(load_str("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
                              "\"merges\":[\"a b\"]}," MINI_PRE "\"x\":0}",
                              err, sizeof err),
                     TOK_OK);
    /* Missing file, and a truncated copy of the real one. */
    tok_tokenizer *t = NULL;
    ck_assert_int_eq(tok_load_json_file("/nonexistent/tokenizer.json", NULL, &t, err, sizeof err), TOK_EIO);
    ck_assert_ptr_null(t);
    size_t len;
    char *real = tu_read_file(QWEN_DIR "/tokenizer.json", &len);
    ck_assert_ptr_nonnull(real);
    ck_assert_int_eq(tok_load_json_mem(real, len / 2, &t, err, sizeof err), TOK_EFORMAT);
    ck_assert_ptr_null(t);
    free(real);
}
END_TEST

/* ---------- SentencePiece and auto-detection ---------- */

START_TEST(test_sentencepiece) {
    tok_tokenizer *t = NULL;
    char err[256];
    ck_assert_int_eq(tok_load_sentencepiece(SPM_DIR "/tokenizer.model", &t, err, sizeof err), TOK_OK);
    ck_assert_str_eq(tok_kind(t), "sentencepiece");
    json_t *recs = load_jsonl(TU_FIXTURES "/tokenizer/spm_reference.jsonl");
    size_t nrec = json_array_size(recs), enc_ok = 0, dec_ok = 0, st_ok = 0;
    for (size_t r = 0; r < nrec; r++) {
        json_t *rec = json_array_get(recs, r), *jt = json_object_get(rec, "text"), *jd = json_object_get(rec, "decoded");
        size_t nw;
        int32_t *want = json_ids(json_object_get(rec, "ids"), &nw);
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(tok_encode(t, json_string_value(jt), json_string_length(jt), 0, &ids, &n, err, sizeof err),
                         TOK_OK);
        if (n == nw && !memcmp(ids, want, n * sizeof *ids)) enc_ok++;
        free(ids);
        char *out;
        size_t ol;
        ck_assert_int_eq(tok_decode(t, want, nw, 0, &out, &ol, err, sizeof err), TOK_OK);
        if (ol == json_string_length(jd) && !memcmp(out, json_string_value(jd), ol)) dec_ok++;
        free(out);
        if (stream_equals(t, want, nw, 0, json_string_value(jd), json_string_length(jd))) st_ok++;
        else fprintf(stderr, "spm stream mismatch #%zu: %.60s\n", r, json_string_value(jd));
        free(want);
    }
    fprintf(stderr, "sentencepiece: %zu strings, encode %zu, decode %zu, stream %zu\n", nrec, enc_ok, dec_ok, st_ok);
    ck_assert_uint_eq(enc_ok, nrec);
    ck_assert_uint_eq(dec_ok, nrec);
    ck_assert_uint_eq(st_ok, nrec);
    /* add_special prepends BOS. */
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tok_encode(t, "hello", 5, 1, &ids, &n, err, sizeof err), TOK_OK);
    ck_assert_uint_ge(n, 2);
    ck_assert_int_eq(ids[0], 1);
    free(ids);
    ck_assert_int_eq(tok_eos_id(t), 2);
    json_decref(recs);
    tok_free(t);
    /* A file that is not a model. */
    ck_assert_int_ne(tok_load_sentencepiece(QWEN_DIR "/tokenizer_config.json", &t, err, sizeof err), TOK_OK);
    ck_assert_ptr_null(t);
}
END_TEST

START_TEST(test_autodetect) {
    tok_tokenizer *t = NULL;
    char err[256];
    ck_assert_int_eq(tok_load_dir(SPM_DIR, &t, err, sizeof err), TOK_OK);
    ck_assert_str_eq(tok_kind(t), "sentencepiece");
    tok_free(t);
    ck_assert_int_eq(tok_load_dir(QWEN_DIR, &t, err, sizeof err), TOK_OK);
    ck_assert_str_eq(tok_kind(t), "bpe");
    ck_assert_int_eq(tok_eos_id(t), 151645);
    tok_free(t);
    char *d = tu_mkdtemp();
    ck_assert_int_eq(tok_load_dir(d, &t, err, sizeof err), TOK_EIO);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err, "no tokenizer.json or tokenizer.model") != NULL, "%s", err);
    /* A folder whose tokenizer.json is broken reports that file. */
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    ck_assert_int_eq(tu_write_file(p, "{\"model\":", 9), 0);
    ck_assert_int_eq(tok_load_dir(d, &t, err, sizeof err), TOK_EFORMAT);
    ck_assert_msg(strstr(err, "tokenizer.json") != NULL, "%s", err);
    tu_rmtree(d);
    free(d);
}
END_TEST

/* ---------- CLI ---------- */

START_TEST(test_cli) {
    const char *bin = getenv("ECHO_BIN");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "printf '%%s\\n' '\"Hello <|im_start|>user\"' '\"\\u4f60\\u597d\"' | %s/echo-tokenize --model %s --jsonl",
             bin ? bin : "bin", QWEN_DIR);
    int st;
    char *out = tu_run(cmd, &st);
    ck_assert_ptr_nonnull(out);
    ck_assert_int_eq(st, 0);
    ck_assert_str_eq(out, "[9707,220,151644,872]\n[108386]\n");
    free(out);
    snprintf(cmd, sizeof cmd, "printf '%%s\\n' '[9707,220,151644,872]' '[108386]' | %s/echo-tokenize --model %s --decode --jsonl",
             bin ? bin : "bin", QWEN_DIR);
    out = tu_run(cmd, &st);
    ck_assert_ptr_nonnull(out);
    ck_assert_int_eq(st, 0);
    ck_assert_str_eq(out, "\"Hello <|im_start|>user\"\n\"你好\"\n");
    free(out);
}
END_TEST

static Suite *tokenizer_suite(void) {
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("qwen3");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_corpus_encode_decode_stream);
    tcase_add_test(tc, test_decode_random_ids);
    tcase_add_test(tc, test_stream_split_character);
    tcase_add_test(tc, test_queries);
    tcase_add_test(tc, test_invalid_utf8);
    tcase_add_test(tc, test_concurrent_encode);
    suite_add_tcase(s, tc);
    tc = tcase_create("chat");
    tcase_add_test(tc, test_chat_template);
    tcase_add_test(tc, test_chat_then_encode);
    tcase_add_test(tc, test_chat_template_compiled_once);
    suite_add_tcase(s, tc);
    tc = tcase_create("files");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_sentencepiece);
    tcase_add_test(tc, test_autodetect);
    tcase_add_test(tc, test_cli);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    char err[512];
    if (tok_load_dir(QWEN_DIR, &g_qwen, err, sizeof err) != TOK_OK) fprintf(stderr, "load: %s\n", err);
    SRunner *sr = srunner_create(tokenizer_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    tok_free(g_qwen);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
