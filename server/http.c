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
