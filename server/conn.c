/*
 * server/: connection limits against hostile clients. Each live connection
 * is a srv_conn in MHD's socket context: per-client and total caps are
 * applied at accept (answered 503 with Retry-After before any request byte),
 * and a reaper thread cuts a connection whose request has not arrived whole
 * within the request deadline (slowloris).
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server/internal.h"

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

int srv_conn_rejected(struct MHD_Connection *c) {
    srv_conn *k = conn_of(c);
    return k && k->rejected;
}

/* The request on c has arrived whole (or been answered early). */
void srv_conn_arrived(srv_server *s, struct MHD_Connection *c) {
    srv_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&s->conn_mu);
    k->receiving = 0;
    pthread_mutex_unlock(&s->conn_mu);
}

void srv_conn_reject_log(srv_server *s, const char *why) {
    double now = srv_now();
    pthread_mutex_lock(&s->conn_mu);
    int say = now - s->last_reject_log > 1.0;
    if (say) s->last_reject_log = now;
    pthread_mutex_unlock(&s->conn_mu);
    if (say) srv_log(s, SRV_LOG_WARNING, "connection refused (503): %s (logged at most once a second)", why);
}

void srv_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
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
            srv_conn_reject_log(s, k->rejected == 1 ? "--max-connections reached"
                                                    : "--max-connections-per-client reached");
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
void *srv_conn_reaper(void *arg) {
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

void srv_conn_next(srv_server *s, struct MHD_Connection *c) {
    srv_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&s->conn_mu);
    k->receiving = 1;
    k->t_start = srv_now();
    pthread_mutex_unlock(&s->conn_mu);
}
