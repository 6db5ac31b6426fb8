/*
 * engine/chat.h — a model's tokenizer and chat template, loaded from the
 * same path as its weights (engine/tokenizer_load.c: the glue between
 * tokenizer/ and the model folder or GGUF file).
 */
#ifndef ECHO_ENGINE_CHAT_H
#define ECHO_ENGINE_CHAT_H

#include <stddef.h>

/* A model's tokenizer: `model_path`'s tokenizer.json / tokenizer.model
 * (tok_load_dir), or a GGUF file's tokenizer.ggml.* metadata. With `chat`
 * non-NULL it also receives the model's Jinja chat template
 * (tokenizer_config.json "chat_template", or the GGUF's
 * tokenizer.chat_template; NULL when the model has none) and the BOS/EOS
 * token texts templates refer to ("" when unknown), and the template
 * compiled once for every eng_chat_render (a template the interpreter
 * cannot compile is no load error: compiled stays NULL and compile_err says
 * why, which each render reports); free with eng_chat_template_free.
 * Returns 0, ENG_TOK_MISSING when a folder has no tokenizer files, or -1
 * with a message. */
#define ENG_TOK_MISSING (-2)
typedef struct tok_tokenizer tok_tokenizer;
typedef struct tok_template tok_template;
typedef struct eng_chat_template {
    char *source;
    char *bos_token, *eos_token;
    tok_template *compiled; /* source's; NULL: not compiled (compile_err) or no source */
    char *compile_err;      /* why source does not compile; NULL when it does */
} eng_chat_template;
int eng_tokenizer_load(const char *model_path, tok_tokenizer **tok, eng_chat_template *chat, char *err,
                       size_t errlen);
void eng_chat_template_free(eng_chat_template *chat);
/* The built-in template (Qwen3's, tok_chat_builtin_source), compiled, for
 * models that ship none; no BOS/EOS texts (""). 0, or -1 with a message. */
int eng_chat_template_builtin(eng_chat_template *chat, char *err, size_t errlen);
/* Render chat's template (compiled at load; a hand-made chat with only a
 * source is compiled per call) with `context_json`, a JSON object of the template's
 * variables (messages, add_generation_prompt, chat_template_kwargs...):
 * bos_token / eos_token are added when absent, as transformers does.
 * *out is malloc'ed. -1 with a message: no template, a construct the
 * interpreter does not support, or the template's own raise_exception. */
int eng_chat_render(const eng_chat_template *chat, const char *context_json, char **out, size_t *out_len,
                    char *err, size_t errlen);

#endif
