/*
 * model/: configuration from config.json (Hugging Face folders) or GGUF
 * metadata, for the families of model/arch/.
 *
 * Unknown keys are ignored (HF configs carry many that do not affect
 * inference), but every key that would change the computation and that we do
 * not implement is rejected by name, so a model is never run with silently
 * different semantics.
 */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "model/family.h"
#include "model/model.h"

/* Sanity ceilings: far above any real Qwen3, low enough that products of
 * two of them fit comfortably in 64 bits and allocations fail cleanly. */
#define CFG_MAX_DIM (1 << 20)
#define CFG_MAX_LAYERS 4096
#define CFG_MAX_VOCAB (1 << 24)

static int cfg_int(json_t *root, const char *key, int required, int def, int lo, int hi, int *out, char *err,
                   size_t errlen) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) {
            snprintf(err, errlen, "config.json: missing required field \"%s\"", key);
            return -1;
        }
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) {
        snprintf(err, errlen, "config.json: \"%s\" must be an integer", key);
        return -1;
    }
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        snprintf(err, errlen, "config.json: \"%s\" = %lld is out of range [%d, %d]", key, (long long)x, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int cfg_num(json_t *root, const char *key, double def, double *out, char *err, size_t errlen) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) {
        snprintf(err, errlen, "config.json: \"%s\" must be a number", key);
        return -1;
    }
    *out = json_number_value(v);
    return 0;
}

static int cfg_true(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return v && json_is_true(v);
}

/* eos_token_id may be an integer or a list of integers. */
static int cfg_add_eos(json_t *v, const char *where, model_config *cfg, char *err, size_t errlen) {
    if (!v || json_is_null(v)) return 0;
    json_t *items = json_is_array(v) ? v : NULL;
    size_t n = items ? json_array_size(items) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = items ? json_array_get(items, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= cfg->vocab_size) {
            snprintf(err, errlen, "%s: eos_token_id must be integer(s) in [0, %d)", where, cfg->vocab_size);
            return -1;
        }
        int32_t id = (int32_t)json_integer_value(e);
        int dup = 0;
        for (int k = 0; k < cfg->n_eos; k++) dup |= cfg->eos_ids[k] == id;
        if (dup) continue;
        if (cfg->n_eos == MODEL_MAX_EOS) {
            snprintf(err, errlen, "%s: more than %d eos_token_id values", where, MODEL_MAX_EOS);
            return -1;
        }
        cfg->eos_ids[cfg->n_eos++] = id;
    }
    return 0;
}

/* The family named by "architectures" (first known entry) or model_type. */
static const model_family *cfg_family(json_t *root, char *err, size_t errlen) {
    json_t *archs = json_object_get(root, "architectures");
    json_t *mt = json_object_get(root, "model_type");
    const model_family *f = NULL;
    if (json_is_array(archs)) {
        size_t i;
        json_t *a;
        json_array_foreach(archs, i, a) if (!f && json_is_string(a)) f = model_family_find(json_string_value(a));
    } else if (json_is_string(mt)) {
        f = model_family_find(json_string_value(mt));
    }
    if (!f) {
        char known[256];
        model_family_list(known, sizeof known);
        const char *got = json_is_array(archs) && json_is_string(json_array_get(archs, 0))
                              ? json_string_value(json_array_get(archs, 0))
                          : json_is_string(mt) ? json_string_value(mt)
                                               : "(none)";
        snprintf(err, errlen, "config.json: unsupported architecture '%s' (echo runs %s)", got, known);
    }
    return f;
}

/* YaRN's keys (HF's _compute_yarn_parameters, transformers 5.x): factor
 * (absent: max_position_embeddings / original), original_max_position_
 * embeddings (absent: max_position_embeddings; a top-level one wins, as
 * HF's standardize_rope_params has it), beta_fast / beta_slow (absent or 0:
 * 32 / 1), truncate (default true), and the cos/sin factor: attention_factor,
 * else mscale / mscale_all_dim's ratio when both are non-zero, else
 * 0.1 ln(factor) + 1 (1 for factor <= 1), in double as Python computes it.
 * The context becomes original x factor when that is longer (vLLM's rule:
 * Qwen3's 32,768 x 4 = 131,072). */
static double yarn_mscale(double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

static int rope_yarn(json_t *root, json_t *src, const char *what, int *max_pos, kern_rope *r, char *err,
                     size_t errlen) {
    static const char *const keys[] = {"factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                                       "attention_factor"};
    double v[6];
    int has[6];
    for (int i = 0; i < 6; i++) {
        json_t *x = json_object_get(src, keys[i]);
        has[i] = x && !json_is_null(x);
        if (has[i] && (!json_is_number(x) || !isfinite(json_number_value(x)))) {
            snprintf(err, errlen, "config.json: %s.%s must be a number for rope type yarn", what, keys[i]);
            return -1;
        }
        v[i] = has[i] ? json_number_value(x) : 0;
    }
    int old;
    json_t *top = json_object_get(root, "original_max_position_embeddings");
    if (cfg_int(top && !json_is_null(top) ? root : src, "original_max_position_embeddings", 0, *max_pos, 1,
                INT_MAX / 2, &old, err, errlen))
        return -1;
    json_t *tr = json_object_get(src, "truncate");
    if (tr && !json_is_null(tr) && !json_is_boolean(tr)) {
        snprintf(err, errlen, "config.json: %s.truncate must be a boolean", what);
        return -1;
    }
    r->type = KERN_ROPE_YARN;
    r->original_max_position_embeddings = old;
    r->factor = has[0] ? v[0] : (double)*max_pos / old;
    r->beta_fast = v[1] != 0 ? v[1] : 32;
    r->beta_slow = v[2] != 0 ? v[2] : 1;
    r->truncate = !tr || json_is_null(tr) || json_is_true(tr);
    if (has[5])
        r->attention_factor = v[5];
    else if (v[3] != 0 && v[4] != 0)
        r->attention_factor = yarn_mscale(r->factor, v[3]) / yarn_mscale(r->factor, v[4]);
    else
        r->attention_factor = yarn_mscale(r->factor, 1);
    double ctx = (double)old * r->factor;
    if (r->factor >= 1 && ctx > *max_pos && ctx < INT_MAX / 2) *max_pos = (int)ctx;
    return 0;
}

/* RoPE. transformers 4.x writes rope_theta at the top level and a scaled
 * variant as "rope_scaling"; 5.x writes "rope_parameters" (rope_type,
 * rope_theta, the variant's keys) and, as there, a rope_scaling object
 * wins and a missing rope_theta falls back to the top level. The default,
 * Llama 3.1's "llama3" and "yarn" are implemented; any other type is
 * refused by name rather than run as plain RoPE. *max_pos: the context,
 * which yarn may lengthen. */
static int rope_parse(json_t *root, int *max_pos, kern_rope *r, char *err, size_t errlen) {
    json_t *scaling = json_object_get(root, "rope_scaling");
    json_t *params = json_object_get(root, "rope_parameters");
    json_t *src = json_is_object(scaling) ? scaling : json_is_object(params) ? params : NULL;
    const char *what = src == scaling ? "rope_scaling" : "rope_parameters";
    json_t *t = src ? json_object_get(src, "rope_type") : NULL;
    if (src && !t) t = json_object_get(src, "type");
    const char *type = !t || json_is_null(t) ? "default" : json_is_string(t) ? json_string_value(t) : "?";
    memset(r, 0, sizeof *r);
    if (!strcmp(type, "llama3")) {
        static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor"};
        double *vals[] = {&r->factor, &r->low_freq_factor, &r->high_freq_factor};
        for (int i = 0; i < 3; i++) {
            json_t *v = json_object_get(src, keys[i]);
            if (!json_is_number(v)) {
                snprintf(err, errlen, "config.json: %s.%s must be a number for rope type llama3", what, keys[i]);
                return -1;
            }
            *vals[i] = json_number_value(v);
        }
        int old;
        if (cfg_int(src, "original_max_position_embeddings", 0, *max_pos, 1, INT_MAX / 2, &old, err, errlen))
            return -1;
        r->type = KERN_ROPE_LLAMA3;
        r->original_max_position_embeddings = old;
    } else if (!strcmp(type, "yarn")) {
        if (rope_yarn(root, src, what, max_pos, r, err, errlen)) return -1;
    } else if (strcmp(type, "default") != 0) {
        snprintf(err, errlen, "config.json: %s of type '%s' is not supported (echo runs default, llama3 and yarn)",
                 what, type);
        return -1;
    }
    double theta_top;
    if (cfg_num(root, "rope_theta", 10000.0, &theta_top, err, errlen) ||
        (src && cfg_num(src, "rope_theta", theta_top, &r->theta, err, errlen)))
        return -1;
    if (!src) r->theta = theta_top;
    if (!(r->theta > 1.0) || r->theta > 1e12) {
        snprintf(err, errlen, "config.json: rope_theta %g is out of range", r->theta);
        return -1;
    }
    const char *why = kern_rope_invalid(r);
    if (why) {
        snprintf(err, errlen, "config.json: %s: %s", what, why);
        return -1;
    }
    return 0;
}

int model_config_rope_override(model_config *cfg, const char *spec, char *err, size_t errlen) {
    if (!spec || !*spec) return 0;
    json_t *scaling = NULL;
    double factor;
    int orig = 0, n = 0;
    if (!strcmp(spec, "none") || !strcmp(spec, "default")) {
        scaling = json_null();
    } else if (spec[0] == '{') {
        json_error_t jerr;
        scaling = json_loads(spec, 0, &jerr);
        if (!json_is_object(scaling)) {
            json_decref(scaling);
            snprintf(err, errlen, "--rope-scaling: not a JSON object (%s)", jerr.text);
            return -1;
        }
    } else if ((sscanf(spec, "yarn:%lf%n", &factor, &n) == 1 && !spec[n]) ||
               (sscanf(spec, "yarn:%lf:%d%n", &factor, &orig, &n) == 2 && !spec[n])) {
        if (!orig) orig = cfg->max_position_embeddings;
        scaling = json_pack("{s:s,s:f,s:i}", "rope_type", "yarn", "factor", factor, "original_max_position_embeddings",
                            orig);
    } else {
        snprintf(err, errlen, "--rope-scaling '%.64s': expected none, yarn:FACTOR[:ORIGINAL_CONTEXT] or a JSON "
                 "rope_scaling object", spec);
        return -1;
    }
    /* the config's theta and context, the flag's scaling, read as config.json's */
    json_t *root = json_pack("{s:f,s:i,s:o}", "rope_theta", cfg->rope.theta, "max_position_embeddings",
                             cfg->max_position_embeddings, "rope_scaling", scaling);
    int max_pos = cfg->max_position_embeddings;
    kern_rope r;
    char e2[400];
    int rc = root ? rope_parse(root, &max_pos, &r, e2, sizeof e2) : -1;
    json_decref(root);
    if (rc) {
        snprintf(err, errlen, "--rope-scaling: %s", root ? e2 + (strncmp(e2, "config.json: ", 13) ? 0 : 13)
                                                          : "out of memory");
        return -1;
    }
    cfg->rope = r;
    cfg->max_position_embeddings = max_pos;
    return 0;
}

static int cfg_rope(json_t *root, model_config *cfg, char *err, size_t errlen) {
    return rope_parse(root, &cfg->max_position_embeddings, &cfg->rope, err, errlen);
}

int model_config_parse(const char *config_json, const char *generation_json, model_config *cfg, char *err,
                       size_t errlen) {
    json_error_t jerr;
    json_t *gen = NULL;
    json_t *root = json_loads(config_json, 0, &jerr);
    int rc = -1;
    memset(cfg, 0, sizeof *cfg);
    if (!root || !json_is_object(root)) {
        snprintf(err, errlen, "config.json: malformed JSON (line %d: %s)", jerr.line, root ? "not an object" : jerr.text);
        goto out;
    }
    const model_family *fam = cfg_family(root, err, errlen);
    if (!fam) goto out;
    cfg->arch = fam->name;
    cfg->qk_norm = fam->qk_norm;
    cfg->qkv_bias = fam->qkv_bias;
    if (cfg_int(root, "vocab_size", 1, 0, 1, CFG_MAX_VOCAB, &cfg->vocab_size, err, errlen) ||
        cfg_int(root, "hidden_size", 1, 0, 1, CFG_MAX_DIM, &cfg->hidden_size, err, errlen) ||
        cfg_int(root, "intermediate_size", 1, 0, 1, CFG_MAX_DIM, &cfg->intermediate_size, err, errlen) ||
        cfg_int(root, "num_hidden_layers", 1, 0, 1, CFG_MAX_LAYERS, &cfg->num_layers, err, errlen) ||
        cfg_int(root, "num_attention_heads", 1, 0, 1, 4096, &cfg->num_heads, err, errlen) ||
        cfg_int(root, "num_key_value_heads", 0, cfg->num_heads, 1, 4096, &cfg->num_kv_heads, err, errlen))
        goto out;
    /* head_dim is honoured when present: Qwen3 allows heads*head_dim != hidden. */
    if (cfg_int(root, "head_dim", 0, cfg->hidden_size / cfg->num_heads, 2, 65536, &cfg->head_dim, err, errlen) ||
        cfg_int(root, "max_position_embeddings", 0, 32768, 1, INT_MAX / 2, &cfg->max_position_embeddings, err,
                errlen))
        goto out;
    if (cfg->num_heads % cfg->num_kv_heads) {
        snprintf(err, errlen, "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                 cfg->num_heads, cfg->num_kv_heads);
        goto out;
    }
    if (cfg->head_dim % 2) {
        snprintf(err, errlen, "config.json: head_dim %d must be even for RoPE", cfg->head_dim);
        goto out;
    }
    if ((long long)cfg->num_heads * cfg->head_dim > CFG_MAX_DIM) {
        snprintf(err, errlen, "config.json: num_attention_heads*head_dim is too large");
        goto out;
    }
    double eps;
    if (cfg_num(root, "rms_norm_eps", 1e-6, &eps, err, errlen)) goto out;
    if (!(eps > 0 && eps < 1)) {
        snprintf(err, errlen, "config.json: rms_norm_eps %g is out of range (0, 1)", eps);
        goto out;
    }
    cfg->rms_norm_eps = (float)eps;
    if (cfg_rope(root, cfg, err, errlen)) goto out;
    cfg->tie_word_embeddings = cfg_true(root, "tie_word_embeddings");
    if (cfg_true(root, "attention_bias")) {
        snprintf(err, errlen, "config.json: attention_bias=true is not supported");
        goto out;
    }
    if (fam->parse_json && fam->parse_json(root, cfg, err, errlen)) goto out;
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        snprintf(err, errlen, "config.json: hidden_act '%s' is not supported (expected silu)",
                 json_is_string(act) ? json_string_value(act) : "?");
        goto out;
    }
    if (cfg_add_eos(json_object_get(root, "eos_token_id"), "config.json", cfg, err, errlen)) goto out;
    if (generation_json) {
        gen = json_loads(generation_json, 0, &jerr);
        if (!gen || !json_is_object(gen)) {
            snprintf(err, errlen, "generation_config.json: malformed JSON (line %d: %s)", jerr.line,
                     gen ? "not an object" : jerr.text);
            goto out;
        }
        if (cfg_add_eos(json_object_get(gen, "eos_token_id"), "generation_config.json", cfg, err, errlen)) goto out;
    }
    rc = 0;
out:
    json_decref(gen);
    json_decref(root);
    return rc;
}

static char *cfg_read_file(const char *path, int *missing) {
    FILE *f = fopen(path, "rb");
    *missing = !f;
    if (!f) return NULL;
    char *buf = NULL;
    long len;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && len < (64L << 20) && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)len + 1);
        if (buf && fread(buf, 1, (size_t)len, f) == (size_t)len) {
            buf[len] = 0;
        } else {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

/* Shapes for "random:" models: the published config.json values of
 * Qwen/Qwen3-8B and Qwen/Qwen3-0.6B (the same numbers echo-bench randmodel
 * writes), and CI-sized models of the same architecture: tiny, and
 * tiny-hd128 with Qwen3's head_dim of 128 (the head size the cuda
 * attention's fast paths take) at a size the CUDA emulator can run. */
typedef struct cfg_shape {
    const char *name;
    int vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos, tied, eos;
} cfg_shape;

static const cfg_shape cfg_shapes[] = {
    {"qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 128, 40960, 0, 151645},
    {"qwen3-0.6b", 151936, 1024, 3072, 28, 16, 8, 128, 40960, 1, 151645},
    {"tiny", 512, 64, 128, 2, 4, 2, 16, 4096, 0, 511},
    {"tiny-hd128", 512, 256, 512, 2, 4, 2, 128, 4096, 0, 511},
};

int model_is_random(const char *dir) {
    return dir && strncmp(dir, MODEL_RANDOM_PREFIX, strlen(MODEL_RANDOM_PREFIX)) == 0;
}

int model_random_parse(const char *spec, model_config *cfg, uint64_t *seed, char *err, size_t errlen) {
    char buf[256];
    if (!model_is_random(spec) || strlen(spec) >= sizeof buf) {
        snprintf(err, errlen, "not a random model name: %.64s", spec ? spec : "(null)");
        return -1;
    }
    strcpy(buf, spec + strlen(MODEL_RANDOM_PREFIX));
    char *save = NULL, *tok = strtok_r(buf, ",", &save);
    const cfg_shape *sh = NULL;
    for (size_t i = 0; tok && i < sizeof cfg_shapes / sizeof *cfg_shapes; i++)
        if (!strcmp(tok, cfg_shapes[i].name)) sh = &cfg_shapes[i];
    if (!sh) {
        char known[128] = "";
        for (size_t i = 0; i < sizeof cfg_shapes / sizeof *cfg_shapes; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", cfg_shapes[i].name);
        snprintf(err, errlen, "%s: unknown shape \"%s\" (known: %s; options: ,layers=N ,seed=S)", spec,
                 tok ? tok : "", known);
        return -1;
    }
    memset(cfg, 0, sizeof *cfg);
    *cfg = (model_config){.vocab_size = sh->vocab,
                          .hidden_size = sh->hidden,
                          .intermediate_size = sh->inter,
                          .num_layers = sh->layers,
                          .num_heads = sh->heads,
                          .num_kv_heads = sh->kv_heads,
                          .head_dim = sh->head_dim,
                          .rms_norm_eps = 1e-6f,
                          .rope = {.theta = 1000000.0},
                          .tie_word_embeddings = sh->tied,
                          .max_position_embeddings = sh->max_pos,
                          .n_eos = 1,
                          .eos_ids = {sh->eos},
                          .arch = model_family_qwen3.name,
                          .qk_norm = model_family_qwen3.qk_norm};
    uint64_t sd = 1;
    while ((tok = strtok_r(NULL, ",", &save))) {
        char *end = NULL;
        if (!strncmp(tok, "layers=", 7)) {
            long v = strtol(tok + 7, &end, 10);
            if (end == tok + 7 || *end || v < 1 || v > CFG_MAX_LAYERS) {
                snprintf(err, errlen, "%s: layers must be an integer in [1, %d]", spec, CFG_MAX_LAYERS);
                return -1;
            }
            cfg->num_layers = (int)v;
        } else if (!strncmp(tok, "seed=", 5)) {
            unsigned long long v = strtoull(tok + 5, &end, 10);
            if (end == tok + 5 || *end || tok[5] == '-') {
                snprintf(err, errlen, "%s: seed must be a non-negative integer", spec);
                return -1;
            }
            sd = v;
        } else {
            snprintf(err, errlen, "%s: unknown option \"%s\" (options: layers=N, seed=S)", spec, tok);
            return -1;
        }
    }
    if (seed) *seed = sd;
    return 0;
}

int model_path_is_gguf(const char *path) {
    struct stat st;
    char magic[4];
    if (!path || stat(path, &st) || !S_ISREG(st.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    fclose(f);
    return ok;
}

/* "<arch>.<key>" of a GGUF as an int in [lo, hi]; `def` when absent and
 * not required. */
static int gguf_int(const weights_set *ws, const char *arch, const char *key, int required, int def, int lo, int hi,
                    int *out, char *err, size_t errlen) {
    char k[160];
    int64_t v;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (weights_meta_int(ws, k, &v)) {
        if (required) {
            snprintf(err, errlen, "GGUF: missing integer metadata \"%s\"", k);
            return -1;
        }
        *out = def;
        return 0;
    }
    if (v < lo || v > hi) {
        snprintf(err, errlen, "GGUF: \"%s\" = %lld is out of range [%d, %d]", k, (long long)v, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int gguf_add_eos(const weights_set *ws, const char *key, model_config *cfg, char *err, size_t errlen) {
    int64_t v;
    if (weights_meta_int(ws, key, &v)) return 0;
    if (v < 0 || v >= cfg->vocab_size) {
        snprintf(err, errlen, "GGUF: \"%s\" = %lld is not a token id below %d", key, (long long)v, cfg->vocab_size);
        return -1;
    }
    for (int k = 0; k < cfg->n_eos; k++)
        if (cfg->eos_ids[k] == (int32_t)v) return 0;
    if (cfg->n_eos < MODEL_MAX_EOS) cfg->eos_ids[cfg->n_eos++] = (int32_t)v;
    return 0;
}

/* A GGUF's YaRN, as llama.cpp's converter writes it: rope.scaling.factor,
 * .original_context_length (default: context_length), and when present
 * .yarn_beta_fast / .yarn_beta_slow, and .attn_factor, which llama.cpp
 * multiplies into YaRN's 0.1 ln(factor) + 1. DeepSeek's
 * .yarn_log_multiplier is refused by name. */
static int gguf_yarn(const weights_set *ws, const char *arch, model_config *cfg, char *err, size_t errlen) {
    char k[160];
    double v;
    kern_rope *r = &cfg->rope;
    snprintf(k, sizeof k, "%s.rope.scaling.yarn_log_multiplier", arch);
    if (!weights_meta_float(ws, k, &v) && v != 0) {
        snprintf(err, errlen, "GGUF: \"%s\" (DeepSeek's YaRN) is not supported", k);
        return -1;
    }
    snprintf(k, sizeof k, "%s.rope.scaling.factor", arch);
    if (weights_meta_float(ws, k, &r->factor)) {
        snprintf(err, errlen, "GGUF: yarn rope scaling without \"%s\"", k);
        return -1;
    }
    int old;
    if (gguf_int(ws, arch, "rope.scaling.original_context_length", 0, cfg->max_position_embeddings, 1, INT_MAX / 2,
                 &old, err, errlen))
        return -1;
    r->type = KERN_ROPE_YARN;
    r->original_max_position_embeddings = old;
    r->truncate = 1;
    snprintf(k, sizeof k, "%s.rope.scaling.yarn_beta_fast", arch);
    if (weights_meta_float(ws, k, &r->beta_fast) || r->beta_fast == 0) r->beta_fast = 32;
    snprintf(k, sizeof k, "%s.rope.scaling.yarn_beta_slow", arch);
    if (weights_meta_float(ws, k, &r->beta_slow) || r->beta_slow == 0) r->beta_slow = 1;
    snprintf(k, sizeof k, "%s.rope.scaling.attn_factor", arch);
    if (weights_meta_float(ws, k, &v)) v = 1;
    r->attention_factor = v * yarn_mscale(r->factor, 1);
    const char *why = kern_rope_invalid(r);
    if (why) {
        snprintf(err, errlen, "GGUF: rope scaling: %s", why);
        return -1;
    }
    double ctx = (double)old * r->factor;
    if (ctx > cfg->max_position_embeddings && ctx < INT_MAX / 2) cfg->max_position_embeddings = (int)ctx;
    return 0;
}

int model_config_from_gguf(const weights_set *ws, model_config *cfg, char *err, size_t errlen) {
    const char *s;
    size_t n;
    char arch[64], k[160];
    memset(cfg, 0, sizeof *cfg);
    if (weights_meta_str(ws, "general.architecture", &s, &n) || n == 0 || n >= sizeof arch) {
        snprintf(err, errlen, "GGUF: missing or bad \"general.architecture\"");
        return -1;
    }
    memcpy(arch, s, n);
    arch[n] = 0;
    const model_family *fam = model_family_find(arch);
    if (!fam || strcmp(fam->gguf_arch, arch)) {
        char known[256];
        model_family_list(known, sizeof known);
        snprintf(err, errlen, "GGUF: unsupported architecture '%s' (echo runs %s)", arch, known);
        return -1;
    }
    cfg->arch = fam->name;
    cfg->qk_norm = fam->qk_norm;
    cfg->qkv_bias = fam->qkv_bias;
    if (gguf_int(ws, arch, "embedding_length", 1, 0, 1, CFG_MAX_DIM, &cfg->hidden_size, err, errlen) ||
        gguf_int(ws, arch, "feed_forward_length", 1, 0, 1, CFG_MAX_DIM, &cfg->intermediate_size, err, errlen) ||
        gguf_int(ws, arch, "block_count", 1, 0, 1, CFG_MAX_LAYERS, &cfg->num_layers, err, errlen) ||
        gguf_int(ws, arch, "attention.head_count", 1, 0, 1, 4096, &cfg->num_heads, err, errlen) ||
        gguf_int(ws, arch, "attention.head_count_kv", 0, cfg->num_heads, 1, 4096, &cfg->num_kv_heads, err, errlen) ||
        gguf_int(ws, arch, "attention.key_length", 0, cfg->hidden_size / cfg->num_heads, 2, 65536, &cfg->head_dim,
                 err, errlen) ||
        gguf_int(ws, arch, "context_length", 0, 4096, 1, INT_MAX / 2, &cfg->max_position_embeddings, err, errlen))
        return -1;
    int vlen = cfg->head_dim, rot = cfg->head_dim;
    if (gguf_int(ws, arch, "attention.value_length", 0, cfg->head_dim, 1, 65536, &vlen, err, errlen) ||
        gguf_int(ws, arch, "rope.dimension_count", 0, cfg->head_dim, 1, 65536, &rot, err, errlen))
        return -1;
    if (vlen != cfg->head_dim || rot != cfg->head_dim) {
        snprintf(err, errlen, "GGUF: value length %d / rotary dimensions %d differ from head_dim %d (not supported)",
                 vlen, rot, cfg->head_dim);
        return -1;
    }
    if (cfg->num_heads % cfg->num_kv_heads || cfg->head_dim % 2) {
        snprintf(err, errlen, "GGUF: %d heads, %d KV heads, head_dim %d: heads must be a multiple of KV heads and "
                 "head_dim even", cfg->num_heads, cfg->num_kv_heads, cfg->head_dim);
        return -1;
    }
    double v;
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    if (weights_meta_float(ws, k, &v)) v = 1e-6;
    if (!(v > 0 && v < 1)) {
        snprintf(err, errlen, "GGUF: \"%s\" = %g is out of range (0, 1)", k, v);
        return -1;
    }
    cfg->rms_norm_eps = (float)v;
    snprintf(k, sizeof k, "%s.rope.freq_base", arch);
    if (weights_meta_float(ws, k, &cfg->rope.theta)) cfg->rope.theta = 10000.0;
    if (!(cfg->rope.theta > 1.0) || cfg->rope.theta > 1e12) {
        snprintf(err, errlen, "GGUF: rope frequency base %g is out of range", cfg->rope.theta);
        return -1;
    }
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    if (!weights_meta_str(ws, k, &s, &n) && !(n == 4 && !memcmp(s, "none", 4))) {
        if (!(n == 4 && !memcmp(s, "yarn", 4))) {
            snprintf(err, errlen, "GGUF: rope scaling '%.*s' is not supported (echo runs none and yarn)",
                     (int)(n < 32 ? n : 32), s);
            return -1;
        }
        if (gguf_yarn(ws, arch, cfg, err, errlen)) return -1;
    }
    if (weights_find(ws, "rope_freqs.weight")) {
        snprintf(err, errlen, "GGUF: rope frequency factors (rope_freqs.weight, Llama 3.1 scaling) are not supported");
        return -1;
    }
    /* The vocabulary is the embedding's rows (a GGUF need not say it twice). */
    const weights_tensor *emb = weights_find(ws, "token_embd.weight");
    if (!emb || emb->ndim != 2 || emb->shape[1] != cfg->hidden_size || emb->shape[0] < 1 ||
        emb->shape[0] > CFG_MAX_VOCAB) {
        snprintf(err, errlen, "GGUF: token_embd.weight is missing or not (vocab, %d)", cfg->hidden_size);
        return -1;
    }
    cfg->vocab_size = (int)emb->shape[0];
    cfg->tie_word_embeddings = weights_find(ws, "output.weight") == NULL;
    if (gguf_add_eos(ws, "tokenizer.ggml.eos_token_id", cfg, err, errlen) ||
        gguf_add_eos(ws, "tokenizer.ggml.eot_token_id", cfg, err, errlen))
        return -1;
    return 0;
}

static int config_load_gguf(const char *path, model_config *cfg, char *err, size_t errlen) {
    weights_set *ws;
    if (weights_open(path, &ws, err, errlen)) return -1;
    int rc = model_config_from_gguf(ws, cfg, err, errlen);
    weights_close(ws);
    if (rc) {
        /* name the file: messages above only say "GGUF" */
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%s", err);
        snprintf(err, errlen, "%s: %s", path, tmp);
    }
    return rc;
}

int model_config_load(const char *dir, model_config *cfg, char *err, size_t errlen) {
    if (model_is_random(dir)) return model_random_parse(dir, cfg, NULL, err, errlen);
    if (model_path_is_gguf(dir)) return config_load_gguf(dir, cfg, err, errlen);
    char path[4096];
    int missing;
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *conf = cfg_read_file(path, &missing);
    if (!conf) {
        snprintf(err, errlen, "%s: %s", path, missing ? "not found (is this a Hugging Face model folder?)" : "cannot read");
        return -1;
    }
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    char *gen = cfg_read_file(path, &missing);
    int rc = -1;
    if (!gen && !missing)
        snprintf(err, errlen, "%s: cannot read", path);
    else
        rc = model_config_parse(conf, gen, cfg, err, errlen);
    free(conf);
    free(gen);
    return rc;
}
