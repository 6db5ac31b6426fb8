/*
 * echo-bench: benchmarks, one subcommand each (the table `commands` below;
 * add a row to add one).
 *
 *   echo-bench allreduce [--transport local|nccl|mpi] [--ranks N] [--algo exact,bf16,int4,echo,echo-nofb]
 *                        [--min-bytes 1K] [--max-bytes 16M] [--step 2] [--group G] [--codec C]
 *                        [--echo-min-bytes N] [--iters N] [--warmup N] [--json]
 *       nccl-tests-style table per message size and algorithm: time, algbw,
 *       busbw = algbw*2(N-1)/N, wire bits per value, relative error vs an
 *       fp64 sum. local: fp32 messages, ranks are threads over host memory.
 *       nccl: bf16 messages on GPUs 0..N-1, exact = NCCL's own bf16
 *       all-reduce (tools/bench/allreduce_nccl.c). mpi: run under mpirun,
 *       one rank per process, fp32; time = slowest rank's; rank 0 prints
 *       (scripts/netlab.sh and docs/network.md: over a shaped link).
 *   echo-bench chain [--ranks N] [--depth K] [--count M] [--group G] [--codec C] [--json]
 *       accumulated error of K chained all-reduces of independent random
 *       partials, int4 vs echo: ||sum out - sum exact|| per depth.
 *   echo-bench codec [--count M] [--group G] [--codec C] [--iters N] [--threads T] [--json]
 *       codec throughput (encode with error feedback, decode-accumulate)
 *       beside memcpy in the same rounds on the same T threads (default 1),
 *       with the ratio to it, the same ratio for the encode's memory traffic
 *       alone (its ceiling where memory is the bound), and coding error vs
 *       wire bits per group size.
 *
 * Exit codes: 0 ok, 1 runtime error, 2 usage error. Inputs are Gaussian
 * from a counter-based generator (--seed), so runs are reproducible.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/echo.h"
#include "tools/bench/bench.h"

#ifdef ECHO_HAVE_MPI
#include <mpi.h>
#endif

/* ---- shared helpers ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Standard normal value number i of stream (seed, a, b) (Box-Muller). */
static float gauss(uint64_t seed, uint64_t a, uint64_t b, uint64_t i) {
    uint64_t h1 = mix(seed ^ mix(a * 1000003 + b) ^ mix(i)), h2 = mix(h1);
    double u1 = ((double)(h1 >> 11) + 1.0) * 0x1p-53, u2 = (double)(h2 >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Input distributions: Gaussian, or Gaussian with activation-like outlier
 * channels (every 1024th value x50 and another x20, like the massive
 * features of LLM hidden states). */
typedef enum { DIST_GAUSS = 0, DIST_OUTLIER } bench_dist;

static float sample(bench_dist d, uint64_t seed, uint64_t a, uint64_t b, uint64_t i) {
    float v = gauss(seed, a, b, i);
    if (d == DIST_OUTLIER) v *= i % 1024 == 17 ? 50.0f : (i % 1024 == 611 ? 20.0f : 1.0f);
    return v;
}

static void fill(bench_dist d, float *x, size_t n, uint64_t seed, uint64_t a, uint64_t b) {
    for (size_t i = 0; i < n; i++)
        x[i] = sample(d, seed, a, b, i);
}

static int parse_dist(const char *s, bench_dist *out) {
    if (!strcmp(s, "gauss"))
        *out = DIST_GAUSS;
    else if (!strcmp(s, "outlier"))
        *out = DIST_OUTLIER;
    else
        return -1;
    return 0;
}

/* "1K", "256M", "1G", "4096": binary multiples. 0 on a malformed size. */
static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return 0;
    double mult = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mult = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mult = 1024.0 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        mult = 1024.0 * 1024 * 1024;
        end++;
        break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return 0;
    return (size_t)(v * mult);
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* ---- threads that start all together or not at all ---- */

#define TS_MAX 64 /* ECHO_MAX_RANKS, ECHO_BENCH_MAX_THREADS */

/* The benchmarks' threads meet at barriers sized for all of them, so one
 * that fails to start would leave the others waiting forever. Each thread
 * first waits at the set's gate: ts_start opens it only once every thread
 * exists, and otherwise tells the started ones to return. */
/* --codec applies to the presets that take a codec (echo, echo-nofb);
 * int4 is the paper's codec whatever --codec says. */
static echo_codec_id bench_codec(echo_preset mode, echo_codec_id codec) {
    echo_codec_id f = echo_preset_codec(mode);
    return f != ECHO_CODEC_DEFAULT && !echo_codec_get(f)->lossless ? ECHO_CODEC_DEFAULT : codec;
}

typedef struct thread_set {
    pthread_t th[TS_MAX];
    struct ts_slot {
        struct thread_set *ts;
        void *(*fn)(void *);
        void *arg;
    } slot[TS_MAX];
    atomic_int gate; /* 0: wait, 1: run, -1: return */
    int n;
} thread_set;

static void *ts_main(void *p) {
    struct ts_slot *s = p;
    int g;
    while (!(g = atomic_load(&s->ts->gate)))
        sched_yield();
    return g > 0 ? s->fn(s->arg) : NULL;
}

static void ts_join(thread_set *ts) {
    for (int i = 0; i < ts->n; i++)
        pthread_join(ts->th[i], NULL);
}

/* fn(args + i * size) on n threads; 0, or -1 with none left running (then
 * ts_join has nothing to wait for). */
static int ts_start(thread_set *ts, int n, void *(*fn)(void *), void *args, size_t size) {
    atomic_init(&ts->gate, 0);
    ts->n = 0;
    for (int i = 0; i < n && i < TS_MAX; i++) {
        ts->slot[i] = (struct ts_slot){ts, fn, (char *)args + (size_t)i * size};
        if (pthread_create(&ts->th[i], NULL, ts_main, &ts->slot[i])) break;
        ts->n++;
    }
    atomic_store(&ts->gate, ts->n == n ? 1 : -1);
    if (ts->n == n) return 0;
    ts_join(ts);
    ts->n = 0;
    return -1;
}

/* ---- allreduce ---- */

typedef struct ar_run {
    echo_comm *c[ECHO_MAX_RANKS];
    float *x[ECHO_MAX_RANKS], *buf[ECHO_MAX_RANKS];
    size_t count;
    int nranks, iters, warmup;
    double *dt; /* [iter][rank] */
    pthread_barrier_t bar;
    int rc[ECHO_MAX_RANKS];
    char err[ECHO_MAX_RANKS][256];
} ar_run;

typedef struct ar_arg {
    ar_run *run;
    int rank;
} ar_arg;

/* Every iteration restores the input (untimed), lines the ranks up, and
 * times one pass with one call: the collective's time is the slowest
 * rank's. */
static void *ar_rank(void *p) {
    ar_arg *a = p;
    ar_run *R = a->run;
    int r = a->rank;
    for (int it = 0; it < R->warmup + R->iters; it++) {
        memcpy(R->buf[r], R->x[r], R->count * sizeof(float));
        pthread_barrier_wait(&R->bar);
        double t0 = now_s();
        int rc = echo_begin_pass(R->c[r], ECHO_PASS_EAGER, R->err[r], sizeof R->err[r]);
        if (!rc) rc = echo_allreduce(R->c[r], 0, R->buf[r], R->count, ECHO_F32, NULL, R->err[r], sizeof R->err[r]);
        double t1 = now_s();
        if (rc) R->rc[r] = rc; /* every rank fails the same call; keep looping so the barrier stays even */
        if (it >= R->warmup) R->dt[(size_t)(it - R->warmup) * R->nranks + r] = t1 - t0;
    }
    return NULL;
}

typedef struct ar_row {
    size_t bytes;
    const char *algo;
    int ranks, group;
    double time_us, algbw, busbw, wire_bits, rel_err;
    const char *codec; /* what the preset ran (echo_world_get_config) */
    int feedback;
} ar_row;

static int ar_measure(int nranks, echo_preset mode, echo_codec_id codec, int group, size_t min_policy, size_t count,
                      float *const *x, const double *ref, int iters, ar_row *row, char *err, size_t errlen) {
    ar_run *R = calloc(1, sizeof *R);
    echo_world *w = NULL;
    int status = -1;
    if (!R) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    R->count = count;
    R->nranks = nranks;
    R->iters = iters;
    R->warmup = 1;
    R->dt = calloc((size_t)iters * nranks, sizeof *R->dt);
    echo_config cfg = {.min_bytes = min_policy, .n_sites = 1, .max_count = count};
    echo_preset_config(mode, bench_codec(mode, codec), group, &cfg);
    cfg.tail_sites = 0; /* one call's cost and error: a pass's tail policy is not this bench's */
    echo_world_opts wo = {.nranks = nranks, .device = -1};
    if (!R->dt || echo_world_create("local", &wo, &cfg, &w, err, errlen)) goto out;
    for (int r = 0; r < nranks; r++) {
        if (echo_comm_create(w, r, &R->c[r], err, errlen)) goto out;
        R->x[r] = x[r];
        R->buf[r] = malloc(count * sizeof(float));
        if (!R->buf[r]) {
            snprintf(err, errlen, "out of memory for %zu values", count);
            goto out;
        }
    }
    if (pthread_barrier_init(&R->bar, NULL, (unsigned)nranks)) {
        snprintf(err, errlen, "cannot make a barrier for %d rank threads", nranks);
        goto out;
    }
    thread_set ts;
    ar_arg args[ECHO_MAX_RANKS];
    for (int r = 0; r < nranks; r++)
        args[r] = (ar_arg){R, r};
    int failed = ts_start(&ts, nranks, ar_rank, args, sizeof *args);
    ts_join(&ts); /* nothing to wait for when failed */
    pthread_barrier_destroy(&R->bar);
    if (failed) {
        snprintf(err, errlen, "could not start %d rank threads", nranks);
        goto out;
    }
    for (int r = 0; r < nranks; r++)
        if (R->rc[r]) {
            snprintf(err, errlen, "rank %d: %s", r, R->err[r]);
            goto out;
        }
    double tsum = 0;
    for (int it = 0; it < iters; it++) {
        double m = 0;
        for (int r = 0; r < nranks; r++)
            m = R->dt[(size_t)it * nranks + r] > m ? R->dt[(size_t)it * nranks + r] : m;
        tsum += m;
    }
    double t = tsum / iters, bytes = (double)count * sizeof(float);
    echo_stats st;
    echo_get_stats(R->c[0], &st);
    uint64_t calls = 0, wire = 0;
    for (int k = 0; k < ECHO_PRESET_COUNT; k++)
        calls += st.calls[k], wire += st.wire_bytes[k];
    double num = 0, den = 0;
    for (size_t i = 0; i < count; i++) {
        double d = (double)R->buf[0][i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    echo_config got;
    echo_world_get_config(w, &got);
    *row = (ar_row){(size_t)bytes,
                    echo_preset_name(mode),
                    nranks,
                    got.group_size,
                    t * 1e6,
                    bytes / t / 1e9,
                    bytes / t / 1e9 * 2.0 * (nranks - 1) / nranks,
                    calls ? 8.0 * (double)wire / calls / (2.0 * (nranks - 1) / nranks * (double)count) : 0,
                    den > 0 ? sqrt(num / den) : sqrt(num),
                    echo_codec_get(got.codec)->name,
                    got.feedback};
    status = 0;
out:
    for (int r = 0; r < nranks; r++) {
        echo_comm_destroy(R->c[r]);
        free(R->buf[r]);
    }
    echo_world_destroy(w);
    free(R->dt);
    free(R);
    return status;
}

#ifdef ECHO_HAVE_MPI
/* ---- allreduce over the mpi transport: this process is one rank ---- */

typedef struct ar_mpi_opts {
    int group, iters, warmup, json, seed, nmodes;
    bench_dist dist;
    size_t minb, maxb, step, policy;
    const echo_preset *modes;
    echo_codec_id codec;
} ar_mpi_opts;

/* Every rank times each call after a barrier; an iteration's time is the
 * slowest rank's, and the row's time the median over iterations (ranks are
 * processes on a shared machine: a descheduled rank stalls its peers, and
 * the median keeps one such stall out of the row). rel_err: each rank sums |out - ref|^2 over its 1/N of the
 * indices against an fp64 sum of all ranks' inputs (regenerated here). */
static int ar_mpi_one(const ar_mpi_opts *o, int me, int N, echo_preset mode, size_t count, const float *x, float *buf,
                      const double *ref, size_t lo, size_t hi, int it, ar_row *row, char *err, size_t errlen) {
    echo_config cfg = {.min_bytes = o->policy, .n_sites = 1, .max_count = count};
    echo_preset_config(mode, bench_codec(mode, o->codec), o->group, &cfg);
    cfg.tail_sites = 0; /* one call's cost and error: a pass's tail policy is not this bench's */
    echo_world *w = NULL;
    echo_comm *c = NULL;
    echo_world_opts wo = {.procs = 1, .device = -1};
    int rc = echo_world_create("mpi", &wo, &cfg, &w, err, errlen);
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
        double t0 = now_s();
        rc = echo_begin_pass(c, ECHO_PASS_EAGER, err, errlen);
        if (!rc) rc = echo_allreduce(c, 0, buf, count, ECHO_F32, NULL, err, errlen);
        double t = now_s() - t0, tmax = 0;
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
    echo_stats st;
    echo_get_stats(c, &st);
    uint64_t calls = 0, wire = 0;
    for (int k = 0; k < ECHO_PRESET_COUNT; k++)
        calls += st.calls[k], wire += st.wire_bytes[k];
    echo_config got;
    echo_world_get_config(w, &got);
    double bytes = (double)count * sizeof(float);
    *row = (ar_row){(size_t)bytes,
                    echo_preset_name(mode),
                    N,
                    got.group_size,
                    t * 1e6,
                    bytes / t / 1e9,
                    bytes / t / 1e9 * 2.0 * (N - 1) / N,
                    calls ? 8.0 * (double)wire / calls / (2.0 * (N - 1) / N * (double)count) : 0,
                    tot[1] > 0 ? sqrt(tot[0] / tot[1]) : sqrt(tot[0]),
                    echo_codec_get(got.codec)->name,
                    got.feedback};
    echo_comm_destroy(c);
    echo_world_destroy(w);
    return 0;
}

static int ar_mpi(const ar_mpi_opts *o) {
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
    fill(o->dist, x, maxc, (uint64_t)o->seed, 0, (uint64_t)me);
    const char *rate = getenv("ECHO_NETLAB_RATE"), *impl = getenv("ECHO_MPI_EXACT");
    if (me == 0) {
        if (o->json)
            printf("[");
        else {
            printf("# echo-bench allreduce: transport mpi (one rank per process), %d ranks, fp32, %s inputs, "
                   "echo-min-bytes %zu, link %s, exact = %s\n",
                   N, o->dist == DIST_GAUSS ? "Gaussian" : "outlier", o->policy, rate ? rate : "(not in netlab)",
                   impl && *impl ? impl : "allreduce");
            printf("# %12s %9s %6s %12s %12s %12s %10s %10s\n", "bytes", "algo", "group", "time(us)", "algbw(GB/s)",
                   "busbw(GB/s)", "wire(b/v)", "rel_err");
        }
        fflush(stdout);
    }
    for (size_t bytes = o->minb; bytes <= o->maxb; bytes *= o->step) {
        size_t count = bytes / sizeof(float);
        size_t lo = count * (size_t)me / (size_t)N, hi = count * (size_t)(me + 1) / (size_t)N;
        for (size_t i = lo; i < hi; i++) {
            double s = 0;
            for (int r = 0; r < N; r++)
                s += sample(o->dist, (uint64_t)o->seed, 0, (uint64_t)r, i);
            ref[i - lo] = s;
        }
        /* many repetitions for small messages (noisy), one at 256 MiB */
        int it = o->iters ? o->iters : (int)(((size_t)64 << 20) / bytes >= 100 ? 100 : ((size_t)64 << 20) / bytes + 1);
        for (int m = 0; m < o->nmodes; m++) {
            ar_row row;
            char err[512] = "";
            if (ar_mpi_one(o, me, N, o->modes[m], count, x, buf, ref, lo, hi, it, &row, err, sizeof err)) {
                if (me == 0 && o->json) printf("]\n");
                fprintf(stderr, "echo-bench: rank %d: %s\n", me, err);
                status = 1;
                goto out;
            }
            if (me == 0) {
                if (o->json)
                    printf("%s\n {\"bytes\": %zu, \"algo\": \"%s\", \"codec\": \"%s\", \"feedback\": %d, "
                           "\"ranks\": %d, \"group\": %d, "
                           "\"time_us\": %.3f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, "
                           "\"wire_bits_per_value\": %.4f, \"rel_err\": %.6g}",
                           first ? "" : ",", row.bytes, row.algo, row.codec, row.feedback, row.ranks, row.group,
                           row.time_us, row.algbw, row.busbw, row.wire_bits, row.rel_err);
                else
                    printf("  %12zu %9s %6d %12.1f %12.3f %12.3f %10.3f %10.3g\n", row.bytes, row.algo, row.group,
                           row.time_us, row.algbw, row.busbw, row.wire_bits, row.rel_err);
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
#endif

static void ar_usage(void) {
    fprintf(
        stderr,
        "usage: echo-bench allreduce [--transport local|nccl|mpi] [--ranks N] [--algo exact,bf16,int4,echo,echo-nofb]\n"
        "                            [--min-bytes 1K] [--max-bytes 16M] [--step 2] [--group G] [--codec NAME[-gG]]\n"
        "                            [--echo-min-bytes N] [--iters N] [--warmup N] [--seed S]\n"
        "                            [--dist gauss|outlier] [--json]\n"
        "  local: ranks are threads over host memory, fp32 (CPU numbers)\n"
        "  nccl:  rank r on GPU r, bf16, exact = NCCL's bf16 all-reduce; uniform inputs (no --dist)\n"
        "  mpi:   under mpirun, one rank per process (--ranks is the job's size), fp32; exact =\n"
        "         MPI_Allreduce, or the two-shot schedule with ECHO_MPI_EXACT=twoshot; time =\n"
        "         median over iterations of the slowest rank's\n");
}

static int cmd_allreduce(int argc, char **argv) {
    int nranks = 2, group = 0, iters = 0, json = 0, seed = 1, step = 2, warmup = 1;
    echo_codec_id codec = ECHO_CODEC_DEFAULT;
    bench_dist dist = DIST_GAUSS;
    size_t minb = 1024, maxb = 16u << 20, policy = 0;
    const char *algos = "exact,int4,echo", *transport = "local";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--json"))
            json = 1;
        else if (!v)
            bad = 1;
        else if (!strcmp(a, "--transport"))
            transport = v, i++;
        else if (!strcmp(a, "--ranks"))
            bad = parse_int(v, 1, ECHO_MAX_RANKS, &nranks), i++;
        else if (!strcmp(a, "--algo"))
            algos = v, i++;
        else if (!strcmp(a, "--min-bytes"))
            bad = !(minb = parse_size(v)), i++;
        else if (!strcmp(a, "--max-bytes"))
            bad = !(maxb = parse_size(v)), i++;
        else if (!strcmp(a, "--group"))
            bad = parse_int(v, 0, ECHO_MAX_GROUP, &group), i++;
        else if (!strcmp(a, "--codec")) {
            int g = 0;
            bad = echo_codec_parse(v, &codec, &g), i++;
            if (g) group = g;
        } else if (!strcmp(a, "--echo-min-bytes"))
            policy = parse_size(v), i++;
        else if (!strcmp(a, "--iters"))
            bad = parse_int(v, 1, 1000000, &iters), i++;
        else if (!strcmp(a, "--seed"))
            bad = parse_int(v, 0, 1 << 30, &seed), i++;
        else if (!strcmp(a, "--dist"))
            bad = parse_dist(v, &dist), i++;
        else if (!strcmp(a, "--step"))
            bad = parse_int(v, 2, 1024, &step), i++;
        else if (!strcmp(a, "--warmup"))
            bad = parse_int(v, 0, 100, &warmup), i++;
        else
            bad = 1;
        if (bad) {
            ar_usage();
            return 2;
        }
    }
    /* which benchmark runs is the row's kind: processes (mpi), one device
     * per rank (nccl), threads over host memory (local) */
    const echo_transport_info *tr = echo_transport_find(transport);
    if (!tr) {
        fprintf(stderr, "echo-bench: unknown transport '%s' (", transport);
        for (int i = 0; echo_transport_at(i); i++)
            fprintf(stderr, "%s%s", i ? ", " : "", echo_transport_at(i)->name);
        fprintf(stderr, ")\n");
        return 2;
    }
    echo_preset modes[ECHO_PRESET_COUNT] = {ECHO_PRESET_EXACT};
    int nmodes = 0;
    char list[64];
    snprintf(list, sizeof list, "%s", algos);
    for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (nmodes == ECHO_PRESET_COUNT || echo_preset_parse(tok, &modes[nmodes])) {
            fprintf(stderr, "echo-bench: unknown algo '%s' (exact, bf16, int4, echo, echo-nofb)\n", tok);
            return 2;
        }
        nmodes++;
    }
    if (minb < 4 || maxb < minb) {
        ar_usage();
        return 2;
    }
    if (!tr->threads) {
#ifdef ECHO_HAVE_MPI
        ar_mpi_opts o = {group, iters, warmup,       json,   seed,  nmodes, dist,
                         minb,  maxb,  (size_t)step, policy, modes, codec};
        return ar_mpi(&o);
#else
        fprintf(stderr, "echo-bench: this build has no mpi transport (Open MPI was not found at build time)\n");
        return 1;
#endif
    }
    if (tr->device_memory == 1) {
        for (int m = 0; m < nmodes; m++)
            if (modes[m] == ECHO_PRESET_BF16) {
                fprintf(stderr, "echo-bench: --transport %s takes exact, int4 and echo (its exact is NCCL's bf16)\n",
                        tr->name);
                return 2;
            }
        if (dist != DIST_GAUSS) {
            fprintf(stderr, "echo-bench: --dist is not supported with --transport %s (inputs are generated on "
                            "the GPUs, uniform)\n", tr->name);
            return 2;
        }
        if (nranks < 2) {
            fprintf(stderr, "echo-bench: --transport %s needs --ranks >= 2\n", tr->name);
            return 2;
        }
        bench_ar_opts o = {nranks, group, iters, json, seed, minb, maxb, policy, {0}, nmodes};
        memcpy(o.modes, modes, sizeof modes);
        return bench_allreduce_nccl(&o);
    }
    size_t maxc = maxb / sizeof(float);
    float *x[ECHO_MAX_RANKS] = {0};
    double *ref = malloc(maxc * sizeof *ref);
    int status = 0;
    for (int r = 0; r < nranks && ref; r++) {
        x[r] = malloc(maxc * sizeof(float));
        if (!x[r]) break;
        fill(dist, x[r], maxc, (uint64_t)seed, 0, (uint64_t)r);
    }
    if (!ref || !x[nranks - 1]) {
        fprintf(stderr, "echo-bench: out of memory for %d x %zu bytes\n", nranks, maxb);
        status = 1;
        goto out;
    }
    if (json)
        printf("[");
    else {
        printf("# echo-bench allreduce: transport local (ranks are threads, host memory: CPU numbers), %d ranks, "
               "fp32, %s inputs, echo-min-bytes %zu\n",
               nranks, dist == DIST_GAUSS ? "Gaussian" : "outlier", policy);
        printf("# %12s %9s %6s %12s %12s %12s %10s %10s\n", "bytes", "algo", "group", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)", "wire(b/v)", "rel_err");
    }
    int first = 1;
    for (size_t bytes = minb; bytes <= maxb; bytes *= (size_t)step) {
        size_t count = bytes / sizeof(float);
        for (size_t i = 0; i < count; i++) {
            double s = 0;
            for (int r = 0; r < nranks; r++)
                s += x[r][i];
            ref[i] = s;
        }
        /* enough repetitions for small messages, few for large ones */
        int it = iters ? iters : (int)(((size_t)64 << 20) / bytes > 50 ? 50 : (((size_t)64 << 20) / bytes + 2));
        for (int m = 0; m < nmodes; m++) {
            ar_row row;
            char err[512];
            if (ar_measure(nranks, modes[m], codec, group, policy, count, x, ref, it, &row, err, sizeof err)) {
                if (json) printf("]\n");
                fprintf(stderr, "echo-bench: %s\n", err);
                status = 1;
                goto out;
            }
            if (json)
                printf("%s\n {\"bytes\": %zu, \"algo\": \"%s\", \"codec\": \"%s\", \"feedback\": %d, "
                       "\"ranks\": %d, \"group\": %d, \"time_us\": %.3f, "
                       "\"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, \"wire_bits_per_value\": %.4f, \"rel_err\": %.6g}",
                       first ? "" : ",", row.bytes, row.algo, row.codec, row.feedback, row.ranks, row.group,
                       row.time_us, row.algbw, row.busbw, row.wire_bits, row.rel_err);
            else
                printf("  %12zu %9s %6d %12.1f %12.3f %12.3f %10.3f %10.3g\n", row.bytes, row.algo, row.group,
                       row.time_us, row.algbw, row.busbw, row.wire_bits, row.rel_err);
            fflush(stdout);
            first = 0;
        }
        if (bytes > maxb / (size_t)step) break;
    }
    if (json) printf("\n]\n");
out:
    for (int r = 0; r < nranks; r++)
        free(x[r]);
    free(ref);
    return status;
}

/* ---- chain ---- */

typedef struct chain_run {
    echo_comm *c[ECHO_MAX_RANKS];
    float *buf[ECHO_MAX_RANKS];
    int nranks, K;
    size_t count;
    uint64_t seed;
    bench_dist dist;
    double *acc_out, *acc_exact, *abs_err, *ref_norm;
    int rc[ECHO_MAX_RANKS];
    char err[ECHO_MAX_RANKS][256];
} chain_run;

typedef struct chain_arg {
    chain_run *run;
    int rank;
} chain_arg;

/* Call k gets fresh partials; rank 0 accumulates the outputs and the fp64
 * exact sums and records the error of the running sums after each call. */
static void *chain_rank(void *p) {
    chain_arg *a = p;
    chain_run *R = a->run;
    int r = a->rank;
    R->rc[r] = echo_begin_pass(R->c[r], ECHO_PASS_EAGER, R->err[r], sizeof R->err[r]);
    for (int k = 0; k < R->K && !R->rc[r]; k++) {
        fill(R->dist, R->buf[r], R->count, R->seed, (uint64_t)k + 1, (uint64_t)r);
        R->rc[r] = echo_allreduce(R->c[r], k, R->buf[r], R->count, ECHO_F32, NULL, R->err[r], sizeof R->err[r]);
        if (R->rc[r] || r) continue;
        double e = 0, n = 0;
        for (size_t i = 0; i < R->count; i++) {
            double ex = 0;
            for (int j = 0; j < R->nranks; j++)
                ex += sample(R->dist, R->seed, (uint64_t)k + 1, (uint64_t)j, i);
            R->acc_out[i] += R->buf[0][i];
            R->acc_exact[i] += ex;
            double d = R->acc_out[i] - R->acc_exact[i];
            e += d * d;
            n += R->acc_exact[i] * R->acc_exact[i];
        }
        R->abs_err[k] = sqrt(e);
        R->ref_norm[k] = sqrt(n);
    }
    return NULL;
}

static int chain_measure(int nranks, echo_preset mode, echo_codec_id codec, int group, int K, size_t count,
                         uint64_t seed, bench_dist dist, double *abs_err, double *ref_norm, char *err, size_t errlen) {
    chain_run *R = calloc(1, sizeof *R);
    echo_world *w = NULL;
    int status = -1;
    if (!R) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    *R = (chain_run){
        .nranks = nranks, .K = K, .count = count, .seed = seed, .dist = dist, .abs_err = abs_err, .ref_norm = ref_norm};
    R->acc_out = calloc(count, sizeof(double));
    R->acc_exact = calloc(count, sizeof(double));
    echo_config cfg = {.n_sites = K, .max_count = count};
    echo_preset_config(mode, codec, group, &cfg);
    cfg.tail_sites = 0; /* one call's cost and error: a pass's tail policy is not this bench's */
    if (!R->acc_out || !R->acc_exact) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    echo_world_opts wo = {.nranks = nranks, .device = -1};
    if (echo_world_create("local", &wo, &cfg, &w, err, errlen)) goto out;
    for (int r = 0; r < nranks; r++) {
        if (echo_comm_create(w, r, &R->c[r], err, errlen)) goto out;
        if (!(R->buf[r] = malloc(count * sizeof(float)))) {
            snprintf(err, errlen, "out of memory");
            goto out;
        }
    }
    thread_set ts;
    chain_arg args[ECHO_MAX_RANKS];
    for (int r = 0; r < nranks; r++)
        args[r] = (chain_arg){R, r};
    if (ts_start(&ts, nranks, chain_rank, args, sizeof *args)) {
        snprintf(err, errlen, "could not start %d rank threads", nranks);
        goto out;
    }
    ts_join(&ts);
    for (int r = 0; r < nranks; r++)
        if (R->rc[r]) {
            snprintf(err, errlen, "rank %d: %s", r, R->err[r]);
            goto out;
        }
    status = 0;
out:
    for (int r = 0; r < nranks; r++) {
        echo_comm_destroy(R->c[r]);
        free(R->buf[r]);
    }
    echo_world_destroy(w);
    free(R->acc_out);
    free(R->acc_exact);
    free(R);
    return status;
}

static int cmd_chain(int argc, char **argv) {
    int nranks = 4, K = 144, group = 0, json = 0, seed = 1;
    echo_codec_id codec = ECHO_CODEC_DEFAULT;
    bench_dist dist = DIST_GAUSS;
    size_t count = 16384;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--json"))
            json = 1;
        else if (!v)
            bad = 1;
        else if (!strcmp(a, "--ranks"))
            bad = parse_int(v, 2, ECHO_MAX_RANKS, &nranks), i++;
        else if (!strcmp(a, "--depth"))
            bad = parse_int(v, 1, 100000, &K), i++;
        else if (!strcmp(a, "--count"))
            bad = !(count = parse_size(v)), i++;
        else if (!strcmp(a, "--group"))
            bad = parse_int(v, 0, ECHO_MAX_GROUP, &group), i++;
        else if (!strcmp(a, "--codec")) {
            int g = 0;
            bad = echo_codec_parse(v, &codec, &g), i++;
            if (g) group = g;
        } else if (!strcmp(a, "--seed"))
            bad = parse_int(v, 0, 1 << 30, &seed), i++;
        else if (!strcmp(a, "--dist"))
            bad = parse_dist(v, &dist), i++;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "usage: echo-bench chain [--ranks N] [--depth K] [--count M] [--group G] "
                            "[--codec NAME[-gG]] [--seed S]\n"
                            "                        [--dist gauss|outlier] [--json]\n");
            return 2;
        }
    }
    double *err_q = malloc((size_t)K * sizeof(double)), *err_e = malloc((size_t)K * sizeof(double));
    double *ref = malloc((size_t)K * sizeof(double));
    char err[512];
    int status = 0;
    if (!err_q || !err_e || !ref) {
        fprintf(stderr, "echo-bench: out of memory\n");
        status = 1;
    } else if (chain_measure(nranks, ECHO_PRESET_NOFB, codec, group, K, count, (uint64_t)seed, dist, err_q, ref, err,
                             sizeof err) ||
               chain_measure(nranks, ECHO_PRESET_ECHO, codec, group, K, count, (uint64_t)seed, dist, err_e, ref, err,
                             sizeof err)) {
        fprintf(stderr, "echo-bench: %s\n", err);
        status = 1;
    } else if (json) {
        printf("[");
        for (int k = 0; k < K; k++)
            for (int m = 0; m < 2; m++) {
                double e = m ? err_e[k] : err_q[k];
                printf("%s\n {\"depth\": %d, \"algo\": \"%s\", \"abs_err\": %.6g, \"rel_err\": %.6g}",
                       k || m ? "," : "", k + 1, m ? "echo" : "int4", e, e / ref[k]);
            }
        printf("\n]\n");
    } else {
        printf("# echo-bench chain: %d ranks, %zu values per call, group %d, %s partials; error of the sum of "
               "outputs vs the sum of exact results\n",
               nranks, count, group ? group : ECHO_DEFAULT_GROUP, dist == DIST_GAUSS ? "Gaussian" : "outlier");
        printf("# %6s %12s %12s %12s %12s %10s\n", "depth", "int4 abs", "int4 rel", "echo abs", "echo rel",
               "int4/echo");
        for (int k = 1; k <= K; k = k * 2 > K && k < K ? K : k * 2)
            printf("  %6d %12.4g %12.4g %12.4g %12.4g %10.2f\n", k, err_q[k - 1], err_q[k - 1] / ref[k - 1],
                   err_e[k - 1], err_e[k - 1] / ref[k - 1], err_q[k - 1] / err_e[k - 1]);
    }
    free(err_q);
    free(err_e);
    free(ref);
    return status;
}

/* ---- codec ---- */

/* CPU seconds of the calling thread: time it spent descheduled (a shared
 * machine) does not count, so that rates measure the code, not the load. */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best-of-iters seconds of memcpy, the encode's traffic alone, encode and
 * decode-accumulate over the buffers. Each round runs the four one after
 * the other, so that load from other processes (on memory bandwidth and
 * caches) hits them alike and the ratios to memcpy stay meaningful. One
 * thread: its CPU time (time it spent descheduled on a shared machine does
 * not count). T threads: each takes a slice of whole groups (its own wire
 * buffer), as a rank's workers do (echo_comm_set_workers), and the round's
 * wall time counts. */
typedef enum { OP_MEMCPY, OP_TRAFFIC, OP_ENCODE, OP_DECODE_ACC, OP_COUNT } codec_op;
#define ECHO_BENCH_MAX_THREADS 64
_Static_assert(ECHO_BENCH_MAX_THREADS <= TS_MAX && ECHO_MAX_RANKS <= TS_MAX, "thread sets hold every thread");

typedef struct codec_team {
    int nthreads, iters, group;
    echo_codec_id codec;
    const float *x;
    float *res, *acc, *dst, *tres; /* tres: OP_TRAFFIC's residual, not the codec's */
    uint8_t *wire;                 /* nthreads slices of slice_wire bytes */
    size_t count, slice, slice_wire;
    double wire_per_value; /* bytes the codec writes per value at this group */
    pthread_barrier_t bar;
    int op; /* the op of this round, OP_COUNT: stop */
} codec_team;

/* The memory traffic of an error-feedback encode without its arithmetic:
 * read x and the residual, write the residual and the wire bytes. It
 * bounds every encode's rate on this machine: an encode moves ~1.6x the
 * bytes memcpy does, so where one thread is memory-bound the ratio of
 * this to memcpy, not 1, is the ceiling of enc/cpy (docs/echo.md §8c). */
typedef float f32x8 __attribute__((vector_size(32))); /* 8 adds at once: the loop must be bound by memory */

static void encode_traffic(const float *x, float *r, size_t n, uint8_t *wire, size_t wire_bytes) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        f32x8 a, b;
        memcpy(&a, x + i, sizeof a);
        memcpy(&b, r + i, sizeof b);
        b += a;
        memcpy(r + i, &b, sizeof b);
    }
    for (; i < n; i++)
        r[i] += x[i];
    memset(wire, 0x5a, wire_bytes);
}

static void team_op(codec_team *tm, int t) {
    char err[256];
    size_t off = (size_t)t * tm->slice, n = off < tm->count ? tm->count - off : 0;
    n = n < tm->slice ? n : tm->slice;
    uint8_t *wire = tm->wire + (size_t)t * tm->slice_wire;
    if (!n) return;
    switch (tm->op) {
    case OP_MEMCPY: memcpy(tm->dst + off, tm->x + off, n * sizeof(float)); break;
    case OP_TRAFFIC:
        encode_traffic(tm->x + off, tm->tres + off, n, wire, (size_t)((double)n * tm->wire_per_value));
        break;
    case OP_ENCODE:
        echo_codec_encode_as(tm->codec, tm->x + off, tm->res + off, n, tm->group, wire, err, sizeof err);
        break;
    case OP_DECODE_ACC: echo_codec_decode_as(tm->codec, wire, n, tm->group, tm->acc + off, 1, err, sizeof err); break;
    }
}

typedef struct team_arg {
    codec_team *tm;
    int t;
} team_arg;

static void *team_worker(void *p) {
    team_arg *a = p;
    for (;;) {
        pthread_barrier_wait(&a->tm->bar);
        if (a->tm->op == OP_COUNT) return NULL;
        team_op(a->tm, a->t);
        pthread_barrier_wait(&a->tm->bar);
    }
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rounds of the three ops on the team (the caller is thread 0); 0 or -1. */
static int time_ops(codec_team *tm, double best[OP_COUNT]) {
    thread_set ts = {.n = 0};
    team_arg args[ECHO_BENCH_MAX_THREADS];
    if (tm->nthreads > 1 && pthread_barrier_init(&tm->bar, NULL, (unsigned)tm->nthreads)) return -1;
    for (int t = 1; t < tm->nthreads; t++)
        args[t - 1] = (team_arg){tm, t};
    if (tm->nthreads > 1 && ts_start(&ts, tm->nthreads - 1, team_worker, args, sizeof *args)) {
        pthread_barrier_destroy(&tm->bar);
        return -1;
    }
    for (int op = 0; op < OP_COUNT; op++)
        best[op] = 1e30;
    for (int it = 0; it < tm->iters; it++)
        for (int op = 0; op < OP_COUNT; op++) {
            tm->op = op;
            double t0 = tm->nthreads > 1 ? wall_s() : thread_cpu_s();
            if (tm->nthreads > 1) pthread_barrier_wait(&tm->bar);
            team_op(tm, 0);
            if (tm->nthreads > 1) pthread_barrier_wait(&tm->bar);
            double t = (tm->nthreads > 1 ? wall_s() : thread_cpu_s()) - t0;
            best[op] = t < best[op] ? t : best[op];
        }
    if (tm->nthreads > 1) {
        tm->op = OP_COUNT;
        pthread_barrier_wait(&tm->bar);
        ts_join(&ts);
        pthread_barrier_destroy(&tm->bar);
    }
    return 0;
}

/* The host codec loops comm/ runs (its table: scalar, avx2, avx512). */
static const char *codec_path(void) {
    return echo_codec_host_isa();
}

static double codec_rel_err(echo_codec_id codec, const float *x, size_t n, int group, void *wire, float *out) {
    char err[256];
    if (echo_codec_encode_as(codec, x, NULL, n, group, wire, err, sizeof err) ||
        echo_codec_decode_as(codec, wire, n, group, out, 0, err, sizeof err))
        return NAN;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)out[i] - x[i];
        num += d * d;
        den += (double)x[i] * x[i];
    }
    return sqrt(num / den);
}

/* The alpha-beta model of one all-reduce of a `bytes` message of
 * act_bits-wide activations (docs/echo.md, "Cost model"): exact is a ring,
 * 2(N-1) steps each moving 1/N of the message; echo moves the same pattern at
 * w bits per value and pays its codec work per rank (encode ~M values,
 * decode ~(2 - 1/N) M values) at the given rates, in GB/s of fp32 values,
 * not overlapped with the wire (conservative). */
static void cost_model(int n, double alpha_s, double link_gbps, double bytes, int act_bits, double wire_bits,
                       double enc_gbps, double dec_gbps, double *t_exact, double *t_echo) {
    double steps = 2.0 * (n - 1), frac = 2.0 * (n - 1) / n, beta = link_gbps * 1e9, M = bytes * 8 / act_bits;
    double codec = 4 * M / (enc_gbps * 1e9) + 4 * M * (2.0 - 1.0 / n) / (dec_gbps * 1e9);
    *t_exact = steps * alpha_s + frac * bytes / beta;
    *t_echo = steps * alpha_s + frac * M * wire_bits / 8 / beta + codec;
}

static int cmd_codec(int argc, char **argv) {
    int group = 0, iters = 20, json = 0, seed = 1, mranks = 8, act_bits = 32, threads = 1;
    echo_codec_id codec = ECHO_CODEC_DEFAULT;
    double alpha_us = 10, ov_enc = 0, ov_dec = 0;
    const char *links = "1.25,12.5,25,50,100,400";
    size_t count = 8u << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--json"))
            json = 1;
        else if (!v)
            bad = 1;
        else if (!strcmp(a, "--count"))
            bad = !(count = parse_size(v)), i++;
        else if (!strcmp(a, "--group"))
            bad = parse_int(v, 0, ECHO_MAX_GROUP, &group), i++;
        else if (!strcmp(a, "--codec")) {
            int g = 0;
            bad = echo_codec_parse(v, &codec, &g), i++;
            if (g) group = g;
        } else if (!strcmp(a, "--iters"))
            bad = parse_int(v, 1, 100000, &iters), i++;
        else if (!strcmp(a, "--threads"))
            bad = parse_int(v, 1, ECHO_BENCH_MAX_THREADS, &threads), i++;
        else if (!strcmp(a, "--seed"))
            bad = parse_int(v, 0, 1 << 30, &seed), i++;
        else if (!strcmp(a, "--ranks"))
            bad = parse_int(v, 2, ECHO_MAX_RANKS, &mranks), i++;
        else if (!strcmp(a, "--alpha-us"))
            alpha_us = atof(v), i++;
        else if (!strcmp(a, "--links"))
            links = v, i++;
        else if (!strcmp(a, "--act-bits"))
            bad = parse_int(v, 16, 32, &act_bits) || (act_bits != 16 && act_bits != 32), i++;
        else if (!strcmp(a, "--codec-gbps"))
            bad = sscanf(v, "%lf,%lf", &ov_enc, &ov_dec) != 2, i++;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr,
                    "usage: echo-bench codec [--count M] [--group G (default: all)] [--codec NAME[-gG]] [--iters N] "
                    "[--threads T] [--seed S] [--json]\n"
                    "                        [--ranks N] [--alpha-us A] [--links GBPS,...] [--codec-gbps ENC,DEC]\n"
                    "                        [--act-bits 32|16]  (cost model)\n");
            return 2;
        }
    }
    float *x = malloc(count * sizeof *x), *xo = malloc(count * sizeof *xo),
          *res = calloc(count + ECHO_MAX_GROUP, sizeof *res);
    float *acc = calloc(count, sizeof *acc), *dst = malloc(count * sizeof *dst), *tres = calloc(count, sizeof *tres);
    /* the largest wire form of this codec over the groups it takes (hout2
     * at G = 16 is 8 bits a value, int4's 5) */
    size_t slice = (count + (size_t)threads - 1) / (size_t)threads, wire_bytes = 0;
    slice = (slice + ECHO_MAX_GROUP - 1) / ECHO_MAX_GROUP * ECHO_MAX_GROUP; /* whole groups of every size */
    for (int G = ECHO_MIN_GROUP; G <= ECHO_MAX_GROUP; G *= 2) {
        size_t b = (slice + (size_t)G - 1) / (size_t)G * echo_codec_group_bytes(codec, G);
        wire_bytes = b > wire_bytes ? b : wire_bytes;
    }
    wire_bytes = (wire_bytes + 63) / 64 * 64;
    uint8_t *wire = malloc(wire_bytes * (size_t)threads);
    int status = 0;
    if (!x || !xo || !res || !acc || !dst || !tres || !wire) {
        fprintf(stderr, "echo-bench: out of memory for %zu values\n", count);
        status = 1;
        goto out;
    }
    fill(DIST_GAUSS, x, count, (uint64_t)seed, 0, 0);
    fill(DIST_OUTLIER, xo, count, (uint64_t)seed, 0, 0);
    memset(dst, 0, count * sizeof *dst); /* fault the pages in before timing */
    memset(wire, 0, wire_bytes * (size_t)threads);
    if (json)
        printf("[");
    else {
        printf("# echo-bench codec %s: %zu fp32 values (%.1f MiB), %d thread%s, best of %d rounds of memcpy, encode "
               "traffic, encode, decode in %s; GB/s of fp32 values (CPU numbers; codec path %s)\n",
               echo_codec_get(codec)->name, count, count * 4.0 / (1 << 20), threads, threads > 1 ? "s" : "", iters,
               threads > 1 ? "wall time, each thread a slice of whole groups" : "thread CPU time", codec_path());
        printf("# traf/cpy: the encode's memory traffic alone (read x and the residual, write the residual and "
               "the wire bytes; no coding) over memcpy: the most enc/cpy can be where memory is the bound\n");
        printf("# %6s %10s %12s %12s %12s %8s %8s %8s %14s %14s\n", "group", "wire(b/v)", "encode GB/s", "dec+acc GB/s",
               "memcpy GB/s", "enc/cpy", "dec/cpy", "traf/cpy", "rel_err gauss", "rel_err outlr");
    }
    int first = 1, model_group = group ? group : echo_codec_default_group(codec);
    double model_enc = 0, model_dec = 0, model_bits = 0;
    for (int G = ECHO_MIN_GROUP; G <= ECHO_MAX_GROUP; G *= 2) {
        if ((group && G != group) || !echo_codec_group_bytes(codec, G)) continue;
        double bytes = (double)count * sizeof(float);
        double best[OP_COUNT];
        codec_team tm = {.nthreads = threads,
                         .iters = iters,
                         .group = G,
                         .codec = codec,
                         .x = x,
                         .res = res,
                         .acc = acc,
                         .dst = dst,
                         .tres = tres,
                         .wire = wire,
                         .count = count,
                         .slice = slice,
                         .slice_wire = wire_bytes,
                         .wire_per_value = (double)echo_codec_group_bytes(codec, G) / G};
        if (time_ops(&tm, best)) {
            fprintf(stderr, "echo-bench: could not start %d threads\n", threads);
            status = 1;
            goto out;
        }
        double tmc = best[OP_MEMCPY], tt = best[OP_TRAFFIC], te = best[OP_ENCODE], td = best[OP_DECODE_ACC];
        double eg = codec_rel_err(codec, x, count, G, wire, dst), eo = codec_rel_err(codec, xo, count, G, wire, dst);
        double bits =
            8.0 * (double)((count + (size_t)G - 1) / (size_t)G * echo_codec_group_bytes(codec, G)) / (double)count;
        if (G == model_group) {
            model_enc = bytes / te / 1e9;
            model_dec = bytes / td / 1e9;
            model_bits = bits;
        }
        if (json)
            printf("%s\n {\"codec\": \"%s\", \"group\": %d, \"count\": %zu, \"wire_bits_per_value\": %.4f, "
                   "\"encode_gbps\": %.3f, "
                   "\"decode_acc_gbps\": %.3f, \"memcpy_gbps\": %.3f, \"encode_vs_memcpy\": %.3f, "
                   "\"decode_acc_vs_memcpy\": %.3f, \"traffic_gbps\": %.3f, \"traffic_vs_memcpy\": %.3f, "
                   "\"rel_err_gauss\": %.6g, \"rel_err_outlier\": %.6g, \"codec_path\": \"%s\", \"threads\": %d}",
                   first ? "" : ",", echo_codec_get(codec)->name, G, count, bits, bytes / te / 1e9, bytes / td / 1e9,
                   bytes / tmc / 1e9, tmc / te, tmc / td, bytes / tt / 1e9, tmc / tt, eg, eo, codec_path(), threads);
        else
            printf("  %6d %10.4f %12.2f %12.2f %12.2f %8.2f %8.2f %8.2f %14.5f %14.5f\n", G, bits, bytes / te / 1e9,
                   bytes / td / 1e9, bytes / tmc / 1e9, tmc / te, tmc / td, tmc / tt, eg, eo);
        fflush(stdout);
        first = 0;
    }
    if (ov_enc > 0 && ov_dec > 0) {
        model_enc = ov_enc;
        model_dec = ov_dec;
    }
    if (json)
        printf("\n]\n");
    else if (model_enc > 0) {
        printf("# cost model: 1 GiB all-reduce of %s, %d ranks, alpha %.1f us, group %d (%.3f b/v), codec rates "
               "%s (not overlapped)\n",
               act_bits == 32 ? "fp32" : "bf16", mranks, alpha_us, model_group, model_bits,
               ov_enc > 0    ? "given by --codec-gbps"
               : threads > 1 ? "measured above"
                             : "measured above (one thread)");
        printf("# %10s %12s %12s %10s\n", "link GB/s", "exact ms", "echo ms", "speed-up");
        char list[256];
        snprintf(list, sizeof list, "%s", links);
        for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            double link = atof(tok), te_, tq_;
            if (link <= 0) continue;
            cost_model(mranks, alpha_us * 1e-6, link, 1024.0 * 1024 * 1024, act_bits, model_bits, model_enc, model_dec,
                       &te_, &tq_);
            printf("  %10.2f %12.2f %12.2f %10.2f\n", link, te_ * 1e3, tq_ * 1e3, te_ / tq_);
        }
        /* exact - echo = frac*M*(act - w)/8/beta - codec(M) = 0, per value */
        double n = mranks, frac = 2 * (n - 1) / n;
        double breakeven = frac * (act_bits - model_bits) / 8 / (4 / model_enc + 4 * (2 - 1 / n) / model_dec);
        printf("# echo is faster on links slower than %.2f GB/s at this codec speed; the break-even link speed "
               "scales with the codec's (threads, GPU kernels): --codec-gbps ENC,DEC overrides it\n",
               breakeven);
    }
out:
    free(x);
    free(xo);
    free(res);
    free(acc);
    free(dst);
    free(tres);
    free(wire);
    return status;
}

/* ---- subcommand table ---- */

typedef struct bench_cmd {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name, as getopt expects */
    const char *help;
} bench_cmd;

static const bench_cmd commands[] = {
    {"allreduce", cmd_allreduce, "all-reduce time, bandwidth, wire bits and error per size and algorithm"},
    {"chain", cmd_chain, "accumulated error vs depth of chained all-reduces, int4 vs echo"},
    {"codec", cmd_codec, "codec GB/s (encode, decode-accumulate) beside memcpy; error vs wire bits per group"},
    {"serve", bench_serve_main, "load generator for OpenAI-compatible servers (vllm bench serve)"},
    {"plot", bench_plot_main, "PNG plots: TTFT CDF of serve results, algbw vs size of allreduce --json"},
    {"randmodel", bench_randmodel_main, "a Qwen3 model folder (8B, 0.6B or tiny shape) with random bf16 weights"},
    {"forward", bench_forward_main, "engine prefill tok/s + TFLOP/s, decode tok/s vs roofline, TTFT"},
};

static void usage(void) {
    fprintf(stderr, "usage: echo-bench <command> [options]   (echo-bench <command> --help)\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(stderr, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage();
        return 2;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    usage();
    return 2;
}
