/*
 * cuda backend: the helpers every op file shares (weight checks, the
 * device scratch, staging host arrays to the device). A leaf of
 * kernels/cuda/: the ops and the backend's table call it; it calls only
 * cuda_graph.cu's staging in graph mode. Contracts in cuda.h.
 */
#include <string.h>

#include "kernels/cuda/cuda.h"

int cuda_check_weight(kern_backend *be, const char *op, const kern_weight *w) {
    if (!w || !w->data) return kern_fail(be, "%s: weight has no device data", op);
    if (w->dtype != KERN_BF16)
        return kern_fail(be, "%s: cuda weights must be bf16 (made by upload_weight), got %s", op,
                         kern_dtype_name(w->dtype));
    if (w->ld != 0 && w->ld != w->cols)
        return kern_fail(be, "%s: cuda weights must be dense (made by upload_weight), got ld %lld for %lld columns", op,
                         (long long)w->ld, (long long)w->cols);
    return 0;
}

int cuda_tmp_reserve(kern_backend *be, size_t bytes, void **p) {
    cuda_impl *impl = cuda_get(be);
    if (bytes > impl->tmp_bytes) {
        size_t want = impl->tmp_bytes * 2 > bytes ? impl->tmp_bytes * 2 : bytes;
        if (want < ((size_t)1 << 20)) want = (size_t)1 << 20;
        /* earlier work on the stream may still read the old buffer */
        CUDA_TRY(be, cudaStreamSynchronize(impl->stream));
        impl->graph_epoch++; /* graphs captured with the old buffer must not replay */
        if (impl->tmp) CUDA_TRY(be, cudaFree(impl->tmp));
        impl->tmp = NULL;
        impl->tmp_bytes = 0;
        CUDA_TRY(be, cudaMalloc(&impl->tmp, want));
        impl->tmp_bytes = want;
    }
    *p = impl->tmp;
    return 0;
}

static void stage_slot_release(cuda_stage_slot *s) {
    if (s->host) cudaFreeHost(s->host);
    if (s->dev) cudaFree(s->dev);
    s->host = NULL;
    s->dev = NULL;
    s->cap = 0;
    s->n = 0;
}

void cuda_stage_free(cuda_impl *impl) {
    for (int i = 0; i < CUDA_STAGE_SLOTS; i++)
        stage_slot_release(&impl->stage[i]);
}

int cuda_stage_begin(kern_backend *be, size_t n, int32_t **host) {
    cuda_impl *impl = cuda_get(be);
    if (n == 0) return kern_fail(be, "cuda: staging 0 values");
    if (impl->graph_mode != CUDA_GRAPH_OFF) return cuda_graph_stage_begin(be, n, host);
    int idx = impl->stage_next;
    cuda_stage_slot *s = &impl->stage[idx];
    s->n = 0; /* not reusable until the new copy is enqueued */
    if (n > s->cap) {
        size_t cap = s->cap * 2 > n ? s->cap * 2 : n;
        if (cap < 4096) cap = 4096;
        /* kernels enqueued earlier may still read the slot's device copy */
        CUDA_TRY(be, cudaStreamSynchronize(impl->stream));
        stage_slot_release(s);
        void *h = NULL, *d = NULL;
        CUDA_TRY(be, cudaMallocHost(&h, cap * sizeof(int32_t)));
        s->host = (int32_t *)h;
        cudaError_t e = cudaMalloc(&d, cap * sizeof(int32_t));
        if (e != cudaSuccess) {
            stage_slot_release(s);
            return cuda_fail_rt(be, __FILE__, __LINE__, "cudaMalloc(&d, cap * sizeof(int32_t))", e);
        }
        s->dev = (int32_t *)d;
        s->cap = cap;
    } else {
        /* the slot's previous copy must have left its pinned buffer */
        CUDA_TRY(be, cudaEventSynchronize(s->copied));
    }
    *host = s->host;
    return 0;
}

int cuda_stage_commit(kern_backend *be, size_t n, const int32_t **dev) {
    cuda_impl *impl = cuda_get(be);
    if (impl->graph_mode != CUDA_GRAPH_OFF) return cuda_graph_stage_commit(be, n, dev);
    int idx = impl->stage_next;
    cuda_stage_slot *s = &impl->stage[idx];
    if (n == 0 || n > s->cap) return kern_fail(be, "cuda: staging commit of %zu values into %zu", n, s->cap);
    /* Every layer stages the same positions, cache slots and batch tables
     * (and q and k rope share their positions): reuse a slot that already
     * holds these values. Its device copy stays put until the ring comes
     * back to it, and stream order keeps the kernels enqueued before then
     * reading it. */
    for (int i = 0; i < CUDA_STAGE_SLOTS; i++) {
        const cuda_stage_slot *o = &impl->stage[i];
        if (i != idx && o->n == n && memcmp(o->host, s->host, n * sizeof(int32_t)) == 0) {
            *dev = o->dev;
            return 0;
        }
    }
    CUDA_TRY(be, cudaMemcpyAsync(s->dev, s->host, n * sizeof(int32_t), cudaMemcpyHostToDevice, impl->stream));
    CUDA_TRY(be, cudaEventRecord(s->copied, impl->stream));
    s->n = n;
    impl->stage_next = (idx + 1) % CUDA_STAGE_SLOTS;
    *dev = s->dev;
    return 0;
}

int cuda_stage_i32(kern_backend *be, const int32_t *host, size_t n, const int32_t **dev) {
    int32_t *buf = NULL;
    if (cuda_stage_begin(be, n, &buf)) return -1;
    memcpy(buf, host, n * sizeof(int32_t));
    return cuda_stage_commit(be, n, dev);
}
