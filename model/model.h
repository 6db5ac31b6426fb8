/*
 * model/ — decoder-only transformer families (Qwen3, Llama, Qwen2): configuration
 * and forward pass.
 *
 * Contract
 *   - model_config_load() reads a Hugging Face model folder's config.json
 *     (and generation_config.json for EOS ids), or a GGUF file's metadata.
 *     It accepts the families of model/arch/ (config.json "architectures" or
 *     model_type; GGUF general.architecture) and rejects features this
 *     engine does not implement (attention_bias beyond a family's q/k/v
 *     biases, sliding window, rope scaling other than Llama 3.1's "llama3")
 *     with a clear message instead of computing something else.
 *   - model_load() takes one tensor-parallel rank's slices from an opened
 *     checkpoint (weights/: safetensors, or GGUF, whose quantized tensors
 *     stay quantized where the backend reads them and are otherwise
 *     dequantized to fp32 at load; rows of this rank only), checks every
 *     tensor's name, full shape and dtype, and hands the slices to the
 *     backend (kern_ops.upload_weight / upload_quantized). The model is backend-neutral: it
 *     only calls the op table, and comm/ for the row-parallel all-reduces
 *     (model_pass_sites: one per block of its family's layer, two so far).
 *   - HF semantics: RMSNorm (fp32, no +1); q_norm/k_norm per head over
 *     head_dim before RoPE where the family has them (qk_norm); q/k/v
 *     biases where it has them (qkv_bias); NEOX RoPE
 *     (a Llama GGUF's interleaved q/k rows are permuted back at load);
 *     causal GQA attention scaled by head_dim^-0.5; SiLU-gated MLP; final
 *     norm; lm_head or tied embeddings.
 *   - A model is one tensor-parallel rank's shard plus that rank's paged KV
 *     cache. Block allocation and sequence bookkeeping belong to engine/;
 *     a pass takes a batch of sequences with block tables and positions.
 *   - model/ only emits a pass's ops (model_pass_*); running a step (the
 *     all-reduce pass, backend graphs, the ranks' vote) is engine/'s.
 *   - A model belongs to one thread at a time (its rank's thread).
 */
#ifndef ECHO_MODEL_H
#define ECHO_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/echo.h"
#include "kernels/kernels.h"
#include "weights/weights.h"

#define MODEL_MAX_EOS 16

typedef struct model_config {
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_layers;
    int num_heads;
    int num_kv_heads;
    int head_dim;
    float rms_norm_eps;
    kern_rope rope; /* theta, and Llama 3.1's or YaRN's scaling when the config asks for it */
    int tie_word_embeddings;
    int max_position_embeddings;
    int n_eos;
    int32_t eos_ids[MODEL_MAX_EOS];
    /* The family (model/arch/) and the parts of the block it changes. */
    const char *arch; /* "qwen3", "llama", "qwen2" (static string) */
    int qk_norm;      /* per-head q/k RMSNorm before RoPE */
    int qkv_bias;     /* biases on the q/k/v projections */
} model_config;

/* Parse `dir`/config.json (+ generation_config.json when present), or the
 * metadata of `dir` when it is a GGUF file. */
int model_config_load(const char *dir, model_config *cfg, char *err, size_t errlen);
/* Same, from an opened GGUF (weights_is_gguf). */
int model_config_from_gguf(const weights_set *ws, model_config *cfg, char *err, size_t errlen);
/* 1 when `path` is a regular file starting with the GGUF magic. */
int model_path_is_gguf(const char *path);
/* Same, from a config.json text (generation config optional, may be NULL). */
int model_config_parse(const char *config_json, const char *generation_json, model_config *cfg, char *err,
                       size_t errlen);

/* --rope-scaling: replace cfg's rope scaling (its theta kept) by spec:
 * "none", "yarn:FACTOR[:ORIGINAL_CONTEXT]" (original context default: the
 * config's max_position_embeddings) or a JSON object read as config.json's
 * rope_scaling. Lengthens max_position_embeddings as a config's yarn does.
 * NULL or "" changes nothing. */
int model_config_rope_override(model_config *cfg, const char *spec, char *err, size_t errlen);

/* A model with no files: "random:SHAPE[,layers=N][,seed=S]", SHAPE one of
 * qwen3-8b, qwen3-0.6b (the published Qwen3 configs), tiny and tiny-hd128
 * (CI-sized; the latter with head_dim 128). model_config_load() accepts the name; model_load() generates every
 * weight in backend memory (kern_ops.random_weight: linear layers and the
 * embedding uniform with Qwen3's initializer std 0.02, norms 1.0), so a GPU
 * benchmark of a real shape needs no checkpoint. The logits are noise: for
 * speed measurements and smoke tests only. A shard depends only on the
 * seed, so tp 1 and tp N compute the same model. */
#define MODEL_RANDOM_PREFIX "random:"
int model_is_random(const char *dir);
/* Parse a random model name into its configuration (and seed, may be NULL). */
int model_random_parse(const char *spec, model_config *cfg, uint64_t *seed, char *err, size_t errlen);

typedef struct model model;

/* Check that `tp` ranks can split this model (Megatron style): query heads
 * and intermediate size divisible by tp; KV heads either divisible by tp or
 * replicated (tp a multiple of num_kv_heads, as vLLM does). */
int model_check_tp(const model_config *c, int tp, char *err, size_t errlen);

typedef struct model_load_opts {
    const kern_ops *ops;
    kern_backend *be;    /* this rank's backend; the model keeps the pointer */
    const weights_set *ws; /* opened checkpoint, shared by all ranks; NULL for a random model */
    int rank, tp;        /* 0 <= rank < tp */
    echo_comm *comm;     /* this rank's all-reduce endpoint; NULL when tp == 1 */
    int kv_blocks;       /* paged KV cache: blocks of kv_block_size tokens */
    int kv_block_size;
    /* 1: each layer's q/k/v slices are fused into one weight ([wq; wk; wv],
     * kern_ops.fuse_rows) and gate/up into another ([wg; wu]), so a
     * one-token step (a batch-1 decode, bound by streaming the weights)
     * runs 2 matmuls where it ran 5; the separate weights become views into
     * the fused ones, so every other step is unchanged. Same bytes held,
     * same logits bits on cpu. 0: separate weights. */
    int fuse_weights;
    /* KERN_Q8_0: matrices stored F32/F16/BF16 are quantized to Q8_0 at load
     * (ggml's rounding) on a backend with kern_ops.upload_quantized, so a
     * decode step streams ~1.06 bytes per weight; ignored with fused
     * weights or on other backends. 0: keep the stored dtypes. */
    int quantize;
    /* 1: quantized matrices (a GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
     * Q5_K, Q6_K, or quantize's Q8_0) are uploaded as their KERN_*_A8 dtype: their matmuls
     * quantize the activations to 8 bits per 32-block and multiply in
     * integers (llama.cpp's numerics; faster, slightly less accurate).
     * Refused on a backend without upload_quantized, or when no matrix is
     * so. 2: the same on the file's quantized matrices (quantize's stay
     * exact), no error when there are none. 3: as 1, Q8_0 matrices only. 0: the bits of the dequantized weights.
     * Q5_0/Q5_1/Q5_K stay quantized only with 1 and 2 (no exact kernel:
     * otherwise widened to fp32 at load). */
    int act_q8;
    /* What the KV cache stores (kernels.h, kern_kv_dtype): KERN_KV_NATIVE
     * (0) is the backend's act dtype (fp32 on cpu: the oracle path). */
    kern_kv_dtype kv_dtype;
    const char *rope_scaling; /* model_config_rope_override's spec, NULL: the config's */
} model_load_opts;

/* Load rank `rank`'s shard of the model in `dir` (config.json, weights in
 * opts->ws): q/k/v split by heads, gate/up by intermediate rows, o/down by
 * input columns, lm_head by vocabulary rows; embedding and norms replicated.
 * Only the shard's slices are read. */
int model_load(const char *dir, const model_load_opts *opts, model **out, char *err, size_t errlen);
void model_free(model *m);
const model_config *model_get_config(const model *m);
/* This rank's vocabulary slice [*first, *first + *count) of the logits. */
void model_vocab_slice(const model *m, int *first, int *count);
/* Bytes of weights this rank reads, and of its KV cache. */
size_t model_weight_bytes(const model *m);
/* Bytes of the embedding table as held by the backend (part of the above). */
size_t model_embed_bytes(const model *m);
size_t model_kv_bytes(const model *m);
/* Matrices this rank multiplies against 8-bit activations (act_q8). */
int model_act_q8_matrices(const model *m);

/* Sampling candidates instead of full logits rows (model_batch.topk): the
 * lm_head output stays on the backend and kern_ops.logits_topk reduces each
 * row of this rank's vocabulary slice to its kk = min(k, slice count) best
 * values and the slice's log-sum-exp, so only those cross to the host. A
 * rank whose slice is empty writes nothing. */
typedef struct model_topk {
    int k;       /* 1..KERN_TOPK_MAX */
    int32_t *ids; /* (n_logit_rows, kk) vocabulary ids (slice start added), by value desc, then id asc */
    float *vals;  /* (n_logit_rows, kk) the logits */
    float *lse;   /* (n_logit_rows) log-sum-exp over the slice; NaN when the row holds inf/nan */
    /* Optional (n_logit_rows): rows flagged nonzero also come back whole
     * (their vocabulary slice) in model_pass_out's `logits`, packed in row
     * order; NULL: none. */
    const unsigned char *full_rows;
} model_topk;

/* A batch of sequences for one forward pass. Token rows q_start[s] ..
 * q_start[s+1]-1 belong to sequence s and sit at positions pos0[s], ...;
 * their keys/values are stored in the blocks of block_table row s, which
 * must already hold positions 0 .. pos0[s]-1. */
typedef struct model_batch {
    int n_seqs;
    const int32_t *tokens;      /* (q_start[n_seqs]) ids < vocab_size */
    const int32_t *q_start;     /* (n_seqs + 1) */
    const int32_t *pos0;        /* (n_seqs) */
    const int32_t *block_table; /* (n_seqs, max_blocks) */
    int max_blocks;
    const int32_t *logit_rows;  /* token rows whose logits are wanted */
    int n_logit_rows;
    /* Optional (may be NULL): the residual stream after every layer, host
     * fp32 (num_layers, q_start[n_seqs], hidden), for accuracy reports. */
    float *layer_states;
    /* Optional (may be NULL): candidates instead of full rows, see above. */
    const model_topk *topk;
} model_batch;

/* One forward pass, in the three parts a step runner drives (engine/'s,
 * which brackets them with the all-reduce pass, echo_begin_pass ..
 * echo_end_pass, and may capture and replay the ops as a backend graph).
 * Give all three the same batch, in this order.
 *   prepare: checks the batch (ids, logits rows, block table against the
 *     cache) and readies the activation buffers and each token's position
 *     and cache slot; it may allocate, it enqueues nothing.
 *   ops: enqueues the pass, embedding to lm_head, and at tp > 1 its
 *     all-reduces (opts->comm). Launches only, nothing read back except
 *     b->layer_states; for one batch shape (and no layer_states) the same
 *     op sequence on the same buffers, so it can be a backend graph.
 *   out: writes logits (n_logit_rows, vocab slice) as host fp32 — or, with
 *     b->topk, the candidates into b->topk and only the flagged rows into
 *     `logits`. */
int model_pass_prepare(model *m, const model_batch *b, char *err, size_t errlen);
int model_pass_ops(model *m, const model_batch *b, char *err, size_t errlen);
int model_pass_out(model *m, const model_batch *b, float *logits, char *err, size_t errlen);
/* The all-reduce sites of one pass of a model of config c, 0 .. n-1: its
 * family's row-parallel blocks (model/arch/) times its layers. Every family
 * so far: 2 per layer, site 2l layer l's attention block (the embedding
 * first at site 0), 2l+1 its MLP. model_pass_ops all-reduces at each in
 * this order, a micro-batch driver runs model_pass_part / _join over them,
 * and comm/'s echo_config.n_sites is this count. -1 when c names no family
 * (model_config.arch). */
int model_pass_sites(const model_config *c);

/* The same pass as micro-batches (engine/overlap.c pipelines them, so that
 * one micro-batch's all-reduce runs while the next one computes). After
 * model_pass_prepare(b), model_pass_split(b, k) cuts b's tokens into k
 * (1..MODEL_MAX_MB, at most one per token) micro-batches of consecutive
 * rows, near-equal in size; then for each site s = 0 .. model_pass_sites-1:
 *   part(mb, s): enqueues the rows' ops up to the block's partial sum, at
 *     *buf (*count values, act dtype), which the caller all-reduces;
 *   join(mb, s): adds the reduced rows back into the residual stream.
 * Order: part(mb, s) after join(mb, s-1); part(mb, s) after part(mb', s)
 * for every mb' < mb (causal attention reads the earlier rows' keys and
 * values of its layer, which an attention site's part(mb', s) stores;
 * the order holds at every site, so a driver need not know which site
 * attends). After the last site's
 * joins, model_pass_tail (final norm, lm_head of the logits rows), then
 * model_pass_out. Every row's ops are those of model_pass_ops (which is
 * this with k = 1 and the all-reduce on opts->comm), on kernels whose rows
 * do not depend on the batch (kernels.h), so the same all-reduce bits give
 * the same logits bits. */
#define MODEL_MAX_MB 8
int model_pass_split(model *m, const model_batch *b, int k, char *err, size_t errlen);
int model_pass_part(model *m, const model_batch *b, int mb, int site, void **buf, size_t *count, char *err,
                    size_t errlen);
int model_pass_join(model *m, const model_batch *b, int mb, int site, char *err, size_t errlen);
int model_pass_tail(model *m, const model_batch *b, char *err, size_t errlen);
/* 1 when model_pass_prepare(b) will reallocate activation buffers that
 * exist (every pointer a captured graph holds moves); 0 when b fits them or
 * there are none yet. */
int model_pass_moves_buffers(const model *m, const model_batch *b);

#endif
