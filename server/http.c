/*
 * server/: the HTTP surface (libmicrohttpd, one thread per connection).
 *
 * Every request body is untrusted: size-limited (413), parsed with jansson,
 * each field type- and range-checked, unknown fields refused by name (400)
 * rather than silently ignored. Generation requests become an srv_req handed
 * to the scheduler; non-streaming handlers wait for it to finish, streaming
 * responses are produced by a content-reader callback that waits on the
 * request's condition variable. When MHD drops a streaming response (client
 * gone, or done) the free callback marks the request cancelled, so the
 * scheduler frees its sequence at the next step.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/internal.h"

enum { R_NONE = 0, R_COMPLETIONS, R_CHAT, R_MODELS, R_HEALTH, R_METRICS, R_TOKENIZE, R_DETOKENIZE };

typedef struct conn_ctx {
    int route;
    char *body;
    size_t len, cap;
    int too_big;
    int counted; /* in srv_server.http_active */
} conn_ctx;

/* A request-validation failure on its way to an HTTP error. */
typedef struct verr {
    int status;
    char msg[512];
    char param[64];
} verr;

static int fail(verr *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(verr *e, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    return -1;
}

/* ---- responses ---- */

static void count_status(srv_server *s, int status) {
    int k = status / 100;
    if (k < 1 || k > 5) return;
    pthread_mutex_lock(&s->met.mu);
    s->met.http_requests[k]++;
    pthread_mutex_unlock(&s->met.mu);
}

static enum MHD_Result send_buf(srv_server *s, struct MHD_Connection *c, int status, char *buf, size_t len,
                                const char *ctype) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (status == 405) MHD_add_response_header(resp, "Allow", "GET, POST");
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    count_status(s, status);
    return rc;
}

static enum MHD_Result send_json(srv_server *s, struct MHD_Connection *c, int status, json_t *j) {
    char *txt = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!txt) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"internal_error\","
                                  "\"param\":null,\"code\":500}}";
        txt = strdup(oom);
        status = 500;
        if (!txt) return MHD_NO;
    }
    return send_buf(s, c, status, txt, strlen(txt), "application/json");
}

static const char *err_type(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 413: return "RequestTooLargeError";
    case 503: return "ServiceUnavailableError";
    default: return "InternalServerError";
    }
}

static json_t *error_json(int status, const char *msg, const char *param) {
    return json_pack("{s:{s:s,s:s,s:o,s:i}}", "error", "message", msg, "type", err_type(status), "param",
                     param && *param ? json_string(param) : json_null(), "code", status);
}

static enum MHD_Result send_error(srv_server *s, struct MHD_Connection *c, int status, const char *msg,
                                  const char *param) {
    return send_json(s, c, status, error_json(status, msg, param));
}

static enum MHD_Result send_verr(srv_server *s, struct MHD_Connection *c, const verr *e) {
    return send_error(s, c, e->status, e->msg, e->param);
}

/* ---- field helpers (null counts as absent) ---- */

static json_t *field(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

static int get_int(json_t *o, const char *k, long long lo, long long hi, long long *out, verr *e) {
    json_t *v = field(o, k);
    if (!v) return 0;
    if (!json_is_integer(v)) return fail(e, 400, k, "'%s' must be an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return fail(e, 400, k, "'%s' must be in [%lld, %lld], got %lld", k, lo, hi, x);
    *out = x;
    return 1;
}

static int get_num(json_t *o, const char *k, double lo, double hi, int lo_open, double *out, verr *e) {
    json_t *v = field(o, k);
    if (!v) return 0;
    if (!json_is_number(v)) return fail(e, 400, k, "'%s' must be a number", k);
    double x = json_number_value(v);
    if (!isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
        return fail(e, 400, k, "'%s' must be in %c%g, %g], got %g", k, lo_open ? '(' : '[', lo, hi, x);
    *out = x;
    return 1;
}

static int get_bool(json_t *o, const char *k, int *out, verr *e) {
    json_t *v = field(o, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) return fail(e, 400, k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 1;
}

/* Refuse fields this server does not know rather than ignore them. */
static int check_known(json_t *o, const char *const *known, verr *e) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++)
            ok = strcmp(k, known[i]) == 0;
        if (!ok) return fail(e, 400, k, "unsupported field '%s'", k);
    }
    return 0;
}

/* Fields accepted only with their neutral value. */
static int check_neutral(json_t *o, verr *e) {
    json_t *v;
    if ((v = field(o, "presence_penalty")) && !(json_is_number(v) && json_number_value(v) == 0))
        return fail(e, 400, "presence_penalty", "'presence_penalty' is not supported (only 0)");
    if ((v = field(o, "frequency_penalty")) && !(json_is_number(v) && json_number_value(v) == 0))
        return fail(e, 400, "frequency_penalty", "'frequency_penalty' is not supported (only 0)");
    if ((v = field(o, "logit_bias")) && !(json_is_object(v) && json_object_size(v) == 0))
        return fail(e, 400, "logit_bias", "'logit_bias' is not supported");
    if ((v = field(o, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return fail(e, 400, "best_of", "'best_of' must be 1");
    if ((v = field(o, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
        return fail(e, 400, "suffix", "'suffix' is not supported");
    if ((v = field(o, "min_p")) && !(json_is_number(v) && json_number_value(v) == 0))
        return fail(e, 400, "min_p", "'min_p' is not supported (only 0)");
    if ((v = field(o, "tools")) && !(json_is_array(v) && json_array_size(v) == 0))
        return fail(e, 400, "tools", "'tools' is not supported");
    if ((v = field(o, "tool_choice")) &&
        !(json_is_string(v) && (!strcmp(json_string_value(v), "none") || !strcmp(json_string_value(v), "auto"))))
        return fail(e, 400, "tool_choice", "'tool_choice' must be \"none\" or \"auto\"");
    if ((v = field(o, "response_format"))) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return fail(e, 400, "response_format",
                        "'response_format' other than {\"type\": \"text\"} is not supported");
    }
    if ((v = field(o, "user")) && !json_is_string(v)) return fail(e, 400, "user", "'user' must be a string");
    return 0;
}

static int model_check(srv_server *s, json_t *o, verr *e) {
    json_t *m = field(o, "model");
    if (!m) return 0;
    if (!json_is_string(m)) return fail(e, 400, "model", "'model' must be a string");
    if (strcmp(json_string_value(m), s->name) != 0)
        return fail(e, 404, "model", "The model `%.200s` does not exist.", json_string_value(m));
    return 0;
}

static json_t *parse_body(conn_ctx *cc, verr *e) {
    json_error_t je;
    if (!cc->len) {
        fail(e, 400, NULL, "request body is empty; expected a JSON object");
        return NULL;
    }
    json_t *root = json_loadb(cc->body, cc->len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        fail(e, 400, NULL, "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        fail(e, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* Token ids from a JSON array, each in [0, vocab). */
static int parse_ids(srv_server *s, json_t *a, const char *param, int32_t **ids, int *n, verr *e) {
    size_t m = json_array_size(a);
    if (m > (size_t)1 << 24) return fail(e, 400, param, "'%s' has too many tokens", param);
    *ids = malloc((m ? m : 1) * sizeof **ids);
    if (!*ids) return fail(e, 500, param, "out of memory");
    for (size_t i = 0; i < m; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) return fail(e, 400, param, "'%s' must hold integer token ids", param);
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= s->mc.vocab_size)
            return fail(e, 400, param, "token id %" JSON_INTEGER_FORMAT " in '%s' is out of range [0, %d)", x, param,
                        s->mc.vocab_size);
        (*ids)[i] = (int32_t)x;
    }
    *n = (int)m;
    return 0;
}

static int encode_text(srv_server *s, const char *text, size_t len, int add_special, const char *param, int32_t **ids,
                       int *n, verr *e) {
    size_t nn;
    char terr[256];
    int rc = tok_encode(s->tok, text, len, add_special, ids, &nn, terr, sizeof terr);
    if (rc != TOK_OK) return fail(e, rc == TOK_ENOMEM ? 500 : 400, param, "cannot tokenize '%s': %s", param, terr);
    if (nn > (size_t)1 << 24) return fail(e, 400, param, "'%s' is too long", param);
    *n = (int)nn;
    return 0;
}

/* ---- chat messages -> template text ---- */

typedef struct chat_buf {
    tok_chat_message *msgs;
    tok_tool_call *calls;
    char **owned;
    size_t n_owned;
} chat_buf;

static void chat_buf_free(chat_buf *b) {
    for (size_t i = 0; i < b->n_owned; i++)
        free(b->owned[i]);
    free(b->owned);
    free(b->msgs);
    free(b->calls);
}

static const char *content_text(json_t *c, chat_buf *b, const char *param, verr *e) {
    if (!c) return "";
    if (json_is_string(c)) return json_string_value(c);
    if (!json_is_array(c)) return fail(e, 400, param, "message content must be a string or an array of parts"), NULL;
    size_t total = 0, i;
    json_t *p;
    json_array_foreach(c, i, p) {
        json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        json_t *tx = json_is_object(p) ? json_object_get(p, "text") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0 || !json_is_string(tx))
            return fail(e, 400, param, "only {\"type\": \"text\", \"text\": ...} content parts are supported"), NULL;
        total += json_string_length(tx);
    }
    char *out = malloc(total + 1), **no = realloc(b->owned, (b->n_owned + 1) * sizeof *no);
    if (no) b->owned = no;
    if (!out || !no) {
        free(out);
        return fail(e, 500, param, "out of memory"), NULL;
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

/* The model's own Jinja template over the request's messages (content
 * parts joined into text, as validated in b), chat_template_kwargs merged
 * into the variables, as apply_chat_template is called by vLLM. */
static int render_model_template(srv_server *s, json_t *msgs, const chat_buf *b, json_t *kw, int add_gen, char **text,
                                 size_t *tl, verr *e) {
    json_t *ctx = json_object(), *ms = json_array();
    size_t i;
    json_t *m;
    int rc = -1;
    char *ctx_text = NULL, terr[512];
    if (!ctx || !ms) goto oom;
    json_array_foreach(msgs, i, m) {
        json_t *c = json_deep_copy(m);
        if (!c || json_object_set_new(c, "content", json_string(b->msgs[i].content)) ||
            json_array_append_new(ms, c))
            goto oom;
    }
    if (json_object_set_new(ctx, "messages", ms)) goto oom;
    ms = NULL;
    if (kw && json_object_update(ctx, kw)) goto oom;
    if (json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_gen))) goto oom;
    if (!(ctx_text = json_dumps(ctx, JSON_COMPACT))) goto oom;
    if (eng_chat_render(&s->chat, ctx_text, text, tl, terr, sizeof terr)) {
        fail(e, 400, "messages", "chat template: %s", terr);
        goto out;
    }
    rc = 0;
    goto out;
oom:
    fail(e, 500, "messages", "out of memory");
out:
    json_decref(ms);
    json_decref(ctx);
    free(ctx_text);
    return rc;
}

static int render_chat(srv_server *s, json_t *root, int add_gen, int32_t **ids, int *n, verr *e) {
    json_t *msgs = field(root, "messages");
    if (!msgs) return fail(e, 400, "messages", "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return fail(e, 400, "messages", "'messages' must be a non-empty array");
    if (json_array_size(msgs) > 65536) return fail(e, 400, "messages", "too many messages");
    int enable_thinking = 1;
    json_t *kw = field(root, "chat_template_kwargs");
    if (kw) {
        if (!json_is_object(kw))
            return fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        const char *k;
        json_t *v;
        json_object_foreach(kw, k, v) {
            if (s->chat.source) continue; /* the model's template gets every key, as vLLM passes them */
            if (strcmp(k, "enable_thinking") != 0)
                return fail(e, 400, "chat_template_kwargs", "unsupported chat_template_kwargs key '%.100s'", k);
            if (!json_is_boolean(v))
                return fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs.enable_thinking' must be a boolean");
            enable_thinking = json_is_true(v);
        }
    }
    size_t nm = json_array_size(msgs), ncalls = 0, i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *tc = json_is_object(m) ? field(m, "tool_calls") : NULL;
        if (json_is_array(tc)) ncalls += json_array_size(tc);
    }
    chat_buf b = {calloc(nm, sizeof *b.msgs), calloc(ncalls ? ncalls : 1, sizeof *b.calls), NULL, 0};
    int rc = -1;
    char *text = NULL;
    if (!b.msgs || !b.calls) {
        fail(e, 500, NULL, "out of memory");
        goto out;
    }
    size_t ci = 0;
    json_array_foreach(msgs, i, m) {
        static const char *const known[] = {"role", "content", "reasoning_content", "tool_calls", "tool_call_id",
                                            "name", NULL};
        if (!json_is_object(m)) {
            fail(e, 400, "messages", "each message must be an object");
            goto out;
        }
        if (check_known(m, known, e)) goto out;
        json_t *role = json_object_get(m, "role");
        const char *r = json_is_string(role) ? json_string_value(role) : NULL;
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))) {
            fail(e, 400, "messages", "message %zu: 'role' must be one of system, user, assistant, tool", i);
            goto out;
        }
        if (field(m, "name") && !json_is_string(field(m, "name"))) {
            fail(e, 400, "messages", "message %zu: 'name' must be a string", i);
            goto out;
        }
        b.msgs[i].role = r;
        if (!(b.msgs[i].content = content_text(field(m, "content"), &b, "messages", e))) goto out;
        json_t *rc_ = field(m, "reasoning_content");
        if (rc_) {
            if (!json_is_string(rc_)) {
                fail(e, 400, "messages", "message %zu: 'reasoning_content' must be a string", i);
                goto out;
            }
            b.msgs[i].reasoning_content = json_string_value(rc_);
        }
        json_t *tc = field(m, "tool_calls");
        if (tc) {
            if (!json_is_array(tc)) {
                fail(e, 400, "messages", "message %zu: 'tool_calls' must be an array", i);
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
                    fail(e, 400, "messages",
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
    char terr[512];
    if (s->chat.source) {
        if (render_model_template(s, msgs, &b, kw, add_gen, &text, &tl, e)) goto out;
    } else {
        tok_chat_options co = {.add_generation_prompt = add_gen, .enable_thinking = enable_thinking};
        if (tok_chat_apply(b.msgs, nm, &co, &text, &tl, terr, sizeof terr) != TOK_OK) {
            fail(e, 400, "messages", "chat template: %s", terr);
            goto out;
        }
    }
    rc = encode_text(s, text, tl, 0, "messages", ids, n, e);
out:
    free(text);
    chat_buf_free(&b);
    return rc;
}

/* ---- generation requests ---- */

static const char *const COMPLETION_FIELDS[] = {"model",
                                                "prompt",
                                                "max_tokens",
                                                "temperature",
                                                "top_p",
                                                "top_k",
                                                "seed",
                                                "stop",
                                                "stream",
                                                "stream_options",
                                                "logprobs",
                                                "n",
                                                "echo",
                                                "user",
                                                "ignore_eos",
                                                "min_tokens",
                                                "repetition_penalty",
                                                "stop_token_ids",
                                                "presence_penalty",
                                                "frequency_penalty",
                                                "logit_bias",
                                                "best_of",
                                                "suffix",
                                                "min_p",
                                                NULL};
static const char *const CHAT_FIELDS[] = {"model",
                                          "messages",
                                          "max_tokens",
                                          "max_completion_tokens",
                                          "temperature",
                                          "top_p",
                                          "top_k",
                                          "seed",
                                          "stop",
                                          "stream",
                                          "stream_options",
                                          "logprobs",
                                          "top_logprobs",
                                          "n",
                                          "user",
                                          "ignore_eos",
                                          "min_tokens",
                                          "repetition_penalty",
                                          "stop_token_ids",
                                          "presence_penalty",
                                          "frequency_penalty",
                                          "logit_bias",
                                          "min_p",
                                          "chat_template_kwargs",
                                          "add_generation_prompt",
                                          "tools",
                                          "tool_choice",
                                          "parallel_tool_calls",
                                          "response_format",
                                          NULL};

typedef struct gen_req {
    srv_req *r;
    int stream, include_usage, echo;
    char *prompt_text; /* echo */
} gen_req;

static int parse_prompt(srv_server *s, json_t *root, srv_req *r, verr *e) {
    json_t *p = field(root, "prompt");
    if (!p) return fail(e, 400, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* a batch of one */
    int rc;
    if (json_is_array(p) && json_array_size(p) > 0 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        return fail(e, 400, "prompt", "batched prompts are not supported; send one prompt per request");
    if (json_is_string(p))
        rc = encode_text(s, json_string_value(p), json_string_length(p), 1, "prompt", &r->prompt, &r->n_prompt, e);
    else if (json_is_array(p))
        rc = parse_ids(s, p, "prompt", &r->prompt, &r->n_prompt, e);
    else
        return fail(e, 400, "prompt", "'prompt' must be a string or an array of token ids");
    if (rc) return rc;
    if (r->n_prompt == 0) return fail(e, 400, "prompt", "'prompt' is empty");
    return 0;
}

static int parse_stop(srv_server *s, json_t *root, srv_req *r, verr *e) {
    json_t *st = field(root, "stop");
    if (st) {
        json_t *one = json_is_string(st) ? st : NULL;
        size_t n = one ? 1 : json_is_array(st) ? json_array_size(st) : (size_t)-1;
        if (n == (size_t)-1) return fail(e, 400, "stop", "'stop' must be a string or an array of strings");
        if (n > SRV_MAX_STOPS) return fail(e, 400, "stop", "at most %d stop strings", SRV_MAX_STOPS);
        for (size_t i = 0; i < n; i++) {
            json_t *v = one ? one : json_array_get(st, i);
            if (!json_is_string(v)) return fail(e, 400, "stop", "'stop' must be a string or an array of strings");
            size_t L = json_string_length(v);
            if (L == 0 || L > SRV_MAX_STOP_LEN)
                return fail(e, 400, "stop", "stop strings must be 1..%d bytes", SRV_MAX_STOP_LEN);
            if (!(r->stop[r->n_stop] = malloc(L + 1))) return fail(e, 500, "stop", "out of memory");
            memcpy(r->stop[r->n_stop], json_string_value(v), L + 1);
            r->stop_len[r->n_stop++] = L;
        }
    }
    json_t *sid = field(root, "stop_token_ids");
    if (sid) {
        if (!json_is_array(sid) || json_array_size(sid) > 1024)
            return fail(e, 400, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
        if (parse_ids(s, sid, "stop_token_ids", &r->stop_ids, &r->n_stop_ids, e)) return -1;
    }
    return 0;
}

static int parse_generate(srv_server *s, json_t *root, int chat, gen_req *g, verr *e) {
    srv_req *r = g->r;
    r->chat = chat;
    if (check_known(root, chat ? CHAT_FIELDS : COMPLETION_FIELDS, e) || check_neutral(root, e) ||
        model_check(s, root, e))
        return -1;
    long long v = 0;
    double d = 0;
    int b = 0;
    if (get_int(root, "n", LLONG_MIN, LLONG_MAX, &v, e) < 0) return -1;
    if (field(root, "n") && v != 1) return fail(e, 400, "n", "only n = 1 is supported");
    if (get_bool(root, "stream", &g->stream, e) < 0) return -1;
    json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so)) return fail(e, 400, "stream_options", "'stream_options' must be an object");
        if (!g->stream) return fail(e, 400, "stream_options", "'stream_options' requires \"stream\": true");
        const char *k;
        json_t *x;
        json_object_foreach(so, k, x) {
            if (strcmp(k, "include_usage") && strcmp(k, "continuous_usage_stats"))
                return fail(e, 400, "stream_options", "unsupported stream_options key '%.100s'", k);
        }
        if (get_bool(so, "include_usage", &g->include_usage, e) < 0) return -1;
        int cus = 0;
        if (get_bool(so, "continuous_usage_stats", &cus, e) < 0) return -1;
        if (cus) return fail(e, 400, "stream_options", "'continuous_usage_stats' is not supported");
    }
    if (chat) {
        int add_gen = 1;
        if (get_bool(root, "add_generation_prompt", &add_gen, e) < 0) return -1;
        if (render_chat(s, root, add_gen, &r->prompt, &r->n_prompt, e)) return -1;
        if (r->n_prompt == 0) return fail(e, 400, "messages", "the rendered chat is empty");
        int lp = 0;
        if (get_bool(root, "logprobs", &lp, e) < 0) return -1;
        r->want_logprobs = lp;
        if (get_int(root, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &v, e) < 0) return -1;
        if (field(root, "top_logprobs")) {
            if (!lp) return fail(e, 400, "top_logprobs", "'top_logprobs' requires \"logprobs\": true");
            r->top_logprobs = (int)v;
        }
        int pt = 0;
        if (get_bool(root, "parallel_tool_calls", &pt, e) < 0) return -1;
    } else {
        if (parse_prompt(s, root, r, e)) return -1;
        if (get_int(root, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &v, e) < 0) return -1;
        if (field(root, "logprobs")) {
            r->want_logprobs = 1;
            r->top_logprobs = (int)v;
        }
        if (get_bool(root, "echo", &g->echo, e) < 0) return -1;
        if (g->echo && r->want_logprobs)
            return fail(e, 400, "echo", "'echo' together with 'logprobs' (prompt logprobs) is not supported");
        if (g->echo) {
            char *t;
            size_t tl;
            char terr[128];
            if (tok_decode(s->tok, r->prompt, (size_t)r->n_prompt, 0, &t, &tl, terr, sizeof terr) != TOK_OK)
                return fail(e, 500, "echo", "cannot decode the prompt: %s", terr);
            g->prompt_text = t;
        }
    }
    /* lengths */
    if (r->n_prompt >= s->max_model_len)
        return fail(e, 400, chat ? "messages" : "prompt",
                    "This model's maximum context length is %d tokens. However, your prompt has %d tokens, leaving "
                    "no room for a completion.",
                    s->max_model_len, r->n_prompt);
    long long room = s->max_model_len - r->n_prompt;
    /* KV blocks for prompt + max_tokens are reserved at admission, so a
     * request must fit the whole cache or it could never be admitted. */
    long long kv_room = (long long)s->total_blocks * s->block_size - r->n_prompt;
    if (kv_room < 1)
        return fail(e, 400, chat ? "messages" : "prompt",
                    "the prompt (%d tokens) does not fit the KV cache (%d tokens)", r->n_prompt,
                    s->total_blocks * s->block_size);
    long long mt = room < kv_room ? room : kv_room;
    const char *mt_name = "max_tokens";
    if (chat && field(root, "max_completion_tokens")) mt_name = "max_completion_tokens";
    if (get_int(root, mt_name, 1, INT32_MAX, &mt, e) < 0) return -1;
    if (chat && field(root, "max_completion_tokens") && field(root, "max_tokens")) {
        long long other;
        if (get_int(root, "max_tokens", 1, INT32_MAX, &other, e) < 0) return -1;
        if (other < mt) mt = other;
    }
    if (mt > room)
        return fail(e, 400, mt_name,
                    "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in "
                    "the %s, %lld in the completion). Please reduce the length of the %s or completion.",
                    s->max_model_len, r->n_prompt + mt, r->n_prompt, chat ? "messages" : "prompt", mt,
                    chat ? "messages" : "prompt");
    if (mt > kv_room)
        return fail(e, 400, mt_name, "prompt (%d tokens) + %s (%lld) exceeds the KV cache (%d tokens)", r->n_prompt,
                    mt_name, mt, s->total_blocks * s->block_size);
    r->max_tokens = (int)mt;
    /* sampling, defaults from generation_config.json */
    r->sp.temperature = s->gd.temperature;
    r->sp.top_p = s->gd.top_p;
    r->sp.top_k = s->gd.top_k;
    r->rep_penalty = s->gd.repetition_penalty;
    if (get_num(root, "temperature", 0, 2, 0, &d, e) < 0) return -1;
    if (field(root, "temperature")) r->sp.temperature = d < 1e-5 ? 0 : (float)d;
    if (get_num(root, "top_p", 0, 1, 1, &d, e) < 0) return -1;
    if (field(root, "top_p")) r->sp.top_p = (float)d;
    if (get_int(root, "top_k", -1, s->mc.vocab_size, &v, e) < 0) return -1;
    if (field(root, "top_k")) r->sp.top_k = v < 0 ? 0 : (int)v;
    if (get_num(root, "repetition_penalty", 0, 10, 1, &d, e) < 0) return -1;
    if (field(root, "repetition_penalty")) r->rep_penalty = (float)d;
    if (get_int(root, "seed", LLONG_MIN, LLONG_MAX, &v, e) < 0) return -1;
    unsigned long long cnt = atomic_fetch_add(&s->req_counter, 1);
    if (field(root, "seed"))
        r->sp.seed = (uint64_t)v;
    else
        r->sp.seed = s->seed_base ^ (cnt * 0xbf58476d1ce4e5b9ull);
    eng_rng_seed(&r->rng, r->sp.seed);
    if (get_bool(root, "ignore_eos", &b, e) < 0) return -1;
    if (field(root, "ignore_eos")) r->ignore_eos = b;
    if (get_int(root, "min_tokens", 0, r->max_tokens, &v, e) < 0) return -1;
    if (field(root, "min_tokens")) r->min_tokens = (int)v;
    if (parse_stop(s, root, r, e)) return -1;
    snprintf(r->id, sizeof r->id, "%s-%016llx%08llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)(s->seed_base ^ cnt * 0x94d049bb133111ebull), cnt);
    r->created = (long long)time(NULL);
    return 0;
}

/* Scheduler-side buffers for a parsed request. */
static int req_prepare(srv_server *s, srv_req *r, verr *e) {
    r->all = malloc(((size_t)r->n_prompt + (size_t)r->max_tokens) * sizeof *r->all);
    r->ds = tok_stream_new(s->tok, 1); /* skip special tokens, as vLLM by default */
    if (!r->all || !r->ds) return fail(e, 500, NULL, "out of memory");
    memcpy(r->all, r->prompt, (size_t)r->n_prompt * sizeof *r->all);
    r->n_all = r->n_prompt;
    r->t_arrive = srv_now();
    return 0;
}

/* ---- response bodies ---- */

static json_t *timings_json(const srv_req *r) {
    int n = r->n_toks;
    double q = r->t_sched > 0 ? r->t_sched - r->t_arrive : 0;
    double pf = n ? r->t_first - r->t_sched : 0, ttft = n ? r->t_first - r->t_arrive : 0;
    double dec = n ? r->t_last - r->t_first : 0;
    return json_pack("{s:f,s:f,s:f,s:f,s:f,s:f}", "queue_ms", 1e3 * q, "prefill_ms", 1e3 * pf, "ttft_ms", 1e3 * ttft,
                     "decode_ms", 1e3 * dec, "per_token_ms", n > 1 ? 1e3 * dec / (n - 1) : 0.0, "e2e_ms",
                     1e3 * ((r->t_done > 0 ? r->t_done : srv_now()) - r->t_arrive));
}

static json_t *usage_json(const srv_req *r) {
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", r->n_prompt, "completion_tokens", r->n_toks, "total_tokens",
                     r->n_prompt + r->n_toks);
}

static json_t *tok_str(srv_server *s, int32_t id) {
    char *t = NULL;
    size_t tl = 0;
    char terr[64];
    if (tok_decode(s->tok, &id, 1, 0, &t, &tl, terr, sizeof terr) != TOK_OK) return json_string("");
    json_t *j = json_stringn(t, tl);
    free(t);
    return j ? j : json_string("");
}

static json_t *tok_bytes(srv_server *s, int32_t id) {
    char *t = NULL;
    size_t tl = 0;
    char terr[64];
    json_t *a = json_array();
    if (tok_decode(s->tok, &id, 1, 0, &t, &tl, terr, sizeof terr) == TOK_OK)
        for (size_t i = 0; i < tl; i++)
            json_array_append_new(a, json_integer((unsigned char)t[i]));
    free(t);
    return a;
}

/* Completions logprobs for toks[0..n), text offsets starting at *off. */
static json_t *completion_logprobs(srv_server *s, const srv_tokrec *t, int n, size_t *off) {
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int i = 0; i < n; i++) {
        json_t *ts = tok_str(s, t[i].token);
        json_array_append_new(offs, json_integer((json_int_t)*off));
        *off += json_string_length(ts);
        json_array_append_new(toks, ts);
        json_array_append_new(lps, json_real(t[i].logprob));
        json_t *d = json_object();
        for (int k = 0; k < t[i].n_top; k++) {
            json_t *ks = tok_str(s, t[i].top_ids[k]);
            json_object_set_new(d, json_string_value(ks), json_real(t[i].top_lp[k]));
            json_decref(ks);
        }
        json_array_append_new(tops, d);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset",
                     offs);
}

static json_t *chat_logprobs(srv_server *s, const srv_tokrec *t, int n) {
    json_t *content = json_array();
    for (int i = 0; i < n; i++) {
        json_t *tops = json_array();
        for (int k = 0; k < t[i].n_top; k++)
            json_array_append_new(tops, json_pack("{s:o,s:f,s:o}", "token", tok_str(s, t[i].top_ids[k]), "logprob",
                                                  (double)t[i].top_lp[k], "bytes", tok_bytes(s, t[i].top_ids[k])));
        json_array_append_new(content,
                              json_pack("{s:o,s:f,s:o,s:o}", "token", tok_str(s, t[i].token), "logprob",
                                        (double)t[i].logprob, "bytes", tok_bytes(s, t[i].token), "top_logprobs", tops));
    }
    return json_pack("{s:o}", "content", content);
}

static const char *finish_str(srv_finish f) {
    return f == SRV_FIN_LENGTH ? "length" : f == SRV_FIN_STOP ? "stop" : "abort";
}

static json_t *full_response(srv_server *s, const gen_req *g) {
    const srv_req *r = g->r;
    json_t *choice;
    json_t *lp = json_null();
    if (!r->chat) {
        size_t off = g->prompt_text ? strlen(g->prompt_text) : 0;
        if (r->want_logprobs) {
            json_decref(lp);
            lp = completion_logprobs(s, r->toks, r->n_toks, &off);
        }
        json_t *text;
        if (g->prompt_text) {
            size_t pl = strlen(g->prompt_text);
            char *t = malloc(pl + r->text_len + 1);
            if (t) {
                memcpy(t, g->prompt_text, pl);
                memcpy(t + pl, r->text ? r->text : "", r->text_len);
            }
            text = t ? json_stringn(t, pl + r->text_len) : NULL;
            free(t);
        } else {
            text = json_stringn(r->text ? r->text : "", r->text_len);
        }
        choice = json_pack("{s:i,s:o,s:o,s:s,s:n}", "index", 0, "text", text ? text : json_string(""), "logprobs", lp,
                           "finish_reason", finish_str(r->finish), "stop_reason");
    } else {
        if (r->want_logprobs) {
            json_decref(lp);
            lp = chat_logprobs(s, r->toks, r->n_toks);
        }
        json_t *text = json_stringn(r->text ? r->text : "", r->text_len);
        choice = json_pack("{s:i,s:{s:s,s:o,s:o},s:o,s:s,s:n}", "index", 0, "message", "role", "assistant", "content",
                           text ? text : json_string(""), "tool_calls", json_array(), "logprobs", lp, "finish_reason",
                           finish_str(r->finish), "stop_reason");
    }
    return json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o,s:o}", "id", r->id, "object",
                     r->chat ? "chat.completion" : "text_completion", "created", (json_int_t)r->created, "model",
                     s->name, "choices", choice, "usage", usage_json(r), "timings", timings_json(r));
}

/* ---- streaming ---- */

typedef struct stream_ctx {
    srv_server *s;
    gen_req g;
    char *out;
    size_t out_len, out_off, out_cap;
    int role_sent, ended;
    int tok_cur;
    size_t text_cur, lp_off;
    double last_write;
} stream_ctx;

static void sc_put(stream_ctx *sc, const char *p, size_t n) {
    if (sc->out_len + n > sc->out_cap) {
        size_t nc = sc->out_cap ? sc->out_cap : 1024;
        while (nc < sc->out_len + n)
            nc *= 2;
        char *np = realloc(sc->out, nc);
        if (!np) return;
        sc->out = np;
        sc->out_cap = nc;
    }
    memcpy(sc->out + sc->out_len, p, n);
    sc->out_len += n;
}

static void sc_event(stream_ctx *sc, json_t *j) {
    char *t = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!t) return;
    sc_put(sc, "data: ", 6);
    sc_put(sc, t, strlen(t));
    sc_put(sc, "\n\n", 2);
    free(t);
}

static json_t *chunk_base(stream_ctx *sc, json_t *choices) {
    const srv_req *r = sc->g.r;
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", r->id, "object",
                     r->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)r->created, "model",
                     sc->s->name, "choices", choices);
}

/* One content chunk: text (may be empty) plus logprobs of tokens [t0, t1). */
static void sc_content(stream_ctx *sc, const char *text, size_t tl, const srv_tokrec *toks, int nt, const char *fin) {
    srv_server *s = sc->s;
    const srv_req *r = sc->g.r;
    json_t *lp = json_null();
    if (r->want_logprobs && nt > 0) {
        json_decref(lp);
        lp = r->chat ? chat_logprobs(s, toks, nt) : completion_logprobs(s, toks, nt, &sc->lp_off);
    }
    json_t *txt = json_stringn(text ? text : "", tl);
    json_t *choice;
    if (r->chat) {
        json_t *delta = fin && !tl ? json_object() : json_pack("{s:o}", "content", txt ? txt : json_string(""));
        if (fin && !tl) json_decref(txt);
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta, "logprobs", lp, "finish_reason",
                           fin ? json_string(fin) : json_null());
    } else {
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "text", txt ? txt : json_string(""), "logprobs", lp,
                           "finish_reason", fin ? json_string(fin) : json_null());
    }
    json_t *c = chunk_base(sc, json_pack("[o]", choice));
    if (fin && c) json_object_set_new(c, "timings", timings_json(r));
    sc_event(sc, c);
}

/* Wait for news from the scheduler and turn it into SSE bytes. */
static void sc_fill(stream_ctx *sc) {
    srv_req *r = sc->g.r;
    srv_server *s = sc->s;
    if (r->chat && !sc->role_sent) {
        sc->role_sent = 1;
        json_t *c = chunk_base(sc, json_pack("[{s:i,s:{s:s,s:s},s:n,s:n}]", "index", 0, "delta", "role", "assistant",
                                             "content", "", "logprobs", "finish_reason"));
        sc_event(sc, c);
        return;
    }
    if (!r->chat && sc->g.prompt_text && !sc->role_sent) {
        sc->role_sent = 1;
        sc_content(sc, sc->g.prompt_text, strlen(sc->g.prompt_text), NULL, 0, NULL);
        sc->lp_off = strlen(sc->g.prompt_text);
        return;
    }
    pthread_mutex_lock(&r->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    while (!r->done && r->n_toks == sc->tok_cur && r->text_len == sc->text_cur) {
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0) break;
    }
    int done = r->done, nt = r->n_toks - sc->tok_cur;
    size_t tl = r->text_len - sc->text_cur;
    srv_tokrec *toks = nt > 0 ? malloc((size_t)nt * sizeof *toks) : NULL;
    char *text = tl > 0 ? malloc(tl) : NULL;
    if (toks) memcpy(toks, r->toks + sc->tok_cur, (size_t)nt * sizeof *toks);
    if (text) memcpy(text, r->text + sc->text_cur, tl);
    srv_finish fin = r->finish;
    pthread_mutex_unlock(&r->mu);
    if ((nt > 0 && !toks) || (tl > 0 && !text)) {
        free(toks);
        free(text);
        return; /* out of memory: try again on the next call */
    }
    sc->tok_cur += nt;
    sc->text_cur += tl;
    if (tl > 0 || (nt > 0 && r->want_logprobs)) sc_content(sc, text, tl, toks, nt, NULL);
    free(toks);
    free(text);
    if (done) {
        if (fin == SRV_FIN_ERROR) {
            sc_event(sc, error_json(500, r->errmsg[0] ? r->errmsg : "generation failed", NULL));
        } else {
            sc_content(sc, NULL, 0, NULL, 0, finish_str(fin));
            if (sc->g.include_usage) {
                json_t *c = chunk_base(sc, json_array());
                if (c) {
                    json_object_set_new(c, "usage", usage_json(r));
                    json_object_set_new(c, "timings", timings_json(r));
                }
                sc_event(sc, c);
            }
        }
        sc_put(sc, "data: [DONE]\n\n", 14);
        sc->ended = 1;
    } else if (sc->out_len == sc->out_off && srv_now() - sc->last_write > 2.0) {
        /* SSE comment: keeps a queued stream's connection alive and lets a
         * departed client be noticed while it waits. */
        sc_put(sc, ": keep-alive\n\n", 14);
    }
    (void)s;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *sc = cls;
    if (sc->out_off == sc->out_len) {
        sc->out_off = sc->out_len = 0;
        if (sc->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        sc_fill(sc);
        if (sc->out_len == 0) return 0;
    }
    size_t n = sc->out_len - sc->out_off;
    if (n > max) n = max;
    memcpy(buf, sc->out + sc->out_off, n);
    sc->out_off += n;
    sc->last_write = srv_now();
    return (ssize_t)n;
}

static void log_done(srv_server *s, const srv_req *r, const char *how) {
    if (s->opt.log_level > SRV_LOG_INFO) return;
    double ttft = r->n_toks ? 1e3 * (r->t_first - r->t_arrive) : 0;
    srv_log(s, SRV_LOG_INFO, "%s %s: %s, prompt %d, generated %d, ttft %.1f ms, e2e %.1f ms", r->id, how,
            r->done ? srv_finish_name(r->finish) : "cancelled", r->n_prompt, r->n_toks, ttft,
            1e3 * ((r->t_done > 0 ? r->t_done : srv_now()) - r->t_arrive));
}

/* MHD is done with the stream (finished, or the client went away). */
static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    srv_req *r = sc->g.r;
    pthread_mutex_lock(&r->mu);
    int done = r->done;
    pthread_mutex_unlock(&r->mu);
    if (!done) atomic_store(&r->cancelled, 1);
    log_done(sc->s, r, "stream");
    srv_req_unref(r);
    free(sc->g.prompt_text);
    free(sc->out);
    free(sc);
}

/* Body -> a validated, tokenized request ready for the scheduler (g->r,
 * g->prompt_text). On failure *e says why and nothing is left allocated. */
static int generate_prepare(srv_server *s, conn_ctx *cc, int chat, gen_req *g, verr *e) {
    json_t *root = parse_body(cc, e);
    if (!root) return -1;
    g->r = srv_req_new();
    if (!g->r) {
        json_decref(root);
        return fail(e, 500, NULL, "out of memory");
    }
    int rc = parse_generate(s, root, chat, g, e);
    json_decref(root);
    if (rc || req_prepare(s, g->r, e)) {
        srv_req_unref(g->r);
        free(g->prompt_text);
        g->r = NULL;
        g->prompt_text = NULL;
        return -1;
    }
    return 0;
}

static enum MHD_Result handle_generate(srv_server *s, struct MHD_Connection *c, conn_ctx *cc, int chat) {
    verr e = {0};
    gen_req g = {0};
    if (generate_prepare(s, cc, chat, &g, &e)) return send_verr(s, c, &e);
    if (srv_sched_submit(s, g.r) != 0) {
        srv_req_unref(g.r);
        free(g.prompt_text);
        return send_error(s, c, 503,
                          atomic_load(&s->accepting) ? "server overloaded: the waiting queue is full, retry later"
                                                     : "server is shutting down",
                          NULL);
    }
    if (g.stream) {
        stream_ctx *sc = calloc(1, sizeof *sc);
        if (!sc) {
            atomic_store(&g.r->cancelled, 1);
            srv_req_unref(g.r);
            free(g.prompt_text);
            return send_error(s, c, 500, "out of memory", NULL);
        }
        sc->s = s;
        sc->g = g;
        sc->last_write = srv_now();
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, sc, stream_free);
        if (!resp) {
            stream_free(sc);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        /* The request is complete: from here on the stream's pace is the
         * model's, not the client's, so lift the idle timeout a lot. */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 600u);
        enum MHD_Result mr = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count_status(s, 200);
        return mr;
    }
    srv_req *r = g.r;
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    enum MHD_Result mr;
    log_done(s, r, chat ? "chat" : "completion");
    if (r->finish == SRV_FIN_ERROR)
        mr = send_error(s, c, 500, r->errmsg[0] ? r->errmsg : "generation failed", NULL);
    else if (r->finish == SRV_FIN_ABORT)
        mr = send_error(s, c, 503, "request cancelled: the server is shutting down", NULL);
    else
        mr = send_json(s, c, 200, full_response(s, &g));
    srv_req_unref(r);
    free(g.prompt_text);
    return mr;
}

/* ---- other routes ---- */

/* /tokenize body -> response object (*out; NULL only when out of memory),
 * or -1 with *e set. */
static int tokenize_body(srv_server *s, conn_ctx *cc, json_t **out, verr *e) {
    static const char *const known[] = {"model",
                                        "prompt",
                                        "messages",
                                        "add_special_tokens",
                                        "add_generation_prompt",
                                        "chat_template_kwargs",
                                        "return_token_strs",
                                        NULL};
    json_t *root = parse_body(cc, e);
    if (!root) return -1;
    int32_t *ids = NULL;
    int n = 0, add_special = 1, add_gen = 1, strs = 0;
    if (check_known(root, known, e) || model_check(s, root, e) ||
        get_bool(root, "add_special_tokens", &add_special, e) < 0 ||
        get_bool(root, "add_generation_prompt", &add_gen, e) < 0 || get_bool(root, "return_token_strs", &strs, e) < 0)
        goto fail;
    json_t *p = field(root, "prompt");
    if (p && field(root, "messages")) {
        fail(e, 400, "prompt", "give either 'prompt' or 'messages', not both");
        goto fail;
    }
    if (p) {
        if (!json_is_string(p)) {
            fail(e, 400, "prompt", "'prompt' must be a string");
            goto fail;
        }
        if (encode_text(s, json_string_value(p), json_string_length(p), add_special, "prompt", &ids, &n, e)) goto fail;
    } else if (field(root, "messages")) {
        if (render_chat(s, root, add_gen, &ids, &n, e)) goto fail;
    } else {
        fail(e, 400, "prompt", "'prompt' (or 'messages') is required");
        goto fail;
    }
    json_t *toks = json_array(), *ts = strs ? json_array() : json_null();
    for (int i = 0; i < n; i++) {
        json_array_append_new(toks, json_integer(ids[i]));
        if (strs) json_array_append_new(ts, tok_str(s, ids[i]));
    }
    *out =
        json_pack("{s:i,s:i,s:o,s:o}", "count", n, "max_model_len", s->max_model_len, "tokens", toks, "token_strs", ts);
    free(ids);
    json_decref(root);
    return 0;
fail:
    free(ids);
    json_decref(root);
    return -1;
}

static enum MHD_Result handle_tokenize(srv_server *s, struct MHD_Connection *c, conn_ctx *cc) {
    verr e = {0};
    json_t *out = NULL;
    if (tokenize_body(s, cc, &out, &e)) return send_verr(s, c, &e);
    return send_json(s, c, 200, out);
}

/* /detokenize body -> response object (*out; NULL only when out of memory),
 * or -1 with *e set. */
static int detokenize_body(srv_server *s, conn_ctx *cc, json_t **out, verr *e) {
    static const char *const known[] = {"model", "tokens", NULL};
    json_t *root = parse_body(cc, e);
    if (!root) return -1;
    int32_t *ids = NULL;
    int n = 0;
    json_t *t = field(root, "tokens");
    if (check_known(root, known, e) || model_check(s, root, e)) goto fail;
    if (!json_is_array(t)) {
        fail(e, 400, "tokens", "'tokens' must be an array of token ids");
        goto fail;
    }
    if (parse_ids(s, t, "tokens", &ids, &n, e)) goto fail;
    char *txt = NULL;
    size_t tl;
    char terr[128];
    if (tok_decode(s->tok, ids, (size_t)n, 0, &txt, &tl, terr, sizeof terr) != TOK_OK) {
        fail(e, 400, "tokens", "cannot decode: %s", terr);
        goto fail;
    }
    *out = json_pack("{s:o}", "prompt", json_stringn(txt, tl));
    free(txt);
    free(ids);
    json_decref(root);
    return 0;
fail:
    free(ids);
    json_decref(root);
    return -1;
}

static enum MHD_Result handle_detokenize(srv_server *s, struct MHD_Connection *c, conn_ctx *cc) {
    verr e = {0};
    json_t *out = NULL;
    if (detokenize_body(s, cc, &out, &e)) return send_verr(s, c, &e);
    return send_json(s, c, 200, out);
}

/* The request-body path of the four POST routes as the handlers run it
 * (parse, validate, tokenize, build the response object), minus the engine
 * and the network: a prepared generation request is freed instead of being
 * submitted, a response object is serialized as send_json does, then freed. */
int srv_fuzz_parse(srv_server *s, int route, const char *body, size_t len, char *err, size_t errlen) {
    conn_ctx cc = {.body = (char *)body, .len = len};
    verr e = {0};
    json_t *out = NULL;
    int rc;
    switch (route) {
    case SRV_FUZZ_COMPLETIONS:
    case SRV_FUZZ_CHAT: {
        gen_req g = {0};
        cc.route = route == SRV_FUZZ_CHAT ? R_CHAT : R_COMPLETIONS;
        rc = generate_prepare(s, &cc, route == SRV_FUZZ_CHAT, &g, &e);
        if (!rc) {
            srv_req_unref(g.r);
            free(g.prompt_text);
        }
        break;
    }
    case SRV_FUZZ_TOKENIZE:
        cc.route = R_TOKENIZE;
        rc = tokenize_body(s, &cc, &out, &e);
        break;
    case SRV_FUZZ_DETOKENIZE:
        cc.route = R_DETOKENIZE;
        rc = detokenize_body(s, &cc, &out, &e);
        break;
    default: return -1;
    }
    if (!rc && route >= SRV_FUZZ_TOKENIZE) {
        char *txt = out ? json_dumps(out, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
        json_decref(out);
        if (!txt) rc = fail(&e, 500, NULL, "out of memory"); /* what send_json answers */
        free(txt);
    }
    if (err && errlen) snprintf(err, errlen, "%s", rc ? e.msg : "");
    return rc ? e.status : 200;
}

static enum MHD_Result handle_models(srv_server *s, struct MHD_Connection *c) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:s,s:n}", "id", s->name, "object", "model", "created",
                          (json_int_t)time(NULL), "owned_by", "echo", "root", s->model_dir, "parent");
    if (m && s->max_model_len) json_object_set_new(m, "max_model_len", json_integer(s->max_model_len));
    return send_json(s, c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

static enum MHD_Result handle_metrics(srv_server *s, struct MHD_Connection *c) {
    size_t len;
    char *txt = srv_metrics_render(&s->met, s->name, &len);
    if (!txt) return send_error(s, c, 500, "out of memory", NULL);
    return send_buf(s, c, 200, txt, len, "text/plain; version=0.0.4; charset=utf-8");
}

/* ---- dispatch ---- */

static int route_of(const char *url) {
    static const struct {
        const char *path;
        int route;
    } tab[] = {{"/v1/completions", R_COMPLETIONS},
               {"/v1/chat/completions", R_CHAT},
               {"/v1/models", R_MODELS},
               {"/health", R_HEALTH},
               {"/metrics", R_METRICS},
               {"/tokenize", R_TOKENIZE},
               {"/detokenize", R_DETOKENIZE}};
    for (size_t i = 0; i < sizeof tab / sizeof *tab; i++)
        if (strcmp(url, tab[i].path) == 0) return tab[i].route;
    return R_NONE;
}

static int route_is_post(int r) {
    return r == R_COMPLETIONS || r == R_CHAT || r == R_TOKENIZE || r == R_DETOKENIZE;
}

static int authorized(srv_server *s, struct MHD_Connection *c, int route) {
    if (!s->opt.api_key || route == R_HEALTH || route == R_METRICS) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7, *want = s->opt.api_key;
    size_t lk = strlen(k), lw = strlen(want);
    unsigned diff = (unsigned)(lk ^ lw);
    for (size_t i = 0; i < lk && i < lw; i++)
        diff |= (unsigned char)(k[i] ^ want[i]);
    return diff == 0;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        /* First call: headers only. Answer what can be answered now so a
         * refused body is never read. */
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        *con_cls = cc;
        cc->route = route_of(url);
        if (cc->route == R_COMPLETIONS || cc->route == R_CHAT) {
            cc->counted = 1;
            atomic_fetch_add(&s->http_active, 1);
        }
        int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), is_post = !strcmp(method, "POST");
        if (cc->route == R_NONE) return send_error(s, c, 404, "Not Found", NULL);
        if (route_is_post(cc->route) ? !is_post : !is_get) return send_error(s, c, 405, "Method Not Allowed", NULL);
        if (!authorized(s, c, cc->route))
            return send_error(s, c, 401, "Unauthorized: missing or invalid API key", NULL);
        if (is_post) {
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
            if (cl) {
                char *end;
                unsigned long long v = strtoull(cl, &end, 10);
                if (end != cl && v > s->opt.max_body_bytes)
                    return send_error(s, c, 413, "request body too large", NULL);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cc->too_big || cc->len + n > s->opt.max_body_bytes) {
            cc->too_big = 1;
            return MHD_YES; /* keep reading (and dropping) so the 413 can be sent */
        }
        if (cc->len + n + 1 > cc->cap) {
            size_t nc = cc->cap ? cc->cap : 4096;
            while (nc < cc->len + n + 1)
                nc *= 2;
            char *nb = realloc(cc->body, nc);
            if (!nb) return MHD_NO;
            cc->body = nb;
            cc->cap = nc;
        }
        memcpy(cc->body + cc->len, upload_data, n);
        cc->len += n;
        return MHD_YES;
    }
    if (cc->too_big) return send_error(s, c, 413, "request body too large", NULL);
    switch (cc->route) {
    case R_HEALTH: {
        if (atomic_load(&s->unusable)) {
            char *why = NULL;
            int n = asprintf(&why, "engine unusable: %s\n", s->unusable_why);
            return send_buf(s, c, 503, n < 0 ? NULL : why, n < 0 ? 0 : (size_t)n, "text/plain");
        }
        int ok = atomic_load(&s->ready) && atomic_load(&s->accepting);
        return send_buf(s, c, ok ? 200 : 503, strdup(""), 0, "text/plain");
    }
    case R_METRICS: return handle_metrics(s, c);
    case R_MODELS: return handle_models(s, c);
    default: break;
    }
    if (!atomic_load(&s->ready))
        return send_error(s, c, 503,
                          atomic_load(&s->accepting) ? "the model is loading; retry when /health is 200"
                                                     : "server is shutting down",
                          NULL);
    if (atomic_load(&s->unusable) && (cc->route == R_COMPLETIONS || cc->route == R_CHAT)) {
        char msg[640];
        snprintf(msg, sizeof msg, "the engine can run no more steps (%s); the server must be restarted",
                 s->unusable_why);
        return send_error(s, c, 503, msg, NULL);
    }
    switch (cc->route) {
    case R_COMPLETIONS: return handle_generate(s, c, cc, 0);
    case R_CHAT: return handle_generate(s, c, cc, 1);
    case R_TOKENIZE: return handle_tokenize(s, c, cc);
    case R_DETOKENIZE: return handle_detokenize(s, c, cc);
    default: return send_error(s, c, 404, "Not Found", NULL);
    }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_server *s = cls;
    (void)c;
    (void)toe;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    if (cc->counted) atomic_fetch_sub(&s->http_active, 1);
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    srv_server *s = cls;
    if (s->opt.log_level > SRV_LOG_DEBUG) return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = 0;
    srv_log(s, SRV_LOG_DEBUG, "http: %s", line);
}

int srv_http_start(srv_server *s, char *err, size_t errlen) {
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_AUTO | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    if (inet_pton(AF_INET, s->opt.host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)s->opt.port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, s->opt.host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)s->opt.port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        snprintf(err, errlen, "--host '%s' is not a numeric IPv4 or IPv6 address", s->opt.host);
        return -1;
    }
    s->mhd = MHD_start_daemon(flags, (uint16_t)s->opt.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, sa,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opt.timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)s->opt.max_connections, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1u << 20),
                              MHD_OPTION_END);
    if (!s->mhd) {
        snprintf(err, errlen, "cannot listen on %s:%d (address in use, or not allowed)", s->opt.host, s->opt.port);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->opt.port;
    return 0;
}

void srv_http_quiesce(srv_server *s) {
    if (!s->mhd) return;
    MHD_socket fd = MHD_quiesce_daemon(s->mhd);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void srv_http_stop(srv_server *s) {
    if (!s->mhd) return;
    /* The scheduler has finished or cancelled every request; give their
     * connections a moment to flush (the rest of a stream, [DONE]) before
     * MHD closes every socket. */
    double until = srv_now() + 5;
    while (atomic_load(&s->http_active) > 0 && srv_now() < until) {
        struct timespec d = {0, 10 * 1000 * 1000};
        nanosleep(&d, NULL);
    }
    MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}
