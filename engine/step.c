/*
 * engine/: one rank's step runner (see step.h): the model's pass wrapped in
 * the all-reduce pass, and decode steps as backend graphs.
 */
#include <stdio.h>

#include "engine/step.h"

void eng_runner_drop_graphs(eng_runner *r) {
    if (r->ops->graph_drop_all) r->ops->graph_drop_all(r->be);
}

/* Whether this step may go through a backend graph, and its key. Only
 * decode-only steps (one token per sequence, logits rows 0..r-1) without
 * layer states: a prefill's shapes change every step, and layer states
 * copy to the host mid-pass. At tp > 1 graphs are only turned on for a
 * deferred comm (nccl), whose calls enqueue without reading anything back.
 * The key holds everything that fixes the captured launches: batch size,
 * table width (the attention's split and staged sizes), the logits rows,
 * the activation buffers' generation (their pointers) plus the comm's epoch
 * (its communicators: re-created after an abort); weights, caches and the
 * backend's own buffers are fixed or tracked by the backend. One model per
 * backend (as the engine has), so keys do not collide. */
static int graph_key(const eng_runner *r, const model_batch *b, uint64_t *key) {
    const kern_ops *ops = r->ops;
    if (!r->graphs || b->layer_states || !ops->graph_begin || !ops->graph_end || !ops->graph_abort ||
        !ops->graph_launch)
        return 0;
    if (b->n_seqs >= (1 << 16) || b->n_logit_rows >= (1 << 16) || b->max_blocks >= (1 << 20)) return 0;
    for (int s = 0; s < b->n_seqs; s++)
        if (b->q_start[s + 1] - b->q_start[s] != 1) return 0;
    for (int i = 0; i < b->n_logit_rows; i++)
        if (b->logit_rows[i] != i) return 0;
    uint64_t gen = r->moves + (r->comm ? echo_comm_epoch(r->comm) : 0);
    *key = (uint64_t)b->n_seqs | (uint64_t)b->n_logit_rows << 16 | (uint64_t)b->max_blocks << 32 | (gen & 0xfff) << 52;
    return 1;
}

static int graph_launch_cb(void *arg, char *err, size_t errlen) {
    eng_runner *r = arg;
    if (r->ops->graph_launch(r->be) == 0) return 0;
    snprintf(err, errlen, "%s backend: %s", r->ops->name, kern_last_error(r->be));
    return -1;
}

/* Launch the step's ready graph. At tp > 1 it holds this rank's NCCL
 * kernels: launched through the comm, which refuses while the world is
 * aborted (its communicators are gone). */
static int graph_launch(eng_runner *r, char *err, size_t errlen) {
    if (!r->comm) return graph_launch_cb(r, err, errlen);
    return echo_launch_external(r->comm, graph_launch_cb, r, err, errlen);
}

/* The step as a graph when graph_key allows: 1 when a graph ran it, 0 when
 * it must run eagerly (nothing of it ran: a capture executes nothing, a
 * replay launched nothing, so the KV cache is untouched), -1 on failure. */
static int graph_step(eng_runner *r, const model_batch *b, char *err, size_t errlen) {
    const kern_ops *ops = r->ops;
    uint64_t key;
    if (!graph_key(r, b, &key)) return 0;
    /* Recorded once per key, then replayed (kern_ops.graph_begin). At
     * tp > 1 the all-reduce calls are captured too (a deferred comm); a
     * replay's calls are only checked with the peers (echo_set_replay), and
     * a step redone eagerly tells the peers to expect its calls again
     * (echo_discard_pass). */
    int replaying = 0, g = ops->graph_begin(r->be, key, &replaying), mine = 0, agreed = 0;
    if (g == 0 && (!r->comm || !replaying || echo_set_replay(r->comm, 1, err, errlen) == 0) &&
        model_pass_ops(r->m, b, err, errlen) == 0 && ops->graph_end(r->be) == 0)
        mine = replaying ? 2 : 1; /* a graph is ready: replayed (2) or freshly captured (1) */
    /* NCCL wants a captured collective launched by all its ranks, each from
     * the graph of the same capture: launch only when every rank holds the
     * same kind of graph (echo_vote); else all drop theirs (captured again
     * later, together) and run the step eagerly. */
    if (!r->comm)
        agreed = mine != 0;
    else if (echo_vote(r->comm, mine, &agreed, err, errlen))
        return -1; /* the world was aborted */
    if (agreed && graph_launch(r, err, errlen) == 0) {
        r->graph_steps++;
        return 1;
    }
    if (agreed && r->comm) return -1; /* the peers launched theirs: this rank cannot run the step eagerly instead */
    if (g == 0) ops->graph_abort(r->be);
    if (r->comm) {
        echo_discard_pass(r->comm);
        if (echo_begin_pass(r->comm, err, errlen)) return -1;
    }
    return 0;
}

static int run_step(eng_runner *r, const model_batch *b, float *logits, char *err, size_t errlen) {
    /* Graphs address the activation buffers: destroy them before the
     * buffers go. NCCL may have registered a buffer for a captured
     * all-reduce (NCCL_GRAPH_REGISTER), and a registration that outlives its
     * memory can be taken for a new allocation at the same address. */
    if (model_pass_moves_buffers(r->m, b)) {
        if (r->graphs) eng_runner_drop_graphs(r);
        r->moves++; /* graphs captured with the old buffers must not replay */
    }
    if (model_pass_prepare(r->m, b, err, errlen)) return -1;
    /* Echo's residual slots carry error from call to call within one pass
     * only: every pass starts clean. */
    if (r->comm && echo_begin_pass(r->comm, err, errlen)) return -1;
    int graphed = graph_step(r, b, err, errlen);
    if (graphed < 0 || (!graphed && model_pass_ops(r->m, b, err, errlen))) return -1;
    /* A deferred comm: the pass's all-reduces complete here (an abortable
     * wait, and their non-finite check) before anything is read back. */
    if (r->comm && echo_end_pass(r->comm, r->ops->stream(r->be), err, errlen)) return -1;
    return model_pass_out(r->m, b, logits, err, errlen);
}

int eng_run_step(eng_runner *r, const model_batch *b, float *logits, char *err, size_t errlen) {
    r->aborted = 0;
    if (run_step(r, b, logits, err, errlen) == 0) return 0;
    /* Peers waiting for this rank in a collective must fail, not hang:
     * abort the world, unless every rank reported this failure alike (a
     * non-finite sum), which leaves them in step; on nccl an abort costs
     * re-creating the communicators. */
    r->aborted = r->comm && !echo_pass_failed_alike(r->comm);
    if (r->aborted) echo_abort(r->comm);
    return -1;
}
