/*
 * server/: Prometheus metrics — vLLM's names and buckets under the `echo:`
 * prefix, plus the all-reduce time and bytes by mode, so an experiment can
 * read the communication share of TTFT next to TTFT itself.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

/* vLLM's buckets (vllm/v1/metrics/loggers.py). */
static const double TTFT_B[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double ITL_B[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                               0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double REQ_B[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                               30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

/* Grammar compile time and per-token mask time (structured outputs). */
static const double GCOMP_B[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0};
static const double GMASK_B[] = {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1};

/* vLLM's iteration-token buckets. */
static const double SPEC_B[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64}; /* accepted tokens per draft */
static const double ITER_B[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

static int hist_init(srv_hist *h, const double *b, int n) {
    h->bounds = b;
    h->n = n;
    h->counts = calloc((size_t)n + 1, sizeof *h->counts);
    return h->counts ? 0 : -1;
}

int srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    int n_ttft = (int)(sizeof TTFT_B / sizeof *TTFT_B), n_itl = (int)(sizeof ITL_B / sizeof *ITL_B),
        n_req = (int)(sizeof REQ_B / sizeof *REQ_B);
    if (hist_init(&m->ttft, TTFT_B, n_ttft) || hist_init(&m->itl, ITL_B, n_itl) || hist_init(&m->e2e, REQ_B, n_req) ||
        hist_init(&m->queue, REQ_B, n_req) || hist_init(&m->prefill, REQ_B, n_req) ||
        hist_init(&m->decode, REQ_B, n_req) || hist_init(&m->inference, REQ_B, n_req) ||
        hist_init(&m->iter_tokens, ITER_B, (int)(sizeof ITER_B / sizeof *ITER_B)) ||
        hist_init(&m->spec_accepted, SPEC_B, (int)(sizeof SPEC_B / sizeof *SPEC_B)) ||
        hist_init(&m->grammar_compile, GCOMP_B, (int)(sizeof GCOMP_B / sizeof *GCOMP_B)) ||
        hist_init(&m->grammar_mask, GMASK_B, (int)(sizeof GMASK_B / sizeof *GMASK_B)))
        return -1;
    return srv_metrics_set_len(m, 4096);
}

/* vLLM's build_1_2_5_buckets(max_model_len): 1, 2, 5, 10, 20, 50, ... <= max. */
int srv_metrics_set_len(srv_metrics *m, int max_model_len) {
    double *b = malloc(64 * sizeof *b);
    if (!b) return -1;
    int n = 0;
    for (double e = 1; n < 60; e *= 10) {
        const double mant[3] = {1, 2, 5};
        int stop = 0;
        for (int i = 0; i < 3; i++) {
            if (mant[i] * e > max_model_len) {
                stop = 1;
                break;
            }
            b[n++] = mant[i] * e;
        }
        if (stop) break;
    }
    uint64_t *c1 = calloc((size_t)n + 1, sizeof *c1), *c2 = calloc((size_t)n + 1, sizeof *c2);
    if (!c1 || !c2) {
        free(b);
        free(c1);
        free(c2);
        return -1;
    }
    pthread_mutex_lock(&m->mu);
    free(m->req_prompt.counts);
    free(m->req_gen.counts);
    free(m->tok_bounds);
    m->tok_bounds = b;
    m->req_prompt = (srv_hist){.bounds = b, .n = n, .counts = c1};
    m->req_gen = (srv_hist){.bounds = b, .n = n, .counts = c2};
    pthread_mutex_unlock(&m->mu);
    return 0;
}

void srv_metrics_free(srv_metrics *m) {
    free(m->ttft.counts);
    free(m->itl.counts);
    free(m->e2e.counts);
    free(m->queue.counts);
    free(m->prefill.counts);
    free(m->decode.counts);
    free(m->inference.counts);
    free(m->iter_tokens.counts);
    free(m->spec_accepted.counts);
    free(m->grammar_compile.counts);
    free(m->grammar_mask.counts);
    free(m->req_prompt.counts);
    free(m->req_gen.counts);
    free(m->tok_bounds);
    pthread_mutex_destroy(&m->mu);
}

void srv_hist_observe(srv_hist *h, double v) {
    int i = 0;
    while (i < h->n && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = b->cap * 2 + (size_t)n;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}

/* A bucket bound as prometheus_client writes it (Python's repr of a float,
 * "1.0" not "1"; Go's exponent form from 1e+06 up), so scrapers that
 * compare label values see the same series as with vLLM. */
static void le_str(double v, char *out, size_t n) {
    snprintf(out, n, "%g", v);
    if (!strpbrk(out, ".en")) strncat(out, ".0", n - strlen(out) - 1);
}

static void put_hist(sbuf *b, const char *name, const char *help, const srv_hist *h, const char *lbl) {
    sb_printf(b, "# HELP echo:%s %s\n# TYPE echo:%s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n; i++) {
        cum += h->counts[i];
        if (i < h->n) {
            char le[32];
            le_str(h->bounds[i], le, sizeof le);
            sb_printf(b, "echo:%s_bucket{%s,le=\"%s\"} %llu\n", name, lbl, le, (unsigned long long)cum);
        } else
            sb_printf(b, "echo:%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lbl, (unsigned long long)cum);
    }
    sb_printf(b, "echo:%s_sum{%s} %.9g\necho:%s_count{%s} %llu\n", name, lbl, h->sum, name, lbl,
              (unsigned long long)h->count);
}

/* The served name is ours (command line), but escape it anyway. */
static void label_escape(const char *in, char *out, size_t outlen) {
    size_t j = 0;
    for (; *in && j + 3 < outlen; in++) {
        if (*in == '"' || *in == '\\') out[j++] = '\\';
        if (*in == '\n') {
            out[j++] = '\\';
            out[j++] = 'n';
            continue;
        }
        out[j++] = *in;
    }
    out[j] = 0;
}

/* The KV cache, prefix cache and all-reduce families (caller holds m->mu). */
static void put_engine_info(sbuf *b, const srv_metrics *m, const char *lbl) {
    sb_printf(b,
              "# HELP echo:cache_config_info Information of the LLMEngine CacheConfig\n"
              "# TYPE echo:cache_config_info gauge\necho:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\","
              "cache_dtype=\"%s\",bytes_per_token_per_rank=\"%zu\",enable_prefix_caching=\"%s\"} 1.0\n",
              m->block_size, m->num_blocks, m->kv_dtype ? m->kv_dtype : "?",
              m->block_size ? m->kv.block_bytes / (size_t)m->block_size : 0, m->kv.prefix_cache ? "True" : "False");
    sb_printf(b,
              "# HELP echo:kv_bytes_in_use KV bytes per rank holding data (blocks held by requests or cached).\n"
              "# TYPE echo:kv_bytes_in_use gauge\necho:kv_bytes_in_use{%s} %zu\n"
              "# HELP echo:kv_bytes_touched KV bytes per rank ever written (blocks handed out at least once): the "
              "cache's share of the resident memory.\n"
              "# TYPE echo:kv_bytes_touched gauge\necho:kv_bytes_touched{%s} %zu\n",
              lbl, (size_t)m->kv.used_blocks * m->kv.block_bytes, lbl,
              (size_t)m->kv.touched_blocks * m->kv.block_bytes);
    sb_printf(
        b,
        "# HELP echo:prefix_cache_queries_total Prefix cache queries, in prompt tokens looked up.\n"
        "# TYPE echo:prefix_cache_queries_total counter\necho:prefix_cache_queries_total{%s} %lld\n"
        "# HELP echo:prefix_cache_hits_total Prefix cache hits, in prompt tokens reused (the sum of "
        "usage.prompt_tokens_details.cached_tokens).\n"
        "# TYPE echo:prefix_cache_hits_total counter\necho:prefix_cache_hits_total{%s} %lld\n"
        "# HELP echo:prefix_cache_requests_total Requests that looked the prefix cache up.\n"
        "# TYPE echo:prefix_cache_requests_total counter\necho:prefix_cache_requests_total{%s} %lld\n"
        "# HELP echo:kv_blocks_in_use KV blocks held by running requests.\n"
        "# TYPE echo:kv_blocks_in_use gauge\necho:kv_blocks_in_use{%s} %d\n"
        "# HELP echo:prefix_cache_blocks KV blocks in the prefix cache (held by requests or not).\n"
        "# TYPE echo:prefix_cache_blocks gauge\necho:prefix_cache_blocks{%s} %d\n"
        "# HELP echo:prefix_cache_evictable_blocks Cached KV blocks no request holds (free for reuse).\n"
        "# TYPE echo:prefix_cache_evictable_blocks gauge\necho:prefix_cache_evictable_blocks{%s} %d\n"
        "# HELP echo:prefix_cache_evicted_blocks_total Cached KV blocks evicted to make room.\n"
        "# TYPE echo:prefix_cache_evicted_blocks_total counter\necho:prefix_cache_evicted_blocks_total{%s} %lld\n",
        lbl, m->kv.prefix_query_tokens, lbl, m->kv.prefix_hit_tokens, lbl, m->kv.prefix_queries, lbl,
        m->kv.total_blocks - m->kv.free_blocks, lbl, m->kv.cached_blocks, lbl, m->kv.evictable_blocks, lbl,
        m->kv.evicted_blocks);
    sb_printf(b,
              "# HELP echo:allreduce_config_info The all-reduce of the row-parallel layers: preset, codec, values per "
              "scale group, wire bits per value averaged over a pass, error feedback, tensor-parallel ranks, the "
              "tail policy (the last tail_calls of a pass's calls sent with tail_codec)\n"
              "# TYPE echo:allreduce_config_info gauge\necho:allreduce_config_info{%s,preset=\"%s\",codec=\"%s\","
              "group=\"%d\",bits_per_value=\"%.3f\",feedback=\"%s\",tp=\"%d\",tail_calls=\"%d\",calls=\"%d\","
              "tail_codec=\"%s\"} 1.0\n",
              lbl, m->ar_preset, m->ar_codec, m->ar_group, m->ar_bits, m->ar_feedback ? "on" : "off", m->ar_tp,
              m->ar_tail_calls, m->ar_calls, m->ar_tail_codec);
    if (m->ar_auto)
        sb_printf(b,
                  "# HELP echo:allreduce_auto_info What --allreduce auto chose at start-up (per call-size class) and "
                  "the figures it measured: link latency (s) and bytes/s per class, codec values/s per thread\n"
                  "# TYPE echo:allreduce_auto_info gauge\necho:allreduce_auto_info{%s,small_calls=\"%s\","
                  "small_oneshot=\"%d\",large_calls=\"%s\",overlap=\"%d\",shared_memory=\"%d\","
                  "small_latency_s=\"%.3g\",small_bytes_per_s=\"%.4g\",large_latency_s=\"%.3g\","
                  "large_bytes_per_s=\"%.4g\",bf16_encode_vps=\"%.4g\",bf16_decode_vps=\"%.4g\","
                  "echo_encode_vps=\"%.4g\",echo_decode_vps=\"%.4g\",echo3_encode_vps=\"%.4g\","
                  "echo3_decode_vps=\"%.4g\"} 1.0\n",
                  lbl, m->ar_auto_small, m->ar_auto_oneshot, m->ar_auto_large, m->ar_auto_overlap, m->ar_auto_shared,
                  m->ar_auto_lat_s[0], m->ar_auto_bps[0], m->ar_auto_lat_s[1], m->ar_auto_bps[1], m->ar_auto_enc[1],
                  m->ar_auto_dec[1], m->ar_auto_enc[2], m->ar_auto_dec[2], m->ar_auto_enc[3], m->ar_auto_dec[3]);
}

char *srv_metrics_render(srv_metrics *m, const char *model_name, size_t *len) {
    sbuf b = {malloc(8192), 0, 8192, 0};
    if (!b.p) return NULL;
    char esc[512], lbl[600];
    label_escape(model_name, esc, sizeof esc);
    snprintf(lbl, sizeof lbl, "model_name=\"%s\"", esc);
    pthread_mutex_lock(&m->mu);
    put_hist(&b, "time_to_first_token_seconds", "Histogram of time to first token in seconds.", &m->ttft, lbl);
    put_hist(&b, "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &m->itl, lbl);
    put_hist(&b, "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &m->e2e, lbl);
    put_hist(&b, "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", &m->queue, lbl);
    put_hist(&b, "request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", &m->prefill,
             lbl);
    put_hist(&b, "request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", &m->decode,
             lbl);
    put_hist(&b, "request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
             &m->inference, lbl);
    put_hist(&b, "request_prompt_tokens", "Number of prefill tokens processed.", &m->req_prompt, lbl);
    put_hist(&b, "request_generation_tokens", "Number of generation tokens processed.", &m->req_gen, lbl);
    put_hist(&b, "iteration_tokens_total", "Histogram of number of tokens per engine_step.", &m->iter_tokens, lbl);
    put_hist(&b, "spec_decode_accepted_tokens_per_step",
             "Speculative decoding: draft tokens accepted per step that verified a draft (--speculative).",
             &m->spec_accepted, lbl);
    sb_printf(&b,
              "# HELP echo:spec_decode_config_info Speculative decoding: method (none, ngram) and draft tokens per step "
              "at most.\n"
              "# TYPE echo:spec_decode_config_info gauge\n"
              "echo:spec_decode_config_info{%s,method=\"%s\",draft_max=\"%d\"} 1.0\n"
              "# HELP echo:spec_decode_num_drafts_total Steps that verified a draft.\n"
              "# TYPE echo:spec_decode_num_drafts_total counter\necho:spec_decode_num_drafts_total{%s} %llu\n"
              "# HELP echo:spec_decode_num_draft_tokens_total Draft tokens proposed.\n"
              "# TYPE echo:spec_decode_num_draft_tokens_total counter\n"
              "echo:spec_decode_num_draft_tokens_total{%s} %llu\n"
              "# HELP echo:spec_decode_num_accepted_tokens_total Draft tokens accepted.\n"
              "# TYPE echo:spec_decode_num_accepted_tokens_total counter\n"
              "echo:spec_decode_num_accepted_tokens_total{%s} %llu\n"
              "# HELP echo:spec_decode_acceptance_rate Accepted over proposed draft tokens since start (0 before any).\n"
              "# TYPE echo:spec_decode_acceptance_rate gauge\necho:spec_decode_acceptance_rate{%s} %.6g\n",
              lbl, m->spec_on ? "ngram" : "none", m->spec_draft_max, lbl, (unsigned long long)m->spec_drafts, lbl,
              (unsigned long long)m->spec_draft_tokens, lbl, (unsigned long long)m->spec_accepted_tokens, lbl,
              m->spec_draft_tokens ? (double)m->spec_accepted_tokens / (double)m->spec_draft_tokens : 0.0);
    put_hist(&b, "grammar_compile_seconds",
             "Time to compile a structured-output constraint against the vocabulary (cache hits included).",
             &m->grammar_compile, lbl);
    put_hist(&b, "grammar_mask_seconds", "Time to compute and apply the grammar's token mask, per constrained token.",
             &m->grammar_mask, lbl);
    sb_printf(&b,
              "# HELP echo:constrained_requests_total Requests decoded under a grammar (structured outputs, tools).\n"
              "# TYPE echo:constrained_requests_total counter\necho:constrained_requests_total{%s} %llu\n",
              lbl, (unsigned long long)m->constrained);
    static const char *const why[3] = {"client_gone_before_compile", "abandoned", "no_slot"};
    sb_printf(&b, "# HELP echo:grammar_compiles_dropped_total Grammar compiles not done or not waited for, by why.\n"
                  "# TYPE echo:grammar_compiles_dropped_total counter\n");
    for (int i = 0; i < 3; i++)
        sb_printf(&b, "echo:grammar_compiles_dropped_total{%s,why=\"%s\"} %llu\n", lbl, why[i],
                  (unsigned long long)m->gram_dropped[i]);
    sb_printf(&b,
              "# HELP echo:num_preemptions_total Cumulative number of preemption from the engine.\n"
              "# TYPE echo:num_preemptions_total counter\necho:num_preemptions_total{%s} %llu\n",
              lbl, (unsigned long long)m->preemptions);
    put_engine_info(&b, m, lbl);
    sb_printf(&b,
              "# HELP echo:prompt_tokens_total Number of prefill tokens processed.\n"
              "# TYPE echo:prompt_tokens_total counter\necho:prompt_tokens_total{%s} %llu\n",
              lbl, (unsigned long long)m->prompt_tokens);
    sb_printf(&b,
              "# HELP echo:generation_tokens_total Number of generation tokens processed.\n"
              "# TYPE echo:generation_tokens_total counter\necho:generation_tokens_total{%s} %llu\n",
              lbl, (unsigned long long)m->generation_tokens);
    sb_printf(&b, "# HELP echo:request_success_total Count of successfully processed requests.\n"
                  "# TYPE echo:request_success_total counter\n");
    const srv_finish fins[] = {SRV_FIN_STOP, SRV_FIN_LENGTH, SRV_FIN_ABORT, SRV_FIN_ERROR};
    for (int i = 0; i < 4; i++)
        sb_printf(&b, "echo:request_success_total{%s,finished_reason=\"%s\"} %llu\n", lbl, srv_finish_name(fins[i]),
                  (unsigned long long)m->success[fins[i]]);
    sb_printf(&b,
              "# HELP echo:num_requests_running Number of requests in model execution batches.\n"
              "# TYPE echo:num_requests_running gauge\necho:num_requests_running{%s} %d\n",
              lbl, m->running);
    sb_printf(&b,
              "# HELP echo:num_requests_waiting Number of requests waiting to be processed.\n"
              "# TYPE echo:num_requests_waiting gauge\necho:num_requests_waiting{%s} %d\n",
              lbl, m->waiting);
    sb_printf(&b,
              "# HELP echo:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
              "# TYPE echo:kv_cache_usage_perc gauge\necho:kv_cache_usage_perc{%s} %.6g\n",
              lbl, m->kv_usage);
    sb_printf(&b, "# HELP echo:allreduce_seconds_total Host wall time inside the all-reduce calls, summed over "
                  "ranks (on nccl only the enqueueing: each pass waits for its calls once, at its end).\n"
                  "# TYPE echo:allreduce_seconds_total counter\n");
    for (int k = 0; k < ECHO_PRESET_COUNT; k++)
        sb_printf(&b, "echo:allreduce_seconds_total{%s,mode=\"%s\"} %.9g\n", lbl, echo_preset_name((echo_preset)k),
                  m->comm.seconds[k]);
    sb_printf(&b, "# HELP echo:allreduce_bytes_total Bytes sent by the all-reduce, summed over ranks.\n"
                  "# TYPE echo:allreduce_bytes_total counter\n");
    for (int k = 0; k < ECHO_PRESET_COUNT; k++)
        sb_printf(&b, "echo:allreduce_bytes_total{%s,mode=\"%s\"} %llu\n", lbl, echo_preset_name((echo_preset)k),
                  (unsigned long long)m->comm.wire_bytes[k]);
    sb_printf(&b, "# HELP echo:allreduce_calls_total All-reduce calls, summed over ranks.\n"
                  "# TYPE echo:allreduce_calls_total counter\n");
    for (int k = 0; k < ECHO_PRESET_COUNT; k++)
        sb_printf(&b, "echo:allreduce_calls_total{%s,mode=\"%s\"} %llu\n", lbl, echo_preset_name((echo_preset)k),
                  (unsigned long long)m->comm.calls[k]);
    sb_printf(&b, "# HELP echo:http_responses_total HTTP responses by status class.\n"
                  "# TYPE echo:http_responses_total counter\n");
    for (int k = 1; k <= 5; k++)
        sb_printf(&b, "echo:http_responses_total{status=\"%dxx\"} %llu\n", k, (unsigned long long)m->http_requests[k]);
    sb_printf(&b, "# HELP echo:http_connections_rejected_total Connections answered 503 at once: over "
                  "--max-connections, or over --max-connections-per-client from one address.\n"
                  "# TYPE echo:http_connections_rejected_total counter\n"
                  "echo:http_connections_rejected_total{reason=\"max_connections\"} %llu\n"
                  "echo:http_connections_rejected_total{reason=\"per_client\"} %llu\n",
              (unsigned long long)m->conn_rejected[0], (unsigned long long)m->conn_rejected[1]);
    sb_printf(&b, "# HELP echo:http_request_deadline_closed_total Connections closed because a request did not "
                  "arrive whole within --request-deadline.\n"
                  "# TYPE echo:http_request_deadline_closed_total counter\n"
                  "echo:http_request_deadline_closed_total %llu\n",
              (unsigned long long)m->deadline_closed);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

/* The gauges (running, waiting, KV use, the engine's counters): the
 * scheduler's, before a step and before a client is released. */
void srv_metrics_publish(srv_server *s) {
    eng_kv_usage u;
    eng_kv_get_usage(s->eng, &u);
    echo_stats cs;
    eng_comm_stats(s->eng, &cs);
    pthread_mutex_lock(&s->met.mu);
    s->met.running = s->sch.n_running;
    s->met.waiting = s->sch.n_waiting;
    s->met.kv_usage = u.total_blocks ? (double)(u.total_blocks - u.free_blocks) / u.total_blocks : 0;
    s->met.kv = u;
    s->met.comm = cs;
    pthread_mutex_unlock(&s->met.mu);
}
