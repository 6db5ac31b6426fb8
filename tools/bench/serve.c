/*
 * echo-bench serve: a load generator for OpenAI-compatible servers, shaped
 * like `vllm bench serve` (same flag names, same summary block, same JSON
 * metric names) but in C, so nothing interpreted sits between the clock and
 * the socket.
 *
 * One thread drives every transfer through the libcurl multi interface:
 * requests are released on a Poisson schedule (gamma inter-arrival times
 * with shape --burstiness, mean 1/rate) and, when --max-concurrency is set,
 * wait for a free slot; the send instant is when the request is handed to
 * curl, so TTFT includes connect and queueing in the server, not queueing
 * in this client. SSE is parsed as bytes arrive (an event can split
 * anywhere across write callbacks); every callback is stamped with
 * CLOCK_MONOTONIC once, so all events in one TCP read share a timestamp.
 *
 * Per request: TTFT = send -> first chunk whose choices[0].text (completions)
 * or choices[0].delta.content (chat) is non-empty (a role-only first chat
 * chunk does not count); ITL = gaps between later content chunks; TPOT =
 * (E2E - TTFT) / (output_tokens - 1); E2E = send -> "data: [DONE]";
 * prompt/output tokens from the final `usage` chunk. A request fails on a
 * transport error, a non-200 status, an error event, a stream without
 * content or without [DONE]; its record keeps `error` and null timings.
 *
 * Prefix caching workloads (--dataset prefix, multiturn): every request
 * starts with one shared system prompt of --prefix-len tokens (words for
 * chat); multiturn runs --num-turns turns per conversation, each turn sent
 * once the conversation's previous one finished, its prompt the earlier
 * turns plus a new user message. Earlier assistant replies are fixed text
 * of --output-len words, not what the server answered, so every server (and
 * every mode of an A/B run) is sent the same prompts. The summary adds TTFT
 * per turn and the prompt tokens the server reported as cached.
 *
 * Percentiles: linear interpolation between closest ranks (numpy's default),
 * see bench_percentile; std is the population std (numpy's default ddof=0).
 */
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tools/bench/bench.h"
#include "tools/cli.h"

#define SV_MAX_PCTS 8
#define SV_MAX_ERRBODY 65536 /* bytes of a non-200 body kept for its message */

typedef struct sv_opts {
    const char *base_url, *endpoint, *model, *dataset, *save, *label, *api_key;
    int num_prompts, max_conc, input_len, output_len, warmups, ignore_eos, progress, chat;
    int prefix_len, turns; /* --prefix-len, --num-turns (prefix and multiturn datasets) */
    char *warm_body;       /* prefix / multiturn: a warm-up request that shares nothing with them */
    double rate, burstiness, range_ratio, timeout_s, connect_timeout_s;
    unsigned long long seed;
    double pcts[SV_MAX_PCTS]; /* --metric-percentiles, printed in the summary */
    int n_pcts;
} sv_opts;

typedef struct sv_req {
    char *body;           /* JSON request body */
    int input_len;        /* requested prompt length (tokens for random ids, words for chat, -1 for jsonl) */
    int output_len;       /* max_tokens */
    double arrival_s;     /* scheduled release, seconds after the run starts */
    int dep;              /* multiturn: the request that must finish first (the previous turn), -1 none */
    int turn;             /* multiturn: 0-based turn; 0 otherwise */
    /* results */
    double send_s, first_s, last_s, done_s; /* monotonic seconds; 0 = not yet */
    double *itl_ms;
    size_t n_itl, cap_itl;
    long prompt_tokens, output_tokens; /* -1 until the usage chunk */
    long cached_tokens;                /* usage.prompt_tokens_details.cached_tokens, -1 when absent */
    int done, status_checked;
    long http;
    char *error; /* NULL = success */
    /* stream state */
    char *line; /* partial SSE line carried across callbacks */
    size_t line_len, line_cap;
    char *ev; /* data lines of the event being read */
    size_t ev_len, ev_cap;
    int chat;
    char errbuf[CURL_ERROR_SIZE];
    CURL *easy;
} sv_req;

/* ---- small helpers ---- */

static double sv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* splitmix64: a fixed, seedable stream so the same --seed gives the same
 * prompts and the same arrival schedule in every mode of an A/B run. */
static uint64_t sv_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double sv_uniform(uint64_t *s) { /* (0, 1) */
    return ((double)(sv_rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static long sv_randint(uint64_t *s, long lo, long hi) { /* [lo, hi] */
    return lo + (long)(sv_rng_next(s) % (uint64_t)(hi - lo + 1));
}

static double sv_normal(uint64_t *s) {
    double u = sv_uniform(s), v = sv_uniform(s);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* Gamma(shape, 1) by Marsaglia-Tsang; shape < 1 through the boost
 * Gamma(a) = Gamma(a+1) * U^(1/a). Burstiness 1 is the exponential case. */
static double sv_gamma(uint64_t *s, double shape) {
    if (shape < 1.0) return sv_gamma(s, shape + 1.0) * pow(sv_uniform(s), 1.0 / shape);
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = sv_normal(s), v = 1.0 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        double u = sv_uniform(s);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v)) return d * v;
    }
}

static int sv_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

static void sv_fail(sv_req *r, const char *fmt, const char *arg) {
    if (r->error) return; /* keep the first cause */
    size_t n = strlen(fmt) + (arg ? strlen(arg) : 0) + 1;
    r->error = malloc(n);
    if (r->error) snprintf(r->error, n, fmt, arg ? arg : "");
}

/* ---- SSE ---- */

/* One complete event: its data lines joined by '\n'. */
static void sv_event(sv_req *r, double t) {
    if (r->ev_len == 0 || r->error) return;
    if (r->ev_len == 6 && !memcmp(r->ev, "[DONE]", 6)) {
        r->done = 1;
        r->done_s = t;
        return;
    }
    json_error_t je;
    json_t *o = json_loadb(r->ev, r->ev_len, 0, &je);
    if (!json_is_object(o)) {
        sv_fail(r, "malformed JSON in the stream: %s", je.text);
        json_decref(o);
        return;
    }
    json_t *err = json_object_get(o, "error");
    if (err) {
        const char *m = json_string_value(json_object_get(err, "message"));
        sv_fail(r, "error event in the stream: %s", m ? m : "(no message)");
        json_decref(o);
        return;
    }
    json_t *c0 = json_array_get(json_object_get(o, "choices"), 0);
    if (c0) {
        json_t *txt = r->chat ? json_object_get(json_object_get(c0, "delta"), "content") : json_object_get(c0, "text");
        if (json_is_string(txt) && json_string_length(txt) > 0) {
            if (r->first_s == 0) {
                r->first_s = t;
            } else if (!sv_grow((void **)&r->itl_ms, &r->cap_itl, r->n_itl + 1, sizeof(double))) {
                r->itl_ms[r->n_itl++] = (t - r->last_s) * 1e3;
            } else {
                sv_fail(r, "out of memory%s", NULL);
            }
            r->last_s = t;
        }
    }
    json_t *u = json_object_get(o, "usage");
    if (json_is_object(u)) {
        json_t *pt = json_object_get(u, "prompt_tokens"), *ct = json_object_get(u, "completion_tokens");
        if (json_is_integer(pt)) r->prompt_tokens = (long)json_integer_value(pt);
        if (json_is_integer(ct)) r->output_tokens = (long)json_integer_value(ct);
        json_t *ck = json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
        if (json_is_integer(ck)) r->cached_tokens = (long)json_integer_value(ck);
    }
    json_decref(o);
}

/* One line of the stream (without its terminator). Only `data:` matters
 * here; comments (':') and other fields are ignored as SSE says. */
static int sv_line(sv_req *r, const char *s, size_t n, double t) {
    if (n && s[n - 1] == '\r') n--;
    if (n == 0) {
        sv_event(r, t);
        r->ev_len = 0;
        return 0;
    }
    if (n < 5 || memcmp(s, "data:", 5)) return 0;
    s += 5, n -= 5;
    if (n && *s == ' ') s++, n--;
    size_t need = r->ev_len + (r->ev_len ? 1 : 0) + n + 1;
    if (sv_grow((void **)&r->ev, &r->ev_cap, need, 1)) return -1;
    if (r->ev_len) r->ev[r->ev_len++] = '\n';
    memcpy(r->ev + r->ev_len, s, n);
    r->ev_len += n;
    return 0;
}

static size_t sv_write(char *data, size_t size, size_t nmemb, void *user) {
    sv_req *r = user;
    size_t n = size * nmemb;
    double t = sv_now();
    if (!r->status_checked) {
        curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &r->http);
        r->status_checked = 1;
    }
    if (r->http != 200) { /* an error body: keep (the start of) it for its message */
        size_t keep = r->line_len + n > SV_MAX_ERRBODY ? SV_MAX_ERRBODY - r->line_len : n;
        if (sv_grow((void **)&r->line, &r->line_cap, r->line_len + keep + 1, 1)) return 0;
        memcpy(r->line + r->line_len, data, keep);
        r->line_len += keep;
        r->line[r->line_len] = 0;
        return n;
    }
    size_t i = 0;
    while (i < n) {
        char *nl = memchr(data + i, '\n', n - i);
        size_t seg = nl ? (size_t)(nl - (data + i)) : n - i;
        if (!nl) { /* no terminator yet: carry the piece to the next callback */
            if (sv_grow((void **)&r->line, &r->line_cap, r->line_len + seg + 1, 1)) goto oom;
            memcpy(r->line + r->line_len, data + i, seg);
            r->line_len += seg;
            break;
        }
        int rc;
        if (r->line_len) {
            if (sv_grow((void **)&r->line, &r->line_cap, r->line_len + seg + 1, 1)) goto oom;
            memcpy(r->line + r->line_len, data + i, seg);
            rc = sv_line(r, r->line, r->line_len + seg, t);
            r->line_len = 0;
        } else {
            rc = sv_line(r, data + i, seg, t);
        }
        if (rc) goto oom;
        i += seg + 1;
    }
    return n;
oom:
    sv_fail(r, "out of memory while reading the stream%s", NULL);
    return 0;
}

/* ---- requests ---- */

static void sv_req_reset(sv_req *r) {
    free(r->itl_ms);
    free(r->error);
    free(r->line);
    free(r->ev);
    char *body = r->body;
    int il = r->input_len, ol = r->output_len, chat = r->chat, dep = r->dep, turn = r->turn;
    double arr = r->arrival_s;
    memset(r, 0, sizeof *r);
    r->body = body, r->input_len = il, r->output_len = ol, r->chat = chat, r->arrival_s = arr;
    r->dep = dep, r->turn = turn;
    r->prompt_tokens = r->output_tokens = r->cached_tokens = -1;
}

static int sv_start(CURLM *m, sv_req *r, const sv_opts *o, const char *url, struct curl_slist *hdrs) {
    sv_req_reset(r);
    CURL *e = curl_easy_init();
    if (!e) return -1;
    r->easy = e;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sv_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_PRIVATE, r);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(o->connect_timeout_s * 1e3));
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(o->timeout_s * 1e3));
    r->send_s = sv_now();
    if (curl_multi_add_handle(m, e) != CURLM_OK) {
        curl_easy_cleanup(e);
        r->easy = NULL;
        return -1;
    }
    return 0;
}

static void sv_finish(sv_req *r, CURLcode rc, double t) {
    if (rc != CURLE_OK && !r->error) {
        char msg[CURL_ERROR_SIZE + 64];
        snprintf(msg, sizeof msg, "%s%s%s", curl_easy_strerror(rc), r->errbuf[0] ? ": " : "", r->errbuf);
        sv_fail(r, "%s", msg);
    }
    long http = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &http);
    if (!r->error && http != 200) {
        char msg[512];
        json_t *b = r->line ? json_loads(r->line, 0, NULL) : NULL;
        const char *m = json_string_value(json_object_get(json_object_get(b, "error"), "message"));
        snprintf(msg, sizeof msg, "HTTP %ld: %.400s", http, m ? m : (r->line ? r->line : "(empty body)"));
        json_decref(b);
        sv_fail(r, "%s", msg);
    }
    if (!r->error && r->first_s == 0) sv_fail(r, "no content token in the stream%s", NULL);
    if (!r->error && !r->done) sv_fail(r, "stream ended without data: [DONE]%s", NULL);
    if (!r->done_s) r->done_s = t;
    r->http = http;
}

/* Runs reqs[0..n-1], releasing each at its arrival_s (seconds after start)
 * with at most max_conc in flight (0 = no limit). Returns the wall time from
 * the start to the last completion, or -1 on a curl setup failure. */
static double sv_run(sv_req *reqs, int n, const sv_opts *o, int max_conc, int progress) {
    char url[2048];
    snprintf(url, sizeof url, "%s%s", o->base_url, o->endpoint);
    struct curl_slist *h = NULL, *h2;
    char auth[1024];
    /* "Expect:" off: curl would otherwise wait for 100-continue on bodies
     * over 1 KiB, which adds a round trip (or a 1 s stall) to TTFT. */
    const char *fixed[] = {"Content-Type: application/json", "Accept: text/event-stream", "Expect:"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) {
        if (!(h2 = curl_slist_append(h, fixed[i]))) goto nomem;
        h = h2;
    }
    if (o->api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o->api_key);
        if (!(h2 = curl_slist_append(h, auth))) goto nomem;
        h = h2;
    }
    CURLM *m = curl_multi_init();
    if (!m) goto nomem;
    double t0 = sv_now(), tend = t0, last_draw = 0;
    int next = 0, inflight = 0, finished = 0, failed = 0, last_decile = 0;
    int tty = isatty(STDERR_FILENO);
    while (finished < n) {
        double t = sv_now() - t0;
        /* in order; a later turn waits for its conversation's previous one */
        while (next < n && reqs[next].arrival_s <= t && (max_conc <= 0 || inflight < max_conc) &&
               (reqs[next].dep < 0 || reqs[reqs[next].dep].done_s > 0)) {
            if (sv_start(m, &reqs[next], o, url, h)) {
                sv_fail(&reqs[next], "could not start the transfer (curl)%s", NULL);
                reqs[next].send_s = reqs[next].done_s = sv_now();
                failed++, finished++;
            } else {
                inflight++;
            }
            next++;
        }
        int running = 0;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            char *priv = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
            sv_req *r = (sv_req *)priv;
            double tc = sv_now();
            sv_finish(r, msg->data.result, tc);
            curl_multi_remove_handle(m, msg->easy_handle);
            curl_easy_cleanup(msg->easy_handle);
            r->easy = NULL;
            inflight--, finished++;
            if (r->error) failed++;
            tend = tc;
        }
        if (progress) {
            double now = sv_now();
            int decile = finished * 10 / n;
            if (tty && (now - last_draw > 0.1 || finished == n)) {
                int w = 40, fill = finished * w / n;
                fprintf(stderr, "\r[%.*s%*s] %d/%d done, %d failed, %.1f s ", fill,
                        "########################################", w - fill, "", finished, n, failed, now - t0);
                last_draw = now;
            } else if (!tty && decile != last_decile) {
                fprintf(stderr, "echo-bench serve: %d/%d done, %d failed, %.1f s\n", finished, n, failed, now - t0);
                last_decile = decile;
            }
        }
        if (finished >= n) break;
        int wait_ms = 100;
        if (next < n && (max_conc <= 0 || inflight < max_conc) &&
            (reqs[next].dep < 0 || reqs[reqs[next].dep].done_s > 0)) {
            double dt = reqs[next].arrival_s - (sv_now() - t0);
            wait_ms = dt <= 0 ? 0 : dt >= 0.1 ? 100 : (int)(dt * 1e3) + 1;
        }
        if (wait_ms > 0) curl_multi_poll(m, NULL, 0, wait_ms, NULL);
    }
    if (progress && tty) fputc('\n', stderr);
    curl_multi_cleanup(m);
    curl_slist_free_all(h);
    return tend - t0;
nomem:
    curl_slist_free_all(h);
    return -1;
}

/* ---- datasets ---- */

/* Common one-token English words: chat prompts need text, and these keep
 * the token count close to the word count. */
static const char *const SV_WORDS[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "you",   "that",  "it",    "he",    "was",   "for",
    "on",    "are",   "as",    "with",  "his",   "they",  "at",    "be",    "this",  "have",  "from",  "or",
    "one",   "had",   "by",    "word",  "but",   "not",   "what",  "all",   "were",  "we",    "when",  "your",
    "can",   "said",  "there", "use",   "an",    "each",  "which", "she",   "do",    "how",   "their", "if",
    "will",  "up",    "other", "about", "out",   "many",  "then",  "them",  "these", "so",    "some",  "her",
    "would", "make",  "like",  "him",   "into",  "time",  "has",   "look",  "two",   "more",  "write", "go",
    "see",   "number", "no",   "way",   "could", "people", "my",   "than",  "first", "water", "been",  "call",
    "who",   "oil",   "its",   "now",   "find",  "long",  "down",  "day",   "did",   "get",   "come",  "made",
    "may",   "part",  "over",  "new",   "sound", "take",  "only",  "little", "work", "know",  "place", "year",
};

/* The fields every request body shares (greedy, streamed with usage), then
 * the body as text; takes b. */
static char *sv_body_end(const sv_opts *o, json_t *b, int max_tokens) {
    json_object_set_new(b, "max_tokens", json_integer(max_tokens));
    json_object_set_new(b, "temperature", json_real(0.0));
    json_object_set_new(b, "stream", json_true());
    json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    if (o->ignore_eos) json_object_set_new(b, "ignore_eos", json_true());
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static char *sv_body(const sv_opts *o, json_t *prompt, int max_tokens) {
    json_t *b = json_object();
    if (!b) {
        json_decref(prompt);
        return NULL;
    }
    if (o->model) json_object_set_new(b, "model", json_string(o->model));
    if (o->chat) {
        json_t *msg = json_pack("{s:s, s:o}", "role", "user", "content", prompt);
        json_object_set_new(b, "messages", json_pack("[o]", msg));
    } else {
        json_object_set_new(b, "prompt", prompt);
    }
    return sv_body_end(o, b, max_tokens);
}

/* n words (chat) or token ids (completions) drawn from rng, appended to a
 * growing text / id array. */
static int sv_words(uint64_t *rng, int n, char **text, size_t *len, size_t *cap) {
    for (int k = 0; k < n; k++) {
        const char *w = SV_WORDS[sv_rng_next(rng) % (sizeof SV_WORDS / sizeof *SV_WORDS)];
        if (sv_grow((void **)text, cap, *len + strlen(w) + 2, 1)) return -1;
        *len += (size_t)sprintf(*text + *len, "%s%s", *len ? " " : "", w);
    }
    return 0;
}

static int sv_ids(uint64_t *rng, int n, json_t *arr) {
    for (int k = 0; k < n; k++)
        if (json_array_append_new(arr, json_integer(sv_randint(rng, 1000, 99999)))) return -1;
    return 0;
}

static int sv_len(uint64_t *rng, int base, double ratio) {
    long lo = (long)(base * (1.0 - ratio)), hi = (long)(base * (1.0 + ratio));
    if (lo < 1) lo = 1;
    if (hi < lo) hi = lo;
    return (int)sv_randint(rng, lo, hi);
}

static int sv_random_dataset(const sv_opts *o, sv_req *reqs, char *err, size_t errlen) {
    uint64_t rng = o->seed * 0x2545f4914f6cdd1dULL + 1;
    for (int i = 0; i < o->num_prompts; i++) {
        int il = sv_len(&rng, o->input_len, o->range_ratio), ol = sv_len(&rng, o->output_len, o->range_ratio);
        json_t *p;
        if (o->chat) {
            size_t cap = (size_t)il * 8 + 1, len = 0;
            char *text = malloc(cap);
            if (!text) goto oom;
            for (int k = 0; k < il; k++) {
                const char *w = SV_WORDS[sv_rng_next(&rng) % (sizeof SV_WORDS / sizeof *SV_WORDS)];
                len += (size_t)snprintf(text + len, cap - len, "%s%s", k ? " " : "", w);
            }
            p = json_string(text);
            free(text);
        } else {
            /* ids from a range that is ordinary text in Qwen3's vocabulary
             * (no special or control tokens, which sit at the ends) */
            p = json_array();
            for (int k = 0; p && k < il; k++) json_array_append_new(p, json_integer(sv_randint(&rng, 1000, 99999)));
        }
        if (!p) goto oom;
        reqs[i].input_len = il;
        reqs[i].output_len = ol;
        if (!(reqs[i].body = sv_body(o, p, ol))) goto oom;
    }
    return 0;
oom:
    snprintf(err, errlen, "out of memory building %d prompts", o->num_prompts);
    return -1;
}

/* Body of a prefix / multiturn request: the shared system prompt, then
 * `turns` user messages with a fixed assistant reply between them. Each
 * user message and reply comes from its own seed, so a conversation's turn
 * k is the start of its turn k+1. */
static char *sv_conv_body(const sv_opts *o, const char *sys_text, json_t *sys_ids, unsigned long long conv, int turns,
                          int max_tokens) {
    json_t *msgs = o->chat ? json_array() : NULL, *ids = o->chat ? NULL : json_deep_copy(sys_ids);
    if (o->chat) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", sys_text));
    int ok = o->chat ? msgs != NULL : ids != NULL;
    for (int t = 0; ok && t < turns; t++) {
        for (int who = 0; ok && who < (t + 1 < turns ? 2 : 1); who++) { /* user, then the reply */
            uint64_t rng = (o->seed + 1) * 0x2545f4914f6cdd1dULL ^ (conv * 1000003ULL + (uint64_t)t * 2 + who + 1);
            int n = who ? o->output_len : o->input_len;
            if (o->chat) {
                char *text = NULL;
                size_t len = 0, cap = 0;
                ok = !sv_words(&rng, n, &text, &len, &cap) &&
                     !json_array_append_new(
                         msgs, json_pack("{s:s,s:s}", "role", who ? "assistant" : "user", "content", text ? text : ""));
                free(text);
            } else {
                ok = !sv_ids(&rng, n, ids);
            }
        }
    }
    if (!ok) {
        json_decref(msgs);
        json_decref(ids);
        return NULL;
    }
    if (!o->chat) return sv_body(o, ids, max_tokens);
    json_t *b = json_object();
    if (!b) {
        json_decref(msgs);
        return NULL;
    }
    if (o->model) json_object_set_new(b, "model", json_string(o->model));
    json_object_set_new(b, "messages", msgs);
    return sv_body_end(o, b, max_tokens);
}

/* prefix: num_prompts requests, each the system prompt plus its own user
 * message (one turn). multiturn: num_prompts / turns conversations, the
 * requests ordered turn by turn (every conversation's turn 1, then turn
 * 2, ...), each turn depending on its conversation's previous one. */
static int sv_prefix_dataset(sv_opts *o, sv_req *reqs, char *err, size_t errlen) {
    int turns = strcmp(o->dataset, "multiturn") ? 1 : o->turns, convs = o->num_prompts / turns;
    if (convs * turns != o->num_prompts) {
        snprintf(err, errlen, "--dataset multiturn: --num-prompts %d is not a multiple of --num-turns %d",
                 o->num_prompts, turns);
        return -1;
    }
    uint64_t rng = o->seed * 0x9e3779b97f4a7c15ULL + 3;
    char *sys = NULL, *wtext = NULL;
    size_t len = 0, cap = 0, wl = 0, wc = 0;
    json_t *sys_ids = json_array(), *wids = json_array();
    if (!sys_ids || !wids ||
        (o->chat ? sv_words(&rng, o->prefix_len, &sys, &len, &cap) : sv_ids(&rng, o->prefix_len, sys_ids)))
        goto oom;
    for (int t = 0; t < turns; t++) {
        for (int c = 0; c < convs; c++) {
            sv_req *r = &reqs[t * convs + c];
            r->turn = t;
            r->dep = t ? (t - 1) * convs + c : -1;
            r->input_len = -1;
            r->output_len = o->output_len;
            if (!(r->body = sv_conv_body(o, sys ? sys : "", sys_ids, (unsigned long long)c, t + 1, o->output_len)))
                goto oom;
        }
    }
    /* the warm-up: a short conversation of another seed's words */
    sv_opts w = *o;
    w.seed = o->seed + 0x5bd1e995;
    uint64_t wr = w.seed;
    if (o->chat ? sv_words(&wr, 16, &wtext, &wl, &wc) : sv_ids(&wr, 16, wids)) goto oom;
    if (!(o->warm_body = sv_conv_body(&w, wtext ? wtext : "", wids, 0, 1, o->output_len))) goto oom;
    free(sys);
    free(wtext);
    json_decref(sys_ids);
    json_decref(wids);
    return 0;
oom:
    free(sys);
    free(wtext);
    json_decref(sys_ids);
    json_decref(wids);
    snprintf(err, errlen, "out of memory building %d prompts", o->num_prompts);
    return -1;
}

/* jsonl: one object per line, {"prompt": "text" | [token ids], "output_len": M};
 * output_len is optional (default --output-len). Lines are used in order
 * and cycled when --num-prompts exceeds them. */
static int sv_jsonl_dataset(const sv_opts *o, const char *path, sv_req *reqs, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot open dataset '%s': %s", path, strerror(errno));
        return -1;
    }
    json_t **items = NULL;
    size_t n = 0, cap = 0, lineno = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    int status = -1;
    while ((got = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        size_t k = 0;
        while (k < (size_t)got && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r' || line[k] == '\n')) k++;
        if (k == (size_t)got) continue;
        json_error_t je;
        json_t *obj = json_loadb(line, (size_t)got, 0, &je);
        json_t *p = json_object_get(obj, "prompt"), *ol = json_object_get(obj, "output_len");
        int ok = json_is_object(obj) && (json_is_string(p) || (json_is_array(p) && !o->chat && json_array_size(p) > 0)) &&
                 (!ol || (json_is_integer(ol) && json_integer_value(ol) >= 1 && json_integer_value(ol) <= 1000000));
        if (!ok) {
            snprintf(err, errlen,
                     "%s:%zu: expected {\"prompt\": \"text\"%s, \"output_len\": N (optional, >= 1)}%s%s", path,
                     lineno, o->chat ? "" : " or [token ids]", obj ? "" : ": ", obj ? "" : je.text);
            json_decref(obj);
            goto out;
        }
        if (sv_grow((void **)&items, &cap, n + 1, sizeof *items)) {
            json_decref(obj);
            snprintf(err, errlen, "out of memory reading '%s'", path);
            goto out;
        }
        items[n++] = obj;
    }
    if (n == 0) {
        snprintf(err, errlen, "dataset '%s' has no prompts", path);
        goto out;
    }
    for (int i = 0; i < o->num_prompts; i++) {
        json_t *obj = items[(size_t)i % n], *ol = json_object_get(obj, "output_len");
        json_t *p = json_object_get(obj, "prompt");
        reqs[i].input_len = json_is_array(p) ? (int)json_array_size(p) : -1;
        reqs[i].output_len = ol ? (int)json_integer_value(ol) : o->output_len;
        if (!(reqs[i].body = sv_body(o, json_deep_copy(p), reqs[i].output_len))) {
            snprintf(err, errlen, "out of memory building prompts");
            goto out;
        }
    }
    status = 0;
out:
    for (size_t i = 0; i < n; i++) json_decref(items[i]);
    free(items);
    free(line);
    fclose(f);
    return status;
}

/* ---- summary ---- */

typedef struct sv_stat {
    double mean, std, median, pct[SV_MAX_PCTS], p90, p95, p99, min, max;
    size_t n;
} sv_stat;

static int sv_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void sv_stats(double *v, size_t n, const sv_opts *o, sv_stat *s) {
    memset(s, 0, sizeof *s);
    s->n = n;
    if (!n) return;
    qsort(v, n, sizeof *v, sv_cmp);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    s->mean = sum / (double)n;
    for (size_t i = 0; i < n; i++) sq += (v[i] - s->mean) * (v[i] - s->mean);
    s->std = sqrt(sq / (double)n);
    s->median = bench_percentile(v, n, 50);
    s->p90 = bench_percentile(v, n, 90);
    s->p95 = bench_percentile(v, n, 95);
    s->p99 = bench_percentile(v, n, 99);
    for (int i = 0; i < o->n_pcts; i++) s->pct[i] = bench_percentile(v, n, o->pcts[i]);
    s->min = v[0];
    s->max = v[n - 1];
}

static void sv_pct_name(char *buf, size_t len, double p) {
    if (p == floor(p)) snprintf(buf, len, "p%d", (int)p);
    else snprintf(buf, len, "p%g", p);
}

static void sv_stat_json(json_t *sum, const char *name, const sv_stat *s, const sv_opts *o) {
    char key[64], pn[32];
#define SV_PUT(field, val)                                                                                         \
    do {                                                                                                           \
        snprintf(key, sizeof key, "%s_%s_ms", field, name);                                                        \
        json_object_set_new(sum, key, s->n ? json_real(val) : json_null());                                        \
    } while (0)
    SV_PUT("mean", s->mean);
    SV_PUT("median", s->median);
    SV_PUT("std", s->std);
    SV_PUT("min", s->min);
    SV_PUT("max", s->max);
    SV_PUT("p90", s->p90);
    SV_PUT("p95", s->p95);
    SV_PUT("p99", s->p99);
    for (int i = 0; i < o->n_pcts; i++) {
        sv_pct_name(pn, sizeof pn, o->pcts[i]);
        SV_PUT(pn, s->pct[i]);
    }
#undef SV_PUT
}

static void sv_print_section(const char *title, const char *abbr, const sv_stat *s, const sv_opts *o) {
    int pad = 50 - (int)strlen(title), l = pad / 2, r = pad - l;
    printf("%.*s%s%.*s\n", l, "--------------------------------------------------", title, r,
           "--------------------------------------------------");
    char k[64], pn[32];
    if (!s->n) {
        snprintf(k, sizeof k, "Mean %s (ms):", abbr);
        printf("%-40s %-10s\n", k, "n/a");
        return;
    }
    snprintf(k, sizeof k, "Mean %s (ms):", abbr);
    printf("%-40s %-10.2f\n", k, s->mean);
    snprintf(k, sizeof k, "Median %s (ms):", abbr);
    printf("%-40s %-10.2f\n", k, s->median);
    for (int i = 0; i < o->n_pcts; i++) {
        sv_pct_name(pn, sizeof pn, o->pcts[i]);
        pn[0] = 'P';
        snprintf(k, sizeof k, "%s %s (ms):", pn, abbr);
        printf("%-40s %-10.2f\n", k, s->pct[i]);
    }
}

static json_t *sv_ms_or_null(double ms, int ok) { return ok ? json_real(ms) : json_null(); }

/* Multiturn: the TTFT of each turn over the conversations, printed and
 * as a JSON array; ttft is scratch for num_prompts values. */
static json_t *sv_by_turn(const sv_opts *o, const sv_req *reqs, int nturns, double *ttft) {
    int n = o->num_prompts;
    printf("%s\n", "--------------TTFT by turn (ms)-----------------");
    json_t *by_turn = json_array();
    for (int t = 0; by_turn && t < nturns; t++) {
        int m = 0;
        long ck = 0;
        for (int i = 0; i < n; i++) {
            if (reqs[i].error || reqs[i].turn != t) continue;
            ttft[m++] = (reqs[i].first_s - reqs[i].send_s) * 1e3;
            ck += reqs[i].cached_tokens > 0 ? reqs[i].cached_tokens : 0;
        }
        sv_stat st;
        sv_stats(ttft, (size_t)m, o, &st);
        char name[64];
        snprintf(name, sizeof name, "Turn %d mean / median:", t + 1);
        printf("%-40s %.2f / %.2f (%d ok, %ld cached tokens)\n", name, st.mean, st.median, m, ck);
        json_array_append_new(by_turn,
                              json_pack("{s:i,s:i,s:f,s:f,s:I}", "turn", t + 1, "completed", m, "mean_ttft_ms", st.mean,
                                        "median_ttft_ms", st.median, "cached_tokens", (json_int_t)ck));
    }
    return by_turn;
}

/* Request i's record of the result file (t0: the first request's send). */
static json_t *sv_request_json(const sv_req *r, int i, double t0) {
    int good = !r->error;
    json_t *rec = json_object(), *itla = good ? json_array() : json_null();
    for (size_t k = 0; good && k < r->n_itl; k++) json_array_append_new(itla, json_real(r->itl_ms[k]));
    json_object_set_new(rec, "index", json_integer(i));
    json_object_set_new(rec, "start_ms", json_real((r->send_s - t0) * 1e3));
    json_object_set_new(rec, "ttft_ms", sv_ms_or_null((r->first_s - r->send_s) * 1e3, good));
    json_object_set_new(rec, "itl_ms", itla);
    json_object_set_new(rec, "tpot_ms",
                        sv_ms_or_null((r->done_s - r->first_s) * 1e3 / (double)(r->output_tokens - 1),
                                      good && r->output_tokens > 1));
    json_object_set_new(rec, "e2e_ms", sv_ms_or_null((r->done_s - r->send_s) * 1e3, good));
    json_object_set_new(rec, "prompt_tokens", r->prompt_tokens >= 0 ? json_integer(r->prompt_tokens) : json_null());
    json_object_set_new(rec, "output_tokens", r->output_tokens >= 0 ? json_integer(r->output_tokens) : json_null());
    json_object_set_new(rec, "input_len", r->input_len >= 0 ? json_integer(r->input_len) : json_null());
    json_object_set_new(rec, "cached_tokens", r->cached_tokens >= 0 ? json_integer(r->cached_tokens) : json_null());
    json_object_set_new(rec, "turn", json_integer(r->turn + 1));
    json_object_set_new(rec, "max_tokens", json_integer(r->output_len));
    json_object_set_new(rec, "error", r->error ? json_string(r->error) : json_null());
    return rec;
}

/* Prints vLLM's block and writes the JSON; returns the number of successes,
 * or -1 when the result file cannot be written. */
static int sv_report(const sv_opts *o, sv_req *reqs, double duration, char *err, size_t errlen) {
    int n = o->num_prompts, ok = 0, nturns = 1;
    long tin = 0, tout = 0, tcached = 0;
    int with_cached = 0;
    json_t *by_turn = NULL;
    double *ttft = calloc((size_t)n + 1, sizeof *ttft), *tpot = calloc((size_t)n + 1, sizeof *tpot),
           *e2e = calloc((size_t)n + 1, sizeof *e2e), *itl = NULL;
    size_t nitl = 0, ntpot = 0, capitl = 0;
    int status = -1;
    json_t *sum = json_object();
    if (!ttft || !tpot || !e2e || !sum) {
        snprintf(err, errlen, "out of memory for the summary");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        sv_req *r = &reqs[i];
        if (r->error) continue;
        ttft[ok] = (r->first_s - r->send_s) * 1e3;
        e2e[ok] = (r->done_s - r->send_s) * 1e3;
        ok++;
        if (r->prompt_tokens > 0) tin += r->prompt_tokens;
        if (r->output_tokens > 0) tout += r->output_tokens;
        if (r->cached_tokens >= 0) tcached += r->cached_tokens, with_cached = 1;
        if (r->turn + 1 > nturns) nturns = r->turn + 1;
        if (r->output_tokens > 1)
            tpot[ntpot++] = ((r->done_s - r->send_s) - (r->first_s - r->send_s)) * 1e3 / (double)(r->output_tokens - 1);
        if (sv_grow((void **)&itl, &capitl, nitl + r->n_itl + 1, sizeof *itl)) {
            snprintf(err, errlen, "out of memory for the summary");
            goto out;
        }
        memcpy(itl + nitl, r->itl_ms, r->n_itl * sizeof *itl);
        nitl += r->n_itl;
    }
    sv_stat st_ttft, st_tpot, st_itl, st_e2e;
    sv_stats(ttft, (size_t)ok, o, &st_ttft);
    sv_stats(tpot, ntpot, o, &st_tpot);
    sv_stats(itl, nitl, o, &st_itl);
    sv_stats(e2e, (size_t)ok, o, &st_e2e);
    double dur = duration > 0 ? duration : 1e-9;

    printf("%s\n", "=========== Serving Benchmark Result ============");
    printf("%-40s %-10d\n", "Successful requests:", ok);
    printf("%-40s %-10d\n", "Failed requests:", n - ok);
    if (o->max_conc > 0) printf("%-40s %-10d\n", "Maximum request concurrency:", o->max_conc);
    printf("%-40s %-10.2f\n", "Benchmark duration (s):", duration);
    printf("%-40s %-10ld\n", "Total input tokens:", tin);
    printf("%-40s %-10ld\n", "Total generated tokens:", tout);
    printf("%-40s %-10.2f\n", "Request throughput (req/s):", ok / dur);
    printf("%-40s %-10.2f\n", "Output token throughput (tok/s):", (double)tout / dur);
    printf("%-40s %-10.2f\n", "Total Token throughput (tok/s):", (double)(tin + tout) / dur);
    if (with_cached) printf("%-40s %-10ld\n", "Total cached prompt tokens:", tcached);
    sv_print_section("Time to First Token", "TTFT", &st_ttft, o);
    sv_print_section("Time per Output Token (excl. 1st token)", "TPOT", &st_tpot, o);
    sv_print_section("Inter-token Latency", "ITL", &st_itl, o);
    sv_print_section("End-to-end Latency", "E2EL", &st_e2e, o);
    /* multiturn: TTFT of each turn over the conversations (ttft[] is reused) */
    if (nturns > 1) by_turn = sv_by_turn(o, reqs, nturns, ttft);
    printf("%s\n", "==================================================");
    fflush(stdout);

    if (!o->save) {
        status = ok;
        goto out;
    }
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
    json_object_set_new(sum, "label", o->label ? json_string(o->label) : json_null());
    json_object_set_new(sum, "date", json_string(date));
    json_object_set_new(sum, "backend", json_string("openai"));
    json_object_set_new(sum, "base_url", json_string(o->base_url));
    json_object_set_new(sum, "endpoint", json_string(o->endpoint));
    json_object_set_new(sum, "model", o->model ? json_string(o->model) : json_null());
    json_object_set_new(sum, "dataset", json_string(o->dataset));
    json_object_set_new(sum, "num_prompts", json_integer(n));
    json_object_set_new(sum, "request_rate", isinf(o->rate) ? json_string("inf") : json_real(o->rate));
    json_object_set_new(sum, "burstiness", json_real(o->burstiness));
    json_object_set_new(sum, "max_concurrency", o->max_conc > 0 ? json_integer(o->max_conc) : json_null());
    json_object_set_new(sum, "input_len", json_integer(o->input_len));
    json_object_set_new(sum, "output_len", json_integer(o->output_len));
    json_object_set_new(sum, "range_ratio", json_real(o->range_ratio));
    json_object_set_new(sum, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(sum, "ignore_eos", json_boolean(o->ignore_eos));
    json_object_set_new(sum, "num_warmups", json_integer(o->warmups));
    json_object_set_new(sum, "duration", json_real(duration));
    json_object_set_new(sum, "completed", json_integer(ok));
    json_object_set_new(sum, "failed", json_integer(n - ok));
    json_object_set_new(sum, "total_input_tokens", json_integer(tin));
    json_object_set_new(sum, "total_output_tokens", json_integer(tout));
    json_object_set_new(sum, "total_cached_tokens", with_cached ? json_integer(tcached) : json_null());
    json_object_set_new(sum, "prefix_len", json_integer(o->prefix_len));
    json_object_set_new(sum, "num_turns", json_integer(nturns));
    json_object_set_new(sum, "ttft_by_turn", by_turn ? by_turn : json_null());
    by_turn = NULL;
    json_object_set_new(sum, "request_throughput", json_real(ok / dur));
    json_object_set_new(sum, "output_throughput", json_real((double)tout / dur));
    json_object_set_new(sum, "total_token_throughput", json_real((double)(tin + tout) / dur));
    json_object_set_new(sum, "percentile_method",
                        json_string("linear interpolation between closest ranks (numpy.percentile default): "
                                    "pos=(n-1)*p/100, x[floor(pos)] + (x[floor(pos)+1]-x[floor(pos)])*frac(pos); "
                                    "std is the population std; ttft/e2el/tpot over successful requests "
                                    "(tpot: output_tokens > 1), itl pooled over all their gaps"));
    sv_stat_json(sum, "ttft", &st_ttft, o);
    sv_stat_json(sum, "tpot", &st_tpot, o);
    sv_stat_json(sum, "itl", &st_itl, o);
    sv_stat_json(sum, "e2el", &st_e2e, o);

    FILE *f = fopen(o->save, "w");
    if (!f) {
        snprintf(err, errlen, "cannot write '%s': %s", o->save, strerror(errno));
        goto out;
    }
    char *s = json_dumps(sum, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    fprintf(f, "{\"summary\": %s,\n\"requests\": [\n", s ? s : "null");
    free(s);
    int wfail = 0;
    for (int i = 0; i < n; i++) {
        const sv_req *r = &reqs[i];
        json_t *rec = sv_request_json(r, i, reqs[0].send_s);
        char *rs = json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(rec);
        if (!rs) {
            wfail = 1;
            break;
        }
        fprintf(f, " %s%s\n", rs, i + 1 < n ? "," : "");
        free(rs);
    }
    fprintf(f, "]}\n");
    if (fclose(f) || wfail) {
        snprintf(err, errlen, "error writing '%s'", o->save);
        goto out;
    }
    status = ok;
out:
    json_decref(by_turn);
    json_decref(sum);
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
    return status;
}

/* ---- command line ---- */

static const char *SV_USAGE =
    "usage: echo-bench serve [--base-url http://127.0.0.1:8000] [--endpoint /v1/completions|/v1/chat/completions]\n"
    "                        [--num-prompts N] [--request-rate R|inf] [--burstiness B] [--max-concurrency C]\n"
    "                        [--dataset random|prefix|multiturn|jsonl:FILE] [--input-len L] [--output-len M]\n"
    "                        [--range-ratio X] [--prefix-len P] [--num-turns T]\n"
    "                        [--seed S] [--ignore-eos] [--save-result FILE.json] [--label NAME]\n"
    "\n"
    "Load generator for an OpenAI-compatible server (vllm bench serve's flags and summary).\n"
    "\n"
    "  --base-url URL            server (default http://127.0.0.1:8000)\n"
    "  --endpoint PATH           /v1/completions (default) or /v1/chat/completions\n"
    "  --model NAME              \"model\" field of every request (default: none, the server's own)\n"
    "  --num-prompts N           requests measured (default 100)\n"
    "  --request-rate R|inf      mean arrivals per second, Poisson (default inf: all at once)\n"
    "  --burstiness B            gamma shape of the inter-arrival times; 1 = Poisson, < 1 burstier (default 1)\n"
    "  --max-concurrency C       at most C requests in flight (default: no limit)\n"
    "  --dataset random|prefix|multiturn|jsonl:FILE   random: token ids 1000..99999 for completions,\n"
    "                            words for chat; jsonl: one {\"prompt\": \"text\" or [ids], \"output_len\": M}\n"
    "                            per line; prefix: every request a shared system prompt of P tokens (words\n"
    "                            for chat) plus its own L; multiturn: N/T conversations of T turns sharing\n"
    "                            that system prompt, each turn its earlier turns (fixed M-word replies)\n"
    "                            plus L new, sent when the previous turn finished; TTFT per turn\n"
    "  --prefix-len P            prefix, multiturn: shared system prompt length (default 1000)\n"
    "  --num-turns T             multiturn: turns per conversation (default 4)\n"
    "  --input-len L             random: prompt tokens (default 128)\n"
    "  --output-len M            max_tokens (default 128; jsonl lines may override)\n"
    "  --range-ratio X           random: lengths uniform in [L*(1-X), L*(1+X)] (default 0)\n"
    "  --seed S                  prompts and arrival times (default 0)\n"
    "  --ignore-eos              send ignore_eos: true (exactly M tokens per request)\n"
    "  --num-warmups W           sequential warm-up requests before measuring (default 1)\n"
    "  --metric-percentiles P,.. percentiles printed (default 99; the JSON always has 50/90/95/99)\n"
    "  --save-result FILE.json   {\"summary\": {...}, \"requests\": [per-request records]}\n"
    "  --label NAME              name of this run in the JSON and in plots\n"
    "  --api-key KEY             Authorization: Bearer KEY (also $OPENAI_API_KEY)\n"
    "  --request-timeout S       per-request limit (default 600)\n"
    "  --connect-timeout S       TCP connect limit (default 10)\n"
    "  --no-progress             no progress bar on stderr\n"
    "\n"
    "Exit status: 0 when at least one request succeeded, 1 when none did (or on a\n"
    "runtime error), 2 on a usage error.\n";

static int sv_usage_error(const char *fmt, const char *a) { return bench_usage_error("serve", fmt, a); }

enum {
    O_BASE = 1000,
    O_ENDPOINT,
    O_MODEL,
    O_NUM,
    O_RATE,
    O_BURST,
    O_CONC,
    O_DATASET,
    O_IN,
    O_OUT,
    O_RATIO,
    O_SEED,
    O_IGNORE_EOS,
    O_SAVE,
    O_LABEL,
    O_KEY,
    O_TIMEOUT,
    O_CTIMEOUT,
    O_NOPROG,
    O_WARM,
    O_PCTS,
    O_HELP,
    O_PREFIX,
    O_TURNS
};

static int sv_parse(int argc, char **argv, sv_opts *o) {
    static const struct option lo[] = {
        {"base-url", required_argument, 0, O_BASE},
        {"endpoint", required_argument, 0, O_ENDPOINT},
        {"model", required_argument, 0, O_MODEL},
        {"num-prompts", required_argument, 0, O_NUM},
        {"request-rate", required_argument, 0, O_RATE},
        {"burstiness", required_argument, 0, O_BURST},
        {"max-concurrency", required_argument, 0, O_CONC},
        {"dataset", required_argument, 0, O_DATASET},
        {"dataset-name", required_argument, 0, O_DATASET},
        {"input-len", required_argument, 0, O_IN},
        {"random-input-len", required_argument, 0, O_IN},
        {"output-len", required_argument, 0, O_OUT},
        {"random-output-len", required_argument, 0, O_OUT},
        {"range-ratio", required_argument, 0, O_RATIO},
        {"random-range-ratio", required_argument, 0, O_RATIO},
        {"seed", required_argument, 0, O_SEED},
        {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"save-result", required_argument, 0, O_SAVE},
        {"label", required_argument, 0, O_LABEL},
        {"api-key", required_argument, 0, O_KEY},
        {"request-timeout", required_argument, 0, O_TIMEOUT},
        {"connect-timeout", required_argument, 0, O_CTIMEOUT},
        {"no-progress", no_argument, 0, O_NOPROG},
        {"num-warmups", required_argument, 0, O_WARM},
        {"metric-percentiles", required_argument, 0, O_PCTS},
        {"help", no_argument, 0, O_HELP},
        {"prefix-len", required_argument, 0, O_PREFIX},
        {"num-turns", required_argument, 0, O_TURNS},
        {0, 0, 0, 0},
    };
    char **av = argv; /* argv[0] is the subcommand name */
    int ac = argc, c, rc = 0;
    long v;
    bench_getopt_reset();
    while (!rc && (c = getopt_long(ac, av, ":h", lo, NULL)) != -1) {
        const char *a = optarg;
        switch (c) {
        case O_BASE: {
            size_t n = strlen(a);
            if (strncmp(a, "http://", 7) && strncmp(a, "https://", 8))
                rc = sv_usage_error("--base-url: expected http://HOST:PORT, got '%s'", a);
            while (n > 0 && a[n - 1] == '/') n--; /* "http://h:8000/" + "/v1/..." */
            ((char *)a)[n] = 0;
            o->base_url = a;
            break;
        }
        case O_ENDPOINT:
            if (!strcmp(a, "/v1/completions")) o->chat = 0;
            else if (!strcmp(a, "/v1/chat/completions")) o->chat = 1;
            else rc = sv_usage_error("--endpoint: expected /v1/completions or /v1/chat/completions, got '%s'", a);
            o->endpoint = a;
            break;
        case O_MODEL: o->model = a; break;
        case O_NUM:
            if (cli_parse_long(a, 1, 10000000, &v)) rc = sv_usage_error("--num-prompts: expected 1..10000000, got '%s'", a);
            o->num_prompts = (int)v;
            break;
        case O_RATE:
            if (!strcmp(a, "inf")) o->rate = INFINITY;
            else if (cli_parse_double(a, 1e-9, 1e9, &o->rate))
                rc = sv_usage_error("--request-rate: expected a positive number or 'inf', got '%s'", a);
            break;
        case O_BURST:
            if (cli_parse_double(a, 1e-3, 1e6, &o->burstiness))
                rc = sv_usage_error("--burstiness: expected a positive number, got '%s'", a);
            break;
        case O_CONC:
            if (cli_parse_long(a, 1, 1000000, &v)) rc = sv_usage_error("--max-concurrency: expected >= 1, got '%s'", a);
            o->max_conc = (int)v;
            break;
        case O_DATASET:
            if (strcmp(a, "random") && strcmp(a, "prefix") && strcmp(a, "multiturn") &&
                (strncmp(a, "jsonl:", 6) || !a[6]))
                rc = sv_usage_error("--dataset: expected random, prefix, multiturn or jsonl:FILE, got '%s'", a);
            o->dataset = a;
            break;
        case O_IN:
            if (cli_parse_long(a, 1, 10000000, &v)) rc = sv_usage_error("--input-len: expected >= 1, got '%s'", a);
            o->input_len = (int)v;
            break;
        case O_PREFIX:
            if (cli_parse_long(a, 1, 10000000, &v)) rc = sv_usage_error("--prefix-len: expected >= 1, got '%s'", a);
            o->prefix_len = (int)v;
            break;
        case O_TURNS:
            if (cli_parse_long(a, 1, 1000, &v)) rc = sv_usage_error("--num-turns: expected 1..1000, got '%s'", a);
            o->turns = (int)v;
            break;
        case O_OUT:
            if (cli_parse_long(a, 1, 10000000, &v)) rc = sv_usage_error("--output-len: expected >= 1, got '%s'", a);
            o->output_len = (int)v;
            break;
        case O_RATIO:
            if (cli_parse_double(a, 0, 1, &o->range_ratio)) rc = sv_usage_error("--range-ratio: expected 0..1, got '%s'", a);
            break;
        case O_SEED:
            if (cli_parse_long(a, 0, 0x7fffffffL, &v)) rc = sv_usage_error("--seed: expected 0..2147483647, got '%s'", a);
            o->seed = (unsigned long long)v;
            break;
        case O_IGNORE_EOS: o->ignore_eos = 1; break;
        case O_SAVE: o->save = a; break;
        case O_LABEL: o->label = a; break;
        case O_KEY: o->api_key = a; break;
        case O_TIMEOUT:
            if (cli_parse_double(a, 0.001, 1e6, &o->timeout_s)) rc = sv_usage_error("--request-timeout: expected seconds > 0, got '%s'", a);
            break;
        case O_CTIMEOUT:
            if (cli_parse_double(a, 0.001, 1e6, &o->connect_timeout_s)) rc = sv_usage_error("--connect-timeout: expected seconds > 0, got '%s'", a);
            break;
        case O_NOPROG: o->progress = 0; break;
        case O_WARM:
            if (cli_parse_long(a, 0, 1000, &v)) rc = sv_usage_error("--num-warmups: expected 0..1000, got '%s'", a);
            o->warmups = (int)v;
            break;
        case O_PCTS: {
            char tmp[256];
            snprintf(tmp, sizeof tmp, "%s", a);
            o->n_pcts = 0;
            for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
                if (o->n_pcts == SV_MAX_PCTS || cli_parse_double(t, 0, 100, &o->pcts[o->n_pcts]))
                    rc = sv_usage_error("--metric-percentiles: expected up to 8 comma-separated values in 0..100, got '%s'", a);
                o->n_pcts++;
            }
            if (!o->n_pcts && !rc) rc = sv_usage_error("--metric-percentiles: empty list '%s'", a);
            break;
        }
        case 'h':
        case O_HELP:
            fputs(SV_USAGE, stdout);
            rc = -1;
            break;
        default: rc = bench_getopt_error("serve", c, av); break;
        }
    }
    if (!rc && optind < ac) rc = sv_usage_error("unexpected argument '%s'", av[optind]);
    return rc;
}

int bench_serve_main(int argc, char **argv) {
    sv_opts o = {
        .base_url = "http://127.0.0.1:8000",
        .endpoint = "/v1/completions",
        .dataset = "random",
        .num_prompts = 100,
        .input_len = 128,
        .output_len = 128,
        .warmups = 1,
        .progress = 1,
        .rate = INFINITY,
        .burstiness = 1.0,
        .timeout_s = 600,
        .connect_timeout_s = 10,
        .pcts = {99},
        .n_pcts = 1,
        .prefix_len = 1000,
        .turns = 4,
    };
    o.api_key = getenv("OPENAI_API_KEY");
    int rc = sv_parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "echo-bench serve: curl_global_init failed\n");
        return 1;
    }
    int status = 1, n = o.num_prompts;
    char err[1024] = "";
    sv_req *reqs = calloc((size_t)n, sizeof *reqs), warm = {0};
    if (!reqs) {
        fprintf(stderr, "echo-bench serve: out of memory for %d requests\n", n);
        goto out;
    }
    for (int i = 0; i < n; i++)
        reqs[i].chat = o.chat, reqs[i].dep = -1;
    int ds = !strcmp(o.dataset, "random")       ? sv_random_dataset(&o, reqs, err, sizeof err)
             : !strncmp(o.dataset, "jsonl:", 6) ? sv_jsonl_dataset(&o, o.dataset + 6, reqs, err, sizeof err)
                                                : sv_prefix_dataset(&o, reqs, err, sizeof err);
    if (ds) {
        fprintf(stderr, "echo-bench serve: %s\n", err);
        goto out;
    }
    /* The schedule is drawn after the prompts from its own stream, so
     * changing the rate never changes the prompts of a seed. */
    uint64_t rng = o.seed * 0x9e3779b97f4a7c15ULL + 7;
    double t = 0;
    for (int i = 0; i < n; i++) {
        reqs[i].arrival_s = t;
        if (!isinf(o.rate)) t += sv_gamma(&rng, o.burstiness) / (o.rate * o.burstiness);
    }

    char rate[32] = "inf", conc[32] = "none";
    if (!isinf(o.rate)) snprintf(rate, sizeof rate, "%g/s", o.rate);
    if (o.max_conc) snprintf(conc, sizeof conc, "%d", o.max_conc);
    fprintf(stderr, "echo-bench serve: %s%s, %d prompts, request rate %s, burstiness %g, max concurrency %s\n",
            o.base_url, o.endpoint, n, rate, o.burstiness, conc);
    for (int w = 0; w < o.warmups; w++) {
        warm.body = o.warm_body ? o.warm_body : reqs[0].body; /* a shared-prefix run's warm-up shares nothing */
        warm.dep = -1;
        warm.chat = o.chat;
        warm.output_len = reqs[0].output_len;
        if (sv_run(&warm, 1, &o, 1, 0) < 0) {
            fprintf(stderr, "echo-bench serve: curl setup failed\n");
            goto out;
        }
        if (warm.error) {
            /* carry on: every measured request will then record its own error */
            fprintf(stderr, "echo-bench serve: warm-up request to %s%s failed: %s\n", o.base_url, o.endpoint,
                    warm.error);
            break;
        }
    }
    double duration = sv_run(reqs, n, &o, o.max_conc, o.progress);
    if (duration < 0) {
        fprintf(stderr, "echo-bench serve: curl setup failed\n");
        goto out;
    }
    int ok = sv_report(&o, reqs, duration, err, sizeof err);
    if (ok < 0) {
        fprintf(stderr, "echo-bench serve: %s\n", err);
        goto out;
    }
    if (ok == 0) {
        const char *first = NULL;
        for (int i = 0; i < n && !first; i++) first = reqs[i].error;
        fprintf(stderr, "echo-bench serve: all %d requests failed (first error: %s)\n", n, first ? first : "?");
    } else if (ok < n) {
        fprintf(stderr, "echo-bench serve: %d of %d requests failed\n", n - ok, n);
    }
    status = ok > 0 ? 0 : 1;
out:
    warm.body = NULL;
    sv_req_reset(&warm);
    for (int i = 0; reqs && i < n; i++) {
        sv_req_reset(&reqs[i]);
        free(reqs[i].body);
    }
    free(reqs);
    free(o.warm_body);
    curl_global_cleanup();
    return status;
}
