/*
 * server/: chat messages -> prompt ids. The messages are validated (roles,
 * text-only content parts, tool calls), rendered through the model's Jinja
 * template (or Qwen3's built-in one, the default source) from one builder of
 * the template's variables, and tokenized.
 */
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

typedef struct chat_buf {
    tok_chat_message *msgs;
    tok_tool_call *calls;
    char **owned;
    size_t n_owned;
} chat_buf;

/* A tool message answers a call: its tool_call_id must be the id of a call
 * of an earlier assistant message (OpenAI answers 400 otherwise). */
static int tool_call_id_check(json_t *msgs, size_t i, json_t *m, srv_verr *e) {
    json_t *id = srv_field(m, "tool_call_id");
    if (!json_is_string(id))
        return srv_fail(e, 400, "messages", "message %zu: a 'tool' message needs a 'tool_call_id' string", i);
    for (size_t j = 0; j < i; j++) {
        json_t *a = json_array_get(msgs, j), *tc = json_is_object(a) ? srv_field(a, "tool_calls") : NULL;
        json_t *ro = json_is_object(a) ? json_object_get(a, "role") : NULL;
        if (!json_is_string(ro) || strcmp(json_string_value(ro), "assistant") || !json_is_array(tc)) continue;
        size_t k;
        json_t *c;
        json_array_foreach(tc, k, c) {
            json_t *cid = json_is_object(c) ? json_object_get(c, "id") : NULL;
            if (json_is_string(cid) && json_equal(cid, id)) return 0;
        }
    }
    return srv_fail(e, 400, "messages", "message %zu: 'tool_call_id' \"%.64s\" names no call of an earlier assistant message", i,
                    json_string_value(id));
}

static void chat_buf_free(chat_buf *b) {
    for (size_t i = 0; i < b->n_owned; i++)
        free(b->owned[i]);
    free(b->owned);
    free(b->msgs);
    free(b->calls);
}

static const char *content_text(json_t *c, chat_buf *b, const char *param, srv_verr *e) {
    if (!c) return "";
    if (json_is_string(c)) return json_string_value(c);
    if (!json_is_array(c))
        return srv_fail(e, 400, param, "message content must be a string or an array of parts"), NULL;
    size_t total = 0, i;
    json_t *p;
    json_array_foreach(c, i, p) {
        json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        json_t *tx = json_is_object(p) ? json_object_get(p, "text") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0 || !json_is_string(tx))
            return srv_fail(e, 400, param, "only {\"type\": \"text\", \"text\": ...} content parts are supported"),
                   NULL;
        total += json_string_length(tx);
    }
    char *out = malloc(total + 1), **no = realloc(b->owned, (b->n_owned + 1) * sizeof *no);
    if (no) b->owned = no;
    if (!out || !no) {
        free(out);
        return srv_fail(e, 500, param, "out of memory"), NULL;
    }
    b->owned[b->n_owned++] = out;
    size_t off = 0;
    json_array_foreach(c, i, p) {
        json_t *tx = json_object_get(p, "text");
        memcpy(out + off, json_string_value(tx), json_string_length(tx));
        off += json_string_length(tx);
    }
    out[off] = 0;
    return out;
}

/* A template without tool support sees tools the Hermes way (the first row
 * of server/tools.c's formats): a "# Tools" system block, assistant calls
 * as <tool_call> text, tool results as user <tool_response> turns. */
static int hermes_rewrite(json_t *c, const chat_buf *b, size_t i) {
    const tok_chat_message *m = &b->msgs[i];
    if (!strcmp(m->role, "tool")) {
        size_t L = strlen(m->content) + 64;
        char *t = malloc(L);
        if (!t) return -1;
        snprintf(t, L, "<tool_response>\n%s\n</tool_response>", m->content);
        int rc =
            json_object_set_new(c, "role", json_string("user")) || json_object_set_new(c, "content", json_string(t));
        free(t);
        json_object_del(c, "tool_call_id");
        json_object_del(c, "name");
        return rc ? -1 : 0;
    }
    if (!m->n_tool_calls) return 0;
    size_t L = strlen(m->content) + 1;
    for (size_t k = 0; k < m->n_tool_calls; k++)
        L += strlen(m->tool_calls[k].name) + strlen(m->tool_calls[k].arguments) + 64;
    char *t = malloc(L);
    if (!t) return -1;
    size_t n = (size_t)sprintf(t, "%s", m->content);
    for (size_t k = 0; k < m->n_tool_calls; k++)
        n += (size_t)sprintf(t + n, "%s<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>", n ? "\n" : "",
                             m->tool_calls[k].name, m->tool_calls[k].arguments);
    int rc = json_object_set_new(c, "content", json_string(t));
    free(t);
    json_object_del(c, "tool_calls");
    return rc ? -1 : 0;
}

/* Built-in: its tools as JSON text, inserted verbatim (tokenizer/chat.c). */
static int tools_as_text(json_t *ctx, json_t *tools) {
    json_t *arr = json_array();
    if (!arr || json_object_set_new(ctx, "tools", arr)) return -1;
    size_t k;
    json_t *x;
    json_array_foreach(tools, k, x) {
        char *t = json_dumps(x, JSON_COMPACT);
        int bad = !t || json_array_append_new(arr, json_string(t));
        free(t);
        if (bad) return -1;
    }
    return 0;
}

/* The one builder of a chat's template variables, rendered through the
 * model's Jinja template or, for a model without one, the built-in (Qwen3's:
 * the default source, s->chat_builtin): the request's messages (content
 * parts joined into text, roles and reasoning as validated in b), the tools,
 * add_generation_prompt; a model's template also gets every
 * chat_template_kwargs key (as vLLM passes them), the built-in one
 * enable_thinking alone and the tools as JSON text. */
static int render_template(srv_server *s, json_t *msgs, const chat_buf *b, json_t *kw, int enable_thinking, int add_gen,
                           json_t *tools, char **text, size_t *tl, srv_verr *e) {
    const eng_chat_template *tp = s->chat.source ? &s->chat : &s->chat_builtin;
    int builtin = tp == &s->chat_builtin;
    json_t *ctx = json_object(), *ms = json_array();
    size_t i;
    json_t *m;
    int rc = -1;
    char *ctx_text = NULL, terr[512];
    /* Does the template render tools itself? (Qwen3's, Llama 3.1's, Hermes' do.) */
    int native = tools && strstr(tp->source, "tools") != NULL;
    if (!ctx || !ms) goto oom;
    json_array_foreach(msgs, i, m) {
        json_t *c = json_deep_copy(m);
        if (!c || json_object_set_new(c, "content", json_string(b->msgs[i].content)) ||
            json_object_set_new(c, "role", json_string(b->msgs[i].role)) || json_array_append_new(ms, c))
            goto oom;
        /* templates read reasoning_content (Qwen3's, DeepSeek's): the vLLM name maps to it */
        json_object_del(c, "reasoning");
        if (b->msgs[i].reasoning_content &&
            json_object_set_new(c, "reasoning_content", json_string(b->msgs[i].reasoning_content)))
            goto oom;
        if (tools && !native && hermes_rewrite(c, b, i)) goto oom;
    }
    if (tools && !native) {
        char *blk = srv_tools_system_block(tools);
        if (!blk) goto oom;
        json_t *first = json_array_get(ms, 0);
        const char *fr = json_string_value(json_object_get(first, "role"));
        if (fr && !strcmp(fr, "system")) {
            const char *fc = json_string_value(json_object_get(first, "content"));
            size_t L = strlen(fc ? fc : "") + strlen(blk) + 4;
            char *t = malloc(L);
            if (t) snprintf(t, L, "%s%s%s", fc && *fc ? fc : "", fc && *fc ? "\n\n" : "", blk);
            int bad = !t || json_object_set_new(first, "content", json_string(t));
            free(t);
            free(blk);
            if (bad) goto oom;
        } else {
            json_t *sys = json_pack("{s:s,s:s}", "role", "system", "content", blk);
            free(blk);
            if (!sys || json_array_insert_new(ms, 0, sys)) goto oom;
        }
    }
    if (json_object_set_new(ctx, "messages", ms)) goto oom;
    ms = NULL;
    if (native && (builtin ? tools_as_text(ctx, tools) : json_object_set(ctx, "tools", tools))) goto oom;
    if (builtin ? json_object_set_new(ctx, "enable_thinking", json_boolean(enable_thinking))
                : kw && json_object_update(ctx, kw))
        goto oom;
    if (json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_gen))) goto oom;
    if (!(ctx_text = json_dumps(ctx, JSON_COMPACT))) goto oom;
    if (eng_chat_render(tp, ctx_text, text, tl, terr, sizeof terr)) {
        srv_fail(e, 400, "messages", "chat template: %s", terr);
        goto out;
    }
    rc = 0;
    goto out;
oom:
    srv_fail(e, 500, "messages", "out of memory");
out:
    json_decref(ms);
    json_decref(ctx);
    free(ctx_text);
    return rc;
}

/* OpenAI's "developer" role is its current name for system instructions.
 * A template that names the role renders it as it means to; for the others
 * (the built-in Qwen3 one included) it is "system", as OpenAI maps it for
 * models that predate it. */
static int developer_known(const srv_server *s) {
    return s->chat.source && strstr(s->chat.source, "developer") != NULL;
}

int srv_render_chat(srv_server *s, json_t *root, int add_gen, int32_t **ids, int *n, srv_tools *tools_out,
                    srv_verr *e) {
    json_t *msgs = srv_field(root, "messages");
    if (!msgs) return srv_fail(e, 400, "messages", "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return srv_fail(e, 400, "messages", "'messages' must be a non-empty array");
    if (json_array_size(msgs) > 65536) return srv_fail(e, 400, "messages", "too many messages");
    int enable_thinking = 1;
    json_t *kw = srv_field(root, "chat_template_kwargs");
    if (kw) {
        if (!json_is_object(kw))
            return srv_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        const char *k;
        json_t *v;
        json_object_foreach(kw, k, v) {
            if (s->chat.source) continue; /* the model's template gets every key, as vLLM passes them */
            if (strcmp(k, "enable_thinking") != 0) {
                srv_note_unknown(e, "chat_template_kwargs.", k); /* the built-in template has no use for it */
                continue;
            }
            if (!json_is_boolean(v))
                return srv_fail(e, 400, "chat_template_kwargs",
                                "'chat_template_kwargs.enable_thinking' must be a boolean");
            enable_thinking = json_is_true(v);
        }
    }
    size_t nm = json_array_size(msgs), ncalls = 0, i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *tc = json_is_object(m) ? srv_field(m, "tool_calls") : NULL;
        if (json_is_array(tc)) ncalls += json_array_size(tc);
    }
    chat_buf b = {calloc(nm, sizeof *b.msgs), calloc(ncalls ? ncalls : 1, sizeof *b.calls), NULL, 0};
    int rc = -1;
    char *text = NULL;
    srv_tools tools = {0};
    if (!b.msgs || !b.calls) {
        srv_fail(e, 500, NULL, "out of memory");
        goto out;
    }
    size_t ci = 0;
    json_array_foreach(msgs, i, m) {
        static const char *const known[] = {"role", "content", "reasoning_content", "reasoning", "tool_calls",
                                            "tool_call_id", "name", NULL};
        if (!json_is_object(m)) {
            srv_fail(e, 400, "messages", "each message must be an object");
            goto out;
        }
        if (srv_check_known(m, known, "messages[].", e)) goto out;
        json_t *role = json_object_get(m, "role");
        const char *r = json_is_string(role) ? json_string_value(role) : NULL;
        if (r && !strcmp(r, "developer") && !developer_known(s)) r = "system";
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool") &&
                   strcmp(r, "developer"))) {
            srv_fail(e, 400, "messages", "message %zu: 'role' must be one of system, developer, user, assistant, tool",
                     i);
            goto out;
        }
        if (srv_field(m, "name") && !json_is_string(srv_field(m, "name"))) {
            srv_fail(e, 400, "messages", "message %zu: 'name' must be a string", i);
            goto out;
        }
        if (!strcmp(r, "tool") && tool_call_id_check(msgs, i, m, e)) goto out;
        b.msgs[i].role = r;
        if (!(b.msgs[i].content = content_text(srv_field(m, "content"), &b, "messages", e))) goto out;
        /* the thinking of an assistant turn: reasoning_content (llama.cpp,
         * DeepSeek) or reasoning (vLLM), either name; both must agree */
        json_t *rc_ = srv_field(m, "reasoning_content"), *rr = srv_field(m, "reasoning");
        if ((rc_ && !json_is_string(rc_)) || (rr && !json_is_string(rr))) {
            srv_fail(e, 400, "messages", "message %zu: '%s' must be a string", i,
                     rc_ && !json_is_string(rc_) ? "reasoning_content" : "reasoning");
            goto out;
        }
        if (rc_ && rr && !json_equal(rc_, rr)) {
            srv_fail(e, 400, "messages", "message %zu: 'reasoning_content' and 'reasoning' differ (send one)", i);
            goto out;
        }
        if (rc_ || rr) b.msgs[i].reasoning_content = json_string_value(rc_ ? rc_ : rr);
        json_t *tc = srv_field(m, "tool_calls");
        if (tc) {
            if (!json_is_array(tc)) {
                srv_fail(e, 400, "messages", "message %zu: 'tool_calls' must be an array", i);
                goto out;
            }
            b.msgs[i].tool_calls = b.calls + ci;
            size_t j;
            json_t *call;
            json_array_foreach(tc, j, call) {
                json_t *fn = json_is_object(call) ? json_object_get(call, "function") : NULL;
                json_t *nm_ = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
                json_t *ar = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
                if (!json_is_string(nm_) || !json_is_string(ar)) {
                    srv_fail(e, 400, "messages",
                             "message %zu: tool_calls need function.name and function.arguments "
                             "strings",
                             i);
                    goto out;
                }
                b.calls[ci].name = json_string_value(nm_);
                b.calls[ci].arguments = json_string_value(ar);
                ci++;
                b.msgs[i].n_tool_calls++;
            }
        }
    }
    size_t tl;
    /* tool_choice "none" leaves the tools out of the prompt */
    if (srv_parse_tools(root, &tools, e)) goto out;
    json_t *tl_json = tools.choice != SRV_TOOL_NONE ? tools.tools : NULL;
    if (render_template(s, msgs, &b, kw, enable_thinking, add_gen, tl_json, &text, &tl, e)) goto out;
    rc = srv_encode_text(s, text, tl, 0, "messages", ids, n, e);
out:
    if (tools_out) *tools_out = tools;
    else srv_tools_free(&tools);
    free(text);
    chat_buf_free(&b);
    return rc;
}
