/*
 * model/ — Qwen3 (Qwen3ForCausalLM) configuration and forward pass.
 *
 * Contract
 *   - model_config_load() reads a Hugging Face model folder's config.json
 *     (and generation_config.json for EOS ids). It accepts only
 *     architectures/model_type Qwen3 and rejects features this engine does
 *     not implement (attention bias, sliding window, rope scaling) with a
 *     clear message instead of computing something else.
 *   - model_load() maps the folder's safetensors through weights/, checks every
 *     tensor's name, shape and dtype, and hands each to the backend
 *     (kern_ops.upload_weight). The model is backend-neutral: it only calls
 *     the op table.
 *   - HF semantics: RMSNorm (fp32, no +1); q_norm/k_norm per head over head_dim
 *     before RoPE; NEOX RoPE; causal GQA attention scaled by head_dim^-0.5;
 *     SiLU-gated MLP; final norm; lm_head or tied embeddings.
 *   - A model_seq is one sequence's KV cache (contiguous, capacity fixed at
 *     creation). model_forward() appends `n` tokens (prefill when n > 1,
 *     decode when n == 1) and returns fp32 logits on the host.
 *   - A model and its sequences belong to one thread at a time.
 */
#ifndef ECHO_MODEL_H
#define ECHO_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

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
    double rope_theta;
    int tie_word_embeddings;
    int max_position_embeddings;
    int n_eos;
    int32_t eos_ids[MODEL_MAX_EOS];
} model_config;

/* Parse `dir`/config.json (+ generation_config.json when present). */
int model_config_load(const char *dir, model_config *cfg, char *err, size_t errlen);
/* Same, from a config.json text (generation config optional, may be NULL). */
int model_config_parse(const char *config_json, const char *generation_json, model_config *cfg, char *err,
                       size_t errlen);

typedef struct model model;
typedef struct model_seq model_seq;

/* Load config + weights from a HF folder onto an already created backend.
 * The model keeps the backend pointer; the caller destroys it after
 * model_free(). */
int model_load(const char *dir, const kern_ops *ops, kern_backend *be, model **out, char *err, size_t errlen);
void model_free(model *m);
const model_config *model_get_config(const model *m);

/* A sequence with room for `capacity` tokens (prompt + generated). */
int model_seq_create(model *m, int capacity, model_seq **out, char *err, size_t errlen);
void model_seq_free(model_seq *s);
/* Tokens already in the cache. */
int model_seq_len(const model_seq *s);
/* Forget the cached tokens (keeps the memory). */
void model_seq_reset(model_seq *s);

typedef enum model_logits_mode {
    MODEL_LOGITS_LAST = 0, /* logits(1, vocab) for the last of the n tokens */
    MODEL_LOGITS_ALL = 1,  /* logits(n, vocab) for every token */
} model_logits_mode;

/* Run `n` tokens through the model at positions len .. len+n-1 of `s`,
 * append their keys/values, and write fp32 logits to `logits` (host).
 * Ids must be in [0, vocab_size); the sequence must have room. */
int model_forward(model *m, model_seq *s, const int32_t *ids, int n, model_logits_mode mode, float *logits,
                  char *err, size_t errlen);

#endif
