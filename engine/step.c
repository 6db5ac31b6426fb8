/*
 * engine/: one rank's step runner (see step.h): the model's pass wrapped in
 * the all-reduce pass, and decode steps as backend graphs.
 */
#include <stdio.h>

#include "engine/overlap.h"
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
 * and the activation buffers' generation (their pointers); weights, caches
 * and the backend's own buffers are fixed or tracked by the backend. The
 * comm's communicators need no place in it: every graph is dropped before
 * they are re-created (echo_world_clear_abort). One model per backend (as
 * the engine has), so keys do not collide. */
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
    *key = (uint64_t)b->n_seqs | (uint64_t)b->n_logit_rows << 16 | (uint64_t)b->max_blocks << 32 |
           (r->moves & 0xfff) << 52;
    return 1;
}

/* Launch the step's ready graph (echo_pass_end.launch at tp > 1: its NCCL
 * kernels launch through the comm, which refuses while the world is
 * aborted). */
static int graph_launch(void *arg, char *err, size_t errlen) {
    eng_runner *r = arg;
    if (r->ops->graph_launch(r->be) == 0) return 0;
    snprintf(err, errlen, "%s backend: %s", r->ops->name, kern_last_error(r->be));
    return -1;
}

/* One pass of the model's ops, eagerly (key NULL) or as the graph of *key:
 * recorded once per key, then replayed (kern_ops.graph_begin); at tp > 1
 * the all-reduce calls are captured too (a deferred comm), and the comm's
 * pass decides whether the graphs launch (echo_end_pass). 0 done; 1 no
 * graph ran and nothing of the step did (a capture executes nothing, a
 * replay launched nothing, so the KV cache is untouched): run it eagerly;
 * -1 failed. */
static int run_pass(eng_runner *r, const model_batch *b, const uint64_t *key, char *err, size_t errlen) {
    const kern_ops *ops = r->ops;
    int replaying = 0, g = key ? ops->graph_begin(r->be, *key, &replaying) : -1;
    echo_pass_mode mode = !key ? ECHO_PASS_EAGER : g == 0 && replaying ? ECHO_PASS_REPLAY : ECHO_PASS_CAPTURE;
    /* Echo's residual slots carry error from call to call within one pass
     * only: every pass starts clean. */
    if (r->comm && echo_begin_pass(r->comm, mode, err, errlen)) {
        if (g == 0) ops->graph_abort(r->be);
        echo_abort(r->comm); /* peers must not wait for this rank */
        r->aborted = 1;
        return -1;
    }
    echo_pass_end end = {0};
    if (!key)
        end.failed = model_pass_ops(r->m, b, err, errlen) != 0;
    else if (g == 0 && model_pass_ops(r->m, b, err, errlen) == 0 && ops->graph_end(r->be) == 0) {
        end.launch = graph_launch; /* a graph is ready: replayed or freshly captured */
        end.arg = r;
    }
    int rc;
    if (r->comm) {
        /* A deferred comm: the pass's all-reduces complete here (an
         * abortable wait, and their non-finite check) before anything is
         * read back. */
        rc = echo_end_pass(r->comm, ops->stream(r->be), &end, err, errlen);
        r->aborted = end.aborted;
    } else if (end.failed)
        rc = -1;
    else
        rc = key && !(end.launch && graph_launch(r, err, errlen) == 0);
    if (rc == 1) {
        if (g == 0) ops->graph_abort(r->be); /* captured again later, by every rank together */
        return run_pass(r, b, NULL, err, errlen);
    }
    if (rc == 0 && key) r->graph_steps++;
    return rc;
}

int eng_run_step(eng_runner *r, const model_batch *b, float *logits, char *err, size_t errlen) {
    r->aborted = 0;
    /* Graphs address the activation buffers: destroy them before the
     * buffers go. NCCL may have registered a buffer for a captured
     * all-reduce (NCCL_GRAPH_REGISTER), and a registration that outlives its
     * memory can be taken for a new allocation at the same address. */
    if (model_pass_moves_buffers(r->m, b)) {
        if (r->graphs) eng_runner_drop_graphs(r);
        r->moves++; /* graphs captured with the old buffers must not replay */
    }
    uint64_t key;
    int graphed = graph_key(r, b, &key);
    /* a prefill of enough tokens as pipelined micro-batches (overlap.h) */
    int k = graphed ? 1 : eng_overlap_count(r->ov, b);
    if (model_pass_prepare(r->m, b, err, errlen) == 0) {
        int rc = k > 1 ? eng_overlap_pass(r->ov, r, b, k, err, errlen)
                       : run_pass(r, b, graphed ? &key : NULL, err, errlen);
        if (rc) return -1; /* echo_end_pass aborted the world if it had to */
        if (model_pass_out(r->m, b, logits, err, errlen) == 0) return 0;
    }
    /* Failed outside the pass, on this rank alone: peers must not wait for
     * it in the next collective. */
    if (r->comm) {
        echo_abort(r->comm);
        r->aborted = 1;
    }
    return -1;
}
