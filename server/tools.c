/*
 * server/: tool calling — the request's tools, tool_choice and
 * parallel_tool_calls; the grammar that enforces "required" and a named
 * function; the model's tool-call text parsed into OpenAI tool_calls.
 *
 * A family's tool-call syntax is one row of TOOL_FORMATS: the text around
 * each call and the JSON keys of the name and the arguments. The row is
 * chosen by a string the model's chat template contains; the first row is
 * also the fallback for templates without tool support, which get a
 * Hermes-style system block (server/chat.c).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

static json_t *hermes_parse(const srv_tool_format *f, const json_t *tools, const char *text, size_t len,
                            srv_text *rest);
static json_t *hermes_grammar(const srv_tool_format *f, const srv_tools *t, srv_verr *e);
static json_t *coder_parse(const srv_tool_format *f, const json_t *tools, const char *text, size_t len,
                           srv_text *rest);
static json_t *coder_grammar(const srv_tool_format *f, const srv_tools *t, srv_verr *e);
static json_t *mistral_parse(const srv_tool_format *f, const json_t *tools, const char *text, size_t len,
                             srv_text *rest);
static json_t *mistral_grammar(const srv_tool_format *f, const srv_tools *t, srv_verr *e);
static size_t hold_begin(const srv_tool_format *f, const char *text, size_t len);

/* Detection goes down the table: the first row whose string the template
 * contains (Qwen3-Coder's templates also contain "<tool_call>", so its row
 * comes before hermes). */
/* clang-format off */
static const srv_tool_format TOOL_FORMATS[] = {
    /* name          family                              template contains  begin            end             name    arguments */
    {"qwen3_coder", "Qwen3-Coder XML",                  "<function=",      "<tool_call>",   "</tool_call>", "name", "parameters",
     coder_parse, coder_grammar, hold_begin},
    {"mistral",     "Mistral [TOOL_CALLS] array",       "[TOOL_CALLS]",    "[TOOL_CALLS]",  "",             "name", "arguments",
     mistral_parse, mistral_grammar, hold_begin},
    {"hermes",      "hermes (Qwen2.5, Qwen3, Hermes)",  "<tool_call>",     "<tool_call>",   "</tool_call>", "name", "arguments",
     hermes_parse, hermes_grammar, hold_begin},
};
/* clang-format on */
#define HERMES_ROW (&TOOL_FORMATS[2]) /* the default, and the fallback for templates without tools */

const srv_tool_format *srv_tool_format_named(const char *name) {
    for (size_t i = 0; i < sizeof TOOL_FORMATS / sizeof *TOOL_FORMATS; i++)
        if (!strcmp(TOOL_FORMATS[i].name, name)) return &TOOL_FORMATS[i];
    return NULL;
}

const srv_tool_format *srv_tool_format_for(const srv_server *s) {
    if (s->tool_fmt) return s->tool_fmt;
    const char *src = s->chat.source;
    for (size_t i = 0; src && i < sizeof TOOL_FORMATS / sizeof *TOOL_FORMATS; i++)
        if (strstr(src, TOOL_FORMATS[i].detect)) return &TOOL_FORMATS[i];
    return HERMES_ROW;
}

void srv_tools_free(srv_tools *t) {
    json_decref(t->tools);
    memset(t, 0, sizeof *t);
}

static int name_ok(const char *n) {
    size_t L = strlen(n);
    if (L == 0 || L > 64) return 0;
    for (; *n; n++)
        if (!isalnum((unsigned char)*n) && *n != '_' && *n != '-' && *n != '.') return 0;
    return 1;
}

int srv_parse_tools(json_t *root, srv_tools *t, srv_verr *e) {
    memset(t, 0, sizeof *t);
    t->parallel = 1;
    json_t *tools = srv_field(root, "tools"), *tc = srv_field(root, "tool_choice");
    if (srv_get_bool(root, "parallel_tool_calls", &t->parallel, e) < 0) return -1;
    if (tools) {
        if (!json_is_array(tools) || json_array_size(tools) > 128)
            return srv_fail(e, 400, "tools", "'tools' must be an array of at most 128 function tools");
        size_t i;
        json_t *x;
        json_array_foreach(tools, i, x) {
            static const char *const known[] = {"type", "function", NULL};
            static const char *const fknown[] = {"name", "description", "parameters", "strict", NULL};
            json_t *ty = json_is_object(x) ? json_object_get(x, "type") : NULL;
            json_t *fn = json_is_object(x) ? json_object_get(x, "function") : NULL;
            json_t *nm = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
            if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_string(nm))
                return srv_fail(e, 400, "tools",
                                "tools[%zu]: must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
            if (!name_ok(json_string_value(nm)))
                return srv_fail(e, 400, "tools", "tools[%zu]: function name must be 1-64 of [A-Za-z0-9_.-]", i);
            srv_check_known(x, known, "tools[].", e);
            srv_check_known(fn, fknown, "tools[].function.", e);
            json_t *pa = json_object_get(fn, "parameters");
            if (pa && !json_is_object(pa))
                return srv_fail(e, 400, "tools", "tools[%zu]: 'parameters' must be an object", i);
            json_t *d = json_object_get(fn, "description");
            if (d && !json_is_string(d))
                return srv_fail(e, 400, "tools", "tools[%zu]: 'description' must be a string", i);
            for (size_t j = 0; j < i; j++)
                if (!strcmp(json_string_value(nm), json_string_value(json_object_get(
                                                       json_object_get(json_array_get(tools, j), "function"), "name"))))
                    return srv_fail(e, 400, "tools", "tools[%zu]: function '%s' is defined twice", i,
                                    json_string_value(nm));
        }
        if (json_array_size(tools)) t->tools = json_incref(tools);
    }
    t->choice = t->tools ? SRV_TOOL_AUTO : SRV_TOOL_NONE;
    if (tc) {
        const char *cs = json_is_string(tc) ? json_string_value(tc) : NULL;
        if (cs && !strcmp(cs, "none")) {
            t->choice = SRV_TOOL_NONE;
        } else if (cs && !strcmp(cs, "auto")) {
            if (t->tools) t->choice = SRV_TOOL_AUTO;
        } else if (cs && !strcmp(cs, "required")) {
            if (!t->tools) return srv_fail(e, 400, "tool_choice", "'tool_choice' \"required\" needs 'tools'");
            t->choice = SRV_TOOL_REQUIRED;
        } else if (json_is_object(tc)) {
            json_t *ty = json_object_get(tc, "type"), *fn = json_object_get(tc, "function");
            json_t *nm = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
            if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_string(nm))
                return srv_fail(e, 400, "tool_choice",
                                "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            size_t i;
            json_t *x;
            json_array_foreach(t->tools, i, x) {
                if (!strcmp(json_string_value(json_object_get(json_object_get(x, "function"), "name")),
                            json_string_value(nm)))
                    t->named = (int)i + 1;
            }
            if (!t->named)
                return srv_fail(e, 400, "tool_choice", "'tool_choice' names '%.64s', which is not in 'tools'",
                                json_string_value(nm));
            t->choice = SRV_TOOL_NAMED;
        } else {
            return srv_fail(e, 400, "tool_choice",
                            "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function");
        }
    }
    return 0;
}

/* The tags of the calls tool_choice allows: begin(name) + content + end. */
typedef int (*tag_fn)(json_t *fn, const char *name, json_t *params, json_t **tag);

static json_t *tags_for(const srv_tools *t, tag_fn mk, srv_verr *e) {
    json_t *tags = json_array();
    size_t i;
    json_t *x;
    if (!tags) goto oom;
    json_array_foreach(t->tools, i, x) {
        if (t->choice == SRV_TOOL_NAMED && (int)i + 1 != t->named) continue;
        json_t *fn = json_object_get(x, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *params = json_object_get(fn, "parameters");
        (void)e; /* the schemas were checked together (srv_tools_grammar) */
        json_t *tag = NULL;
        if (mk(fn, name, params, &tag) || json_array_append_new(tags, tag)) goto oom;
    }
    return tags;
oom:
    json_decref(tags);
    srv_fail(e, 500, "tools", "out of memory");
    return NULL;
}

/* JSON arguments under the function's schema, at most one whitespace
 * character where JSON allows some: a small model must not pad the
 * arguments with newlines until max_tokens. */
static json_t *json_args(json_t *params, const char *style) {
    json_t *sch = params ? json_incref(params) : json_pack("{s:s}", "type", "object");
    return json_pack("{s:s,s:o,s:i,s:s}", "type", "json_schema", "json_schema", sch, "max_whitespace_cnt", 1, "style",
                     style);
}

/* the name is [A-Za-z0-9_.-]: no escaping needed in JSON or XML */
static int hermes_tag(json_t *fn, const char *name, json_t *params, json_t **tag) {
    (void)fn;
    char begin[256];
    snprintf(begin, sizeof begin, "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", name);
    *tag = json_pack("{s:s,s:s,s:o,s:s}", "type", "tag", "begin", begin, "content", json_args(params, "json"), "end",
                     "}\n</tool_call>");
    return *tag ? 0 : -1;
}

/* One call per tag, newline-separated (hermes and qwen3_coder alike). */
static json_t *tagged_grammar(const srv_tools *t, tag_fn mk, srv_verr *e) {
    json_t *tags = tags_for(t, mk, e);
    if (!tags) return NULL;
    return json_pack("{s:s,s:{s:s,s:o,s:s,s:b,s:b}}", "type", "structural_tag", "format", "type",
                     "tags_with_separator", "tags", tags, "separator", "\n", "at_least_one", 1, "stop_after_first",
                     !t->parallel);
}

static json_t *hermes_grammar(const srv_tool_format *f, const srv_tools *t, srv_verr *e) {
    (void)f;
    return tagged_grammar(t, hermes_tag, e);
}

/* Qwen3-Coder: <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...</function>\n</tool_call>,
 * the parameters as xgrammar's "qwen_xml" rendering of the schema. */
static int coder_tag(json_t *fn, const char *name, json_t *params, json_t **tag) {
    (void)fn;
    char begin[256];
    snprintf(begin, sizeof begin, "<tool_call>\n<function=%s>\n", name);
    *tag = json_pack("{s:s,s:s,s:o,s:s}", "type", "tag", "begin", begin, "content", json_args(params, "qwen_xml"),
                     "end", "\n</function>\n</tool_call>");
    return *tag ? 0 : -1;
}

static json_t *coder_grammar(const srv_tool_format *f, const srv_tools *t, srv_verr *e) {
    (void)f;
    return tagged_grammar(t, coder_tag, e);
}

/* Mistral: [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]: one marker,
 * then one JSON array of every call. */
static int mistral_tag(json_t *fn, const char *name, json_t *params, json_t **tag) {
    (void)fn;
    char begin[256];
    snprintf(begin, sizeof begin, "{\"name\": \"%s\", \"arguments\": ", name);
    *tag = json_pack("{s:s,s:s,s:o,s:s}", "type", "tag", "begin", begin, "content", json_args(params, "json"), "end",
                     "}");
    return *tag ? 0 : -1;
}

static json_t *mistral_grammar(const srv_tool_format *f, const srv_tools *t, srv_verr *e) {
    (void)f;
    json_t *tags = tags_for(t, mistral_tag, e);
    if (!tags) return NULL;
    return json_pack("{s:s,s:{s:s,s:[{s:s,s:s},{s:s,s:o,s:s,s:b,s:b},{s:s,s:s}]}}", "type", "structural_tag", "format",
                     "type", "sequence", "elements", "type", "const_string", "value", "[TOOL_CALLS][", "type",
                     "tags_with_separator", "tags", tags, "separator", ", ", "at_least_one", 1, "stop_after_first",
                     !t->parallel, "type", "const_string", "value", "]");
}

int srv_tools_grammar(srv_server *s, const srv_tools *t, int client_fd, gram_grammar **out, srv_verr *e) {
    if (t->choice != SRV_TOOL_REQUIRED && t->choice != SRV_TOOL_NAMED) return 0; /* *out untouched */
    *out = NULL;
    const srv_tool_format *f = srv_tool_format_for(s);
    /* every schema of the grammar under one budget: 128 tools must not
     * cost 128 times the worst compile */
    json_t *all[128];
    size_t n_all = 0, i;
    json_t *x;
    json_array_foreach(t->tools, i, x) {
        json_t *params = json_object_get(json_object_get(x, "function"), "parameters");
        if ((t->choice != SRV_TOOL_NAMED || (int)i + 1 == t->named) && params && n_all < 128) all[n_all++] = params;
    }
    if (srv_schemas_check(all, n_all, "tools", e)) return -1;
    json_t *st = f->grammar(f, t, e);
    if (!st) return e->status ? -1 : srv_fail(e, 500, "tools", "out of memory");
    char *src = json_dumps(st, JSON_COMPACT);
    json_decref(st);
    if (!src) return srv_fail(e, 500, "tools", "out of memory");
    int rc = srv_compile_constraint(s, client_fd, GRAM_STRUCTURAL, src, strlen(src), "tool_choice", out, e);
    free(src);
    return rc;
}

/* Skip JSON whitespace. */
static const char *ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

static int starts(const char *p, const char *end, const char *lit) {
    size_t L = strlen(lit);
    return (size_t)(end - p) >= L && !memcmp(p, lit, L);
}

/* Up to the first begin marker, and short of a tail that could be the
 * start of one (every row's rule: calls are whole at the end). */
static size_t hold_begin(const srv_tool_format *f, const char *text, size_t len) {
    if (len == 0) return 0; /* text may be NULL then */
    size_t bl = strlen(f->begin);
    const char *b = memmem(text, len, f->begin, bl);
    if (b) return (size_t)(b - text);
    for (size_t k = bl - 1; k > 0; k--)
        if (k <= len && !memcmp(text + len - k, f->begin, k)) return len - k;
    return len;
}

static json_t *call_new(const char *name, size_t nl, json_t *args) {
    char *a = json_dumps(args, JSON_COMPACT);
    json_t *c = a ? json_pack("{s:s%,s:s}", "name", name, nl, "arguments", a) : NULL;
    free(a);
    return c;
}

/* Hermes: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one per marker. */
static json_t *hermes_parse(const srv_tool_format *f, const json_t *tools, const char *text, size_t len,
                            srv_text *rest) {
    (void)tools;
    json_t *calls = json_array();
    if (!calls) return NULL;
    const char *p = text, *end = text + len;
    size_t bl = strlen(f->begin), el = strlen(f->end);
    while (p < end) {
        const char *b = memmem(p, (size_t)(end - p), f->begin, bl);
        if (!b) break;
        const char *js = b + bl, *e = memmem(js, (size_t)(end - js), f->end, el);
        const char *jend = e ? e : end;
        json_error_t je;
        js = ws(js, jend);
        json_t *obj = json_loadb(js, (size_t)(jend - js), JSON_DISABLE_EOF_CHECK, &je);
        json_t *nm = json_is_object(obj) ? json_object_get(obj, f->name_key) : NULL;
        json_t *ar = json_is_object(obj) ? json_object_get(obj, f->args_key) : NULL;
        if (!json_is_string(nm) || (ar && !json_is_object(ar))) {
            json_decref(obj);
            break; /* not a call: the rest is content */
        }
        json_t *empty = json_object();
        json_t *call = call_new(json_string_value(nm), json_string_length(nm), ar ? ar : empty);
        json_decref(empty);
        json_decref(obj);
        if (!call || json_array_append_new(calls, call) ||
            (json_array_size(calls) == 1 && srv_text_put(rest, p, (size_t)(b - p))))
            goto fail;
        p = e ? e + el : end;
    }
    if (json_array_size(calls) == 0 && srv_text_put(rest, p, (size_t)(end - p))) goto fail;
    return calls;
fail:
    json_decref(calls);
    return NULL;
}

/* The schema of parameter key of function name in tools, NULL. */
static json_t *param_schema(const json_t *tools, const char *name, size_t nl, const char *key, size_t kl) {
    size_t i;
    json_t *x;
    json_array_foreach((json_t *)tools, i, x) {
        json_t *fn = json_object_get(x, "function");
        json_t *nm = json_object_get(fn, "name");
        if (!json_is_string(nm) || json_string_length(nm) != nl || memcmp(json_string_value(nm), name, nl)) continue;
        json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
        return json_is_object(props) ? json_object_getn(props, key, kl) : NULL;
    }
    return NULL;
}

static int type_has(json_t *sch, const char *t) {
    json_t *ty = json_object_get(sch, "type");
    if (json_is_string(ty)) return !strcmp(json_string_value(ty), t);
    size_t i;
    json_t *x;
    json_array_foreach(ty, i, x) if (json_is_string(x) && !strcmp(json_string_value(x), t)) return 1;
    return 0;
}

/* A Qwen3-Coder parameter's text as the JSON value its schema types it:
 * strings stay text; numbers, booleans, null, objects and arrays are read
 * as JSON when they parse as one of the allowed types; anything else (and a
 * parameter the schema does not name) stays a string. */
static json_t *typed_value(json_t *sch, const char *v, size_t vl) {
    if (sch && !type_has(sch, "string")) {
        json_error_t je;
        json_t *j = json_loadb(v, vl, JSON_DECODE_ANY, &je);
        int ok = j && ((json_is_integer(j) && (type_has(sch, "integer") || type_has(sch, "number"))) ||
                       (json_is_real(j) && type_has(sch, "number")) ||
                       (json_is_boolean(j) && type_has(sch, "boolean")) || (json_is_null(j) && type_has(sch, "null")) ||
                       (json_is_object(j) && type_has(sch, "object")) || (json_is_array(j) && type_has(sch, "array")) ||
                       (!json_object_get(sch, "type") && !json_is_string(j)));
        if (ok) return j;
        json_decref(j);
    }
    return json_stringn(v, vl);
}

static json_t *coder_parse(const srv_tool_format *f, const json_t *tools, const char *text, size_t len,
                           srv_text *rest) {
    (void)f;
    json_t *calls = json_array();
    if (!calls) return NULL;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *b = memmem(p, (size_t)(end - p), "<tool_call>", 11);
        if (!b) break;
        const char *q = ws(b + 11, end);
        if (!starts(q, end, "<function=")) break;
        const char *nm = q + 10, *ne = memchr(nm, '>', (size_t)(end - nm));
        if (!ne || ne == nm || ne - nm > 64) break;
        json_t *args = json_object();
        q = ne + 1;
        int ok = 0;
        for (;;) {
            q = ws(q, end);
            if (starts(q, end, "</function>")) {
                q += 11;
                ok = 1;
                break;
            }
            if (!starts(q, end, "<parameter=")) break;
            const char *k = q + 11, *ke = memchr(k, '>', (size_t)(end - k));
            if (!ke || ke == k) break;
            const char *v = ke + 1, *ve = memmem(v, (size_t)(end - v), "</parameter>", 12);
            if (!ve) break;
            const char *v1 = ve;
            /* the value sits on lines of its own, and the grammar allows a
             * whitespace character around it: layout, not value */
            while (v < v1 && isspace((unsigned char)*v))
                v++;
            while (v1 > v && isspace((unsigned char)v1[-1]))
                v1--;
            json_t *val = typed_value(tools ? param_schema(tools, nm, (size_t)(ne - nm), k, (size_t)(ke - k)) : NULL,
                                      v, (size_t)(v1 - v));
            if (!val || json_object_setn_new(args, k, (size_t)(ke - k), val)) break;
            q = ve + 12;
        }
        if (ok) {
            q = ws(q, end);
            if (starts(q, end, "</tool_call>")) q += 12;
            else if (q < end) ok = 0; /* something else after the function: not a call */
        }
        json_t *call = ok ? call_new(nm, (size_t)(ne - nm), args) : NULL;
        json_decref(args);
        if (!ok) break;
        if (!call || json_array_append_new(calls, call) ||
            (json_array_size(calls) == 1 && srv_text_put(rest, p, (size_t)(b - p))))
            goto fail;
        p = q;
    }
    if (json_array_size(calls) == 0 && srv_text_put(rest, p, (size_t)(end - p))) goto fail;
    return calls;
fail:
    json_decref(calls);
    return NULL;
}

static json_t *mistral_parse(const srv_tool_format *f, const json_t *tools, const char *text, size_t len,
                             srv_text *rest) {
    (void)tools;
    json_t *calls = json_array();
    if (!calls) return NULL;
    const char *p = text, *end = text + len;
    size_t bl = strlen(f->begin);
    while (p < end) {
        const char *b = memmem(p, (size_t)(end - p), f->begin, bl);
        if (!b) break;
        const char *js = ws(b + bl, end);
        json_error_t je;
        json_t *arr = json_loadb(js, (size_t)(end - js), JSON_DISABLE_EOF_CHECK, &je);
        if (json_is_object(arr)) { /* a single call without the array */
            json_t *a = json_array();
            json_array_append_new(a, arr);
            arr = a;
        }
        size_t n = json_array_size(arr), i;
        json_t *x;
        int ok = json_is_array(arr) && n > 0;
        json_array_foreach(arr, i, x) {
            json_t *nm = json_object_get(x, f->name_key), *ar = json_object_get(x, f->args_key);
            if (!json_is_string(nm) || (ar && !json_is_object(ar))) ok = 0;
        }
        if (!ok) {
            json_decref(arr);
            break;
        }
        if (json_array_size(calls) == 0 && srv_text_put(rest, p, (size_t)(b - p))) goto fail_arr;
        json_array_foreach(arr, i, x) {
            json_t *nm = json_object_get(x, f->name_key), *ar = json_object_get(x, f->args_key);
            json_t *empty = json_object();
            json_t *call = call_new(json_string_value(nm), json_string_length(nm), ar ? ar : empty);
            json_decref(empty);
            if (!call || json_array_append_new(calls, call)) goto fail_arr;
        }
        json_decref(arr);
        p = js + je.position;
        continue;
    fail_arr:
        json_decref(arr);
        goto fail;
    }
    if (json_array_size(calls) == 0 && srv_text_put(rest, p, (size_t)(end - p))) goto fail;
    return calls;
fail:
    json_decref(calls);
    return NULL;
}

json_t *srv_tool_calls_parse_typed(const srv_tool_format *f, const json_t *tools, const char *text, size_t len,
                                   const char *id_base, char **content, size_t *content_len) {
    srv_text rest = {0};
    json_t *raw = len ? f->parse(f, tools, text, len, &rest) : NULL;
    json_t *calls = NULL;
    if (!raw || json_array_size(raw) == 0) goto out;
    if (!(calls = json_array())) goto out;
    size_t i;
    json_t *x;
    json_array_foreach(raw, i, x) {
        char id[96];
        snprintf(id, sizeof id, "call_%s%02zx", id_base, i);
        json_t *call = json_pack("{s:s,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function", "name",
                                 json_object_get(x, "name"), "arguments", json_object_get(x, "arguments"));
        if (!call || json_array_append_new(calls, call)) {
            json_decref(calls);
            calls = NULL;
            goto out;
        }
    }
    /* Content is the text before the first call, as it is (a stream has
     * sent exactly that by then: each row's hold-back rule stops at the
     * first begin marker); what follows the calls, a call cut at
     * max_tokens included, is not content, streamed or not. */
    char *c = malloc(rest.len + 1);
    if (!c) {
        json_decref(calls);
        calls = NULL;
        goto out;
    }
    if (rest.len) memcpy(c, rest.p, rest.len);
    c[rest.len] = 0;
    *content = c;
    *content_len = rest.len;
out:
    json_decref(raw);
    srv_text_free(&rest);
    return calls;
}

json_t *srv_tool_calls_parse(const srv_tool_format *f, const char *text, size_t len, const char *id_base,
                             char **content, size_t *content_len) {
    return srv_tool_calls_parse_typed(f, NULL, text, len, id_base, content, content_len);
}

/* The tool definitions as a Hermes-style system block, for chat templates
 * that do not render tools themselves (Qwen2.5's wording). */
char *srv_tools_system_block(const json_t *tools) {
    size_t cap = 1024, i;
    json_t *x;
    json_array_foreach(tools, i, x) {
        char *d = json_dumps(x, JSON_COMPACT);
        if (d) cap += strlen(d) + 1;
        free(d);
    }
    char *b = malloc(cap + 1024);
    if (!b) return NULL;
    size_t n =
        (size_t)sprintf(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                           "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    json_array_foreach(tools, i, x) {
        char *d = json_dumps(x, JSON_COMPACT);
        if (!d) continue;
        n += (size_t)sprintf(b + n, "\n%s", d);
        free(d);
    }
    sprintf(b + n, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                   "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                   "<args-json-object>}\n</tool_call>");
    return b;
}
