/*
 * server/: /tokenize and /detokenize (vLLM's): a prompt or chat messages to
 * token ids, and token ids back to text.
 */
#include <stdlib.h>

#include "server/internal.h"

/* /tokenize body -> response object (*out; NULL only when out of memory),
 * or -1 with *e set. */
static int tokenize_body(srv_server *s, srv_request *rq, json_t **out, srv_verr *e) {
    static const char *const known[] = {"model",
                                        "prompt",
                                        "messages",
                                        "add_special_tokens",
                                        "add_generation_prompt",
                                        "chat_template_kwargs",
                                        "return_token_strs",
                                        "tools",
                                        "tool_choice",
                                        NULL};
    json_t *root = srv_parse_body(rq, e);
    if (!root) return -1;
    int32_t *ids = NULL;
    int n = 0, add_special = 1, add_gen = 1, strs = 0;
    if (srv_check_known(root, known, "", e) || srv_model_check(s, root, e) ||
        srv_get_bool(root, "add_special_tokens", &add_special, e) < 0 ||
        srv_get_bool(root, "add_generation_prompt", &add_gen, e) < 0 ||
        srv_get_bool(root, "return_token_strs", &strs, e) < 0)
        goto fail;
    json_t *p = srv_field(root, "prompt");
    if (p && srv_field(root, "messages")) {
        srv_fail(e, 400, "prompt", "give either 'prompt' or 'messages', not both");
        goto fail;
    }
    if (p) {
        if (!json_is_string(p)) {
            srv_fail(e, 400, "prompt", "'prompt' must be a string");
            goto fail;
        }
        if (srv_encode_text(s, json_string_value(p), json_string_length(p), add_special, "prompt", &ids, &n, e))
            goto fail;
    } else if (srv_field(root, "messages")) {
        if (srv_render_chat(s, root, add_gen, &ids, &n, NULL, e)) goto fail;
    } else {
        srv_fail(e, 400, "prompt", "'prompt' (or 'messages') is required");
        goto fail;
    }
    json_t *toks = json_array(), *ts = strs ? json_array() : json_null();
    for (int i = 0; i < n; i++) {
        json_array_append_new(toks, json_integer(ids[i]));
        if (strs) json_array_append_new(ts, srv_tok_str(s, ids[i]));
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

enum MHD_Result srv_handle_tokenize(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    srv_verr e = {0};
    json_t *out = NULL;
    if (tokenize_body(s, rq, &out, &e)) return srv_send_verr(s, c, &e);
    srv_log_unknown(s, &e, "", "tokenize");
    return srv_send_json(s, c, 200, out);
}

/* /detokenize body -> response object (*out; NULL only when out of memory),
 * or -1 with *e set. */
static int detokenize_body(srv_server *s, srv_request *rq, json_t **out, srv_verr *e) {
    static const char *const known[] = {"model", "tokens", NULL};
    srv_fast_ids fi;
    srv_fast_ids_take(rq->body, rq->len, "tokens", 0, s->mc.vocab_size, &fi);
    json_t *root = srv_parse_body(rq, e);
    int32_t *ids = NULL;
    int n = 0;
    if (!root) goto fail;
    json_t *t = srv_field(root, "tokens");
    if (srv_check_known(root, known, "", e) || srv_model_check(s, root, e)) goto fail;
    if (fi.present) {
        if (fi.bad_set) {
            srv_fail(e, 400, "tokens", "token id %lld in 'tokens' is out of range [0, %d)", fi.bad, s->mc.vocab_size);
            goto fail;
        }
        ids = fi.ids[0];
        n = fi.n[0];
        fi.ids[0] = NULL;
    } else {
        if (!json_is_array(t)) {
            srv_fail(e, 400, "tokens", "'tokens' must be an array of token ids");
            goto fail;
        }
        if (srv_parse_ids(s, t, "tokens", &ids, &n, e)) goto fail;
    }
    char *txt = NULL;
    size_t tl;
    char terr[128];
    if (tok_decode(s->tok, ids, (size_t)n, 0, &txt, &tl, terr, sizeof terr) != TOK_OK) {
        srv_fail(e, 400, "tokens", "cannot decode: %s", terr);
        goto fail;
    }
    *out = json_pack("{s:o}", "prompt", json_stringn(txt, tl));
    free(txt);
    free(ids);
    json_decref(root);
    srv_fast_ids_free(&fi);
    return 0;
fail:
    free(ids);
    json_decref(root);
    srv_fast_ids_free(&fi);
    return -1;
}

enum MHD_Result srv_handle_detokenize(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    srv_verr e = {0};
    json_t *out = NULL;
    if (detokenize_body(s, rq, &out, &e)) return srv_send_verr(s, c, &e);
    srv_log_unknown(s, &e, "", "detokenize");
    return srv_send_json(s, c, 200, out);
}

/* The answer is serialized as srv_send_json does, then freed. */
static int check_answer(int rc, json_t *out, srv_verr *e) {
    if (rc) return rc;
    char *txt = out ? json_dumps(out, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(out);
    if (!txt) /* what srv_send_json answers */
        rc = srv_fail(e, 500, NULL, out ? "out of memory" : "internal error: the response could not be built");
    free(txt);
    return rc;
}

int srv_check_tokenize(srv_server *s, srv_request *rq, srv_verr *e) {
    json_t *out = NULL;
    return check_answer(tokenize_body(s, rq, &out, e), out, e);
}

int srv_check_detokenize(srv_server *s, srv_request *rq, srv_verr *e) {
    json_t *out = NULL;
    return check_answer(detokenize_body(s, rq, &out, e), out, e);
}
