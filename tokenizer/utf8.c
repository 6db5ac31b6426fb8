/*
 * UTF-8 helpers: strict validation, Rust-compatible lossy conversion and the
 * streaming detokenizer built on it.
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tok_err(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

int tok_buf_reserve(tok_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return TOK_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return TOK_ENOMEM;
    b->p = p;
    b->cap = cap;
    return TOK_OK;
}

int tok_buf_append(tok_buf *b, const void *data, size_t n) {
    if (tok_buf_reserve(b, n)) return TOK_ENOMEM;
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
    return TOK_OK;
}

/* Length of the valid UTF-8 sequence at s (1..4), 0 when the bytes there
 * are invalid, or -k when the k available bytes are a valid but incomplete
 * prefix. *bad receives how many bytes form the maximal invalid subpart
 * (the unit Rust replaces by one U+FFFD). */
static int seq_len(const unsigned char *s, size_t avail, size_t *bad) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) need = 2;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else {
        *bad = 1;
        return 0;
    }
    /* Only the first continuation byte has a narrowed range. */
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= avail) return -i;
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *bad = (size_t)i;
            return 0;
        }
    }
    return need + 1;
}

size_t tok_utf8_valid_prefix(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, 8 bytes at a time. */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        size_t bad = 0;
        int n = seq_len(u + i, len - i, &bad);
        if (n <= 0) return i;
        i += (size_t)n;
    }
    return len;
}

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

int tok_utf8_lossy(const char *src, size_t len, int final, tok_buf *out, size_t *held) {
    const unsigned char *u = (const unsigned char *)src;
    size_t i = 0, run = 0; /* [run, i) is valid text not yet copied */
    if (held) *held = 0;
    if (tok_buf_reserve(out, len + 3)) return TOK_ENOMEM;
    while (i < len) {
        size_t bad = 0;
        int n = seq_len(u + i, len - i, &bad);
        if (n > 0) {
            i += (size_t)n;
            continue;
        }
        if (tok_buf_append(out, src + run, i - run)) return TOK_ENOMEM;
        if (n < 0) {
            /* Incomplete at the end: Rust replaces it by one U+FFFD, a stream
             * waits for more bytes. */
            if (!final) {
                if (held) *held = len - i;
                return TOK_OK;
            }
            bad = len - i;
        }
        if (tok_buf_append(out, REPL, 3)) return TOK_ENOMEM;
        i += bad;
        run = i;
    }
    return tok_buf_append(out, src + run, i - run);
}

struct tok_stream {
    const tok_tokenizer *t;
    int skip_special;
    int first;       /* no token emitted yet (SentencePiece strips a space) */
    char pend[4];    /* held-back incomplete character */
    size_t npend;
    tok_buf in, out;
};

tok_stream *tok_stream_new(const tok_tokenizer *t, int skip_special) {
    tok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->skip_special = skip_special;
    s->first = 1;
    return s;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    free(s->in.p);
    free(s->out.p);
    free(s);
}

int tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len, char *err,
                    size_t errlen) {
    const char *p;
    size_t n, held = 0;
    s->out.len = 0;
    *text = "";
    *len = 0;
    if (tok_id_bytes(s->t, id, s->skip_special, s->first, &p, &n) != 0) return TOK_OK;
    /* "First" is the first emitted token or the first non-empty one. */
    if (n == 0 && !tok_first_by_token(s->t)) return TOK_OK;
    s->first = 0;
    if (n == 0) return TOK_OK;
    s->in.len = 0;
    if (tok_buf_append(&s->in, s->pend, s->npend) || tok_buf_append(&s->in, p, n) ||
        tok_utf8_lossy(s->in.p, s->in.len, 0, &s->out, &held) || tok_buf_append(&s->out, "", 0))
        return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    /* held <= 3: only a valid prefix of one character is kept back. */
    memcpy(s->pend, s->in.p + s->in.len - held, held);
    s->npend = held;
    *text = s->out.p;
    *len = s->out.len;
    return TOK_OK;
}

int tok_stream_finish(tok_stream *s, const char **text, size_t *len) {
    s->out.len = 0;
    int rc = tok_utf8_lossy(s->pend, s->npend, 1, &s->out, NULL);
    if (rc == TOK_OK) rc = tok_buf_append(&s->out, "", 0);
    s->npend = 0;
    s->first = 1;
    *text = rc == TOK_OK ? s->out.p : "";
    *len = rc == TOK_OK ? s->out.len : 0;
    return rc;
}
