/*
 * cuda: graphs of decode steps (kern_ops.graph_begin / graph_end /
 * graph_launch / graph_abort / graph_drop_all; the design is in
 * kernels/cuda/cuda.h above cuda_graph).
 *
 *   - A key (the caller's: batch shape, buffers' generation) maps to one
 *     entry of a small LRU cache (CUDA_GRAPHS). The first graph_begin of a
 *     key captures the stream (cudaStreamCaptureModeThreadLocal: anything
 *     that synchronises or allocates during the capture fails it, e.g. a
 *     scratch buffer that must grow); graph_end instantiates it. Later
 *     graph_begins of the key replay: the ops skip their launches and only
 *     fill the arena, and graph_end uploads it and launches the graph.
 *   - A failed capture is discarded; the caller runs the step eagerly and
 *     the key is captured again at a later step, up to
 *     CUDA_GRAPH_MAX_FAILURES times (then graph_begin answers 1: eager for
 *     good). A capture whose arena turns out too small goes on to the end
 *     of the step (the stagings beyond it go to a throwaway host buffer),
 *     so it learns the exact size; graph_end then discards it (not counted
 *     as a failure) and the next capture of the key gets that size.
 *   - A graph captured before a device buffer it addresses was reallocated
 *     (impl->graph_epoch moved) is destroyed and captured again.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

/* Destroy an entry's executable graph. Earlier launches may still be in
 * flight, so the stream drains first. */
static void graph_drop_exec(kern_backend *be, cuda_graph *g) {
    if (!g->exec) return;
    cudaStreamSynchronize(cuda_get(be)->stream);
    cudaGraphExecDestroy(g->exec);
    g->exec = NULL;
}

/* Free the arena (after its last upload left the pinned buffer). */
static void graph_arena_free(cuda_graph *g) {
    if (g->copied && g->copied_valid) cudaEventSynchronize(g->copied);
    g->copied_valid = 0;
    if (g->host) cudaFreeHost(g->host);
    if (g->dev) cudaFree(g->dev);
    g->host = NULL;
    g->dev = NULL;
    g->cap = 0;
}

/* Return an entry to empty (keeps its event for reuse). */
static void graph_entry_clear(kern_backend *be, cuda_graph *g) {
    graph_drop_exec(be, g);
    graph_arena_free(g);
    free(g->rec);
    cudaEvent_t ev = g->copied;
    memset(g, 0, sizeof *g);
    g->copied = ev;
}

void cuda_graphs_free(cuda_impl *impl) {
    if (impl->graph_mode == CUDA_GRAPH_CAPTURE) {
        cudaGraph_t gr = NULL;
        if (cudaStreamEndCapture(impl->stream, &gr) == cudaSuccess && gr) cudaGraphDestroy(gr);
        cudaGetLastError();
    }
    impl->graph_mode = CUDA_GRAPH_OFF;
    impl->graph_ready = NULL;
    free(impl->graph_spill);
    impl->graph_spill = NULL;
    impl->graph_spill_cap = 0;
    for (int i = 0; i < CUDA_GRAPHS; i++) {
        cuda_graph *g = &impl->graphs[i];
        if (g->exec) cudaGraphExecDestroy(g->exec); /* the caller drained the stream */
        g->exec = NULL;
        graph_arena_free(g);
        free(g->rec);
        g->rec = NULL;
        if (g->copied) cudaEventDestroy(g->copied);
        g->copied = NULL;
    }
}

void cuda_graph_drop_all(kern_backend *be) {
    cuda_impl *impl = cuda_get(be);
    cuda_graph_abort(be);
    cudaSetDevice(impl->device);
    for (int i = 0; i < CUDA_GRAPHS; i++)
        graph_entry_clear(be, &impl->graphs[i]);
}

/* ---- staging in graph mode (from cuda_stage_begin / cuda_stage_commit) ---- */

/* The host buffer for a staging that does not go to the arena: a capture
 * past the arena's end, or a replay of an alias (compared at commit). */
static int graph_spill(kern_backend *be, size_t n, int32_t **host) {
    cuda_impl *impl = cuda_get(be);
    if (n > impl->graph_spill_cap) {
        int32_t *sp = (int32_t *)realloc(impl->graph_spill, n * sizeof *sp);
        if (!sp) return kern_fail(be, "cuda: out of memory for a graph's staging");
        impl->graph_spill = sp;
        impl->graph_spill_cap = n;
    }
    *host = impl->graph_spill;
    return 0;
}

int cuda_graph_stage_begin(kern_backend *be, size_t n, int32_t **host) {
    cuda_impl *impl = cuda_get(be);
    cuda_graph *g = impl->graph_cur;
    /* 16-byte aligned starts, like a fresh allocation */
    size_t off = (impl->graph_used + 3) & ~(size_t)3;
    if (off + n > UINT32_MAX) return kern_fail(be, "cuda: a graph's stagings exceed %u values", UINT32_MAX);
    if (impl->graph_mode == CUDA_GRAPH_REPLAY) {
        size_t i = impl->graph_rec_i;
        if (i >= g->nrec || g->rec[i].n != n || (!g->rec[i].alias && g->rec[i].off != off))
            return kern_fail(be, "cuda: graph replay diverged (staging %zu: %zu values at %zu)", i, n, off);
    }
    if (impl->graph_mode == CUDA_GRAPH_REPLAY && g->rec[impl->graph_rec_i].alias)
        return graph_spill(be, n, host); /* filled aside, compared with the earlier staging at commit */
    impl->graph_pending = off;
    if (off + n > g->cap) {
        /* only a capture gets here (a replay matched the capture's layout).
         * No device or pinned memory may be allocated while capturing: the
         * capture goes on with a throwaway host buffer to measure the step,
         * and graph_end discards it */
        impl->graph_overflow = 1;
        if (off + n > g->need) g->need = off + n;
        return graph_spill(be, n, host);
    }
    *host = g->host + off;
    return 0;
}

int cuda_graph_stage_commit(kern_backend *be, size_t n, const int32_t **dev) {
    cuda_impl *impl = cuda_get(be);
    cuda_graph *g = impl->graph_cur;
    if (impl->graph_mode == CUDA_GRAPH_REPLAY && impl->graph_rec_i < g->nrec && g->rec[impl->graph_rec_i].alias) {
        const cuda_graph_stage *r = &g->rec[impl->graph_rec_i];
        if (r->n != n || memcmp(impl->graph_spill, g->host + r->off, n * sizeof(int32_t)) != 0)
            return kern_fail(be, "cuda: graph replay diverged (staging %zu no longer repeats an earlier one)",
                             impl->graph_rec_i);
        impl->graph_rec_i++;
        *dev = g->dev + r->off;
        return 0;
    }
    size_t off = impl->graph_pending;
    const int spilled = off + n > g->cap;
    if (n == 0 || (spilled && impl->graph_mode != CUDA_GRAPH_CAPTURE))
        return kern_fail(be, "cuda: graph staging commit of %zu values at %zu", n, off);
    if (impl->graph_mode == CUDA_GRAPH_CAPTURE) {
        if (g->nrec == g->rec_cap) {
            size_t c = g->rec_cap ? 2 * g->rec_cap : 256;
            cuda_graph_stage *r = (cuda_graph_stage *)realloc(g->rec, c * sizeof *r);
            if (!r) return kern_fail(be, "cuda: out of memory for a graph's staging record");
            g->rec = r;
            g->rec_cap = c;
        }
        /* the same values as an earlier staging in the arena: read that */
        if (!spilled)
            for (size_t i = 0; i < g->nrec; i++) {
                const cuda_graph_stage *o = &g->rec[i];
                if (!o->alias && o->n == n && (size_t)o->off + n <= g->cap &&
                    memcmp(g->host + o->off, g->host + off, n * sizeof(int32_t)) == 0) {
                    g->rec[g->nrec++] = (cuda_graph_stage){o->off, (uint32_t)n, 1};
                    *dev = g->dev + o->off;
                    return 0; /* graph_used stays: the space is free for the next staging */
                }
            }
        g->rec[g->nrec].off = (uint32_t)off;
        g->rec[g->nrec].n = (uint32_t)n;
        g->rec[g->nrec].alias = 0;
        g->nrec++;
    } else {
        if (impl->graph_rec_i >= g->nrec || g->rec[impl->graph_rec_i].n != n)
            return kern_fail(be, "cuda: graph replay diverged (commit of %zu values)", n);
        impl->graph_rec_i++;
    }
    impl->graph_used = off + n;
    /* a spilled staging's kernels are captured but never run (graph_end
     * discards the capture): any device address will do */
    *dev = spilled ? g->dev : g->dev + off;
    return 0;
}

/* ---- the op-table entries ---- */

/* The entry for key: its own, else a free one, else the least recently
 * used (evicted). */
static cuda_graph *graph_slot(kern_backend *be, uint64_t key) {
    cuda_impl *impl = cuda_get(be);
    cuda_graph *free_g = NULL, *lru = NULL;
    for (int i = 0; i < CUDA_GRAPHS; i++) {
        cuda_graph *g = &impl->graphs[i];
        if (g->used_slot && g->key == key) return g;
        if (!g->used_slot && !free_g) free_g = g;
        if (g->used_slot && (!lru || g->last_used < lru->last_used)) lru = g;
    }
    cuda_graph *g = free_g ? free_g : lru;
    graph_entry_clear(be, g);
    g->used_slot = 1;
    g->key = key;
    return g;
}

int cuda_graph_begin(kern_backend *be, uint64_t key, int *replaying) {
    cuda_impl *impl = cuda_get(be);
    *replaying = 0;
    if (impl->graph_mode != CUDA_GRAPH_OFF || impl->graph_ready)
        return kern_fail(be, "cuda: graph_begin inside a graph, or with one ready to launch");
    if (cuda_enter(be)) return -1;
    cuda_graph *g = graph_slot(be, key);
    g->last_used = ++impl->graph_tick;
    if (g->exec && g->epoch != impl->graph_epoch) graph_drop_exec(be, g); /* its buffers moved */
    if (!g->exec && g->failures >= CUDA_GRAPH_MAX_FAILURES) return 1;
    if (!g->copied) CUDA_TRY(be, cudaEventCreateWithFlags(&g->copied, cudaEventDisableTiming));
    if (g->exec) {
        /* the host rewrites the arena: its last upload must have left it */
        if (g->copied_valid) CUDA_TRY(be, cudaEventSynchronize(g->copied));
        impl->graph_cur = g;
        impl->graph_used = 0;
        impl->graph_rec_i = 0;
        impl->graph_overflow = 0;
        impl->graph_mode = CUDA_GRAPH_REPLAY;
        *replaying = 1;
        return 0;
    }
    size_t want = g->need > CUDA_GRAPH_ARENA_MIN ? g->need : CUDA_GRAPH_ARENA_MIN;
    if (g->cap < want) {
        graph_arena_free(g);
        void *h = NULL, *d = NULL;
        CUDA_TRY(be, cudaMallocHost(&h, want * sizeof(int32_t)));
        g->host = (int32_t *)h;
        cudaError_t e = cudaMalloc(&d, want * sizeof(int32_t));
        if (e != cudaSuccess) {
            graph_arena_free(g);
            return cuda_fail_rt(be, __FILE__, __LINE__, "cudaMalloc(&d, want * sizeof(int32_t))", e);
        }
        g->dev = (int32_t *)d;
        g->cap = want;
    } else if (g->copied_valid) {
        CUDA_TRY(be, cudaEventSynchronize(g->copied));
    }
    g->nrec = 0;
    impl->graph_cur = g;
    impl->graph_used = 0;
    impl->graph_rec_i = 0;
    impl->graph_overflow = 0;
    CUDA_TRY(be, cudaStreamBeginCapture(impl->stream, cudaStreamCaptureModeThreadLocal));
    impl->graph_mode = CUDA_GRAPH_CAPTURE;
    return 0;
}

int cuda_graph_end(kern_backend *be) {
    cuda_impl *impl = cuda_get(be);
    cuda_graph *g = impl->graph_cur;
    const int mode = impl->graph_mode;
    if (mode == CUDA_GRAPH_OFF || !g) return kern_fail(be, "cuda: graph_end outside a graph");
    impl->graph_mode = CUDA_GRAPH_OFF;
    impl->graph_cur = NULL;
    if (cuda_enter(be)) return -1;
    if (mode == CUDA_GRAPH_CAPTURE) {
        cudaGraph_t gr = NULL;
        cudaError_t e = cudaStreamEndCapture(impl->stream, &gr);
        if (e != cudaSuccess || !gr) {
            if (gr) cudaGraphDestroy(gr);
            cudaGetLastError();
            g->failures++;
            return cuda_fail_rt(be, __FILE__, __LINE__, "cudaStreamEndCapture(impl->stream, &gr)",
                                e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated);
        }
        if (impl->graph_overflow) {
            /* measured, not kept: g->need holds the step's staging size now */
            cudaGraphDestroy(gr);
            impl->graph_overflow = 0;
            return kern_fail(be, "cuda: graph arena of %zu values too small for %zu: captured again at the next step",
                             g->cap, g->need);
        }
        cudaGraphExec_t ex = NULL;
        e = cudaGraphInstantiate(&ex, gr, 0ULL);
        cudaGraphDestroy(gr);
        if (e != cudaSuccess) {
            g->failures++;
            return cuda_fail_rt(be, __FILE__, __LINE__, "cudaGraphInstantiate(&ex, gr, 0ULL)", e);
        }
        g->exec = ex;
        g->epoch = impl->graph_epoch;
    } else if (impl->graph_rec_i != g->nrec) {
        graph_drop_exec(be, g);
        return kern_fail(be, "cuda: graph replay diverged (%zu of %zu stagings)", impl->graph_rec_i, g->nrec);
    }
    impl->graph_ready = g;
    impl->graph_ready_fresh = mode == CUDA_GRAPH_CAPTURE;
    return 0;
}

int cuda_graph_launch(kern_backend *be) {
    cuda_impl *impl = cuda_get(be);
    cuda_graph *g = impl->graph_ready;
    if (!g) return kern_fail(be, "cuda: graph_launch without a ready graph (graph_end first)");
    impl->graph_ready = NULL;
    if (cuda_enter(be)) return -1;
    /* the arena's values for this step, then the step; stream order puts
     * the next upload after this launch's reads */
    cudaError_t e = cudaSuccess;
    if (impl->graph_used > 0) {
        e = cudaMemcpyAsync(g->dev, g->host, impl->graph_used * sizeof(int32_t), cudaMemcpyHostToDevice, impl->stream);
        if (e != cudaSuccess) {
            graph_drop_exec(be, g);
            return cuda_fail_rt(be, __FILE__, __LINE__, "cudaMemcpyAsync(arena)", e);
        }
        e = cudaEventRecord(g->copied, impl->stream);
        if (e != cudaSuccess) {
            graph_drop_exec(be, g);
            return cuda_fail_rt(be, __FILE__, __LINE__, "cudaEventRecord(g->copied, impl->stream)", e);
        }
        g->copied_valid = 1;
    }
    e = cudaGraphLaunch(g->exec, impl->stream);
    if (e != cudaSuccess) {
        graph_drop_exec(be, g);
        return cuda_fail_rt(be, __FILE__, __LINE__, "cudaGraphLaunch(g->exec, impl->stream)", e);
    }
    return 0;
}

void cuda_graph_abort(kern_backend *be) {
    cuda_impl *impl = cuda_get(be);
    if (impl->graph_ready) {
        /* ready, never launched: its ranks did not all have one. Captured
         * again next time (all ranks together); a fresh capture counts as
         * failed, so a rank that never gets one ends the attempts */
        cuda_graph *r = impl->graph_ready;
        impl->graph_ready = NULL;
        cudaSetDevice(impl->device);
        graph_drop_exec(be, r);
        if (impl->graph_ready_fresh) r->failures++;
        return;
    }
    cuda_graph *g = impl->graph_cur;
    const int mode = impl->graph_mode;
    impl->graph_mode = CUDA_GRAPH_OFF;
    impl->graph_cur = NULL;
    if (mode == CUDA_GRAPH_OFF || !g) return;
    cudaSetDevice(impl->device);
    if (mode == CUDA_GRAPH_CAPTURE) {
        /* a capture that an op invalidated (a sync, an allocation) ends
         * with an error and no graph; either way nothing ran */
        cudaGraph_t gr = NULL;
        if (cudaStreamEndCapture(impl->stream, &gr) == cudaSuccess && gr) cudaGraphDestroy(gr);
        cudaGetLastError(); /* capture errors are not sticky; clear them for later checks */
        g->failures++;
    } else {
        graph_drop_exec(be, g); /* a replay that failed: the step goes eager, the graph is captured anew */
    }
    impl->graph_overflow = 0;
}
