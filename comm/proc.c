/*
 * comm/proc.c — the process's MPI session (comm/proc.h): starting
 * MPI under mpirun, and the control messages the engine's ranks exchange
 * outside the all-reduce (a step's batch from rank 0, results back to it,
 * agreement on failures). The session is the one piece of process-wide
 * state in comm/: MPI itself is per process, initialised once.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/proc.h"

#ifdef ECHO_HAVE_MPI
#include <limits.h>
#include <mpi.h>

#include <signal.h>
#include <unistd.h>

/* Where a process runs, for echo_proc_peers_alive: its pid is only
 * meaningful to a process on the same host and in the same pid namespace. */
typedef struct proc_where {
    int32_t pid;
    char host[64];
    char pidns[40];
} proc_where;

static struct {
    int started; /* we called MPI_Init_thread */
    int rank, n;
    MPI_Comm ctl;      /* control messages: a duplicate of MPI_COMM_WORLD, errors returned */
    proc_where *where; /* every process's, from echo_proc_init; read-only after it */
} sess = {0, 0, 1, MPI_COMM_NULL, NULL};

static void where_of_self(proc_where *w) {
    memset(w, 0, sizeof *w);
    w->pid = (int32_t)getpid();
    if (gethostname(w->host, sizeof w->host - 1)) snprintf(w->host, sizeof w->host, "?");
    ssize_t n = readlink("/proc/self/ns/pid", w->pidns, sizeof w->pidns - 1);
    w->pidns[n > 0 ? n : 0] = 0;
}

/* A process of this host that has ended: gone, or a zombie not yet reaped. */
static int local_pid_ended(int32_t pid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return kill((pid_t)pid, 0) != 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces */
    return rp && (rp[2] == 'Z' || rp[2] == 'X');
}

static int proc_fail(int rc, const char *what, char *err, size_t errlen) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    snprintf(err, errlen, "mpi: %s failed (a peer process died or the job is ending?): %s", what, msg);
    return -1;
}

int echo_proc_init(int *rank, int *nprocs, char *err, size_t errlen) {
    *rank = sess.rank;
    *nprocs = sess.n;
    if (sess.ctl != MPI_COMM_NULL) return 0;
    const char *env = getenv("OMPI_COMM_WORLD_SIZE");
    if (!env || !*env) return 0; /* not launched by mpirun: one process */
    int inited = 0, level = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &level)) != MPI_SUCCESS)
            return proc_fail(rc, "MPI_Init_thread", err, errlen);
        sess.started = 1;
    } else {
        MPI_Query_thread(&level);
    }
    /* serialized: a server's engine runs on its scheduler thread, not main */
    if (level < MPI_THREAD_SERIALIZED) {
        snprintf(err, errlen, "mpi: MPI_THREAD_SERIALIZED is not available (got level %d)", level);
        return -1;
    }
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &sess.ctl)) != MPI_SUCCESS) {
        sess.ctl = MPI_COMM_NULL;
        return proc_fail(rc, "MPI_Comm_dup", err, errlen);
    }
    MPI_Comm_set_errhandler(sess.ctl, MPI_ERRORS_RETURN);
    MPI_Comm_rank(sess.ctl, &sess.rank);
    MPI_Comm_size(sess.ctl, &sess.n);
    proc_where me;
    where_of_self(&me);
    if (!(sess.where = calloc((size_t)sess.n, sizeof *sess.where))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    rc = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, sess.where, (int)sizeof me, MPI_BYTE, sess.ctl);
    if (rc != MPI_SUCCESS) return proc_fail(rc, "MPI_Allgather", err, errlen);
    *rank = sess.rank;
    *nprocs = sess.n;
    return 0;
}

int echo_proc_rank(void) { return sess.rank; }
int echo_proc_count(void) { return sess.n; }

int echo_proc_peers_alive(char *why, size_t len) {
    if (!sess.where) return 1;
    const proc_where *me = &sess.where[sess.rank];
    for (int r = 0; r < sess.n; r++) {
        const proc_where *p = &sess.where[r];
        if (r == sess.rank || strcmp(p->host, me->host) || strcmp(p->pidns, me->pidns)) continue;
        if (local_pid_ended(p->pid)) {
            if (why && len)
                snprintf(why, len, "rank %d (pid %d on %s) has exited; the job cannot go on and mpirun ends it", r,
                         (int)p->pid, p->host);
            return 0;
        }
    }
    return 1;
}

void echo_proc_finalize(void) {
    free(sess.where);
    sess.where = NULL;
    if (sess.ctl != MPI_COMM_NULL) MPI_Comm_free(&sess.ctl);
    sess.ctl = MPI_COMM_NULL;
    if (sess.started) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
        sess.started = 0;
    }
    sess.rank = 0;
    sess.n = 1;
}

void echo_proc_abort(int code, const char *why) {
    if (why) fprintf(stderr, "rank %d: %s: ending every process of the job\n", sess.rank, why);
    if (sess.ctl != MPI_COMM_NULL) MPI_Abort(MPI_COMM_WORLD, code);
}

/* Collectives move at most 1 GiB per MPI call (int counts). */
#define CHUNK ((size_t)1 << 30)

int echo_proc_bcast(void *buf, size_t bytes, char *err, size_t errlen) {
    if (sess.ctl == MPI_COMM_NULL || sess.n == 1) return 0;
    for (size_t off = 0; off < bytes; off += CHUNK) {
        size_t n = bytes - off < CHUNK ? bytes - off : CHUNK;
        int rc = MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, 0, sess.ctl);
        if (rc != MPI_SUCCESS) return proc_fail(rc, "MPI_Bcast", err, errlen);
    }
    return 0;
}

int echo_proc_gather(const void *send, size_t bytes, void *recv, char *err, size_t errlen) {
    if (sess.ctl == MPI_COMM_NULL || sess.n == 1) {
        if (bytes) memcpy(recv, send, bytes);
        return 0;
    }
    if (bytes > INT_MAX) {
        snprintf(err, errlen, "mpi: gather of %zu bytes per process is more than one MPI call carries", bytes);
        return -1;
    }
    int rc = MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, 0, sess.ctl);
    return rc == MPI_SUCCESS ? 0 : proc_fail(rc, "MPI_Gather", err, errlen);
}

int echo_proc_allgather(const void *send, size_t bytes, void *recv, char *err, size_t errlen) {
    if (sess.ctl == MPI_COMM_NULL || sess.n == 1) {
        if (bytes) memcpy(recv, send, bytes);
        return 0;
    }
    if (bytes > INT_MAX / (size_t)sess.n) {
        snprintf(err, errlen, "mpi: all-gather of %zu bytes per process is more than one MPI call carries", bytes);
        return -1;
    }
    int rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, sess.ctl);
    return rc == MPI_SUCCESS ? 0 : proc_fail(rc, "MPI_Allgather", err, errlen);
}

int echo_proc_agree(int ok, const char *why, char *err, size_t errlen) {
    if (sess.ctl == MPI_COMM_NULL || sess.n == 1) {
        if (!ok) snprintf(err, errlen, "%s", why ? why : "failed");
        return ok ? 0 : -1;
    }
    /* every process learns the lowest failed rank and its message */
    struct {
        int32_t ok;
        char why[476];
    } mine = {ok != 0, ""}, *all = calloc((size_t)sess.n, sizeof *all);
    if (!all) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (!ok) snprintf(mine.why, sizeof mine.why, "%s", why ? why : "failed");
    int rc = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, sess.ctl);
    if (rc != MPI_SUCCESS) {
        free(all);
        return proc_fail(rc, "MPI_Allgather", err, errlen);
    }
    int bad = -1;
    for (int r = 0; r < sess.n && bad < 0; r++)
        if (!all[r].ok) bad = r;
    if (bad >= 0) snprintf(err, errlen, "process %d: %s", bad, all[bad].why);
    free(all);
    return bad < 0 ? 0 : -1;
}

#else /* !ECHO_HAVE_MPI: always one process */

int echo_proc_init(int *rank, int *nprocs, char *err, size_t errlen) {
    *rank = 0;
    *nprocs = 1;
    const char *env = getenv("OMPI_COMM_WORLD_SIZE");
    if (env && strcmp(env, "1") != 0) {
        snprintf(err, errlen,
                 "started by mpirun with %s processes, but this build has no MPI (install openmpi-bin and "
                 "libopenmpi-dev, then rebuild)",
                 env);
        return -1;
    }
    return 0;
}
int echo_proc_rank(void) { return 0; }
int echo_proc_count(void) { return 1; }
int echo_proc_peers_alive(char *why, size_t len) {
    (void)why, (void)len;
    return 1;
}
void echo_proc_finalize(void) {}
void echo_proc_abort(int code, const char *why) {
    (void)code;
    if (why) fprintf(stderr, "%s\n", why);
}
int echo_proc_bcast(void *buf, size_t bytes, char *err, size_t errlen) {
    (void)buf, (void)bytes, (void)err, (void)errlen;
    return 0;
}
int echo_proc_gather(const void *send, size_t bytes, void *recv, char *err, size_t errlen) {
    (void)err, (void)errlen;
    if (bytes) memcpy(recv, send, bytes);
    return 0;
}
int echo_proc_allgather(const void *send, size_t bytes, void *recv, char *err, size_t errlen) {
    (void)err, (void)errlen;
    if (bytes) memcpy(recv, send, bytes);
    return 0;
}
int echo_proc_agree(int ok, const char *why, char *err, size_t errlen) {
    if (!ok) snprintf(err, errlen, "%s", why ? why : "failed");
    return ok ? 0 : -1;
}

#endif
