/*
 * Private to the Jinja interpreter (tokenizer/jinja_lex.c, jinja_parse.c,
 * jinja.c): limits, the render/compile arena, tokens, the AST and the
 * filter/test ids the parser resolves. Small helpers are static inline so
 * the three files share them without exported names.
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
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        token *t = aalloc(p->a, cap * sizeof *t);
        if (p->n) memcpy(t, p->t, p->n * sizeof *t);
        p->t = t;
        p->cap = cap;
    }
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
extern const char *const jinja_filters[F_N]; /* defined in jinja_parse.c */

enum {
    T_DEFINED, T_UNDEFINED, T_NONE_, T_STRING, T_MAPPING, T_ITERABLE, T_SEQUENCE, T_NUMBER, T_INTEGER,
    T_FLOAT_, T_BOOLEAN, T_TRUE, T_FALSE, T_ODD, T_EVEN, T_DIVISIBLEBY, T_EQ, T_EQUALTO, T_EQ2, T_NE,
    T_NE2, T_LT, T_LT2, T_LESSTHAN, T_GT, T_GT2, T_GREATERTHAN, T_LE, T_LE2, T_GE, T_GE2, T_IN,
    T_SAMEAS, T_CALLABLE, T_LOWER, T_UPPER, T_N
};
extern const char *const jinja_tests[T_N]; /* defined in jinja_parse.c */

static inline int lookup_name(const char *const *tab, int n, const char *s, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(tab[i]) == len && !memcmp(tab[i], s, len)) return i;
    return -1;
}

/* Local error formatting (and jinja_parse.c's UTF-8 check) keep the
 * interpreter standalone: the fuzz target links only tokenizer/jinja*.c. */
static inline int jerr(char *err, size_t errlen, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}

/* jinja_lex.c: split a normalized source into p->t (ends with TK_EOF). */
void jinja_lex(parser *p, const char *src, size_t n);

#endif
