/*
 * echo-bench allreduce: nccl-tests-style table per message size and
 * algorithm: time, algbw, busbw = algbw*2(N-1)/N, wire bits per value,
 * relative error vs an fp64 sum. local (here): fp32 messages, ranks are
 * threads over host memory. nccl: bf16 messages on GPUs 0..N-1, exact =
 * NCCL's own bf16 all-reduce (allreduce_nccl.c). mpi: under mpirun, one
 * rank per process, fp32; time = slowest rank's; rank 0 prints
 * (allreduce_mpi.c; scripts/netlab.sh and docs/network.md: over a shaped
 * link).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/echo.h"
#include "tools/bench/bench.h"

bench_ar_row bench_ar_row_make(echo_preset mode, int nranks, size_t count, double t, double num, double den,
                               echo_comm *c, echo_world *w) {
    echo_stats st;
    echo_get_stats(c, &st);
    uint64_t calls = 0, wire = 0;
    for (int k = 0; k < ECHO_PRESET_COUNT; k++)
        calls += st.calls[k], wire += st.wire_bytes[k];
    echo_config got;
    echo_world_get_config(w, &got);
    double bytes = (double)count * sizeof(float), N = nranks;
    return (bench_ar_row){(size_t)bytes,
                          echo_preset_name(mode),
                          nranks,
                          got.group_size,
                          t * 1e6,
                          bytes / t / 1e9,
                          bytes / t / 1e9 * 2.0 * (N - 1) / N,
                          calls ? 8.0 * (double)wire / calls / (2.0 * (N - 1) / N * (double)count) : 0,
                          den > 0 ? sqrt(num / den) : sqrt(num),
                          echo_codec_get(got.codec)->name,
                          got.feedback};
}

void bench_ar_print_columns(void) {
    printf("# %12s %9s %6s %12s %12s %12s %10s %10s\n", "bytes", "algo", "group", "time(us)", "algbw(GB/s)",
           "busbw(GB/s)", "wire(b/v)", "rel_err");
}

void bench_ar_print_row(const bench_ar_row *row, int json, int first) {
    if (json)
        printf("%s\n {\"bytes\": %zu, \"algo\": \"%s\", \"codec\": \"%s\", \"feedback\": %d, "
               "\"ranks\": %d, \"group\": %d, \"time_us\": %.3f, "
               "\"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, \"wire_bits_per_value\": %.4f, \"rel_err\": %.6g}",
               first ? "" : ",", row->bytes, row->algo, row->codec, row->feedback, row->ranks, row->group, row->time_us,
               row->algbw, row->busbw, row->wire_bits, row->rel_err);
    else
        printf("  %12zu %9s %6d %12.1f %12.3f %12.3f %10.3f %10.3g\n", row->bytes, row->algo, row->group, row->time_us,
               row->algbw, row->busbw, row->wire_bits, row->rel_err);
}

typedef struct ar_run {
    bench_ranks k;
    float *x[ECHO_MAX_RANKS];
    size_t count;
    int nranks, iters, warmup;
    double *dt; /* [iter][rank] */
    pthread_barrier_t bar;
} ar_run;

/* Every iteration restores the input (untimed), lines the ranks up, and
 * times one pass with one call: the collective's time is the slowest
 * rank's. */
static void *ar_rank(void *p) {
    bench_rank_arg *a = p;
    ar_run *R = a->run;
    bench_ranks *k = &R->k;
    int r = a->rank;
    for (int it = 0; it < R->warmup + R->iters; it++) {
        memcpy(k->buf[r], R->x[r], R->count * sizeof(float));
        pthread_barrier_wait(&R->bar);
        double t0 = bench_now_s();
        int rc = echo_begin_pass(k->c[r], ECHO_PASS_EAGER, k->err[r], sizeof k->err[r]);
        if (!rc) rc = echo_allreduce(k->c[r], 0, k->buf[r], R->count, ECHO_F32, NULL, k->err[r], sizeof k->err[r]);
        double t1 = bench_now_s();
        if (rc) k->rc[r] = rc; /* every rank fails the same call; keep looping so the barrier stays even */
        if (it >= R->warmup) R->dt[(size_t)(it - R->warmup) * R->nranks + r] = t1 - t0;
    }
    return NULL;
}

static int ar_measure(int nranks, echo_preset mode, echo_codec_id codec, int group, size_t min_policy, size_t count,
                      float *const *x, const double *ref, int iters, bench_ar_row *row, char *err, size_t errlen) {
    ar_run *R = calloc(1, sizeof *R);
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
    if (!R->dt) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (bench_ranks_open(&R->k, nranks, &cfg, count, err, errlen)) goto out;
    for (int r = 0; r < nranks; r++)
        R->x[r] = x[r];
    if (pthread_barrier_init(&R->bar, NULL, (unsigned)nranks)) {
        snprintf(err, errlen, "cannot make a barrier for %d rank threads", nranks);
        goto out;
    }
    int failed = bench_ranks_run(&R->k, ar_rank, R, err, errlen);
    pthread_barrier_destroy(&R->bar);
    if (failed) goto out;
    double tsum = 0;
    for (int it = 0; it < iters; it++) {
        double m = 0;
        for (int r = 0; r < nranks; r++)
            m = R->dt[(size_t)it * nranks + r] > m ? R->dt[(size_t)it * nranks + r] : m;
        tsum += m;
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < count; i++) {
        double d = (double)R->k.buf[0][i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    *row = bench_ar_row_make(mode, nranks, count, tsum / iters, num, den, R->k.c[0], R->k.w);
    status = 0;
out:
    bench_ranks_close(&R->k);
    free(R->dt);
    free(R);
    return status;
}

static void ar_usage(void) {
    fprintf(
        stderr,
        "usage: echo-bench allreduce [--transport T] [--ranks N] [--algo A,B,...]\n"
        "                            [--min-bytes 1K] [--max-bytes 16M] [--step 2] [--group G] [--codec NAME[-gG]]\n"
        "                            [--echo-min-bytes N] [--iters N] [--warmup N] [--seed S]\n"
        "                            [--dist gauss|outlier] [--json]\n"
        "  local: ranks are threads over host memory, fp32 (CPU numbers)\n"
        "  nccl:  rank r on GPU r, bf16, exact = NCCL's bf16 all-reduce; uniform inputs (no --dist)\n"
        "  mpi:   under mpirun, one rank per process (--ranks is the job's size), fp32; exact =\n"
        "         MPI_Allreduce, or the two-shot schedule with ECHO_MPI_EXACT=twoshot; time =\n"
        "         median over iterations of the slowest rank's\n");
    char b[128];
    fprintf(stderr, "  T (transport table): %s\n", echo_transport_names(b, sizeof b, ", "));
    fprintf(stderr, "  A (presets): %s\n", echo_preset_names(b, sizeof b, ", "));
}

int bench_allreduce_main(int argc, char **argv) {
    int nranks = 2, group = 0, iters = 0, json = 0, seed = 1, step = 2, warmup = 1;
    echo_codec_id codec = ECHO_CODEC_DEFAULT;
    bench_dist dist = BENCH_DIST_GAUSS;
    size_t minb = 1024, maxb = 16u << 20, policy = 0;
    const char *algos = "exact,int4,echo", *transport = "local";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--json"))
            json = 1;
        else if (!v)
            bad = 1;
        else if (bench_comm_flag(a, v, &group, &codec, &seed, &dist, &bad))
            i++;
        else if (!strcmp(a, "--transport"))
            transport = v, i++;
        else if (!strcmp(a, "--ranks"))
            bad = bench_parse_int(v, 1, ECHO_MAX_RANKS, &nranks), i++;
        else if (!strcmp(a, "--algo"))
            algos = v, i++;
        else if (!strcmp(a, "--min-bytes"))
            bad = !(minb = bench_parse_size(v)), i++;
        else if (!strcmp(a, "--max-bytes"))
            bad = !(maxb = bench_parse_size(v)), i++;
        else if (!strcmp(a, "--echo-min-bytes"))
            policy = bench_parse_size(v), i++;
        else if (!strcmp(a, "--iters"))
            bad = bench_parse_int(v, 1, 1000000, &iters), i++;
        else if (!strcmp(a, "--step"))
            bad = bench_parse_int(v, 2, 1024, &step), i++;
        else if (!strcmp(a, "--warmup"))
            bad = bench_parse_int(v, 0, 100, &warmup), i++;
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
            char names[128];
            fprintf(stderr, "echo-bench: unknown algo '%s' (%s)\n", tok, echo_preset_names(names, sizeof names, ", "));
            return 2;
        }
        nmodes++;
    }
    if (minb < 4 || maxb < minb) {
        ar_usage();
        return 2;
    }
    if (!tr->threads) {
        bench_ar_mpi_opts o = {tr->name, group, iters, warmup,       json,   seed,  nmodes,
                               dist,     minb,  maxb,  (size_t)step, policy, modes, codec};
        return bench_allreduce_mpi(&o);
    }
    if (tr->device_memory == 1) {
        for (int m = 0; m < nmodes; m++)
            if (modes[m] == ECHO_PRESET_BF16) {
                fprintf(stderr, "echo-bench: --transport %s takes exact, int4 and echo (its exact is NCCL's bf16)\n",
                        tr->name);
                return 2;
            }
        if (dist != BENCH_DIST_GAUSS) {
            fprintf(stderr,
                    "echo-bench: --dist is not supported with --transport %s (inputs are generated on "
                    "the GPUs, uniform)\n",
                    tr->name);
            return 2;
        }
        if (nranks < 2) {
            fprintf(stderr, "echo-bench: --transport %s needs --ranks >= 2\n", tr->name);
            return 2;
        }
        bench_ar_opts o = {tr->name, nranks, group, iters, json, seed, minb, maxb, policy, {0}, nmodes};
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
        bench_fill(dist, x[r], maxc, (uint64_t)seed, 0, (uint64_t)r);
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
               nranks, dist == BENCH_DIST_GAUSS ? "Gaussian" : "outlier", policy);
        bench_ar_print_columns();
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
            bench_ar_row row;
            char err[512];
            if (ar_measure(nranks, modes[m], codec, group, policy, count, x, ref, it, &row, err, sizeof err)) {
                if (json) printf("]\n");
                fprintf(stderr, "echo-bench: %s\n", err);
                status = 1;
                goto out;
            }
            bench_ar_print_row(&row, json, first);
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
