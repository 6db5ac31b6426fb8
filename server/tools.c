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

/* clang-format off */
static const srv_tool_format TOOL_FORMATS[] = {
    /* family                          template contains  begin            end              name    arguments */
    {"hermes (Qwen2.5, Qwen3, Hermes)", "<tool_call>",     "<tool_call>\n", "\n</tool_call>", "name", "arguments"},
};
/* clang-format on */

const srv_tool_format *srv_tool_format_for(const srv_server *s) {
    const char *src = s->chat.source;
    for (size_t i = 0; src && i < sizeof TOOL_FORMATS / sizeof *TOOL_FORMATS; i++)
        if (strstr(src, TOOL_FORMATS[i].detect)) return &TOOL_FORMATS[i];
    return &TOOL_FORMATS[0];
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

/* "required" / a named function: the output is one (or, with parallel
 * tool calls, one or more) calls in the family's syntax, each a function's
 * name and arguments valid under its parameters schema; as an xgrammar
 * structural tag (tags_with_separator, at_least_one). */
int srv_tools_grammar(srv_server *s, const srv_tools *t, int client_fd, gram_grammar **out, srv_verr *e) {
    if (t->choice != SRV_TOOL_REQUIRED && t->choice != SRV_TOOL_NAMED) return 0; /* *out untouched */
    *out = NULL;
    const srv_tool_format *f = srv_tool_format_for(s);
    json_t *tags = json_array();
    size_t i;
    json_t *x;
    int rc = -1;
    char *src = NULL;
    /* every schema of the grammar under one budget: 128 tools must not
     * cost 128 times the worst compile */
    json_t *all[128];
    size_t n_all = 0;
    json_array_foreach(t->tools, i, x) {
        json_t *params = json_object_get(json_object_get(x, "function"), "parameters");
        if ((t->choice != SRV_TOOL_NAMED || (int)i + 1 == t->named) && params && n_all < 128) all[n_all++] = params;
    }
    if (srv_schemas_check(all, n_all, "tools", e)) goto out;
    json_array_foreach(t->tools, i, x) {
        if (t->choice == SRV_TOOL_NAMED && (int)i + 1 != t->named) continue;
        json_t *fn = json_object_get(x, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *params = json_object_get(fn, "parameters");
        char begin[256];
        /* the name is [A-Za-z0-9_.-]: no JSON escaping needed */
        snprintf(begin, sizeof begin, "%s{\"%s\": \"%s\", \"%s\": ", f->begin, f->name_key, name, f->args_key);
        char end[64];
        snprintf(end, sizeof end, "}%s", f->end);
        json_t *sch = params ? json_incref(params) : json_pack("{s:s}", "type", "object");
        /* at most one whitespace character where JSON allows some: a small
         * model must not pad the arguments with newlines until max_tokens */
        json_t *tag = json_pack("{s:s,s:s,s:{s:s,s:o,s:i},s:s}", "type", "tag", "begin", begin, "content", "type",
                                "json_schema", "json_schema", sch, "max_whitespace_cnt", 1, "end", end);
        if (!tag || json_array_append_new(tags, tag)) goto oom;
    }
    json_t *st =
        json_pack("{s:s,s:{s:s,s:o,s:s,s:b,s:b}}", "type", "structural_tag", "format", "type", "tags_with_separator",
                  "tags", tags, "separator", "\n", "at_least_one", 1, "stop_after_first", !t->parallel);
    tags = NULL;
    if (!st) goto oom;
    src = json_dumps(st, JSON_COMPACT);
    json_decref(st);
    if (!src) goto oom;
    rc = srv_compile_constraint(s, client_fd, GRAM_STRUCTURAL, src, strlen(src), "tool_choice", out, e);
    goto out;
oom:
    srv_fail(e, 500, "tools", "out of memory");
out:
    json_decref(tags);
    free(src);
    return rc;
}

/* Skip JSON whitespace. */
static const char *ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

json_t *srv_tool_calls_parse(const srv_tool_format *f, const char *text, size_t len, const char *id_base,
                             char **content, size_t *content_len) {
    json_t *calls = json_array();
    char *rest = malloc(len + 1);
    size_t rl = 0;
    if (!calls || !rest) goto fail;
    const char *p = text, *end = text + len;
    /* the begin marker without its trailing newline, as models vary there */
    size_t bl = strcspn(f->begin, "\n"), el;
    const char *ebody = f->end;
    while (*ebody == '\n')
        ebody++;
    el = strlen(ebody);
    const char *first = NULL; /* the first call's begin marker */
    while (p < end) {
        const char *b = memmem(p, (size_t)(end - p), f->begin, bl);
        if (!b) break;
        const char *js = b + bl, *e = memmem(js, (size_t)(end - js), ebody, el);
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
        if (!first) first = b;
        char *args = ar ? json_dumps(ar, JSON_COMPACT) : strdup("{}");
        char id[96];
        snprintf(id, sizeof id, "call_%s%02zx", id_base, json_array_size(calls));
        json_t *call = args ? json_pack("{s:s,s:s,s:{s:O,s:s}}", "id", id, "type", "function", "function", "name", nm,
                                        "arguments", args)
                            : NULL;
        free(args);
        json_decref(obj);
        if (!call || json_array_append_new(calls, call)) goto fail;
        p = e ? e + el : end;
    }
    if (json_array_size(calls) == 0) {
        json_decref(calls);
        free(rest);
        return NULL;
    }
    /* Content is the text before the first call, as it is (a stream has
     * sent exactly that by then); what follows the calls, a call cut at
     * max_tokens included, is not content, streamed or not. */
    rl = (size_t)(first - text);
    memcpy(rest, text, rl);
    rest[rl] = 0;
    *content = rest;
    *content_len = rl;
    return calls;
fail:
    json_decref(calls);
    free(rest);
    return NULL;
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
