/*
 * server/: the HTTP surface (libmicrohttpd, one thread per connection).
 *
 * Every request body is untrusted: size-limited (413), parsed with jansson
 * (token-id arrays straight from the text), each field type- and
 * range-checked. Field policy (vLLM's): a field the server does not know is
 * ignored with one warning line per request naming it; a known field whose
 * value cannot be honoured is a 400 naming it. A generation request becomes
 * one srv_req per choice (prompts x n or best_of), sharing a notifier group,
 * handed to the scheduler together; non-streaming handlers wait on the group
 * and poll their socket, streaming responses come from a content-reader
 * callback that waits on it. A client gone from either has its requests
 * cancelled, so the scheduler frees their sequences at the next step.
 * Connection limits (per client, in all, the request deadline) live in the
 * socket context MHD keeps per connection, and a reaper thread.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/internal.h"

enum { R_NONE = 0, R_COMPLETIONS, R_CHAT, R_MODELS, R_MODEL_ONE, R_VERSION, R_HEALTH, R_METRICS, R_TOKENIZE, R_DETOKENIZE };

typedef struct conn_ctx {
    int route;
    char *body;
    size_t len, cap;
    int too_big;
    int counted; /* in srv_server.http_active */
} conn_ctx;

/* A request-validation failure on its way to an HTTP error. */
typedef struct verr {
    int status;
    char msg[512];
    char param[64];
    char unknown[256]; /* ignored unknown fields, ", "-separated, for the warning */
} verr;

static int fail(verr *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(verr *e, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    return -1;
}

/* ---- connection limits ---- */

/* One live connection (MHD's socket context). */
typedef struct srv_conn {
    struct srv_conn *prev, *next;
    int fd;
    int family;
    unsigned char ip[16];
    double t_start; /* when the request now arriving began (accept, or the end of the previous one) */
    int receiving;  /* 1 until that request has arrived whole */
    int rejected;   /* 0, 1 over --max-connections, 2 over the per-client cap: answered 503 */
    int cut;        /* the reaper has shut it down */
} srv_conn;

static int same_ip(const srv_conn *a, const srv_conn *b) {
    return a->family == b->family && memcmp(a->ip, b->ip, sizeof a->ip) == 0;
}

static srv_conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* The request on c has arrived whole (or been answered early). */
static void conn_arrived(srv_server *s, struct MHD_Connection *c) {
    srv_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&s->conn_mu);
    k->receiving = 0;
    pthread_mutex_unlock(&s->conn_mu);
}

static void reject_log(srv_server *s, const char *why) {
    double now = srv_now();
    pthread_mutex_lock(&s->conn_mu);
    int say = now - s->last_reject_log > 1.0;
    if (say) s->last_reject_log = now;
    pthread_mutex_unlock(&s->conn_mu);
    if (say) srv_log(s, SRV_LOG_WARNING, "connection refused (503): %s (logged at most once a second)", why);
}

static void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode toe) {
    srv_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        srv_conn *k = calloc(1, sizeof *k);
        if (!k) return; /* untracked: served, without the limits */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr) {
            k->family = ci->client_addr->sa_family;
            if (k->family == AF_INET)
                memcpy(k->ip, &((const struct sockaddr_in *)(const void *)ci->client_addr)->sin_addr, 4);
            else if (k->family == AF_INET6)
                memcpy(k->ip, &((const struct sockaddr_in6 *)(const void *)ci->client_addr)->sin6_addr, 16);
        }
        k->t_start = srv_now();
        k->receiving = 1;
        pthread_mutex_lock(&s->conn_mu);
        int same = 0;
        for (srv_conn *x = s->conns; x; x = x->next)
            same += !x->rejected && same_ip(x, k);
        if (s->n_conns >= s->opt.max_connections)
            k->rejected = 1;
        else if (same >= s->opt.max_conn_per_client)
            k->rejected = 2;
        else
            s->n_conns++;
        k->next = s->conns;
        if (s->conns) s->conns->prev = k;
        s->conns = k;
        pthread_mutex_unlock(&s->conn_mu);
        if (k->rejected) {
            /* Answered now, before any request byte: a client over the limit
             * may never send a whole request (that is often why it is over).
             * Then no more writes; MHD reads what comes and closes. */
            static const char body[] = "{\"error\":{\"message\":\"too many connections; retry later\","
                                       "\"type\":\"ServiceUnavailableError\",\"param\":null,\"code\":503}}";
            char msg[512];
            int n = snprintf(msg, sizeof msg,
                             "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
                             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                             sizeof body - 1, body);
            if (k->fd >= 0 && n > 0 && send(k->fd, msg, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) == n)
                shutdown(k->fd, SHUT_WR);
            pthread_mutex_lock(&s->met.mu);
            s->met.conn_rejected[k->rejected - 1]++;
            s->met.http_requests[5]++;
            pthread_mutex_unlock(&s->met.mu);
            reject_log(s, k->rejected == 1 ? "--max-connections reached" : "--max-connections-per-client reached");
        }
        *socket_context = k;
    } else {
        srv_conn *k = *socket_context;
        if (!k) return;
        /* MHD closes the socket after this returns: unlinked under conn_mu,
         * the reaper can never shut down a reused descriptor. */
        pthread_mutex_lock(&s->conn_mu);
        if (k->prev)
            k->prev->next = k->next;
        else
            s->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        if (!k->rejected) s->n_conns--;
        pthread_mutex_unlock(&s->conn_mu);
        free(k);
        *socket_context = NULL;
    }
}

/* Closes connections whose request has not arrived whole within the
 * deadline (slowloris: every byte resets MHD's idle timeout, not this). */
static void *reaper_main(void *arg) {
    srv_server *s = arg;
    double dl = s->opt.request_deadline_s, dl_rej = dl < 2 ? dl : 2;
    while (!atomic_load(&s->reaper_stop)) {
        struct timespec d = {0, 100 * 1000 * 1000};
        nanosleep(&d, NULL);
        double now = srv_now();
        int cut = 0;
        pthread_mutex_lock(&s->conn_mu);
        for (srv_conn *k = s->conns; k; k = k->next) {
            if (k->cut || !k->receiving || k->fd < 0) continue;
            if (now - k->t_start > (k->rejected ? dl_rej : dl)) {
                shutdown(k->fd, SHUT_RDWR);
                k->cut = 1;
                cut++;
            }
        }
        pthread_mutex_unlock(&s->conn_mu);
        if (cut) {
            pthread_mutex_lock(&s->met.mu);
            s->met.deadline_closed += (uint64_t)cut;
            pthread_mutex_unlock(&s->met.mu);
            srv_log(s, SRV_LOG_DEBUG, "closed %d connection(s) at the request deadline", cut);
        }
    }
    return NULL;
}

/* ---- responses ---- */

static void count_status(srv_server *s, int status) {
    int k = status / 100;
    if (k < 1 || k > 5) return;
    pthread_mutex_lock(&s->met.mu);
    s->met.http_requests[k]++;
    pthread_mutex_unlock(&s->met.mu);
}

static enum MHD_Result send_buf(srv_server *s, struct MHD_Connection *c, int status, char *buf, size_t len,
                                const char *ctype) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    conn_arrived(s, c);
    if (status == 405) MHD_add_response_header(resp, "Allow", "GET, POST");
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (status == 503) MHD_add_response_header(resp, "Retry-After", "1");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    count_status(s, status);
    return rc;
}

static enum MHD_Result send_json(srv_server *s, struct MHD_Connection *c, int status, json_t *j) {
    char *txt = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!txt) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"internal_error\","
                                  "\"param\":null,\"code\":500}}";
        txt = strdup(oom);
        status = 500;
        if (!txt) return MHD_NO;
    }
    return send_buf(s, c, status, txt, strlen(txt), "application/json");
}

static const char *err_type(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 413: return "RequestTooLargeError";
    case 503: return "ServiceUnavailableError";
    default: return "InternalServerError";
    }
}

static json_t *error_json(int status, const char *msg, const char *param) {
    return json_pack("{s:{s:s,s:s,s:o,s:i}}", "error", "message", msg, "type", err_type(status), "param",
                     param && *param ? json_string(param) : json_null(), "code", status);
}

static enum MHD_Result send_error(srv_server *s, struct MHD_Connection *c, int status, const char *msg,
                                  const char *param) {
    return send_json(s, c, status, error_json(status, msg, param));
}

static enum MHD_Result send_verr(srv_server *s, struct MHD_Connection *c, const verr *e) {
    return send_error(s, c, e->status, e->msg, e->param);
}

/* ---- field helpers (null counts as absent) ---- */

static json_t *field(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

static int get_int(json_t *o, const char *k, long long lo, long long hi, long long *out, verr *e) {
    json_t *v = field(o, k);
    if (!v) return 0;
    if (!json_is_integer(v)) return fail(e, 400, k, "'%s' must be an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return fail(e, 400, k, "'%s' must be in [%lld, %lld], got %lld", k, lo, hi, x);
    *out = x;
    return 1;
}

static int get_num(json_t *o, const char *k, double lo, double hi, int lo_open, double *out, verr *e) {
    json_t *v = field(o, k);
    if (!v) return 0;
    if (!json_is_number(v)) return fail(e, 400, k, "'%s' must be a number", k);
    double x = json_number_value(v);
    if (!isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
        return fail(e, 400, k, "'%s' must be in %c%g, %g], got %g", k, lo_open ? '(' : '[', lo, hi, x);
    *out = x;
    return 1;
}

static int get_bool(json_t *o, const char *k, int *out, verr *e) {
    json_t *v = field(o, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) return fail(e, 400, k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 1;
}

/* Note an ignored unknown field (prefix: where it sits, e.g. "messages[]."). */
static void note_unknown(verr *e, const char *prefix, const char *k) {
    char one[96];
    snprintf(one, sizeof one, "'%s%.60s'", prefix, k);
    if (strstr(e->unknown, one)) return; /* one mention per name */
    size_t l = strlen(e->unknown);
    if (l + strlen(one) + 3 >= sizeof e->unknown) return;
    snprintf(e->unknown + l, sizeof e->unknown - l, "%s%s", l ? ", " : "", one);
}

/* Fields this server does not know are ignored (noted for the warning). */
static int check_known(json_t *o, const char *const *known, const char *prefix, verr *e) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++)
            ok = strcmp(k, known[i]) == 0;
        if (!ok) note_unknown(e, prefix, k);
    }
    return 0;
}

/* Known fields this server cannot honour except with their neutral value. */
static int check_neutral(json_t *o, verr *e) {
    json_t *v;
    if ((v = field(o, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
        return fail(e, 400, "suffix", "'suffix' is not supported");
    if ((v = field(o, "tools")) && !(json_is_array(v) && json_array_size(v) == 0))
        return fail(e, 400, "tools", "'tools' is not supported");
    if ((v = field(o, "tool_choice")) &&
        !(json_is_string(v) && (!strcmp(json_string_value(v), "none") || !strcmp(json_string_value(v), "auto"))))
        return fail(e, 400, "tool_choice", "'tool_choice' must be \"none\" or \"auto\"");
    if ((v = field(o, "response_format"))) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return fail(e, 400, "response_format",
                        "'response_format' other than {\"type\": \"text\"} is not supported");
    }
    if ((v = field(o, "user")) && !json_is_string(v)) return fail(e, 400, "user", "'user' must be a string");
    return 0;
}

static int model_check(srv_server *s, json_t *o, verr *e) {
    json_t *m = field(o, "model");
    if (!m) return 0;
    if (!json_is_string(m)) return fail(e, 400, "model", "'model' must be a string");
    if (strcmp(json_string_value(m), s->name) != 0)
        return fail(e, 404, "model", "The model `%.200s` does not exist.", json_string_value(m));
    return 0;
}

static json_t *parse_body(conn_ctx *cc, verr *e) {
    json_error_t je;
    if (!cc->len) {
        fail(e, 400, NULL, "request body is empty; expected a JSON object");
        return NULL;
    }
    json_t *root = json_loadb(cc->body, cc->len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        fail(e, 400, NULL, "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        fail(e, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* ---- token-id arrays straight from the body text ----
 *
 * jansson spends about 40 bytes per integer, so a body that is mostly a
 * token-id array would briefly take ~20x its size. A top-level key holding
 * an array of plain integers (or, with `batch`, a list of such arrays) is
 * read here into int32 ids, and its text replaced by a placeholder `0` and
 * spaces (same length: jansson's error positions stay right) before jansson
 * parses the rest. Anything else — escapes in the key, floats, strings,
 * malformed text — leaves the body untouched for jansson, whose answer
 * (and error message) is then the usual one. */
typedef struct fast_ids {
    int present; /* the key's value was taken here */
    int batch;   /* it was a list of arrays */
    int count;
    int32_t **ids;
    int *n;
    int bad_set; /* an id outside [0, vocab): the first one, in array bad_at */
    long long bad;
    int bad_at;
} fast_ids;

static void fast_ids_free(fast_ids *f) {
    for (int i = 0; i < f->count; i++)
        free(f->ids[i]);
    free(f->ids);
    free(f->n);
    memset(f, 0, sizeof *f);
}

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Past the end of a JSON string starting at p ('"'); NULL when unterminated. */
static const char *skip_string(const char *p, const char *end) {
    for (p++; p < end; p++) {
        if (*p == '\\') {
            p++;
            continue;
        }
        if (*p == '"') return p + 1;
    }
    return NULL;
}

/* Past the end of one JSON value (iterative, any depth); NULL when malformed
 * enough that the scan should stop. */
static const char *skip_value(const char *p, const char *end) {
    long depth = 0;
    do {
        p = skip_ws(p, end);
        if (p >= end) return NULL;
        if (*p == '"') {
            if (!(p = skip_string(p, end))) return NULL;
        } else if (*p == '{' || *p == '[') {
            depth++;
            p++;
        } else if (*p == '}' || *p == ']') {
            if (--depth < 0) return NULL;
            p++;
        } else if (*p == ',' || *p == ':') {
            if (depth == 0) return NULL;
            p++;
        } else {
            const char *q = p;
            while (p < end && !strchr(" \t\r\n,:]}[{\"", *p))
                p++;
            if (p == q) return NULL;
        }
    } while (depth > 0);
    return p;
}

/* One array of plain integers at p ('['): appended as fi's next array. */
static const char *fast_array(const char *p, const char *end, fast_ids *fi, int vocab) {
    size_t cap = 0, n = 0;
    int32_t *ids = NULL;
    p = skip_ws(p + 1, end);
    if (p < end && *p == ']') goto done;
    for (;;) {
        p = skip_ws(p, end);
        int neg = p < end && *p == '-';
        if (neg) p++;
        const char *d = p;
        long long v = 0;
        while (p < end && *p >= '0' && *p <= '9' && p - d < 18)
            v = v * 10 + (*p++ - '0');
        /* not a plain JSON integer (leading zero, fraction, exponent, too
         * long): jansson decides */
        if (p == d || (p - d > 1 && *d == '0') || (p < end && strchr(".eE0123456789", *p))) goto no;
        if (neg) v = -v;
        if ((v < 0 || v >= vocab) && !fi->bad_set) {
            fi->bad_set = 1;
            fi->bad = v;
            fi->bad_at = fi->count;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            int32_t *nb = realloc(ids, cap * sizeof *ids);
            if (!nb) goto no;
            ids = nb;
        }
        ids[n++] = (int32_t)(v < 0 || v >= vocab ? 0 : v);
        if (n > (size_t)1 << 24) goto no;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == ']') break;
        goto no;
    }
done : {
    int32_t **ni = realloc(fi->ids, ((size_t)fi->count + 1) * sizeof *ni);
    if (ni) fi->ids = ni;
    int *nn = ni ? realloc(fi->n, ((size_t)fi->count + 1) * sizeof *nn) : NULL;
    if (nn) fi->n = nn;
    if (!ni || !nn) goto no;
    fi->ids[fi->count] = ids;
    fi->n[fi->count++] = (int)n;
    return p + 1;
}
no:
    free(ids);
    return NULL;
}

/* Take the top-level `key` of body if it is an id array (or, batch, a list
 * of them); 0 taken or left alone, the body changed only when taken. */
static void fast_ids_take(char *body, size_t len, const char *key, int batch, int vocab, fast_ids *fi) {
    const char *p = body, *end = body + len;
    size_t kl = strlen(key);
    memset(fi, 0, sizeof *fi);
    p = skip_ws(p, end);
    if (p >= end || *p != '{') return;
    p++;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"') return;
        const char *k = p + 1, *ke = skip_string(p, end);
        if (!ke) return;
        int match = (size_t)(ke - 1 - k) == kl && memcmp(k, key, kl) == 0;
        p = skip_ws(ke, end);
        if (p >= end || *p != ':') return;
        p = skip_ws(p + 1, end);
        if (match) {
            if (p >= end || *p != '[') return;
            const char *v0 = p, *q = skip_ws(p + 1, end);
            if (q < end && *q == '[') {
                if (!batch) return;
                fi->batch = 1;
                p = q;
                for (;;) {
                    if (fi->count >= SRV_MAX_CHOICES || !(p = fast_array(p, end, fi, vocab))) goto undo;
                    p = skip_ws(p, end);
                    if (p < end && *p == ',') {
                        p = skip_ws(p + 1, end);
                        if (p >= end || *p != '[') goto undo;
                        continue;
                    }
                    if (p < end && *p == ']') break;
                    goto undo;
                }
                p++;
            } else if (!(p = fast_array(p, end, fi, vocab))) {
                goto undo;
            }
            fi->present = 1;
            memset((char *)v0, ' ', (size_t)(p - v0));
            *(char *)v0 = '0';
            return;
        }
        if (!(p = skip_value(p, end))) return;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        return;
    }
undo:
    fast_ids_free(fi);
}

/* Token ids from a JSON array, each in [0, vocab). */
static int parse_ids(srv_server *s, json_t *a, const char *param, int32_t **ids, int *n, verr *e) {
    size_t m = json_array_size(a);
    if (m > (size_t)1 << 24) return fail(e, 400, param, "'%s' has too many tokens", param);
    *ids = malloc((m ? m : 1) * sizeof **ids);
    if (!*ids) return fail(e, 500, param, "out of memory");
    for (size_t i = 0; i < m; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) return fail(e, 400, param, "'%s' must hold integer token ids", param);
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= s->mc.vocab_size)
            return fail(e, 400, param, "token id %" JSON_INTEGER_FORMAT " in '%s' is out of range [0, %d)", x, param,
                        s->mc.vocab_size);
        (*ids)[i] = (int32_t)x;
    }
    *n = (int)m;
    return 0;
}

static int encode_text(srv_server *s, const char *text, size_t len, int add_special, const char *param, int32_t **ids,
                       int *n, verr *e) {
    size_t nn;
    char terr[256];
    int rc = tok_encode(s->tok, text, len, add_special, ids, &nn, terr, sizeof terr);
    if (rc != TOK_OK) return fail(e, rc == TOK_ENOMEM ? 500 : 400, param, "cannot tokenize '%s': %s", param, terr);
    if (nn > (size_t)1 << 24) return fail(e, 400, param, "'%s' is too long", param);
    *n = (int)nn;
    return 0;
}

/* ---- chat messages -> template text ---- */

typedef struct chat_buf {
    tok_chat_message *msgs;
    tok_tool_call *calls;
    char **owned;
    size_t n_owned;
} chat_buf;

static void chat_buf_free(chat_buf *b) {
    for (size_t i = 0; i < b->n_owned; i++)
        free(b->owned[i]);
    free(b->owned);
    free(b->msgs);
    free(b->calls);
}

static const char *content_text(json_t *c, chat_buf *b, const char *param, verr *e) {
    if (!c) return "";
    if (json_is_string(c)) return json_string_value(c);
    if (!json_is_array(c)) return fail(e, 400, param, "message content must be a string or an array of parts"), NULL;
    size_t total = 0, i;
    json_t *p;
    json_array_foreach(c, i, p) {
        json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        json_t *tx = json_is_object(p) ? json_object_get(p, "text") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0 || !json_is_string(tx))
            return fail(e, 400, param, "only {\"type\": \"text\", \"text\": ...} content parts are supported"), NULL;
        total += json_string_length(tx);
    }
    char *out = malloc(total + 1), **no = realloc(b->owned, (b->n_owned + 1) * sizeof *no);
    if (no) b->owned = no;
    if (!out || !no) {
        free(out);
        return fail(e, 500, param, "out of memory"), NULL;
    }
    b->owned[b->n_owned++] = out;
    size_t off = 0;
    json_array_foreach(c, i, p) {
        json_t *tx = json_object_get(p, "text");
        memcpy(out + off, json_string_value(tx), json_string_length(tx));
        off += json_string_length(tx);
    }
    out[off] = 0;
    return out;
}

/* The model's own Jinja template over the request's messages (content
 * parts joined into text, as validated in b), chat_template_kwargs merged
 * into the variables, as apply_chat_template is called by vLLM. */
static int render_model_template(srv_server *s, json_t *msgs, const chat_buf *b, json_t *kw, int add_gen, char **text,
                                 size_t *tl, verr *e) {
    json_t *ctx = json_object(), *ms = json_array();
    size_t i;
    json_t *m;
    int rc = -1;
    char *ctx_text = NULL, terr[512];
    if (!ctx || !ms) goto oom;
    json_array_foreach(msgs, i, m) {
        json_t *c = json_deep_copy(m);
        if (!c || json_object_set_new(c, "content", json_string(b->msgs[i].content)) ||
            json_array_append_new(ms, c))
            goto oom;
    }
    if (json_object_set_new(ctx, "messages", ms)) goto oom;
    ms = NULL;
    if (kw && json_object_update(ctx, kw)) goto oom;
    if (json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_gen))) goto oom;
    if (!(ctx_text = json_dumps(ctx, JSON_COMPACT))) goto oom;
    if (eng_chat_render(&s->chat, ctx_text, text, tl, terr, sizeof terr)) {
        fail(e, 400, "messages", "chat template: %s", terr);
        goto out;
    }
    rc = 0;
    goto out;
oom:
    fail(e, 500, "messages", "out of memory");
out:
    json_decref(ms);
    json_decref(ctx);
    free(ctx_text);
    return rc;
}

static int render_chat(srv_server *s, json_t *root, int add_gen, int32_t **ids, int *n, verr *e) {
    json_t *msgs = field(root, "messages");
    if (!msgs) return fail(e, 400, "messages", "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return fail(e, 400, "messages", "'messages' must be a non-empty array");
    if (json_array_size(msgs) > 65536) return fail(e, 400, "messages", "too many messages");
    int enable_thinking = 1;
    json_t *kw = field(root, "chat_template_kwargs");
    if (kw) {
        if (!json_is_object(kw))
            return fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        const char *k;
        json_t *v;
        json_object_foreach(kw, k, v) {
            if (s->chat.source) continue; /* the model's template gets every key, as vLLM passes them */
            if (strcmp(k, "enable_thinking") != 0) {
                note_unknown(e, "chat_template_kwargs.", k); /* the built-in template has no use for it */
                continue;
            }
            if (!json_is_boolean(v))
                return fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs.enable_thinking' must be a boolean");
            enable_thinking = json_is_true(v);
        }
    }
    size_t nm = json_array_size(msgs), ncalls = 0, i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *tc = json_is_object(m) ? field(m, "tool_calls") : NULL;
        if (json_is_array(tc)) ncalls += json_array_size(tc);
    }
    chat_buf b = {calloc(nm, sizeof *b.msgs), calloc(ncalls ? ncalls : 1, sizeof *b.calls), NULL, 0};
    int rc = -1;
    char *text = NULL;
    if (!b.msgs || !b.calls) {
        fail(e, 500, NULL, "out of memory");
        goto out;
    }
    size_t ci = 0;
    json_array_foreach(msgs, i, m) {
        static const char *const known[] = {"role", "content", "reasoning_content", "tool_calls", "tool_call_id",
                                            "name", NULL};
        if (!json_is_object(m)) {
            fail(e, 400, "messages", "each message must be an object");
            goto out;
        }
        if (check_known(m, known, "messages[].", e)) goto out;
        json_t *role = json_object_get(m, "role");
        const char *r = json_is_string(role) ? json_string_value(role) : NULL;
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))) {
            fail(e, 400, "messages", "message %zu: 'role' must be one of system, user, assistant, tool", i);
            goto out;
        }
        if (field(m, "name") && !json_is_string(field(m, "name"))) {
            fail(e, 400, "messages", "message %zu: 'name' must be a string", i);
            goto out;
        }
        b.msgs[i].role = r;
        if (!(b.msgs[i].content = content_text(field(m, "content"), &b, "messages", e))) goto out;
        json_t *rc_ = field(m, "reasoning_content");
        if (rc_) {
            if (!json_is_string(rc_)) {
                fail(e, 400, "messages", "message %zu: 'reasoning_content' must be a string", i);
                goto out;
            }
            b.msgs[i].reasoning_content = json_string_value(rc_);
        }
        json_t *tc = field(m, "tool_calls");
        if (tc) {
            if (!json_is_array(tc)) {
                fail(e, 400, "messages", "message %zu: 'tool_calls' must be an array", i);
                goto out;
            }
            b.msgs[i].tool_calls = b.calls + ci;
            size_t j;
            json_t *call;
            json_array_foreach(tc, j, call) {
                json_t *fn = json_is_object(call) ? json_object_get(call, "function") : NULL;
                json_t *nm_ = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
                json_t *ar = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
                if (!json_is_string(nm_) || !json_is_string(ar)) {
                    fail(e, 400, "messages",
                         "message %zu: tool_calls need function.name and function.arguments "
                         "strings",
                         i);
                    goto out;
                }
                b.calls[ci].name = json_string_value(nm_);
                b.calls[ci].arguments = json_string_value(ar);
                ci++;
                b.msgs[i].n_tool_calls++;
            }
        }
    }
    size_t tl;
    char terr[512];
    if (s->chat.source) {
        if (render_model_template(s, msgs, &b, kw, add_gen, &text, &tl, e)) goto out;
    } else {
        tok_chat_options co = {.add_generation_prompt = add_gen, .enable_thinking = enable_thinking};
        if (tok_chat_apply(b.msgs, nm, &co, &text, &tl, terr, sizeof terr) != TOK_OK) {
            fail(e, 400, "messages", "chat template: %s", terr);
            goto out;
        }
    }
    rc = encode_text(s, text, tl, 0, "messages", ids, n, e);
out:
    free(text);
    chat_buf_free(&b);
    return rc;
}

/* ---- generation requests ---- */

static const char *const COMPLETION_FIELDS[] = {
    "model",          "prompt",          "max_tokens",        "temperature",     "top_p",
    "top_k",          "seed",            "stop",              "stream",          "stream_options",
    "logprobs",       "n",               "echo",              "user",            "ignore_eos",
    "min_tokens",     "repetition_penalty", "stop_token_ids", "presence_penalty", "frequency_penalty",
    "logit_bias",     "best_of",         "suffix",            "min_p",           "prompt_logprobs",
    NULL};
static const char *const CHAT_FIELDS[] = {
    "model",          "messages",        "max_tokens",        "max_completion_tokens", "temperature",
    "top_p",          "top_k",           "seed",              "stop",              "stream",
    "stream_options", "logprobs",        "top_logprobs",      "n",                 "user",
    "ignore_eos",     "min_tokens",      "repetition_penalty", "stop_token_ids",   "presence_penalty",
    "frequency_penalty", "logit_bias",   "min_p",             "chat_template_kwargs", "add_generation_prompt",
    "tools",          "tool_choice",     "parallel_tool_calls", "response_format", "prompt_logprobs",
    NULL};

/* One HTTP generation request: n_prompts prompts x per runs each (per =
 * best_of >= n), all sharing one notifier group. Run (i, j) is rs[i * per + j]. */
typedef struct gen_req {
    srv_req **rs;
    int n_rs, n_prompts, per, n;
    int chat, stream, include_usage, continuous_usage, echo;
    int echo_lp;   /* echo + logprobs: the prompt's tokens lead the logprobs */
    int vllm_plp;  /* prompt_logprobs requested: choices carry vLLM's prompt_logprobs */
    int vllm_k;    /* its top-k */
    char **prompt_text; /* (n_prompts) when echo */
    srv_group *grp;
    fast_ids fi; /* `prompt` ids read from the body text (fast_ids_take) */
} gen_req;

static void gen_free(gen_req *g) {
    for (int i = 0; i < g->n_rs; i++)
        srv_req_unref(g->rs[i]);
    free(g->rs);
    if (g->prompt_text)
        for (int i = 0; i < g->n_prompts; i++)
            free(g->prompt_text[i]);
    free(g->prompt_text);
    if (g->grp) srv_group_unref(g->grp);
    fast_ids_free(&g->fi);
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
static int parse_prompts(srv_server *s, json_t *root, fast_ids *fi, prompt_list *pl, verr *e) {
    if (fi->present) { /* the ids came straight from the body text; same checks, same order */
        for (int i = 0; i < fi->count; i++) {
            if (fi->bad_set && fi->bad_at == i)
                return fail(e, 400, "prompt", "token id %lld in 'prompt' is out of range [0, %d)", fi->bad,
                            s->mc.vocab_size);
            if (fi->n[i] == 0) return fail(e, 400, "prompt", "'prompt' is empty");
        }
        pl->ids = fi->ids;
        pl->n = fi->n;
        pl->count = fi->count;
        fi->ids = NULL;
        fi->n = NULL;
        fi->count = 0;
        return 0;
    }
    json_t *p = field(root, "prompt");
    if (!p) return fail(e, 400, "prompt", "'prompt' is required");
    if (!json_is_string(p) && !json_is_array(p))
        return fail(e, 400, "prompt", "'prompt' must be a string, an array of token ids, or a list of those");
    int batch = json_is_array(p) && json_array_size(p) > 0 &&
                (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)));
    size_t m = batch ? json_array_size(p) : 1;
    if (m > SRV_MAX_CHOICES) return fail(e, 400, "prompt", "at most %d prompts per request", SRV_MAX_CHOICES);
    pl->ids = calloc(m, sizeof *pl->ids);
    pl->n = calloc(m, sizeof *pl->n);
    if (!pl->ids || !pl->n) return fail(e, 500, "prompt", "out of memory");
    for (size_t i = 0; i < m; i++) {
        json_t *x = batch ? json_array_get(p, i) : p;
        int rc;
        pl->count = (int)i + 1;
        if (json_is_string(x))
            rc = encode_text(s, json_string_value(x), json_string_length(x), 1, "prompt", &pl->ids[i], &pl->n[i], e);
        else if (json_is_array(x))
            rc = parse_ids(s, x, "prompt", &pl->ids[i], &pl->n[i], e);
        else
            return fail(e, 400, "prompt", "each prompt of a batch must be a string or an array of token ids");
        if (rc) return rc;
        if (pl->n[i] == 0) return fail(e, 400, "prompt", "'prompt' is empty");
    }
    return 0;
}

static int parse_stop(srv_server *s, json_t *root, srv_req *r, verr *e) {
    json_t *st = field(root, "stop");
    if (st) {
        json_t *one = json_is_string(st) ? st : NULL;
        size_t n = one ? 1 : json_is_array(st) ? json_array_size(st) : (size_t)-1;
        if (n == (size_t)-1) return fail(e, 400, "stop", "'stop' must be a string or an array of strings");
        if (n > SRV_MAX_STOPS) return fail(e, 400, "stop", "at most %d stop strings", SRV_MAX_STOPS);
        for (size_t i = 0; i < n; i++) {
            json_t *v = one ? one : json_array_get(st, i);
            if (!json_is_string(v)) return fail(e, 400, "stop", "'stop' must be a string or an array of strings");
            size_t L = json_string_length(v);
            if (L == 0 || L > SRV_MAX_STOP_LEN)
                return fail(e, 400, "stop", "stop strings must be 1..%d bytes", SRV_MAX_STOP_LEN);
            if (!(r->stop[r->n_stop] = malloc(L + 1))) return fail(e, 500, "stop", "out of memory");
            memcpy(r->stop[r->n_stop], json_string_value(v), L + 1);
            r->stop_len[r->n_stop++] = L;
        }
    }
    json_t *sid = field(root, "stop_token_ids");
    if (sid) {
        if (!json_is_array(sid) || json_array_size(sid) > 1024)
            return fail(e, 400, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
        if (parse_ids(s, sid, "stop_token_ids", &r->stop_ids, &r->n_stop_ids, e)) return -1;
    }
    return 0;
}

/* OpenAI's logit_bias: {"token id": bias in [-100, 100]}. */
static int parse_logit_bias(srv_server *s, json_t *root, srv_req *r, verr *e) {
    json_t *lb = field(root, "logit_bias");
    if (!lb) return 0;
    if (!json_is_object(lb)) return fail(e, 400, "logit_bias", "'logit_bias' must be an object of token id: bias");
    size_t m = json_object_size(lb);
    if (m > SRV_MAX_LOGIT_BIAS) return fail(e, 400, "logit_bias", "at most %d logit_bias entries", SRV_MAX_LOGIT_BIAS);
    if (!m) return 0;
    r->bias_ids = malloc(m * sizeof *r->bias_ids);
    r->bias_vals = malloc(m * sizeof *r->bias_vals);
    if (!r->bias_ids || !r->bias_vals) return fail(e, 500, "logit_bias", "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        char *end;
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id >= s->mc.vocab_size)
            return fail(e, 400, "logit_bias", "logit_bias key '%.40s' is not a token id in [0, %d)", k,
                        s->mc.vocab_size);
        if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < -100 ||
            json_number_value(v) > 100)
            return fail(e, 400, "logit_bias", "logit_bias values must be numbers in [-100, 100]");
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_vals[r->n_bias++] = (float)json_number_value(v);
    }
    return 0;
}

/* A run of the template t over one prompt, with the scheduler-side buffers. */
static srv_req *req_clone(srv_server *s, const srv_req *t, const int32_t *prompt, int n_prompt, int max_tokens,
                          srv_group *grp, verr *e) {
    srv_req *r = srv_req_new();
    if (!r) return fail(e, 500, NULL, "out of memory"), NULL;
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
        return fail(e, 500, NULL, "out of memory"), NULL;
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
                             verr *e) {
    const char *what = chat ? "messages" : "prompt";
    if (n_prompt > s->max_model_len || (n_prompt == s->max_model_len && mt_req != 0))
        return fail(e, 400, what,
                    "This model's maximum context length is %d tokens. However, your prompt has %d tokens, leaving "
                    "no room for a completion.",
                    s->max_model_len, n_prompt);
    long long room = s->max_model_len - n_prompt;
    /* KV blocks for prompt + max_tokens are reserved at admission, so a
     * request must fit the whole cache or it could never be admitted. */
    long long kv_room = (long long)s->total_blocks * s->block_size - n_prompt;
    if (kv_room < (mt_req == 0 ? 0 : 1))
        return fail(e, 400, what, "the prompt (%d tokens) does not fit the KV cache (%d tokens)", n_prompt,
                    s->total_blocks * s->block_size);
    long long mt = mt_req;
    if (mt < 0) {
        mt = room < kv_room ? room : kv_room;
        if (!chat && mt > 16) mt = 16;
    }
    if (mt > room)
        return fail(e, 400, mt_name,
                    "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in "
                    "the %s, %lld in the completion). Please reduce the length of the %s or completion.",
                    s->max_model_len, n_prompt + mt, n_prompt, what, mt, what);
    if (mt > kv_room)
        return fail(e, 400, mt_name, "prompt (%d tokens) + %s (%lld) exceeds the KV cache (%d tokens)", n_prompt,
                    mt_name, mt, s->total_blocks * s->block_size);
    *out = (int)mt;
    return 0;
}

/* Validated body -> g->rs (not yet submitted). */
static int parse_generate(srv_server *s, json_t *root, int chat, gen_req *g, verr *e) {
    g->chat = chat;
    if (check_known(root, chat ? CHAT_FIELDS : COMPLETION_FIELDS, "", e) || check_neutral(root, e) ||
        model_check(s, root, e))
        return -1;
    long long v = 0;
    double d = 0;
    int b = 0;
    g->n = 1;
    if (get_int(root, "n", 1, SRV_MAX_CHOICES, &v, e) < 0) return -1;
    if (field(root, "n")) g->n = (int)v;
    g->per = g->n;
    if (!chat) {
        if (get_int(root, "best_of", 1, SRV_MAX_CHOICES, &v, e) < 0) return -1;
        if (field(root, "best_of")) {
            if (v < g->n) return fail(e, 400, "best_of", "'best_of' (%lld) must be >= n (%d)", v, g->n);
            g->per = (int)v;
        }
    }
    if (get_bool(root, "stream", &g->stream, e) < 0) return -1;
    if (g->stream && g->per > g->n)
        return fail(e, 400, "best_of", "'best_of' > n cannot be streamed (the best are known only at the end)");
    json_t *so = field(root, "stream_options");
    if (so) {
        static const char *const so_known[] = {"include_usage", "continuous_usage_stats", NULL};
        if (!json_is_object(so)) return fail(e, 400, "stream_options", "'stream_options' must be an object");
        if (!g->stream) return fail(e, 400, "stream_options", "'stream_options' requires \"stream\": true");
        check_known(so, so_known, "stream_options.", e);
        if (get_bool(so, "include_usage", &g->include_usage, e) < 0) return -1;
        if (get_bool(so, "continuous_usage_stats", &g->continuous_usage, e) < 0) return -1;
    }
    /* the template of every run */
    srv_req *t = srv_req_new();
    prompt_list pl = {0};
    int rc = -1, *mts = NULL, mt_min = INT32_MAX;
    if (!t) return fail(e, 500, NULL, "out of memory");
    t->chat = chat;
    if (get_int(root, "prompt_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &v, e) < 0) goto out;
    if (field(root, "prompt_logprobs")) {
        if (g->stream) {
            fail(e, 400, "prompt_logprobs", "'prompt_logprobs' is not supported with \"stream\": true");
            goto out;
        }
        g->vllm_plp = 1;
        g->vllm_k = (int)v;
        t->plp_k = (int)v;
    }
    if (chat) {
        pl.ids = calloc(1, sizeof *pl.ids);
        pl.n = calloc(1, sizeof *pl.n);
        if (!pl.ids || !pl.n) {
            fail(e, 500, NULL, "out of memory");
            goto out;
        }
        pl.count = 1;
        int add_gen = 1;
        if (get_bool(root, "add_generation_prompt", &add_gen, e) < 0) goto out;
        if (render_chat(s, root, add_gen, &pl.ids[0], &pl.n[0], e)) goto out;
        if (pl.n[0] == 0) {
            fail(e, 400, "messages", "the rendered chat is empty");
            goto out;
        }
        int lp = 0;
        if (get_bool(root, "logprobs", &lp, e) < 0) goto out;
        t->want_logprobs = lp;
        if (get_int(root, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &v, e) < 0) goto out;
        if (field(root, "top_logprobs")) {
            if (!lp) {
                fail(e, 400, "top_logprobs", "'top_logprobs' requires \"logprobs\": true");
                goto out;
            }
            t->top_logprobs = (int)v;
        }
        int pt = 0;
        if (get_bool(root, "parallel_tool_calls", &pt, e) < 0) goto out;
    } else {
        if (parse_prompts(s, root, &g->fi, &pl, e)) goto out;
        if (get_int(root, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &v, e) < 0) goto out;
        if (field(root, "logprobs")) {
            t->want_logprobs = 1;
            t->top_logprobs = (int)v;
        }
        if (get_bool(root, "echo", &g->echo, e) < 0) goto out;
        if (g->echo && t->want_logprobs) {
            g->echo_lp = 1;
            if (t->plp_k < t->top_logprobs) t->plp_k = t->top_logprobs;
        }
    }
    if ((long long)pl.count * g->per > SRV_MAX_CHOICES || pl.count * g->per > s->opt.max_waiting) {
        fail(e, 400, pl.count > 1 ? "prompt" : "n", "prompts x %s = %d runs; at most %d per request",
             g->per > g->n ? "best_of" : "n", pl.count * g->per,
             SRV_MAX_CHOICES < s->opt.max_waiting ? SRV_MAX_CHOICES : s->opt.max_waiting);
        goto out;
    }
    /* max_tokens: 0 only to score the prompt (echo or prompt_logprobs) */
    const char *mt_name = "max_tokens";
    if (chat && field(root, "max_completion_tokens")) mt_name = "max_completion_tokens";
    long long mt_req = -1;
    int mt_lo = g->echo || g->vllm_plp ? 0 : 1;
    if (get_int(root, mt_name, mt_lo, INT32_MAX, &mt_req, e) < 0) goto out;
    if (chat && field(root, "max_completion_tokens") && field(root, "max_tokens")) {
        long long other;
        if (get_int(root, "max_tokens", mt_lo, INT32_MAX, &other, e) < 0) goto out;
        if (other < mt_req) mt_req = other;
    }
    if (!(mts = calloc((size_t)pl.count, sizeof *mts))) {
        fail(e, 500, NULL, "out of memory");
        goto out;
    }
    for (int i = 0; i < pl.count; i++) {
        if (prompt_max_tokens(s, chat, pl.n[i], mt_req, mt_name, &mts[i], e)) goto out;
        if (mts[i] < mt_min) mt_min = mts[i];
    }
    /* sampling, defaults from generation_config.json */
    t->sp.temperature = s->gd.temperature;
    t->sp.top_p = s->gd.top_p;
    t->sp.top_k = s->gd.top_k;
    t->rep_penalty = s->gd.repetition_penalty;
    if (get_num(root, "temperature", 0, 2, 0, &d, e) < 0) goto out;
    if (field(root, "temperature")) t->sp.temperature = d < 1e-5 ? 0 : (float)d;
    if (get_num(root, "top_p", 0, 1, 1, &d, e) < 0) goto out;
    if (field(root, "top_p")) t->sp.top_p = (float)d;
    if (get_int(root, "top_k", -1, s->mc.vocab_size, &v, e) < 0) goto out;
    if (field(root, "top_k")) t->sp.top_k = v < 0 ? 0 : (int)v;
    if (get_num(root, "repetition_penalty", 0, 10, 1, &d, e) < 0) goto out;
    if (field(root, "repetition_penalty")) t->rep_penalty = (float)d;
    if (get_num(root, "presence_penalty", -2, 2, 0, &d, e) < 0) goto out;
    if (field(root, "presence_penalty")) t->presence = (float)d;
    if (get_num(root, "frequency_penalty", -2, 2, 0, &d, e) < 0) goto out;
    if (field(root, "frequency_penalty")) t->frequency = (float)d;
    if (get_num(root, "min_p", 0, 1, 0, &d, e) < 0) goto out;
    if (field(root, "min_p")) t->min_p = (float)d;
    if (parse_logit_bias(s, root, t, e)) goto out;
    long long seed = 0;
    int seeded = get_int(root, "seed", LLONG_MIN, LLONG_MAX, &seed, e);
    if (seeded < 0) goto out;
    if (get_bool(root, "ignore_eos", &b, e) < 0) goto out;
    if (field(root, "ignore_eos")) t->ignore_eos = b;
    if (get_int(root, "min_tokens", 0, mt_min, &v, e) < 0) goto out;
    if (field(root, "min_tokens")) t->min_tokens = (int)v;
    if (parse_stop(s, root, t, e)) goto out;
    t->want_cum = g->per > g->n;
    unsigned long long cnt = atomic_fetch_add(&s->req_counter, 1);
    snprintf(t->id, sizeof t->id, "%s-%016llx%08llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)(s->seed_base ^ cnt * 0x94d049bb133111ebull), cnt);
    t->created = (long long)time(NULL);
    /* the runs */
    if (!(g->grp = srv_group_new())) {
        fail(e, 500, NULL, "out of memory");
        goto out;
    }
    g->grp->refs = 1; /* g's own */
    g->n_prompts = pl.count;
    if (!(g->rs = calloc((size_t)pl.count * (size_t)g->per, sizeof *g->rs))) {
        fail(e, 500, NULL, "out of memory");
        goto out;
    }
    if (g->echo && !(g->prompt_text = calloc((size_t)pl.count, sizeof *g->prompt_text))) {
        fail(e, 500, NULL, "out of memory");
        goto out;
    }
    for (int i = 0; i < pl.count; i++) {
        if (g->echo) {
            size_t tl;
            char terr[128];
            if (tok_decode(s->tok, pl.ids[i], (size_t)pl.n[i], 0, &g->prompt_text[i], &tl, terr, sizeof terr) !=
                TOK_OK) {
                fail(e, 500, "echo", "cannot decode the prompt: %s", terr);
                goto out;
            }
        }
        for (int j = 0; j < g->per; j++) {
            /* n samples of one prompt: seed, seed + 1, ...; unseeded runs each draw their own */
            unsigned long long c = j ? atomic_fetch_add(&s->req_counter, 1) : cnt;
            t->sp.seed = seeded ? (uint64_t)seed + (uint64_t)j : s->seed_base ^ (c * 0xbf58476d1ce4e5b9ull);
            srv_req *r = req_clone(s, t, pl.ids[i], pl.n[i], mts[i], g->grp, e);
            if (!r) goto out;
            eng_rng_seed(&r->rng, r->sp.seed);
            r->index = i * g->n + j;
            g->rs[g->n_rs++] = r;
        }
    }
    rc = 0;
out:
    free(mts);
    prompts_free(&pl);
    srv_req_unref(t);
    return rc;
}

/* ---- response bodies ---- */

static json_t *timings_json(const srv_req *r) {
    int n = r->n_toks;
    double q = r->t_sched > 0 ? r->t_sched - r->t_arrive : 0;
    double pf = n ? r->t_first - r->t_sched : 0, ttft = n ? r->t_first - r->t_arrive : 0;
    double dec = n ? r->t_last - r->t_first : 0;
    return json_pack("{s:f,s:f,s:f,s:f,s:f,s:f}", "queue_ms", 1e3 * q, "prefill_ms", 1e3 * pf, "ttft_ms", 1e3 * ttft,
                     "decode_ms", 1e3 * dec, "per_token_ms", n > 1 ? 1e3 * dec / (n - 1) : 0.0, "e2e_ms",
                     1e3 * ((r->t_done > 0 ? r->t_done : srv_now()) - r->t_arrive));
}

static json_t *usage3(long long p, long long c) {
    return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)p, "completion_tokens", (json_int_t)c,
                     "total_tokens", (json_int_t)(p + c));
}

/* Whole-request usage: each prompt once, every run's completion tokens. */
static json_t *usage_all(const gen_req *g) {
    long long p = 0, c = 0;
    for (int i = 0; i < g->n_rs; i++) {
        srv_req *r = g->rs[i];
        if (i % g->per == 0) p += r->n_prompt;
        pthread_mutex_lock(&r->mu);
        c += r->n_toks;
        pthread_mutex_unlock(&r->mu);
    }
    return usage3(p, c);
}

static json_t *tok_str(srv_server *s, int32_t id) {
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

/* One position of completions logprobs; rec NULL: the first prompt token
 * (no logprob); k: top entries to show. */
static void lp_push(srv_server *s, lp_arrays *a, int32_t token, const srv_tokrec *rec, int k, size_t *off) {
    json_t *ts = tok_str(s, token);
    json_array_append_new(a->offs, json_integer((json_int_t)*off));
    *off += json_string_length(ts);
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
        json_t *ks = tok_str(s, rec->top_ids[i]);
        json_object_set_new(d, json_string_value(ks), json_real(rec->top_lp[i]));
        json_decref(ks);
    }
    json_array_append_new(a->tops, d);
}

/* Completions logprobs: with_prompt (echo) the prompt's tokens first (the
 * first one null), then generated toks[0..n), text offsets from *off. */
static json_t *completion_logprobs(srv_server *s, const srv_req *r, int with_prompt, const srv_tokrec *t, int n,
                                   size_t *off) {
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
        json_object_set_new(d, key, json_pack("{s:f,s:i,s:o}", "logprob", (double)p->logprob, "rank", p->rank,
                                              "decoded_token", tok_str(s, p->token)));
        int n = p->n_top < k ? p->n_top : k;
        for (int j = 0; j < n; j++) {
            snprintf(key, sizeof key, "%d", (int)p->top_ids[j]);
            if (json_object_get(d, key)) continue;
            json_object_set_new(d, key, json_pack("{s:f,s:i,s:o}", "logprob", (double)p->top_lp[j], "rank", j + 1,
                                                  "decoded_token", tok_str(s, p->top_ids[j])));
        }
        json_array_append_new(out, d);
    }
    return out;
}

static json_t *chat_logprobs(srv_server *s, const srv_tokrec *t, int n) {
    json_t *content = json_array();
    for (int i = 0; i < n; i++) {
        json_t *tops = json_array();
        for (int k = 0; k < t[i].n_top; k++)
            json_array_append_new(tops, json_pack("{s:o,s:f,s:o}", "token", tok_str(s, t[i].top_ids[k]), "logprob",
                                                  (double)t[i].top_lp[k], "bytes", tok_bytes(s, t[i].top_ids[k])));
        json_array_append_new(content,
                              json_pack("{s:o,s:f,s:o,s:o}", "token", tok_str(s, t[i].token), "logprob",
                                        (double)t[i].logprob, "bytes", tok_bytes(s, t[i].token), "top_logprobs", tops));
    }
    return json_pack("{s:o}", "content", content);
}

static const char *finish_str(srv_finish f) {
    return f == SRV_FIN_LENGTH ? "length" : f == SRV_FIN_STOP ? "stop" : "abort";
}

/* vLLM's stop_reason: the matched stop string, the stop_token_ids entry, or null. */
static json_t *stop_reason(const srv_req *r) {
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

static json_t *choice_json(srv_server *s, const gen_req *g, const srv_req *r, int prompt_i, int index) {
    json_t *choice, *lp = json_null();
    if (!g->chat) {
        const char *pt = g->prompt_text ? g->prompt_text[prompt_i] : NULL;
        size_t off = 0;
        if (r->want_logprobs) {
            json_decref(lp);
            if (!g->echo_lp) off = pt ? strlen(pt) : 0;
            lp = completion_logprobs(s, r, g->echo_lp, r->toks, r->n_toks, &off);
        }
        json_t *text = echo_text(pt, r->text ? r->text : "", r->text_len);
        choice = json_pack("{s:i,s:o,s:o,s:s,s:o}", "index", index, "text", text ? text : json_string(""),
                           "logprobs", lp, "finish_reason", finish_str(r->finish), "stop_reason", stop_reason(r));
    } else {
        if (r->want_logprobs) {
            json_decref(lp);
            lp = chat_logprobs(s, r->toks, r->n_toks);
        }
        json_t *text = json_stringn(r->text ? r->text : "", r->text_len);
        choice = json_pack("{s:i,s:{s:s,s:o,s:o},s:o,s:s,s:o}", "index", index, "message", "role", "assistant",
                           "content", text ? text : json_string(""), "tool_calls", json_array(), "logprobs", lp,
                           "finish_reason", finish_str(r->finish), "stop_reason", stop_reason(r));
    }
    if (choice && g->vllm_plp) json_object_set_new(choice, "prompt_logprobs", vllm_prompt_logprobs(s, r, g->vllm_k));
    return choice;
}

static int cmp_cum(const void *a, const void *b) {
    const srv_req *x = *(srv_req *const *)a, *y = *(srv_req *const *)b;
    return x->cum_logprob > y->cum_logprob ? -1 : x->cum_logprob < y->cum_logprob ? 1 : x->index - y->index;
}

static json_t *full_response(srv_server *s, gen_req *g) {
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
                     s->name, "choices", choices, "usage", usage_all(g), "timings", timings_json(r0));
}

/* ---- streaming ---- */

typedef struct run_cur {
    int tok_cur, started, fin_sent;
    size_t text_cur, lp_off;
} run_cur;

typedef struct stream_ctx {
    srv_server *s;
    gen_req g;
    run_cur *cur; /* (g.n_rs) */
    int n_fin;
    unsigned long long seen;
    char *out;
    size_t out_len, out_off, out_cap;
    int ended;
    double last_write;
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
    if (!t) return;
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
    if (c && sc->g.continuous_usage) json_object_set_new(c, "usage", usage3(r->n_prompt, n_toks));
    sc_event(sc, c);
}

/* One content chunk of run k: text (may be empty), logprobs of toks[0..nt). */
static void sc_content(stream_ctx *sc, int k, const char *text, size_t tl, const srv_tokrec *toks, int nt,
                       int with_prompt, int n_toks, const char *fin, const srv_req *fin_r) {
    srv_server *s = sc->s;
    const srv_req *r = sc->g.rs[k];
    json_t *lp = json_null();
    if (r->want_logprobs && (nt > 0 || with_prompt)) {
        json_decref(lp);
        lp = r->chat ? chat_logprobs(s, toks, nt)
                     : completion_logprobs(s, r, with_prompt, toks, nt, &sc->cur[k].lp_off);
    }
    json_t *txt = json_stringn(text ? text : "", tl);
    json_t *choice;
    if (r->chat) {
        json_t *delta = fin && !tl ? json_object() : json_pack("{s:o}", "content", txt ? txt : json_string(""));
        if (fin && !tl) json_decref(txt);
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", r->index, "delta", delta, "logprobs", lp, "finish_reason",
                           fin ? json_string(fin) : json_null());
    } else {
        choice = json_pack("{s:i,s:o,s:o,s:o}", "index", r->index, "text", txt ? txt : json_string(""), "logprobs",
                           lp, "finish_reason", fin ? json_string(fin) : json_null());
    }
    if (choice && fin_r) json_object_set_new(choice, "stop_reason", stop_reason(fin_r));
    json_t *c = chunk_base(sc, json_pack("[o]", choice));
    if (c && fin && fin_r) json_object_set_new(c, "timings", timings_json(fin_r));
    if (c && sc->g.continuous_usage) json_object_set_new(c, "usage", usage3(r->n_prompt, n_toks));
    sc_event(sc, c);
}

/* Turn whatever the scheduler published since the last pass into SSE bytes. */
static void sc_pass(stream_ctx *sc) {
    gen_req *g = &sc->g;
    for (int k = 0; k < g->n_rs; k++) {
        srv_req *r = g->rs[k];
        run_cur *cu = &sc->cur[k];
        if (cu->fin_sent) continue;
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
                sc_content(sc, k, pt, strlen(pt), NULL, 0, g->echo_lp && plp, 0, NULL, NULL);
                if (!g->echo_lp) cu->lp_off = strlen(pt);
            }
            cu->started = 1;
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
        cu->tok_cur += nt;
        cu->text_cur += tl;
        if (tl > 0 || (nt > 0 && r->want_logprobs)) sc_content(sc, k, text, tl, toks, nt, 0, n_toks, NULL, NULL);
        free(toks);
        free(text);
        if (done) {
            if (fin == SRV_FIN_ERROR)
                sc_event(sc, error_json(500, r->errmsg[0] ? r->errmsg : "generation failed", NULL));
            else
                sc_content(sc, k, NULL, 0, NULL, 0, 0, n_toks, finish_str(fin), r);
            cu->fin_sent = 1;
            sc->n_fin++;
        }
    }
    if (sc->n_fin == g->n_rs && !sc->ended) {
        if (g->include_usage) {
            json_t *c = chunk_base(sc, json_array());
            if (c) {
                json_object_set_new(c, "usage", usage_all(g));
                json_object_set_new(c, "timings", timings_json(g->rs[0]));
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

static void log_done(srv_server *s, const gen_req *g, const char *how) {
    if (s->opt.log_level > SRV_LOG_INFO) return;
    long long pt = 0, gt = 0;
    int done = 1;
    srv_finish f = SRV_FIN_NONE;
    for (int i = 0; i < g->n_rs; i++) {
        srv_req *r = g->rs[i];
        pthread_mutex_lock(&r->mu);
        if (i % g->per == 0) pt += r->n_prompt;
        gt += r->n_toks;
        done &= r->done;
        if (r->finish > f) f = r->finish;
        pthread_mutex_unlock(&r->mu);
    }
    const srv_req *r = g->rs[0];
    double ttft = r->n_toks ? 1e3 * (r->t_first - r->t_arrive) : 0;
    char runs[32] = "";
    if (g->n_rs > 1) snprintf(runs, sizeof runs, " (%d runs)", g->n_rs);
    srv_log(s, SRV_LOG_INFO, "%s %s%s: %s, prompt %lld, generated %lld, ttft %.1f ms, e2e %.1f ms", r->id, how, runs,
            done ? srv_finish_name(f) : "cancelled", pt, gt, ttft,
            1e3 * ((r->t_done > 0 ? r->t_done : srv_now()) - r->t_arrive));
}

static void cancel_all(gen_req *g) {
    for (int i = 0; i < g->n_rs; i++) {
        srv_req *r = g->rs[i];
        pthread_mutex_lock(&r->mu);
        int done = r->done;
        pthread_mutex_unlock(&r->mu);
        if (!done) atomic_store(&r->cancelled, 1);
    }
}

/* MHD is done with the stream (finished, or the client went away). */
static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    cancel_all(&sc->g);
    log_done(sc->s, &sc->g, "stream");
    gen_free(&sc->g);
    free(sc->cur);
    free(sc->out);
    free(sc);
}

/* Body -> validated, tokenized runs ready for the scheduler (g). On failure
 * *e says why and nothing is left allocated. */
static int generate_prepare(srv_server *s, conn_ctx *cc, int chat, gen_req *g, verr *e) {
    if (!chat) fast_ids_take(cc->body, cc->len, "prompt", 1, s->mc.vocab_size, &g->fi);
    json_t *root = parse_body(cc, e);
    if (!root) {
        fast_ids_free(&g->fi);
        return -1;
    }
    int rc = parse_generate(s, root, chat, g, e);
    json_decref(root);
    if (rc) gen_free(g);
    fast_ids_free(&g->fi);
    return rc;
}

/* The client closed its end (or the socket failed) while it waits for a
 * non-streaming answer. Pipelined bytes do not count as gone. */
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return 1;
    if (p.revents & POLLIN) {
        char c;
        ssize_t k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return k == 0;
    }
    return 0;
}

static int all_done(gen_req *g) {
    int done = 1;
    for (int i = 0; i < g->n_rs && done; i++) {
        srv_req *r = g->rs[i];
        pthread_mutex_lock(&r->mu);
        done = r->done;
        pthread_mutex_unlock(&r->mu);
    }
    return done;
}

static void log_unknown(srv_server *s, const verr *e, const char *id, const char *route) {
    if (e->unknown[0])
        srv_log(s, SRV_LOG_WARNING, "%s%s%s: ignoring unknown fields: %s", route, id && *id ? " " : "", id ? id : "",
                e->unknown);
}

static enum MHD_Result handle_generate(srv_server *s, struct MHD_Connection *c, conn_ctx *cc, int chat) {
    verr e = {0};
    gen_req g = {0};
    if (generate_prepare(s, cc, chat, &g, &e)) return send_verr(s, c, &e);
    log_unknown(s, &e, g.rs[0]->id, chat ? "chat" : "completion");
    if (srv_sched_submit_many(s, g.rs, g.n_rs) != 0) {
        gen_free(&g);
        return send_error(s, c, 503,
                          atomic_load(&s->accepting) ? "server overloaded: the waiting queue is full, retry later"
                                                     : "server is shutting down",
                          NULL);
    }
    if (g.stream) {
        stream_ctx *sc = calloc(1, sizeof *sc);
        run_cur *cur = calloc((size_t)g.n_rs, sizeof *cur);
        if (!sc || !cur) {
            free(sc);
            free(cur);
            cancel_all(&g);
            gen_free(&g);
            return send_error(s, c, 500, "out of memory", NULL);
        }
        sc->s = s;
        sc->g = g;
        sc->cur = cur;
        sc->last_write = srv_now();
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, sc, stream_free);
        if (!resp) {
            stream_free(sc);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        /* The request is complete: from here on the stream's pace is the
         * model's, not the client's, so lift the idle timeout a lot. */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 600u);
        enum MHD_Result mr = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count_status(s, 200);
        return mr;
    }
    /* Wait for every run; a client that hangs up meanwhile has them
     * cancelled (their KV freed at the next step), as a stream's would be. */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1, gone = 0;
    for (;;) {
        pthread_mutex_lock(&g.grp->mu);
        unsigned long long v = g.grp->version;
        pthread_mutex_unlock(&g.grp->mu);
        if (all_done(&g)) break;
        pthread_mutex_lock(&g.grp->mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (g.grp->version == v)
            if (pthread_cond_timedwait(&g.grp->cv, &g.grp->mu, &ts) != 0) break;
        pthread_mutex_unlock(&g.grp->mu);
        if (!gone && client_gone(fd)) {
            gone = 1;
            cancel_all(&g);
        }
    }
    log_done(s, &g, chat ? "chat" : "completion");
    enum MHD_Result mr;
    srv_finish worst = SRV_FIN_NONE;
    const char *msg = NULL;
    for (int i = 0; i < g.n_rs; i++)
        if (g.rs[i]->finish == SRV_FIN_ERROR || (g.rs[i]->finish == SRV_FIN_ABORT && worst != SRV_FIN_ERROR)) {
            worst = g.rs[i]->finish;
            msg = g.rs[i]->errmsg;
        }
    if (gone)
        mr = MHD_NO; /* nobody to answer */
    else if (worst == SRV_FIN_ERROR)
        mr = send_error(s, c, 500, msg && msg[0] ? msg : "generation failed", NULL);
    else if (worst == SRV_FIN_ABORT)
        mr = send_error(s, c, 503, "request cancelled: the server is shutting down", NULL);
    else
        mr = send_json(s, c, 200, full_response(s, &g));
    gen_free(&g);
    return mr;
}

/* ---- other routes ---- */

/* /tokenize body -> response object (*out; NULL only when out of memory),
 * or -1 with *e set. */
static int tokenize_body(srv_server *s, conn_ctx *cc, json_t **out, verr *e) {
    static const char *const known[] = {"model",
                                        "prompt",
                                        "messages",
                                        "add_special_tokens",
                                        "add_generation_prompt",
                                        "chat_template_kwargs",
                                        "return_token_strs",
                                        NULL};
    json_t *root = parse_body(cc, e);
    if (!root) return -1;
    int32_t *ids = NULL;
    int n = 0, add_special = 1, add_gen = 1, strs = 0;
    if (check_known(root, known, "", e) || model_check(s, root, e) ||
        get_bool(root, "add_special_tokens", &add_special, e) < 0 ||
        get_bool(root, "add_generation_prompt", &add_gen, e) < 0 || get_bool(root, "return_token_strs", &strs, e) < 0)
        goto fail;
    json_t *p = field(root, "prompt");
    if (p && field(root, "messages")) {
        fail(e, 400, "prompt", "give either 'prompt' or 'messages', not both");
        goto fail;
    }
    if (p) {
        if (!json_is_string(p)) {
            fail(e, 400, "prompt", "'prompt' must be a string");
            goto fail;
        }
        if (encode_text(s, json_string_value(p), json_string_length(p), add_special, "prompt", &ids, &n, e)) goto fail;
    } else if (field(root, "messages")) {
        if (render_chat(s, root, add_gen, &ids, &n, e)) goto fail;
    } else {
        fail(e, 400, "prompt", "'prompt' (or 'messages') is required");
        goto fail;
    }
    json_t *toks = json_array(), *ts = strs ? json_array() : json_null();
    for (int i = 0; i < n; i++) {
        json_array_append_new(toks, json_integer(ids[i]));
        if (strs) json_array_append_new(ts, tok_str(s, ids[i]));
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

static enum MHD_Result handle_tokenize(srv_server *s, struct MHD_Connection *c, conn_ctx *cc) {
    verr e = {0};
    json_t *out = NULL;
    if (tokenize_body(s, cc, &out, &e)) return send_verr(s, c, &e);
    log_unknown(s, &e, "", "tokenize");
    return send_json(s, c, 200, out);
}

/* /detokenize body -> response object (*out; NULL only when out of memory),
 * or -1 with *e set. */
static int detokenize_body(srv_server *s, conn_ctx *cc, json_t **out, verr *e) {
    static const char *const known[] = {"model", "tokens", NULL};
    fast_ids fi;
    fast_ids_take(cc->body, cc->len, "tokens", 0, s->mc.vocab_size, &fi);
    json_t *root = parse_body(cc, e);
    int32_t *ids = NULL;
    int n = 0;
    if (!root) goto fail;
    json_t *t = field(root, "tokens");
    if (check_known(root, known, "", e) || model_check(s, root, e)) goto fail;
    if (fi.present) {
        if (fi.bad_set) {
            fail(e, 400, "tokens", "token id %lld in 'tokens' is out of range [0, %d)", fi.bad, s->mc.vocab_size);
            goto fail;
        }
        ids = fi.ids[0];
        n = fi.n[0];
        fi.ids[0] = NULL;
    } else {
        if (!json_is_array(t)) {
            fail(e, 400, "tokens", "'tokens' must be an array of token ids");
            goto fail;
        }
        if (parse_ids(s, t, "tokens", &ids, &n, e)) goto fail;
    }
    char *txt = NULL;
    size_t tl;
    char terr[128];
    if (tok_decode(s->tok, ids, (size_t)n, 0, &txt, &tl, terr, sizeof terr) != TOK_OK) {
        fail(e, 400, "tokens", "cannot decode: %s", terr);
        goto fail;
    }
    *out = json_pack("{s:o}", "prompt", json_stringn(txt, tl));
    free(txt);
    free(ids);
    json_decref(root);
    fast_ids_free(&fi);
    return 0;
fail:
    free(ids);
    json_decref(root);
    fast_ids_free(&fi);
    return -1;
}

static enum MHD_Result handle_detokenize(srv_server *s, struct MHD_Connection *c, conn_ctx *cc) {
    verr e = {0};
    json_t *out = NULL;
    if (detokenize_body(s, cc, &out, &e)) return send_verr(s, c, &e);
    log_unknown(s, &e, "", "detokenize");
    return send_json(s, c, 200, out);
}

/* The request-body path of the four POST routes as the handlers run it
 * (parse, validate, tokenize, build the response object), minus the engine
 * and the network: a prepared generation request is freed instead of being
 * submitted, a response object is serialized as send_json does, then freed. */
int srv_fuzz_parse(srv_server *s, int route, const char *body, size_t len, char *err, size_t errlen) {
    char *copy = malloc(len + 1); /* the handlers own (and may rewrite) their body */
    if (!copy) return -1;
    if (len) memcpy(copy, body, len);
    conn_ctx cc = {.body = copy, .len = len};
    verr e = {0};
    json_t *out = NULL;
    int rc;
    switch (route) {
    case SRV_FUZZ_COMPLETIONS:
    case SRV_FUZZ_CHAT: {
        gen_req g = {0};
        cc.route = route == SRV_FUZZ_CHAT ? R_CHAT : R_COMPLETIONS;
        rc = generate_prepare(s, &cc, route == SRV_FUZZ_CHAT, &g, &e);
        if (!rc) gen_free(&g);
        break;
    }
    case SRV_FUZZ_TOKENIZE:
        cc.route = R_TOKENIZE;
        rc = tokenize_body(s, &cc, &out, &e);
        break;
    case SRV_FUZZ_DETOKENIZE:
        cc.route = R_DETOKENIZE;
        rc = detokenize_body(s, &cc, &out, &e);
        break;
    default: free(copy); return -1;
    }
    if (!rc && route >= SRV_FUZZ_TOKENIZE) {
        char *txt = out ? json_dumps(out, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
        json_decref(out);
        if (!txt) rc = fail(&e, 500, NULL, "out of memory"); /* what send_json answers */
        free(txt);
    }
    if (err && errlen) snprintf(err, errlen, "%s", rc ? e.msg : "");
    free(copy);
    return rc ? e.status : 200;
}

static json_t *model_json(srv_server *s) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:s,s:n}", "id", s->name, "object", "model", "created",
                          (json_int_t)time(NULL), "owned_by", "echo", "root", s->model_dir, "parent");
    if (m && s->max_model_len) json_object_set_new(m, "max_model_len", json_integer(s->max_model_len));
    return m;
}

static enum MHD_Result handle_models(srv_server *s, struct MHD_Connection *c) {
    return send_json(s, c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(s)));
}

/* GET /v1/models/{id} (the id may hold '/', as "Qwen/Qwen3-8B"). */
static enum MHD_Result handle_model_one(srv_server *s, struct MHD_Connection *c, const char *url) {
    const char *id = url + 11;
    if (strcmp(id, s->name) != 0) {
        char msg[300];
        snprintf(msg, sizeof msg, "The model `%.200s` does not exist.", id);
        return send_error(s, c, 404, msg, "model");
    }
    return send_json(s, c, 200, model_json(s));
}

static enum MHD_Result handle_metrics(srv_server *s, struct MHD_Connection *c) {
    size_t len;
    char *txt = srv_metrics_render(&s->met, s->name, &len);
    if (!txt) return send_error(s, c, 500, "out of memory", NULL);
    return send_buf(s, c, 200, txt, len, "text/plain; version=0.0.4; charset=utf-8");
}

/* ---- dispatch ---- */

static int route_of(const char *url) {
    static const struct {
        const char *path;
        int route;
    } tab[] = {{"/v1/completions", R_COMPLETIONS},
               {"/v1/chat/completions", R_CHAT},
               {"/v1/models", R_MODELS},
               {"/version", R_VERSION},
               {"/health", R_HEALTH},
               {"/metrics", R_METRICS},
               {"/tokenize", R_TOKENIZE},
               {"/detokenize", R_DETOKENIZE}};
    for (size_t i = 0; i < sizeof tab / sizeof *tab; i++)
        if (strcmp(url, tab[i].path) == 0) return tab[i].route;
    if (strncmp(url, "/v1/models/", 11) == 0 && url[11]) return R_MODEL_ONE;
    return R_NONE;
}

static int route_is_post(int r) {
    return r == R_COMPLETIONS || r == R_CHAT || r == R_TOKENIZE || r == R_DETOKENIZE;
}

static int authorized(srv_server *s, struct MHD_Connection *c, int route) {
    if (!s->opt.api_key || route == R_HEALTH || route == R_METRICS) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7, *want = s->opt.api_key;
    size_t lk = strlen(k), lw = strlen(want);
    unsigned diff = (unsigned)(lk ^ lw);
    for (size_t i = 0; i < lk && i < lw; i++)
        diff |= (unsigned char)(k[i] ^ want[i]);
    return diff == 0;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        /* First call: headers only. Answer what can be answered now so a
         * refused body is never read. */
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        *con_cls = cc;
        cc->route = route_of(url);
        srv_conn *k = conn_of(c);
        if (k && k->rejected) return MHD_NO; /* answered 503 at accept */
        if (cc->route == R_COMPLETIONS || cc->route == R_CHAT) {
            cc->counted = 1;
            atomic_fetch_add(&s->http_active, 1);
        }
        int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), is_post = !strcmp(method, "POST");
        if (cc->route == R_NONE) return send_error(s, c, 404, "Not Found", NULL);
        if (route_is_post(cc->route) ? !is_post : !is_get) return send_error(s, c, 405, "Method Not Allowed", NULL);
        if (!authorized(s, c, cc->route))
            return send_error(s, c, 401, "Unauthorized: missing or invalid API key", NULL);
        if (is_post) {
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
            if (cl) {
                char *end;
                unsigned long long v = strtoull(cl, &end, 10);
                if (end != cl && v > s->opt.max_body_bytes)
                    return send_error(s, c, 413, "request body too large", NULL);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cc->too_big || cc->len + n > s->opt.max_body_bytes) {
            cc->too_big = 1;
            return MHD_YES; /* keep reading (and dropping) so the 413 can be sent */
        }
        if (cc->len + n + 1 > cc->cap) {
            size_t nc = cc->cap ? cc->cap : 4096;
            while (nc < cc->len + n + 1)
                nc *= 2;
            char *nb = realloc(cc->body, nc);
            if (!nb) return MHD_NO;
            cc->body = nb;
            cc->cap = nc;
        }
        memcpy(cc->body + cc->len, upload_data, n);
        cc->len += n;
        return MHD_YES;
    }
    if (cc->too_big) return send_error(s, c, 413, "request body too large", NULL);
    conn_arrived(s, c); /* from here the pace is the server's */
    switch (cc->route) {
    case R_HEALTH: {
        if (!srv_usable(s)) {
            char *why = NULL;
            int n = asprintf(&why, "engine unusable: %s\n", s->unusable_why);
            return send_buf(s, c, 503, n < 0 ? NULL : why, n < 0 ? 0 : (size_t)n, "text/plain");
        }
        int ok = atomic_load(&s->ready) && atomic_load(&s->accepting);
        return send_buf(s, c, ok ? 200 : 503, strdup(""), 0, "text/plain");
    }
    case R_METRICS: return handle_metrics(s, c);
    case R_MODELS: return handle_models(s, c);
    case R_MODEL_ONE: return handle_model_one(s, c, url);
    case R_VERSION: return send_json(s, c, 200, json_pack("{s:s}", "version", SRV_VERSION));
    default: break;
    }
    if (!atomic_load(&s->ready))
        return send_error(s, c, 503,
                          atomic_load(&s->accepting) ? "the model is loading; retry when /health is 200"
                                                     : "server is shutting down",
                          NULL);
    if (!srv_usable(s) && (cc->route == R_COMPLETIONS || cc->route == R_CHAT)) {
        char msg[640];
        snprintf(msg, sizeof msg, "the engine can run no more steps (%s); the server must be restarted",
                 s->unusable_why);
        return send_error(s, c, 503, msg, NULL);
    }
    switch (cc->route) {
    case R_COMPLETIONS: return handle_generate(s, c, cc, 0);
    case R_CHAT: return handle_generate(s, c, cc, 1);
    case R_TOKENIZE: return handle_tokenize(s, c, cc);
    case R_DETOKENIZE: return handle_detokenize(s, c, cc);
    default: return send_error(s, c, 404, "Not Found", NULL);
    }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_server *s = cls;
    (void)toe;
    srv_conn *k = conn_of(c);
    if (k) { /* keep-alive: the deadline of the next request starts now */
        pthread_mutex_lock(&s->conn_mu);
        k->receiving = 1;
        k->t_start = srv_now();
        pthread_mutex_unlock(&s->conn_mu);
    }
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    if (cc->counted) atomic_fetch_sub(&s->http_active, 1);
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    srv_server *s = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = 0;
    if (strstr(line, "connection limit")) { /* MHD's own hard limit: closed without an answer */
        pthread_mutex_lock(&s->met.mu);
        s->met.conn_rejected[0]++;
        pthread_mutex_unlock(&s->met.mu);
        reject_log(s, "beyond the 503 reserve of --max-connections, closed unanswered");
        return;
    }
    srv_log(s, SRV_LOG_DEBUG, "http: %s", line);
}

int srv_http_start(srv_server *s, char *err, size_t errlen) {
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_AUTO | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    if (inet_pton(AF_INET, s->opt.host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)s->opt.port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, s->opt.host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)s->opt.port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        snprintf(err, errlen, "--host '%s' is not a numeric IPv4 or IPv6 address", s->opt.host);
        return -1;
    }
    /* Beyond --max-connections MHD still accepts a reserve, answered 503 at once. */
    unsigned reserve = (unsigned)s->opt.max_connections / 4 < 32 ? 32 : (unsigned)s->opt.max_connections / 4;
    s->mhd = MHD_start_daemon(flags, (uint16_t)s->opt.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, sa,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opt.timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)s->opt.max_connections + reserve, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                              MHD_OPTION_NOTIFY_CONNECTION, notify_conn, s,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1u << 20),
                              MHD_OPTION_END);
    if (!s->mhd) {
        snprintf(err, errlen, "cannot listen on %s:%d (address in use, or not allowed)", s->opt.host, s->opt.port);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->opt.port;
    if (pthread_create(&s->reaper, NULL, reaper_main, s) != 0) {
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        snprintf(err, errlen, "cannot start the connection reaper thread");
        return -1;
    }
    s->reaper_started = 1;
    return 0;
}

void srv_http_quiesce(srv_server *s) {
    if (!s->mhd) return;
    MHD_socket fd = MHD_quiesce_daemon(s->mhd);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void srv_http_stop(srv_server *s) {
    if (!s->mhd) return;
    /* The scheduler has finished or cancelled every request; give their
     * connections a moment to flush (the rest of a stream, [DONE]) before
     * MHD closes every socket. */
    double until = srv_now() + 5;
    while (atomic_load(&s->http_active) > 0 && srv_now() < until) {
        struct timespec d = {0, 10 * 1000 * 1000};
        nanosleep(&d, NULL);
    }
    if (s->reaper_started) {
        atomic_store(&s->reaper_stop, 1);
        pthread_join(s->reaper, NULL);
        s->reaper_started = 0;
    }
    MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}
