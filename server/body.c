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

#include "server/internal.h"

int srv_fail(srv_verr *e, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
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
    char one[96];
    snprintf(one, sizeof one, "'%s%.60s'", prefix, k);
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
    if (strcmp(json_string_value(m), s->name) != 0)
        return srv_fail(e, 404, "model", "The model `%.200s` does not exist.", json_string_value(m));
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
