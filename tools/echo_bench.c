/*
 * echo-bench: benchmarks, one subcommand each, each in its file of
 * tools/bench/ (bench.h lists them). The table `commands` is the whole
 * program: a row is a name, the subcommand's entry point and the line
 * `echo-bench --help` prints for it; add a row to add one.
 *
 * Exit codes: 0 ok, 1 runtime error, 2 usage error.
 */
#include <stdio.h>
#include <string.h>

#include "tools/bench/bench.h"

typedef struct bench_cmd {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name, as getopt expects */
    const char *help;
} bench_cmd;

static const bench_cmd commands[] = {
    {"allreduce", bench_allreduce_main, "all-reduce time, bandwidth, wire bits and error per size and algorithm"},
    {"chain", bench_chain_main, "accumulated error vs depth of chained all-reduces, int4 vs echo"},
    {"codec", bench_codec_main, "codec GB/s (encode, decode-accumulate) beside memcpy; error vs wire bits per group"},
    {"serve", bench_serve_main, "load generator for OpenAI-compatible servers (vllm bench serve)"},
    {"plot", bench_plot_main, "PNG plots: TTFT CDF of serve results, algbw vs size of allreduce --json"},
    {"randmodel", bench_randmodel_main, "a Qwen3 model folder (8B, 0.6B or tiny shape) with random bf16 weights"},
    {"forward", bench_forward_main, "engine prefill tok/s + TFLOP/s, decode tok/s vs roofline, TTFT"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: echo-bench <command> [options]   (echo-bench <command> --help)\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "echo-bench: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
