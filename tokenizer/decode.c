/*
 * Decode: ids to their surface bytes under the decoder's first-token rule,
 * then Rust's lossy UTF-8; tok_decode and the streaming tok_stream_*.
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* 1 when the first-token rule of id_bytes applies to the first token
 * emitted even if it is empty (HF decoders count tokens), 0 when it applies
 * to the first non-empty one (SentencePiece). */
static int first_by_token(const tok_tokenizer *t) { return t->surf_off && t->strip_first == 1; }

/* Per-id surface bytes. Returns 0 and sets p and n when the id names a
 * token that is not skipped. */
static int id_bytes(const tok_tokenizer *t, int32_t id, int skip_special, int first, const char **p,
                    size_t *n) {
    if (id < 0 || (size_t)id >= t->n_ids || t->id_len[id] == NO_TOKEN) return -1;
    if (skip_special && (t->id_flags[id] & FLAG_SPECIAL)) return -1;
    if (t->surf_off) {
        *p = t->blob + t->surf_off[id];
        *n = t->surf_len[id];
        if (first && t->strip_first)
            while (*n && **p == ' ') {
                (*p)++;
                (*n)--;
                if (t->strip_first == 2) break;
            }
        return 0;
    }
    *p = t->blob + t->id_off[id];
    *n = t->id_len[id];
    /* SentencePiece drops the dummy-prefix space of the first piece. */
    if (t->kind == KIND_SPM && first && *n && **p == ' ' && tok_spm_add_dummy_prefix(t->spm)) {
        (*p)++;
        (*n)--;
    }
    return 0;
}

int tok_token_bytes(const tok_tokenizer *t, int32_t id, const char **p, size_t *n) {
    return id_bytes(t, id, 1, 0, p, n);
}

int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n_ids, int skip_special, char **out,
               size_t *out_len, char *err, size_t errlen) {
    *out = NULL;
    *out_len = 0;
    if (t->kind == KIND_SPM) return tok_spm_decode(t->spm, ids, n_ids, out, out_len, err, errlen);
    tok_buf raw = {0}, res = {0};
    int rc = TOK_OK;
    int by_token = first_by_token(t), first = 1;
    for (size_t i = 0; i < n_ids && rc == TOK_OK; i++) {
        const char *p;
        size_t n;
        if (id_bytes(t, ids[i], skip_special, by_token ? first : raw.len == 0, &p, &n) == 0) {
            rc = tok_buf_append(&raw, p, n);
            first = 0;
        }
    }
    if (rc == TOK_OK) rc = tok_utf8_lossy(raw.p ? raw.p : "", raw.len, 1, &res, NULL);
    if (rc == TOK_OK) rc = tok_buf_append(&res, "", 0);
    free(raw.p);
    if (rc) {
        free(res.p);
        return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    }
    *out = res.p;
    *out_len = res.len;
    return TOK_OK;
}

struct tok_stream {
    const tok_tokenizer *t;
    int skip_special;
    int first;       /* no token emitted yet (the first-token rule applies) */
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
    if (id_bytes(s->t, id, s->skip_special, s->first, &p, &n) != 0) return TOK_OK;
    /* "First" is the first emitted token or the first non-empty one. */
    if (n == 0 && !first_by_token(s->t)) return TOK_OK;
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

size_t tok_stream_pending(const tok_stream *s) { return s->npend; }

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
