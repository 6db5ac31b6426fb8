/*
 * engine/: ranks as processes under mpirun ("procs" mode, engine.c's
 * header), one row of the ranks table (internal.h; threads.c has ranks as
 * threads): the step messages rank 0 broadcasts (OP_STEP with the batch,
 * OP_DESTROY), the gather of every process's results after a step, and a
 * step as a process of rank > 0 runs it (follow.c's loop). OP_CREATE goes
 * out from eng_create. docs/network.md has the protocol.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

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

static int procs_start_step(eng *e, const eng_step_shape *s, char *err, size_t errlen) {
    ctl_hdr h = {OP_STEP, s->n, s->ntok, s->nrows, e->max_blocks_per_seq, s->k, s->nfull, s->states};
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
static int step_gather(eng *e, int nrows, int k, int nfull, int rc, char *err, size_t errlen) {
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
int eng_priv_follow_step(eng *e, const ctl_hdr *h, char *err, size_t errlen) {
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
    rc = eng_priv_rank_forward(e, lerr, sizeof lerr);
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

/* ---- the procs row: rank 0's side ---- */

/* This process's rank runs the step, then every process's results come in. */
static int procs_finish_step(eng *e, const eng_step_shape *s, char *err, size_t errlen) {
    int rc = eng_priv_rank_forward(e, err, errlen);
    return step_gather(e, s->nrows, s->k, s->nfull, rc, err, errlen);
}

/* The others destroy theirs (a dead peer is not waited for). Not after a
 * failed create (e->procs cleared: they failed too) nor on a follower. */
static void procs_destroy(eng *e) {
    if (!e->procs || e->me != 0) return;
    ctl_hdr h = {.op = OP_DESTROY};
    char err[256];
    echo_proc_bcast(&h, sizeof h, err, sizeof err);
}

/* No create: the others made theirs when eng_create sent OP_CREATE. */
const eng_ranks_ops eng_priv_ranks_procs = {"procs", NULL, procs_start_step, procs_finish_step, procs_destroy};
