/*
 * cpu: fuse_rows — one backend-owned weight holding the rows of several
 * (the model's [wq; wk; wv] and [wg; wu], so a one-token decode step runs
 * one matmul per group). The fused weight is a backend-allocated copy in
 * the parts' dtype (bytes unchanged: the matmul then reads exactly the
 * values it read from the parts), tracked in the owned list so
 * free_weight releases it.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

int cpu_fuse_rows(kern_backend *be, const kern_weight *const *parts, int n_parts, kern_weight *out) {
    int64_t rows;
    if (kern_fuse_rows_check(be, parts, n_parts, &rows)) return -1;
    size_t es = kern_dtype_size(parts[0]->dtype), row_bytes = (size_t)parts[0]->cols * es;
    char *buf = cpu_mem_alloc(be, (size_t)rows * row_bytes);
    if (!buf)
        return kern_fail(be, "fuse_rows: out of memory for (%lld, %lld) %s", (long long)rows,
                         (long long)parts[0]->cols, kern_dtype_name(parts[0]->dtype));
    size_t off = 0;
    for (int i = 0; i < n_parts; i++) {
        size_t bytes = (size_t)parts[i]->rows * row_bytes;
        memcpy(buf + off, parts[i]->data, bytes);
        off += bytes;
    }
    if (cpu_owned_add(be, buf)) {
        free(buf);
        return kern_fail(be, "fuse_rows: out of memory");
    }
    *out = (kern_weight){buf, parts[0]->dtype, rows, parts[0]->cols, 0};
    return 0;
}
