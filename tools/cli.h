/*
 * tools/cli — flag parsing shared by the programs in tools/. Only programs
 * may exit, so the exiting helpers live here and never in a module: a usage
 * error prints "PROG: message" and "Try 'PROG --help'." and exits with 2.
 */
#ifndef ECHO_TOOLS_CLI_H
#define ECHO_TOOLS_CLI_H

#include <stddef.h>

#include "comm/echo.h"
#include "engine/engine.h"
#include "engine/spec.h"
#include "kernels/kernels.h"

/* fmt has one %s, filled with arg. */
_Noreturn void cli_usage_error(const char *prog, const char *fmt, const char *arg);
/* The whole of s as an integer / number in [lo, hi], or a usage error that
 * names the flag and the range. */
long cli_long(const char *prog, const char *s, const char *flag, long lo, long hi);
double cli_double(const char *prog, const char *s, const char *flag, double lo, double hi);
/* Non-exiting forms for subcommands that report errors themselves: 0 when
 * the whole of s parses and lies in [lo, hi]. NaN is never in range. */
int cli_parse_long(const char *s, long lo, long hi, long *out);
int cli_parse_double(const char *s, double lo, double hi, double *out);
/* s when it is one of the NULL-terminated choices, or a usage error that
 * names the flag and lists them ("--transport expects auto, local or nccl,
 * got 'x'"). */
const char *cli_choice(const char *prog, const char *s, const char *flag, const char *const *choices);
/* The choices of --transport and --device, NULL-terminated: "auto", then
 * the names of the transport table (comm/echo.h) / backend table
 * (kernels/kernels.h). */
const char *const *cli_transports(void);
const char *const *cli_devices(void);
/* --help: usage, then the choices read from the tables (presets and codecs
 * from comm/'s, transports from its transport table, devices from the
 * backend table), so a new row shows up in every program's --help. */
void cli_help(const char *usage);
/* --echo-codec NAME[-gG]: the codec id (an echo_codec_id), and *group = G
 * when one is named (else unchanged); a usage error otherwise. */
int cli_echo_codec(const char *prog, const char *s, int *group);
/* --allreduce: "auto", "auto:echo3" (returns ENG_ALLREDUCE_AUTO / _AUTO_ECHO3,
 * *p untouched) or a preset (returns ENG_ALLREDUCE_FIXED); else a usage error. */
int cli_allreduce(const char *prog, const char *s, echo_preset *p);
/* The all-reduce an engine chose (--allreduce auto) as a JSON object:
 * the choice and the measured figures; NULL when it chose nothing. */
struct json_t;
struct eng;
struct json_t *cli_allreduce_auto_json(const struct eng *e);
/* --overlap auto|off|N: eng_config.overlap (0 auto, -1 off, N in 1..8). */
int cli_overlap(const char *prog, const char *s);
/* --oneshot auto|off|BYTES: eng_config.oneshot (0 auto, -1 off, BYTES in 1..1 GiB). */
long cli_oneshot(const char *prog, const char *s);
/* --act-quant auto|none|q8_0: ENG_ACT_AUTO, ENG_ACT_NONE or ENG_ACT_Q8;
 * a usage error otherwise. cli_parse_act_quant: the non-exiting form (0,
 * or -1 leaving *out). */
int cli_act_quant(const char *prog, const char *s);
int cli_parse_act_quant(const char *s, int *out);
/* --kv-cache-dtype auto|fp32|bf16|fp16|q8_0: the type (auto: bf16); a
 * usage error otherwise. cli_parse_kv_dtype: the non-exiting form. */
kern_kv_dtype cli_kv_dtype(const char *prog, const char *s);
int cli_parse_kv_dtype(const char *s, kern_kv_dtype *out);
/* --kv-cache-memory BYTES|auto: bytes (a number with an optional k, m or g
 * suffix, powers of 1024), or ENG_KV_MEMORY_AUTO; a usage error otherwise.
 * cli_parse_kv_memory: the non-exiting form. */
size_t cli_kv_memory(const char *prog, const char *s);
/* --gpu-memory-utilization F: a fraction in (0, 1], or a usage error. */
double cli_gpu_util(const char *prog, const char *s);
int cli_parse_kv_memory(const char *s, size_t *out);
/* The --help lines of both flags (each program's usage includes them). */
#define CLI_KV_HELP                                                                                                   \
    "  --kv-cache-dtype auto|fp32|bf16|fp16|q8_0  what the KV cache stores (default auto: bf16; fp32:\n"              \
    "                               the exact path the oracle tests use; q8_0: 8-bit blocks, keys\n"                  \
    "                               Walsh-Hadamard rotated; cpu and cuda).\n"                                        \
    "                               docs/kv-cache.md\n"                                                              \
    "  --kv-cache-memory BYTES|auto KV pool per rank (k/m/g suffixes): the pool is what fits, at most\n"          \
    "                               max-num-seqs full sequences; auto (default): 50% of MemAvailable at\n"       \
    "                               start split over the tp ranks (cpu); on a GPU what\n"                          \
    "                               --gpu-memory-utilization leaves\n"                                            \
    "  --gpu-memory-utilization F   fraction of each GPU's memory echo may use (default 0.9, as vLLM):\n"       \
    "                               with --kv-cache-memory auto the KV pool gets F x total memory less\n"       \
    "                               what is in use at start, the weights and the activations\n"


/* Speculative decoding flags, shared by echo-generate and echo-serve:
 * cli_spec_flag handles --speculative none|ngram, --spec-ngram-min N,
 * --spec-ngram-max N and --spec-draft-max N (returns 1 when `flag`, without
 * its dashes, was one of them; a usage error for a bad value);
 * cli_spec_finish checks the combination (min <= max) and turns draft_max
 * off for none. Defaults: CLI_SPEC_INIT (none, 2..4, 8). */
typedef struct cli_spec {
    int on; /* --speculative ngram */
    eng_spec_params p;
    int max_batch; /* --spec-max-batch (echo-serve) */
} cli_spec;
/* Drafts pay while a step's rows do not already share the weights: measured
 * gains at 1 and 4 clients, a loss at 16 (docs/speculative.md). */
#define CLI_SPEC_MAX_BATCH 4
#define CLI_SPEC_INIT {0, {ENG_SPEC_NGRAM_MIN, ENG_SPEC_NGRAM_MAX, ENG_SPEC_DRAFT_MAX}, CLI_SPEC_MAX_BATCH}
#define CLI_SPEC_HELP                                                                                              \
    "  --speculative none|ngram speculative decoding: ngram drafts up to --spec-draft-max tokens per step\n"     \
    "                         by prompt lookup (the latest earlier occurrence of the last n tokens in\n"        \
    "                         prompt + output) and verifies them in the decode step; the sampling\n"           \
    "                         distribution is unchanged, greedy tokens too where rows do not depend on the\n"  \
    "                         batch (exact on threads; docs/speculative.md). Default none\n"                    \
    "  --spec-ngram-min N     smallest n-gram matched, 1..16 (default 2)\n"                                     \
    "  --spec-ngram-max N     largest n-gram matched (tried first), 1..16 (default 4)\n"                        \
    "  --spec-draft-max N     draft tokens per step at most, 1..64 (default 8)\n"
#define CLI_SPEC_SERVE_HELP                                                                                        \
    "  --spec-max-batch N     draft only while at most N requests decode in a step; above it every\n"          \
    "                         decode is plain (its rows already share the weights), 0 = always (default 4)\n"
int cli_spec_flag(const char *prog, const char *flag, const char *arg, cli_spec *sp);
void cli_spec_finish(const char *prog, cli_spec *sp);

/* --rope-scaling SPEC (model_config_rope_override): s, or a usage error
 * naming the flag when its syntax or values are refused. */
const char *cli_rope_scaling(const char *prog, const char *s);

/* Ranks as processes: under mpirun with more than one process, the
 * processes of rank > 0 serve rank 0's engines here (eng_follow) and exit;
 * rank 0 returns and runs the program, and its peers are released when it
 * exits. Without mpirun it does nothing. Call first thing in main. */
void cli_procs_start(const char *prog);

#endif
