/*
 * server/ — echo-serve: an OpenAI-compatible HTTP server (libmicrohttpd +
 * jansson) with continuous batching over the engine's step API.
 *
 * Contract
 *   - srv_create() binds the socket and starts answering at once: /health is
 *     503 and model routes are 503 until srv_load() has built the engine and
 *     started the scheduler thread; then /health is 200.
 *   - One scheduler thread owns the engine (engine/ is single-driver). HTTP
 *     threads (one per connection) parse, validate and tokenize, enqueue into
 *     a bounded waiting queue (full -> 503), and read results back from a
 *     per-request queue. Requests join and leave the running batch at step
 *     boundaries; prompts are prefilled in chunks within the per-step token
 *     budget, decodes first, so a long prompt never stalls running decodes.
 *     KV blocks for prompt + max_tokens are reserved at admission: when they
 *     are not free the request waits, it never fails.
 *   - A client that goes away (mid-stream, or while waiting for a
 *     non-streaming answer) has its request cancelled; the scheduler frees
 *     its sequence (and KV blocks) at the next step.
 *   - Hostile clients: a request must arrive whole within
 *     request_deadline_s (else its connection is closed); connections beyond
 *     max_connections, or beyond max_conn_per_client from one address, are
 *     answered 503 with Retry-After and counted in /metrics.
 *   - Latency timestamps (queue, TTFT, inter-token) are taken in the
 *     scheduler where each token is produced, not where HTTP flushes.
 *   - srv_shutdown() stops accepting, lets in-flight requests finish for up
 *     to drain_s seconds, cancels the rest, and stops the scheduler.
 *   - Library code: returns status with a message in the caller's buffer;
 *     a bad request never kills the server; nothing exits.
 */
#ifndef ECHO_SERVER_H
#define ECHO_SERVER_H

#include <stddef.h>

#include "comm/echo.h"
#include "engine/engine.h"
#include "engine/spec.h"

typedef enum srv_log_level { SRV_LOG_DEBUG = 0, SRV_LOG_INFO, SRV_LOG_WARNING, SRV_LOG_ERROR } srv_log_level;

typedef struct srv_options {
    const char *model_dir;         /* resolved model folder (srv_resolve_model) */
    const char *served_model_name; /* id in /v1/models and responses; NULL = folder's basename */
    const char *tokenizer;         /* folder of the tokenizer files; NULL = model_dir (a random: model needs one) */
    const char *host;              /* numeric IPv4/IPv6 address to bind, default 127.0.0.1 */
    int port;                      /* default 8000; 0 = any free port (see srv_port) */
    const char *device;            /* "auto" (default), "cpu", "cuda" */
    int tp;                        /* tensor-parallel ranks, default 1 */
    echo_preset allreduce;
    int allreduce_auto;         /* eng_config.allreduce_auto: ENG_ALLREDUCE_AUTO (echo-serve's default) */
    const char *transport;      /* all-reduce transport when tp > 1: "auto" (default), "local", "nccl" */
    size_t echo_min_bytes;      /* size policy of the quantized all-reduce, default 0 */
    int echo_group;             /* 0 = the codec's default */
    echo_codec_id echo_codec;   /* of int4/echo; 0 = comm/'s default */
    int quantize;               /* eng_config.quantize: ENG_QUANT_Q8_0 quantizes at load (cpu) */
    int act_quant;              /* eng_config.act_quant: ENG_ACT_Q8/AUTO = 8-bit activations (cpu) */
    int overlap;                /* eng_config.overlap: 0 auto, -1 off, N micro-batches per prefill */
    long oneshot;               /* eng_config.oneshot: 0 auto, -1 off, N bytes */
    int threads;                /* cpu threads in total, 0 = all */
    int max_num_seqs;           /* running batch size, default 8 */
    int max_num_batched_tokens; /* tokens per step (chunked prefill budget), default 512 */
    int max_model_len;          /* default min(model context, 4096) */
    const char *rope_scaling;   /* --rope-scaling (model_config_rope_override); NULL: the config's */
    int kv_blocks;              /* 0 = enough for max_num_seqs full sequences */
    kern_kv_dtype kv_dtype;     /* eng_config.kv_dtype (echo-serve: bf16 unless --kv-cache-dtype) */
    size_t kv_cache_memory;     /* eng_config.kv_cache_memory (echo-serve: ENG_KV_MEMORY_AUTO) */
    double gpu_memory_utilization; /* eng_config.gpu_memory_utilization, 0 = 0.9 */
    int max_waiting;            /* waiting-queue bound (503 beyond), default 256 */
    int max_connections;        /* simultaneous HTTP connections, default 256 */
    int timeout_s;              /* idle connection timeout, default 30 */
    double request_deadline_s;  /* whole request (headers + body) must arrive within this, default 30 */
    int max_conn_per_client;    /* connections from one client address, default max_connections / 2 */
    size_t max_body_bytes;      /* request body limit (413 beyond), default 8 MiB */
    double drain_s;             /* shutdown: time to let running requests finish, default 5 */
    const char *api_key;        /* NULL = no auth */
    double load_delay_s;        /* testing: wait this long before loading (exercises the 503 state) */
    srv_log_level log_level;
    int cuda_graphs; /* 1: decode steps through CUDA graphs (eng_config.cuda_graphs), default 0 */
    int no_prefix_caching; /* 1: no automatic prefix cache (eng_config.no_prefix_cache); default 0: on */
    const char *reasoning_parser; /* auto (NULL), none, qwen3, deepseek_r1 (server/reasoning.c) */
    int reasoning_field;          /* 0 reasoning_content (default), 1 reasoning, 2 both */
    int has_reasoning_budget;     /* 1: reasoning_budget thinking tokens per request unless it sets thinking_budget */
    int reasoning_budget;
    const char *tool_call_parser; /* auto (NULL), hermes, qwen3_coder, mistral (server/tools.c) */
    int debug_request_fields;     /* testing: accept debug_force_output */
    int grammar_compiles;     /* grammar compiles at once (server/compile.c), default 2 */
    double grammar_timeout_s; /* a request's grammar must compile within this, default 10 */
    eng_spec_params spec;  /* speculative decoding (server/spec.c): draft_max 0 (default) = off */
    int spec_max_batch;    /* drafts only while at most this many requests decode (0: any number) */
} srv_options;

typedef struct srv_server srv_server;

/* Compile budgets of a JSON schema, checked by a walk that follows $refs
 * before anything compiles (server/structured.c); a schema over one is a
 * 400 naming it. Their measured worst-case costs: docs/structured-outputs.md. */
#define SRV_SCHEMA_MAX_DEPTH 32     /* nesting, counted through $refs */
#define SRV_SCHEMA_MAX_NODES 2000LL /* schema objects reached, each $ref target counted again */
#define SRV_SCHEMA_MAX_REFS 256LL   /* $ref resolutions */
#define SRV_SCHEMA_MAX_PROPS 256LL  /* properties of all objects reached */
#define SRV_SCHEMA_MAX_ENUM 1024LL  /* enum values */
#define SRV_SCHEMA_MAX_LITERAL 65536LL /* bytes of const, enum and pattern text */
#define SRV_SCHEMA_MAX_KEYS 16384LL   /* bytes of property names (optional ones cost xgrammar most) */
#define SRV_CHOICE_MAX 1024LL       /* guided_choice / structured_outputs.choice entries */
#define SRV_CHOICE_MAX_BYTES 65536LL /* their bytes in all */
#define SRV_GRAMMAR_MAX_BYTES 65536LL /* a regex or EBNF grammar */

/* Resolve a model name to a folder holding config.json: NAME as a path,
 * $ECHO_MODEL_DIR/NAME, ./models/NAME, then the Hugging Face hub cache
 * ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub; "qwen3-8b" or
 * "Qwen/Qwen3-8B" -> models--Qwen--Qwen3-8B/snapshots/<rev>, names compared
 * case-insensitively). On failure err lists every place looked at. */
int srv_resolve_model(const char *name, char *dir, size_t dirlen, char *err, size_t errlen);

/* Bind and start answering (model routes 503 until srv_load). */
int srv_create(const srv_options *opt, srv_server **out, char *err, size_t errlen);
/* The bound port (useful with port 0). */
int srv_port(const srv_server *s);
/* The model id clients use (--served-model-name or the folder's name). */
const char *srv_model_name(const srv_server *s);
/* Load tokenizer and engine, log the plan, start the scheduler. Blocking;
 * logs progress while weights load. */
int srv_load(srv_server *s, char *err, size_t errlen);
/* Stop accepting, drain or cancel in-flight requests, stop the scheduler. */
void srv_shutdown(srv_server *s);
/* Stop HTTP and free everything (calls srv_shutdown when needed). */
void srv_destroy(srv_server *s);
/* Grammar compiles still running (abandoned ones included): a process that
 * exits with some should leave by _exit, as xgrammar's threads cannot be
 * stopped and its static objects must not be destroyed under them. */
int srv_grammar_compiles_running(srv_server *s);

/* Leveled log line on stderr, filtered by the server's level. */
void srv_log(const srv_server *s, srv_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
