/*
 * model/: Qwen3 weights and forward pass over the kernels/ op table.
 *
 * One forward call processes `n` new tokens of one sequence:
 *   x = embed(ids)
 *   per layer: h = rmsnorm(x); q,k,v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ;
 *              q,k = rmsnorm per head (q_norm, k_norm); rope(q), rope(k);
 *              append k,v to the cache; a = attention(q, cache);
 *              x += allreduce(a·Woᵀ)                        site 2l
 *              h = rmsnorm(x); x += allreduce((silu(h·Wgᵀ) * h·Wuᵀ)·Wdᵀ)   site 2l+1
 *   logits = rmsnorm(x)·Wlmᵀ (Wlm = embed when tied)
 * Megatron-style tensor parallelism: each rank holds its query/KV heads and
 * intermediate rows, so a·Woᵀ and the MLP output are partial sums that the
 * all-reduce (comm/, Echo) completes. With one rank there is nothing to
 * reduce. The residual stream x is replicated and bit-identical on every rank
 * because every all-reduce returns bit-identical replicas.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

typedef struct layer_w {
    kern_weight attn_norm; /* (1, hidden) */
    kern_weight wq;        /* (hq_local*hd, hidden)   rows of this rank's heads */
    kern_weight wk;        /* (hkv_local*hd, hidden) */
    kern_weight wv;        /* (hkv_local*hd, hidden) */
    kern_weight wo;        /* (hidden, hq_local*hd)   column slice, ld = hq*hd */
    kern_weight q_norm;    /* (1, hd) */
    kern_weight k_norm;    /* (1, hd) */
    kern_weight mlp_norm;  /* (1, hidden) */
    kern_weight wg;        /* (inter_local, hidden) */
    kern_weight wu;        /* (inter_local, hidden) */
    kern_weight wd;        /* (hidden, inter_local)   column slice, ld = inter */
} layer_w;

/* Activation scratch for up to `cap` tokens per forward call. */
typedef struct scratch {
    int cap;
    void *x;      /* (cap, hidden) residual stream (replicated on every rank) */
    void *h;      /* (cap, hidden) normed input */
    void *q;      /* (cap, hq_local*hd) */
    void *k;      /* (cap, hkv_local*hd) */
    void *v;      /* (cap, hkv_local*hd) */
    void *att;    /* (cap, hq_local*hd) */
    void *o;      /* (cap, hidden) block output (partial sum before all-reduce) */
    void *gate;   /* (cap, inter_local) */
    void *up;     /* (cap, inter_local) */
    void *logits; /* (logits_cap, vocab_local): only rows whose logits are wanted */
    int logits_cap;
    float *host;  /* (cap, hidden) host staging for layer states */
} scratch;

struct model {
    model_config cfg;
    const kern_ops *ops;
    kern_backend *be;
    echo_comm *comm;
    int rank, tp;
    int hq, hkv, inter;  /* this rank's query heads, KV heads, intermediate rows */
    int vocab0, vocab_n; /* this rank's vocabulary slice */
    kern_weight embed;   /* (vocab, hidden) replicated */
    kern_weight norm;    /* (1, hidden) */
    kern_weight lm_head; /* (vocab_n, hidden) rows of lm_head, or of embed when tied */
    layer_w *layers;     /* [num_layers] */
    size_t weight_bytes;
    int kv_blocks, kv_block_size;
    void **kc, **vc; /* [num_layers] each (kv_blocks*kv_block_size, hkv*hd) */
    scratch sc;
};

const model_config *model_get_config(const model *m) { return &m->cfg; }
size_t model_weight_bytes(const model *m) { return m->weight_bytes; }
size_t model_kv_bytes(const model *m) {
    return 2 * (size_t)m->cfg.num_layers * m->kv_blocks * m->kv_block_size * m->hkv * m->cfg.head_dim *
           kern_dtype_size(m->ops->act_dtype);
}
void model_vocab_slice(const model *m, int *first, int *count) {
    *first = m->vocab0;
    *count = m->vocab_n;
}

int model_check_tp(const model_config *c, int tp, char *err, size_t errlen) {
    if (tp < 1) {
        snprintf(err, errlen, "tensor parallel size %d must be >= 1", tp);
        return -1;
    }
    if (c->num_heads % tp) {
        snprintf(err, errlen, "--tp %d does not divide the %d attention heads", tp, c->num_heads);
        return -1;
    }
    if (c->num_kv_heads % tp && tp % c->num_kv_heads) {
        snprintf(err, errlen, "--tp %d neither divides nor is a multiple of the %d KV heads", tp, c->num_kv_heads);
        return -1;
    }
    if (c->intermediate_size % tp) {
        snprintf(err, errlen, "--tp %d does not divide intermediate_size %d", tp, c->intermediate_size);
        return -1;
    }
    if (tp > c->vocab_size) {
        snprintf(err, errlen, "--tp %d exceeds the vocabulary size %d", tp, c->vocab_size);
        return -1;
    }
    return 0;
}

static int to_kern_dtype(weights_dtype d, kern_dtype *out) {
    switch (d) {
    case WEIGHTS_F32: *out = KERN_F32; return 0;
    case WEIGHTS_F16: *out = KERN_F16; return 0;
    case WEIGHTS_BF16: *out = KERN_BF16; return 0;
    default: return -1;
    }
}

/* Fetch `name`, check its full shape (rows, cols) — or a vector of length
 * cols when rows == 0 — and hand the slice rows [r0, r0+nr) x columns
 * [c0, c0+nc) to the backend. Row slices stay contiguous; column slices
 * become strided views (ld = cols), so no rank copies the full matrix. */
static int load_slice(model *m, const weights_set *ws, const char *name, int64_t rows, int64_t cols, int64_t r0,
                      int64_t nr, int64_t c0, int64_t nc, kern_weight *out, char *err, size_t errlen) {
    const weights_tensor *t;
    int64_t shape[2] = {rows, cols};
    int ndim = rows ? 2 : 1;
    if (weights_get(ws, name, ndim, rows ? shape : shape + 1, &t, err, errlen)) return -1;
    kern_weight host = {t->data, KERN_F32, rows ? nr : 1, nc, cols};
    if (to_kern_dtype(t->dtype, &host.dtype)) {
        snprintf(err, errlen, "%s: dtype %s not supported", name, weights_dtype_name(t->dtype));
        return -1;
    }
    size_t es = kern_dtype_size(host.dtype);
    host.data = (const char *)t->data + ((size_t)r0 * (size_t)cols + (size_t)c0) * es;
    if (m->ops->upload_weight(m->be, &host, out)) {
        snprintf(err, errlen, "%s: %s", name, kern_last_error(m->be));
        return -1;
    }
    m->weight_bytes += (size_t)host.rows * (size_t)nc * es;
    return 0;
}

static int load_full(model *m, const weights_set *ws, const char *name, int64_t rows, int64_t cols, kern_weight *out,
                     char *err, size_t errlen) {
    return load_slice(m, ws, name, rows, cols, 0, rows, 0, cols, out, err, errlen);
}

static void scratch_free(model *m) {
    void **bufs[] = {&m->sc.x, &m->sc.h, &m->sc.q, &m->sc.k, &m->sc.v, &m->sc.att,
                     &m->sc.o, &m->sc.gate, &m->sc.up, &m->sc.logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        if (*bufs[i]) m->ops->free(m->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    free(m->sc.host);
    m->sc.host = NULL;
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
    if (rows < 1) rows = 1;
    const model_config *c = &m->cfg;
    size_t es = kern_dtype_size(m->ops->act_dtype);
    size_t qd = (size_t)m->hq * c->head_dim, kvd = (size_t)m->hkv * c->head_dim;
    scratch_free(m);
    m->sc.x = m->ops->alloc(m->be, (size_t)cap * c->hidden_size * es);
    m->sc.h = m->ops->alloc(m->be, (size_t)cap * c->hidden_size * es);
    m->sc.q = m->ops->alloc(m->be, (size_t)cap * qd * es);
    m->sc.k = m->ops->alloc(m->be, (size_t)cap * kvd * es);
    m->sc.v = m->ops->alloc(m->be, (size_t)cap * kvd * es);
    m->sc.att = m->ops->alloc(m->be, (size_t)cap * qd * es);
    m->sc.o = m->ops->alloc(m->be, (size_t)cap * c->hidden_size * es);
    m->sc.gate = m->ops->alloc(m->be, (size_t)cap * m->inter * es);
    m->sc.up = m->ops->alloc(m->be, (size_t)cap * m->inter * es);
    m->sc.logits = m->ops->alloc(m->be, (size_t)rows * m->vocab_n * es);
    m->sc.host = malloc((size_t)cap * c->hidden_size * sizeof(float));
    if (!m->sc.x || !m->sc.h || !m->sc.q || !m->sc.k || !m->sc.v || !m->sc.att || !m->sc.o || !m->sc.gate ||
        !m->sc.up || !m->sc.logits || !m->sc.host) {
        scratch_free(m);
        snprintf(err, errlen, "out of memory for activations of %d tokens", cap);
        return -1;
    }
    m->sc.cap = cap;
    m->sc.logits_cap = rows;
    return 0;
}

int model_load(const char *dir, const model_load_opts *o, model **out, char *err, size_t errlen) {
    model *m = calloc(1, sizeof *m);
    char name[256];
    *out = NULL;
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    m->ops = o->ops;
    m->be = o->be;
    m->comm = o->comm;
    m->rank = o->rank;
    m->tp = o->tp;
    if (model_config_load(dir, &m->cfg, err, errlen)) goto fail;
    const model_config *c = &m->cfg;
    if (model_check_tp(c, o->tp, err, errlen)) goto fail;
    if (o->rank < 0 || o->rank >= o->tp || (o->tp > 1 && !o->comm)) {
        snprintf(err, errlen, "rank %d of %d: bad rank or missing all-reduce endpoint", o->rank, o->tp);
        goto fail;
    }
    if (o->kv_blocks <= 0 || o->kv_block_size <= 0) {
        snprintf(err, errlen, "KV cache needs at least one block (got %d blocks of %d)", o->kv_blocks, o->kv_block_size);
        goto fail;
    }
    const weights_set *ws = o->ws;
    int tp = o->tp, r = o->rank;
    int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, hd = c->head_dim;
    int64_t qd = (int64_t)c->num_heads * hd, kvd = (int64_t)c->num_kv_heads * hd;
    m->hq = c->num_heads / tp;
    m->inter = c->intermediate_size / tp;
    /* KV heads: split when tp divides them, else each rank holds the one
     * head its query heads read (replicated across tp / num_kv_heads ranks). */
    int kv0;
    if (c->num_kv_heads % tp == 0) {
        m->hkv = c->num_kv_heads / tp;
        kv0 = r * m->hkv;
    } else {
        m->hkv = 1;
        kv0 = r * c->num_kv_heads / tp;
    }
    int per = (c->vocab_size + tp - 1) / tp;
    m->vocab0 = r * per < c->vocab_size ? r * per : c->vocab_size;
    m->vocab_n = m->vocab0 + per <= c->vocab_size ? per : c->vocab_size - m->vocab0;
    m->layers = calloc((size_t)c->num_layers, sizeof *m->layers);
    m->kc = calloc((size_t)c->num_layers, sizeof *m->kc);
    m->vc = calloc((size_t)c->num_layers, sizeof *m->vc);
    if (!m->layers || !m->kc || !m->vc) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (load_full(m, ws, "model.embed_tokens.weight", V, H, &m->embed, err, errlen) ||
        load_full(m, ws, "model.norm.weight", 0, H, &m->norm, err, errlen))
        goto fail;
    const char *head_name = c->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    size_t bytes_before_head = m->weight_bytes;
    if (m->vocab_n > 0 &&
        load_slice(m, ws, head_name, V, H, m->vocab0, m->vocab_n, 0, H, &m->lm_head, err, errlen))
        goto fail;
    /* A tied head reads rows of the embedding this rank already holds. */
    if (c->tie_word_embeddings) m->weight_bytes = bytes_before_head;
    int64_t q0 = (int64_t)r * m->hq * hd, k0 = (int64_t)kv0 * hd, i0 = (int64_t)r * m->inter;
    int64_t qn = (int64_t)m->hq * hd, kn = (int64_t)m->hkv * hd, in = m->inter;
    for (int l = 0; l < c->num_layers; l++) {
        layer_w *L = &m->layers[l];
        struct {
            const char *suffix;
            int64_t rows, cols, r0, nr, c0, nc;
            kern_weight *w;
        } spec[] = {
            {"input_layernorm.weight", 0, H, 0, 1, 0, H, &L->attn_norm},
            {"self_attn.q_proj.weight", qd, H, q0, qn, 0, H, &L->wq},
            {"self_attn.k_proj.weight", kvd, H, k0, kn, 0, H, &L->wk},
            {"self_attn.v_proj.weight", kvd, H, k0, kn, 0, H, &L->wv},
            {"self_attn.o_proj.weight", H, qd, 0, H, q0, qn, &L->wo},
            {"self_attn.q_norm.weight", 0, hd, 0, 1, 0, hd, &L->q_norm},
            {"self_attn.k_norm.weight", 0, hd, 0, 1, 0, hd, &L->k_norm},
            {"post_attention_layernorm.weight", 0, H, 0, 1, 0, H, &L->mlp_norm},
            {"mlp.gate_proj.weight", I, H, i0, in, 0, H, &L->wg},
            {"mlp.up_proj.weight", I, H, i0, in, 0, H, &L->wu},
            {"mlp.down_proj.weight", H, I, 0, H, i0, in, &L->wd},
        };
        for (size_t i = 0; i < sizeof spec / sizeof *spec; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, spec[i].suffix);
            if (load_slice(m, ws, name, spec[i].rows, spec[i].cols, spec[i].r0, spec[i].nr, spec[i].c0, spec[i].nc,
                           spec[i].w, err, errlen))
                goto fail;
        }
    }
    m->kv_blocks = o->kv_blocks;
    m->kv_block_size = o->kv_block_size;
    size_t kv_layer = (size_t)o->kv_blocks * o->kv_block_size * m->hkv * hd * kern_dtype_size(m->ops->act_dtype);
    for (int l = 0; l < c->num_layers; l++) {
        m->kc[l] = m->ops->alloc(m->be, kv_layer);
        m->vc[l] = m->ops->alloc(m->be, kv_layer);
        if (!m->kc[l] || !m->vc[l]) {
            snprintf(err, errlen, "out of memory for the KV cache (%d blocks of %d tokens: %zu bytes per layer)",
                     o->kv_blocks, o->kv_block_size, 2 * kv_layer);
            goto fail;
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
        for (int l = 0; m->kc && l < m->cfg.num_layers; l++) {
            if (m->kc[l]) m->ops->free(m->be, m->kc[l]);
            if (m->vc[l]) m->ops->free(m->be, m->vc[l]);
        }
        /* free_weight is a no-op for views the backend aliases (cpu). */
        if (m->layers) {
            for (int l = 0; l < m->cfg.num_layers; l++) {
                kern_weight *w = (kern_weight *)&m->layers[l];
                for (size_t i = 0; i < sizeof(layer_w) / sizeof(kern_weight); i++)
                    if (w[i].data) m->ops->free_weight(m->be, &w[i]);
            }
        }
        if (m->lm_head.data) m->ops->free_weight(m->be, &m->lm_head);
        if (m->embed.data) m->ops->free_weight(m->be, &m->embed);
        if (m->norm.data) m->ops->free_weight(m->be, &m->norm);
    }
    free(m->kc);
    free(m->vc);
    free(m->layers);
    free(m);
}

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

/* The end of a row-parallel block: every rank holds a partial sum of the
 * block output; all-reduce it (site = 2*layer + k) and add it to the
 * residual stream. With one rank there is nothing to reduce. */
static int block_out(model *m, int site, int n, char *err, size_t errlen) {
    const kern_ops *ops = m->ops;
    kern_backend *be = m->be;
    size_t count = (size_t)n * m->cfg.hidden_size;
    if (m->tp > 1) {
        echo_dtype dt = ops->act_dtype == KERN_F32 ? ECHO_F32 : ECHO_BF16;
        if (echo_allreduce(m->comm, site, m->sc.o, count, dt, NULL, err, errlen)) return -1;
    }
    OP(ops->add(be, m->sc.x, m->sc.o, count));
    return 0;
fail:
    return -1;
}

int model_forward(model *m, const model_batch *b, float *logits, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    const kern_ops *ops = m->ops;
    kern_backend *be = m->be;
    int32_t *pos = NULL, *slots = NULL;
    if (b->n_seqs <= 0 || b->q_start[0] != 0) {
        snprintf(err, errlen, "forward: empty or malformed batch");
        return -1;
    }
    const int n = b->q_start[b->n_seqs];
    if (n <= 0) {
        snprintf(err, errlen, "forward: no tokens");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size) {
            snprintf(err, errlen, "forward: token id %d out of range [0, %d)", b->tokens[i], c->vocab_size);
            return -1;
        }
    }
    for (int i = 0; i < b->n_logit_rows; i++) {
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= n) {
            snprintf(err, errlen, "forward: logits row %d outside the batch's %d tokens", b->logit_rows[i], n);
            return -1;
        }
    }
    if (scratch_reserve(m, n, b->n_logit_rows, err, errlen)) return -1;
    pos = malloc((size_t)n * sizeof *pos);
    slots = malloc((size_t)n * sizeof *slots);
    if (!pos || !slots) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    /* Positions and cache slots per token, checked against the block table
     * so a bad table is an error here, not a write into another sequence. */
    for (int s = 0; s < b->n_seqs; s++) {
        int q0 = b->q_start[s], q1 = b->q_start[s + 1];
        if (q1 < q0 || b->pos0[s] < 0 || b->pos0[s] + (q1 - q0) > b->max_blocks * m->kv_block_size) {
            snprintf(err, errlen, "forward: sequence %d does not fit its block table", s);
            goto fail;
        }
        for (int i = q0; i < q1; i++) {
            int p = b->pos0[s] + (i - q0);
            int blk = b->block_table[(size_t)s * b->max_blocks + p / m->kv_block_size];
            if (blk < 0 || blk >= m->kv_blocks) {
                snprintf(err, errlen, "forward: sequence %d position %d maps to block %d of %d", s, p, blk,
                         m->kv_blocks);
                goto fail;
            }
            pos[i] = p;
            slots[i] = blk * m->kv_block_size + p % m->kv_block_size;
        }
    }

    /* Echo's residual slots carry error from call to call within one pass
     * only: every pass starts clean. */
    if (m->tp > 1 && echo_begin_pass(m->comm, err, errlen)) goto fail;

    const int H = c->hidden_size, hd = c->head_dim, hq = m->hq, hkv = m->hkv, I = m->inter;
    const float scale = 1.0f / sqrtf((float)hd);
    scratch *sc = &m->sc;
    kern_attn_batch ab = {b->n_seqs, b->q_start, b->pos0, b->block_table, b->max_blocks, m->kv_block_size};

    OP(ops->embedding(be, sc->x, &m->embed, b->tokens, n));
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
        OP(ops->kv_store(be, m->kc[l], m->vc[l], sc->k, sc->v, slots, n, hkv * hd));
        OP(ops->attention(be, sc->att, sc->q, m->kc[l], m->vc[l], &ab, hq, hkv, hd, scale));
        OP(ops->matmul(be, sc->o, sc->att, &L->wo, n));
        if (block_out(m, 2 * l, n, err, errlen)) goto fail;
        /* MLP block */
        OP(ops->rmsnorm(be, sc->h, sc->x, &L->mlp_norm, n, H, c->rms_norm_eps));
        OP(ops->matmul(be, sc->gate, sc->h, &L->wg, n));
        OP(ops->matmul(be, sc->up, sc->h, &L->wu, n));
        OP(ops->silu_mul(be, sc->gate, sc->gate, sc->up, (size_t)n * I));
        OP(ops->matmul(be, sc->o, sc->gate, &L->wd, n));
        if (block_out(m, 2 * l + 1, n, err, errlen)) goto fail;
        if (b->layer_states) OP(ops->to_host_f32(be, b->layer_states + (size_t)l * n * H, sc->x, (size_t)n * H));
    }
    /* Only the rows whose logits are wanted go through the final norm and
     * the (vocab-sized, expensive) lm_head. */
    if (b->n_logit_rows > 0 && m->vocab_n > 0) {
        for (int i = 0; i < b->n_logit_rows; i++)
            OP(ops->copy(be, act_at(m, sc->o, (size_t)i * H), act_at(m, sc->x, (size_t)b->logit_rows[i] * H),
                         (size_t)H));
        OP(ops->rmsnorm(be, sc->h, sc->o, &m->norm, b->n_logit_rows, H, c->rms_norm_eps));
        OP(ops->matmul(be, sc->logits, sc->h, &m->lm_head, b->n_logit_rows));
        OP(ops->to_host_f32(be, logits, sc->logits, (size_t)b->n_logit_rows * m->vocab_n));
    }
    free(pos);
    free(slots);
    return 0;
fail:
    free(pos);
    free(slots);
    return -1;
}
