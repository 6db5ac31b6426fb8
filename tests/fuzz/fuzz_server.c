/*
 * libFuzzer target for server/: the JSON bodies of the four POST routes.
 * The first input byte picks the route (low two bits; the seed corpus uses
 * the digits '0'..'3'), the rest is the request body:
 *   0: /v1/completions   1: /v1/chat/completions   2: /tokenize   3: /detokenize
 * Each input goes through srv_fuzz_parse(), the production parse, validate
 * and tokenize path of the handlers (and the response object for the
 * tokenizer routes), without engine or network. Invariants checked:
 *   - the answer is 200, 400 or 404; a 500 here is a bug (ASan's allocator
 *     never returns NULL, so "out of memory" cannot be genuine);
 *   - an error carries a message, a success none;
 *   - the message is valid UTF-8 without NUL, as jansson needs it to build
 *     the error answer (issue 35: messages cut by bytes inside a character
 *     answered 500 "out of memory"), and srv_error_json builds it;
 *   - srv_quote of the raw body, into a small and a large buffer, is valid
 *     UTF-8 that fits.
 *
 * The server is set up once in LLVMFuzzerInitialize as srv_create() and
 * srv_load() would before the engine exists: the committed Qwen3 tokenizer
 * (tests/fixtures/tokenizer/qwen3), the realvocab model config
 * (tests/fixtures/models/realvocab), and the limits the engine would report
 * with default options (max_model_len min(max_position_embeddings, 4096),
 * 16-token KV blocks, enough for 8 full sequences). Paths are relative to the
 * repository root, where make fuzz-regress runs.
 *
 * The fuzz build links the C sources of server/ and tokenizer/, model
 * config parsing, the sampling helpers and comm/echo.c (mode names), so two
 * things are replaced by stubs here: the SentencePiece C++ wrapper, and the
 * engine API that the scheduler and srv_load() call (never reached: no engine
 * is created; the cpu kernels' target_clones do not link with clang 14).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/codec/codec.h"
#include "comm/echo_internal.h"
#include "engine/chat.h"
#include "engine/report.h"
#include "engine/seq.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "server/internal.h"
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- grammar/ stubs (xgrammar is C++): every vocabulary, grammar and
 * matcher is one static object, so a structured-output request that passes
 * validation is accepted (200) as with the real engine; bad sources are
 * what the real engine would say only for the checks done in server/. ---- */
static char g_gram_obj;
int gram_vocab_new(const char *const *tokens, const size_t *lens, size_t n_tokens, size_t vocab_size,
                   const int32_t *stop_ids, size_t n_stop, gram_vocab **out, char *err, size_t errlen) {
    (void)tokens, (void)lens, (void)n_tokens, (void)vocab_size, (void)stop_ids, (void)n_stop, (void)err, (void)errlen;
    *out = (gram_vocab *)&g_gram_obj;
    return GRAM_OK;
}
void gram_vocab_free(gram_vocab *v) { (void)v; }
int gram_compile(gram_vocab *v, gram_kind kind, const char *src, size_t len, gram_grammar **out, double *seconds,
                 char *err, size_t errlen) {
    (void)v, (void)kind, (void)src, (void)len, (void)err, (void)errlen;
    if (seconds) *seconds = 0;
    *out = (gram_grammar *)&g_gram_obj;
    return GRAM_OK;
}
void gram_grammar_free(gram_grammar *g) { (void)g; }
int gram_matcher_new(const gram_grammar *g, gram_matcher **out, char *err, size_t errlen) {
    (void)g, (void)err, (void)errlen;
    *out = (gram_matcher *)&g_gram_obj;
    return GRAM_OK;
}
void gram_matcher_free(gram_matcher *m) { (void)m; }
int gram_matcher_accept(gram_matcher *m, int32_t token) { return (void)m, (void)token, 1; }
int gram_matcher_fill(gram_matcher *m, uint32_t *mask, char *err, size_t errlen) {
    return (void)m, (void)mask, (void)err, (void)errlen, 0;
}
int gram_matcher_complete(const gram_matcher *m) { return (void)m, 0; }
size_t gram_mask_words(size_t vocab_size) { return (vocab_size + 31) / 32; }
void gram_mask_apply(float *row, size_t vocab_size, const uint32_t *mask) { (void)row, (void)vocab_size, (void)mask; }

/* ---- SentencePiece stubs (C++ is not part of this build) ---- */
int tok_spm_load(const char *path, tok_spm **out, char *err, size_t errlen) {
    *out = NULL;
    return tok_err(err, errlen, TOK_EUNSUPPORTED, "%s: SentencePiece not built", path);
}
void tok_spm_free(tok_spm *m) {
    (void)m;
}
int tok_spm_encode(const tok_spm *m, const char *text, size_t len, int32_t **ids, size_t *n, char *err, size_t errlen) {
    (void)m, (void)text, (void)len, (void)ids, (void)n;
    return tok_err(err, errlen, TOK_EUNSUPPORTED, "not built");
}
int tok_spm_decode(const tok_spm *m, const int32_t *ids, size_t n, char **out, size_t *out_len, char *err,
                   size_t errlen) {
    (void)m, (void)ids, (void)n, (void)out, (void)out_len;
    return tok_err(err, errlen, TOK_EUNSUPPORTED, "not built");
}
size_t tok_spm_vocab_size(const tok_spm *m) {
    return (void)m, 0;
}
int32_t tok_spm_piece_to_id(const tok_spm *m, const char *piece) {
    return (void)m, (void)piece, -1;
}
char *tok_spm_id_to_piece(const tok_spm *m, int32_t id) {
    return (void)m, (void)id, NULL;
}
int tok_spm_piece_kind(const tok_spm *m, int32_t id) {
    return (void)m, (void)id, 0;
}
int32_t tok_spm_bos_id(const tok_spm *m) {
    return (void)m, -1;
}
int32_t tok_spm_eos_id(const tok_spm *m) {
    return (void)m, -1;
}
int tok_spm_add_dummy_prefix(const tok_spm *m) {
    return (void)m, 0;
}

/* ---- comm/ codec stubs: comm/echo.c is linked for the preset names; its
 * one-shot all-reduce needs the codec loops, never reached without a world ---- */
void echo_cpu_load(const void *x, echo_dtype dt, size_t n, float *out, int accumulate) {
    (void)x, (void)dt, (void)n, (void)out, (void)accumulate;
    abort();
}
void echo_cpu_store(const float *in, size_t n, void *out, echo_dtype dt, size_t *bad) {
    (void)in, (void)n, (void)out, (void)dt, (void)bad;
    abort();
}
int echo_codec_encode_as(echo_codec_id id, const float *x, float *res, size_t count, int group, void *wire, char *err,
                         size_t errlen) {
    (void)id, (void)x, (void)res, (void)count, (void)group, (void)wire, (void)err, (void)errlen;
    abort();
}
int echo_codec_decode_as(echo_codec_id id, const void *wire, size_t count, int group, float *out, int accumulate,
                         char *err, size_t errlen) {
    (void)id, (void)wire, (void)count, (void)group, (void)out, (void)accumulate, (void)err, (void)errlen;
    abort();
}

/* ---- engine stubs (no engine in this build; none of them is reached) ---- */
int eng_create(const eng_config *cfg, eng **out, char *err, size_t errlen) {
    (void)cfg;
    *out = NULL;
    snprintf(err, errlen, "engine not built into the fuzzer");
    return -1;
}
void eng_destroy(eng *e) {
    (void)e;
}
const eng_config *eng_get_config(const eng *e) {
    return (void)e, NULL;
}
const char *eng_graphs_note(const eng *e) {
    return (void)e, NULL;
}
int eng_seq_new(eng *e, int *seq, char *err, size_t errlen) {
    (void)e;
    *seq = -1;
    snprintf(err, errlen, "engine not built into the fuzzer");
    return -1;
}
int eng_step(eng *e, const eng_item *items, int n_items, float *logits, char *err, size_t errlen) {
    (void)e, (void)items, (void)n_items, (void)logits;
    snprintf(err, errlen, "engine not built into the fuzzer");
    return -1;
}
int eng_step_cands(eng *e, const eng_item *items, int n_items, int k, eng_cands *cands, const unsigned char *full,
                   float *logits, char *err, size_t errlen) {
    (void)e, (void)items, (void)n_items, (void)k, (void)cands, (void)full, (void)logits;
    snprintf(err, errlen, "engine not built into the fuzzer");
    return -1;
}
void eng_seq_free(eng *e, int seq) {
    (void)e, (void)seq;
}
int eng_seq_truncate(eng *e, int seq, int len) {
    (void)e, (void)seq, (void)len;
    return -1;
}
int eng_seq_new_prefix(eng *e, const int32_t *prompt, int n, int max_reuse, int *seq, int *reused, char *err,
                       size_t errlen) {
    (void)e, (void)prompt, (void)n, (void)max_reuse, *seq = -1, *reused = 0;
    snprintf(err, errlen, "engine not built into the fuzzer");
    return -1;
}
int eng_prefix_peek(const eng *e, const int32_t *prompt, int n, int max_reuse, int *evictable) {
    (void)e, (void)prompt, (void)n, (void)max_reuse;
    if (evictable) *evictable = 0;
    return 0;
}
/* the one-pass-per-step engine (exact on threads): chunks as asked */
int eng_pass_tokens(const eng *e) {
    return (void)e, 0;
}
int eng_prompt_chunk(const eng *e, int pos, int left, int budget) {
    (void)e, (void)pos;
    int n = left < budget ? left : budget;
    return n > 0 ? n : 0;
}
/* tp 1 with no overlap: no all-reduce to describe */
int eng_allreduce_config(const eng *e, echo_config *out) {
    (void)e;
    memset(out, 0, sizeof *out);
    return -1;
}
int eng_overlap_k(const eng *e) {
    return (void)e, 1;
}
/* a fixed preset, never --allreduce auto (tp 1) */
int eng_allreduce_auto(const eng *e, echo_auto_figures *f, echo_auto_choice *c) {
    (void)e, (void)f, (void)c;
    return 0;
}
size_t eng_oneshot_bytes(const eng *e) {
    return (void)e, 0;
}
int eng_seq_blocks(const eng *e, int seq) {
    return (void)e, (void)seq, -1;
}
void eng_kv_get_usage(const eng *e, eng_kv_usage *u) {
    (void)e, memset(u, 0, sizeof *u);
}
void eng_get_rank_info(const eng *e, int rank, eng_rank_info *out) {
    (void)e, (void)rank, memset(out, 0, sizeof *out);
}
void eng_comm_stats(const eng *e, echo_stats *out) {
    (void)e, memset(out, 0, sizeof *out);
}
int eng_usable(const eng *e, char *why, size_t len) {
    return (void)e, (void)why, (void)len, 1;
}
int eng_ranks_alive(const eng *e, char *why, size_t len) {
    return (void)e, (void)why, (void)len, 1;
}
const char *kern_auto_device(void) {
    return "cpu";
}
static const kern_backend_info fuzz_cpu = {.name = "cpu", .host = 1};
const kern_backend_info *kern_backend_find(const char *name) {
    return (void)name, &fuzz_cpu;
}
const kern_backend_info *kern_backend_at(int i) {
    return i == 0 ? &fuzz_cpu : NULL;
}

#define MODEL_DIR "tests/fixtures/models/realvocab"
#define TOKENIZER_DIR "tests/fixtures/tokenizer/qwen3"

static srv_server *g_srv;
static int g_verbose; /* FUZZ_SERVER_VERBOSE=1: print each input's answer */

static void teardown(void) {
    srv_destroy(g_srv); /* frees the tokenizer, metrics and names */
    g_srv = NULL;
}

static void die(const char *what, const char *err) {
    fprintf(stderr, "fuzz_server: %s: %s (run from the repository root)\n", what, err);
    exit(1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char err[512];
    srv_server *s = calloc(1, sizeof *s);
    if (!s) die("setup", "out of memory");
    /* srv_create()'s defaults, without binding a socket. */
    s->opt.model_dir = MODEL_DIR;
    s->opt.host = "127.0.0.1";
    s->opt.device = "cpu";
    s->opt.tp = 1;
    s->opt.max_num_seqs = 8;
    s->opt.max_num_batched_tokens = 512;
    s->opt.max_waiting = 256;
    s->opt.max_connections = 256;
    s->opt.timeout_s = 30;
    s->opt.max_body_bytes = 8u << 20;
    s->opt.log_level = SRV_LOG_ERROR;
    s->opt.grammar_compiles = 1;
    s->opt.grammar_timeout_s = 10;
    s->cpool = srv_cpool_new(1); /* constraints compile (the stub) on a compile thread, as in the server */
    s->model_dir = strdup(MODEL_DIR);
    s->name = strdup("realvocab");
    atomic_init(&s->ready, 0);
    atomic_init(&s->accepting, 1);
    atomic_init(&s->req_counter, 0);
    atomic_init(&s->http_active, 0);
    s->seed_base = 0x9e3779b97f4a7c15ull; /* fixed: runs are reproducible */
    pthread_mutex_init(&s->sch.mu, NULL);
    pthread_mutex_init(&s->gram_mu, NULL);
    pthread_cond_init(&s->sch.cv, NULL);
    if (!s->model_dir || !s->name || !s->cpool || srv_metrics_init(&s->met)) die("setup", "out of memory");
    g_verbose = getenv("FUZZ_SERVER_VERBOSE") != NULL;
    g_srv = s;
    atexit(teardown);
    /* srv_load() up to the engine. */
    if (model_config_load(MODEL_DIR, &s->mc, err, sizeof err)) die(MODEL_DIR, err);
    s->gd = (srv_gen_defaults){.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .top_k = 0};
    if (tok_load_dir(TOKENIZER_DIR, &s->tok, err, sizeof err) != TOK_OK) die(TOKENIZER_DIR, err);
    /* no chat template in the folder: the built-in one, compiled as srv_load() does */
    if (eng_chat_template_builtin(&s->chat_builtin, err, sizeof err)) die("built-in chat template", err);
    /* the reasoning parser Qwen3's built-in template gets, and the testing field on */
    s->opt.debug_request_fields = 1;
    if (srv_reason_setup(s, err, sizeof err)) die("reasoning parser", err);
    /* What eng_create() reports with default options. */
    s->max_model_len = s->mc.max_position_embeddings < 4096 ? s->mc.max_position_embeddings : 4096;
    s->block_size = 16;
    s->total_blocks = s->opt.max_num_seqs * ((s->max_model_len + s->block_size - 1) / s->block_size);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size - 1 > g_srv->opt.max_body_bytes) return 0; /* larger bodies are refused with 413 */
    static const char *const paths[4] = {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"};
    char err[512];
    const char *route = paths[data[0] & 3];
    int status = srv_fuzz_parse(g_srv, route, (const char *)data + 1, size - 1, err, sizeof err);
    if (g_verbose) fprintf(stderr, "%s: %d %s\n", route, status, err);
    if (status != 200 && status != 400 && status != 404) {
        fprintf(stderr, "%s: unexpected status %d: %s\n", route, status, err);
        abort();
    }
    if ((status == 200) != (err[0] == 0)) {
        fprintf(stderr, "%s: status %d with message '%s'\n", route, status, err);
        abort();
    }
    json_t *ej = srv_error_json(status, err, NULL);
    if (!srv_utf8_text(err, strlen(err)) || !ej) {
        fprintf(stderr, "%s: status %d: the message is not UTF-8 text: '%s'\n", route, status, err);
        abort();
    }
    json_decref(ej);
    static const size_t sizes[2] = {12, 300};
    for (int k = 0; k < 2; k++) {
        char q[300];
        srv_quote(q, sizes[k], (const char *)data + 1, size - 1);
        if (strlen(q) >= sizes[k] || !srv_utf8_text(q, strlen(q))) {
            fprintf(stderr, "srv_quote into %zu bytes: '%s' is not UTF-8 text that fits\n", sizes[k], q);
            abort();
        }
    }
    return 0;
}
