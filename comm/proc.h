/*
 * comm/proc.h — the multi-process control plane: ranks as processes under
 * mpirun (comm/proc.c). Not the all-reduce (comm/echo.h): the control
 * messages the engine's ranks exchange beside it (a step's batch from rank
 * 0, results back to it, agreement on failures), and the MPI session that
 * the mpi and nccl-across-processes transports run in.
 *
 * Callers: tools/cli.c starts and ends the session (echo_proc_init first
 * thing in main, echo_proc_finalize at exit); engine/ (ranks as processes)
 * and comm/transport/nccl.c exchange control messages.
 *
 * Rules
 *   - Calls are collective: the same calls in the same order on every
 *     process, one thread at a time (MPI_THREAD_SERIALIZED), on a
 *     communicator of their own, never mixed with the all-reduce's.
 *   - Without mpirun: rank 0 of 1, every call a no-op.
 *   - A failure (a peer died) is -1 with a message in err; nothing prints or
 *     exits, but echo_proc_abort, which ends the whole job on purpose.
 */
#ifndef ECHO_COMM_PROC_H
#define ECHO_COMM_PROC_H

#include <stddef.h>

int echo_proc_init(int *rank, int *nprocs, char *err, size_t errlen);
int echo_proc_rank(void);  /* 0 without a session */
int echo_proc_count(void); /* 1 without a session */
/* rank 0's `bytes` at buf, to every process */
int echo_proc_bcast(void *buf, size_t bytes, char *err, size_t errlen);
/* every process's `bytes` at send into rank 0's recv (nprocs * bytes, rank order) */
int echo_proc_gather(const void *send, size_t bytes, void *recv, char *err, size_t errlen);
/* every process's `bytes` at send into every process's recv (nprocs * bytes) */
int echo_proc_allgather(const void *send, size_t bytes, void *recv, char *err, size_t errlen);
/* 0 when every process passed ok != 0; else -1 on every process, with
 * "process R: why" of the lowest failed rank */
int echo_proc_agree(int ok, const char *why, char *err, size_t errlen);
/* Print why and end every process of the job (MPI_Abort): for a rank that
 * cannot continue while its peers may wait in a collective. Returns only
 * without a session (the caller then exits). */
void echo_proc_abort(int code, const char *why);
/* 1 while every peer process on this host (same pid namespace) runs; 0 with
 * "rank R (pid P on HOST) has exited..." once one has ended. No MPI call:
 * safe from any thread, for a health check while a step waits on the dead
 * rank. Peers on other hosts cannot be seen from here (mpirun ends the job). */
int echo_proc_peers_alive(char *why, size_t len);
void echo_proc_finalize(void);

#endif
