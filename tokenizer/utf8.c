/*
 * UTF-8 and Unicode character helpers: strict validation, Rust-compatible
 * lossy conversion, the last character of a string, White_Space.
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <string.h>

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

int tok_is_ws(uint32_t cp) {
    /* Rust char::is_whitespace: the White_Space property. */
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

uint32_t tok_utf8_last(const char *s, size_t n, size_t *start) {
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    size_t j = i;
    *start = i;
    return tok_utf8_next((const unsigned char *)s, &j);
}
