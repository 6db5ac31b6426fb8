/*
 * A small Jinja interpreter for chat templates: the subset of Jinja2 that
 * chat templates use, with the semantics transformers' apply_chat_template
 * gives them (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
 * loopcontrols, raise_exception / strftime_now / namespace globals and a
 * json.dumps-style tojson). See tokenizer/README.md for what is supported.
 *
 * Design: the source is lexed and parsed once into an AST that is never
 * written after compile (so many threads may render one template). A render
 * owns an arena: every runtime value lives there and the whole arena is
 * dropped at the end, so errors unwind with longjmp and leak nothing. Work
 * is bounded by a step budget, an allocation budget, an output cap and
 * depth limits: hostile templates fail with a message, never hang.
 */
#include "tokenizer/jinja_internal.h"

/* ------------------------------------------------------------------ */
/* Runtime values                                                       */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_METHOD, V_FUNC, V_LOOP };

typedef struct list list;
typedef struct dict dict;
struct frame;
/* A macro (or a call block's body) with the frame it was defined in. */
struct closure {
    const struct stmt *m;
    struct frame *f;
};
typedef struct method method;
typedef struct loopst loopst;

typedef struct {
    int t;
    union {
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        list *l;
        dict *d;
        struct closure *m;
        method *me;
        loopst *lp;
        int fn;
    } u;
    int mk; /* V_STR: a markupsafe.Markup (from safe/escape): `+` escapes the other side */
} val;

/* What a list stands for in Python: jinja2's select/map/unique/items
 * filters return generators (always true, one pass, no len, unprintable),
 * dict methods return views, range() a range. They behave as lists only
 * where Python's types agree. */
enum { LK_PLAIN, LK_GEN, LK_ITEMS, LK_KEYS, LK_VALUES, LK_RANGE };
struct list {
    size_t n, cap;
    val *v;
    int tuple, kind, consumed;
    int64_t r0, r1, r2; /* range(start, stop, step) */
};
struct dict {
    size_t n, cap;
    val *k; /* strings */
    val *v;
};
struct method {
    val self;
    int id;
};
struct loopst {
    list *items;
    size_t i;
};

enum { G_RAISE, G_STRFTIME, G_NAMESPACE, G_RANGE, G_DICT, G_N };
static const char *const GLOBALS[] = {"raise_exception", "strftime_now", "namespace", "range", "dict"};

enum {
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER,
    M_REPLACE, M_TITLE, M_CAPITALIZE, M_FIND, M_COUNT, M_SPLITLINES, M_JOIN, M_ISDIGIT, M_ISALPHA,
    M_ISSPACE, M_FORMAT, M_ITEMS, M_KEYS, M_VALUES, M_GET, M_CYCLE, M_MUTATE, M_N
};
static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower",
    "replace", "title", "capitalize", "find", "count", "splitlines", "join", "isdigit", "isalpha",
    "isspace", "format", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};
static const char *const MUTATING[] = {"append", "pop", "update", "insert", "extend", "remove", "clear",
                                        "setdefault", "popitem", "sort", "reverse", NULL};

/* Render state: one per tok_template_render call. */
typedef struct frame frame;
struct frame {
    frame *parent;
    dict *vars;
};

typedef struct {
    arena a;
    unsigned long long steps;
    int depth;
    frame *root;
    val body; /* E_BODY while a filter block / block set applies its filters */
    sbuf *out;
    int brk;    /* 1 break, 2 continue */
    int edepth; /* C recursion through eval/exec_body */
} rs;

#define FAIL(R, ...) afail(&(R)->a, __VA_ARGS__)

static void step(rs *R) {
    if (++R->steps > J_MAX_STEPS) FAIL(R, "template exceeds its step budget (loop too long?)");
}

static val vundef(const char *name, size_t n) {
    val v = {V_UNDEF, {0}, 0};
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}
static val vnone(void) { return (val){V_NONE, {0}, 0}; }
static val vbool(int b) { val v = {V_BOOL, {0}, 0}; v.u.i = !!b; return v; }
static val vint(int64_t i) { val v = {V_INT, {0}, 0}; v.u.i = i; return v; }
static val vfloat(double f) { val v = {V_FLOAT, {0}, 0}; v.u.f = f; return v; }
static val vstr(const char *p, size_t n) {
    val v = {V_STR, {0}, 0};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static val vsb(sbuf *b) { return vstr(b->p ? b->p : "", b->n); }

static list *list_new(rs *R, size_t cap) {
    list *l = azalloc(&R->a, sizeof *l);
    if (cap) {
        if (cap > (J_MAX_ALLOC / sizeof(val))) FAIL(R, "list too long");
        l->v = aalloc(&R->a, cap * sizeof(val));
        l->cap = cap;
    }
    return l;
}
static void list_push(rs *R, list *l, val v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        if (cap > J_MAX_ALLOC / sizeof(val)) FAIL(R, "list too long");
        val *nv = aalloc(&R->a, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}
static val vlist(list *l) { val v = {V_LIST, {0}, 0}; v.u.l = l; return v; }

static dict *dict_new(rs *R) { return azalloc(&R->a, sizeof(dict)); }
static int str_eq(val a, const char *s, size_t n) { return a.u.s.n == n && (!n || !memcmp(a.u.s.p, s, n)); }
static val *dict_find(const dict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(d->k[i], k, n)) return &d->v[i];
    return NULL;
}
static void dict_set(rs *R, dict *d, val k, val v) {
    val *x = dict_find(d, k.u.s.p, k.u.s.n);
    if (x) {
        *x = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        if (cap > J_MAX_ALLOC / sizeof(val)) FAIL(R, "dict too large");
        val *nk = aalloc(&R->a, cap * sizeof *nk), *nv = aalloc(&R->a, cap * sizeof *nv);
        if (d->n) memcpy(nk, d->k, d->n * sizeof *nk), memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}
static val vdict(dict *d) { val v = {V_DICT, {0}, 0}; v.u.d = d; return v; }

static int is_num(val v) { return v.t == V_INT || v.t == V_BOOL || v.t == V_FLOAT; }
static double num_f(val v) { return v.t == V_FLOAT ? v.u.f : (double)v.u.i; }

static const char *type_name(val v) {
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
static void undef_fail(rs *R, val v) {
    if (v.u.s.p && v.mk) FAIL(R, "%.*s", (int)(v.u.s.n > 200 ? 200 : v.u.s.n), v.u.s.p);
    if (v.u.s.p) FAIL(R, "'%.*s' is undefined", (int)(v.u.s.n > 80 ? 80 : v.u.s.n), v.u.s.p);
    FAIL(R, "undefined value used");
}

static val undef_hint(rs *R, val obj, const char *what, val key) {
    sbuf b = {0};
    sb_puts(&R->a, &b, "'");
    sb_puts(&R->a, &b, type_name(obj));
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
static void fmt_float(rs *R, sbuf *b, double f, int json) {
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

static void repr(rs *R, sbuf *b, val v, int depth);

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
static void to_str(rs *R, sbuf *b, val v, int depth) {
    switch (v.t) {
    case V_UNDEF: break;
    case V_STR: sb_put(&R->a, b, v.u.s.p, v.u.s.n); break;
    default: repr(R, b, v, depth);
    }
}

static void repr(rs *R, sbuf *b, val v, int depth) {
    if (depth > 100) FAIL(R, "value nested too deeply");
    step(R);
    switch (v.t) {
    case V_UNDEF: sb_puts(&R->a, b, "Undefined"); break;
    case V_NONE: sb_puts(&R->a, b, "None"); break;
    case V_BOOL: sb_puts(&R->a, b, v.u.i ? "True" : "False"); break;
    case V_INT: sb_printf(&R->a, b, "%lld", (long long)v.u.i); break;
    case V_FLOAT: fmt_float(R, b, v.u.f, 0); break;
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
        if (v.u.l->kind != LK_PLAIN) sb_puts(&R->a, b, type_name(v)), sb_puts(&R->a, b, "(");
        sb_puts(&R->a, b, v.u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_puts(&R->a, b, ", ");
            repr(R, b, v.u.l->v[i], depth + 1);
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
            repr(R, b, v.u.d->k[i], depth + 1);
            sb_puts(&R->a, b, ": ");
            repr(R, b, v.u.d->v[i], depth + 1);
        }
        sb_puts(&R->a, b, v.t == V_NS ? "}>" : "}");
        break;
    default: FAIL(R, "cannot print a %s", type_name(v));
    }
}

static val str_of(rs *R, val v) {
    if (v.t == V_STR) return v;
    sbuf b = {0};
    to_str(R, &b, v, 0);
    return vsb(&b);
}

static int truthy(val v) {
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

static int val_eq(rs *R, val a, val b, int depth) {
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
            if (!val_eq(R, a.u.l->v[i], b.u.l->v[i], depth + 1)) return 0;
        return 1;
    case V_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            val *x = dict_find(b.u.d, a.u.d->k[i].u.s.p, a.u.d->k[i].u.s.n);
            if (!x || !val_eq(R, a.u.d->v[i], *x, depth + 1)) return 0;
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
static int val_cmp(rs *R, val a, val b, int depth) {
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
            if (val_eq(R, a.u.l->v[i], b.u.l->v[i], depth + 1)) continue;
            return val_cmp(R, a.u.l->v[i], b.u.l->v[i], depth + 1);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    if (a.t == V_UNDEF) undef_fail(R, a);
    if (b.t == V_UNDEF) undef_fail(R, b);
    FAIL(R, "'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
    return 0;
}

/* Items of an iterable as a list (strings give characters, dicts keys). */
static list *iter_list(rs *R, val v) {
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
    default: FAIL(R, "'%s' object is not iterable", type_name(v)); return NULL;
    }
}

static int64_t length_of(rs *R, val v) {
    switch (v.t) {
    case V_UNDEF: return 0;
    case V_STR: return (int64_t)u8len(v.u.s.p, v.u.s.n);
    case V_LIST:
        if (v.u.l->kind == LK_GEN) FAIL(R, "object of type 'generator' has no len()");
        return (int64_t)v.u.l->n;
    case V_DICT:
    case V_NS: return (int64_t)v.u.d->n;
    default: FAIL(R, "object of type '%s' has no len()", type_name(v)); return 0;
    }
}

/* ------------------------------------------------------------------ */
/* JSON                                                                 */

static val from_json(rs *R, json_t *j, int depth) {
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
        for (size_t i = 0; i < json_array_size(j); i++) list_push(R, l, from_json(R, json_array_get(j, i), depth + 1));
        return vlist(l);
    }
    case JSON_OBJECT: {
        dict *d = dict_new(R);
        const char *k;
        json_t *x;
        json_object_foreach(j, k, x) {
            size_t kn = strlen(k);
            dict_set(R, d, vstr(adup(&R->a, k, kn), kn), from_json(R, x, depth + 1));
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

typedef struct {
    const char *indent; /* NULL: no indent */
    size_t indn;
    const char *item_sep, *key_sep;
    size_t isn, ksn;
    int sort_keys;
} jsonopt;

static int key_cmp(const void *a, const void *b) {
    const val *x = *(val *const *)a, *y = *(val *const *)b;
    size_t n = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
    int c = n ? memcmp(x->u.s.p, y->u.s.p, n) : 0;
    return c ? c : (x->u.s.n > y->u.s.n) - (x->u.s.n < y->u.s.n);
}

/* json.dumps(v, ensure_ascii=False, ...) */
static void to_json(rs *R, sbuf *b, val v, const jsonopt *o, int level) {
    if (level > 100) FAIL(R, "value nested too deeply for tojson");
    step(R);
    switch (v.t) {
    case V_NONE: sb_puts(&R->a, b, "null"); return;
    case V_BOOL: sb_puts(&R->a, b, v.u.i ? "true" : "false"); return;
    case V_INT: sb_printf(&R->a, b, "%lld", (long long)v.u.i); return;
    case V_FLOAT: fmt_float(R, b, v.u.f, 1); return;
    case V_STR: json_str(R, b, v.u.s.p, v.u.s.n); return;
    case V_LIST:
    case V_DICT: {
        if (v.t == V_LIST && v.u.l->kind != LK_PLAIN) FAIL(R, "Object of type %s is not JSON serializable", type_name(v));
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
                to_json(R, b, v.u.d->v[k], o, level + 1);
            } else {
                to_json(R, b, v.u.l->v[k], o, level + 1);
            }
        }
        if (o->indent) {
            sb_puts(&R->a, b, "\n");
            for (int l = 0; l < level; l++) sb_put(&R->a, b, o->indent, o->indn);
        }
        sb_puts(&R->a, b, isd ? "}" : "]");
        return;
    }
    default: FAIL(R, "Object of type %s is not JSON serializable", type_name(v));
    }
}

/* ------------------------------------------------------------------ */
/* Evaluation                                                           */

static val eval(rs *R, const expr *e, frame *f);
static void exec_body(rs *R, const stmt *s, frame *f);

static val lookup(rs *R, frame *f, const char *name, size_t n) {
    for (; f; f = f->parent) {
        val *v = dict_find(f->vars, name, n);
        if (v) return *v;
    }
    int g = lookup_name(GLOBALS, G_N, name, n);
    if (g >= 0) {
        val v = {V_FUNC, {0}, 0};
        v.u.fn = g;
        return v;
    }
    (void)R;
    return vundef(name, n);
}

static val vmethod(rs *R, val self, int id) {
    method *m = aalloc(&R->a, sizeof *m);
    m->self = self;
    m->id = id;
    val v = {V_METHOD, {0}, 0};
    v.u.me = m;
    return v;
}

static val get_attr(rs *R, val obj, const char *name, size_t n) {
    switch (obj.t) {
    case V_UNDEF: undef_fail(R, obj); break;
    case V_DICT: {
        int m = lookup_name(DICT_METHODS, 4, name, n);
        if (m >= 0) return vmethod(R, obj, M_ITEMS + m);
        if (lookup_name(MUTATING, 11, name, n) >= 0) return vmethod(R, obj, M_MUTATE);
        val *x = dict_find(obj.u.d, name, n);
        if (x) return *x;
        break;
    }
    case V_NS: {
        val *x = dict_find(obj.u.d, name, n);
        if (x) return *x;
        break;
    }
    case V_STR: {
        int m = lookup_name(STR_METHODS, M_FORMAT + 1, name, n);
        if (m >= 0) return vmethod(R, obj, m);
        break;
    }
    case V_LIST:
        if (lookup_name(MUTATING, 11, name, n) >= 0) return vmethod(R, obj, M_MUTATE);
        break;
    case V_LOOP: {
        loopst *l = obj.u.lp;
        int64_t len = (int64_t)l->items->n, i = (int64_t)l->i;
#define IS(s) (n == sizeof(s) - 1 && !memcmp(name, s, n))
        if (IS("index")) return vint(i + 1);
        if (IS("index0")) return vint(i);
        if (IS("revindex")) return vint(len - i);
        if (IS("revindex0")) return vint(len - i - 1);
        if (IS("first")) return vbool(i == 0);
        if (IS("last")) return vbool(i == len - 1);
        if (IS("length")) return vint(len);
        if (IS("depth")) return vint(1);
        if (IS("depth0")) return vint(0);
        if (IS("previtem")) return i > 0 ? l->items->v[i - 1] : vundef("previtem", 8);
        if (IS("nextitem")) return i + 1 < len ? l->items->v[i + 1] : vundef("nextitem", 8);
        if (IS("cycle")) return vmethod(R, obj, M_CYCLE);
#undef IS
        break;
    }
    default: break;
    }
    return undef_hint(R, obj, "attribute", vstr(name, n));
}

static int64_t norm_index(int64_t i, int64_t len) { return i < 0 ? i + len : i; }

static val get_item(rs *R, val obj, val key) {
    if (obj.t == V_UNDEF) undef_fail(R, obj);
    if (obj.t == V_DICT || obj.t == V_NS) {
        if (key.t == V_STR) {
            val *x = dict_find(obj.u.d, key.u.s.p, key.u.s.n);
            if (x) return *x;
            if (obj.t == V_DICT) return get_attr(R, obj, key.u.s.p, key.u.s.n);
        }
        return undef_hint(R, obj, "element", key);
    }
    if ((obj.t == V_LIST || obj.t == V_STR) && (key.t == V_INT || key.t == V_BOOL)) {
        if (obj.t == V_LIST) {
            if (obj.u.l->kind != LK_PLAIN && obj.u.l->kind != LK_RANGE) return vundef(NULL, 0); /* not subscriptable */
            int64_t i = norm_index(key.u.i, (int64_t)obj.u.l->n);
            if (i < 0 || i >= (int64_t)obj.u.l->n) return undef_hint(R, obj, "element", key);
            return obj.u.l->v[i];
        }
        list *cs = iter_list(R, obj);
        int64_t i = norm_index(key.u.i, (int64_t)cs->n);
        if (i < 0 || i >= (int64_t)cs->n) return undef_hint(R, obj, "element", key);
        val ch = cs->v[i];
        ch.mk = obj.mk;
        return ch;
    }
    if (key.t == V_STR) return get_attr(R, obj, key.u.s.p, key.u.s.n);
    return vundef(NULL, 0);
}

/* Python slice semantics on lists and strings. */
static val do_slice(rs *R, val obj, val vs, val ve, val vst) {
    if (obj.t == V_UNDEF) undef_fail(R, obj);
    list *src = NULL; /* FAIL does not return (clang cannot tell) */
    if (obj.t == V_LIST && obj.u.l->kind != LK_PLAIN && obj.u.l->kind != LK_RANGE) return vundef(NULL, 0);
    if (obj.t == V_LIST) src = obj.u.l;
    else if (obj.t == V_STR) src = iter_list(R, obj);
    else FAIL(R, "'%s' object is not subscriptable", type_name(obj));
    int64_t len = (int64_t)src->n, st = 1;
    for (int k = 0; k < 3; k++) {
        val x = k == 0 ? vs : k == 1 ? ve : vst;
        if (x.t != V_NONE && x.t != V_INT && x.t != V_BOOL) FAIL(R, "slice indices must be integers or None");
    }
    if (vst.t != V_NONE) st = vst.u.i;
    if (st == 0) FAIL(R, "slice step cannot be zero");
    int64_t lo, hi;
    if (st > 0) {
        lo = vs.t == V_NONE ? 0 : norm_index(vs.u.i, len);
        hi = ve.t == V_NONE ? len : norm_index(ve.u.i, len);
        if (lo < 0) lo = 0;
        if (lo > len) lo = len;
        if (hi < 0) hi = 0;
        if (hi > len) hi = len;
    } else {
        lo = vs.t == V_NONE ? len - 1 : norm_index(vs.u.i, len);
        hi = ve.t == V_NONE ? -1 : norm_index(ve.u.i, len);
        if (lo < -1) lo = -1;
        if (lo > len - 1) lo = len - 1;
        if (hi < -1) hi = -1;
        if (hi > len - 1) hi = len - 1;
    }
    list *out = list_new(R, 0);
    out->tuple = src->tuple;
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
        step(R);
        list_push(R, out, src->v[i]);
    }
    if (obj.t == V_LIST) return vlist(out);
    sbuf b = {0};
    for (size_t i = 0; i < out->n; i++) sb_put(&R->a, &b, out->v[i].u.s.p, out->v[i].u.s.n);
    val r = vsb(&b);
    r.mk = obj.mk;
    return r;
}

static val markup_escape(rs *R, val v);
static val py_percent(rs *R, val fmt, val args);

static val arith(rs *R, int op, val a, val b) {
    if (a.t == V_UNDEF) undef_fail(R, a);
    if (b.t == V_UNDEF) undef_fail(R, b);
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR && (a.mk || b.mk)) {
        a = markup_escape(R, a), b = markup_escape(R, b);
        sbuf s = {0};
        sb_put(&R->a, &s, a.u.s.p, a.u.s.n);
        sb_put(&R->a, &s, b.u.s.p, b.u.s.n);
        val r = vsb(&s);
        r.mk = 1;
        return r;
    }
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        sbuf s = {0};
        sb_put(&R->a, &s, a.u.s.p, a.u.s.n);
        sb_put(&R->a, &s, b.u.s.p, b.u.s.n);
        return vsb(&s);
    }
    if ((a.t == V_LIST && a.u.l->kind != LK_PLAIN) || (b.t == V_LIST && b.u.l->kind != LK_PLAIN))
        FAIL(R, "unsupported operand type(s): '%s' and '%s'", type_name(a), type_name(b));
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST && a.u.l->tuple == b.u.l->tuple) {
        list *l = list_new(R, a.u.l->n + b.u.l->n);
        l->tuple = a.u.l->tuple;
        for (size_t i = 0; i < a.u.l->n; i++) list_push(R, l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) list_push(R, l, b.u.l->v[i]);
        return vlist(l);
    }
    if (op == OP_MOD && a.t == V_STR) return py_percent(R, a, b);
    if (op == OP_MUL && ((a.t == V_STR || a.t == V_LIST) && (b.t == V_INT || b.t == V_BOOL))) {
        val t = a;
        a = b, b = t;
    }
    if (op == OP_MUL && (a.t == V_INT || a.t == V_BOOL) && (b.t == V_STR || b.t == V_LIST)) {
        int64_t k = a.u.i < 0 ? 0 : a.u.i;
        if (b.t == V_STR) {
            if (b.u.s.n && (uint64_t)k > J_MAX_OUTPUT / b.u.s.n) FAIL(R, "string too long");
            sbuf s = {0};
            for (int64_t i = 0; i < k; i++) step(R), sb_put(&R->a, &s, b.u.s.p, b.u.s.n);
            val r = vsb(&s);
            r.mk = b.mk;
            return r;
        }
        if (b.u.l->n && (uint64_t)k > 1000000 / b.u.l->n) FAIL(R, "list too long");
        list *l = list_new(R, 0);
        l->tuple = b.u.l->tuple;
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < b.u.l->n; j++) step(R), list_push(R, l, b.u.l->v[j]);
        return vlist(l);
    }
    if (!is_num(a) || !is_num(b)) {
        static const char *const nm[] = {"+", "-", "*", "/", "//", "%", "**"};
        FAIL(R, "unsupported operand type(s) for %s: '%s' and '%s'", nm[op], type_name(a), type_name(b));
    }
    if (a.t != V_FLOAT && b.t != V_FLOAT && op != OP_DIV) {
        int64_t x = a.u.i, y = b.u.i, r = 0;
        int ovf = 0;
        switch (op) {
        case OP_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
        case OP_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
        case OP_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
        case OP_FDIV:
        case OP_MOD:
            if (!y) FAIL(R, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) ovf = 1;
            else {
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) q--, m += y;
                r = op == OP_FDIV ? q : m;
            }
            break;
        case OP_POW:
            if (y < 0) return vfloat(pow((double)x, (double)y));
            if (x == 0 || x == 1) r = y ? x : 1;
            else if (x == -1) r = y % 2 ? -1 : 1;
            else {
                r = 1; /* |x| >= 2 overflows within 64 steps */
                for (int64_t i = 0; i < y && !ovf; i++) ovf = __builtin_mul_overflow(r, x, &r);
            }
            break;
        }
        if (ovf) FAIL(R, "integer overflow (only 64-bit integers are supported)");
        return vint(r);
    }
    double x = num_f(a), y = num_f(b);
    switch (op) {
    case OP_ADD: return vfloat(x + y);
    case OP_SUB: return vfloat(x - y);
    case OP_MUL: return vfloat(x * y);
    case OP_DIV:
        if (y == 0) FAIL(R, "division by zero");
        return vfloat(x / y);
    case OP_FDIV:
    case OP_MOD: {
        if (y == 0) FAIL(R, "float division or modulo by zero");
        double m = fmod(x, y);
        if (m && ((m < 0) != (y < 0))) m += y;
        if (op == OP_MOD) return vfloat(m);
        return vfloat(floor((x - m) / y + 0.0));
    }
    case OP_POW: return vfloat(pow(x, y));
    }
    return vnone();
}

static int contains(rs *R, val hay, val needle) {
    switch (hay.t) {
    case V_STR:
        if (needle.t != V_STR) FAIL(R, "'in <string>' requires string as left operand, not %s", type_name(needle));
        if (!needle.u.s.n) return 1;
        return memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
    case V_LIST:
        if (hay.u.l->kind == LK_KEYS && (needle.t == V_LIST || needle.t == V_DICT))
            FAIL(R, "unhashable type: '%s'", type_name(needle));
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (val_eq(R, hay.u.l->v[i], needle, 0)) return 1;
        return 0;
    case V_DICT:
    case V_NS:
        if (needle.t == V_LIST || needle.t == V_DICT) FAIL(R, "unhashable type: '%s'", type_name(needle));
        return needle.t == V_STR && dict_find(hay.u.d, needle.u.s.p, needle.u.s.n) != NULL;
    case V_UNDEF: return 0;
    default: FAIL(R, "argument of type '%s' is not iterable", type_name(hay)); return 0;
    }
}

/* Evaluated call arguments. */
typedef struct {
    val *pos;
    size_t npos;
    const arg *kw; /* keyword arg exprs */
    val *kwv;
    size_t nkw;
} callargs;

static callargs eval_args(rs *R, const expr *e, frame *f) {
    callargs c = {0};
    c.pos = aalloc(&R->a, (e->nargs + 1) * sizeof(val));
    c.kwv = aalloc(&R->a, (e->nargs + 1) * sizeof(val));
    c.kw = aalloc(&R->a, (e->nargs + 1) * sizeof(arg));
    for (size_t i = 0; i < e->nargs; i++) {
        val v = eval(R, e->args[i].e, f);
        if (e->args[i].name) ((arg *)c.kw)[c.nkw] = e->args[i], c.kwv[c.nkw++] = v;
        else c.pos[c.npos++] = v;
    }
    return c;
}

/* Parameter `i` named `name`: positional i, else keyword, else default. */
static val param(rs *R, const callargs *c, size_t i, const char *name, val dflt) {
    if (i < c->npos) return c->pos[i];
    size_t n = strlen(name);
    for (size_t k = 0; k < c->nkw; k++)
        if (c->kw[k].nlen == n && !memcmp(c->kw[k].name, name, n)) return c->kwv[k];
    (void)R;
    return dflt;
}

static void check_args(rs *R, const callargs *c, size_t maxpos, const char *const *names, const char *what) {
    if (c->npos > maxpos) FAIL(R, "%s: too many positional arguments", what);
    for (size_t k = 0; k < c->nkw; k++) {
        int ok = 0;
        for (size_t j = 0; names && names[j]; j++)
            if (strlen(names[j]) == c->kw[k].nlen && !memcmp(names[j], c->kw[k].name, c->kw[k].nlen)) ok = 1;
        if (!ok) FAIL(R, "%s: unexpected keyword argument '%.*s'", what, (int)c->kw[k].nlen, c->kw[k].name);
    }
}

static val need_str(rs *R, val v, const char *what) {
    if (v.t != V_STR) FAIL(R, "%s: expected a string, got %s", what, type_name(v));
    return v;
}

static int64_t need_int(rs *R, val v, const char *what) {
    if (v.t != V_INT && v.t != V_BOOL) FAIL(R, "%s: expected an integer, got %s", what, type_name(v));
    return v.u.i;
}

/* Case mapping by code point (Python uses full case mapping; the simple
 * mapping differs only for a few characters such as U+00DF). */
typedef enum { CASE_UPPER, CASE_LOWER, CASE_TITLE_PY, CASE_CAPITALIZE, CASE_TITLE_JINJA } casemode;

/* The unconditional multi-character mappings of SpecialCasing.txt that
 * chat text may meet (sharp s, Latin ligatures, dotted capital I). */
static const char *special_case(int32_t c, int kind) { /* kind: 0 lower, 1 upper, 2 title */
    switch (c) {
    case 0xDF: return kind == 1 ? "SS" : kind == 2 ? "Ss" : NULL;
    case 0xFB00: return kind == 1 ? "FF" : kind == 2 ? "Ff" : NULL;
    case 0xFB01: return kind == 1 ? "FI" : kind == 2 ? "Fi" : NULL;
    case 0xFB02: return kind == 1 ? "FL" : kind == 2 ? "Fl" : NULL;
    case 0xFB03: return kind == 1 ? "FFI" : kind == 2 ? "Ffi" : NULL;
    case 0xFB04: return kind == 1 ? "FFL" : kind == 2 ? "Ffl" : NULL;
    case 0xFB05:
    case 0xFB06: return kind == 1 ? "ST" : kind == 2 ? "St" : NULL;
    case 0x130: return kind == 0 ? "i\xcc\x87" : NULL;
    default: return NULL;
    }
}

static int is_cased(int32_t c) {
    utf8proc_category_t cat = utf8proc_category(c);
    return cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT ||
           utf8proc_tolower(c) != c || utf8proc_toupper(c) != c;
}

static val map_case(rs *R, val s, casemode m) {
    sbuf b = {0};
    int prev_cased = 0, first = 1, word_start = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        int32_t c;
        size_t k = u8dec(s.u.s.p + i, s.u.s.n - i, &c);
        int kind; /* 0 lower, 1 upper, 2 title */
        switch (m) {
        case CASE_UPPER: kind = 1; break;
        case CASE_LOWER: kind = 0; break;
        case CASE_CAPITALIZE: kind = first ? 2 : 0; break;
        case CASE_TITLE_PY:
            /* str.title: a cased char after a cased char is lowered */
            kind = prev_cased ? 0 : 2;
            prev_cased = is_cased(c);
            break;
        default:
            /* jinja's title filter: words start after [-\s({\[<] runs */
            kind = word_start ? 1 : 0;
            word_start = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
            break;
        }
        first = 0;
        const char *sp = special_case(c, kind);
        if (sp) {
            sb_puts(&R->a, &b, sp);
        } else {
            int32_t o = kind == 1 ? utf8proc_toupper(c) : kind == 2 ? utf8proc_totitle(c) : utf8proc_tolower(c);
            char u[4];
            sb_put(&R->a, &b, u, u8enc(o, u));
        }
        i += k;
    }
    return vsb(&b);
}

/* Python str.strip family. chars NULL: whitespace. */
static val strip(rs *R, val s, val chars, int left, int right) {
    (void)R;
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    int has_chars = chars.t == V_STR;
    while (n && left) {
        int32_t c;
        size_t k = u8dec(p, n, &c);
        if (!(has_chars ? (memmem(chars.u.s.p, chars.u.s.n, p, k) != NULL) : py_space(c))) break;
        p += k, n -= k;
    }
    while (n && right) {
        size_t k = 1;
        while (k < n && k < 4 && ((unsigned char)p[n - k] & 0xC0) == 0x80) k++;
        int32_t c;
        u8dec(p + n - k, k, &c);
        if (!(has_chars ? (memmem(chars.u.s.p, chars.u.s.n, p + n - k, k) != NULL) : py_space(c))) break;
        n -= k;
    }
    return vstr(p, n);
}

static val str_replace(rs *R, val s, val old, val new_, int64_t count) {
    sbuf b = {0};
    if (!old.u.s.n) {
        /* Python inserts `new` between characters and at both ends */
        list *cs = iter_list(R, s);
        int64_t done = 0;
        for (size_t i = 0; i <= cs->n; i++) {
            if (count < 0 || done < count) sb_put(&R->a, &b, new_.u.s.p, new_.u.s.n), done++;
            if (i < cs->n) sb_put(&R->a, &b, cs->v[i].u.s.p, cs->v[i].u.s.n);
        }
        return vsb(&b);
    }
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    int64_t done = 0;
    while (p < end) {
        const char *q = (count < 0 || done < count) ? memmem(p, (size_t)(end - p), old.u.s.p, old.u.s.n) : NULL;
        if (!q) break;
        sb_put(&R->a, &b, p, (size_t)(q - p));
        sb_put(&R->a, &b, new_.u.s.p, new_.u.s.n);
        p = q + old.u.s.n;
        done++;
        step(R);
    }
    sb_put(&R->a, &b, p, (size_t)(end - p));
    return vsb(&b);
}

/* Python str.split(sep=None, maxsplit=-1) and rsplit. */
static val str_split(rs *R, val s, val sep, int64_t maxsplit, int reverse) {
    list *l = list_new(R, 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.t == V_STR) {
        if (!sep.u.s.n) FAIL(R, "empty separator");
        if (!reverse) {
            const char *q, *end = p + n;
            int64_t k = 0;
            while ((maxsplit < 0 || k < maxsplit) && (q = memmem(p, (size_t)(end - p), sep.u.s.p, sep.u.s.n))) {
                step(R);
                list_push(R, l, vstr(p, (size_t)(q - p)));
                p = q + sep.u.s.n;
                k++;
            }
            list_push(R, l, vstr(p, (size_t)(end - p)));
        } else {
            list *tmp = list_new(R, 0);
            size_t end = n;
            int64_t k = 0;
            for (size_t i = n; i >= sep.u.s.n && (maxsplit < 0 || k < maxsplit);) {
                if (!memcmp(p + i - sep.u.s.n, sep.u.s.p, sep.u.s.n)) {
                    list_push(R, tmp, vstr(p + i, end - i));
                    i -= sep.u.s.n;
                    end = i;
                    k++;
                } else {
                    i--;
                }
                step(R);
            }
            list_push(R, tmp, vstr(p, end));
            for (size_t i = tmp->n; i-- > 0;) list_push(R, l, tmp->v[i]);
        }
        return vlist(l);
    }
    /* whitespace split: runs of whitespace, no empty strings */
    list *cs = iter_list(R, s);
    if (reverse) {
        list *tmp = list_new(R, 0);
        int64_t k = 0;
        size_t i = cs->n;
        while (i > 0) {
            int32_t c;
            while (i > 0 && (u8dec(cs->v[i - 1].u.s.p, cs->v[i - 1].u.s.n, &c), py_space(c))) i--;
            if (!i) break;
            if (maxsplit >= 0 && k == maxsplit) {
                list_push(R, tmp, vstr(p, (size_t)(cs->v[i - 1].u.s.p + cs->v[i - 1].u.s.n - p)));
                i = 0;
                break;
            }
            size_t e = i;
            while (i > 0 && (u8dec(cs->v[i - 1].u.s.p, cs->v[i - 1].u.s.n, &c), !py_space(c))) i--;
            const char *a = cs->v[i].u.s.p;
            list_push(R, tmp, vstr(a, (size_t)(cs->v[e - 1].u.s.p + cs->v[e - 1].u.s.n - a)));
            k++;
        }
        for (size_t j = tmp->n; j-- > 0;) list_push(R, l, tmp->v[j]);
        return vlist(l);
    }
    size_t i = 0;
    int64_t k = 0;
    while (i < cs->n) {
        int32_t c;
        while (i < cs->n && (u8dec(cs->v[i].u.s.p, cs->v[i].u.s.n, &c), py_space(c))) i++;
        if (i == cs->n) break;
        if (maxsplit >= 0 && k == maxsplit) {
            list_push(R, l, vstr(cs->v[i].u.s.p, (size_t)(p + n - cs->v[i].u.s.p)));
            break;
        }
        size_t st = i;
        while (i < cs->n && (u8dec(cs->v[i].u.s.p, cs->v[i].u.s.n, &c), !py_space(c))) i++;
        list_push(R, l, vstr(cs->v[st].u.s.p, (size_t)(cs->v[i - 1].u.s.p + cs->v[i - 1].u.s.n - cs->v[st].u.s.p)));
        k++;
    }
    return vlist(l);
}

/* str.splitlines(): jinja's indent filter relies on it. */
static list *splitlines(rs *R, const char *p, size_t n) {
    list *l = list_new(R, 0);
    size_t st = 0;
    for (size_t i = 0; i < n;) {
        int32_t c;
        size_t k = u8dec(p + i, n - i, &c);
        if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e ||
            c == 0x85 || c == 0x2028 || c == 0x2029) {
            list_push(R, l, vstr(p + st, i - st));
            if (c == '\r' && i + 1 < n && p[i + 1] == '\n') k++;
            st = i + k;
        }
        i += k;
    }
    if (st < n) list_push(R, l, vstr(p + st, n - st));
    return l;
}

static val call_value(rs *R, val fn, const callargs *c, int line);
static int run_test(rs *R, int fn, val v, const callargs *c);

/* Attribute lookup used by selectattr/map/join(attribute=): dotted paths,
 * integer parts index lists (jinja2's make_attrgetter). */
static val attr_path(rs *R, val v, val path) {
    if (path.t == V_INT) return get_item(R, v, path);
    need_str(R, path, "attribute");
    const char *p = path.u.s.p, *end = p + path.u.s.n;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
        int isint = n > 0;
        int64_t iv = 0;
        for (size_t i = 0; i < n; i++) {
            if (!is_digit(p[i]) || iv > INT64_MAX / 10 - 10) isint = 0;
            else iv = iv * 10 + (p[i] - '0');
        }
        v = isint ? get_item(R, v, vint(iv)) : get_item(R, v, vstr(p, n));
        if (!dot) return v;
        p = dot + 1;
    }
}

static val vstrz(const char *s) { return vstr(s, strlen(s)); }

/* select/reject/selectattr/rejectattr */
static val filter_select(rs *R, val seq, const callargs *c, int attr, int want) {
    list *items = iter_list(R, seq), *out = list_new(R, 0);
    size_t first = attr ? 1 : 0;
    if (attr && c->npos < 1) FAIL(R, "selectattr/rejectattr need an attribute");
    int tfn = -1;
    if (c->npos > first) {
        val tn = need_str(R, c->pos[first], "select test");
        tfn = lookup_name(jinja_tests, T_N, tn.u.s.p, tn.u.s.n);
        if (tfn < 0) FAIL(R, "no test named '%.*s'", (int)(tn.u.s.n > 60 ? 60 : tn.u.s.n), tn.u.s.p);
    }
    callargs tc = {0};
    if (c->npos > first + 1) {
        tc.pos = c->pos + first + 1;
        tc.npos = c->npos - first - 1;
    }
    for (size_t i = 0; i < items->n; i++) {
        step(R);
        val x = attr ? attr_path(R, items->v[i], c->pos[0]) : items->v[i];
        int ok = tfn < 0 ? truthy(x) : run_test(R, tfn, x, &tc);
        if (ok == want) list_push(R, out, items->v[i]);
    }
    out->kind = LK_GEN;
    return vlist(out);
}

static val apply_filter(rs *R, int fn, val v, const callargs *c, int line);

static val filter_map(rs *R, val seq, const callargs *c, int line) {
    list *items = iter_list(R, seq), *out = list_new(R, items->n);
    val attr = param(R, c, 99, "attribute", vundef(NULL, 0));
    if (attr.t != V_UNDEF) {
        val dflt = param(R, c, 99, "default", vundef(NULL, 0));
        for (size_t i = 0; i < items->n; i++) {
            step(R);
            val x = attr_path(R, items->v[i], attr);
            list_push(R, out, x.t == V_UNDEF && dflt.t != V_UNDEF ? dflt : x);
        }
        out->kind = LK_GEN;
        return vlist(out);
    }
    if (c->npos < 1) FAIL(R, "map: needs a filter name or attribute=");
    val fnm = need_str(R, c->pos[0], "map");
    int f = lookup_name(jinja_filters, F_N, fnm.u.s.p, fnm.u.s.n);
    if (f < 0) FAIL(R, "no filter named '%.*s'", (int)(fnm.u.s.n > 60 ? 60 : fnm.u.s.n), fnm.u.s.p);
    callargs fc = *c;
    fc.pos++;
    fc.npos--;
    for (size_t i = 0; i < items->n; i++) step(R), list_push(R, out, apply_filter(R, f, items->v[i], &fc, line));
    out->kind = LK_GEN;
    return vlist(out);
}

static val sort_key(rs *R, val v, int ci) { return ci && v.t == V_STR ? map_case(R, v, CASE_LOWER) : v; }

/* Stable merge sort (Python's sort is stable). */
static void msort(rs *R, val *a, val *keys, size_t n, val *tmp, val *tmpk, int reverse) {
    if (n < 2) return;
    size_t m = n / 2;
    msort(R, a, keys, m, tmp, tmpk, reverse);
    msort(R, a + m, keys + m, n - m, tmp, tmpk, reverse);
    size_t i = 0, j = m, k = 0;
    while (i < m && j < n) {
        step(R);
        int c = val_cmp(R, keys[j], keys[i], 0);
        int take_right = reverse ? c > 0 : c < 0;
        if (take_right) tmp[k] = a[j], tmpk[k++] = keys[j++];
        else tmp[k] = a[i], tmpk[k++] = keys[i++];
    }
    while (i < m) tmp[k] = a[i], tmpk[k++] = keys[i++];
    while (j < n) tmp[k] = a[j], tmpk[k++] = keys[j++];
    memcpy(a, tmp, n * sizeof *a);
    memcpy(keys, tmpk, n * sizeof *keys);
}

static val do_round(rs *R, val v, int64_t prec, val method) {
    if (!is_num(v)) FAIL(R, "round: expected a number");
    const char *m = method.t == V_STR ? method.u.s.p : "common";
    size_t mn = method.t == V_STR ? method.u.s.n : 6;
    if (mn == 6 && !memcmp(m, "common", 6)) {
        if (v.t != V_FLOAT) return v.t == V_BOOL ? vint(v.u.i) : v;
        if (prec > 300 || prec < -300 || !isfinite(v.u.f)) return v;
        if (prec >= 0) {
            /* correctly rounded, ties to even on the exact binary value, as Python */
            char tmp[400];
            snprintf(tmp, sizeof tmp, "%.*f", (int)prec, v.u.f);
            return vfloat(strtod(tmp, NULL));
        }
        double p10 = pow(10, (double)-prec), r = v.u.f / p10, fl = floor(r);
        double d = r - fl;
        double y = d > 0.5 ? fl + 1 : d < 0.5 ? fl : (fmod(fl, 2) == 0 ? fl : fl + 1);
        return vfloat(y * p10);
    }
    int ceil_ = mn == 4 && !memcmp(m, "ceil", 4), floor_ = mn == 5 && !memcmp(m, "floor", 5);
    if (!ceil_ && !floor_) FAIL(R, "method must be common, ceil or floor");
    double p10 = pow(10, (double)prec), x = num_f(v) * p10;
    return vfloat((ceil_ ? ceil(x) : floor(x)) / p10);
}

/* float(s) for an ASCII string: decimal digits, sign, point, exponent, or
 * inf/infinity/nan (strtod alone would also take hex floats). */
static int py_float_parse(const char *buf, double *out) {
    const char *q = buf + (buf[0] == '+' || buf[0] == '-');
    if (!strcasecmp(q, "inf") || !strcasecmp(q, "infinity") || !strcasecmp(q, "nan")) {
        *out = strtod(buf, NULL);
        return 1;
    }
    int digits = 0;
    for (const char *c = q; *c; c++) {
        if (is_digit(*c)) digits = 1;
        else if (!strchr(".eE+-", *c)) return 0;
    }
    char *end;
    *out = strtod(buf, &end);
    return digits && end != buf && !*end;
}

static val to_int_val(rs *R, val v, val dflt, int64_t base) {
    if (v.t == V_UNDEF) undef_fail(R, v); /* int(Undefined) raises */
    if (v.t == V_INT) return v;
    if (v.t == V_BOOL) return vint(v.u.i);
    if (v.t == V_FLOAT) {
        if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18) return dflt;
        return vint((int64_t)v.u.f);
    }
    if (v.t == V_STR) {
        /* int(s, base); else int(float(s)) */
        char buf[80];
        val t = strip(R, v, vnone(), 1, 1);
        if (t.u.s.n && t.u.s.n < sizeof buf) {
            size_t k = 0;
            for (size_t i = 0; i < t.u.s.n; i++)
                if (t.u.s.p[i] != '_') buf[k++] = t.u.s.p[i];
            buf[k] = 0;
            int ok = k > 0;
            for (size_t i = 0; i < t.u.s.n; i++) ok &= (unsigned char)t.u.s.p[i] < 0x80;
            if (ok && base >= 2 && base <= 36) {
                char *end;
                errno = 0;
                long long x = strtoll(buf, &end, (int)base);
                if (!*end && !errno && end != buf && buf[0] != ' ') return vint(x);
                double d;
                if (base == 10 && py_float_parse(buf, &d) && isfinite(d) && fabs(d) < 9.2e18) return vint((int64_t)d);
            }
        }
        return dflt;
    }
    return dflt;
}

static val to_float_val(rs *R, val v, val dflt) {
    if (v.t == V_UNDEF) undef_fail(R, v);
    if (is_num(v)) return vfloat(num_f(v));
    if (v.t == V_STR) {
        val t = strip(R, v, vnone(), 1, 1);
        char buf[80];
        if (t.u.s.n && t.u.s.n < sizeof buf) {
            memcpy(buf, t.u.s.p, t.u.s.n);
            buf[t.u.s.n] = 0;
            double d;
            if (py_float_parse(buf, &d)) return vfloat(d);
        }
    }
    return dflt;
}

static val markup_escape(rs *R, val v) {
    if (v.t == V_STR && v.mk) return v;
    val s = str_of(R, v);
    sbuf b = {0};
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i];
        const char *r = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;" : ch == '\'' ? "&#39;" : NULL;
        if (r) sb_puts(&R->a, &b, r);
        else sb_put(&R->a, &b, &ch, 1);
    }
    val o = vsb(&b);
    o.mk = 1;
    return o;
}

static val apply_filter_(rs *R, int fn, val v, const callargs *c, int line);

static void pad_to(rs *R, sbuf *b, val s, int64_t width, int left) {
    int64_t len = (int64_t)u8len(s.u.s.p, s.u.s.n);
    if (!left) for (int64_t i = len; i < width; i++) sb_puts(&R->a, b, " ");
    sb_put(&R->a, b, s.u.s.p, s.u.s.n);
    if (left) for (int64_t i = len; i < width; i++) sb_puts(&R->a, b, " ");
}

/* Python's printf-style `fmt % args`: %[(key)][flags][width][.prec]type
 * with types s r d i u f F e E g G x X o c and %%. */
static val py_percent(rs *R, val fmt, val args) {
    list *pos = NULL;
    dict *map = NULL;
    if (args.t == V_LIST && args.u.l->tuple) pos = args.u.l;
    else if (args.t == V_DICT) map = args.u.d;
    size_t next = 0;
    int used_single = 0;
    sbuf b = {0};
    const char *p = fmt.u.s.p, *e = p + fmt.u.s.n;
    while (p < e) {
        const char *q = memchr(p, '%', (size_t)(e - p));
        if (!q) q = e;
        sb_put(&R->a, &b, p, (size_t)(q - p));
        if (q == e) break;
        p = q + 1;
        if (p == e) FAIL(R, "incomplete format");
        if (*p == '%') { sb_puts(&R->a, &b, "%"); p++; continue; }
        val arg;
        if (*p == '(') {
            const char *k = memchr(p, ')', (size_t)(e - p));
            if (!k || !map) FAIL(R, "format requires a mapping");
            val *x = dict_find(map, p + 1, (size_t)(k - p - 1));
            if (!x) FAIL(R, "KeyError in format: '%.*s'", (int)(k - p - 1), p + 1);
            arg = *x;
            p = k + 1;
        } else if (pos) {
            if (next >= pos->n) FAIL(R, "not enough arguments for format string");
            arg = pos->v[next++];
        } else {
            if (used_single++) FAIL(R, "not enough arguments for format string");
            arg = args;
        }
        char flags[8];
        int nf = 0;
        while (p < e && strchr("-+ #0", *p) && nf < 6) flags[nf++] = *p++;
        flags[nf] = 0;
        int64_t width = -1, prec = -1;
        if (p < e && *p == '*') FAIL(R, "unsupported construct: '*' width in format");
        while (p < e && is_digit(*p)) width = (width < 0 ? 0 : width) * 10 + (*p++ - '0'), width = width > 4096 ? 4096 : width;
        if (p < e && *p == '.') {
            p++;
            prec = 0;
            while (p < e && is_digit(*p)) prec = prec * 10 + (*p++ - '0'), prec = prec > 300 ? 300 : prec;
        }
        if (p == e) FAIL(R, "incomplete format");
        char t = *p++;
        int left = strchr(flags, '-') != NULL;
        if (t == 's' || t == 'r') {
            sbuf tmp = {0};
            if (t == 's') to_str(R, &tmp, arg, 0);
            else repr(R, &tmp, arg, 0);
            val sv = vsb(&tmp);
            if (prec >= 0) { /* precision truncates characters */
                list *cs = iter_list(R, sv);
                size_t cut = 0;
                for (int64_t i = 0; i < prec && (size_t)i < cs->n; i++) cut += cs->v[i].u.s.n;
                sv.u.s.n = cut;
            }
            pad_to(R, &b, sv, width, left);
            continue;
        }
        if (arg.t == V_UNDEF) undef_fail(R, arg);
        if (!is_num(arg)) FAIL(R, "%%%c format: a real number is required, not %s", t, type_name(arg));
        char spec[32], out[400];
        int k;
        if (strchr("diuxXoc", t)) {
            int64_t iv;
            if (arg.t == V_FLOAT) {
                if (t != 'd' && t != 'i' && t != 'u') FAIL(R, "%%%c format: an integer is required, not float", t);
                if (!isfinite(arg.u.f) || fabs(arg.u.f) >= 9.2e18) FAIL(R, "integer overflow");
                iv = (int64_t)arg.u.f;
            } else {
                iv = arg.u.i;
            }
            if (t == 'c') {
                if (iv < 0 || iv > 0x10FFFF) FAIL(R, "%%c arg not in range(0x110000)");
                char u[4];
                pad_to(R, &b, vstr(u, u8enc((int32_t)iv, u)), width, left);
                continue;
            }
            char ct = t == 'i' || t == 'u' ? 'd' : t;
            int neg = iv < 0;
            uint64_t mag = neg ? (uint64_t)0 - (uint64_t)iv : (uint64_t)iv;
            if (ct == 'd') snprintf(spec, sizeof spec, "%%%s%s*.*llu", flags, "");
            else snprintf(spec, sizeof spec, "%%%s*.*ll%c", flags, ct);
            /* sign handled here because C's %x/%o are unsigned */
            char digits[80];
            snprintf(digits, sizeof digits, ct == 'd' ? "%llu" : ct == 'x' ? "%llx" : ct == 'X' ? "%llX" : "%llo", (unsigned long long)mag);
            const char *sign = neg ? "-" : strchr(flags, '+') ? "+" : strchr(flags, ' ') ? " " : "";
            const char *pre = strchr(flags, '#') ? (ct == 'x' ? "0x" : ct == 'X' ? "0X" : ct == 'o' ? "0o" : "") : "";
            int64_t nd = (int64_t)strlen(digits), zeros = prec > nd ? prec - nd : 0;
            int64_t body = (int64_t)strlen(sign) + (int64_t)strlen(pre) + zeros + nd;
            int zero_pad = strchr(flags, '0') && !left;
            if (!left && !zero_pad) for (int64_t i = body; i < width; i++) sb_puts(&R->a, &b, " ");
            sb_puts(&R->a, &b, sign);
            sb_puts(&R->a, &b, pre);
            if (zero_pad) for (int64_t i = body; i < width; i++) sb_puts(&R->a, &b, "0");
            for (int64_t i = 0; i < zeros; i++) sb_puts(&R->a, &b, "0");
            sb_puts(&R->a, &b, digits);
            if (left) for (int64_t i = body; i < width; i++) sb_puts(&R->a, &b, " ");
            continue;
        }
        if (!strchr("fFeEgG", t)) FAIL(R, "unsupported format character '%c'", t);
        snprintf(spec, sizeof spec, "%%%s*.*%c", flags, t);
        k = snprintf(out, sizeof out, spec, (int)(width < 0 ? 0 : width), (int)(prec < 0 ? 6 : prec), num_f(arg));
        if (k < 0 || (size_t)k >= sizeof out) FAIL(R, "formatted number too long");
        sb_put(&R->a, &b, out, (size_t)k);
    }
    if ((pos && next < pos->n) || (!pos && !map && !used_single && args.t != V_DICT))
        FAIL(R, "not all arguments converted during string formatting");
    return vsb(&b);
}

/* str.format with {}, {N} and {name} fields (no format specs). */
static val py_format(rs *R, val fmt, const callargs *c) {
    sbuf b = {0};
    const char *p = fmt.u.s.p, *e = p + fmt.u.s.n;
    size_t auto_i = 0;
    while (p < e) {
        if (*p == '{' && p + 1 < e && p[1] == '{') { sb_puts(&R->a, &b, "{"); p += 2; continue; }
        if (*p == '}' && p + 1 < e && p[1] == '}') { sb_puts(&R->a, &b, "}"); p += 2; continue; }
        if (*p == '}') FAIL(R, "Single '}' encountered in format string");
        if (*p != '{') { sb_put(&R->a, &b, p++, 1); continue; }
        const char *k = memchr(p, '}', (size_t)(e - p));
        if (!k) FAIL(R, "Single '{' encountered in format string");
        const char *f = p + 1;
        size_t n = (size_t)(k - f);
        for (size_t i = 0; i < n; i++)
            if (f[i] == ':' || f[i] == '!' || f[i] == '.' || f[i] == '[')
                FAIL(R, "unsupported construct: format field '{%.*s}'", (int)(n > 40 ? 40 : n), f);
        val arg;
        if (!n || is_digit(f[0])) {
            size_t idx = 0;
            if (!n) idx = auto_i++;
            else for (size_t i = 0; i < n; i++) {
                if (!is_digit(f[i]) || idx > 100000) FAIL(R, "bad format field");
                idx = idx * 10 + (size_t)(f[i] - '0');
            }
            if (idx >= c->npos) FAIL(R, "Replacement index %zu out of range for positional args tuple", idx);
            arg = c->pos[idx];
        } else {
            arg = vundef(NULL, 0);
            int found = 0;
            for (size_t i = 0; i < c->nkw; i++)
                if (c->kw[i].nlen == n && !memcmp(c->kw[i].name, f, n)) arg = c->kwv[i], found = 1;
            if (!found) FAIL(R, "KeyError in format: '%.*s'", (int)(n > 40 ? 40 : n), f);
        }
        to_str(R, &b, arg, 0);
        p = k + 1;
    }
    return vsb(&b);
}

/* Filters that run str methods on their input keep a Markup a Markup. */
static val apply_filter(rs *R, int fn, val v, const callargs *c, int line) {
    val r = apply_filter_(R, fn, v, c, line);
    if (v.t == V_STR && v.mk && r.t == V_STR &&
        (fn == F_UPPER || fn == F_LOWER || fn == F_CAPITALIZE || fn == F_TRIM || fn == F_STRING || fn == F_CENTER ||
         fn == F_INDENT || fn == F_REVERSE))
        r.mk = 1;
    return r;
}

static val apply_filter_(rs *R, int fn, val v, const callargs *c, int line) {
    (void)line;
    step(R);
    switch (fn) {
    case F_TRIM: {
        static const char *const nm[] = {"chars", NULL};
        check_args(R, c, 1, nm, "trim");
        return strip(R, str_of(R, v), param(R, c, 0, "chars", vnone()), 1, 1);
    }
    case F_TOJSON: {
        static const char *const nm[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
        check_args(R, c, 4, nm, "tojson");
        val ea = param(R, c, 0, "ensure_ascii", vbool(0)), ind = param(R, c, 1, "indent", vnone()),
            sep = param(R, c, 2, "separators", vnone()), sk = param(R, c, 3, "sort_keys", vbool(0));
        if (truthy(ea)) FAIL(R, "unsupported construct: tojson(ensure_ascii=True)");
        jsonopt o = {0};
        if (ind.t == V_INT || ind.t == V_BOOL) {
            int64_t k = ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : ind.u.i;
            char *sp = aalloc(&R->a, (size_t)k + 1);
            memset(sp, ' ', (size_t)k);
            o.indent = sp;
            o.indn = (size_t)k;
        } else if (ind.t == V_STR) {
            o.indent = ind.u.s.p;
            o.indn = ind.u.s.n;
        } else if (ind.t != V_NONE) {
            FAIL(R, "tojson: indent must be an integer or string");
        }
        if (sep.t == V_LIST && sep.u.l->n == 2 && sep.u.l->v[0].t == V_STR && sep.u.l->v[1].t == V_STR) {
            o.item_sep = sep.u.l->v[0].u.s.p, o.isn = sep.u.l->v[0].u.s.n;
            o.key_sep = sep.u.l->v[1].u.s.p, o.ksn = sep.u.l->v[1].u.s.n;
        } else if (sep.t == V_NONE) {
            o.item_sep = o.indent ? "," : ", ";
            o.isn = strlen(o.item_sep);
            o.key_sep = ": ", o.ksn = 2;
        } else {
            FAIL(R, "tojson: separators must be a pair of strings");
        }
        o.sort_keys = truthy(sk);
        sbuf b = {0};
        to_json(R, &b, v, &o, 0);
        return vsb(&b);
    }
    case F_LENGTH:
    case F_COUNT: check_args(R, c, 0, NULL, "length"); return vint(length_of(R, v));
    case F_UPPER: check_args(R, c, 0, NULL, "upper"); return map_case(R, str_of(R, v), CASE_UPPER);
    case F_LOWER: check_args(R, c, 0, NULL, "lower"); return map_case(R, str_of(R, v), CASE_LOWER);
    case F_CAPITALIZE: check_args(R, c, 0, NULL, "capitalize"); return map_case(R, str_of(R, v), CASE_CAPITALIZE);
    case F_TITLE: check_args(R, c, 0, NULL, "title"); return map_case(R, str_of(R, v), CASE_TITLE_JINJA);
    case F_REPLACE: {
        static const char *const nm[] = {"old", "new", "count", NULL};
        check_args(R, c, 3, nm, "replace");
        val o = str_of(R, param(R, c, 0, "old", vundef(NULL, 0))), n = str_of(R, param(R, c, 1, "new", vundef(NULL, 0)));
        val cnt = param(R, c, 2, "count", vnone());
        return str_replace(R, str_of(R, v), o, n, cnt.t == V_NONE ? -1 : need_int(R, cnt, "replace"));
    }
    case F_JOIN: {
        static const char *const nm[] = {"d", "attribute", NULL};
        check_args(R, c, 2, nm, "join");
        val d = str_of(R, param(R, c, 0, "d", vstr("", 0))), at = param(R, c, 1, "attribute", vnone());
        list *l = iter_list(R, v);
        sbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) sb_put(&R->a, &b, d.u.s.p, d.u.s.n);
            to_str(R, &b, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at), 0);
        }
        return vsb(&b);
    }
    case F_FIRST: {
        check_args(R, c, 0, NULL, "first");
        list *l = iter_list(R, v);
        return l->n ? l->v[0] : vundef(NULL, 0);
    }
    case F_LAST: {
        check_args(R, c, 0, NULL, "last");
        if ((v.t != V_LIST && v.t != V_STR && v.t != V_DICT) || (v.t == V_LIST && v.u.l->kind == LK_GEN))
            FAIL(R, "last: '%s' object is not reversible", type_name(v));
        list *l = iter_list(R, v);
        return l->n ? l->v[l->n - 1] : vundef(NULL, 0);
    }
    case F_DEFAULT:
    case F_D: {
        static const char *const nm[] = {"default_value", "boolean", NULL};
        check_args(R, c, 2, nm, "default");
        val d = param(R, c, 0, "default_value", vstr("", 0)), b = param(R, c, 1, "boolean", vbool(0));
        if (v.t == V_UNDEF || (truthy(b) && !truthy(v))) return d;
        return v;
    }
    case F_STRING: check_args(R, c, 0, NULL, "string"); return str_of(R, v);
    case F_INT: {
        static const char *const nm[] = {"default", "base", NULL};
        check_args(R, c, 2, nm, "int");
        return to_int_val(R, v, param(R, c, 0, "default", vint(0)), need_int(R, param(R, c, 1, "base", vint(10)), "int"));
    }
    case F_FLOAT: {
        static const char *const nm[] = {"default", NULL};
        check_args(R, c, 1, nm, "float");
        return to_float_val(R, v, param(R, c, 0, "default", vfloat(0)));
    }
    case F_LIST: {
        check_args(R, c, 0, NULL, "list");
        list *l = iter_list(R, v), *o = list_new(R, l->n);
        for (size_t i = 0; i < l->n; i++) list_push(R, o, l->v[i]);
        return vlist(o);
    }
    case F_ITEMS: {
        check_args(R, c, 0, NULL, "items");
        if (v.t == V_UNDEF) {
            list *e = list_new(R, 0);
            e->kind = LK_GEN;
            return vlist(e);
        }
        if (v.t != V_DICT) FAIL(R, "items: can only get item pairs from a mapping");
        list *o = list_new(R, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            list *t = list_new(R, 2);
            t->tuple = 1;
            list_push(R, t, v.u.d->k[i]);
            list_push(R, t, v.u.d->v[i]);
            list_push(R, o, vlist(t));
        }
        o->kind = LK_GEN;
        return vlist(o);
    }
    case F_SELECTATTR: return filter_select(R, v, c, 1, 1);
    case F_REJECTATTR: return filter_select(R, v, c, 1, 0);
    case F_SELECT: return filter_select(R, v, c, 0, 1);
    case F_REJECT: return filter_select(R, v, c, 0, 0);
    case F_MAP: return filter_map(R, v, c, line);
    case F_INDENT: {
        static const char *const nm[] = {"width", "first", "blank", NULL};
        check_args(R, c, 3, nm, "indent");
        val w = param(R, c, 0, "width", vint(4));
        int first = truthy(param(R, c, 1, "first", vbool(0))), blank = truthy(param(R, c, 2, "blank", vbool(0)));
        sbuf ind = {0};
        if (w.t == V_STR) sb_put(&R->a, &ind, w.u.s.p, w.u.s.n);
        else {
            int64_t k = need_int(R, w, "indent");
            if (k > 4096) FAIL(R, "indent: width too large");
            for (int64_t i = 0; i < k; i++) sb_puts(&R->a, &ind, " ");
        }
        if (v.t == V_UNDEF) undef_fail(R, v);
        if (v.t != V_STR) FAIL(R, "indent: unsupported operand type(s) for +=: '%s' and 'str'", type_name(v));
        val s = v;
        sbuf tmp = {0};
        sb_put(&R->a, &tmp, s.u.s.p, s.u.s.n);
        sb_puts(&R->a, &tmp, "\n");
        list *ls = splitlines(R, tmp.p, tmp.n);
        sbuf b = {0};
        if (first) sb_put(&R->a, &b, ind.p, ind.n);
        for (size_t i = 0; i < ls->n; i++) {
            val x = ls->v[i];
            if (i) sb_puts(&R->a, &b, "\n");
            if (blank && i) sb_put(&R->a, &b, ind.p, ind.n);
            else if (!blank && i && x.u.s.n) sb_put(&R->a, &b, ind.p, ind.n);
            sb_put(&R->a, &b, x.u.s.p, x.u.s.n);
        }
        return vsb(&b);
    }
    case F_SAFE: {
        check_args(R, c, 0, NULL, "safe");
        val s = str_of(R, v);
        s.mk = 1;
        return s;
    }
    case F_ABS:
        check_args(R, c, 0, NULL, "abs");
        if (v.t == V_FLOAT) return vfloat(fabs(v.u.f));
        if (v.t == V_INT || v.t == V_BOOL) {
            if (v.u.i == INT64_MIN) FAIL(R, "integer overflow");
            return vint(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        FAIL(R, "bad operand type for abs(): '%s'", type_name(v));
        break;
    case F_ROUND: {
        static const char *const nm[] = {"precision", "method", NULL};
        check_args(R, c, 2, nm, "round");
        return do_round(R, v, need_int(R, param(R, c, 0, "precision", vint(0)), "round"), param(R, c, 1, "method", vstrz("common")));
    }
    case F_UNIQUE: {
        static const char *const nm[] = {"case_sensitive", "attribute", NULL};
        check_args(R, c, 2, nm, "unique");
        int cs = truthy(param(R, c, 0, "case_sensitive", vbool(0)));
        val at = param(R, c, 1, "attribute", vnone());
        list *l = iter_list(R, v), *o = list_new(R, 0), *seen = list_new(R, 0);
        for (size_t i = 0; i < l->n; i++) {
            val k = sort_key(R, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at), !cs);
            if (k.t == V_LIST || k.t == V_DICT) FAIL(R, "unhashable type: '%s'", type_name(k));
            int dup = 0;
            for (size_t j = 0; j < seen->n && !dup; j++) step(R), dup = val_eq(R, seen->v[j], k, 0);
            if (!dup) list_push(R, seen, k), list_push(R, o, l->v[i]);
        }
        o->kind = LK_GEN;
        return vlist(o);
    }
    case F_REVERSE: {
        check_args(R, c, 0, NULL, "reverse");
        if (v.t == V_STR) {
            list *l = iter_list(R, v);
            sbuf b = {0};
            for (size_t i = l->n; i-- > 0;) sb_put(&R->a, &b, l->v[i].u.s.p, l->v[i].u.s.n);
            return vsb(&b);
        }
        /* reversed(x) is an iterator; a generator is listed then reversed */
        int was_gen = v.t == V_LIST && v.u.l->kind == LK_GEN;
        if (v.t == V_DICT || (v.t == V_LIST && v.u.l->kind >= LK_ITEMS && v.u.l->kind <= LK_VALUES)) was_gen = 0;
        list *l = iter_list(R, v), *o = list_new(R, l->n);
        for (size_t i = l->n; i-- > 0;) list_push(R, o, l->v[i]);
        if (!was_gen) o->kind = LK_GEN;
        return vlist(o);
    }
    case F_ESCAPE:
    case F_E: check_args(R, c, 0, NULL, "escape"); return markup_escape(R, v);
    case F_FORMAT: {
        /* jinja2: soft_str(value) % (kwargs or args) */
        if (c->npos && c->nkw) FAIL(R, "can't handle positional and keyword arguments at the same time");
        val fmtv = str_of(R, v), args;
        if (c->nkw) {
            dict *d = dict_new(R);
            for (size_t i = 0; i < c->nkw; i++) dict_set(R, d, vstr(c->kw[i].name, c->kw[i].nlen), c->kwv[i]);
            args = vdict(d);
        } else {
            list *t = list_new(R, c->npos);
            t->tuple = 1;
            for (size_t i = 0; i < c->npos; i++) list_push(R, t, c->pos[i]);
            args = vlist(t);
        }
        return py_percent(R, fmtv, args);
    }
    case F_SUM: {
        static const char *const nm[] = {"attribute", "start", NULL};
        check_args(R, c, 2, nm, "sum");
        val at = param(R, c, 0, "attribute", vnone()), acc = param(R, c, 1, "start", vint(0));
        list *l = iter_list(R, v);
        for (size_t i = 0; i < l->n; i++) acc = arith(R, OP_ADD, acc, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at));
        return acc;
    }
    case F_MIN:
    case F_MAX: {
        static const char *const nm[] = {"case_sensitive", "attribute", NULL};
        check_args(R, c, 2, nm, "min/max");
        int cs = truthy(param(R, c, 0, "case_sensitive", vbool(0)));
        val at = param(R, c, 1, "attribute", vnone());
        list *l = iter_list(R, v);
        if (!l->n) return vundef(NULL, 0);
        size_t best = 0;
        val bk = sort_key(R, at.t == V_NONE ? l->v[0] : attr_path(R, l->v[0], at), !cs);
        for (size_t i = 1; i < l->n; i++) {
            val k = sort_key(R, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at), !cs);
            int cmp = val_cmp(R, k, bk, 0);
            if (fn == F_MIN ? cmp < 0 : cmp > 0) best = i, bk = k;
        }
        return l->v[best];
    }
    case F_SORT: {
        static const char *const nm[] = {"reverse", "case_sensitive", "attribute", NULL};
        check_args(R, c, 3, nm, "sort");
        int rev = truthy(param(R, c, 0, "reverse", vbool(0))), cs = truthy(param(R, c, 1, "case_sensitive", vbool(0)));
        val at = param(R, c, 2, "attribute", vnone());
        list *l = iter_list(R, v), *o = list_new(R, l->n + 1);
        val *keys = aalloc(&R->a, (l->n + 1) * sizeof *keys), *tmp = aalloc(&R->a, (l->n + 1) * sizeof *tmp),
            *tmpk = aalloc(&R->a, (l->n + 1) * sizeof *tmpk);
        for (size_t i = 0; i < l->n; i++) {
            list_push(R, o, l->v[i]);
            keys[i] = sort_key(R, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at), !cs);
        }
        msort(R, o->v, keys, o->n, tmp, tmpk, rev);
        return vlist(o);
    }
    case F_DICTSORT: {
        static const char *const nm[] = {"case_sensitive", "by", "reverse", NULL};
        check_args(R, c, 3, nm, "dictsort");
        if (v.t != V_DICT) FAIL(R, "dictsort: expected a mapping");
        int cs = truthy(param(R, c, 0, "case_sensitive", vbool(0)));
        val by = param(R, c, 1, "by", vstrz("key"));
        int rev = truthy(param(R, c, 2, "reverse", vbool(0)));
        int byv = by.t == V_STR && str_eq(by, "value", 5);
        if (!byv && !(by.t == V_STR && str_eq(by, "key", 3))) FAIL(R, "dictsort: by must be 'key' or 'value'");
        size_t n = v.u.d->n;
        list *o = list_new(R, n + 1);
        val *keys = aalloc(&R->a, (n + 1) * sizeof *keys), *tmp = aalloc(&R->a, (n + 1) * sizeof *tmp),
            *tmpk = aalloc(&R->a, (n + 1) * sizeof *tmpk);
        for (size_t i = 0; i < n; i++) {
            list *t = list_new(R, 2);
            t->tuple = 1;
            list_push(R, t, v.u.d->k[i]);
            list_push(R, t, v.u.d->v[i]);
            list_push(R, o, vlist(t));
            keys[i] = sort_key(R, byv ? v.u.d->v[i] : v.u.d->k[i], !cs);
        }
        msort(R, o->v, keys, n, tmp, tmpk, rev);
        return vlist(o);
    }
    case F_WORDCOUNT: {
        check_args(R, c, 0, NULL, "wordcount");
        /* jinja2: len(re.findall(r"\w+", s)) */
        val s = str_of(R, v);
        int64_t k = 0;
        int in = 0;
        for (size_t i = 0; i < s.u.s.n;) {
            int32_t ch;
            i += u8dec(s.u.s.p + i, s.u.s.n - i, &ch);
            utf8proc_category_t cat = utf8proc_category(ch);
            int w = ch == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                    (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO) || cat == UTF8PROC_CATEGORY_MN ||
                    cat == UTF8PROC_CATEGORY_MC;
            if (w && !in) k++;
            in = w;
        }
        return vint(k);
    }
    case F_CENTER: {
        static const char *const nm[] = {"width", NULL};
        check_args(R, c, 1, nm, "center");
        int64_t w = need_int(R, param(R, c, 0, "width", vint(80)), "center");
        val s = str_of(R, v);
        int64_t len = (int64_t)u8len(s.u.s.p, s.u.s.n);
        if (w > 1 << 20) FAIL(R, "center: width too large");
        if (w <= len) return s;
        /* Python str.center: left = pad/2 + (pad & width & 1) */
        int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
        sbuf b = {0};
        for (int64_t i = 0; i < left; i++) sb_puts(&R->a, &b, " ");
        sb_put(&R->a, &b, s.u.s.p, s.u.s.n);
        for (int64_t i = 0; i < pad - left; i++) sb_puts(&R->a, &b, " ");
        return vsb(&b);
    }
    }
    FAIL(R, "internal: a compiled filter id without a case"); /* unknown filters fail at compile */
    return vnone();
}

static int run_test(rs *R, int fn, val v, const callargs *c) {
    step(R);
    val a0 = c->npos ? c->pos[0] : vundef(NULL, 0);
    int need1 = fn >= T_DIVISIBLEBY && fn <= T_SAMEAS;
    if (need1 && !c->npos) FAIL(R, "test '%s' needs an argument", jinja_tests[fn]);
    switch (fn) {
    case T_DEFINED: return v.t != V_UNDEF;
    case T_UNDEFINED: return v.t == V_UNDEF;
    case T_NONE_: return v.t == V_NONE;
    case T_STRING: return v.t == V_STR;
    case T_MAPPING: return v.t == V_DICT;
    case T_ITERABLE: return v.t == V_UNDEF || v.t == V_STR || v.t == V_LIST || v.t == V_DICT;
    case T_SEQUENCE:
        return v.t == V_UNDEF || v.t == V_STR || v.t == V_DICT ||
               (v.t == V_LIST && (v.u.l->kind == LK_PLAIN || v.u.l->kind == LK_RANGE));
    case T_NUMBER: return is_num(v);
    case T_INTEGER: return v.t == V_INT;
    case T_FLOAT_: return v.t == V_FLOAT;
    case T_BOOLEAN: return v.t == V_BOOL;
    case T_TRUE: return v.t == V_BOOL && v.u.i;
    case T_FALSE: return v.t == V_BOOL && !v.u.i;
    case T_ODD:
    case T_EVEN: {
        if (v.t == V_UNDEF) undef_fail(R, v);
        if (v.t == V_FLOAT) {
            double m = fmod(v.u.f, 2);
            if (m < 0) m += 2;
            return fn == T_ODD ? m == 1 : m == 0;
        }
        int64_t x = need_int(R, v, jinja_tests[fn]);
        return fn == T_ODD ? (x % 2 != 0) : (x % 2 == 0);
    }
    case T_DIVISIBLEBY: {
        val m = arith(R, OP_MOD, v, a0);
        return num_f(m) == 0;
    }
    case T_EQ: case T_EQUALTO: case T_EQ2: return val_eq(R, v, a0, 0);
    case T_NE: case T_NE2: return !val_eq(R, v, a0, 0);
    case T_LT: case T_LT2: case T_LESSTHAN: return val_cmp(R, v, a0, 0) < 0;
    case T_GT: case T_GT2: case T_GREATERTHAN: return val_cmp(R, v, a0, 0) > 0;
    case T_LE: case T_LE2: return val_cmp(R, v, a0, 0) <= 0;
    case T_GE: case T_GE2: return val_cmp(R, v, a0, 0) >= 0;
    case T_IN: return contains(R, a0, v);
    case T_SAMEAS:
        if (v.t != a0.t) return 0;
        if (v.t == V_NONE || v.t == V_UNDEF) return v.t == V_NONE;
        if (v.t == V_BOOL) return v.u.i == a0.u.i;
        if (v.t == V_INT) return v.u.i == a0.u.i && v.u.i >= -5 && v.u.i <= 256; /* CPython's small ints */
        if (v.t == V_LIST) return v.u.l == a0.u.l;
        if (v.t == V_DICT || v.t == V_NS) return v.u.d == a0.u.d;
        if (v.t == V_STR) return v.u.s.p == a0.u.s.p && v.u.s.n == a0.u.s.n;
        return val_eq(R, v, a0, 0);
    case T_CALLABLE: return v.t == V_MACRO || v.t == V_METHOD || v.t == V_FUNC || v.t == V_UNDEF; /* Undefined has __call__ */
    case T_LOWER:
    case T_UPPER: {
        v = str_of(R, v); /* str(value).islower() */
        val m = map_case(R, v, fn == T_LOWER ? CASE_LOWER : CASE_UPPER);
        int cased = 0;
        for (size_t i = 0; i < v.u.s.n;) {
            int32_t ch;
            i += u8dec(v.u.s.p + i, v.u.s.n - i, &ch);
            cased |= utf8proc_tolower(ch) != ch || utf8proc_toupper(ch) != ch;
        }
        return cased && str_eq(m, v.u.s.p, v.u.s.n);
    }
    }
    FAIL(R, "internal: a compiled test id without a case"); /* unknown tests fail at compile */
    return 0;
}

static void do_strftime(rs *R, sbuf *b, val fmtv) {
    need_str(R, fmtv, "strftime_now");
    char fmt[256], out[512];
    if (fmtv.u.s.n >= sizeof fmt || memchr(fmtv.u.s.p, 0, fmtv.u.s.n)) FAIL(R, "strftime_now: format too long");
    memcpy(fmt, fmtv.u.s.p, fmtv.u.s.n);
    fmt[fmtv.u.s.n] = 0;
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm)) FAIL(R, "strftime_now: localtime failed");
    size_t k = strftime(out, sizeof out, fmt, &tm);
    if (!k && fmt[0]) FAIL(R, "strftime_now: result too long");
    sb_put(&R->a, b, out, k);
}

static val call_method_(rs *R, method *m, const callargs *c);

/* Markup's str methods return Markup and escape their string arguments. */
static val call_method(rs *R, method *m, const callargs *c) {
    val s = m->self;
    if (s.t != V_STR || !s.mk) return call_method_(R, m, c);
    callargs c2 = *c;
    if (m->id == M_REPLACE || m->id == M_JOIN) {
        c2.pos = aalloc(&R->a, (c->npos + 1) * sizeof *c2.pos);
        for (size_t i = 0; i < c->npos; i++) {
            val x = c->pos[i];
            if (m->id == M_REPLACE && i < 2 && x.t == V_STR) x = markup_escape(R, x);
            if (m->id == M_JOIN && i == 0) {
                list *l = iter_list(R, x), *e = list_new(R, l->n);
                for (size_t k = 0; k < l->n; k++) list_push(R, e, markup_escape(R, l->v[k]));
                x = vlist(e);
            }
            c2.pos[i] = x;
        }
    }
    val r = call_method_(R, m, &c2);
    if (r.t == V_STR) r.mk = 1;
    if (r.t == V_LIST && (m->id == M_SPLIT || m->id == M_RSPLIT || m->id == M_SPLITLINES))
        for (size_t i = 0; i < r.u.l->n; i++) r.u.l->v[i].mk = 1;
    return r;
}

static val call_method_(rs *R, method *m, const callargs *c) {
    val s = m->self;
    step(R);
    switch (m->id) {
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
        check_args(R, c, 1, NULL, "strip");
        val ch = c->npos ? c->pos[0] : vnone();
        if (ch.t != V_NONE) need_str(R, ch, "strip");
        return strip(R, s, ch, m->id != M_RSTRIP, m->id != M_LSTRIP);
    }
    case M_SPLIT: case M_RSPLIT: {
        static const char *const nm[] = {"sep", "maxsplit", NULL};
        check_args(R, c, 2, nm, "split");
        val sep = param(R, c, 0, "sep", vnone());
        if (sep.t != V_NONE) need_str(R, sep, "split");
        return str_split(R, s, sep, need_int(R, param(R, c, 1, "maxsplit", vint(-1)), "split"), m->id == M_RSPLIT);
    }
    case M_STARTSWITH: case M_ENDSWITH: {
        check_args(R, c, 1, NULL, "startswith");
        if (c->npos != 1) FAIL(R, "startswith/endswith take one argument");
        val a = c->pos[0];
        list *cands;
        if (a.t == V_LIST && a.u.l->tuple) cands = a.u.l;
        else {
            need_str(R, a, "startswith/endswith");
            cands = list_new(R, 1);
            list_push(R, cands, a);
        }
        for (size_t i = 0; i < cands->n; i++) {
            val x = need_str(R, cands->v[i], "startswith/endswith");
            if (x.u.s.n > s.u.s.n) continue;
            const char *at = m->id == M_STARTSWITH ? s.u.s.p : s.u.s.p + s.u.s.n - x.u.s.n;
            if (!x.u.s.n || !memcmp(at, x.u.s.p, x.u.s.n)) return vbool(1);
        }
        return vbool(0);
    }
    case M_UPPER: check_args(R, c, 0, NULL, "upper"); return map_case(R, s, CASE_UPPER);
    case M_LOWER: check_args(R, c, 0, NULL, "lower"); return map_case(R, s, CASE_LOWER);
    case M_TITLE: check_args(R, c, 0, NULL, "title"); return map_case(R, s, CASE_TITLE_PY);
    case M_CAPITALIZE: check_args(R, c, 0, NULL, "capitalize"); return map_case(R, s, CASE_CAPITALIZE);
    case M_REPLACE: {
        check_args(R, c, 3, NULL, "replace");
        if (c->npos < 2) FAIL(R, "replace takes at least 2 arguments");
        return str_replace(R, s, need_str(R, c->pos[0], "replace"), need_str(R, c->pos[1], "replace"),
                           c->npos > 2 ? need_int(R, c->pos[2], "replace") : -1);
    }
    case M_FIND: case M_COUNT: {
        check_args(R, c, 1, NULL, "find/count");
        if (c->npos != 1) FAIL(R, "find/count take one argument here");
        val x = need_str(R, c->pos[0], "find/count");
        if (m->id == M_FIND) {
            if (!x.u.s.n) return vint(0);
            const char *q = memmem(s.u.s.p, s.u.s.n, x.u.s.p, x.u.s.n);
            return vint(q ? (int64_t)u8len(s.u.s.p, (size_t)(q - s.u.s.p)) : -1);
        }
        if (!x.u.s.n) return vint((int64_t)u8len(s.u.s.p, s.u.s.n) + 1);
        int64_t k = 0;
        for (const char *p = s.u.s.p, *e = p + s.u.s.n, *q; (q = memmem(p, (size_t)(e - p), x.u.s.p, x.u.s.n)); p = q + x.u.s.n) k++;
        return vint(k);
    }
    case M_FORMAT: return py_format(R, s, c);
    case M_SPLITLINES: check_args(R, c, 0, NULL, "splitlines"); return vlist(splitlines(R, s.u.s.p, s.u.s.n));
    case M_JOIN: {
        check_args(R, c, 1, NULL, "join");
        if (c->npos != 1) FAIL(R, "join takes one argument");
        list *l = iter_list(R, c->pos[0]);
        sbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) sb_put(&R->a, &b, s.u.s.p, s.u.s.n);
            sb_put(&R->a, &b, need_str(R, l->v[i], "join").u.s.p, l->v[i].u.s.n);
        }
        return vsb(&b);
    }
    case M_ISDIGIT: case M_ISALPHA: case M_ISSPACE: {
        check_args(R, c, 0, NULL, "is*");
        if (!s.u.s.n) return vbool(0);
        for (size_t i = 0; i < s.u.s.n;) {
            int32_t ch;
            i += u8dec(s.u.s.p + i, s.u.s.n - i, &ch);
            utf8proc_category_t cat = utf8proc_category(ch);
            int ok = m->id == M_ISSPACE ? py_space(ch)
                   : m->id == M_ISDIGIT ? cat == UTF8PROC_CATEGORY_ND
                   : (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO);
            if (!ok) return vbool(0);
        }
        return vbool(1);
    }
    case M_ITEMS: case M_KEYS: case M_VALUES: {
        check_args(R, c, 0, NULL, "items");
        dict *d = s.u.d;
        list *o = list_new(R, d->n);
        for (size_t i = 0; i < d->n; i++) {
            if (m->id == M_KEYS) list_push(R, o, d->k[i]);
            else if (m->id == M_VALUES) list_push(R, o, d->v[i]);
            else {
                list *t = list_new(R, 2);
                t->tuple = 1;
                list_push(R, t, d->k[i]);
                list_push(R, t, d->v[i]);
                list_push(R, o, vlist(t));
            }
        }
        o->kind = m->id == M_ITEMS ? LK_ITEMS : m->id == M_KEYS ? LK_KEYS : LK_VALUES;
        return vlist(o);
    }
    case M_GET: {
        check_args(R, c, 2, NULL, "get");
        if (c->npos < 1) FAIL(R, "get expected at least 1 argument");
        val k = c->pos[0];
        if (k.t == V_STR) {
            val *x = dict_find(s.u.d, k.u.s.p, k.u.s.n);
            if (x) return *x;
        }
        return c->npos > 1 ? c->pos[1] : vnone();
    }
    case M_CYCLE: {
        check_args(R, c, 1000000, NULL, "cycle");
        if (!c->npos) FAIL(R, "no items for cycling given");
        return c->pos[s.u.lp->i % c->npos];
    }
    case M_MUTATE: FAIL(R, "access to a mutating method is unsafe in the sandbox (immutable objects)"); break;
    }
    FAIL(R, "unknown method"); /* unreachable: method names are resolved when the template compiles */
    return vnone();
}

static val call_macro(rs *R, const struct closure *cl, const callargs *c) {
    const stmt *m = cl->m;
    if (++R->depth > J_MAX_CALL_DEPTH) FAIL(R, "macro recursion too deep");
    /* frames live in the arena: a `caller` may outlive the C frame that made it */
    frame *fp = aalloc(&R->a, sizeof *fp);
    fp->parent = cl->f;
    fp->vars = dict_new(R);
    if (c->npos > m->nnames) FAIL(R, "macro '%.*s' takes not more than %zu argument(s)", (int)m->n, m->s, m->nnames);
    for (size_t i = 0; i < m->nnames; i++) {
        val v = vundef(m->names[i], m->nlens[i]);
        int got = 0;
        if (i < c->npos) v = c->pos[i], got = 1;
        for (size_t k = 0; k < c->nkw; k++)
            if (c->kw[k].nlen == m->nlens[i] && !memcmp(c->kw[k].name, m->names[i], m->nlens[i])) {
                if (got) FAIL(R, "macro got multiple values for argument");
                v = c->kwv[k], got = 1;
            }
        if (!got && m->defaults[i]) v = eval(R, m->defaults[i], fp);
        dict_set(R, fp->vars, vstr(m->names[i], m->nlens[i]), v);
    }
    for (size_t k = 0; k < c->nkw; k++) {
        int ok = 0;
        if (m->uses_caller && c->kw[k].nlen == 6 && !memcmp(c->kw[k].name, "caller", 6)) {
            dict_set(R, fp->vars, vstr("caller", 6), c->kwv[k]);
            continue;
        }
        for (size_t i = 0; i < m->nnames; i++) ok |= c->kw[k].nlen == m->nlens[i] && !memcmp(c->kw[k].name, m->names[i], m->nlens[i]);
        if (!ok) FAIL(R, "macro '%.*s' takes no keyword argument '%.*s'", (int)m->n, m->s, (int)c->kw[k].nlen, c->kw[k].name);
    }
    sbuf out = {0}, *saved = R->out;
    int saved_brk = R->brk;
    R->out = &out;
    exec_body(R, m->body, fp);
    R->out = saved;
    R->brk = saved_brk;
    R->depth--;
    return vsb(&out);
}

static val call_value(rs *R, val fn, const callargs *c, int line) {
    (void)line;
    switch (fn.t) {
    case V_UNDEF: undef_fail(R, fn); break;
    case V_MACRO: return call_macro(R, fn.u.m, c);
    case V_METHOD: return call_method(R, fn.u.me, c);
    case V_FUNC:
        switch (fn.u.fn) {
        case G_RAISE: {
            val m = c->npos ? str_of(R, c->pos[0]) : vstr("", 0);
            FAIL(R, "%.*s", (int)(m.u.s.n > 4000 ? 4000 : m.u.s.n), m.u.s.p);
            break;
        }
        case G_STRFTIME: {
            check_args(R, c, 1, NULL, "strftime_now");
            if (c->npos != 1) FAIL(R, "strftime_now takes one argument");
            sbuf b = {0};
            do_strftime(R, &b, c->pos[0]);
            return vsb(&b);
        }
        case G_NAMESPACE:
        case G_DICT: {
            dict *d = dict_new(R);
            if (c->npos > 1) FAIL(R, "%s: too many positional arguments", GLOBALS[fn.u.fn]);
            if (c->npos == 1) {
                if (c->pos[0].t != V_DICT) FAIL(R, "%s: positional argument must be a mapping", GLOBALS[fn.u.fn]);
                for (size_t i = 0; i < c->pos[0].u.d->n; i++) dict_set(R, d, c->pos[0].u.d->k[i], c->pos[0].u.d->v[i]);
            }
            for (size_t k = 0; k < c->nkw; k++) {
                if (fn.u.fn == G_NAMESPACE && c->kw[k].name[0] == '_')
                    FAIL(R, "chat templates cannot store underscore-prefixed attributes on a namespace");
                dict_set(R, d, vstr(c->kw[k].name, c->kw[k].nlen), c->kwv[k]);
            }
            val v = vdict(d);
            if (fn.u.fn == G_NAMESPACE) v.t = V_NS;
            return v;
        }
        case G_RANGE: {
            check_args(R, c, 3, NULL, "range");
            int64_t a = 0, b = 0, st = 1;
            if (c->npos == 1) b = need_int(R, c->pos[0], "range");
            else if (c->npos >= 2) {
                a = need_int(R, c->pos[0], "range"), b = need_int(R, c->pos[1], "range");
                if (c->npos == 3) st = need_int(R, c->pos[2], "range");
            } else FAIL(R, "range expected at least 1 argument");
            if (!st) FAIL(R, "range() arg 3 must not be zero");
            double cnt = st > 0 ? ceil(((double)b - (double)a) / (double)st) : ceil(((double)a - (double)b) / (double)-st);
            if (cnt > J_MAX_RANGE) FAIL(R, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", J_MAX_RANGE);
            list *l = list_new(R, cnt > 0 ? (size_t)cnt : 0);
            for (int64_t i = a; st > 0 ? i < b : i > b; i += st) step(R), list_push(R, l, vint(i));
            l->kind = LK_RANGE;
            l->r0 = a, l->r1 = b, l->r2 = st;
            return vlist(l);
        }
        }
        break;
    default: break;
    }
    FAIL(R, "'%s' object is not callable", type_name(fn));
    return vnone();
}

static val eval_(rs *R, const expr *e, frame *f);

static val eval(rs *R, const expr *e, frame *f) {
    if (++R->edepth > J_MAX_EVAL_DEPTH) FAIL(R, "template recursion too deep");
    val v = eval_(R, e, f);
    R->edepth--;
    return v;
}

static val eval_(rs *R, const expr *e, frame *f) {
    step(R);
    switch (e->k) {
    case E_STR: return vstr(e->s, e->n);
    case E_INT: return vint(e->i);
    case E_FLOAT: return vfloat(e->f);
    case E_BOOL: return vbool((int)e->i);
    case E_NONE: return vnone();
    case E_BODY: return R->body;
    case E_NAME: return lookup(R, f, e->s, e->n);
    case E_LIST:
    case E_TUPLE: {
        list *l = list_new(R, e->nargs);
        l->tuple = e->k == E_TUPLE;
        for (size_t i = 0; i < e->nargs; i++) list_push(R, l, eval(R, e->args[i].e, f));
        return vlist(l);
    }
    case E_DICT: {
        dict *d = dict_new(R);
        for (size_t i = 0; i + 1 < e->nargs; i += 2) {
            val k = eval(R, e->args[i].e, f);
            if (k.t != V_STR) FAIL(R, "line %d: unsupported construct: dict key of type %s (only strings)", e->line, type_name(k));
            dict_set(R, d, k, eval(R, e->args[i + 1].e, f));
        }
        return vdict(d);
    }
    case E_ATTR: return get_attr(R, eval(R, e->a, f), e->s, e->n);
    case E_ITEM: return get_item(R, eval(R, e->a, f), eval(R, e->b, f));
    case E_SLICE: {
        val o = eval(R, e->a, f);
        val a = e->b ? eval(R, e->b, f) : vnone(), b = e->c ? eval(R, e->c, f) : vnone();
        val st = e->nargs ? eval(R, e->args[0].e, f) : vnone();
        return do_slice(R, o, a, b, st);
    }
    case E_CALL: {
        val fn = eval(R, e->a, f);
        callargs c = eval_args(R, e, f);
        return call_value(R, fn, &c, e->line);
    }
    case E_FILTER: {
        val v = eval(R, e->a, f);
        callargs c = eval_args(R, e, f);
        return apply_filter(R, e->fn, v, &c, e->line);
    }
    case E_TEST: {
        val v = eval(R, e->a, f);
        callargs c = eval_args(R, e, f);
        int r = run_test(R, e->fn, v, &c);
        return vbool(e->neg ? !r : r);
    }
    case E_NOT: return vbool(!truthy(eval(R, e->a, f)));
    case E_NEG:
    case E_POS: {
        val v = eval(R, e->a, f);
        if (v.t == V_UNDEF) undef_fail(R, v);
        if (!is_num(v)) FAIL(R, "bad operand type for unary %c: '%s'", e->k == E_NEG ? '-' : '+', type_name(v));
        if (e->k == E_POS) return v.t == V_BOOL ? vint(v.u.i) : v;
        if (v.t == V_FLOAT) return vfloat(-v.u.f);
        if (v.u.i == INT64_MIN) FAIL(R, "integer overflow");
        return vint(-v.u.i);
    }
    case E_BIN: return arith(R, e->op, eval(R, e->a, f), eval(R, e->b, f));
    case E_CONCAT: {
        sbuf b = {0};
        to_str(R, &b, eval(R, e->a, f), 0);
        to_str(R, &b, eval(R, e->b, f), 0);
        return vsb(&b);
    }
    case E_AND: {
        val a = eval(R, e->a, f);
        return truthy(a) ? eval(R, e->b, f) : a;
    }
    case E_OR: {
        val a = eval(R, e->a, f);
        return truthy(a) ? a : eval(R, e->b, f);
    }
    case E_COND:
        if (truthy(eval(R, e->b, f))) return eval(R, e->a, f);
        return e->c ? eval(R, e->c, f) : vundef(NULL, 0);
    case E_CMP: {
        val l = eval(R, e->a, f);
        for (size_t i = 0; i < e->nargs; i++) {
            val r = eval(R, e->args[i].e, f);
            int ok;
            switch (e->ops[i]) {
            case CMP_EQ: ok = val_eq(R, l, r, 0); break;
            case CMP_NE: ok = !val_eq(R, l, r, 0); break;
            case CMP_LT: ok = val_cmp(R, l, r, 0) < 0; break;
            case CMP_LE: ok = val_cmp(R, l, r, 0) <= 0; break;
            case CMP_GT: ok = val_cmp(R, l, r, 0) > 0; break;
            case CMP_GE: ok = val_cmp(R, l, r, 0) >= 0; break;
            case CMP_IN: ok = contains(R, r, l); break;
            default: ok = !contains(R, r, l); break;
            }
            if (!ok) return vbool(0);
            l = r;
        }
        return vbool(1);
    }
    }
    return vnone();
}

static void emit(rs *R, const char *s, size_t n) { sb_put(&R->a, R->out, s, n); }

static void assign_targets(rs *R, frame *f, const stmt *s, val v) {
    if (s->nnames == 1) {
        dict_set(R, f->vars, vstr(s->names[0], s->nlens[0]), v);
        return;
    }
    list *l = iter_list(R, v);
    if (l->n != s->nnames)
        FAIL(R, "line %d: cannot unpack %zu values into %zu names", s->line, l->n, s->nnames);
    for (size_t i = 0; i < s->nnames; i++) dict_set(R, f->vars, vstr(s->names[i], s->nlens[i]), l->v[i]);
}

static void exec_for(rs *R, const stmt *s, frame *f) {
    list *items = iter_list(R, eval(R, s->e, f));
    if (s->cond) {
        /* the loop filter sees each item; loop.* counts only the kept ones */
        list *kept = list_new(R, 0);
        frame *fr = aalloc(&R->a, sizeof *fr);
        fr->parent = f;
        fr->vars = dict_new(R);
        for (size_t i = 0; i < items->n; i++) {
            fr->vars->n = 0;
            assign_targets(R, fr, s, items->v[i]);
            if (truthy(eval(R, s->cond, fr))) list_push(R, kept, items->v[i]);
        }
        items = kept;
    } /* lists are never modified after they are built: no snapshot needed */
    if (!items->n) {
        exec_body(R, s->orelse, f);
        return;
    }
    loopst *lp = azalloc(&R->a, sizeof *lp);
    lp->items = items;
    /* a fresh scope per iteration is jinja2's rule; one frame emptied each
     * iteration gives it without an allocation per item (a macro defined
     * inside the loop body sees the current iteration's variables) */
    frame *fr = aalloc(&R->a, sizeof *fr);
    fr->parent = f;
    fr->vars = dict_new(R);
    for (size_t i = 0; i < items->n; i++) {
        step(R);
        lp->i = i;
        fr->vars->n = 0;
        val lv = {V_LOOP, {0}, 0};
        lv.u.lp = lp;
        dict_set(R, fr->vars, vstr("loop", 4), lv);
        assign_targets(R, fr, s, items->v[i]);
        exec_body(R, s->body, fr);
        if (R->brk == 1) {
            R->brk = 0;
            break;
        }
        R->brk = 0;
    }
}

static void exec_body_(rs *R, const stmt *s, frame *f);

static void exec_body(rs *R, const stmt *s, frame *f) {
    if (++R->edepth > J_MAX_EVAL_DEPTH) FAIL(R, "template recursion too deep");
    exec_body_(R, s, f);
    R->edepth--;
}

static void exec_body_(rs *R, const stmt *s, frame *f) {
    for (; s && !R->brk; s = s->next) {
        step(R);
        switch (s->k) {
        case S_TEXT: emit(R, s->s, s->n); break;
        case S_OUT: to_str(R, R->out, eval(R, s->e, f), 0); break;
        case S_IF:
            if (truthy(eval(R, s->cond, f))) exec_body(R, s->body, f);
            else exec_body(R, s->orelse, f);
            break;
        case S_FOR: exec_for(R, s, f); break;
        case S_SET:
            if (s->attr) {
                val ns = lookup(R, f, s->s, s->n);
                if (ns.t != V_NS) FAIL(R, "line %d: cannot assign attribute on non-namespace object", s->line);
                if (s->attr[0] == '_') FAIL(R, "line %d: cannot store underscore-prefixed attributes on a namespace", s->line);
                dict_set(R, ns.u.d, vstr(s->attr, s->attrn), eval(R, s->e, f));
            } else {
                assign_targets(R, f, s, eval(R, s->e, f));
            }
            break;
        case S_SETBLOCK: {
            sbuf out = {0}, *saved = R->out;
            R->out = &out;
            exec_body(R, s->body, f);
            R->out = saved;
            val v = vsb(&out);
            if (s->e) {
                val prev = R->body;
                R->body = v;
                v = eval(R, s->e, f);
                R->body = prev;
            }
            assign_targets(R, f, s, v);
            break;
        }
        case S_BREAK: R->brk = 1; return;
        case S_CONTINUE: R->brk = 2; return;
        case S_MACRO: {
            val m = {V_MACRO, {0}, 0};
            m.u.m = aalloc(&R->a, sizeof *m.u.m);
            m.u.m->m = s;
            m.u.m->f = f;
            dict_set(R, f->vars, vstr(s->s, s->n), m);
            break;
        }
        case S_BLOCK: exec_body(R, s->body, f); break;
        case S_FILTER: {
            sbuf out = {0}, *saved = R->out;
            R->out = &out;
            exec_body(R, s->body, f);
            R->out = saved;
            val prev = R->body;
            R->body = vsb(&out);
            val v = eval(R, s->e, f);
            R->body = prev;
            to_str(R, R->out, v, 0);
            break;
        }
        case S_CALL: {
            val cv = {V_MACRO, {0}, 0};
            cv.u.m = aalloc(&R->a, sizeof *cv.u.m);
            cv.u.m->m = s;
            cv.u.m->f = f;
            val fn = eval(R, s->e->a, f);
            callargs c = eval_args(R, s->e, f);
            arg *kw = aalloc(&R->a, (c.nkw + 1) * sizeof *kw);
            val *kwv = aalloc(&R->a, (c.nkw + 1) * sizeof *kwv);
            if (c.nkw) memcpy(kw, c.kw, c.nkw * sizeof *kw), memcpy(kwv, c.kwv, c.nkw * sizeof *kwv);
            kw[c.nkw] = (arg){"caller", 6, NULL};
            kwv[c.nkw] = cv;
            c.kw = kw;
            c.kwv = kwv;
            c.nkw++;
            to_str(R, R->out, call_value(R, fn, &c, s->line), 0);
            break;
        }
        }
    }
}

/* ------------------------------------------------------------------ */
/* Public API: render */

int tok_template_render(const tok_template *t, const char *context_json, size_t context_len, char **out,
                        size_t *out_len, char *err, size_t errlen) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !out || (!context_json && context_len))
        return jerr(err, errlen, TOK_EINVAL, "tok_template_render: bad arguments");
    json_t *volatile ctx = NULL;
    if (context_len) {
        json_error_t je;
        ctx = json_loadb(context_json, context_len, JSON_ALLOW_NUL, &je);
        if (!ctx) return jerr(err, errlen, TOK_EINVAL, "context JSON: %s (line %d)", je.text, je.line);
        if (!json_is_object(ctx)) {
            json_decref(ctx);
            return jerr(err, errlen, TOK_EINVAL, "context JSON must be an object");
        }
    }
    rs *R = calloc(1, sizeof *R);
    if (!R) {
        json_decref(ctx);
        return jerr(err, errlen, TOK_ENOMEM, "out of memory");
    }
    jmp_buf jb;
    R->a.jb = &jb;
    R->a.err = err;
    R->a.errlen = errlen;
    if (setjmp(jb)) {
        json_decref(ctx);
        arena_free(&R->a);
        free(R);
        return TOK_EINVAL;
    }
    frame *root = aalloc(&R->a, sizeof *root);
    root->parent = NULL;
    root->vars = ctx ? from_json(R, ctx, 0).u.d : dict_new(R);
    json_decref(ctx);
    ctx = NULL;
    R->root = root;
    sbuf o = {0};
    R->out = &o;
    exec_body(R, t->body, root);
    char *res = malloc(o.n + 1);
    if (!res) FAIL(R, "out of memory");
    if (o.n) memcpy(res, o.p, o.n);
    res[o.n] = 0;
    *out = res;
    if (out_len) *out_len = o.n;
    arena_free(&R->a);
    free(R);
    return TOK_OK;
}
