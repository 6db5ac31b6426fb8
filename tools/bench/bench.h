/*
 * tools/bench: echo-bench's subcommands, one file each (echo_bench.c is
 * the table that dispatches to them).
 *
 *   echo-bench allreduce  all-reduce time, bandwidth, wire bits and error
 *                      per size and algorithm (allreduce.c; the nccl and mpi
 *                      transports: allreduce_nccl.c, allreduce_mpi.c)
 *   echo-bench chain   accumulated error of chained all-reduces (chain.c)
 *   echo-bench codec   codec GB/s beside memcpy, error vs wire bits (codec.c)
 *   echo-bench serve   load generator for an OpenAI-compatible server
 *                      (vllm bench serve's flags, summary and percentiles;
 *                      libcurl multi, streaming SSE parsed incrementally)
 *   echo-bench plot    PNG plots through gnuplot: TTFT CDF per serve result,
 *                      algbw vs message size per algo for allreduce --json
 *   echo-bench randmodel  a Qwen3 model folder of a real shape with random
 *                      bf16 weights (config.json, one model.safetensors)
 *   echo-bench forward the engine alone: prefill tokens/s and TFLOP/s,
 *                      decode tokens/s beside the copy-bandwidth roofline,
 *                      TTFT (docs/bench-forward.md)
 *
 * util.c: what allreduce, chain and codec share (inputs, parsing, threads).
 * Every entry point gets argv[0] = the subcommand name and its options after
 * it, as getopt expects (echo-bench's main drops only the program name).
 * Exit codes: 0 ok, 1 runtime error, 2 usage error. docs/ttft.md has the
 * experiment these tools serve.
 */
#ifndef ECHO_TOOLS_BENCH_H
#define ECHO_TOOLS_BENCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/echo.h"

int bench_allreduce_main(int argc, char **argv);
int bench_chain_main(int argc, char **argv);
int bench_codec_main(int argc, char **argv);
int bench_serve_main(int argc, char **argv);
int bench_plot_main(int argc, char **argv);
int bench_randmodel_main(int argc, char **argv);
int bench_forward_main(int argc, char **argv);

/* echo-bench allreduce --transport nccl (allreduce_nccl.c): the options
 * allreduce.c parsed. Prints the table (or --json rows); 0 ok, 1 error. */
typedef struct bench_ar_opts {
    const char *transport; /* the transport row's name */
    int nranks, group, iters, json, seed;
    size_t min_bytes, max_bytes, policy;
    echo_preset modes[ECHO_PRESET_COUNT];
    int nmodes;
} bench_ar_opts;
int bench_allreduce_nccl(const bench_ar_opts *o);

/* ---- util.c: what the subcommands share ---- */

/* A subcommand's usage error: "echo-bench CMD: " fmt (one %s, filled with
 * a) and "Try 'echo-bench CMD --help'." on stderr; returns 2, the exit
 * status. */
int bench_usage_error(const char *cmd, const char *fmt, const char *a);
/* Before a subcommand's getopt_long loop over its own argv (argv[0] its
 * name): start again at argv[1], with getopt's messages off (the loop
 * reports through bench_getopt_error; optstring starts with ':'). */
void bench_getopt_reset(void);
/* The usage error for what getopt_long returned outside the options:
 * ':' an option without its value, anything else an unknown option. */
int bench_getopt_error(const char *cmd, int c, char **argv);

/* The comm/ benchmarks' (allreduce, chain, codec) helpers: */

/* Monotonic seconds. */
double bench_now_s(void);

/* Inputs from a counter-based generator, so runs are reproducible:
 * Gaussian, or Gaussian with activation-like outlier channels (every 1024th
 * value x50 and another x20, like the massive features of LLM hidden
 * states). Value i of stream (seed, a, b); bench_fill writes x[0..n). */
typedef enum { BENCH_DIST_GAUSS = 0, BENCH_DIST_OUTLIER } bench_dist;
float bench_sample(bench_dist d, uint64_t seed, uint64_t a, uint64_t b, uint64_t i);
void bench_fill(bench_dist d, float *x, size_t n, uint64_t seed, uint64_t a, uint64_t b);
/* gauss|outlier; 0, or -1 on another word */
int bench_parse_dist(const char *s, bench_dist *out);
/* "1K", "256M", "1G", "4096": binary multiples. 0 on a malformed size. */
size_t bench_parse_size(const char *s);
/* The whole of s as an int in [lo, hi]: 0, else -1. */
int bench_parse_int(const char *s, int lo, int hi, int *out);
/* The flags allreduce, chain and codec share: --group G, --codec
 * NAME[-gG] (its -gG sets the group too), --seed S and, when dist is not
 * NULL, --dist gauss|outlier. 1 when a (its value v) is one of them, with
 * *bad set when the value is malformed; else 0. */
int bench_comm_flag(const char *a, const char *v, int *group, echo_codec_id *codec, int *seed, bench_dist *dist,
                    int *bad);
/* --codec applies to the presets that take a codec (echo, echo-nofb);
 * int4 is the paper's codec whatever --codec says. */
echo_codec_id bench_codec(echo_preset mode, echo_codec_id codec);

/* Threads that start all together or not at all. The benchmarks' threads
 * meet at barriers sized for all of them, so one that fails to start would
 * leave the others waiting forever. Each thread first waits at the set's
 * gate: bench_threads_start opens it only once every thread exists, and
 * otherwise tells the started ones to return. */
#define BENCH_THREADS_MAX 64 /* ECHO_MAX_RANKS, ECHO_BENCH_MAX_THREADS */
typedef struct bench_threads {
    pthread_t th[BENCH_THREADS_MAX];
    struct ts_slot {
        struct bench_threads *ts;
        void *(*fn)(void *);
        void *arg;
    } slot[BENCH_THREADS_MAX];
    atomic_int gate; /* 0: wait, 1: run, -1: return */
    int n;
} bench_threads;

/* fn(args + i * size) on n threads; 0, or -1 with none left running (then
 * bench_threads_join has nothing to wait for). */
int bench_threads_start(bench_threads *ts, int n, void *(*fn)(void *), void *args, size_t size);
void bench_threads_join(bench_threads *ts);

/* Ranks as threads over one local world, the harness of allreduce and
 * chain: rank r has its comm c[r] and a buffer buf[r] of count floats;
 * rc/err are what each rank's thread reports. */
typedef struct bench_ranks {
    echo_world *w;
    echo_comm *c[ECHO_MAX_RANKS];
    float *buf[ECHO_MAX_RANKS];
    int nranks;
    int rc[ECHO_MAX_RANKS];
    char err[ECHO_MAX_RANKS][256];
} bench_ranks;
/* What a rank's thread gets: the caller's run and its rank. */
typedef struct bench_rank_arg {
    void *run;
    int rank;
} bench_rank_arg;
/* k (zeroed by the caller) as the local world of cfg with nranks comms
 * and buffers; 0, or -1 with err. bench_ranks_close either way. */
int bench_ranks_open(bench_ranks *k, int nranks, const echo_config *cfg, size_t count, char *err, size_t errlen);
/* fn({run, r}) on every rank's thread, started all together, then joined;
 * 0, or -1 with err: the threads did not start, or the first rank that
 * failed ("rank R: ..."). */
int bench_ranks_run(bench_ranks *k, void *(*fn)(void *), void *run, char *err, size_t errlen);
void bench_ranks_close(bench_ranks *k);

/* ---- allreduce.c and allreduce_mpi.c ---- */

/* One row of the allreduce table. */
typedef struct bench_ar_row {
    size_t bytes;
    const char *algo;
    int ranks, group;
    double time_us, algbw, busbw, wire_bits, rel_err;
    const char *codec; /* what the preset ran (echo_world_get_config) */
    int feedback;
} bench_ar_row;

/* The row of one size and preset: t seconds a call, the error sums
 * num = sum (out - ref)^2 and den = sum ref^2, the wire bytes from c's
 * stats, what the world w ran (its codec, group, feedback). */
bench_ar_row bench_ar_row_make(echo_preset mode, int nranks, size_t count, double t, double num, double den,
                               echo_comm *c, echo_world *w);
/* The table's column line, and one row: a table line, or a JSON object
 * (",\n" before all but the first). */
void bench_ar_print_columns(void);
void bench_ar_print_row(const bench_ar_row *row, int json, int first);

/* --transport mpi: the options allreduce.c parsed; 0 ok, 1 error (also
 * without Open MPI at build time). */
typedef struct bench_ar_mpi_opts {
    const char *transport; /* the transport row's name */
    int group, iters, warmup, json, seed, nmodes;
    bench_dist dist;
    size_t minb, maxb, step, policy;
    const echo_preset *modes;
    echo_codec_id codec;
} bench_ar_mpi_opts;

int bench_allreduce_mpi(const bench_ar_mpi_opts *o);

/* Percentile of sorted x[0..n-1], p in [0, 100], by linear interpolation
 * between closest ranks (numpy.percentile's default, "linear"): position
 * (n-1)*p/100, value x[k] + (x[k+1]-x[k])*frac. n must be > 0. */
double bench_percentile(const double *sorted, size_t n, double p);

#endif
