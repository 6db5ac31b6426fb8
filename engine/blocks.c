/*
 * engine/: the KV block pool and its prefix cache (see blocks.h).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/blocks.h"

int eng_blocks_init(eng_blocks *p, int n, int bs, int cache, uint64_t key) {
    memset(p, 0, sizeof *p);
    p->n = n;
    p->bs = bs;
    p->cache = cache;
    p->key = key;
    uint32_t nb = 1;
    while (nb < (uint32_t)n && nb < (1u << 30))
        nb <<= 1;
    p->mask = nb - 1;
    p->free = malloc((size_t)n * sizeof *p->free);
    p->ref = calloc((size_t)n, sizeof *p->ref);
    p->cached = calloc((size_t)n, 1);
    p->parent = malloc((size_t)n * sizeof *p->parent);
    p->pgen = calloc((size_t)n, sizeof *p->pgen);
    p->gen = calloc((size_t)n, sizeof *p->gen);
    /* token ids are only needed to match and register cached blocks */
    p->tok = cache ? malloc((size_t)n * (size_t)bs * sizeof *p->tok) : NULL;
    p->hnext = malloc((size_t)n * sizeof *p->hnext);
    p->head = malloc((size_t)nb * sizeof *p->head);
    p->lprev = malloc((size_t)n * sizeof *p->lprev);
    p->lnext = malloc((size_t)n * sizeof *p->lnext);
    if (!p->free || !p->ref || !p->cached || !p->parent || !p->pgen || !p->gen || (cache && !p->tok) || !p->hnext ||
        !p->head || !p->lprev || !p->lnext)
        return -1;
    for (int i = 0; i < n; i++)
        p->free[i] = n - 1 - i;
    p->n_free = n;
    for (uint32_t i = 0; i < nb; i++)
        p->head[i] = -1;
    p->lru_head = p->lru_tail = -1;
    return 0;
}

void eng_blocks_destroy(eng_blocks *p) {
    free(p->free);
    free(p->ref);
    free(p->cached);
    free(p->parent);
    free(p->pgen);
    free(p->gen);
    free(p->tok);
    free(p->hnext);
    free(p->head);
    free(p->lprev);
    free(p->lnext);
    memset(p, 0, sizeof *p);
}

int eng_blocks_available(const eng_blocks *p) {
    return p->n_free + p->n_evictable;
}

/* splitmix64's finaliser: a good spread for chained 64-bit values. */
static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static uint32_t bucket(const eng_blocks *p, int32_t parent, uint32_t pgen, const int32_t *tok) {
    uint64_t h = mix(p->key, (uint64_t)(uint32_t)parent << 32 | pgen);
    for (int i = 0; i < p->bs; i++)
        h = mix(h, (uint32_t)tok[i]);
    return (uint32_t)h & p->mask;
}

static int32_t lookup(const eng_blocks *p, int32_t parent, uint32_t pgen, const int32_t *tok) {
    for (int32_t b = p->head[bucket(p, parent, pgen, tok)]; b >= 0; b = p->hnext[b])
        if (p->parent[b] == parent && p->pgen[b] == pgen &&
            !memcmp(p->tok + (size_t)b * p->bs, tok, (size_t)p->bs * sizeof *tok))
            return b;
    return -1;
}

static void lru_unlink(eng_blocks *p, int32_t b) {
    if (p->lprev[b] >= 0)
        p->lnext[p->lprev[b]] = p->lnext[b];
    else
        p->lru_head = p->lnext[b];
    if (p->lnext[b] >= 0)
        p->lprev[p->lnext[b]] = p->lprev[b];
    else
        p->lru_tail = p->lprev[b];
    p->n_evictable--;
}

static void lru_append(eng_blocks *p, int32_t b) {
    p->lprev[b] = p->lru_tail;
    p->lnext[b] = -1;
    if (p->lru_tail >= 0)
        p->lnext[p->lru_tail] = b;
    else
        p->lru_head = b;
    p->lru_tail = b;
    p->n_evictable++;
}

/* Take b out of the hash table; its gen moves on, so children registered
 * under it can never match again. */
static void uncache(eng_blocks *p, int32_t b) {
    int32_t *pp = &p->head[bucket(p, p->parent[b], p->pgen[b], p->tok + (size_t)b * p->bs)];
    while (*pp != b)
        pp = &p->hnext[*pp];
    *pp = p->hnext[b];
    p->cached[b] = 0;
    p->gen[b]++;
    p->n_cached--;
}

int32_t eng_blocks_take(eng_blocks *p) {
    int32_t b;
    if (p->n_free > 0) {
        b = p->free[--p->n_free];
    } else if (p->lru_head >= 0) {
        b = p->lru_head;
        lru_unlink(p, b);
        uncache(p, b);
        p->evicted++;
    } else {
        return -1;
    }
    p->ref[b] = 1;
    if (b + 1 > p->touched) p->touched = b + 1;
    return b;
}

void eng_blocks_release(eng_blocks *p, const int32_t *ids, int n) {
    for (int i = n - 1; i >= 0; i--) {
        int32_t b = ids[i];
        if (--p->ref[b] > 0) continue;
        if (p->cached[b])
            lru_append(p, b);
        else
            p->free[p->n_free++] = b;
    }
}

int eng_blocks_match(const eng_blocks *p, const int32_t *tok, int nblk, int32_t *out, int *evictable) {
    int32_t parent = -1;
    uint32_t pgen = 0;
    int m = 0, ev = 0;
    for (; p->cache && m < nblk; m++) {
        int32_t b = lookup(p, parent, pgen, tok + (size_t)m * p->bs);
        if (b < 0) break;
        out[m] = b;
        ev += p->ref[b] == 0;
        parent = b;
        pgen = p->gen[b];
    }
    if (evictable) *evictable = ev;
    return m;
}

void eng_blocks_hold(eng_blocks *p, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        if (p->ref[ids[i]]++ == 0) lru_unlink(p, ids[i]);
    }
}

int32_t eng_blocks_register(eng_blocks *p, int32_t parent, uint32_t pgen, int32_t b) {
    if (!p->cache || (parent >= 0 && (!p->cached[parent] || p->gen[parent] != pgen))) return -1;
    const int32_t *tok = p->tok + (size_t)b * p->bs;
    int32_t have = lookup(p, parent, pgen, tok);
    if (have >= 0) return have;
    if (p->cached[b]) return -1; /* registered under another parent: never re-keyed */
    p->parent[b] = parent;
    p->pgen[b] = pgen;
    uint32_t h = bucket(p, parent, pgen, tok);
    p->hnext[b] = p->head[h];
    p->head[h] = b;
    p->cached[b] = 1;
    p->n_cached++;
    return b;
}
