/*
 * comm/transport/transport.h — each transport's own constructor (local.c,
 * local_cuda.c, nccl.c, mpi.c). Programs do not call these: they pick a
 * row of the transport table and call echo_world_create (comm/echo.h),
 * whose rows (comm/transport/transport.c) call them; tests call them
 * directly to reach one transport. docs/echo.md §11 has each transport's
 * details. Each fails with a message on a config it cannot run (a
 * host-only codec on device memory fails at echo_comm_create).
 */
#ifndef ECHO_COMM_TRANSPORT_TRANSPORT_H
#define ECHO_COMM_TRANSPORT_TRANSPORT_H

#include <stddef.h>

#include "comm/echo.h"

/* local: nranks threads of this process, buffers in host memory. */
int echo_world_create_local(int nranks, const echo_config *cfg, echo_world **out, char *err, size_t errlen);
/* local on GPU `device`, shared by nranks threads (tests): buffers are
 * device pointers, `stream` each rank's cudaStream_t; local's bits. Fails
 * without CUDA or a GPU. */
int echo_world_create_local_device(int nranks, int device, const echo_config *cfg, echo_world **out, char *err,
                                   size_t errlen);
/* nccl: rank r on GPU devices[r], all driven from this process; buffers are
 * device pointers, `stream` the rank's cudaStream_t. 4-bit codecs give
 * local's bits, none is ncclAllReduce. Fails without CUDA. */
int echo_world_create_nccl(int nranks, const int *devices, const echo_config *cfg, echo_world **out, char *err,
                           size_t errlen);
/* nccl transport with one rank per process (under mpirun, after
 * echo_proc_init): nranks = the job's processes, rank = this process's,
 * `device` its GPU. Rank 0 makes the ncclUniqueId, MPI broadcasts it, each
 * process calls ncclCommInitRank, so the ranks may span hosts. Calls are
 * checked with the peers over MPI before anything is enqueued; not deferred
 * (no CUDA graphs at tp > 1 yet); an abort cannot be undone in place
 * (echo_world_clear_abort leaves the world unusable: restart the job).
 * Untested on GPUs so far (docs/network.md, "NCCL across processes"). */
int echo_world_create_nccl_procs(int device, const echo_config *cfg, echo_world **out, char *err, size_t errlen);
/* mpi: this process is rank MPI_COMM_WORLD's rank, host memory; collective
 * over MPI_COMM_WORLD, which the program initialised (MPI_THREAD_FUNNELED
 * or better; echo calls from that thread). local's bits but for `none`.
 * No deferred worlds. Fails without Open MPI (MPI=0). */
int echo_world_create_mpi(const echo_config *cfg, echo_world **out, char *err, size_t errlen);

#endif
