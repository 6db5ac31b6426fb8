/*
 * Private to weights/: the set (set.c) and what it shares with the parsers
 * (safetensors.c, gguf.c) and open.c. Calls go one way: open.c -> parsers
 * -> set.c. Nothing outside weights/ includes this.
 */
#ifndef ECHO_WEIGHTS_INTERNAL_H
#define ECHO_WEIGHTS_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "weights/weights.h"

/* A GGUF file's metadata (gguf.c); owned by the set once committed. */
typedef struct weights_gguf weights_gguf;
void weights_gguf_free(weights_gguf *g);


/* The reference implementation refuses headers above 100 MB; a real header
 * (tens of thousands of tensors) is a few MB. The cap keeps a hostile length
 * from making jansson allocate without bound. */
#define HEADER_MAX ((uint64_t)100 * 1000 * 1000)

/* Longest tensor name quoted in a message before it is cut with "...". */
#define NAME_QUOTE_MAX 200

typedef struct mapping {
    void *addr;
    size_t len;
} mapping;

struct weights_set {
    char *source; /* path given to weights_open(); NULL for weights_new_empty() */

    weights_tensor *tensors; /* names and file strings owned by the set */
    size_t n, cap;

    size_t *slots; /* hash table: tensor index + 1, 0 = empty */
    size_t nslots; /* power of two, > 2 * n */

    char **files; /* one owned copy of each shard path (tensor.file) */
    size_t nfiles, files_cap;

    mapping *maps;
    size_t nmaps, maps_cap;

    size_t total_bytes;

    weights_gguf *gguf; /* GGUF metadata (gguf.c); NULL for safetensors */
    void (*gguf_free)(weights_gguf *); /* set with gguf, so set.c does not call into gguf.c */
};
/* A tensor's bytes [begin, end) in its file; idx: its row in the parser's table. */
typedef struct weights_span {
    uint64_t begin, end;
    size_t idx;
} weights_span;
/* Sorts spans by (begin, end, idx) and checks that none starts before the
 * one before it ends: else -1 with "<file>: <tensor>: <what> [b, e) <verb>
 * tensor "<other>" [b, e)", names from t[idx]. The parsers leave empty
 * tensors out (they occupy no bytes). */
int weights_priv_spans_disjoint(weights_span *spans, size_t n, const weights_tensor *t, const char *fname,
                                const char *what, const char *verb, char *err, size_t errlen);

/* set.c helpers the parsers and open.c share. */
const char *weights_priv_quote_name(char *out, size_t outlen, const char *s, size_t slen);
int weights_priv_dtype_from_string(const char *s, weights_dtype *dt);
void weights_priv_fmt_shape(char *buf, size_t len, int ndim, const int64_t *shape);
int weights_priv_grow(void **arr, size_t *cap, size_t n, size_t elem);
const weights_tensor *weights_priv_table_find(const weights_set *ws, const char *name);

/* safetensors.c: a JSON parse error as "<file>: <what>: ...", naming the
 * duplicated key when that is the error; open.c uses it for the index. */
void weights_priv_json_err(const char *fname, const char *what, const char *text, size_t len, const json_error_t *je,
                           char *err, size_t errlen);

/* "<file>: <what>: <reason>" into the caller's buffer; `what` (a tensor or
 * key, NUL-terminated) may be NULL and is quoted safely. */
__attribute__((format(printf, 5, 6))) void weights_priv_err(char *err, size_t errlen, const char *file,
                                                            const char *what, const char *fmt, ...);

/* Append one validated file's tensors to the set, all or nothing: checks
 * names against the set, reserves, then commits. On success the set owns
 * tmp[i].name and a copy of `fname` (each tmp[i].file points to it) and,
 * when `gguf` is not NULL, the metadata (freed with `gguf_free`). On failure
 * nothing changed and the caller still owns everything. */
int weights_priv_commit(weights_set *ws, const char *fname, weights_tensor *tmp, size_t n, weights_gguf *gguf,
                        void (*gguf_free)(weights_gguf *), char *err, size_t errlen);

/* The set's GGUF metadata, NULL for safetensors. */
const weights_gguf *weights_priv_gguf(const weights_set *ws);

#endif
