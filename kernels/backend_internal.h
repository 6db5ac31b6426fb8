/*
 * Private to kernels/: the common head of every backend's state. Each
 * backend keeps its own state behind `impl`.
 */
#ifndef ECHO_KERNELS_BACKEND_INTERNAL_H
#define ECHO_KERNELS_BACKEND_INTERNAL_H

#include <stdarg.h>

#include "kernels/kernels.h"

struct kern_backend {
    const kern_ops *ops;
    char err[512];
    void *impl;
};

/* Record an op failure on the backend; always returns -1. */
int kern_fail(kern_backend *be, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* fuse_rows' argument checks, shared so both backends reject the same
 * inputs with the same messages: n_parts >= 1, every part present with
 * data, dense, the same cols and dtype as parts[0]. On success *rows is
 * the sum of the parts' rows. Returns 0 or kern_fail's -1. */
int kern_fuse_rows_check(kern_backend *be, const kern_weight *const *parts, int n_parts, int64_t *rows);

/* Backend constructors (kernels/cpu/, kernels/cuda/). */
int kern_cpu_create(int nthreads, kern_backend **be, char *err, size_t errlen);
void kern_cpu_destroy(kern_backend *be);
int kern_cuda_create(int device_index, kern_backend **be, char *err, size_t errlen);
int kern_cuda_device_count(void);
int kern_cuda_mem_info(int device_index, size_t *free_bytes, size_t *total_bytes, char *err, size_t errlen);
void kern_cuda_destroy(kern_backend *be);

#endif
