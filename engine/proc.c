/*
 * engine/ under mpirun ("procs" mode, engine.c's header): the control
 * messages rank 0 broadcasts (OP_CREATE with the config, OP_STEP with the
 * batch, OP_DESTROY, OP_EXIT), the gather of every process's results after a
 * step, and eng_follow, the loop of the processes of rank > 0.
 * docs/network.md has the protocol.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

/* What an eng_config says, as bytes (strings inline). */
typedef struct wire_cfg {
    char model_dir[2048], device[32], transport[32], rope_scaling[512];
    int32_t tp, allreduce, allreduce_auto, echo_group, threads, kv_block_size, max_model_len, max_num_seqs, max_batch_tokens,
        kv_blocks, kv_dtype, cuda_graphs, fuse_weights, quantize, act_quant, echo_codec, overlap, overlap_min_rows;
    uint64_t echo_min_bytes, kv_cache_memory, kv_mem_available;
    int64_t oneshot;
} wire_cfg;

static int wire_put(wire_cfg *w, const eng_config *c, char *err, size_t errlen) {
    const char *dev = c->device ? c->device : "", *tr = c->transport ? c->transport : "";
    const char *rs = c->rope_scaling ? c->rope_scaling : "";
    if (!c->model_dir || strlen(c->model_dir) >= sizeof w->model_dir || strlen(dev) >= sizeof w->device ||
        strlen(tr) >= sizeof w->transport || strlen(rs) >= sizeof w->rope_scaling) {
        snprintf(err, errlen, "model path, device, transport name or --rope-scaling too long for the other processes");
        return -1;
    }
    *w = (wire_cfg){.tp = c->tp, .allreduce = c->allreduce, .allreduce_auto = c->allreduce_auto, .echo_group = c->echo_group, .threads = c->threads,
                    .kv_block_size = c->kv_block_size, .max_model_len = c->max_model_len,
                    .max_num_seqs = c->max_num_seqs, .max_batch_tokens = c->max_batch_tokens,
                    .kv_blocks = c->kv_blocks, .kv_dtype = (int32_t)c->kv_dtype, .cuda_graphs = c->cuda_graphs, .fuse_weights = c->fuse_weights,
                    .quantize = c->quantize, .act_quant = c->act_quant, .echo_min_bytes = c->echo_min_bytes,
                    .kv_cache_memory = c->kv_cache_memory, .kv_mem_available = c->kv_mem_available,
                    .echo_codec = c->echo_codec, .overlap = c->overlap,
                    .overlap_min_rows = c->overlap_min_rows, .oneshot = c->oneshot};
    strcpy(w->model_dir, c->model_dir);
    strcpy(w->device, dev);
    strcpy(w->transport, tr);
    strcpy(w->rope_scaling, rs);
    return 0;
}

static void wire_get(wire_cfg *w, eng_config *c) {
    w->model_dir[sizeof w->model_dir - 1] = w->device[sizeof w->device - 1] = w->transport[sizeof w->transport - 1] = 0;
    w->rope_scaling[sizeof w->rope_scaling - 1] = 0;
    *c = (eng_config){.model_dir = w->model_dir, .device = w->device[0] ? w->device : NULL,
                      .transport = w->transport[0] ? w->transport : NULL, .tp = w->tp,
                      .allreduce = (echo_preset)w->allreduce, .allreduce_auto = w->allreduce_auto, .echo_group = w->echo_group, .threads = w->threads,
                      .kv_block_size = w->kv_block_size, .max_model_len = w->max_model_len,
                      .max_num_seqs = w->max_num_seqs, .max_batch_tokens = w->max_batch_tokens,
                      .kv_blocks = w->kv_blocks, .kv_dtype = (kern_kv_dtype)w->kv_dtype, .cuda_graphs = w->cuda_graphs, .fuse_weights = w->fuse_weights,
                      .quantize = w->quantize, .act_quant = w->act_quant, .echo_min_bytes = (size_t)w->echo_min_bytes,
                      .kv_cache_memory = (size_t)w->kv_cache_memory, .kv_mem_available = (size_t)w->kv_mem_available,
                      .echo_codec = (echo_codec_id)w->echo_codec, .overlap = w->overlap,
                      .overlap_min_rows = w->overlap_min_rows, .oneshot = (long)w->oneshot,
                      .rope_scaling = w->rope_scaling[0] ? w->rope_scaling : NULL};
}

/* In procs mode every process reaches each of these points: 0 when all
 * got there without error, else -1 everywhere with the first failure's
 * message (so no process goes on into a collective the others skip). */
int eng_priv_procs_agree(const eng *e, int rc, char *err, size_t errlen) {
    if (!e->procs) return rc;
    char mine[512];
    snprintf(mine, sizeof mine, "%s", rc ? err : "");
    return echo_proc_agree(rc == 0, mine, err, errlen);
}

int eng_create(const eng_config *cfg0, eng **out, char *err, size_t errlen) {
    *out = NULL;
    /* --kv-cache-memory auto is read once, here (rank 0): every process
     * sizes its pool from the same bytes */
    eng_config cc = *cfg0, *cfg = &cc;
    if (eng_priv_kv_memory(&cc, err, errlen)) return -1;
    if (echo_proc_count() == 1) return eng_priv_create(cfg, 0, out, err, errlen);
    if (echo_proc_rank() != 0) {
        snprintf(err, errlen, "under mpirun only rank 0 creates engines; the other processes run eng_follow()");
        return -1;
    }
    /* rank 0: the others make the same engine */
    wire_cfg w;
    ctl_hdr h = {.op = OP_CREATE};
    if (wire_put(&w, cfg, err, errlen)) return -1;
    if (echo_proc_bcast(&h, sizeof h, err, errlen) || echo_proc_bcast(&w, sizeof w, err, errlen)) return -1;
    return eng_priv_create(cfg, 1, out, err, errlen);
}

/* ---- procs mode: a step's batch out, results back ---- */

static void procs_dead(eng *e, const char *err) {
    e->dead = 1;
    snprintf(e->why, sizeof e->why, "%s", err);
}

/* The payload of an OP_STEP after its header, the batch arrays as built in
 * e: rank 0 sends, the others receive into the same places. */
static int step_payload_move(eng *e, const ctl_hdr *h, char *err, size_t errlen) {
    int32_t *arrs[] = {e->tokens, e->q_start, e->pos0, e->table, e->logit_rows};
    size_t lens[] = {(size_t)h->ntok, (size_t)h->n + 1, (size_t)h->n, (size_t)h->n * h->max_blocks,
                     (size_t)h->nrows};
    for (int i = 0; i < 5; i++)
        if (lens[i] && echo_proc_bcast(arrs[i], lens[i] * 4, err, errlen)) return -1;
    return h->nrows ? echo_proc_bcast(e->row_full, (size_t)h->nrows, err, errlen) : 0;
}

int eng_priv_step_send(eng *e, int n, int ntok, int nrows, int k, int nfull, int states, char *err, size_t errlen) {
    ctl_hdr h = {OP_STEP, n, ntok, nrows, e->max_blocks_per_seq, k, nfull, states};
    if (echo_proc_bcast(&h, sizeof h, err, errlen) || step_payload_move(e, &h, err, errlen)) {
        procs_dead(e, err);
        return -1;
    }
    return 0;
}

/* What each process sends rank 0 after a step: its status, then its
 * vocabulary slice's full rows and candidates, padded to the widest slice. */
typedef struct step_status {
    int32_t rc;
    char err[508];
} step_status;

static size_t result_bytes(const eng *e, int nrows, int k, int nfull) {
    size_t per = ((size_t)e->mc.vocab_size + e->cfg.tp - 1) / e->cfg.tp;
    return sizeof(step_status) + (size_t)nfull * per * 4 + (size_t)nrows * k * 8 + (size_t)nrows * 4;
}

static void result_pack(const eng *e, char *buf, int nrows, int k, int nfull, int rc, const char *msg) {
    const eng_rank *r = &e->ranks[e->me];
    int v0, vn;
    eng_priv_vocab_slice(e, e->me, &v0, &vn);
    size_t per = ((size_t)e->mc.vocab_size + e->cfg.tp - 1) / e->cfg.tp, kk = (size_t)(k < vn ? k : vn);
    step_status st = {rc, ""};
    if (rc) snprintf(st.err, sizeof st.err, "%s", msg);
    memcpy(buf, &st, sizeof st);
    char *p = buf + sizeof st;
    if (!rc && vn > 0) memcpy(p, r->logits, (size_t)nfull * vn * 4);
    p += (size_t)nfull * per * 4;
    if (!rc && k && vn > 0) {
        memcpy(p, r->cand_ids, (size_t)nrows * kk * 4);
        memcpy(p + (size_t)nrows * k * 4, r->cand_vals, (size_t)nrows * kk * 4);
        memcpy(p + (size_t)nrows * k * 8, r->cand_lse, (size_t)nrows * 4);
    }
}

/* Rank 0: every process's results into e->ranks[*]; the first failure's
 * message. */
int eng_priv_step_gather(eng *e, int nrows, int k, int nfull, int rc, char *err, size_t errlen) {
    size_t one = result_bytes(e, nrows, k, nfull), all = one * (size_t)e->cfg.tp;
    char *mine = malloc(one);
    if (all > e->gather_cap) {
        char *g = realloc(e->gather, all);
        if (g) {
            e->gather = g;
            e->gather_cap = all;
        }
    }
    if (!mine || all > e->gather_cap) {
        /* cannot take part: the peers would wait in the gather */
        echo_proc_abort(1, "rank 0: out of memory for a step's results");
        free(mine);
        snprintf(err, errlen, "out of memory for a step's results");
        return -1;
    }
    char lerr[512];
    snprintf(lerr, sizeof lerr, "%s", rc ? err : "");
    result_pack(e, mine, nrows, k, nfull, rc, lerr);
    int grc = echo_proc_gather(mine, one, e->gather, err, errlen);
    free(mine);
    if (grc) {
        procs_dead(e, err);
        return -1;
    }
    size_t per = ((size_t)e->mc.vocab_size + e->cfg.tp - 1) / e->cfg.tp;
    for (int r = 0; r < e->cfg.tp; r++) {
        const char *b = e->gather + (size_t)r * one;
        step_status st;
        memcpy(&st, b, sizeof st);
        st.err[sizeof st.err - 1] = 0;
        if (st.rc) {
            snprintf(err, errlen, "rank %d: %s", r, st.err);
            return -1;
        }
        if (r == 0) continue;
        eng_rank *rk = &e->ranks[r];
        int v0, vn;
        eng_priv_vocab_slice(e, r, &v0, &vn);
        if (vn <= 0) continue;
        size_t kk = (size_t)(k < vn ? k : vn);
        b += sizeof st;
        memcpy(rk->logits, b, (size_t)nfull * vn * 4);
        b += (size_t)nfull * per * 4;
        if (k) {
            memcpy(rk->cand_ids, b, (size_t)nrows * kk * 4);
            memcpy(rk->cand_vals, b + (size_t)nrows * k * 4, (size_t)nrows * kk * 4);
            memcpy(rk->cand_lse, b + (size_t)nrows * k * 8, (size_t)nrows * 4);
        }
    }
    return 0;
}

/* A process of rank > 0: one step as rank 0 described it. */
static int follow_step(eng *e, const ctl_hdr *h, char *err, size_t errlen) {
    const eng_config *c = &e->cfg;
    if (h->n < 1 || h->n > c->max_num_seqs || h->ntok < 1 || h->ntok > c->max_batch_tokens || h->nrows < 0 ||
        h->nrows > e->logit_cap || h->max_blocks != e->max_blocks_per_seq || h->k < 0 || h->k > KERN_TOPK_MAX ||
        h->nfull < 0 || h->nfull > h->nrows) {
        snprintf(err, errlen, "rank %d: a step that does not fit this engine (rank 0 runs another configuration?)",
                 e->me);
        return -1;
    }
    if (step_payload_move(e, h, err, errlen)) return -1;
    eng_rank *r = &e->ranks[e->me];
    int rc = eng_priv_step_reserve(e, h->nfull, h->k ? h->nrows : 0, err, errlen);
    if (rc) {
        echo_proc_abort(1, err); /* rank 0 and the peers would wait for this rank */
        return -1;
    }
    if (h->k) r->topk = (model_topk){h->k, r->cand_ids, r->cand_vals, r->cand_lse, h->nfull ? e->row_full : NULL};
    e->batch = (model_batch){h->n, e->tokens, e->q_start, e->pos0, e->table, e->max_blocks_per_seq,
                             e->logit_rows, h->nrows, NULL, h->k ? &r->topk : NULL};
    char lerr[512] = "";
    rc = eng_priv_ranks_forward(e, lerr, sizeof lerr);
    size_t one = result_bytes(e, h->nrows, h->k, h->nfull);
    char *mine = malloc(one);
    if (!mine) {
        echo_proc_abort(1, "out of memory for a step's results");
        return -1;
    }
    result_pack(e, mine, h->nrows, h->k, h->nfull, rc, lerr);
    rc = echo_proc_gather(mine, one, NULL, err, errlen);
    free(mine);
    return rc;
}

int eng_follow(char *err, size_t errlen) {
    eng *e = NULL;
    wire_cfg w; /* outlives each engine made from it (e->cfg points into it) */
    for (;;) {
        ctl_hdr h;
        if (echo_proc_bcast(&h, sizeof h, err, errlen)) break;
        if (h.op == OP_CREATE) {
            eng_config c;
            if (echo_proc_bcast(&w, sizeof w, err, errlen)) break;
            eng_destroy(e);
            e = NULL;
            wire_get(&w, &c);
            char cerr[1024];
            eng_priv_create(&c, 1, &e, cerr, sizeof cerr); /* a failure fails rank 0 alike, which reports it */
        } else if (h.op == OP_STEP) {
            if (!e) {
                snprintf(err, errlen, "rank %d: a step without an engine", echo_proc_rank());
                break;
            }
            if (follow_step(e, &h, err, errlen)) break;
        } else if (h.op == OP_DESTROY) {
            eng_destroy(e);
            e = NULL;
        } else if (h.op == OP_EXIT) {
            eng_destroy(e);
            return 0;
        } else {
            snprintf(err, errlen, "rank %d: unknown control message %d", echo_proc_rank(), h.op);
            break;
        }
    }
    if (e) e->procs = 0; /* rank 0 is gone or confused: do not talk to it */
    eng_destroy(e);
    return -1;
}

void eng_procs_exit(void) {
    if (echo_proc_count() < 2 || echo_proc_rank() != 0) return;
    ctl_hdr h = {.op = OP_EXIT};
    char err[256];
    echo_proc_bcast(&h, sizeof h, err, sizeof err);
}
