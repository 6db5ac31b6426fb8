/*
 * server/: streaming answers as server-sent events. MHD pulls the body
 * through a content-reader callback, which waits on the request's notifier
 * group (up to a second) and turns what the scheduler published since the
 * last pass into "data: {chunk}\n\n" events, ending with "data: [DONE]". A
 * quiet stream gets a keep-alive comment every two seconds, so a departed
 * client is noticed; MHD then frees the stream, which cancels its runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/internal.h"

typedef struct run_cur {
    int tok_cur, started, fin_sent;
    size_t text_cur; /* of the run's text; with tools, of ct (the answer so far) */
    size_t raw_cur;  /* with tools: of the run's text */
    srv_offsets off; /* logprobs.text_offset across the run's chunks */
    srv_reasoner rz; /* thinking split from the answer (reasoning.c), as the text comes */
    srv_text ct;     /* with tools: the answer so far */
} run_cur;

typedef struct stream_ctx {
    srv_server *s;
    srv_gen g;
    run_cur *cur; /* (g.n_rs) */
    int n_fin;
    unsigned long long seen;
    char *out;
    size_t out_len, out_off, out_cap;
    int ended;
    double last_write;
    double last_alive; /* when the ranks were last checked (srv_usable) */
} stream_ctx;

static void sc_put(stream_ctx *sc, const char *p, size_t n) {
    if (sc->out_len + n > sc->out_cap) {
        size_t nc = sc->out_cap ? sc->out_cap : 1024;
        while (nc < sc->out_len + n)
            nc *= 2;
        char *np = realloc(sc->out, nc);
        if (!np) return;
        sc->out = np;
        sc->out_cap = nc;
    }
    memcpy(sc->out + sc->out_len, p, n);
    sc->out_len += n;
}

static void sc_event(stream_ctx *sc, json_t *j) {
    char *t = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!t) { /* a builder refused a value, or memory ran out: the event is lost, say so */
        srv_log(sc->s, SRV_LOG_ERROR, "%s: a stream event could not be %s; dropped", sc->g.rs[0]->id,
                j ? "serialized (out of memory)" : "built (a JSON builder failed)");
        return;
    }
    sc_put(sc, "data: ", 6);
    sc_put(sc, t, strlen(t));
    sc_put(sc, "\n\n", 2);
    free(t);
}

static json_t *chunk_base(stream_ctx *sc, json_t *choices) {
    const srv_req *r = sc->g.rs[0];
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", r->id, "object",
                     sc->g.chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)r->created,
                     "model", sc->s->name, "choices", choices);
}

/* continuous_usage_stats: the run's usage so far on each chunk. */
static void sc_emit(stream_ctx *sc, json_t *choice, const srv_req *r, int n_toks) {
    json_t *c = chunk_base(sc, json_pack("[o]", choice));
    if (c && sc->g.continuous_usage)
        json_object_set_new(c, "usage", srv_usage(r->n_prompt, n_toks, atomic_load(&r->n_reused)));
    sc_event(sc, c);
}

/* One content chunk of run k: text (may be empty), logprobs of toks[0..nt);
 * rz: the text is thinking (delta.reasoning_content / .reasoning). */
static void sc_content(stream_ctx *sc, int k, int rz, const char *text, size_t tl, const srv_tokrec *toks, int nt,
                       int with_prompt, int n_toks, const char *fin, const srv_req *fin_r) {
    srv_server *s = sc->s;
    const srv_req *r = sc->g.rs[k];
    json_t *lp = json_null();
    if (r->want_logprobs && (nt > 0 || with_prompt)) {
        json_decref(lp);
        lp = r->chat ? srv_chat_logprobs(s, toks, nt)
                     : srv_completion_logprobs(s, r, with_prompt, toks, nt, &sc->cur[k].off);
    }
    json_t *txt = json_stringn(text ? text : "", tl);
    json_t *choice;
    if (r->chat) {
        json_t *delta;
        if (rz) {
            delta = json_object();
            if (delta) srv_reason_set(s, delta, txt);
        } else {
            delta = fin && !tl ? json_object() : json_pack("{s:o}", "content", txt ? txt : json_string(""));
            if (fin && !tl) json_decref(txt);
        }
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", r->index, "delta", delta, "logprobs", lp, "finish_reason",
                           fin ? json_string(fin) : json_null());
    } else {
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", r->index, "text", txt ? txt : json_string(""), "logprobs", lp,
                           "finish_reason", fin ? json_string(fin) : json_null());
    }
    if (choice && fin_r) json_object_set_new(choice, "stop_reason", srv_stop_reason(fin_r));
    json_t *c = chunk_base(sc, json_pack("[o]", choice));
    if (c && fin && fin_r) json_object_set_new(c, "timings", srv_timings_json(fin_r));
    if (c && sc->g.continuous_usage)
        json_object_set_new(c, "usage", srv_usage(r->n_prompt, n_toks, atomic_load(&r->n_reused)));
    sc_event(sc, c);
}

/* A chat run with tools: content up to a possible call as it comes; at the
 * end the calls as delta.tool_calls chunks (one per call, whole) and
 * finish_reason "tool_calls", or the held-back text when there was none.
 * Logprobs are not streamed in this mode. */
static void sc_tool_pass(stream_ctx *sc, int k) {
    srv_req *r = sc->g.rs[k];
    run_cur *cu = &sc->cur[k];
    const srv_tool_format *f = sc->g.tool_fmt;
    pthread_mutex_lock(&r->mu);
    int done = r->done, n_toks = r->n_toks;
    size_t nl = r->text_len - cu->raw_cur;
    char *fresh = nl ? malloc(nl) : NULL;
    if (fresh) memcpy(fresh, r->text + cu->raw_cur, nl);
    srv_finish fin = r->finish;
    pthread_mutex_unlock(&r->mu);
    if (nl && !fresh) return; /* out of memory: next pass */
    /* thinking goes out as it comes; the answer is held back from the first
     * possible call (the format's rule) */
    srv_text rp = {0};
    size_t ct0 = cu->ct.len;
    srv_reasoner z0 = cu->rz;
    int bad = srv_reasoner_feed(&cu->rz, fresh, nl, &rp, &cu->ct);
    if (!bad && done) bad = srv_reasoner_flush(&cu->rz, &rp, &cu->ct);
    free(fresh);
    if (bad) { /* out of memory: the same bytes again on the next pass */
        srv_text_free(&rp);
        cu->ct.len = ct0;
        cu->rz = z0;
        return;
    }
    cu->raw_cur += nl;
    if (rp.len) sc_content(sc, k, 1, rp.p, rp.len, NULL, 0, 0, n_toks, NULL, NULL);
    srv_text_free(&rp);
    const char *text = cu->ct.p;
    size_t len = cu->ct.len;
    size_t safe = done ? len : f->hold(f, text, len);
    json_t *calls = NULL;
    if (done && fin != SRV_FIN_ERROR) {
        char *content = NULL;
        size_t clen;
        calls = srv_calls_in(&sc->g, r, r->index, text ? text : "", len, &content, &clen);
        free(content);
        if (calls) safe = f->hold(f, text, len);
    }
    if (safe > cu->text_cur) {
        sc_content(sc, k, 0, text + cu->text_cur, safe - cu->text_cur, NULL, 0, 0, n_toks, NULL, NULL);
        cu->text_cur = safe;
    }
    if (!done) return;
    if (fin == SRV_FIN_ERROR) {
        sc_event(sc, srv_error_json(500, r->errmsg[0] ? r->errmsg : "generation failed", NULL));
    } else {
        size_t i;
        json_t *c;
        json_array_foreach(calls, i, c) {
            json_t *tc = json_deep_copy(c);
            if (tc) json_object_set_new(tc, "index", json_integer((json_int_t)i));
            json_t *ch = json_pack("{s:i,s:{s:[o]},s:n,s:n}", "index", r->index, "delta", "tool_calls", tc, "logprobs",
                                   "finish_reason");
            sc_emit(sc, ch, r, n_toks);
        }
        if (calls) {
            json_t *ch = json_pack("{s:i,s:{},s:n,s:s,s:o}", "index", r->index, "delta", "logprobs", "finish_reason",
                                   srv_tool_finish_reason(r, 1), "stop_reason", srv_stop_reason(r));
            json_t *c2 = chunk_base(sc, json_pack("[o]", ch));
            if (c2) json_object_set_new(c2, "timings", srv_timings_json(r));
            if (c2 && sc->g.continuous_usage) json_object_set_new(c2, "usage", srv_usage(r->n_prompt, n_toks, atomic_load(&r->n_reused)));
            sc_event(sc, c2);
        } else {
            sc_content(sc, k, 0, NULL, 0, NULL, 0, 0, n_toks, srv_finish_reason(fin), r);
        }
    }
    json_decref(calls);
    cu->fin_sent = 1;
    sc->n_fin++;
}

/* Turn whatever the scheduler published since the last pass into SSE bytes. */
static void sc_pass(stream_ctx *sc) {
    srv_gen *g = &sc->g;
    for (int k = 0; k < g->n_rs; k++) {
        srv_req *r = g->rs[k];
        run_cur *cu = &sc->cur[k];
        if (cu->fin_sent) continue;
        if (g->tool_parse && cu->started) {
            sc_tool_pass(sc, k);
            continue;
        }
        if (!cu->started) {
            if (g->chat) {
                json_t *ch = json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", r->index, "delta", "role", "assistant",
                                       "content", "", "logprobs", "finish_reason");
                sc_emit(sc, ch, r, 0);
            } else if (g->echo) {
                pthread_mutex_lock(&r->mu);
                int ready = !g->echo_lp || r->plp_done || r->done;
                int plp = r->plp_done;
                pthread_mutex_unlock(&r->mu);
                if (!ready) continue; /* the prompt's logprobs come with its text */
                const char *pt = g->prompt_text[k / g->per];
                srv_offsets_start(sc->s, &cu->off, g->echo_lp ? 0 : srv_utf8_chars(pt, strlen(pt)));
                sc_content(sc, k, 0, pt, strlen(pt), NULL, 0, g->echo_lp && plp, 0, NULL, NULL);
            }
            cu->started = 1;
            if (g->tool_parse) {
                sc_tool_pass(sc, k);
                continue;
            }
        }
        pthread_mutex_lock(&r->mu);
        int done = r->done, nt = r->n_toks - cu->tok_cur, n_toks = r->n_toks;
        size_t tl = r->text_len - cu->text_cur;
        srv_tokrec *toks = nt > 0 ? malloc((size_t)nt * sizeof *toks) : NULL;
        char *text = tl > 0 ? malloc(tl) : NULL;
        if (toks) memcpy(toks, r->toks + cu->tok_cur, (size_t)nt * sizeof *toks);
        if (text) memcpy(text, r->text + cu->text_cur, tl);
        srv_finish fin = r->finish;
        pthread_mutex_unlock(&r->mu);
        if ((nt > 0 && !toks) || (tl > 0 && !text)) {
            free(toks);
            free(text);
            continue; /* out of memory: try again on the next pass */
        }
        /* thinking first, then the answer; the pass's logprobs ride on its first chunk */
        srv_text rp = {0}, cp = {0};
        srv_reasoner z0 = cu->rz;
        int bad = srv_reasoner_feed(&cu->rz, text, tl, &rp, &cp);
        if (!bad && done) bad = srv_reasoner_flush(&cu->rz, &rp, &cp);
        free(text);
        if (bad) { /* out of memory: the same bytes on the next pass */
            cu->rz = z0;
            srv_text_free(&rp);
            srv_text_free(&cp);
            free(toks);
            continue;
        }
        cu->tok_cur += nt;
        cu->text_cur += tl;
        if (rp.len) sc_content(sc, k, 1, rp.p, rp.len, toks, nt, 0, n_toks, NULL, NULL);
        if (cp.len || (!rp.len && nt > 0 && r->want_logprobs))
            sc_content(sc, k, 0, cp.p, cp.len, rp.len ? NULL : toks, rp.len ? 0 : nt, 0, n_toks, NULL, NULL);
        srv_text_free(&rp);
        srv_text_free(&cp);
        free(toks);
        if (done) {
            if (fin == SRV_FIN_ERROR)
                sc_event(sc, srv_error_json(500, r->errmsg[0] ? r->errmsg : "generation failed", NULL));
            else
                sc_content(sc, k, 0, NULL, 0, NULL, 0, 0, n_toks, srv_finish_reason(fin), r);
            cu->fin_sent = 1;
            sc->n_fin++;
        }
    }
    if (sc->n_fin == g->n_rs && !sc->ended) {
        if (g->include_usage) {
            json_t *c = chunk_base(sc, json_array());
            if (c) {
                json_object_set_new(c, "usage", srv_usage_all(g));
                json_object_set_new(c, "timings", srv_timings_json(g->rs[0]));
            }
            sc_event(sc, c);
        }
        sc_put(sc, "data: [DONE]\n\n", 14);
        sc->ended = 1;
    }
}

/* Wait (up to a second) for news from the scheduler, then a pass. */
static void sc_fill(stream_ctx *sc) {
    srv_group *grp = sc->g.grp;
    pthread_mutex_lock(&grp->mu);
    unsigned long long v = grp->version;
    pthread_mutex_unlock(&grp->mu);
    sc_pass(sc);
    if (sc->out_len > 0 || sc->ended) return;
    pthread_mutex_lock(&grp->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    while (grp->version == v)
        if (pthread_cond_timedwait(&grp->cv, &grp->mu, &ts) != 0) break;
    pthread_mutex_unlock(&grp->mu);
    sc_pass(sc);
    if (!sc->ended && srv_now() - sc->last_alive > 0.1) {
        /* A rank of an mpirun job died: the runs may never finish (and
         * mpirun ends the job soon): the error now, then [DONE]. */
        sc->last_alive = srv_now();
        if (!srv_usable(sc->s)) {
            srv_cancel_all(&sc->g);
            sc_event(sc, srv_error_json(503, sc->s->unusable_why, NULL));
            sc_put(sc, "data: [DONE]\n\n", 14);
            sc->ended = 1;
            return;
        }
    }
    if (sc->out_len == 0 && !sc->ended && srv_now() - sc->last_write > 2.0) {
        /* SSE comment: keeps a queued stream's connection alive and lets a
         * departed client be noticed while it waits. */
        sc_put(sc, ": keep-alive\n\n", 14);
    }
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *sc = cls;
    if (sc->out_off == sc->out_len) {
        sc->out_off = sc->out_len = 0;
        if (sc->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        sc_fill(sc);
        if (sc->out_len == 0) return 0;
    }
    size_t n = sc->out_len - sc->out_off;
    if (n > max) n = max;
    memcpy(buf, sc->out + sc->out_off, n);
    sc->out_off += n;
    sc->last_write = srv_now();
    return (ssize_t)n;
}

/* MHD is done with the stream (finished, or the client went away). */
static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    srv_cancel_all(&sc->g);
    srv_log_done(sc->s, &sc->g, "stream");
    for (int k = 0; k < sc->g.n_rs; k++) {
        srv_offsets_free(&sc->cur[k].off);
        srv_text_free(&sc->cur[k].ct);
    }
    srv_gen_free(&sc->g);
    free(sc->cur);
    free(sc->out);
    free(sc);
}

enum MHD_Result srv_sse_respond(srv_server *s, struct MHD_Connection *c, srv_gen *g) {
    stream_ctx *sc = calloc(1, sizeof *sc);
    run_cur *cur = calloc((size_t)g->n_rs, sizeof *cur);
    if (!sc || !cur) {
        free(sc);
        free(cur);
        srv_cancel_all(g);
        srv_gen_free(g);
        return srv_send_error(s, c, 500, "out of memory", NULL);
    }
    sc->s = s;
    sc->g = *g;
    memset(g, 0, sizeof *g); /* the stream owns it now */
    sc->cur = cur;
    for (int k = 0; k < sc->g.n_rs; k++) {
        const srv_req *r = sc->g.rs[k];
        srv_reasoner_init(&cur[k].rz, r->rz_on ? s->reason : NULL, r->rz_state0, r->rz_stop);
    }
    sc->last_write = srv_now();
    return srv_sse_queue(s, c, stream_reader, sc, stream_free);
}

enum MHD_Result srv_sse_queue(srv_server *s, struct MHD_Connection *c, MHD_ContentReaderCallback reader, void *cls,
                              MHD_ContentReaderFreeCallback fr) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, cls, fr);
    if (!resp) {
        fr(cls);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    /* The request is complete: from here on the stream's pace is the
     * model's, not the client's, so lift the idle timeout a lot. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 600u);
    enum MHD_Result mr = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    srv_count_status(s, 200);
    return mr;
}
