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
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "engine/engine.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

#define SRV_VERSION "0.1.0" /* GET /version */
#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_STOPS 16
#define SRV_MAX_STOP_LEN 1024
#define SRV_MAX_CHOICES 128  /* prompts x n (or best_of) of one request */
#define SRV_MAX_LOGIT_BIAS 1024
#define SRV_PLP_ROWS 64      /* prompt-logprob rows per step (full-vocabulary rows on the host) */

typedef enum srv_finish { SRV_FIN_NONE = 0, SRV_FIN_STOP, SRV_FIN_LENGTH, SRV_FIN_ABORT, SRV_FIN_ERROR } srv_finish;
const char *srv_finish_name(srv_finish f);

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
    double cum_logprob;
    int stop_str;     /* index of the stop string that ended it, -1 */
    int32_t stop_tok; /* stop_token_ids entry that ended it, -1 */

    /* ---- scheduler-private ---- */
    struct srv_req *next; /* waiting queue */
    int seq;              /* engine sequence, -1 when none */
    int n_cached;         /* tokens of `all` in the KV cache */
    int32_t *all;         /* prompt + generated (n_all) */
    int n_all;
    int reserved; /* KV blocks reserved at admission */
    eng_rng rng;
    tok_stream *ds;
    char *gen; /* all generated text (before stop cut) */
    size_t gen_len, gen_cap, sent;
} srv_req;

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
    double *tok_bounds;                        /* 1, 2, 5, 10, 20, 50, ... up to max_model_len */
    uint64_t preemptions;                      /* always 0: KV is reserved at admission */
    uint64_t conn_rejected[2];                 /* [0] --max-connections, [1] per-client cap */
    uint64_t deadline_closed;                  /* connections cut at --request-deadline */
    int block_size, num_blocks;                /* cache_config_info */
    uint64_t prompt_tokens, generation_tokens;
    uint64_t success[SRV_FIN_ERROR + 1]; /* by finish reason */
    int running, waiting;
    double kv_usage;
    echo_stats comm;
    uint64_t http_requests[6]; /* by status class 1xx..5xx, [0] unused */
} srv_metrics;

int srv_metrics_init(srv_metrics *m);
/* Token-count buckets up to max_model_len (call once the model is loaded). */
int srv_metrics_set_len(srv_metrics *m, int max_model_len);
void srv_metrics_free(srv_metrics *m);
void srv_hist_observe(srv_hist *h, double v); /* caller holds m->mu */
/* Prometheus text exposition; malloc'ed. */
char *srv_metrics_render(srv_metrics *m, const char *model_name, size_t *len);

typedef struct srv_sched {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_req *head, *tail; /* waiting FIFO */
    int n_waiting;
    int stopping; /* 1: drain, no new requests */
    double drain_deadline;
    srv_req **running; /* (max_num_seqs) */
    int n_running;
    int reserved_blocks;
    pthread_t thread;
    int started;
    /* scheduler-private scratch */
    eng_item *items;
    int *item_req;    /* running index per item */
    srv_finish *fins; /* (max_num_seqs) per running index, one step */
    float *logits;    /* (max_num_seqs + SRV_PLP_ROWS, vocab) full rows (packed: with candidates, the flagged items' only) */
    eng_cands *cands; /* (max_num_seqs) per logits row, when the step takes the candidates path */
    unsigned char *full; /* (max_num_seqs) per item: this request needs its full row */
    double *lp;       /* (vocab) */
    uint32_t *mark;   /* (vocab) repetition-penalty stamps */
    uint32_t *mark2;  /* (vocab) output-token stamps (presence / frequency) */
    uint32_t *cnt;    /* (vocab) output-token counts, valid where mark2 == stamp */
    uint32_t stamp, stamp2;
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
    eng_chat_template chat; /* the model's Jinja chat template (source NULL: Qwen3's built in) */
    eng *eng;
    model_config mc;
    int max_model_len, block_size, total_blocks;
    srv_gen_defaults gd;
    srv_sched sch;
    srv_metrics met;
    atomic_ullong req_counter;
    atomic_int http_active; /* generation requests MHD has not completed yet */
    uint64_t seed_base;
    /* Live connections (http.c): per-client counts and the receive deadline,
     * enforced by a reaper thread. Guarded by conn_mu. */
    pthread_mutex_t conn_mu;
    struct srv_conn *conns;
    int n_conns;
    double last_reject_log;
    pthread_t reaper;
    int reaper_started;
    atomic_int reaper_stop;
};

double srv_now(void); /* CLOCK_MONOTONIC seconds */

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

/* http */
int srv_http_start(srv_server *s, char *err, size_t errlen);
/* The engine can run no more steps: the first caller's why is kept, and
 * /health answers 503 with it (server.c). srv_usable is 0 once set, and sets
 * it when a peer rank process has exited (eng_ranks_alive); any thread. */
void srv_set_unusable(srv_server *s, const char *why);
int srv_usable(srv_server *s);
void srv_http_quiesce(srv_server *s);
void srv_http_stop(srv_server *s);

/* Fuzzing (tests/fuzz/fuzz_server.c): run the production parse, validate and
 * tokenize path of one POST body without engine or network, free everything.
 * Needs s->tok, s->mc, s->name and the limits srv_load sets. Returns the HTTP
 * status the server would answer (200: accepted), -1 for an unknown route;
 * err gets the error message ("" on 200). */
enum { SRV_FUZZ_COMPLETIONS, SRV_FUZZ_CHAT, SRV_FUZZ_TOKENIZE, SRV_FUZZ_DETOKENIZE, SRV_FUZZ_N_ROUTES };
int srv_fuzz_parse(srv_server *s, int route, const char *body, size_t len, char *err, size_t errlen);

#endif
