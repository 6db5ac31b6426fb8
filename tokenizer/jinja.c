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
 *
 * Files: jinja_lex.c (source to tokens), jinja_parse.c (tokens to AST, and
 * tok_template_compile/free), jinja_eval.c (the evaluator), jinja_filters.c
 * (filters, tests, methods), jinja_pystr.c (Python str semantics),
 * jinja_value.c (values), jinja_json.c (context in, tojson out), all over
 * jinja_internal.h; this file is the public API: compile, render, free.
 */
#include "tokenizer/jinja_internal.h"

static size_t utf8_valid_prefix(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return len;
}

int tok_template_compile(const char *src, size_t len, tok_template **out, char *err, size_t errlen) {
    if (out) *out = NULL;
    if ((!src && len) || !out) return jerr(err, errlen, TOK_EINVAL, "tok_template_compile: bad arguments");
    size_t bad = utf8_valid_prefix(src ? src : "", len);
    if (bad != len) return jerr(err, errlen, TOK_EINVAL, "template is not valid UTF-8 (byte %zu)", bad);
    tok_template *t = calloc(1, sizeof *t);
    if (!t) return jerr(err, errlen, TOK_ENOMEM, "out of memory");
    jmp_buf jb;
    t->a.jb = &jb;
    t->a.err = err;
    t->a.errlen = errlen;
    if (setjmp(jb)) {
        arena_free(&t->a);
        free(t);
        return TOK_EFORMAT;
    }
    /* jinja2 normalizes newlines to \n and drops one trailing newline */
    char *s = aalloc(&t->a, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    parser p = {&t->a, NULL, 0, 0, 0, 0};
    jinja_lex(&p, s, n);
    if (!p.n || p.t[p.n - 1].type != TK_EOF) push_tok(&p, TK_EOF, 0);
    t->body = jinja_parse(&p);
    t->a.jb = NULL;
    t->a.err = NULL;
    *out = t;
    return TOK_OK;
}

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
    root->vars = ctx ? jinja_from_json(R, ctx, 0).u.d : dict_new(R);
    json_decref(ctx);
    ctx = NULL;
    R->root = root;
    sbuf o = {0};
    R->out = &o;
    jinja_exec_body(R, t->body, root);
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

void tok_template_free(tok_template *t) {
    if (!t) return;
    arena_free(&t->a);
    free(t);
}
