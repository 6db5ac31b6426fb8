/*
 * Pre-tokenization of one normalized segment (Split behaviours, Metaspace
 * and prefix-space rewrites) and BPE of each resulting piece.
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

static int spans_push(scratch *sc, int which, size_t *n, size_t s, size_t e) {
    if (*n == sc->span_cap[which]) {
        size_t cap = sc->span_cap[which] ? sc->span_cap[which] * 2 : 64;
        struct span *p = realloc(sc->spans[which], cap * sizeof *p);
        if (!p) return TOK_ENOMEM;
        sc->spans[which] = p;
        sc->span_cap[which] = cap;
    }
    sc->spans[which][(*n)++] = (struct span){s, e, 0};
    return TOK_OK;
}

int tok_regex_next(const pre_step *ps, pcre2_match_data *md, const char *s, size_t len,
                   size_t off, size_t *ms, size_t *me) {
    int r = ps->jit ? pcre2_jit_match(ps->re, (PCRE2_SPTR)s, len, off, 0, md, NULL)
                    : pcre2_match(ps->re, (PCRE2_SPTR)s, len, off, PCRE2_NO_UTF_CHECK, md, NULL);
    if (r < 0) return r == PCRE2_ERROR_NOMATCH ? 0 : -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* One Split step over [s, e) of buf, appending the resulting pieces. */
static int split_step(const pre_step *ps, pcre2_match_data *md, const char *buf, size_t s0,
                      size_t e0, int origin, scratch *sc, int which, size_t *np, char *err,
                      size_t errlen) {
    size_t first_out = *np;
    /* Matches/gaps as HF's find_matches produces them, then the behavior. */
    int prev_match = 0;
    size_t off = s0;
    const char *sub = buf + s0;
    size_t sublen = e0 - s0;
    int rc = TOK_OK;
    /* Emit one (offsets, is_match) split through the behavior fold. For
     * MergedWithNext we fold backwards, so collect first. */
    struct span *tmp = NULL;
    int *tmpm = NULL;
    size_t nt = 0, tcap = 0;
    size_t pos = 0, prev = 0;
    while (pos <= sublen) {
        size_t ms, me;
        int r = pos < sublen ? tok_regex_next(ps, md, sub, sublen, pos, &ms, &me) : 0;
        if (r < 0) {
            rc = tok_err(err, errlen, TOK_EINVAL, "pre-tokenizer regex match failed");
            goto done;
        }
        size_t gs = prev, ge = r ? ms : sublen;
        for (int pass = 0; pass < 2; pass++) {
            size_t a = pass ? ms : gs, b = pass ? me : ge;
            if (pass && !r) break;
            if (!pass && a == b) continue;
            if (nt == tcap) {
                tcap = tcap ? tcap * 2 : 64;
                struct span *p1 = realloc(tmp, tcap * sizeof *tmp);
                if (!p1) goto oom;
                tmp = p1;
                int *p2 = realloc(tmpm, tcap * sizeof *tmpm);
                if (!p2) goto oom;
                tmpm = p2;
            }
            tmp[nt] = (struct span){a + off, b + off, 0};
            tmpm[nt] = pass ^ ps->invert;
            nt++;
        }
        if (!r) break;
        prev = me;
        if (me == ms) {
            /* Empty match: step one character, as Oniguruma's iterator does. */
            if (me >= sublen) break;
            size_t k = me + 1;
            while (k < sublen && ((unsigned char)sub[k] & 0xC0) == 0x80) k++;
            pos = k;
        } else {
            pos = me;
        }
    }
    /* Fold. */
    if (ps->behavior == SPLIT_MERGED_NEXT) {
        /* Walk backwards: a match is glued to the following piece. */
        size_t out_start = *np;
        prev_match = 0;
        for (size_t i = nt; i-- > 0;) {
            if (tmpm[i] && !prev_match && *np > out_start) {
                sc->spans[which][*np - 1].s = tmp[i].s;
            } else if (spans_push(sc, which, np, tmp[i].s, tmp[i].e)) {
                goto oom;
            }
            prev_match = tmpm[i];
        }
        /* Reverse what we appended. */
        for (size_t i = out_start, j = *np - 1; i < j; i++, j--) {
            struct span x = sc->spans[which][i];
            sc->spans[which][i] = sc->spans[which][j];
            sc->spans[which][j] = x;
        }
        goto done;
    }
    size_t out_start = *np;
    prev_match = 0;
    for (size_t i = 0; i < nt; i++) {
        int m = tmpm[i];
        int glue = 0;
        if (ps->behavior == SPLIT_REMOVED) {
            if (m) continue;
        } else if (ps->behavior == SPLIT_MERGED_PREV) {
            glue = m && !prev_match;
        } else if (ps->behavior == SPLIT_CONTIGUOUS) {
            glue = m == prev_match;
        }
        if (glue && *np > out_start) sc->spans[which][*np - 1].e = tmp[i].e;
        else if (spans_push(sc, which, np, tmp[i].s, tmp[i].e)) goto oom;
        prev_match = m;
    }
    goto done;
oom:
    rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
done:
    free(tmp);
    free(tmpm);
    for (size_t i = first_out; i < *np; i++) sc->spans[which][i].origin = origin && sc->spans[which][i].s == s0;
    return rc;
}

/* Append a rewritten copy of arena[s, e) for the Metaspace and prefix-space
 * steps; *ns receives the new span's start. */
static int arena_rewrite(const pre_step *ps, scratch *sc, size_t s, size_t e, int origin, size_t *ns) {
    tok_buf *a = &sc->arena;
    /* The copy may move the arena: work on offsets. */
    if (tok_buf_reserve(a, (e - s) * 4 + 8)) return TOK_ENOMEM;
    *ns = a->len;
    const char *src = a->p + s;
    size_t n = e - s;
    if (ps->type == PRE_PREFIX_SPACE) {
        if (n == 0 || src[0] != ' ') a->p[a->len++] = ' ';
        memcpy(a->p + a->len, src, n);
        a->len += n;
        return TOK_OK;
    }
    int starts = n >= ps->rep_len && !memcmp(src, ps->rep, ps->rep_len);
    if (!starts && n > 0 && src[0] == ' ') starts = 1; /* it will be replaced */
    if (!starts && (ps->prepend == PREPEND_ALWAYS || (ps->prepend == PREPEND_FIRST && origin))) {
        memcpy(a->p + a->len, ps->rep, ps->rep_len);
        a->len += ps->rep_len;
    }
    for (size_t i = 0; i < n; i++) {
        if (src[i] == ' ') {
            memcpy(a->p + a->len, ps->rep, ps->rep_len);
            a->len += ps->rep_len;
        } else {
            a->p[a->len++] = src[i];
        }
    }
    return TOK_OK;
}

int tok_encode_plain(const tok_tokenizer *t, const char *s, size_t n, int origin, idvec *out,
                     scratch *sc, char *err, size_t errlen) {
    if (n == 0) return TOK_OK;
    if (t->n_pre == 0) return tok_bpe_cached(t, s, n, out, sc);
    int rc;
    size_t before = out->n;
    if (t->n_pre == 1 && t->pre[0].type == PRE_REGEX && t->pre[0].behavior == SPLIT_ISOLATED &&
        !t->pre[0].invert) {
        /* Fast path (Qwen, GPT-2, Llama-3): BPE each match and gap directly. */
        const pre_step *ps = &t->pre[0];
        size_t pos = 0;
        while (pos < n) {
            size_t ms, me;
            int r = tok_regex_next(ps, sc->md[0], s, n, pos, &ms, &me);
            if (r < 0) return tok_err(err, errlen, TOK_EINVAL, "pre-tokenizer regex match failed");
            if (!r) ms = me = n;
            if (ms > pos && (rc = tok_bpe_cached(t, s + pos, ms - pos, out, sc))) return rc;
            if (me > ms && (rc = tok_bpe_cached(t, s + ms, me - ms, out, sc))) return rc;
            if (!r) break;
            /* An empty match makes HF's iterator step one char and start a
             * gap there; rare, so the generic path below does it. */
            if (me == ms) goto generic;
            pos = me;
        }
        return TOK_OK;
    }
generic:;
    /* The pieces live in an arena so that rewriting steps can add text. */
    sc->arena.len = 0;
    if (tok_buf_append(&sc->arena, s, n)) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    size_t np = 0;
    if (spans_push(sc, 0, &np, 0, n)) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    sc->spans[0][0].origin = origin;
    int cur = 0;
    for (int k = 0; k < t->n_pre; k++) {
        const pre_step *ps = &t->pre[k];
        size_t nn = 0;
        for (size_t i = 0; i < np; i++) {
            struct span sp = sc->spans[cur][i];
            if (sp.e == sp.s) continue; /* HF drops empty pieces */
            if (ps->type != PRE_REGEX) {
                size_t ns;
                if (arena_rewrite(ps, sc, sp.s, sp.e, sp.origin, &ns))
                    return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
                sp.s = ns;
                sp.e = sc->arena.len;
                if (ps->type == PRE_PREFIX_SPACE || !ps->msplit) {
                    if (spans_push(sc, !cur, &nn, sp.s, sp.e))
                        return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
                    sc->spans[!cur][nn - 1].origin = sp.origin;
                    continue;
                }
            }
            if ((rc = split_step(ps, sc->md[k], sc->arena.p, sp.s, sp.e, sp.origin, sc, !cur, &nn, err,
                                 errlen)))
                return rc;
        }
        np = nn;
        cur = !cur;
    }
    /* The fast path may have emitted a prefix before bailing out. */
    out->n = before;
    for (size_t i = 0; i < np; i++) {
        struct span sp = sc->spans[cur][i];
        if (sp.e > sp.s && (rc = tok_bpe_cached(t, sc->arena.p + sp.s, sp.e - sp.s, out, sc))) return rc;
    }
    return TOK_OK;
}
