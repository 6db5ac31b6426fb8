/*
 * server/: the token ids of a request: id arrays (straight from the body
 * text when they can be), and text through the tokenizer.
 */
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

/* Token-id arrays straight from the body text.
 *
 * jansson spends about 40 bytes per integer, so a body that is mostly a
 * token-id array would briefly take ~20x its size. A top-level key holding
 * an array of plain integers (or, with `batch`, a list of such arrays) is
 * read here into int32 ids, and its text replaced by a placeholder `0` and
 * spaces (same length: jansson's error positions stay right) before jansson
 * parses the rest. Anything else — escapes in the key, floats, strings,
 * malformed text — leaves the body untouched for jansson, whose answer
 * (and error message) is then the usual one. */
void srv_fast_ids_free(srv_fast_ids *f) {
    for (int i = 0; i < f->count; i++)
        free(f->ids[i]);
    free(f->ids);
    free(f->n);
    memset(f, 0, sizeof *f);
}

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Past the end of a JSON string starting at p ('"'); NULL when unterminated. */
static const char *skip_string(const char *p, const char *end) {
    for (p++; p < end; p++) {
        if (*p == '\\') {
            p++;
            continue;
        }
        if (*p == '"') return p + 1;
    }
    return NULL;
}

/* Past the end of one JSON value (iterative, any depth); NULL when malformed
 * enough that the scan should stop. */
static const char *skip_value(const char *p, const char *end) {
    long depth = 0;
    do {
        p = skip_ws(p, end);
        if (p >= end) return NULL;
        if (*p == '"') {
            if (!(p = skip_string(p, end))) return NULL;
        } else if (*p == '{' || *p == '[') {
            depth++;
            p++;
        } else if (*p == '}' || *p == ']') {
            if (--depth < 0) return NULL;
            p++;
        } else if (*p == ',' || *p == ':') {
            if (depth == 0) return NULL;
            p++;
        } else {
            const char *q = p;
            while (p < end && !strchr(" \t\r\n,:]}[{\"", *p))
                p++;
            if (p == q) return NULL;
        }
    } while (depth > 0);
    return p;
}

/* One array of plain integers at p ('['): appended as fi's next array. */
static const char *fast_array(const char *p, const char *end, srv_fast_ids *fi, int vocab) {
    size_t cap = 0, n = 0;
    int32_t *ids = NULL;
    p = skip_ws(p + 1, end);
    if (p < end && *p == ']') goto done;
    for (;;) {
        p = skip_ws(p, end);
        int neg = p < end && *p == '-';
        if (neg) p++;
        const char *d = p;
        long long v = 0;
        while (p < end && *p >= '0' && *p <= '9' && p - d < 18)
            v = v * 10 + (*p++ - '0');
        /* not a plain JSON integer (leading zero, fraction, exponent, too
         * long): jansson decides */
        if (p == d || (p - d > 1 && *d == '0') || (p < end && strchr(".eE0123456789", *p))) goto no;
        if (neg) v = -v;
        if ((v < 0 || v >= vocab) && !fi->bad_set) {
            fi->bad_set = 1;
            fi->bad = v;
            fi->bad_at = fi->count;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            int32_t *nb = realloc(ids, cap * sizeof *ids);
            if (!nb) goto no;
            ids = nb;
        }
        ids[n++] = (int32_t)(v < 0 || v >= vocab ? 0 : v);
        if (n > (size_t)1 << 24) goto no;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == ']') break;
        goto no;
    }
done : {
    int32_t **ni = realloc(fi->ids, ((size_t)fi->count + 1) * sizeof *ni);
    if (ni) fi->ids = ni;
    int *nn = ni ? realloc(fi->n, ((size_t)fi->count + 1) * sizeof *nn) : NULL;
    if (nn) fi->n = nn;
    if (!ni || !nn) goto no;
    fi->ids[fi->count] = ids;
    fi->n[fi->count++] = (int)n;
    return p + 1;
}
no:
    free(ids);
    return NULL;
}

/* Take the top-level `key` of body if it is an id array (or, batch, a list
 * of them); 0 taken or left alone, the body changed only when taken. */
void srv_fast_ids_take(char *body, size_t len, const char *key, int batch, int vocab, srv_fast_ids *fi) {
    const char *p = body, *end = body + len;
    size_t kl = strlen(key);
    memset(fi, 0, sizeof *fi);
    p = skip_ws(p, end);
    if (p >= end || *p != '{') return;
    p++;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"') return;
        const char *k = p + 1, *ke = skip_string(p, end);
        if (!ke) return;
        int match = (size_t)(ke - 1 - k) == kl && memcmp(k, key, kl) == 0;
        p = skip_ws(ke, end);
        if (p >= end || *p != ':') return;
        p = skip_ws(p + 1, end);
        if (match) {
            if (p >= end || *p != '[') return;
            const char *v0 = p, *q = skip_ws(p + 1, end);
            if (q < end && *q == '[') {
                if (!batch) return;
                fi->batch = 1;
                p = q;
                for (;;) {
                    if (fi->count >= SRV_MAX_CHOICES || !(p = fast_array(p, end, fi, vocab))) goto undo;
                    p = skip_ws(p, end);
                    if (p < end && *p == ',') {
                        p = skip_ws(p + 1, end);
                        if (p >= end || *p != '[') goto undo;
                        continue;
                    }
                    if (p < end && *p == ']') break;
                    goto undo;
                }
                p++;
            } else if (!(p = fast_array(p, end, fi, vocab))) {
                goto undo;
            }
            fi->present = 1;
            memset((char *)v0, ' ', (size_t)(p - v0));
            *(char *)v0 = '0';
            return;
        }
        if (!(p = skip_value(p, end))) return;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        return;
    }
undo:
    srv_fast_ids_free(fi);
}

/* Token ids from a JSON array, each in [0, vocab). */
int srv_parse_ids(srv_server *s, json_t *a, const char *param, int32_t **ids, int *n, srv_verr *e) {
    size_t m = json_array_size(a);
    if (m > (size_t)1 << 24) return srv_fail(e, 400, param, "'%s' has too many tokens", param);
    *ids = malloc((m ? m : 1) * sizeof **ids);
    if (!*ids) return srv_fail(e, 500, param, "out of memory");
    for (size_t i = 0; i < m; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) return srv_fail(e, 400, param, "'%s' must hold integer token ids", param);
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= s->mc.vocab_size)
            return srv_fail(e, 400, param, "token id %" JSON_INTEGER_FORMAT " in '%s' is out of range [0, %d)", x,
                            param, s->mc.vocab_size);
        (*ids)[i] = (int32_t)x;
    }
    *n = (int)m;
    return 0;
}

int srv_encode_text(srv_server *s, const char *text, size_t len, int add_special, const char *param, int32_t **ids,
                    int *n, srv_verr *e) {
    size_t nn;
    char terr[256];
    int rc = tok_encode(s->tok, text, len, add_special, ids, &nn, terr, sizeof terr);
    if (rc != TOK_OK) return srv_fail(e, rc == TOK_ENOMEM ? 500 : 400, param, "cannot tokenize '%s': %s", param, terr);
    if (nn > (size_t)1 << 24) return srv_fail(e, 400, param, "'%s' is too long", param);
    *n = (int)nn;
    return 0;
}
