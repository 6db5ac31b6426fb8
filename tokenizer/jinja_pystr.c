/*
 * Python's str semantics that Jinja filters and methods lean on: full case
 * mapping, strip / replace / split / splitlines, round(), int() and float()
 * of strings, markupsafe escaping, printf-style `%` and str.format.
 */
#include "tokenizer/jinja_internal.h"

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

val jinja_map_case(rs *R, val s, casemode m) {
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
val jinja_strip(rs *R, val s, val chars, int left, int right) {
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

val jinja_str_replace(rs *R, val s, val old, val new_, int64_t count) {
    sbuf b = {0};
    if (!old.u.s.n) {
        /* Python inserts `new` between characters and at both ends */
        list *cs = jinja_iter_list(R, s);
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
val jinja_str_split(rs *R, val s, val sep, int64_t maxsplit, int reverse) {
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
    list *cs = jinja_iter_list(R, s);
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
list *jinja_splitlines(rs *R, const char *p, size_t n) {
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

val jinja_do_round(rs *R, val v, int64_t prec, val method) {
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

val jinja_to_int_val(rs *R, val v, val dflt, int64_t base) {
    if (v.t == V_UNDEF) jinja_undef_fail(R, v); /* int(Undefined) raises */
    if (v.t == V_INT) return v;
    if (v.t == V_BOOL) return vint(v.u.i);
    if (v.t == V_FLOAT) {
        if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18) return dflt;
        return vint((int64_t)v.u.f);
    }
    if (v.t == V_STR) {
        /* int(s, base); else int(float(s)) */
        char buf[80];
        val t = jinja_strip(R, v, vnone(), 1, 1);
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

val jinja_to_float_val(rs *R, val v, val dflt) {
    if (v.t == V_UNDEF) jinja_undef_fail(R, v);
    if (is_num(v)) return vfloat(num_f(v));
    if (v.t == V_STR) {
        val t = jinja_strip(R, v, vnone(), 1, 1);
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

val jinja_markup_escape(rs *R, val v) {
    if (v.t == V_STR && v.mk) return v;
    val s = jinja_str_of(R, v);
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


static void pad_to(rs *R, sbuf *b, val s, int64_t width, int left) {
    int64_t len = (int64_t)u8len(s.u.s.p, s.u.s.n);
    if (!left) for (int64_t i = len; i < width; i++) sb_puts(&R->a, b, " ");
    sb_put(&R->a, b, s.u.s.p, s.u.s.n);
    if (left) for (int64_t i = len; i < width; i++) sb_puts(&R->a, b, " ");
}

/* Python's printf-style `fmt % args`: %[(key)][flags][width][.prec]type
 * with types s r d i u f F e E g G x X o c and %%. */
val jinja_py_percent(rs *R, val fmt, val args) {
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
            if (t == 's') jinja_to_str(R, &tmp, arg, 0);
            else jinja_repr(R, &tmp, arg, 0);
            val sv = vsb(&tmp);
            if (prec >= 0) { /* precision truncates characters */
                list *cs = jinja_iter_list(R, sv);
                size_t cut = 0;
                for (int64_t i = 0; i < prec && (size_t)i < cs->n; i++) cut += cs->v[i].u.s.n;
                sv.u.s.n = cut;
            }
            pad_to(R, &b, sv, width, left);
            continue;
        }
        if (arg.t == V_UNDEF) jinja_undef_fail(R, arg);
        if (!is_num(arg)) FAIL(R, "%%%c format: a real number is required, not %s", t, jinja_type_name(arg));
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
val jinja_py_format(rs *R, val fmt, const callargs *c) {
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
        jinja_to_str(R, &b, arg, 0);
        p = k + 1;
    }
    return vsb(&b);
}

/* Filters that run str methods on their input keep a Markup a Markup. */
