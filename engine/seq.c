/*
 * engine/: sequence slots and their KV blocks: a new sequence (with the
 * prefix cache's blocks mapped in), freeing one, and the pool's usage.
 * Registering a step's completed prompt blocks is the step's (engine.c).
 */
#include <stdio.h>
#include <string.h>

#include "engine/budget.h"
#include "engine/internal.h"
#include "engine/seq.h"

int eng_seq_new(eng *e, int *seq, char *err, size_t errlen) {
    for (int i = 0; i < e->cfg.max_num_seqs; i++) {
        if (!e->seqs[i].live) {
            eng_seq *s = &e->seqs[i];
            s->live = 1;
            s->len = s->nblocks = s->cacheable = s->nreg = s->chain_broken = 0;
            s->chain = -1;
            s->chain_gen = 0;
            *seq = i;
            return 0;
        }
    }
    snprintf(err, errlen, "all %d sequence slots are in use", e->cfg.max_num_seqs);
    return ENG_ENOSPACE;
}

void eng_seq_free(eng *e, int seq) {
    if (seq < 0 || seq >= e->cfg.max_num_seqs || !e->seqs[seq].live) return;
    eng_seq *s = &e->seqs[seq];
    eng_blocks_release(&e->pool, s->blocks, s->nblocks);
    s->nblocks = 0;
    s->live = 0;
    s->len = 0;
}

int eng_seq_len(const eng *e, int seq) {
    if (seq < 0 || seq >= e->cfg.max_num_seqs || !e->seqs[seq].live) return -1;
    return e->seqs[seq].len;
}

int eng_seq_truncate(eng *e, int seq, int len) {
    if (seq < 0 || seq >= e->cfg.max_num_seqs || !e->seqs[seq].live) return -1;
    eng_seq *s = &e->seqs[seq];
    const int bs = e->cfg.kv_block_size;
    if (len > s->len || len < s->nreg * bs) return -1;
    int keep = (len + bs - 1) / bs;
    if (s->nblocks > keep) eng_blocks_release(&e->pool, s->blocks + keep, s->nblocks - keep);
    if (s->nblocks > keep) s->nblocks = keep;
    s->len = len;
    return 0;
}

int eng_seq_blocks(const eng *e, int seq) {
    if (seq < 0 || seq >= e->cfg.max_num_seqs || !e->seqs[seq].live) return -1;
    return e->seqs[seq].nblocks;
}

/* Full blocks of prompt[0..n) a sequence may map: at least one token is
 * left to compute (its logits sample the first output), and it lands in a
 * fresh block, so a shared block is never written. */
static int reuse_blocks(const eng *e, int n, int max_reuse) {
    int bs = e->cfg.kv_block_size, m = n > 0 ? (n - 1) / bs : 0;
    if (max_reuse >= 0 && max_reuse / bs < m) m = max_reuse / bs;
    return m < e->max_blocks_per_seq ? m : e->max_blocks_per_seq;
}

int eng_prefix_peek(const eng *e, const int32_t *prompt, int n, int max_reuse, int *evictable) {
    int ev = 0,
        m = e->pool.cache ? eng_blocks_match(&e->pool, prompt, reuse_blocks(e, n, max_reuse), e->match, &ev) : 0;
    if (evictable) *evictable = ev;
    return m * e->cfg.kv_block_size;
}

int eng_seq_new_prefix(eng *e, const int32_t *prompt, int n, int max_reuse, int *seq, int *reused, char *err,
                       size_t errlen) {
    *reused = 0;
    if (n < 0) {
        snprintf(err, errlen, "prompt of %d tokens", n);
        return -1;
    }
    int rc = eng_seq_new(e, seq, err, errlen);
    if (rc) return rc;
    eng_seq *s = &e->seqs[*seq];
    s->cacheable = n;
    if (!e->pool.cache || reuse_blocks(e, n, max_reuse) == 0) return 0;
    int m = eng_blocks_match(&e->pool, prompt, reuse_blocks(e, n, max_reuse), s->blocks, NULL);
    eng_blocks_hold(&e->pool, s->blocks, m);
    s->nblocks = s->nreg = m;
    s->len = m * e->cfg.kv_block_size;
    if (m > 0) {
        s->chain = s->blocks[m - 1];
        s->chain_gen = e->pool.gen[s->chain];
    }
    e->pc_queries++;
    e->pc_query_tokens += n;
    e->pc_hit_tokens += s->len;
    *reused = s->len;
    return 0;
}

void eng_kv_get_usage(const eng *e, eng_kv_usage *u) {
    memset(u, 0, sizeof *u);
    u->total_blocks = e->cfg.kv_blocks;
    u->free_blocks = eng_blocks_available(&e->pool);
    u->block_size = e->cfg.kv_block_size;
    u->prefix_cache = e->pool.cache;
    u->cached_blocks = e->pool.n_cached;
    u->evictable_blocks = e->pool.n_evictable;
    u->prefix_queries = e->pc_queries;
    u->prefix_query_tokens = e->pc_query_tokens;
    u->prefix_hit_tokens = e->pc_hit_tokens;
    u->evicted_blocks = e->pool.evicted;
    u->used_blocks = e->pool.n - e->pool.n_free;
    u->touched_blocks = e->pool.touched;
    u->block_bytes = eng_kv_block_bytes(&e->cfg, &e->mc);
}
