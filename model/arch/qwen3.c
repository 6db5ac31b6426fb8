/* model/arch: Qwen3 (Qwen3ForCausalLM): per-head q/k RMSNorm before RoPE,
 * no biases; sliding-window attention is not implemented. */
#include <stdio.h>

#include "model/family.h"

static int qwen3_json(json_t *root, model_config *cfg, char *err, size_t errlen) {
    (void)cfg;
    if (json_is_true(json_object_get(root, "use_sliding_window"))) {
        snprintf(err, errlen, "config.json: use_sliding_window=true is not supported");
        return -1;
    }
    return 0;
}

const model_family model_family_qwen3 = {
    .name = "qwen3",
    .hf_arch = "Qwen3ForCausalLM",
    .hf_type = "qwen3",
    .gguf_arch = "qwen3",
    .qk_norm = 1,
    .gguf_permute_qk = 0,
    .parse_json = qwen3_json,
};
