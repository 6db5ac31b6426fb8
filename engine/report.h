/*
 * engine/report.h — what an engine runs and what it has done: the choices
 * eng_create resolved (all-reduce, graphs, passes, overlap, one-shot), the
 * memory each rank holds, all-reduce statistics, health, and a step that
 * also returns every layer's residual stream (accuracy reports). For
 * start-up reports, logs, metrics and tests; none of it is needed to step.
 */
#ifndef ECHO_ENGINE_REPORT_H
#define ECHO_ENGINE_REPORT_H

#include <stddef.h>

#include "comm/echo.h"
#include "engine/engine.h"

/* 1 with the figures and the choice when the engine chose its all-reduce
 * (eng_config.allreduce_auto at tp > 1 on host memory: `allreduce` then
 * holds the preset it chose), else 0. */
int eng_allreduce_auto(const eng *e, echo_auto_figures *f, echo_auto_choice *c);
/* NULL when cfg.cuda_graphs is off or takes effect; else a sentence saying
 * why it has no effect (device not cuda, local transport at tp > 1), for
 * tools to print. */
const char *eng_graphs_note(const eng *e);
/* Steps rank 0 ran through a CUDA graph so far (0 when graphs are off or
 * unavailable). */
long eng_graph_steps(const eng *e);
/* Failed steps (tp > 1) that aborted the all-reduce world and re-armed it
 * (echo_world_clear_abort; on nccl that re-creates the communicators, about
 * seconds). A non-finite all-reduce, which every rank reports alike, fails
 * its step without an abort and is not counted. */
long eng_comm_resets(const eng *e);
/* Ranks as processes: 0 with the reason once a peer process on this host
 * has exited (a step then waits on it until mpirun ends the job), else 1.
 * Thread-safe and cheap: for a health check while a step may be blocked. */
int eng_ranks_alive(const eng *e, char *why, size_t len);

/* C (eng_config.pass_tokens) when steps run in the passes engine.h
 * describes (ENG_PASS_TOKENS), else 0 (exact
 * on cpu threads, tp 1: one pass per step, whatever the batch). */
int eng_pass_tokens(const eng *e);
/* The most micro-batches a prefill step runs (eng_config.overlap resolved;
 * 1: overlap off); a step of n tokens runs min(that, n / 64), at least 1
 * (64: eng_config.overlap_min_rows). */
int eng_overlap_k(const eng *e);
/* What an engine's all-reduce runs one-shot: calls of at most this many
 * bytes of fp32 (0: none; the environment override and the preset
 * included: bf16 keeps two-shot). */
size_t eng_oneshot_bytes(const eng *e);

/* eng_step, also copying rank 0's residual stream after every layer into
 * layer_states (num_layers, total tokens of the step, hidden). */
int eng_step_states(eng *e, const eng_item *items, int n_items, float *logits, float *layer_states, char *err,
                    size_t errlen);

/* Memory one rank holds: its weight slices, its KV cache, its all-reduce
 * residual slots (start-up report). */
typedef struct eng_rank_info {
    size_t weight_bytes, kv_bytes, slot_bytes;
    size_t embed_bytes; /* the embedding table's share of weight_bytes (a decode step reads a few rows of it) */
    int act_q8_matrices; /* matrices multiplied against 8-bit activations (eng_config.act_quant) */
} eng_rank_info;
void eng_get_rank_info(const eng *e, int rank, eng_rank_info *out);

/* What the all-reduce runs (the world's configuration, defaults, the tail
 * policy and $ECHO_TAIL resolved; echo_config_bits, echo_config_describe
 * say it for logs): -1 with *out zeroed at tp 1. */
int eng_allreduce_config(const eng *e, echo_config *out);

/* Sum of all ranks' all-reduce statistics. */
void eng_comm_stats(const eng *e, echo_stats *out);

#endif
