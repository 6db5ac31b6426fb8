/*
 * comm/ — Echo: a 4-bit error-compensated all-reduce, with an exact mode and
 * the int4 ablation in the same code. Knows nothing about models.
 *
 * Contract
 *   - A world is N ranks that reduce together. With the `local` transport the
 *     ranks are threads of one process (sharing host memory, or one GPU's
 *     memory) and the world is created once and shared; with `nccl` each
 *     rank is a GPU; with `mpi` each rank is a process (one world per
 *     process, each holding its own rank's comm).
 *   - Each rank owns an echo_comm (its transport endpoint and its residual).
 *     Per rank, calls are made from one thread, in the same order on every
 *     rank (like NCCL): begin_pass, then allreduce at sites in order. The
 *     transports check that the ranks agree (site, count, dtype, path) and
 *     fail the call on every rank if they do not: local at its barrier;
 *     nccl on the host before anything is enqueued (its ranks are threads
 *     of this process), and since a rank may have enqueued already, the
 *     nccl world is then aborted as by echo_abort (see there).
 *   - echo_allreduce(site, buf, count) is in place: on return every rank's buf
 *     holds the same values, bit-identical across ranks in every mode.
 *       exact: plain sum in activation precision (fp32 sum; bf16 rounds once;
 *              on nccl NCCL's own order and rounding: see echo_world_create_nccl).
 *       int4:  the world's codec (echo_config.codec, the codec table below)
 *              and the two-shot schedule, no residuals.
 *       echo:  int4 plus error feedback: the rounding error each call leaves
 *              is added to the input of the next call of the same pass.
 *       bf16:  exact with 16 bits on the wire (host transports): the int4
 *              schedule with bf16 messages, fp32 sums, no residuals.
 *     See docs/echo.md for the wire format, the schedule and the error bound.
 *   - Residual slots. The residual carried into a call is the one left by
 *     the previous call of this pass on this rank, whatever its site; sites
 *     must strictly increase within a pass (gaps are fine, e.g. a partial
 *     pass) and name the slot for ordering and statistics. Since only the
 *     next call reads a slot, all sites share one buffer updated in place:
 *     the memory (echo_comm_slot_bytes) is one padded message of fp32,
 *     independent of n_sites. In echo mode every call of a pass must have the
 *     same count (the residual is laid out for it); a new pass may change it.
 *   - Size policy: calls whose message (count * sizeof(dtype)) is below
 *     min_bytes use the exact path in every mode; a residual carried into such
 *     a call is added to its input, and the call leaves a zero residual.
 *   - Slots are sized at creation for max_count elements and n_sites sites;
 *     a call with count > max_count, site >= n_sites, sites out of order
 *     within a pass, or no begin_pass is an error (clear message, state
 *     unchanged, nothing communicated).
 *   - Non-finite input (inf/nan, or |x| >= 2^127 which the codec cannot
 *     scale) and an fp32 sum that overflows are detected and reported as an
 *     error on every rank of the same call, never silently made finite: the
 *     affected outputs hold NaN/inf and the pass is aborted (the next call
 *     fails until echo_begin_pass). A deferred world (echo_config.deferred)
 *     reports it from echo_end_pass instead, naming the first such site.
 *   - With one rank there is nothing to reduce: calls leave buf unchanged.
 *   - Functions return 0 or -1 with a message in the caller's buffer; nothing
 *     prints or exits.
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
    ECHO_CODEC_NONE,        /* exact: fp32 on the wire, the transport's own all-reduce */
    ECHO_CODEC_BF16,        /* exact: bf16 on the wire, fp32 sums rounded once (host transports only) */
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
} echo_config;

typedef struct echo_world echo_world; /* shared by the ranks of one process */
typedef struct echo_comm echo_comm;   /* one rank */

/* ---- Presets: what users type (--allreduce) ----
 *   exact = {none, no feedback}   int4 = {the 4-bit codec, no feedback}
 *   echo  = {the 4-bit codec, feedback}   bf16 = {bf16, no feedback}
 * A preset also names the path a call took in echo_stats (the size
 * policy's fallback is `exact`). */
typedef enum echo_preset {
    ECHO_PRESET_EXACT = 0,
    ECHO_PRESET_INT4,
    ECHO_PRESET_ECHO,
    ECHO_PRESET_BF16,
    ECHO_PRESET_COUNT /* rows of the preset table */
} echo_preset;

/* Parse "exact" | "int4" | "echo" | "bf16"; -1 if unknown. */
int echo_preset_parse(const char *s, echo_preset *out);
const char *echo_preset_name(echo_preset p); /* "unknown" out of range */
/* cfg->codec and cfg->feedback of preset p, the 4-bit presets taking
 * `codec` (0: ECHO_DEFAULT_CODEC); cfg->group_size = group, or when 0 the
 * default G of `codec` (so a world's G does not depend on the preset).
 * Other fields are left as they are. -1 for an unknown preset. */
int echo_preset_config(echo_preset p, echo_codec_id codec, int group, echo_config *cfg);

/* ---- The codec table ----
 * A row says how a group of G values travels and which code runs it:
 *   4-bit codecs (int4 ... hout2): code bits per value, the bytes of the
 *     group's scale, optionally a rotation first (linear and orthogonal, so
 *     the owner sums rotated values and every rank rotates the decoded sum
 *     back once); host codec in codec.c, device kernels in echo_cuda.cu.
 *   exact codecs (`lossless`): values as floats of code_bits bits; none is
 *     the transport's plain all-reduce (local.c/local_cuda.c, nccl.c,
 *     mpi.c), bf16 the two-shot schedule with bf16 messages (host loops in
 *     echo.c; `host_only`: a device world is refused at echo_comm_create).
 * docs/echo.md, "Codecs", has the formats and the measurements that chose
 * ECHO_DEFAULT_CODEC. */
typedef struct echo_codec_info {
    const char *name;  /* what users type: "int4", "hadamard", "hsub6", "out2", "hout2", "none", "bf16" */
    int rotate;        /* values per Walsh-Hadamard rotation block (comm/echo_codec.h): 0 none, -1 the group */
    int code_bits;     /* wire bits of one value (its code, or the float itself when lossless) */
    int scale_bytes;   /* wire bytes of one group's scale */
    int sub_bits;      /* wire bits of the scale of each 16 values within a group (0: none) */
    int min_group;     /* smallest G the codec takes (G is a power of two up to ECHO_MAX_GROUP) */
    int default_group; /* G when echo_config.group_size is 0 */
    int form;          /* wire form of a group's scales (comm/echo_codec.h ECHO_FORM_*): 0 one bf16 */
    int lossless;      /* 1: the sum is exact in fp32 (no error, so no feedback) */
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

/* local transport: nranks threads of this process, buffers in host memory. */
int echo_world_create_local(int nranks, const echo_config *cfg, echo_world **out, char *err, size_t errlen);
/* local transport on device memory: nranks threads of this process that
 * share GPU `device`, for tests of tensor parallelism on one GPU. Buffers
 * passed to echo_allreduce are device pointers on that GPU and `stream` is
 * the calling rank's cudaStream_t (each rank its own; NULL is the default
 * stream). Same schedule, checks and bits as echo_world_create_local; every
 * barrier synchronises the rank's stream (correctness over speed). A rank
 * whose device work fails inside a collective aborts the world (as
 * echo_abort) so its peers fail instead of waiting. Fails with a message in a build without CUDA or when no GPU is
 * present. */
int echo_world_create_local_device(int nranks, int device, const echo_config *cfg, echo_world **out, char *err,
                                   size_t errlen);
/* nccl transport: one GPU per rank (devices[rank]), all driven from this
 * process (ncclCommInitAll, then transfers of each kind at sizes from 64
 * bytes up to the largest message, x4 apart, so that NCCL's lazily made
 * connections are set up before any call, and never inside a capture). Buffers passed to
 * echo_allreduce are device pointers and `stream` is the rank's
 * cudaStream_t. Each call ends by waiting for the stream, polling, so that
 * an abort can end the wait; with echo_config.deferred calls only enqueue
 * and echo_end_pass waits once per pass (see "Deferred completion"). int4/echo calls give the same bits as the
 * local transport; exact calls are an ncclAllReduce (NCCL's order of
 * addition, and for bf16 its rounding of partial sums). Fails with a message in a build without CUDA. */
int echo_world_create_nccl(int nranks, const int *devices, const echo_config *cfg, echo_world **out, char *err,
                           size_t errlen);
/* mpi transport: one rank per process, rank = this process's rank in
 * MPI_COMM_WORLD, nranks = its size; buffers in host memory (host compute).
 * Collective: every process of MPI_COMM_WORLD calls it (it duplicates the
 * communicator, so echo's traffic never mixes with the program's). MPI must
 * already be initialised by the program, with MPI_Init_thread at
 * MPI_THREAD_FUNNELED or better, and every echo call of the process made
 * from the thread that initialised it. echo_comm_create takes this
 * process's own rank only. Same schedule, checks, size policy, residuals
 * and bits as local for int4, echo and bf16 (phase 1 MPI_Alltoallv, phase 2
 * MPI_Allgather); before each call's data moves, a small MPI_Allgather of
 * (site, count, dtype, path) lets every rank fail a disagreement alike.
 * exact: MPI_Allreduce of fp32 (default), or the two-shot schedule with
 * fp32 on the wire summed in rank order when $ECHO_MPI_EXACT=twoshot (read
 * here); both give bit-identical replicas (Open MPI reduces each element
 * once and distributes it), equal to local within fp32 reordering.
 * echo_abort: MPI cannot interrupt a blocking collective, so it only marks
 * this process's world aborted (its calls fail until
 * echo_world_clear_abort, and echo_world_usable says why); peers already
 * inside a collective of it are woken only by MPI_Abort, which ends the
 * job: the program calls it when a rank fails outside the all-reduce.
 * clear_abort is safe only when every process aborted at the same point.
 * deferred and device memory are not supported. Fails with a
 * message in a build without Open MPI (Makefile: MPI=0). */
int echo_world_create_mpi(const echo_config *cfg, echo_world **out, char *err, size_t errlen);

/* ---- Processes (comm/proc.c): ranks as processes under mpirun ----
 * The MPI calls outside the all-reduce, so that only comm/ includes mpi.h.
 * echo_proc_init starts the process's MPI session when mpirun launched the
 * program (OMPI_COMM_WORLD_SIZE set; MPI_Init_thread, SERIALIZED) and reports
 * rank 0 of 1 otherwise, when every call below is a no-op on one process.
 * Control messages use their own duplicate of MPI_COMM_WORLD (errors
 * returned, not fatal) and must be made in the same order on every process,
 * one thread at a time. A failure (a peer died) comes back as -1 with a
 * message. */
int echo_proc_init(int *rank, int *nprocs, char *err, size_t errlen);
int echo_proc_rank(void);  /* 0 without a session */
int echo_proc_count(void); /* 1 without a session */
/* rank 0's `bytes` at buf, to every process */
int echo_proc_bcast(void *buf, size_t bytes, char *err, size_t errlen);
/* every process's `bytes` at send into rank 0's recv (nprocs * bytes, rank order) */
int echo_proc_gather(const void *send, size_t bytes, void *recv, char *err, size_t errlen);
/* 0 when every process passed ok != 0; else -1 on every process, with
 * "process R: why" of the lowest failed rank */
int echo_proc_agree(int ok, const char *why, char *err, size_t errlen);
/* Print why and end every process of the job (MPI_Abort): for a rank that
 * cannot continue while its peers may wait in a collective. Returns only
 * without a session (the caller then exits). */
void echo_proc_abort(int code, const char *why);
void echo_proc_finalize(void);
/* Destroy every comm of the world first. */
void echo_world_destroy(echo_world *w);

/* The world's configuration with defaults resolved (group_size != 0). */
void echo_world_get_config(const echo_world *w, echo_config *out);
int echo_world_nranks(const echo_world *w);

/* The endpoint of `rank` in `w`. Slot memory is allocated here. */
int echo_comm_create(echo_world *w, int rank, echo_comm **out, char *err, size_t errlen);
void echo_comm_destroy(echo_comm *c);

/* Bytes of residual-slot memory this rank holds (reported at start-up). */
size_t echo_comm_slot_bytes(const echo_comm *c);

/* Start a forward pass: clears the residual carried between calls. */
int echo_begin_pass(echo_comm *c, char *err, size_t errlen);

/* In-place all-reduce of `count` values at call site `site`. `stream` is the
 * backend stream for device transports (NULL on the cpu path). */
int echo_allreduce(echo_comm *c, int site, void *buf, size_t count, echo_dtype dt, void *stream, char *err,
                   size_t errlen);

/* A rank that fails outside the all-reduce (an op error, out of memory)
 * calls echo_abort so that peers waiting in, or later entering, a collective
 * of this world fail with a message instead of waiting forever; their pass
 * is aborted. Once every rank has returned, the owner of the ranks calls
 * echo_world_clear_abort; the next pass (echo_begin_pass) then works again.
 * On nccl an abort ends the world's NCCL communicators (ncclCommAbort: each
 * rank's own when it sees the abort, the idle ones at once), so calls fail
 * until echo_world_clear_abort, which creates them anew (ncclCommInitAll);
 * if that fails, every later call fails with the reason and the world must
 * be destroyed and created again. A world may also be destroyed while
 * aborted, without clearing.
 * CUDA graphs on nccl: NCCL (>= 2.26) frees communicators only once every
 * graph that captured a call on them is destroyed. So before
 * echo_world_clear_abort and echo_world_destroy, destroy every graph that
 * captured this world's calls (an abort itself never waits for them: the
 * communicators are ended by a thread of the world's own). Both wait for
 * that at most $ECHO_NCCL_FREE_WAIT_S seconds (default 60); past it
 * clear_abort leaves the world unusable, with that reason, and destroy
 * leaves the communicators (a message on stderr) instead of hanging. */
void echo_abort(echo_comm *c);
void echo_world_clear_abort(echo_world *w);
/* 0 when the world can never work again (on nccl: re-creating its
 * communicators after an abort failed, or they were not freed in time), with
 * the reason in `why`: destroy it and create a new one. 1 otherwise, an
 * aborted world that echo_world_clear_abort can re-arm included. Safe from
 * any thread. */
int echo_world_usable(const echo_world *w, char *why, size_t len);
/* 1 when this rank's current pass failed with an error that every rank
 * reported at the same point with no collective left pending: a sum that
 * is not finite (at the call, or at echo_end_pass in a deferred world).
 * The ranks are then still in step and need no echo_abort (which on nccl
 * ends the communicators, and clearing it re-creates them); the next
 * echo_begin_pass works. 0 for any other failure, and before one. */
int echo_pass_failed_alike(const echo_comm *c);

/* ---- Deferred completion and CUDA graphs (echo_config.deferred; nccl) ----
 * Without `deferred` every call on a device transport waits for its
 * collective before returning (so it can report a non-finite sum at once):
 * one host-device round trip per call, 72 per Qwen3-8B pass, each leaving
 * the GPU idle while the host catches up. With `deferred` a call validates,
 * checks agreement with the peers on the host and enqueues: nothing waits,
 * nothing is read back. The pass then ends with
 *
 *   echo_end_pass: waits for the rank's stream (abortably: an abort or an
 *   NCCL error ends the wait) and reports the first call of the pass whose
 *   sum was not finite. Call it before anything that reads the pass's
 *   results on the host. Until it returns 0 the pass's outputs are not
 *   known to be valid. On worlds without `deferred` it does nothing.
 *
 * A rank whose host blocks elsewhere while its collectives are pending (a
 * device-to-host copy) is not stuck for good if a peer fails: the peer's
 * echo_abort ends this rank's communicator, which ends its pending NCCL
 * kernels, and this rank's next call or echo_end_pass fails.
 *
 * Deferred calls can be captured in a CUDA graph (stream capture in
 * thread-local mode on the rank's stream): echo knows nothing of graphs,
 * the caller tells it what its calls do:
 *   - capture: calls are made as usual (their device work is recorded).
 *   - echo_set_replay(c, 1): the calls that follow are replayed from a
 *     graph: they are validated, checked with the peers and counted, and
 *     enqueue nothing. The graph must then be launched through
 *     echo_launch_external, which launches it only while the world is not
 *     aborted (a graph of an aborted communicator must never run).
 *   - echo_discard_pass: the calls since echo_begin_pass did not run (a
 *     capture was thrown away, a replay not launched): the peers are told
 *     to expect them again; call echo_begin_pass and make them again.
 *   - echo_comm_epoch changes when the world's communicators are created
 *     anew (echo_world_clear_abort on nccl): graphs captured before must be
 *     dropped, and before that call already (see echo_abort).
 *   - echo_vote: NCCL requires a captured collective to be launched by all
 *     its ranks, each from the graph of that same capture, and a rank may
 *     fail to capture or find its replay invalid on its own. So before
 *     launching, every rank votes what it holds (0: nothing, so the step
 *     runs eagerly; a non-zero code, e.g. 1 = a fresh capture, 2 = a
 *     replay): *agreed = 1 only when every rank passed the same non-zero
 *     code. Otherwise every rank drops its graph (captured again later,
 *     by all ranks at once) and runs the step eagerly. Waits on the host
 *     for the peers; an abort ends the wait with -1.
 * Graphs and deferred completion need the nccl transport: the local one
 * synchronises the ranks on the host at every call. */
int echo_end_pass(echo_comm *c, void *stream, char *err, size_t errlen);
int echo_set_replay(echo_comm *c, int on, char *err, size_t errlen);
int echo_launch_external(echo_comm *c, int (*launch)(void *arg, char *err, size_t errlen), void *arg, char *err,
                         size_t errlen);
void echo_discard_pass(echo_comm *c);
uint64_t echo_comm_epoch(const echo_comm *c);
int echo_vote(echo_comm *c, int mine, int *agreed, char *err, size_t errlen);

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

/* ---- The group codec on host memory (tests, benchmarks, tools) ----
 * Wire form of `count` values in groups of `group`: ceil(count/group) groups;
 * first the codes, two per byte, element 2j in the low nibble (4-bit two's
 * complement in [-7, 7]), then one bf16 scale per group (little-endian). A
 * partial last group is padded with zeros. docs/echo.md has the details. */
size_t echo_codec_wire_bytes(size_t count, int group);
/* y = x (+ *res when res != NULL) is coded into `wire`; when res != NULL it
 * is replaced by y - decode(wire) (error feedback). -1 with a message if some
 * y is inf/nan or |y| >= 2^127 (then wire and res are unspecified). */
int echo_codec_encode(const float *x, float *res, size_t count, int group, void *wire, char *err, size_t errlen);
/* out = decode(wire) (accumulate = 0) or out += decode(wire). */
void echo_codec_decode(const void *wire, size_t count, int group, float *out, int accumulate);
/* The decoded scale of group g of a wire form (NaN for a poisoned group). */
float echo_codec_group_scale(const void *wire, size_t count, int group, size_t g);
/* The same for any codec of the table (ECHO_CODEC_DEFAULT resolved): a
 * rotating codec codes the rotated groups (whole groups, the padding of a
 * ragged end rotated in), and its residual res (ceil(count/group)*group
 * values) is kept in the rotated basis, as the all-reduce keeps it; decode
 * rotates back. The wire form is echo_codec_wire_bytes(count, group) bytes.
 * -1 with a message for an unknown codec or group, out of memory, or a
 * value the codec cannot code. */
int echo_codec_encode_as(echo_codec_id id, const float *x, float *res, size_t count, int group, void *wire, char *err,
                         size_t errlen);
int echo_codec_decode_as(echo_codec_id id, const void *wire, size_t count, int group, float *out, int accumulate,
                         char *err, size_t errlen);

#endif
