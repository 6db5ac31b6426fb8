/*
 * Runtime values of the Jinja interpreter: type names, undefined values and
 * the messages jinja2 gives when one is used, Python's str() and repr() of
 * every value, truthiness, equality and ordering as Python defines them,
 * iteration and len(). Values live in the render arena (jinja_internal.h).
 */
#include "tokenizer/jinja_internal.h"

const char *jinja_type_name(val v) {
    switch (v.t) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST: {
        static const char *const k[] = {"list", "generator", "dict_items", "dict_keys", "dict_values", "range"};
        return v.u.l->tuple ? "tuple" : k[v.u.l->kind];
    }
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_LOOP: return "LoopContext";
    default: return "function";
    }
}

/* An undefined value carries its variable name, or (mk = 1) jinja2's hint
 * such as "'dict object' has no attribute 'x'". */
void jinja_undef_fail(rs *R, val v) {
    if (v.u.s.p && v.mk) FAIL(R, "%.*s", (int)(v.u.s.n > 200 ? 200 : v.u.s.n), v.u.s.p);
    if (v.u.s.p) FAIL(R, "'%.*s' is undefined", (int)(v.u.s.n > 80 ? 80 : v.u.s.n), v.u.s.p);
    FAIL(R, "undefined value used");
}

val jinja_undef_hint(rs *R, val obj, const char *what, val key) {
    sbuf b = {0};
    sb_puts(&R->a, &b, "'");
    sb_puts(&R->a, &b, jinja_type_name(obj));
    sb_puts(&R->a, &b, " object' has no ");
    sb_puts(&R->a, &b, what);
    sb_puts(&R->a, &b, " ");
    if (key.t == V_STR) {
        sb_puts(&R->a, &b, "'");
        sb_put(&R->a, &b, key.u.s.p, key.u.s.n > 80 ? 80 : key.u.s.n);
        sb_puts(&R->a, &b, "'");
    } else if (key.t == V_INT) {
        sb_printf(&R->a, &b, "%lld", (long long)key.u.i);
    }
    val u = vundef(b.p, b.n);
    u.mk = 1;
    return u;
}

/* Python float repr: shortest round-tripping digits, exponent form outside [1e-4, 1e16). */
void jinja_fmt_float(rs *R, sbuf *b, double f, int json) {
    if (isnan(f)) { sb_puts(&R->a, b, json ? "NaN" : "nan"); return; }
    if (isinf(f)) { sb_puts(&R->a, b, f > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf")); return; }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp = [-]d.ddde[+-]XX */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *q = tmp + neg;
    for (; *q && *q != 'e'; q++)
        if (is_digit(*q)) digits[nd++] = *q;
    int ex = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) sb_puts(&R->a, b, "-");
    if (ex >= -4 && ex < 16) {
        if (ex < 0) {
            sb_puts(&R->a, b, "0.");
            for (int k = 0; k < -ex - 1; k++) sb_puts(&R->a, b, "0");
            sb_put(&R->a, b, digits, nd);
        } else {
            for (int k = 0; k <= ex; k++) sb_put(&R->a, b, k < nd ? &digits[k] : "0", 1);
            sb_puts(&R->a, b, ".");
            if (nd > ex + 1) sb_put(&R->a, b, digits + ex + 1, nd - ex - 1);
            else sb_puts(&R->a, b, "0");
        }
    } else {
        sb_put(&R->a, b, digits, 1);
        if (nd > 1) {
            sb_puts(&R->a, b, ".");
            sb_put(&R->a, b, digits + 1, nd - 1);
        }
        sb_printf(&R->a, b, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
}


/* Python repr of a str. */
static void repr_str(rs *R, sbuf *b, const char *s, size_t n) {
    int sq = 0, dq = 0;
    for (size_t i = 0; i < n; i++) sq |= s[i] == '\'', dq |= s[i] == '"';
    char q = sq && !dq ? '"' : '\'';
    sb_put(&R->a, b, &q, 1);
    for (size_t i = 0; i < n;) {
        int32_t c;
        size_t k = u8dec(s + i, n - i, &c);
        if (c == q || c == '\\') sb_puts(&R->a, b, c == '\\' ? "\\\\" : q == '"' ? "\\\"" : "\\'");
        else if (c == '\n') sb_puts(&R->a, b, "\\n");
        else if (c == '\r') sb_puts(&R->a, b, "\\r");
        else if (c == '\t') sb_puts(&R->a, b, "\\t");
        else {
            utf8proc_category_t cat = utf8proc_category(c);
            int printable = c == ' ' || !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                                          cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                                          cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                                          cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
            if (printable) sb_put(&R->a, b, s + i, k);
            else if (c < 0x100) sb_printf(&R->a, b, "\\x%02x", c);
            else if (c < 0x10000) sb_printf(&R->a, b, "\\u%04x", c);
            else sb_printf(&R->a, b, "\\U%08x", c);
        }
        i += k;
    }
    sb_put(&R->a, b, &q, 1);
}

/* str(v) as Python would print it. */
void jinja_to_str(rs *R, sbuf *b, val v, int depth) {
    switch (v.t) {
    case V_UNDEF: break;
    case V_STR: sb_put(&R->a, b, v.u.s.p, v.u.s.n); break;
    default: jinja_repr(R, b, v, depth);
    }
}

void jinja_repr(rs *R, sbuf *b, val v, int depth) {
    if (depth > 100) FAIL(R, "value nested too deeply");
    step(R);
    switch (v.t) {
    case V_UNDEF: sb_puts(&R->a, b, "Undefined"); break;
    case V_NONE: sb_puts(&R->a, b, "None"); break;
    case V_BOOL: sb_puts(&R->a, b, v.u.i ? "True" : "False"); break;
    case V_INT: sb_printf(&R->a, b, "%lld", (long long)v.u.i); break;
    case V_FLOAT: jinja_fmt_float(R, b, v.u.f, 0); break;
    case V_STR:
        if (v.mk) sb_puts(&R->a, b, "Markup(");
        repr_str(R, b, v.u.s.p, v.u.s.n);
        if (v.mk) sb_puts(&R->a, b, ")");
        break;
    case V_LIST:
        if (v.u.l->kind == LK_GEN) FAIL(R, "cannot print a generator (jinja2 prints its address); convert it with |list");
        if (v.u.l->kind == LK_RANGE) {
            if (v.u.l->r2 == 1) sb_printf(&R->a, b, "range(%lld, %lld)", (long long)v.u.l->r0, (long long)v.u.l->r1);
            else sb_printf(&R->a, b, "range(%lld, %lld, %lld)", (long long)v.u.l->r0, (long long)v.u.l->r1, (long long)v.u.l->r2);
            break;
        }
        if (v.u.l->kind != LK_PLAIN) sb_puts(&R->a, b, jinja_type_name(v)), sb_puts(&R->a, b, "(");
        sb_puts(&R->a, b, v.u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_puts(&R->a, b, ", ");
            jinja_repr(R, b, v.u.l->v[i], depth + 1);
        }
        if (v.u.l->tuple && v.u.l->n == 1) sb_puts(&R->a, b, ",");
        sb_puts(&R->a, b, v.u.l->tuple ? ")" : "]");
        if (v.u.l->kind != LK_PLAIN) sb_puts(&R->a, b, ")");
        break;
    case V_DICT:
    case V_NS:
        sb_puts(&R->a, b, v.t == V_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) sb_puts(&R->a, b, ", ");
            jinja_repr(R, b, v.u.d->k[i], depth + 1);
            sb_puts(&R->a, b, ": ");
            jinja_repr(R, b, v.u.d->v[i], depth + 1);
        }
        sb_puts(&R->a, b, v.t == V_NS ? "}>" : "}");
        break;
    default: FAIL(R, "cannot print a %s", jinja_type_name(v));
    }
}

val jinja_str_of(rs *R, val v) {
    if (v.t == V_STR) return v;
    sbuf b = {0};
    jinja_to_str(R, &b, v, 0);
    return vsb(&b);
}

int jinja_truthy(val v) {
    switch (v.t) {
    case V_UNDEF:
    case V_NONE: return 0;
    case V_BOOL:
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.s.n != 0;
    case V_LIST: return v.u.l->kind == LK_GEN || v.u.l->n != 0;
    case V_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

int jinja_val_eq(rs *R, val a, val b, int depth) {
    if (depth > 100) FAIL(R, "value nested too deeply");
    if (is_num(a) && is_num(b)) {
        if (a.t == V_FLOAT || b.t == V_FLOAT) return num_f(a) == num_f(b);
        return a.u.i == b.u.i;
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: return str_eq(a, b.u.s.p, b.u.s.n);
    case V_LIST:
        if (a.u.l->kind != b.u.l->kind || a.u.l->kind == LK_GEN) return a.u.l == b.u.l;
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jinja_val_eq(R, a.u.l->v[i], b.u.l->v[i], depth + 1)) return 0;
        return 1;
    case V_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            val *x = dict_find(b.u.d, a.u.d->k[i].u.s.p, a.u.d->k[i].u.s.n);
            if (!x || !jinja_val_eq(R, a.u.d->v[i], *x, depth + 1)) return 0;
        }
        return 1;
    case V_NS: return a.u.d == b.u.d;
    case V_MACRO: return a.u.m == b.u.m;
    case V_FUNC: return a.u.fn == b.u.fn;
    case V_LOOP: return a.u.lp == b.u.lp;
    default: return 0;
    }
}

/* <0, 0, >0 like Python's ordering; TypeError for unorderable types. */
int jinja_val_cmp(rs *R, val a, val b, int depth) {
    if (depth > 100) FAIL(R, "value nested too deeply");
    if (is_num(a) && is_num(b)) {
        if (a.t == V_FLOAT || b.t == V_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        return a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
        if (c) return c;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.t == V_LIST && b.t == V_LIST && a.u.l->tuple == b.u.l->tuple && a.u.l->kind == LK_PLAIN &&
        b.u.l->kind == LK_PLAIN) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (jinja_val_eq(R, a.u.l->v[i], b.u.l->v[i], depth + 1)) continue;
            return jinja_val_cmp(R, a.u.l->v[i], b.u.l->v[i], depth + 1);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    if (a.t == V_UNDEF) jinja_undef_fail(R, a);
    if (b.t == V_UNDEF) jinja_undef_fail(R, b);
    FAIL(R, "'<' not supported between instances of '%s' and '%s'", jinja_type_name(a), jinja_type_name(b));
    return 0;
}

/* Items of an iterable as a list (strings give characters, dicts keys). */
list *jinja_iter_list(rs *R, val v) {
    switch (v.t) {
    case V_UNDEF: return list_new(R, 0);
    case V_LIST:
        if (v.u.l->kind == LK_GEN) { /* a generator runs once */
            if (v.u.l->consumed) return list_new(R, 0);
            v.u.l->consumed = 1;
        }
        return v.u.l;
    case V_DICT: {
        list *l = list_new(R, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) list_push(R, l, v.u.d->k[i]);
        return l;
    }
    case V_STR: {
        list *l = list_new(R, 0);
        for (size_t i = 0; i < v.u.s.n;) {
            int32_t c;
            size_t k = u8dec(v.u.s.p + i, v.u.s.n - i, &c);
            list_push(R, l, vstr(v.u.s.p + i, k));
            i += k;
        }
        return l;
    }
    default: FAIL(R, "'%s' object is not iterable", jinja_type_name(v)); return NULL;
    }
}

int64_t jinja_length_of(rs *R, val v) {
    switch (v.t) {
    case V_UNDEF: return 0;
    case V_STR: return (int64_t)u8len(v.u.s.p, v.u.s.n);
    case V_LIST:
        if (v.u.l->kind == LK_GEN) FAIL(R, "object of type 'generator' has no len()");
        return (int64_t)v.u.l->n;
    case V_DICT:
    case V_NS: return (int64_t)v.u.d->n;
    default: FAIL(R, "object of type '%s' has no len()", jinja_type_name(v)); return 0;
    }
}
