/*
 * server/ private header: the request, the scheduler and the metrics shared
 * by the server/ sources. Nothing outside server/ includes this.
 *
 * Locking order: sched.mu, then req.mu, then metrics.mu. HTTP threads take
 * sched.mu only to enqueue; the scheduler takes req.mu to publish tokens.
 */
#ifndef ECHO_SERVER_INTERNAL_H
#define ECHO_SERVER_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "engine/chat.h"
#include "engine/engine.h"
#include "engine/report.h"
#include "engine/sample.h"
#include "engine/seq.h"
#include "engine/spec.h"
#include "grammar/grammar.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

#define SRV_VERSION "0.1.0" /* GET /version */
#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_STOPS 16
#define SRV_MAX_STOP_LEN 1024
#define SRV_MAX_CHOICES 128  /* prompts x n (or best_of) of one request */
#define SRV_MAX_LOGIT_BIAS 1024
#define SRV_MAX_STOP_IDS 1024
#define SRV_QUOTE 204        /* buffer of srv_quote in messages: ~200 bytes of the quoted string */
/* The raw request target (path and query) is refused past SRV_MAX_URI
 * bytes with a JSON 414. MHD's per-connection memory (SRV_CONN_MEMORY)
 * holds the request line and headers; a request whose head does not fit it
 * is answered by libmicrohttpd itself (an HTML 414 or 431). */
#define SRV_MAX_URI (16 * 1024)
#define SRV_CONN_MEMORY (512 * 1024)
#define SRV_MAX_LPROCS 8     /* rows of logits.c's PROCESSORS */
#define SRV_PLP_ROWS 64      /* prompt-logprob rows per step (full-vocabulary rows on the host); srv_plp_rows */

typedef enum srv_finish { SRV_FIN_NONE = 0, SRV_FIN_STOP, SRV_FIN_LENGTH, SRV_FIN_ABORT, SRV_FIN_ERROR } srv_finish;
const char *srv_finish_name(srv_finish f);

/* ---- reasoning.c: a thinking model's <think> block split from its answer ----
 *
 * The server-internal API (also for the Responses handler):
 *   srv_reasoner z;
 *   srv_reasoner_init(&z, s->reason, state, stop_tag);   state: srv_reason_start_state()
 *   srv_reasoner_feed(&z, text, n, &reason, &content);   any pieces, in order
 *   srv_reasoner_flush(&z, &reason, &content);           at the end of the text
 * reason / content (srv_text, may be NULL: discarded) receive the block's
 * text (markers removed) and the answer's; z.opened says whether the output
 * had a block at all (no reasoning field when not). The split of a text
 * does not depend on how it was cut into pieces. stop_tag: the tool-call
 * format's begin marker when the request has tools (it ends the block and
 * stays in the answer), else NULL. */
typedef struct srv_reason_format {
    const char *name;        /* --reasoning-parser value */
    const char *start, *end; /* the block's markers */
    int open;                /* the template opens the block in the prompt: the output starts inside it */
} srv_reason_format;
typedef enum srv_rz_state { SRV_RZ_START = 0, SRV_RZ_THINK, SRV_RZ_CONTENT } srv_rz_state;
typedef struct srv_reasoner {
    const srv_reason_format *f; /* NULL: everything is answer */
    const char *stop;
    srv_rz_state state;
    int lead;    /* a block open from the prompt: a repeated start marker is dropped */
    int opened;  /* a block was seen */
    int marks;   /* markers consumed so far */
    char pend[48]; /* bytes that may begin a marker */
    size_t np;
} srv_reasoner;
typedef struct srv_text {
    char *p; /* NUL-terminated, len bytes; NULL when empty */
    size_t len, cap;
} srv_text;
int srv_text_put(srv_text *t, const char *p, size_t n); /* -1 out of memory; t NULL: discard */
void srv_text_free(srv_text *t);
const srv_reason_format *srv_reason_format_named(const char *name);
void srv_reasoner_init(srv_reasoner *z, const srv_reason_format *f, srv_rz_state state, const char *stop_tag);
int srv_reasoner_feed(srv_reasoner *z, const char *p, size_t n, srv_text *reason, srv_text *content);
int srv_reasoner_flush(srv_reasoner *z, srv_text *reason, srv_text *content);

/* One generated token as the client sees it. */
typedef struct srv_tokrec {
    int32_t token;
    float logprob;
    int n_top;
    int rank; /* 1-based rank of token in its row (prompt logprobs) */
    int32_t top_ids[SRV_MAX_TOP_LOGPROBS];
    float top_lp[SRV_MAX_TOP_LOGPROBS];
} srv_tokrec;

/* The choices of one HTTP request (n, best_of, batched prompts) share one
 * notifier: the scheduler bumps `version` after publishing to any of them,
 * so the HTTP side waits on one condition for all. Refcounted by its reqs. */
typedef struct srv_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long long version;
    int refs;
} srv_group;
srv_group *srv_group_new(void);
void srv_group_notify(srv_group *g);
void srv_group_unref(srv_group *g);

/* compile.c: grammar compiles on their own threads, bounded and abandonable. */
typedef struct srv_cpool srv_cpool;
srv_cpool *srv_cpool_new(int k);
int srv_cpool_free(srv_cpool *p); /* 0, or the compiles still running (then it is left allocated) */
int srv_cpool_running(srv_cpool *p);
#define SRV_COMPILE_STACK ((size_t)64 << 20) /* xgrammar recurses per schema level and $ref */

typedef struct srv_req {
    /* ---- set by the HTTP thread before enqueue, then read-only ---- */
    int chat; /* 0 completions, 1 chat */
    int index;            /* choice index in the response */
    srv_group *grp;       /* shared notifier (holds a reference) */
    int plp_k;            /* prompt logprobs: -1 off, else top-k per prompt token */
    int want_cum;         /* sum the sampled tokens' logprobs (best_of ranking) */
    float presence, frequency, min_p; /* OpenAI / vLLM penalties, 0 = off */
    int32_t *bias_ids;    /* logit_bias (n_bias) */
    float *bias_vals;
    int n_bias;
    char id[48];
    long long created;
    int32_t *prompt; /* (n_prompt) */
    int n_prompt;
    int max_tokens, min_tokens, ignore_eos;
    int want_logprobs, top_logprobs; /* top_logprobs <= SRV_MAX_TOP_LOGPROBS */
    eng_sampling sp;
    float rep_penalty; /* 1 = off */
    char *stop[SRV_MAX_STOPS];
    size_t stop_len[SRV_MAX_STOPS];
    int n_stop;
    int32_t *stop_ids;
    int n_stop_ids;
    double t_arrive;
    gram_grammar *gram; /* the request template's constraint (structured.c); runs get a matcher each */
    int rz_on;        /* reasoning parsed: the scheduler tracks the block (reasoning.c) */
    srv_rz_state rz_state0; /* where the output starts (srv_reason_start_state) */
    const char *rz_stop;    /* the tool-call marker that ends the block, NULL */
    int think_budget;       /* thinking tokens before the block is closed, -1 none */
    int32_t *forced;        /* debug_force_output: the first n_forced output tokens are these */
    int n_forced;
    /* the logits-processor chain (logits.c, srv_logits_plan): rows of its
     * PROCESSORS table, in order */
    const struct srv_lproc *chain[SRV_MAX_LPROCS];
    int n_chain;

    /* ---- shared: guarded by mu (cancelled is atomic) ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;             /* HTTP side + scheduler side */
    atomic_int cancelled; /* client went away */
    int done;
    srv_finish finish;
    char errmsg[256];
    srv_tokrec *toks; /* (n_toks) generated tokens */
    int n_toks, cap_toks;
    char *text; /* emitted text (stop strings cut, held-back text not yet) */
    size_t text_len, text_cap;
    double t_sched, t_first, t_last, t_done;
    srv_tokrec *prompt_lp; /* (n_prompt) when plp_k >= 0; [0] unused; complete once plp_done */
    int plp_done;
    atomic_int n_reused; /* prompt tokens the prefix cache supplied (usage's cached_tokens), set at admission */
    double cum_logprob;
    int stop_str;     /* index of the stop string that ended it, -1 */
    int32_t stop_tok; /* stop_token_ids entry that ended it, -1 */

    /* ---- scheduler-private ---- */
    struct srv_req *next; /* waiting queue */
    int seq;              /* engine sequence, -1 when none */
    int n_cached;         /* tokens of `all` in the KV cache */
    int32_t *all;         /* prompt + generated (n_all) */
    int n_all;
    eng_rng rng;
    tok_stream *ds;
    char *gen; /* all generated text (before stop cut) */
    size_t gen_len, gen_cap, sent;
    int gram_failed;  /* ended because the grammar allowed no sampled token */
    /* speculative decoding (spec.c): this step's draft, the next draft's
     * length at most (adapted to what was accepted) */
    int32_t spec_draft[ENG_SPEC_DRAFT_LIMIT];
    int spec_n, spec_k; /* spec_k > 0: decoded with speculation on */
    long long spec_steps, spec_drafted, spec_accepted; /* steps with a draft, draft tokens, accepted (read once done) */
    gram_matcher *gm; /* constrained decoding: the grammar's state (made by the HTTP thread, then the scheduler's) */
    srv_reasoner rz;  /* the output's block, token by token (reasoning.c) */
    int rz_forcing;   /* end-marker tokens emitted at the thinking budget */
    int gm_taken;     /* the grammar already took this step's (forced) token */
    atomic_int n_think; /* thinking tokens (usage's reasoning_tokens); final once done */
} srv_req;

/* logits.c: a request's plan, its logits-processor chain. A processor is
 * one row of PROCESSORS: on (the request asks for it; plan time), full
 * (this step it may rewrite logits anywhere, so the engine's top
 * candidates cannot stand in for the row; NULL never), apply (the row, in
 * place). */
typedef struct srv_lproc {
    const char *name;
    int (*on)(const srv_server *s, const srv_req *r);
    int (*full)(const srv_server *s, const srv_req *r);
    void (*apply)(srv_server *s, srv_req *r, float *row);
} srv_lproc;
/* r->chain from the request's parameters (call once they are all set). */
void srv_logits_plan(const srv_server *s, srv_req *r);
/* Candidates r's next token needs (eng_cands_needed), 0: its full row. */
int srv_logits_cands(const srv_server *s, const srv_req *r);
/* Logprobs of the raw row, the chain, the draw (x >= 0: a draft token under
 * verification, eng_sample_draft's rule) into rec. */
void srv_logits_sample_row(srv_server *s, srv_req *r, float *row, srv_tokrec *rec, int32_t x);
/* The same on the engine's top candidates (the chain rewrote nothing). */
void srv_logits_sample_cands(srv_server *s, srv_req *r, const eng_cands *c, srv_tokrec *rec, int32_t x);
/* Logprob, rank and top-k of prompt token pos under row (the logits at
 * pos - 1), into r->prompt_lp[pos]. */
void srv_logits_prompt(srv_server *s, srv_req *r, const float *row, int pos);

/* emit.c: a sampled token through the thinking budget and the grammar's
 * verdict, the stop matcher, detokenized and published. Returns the finish
 * reason, SRV_FIN_NONE to go on. */
srv_finish srv_take_token(srv_server *s, srv_req *r, srv_tokrec *rec, double t);
/* The request's end published (metrics first, then the client), its
 * sequence freed and the scheduler's reference dropped. */
void srv_req_finish(srv_server *s, srv_req *r, srv_finish fin, const char *msg);

/* Prometheus histogram with fixed buckets. */
typedef struct srv_hist {
    const double *bounds;
    int n;
    uint64_t *counts; /* (n + 1), last = +Inf, not cumulative */
    double sum;
    uint64_t count;
} srv_hist;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    srv_hist ttft, itl, e2e, queue, prefill, decode, inference;
    srv_hist req_prompt, req_gen, iter_tokens; /* token counts (vLLM's families) */
    srv_hist grammar_compile, grammar_mask;    /* seconds: per constraint compiled, per masked token */
    uint64_t constrained;                      /* requests (runs) decoded under a grammar */
    uint64_t gram_dropped[3]; /* compile.c: client gone before its compile began, abandoned mid-compile, no slot in time */
    double *tok_bounds;                        /* 1, 2, 5, 10, 20, 50, ... up to max_model_len */
    uint64_t preemptions;                      /* always 0: KV is reserved at admission */
    uint64_t conn_rejected[2];                 /* [0] --max-connections, [1] per-client cap */
    uint64_t deadline_closed;                  /* connections cut at --request-deadline */
    int block_size, num_blocks;                /* cache_config_info */
    const char *kv_dtype;                      /* cache_config_info's cache_dtype (kern_kv_dtype_name) */
    /* allreduce_config_info: what the all-reduce runs (tp 1: preset "none") */
    char ar_preset[16], ar_codec[16], ar_tail_codec[16];
    /* --allreduce auto: what it chose and the figures (ar_auto 0: not auto) */
    int ar_auto, ar_auto_oneshot, ar_auto_overlap, ar_auto_shared;
    char ar_auto_small[16], ar_auto_large[16];
    double ar_auto_lat_s[2], ar_auto_bps[2], ar_auto_enc[4], ar_auto_dec[4];
    int ar_group, ar_feedback, ar_tp, ar_tail_calls, ar_calls; /* the tail policy: its calls of ar_calls a pass */
    double ar_bits; /* averaged over a pass */
    uint64_t prompt_tokens, generation_tokens;
    /* speculative decoding: steps that verified a draft, draft tokens,
     * accepted ones; accepted tokens per draft step (spec.c) */
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    srv_hist spec_accepted;
    int spec_on, spec_draft_max; /* spec_config_info */
    uint64_t success[SRV_FIN_ERROR + 1]; /* by finish reason */
    int running, waiting;
    double kv_usage;
    eng_kv_usage kv; /* the engine's block and prefix-cache counters (srv_metrics_publish) */
    echo_stats comm;
    uint64_t http_requests[6]; /* by status class 1xx..5xx, [0] unused */
} srv_metrics;

int srv_metrics_init(srv_metrics *m);
/* Token-count buckets up to max_model_len (call once the model is loaded). */
int srv_metrics_set_len(srv_metrics *m, int max_model_len);
void srv_metrics_free(srv_metrics *m);
void srv_hist_observe(srv_hist *h, double v); /* caller holds m->mu */
void srv_metrics_publish(srv_server *s); /* the scheduler's gauges (metrics.c) */
/* ---- speculative decoding (spec.c, docs/speculative.md) ---- */
/* Draft for decoding request r within `budget` step tokens: prompt lookup
 * over prompt + output, at most what max_tokens, the context and r's
 * adaptive length leave. Written to r->spec_draft and, behind the last
 * token, to r->all (so the step's item is r->all + n_cached, 1 + n
 * tokens). None while more than --spec-max-batch requests decode in the
 * step (n_decoding). Returns n (0: a plain decode). */
int srv_spec_draft(srv_server *s, srv_req *r, int budget, int n_decoding);
/* After verifying r's draft of n tokens, `accepted` taken: metrics, the
 * request's counters, the next draft's length. */
void srv_spec_done(srv_server *s, srv_req *r, int n, int accepted);
/* The /metrics lines of speculative decoding (caller holds m->mu). */
/* timings' "speculative" object of a finished request, NULL when it
 * decoded without speculation. */
json_t *srv_spec_timings(const srv_req *r);
/* The rows of a verified draft: taken in order through the chain and the
 * stop checks until the first rejection; the rejected tail's KV goes.
 * row0 / frow0: the item's first candidates row / full row (full: its
 * rows came back whole). */
srv_finish srv_spec_take(srv_server *s, srv_req *r, const eng_item *it, int full, int row0, int frow0, double t);

/* Prometheus text exposition; malloc'ed. */
char *srv_metrics_render(srv_metrics *m, const char *model_name, size_t *len);

/* logits.c: the scheduler's scratch for the processors and sampling. */
typedef struct srv_logits_scratch {
    double *lp;       /* (vocab) */
    uint32_t *mark;   /* (vocab) repetition-penalty stamps */
    uint32_t *mark2;  /* (vocab) output-token stamps (presence / frequency) */
    uint32_t *cnt;    /* (vocab) output-token counts, valid where mark2 == stamp */
    uint32_t stamp, stamp2;
    uint32_t *gmask; /* (gram_mask_words(vocab)) the grammar's allowed tokens, one row at a time */
} srv_logits_scratch;
int srv_logits_scratch_init(srv_logits_scratch *x, int vocab); /* -1 out of memory (free it all the same) */
void srv_logits_scratch_free(srv_logits_scratch *x);

typedef struct srv_sched {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_req *head, *tail; /* waiting FIFO */
    int n_waiting;
    int stopping; /* 1: drain, no new requests */
    double drain_deadline;
    srv_req **running; /* (max_num_seqs) */
    int n_running;
    pthread_t thread;
    int started;
    /* scheduler-private scratch */
    eng_item *items;
    int *item_req;    /* running index per item */
    srv_finish *fins; /* (max_num_seqs) per running index, one step */
    float *logits;    /* (max_num_seqs + SRV_PLP_ROWS, vocab) full rows (packed: with candidates, the flagged items' only) */
    eng_cands *cands; /* (max_num_seqs) per logits row, when the step takes the candidates path */
    unsigned char *full; /* (max_num_seqs) per item: this request needs its full row */
    srv_logits_scratch lx; /* the processors' and sampling's (logits.c) */
    char *piece; /* single-token decode scratch */
} srv_sched;

typedef struct srv_gen_defaults {
    float temperature, top_p, repetition_penalty;
    int top_k;
} srv_gen_defaults;

struct srv_server {
    srv_options opt;
    char *model_dir;
    char *name;
    struct MHD_Daemon *mhd;
    int port;
    atomic_int ready;     /* engine loaded, scheduler running */
    atomic_int accepting; /* 0 after srv_shutdown began */
    /* Set once by the scheduler when the engine can run no more steps
     * (eng_usable after a failed step); unusable_why is written before and
     * only read after it (acquire). /health then answers 503 with it. */
    atomic_int unusable;
    atomic_int unusable_claim; /* srv_set_unusable's writer, so why is written once */
    char unusable_why[512];
    int shut_down;
    tok_tokenizer *tok;
    eng_chat_template chat; /* the model's Jinja chat template (source NULL: none) */
    eng_chat_template chat_builtin; /* Qwen3's, for a model without one (chat.source NULL) */
    eng *eng;
    model_config mc;
    int max_model_len, block_size, total_blocks;
    srv_gen_defaults gd;
    srv_sched sch;
    srv_metrics met;
    atomic_ullong req_counter;
    atomic_int http_active; /* generation requests MHD has not completed yet */
    uint64_t seed_base;
    /* Live connections (conn.c): per-client counts and the receive deadline,
     * enforced by a reaper thread. Guarded by conn_mu. */
    pthread_mutex_t conn_mu;
    struct srv_conn *conns;
    int n_conns;
    double last_reject_log;
    pthread_t reaper;
    int reaper_started;
    atomic_int reaper_stop;
    /* reasoning (reasoning.c, srv_reason_setup at load): NULL: none */
    const srv_reason_format *reason;
    int32_t think_end_ids[16]; /* the end marker's tokens, forced at the thinking budget */
    int n_think_end;
    int32_t think_start_id; /* the start marker when it is one token, else -1 */
    const struct srv_tool_format *tool_fmt; /* --tool-call-parser, NULL: chosen from the template */
    struct srv_resp_store *resp_store; /* /v1/responses' stored responses (responses.c) */
    /* structured outputs (structured.c): the grammar vocabulary, built on first use */
    pthread_mutex_t gram_mu;
    srv_cpool *cpool; /* compile.c: the threads grammars compile on */
    gram_vocab *gvocab;
    int gvocab_failed;
    char gvocab_err[256];
};

double srv_now(void); /* CLOCK_MONOTONIC seconds */
int srv_plp_rows(const srv_server *s); /* prompt-logprob rows per step */

/* request lifetime */
srv_req *srv_req_new(void);
void srv_req_unref(srv_req *r);

/* scheduler */
/* Queue k requests at once, all or none: 0 queued, -1 full (503). */
int srv_sched_submit_many(srv_server *s, srv_req **rs, int k);
int srv_sched_start(srv_server *s, char *err, size_t errlen);
/* 0 queued, -1 queue full or shutting down (503). Takes a reference. */
int srv_sched_submit(srv_server *s, srv_req *r);
void srv_sched_stop(srv_server *s);

/* ---- HTTP (http.c and the route files; server/README.md, "Files, and how to add a route") ---- */

int srv_http_start(srv_server *s, char *err, size_t errlen);
/* The engine can run no more steps: the first caller's why is kept, and
 * /health answers 503 with it (util.c). srv_usable is 0 once set, and sets
 * it when a peer rank process has exited (eng_ranks_alive); any thread. */
void srv_set_unusable(srv_server *s, const char *why);
int srv_usable(srv_server *s);
void srv_http_quiesce(srv_server *s);
void srv_http_stop(srv_server *s);

/* One HTTP request as MHD delivers it (its con_cls): the route, the body. */
typedef struct srv_request {
    const struct srv_route *route; /* NULL: no route has this path (404) */
    /* The path as the client sent it, %XX-decoded here with its length, so
     * a %00 is a byte of it rather than its end (MHD's own decoding hands
     * the handler a C string). Set by srv_uri_log, which sees the raw
     * target; NULL when that target is longer than SRV_MAX_URI. */
    char *path;
    size_t path_len;
    size_t uri_len; /* of the raw target, query included */
    int begun;      /* the access handler has seen this request's headers */
    size_t arg_at;  /* where in path the route's "{id}" starts (0: none) */
    const char *arg; /* what "{id}" matched (arg_len bytes, "" when none), set at dispatch */
    size_t arg_len;
    char *body;                    /* (len) bytes, the handler's to rewrite */
    size_t len, cap;
    int too_big;
    int counted; /* in srv_server.http_active */
} srv_request;

/* A request-validation failure on its way to an HTTP error. */
typedef struct srv_verr {
    int status;
    char msg[512];
    char param[64];
    char unknown[256]; /* ignored unknown fields, ", "-separated, for the warning */
} srv_verr;

typedef enum MHD_Result (*srv_handler)(srv_server *s, struct MHD_Connection *c, srv_request *rq);

/* routes.c: MHD's URI log callback: the request's srv_request (its
 * con_cls), made as soon as the request line is in, with the decoded path. */
void *srv_uri_log(void *cls, const char *uri, struct MHD_Connection *c);

/* routes.c: the route table. srv_route_begin runs on a request's first
 * call (headers only): it finds the route and answers what can be answered
 * before the body (404, 405, 401, 413), else MHD_YES. Once the body is in,
 * srv_route_dispatch runs the readiness gates, then the route's handler. */
enum MHD_Result srv_route_begin(srv_server *s, struct MHD_Connection *c, srv_request *rq, const char *url,
                                const char *method);
enum MHD_Result srv_route_dispatch(srv_server *s, struct MHD_Connection *c, srv_request *rq);

/* conn.c: connection limits (MHD's socket context) and the deadline reaper. */
void srv_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe);
void *srv_conn_reaper(void *arg);                               /* thread main: cuts late requests */
int srv_conn_rejected(struct MHD_Connection *c);                /* answered 503 at accept */
void srv_conn_arrived(srv_server *s, struct MHD_Connection *c); /* the request is in whole (or answered) */
void srv_conn_next(srv_server *s, struct MHD_Connection *c);    /* keep-alive: the next request's deadline starts */
void srv_conn_reject_log(srv_server *s, const char *why);       /* at most once a second */

/* reply.c: answers. Each counts its status class in /metrics; 401, 405 and
 * 503 carry WWW-Authenticate, Allow and Retry-After. buf is malloc'ed and
 * taken; j is taken. */
void srv_count_status(srv_server *s, int status);
enum MHD_Result srv_send_buf(srv_server *s, struct MHD_Connection *c, int status, char *buf, size_t len,
                             const char *ctype);
enum MHD_Result srv_send_json(srv_server *s, struct MHD_Connection *c, int status, json_t *j);
json_t *srv_error_json(int status, const char *msg, const char *param); /* OpenAI's error object */
enum MHD_Result srv_send_error(srv_server *s, struct MHD_Connection *c, int status, const char *msg,
                               const char *param);
enum MHD_Result srv_send_verr(srv_server *s, struct MHD_Connection *c, const srv_verr *e);

/* body.c: the JSON body and its fields. The getters return 0 absent (null
 * counts as absent), 1 read, -1 invalid (e set). */
/* srv_fail's message is cut on a character boundary and holds only valid
 * UTF-8: strings from outside go in through srv_quote. */
int srv_fail(srv_verr *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* s (len bytes, any bytes at all) made fit to quote in a message: valid
 * UTF-8 in out (outsz >= 8 bytes), invalid bytes and NULs as \xNN, cut
 * between characters with a trailing U+2026 when it does not fit. */
const char *srv_quote(char *out, size_t outsz, const char *s, size_t len);
int srv_utf8_text(const char *s, size_t len);     /* 1: valid UTF-8 without NUL */
size_t srv_utf8_chars(const char *s, size_t len); /* code points of valid UTF-8 */
json_t *srv_parse_body(srv_request *rq, srv_verr *e); /* the body as a JSON object */
json_t *srv_field(json_t *o, const char *k);
int srv_get_int(json_t *o, const char *k, long long lo, long long hi, long long *out, srv_verr *e);
int srv_get_num(json_t *o, const char *k, double lo, double hi, int lo_open, double *out, srv_verr *e);
int srv_get_bool(json_t *o, const char *k, int *out, srv_verr *e);
/* Unknown fields are noted (for one warning line), never refused. */
void srv_note_unknown(srv_verr *e, const char *prefix, const char *k);
int srv_check_known(json_t *o, const char *const *known, const char *prefix, srv_verr *e);
void srv_log_unknown(srv_server *s, const srv_verr *e, const char *id, const char *route);
int srv_model_check(srv_server *s, json_t *o, srv_verr *e); /* "model", when given, is ours (else 404) */

/* ids.c: token ids of a request. srv_fast_ids_take reads a top-level
 * integer array (or, batch, a list of them) straight from the body text,
 * without jansson's ~40 bytes per integer; the rest of the body parses as
 * usual. */
typedef struct srv_fast_ids {
    int present; /* the key's value was taken here */
    int batch;   /* it was a list of arrays */
    int count;
    int32_t **ids;
    int *n;
    int bad_set; /* an id outside [0, vocab): the first one, in array bad_at */
    long long bad;
    int bad_at;
} srv_fast_ids;
void srv_fast_ids_take(char *body, size_t len, const char *key, int batch, int vocab, srv_fast_ids *fi);
void srv_fast_ids_free(srv_fast_ids *f);
int srv_parse_ids(srv_server *s, json_t *a, const char *param, int32_t **ids, int *n, srv_verr *e);
int srv_encode_text(srv_server *s, const char *text, size_t len, int add_special, const char *param, int32_t **ids,
                    int *n, srv_verr *e);

/* structured.c: the request's one structured-output constraint
 * (response_format json_object / json_schema, structured_outputs.*,
 * guided_*), validated and compiled; *out NULL when there is none. */
/* client_fd (> 0) is polled while the grammar waits and compiles: a client
 * gone is a 499 that nobody reads, and nothing more is done for it. */
int srv_parse_constraint(srv_server *s, json_t *root, int client_fd, gram_grammar **out, srv_verr *e);
/* 400 naming the JSON-schema keywords the grammar engine would not enforce. */
int srv_schema_check(json_t *schema, const char *param, srv_verr *e);
/* Several schemas compiled into one grammar (tools): the budgets hold for
 * them together; locations read "[i]#/...". */
int srv_schemas_check(json_t *const *schemas, size_t n, const char *param, srv_verr *e);
int srv_compile_constraint(srv_server *s, int client_fd, gram_kind kind, const char *src, size_t len,
                           const char *param, gram_grammar **out, srv_verr *e);
/* compile.c: compile on a compile thread and wait (see its top comment). */
int srv_compile_wait(srv_server *s, gram_vocab *v, int client_fd, gram_kind kind, const char *src, size_t len,
                     const char *param, gram_grammar **out, double *sec, srv_verr *e);
/* util.c: the client closed its end of fd (pipelined bytes do not count). */
int srv_client_gone(int fd);

/* tools.c: tool calling. A format is one row of TOOL_FORMATS: how the
 * template selects it, its parser (text -> OpenAI tool_calls), the grammar
 * for tool_choice "required" / a named function, and the stream's hold-back
 * rule (how much text may go out as content while calls may follow). */
typedef enum srv_tool_choice { SRV_TOOL_NONE = 0, SRV_TOOL_AUTO, SRV_TOOL_REQUIRED, SRV_TOOL_NAMED } srv_tool_choice;
typedef struct srv_tools {
    json_t *tools; /* the request's tools (a reference), NULL when none */
    srv_tool_choice choice;
    int named;     /* SRV_TOOL_NAMED: 1 + index into tools */
    int parallel;  /* parallel_tool_calls (default 1) */
} srv_tools;
typedef struct srv_tool_format {
    const char *name;        /* --tool-call-parser value */
    const char *family;
    const char *detect;      /* the chat template containing this selects the row */
    const char *begin;       /* what starts the calls (held back in streams; ends a reasoning block) */
    const char *end;         /* hermes: after each call's JSON */
    const char *name_key, *args_key;
    /* The calls in text (tools: the request's, for typing values; may be NULL)
     * as an array of {"name", "arguments" (a JSON text)}, with the text
     * before the first call appended to *rest; NULL when there is none. */
    json_t *(*parse)(const struct srv_tool_format *f, const json_t *tools, const char *text, size_t len,
                     srv_text *rest);
    /* tool_choice required / named: an xgrammar structural tag (JSON). */
    json_t *(*grammar)(const struct srv_tool_format *f, const srv_tools *t, srv_verr *e);
    /* Bytes of text (all of it so far) that may be streamed as content. */
    size_t (*hold)(const struct srv_tool_format *f, const char *text, size_t len);
} srv_tool_format;
/* tools, tool_choice, parallel_tool_calls validated into t (free with srv_tools_free). */
int srv_parse_tools(json_t *root, srv_tools *t, srv_verr *e);
void srv_tools_free(srv_tools *t);
/* The row for the served model: --tool-call-parser, else the chat
 * template's (hermes by default). */
const srv_tool_format *srv_tool_format_for(const srv_server *s);
const srv_tool_format *srv_tool_format_named(const char *name); /* NULL: no such row */
/* tool_choice "required" or a named function as a grammar into *out; other
 * choices leave *out as it is. */
int srv_tools_grammar(srv_server *s, const srv_tools *t, int client_fd, gram_grammar **out, srv_verr *e);
/* The calls in generated text as OpenAI tool_calls (ids "call_<id_base><n>"),
 * with the text before the first call in *content (malloc'ed); NULL when there is no
 * call (or out of memory). srv_tool_calls_parse_typed types values by the
 * tools' schemas (qwen3_coder's XML parameters are text). */
json_t *srv_tool_calls_parse(const srv_tool_format *f, const char *text, size_t len, const char *id_base,
                             char **content, size_t *content_len);
json_t *srv_tool_calls_parse_typed(const srv_tool_format *f, const json_t *tools, const char *text, size_t len,
                                   const char *id_base, char **content, size_t *content_len);
/* Hermes-style "# Tools" system text for templates without tool support (malloc'ed). */
char *srv_tools_system_block(const json_t *tools);

/* chat.c: root's "messages" through the chat template, tokenized. Its
 * tools and tool_choice are parsed here (the prompt holds the tools), into
 * *tools when not NULL (the caller frees them, also on failure). */
int srv_render_chat(srv_server *s, json_t *root, int add_gen, int32_t **ids, int *n, srv_tools *tools,
                    srv_verr *e);

/* reasoning.c: the parser at load (--reasoning-parser; auto: the template's). */
int srv_reason_setup(srv_server *s, char *err, size_t errlen);
/* Where a chat request's output starts: -1 no reasoning (no parser, thinking
 * disabled, or a prompt that closed the block), else an srv_rz_state. */
int srv_reason_start_state(const srv_server *s, const int32_t *prompt, int n_prompt, int enable_thinking);
/* The scheduler's side, per sampled token (sched.c):
 * srv_think_gate: 1 when the request's grammar masks the next token (not in the block);
 * srv_think_mask: adds what the mask must also allow (the start marker before a block);
 * srv_think_accept: the grammar's verdict on the sampled token (1 outside its scope);
 * srv_think_override: 2 the budget's end marker replaced the token, 1 debug_force_output did, 0 none;
 * srv_think_track: after the token's text is in r->gen: the block's state and count. */
int srv_think_gate(const srv_req *r);
void srv_think_mask(const srv_server *s, const srv_req *r, uint32_t *mask);
int srv_think_accept(const srv_server *s, srv_req *r, int32_t tok);
int srv_think_override(const srv_server *s, srv_req *r, srv_tokrec *rec);
void srv_think_track(srv_req *r, size_t gen_before, int32_t tok, int forced_close);
/* JSON for a reasoning text under --reasoning-field: sets reasoning_content,
 * reasoning, or both on obj (val taken). */
int srv_reason_set(const srv_server *s, json_t *obj, json_t *val);

/* openai.c: one HTTP generation request: n_prompts prompts x per runs each
 * (per = best_of >= n), all sharing one notifier group. Run (i, j) is
 * rs[i * per + j]. */
typedef struct srv_gen {
    srv_req **rs;
    int n_rs, n_prompts, per, n;
    int chat, stream, include_usage, continuous_usage, echo;
    int echo_lp;        /* echo + logprobs: the prompt's tokens lead the logprobs */
    int vllm_plp;       /* prompt_logprobs requested: choices carry vLLM's prompt_logprobs */
    int vllm_k;         /* its top-k */
    char **prompt_text; /* (n_prompts) when echo */
    srv_group *grp;
    srv_fast_ids fi; /* `prompt` ids read from the body text (srv_fast_ids_take) */
    int tool_parse;  /* chat with tools (tool_choice not none): answers are parsed for tool calls */
    int tool_parallel; /* parallel_tool_calls: else only the first call is returned */
    const srv_tool_format *tool_fmt;
    json_t *tools;   /* the request's tools (a reference; typing qwen3_coder's values), NULL */
    int reason;      /* some run parses reasoning: usage carries reasoning_tokens */
    int client_fd; /* set by the handler: polled while a grammar compiles; 0 = none */
} srv_gen;
/* Body -> validated, tokenized runs ready for the scheduler (g). On failure
 * *e says why and nothing is left allocated. */
int srv_gen_prepare(srv_server *s, srv_request *rq, int chat, srv_gen *g, srv_verr *e);
void srv_gen_free(srv_gen *g);
/* The same from a parsed chat/completions body (root kept by the caller):
 * how /v1/responses reuses this path. */
int srv_gen_prepare_json(srv_server *s, json_t *root, int chat, srv_gen *g, srv_verr *e);

/* runs.c: a submitted generation request's runs (generate.c, sse.c, responses.c). */
void srv_cancel_all(srv_gen *g);                                     /* runs not done yet */
/* Wait for every submitted run of g; 1 when the client hung up meanwhile
 * (the runs then are cancelled). */
int srv_gen_wait(srv_server *s, struct MHD_Connection *c, srv_gen *g);
int srv_gen_all_done(srv_gen *g); /* every run of g is done */
void srv_log_done(srv_server *s, const srv_gen *g, const char *how); /* one INFO line */

/* render.c: response JSON shared by whole answers and stream chunks. */
json_t *srv_full_response(srv_server *s, srv_gen *g);
const char *srv_tool_finish_reason(const srv_req *r, int have_calls);
json_t *srv_timings_json(const srv_req *r);
json_t *srv_usage(long long prompt, long long completion, long long cached);
json_t *srv_usage_all(const srv_gen *g);
json_t *srv_tok_str(srv_server *s, int32_t id);
/* logprobs.text_offset counts characters (code points) of the choice's
 * text, as OpenAI and vLLM do: a token's offset is the number of characters
 * in the decoding of every token before it. A token that starts inside a
 * character (byte-level BPE) gets the offset after that character, which
 * its predecessor's decoding already shows as one U+FFFD: the character
 * counts once, with the token holding its first byte. One srv_offsets runs
 * over a choice's tokens, across stream chunks. */
typedef struct srv_offsets {
    tok_stream *ds; /* the tokens so far, decoded as their strings are (special ones kept) */
    size_t chars;   /* characters those have completed, from the starting offset */
    int ready;
} srv_offsets;
void srv_offsets_start(srv_server *s, srv_offsets *o, size_t chars);
void srv_offsets_free(srv_offsets *o);
json_t *srv_completion_logprobs(srv_server *s, const srv_req *r, int with_prompt, const srv_tokrec *t, int n,
                                srv_offsets *off);
json_t *srv_chat_logprobs(srv_server *s, const srv_tokrec *t, int n);
const char *srv_finish_reason(srv_finish f); /* OpenAI's finish_reason */
/* A finished chat run's tool calls (g->tool_parse), NULL when none. */
json_t *srv_req_tool_calls(const srv_gen *g, const srv_req *r, int index, char **content, size_t *clen);
/* A finished chat run's text split into thinking and answer (reasoning.c's
 * srv_reasoner; all answer when the run parses no reasoning); opened: the
 * output had a block. -1 out of memory. */
int srv_req_split(const srv_gen *g, const srv_req *r, srv_text *reason, srv_text *content, int *opened);
/* The tool calls in a run's answer text (text, len), as srv_req_tool_calls. */
json_t *srv_calls_in(const srv_gen *g, const srv_req *r, int index, const char *text, size_t len, char **content,
                     size_t *clen);
json_t *srv_stop_reason(const srv_req *r);

/* responses.c: the stored responses of previous_response_id, bounded by
 * count and bytes, least recently used dropped first. */
#define SRV_RESP_STORE_MAX 1024
#define SRV_RESP_STORE_BYTES (64u << 20)
struct srv_resp_store *srv_resp_store_new(int max_count, size_t max_bytes);
void srv_resp_store_free(struct srv_resp_store *st);

/* sse.c: answer a submitted g as a server-sent-event stream; takes g. */
enum MHD_Result srv_sse_respond(srv_server *s, struct MHD_Connection *c, srv_gen *g);
/* Queue a 200 event stream read by `reader` from cls (freed by fr, also
 * when the response cannot be made); the idle timeout is lifted. */
enum MHD_Result srv_sse_queue(srv_server *s, struct MHD_Connection *c, MHD_ContentReaderCallback reader, void *cls,
                              MHD_ContentReaderFreeCallback fr);

/* The POST routes' handlers (generate.c, tokenize.c) and their body
 * stages: parse, validate, tokenize and build the answer, without engine or
 * network, then free it all (what srv_fuzz_parse runs). */
enum MHD_Result srv_handle_completions(srv_server *s, struct MHD_Connection *c, srv_request *rq);
enum MHD_Result srv_handle_chat(srv_server *s, struct MHD_Connection *c, srv_request *rq);
enum MHD_Result srv_handle_tokenize(srv_server *s, struct MHD_Connection *c, srv_request *rq);
enum MHD_Result srv_handle_detokenize(srv_server *s, struct MHD_Connection *c, srv_request *rq);
enum MHD_Result srv_handle_responses(srv_server *s, struct MHD_Connection *c, srv_request *rq); /* responses.c */
int srv_check_responses(srv_server *s, srv_request *rq, srv_verr *e);
int srv_check_completions(srv_server *s, srv_request *rq, srv_verr *e);
int srv_check_chat(srv_server *s, srv_request *rq, srv_verr *e);
int srv_check_tokenize(srv_server *s, srv_request *rq, srv_verr *e);
int srv_check_detokenize(srv_server *s, srv_request *rq, srv_verr *e);

/* Fuzzing (tests/fuzz/fuzz_server.c): the body stage of the POST route at
 * path, for one body. Needs s->tok, s->mc, s->name and the limits srv_load
 * sets. Returns the HTTP status the server would answer (200: accepted), -1
 * when no POST route has that path; err gets the error message ("" on 200). */
int srv_fuzz_parse(srv_server *s, const char *path, const char *body, size_t len, char *err, size_t errlen);

#endif
