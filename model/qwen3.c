/*
 * model/: Qwen3 weights and forward pass over the kernels/ op table.
 *
 * One forward call processes `n` new tokens of one sequence:
 *   x = embed(ids)
 *   per layer: h = rmsnorm(x); q,k,v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ;
 *              q,k = rmsnorm per head (q_norm, k_norm); rope(q), rope(k);
 *              append k,v to the cache; a = attention(q, cache);
 *              x += a·Woᵀ                       <- row-parallel all-reduce site 2l
 *              h = rmsnorm(x); x += (silu(h·Wgᵀ) * h·Wuᵀ)·Wdᵀ   <- site 2l+1
 *   logits = rmsnorm(x)·Wlmᵀ (Wlm = embed when tied)
 * The two marked adds are where tensor parallelism puts its all-reduces
 * (engine/ + comm/); here, with one rank, they are plain adds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "weights/weights.h"

typedef struct layer_w {
    kern_weight attn_norm; /* (1, hidden) */
    kern_weight wq;        /* (hq*hd, hidden) */
    kern_weight wk;        /* (hkv*hd, hidden) */
    kern_weight wv;        /* (hkv*hd, hidden) */
    kern_weight wo;        /* (hidden, hq*hd) */
    kern_weight q_norm;    /* (1, hd) */
    kern_weight k_norm;    /* (1, hd) */
    kern_weight mlp_norm;  /* (1, hidden) */
    kern_weight wg;        /* (inter, hidden) */
    kern_weight wu;        /* (inter, hidden) */
    kern_weight wd;        /* (hidden, inter) */
} layer_w;

/* Activation scratch for up to `cap` tokens per forward call. */
typedef struct scratch {
    int cap;
    void *x;      /* (cap, hidden) residual stream */
    void *h;      /* (cap, hidden) normed input */
    void *q;      /* (cap, hq*hd) */
    void *k;      /* (cap, hkv*hd) */
    void *v;      /* (cap, hkv*hd) */
    void *att;    /* (cap, hq*hd) */
    void *o;      /* (cap, hidden) block output */
    void *gate;   /* (cap, inter) */
    void *up;     /* (cap, inter) */
    void *logits; /* (logits_cap, vocab): only rows whose logits are wanted */
    int logits_cap;
} scratch;

struct model {
    model_config cfg;
    const kern_ops *ops;
    kern_backend *be;
    weights_set *ws;
    kern_weight embed;   /* (vocab, hidden) */
    kern_weight norm;    /* (1, hidden) */
    kern_weight lm_head; /* (vocab, hidden); aliases embed when tied */
    layer_w *layers;     /* [num_layers] */
    scratch sc;
};

struct model_seq {
    model *m;
    int capacity, len;
    void **k, **v; /* [num_layers] each (capacity, hkv*hd) */
};

const model_config *model_get_config(const model *m) { return &m->cfg; }

static int to_kern_dtype(weights_dtype d, kern_dtype *out) {
    switch (d) {
    case WEIGHTS_F32: *out = KERN_F32; return 0;
    case WEIGHTS_F16: *out = KERN_F16; return 0;
    case WEIGHTS_BF16: *out = KERN_BF16; return 0;
    default: return -1;
    }
}

/* Fetch `name` with the expected shape (rows, cols), or a 1-D vector of
 * length cols when rows == 0, and hand it to the backend. */
static int load_w(model *m, const char *name, int64_t rows, int64_t cols, kern_weight *out, char *err,
                  size_t errlen) {
    const weights_tensor *t;
    int64_t shape[2] = {rows, cols};
    int ndim = rows ? 2 : 1;
    if (weights_get(m->ws, name, ndim, rows ? shape : shape + 1, &t, err, errlen)) return -1;
    kern_weight host = {t->data, KERN_F32, rows ? rows : 1, cols};
    if (to_kern_dtype(t->dtype, &host.dtype)) {
        snprintf(err, errlen, "%s: dtype %s not supported", name, weights_dtype_name(t->dtype));
        return -1;
    }
    if (m->ops->upload_weight(m->be, &host, out)) {
        snprintf(err, errlen, "%s: %s", name, kern_last_error(m->be));
        return -1;
    }
    return 0;
}

static void scratch_free(model *m) {
    void **bufs[] = {&m->sc.x, &m->sc.h, &m->sc.q, &m->sc.k, &m->sc.v, &m->sc.att,
                     &m->sc.o, &m->sc.gate, &m->sc.up, &m->sc.logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        if (*bufs[i]) m->ops->free(m->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    m->sc.cap = 0;
    m->sc.logits_cap = 0;
}

/* Grow the scratch to hold `n` tokens of which `rows` want logits; sizes at
 * least double so a prefill followed by decodes does not reallocate. The
 * logits buffer is sized separately: a 2048-token prefill of a 152k vocabulary
 * needs one row, not 1.2 GB. */
static int scratch_reserve(model *m, int n, int rows, char *err, size_t errlen) {
    if (n <= m->sc.cap && rows <= m->sc.logits_cap) return 0;
    int cap = n <= m->sc.cap ? m->sc.cap : (m->sc.cap * 2 > n ? m->sc.cap * 2 : n);
    if (rows < m->sc.logits_cap) rows = m->sc.logits_cap;
    const model_config *c = &m->cfg;
    size_t es = kern_dtype_size(m->ops->act_dtype);
    size_t qd = (size_t)c->num_heads * c->head_dim, kvd = (size_t)c->num_kv_heads * c->head_dim;
    scratch_free(m);
    m->sc.x = m->ops->alloc(m->be, (size_t)cap * c->hidden_size * es);
    m->sc.h = m->ops->alloc(m->be, (size_t)cap * c->hidden_size * es);
    m->sc.q = m->ops->alloc(m->be, (size_t)cap * qd * es);
    m->sc.k = m->ops->alloc(m->be, (size_t)cap * kvd * es);
    m->sc.v = m->ops->alloc(m->be, (size_t)cap * kvd * es);
    m->sc.att = m->ops->alloc(m->be, (size_t)cap * qd * es);
    m->sc.o = m->ops->alloc(m->be, (size_t)cap * c->hidden_size * es);
    m->sc.gate = m->ops->alloc(m->be, (size_t)cap * c->intermediate_size * es);
    m->sc.up = m->ops->alloc(m->be, (size_t)cap * c->intermediate_size * es);
    m->sc.logits = m->ops->alloc(m->be, (size_t)rows * c->vocab_size * es);
    if (!m->sc.x || !m->sc.h || !m->sc.q || !m->sc.k || !m->sc.v || !m->sc.att || !m->sc.o || !m->sc.gate ||
        !m->sc.up || !m->sc.logits) {
        scratch_free(m);
        snprintf(err, errlen, "out of memory for activations of %d tokens", cap);
        return -1;
    }
    m->sc.cap = cap;
    m->sc.logits_cap = rows;
    return 0;
}

int model_load(const char *dir, const kern_ops *ops, kern_backend *be, model **out, char *err, size_t errlen) {
    model *m = calloc(1, sizeof *m);
    char name[256];
    *out = NULL;
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    m->ops = ops;
    m->be = be;
    if (model_config_load(dir, &m->cfg, err, errlen)) goto fail;
    if (weights_open(dir, &m->ws, err, errlen)) goto fail;
    const model_config *c = &m->cfg;
    int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, hd = c->head_dim;
    int64_t qd = (int64_t)c->num_heads * hd, kvd = (int64_t)c->num_kv_heads * hd;
    m->layers = calloc((size_t)c->num_layers, sizeof *m->layers);
    if (!m->layers) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (load_w(m, "model.embed_tokens.weight", V, H, &m->embed, err, errlen) ||
        load_w(m, "model.norm.weight", 0, H, &m->norm, err, errlen))
        goto fail;
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else if (load_w(m, "lm_head.weight", V, H, &m->lm_head, err, errlen)) {
        goto fail;
    }
    for (int l = 0; l < c->num_layers; l++) {
        layer_w *L = &m->layers[l];
        struct {
            const char *suffix;
            int64_t rows, cols;
            kern_weight *w;
        } spec[] = {
            {"input_layernorm.weight", 0, H, &L->attn_norm},
            {"self_attn.q_proj.weight", qd, H, &L->wq},
            {"self_attn.k_proj.weight", kvd, H, &L->wk},
            {"self_attn.v_proj.weight", kvd, H, &L->wv},
            {"self_attn.o_proj.weight", H, qd, &L->wo},
            {"self_attn.q_norm.weight", 0, hd, &L->q_norm},
            {"self_attn.k_norm.weight", 0, hd, &L->k_norm},
            {"post_attention_layernorm.weight", 0, H, &L->mlp_norm},
            {"mlp.gate_proj.weight", I, H, &L->wg},
            {"mlp.up_proj.weight", I, H, &L->wu},
            {"mlp.down_proj.weight", H, I, &L->wd},
        };
        for (size_t i = 0; i < sizeof spec / sizeof *spec; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, spec[i].suffix);
            if (load_w(m, name, spec[i].rows, spec[i].cols, spec[i].w, err, errlen)) goto fail;
        }
    }
    *out = m;
    return 0;
fail:
    model_free(m);
    return -1;
}

void model_free(model *m) {
    if (!m) return;
    if (m->ops) {
        scratch_free(m);
        /* free_weight is a no-op for views the backend aliases (cpu). */
        if (m->layers) {
            for (int l = 0; l < m->cfg.num_layers; l++) {
                kern_weight *w = (kern_weight *)&m->layers[l];
                for (size_t i = 0; i < sizeof(layer_w) / sizeof(kern_weight); i++)
                    if (w[i].data) m->ops->free_weight(m->be, &w[i]);
            }
        }
        if (m->lm_head.data && m->lm_head.data != m->embed.data) m->ops->free_weight(m->be, &m->lm_head);
        if (m->embed.data) m->ops->free_weight(m->be, &m->embed);
        if (m->norm.data) m->ops->free_weight(m->be, &m->norm);
    }
    free(m->layers);
    weights_close(m->ws);
    free(m);
}

int model_seq_create(model *m, int capacity, model_seq **out, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    *out = NULL;
    if (capacity <= 0 || capacity > c->max_position_embeddings) {
        snprintf(err, errlen, "sequence capacity %d out of range [1, %d] (max_position_embeddings)", capacity,
                 c->max_position_embeddings);
        return -1;
    }
    model_seq *s = calloc(1, sizeof *s);
    size_t bytes = (size_t)capacity * c->num_kv_heads * c->head_dim * kern_dtype_size(m->ops->act_dtype);
    if (!s || !(s->k = calloc((size_t)c->num_layers, sizeof *s->k)) ||
        !(s->v = calloc((size_t)c->num_layers, sizeof *s->v)))
        goto oom;
    s->m = m;
    s->capacity = capacity;
    for (int l = 0; l < c->num_layers; l++) {
        s->k[l] = m->ops->alloc(m->be, bytes);
        s->v[l] = m->ops->alloc(m->be, bytes);
        if (!s->k[l] || !s->v[l]) goto oom;
    }
    *out = s;
    return 0;
oom:
    snprintf(err, errlen, "out of memory for a KV cache of %d tokens (%zu bytes per layer)", capacity, 2 * bytes);
    model_seq_free(s);
    return -1;
}

void model_seq_free(model_seq *s) {
    if (!s) return;
    for (int l = 0; s->k && l < s->m->cfg.num_layers; l++) {
        if (s->k[l]) s->m->ops->free(s->m->be, s->k[l]);
        if (s->v[l]) s->m->ops->free(s->m->be, s->v[l]);
    }
    free(s->k);
    free(s->v);
    free(s);
}

int model_seq_len(const model_seq *s) { return s->len; }
void model_seq_reset(model_seq *s) { s->len = 0; }

/* Byte offset helper for activation buffers. */
static void *act_at(const model *m, void *base, size_t elems) {
    return (char *)base + elems * kern_dtype_size(m->ops->act_dtype);
}

#define OP(call)                                                                                     \
    do {                                                                                             \
        if ((call) != 0) {                                                                           \
            snprintf(err, errlen, "%s backend: %s", ops->name, kern_last_error(be));                 \
            goto fail;                                                                               \
        }                                                                                            \
    } while (0)

int model_forward(model *m, model_seq *s, const int32_t *ids, int n, model_logits_mode mode, float *logits,
                  char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    const kern_ops *ops = m->ops;
    kern_backend *be = m->be;
    int32_t *pos = NULL;
    if (n <= 0) {
        snprintf(err, errlen, "forward: no tokens");
        return -1;
    }
    if (n > s->capacity - s->len) {
        snprintf(err, errlen, "forward: %d tokens do not fit: sequence holds %d of %d", n, s->len, s->capacity);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= c->vocab_size) {
            snprintf(err, errlen, "forward: token id %d out of range [0, %d)", ids[i], c->vocab_size);
            return -1;
        }
    }
    /* Only the rows whose logits are wanted go through the final norm and
     * the (vocab-sized, expensive) lm_head. */
    const int first = mode == MODEL_LOGITS_ALL ? 0 : n - 1, rows = n - first;
    if (scratch_reserve(m, n, rows, err, errlen)) return -1;
    pos = malloc((size_t)n * sizeof *pos);
    if (!pos) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) pos[i] = s->len + i;

    const int H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    const int hq = c->num_heads, hkv = c->num_kv_heads, kvd = hkv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    scratch *sc = &m->sc;

    OP(ops->embedding(be, sc->x, &m->embed, ids, n));
    for (int l = 0; l < c->num_layers; l++) {
        const layer_w *L = &m->layers[l];
        /* attention block */
        OP(ops->rmsnorm(be, sc->h, sc->x, &L->attn_norm, n, H, c->rms_norm_eps));
        OP(ops->matmul(be, sc->q, sc->h, &L->wq, n));
        OP(ops->matmul(be, sc->k, sc->h, &L->wk, n));
        OP(ops->matmul(be, sc->v, sc->h, &L->wv, n));
        OP(ops->rmsnorm(be, sc->q, sc->q, &L->q_norm, n * hq, hd, c->rms_norm_eps));
        OP(ops->rmsnorm(be, sc->k, sc->k, &L->k_norm, n * hkv, hd, c->rms_norm_eps));
        OP(ops->rope(be, sc->q, pos, n, hq, hd, c->rope_theta));
        OP(ops->rope(be, sc->k, pos, n, hkv, hd, c->rope_theta));
        OP(ops->copy(be, act_at(m, s->k[l], (size_t)s->len * kvd), sc->k, (size_t)n * kvd));
        OP(ops->copy(be, act_at(m, s->v[l], (size_t)s->len * kvd), sc->v, (size_t)n * kvd));
        OP(ops->attention(be, sc->att, sc->q, s->k[l], s->v[l], n, s->len, hq, hkv, hd, scale));
        OP(ops->matmul(be, sc->o, sc->att, &L->wo, n));
        OP(ops->add(be, sc->x, sc->o, (size_t)n * H));
        /* MLP block */
        OP(ops->rmsnorm(be, sc->h, sc->x, &L->mlp_norm, n, H, c->rms_norm_eps));
        OP(ops->matmul(be, sc->gate, sc->h, &L->wg, n));
        OP(ops->matmul(be, sc->up, sc->h, &L->wu, n));
        OP(ops->silu_mul(be, sc->gate, sc->gate, sc->up, (size_t)n * I));
        OP(ops->matmul(be, sc->o, sc->gate, &L->wd, n));
        OP(ops->add(be, sc->x, sc->o, (size_t)n * H));
    }
    OP(ops->rmsnorm(be, sc->h, act_at(m, sc->x, (size_t)first * H), &m->norm, rows, H, c->rms_norm_eps));
    OP(ops->matmul(be, sc->logits, sc->h, &m->lm_head, rows));
    OP(ops->to_host_f32(be, logits, sc->logits, (size_t)rows * c->vocab_size));
    s->len += n;
    free(pos);
    return 0;
fail:
    free(pos);
    return -1;
}
