/*
 * engine/: ranks, KV block bookkeeping and the batched step (see engine.h).
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
 * step on their rank. The control plane is proc.c; docs/network.md has the
 * protocol.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/internal.h"
#include "engine/overlap.h"

const model_config *eng_model_config(const eng *e) { return &e->mc; }
const eng_config *eng_get_config(const eng *e) { return &e->cfg; }

int eng_pass_tokens(const eng *e) { return e->canon ? e->cfg.pass_tokens : 0; }
int eng_overlap_k(const eng *e) { return e->ov_k; }

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

/* What a rank's thread runs: the step's forward pass, or dropping its
 * graphs (ranks_rearm). */
enum { RANK_FORWARD, RANK_DROP_GRAPHS };

static void rank_job(eng_rank *r, int job, model_batch b) {
    if (job == RANK_DROP_GRAPHS) {
        eng_runner_drop_graphs(&r->run);
        return;
    }
    if (r != &r->e->ranks[0]) {
        b.layer_states = NULL; /* rank 0 reports; the stream is replicated */
        if (b.topk) b.topk = &r->topk; /* each rank fills its own candidates */
    }
    /* at tp > 1 a failed step aborts the world: peers must not wait for us in a collective */
    r->rc = eng_run_step(&r->run, &b, r->logits, r->err, sizeof r->err);
    /* Another process cannot be woken from a blocking collective: a rank
     * that failed on its own ends the job, saying why. */
    if (r->rc && r->e->procs && r->run.aborted) echo_proc_abort(1, r->err);
}

static void *rank_main(void *arg) {
    eng_rank *r = arg;
    eng *e = r->e;
    unsigned long seen = 0;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stop && e->generation == seen) pthread_cond_wait(&e->go_cv, &e->mu);
        if (e->stop) break;
        seen = e->generation;
        model_batch b = e->batch;
        int job = e->job;
        pthread_mutex_unlock(&e->mu);
        rank_job(r, job, b);
        pthread_mutex_lock(&e->mu);
        if (--e->pending == 0) pthread_cond_signal(&e->done_cv);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Run `job` on every rank: rank 0 on this thread, the others on theirs. */
static void ranks_run(eng *e, int job) {
    int tp = e->cfg.tp;
    if (e->procs) {
        rank_job(&e->ranks[e->me], job, e->batch);
        return;
    }
    if (tp > 1) {
        pthread_mutex_lock(&e->mu);
        e->job = job;
        e->pending = tp - 1;
        e->generation++;
        pthread_cond_broadcast(&e->go_cv);
        pthread_mutex_unlock(&e->mu);
    }
    rank_job(&e->ranks[0], job, e->batch);
    if (tp > 1) {
        pthread_mutex_lock(&e->mu);
        while (e->pending > 0) pthread_cond_wait(&e->done_cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
    }
}

/* Re-arm the world after a step that aborted it, once every rank has
 * returned. The one place of the rule "drop graphs before clear_abort":
 * NCCL frees the aborted communicators (and echo_world_clear_abort creates
 * new ones) only once every graph that captured their calls is destroyed,
 * and each rank drops its own on its thread, where its device is current. */
static void ranks_rearm(eng *e) {
    ranks_run(e, RANK_DROP_GRAPHS);
    if (echo_world_usable(e->world, NULL, 0)) { /* a dead one cannot be re-armed (eng_usable says so) */
        echo_world_clear_abort(e->world);
        for (int i = 1; i < e->ov_k; i++) echo_world_clear_abort(e->ov_worlds[i - 1]);
        e->comm_resets++;
    }
}

int eng_priv_ranks_forward(eng *e, char *err, size_t errlen) {
    int tp = e->cfg.tp;
    ranks_run(e, RANK_FORWARD);
    if (e->procs) { /* the other processes' status comes with their results (eng_priv_step_gather) */
        eng_rank *r = &e->ranks[e->me];
        if (r->rc) snprintf(err, errlen, "rank %d: %s", e->me, r->err);
        return r->rc ? -1 : 0;
    }
    /* Report the rank that failed first-hand, not the peers it aborted. */
    int first = -1;
    for (int i = 0; i < tp; i++) {
        if (e->ranks[i].rc && (first < 0 || (strstr(e->ranks[first].err, "aborted because another rank") &&
                                             !strstr(e->ranks[i].err, "aborted because another rank"))))
            first = i;
    }
    if (first < 0) return 0;
    snprintf(err, errlen, "rank %d: %s", first, e->ranks[first].err);
    int aborted = 0;
    for (int i = 0; i < tp; i++)
        aborted |= e->ranks[i].run.aborted;
    if (aborted) ranks_rearm(e);
    return -1;
}

/* What the cached KV depends on besides the tokens (blocks.h's key): fixed
 * for an engine's life, so a cache never outlives it; folded in so the
 * chain names all of it. */
static uint64_t config_key(const eng_config *c) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = c->model_dir ? c->model_dir : ""; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    const int v[] = {c->tp,       (int)c->allreduce, c->echo_group,    (int)c->echo_codec,
                     c->quantize, c->act_quant,      c->kv_block_size, (int)c->echo_min_bytes};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        h = (h ^ (uint32_t)v[i]) * 1099511628211ull;
    return h;
}

/* ---- transport and backend rows (comm/echo.h, kernels/kernels.h) ---- */

/* "auto" is no row's name: the engine picks the row (pick_transport,
 * kern_backend_find). */
static int is_auto(const char *name) { return !strcmp(name, "auto"); }

/* Where ranks as threads on host memory go (local). */
static const echo_transport_info *host_transport(void) {
    for (int i = 0; echo_transport_at(i); i++)
        if (echo_transport_at(i)->threads && echo_transport_at(i)->device_memory != 1) return echo_transport_at(i);
    return NULL;
}

/* The transport of ranks as threads with one device each, or as processes
 * (procs) on devices (dev) or on host memory: nccl, nccl, mpi. */
static const echo_transport_info *pick_row(int procs, int dev) {
    for (int i = 0; echo_transport_at(i); i++) {
        const echo_transport_info *t = echo_transport_at(i);
        if ((procs ? t->multi_process : t->threads) && (dev ? t->device_memory == 1 : t->device_memory == 0))
            return t;
    }
    return NULL;
}

/* The first device backend (cuda). */
static const kern_backend_info *device_backend(void) {
    for (int i = 0; kern_backend_at(i); i++)
        if (!kern_backend_at(i)->host) return kern_backend_at(i);
    return kern_backend_at(0);
}

/* Ranks as threads, one GPU each, on a transport whose calls can be
 * deferred and captured (nccl): the all-reduces then only enqueue, each
 * pass waits once (echo_end_pass), and decode steps may be graphs. */
static int capturable(const eng_config *c, int gpu_per_rank) {
    const echo_transport_info *t = echo_transport_find(c->transport);
    return gpu_per_rank && t && t->capturable;
}

/* 1 when the named backend runs on the host ("auto" is not resolved: 0). */
static int host_device(const char *device) {
    const kern_backend_info *b = is_auto(device) ? NULL : kern_backend_find(device);
    return b && b->host;
}

static void fill_defaults(eng_config *c, const model_config *mc) {
    if (!c->device) c->device = "cpu";
    if (!c->transport) c->transport = "auto";
    if (c->tp <= 0) c->tp = 1;
    if (c->kv_block_size <= 0) c->kv_block_size = 16;
    if (c->max_model_len <= 0) c->max_model_len = mc->max_position_embeddings < 4096 ? mc->max_position_embeddings : 4096;
    if (c->max_num_seqs <= 0) c->max_num_seqs = 8;
    if (c->max_batch_tokens <= 0) c->max_batch_tokens = c->max_model_len > 512 ? c->max_model_len : 512;
    if (c->pass_tokens <= 0) c->pass_tokens = ENG_PASS_TOKENS;
    if (c->pass_tokens > c->max_batch_tokens) c->pass_tokens = c->max_batch_tokens;
    if (c->kv_blocks <= 0) {
        long long per = (c->max_model_len + c->kv_block_size - 1) / c->kv_block_size;
        long long total = per * c->max_num_seqs;
        c->kv_blocks = total > (1 << 30) ? (1 << 30) : (int)total;
    }
}

static int check_limits(const eng_config *c, const model_config *mc, char *err, size_t errlen) {
    if (c->max_model_len > mc->max_position_embeddings) {
        snprintf(err, errlen, "max model length %d exceeds the model's max_position_embeddings %d", c->max_model_len,
                 mc->max_position_embeddings);
        return -1;
    }
    if (c->kv_block_size > 4096 || c->max_num_seqs > 65536 || c->max_batch_tokens > (1 << 24) || c->tp > 64) {
        snprintf(err, errlen, "engine limits out of range (kv block size <= 4096, max seqs <= 65536, "
                              "batch tokens <= 16M, tp <= 64)");
        return -1;
    }
    if (c->max_batch_tokens < 1 || c->max_model_len < 1) {
        snprintf(err, errlen, "max batch tokens and max model length must be >= 1");
        return -1;
    }
    const echo_transport_info *t = echo_transport_find(c->transport);
    if (!t && !is_auto(c->transport)) {
        size_t len = (size_t)snprintf(err, errlen, "unknown all-reduce transport \"%s\" (auto", c->transport);
        for (int i = 0; echo_transport_at(i) && len < errlen; i++)
            len += (size_t)snprintf(err + len, errlen - len, ", %s", echo_transport_at(i)->name);
        if (len < errlen) snprintf(err + len, errlen - len, ")");
        return -1;
    }
    const kern_backend_info *b = kern_backend_find(c->device);
    if (host_device(c->device) && t && t->device_memory == 1) {
        snprintf(err, errlen, "the %s transport needs --device %s (the %s backend's ranks are threads: use %s)",
                 t->name, device_backend()->name, b->name, host_transport()->name);
        return -1;
    }
    return 0;
}

/* Resolve the transport for tp > 1 and each rank's GPU (engine_create). */
static int pick_transport(eng_config *c, int *gpu_per_rank, char *err, size_t errlen) {
    *gpu_per_rank = 0;
    if (host_device(c->device)) {
        c->transport = host_transport()->name;
        return 0;
    }
    int gpus = kern_gpu_count();
    const echo_transport_info *dev = pick_row(0, 1);
    if (is_auto(c->transport)) c->transport = gpus >= c->tp ? dev->name : host_transport()->name;
    const echo_transport_info *t = echo_transport_find(c->transport);
    if (t && t->device_memory == 1) {
        if (gpus < c->tp) {
            snprintf(err, errlen, "--tp %d with the %s transport needs %d GPUs, %d visible (the %s transport runs "
                     "every rank on one GPU)", c->tp, t->name, c->tp, gpus, host_transport()->name);
            return -1;
        }
        *gpu_per_rank = 1;
    }
    return 0;
}

/* Everything a rank needs before the all-reduce world: config, checks,
 * weights, this process's backends. */
static int create_prep(eng *e, int *gpu_per_rank, char *err, size_t errlen) {
    eng_config *c = &e->cfg;
    if (model_config_load(c->model_dir, &e->mc, err, errlen)) return -1;
    fill_defaults(c, &e->mc);
    if (check_limits(c, &e->mc, err, errlen) || model_check_tp(&e->mc, c->tp, err, errlen)) return -1;
    if (e->procs) {
        int n = echo_proc_count();
        if (c->tp != n) {
            snprintf(err, errlen, "--tp %d, but mpirun started %d processes: one tensor-parallel rank per process "
                     "(mpirun -np %d ...)", c->tp, n, c->tp);
            return -1;
        }
        /* on a GPU: one per process, its node-local rank's (NCCL across
         * processes); on cpu: host memory over MPI */
        const kern_backend_info *b = kern_backend_find(c->device);
        int gpu = b && !b->host;
        const char *want = pick_row(1, gpu)->name;
        if (!is_auto(c->transport) && echo_transport_find(c->transport) != echo_transport_find(want)) {
            snprintf(err, errlen, "under mpirun the ranks are processes: with --device %s the transport is %s "
                     "(auto), not %s", c->device, want, c->transport);
            return -1;
        }
        c->transport = want;
        const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
        e->local_dev = lr ? atoi(lr) : 0;
        int gpus = gpu ? kern_gpu_count() : 0;
        if (gpus > 0 && e->local_dev >= gpus) { /* none: the backend says why */
            snprintf(err, errlen, "process %d is local rank %d on its host, which has %d GPU%s visible: one GPU per "
                     "process (mpirun -np N with N GPUs per host, or -H host:GPUS)", e->me, e->local_dev, gpus,
                     gpus == 1 ? "" : "s");
            return -1;
        }
    } else if (echo_transport_find(c->transport) && !echo_transport_find(c->transport)->threads) {
        snprintf(err, errlen, "--transport mpi: start one process per rank with mpirun -np %d", c->tp);
        return -1;
    }
    if (!model_is_random(c->model_dir) && weights_open(c->model_dir, &e->ws, err, errlen)) return -1;

    e->max_blocks_per_seq = (c->max_model_len + c->kv_block_size - 1) / c->kv_block_size;
    if (eng_blocks_init(&e->pool, c->kv_blocks, c->kv_block_size, !c->no_prefix_cache, config_key(c))) {
        snprintf(err, errlen, "out of memory for the KV block pool");
        return -1;
    }
    e->match = malloc((size_t)e->max_blocks_per_seq * sizeof *e->match);
    e->seqs = calloc((size_t)c->max_num_seqs, sizeof *e->seqs);
    e->tokens = malloc((size_t)c->max_batch_tokens * sizeof *e->tokens);
    e->q_start = malloc((size_t)(c->max_num_seqs + 1) * sizeof *e->q_start);
    e->pos0 = malloc((size_t)c->max_num_seqs * sizeof *e->pos0);
    /* zeroed: a graph step stages whole rows, unused entries included */
    e->table = calloc((size_t)c->max_num_seqs * e->max_blocks_per_seq, sizeof *e->table);
    e->logit_cap = c->max_batch_tokens;
    e->logit_rows = malloc((size_t)e->logit_cap * sizeof *e->logit_rows);
    e->old_nblocks = malloc((size_t)c->max_num_seqs * sizeof *e->old_nblocks);
    e->row_full = malloc((size_t)e->logit_cap);
    e->ranks = calloc((size_t)c->tp, sizeof *e->ranks);
    if (!e->match || !e->seqs || !e->tokens || !e->q_start || !e->pos0 || !e->table || !e->logit_rows ||
        !e->old_nblocks || !e->row_full || !e->ranks) {
        snprintf(err, errlen, "out of memory for engine bookkeeping");
        return -1;
    }
    for (int i = 0; i < c->max_num_seqs; i++) {
        e->seqs[i].blocks = malloc((size_t)e->max_blocks_per_seq * sizeof(int32_t));
        if (!e->seqs[i].blocks) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }

    if (c->tp > 1 && !e->procs && pick_transport(c, gpu_per_rank, err, errlen)) return -1;
    /* Only the exact all-reduce on cpu threads sums every value the same
     * way whatever the message (local.c: rank order, fp32); MPI's and
     * NCCL's pick algorithms by size, the codecs group and shard the
     * message (engine.h, "Passes"). */
    const echo_transport_info *tr = echo_transport_find(c->transport);
    e->canon = c->tp > 1 && (c->allreduce != ECHO_PRESET_EXACT || !(tr && tr->exact_rank_order) ||
                             !host_device(c->device));
    int threads = c->threads;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
        /* processes on one host share its cores */
        const char *local = e->procs ? getenv("OMPI_COMM_WORLD_LOCAL_SIZE") : NULL;
        if (local && atoi(local) > 1) threads = threads / atoi(local) > 0 ? threads / atoi(local) : 1;
    }
    int per_rank = e->procs ? threads : threads / c->tp > 0 ? threads / c->tp : 1;
    /* Backends first: a missing GPU is reported by the backend ("use
     * --device cpu") rather than by the transport. */
    for (int i = 0; i < c->tp; i++) {
        eng_rank *r = &e->ranks[i];
        r->e = e;
        r->rank = i;
        if (e->procs && i != e->me) continue; /* another process's rank */
        /* nccl: rank i drives GPU i (procs: its local rank's); local on a device: all share GPU 0 */
        int dev = e->procs ? e->local_dev : *gpu_per_rank ? i : 0;
        if (kern_backend_create(c->device, per_rank, dev, &r->ops, &r->be, err, errlen)) return -1;
    }
    return 0;
}

static int create_world(eng *e, int gpu_per_rank, char *err, size_t errlen) {
    const eng_config *c = &e->cfg;
    if (c->tp == 1) return 0;
    echo_config ec = {.min_bytes = c->echo_min_bytes,
                      .n_sites = 2 * e->mc.num_layers,
                      .max_count = (size_t)c->max_batch_tokens * e->mc.hidden_size,
                      /* nccl: calls only enqueue and each pass waits once (eng_run_step's
                       * echo_end_pass), which also lets decode steps be CUDA graphs */
                      .deferred = capturable(c, gpu_per_rank)};
    if (echo_preset_config(c->allreduce, c->echo_codec, c->echo_group, &ec)) {
        const echo_codec_info *ci = echo_codec_get(c->echo_codec);
        if ((unsigned)c->allreduce < ECHO_PRESET_COUNT && ci)
            snprintf(err, errlen, "--allreduce %s is the paper's %s codec; for %s without error feedback use "
                     "--allreduce echo-nofb --echo-codec %s", echo_preset_name(c->allreduce),
                     echo_codec_get(echo_preset_codec(c->allreduce))->name, ci->name, ci->name);
        else
            snprintf(err, errlen, "unknown all-reduce preset %d", (int)c->allreduce);
        return -1;
    }
    /* ranks as threads: rank i on GPU i (a device-only transport), or all
     * on GPU 0 (local); processes: each its node-local rank's GPU */
    int devs[ECHO_MAX_RANKS];
    for (int i = 0; i < c->tp && i < ECHO_MAX_RANKS; i++) devs[i] = i;
    echo_world_opts o = {.nranks = c->tp, .procs = e->procs, .devices = devs,
                         .device = e->procs ? e->local_dev : host_device(c->device) ? -1 : 0};
    /* prefill overlap: one more world per further micro-batch (overlap.h),
     * whose waits leave the cores to the compute */
    e->ov_k = eng_overlap_plan(c->overlap, c->tp, e->procs, host_device(c->device));
    ec.lazy_wait = e->ov_k > 1;
    if (echo_world_create(c->transport, &o, &ec, &e->world, err, errlen)) return -1;
    for (int i = 1; i < e->ov_k; i++)
        if (echo_world_create(c->transport, &o, &ec, &e->ov_worlds[i - 1], err, errlen)) return -1;
    return 0;
}

/* The rank's compute threads code its all-reduce messages (comm/echo.h). */
static void rank_host_run(void *be, int ntasks, echo_task_fn fn, void *arg) {
    kern_host_parallel(be, ntasks, fn, arg);
}

static int create_ranks(eng *e, int gpu_per_rank, char *err, size_t errlen) {
    const eng_config *c = &e->cfg;
    for (int i = 0; i < c->tp; i++) {
        eng_rank *r = &e->ranks[i];
        if (e->procs && i != e->me) continue;
        if (e->world && echo_comm_create(e->world, i, &r->comm, err, errlen)) return -1;
        echo_workers wk = {kern_host_threads(r->be), rank_host_run, r->be};
        if (r->comm) echo_comm_set_workers(r->comm, &wk);
        /* auto: by the backend actually made ("auto" devices resolve there) */
        if (e->cfg.fuse_weights != ENG_FUSE_ON && e->cfg.fuse_weights != ENG_FUSE_OFF)
            e->cfg.fuse_weights = host_device(r->ops->name) ? ENG_FUSE_OFF : ENG_FUSE_ON;
        model_load_opts mo = {r->ops, r->be, e->ws, i, c->tp, r->comm, c->kv_blocks, c->kv_block_size,
                              c->fuse_weights == ENG_FUSE_ON,
                              c->quantize == ENG_QUANT_Q8_0 ? KERN_Q8_0 : 0,
                              c->act_quant == ENG_ACT_Q8     ? 1
                              : c->act_quant == ENG_ACT_AUTO ? 2
                              : c->act_quant == ENG_ACT_Q8_0_ONLY ? 3
                                                                  : 0};
        char merr[768];
        if (model_load(c->model_dir, &mo, &r->m, merr, sizeof merr)) {
            snprintf(err, errlen, "%s", merr);
            return -1;
        }
        /* at tp > 1 only the nccl transport's deferred calls can be captured;
         * the runner skips steps where graphs cannot apply */
        r->run = (eng_runner){.m = r->m, .ops = r->ops, .be = r->be, .comm = r->comm,
                              .graphs = c->cuda_graphs && (c->tp == 1 || capturable(c, gpu_per_rank))};
        if (e->ov_k > 1) {
            echo_comm *mb[MODEL_MAX_MB] = {r->comm};
            for (int k = 1; k < e->ov_k; k++)
                if (echo_comm_create(e->ov_worlds[k - 1], i, &mb[k], err, errlen)) {
                    while (--k > 0) echo_comm_destroy(mb[k]);
                    return -1;
                }
            if (eng_overlap_create(mb, e->ov_k, c->overlap_min_rows, &wk, &r->run.ov, err, errlen)) {
                for (int k = 1; k < e->ov_k; k++) echo_comm_destroy(mb[k]);
                return -1;
            }
        }
    }
    for (int i = 1; !e->procs && i < c->tp; i++) {
        if (pthread_create(&e->ranks[i].thread, NULL, rank_main, &e->ranks[i]) != 0) {
            snprintf(err, errlen, "cannot start rank thread %d", i);
            return -1;
        }
        e->ranks[i].started = 1;
    }
    return 0;
}

/* The engine of this process; procs: ranks are processes (rank 0 has told
 * the others to make theirs: OP_CREATE). Each stage ends with the processes
 * agreeing, so a failure anywhere fails every process before the next
 * collective. */
int eng_priv_create(const eng_config *cfg, int procs, eng **out, char *err, size_t errlen) {
    eng *e = calloc(1, sizeof *e);
    *out = NULL;
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return procs ? echo_proc_agree(0, err, err, errlen) : -1;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->go_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    e->cfg = *cfg;
    e->procs = procs;
    e->me = procs ? echo_proc_rank() : 0;
    int gpu_per_rank = 0;
    if (eng_priv_procs_agree(e, create_prep(e, &gpu_per_rank, err, errlen), err, errlen) ||
        eng_priv_procs_agree(e, create_world(e, gpu_per_rank, err, errlen), err, errlen) ||
        eng_priv_procs_agree(e, create_ranks(e, gpu_per_rank, err, errlen), err, errlen))
        goto fail;
    *out = e;
    return 0;
fail:
    e->procs = 0; /* nothing to tell the others: they fail too */
    eng_destroy(e);
    return -1;
}

void eng_destroy(eng *e) {
    if (!e) return;
    if (e->procs && e->me == 0) { /* the others destroy theirs (a dead peer is not waited for) */
        ctl_hdr h = {.op = OP_DESTROY};
        char err[256];
        echo_proc_bcast(&h, sizeof h, err, sizeof err);
    }
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->go_cv);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; e->ranks && i < e->cfg.tp; i++) {
        eng_rank *r = &e->ranks[i];
        if (r->started) pthread_join(r->thread, NULL);
        eng_overlap_destroy(r->run.ov); /* and its comms but r->comm */
        model_free(r->m);
        echo_comm_destroy(r->comm);
        if (r->be) kern_backend_destroy(r->ops, r->be);
        free(r->logits);
        free(r->cand_ids);
        free(r->cand_vals);
        free(r->cand_lse);
    }
    echo_world_destroy(e->world);
    for (int i = 0; i < MODEL_MAX_MB; i++) echo_world_destroy(e->ov_worlds[i]);
    weights_close(e->ws);
    free(e->gather);
    for (int i = 0; e->seqs && i < e->cfg.max_num_seqs; i++) free(e->seqs[i].blocks);
    free(e->seqs);
    free(e->ranks);
    eng_blocks_destroy(&e->pool);
    free(e->match);
    free(e->tokens);
    free(e->q_start);
    free(e->pos0);
    free(e->table);
    free(e->logit_rows);
    free(e->old_nblocks);
    free(e->row_full);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->go_cv);
    pthread_cond_destroy(&e->done_cv);
    free(e);
}

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
        rows += it[i].logits == ENG_LOGITS_ALL ? it[i].n_tokens : it[i].logits == ENG_LOGITS_LAST ? 1 : 0;
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
        if (it[i].logits == ENG_LOGITS_ALL)
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
    /* procs mode: the other processes run the same step on their ranks */
    if (e->procs && eng_priv_step_send(e, n, tok, nrows, out->cands ? out->k : 0, nfull, out->layer_states != NULL, err,
                              errlen)) {
        step_rollback(e, it, n);
        return -1;
    }
    int rc = eng_priv_ranks_forward(e, err, errlen);
    if (e->procs) rc = eng_priv_step_gather(e, nrows, out->cands ? out->k : 0, nfull, rc, err, errlen);
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
        eng_logits lg = o->logits == ENG_LOGITS_ALL ? ENG_LOGITS_ALL
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
        nseg += (p + it[i].n_tokens - 1) / C - p / C + 1;
        ndec += it[i].n_tokens == 1 && p % C;
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
        int nr = it[i].logits == ENG_LOGITS_ALL ? it[i].n_tokens : it[i].logits == ENG_LOGITS_LAST;
        r += nr;
        f += !out->cands || (out->full && out->full[i]) ? nr : 0;
        t += it[i].n_tokens;
        if (it[i].n_tokens == 1 && s->len % C) sg[nd++] = (step_seg){i, 0, 1}; /* decodes first */
    }
    ns = nd;
    for (int i = 0; !rc && i < n; i++) {
        if (it[i].n_tokens == 1 && old_len[i] % C) continue;
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
