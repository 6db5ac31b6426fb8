/* model/arch: Qwen3 (Qwen3ForCausalLM): per-head q/k RMSNorm before RoPE,
 * no biases; sliding-window attention is refused by name. */
#include "model/family.h"

const model_family model_family_qwen3 = {
    .name = "qwen3",
    .hf_arch = "Qwen3ForCausalLM",
    .hf_type = "qwen3",
    .gguf_arch = "qwen3",
    .qk_norm = 1,
    .gguf_permute_qk = 0,
    .parse_json = model_family_no_sliding_window,
    .blocks = model_blocks_attn_mlp, /* attention, then MLP: 2 all-reduces per layer */
    .n_blocks = 2,
};
