/* model/arch: Llama (LlamaForCausalLM: Llama 2/3, SmolLM, TinyLlama...):
 * Qwen3's block without q/k norms. MLP biases are refused by name; RoPE
 * (default, or Llama 3.1's "llama3" scaling; other types refused) is read by
 * the shared config code. */
#include <stdio.h>

#include "model/family.h"

static int llama_json(json_t *root, model_config *cfg, char *err, size_t errlen) {
    (void)cfg;
    if (json_is_true(json_object_get(root, "mlp_bias"))) {
        snprintf(err, errlen, "config.json: mlp_bias=true is not supported");
        return -1;
    }
    return 0;
}

const model_family model_family_llama = {
    .name = "llama",
    .hf_arch = "LlamaForCausalLM",
    .hf_type = "llama",
    .gguf_arch = "llama",
    .qk_norm = 0,
    .gguf_permute_qk = 1,
    .parse_json = llama_json,
    .blocks = model_blocks_attn_mlp, /* attention, then MLP: 2 all-reduces per layer */
    .n_blocks = 2,
};
