/*
 * server/: a generation request's runs once submitted: the INFO line at the
 * end, cancelling them, and the whole answer's wait (a client that hangs up
 * meanwhile has its runs cancelled). Shared by generate.c, sse.c and
 * responses.c.
 */
#include <stdio.h>
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

int srv_gen_all_done(srv_gen *g) {
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
        if (srv_gen_all_done(&g)) break;
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
