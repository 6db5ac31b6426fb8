/*
 * JSON in and out of the Jinja interpreter: the render context (a jansson
 * object) becomes values, and tojson writes a value as Python's json.dumps
 * does (ensure_ascii=False, indent, separators, sort_keys).
 */
#include "tokenizer/jinja_internal.h"

val jinja_from_json(rs *R, json_t *j, int depth) {
    if (depth > 200) FAIL(R, "context nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: return vnone();
    case JSON_TRUE: return vbool(1);
    case JSON_FALSE: return vbool(0);
    case JSON_INTEGER: return vint(json_integer_value(j));
    case JSON_REAL: return vfloat(json_real_value(j));
    case JSON_STRING: return vstr(adup(&R->a, json_string_value(j), json_string_length(j)), json_string_length(j));
    case JSON_ARRAY: {
        list *l = list_new(R, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) list_push(R, l, jinja_from_json(R, json_array_get(j, i), depth + 1));
        return vlist(l);
    }
    case JSON_OBJECT: {
        dict *d = dict_new(R);
        const char *k;
        json_t *x;
        json_object_foreach(j, k, x) {
            size_t kn = strlen(k);
            dict_set(R, d, vstr(adup(&R->a, k, kn), kn), jinja_from_json(R, x, depth + 1));
        }
        return vdict(d);
    }
    }
    return vnone();
}

static void json_str(rs *R, sbuf *b, const char *s, size_t n) {
    sb_puts(&R->a, b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        char u[8];
        if (c == '"') e = "\\\"";
        else if (c == '\\') e = "\\\\";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (c == '\b') e = "\\b";
        else if (c == '\f') e = "\\f";
        else if (c < 0x20) snprintf(u, sizeof u, "\\u%04x", c), e = u;
        if (!e) continue;
        sb_put(&R->a, b, s + run, i - run);
        sb_puts(&R->a, b, e);
        run = i + 1;
    }
    sb_put(&R->a, b, s + run, n - run);
    sb_puts(&R->a, b, "\"");
}

static int key_cmp(const void *a, const void *b) {
    const val *x = *(val *const *)a, *y = *(val *const *)b;
    size_t n = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
    int c = n ? memcmp(x->u.s.p, y->u.s.p, n) : 0;
    return c ? c : (x->u.s.n > y->u.s.n) - (x->u.s.n < y->u.s.n);
}

/* json.dumps(v, ensure_ascii=False, ...) */
void jinja_to_json(rs *R, sbuf *b, val v, const jsonopt *o, int level) {
    if (level > 100) FAIL(R, "value nested too deeply for tojson");
    step(R);
    switch (v.t) {
    case V_NONE: sb_puts(&R->a, b, "null"); return;
    case V_BOOL: sb_puts(&R->a, b, v.u.i ? "true" : "false"); return;
    case V_INT: sb_printf(&R->a, b, "%lld", (long long)v.u.i); return;
    case V_FLOAT: jinja_fmt_float(R, b, v.u.f, 1); return;
    case V_STR: json_str(R, b, v.u.s.p, v.u.s.n); return;
    case V_LIST:
    case V_DICT: {
        if (v.t == V_LIST && v.u.l->kind != LK_PLAIN) FAIL(R, "Object of type %s is not JSON serializable", jinja_type_name(v));
        int isd = v.t == V_DICT;
        size_t n = isd ? v.u.d->n : v.u.l->n;
        if (!n) {
            sb_puts(&R->a, b, isd ? "{}" : "[]");
            return;
        }
        sb_puts(&R->a, b, isd ? "{" : "[");
        size_t *ord = NULL;
        if (isd && o->sort_keys) {
            val **ks = aalloc(&R->a, n * sizeof *ks);
            for (size_t i = 0; i < n; i++) ks[i] = &v.u.d->k[i];
            qsort(ks, n, sizeof *ks, key_cmp);
            ord = aalloc(&R->a, n * sizeof *ord);
            for (size_t i = 0; i < n; i++) ord[i] = (size_t)(ks[i] - v.u.d->k);
        }
        for (size_t i = 0; i < n; i++) {
            if (i) sb_put(&R->a, b, o->item_sep, o->isn);
            if (o->indent) {
                sb_puts(&R->a, b, "\n");
                for (int l = 0; l <= level; l++) sb_put(&R->a, b, o->indent, o->indn);
            }
            size_t k = ord ? ord[i] : i;
            if (isd) {
                json_str(R, b, v.u.d->k[k].u.s.p, v.u.d->k[k].u.s.n);
                sb_put(&R->a, b, o->key_sep, o->ksn);
                jinja_to_json(R, b, v.u.d->v[k], o, level + 1);
            } else {
                jinja_to_json(R, b, v.u.l->v[k], o, level + 1);
            }
        }
        if (o->indent) {
            sb_puts(&R->a, b, "\n");
            for (int l = 0; l < level; l++) sb_put(&R->a, b, o->indent, o->indn);
        }
        sb_puts(&R->a, b, isd ? "}" : "]");
        return;
    }
    default: FAIL(R, "Object of type %s is not JSON serializable", jinja_type_name(v));
    }
}
