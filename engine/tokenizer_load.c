/*
 * engine/: a model's tokenizer and chat template, from a Hugging Face folder
 * or a GGUF's metadata. The glue between weights/ (which reads the GGUF)
 * and tokenizer/ (which depends on nothing), so that every program opens a
 * model's tokenizer the same way.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "weights/weights.h"

/* A special token of tokenizer_config.json: a string or {"content": ...}. */
static char *dir_token(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return strdup(json_is_string(v) ? json_string_value(v) : "");
}

/* tokenizer_config.json's "chat_template": a string, or a list of
 * {"name", "template"} of which "default" is the one apply_chat_template
 * uses (NULL when the folder has none), and its bos/eos tokens. */
static int dir_chat_template(const char *dir, eng_chat_template *chat) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    char *out = NULL;
    chat->bos_token = dir_token(root, "bos_token");
    chat->eos_token = dir_token(root, "eos_token");
    json_t *t = json_object_get(root, "chat_template");
    if (json_is_string(t)) {
        out = strdup(json_string_value(t));
    } else if (json_is_array(t)) {
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e) {
            json_t *name = json_object_get(e, "name"), *tpl = json_object_get(e, "template");
            if (!out && json_is_string(name) && !strcmp(json_string_value(name), "default") && json_is_string(tpl))
                out = strdup(json_string_value(tpl));
        }
    }
    json_decref(root);
    chat->source = out;
    return chat->bos_token && chat->eos_token ? 0 : -1;
}

void eng_chat_template_free(eng_chat_template *chat) {
    if (!chat) return;
    tok_template_free(chat->compiled);
    free(chat->compile_err);
    free(chat->source);
    free(chat->bos_token);
    free(chat->eos_token);
    memset(chat, 0, sizeof *chat);
}

static int32_t meta_id(const weights_set *ws, const char *key) {
    int64_t v;
    return weights_meta_int(ws, key, &v) || v < 0 || v > INT32_MAX ? -1 : (int32_t)v;
}

/* The GGUF text of token `id` (special tokens are stored as their text). */
static char *gguf_token_text(const weights_set *ws, int32_t id) {
    const char *s;
    size_t n;
    char *out;
    if (id < 0 || weights_meta_array_str(ws, "tokenizer.ggml.tokens", (size_t)id, &s, &n)) return strdup("");
    if ((out = malloc(n + 1))) {
        memcpy(out, s, n);
        out[n] = 0;
    }
    return out;
}

static int gguf_tokenizer(const char *path, tok_tokenizer **tok, eng_chat_template *chat, char *err,
                          size_t errlen) {
    weights_set *ws = NULL;
    const char **tokens = NULL, **merges = NULL;
    size_t *tlen = NULL, *mlen = NULL, nt = 0, nm = 0, n = 0;
    int32_t *types = NULL;
    char pre[64] = "default";
    int rc = -1, et;
    const char *s = NULL;
    if (weights_open(path, &ws, err, errlen)) return -1;
    if (weights_meta_str(ws, "tokenizer.ggml.model", &s, &n)) {
        snprintf(err, errlen, "%s: the GGUF has no tokenizer (tokenizer.ggml.model)", path);
        rc = ENG_TOK_MISSING;
        goto out;
    }
    if (!(n == 4 && !memcmp(s, "gpt2", 4))) {
        snprintf(err, errlen, "%s: tokenizer.ggml.model is '%.*s': echo reads byte-level BPE ('gpt2') GGUF "
                 "tokenizers only", path, (int)(n < 32 ? n : 32), s);
        goto out;
    }
    if (weights_meta_array(ws, "tokenizer.ggml.tokens", &et, &nt) || et != WEIGHTS_META_STR || nt == 0) {
        snprintf(err, errlen, "%s: tokenizer.ggml.tokens is missing or not a string array", path);
        goto out;
    }
    if (weights_meta_array(ws, "tokenizer.ggml.merges", &et, &nm) || et != WEIGHTS_META_STR) {
        snprintf(err, errlen, "%s: tokenizer.ggml.merges is missing or not a string array", path);
        goto out;
    }
    tokens = malloc(nt * sizeof *tokens);
    tlen = malloc(nt * sizeof *tlen);
    types = malloc(nt * sizeof *types);
    merges = malloc((nm ? nm : 1) * sizeof *merges);
    mlen = malloc((nm ? nm : 1) * sizeof *mlen);
    if (!tokens || !tlen || !types || !merges || !mlen) {
        snprintf(err, errlen, "%s: out of memory for the vocabulary", path);
        goto out;
    }
    size_t ntypes = 0;
    int have_types = weights_meta_array(ws, "tokenizer.ggml.token_type", &et, &ntypes) == 0 && ntypes == nt;
    for (size_t i = 0; i < nt; i++) {
        int64_t ty = 1;
        if (weights_meta_array_str(ws, "tokenizer.ggml.tokens", i, &tokens[i], &tlen[i]) ||
            (have_types && weights_meta_array_int(ws, "tokenizer.ggml.token_type", i, &ty))) {
            snprintf(err, errlen, "%s: tokenizer.ggml.tokens[%zu] unreadable", path, i);
            goto out;
        }
        types[i] = (int32_t)ty;
    }
    for (size_t i = 0; i < nm; i++)
        if (weights_meta_array_str(ws, "tokenizer.ggml.merges", i, &merges[i], &mlen[i])) {
            snprintf(err, errlen, "%s: tokenizer.ggml.merges[%zu] unreadable", path, i);
            goto out;
        }
    if (!weights_meta_str(ws, "tokenizer.ggml.pre", &s, &n)) {
        if (n >= sizeof pre) {
            snprintf(err, errlen, "%s: tokenizer.ggml.pre is too long", path);
            goto out;
        }
        memcpy(pre, s, n);
        pre[n] = 0;
    }
    int64_t add_bos = 0, add_eos = 0;
    weights_meta_int(ws, "tokenizer.ggml.add_bos_token", &add_bos);
    weights_meta_int(ws, "tokenizer.ggml.add_eos_token", &add_eos);
    tok_bpe_vocab v = {.tokens = tokens,
                       .token_lens = tlen,
                       .n_tokens = nt,
                       .merges = merges,
                       .merge_lens = mlen,
                       .n_merges = nm,
                       .types = have_types ? types : NULL,
                       .pre = pre,
                       .bos_id = meta_id(ws, "tokenizer.ggml.bos_token_id"),
                       .eos_id = meta_id(ws, "tokenizer.ggml.eos_token_id"),
                       .unk_id = meta_id(ws, "tokenizer.ggml.unknown_token_id"),
                       .pad_id = meta_id(ws, "tokenizer.ggml.padding_token_id"),
                       .add_bos = add_bos != 0,
                       .add_eos = add_eos != 0};
    char terr[512];
    if (tok_load_bpe_vocab(&v, tok, terr, sizeof terr) != TOK_OK) {
        snprintf(err, errlen, "%s: tokenizer: %s", path, terr);
        goto out;
    }
    rc = 0;
    if (chat) {
        chat->bos_token = gguf_token_text(ws, v.bos_id);
        chat->eos_token = gguf_token_text(ws, v.eos_id);
        if (!weights_meta_str(ws, "tokenizer.chat_template", &s, &n) && (chat->source = malloc(n + 1))) {
            memcpy(chat->source, s, n);
            chat->source[n] = 0;
        }
        if (!chat->bos_token || !chat->eos_token) {
            snprintf(err, errlen, "out of memory");
            eng_chat_template_free(chat);
            tok_free(*tok);
            *tok = NULL;
            rc = -1;
        }
    }
out:
    free(tokens);
    free(tlen);
    free(types);
    free(merges);
    free(mlen);
    weights_close(ws);
    return rc;
}

/* The source compiled once, here, for every render (a server renders one
 * per chat request); what the compiler says when it cannot, kept for them. */
static int chat_compile(eng_chat_template *chat) {
    if (!chat->source) return 0;
    char cerr[1024] = "";
    if (tok_template_compile(chat->source, strlen(chat->source), &chat->compiled, cerr, sizeof cerr) == TOK_OK)
        return 0;
    chat->compiled = NULL;
    return (chat->compile_err = strdup(cerr)) ? 0 : -1;
}

int eng_chat_template_builtin(eng_chat_template *chat, char *err, size_t errlen) {
    memset(chat, 0, sizeof *chat);
    if (!(chat->source = strdup(tok_chat_builtin_source())) || !(chat->bos_token = strdup("")) ||
        !(chat->eos_token = strdup("")) || chat_compile(chat)) {
        eng_chat_template_free(chat);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (!chat->compiled) { /* the built-in one always compiles (tests/unit/test_jinja.c) */
        snprintf(err, errlen, "the built-in chat template: %s", chat->compile_err);
        eng_chat_template_free(chat);
        return -1;
    }
    return 0;
}

int eng_tokenizer_load(const char *model_path, tok_tokenizer **tok, eng_chat_template *chat, char *err,
                       size_t errlen) {
    *tok = NULL;
    if (chat) memset(chat, 0, sizeof *chat);
    int rc;
    if (model_path_is_gguf(model_path)) {
        if ((rc = gguf_tokenizer(model_path, tok, chat, err, errlen))) return rc;
    } else {
        rc = tok_load_dir(model_path, tok, err, errlen);
        if (rc != TOK_OK) return rc == TOK_EIO ? ENG_TOK_MISSING : -1;
        if (chat && dir_chat_template(model_path, chat)) goto oom;
    }
    if (chat && chat_compile(chat)) goto oom;
    return 0;
oom:
    eng_chat_template_free(chat);
    tok_free(*tok);
    *tok = NULL;
    snprintf(err, errlen, "out of memory");
    return -1;
}

int eng_chat_render(const eng_chat_template *chat, const char *context_json, char **out, size_t *out_len,
                    char *err, size_t errlen) {
    json_error_t je;
    tok_template *own = NULL; /* a chat made by hand: compiled for this call */
    char *ctx_text = NULL;
    int rc = -1;
    *out = NULL;
    if (!chat || !chat->source) {
        snprintf(err, errlen, "the model has no chat template");
        return -1;
    }
    json_t *ctx = json_loads(context_json, 0, &je);
    if (!json_is_object(ctx)) {
        snprintf(err, errlen, "chat context is not a JSON object: %s", je.text);
        goto out;
    }
    /* transformers passes the tokenizer's special tokens to every template */
    if (!json_object_get(ctx, "bos_token")) json_object_set_new(ctx, "bos_token", json_string(chat->bos_token));
    if (!json_object_get(ctx, "eos_token")) json_object_set_new(ctx, "eos_token", json_string(chat->eos_token));
    /* ... and tools / documents, None when the request has none */
    if (!json_object_get(ctx, "tools")) json_object_set_new(ctx, "tools", json_null());
    if (!json_object_get(ctx, "documents")) json_object_set_new(ctx, "documents", json_null());
    if (!(ctx_text = json_dumps(ctx, JSON_COMPACT))) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    const tok_template *t = chat->compiled;
    if (!t && chat->compile_err) {
        snprintf(err, errlen, "%s", chat->compile_err);
        goto out;
    }
    if (!t && tok_template_compile(chat->source, strlen(chat->source), &own, err, errlen) != TOK_OK) goto out;
    if (!t) t = own;
    if (tok_template_render(t, ctx_text, strlen(ctx_text), out, out_len, err, errlen) != TOK_OK) goto out;
    rc = 0;
out:
    tok_template_free(own);
    free(ctx_text);
    json_decref(ctx);
    return rc;
}
