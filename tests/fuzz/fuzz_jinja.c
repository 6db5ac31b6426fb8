/*
 * libFuzzer target for tokenizer/jinja*.c: the input is a chat template. It
 * is compiled and, when it compiles, rendered with a fixed context (messages
 * with tool calls, tools, special tokens). Either step may fail, but only
 * with a message: no crash, leak, hang (the interpreter's step, memory and
 * output limits bound every render) or undefined behaviour.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char CTX[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":\"Weather in Paris? \\u00e9\\ud83d\\ude00\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"check\",\"tool_calls\":"
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"n\":1.5}}}]},"
    "{\"role\":\"tool\",\"content\":\"{\\\"t\\\": 21}\"},"
    "{\"role\":\"assistant\",\"content\":\"Sunny, 21C.\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"thanks\"},{\"type\":\"image\"}]}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}],"
    "\"add_generation_prompt\":true,\"enable_thinking\":false,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\","
    "\"n\":3,\"f\":-0.25,\"none\":null,\"l\":[3,1,2],\"d\":{\"b\":2,\"a\":[true,false]}}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tok_template *t;
    char err[256], *out;
    size_t ol;
    if (tok_template_compile((const char *)data, size, &t, err, sizeof err) != TOK_OK) {
        if (!err[0]) abort(); /* every failure carries a message */
        return 0;
    }
    int rc = tok_template_render(t, CTX, sizeof CTX - 1, &out, &ol, err, sizeof err);
    if (rc == TOK_OK) {
        if (strlen(out) > ol || out[ol]) abort(); /* NUL-terminated at out_len */
        free(out);
    } else if (!err[0]) {
        abort();
    }
    tok_template_free(t);
    return 0;
}
