/*
 * Private to the Jinja interpreter (tokenizer/jinja*.c): limits, the
 * render/compile arena, tokens, the AST, the filter/test ids the parser
 * resolves, runtime values and the render state. Small helpers are static
 * inline; the functions one file of the interpreter calls in another carry
 * the jinja_ prefix and are declared at the end.
 */
#ifndef ECHO_TOKENIZER_JINJA_INTERNAL_H
#define ECHO_TOKENIZER_JINJA_INTERNAL_H

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <strings.h>
#include <time.h>

#include <jansson.h>
#include <utf8proc.h>

#include "tokenizer/tokenizer.h"

#define J_MAX_OUTPUT (64u << 20)     /* bytes of rendered text */
#define J_MAX_ALLOC (512u << 20)     /* arena bytes per render */
#define J_MAX_STEPS 10000000ull      /* evaluation steps per render */
#define J_MAX_PARSE_DEPTH 200        /* nesting of expressions and blocks */
#define J_MAX_CALL_DEPTH 64          /* macro recursion */
#define J_MAX_EVAL_DEPTH 1000        /* nested eval/exec frames: bounds C stack use (~1 KB each) */
#define J_MAX_RANGE 100000           /* as jinja2's sandbox MAX_RANGE */

/* ------------------------------------------------------------------ */
/* Arena                                                                */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct {
    chunk *head;
    size_t total;
    jmp_buf *jb; /* where to go when out of memory or budget */
    char *err;
    size_t errlen;
} arena;

static inline void arena_free(arena *a) {
    for (chunk *c = a->head, *n; c; c = n) n = c->next, free(c);
    a->head = NULL;
}

static inline void afail(arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (a->err && a->errlen) vsnprintf(a->err, a->errlen, fmt, ap);
    va_end(ap);
    longjmp(*a->jb, 1);
}

static inline void *aalloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n > J_MAX_ALLOC || a->total + n > J_MAX_ALLOC) afail(a, "template uses too much memory");
    chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = malloc(sizeof *c + cap);
        if (!c) afail(a, "out of memory");
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
        a->total += cap;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

static inline void *azalloc(arena *a, size_t n) { return memset(aalloc(a, n), 0, n); }

/* Arena arrays grow by doubling from `first` slots: a copy of the n
 * elements (elem bytes each) in a new block; *cap gets the new size. */
static inline void *agrow(arena *a, const void *p, size_t n, size_t *cap, size_t elem, size_t first) {
    size_t c = *cap ? *cap * 2 : first;
    void *q = aalloc(a, c * elem);
    if (n) memcpy(q, p, n * elem);
    *cap = c;
    return q;
}

static inline char *adup(arena *a, const char *s, size_t n) {
    char *p = aalloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* Growable byte string in the arena. */
typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static inline void sb_put(arena *a, sbuf *b, const char *s, size_t n) {
    if (!n) return;
    if (n > J_MAX_OUTPUT || b->n + n > J_MAX_OUTPUT) afail(a, "string longer than %u bytes", J_MAX_OUTPUT);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n) cap *= 2;
        char *p = aalloc(a, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static inline void sb_puts(arena *a, sbuf *b, const char *s) { sb_put(a, b, s, strlen(s)); }
static inline void sb_printf(arena *a, sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(a, b, tmp, k < 0 ? 0 : (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* ------------------------------------------------------------------ */
/* UTF-8 helpers                                                        */

/* Decode one code point; invalid bytes decode as themselves (values come
 * from jansson and template source that is validated, so this is a guard). */
static inline size_t u8dec(const char *s, size_t n, int32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (k <= 0) {
        *cp = (unsigned char)s[0];
        return 1;
    }
    *cp = c;
    return (size_t)k;
}

static inline size_t u8enc(int32_t cp, char *out) {
    utf8proc_ssize_t k = utf8proc_encode_char(cp, (utf8proc_uint8_t *)out);
    return k > 0 ? (size_t)k : 0;
}

static inline size_t u8len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

/* Python's str.isspace. */
static inline int py_space(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
           c == 0x3000;
}

/* ------------------------------------------------------------------ */
/* Tokens                                                               */

enum {
    TK_EOF,
    TK_DATA,
    TK_VBEGIN,
    TK_VEND,
    TK_BBEGIN,
    TK_BEND,
    TK_NAME,
    TK_STR,
    TK_INT,
    TK_FLOAT,
    TK_OP,
};

typedef struct {
    int type, line;
    const char *s; /* DATA text, NAME, STR value, OP text */
    size_t n;
    int64_t i;
    double f;
} token;

typedef struct {
    arena *a;
    token *t;
    size_t n, cap, pos;
    int depth;
} parser;

static inline void perr(parser *p, int line, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    afail(p->a, "line %d: %s", line, msg);
}

static inline token *push_tok(parser *p, int type, int line) {
    if (p->n == p->cap) p->t = agrow(p->a, p->t, p->n, &p->cap, sizeof *p->t, 256);
    token *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    return t;
}

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

/* ------------------------------------------------------------------ */
/* AST                                                                  */

typedef enum {
    E_STR, E_INT, E_FLOAT, E_BOOL, E_NONE, E_NAME, E_LIST, E_TUPLE, E_DICT,
    E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NOT, E_NEG, E_POS,
    E_BIN, E_AND, E_OR, E_COND, E_CMP, E_CONCAT, E_BODY /* the rendered body of a filter block / block set */
} ekind;

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW };
enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

typedef struct expr expr;
typedef struct {
    const char *name; /* NULL for positional */
    size_t nlen;
    expr *e;
} arg;

struct expr {
    ekind k;
    int line, op, neg, fn; /* fn: filter/test id */
    const char *s;
    size_t n;
    int64_t i;
    double f;
    expr *a, *b, *c;
    arg *args;
    size_t nargs;
    int *ops; /* E_CMP: nargs-1 operators after a */
};

typedef enum { S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_BREAK, S_CONTINUE, S_MACRO, S_BLOCK, S_FILTER, S_CALL } skind;

typedef struct stmt stmt;
struct stmt {
    skind k;
    int line;
    stmt *next;
    const char *s; /* text; macro name; set: namespace name when attr set */
    size_t n;
    const char *attr; /* set ns.attr */
    size_t attrn;
    expr *e, *cond;
    stmt *body, *orelse;
    const char **names; /* for/set targets; macro parameters */
    size_t *nlens;
    size_t nnames;
    expr **defaults; /* macro parameter defaults (NULL = required) */
    int uses_caller; /* S_MACRO: the body names `caller` (accepts a call block) */
};

struct tok_template {
    arena a;
    stmt *body;
};

/* ------------------------------------------------------------------ */
/* Filters, tests, builtins: names resolved at compile time              */

enum {
    F_TRIM, F_TOJSON, F_LENGTH, F_COUNT, F_UPPER, F_LOWER, F_CAPITALIZE, F_TITLE, F_REPLACE, F_JOIN,
    F_FIRST, F_LAST, F_DEFAULT, F_D, F_STRING, F_INT, F_FLOAT, F_LIST, F_ITEMS, F_SELECTATTR,
    F_REJECTATTR, F_SELECT, F_REJECT, F_MAP, F_INDENT, F_SAFE, F_ABS, F_ROUND, F_UNIQUE, F_REVERSE,
    F_ESCAPE, F_E, F_SUM, F_MIN, F_MAX, F_SORT, F_DICTSORT, F_WORDCOUNT, F_CENTER, F_FORMAT,
    F_N
};

enum {
    T_DEFINED, T_UNDEFINED, T_NONE_, T_STRING, T_MAPPING, T_ITERABLE, T_SEQUENCE, T_NUMBER, T_INTEGER,
    T_FLOAT_, T_BOOLEAN, T_TRUE, T_FALSE, T_ODD, T_EVEN, T_DIVISIBLEBY, T_EQ, T_EQUALTO, T_EQ2, T_NE,
    T_NE2, T_LT, T_LT2, T_LESSTHAN, T_GT, T_GT2, T_GREATERTHAN, T_LE, T_LE2, T_GE, T_GE2, T_IN,
    T_SAMEAS, T_CALLABLE, T_LOWER, T_UPPER, T_N
};
extern const char *const jinja_tests[T_N]; /* defined in jinja_filters.c */

static inline int lookup_name(const char *const *tab, int n, const char *s, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(tab[i]) == len && !memcmp(tab[i], s, len)) return i;
    return -1;
}

/* Local error formatting (and jinja.c's UTF-8 check) keep the
 * interpreter standalone: the fuzz target links only tokenizer/jinja*.c. */
static inline int jerr(char *err, size_t errlen, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}

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

enum {
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER,
    M_REPLACE, M_TITLE, M_CAPITALIZE, M_FIND, M_COUNT, M_SPLITLINES, M_JOIN, M_ISDIGIT, M_ISALPHA,
    M_ISSPACE, M_FORMAT, M_ITEMS, M_KEYS, M_VALUES, M_GET, M_CYCLE, M_MUTATE, M_N
};
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

static inline void step(rs *R) {
    if (++R->steps > J_MAX_STEPS) FAIL(R, "template exceeds its step budget (loop too long?)");
}

static inline val vundef(const char *name, size_t n) {
    val v = {V_UNDEF, {0}, 0};
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}
static inline val vnone(void) { return (val){V_NONE, {0}, 0}; }
static inline val vbool(int b) { val v = {V_BOOL, {0}, 0}; v.u.i = !!b; return v; }
static inline val vint(int64_t i) { val v = {V_INT, {0}, 0}; v.u.i = i; return v; }
static inline val vfloat(double f) { val v = {V_FLOAT, {0}, 0}; v.u.f = f; return v; }
static inline val vstr(const char *p, size_t n) {
    val v = {V_STR, {0}, 0};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static inline val vsb(sbuf *b) { return vstr(b->p ? b->p : "", b->n); }

static inline list *list_new(rs *R, size_t cap) {
    list *l = azalloc(&R->a, sizeof *l);
    if (cap) {
        if (cap > (J_MAX_ALLOC / sizeof(val))) FAIL(R, "list too long");
        l->v = aalloc(&R->a, cap * sizeof(val));
        l->cap = cap;
    }
    return l;
}
static inline void list_push(rs *R, list *l, val v) {
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
static inline val vlist(list *l) { val v = {V_LIST, {0}, 0}; v.u.l = l; return v; }

static inline dict *dict_new(rs *R) { return azalloc(&R->a, sizeof(dict)); }
static inline int str_eq(val a, const char *s, size_t n) { return a.u.s.n == n && (!n || !memcmp(a.u.s.p, s, n)); }
static inline val *dict_find(const dict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(d->k[i], k, n)) return &d->v[i];
    return NULL;
}
static inline void dict_set(rs *R, dict *d, val k, val v) {
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
static inline val vdict(dict *d) { val v = {V_DICT, {0}, 0}; v.u.d = d; return v; }

static inline int is_num(val v) { return v.t == V_INT || v.t == V_BOOL || v.t == V_FLOAT; }
static inline double num_f(val v) { return v.t == V_FLOAT ? v.u.f : (double)v.u.i; }
typedef struct {
    const char *indent; /* NULL: no indent */
    size_t indn;
    const char *item_sep, *key_sep;
    size_t isn, ksn;
    int sort_keys;
} jsonopt;

/* Evaluated call arguments. */
typedef struct {
    val *pos;
    size_t npos;
    const arg *kw; /* keyword arg exprs */
    val *kwv;
    size_t nkw;
} callargs;

/* Case mapping by code point (Python uses full case mapping; the simple
 * mapping differs only for a few characters such as U+00DF). */
typedef enum { CASE_UPPER, CASE_LOWER, CASE_TITLE_PY, CASE_CAPITALIZE, CASE_TITLE_JINJA } casemode;

static inline val vstrz(const char *s) { return vstr(s, strlen(s)); }

/* ------------------------------------------------------------------ */
/* Functions shared across the interpreter's files                      */

/* jinja_value.c */
const char *jinja_type_name(val v);
void jinja_undef_fail(rs *R, val v);
val jinja_undef_hint(rs *R, val obj, const char *what, val key);
void jinja_fmt_float(rs *R, sbuf *b, double f, int json);
void jinja_to_str(rs *R, sbuf *b, val v, int depth);
void jinja_repr(rs *R, sbuf *b, val v, int depth);
val jinja_str_of(rs *R, val v);
int jinja_truthy(val v);
int jinja_val_eq(rs *R, val a, val b, int depth);
int jinja_val_cmp(rs *R, val a, val b, int depth);
list *jinja_iter_list(rs *R, val v);
int64_t jinja_length_of(rs *R, val v);

/* jinja_json.c */
val jinja_from_json(rs *R, json_t *j, int depth);
void jinja_to_json(rs *R, sbuf *b, val v, const jsonopt *o, int level);

/* jinja_pystr.c */
val jinja_map_case(rs *R, val s, casemode m);
val jinja_strip(rs *R, val s, val chars, int left, int right);
val jinja_str_replace(rs *R, val s, val old, val new_, int64_t count);
val jinja_str_split(rs *R, val s, val sep, int64_t maxsplit, int reverse);
list *jinja_splitlines(rs *R, const char *p, size_t n);
val jinja_do_round(rs *R, val v, int64_t prec, val method);
val jinja_to_int_val(rs *R, val v, val dflt, int64_t base);
val jinja_to_float_val(rs *R, val v, val dflt);
val jinja_markup_escape(rs *R, val v);
val jinja_py_percent(rs *R, val fmt, val args);
val jinja_py_format(rs *R, val fmt, const callargs *c);

/* jinja_filters.c */
/* The id of a filter name (F_*), or -1; its row lives in jinja_filters.c. */
int jinja_filter_id(const char *s, size_t n);
val jinja_apply_filter(rs *R, int fn, val v, const callargs *c);
int jinja_run_test(rs *R, int fn, val v, const callargs *c);
val jinja_call_method(rs *R, method *m, const callargs *c);

/* jinja_eval.c */
val jinja_get_item(rs *R, val obj, val key);
val jinja_arith(rs *R, int op, val a, val b);
int jinja_contains(rs *R, val hay, val needle);
val jinja_param(rs *R, const callargs *c, size_t i, const char *name, val dflt);
void jinja_check_args(rs *R, const callargs *c, size_t maxpos, const char *const *names, const char *what);
val jinja_need_str(rs *R, val v, const char *what);
int64_t jinja_need_int(rs *R, val v, const char *what);
void jinja_exec_body(rs *R, const stmt *s, frame *f);

/* jinja_lex.c: split a normalized source into p->t (ends with TK_EOF). */
void jinja_lex(parser *p, const char *src, size_t n);
/* jinja_parse.c: the AST of the tokens in p->t. */
stmt *jinja_parse(parser *p);

#endif
