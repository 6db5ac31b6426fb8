/*
 * server/: an OpenAI completions or chat request -> its runs. A generation
 * request becomes one srv_req per choice (prompts x n or best_of), sharing a
 * notifier group, ready for the scheduler to take together. Defaults come
 * from generation_config.json, limits from the engine (context, KV cache).
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/internal.h"

/* clang-format off */
static const char *const COMPLETION_FIELDS[] = {
    "model",          "prompt",          "max_tokens",        "temperature",     "top_p",
    "top_k",          "seed",            "stop",              "stream",          "stream_options",
    "logprobs",       "n",               "echo",              "user",            "ignore_eos",
    "min_tokens",     "repetition_penalty", "stop_token_ids", "presence_penalty", "frequency_penalty",
    "logit_bias",     "best_of",         "suffix",            "min_p",           "prompt_logprobs",
    "response_format", "structured_outputs", "guided_json",   "guided_regex",    "guided_choice",
    "guided_grammar", "guided_decoding_backend",
    NULL};
static const char *const CHAT_FIELDS[] = {
    "model",          "messages",        "max_tokens",        "max_completion_tokens", "temperature",
    "top_p",          "top_k",           "seed",              "stop",              "stream",
    "stream_options", "logprobs",        "top_logprobs",      "n",                 "user",
    "ignore_eos",     "min_tokens",      "repetition_penalty", "stop_token_ids",   "presence_penalty",
    "frequency_penalty", "logit_bias",   "min_p",             "chat_template_kwargs", "add_generation_prompt",
    "tools",          "tool_choice",     "parallel_tool_calls", "response_format", "prompt_logprobs",
    "structured_outputs", "guided_json", "guided_regex",      "guided_choice",     "guided_grammar",
    "guided_decoding_backend", "thinking_budget", "debug_force_output",
    NULL};
/* clang-format on */

void srv_gen_free(srv_gen *g) {
    for (int i = 0; i < g->n_rs; i++)
        srv_req_unref(g->rs[i]);
    free(g->rs);
    if (g->prompt_text)
        for (int i = 0; i < g->n_prompts; i++)
            free(g->prompt_text[i]);
    free(g->prompt_text);
    if (g->grp) srv_group_unref(g->grp);
    json_decref(g->tools);
    srv_fast_ids_free(&g->fi);
    memset(g, 0, sizeof *g);
}

typedef struct prompt_list {
    int32_t **ids;
    int *n;
    int count;
} prompt_list;

static void prompts_free(prompt_list *pl) {
    for (int i = 0; i < pl->count; i++)
        free(pl->ids[i]);
    free(pl->ids);
    free(pl->n);
    memset(pl, 0, sizeof *pl);
}

/* `prompt`: a string, token ids, or a batch (list) of strings / id lists. */
static int parse_prompts(srv_server *s, json_t *root, srv_fast_ids *fi, prompt_list *pl, srv_verr *e) {
    if (fi->present) { /* the ids came straight from the body text; same checks, same order */
        for (int i = 0; i < fi->count; i++) {
            if (fi->bad_set && fi->bad_at == i)
                return srv_fail(e, 400, "prompt", "token id %lld in 'prompt' is out of range [0, %d)", fi->bad,
                                s->mc.vocab_size);
            if (fi->n[i] == 0) return srv_fail(e, 400, "prompt", "'prompt' is empty");
        }
        pl->ids = fi->ids;
        pl->n = fi->n;
        pl->count = fi->count;
        fi->ids = NULL;
        fi->n = NULL;
        fi->count = 0;
        return 0;
    }
    json_t *p = srv_field(root, "prompt");
    if (!p) return srv_fail(e, 400, "prompt", "'prompt' is required");
    if (!json_is_string(p) && !json_is_array(p))
        return srv_fail(e, 400, "prompt", "'prompt' must be a string, an array of token ids, or a list of those");
    int batch = json_is_array(p) && json_array_size(p) > 0 &&
                (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)));
    size_t m = batch ? json_array_size(p) : 1;
    if (m > SRV_MAX_CHOICES) return srv_fail(e, 400, "prompt", "at most %d prompts per request", SRV_MAX_CHOICES);
    pl->ids = calloc(m, sizeof *pl->ids);
    pl->n = calloc(m, sizeof *pl->n);
    if (!pl->ids || !pl->n) return srv_fail(e, 500, "prompt", "out of memory");
    for (size_t i = 0; i < m; i++) {
        json_t *x = batch ? json_array_get(p, i) : p;
        int rc;
        pl->count = (int)i + 1;
        if (json_is_string(x))
            rc =
                srv_encode_text(s, json_string_value(x), json_string_length(x), 1, "prompt", &pl->ids[i], &pl->n[i], e);
        else if (json_is_array(x))
            rc = srv_parse_ids(s, x, "prompt", &pl->ids[i], &pl->n[i], e);
        else
            return srv_fail(e, 400, "prompt", "each prompt of a batch must be a string or an array of token ids");
        if (rc) return rc;
        if (pl->n[i] == 0) return srv_fail(e, 400, "prompt", "'prompt' is empty");
    }
    return 0;
}

static int parse_stop(srv_server *s, json_t *root, srv_req *r, srv_verr *e) {
    json_t *st = srv_field(root, "stop");
    if (st) {
        json_t *one = json_is_string(st) ? st : NULL;
        size_t n = one ? 1 : json_is_array(st) ? json_array_size(st) : (size_t)-1;
        if (n == (size_t)-1) return srv_fail(e, 400, "stop", "'stop' must be a string or an array of strings");
        if (n > SRV_MAX_STOPS) return srv_fail(e, 400, "stop", "at most %d stop strings", SRV_MAX_STOPS);
        for (size_t i = 0; i < n; i++) {
            json_t *v = one ? one : json_array_get(st, i);
            if (!json_is_string(v)) return srv_fail(e, 400, "stop", "'stop' must be a string or an array of strings");
            size_t L = json_string_length(v);
            if (L == 0 || L > SRV_MAX_STOP_LEN)
                return srv_fail(e, 400, "stop", "stop strings must be 1..%d bytes", SRV_MAX_STOP_LEN);
            if (!(r->stop[r->n_stop] = malloc(L + 1))) return srv_fail(e, 500, "stop", "out of memory");
            memcpy(r->stop[r->n_stop], json_string_value(v), L + 1);
            r->stop_len[r->n_stop++] = L;
        }
    }
    json_t *sid = srv_field(root, "stop_token_ids");
    if (sid) {
        if (!json_is_array(sid))
            return srv_fail(e, 400, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
        if (json_array_size(sid) > SRV_MAX_STOP_IDS)
            return srv_fail(e, 400, "stop_token_ids", "at most %d stop_token_ids", SRV_MAX_STOP_IDS);
        if (srv_parse_ids(s, sid, "stop_token_ids", &r->stop_ids, &r->n_stop_ids, e)) return -1;
    }
    return 0;
}

/* OpenAI's logit_bias: {"token id": bias in [-100, 100]}. */
static int parse_logit_bias(srv_server *s, json_t *root, srv_req *r, srv_verr *e) {
    json_t *lb = srv_field(root, "logit_bias");
    if (!lb) return 0;
    if (!json_is_object(lb)) return srv_fail(e, 400, "logit_bias", "'logit_bias' must be an object of token id: bias");
    size_t m = json_object_size(lb);
    if (m > SRV_MAX_LOGIT_BIAS)
        return srv_fail(e, 400, "logit_bias", "at most %d logit_bias entries", SRV_MAX_LOGIT_BIAS);
    if (!m) return 0;
    r->bias_ids = malloc(m * sizeof *r->bias_ids);
    r->bias_vals = malloc(m * sizeof *r->bias_vals);
    if (!r->bias_ids || !r->bias_vals) return srv_fail(e, 500, "logit_bias", "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        char *end;
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id >= s->mc.vocab_size) {
            char q[48];
            return srv_fail(e, 400, "logit_bias", "logit_bias key '%s' is not a token id in [0, %d)",
                            srv_quote(q, sizeof q, k, strlen(k)), s->mc.vocab_size);
        }
        if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < -100 ||
            json_number_value(v) > 100)
            return srv_fail(e, 400, "logit_bias", "logit_bias values must be numbers in [-100, 100]");
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_vals[r->n_bias++] = (float)json_number_value(v);
    }
    return 0;
}

/* A run of the template t over one prompt, with the scheduler-side buffers. */
static srv_req *req_clone(srv_server *s, const srv_req *t, const int32_t *prompt, int n_prompt, int max_tokens,
                          srv_group *grp, srv_verr *e) {
    srv_req *r = srv_req_new();
    if (!r) return srv_fail(e, 500, NULL, "out of memory"), NULL;
    r->chat = t->chat;
    memcpy(r->id, t->id, sizeof r->id);
    r->created = t->created;
    r->max_tokens = max_tokens;
    r->min_tokens = t->min_tokens;
    r->ignore_eos = t->ignore_eos;
    r->want_logprobs = t->want_logprobs;
    r->top_logprobs = t->top_logprobs;
    r->sp = t->sp;
    r->rep_penalty = t->rep_penalty;
    r->plp_k = t->plp_k;
    r->want_cum = t->want_cum;
    r->presence = t->presence;
    r->frequency = t->frequency;
    r->min_p = t->min_p;
    r->grp = grp;
    r->rz_on = t->rz_on;
    r->rz_state0 = t->rz_state0;
    r->rz_stop = t->rz_stop;
    r->think_budget = t->think_budget;
    memcpy(r->chain, t->chain, sizeof r->chain);
    r->n_chain = t->n_chain;
    srv_reasoner_init(&r->rz, t->rz_on ? s->reason : NULL, t->rz_state0, t->rz_stop);
    if (t->n_forced && (r->forced = malloc((size_t)t->n_forced * sizeof *r->forced))) {
        memcpy(r->forced, t->forced, (size_t)t->n_forced * sizeof *r->forced);
        r->n_forced = t->n_forced;
    }
    if (t->n_forced && !r->forced) {
        srv_req_unref(r);
        return srv_fail(e, 500, NULL, "out of memory"), NULL;
    }
    if (t->gram && gram_matcher_new(t->gram, &r->gm, NULL, 0) != GRAM_OK) {
        srv_req_unref(r);
        return srv_fail(e, 500, NULL, "out of memory for a grammar matcher"), NULL;
    }
    pthread_mutex_lock(&grp->mu);
    grp->refs++;
    pthread_mutex_unlock(&grp->mu);
    int oom = 0;
    for (int i = 0; i < t->n_stop; i++) {
        if (!(r->stop[i] = malloc(t->stop_len[i] + 1))) {
            oom = 1;
            break;
        }
        memcpy(r->stop[i], t->stop[i], t->stop_len[i] + 1);
        r->stop_len[i] = t->stop_len[i];
        r->n_stop = i + 1;
    }
    if (t->n_stop_ids && (r->stop_ids = malloc((size_t)t->n_stop_ids * sizeof *r->stop_ids))) {
        memcpy(r->stop_ids, t->stop_ids, (size_t)t->n_stop_ids * sizeof *r->stop_ids);
        r->n_stop_ids = t->n_stop_ids;
    }
    oom |= t->n_stop_ids && !r->stop_ids;
    if (t->n_bias) {
        r->bias_ids = malloc((size_t)t->n_bias * sizeof *r->bias_ids);
        r->bias_vals = malloc((size_t)t->n_bias * sizeof *r->bias_vals);
        if (r->bias_ids && r->bias_vals) {
            memcpy(r->bias_ids, t->bias_ids, (size_t)t->n_bias * sizeof *r->bias_ids);
            memcpy(r->bias_vals, t->bias_vals, (size_t)t->n_bias * sizeof *r->bias_vals);
            r->n_bias = t->n_bias;
        } else {
            oom = 1;
        }
    }
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    r->all = malloc(((size_t)n_prompt + (size_t)max_tokens) * sizeof *r->all);
    r->ds = tok_stream_new(s->tok, 1); /* skip special tokens, as vLLM by default */
    if (r->plp_k >= 0) r->prompt_lp = calloc((size_t)n_prompt, sizeof *r->prompt_lp);
    if (oom || !r->prompt || !r->all || !r->ds || (r->plp_k >= 0 && !r->prompt_lp)) {
        srv_req_unref(r);
        return srv_fail(e, 500, NULL, "out of memory"), NULL;
    }
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *r->prompt);
    memcpy(r->all, prompt, (size_t)n_prompt * sizeof *r->all);
    r->n_prompt = n_prompt;
    r->n_all = n_prompt;
    r->t_arrive = srv_now();
    return r;
}

/* Per-prompt max_tokens: the request's, or the default (completions 16, as
 * OpenAI and vLLM; chat the rest of the context), within context and cache. */
static int prompt_max_tokens(srv_server *s, int chat, int n_prompt, long long mt_req, const char *mt_name, int *out,
                             srv_verr *e) {
    const char *what = chat ? "messages" : "prompt";
    if (n_prompt > s->max_model_len || (n_prompt == s->max_model_len && mt_req != 0))
        return srv_fail(e, 400, what,
                        "This model's maximum context length is %d tokens. However, your prompt has %d tokens, leaving "
                        "no room for a completion.",
                        s->max_model_len, n_prompt);
    long long room = s->max_model_len - n_prompt;
    /* KV blocks for prompt + max_tokens are reserved at admission, so a
     * request must fit the whole cache or it could never be admitted. */
    long long kv_room = (long long)s->total_blocks * s->block_size - n_prompt;
    if (kv_room < (mt_req == 0 ? 0 : 1))
        return srv_fail(e, 400, what, "the prompt (%d tokens) does not fit the KV cache (%d tokens)", n_prompt,
                        s->total_blocks * s->block_size);
    long long mt = mt_req;
    if (mt < 0) {
        mt = room < kv_room ? room : kv_room;
        if (!chat && mt > 16) mt = 16;
    }
    if (mt > room)
        return srv_fail(e, 400, mt_name,
                        "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in "
                        "the %s, %lld in the completion). Please reduce the length of the %s or completion.",
                        s->max_model_len, n_prompt + mt, n_prompt, what, mt, what);
    if (mt > kv_room)
        return srv_fail(e, 400, mt_name, "prompt (%d tokens) + %s (%lld) exceeds the KV cache (%d tokens)", n_prompt,
                        mt_name, mt, s->total_blocks * s->block_size);
    *out = (int)mt;
    return 0;
}

/* Known fields this server cannot honour except with their neutral value. */
static int check_neutral(json_t *o, srv_verr *e) {
    json_t *v;
    if ((v = srv_field(o, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
        return srv_fail(e, 400, "suffix", "'suffix' is not supported");
    if ((v = srv_field(o, "guided_decoding_backend")) && !json_is_string(v))
        return srv_fail(e, 400, "guided_decoding_backend", "'guided_decoding_backend' must be a string");
    if ((v = srv_field(o, "user")) && !json_is_string(v)) return srv_fail(e, 400, "user", "'user' must be a string");
    return 0;
}

/* Reasoning of a chat request (server/reasoning.c): where its output
 * starts, the thinking budget (thinking_budget, else --reasoning-budget),
 * and the tool-call marker that ends a block (fmt: tools are on). Also the
 * testing field debug_force_output (--debug-request-fields). */
static int parse_reasoning(srv_server *s, json_t *root, const int32_t *prompt, int n_prompt,
                           const srv_tool_format *fmt, srv_req *t, srv_verr *e) {
    int thinking = 1;
    json_t *kw = srv_field(root, "chat_template_kwargs");
    json_t *et = json_is_object(kw) ? srv_field(kw, "enable_thinking") : NULL;
    if (json_is_boolean(et)) thinking = json_is_true(et);
    int st = srv_reason_start_state(s, prompt, n_prompt, thinking);
    t->rz_on = st >= 0;
    t->rz_state0 = st >= 0 ? (srv_rz_state)st : SRV_RZ_CONTENT;
    t->rz_stop = fmt ? fmt->begin : NULL;
    t->think_budget = s->opt.has_reasoning_budget ? s->opt.reasoning_budget : -1;
    long long v;
    int got = srv_get_int(root, "thinking_budget", 0, INT32_MAX, &v, e);
    if (got < 0) return -1;
    if (got) {
        if (!s->reason)
            return srv_fail(e, 400, "thinking_budget",
                            "'thinking_budget' needs a reasoning parser: this server runs --reasoning-parser none "
                            "(or its chat template has no <think> block)");
        t->think_budget = (int)v;
    }
    json_t *fo = srv_field(root, "debug_force_output");
    if (fo) {
        if (!s->opt.debug_request_fields)
            return srv_fail(e, 400, "debug_force_output",
                            "'debug_force_output' is a testing field: start the server with --debug-request-fields");
        if (!json_is_string(fo))
            return srv_fail(e, 400, "debug_force_output", "'debug_force_output' must be a string");
        if (srv_encode_text(s, json_string_value(fo), json_string_length(fo), 0, "debug_force_output", &t->forced,
                            &t->n_forced, e))
            return -1;
    }
    return 0;
}

/* n, best_of, stream and stream_options into g. */
static int parse_shape(json_t *root, int chat, srv_gen *g, srv_verr *e) {
    long long v = 0;
    g->n = 1;
    if (srv_get_int(root, "n", 1, SRV_MAX_CHOICES, &v, e) < 0) return -1;
    if (srv_field(root, "n")) g->n = (int)v;
    g->per = g->n;
    if (!chat) {
        if (srv_get_int(root, "best_of", 1, SRV_MAX_CHOICES, &v, e) < 0) return -1;
        if (srv_field(root, "best_of")) {
            if (v < g->n) return srv_fail(e, 400, "best_of", "'best_of' (%lld) must be >= n (%d)", v, g->n);
            g->per = (int)v;
        }
    }
    if (srv_get_bool(root, "stream", &g->stream, e) < 0) return -1;
    if (g->stream && g->per > g->n)
        return srv_fail(e, 400, "best_of", "'best_of' > n cannot be streamed (the best are known only at the end)");
    json_t *so = srv_field(root, "stream_options");
    if (so) {
        static const char *const so_known[] = {"include_usage", "continuous_usage_stats", NULL};
        if (!json_is_object(so)) return srv_fail(e, 400, "stream_options", "'stream_options' must be an object");
        if (!g->stream) return srv_fail(e, 400, "stream_options", "'stream_options' requires \"stream\": true");
        srv_check_known(so, so_known, "stream_options.", e);
        if (srv_get_bool(so, "include_usage", &g->include_usage, e) < 0) return -1;
        if (srv_get_bool(so, "continuous_usage_stats", &g->continuous_usage, e) < 0) return -1;
    }
    return 0;
}

/* The prompts (chat: the rendered messages, with their tools into tl) and
 * the logprobs fields into pl, g and t. */
static int parse_input(srv_server *s, json_t *root, int chat, srv_gen *g, srv_req *t, prompt_list *pl,
                       srv_tools *tl, srv_verr *e) {
    long long v = 0;
    if (srv_get_int(root, "prompt_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &v, e) < 0) return -1;
    if (srv_field(root, "prompt_logprobs")) {
        if (g->stream)
            return srv_fail(e, 400, "prompt_logprobs", "'prompt_logprobs' is not supported with \"stream\": true");
        g->vllm_plp = 1;
        g->vllm_k = (int)v;
        t->plp_k = (int)v;
    }
    if (!chat) {
        if (parse_prompts(s, root, &g->fi, pl, e)) return -1;
        if (srv_get_int(root, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &v, e) < 0) return -1;
        if (srv_field(root, "logprobs")) {
            t->want_logprobs = 1;
            t->top_logprobs = (int)v;
        }
        if (srv_get_bool(root, "echo", &g->echo, e) < 0) return -1;
        if (g->echo && t->want_logprobs) {
            g->echo_lp = 1;
            if (t->plp_k < t->top_logprobs) t->plp_k = t->top_logprobs;
        }
        return 0;
    }
    pl->ids = calloc(1, sizeof *pl->ids);
    pl->n = calloc(1, sizeof *pl->n);
    if (!pl->ids || !pl->n) return srv_fail(e, 500, NULL, "out of memory");
    pl->count = 1;
    int add_gen = 1;
    if (srv_get_bool(root, "add_generation_prompt", &add_gen, e) < 0) return -1;
    if (srv_render_chat(s, root, add_gen, &pl->ids[0], &pl->n[0], tl, e)) return -1;
    if (pl->n[0] == 0) return srv_fail(e, 400, "messages", "the rendered chat is empty");
    int lp = 0;
    if (srv_get_bool(root, "logprobs", &lp, e) < 0) return -1;
    t->want_logprobs = lp;
    if (srv_get_int(root, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &v, e) < 0) return -1;
    if (srv_field(root, "top_logprobs")) {
        if (!lp) return srv_fail(e, 400, "top_logprobs", "'top_logprobs' requires \"logprobs\": true");
        t->top_logprobs = (int)v;
    }
    return 0;
}

/* Each prompt's max_tokens into mts (pl->count), their least into *mt_min. */
static int parse_max_tokens(srv_server *s, json_t *root, int chat, const srv_gen *g, const prompt_list *pl,
                            int *mts, int *mt_min, srv_verr *e) {
    /* max_tokens: 0 only to score the prompt (echo or prompt_logprobs) */
    const char *mt_name = "max_tokens";
    if (chat && srv_field(root, "max_completion_tokens")) mt_name = "max_completion_tokens";
    long long mt_req = -1;
    int mt_lo = g->echo || g->vllm_plp ? 0 : 1;
    if (srv_get_int(root, mt_name, mt_lo, INT32_MAX, &mt_req, e) < 0) return -1;
    if (chat && srv_field(root, "max_completion_tokens") && srv_field(root, "max_tokens")) {
        long long other;
        if (srv_get_int(root, "max_tokens", mt_lo, INT32_MAX, &other, e) < 0) return -1;
        if (other < mt_req) mt_req = other;
    }
    for (int i = 0; i < pl->count; i++) {
        if (prompt_max_tokens(s, chat, pl->n[i], mt_req, mt_name, &mts[i], e)) return -1;
        if (mts[i] < *mt_min) *mt_min = mts[i];
    }
    return 0;
}

/* Sampling and the processors' parameters (defaults from
 * generation_config.json), min_tokens (at most mt_min), stop. */
static int parse_sampling(srv_server *s, json_t *root, srv_req *t, int mt_min, long long *seed, int *seeded,
                          srv_verr *e) {
    long long v = 0;
    double d = 0;
    int b = 0;
    t->sp.temperature = s->gd.temperature;
    t->sp.top_p = s->gd.top_p;
    t->sp.top_k = s->gd.top_k;
    t->rep_penalty = s->gd.repetition_penalty;
    if (srv_get_num(root, "temperature", 0, 2, 0, &d, e) < 0) return -1;
    if (srv_field(root, "temperature")) t->sp.temperature = d < 1e-5 ? 0 : (float)d;
    if (srv_get_num(root, "top_p", 0, 1, 1, &d, e) < 0) return -1;
    if (srv_field(root, "top_p")) t->sp.top_p = (float)d;
    if (srv_get_int(root, "top_k", -1, s->mc.vocab_size, &v, e) < 0) return -1;
    if (srv_field(root, "top_k")) t->sp.top_k = v < 0 ? 0 : (int)v;
    if (srv_get_num(root, "repetition_penalty", 0, 10, 1, &d, e) < 0) return -1;
    if (srv_field(root, "repetition_penalty")) t->rep_penalty = (float)d;
    if (srv_get_num(root, "presence_penalty", -2, 2, 0, &d, e) < 0) return -1;
    if (srv_field(root, "presence_penalty")) t->presence = (float)d;
    if (srv_get_num(root, "frequency_penalty", -2, 2, 0, &d, e) < 0) return -1;
    if (srv_field(root, "frequency_penalty")) t->frequency = (float)d;
    if (srv_get_num(root, "min_p", 0, 1, 0, &d, e) < 0) return -1;
    if (srv_field(root, "min_p")) t->min_p = (float)d;
    if (parse_logit_bias(s, root, t, e)) return -1;
    *seeded = srv_get_int(root, "seed", LLONG_MIN, LLONG_MAX, seed, e);
    if (*seeded < 0) return -1;
    if (srv_get_bool(root, "ignore_eos", &b, e) < 0) return -1;
    if (srv_field(root, "ignore_eos")) t->ignore_eos = b;
    if (srv_get_int(root, "min_tokens", 0, mt_min, &v, e) < 0) return -1;
    if (srv_field(root, "min_tokens")) t->min_tokens = (int)v;
    return parse_stop(s, root, t, e);
}

/* The constraint, and for chat the tool format, reasoning and the tools'
 * grammar into g and t. */
static int parse_output(srv_server *s, json_t *root, int chat, srv_gen *g, srv_req *t, const prompt_list *pl,
                        const srv_tools *tl, srv_verr *e) {
    if (srv_parse_constraint(s, root, g->client_fd, &t->gram, e)) return -1;
    if (chat) {
        g->tool_parse = tl->choice != SRV_TOOL_NONE;
        g->tool_parallel = tl->parallel;
        g->tool_fmt = srv_tool_format_for(s);
        if (tl->tools) g->tools = json_incref(tl->tools);
        if (parse_reasoning(s, root, pl->ids[0], pl->n[0], tl->choice != SRV_TOOL_NONE ? g->tool_fmt : NULL, t, e))
            return -1;
        g->reason = t->rz_on;
        if (t->gram && (tl->choice == SRV_TOOL_REQUIRED || tl->choice == SRV_TOOL_NAMED))
            return srv_fail(e, 400, "tool_choice",
                            "'tool_choice' %s and a structured-output constraint cannot be combined",
                            tl->choice == SRV_TOOL_NAMED ? "naming a function" : "\"required\"");
        if (srv_tools_grammar(s, tl, g->client_fd, &t->gram, e)) return -1;
    }
    if (t->gram) {
        pthread_mutex_lock(&s->met.mu);
        s->met.constrained++;
        pthread_mutex_unlock(&s->met.mu);
    }
    return 0;
}

/* The runs: per prompt, g->per clones of the plan t (seeds seed, seed + 1,
 * ...; unseeded runs each draw their own). cnt: the request's counter. */
static int make_runs(srv_server *s, srv_gen *g, srv_req *t, const prompt_list *pl, const int *mts, int seeded,
                     long long seed, unsigned long long cnt, srv_verr *e) {
    if (!(g->grp = srv_group_new())) return srv_fail(e, 500, NULL, "out of memory");
    g->grp->refs = 1; /* g's own */
    g->n_prompts = pl->count;
    if (!(g->rs = calloc((size_t)pl->count * (size_t)g->per, sizeof *g->rs)))
        return srv_fail(e, 500, NULL, "out of memory");
    if (g->echo && !(g->prompt_text = calloc((size_t)pl->count, sizeof *g->prompt_text)))
        return srv_fail(e, 500, NULL, "out of memory");
    for (int i = 0; i < pl->count; i++) {
        if (g->echo) {
            size_t tl;
            char terr[128];
            if (tok_decode(s->tok, pl->ids[i], (size_t)pl->n[i], 0, &g->prompt_text[i], &tl, terr, sizeof terr) !=
                TOK_OK)
                return srv_fail(e, 500, "echo", "cannot decode the prompt: %s", terr);
        }
        for (int j = 0; j < g->per; j++) {
            unsigned long long c = j ? atomic_fetch_add(&s->req_counter, 1) : cnt;
            t->sp.seed = seeded ? (uint64_t)seed + (uint64_t)j : s->seed_base ^ (c * 0xbf58476d1ce4e5b9ull);
            srv_req *r = req_clone(s, t, pl->ids[i], pl->n[i], mts[i], g->grp, e);
            if (!r) return -1;
            eng_rng_seed(&r->rng, r->sp.seed);
            r->index = i * g->n + j;
            g->rs[g->n_rs++] = r;
        }
    }
    return 0;
}

/* Validated body -> g->rs (not yet submitted): the request's plan — prompt
 * ids, the logits-processor chain (srv_logits_plan), the stop strings and
 * ids, the tool format — built once into the template t, then cloned per
 * run. */
static int parse_generate(srv_server *s, json_t *root, int chat, srv_gen *g, srv_verr *e) {
    g->chat = chat;
    if (srv_check_known(root, chat ? CHAT_FIELDS : COMPLETION_FIELDS, "", e) || check_neutral(root, e) ||
        srv_model_check(s, root, e) || parse_shape(root, chat, g, e))
        return -1;
    srv_req *t = srv_req_new(); /* the template of every run */
    prompt_list pl = {0};
    srv_tools tl = {0}; /* chat: tools and tool_choice, parsed with the messages */
    int rc = -1, *mts = NULL, mt_min = INT32_MAX, seeded = 0;
    long long seed = 0;
    if (!t) return srv_fail(e, 500, NULL, "out of memory");
    t->chat = chat;
    if (parse_input(s, root, chat, g, t, &pl, &tl, e)) goto out;
    if ((long long)pl.count * g->per > SRV_MAX_CHOICES || pl.count * g->per > s->opt.max_waiting) {
        srv_fail(e, 400, pl.count > 1 ? "prompt" : "n", "prompts x %s = %d runs; at most %d per request",
                 g->per > g->n ? "best_of" : "n", pl.count * g->per,
                 SRV_MAX_CHOICES < s->opt.max_waiting ? SRV_MAX_CHOICES : s->opt.max_waiting);
        goto out;
    }
    if (!(mts = calloc((size_t)pl.count, sizeof *mts))) {
        srv_fail(e, 500, NULL, "out of memory");
        goto out;
    }
    if (parse_max_tokens(s, root, chat, g, &pl, mts, &mt_min, e) ||
        parse_sampling(s, root, t, mt_min, &seed, &seeded, e) || parse_output(s, root, chat, g, t, &pl, &tl, e))
        goto out;
    t->want_cum = g->per > g->n;
    srv_logits_plan(s, t); /* every run's logits-processor chain */
    unsigned long long cnt = atomic_fetch_add(&s->req_counter, 1);
    snprintf(t->id, sizeof t->id, "%s-%016llx%08llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)(s->seed_base ^ cnt * 0x94d049bb133111ebull), cnt);
    t->created = (long long)time(NULL);
    rc = make_runs(s, g, t, &pl, mts, seeded, seed, cnt, e);
out:
    srv_tools_free(&tl);
    free(mts);
    prompts_free(&pl);
    srv_req_unref(t);
    return rc;
}

int srv_gen_prepare_json(srv_server *s, json_t *root, int chat, srv_gen *g, srv_verr *e) {
    int rc = parse_generate(s, root, chat, g, e);
    if (rc) srv_gen_free(g);
    return rc;
}

int srv_gen_prepare(srv_server *s, srv_request *rq, int chat, srv_gen *g, srv_verr *e) {
    if (!chat) srv_fast_ids_take(rq->body, rq->len, "prompt", 1, s->mc.vocab_size, &g->fi);
    json_t *root = srv_parse_body(rq, e);
    if (!root) {
        srv_fast_ids_free(&g->fi);
        return -1;
    }
    int rc = parse_generate(s, root, chat, g, e);
    json_decref(root);
    if (rc) srv_gen_free(g);
    srv_fast_ids_free(&g->fi);
    return rc;
}
