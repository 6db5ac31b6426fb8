/*
 * server/: the generation routes (/v1/completions, /v1/chat/completions).
 * The runs of a request are handed to the scheduler together; a streaming
 * answer goes to sse.c, a whole one waits here on the request's notifier
 * group while polling the socket: a client gone meanwhile has its runs
 * cancelled, so the scheduler frees their sequences at the next step.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "server/internal.h"

void srv_log_done(srv_server *s, const srv_gen *g, const char *how) {
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

void srv_cancel_all(srv_gen *g) {
    for (int i = 0; i < g->n_rs; i++) {
        srv_req *r = g->rs[i];
        pthread_mutex_lock(&r->mu);
        int done = r->done;
        pthread_mutex_unlock(&r->mu);
        if (!done) atomic_store(&r->cancelled, 1);
    }
}

/* The client closed its end (or the socket failed) while it waits for a
 * non-streaming answer. Pipelined bytes do not count as gone. */
int srv_client_gone(int fd) {
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

static int all_done(srv_gen *g) {
    int done = 1;
    for (int i = 0; i < g->n_rs && done; i++) {
        srv_req *r = g->rs[i];
        pthread_mutex_lock(&r->mu);
        done = r->done;
        pthread_mutex_unlock(&r->mu);
    }
    return done;
}
/* Wait for every run; a client that hangs up meanwhile has them
 * cancelled (their KV freed at the next step), as a stream's would be. */
int srv_gen_wait(srv_server *s, struct MHD_Connection *c, srv_gen *gp) {
    srv_gen g = *gp; /* (a shallow view: the loop below reads it as before) */
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
        if (!gone && srv_client_gone(fd)) {
            gone = 1;
            srv_cancel_all(&g);
        }
        /* A rank of an mpirun job died: the step in flight may never return
         * (and mpirun ends the job soon), so answer now, naming it. */
        if (!gone && !srv_usable(s)) {
            srv_cancel_all(&g);
            break;
        }
    }
    return gone;
}

/* Submit the runs, then stream them or wait for them all and answer. */
static enum MHD_Result handle_generate(srv_server *s, struct MHD_Connection *c, srv_request *rq, int chat) {
    srv_verr e = {0};
    srv_gen g = {0};
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g.client_fd = ci ? ci->connect_fd : -1;
    if (srv_gen_prepare(s, rq, chat, &g, &e)) {
        if (e.status == 499) return MHD_NO; /* nobody to answer */
        return srv_send_verr(s, c, &e);
    }
    srv_log_unknown(s, &e, g.rs[0]->id, chat ? "chat" : "completion");
    if (srv_sched_submit_many(s, g.rs, g.n_rs) != 0) {
        srv_gen_free(&g);
        return srv_send_error(s, c, 503,
                              atomic_load(&s->accepting) ? "server overloaded: the waiting queue is full, retry later"
                                                         : "server is shutting down",
                              NULL);
    }
    if (g.stream) return srv_sse_respond(s, c, &g);
    int gone = srv_gen_wait(s, c, &g);
    srv_log_done(s, &g, chat ? "chat" : "completion");
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
    else if (atomic_load(&s->unusable) && (worst != SRV_FIN_NONE || !all_done(&g)))
        mr = srv_send_error(s, c, 503, s->unusable_why, NULL);
    else if (worst == SRV_FIN_ERROR)
        mr = srv_send_error(s, c, 500, msg && msg[0] ? msg : "generation failed", NULL);
    else if (worst == SRV_FIN_ABORT)
        mr = srv_send_error(s, c, 503, "request cancelled: the server is shutting down", NULL);
    else
        mr = srv_send_json(s, c, 200, srv_full_response(s, &g));
    srv_gen_free(&g);
    return mr;
}

enum MHD_Result srv_handle_completions(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    return handle_generate(s, c, rq, 0);
}

enum MHD_Result srv_handle_chat(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    return handle_generate(s, c, rq, 1);
}

/* A prepared request is freed instead of being submitted. */
static int check_generate(srv_server *s, srv_request *rq, int chat, srv_verr *e) {
    srv_gen g = {0};
    int rc = srv_gen_prepare(s, rq, chat, &g, e);
    if (!rc) srv_gen_free(&g);
    return rc;
}

int srv_check_completions(srv_server *s, srv_request *rq, srv_verr *e) {
    return check_generate(s, rq, 0, e);
}

int srv_check_chat(srv_server *s, srv_request *rq, srv_verr *e) {
    return check_generate(s, rq, 1, e);
}
