/*
 * cpu backend: memory ops and the op table. Activations are fp32 in host
 * memory; weights of 2 MiB and more are copied onto huge pages (mem.c),
 * smaller ones stay where weights/ mapped them. Creating a backend starts
 * its pool (pool.c) and reads its isa (isa.c) and memory settings (mem.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

static void *cpu_alloc(kern_backend *be, size_t bytes) {
    void *p = cpu_mem_alloc(be, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

static void cpu_free(kern_backend *be, void *p) {
    (void)be;
    free(p);
}

static int cpu_upload_weight(kern_backend *be, const kern_weight *host, kern_weight *dev) {
    if (kern_dtype_size(host->dtype) == 0) return kern_fail(be, "cpu: unsupported weight dtype %d", host->dtype);
    return cpu_copy_weight(be, host, dev);
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

/* Quantized weights: GGUF blocks are uploaded like any weight, or as
 * their _A8 dtype repacked in 8-row groups (matmul_a8p.c; the Q5 types
 * only so);
 * F32/F16/BF16 become an owned Q8_0 copy, row by row; KERN_Q8_0_A8 is
 * packed from Q8_0 blocks or F32/F16/BF16 rows (matmul_q8.c). */
static int cpu_upload_quantized(kern_backend *be, const kern_weight *host, kern_dtype to, kern_weight *dev) {
    int bl = kern_dtype_block(to);
    int64_t ld = host->ld ? host->ld : host->cols;
    if (bl == 1) return kern_fail(be, "upload_quantized: %s is not a quantized type", kern_dtype_name(to));
    if (host->cols % bl || ld % bl)
        return kern_fail(be, "upload_quantized: (%lld, %lld) weight: cols not a multiple of %s's %d",
                         (long long)host->rows, (long long)host->cols, kern_dtype_name(to), bl);
    if (to == KERN_Q8_0_A8) return cpu_pack_q8a8(be, host, dev);
    if (cpu_is_a8p(to)) return cpu_pack_a8p(be, host, to, dev);
    if (to == KERN_Q5_0 || to == KERN_Q5_1 || to == KERN_Q5_K) /* matmul.c has no exact Q5 path */
        return kern_fail(be, "upload_quantized: %s only as %s (no exact kernel)", kern_dtype_name(to),
                         kern_dtype_name(kern_dtype_a8(to)));
    if (host->dtype == to) return cpu_copy_weight(be, host, dev);
    if (to != KERN_Q8_0 || kern_dtype_block(host->dtype) != 1)
        return kern_fail(be, "upload_quantized: cannot make %s from %s", kern_dtype_name(to),
                         kern_dtype_name(host->dtype));
    size_t row_bytes = kern_dtype_bytes(to, host->cols);
    uint8_t *buf = cpu_mem_alloc(be, (size_t)host->rows * row_bytes + 1);
    float *row = malloc((size_t)host->cols * sizeof *row);
    if (!buf || !row || cpu_owned_add(be, buf)) {
        free(buf);
        free(row);
        return kern_fail(be, "upload_quantized: out of memory for (%lld, %lld) %s", (long long)host->rows,
                         (long long)host->cols, kern_dtype_name(to));
    }
    for (int64_t r = 0; r < host->rows; r++) {
        cpu_load_rows(row, host, r, 1);
        cpu_quantize_q8_0(row, host->cols, buf + (size_t)r * row_bytes);
    }
    free(row);
    *dev = (kern_weight){buf, to, host->rows, host->cols, 0};
    return 0;
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
    .upload_quantized = cpu_upload_quantized,
    .alloc_kv = cpu_alloc_kv,
    .free_kv = cpu_free_kv,
};

int kern_cpu_create(int nthreads, kern_backend **out, char *err, size_t errlen) {
    if (nthreads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n > 0 ? (int)n : 1;
    }
    if (nthreads > 1024) nthreads = 1024;
    kern_backend *be = calloc(1, sizeof *be);
    cpu_impl *impl = calloc(1, sizeof *impl);
    if (!be || !impl) goto fail;
    be->impl = impl;
    impl->isa = cpu_isa_for_backend();
    impl->vnni = impl->isa >= CPU_ISA_AVX512 && cpu_vnni_detect();
    if (cpu_huge_from_env(&impl->huge, err, errlen)) {
        free(impl);
        free(be);
        return -1;
    }
    if (cpu_pool_init(&impl->pool, nthreads) != 0) {
        cpu_pool_destroy(&impl->pool);
        goto fail;
    }
    be->ops = &cpu_ops;
    *out = be;
    return 0;
fail:
    snprintf(err, errlen, "cpu backend: cannot start %d threads", nthreads);
    free(impl);
    free(be);
    return -1;
}

void kern_cpu_destroy(kern_backend *be) {
    if (!be) return;
    cpu_impl *impl = be->impl;
    cpu_mem_free_all(impl);
    cpu_pool_destroy(&impl->pool);
    free(impl);
    free(be);
}
