/*
 * server/: the HTTP daemon (libmicrohttpd, one thread per connection): its
 * start and stop, the access callback that collects a request's body
 * (size-limited: 413), and the answers. What a request means is the route
 * table's (routes.c); connection limits are conn.c's.
 *
 * Every request body is untrusted (body.c, ids.c, chat.c, openai.c). A
 * generation request becomes one srv_req per choice, handed to the
 * scheduler together; a whole answer waits for them (generate.c), a stream
 * is pulled by MHD from a content reader (sse.c). A client gone from either
 * has its requests cancelled, so the scheduler frees their sequences at the
 * next step.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/internal.h"

/* ---- answers ---- */

void srv_count_status(srv_server *s, int status) {
    int k = status / 100;
    if (k < 1 || k > 5) return;
    pthread_mutex_lock(&s->met.mu);
    s->met.http_requests[k]++;
    pthread_mutex_unlock(&s->met.mu);
}

enum MHD_Result srv_send_buf(srv_server *s, struct MHD_Connection *c, int status, char *buf, size_t len,
                             const char *ctype) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    srv_conn_arrived(s, c);
    if (status == 405) MHD_add_response_header(resp, "Allow", "GET, POST");
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (status == 503) MHD_add_response_header(resp, "Retry-After", "1");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    srv_count_status(s, status);
    return rc;
}

/* A NULL j is a builder that refused (json_pack: a NULL "o" value or an
 * invalid UTF-8 "s" one) or ran out of memory; json_dumps only fails for
 * memory. Either is logged and answered as the server's own failure, never
 * the client's. */
enum MHD_Result srv_send_json(srv_server *s, struct MHD_Connection *c, int status, json_t *j) {
    char *txt = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!txt) {
        static const char unbuilt[] = "{\"error\":{\"message\":\"internal error: the response could not be "
                                      "built\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}";
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"InternalServerError\","
                                  "\"param\":null,\"code\":500}}";
        srv_log(s, SRV_LOG_ERROR, "a %d answer %s; answering 500", status,
                j ? "could not be serialized (json_dumps: out of memory)"
                  : "could not be built (a JSON builder refused a value or ran out of memory)");
        txt = strdup(j ? oom : unbuilt);
        status = 500;
        if (!txt) return MHD_NO;
    }
    return srv_send_buf(s, c, status, txt, strlen(txt), "application/json");
}

static const char *err_type(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 413: return "RequestTooLargeError";
    case 414: return "URITooLongError";
    case 503: return "ServiceUnavailableError";
    default: return "InternalServerError";
    }
}

/* msg and param pass srv_quote, so no byte of them can make the builder
 * refuse: what is left to fail is memory. */
json_t *srv_error_json(int status, const char *msg, const char *param) {
    char m[1024], p[128];
    srv_quote(m, sizeof m, msg, strlen(msg));
    srv_quote(p, sizeof p, param ? param : "", param ? strlen(param) : 0);
    return json_pack("{s:{s:s,s:s,s:o,s:i}}", "error", "message", m, "type", err_type(status), "param",
                     *p ? json_string(p) : json_null(), "code", status);
}

enum MHD_Result srv_send_error(srv_server *s, struct MHD_Connection *c, int status, const char *msg,
                               const char *param) {
    return srv_send_json(s, c, status, srv_error_json(status, msg, param));
}

enum MHD_Result srv_send_verr(srv_server *s, struct MHD_Connection *c, const srv_verr *e) {
    return srv_send_error(s, c, e->status, e->msg, e->param);
}

/* ---- the daemon ---- */

/* MHD calls this once with the headers, once per body piece, and once more
 * when the body is in. */
static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_server *s = cls;
    srv_request *rq = *con_cls; /* made by srv_uri_log */
    if (!rq && !(rq = *con_cls = srv_uri_log(s, url, c))) return MHD_NO;
    if (!rq->begun) { /* first call: headers only */
        rq->begun = 1;
        if (srv_conn_rejected(c)) return MHD_NO; /* answered 503 at accept */
        return srv_route_begin(s, c, rq, url, method);
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (rq->too_big || rq->len + n > s->opt.max_body_bytes) {
            rq->too_big = 1;
            return MHD_YES; /* keep reading (and dropping) so the 413 can be sent */
        }
        if (rq->len + n + 1 > rq->cap) {
            size_t nc = rq->cap ? rq->cap : 4096;
            while (nc < rq->len + n + 1)
                nc *= 2;
            char *nb = realloc(rq->body, nc);
            if (!nb) return MHD_NO;
            rq->body = nb;
            rq->cap = nc;
        }
        memcpy(rq->body + rq->len, upload_data, n);
        rq->len += n;
        return MHD_YES;
    }
    if (rq->too_big) return srv_send_error(s, c, 413, "request body too large", NULL);
    srv_conn_arrived(s, c); /* from here the pace is the server's */
    return srv_route_dispatch(s, c, rq);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_server *s = cls;
    (void)toe;
    srv_conn_next(s, c); /* keep-alive: the deadline of the next request starts now */
    srv_request *rq = *con_cls;
    if (!rq) return;
    if (rq->counted) atomic_fetch_sub(&s->http_active, 1);
    free(rq->body);
    free(rq->path);
    free(rq);
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
        srv_conn_reject_log(s, "beyond the 503 reserve of --max-connections, closed unanswered");
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
    s->mhd =
        MHD_start_daemon(flags, (uint16_t)s->opt.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, sa,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opt.timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)s->opt.max_connections + reserve, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                         MHD_OPTION_NOTIFY_CONNECTION, srv_conn_notify, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                         MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1u << 20), MHD_OPTION_URI_LOG_CALLBACK, srv_uri_log, s,
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)SRV_CONN_MEMORY, MHD_OPTION_END);
    if (!s->mhd) {
        snprintf(err, errlen, "cannot listen on %s:%d (address in use, or not allowed)", s->opt.host, s->opt.port);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->opt.port;
    if (pthread_create(&s->reaper, NULL, srv_conn_reaper, s) != 0) {
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
