/*
 * Private to engine/ (and its tests): prefill overlap, one micro-batch's
 * all-reduce behind the next one's compute.
 *
 * A step of enough tokens runs as k micro-batches of consecutive rows
 * (model_pass_split), interleaved site by site over the model's all-reduce
 * sites (model_pass_sites: the model's family lays them out; the driver
 * only counts what the model says): micro-batch i computes its
 * block up to the partial sum and hands the all-reduce to the rank's
 * communication thread, then micro-batch i+1 computes while it runs. Each
 * micro-batch all-reduces on its own echo_comm, one per world (the
 * engine's world for micro-batch 0, one more world per further
 * micro-batch), so each has its own pass and its own residual: Echo's error
 * feedback runs along each micro-batch's chain of sites as it does along a
 * whole pass's. The communication thread makes every call of the pass, in
 * one order on every rank (micro-batch 0 site s, 1 site s, ..., 0 site
 * s+1, ...); the rank's thread only begins and ends the passes, while that
 * thread is idle, so MPI sees one thread at a time (MPI_THREAD_SERIALIZED).
 * The codec runs on the communication thread alone (no workers: the
 * rank's compute threads are busy with the next micro-batch).
 *
 * Bits: a row's ops are the serial pass's (model.h), and the exact and
 * bf16 all-reduces sum each element over the ranks in rank order whatever
 * the message (local; mpi's exact only with $ECHO_MPI_EXACT=twoshot or at
 * tp 2, MPI_Allreduce picks its own order), so their logits are the
 * serial pass's bits. A 4-bit codec's bits depend on the message layout
 * (engine.h, "Passes under a layout-dependent all-reduce"): micro-batches
 * give other bits, of the same accuracy.
 */
#ifndef ECHO_ENGINE_OVERLAP_H
#define ECHO_ENGINE_OVERLAP_H

#include "comm/echo.h"
#include "engine/step.h"
#include "model/model.h"

/* Rows below which a micro-batch is not worth its all-reduce's fixed
 * cost: a step runs min(k, tokens / ENG_OVERLAP_MIN_ROWS) micro-batches
 * (eng_config.overlap_min_rows overrides it). */
#define ENG_OVERLAP_MIN_ROWS 64

/* eng_config.overlap values besides a count. */
#define ENG_OVERLAP_AUTO 0
#define ENG_OVERLAP_OFF (-1)

/* The micro-batch count of an engine (1: off) for its configuration:
 * `overlap` (ENG_OVERLAP_AUTO, ENG_OVERLAP_OFF or a count 1..MODEL_MAX_MB),
 * tp, whether ranks are processes (procs) and whether the transport works
 * on host memory. Auto: 2 for ranks as processes on host memory (the mpi
 * transport, where the link is a network worth hiding), else 1 (threads on
 * one host: the all-reduce is a memory copy on the cores the compute
 * needs). Device memory: 1 (its calls enqueue on the rank's stream). */
int eng_overlap_plan(int overlap, int tp, int procs, int host_memory);

typedef struct eng_overlap eng_overlap;

/* A rank's overlap: comms[0..k-1] (comms[0] the rank's own, whose workers
 * `w0` are taken off during an overlapped pass and put back after), and
 * its communication thread. It owns comms[1..k-1] once created (destroy
 * frees them); on failure the caller still does. */
int eng_overlap_create(echo_comm *const *comms, int k, int min_rows, const echo_workers *w0, eng_overlap **out,
                       char *err, size_t errlen);
void eng_overlap_destroy(eng_overlap *ov);

/* The micro-batches a step over b runs: 1 (serial) for decode-size steps,
 * fewer than k * ENG_OVERLAP_MIN_ROWS tokens, or no overlap. */
int eng_overlap_count(const eng_overlap *ov, const model_batch *b);

/* One pass of r->m over b (after model_pass_prepare) as k micro-batches,
 * through model_pass_tail: 0, or -1 with r->aborted as eng_run_step sets
 * it. */
int eng_overlap_pass(eng_overlap *ov, eng_runner *r, const model_batch *b, int k, char *err, size_t errlen);

/* Adds the extra comms' (all but comms[0]) statistics to *s. */
void eng_overlap_add_stats(const eng_overlap *ov, echo_stats *s);

#endif
