/*
 * server/: where grammars compile. xgrammar's compile cannot be
 * interrupted and recurses on the caller's stack, so it never runs on an
 * HTTP connection thread (1 MiB stack): each compile gets its own thread
 * with SRV_COMPILE_STACK of stack, at the lowest CPU priority (nice 19, so
 * the decode threads keep their cores), at most --grammar-compiles at
 * once. The connection thread waits for it while polling its client, the
 * deadline (--grammar-compile-timeout) and shutdown; on any of them it
 * ABANDONS the compile: the thread runs to its end, keeps its slot until
 * then (so abandoned compiles still count against the limit) and frees
 * what it made. Abandon rather than a helper process: the schema walk's
 * budgets (structured.c) bound every accepted compile to a few seconds and
 * tens of MB, a compiled grammar lives in xgrammar's C++ objects that a
 * process boundary would have to serialize, and fork() from this
 * multi-threaded server is unsafe; so the process never needs killing.
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "server/internal.h"

struct srv_cpool {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a compile ended (its slot is free, its job done) */
    int running;       /* compile threads alive, abandoned ones included */
    int k;             /* at most this many at once */
};

typedef struct cjob {
    srv_cpool *pool;
    gram_vocab *v;
    gram_kind kind;
    char *src;
    size_t len;
    int done, abandoned; /* under pool->mu */
    int rc;
    gram_grammar *g;
    double sec;
    char err[400];
} cjob;

srv_cpool *srv_cpool_new(int k) {
    srv_cpool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->k = k > 0 ? k : 1;
    return p;
}

int srv_cpool_free(srv_cpool *p) {
    if (!p) return 0;
    pthread_mutex_lock(&p->mu);
    int live = p->running;
    pthread_mutex_unlock(&p->mu);
    if (live) return live; /* abandoned compiles still use it: left to the process's exit */
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
    return 0;
}

int srv_cpool_running(srv_cpool *p) {
    if (!p) return 0;
    pthread_mutex_lock(&p->mu);
    int n = p->running;
    pthread_mutex_unlock(&p->mu);
    return n;
}

static void job_free(cjob *j) {
    gram_grammar_free(j->g);
    free(j->src);
    free(j);
}

static void *compile_main(void *arg) {
    cjob *j = arg;
    srv_cpool *p = j->pool;
    /* Linux: nice is per thread; xgrammar's own threads would inherit it. */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    j->rc = gram_compile(j->v, j->kind, j->src, j->len, &j->g, &j->sec, j->err, sizeof j->err);
    pthread_mutex_lock(&p->mu);
    int abandoned = j->abandoned;
    j->done = 1;
    pthread_mutex_unlock(&p->mu);
    if (abandoned) job_free(j); /* nobody waits for it any more */
    /* What a large compile took from the heap goes back to the system. */
    malloc_trim(0);
    pthread_mutex_lock(&p->mu);
    p->running--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void deadline_in(struct timespec *ts, long ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += ms * 1000000L;
    while (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void count_drop(srv_server *s, int i) {
    pthread_mutex_lock(&s->met.mu);
    s->met.gram_dropped[i]++;
    pthread_mutex_unlock(&s->met.mu);
}

/* Why a waiting request stops waiting, or NULL. */
static const char *wait_over(srv_server *s, int client_fd, double until, int *status) {
    if (client_fd > 0 && srv_client_gone(client_fd)) {
        *status = 499;
        return "the client closed the connection before its grammar was compiled";
    }
    if (!atomic_load(&s->accepting)) {
        *status = 503;
        return "server is shutting down";
    }
    if (srv_now() > until) {
        *status = 503;
        return NULL; /* the caller says which deadline */
    }
    return "";
}

int srv_compile_wait(srv_server *s, gram_vocab *v, int client_fd, gram_kind kind, const char *src, size_t len,
                     const char *param, gram_grammar **out, double *sec, srv_verr *e) {
    *out = NULL;
    srv_cpool *p = s->cpool;
    double t0 = srv_now(), until = t0 + s->opt.grammar_timeout_s;
    int status = 0;
    const char *why = wait_over(s, client_fd, until, &status);
    if (why && *why) {
        if (status == 499) count_drop(s, 0);
        return srv_fail(e, status, param, "%s", why);
    }
    cjob *j = calloc(1, sizeof *j);
    if (!j || !(j->src = malloc(len + 1))) {
        free(j);
        return srv_fail(e, 500, param, "out of memory");
    }
    memcpy(j->src, src ? src : "", len);
    j->src[len] = 0;
    j->pool = p;
    j->v = v;
    j->kind = kind;
    j->len = len;
    pthread_mutex_lock(&p->mu);
    /* a slot */
    while (p->running >= p->k) {
        struct timespec ts;
        deadline_in(&ts, 100);
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        why = wait_over(s, client_fd, until, &status);
        if (!why || *why) {
            pthread_mutex_unlock(&p->mu);
            job_free(j);
            if (!why || status == 499) count_drop(s, why ? 0 : 2);
            if (!why)
                return srv_fail(e, 503, param,
                                "grammar compiles are busy: no slot of --grammar-compiles %d freed within "
                                "--grammar-compile-timeout %g s; retry later",
                                p->k, s->opt.grammar_timeout_s);
            return srv_fail(e, status, param, "%s", why);
        }
    }
    pthread_attr_t at;
    pthread_t th;
    int ok = pthread_attr_init(&at) == 0;
    if (ok) {
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, SRV_COMPILE_STACK);
        ok = pthread_create(&th, &at, compile_main, j) == 0;
        pthread_attr_destroy(&at);
    }
    if (!ok) {
        pthread_mutex_unlock(&p->mu);
        job_free(j);
        return srv_fail(e, 503, param, "cannot start a grammar compile thread; retry later");
    }
    p->running++;
    while (!j->done) {
        struct timespec ts;
        deadline_in(&ts, 100);
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        if (j->done) break;
        why = wait_over(s, client_fd, until, &status);
        if (!why || *why) {
            j->abandoned = 1; /* the thread frees it */
            pthread_mutex_unlock(&p->mu);
            count_drop(s, 1);
            if (!why)
                return srv_fail(e, 503, param,
                                "the grammar did not compile within --grammar-compile-timeout %g s (abandoned)",
                                s->opt.grammar_timeout_s);
            return srv_fail(e, status, param, "%s", why);
        }
    }
    pthread_mutex_unlock(&p->mu);
    int rc = j->rc;
    if (rc == GRAM_OK) {
        *out = j->g;
        j->g = NULL;
        *sec = j->sec;
    } else {
        srv_fail(e, rc == GRAM_EINVAL ? 400 : 500, param, "%s", j->err);
    }
    job_free(j);
    return rc == GRAM_OK ? 0 : -1;
}
