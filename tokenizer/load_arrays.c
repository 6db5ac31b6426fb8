/*
 * tok_load_bpe_vocab: a byte-level BPE given as plain arrays (a GGUF's
 * tokenizer.ggml.*), rewritten as the tokenizer.json it stands for.
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <string.h>

/* llama.cpp pre-tokenizer names -> the tokenizer.json pipeline HF uses for
 * that family. The regexes are the ones in the published tokenizer.json. */
static const struct {
    const char *name, *pre;
} PRE_NAMES[] = {
    {"default", "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"},
    {"gpt-2", "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"},
    {"smollm", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},"
               "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}]}"},
    {"qwen2", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
              "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}"
              "\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\","
              "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}"},
    {"llama-bpe", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
                  "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s"
                  "\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":"
                  "\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                  "\"use_regex\":false}]}"},
};

/* Build the tokenizer.json object the arrays stand for and load that, so
 * both paths share one loader and one set of rules. */
static int vocab_to_json(const tok_bpe_vocab *v, json_t **out, char *err, size_t errlen) {
    const char *pre = v->pre ? v->pre : "default", *pre_json = NULL;
    for (size_t i = 0; i < sizeof PRE_NAMES / sizeof *PRE_NAMES; i++)
        if (!strcmp(pre, PRE_NAMES[i].name)) pre_json = PRE_NAMES[i].pre;
    if (!pre_json)
        return tok_err(err, errlen, TOK_EUNSUPPORTED,
                       "unsupported pre-tokenizer '%s' (supported: default, gpt-2, smollm, qwen2, llama-bpe)",
                       pre);
    if (!v->tokens || !v->token_lens || v->n_tokens == 0)
        return tok_err(err, errlen, TOK_EINVAL, "vocab: no tokens");
    if (v->n_merges && (!v->merges || !v->merge_lens)) return tok_err(err, errlen, TOK_EINVAL, "vocab: merges missing");
    if (v->n_tokens >= 16u * 1024 * 1024) return tok_err(err, errlen, TOK_EINVAL, "vocab: too many tokens");
    int32_t ids[4] = {v->bos_id, v->eos_id, v->unk_id, v->pad_id};
    for (int i = 0; i < 4; i++)
        if (ids[i] < -1 || ids[i] >= (int32_t)v->n_tokens)
            return tok_err(err, errlen, TOK_EINVAL, "vocab: special id %d out of range", (int)ids[i]);
    json_error_t je;
    json_t *root = json_object(), *model = json_object(), *vocab = json_object(), *merges = json_array(),
           *added = json_array(), *pt = json_loads(pre_json, 0, &je);
    int rc = TOK_OK;
    if (!root || !model || !vocab || !merges || !added || !pt) {
        json_decref(root);
        json_decref(model);
        json_decref(vocab);
        json_decref(merges);
        json_decref(added);
        json_decref(pt);
        return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    }
    json_object_set_new(root, "model", model);
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", merges);
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "pre_tokenizer", pt);
    if (v->unk_id >= 0)
        json_object_set_new(model, "unk_token",
                            json_stringn(v->tokens[v->unk_id], v->token_lens[v->unk_id]));
    for (size_t i = 0; i < v->n_tokens; i++) {
        const char *s = v->tokens[i];
        size_t n = v->token_lens[i];
        if (!s || n == 0 || tok_utf8_valid_prefix(s, n) != n) {
            rc = tok_err(err, errlen, TOK_EFORMAT, "token %zu is empty or not valid UTF-8", i);
            goto fail;
        }
        json_t *str = json_stringn(s, n);
        if (!str) goto oom;
        /* A repeated string keeps its first id, as a tokenizer.json can
         * name each string once. */
        if (!json_object_getn(vocab, s, n) && json_object_setn_new(vocab, s, n, json_integer((json_int_t)i))) {
            json_decref(str);
            goto oom;
        }
        int type = v->types ? v->types[i] : 1;
        if (type == 3 || type == 4) {
            json_t *a = json_object();
            if (!a || json_array_append_new(added, a)) goto oom;
            json_object_set_new(a, "id", json_integer((json_int_t)i));
            json_object_set_new(a, "content", str);
            json_object_set_new(a, "special", json_true());
            json_object_set_new(a, "normalized", json_false());
        } else {
            json_decref(str);
        }
    }
    for (size_t i = 0; i < v->n_merges; i++) {
        const char *s = v->merges[i];
        size_t n = v->merge_lens[i];
        if (!s || tok_utf8_valid_prefix(s, n) != n) {
            rc = tok_err(err, errlen, TOK_EFORMAT, "merges[%zu]: not valid UTF-8", i);
            goto fail;
        }
        if (json_array_append_new(merges, json_stringn(s, n))) goto oom;
    }
    *out = root;
    return TOK_OK;
oom:
    rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
fail:
    json_decref(root);
    return rc;
}

int tok_load_bpe_vocab(const tok_bpe_vocab *v, tok_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    if (!v) return tok_err(err, errlen, TOK_EINVAL, "vocab: NULL");
    json_t *root = NULL;
    int rc = vocab_to_json(v, &root, err, errlen);
    if (rc) return rc;
    tok_tokenizer *t = NULL;
    rc = tok_load_json_root(root, &t, err, errlen);
    json_decref(root);
    if (rc) return rc;
    t->eos_id = v->eos_id;
    if ((v->add_bos && v->bos_id >= 0 && tok_push_id(&t->post_pre, &t->n_post_pre, v->bos_id)) ||
        (v->add_eos && v->eos_id >= 0 && tok_push_id(&t->post_suf, &t->n_post_suf, v->eos_id))) {
        tok_free(t);
        return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    }
    *out = t;
    return TOK_OK;
}
