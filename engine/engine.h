/*
 * engine/ — tensor-parallel execution of a model, one forward pass per step.
 *
 * Contract
 *   - An engine owns `tp` ranks. Each rank has its own backend instance, its
 *     shard of the weights (model/), its paged KV cache for its KV heads, and
 *     its comm/ endpoint; ranks synchronise only through comm/ (every
 *     row-parallel all-reduce, site = 2*layer + {0 attention, 1 MLP}). Ranks
 *     are threads of this process (tp = 1 runs on the caller's thread), or
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
 *   - Sampling (eng_sample) is host-side and reproducible per request seed.
 *   - One thread drives an engine at a time (the scheduler). Library code:
 *     returns status with a message in the caller's buffer and does not
 *     exit, but for one case: under mpirun a rank that fails on its own
 *     mid-step ends the job (echo_proc_abort, eng_follow below), since its
 *     peers wait in a collective nothing can interrupt.
 */
#ifndef ECHO_ENGINE_H
#define ECHO_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "comm/echo.h"
#include "model/model.h"

#define ENG_ENOSPACE (-2) /* not enough free KV blocks (or sequence slots) */
#define ENG_MAX_TOP_LOGPROBS 64

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
/* --gpu-memory-utilization's KV budget per rank, in bytes: of util x total
 * (one GPU's memory), what is left after the memory already in use when
 * echo starts (total - free: other processes, the CUDA context) and, for
 * each of the ranks_per_gpu ranks on it, its weights and activations,
 * shared by those ranks. 0 when nothing is left (or util is out of (0, 1]). */
size_t eng_gpu_kv_budget(double util, size_t total, size_t free_bytes, size_t weights, size_t activations,
                         int ranks_per_gpu);
/* What one rank holds on a GPU for model mc under c (bf16 weights: its
 * share of every matrix, the embedding whole) and an estimate of its
 * activations and workspace at max_batch_tokens (fp32, conservative). */
size_t eng_gpu_weight_bytes(const eng_config *c, const model_config *mc);
size_t eng_gpu_activation_bytes(const eng_config *c, const model_config *mc);
/* Bytes of KV one block of a rank holds (all layers, keys and values) for
 * this config (kv_dtype resolved by device: fp32 on a host backend, bf16
 * on a GPU) and model: the unit of kv_cache_memory. */
size_t eng_kv_block_bytes(const eng_config *c, const model_config *mc);

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
/* A model's tokenizer: `model_path`'s tokenizer.json / tokenizer.model
 * (tok_load_dir), or a GGUF file's tokenizer.ggml.* metadata. With `chat`
 * non-NULL it also receives the model's Jinja chat template
 * (tokenizer_config.json "chat_template", or the GGUF's
 * tokenizer.chat_template; NULL when the model has none) and the BOS/EOS
 * token texts templates refer to ("" when unknown), and the template
 * compiled once for every eng_chat_render (a template the interpreter
 * cannot compile is no load error: compiled stays NULL and compile_err says
 * why, which each render reports); free with eng_chat_template_free.
 * Returns 0, ENG_TOK_MISSING when a folder has no tokenizer files, or -1
 * with a message. */
#define ENG_TOK_MISSING (-2)
typedef struct tok_tokenizer tok_tokenizer;
typedef struct tok_template tok_template;
typedef struct eng_chat_template {
    char *source;
    char *bos_token, *eos_token;
    tok_template *compiled; /* source's; NULL: not compiled (compile_err) or no source */
    char *compile_err;      /* why source does not compile; NULL when it does */
} eng_chat_template;
int eng_tokenizer_load(const char *model_path, tok_tokenizer **tok, eng_chat_template *chat, char *err,
                       size_t errlen);
void eng_chat_template_free(eng_chat_template *chat);
/* The built-in template (Qwen3's, tok_chat_builtin_source), compiled, for
 * models that ship none; no BOS/EOS texts (""). 0, or -1 with a message. */
int eng_chat_template_builtin(eng_chat_template *chat, char *err, size_t errlen);
/* Render chat's template (compiled at load; a hand-made chat with only a
 * source is compiled per call) with `context_json`, a JSON object of the template's
 * variables (messages, add_generation_prompt, chat_template_kwargs...):
 * bos_token / eos_token are added when absent, as transformers does.
 * *out is malloc'ed. -1 with a message: no template, a construct the
 * interpreter does not support, or the template's own raise_exception. */
int eng_chat_render(const eng_chat_template *chat, const char *context_json, char **out, size_t *out_len,
                    char *err, size_t errlen);

void eng_destroy(eng *e);

const model_config *eng_model_config(const eng *e);
/* The effective configuration (defaults filled in). */
const eng_config *eng_get_config(const eng *e);
/* 1 with the figures and the choice when the engine chose its all-reduce
 * (eng_config.allreduce_auto at tp > 1 on host memory: `allreduce` then
 * holds the preset it chose), else 0. */
int eng_allreduce_auto(const eng *e, echo_auto_figures *f, echo_auto_choice *c);
/* NULL when cfg.cuda_graphs is off or takes effect; else a sentence saying
 * why it has no effect (device not cuda, local transport at tp > 1), for
 * tools to print. */
const char *eng_graphs_note(const eng *e);
/* Steps rank 0 ran through a CUDA graph so far (0 when graphs are off or
 * unavailable). */
long eng_graph_steps(const eng *e);
/* Failed steps (tp > 1) that aborted the all-reduce world and re-armed it
 * (echo_world_clear_abort; on nccl that re-creates the communicators, about
 * seconds). A non-finite all-reduce, which every rank reports alike, fails
 * its step without an abort and is not counted. */
long eng_comm_resets(const eng *e);
/* 0 when every later step will fail: the all-reduce world is dead (on nccl,
 * re-creating the communicators after an abort failed), with the reason in
 * `why`; destroy the engine and create it again. 1 otherwise. For a server
 * to report (its health check), after a failed step. */
int eng_usable(const eng *e, char *why, size_t len);
/* Ranks as processes: 0 with the reason once a peer process on this host
 * has exited (a step then waits on it until mpirun ends the job), else 1.
 * Thread-safe and cheap: for a health check while a step may be blocked. */
int eng_ranks_alive(const eng *e, char *why, size_t len);

/* C (eng_config.pass_tokens) when steps run in the passes above, else 0
 * (exact on cpu threads, tp 1: one pass per step, whatever the batch). */
int eng_pass_tokens(const eng *e);
/* The most micro-batches a prefill step runs (eng_config.overlap resolved;
 * 1: overlap off); a step of n tokens runs min(that, n / 64), at least 1
 * (64: eng_config.overlap_min_rows). */
int eng_overlap_k(const eng *e);

/* eng_config.oneshot resolved: the threshold in bytes (0: off) for ranks
 * as processes or threads, on host memory or not. */
size_t eng_oneshot_plan(long oneshot, int tp, int procs, int host_memory);
/* What an engine's all-reduce runs one-shot: calls of at most this many
 * bytes of fp32 (0: none; the environment override and the preset
 * included: bf16 keeps two-shot). */
size_t eng_oneshot_bytes(const eng *e);
/* Tokens of a prompt chunk starting at position `pos` with `left` prompt
 * tokens to go and at most `budget` allowed: min(left, budget), cut back to
 * a multiple of C when it would end short of the prompt (0 when no
 * multiple is in reach: wait for a larger budget). */
int eng_prompt_chunk(const eng *e, int pos, int left, int budget);

/* Sequences. Ids are small integers, reused after free. */
int eng_seq_new(eng *e, int *seq, char *err, size_t errlen); /* ENG_ENOSPACE if max_num_seqs are live */
void eng_seq_free(eng *e, int seq);                           /* releases its KV blocks */
int eng_seq_len(const eng *e, int seq);                       /* tokens in the cache */
int eng_seq_blocks(const eng *e, int seq);                    /* KV blocks it holds (shared ones included) */
/* Forget the tokens of `seq` from position `len` on (a rejected draft):
 * its length becomes len and the blocks past ceil(len / block) return to
 * the pool; what they held is never read. len must lie between the end of
 * the sequence's registered prompt blocks and its length (-1 otherwise,
 * nothing changes): a cached block is never given up this way. */
int eng_seq_truncate(eng *e, int seq, int len);

/* ---- automatic prefix cache ----
 * Rank 0's bookkeeping: the block ids it maps are those every rank's block
 * table names, so at any tp, as threads or processes, every rank reuses the
 * same blocks. A full KV block of prompt is registered in the cache once a
 * step has computed it, keyed by its token ids and its parent block's
 * (chained back to the first block); only prompt blocks (a prefill wrote
 * them), never decoded ones. Blocks are reference-counted; a cached block
 * no sequence holds stays until a step needs its memory (eng_kv_usage
 * counts it free) and is then evicted, least recently released first, a
 * sequence's last block before its first.
 * With --allreduce exact a chunk computed on top of cached blocks gives the
 * bits of one pass over the whole prompt (rows are computed independently
 * of the batch), so logits equal those without the cache; with a lossy
 * all-reduce (int4, echo) the cached KV is what an earlier pass computed,
 * close but not bit-equal (docs/accuracy.md). */

/* eng_seq_new for a sequence that will start with prompt[0..n): maps the
 * longest chain of cached full blocks that the prompt begins with, at most
 * (n - 1) / kv_block_size blocks, so at least one prompt token is left to
 * compute and it lands in a fresh block (a shared block is never written),
 * and at most max_reuse tokens (-1: no cap; 0: map nothing, e.g. prompt
 * logprobs needed from the start). *reused gets the tokens mapped (the
 * sequence's length): step prompt + *reused onward. The prompt's full
 * blocks are registered as steps complete them. ENG_ENOSPACE as
 * eng_seq_new. */
int eng_seq_new_prefix(eng *e, const int32_t *prompt, int n, int max_reuse, int *seq, int *reused, char *err,
                       size_t errlen);
/* The tokens eng_seq_new_prefix would map now, changing nothing;
 * *evictable (optional) gets how many of those blocks no sequence holds
 * (mapping them takes them out of the free count). */
int eng_prefix_peek(const eng *e, const int32_t *prompt, int n, int max_reuse, int *evictable);

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
/* Same, also copying rank 0's residual stream after every layer into
 * layer_states (num_layers, total tokens of the step, hidden). */
int eng_step_states(eng *e, const eng_item *items, int n_items, float *logits, float *layer_states, char *err,
                    size_t errlen);

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

typedef struct eng_kv_usage {
    int total_blocks, block_size;
    int free_blocks;      /* a step can take them: free, plus cached blocks no sequence holds */
    int prefix_cache;     /* 1: the prefix cache is on */
    int cached_blocks;    /* in the prefix cache, held or not */
    int evictable_blocks; /* cached, held by no sequence (part of free_blocks) */
    int used_blocks;      /* holding data: held by a sequence or cached */
    int touched_blocks;   /* ever handed out (their pages were written: memory the process holds) */
    size_t block_bytes;   /* KV bytes of one block on one rank (eng_kv_block_bytes) */
    /* since creation: eng_seq_new_prefix calls that looked the cache up,
     * their prompt tokens, the tokens they mapped, blocks evicted */
    long long prefix_queries, prefix_query_tokens, prefix_hit_tokens, evicted_blocks;
} eng_kv_usage;
void eng_kv_get_usage(const eng *e, eng_kv_usage *u);

/* Memory one rank holds: its weight slices, its KV cache, its all-reduce
 * residual slots (start-up report). */
typedef struct eng_rank_info {
    size_t weight_bytes, kv_bytes, slot_bytes;
    size_t embed_bytes; /* the embedding table's share of weight_bytes (a decode step reads a few rows of it) */
    int act_q8_matrices; /* matrices multiplied against 8-bit activations (eng_config.act_quant) */
} eng_rank_info;
void eng_get_rank_info(const eng *e, int rank, eng_rank_info *out);

/* What the all-reduce runs (the world's configuration, defaults, the tail
 * policy and $ECHO_TAIL resolved; echo_config_bits, echo_config_describe
 * say it for logs): -1 with *out zeroed at tp 1. */
int eng_allreduce_config(const eng *e, echo_config *out);

/* Sum of all ranks' all-reduce statistics. */
void eng_comm_stats(const eng *e, echo_stats *out);

/* ---- sampling ---- */

typedef struct eng_sampling {
    float temperature; /* 0 = greedy (argmax; lowest id wins a tie) */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off; (0, 1] */
    uint64_t seed;
} eng_sampling;

/* Seeded generator state for one request. */
typedef struct eng_rng {
    uint64_t s;
} eng_rng;
void eng_rng_seed(eng_rng *r, uint64_t seed);

/* Pick a token from full-vocabulary logits. */
int32_t eng_sample(const float *logits, int vocab, const eng_sampling *p, eng_rng *rng);
/* Candidates per row that a request needs (for eng_step_cands), or 0 when
 * it needs the full row: greedy (temperature 0 or top_k 1) or
 * 1 <= top_k <= KERN_TOPK_MAX, and top_logprobs <= KERN_TOPK_MAX; a
 * vocabulary of at most KERN_TOPK_MAX always fits (every id is a
 * candidate). With that many candidates eng_sample_cands picks the token
 * eng_sample picks on the full row (same seed, same generator state) and
 * the top_logprobs are the first candidates. */
int eng_cands_needed(const eng_sampling *p, int top_logprobs, int vocab);
/* eng_sample over a row's candidates (vocab: the full vocabulary size).
 * Exact when c->k >= eng_cands_needed(p, 0, vocab); with fewer it samples
 * among the candidates only. Both paths share one routine. */
int32_t eng_sample_cands(const eng_cands *c, int vocab, const eng_sampling *p, eng_rng *rng);
/* Natural-log probability of `id` under the row's full distribution
 * (val - lse), or NAN when id is not a candidate. */
double eng_cands_logprob(const eng_cands *c, int32_t id);

/* ---- speculative decoding (docs/speculative.md) ---- */

/* Prompt-lookup drafting: n-gram sizes ngram_min..ngram_max (largest
 * first), up to draft_max tokens per step; draft_max 0 = off. */
typedef struct eng_spec_params {
    int ngram_min, ngram_max, draft_max;
} eng_spec_params;
#define ENG_SPEC_NGRAM_MIN 2
#define ENG_SPEC_NGRAM_MAX 4
#define ENG_SPEC_DRAFT_MAX 8
#define ENG_SPEC_DRAFT_LIMIT 64 /* --spec-draft-max at most */
/* A draft for the sequence toks[0..n): for n-gram sizes g from ngram_max
 * down to ngram_min, the latest earlier occurrence of its last g tokens
 * (one ending before position n - 1) and up to kmax tokens that followed
 * it, into out. Returns the draft's length (0: no match). */
int eng_spec_ngram(const int32_t *toks, int n, const eng_spec_params *p, int kmax, int32_t *out);
/* The next draft's length at most after a draft of n tokens of which
 * `accepted` were taken, under a cap of k now (start: draft_max): doubled
 * after a draft taken whole, else what was accepted plus one, within
 * 1..draft_max. A rejected draft token costs a row of compute; on text that
 * does not repeat its context this keeps drafts at one token
 * (docs/speculative.md, "Cost"). */
int eng_spec_next_k(int k, int n, int accepted, int draft_max);
/* The speculative rejection rule for a deterministic draft token x on one
 * row: greedy (temperature 0 or top_k 1) returns the argmax (x accepted iff
 * it is the argmax; no draw); otherwise, with p the distribution eng_sample
 * draws from (temperature, top-k, top-p), x is accepted with probability
 * p(x) (one uniform draw), else the token is drawn from p with x removed,
 * renormalised (a second draw). The token returned is distributed as p
 * whatever x is, so speculation leaves the output distribution unchanged;
 * x was accepted iff the result equals x. */
int32_t eng_sample_draft(const float *logits, int vocab, const eng_sampling *p, eng_rng *rng, int32_t x);
/* The same over a row's candidates (as eng_sample_cands). */
int32_t eng_sample_cands_draft(const eng_cands *c, int vocab, const eng_sampling *p, eng_rng *rng, int32_t x);

/* log_softmax of `logits` (n values) into `out` (double precision). */
void eng_log_softmax(const float *logits, int n, double *out);
/* Indices of the k largest values, descending, ties by ascending index. */
int eng_top_k(const double *vals, int n, int k, int32_t *ids);

/* ---- single-request generation on top of eng_step ---- */

typedef struct eng_gen_params {
    int max_tokens; /* >= 0 */
    eng_sampling sampling;
    int top_logprobs; /* 0..ENG_MAX_TOP_LOGPROBS */
    int ignore_eos;
    const int32_t *stop_ids; /* extra stop tokens */
    int n_stop_ids;
    /* speculative decoding: drafts of up to spec.draft_max tokens
     * (0: off), verified in the decode step; the same greedy tokens */
    eng_spec_params spec;
    /* optional, filled in: decode steps, draft tokens proposed and accepted */
    long long *spec_stats; /* [3]: steps, drafted, accepted */
} eng_gen_params;

/* Per generated token: the token, its natural-log probability under the
 * model's full distribution (log_softmax of the raw logits, before
 * temperature), and the top-k (id, logprob) pairs, descending. */
typedef struct eng_step_out {
    int32_t token;
    double logprob;
    int n_top;
    int32_t top_ids[ENG_MAX_TOP_LOGPROBS];
    double top_logprobs[ENG_MAX_TOP_LOGPROBS];
} eng_step_out;

typedef int (*eng_token_cb)(void *user, const eng_step_out *st); /* non-zero stops */

typedef enum eng_finish { ENG_FINISH_LENGTH = 0, ENG_FINISH_EOS, ENG_FINISH_STOP, ENG_FINISH_CALLBACK } eng_finish;

/* Prefill the prompt (in chunks of at most max_batch_tokens, cut by
 * eng_prompt_chunk), then decode until max_tokens, an EOS id
 * (unless ignore_eos), a stop id, or the callback says stop. With
 * p->spec.draft_max > 0 each decode step verifies a prompt-lookup draft
 * (ENG_LOGITS_VERIFY; drafts fit max_tokens and max_batch_tokens - 1) and
 * the callback sees every accepted token in order. */
int eng_generate(eng *e, const int32_t *prompt, int n_prompt, const eng_gen_params *p, eng_token_cb cb, void *user,
                 eng_finish *finish, char *err, size_t errlen);

#endif
