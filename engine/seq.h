/*
 * engine/seq.h — sequences beyond new / free / len (engine.h): the KV blocks
 * a sequence holds, truncation (a rejected draft), the automatic prefix
 * cache, and the KV pool's usage.
 */
#ifndef ECHO_ENGINE_SEQ_H
#define ECHO_ENGINE_SEQ_H

#include <stdint.h>
#include <stddef.h>

#include "engine/engine.h"

int eng_seq_blocks(const eng *e, int seq);                    /* KV blocks it holds (shared ones included) */
/* Forget the tokens of `seq` from position `len` on (a rejected draft):
 * its length becomes len and the blocks past ceil(len / block) return to
 * the pool; what they held is never read. len must lie between the end of
 * the sequence's registered prompt blocks and its length (-1 otherwise,
 * nothing changes): a cached block is never given up this way. */
int eng_seq_truncate(eng *e, int seq, int len);

/* ---- automatic prefix cache ----
 * Rank 0's bookkeeping: the block ids it maps are those every rank's block
 * table names, so at any tp, as threads or processes, every rank reuses the
 * same blocks. A full KV block of prompt is registered in the cache once a
 * step has computed it, keyed by its token ids and its parent block's
 * (chained back to the first block); only prompt blocks (a prefill wrote
 * them), never decoded ones. Blocks are reference-counted; a cached block
 * no sequence holds stays until a step needs its memory (eng_kv_usage
 * counts it free) and is then evicted, least recently released first, a
 * sequence's last block before its first.
 * With --allreduce exact a chunk computed on top of cached blocks gives the
 * bits of one pass over the whole prompt (rows are computed independently
 * of the batch), so logits equal those without the cache; with a lossy
 * all-reduce (int4, echo) the cached KV is what an earlier pass computed,
 * close but not bit-equal (docs/accuracy.md). */

/* eng_seq_new for a sequence that will start with prompt[0..n): maps the
 * longest chain of cached full blocks that the prompt begins with, at most
 * (n - 1) / kv_block_size blocks, so at least one prompt token is left to
 * compute and it lands in a fresh block (a shared block is never written),
 * and at most max_reuse tokens (-1: no cap; 0: map nothing, e.g. prompt
 * logprobs needed from the start). *reused gets the tokens mapped (the
 * sequence's length): step prompt + *reused onward. The prompt's full
 * blocks are registered as steps complete them. ENG_ENOSPACE as
 * eng_seq_new. */
int eng_seq_new_prefix(eng *e, const int32_t *prompt, int n, int max_reuse, int *seq, int *reused, char *err,
                       size_t errlen);
/* The tokens eng_seq_new_prefix would map now, changing nothing;
 * *evictable (optional) gets how many of those blocks no sequence holds
 * (mapping them takes them out of the free count). */
int eng_prefix_peek(const eng *e, const int32_t *prompt, int n, int max_reuse, int *evictable);

typedef struct eng_kv_usage {
    int total_blocks, block_size;
    int free_blocks;      /* a step can take them: free, plus cached blocks no sequence holds */
    int prefix_cache;     /* 1: the prefix cache is on */
    int cached_blocks;    /* in the prefix cache, held or not */
    int evictable_blocks; /* cached, held by no sequence (part of free_blocks) */
    int used_blocks;      /* holding data: held by a sequence or cached */
    int touched_blocks;   /* ever handed out (their pages were written: memory the process holds) */
    size_t block_bytes;   /* KV bytes of one block on one rank (eng_kv_block_bytes) */
    /* since creation: eng_seq_new_prefix calls that looked the cache up,
     * their prompt tokens, the tokens they mapped, blocks evicted */
    long long prefix_queries, prefix_query_tokens, prefix_hit_tokens, evicted_blocks;
} eng_kv_usage;
void eng_kv_get_usage(const eng *e, eng_kv_usage *u);

#endif
