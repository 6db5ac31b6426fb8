/*
 * engine/ — tensor-parallel execution of a model, one forward pass per step.
 *
 * Contract
 *   - An engine owns `tp` ranks. Each rank has its own backend instance, its
 *     shard of the weights (model/), its paged KV cache for its KV heads, and
 *     its comm/ endpoint; ranks synchronise only through comm/ (every
 *     row-parallel all-reduce, at the sites the model lays out:
 *     model_pass_sites). Ranks are threads of this process (tp = 1 runs on the caller's thread), or
 *     under mpirun one process each (eng_follow).
 *   - Sequences hold token positions in fixed-size KV blocks (block tables).
 *     eng_step() runs one forward pass over a batch whose items each append a
 *     prompt chunk or one decode token to a sequence, and returns logits for
 *     the items that ask. When the blocks needed are not free, eng_step()
 *     returns ENG_ENOSPACE and changes nothing (the scheduler queues).
 *   - Logits: the lm_head is split by vocabulary across ranks; the engine
 *     gathers the slices into full (vocab) fp32 rows on the host
 *     (eng_step), or, when sampling needs only the top candidates, each
 *     rank reduces its slice on its backend and only k (id, logit) pairs
 *     and a log-sum-exp per row and rank cross to the host
 *     (eng_step_cands). A step whose logits are not all finite fails
 *     (corrupt weights never turn into silently wrong tokens); a failed
 *     step leaves every sequence as it was.
 *   - Sampling (engine/sample.h) is host-side and reproducible per request
 *     seed.
 *   - One thread drives an engine at a time (the scheduler). Library code:
 *     returns status with a message in the caller's buffer and does not
 *     exit, but for one case: under mpirun a rank that fails on its own
 *     mid-step ends the job (echo_proc_abort, eng_follow below), since its
 *     peers wait in a collective nothing can interrupt.
 *
 * This header is the contract a caller needs at a glance: the config, an
 * engine's life, sequences and steps. Each further concern has its own
 * header, which a caller includes where it needs it (none is included
 * here): engine/sample.h (sampling, logprobs), engine/spec.h (speculative
 * decoding), engine/seq.h (prefix cache, truncation, KV usage),
 * engine/generate.h (one request, start to end), engine/chat.h (a model's
 * tokenizer and chat template), engine/report.h (what an engine runs and
 * has done: start-up reports, metrics, health), engine/budget.h (the
 * start-up arithmetic: GPU and KV budgets, the one-shot plan).
 */
#ifndef ECHO_ENGINE_H
#define ECHO_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "comm/echo.h"
#include "model/model.h"

#define ENG_ENOSPACE (-2) /* not enough free KV blocks (or sequence slots) */

/* A field added here goes into engine/config.c's list too (ENG_CONFIG_FIELDS:
 * how it reaches the processes of rank > 0 under mpirun);
 * tests/mpi/test_engine_cfg.c fails until it is there. */
typedef struct eng_config {
    const char *model_dir;
    const char *device; /* "cpu" (default) or "cuda" */
    int tp;             /* tensor-parallel ranks, default 1 */
    /* comm/ preset (echo_preset_config): exact, int4, echo, bf16 */
    echo_preset allreduce;
    /* ENG_ALLREDUCE_AUTO / _AUTO_ECHO3 (--allreduce auto, auto:echo3, the
     * programs' default): at tp > 1 on host memory the engine measures the
     * link and the codecs at start-up and picks the preset (into
     * `allreduce`), the size below which calls run exact, one-shot or not,
     * and the overlap's micro-batches (comm/'s echo_auto_pick; an explicit
     * oneshot / overlap wins); on device memory it runs `echo`.
     * eng_allreduce_auto reports it. 0 (what a zero-initialised config
     * gets): `allreduce` as given. */
    int allreduce_auto;
    size_t echo_min_bytes;
    int echo_group;       /* 0 = comm/ default */
    int threads;          /* total cpu threads, split across ranks; 0 = all */
    int kv_block_size;    /* tokens per KV block, default 16 */
    int max_model_len;    /* longest sequence, default min(max_position_embeddings, 4096) */
    int max_num_seqs;     /* concurrent sequences, default 8 */
    int max_batch_tokens; /* tokens per step, default max(max_model_len, 512) */
    int kv_blocks;        /* 0 = enough for max_num_seqs full sequences */
    /* What the KV cache stores (kernels.h): KERN_KV_NATIVE (0) = the
     * backend's act dtype (fp32 on cpu); the programs' auto is bf16. */
    kern_kv_dtype kv_dtype;
    /* The KV pool's memory per rank, in bytes: kv_blocks (when 0) becomes
     * the fewer of what fits in it and max_num_seqs full sequences, and a
     * max_model_len that does not fit is a start-up error. 0: no budget
     * (max_num_seqs full sequences). ENG_KV_MEMORY_AUTO: on a host backend
     * ENG_KV_AUTO_PERCENT % of MemAvailable when eng_create runs, split over
     * the tp ranks (threads share the host; mpirun processes are counted as
     * if on one host too); on a GPU backend eng_gpu_kv_budget of
     * gpu_memory_utilization. eng_get_config reports the bytes, and in
     * kv_mem_available the MemAvailable read (host) or in kv_gpu the
     * figures the GPU budget came from. */
    size_t kv_cache_memory;
    size_t kv_mem_available;
    /* The fraction of each GPU's memory echo may use (vLLM's
     * --gpu-memory-utilization), for kv_cache_memory auto on a GPU backend:
     * 0 = ENG_GPU_UTIL_DEFAULT. */
    double gpu_memory_utilization;
    struct {
        size_t total, free;          /* cudaMemGetInfo at start (the smallest GPU used) */
        size_t weights, activations; /* per rank, estimated from the config */
        int ranks_per_gpu;
    } kv_gpu;
    /* All-reduce transport when tp > 1: "auto" (default), "local",
     * "nccl" or "mpi" (ranks as processes under mpirun, which auto picks
     * there; see eng_follow). cpu: local (threads over host memory) only. cuda: nccl puts
     * rank i on GPU i (needs tp GPUs); local puts every rank on GPU 0 and
     * exchanges through its memory (tests on one GPU); auto = nccl when
     * there are tp GPUs, else local. */
    const char *transport; /* "auto" or a row of comm/echo.h's transport table */
    /* 1: decode steps through CUDA graphs (engine/step.h): a decode-only
     * step on cuda is recorded once per batch size and replayed
     * afterwards, with the same logits bits as an eager step. 0 (default):
     * off. At tp > 1 only with the nccl transport (its deferred
     * all-reduces are captured with the step); no effect on cpu or with the
     * local transport at tp > 1 (it meets the peers on the host at every
     * call); eng_graphs_note says why. */
    int cuda_graphs;
    /* Fused decode weights (model_load_opts.fuse_weights): ENG_FUSE_AUTO
     * (0, what a zero-initialised config gets) = on for device backends
     * (device != "cpu"), where a batch-1 decode step is bound by streaming
     * the weights, off on cpu; ENG_FUSE_ON / ENG_FUSE_OFF force it (tests
     * run the fused path on cpu). eng_get_config reports ON or OFF. */
    int fuse_weights;
    /* ENG_QUANT_Q8_0: F32/F16/BF16 matrices are quantized to Q8_0 at load
     * on backends that keep quantized weights (cpu; model_load_opts.quantize),
     * not with fused weights. ENG_QUANT_NONE (0): stored dtypes. */
    int quantize;
    /* ENG_ACT_Q8: the quantized matrices (a GGUF's Q8_0, Q4_0, Q4_1, Q5_0,
     * Q5_1, Q4_K, Q5_K, Q6_K; --quantize's Q8_0) multiply activations quantized to 8 bits
     * per 32-block, in integers (model_load_opts.act_q8; cpu): llama.cpp's
     * numerics, faster; refused when there is none. ENG_ACT_AUTO: the same
     * on a GGUF's quantized matrices (not --quantize's), nothing where there
     * are none (the programs' default). ENG_ACT_NONE (0): the bits of the dequantized weights. */
    int act_quant;
    echo_codec_id echo_codec; /* codec of the int4/echo all-reduce; 0 = comm/ default (ECHO_DEFAULT_CODEC) */
    /* 1: no automatic prefix cache (eng_seq_new_prefix then maps nothing
     * and registers nothing). 0 (default): on. */
    int no_prefix_cache;
    /* Prompt tokens per pass, C, when the all-reduce's bits depend on the
     * layout of its messages (eng_pass_tokens): 0 = ENG_PASS_TOKENS, at
     * most max_batch_tokens. */
    int pass_tokens;
    /* Prefill overlap at tp > 1 on host memory (engine/overlap.h): a step
     * of at least 2 x 64 tokens runs as micro-batches whose all-reduces run
     * on a communication thread while the next micro-batch computes.
     * 0 (ENG_OVERLAP_AUTO): 2 micro-batches when ranks are processes
     * (mpirun: the link is a network), off for ranks as threads; -1: off;
     * N >= 1: up to N micro-batches (1: off). Exact and bf16 logits are
     * the serial pass's bits. eng_overlap_k says what an engine runs. */
    int overlap;
    int overlap_min_rows; /* tokens per micro-batch at least (0: 64); tests set a few */
    /* The one-shot all-reduce (echo_config.oneshot_bytes) of calls of at
     * most this many bytes of fp32: one network step per call instead of
     * the two-shot's two or three. 0 (ENG_ONESHOT_AUTO): ENG_ONESHOT_AUTO_BYTES
     * when ranks are processes on host memory (mpirun: each call is a
     * network round trip; a batch-1 decode's calls are a few KB), off for
     * ranks as threads and on device memory; -1 (ENG_ONESHOT_OFF): off;
     * N > 0: N bytes. Exact's bits do not change (the same rank-order sum);
     * a 4-bit codec's do (each rank codes its whole message, no second
     * coding of the sum). $ECHO_ONESHOT_BYTES, when set, overrides it.
     * eng_oneshot_bytes says what an engine runs. */
    long oneshot;
    /* --rope-scaling (model_config_rope_override): replaces the config's
     * rope scaling, e.g. "yarn:4" for Qwen3 past 32K; NULL: the config's. */
    const char *rope_scaling;
} eng_config;

#define ENG_ALLREDUCE_FIXED 0
#define ENG_ALLREDUCE_AUTO 1
#define ENG_ALLREDUCE_AUTO_ECHO3 2 /* echo3 a candidate too */

#define ENG_ONESHOT_AUTO 0
#define ENG_ONESHOT_OFF (-1)
#define ENG_ONESHOT_AUTO_BYTES 8192 /* hidden 2048 in fp32: every batch-1 decode call up to that width */

/* Passes under a layout-dependent all-reduce (every preset at tp > 1 but
 * exact on cpu threads). A lossy or bf16 all-reduce's result for a value
 * depends on the whole message it travels in: the codec's groups run over
 * the flattened (tokens x hidden) message, so a group can hold two tokens'
 * values, and the rank that owns a shard adds its own part unrounded, so
 * which rank that is (set by the message length) changes the bits; with
 * error feedback the pass's earlier calls feed in as well. One pass is
 * therefore one answer: eng_step runs a step as passes fixed by the
 * tokens' positions alone, so that every program that feeds a prompt
 * through the engine gets the same logits bits:
 *   - a prompt's tokens run in passes of their own, cut at the positions
 *     that are multiples of C (tokens 0..C-1, C..2C-1, ...), whatever
 *     chunks the caller hands in;
 *   - one-token items at a position that is not a multiple of C (decode
 *     steps) share one pass, run first; their bits depend on that batch.
 * Callers that chunk a prompt cut it with eng_prompt_chunk. docs/accuracy.md
 * ("One answer per path") has the measurement. */
#define ENG_PASS_TOKENS 512

#define ENG_QUANT_NONE 0
#define ENG_QUANT_Q8_0 1

#define ENG_ACT_NONE 0
#define ENG_ACT_Q8 1
#define ENG_ACT_AUTO 2
#define ENG_ACT_Q8_0_ONLY 3 /* ENG_ACT_Q8 on Q8_0 matrices alone (the earlier --act-quant q8_0; tests) */

#define ENG_FUSE_AUTO 0
#define ENG_FUSE_ON 1
#define ENG_FUSE_OFF (-1)

typedef struct eng eng;

#define ENG_KV_MEMORY_AUTO ((size_t)-1)
#define ENG_KV_AUTO_PERCENT 50
#define ENG_GPU_UTIL_DEFAULT 0.9

int eng_create(const eng_config *cfg, eng **out, char *err, size_t errlen);

/* Ranks as processes (mpirun -np tp; comm/'s echo_proc_init started the
 * session): eng_create on the process of rank 0 makes the engine on every
 * process (one rank each, the mpi transport; tp must equal the process
 * count), eng_step there runs each step on all of them, eng_destroy ends
 * theirs. The processes of rank > 0 call eng_follow instead, which serves
 * rank 0's engines until rank 0 calls eng_procs_exit (0) or a control
 * message fails, e.g. rank 0 died (-1 with a message). A rank that fails
 * on its own mid-step ends the job (echo_proc_abort): its peers wait in a
 * collective no message can interrupt. Without mpirun none of this
 * applies: eng_create makes threads, as always. */
int eng_follow(char *err, size_t errlen);
void eng_procs_exit(void);

void eng_destroy(eng *e);

const model_config *eng_model_config(const eng *e);
/* The effective configuration (defaults filled in). */
const eng_config *eng_get_config(const eng *e);
/* 0 when every later step will fail: the all-reduce world is dead (on nccl,
 * re-creating the communicators after an abort failed), with the reason in
 * `why`; destroy the engine and create it again. 1 otherwise. For a server
 * to report (its health check), after a failed step. */
int eng_usable(const eng *e, char *why, size_t len);

/* Tokens of a prompt chunk starting at position `pos` with `left` prompt
 * tokens to go and at most `budget` allowed: min(left, budget), cut back to
 * a multiple of C when it would end short of the prompt (0 when no
 * multiple is in reach: wait for a larger budget). */
int eng_prompt_chunk(const eng *e, int pos, int left, int budget);

/* Sequences. Ids are small integers, reused after free. */
int eng_seq_new(eng *e, int *seq, char *err, size_t errlen); /* ENG_ENOSPACE if max_num_seqs are live */
void eng_seq_free(eng *e, int seq);                           /* releases its KV blocks */
int eng_seq_len(const eng *e, int seq);                       /* tokens in the cache */

/* ENG_LOGITS_VERIFY: speculative verification (docs/speculative.md): the
 * item is one decode token with a draft behind it, and every row comes
 * back (as ALL). It is a decode: when passes are cut by position
 * (eng_pass_tokens) it runs whole in the decode pass, like a one-token
 * decode. The caller then drops the rejected tail with eng_seq_truncate. */
typedef enum eng_logits { ENG_LOGITS_NONE = 0, ENG_LOGITS_LAST, ENG_LOGITS_ALL, ENG_LOGITS_VERIFY } eng_logits;

typedef struct eng_item {
    int seq;
    const int32_t *tokens; /* appended at positions len .. len+n_tokens-1 */
    int n_tokens;
    eng_logits logits;
} eng_item;

/* One forward pass (several when eng_pass_tokens says so: the batch limit
 * max_batch_tokens then holds per pass). `logits` receives, in item order,
 * 1 row (LAST) or n_tokens rows (ALL) of vocab_size floats per item asking
 * for them. Errors: ENG_ENOSPACE (nothing changed), or -1 with a message
 * (nothing changed either: passes that ran are rolled back). */
int eng_step(eng *e, const eng_item *items, int n_items, float *logits, char *err, size_t errlen);

/* ---- candidates instead of full rows ---- */

/* What sampling and logprobs need of one logits row: its k largest logits,
 * descending (ties by ascending id), and the log-sum-exp of the WHOLE row,
 * so any candidate's logprob is val - lse. */
typedef struct eng_cands {
    int k; /* min(requested k, vocab_size) */
    int32_t ids[KERN_TOPK_MAX];
    float vals[KERN_TOPK_MAX];
    double lse; /* the ranks' fp32 slice lse merged in double */
} eng_cands;

/* One forward pass like eng_step, but per logits row (same order) only its
 * candidates come back: each rank's backend reduces its vocabulary slice
 * with logits_topk (1 <= k <= KERN_TOPK_MAX), and the engine merges the
 * ranks' lists and log-sum-exps. `full` (optional, per item): nonzero items
 * ALSO get their rows whole in `logits` (vocab floats each, packed in row
 * order over the flagged items only), for requests whose sampling needs the
 * full row; `logits` may be NULL when nothing is flagged. Same validation,
 * ENG_ENOSPACE, non-finite failure and rollback as eng_step. */
int eng_step_cands(eng *e, const eng_item *items, int n_items, int k, eng_cands *cands, const unsigned char *full,
                   float *logits, char *err, size_t errlen);

#endif
