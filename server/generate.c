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
    else if (atomic_load(&s->unusable) && (worst != SRV_FIN_NONE || !srv_gen_all_done(&g)))
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
