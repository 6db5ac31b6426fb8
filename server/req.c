/*
 * server/: a request's lifetime (srv_req) and its choices' shared notifier
 * (srv_group): creation, reference counting, release.
 */
#include <stdlib.h>

#include "server/internal.h"

srv_group *srv_group_new(void) {
    srv_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    return g;
}

void srv_group_notify(srv_group *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->version++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void srv_group_unref(srv_group *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left > 0) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

srv_req *srv_req_new(void) {
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->seq = -1;
    r->rep_penalty = 1;
    r->plp_k = -1;
    r->stop_str = -1;
    r->stop_tok = -1;
    r->think_budget = -1;
    atomic_init(&r->n_think, 0);
    atomic_init(&r->cancelled, 0);
    atomic_init(&r->n_reused, 0);
    return r;
}

void srv_req_unref(srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop_ids);
    free(r->toks);
    free(r->text);
    free(r->all);
    free(r->gen);
    free(r->prompt_lp);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->forced);
    tok_stream_free(r->ds);
    gram_matcher_free(r->gm);
    gram_grammar_free(r->gram);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    srv_group_unref(r->grp);
    free(r);
}
