/*
 * tokenizer — text <-> token ids, bit-exact with Hugging Face `tokenizers`,
 * and chat templates rendered as transformers' apply_chat_template does.
 *
 * At a glance
 *   load     tok_load_dir, tok_load_json_file, tok_load_json_mem,
 *            tok_load_sentencepiece, tok_load_bpe_vocab (GGUF arrays); tok_free
 *   query    tok_kind, tok_vocab_size, tok_token_id, tok_eos_id,
 *            tok_is_special, tok_token_bytes
 *   text     tok_encode, tok_decode; tok_stream_* decodes generated ids
 *   chat     tok_template_compile/render/free (any model's Jinja template);
 *            tok_chat_apply (the built-in Qwen3 template, for models with none)
 *
 * Contract
 * - Threads: a loaded tok_tokenizer and a compiled tok_template are never
 *   changed by the functions that take them `const`; call those from many
 *   threads at once (the internal pre-token cache is lock-protected).
 * - Errors: functions return TOK_OK (0) or a negative TOK_E* code and write
 *   a NUL-terminated message into `err` (may be NULL when errlen is 0). The
 *   library never prints or exits. Output buffers are malloc'ed and owned by
 *   the caller (free()).
 * - What loads: BPE tokenizer.json files, byte-level (GPT-2 / Qwen /
 *   Llama-3 / SmolLM) or over characters (Metaspace, Llama-style
 *   normalizers, unk, fuse_unk, byte_fallback), with HF's pipeline order:
 *   added tokens on the raw text, normalizers, pre-tokenizers, BPE merges by
 *   rank, post-processor. tokenizer/README.md lists every supported
 *   normalizer, pre-tokenizer and decoder; anything else in the file is
 *   refused at load time with a message naming it, never tokenized wrongly.
 * - Encode input must be valid UTF-8 (what a Python str can hold): invalid
 *   input is TOK_EINVAL with the byte offset; nothing is silently replaced.
 * - Decode maps ids to bytes by the decoder's rule and converts them as
 *   Rust's String::from_utf8_lossy does (one U+FFFD per maximal invalid
 *   subpart; HF's ByteFallback decoder gives one per byte token, so only
 *   such hand-made id sequences differ). No space clean-up; ids that name no
 *   token are skipped, as HF does; special tokens kept unless skip_special.
 * - Streaming decode emits only complete characters; everything it emits,
 *   tok_stream_finish included, concatenates to tok_decode of the same ids.
 */
#ifndef ECHO_TOKENIZER_H
#define ECHO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TOK_OK = 0,
    TOK_EIO = -1,          /* file missing / unreadable */
    TOK_EFORMAT = -2,      /* malformed or unsupported tokenizer file */
    TOK_EINVAL = -3,       /* bad argument or input (e.g. invalid UTF-8) */
    TOK_ENOMEM = -4,
    TOK_EUNSUPPORTED = -5, /* feature not built in (e.g. SentencePiece) */
};

typedef struct tok_tokenizer tok_tokenizer;

/* Load DIR/tokenizer.json (+ DIR/tokenizer_config.json when present), or
 * DIR/tokenizer.model (SentencePiece) when there is no tokenizer.json. */
int tok_load_dir(const char *dir, tok_tokenizer **out, char *err, size_t errlen);
/* Load a tokenizer.json; config_path (tokenizer_config.json) may be NULL. */
int tok_load_json_file(const char *path, const char *config_path, tok_tokenizer **out,
                       char *err, size_t errlen);
/* Same from memory (json need not be NUL-terminated). */
int tok_load_json_mem(const char *json, size_t len, tok_tokenizer **out, char *err,
                      size_t errlen);
/* Load a SentencePiece model (tokenizer.model). */
int tok_load_sentencepiece(const char *path, tok_tokenizer **out, char *err, size_t errlen);
/* A byte-level BPE given as plain arrays, e.g. a GGUF's tokenizer.ggml.*
 * (the caller reads the file: tokenizer/ does not depend on weights/).
 * Token strings are in the ByteLevel alphabet as in a tokenizer.json vocab. */
typedef struct tok_bpe_vocab {
    const char *const *tokens; /* n_tokens strings, NOT NUL-terminated */
    const size_t *token_lens;
    size_t n_tokens;
    const char *const *merges; /* "a b" each, NOT NUL-terminated */
    const size_t *merge_lens;
    size_t n_merges;
    /* n_tokens GGUF token types (1 normal, 2 unknown, 3 control,
     * 4 user-defined, 5 unused, 6 byte), or NULL (all normal). Control and
     * user-defined tokens become special added tokens. */
    const int32_t *types;
    /* llama.cpp pre-tokenizer name (tokenizer.ggml.pre): "default", "gpt-2",
     * "smollm", "qwen2", "llama-bpe"; NULL = "default". Others: error. */
    const char *pre;
    int32_t bos_id, eos_id, unk_id, pad_id; /* -1 when absent */
    int add_bos, add_eos; /* add_special prepends BOS / appends EOS */
} tok_bpe_vocab;
/* Load from arrays; tok_eos_id() is v->eos_id. Nothing in v is kept. */
int tok_load_bpe_vocab(const tok_bpe_vocab *v, tok_tokenizer **out, char *err, size_t errlen);
void tok_free(tok_tokenizer *t);

/* "bpe" or "sentencepiece". */
const char *tok_kind(const tok_tokenizer *t);
/* One past the largest id that names a token. */
size_t tok_vocab_size(const tok_tokenizer *t);
/* Id of an exact token string (added tokens included), or -1. */
int32_t tok_token_id(const tok_tokenizer *t, const char *token);
/* End-of-sequence id from tokenizer_config.json / the model, or -1. */
int32_t tok_eos_id(const tok_tokenizer *t);
/* 1 when id is a special added token (skipped by skip_special). */
int tok_is_special(const tok_tokenizer *t, int32_t id);
/* The bytes one token adds to decoded text in the middle of a sequence
 * (no first-token rule: a SentencePiece "▁x" is " x"), for grammar engines
 * that match tokens against text. *p stays valid while t lives. Returns 0,
 * or -1 when id names no token or a special token (which has no text). */
int tok_token_bytes(const tok_tokenizer *t, int32_t id, const char **p, size_t *n);

/* Encode len bytes of UTF-8 text. add_special applies the file's
 * post-processor (Qwen3: adds nothing; SentencePiece: BOS when defined).
 * *ids is malloc'ed (never NULL on success, even for 0 ids). */
int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_special,
               int32_t **ids, size_t *n_ids, char *err, size_t errlen);
/* Decode to a malloc'ed NUL-terminated UTF-8 string of *out_len bytes. */
int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n_ids, int skip_special,
               char **out, size_t *out_len, char *err, size_t errlen);

/* Incremental detokenizer for generated ids. */
typedef struct tok_stream tok_stream;
/* NULL only when out of memory. */
tok_stream *tok_stream_new(const tok_tokenizer *t, int skip_special);
/* Feed one id; text and len receive the newly complete text (possibly empty),
 * valid until the next call on this stream. */
int tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len, char *err,
                    size_t errlen);
/* End of generation: flush held-back bytes (an incomplete character
 * becomes U+FFFD). The stream may then be reused from scratch. */
int tok_stream_finish(tok_stream *s, const char **text, size_t *len);
/* Bytes held back now (0..3): the start of a character the next ids may
 * complete. tok_stream_finish would turn them into one U+FFFD. */
size_t tok_stream_pending(const tok_stream *s);
void tok_stream_free(tok_stream *s);

/* ---- The built-in chat template (tokenizer/chat.c) ----
 * Qwen3's template, for models that ship none, rendered by the Jinja
 * interpreter below exactly as transformers renders it. Strings are UTF-8,
 * NUL-terminated. */
typedef struct {
    const char *name;
    const char *arguments; /* JSON text, inserted verbatim */
} tok_tool_call;

typedef struct {
    const char *role;              /* "system", "user", "assistant", "tool" */
    const char *content;           /* NULL is treated as "" */
    const char *reasoning_content; /* NULL = not given */
    const tok_tool_call *tool_calls;
    size_t n_tool_calls;
} tok_chat_message;

typedef struct {
    int add_generation_prompt;
    int enable_thinking;    /* 0 inserts the empty <think> block; nonzero = default */
    const char *const *tools_json; /* each tool as json.dumps() text, may be NULL */
    size_t n_tools;
} tok_chat_options;

int tok_chat_apply(const tok_chat_message *msgs, size_t n_msgs, const tok_chat_options *opt,
                   char **out, size_t *out_len, char *err, size_t errlen);
/* The built-in template's Jinja source (what tok_chat_apply renders), for
 * callers that build the context themselves; its tools may be JSON text. */
const char *tok_chat_builtin_source(void);

/* ---- Jinja chat templates (tokenizer/jinja*.c) ----
 * Any model's chat_template, rendered as transformers' apply_chat_template
 * renders it with jinja2 (sandboxed, trim_blocks, lstrip_blocks,
 * loopcontrols, raise_exception/strftime_now/namespace, json.dumps tojson).
 * A compiled template is immutable: render it from many threads at once.
 * Unsupported constructs fail at compile time with TOK_EFORMAT and a message
 * naming the construct and line; render errors (raise_exception, type
 * errors, undefined values used, step/memory/64 MiB output limits) return
 * TOK_EINVAL with the message. The supported subset: tokenizer/README.md. */
typedef struct tok_template tok_template;
int tok_template_compile(const char *src, size_t len, tok_template **out, char *err, size_t errlen);
/* context_json: a JSON object whose keys become template variables, e.g.
 * {"messages":[...], "add_generation_prompt":true, "bos_token":"<s>",
 *  "tools":[...]}. *out is malloc'ed and NUL-terminated. */
int tok_template_render(const tok_template *t, const char *context_json, size_t context_len,
                        char **out, size_t *out_len, char *err, size_t errlen);
void tok_template_free(tok_template *t);
/* ---- end Jinja chat templates ---- */

#ifdef __cplusplus
}
#endif

#endif
