/*
 * cpu backend: memory ops and the op table. Activations are fp32 in host
 * memory; weights stay where weights/ mapped them (no copy).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static void *cpu_alloc(kern_backend *be, size_t bytes) {
    (void)be;
    /* 64-byte alignment keeps vector loads on cache lines. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (p) memset(p, 0, rounded ? rounded : 64);
    return p;
}

static void cpu_free(kern_backend *be, void *p) {
    (void)be;
    free(p);
}

static int cpu_upload_weight(kern_backend *be, const kern_weight *host, kern_weight *dev) {
    if (kern_dtype_size(host->dtype) == 0) return kern_fail(be, "cpu: unsupported weight dtype %d", host->dtype);
    *dev = *host;
    return 0;
}

static void cpu_free_weight(kern_backend *be, kern_weight *dev) {
    (void)be;
    cpu_owned_release(be, dev->data); /* random_weight's and fuse_rows'; uploads alias the caller's memory */
    dev->data = NULL;
}

static int cpu_to_host_f32(kern_backend *be, float *dst, const void *src, size_t n) {
    (void)be;
    memmove(dst, src, n * sizeof(float));
    return 0;
}

static int cpu_copy(kern_backend *be, void *dst, const void *src, size_t n) {
    (void)be;
    memmove(dst, src, n * sizeof(float));
    return 0;
}

/* safetensors does not promise aligned tensor data (HF pads headers to 8
 * bytes, other writers need not), so 16-bit weights are read through memcpy;
 * gcc turns it into plain (unaligned-safe) loads. */
static void load_span(float *dst, const kern_weight *w, size_t off, size_t n) {
    const char *src = (const char *)w->data + off * kern_dtype_size(w->dtype);
    switch (w->dtype) {
    case KERN_F32: memcpy(dst, src, n * sizeof(float)); break;
    case KERN_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = kern_bf16_to_f32(h);
        }
        break;
    case KERN_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = kern_f16_to_f32(h);
        }
        break;
    }
}

void cpu_load_rows(float *dst, const kern_weight *w, int64_t r0, int64_t nrows) {
    size_t cols = (size_t)w->cols, ld = w->ld ? (size_t)w->ld : cols;
    if (ld == cols) {
        load_span(dst, w, (size_t)r0 * cols, (size_t)nrows * cols);
        return;
    }
    for (int64_t r = 0; r < nrows; r++) load_span(dst + (size_t)r * cols, w, (size_t)(r0 + r) * ld, cols);
}

static const kern_ops cpu_ops = {
    .name = "cpu",
    .act_dtype = KERN_F32,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload_weight = cpu_upload_weight,
    .free_weight = cpu_free_weight,
    .to_host_f32 = cpu_to_host_f32,
    .copy = cpu_copy,
    .embedding = cpu_embedding,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .add_bias = cpu_add_bias,
    .add_rmsnorm = cpu_add_rmsnorm,
    .qk_norm_rope = cpu_qk_norm_rope,
    .logits_topk = cpu_logits_topk,
    .stream = cpu_stream,
    .random_weight = cpu_random_weight,
    .fuse_rows = cpu_fuse_rows,
};

int kern_cpu_ops_init(kern_backend *be) {
    be->ops = &cpu_ops;
    return 0;
}
