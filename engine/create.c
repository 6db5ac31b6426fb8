/*
 * engine/: making and destroying an engine (eng_create: here, or on every
 * process under mpirun, the others in eng_follow, follow.c): the config's
 * defaults and limits, the transport and backend rows it picks (comm/'s and
 * kernels/' tables), the KV block pool and step staging, the all-reduce
 * world, each rank's backend, comm and model, and the row of the ranks
 * table that runs them (threads or processes, internal.h).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/budget.h"
#include "engine/internal.h"
#include "kernels/kv.h"
#include "engine/overlap.h"

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

/* The KV heads one rank holds: its share, or one replicated head when tp
 * exceeds them (model_check_tp). */
static int rank_kv_heads(const eng_config *c, const model_config *mc) {
    int tp = c->tp > 0 ? c->tp : 1;
    return mc->num_kv_heads % tp == 0 ? mc->num_kv_heads / tp : 1;
}

/* What KERN_KV_NATIVE means on c's device (kern_kv_resolve, before any
 * backend exists): fp32 on a host backend, bf16 on a GPU. */
static kern_kv_dtype kv_dtype_of(const eng_config *c) {
    if (c->kv_dtype != KERN_KV_NATIVE) return c->kv_dtype;
    const kern_backend_info *b = kern_backend_find(c->device ? c->device : "cpu");
    return !b || b->host ? KERN_KV_F32 : KERN_KV_BF16;
}

size_t eng_kv_block_bytes(const eng_config *c, const model_config *mc) {
    int bs = c->kv_block_size > 0 ? c->kv_block_size : 16;
    return 2 * (size_t)mc->num_layers * (size_t)bs * kern_kv_row_bytes(kv_dtype_of(c), rank_kv_heads(c, mc), mc->head_dim);
}

/* MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read. */
static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

size_t eng_gpu_kv_budget(double util, size_t total, size_t free_bytes, size_t weights, size_t activations,
                         int ranks_per_gpu) {
    if (!(util > 0 && util <= 1) || ranks_per_gpu < 1 || free_bytes > total) return 0;
    double left = util * (double)total - (double)(total - free_bytes) -
                  (double)ranks_per_gpu * ((double)weights + (double)activations);
    return left > 0 ? (size_t)(left / ranks_per_gpu) : 0;
}

size_t eng_gpu_weight_bytes(const eng_config *c, const model_config *mc) {
    const size_t tp = (size_t)(c->tp > 0 ? c->tp : 1), H = (size_t)mc->hidden_size, V = (size_t)mc->vocab_size;
    const size_t hd = (size_t)mc->head_dim, qd = (size_t)mc->num_heads * hd / tp;
    const size_t kvd = (size_t)rank_kv_heads(c, mc) * hd, inter = (size_t)mc->intermediate_size / tp;
    size_t layer = 2 * qd * H + 2 * kvd * H + 3 * inter * H + 2 * H + 2 * hd; /* q, o, k, v, mlp, norms */
    size_t vals = V * H + H + (mc->tie_word_embeddings ? 0 : (V + tp - 1) / tp * H) + (size_t)mc->num_layers * layer;
    return 2 * vals; /* bf16: the cuda backend's weights */
}

size_t eng_gpu_activation_bytes(const eng_config *c, const model_config *mc) {
    const size_t tp = (size_t)(c->tp > 0 ? c->tp : 1), H = (size_t)mc->hidden_size, V = (size_t)mc->vocab_size;
    const size_t hd = (size_t)mc->head_dim, qd = (size_t)mc->num_heads * hd / tp;
    const size_t kvd = (size_t)rank_kv_heads(c, mc) * hd, inter = (size_t)mc->intermediate_size / tp;
    size_t len = c->max_model_len > 0                     ? (size_t)c->max_model_len
                 : mc->max_position_embeddings < 4096 ? (size_t)mc->max_position_embeddings
                                                          : 4096;
    size_t T = c->max_batch_tokens > 0 ? (size_t)c->max_batch_tokens : len > 512 ? len : 512;
    size_t seqs = (size_t)(c->max_num_seqs > 0 ? c->max_num_seqs : 8);
    /* per token: the residual stream and its normed copy, the attention and
     * mlp outputs, q k v, the attention's output, gate and up (fp32); the
     * logits of every sequence, whole on rank 0; 64 MiB of workspace */
    size_t per_tok = 4 * H + qd + 2 * kvd + qd + 2 * inter;
    return 4 * (T * per_tok + seqs * V + seqs * ((V + tp - 1) / tp)) + ((size_t)64 << 20);
}

static int gpu_kv_memory(eng_config *c, const kern_backend_info *b, char *err, size_t errlen);

/* --kv-cache-memory auto (ENG_KV_MEMORY_AUTO) made bytes, from this host's
 * MemAvailable (eng_config.kv_cache_memory); 0 or -1. */
static int kv_memory(eng_config *c, char *err, size_t errlen) {
    if (c->kv_cache_memory != ENG_KV_MEMORY_AUTO) return 0;
    const kern_backend_info *b = kern_backend_find(c->device ? c->device : "cpu");
    if (b && !b->host) return gpu_kv_memory(c, b, err, errlen);
    size_t avail = mem_available();
    if (!avail) {
        snprintf(err, errlen, "--kv-cache-memory auto: cannot read MemAvailable from /proc/meminfo; give a size in "
                              "bytes");
        return -1;
    }
    c->kv_mem_available = avail;
    c->kv_cache_memory = avail / 100 * ENG_KV_AUTO_PERCENT / (size_t)(c->tp > 0 ? c->tp : 1);
    return 0;
}

/* Returns 1 when the budget (kv_cache_memory) sized the pool: an explicit
 * kv_blocks wins over it (a server then warns when it holds fewer than
 * max_model_len tokens). */
static int fill_defaults(eng_config *c, const model_config *mc) {
    int from_budget = 0;
    if (!c->device) c->device = "cpu";
    if (!c->transport) c->transport = "auto";
    if (c->tp <= 0) c->tp = 1;
    if (c->kv_block_size <= 0) c->kv_block_size = 16;
    if (c->max_model_len <= 0) c->max_model_len = mc->max_position_embeddings < 4096 ? mc->max_position_embeddings : 4096;
    if (c->max_num_seqs <= 0) c->max_num_seqs = 8;
    if (c->max_batch_tokens <= 0) c->max_batch_tokens = c->max_model_len > 512 ? c->max_model_len : 512;
    if (c->pass_tokens <= 0) c->pass_tokens = ENG_PASS_TOKENS;
    if (c->pass_tokens > c->max_batch_tokens) c->pass_tokens = c->max_batch_tokens;
    c->kv_dtype = kv_dtype_of(c);
    if (c->kv_blocks <= 0) {
        long long per = (c->max_model_len + c->kv_block_size - 1) / c->kv_block_size;
        long long total = per * c->max_num_seqs;
        if (c->kv_cache_memory > 0) { /* the budget is a ceiling: what fits, if fewer */
            size_t fit = c->kv_cache_memory / eng_kv_block_bytes(c, mc);
            if ((unsigned long long)fit < (unsigned long long)total) {
                total = (long long)fit;
                from_budget = 1;
            }
        }
        c->kv_blocks = total > (1 << 30) ? (1 << 30) : (int)total;
    }
    return from_budget;
}

static int check_limits(const eng_config *c, const model_config *mc, int from_budget, char *err, size_t errlen) {
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
    if (from_budget && (long long)c->kv_blocks * c->kv_block_size < c->max_model_len) {
        size_t bb = eng_kv_block_bytes(c, mc), tok = bb / (size_t)c->kv_block_size;
        long long need = ((long long)c->max_model_len + c->kv_block_size - 1) / c->kv_block_size;
        snprintf(err, errlen,
                 "--max-model-len %d does not fit the KV pool: --kv-cache-memory %zu bytes per rank holds %lld "
                 "tokens (%zu bytes per token per rank, %s): lower --max-model-len to %lld or raise "
                 "--kv-cache-memory to %lld bytes (or a narrower --kv-cache-dtype)",
                 c->max_model_len, c->kv_cache_memory, (long long)c->kv_blocks * c->kv_block_size, tok,
                 kern_kv_dtype_name(c->kv_dtype), (long long)c->kv_blocks * c->kv_block_size, need * (long long)bb);
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
    if (model_config_load(c->model_dir, &e->mc, err, errlen) ||
        model_config_rope_override(&e->mc, c->rope_scaling, err, errlen))
        return -1;
    int from_budget = fill_defaults(c, &e->mc);
    if (check_limits(c, &e->mc, from_budget, err, errlen) || model_check_tp(&e->mc, c->tp, err, errlen)) return -1;
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
    if (eng_blocks_init(&e->pool, c->kv_blocks, c->kv_block_size, !c->no_prefix_cache, eng_priv_config_key(c))) {
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

static int procs_agree(const eng *e, int rc, char *err, size_t errlen);

/* --allreduce auto (eng_config.allreduce_auto): the figures (rank 0's,
 * sent to every process, so every rank picks the same), the choice, and the
 * config resolved to it: the preset, exact below the small class's bound
 * when the small calls run exact, one-shot and overlap unless given. */
static int auto_choose(eng *e, const echo_world_opts *o, echo_config *ec, char *err, size_t errlen) {
    eng_config *c = &e->cfg;
    echo_auto_figures *f = &e->auto_fig;
    eng_rank *r = &e->ranks[e->procs ? e->me : 0];
    *f = (echo_auto_figures){.nranks = c->tp, .threads = kern_host_threads(r->be)};
    int chunk = c->pass_tokens < c->max_batch_tokens ? c->pass_tokens : c->max_batch_tokens;
    f->call_bytes[ECHO_AUTO_SMALL] = 4.0 * e->mc.hidden_size;
    f->call_bytes[ECHO_AUTO_LARGE] = 4.0 * e->mc.hidden_size * chunk;
    int rc = 0;
    if (!e->procs) {
        echo_auto_measure_memory(f);
    } else {
        /* a world of exact for the probe calls, every process in it */
        echo_config pc = {.n_sites = 1, .max_count = ec->max_count < (1u << 18) ? ec->max_count : (1u << 18),
                          .lazy_wait = 1};
        echo_preset_config(ECHO_PRESET_EXACT, 0, 0, &pc);
        echo_world *pw = NULL;
        echo_comm *pcm = NULL;
        rc = echo_world_create(c->transport, o, &pc, &pw, err, errlen);
        if (!rc) rc = echo_comm_create(pw, e->me, &pcm, err, errlen);
        if (!rc) rc = echo_auto_measure_link(pcm, pc.max_count, f, err, errlen);
        echo_comm_destroy(pcm);
        echo_world_destroy(pw);
    }
    if (!rc && e->me == 0) rc = echo_auto_measure_codecs(f, err, errlen);
    f->threads = kern_host_threads(r->be);
    if (e->procs && procs_agree(e, rc, err, errlen)) return -1;
    if (rc) return -1;
    if (e->procs && echo_proc_bcast(f, sizeof *f, err, errlen)) return -1;
    if (echo_auto_pick(f, c->allreduce_auto == ENG_ALLREDUCE_AUTO_ECHO3, &e->auto_choice, err, errlen)) return -1;
    const echo_auto_choice *ch = &e->auto_choice;
    if (e->procs) { /* the same figures give the same choice; checked, since a rank that differed would hang */
        int32_t mine[4] = {ch->preset[0], ch->preset[1], ch->oneshot[0], ch->overlap_k}, all[4 * ECHO_MAX_RANKS];
        if (echo_proc_allgather(mine, sizeof mine, all, err, errlen)) return -1;
        for (int i = 1; i < c->tp; i++)
            if (memcmp(all, all + 4 * i, sizeof mine)) {
                snprintf(err, errlen, "--allreduce auto: rank %d chose differently from rank 0", i);
                return -1;
            }
    }
    c->allreduce = ch->preset[ECHO_AUTO_LARGE];
    if (ch->preset[ECHO_AUTO_SMALL] == ECHO_PRESET_EXACT && c->allreduce != ECHO_PRESET_EXACT &&
        c->echo_min_bytes <= ECHO_AUTO_SMALL_BYTES)
        c->echo_min_bytes = ECHO_AUTO_SMALL_BYTES + 1;
    if (c->oneshot == ENG_ONESHOT_AUTO) c->oneshot = ch->oneshot[ECHO_AUTO_SMALL] ? ECHO_AUTO_SMALL_BYTES : ENG_ONESHOT_OFF;
    if (c->overlap == ENG_OVERLAP_AUTO) c->overlap = ch->overlap_k > 1 ? ch->overlap_k : ENG_OVERLAP_OFF;
    e->auto_ran = 1;
    return 0;
}

static int create_world(eng *e, int gpu_per_rank, char *err, size_t errlen) {
    eng_config *c = &e->cfg;
    if (c->tp == 1) return 0;
    if (c->allreduce_auto && !host_device(c->device)) {
        c->allreduce = ECHO_PRESET_ECHO; /* no measurement on device memory yet (bf16 is host-only) */
        c->allreduce_auto = ENG_ALLREDUCE_FIXED;
    }
    int sites = model_pass_sites(&e->mc);
    if (sites < 1) {
        snprintf(err, errlen, "%s: model family '%s' has no all-reduce sites", c->model_dir,
                 e->mc.arch ? e->mc.arch : "(none)");
        return -1;
    }
    echo_config ec = {.min_bytes = c->echo_min_bytes,
                      .n_sites = sites, /* the model's (model_pass_sites) */
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
    if (c->allreduce_auto) {
        if (auto_choose(e, &o, &ec, err, errlen)) return -1;
        ec.min_bytes = c->echo_min_bytes;
        if (echo_preset_config(c->allreduce, c->echo_codec, c->echo_group, &ec)) {
            snprintf(err, errlen, "--allreduce auto chose %s, which does not take --echo-codec %s",
                     echo_preset_name(c->allreduce), echo_codec_get(c->echo_codec)->name);
            return -1;
        }
        const echo_transport_info *tr = echo_transport_find(c->transport);
        e->canon = c->allreduce != ECHO_PRESET_EXACT || !(tr && tr->exact_rank_order);
    }
    /* prefill overlap: one more world per further micro-batch (overlap.h),
     * whose waits leave the cores to the compute */
    e->ov_k = eng_overlap_plan(c->overlap, c->tp, e->procs, host_device(c->device));
    ec.lazy_wait = e->ov_k > 1;
    ec.oneshot_bytes = eng_oneshot_plan(c->oneshot, c->tp, e->procs, host_device(c->device));
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
                                                                  : 0,
                              c->kv_dtype, c->rope_scaling};
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
    return e->rk->create ? e->rk->create(e, err, errlen) : 0;
}

/* In procs mode every process reaches each of these points: 0 when all
 * got there without error, else -1 everywhere with the first failure's
 * message (so no process goes on into a collective the others skip). */
static int procs_agree(const eng *e, int rc, char *err, size_t errlen) {
    if (!e->procs) return rc;
    char mine[512];
    snprintf(mine, sizeof mine, "%s", rc ? err : "");
    return echo_proc_agree(rc == 0, mine, err, errlen);
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
    e->rk = procs ? &eng_priv_ranks_procs : &eng_priv_ranks_threads;
    int gpu_per_rank = 0;
    if (procs_agree(e, create_prep(e, &gpu_per_rank, err, errlen), err, errlen) ||
        procs_agree(e, create_world(e, gpu_per_rank, err, errlen), err, errlen) ||
        procs_agree(e, create_ranks(e, gpu_per_rank, err, errlen), err, errlen))
        goto fail;
    *out = e;
    return 0;
fail:
    e->procs = 0; /* nothing to tell the others: they fail too */
    eng_destroy(e);
    return -1;
}

int eng_create(const eng_config *cfg0, eng **out, char *err, size_t errlen) {
    *out = NULL;
    if (!cfg0->model_dir) {
        snprintf(err, errlen, "no model path (eng_config.model_dir)");
        return -1;
    }
    /* --kv-cache-memory auto is read once, here (rank 0): every process
     * sizes its pool from the same bytes */
    eng_config cc = *cfg0, *cfg = &cc;
    if (kv_memory(&cc, err, errlen)) return -1;
    if (echo_proc_count() == 1) return eng_priv_create(cfg, 0, out, err, errlen);
    if (echo_proc_rank() != 0) {
        snprintf(err, errlen, "under mpirun only rank 0 creates engines; the other processes run eng_follow()");
        return -1;
    }
    /* rank 0: the others make the same engine (eng_follow) */
    ctl_hdr h = {.op = OP_CREATE};
    if (echo_proc_bcast(&h, sizeof h, err, errlen) || eng_priv_cfg_bcast(&cc, NULL, err, errlen)) return -1;
    return eng_priv_create(cfg, 1, out, err, errlen);
}

void eng_destroy(eng *e) {
    if (!e) return;
    e->rk->destroy(e); /* the ranks stop before their models go */
    for (int i = 0; e->ranks && i < e->cfg.tp; i++) {
        eng_rank *r = &e->ranks[i];
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

/* --kv-cache-memory auto on a GPU backend: eng_gpu_kv_budget on each GPU
 * the ranks use (the smallest budget), from cudaMemGetInfo at start and
 * the config's weights and activations. */
static int gpu_kv_memory(eng_config *c, const kern_backend_info *b, char *err, size_t errlen) {
    double util = c->gpu_memory_utilization > 0 ? c->gpu_memory_utilization : ENG_GPU_UTIL_DEFAULT;
    if (!(util > 0 && util <= 1)) {
        snprintf(err, errlen, "--gpu-memory-utilization %g: expected a fraction in (0, 1]", util);
        return -1;
    }
    model_config mc;
    if (model_config_load(c->model_dir, &mc, err, errlen)) return -1;
    int tp = c->tp > 0 ? c->tp : 1, gpus = b->device_count(), per_gpu = 1;
    if (tp > 1 && echo_proc_count() == 1) { /* ranks as threads: one GPU each, or all on GPU 0 (pick_transport) */
        const echo_transport_info *t = !c->transport || is_auto(c->transport) ? (gpus >= tp ? pick_row(0, 1) : host_transport())
                                                              : echo_transport_find(c->transport);
        per_gpu = t && t->device_memory == 1 ? 1 : tp;
    }
    int ndev = per_gpu == 1 && echo_proc_count() == 1 ? tp : 1;
    if (!b->mem_info || gpus < ndev) {
        snprintf(err, errlen, "--kv-cache-memory auto: cannot read the memory of %d %s device(s) (%d visible); give "
                 "--kv-cache-memory BYTES", ndev, b->name, gpus);
        return -1;
    }
    size_t w = eng_gpu_weight_bytes(c, &mc), act = eng_gpu_activation_bytes(c, &mc), best = 0;
    for (int d = 0; d < ndev; d++) {
        size_t fr, tot;
        if (b->mem_info(d, &fr, &tot, err, errlen)) return -1;
        size_t bud = eng_gpu_kv_budget(util, tot, fr, w, act, per_gpu);
        if (d == 0 || bud < best) {
            best = bud;
            c->kv_gpu.total = tot;
            c->kv_gpu.free = fr;
        }
    }
    c->kv_gpu.weights = w;
    c->kv_gpu.activations = act;
    c->kv_gpu.ranks_per_gpu = per_gpu;
    if (!best) {
        snprintf(err, errlen, "--gpu-memory-utilization %.2f of %.1f GB leaves no memory for the KV cache: %.1f GB "
                 "already in use, %d rank(s) x (%.1f GB of weights + %.1f GB of activations); raise "
                 "--gpu-memory-utilization, lower --max-num-batched-tokens or use more GPUs (--tp)",
                 util, (double)c->kv_gpu.total / 1e9, (double)(c->kv_gpu.total - c->kv_gpu.free) / 1e9, per_gpu,
                 (double)w / 1e9, (double)act / 1e9);
        return -1;
    }
    c->kv_cache_memory = best;
    return 0;
}
