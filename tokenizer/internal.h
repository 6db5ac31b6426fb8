/*
 * Private to tokenizer/: shared between the C sources and the SentencePiece
 * C++ wrapper. Not part of the public interface (see tokenizer.h).
 */
#ifndef ECHO_TOKENIZER_INTERNAL_H
#define ECHO_TOKENIZER_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tok_tokenizer;

/* Format an error message into err and return code. */
int tok_err(char *err, size_t errlen, int code, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Strict UTF-8 validation (Rust's str rules: no overlongs, surrogates or
 * values above U+10FFFF). Returns len when valid, else the offset of the
 * first invalid byte. */
size_t tok_utf8_valid_prefix(const char *s, size_t len);

/* Growable byte buffer. */
typedef struct {
    char *p;
    size_t len, cap;
} tok_buf;
int tok_buf_reserve(tok_buf *b, size_t extra);
int tok_buf_append(tok_buf *b, const void *data, size_t n);

/* Append the lossy conversion of src to out, Rust from_utf8_lossy rules.
 * When final is 0, a trailing incomplete (but so far valid) sequence is not
 * converted; its length is returned in *held (it is the tail of src).
 * Returns TOK_OK or TOK_ENOMEM. */
int tok_utf8_lossy(const char *src, size_t len, int final, tok_buf *out, size_t *held);

/* Per-id surface bytes, used by decode and streaming decode. Returns 0 and
 * sets p and n when the id names a token that is not skipped. */
int tok_id_bytes(const struct tok_tokenizer *t, int32_t id, int skip_special, int first,
                 const char **p, size_t *n);

/* 1 when the first-token rule of tok_id_bytes applies to the first token
 * emitted even if it is empty (HF decoders count tokens), 0 when it applies
 * to the first non-empty one (SentencePiece). */
int tok_first_by_token(const struct tok_tokenizer *t);

/* SentencePiece C API over the C++ library (tokenizer/sentencepiece.cc). */
typedef struct tok_spm tok_spm;
enum { TOK_SPM_NORMAL = 0, TOK_SPM_CONTROL, TOK_SPM_UNKNOWN, TOK_SPM_BYTE, TOK_SPM_USER, TOK_SPM_UNUSED };
int tok_spm_load(const char *path, tok_spm **out, char *err, size_t errlen);
void tok_spm_free(tok_spm *m);
int tok_spm_encode(const tok_spm *m, const char *text, size_t len, int32_t **ids, size_t *n,
                   char *err, size_t errlen);
int tok_spm_decode(const tok_spm *m, const int32_t *ids, size_t n, char **out, size_t *out_len,
                   char *err, size_t errlen);
size_t tok_spm_vocab_size(const tok_spm *m);
int32_t tok_spm_piece_to_id(const tok_spm *m, const char *piece); /* -1 if absent */
/* Malloc'ed copy of the piece text (NULL when id is out of range). */
char *tok_spm_id_to_piece(const tok_spm *m, int32_t id);
int tok_spm_piece_kind(const tok_spm *m, int32_t id);
int32_t tok_spm_bos_id(const tok_spm *m);
int32_t tok_spm_eos_id(const tok_spm *m);
int tok_spm_add_dummy_prefix(const tok_spm *m);

#ifdef __cplusplus
}
#endif

#endif
