/*
 * Private to engine/: struct eng and what its files share: engine.c (the
 * step), create.c (eng_create's stages, eng_destroy), threads.c (the
 * ranks' threads), seq.c (sequences) and proc.c (the multi-process control
 * plane: eng_create under mpirun, a step's batch out and results back,
 * eng_follow).
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
 * followed by a wire_cfg, OP_STEP by the batch arrays. After a step every
 * process sends rank 0 its status and results (one gather). */
enum { OP_CREATE = 1, OP_STEP, OP_DESTROY, OP_EXIT };

typedef struct ctl_hdr {
    int32_t op;
    int32_t n, ntok, nrows, max_blocks, k, nfull, states;
} ctl_hdr;

/* engine.c */
void eng_priv_vocab_slice(const eng *e, int r, int *v0, int *vn);
int eng_priv_step_reserve(eng *e, int nfull, int ncand, char *err, size_t errlen);

/* create.c */
int eng_priv_create(const eng_config *cfg, int procs, eng **out, char *err, size_t errlen);
/* create.c: --kv-cache-memory auto (ENG_KV_MEMORY_AUTO) made bytes, from
 * this host's MemAvailable (eng_config.kv_cache_memory); 0 or -1. */
int eng_priv_kv_memory(eng_config *c, char *err, size_t errlen);

/* threads.c */
void *eng_priv_rank_main(void *arg);
int eng_priv_ranks_forward(eng *e, char *err, size_t errlen);

/* proc.c */
int eng_priv_procs_agree(const eng *e, int rc, char *err, size_t errlen);
int eng_priv_step_send(eng *e, int n, int ntok, int nrows, int k, int nfull, int states, char *err, size_t errlen);
int eng_priv_step_gather(eng *e, int nrows, int k, int nfull, int rc, char *err, size_t errlen);

#endif
