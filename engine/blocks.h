/*
 * engine/ private: the pool of KV block ids and the automatic prefix cache
 * over it (seq.c's and the step's bookkeeping on rank 0; the block ids it hands out are
 * what every rank's block table maps, so every rank shares the same blocks).
 *
 * A block is free (on the free stack), held (ref > 0: sequences map it), or
 * cached and unreferenced (evictable: kept on an LRU list until its memory
 * is needed). A held block may also be cached. A cached block is keyed by
 * its parent's identity (block id and that block's generation, which is
 * bumped whenever a block leaves the cache, so a child of an evicted parent
 * can never be matched again) and the block's token ids, compared exactly:
 * the hash only picks a bucket, a match is never a hash collision. The
 * chain starts from `key` (everything else that changes the KV: one pool
 * lives and dies with its engine, whose model, preset, codec and tp are
 * fixed, so it is a constant per engine).
 */
#ifndef ECHO_ENGINE_BLOCKS_H
#define ECHO_ENGINE_BLOCKS_H

#include <stdint.h>

typedef struct eng_blocks {
    int n, bs; /* blocks, tokens per block */
    int cache; /* 1: prefix cache on */
    uint64_t key;
    int32_t *free; /* (n) stack of free ids */
    int n_free;
    int32_t *ref;               /* (n) sequences holding each block */
    uint8_t *cached;            /* (n) 1: in the hash table */
    int32_t *parent;            /* (n) cached: parent block, -1 at the root */
    uint32_t *pgen;             /* (n) cached: the parent's gen when registered */
    uint32_t *gen;              /* (n) bumped when the block leaves the cache */
    int32_t *tok;               /* (n, bs) token ids a step wrote */
    int32_t *hnext, *head;      /* hash chains: (n) and (nbuckets) */
    uint32_t mask;              /* nbuckets - 1 */
    int32_t *lprev, *lnext;     /* (n) LRU list of evictable blocks */
    int32_t lru_head, lru_tail; /* head: evicted first */
    int n_cached, n_evictable;
    long long evicted;
    /* 1 + the highest id ever taken: with the pop order below and freed
     * ids pushed back on top, exactly the blocks ever handed out (whose
     * cache pages have been written) */
    int touched;
} eng_blocks;

/* 0, or -1 when out of memory. Pop order 0, 1, 2, ... */
int eng_blocks_init(eng_blocks *p, int n, int bs, int cache, uint64_t key);
void eng_blocks_destroy(eng_blocks *p);
/* Blocks a step can take: free plus evictable. */
int eng_blocks_available(const eng_blocks *p);
/* A block for new KV, held once: a free one, else the least recently
 * released evictable one (it leaves the cache). -1 when none. */
int32_t eng_blocks_take(eng_blocks *p);
/* Drop one reference to each of ids[0..n), last first: an unreferenced
 * cached block becomes evictable (leaves before their ancestors: the list
 * is appended leaf first), any other goes back to the free stack. */
void eng_blocks_release(eng_blocks *p, const int32_t *ids, int n);
/* The longest chain of cached blocks whose tokens are tok[0 .. nblk*bs):
 * its ids into out (nblk), their count returned; *evictable gets how many
 * of them are unreferenced (they stop counting as available once mapped).
 * Changes nothing. */
int eng_blocks_match(const eng_blocks *p, const int32_t *tok, int nblk, int32_t *out, int *evictable);
/* Hold each of ids (matched by eng_blocks_match just before). */
void eng_blocks_hold(eng_blocks *p, const int32_t *ids, int n);
/* Register block b, full of the tokens a step wrote (tok), as the child of
 * (parent, pgen) (-1, 0: the root). Returns the block that now stands for
 * this content in the cache: b, or an equal block registered earlier (b
 * then stays uncached); -1 when the parent left the cache since (the
 * chain is broken: register nothing after it). */
int32_t eng_blocks_register(eng_blocks *p, int32_t parent, uint32_t pgen, int32_t b);

#endif
