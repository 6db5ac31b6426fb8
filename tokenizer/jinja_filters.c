/*
 * Jinja filters, tests and str/dict methods, run with jinja2's argument
 * rules, keeping Markup strings Markup where markupsafe does. A filter is a
 * function and a row of FILTERS (its name, resolved to an id when the
 * template compiles); tests and methods are ids the parser resolved.
 */
#include "tokenizer/jinja_internal.h"

static val call_method_(rs *R, method *m, const callargs *c);

/* Attribute lookup used by selectattr/map/join(attribute=): dotted paths,
 * integer parts index lists (jinja2's make_attrgetter). */
static val attr_path(rs *R, val v, val path) {
    if (path.t == V_INT) return jinja_get_item(R, v, path);
    jinja_need_str(R, path, "attribute");
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
        v = isint ? jinja_get_item(R, v, vint(iv)) : jinja_get_item(R, v, vstr(p, n));
        if (!dot) return v;
        p = dot + 1;
    }
}

/* select/reject/selectattr/rejectattr */
static val filter_select(rs *R, val seq, const callargs *c, int attr, int want) {
    list *items = jinja_iter_list(R, seq), *out = list_new(R, 0);
    size_t first = attr ? 1 : 0;
    if (attr && c->npos < 1) FAIL(R, "selectattr/rejectattr need an attribute");
    int tfn = -1;
    if (c->npos > first) {
        val tn = jinja_need_str(R, c->pos[first], "select test");
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
        int ok = tfn < 0 ? jinja_truthy(x) : jinja_run_test(R, tfn, x, &tc);
        if (ok == want) list_push(R, out, items->v[i]);
    }
    out->kind = LK_GEN;
    return vlist(out);
}

static val filter_map(rs *R, val seq, const callargs *c) {
    list *items = jinja_iter_list(R, seq), *out = list_new(R, items->n);
    val attr = jinja_param(R, c, 99, "attribute", vundef(NULL, 0));
    if (attr.t != V_UNDEF) {
        val dflt = jinja_param(R, c, 99, "default", vundef(NULL, 0));
        for (size_t i = 0; i < items->n; i++) {
            step(R);
            val x = attr_path(R, items->v[i], attr);
            list_push(R, out, x.t == V_UNDEF && dflt.t != V_UNDEF ? dflt : x);
        }
        out->kind = LK_GEN;
        return vlist(out);
    }
    if (c->npos < 1) FAIL(R, "map: needs a filter name or attribute=");
    val fnm = jinja_need_str(R, c->pos[0], "map");
    int f = jinja_filter_id(fnm.u.s.p, fnm.u.s.n);
    if (f < 0) FAIL(R, "no filter named '%.*s'", (int)(fnm.u.s.n > 60 ? 60 : fnm.u.s.n), fnm.u.s.p);
    callargs fc = *c;
    fc.pos++;
    fc.npos--;
    for (size_t i = 0; i < items->n; i++) step(R), list_push(R, out, jinja_apply_filter(R, f, items->v[i], &fc));
    out->kind = LK_GEN;
    return vlist(out);
}

static val sort_key(rs *R, val v, int ci) { return ci && v.t == V_STR ? jinja_map_case(R, v, CASE_LOWER) : v; }

/* Stable merge sort (Python's sort is stable). */
static void msort(rs *R, val *a, val *keys, size_t n, val *tmp, val *tmpk, int reverse) {
    if (n < 2) return;
    size_t m = n / 2;
    msort(R, a, keys, m, tmp, tmpk, reverse);
    msort(R, a + m, keys + m, n - m, tmp, tmpk, reverse);
    size_t i = 0, j = m, k = 0;
    while (i < m && j < n) {
        step(R);
        int c = jinja_val_cmp(R, keys[j], keys[i], 0);
        int take_right = reverse ? c > 0 : c < 0;
        if (take_right) tmp[k] = a[j], tmpk[k++] = keys[j++];
        else tmp[k] = a[i], tmpk[k++] = keys[i++];
    }
    while (i < m) tmp[k] = a[i], tmpk[k++] = keys[i++];
    while (j < n) tmp[k] = a[j], tmpk[k++] = keys[j++];
    memcpy(a, tmp, n * sizeof *a);
    memcpy(keys, tmpk, n * sizeof *keys);
}

static val f_trim(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"chars", NULL};
    jinja_check_args(R, c, 1, nm, "trim");
    return jinja_strip(R, jinja_str_of(R, v), jinja_param(R, c, 0, "chars", vnone()), 1, 1);
}

static val f_tojson(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    jinja_check_args(R, c, 4, nm, "tojson");
    val ea = jinja_param(R, c, 0, "ensure_ascii", vbool(0)), ind = jinja_param(R, c, 1, "indent", vnone()),
        sep = jinja_param(R, c, 2, "separators", vnone()), sk = jinja_param(R, c, 3, "sort_keys", vbool(0));
    if (jinja_truthy(ea)) FAIL(R, "unsupported construct: tojson(ensure_ascii=True)");
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
    o.sort_keys = jinja_truthy(sk);
    sbuf b = {0};
    jinja_to_json(R, &b, v, &o, 0);
    return vsb(&b);
}

static val f_length(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "length");
    return vint(jinja_length_of(R, v));
}

/* upper, lower, capitalize, title: str(value) case-mapped, no arguments. */
static val case_filter(rs *R, val v, const callargs *c, const char *name, casemode m) {
    jinja_check_args(R, c, 0, NULL, name);
    return jinja_map_case(R, jinja_str_of(R, v), m);
}
static val f_upper(rs *R, val v, const callargs *c) { return case_filter(R, v, c, "upper", CASE_UPPER); }
static val f_lower(rs *R, val v, const callargs *c) { return case_filter(R, v, c, "lower", CASE_LOWER); }
static val f_capitalize(rs *R, val v, const callargs *c) { return case_filter(R, v, c, "capitalize", CASE_CAPITALIZE); }
static val f_title(rs *R, val v, const callargs *c) { return case_filter(R, v, c, "title", CASE_TITLE_JINJA); }

static val f_replace(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"old", "new", "count", NULL};
    jinja_check_args(R, c, 3, nm, "replace");
    val o = jinja_str_of(R, jinja_param(R, c, 0, "old", vundef(NULL, 0))), n = jinja_str_of(R, jinja_param(R, c, 1, "new", vundef(NULL, 0)));
    val cnt = jinja_param(R, c, 2, "count", vnone());
    return jinja_str_replace(R, jinja_str_of(R, v), o, n, cnt.t == V_NONE ? -1 : jinja_need_int(R, cnt, "replace"));
}

static val f_join(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"d", "attribute", NULL};
    jinja_check_args(R, c, 2, nm, "join");
    val d = jinja_str_of(R, jinja_param(R, c, 0, "d", vstr("", 0))), at = jinja_param(R, c, 1, "attribute", vnone());
    list *l = jinja_iter_list(R, v);
    sbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i) sb_put(&R->a, &b, d.u.s.p, d.u.s.n);
        jinja_to_str(R, &b, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at), 0);
    }
    return vsb(&b);
}

static val f_first(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "first");
    list *l = jinja_iter_list(R, v);
    return l->n ? l->v[0] : vundef(NULL, 0);
}

static val f_last(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "last");
    if ((v.t != V_LIST && v.t != V_STR && v.t != V_DICT) || (v.t == V_LIST && v.u.l->kind == LK_GEN))
        FAIL(R, "last: '%s' object is not reversible", jinja_type_name(v));
    list *l = jinja_iter_list(R, v);
    return l->n ? l->v[l->n - 1] : vundef(NULL, 0);
}

static val f_default(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"default_value", "boolean", NULL};
    jinja_check_args(R, c, 2, nm, "default");
    val d = jinja_param(R, c, 0, "default_value", vstr("", 0)), b = jinja_param(R, c, 1, "boolean", vbool(0));
    if (v.t == V_UNDEF || (jinja_truthy(b) && !jinja_truthy(v))) return d;
    return v;
}

static val f_string(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "string");
    return jinja_str_of(R, v);
}

static val f_int(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"default", "base", NULL};
    jinja_check_args(R, c, 2, nm, "int");
    return jinja_to_int_val(R, v, jinja_param(R, c, 0, "default", vint(0)), jinja_need_int(R, jinja_param(R, c, 1, "base", vint(10)), "int"));
}

static val f_float(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"default", NULL};
    jinja_check_args(R, c, 1, nm, "float");
    return jinja_to_float_val(R, v, jinja_param(R, c, 0, "default", vfloat(0)));
}

static val f_list(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "list");
    list *l = jinja_iter_list(R, v), *o = list_new(R, l->n);
    for (size_t i = 0; i < l->n; i++) list_push(R, o, l->v[i]);
    return vlist(o);
}

static val f_items(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "items");
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

static val f_selectattr(rs *R, val v, const callargs *c) {
    return filter_select(R, v, c, 1, 1);
}

static val f_rejectattr(rs *R, val v, const callargs *c) {
    return filter_select(R, v, c, 1, 0);
}

static val f_select(rs *R, val v, const callargs *c) {
    return filter_select(R, v, c, 0, 1);
}

static val f_reject(rs *R, val v, const callargs *c) {
    return filter_select(R, v, c, 0, 0);
}

static val f_map(rs *R, val v, const callargs *c) {
    return filter_map(R, v, c);
}

static val f_indent(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"width", "first", "blank", NULL};
    jinja_check_args(R, c, 3, nm, "indent");
    val w = jinja_param(R, c, 0, "width", vint(4));
    int first = jinja_truthy(jinja_param(R, c, 1, "first", vbool(0))), blank = jinja_truthy(jinja_param(R, c, 2, "blank", vbool(0)));
    sbuf ind = {0};
    if (w.t == V_STR) sb_put(&R->a, &ind, w.u.s.p, w.u.s.n);
    else {
        int64_t k = jinja_need_int(R, w, "indent");
        if (k > 4096) FAIL(R, "indent: width too large");
        for (int64_t i = 0; i < k; i++) sb_puts(&R->a, &ind, " ");
    }
    if (v.t == V_UNDEF) jinja_undef_fail(R, v);
    if (v.t != V_STR) FAIL(R, "indent: unsupported operand type(s) for +=: '%s' and 'str'", jinja_type_name(v));
    val s = v;
    sbuf tmp = {0};
    sb_put(&R->a, &tmp, s.u.s.p, s.u.s.n);
    sb_puts(&R->a, &tmp, "\n");
    list *ls = jinja_splitlines(R, tmp.p, tmp.n);
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

static val f_safe(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "safe");
    val s = jinja_str_of(R, v);
    s.mk = 1;
    return s;
}

static val f_abs(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "abs");
    if (v.t == V_FLOAT) return vfloat(fabs(v.u.f));
    if (v.t == V_INT || v.t == V_BOOL) {
        if (v.u.i == INT64_MIN) FAIL(R, "integer overflow");
        return vint(v.u.i < 0 ? -v.u.i : v.u.i);
    }
    FAIL(R, "bad operand type for abs(): '%s'", jinja_type_name(v));
    return vnone(); /* not reached: FAIL does not return */
}

static val f_round(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"precision", "method", NULL};
    jinja_check_args(R, c, 2, nm, "round");
    return jinja_do_round(R, v, jinja_need_int(R, jinja_param(R, c, 0, "precision", vint(0)), "round"), jinja_param(R, c, 1, "method", vstrz("common")));
}

static val f_unique(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"case_sensitive", "attribute", NULL};
    jinja_check_args(R, c, 2, nm, "unique");
    int cs = jinja_truthy(jinja_param(R, c, 0, "case_sensitive", vbool(0)));
    val at = jinja_param(R, c, 1, "attribute", vnone());
    list *l = jinja_iter_list(R, v), *o = list_new(R, 0), *seen = list_new(R, 0);
    for (size_t i = 0; i < l->n; i++) {
        val k = sort_key(R, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at), !cs);
        if (k.t == V_LIST || k.t == V_DICT) FAIL(R, "unhashable type: '%s'", jinja_type_name(k));
        int dup = 0;
        for (size_t j = 0; j < seen->n && !dup; j++) step(R), dup = jinja_val_eq(R, seen->v[j], k, 0);
        if (!dup) list_push(R, seen, k), list_push(R, o, l->v[i]);
    }
    o->kind = LK_GEN;
    return vlist(o);
}

static val f_reverse(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "reverse");
    if (v.t == V_STR) {
        list *l = jinja_iter_list(R, v);
        sbuf b = {0};
        for (size_t i = l->n; i-- > 0;) sb_put(&R->a, &b, l->v[i].u.s.p, l->v[i].u.s.n);
        return vsb(&b);
    }
    /* reversed(x) is an iterator; a generator is listed then reversed */
    int was_gen = v.t == V_LIST && v.u.l->kind == LK_GEN;
    if (v.t == V_DICT || (v.t == V_LIST && v.u.l->kind >= LK_ITEMS && v.u.l->kind <= LK_VALUES)) was_gen = 0;
    list *l = jinja_iter_list(R, v), *o = list_new(R, l->n);
    for (size_t i = l->n; i-- > 0;) list_push(R, o, l->v[i]);
    if (!was_gen) o->kind = LK_GEN;
    return vlist(o);
}

static val f_escape(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "escape");
    return jinja_markup_escape(R, v);
}

static val f_format(rs *R, val v, const callargs *c) {
    /* jinja2: soft_str(value) % (kwargs or args) */
    if (c->npos && c->nkw) FAIL(R, "can't handle positional and keyword arguments at the same time");
    val fmtv = jinja_str_of(R, v), args;
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
    return jinja_py_percent(R, fmtv, args);
}

static val f_sum(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"attribute", "start", NULL};
    jinja_check_args(R, c, 2, nm, "sum");
    val at = jinja_param(R, c, 0, "attribute", vnone()), acc = jinja_param(R, c, 1, "start", vint(0));
    list *l = jinja_iter_list(R, v);
    for (size_t i = 0; i < l->n; i++) acc = jinja_arith(R, OP_ADD, acc, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at));
    return acc;
}

/* min and max: the first extreme item, as Python's min()/max(). */
static val min_max(rs *R, val v, const callargs *c, int want_max) {
    static const char *const nm[] = {"case_sensitive", "attribute", NULL};
    jinja_check_args(R, c, 2, nm, "min/max");
    int cs = jinja_truthy(jinja_param(R, c, 0, "case_sensitive", vbool(0)));
    val at = jinja_param(R, c, 1, "attribute", vnone());
    list *l = jinja_iter_list(R, v);
    if (!l->n) return vundef(NULL, 0);
    size_t best = 0;
    val bk = sort_key(R, at.t == V_NONE ? l->v[0] : attr_path(R, l->v[0], at), !cs);
    for (size_t i = 1; i < l->n; i++) {
        val k = sort_key(R, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at), !cs);
        int cmp = jinja_val_cmp(R, k, bk, 0);
        if (want_max ? cmp > 0 : cmp < 0) best = i, bk = k;
    }
    return l->v[best];
}

static val f_min(rs *R, val v, const callargs *c) { return min_max(R, v, c, 0); }

static val f_max(rs *R, val v, const callargs *c) { return min_max(R, v, c, 1); }

static val f_sort(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"reverse", "case_sensitive", "attribute", NULL};
    jinja_check_args(R, c, 3, nm, "sort");
    int rev = jinja_truthy(jinja_param(R, c, 0, "reverse", vbool(0))), cs = jinja_truthy(jinja_param(R, c, 1, "case_sensitive", vbool(0)));
    val at = jinja_param(R, c, 2, "attribute", vnone());
    list *l = jinja_iter_list(R, v), *o = list_new(R, l->n + 1);
    val *keys = aalloc(&R->a, (l->n + 1) * sizeof *keys), *tmp = aalloc(&R->a, (l->n + 1) * sizeof *tmp),
        *tmpk = aalloc(&R->a, (l->n + 1) * sizeof *tmpk);
    for (size_t i = 0; i < l->n; i++) {
        list_push(R, o, l->v[i]);
        keys[i] = sort_key(R, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at), !cs);
    }
    msort(R, o->v, keys, o->n, tmp, tmpk, rev);
    return vlist(o);
}

static val f_dictsort(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"case_sensitive", "by", "reverse", NULL};
    jinja_check_args(R, c, 3, nm, "dictsort");
    if (v.t != V_DICT) FAIL(R, "dictsort: expected a mapping");
    int cs = jinja_truthy(jinja_param(R, c, 0, "case_sensitive", vbool(0)));
    val by = jinja_param(R, c, 1, "by", vstrz("key"));
    int rev = jinja_truthy(jinja_param(R, c, 2, "reverse", vbool(0)));
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

static val f_wordcount(rs *R, val v, const callargs *c) {
    jinja_check_args(R, c, 0, NULL, "wordcount");
    /* jinja2: len(re.findall(r"\w+", s)) */
    val s = jinja_str_of(R, v);
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

static val f_center(rs *R, val v, const callargs *c) {
    static const char *const nm[] = {"width", NULL};
    jinja_check_args(R, c, 1, nm, "center");
    int64_t w = jinja_need_int(R, jinja_param(R, c, 0, "width", vint(80)), "center");
    val s = jinja_str_of(R, v);
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

/* One row per filter: the name templates use (the parser resolves it to
 * the row's id), the function, and whether a Markup input stays Markup
 * (markupsafe's str methods keep it; the rest return plain str). */
typedef val (*filter_fn)(rs *R, val v, const callargs *c);
static const struct {
    const char *name;
    filter_fn apply;
    int keeps_markup;
} FILTERS[F_N] = {
    [F_TRIM] = {"trim", f_trim, 1},
    [F_TOJSON] = {"tojson", f_tojson, 0},
    [F_LENGTH] = {"length", f_length, 0},
    [F_COUNT] = {"count", f_length, 0},
    [F_UPPER] = {"upper", f_upper, 1},
    [F_LOWER] = {"lower", f_lower, 1},
    [F_CAPITALIZE] = {"capitalize", f_capitalize, 1},
    [F_TITLE] = {"title", f_title, 0},
    [F_REPLACE] = {"replace", f_replace, 0},
    [F_JOIN] = {"join", f_join, 0},
    [F_FIRST] = {"first", f_first, 0},
    [F_LAST] = {"last", f_last, 0},
    [F_DEFAULT] = {"default", f_default, 0},
    [F_D] = {"d", f_default, 0},
    [F_STRING] = {"string", f_string, 1},
    [F_INT] = {"int", f_int, 0},
    [F_FLOAT] = {"float", f_float, 0},
    [F_LIST] = {"list", f_list, 0},
    [F_ITEMS] = {"items", f_items, 0},
    [F_SELECTATTR] = {"selectattr", f_selectattr, 0},
    [F_REJECTATTR] = {"rejectattr", f_rejectattr, 0},
    [F_SELECT] = {"select", f_select, 0},
    [F_REJECT] = {"reject", f_reject, 0},
    [F_MAP] = {"map", f_map, 0},
    [F_INDENT] = {"indent", f_indent, 1},
    [F_SAFE] = {"safe", f_safe, 0},
    [F_ABS] = {"abs", f_abs, 0},
    [F_ROUND] = {"round", f_round, 0},
    [F_UNIQUE] = {"unique", f_unique, 0},
    [F_REVERSE] = {"reverse", f_reverse, 1},
    [F_ESCAPE] = {"escape", f_escape, 0},
    [F_E] = {"e", f_escape, 0},
    [F_SUM] = {"sum", f_sum, 0},
    [F_MIN] = {"min", f_min, 0},
    [F_MAX] = {"max", f_max, 0},
    [F_SORT] = {"sort", f_sort, 0},
    [F_DICTSORT] = {"dictsort", f_dictsort, 0},
    [F_WORDCOUNT] = {"wordcount", f_wordcount, 0},
    [F_CENTER] = {"center", f_center, 1},
    [F_FORMAT] = {"format", f_format, 0},
};

/* The tests' names, by T_* id (the parser resolves names to ids). */
const char *const jinja_tests[T_N] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer",
    "float", "boolean", "true", "false", "odd", "even", "divisibleby", "eq", "equalto", "==", "ne",
    "!=", "lt", "<", "lessthan", "gt", ">", "greaterthan", "le", "<=", "ge", ">=", "in",
    "sameas", "callable", "lower", "upper",
};

int jinja_filter_id(const char *s, size_t n) {
    for (int i = 0; i < F_N; i++)
        if (FILTERS[i].name && strlen(FILTERS[i].name) == n && !memcmp(FILTERS[i].name, s, n)) return i;
    return -1;
}

val jinja_apply_filter(rs *R, int fn, val v, const callargs *c) {
    step(R);
    if (fn < 0 || fn >= F_N || !FILTERS[fn].apply)
        FAIL(R, "internal: a compiled filter id without a case"); /* unknown filters fail at compile */
    val r = FILTERS[fn].apply(R, v, c);
    if (v.t == V_STR && v.mk && r.t == V_STR && FILTERS[fn].keeps_markup) r.mk = 1;
    return r;
}

int jinja_run_test(rs *R, int fn, val v, const callargs *c) {
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
        if (v.t == V_UNDEF) jinja_undef_fail(R, v);
        if (v.t == V_FLOAT) {
            double m = fmod(v.u.f, 2);
            if (m < 0) m += 2;
            return fn == T_ODD ? m == 1 : m == 0;
        }
        int64_t x = jinja_need_int(R, v, jinja_tests[fn]);
        return fn == T_ODD ? (x % 2 != 0) : (x % 2 == 0);
    }
    case T_DIVISIBLEBY: {
        val m = jinja_arith(R, OP_MOD, v, a0);
        return num_f(m) == 0;
    }
    case T_EQ: case T_EQUALTO: case T_EQ2: return jinja_val_eq(R, v, a0, 0);
    case T_NE: case T_NE2: return !jinja_val_eq(R, v, a0, 0);
    case T_LT: case T_LT2: case T_LESSTHAN: return jinja_val_cmp(R, v, a0, 0) < 0;
    case T_GT: case T_GT2: case T_GREATERTHAN: return jinja_val_cmp(R, v, a0, 0) > 0;
    case T_LE: case T_LE2: return jinja_val_cmp(R, v, a0, 0) <= 0;
    case T_GE: case T_GE2: return jinja_val_cmp(R, v, a0, 0) >= 0;
    case T_IN: return jinja_contains(R, a0, v);
    case T_SAMEAS:
        if (v.t != a0.t) return 0;
        if (v.t == V_NONE || v.t == V_UNDEF) return v.t == V_NONE;
        if (v.t == V_BOOL) return v.u.i == a0.u.i;
        if (v.t == V_INT) return v.u.i == a0.u.i && v.u.i >= -5 && v.u.i <= 256; /* CPython's small ints */
        if (v.t == V_LIST) return v.u.l == a0.u.l;
        if (v.t == V_DICT || v.t == V_NS) return v.u.d == a0.u.d;
        if (v.t == V_STR) return v.u.s.p == a0.u.s.p && v.u.s.n == a0.u.s.n;
        return jinja_val_eq(R, v, a0, 0);
    case T_CALLABLE: return v.t == V_MACRO || v.t == V_METHOD || v.t == V_FUNC || v.t == V_UNDEF; /* Undefined has __call__ */
    case T_LOWER:
    case T_UPPER: {
        v = jinja_str_of(R, v); /* str(value).islower() */
        val m = jinja_map_case(R, v, fn == T_LOWER ? CASE_LOWER : CASE_UPPER);
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


/* Markup's str methods return Markup and escape their string arguments. */
val jinja_call_method(rs *R, method *m, const callargs *c) {
    val s = m->self;
    if (s.t != V_STR || !s.mk) return call_method_(R, m, c);
    callargs c2 = *c;
    if (m->id == M_REPLACE || m->id == M_JOIN) {
        c2.pos = aalloc(&R->a, (c->npos + 1) * sizeof *c2.pos);
        for (size_t i = 0; i < c->npos; i++) {
            val x = c->pos[i];
            if (m->id == M_REPLACE && i < 2 && x.t == V_STR) x = jinja_markup_escape(R, x);
            if (m->id == M_JOIN && i == 0) {
                list *l = jinja_iter_list(R, x), *e = list_new(R, l->n);
                for (size_t k = 0; k < l->n; k++) list_push(R, e, jinja_markup_escape(R, l->v[k]));
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
        jinja_check_args(R, c, 1, NULL, "strip");
        val ch = c->npos ? c->pos[0] : vnone();
        if (ch.t != V_NONE) jinja_need_str(R, ch, "strip");
        return jinja_strip(R, s, ch, m->id != M_RSTRIP, m->id != M_LSTRIP);
    }
    case M_SPLIT: case M_RSPLIT: {
        static const char *const nm[] = {"sep", "maxsplit", NULL};
        jinja_check_args(R, c, 2, nm, "split");
        val sep = jinja_param(R, c, 0, "sep", vnone());
        if (sep.t != V_NONE) jinja_need_str(R, sep, "split");
        return jinja_str_split(R, s, sep, jinja_need_int(R, jinja_param(R, c, 1, "maxsplit", vint(-1)), "split"), m->id == M_RSPLIT);
    }
    case M_STARTSWITH: case M_ENDSWITH: {
        jinja_check_args(R, c, 1, NULL, "startswith");
        if (c->npos != 1) FAIL(R, "startswith/endswith take one argument");
        val a = c->pos[0];
        list *cands;
        if (a.t == V_LIST && a.u.l->tuple) cands = a.u.l;
        else {
            jinja_need_str(R, a, "startswith/endswith");
            cands = list_new(R, 1);
            list_push(R, cands, a);
        }
        for (size_t i = 0; i < cands->n; i++) {
            val x = jinja_need_str(R, cands->v[i], "startswith/endswith");
            if (x.u.s.n > s.u.s.n) continue;
            const char *at = m->id == M_STARTSWITH ? s.u.s.p : s.u.s.p + s.u.s.n - x.u.s.n;
            if (!x.u.s.n || !memcmp(at, x.u.s.p, x.u.s.n)) return vbool(1);
        }
        return vbool(0);
    }
    case M_UPPER: jinja_check_args(R, c, 0, NULL, "upper"); return jinja_map_case(R, s, CASE_UPPER);
    case M_LOWER: jinja_check_args(R, c, 0, NULL, "lower"); return jinja_map_case(R, s, CASE_LOWER);
    case M_TITLE: jinja_check_args(R, c, 0, NULL, "title"); return jinja_map_case(R, s, CASE_TITLE_PY);
    case M_CAPITALIZE: jinja_check_args(R, c, 0, NULL, "capitalize"); return jinja_map_case(R, s, CASE_CAPITALIZE);
    case M_REPLACE: {
        jinja_check_args(R, c, 3, NULL, "replace");
        if (c->npos < 2) FAIL(R, "replace takes at least 2 arguments");
        return jinja_str_replace(R, s, jinja_need_str(R, c->pos[0], "replace"), jinja_need_str(R, c->pos[1], "replace"),
                           c->npos > 2 ? jinja_need_int(R, c->pos[2], "replace") : -1);
    }
    case M_FIND: case M_COUNT: {
        jinja_check_args(R, c, 1, NULL, "find/count");
        if (c->npos != 1) FAIL(R, "find/count take one argument here");
        val x = jinja_need_str(R, c->pos[0], "find/count");
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
    case M_FORMAT: return jinja_py_format(R, s, c);
    case M_SPLITLINES: jinja_check_args(R, c, 0, NULL, "splitlines"); return vlist(jinja_splitlines(R, s.u.s.p, s.u.s.n));
    case M_JOIN: {
        jinja_check_args(R, c, 1, NULL, "join");
        if (c->npos != 1) FAIL(R, "join takes one argument");
        list *l = jinja_iter_list(R, c->pos[0]);
        sbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) sb_put(&R->a, &b, s.u.s.p, s.u.s.n);
            sb_put(&R->a, &b, jinja_need_str(R, l->v[i], "join").u.s.p, l->v[i].u.s.n);
        }
        return vsb(&b);
    }
    case M_ISDIGIT: case M_ISALPHA: case M_ISSPACE: {
        jinja_check_args(R, c, 0, NULL, "is*");
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
        jinja_check_args(R, c, 0, NULL, "items");
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
        jinja_check_args(R, c, 2, NULL, "get");
        if (c->npos < 1) FAIL(R, "get expected at least 1 argument");
        val k = c->pos[0];
        if (k.t == V_STR) {
            val *x = dict_find(s.u.d, k.u.s.p, k.u.s.n);
            if (x) return *x;
        }
        return c->npos > 1 ? c->pos[1] : vnone();
    }
    case M_CYCLE: {
        jinja_check_args(R, c, 1000000, NULL, "cycle");
        if (!c->npos) FAIL(R, "no items for cycling given");
        return c->pos[s.u.lp->i % c->npos];
    }
    case M_MUTATE: FAIL(R, "access to a mutating method is unsafe in the sandbox (immutable objects)"); break;
    }
    FAIL(R, "unknown method"); /* unreachable: method names are resolved when the template compiles */
    return vnone();
}
