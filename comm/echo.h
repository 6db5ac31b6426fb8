/*
 * comm/echo.h — the all-reduce of tensor parallelism (Echo): a world of N
 * ranks, a choice of wire codec (4-bit codecs, bf16, plain fp32) and
 * optional error feedback. Knows nothing about models. docs/echo.md §11
 * states this contract in detail, transport by transport.
 *
 * Callers: engine/ and model/ (one world per engine; a pass per forward
 * pass), echo-bench, tests. What a caller uses, in order: a preset or a
 * codec into echo_config; a row of the transport table into
 * echo_world_create; echo_comm_create per rank; then per forward pass
 * echo_begin_pass, echo_allreduce at each site, echo_end_pass.
 * Beside this header: comm/proc.h (ranks as processes: the MPI control
 * plane), comm/codec/codec.h (the codecs on host memory, outside a world),
 * comm/transport/transport.h (each transport's own constructor, for the
 * table and tests).
 *
 * Contract
 *   - A world is N ranks that reduce together; each rank owns an echo_comm
 *     (its transport endpoint and its residual). Transports: local (threads
 *     of this process, on host memory or one GPU's), nccl (one GPU per
 *     rank, all driven from this process), mpi (one rank per process).
 *   - Per rank, calls come from one thread, in the same order on every
 *     rank: echo_begin_pass, then echo_allreduce at strictly increasing
 *     sites (gaps fine). Ranks that disagree on (site, count, dtype, path)
 *     all fail that call; nccl then aborts the world.
 *   - echo_allreduce is in place; on return every rank's buf holds the same
 *     bits. The codec sets the error: none sums in fp32, bf16 rounds the
 *     sum once, the 4-bit codecs as docs/echo.md §3. With feedback the
 *     error a call leaves is added to the next call of the pass, so every
 *     call of a pass has the same count.
 *   - Size policy: a message below min_bytes takes the exact path, adds any
 *     residual carried in, and leaves none.
 *   - A call with count > max_count, site >= n_sites, a site out of order
 *     or no begin_pass fails with a message, changing and sending nothing.
 *   - A non-finite input (or |x| >= 2^127) or sum fails the call on every
 *     rank and aborts the pass; outputs hold NaN/inf, never made finite.
 *     Deferred worlds report it at echo_end_pass.
 *   - One rank: calls leave buf unchanged.
 *   - Functions return 0 or -1 with a message in err; nothing prints or exits.
 */
#ifndef ECHO_COMM_ECHO_H
#define ECHO_COMM_ECHO_H

#include <stddef.h>
#include <stdint.h>

typedef enum echo_dtype { ECHO_F32 = 0, ECHO_BF16 } echo_dtype;

/* Rows of the codec table (below): how a group of values travels. */
typedef enum echo_codec_id {
    ECHO_CODEC_DEFAULT = 0, /* ECHO_DEFAULT_CODEC */
    ECHO_CODEC_INT4,        /* the paper's: int4 codes in [-7, 7], one bf16 scale per group of G */
    ECHO_CODEC_HADAMARD,    /* the same after a per-group Walsh-Hadamard rotation with fixed signs */
    ECHO_CODEC_HSUB6,       /* rotation per 16 values, each 16 with a 6-bit scale under the group's bf16 one */
    ECHO_CODEC_OUT2,        /* int4 with the 2 largest |values| of each group in bf16 (outlier channels) */
    ECHO_CODEC_HOUT2,       /* out2's outliers, then hadamard over the rest of the group */
    ECHO_CODEC_HNF3,        /* hout2's outliers and rotation, 3-bit normal-float levels times the group's RMS */
    ECHO_CODEC_NONE,        /* exact: fp32 on the wire, the transport's own all-reduce */
    ECHO_CODEC_BF16,        /* exact: bf16 on the wire, fp32 sums rounded once (host transports only) */
#ifdef ECHO_EXTRA_CODEC_IDS
    ECHO_EXTRA_CODEC_IDS /* a build's own rows (tests/toy/toy_codec.h) */
#endif
    ECHO_CODEC_COUNT
} echo_codec_id;

/* Limits. ECHO_DEFAULT_GROUP is the int4 codec's default G (docs/echo.md, "Choosing G");
 * ECHO_DEFAULT_CODEC, with its own default G (the codec table), is the codec
 * `--allreduce echo` runs, chosen on a trained model (docs/accuracy.md). */
#define ECHO_MAX_RANKS 64
#define ECHO_MIN_GROUP 16
#define ECHO_MAX_GROUP 256
#define ECHO_DEFAULT_GROUP 64
#define ECHO_DEFAULT_CODEC ECHO_CODEC_HOUT2
/* The echo preset's tail policy (echo_config.tail_sites): the last 2 calls
 * of a pass in bf16 (docs/accuracy.md, "The last layer in bf16"). */
#define ECHO_TAIL_SITES 2
/* echo3's: one call, so that a pass stays within 3.5 bits/value */
#define ECHO3_TAIL_SITES 1

/* Two orthogonal settings: the codec, and error feedback (lossy codecs
 * only: an exact codec leaves no error to feed back, and a world asking
 * for it is refused). The presets below name the usual pairs. */
typedef struct echo_config {
    echo_codec_id codec; /* 0 = ECHO_DEFAULT_CODEC */
    int feedback;        /* 1 = the error each call leaves enters the next call of the pass */
    int group_size;      /* values per scale group, 16..256, power of two; 0 = the codec's default */
    size_t min_bytes;    /* size policy threshold (0 = every call uses the codec) */
    int n_sites;         /* residual slots (2 * layers for a transformer) */
    size_t max_count;    /* largest message in elements (tokens * hidden) */
    int deferred;        /* 1 = calls only enqueue; the pass completes in echo_end_pass (nccl transport) */
    /* One-shot schedule for messages of at most this many bytes as fp32
     * (count * 4, whatever the dtype; 0 = never;
     * $ECHO_ONESHOT_BYTES, when set, overrides it): every rank sends its
     * whole message (fp32 for exact, coded for a 4-bit codec) to every
     * other rank and sums all of them in rank order, one exchange instead
     * of two. Host transports (local on host memory, mpi); bf16 keeps the
     * two-shot schedule. Exact gives the two-shot's bits (the same sum
     * order); a 4-bit codec codes each rank's whole message once (no
     * second coding of the sum), with its own residual. */
    size_t oneshot_bytes;
    /* The tail policy (issue 30): the last tail_sites sites of a pass
     * (site >= n_sites - tail_sites) go through tail_codec, a lossless
     * codec (ECHO_CODEC_BF16, or ECHO_CODEC_NONE for exact), whatever the
     * world's codec; a residual carried into such a call is added to this
     * rank's input, and the call leaves none. Why: the pass's last call has
     * no next call to take its error back, so it reaches the logits
     * uncompensated (docs/accuracy.md). 0 = off. bf16 runs on host memory
     * only: on device memory the tail runs exact. $ECHO_TAIL ("0", "K",
     * "K:bf16", "K:exact"), when set, overrides both (experiments). */
    int tail_sites;
    echo_codec_id tail_codec;
    /* 1 = a call that waits on its peers yields the cores while it waits
     * (mpi: nonblocking collectives and a wait that sleeps after a short
     * spin; the same bytes). For a thread that communicates beside compute
     * (the engine's prefill overlap). Other transports ignore it. */
    int lazy_wait;
} echo_config;

typedef struct echo_world echo_world; /* shared by the ranks of one process */
typedef struct echo_comm echo_comm;   /* one rank */

/* ---- Presets: what users type (--allreduce) ----
 *   exact     = {none, no feedback}
 *   int4      = {int4, the paper's codec, no feedback}
 *   echo      = {the chosen 4-bit codec (ECHO_DEFAULT_CODEC), feedback, the
 *               last ECHO_TAIL_SITES calls of a pass in bf16}
 *   echo-nofb = {the chosen 4-bit codec, no feedback}: echo's codec without
 *               error feedback, the ablation
 *   bf16      = {bf16, no feedback}
 *   echo3     = {hnf3 (3-bit codes, 3.25 bits at G 256), feedback, the last
 *               ECHO3_TAIL_SITES call of a pass in bf16: 3.46 bits/value
 *               over SmolLM2's 60 calls}
 * exact, int4, bf16 and echo3 fix their codec; echo and echo-nofb take the codec
 * the caller names (0: ECHO_DEFAULT_CODEC). A preset also names the path a
 * call took in echo_stats (the size policy's fallback is `exact`; a world
 * of the int4 codec without feedback counts as int4, any other 4-bit codec
 * as echo or echo-nofb). */
typedef enum echo_preset {
    ECHO_PRESET_EXACT = 0,
    ECHO_PRESET_NOFB, /* "echo-nofb" (until issue 30 this row was named int4) */
    ECHO_PRESET_ECHO,
    ECHO_PRESET_BF16,
    ECHO_PRESET_INT4, /* the paper's int4 codec, no feedback */
    ECHO_PRESET_ECHO3, /* "echo3": hnf3-g256, feedback, the pass's last call in bf16 (<= 3.5 bits) */
    ECHO_PRESET_COUNT /* rows of the preset table */
} echo_preset;

/* Parse "exact" | "int4" | "echo" | "echo-nofb" | "bf16" | "echo3"; -1 if unknown. */
int echo_preset_parse(const char *s, echo_preset *out);
/* The names of the rows of the preset, codec (lossy_only: the 4-bit ones)
 * and transport tables, in table order, joined by sep into buf (cut to len,
 * always terminated); return buf. What --help and messages list, so a new
 * row shows up there with no other edit. */
const char *echo_preset_names(char *buf, size_t len, const char *sep);
const char *echo_codec_names(char *buf, size_t len, const char *sep, int lossy_only);
const char *echo_transport_names(char *buf, size_t len, const char *sep);
const char *echo_preset_name(echo_preset p); /* "unknown" out of range */
/* The codec preset p fixes (exact: none, int4: int4, bf16: bf16), or
 * ECHO_CODEC_DEFAULT when it takes the caller's (echo, echo-nofb). */
echo_codec_id echo_preset_codec(echo_preset p);
/* cfg->codec and cfg->feedback of preset p, echo and echo-nofb taking
 * `codec` (0: ECHO_DEFAULT_CODEC); cfg->group_size = group, or when 0 the
 * default G of the codec the preset runs (of `codec` for exact and bf16,
 * whose G only sets the shard granularity, so that their G does not depend
 * on the preset). Other fields are left as they are. -1 for an unknown
 * preset, or for a preset that fixes a lossy codec (int4) given another
 * one (`codec` not 0 and not that codec). */
int echo_preset_config(echo_preset p, echo_codec_id codec, int group, echo_config *cfg);
/* What a world of preset p runs, for logs and reports: "echo: hout2-g128,
 * 4.500 bits/value, error feedback on" (exact: "exact: fp32, 32 bits/value").
 * The fields one by one: echo_preset_config, echo_codec_get, echo_codec_bits. */
void echo_preset_describe(echo_preset p, echo_codec_id codec, int group, char *buf, size_t len);
/* Wire bits per value of a world of this config, averaged over the
 * n_sites calls of a pass (the tail policy's calls at their own bits);
 * $ECHO_TAIL applies as in a world. 0 for an invalid codec or group. */
double echo_config_bits(const echo_config *cfg);
/* echo_preset_describe of a world's configuration (echo_world_get_config),
 * the tail policy with the bits averaged over a pass when n_sites is set:
 * "echo: hout2-g128, 4.500 bits/value, error feedback on, the last 2 of 60
 * calls of a pass bf16: 4.883 bits/value over a pass". */
void echo_config_describe(echo_preset p, const echo_config *cfg, char *buf, size_t len);
/* The tail of cfg ($ECHO_TAIL applied) into *sites, *codec: -1 with a
 * message for a malformed $ECHO_TAIL or a tail outside [0, n_sites] or a
 * lossy tail codec. */
int echo_config_tail(const echo_config *cfg, int *sites, echo_codec_id *codec, char *err, size_t errlen);

/* ---- The codec table ----
 * A row says how a group of G values travels and which code runs it:
 *   4-bit codecs (int4 ... hout2): code bits per value, the bytes of the
 *     group's scale, optionally a rotation first (linear and orthogonal, so
 *     the owner sums rotated values and every rank rotates the decoded sum
 *     back once); host codec in codec/codec.c, device kernels in
 *     codec/echo_cuda.cu.
 *   exact codecs (`lossless`): values as floats of code_bits bits; none is
 *     the transport's plain all-reduce (transport/local.c, local_cuda.c,
 *     nccl.c, mpi.c), bf16 the two-shot schedule with bf16 messages (host loops in
 *     echo.c; `host_only`: a device world is refused at echo_comm_create).
 * docs/echo.md §2b has the formats and the measurements that chose
 * ECHO_DEFAULT_CODEC. */
typedef struct echo_codec_info {
    const char *name;  /* what users type: "int4", "hadamard", "hsub6", "out2", "hout2", "hnf3", "none", "bf16" */
    int rotate;        /* values per Walsh-Hadamard rotation block (comm/codec/echo_codec.h): 0 none, -1 the group */
    int code_bits;     /* wire bits of one value (its code, or the float itself when lossless) */
    int scale_bytes;   /* wire bytes of one group's scale */
    int sub_bits;      /* wire bits of the scale of each 16 values within a group (0: none) */
    int min_group;     /* smallest G the codec takes (G is a power of two up to ECHO_MAX_GROUP) */
    int default_group; /* G when echo_config.group_size is 0 */
    int form;          /* wire form of a group's scales (comm/codec/echo_codec.h ECHO_FORM_*): 0 one bf16 */
    int lossless;      /* 1: an exact path (fp32, or bf16 rounding only): no codes, no feedback */
    int host_only;     /* 1: host transports only (local on host memory, mpi) */
} echo_codec_info;

/* The entry of `id` (ECHO_CODEC_DEFAULT resolved); NULL if out of range. */
const echo_codec_info *echo_codec_get(echo_codec_id id);
/* Parse "NAME" or "NAME-gG" (e.g. "hadamard-g32"): *group = G, or 0 when
 * no group is named; -1 if the name or the group is not valid for it. */
int echo_codec_parse(const char *s, echo_codec_id *codec, int *group);
/* Wire bits per value of `id` at group size `group` (0: default group);
 * 0 if either is invalid. */
double echo_codec_bits(echo_codec_id id, int group);
/* Wire bytes of one group of G values (0 if invalid): what a shard message
 * of L values costs is L/G of these. */
size_t echo_codec_group_bytes(echo_codec_id id, int group);
/* The G a world of this codec uses when group_size is 0 (the table's
 * default_group; ECHO_DEFAULT_GROUP for the int4 codec). */
int echo_codec_default_group(echo_codec_id id);

/* ---- The transport table: every transport is one row (comm/transport/transport.c) ----
 * Callers choose a transport by its row, never by comparing names: the
 * engine's and echo-bench's choices, and what the CLIs list, come from it. */
typedef struct echo_world_opts {
    int nranks;          /* ranks of the world (ranks as processes: the job's size, from MPI) */
    int procs;           /* 1: ranks are processes under mpirun, this one rank echo_proc_rank() */
    int device;          /* this process's GPU (ranks as processes), or local's one GPU; -1: host memory */
    const int *devices;  /* ranks as threads on a device-only transport: rank r's GPU */
} echo_world_opts;
typedef struct echo_transport_info {
    const char *name;     /* what users type: "local", "nccl", "mpi" */
    int device_memory;    /* 0 host memory only, 1 device memory only, 2 either */
    int capturable;       /* its ranks as threads can be deferred and captured into graphs */
    int threads;          /* ranks can be threads of one process */
    int multi_process;    /* ranks can be processes (under mpirun) */
    int exact_rank_order; /* on host memory its exact path sums in rank order, fp32, whatever the message */
    int (*create)(const echo_world_opts *o, const echo_config *cfg, echo_world **out, char *err, size_t errlen);
} echo_transport_info;
/* Row i of the table (at most ECHO_MAX_TRANSPORTS rows), NULL past the last. */
#define ECHO_MAX_TRANSPORTS 8
const echo_transport_info *echo_transport_at(int i);
/* The row named `name`; NULL if none. */
const echo_transport_info *echo_transport_find(const char *name);
/* A world of transport `name` (its row's create), or -1 naming the rows. */
int echo_world_create(const char *name, const echo_world_opts *o, const echo_config *cfg, echo_world **out,
                      char *err, size_t errlen);

/* Destroy every comm of the world first. */
void echo_world_destroy(echo_world *w);

/* The world's configuration with defaults resolved (group_size != 0). */
void echo_world_get_config(const echo_world *w, echo_config *out); /* oneshot_bytes: what the world runs */
int echo_world_nranks(const echo_world *w);

/* The endpoint of `rank` in `w`. Slot memory is allocated here. */
int echo_comm_create(echo_world *w, int rank, echo_comm **out, char *err, size_t errlen);
void echo_comm_destroy(echo_comm *c);

/* Host threads for this rank's codec (optional; without them the calling
 * thread codes alone). run(ctx, ntasks, fn, arg) calls fn(arg, t) once for
 * each t < ntasks, on up to nthreads threads, and returns when all have
 * returned: the rank's compute threads, idle while it waits on the
 * all-reduce. Messages are split at whole groups, so the bits do not
 * depend on the threads. Device memory ignores them. */
typedef void (*echo_task_fn)(void *arg, int task);
typedef struct echo_workers {
    int nthreads;
    void (*run)(void *ctx, int ntasks, echo_task_fn fn, void *arg);
    void *ctx;
} echo_workers;
void echo_comm_set_workers(echo_comm *c, const echo_workers *w);

/* Bytes of residual memory this rank holds (reported at start-up): one
 * padded fp32 message with feedback, whatever n_sites; else 0. */
size_t echo_comm_slot_bytes(const echo_comm *c);

/* ---- A pass: echo_begin_pass, the all-reduces, echo_end_pass ----
 * A pass is how the calls of one forward pass reach the world, run now
 * (EAGER) or held by a graph of the caller's backend:
 *   EAGER    the calls run (deferred: enqueue) as they come;
 *   CAPTURE  the calls enqueue while the caller records them into a graph;
 *   REPLAY   the caller's graph will make the calls: each is only checked
 *            with the peers and counted, nothing enqueued (deferred only).
 * echo_end_pass owns what follows a graphed pass: every rank votes, the
 * graphs launch only when every rank holds the same kind (NCCL wants a
 * captured collective launched by all its ranks), else the pass is taken
 * back and every rank runs it again eagerly. docs/echo.md §10. */
typedef enum echo_pass_mode { ECHO_PASS_EAGER = 0, ECHO_PASS_CAPTURE, ECHO_PASS_REPLAY } echo_pass_mode;

/* Start a pass: no residual is carried into its first call. REPLAY needs
 * a deferred world. */
int echo_begin_pass(echo_comm *c, echo_pass_mode mode, char *err, size_t errlen);

/* What the caller tells echo_end_pass about its pass, and what it says back. */
typedef struct echo_pass_end {
    int failed; /* in: this rank's part of the pass failed (why is in err already) */
    /* in, CAPTURE / REPLAY: launches this rank's graph of the pass; NULL
     * when this rank holds none (its capture failed) */
    int (*launch)(void *arg, char *err, size_t errlen);
    void *arg;
    int aborted; /* out: the failure aborted the world (peers fail instead of waiting) */
} echo_pass_end;

/* In-place all-reduce of `count` values at call site `site` (the contract
 * above). `stream`: the rank's stream on device memory, else NULL. */
int echo_allreduce(echo_comm *c, int site, void *buf, size_t count, echo_dtype dt, void *stream, char *err,
                   size_t errlen);

/* End the pass; call before reading its results on the host. end: NULL
 * for an eager pass whose caller handles failures itself; else
 *   - end->failed: the pass failed on this rank;
 *   - CAPTURE / REPLAY: the vote (end->launch != NULL is this rank's),
 *     then every rank's launch, or 1: no rank launched, nothing of the
 *     pass ran (the caller drops its graph, begins an EAGER pass and
 *     repeats the calls);
 *   - deferred: the pass's one abortable wait and its first non-finite sum.
 * 0 done, 1 run it again eagerly, -1 failed: with end, the world is then
 * aborted (end->aborted = 1) unless every rank failed alike at the same
 * point (a non-finite sum), which leaves the ranks in step. */
int echo_end_pass(echo_comm *c, void *stream, echo_pass_end *end, char *err, size_t errlen);

/* A rank that fails outside a pass (or outside the calls, with end NULL)
 * calls echo_abort: its peers' collectives of this world then fail instead
 * of waiting, and their pass is aborted. Once every rank has returned,
 * echo_world_clear_abort re-arms the world. On nccl that re-creates the
 * communicators, which NCCL frees only once every graph that captured
 * their calls is destroyed: the caller drops those graphs first (the
 * engine: ranks_rearm in engine/threads.c), else the world is declared dead. */
void echo_abort(echo_comm *c);
void echo_world_clear_abort(echo_world *w);
/* 0, with why, when the world can never work again (destroy it); 1
 * otherwise, a re-armable aborted world included. Any thread. */
int echo_world_usable(const echo_world *w, char *why, size_t len);

/* Indexed by the preset that names the path a call took (ECHO_PRESET_*). */
typedef struct echo_stats {
    uint64_t calls[ECHO_PRESET_COUNT];
    uint64_t wire_bytes[ECHO_PRESET_COUNT]; /* bytes this rank sent */
    double seconds[ECHO_PRESET_COUNT];      /* wall time inside echo_allreduce (enqueue time only when deferred) */
} echo_stats;

void echo_get_stats(const echo_comm *c, echo_stats *out);

/* Per call site: the calls this rank completed there. */
typedef struct echo_site_stats {
    uint64_t calls;
} echo_site_stats;

int echo_get_site_stats(const echo_comm *c, int site, echo_site_stats *out, char *err, size_t errlen);


/* ---- --allreduce auto (comm/auto.c) ----
 * What decides the all-reduce is measured once, at start-up (the link per
 * call-size class, the codecs' speed), and a pure function of those figures
 * picks per class the fastest of exact, bf16, echo (and echo3 when
 * allowed) whose accuracy is no worse than echo's, one-shot vs two-shot for
 * small calls, and the prefill overlap's micro-batch count. docs/network.md
 * ("--allreduce auto") has the model and its limits. */
typedef enum echo_auto_class {
    ECHO_AUTO_SMALL = 0, /* calls of at most ECHO_AUTO_SMALL_BYTES of fp32: decode steps, latency-bound */
    ECHO_AUTO_LARGE,     /* larger calls: prompt chunks, bandwidth-bound */
    ECHO_AUTO_CLASSES
} echo_auto_class;
#define ECHO_AUTO_SMALL_BYTES 65536
/* The candidates, in order of accuracy (a lossier one must be faster). */
#define ECHO_AUTO_CANDIDATES 4
extern const echo_preset echo_auto_candidates[ECHO_AUTO_CANDIDATES]; /* exact, bf16, echo, echo3 */

typedef struct echo_auto_link {
    double latency_s;   /* seconds per network step (the fit's intercept) */
    double bytes_per_s; /* bytes one rank sends per second (the fit's slope) */
} echo_auto_link;
typedef struct echo_auto_figures {
    int nranks;
    int shared_memory; /* ranks are threads of one process (the link is memory) */
    int threads;       /* compute threads per rank (the codec's workers) */
    echo_auto_link link[ECHO_AUTO_CLASSES];
    /* fp32 bytes of the class's typical call (the one the choice is made
     * for: one decode token's hidden state; a pass's prompt chunk) */
    double call_bytes[ECHO_AUTO_CLASSES];
    /* values per second one thread codes with the codec of echo_auto_candidates[i]:
     * encode and decode (0 for exact, which sums in place) */
    double encode_vps[ECHO_AUTO_CANDIDATES], decode_vps[ECHO_AUTO_CANDIDATES];
    /* compute seconds between two calls of a large call's pass (0: unknown):
     * what the prefill overlap can hide the all-reduce behind */
    double compute_s;
} echo_auto_figures;
typedef struct echo_auto_choice {
    echo_preset preset[ECHO_AUTO_CLASSES];
    int oneshot[ECHO_AUTO_CLASSES]; /* 1: the one-shot schedule (small calls only) */
    int overlap_k;                  /* prefill micro-batches (1: overlap off) */
    /* the model's seconds per call of each candidate, two-shot (NAN: not run) */
    double est_s[ECHO_AUTO_CLASSES][ECHO_AUTO_CANDIDATES];
} echo_auto_choice;
/* The choice for these figures (pure: the same figures, the same choice on
 * every rank). allow_echo3: echo3 is a candidate (--allreduce auto:echo3).
 * A world runs one codec: the small class runs the large class's preset or
 * exact (echo_config.min_bytes). -1 with a message for figures that make
 * no sense (nranks < 2, a link without bandwidth). */
int echo_auto_pick(const echo_auto_figures *f, int allow_echo3, echo_auto_choice *out, char *err, size_t errlen);
/* One line for logs, /metrics and JSON: the choice and the figures. */
void echo_auto_describe(const echo_auto_figures *f, const echo_auto_choice *c, char *buf, size_t len);
/* Measure f->encode_vps / decode_vps on this thread (a few ms per codec). */
int echo_auto_measure_codecs(echo_auto_figures *f, char *err, size_t errlen);
/* Shared memory (ranks as threads): the link is a copy through memory;
 * measures the copy bandwidth here, latency a fixed few microseconds. */
void echo_auto_measure_memory(echo_auto_figures *f);
/* The link of a world of the exact preset (min_bytes 0, no one-shot),
 * collective: every rank of the world calls it with its comm, in step (ranks
 * as processes; threads: from their own threads). Times calls of two sizes
 * per class (at most max_count values) and fits latency and bandwidth into
 * f->link; each rank's own timings (rank 0's decide: the caller broadcasts). */
int echo_auto_measure_link(echo_comm *c, size_t max_count, echo_auto_figures *f, char *err, size_t errlen);
/* "auto" / "auto:echo3" (*auto_mode 1 / 2, *p untouched) or a preset name
 * (*auto_mode 0): what --allreduce takes. -1 if neither. */
int echo_allreduce_parse(const char *s, echo_preset *p, int *auto_mode);

#endif
