/*
 * cpu backend memory: blocks of CPU_HUGE_MIN bytes and more start on a
 * 2 MiB boundary and are offered to transparent huge pages. A decode step
 * streams every weight once; on 4 KiB pages each page costs a TLB walk, and
 * in a VM (nested paging) those walks halved what a core could read here
 * (docs/bench-forward.md, "Huge pages"). ECHO_CPU_HUGEPAGES=0 turns it off:
 * plain aligned blocks, and uploads alias the caller's memory again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/cpu/cpu.h"

#define CPU_HUGE_PAGE ((size_t)2 << 20)

int cpu_huge_from_env(int *on, char *err, size_t errlen) {
    const char *v = getenv("ECHO_CPU_HUGEPAGES");
    if (!v || !*v || !strcmp(v, "1")) {
        *on = 1;
        return 0;
    }
    if (!strcmp(v, "0")) {
        *on = 0;
        return 0;
    }
    snprintf(err, errlen, "ECHO_CPU_HUGEPAGES must be 0 or 1 (got '%.32s')", v);
    return -1;
}

void *cpu_mem_alloc(const kern_backend *be, size_t bytes) {
    const cpu_impl *impl = be->impl;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (!rounded) rounded = 64;
    if (!impl->huge || rounded < CPU_HUGE_MIN) return aligned_alloc(64, rounded);
    void *p = NULL;
    rounded = (rounded + CPU_HUGE_PAGE - 1) & ~(CPU_HUGE_PAGE - 1);
    if (posix_memalign(&p, CPU_HUGE_PAGE, rounded)) return NULL;
    /* Only a hint: a kernel without THP (or with it off) says EINVAL and
     * the block simply stays on 4 KiB pages. */
    (void)madvise(p, rounded, MADV_HUGEPAGE);
    return p;
}

typedef struct cw_args {
    char *dst;
    const char *src;
    size_t row_bytes, src_ld;
    int64_t rows;
    int ntasks;
} cw_args;

/* Rows [rows*task/ntasks, rows*(task+1)/ntasks): the kernel clears each
 * new huge page on its first write, which costs more than the copy, so
 * every thread of the pool takes a share. */
static void cw_task(void *arg, int task) {
    const cw_args *a = arg;
    int64_t r0 = a->rows * task / a->ntasks, r1 = a->rows * (task + 1) / a->ntasks;
    if (a->src_ld == a->row_bytes) {
        memcpy(a->dst + (size_t)r0 * a->row_bytes, a->src + (size_t)r0 * a->row_bytes,
               (size_t)(r1 - r0) * a->row_bytes);
        return;
    }
    for (int64_t r = r0; r < r1; r++)
        memcpy(a->dst + (size_t)r * a->row_bytes, a->src + (size_t)r * a->src_ld, a->row_bytes);
}

int cpu_copy_weight(kern_backend *be, const kern_weight *host, kern_weight *dev) {
    cpu_impl *impl = be->impl;
    int64_t ld = host->ld ? host->ld : host->cols;
    size_t row_bytes = kern_dtype_bytes(host->dtype, host->cols);
    size_t bytes = (size_t)host->rows * row_bytes;
    *dev = *host;
    if (!impl->huge || bytes < CPU_HUGE_MIN) return 0; /* small: alias */
    char *buf = cpu_mem_alloc(be, bytes);
    if (!buf || cpu_owned_add(be, buf)) {
        free(buf);
        return kern_fail(be, "upload: out of memory for a (%lld, %lld) %s weight", (long long)host->rows,
                         (long long)host->cols, kern_dtype_name(host->dtype));
    }
    int nt = 4 * cpu_nthreads(be);
    if (nt > host->rows) nt = (int)host->rows;
    cw_args a = {buf, host->data, row_bytes, kern_dtype_bytes(host->dtype, ld), host->rows, nt};
    cpu_parallel_for(be, nt, cw_task, &a);
    *dev = (kern_weight){buf, host->dtype, host->rows, host->cols, 0};
    return 0;
}

/* The KV cache: an anonymous private mapping is zero and costs no memory
 * until a page is written, so the cache's share of the process follows
 * the blocks the engine has used (engine/blocks.c hands out low block ids
 * first and reuses freed ones first). 4 KiB pages on purpose: with
 * transparent huge pages ("always") the first block of each layer's
 * buffer would fault in 2 MiB. */
void *cpu_alloc_kv(kern_backend *be, size_t bytes) {
    (void)be;
    if (!bytes) bytes = 1;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    (void)madvise(p, bytes, MADV_NOHUGEPAGE); /* a hint; without THP nothing to turn off */
    return p;
}

void cpu_free_kv(kern_backend *be, void *p, size_t bytes) {
    (void)be;
    if (p) munmap(p, bytes ? bytes : 1);
}

int cpu_owned_add(kern_backend *be, void *p) {
    cpu_impl *impl = be->impl;
    if (impl->n_owned == impl->cap_owned) {
        size_t cap = impl->cap_owned ? 2 * impl->cap_owned : 64;
        void **n = realloc(impl->owned, cap * sizeof *n);
        if (!n) return -1;
        impl->owned = n;
        impl->cap_owned = cap;
    }
    impl->owned[impl->n_owned++] = p;
    return 0;
}

void cpu_owned_release(kern_backend *be, const void *p) {
    cpu_impl *impl = be->impl;
    for (size_t i = impl->n_owned; p && i-- > 0;)
        if (impl->owned[i] == p) {
            free(impl->owned[i]);
            impl->owned[i] = impl->owned[--impl->n_owned];
            return;
        }
}

void *cpu_scratch(kern_backend *be, size_t bytes) {
    cpu_impl *impl = be->impl;
    if (bytes <= impl->scratch_cap) return impl->scratch;
    void *p = cpu_mem_alloc(be, bytes);
    if (!p) return NULL;
    free(impl->scratch);
    impl->scratch = p;
    impl->scratch_cap = bytes;
    return p;
}

/* Everything kern_cpu_destroy must give back besides the pool: the
 * owned blocks (weights are never released one by one) and the scratch. */
void cpu_mem_free_all(cpu_impl *impl) {
    for (size_t i = 0; i < impl->n_owned; i++) free(impl->owned[i]);
    free(impl->owned);
    free(impl->scratch);
}
