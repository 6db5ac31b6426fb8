/*
 * model/family.h — private to model/: what differs between the decoder
 * families echo runs. A family is one file model/arch/<name>.c defining one
 * model_family, plus its extern below and its row in family.c's table; the
 * forward pass reads the flags it copies into model_config and the family's
 * block layout (its all-reduce sites, model_pass_sites). docs/architecture.md,
 * "How to add a model family".
 */
#ifndef ECHO_MODEL_FAMILY_H
#define ECHO_MODEL_FAMILY_H

#include <jansson.h>
#include <stddef.h>

#include "model/model.h"

/* A layer's row-parallel blocks: each ends in a partial sum over the ranks,
 * all-reduced at one site of the pass (decoder.c runs each kind). */
typedef enum model_block { MODEL_BLOCK_ATTN, MODEL_BLOCK_MLP } model_block;

typedef struct model_family {
    const char *name;      /* model_config.arch: "qwen3", "llama", "qwen2" */
    const char *hf_arch;   /* config.json "architectures" entry */
    const char *hf_type;   /* config.json "model_type" */
    const char *gguf_arch; /* GGUF general.architecture; its keys are "<gguf_arch>.<key>" */
    int qk_norm;           /* q_norm/k_norm: RMSNorm per head before RoPE */
    int qkv_bias;          /* q/k/v projections carry biases */
    /* llama.cpp's converter interleaves the two rotary halves of every q/k
     * head row-wise for this family; loading a GGUF undoes it. */
    int gguf_permute_qk;
    /* config.json keys only this family has (checked after the shared
     * ones); NULL when there are none. */
    int (*parse_json)(json_t *root, model_config *cfg, char *err, size_t errlen);
    /* The blocks of one layer in order; the pass's all-reduce sites are
     * these, layer after layer: site s is blocks[s % n_blocks] of layer
     * s / n_blocks (model_pass_sites). */
    const model_block *blocks;
    int n_blocks;
} model_family;

/* The sequential block (attention, then MLP: site = 2*layer + {0, 1}) of
 * every family so far. */
extern const model_block model_blocks_attn_mlp[2];

extern const model_family model_family_qwen3;
extern const model_family model_family_llama;
extern const model_family model_family_qwen2;

/* The family whose name, HF architecture, HF model_type or GGUF
 * architecture is `key`; NULL if none. */
const model_family *model_family_find(const char *key);
/* A parse_json hook for families whose configs may ask for sliding-window
 * attention (use_sliding_window), which echo does not implement. */
int model_family_no_sliding_window(json_t *root, model_config *cfg, char *err, size_t errlen);
/* "qwen3 (Qwen3ForCausalLM), llama (LlamaForCausalLM)" for messages. */
void model_family_list(char *buf, size_t len);

#endif
