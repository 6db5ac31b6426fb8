/*
 * model/: the decoder pass of every family (model/arch/) over the kernels/
 * op table. Loading one rank's weights is load.c's.
 *
 * One pass over the n tokens of a batch of sequences:
 *   x = embed(ids)
 *   per layer: h = rmsnorm(x); q,k,v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ
 *                                    (+ bq, bk, bv; qkv_bias families);
 *              q,k = rmsnorm per head (q_norm, k_norm; qk_norm families);
 *              rope(q), rope(k); append k,v to the cache;
 *              a = attention(q, cache);
 *              x += allreduce(a·Woᵀ)                        site 2l
 *              h = rmsnorm(x); x += allreduce((silu(h·Wgᵀ) * h·Wuᵀ)·Wdᵀ)   site 2l+1
 *   (the sites: the family's blocks in order, layer after layer; every
 *   family so far lays out attention then MLP, model_family.blocks)
 *   logits = rmsnorm(x)·Wlmᵀ (Wlm = embed when tied)
 * With fuse_weights, a step of one token computes q,k,v with one matmul
 * against [Wq; Wk; Wv] and gate,up with one against [Wg; Wu] (same values).
 * Megatron-style tensor parallelism: each rank holds its query/KV heads and
 * intermediate rows, so a·Woᵀ and the MLP output are partial sums that the
 * all-reduce (comm/, Echo) completes. With one rank there is nothing to
 * reduce. The residual stream x is replicated and bit-identical on every rank
 * because every all-reduce returns bit-identical replicas.
 *
 * This file only emits a pass's ops (model_pass_prepare / _ops / _out);
 * the step around them (the all-reduce pass, graphs, the ranks' vote) is
 * engine/step.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kv.h"
#include "model/internal.h"

const model_config *model_get_config(const model *m) { return &m->cfg; }
size_t model_weight_bytes(const model *m) { return m->weight_bytes; }
size_t model_embed_bytes(const model *m) { return m->embed_bytes; }
int model_act_q8_matrices(const model *m) { return m->n_act_q8; }
size_t model_kv_bytes(const model *m) {
    return 2 * (size_t)m->cfg.num_layers * m->kv_blocks * m->kv_block_size *
           kern_kv_row_bytes(m->kv_dtype, m->hkv, m->cfg.head_dim);
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

void model_priv_scratch_free(model *m) {
    void **bufs[] = {&m->sc.x, &m->sc.h, &m->sc.q, &m->sc.k, &m->sc.v, &m->sc.att, &m->sc.o,
                     &m->sc.gate, &m->sc.up, &m->sc.qkv, &m->sc.gu, &m->sc.logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        if (*bufs[i]) m->ops->free(m->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    free(m->sc.host);
    free(m->sc.pos);
    free(m->sc.slots);
    free(m->sc.mb_arr);
    m->sc.mb_arr = NULL;
    m->sc.mb_cap = 0;
    m->sc.mb_k = 0;
    m->sc.mb_batch = NULL;
    m->sc.host = NULL;
    m->sc.pos = m->sc.slots = NULL;
    m->sc.cap = 0;
    m->sc.logits_cap = 0;
}

static int scratch_fits(const model *m, int n, int rows) { return n <= m->sc.cap && rows <= m->sc.logits_cap; }

int model_pass_moves_buffers(const model *m, const model_batch *b) {
    return m->sc.cap > 0 && b->n_seqs > 0 && !scratch_fits(m, b->q_start[b->n_seqs], b->n_logit_rows);
}

/* Grow the scratch to hold `n` tokens of which `rows` want logits; sizes at
 * least double so a prefill followed by decodes does not reallocate. The
 * logits buffer is sized separately: a 2048-token prefill of a 152k vocabulary
 * needs one row, not 1.2 GB. */
int model_priv_scratch_reserve(model *m, int n, int rows, char *err, size_t errlen) {
    if (scratch_fits(m, n, rows)) return 0;
    int cap = n <= m->sc.cap ? m->sc.cap : (m->sc.cap * 2 > n ? m->sc.cap * 2 : n);
    if (rows < m->sc.logits_cap) rows = m->sc.logits_cap;
    if (rows < 1) rows = 1;
    const model_config *c = &m->cfg;
    size_t es = kern_dtype_size(m->ops->act_dtype);
    size_t qd = (size_t)m->hq * c->head_dim, kvd = (size_t)m->hkv * c->head_dim;
    model_priv_scratch_free(m);
    m->sc.x = m->ops->alloc(m->be, (size_t)cap * c->hidden_size * es);
    m->sc.h = m->ops->alloc(m->be, (size_t)cap * c->hidden_size * es);
    m->sc.q = m->ops->alloc(m->be, (size_t)cap * qd * es);
    m->sc.k = m->ops->alloc(m->be, (size_t)cap * kvd * es);
    m->sc.v = m->ops->alloc(m->be, (size_t)cap * kvd * es);
    m->sc.att = m->ops->alloc(m->be, (size_t)cap * qd * es);
    m->sc.o = m->ops->alloc(m->be, (size_t)cap * c->hidden_size * es);
    m->sc.gate = m->ops->alloc(m->be, (size_t)cap * m->inter * es);
    m->sc.up = m->ops->alloc(m->be, (size_t)cap * m->inter * es);
    if (m->fused) {
        m->sc.qkv = m->ops->alloc(m->be, (qd + 2 * kvd) * es);
        m->sc.gu = m->ops->alloc(m->be, 2 * (size_t)m->inter * es);
    }
    m->sc.logits = m->ops->alloc(m->be, (size_t)rows * m->vocab_n * es);
    m->sc.host = malloc((size_t)cap * c->hidden_size * sizeof(float));
    m->sc.pos = malloc((size_t)cap * sizeof *m->sc.pos);
    m->sc.slots = malloc((size_t)cap * sizeof *m->sc.slots);
    if (!m->sc.x || !m->sc.h || !m->sc.q || !m->sc.k || !m->sc.v || !m->sc.att || !m->sc.o || !m->sc.gate ||
        !m->sc.up || (m->fused && (!m->sc.qkv || !m->sc.gu)) || !m->sc.logits || !m->sc.host || !m->sc.pos ||
        !m->sc.slots) {
        model_priv_scratch_free(m);
        snprintf(err, errlen, "out of memory for activations of %d tokens", cap);
        return -1;
    }
    m->sc.cap = cap;
    m->sc.logits_cap = rows;
    return 0;
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

int model_pass_prepare(model *m, const model_batch *b, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
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
    if (model_priv_scratch_reserve(m, n, b->n_logit_rows, err, errlen)) return -1;
    /* Positions and cache slots per token, checked against the block table
     * so a bad table is an error here, not a write into another sequence. */
    for (int s = 0; s < b->n_seqs; s++) {
        int q0 = b->q_start[s], q1 = b->q_start[s + 1];
        if (q1 < q0 || b->pos0[s] < 0 || b->pos0[s] + (q1 - q0) > b->max_blocks * m->kv_block_size) {
            snprintf(err, errlen, "forward: sequence %d does not fit its block table", s);
            return -1;
        }
        for (int i = q0; i < q1; i++) {
            int p = b->pos0[s] + (i - q0);
            int blk = b->block_table[(size_t)s * b->max_blocks + p / m->kv_block_size];
            if (blk < 0 || blk >= m->kv_blocks) {
                snprintf(err, errlen, "forward: sequence %d position %d maps to block %d of %d", s, p, blk,
                         m->kv_blocks);
                return -1;
            }
            m->sc.pos[i] = p;
            m->sc.slots[i] = blk * m->kv_block_size + p % m->kv_block_size;
        }
    }
    return 0;
}

static rows_view whole_view(const model *m, const model_batch *b) {
    return (rows_view){0, b->q_start[b->n_seqs],
                       {b->n_seqs, b->q_start, b->pos0, b->block_table, b->max_blocks, m->kv_block_size}};
}

static int mb_view(const model *m, const model_batch *b, int mb, rows_view *v, char *err, size_t errlen) {
    if (mb < 0 || mb >= m->sc.mb_k || m->sc.mb_batch != b) {
        snprintf(err, errlen, "forward: micro-batch %d of a pass split into %d (model_pass_split)", mb, m->sc.mb_k);
        return -1;
    }
    *v = m->sc.mb_views[mb];
    return 0;
}

/* The pass's all-reduce sites (model_pass_sites). */
static int n_sites(const model *m) { return m->fam->n_blocks * m->cfg.num_layers; }

/* Site s is block s % n_blocks of layer s / n_blocks of the family's layout. */
static model_block site_block(const model *m, int site, int *layer) {
    *layer = site / m->fam->n_blocks;
    return m->fam->blocks[site % m->fam->n_blocks];
}

/* The norm that a site's block applies to the residual stream first. */
static const kern_weight *site_norm(const model *m, int site) {
    int l;
    model_block k = site_block(m, site, &l);
    return k == MODEL_BLOCK_ATTN ? &m->layers[l].attn_norm : &m->layers[l].mlp_norm;
}

/* The ops of site `site` for the rows of v up to the block's partial sum in
 * rows [t0, t0+n) of sc->o: the embedding first at site 0, then the site's
 * block (attention or MLP) of its layer. Every buffer is addressed at row
 * t0, so micro-batches never share rows. */
static int site_part(model *m, const model_batch *b, const rows_view *rv, int site, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    const kern_ops *ops = m->ops;
    kern_backend *be = m->be;
    const int H = c->hidden_size, hd = c->head_dim, hq = m->hq, hkv = m->hkv, I = m->inter;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t qd = (size_t)hq * hd, kvd = (size_t)hkv * hd;
    int l;
    const model_block block = site_block(m, site, &l);
    const int n = rv->n;
    const size_t t0 = (size_t)rv->t0;
    /* A step of exactly one token runs the fused weights (when loaded). */
    const int one_row = m->fused && n == 1;
    scratch *sc = &m->sc;
    const int32_t *pos = sc->pos + t0, *slots = sc->slots + t0;
    const layer_w *L = &m->layers[l];
    void *x = act_at(m, sc->x, t0 * H), *h = act_at(m, sc->h, t0 * H), *o = act_at(m, sc->o, t0 * H);
    if (site == 0) {
        OP(ops->embedding(be, x, &m->embed, b->tokens + t0, n));
        /* h = norm(x) comes from the previous site's fused add, except at site 0 */
        OP(ops->rmsnorm(be, h, x, site_norm(m, 0), n, H, c->rms_norm_eps));
    }
    if (block == MODEL_BLOCK_ATTN) {
        void *q = act_at(m, sc->q, t0 * qd), *k = act_at(m, sc->k, t0 * kvd), *v = act_at(m, sc->v, t0 * kvd);
        void *att = act_at(m, sc->att, t0 * qd);
        if (one_row) {
            /* one row: h·[wq; wk; wv]ᵀ is q, k, v end to end */
            OP(ops->matmul(be, sc->qkv, h, &L->wqkv, 1));
            q = sc->qkv;
            k = act_at(m, sc->qkv, qd);
            v = act_at(m, sc->qkv, qd + kvd);
        } else {
            OP(ops->matmul(be, q, h, &L->wq, n));
            OP(ops->matmul(be, k, h, &L->wk, n));
            OP(ops->matmul(be, v, h, &L->wv, n));
        }
        if (c->qkv_bias) {
            OP(ops->add_bias(be, q, &L->bq, n, (int)qd));
            OP(ops->add_bias(be, k, &L->bk, n, (int)kvd));
            OP(ops->add_bias(be, v, &L->bv, n, (int)kvd));
        }
        if (c->qk_norm) {
            OP(ops->qk_norm_rope(be, q, k, &L->q_norm, &L->k_norm, pos, n, hq, hkv, hd, c->rms_norm_eps, &c->rope));
        } else {
            OP(ops->rope(be, q, pos, n, hq, hd, &c->rope));
            OP(ops->rope(be, k, pos, n, hkv, hd, &c->rope));
        }
        /* causal: these rows read the cache rows of every earlier row,
         * earlier micro-batches' included (stored at this site before) */
        OP(ops->kv_store(be, m->kc[l], m->vc[l], k, v, slots, n, hkv, hd, m->kv_dtype));
        OP(ops->attention(be, att, q, m->kc[l], m->vc[l], &rv->ab, hq, hkv, hd, scale, m->kv_dtype));
        OP(ops->matmul(be, o, att, &L->wo, n));
    } else {
        void *gate = act_at(m, sc->gate, t0 * I), *up = act_at(m, sc->up, t0 * I);
        if (one_row) {
            /* h·[wg; wu]ᵀ is gate then up */
            OP(ops->matmul(be, sc->gu, h, &L->wgu, 1));
            gate = sc->gu;
            up = act_at(m, sc->gu, (size_t)I);
        } else {
            OP(ops->matmul(be, gate, h, &L->wg, n));
            OP(ops->matmul(be, up, h, &L->wu, n));
        }
        OP(ops->silu_mul(be, gate, gate, up, (size_t)n * I));
        OP(ops->matmul(be, o, gate, &L->wd, n));
    }
    return 0;
fail:
    return -1;
}

/* The end of a row-parallel block, after its all-reduce: add the reduced
 * rows to the residual stream. The add is fused with the next site's norm
 * (h = norm(x), one launch fewer on a GPU; the cpu twin gives the unfused
 * bits): mlp_norm after an attention block, the next layer's attn_norm
 * after an MLP block; after the last site only the logit rows are normed
 * (pass_tail), so that add stays plain. A layer's states are taken after
 * its last block. */
static int site_join(model *m, const model_batch *b, const rows_view *rv, int site, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    const kern_ops *ops = m->ops;
    kern_backend *be = m->be;
    int l;
    site_block(m, site, &l);
    const int H = c->hidden_size, n = rv->n, last_of_layer = site % m->fam->n_blocks == m->fam->n_blocks - 1;
    const size_t t0 = (size_t)rv->t0, count = (size_t)n * H;
    scratch *sc = &m->sc;
    void *x = act_at(m, sc->x, t0 * H), *h = act_at(m, sc->h, t0 * H), *o = act_at(m, sc->o, t0 * H);
    const kern_weight *next_norm = site + 1 < n_sites(m) ? site_norm(m, site + 1) : NULL;
    if (next_norm)
        OP(ops->add_rmsnorm(be, x, o, h, next_norm, n, H, c->rms_norm_eps));
    else
        OP(ops->add(be, x, o, count));
    if (last_of_layer && b->layer_states) {
        size_t total = (size_t)b->q_start[b->n_seqs];
        OP(ops->to_host_f32(be, b->layer_states + (size_t)l * total * H + t0 * H, x, count));
    }
    return 0;
fail:
    return -1;
}

/* Only the rows whose logits are wanted go through the final norm and the
 * (vocab-sized, expensive) lm_head. */
static int pass_tail(model *m, const model_batch *b, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    const kern_ops *ops = m->ops;
    kern_backend *be = m->be;
    const int H = c->hidden_size;
    scratch *sc = &m->sc;
    if (b->n_logit_rows > 0 && m->vocab_n > 0) {
        for (int i = 0; i < b->n_logit_rows; i++)
            OP(ops->copy(be, act_at(m, sc->o, (size_t)i * H), act_at(m, sc->x, (size_t)b->logit_rows[i] * H),
                         (size_t)H));
        OP(ops->rmsnorm(be, sc->h, sc->o, &m->norm, b->n_logit_rows, H, c->rms_norm_eps));
        OP(ops->matmul(be, sc->logits, sc->h, &m->lm_head, b->n_logit_rows));
    }
    return 0;
fail:
    return -1;
}

int model_pass_ops(model *m, const model_batch *b, char *err, size_t errlen) {
    rows_view rv = whole_view(m, b);
    size_t count = (size_t)rv.n * m->cfg.hidden_size;
    for (int site = 0; site < n_sites(m); site++) {
        if (site_part(m, b, &rv, site, err, errlen)) return -1;
        /* every rank holds a partial sum of the block output: all-reduce it
         * at its site; with one rank there is nothing to reduce */
        if (m->tp > 1) {
            echo_dtype dt = m->ops->act_dtype == KERN_F32 ? ECHO_F32 : ECHO_BF16;
            /* on a device the all-reduce enqueues on the rank's stream, after the matmul that fed it */
            if (echo_allreduce(m->comm, site, m->sc.o, count, dt, m->ops->stream(m->be), err, errlen)) return -1;
        }
        if (site_join(m, b, &rv, site, err, errlen)) return -1;
    }
    return pass_tail(m, b, err, errlen);
}

int model_pass_split(model *m, const model_batch *b, int k, char *err, size_t errlen) {
    const int n = b->q_start[b->n_seqs];
    if (k < 1 || k > MODEL_MAX_MB || k > n) {
        snprintf(err, errlen, "forward: %d micro-batches for %d tokens (1..%d, at most one per token)", k, n,
                 MODEL_MAX_MB);
        return -1;
    }
    scratch *sc = &m->sc;
    size_t need = (size_t)k * ((size_t)b->n_seqs * 2 + 1);
    if (need > sc->mb_cap) {
        int32_t *a = realloc(sc->mb_arr, need * sizeof *a);
        if (!a) {
            snprintf(err, errlen, "out of memory for %d micro-batches", k);
            return -1;
        }
        sc->mb_arr = a;
        sc->mb_cap = need;
    }
    int32_t *arr = sc->mb_arr;
    for (int i = 0; i < k; i++) {
        /* near-equal consecutive rows */
        int t0 = (int)((long long)n * i / k), t1 = (int)((long long)n * (i + 1) / k);
        int sa = 0, sb = b->n_seqs;
        while (sa < b->n_seqs - 1 && b->q_start[sa + 1] <= t0) sa++;
        while (sb > sa + 1 && b->q_start[sb - 1] >= t1) sb--;
        int ns = sb - sa;
        int32_t *qs = arr, *p0 = arr + ns + 1;
        arr += 2 * ns + 1;
        for (int s = 0; s <= ns; s++) {
            int q = b->q_start[sa + s];
            qs[s] = (q < t0 ? t0 : q > t1 ? t1 : q) - t0;
        }
        for (int s = 0; s < ns; s++) {
            int q = b->q_start[sa + s];
            p0[s] = b->pos0[sa + s] + (q < t0 ? t0 - q : 0);
        }
        sc->mb_views[i] = (rows_view){t0, t1 - t0,
                                      {ns, qs, p0, b->block_table + (size_t)sa * b->max_blocks, b->max_blocks,
                                       m->kv_block_size}};
    }
    sc->mb_k = k;
    sc->mb_batch = b;
    return 0;
}

int model_pass_part(model *m, const model_batch *b, int mb, int site, void **buf, size_t *count, char *err,
                    size_t errlen) {
    rows_view rv;
    if (mb_view(m, b, mb, &rv, err, errlen)) return -1;
    if (site < 0 || site >= n_sites(m)) {
        snprintf(err, errlen, "forward: site %d of %d", site, n_sites(m));
        return -1;
    }
    *buf = act_at(m, m->sc.o, (size_t)rv.t0 * m->cfg.hidden_size);
    *count = (size_t)rv.n * m->cfg.hidden_size;
    return site_part(m, b, &rv, site, err, errlen);
}

int model_pass_join(model *m, const model_batch *b, int mb, int site, char *err, size_t errlen) {
    rows_view rv;
    if (mb_view(m, b, mb, &rv, err, errlen)) return -1;
    if (site < 0 || site >= n_sites(m)) {
        snprintf(err, errlen, "forward: site %d of %d", site, n_sites(m));
        return -1;
    }
    return site_join(m, b, &rv, site, err, errlen);
}

int model_pass_tail(model *m, const model_batch *b, char *err, size_t errlen) { return pass_tail(m, b, err, errlen); }

int model_pass_out(model *m, const model_batch *b, float *logits, char *err, size_t errlen) {
    const kern_ops *ops = m->ops;
    kern_backend *be = m->be;
    scratch *sc = &m->sc;
    if (b->n_logit_rows > 0 && m->vocab_n > 0) {
        const model_topk *t = b->topk;
        if (!t) {
            OP(ops->to_host_f32(be, logits, sc->logits, (size_t)b->n_logit_rows * m->vocab_n));
        } else {
            /* k (id, value) pairs and one lse per row cross to the host
             * instead of the slice's vocab_n values */
            int kk = t->k < m->vocab_n ? t->k : m->vocab_n;
            OP(ops->logits_topk(be, sc->logits, b->n_logit_rows, m->vocab_n, kk, t->ids, t->vals, t->lse));
            for (size_t i = 0; i < (size_t)b->n_logit_rows * kk; i++) t->ids[i] += m->vocab0;
            for (int i = 0, j = 0; t->full_rows && i < b->n_logit_rows; i++)
                if (t->full_rows[i])
                    OP(ops->to_host_f32(be, logits + (size_t)j++ * m->vocab_n,
                                        act_at(m, sc->logits, (size_t)i * m->vocab_n), (size_t)m->vocab_n));
        }
    }
    return 0;
fail:
    return -1;
}
