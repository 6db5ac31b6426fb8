/*
 * echo-bench codec: codec throughput (encode with error feedback,
 * decode-accumulate) beside memcpy in the same rounds on the same T threads
 * (default 1), with the ratio to it, the same ratio for the encode's memory
 * traffic alone (its ceiling where memory is the bound), coding error vs
 * wire bits per group size, and the alpha-beta cost model of a 1 GiB
 * all-reduce.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/codec/codec.h"
#include "comm/echo.h"
#include "tools/bench/bench.h"

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
_Static_assert(ECHO_BENCH_MAX_THREADS <= BENCH_THREADS_MAX && ECHO_MAX_RANKS <= BENCH_THREADS_MAX,
               "thread sets hold every thread");

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

/* Rounds of the three ops on the team (the caller is thread 0); 0 or -1. */
static int time_ops(codec_team *tm, double best[OP_COUNT]) {
    bench_threads ts = {.n = 0};
    team_arg args[ECHO_BENCH_MAX_THREADS];
    if (tm->nthreads > 1 && pthread_barrier_init(&tm->bar, NULL, (unsigned)tm->nthreads)) return -1;
    for (int t = 1; t < tm->nthreads; t++)
        args[t - 1] = (team_arg){tm, t};
    if (tm->nthreads > 1 && bench_threads_start(&ts, tm->nthreads - 1, team_worker, args, sizeof *args)) {
        pthread_barrier_destroy(&tm->bar);
        return -1;
    }
    for (int op = 0; op < OP_COUNT; op++)
        best[op] = 1e30;
    for (int it = 0; it < tm->iters; it++)
        for (int op = 0; op < OP_COUNT; op++) {
            tm->op = op;
            double t0 = tm->nthreads > 1 ? bench_now_s() : thread_cpu_s();
            if (tm->nthreads > 1) pthread_barrier_wait(&tm->bar);
            team_op(tm, 0);
            if (tm->nthreads > 1) pthread_barrier_wait(&tm->bar);
            double t = (tm->nthreads > 1 ? bench_now_s() : thread_cpu_s()) - t0;
            best[op] = t < best[op] ? t : best[op];
        }
    if (tm->nthreads > 1) {
        tm->op = OP_COUNT;
        pthread_barrier_wait(&tm->bar);
        bench_threads_join(&ts);
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

/* echo-bench codec's options. */
typedef struct codec_opts {
    int group, iters, json, seed, mranks, act_bits, threads;
    echo_codec_id codec;
    double alpha_us, ov_enc, ov_dec; /* ov_*: --codec-gbps, 0 unless given */
    const char *links;
    size_t count;
} codec_opts;

/* The command line into *o; -1 (usage printed) when it is bad. */
static int codec_parse(int argc, char **argv, codec_opts *o) {
    *o = (codec_opts){.iters = 20, .seed = 1, .mranks = 8, .act_bits = 32, .threads = 1,
                      .codec = ECHO_CODEC_DEFAULT, .alpha_us = 10, .links = "1.25,12.5,25,50,100,400",
                      .count = 8u << 20};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--json"))
            o->json = 1;
        else if (!v)
            bad = 1;
        else if (bench_comm_flag(a, v, &o->group, &o->codec, &o->seed, NULL, &bad))
            i++;
        else if (!strcmp(a, "--count"))
            bad = !(o->count = bench_parse_size(v)), i++;
        else if (!strcmp(a, "--iters"))
            bad = bench_parse_int(v, 1, 100000, &o->iters), i++;
        else if (!strcmp(a, "--threads"))
            bad = bench_parse_int(v, 1, ECHO_BENCH_MAX_THREADS, &o->threads), i++;
        else if (!strcmp(a, "--ranks"))
            bad = bench_parse_int(v, 2, ECHO_MAX_RANKS, &o->mranks), i++;
        else if (!strcmp(a, "--alpha-us"))
            o->alpha_us = atof(v), i++;
        else if (!strcmp(a, "--links"))
            o->links = v, i++;
        else if (!strcmp(a, "--act-bits"))
            bad = bench_parse_int(v, 16, 32, &o->act_bits) || (o->act_bits != 16 && o->act_bits != 32), i++;
        else if (!strcmp(a, "--codec-gbps"))
            bad = sscanf(v, "%lf,%lf", &o->ov_enc, &o->ov_dec) != 2, i++;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr,
                    "usage: echo-bench codec [--count M] [--group G (default: all)] [--codec NAME[-gG]] [--iters N] "
                    "[--threads T] [--seed S] [--json]\n"
                    "                        [--ranks N] [--alpha-us A] [--links GBPS,...] [--codec-gbps ENC,DEC]\n"
                    "                        [--act-bits 32|16]  (cost model)\n");
            return -1;
        }
    }
    return 0;
}

/* The cost model's table: a 1 GiB all-reduce, exact vs echo, per link
 * speed of --links, at the codec rates measured (or --codec-gbps). */
static void codec_cost_report(const codec_opts *o, int model_group, double model_bits, double model_enc,
                              double model_dec) {
    printf("# cost model: 1 GiB all-reduce of %s, %d ranks, alpha %.1f us, group %d (%.3f b/v), codec rates "
           "%s (not overlapped)\n",
           o->act_bits == 32 ? "fp32" : "bf16", o->mranks, o->alpha_us, model_group, model_bits,
           o->ov_enc > 0    ? "given by --codec-gbps"
           : o->threads > 1 ? "measured above"
                         : "measured above (one thread)");
    printf("# %10s %12s %12s %10s\n", "link GB/s", "exact ms", "echo ms", "speed-up");
    char list[256];
    snprintf(list, sizeof list, "%s", o->links);
    for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        double link = atof(tok), te_, tq_;
        if (link <= 0) continue;
        cost_model(o->mranks, o->alpha_us * 1e-6, link, 1024.0 * 1024 * 1024, o->act_bits, model_bits, model_enc, model_dec,
                   &te_, &tq_);
        printf("  %10.2f %12.2f %12.2f %10.2f\n", link, te_ * 1e3, tq_ * 1e3, te_ / tq_);
    }
    /* exact - echo = frac*M*(act - w)/8/beta - codec(M) = 0, per value */
    double n = o->mranks, frac = 2 * (n - 1) / n;
    double breakeven = frac * (o->act_bits - model_bits) / 8 / (4 / model_enc + 4 * (2 - 1 / n) / model_dec);
    printf("# echo is faster on links slower than %.2f GB/s at this codec speed; the break-even link speed "
           "scales with the codec's (threads, GPU kernels): --codec-gbps ENC,DEC overrides it\n",
           breakeven);
}

int bench_codec_main(int argc, char **argv) {
    codec_opts opt;
    if (codec_parse(argc, argv, &opt)) return 2;
    const codec_opts *o = &opt;
    float *x = malloc(o->count * sizeof *x), *xo = malloc(o->count * sizeof *xo),
          *res = calloc(o->count + ECHO_MAX_GROUP, sizeof *res);
    float *acc = calloc(o->count, sizeof *acc), *dst = malloc(o->count * sizeof *dst), *tres = calloc(o->count, sizeof *tres);
    /* the largest wire form of this codec over the groups it takes (hout2
     * at G = 16 is 8 bits a value, int4's 5) */
    size_t slice = (o->count + (size_t)o->threads - 1) / (size_t)o->threads, wire_bytes = 0;
    slice = (slice + ECHO_MAX_GROUP - 1) / ECHO_MAX_GROUP * ECHO_MAX_GROUP; /* whole groups of every size */
    for (int G = ECHO_MIN_GROUP; G <= ECHO_MAX_GROUP; G *= 2) {
        size_t b = (slice + (size_t)G - 1) / (size_t)G * echo_codec_group_bytes(o->codec, G);
        wire_bytes = b > wire_bytes ? b : wire_bytes;
    }
    wire_bytes = (wire_bytes + 63) / 64 * 64;
    uint8_t *wire = malloc(wire_bytes * (size_t)o->threads);
    int status = 0;
    if (!x || !xo || !res || !acc || !dst || !tres || !wire) {
        fprintf(stderr, "echo-bench: out of memory for %zu values\n", o->count);
        status = 1;
        goto out;
    }
    bench_fill(BENCH_DIST_GAUSS, x, o->count, (uint64_t)o->seed, 0, 0);
    bench_fill(BENCH_DIST_OUTLIER, xo, o->count, (uint64_t)o->seed, 0, 0);
    memset(dst, 0, o->count * sizeof *dst); /* fault the pages in before timing */
    memset(wire, 0, wire_bytes * (size_t)o->threads);
    if (o->json)
        printf("[");
    else {
        printf("# echo-bench codec %s: %zu fp32 values (%.1f MiB), %d thread%s, best of %d rounds of memcpy, encode "
               "traffic, encode, decode in %s; GB/s of fp32 values (CPU numbers; codec path %s)\n",
               echo_codec_get(o->codec)->name, o->count, o->count * 4.0 / (1 << 20), o->threads, o->threads > 1 ? "s" : "", o->iters,
               o->threads > 1 ? "wall time, each thread a slice of whole groups" : "thread CPU time", codec_path());
        printf("# traf/cpy: the encode's memory traffic alone (read x and the residual, write the residual and "
               "the wire bytes; no coding) over memcpy: the most enc/cpy can be where memory is the bound\n");
        printf("# %6s %10s %12s %12s %12s %8s %8s %8s %14s %14s\n", "group", "wire(b/v)", "encode GB/s", "dec+acc GB/s",
               "memcpy GB/s", "enc/cpy", "dec/cpy", "traf/cpy", "rel_err gauss", "rel_err outlr");
    }
    int first = 1, model_group = o->group ? o->group : echo_codec_default_group(o->codec);
    double model_enc = 0, model_dec = 0, model_bits = 0;
    for (int G = ECHO_MIN_GROUP; G <= ECHO_MAX_GROUP; G *= 2) {
        if ((o->group && G != o->group) || !echo_codec_group_bytes(o->codec, G)) continue;
        double bytes = (double)o->count * sizeof(float);
        double best[OP_COUNT];
        codec_team tm = {.nthreads = o->threads,
                         .iters = o->iters,
                         .group = G,
                         .codec = o->codec,
                         .x = x,
                         .res = res,
                         .acc = acc,
                         .dst = dst,
                         .tres = tres,
                         .wire = wire,
                         .count = o->count,
                         .slice = slice,
                         .slice_wire = wire_bytes,
                         .wire_per_value = (double)echo_codec_group_bytes(o->codec, G) / G};
        if (time_ops(&tm, best)) {
            fprintf(stderr, "echo-bench: could not start %d threads\n", o->threads);
            status = 1;
            goto out;
        }
        double tmc = best[OP_MEMCPY], tt = best[OP_TRAFFIC], te = best[OP_ENCODE], td = best[OP_DECODE_ACC];
        double eg = codec_rel_err(o->codec, x, o->count, G, wire, dst), eo = codec_rel_err(o->codec, xo, o->count, G, wire, dst);
        double bits =
            8.0 * (double)((o->count + (size_t)G - 1) / (size_t)G * echo_codec_group_bytes(o->codec, G)) / (double)o->count;
        if (G == model_group) {
            model_enc = bytes / te / 1e9;
            model_dec = bytes / td / 1e9;
            model_bits = bits;
        }
        if (o->json)
            printf("%s\n {\"codec\": \"%s\", \"group\": %d, \"count\": %zu, \"wire_bits_per_value\": %.4f, "
                   "\"encode_gbps\": %.3f, "
                   "\"decode_acc_gbps\": %.3f, \"memcpy_gbps\": %.3f, \"encode_vs_memcpy\": %.3f, "
                   "\"decode_acc_vs_memcpy\": %.3f, \"traffic_gbps\": %.3f, \"traffic_vs_memcpy\": %.3f, "
                   "\"rel_err_gauss\": %.6g, \"rel_err_outlier\": %.6g, \"codec_path\": \"%s\", \"threads\": %d}",
                   first ? "" : ",", echo_codec_get(o->codec)->name, G, o->count, bits, bytes / te / 1e9, bytes / td / 1e9,
                   bytes / tmc / 1e9, tmc / te, tmc / td, bytes / tt / 1e9, tmc / tt, eg, eo, codec_path(), o->threads);
        else
            printf("  %6d %10.4f %12.2f %12.2f %12.2f %8.2f %8.2f %8.2f %14.5f %14.5f\n", G, bits, bytes / te / 1e9,
                   bytes / td / 1e9, bytes / tmc / 1e9, tmc / te, tmc / td, tmc / tt, eg, eo);
        fflush(stdout);
        first = 0;
    }
    if (o->ov_enc > 0 && o->ov_dec > 0) {
        model_enc = o->ov_enc;
        model_dec = o->ov_dec;
    }
    if (o->json)
        printf("\n]\n");
    else if (model_enc > 0)
        codec_cost_report(o, model_group, model_bits, model_enc, model_dec);
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
