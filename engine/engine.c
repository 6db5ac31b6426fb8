/*
 * engine/: the batched step (see engine.h): check the batch, stage it,
 * run it on every rank, gather logits or merge candidates, and the
 * engine's accessors. Creation is create.c, the ranks' threads threads.c,
 * sequences and their KV blocks seq.c.
 *
 * Rank 0 runs on the thread that calls eng_step(); ranks 1..tp-1 are
 * persistent threads woken once per step. All ranks run the same step on
 * their shard (eng_run_step, step.c) and meet only inside comm/'s
 * all-reduce.
 * Every rank validates the same batch the same way before the first
 * collective, so an invalid batch fails on all ranks without anyone waiting
 * in a collective for a rank that gave up.
 *
 * Under mpirun (echo_proc_count() > 1) each process is one rank ("procs"
 * mode): the process of rank 0 owns the engine the caller sees (sequences,
 * KV blocks, sampling), sends each step's batch to the others (comm/'s
 * control messages), runs its own rank and gathers their vocabulary slices
 * or candidates; the other processes sit in eng_follow(), running the same
 * step on their rank. Both ways are rows of the ranks table (internal.h:
 * threads.c, proc.c); docs/network.md has the processes' protocol.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/budget.h"
#include "engine/internal.h"
#include "engine/overlap.h"
#include "engine/report.h"

const model_config *eng_model_config(const eng *e) { return &e->mc; }
const eng_config *eng_get_config(const eng *e) { return &e->cfg; }

int eng_pass_tokens(const eng *e) { return e->canon ? e->cfg.pass_tokens : 0; }
int eng_overlap_k(const eng *e) { return e->ov_k; }
int eng_allreduce_auto(const eng *e, echo_auto_figures *f, echo_auto_choice *c) {
    if (!e->auto_ran) return 0;
    if (f) *f = e->auto_fig;
    if (c) *c = e->auto_choice;
    return 1;
}

size_t eng_oneshot_plan(long oneshot, int tp, int procs, int host_memory) {
    if (tp < 2 || !host_memory || oneshot == ENG_ONESHOT_OFF || oneshot < 0) return 0;
    if (oneshot == ENG_ONESHOT_AUTO) return procs ? ENG_ONESHOT_AUTO_BYTES : 0;
    return (size_t)oneshot;
}

size_t eng_oneshot_bytes(const eng *e) {
    echo_config wc;
    return eng_allreduce_config(e, &wc) ? 0 : wc.oneshot_bytes;
}

int eng_prompt_chunk(const eng *e, int pos, int left, int budget) {
    int n = left < budget ? left : budget;
    if (n <= 0 || !e->canon || n == left) return n > 0 ? n : 0;
    int C = e->cfg.pass_tokens, end = (pos + n) / C * C;
    return end > pos ? end - pos : 0;
}

long eng_graph_steps(const eng *e) { return e->ranks[0].run.graph_steps; }
long eng_comm_resets(const eng *e) { return e->comm_resets; }
int eng_usable(const eng *e, char *why, size_t len) {
    if (e->dead) {
        if (why && len) snprintf(why, len, "%s", e->why);
        return 0;
    }
    for (int i = 1; i < e->ov_k; i++)
        if (!echo_world_usable(e->ov_worlds[i - 1], why, len)) return 0;
    return !e->world || echo_world_usable(e->world, why, len);
}

int eng_ranks_alive(const eng *e, char *why, size_t len) {
    return !e->procs || echo_proc_peers_alive(why, len);
}

const char *eng_graphs_note(const eng *e) {
    if (!e->cfg.cuda_graphs) return NULL;
    if (!e->ranks[0].ops->graph_begin)
        return "--cuda-graphs has no effect: the backend has no graphs (cuda only); steps run eagerly";
    const echo_transport_info *t = echo_transport_find(e->cfg.transport);
    if (e->cfg.tp > 1 && !(t && t->capturable))
        return "--cuda-graphs has no effect at tp > 1 with --transport local (its all-reduce meets the peers on the "
               "host at every call, which a graph cannot hold); steps run eagerly. --transport nccl captures it";
    return NULL;
}

/* Rank r's vocabulary slice, as model_load cuts it (also for ranks that
 * live in other processes). */
void eng_priv_vocab_slice(const eng *e, int r, int *v0, int *vn) {
    int V = e->mc.vocab_size, per = (V + e->cfg.tp - 1) / e->cfg.tp;
    *v0 = r * per < V ? r * per : V;
    *vn = *v0 + per <= V ? per : V - *v0;
}

/* After a step: register the sequence's prompt blocks it completed. */
static void seq_register(eng *e, eng_seq *s) {
    int bs = e->cfg.kv_block_size, upto = (s->len < s->cacheable ? s->len : s->cacheable) / bs;
    while (!s->chain_broken && s->nreg < upto) {
        int32_t c = eng_blocks_register(&e->pool, s->chain, s->chain_gen, s->blocks[s->nreg]);
        if (c < 0) {
            s->chain_broken = 1;
            break;
        }
        s->chain = c;
        s->chain_gen = e->pool.gen[c];
        s->nreg++;
    }
}

void eng_get_rank_info(const eng *e, int rank, eng_rank_info *out) {
    memset(out, 0, sizeof *out);
    if (rank < 0 || rank >= e->cfg.tp) return;
    const eng_rank *r = &e->ranks[rank];
    if (!r->m) return; /* procs mode: another process's rank */
    out->weight_bytes = model_weight_bytes(r->m);
    out->embed_bytes = model_embed_bytes(r->m);
    out->act_q8_matrices = model_act_q8_matrices(r->m);
    out->kv_bytes = model_kv_bytes(r->m);
    out->slot_bytes = r->comm ? echo_comm_slot_bytes(r->comm) : 0;
}

int eng_allreduce_config(const eng *e, echo_config *out) {
    memset(out, 0, sizeof *out);
    if (!e->world) return -1;
    echo_world_get_config(e->world, out);
    return 0;
}

void eng_comm_stats(const eng *e, echo_stats *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < e->cfg.tp; i++) {
        if (!e->ranks[i].comm) continue;
        echo_stats s;
        echo_get_stats(e->ranks[i].comm, &s);
        eng_overlap_add_stats(e->ranks[i].run.ov, &s);
        for (int k = 0; k < ECHO_PRESET_COUNT; k++) {
            out->calls[k] += s.calls[k];
            out->wire_bytes[k] += s.wire_bytes[k];
            out->seconds[k] += s.seconds[k];
        }
    }
}

/* Every row back: ALL, or a verified draft (VERIFY). */
static int rows_all(eng_logits lg) { return lg == ENG_LOGITS_ALL || lg == ENG_LOGITS_VERIFY; }

/* Validate the batch and count the KV blocks it needs; nothing changes. */
static int step_check(eng *e, const eng_item *it, int n, long tok_limit, int *need_blocks, int *ntok, int *nrows,
                      char *err, size_t errlen) {
    const eng_config *c = &e->cfg;
    int tok = 0, rows = 0, need = 0;
    if (n <= 0 || n > c->max_num_seqs) {
        snprintf(err, errlen, "step: %d items (1..%d allowed)", n, c->max_num_seqs);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int s = it[i].seq;
        if (s < 0 || s >= c->max_num_seqs || !e->seqs[s].live) {
            snprintf(err, errlen, "step: item %d names unknown sequence %d", i, s);
            return -1;
        }
        for (int j = 0; j < i; j++) {
            if (it[j].seq == s) {
                snprintf(err, errlen, "step: sequence %d appears twice in one batch", s);
                return -1;
            }
        }
        if (it[i].n_tokens <= 0) {
            snprintf(err, errlen, "step: item %d has no tokens", i);
            return -1;
        }
        if ((long long)e->seqs[s].len + it[i].n_tokens > c->max_model_len) {
            snprintf(err, errlen, "step: sequence %d would reach %lld tokens, beyond the max model length %d", s,
                     (long long)e->seqs[s].len + it[i].n_tokens, c->max_model_len);
            return -1;
        }
        for (int k = 0; k < it[i].n_tokens; k++) {
            if (it[i].tokens[k] < 0 || it[i].tokens[k] >= e->mc.vocab_size) {
                snprintf(err, errlen, "step: token id %d out of range [0, %d)", it[i].tokens[k], e->mc.vocab_size);
                return -1;
            }
        }
        tok += it[i].n_tokens;
        if (tok > tok_limit) {
            snprintf(err, errlen, "step: more than %d tokens in one batch", c->max_batch_tokens);
            return -1;
        }
        rows += rows_all(it[i].logits) ? it[i].n_tokens : it[i].logits == ENG_LOGITS_LAST ? 1 : 0;
        int want = (e->seqs[s].len + it[i].n_tokens + c->kv_block_size - 1) / c->kv_block_size;
        need += want - e->seqs[s].nblocks;
    }
    *need_blocks = need;
    *ntok = tok;
    *nrows = rows;
    return 0;
}

/* Give back the blocks a failed step took: every sequence keeps its length
 * and the blocks it held before; what the pass wrote past its end is never
 * read. */
static void step_rollback(eng *e, const eng_item *it, int n) {
    for (int i = n - 1; i >= 0; i--) {
        eng_seq *s = &e->seqs[it[i].seq];
        if (s->nblocks > e->old_nblocks[i])
            eng_blocks_release(&e->pool, s->blocks + e->old_nblocks[i], s->nblocks - e->old_nblocks[i]);
        s->nblocks = e->old_nblocks[i];
    }
}

/* What a step hands back: full rows (eng_step), or candidates plus the full
 * rows of flagged items (eng_step_cands). */
typedef struct step_out {
    float *logits;       /* full rows: every logits row, or with cands the flagged ones, packed */
    float *layer_states; /* optional */
    int k;               /* candidates per row; 0: full rows only */
    eng_cands *cands;    /* (logits rows) */
    const unsigned char *full; /* optional, per item, with cands */
} step_out;

/* Per-rank host results grow to the largest step seen: sizing them for
 * max_batch_tokens full rows up front would reserve gigabytes that only an
 * all-logits prefill ever uses. */
int eng_priv_step_reserve(eng *e, int nfull, int ncand, char *err, size_t errlen) {
    for (int k = 0; k < e->cfg.tp; k++) {
        eng_rank *r = &e->ranks[k];
        int v0, vn;
        if (e->procs && e->me != 0 && k != e->me) continue; /* rank 0 keeps every rank's results */
        eng_priv_vocab_slice(e, k, &v0, &vn);
        if (nfull > r->logits_rows) {
            float *nl = realloc(r->logits, (size_t)nfull * (size_t)(vn > 0 ? vn : 1) * sizeof(float));
            if (!nl) {
                snprintf(err, errlen, "step: out of memory for %d logits rows", nfull);
                return -1;
            }
            r->logits = nl;
            r->logits_rows = nfull;
        }
        if (ncand > r->cand_rows) {
            int32_t *ni = realloc(r->cand_ids, (size_t)ncand * KERN_TOPK_MAX * sizeof *ni);
            if (ni) r->cand_ids = ni;
            float *nv = ni ? realloc(r->cand_vals, (size_t)ncand * KERN_TOPK_MAX * sizeof *nv) : NULL;
            if (nv) r->cand_vals = nv;
            float *nl = nv ? realloc(r->cand_lse, (size_t)ncand * sizeof *nl) : NULL;
            if (!nl) {
                snprintf(err, errlen, "step: out of memory for %d candidate rows", ncand);
                return -1;
            }
            r->cand_lse = nl;
            r->cand_rows = ncand;
        }
    }
    return 0;
}

/* Logits row `row` from the ranks' candidates: each rank's list is sorted
 * (value desc, id asc) over its own slice, so a k-way merge gives the k best
 * of the whole vocabulary in the same order; lse = log sum_r exp(lse_r).
 * -1 when a slice held inf/nan (its lse is NaN). */
static int merge_cands(eng *e, int row, int k, eng_cands *c) {
    const int tp = e->cfg.tp;
    int head[64], kk[64], vn[64]; /* tp <= 64 (check_limits) */
    double mx = -INFINITY, sum = 0;
    for (int r = 0; r < tp; r++) {
        int v0;
        eng_priv_vocab_slice(e, r, &v0, &vn[r]);
        kk[r] = k < vn[r] ? k : vn[r];
        head[r] = 0;
        if (vn[r] <= 0) continue; /* an empty slice adds nothing */
        double l = e->ranks[r].cand_lse[row];
        if (!isfinite(l)) return -1;
        if (l > mx) mx = l;
    }
    for (int r = 0; r < tp; r++)
        if (vn[r] > 0) sum += exp((double)e->ranks[r].cand_lse[row] - mx);
    c->lse = mx + log(sum);
    int kout = k < e->mc.vocab_size ? k : e->mc.vocab_size;
    for (int t = 0; t < kout; t++) {
        int best = -1;
        float bv = 0;
        int32_t bi = 0;
        for (int r = 0; r < tp; r++) {
            if (head[r] >= kk[r]) continue;
            size_t o = (size_t)row * kk[r] + head[r];
            float v = e->ranks[r].cand_vals[o];
            int32_t id = e->ranks[r].cand_ids[o];
            if (best < 0 || v > bv || (v == bv && id < bi)) {
                best = r;
                bv = v;
                bi = id;
            }
        }
        c->ids[t] = bi;
        c->vals[t] = bv;
        head[best]++;
    }
    c->k = kout;
    return 0;
}

static int step_run(eng *e, const eng_item *it, int n, const step_out *out, char *err, size_t errlen) {
    const eng_config *c = &e->cfg;
    int need, ntok, nrows;
    if (out->cands && (out->k < 1 || out->k > KERN_TOPK_MAX)) {
        snprintf(err, errlen, "step: %d candidates per row (1..%d allowed)", out->k, KERN_TOPK_MAX);
        return -1;
    }
    if (step_check(e, it, n, c->max_batch_tokens, &need, &ntok, &nrows, err, errlen)) return -1;
    if (need > eng_blocks_available(&e->pool)) {
        snprintf(err, errlen, "step: needs %d KV blocks, %d free", need, eng_blocks_available(&e->pool));
        return ENG_ENOSPACE;
    }
    /* Take blocks; remember how many each sequence had so a failed pass
     * gives them back. */
    int tok = 0, row = 0, nfull = 0;
    e->q_start[0] = 0;
    for (int i = 0; i < n; i++) {
        eng_seq *s = &e->seqs[it[i].seq];
        e->old_nblocks[i] = s->nblocks;
        int want = (s->len + it[i].n_tokens + c->kv_block_size - 1) / c->kv_block_size;
        while (s->nblocks < want)
            s->blocks[s->nblocks++] = eng_blocks_take(&e->pool);
        /* the ids each position holds, for matching and registering its
         * block; only this sequence's own unshared blocks are written */
        for (int k = 0; e->pool.tok && k < it[i].n_tokens; k++) {
            int p = s->len + k;
            e->pool.tok[(size_t)s->blocks[p / c->kv_block_size] * c->kv_block_size + p % c->kv_block_size] =
                it[i].tokens[k];
        }
        memcpy(e->tokens + tok, it[i].tokens, (size_t)it[i].n_tokens * sizeof(int32_t));
        memcpy(e->table + (size_t)i * e->max_blocks_per_seq, s->blocks, (size_t)s->nblocks * sizeof(int32_t));
        e->pos0[i] = s->len;
        int r0 = row;
        if (rows_all(it[i].logits))
            for (int k = 0; k < it[i].n_tokens; k++) e->logit_rows[row++] = tok + k;
        else if (it[i].logits == ENG_LOGITS_LAST)
            e->logit_rows[row++] = tok + it[i].n_tokens - 1;
        int full = !out->cands || (out->full && out->full[i]);
        for (int k = r0; k < row; k++) e->row_full[k] = (unsigned char)full;
        nfull += full ? row - r0 : 0;
        tok += it[i].n_tokens;
        e->q_start[i + 1] = tok;
    }
    if (nfull && !out->logits) {
        step_rollback(e, it, n);
        snprintf(err, errlen, "step: %d full logits rows asked for and no array for them", nfull);
        return -1;
    }
    if (eng_priv_step_reserve(e, nfull, out->cands ? nrows : 0, err, errlen)) {
        step_rollback(e, it, n);
        return -1;
    }
    for (int k = 0; out->cands && k < c->tp; k++) {
        eng_rank *r = &e->ranks[k];
        r->topk = (model_topk){out->k, r->cand_ids, r->cand_vals, r->cand_lse, nfull ? e->row_full : NULL};
    }
    /* rank 0's request; the other ranks swap in their own (rank_main) */
    e->batch = (model_batch){n, e->tokens, e->q_start, e->pos0, e->table, e->max_blocks_per_seq,
                             e->logit_rows, nrows, out->layer_states, out->cands ? &e->ranks[0].topk : NULL};
    /* every rank runs the same step: threads, or the other processes (e->rk) */
    eng_step_shape sh = {n, tok, nrows, out->cands ? out->k : 0, nfull, out->layer_states != NULL};
    if (e->rk->start_step(e, &sh, err, errlen)) {
        step_rollback(e, it, n);
        return -1;
    }
    int rc = e->rk->finish_step(e, &sh, err, errlen);
    /* Gather the vocabulary slices into full rows (packed: with candidates,
     * only the flagged rows came back whole). */
    int V = e->mc.vocab_size;
    for (int k = 0; !rc && k < c->tp; k++) {
        int v0, vn;
        eng_priv_vocab_slice(e, k, &v0, &vn);
        for (int r = 0; r < nfull && vn > 0; r++)
            memcpy(out->logits + (size_t)r * V + v0, e->ranks[k].logits + (size_t)r * vn,
                   (size_t)vn * sizeof(float));
    }
    /* NaN/inf logits (corrupt weights, overflow) would otherwise become a
     * silently wrong token: argmax and sampling skip NaN. With candidates a
     * slice's NaN lse says the same (logits_topk); full rows of flagged
     * items are those same rows. */
    for (int r = 0; !rc && out->cands && r < nrows; r++) {
        if (merge_cands(e, r, out->k, &out->cands[r])) {
            snprintf(err, errlen, "step: the model produced a non-finite logit (row %d); corrupt weights?", r);
            rc = -1;
        }
    }
    for (size_t i = 0; !rc && !out->cands && i < (size_t)nfull * V; i++) {
        if (!isfinite(out->logits[i])) {
            snprintf(err, errlen, "step: the model produced a non-finite logit (row %zu, token %zu); corrupt weights?",
                     i / (size_t)V, i % (size_t)V);
            rc = -1;
        }
    }
    if (rc) {
        step_rollback(e, it, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        eng_seq *s = &e->seqs[it[i].seq];
        s->len += it[i].n_tokens;
        seq_register(e, s);
    }
    return 0;
}

/* ---- a step as passes fixed by positions (engine.h, "Passes") ---- */

/* One piece of an item: tokens [off, off + len) of item `item`. */
typedef struct step_seg {
    int item, off, len;
} step_seg;

/* Run one pass of `ns` pieces and put its results where the whole step's
 * would be. rbase/fbase/tbase: per item, its first logits row, first full
 * (packed) row and first token in the whole step. */
static int step_pass(eng *e, const eng_item *it, const step_seg *sg, int ns, const step_out *out, const int *rbase,
                     const int *fbase, const int *tbase, int ntok_all, char *err, size_t errlen) {
    const size_t V = (size_t)e->mc.vocab_size, H = (size_t)e->mc.hidden_size, L = (size_t)e->mc.num_layers;
    eng_item *sub = malloc((size_t)ns * sizeof *sub);
    unsigned char *sfull = malloc((size_t)ns);
    int rows = 0, nfull = 0, ntok = 0;
    if (!sub || !sfull) {
        free(sub);
        free(sfull);
        snprintf(err, errlen, "step: out of memory");
        return -1;
    }
    for (int j = 0; j < ns; j++) {
        const eng_item *o = &it[sg[j].item];
        int end = sg[j].off + sg[j].len == o->n_tokens;
        eng_logits lg = rows_all(o->logits) ? ENG_LOGITS_ALL
                        : o->logits == ENG_LOGITS_LAST && end ? ENG_LOGITS_LAST
                                                               : ENG_LOGITS_NONE;
        sub[j] = (eng_item){o->seq, o->tokens + sg[j].off, sg[j].len, lg};
        sfull[j] = !out->cands || (out->full && out->full[sg[j].item]);
        int r = lg == ENG_LOGITS_ALL ? sg[j].len : lg == ENG_LOGITS_LAST;
        rows += r;
        nfull += sfull[j] ? r : 0;
        ntok += sg[j].len;
    }
    float *lg_tmp = nfull ? malloc((size_t)nfull * V * sizeof(float)) : NULL;
    eng_cands *cd_tmp = out->cands && rows ? malloc((size_t)rows * sizeof *cd_tmp) : NULL;
    float *st_tmp = out->layer_states ? malloc(L * (size_t)ntok * H * sizeof(float)) : NULL;
    if ((nfull && !lg_tmp) || (out->cands && rows && !cd_tmp) || (out->layer_states && !st_tmp)) {
        free(lg_tmp);
        free(cd_tmp);
        free(st_tmp);
        free(sub);
        free(sfull);
        snprintf(err, errlen, "step: out of memory for a pass's results");
        return -1;
    }
    step_out po = {nfull ? lg_tmp : out->logits, st_tmp, out->k, out->cands ? cd_tmp : NULL,
                   out->cands ? sfull : NULL};
    int rc = step_run(e, sub, ns, &po, err, errlen);
    for (int j = 0, r = 0, f = 0, t = 0; !rc && j < ns; j++) {
        const step_seg *g = &sg[j];
        int nr = sub[j].logits == ENG_LOGITS_ALL ? g->len : sub[j].logits == ENG_LOGITS_LAST;
        int dst = rbase[g->item] + (sub[j].logits == ENG_LOGITS_ALL ? g->off : 0);
        if (out->cands && nr)
            memcpy(out->cands + dst, cd_tmp + r, (size_t)nr * sizeof *cd_tmp);
        if (sfull[j] && nr) {
            int fd = fbase[g->item] + (sub[j].logits == ENG_LOGITS_ALL ? g->off : 0);
            memcpy(out->logits + (size_t)fd * V, lg_tmp + (size_t)f * V, (size_t)nr * V * sizeof(float));
            f += nr;
        }
        for (size_t l = 0; st_tmp && l < L; l++)
            memcpy(out->layer_states + (l * (size_t)ntok_all + (size_t)tbase[g->item] + (size_t)g->off) * H,
                   st_tmp + (l * (size_t)ntok + (size_t)t) * H, (size_t)g->len * H * sizeof(float));
        r += nr;
        t += g->len;
    }
    free(lg_tmp);
    free(cd_tmp);
    free(st_tmp);
    free(sub);
    free(sfull);
    return rc;
}

/* The step as passes: the one-token items not at a multiple of C first,
 * together, then each item's tokens cut at the multiples of C, a pass
 * each. One pass that is the whole batch runs as it is. A failed pass
 * rolls back the ones before it: every sequence gets its length and blocks
 * back. */
static int step_canon(eng *e, const eng_item *it, int n, const step_out *out, char *err, size_t errlen) {
    const eng_config *c = &e->cfg;
    const int C = c->pass_tokens;
    int need, ntok, nrows;
    if (!e->canon) return step_run(e, it, n, out, err, errlen);
    if (step_check(e, it, n, 1L << 40, &need, &ntok, &nrows, err, errlen)) return -1;
    if (need > eng_blocks_available(&e->pool)) {
        snprintf(err, errlen, "step: needs %d KV blocks, %d free", need, eng_blocks_available(&e->pool));
        return ENG_ENOSPACE;
    }
    int nseg = 0, ndec = 0;
    for (int i = 0; i < n; i++) {
        int p = e->seqs[it[i].seq].len;
        int dec = (it[i].n_tokens == 1 && p % C) || it[i].logits == ENG_LOGITS_VERIFY;
        nseg += dec ? 1 : (p + it[i].n_tokens - 1) / C - p / C + 1;
        ndec += dec;
    }
    if (nseg == n && (ndec == n || n == 1)) return step_run(e, it, n, out, err, errlen); /* one pass */
    step_seg *sg = malloc((size_t)nseg * sizeof *sg);
    int *base = malloc((size_t)4 * n * sizeof *base);
    if (!sg || !base) {
        free(sg);
        free(base);
        snprintf(err, errlen, "step: out of memory");
        return -1;
    }
    int *rbase = base, *fbase = base + n, *tbase = base + 2 * n, *old_len = base + 3 * n;
    int *old_nb = malloc((size_t)n * sizeof *old_nb);
    eng_seq *old_seq = malloc((size_t)n * sizeof *old_seq); /* prefix-cache chain state, for the rollback */
    int rc = old_nb && old_seq ? 0 : -1;
    if (rc) snprintf(err, errlen, "step: out of memory");
    int nd = 0, ns = 0;
    for (int i = 0, r = 0, f = 0, t = 0; !rc && i < n; i++) {
        eng_seq *s = &e->seqs[it[i].seq];
        old_len[i] = s->len;
        old_nb[i] = s->nblocks;
        old_seq[i] = *s;
        rbase[i] = r;
        fbase[i] = f;
        tbase[i] = t;
        int nr = rows_all(it[i].logits) ? it[i].n_tokens : it[i].logits == ENG_LOGITS_LAST;
        r += nr;
        f += !out->cands || (out->full && out->full[i]) ? nr : 0;
        t += it[i].n_tokens;
        /* decodes first, a verified draft with its decode token (whole:
         * its rows are decode rows, whose bits depend on the batch anyway) */
        if ((it[i].n_tokens == 1 && s->len % C) || it[i].logits == ENG_LOGITS_VERIFY) sg[nd++] = (step_seg){i, 0, it[i].n_tokens};
    }
    ns = nd;
    for (int i = 0; !rc && i < n; i++) {
        if ((it[i].n_tokens == 1 && old_len[i] % C) || it[i].logits == ENG_LOGITS_VERIFY) continue;
        for (int off = 0; off < it[i].n_tokens;) {
            int p = old_len[i] + off, len = (p / C + 1) * C - p;
            if (len > it[i].n_tokens - off) len = it[i].n_tokens - off;
            sg[ns++] = (step_seg){i, off, len};
            off += len;
        }
    }
    /* the decode pass, then one pass per piece */
    if (!rc && nd) rc = step_pass(e, it, sg, nd, out, rbase, fbase, tbase, ntok, err, errlen);
    for (int j = nd; !rc && j < ns; j++) rc = step_pass(e, it, sg + j, 1, out, rbase, fbase, tbase, ntok, err, errlen);
    if (rc && old_nb && old_seq) {
        /* Blocks an earlier pass completed and registered stay in the
         * prefix cache (their KV is whole); the sequence forgets them. */
        for (int i = n - 1; i >= 0; i--) {
            eng_seq *s = &e->seqs[it[i].seq];
            if (s->nblocks > old_nb[i]) eng_blocks_release(&e->pool, s->blocks + old_nb[i], s->nblocks - old_nb[i]);
            s->nblocks = old_nb[i];
            s->len = old_len[i];
            s->nreg = old_seq[i].nreg;
            s->chain = old_seq[i].chain;
            s->chain_gen = old_seq[i].chain_gen;
            s->chain_broken = old_seq[i].chain_broken;
        }
        rc = rc == ENG_ENOSPACE ? -1 : rc; /* checked above: cannot happen */
    }
    free(old_seq);
    free(old_nb);
    free(sg);
    free(base);
    return rc;
}

int eng_step_states(eng *e, const eng_item *it, int n, float *logits, float *layer_states, char *err,
                    size_t errlen) {
    step_out out = {logits, layer_states, 0, NULL, NULL};
    return step_canon(e, it, n, &out, err, errlen);
}

int eng_step(eng *e, const eng_item *items, int n_items, float *logits, char *err, size_t errlen) {
    return eng_step_states(e, items, n_items, logits, NULL, err, errlen);
}

int eng_step_cands(eng *e, const eng_item *items, int n_items, int k, eng_cands *cands, const unsigned char *full,
                   float *logits, char *err, size_t errlen) {
    if (!cands) {
        snprintf(err, errlen, "step: no candidates array");
        return -1;
    }
    step_out out = {logits, NULL, k, cands, full};
    return step_canon(e, items, n_items, &out, err, errlen);
}
