/*
 * tok_encode: added tokens matched first, the rest normalized,
 * pre-tokenized and BPE'd; post-processor ids for add_special.
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static int is_word_char(uint32_t cp) {
    /* Rust's char::is_alphanumeric or '_' (HF's \w for single_word). */
    if (cp == '_') return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

/* Find the next added token match in s[from, n) (leftmost, then longest),
 * of the given kind (1 raw, 2 normalized). Applies single_word and the
 * lstrip/rstrip extension. Returns 1 when found. */
static int next_added(const tok_tokenizer *t, const char *s, size_t n, size_t from, size_t floor_,
                      int kind, size_t *ms, size_t *me, int32_t *id) {
    for (size_t i = from; i < n; i++) {
        if (!(t->added_first[(unsigned char)s[i]] & kind)) continue;
        const added_tok *best = NULL;
        for (size_t k = 0; k < t->n_added; k++) {
            const added_tok *a = &t->added[k];
            if ((a->normalized ? 2 : 1) != kind) continue;
            if (a->mlen && a->mlen <= n - i && !memcmp(s + i, a->m, a->mlen) &&
                (!best || a->mlen > best->mlen))
                best = a;
        }
        if (!best) continue;
        size_t st = i, en = i + best->mlen;
        if (best->single_word) {
            size_t dummy;
            int lw = st > 0 && is_word_char(tok_utf8_last(s, st, &dummy));
            size_t j = en;
            int rw = en < n && is_word_char(tok_utf8_next((const unsigned char *)s, &j));
            /* HF skips this match and continues after it. */
            if (lw || rw) {
                i = en - 1;
                continue;
            }
        }
        if (best->lstrip) {
            while (st > floor_) {
                size_t ps;
                uint32_t cp = tok_utf8_last(s, st, &ps);
                if (!tok_is_ws(cp)) break;
                st = ps;
            }
        }
        if (best->rstrip) {
            while (en < n) {
                size_t j = en;
                uint32_t cp = tok_utf8_next((const unsigned char *)s, &j);
                if (!tok_is_ws(cp)) break;
                en = j;
            }
        }
        *ms = st;
        *me = en;
        *id = best->id;
        return 1;
    }
    return 0;
}

/* One piece between added tokens, normalized: ByteLevel's add_prefix_space
 * (when ByteLevel comes first) then the pre-tokenizers and BPE. */
static int encode_piece(const tok_tokenizer *t, const char *s, size_t n, int origin, idvec *out,
                        scratch *sc, char *err, size_t errlen) {
    if (t->prefix_space && n > 0 && s[0] != ' ') {
        /* Rare (GPT-2 style add_prefix_space): copy with the space. */
        char *p = malloc(n + 1);
        if (!p) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        p[0] = ' ';
        memcpy(p + 1, s, n);
        int rc = tok_encode_plain(t, p, n + 1, origin, out, sc, err, errlen);
        free(p);
        return rc;
    }
    return tok_encode_plain(t, s, n, origin, out, sc, err, errlen);
}

static int encode_segment(const tok_tokenizer *t, const char *s, size_t n, int origin, idvec *out,
                          scratch *sc, char *err, size_t errlen) {
    const char *ns;
    size_t nn;
    int rc = tok_normalize(t, s, n, &ns, &nn, &origin, sc, err, errlen);
    if (rc) return rc;
    if (!t->has_normalized_added) return encode_piece(t, ns, nn, origin, out, sc, err, errlen);
    /* Tokens flagged "normalized" are matched in the normalized text. */
    char *copy = malloc(nn ? nn : 1);
    if (!copy) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    memcpy(copy, ns, nn);
    size_t pos = 0, ms, me;
    int32_t id;
    while (rc == TOK_OK && next_added(t, copy, nn, pos, pos, 2, &ms, &me, &id)) {
        if (ms > pos) rc = encode_piece(t, copy + pos, ms - pos, origin && pos == 0, out, sc, err, errlen);
        if (rc == TOK_OK && tok_idvec_push(out, id)) rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        pos = me;
    }
    if (rc == TOK_OK && pos < nn) rc = encode_piece(t, copy + pos, nn - pos, origin && pos == 0, out, sc, err, errlen);
    free(copy);
    return rc;
}

static int encode_bpe(const tok_tokenizer *t, const char *text, size_t len, idvec *out, char *err,
                      size_t errlen) {
    scratch sc;
    memset(&sc, 0, sizeof sc);
    int rc = TOK_OK;
    for (int k = 0; k < t->n_pre; k++) {
        if (!t->pre[k].re) continue;
        sc.md[k] = pcre2_match_data_create_from_pattern(t->pre[k].re, NULL);
        if (!sc.md[k]) {
            rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
            goto done;
        }
    }
    size_t pos = 0, ms, me;
    int32_t id;
    while (next_added(t, text, len, pos, pos, 1, &ms, &me, &id)) {
        if (ms > pos && (rc = encode_segment(t, text + pos, ms - pos, pos == 0, out, &sc, err, errlen)))
            goto done;
        if (tok_idvec_push(out, id)) goto oom;
        pos = me;
    }
    if (pos < len && (rc = encode_segment(t, text + pos, len - pos, pos == 0, out, &sc, err, errlen)))
        goto done;
    goto done;
oom:
    rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
done:
    for (int k = 0; k < MAX_PRE; k++) pcre2_match_data_free(sc.md[k]);
    for (int k = 0; k < MAX_NORM; k++) pcre2_match_data_free(sc.nmd[k]);
    free(sc.arena.p);
    free(sc.syms);
    free(sc.heap);
    free(sc.norm[0].p);
    free(sc.norm[1].p);
    free(sc.spans[0]);
    free(sc.spans[1]);
    return rc;
}

int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
               size_t *n_ids, char *err, size_t errlen) {
    *ids = NULL;
    *n_ids = 0;
    size_t bad = tok_utf8_valid_prefix(text, len);
    if (bad != len) return tok_err(err, errlen, TOK_EINVAL, "input is not valid UTF-8 (byte offset %zu)", bad);
    if (t->kind == KIND_SPM) {
        int32_t *p = NULL;
        size_t n = 0;
        int rc = tok_spm_encode(t->spm, text, len, &p, &n, err, errlen);
        if (rc) return rc;
        int32_t bos = tok_spm_bos_id(t->spm);
        if (add_special && bos >= 0) {
            int32_t *q = realloc(p, (n + 1) * sizeof *q);
            if (!q) {
                free(p);
                return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
            }
            memmove(q + 1, q, n * sizeof *q);
            q[0] = bos;
            p = q;
            n++;
        }
        *ids = p;
        *n_ids = n;
        return TOK_OK;
    }
    idvec v = {0};
    int rc = TOK_OK;
    if (add_special)
        for (size_t i = 0; i < t->n_post_pre && rc == TOK_OK; i++) rc = tok_idvec_push(&v, t->post_pre[i]);
    if (rc == TOK_OK) rc = encode_bpe(t, text, len, &v, err, errlen);
    else rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    if (add_special)
        for (size_t i = 0; i < t->n_post_suf && rc == TOK_OK; i++)
            if (tok_idvec_push(&v, t->post_suf[i])) rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    if (rc == TOK_OK && !v.ids && tok_idvec_push(&v, 0) == TOK_OK) v.n = 0;
    if (rc || !v.ids) {
        free(v.ids);
        return rc ? rc : tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    }
    *ids = v.ids;
    *n_ids = v.n;
    return TOK_OK;
}
