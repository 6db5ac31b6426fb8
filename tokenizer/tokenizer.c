/*
 * The ByteLevel alphabet vocab strings are stored under, and the public
 * queries on a loaded tokenizer (kind, sizes, token ids, special flags).
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others
 * to U+0100.. in byte order. Inverse table for code points < 0x144. */
void tok_byte_level_tables(uint32_t b2u[256], int16_t u2b[0x144]) {
    int n = 0;
    for (int i = 0; i < 0x144; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        b2u[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        u2b[b2u[b]] = (int16_t)b;
    }
}

/* Token text -> bytes under the ByteLevel decoder's rule: if every char is
 * in the alphabet, the mapped bytes, otherwise the text's own UTF-8. */
static size_t byte_level_decode(const char *s, size_t len, const int16_t u2b[0x144],
                                char *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, n = 0;
    while (i < len) {
        uint32_t cp = tok_utf8_next(u, &i);
        if (cp >= 0x144 || u2b[cp] < 0) {
            memcpy(out, s, len);
            return len;
        }
        out[n++] = (char)u2b[cp];
    }
    return n;
}

size_t tok_key_decode(const tok_tokenizer *t, const char *s, size_t len, const int16_t u2b[0x144],
                      char *out) {
    if (t->char_level) {
        memcpy(out, s, len);
        return len;
    }
    return byte_level_decode(s, len, u2b, out);
}

const char *tok_kind(const tok_tokenizer *t) { return t->kind == KIND_SPM ? "sentencepiece" : "bpe"; }
size_t tok_vocab_size(const tok_tokenizer *t) { return t->n_ids; }
int32_t tok_eos_id(const tok_tokenizer *t) { return t->eos_id; }

int tok_is_special(const tok_tokenizer *t, int32_t id) {
    return id >= 0 && (size_t)id < t->n_ids && (t->id_flags[id] & FLAG_SPECIAL);
}

int32_t tok_token_id(const tok_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    if (t->kind == KIND_SPM) return tok_spm_piece_to_id(t->spm, token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].s, token, n)) return t->added[i].id;
    if (tok_utf8_valid_prefix(token, n) != n) return -1;
    uint32_t b2u[256];
    int16_t u2b[0x144];
    tok_byte_level_tables(b2u, u2b);
    char *tmp = malloc(n + 1);
    if (!tmp) return -1;
    size_t m = tok_key_decode(t, token, n, u2b, tmp);
    int32_t id = tok_vocab_find(t, tmp, m);
    free(tmp);
    return id;
}
