/*
 * libFuzzer target for tokenizer/: the first input byte picks a mode, the
 * rest is the payload.
 *   0: encode arbitrary bytes with the Qwen3 tokenizer; accepted input must
 *      decode back to valid UTF-8 and stream-decode to the same text.
 *   1: decode arbitrary ids (4 bytes each, any value) in full and streamed;
 *      both must agree.
 *   2: load the payload as a tokenizer.json (must fail cleanly or work),
 *      then encode a fixed text with it.
 *   3: render the Qwen3 chat template from NUL-separated role/content pairs.
 * The Qwen3 tokenizer is read once from tests/fixtures/tokenizer/qwen3
 * (make fuzz-regress runs from the repository root); when it is missing a
 * small byte-level tokenizer built in here is used instead.
 *
 * The fuzz build links only the C sources of tokenizer/, so the SentencePiece
 * C++ wrapper is replaced by stubs that report "not built".
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- SentencePiece stubs (C++ is not part of this build) ---- */
int tok_spm_load(const char *path, tok_spm **out, char *err, size_t errlen) {
    *out = NULL;
    return tok_err(err, errlen, TOK_EUNSUPPORTED, "%s: SentencePiece not built", path);
}
void tok_spm_free(tok_spm *m) { (void)m; }
int tok_spm_encode(const tok_spm *m, const char *text, size_t len, int32_t **ids, size_t *n, char *err,
                   size_t errlen) {
    (void)m, (void)text, (void)len, (void)ids, (void)n;
    return tok_err(err, errlen, TOK_EUNSUPPORTED, "not built");
}
int tok_spm_decode(const tok_spm *m, const int32_t *ids, size_t n, char **out, size_t *out_len, char *err,
                   size_t errlen) {
    (void)m, (void)ids, (void)n, (void)out, (void)out_len;
    return tok_err(err, errlen, TOK_EUNSUPPORTED, "not built");
}
size_t tok_spm_vocab_size(const tok_spm *m) { return (void)m, 0; }
int32_t tok_spm_piece_to_id(const tok_spm *m, const char *piece) { return (void)m, (void)piece, -1; }
char *tok_spm_id_to_piece(const tok_spm *m, int32_t id) { return (void)m, (void)id, NULL; }
int tok_spm_piece_kind(const tok_spm *m, int32_t id) { return (void)m, (void)id, 0; }
int32_t tok_spm_bos_id(const tok_spm *m) { return (void)m, -1; }
int32_t tok_spm_eos_id(const tok_spm *m) { return (void)m, -1; }
int tok_spm_add_dummy_prefix(const tok_spm *m) { return (void)m, 0; }

static const char MINI[] =
    "{\"added_tokens\":[{\"id\":300,\"content\":\"<|im_start|>\",\"special\":true},"
    "{\"id\":301,\"content\":\"<x>\",\"special\":false,\"normalized\":true,\"lstrip\":true,\"rstrip\":true},"
    "{\"id\":302,\"content\":\"w\",\"single_word\":true}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
    "{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
    "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{%s},\"merges\":[\"a b\",\"ab c\",\"Ġ a\"]}}";

static tok_tokenizer *g_tok;

static char *mini_json(void) {
    /* All 256 byte tokens plus the merge results. */
    static const char *extra = "\"ab\":256,\"abc\":257,\"Ġa\":258";
    size_t cap = sizeof MINI + 256 * 16 + 64;
    char *vocab = malloc(256 * 16 + 64), *out = malloc(cap);
    if (!vocab || !out) abort();
    size_t o = 0, n = 0;
    for (unsigned b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        unsigned cp = printable ? b : 256 + n++;
        char c[8];
        if (cp == '"' || cp == '\\') snprintf(c, sizeof c, "\\%c", (char)cp);
        else if (cp < 0x80) snprintf(c, sizeof c, "%c", (char)cp);
        else snprintf(c, sizeof c, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)));
        o += (size_t)sprintf(vocab + o, "\"%s\":%u,", c, b);
    }
    strcpy(vocab + o, extra);
    snprintf(out, cap, MINI, vocab);
    free(vocab);
    return out;
}

static const tok_tokenizer *tokenizer(void) {
    if (!g_tok) {
        char err[256];
        const char *dir = getenv("ECHO_TOKENIZER_DIR");
        if (tok_load_dir(dir ? dir : "tests/fixtures/tokenizer/qwen3", &g_tok, err, sizeof err) != TOK_OK) {
            char *j = mini_json();
            if (tok_load_json_mem(j, strlen(j), &g_tok, err, sizeof err) != TOK_OK) abort();
            free(j);
        }
    }
    return g_tok;
}

/* Full decode and streamed decode must agree, and both be valid UTF-8. */
static void check_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip) {
    char err[256], *full;
    size_t fl;
    if (tok_decode(t, ids, n, skip, &full, &fl, err, sizeof err) != TOK_OK) abort();
    if (tok_utf8_valid_prefix(full, fl) != fl) abort();
    tok_stream *s = tok_stream_new(t, skip);
    if (!s) abort();
    size_t pos = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *txt;
        size_t tl;
        if (i < n) {
            if (tok_stream_push(s, ids[i], &txt, &tl, err, sizeof err) != TOK_OK) abort();
        } else if (tok_stream_finish(s, &txt, &tl) != TOK_OK) {
            abort();
        }
        if (tok_utf8_valid_prefix(txt, tl) != tl) abort();
        if (pos + tl > fl || memcmp(full + pos, txt, tl) != 0) abort();
        pos += tl;
    }
    if (pos != fl) abort();
    tok_stream_free(s);
    free(full);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const tok_tokenizer *t = tokenizer();
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    char err[256];
    switch (data[0] & 3) {
    case 0: {
        int32_t *ids;
        size_t ni;
        int rc = tok_encode(t, p, n, data[0] & 4, &ids, &ni, err, sizeof err);
        if (rc == TOK_OK) {
            for (size_t i = 0; i < ni; i++)
                if (ids[i] < 0 || (size_t)ids[i] >= tok_vocab_size(t)) abort();
            check_decode(t, ids, ni, 0);
            check_decode(t, ids, ni, 1);
            free(ids);
        } else if (rc != TOK_EINVAL || tok_utf8_valid_prefix(p, n) == n) {
            abort(); /* only invalid UTF-8 may be refused */
        }
        break;
    }
    case 1: {
        size_t ni = n / 4;
        int32_t *ids = malloc((ni ? ni : 1) * sizeof *ids);
        if (!ids) return 0;
        memcpy(ids, p, ni * 4);
        check_decode(t, ids, ni, data[0] & 4);
        free(ids);
        break;
    }
    case 2: {
        tok_tokenizer *u = NULL;
        if (tok_load_json_mem(p, n, &u, err, sizeof err) == TOK_OK) {
            int32_t *ids;
            size_t ni;
            static const char text[] = "Hello <|im_start|> wörld 123 \xF0\x9F\x98\x80\r\n  x";
            if (tok_encode(u, text, sizeof text - 1, 1, &ids, &ni, err, sizeof err) == TOK_OK) {
                check_decode(u, ids, ni, 0);
                free(ids);
            }
            tok_free(u);
        } else if (u != NULL || err[0] == 0) {
            abort();
        }
        break;
    }
    default: {
        /* NUL-separated role, content, role, content, ... */
        tok_chat_message m[16];
        size_t nm = 0, i = 0;
        char *copy = malloc(n + 1);
        if (!copy) return 0;
        memcpy(copy, p, n);
        copy[n] = 0;
        while (i < n && nm < 16) {
            m[nm].role = copy + i;
            i += strlen(copy + i) + 1;
            m[nm].content = i < n ? copy + i : "";
            if (i < n) i += strlen(copy + i) + 1;
            m[nm].reasoning_content = (data[0] & 8) ? "r" : NULL;
            m[nm].tool_calls = NULL;
            m[nm].n_tool_calls = 0;
            nm++;
        }
        tok_chat_options opt = {data[0] & 4, data[0] & 16, NULL, 0};
        char *out;
        size_t ol;
        if (tok_chat_apply(m, nm, &opt, &out, &ol, err, sizeof err) == TOK_OK) free(out);
        free(copy);
        break;
    }
    }
    return 0;
}
