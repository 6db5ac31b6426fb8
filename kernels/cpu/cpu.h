/*
 * Private to kernels/cpu/: the cpu backend's state and its thread pool.
 *
 * The pool runs `fn(arg, task)` for task = 0..ntasks-1 on the calling thread
 * plus nthreads-1 workers. Thread i owns the i-th contiguous share of the
 * tasks and runs it in order; a thread done with its share takes tasks
 * from the end of another's, so uneven tasks (or a thread that never
 * joins) still balance. Contiguous shares keep each thread's weight rows
 * one memory stream (docs/bench-forward.md, "Contiguous shares and
 * prefetch"). One parallel region at a time per backend (a backend
 * belongs to one rank thread, so the model never nests them). The caller waits only
 * for workers that joined the region: one still waking up when the caller
 * has run every task stays out of it. After a region a worker polls for the
 * next one for ECHO_POOL_SPIN_US microseconds (default CPU_POOL_SPIN_US,
 * 0..1e6) before it sleeps: a decode step is hundreds of short regions
 * (docs/bench-forward.md).
 */
#ifndef ECHO_KERNELS_CPU_H
#define ECHO_KERNELS_CPU_H

#include <pthread.h>
#include <stdatomic.h>

#include "kernels/backend_internal.h"

typedef void (*cpu_task_fn)(void *arg, int task);

#define CPU_POOL_SPIN_US 100

struct cpu_pool;
/* A thread's share of a region's tasks, [front, back) packed as
 * front << 32 | back, on its own cache line. */
typedef struct cpu_pool_slot {
    _Alignas(64) atomic_ullong seg;
    struct cpu_pool *pool;
    int idx; /* 0: the caller */
} cpu_pool_slot;

typedef struct cpu_pool {
    int nthreads; /* including the caller */
    pthread_t *threads;
    cpu_pool_slot *slots; /* [nthreads] */
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    atomic_ulong generation; /* bumped per parallel region (under mu) */
    atomic_int stop;
    cpu_task_fn fn;
    void *arg;
    int ntasks;
    int open;     /* the region takes workers (under mu) */
    int active;   /* workers inside the region (under mu) */
    int sleepers; /* workers waiting on start_cv (under mu) */
    long spin_ns; /* a worker polls this long for the next region before it sleeps */
} cpu_pool;

/* The instruction sets the kernels have paths for. Every path computes the
 * same float operations in the same order (matmul.c), so the choice changes
 * speed, never bits; ECHO_CPU_ISA=scalar|avx2|avx512 caps it (tests). */
enum { CPU_ISA_SCALAR = 0, CPU_ISA_AVX2 = 1, CPU_ISA_AVX512 = 2 };

typedef struct cpu_impl {
    cpu_pool pool;
    int isa; /* CPU_ISA_*: what this machine has, capped by ECHO_CPU_ISA */
    /* Weights this backend allocated (random_weight, fuse_rows, copied
     * uploads): free_weight releases these and leaves every other pointer
     * alone (small uploads alias the caller's memory, the mmap). A backend
     * is driven by one thread. */
    void **owned;
    size_t n_owned, cap_owned;
    int huge; /* big blocks on 2 MiB pages, big uploads copied there (mem.c) */
    int vnni; /* AVX-512 VNNI for KERN_Q8_0_A8 (isa AVX512 and the machine has it) */
    void *scratch; /* cpu_scratch's block */
    size_t scratch_cap;
} cpu_impl;

/* mem.c. Blocks of CPU_HUGE_MIN bytes and more go on huge pages. */
#define CPU_HUGE_MIN ((size_t)2 << 20)
int cpu_huge_from_env(int *on, char *err, size_t errlen);
/* Uninitialised, 64-byte aligned (2 MiB for big blocks); free() releases. */
void *cpu_mem_alloc(const kern_backend *be, size_t bytes);
/* upload: `dev` aliases `host`, or, for a weight of CPU_HUGE_MIN bytes and
 * more while huge pages are on, is a dense backend-owned copy of it. */
int cpu_copy_weight(kern_backend *be, const kern_weight *host, kern_weight *dev);

/* Track / release (if tracked) a backend-owned allocation. mem.c. */
int cpu_owned_add(kern_backend *be, void *p);
void cpu_owned_release(kern_backend *be, const void *p);
/* mem.c: kern_ops.alloc_kv / free_kv. */
void *cpu_alloc_kv(kern_backend *be, size_t bytes);
void cpu_free_kv(kern_backend *be, void *p, size_t bytes);
/* A 64-byte aligned block of at least `bytes`, the backend's, reused by
 * the next call (one op at a time); NULL when out of memory. mem.c. */
void *cpu_scratch(kern_backend *be, size_t bytes);
/* The owned blocks and the scratch, freed (kern_cpu_destroy). mem.c. */
void cpu_mem_free_all(cpu_impl *impl);

/* pool.c. cpu_pool_init starts nthreads-1 workers (-1 on failure, after
 * which cpu_pool_destroy joins the ones that started); cpu_pool_destroy
 * stops and joins them. */
int cpu_pool_init(cpu_pool *p, int nthreads);
void cpu_pool_destroy(cpu_pool *p);
void cpu_parallel_for(kern_backend *be, int ntasks, cpu_task_fn fn, void *arg);
int cpu_nthreads(const kern_backend *be);

/* isa.c: the backend's CPU_ISA_*; the best one this machine runs; that,
 * capped by ECHO_CPU_ISA; whether the machine has AVX-512 VNNI. */
int cpu_isa(const kern_backend *be);
int cpu_isa_detect(void);
int cpu_isa_for_backend(void);
int cpu_vnni_detect(void);

/* Dot product with 16 lanes of fmas and one fixed reduction order
 * (matmul.c); the same result on every machine, every isa and in every
 * caller. */
float cpu_dot(int isa, const float *a, const float *b, int len);
/* y[k] = fma(a, x[k], y[k]) for k < len, on every isa the same bits. */
void cpu_axpy(int isa, float *y, float a, const float *x, int len);
/* o gets cpu_axpy(o, w[p], v[p]) for p = 0..n-1 in order: the same bits
 * as that loop, faster. */
void cpu_wsum(int isa, float *o, const float *w, const float *const *v, int n, int len);
/* cpu_wsum for four outputs o[j] with weights w[j] over their first n[j]
 * keys: the same bits, each value row read once for the four. */
void cpu_wsum4(int isa, float *const *o, const float *const *w, const float *const *v, const int *n, int len);
/* out[i * ldo + p] = cpu_dot(q + i * ldq, k + p * hd, hd) for i < nq,
 * p < nk: a block of queries against packed keys, matmul tiles. */
void cpu_scores(int isa, const float *q, size_t ldq, int nq, const float *k, int nk, int hd, float *out, size_t ldo);
/* glibc's expf and exp, the same bits on every path (exp.c). */
float cpu_expf(float x);
double cpu_exp(double x);
/* sum of cpu_exp((double)x[i] - (double)mx) for i < n, added in order. */
double cpu_exp_sum(int isa, const float *x, int n, float mx);
/* Attention's softmax of a row of scores, in place: s[p] *= scale, then
 * exp(s[p] - max) with cpu_expf, normalised by their sum in double (added
 * in order); the same bits on every isa. */
void cpu_softmax(int isa, float *s, int len, float scale);
/* cpu_scores with key rows ldk floats apart (keys in place in the cache). */
void cpu_scores_ld(int isa, const float *q, size_t ldq, int nq, const float *k, size_t ldk, int nk, int hd, float *out,
                   size_t ldo);
/* cpu_wsum for m outputs o[j] with weights w[j] over the same n value
 * rows: the same bits, each value row read once for up to four. */
void cpu_wsum_m(int isa, float *const *o, const float *const *w, const float *const *v, int m, int n, int len);

/* Rows r0 .. r0+nrows-1 of `w` as dense fp32 (nrows, w->cols), honouring
 * ld; every dtype, quantized ones dequantized (quant.c's values). rows.c. */
void cpu_load_rows(float *dst, const kern_weight *w, int64_t r0, int64_t nrows);
/* The same for the dtypes stored as plain rows (not the packed _A8 ones).
 * quant.c. */
void cpu_load_plain_rows(float *dst, const kern_weight *w, int64_t r0, int64_t nrows);

/* quant.c: elements [first, first+n) of a row of dtype dt starting at src,
 * as fp32 (ggml's dequantization, bit for bit); Q4_K's 6-bit scale and
 * min of sub-block j; ggml's Q8_0 quantization of n (a multiple of 32)
 * values. */
void cpu_dequant(kern_dtype dt, const void *src, int64_t first, int64_t n, float *dst);
void cpu_k_scale_min(const uint8_t *q, int j, int *sc, int *m);
void cpu_quantize_q8_0(const float *x, int64_t n, uint8_t *dst);

/* matmul_q8.c: KERN_Q8_0_A8. Pack a Q8_0 or F32/F16/BF16 weight (rows
 * quantized as cpu_quantize_q8_0 does) into the backend-owned layout; row
 * r of a packed weight as fp32 (its Q8_0 values); the matmul. */
int cpu_pack_q8a8(kern_backend *be, const kern_weight *host, kern_weight *dev);
void cpu_q8a8_row(const kern_weight *w, int64_t r, float *dst);
int cpu_matmul_q8a8(kern_backend *be, float *out, const float *in, const kern_weight *w, int n);
/* The 8-bit activations of a KERN_*_A8 matmul call (matmul_q8.c's
 * recipe), in the backend's scratch: per token K int8s q, and per 32-block
 * the scale dx, corr = -128 x the sum of q, qs = that sum and
 * sx = dx * (float)qs. */
typedef struct cpu_a8_acts {
    int8_t *q;     /* [n][K] */
    float *dx;     /* [n][nb] */
    int32_t *corr; /* [n][nb] */
    int32_t *qs;   /* [n][nb] */
    float *sx;     /* [n][nb] */
    int K, nb;
} cpu_a8_acts;

/* The kernel family a KERN_*_A8 matmul runs (cpu_a8_begin). */
enum { CPU_A8_C = 0, CPU_A8_AVX2 = 1, CPU_A8_VNNI = 2 };

/* The prologue every KERN_*_A8 matmul shares: checks w's shape (whole
 * blocks; a column view only with `views`), quantizes the n rows of `in`
 * into *a and sets *path to the family this backend runs (VNNI where the
 * isa is AVX512 and the machine has it, AVX2, else portable C). 0: go on;
 * 1: nothing to do (n or w->rows 0); -1: an error (kern_fail). */
int cpu_a8_begin(kern_backend *be, const float *in, const kern_weight *w, int n, int views, cpu_a8_acts *a,
                 int *path);

/* matmul_a8p.c: KERN_Q4_0_A8, Q4_1_A8, Q5_0_A8, Q5_1_A8, Q4_K_A8, Q5_K_A8,
 * Q6_K_A8: the ggml blocks repacked in groups of 8 rows, against 8-bit
 * activations in integers (pack from the plain blocks; row r as fp32; the
 * matmul). */
int cpu_is_a8p(kern_dtype dt);
int cpu_pack_a8p(kern_backend *be, const kern_weight *host, kern_dtype to, kern_weight *dev);
void cpu_a8p_row(const kern_weight *w, int64_t r, float *dst);
int cpu_matmul_a8p(kern_backend *be, float *out, const float *in, const kern_weight *w, int n);

/* The ops, one file per family. */
int cpu_embedding(kern_backend *be, void *out, const kern_weight *table, const int32_t *ids, int n);
int cpu_rmsnorm(kern_backend *be, void *out, const void *in, const kern_weight *w, int rows, int dim,
                float eps);
int cpu_matmul(kern_backend *be, void *out, const void *in, const kern_weight *w, int n);
int cpu_rope(kern_backend *be, void *x, const int32_t *pos, int n, int heads, int head_dim, const kern_rope *rope);
int cpu_kv_store(kern_backend *be, void *kc, void *vc, const void *k, const void *v, const int32_t *slots, int n,
                 int hkv, int hd, kern_kv_dtype dt);
/* kvcache.c: n cache rows of one kv head (src rows ld bytes apart) of
 * type dt widened to fp32 rows ldd floats apart: kern_kv_load_ref's values
 * on every isa. */
void cpu_kv_load_rows(int isa, kern_kv_dtype dt, const uint8_t *src, size_t ld, int n, int hd, float *dst,
                      size_t ldd);
/* kvcache.c, decode attention over rows read as stored (k[p], v[p]: one
 * kv head of a cache row of type dt, any type): out[i * ldo + p] =
 * cpu_dot(q_i, kern_kv_load_ref(k[p]), hd) for i < nq, p < nk; and o[j] gets
 * cpu_axpy(o[j], w[j][p], kern_kv_load_ref(v[p])) for p = 0..n-1 in order,
 * j < m. The same bits on every isa, without a widened copy. */
void cpu_kv_scores(int isa, kern_kv_dtype dt, const float *q, size_t ldq, int nq, const uint8_t *const *k, int nk,
                   int hd, float *out, size_t ldo);
void cpu_kv_wsum(int isa, kern_kv_dtype dt, float *const *o, const float *const *w, int m, const uint8_t *const *v,
                 int n, int hd);
int cpu_attention(kern_backend *be, void *out, const void *q, const void *kc, const void *vc, const kern_attn_batch *b,
                  int hq, int hkv, int hd, float scale, kern_kv_dtype dt);
int cpu_silu_mul(kern_backend *be, void *out, const void *gate, const void *up, size_t count);
int cpu_add(kern_backend *be, void *x, const void *y, size_t count);
int cpu_add_bias(kern_backend *be, void *x, const kern_weight *b, int rows, int dim);
int cpu_add_rmsnorm(kern_backend *be, void *x, const void *y, void *out, const kern_weight *w, int rows, int dim,
                    float eps);
int cpu_qk_norm_rope(kern_backend *be, void *q, void *k, const kern_weight *qw, const kern_weight *kw,
                     const int32_t *pos, int n, int hq, int hkv, int hd, float eps, const kern_rope *rope);
int cpu_logits_topk(kern_backend *be, const void *logits, int rows, int vocab, int k, int32_t *ids, float *vals,
                    float *lse);
void *cpu_stream(kern_backend *be);
int cpu_random_weight(kern_backend *be, kern_weight *dev, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                      int64_t full_cols, uint64_t seed, float offset, float scale);
int cpu_fuse_rows(kern_backend *be, const kern_weight *const *parts, int n_parts, kern_weight *out);

#endif
