/*
 * tools/bench: echo-bench subcommands that are not comm/ micro-benchmarks.
 *
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
 *   echo-bench allreduce --transport nccl  Echo vs NCCL's bf16 all-reduce on
 *                      GPUs (allreduce_nccl.c; the local transport's table
 *                      is in echo_bench.c)
 *
 * Every entry point gets argv[0] = the subcommand name and its options after
 * it, as getopt expects (echo-bench's main drops only the program name).
 * Exit codes: 0 ok, 1 runtime error, 2 usage error. docs/ttft.md has the
 * experiment these tools serve.
 */
#ifndef ECHO_TOOLS_BENCH_H
#define ECHO_TOOLS_BENCH_H

#include <stddef.h>

#include "comm/echo.h"

int bench_serve_main(int argc, char **argv);
int bench_plot_main(int argc, char **argv);
int bench_randmodel_main(int argc, char **argv);
int bench_forward_main(int argc, char **argv);

/* echo-bench allreduce --transport nccl (allreduce_nccl.c): the options
 * echo_bench.c parsed. Prints the table (or --json rows); 0 ok, 1 error. */
typedef struct bench_ar_opts {
    int nranks, group, iters, json, seed;
    size_t min_bytes, max_bytes, policy;
    echo_preset modes[ECHO_PRESET_COUNT];
    int nmodes;
} bench_ar_opts;
int bench_allreduce_nccl(const bench_ar_opts *o);

/* Percentile of sorted x[0..n-1], p in [0, 100], by linear interpolation
 * between closest ranks (numpy.percentile's default, "linear"): position
 * (n-1)*p/100, value x[k] + (x[k+1]-x[k])*frac. n must be > 0. */
double bench_percentile(const double *sorted, size_t n, double p);

#endif
