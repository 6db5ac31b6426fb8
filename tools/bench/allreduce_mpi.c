/*
 * echo-bench allreduce --transport mpi: this process is one rank of the
 * job (mpirun), fp32 messages; an iteration's time is the slowest rank's;
 * rank 0 prints. Without Open MPI at build time it says so.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/echo.h"
#include "tools/bench/bench.h"

#ifdef ECHO_HAVE_MPI
#include <mpi.h>

/* Every rank times each call after a barrier; an iteration's time is the
 * slowest rank's, and the row's time the median over iterations (ranks are
 * processes on a shared machine: a descheduled rank stalls its peers, and
 * the median keeps one such stall out of the row). rel_err: each rank sums |out - ref|^2 over its 1/N of the
 * indices against an fp64 sum of all ranks' inputs (regenerated here). */
static int ar_mpi_one(const bench_ar_mpi_opts *o, int me, int N, echo_preset mode, size_t count, const float *x,
                      float *buf, const double *ref, size_t lo, size_t hi, int it, bench_ar_row *row, char *err,
                      size_t errlen) {
    echo_config cfg = {.min_bytes = o->policy, .n_sites = 1, .max_count = count};
    echo_preset_config(mode, bench_codec(mode, o->codec), o->group, &cfg);
    cfg.tail_sites = 0; /* one call's cost and error: a pass's tail policy is not this bench's */
    echo_world *w = NULL;
    echo_comm *c = NULL;
    echo_world_opts wo = {.procs = 1, .device = -1};
    int rc = echo_world_create(o->transport, &wo, &cfg, &w, err, errlen);
    if (!rc) rc = echo_comm_create(w, me, &c, err, errlen);
    double *ts = calloc((size_t)it, sizeof *ts);
    if (!ts && !rc) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    for (int i = 0; i < o->warmup + it; i++) {
        int bad = rc, any = 0;
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD); /* also lines the ranks up */
        if (any) {
            if (!rc) snprintf(err, errlen, "another rank failed");
            rc = -1;
            break;
        }
        memcpy(buf, x, count * sizeof(float));
        double t0 = bench_now_s();
        rc = echo_begin_pass(c, ECHO_PASS_EAGER, err, errlen);
        if (!rc) rc = echo_allreduce(c, 0, buf, count, ECHO_F32, NULL, err, errlen);
        double t = bench_now_s() - t0, tmax = 0;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (i >= o->warmup) ts[i - o->warmup] = tmax;
    }
    int bad = rc, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    if (any) {
        if (!rc) snprintf(err, errlen, "another rank failed");
        free(ts);
        echo_comm_destroy(c);
        echo_world_destroy(w);
        return -1;
    }
    for (int i = 1; i < it; i++) /* insertion sort: a few dozen times */
        for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
            double s = ts[j];
            ts[j] = ts[j - 1];
            ts[j - 1] = s;
        }
    double t = it % 2 ? ts[it / 2] : 0.5 * (ts[it / 2 - 1] + ts[it / 2]);
    free(ts);
    double e[2] = {0, 0}, tot[2] = {0, 0};
    for (size_t i = lo; i < hi; i++) {
        double d = (double)buf[i] - ref[i - lo];
        e[0] += d * d;
        e[1] += ref[i - lo] * ref[i - lo];
    }
    MPI_Allreduce(e, tot, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    *row = bench_ar_row_make(mode, N, count, t, tot[0], tot[1], c, w);
    echo_comm_destroy(c);
    echo_world_destroy(w);
    return 0;
}

int bench_allreduce_mpi(const bench_ar_mpi_opts *o) {
    int inited = 0, level = 0, me = 0, N = 1, status = 0, first = 1;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &level) != MPI_SUCCESS) {
        fprintf(stderr, "echo-bench: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    size_t maxc = o->maxb / sizeof(float);
    float *x = malloc(maxc * sizeof(float)), *buf = malloc(maxc * sizeof(float));
    double *ref = malloc((maxc / (size_t)N + 1) * sizeof(double));
    if (!x || !buf || !ref) {
        fprintf(stderr, "echo-bench: rank %d: out of memory for %zu bytes\n", me, o->maxb);
        MPI_Abort(MPI_COMM_WORLD, 1); /* peers wait in a collective */
    }
    bench_fill(o->dist, x, maxc, (uint64_t)o->seed, 0, (uint64_t)me);
    const char *rate = getenv("ECHO_NETLAB_RATE"), *impl = getenv("ECHO_MPI_EXACT");
    if (me == 0) {
        if (o->json)
            printf("[");
        else {
            printf("# echo-bench allreduce: transport mpi (one rank per process), %d ranks, fp32, %s inputs, "
                   "echo-min-bytes %zu, link %s, exact = %s\n",
                   N, o->dist == BENCH_DIST_GAUSS ? "Gaussian" : "outlier", o->policy, rate ? rate : "(not in netlab)",
                   impl && *impl ? impl : "allreduce");
            bench_ar_print_columns();
        }
        fflush(stdout);
    }
    for (size_t bytes = o->minb; bytes <= o->maxb; bytes *= o->step) {
        size_t count = bytes / sizeof(float);
        size_t lo = count * (size_t)me / (size_t)N, hi = count * (size_t)(me + 1) / (size_t)N;
        for (size_t i = lo; i < hi; i++) {
            double s = 0;
            for (int r = 0; r < N; r++)
                s += bench_sample(o->dist, (uint64_t)o->seed, 0, (uint64_t)r, i);
            ref[i - lo] = s;
        }
        /* many repetitions for small messages (noisy), one at 256 MiB */
        int it = o->iters ? o->iters : (int)(((size_t)64 << 20) / bytes >= 100 ? 100 : ((size_t)64 << 20) / bytes + 1);
        for (int m = 0; m < o->nmodes; m++) {
            bench_ar_row row;
            char err[512] = "";
            if (ar_mpi_one(o, me, N, o->modes[m], count, x, buf, ref, lo, hi, it, &row, err, sizeof err)) {
                if (me == 0 && o->json) printf("]\n");
                fprintf(stderr, "echo-bench: rank %d: %s\n", me, err);
                status = 1;
                goto out;
            }
            if (me == 0) {
                bench_ar_print_row(&row, o->json, first);
                fflush(stdout);
            }
            first = 0;
        }
        if (bytes > o->maxb / o->step) break;
    }
    if (me == 0 && o->json) printf("\n]\n");
out:
    fflush(stdout);
    free(x);
    free(buf);
    free(ref);
    if (!inited) MPI_Finalize();
    return status;
}
#else
int bench_allreduce_mpi(const bench_ar_mpi_opts *o) {
    (void)o;
    fprintf(stderr, "echo-bench: this build has no mpi transport (Open MPI was not found at build time)\n");
    return 1;
}
#endif
