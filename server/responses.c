/*
 * server/: POST /v1/responses, OpenAI's Responses API (what Codex CLI
 * speaks), over the chat-completions path. The request's input items,
 * instructions, tools and text.format become a chat body (messages, tools,
 * response_format, max_tokens), which srv_gen_prepare_json validates,
 * renders through the chat template and tokenizes as /v1/chat/completions
 * does; the answer's text is split into output items: reasoning (a
 * <think> block), a message with output_text, function_call items (the
 * tool-call format row of tools.c). stream:true sends the Responses event
 * sequence. Finished responses are kept in an in-memory store (bounded by
 * count and bytes, least recently used dropped first) for
 * previous_response_id; server/README.md has the field list.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/internal.h"

/* ---- the store: response id -> the conversation so far (chat messages) ---- */

typedef struct resp_entry {
    char id[64];
    json_t *msgs; /* never modified once stored; handed out as deep copies */
    size_t bytes;
    struct resp_entry *prev, *next; /* most recently used first */
} resp_entry;

struct srv_resp_store {
    pthread_mutex_t mu;
    resp_entry *head, *tail;
    int n, max_n;
    size_t bytes, max_bytes;
};

struct srv_resp_store *srv_resp_store_new(int max_count, size_t max_bytes) {
    struct srv_resp_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    pthread_mutex_init(&st->mu, NULL);
    st->max_n = max_count;
    st->max_bytes = max_bytes;
    return st;
}

static void entry_unlink(struct srv_resp_store *st, resp_entry *e) {
    if (e->prev) e->prev->next = e->next;
    else st->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else st->tail = e->prev;
    e->prev = e->next = NULL;
}

static void entry_push_front(struct srv_resp_store *st, resp_entry *e) {
    e->next = st->head;
    e->prev = NULL;
    if (st->head) st->head->prev = e;
    st->head = e;
    if (!st->tail) st->tail = e;
}

void srv_resp_store_free(struct srv_resp_store *st) {
    if (!st) return;
    for (resp_entry *e = st->head, *nx; e; e = nx) {
        nx = e->next;
        json_decref(e->msgs);
        free(e);
    }
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* Takes msgs. A conversation larger than the whole budget is not kept. */
static void store_put(struct srv_resp_store *st, const char *id, json_t *msgs) {
    if (!st) {
        json_decref(msgs);
        return;
    }
    char *txt = json_dumps(msgs, JSON_COMPACT);
    size_t bytes = (txt ? strlen(txt) : 0) + sizeof(resp_entry);
    free(txt);
    resp_entry *e = calloc(1, sizeof *e);
    if (!e || bytes > st->max_bytes) {
        free(e);
        json_decref(msgs);
        return;
    }
    snprintf(e->id, sizeof e->id, "%s", id);
    e->msgs = msgs;
    e->bytes = bytes;
    pthread_mutex_lock(&st->mu);
    entry_push_front(st, e);
    st->n++;
    st->bytes += bytes;
    while (st->tail && st->tail != e && (st->n > st->max_n || st->bytes > st->max_bytes)) {
        resp_entry *old = st->tail;
        entry_unlink(st, old);
        st->n--;
        st->bytes -= old->bytes;
        json_decref(old->msgs);
        free(old);
    }
    pthread_mutex_unlock(&st->mu);
}

/* A copy of the stored conversation (NULL: unknown id, or out of memory). */
static json_t *store_get(struct srv_resp_store *st, const char *id, size_t len) {
    json_t *out = NULL;
    if (!st) return NULL;
    pthread_mutex_lock(&st->mu);
    for (resp_entry *e = st->head; e; e = e->next)
        if (strlen(e->id) == len && !memcmp(e->id, id, len)) {
            entry_unlink(st, e);
            entry_push_front(st, e);
            out = json_deep_copy(e->msgs);
            break;
        }
    pthread_mutex_unlock(&st->mu);
    return out;
}

/* The answer's text split into reasoning and content by the server's
 * reasoning parser (reasoning.c's srv_reasoner, as chat completions split
 * it: the format chosen from the template, a tool-call marker ending the
 * block). `final` 0: text is a prefix of the answer; a tail that may still
 * become a marker is held back, so every later call's parts extend the
 * earlier ones (the splitter's result does not depend on how the text was
 * cut). Free with resp_split_free. */
typedef struct resp_split {
    int has_reasoning, reasoning_closed;
    srv_text r, c; /* reasoning text, content text (markers removed) */
} resp_split;

static size_t partial_tail(const char *t, size_t n, const char *marker) {
    size_t m = strlen(marker);
    for (size_t k = m - 1; k > 0; k--)
        if (k <= n && !memcmp(t + n - k, marker, k)) return k;
    return 0;
}

static void resp_split_reasoning(const srv_req *r, const char *t, size_t n, int final, resp_split *v) {
    memset(v, 0, sizeof *v);
    srv_reasoner z;
    srv_reasoner_init(&z, r->rz_on ? r->rz.f : NULL, r->rz_state0, r->rz_stop);
    srv_reasoner_feed(&z, t, n, &v->r, &v->c);
    if (final) srv_reasoner_flush(&z, &v->r, &v->c);
    v->has_reasoning = z.opened;
    v->reasoning_closed = z.opened && z.state == SRV_RZ_CONTENT;
}

#define RZ_P(v) ((v).r.p ? (v).r.p : "")
#define CT_P(v) ((v).c.p ? (v).c.p : "")

static void resp_split_free(resp_split *v) {
    srv_text_free(&v->r);
    srv_text_free(&v->c);
}

/* ---- request: Responses body -> chat body ---- */

/* clang-format off */
static const char *const RESP_FIELDS[] = {
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
    "parallel_tool_calls", "text", "stream", "store", "previous_response_id", "reasoning", "metadata", "user",
    "truncation", "include", "service_tier", "prompt_cache_key", "safety_identifier", "background",
    "max_tool_calls", "stream_options",
    /* vLLM's extras, passed to the chat path as they are */
    "top_k", "seed", "stop", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
    /* testing only: the chat path refuses it without --debug-request-fields */
    "debug_force_output",
    NULL};
/* clang-format on */
static const char *const PASS_THROUGH[] = {"temperature", "top_p",   "top_k",          "seed",
                                           "stop",        "min_p",   "repetition_penalty", "presence_penalty",
                                           "frequency_penalty", "debug_force_output", NULL};

typedef struct resp_req {
    json_t *chat;    /* the chat body */
    json_t *history; /* the conversation without instructions (messages), for the store */
    json_t *echo;    /* request fields the response object repeats */
    int stream, store;
    char dropped[256]; /* tool types left out, for the warning */
} resp_req;

static void resp_req_free(resp_req *q) {
    json_decref(q->chat);
    json_decref(q->history);
    json_decref(q->echo);
    memset(q, 0, sizeof *q);
}

static void note_dropped(resp_req *q, const char *what) {
    char one[80];
    snprintf(one, sizeof one, "%.60s", what);
    if (strstr(q->dropped, one)) return;
    size_t l = strlen(q->dropped);
    if (l + strlen(one) + 3 < sizeof q->dropped)
        snprintf(q->dropped + l, sizeof q->dropped - l, "%s%s", l ? ", " : "", one);
}

/* A content (string, or parts of text) as one string; NULL with e set. */
static json_t *content_string(json_t *c, const char *param, srv_verr *e) {
    if (!c) return json_string("");
    if (json_is_string(c)) return json_incref(c);
    if (!json_is_array(c))
        return srv_fail(e, 400, param, "'%s' must be a string or an array of content parts", param), NULL;
    size_t total = 0, i;
    json_t *p;
    json_array_foreach(c, i, p) {
        json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        const char *ty = json_is_string(t) ? json_string_value(t) : "";
        json_t *tx = json_is_object(p) ? json_object_get(p, !strcmp(ty, "refusal") ? "refusal" : "text") : NULL;
        if ((strcmp(ty, "input_text") && strcmp(ty, "output_text") && strcmp(ty, "text") && strcmp(ty, "refusal") &&
             strcmp(ty, "reasoning_text") && strcmp(ty, "summary_text")) ||
            !json_is_string(tx))
            return srv_fail(e, 400, param,
                            "'%s': only text parts (input_text, output_text) are supported, got part %zu", param, i),
                   NULL;
        total += json_string_length(tx);
    }
    char *buf = malloc(total + 1);
    if (!buf) return srv_fail(e, 500, param, "out of memory"), NULL;
    size_t off = 0;
    json_array_foreach(c, i, p) {
        const char *ty = json_string_value(json_object_get(p, "type"));
        json_t *tx = json_object_get(p, !strcmp(ty, "refusal") ? "refusal" : "text");
        memcpy(buf + off, json_string_value(tx), json_string_length(tx));
        off += json_string_length(tx);
    }
    json_t *s = json_stringn(buf, off);
    free(buf);
    if (!s) srv_fail(e, 400, param, "'%s' is not valid UTF-8 text", param);
    return s;
}

/* The last message when it is an assistant turn that calls may join. */
static json_t *open_assistant(json_t *msgs) {
    size_t n = json_array_size(msgs);
    json_t *m = n ? json_array_get(msgs, n - 1) : NULL;
    const char *r = m ? json_string_value(json_object_get(m, "role")) : NULL;
    return r && !strcmp(r, "assistant") ? m : NULL;
}

/* input items -> chat messages appended to msgs. */
static int input_items(json_t *input, json_t *msgs, resp_req *q, srv_verr *e) {
    if (json_is_string(input)) {
        if (json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", input)))
            return srv_fail(e, 500, "input", "out of memory");
        return 0;
    }
    if (!json_is_array(input)) return srv_fail(e, 400, "input", "'input' must be a string or an array of items");
    if (json_array_size(input) > 65536) return srv_fail(e, 400, "input", "too many input items");
    json_t *reasoning = NULL; /* a reasoning item's text, for the assistant turn after it */
    size_t i;
    json_t *it;
    json_array_foreach(input, i, it) {
        char param[48];
        snprintf(param, sizeof param, "input[%zu]", i);
        if (!json_is_object(it)) return srv_fail(e, 400, "input", "%s must be an object", param);
        json_t *tv = json_object_get(it, "type");
        if (tv && !json_is_string(tv)) return srv_fail(e, 400, "input", "%s.type must be a string", param);
        const char *type = tv ? json_string_value(tv) : "message"; /* easy input: {role, content} */
        if (!strcmp(type, "message")) {
            json_t *role = json_object_get(it, "role");
            const char *r = json_is_string(role) ? json_string_value(role) : "";
            if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer"))
                return srv_fail(e, 400, "input", "%s.role must be one of user, assistant, system, developer", param);
            json_t *content = content_string(srv_field(it, "content"), "input", e);
            if (!content) return -1;
            json_t *m = json_pack("{s:s,s:o}", "role", r, "content", content);
            if (m && reasoning && !strcmp(r, "assistant")) {
                json_object_set_new(m, "reasoning_content", reasoning);
                reasoning = NULL;
            }
            if (!m || json_array_append_new(msgs, m)) return srv_fail(e, 500, "input", "out of memory");
        } else if (!strcmp(type, "function_call")) {
            json_t *cid = json_object_get(it, "call_id"), *nm = json_object_get(it, "name"),
                   *ar = json_object_get(it, "arguments");
            if (!json_is_string(cid) || !json_is_string(nm) || !json_is_string(ar))
                return srv_fail(e, 400, "input", "%s (function_call) needs call_id, name and arguments strings",
                                param);
            json_t *call = json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", cid, "type", "function", "function", "name", nm,
                                     "arguments", ar);
            json_t *m = open_assistant(msgs);
            if (m && !json_is_array(json_object_get(m, "tool_calls")))
                json_object_set_new(m, "tool_calls", json_array());
            if (!m) {
                m = json_pack("{s:s,s:s,s:[]}", "role", "assistant", "content", "", "tool_calls");
                if (m && reasoning) {
                    json_object_set_new(m, "reasoning_content", reasoning);
                    reasoning = NULL;
                }
                if (!m || json_array_append_new(msgs, m)) {
                    json_decref(call);
                    return srv_fail(e, 500, "input", "out of memory");
                }
            }
            if (!call || json_array_append_new(json_object_get(m, "tool_calls"), call))
                return srv_fail(e, 500, "input", "out of memory");
        } else if (!strcmp(type, "function_call_output")) {
            json_t *cid = json_object_get(it, "call_id");
            if (!json_is_string(cid))
                return srv_fail(e, 400, "input", "%s (function_call_output) needs a call_id string", param);
            json_t *out = content_string(srv_field(it, "output"), "input", e);
            if (!out) return -1;
            json_t *m = json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", cid, "content", out);
            if (!m || json_array_append_new(msgs, m)) return srv_fail(e, 500, "input", "out of memory");
        } else if (!strcmp(type, "reasoning")) {
            /* its text (content, else summary) goes with the next assistant turn */
            json_t *parts = srv_field(it, "content");
            if (!parts || (json_is_array(parts) && !json_array_size(parts))) parts = srv_field(it, "summary");
            json_t *txt = content_string(parts, "input", e);
            if (!txt) return -1;
            json_decref(reasoning);
            reasoning = txt;
        } else {
            /* item_reference, the built-in tools' calls and outputs, ...: not ours */
            char w[96];
            snprintf(w, sizeof w, "input item type '%.40s'", type);
            note_dropped(q, w);
        }
    }
    json_decref(reasoning);
    return 0;
}

/* Responses tools (flat function objects) -> chat tools; other types are
 * dropped with a warning (Codex sends web_search, local_shell, custom,
 * namespaces beside its functions). */
static int map_tools(json_t *tools, json_t *out, resp_req *q, srv_verr *e) {
    if (!json_is_array(tools)) return srv_fail(e, 400, "tools", "'tools' must be an array");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *tv = json_is_object(t) ? json_object_get(t, "type") : NULL;
        if (!json_is_string(tv)) return srv_fail(e, 400, "tools", "tools[%zu] needs a string 'type'", i);
        const char *type = json_string_value(tv);
        if (strcmp(type, "function") != 0) {
            char w[96];
            snprintf(w, sizeof w, "tool type '%.40s'", type);
            note_dropped(q, w);
            continue;
        }
        json_t *nm = json_object_get(t, "name");
        if (!json_is_string(nm) || !json_string_length(nm))
            return srv_fail(e, 400, "tools", "tools[%zu] (function) needs a non-empty 'name'", i);
        json_t *fn = json_pack("{s:O}", "name", nm);
        static const char *const keys[] = {"description", "parameters", "strict", NULL};
        for (int k = 0; fn && keys[k]; k++)
            if (srv_field(t, keys[k])) json_object_set(fn, keys[k], json_object_get(t, keys[k]));
        if (!fn || json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn)))
            return srv_fail(e, 500, "tools", "out of memory");
    }
    return 0;
}

static int map_tool_choice(json_t *tc, json_t *chat, resp_req *q, srv_verr *e) {
    if (json_is_string(tc)) return json_object_set(chat, "tool_choice", tc) ? srv_fail(e, 500, NULL, "oom") : 0;
    if (!json_is_object(tc))
        return srv_fail(e, 400, "tool_choice", "'tool_choice' must be a string or an object");
    json_t *tv = json_object_get(tc, "type");
    const char *type = json_is_string(tv) ? json_string_value(tv) : "";
    if (!strcmp(type, "function")) {
        json_t *nm = json_object_get(tc, "name");
        if (!json_is_string(nm)) return srv_fail(e, 400, "tool_choice", "'tool_choice' of type function needs a 'name'");
        json_t *v = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", nm);
        return !v || json_object_set_new(chat, "tool_choice", v) ? srv_fail(e, 500, NULL, "out of memory") : 0;
    }
    /* a built-in tool or allowed_tools: the model chooses among the functions */
    char w[96];
    snprintf(w, sizeof w, "tool_choice type '%.40s' (auto used)", type);
    note_dropped(q, w);
    return 0;
}

/* text.format -> response_format. */
static int map_text_format(json_t *text, json_t *chat, srv_verr *e) {
    if (!json_is_object(text)) return srv_fail(e, 400, "text", "'text' must be an object");
    json_t *f = srv_field(text, "format");
    if (!f) return 0;
    json_t *tv = json_is_object(f) ? json_object_get(f, "type") : NULL;
    if (!json_is_string(tv))
        return srv_fail(e, 400, "text.format", "'text.format' must be an object with a 'type'");
    const char *type = json_string_value(tv);
    json_t *rf = NULL;
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) {
        rf = json_pack("{s:s}", "type", "json_object");
    } else if (!strcmp(type, "json_schema")) {
        json_t *schema = json_object_get(f, "schema");
        if (!json_is_object(schema) && !json_is_boolean(schema))
            return srv_fail(e, 400, "text.format", "'text.format' of type json_schema needs a 'schema'");
        json_t *js = json_pack("{s:O}", "schema", schema);
        json_t *nm = json_object_get(f, "name");
        if (js && json_is_string(nm)) json_object_set(js, "name", nm);
        if (js && json_is_boolean(json_object_get(f, "strict"))) json_object_set(js, "strict", json_object_get(f, "strict"));
        rf = js ? json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js) : NULL;
    } else {
        char q[64];
        return srv_fail(e, 400, "text.format", "'text.format.type' must be text, json_object or json_schema, got '%s'",
                        srv_quote(q, sizeof q, type, strlen(type)));
    }
    return !rf || json_object_set_new(chat, "response_format", rf) ? srv_fail(e, 500, NULL, "out of memory") : 0;
}

static int parse_responses(srv_server *s, json_t *root, resp_req *q, srv_verr *e) {
    srv_check_known(root, RESP_FIELDS, "", e);
    if (srv_model_check(s, root, e)) return -1;
    q->chat = json_object();
    q->history = json_array();
    q->echo = json_object();
    if (!q->chat || !q->history || !q->echo) return srv_fail(e, 500, NULL, "out of memory");
    q->store = 1;
    if (srv_get_bool(root, "stream", &q->stream, e) < 0 || srv_get_bool(root, "store", &q->store, e) < 0) return -1;
    int bg = 0;
    if (srv_get_bool(root, "background", &bg, e) < 0) return -1;
    if (bg) return srv_fail(e, 400, "background", "'background': true is not supported");
    json_t *prev = srv_field(root, "previous_response_id");
    if (prev) {
        if (!json_is_string(prev)) return srv_fail(e, 400, "previous_response_id", "'previous_response_id' must be a string");
        json_t *old = store_get(s->resp_store, json_string_value(prev), json_string_length(prev));
        if (!old) {
            char qq[SRV_QUOTE];
            return srv_fail(e, 404, "previous_response_id",
                            "Previous response with id '%s' not found (responses are kept in memory while the server "
                            "runs, at most %d of them)",
                            srv_quote(qq, sizeof qq, json_string_value(prev), json_string_length(prev)),
                            SRV_RESP_STORE_MAX);
        }
        json_decref(q->history);
        q->history = old;
    }
    json_t *input = srv_field(root, "input");
    if (input && input_items(input, q->history, q, e)) return -1;
    json_t *ins = srv_field(root, "instructions");
    if (ins && !json_is_string(ins)) return srv_fail(e, 400, "instructions", "'instructions' must be a string");
    json_t *msgs = json_array();
    if (!msgs || json_object_set_new(q->chat, "messages", msgs)) return srv_fail(e, 500, NULL, "out of memory");
    if (ins && json_string_length(ins) &&
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins)))
        return srv_fail(e, 500, NULL, "out of memory");
    if (json_array_extend(msgs, q->history)) return srv_fail(e, 500, NULL, "out of memory");
    if (json_array_size(msgs) == 0)
        return srv_fail(e, 400, "input", "'input' is required: a string or a non-empty array of input items");
    long long v;
    if (srv_get_int(root, "max_output_tokens", 1, INT32_MAX, &v, e) < 0) return -1;
    if (srv_field(root, "max_output_tokens")) json_object_set_new(q->chat, "max_tokens", json_integer(v));
    for (int i = 0; PASS_THROUGH[i]; i++) {
        json_t *x = srv_field(root, PASS_THROUGH[i]);
        if (x) json_object_set(q->chat, PASS_THROUGH[i], x);
    }
    json_t *tools = srv_field(root, "tools");
    if (tools) {
        json_t *ct = json_array();
        if (!ct) return srv_fail(e, 500, NULL, "out of memory");
        json_object_set_new(q->chat, "tools", ct);
        if (map_tools(tools, ct, q, e)) return -1;
        if (!json_array_size(ct)) json_object_del(q->chat, "tools");
    }
    json_t *tc = srv_field(root, "tool_choice");
    if (tc && json_object_get(q->chat, "tools") && map_tool_choice(tc, q->chat, q, e)) return -1;
    int par = 1;
    if (srv_get_bool(root, "parallel_tool_calls", &par, e) < 0) return -1;
    if (srv_field(root, "parallel_tool_calls") && json_object_get(q->chat, "tools"))
        json_object_set_new(q->chat, "parallel_tool_calls", json_boolean(par));
    json_t *text = srv_field(root, "text");
    if (text && map_text_format(text, q->chat, e)) return -1;
    json_t *rs = srv_field(root, "reasoning");
    if (rs) {
        if (!json_is_object(rs)) return srv_fail(e, 400, "reasoning", "'reasoning' must be an object");
        json_t *eff = srv_field(rs, "effort");
        if (eff && !json_is_string(eff)) return srv_fail(e, 400, "reasoning", "'reasoning.effort' must be a string");
        /* effort "none": a thinking model's template is asked not to think */
        if (eff && !strcmp(json_string_value(eff), "none"))
            json_object_set_new(q->chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", 0));
    }
    json_t *md = srv_field(root, "metadata");
    if (md && !json_is_object(md)) return srv_fail(e, 400, "metadata", "'metadata' must be an object");
    /* what the response object repeats of the request */
    json_object_set_new(q->echo, "instructions", ins ? json_incref(ins) : json_null());
    json_object_set_new(q->echo, "previous_response_id", prev ? json_incref(prev) : json_null());
    json_object_set_new(q->echo, "max_output_tokens", srv_field(root, "max_output_tokens")
                                                          ? json_integer(v) : json_null());
    json_object_set_new(q->echo, "tools", tools ? json_incref(tools) : json_array());
    json_object_set_new(q->echo, "tool_choice", tc ? json_incref(tc) : json_string("auto"));
    json_object_set_new(q->echo, "parallel_tool_calls", json_boolean(par));
    json_object_set_new(q->echo, "text", text ? json_incref(text) : json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(q->echo, "reasoning", rs ? json_incref(rs) : json_pack("{s:n,s:n}", "effort", "summary"));
    json_object_set_new(q->echo, "metadata", md ? json_incref(md) : json_object());
    json_object_set_new(q->echo, "store", json_boolean(q->store));
    json_object_set_new(q->echo, "truncation", json_string("disabled"));
    json_object_set_new(q->echo, "temperature",
                        srv_field(root, "temperature") ? json_incref(srv_field(root, "temperature")) : json_real(s->gd.temperature));
    json_object_set_new(q->echo, "top_p", srv_field(root, "top_p") ? json_incref(srv_field(root, "top_p"))
                                                                   : json_real(s->gd.top_p));
    return 0;
}

/* Errors of the chat path name chat fields; say the Responses ones. */
static void rename_param(srv_verr *e) {
    static const char *const map[][2] = {{"messages", "input"},
                                         {"max_tokens", "max_output_tokens"},
                                         {"response_format", "text.format"}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(e->param, map[i][0])) snprintf(e->param, sizeof e->param, "%s", map[i][1]);
}

/* Body -> prepared runs (one) and the request's Responses view. */
static int resp_prepare(srv_server *s, srv_request *rq, resp_req *q, srv_gen *g, srv_verr *e) {
    json_t *root = srv_parse_body(rq, e);
    if (!root) return -1;
    int rc = parse_responses(s, root, q, e);
    json_decref(root);
    if (rc) {
        resp_req_free(q);
        return -1;
    }
    char unknown[sizeof e->unknown];
    memcpy(unknown, e->unknown, sizeof unknown);
    if (srv_gen_prepare_json(s, q->chat, 1, g, e)) {
        rename_param(e);
        resp_req_free(q);
        return -1;
    }
    memcpy(e->unknown, unknown, sizeof unknown); /* the chat body's fields are ours: only the client's count */
    return 0;
}

/* ---- the answer ---- */

typedef struct resp_out {
    srv_server *s;
    srv_gen g;
    resp_req q;
    char id[64], hex[40];
    long long created;
    /* the answer as split so far: texts sent, items opened (output_index, -1: none) */
    size_t r_sent, c_sent;
    int r_item, m_item, n_items, r_done, m_done;
    json_t *items; /* finished output items, in output_index order */
    unsigned long long seq;
    /* stream */
    srv_text out; /* bytes not yet read by MHD, from out_off */
    size_t out_off;
    int ended;
    double last_write;
} resp_out;

static json_t *usage_json(const srv_req *r) {
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", r->n_prompt, "input_tokens_details",
                     "cached_tokens", atomic_load(&r->n_reused), "output_tokens", r->n_toks, "output_tokens_details",
                     "reasoning_tokens", atomic_load(&r->n_think), "total_tokens", r->n_prompt + r->n_toks);
}

/* The response object; output: its items (taken), NULL while in progress. */
static json_t *response_json(resp_out *o, const char *status, json_t *output) {
    const srv_req *r = o->g.rs[0];
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:n,s:n,s:s,s:o}", "id", o->id, "object", "response", "created_at",
                          (json_int_t)o->created, "status", status, "error", "incomplete_details", "model", o->s->name,
                          "output", output ? output : json_array());
    if (!j) return NULL;
    json_object_update(j, o->q.echo);
    if (!strcmp(status, "incomplete"))
        json_object_set_new(j, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    json_object_set_new(j, "usage", strcmp(status, "in_progress") ? usage_json(r) : json_null());
    return j;
}

static json_t *reasoning_item(resp_out *o, const char *text, size_t len, const char *status) {
    char id[64];
    snprintf(id, sizeof id, "rs_%s", o->hex);
    json_t *t = json_stringn(text ? text : "", len);
    return json_pack("{s:s,s:s,s:[],s:[{s:s,s:o}],s:s}", "id", id, "type", "reasoning", "summary", "content", "type",
                     "reasoning_text", "text", t ? t : json_string(""), "status", status);
}

static json_t *text_part(const char *text, size_t len) {
    json_t *t = json_stringn(text ? text : "", len);
    return json_pack("{s:s,s:o,s:[],s:[]}", "type", "output_text", "text", t ? t : json_string(""), "annotations",
                     "logprobs");
}

static json_t *message_item(resp_out *o, json_t *parts, const char *status) {
    char id[64];
    snprintf(id, sizeof id, "msg_%s", o->hex);
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", id, "type", "message", "role", "assistant", "status", status,
                     "content", parts);
}

/* A chat tool call ({id, function: {name, arguments}}) as a function_call item. */
static json_t *call_item(resp_out *o, json_t *call, size_t k, int with_args) {
    char id[80];
    snprintf(id, sizeof id, "fc_%s%02zx", o->hex, k);
    json_t *fn = json_object_get(call, "function");
    return json_pack("{s:s,s:s,s:O,s:O,s:s,s:s}", "id", id, "type", "function_call", "call_id",
                     json_object_get(call, "id"), "name", json_object_get(fn, "name"), "arguments",
                     with_args ? json_string_value(json_object_get(fn, "arguments")) : "", "status",
                     with_args ? "completed" : "in_progress");
}

/* The conversation after this response (history + the answer as an
 * assistant turn), into the store. */
static void store_answer(resp_out *o, const char *reasoning, size_t rlen, const char *content, size_t clen,
                         json_t *calls) {
    if (!o->q.store) return;
    json_t *msgs = json_deep_copy(o->q.history);
    json_t *t = json_stringn(content ? content : "", clen);
    json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", t ? t : json_string(""));
    if (m && rlen) json_object_set_new(m, "reasoning_content", json_stringn(reasoning, rlen));
    if (m && calls && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    if (!msgs || !m || json_array_append_new(msgs, m)) {
        json_decref(msgs);
        return;
    }
    store_put(o->s->resp_store, o->id, msgs);
}

/* The calls in the content part (tool format of tools.c), and the text
 * around them in *rest. */
static json_t *parse_calls(resp_out *o, const char *text, size_t len, char **rest, size_t *rlen) {
    *rest = NULL;
    *rlen = 0;
    if (!o->g.tool_parse || !len) return NULL;
    json_t *calls = srv_tool_calls_parse_typed(o->g.tool_fmt, o->g.tools, text, len, o->hex, rest, rlen);
    while (calls && !o->g.tool_parallel && json_array_size(calls) > 1)
        json_array_remove(calls, json_array_size(calls) - 1);
    return calls;
}

/* A whole (non-streamed) answer. */
static json_t *full_answer(resp_out *o) {
    srv_req *r = o->g.rs[0];
    const char *text = r->text ? r->text : "";
    resp_split v;
    resp_split_reasoning(r, text, r->text_len, 1, &v);
    json_t *output = json_array();
    if (!output) return NULL;
    if (v.has_reasoning) json_array_append_new(output, reasoning_item(o, RZ_P(v), v.r.len, "completed"));
    char *rest = NULL;
    size_t rlen = 0;
    json_t *calls = parse_calls(o, CT_P(v), v.c.len, &rest, &rlen);
    const char *ct = calls ? rest : CT_P(v);
    size_t cl = calls ? rlen : v.c.len;
    while (calls && cl && isspace((unsigned char)ct[cl - 1]))
        cl--;
    if (cl || (!calls && !v.has_reasoning))
        json_array_append_new(output, message_item(o, json_pack("[o]", text_part(ct, cl)), "completed"));
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) json_array_append_new(output, call_item(o, c, k, 1));
    store_answer(o, RZ_P(v), v.has_reasoning ? v.r.len : 0, ct, cl, calls);
    free(rest);
    resp_split_free(&v);
    json_decref(calls);
    return response_json(o, r->finish == SRV_FIN_LENGTH ? "incomplete" : "completed", output);
}

/* ---- stream ---- */

/* Out of memory: the bytes are dropped (the stream's next event says less). */
static void so_put(resp_out *o, const char *p, size_t n) {
    (void)srv_text_put(&o->out, p, n);
}

/* "event: TYPE\ndata: {type, sequence_number, ...j}\n\n"; takes j. */
static void so_event(resp_out *o, const char *type, json_t *j) {
    if (!j) j = json_object();
    json_object_set_new(j, "type", json_string(type));
    json_object_set_new(j, "sequence_number", json_integer((json_int_t)o->seq++));
    char *t = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!t) {
        srv_log(o->s, SRV_LOG_ERROR, "%s: a %s event could not be serialized; dropped", o->id, type);
        return;
    }
    so_put(o, "event: ", 7);
    so_put(o, type, strlen(type));
    so_put(o, "\ndata: ", 7);
    so_put(o, t, strlen(t));
    so_put(o, "\n\n", 2);
    free(t);
}

static char *item_id(json_t *item) {
    return (char *)json_string_value(json_object_get(item, "id"));
}

static void so_close_reasoning(resp_out *o, const char *text, size_t len) {
    if (o->r_item < 0 || o->r_done) return;
    json_t *item = reasoning_item(o, text, len, "completed");
    so_event(o, "response.reasoning_text.done",
             json_pack("{s:s,s:i,s:i,s:s%}", "item_id", item_id(item), "output_index", o->r_item, "content_index", 0,
                       "text", text ? text : "", len));
    so_event(o, "response.output_item.done", json_pack("{s:i,s:O}", "output_index", o->r_item, "item", item));
    json_array_append_new(o->items, item);
    o->r_done = 1;
}

static void so_open_message(resp_out *o) {
    if (o->m_item >= 0) return;
    o->m_item = o->n_items++;
    json_t *item = message_item(o, json_array(), "in_progress");
    char id[64];
    snprintf(id, sizeof id, "%s", item_id(item));
    so_event(o, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", o->m_item, "item", item));
    so_event(o, "response.content_part.added", json_pack("{s:s,s:i,s:i,s:o}", "item_id", id, "output_index", o->m_item,
                                                         "content_index", 0, "part", text_part("", 0)));
}

/* Whatever the run published since the last pass, as events. */
static void so_pass(resp_out *o) {
    srv_req *r = o->g.rs[0];
    pthread_mutex_lock(&r->mu);
    int done = r->done;
    srv_finish fin = r->finish;
    size_t len = r->text_len;
    char *text = malloc(len + 1);
    if (text && len) memcpy(text, r->text, len);
    pthread_mutex_unlock(&r->mu);
    if (!text) return; /* out of memory: the next pass */
    text[len] = 0;
    if (done && (fin == SRV_FIN_ERROR || fin == SRV_FIN_ABORT)) {
        json_t *resp = response_json(o, "failed", json_array());
        if (resp) json_object_set_new(resp, "error", json_pack("{s:s,s:s}", "code", "server_error", "message",
                                                               r->errmsg[0] ? r->errmsg : "generation failed"));
        so_event(o, "response.failed", json_pack("{s:o}", "response", resp ? resp : json_object()));
        o->ended = 1;
        free(text);
        return;
    }
    resp_split v;
    resp_split_reasoning(r, text, len, done, &v);
    char rid[64], mid[64];
    snprintf(rid, sizeof rid, "rs_%s", o->hex);
    snprintf(mid, sizeof mid, "msg_%s", o->hex);
    /* reasoning */
    if (v.has_reasoning && o->r_item < 0) {
        o->r_item = o->n_items++;
        so_event(o, "response.output_item.added",
                 json_pack("{s:i,s:o}", "output_index", o->r_item, "item", reasoning_item(o, "", 0, "in_progress")));
    }
    if (v.has_reasoning && v.r.len > o->r_sent) {
        so_event(o, "response.reasoning_text.delta",
                 json_pack("{s:s,s:i,s:i,s:s%}", "item_id", rid, "output_index", o->r_item, "content_index", 0,
                           "delta", RZ_P(v) + o->r_sent, v.r.len - o->r_sent));
        o->r_sent = v.r.len;
    }
    if (v.has_reasoning && (v.reasoning_closed || done)) so_close_reasoning(o, RZ_P(v), v.r.len);
    /* content: up to a possible tool call while running */
    size_t safe = v.c.len;
    if (o->g.tool_parse && v.c.len) {
        const char *c = CT_P(v), *b = o->g.tool_fmt->begin;
        size_t bl = strcspn(b, "\n");
        const char *at = memmem(c, v.c.len, b, bl);
        if (at) safe = (size_t)(at - c);
        else if (!done) safe = v.c.len - partial_tail(c, v.c.len, b);
    }
    json_t *calls = NULL;
    char *rest = NULL;
    size_t rlen = 0;
    if (done) calls = parse_calls(o, CT_P(v), v.c.len, &rest, &rlen);
    if (done && !calls) safe = v.c.len;
    if (calls) /* the text before the first call, not its white space */
        while (safe > o->c_sent && isspace((unsigned char)CT_P(v)[safe - 1]))
            safe--;
    if (safe > o->c_sent) {
        so_open_message(o);
        so_event(o, "response.output_text.delta",
                 json_pack("{s:s,s:i,s:i,s:s%,s:[]}", "item_id", mid, "output_index", o->m_item, "content_index", 0,
                           "delta", CT_P(v) + o->c_sent, safe - o->c_sent, "logprobs"));
        o->c_sent = safe;
    }
    if (done) {
        const char *ct = CT_P(v);
        if (o->m_item < 0 && !calls && !v.has_reasoning) so_open_message(o); /* an empty answer is a message */
        if (o->m_item >= 0 && !o->m_done) {
            json_t *part = text_part(ct, o->c_sent);
            so_event(o, "response.output_text.done",
                     json_pack("{s:s,s:i,s:i,s:s%,s:[]}", "item_id", mid, "output_index", o->m_item, "content_index", 0,
                               "text", ct, o->c_sent, "logprobs"));
            so_event(o, "response.content_part.done", json_pack("{s:s,s:i,s:i,s:O}", "item_id", mid, "output_index",
                                                                o->m_item, "content_index", 0, "part", part));
            json_t *item = message_item(o, json_pack("[o]", part), "completed");
            so_event(o, "response.output_item.done", json_pack("{s:i,s:O}", "output_index", o->m_item, "item", item));
            json_array_append_new(o->items, item);
            o->m_done = 1;
        }
        size_t k;
        json_t *c;
        json_array_foreach(calls, k, c) {
            int idx = o->n_items++;
            json_t *added = call_item(o, c, k, 0), *item = call_item(o, c, k, 1);
            const char *args = json_string_value(json_object_get(item, "arguments"));
            char fid[80];
            snprintf(fid, sizeof fid, "%s", item_id(item));
            so_event(o, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", idx, "item", added));
            so_event(o, "response.function_call_arguments.delta",
                     json_pack("{s:s,s:i,s:s}", "item_id", fid, "output_index", idx, "delta", args));
            so_event(o, "response.function_call_arguments.done",
                     json_pack("{s:s,s:i,s:s,s:O}", "item_id", fid, "output_index", idx, "arguments", args, "name",
                               json_object_get(item, "name")));
            so_event(o, "response.output_item.done", json_pack("{s:i,s:O}", "output_index", idx, "item", item));
            json_array_append_new(o->items, item);
        }
        store_answer(o, RZ_P(v), v.has_reasoning ? v.r.len : 0, ct, o->c_sent, calls);
        const char *status = fin == SRV_FIN_LENGTH ? "incomplete" : "completed";
        json_t *resp = response_json(o, status, json_deep_copy(o->items));
        /* response.completed also when the answer is incomplete (its status
         * says so), as vLLM sends it: clients wait for that event */
        so_event(o, "response.completed", json_pack("{s:o}", "response", resp ? resp : json_object()));
        o->ended = 1;
    }
    json_decref(calls);
    free(rest);
    resp_split_free(&v);
    free(text);
}

static void resp_out_free(resp_out *o) {
    srv_gen_free(&o->g);
    resp_req_free(&o->q);
    json_decref(o->items);
    srv_text_free(&o->out);
    free(o);
}

static ssize_t so_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    resp_out *o = cls;
    if (o->out_off == o->out.len) {
        o->out_off = o->out.len = 0;
        if (o->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        srv_group *grp = o->g.grp;
        pthread_mutex_lock(&grp->mu);
        unsigned long long v = grp->version;
        pthread_mutex_unlock(&grp->mu);
        so_pass(o);
        if (!o->out.len && !o->ended) {
            pthread_mutex_lock(&grp->mu);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            while (grp->version == v)
                if (pthread_cond_timedwait(&grp->cv, &grp->mu, &ts) != 0) break;
            pthread_mutex_unlock(&grp->mu);
            so_pass(o);
        }
        if (!o->out.len && !o->ended && srv_now() - o->last_write > 2.0) so_put(o, ": keep-alive\n\n", 14);
        if (!o->out.len) return o->ended ? MHD_CONTENT_READER_END_OF_STREAM : 0;
    }
    size_t n = o->out.len - o->out_off;
    if (n > max) n = max;
    memcpy(buf, o->out.p + o->out_off, n);
    o->out_off += n;
    o->last_write = srv_now();
    return (ssize_t)n;
}

static void so_free(void *cls) {
    resp_out *o = cls;
    srv_cancel_all(&o->g);
    srv_log_done(o->s, &o->g, "responses stream");
    resp_out_free(o);
}

/* ---- the route ---- */

enum MHD_Result srv_handle_responses(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    srv_verr e = {0};
    resp_out *o = calloc(1, sizeof *o);
    if (!o) return srv_send_error(s, c, 500, "out of memory", NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    o->g.client_fd = ci ? ci->connect_fd : -1; /* polled while a grammar compiles */
    if (resp_prepare(s, rq, &o->q, &o->g, &e)) {
        free(o);
        if (e.status == 499) return MHD_NO; /* the client is gone: nobody to answer */
        return srv_send_verr(s, c, &e);
    }
    o->s = s;
    o->r_item = o->m_item = -1;
    o->items = json_array();
    const char *hex = strchr(o->g.rs[0]->id, '-');
    snprintf(o->hex, sizeof o->hex, "%.32s", hex ? hex + 1 : o->g.rs[0]->id);
    snprintf(o->id, sizeof o->id, "resp_%s", o->hex);
    snprintf(o->g.rs[0]->id, sizeof o->g.rs[0]->id, "%.40s", o->id); /* read-only once submitted */
    o->created = o->g.rs[0]->created;
    srv_log_unknown(s, &e, o->id, "responses");
    if (o->q.dropped[0])
        srv_log(s, SRV_LOG_WARNING, "responses %s: dropped (not supported): %s", o->id, o->q.dropped);
    if (!o->items || srv_sched_submit_many(s, o->g.rs, o->g.n_rs) != 0) {
        int oom = !o->items;
        resp_out_free(o);
        return srv_send_error(s, c, oom ? 500 : 503,
                              oom                            ? "out of memory"
                              : atomic_load(&s->accepting) ? "server overloaded: the waiting queue is full, retry later"
                                                           : "server is shutting down",
                              NULL);
    }
    if (o->q.stream) {
        o->last_write = srv_now();
        so_event(o, "response.created", json_pack("{s:o}", "response", response_json(o, "in_progress", NULL)));
        so_event(o, "response.in_progress", json_pack("{s:o}", "response", response_json(o, "in_progress", NULL)));
        return srv_sse_queue(s, c, so_reader, o, so_free);
    }
    int gone = srv_gen_wait(s, c, &o->g);
    srv_log_done(s, &o->g, "responses");
    srv_req *r = o->g.rs[0];
    enum MHD_Result mr;
    if (gone)
        mr = MHD_NO;
    else if (atomic_load(&s->unusable) && (r->finish != SRV_FIN_STOP && r->finish != SRV_FIN_LENGTH))
        mr = srv_send_error(s, c, 503, s->unusable_why, NULL); /* a dead mpirun rank, named */
    else if (r->finish == SRV_FIN_ERROR)
        mr = srv_send_error(s, c, 500, r->errmsg[0] ? r->errmsg : "generation failed", NULL);
    else if (r->finish == SRV_FIN_ABORT)
        mr = srv_send_error(s, c, 503, "request cancelled: the server is shutting down", NULL);
    else
        mr = srv_send_json(s, c, 200, full_answer(o));
    resp_out_free(o);
    return mr;
}

int srv_check_responses(srv_server *s, srv_request *rq, srv_verr *e) {
    resp_req q = {0};
    srv_gen g = {0};
    if (resp_prepare(s, rq, &q, &g, e)) return -1;
    srv_gen_free(&g);
    resp_req_free(&q);
    return 0;
}
