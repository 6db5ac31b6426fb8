/*
 * gpu_test_cuda_comm: Echo (comm/) on the GPU.
 *
 *   a. The local transport on device memory (ranks are threads sharing one
 *      GPU, echo_world_create_local_device) against the local transport on
 *      host memory, on the same random inputs: nranks 2, 3, 4; modes exact,
 *      int4, echo; f32 and bf16; counts 1, 63, 4097, 2^20 + 5 (not
 *      multiples of the group); groups 32, 64, 128; two passes of 3 and 1
 *      calls, so echo's residual is carried between calls and reset by a
 *      new pass; plus size-policy passes where an echo residual is carried
 *      into an exact call; groups 16 and 256 (the ends of the kernels' lane
 *      mappings) at counts 7, 65, 4097, 65539; and callers' buffers one and
 *      two elements off a 16-byte boundary (the kernels' scalar paths).
 *      Outputs must be equal bit for bit (memcmp per value): one line per
 *      case with the number of differing values.
 *   a2. The device codec directly: echo_cuda_compute phase by phase against
 *      the public host codec (echo_codec_encode / echo_codec_decode: wire
 *      bytes and residuals identical) and against the host compute
 *      (bf16 inputs and outputs, the owner's phase 2), for every G and
 *      counts around the kernels' 8- and 16-value chunks (1, 7, 8, 9, 15,
 *      16, 17, 63, 64, 65) and large ones; at 9, 65 and 4097 also with
 *      misaligned buffers (values 1 or 2 elements, messages 2 or 4 bytes
 *      off), and at 65 and 4097 with a NaN and a value >= 2^127 in the
 *      input (poisoned groups: same wire bytes and residuals, NaN outputs,
 *      the same first poisoned element reported by finish).
 *   a3. Failures on the device transport: a non-finite input, an exact sum
 *      that overflows, ranks that disagree, a rank that aborts; every rank
 *      must fail with the expected message and the next pass must work.
 *   n. The nccl transport (echo_world_create_nccl, rank r on GPU r) for
 *      N = 2, 3, 4 where at least N GPUs are visible ("skipped (needs N
 *      GPUs)" otherwise), against the local transport on host memory on the
 *      same inputs: modes exact, int4, echo; f32 and bf16; counts 1, 63,
 *      4097, 65539 over two passes (residual carried, then reset); echo at
 *      G = 16, 128, 256, at 2^20 + 5 and with a buffer one element off; a
 *      size-policy pass (bf16 calls take the exact path with the residual
 *      carried in). int4/echo calls must be equal bit for bit (the same
 *      schedule and codec; NCCL only moves their bytes). Exact-path calls
 *      are a plain ncclAllReduce whose addition order (and, for bf16,
 *      per-step rounding) differs from the host's: they are compared within
 *      a bound derived from the sum of the terms' magnitudes
 *      (count_out_of_bound). nccl's outputs must be identical on every rank
 *      in every mode. Then failures (N = 3, or 2): a NaN input (every rank
 *      fails, the next pass works), an fp32 overflow, ranks that disagree on
 *      the count (every rank fails "ranks disagree"; the world is aborted
 *      and works again after echo_world_clear_abort), a rank that calls
 *      echo_abort while its peers wait in a collective or mid-pass (the peers
 *      fail within ABORT_TIMEOUT_S; the aborted world refuses new passes
 *      until echo_world_clear_abort re-creates its communicators, or is
 *      destroyed as it is), and a world on one GPU named twice (refused).
 *      Deferred worlds (echo_config.deferred: calls only enqueue, each pass
 *      ends in echo_end_pass): the same comparisons (every mode and dtype,
 *      two passes, a buffer off alignment, the size policy) and failures
 *      (a NaN and an overflow reported with their site at end_pass,
 *      disagreement, abort). Graphs: a pass captured in a CUDA graph and
 *      launched, and its replay on new inputs (echo_set_replay +
 *      echo_launch_external), bit-identical to eager passes; a capture one
 *      rank throws away (echo_discard_pass) leaves the agreement check in
 *      step for a pass of another count; an abort while every rank's graph
 *      is alive returns, and once they are destroyed the clear re-creates
 *      the communicators (the comm epoch moves); a graph kept alive past
 *      echo_world_clear_abort leaves the world dead with a message naming
 *      it, after $ECHO_NCCL_FREE_WAIT_S (NCCL >= 2.26 frees communicators
 *      only once their graphs are gone); replay is refused on a world that
 *      is not deferred.
 *      Nothing here relies on the CPU emulator (tests/emu): the same checks
 *      hold on real GPUs and NCCL.
 *   Every group of rank threads runs under a watchdog: a rank that does not
 *   return (a hang in a collective) prints a FAIL line and ends the program.
 *   b. Benchmark (GPU only): the three codec kernels on bf16 activations of
 *      64 and 256 MB beside a device-to-device copy of the same bytes, timed
 *      with cudaEvents after a warm-up. GB/s = (bytes read + bytes written)
 *      / time; the copy counts 2 * bytes. One `bench:` line per kernel with
 *      the ratio to the copy (the goal is >= 80 %).
 *
 * Lines of checks end in " PASS" or " FAIL" (tests/gpu/run.sh counts them).
 * Exit status: 0 all passed, 1 a check failed, 77 no GPU ("no GPU:
 * skipped"), 2 bad usage.
 *
 * Usage: gpu_test_cuda_comm [--device-index N] [--self-check] [--json FILE]
 *                           [--no-bench] [--bench-mb LIST] [--bench-group G]
 *                           [--nccl-only]
 * --self-check runs a, a2 and a3 with host memory on both sides (the host
 * transport and compute in place of the device ones), so the harness runs
 * on a machine without a GPU; it skips n and the benchmark. --nccl-only runs
 * part n alone (GPUs 0..N-1, whatever --device-index says).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/codec/codec.h"
#include "comm/echo.h"
#include "comm/codec/echo_codec.h"
#include "comm/echo_internal.h" /* a2 and b call the compute tables directly */
#include "comm/transport/transport.h"
#include "tests/comm_preset.h"

#define MAXN 4
#define MAXC 6
/* A job's ranks must all return within this (generous for the CPU
 * emulator); one that does not is a hang and ends the program. */
#define RUN_TIMEOUT_S 900
/* ... and within this when a peer aborts: the peers must give up promptly. */
#define ABORT_TIMEOUT_S 60

static int g_cases, g_fail;

/* ---- errors ---- */

static void die(const char *what) {
    fprintf(stderr, "fatal: %s\n", what);
    exit(1);
}

/* Main-thread CUDA calls: a failure here is a broken environment, not a
 * result, so stop with the call and the CUDA error string. */
#define CU(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t cu_e_ = (call);                                                                                    \
        if (cu_e_ != cudaSuccess) {                                                                                    \
            fprintf(stderr, "fatal: %s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, cudaGetErrorName(cu_e_),         \
                    cudaGetErrorString(cu_e_));                                                                        \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

/* Rank-thread CUDA calls: record the message and fail the case. */
#define CU_RANK(msg, call)                                                                                             \
    do {                                                                                                               \
        cudaError_t cu_e_ = (call);                                                                                    \
        if (cu_e_ != cudaSuccess) {                                                                                    \
            snprintf(msg, sizeof msg, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(cu_e_));          \
            goto out;                                                                                                  \
        }                                                                                                              \
    } while (0)

static void report(const char *what, long ndiff, const char *why) {
    int ok = ndiff == 0 && !why;
    g_cases++;
    if (!ok) g_fail++;
    printf("%-62s diff=%-8ld %s%s%s\n", what, ndiff < 0 ? 0 : ndiff, ok ? "PASS" : "FAIL", why ? ": " : "",
           why ? why : "");
    fflush(stdout);
}

/* ---- deterministic inputs (counter-based, any thread can regenerate) ---- */

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Values with a wide dynamic range, so the codec's scales vary: uniform in
 * [-1, 1) times 2^e, e in [-24, 24] changing every 37 values (not aligned to
 * any group), with runs of +0 and of -0 (all-zero groups take their own
 * path; a -0 in a group with a non-zero scale must leave a -0 residual on
 * both sides) and a few runs of tiny values (subnormal scales). */
static float value(uint64_t seed, uint64_t i) {
    uint64_t blk = i / 37, hb = mix(seed ^ mix(blk + 0x1234));
    if (hb % 23 == 0) return 0.0f;
    if (hb % 29 == 3) return -0.0f;
    int e = (int)((hb >> 8) % 49) - 24;
    if (hb % 31 == 1) e = -125;
    uint64_t h = mix(seed * 0x100000001b3ull ^ (i * 0x9e3779b97f4a7c15ull));
    float u = (float)((h >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
    return ldexpf(u, e);
}

static void fill(void *x, echo_dtype dt, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        float v = value(seed, i);
        if (dt == ECHO_F32)
            ((float *)x)[i] = v;
        else
            ((uint16_t *)x)[i] = echo_f32_to_bf16(v);
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

/* Values (of esz bytes) whose bits differ. */
static long count_diff(const void *a, const void *b, size_t n, size_t esz) {
    long d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp((const char *)a + i * esz, (const char *)b + i * esz, esz) != 0;
    return d;
}

/* ================= a, a3: the transport, one thread per rank ================= */

/* Where a world's buffers live: device -1 is host memory. The local
 * transport puts every rank on `device`; nccl puts rank r on device + r. */
typedef struct side {
    const char *name;
    int device;
    int nccl;
} side;

static int rank_device(const side *sd, int r) {
    return sd->device < 0 ? -1 : sd->nccl ? sd->device + r : sd->device;
}

typedef struct call_spec {
    int begin; /* echo_begin_pass before the call */
    int site;
    size_t count;
    echo_dtype dt;
    int odd_rank; /* this rank calls with odd_count instead (agreement check); -1: none */
    size_t odd_count;
    int abort_rank; /* this rank calls echo_abort instead, after its peers are waiting; -1: none */
    size_t shift;   /* the buffer passed to echo_allreduce starts this many elements into an aligned one */
} call_spec;

typedef struct job {
    const side *sd;
    echo_world *w;
    echo_comm *c[MAXN];
    int n, ncalls;
    call_spec calls[MAXC];
    void *in[MAXC][MAXN];  /* host inputs */
    void *out[MAXC][MAXN]; /* host copies of the outputs */
    int rc[MAXC][MAXN];
    char err[MAXC][MAXN][320];
    char fatal[MAXN][320];     /* a CUDA failure of the harness itself */
    int k0;                    /* first call to make (later rounds on a persistent world) */
    float *res_in[MAXC][MAXN]; /* host memory, when allocated: the residual carried into call k (part n) */
    volatile int done[MAXN];   /* the rank's thread has returned (watchdog) */
} job;

/* What a rank thread gets: its group's shared state and its rank. */
typedef struct rank_arg {
    void *ctx;
    int r;
} rank_arg;

/* Run fn({ctx, r}) for every rank r < n, one thread each, and wait for
 * them; each sets done[r] when it returns. A rank that has not returned
 * after `timeout_s` is a hang (e.g. a peer waiting forever in a
 * collective): that cannot be recovered from, so print a FAIL line for
 * `what` and stop. */
static void run_watched(int n, void *(*fn)(void *), void *ctx, volatile int *done, int timeout_s, const char *what) {
    pthread_t t[MAXN];
    rank_arg a[MAXN];
    for (int r = 0; r < n; r++) {
        done[r] = 0;
        a[r] = (rank_arg){ctx, r};
        if (pthread_create(&t[r], NULL, fn, &a[r])) die("pthread_create");
    }
    for (int ms = 0;; ms += 10) {
        int all = 1;
        for (int r = 0; r < n; r++)
            all &= __atomic_load_n(&done[r], __ATOMIC_ACQUIRE);
        if (all) break;
        if (ms >= timeout_s * 1000) {
            for (int r = 0; r < n; r++)
                if (!__atomic_load_n(&done[r], __ATOMIC_ACQUIRE)) {
                    printf("%-62s diff=%-8d FAIL: rank %d did not return within %d s (hang)\n", what, 0, r, timeout_s);
                    break;
                }
            fflush(stdout);
            exit(1);
        }
        usleep(10000);
    }
    for (int r = 0; r < n; r++)
        pthread_join(t[r], NULL);
}

static size_t esize(echo_dtype dt) {
    return dt == ECHO_BF16 ? 2 : 4;
}

static size_t call_count(const call_spec *cs, int r) {
    return r == cs->odd_rank ? cs->odd_count : cs->count;
}

/* A deferred world (echo_config.deferred): every call of a pass is enqueued
 * into its own device buffer, then echo_end_pass, then the outputs are read.
 * A failed end_pass fails every call of the pass that had succeeded, with
 * its message (the calls' results were not valid). */
static void *rank_main_deferred(job *j, int r, int dev, echo_comm *c) {
    cudaStream_t s = NULL;
    void *base[MAXC] = {0}, *bufs[MAXC] = {0}; /* allocation, and where the call's buffer starts */
    int first = -1;                            /* first call of the open pass */
    CU_RANK(j->fatal[r], cudaSetDevice(dev));
    CU_RANK(j->fatal[r], cudaStreamCreate(&s));
    for (int k = j->k0; k <= j->ncalls; k++) {
        const call_spec *cs = k < j->ncalls ? &j->calls[k] : NULL;
        if (first >= 0 && (!cs || cs->begin || r == cs->abort_rank)) {
            /* end the open pass [first, k) */
            char e[320];
            int rc = echo_end_pass(c, s, NULL, e, sizeof e);
            for (int q = first; q < k; q++) {
                if (rc && !j->rc[q][r]) {
                    j->rc[q][r] = -1;
                    snprintf(j->err[q][r], 320, "%s", e);
                }
                size_t bytes = call_count(&j->calls[q], r) * esize(j->calls[q].dt);
                CU_RANK(j->fatal[r], cudaMemcpyAsync(j->out[q][r], bufs[q], bytes, cudaMemcpyDeviceToHost, s));
            }
            CU_RANK(j->fatal[r], cudaStreamSynchronize(s));
            first = -1;
        }
        if (!cs) break;
        size_t n = call_count(cs, r), bytes = n * esize(cs->dt);
        char *e = j->err[k][r];
        j->rc[k][r] = 0;
        if (cs->begin && echo_begin_pass(c, ECHO_PASS_EAGER, e, 320)) {
            j->rc[k][r] = -1;
            continue;
        }
        if (r == cs->abort_rank) {
            usleep(50000); /* let the peers enqueue and wait first */
            echo_abort(c);
            j->rc[k][r] = -1;
            snprintf(e, 320, "aborted by this rank");
            break;
        }
        if (first < 0) first = k;
        CU_RANK(j->fatal[r], cudaMalloc(&base[k], (n + cs->shift) * esize(cs->dt) + 1));
        bufs[k] = (char *)base[k] + cs->shift * esize(cs->dt);
        CU_RANK(j->fatal[r], cudaMemcpyAsync(bufs[k], j->in[k][r], bytes, cudaMemcpyHostToDevice, s));
        j->rc[k][r] = echo_allreduce(c, cs->site, bufs[k], n, cs->dt, s, e, 320);
    }
out:
    if (j->fatal[r][0]) echo_abort(c);
    for (int k = 0; k < MAXC; k++)
        if (base[k]) cudaFree(base[k]);
    if (s) cudaStreamDestroy(s);
    __atomic_store_n(&j->done[r], 1, __ATOMIC_RELEASE);
    return NULL;
}

static void *rank_main(void *p) {
    rank_arg *a = p;
    job *j = a->ctx;
    int r = a->r, dev = rank_device(j->sd, r);
    echo_comm *c = j->c[r];
    cudaStream_t s = NULL;
    void *buf = NULL;
    size_t cap = 0;
    echo_config wc;
    echo_world_get_config(j->w, &wc);
    if (wc.deferred) return rank_main_deferred(j, r, dev, c);
    for (int k = 0; k < j->ncalls; k++) {
        size_t b = (call_count(&j->calls[k], r) + j->calls[k].shift) * esize(j->calls[k].dt);
        cap = b > cap ? b : cap;
    }
    if (dev >= 0) {
        CU_RANK(j->fatal[r], cudaSetDevice(dev));
        CU_RANK(j->fatal[r], cudaStreamCreate(&s));
        CU_RANK(j->fatal[r], cudaMalloc(&buf, cap ? cap : 1));
    } else {
        buf = xmalloc(cap);
    }
    for (int k = j->k0; k < j->ncalls; k++) {
        const call_spec *cs = &j->calls[k];
        size_t n = call_count(cs, r), bytes = n * esize(cs->dt);
        char *e = j->err[k][r];
        void *cbuf = (char *)buf + cs->shift * esize(cs->dt);
        j->rc[k][r] = 0;
        if (cs->begin && echo_begin_pass(c, ECHO_PASS_EAGER, e, 320)) {
            j->rc[k][r] = -1;
            continue;
        }
        if (j->res_in[k][r] && dev < 0) {
            /* host memory: the residual this call carries in (exact-path tolerance in part n) */
            if (c->res && c->res_valid)
                memcpy(j->res_in[k][r], c->res, n * sizeof(float));
            else
                memset(j->res_in[k][r], 0, n * sizeof(float));
        }
        if (r == cs->abort_rank) {
            usleep(50000); /* let the peers block in the collective first */
            echo_abort(c);
            j->rc[k][r] = -1;
            snprintf(e, 320, "aborted by this rank");
            break;
        }
        if (dev >= 0) {
            CU_RANK(j->fatal[r], cudaMemcpyAsync(cbuf, j->in[k][r], bytes, cudaMemcpyHostToDevice, s));
            j->rc[k][r] = echo_allreduce(c, cs->site, cbuf, n, cs->dt, s, e, 320);
            CU_RANK(j->fatal[r], cudaMemcpyAsync(j->out[k][r], cbuf, bytes, cudaMemcpyDeviceToHost, s));
            CU_RANK(j->fatal[r], cudaStreamSynchronize(s));
        } else {
            memcpy(cbuf, j->in[k][r], bytes);
            j->rc[k][r] = echo_allreduce(c, cs->site, cbuf, n, cs->dt, NULL, e, 320);
            memcpy(j->out[k][r], cbuf, bytes);
        }
    }
out:
    /* A harness failure left this rank's remaining calls unmade: abort the
     * world so its peers fail instead of waiting for them. */
    if (j->fatal[r][0]) echo_abort(c);
    if (dev >= 0) {
        if (buf) cudaFree(buf);
        if (s) cudaStreamDestroy(s);
    } else {
        free(buf);
    }
    __atomic_store_n(&j->done[r], 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Run the job's ranks under the watchdog (run_watched). */
static void run_ranks(job *j, int timeout_s, const char *what) {
    run_watched(j->n, rank_main, j, j->done, timeout_s, what);
}

static int world_create(const side *sd, int n, const echo_config *cfg, echo_world **w, char *err, size_t errlen) {
    if (sd->nccl) {
        int devs[MAXN];
        for (int r = 0; r < n; r++)
            devs[r] = rank_device(sd, r);
        return echo_world_create_nccl(n, devs, cfg, w, err, errlen);
    }
    if (sd->device >= 0) return echo_world_create_local_device(n, sd->device, cfg, w, err, errlen);
    return echo_world_create_local(n, cfg, w, err, errlen);
}

/* Run the job's calls on a new world of side `sd`. -1 with a message when
 * the world or a comm cannot be made, or the harness hit a CUDA error (the
 * calls' own results are in j->rc / j->err). */
static int run_job(job *j, const side *sd, const echo_config *cfg, char *why, size_t whylen) {
    char err[320];
    j->sd = sd;
    memset(j->c, 0, sizeof j->c);
    memset(j->fatal, 0, sizeof j->fatal);
    if (world_create(sd, j->n, cfg, &j->w, err, sizeof err)) {
        snprintf(why, whylen, "%s world: %s", sd->name, err);
        return -1;
    }
    int rc = 0;
    for (int r = 0; r < j->n; r++)
        if (echo_comm_create(j->w, r, &j->c[r], err, sizeof err)) {
            snprintf(why, whylen, "%s comm %d: %s", sd->name, r, err);
            rc = -1;
            goto done;
        }
    run_ranks(j, RUN_TIMEOUT_S, sd->name);
    for (int r = 0; r < j->n; r++)
        if (j->fatal[r][0]) {
            snprintf(why, whylen, "%s rank %d: %s", sd->name, r, j->fatal[r]);
            rc = -1;
        }
done:
    for (int r = 0; r < j->n; r++)
        echo_comm_destroy(j->c[r]);
    echo_world_destroy(j->w);
    j->w = NULL;
    return rc;
}

static void job_alloc(job *j, int n, int ncalls, uint64_t seed) {
    j->n = n;
    j->ncalls = ncalls;
    for (int k = 0; k < ncalls; k++)
        for (int r = 0; r < n; r++) {
            const call_spec *cs = &j->calls[k];
            size_t m = call_count(cs, r), bytes = m * esize(cs->dt);
            j->in[k][r] = xmalloc(bytes);
            j->out[k][r] = xmalloc(bytes);
            fill(j->in[k][r], cs->dt, m, mix(seed + 1000 * (uint64_t)k + (uint64_t)r));
        }
}

static void job_free(job *j) {
    for (int k = 0; k < j->ncalls; k++)
        for (int r = 0; r < j->n; r++) {
            free(j->in[k][r]);
            free(j->out[k][r]);
            free(j->res_in[k][r]);
        }
}

static call_spec spec(int begin, int site, size_t count, echo_dtype dt) {
    return (call_spec){begin, site, count, dt, -1, 0, -1, 0};
}

/* First failed call of a job, as a message; NULL if every call succeeded. */
static const char *first_error(const job *j, const char *side_name, char *buf, size_t len) {
    for (int k = 0; k < j->ncalls; k++)
        for (int r = 0; r < j->n; r++)
            if (j->rc[k][r]) {
                snprintf(buf, len, "%s call %d rank %d: %s", side_name, k, r, j->err[k][r]);
                return buf;
            }
    return NULL;
}

/* A new job of n ranks making calls cs[0..ncalls) on inputs from seed. */
static void job_new(job *j, int n, const call_spec *cs, int ncalls, uint64_t seed) {
    memset(j, 0, sizeof *j);
    memcpy(j->calls, cs, (size_t)ncalls * sizeof *cs);
    job_alloc(j, n, ncalls, seed);
}

/* jb: the calls and inputs of ja (owned by ja) with outputs of its own,
 * and no residual records (a device side keeps its residual on the GPU). */
static void job_twin(job *jb, const job *ja) {
    *jb = *ja;
    for (int k = 0; k < ja->ncalls; k++)
        for (int r = 0; r < ja->n; r++) {
            jb->out[k][r] = xmalloc(call_count(&ja->calls[k], r) * esize(ja->calls[k].dt));
            jb->res_in[k][r] = NULL;
        }
}

static void job_twin_free(job *jb) {
    for (int k = 0; k < jb->ncalls; k++)
        for (int r = 0; r < jb->n; r++)
            free(jb->out[k][r]);
}

/* Run ja on side A (config acfg) and its twin jb on B (bcfg): the first
 * failure, of the harness or of a call, as a message in why; else NULL. */
static const char *run_twins(job *ja, const side *A, const echo_config *acfg, job *jb, const side *B,
                             const echo_config *bcfg, char *why, size_t len) {
    char msg[512];
    if (run_job(ja, A, acfg, msg, sizeof msg) || run_job(jb, B, bcfg, msg, sizeof msg)) {
        snprintf(why, len, "%s", msg);
        return why;
    }
    const char *e = first_error(ja, A->name, msg, sizeof msg);
    if (!e) e = first_error(jb, B->name, msg, sizeof msg);
    if (!e) return NULL;
    snprintf(why, len, "%s", e);
    return why;
}

/* One case of part a: the same calls through side A (host) and side B. */
static void compare_case(const side *A, const side *B, const char *label, int n, echo_config cfg, const call_spec *cs,
                         int ncalls, uint64_t seed) {
    job ja, jb;
    char why[512];
    long ndiff = 0;
    job_new(&ja, n, cs, ncalls, seed);
    job_twin(&jb, &ja);
    const char *fail = run_twins(&ja, A, &cfg, &jb, B, &cfg, why, sizeof why);
    if (!fail)
        for (int k = 0; k < ncalls; k++)
            for (int r = 0; r < n; r++)
                ndiff += count_diff(ja.out[k][r], jb.out[k][r], call_count(&cs[k], r), esize(cs[k].dt));
    report(label, fail ? -1 : ndiff, fail);
    job_twin_free(&jb);
    job_free(&ja);
}

static void part_a(const side *A, const side *B) {
    const int ranks[] = {2, 3, 4};
    const echo_preset modes[] = {ECHO_PRESET_EXACT, ECHO_PRESET_NOFB, ECHO_PRESET_ECHO};
    const size_t counts[] = {1, 63, 4097, ((size_t)1 << 20) + 5};
    const int groups[] = {32, 64, 128};
    char label[128];
    uint64_t seed = 1;
    printf("== a. local transport: %s vs %s, bit for bit\n", B->name, A->name);
    for (int ni = 0; ni < 3; ni++)
        for (int mi = 0; mi < 3; mi++)
            for (int di = 0; di < 2; di++)
                for (int ci = 0; ci < 4; ci++)
                    for (int gi = 0; gi < 3; gi++) {
                        echo_dtype dt = di ? ECHO_BF16 : ECHO_F32;
                        size_t m = counts[ci];
                        echo_config cfg = test_echo_cfg(modes[mi], groups[gi], 0, 4, m, 0, 0);
                        /* two passes: residual carried over calls 0-2, reset at call 3 */
                        call_spec cs[4] = {spec(1, 0, m, dt), spec(0, 1, m, dt), spec(0, 3, m, dt), spec(1, 0, m, dt)};
                        snprintf(label, sizeof label, "allreduce n=%d %-5s %-4s G=%-3d count=%zu", ranks[ni],
                                 echo_preset_name(modes[mi]), di ? "bf16" : "f32", groups[gi], m);
                        compare_case(A, B, label, ranks[ni], cfg, cs, 4, seed++);
                    }
    /* Size policy: min_bytes between the bf16 and the f32 size of the
     * message, so f32 calls are quantized and bf16 calls take the exact
     * path, which adds the echo residual carried in. */
    for (int ni = 0; ni < 3; ni++) {
        size_t m = 4097;
        echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, 64, 3 * m, 4, m, 0, 0);
        call_spec cs[4] = {spec(1, 0, m, ECHO_F32), spec(0, 1, m, ECHO_BF16), spec(0, 2, m, ECHO_F32),
                           spec(0, 3, m, ECHO_F32)};
        snprintf(label, sizeof label, "policy    n=%d echo  f32/bf16 G=64  count=%zu", ranks[ni], m);
        compare_case(A, B, label, ranks[ni], cfg, cs, 4, seed++);
    }
    /* The codec kernels' mappings at the ends of the G range (2 lanes per
     * group at G = 16, a whole warp at 256), counts whose shards end inside
     * the kernels' 8- and 16-value chunks, and a caller's buffer one or two
     * elements off a 16-byte boundary (the kernels' scalar paths). */
    const int groups2[] = {16, 256};
    const size_t counts2[] = {7, 65, 4097, 65539};
    for (int gi = 0; gi < 2; gi++)
        for (int ci = 0; ci < 4; ci++)
            for (int mi = 1; mi < 3; mi++)
                for (int di = 0; di < 2; di++) {
                    echo_dtype dt = di ? ECHO_BF16 : ECHO_F32;
                    size_t m = counts2[ci];
                    echo_config cfg = test_echo_cfg(modes[mi], groups2[gi], 0, 4, m, 0, 0);
                    call_spec cs[4] = {spec(1, 0, m, dt), spec(0, 1, m, dt), spec(0, 3, m, dt), spec(1, 0, m, dt)};
                    snprintf(label, sizeof label, "allreduce n=3 %-5s %-4s G=%-3d count=%zu",
                             echo_preset_name(modes[mi]), di ? "bf16" : "f32", groups2[gi], m);
                    compare_case(A, B, label, 3, cfg, cs, 4, seed++);
                }
    /* The hadamard codec: rotation kernels around the same codec kernels,
     * whole groups padded past a ragged end, the residual kept rotated and
     * rotated back when the size policy sends a call to the exact path. */
    const int groups3[] = {16, 64, 256};
    const size_t counts3[] = {7, 4097, 65539};
    for (int gi = 0; gi < 3; gi++)
        for (int ci = 0; ci < 3; ci++)
            for (int mi = 1; mi < 3; mi++)
                for (int di = 0; di < 2; di++) {
                    echo_dtype dt = di ? ECHO_BF16 : ECHO_F32;
                    size_t m = counts3[ci];
                    int n = 2 + (ci & 1);
                    echo_config cfg = test_echo_cfg(modes[mi], groups3[gi], 0, 4, m, 0, ECHO_CODEC_HADAMARD);
                    call_spec cs[4] = {spec(1, 0, m, dt), spec(0, 1, m, dt), spec(0, 3, m, dt), spec(1, 0, m, dt)};
                    snprintf(label, sizeof label, "hadamard  n=%d %-5s %-4s G=%-3d count=%zu", n,
                             echo_preset_name(modes[mi]), di ? "bf16" : "f32", groups3[gi], m);
                    compare_case(A, B, label, n, cfg, cs, 4, seed++);
                }
    /* hsub6 (16-value rotations, scale records), out2 (bf16 outliers, no
     * rotation: the staged copy widened), hout2 (both) and hnf3 (hout2's
     * record, 3-bit codes: 3L/8 code bytes), G = 64..256 */
    const int groups4[] = {64, 128, 256};
    const echo_codec_id recs[] = {ECHO_CODEC_HSUB6, ECHO_CODEC_OUT2, ECHO_CODEC_HOUT2, ECHO_CODEC_HNF3};
    for (int k = 0; k < 4; k++)
        for (int gi = 0; gi < 3; gi++)
            for (int ci = 0; ci < 3; ci++)
                for (int mi = 1; mi < 3; mi++)
                    for (int di = 0; di < 2; di++) {
                        echo_dtype dt = di ? ECHO_BF16 : ECHO_F32;
                        size_t m = counts3[ci];
                        int n = 2 + (ci & 1);
                        echo_config cfg = test_echo_cfg(modes[mi], groups4[gi], 0, 4, m, 0, recs[k]);
                        call_spec cs[4] = {spec(1, 0, m, dt), spec(0, 1, m, dt), spec(0, 3, m, dt), spec(1, 0, m, dt)};
                        snprintf(label, sizeof label, "%-9s n=%d %-5s %-4s G=%-3d count=%zu",
                                 echo_codec_get(recs[k])->name, n, echo_preset_name(modes[mi]), di ? "bf16" : "f32",
                                 groups4[gi], m);
                        compare_case(A, B, label, n, cfg, cs, 4, seed++);
                    }
    for (int k = 0; k < 3; k++) {
        size_t m = 4097;
        echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, 128, 3 * m, 4, m, 0, ECHO_CODEC_HSUB6);
        call_spec cs[4] = {spec(1, 0, m, ECHO_F32), spec(0, 1, m, ECHO_BF16), spec(0, 2, m, ECHO_F32),
                           spec(0, 3, m, ECHO_F32)};
        if (k == 1) cfg.codec = ECHO_CODEC_HADAMARD, cfg.group_size = 32;
        if (k == 2) cfg.codec = ECHO_CODEC_OUT2;
        snprintf(label, sizeof label, "policy    n=3 echo  f32/bf16 %s count=%zu",
                 k == 1 ? "hadamard G=32"
                 : k    ? "out2 G=128"
                        : "hsub6 G=128",
                 m);
        compare_case(A, B, label, 3, cfg, cs, 4, seed++);
    }
    for (int gi = 0; gi < 3; gi++)
        for (int di = 0; di < 2; di++)
            for (size_t sh = 1; sh <= 2; sh++) {
                echo_dtype dt = di ? ECHO_BF16 : ECHO_F32;
                const int G = gi == 0 ? 16 : gi == 1 ? 64 : 256;
                size_t m = 4097;
                echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, G, 0, 4, m, 0, 0);
                call_spec cs[4] = {spec(1, 0, m, dt), spec(0, 1, m, dt), spec(0, 3, m, dt), spec(1, 0, m, dt)};
                for (int k = 0; k < 4; k++)
                    cs[k].shift = sh;
                snprintf(label, sizeof label, "allreduce n=3 echo  %-4s G=%-3d count=%zu buf+%zu", di ? "bf16" : "f32",
                         G, m, sh);
                compare_case(A, B, label, 3, cfg, cs, 4, seed++);
            }
}

/* Every rank's call k failed and its message holds `needle` (one of its
 * '|'-separated alternatives), or, for the rank that aborted, its own
 * marker. */
static const char *expect_all_fail(const job *j, int k, const char *needle, char *buf, size_t len) {
    for (int r = 0; r < j->n; r++) {
        int gone = 0; /* this rank aborted at call k or before and made no further calls */
        for (int q = 0; q <= k; q++)
            gone |= r == j->calls[q].abort_rank;
        if (gone) continue;
        if (j->rc[k][r] == 0) {
            snprintf(buf, len, "call %d rank %d succeeded", k, r);
            return buf;
        }
        /* needle: alternatives separated by '|' */
        int found = 0;
        for (const char *alt = needle; alt && !found; alt = strchr(alt, '|') ? strchr(alt, '|') + 1 : NULL) {
            size_t an = strchr(alt, '|') ? (size_t)(strchr(alt, '|') - alt) : strlen(alt);
            char one[160];
            snprintf(one, sizeof one, "%.*s", (int)(an < sizeof one - 1 ? an : sizeof one - 1), alt);
            found = strstr(j->err[k][r], one) != NULL;
        }
        if (!found) {
            snprintf(buf, len, "call %d rank %d: '%s' lacks '%s'", k, r, j->err[k][r], needle);
            return buf;
        }
    }
    return NULL;
}

static const char *expect_all_ok(const job *j, int k, char *buf, size_t len) {
    for (int r = 0; r < j->n; r++)
        if (j->rc[k][r]) {
            snprintf(buf, len, "call %d rank %d: %s", k, r, j->err[k][r]);
            return buf;
        }
    return NULL;
}

static void part_a3(const side *B) {
    job j;
    char why[512], buf[512], label[128];
    const char *fail;
    const size_t m = 4097;
    printf("== a3. failures on %s\n", B->name);

    /* a NaN on one rank: every rank fails the call; a new pass works */
    for (int mi = 0; mi < 3; mi++) {
        echo_preset md = mi == 0 ? ECHO_PRESET_EXACT : mi == 1 ? ECHO_PRESET_NOFB : ECHO_PRESET_ECHO;
        memset(&j, 0, sizeof j);
        j.calls[0] = spec(1, 0, m, ECHO_F32);
        j.calls[1] = spec(0, 1, m, ECHO_F32); /* the pass is aborted */
        j.calls[2] = spec(1, 0, m, ECHO_F32);
        job_alloc(&j, 3, 3, 77);
        ((float *)j.in[0][1])[1234] = NAN;
        echo_config cfg = test_echo_cfg(md, 64, 0, 4, m, 0, 0);
        fail = run_job(&j, B, &cfg, why, sizeof why) ? why : NULL;
        if (!fail) fail = expect_all_fail(&j, 0, "inf/nan", buf, sizeof buf);
        if (!fail) fail = expect_all_fail(&j, 1, "aborted by an earlier error", buf, sizeof buf);
        if (!fail) fail = expect_all_ok(&j, 2, buf, sizeof buf);
        if (!fail && count_diff(j.out[2][0], j.out[2][1], m, 4) + count_diff(j.out[2][0], j.out[2][2], m, 4))
            fail = "replicas differ after recovery";
        snprintf(label, sizeof label, "nan input     n=3 %-5s f32 count=%zu", echo_preset_name(md), m);
        report(label, 0, fail);
        job_free(&j);
    }

    /* an fp32 sum that overflows (exact path): every rank reports it */
    memset(&j, 0, sizeof j);
    j.calls[0] = spec(1, 0, m, ECHO_F32);
    j.calls[1] = spec(1, 0, m, ECHO_F32);
    job_alloc(&j, 2, 2, 78);
    ((float *)j.in[0][0])[4000] = 3e38f;
    ((float *)j.in[0][1])[4000] = 3e38f;
    {
        echo_config cfg = test_echo_cfg(ECHO_PRESET_EXACT, 64, 0, 4, m, 0, 0);
        fail = run_job(&j, B, &cfg, why, sizeof why) ? why : NULL;
        if (!fail) fail = expect_all_fail(&j, 0, "element 4000 of the exact all-reduce is not finite", buf, sizeof buf);
        if (!fail) fail = expect_all_ok(&j, 1, buf, sizeof buf);
        snprintf(label, sizeof label, "sum overflow  n=2 exact f32 count=%zu", m);
        report(label, 0, fail);
    }
    job_free(&j);

    /* ranks that disagree on the count: every rank fails alike */
    for (int mi = 0; mi < 2; mi++) {
        echo_preset md = mi ? ECHO_PRESET_NOFB : ECHO_PRESET_EXACT;
        memset(&j, 0, sizeof j);
        j.calls[0] = spec(1, 0, m, ECHO_BF16);
        j.calls[0].odd_rank = 2;
        j.calls[0].odd_count = m - 1;
        j.calls[1] = spec(1, 0, m, ECHO_BF16);
        job_alloc(&j, 3, 2, 79);
        echo_config cfg = test_echo_cfg(md, 32, 0, 4, m, 0, 0);
        fail = run_job(&j, B, &cfg, why, sizeof why) ? why : NULL;
        if (!fail) fail = expect_all_fail(&j, 0, "ranks disagree", buf, sizeof buf);
        if (!fail) fail = expect_all_ok(&j, 1, buf, sizeof buf);
        snprintf(label, sizeof label, "disagreement  n=3 %-5s bf16 count=%zu/%zu", echo_preset_name(md), m, m - 1);
        report(label, 0, fail);
        job_free(&j);
    }

    /* a rank that aborts instead of calling: the peers fail "aborted";
     * after echo_world_clear_abort the next pass works. The world must
     * outlive both jobs, so this one drives the ranks itself. */
    for (int mi = 0; mi < 2; mi++) {
        echo_preset md = mi ? ECHO_PRESET_ECHO : ECHO_PRESET_EXACT;
        echo_config cfg = test_echo_cfg(md, 64, 0, 4, m, 0, 0);
        char err[320];
        memset(&j, 0, sizeof j);
        j.calls[0] = spec(1, 0, m, ECHO_F32);
        j.calls[0].abort_rank = 2;
        j.calls[1] = spec(0, 1, m, ECHO_F32);
        job_alloc(&j, 3, 2, 80);
        j.sd = B;
        fail = NULL;
        if (world_create(B, 3, &cfg, &j.w, err, sizeof err)) {
            snprintf(why, sizeof why, "world: %s", err);
            fail = why;
        }
        for (int r = 0; r < 3 && !fail; r++)
            if (echo_comm_create(j.w, r, &j.c[r], err, sizeof err)) {
                snprintf(why, sizeof why, "comm %d: %s", r, err);
                fail = why;
            }
        for (int round = 0; round < 2 && !fail; round++) {
            if (round == 1) {
                echo_world_clear_abort(j.w);
                j.calls[0].abort_rank = -1;
            }
            run_ranks(&j, ABORT_TIMEOUT_S, "abort + clear");
            for (int r = 0; r < 3 && !fail; r++)
                if (j.fatal[r][0]) {
                    snprintf(why, sizeof why, "rank %d: %s", r, j.fatal[r]);
                    fail = why;
                }
            if (!fail && round == 0)
                fail = expect_all_fail(&j, 0, "aborted because another rank failed", buf, sizeof buf);
            if (!fail && round == 1) fail = expect_all_ok(&j, 0, buf, sizeof buf);
            if (!fail && round == 1) fail = expect_all_ok(&j, 1, buf, sizeof buf);
        }
        for (int r = 0; r < 3; r++)
            echo_comm_destroy(j.c[r]);
        echo_world_destroy(j.w);
        snprintf(label, sizeof label, "abort + clear n=3 %-5s f32 count=%zu", echo_preset_name(md), m);
        report(label, 0, fail);
        job_free(&j);
    }
}

/* ================= n: the nccl transport against the host ================= */

/* The exact path on nccl is a plain ncclAllReduce, whose order of addition
 * (ring or tree, chunk by chunk) and, for bf16, rounding after each step
 * differ from the host's fixed order: it is compared within a bound, not
 * bit for bit. T = sum over ranks of |x + res| (the terms); any order of an
 * fp32 sum of N terms is within (N-1) u T of the exact sum (u = 2^-24), and
 * a bf16 ring that rounds each of its N-1 steps within (N-1) 2^-8 T; then
 * the output rounding (one bf16 ulp <= 2^-7 |out|). Returns the number of
 * values of `b` outside the bound around `a` (NaN must meet NaN). */
static long count_out_of_bound(const job *j, int k, const void *a, const void *b) {
    const call_spec *cs = &j->calls[k];
    size_t n = cs->count;
    int N = j->n;
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        double T = 0;
        for (int r = 0; r < N; r++) {
            double x = cs->dt == ECHO_F32 ? ((const float *)j->in[k][r])[i]
                                          : (double)echo_bf16_to_f32(((const uint16_t *)j->in[k][r])[i]);
            T += fabs(x + (j->res_in[k][r] ? j->res_in[k][r][i] : 0.0));
        }
        double va = cs->dt == ECHO_F32 ? ((const float *)a)[i] : (double)echo_bf16_to_f32(((const uint16_t *)a)[i]);
        double vb = cs->dt == ECHO_F32 ? ((const float *)b)[i] : (double)echo_bf16_to_f32(((const uint16_t *)b)[i]);
        if (isnan(va) || isnan(vb)) {
            bad += !(isnan(va) && isnan(vb));
            continue;
        }
        double bound = cs->dt == ECHO_F32 ? 2.0 * (N - 1) * ldexp(T, -24) * 1.01 + N * ldexp(1.0, -149)
                                          : (N + 1) * ldexp(T, -8) + ldexp(fabs(va), -7) + N * ldexp(1.0, -133);
        bad += !(fabs(va - vb) <= bound);
    }
    return bad;
}

/* The path a call takes (echo.c's size policy). */
static int call_is_exact(const echo_config *cfg, const call_spec *cs) {
    return cfg->codec == ECHO_CODEC_NONE || cs->count * esize(cs->dt) < cfg->min_bytes;
}

/* One case of part n: the same calls through the host local transport and
 * nccl. Quantized calls must match bit for bit (the same schedule and codec;
 * NCCL only moves their bytes), exact-path calls within the bound above;
 * and nccl's replicas must be identical on every rank in every mode. */
static void nccl_case(const side *H, const side *B, const char *label, int n, echo_config cfg, const call_spec *cs,
                      int ncalls, uint64_t seed) {
    job ja, jb;
    char why[512];
    long ndiff = 0;
    job_new(&ja, n, cs, ncalls, seed);
    for (int k = 0; k < ncalls; k++)
        if (call_is_exact(&cfg, &cs[k]))
            for (int r = 0; r < n; r++)
                ja.res_in[k][r] = xmalloc(cs[k].count * sizeof(float));
    job_twin(&jb, &ja);
    echo_config hcfg = cfg;
    hcfg.deferred = 0; /* the host reference meets at every call */
    const char *fail = run_twins(&ja, H, &hcfg, &jb, B, &cfg, why, sizeof why);
    if (!fail)
        for (int k = 0; k < ncalls; k++) {
            size_t m = cs[k].count, es = esize(cs[k].dt);
            for (int r = 0; r < n; r++) {
                if (call_is_exact(&cfg, &cs[k]))
                    ndiff += count_out_of_bound(&ja, k, ja.out[k][r], jb.out[k][r]);
                else
                    ndiff += count_diff(ja.out[k][r], jb.out[k][r], m, es);
                ndiff += count_diff(jb.out[k][0], jb.out[k][r], m, es);
            }
        }
    report(label, fail ? -1 : ndiff, fail);
    job_twin_free(&jb);
    job_free(&ja);
}

/* A world that outlives several rounds of rank threads (abort, clear). */
static const char *session_open(job *j, const side *B, const echo_config *cfg, char *why, size_t len) {
    char err[320];
    j->sd = B;
    if (world_create(B, j->n, cfg, &j->w, err, sizeof err)) {
        snprintf(why, len, "world: %s", err);
        return why;
    }
    for (int r = 0; r < j->n; r++)
        if (echo_comm_create(j->w, r, &j->c[r], err, sizeof err)) {
            snprintf(why, len, "comm %d: %s", r, err);
            return why;
        }
    return NULL;
}

static void session_close(job *j) {
    for (int r = 0; r < j->n; r++)
        echo_comm_destroy(j->c[r]);
    echo_world_destroy(j->w);
    j->w = NULL;
    memset(j->c, 0, sizeof j->c);
}

static const char *round_fatal(const job *j, char *why, size_t len) {
    for (int r = 0; r < j->n; r++)
        if (j->fatal[r][0]) {
            snprintf(why, len, "rank %d: %s", r, j->fatal[r]);
            return why;
        }
    return NULL;
}

/* Every rank's call k ended with the same bits. */
static const char *expect_replicas(const job *j, int k, char *buf, size_t len) {
    const call_spec *cs = &j->calls[k];
    for (int r = 1; r < j->n; r++)
        if (count_diff(j->out[k][0], j->out[k][r], cs->count, esize(cs->dt))) {
            snprintf(buf, len, "call %d: rank %d's output differs from rank 0's", k, r);
            return buf;
        }
    return NULL;
}

/* Failures on nccl: what every rank must see, and that the world recovers
 * (echo_world_clear_abort re-creates its communicators) or at least fails
 * cleanly. N ranks on GPUs 0..N-1. */
static void part_n_failures(const side *B, int N) {
    job j;
    char why[512], buf[512], label[128];
    const char *fail;
    const size_t m = 4097;

    /* a NaN on one rank: every rank fails the call; a new pass works (no
     * abort). Deferred (echo_config.deferred): both calls of the pass fail
     * at echo_end_pass, which names the site. */
    for (int d = 0; d < 2; d++)
        for (int mi = 0; mi < 3; mi++) {
            echo_preset md = mi == 0 ? ECHO_PRESET_EXACT : mi == 1 ? ECHO_PRESET_NOFB : ECHO_PRESET_ECHO;
            memset(&j, 0, sizeof j);
            j.calls[0] = spec(1, 0, m, ECHO_BF16);
            j.calls[1] = spec(0, 1, m, ECHO_BF16);
            j.calls[2] = spec(1, 0, m, ECHO_BF16);
            job_alloc(&j, N, 3, 91 + 100 * (uint64_t)d);
            ((uint16_t *)j.in[0][N - 1])[1234] = 0x7fc0; /* NaN */
            echo_config cfg = test_echo_cfg(md, 64, 0, 4, m, d, 0);
            fail = run_job(&j, B, &cfg, why, sizeof why) ? why : NULL;
            if (!fail) fail = expect_all_fail(&j, 0, d ? "at site 0 is not finite" : "inf/nan", buf, sizeof buf);
            if (!fail)
                fail = expect_all_fail(&j, 1, d ? "at site 0 is not finite" : "aborted by an earlier error", buf,
                                       sizeof buf);
            if (!fail) fail = expect_all_ok(&j, 2, buf, sizeof buf);
            if (!fail) fail = expect_replicas(&j, 2, buf, sizeof buf);
            snprintf(label, sizeof label, "nccl %snan input  n=%d %-5s bf16 count=%zu", d ? "deferred " : "", N,
                     echo_preset_name(md), m);
            report(label, 0, fail);
            job_free(&j);
        }

    /* an fp32 sum that overflows (exact path, the pass's second call):
     * every rank reports the element; deferred, at echo_end_pass, which
     * fails the whole pass and names the site */
    for (int d = 0; d < 2; d++) {
        memset(&j, 0, sizeof j);
        j.calls[0] = spec(1, 0, m, ECHO_F32);
        j.calls[1] = spec(0, 2, m, ECHO_F32);
        j.calls[2] = spec(1, 0, m, ECHO_F32);
        job_alloc(&j, N, 3, 92 + 100 * (uint64_t)d);
        for (int r = 0; r < N; r++)
            ((float *)j.in[1][r])[4000] = 3e38f;
        echo_config cfg = test_echo_cfg(ECHO_PRESET_EXACT, 64, 0, 4, m, d, 0);
        fail = run_job(&j, B, &cfg, why, sizeof why) ? why : NULL;
        if (!fail && d) fail = expect_all_fail(&j, 0, "element 4000 of the all-reduce at site 2", buf, sizeof buf);
        if (!fail && !d) fail = expect_all_ok(&j, 0, buf, sizeof buf);
        if (!fail)
            fail = expect_all_fail(&j, 1,
                                   d ? "element 4000 of the all-reduce at site 2"
                                     : "element 4000 of the exact all-reduce is not finite",
                                   buf, sizeof buf);
        if (!fail) fail = expect_all_ok(&j, 2, buf, sizeof buf);
        snprintf(label, sizeof label, "nccl %ssum overflow n=%d exact f32 count=%zu", d ? "deferred " : "", N, m);
        report(label, 0, fail);
        job_free(&j);
    }

    /* Ranks that disagree on the count: nccl.c compares the ranks' calls on
     * the host before enqueuing, so every rank fails "ranks disagree" and
     * nothing mismatched reaches NCCL; the world is then aborted (a rank
     * may have enqueued already), the next pass fails until
     * echo_world_clear_abort, then works. */
    for (int mi = 0; mi < 2; mi++) {
        echo_preset md = mi ? ECHO_PRESET_NOFB : ECHO_PRESET_EXACT;
        echo_config cfg = test_echo_cfg(md, 32, 0, 4, m, 0, 0);
        memset(&j, 0, sizeof j);
        j.calls[0] = spec(1, 0, m, ECHO_BF16);
        j.calls[0].odd_rank = N - 1;
        j.calls[0].odd_count = m - 1;
        j.calls[1] = spec(1, 0, m, ECHO_BF16);
        job_alloc(&j, N, 2, 93);
        fail = session_open(&j, B, &cfg, why, sizeof why);
        if (!fail) {
            run_ranks(&j, ABORT_TIMEOUT_S, "nccl disagreement");
            fail = round_fatal(&j, why, sizeof why);
        }
        if (!fail) fail = expect_all_fail(&j, 0, "ranks disagree", buf, sizeof buf);
        if (!fail) fail = expect_all_fail(&j, 1, "echo_world_clear_abort", buf, sizeof buf);
        if (!fail) {
            echo_world_clear_abort(j.w);
            j.k0 = 1;
            run_ranks(&j, ABORT_TIMEOUT_S, "nccl disagreement, after clear");
            fail = round_fatal(&j, why, sizeof why);
        }
        if (!fail) fail = expect_all_ok(&j, 1, buf, sizeof buf);
        if (!fail) fail = expect_replicas(&j, 1, buf, sizeof buf);
        session_close(&j);
        snprintf(label, sizeof label, "nccl disagreement  n=%d %-5s bf16 count=%zu/%zu", N, echo_preset_name(md), m,
                 m - 1);
        report(label, 0, fail);
        job_free(&j);
    }

    /* A rank that calls echo_abort instead of the call while its peers wait
     * in the collective (call 0), or in the middle of a pass (call 1): the
     * peers fail "aborted" within ABORT_TIMEOUT_S, the pass is aborted, the
     * world refuses use until echo_world_clear_abort, then works (round 1,
     * bits identical on every rank). `clear` = 0 destroys the aborted world
     * without clearing it (clean-up path). */
    for (int ci = 0; ci < 4; ci++) {
        echo_preset md = ci & 1 ? ECHO_PRESET_ECHO : ECHO_PRESET_EXACT;
        int at = ci < 2 ? 0 : 1, clear = ci < 2;
        echo_config cfg = test_echo_cfg(md, 64, 0, 4, m, 0, 0);
        memset(&j, 0, sizeof j);
        if (at == 0) {
            j.calls[0] = spec(1, 0, m, ECHO_F32);
            j.calls[1] = spec(0, 1, m, ECHO_F32);
            j.calls[2] = spec(1, 2, m, ECHO_F32);
        } else {
            j.calls[0] = spec(1, 0, m, ECHO_F32);
            j.calls[1] = spec(0, 1, m, ECHO_F32);
            j.calls[2] = spec(1, 0, m, ECHO_F32);
        }
        j.calls[at].abort_rank = N - 1;
        job_alloc(&j, N, 3, 94 + (uint64_t)ci);
        fail = session_open(&j, B, &cfg, why, sizeof why);
        if (!fail) {
            run_ranks(&j, ABORT_TIMEOUT_S, "nccl abort");
            fail = round_fatal(&j, why, sizeof why);
        }
        if (!fail && at == 1) fail = expect_all_ok(&j, 0, buf, sizeof buf);
        if (!fail) fail = expect_all_fail(&j, at, "aborted because another rank failed", buf, sizeof buf);
        if (!fail && at == 0) fail = expect_all_fail(&j, 1, "aborted by an earlier error", buf, sizeof buf);
        /* a new pass on the aborted world: refused, with the way out */
        if (!fail) fail = expect_all_fail(&j, 2, "echo_world_clear_abort", buf, sizeof buf);
        if (!fail && clear) {
            echo_world_clear_abort(j.w);
            j.calls[at].abort_rank = -1;
            run_ranks(&j, ABORT_TIMEOUT_S, "nccl abort, after clear");
            fail = round_fatal(&j, why, sizeof why);
            for (int k = 0; k < 3 && !fail; k++)
                fail = expect_all_ok(&j, k, buf, sizeof buf);
            for (int k = 0; k < 3 && !fail; k++)
                fail = expect_replicas(&j, k, buf, sizeof buf);
        }
        if (j.w) session_close(&j);
        snprintf(label, sizeof label, "nccl abort at call %d%s n=%d %-5s f32 count=%zu", at,
                 clear ? " + clear" : ", no clear", N, echo_preset_name(md), m);
        report(label, 0, fail);
        job_free(&j);
    }

    /* Deferred worlds: a disagreement or an abort surfaces at echo_end_pass
     * (or, where a collective blocks until its peers arrive, as the
     * emulator's does, at the call); the world recovers as above. */
    for (int ci = 0; ci < 2; ci++) {
        /* ci 0: ranks disagree at call 0; ci 1: the last rank aborts instead of call 0 */
        echo_config cfg = test_echo_cfg(ci ? ECHO_PRESET_ECHO : ECHO_PRESET_NOFB, 32, 0, 4, m, 1, 0);
        memset(&j, 0, sizeof j);
        j.calls[0] = spec(1, 0, m, ECHO_BF16);
        j.calls[1] = spec(0, 1, m, ECHO_BF16);
        j.calls[2] = spec(1, 0, m, ECHO_BF16);
        if (ci) {
            j.calls[0].abort_rank = N - 1;
        } else {
            j.calls[0].odd_rank = N - 1;
            j.calls[0].odd_count = m - 1;
        }
        job_alloc(&j, N, 3, 193 + (uint64_t)ci);
        fail = session_open(&j, B, &cfg, why, sizeof why);
        if (!fail) {
            run_ranks(&j, ABORT_TIMEOUT_S, "nccl deferred failure");
            fail = round_fatal(&j, why, sizeof why);
        }
        const char *peer = "aborted because another rank failed|aborted by an earlier error|ranks disagree";
        if (!fail) fail = expect_all_fail(&j, 0, peer, buf, sizeof buf);
        if (!fail) fail = expect_all_fail(&j, 1, peer, buf, sizeof buf);
        if (!fail && !ci) {
            int seen = 0; /* the rank that posted last found the disagreement */
            for (int r = 0; r < N; r++)
                seen |= strstr(j.err[0][r], "ranks disagree") != NULL;
            if (!seen) fail = "no rank reported the disagreement";
        }
        if (!fail) fail = expect_all_fail(&j, 2, "echo_world_clear_abort", buf, sizeof buf);
        if (!fail) {
            echo_world_clear_abort(j.w);
            j.calls[0].abort_rank = -1;
            j.k0 = ci ? 0 : 2; /* the odd rank's call 0 has a buffer of the odd count: not made again */
            run_ranks(&j, ABORT_TIMEOUT_S, "nccl deferred, after clear");
            fail = round_fatal(&j, why, sizeof why);
            for (int k = j.k0; k < 3 && !fail; k++)
                fail = expect_all_ok(&j, k, buf, sizeof buf);
            for (int k = j.k0; k < 3 && !fail; k++)
                fail = expect_replicas(&j, k, buf, sizeof buf);
        }
        if (j.w) session_close(&j);
        snprintf(label, sizeof label, "nccl deferred %s n=%d + clear", ci ? "abort at call 0" : "disagreement", N);
        report(label, 0, fail);
        job_free(&j);
    }

    /* one GPU named twice: NCCL refuses the world, with a message */
    {
        const int devs[2] = {B->device, B->device};
        echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, 64, 0, 4, m, 0, 0);
        echo_world *w = NULL;
        char err[320];
        int rc = echo_world_create_nccl(2, devs, &cfg, &w, err, sizeof err);
        fail = NULL;
        if (rc == 0) {
            fail = "created";
            echo_world_destroy(w);
        } else if (!strstr(err, "ncclCommInitAll")) {
            snprintf(why, sizeof why, "message lacks the failing call: %s", err);
            fail = why;
        }
        report("nccl world on a duplicated device fails", 0, fail);
    }
}

/* ---- n, graphs: deferred calls captured in a CUDA graph and replayed ---- */

#define GR_CALLS 3

typedef struct graph_job {
    echo_world *w;
    echo_comm *c[MAXN];
    int n;
    size_t m, m2;                 /* counts of the graph's calls, and of the check pass after it */
    int discard_rank;             /* this rank captures pass D and throws it away */
    void *in[2][GR_CALLS][MAXN];  /* host inputs of the two passes (bf16) */
    void *out[4][GR_CALLS][MAXN]; /* captured+launched, replayed, eager of in[0], eager of in[1] */
    char fail[MAXN][384];
    volatile int done[MAXN];
    cudaGraph_t gr[MAXN]; /* each rank's graph of pass A, kept for the abort checks */
    cudaGraphExec_t ex[MAXN];
} graph_job;

static int gr_launch(void *arg, char *err, size_t errlen) {
    void **a = arg; /* exec, stream */
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)a[0], (cudaStream_t)a[1]);
    if (e == cudaSuccess) return 0;
    snprintf(err, errlen, "cudaGraphLaunch: %s", cudaGetErrorString(e));
    return -1;
}

#define GR_TRY(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            snprintf(j->fail[r], sizeof j->fail[r], __VA_ARGS__);                                                      \
            goto out;                                                                                                  \
        }                                                                                                              \
    } while (0)

/* One rank: passes A (capture + launch), B (replay), C and D (eager, the
 * reference of A and B), then, on discard_rank only, a capture thrown away
 * before its pass is made eagerly; last a pass with another count on every
 * rank, which the agreement check would refuse if the thrown-away posts
 * had not been retracted. The graph of A is left alive (j->gr, j->ex). */
static void *graph_rank(void *p) {
    rank_arg *a = p;
    graph_job *j = a->ctx;
    int r = a->r;
    echo_comm *c = j->c[r];
    cudaStream_t s = NULL;
    cudaGraph_t gr = NULL;
    cudaGraphExec_t ex = NULL;
    void *buf[GR_CALLS] = {0}, *big = NULL;
    char err[320];
    const size_t bytes = j->m * 2;
    GR_TRY(cudaSetDevice(r) == cudaSuccess, "cudaSetDevice");
    GR_TRY(cudaStreamCreate(&s) == cudaSuccess, "cudaStreamCreate");
    for (int k = 0; k < GR_CALLS; k++)
        GR_TRY(cudaMalloc(&buf[k], bytes) == cudaSuccess, "cudaMalloc");
    GR_TRY(cudaMalloc(&big, j->m2 * 2) == cudaSuccess, "cudaMalloc");
    /* passes: 0 = A capture, 1 = B replay, 2 = C eager(in 0), 3 = D eager(in 1) */
    for (int pass = 0; pass < 4; pass++) {
        const int src = pass & 1;
        for (int k = 0; k < GR_CALLS; k++)
            GR_TRY(cudaMemcpy(buf[k], j->in[src][k][r], bytes, cudaMemcpyHostToDevice) == cudaSuccess, "H2D");
        GR_TRY(!echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err), "pass %d begin: %s", pass, err);
        if (pass == 0) GR_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture");
        if (pass == 1) GR_TRY(!echo_set_replay(c, 1, err, sizeof err), "set_replay: %s", err);
        for (int k = 0; k < GR_CALLS; k++)
            GR_TRY(!echo_allreduce(c, 2 * k, buf[k], j->m, ECHO_BF16, s, err, sizeof err), "pass %d call %d: %s", pass,
                   k, err);
        if (pass == 0) {
            GR_TRY(cudaStreamEndCapture(s, &gr) == cudaSuccess && gr, "end capture");
            GR_TRY(cudaGraphInstantiate(&ex, gr, 0ULL) == cudaSuccess, "instantiate");
        }
        if (pass <= 1) {
            void *la[2] = {ex, s};
            GR_TRY(!echo_launch_external(c, gr_launch, la, err, sizeof err), "pass %d launch: %s", pass, err);
        }
        GR_TRY(!echo_end_pass(c, s, NULL, err, sizeof err), "pass %d end: %s", pass, err);
        for (int k = 0; k < GR_CALLS; k++)
            GR_TRY(cudaMemcpy(j->out[pass][k][r], buf[k], bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "D2H");
    }
    /* pass E: discard_rank captures and throws the capture away, then makes
     * the pass eagerly; pass F: another count */
    for (int k = 0; k < GR_CALLS; k++)
        GR_TRY(cudaMemcpy(buf[k], j->in[0][k][r], bytes, cudaMemcpyHostToDevice) == cudaSuccess, "H2D");
    GR_TRY(!echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err), "pass E begin: %s", err);
    if (r == j->discard_rank) {
        cudaGraph_t g2 = NULL;
        GR_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture E");
        for (int k = 0; k < GR_CALLS; k++)
            GR_TRY(!echo_allreduce(c, 2 * k, buf[k], j->m, ECHO_BF16, s, err, sizeof err), "E capture call %d: %s", k,
                   err);
        GR_TRY(cudaStreamEndCapture(s, &g2) == cudaSuccess && g2, "end capture E");
        cudaGraphDestroy(g2);
        echo_discard_pass(c);
        GR_TRY(!echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err), "pass E begin again: %s", err);
    }
    for (int k = 0; k < GR_CALLS; k++)
        GR_TRY(!echo_allreduce(c, 2 * k, buf[k], j->m, ECHO_BF16, s, err, sizeof err), "E call %d: %s", k, err);
    GR_TRY(!echo_end_pass(c, s, NULL, err, sizeof err), "pass E end: %s", err);
    GR_TRY(!echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err), "pass F begin: %s", err);
    GR_TRY(cudaMemset(big, 0, j->m2 * 2) == cudaSuccess, "memset");
    for (int k = 0; k < GR_CALLS; k++)
        GR_TRY(!echo_allreduce(c, 2 * k, big, j->m2, ECHO_BF16, s, err, sizeof err), "F call %d: %s", k, err);
    GR_TRY(!echo_end_pass(c, s, NULL, err, sizeof err), "pass F end: %s", err);
out:
    if (j->fail[r][0]) echo_abort(c);
    j->ex[r] = ex; /* the caller destroys them (its abort checks) */
    j->gr[r] = gr;
    for (int k = 0; k < GR_CALLS; k++)
        if (buf[k]) cudaFree(buf[k]);
    if (big) cudaFree(big);
    if (s) cudaStreamDestroy(s);
    __atomic_store_n(&j->done[r], 1, __ATOMIC_RELEASE);
    return NULL;
}

/* echo_vote: each rank votes votes[r] (-1: calls echo_abort instead) */
typedef struct vote_job {
    echo_comm *c[MAXN];
    int votes[MAXN], rc[MAXN], agreed[MAXN];
    char err[MAXN][320];
    volatile int done[MAXN];
} vote_job;

static void *vote_rank(void *p) {
    rank_arg *a = p;
    vote_job *v = a->ctx;
    int r = a->r;
    if (v->votes[r] < 0) {
        usleep(50000); /* let the peers wait in the vote first */
        echo_abort(v->c[r]);
        v->rc[r] = -1;
    } else {
        v->rc[r] = echo_vote(v->c[r], v->votes[r], &v->agreed[r], v->err[r], sizeof v->err[r]);
    }
    __atomic_store_n(&v->done[r], 1, __ATOMIC_RELEASE);
    return NULL;
}

/* The vote before a graph launch: agreed only when every rank holds the
 * same non-zero code, the same answer on every rank; an abort ends a wait
 * in it. On a deferred world of N ranks (its comms c). */
static const char *vote_cases(echo_world *w, echo_comm *const *c, int N, char *why, size_t len) {
    static const int pat[][MAXN] = {{1, 1, 1, 1}, {2, 2, 2, 2}, {1, 0, 1, 1},
                                    {1, 2, 1, 2}, {0, 0, 0, 0}, {1, 1, 1, -1}};
    static const int want[] = {1, 1, 0, 0, 0, -1};
    for (int p = 0; p < (int)(sizeof want / sizeof *want); p++) {
        vote_job v;
        memset(&v, 0, sizeof v);
        for (int r = 0; r < N; r++) {
            v.c[r] = c[r];
            v.votes[r] = pat[p][r];
        }
        if (want[p] < 0) v.votes[N - 1] = -1; /* the last rank aborts */
        run_watched(N, vote_rank, &v, v.done, ABORT_TIMEOUT_S, "nccl vote");
        for (int r = 0; r < N; r++) {
            if (v.votes[r] < 0) continue;
            if (want[p] < 0 ? v.rc[r] == 0 : v.rc[r] != 0 || v.agreed[r] != want[p]) {
                snprintf(why, len, "pattern %d rank %d: rc %d agreed %d (want %d) %s", p, r, v.rc[r], v.agreed[r],
                         want[p], v.err[r]);
                return why;
            }
        }
        if (want[p] < 0) echo_world_clear_abort(w);
    }
    return NULL;
}

/* Whether world w (its N comms c) is usable, asked without touching NCCL:
 * every rank votes 1 (echo_vote fails at once on an aborted or dead world).
 * 0 when they agreed; -1 with rank 0's message in err otherwise. */
static int world_votes(echo_comm *const *c, int N, char *err, size_t len) {
    vote_job v;
    memset(&v, 0, sizeof v);
    for (int r = 0; r < N; r++) {
        v.c[r] = c[r];
        v.votes[r] = 1;
    }
    run_watched(N, vote_rank, &v, v.done, ABORT_TIMEOUT_S, "nccl vote");
    int ok = 1;
    for (int r = 0; r < N; r++)
        ok &= v.rc[r] == 0 && v.agreed[r] == 1;
    snprintf(err, len, "%s", v.err[0]);
    return ok ? 0 : -1;
}

static void free_graphs(graph_job *j) {
    for (int r = 0; r < MAXN; r++) {
        if (j->ex[r]) cudaGraphExecDestroy(j->ex[r]);
        if (j->gr[r]) cudaGraphDestroy(j->gr[r]);
        j->ex[r] = NULL;
        j->gr[r] = NULL;
    }
}

/* Against the contract, rank 0 keeps a graph of its calls alive through an
 * abort and echo_world_clear_abort: the clear waits for it only
 * $ECHO_NCCL_FREE_WAIT_S (part_n_graphs sets 2 s), then leaves the world
 * unusable with a message that names the graph; echo_world_destroy then
 * finishes once the graph is gone. Capture needs no peer (nothing runs),
 * so one thread does it. */
static const char *graph_kept_past_clear(graph_job *j, char *why, size_t len) {
    char err[320];
    cudaStream_t s = NULL;
    void *buf = NULL;
    const char *f = NULL;
    if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess || cudaMalloc(&buf, j->m * 2))
        return "cuda set-up";
    cudaMemset(buf, 0, j->m * 2);
    if (echo_begin_pass(j->c[0], ECHO_PASS_EAGER, err, sizeof err) ||
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        f = "begin";
    for (int k = 0; k < GR_CALLS && !f; k++)
        if (echo_allreduce(j->c[0], 2 * k, buf, j->m, ECHO_BF16, s, err, sizeof err)) f = "captured call";
    if (cudaStreamEndCapture(s, &j->gr[0]) != cudaSuccess || !j->gr[0]) f = f ? f : "end capture";
    echo_discard_pass(j->c[0]);
    if (!f) {
        echo_abort(j->c[0]);
        echo_world_clear_abort(j->w);
        char reason[400] = "";
        if (!world_votes(j->c, j->n, err, sizeof err))
            f = "the world works again although a graph of its old communicators is alive";
        else if (!strstr(err, "CUDA graph")) {
            snprintf(why, len, "message does not name the graph: %.300s", err);
            f = why;
        } else if (echo_world_usable(j->w, reason, sizeof reason) || !strstr(reason, "CUDA graph")) {
            snprintf(why, len, "echo_world_usable does not say the world is dead: %.300s", reason);
            f = why;
        }
    }
    free_graphs(j);
    cudaFree(buf);
    cudaStreamDestroy(s);
    return f;
}

/* Deferred nccl calls in a CUDA graph (what the model does for decode steps
 * at tp > 1): a captured pass and its replay on new inputs give the bits of
 * eager passes; a capture thrown away on one rank (echo_discard_pass)
 * leaves the agreement check in step; after an abort and
 * echo_world_clear_abort the comm's epoch has changed (graphs of the old
 * communicators must not be replayed). */
static void part_n_graphs(int N) {
    char label[128], err[320], why[400];
    const char *fail = NULL;
    graph_job j;
    memset(&j, 0, sizeof j);
    j.n = N;
    j.m = 4097;
    j.m2 = 1000;
    j.discard_rank = 0;
    echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, 64, 0, 2 * GR_CALLS, j.m, 1, 0);
    for (int src = 0; src < 2; src++)
        for (int k = 0; k < GR_CALLS; k++)
            for (int r = 0; r < N; r++) {
                j.in[src][k][r] = xmalloc(j.m * 2);
                fill(j.in[src][k][r], ECHO_BF16, j.m, mix(7000 + 100 * (uint64_t)src + 10 * (uint64_t)k + (uint64_t)r));
            }
    for (int pass = 0; pass < 4; pass++)
        for (int k = 0; k < GR_CALLS; k++)
            for (int r = 0; r < N; r++)
                j.out[pass][k][r] = xmalloc(j.m * 2);
    int devs[MAXN];
    for (int r = 0; r < N; r++)
        devs[r] = r;
    setenv("ECHO_NCCL_FREE_WAIT_S", "2", 1); /* read at creation: graph_kept_past_clear waits that long */
    int wrc = echo_world_create_nccl(N, devs, &cfg, &j.w, err, sizeof err);
    unsetenv("ECHO_NCCL_FREE_WAIT_S");
    if (wrc) {
        snprintf(why, sizeof why, "world: %s", err);
        fail = why;
    }
    for (int r = 0; r < N && !fail; r++)
        if (echo_comm_create(j.w, r, &j.c[r], err, sizeof err)) fail = "comm create";
    if (!fail) {
        run_watched(N, graph_rank, &j, j.done, ABORT_TIMEOUT_S, "nccl graphs");
        for (int r = 0; r < N && !fail; r++)
            if (j.fail[r][0]) {
                snprintf(why, sizeof why, "rank %d: %.300s", r, j.fail[r]);
                fail = why;
            }
    }
    long d_capture = 0, d_replay = 0, d_inputs = 0;
    if (!fail)
        for (int k = 0; k < GR_CALLS; k++)
            for (int r = 0; r < N; r++) {
                d_capture += count_diff(j.out[0][k][r], j.out[2][k][r], j.m, 2);
                d_replay += count_diff(j.out[1][k][r], j.out[3][k][r], j.m, 2);
                d_inputs += !count_diff(j.out[0][k][r], j.out[1][k][r], j.m, 2); /* the replay saw new inputs */
            }
    snprintf(label, sizeof label, "nccl graph n=%d captured pass == eager (bits)", N);
    report(label, fail ? -1 : d_capture, fail);
    snprintf(label, sizeof label, "nccl graph n=%d replay, new inputs == eager (bits)", N);
    report(label, fail ? -1 : d_replay + d_inputs, fail);
    snprintf(label, sizeof label, "nccl graph n=%d discarded capture, then count %zu", N, j.m2);
    report(label, 0, fail);
    /* An abort while every rank's graph is alive returns (NCCL >= 2.26
     * frees the communicators only once those graphs are destroyed, so an
     * abort that ended them in place would wait here for ever); once the
     * graphs are gone the communicators are made anew and the epoch moves. */
    if (!fail) {
        uint64_t e0 = echo_comm_epoch(j.c[0]);
        echo_abort(j.c[1]);
        free_graphs(&j);
        echo_world_clear_abort(j.w);
        uint64_t e1 = echo_comm_epoch(j.c[0]);
        const char *f = e1 != e0 ? NULL : "epoch unchanged";
        if (!f && !echo_world_usable(j.w, err, sizeof err)) f = "echo_world_usable: 0 after a clear that worked";
        if (!f && world_votes(j.c, N, err, sizeof err)) {
            snprintf(why, sizeof why, "after clear: %.300s", err);
            f = why;
        }
        snprintf(label, sizeof label, "nccl graph n=%d abort with graphs alive; epoch %llu -> %llu after clear", N,
                 (unsigned long long)e0, (unsigned long long)e1);
        report(label, 0, f);
    }
    free_graphs(&j);
    if (!fail) {
        snprintf(label, sizeof label, "nccl graph n=%d vote (agree, disagree, abort)", N);
        report(label, 0, vote_cases(j.w, j.c, N, why, sizeof why));
    }
    if (!fail) {
        snprintf(label, sizeof label, "nccl graph n=%d kept past clear_abort: world dead, naming it", N);
        report(label, 0, graph_kept_past_clear(&j, why, sizeof why));
    }
    /* set_replay on a world that is not deferred is refused */
    for (int r = 0; r < N; r++)
        echo_comm_destroy(j.c[r]);
    echo_world_destroy(j.w);
    {
        echo_config plain = cfg;
        plain.deferred = 0;
        echo_world *w = NULL;
        echo_comm *c = NULL;
        const char *f2 = NULL;
        if (echo_world_create_nccl(N, devs, &plain, &w, err, sizeof err) || echo_comm_create(w, 0, &c, err, sizeof err))
            f2 = "world";
        else if (echo_set_replay(c, 1, err, sizeof err) == 0 || !strstr(err, "deferred"))
            f2 = "set_replay accepted on a world that is not deferred";
        snprintf(label, sizeof label, "nccl graph n=%d replay refused without deferred", N);
        report(label, 0, f2);
        echo_comm_destroy(c);
        echo_world_destroy(w);
    }
    for (int src = 0; src < 2; src++)
        for (int k = 0; k < GR_CALLS; k++)
            for (int r = 0; r < N; r++)
                free(j.in[src][k][r]);
    for (int pass = 0; pass < 4; pass++)
        for (int k = 0; k < GR_CALLS; k++)
            for (int r = 0; r < N; r++)
                free(j.out[pass][k][r]);
}

static void part_n(const side *H, int ndev, int self) {
    const echo_preset modes[] = {ECHO_PRESET_EXACT, ECHO_PRESET_NOFB, ECHO_PRESET_ECHO};
    const size_t counts[] = {1, 63, 4097, 65539};
    const side nc = {"nccl", 0, 1};
    char label[128];
    uint64_t seed = 5000;
    printf("== n. nccl transport (rank r on GPU r) vs the local transport on host memory: int4/echo bit for bit, "
           "exact within the ring-order bound\n");
    for (int N = 2; N <= MAXN; N++) {
        if (self) {
            printf("nccl n=%d: skipped (self-check: no GPU)\n", N);
            continue;
        }
        if (ndev < N) {
            printf("nccl n=%d: skipped (needs %d GPUs, %d visible)\n", N, N, ndev);
            continue;
        }
        for (int mi = 0; mi < 3; mi++)
            for (int di = 0; di < 2; di++)
                for (int ci = 0; ci < 4; ci++) {
                    echo_dtype dt = di ? ECHO_BF16 : ECHO_F32;
                    size_t mm = counts[ci];
                    echo_config cfg = test_echo_cfg(modes[mi], 64, 0, 4, mm, 0, 0);
                    /* two passes: residual carried over calls 0-2, reset at call 3 */
                    call_spec cs[4] = {spec(1, 0, mm, dt), spec(0, 1, mm, dt), spec(0, 3, mm, dt), spec(1, 0, mm, dt)};
                    snprintf(label, sizeof label, "nccl n=%d %-5s %-4s G=64  count=%zu", N, echo_preset_name(modes[mi]),
                             di ? "bf16" : "f32", mm);
                    nccl_case(H, &nc, label, N, cfg, cs, 4, seed++);
                }
        /* other groups, a large odd count, a caller's buffer off alignment */
        for (int di = 0; di < 2; di++) {
            echo_dtype dt = di ? ECHO_BF16 : ECHO_F32;
            const int groups[] = {16, 128, 256};
            for (int gi = 0; gi < 3; gi++) {
                size_t mm = 4097;
                echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, groups[gi], 0, 4, mm, 0, 0);
                call_spec cs[4] = {spec(1, 0, mm, dt), spec(0, 1, mm, dt), spec(0, 3, mm, dt), spec(1, 0, mm, dt)};
                snprintf(label, sizeof label, "nccl n=%d echo  %-4s G=%-3d count=%zu", N, di ? "bf16" : "f32",
                         groups[gi], mm);
                nccl_case(H, &nc, label, N, cfg, cs, 4, seed++);
            }
            size_t big = ((size_t)1 << 20) + 5;
            echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, 64, 0, 4, big, 0, 0);
            call_spec cb[2] = {spec(1, 0, big, dt), spec(0, 1, big, dt)};
            snprintf(label, sizeof label, "nccl n=%d echo  %-4s G=64  count=%zu", N, di ? "bf16" : "f32", big);
            nccl_case(H, &nc, label, N, cfg, cb, 2, seed++);
            echo_config cfs = test_echo_cfg(ECHO_PRESET_ECHO, 64, 0, 4, 4097, 0, 0);
            call_spec cs[3] = {spec(1, 0, 4097, dt), spec(0, 1, 4097, dt), spec(0, 2, 4097, dt)};
            for (int k = 0; k < 3; k++)
                cs[k].shift = 1;
            snprintf(label, sizeof label, "nccl n=%d echo  %-4s G=64  count=4097 buf+1", N, di ? "bf16" : "f32");
            nccl_case(H, &nc, label, N, cfs, cs, 3, seed++);
        }
        /* Size policy: bf16 calls below min_bytes take the exact path and add
         * the echo residual carried in (fp32 all-reduce); the f32 calls
         * around them are quantized, bit for bit. */
        {
            size_t mm = 4097;
            echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, 64, 3 * mm, 4, mm, 0, 0);
            call_spec cs[4] = {spec(1, 0, mm, ECHO_F32), spec(0, 1, mm, ECHO_BF16), spec(0, 2, mm, ECHO_F32),
                               spec(0, 3, mm, ECHO_F32)};
            snprintf(label, sizeof label, "nccl policy n=%d echo f32/bf16 G=64  count=%zu", N, mm);
            nccl_case(H, &nc, label, N, cfg, cs, 4, seed++);
            cfg.deferred = 1;
            snprintf(label, sizeof label, "nccl deferred policy n=%d echo f32/bf16 count=%zu", N, mm);
            nccl_case(H, &nc, label, N, cfg, cs, 4, seed++);
        }
        /* Deferred (echo_config.deferred): a pass's calls only enqueue, each
         * into its own buffer, and echo_end_pass waits once; the same bits. */
        for (int mi = 0; mi < 3; mi++)
            for (int di = 0; di < 2; di++)
                for (int ci = 1; ci < 4; ci += 2) {
                    echo_dtype dt = di ? ECHO_BF16 : ECHO_F32;
                    size_t mm = counts[ci];
                    echo_config cfg = test_echo_cfg(modes[mi], 64, 0, 4, mm, 1, 0);
                    call_spec cs[5] = {spec(1, 0, mm, dt), spec(0, 1, mm, dt), spec(0, 3, mm, dt), spec(1, 0, mm, dt),
                                       spec(0, 2, mm, dt)};
                    cs[4].shift = 1;
                    snprintf(label, sizeof label, "nccl deferred n=%d %-5s %-4s count=%zu", N,
                             echo_preset_name(modes[mi]), di ? "bf16" : "f32", mm);
                    nccl_case(H, &nc, label, N, cfg, cs, 5, seed++);
                }
    }
    if (self) return;
    if (ndev < 2) {
        printf("nccl failures: skipped (needs 2 GPUs, %d visible)\n", ndev);
        return;
    }
    part_n_failures(&nc, ndev >= 3 ? 3 : 2);
    part_n_graphs(2);
    if (ndev >= 4) part_n_graphs(4);
}

/* ================= a2: the codec kernels against the host codec ================= */

/* Memory of one side of the codec check: GPU `device`, or host memory. */
typedef struct mem {
    int device;
    cudaStream_t s;
} mem;

static void *m_alloc(const mem *m, size_t bytes) {
    if (m->device < 0) return xmalloc(bytes);
    void *p;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}
static void m_free(const mem *m, void *p) {
    if (m->device < 0)
        free(p);
    else
        CU(cudaFree(p));
}
static void m_put(const mem *m, void *dst, const void *src, size_t bytes) {
    if (m->device < 0)
        memcpy(dst, src, bytes);
    else
        CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
static void m_get(const mem *m, void *dst, const void *src, size_t bytes) {
    if (m->device < 0)
        memcpy(dst, src, bytes);
    else
        CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

/* A rank for calling a compute table directly: the cuda compute needs its
 * device and its per-rank state, the host compute the owner's scratch. */
typedef struct fake_rank {
    echo_comm c;
    echo_world w; /* zeroed: a world that is not deferred (the computes read its config) */
    const echo_compute_ops *k;
} fake_rank;

static void fake_init(fake_rank *f, const mem *m, size_t scratch_values) {
    char err[320];
    memset(f, 0, sizeof *f);
    f->c.w = &f->w;
    f->c.device = m->device;
    f->k = m->device >= 0 ? &echo_cuda_compute : &echo_host_compute;
    if (m->device >= 0) {
        if (f->k->comm_init(&f->c, err, sizeof err)) die(err);
    } else {
        f->c.scratch = xmalloc(scratch_values * sizeof(float) + 4);
    }
}

static void fake_fini(fake_rank *f) {
    if (f->k == &echo_cuda_compute)
        f->k->comm_fini(&f->c);
    else
        free(f->c.scratch);
}

/* The geometry of one message of `count` values as a single shard of L =
 * ceil(count/G)*G values: its wire form is exactly echo_codec_encode's. */
static echo_plan one_shard(size_t count, int nranks, int group, echo_dtype dt) {
    echo_plan p;
    p.count = count;
    p.shard = (count + (size_t)group - 1) / (size_t)group * (size_t)group;
    p.wire = p.shard / 2 + 2 * (p.shard / (size_t)group);
    p.nranks = nranks;
    p.group = group;
    p.dt = dt;
    return p;
}

/* Values (of dt) whose bits differ, counting two NaNs as equal (a poisoned
 * group decodes to NaN; its payload is not part of the format). */
static long count_diff_nan(const void *a, const void *b, size_t n, echo_dtype dt) {
    long d = 0;
    for (size_t i = 0; i < n; i++) {
        float x, y;
        if (dt == ECHO_F32) {
            x = ((const float *)a)[i];
            y = ((const float *)b)[i];
        } else {
            x = echo_bf16_to_f32(((const uint16_t *)a)[i]);
            y = echo_bf16_to_f32(((const uint16_t *)b)[i]);
        }
        if (isnan(x) && isnan(y)) continue;
        d += memcmp(&x, &y, sizeof x) != 0;
    }
    return d;
}

/* How a2 places and fills the device buffers. The kernels use 16-byte
 * (values, residuals) and 4/8-byte (codes) accesses only on aligned
 * pointers and must give the same bits through their scalar paths: `shift`
 * puts every value and residual buffer that many elements past an aligned
 * allocation (a caller's buffer can start anywhere), `wshift` every message
 * that many bytes past one (an all-gather of messages with an odd number
 * of scales leaves every other one 2 bytes off a 4-byte boundary).
 * `poison` puts a NaN and a value >= 2^127 into two groups of the input. */
typedef struct a2_variant {
    const char *name;
    size_t shift, wshift;
    int poison;
} a2_variant;

static void *m_alloc_at(const mem *m, size_t bytes, size_t off, void **base) {
    *base = m_alloc(m, bytes + off);
    return (char *)*base + off;
}

static void a2_case(const mem *D, fake_rank *fd, fake_rank *fh, size_t m, int G, echo_dtype dt, const a2_variant *v,
                    uint64_t seed) {
    char label[128], err[320];
    size_t esz = esize(dt), bad_h = ECHO_NO_INDEX, bad_d = ECHO_NO_INDEX, bad;
    const char *dn = dt == ECHO_BF16 ? "bf16" : "f32";
    echo_plan p1 = one_shard(m, 1, G, dt);
    size_t wb = p1.wire, xs = v->shift * esz, fs = v->shift * 4, ws = v->wshift;
    if (wb != echo_codec_wire_bytes(m, G)) die("wire size mismatch between the plan and the codec");
    void *x = xmalloc(m * esz);
    float *res0 = xmalloc(m * 4), *res_h = xmalloc(m * 4), *res_d = xmalloc(m * 4);
    uint8_t *wire_h = xmalloc(wb), *wire_d = xmalloc(wb);
    fill(x, dt, m, seed);
    if (v->poison) {
        size_t i1 = m / 3, i2 = 2 * m / 3 + 1 < m ? 2 * m / 3 + 1 : m - 1;
        if (dt == ECHO_F32) {
            ((float *)x)[i1] = NAN;
            ((float *)x)[i2] = 3e38f;
        } else {
            ((uint16_t *)x)[i1] = echo_f32_to_bf16(NAN);
            ((uint16_t *)x)[i2] = echo_f32_to_bf16(3e38f);
        }
    }
    for (size_t i = 0; i < m; i++)
        res0[i] = ldexpf(value(900, i), -6);
    memcpy(res_h, res0, m * 4);
    /* phase 1 with error feedback on one destination: the fake rank (1)
     * lies outside the one-shard plan, so its own shard is skipped and
     * shard 0 is coded */
    fh->c.rank = 1;
    fd->c.rank = 1;
    const int public_codec = dt == ECHO_F32 && !v->poison; /* echo_codec_encode refuses poison */
    if (public_codec) {
        if (echo_codec_encode(x, res_h, m, G, wire_h, err, sizeof err)) die(err);
    } else {
        uint8_t *send[1] = {wire_h};
        fh->k->phase1(&fh->c, &p1, x, res_h, 1, send, &bad, NULL, err, sizeof err);
    }
    void *bx, *bres, *bwire, *by, *bg, *bout, *bpeer[3] = {NULL, NULL, NULL};
    void *dx = m_alloc_at(D, m * esz, xs, &bx);
    float *dres = m_alloc_at(D, m * 4, fs, &bres);
    uint8_t *dwire = m_alloc_at(D, wb, ws, &bwire);
    m_put(D, dx, x, m * esz);
    m_put(D, dres, res0, m * 4);
    {
        uint8_t *send[1] = {dwire};
        if (fd->k->phase1(&fd->c, &p1, dx, dres, 1, send, &bad, D->s, err, sizeof err)) die(err);
        if (D->device >= 0) CU(cudaStreamSynchronize(D->s));
    }
    m_get(D, wire_d, dwire, wb);
    m_get(D, res_d, dres, m * 4);
    snprintf(label, sizeof label, "encode+res %-4s G=%-3d count=%zu%s (vs %s)", dn, G, m, v->name,
             public_codec ? "echo_codec_encode" : "host compute");
    report(label, count_diff(wire_h, wire_d, wb, 1) + count_diff(res_h, res_d, m, 4), NULL);

    /* finish: decode the host's message into dt (the same bytes on both
     * sides, whatever encode gave); the first element of a poisoned group
     * is reported alike */
    m_put(D, dwire, wire_h, wb);
    echo_plan pf = one_shard(m, 1, G, dt);
    void *y_h = xmalloc(m * esz), *y_d = xmalloc(m * esz);
    void *dy = m_alloc_at(D, m * esz, xs, &by);
    if (public_codec) {
        echo_codec_decode(wire_h, m, G, y_h, 0);
    } else {
        const uint8_t *g1[1] = {wire_h};
        fh->k->finish(&fh->c, &pf, g1, y_h, &bad_h, NULL, err, sizeof err);
    }
    {
        const uint8_t *g1[1] = {dwire};
        if (fd->k->finish(&fd->c, &pf, g1, dy, &bad_d, D->s, err, sizeof err)) die(err);
    }
    m_get(D, y_d, dy, m * esz);
    snprintf(label, sizeof label, "decode     %-4s G=%-3d count=%zu%s (vs %s)", dn, G, m, v->name,
             public_codec ? "echo_codec_decode" : "host compute");
    {
        char why[128];
        snprintf(why, sizeof why, "first poisoned element %lld, host %lld (-1: none)",
                 bad_d == ECHO_NO_INDEX ? -1LL : (long long)bad_d, bad_h == ECHO_NO_INDEX ? -1LL : (long long)bad_h);
        report(label, count_diff_nan(y_h, y_d, m, dt), bad_h != bad_d ? why : NULL);
    }

    /* phase 2, owner 0 of 3 ranks: its raw shard plus two peers' messages,
     * with the carried residual g */
    echo_plan p2 = one_shard(m, 3, G, dt);
    uint8_t *peer_h[3] = {NULL, xmalloc(wb), xmalloc(wb)};
    uint8_t *dpeer[3] = {NULL, m_alloc_at(D, wb, ws, &bpeer[1]), m_alloc_at(D, wb, ws, &bpeer[2])};
    float *ftmp = xmalloc(m * 4);
    for (int j = 1; j < 3; j++) {
        fill(ftmp, ECHO_F32, m, 700 + (uint64_t)j);
        if (echo_codec_encode(ftmp, NULL, m, G, peer_h[j], err, sizeof err)) die(err);
        m_put(D, dpeer[j], peer_h[j], wb);
    }
    float *g_h = xmalloc(m * 4), *g_d = xmalloc(m * 4);
    for (size_t i = 0; i < m; i++)
        g_h[i] = ldexpf(value(901, i), -7);
    float *dg = m_alloc_at(D, m * 4, fs, &bg);
    m_put(D, dg, g_h, m * 4);
    uint8_t *out_h = xmalloc(wb), *out_d = xmalloc(wb), *dout = m_alloc_at(D, wb, ws, &bout);
    fh->c.rank = 0;
    fd->c.rank = 0;
    {
        const uint8_t *recv[3] = {NULL, peer_h[1], peer_h[2]};
        fh->k->phase2(&fh->c, &p2, x, recv, g_h, 1, out_h, NULL, err, sizeof err);
        const uint8_t *drecv[3] = {NULL, dpeer[1], dpeer[2]};
        if (fd->k->phase2(&fd->c, &p2, dx, drecv, dg, 1, dout, D->s, err, sizeof err)) die(err);
        if (D->device >= 0) CU(cudaStreamSynchronize(D->s));
    }
    m_get(D, out_d, dout, wb);
    m_get(D, g_d, dg, m * 4);
    snprintf(label, sizeof label, "phase2+res %-4s G=%-3d count=%zu%s (vs host compute)", dn, G, m, v->name);
    report(label, count_diff(out_h, out_d, wb, 1) + count_diff(g_h, g_d, m, 4), NULL);

    m_free(D, bx);
    m_free(D, bres);
    m_free(D, bwire);
    m_free(D, by);
    m_free(D, bg);
    m_free(D, bout);
    for (int j = 1; j < 3; j++) {
        m_free(D, bpeer[j]);
        free(peer_h[j]);
    }
    free(x), free(res0), free(res_h), free(res_d), free(wire_h), free(wire_d), free(y_h), free(y_d);
    free(ftmp), free(g_h), free(g_d), free(out_h), free(out_d);
}

static void part_a2(const mem *D) {
    const int groups[] = {16, 32, 64, 128, 256};
    /* around the kernels' 8- and 16-value chunks and the groups, then a
     * few large ones (many blocks, the grid-stride loops wrapping) */
    const size_t counts[] = {1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 4097, ((size_t)1 << 20) + 5};
    const int ncounts = (int)(sizeof counts / sizeof *counts);
    const a2_variant variants[] = {
        {"", 0, 0, 0},
        {" buf+1", 1, 2, 0},
        {" buf+2", 2, 4, 0},
        {" poison", 0, 0, 1},
    };
    const mem H = {-1, NULL};
    fake_rank fd, fh;
    printf("== a2. codec: %s compute vs the host codec, bit for bit\n", D->device >= 0 ? "cuda" : "host");
    for (int ci = 0; ci < ncounts; ci++)
        for (int gi = 0; gi < 5; gi++) {
            size_t m = counts[ci];
            int G = groups[gi];
            fake_init(&fd, D, m + (size_t)G);
            fake_init(&fh, &H, m + (size_t)G);
            for (int di = 0; di < 2; di++)
                for (int vi = 0; vi < 4; vi++) {
                    /* misaligned buffers at a few counts; poison where there are several groups */
                    if (vi > 0 && m != 9 && m != 65 && m != 4097) continue;
                    if (vi == 3 && m < 64) continue;
                    a2_case(D, &fd, &fh, m, G, di ? ECHO_BF16 : ECHO_F32, &variants[vi],
                            500 + (uint64_t)ci * 10 + (uint64_t)gi);
                }
            fake_fini(&fd);
            fake_fini(&fh);
        }
}

/* ================= b: benchmark ================= */

typedef struct bench_row {
    const char *kernel;
    size_t mb;
    int ranks;
    double bytes, us, gbps, copy_gbps, pct;
} bench_row;

#define MAX_ROWS 32

/* Mean time of one enqueue of `fn` over `iters` iterations on stream s,
 * after `warm` untimed ones. */
typedef int (*bench_fn)(void *ctx, char *err, size_t errlen);

static double time_us(bench_fn fn, void *ctx, cudaStream_t s, int warm, int iters) {
    char err[320];
    cudaEvent_t a, b;
    float ms;
    for (int i = 0; i < warm; i++)
        if (fn(ctx, err, sizeof err)) die(err);
    CU(cudaStreamSynchronize(s));
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    CU(cudaEventRecord(a, s));
    for (int i = 0; i < iters; i++)
        if (fn(ctx, err, sizeof err)) die(err);
    CU(cudaEventRecord(b, s));
    CU(cudaEventSynchronize(b));
    CU(cudaEventElapsedTime(&ms, a, b));
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    return 1000.0 * ms / iters;
}

typedef struct bench_ctx {
    fake_rank *f;
    echo_plan p;
    cudaStream_t s;
    void *x, *y, *src, *dst;
    float *res;
    uint8_t *wire[MAXN], *out;
    size_t bytes;
} bench_ctx;

static int b_copy(void *ctx, char *err, size_t errlen) {
    bench_ctx *b = ctx;
    cudaError_t e = cudaMemcpyAsync(b->dst, b->src, b->bytes, cudaMemcpyDeviceToDevice, b->s);
    if (e != cudaSuccess) snprintf(err, errlen, "cudaMemcpyAsync: %s", cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : -1;
}
static int b_phase1(void *ctx, char *err, size_t errlen) {
    bench_ctx *b = ctx;
    size_t bad;
    uint8_t *send[1] = {b->wire[0]};
    b->f->c.rank = 1; /* outside the one-shard plan: shard 0 is coded */
    return b->f->k->phase1(&b->f->c, &b->p, b->x, b->res, 1, send, &bad, b->s, err, errlen);
}
static int b_phase2(void *ctx, char *err, size_t errlen) {
    bench_ctx *b = ctx;
    const uint8_t *recv[MAXN] = {NULL};
    for (int j = 1; j < b->p.nranks; j++)
        recv[j] = b->wire[j];
    b->f->c.rank = 0;
    return b->f->k->phase2(&b->f->c, &b->p, b->x, recv, b->res, 1, b->out, b->s, err, errlen);
}
static int b_finish(void *ctx, char *err, size_t errlen) {
    bench_ctx *b = ctx;
    const uint8_t *g[1] = {b->wire[0]};
    return echo_cuda_finish_async(&b->f->c, &b->p, g, b->y, b->s, err, errlen);
}

static int part_b(int device, const size_t *mbs, int nmb, int G, bench_row *rows) {
    const mem D = {device, NULL};
    int nrows = 0;
    cudaStream_t s;
    CU(cudaStreamCreate(&s));
    fake_rank f;
    fake_init(&f, &D, 0);
    printf("== b. codec kernels on bf16 activations, G=%d, vs a device-to-device copy of the same bytes\n", G);
    for (int si = 0; si < nmb; si++) {
        size_t bytes = mbs[si] << 20, M = bytes / 2;
        echo_plan p1 = one_shard(M, 1, G, ECHO_BF16);
        size_t wb = p1.wire;
        int iters = bytes > ((size_t)128 << 20) ? 10 : 20;
        bench_ctx b = {.f = &f, .p = p1, .s = s, .bytes = bytes};
        uint16_t *hx = xmalloc(bytes);
        uint64_t z = 0x243f6a8885a308d3ull;
        for (size_t i = 0; i < M; i++) { /* a cheap generator: hashing 128M values would dominate */
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            hx[i] =
                echo_f32_to_bf16(ldexpf((float)(int32_t)(z >> 32) * (1.0f / 2147483648.0f), (int)((z >> 20) % 9) - 4));
        }
        CU(cudaMalloc(&b.x, bytes));
        CU(cudaMalloc(&b.y, bytes));
        CU(cudaMalloc(&b.src, bytes));
        CU(cudaMalloc(&b.dst, bytes));
        CU(cudaMalloc((void **)&b.res, M * sizeof(float)));
        CU(cudaMalloc((void **)&b.out, wb));
        for (int j = 0; j < MAXN; j++)
            CU(cudaMalloc((void **)&b.wire[j], wb));
        CU(cudaMemcpy(b.x, hx, bytes, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(b.src, hx, bytes, cudaMemcpyHostToDevice));
        CU(cudaMemset(b.res, 0, M * sizeof(float)));
        free(hx);
        /* real messages for phase 2 and finish to decode */
        char err[320];
        if (b_phase1(&b, err, sizeof err)) die(err);
        CU(cudaStreamSynchronize(s));
        for (int j = 1; j < MAXN; j++)
            CU(cudaMemcpy(b.wire[j], b.wire[0], wb, cudaMemcpyDeviceToDevice));

        double copy_us = time_us(b_copy, &b, s, 3, iters);
        double copy_gbps = 2.0 * (double)bytes / (copy_us * 1e3);
        double esz = 2, r4 = 4.0 * (double)M;
        struct {
            const char *name;
            bench_fn fn;
            int ranks;
            double bytes;
        } ks[] = {
            /* x and the residual read, the residual and the message written */
            {"phase1_encode_res", b_phase1, 1, esz * M + r4 + r4 + wb},
            /* own shard and N-1 messages read, g read and written, one message written */
            {"phase2_owner_n2", b_phase2, 2, esz * M + 1.0 * wb + r4 + r4 + wb},
            {"phase2_owner_n4", b_phase2, 4, esz * M + 3.0 * wb + r4 + r4 + wb},
            /* one message read, the activations written */
            {"finish_decode", b_finish, 1, (double)wb + esz * M},
        };
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
            b.p = one_shard(M, ks[ki].ranks, G, ECHO_BF16);
            double us = time_us(ks[ki].fn, &b, s, 3, iters);
            bench_row *r = &rows[nrows++];
            *r = (bench_row){ks[ki].name, mbs[si], ks[ki].ranks, ks[ki].bytes, us, ks[ki].bytes / (us * 1e3),
                             copy_gbps,   0};
            r->pct = 100.0 * r->gbps / copy_gbps;
            printf("bench: %-18s bf16 %4zu MB G=%-3d %9.1f us %8.1f GB/s  copy %8.1f GB/s  %5.1f %% of copy "
                   "(goal >= 80 %%)\n",
                   r->kernel, r->mb, G, us, r->gbps, copy_gbps, r->pct);
            fflush(stdout);
        }
        CU(cudaFree(b.x));
        CU(cudaFree(b.y));
        CU(cudaFree(b.src));
        CU(cudaFree(b.dst));
        CU(cudaFree(b.res));
        CU(cudaFree(b.out));
        for (int j = 0; j < MAXN; j++)
            CU(cudaFree(b.wire[j]));
    }
    fake_fini(&f);
    CU(cudaStreamDestroy(s));
    return nrows;
}

static void write_json(const char *path, const char *devname, int G, const bench_row *rows, int nrows) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        g_fail++;
        return;
    }
    fprintf(f, "{\n  \"device\": \"%s\",\n  \"checks\": {\"cases\": %d, \"failed\": %d},\n", devname, g_cases, g_fail);
    fprintf(f, "  \"bench_group\": %d,\n  \"bench\": [", G);
    for (int i = 0; i < nrows; i++)
        fprintf(f,
                "%s\n    {\"kernel\": \"%s\", \"dtype\": \"bf16\", \"mb\": %zu, \"ranks\": %d, \"bytes_moved\": %.0f, "
                "\"time_us\": %.3f, \"gbps\": %.1f, \"copy_gbps\": %.1f, \"pct_of_copy\": %.1f}",
                i ? "," : "", rows[i].kernel, rows[i].mb, rows[i].ranks, rows[i].bytes, rows[i].us, rows[i].gbps,
                rows[i].copy_gbps, rows[i].pct);
    fprintf(f, "%s]\n}\n", nrows ? "\n  " : "");
    fclose(f);
}

int main(int argc, char **argv) {
    int dev = 0, self = 0, bench = 1, G = ECHO_DEFAULT_GROUP, nmb = 2, nccl_only = 0, ndev = 0;
    size_t mbs[8] = {64, 256};
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device-index") && i + 1 < argc) {
            dev = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--self-check")) {
            self = 1;
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json = argv[++i];
        } else if (!strcmp(argv[i], "--no-bench")) {
            bench = 0;
        } else if (!strcmp(argv[i], "--nccl-only")) {
            nccl_only = 1;
        } else if (!strcmp(argv[i], "--bench-group") && i + 1 < argc) {
            G = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--bench-mb") && i + 1 < argc) {
            char *sp = argv[++i], *end;
            for (nmb = 0; nmb < 8 && *sp; nmb++) {
                mbs[nmb] = strtoull(sp, &end, 10);
                if (end == sp || mbs[nmb] == 0) nmb = -100;
                sp = *end == ',' ? end + 1 : end;
            }
            if (nmb <= 0) {
                fprintf(stderr, "--bench-mb: a comma-separated list of sizes in MB\n");
                return 2;
            }
        } else {
            fprintf(stderr,
                    "usage: %s [--device-index N] [--self-check] [--json FILE] [--no-bench] [--bench-mb LIST] "
                    "[--bench-group G] [--nccl-only]\n",
                    argv[0]);
            return 2;
        }
    }
    if (G < ECHO_MIN_GROUP || G > ECHO_MAX_GROUP || (G & (G - 1))) {
        fprintf(stderr, "--bench-group: a power of two in [%d, %d]\n", ECHO_MIN_GROUP, ECHO_MAX_GROUP);
        return 2;
    }
    char devname[256] = "host (self-check)";
    if (!self) {
        int count = 0;
        cudaError_t e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess || count <= 0) {
            printf("no GPU: skipped (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
            return 77;
        }
        ndev = count;
        if (dev < 0 || dev >= count) {
            fprintf(stderr, "cuda device %d does not exist (%d found)\n", dev, count);
            return 1;
        }
        struct cudaDeviceProp prop;
        CU(cudaSetDevice(dev));
        CU(cudaGetDeviceProperties(&prop, dev));
        snprintf(devname, sizeof devname, "%s", prop.name);
    }
    printf("device: %s\n", devname);
    const side host = {"host", -1, 0}, device = {"device", dev, 0}, host2 = {"host(2)", -1, 0};
    const side *B = self ? &host2 : &device;
    if (!nccl_only) {
        part_a(&host, B);
        cudaStream_t s = NULL;
        if (!self) CU(cudaStreamCreate(&s));
        const mem D = {self ? -1 : dev, s};
        part_a2(&D);
        part_a3(B);
        if (s) CU(cudaStreamDestroy(s));
    }
    part_n(&host, ndev, self);
    bench_row rows[MAX_ROWS];
    int nrows = 0;
    if (self || !bench || nccl_only)
        printf("== b. benchmark skipped (%s)\n", self        ? "self-check: no GPU"
                                                 : nccl_only ? "--nccl-only"
                                                             : "--no-bench");
    else
        nrows = part_b(dev, mbs, nmb, G, rows);
    if (json) write_json(json, devname, G, rows, nrows);
    printf("%d of %d cases passed\n", g_cases - g_fail, g_cases);
    return g_fail ? 1 : 0;
}
