/*
 * Jinja filters, tests and str/dict methods. Their names are resolved to ids
 * when the template compiles (jinja_parse.c); here they run with jinja2's
 * argument rules, keeping Markup strings Markup where markupsafe does.
 */
#include "tokenizer/jinja_internal.h"

static val apply_filter_(rs *R, int fn, val v, const callargs *c, int line);
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


static val filter_map(rs *R, val seq, const callargs *c, int line) {
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
    int f = lookup_name(jinja_filters, F_N, fnm.u.s.p, fnm.u.s.n);
    if (f < 0) FAIL(R, "no filter named '%.*s'", (int)(fnm.u.s.n > 60 ? 60 : fnm.u.s.n), fnm.u.s.p);
    callargs fc = *c;
    fc.pos++;
    fc.npos--;
    for (size_t i = 0; i < items->n; i++) step(R), list_push(R, out, jinja_apply_filter(R, f, items->v[i], &fc, line));
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

val jinja_apply_filter(rs *R, int fn, val v, const callargs *c, int line) {
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
        jinja_check_args(R, c, 1, nm, "trim");
        return jinja_strip(R, jinja_str_of(R, v), jinja_param(R, c, 0, "chars", vnone()), 1, 1);
    }
    case F_TOJSON: {
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
    case F_LENGTH:
    case F_COUNT: jinja_check_args(R, c, 0, NULL, "length"); return vint(jinja_length_of(R, v));
    case F_UPPER: jinja_check_args(R, c, 0, NULL, "upper"); return jinja_map_case(R, jinja_str_of(R, v), CASE_UPPER);
    case F_LOWER: jinja_check_args(R, c, 0, NULL, "lower"); return jinja_map_case(R, jinja_str_of(R, v), CASE_LOWER);
    case F_CAPITALIZE: jinja_check_args(R, c, 0, NULL, "capitalize"); return jinja_map_case(R, jinja_str_of(R, v), CASE_CAPITALIZE);
    case F_TITLE: jinja_check_args(R, c, 0, NULL, "title"); return jinja_map_case(R, jinja_str_of(R, v), CASE_TITLE_JINJA);
    case F_REPLACE: {
        static const char *const nm[] = {"old", "new", "count", NULL};
        jinja_check_args(R, c, 3, nm, "replace");
        val o = jinja_str_of(R, jinja_param(R, c, 0, "old", vundef(NULL, 0))), n = jinja_str_of(R, jinja_param(R, c, 1, "new", vundef(NULL, 0)));
        val cnt = jinja_param(R, c, 2, "count", vnone());
        return jinja_str_replace(R, jinja_str_of(R, v), o, n, cnt.t == V_NONE ? -1 : jinja_need_int(R, cnt, "replace"));
    }
    case F_JOIN: {
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
    case F_FIRST: {
        jinja_check_args(R, c, 0, NULL, "first");
        list *l = jinja_iter_list(R, v);
        return l->n ? l->v[0] : vundef(NULL, 0);
    }
    case F_LAST: {
        jinja_check_args(R, c, 0, NULL, "last");
        if ((v.t != V_LIST && v.t != V_STR && v.t != V_DICT) || (v.t == V_LIST && v.u.l->kind == LK_GEN))
            FAIL(R, "last: '%s' object is not reversible", jinja_type_name(v));
        list *l = jinja_iter_list(R, v);
        return l->n ? l->v[l->n - 1] : vundef(NULL, 0);
    }
    case F_DEFAULT:
    case F_D: {
        static const char *const nm[] = {"default_value", "boolean", NULL};
        jinja_check_args(R, c, 2, nm, "default");
        val d = jinja_param(R, c, 0, "default_value", vstr("", 0)), b = jinja_param(R, c, 1, "boolean", vbool(0));
        if (v.t == V_UNDEF || (jinja_truthy(b) && !jinja_truthy(v))) return d;
        return v;
    }
    case F_STRING: jinja_check_args(R, c, 0, NULL, "string"); return jinja_str_of(R, v);
    case F_INT: {
        static const char *const nm[] = {"default", "base", NULL};
        jinja_check_args(R, c, 2, nm, "int");
        return jinja_to_int_val(R, v, jinja_param(R, c, 0, "default", vint(0)), jinja_need_int(R, jinja_param(R, c, 1, "base", vint(10)), "int"));
    }
    case F_FLOAT: {
        static const char *const nm[] = {"default", NULL};
        jinja_check_args(R, c, 1, nm, "float");
        return jinja_to_float_val(R, v, jinja_param(R, c, 0, "default", vfloat(0)));
    }
    case F_LIST: {
        jinja_check_args(R, c, 0, NULL, "list");
        list *l = jinja_iter_list(R, v), *o = list_new(R, l->n);
        for (size_t i = 0; i < l->n; i++) list_push(R, o, l->v[i]);
        return vlist(o);
    }
    case F_ITEMS: {
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
    case F_SELECTATTR: return filter_select(R, v, c, 1, 1);
    case F_REJECTATTR: return filter_select(R, v, c, 1, 0);
    case F_SELECT: return filter_select(R, v, c, 0, 1);
    case F_REJECT: return filter_select(R, v, c, 0, 0);
    case F_MAP: return filter_map(R, v, c, line);
    case F_INDENT: {
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
    case F_SAFE: {
        jinja_check_args(R, c, 0, NULL, "safe");
        val s = jinja_str_of(R, v);
        s.mk = 1;
        return s;
    }
    case F_ABS:
        jinja_check_args(R, c, 0, NULL, "abs");
        if (v.t == V_FLOAT) return vfloat(fabs(v.u.f));
        if (v.t == V_INT || v.t == V_BOOL) {
            if (v.u.i == INT64_MIN) FAIL(R, "integer overflow");
            return vint(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        FAIL(R, "bad operand type for abs(): '%s'", jinja_type_name(v));
        break;
    case F_ROUND: {
        static const char *const nm[] = {"precision", "method", NULL};
        jinja_check_args(R, c, 2, nm, "round");
        return jinja_do_round(R, v, jinja_need_int(R, jinja_param(R, c, 0, "precision", vint(0)), "round"), jinja_param(R, c, 1, "method", vstrz("common")));
    }
    case F_UNIQUE: {
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
    case F_REVERSE: {
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
    case F_ESCAPE:
    case F_E: jinja_check_args(R, c, 0, NULL, "escape"); return jinja_markup_escape(R, v);
    case F_FORMAT: {
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
    case F_SUM: {
        static const char *const nm[] = {"attribute", "start", NULL};
        jinja_check_args(R, c, 2, nm, "sum");
        val at = jinja_param(R, c, 0, "attribute", vnone()), acc = jinja_param(R, c, 1, "start", vint(0));
        list *l = jinja_iter_list(R, v);
        for (size_t i = 0; i < l->n; i++) acc = jinja_arith(R, OP_ADD, acc, at.t == V_NONE ? l->v[i] : attr_path(R, l->v[i], at));
        return acc;
    }
    case F_MIN:
    case F_MAX: {
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
            if (fn == F_MIN ? cmp < 0 : cmp > 0) best = i, bk = k;
        }
        return l->v[best];
    }
    case F_SORT: {
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
    case F_DICTSORT: {
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
    case F_WORDCOUNT: {
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
    case F_CENTER: {
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
    }
    FAIL(R, "internal: a compiled filter id without a case"); /* unknown filters fail at compile */
    return vnone();
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
