/*
 * tools/bench: what echo-bench's subcommands share: usage errors and the
 * getopt frame; for the comm/ benchmarks (allreduce, chain, codec)
 * reproducible inputs, size and number parsing, threads that start all
 * together or not at all, and the ranks-as-threads harness.
 */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/bench/bench.h"

int bench_usage_error(const char *cmd, const char *fmt, const char *a) {
    fprintf(stderr, "echo-bench %s: ", cmd);
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\nTry 'echo-bench %s --help'.\n", cmd);
    return 2;
}

void bench_getopt_reset(void) {
    optind = 1;
    opterr = 0;
}

int bench_getopt_error(const char *cmd, int c, char **argv) {
    return bench_usage_error(cmd, c == ':' ? "option '%s' needs a value" : "unknown option '%s'", argv[optind - 1]);
}

double bench_now_s(void) {
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

float bench_sample(bench_dist d, uint64_t seed, uint64_t a, uint64_t b, uint64_t i) {
    float v = gauss(seed, a, b, i);
    if (d == BENCH_DIST_OUTLIER) v *= i % 1024 == 17 ? 50.0f : (i % 1024 == 611 ? 20.0f : 1.0f);
    return v;
}

void bench_fill(bench_dist d, float *x, size_t n, uint64_t seed, uint64_t a, uint64_t b) {
    for (size_t i = 0; i < n; i++)
        x[i] = bench_sample(d, seed, a, b, i);
}

int bench_parse_dist(const char *s, bench_dist *out) {
    if (!strcmp(s, "gauss"))
        *out = BENCH_DIST_GAUSS;
    else if (!strcmp(s, "outlier"))
        *out = BENCH_DIST_OUTLIER;
    else
        return -1;
    return 0;
}

size_t bench_parse_size(const char *s) {
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

int bench_parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int bench_comm_flag(const char *a, const char *v, int *group, echo_codec_id *codec, int *seed, bench_dist *dist,
                    int *bad) {
    if (!strcmp(a, "--group"))
        *bad = bench_parse_int(v, 0, ECHO_MAX_GROUP, group);
    else if (!strcmp(a, "--codec")) {
        int g = 0;
        *bad = echo_codec_parse(v, codec, &g);
        if (g) *group = g;
    } else if (!strcmp(a, "--seed"))
        *bad = bench_parse_int(v, 0, 1 << 30, seed);
    else if (dist && !strcmp(a, "--dist"))
        *bad = bench_parse_dist(v, dist);
    else
        return 0;
    return 1;
}

echo_codec_id bench_codec(echo_preset mode, echo_codec_id codec) {
    echo_codec_id f = echo_preset_codec(mode);
    return f != ECHO_CODEC_DEFAULT && !echo_codec_get(f)->lossless ? ECHO_CODEC_DEFAULT : codec;
}

static void *ts_main(void *p) {
    struct ts_slot *s = p;
    int g;
    while (!(g = atomic_load(&s->ts->gate)))
        sched_yield();
    return g > 0 ? s->fn(s->arg) : NULL;
}

void bench_threads_join(bench_threads *ts) {
    for (int i = 0; i < ts->n; i++)
        pthread_join(ts->th[i], NULL);
}

int bench_threads_start(bench_threads *ts, int n, void *(*fn)(void *), void *args, size_t size) {
    atomic_init(&ts->gate, 0);
    ts->n = 0;
    for (int i = 0; i < n && i < BENCH_THREADS_MAX; i++) {
        ts->slot[i] = (struct ts_slot){ts, fn, (char *)args + (size_t)i * size};
        if (pthread_create(&ts->th[i], NULL, ts_main, &ts->slot[i])) break;
        ts->n++;
    }
    atomic_store(&ts->gate, ts->n == n ? 1 : -1);
    if (ts->n == n) return 0;
    bench_threads_join(ts);
    ts->n = 0;
    return -1;
}

int bench_ranks_open(bench_ranks *k, int nranks, const echo_config *cfg, size_t count, char *err, size_t errlen) {
    k->nranks = nranks;
    echo_world_opts wo = {.nranks = nranks, .device = -1};
    if (echo_world_create("local", &wo, cfg, &k->w, err, errlen)) return -1;
    for (int r = 0; r < nranks; r++) {
        if (echo_comm_create(k->w, r, &k->c[r], err, errlen)) return -1;
        if (!(k->buf[r] = malloc(count * sizeof(float)))) {
            snprintf(err, errlen, "out of memory for %zu values", count);
            return -1;
        }
    }
    return 0;
}

int bench_ranks_run(bench_ranks *k, void *(*fn)(void *), void *run, char *err, size_t errlen) {
    bench_threads ts;
    bench_rank_arg args[ECHO_MAX_RANKS];
    for (int r = 0; r < k->nranks; r++)
        args[r] = (bench_rank_arg){run, r};
    if (bench_threads_start(&ts, k->nranks, fn, args, sizeof *args)) {
        snprintf(err, errlen, "could not start %d rank threads", k->nranks);
        return -1;
    }
    bench_threads_join(&ts);
    for (int r = 0; r < k->nranks; r++)
        if (k->rc[r]) {
            snprintf(err, errlen, "rank %d: %s", r, k->err[r]);
            return -1;
        }
    return 0;
}

void bench_ranks_close(bench_ranks *k) {
    for (int r = 0; r < k->nranks; r++) {
        echo_comm_destroy(k->c[r]);
        free(k->buf[r]);
    }
    echo_world_destroy(k->w);
    k->w = NULL;
    k->nranks = 0;
}
