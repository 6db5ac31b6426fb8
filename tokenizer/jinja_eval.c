/*
 * The Jinja evaluator: expressions and statements over the compiled AST.
 * Variables resolve through frames (a macro's frame outlives its call when a
 * `caller` escapes), attribute and item access follow jinja2's sandbox,
 * calls reach the globals (raise_exception, strftime_now, namespace, range,
 * dict), macros and methods, and every step counts against the budget.
 */
#include "tokenizer/jinja_internal.h"

static val eval(rs *R, const expr *e, frame *f);
static val eval_(rs *R, const expr *e, frame *f);
static void exec_body_(rs *R, const stmt *s, frame *f);

enum { G_RAISE, G_STRFTIME, G_NAMESPACE, G_RANGE, G_DICT, G_N };
static const char *const GLOBALS[] = {"raise_exception", "strftime_now", "namespace", "range", "dict"};

static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower",
    "replace", "title", "capitalize", "find", "count", "splitlines", "join", "isdigit", "isalpha",
    "isspace", "format", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};
static const char *const MUTATING[] = {"append", "pop", "update", "insert", "extend", "remove", "clear",
                                        "setdefault", "popitem", "sort", "reverse", NULL};


/* ------------------------------------------------------------------ */
/* Evaluation                                                           */


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
    case V_UNDEF: jinja_undef_fail(R, obj); break;
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
    return jinja_undef_hint(R, obj, "attribute", vstr(name, n));
}

static int64_t norm_index(int64_t i, int64_t len) { return i < 0 ? i + len : i; }

val jinja_get_item(rs *R, val obj, val key) {
    if (obj.t == V_UNDEF) jinja_undef_fail(R, obj);
    if (obj.t == V_DICT || obj.t == V_NS) {
        if (key.t == V_STR) {
            val *x = dict_find(obj.u.d, key.u.s.p, key.u.s.n);
            if (x) return *x;
            if (obj.t == V_DICT) return get_attr(R, obj, key.u.s.p, key.u.s.n);
        }
        return jinja_undef_hint(R, obj, "element", key);
    }
    if ((obj.t == V_LIST || obj.t == V_STR) && (key.t == V_INT || key.t == V_BOOL)) {
        if (obj.t == V_LIST) {
            if (obj.u.l->kind != LK_PLAIN && obj.u.l->kind != LK_RANGE) return vundef(NULL, 0); /* not subscriptable */
            int64_t i = norm_index(key.u.i, (int64_t)obj.u.l->n);
            if (i < 0 || i >= (int64_t)obj.u.l->n) return jinja_undef_hint(R, obj, "element", key);
            return obj.u.l->v[i];
        }
        list *cs = jinja_iter_list(R, obj);
        int64_t i = norm_index(key.u.i, (int64_t)cs->n);
        if (i < 0 || i >= (int64_t)cs->n) return jinja_undef_hint(R, obj, "element", key);
        val ch = cs->v[i];
        ch.mk = obj.mk;
        return ch;
    }
    if (key.t == V_STR) return get_attr(R, obj, key.u.s.p, key.u.s.n);
    return vundef(NULL, 0);
}

/* Python slice semantics on lists and strings. */
static val do_slice(rs *R, val obj, val vs, val ve, val vst) {
    if (obj.t == V_UNDEF) jinja_undef_fail(R, obj);
    list *src = NULL; /* FAIL does not return (clang cannot tell) */
    if (obj.t == V_LIST && obj.u.l->kind != LK_PLAIN && obj.u.l->kind != LK_RANGE) return vundef(NULL, 0);
    if (obj.t == V_LIST) src = obj.u.l;
    else if (obj.t == V_STR) src = jinja_iter_list(R, obj);
    else FAIL(R, "'%s' object is not subscriptable", jinja_type_name(obj));
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


val jinja_arith(rs *R, int op, val a, val b) {
    if (a.t == V_UNDEF) jinja_undef_fail(R, a);
    if (b.t == V_UNDEF) jinja_undef_fail(R, b);
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR && (a.mk || b.mk)) {
        a = jinja_markup_escape(R, a), b = jinja_markup_escape(R, b);
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
        FAIL(R, "unsupported operand type(s): '%s' and '%s'", jinja_type_name(a), jinja_type_name(b));
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST && a.u.l->tuple == b.u.l->tuple) {
        list *l = list_new(R, a.u.l->n + b.u.l->n);
        l->tuple = a.u.l->tuple;
        for (size_t i = 0; i < a.u.l->n; i++) list_push(R, l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) list_push(R, l, b.u.l->v[i]);
        return vlist(l);
    }
    if (op == OP_MOD && a.t == V_STR) return jinja_py_percent(R, a, b);
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
        FAIL(R, "unsupported operand type(s) for %s: '%s' and '%s'", nm[op], jinja_type_name(a), jinja_type_name(b));
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

int jinja_contains(rs *R, val hay, val needle) {
    switch (hay.t) {
    case V_STR:
        if (needle.t != V_STR) FAIL(R, "'in <string>' requires string as left operand, not %s", jinja_type_name(needle));
        if (!needle.u.s.n) return 1;
        return memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
    case V_LIST:
        if (hay.u.l->kind == LK_KEYS && (needle.t == V_LIST || needle.t == V_DICT))
            FAIL(R, "unhashable type: '%s'", jinja_type_name(needle));
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (jinja_val_eq(R, hay.u.l->v[i], needle, 0)) return 1;
        return 0;
    case V_DICT:
    case V_NS:
        if (needle.t == V_LIST || needle.t == V_DICT) FAIL(R, "unhashable type: '%s'", jinja_type_name(needle));
        return needle.t == V_STR && dict_find(hay.u.d, needle.u.s.p, needle.u.s.n) != NULL;
    case V_UNDEF: return 0;
    default: FAIL(R, "argument of type '%s' is not iterable", jinja_type_name(hay)); return 0;
    }
}

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
val jinja_param(rs *R, const callargs *c, size_t i, const char *name, val dflt) {
    if (i < c->npos) return c->pos[i];
    size_t n = strlen(name);
    for (size_t k = 0; k < c->nkw; k++)
        if (c->kw[k].nlen == n && !memcmp(c->kw[k].name, name, n)) return c->kwv[k];
    (void)R;
    return dflt;
}

void jinja_check_args(rs *R, const callargs *c, size_t maxpos, const char *const *names, const char *what) {
    if (c->npos > maxpos) FAIL(R, "%s: too many positional arguments", what);
    for (size_t k = 0; k < c->nkw; k++) {
        int ok = 0;
        for (size_t j = 0; names && names[j]; j++)
            if (strlen(names[j]) == c->kw[k].nlen && !memcmp(names[j], c->kw[k].name, c->kw[k].nlen)) ok = 1;
        if (!ok) FAIL(R, "%s: unexpected keyword argument '%.*s'", what, (int)c->kw[k].nlen, c->kw[k].name);
    }
}

val jinja_need_str(rs *R, val v, const char *what) {
    if (v.t != V_STR) FAIL(R, "%s: expected a string, got %s", what, jinja_type_name(v));
    return v;
}

int64_t jinja_need_int(rs *R, val v, const char *what) {
    if (v.t != V_INT && v.t != V_BOOL) FAIL(R, "%s: expected an integer, got %s", what, jinja_type_name(v));
    return v.u.i;
}

static void do_strftime(rs *R, sbuf *b, val fmtv) {
    jinja_need_str(R, fmtv, "strftime_now");
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
    jinja_exec_body(R, m->body, fp);
    R->out = saved;
    R->brk = saved_brk;
    R->depth--;
    return vsb(&out);
}

static val call_value(rs *R, val fn, const callargs *c, int line) {
    (void)line;
    switch (fn.t) {
    case V_UNDEF: jinja_undef_fail(R, fn); break;
    case V_MACRO: return call_macro(R, fn.u.m, c);
    case V_METHOD: return jinja_call_method(R, fn.u.me, c);
    case V_FUNC:
        switch (fn.u.fn) {
        case G_RAISE: {
            val m = c->npos ? jinja_str_of(R, c->pos[0]) : vstr("", 0);
            FAIL(R, "%.*s", (int)(m.u.s.n > 4000 ? 4000 : m.u.s.n), m.u.s.p);
            break;
        }
        case G_STRFTIME: {
            jinja_check_args(R, c, 1, NULL, "strftime_now");
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
            jinja_check_args(R, c, 3, NULL, "range");
            int64_t a = 0, b = 0, st = 1;
            if (c->npos == 1) b = jinja_need_int(R, c->pos[0], "range");
            else if (c->npos >= 2) {
                a = jinja_need_int(R, c->pos[0], "range"), b = jinja_need_int(R, c->pos[1], "range");
                if (c->npos == 3) st = jinja_need_int(R, c->pos[2], "range");
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
    FAIL(R, "'%s' object is not callable", jinja_type_name(fn));
    return vnone();
}


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
            if (k.t != V_STR) FAIL(R, "line %d: unsupported construct: dict key of type %s (only strings)", e->line, jinja_type_name(k));
            dict_set(R, d, k, eval(R, e->args[i + 1].e, f));
        }
        return vdict(d);
    }
    case E_ATTR: return get_attr(R, eval(R, e->a, f), e->s, e->n);
    case E_ITEM: return jinja_get_item(R, eval(R, e->a, f), eval(R, e->b, f));
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
        return jinja_apply_filter(R, e->fn, v, &c);
    }
    case E_TEST: {
        val v = eval(R, e->a, f);
        callargs c = eval_args(R, e, f);
        int r = jinja_run_test(R, e->fn, v, &c);
        return vbool(e->neg ? !r : r);
    }
    case E_NOT: return vbool(!jinja_truthy(eval(R, e->a, f)));
    case E_NEG:
    case E_POS: {
        val v = eval(R, e->a, f);
        if (v.t == V_UNDEF) jinja_undef_fail(R, v);
        if (!is_num(v)) FAIL(R, "bad operand type for unary %c: '%s'", e->k == E_NEG ? '-' : '+', jinja_type_name(v));
        if (e->k == E_POS) return v.t == V_BOOL ? vint(v.u.i) : v;
        if (v.t == V_FLOAT) return vfloat(-v.u.f);
        if (v.u.i == INT64_MIN) FAIL(R, "integer overflow");
        return vint(-v.u.i);
    }
    case E_BIN: return jinja_arith(R, e->op, eval(R, e->a, f), eval(R, e->b, f));
    case E_CONCAT: {
        sbuf b = {0};
        jinja_to_str(R, &b, eval(R, e->a, f), 0);
        jinja_to_str(R, &b, eval(R, e->b, f), 0);
        return vsb(&b);
    }
    case E_AND: {
        val a = eval(R, e->a, f);
        return jinja_truthy(a) ? eval(R, e->b, f) : a;
    }
    case E_OR: {
        val a = eval(R, e->a, f);
        return jinja_truthy(a) ? a : eval(R, e->b, f);
    }
    case E_COND:
        if (jinja_truthy(eval(R, e->b, f))) return eval(R, e->a, f);
        return e->c ? eval(R, e->c, f) : vundef(NULL, 0);
    case E_CMP: {
        val l = eval(R, e->a, f);
        for (size_t i = 0; i < e->nargs; i++) {
            val r = eval(R, e->args[i].e, f);
            int ok;
            switch (e->ops[i]) {
            case CMP_EQ: ok = jinja_val_eq(R, l, r, 0); break;
            case CMP_NE: ok = !jinja_val_eq(R, l, r, 0); break;
            case CMP_LT: ok = jinja_val_cmp(R, l, r, 0) < 0; break;
            case CMP_LE: ok = jinja_val_cmp(R, l, r, 0) <= 0; break;
            case CMP_GT: ok = jinja_val_cmp(R, l, r, 0) > 0; break;
            case CMP_GE: ok = jinja_val_cmp(R, l, r, 0) >= 0; break;
            case CMP_IN: ok = jinja_contains(R, r, l); break;
            default: ok = !jinja_contains(R, r, l); break;
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
    list *l = jinja_iter_list(R, v);
    if (l->n != s->nnames)
        FAIL(R, "line %d: cannot unpack %zu values into %zu names", s->line, l->n, s->nnames);
    for (size_t i = 0; i < s->nnames; i++) dict_set(R, f->vars, vstr(s->names[i], s->nlens[i]), l->v[i]);
}

static void exec_for(rs *R, const stmt *s, frame *f) {
    list *items = jinja_iter_list(R, eval(R, s->e, f));
    if (s->cond) {
        /* the loop filter sees each item; loop.* counts only the kept ones */
        list *kept = list_new(R, 0);
        frame *fr = aalloc(&R->a, sizeof *fr);
        fr->parent = f;
        fr->vars = dict_new(R);
        for (size_t i = 0; i < items->n; i++) {
            fr->vars->n = 0;
            assign_targets(R, fr, s, items->v[i]);
            if (jinja_truthy(eval(R, s->cond, fr))) list_push(R, kept, items->v[i]);
        }
        items = kept;
    } /* lists are never modified after they are built: no snapshot needed */
    if (!items->n) {
        jinja_exec_body(R, s->orelse, f);
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
        jinja_exec_body(R, s->body, fr);
        if (R->brk == 1) {
            R->brk = 0;
            break;
        }
        R->brk = 0;
    }
}


void jinja_exec_body(rs *R, const stmt *s, frame *f) {
    if (++R->edepth > J_MAX_EVAL_DEPTH) FAIL(R, "template recursion too deep");
    exec_body_(R, s, f);
    R->edepth--;
}

static void exec_body_(rs *R, const stmt *s, frame *f) {
    for (; s && !R->brk; s = s->next) {
        step(R);
        switch (s->k) {
        case S_TEXT: emit(R, s->s, s->n); break;
        case S_OUT: jinja_to_str(R, R->out, eval(R, s->e, f), 0); break;
        case S_IF:
            if (jinja_truthy(eval(R, s->cond, f))) jinja_exec_body(R, s->body, f);
            else jinja_exec_body(R, s->orelse, f);
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
            jinja_exec_body(R, s->body, f);
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
        case S_BLOCK: jinja_exec_body(R, s->body, f); break;
        case S_FILTER: {
            sbuf out = {0}, *saved = R->out;
            R->out = &out;
            jinja_exec_body(R, s->body, f);
            R->out = saved;
            val prev = R->body;
            R->body = vsb(&out);
            val v = eval(R, s->e, f);
            R->body = prev;
            jinja_to_str(R, R->out, v, 0);
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
            jinja_to_str(R, R->out, call_value(R, fn, &c, s->line), 0);
            break;
        }
        }
    }
}
