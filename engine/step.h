/*
 * Private to engine/ (and its tests): one rank's step runner.
 *
 * A step is one forward pass of a rank's model over a batch. The model only
 * emits the pass's ops (model.h: model_pass_prepare / _ops / _out); the
 * runner owns everything around them, in one place, and crosses into comm/
 * through the pass alone (echo.h: echo_begin_pass in EAGER, CAPTURE or
 * REPLAY mode, the model's all-reduces, echo_end_pass, which votes,
 * launches or takes back a graphed pass, waits and aborts), plus echo_abort
 * for a failure outside the pass. With graphs on, a decode step is a
 * backend graph (kern_ops.graph_*): captured once per batch shape, then
 * replayed, and run eagerly after any failure. The design is in
 * engine/README.md ("The step").
 */
#ifndef ECHO_ENGINE_STEP_H
#define ECHO_ENGINE_STEP_H

#include <stdint.h>

#include "model/model.h"

struct eng_overlap;

typedef struct eng_runner {
    model *m;
    const kern_ops *ops; /* the model's backend (its model_load_opts) */
    kern_backend *be;
    echo_comm *comm; /* the model's all-reduce endpoint; NULL at tp 1 */
    /* 1: decode steps through backend graphs (cuda only). A decode-only
     * step (one token per sequence, logits rows 0..r-1, no layer_states)
     * is recorded once per batch shape and replayed with one launch
     * afterwards; the logits are the same bits as an eager step. At tp > 1
     * only with a deferred comm (echo.h: the nccl transport), whose calls
     * are captured with the step. No effect on backends without graph ops
     * or for other steps. */
    int graphs;
    long graph_steps; /* steps that ran through a graph (captured or replayed) */
    int aborted;      /* the last step failed and aborted the all-reduce world */
    uint64_t moves;   /* times the model's activation buffers moved (part of a graph's key) */
    /* Prefill overlap (overlap.h): steps of enough tokens run as
     * micro-batches whose all-reduces hide behind the next one's compute;
     * NULL: every step is one pass. */
    struct eng_overlap *ov;
} eng_runner;

/* Run one step of r->m over b: logits (or candidates) as model_pass_out
 * writes them. Any failure inside a graph falls back to the eager pass; -1
 * only when the step failed. At tp > 1 a failed step aborts the world
 * (r->aborted = 1) so that no peer waits for this rank in a collective,
 * unless every rank failed alike (echo_end_pass): the caller re-arms it
 * once every rank has returned (threads.c, ranks_rearm). */
int eng_run_step(eng_runner *r, const model_batch *b, float *logits, char *err, size_t errlen);

/* Destroy the backend's graphs (kern_ops.graph_drop_all; decode steps are
 * captured anew), on the rank's own thread. No-op without graphs. */
void eng_runner_drop_graphs(eng_runner *r);

#endif
