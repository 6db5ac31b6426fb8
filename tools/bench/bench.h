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
    int nranks, group, iters, json, seed;
    size_t min_bytes, max_bytes, policy;
    echo_preset modes[ECHO_PRESET_COUNT];
    int nmodes;
} bench_ar_opts;
int bench_allreduce_nccl(const bench_ar_opts *o);

/* ---- util.c: the comm/ benchmarks' helpers ---- */

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

/* --transport mpi: the options allreduce.c parsed; 0 ok, 1 error (also
 * without Open MPI at build time). */
typedef struct bench_ar_mpi_opts {
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
