/* model/arch: Qwen2 (Qwen2ForCausalLM: Qwen2, Qwen2.5): Llama's block with
 * biases on the q/k/v projections, no q/k norms; sliding-window attention
 * is not implemented. */
#include <stdio.h>

#include "model/family.h"

static int qwen2_json(json_t *root, model_config *cfg, char *err, size_t errlen) {
    (void)cfg;
    if (json_is_true(json_object_get(root, "use_sliding_window"))) {
        snprintf(err, errlen, "config.json: use_sliding_window=true is not supported");
        return -1;
    }
    return 0;
}

const model_family model_family_qwen2 = {
    .name = "qwen2",
    .hf_arch = "Qwen2ForCausalLM",
    .hf_type = "qwen2",
    .gguf_arch = "qwen2",
    .qk_norm = 0,
    .qkv_bias = 1,
    .gguf_permute_qk = 0,
    .parse_json = qwen2_json,
};
