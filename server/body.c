/*
 * server/: a request's JSON body and its fields.
 *
 * Every body is untrusted: parsed with jansson (duplicate keys refused),
 * each field type- and range-checked by the getters here. Field policy
 * (vLLM's): a field the server does not know is ignored with one warning
 * line per request naming it; a known field whose value cannot be honoured
 * is a 400 naming it.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

#include "server/internal.h"

/* Message text must be valid UTF-8 (jansson refuses anything else), and
 * every byte count that cuts a string can land inside a character: so
 * strings from outside are quoted through here, never with "%.Ns". Valid
 * characters are copied, each byte of an invalid sequence (a NUL, a stray
 * continuation byte, an overlong form, a surrogate) is shown as \xNN, and a
 * string that does not fit is cut between two characters and ends in
 * U+2026. */
const char *srv_quote(char *out, size_t outsz, const char *s, size_t len) {
    static const char ell[] = "\xe2\x80\xa6"; /* U+2026 */
    const size_t ell_len = sizeof ell - 1, cap = outsz - 1;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp = 0;
        utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        char esc[8];
        const char *piece = s + i;
        size_t pl = (size_t)n;
        if (n <= 0 || cp == 0) {
            snprintf(esc, sizeof esc, "\\x%02X", (unsigned char)s[i]);
            piece = esc;
            n = 1;
            pl = 4;
        }
        /* room for this piece, and for the ellipsis when more follows */
        if (o + pl + (i + (size_t)n < len ? ell_len : 0) > cap) {
            if (o + ell_len <= cap) memcpy(out + o, ell, ell_len), o += ell_len;
            break;
        }
        memcpy(out + o, piece, pl);
        o += pl;
        i += (size_t)n;
    }
    out[o] = 0;
    return out;
}

int srv_utf8_text(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp = 0;
        utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (n <= 0 || cp == 0) return 0;
        i += (size_t)n;
    }
    return 1;
}

size_t srv_utf8_chars(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

int srv_fail(srv_verr *e, int status, const char *param, const char *fmt, ...) {
    /* Formatted whole first, then cut on a character boundary (a message
     * may hold text from outside, as jansson's parse errors do). */
    char full[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(full, sizeof full, fmt, ap);
    va_end(ap);
    srv_quote(e->msg, sizeof e->msg, full, n < 0 ? 0 : (size_t)n < sizeof full ? (size_t)n : sizeof full - 1);
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    return -1;
}
/* ---- field helpers (null counts as absent) ---- */

json_t *srv_field(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

int srv_get_int(json_t *o, const char *k, long long lo, long long hi, long long *out, srv_verr *e) {
    json_t *v = srv_field(o, k);
    if (!v) return 0;
    if (!json_is_integer(v)) return srv_fail(e, 400, k, "'%s' must be an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return srv_fail(e, 400, k, "'%s' must be in [%lld, %lld], got %lld", k, lo, hi, x);
    *out = x;
    return 1;
}

int srv_get_num(json_t *o, const char *k, double lo, double hi, int lo_open, double *out, srv_verr *e) {
    json_t *v = srv_field(o, k);
    if (!v) return 0;
    if (!json_is_number(v)) return srv_fail(e, 400, k, "'%s' must be a number", k);
    double x = json_number_value(v);
    if (!isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
        return srv_fail(e, 400, k, "'%s' must be in %c%g, %g], got %g", k, lo_open ? '(' : '[', lo, hi, x);
    *out = x;
    return 1;
}

int srv_get_bool(json_t *o, const char *k, int *out, srv_verr *e) {
    json_t *v = srv_field(o, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) return srv_fail(e, 400, k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 1;
}

/* Note an ignored unknown field (prefix: where it sits, e.g. "messages[]."). */
void srv_note_unknown(srv_verr *e, const char *prefix, const char *k) {
    char one[96], q[64];
    snprintf(one, sizeof one, "'%s%s'", prefix, srv_quote(q, sizeof q, k, strlen(k)));
    if (strstr(e->unknown, one)) return; /* one mention per name */
    size_t l = strlen(e->unknown);
    if (l + strlen(one) + 3 >= sizeof e->unknown) return;
    snprintf(e->unknown + l, sizeof e->unknown - l, "%s%s", l ? ", " : "", one);
}

/* Fields this server does not know are ignored (noted for the warning). */
int srv_check_known(json_t *o, const char *const *known, const char *prefix, srv_verr *e) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++)
            ok = strcmp(k, known[i]) == 0;
        if (!ok) srv_note_unknown(e, prefix, k);
    }
    return 0;
}

int srv_model_check(srv_server *s, json_t *o, srv_verr *e) {
    json_t *m = srv_field(o, "model");
    if (!m) return 0;
    if (!json_is_string(m)) return srv_fail(e, 400, "model", "'model' must be a string");
    if (strcmp(json_string_value(m), s->name) != 0) {
        char q[SRV_QUOTE];
        return srv_fail(e, 404, "model", "The model `%s` does not exist.",
                        srv_quote(q, sizeof q, json_string_value(m), json_string_length(m)));
    }
    return 0;
}

json_t *srv_parse_body(srv_request *rq, srv_verr *e) {
    json_error_t je;
    if (!rq->len) {
        srv_fail(e, 400, NULL, "request body is empty; expected a JSON object");
        return NULL;
    }
    json_t *root = json_loadb(rq->body, rq->len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        srv_fail(e, 400, NULL, "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        srv_fail(e, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}
void srv_log_unknown(srv_server *s, const srv_verr *e, const char *id, const char *route) {
    if (e->unknown[0])
        srv_log(s, SRV_LOG_WARNING, "%s%s%s: ignoring unknown fields: %s", route, id && *id ? " " : "", id ? id : "",
                e->unknown);
}
