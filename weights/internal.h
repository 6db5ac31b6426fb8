/*
 * Private to weights/: what the safetensors core (the set, its tensor table
 * and messages) shares with the GGUF reader. Nothing outside weights/
 * includes this.
 */
#ifndef ECHO_WEIGHTS_INTERNAL_H
#define ECHO_WEIGHTS_INTERNAL_H

#include <stdarg.h>

#include "weights/weights.h"

/* A GGUF file's metadata (gguf.c); owned by the set once committed. */
typedef struct weights_gguf weights_gguf;
void weights_gguf_free(weights_gguf *g);

/* "<file>: <what>: <reason>" into the caller's buffer; `what` (a tensor or
 * key, NUL-terminated) may be NULL and is quoted safely. */
__attribute__((format(printf, 5, 6))) void weights_priv_err(char *err, size_t errlen, const char *file,
                                                            const char *what, const char *fmt, ...);

/* Append one validated file's tensors to the set, all or nothing: checks
 * names against the set, reserves, then commits. On success the set owns
 * tmp[i].name and a copy of `fname` (each tmp[i].file points to it) and,
 * when `gguf` is not NULL, the metadata. On failure nothing changed and the
 * caller still owns everything. */
int weights_priv_commit(weights_set *ws, const char *fname, weights_tensor *tmp, size_t n, weights_gguf *gguf,
                        char *err, size_t errlen);

/* The set's GGUF metadata, NULL for safetensors. */
const weights_gguf *weights_priv_gguf(const weights_set *ws);

#endif
