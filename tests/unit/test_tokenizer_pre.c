/*
 * tokenizer/ beyond Qwen3: every pre-tokenizer, normalizer and decoder type
 * of tokenizer.json we support, against HF `tokenizers` on small synthetic
 * tokenizers (tests/fixtures/tokenizers/NAME.json + pre_reference.jsonl, made by
 * tests/fixtures/make_tokenizer_pre_reference.py); SmolLM2-135M's tokenizer
 * rebuilt from its GGUF, loaded both as tokenizer.json and through
 * tok_load_bpe_vocab (the GGUF path); load-time refusals.
 *
 * The SmolLM2 part needs build/models/SmolLM2-135M-Instruct.Q4_1.gguf (or
 * $ECHO_SMOLLM2_GGUF) and python3 with `gguf` + `tokenizers`; it is skipped
 * with a message otherwise. The expected ids are committed
 * (smollm2_reference.jsonl); only the 2 MB tokenizer.json is generated, into
 * this binary's build folder.
 */
#include <check.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/unit/testutil.h"
#include "tokenizer/tokenizer.h"

#define TOKS TU_FIXTURES "/tokenizers"

static char g_smol_dir[PATH_MAX + 32]; /* "" when SmolLM2 is not available */
static char g_smol_skip[512];

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

static int stream_equals(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip, const char *want,
                         size_t wlen) {
    tok_stream *s = tok_stream_new(t, skip);
    ck_assert_ptr_nonnull(s);
    char *acc = malloc(wlen + 64 * (n + 1));
    size_t al = 0, cap = wlen + 64 * (n + 1);
    char err[256];
    int ok = 1;
    for (size_t i = 0; i <= n && ok; i++) {
        const char *txt;
        size_t tl;
        if (i < n) ck_assert_int_eq(tok_stream_push(s, ids[i], &txt, &tl, err, sizeof err), TOK_OK);
        else ck_assert_int_eq(tok_stream_finish(s, &txt, &tl), TOK_OK);
        if (al + tl > cap) ok = 0;
        else memcpy(acc + al, txt, tl);
        al += tl;
    }
    ok = ok && al == wlen && memcmp(acc, want, wlen) == 0;
    free(acc);
    tok_stream_free(s);
    return ok;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

/* Encode/decode/stream every corpus string; returns the number of strings
 * that matched HF in all respects. */
static size_t check_corpus(const tok_tokenizer *t, const char *name, json_t *corpus, json_t *row) {
    json_t *all_ids = json_object_get(row, "ids"), *dec = json_object_get(row, "decoded"),
           *skip = json_object_get(row, "decoded_skip");
    size_t n = json_array_size(corpus), good = 0, shown = 0;
    ck_assert_uint_eq(json_array_size(all_ids), n);
    for (size_t i = 0; i < n; i++) {
        json_t *jt = json_array_get(corpus, i);
        const char *text = json_string_value(jt);
        size_t tlen = json_string_length(jt);
        json_t *jd = json_array_get(dec, i), *js = json_array_get(skip, i);
        if (json_is_null(jd)) jd = jt;
        if (json_is_null(js)) js = jd;
        size_t nw;
        int32_t *want = json_ids(json_array_get(all_ids, i), &nw);
        int32_t *got = NULL;
        size_t ng = 0;
        char err[256], *out = NULL, *outs = NULL;
        size_t ol = 0, osl = 0;
        int ok = tok_encode(t, text, tlen, 0, &got, &ng, err, sizeof err) == TOK_OK && ng == nw &&
                 !memcmp(got, want, nw * sizeof *got);
        int eok = ok;
        ok = ok && tok_decode(t, want, nw, 0, &out, &ol, err, sizeof err) == TOK_OK &&
             ol == json_string_length(jd) && !memcmp(out, json_string_value(jd), ol);
        int dok = ok;
        ok = ok && tok_decode(t, want, nw, 1, &outs, &osl, err, sizeof err) == TOK_OK &&
             osl == json_string_length(js) && !memcmp(outs, json_string_value(js), osl);
        ok = ok && stream_equals(t, want, nw, 0, json_string_value(jd), json_string_length(jd));
        if (ok) good++;
        else if (shown++ < 3) {
            fprintf(stderr, "%s: string %zu %s mismatch: \"%s\"\n", name, i,
                    !eok ? "encode" : !dok ? "decode" : "decode(skip)/stream", text);
            print_ids("want", want, nw);
            if (got) print_ids("got ", got, ng);
            if (out && !dok) fprintf(stderr, "  decoded \"%s\" want \"%s\"\n", out, json_string_value(jd));
        }
        free(want);
        free(got);
        free(out);
        free(outs);
    }
    return good;
}

START_TEST(test_pre_corpus) {
    json_t *recs = load_jsonl(TOKS "/pre_reference.jsonl");
    json_t *corpus = json_object_get(json_array_get(recs, 0), "corpus");
    ck_assert(json_is_array(corpus) && json_array_size(corpus) > 100);
    size_t total = 0, good = 0, nt = json_array_size(recs) - 1;
    ck_assert_uint_ge(nt, 25);
    for (size_t r = 1; r <= nt; r++) {
        json_t *row = json_array_get(recs, r);
        const char *name = json_string_value(json_object_get(row, "tokenizer"));
        char path[512], err[512];
        snprintf(path, sizeof path, TOKS "/%s.json", name);
        tok_tokenizer *t = NULL;
        int rc = tok_load_json_file(path, NULL, &t, err, sizeof err);
        ck_assert_msg(rc == TOK_OK, "%s: %s", name, err);
        size_t g = check_corpus(t, name, corpus, row);
        printf("%-34s %zu of %zu strings equal (encode, decode, skip_special, stream)\n", name, g,
               json_array_size(corpus));
        total += json_array_size(corpus);
        good += g;
        tok_free(t);
    }
    printf("pre-tokenizer corpus: %zu of %zu (%zu tokenizers)\n", good, total, nt);
    ck_assert_uint_eq(good, total);
    json_decref(recs);
}
END_TEST

/* ---------- SmolLM2 ---------- */

static json_t *smol_reference(json_t **corpus) {
    json_t *recs = load_jsonl(TOKS "/smollm2_reference.jsonl");
    *corpus = json_object_get(json_array_get(recs, 0), "corpus");
    ck_assert(json_is_array(*corpus));
    return recs;
}

START_TEST(test_smollm2_json) {
    if (!g_smol_dir[0]) {
        printf("SKIP smollm2 tokenizer.json: %s\n", g_smol_skip);
        return;
    }
    char path[PATH_MAX + 64], err[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_smol_dir);
    tok_tokenizer *t = NULL;
    ck_assert_msg(tok_load_json_file(path, NULL, &t, err, sizeof err) == TOK_OK, "%s", err);
    json_t *corpus, *recs = smol_reference(&corpus);
    size_t g = check_corpus(t, "smollm2-json", corpus, json_array_get(recs, 1));
    printf("smollm2 tokenizer.json: %zu of %zu strings equal\n", g, json_array_size(corpus));
    ck_assert_uint_eq(g, json_array_size(corpus));
    ck_assert_uint_eq(tok_vocab_size(t), 49152);
    json_decref(recs);
    tok_free(t);
}
END_TEST

/* Arrays as a GGUF reader would hand them over (vocab_arrays.json holds
 * the GGUF's tokenizer.ggml.* values as the fixture script read them). */
typedef struct {
    tok_bpe_vocab v;
    json_t *root;
    const char **tok, **mer;
    size_t *tl, *ml;
    int32_t *types;
} vocab_arrays;

static void arrays_load(vocab_arrays *a, const char *path) {
    json_error_t je;
    memset(a, 0, sizeof *a);
    a->root = json_load_file(path, 0, &je);
    ck_assert_msg(a->root != NULL, "%s: %s", path, je.text);
    json_t *toks = json_object_get(a->root, "tokens"), *mer = json_object_get(a->root, "merges"),
           *ty = json_object_get(a->root, "types");
    size_t n = json_array_size(toks), m = json_array_size(mer);
    a->tok = malloc(n * sizeof *a->tok);
    a->tl = malloc(n * sizeof *a->tl);
    a->types = malloc(n * sizeof *a->types);
    a->mer = malloc((m ? m : 1) * sizeof *a->mer);
    a->ml = malloc((m ? m : 1) * sizeof *a->ml);
    ck_assert(a->tok && a->tl && a->types && a->mer && a->ml);
    for (size_t i = 0; i < n; i++) {
        a->tok[i] = json_string_value(json_array_get(toks, i));
        a->tl[i] = json_string_length(json_array_get(toks, i));
        a->types[i] = (int32_t)json_integer_value(json_array_get(ty, i));
    }
    for (size_t i = 0; i < m; i++) {
        a->mer[i] = json_string_value(json_array_get(mer, i));
        a->ml[i] = json_string_length(json_array_get(mer, i));
    }
    a->v = (tok_bpe_vocab){
        .tokens = a->tok, .token_lens = a->tl, .n_tokens = n, .merges = a->mer, .merge_lens = a->ml,
        .n_merges = m, .types = a->types, .pre = json_string_value(json_object_get(a->root, "pre")),
        .bos_id = (int32_t)json_integer_value(json_object_get(a->root, "bos_id")),
        .eos_id = (int32_t)json_integer_value(json_object_get(a->root, "eos_id")),
        .unk_id = (int32_t)json_integer_value(json_object_get(a->root, "unk_id")),
        .pad_id = (int32_t)json_integer_value(json_object_get(a->root, "pad_id")),
        .add_bos = (int)json_integer_value(json_object_get(a->root, "add_bos")),
        .add_eos = (int)json_integer_value(json_object_get(a->root, "add_eos")),
    };
}

static void arrays_free(vocab_arrays *a) {
    free(a->tok);
    free(a->tl);
    free(a->types);
    free(a->mer);
    free(a->ml);
    json_decref(a->root);
}

START_TEST(test_smollm2_arrays) {
    if (!g_smol_dir[0]) {
        printf("SKIP smollm2 tok_load_bpe_vocab: %s\n", g_smol_skip);
        return;
    }
    char path[PATH_MAX + 64], err[512];
    snprintf(path, sizeof path, "%s/vocab_arrays.json", g_smol_dir);
    vocab_arrays a;
    arrays_load(&a, path);
    ck_assert_str_eq(a.v.pre, "smollm");
    tok_tokenizer *t = NULL;
    ck_assert_msg(tok_load_bpe_vocab(&a.v, &t, err, sizeof err) == TOK_OK, "%s", err);
    json_t *corpus, *recs = smol_reference(&corpus);
    size_t g = check_corpus(t, "smollm2-arrays", corpus, json_array_get(recs, 1));
    printf("smollm2 tok_load_bpe_vocab: %zu of %zu strings equal\n", g, json_array_size(corpus));
    ck_assert_uint_eq(g, json_array_size(corpus));
    /* Sanity: the published vocabulary size, ids from the GGUF. */
    ck_assert_uint_eq(a.v.n_tokens, 49152);
    ck_assert_uint_eq(tok_vocab_size(t), 49152);
    ck_assert_int_eq(tok_eos_id(t), a.v.eos_id);
    ck_assert_int_eq(tok_eos_id(t), 2);
    ck_assert_int_eq(tok_token_id(t, "<|im_end|>"), 2);
    ck_assert(tok_is_special(t, a.v.bos_id));
    ck_assert(!tok_is_special(t, 1000));
    /* add_bos / add_eos become what add_special adds. */
    a.v.add_bos = 1;
    a.v.add_eos = 1;
    tok_tokenizer *t2 = NULL;
    ck_assert_msg(tok_load_bpe_vocab(&a.v, &t2, err, sizeof err) == TOK_OK, "%s", err);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tok_encode(t2, "hi", 2, 1, &ids, &n, err, sizeof err), TOK_OK);
    ck_assert_uint_ge(n, 3);
    ck_assert_int_eq(ids[0], a.v.bos_id);
    ck_assert_int_eq(ids[n - 1], a.v.eos_id);
    free(ids);
    tok_free(t2);
    /* Other family names load (same vocab, other pipeline); unknown names fail. */
    const char *ok_names[] = {"gpt-2", "default", "qwen2", "llama-bpe"};
    for (size_t i = 0; i < 4; i++) {
        a.v.pre = ok_names[i];
        ck_assert_msg(tok_load_bpe_vocab(&a.v, &t2, err, sizeof err) == TOK_OK, "%s: %s", ok_names[i], err);
        tok_free(t2);
    }
    a.v.pre = NULL;
    ck_assert_int_eq(tok_load_bpe_vocab(&a.v, &t2, err, sizeof err), TOK_OK);
    tok_free(t2);
    a.v.pre = "deepseek-coder";
    ck_assert_int_ne(tok_load_bpe_vocab(&a.v, &t2, err, sizeof err), TOK_OK);
    ck_assert_ptr_null(t2);
    ck_assert_msg(strstr(err, "'deepseek-coder'") != NULL, "%s", err);
    json_decref(recs);
    tok_free(t);
    arrays_free(&a);
}
END_TEST

/* Small hand-made arrays: structure errors, and llama-bpe digits in threes. */
START_TEST(test_vocab_arrays_small) {
    const char *toks[] = {"<s>", "</s>", "a", "b", "ab", "1", "2", "3", "12", "123", "\xC4\xA0", "\xC4\xA0" "a"};
    size_t tl[12];
    for (int i = 0; i < 12; i++) tl[i] = strlen(toks[i]);
    const char *mer[] = {"a b", "1 2", "12 3", "\xC4\xA0 a"};
    size_t ml[4];
    for (int i = 0; i < 4; i++) ml[i] = strlen(mer[i]);
    int32_t types[12] = {3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    tok_bpe_vocab v = {.tokens = toks, .token_lens = tl, .n_tokens = 12, .merges = mer, .merge_lens = ml,
                       .n_merges = 4, .types = types, .pre = "llama-bpe", .bos_id = 0, .eos_id = 1,
                       .unk_id = -1, .pad_id = -1, .add_bos = 1};
    tok_tokenizer *t = NULL;
    char err[256];
    ck_assert_msg(tok_load_bpe_vocab(&v, &t, err, sizeof err) == TOK_OK, "%s", err);
    int32_t *ids;
    size_t n;
    /* "<s>" is special (matched whole); " " alone (\s+(?!\S)), 1231 -> "123" "1"
     * (llama-3: \p{N}{1,3}). */
    ck_assert_int_eq(tok_encode(t, "<s>ab 1231", 10, 1, &ids, &n, err, sizeof err), TOK_OK);
    int32_t want[] = {0, 0, 4, 10, 9, 5};
    ck_assert_uint_eq(n, 6);
    ck_assert_mem_eq(ids, want, sizeof want);
    free(ids);
    char *out;
    size_t ol;
    ck_assert_int_eq(tok_decode(t, want, 6, 1, &out, &ol, err, sizeof err), TOK_OK);
    ck_assert_str_eq(out, "ab 1231");
    free(out);
    tok_free(t);
    /* Errors, each naming the problem. */
    struct {
        const char *pre;
        size_t n_tokens, n_merges;
        int32_t bos;
        const char *msg;
    } bad[] = {
        {"nope", 12, 4, 0, "'nope'"},
        {"gpt-2", 0, 0, 0, "no tokens"},
        {"gpt-2", 12, 4, 12, "out of range"},
        {"gpt-2", 4, 4, 0, "not in vocab"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tok_bpe_vocab w = v;
        w.pre = bad[i].pre;
        w.n_tokens = bad[i].n_tokens;
        w.n_merges = bad[i].n_merges;
        w.bos_id = bad[i].bos;
        err[0] = 0;
        ck_assert_int_ne(tok_load_bpe_vocab(&w, &t, err, sizeof err), TOK_OK);
        ck_assert_ptr_null(t);
        ck_assert_msg(strstr(err, bad[i].msg) != NULL, "case %zu: '%s' lacks '%s'", i, err, bad[i].msg);
    }
    const char *badtok[] = {"a", "\xff"};
    size_t badl[] = {1, 1};
    tok_bpe_vocab w = {.tokens = badtok, .token_lens = badl, .n_tokens = 2, .bos_id = -1, .eos_id = -1,
                       .unk_id = -1, .pad_id = -1};
    ck_assert_int_ne(tok_load_bpe_vocab(&w, &t, err, sizeof err), TOK_OK);
    ck_assert_msg(strstr(err, "token 1") != NULL, "%s", err);
}
END_TEST

/* ---------- refusals ---------- */

START_TEST(test_refused) {
#define V "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
    struct {
        const char *json, *msg;
    } cases[] = {
        {"{" V "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"}}", "'BertPreTokenizer'"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"UnicodeScripts\"}}", "'UnicodeScripts'"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"},"
              "{\"type\":\"Digits\"}]}}",
         "Digits after ByteLevel"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"Punctuation\",\"behavior\":\"Sideways\"}}", "'Sideways'"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}}", "one character"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"prepend_scheme\":\"sometimes\"}}", "'sometimes'"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"Metaspace\"},\"decoder\":{\"type\":\"CTC\"}}", "'CTC'"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"Metaspace\"},\"decoder\":{\"type\":\"ByteLevel\"}}",
         "needs the ByteLevel"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"Metaspace\"}}",
         "'Metaspace' with ByteLevel"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"Metaspace\"},\"decoder\":{\"type\":\"Strip\",\"content\":\" \","
              "\"start\":2,\"stop\":0}}",
         "Strip"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"normalizer\":{\"type\":\"StripAccents\"}}",
         "'StripAccents'"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"normalizer\":{\"type\":\"Replace\","
              "\"pattern\":{\"Regex\":\"(\"},\"content\":\"x\"}}",
         "Replace"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"normalizer\":{\"type\":\"Prepend\"}}", "prepend"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"}}", "no decoder"},
        /* a decoder Sequence is flat: its items are decoders, never another Sequence */
        {"{" V "\"pre_tokenizer\":{\"type\":\"Metaspace\"},\"decoder\":{\"type\":\"Sequence\",\"decoders\":"
              "[{\"type\":\"Fuse\"},{\"type\":\"Sequence\",\"decoders\":[]}]}}",
         "unsupported decoder type 'Sequence'"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"Metaspace\"},\"decoder\":{\"type\":\"Sequence\",\"decoders\":"
              "[null]}}",
         "decoder: missing \"type\""},
        {"{" V "\"pre_tokenizer\":{\"type\":\"Metaspace\"},\"decoder\":{\"type\":\"Sequence\",\"decoders\":"
              "[{\"type\":\"ByteLevel\"}]}}",
         "unsupported decoder type 'ByteLevel'"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"Metaspace\"},\"decoder\":{\"type\":\"Sequence\"}}",
         "decoder Sequence: missing array"},
        /* the other sections nest: an error deep inside still names its section */
        {"{" V "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":{}}}",
         "pre_tokenizer Sequence: missing array"},
        {"{" V "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":"
              "[{\"type\":\"Sequence\",\"normalizers\":[{\"x\":1}]}]}}",
         "normalizer: missing \"type\""},
        {"{" V "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"post_processor\":{\"type\":\"Sequence\",\"processors\":"
              "[{\"type\":\"Sequence\",\"processors\":[{\"type\":\"Nope\"}]}]}}",
         "unsupported post_processor type 'Nope'"},
    };
#undef V
    char err[512];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tok_tokenizer *t = NULL;
        err[0] = 0;
        int rc = tok_load_json_mem(cases[i].json, strlen(cases[i].json), &t, err, sizeof err);
        ck_assert_msg(rc != TOK_OK, "case %zu loaded", i);
        ck_assert_ptr_null(t);
        ck_assert_msg(strstr(err, cases[i].msg) != NULL, "case %zu: '%s' lacks '%s'", i, err, cases[i].msg);
    }
}
END_TEST

/* Sequences nest in the normalizer, pre_tokenizer and post_processor
 * sections (HF deserializes a Sequence item as any normalizer, Sequence
 * included): a Lowercase two Sequences deep still applies, and a Digits
 * inside a nested pre_tokenizer Sequence still splits. */
START_TEST(test_nested_sequences) {
    static const char json[] =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"1\":2,\"2\":3,\"12\":4},\"merges\":[\"1 2\"]},"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Sequence\",\"normalizers\":"
        "[{\"type\":\"Lowercase\"}]}]},"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Sequence\",\"pretokenizers\":"
        "[{\"type\":\"Digits\",\"individual_digits\":true}]},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
        "\"post_processor\":{\"type\":\"Sequence\",\"processors\":[{\"type\":\"Sequence\",\"processors\":"
        "[{\"type\":\"ByteLevel\"}]}]},\"decoder\":{\"type\":\"ByteLevel\"}}";
    tok_tokenizer *t = NULL;
    char err[256] = "";
    ck_assert_msg(tok_load_json_mem(json, strlen(json), &t, err, sizeof err) == TOK_OK, "%s", err);
    int32_t *ids;
    size_t n;
    /* "AB12": lowercased to "ab12", digits split apart so the "1 2" merge cannot join them */
    ck_assert_int_eq(tok_encode(t, "AB12", 4, 1, &ids, &n, err, sizeof err), TOK_OK);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(ids[0], 0);
    ck_assert_int_eq(ids[1], 1);
    ck_assert_int_eq(ids[2], 2);
    ck_assert_int_eq(ids[3], 3);
    free(ids);
    tok_free(t);
}
END_TEST

/* Generate SmolLM2's tokenizer.json from the GGUF once, before Check forks. */
static void prepare_smollm2(const char *argv0) {
    const char *gguf = getenv("ECHO_SMOLLM2_GGUF");
    if (!gguf) gguf = "build/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    struct stat st;
    if (stat(gguf, &st) != 0) {
        snprintf(g_smol_skip, sizeof g_smol_skip, "%s not found (set ECHO_SMOLLM2_GGUF)", gguf);
        return;
    }
    char exe[PATH_MAX];
    snprintf(exe, sizeof exe, "%s", argv0);
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/smollm2", dirname(exe));
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd,
             "python3 tests/fixtures/make_tokenizer_pre_reference.py --smollm2 '%s' '%s' 2>&1", gguf, dir);
    int status;
    char *out = tu_run(cmd, &status);
    if (status != 0) {
        snprintf(g_smol_skip, sizeof g_smol_skip, "fixture script failed (needs python3 gguf tokenizers): %.300s",
                 out ? out : "");
    } else {
        snprintf(g_smol_dir, sizeof g_smol_dir, "%s", dir);
    }
    free(out);
}

static Suite *pre_suite(void) {
    Suite *s = suite_create("tokenizer_pre");
    TCase *tc = tcase_create("pre");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_pre_corpus);
    tcase_add_test(tc, test_smollm2_json);
    tcase_add_test(tc, test_smollm2_arrays);
    tcase_add_test(tc, test_vocab_arrays_small);
    tcase_add_test(tc, test_refused);
    tcase_add_test(tc, test_nested_sequences);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    (void)argc;
    prepare_smollm2(argv[0]);
    SRunner *sr = srunner_create(pre_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
