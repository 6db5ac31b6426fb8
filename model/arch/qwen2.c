/* model/arch: Qwen2 (Qwen2ForCausalLM: Qwen2, Qwen2.5): Llama's block with
 * biases on the q/k/v projections, no q/k norms; sliding-window attention
 * is refused by name (model_family_no_sliding_window). */
#include "model/family.h"

const model_family model_family_qwen2 = {
    .name = "qwen2",
    .hf_arch = "Qwen2ForCausalLM",
    .hf_type = "qwen2",
    .gguf_arch = "qwen2",
    .qk_norm = 0,
    .qkv_bias = 1,
    .gguf_permute_qk = 0,
    .parse_json = model_family_no_sliding_window,
    .blocks = model_blocks_attn_mlp, /* attention, then MLP: 2 all-reduces per layer */
    .n_blocks = 2,
};
