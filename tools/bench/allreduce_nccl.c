/*
 * echo-bench allreduce --transport nccl: Echo and its int4 ablation against
 * NCCL's own bf16 all-reduce (exact), on GPUs, rank r on GPU r, one host
 * thread per rank, bf16 messages as the model sends them. The comparison the
 * published system makes (its headline: 2.09x NCCL's bf16 all-reduce at
 * 1 GB on A100), run through the product path: comm/'s nccl transport in a
 * deferred world, as the engine uses it.
 *
 * Per message size, every rank:
 *   warm-up    one pass of one call
 *   copies     `iters` device copies input -> buffer, then a read-back of
 *              one value (the stream's time for the resets alone)
 *   timed      one pass of `iters` calls, each on a buffer just reset from
 *              the input (an in-place all-reduce of the same buffer would
 *              grow it N-fold per call, and Echo reports what overflows),
 *              ended by echo_end_pass (the pass's one wait)
 *   error      one pass of one call; rank 0's output vs the fp64 sum of the
 *              ranks' inputs over the first SAMPLE values
 * time per call = (timed - copies) / iters, the slowest rank's; algbw =
 * bytes / time, busbw = algbw * 2(N-1)/N (nccl-tests' convention). Inputs
 * are generated on each GPU (kern_ops.random_weight, uniform in [-1, 1),
 * seed + rank). Only the module APIs are used (comm/echo.h,
 * kernels/kernels.h): a build without CUDA, or fewer GPUs than ranks, ends
 * with a message.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/echo.h"
#include "kernels/kernels.h"
#include "tools/bench/bench.h"

#define NB_SAMPLE ((size_t)1 << 20) /* values of each output checked against the fp64 sum */

typedef struct nb_run {
    int nranks, iters;
    size_t maxc;
    const size_t *counts;
    int ncounts;
    uint64_t seed;
    echo_world *w;
    pthread_barrier_t bar;
    double *t_pass, *t_copy; /* [size][rank] seconds */
    uint64_t *wire, *calls;  /* [size]: rank 0's wire bytes and calls in the timed pass */
    float *in_sample;        /* [rank][NB_SAMPLE] */
    float *out_sample;       /* [size][NB_SAMPLE]: rank 0 */
    int rc[ECHO_MAX_RANKS];
    char err[ECHO_MAX_RANKS][512];
} nb_run;

typedef struct nb_arg {
    nb_run *R;
    int r;
} nb_arg;

static double nb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t nb_min(size_t a, size_t b) {
    return a < b ? a : b;
}

/* One pass of `calls` calls, each on buf freshly reset from in. */
static int nb_pass(const kern_ops *ops, kern_backend *be, echo_comm *c, void *buf, const void *in, size_t count,
                   int calls, char *err, size_t errlen) {
    if (echo_begin_pass(c, ECHO_PASS_EAGER, err, errlen)) return -1;
    for (int k = 0; k < calls; k++) {
        if (ops->copy(be, buf, in, count)) {
            snprintf(err, errlen, "copy: %s", kern_last_error(be));
            return -1;
        }
        if (echo_allreduce(c, k, buf, count, ECHO_BF16, ops->stream(be), err, errlen)) return -1;
    }
    return echo_end_pass(c, ops->stream(be), NULL, err, errlen);
}

static void *nb_rank(void *p) {
    nb_arg *a = p;
    nb_run *R = a->R;
    const int r = a->r;
    char *err = R->err[r];
    const size_t errlen = sizeof R->err[r];
    const kern_ops *ops = NULL;
    kern_backend *be = NULL;
    echo_comm *c = NULL;
    kern_weight in = {0};
    void *buf = NULL;
    int broken = 0; /* after a failure: keep meeting the barriers, skip the work */
    if (kern_backend_create("cuda", 1, r, &ops, &be, err, errlen) || echo_comm_create(R->w, r, &c, err, errlen)) {
        broken = 1;
    } else if (ops->random_weight(be, &in, 1, (int64_t)R->maxc, 0, 0, (int64_t)R->maxc, R->seed + (uint64_t)r, 0.0f,
                                  1.0f) ||
               !(buf = ops->alloc(be, R->maxc * kern_dtype_size(ops->act_dtype))) ||
               ops->to_host_f32(be, R->in_sample + (size_t)r * NB_SAMPLE, in.data, nb_min(R->maxc, NB_SAMPLE))) {
        snprintf(err, errlen, "rank %d: %s", r, kern_last_error(be));
        broken = 1;
    }
    if (broken) echo_abort(c); /* peers must not wait for this rank */
    for (int i = 0; i < R->ncounts; i++) {
        const size_t n = R->counts[i];
        pthread_barrier_wait(&R->bar);
        if (!broken && nb_pass(ops, be, c, buf, in.data, n, 1, err, errlen)) broken = 1; /* warm-up */
        pthread_barrier_wait(&R->bar);
        double t0 = nb_now();
        for (int k = 0; k < R->iters && !broken; k++)
            if (ops->copy(be, buf, in.data, n)) broken = 1;
        float one;
        if (!broken && ops->to_host_f32(be, &one, buf, 1)) broken = 1;
        if (broken && !err[0]) snprintf(err, errlen, "rank %d: %s", r, kern_last_error(be));
        R->t_copy[(size_t)i * R->nranks + r] = nb_now() - t0;
        pthread_barrier_wait(&R->bar);
        echo_stats s0, s1;
        echo_get_stats(c, &s0);
        t0 = nb_now();
        if (!broken && nb_pass(ops, be, c, buf, in.data, n, R->iters, err, errlen)) broken = 1;
        R->t_pass[(size_t)i * R->nranks + r] = nb_now() - t0;
        echo_get_stats(c, &s1);
        if (r == 0) {
            R->wire[i] = 0;
            R->calls[i] = 0;
            for (int m = 0; m < ECHO_PRESET_COUNT; m++) {
                R->wire[i] += s1.wire_bytes[m] - s0.wire_bytes[m];
                R->calls[i] += s1.calls[m] - s0.calls[m];
            }
        }
        if (!broken && nb_pass(ops, be, c, buf, in.data, n, 1, err, errlen)) broken = 1;
        if (!broken && r == 0 &&
            ops->to_host_f32(be, R->out_sample + (size_t)i * NB_SAMPLE, buf, nb_min(n, NB_SAMPLE))) {
            snprintf(err, errlen, "rank 0: %s", kern_last_error(be));
            broken = 1;
        }
        if (broken) {
            if (!err[0]) snprintf(err, errlen, "rank %d failed", r);
            R->rc[r] = -1;
            echo_abort(c);
        }
    }
    if (be) {
        if (buf) ops->free(be, buf);
        if (in.data) ops->free_weight(be, &in);
    }
    echo_comm_destroy(c);
    if (be) kern_backend_destroy(ops, be);
    if (broken) R->rc[r] = -1;
    return NULL;
}

int bench_allreduce_nccl(const bench_ar_opts *o) {
    const int N = o->nranks;
    if (kern_gpu_count() < N) {
        fprintf(stderr,
                "echo-bench: allreduce --transport nccl --ranks %d needs %d GPUs (rank r on GPU r), %d visible%s\n", N,
                N, kern_gpu_count(), kern_gpu_count() ? "" : " (a build without CUDA, or no GPU)");
        return 1;
    }
    size_t counts[64];
    int ncounts = 0;
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes && ncounts < 64; bytes *= 2) {
        counts[ncounts++] = bytes / 2;
        if (bytes > o->max_bytes / 2) break;
    }
    const size_t maxc = counts[ncounts - 1];
    const int iters = o->iters ? o->iters : 20;
    nb_run R;
    memset(&R, 0, sizeof R);
    R.nranks = N;
    R.iters = iters;
    R.maxc = maxc;
    R.counts = counts;
    R.ncounts = ncounts;
    R.seed = (uint64_t)o->seed;
    R.t_pass = calloc((size_t)ncounts * N, sizeof *R.t_pass);
    R.t_copy = calloc((size_t)ncounts * N, sizeof *R.t_copy);
    R.wire = calloc((size_t)ncounts, sizeof *R.wire);
    R.calls = calloc((size_t)ncounts, sizeof *R.calls);
    R.in_sample = calloc((size_t)N * NB_SAMPLE, sizeof *R.in_sample);
    R.out_sample = calloc((size_t)ncounts * NB_SAMPLE, sizeof *R.out_sample);
    int status = 0, first = 1;
    if (!R.t_pass || !R.t_copy || !R.wire || !R.calls || !R.in_sample || !R.out_sample) {
        fprintf(stderr, "echo-bench: out of memory\n");
        status = 1;
        goto out;
    }
    if (o->json)
        printf("[");
    else {
        printf("# echo-bench allreduce: transport nccl (rank r on GPU r, %d GPUs), bf16 messages, uniform inputs, "
               "%d calls per timed pass, echo-min-bytes %zu; time excludes the per-call input reset\n",
               N, iters, o->policy);
        printf("# %12s %6s %6s %12s %12s %12s %10s %10s\n", "bytes", "algo", "group", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)", "wire(b/v)", "rel_err");
    }
    for (int m = 0; m < o->nmodes && !status; m++) {
        char err[512];
        int devs[ECHO_MAX_RANKS];
        for (int r = 0; r < N; r++)
            devs[r] = r;
        echo_config cfg = {.min_bytes = o->policy, .n_sites = iters + 1, .max_count = maxc, .deferred = 1};
        echo_preset_config(o->modes[m], ECHO_CODEC_DEFAULT, o->group, &cfg);
        cfg.tail_sites = 0; /* per-call cost: a pass's tail policy is not this bench's */
        echo_world_opts wo = {.nranks = N, .devices = devs, .device = -1};
        if (echo_world_create(o->transport, &wo, &cfg, &R.w, err, sizeof err)) {
            fprintf(stderr, "echo-bench: %s\n", err);
            status = 1;
            break;
        }
        memset(R.rc, 0, sizeof R.rc);
        memset(R.err, 0, sizeof R.err);
        pthread_barrier_init(&R.bar, NULL, (unsigned)N);
        pthread_t th[ECHO_MAX_RANKS];
        nb_arg args[ECHO_MAX_RANKS];
        for (int r = 0; r < N; r++) {
            args[r] = (nb_arg){&R, r};
            if (pthread_create(&th[r], NULL, nb_rank, &args[r])) {
                fprintf(stderr, "echo-bench: cannot start rank thread %d\n", r);
                exit(1); /* the started ranks would wait at the barrier forever */
            }
        }
        for (int r = 0; r < N; r++)
            pthread_join(th[r], NULL);
        pthread_barrier_destroy(&R.bar);
        echo_config got;
        echo_world_get_config(R.w, &got);
        echo_world_destroy(R.w);
        R.w = NULL;
        for (int r = 0; r < N; r++)
            if (R.rc[r]) {
                fprintf(stderr, "echo-bench: %s: %s\n", echo_preset_name(o->modes[m]), R.err[r]);
                status = 1;
            }
        if (status) break;
        for (int i = 0; i < ncounts; i++) {
            const size_t n = counts[i], bytes = n * 2, ns = nb_min(n, NB_SAMPLE);
            double t = 0;
            for (int r = 0; r < N; r++) {
                double tr = (R.t_pass[(size_t)i * N + r] - R.t_copy[(size_t)i * N + r]) / iters;
                t = tr > t ? tr : t;
            }
            if (t <= 0) t = 1e-9; /* a reset slower than the pass: noise at tiny sizes */
            double num = 0, den = 0;
            for (size_t j = 0; j < ns; j++) {
                double ref = 0;
                for (int r = 0; r < N; r++)
                    ref += R.in_sample[(size_t)r * NB_SAMPLE + j];
                double d = (double)R.out_sample[(size_t)i * NB_SAMPLE + j] - ref;
                num += d * d;
                den += ref * ref;
            }
            double algbw = (double)bytes / t / 1e9, busbw = algbw * 2.0 * (N - 1) / N;
            double wire_bits =
                R.calls[i] ? 8.0 * (double)R.wire[i] / (double)R.calls[i] / (2.0 * (N - 1) / N * (double)n) : 0;
            double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            if (o->json)
                printf("%s\n {\"bytes\": %zu, \"algo\": \"%s\", \"ranks\": %d, \"group\": %d, \"transport\": \"nccl\", "
                       "\"dtype\": \"bf16\", \"time_us\": %.3f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, "
                       "\"wire_bits_per_value\": %.4f, \"rel_err\": %.6g}",
                       first ? "" : ",", bytes, echo_preset_name(o->modes[m]), N, got.group_size, t * 1e6, algbw, busbw,
                       wire_bits, rel);
            else
                printf("  %12zu %6s %6d %12.1f %12.3f %12.3f %10.3f %10.3g\n", bytes, echo_preset_name(o->modes[m]),
                       got.group_size, t * 1e6, algbw, busbw, wire_bits, rel);
            first = 0;
        }
        fflush(stdout);
    }
    if (o->json) printf("\n]\n");
out:
    free(R.t_pass);
    free(R.t_copy);
    free(R.wire);
    free(R.calls);
    free(R.in_sample);
    free(R.out_sample);
    return status;
}
