/*
 * The Jinja parser: tokens to the AST (tokenizer/jinja_internal.h), with
 * filter and test names resolved to ids.
 */
#include "tokenizer/jinja_internal.h"

/* ------------------------------------------------------------------ */
/* Parser                                                               */

static token *cur(parser *p) { return &p->t[p->pos]; }
static token *nexttok(parser *p) { return &p->t[p->pos++]; }
static int is_op(token *t, const char *op) { return t->type == TK_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n); }
static int is_name(token *t, const char *nm) { return t->type == TK_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n); }
static int accept_op(parser *p, const char *op) { return is_op(cur(p), op) ? (p->pos++, 1) : 0; }
static int accept_name(parser *p, const char *nm) { return is_name(cur(p), nm) ? (p->pos++, 1) : 0; }

static const char *tokdesc(token *t, char *buf, size_t len) {
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data";
    case TK_VBEGIN: return "'{{'";
    case TK_VEND: return "'}}'";
    case TK_BBEGIN: return "'{%'";
    case TK_BEND: return "'%}'";
    case TK_STR: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default: snprintf(buf, len, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    }
}

static void expect_op(parser *p, const char *op) {
    if (!accept_op(p, op)) {
        char b[64];
        perr(p, cur(p)->line, "expected '%s', got %s", op, tokdesc(cur(p), b, sizeof b));
    }
}

static token *expect_name(parser *p) {
    if (cur(p)->type != TK_NAME) {
        char b[64];
        perr(p, cur(p)->line, "expected a name, got %s", tokdesc(cur(p), b, sizeof b));
    }
    return nexttok(p);
}

static expr *mk(parser *p, ekind k, int line) {
    expr *e = azalloc(p->a, sizeof *e);
    e->k = k;
    e->line = line;
    return e;
}

typedef struct {
    arg *v;
    size_t n, cap;
} argvec;
static void argpush(parser *p, argvec *v, arg a) {
    if (v->n == v->cap) v->v = agrow(p->a, v->v, v->n, &v->cap, sizeof *v->v, 4);
    v->v[v->n++] = a;
}

static expr *parse_expr(parser *p);
static expr *parse_or(parser *p);
static expr *parse_unary(parser *p, int with_filter);

static void enter(parser *p) {
    if (++p->depth > J_MAX_PARSE_DEPTH) perr(p, cur(p)->line, "template nested too deeply");
}

/* (args) of a call, filter or test: positional then name=value. */
static void parse_args(parser *p, expr *e) {
    argvec v = {0};
    expect_op(p, "(");
    while (!accept_op(p, ")")) {
        if (v.n) expect_op(p, ",");
        if (accept_op(p, ")")) break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**")) perr(p, cur(p)->line, "unsupported construct '*args' in call");
        arg a = {0};
        if (cur(p)->type == TK_NAME && is_op(&p->t[p->pos + 1], "=")) {
            a.name = cur(p)->s;
            a.nlen = cur(p)->n;
            p->pos += 2;
        } else if (v.n && v.v[v.n - 1].name) {
            perr(p, cur(p)->line, "positional argument after keyword argument");
        }
        a.e = parse_expr(p);
        argpush(p, &v, a);
    }
    e->args = v.v;
    e->nargs = v.n;
}

static expr *parse_primary(parser *p) {
    token *t = cur(p);
    char b[64];
    expr *e;
    enter(p);
    if (t->type == TK_NAME) {
        p->pos++;
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            e = mk(p, E_BOOL, t->line);
            e->i = t->s[0] == 't' || t->s[0] == 'T';
        } else if (is_name(t, "none") || is_name(t, "None")) {
            e = mk(p, E_NONE, t->line);
        } else {
            e = mk(p, E_NAME, t->line);
            e->s = t->s;
            e->n = t->n;
        }
    } else if (t->type == TK_STR) {
        /* adjacent literals concatenate */
        sbuf s = {0};
        int line = t->line;
        while (cur(p)->type == TK_STR) sb_put(p->a, &s, cur(p)->s, cur(p)->n), p->pos++;
        e = mk(p, E_STR, line);
        e->s = s.p ? s.p : "";
        e->n = s.n;
    } else if (t->type == TK_INT) {
        p->pos++;
        e = mk(p, E_INT, t->line);
        e->i = t->i;
    } else if (t->type == TK_FLOAT) {
        p->pos++;
        e = mk(p, E_FLOAT, t->line);
        e->f = t->f;
    } else if (is_op(t, "(")) {
        p->pos++;
        if (accept_op(p, ")")) {
            e = mk(p, E_TUPLE, t->line);
        } else {
            expr *first = parse_expr(p);
            if (is_op(cur(p), ",")) {
                argvec v = {0};
                argpush(p, &v, (arg){NULL, 0, first});
                while (accept_op(p, ",")) {
                    if (is_op(cur(p), ")")) break;
                    argpush(p, &v, (arg){NULL, 0, parse_expr(p)});
                }
                e = mk(p, E_TUPLE, t->line);
                e->args = v.v;
                e->nargs = v.n;
            } else {
                e = first;
            }
            expect_op(p, ")");
        }
    } else if (is_op(t, "[")) {
        p->pos++;
        argvec v = {0};
        while (!accept_op(p, "]")) {
            if (v.n) expect_op(p, ",");
            if (accept_op(p, "]")) break;
            argpush(p, &v, (arg){NULL, 0, parse_expr(p)});
        }
        e = mk(p, E_LIST, t->line);
        e->args = v.v;
        e->nargs = v.n;
    } else if (is_op(t, "{")) {
        p->pos++;
        argvec v = {0};
        while (!accept_op(p, "}")) {
            if (v.n) expect_op(p, ",");
            if (accept_op(p, "}")) break;
            argpush(p, &v, (arg){NULL, 0, parse_expr(p)});
            expect_op(p, ":");
            argpush(p, &v, (arg){NULL, 0, parse_expr(p)});
        }
        e = mk(p, E_DICT, t->line);
        e->args = v.v;
        e->nargs = v.n;
    } else {
        perr(p, t->line, "unexpected %s", tokdesc(t, b, sizeof b));
        return NULL;
    }
    p->depth--;
    return e;
}

static expr *parse_subscript(parser *p, expr *obj) {
    int line = cur(p)->line;
    expect_op(p, "[");
    expr *parts[3] = {0};
    int is_slice = 0, k = 0;
    for (;;) {
        if (is_op(cur(p), "]")) break;
        if (accept_op(p, ":")) {
            is_slice = 1;
            if (++k > 2) perr(p, line, "invalid slice");
            continue;
        }
        if (parts[k]) {
            char b[64];
            perr(p, cur(p)->line, "expected ']', got %s", tokdesc(cur(p), b, sizeof b));
        }
        parts[k] = parse_expr(p);
        if (is_op(cur(p), ",")) perr(p, line, "unsupported construct: tuple subscript");
    }
    expect_op(p, "]");
    expr *e;
    if (is_slice) {
        e = mk(p, E_SLICE, line);
        e->a = obj;
        e->b = parts[0];
        e->c = parts[1];
        if (parts[2]) {
            e->args = aalloc(p->a, sizeof *e->args);
            e->args[0] = (arg){NULL, 0, parts[2]};
            e->nargs = 1;
        }
    } else {
        if (!parts[0]) perr(p, line, "empty subscript");
        e = mk(p, E_ITEM, line);
        e->a = obj;
        e->b = parts[0];
    }
    return e;
}

static expr *parse_postfix(parser *p, expr *e) {
    for (;;) {
        token *t = cur(p);
        if (is_op(t, ".")) {
            p->pos++;
            token *nm = cur(p);
            if (nm->type == TK_INT) {
                p->pos++;
                expr *x = mk(p, E_ITEM, nm->line);
                x->a = e;
                x->b = mk(p, E_INT, nm->line);
                x->b->i = nm->i;
                e = x;
                continue;
            }
            nm = expect_name(p);
            expr *x = mk(p, E_ATTR, nm->line);
            x->a = e;
            x->s = nm->s;
            x->n = nm->n;
            e = x;
        } else if (is_op(t, "[")) {
            e = parse_subscript(p, e);
        } else if (is_op(t, "(")) {
            expr *x = mk(p, E_CALL, t->line);
            x->a = e;
            parse_args(p, x);
            e = x;
        } else {
            return e;
        }
    }
}

/* name[(args)] [| name[(args)] ...] applied to e (after a `|`). */
static expr *parse_filter_chain(parser *p, expr *e) {
    do {
                token *nm = expect_name(p);
                sbuf full = {0};
                sb_put(p->a, &full, nm->s, nm->n);
                while (is_op(cur(p), ".")) { /* dotted filter names */
                    p->pos++;
                    token *x = expect_name(p);
                    sb_puts(p->a, &full, ".");
                    sb_put(p->a, &full, x->s, x->n);
                }
                int fn = jinja_filter_id(full.p, full.n);
                if (fn < 0) perr(p, nm->line, "unsupported construct: filter '%.*s'", (int)(full.n > 60 ? 60 : full.n), full.p);
                expr *x = mk(p, E_FILTER, nm->line);
                x->a = e;
                x->fn = fn;
                x->s = full.p;
                x->n = full.n;
                if (is_op(cur(p), "(")) parse_args(p, x);
                e = x;
    } while (accept_op(p, "|"));
    return e;
}

static expr *parse_filter_expr(parser *p, expr *e) {
    for (;;) {
        if (accept_op(p, "|")) {
            e = parse_filter_chain(p, e);
        } else if (is_name(cur(p), "is")) {
            int line = nexttok(p)->line;
            int neg = accept_name(p, "not");
            token *nm = expect_name(p);
            int fn = lookup_name(jinja_tests, T_N, nm->s, nm->n);
            if (fn < 0) perr(p, nm->line, "unsupported construct: test '%.*s'", (int)(nm->n > 60 ? 60 : nm->n), nm->s);
            expr *x = mk(p, E_TEST, line);
            x->a = e;
            x->fn = fn;
            x->neg = neg;
            x->s = nm->s;
            x->n = nm->n;
            token *t = cur(p);
            if (is_op(t, "(")) {
                parse_args(p, x);
            } else if ((t->type == TK_NAME || t->type == TK_STR || t->type == TK_INT || t->type == TK_FLOAT ||
                        is_op(t, "[") || is_op(t, "{")) &&
                       !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
                /* `x is divisibleby 3`: one argument without parentheses */
                expr *a1 = parse_primary(p);
                a1 = parse_postfix(p, a1);
                x->args = aalloc(p->a, sizeof *x->args);
                x->args[0] = (arg){NULL, 0, a1};
                x->nargs = 1;
            }
            e = x;
        } else if (is_op(cur(p), "(")) {
            expr *x = mk(p, E_CALL, cur(p)->line);
            x->a = e;
            parse_args(p, x);
            e = x;
        } else {
            return e;
        }
    }
}

static expr *parse_unary(parser *p, int with_filter) {
    token *t = cur(p);
    expr *e;
    enter(p);
    if (is_op(t, "-") || is_op(t, "+")) {
        p->pos++;
        e = mk(p, is_op(t, "-") ? E_NEG : E_POS, t->line);
        e->a = parse_unary(p, 0);
    } else {
        e = parse_primary(p);
    }
    e = parse_postfix(p, e);
    if (with_filter) e = parse_filter_expr(p, e);
    p->depth--;
    return e;
}

static expr *bin(parser *p, ekind k, int op, expr *a, expr *b, int line) {
    expr *e = mk(p, k, line);
    e->op = op;
    e->a = a;
    e->b = b;
    return e;
}

/* The left-associative binary operators, one row per precedence level,
 * loosest first; a level's operands are the next level down. `kw`: the
 * operator is a keyword (and, or), not an operator token. */
typedef struct {
    const char *tok;
    int kw;
    ekind k;
    int op;
} binop;
typedef struct {
    binop ops[4];
} binlevel;

static const binlevel LOGIC_LEVELS[] = { /* operands: not / comparisons */
    {{{"or", 1, E_OR, 0}}},
    {{{"and", 1, E_AND, 0}}},
};
static const binlevel ARITH_LEVELS[] = { /* operands: unary expressions */
    {{{"+", 0, E_BIN, OP_ADD}, {"-", 0, E_BIN, OP_SUB}}},
    {{{"~", 0, E_CONCAT, 0}}},
    {{{"*", 0, E_BIN, OP_MUL}, {"/", 0, E_BIN, OP_DIV}, {"//", 0, E_BIN, OP_FDIV}, {"%", 0, E_BIN, OP_MOD}}},
    {{{"**", 0, E_BIN, OP_POW}}},
};

static expr *parse_levels(parser *p, const binlevel *lv, size_t n, expr *(*operand)(parser *)) {
    if (!n) return operand(p);
    expr *e = parse_levels(p, lv + 1, n - 1, operand);
    for (;;) {
        token *t = cur(p);
        const binop *o = NULL;
        for (size_t i = 0; i < 4 && lv->ops[i].tok && !o; i++)
            if (lv->ops[i].kw ? is_name(t, lv->ops[i].tok) : is_op(t, lv->ops[i].tok)) o = &lv->ops[i];
        if (!o) return e;
        p->pos++;
        e = bin(p, o->k, o->op, e, parse_levels(p, lv + 1, n - 1, operand), t->line);
    }
}

static expr *parse_unary_filtered(parser *p) { return parse_unary(p, 1); }

static expr *parse_math1(parser *p) {
    return parse_levels(p, ARITH_LEVELS, sizeof ARITH_LEVELS / sizeof *ARITH_LEVELS, parse_unary_filtered);
}

static expr *parse_compare(parser *p) {
    int line = cur(p)->line;
    expr *first = parse_math1(p);
    argvec v = {0};
    int ops[64], nops = 0;
    for (;;) {
        token *t = cur(p);
        int op = is_op(t, "==") ? CMP_EQ : is_op(t, "!=") ? CMP_NE : is_op(t, "<") ? CMP_LT : is_op(t, "<=") ? CMP_LE
               : is_op(t, ">") ? CMP_GT : is_op(t, ">=") ? CMP_GE : is_name(t, "in") ? CMP_IN : -1;
        if (op >= 0) {
            p->pos++;
        } else if (is_name(t, "not") && is_name(&p->t[p->pos + 1], "in")) {
            p->pos += 2;
            op = CMP_NOTIN;
        } else {
            break;
        }
        if (nops == 64) perr(p, t->line, "comparison chain too long");
        ops[nops++] = op;
        argpush(p, &v, (arg){NULL, 0, parse_math1(p)});
    }
    if (!nops) return first;
    expr *e = mk(p, E_CMP, line);
    e->a = first;
    e->args = v.v;
    e->nargs = v.n;
    e->ops = aalloc(p->a, nops * sizeof *e->ops);
    memcpy(e->ops, ops, nops * sizeof *ops);
    return e;
}

static expr *parse_not(parser *p) {
    if (is_name(cur(p), "not")) {
        int line = nexttok(p)->line;
        enter(p);
        expr *e = mk(p, E_NOT, line);
        e->a = parse_not(p);
        p->depth--;
        return e;
    }
    return parse_compare(p);
}

static expr *parse_or(parser *p) {
    return parse_levels(p, LOGIC_LEVELS, sizeof LOGIC_LEVELS / sizeof *LOGIC_LEVELS, parse_not);
}

static expr *parse_expr(parser *p) {
    enter(p);
    expr *e = parse_or(p);
    while (is_name(cur(p), "if")) {
        int line = nexttok(p)->line;
        expr *x = mk(p, E_COND, line);
        x->a = e;
        x->b = parse_or(p);
        if (accept_name(p, "else")) x->c = parse_expr(p);
        e = x;
    }
    p->depth--;
    return e;
}

/* `a` or `a, b` (tuple without parentheses), as in {{ }} and set values. */
static expr *parse_tuple_expr(parser *p) {
    int line = cur(p)->line;
    expr *e = parse_expr(p);
    if (!is_op(cur(p), ",")) return e;
    argvec v = {0};
    argpush(p, &v, (arg){NULL, 0, e});
    while (accept_op(p, ",")) {
        if (cur(p)->type == TK_BEND || cur(p)->type == TK_VEND) break;
        argpush(p, &v, (arg){NULL, 0, parse_expr(p)});
    }
    expr *t = mk(p, E_TUPLE, line);
    t->args = v.v;
    t->nargs = v.n;
    return t;
}

static void expect_bend(parser *p) {
    if (cur(p)->type != TK_BEND) {
        char b[64];
        perr(p, cur(p)->line, "expected end of statement '%%}', got %s", tokdesc(cur(p), b, sizeof b));
    }
    p->pos++;
}

static stmt *mks(parser *p, skind k, int line) {
    stmt *s = azalloc(p->a, sizeof *s);
    s->k = k;
    s->line = line;
    return s;
}

/* Names of a for/set target: `x` or `a, b` (optionally parenthesized). */
static void parse_targets(parser *p, stmt *s) {
    const char *names[16];
    size_t lens[16], n = 0;
    int paren = accept_op(p, "(");
    do {
        if (paren && is_op(cur(p), ")")) break;
        token *t = expect_name(p);
        if (n == 16) perr(p, t->line, "too many targets");
        names[n] = t->s;
        lens[n++] = t->n;
    } while (accept_op(p, ","));
    if (paren) expect_op(p, ")");
    s->names = aalloc(p->a, n * sizeof *s->names);
    s->nlens = aalloc(p->a, n * sizeof *s->nlens);
    memcpy(s->names, names, n * sizeof *names);
    memcpy(s->nlens, lens, n * sizeof *lens);
    s->nnames = n;
}

/* Parse statements until a block tag named in `ends` (space separated);
 * *endtag receives the index of the tag that stopped it. */
static stmt *parse_body(parser *p, const char *const *ends, int *endtag, int in_loop);

/* The body of a block with one end tag, and the end tag's closing %}. */
static stmt *parse_until(parser *p, const char *end, int in_loop) {
    const char *const ends[] = {end, NULL};
    int tag;
    stmt *body = parse_body(p, ends, &tag, in_loop);
    expect_bend(p);
    return body;
}

/* A macro's or call block's parameter list after its "(" (none when !open):
 * names with optional defaults, at most 32. */
static void parse_params(parser *p, stmt *s, int open, const char *what) {
    const char *names[32];
    size_t lens[32], n = 0;
    expr *defs[32];
    while (open && !accept_op(p, ")")) {
        if (n) expect_op(p, ",");
        if (accept_op(p, ")")) break;
        token *a = expect_name(p);
        if (n == 32) perr(p, a->line, "too many %s parameters", what);
        names[n] = a->s;
        lens[n] = a->n;
        defs[n] = accept_op(p, "=") ? parse_expr(p) : NULL;
        n++;
    }
    s->names = aalloc(p->a, (n + 1) * sizeof *s->names);
    s->nlens = aalloc(p->a, (n + 1) * sizeof *s->nlens);
    s->defaults = aalloc(p->a, (n + 1) * sizeof *s->defaults);
    memcpy(s->names, names, n * sizeof *names);
    memcpy(s->nlens, lens, n * sizeof *lens);
    memcpy(s->defaults, defs, n * sizeof *defs);
    s->nnames = n;
}

static stmt *parse_tag(parser *p, int in_loop, const char *const *ends, int *endtag, int *stop) {
    token *kw = cur(p);
    int line = kw->line;
    char b[64];
    if (kw->type != TK_NAME) perr(p, line, "expected a statement name, got %s", tokdesc(kw, b, sizeof b));
    for (int i = 0; ends && ends[i]; i++)
        if (is_name(kw, ends[i])) {
            *endtag = i;
            *stop = 1;
            p->pos++;
            return NULL;
        }
    p->pos++;
    enter(p);
    stmt *s = NULL;
    if (is_name(kw, "if")) {
        s = mks(p, S_IF, line);
        s->cond = parse_tuple_expr(p);
        expect_bend(p);
        static const char *const e1[] = {"elif", "else", "endif", NULL};
        int tag;
        s->body = parse_body(p, e1, &tag, in_loop);
        stmt *last = s;
        while (tag == 0) { /* elif */
            stmt *x = mks(p, S_IF, cur(p)->line);
            x->cond = parse_tuple_expr(p);
            expect_bend(p);
            x->body = parse_body(p, e1, &tag, in_loop);
            last->orelse = x;
            last = x;
        }
        if (tag == 1) {
            expect_bend(p);
            static const char *const e2[] = {"endif", NULL};
            last->orelse = parse_body(p, e2, &tag, in_loop);
        }
        expect_bend(p);
    } else if (is_name(kw, "for")) {
        s = mks(p, S_FOR, line);
        parse_targets(p, s);
        if (!accept_name(p, "in")) perr(p, cur(p)->line, "expected 'in' in for loop");
        /* the iterable stops before `if` (jinja2 parses it without conditionals) */
        int l2 = cur(p)->line;
        expr *it = parse_or(p);
        if (is_op(cur(p), ",")) {
            argvec v = {0};
            argpush(p, &v, (arg){NULL, 0, it});
            while (accept_op(p, ",")) argpush(p, &v, (arg){NULL, 0, parse_or(p)});
            it = mk(p, E_TUPLE, l2);
            it->args = v.v;
            it->nargs = v.n;
        }
        s->e = it;
        if (accept_name(p, "if")) s->cond = parse_expr(p);
        if (is_name(cur(p), "recursive")) perr(p, cur(p)->line, "unsupported construct 'for ... recursive'");
        expect_bend(p);
        static const char *const e1[] = {"else", "endfor", NULL};
        int tag;
        s->body = parse_body(p, e1, &tag, 1);
        if (tag == 0) {
            expect_bend(p);
            static const char *const e2[] = {"endfor", NULL};
            s->orelse = parse_body(p, e2, &tag, in_loop);
        }
        expect_bend(p);
    } else if (is_name(kw, "set")) {
        token *t = expect_name(p);
        if (is_op(cur(p), ".")) {
            p->pos++;
            token *at = expect_name(p);
            s = mks(p, S_SET, line);
            s->s = t->s;
            s->n = t->n;
            s->attr = at->s;
            s->attrn = at->n;
            expect_op(p, "=");
            s->e = parse_tuple_expr(p);
            expect_bend(p);
        } else {
            p->pos--;
            s = mks(p, S_SET, line);
            parse_targets(p, s);
            if (accept_op(p, "=")) {
                s->e = parse_tuple_expr(p);
                expect_bend(p);
            } else {
                if (s->nnames != 1) perr(p, line, "block set takes one name");
                s->k = S_SETBLOCK;
                if (accept_op(p, "|")) s->e = parse_filter_chain(p, mk(p, E_BODY, line));
                expect_bend(p);
                s->body = parse_until(p, "endset", in_loop);
            }
        }
    } else if (is_name(kw, "break") || is_name(kw, "continue")) {
        if (!in_loop) perr(p, line, "'%.*s' outside of a loop", (int)kw->n, kw->s);
        s = mks(p, is_name(kw, "break") ? S_BREAK : S_CONTINUE, line);
        expect_bend(p);
    } else if (is_name(kw, "macro")) {
        token *nm = expect_name(p);
        s = mks(p, S_MACRO, line);
        s->s = nm->s;
        s->n = nm->n;
        expect_op(p, "(");
        parse_params(p, s, 1, "macro");
        expect_bend(p);
        size_t first = p->pos;
        s->body = parse_until(p, "endmacro", 0);
        for (size_t i = first; i < p->pos; i++) s->uses_caller |= is_name(&p->t[i], "caller");
    } else if (is_name(kw, "filter")) {
        s = mks(p, S_FILTER, line);
        s->e = parse_filter_chain(p, mk(p, E_BODY, line));
        expect_bend(p);
        s->body = parse_until(p, "endfilter", in_loop);
    } else if (is_name(kw, "call")) {
        /* {% call [(params)] macro(args) %}body{% endcall %}: body is `caller` */
        s = mks(p, S_CALL, line);
        s->s = "caller";
        s->n = 6;
        parse_params(p, s, accept_op(p, "("), "caller");
        s->e = parse_expr(p);
        if (s->e->k != E_CALL) perr(p, line, "expected a call after 'call'");
        expect_bend(p);
        s->body = parse_until(p, "endcall", 0);
    } else if (is_name(kw, "generation")) {
        /* transformers' AssistantTracker tag: renders its body unchanged */
        expect_bend(p);
        s = mks(p, S_BLOCK, line);
        s->body = parse_until(p, "endgeneration", in_loop);
    } else {
        perr(p, line, "unsupported construct '{%% %.*s %%}'", (int)(kw->n > 40 ? 40 : kw->n), kw->s);
    }
    p->depth--;
    return s;
}

static stmt *parse_body(parser *p, const char *const *ends, int *endtag, int in_loop) {
    stmt *head = NULL, **tail = &head;
    for (;;) {
        token *t = cur(p);
        stmt *s = NULL;
        if (t->type == TK_EOF) {
            if (ends) {
                int k = 0;
                while (ends[k + 1]) k++;
                perr(p, t->line, "unexpected end of template, expected '%s'", ends[k]);
            }
            return head;
        } else if (t->type == TK_DATA) {
            p->pos++;
            s = mks(p, S_TEXT, t->line);
            s->s = t->s;
            s->n = t->n;
        } else if (t->type == TK_VBEGIN) {
            p->pos++;
            s = mks(p, S_OUT, t->line);
            s->e = parse_tuple_expr(p);
            if (cur(p)->type != TK_VEND) {
                char b[64];
                perr(p, cur(p)->line, "expected end of print statement '}}', got %s", tokdesc(cur(p), b, sizeof b));
            }
            p->pos++;
        } else if (t->type == TK_BBEGIN) {
            p->pos++;
            int stop = 0;
            s = parse_tag(p, in_loop, ends, endtag, &stop);
            if (stop) return head;
        } else {
            char b[64];
            perr(p, t->line, "unexpected %s", tokdesc(t, b, sizeof b));
        }
        *tail = s;
        tail = &s->next;
    }
}

/* The whole template: statements up to TK_EOF. */
stmt *jinja_parse(parser *p) { return parse_body(p, NULL, NULL, 0); }
