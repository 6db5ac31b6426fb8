/*
 * BPE of one pre-token by merge rank, as HF's Word::merge_all, behind the
 * lock-striped cache of short pre-tokens.
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

typedef struct bpe_sym {
    int32_t id;
    int32_t prev, next;
    int alive;
} sym;

typedef struct bpe_hent {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
} hent;

static int heap_less(const hent *a, const hent *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(scratch *sc, size_t *hn, hent e) {
    if (*hn == sc->hcap) {
        size_t cap = sc->hcap ? sc->hcap * 2 : 64;
        hent *p = realloc(sc->heap, cap * sizeof *p);
        if (!p) return TOK_ENOMEM;
        sc->heap = p;
        sc->hcap = cap;
    }
    size_t i = (*hn)++;
    while (i > 0) {
        size_t par = (i - 1) / 2;
        if (!heap_less(&e, &sc->heap[par])) break;
        sc->heap[i] = sc->heap[par];
        i = par;
    }
    sc->heap[i] = e;
    return TOK_OK;
}

static hent heap_pop(scratch *sc, size_t *hn) {
    hent top = sc->heap[0], last = sc->heap[--(*hn)];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&sc->heap[c + 1], &sc->heap[c])) c++;
        if (!heap_less(&sc->heap[c], &last)) break;
        sc->heap[i] = sc->heap[c];
        i = c;
    }
    if (n) sc->heap[i] = last;
    return top;
}

/* BPE of one pre-token, replicating HF's Word::merge_all exactly (same
 * queue order and the same staleness test, which compares only new ids). */
static int bpe_word(const tok_tokenizer *t, const char *w, size_t n, idvec *out, scratch *sc) {
    if (n == 1 && t->byte_id[(unsigned char)w[0]] >= 0)
        return tok_idvec_push(out, t->byte_id[(unsigned char)w[0]]);
    if (t->ignore_merges) {
        int32_t id = tok_vocab_find(t, w, n);
        if (id >= 0) return tok_idvec_push(out, id);
    }
    if (n > sc->cap) {
        sym *p = realloc(sc->syms, n * sizeof *p);
        if (!p) return TOK_ENOMEM;
        sc->syms = p;
        sc->cap = n;
    }
    sym *s = sc->syms;
    size_t ns = 0;
#define PUSH_SYM(x)                                                                                \
    do {                                                                                           \
        s[ns].id = (x);                                                                            \
        s[ns].prev = (int32_t)ns - 1;                                                              \
        s[ns].next = (int32_t)ns + 1;                                                              \
        s[ns].alive = 1;                                                                           \
        ns++;                                                                                      \
    } while (0)
    if (t->char_level) {
        /* One symbol per character, as HF's BPE::merge_word: an unknown
         * character becomes its "<0xXX>" tokens (byte_fallback, when all
         * exist), else unk (runs fused with fuse_unk), else nothing. */
        int pending_unk = 0;
        for (size_t i = 0; i < n;) {
            size_t j = i;
            tok_utf8_next((const unsigned char *)w, &j);
            int32_t id = tok_vocab_find(t, w + i, j - i);
            if (id >= 0) {
                if (pending_unk) PUSH_SYM(t->unk_id);
                pending_unk = 0;
                PUSH_SYM(id);
            } else {
                int fb = t->byte_fallback;
                for (size_t k = i; fb && k < j; k++) fb = t->fallback_id[(unsigned char)w[k]] >= 0;
                if (fb) {
                    for (size_t k = i; k < j; k++) PUSH_SYM(t->fallback_id[(unsigned char)w[k]]);
                } else if (t->unk_id >= 0) {
                    if (pending_unk && !t->fuse_unk) PUSH_SYM(t->unk_id);
                    pending_unk = 1;
                }
            }
            i = j;
        }
        if (pending_unk) PUSH_SYM(t->unk_id);
    } else {
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_id[(unsigned char)w[i]];
            if (id < 0) {
                /* Byte missing from the vocab: HF emits unk when it has one and
                 * fails otherwise; we drop the byte in the latter case. */
                if (t->unk_id < 0) continue;
                id = t->unk_id;
            }
            PUSH_SYM(id);
        }
    }
#undef PUSH_SYM
    if (ns == 0) return TOK_OK;
    s[ns - 1].next = -1;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const merge_slot *m = tok_merge_find(t, s[i].id, s[i + 1].id);
        if (m && heap_push(sc, &hn, (hent){m->rank, (int32_t)i, m->new_id})) return TOK_ENOMEM;
    }
    while (hn) {
        hent top = heap_pop(sc, &hn);
        sym *cur = &s[top.pos];
        if (!cur->alive || cur->next < 0) continue;
        sym *right = &s[cur->next];
        const merge_slot *m = tok_merge_find(t, cur->id, right->id);
        if (!m || m->new_id != top.new_id) continue;
        cur->id = top.new_id;
        right->alive = 0;
        cur->next = right->next;
        if (right->next >= 0) s[right->next].prev = top.pos;
        if (cur->prev >= 0) {
            m = tok_merge_find(t, s[cur->prev].id, cur->id);
            if (m && heap_push(sc, &hn, (hent){m->rank, cur->prev, m->new_id})) return TOK_ENOMEM;
        }
        if (cur->next >= 0) {
            m = tok_merge_find(t, cur->id, s[cur->next].id);
            if (m && heap_push(sc, &hn, (hent){m->rank, top.pos, m->new_id})) return TOK_ENOMEM;
        }
    }
    for (int32_t i = 0; i >= 0; i = s[i].next)
        if (tok_idvec_push(out, s[i].id)) return TOK_ENOMEM;
    return TOK_OK;
}

/* BPE through the cache. Short words only: long ones are rare and would
 * evict the frequent ones. */
int tok_bpe_cached(const tok_tokenizer *t, const char *w, size_t n, idvec *out, scratch *sc) {
    if (n <= 1 || n > CACHE_MAX_WORD) return bpe_word(t, w, n, out, sc);
    uint64_t h = tok_hash_bytes(w, n);
    cache_stripe *st = &t->cache[h % CACHE_STRIPES];
    cache_ent *e = &st->ents[(h / CACHE_STRIPES) % CACHE_WAYS];
    int32_t ids[CACHE_MAX_IDS];
    int hit = 0;
    size_t k = 0;
    pthread_mutex_lock(&st->mu);
    if (e->hash == h && e->wlen == n && !memcmp(e->word, w, n)) {
        hit = 1;
        k = e->nids;
        memcpy(ids, e->ids, k * sizeof *ids);
    }
    pthread_mutex_unlock(&st->mu);
    if (hit) {
        for (size_t i = 0; i < k; i++)
            if (tok_idvec_push(out, ids[i])) return TOK_ENOMEM;
        return TOK_OK;
    }
    size_t before = out->n;
    int rc = bpe_word(t, w, n, out, sc);
    k = out->n - before;
    if (rc == TOK_OK && k <= CACHE_MAX_IDS) {
        pthread_mutex_lock(&st->mu);
        e->hash = h;
        e->wlen = (uint8_t)n;
        e->nids = (uint8_t)k;
        memcpy(e->word, w, n);
        if (k) memcpy(e->ids, out->ids + before, k * sizeof *ids); /* ids may be NULL */
        pthread_mutex_unlock(&st->mu);
    }
    return rc;
}
