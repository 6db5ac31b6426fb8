/*
 * server/: response JSON of the generation routes: choices, logprobs (the
 * completions and chat shapes, vLLM's prompt_logprobs), usage and timings,
 * shared by whole answers and stream chunks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

json_t *srv_timings_json(const srv_req *r) {
    int n = r->n_toks;
    double q = r->t_sched > 0 ? r->t_sched - r->t_arrive : 0;
    double pf = n ? r->t_first - r->t_sched : 0, ttft = n ? r->t_first - r->t_arrive : 0;
    double dec = n ? r->t_last - r->t_first : 0;
    json_t *t = json_pack("{s:f,s:f,s:f,s:f,s:f,s:f}", "queue_ms", 1e3 * q, "prefill_ms", 1e3 * pf, "ttft_ms",
                          1e3 * ttft, "decode_ms", 1e3 * dec, "per_token_ms", n > 1 ? 1e3 * dec / (n - 1) : 0.0,
                          "e2e_ms", 1e3 * ((r->t_done > 0 ? r->t_done : srv_now()) - r->t_arrive));
    json_t *sp = srv_spec_timings(r);
    if (t && sp) json_object_set_new(t, "speculative", sp);
    return t;
}

/* cached: prompt tokens whose KV came from the prefix cache (OpenAI's
 * prompt_tokens_details.cached_tokens, as vLLM reports it). */
json_t *srv_usage(long long p, long long c, long long cached) {
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)p, "completion_tokens", (json_int_t)c,
                     "total_tokens", (json_int_t)(p + c), "prompt_tokens_details", "cached_tokens", (json_int_t)cached);
}

/* Whole-request usage: each prompt once, every run's completion tokens;
 * cached tokens summed over every run (each looked the cache up), so the
 * sum over responses equals /metrics' prefix-cache hits. */
json_t *srv_usage_all(const srv_gen *g) {
    long long p = 0, c = 0, k = 0, th = 0;
    for (int i = 0; i < g->n_rs; i++) {
        srv_req *r = g->rs[i];
        if (i % g->per == 0) p += r->n_prompt;
        pthread_mutex_lock(&r->mu);
        c += r->n_toks;
        k += atomic_load(&r->n_reused);
        th += atomic_load(&r->n_think);
        pthread_mutex_unlock(&r->mu);
    }
    json_t *u = srv_usage(p, c, k);
    /* OpenAI's completion_tokens_details.reasoning_tokens: the tokens inside
     * the thinking blocks (markers excluded), when reasoning is parsed */
    if (u && g->reason)
        json_object_set_new(u, "completion_tokens_details", json_pack("{s:I}", "reasoning_tokens", (json_int_t)th));
    return u;
}

json_t *srv_tok_str(srv_server *s, int32_t id) {
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

typedef struct lp_arrays {
    json_t *toks, *lps, *tops, *offs;
} lp_arrays;

void srv_offsets_start(srv_server *s, srv_offsets *o, size_t chars) {
    o->ds = tok_stream_new(s->tok, 0);
    o->chars = chars;
    o->ready = 1;
}

void srv_offsets_free(srv_offsets *o) {
    tok_stream_free(o->ds);
    memset(o, 0, sizeof *o);
}

/* The offset of token (internal.h, srv_offsets), then token counted in. A
 * stream decodes the ids as tok_decode does the whole run: the characters
 * before a token are those it has completed, plus one for an incomplete
 * character it holds back (the decoding of the tokens so far shows that as
 * U+FFFD). Without the stream (out of memory), each token counts the
 * characters of its own string, as vLLM sums them. */
static size_t offsets_push(srv_server *s, srv_offsets *o, int32_t token, json_t *ts) {
    if (!o->ready) srv_offsets_start(s, o, 0);
    size_t at = o->chars + (o->ds && tok_stream_pending(o->ds) ? 1 : 0);
    const char *t = NULL;
    size_t tl = 0;
    char terr[64];
    if (o->ds && tok_stream_push(o->ds, token, &t, &tl, terr, sizeof terr) == TOK_OK)
        o->chars += srv_utf8_chars(t, tl);
    else
        o->chars += srv_utf8_chars(json_string_value(ts), json_string_length(ts));
    return at;
}

/* One position of completions logprobs; rec NULL: the first prompt token
 * (no logprob); k: top entries to show. */
static void lp_push(srv_server *s, lp_arrays *a, int32_t token, const srv_tokrec *rec, int k, srv_offsets *off) {
    json_t *ts = srv_tok_str(s, token);
    json_array_append_new(a->offs, json_integer((json_int_t)offsets_push(s, off, token, ts)));
    json_array_append_new(a->toks, ts);

    if (!rec) {
        json_array_append_new(a->lps, json_null());
        json_array_append_new(a->tops, json_null());
        return;
    }
    json_array_append_new(a->lps, json_real(rec->logprob));
    json_t *d = json_object();
    int n = rec->n_top < k ? rec->n_top : k;
    for (int i = 0; i < n; i++) {
        json_t *ks = srv_tok_str(s, rec->top_ids[i]);
        json_object_set_new(d, json_string_value(ks), json_real(rec->top_lp[i]));
        json_decref(ks);
    }
    json_array_append_new(a->tops, d);
}

/* Completions logprobs: with_prompt (echo) the prompt's tokens first (the
 * first one null), then generated toks[0..n), text offsets from *off. */
json_t *srv_completion_logprobs(srv_server *s, const srv_req *r, int with_prompt, const srv_tokrec *t, int n,
                                srv_offsets *off) {
    lp_arrays a = {json_array(), json_array(), json_array(), json_array()};
    if (with_prompt)
        for (int i = 0; i < r->n_prompt; i++)
            lp_push(s, &a, r->prompt[i], i ? &r->prompt_lp[i] : NULL, r->top_logprobs, off);
    for (int i = 0; i < n; i++)
        lp_push(s, &a, t[i].token, &t[i], t[i].n_top, off);
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", a.toks, "token_logprobs", a.lps, "top_logprobs", a.tops,
                     "text_offset", a.offs);
}

/* vLLM's prompt_logprobs: [null, {"id": {"logprob", "rank", "decoded_token"}}, ...],
 * the prompt token itself then the top k. */
static json_t *vllm_prompt_logprobs(srv_server *s, const srv_req *r, int k) {
    json_t *out = json_array();
    json_array_append_new(out, json_null());
    for (int i = 1; i < r->n_prompt; i++) {
        const srv_tokrec *p = &r->prompt_lp[i];
        json_t *d = json_object();
        char key[16];
        snprintf(key, sizeof key, "%d", (int)p->token);
        json_object_set_new(d, key,
                            json_pack("{s:f,s:i,s:o}", "logprob", (double)p->logprob, "rank", p->rank, "decoded_token",
                                      srv_tok_str(s, p->token)));
        int n = p->n_top < k ? p->n_top : k;
        for (int j = 0; j < n; j++) {
            snprintf(key, sizeof key, "%d", (int)p->top_ids[j]);
            if (json_object_get(d, key)) continue;
            json_object_set_new(d, key,
                                json_pack("{s:f,s:i,s:o}", "logprob", (double)p->top_lp[j], "rank", j + 1,
                                          "decoded_token", srv_tok_str(s, p->top_ids[j])));
        }
        json_array_append_new(out, d);
    }
    return out;
}

json_t *srv_chat_logprobs(srv_server *s, const srv_tokrec *t, int n) {
    json_t *content = json_array();
    for (int i = 0; i < n; i++) {
        json_t *tops = json_array();
        for (int k = 0; k < t[i].n_top; k++)
            json_array_append_new(tops, json_pack("{s:o,s:f,s:o}", "token", srv_tok_str(s, t[i].top_ids[k]), "logprob",
                                                  (double)t[i].top_lp[k], "bytes", tok_bytes(s, t[i].top_ids[k])));
        json_array_append_new(content,
                              json_pack("{s:o,s:f,s:o,s:o}", "token", srv_tok_str(s, t[i].token), "logprob",
                                        (double)t[i].logprob, "bytes", tok_bytes(s, t[i].token), "top_logprobs", tops));
    }
    return json_pack("{s:o}", "content", content);
}

const char *srv_finish_reason(srv_finish f) {
    return f == SRV_FIN_LENGTH ? "length" : f == SRV_FIN_STOP ? "stop" : "abort";
}

/* vLLM's stop_reason: the matched stop string, the stop_token_ids entry, or null. */
json_t *srv_stop_reason(const srv_req *r) {
    if (r->stop_str >= 0) return json_stringn(r->stop[r->stop_str], r->stop_len[r->stop_str]);
    if (r->stop_tok >= 0) return json_integer(r->stop_tok);
    return json_null();
}

/* prompt text + generated text (echo). */
static json_t *echo_text(const char *pt, const char *text, size_t tl) {
    size_t pl = pt ? strlen(pt) : 0;
    char *t = malloc(pl + tl + 1);
    if (!t) return NULL;
    if (pl) memcpy(t, pt, pl);
    if (tl) memcpy(t + pl, text, tl);
    json_t *j = json_stringn(t, pl + tl);
    free(t);
    return j;
}

/* "tool_calls" when calls were parsed, unless the run hit max_tokens: then
 * "length", whatever was parsed (a call may have been cut). */
const char *srv_tool_finish_reason(const srv_req *r, int have_calls) {
    return have_calls && r->finish != SRV_FIN_LENGTH ? "tool_calls" : srv_finish_reason(r->finish);
}

int srv_req_split(const srv_gen *g, const srv_req *r, srv_text *reason, srv_text *content, int *opened) {
    srv_reasoner z;
    srv_reasoner_init(&z, r->rz_on ? r->rz.f : NULL, r->rz_state0, r->rz_stop);
    (void)g;
    int rc = srv_reasoner_feed(&z, r->text ? r->text : "", r->text_len, reason, content);
    rc |= srv_reasoner_flush(&z, reason, content);
    *opened = z.opened;
    return rc;
}

json_t *srv_calls_in(const srv_gen *g, const srv_req *r, int index, const char *text, size_t len, char **content,
                     size_t *clen) {
    if (r->finish == SRV_FIN_ABORT || r->finish == SRV_FIN_ERROR || !text) return NULL;
    /* ids unique per response: the request id's hex, the choice, the call */
    const char *hex = strchr(r->id, '-');
    char base[48];
    snprintf(base, sizeof base, "%.24s%02x", hex ? hex + 1 : r->id, (unsigned)index & 0xffu);
    json_t *calls = srv_tool_calls_parse_typed(g->tool_fmt, g->tools, text, len, base, content, clen);
    /* parallel_tool_calls false: one call, as OpenAI returns (auto is not constrained) */
    while (calls && !g->tool_parallel && json_array_size(calls) > 1)
        json_array_remove(calls, json_array_size(calls) - 1);
    return calls;
}

json_t *srv_req_tool_calls(const srv_gen *g, const srv_req *r, int index, char **content, size_t *clen) {
    if (r->finish == SRV_FIN_ABORT || r->finish == SRV_FIN_ERROR || !r->text) return NULL;
    srv_text rz = {0}, ct = {0};
    int opened = 0;
    json_t *calls = NULL;
    if (!srv_req_split(g, r, &rz, &ct, &opened))
        calls = srv_calls_in(g, r, index, ct.p ? ct.p : "", ct.len, content, clen);
    srv_text_free(&rz);
    srv_text_free(&ct);
    return calls;
}

static json_t *choice_json(srv_server *s, const srv_gen *g, const srv_req *r, int prompt_i, int index) {
    json_t *choice, *lp = json_null();
    if (!g->chat) {
        const char *pt = g->prompt_text ? g->prompt_text[prompt_i] : NULL;
        if (r->want_logprobs) {
            srv_offsets off = {0};
            json_decref(lp);
            srv_offsets_start(s, &off, !g->echo_lp && pt ? srv_utf8_chars(pt, strlen(pt)) : 0);
            lp = srv_completion_logprobs(s, r, g->echo_lp, r->toks, r->n_toks, &off);
            srv_offsets_free(&off);
        }
        json_t *text = echo_text(pt, r->text ? r->text : "", r->text_len);
        choice = json_pack("{s:i,s:o,s:o,s:s,s:o}", "index", index, "text", text ? text : json_string(""), "logprobs",
                           lp, "finish_reason", srv_finish_reason(r->finish), "stop_reason", srv_stop_reason(r));
    } else {
        if (r->want_logprobs) {
            json_decref(lp);
            lp = srv_chat_logprobs(s, r->toks, r->n_toks);
        }
        char *content = NULL;
        size_t clen = 0;
        srv_text rz = {0}, ct = {0};
        int opened = 0;
        if (srv_req_split(g, r, &rz, &ct, &opened)) {
            srv_text_free(&rz);
            srv_text_free(&ct);
            json_decref(lp);
            return NULL; /* out of memory: the builder's failure is logged by the sender */
        }
        json_t *calls = g->tool_parse ? srv_calls_in(g, r, index, ct.p ? ct.p : "", ct.len, &content, &clen) : NULL;
        json_t *text = calls  ? (clen ? json_stringn(content, clen) : json_null())
                       : json_stringn(ct.p ? ct.p : "", ct.len);
        free(content);
        choice = json_pack("{s:i,s:{s:s,s:o,s:o},s:o,s:s,s:o}", "index", index, "message", "role", "assistant",
                           "content", text ? text : json_string(""), "tool_calls", calls ? calls : json_array(),
                           "logprobs", lp, "finish_reason", srv_tool_finish_reason(r, calls != NULL),
                           "stop_reason", srv_stop_reason(r));
        /* the thinking, when the output had a block (no field otherwise) */
        if (choice && opened)
            srv_reason_set(s, json_object_get(choice, "message"), json_stringn(rz.p ? rz.p : "", rz.len));
        srv_text_free(&rz);
        srv_text_free(&ct);
    }
    if (choice && g->vllm_plp) json_object_set_new(choice, "prompt_logprobs", vllm_prompt_logprobs(s, r, g->vllm_k));
    return choice;
}

static int cmp_cum(const void *a, const void *b) {
    const srv_req *x = *(srv_req *const *)a, *y = *(srv_req *const *)b;
    return x->cum_logprob > y->cum_logprob ? -1 : x->cum_logprob < y->cum_logprob ? 1 : x->index - y->index;
}

json_t *srv_full_response(srv_server *s, srv_gen *g) {
    json_t *choices = json_array();
    for (int i = 0; i < g->n_prompts; i++) {
        srv_req **runs = g->rs + (size_t)i * g->per;
        /* best_of: the n runs with the highest cumulative logprob */
        if (g->per > g->n) qsort(runs, (size_t)g->per, sizeof *runs, cmp_cum);
        for (int j = 0; j < g->n; j++)
            json_array_append_new(choices, choice_json(s, g, runs[j], i, i * g->n + j));
    }
    const srv_req *r0 = g->rs[0];
    return json_pack("{s:s,s:s,s:I,s:s,s:o,s:o,s:o}", "id", r0->id, "object",
                     g->chat ? "chat.completion" : "text_completion", "created", (json_int_t)r0->created, "model",
                     s->name, "choices", choices, "usage", srv_usage_all(g), "timings", srv_timings_json(r0));
}
