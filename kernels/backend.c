/* Backend selection and helpers shared by all backends. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/backend_internal.h"
#include "kernels/cpu/cpu.h"

int kern_fail(kern_backend *be, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(be->err, sizeof be->err, fmt, ap);
    va_end(ap);
    return -1;
}

const char *kern_last_error(const kern_backend *be) { return be ? be->err : "no backend"; }

size_t kern_dtype_size(kern_dtype dt) {
    switch (dt) {
    case KERN_F32: return 4;
    case KERN_F16:
    case KERN_BF16: return 2;
    default: return 0; /* block-quantized: no per-element size */
    }
}

const char *kern_dtype_name(kern_dtype dt) {
    switch (dt) {
    case KERN_F32: return "f32";
    case KERN_F16: return "f16";
    case KERN_BF16: return "bf16";
    case KERN_Q8_0: return "q8_0";
    case KERN_Q4_0: return "q4_0";
    case KERN_Q4_1: return "q4_1";
    case KERN_Q4_K: return "q4_k";
    case KERN_Q6_K: return "q6_k";
    case KERN_Q8_0_A8: return "q8_0_a8";
    case KERN_Q4_0_A8: return "q4_0_a8";
    case KERN_Q4_1_A8: return "q4_1_a8";
    case KERN_Q4_K_A8: return "q4_k_a8";
    case KERN_Q6_K_A8: return "q6_k_a8";
    case KERN_Q5_0: return "q5_0";
    case KERN_Q5_1: return "q5_1";
    case KERN_Q5_K: return "q5_k";
    case KERN_Q5_0_A8: return "q5_0_a8";
    case KERN_Q5_1_A8: return "q5_1_a8";
    case KERN_Q5_K_A8: return "q5_k_a8";
    }
    return "?";
}

/* IEEE binary16 -> binary32, subnormals and non-finite values included. */
float kern_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union {
        uint32_t u;
        float f;
    } v;
    if (exp == 0x1f) {
        v.u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        /* subnormal (or zero): value = man * 2^-24, exact in fp32 */
        v.f = ldexpf((float)man, -24);
        v.u |= sign;
    } else {
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    }
    return v.f;
}

/* ---- the backend table ---- */

#ifndef ECHO_HAVE_CUDA
/* A build without CUDA (CUDA=0) keeps the cuda row; it has no device. */
int kern_cuda_create(int device_index, kern_backend **be, char *err, size_t errlen) {
    (void)device_index, (void)be;
    snprintf(err, errlen, "this build has no cuda backend (built with CUDA=0); use --device cpu");
    return -1;
}
int kern_cuda_device_count(void) { return 0; }
int kern_cuda_mem_info(int device_index, size_t *free_bytes, size_t *total_bytes, char *err, size_t errlen) {
    (void)device_index;
    *free_bytes = *total_bytes = 0;
    snprintf(err, errlen, "this build has no cuda backend (built with CUDA=0)");
    return -1;
}
void kern_cuda_destroy(kern_backend *be) { (void)be; }
#endif

static int cpu_create(int nthreads, int device_index, kern_backend **be, char *err, size_t errlen) {
    (void)device_index;
    return kern_cpu_create(nthreads, be, err, errlen);
}
static int cpu_device_count(void) { return 1; }
static int cuda_create(int nthreads, int device_index, kern_backend **be, char *err, size_t errlen) {
    (void)nthreads;
    return kern_cuda_create(device_index, be, err, errlen);
}
static int cuda_device_count(void) {
    int n = kern_cuda_device_count();
    return n > 0 ? n : 0;
}

/* The host backend first: it is what auto falls back to. */
static const kern_backend_info backends[] = {
    {"cpu", 1, cpu_create, kern_cpu_destroy, cpu_device_count, NULL},
    {"cuda", 0, cuda_create, kern_cuda_destroy, cuda_device_count, kern_cuda_mem_info},
};
#define N_BACKENDS ((int)(sizeof backends / sizeof *backends))

const kern_backend_info *kern_backend_at(int i) {
    return i >= 0 && i < N_BACKENDS ? &backends[i] : NULL;
}

static const kern_backend_info *auto_row(void) {
    for (int i = 0; i < N_BACKENDS; i++)
        if (!backends[i].host && backends[i].device_count() > 0) return &backends[i];
    return &backends[0];
}

const kern_backend_info *kern_backend_find(const char *name) {
    if (name && !strcmp(name, "auto")) return auto_row();
    for (int i = 0; name && i < N_BACKENDS; i++)
        if (!strcmp(backends[i].name, name)) return &backends[i];
    return NULL;
}

int kern_backend_create(const char *device, int nthreads, int device_index, const kern_ops **ops,
                        kern_backend **be, char *err, size_t errlen) {
    *be = NULL;
    *ops = NULL;
    const kern_backend_info *b = device ? NULL : &backends[0];
    for (int i = 0; device && i < N_BACKENDS; i++)
        if (!strcmp(backends[i].name, device)) b = &backends[i];
    if (!b) {
        size_t len = (size_t)snprintf(err, errlen, "unknown device '%s' (expected ", device);
        for (int i = 0; i < N_BACKENDS && len < errlen; i++)
            len += (size_t)snprintf(err + len, errlen - len, "%s%s", backends[i].name,
                                    i + 2 < N_BACKENDS ? ", " : i + 2 == N_BACKENDS ? " or " : ")");
        return -1;
    }
    if (b->create(nthreads, device_index, be, err, errlen) != 0) return -1;
    *ops = (*be)->ops;
    return 0;
}

static int is_cpu(const kern_backend *be) {
    return be && be->ops && !strcmp(be->ops->name, backends[0].name);
}

int kern_host_threads(const kern_backend *be) {
    return is_cpu(be) ? cpu_nthreads(be) : 1;
}

void kern_host_parallel(kern_backend *be, int ntasks, kern_task_fn fn, void *arg) {
    if (is_cpu(be)) {
        cpu_parallel_for(be, ntasks, fn, arg);
        return;
    }
    for (int t = 0; t < ntasks; t++)
        fn(arg, t);
}

int kern_gpu_count(void) {
    for (int i = 0; i < N_BACKENDS; i++)
        if (!backends[i].host) return backends[i].device_count();
    return 0;
}

const char *kern_auto_device(void) { return auto_row()->name; }

void kern_backend_destroy(const kern_ops *ops, kern_backend *be) {
    if (!be) return;
    const kern_backend_info *b = &backends[0];
    for (int i = 0; ops && i < N_BACKENDS; i++)
        if (!strcmp(backends[i].name, ops->name)) b = &backends[i];
    b->destroy(be);
}

int kern_fuse_rows_check(kern_backend *be, const kern_weight *const *parts, int n_parts, int64_t *rows) {
    if (n_parts < 1 || !parts) return kern_fail(be, "fuse_rows: need at least one part (got %d)", n_parts);
    int64_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        const kern_weight *w = parts[i];
        if (!w || !w->data) return kern_fail(be, "fuse_rows: part %d has no data", i);
        if (kern_dtype_size(w->dtype) == 0)
            return kern_fail(be, "fuse_rows: part %d has unknown dtype %d", i, (int)w->dtype);
        if (w->rows < 1 || w->cols < 1)
            return kern_fail(be, "fuse_rows: part %d has bad shape (%lld, %lld)", i, (long long)w->rows,
                             (long long)w->cols);
        if (w->ld != 0 && w->ld != w->cols)
            return kern_fail(be, "fuse_rows: part %d is strided (ld %lld for %lld columns); parts must be dense", i,
                             (long long)w->ld, (long long)w->cols);
        if (w->cols != parts[0]->cols)
            return kern_fail(be, "fuse_rows: part %d has %lld columns, part 0 has %lld", i, (long long)w->cols,
                             (long long)parts[0]->cols);
        if (w->dtype != parts[0]->dtype)
            return kern_fail(be, "fuse_rows: part %d is %s, part 0 is %s", i, kern_dtype_name(w->dtype),
                             kern_dtype_name(parts[0]->dtype));
        /* the fused byte count must fit size_t on any host */
        if (w->rows > ((int64_t)1 << 40) / w->cols - total)
            return kern_fail(be, "fuse_rows: %d parts are too large to fuse", n_parts);
        total += w->rows;
    }
    *rows = total;
    return 0;
}
