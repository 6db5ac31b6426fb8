/*
 * Normalizers at encode time (NFC/NFD/NFKC/NFKD, Lowercase, Replace,
 * Prepend, Strip), and the normalized form of "normalized" added tokens.
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Code points NFC leaves alone in any context: starters (ccc 0) that are
 * not the second half of a canonical composition and are their own NFC.
 * Covers Latin-1/Latin Extended, Cyrillic, general punctuation, kana, CJK
 * and Hangul syllables (a following jamo is not inert, so LV+T still goes
 * through utf8proc). Only used for NFC. */
static int nfc_inert(uint32_t cp) {
    return cp < 0x300 || (cp >= 0x400 && cp <= 0x482) || (cp >= 0x48A && cp <= 0x4FF) ||
           (cp >= 0x2010 && cp <= 0x205F) || (cp >= 0x3000 && cp <= 0x3029) ||
           (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA) ||
           (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3);
}

/* Normalize s into out. ASCII characters are starters that never compose
 * with what precedes them, so the text can be cut before any of them and
 * each piece normalized alone: utf8proc only sees the non-ASCII runs (with
 * the ASCII character before each, which a combining mark may join). */
static int normalize_one(int opt, const char *s, size_t n, tok_buf *out, char *err, size_t errlen) {
    const unsigned char *u = (const unsigned char *)s;
    int inert_ok = (opt & UTF8PROC_COMPOSE) && !(opt & UTF8PROC_COMPAT);
    out->len = 0;
    if (tok_buf_reserve(out, n)) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    size_t i = 0, copied = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        /* Non-ASCII run [rs, re), unit starts one ASCII char earlier. */
        size_t rs = i, us = i > 0 ? i - 1 : 0, re = i;
        int inert = inert_ok;
        while (re < n && u[re] >= 0x80) {
            uint32_t cp = tok_utf8_next(u, &re);
            if (inert && !nfc_inert(cp)) inert = 0;
        }
        (void)rs;
        i = re;
        if (inert) continue;
        if (tok_buf_append(out, s + copied, us - copied))
            return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        utf8proc_uint8_t *res = NULL;
        utf8proc_ssize_t r =
            utf8proc_map((const utf8proc_uint8_t *)s + us, (utf8proc_ssize_t)(re - us), &res, opt);
        if (r < 0) return tok_err(err, errlen, TOK_EINVAL, "normalization failed: %s", utf8proc_errmsg(r));
        int rc = tok_buf_append(out, res, (size_t)r);
        free(res);
        if (rc) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        copied = re;
    }
    if (tok_buf_append(out, s + copied, n - copied)) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    return TOK_OK;
}

/* Rust's char::to_lowercase per character (HF's Lowercase): the simple
 * mapping, except U+0130 which lowercases to "i" + U+0307. */
static int lowercase(const char *s, size_t n, tok_buf *out) {
    out->len = 0;
    if (tok_buf_reserve(out, n + 8)) return TOK_ENOMEM;
    for (size_t i = 0; i < n;) {
        uint32_t cp = tok_utf8_next((const unsigned char *)s, &i);
        utf8proc_uint8_t enc[8];
        utf8proc_ssize_t k;
        if (cp == 0x130) {
            k = 3;
            memcpy(enc, "i\xCC\x87", 3);
        } else {
            k = utf8proc_encode_char(utf8proc_tolower((utf8proc_int32_t)cp), enc);
        }
        if (tok_buf_append(out, enc, (size_t)k)) return TOK_ENOMEM;
    }
    return TOK_OK;
}

static int replace_all(const norm_step *ns, pcre2_match_data *md, const char *s, size_t n,
                       tok_buf *out) {
    out->len = 0;
    if (tok_buf_reserve(out, n)) return TOK_ENOMEM;
    size_t pos = 0, copied = 0;
    pre_step fake = {.re = ns->re, .jit = ns->jit};
    while (pos <= n) {
        size_t ms, me;
        int r = tok_regex_next(&fake, md, s, n, pos, &ms, &me);
        if (r < 0) return TOK_EINVAL;
        if (!r) break;
        if (me == ms) {
            /* An empty match replaces nothing; step one character. */
            if (me >= n) break;
            size_t k = me + 1;
            while (k < n && ((unsigned char)s[k] & 0xC0) == 0x80) k++;
            pos = k;
            continue;
        }
        if (tok_buf_append(out, s + copied, ms - copied) || tok_buf_append(out, ns->content, ns->clen))
            return TOK_ENOMEM;
        copied = pos = me;
    }
    return tok_buf_append(out, s + copied, n - copied);
}

/* Run the normalizer steps. *origin is cleared when Strip removes the
 * start of the text (HF then no longer sees offset 0 there). */
int tok_normalize(const tok_tokenizer *t, const char *s, size_t n, const char **outp,
                  size_t *outn, int *origin, scratch *sc, char *err, size_t errlen) {
    *outp = s;
    *outn = n;
    for (int i = 0; i < t->n_norm; i++) {
        const norm_step *ns = &t->norm[i];
        tok_buf *dst = &sc->norm[i & 1];
        int rc = TOK_OK;
        switch (ns->type) {
        case NORM_UNICODE:
            rc = normalize_one(ns->opt, *outp, *outn, dst, err, errlen);
            if (rc) return rc;
            break;
        case NORM_LOWER:
            rc = lowercase(*outp, *outn, dst);
            break;
        case NORM_REPLACE:
            if (!sc->nmd[i] && !(sc->nmd[i] = pcre2_match_data_create_from_pattern(ns->re, NULL)))
                rc = TOK_ENOMEM;
            else rc = replace_all(ns, sc->nmd[i], *outp, *outn, dst);
            if (rc == TOK_EINVAL) return tok_err(err, errlen, rc, "normalizer Replace: regex match failed");
            break;
        case NORM_PREPEND:
            dst->len = 0;
            if (*outn && (tok_buf_append(dst, ns->content, ns->clen) || tok_buf_append(dst, *outp, *outn)))
                rc = TOK_ENOMEM;
            break;
        case NORM_STRIP: {
            size_t a = 0, b = *outn;
            while (ns->left && a < b) {
                size_t j = a;
                if (!tok_is_ws(tok_utf8_next((const unsigned char *)*outp, &j))) break;
                a = j;
            }
            while (ns->right && b > a) {
                size_t ps;
                if (!tok_is_ws(tok_utf8_last(*outp, b, &ps))) break;
                b = ps;
            }
            if (a > 0) *origin = 0;
            dst->len = 0;
            rc = tok_buf_append(dst, *outp + a, b - a);
            break;
        }
        }
        if (rc) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        *outp = dst->p ? dst->p : "";
        *outn = dst->len;
    }
    return TOK_OK;
}

/* HF matches "normalized" added tokens by their normalized content. */
int tok_normalize_added(tok_tokenizer *t) {
    scratch sc;
    memset(&sc, 0, sizeof sc);
    int rc = TOK_OK;
    for (size_t i = 0; i < t->n_added && rc == TOK_OK; i++) {
        added_tok *a = &t->added[i];
        if (!a->normalized || t->n_norm == 0) continue;
        const char *ns;
        size_t nn;
        int origin = 1;
        char err[8];
        if ((rc = tok_normalize(t, a->s, a->len, &ns, &nn, &origin, &sc, err, sizeof err))) break;
        a->m = malloc(nn ? nn : 1);
        if (!a->m) {
            a->m = a->s;
            rc = TOK_ENOMEM;
            break;
        }
        memcpy(a->m, ns, nn);
        a->mlen = nn;
    }
    for (int k = 0; k < MAX_NORM; k++) pcre2_match_data_free(sc.nmd[k]);
    free(sc.norm[0].p);
    free(sc.norm[1].p);
    return rc;
}
