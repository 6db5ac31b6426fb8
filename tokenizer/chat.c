/*
 * The Qwen3 chat template (tokenizer_config.json "chat_template"), written
 * out in C so the engine needs no Jinja interpreter. Each branch below
 * mirrors one branch of the template; tests compare the output with
 * transformers' apply_chat_template byte for byte.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *p;
    size_t n;
} str;

static str S(const char *s) { return (str){s ? s : "", s ? strlen(s) : 0}; }

static int starts_with(str s, const char *pre) {
    size_t k = strlen(pre);
    return s.n >= k && !memcmp(s.p, pre, k);
}

static int ends_with(str s, const char *suf) {
    size_t k = strlen(suf);
    return s.n >= k && !memcmp(s.p + s.n - k, suf, k);
}

static str lstrip_nl(str s) {
    while (s.n && *s.p == '\n') s.p++, s.n--;
    return s;
}

static str rstrip_nl(str s) {
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

/* Python's str.find / rfind for a needle. */
static const char *find(str s, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= s.n; i++)
        if (!memcmp(s.p + i, needle, k)) return s.p + i;
    return NULL;
}

static const char *rfind(str s, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = s.n + 1; i-- > 0;)
        if (i + k <= s.n && !memcmp(s.p + i, needle, k)) return s.p + i;
    return NULL;
}

static int put(tok_buf *b, str s) { return tok_buf_append(b, s.p, s.n); }
static int puts_(tok_buf *b, const char *s) { return tok_buf_append(b, s, strlen(s)); }

static int is_role(const tok_chat_message *m, const char *r) { return m->role && !strcmp(m->role, r); }

int tok_chat_apply(const tok_chat_message *msgs, size_t n, const tok_chat_options *opt, char **out,
                   size_t *out_len, char *err, size_t errlen) {
    static const tok_chat_options dflt = {0, 1, NULL, 0};
    *out = NULL;
    *out_len = 0;
    if (!opt) opt = &dflt;
    if (n == 0 && opt->n_tools == 0 && !opt->add_generation_prompt)
        return tok_err(err, errlen, TOK_EINVAL, "chat: no messages");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role) return tok_err(err, errlen, TOK_EINVAL, "chat: message %zu has no role", i);
    tok_buf b = {0};
    int rc = 0;
    if (opt->n_tools) {
        rc |= puts_(&b, "<|im_start|>system\n");
        if (n && is_role(&msgs[0], "system")) {
            rc |= put(&b, S(msgs[0].content));
            rc |= puts_(&b, "\n\n");
        }
        rc |= puts_(&b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        for (size_t i = 0; i < opt->n_tools; i++) {
            rc |= puts_(&b, "\n");
            rc |= puts_(&b, opt->tools_json[i] ? opt->tools_json[i] : "");
        }
        rc |= puts_(&b, "\n</tools>\n\nFor each function call, return a json object with function name and "
                        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (n && is_role(&msgs[0], "system")) {
        rc |= puts_(&b, "<|im_start|>system\n");
        rc |= put(&b, S(msgs[0].content));
        rc |= puts_(&b, "<|im_end|>\n");
    }
    /* The last user turn that is not a tool response: assistant turns after
     * it keep their reasoning. */
    size_t last_query = n ? n - 1 : 0;
    for (size_t k = n; k-- > 0;) {
        str c = S(msgs[k].content);
        if (is_role(&msgs[k], "user") && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const tok_chat_message *m = &msgs[i];
        str content = S(m->content);
        if (is_role(m, "user") || (is_role(m, "system") && i != 0)) {
            rc |= puts_(&b, "<|im_start|>");
            rc |= puts_(&b, m->role);
            rc |= puts_(&b, "\n");
            rc |= put(&b, content);
            rc |= puts_(&b, "<|im_end|>\n");
        } else if (is_role(m, "assistant")) {
            str reasoning = {"", 0};
            if (m->reasoning_content) {
                reasoning = S(m->reasoning_content);
            } else if (find(content, "</think>")) {
                /* content.split('</think>')[-1].lstrip('\n') */
                const char *last = rfind(content, "</think>") + 8;
                str after = {last, (size_t)(content.p + content.n - last)};
                /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                const char *first = find(content, "</think>");
                str before = {content.p, (size_t)(first - content.p)};
                before = rstrip_nl(before);
                const char *open = rfind(before, "<think>");
                if (open) before = (str){open + 7, (size_t)(before.p + before.n - open - 7)};
                reasoning = lstrip_nl(before);
                content = lstrip_nl(after);
            }
            rc |= puts_(&b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || reasoning.n)) {
                rc |= puts_(&b, "<think>\n");
                rc |= put(&b, rstrip_nl(lstrip_nl(reasoning)));
                rc |= puts_(&b, "\n</think>\n\n");
                rc |= put(&b, lstrip_nl(content));
            } else {
                rc |= put(&b, content);
            }
            for (size_t k = 0; k < m->n_tool_calls; k++) {
                if ((k == 0 && content.n) || k > 0) rc |= puts_(&b, "\n");
                rc |= puts_(&b, "<tool_call>\n{\"name\": \"");
                rc |= puts_(&b, m->tool_calls[k].name ? m->tool_calls[k].name : "");
                rc |= puts_(&b, "\", \"arguments\": ");
                rc |= puts_(&b, m->tool_calls[k].arguments ? m->tool_calls[k].arguments : "");
                rc |= puts_(&b, "}\n</tool_call>");
            }
            rc |= puts_(&b, "<|im_end|>\n");
        } else if (is_role(m, "tool")) {
            if (i == 0 || !is_role(&msgs[i - 1], "tool")) rc |= puts_(&b, "<|im_start|>user");
            rc |= puts_(&b, "\n<tool_response>\n");
            rc |= put(&b, content);
            rc |= puts_(&b, "\n</tool_response>");
            if (i == n - 1 || !is_role(&msgs[i + 1], "tool")) rc |= puts_(&b, "<|im_end|>\n");
        }
        /* Other roles render nothing, as in the template. */
    }
    if (opt->add_generation_prompt) {
        rc |= puts_(&b, "<|im_start|>assistant\n");
        if (!opt->enable_thinking) rc |= puts_(&b, "<think>\n\n</think>\n\n");
    }
    if (!rc) rc = tok_buf_append(&b, "", 0);
    if (rc) {
        free(b.p);
        return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    }
    *out = b.p;
    *out_len = b.len;
    return TOK_OK;
}
