/*
 * The built-in chat template: Qwen3's (tokenizer_config.json "chat_template"),
 * for models that ship none, rendered by the Jinja interpreter (jinja*.c) like
 * every model's own template. One change to the text: a tool may come as
 * JSON text already (tok_chat_options.tools_json), inserted verbatim, as the
 * template itself does for a tool call's arguments. Tests compare the output
 * with transformers' apply_chat_template byte for byte.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

static const char qwen3_template[] =
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {%- if tool is string %}\n"
    "            {{- tool }}\n"
    "        {%- else %}\n"
    "            {{- tool | tojson }}\n"
    "        {%- endif %}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set content = message.content %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}\n"
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}";

const char *tok_chat_builtin_source(void) { return qwen3_template; }

/* The template's context: {"messages": [...], "tools": [...],
 * "add_generation_prompt": b, "enable_thinking": b}. NULL when out of memory. */
static json_t *chat_context(const tok_chat_message *msgs, size_t n, const tok_chat_options *opt) {
    json_t *ms = json_array(), *tools = json_array();
    json_t *ctx = json_pack("{s:o,s:o,s:b,s:b}", "messages", ms, "tools", tools, "add_generation_prompt",
                            opt->add_generation_prompt != 0, "enable_thinking", opt->enable_thinking != 0);
    if (!ctx) return NULL;
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        const tok_chat_message *m = &msgs[i];
        json_t *jm = json_pack("{s:s,s:s}", "role", m->role, "content", m->content ? m->content : "");
        if (!jm || json_array_append_new(ms, jm)) {
            bad = 1;
            break;
        }
        if (m->reasoning_content) bad |= json_object_set_new(jm, "reasoning_content", json_string(m->reasoning_content));
        if (!m->n_tool_calls) continue;
        json_t *calls = json_array();
        bad |= json_object_set_new(jm, "tool_calls", calls);
        for (size_t k = 0; k < m->n_tool_calls && !bad; k++) {
            const tok_tool_call *tc = &m->tool_calls[k];
            bad |= json_array_append_new(
                calls, json_pack("{s:{s:s,s:s}}", "function", "name", tc->name ? tc->name : "", "arguments",
                                 tc->arguments ? tc->arguments : ""));
        }
    }
    for (size_t i = 0; i < opt->n_tools && !bad; i++)
        bad |= json_array_append_new(tools, json_string(opt->tools_json[i] ? opt->tools_json[i] : ""));
    if (bad) {
        json_decref(ctx);
        return NULL;
    }
    return ctx;
}

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
    json_t *ctx = chat_context(msgs, n, opt);
    char *ctx_text = ctx ? json_dumps(ctx, JSON_COMPACT) : NULL;
    json_decref(ctx);
    if (!ctx_text) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    tok_template *t = NULL;
    int rc = tok_template_compile(qwen3_template, sizeof qwen3_template - 1, &t, err, errlen);
    if (rc == TOK_OK) rc = tok_template_render(t, ctx_text, strlen(ctx_text), out, out_len, err, errlen);
    tok_template_free(t);
    free(ctx_text);
    return rc;
}
