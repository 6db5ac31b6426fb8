/*
 * model/family.h — private to model/: what differs between the decoder
 * families echo runs. A family is one file model/arch/<name>.c defining one
 * model_family, plus its extern below and its row in family.c's table; the forward pass reads
 * only the flags it copies into model_config. docs/architecture.md, "How to
 * add a model family".
 */
#ifndef ECHO_MODEL_FAMILY_H
#define ECHO_MODEL_FAMILY_H

#include <jansson.h>
#include <stddef.h>

#include "model/model.h"

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
} model_family;

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
