/*
 * echo-bench chain: accumulated error of K chained all-reduces of
 * independent random partials, int4 vs echo: ||sum out - sum exact|| per
 * depth (ranks are threads, the local transport).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/echo.h"
#include "tools/bench/bench.h"

typedef struct chain_run {
    bench_ranks k;
    int nranks, K;
    size_t count;
    uint64_t seed;
    bench_dist dist;
    double *acc_out, *acc_exact, *abs_err, *ref_norm;
} chain_run;

/* Call k gets fresh partials; rank 0 accumulates the outputs and the fp64
 * exact sums and records the error of the running sums after each call. */
static void *chain_rank(void *p) {
    bench_rank_arg *a = p;
    chain_run *R = a->run;
    bench_ranks *rk = &R->k;
    int r = a->rank;
    rk->rc[r] = echo_begin_pass(rk->c[r], ECHO_PASS_EAGER, rk->err[r], sizeof rk->err[r]);
    for (int k = 0; k < R->K && !rk->rc[r]; k++) {
        bench_fill(R->dist, rk->buf[r], R->count, R->seed, (uint64_t)k + 1, (uint64_t)r);
        rk->rc[r] = echo_allreduce(rk->c[r], k, rk->buf[r], R->count, ECHO_F32, NULL, rk->err[r], sizeof rk->err[r]);
        if (rk->rc[r] || r) continue;
        double e = 0, n = 0;
        for (size_t i = 0; i < R->count; i++) {
            double ex = 0;
            for (int j = 0; j < R->nranks; j++)
                ex += bench_sample(R->dist, R->seed, (uint64_t)k + 1, (uint64_t)j, i);
            R->acc_out[i] += rk->buf[0][i];
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
    if (bench_ranks_open(&R->k, nranks, &cfg, count, err, errlen) || bench_ranks_run(&R->k, chain_rank, R, err, errlen))
        goto out;
    status = 0;
out:
    bench_ranks_close(&R->k);
    free(R->acc_out);
    free(R->acc_exact);
    free(R);
    return status;
}

int bench_chain_main(int argc, char **argv) {
    int nranks = 4, K = 144, group = 0, json = 0, seed = 1;
    echo_codec_id codec = ECHO_CODEC_DEFAULT;
    bench_dist dist = BENCH_DIST_GAUSS;
    size_t count = 16384;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--json"))
            json = 1;
        else if (!v)
            bad = 1;
        else if (bench_comm_flag(a, v, &group, &codec, &seed, &dist, &bad))
            i++;
        else if (!strcmp(a, "--ranks"))
            bad = bench_parse_int(v, 2, ECHO_MAX_RANKS, &nranks), i++;
        else if (!strcmp(a, "--depth"))
            bad = bench_parse_int(v, 1, 100000, &K), i++;
        else if (!strcmp(a, "--count"))
            bad = !(count = bench_parse_size(v)), i++;
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
               nranks, count, group ? group : ECHO_DEFAULT_GROUP, dist == BENCH_DIST_GAUSS ? "Gaussian" : "outlier");
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
