/*
 * model/: loading one rank's weights (model_load, model_free): each tensor's
 * slice for this rank, converted, quantized or fused as the options ask,
 * uploaded to the backend, plus the KV cache. The pass is decoder.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kv.h"
#include "model/internal.h"

/* The tensors of a decoder, by their names in each checkpoint format
 * (printf patterns taking the layer). */
typedef enum tkind {
    T_EMBED, T_NORM, T_HEAD, T_ATTN_NORM, T_Q, T_K, T_V, T_O, T_QN, T_KN, T_MLP_NORM, T_GATE, T_UP, T_DOWN,
    T_BQ, T_BK, T_BV
} tkind;
static const struct {
    const char *hf, *gguf;
} tnames[] = {
    [T_EMBED] = {"model.embed_tokens.weight", "token_embd.weight"},
    [T_NORM] = {"model.norm.weight", "output_norm.weight"},
    [T_HEAD] = {"lm_head.weight", "output.weight"},
    [T_ATTN_NORM] = {"model.layers.%d.input_layernorm.weight", "blk.%d.attn_norm.weight"},
    [T_Q] = {"model.layers.%d.self_attn.q_proj.weight", "blk.%d.attn_q.weight"},
    [T_K] = {"model.layers.%d.self_attn.k_proj.weight", "blk.%d.attn_k.weight"},
    [T_V] = {"model.layers.%d.self_attn.v_proj.weight", "blk.%d.attn_v.weight"},
    [T_O] = {"model.layers.%d.self_attn.o_proj.weight", "blk.%d.attn_output.weight"},
    [T_QN] = {"model.layers.%d.self_attn.q_norm.weight", "blk.%d.attn_q_norm.weight"},
    [T_KN] = {"model.layers.%d.self_attn.k_norm.weight", "blk.%d.attn_k_norm.weight"},
    [T_MLP_NORM] = {"model.layers.%d.post_attention_layernorm.weight", "blk.%d.ffn_norm.weight"},
    [T_GATE] = {"model.layers.%d.mlp.gate_proj.weight", "blk.%d.ffn_gate.weight"},
    [T_UP] = {"model.layers.%d.mlp.up_proj.weight", "blk.%d.ffn_up.weight"},
    [T_DOWN] = {"model.layers.%d.mlp.down_proj.weight", "blk.%d.ffn_down.weight"},
    [T_BQ] = {"model.layers.%d.self_attn.q_proj.bias", "blk.%d.attn_q.bias"},
    [T_BK] = {"model.layers.%d.self_attn.k_proj.bias", "blk.%d.attn_k.bias"},
    [T_BV] = {"model.layers.%d.self_attn.v_proj.bias", "blk.%d.attn_v.bias"},
};

static void tensor_name(const model *m, tkind k, int layer, char *buf, size_t len) {
    snprintf(buf, len, m->gguf ? tnames[k].gguf : tnames[k].hf, layer);
}

static int to_kern_dtype(weights_dtype d, kern_dtype *out) {
    switch (d) {
    case WEIGHTS_F32: *out = KERN_F32; return 0;
    case WEIGHTS_F16: *out = KERN_F16; return 0;
    case WEIGHTS_BF16: *out = KERN_BF16; return 0;
    default: return -1;
    }
}

/* Whether a tensor (a matrix: rows > 0) may be held quantized: the
 * backend has upload_quantized and the weights are not fused. */
static int can_quantize(const model *m, int64_t rows) { return m->ops->upload_quantized && !m->fused && rows > 0; }

/* Whether the slice of a matrix stored F32/F16/BF16 becomes Q8_0
 * (model_load_opts.quantize): columns [c0, c0 + nc) whole 32-blocks. */
static int to_q8(const model *m, int64_t rows, int64_t c0, int64_t nc) {
    return m->quantize == KERN_Q8_0 && can_quantize(m, rows) && c0 % 32 == 0 && nc % 32 == 0;
}

/* The dtype a matrix quantize makes is uploaded as: KERN_Q8_0_A8 with
 * act_q8 1 or 3 (auto leaves --quantize's matrices exact: it is for a
 * GGUF's own blocks). */
static kern_dtype q8_dtype(const model *m) { return m->act_q8 == 1 || m->act_q8 == 3 ? KERN_Q8_0_A8 : KERN_Q8_0; }

/* upload_quantized, counting the KERN_*_A8 matrices (act_q8 1 needs one). */
static int upload_q(model *m, const kern_weight *host, kern_dtype to, kern_weight *out) {
    if (m->ops->upload_quantized(m->be, host, to, out)) return -1;
    m->n_act_q8 += kern_dtype_plain(to) != to;
    return 0;
}

/* A random model's slice: values from (seed, tensor name, global index),
 * uniform with the std of Qwen3's initializer (0.02) or 1.0 for norms;
 * with quantize, a matrix is then quantized as a checkpoint's would be. */
static int random_slice(model *m, const char *name, int64_t rows, int64_t cols, int64_t r0, int64_t nr, int64_t c0,
                        int64_t nc, kern_weight *out, char *err, size_t errlen) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a: each tensor its own stream */
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    int is_norm = rows == 0;
    float scale = is_norm ? 0.0f : 0.02f * 1.7320508f; /* uniform [-a, a) has std a / sqrt(3) */
    if (m->ops->random_weight(m->be, out, rows ? nr : 1, nc, rows ? r0 : 0, c0, cols, m->seed ^ h,
                              is_norm ? 1.0f : 0.0f, scale)) {
        snprintf(err, errlen, "%s: %s", name, kern_last_error(m->be));
        return -1;
    }
    if (to_q8(m, rows, c0, nc)) {
        kern_weight q;
        if (upload_q(m, out, q8_dtype(m), &q)) { /* out stays: model_free releases it */
            snprintf(err, errlen, "%s: %s", name, kern_last_error(m->be));
            return -1;
        }
        m->ops->free_weight(m->be, out);
        *out = q;
        m->weight_bytes += (size_t)out->rows * kern_dtype_bytes(KERN_Q8_0, nc);
        return 0;
    }
    m->weight_bytes += (size_t)out->rows * (size_t)out->cols * kern_dtype_size(out->dtype);
    return 0;
}

/* Keep a host buffer alive as long as the model: the cpu backend's
 * weights alias their host view. */
static int own(model *m, void *p) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **o = realloc(m->owned, (size_t)cap * sizeof *o);
        if (!o) return -1;
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return 0;
}

/* After an upload: when the backend made its own copy (out->data differs
 * from src), free what fed it, the model-owned buffer `mine` or the mmap
 * pages of the slice [src, src + extent), so a rank holds its weights
 * once (the cpu backend copies big weights onto huge pages). */
static void after_upload(model *m, const weights_set *ws, const void *src, size_t extent, void *mine,
                         const kern_weight *out) {
    if (out->data == src) return;
    if (!mine) {
        weights_drop_pages(ws, src, extent);
        return;
    }
    for (int i = m->n_owned; i-- > 0;)
        if (m->owned[i] == mine) {
            free(mine);
            m->owned[i] = m->owned[--m->n_owned];
            return;
        }
}

/* Bytes a (rows, cols) view with row stride ld spans. */
static size_t view_extent(kern_dtype dt, int64_t rows, int64_t cols, int64_t ld) {
    return rows > 0 ? (size_t)(rows - 1) * kern_dtype_bytes(dt, ld ? ld : cols) + kern_dtype_bytes(dt, cols) : 0;
}

/* llama.cpp's converter stores row i2*2 + half of a rotary head where HF
 * has row half*(hd/2) + i2: the HF row r of a q/k matrix lives in GGUF row
 * gguf_qk_row(r). */
static int64_t gguf_qk_row(int64_t r, int64_t hd) {
    int64_t head = r / hd, i = r % hd, half = i / (hd / 2), i2 = i % (hd / 2);
    return head * hd + 2 * i2 + half;
}

/* The GGUF block types a backend may keep as they are (kern_ops.upload_quantized).
 * Q5_0, Q5_1 and Q5_K have integer kernels only: kept when every
 * quantized matrix goes to them (act_q8 1 or 2), else widened to fp32. */
static int keepable_qtype(const model *m, weights_dtype d, kern_dtype *out) {
    int a8 = m->act_q8 == 1 || m->act_q8 == 2;
    switch (d) {
    case WEIGHTS_Q8_0: *out = KERN_Q8_0; return 1;
    case WEIGHTS_Q4_0: *out = KERN_Q4_0; return 1;
    case WEIGHTS_Q4_1: *out = KERN_Q4_1; return 1;
    case WEIGHTS_Q4_K: *out = KERN_Q4_K; return 1;
    case WEIGHTS_Q6_K: *out = KERN_Q6_K; return 1;
    case WEIGHTS_Q5_0: *out = KERN_Q5_0; return a8;
    case WEIGHTS_Q5_1: *out = KERN_Q5_1; return a8;
    case WEIGHTS_Q5_K: *out = KERN_Q5_K; return a8;
    default: return 0;
    }
}

/* Fetch `name`, check its full shape (rows, cols) — or a vector of length
 * cols when rows == 0 — and hand the slice rows [r0, r0+nr) x columns
 * [c0, c0+nc) to the backend. Row slices stay contiguous; column slices
 * become strided views (ld = cols), so no rank copies the full matrix.
 *
 * Quantized GGUF matrices stay quantized when the backend can read them
 * (kern_ops.upload_quantized; Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, and with 8-bit
 * activations Q5_0, Q5_1, Q5_K), the weights
 * are not fused, and a column slice starts and ends on a block boundary:
 * the blocks are uploaded from the mmap, or, for rows stored permuted (a Llama GGUF's
 * q/k, heads of permute_hd rows: whole rows, so moved as bytes), sit in a
 * copy the model owns. Otherwise quantized tensors, permuted rows and, with
 * fused weights, every tensor of a GGUF (which may mix dtypes within a
 * layer) are dequantized row by row into an fp32 copy of the slice that the
 * model owns. With m->quantize == KERN_Q8_0 (model_load_opts.quantize),
 * every other matrix whose slice is whole 32-blocks becomes a backend-owned
 * Q8_0 copy (not with fused weights: fuse_rows takes plain dtypes). */
static int load_slice_perm(model *m, const weights_set *ws, const char *name, int64_t rows, int64_t cols,
                           int64_t r0, int64_t nr, int64_t c0, int64_t nc, int64_t permute_hd, kern_weight *out,
                           char *err, size_t errlen) {
    if (m->random) return random_slice(m, name, rows, cols, r0, nr, c0, nc, out, err, errlen);
    const weights_tensor *t;
    int64_t shape[2] = {rows, cols};
    int ndim = rows ? 2 : 1;
    if (weights_get(ws, name, ndim, rows ? shape : shape + 1, &t, err, errlen)) return -1;
    kern_weight host = {t->data, KERN_F32, rows ? nr : 1, nc, cols};
    kern_dtype qdt;
    if (can_quantize(m, rows) && keepable_qtype(m, t->dtype, &qdt) && c0 % kern_dtype_block(qdt) == 0 &&
        nc % kern_dtype_block(qdt) == 0) {
        size_t row_bytes = kern_dtype_bytes(qdt, cols), off = kern_dtype_bytes(qdt, c0);
        size_t slice_bytes = kern_dtype_bytes(qdt, nc);
        char *buf = NULL;
        if (permute_hd > 0) {
            buf = malloc((size_t)host.rows * slice_bytes + 1);
            if (!buf || own(m, buf)) {
                free(buf);
                snprintf(err, errlen, "%s: out of memory for %lld permuted rows", name, (long long)host.rows);
                return -1;
            }
            for (int64_t i = 0; i < host.rows; i++)
                memcpy(buf + (size_t)i * slice_bytes,
                       (const char *)t->data + (size_t)gguf_qk_row(r0 + i, permute_hd) * row_bytes + off, slice_bytes);
            host = (kern_weight){buf, qdt, host.rows, nc, 0};
        } else {
            host = (kern_weight){(const char *)t->data + (size_t)r0 * row_bytes + off, qdt, host.rows, nc, cols};
        }
        kern_dtype to = m->act_q8 == 3 ? (qdt == KERN_Q8_0 ? KERN_Q8_0_A8 : qdt) : m->act_q8 ? kern_dtype_a8(qdt) : qdt;
        if (upload_q(m, &host, to, out)) {
            snprintf(err, errlen, "%s: %s", name, kern_last_error(m->be));
            return -1;
        }
        after_upload(m, ws, host.data, view_extent(qdt, host.rows, nc, host.ld), buf, out);
        m->weight_bytes += (size_t)host.rows * slice_bytes;
        return 0;
    }
    int quant = to_q8(m, rows, c0, nc);
    kern_dtype q8 = q8_dtype(m);
    /* Fused weights need one dtype per group, and a GGUF may mix them. */
    if (weights_dtype_is_quantized(t->dtype) || permute_hd > 0 || (m->gguf && m->fused && t->dtype != WEIGHTS_F32)) {
        float *row = malloc((size_t)cols * sizeof *row);
        float *buf = malloc((size_t)host.rows * (size_t)nc * sizeof *buf);
        if (!row || !buf || (!quant && own(m, buf))) {
            free(row);
            free(buf);
            snprintf(err, errlen, "%s: out of memory dequantizing %lld x %lld", name, (long long)host.rows,
                     (long long)nc);
            return -1;
        }
        for (int64_t i = 0; i < host.rows; i++) {
            int64_t src = r0 + i;
            if (permute_hd > 0) src = gguf_qk_row(src, permute_hd);
            if (weights_read_rows_f32(t, src, 1, row, err, errlen)) {
                free(row);
                if (quant) free(buf);
                return -1;
            }
            memcpy(buf + i * nc, row + c0, (size_t)nc * sizeof *row);
        }
        free(row);
        host = (kern_weight){buf, KERN_F32, host.rows, nc, 0};
        int rc = quant ? upload_q(m, &host, q8, out)
                       : m->ops->upload_weight(m->be, &host, out);
        if (quant) free(buf); /* the backend made its own Q8_0 copy */
        if (rc) {
            snprintf(err, errlen, "%s: %s", name, kern_last_error(m->be));
            return -1;
        }
        if (!quant) after_upload(m, ws, buf, 0, buf, out);
        m->weight_bytes += quant ? (size_t)host.rows * kern_dtype_bytes(KERN_Q8_0, nc)
                                 : (size_t)host.rows * (size_t)nc * sizeof(float);
        return 0;
    }
    if (to_kern_dtype(t->dtype, &host.dtype)) {
        snprintf(err, errlen, "%s: dtype %s not supported", name, weights_dtype_name(t->dtype));
        return -1;
    }
    size_t es = kern_dtype_size(host.dtype);
    host.data = (const char *)t->data + ((size_t)r0 * (size_t)cols + (size_t)c0) * es;
    if (quant ? upload_q(m, &host, q8, out) : m->ops->upload_weight(m->be, &host, out)) {
        snprintf(err, errlen, "%s: %s", name, kern_last_error(m->be));
        return -1;
    }
    after_upload(m, ws, host.data, view_extent(host.dtype, host.rows, nc, host.ld), NULL, out);
    m->weight_bytes += quant ? (size_t)host.rows * kern_dtype_bytes(KERN_Q8_0, nc) : (size_t)host.rows * (size_t)nc * es;
    return 0;
}

static int load_slice(model *m, const weights_set *ws, const char *name, int64_t rows, int64_t cols, int64_t r0,
                      int64_t nr, int64_t c0, int64_t nc, kern_weight *out, char *err, size_t errlen) {
    return load_slice_perm(m, ws, name, rows, cols, r0, nr, c0, nc, 0, out, err, errlen);
}

static int load_full(model *m, const weights_set *ws, const char *name, int64_t rows, int64_t cols, kern_weight *out,
                     char *err, size_t errlen) {
    return load_slice(m, ws, name, rows, cols, 0, rows, 0, cols, out, err, errlen);
}

/* Replace the weights parts[0..n) (this rank's slices, each uploaded on
 * its own) by one fused owner `out` holding their rows in order, and make
 * each part a dense view of its rows inside it: the separate uploads are
 * released, so the bytes held (weight_bytes) do not change, and every
 * caller of the parts (steps of n > 1 tokens) reads the same values as
 * before. On failure the parts are untouched (model_free releases them). */
static int fuse_group(model *m, const char *layer, kern_weight *const *parts, int n, kern_weight *out, char *err,
                      size_t errlen) {
    const kern_weight *in[3];
    if (n > 3) {
        snprintf(err, errlen, "%s: cannot fuse %d weights (3 at most)", layer, n);
        return -1;
    }
    for (int i = 0; i < n; i++) in[i] = parts[i];
    if (m->ops->fuse_rows(m->be, in, n, out)) {
        snprintf(err, errlen, "%s: fusing weights: %s", layer, kern_last_error(m->be));
        return -1;
    }
    size_t es = kern_dtype_size(out->dtype), row0 = 0;
    for (int i = 0; i < n; i++) {
        int64_t rows = parts[i]->rows;
        m->ops->free_weight(m->be, parts[i]);
        *parts[i] = (kern_weight){(const char *)out->data + row0 * (size_t)out->cols * es, out->dtype, rows,
                                  out->cols, 0};
        row0 += (size_t)rows;
    }
    return 0;
}

/* The options, the configuration and the checks that need no weights. */
static int load_setup(model *m, const char *dir, const model_load_opts *o, char *err, size_t errlen) {
    m->ops = o->ops;
    m->be = o->be;
    m->comm = o->comm;
    m->rank = o->rank;
    m->tp = o->tp;
    m->random = model_is_random(dir);
    m->fused = o->fuse_weights != 0;
    m->quantize = o->quantize;
    m->act_q8 = o->act_q8;
    if (m->act_q8 == 2 && !m->ops->upload_quantized) m->act_q8 = 0; /* auto: nothing to apply it to */
    if (m->act_q8 && !m->ops->upload_quantized) {
        snprintf(err, errlen, "8-bit activations (--act-quant q8_0): the %s backend does not keep Q8_0 weights (cpu does)",
                 m->ops->name);
        return -1;
    }
    if (m->random ? model_random_parse(dir, &m->cfg, &m->seed, err, errlen)
                  : model_config_load(dir, &m->cfg, err, errlen))
        return -1;
    if (model_config_rope_override(&m->cfg, o->rope_scaling, err, errlen)) return -1;
    if (!m->random && !o->ws) {
        snprintf(err, errlen, "%s: no opened checkpoint", dir);
        return -1;
    }
    if (model_check_tp(&m->cfg, o->tp, err, errlen)) return -1;
    if (o->rank < 0 || o->rank >= o->tp || (o->tp > 1 && !o->comm)) {
        snprintf(err, errlen, "rank %d of %d: bad rank or missing all-reduce endpoint", o->rank, o->tp);
        return -1;
    }
    if (o->kv_blocks <= 0 || o->kv_block_size <= 0) {
        snprintf(err, errlen, "KV cache needs at least one block (got %d blocks of %d)", o->kv_blocks, o->kv_block_size);
        return -1;
    }
    return 0;
}

/* This rank's share: heads, MLP columns, vocabulary rows, and the first
 * KV head it holds (*kv0); the per-layer arrays and the family. */
static int load_shard(model *m, const char *dir, int *kv0, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    int tp = m->tp, r = m->rank;
    m->hq = c->num_heads / tp;
    m->inter = c->intermediate_size / tp;
    /* KV heads: split when tp divides them, else each rank holds the one
     * head its query heads read (replicated across tp / num_kv_heads ranks). */
    if (c->num_kv_heads % tp == 0) {
        m->hkv = c->num_kv_heads / tp;
        *kv0 = r * m->hkv;
    } else {
        m->hkv = 1;
        *kv0 = r * c->num_kv_heads / tp;
    }
    int per = (c->vocab_size + tp - 1) / tp;
    per = (per + KERN_ROW_GROUP - 1) / KERN_ROW_GROUP * KERN_ROW_GROUP; /* a tied head is a row view of the embedding */
    m->vocab0 = r * per < c->vocab_size ? r * per : c->vocab_size;
    m->vocab_n = m->vocab0 + per <= c->vocab_size ? per : c->vocab_size - m->vocab0;
    m->layers = calloc((size_t)c->num_layers, sizeof *m->layers);
    m->kc = calloc((size_t)c->num_layers, sizeof *m->kc);
    m->vc = calloc((size_t)c->num_layers, sizeof *m->vc);
    if (!m->layers || !m->kc || !m->vc) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    m->fam = model_family_find(c->arch);
    if (!m->fam || model_pass_sites(c) < 1) { /* a family row without its blocks: no pass */
        snprintf(err, errlen, "%s: no model family '%s'", dir, c->arch ? c->arch : "(none)");
        return -1;
    }
    return 0;
}

/* The embedding, the final norm and the head (a view of the embedding
 * when tied). */
static int load_ends(model *m, const weights_set *ws, char *err, size_t errlen) {
    int64_t H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    char name[256];
    tensor_name(m, T_EMBED, 0, name, sizeof name);
    if (load_full(m, ws, name, V, H, &m->embed, err, errlen)) return -1;
    m->embed_bytes = m->weight_bytes;
    tensor_name(m, T_NORM, 0, name, sizeof name);
    if (load_full(m, ws, name, 0, H, &m->norm, err, errlen)) return -1;
    if (m->cfg.tie_word_embeddings) {
        /* A tied head is a view of the embedding rows this rank holds (the
         * same tensor, loaded the same way): one copy on any backend. */
        const kern_weight *e = &m->embed;
        size_t off = kern_dtype_bytes(e->dtype, m->vocab0 * (e->ld ? e->ld : H));
        m->head_is_view = 1;
        if (m->vocab_n > 0) m->lm_head = (kern_weight){(const char *)e->data + off, e->dtype, m->vocab_n, H, e->ld};
        return 0;
    }
    tensor_name(m, T_HEAD, 0, name, sizeof name);
    if (m->vocab_n > 0 && load_slice(m, ws, name, V, H, m->vocab0, m->vocab_n, 0, H, &m->lm_head, err, errlen))
        return -1;
    return 0;
}

/* Every layer's slices of this rank, fused per group with --fuse-weights. */
static int load_layers(model *m, const weights_set *ws, int kv0, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    char name[256];
    int64_t H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int64_t qd = (int64_t)c->num_heads * hd, kvd = (int64_t)c->num_kv_heads * hd;
    int64_t q0 = (int64_t)m->rank * m->hq * hd, k0 = (int64_t)kv0 * hd, i0 = (int64_t)m->rank * m->inter;
    int64_t qn = (int64_t)m->hq * hd, kn = (int64_t)m->hkv * hd, in = m->inter;
    /* A Llama GGUF stores q/k rows with the rotary halves interleaved. */
    int64_t perm = m->gguf && m->fam->gguf_permute_qk ? hd : 0;
    for (int l = 0; l < c->num_layers; l++) {
        layer_w *L = &m->layers[l];
        struct {
            tkind kind;
            int64_t rows, cols, r0, nr, c0, nc, perm;
            kern_weight *w;
        } spec[] = {
            {T_ATTN_NORM, 0, H, 0, 1, 0, H, 0, &L->attn_norm},
            {T_Q, qd, H, q0, qn, 0, H, perm, &L->wq},
            {T_K, kvd, H, k0, kn, 0, H, perm, &L->wk},
            {T_V, kvd, H, k0, kn, 0, H, 0, &L->wv},
            {T_O, H, qd, 0, H, q0, qn, 0, &L->wo},
            {T_MLP_NORM, 0, H, 0, 1, 0, H, 0, &L->mlp_norm},
            {T_GATE, I, H, i0, in, 0, H, 0, &L->wg},
            {T_UP, I, H, i0, in, 0, H, 0, &L->wu},
            {T_DOWN, H, I, 0, H, i0, in, 0, &L->wd},
            /* optional per family: q/k norms, q/k/v biases (slices of the
             * vectors: a 1 x n "matrix" sliced by columns) */
            {T_QN, 0, hd, 0, 1, 0, hd, 0, &L->q_norm},
            {T_KN, 0, hd, 0, 1, 0, hd, 0, &L->k_norm},
            {T_BQ, 0, qd, 0, 1, q0, qn, 0, &L->bq},
            {T_BK, 0, kvd, 0, 1, k0, kn, 0, &L->bk},
            {T_BV, 0, kvd, 0, 1, k0, kn, 0, &L->bv},
        };
        for (size_t i = 0; i < sizeof spec / sizeof *spec; i++) {
            if ((spec[i].kind == T_QN || spec[i].kind == T_KN) && !c->qk_norm) continue;
            if ((spec[i].kind == T_BQ || spec[i].kind == T_BK || spec[i].kind == T_BV) && !c->qkv_bias) continue;
            tensor_name(m, spec[i].kind, l, name, sizeof name);
            if (load_slice_perm(m, ws, name, spec[i].rows, spec[i].cols, spec[i].r0, spec[i].nr, spec[i].c0,
                                spec[i].nc, spec[i].perm, spec[i].w, err, errlen))
                return -1;
        }
        if (m->fused) {
            snprintf(name, sizeof name, "model.layers.%d", l);
            if (fuse_group(m, name, (kern_weight *[]){&L->wq, &L->wk, &L->wv}, 3, &L->wqkv, err, errlen) ||
                fuse_group(m, name, (kern_weight *[]){&L->wg, &L->wu}, 2, &L->wgu, err, errlen))
                return -1;
        }
    }
    return 0;
}

/* The KV cache of every layer, in the resolved cache type, and an empty
 * store: the backend refuses a cache type it does not implement now, at
 * start-up, rather than at the first step. */
static int load_kv(model *m, const model_load_opts *o, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    int64_t hd = c->head_dim;
    m->kv_blocks = o->kv_blocks;
    m->kv_block_size = o->kv_block_size;
    m->kv_dtype = kern_kv_resolve(m->ops, o->kv_dtype);
    const char *why = kern_kv_invalid(m->kv_dtype, (int)hd);
    if (why) {
        snprintf(err, errlen, "--kv-cache-dtype %s: %s (this model's head_dim is %d)", kern_kv_dtype_name(m->kv_dtype),
                 why, (int)hd);
        return -1;
    }
    size_t kv_layer = (size_t)o->kv_blocks * o->kv_block_size * kern_kv_row_bytes(m->kv_dtype, m->hkv, (int)hd);
    for (int l = 0; l < c->num_layers; l++) {
        m->kc[l] = m->ops->alloc_kv ? m->ops->alloc_kv(m->be, kv_layer) : m->ops->alloc(m->be, kv_layer);
        m->vc[l] = m->ops->alloc_kv ? m->ops->alloc_kv(m->be, kv_layer) : m->ops->alloc(m->be, kv_layer);
        if (!m->kc[l] || !m->vc[l]) {
            snprintf(err, errlen, "out of memory for the KV cache (%d blocks of %d tokens: %zu bytes per layer)",
                     o->kv_blocks, o->kv_block_size, 2 * kv_layer);
            return -1;
        }
    }
    if (c->num_layers > 0 && m->ops->kv_store(m->be, m->kc[0], m->vc[0], NULL, NULL, NULL, 0, m->hkv, (int)hd, m->kv_dtype)) {
        snprintf(err, errlen, "--kv-cache-dtype %s: %s", kern_kv_dtype_name(m->kv_dtype), kern_last_error(m->be));
        return -1;
    }
    return 0;
}

int model_load(const char *dir, const model_load_opts *o, model **out, char *err, size_t errlen) {
    model *m = calloc(1, sizeof *m);
    *out = NULL;
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int kv0 = 0;
    if (load_setup(m, dir, o, err, errlen) || load_shard(m, dir, &kv0, err, errlen)) goto fail;
    m->gguf = o->ws && weights_is_gguf(o->ws);
    if (load_ends(m, o->ws, err, errlen) || load_layers(m, o->ws, kv0, err, errlen)) goto fail;
    if (m->act_q8 != 2 && m->act_q8 && !m->n_act_q8) {
        snprintf(err, errlen, "8-bit activations (--act-quant q8_0): no Q8_0 matrix (nor Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K) to apply "
                 "them to on this rank; they come from a GGUF's or --quantize q8_0 (not with fused weights)");
        goto fail;
    }
    if (load_kv(m, o, err, errlen)) goto fail;
    *out = m;
    return 0;
fail:
    model_free(m);
    return -1;
}

void model_free(model *m) {
    if (!m) return;
    if (m->ops) {
        model_priv_scratch_free(m);
        for (int l = 0; m->kc && l < m->cfg.num_layers; l++) {
            size_t kv_layer = (size_t)m->kv_blocks * m->kv_block_size *
                              kern_kv_row_bytes(m->kv_dtype, m->hkv, m->cfg.head_dim);
            void *kv[2] = {m->kc[l], m->vc[l]};
            for (int j = 0; j < 2; j++)
                if (kv[j] && m->ops->free_kv) m->ops->free_kv(m->be, kv[j], kv_layer);
                else if (kv[j]) m->ops->free(m->be, kv[j]);
        }
        /* free_weight is a no-op for views the backend aliases (cpu). */
        if (m->layers) {
            for (int l = 0; l < m->cfg.num_layers; l++) {
                layer_w *L = &m->layers[l];
                /* views into the fused owners: only the owners are freed */
                if (L->wqkv.data) L->wq.data = L->wk.data = L->wv.data = NULL;
                if (L->wgu.data) L->wg.data = L->wu.data = NULL;
                kern_weight *w = (kern_weight *)L;
                for (size_t i = 0; i < sizeof(layer_w) / sizeof(kern_weight); i++)
                    if (w[i].data) m->ops->free_weight(m->be, &w[i]);
            }
        }
        if (m->lm_head.data && !m->head_is_view) m->ops->free_weight(m->be, &m->lm_head);
        if (m->embed.data) m->ops->free_weight(m->be, &m->embed);
        if (m->norm.data) m->ops->free_weight(m->be, &m->norm);
    }
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->kc);
    free(m->vc);
    free(m->layers);
    free(m);
}
