/*
 * Private to engine/: struct eng and what its files share: engine.c (the
 * step), create.c (eng_create and its stages, eng_destroy), config.c
 * (eng_config's field list: its wire form and key), the ranks table's rows
 * threads.c (ranks as threads) and proc.c (ranks as processes: a step's
 * batch out and results back), follow.c (eng_follow), seq.c (sequences).
 */
#ifndef ECHO_ENGINE_INTERNAL_H
#define ECHO_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "comm/proc.h"
#include "engine/blocks.h"
#include "engine/engine.h"
#include "engine/step.h"
#include "kernels/kernels.h"
#include "weights/weights.h"

typedef struct eng_ranks_ops eng_ranks_ops;

typedef struct eng_rank {
    eng *e;
    int rank;
    const kern_ops *ops;
    kern_backend *be;
    echo_comm *comm;
    model *m;
    eng_runner run; /* runs m's steps (step.c) */
    pthread_t thread;
    int started;
    float *logits; /* (logits_rows, vocab slice) host, grown on demand */
    int logits_rows;
    /* eng_step_cands: this rank's candidates, (cand_rows, KERN_TOPK_MAX)
     * and (cand_rows), grown on demand, and the request that points at them */
    int32_t *cand_ids;
    float *cand_vals, *cand_lse;
    int cand_rows;
    model_topk topk;
    int rc;
    char err[512];
} eng_rank;

typedef struct eng_seq {
    int live;
    int len;     /* tokens in the cache */
    int nblocks; /* blocks held */
    int32_t *blocks;
    /* prefix cache: the first `cacheable` tokens are prompt (their full
     * blocks are registered once computed); blocks [0, nreg) are done; the
     * next one registers as the child of (chain, chain_gen); chain_broken:
     * that parent left the cache, register no more */
    int cacheable, nreg, chain_broken;
    int32_t chain;
    uint32_t chain_gen;
} eng_seq;

struct eng {
    eng_config cfg;
    const eng_ranks_ops *rk; /* how the ranks run: threads or processes */
    model_config mc;
    weights_set *ws;
    echo_world *world;
    eng_rank *ranks;
    int max_blocks_per_seq;
    /* KV block ids, shared by all ranks (each rank has the same block
     * geometry for its own KV heads), and the prefix cache over them */
    eng_blocks pool;
    int32_t *match; /* (max_blocks_per_seq) eng_seq_new_prefix scratch */
    long long pc_queries, pc_query_tokens, pc_hit_tokens;
    eng_seq *seqs;
    /* step staging */
    int32_t *tokens, *q_start, *pos0, *table, *logit_rows;
    int *old_nblocks; /* per item: blocks held before the step (rollback) */
    int logit_cap;
    unsigned char *row_full; /* (logit_cap) per logits row: comes back whole */
    /* rank dispatch */
    pthread_mutex_t mu;
    pthread_cond_t go_cv, done_cv;
    unsigned long generation;
    int pending, stop;
    int job; /* what the ranks' threads run at this generation (rank_job) */
    model_batch batch;
    long comm_resets; /* eng_comm_resets */
    /* procs mode: ranks are the processes of the job, this one is `me`
     * (only ranks[me] has a backend, model and comm); 0 / 0 otherwise */
    int procs, me;
    int local_dev; /* procs mode: this process's GPU, its node-local rank */
    char *gather; /* rank 0: the gathered results of a step */
    size_t gather_cap;
    int dead; /* procs mode: a control message failed (a peer died): no more steps */
    char why[256];
    int canon; /* steps run as passes fixed by positions (eng_pass_tokens) */
    int ov_k;  /* micro-batches of a prefill (eng_overlap_k); 1: off */
    int auto_ran; /* the all-reduce was chosen by measurement (eng_allreduce_auto) */
    echo_auto_figures auto_fig;
    echo_auto_choice auto_choice;
    echo_world *ov_worlds[MODEL_MAX_MB]; /* ov_k - 1 more worlds: micro-batch i > 0's all-reduces (overlap.h) */
};

/* ---- procs mode: the control messages between rank 0 and the others ----
 * Every message starts with a ctl_hdr broadcast from rank 0; OP_CREATE is
 * followed by the config (eng_priv_cfg_bcast), OP_STEP by the batch arrays. After a step every
 * process sends rank 0 its status and results (one gather). */
enum { OP_CREATE = 1, OP_STEP, OP_DESTROY, OP_EXIT };

typedef struct ctl_hdr {
    int32_t op;
    int32_t n, ntok, nrows, max_blocks, k, nfull, states;
} ctl_hdr;

/* ---- how the ranks run: one row per way, as comm/ has transports ----
 * eng_step stages a step's batch (e->batch and the arrays it points at),
 * then start_step sends it to the ranks other than this process's, and
 * finish_step runs this process's rank and brings the others' results into
 * e->ranks[*] (-1 with the first failure's message). create starts them
 * once every rank of this process has its model (optional); destroy stops
 * them, before the models go. */
typedef struct eng_step_shape {
    int n, ntok, nrows, k, nfull, states; /* items, tokens, logits rows, candidates each, full rows, layer states */
} eng_step_shape;
struct eng_ranks_ops {
    const char *name;
    int (*create)(eng *e, char *err, size_t errlen);
    int (*start_step)(eng *e, const eng_step_shape *s, char *err, size_t errlen);
    int (*finish_step)(eng *e, const eng_step_shape *s, char *err, size_t errlen);
    void (*destroy)(eng *e);
};
extern const eng_ranks_ops eng_priv_ranks_threads; /* threads.c */
extern const eng_ranks_ops eng_priv_ranks_procs;   /* proc.c */

/* engine.c */
void eng_priv_vocab_slice(const eng *e, int r, int *v0, int *vn);
int eng_priv_step_reserve(eng *e, int nfull, int ncand, char *err, size_t errlen);

/* create.c */
int eng_priv_create(const eng_config *cfg, int procs, eng **out, char *err, size_t errlen);

/* config.c: rank 0's *c to every process (collective). Rank 0: 0 or -1
 * (the others then hear that no engine comes). The others: 0 with every
 * field of *c from rank 0, its strings in *keep (free it after the engine
 * made from c); 1 when rank 0 could not send one; -1 when the message
 * failed (a config this rank cannot take ends the job: rank 0 waits). */
int eng_priv_cfg_bcast(eng_config *c, char **keep, char *err, size_t errlen);
/* What the cached KV depends on besides the tokens (blocks.h's key). */
uint64_t eng_priv_config_key(const eng_config *c);

/* threads.c: this process's rank runs e->batch ("rank R: why" on failure;
 * a rank that fails on its own under mpirun ends the job) */
int eng_priv_rank_forward(eng *e, char *err, size_t errlen);

/* proc.c: a process of rank > 0 runs the step rank 0 described in h */
int eng_priv_follow_step(eng *e, const ctl_hdr *h, char *err, size_t errlen);

#endif
