/*
 * server/: the leaf utilities every other server/ file may call (and that
 * call no other server/ file): the clock, the log line, the finish names,
 * the engine's usability flag and the hung-up-client probe.
 */
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>

#include "server/internal.h"

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *srv_finish_name(srv_finish f) {
    switch (f) {
    case SRV_FIN_STOP: return "stop";
    case SRV_FIN_LENGTH: return "length";
    case SRV_FIN_ABORT: return "abort";
    case SRV_FIN_ERROR: return "error";
    default: return "none";
    }
}

void srv_log(const srv_server *s, srv_log_level lvl, const char *fmt, ...) {
    if (s && lvl < s->opt.log_level) return;
    static const char *names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%H:%M:%S", &tm);
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s %s echo-serve: %s\n", ts, names[lvl], line);
}

void srv_set_unusable(srv_server *s, const char *why) {
    int expect = 0;
    if (!atomic_compare_exchange_strong(&s->unusable_claim, &expect, 1)) return;
    snprintf(s->unusable_why, sizeof s->unusable_why, "%s", why);
    atomic_store(&s->unusable, 1);
    srv_log(s, SRV_LOG_ERROR, "the engine can run no more steps (%s): /health answers 503; restart the server",
            s->unusable_why);
}

int srv_usable(srv_server *s) {
    char why[480];
    /* ready: the loader has stored s->eng */
    if (!atomic_load(&s->unusable) && atomic_load(&s->ready) && !eng_ranks_alive(s->eng, why, sizeof why))
        srv_set_unusable(s, why);
    return !atomic_load(&s->unusable);
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
