/*
 * grammar/ — constrained decoding: which tokens may come next under a
 * grammar (a JSON schema, any JSON object, a regex, a list of choices, an
 * EBNF grammar), as a bitmask over the model's vocabulary.
 *
 * Contract
 * --------
 * - A thin C interface over xgrammar (C++, Apache-2.0), fetched as a pinned
 *   PyPI sdist and built into build/xgrammar by `make`
 *   (scripts/fetch-xgrammar.sh); grammar/xgrammar.cc is the only file that
 *   sees its headers. The module stands alone: it gets each token's bytes
 *   from the caller (tokenizer/ has tok_token_bytes), not from a tokenizer.
 * - gram_vocab: the vocabulary once per model. Tokens are given as the
 *   bytes they add to decoded text (byte-level BPE and SentencePiece alike,
 *   so no vocabulary-type detection is involved); a token with no bytes
 *   (special, control, padding) is never allowed, except the stop ids,
 *   which are allowed exactly when the grammar is complete. vocab_size may
 *   exceed n_tokens (padded lm_head rows: never allowed).
 * - gram_compile: a grammar for one request, compiled against the vocab.
 *   Compiled grammars are cached by (kind, source text) inside the vocab,
 *   so a schema sent again costs a lookup. Thread-safe: request threads
 *   compile while the scheduler matches. A bad source returns GRAM_EINVAL
 *   with the engine's message.
 * - JSON (GRAM_JSON, GRAM_JSON_SCHEMA) is generated with fixed separators
 *   (", " and ": ") and no other whitespace, leading whitespace included:
 *   a SentencePiece model must start with "{" rather than "▁{".
 * - gram_matcher: the state of one sequence. Single-threaded (the
 *   scheduler's). gram_matcher_fill fills a bitmask of gram_mask_words()
 *   32-bit words (bit i of word i/32 = token i allowed);
 *   gram_mask_apply sets the logits of disallowed tokens to -inf, so the
 *   sampler's top-k, top-p, temperature and argmax see only allowed ones.
 * - Errors: 0 or a negative GRAM_E* code, with a NUL-terminated message in
 *   err. Nothing here prints, throws or exits.
 */
#ifndef ECHO_GRAMMAR_H
#define ECHO_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    GRAM_OK = 0,
    GRAM_EINVAL = -1, /* bad grammar source or argument */
    GRAM_ENOMEM = -2,
    GRAM_EINTERNAL = -3, /* the grammar engine failed otherwise */
};

typedef enum gram_kind {
    GRAM_JSON = 0,        /* any JSON object (not an array or scalar): src ignored */
    GRAM_JSON_SCHEMA = 1, /* src: a JSON schema (text) */
    GRAM_REGEX = 2,       /* src: a regex (ECMAScript-like syntax) */
    GRAM_CHOICE = 3,      /* src: a JSON array of strings; output is one of them, verbatim */
    GRAM_EBNF = 4,        /* src: GBNF-style EBNF, root rule "root" */
    GRAM_STRUCTURAL = 5,  /* src: xgrammar structural-tag JSON (tool-call formats) */
} gram_kind;

/* Compiled grammars kept per vocabulary, by xgrammar's own size estimate. */
#define GRAM_CACHE_BYTES (24ll << 20)

typedef struct gram_vocab gram_vocab;
typedef struct gram_grammar gram_grammar;
typedef struct gram_matcher gram_matcher;

/* tokens[i] (lens[i] bytes, need not be NUL-terminated) is the text of
 * token i, or lens[i] == 0 for a token with none. Nothing is kept. */
int gram_vocab_new(const char *const *tokens, const size_t *lens, size_t n_tokens, size_t vocab_size,
                   const int32_t *stop_ids, size_t n_stop, gram_vocab **out, char *err, size_t errlen);
void gram_vocab_free(gram_vocab *v);
size_t gram_vocab_size(const gram_vocab *v);

/* Compile (or find in the cache) src (len bytes) as `kind`. *seconds, when
 * not NULL, receives the wall time spent (near 0 on a cache hit). */
int gram_compile(gram_vocab *v, gram_kind kind, const char *src, size_t len, gram_grammar **out, double *seconds,
                 char *err, size_t errlen);
/* A compiled grammar outlives the vocab's cache entry; free each one. */
void gram_grammar_free(gram_grammar *g);

int gram_matcher_new(const gram_grammar *g, gram_matcher **out, char *err, size_t errlen);
void gram_matcher_free(gram_matcher *m);
/* Advance by one sampled token. 1 when the grammar accepts it, 0 when not
 * (the matcher is unchanged; a masked sampler never picks such a token). */
int gram_matcher_accept(gram_matcher *m, int32_t token);
/* Allowed next tokens into mask (gram_mask_words(vocab_size) words).
 * Returns 1 when some token is disallowed (apply the mask), 0 when all are
 * allowed, or a negative GRAM_E* code. */
int gram_matcher_fill(gram_matcher *m, uint32_t *mask, char *err, size_t errlen);
/* 1 once the grammar's text is complete (only a stop token may follow). */
int gram_matcher_complete(const gram_matcher *m);
/* 1 once a stop token was accepted. */
int gram_matcher_terminated(const gram_matcher *m);

size_t gram_mask_words(size_t vocab_size);
/* row[i] = -inf for every token i the mask disallows (i < vocab_size). */
void gram_mask_apply(float *row, size_t vocab_size, const uint32_t *mask);

#ifdef __cplusplus
}
#endif

#endif
