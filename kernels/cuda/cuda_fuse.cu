/*
 * cuda: fuse_rows — one device weight holding the rows of several (the
 * model's [wq; wk; wv] and [wg; wu]), so a one-token decode step streams
 * each group's weights in one cuBLASLt call instead of one per part. Device
 * weights are dense bf16 (upload_weight), so the fused weight is the parts'
 * bytes end to end: device-to-device copies on the stream, then a sync so
 * a copy fault is reported here and the caller may free the parts at once.
 */
#include "kernels/cuda/cuda.h"

int cuda_fuse_rows(kern_backend *be, const kern_weight *const *parts, int n_parts, kern_weight *out) {
    int64_t rows;
    if (kern_fuse_rows_check(be, parts, n_parts, &rows)) return -1;
    for (int i = 0; i < n_parts; i++)
        if (cuda_check_weight(be, "fuse_rows", parts[i])) return -1;
    if (cuda_no_graph(be, "fuse_rows") || cuda_enter(be)) return -1;
    cuda_impl *impl = cuda_get(be);
    size_t row_bytes = (size_t)parts[0]->cols * sizeof(bf16), off = 0;
    int rc = 0;
    void *d = NULL;
    CUDA_TRY_GOTO(be, cudaMalloc(&d, (size_t)rows * row_bytes), rc, fail);
    for (int i = 0; i < n_parts; i++) {
        size_t bytes = (size_t)parts[i]->rows * row_bytes;
        CUDA_TRY_GOTO(be,
                      cudaMemcpyAsync((char *)d + off, parts[i]->data, bytes, cudaMemcpyDeviceToDevice, impl->stream),
                      rc, fail);
        off += bytes;
    }
    CUDA_TRY_GOTO(be, cudaStreamSynchronize(impl->stream), rc, fail);
    *out = kern_weight{d, KERN_BF16, rows, parts[0]->cols, 0};
    return 0;
fail:
    /* the copies already enqueued must finish before their target goes */
    cudaStreamSynchronize(impl->stream);
    if (d) cudaFree(d);
    return rc;
}
