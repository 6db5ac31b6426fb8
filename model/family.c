/* model/: the table of decoder families (one row per model/arch/ file). */
#include <stdio.h>
#include <string.h>

#include "model/family.h"

static const model_family *const families[] = {&model_family_qwen3, &model_family_llama,
                                                  &model_family_qwen2};

#define N_FAMILIES (sizeof families / sizeof *families)

const model_block model_blocks_attn_mlp[2] = {MODEL_BLOCK_ATTN, MODEL_BLOCK_MLP};

int model_pass_sites(const model_config *c) {
    const model_family *f = c ? model_family_find(c->arch) : NULL;
    if (!f || !f->blocks || f->n_blocks < 1 || c->num_layers < 0) return -1;
    return f->n_blocks * c->num_layers;
}

const model_family *model_family_find(const char *key) {
    if (!key) return NULL;
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const model_family *f = families[i];
        if (!strcmp(key, f->name) || !strcmp(key, f->hf_arch) || !strcmp(key, f->hf_type) ||
            !strcmp(key, f->gguf_arch))
            return f;
    }
    return NULL;
}

int model_family_no_sliding_window(json_t *root, model_config *cfg, char *err, size_t errlen) {
    (void)cfg;
    if (json_is_true(json_object_get(root, "use_sliding_window"))) {
        snprintf(err, errlen, "config.json: use_sliding_window=true is not supported");
        return -1;
    }
    return 0;
}

void model_family_list(char *buf, size_t len) {
    size_t at = 0;
    if (len) buf[0] = 0;
    for (size_t i = 0; i < N_FAMILIES && at < len; i++) {
        int n = snprintf(buf + at, len - at, "%s%s (%s)", i ? ", " : "", families[i]->name, families[i]->hf_arch);
        if (n < 0) break;
        at += (size_t)n;
    }
}
