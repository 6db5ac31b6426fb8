/*
 * comm/echo_internal.h — private to comm/: the world and rank structs, the
 * geometry of a call, and the two tables the schedule in echo.c runs on:
 *
 *   transport (transport/: local.c on host or device memory, nccl.c, mpi.c):
 *     moves bytes.
 *     Phase 1 is an all-to-all of shard wire messages, phase 2 an
 *     all-gather of them, `exact` a plain all-reduce. A transport hands out
 *     the buffers to write before an exchange and to read after it, so
 *     `local` can be zero-copy (the "send" buffer IS the peer's receive
 *     buffer in memory the ranks share: host memory, or one GPU's) while
 *     `nccl` stages through device buffers.
 *   compute (codec/: codec.c for host memory, echo_cuda.cu for device memory): the
 *     codec work of each phase. Both run the same steps in the same order on
 *     the same inline arithmetic (comm/codec/echo_codec.h).
 *
 * Everything here is per world or per rank; there is no file-scope state.
 */
#ifndef ECHO_COMM_INTERNAL_H
#define ECHO_COMM_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/echo.h"

#define ECHO_NO_INDEX ((size_t)-1)

/* The echo_*_names lists (echo.c): row(i) for i = 0, 1, ... until NULL,
 * skipping rows that return "", joined by sep into buf (cut to len, always
 * terminated). */
const char *echo_names_join(char *buf, size_t len, const char *sep, const char *(*row)(int i));

/* The geometry of one call: M = count values split into N shards of L values
 * (L a multiple of G; the last shards may be short or empty). Each shard
 * travels as one wire message of `wire` bytes: L/2 code bytes, then L/G bf16
 * scales. Groups past the end of the message are never coded nor read. */
typedef struct echo_plan {
    size_t count; /* M */
    size_t shard; /* L */
    size_t wire;  /* bytes of one shard's wire message */
    int nranks;   /* N */
    int group;    /* G */
    echo_dtype dt;
    /* Set by echo.c from the codec table (the wire size above too):
     * rotate: values per Walsh-Hadamard block (0: none); form: the scales'
     * wire form (comm/codec/echo_codec.h ECHO_FORM_*: one bf16 per group, or a
     * record per group). */
    int rotate;
    int form;
} echo_plan;

/* The codec works on an fp32 copy of the message (c->rot on the host,
 * d_rot on the device): rotated, or in a record form, whole groups. */
static inline int echo_plan_staged(const echo_plan *p) {
    return p->rotate || p->form != 0;
}

/* Values of shard c that lie inside the message. */
static inline size_t echo_plan_len(const echo_plan *p, int c) {
    size_t start = (size_t)c * p->shard;
    if (start >= p->count) return 0;
    return p->count - start < p->shard ? p->count - start : p->shard;
}

static inline size_t echo_dtype_size(echo_dtype dt) {
    return dt == ECHO_BF16 ? 2 : 4;
}

/* Shard geometry for `count` values; shared by echo.c (calls) and the world
 * (buffer sizing at max_count). */
static inline void echo_plan_init(echo_plan *p, size_t count, int nranks, int group, echo_dtype dt) {
    size_t per = (size_t)nranks * (size_t)group;
    p->count = count;
    p->shard = (count + per - 1) / per * (size_t)group;
    p->wire = p->shard / 2 + 2 * (p->shard / (size_t)group);
    p->nranks = nranks;
    p->group = group;
    p->dt = dt;
    p->rotate = 0;
    p->form = 0;
}

/* Values of the groups that hold data among the first n (n rounded up to G):
 * a rotating codec codes and decodes whole groups, padding included. */
static inline size_t echo_plan_pad(const echo_plan *p, size_t n) {
    return (n + (size_t)p->group - 1) / (size_t)p->group * (size_t)p->group;
}

/* What a rank posts for one call: transports that can see every rank's post
 * (local) check that the ranks agree, and read peers' inputs for `exact`. */
typedef struct echo_call {
    int site;
    size_t count;
    echo_dtype dt;
    echo_preset path; /* the path actually taken (after the size policy) */
    const void *x;    /* this rank's buffer, unchanged until the last exchange */
    const float *res; /* exact path: residual carried in (M values), or NULL */
} echo_call;

/* The optional group of a transport: collectives that complete on the
 * device, after the call returns (nccl). A transport without it cannot
 * defer (its create function refuses echo_config.deferred), and echo_vote
 * fails on it.
 *   wait: complete the collectives this rank enqueued on `stream`, without
 *     an endless wait (an abort ends it with a failure).
 *   note_call: a replayed call: check it with the peers as p1_exchange /
 *     exact would, move nothing.
 *   external: run launch(arg) (it enqueues a graph holding this rank's
 *     collectives) unless the world is aborted, so that it counts as a call.
 *   pass_begin / pass_discard: remember where this rank's pass started /
 *     take back the calls it posted since (every pass, deferred or not).
 *   vote: echo_vote among the ranks. */
typedef struct echo_deferred_ops {
    int (*wait)(echo_comm *c, void *stream, char *err, size_t errlen);
    int (*note_call)(echo_comm *c, const echo_call *call, char *err, size_t errlen);
    int (*external)(echo_comm *c, int (*launch)(void *arg, char *err, size_t errlen), void *arg, char *err,
                    size_t errlen);
    void (*pass_begin)(echo_comm *c);
    void (*pass_discard)(echo_comm *c);
    int (*vote)(echo_comm *c, int mine, int *agreed, char *err, size_t errlen);
} echo_deferred_ops;

/* A transport moves bytes; echo.c runs the schedule over it. Every
 * transport fills every slot but comm_fini (NULL: nothing per rank to free)
 * and `deferred` (NULL: each call completes before it returns). */
typedef struct echo_transport_ops {
    const char *name;
    int device_memory; /* buffers (and residuals) live on the GPU */
    int (*comm_init)(echo_comm *c, char *err, size_t errlen);
    void (*comm_fini)(echo_comm *c);
    void (*world_fini)(echo_world *w);
    /* Phase 1: where this rank writes its wire message for shard `peer`. */
    uint8_t *(*p1_send)(echo_comm *c, int peer);
    /* All-to-all of phase-1 messages; on return p1_recv(peer) is readable.
     * -1 (on every rank alike) if the ranks' calls disagree. */
    int (*p1_exchange)(echo_comm *c, const echo_plan *p, const echo_call *call, void *stream, char *err, size_t errlen);
    const uint8_t *(*p1_recv)(echo_comm *c, int peer);
    /* Phase 2: where the owner writes its shard's message; all-gather; read
     * (an all-gather lays the messages out at the call's wire size). */
    uint8_t *(*p2_send)(echo_comm *c, const echo_plan *p);
    int (*p2_exchange)(echo_comm *c, const echo_plan *p, void *stream, char *err, size_t errlen);
    const uint8_t *(*p2_recv)(echo_comm *c, const echo_plan *p, int owner);
    /* Plain all-reduce of call->x (+ call->res) into buf, in activation
     * precision (fp32 sum). *bad = first element whose sum is not finite,
     * else ECHO_NO_INDEX (the same on every rank: the outputs are). */
    int (*exact)(echo_comm *c, const echo_plan *p, const echo_call *call, void *buf, size_t *bad, void *stream,
                 char *err, size_t errlen);
    /* on = 1 wakes every rank waiting in (or later entering) a collective,
     * which then fails; on = 0 re-arms the world once no rank is inside a
     * collective any more. */
    void (*set_abort)(echo_world *w, int on);
    /* echo_world_usable: 0 with the reason when the world can never work again. */
    int (*usable)(const echo_world *w, char *why, size_t len);
    const echo_deferred_ops *deferred; /* optional: see echo_deferred_ops */
    /* Optional one-shot exchange (echo_config.oneshot_bytes; NULL: never
     * one-shot): os_send gives where this rank writes its message of
     * `bytes` (at most w->os_msg_max); os_exchange makes every rank's
     * message readable through os_recv (the ranks' agreement travels in the
     * messages, echo.c checks it); os_done (may be NULL) is called by every
     * rank once it has read them, before the next call. */
    uint8_t *(*os_send)(echo_comm *c, size_t bytes);
    int (*os_exchange)(echo_comm *c, size_t bytes, const echo_call *call, char *err, size_t errlen);
    const uint8_t *(*os_recv)(echo_comm *c, size_t bytes, int peer);
    int (*os_done)(echo_comm *c, char *err, size_t errlen);
} echo_transport_ops;

/* A one-shot message: this header (the call, for the agreement check, and
 * this rank's first bad input element), then fp32 values (exact) or the
 * codec's wire message of the whole count. */
#define ECHO_OS_HEADER 64
static inline size_t echo_os_msg_bytes(size_t count, echo_dtype dt, int exact, echo_codec_id codec, int group) {
    (void)dt;
    if (exact) return ECHO_OS_HEADER + count * sizeof(float);
    size_t ng = (count + (size_t)group - 1) / (size_t)group;
    return ECHO_OS_HEADER + ng * echo_codec_group_bytes(codec, group);
}

typedef struct echo_compute_ops {
    const char *name;
    /* Phase 1: for every shard c != own, y = x (+ res when res_valid) coded
     * into send[c]; when res != NULL, res = y - decode (the own shard's part
     * of res is not touched). *bad = first input element that is inf/nan or
     * |y| >= 2^127 when the backend can tell without a sync, else
     * ECHO_NO_INDEX. */
    int (*phase1)(echo_comm *c, const echo_plan *p, const void *x, float *res, int res_valid, uint8_t *const *send,
                  size_t *bad, void *stream, char *err, size_t errlen);
    /* Phase 2, owner: S = sum over j = 0..N-1 in that order of (j == own ?
     * x : decode(recv[j])) over the own shard, in fp32; z = S (+ g when
     * g_valid) coded into out; when g != NULL, g = z - (decoded value as
     * rounded to p->dt), so the residual accounts for the output rounding. */
    int (*phase2)(echo_comm *c, const echo_plan *p, const void *x, const uint8_t *const *recv, float *g, int g_valid,
                  uint8_t *out, void *stream, char *err, size_t errlen);
    /* Every rank: buf[shard c] = decode(gathered[c]) rounded to p->dt.
     * *bad = first element of a poisoned group, else ECHO_NO_INDEX. */
    int (*finish)(echo_comm *c, const echo_plan *p, const uint8_t *const *gathered, void *buf, size_t *bad,
                  void *stream, char *err, size_t errlen);
    /* Zero-initialised memory in the compute's space (the residual); free. */
    int (*alloc)(echo_comm *c, size_t bytes, void **out, char *err, size_t errlen);
    void (*free)(echo_comm *c, void *p);
    /* Per-rank state (c->compute_state), after the transport's comm_init
     * (which sets c->device). */
    int (*comm_init)(echo_comm *c, char *err, size_t errlen);
    void (*comm_fini)(echo_comm *c);
    /* Deferred worlds (device compute only): in a deferred world `finish`
     * and the transport's exact path record a non-finite output in a flag
     * per site (c->last_site) instead of reading it back, so *bad stays
     * ECHO_NO_INDEX. pass_arm enqueues the clearing of every site's flag
     * (at the first call of a pass); pass_read, once the stream is
     * complete, gives the first site whose output was not finite (-1 if
     * none) and its first bad element. */
    int (*pass_arm)(echo_comm *c, void *stream, char *err, size_t errlen);
    int (*pass_read)(echo_comm *c, void *stream, int *site, size_t *bad, char *err, size_t errlen);
    /* Rotating codecs: res[0..n) (n a multiple of `group`, the rotation
     * block) = the block-wise inverse rotation of res in place, so that a
     * residual kept in the rotated basis can be added to a plain input (the
     * size policy's exact path). */
    int (*unrotate)(echo_comm *c, float *res, size_t n, int group, void *stream, char *err, size_t errlen);
} echo_compute_ops;

extern const echo_compute_ops echo_host_compute;

/* The local transport (local.c) on either memory. local.c holds the
 * schedule: buffer layout, posts, agreement checks, the two abortable
 * barriers per call. This table says where its buffers live and does the
 * memory-specific steps; the host one is in local.c, the device one in
 * local_cuda.c. */
typedef struct echo_local_mem {
    int device_memory; /* buffers, residuals and the caller's buf are on GPU `device` */
    int (*alloc)(int device, size_t bytes, void **out, char *err, size_t errlen);
    void (*free)(int device, void *p); /* NULL is fine */
    /* Optional: complete this rank's work enqueued on `stream`, so that
     * peers may read what it wrote (and it has finished reading theirs).
     * Called before every barrier. */
    int (*sync)(echo_comm *c, void *stream, char *err, size_t errlen);
    /* Exact path, owner: sum[i] = x[0][i] (+ res[0][i]) + x[1][i] (+ res[1][i])
     * + ... in that order, in fp32, for i < n (x in dt; res[j] NULL when
     * rank j carries none). May be asynchronous on `stream`. */
    int (*sum)(echo_comm *c, int nranks, echo_dtype dt, const void *const *x, const float *const *res, size_t n,
               float *sum, void *stream, char *err, size_t errlen);
    /* Exact path, every rank: buf = in rounded to dt; *bad = first i whose
     * in[i] is inf/nan, else ECHO_NO_INDEX. Complete (and done reading
     * `in`) on return. */
    int (*store)(echo_comm *c, const float *in, void *buf, echo_dtype dt, size_t n, size_t *bad, void *stream,
                 char *err, size_t errlen);
} echo_local_mem;

/* A local world whose ranks all work on `device` (-1: host memory). */
int echo_local_world_create(int nranks, int device, const echo_local_mem *mem, const echo_compute_ops *compute,
                            const echo_config *cfg, echo_world **out, char *err, size_t errlen);

#ifdef ECHO_HAVE_CUDA
/* comm/'s CUDA error check (echo_cuda.cu, local_cuda.c, nccl.c): writes
 * "cuda: FILE:LINE: CALL: NAME (message)" for cudaError_t `e` into err and
 * returns -1. ECHO_CUDA_TRY(call) returns that from a function with `err`
 * and `errlen` in scope when call fails; the includer has cuda_runtime.h. */
int echo_cuda_fail(char *err, size_t errlen, const char *file, int line, const char *call, int e);
#define ECHO_CUDA_TRY(call)                                                                                            \
    do {                                                                                                               \
        cudaError_t echo_e_ = (call);                                                                                  \
        if (echo_e_ != cudaSuccess) return echo_cuda_fail(err, errlen, __FILE__, __LINE__, #call, (int)echo_e_);       \
    } while (0)
extern const echo_compute_ops echo_cuda_compute;
/* Device helpers for the nccl transport's exact path (echo_cuda.cu); each
 * enqueues on `stream`; check_finite synchronises it to read the answer. */
int echo_cuda_widen_add(echo_comm *c, const void *buf, echo_dtype dt, const float *res, float *out, size_t n,
                        void *stream, char *err, size_t errlen);
int echo_cuda_narrow(echo_comm *c, const float *in, void *buf, echo_dtype dt, size_t n, void *stream, char *err,
                     size_t errlen);
int echo_cuda_check_finite(echo_comm *c, const void *buf, echo_dtype dt, size_t n, size_t *bad, void *stream, char *err,
                           size_t errlen);
/* Device helpers for the local transport's exact path on device memory,
 * twins of local.c's host ones (echo_local_mem.sum / .store): the sum
 * enqueues on `stream`; the store synchronises it to read the answer. */
int echo_cuda_sum_ranks(echo_comm *c, int nranks, echo_dtype dt, const void *const *x, const float *const *res,
                        size_t n, float *sum, void *stream, char *err, size_t errlen);
int echo_cuda_store_checked(echo_comm *c, const float *in, void *buf, echo_dtype dt, size_t n, size_t *bad,
                            void *stream, char *err, size_t errlen);
/* The finish kernel alone, without reading the non-finite flag back (so
 * without synchronising): echo_cuda_compute.finish is this plus the
 * read-back. For benchmarks of the kernel. */
int echo_cuda_finish_async(echo_comm *c, const echo_plan *p, const uint8_t *const *gathered, void *buf, void *stream,
                           char *err, size_t errlen);
#endif

struct echo_world {
    echo_config cfg; /* defaults resolved */
    int nranks;
    echo_plan max_plan; /* geometry at cfg.max_count (buffer sizing) */
    size_t exact_max;   /* largest count the exact path can take (size policy) */
    int plain;          /* the codec is `none`: every call is the transport's exact all-reduce */
    echo_preset path;   /* the path of a call above the size policy (echo_stats index, agreement checks) */
    const echo_transport_ops *tp;
    const echo_compute_ops *compute;
    void *tp_world;     /* the transport's shared state */
    uint64_t epoch;     /* bumped by the transport when it re-creates its resources (echo_comm_epoch) */
    size_t os_bytes;    /* one-shot threshold in bytes of activations (0: off; resolved from cfg and env) */
    size_t os_msg_max;  /* the largest one-shot message (transport buffer sizing; 0: off) */
    pthread_mutex_t mu; /* guards has_comm: comms may be created from several threads */
    unsigned char has_comm[ECHO_MAX_RANKS];
};

struct echo_comm {
    echo_world *w;
    int rank;
    int device;          /* GPU of this rank, -1 on host memory */
    void *tp_comm;       /* the transport's per-rank state */
    void *compute_state; /* the compute's per-rank state */

    /* The residual, one buffer for all sites (feedback only): M values in
     * the compute's memory. On shard c != rank it holds this rank's phase-1
     * (reduce-scatter) residual, on shard `rank` its phase-2 (all-gather)
     * residual: the phase-1 residual of the own shard is always zero, since
     * that shard enters the sum unquantized. */
    float *res;
    size_t res_bytes;
    float *scratch; /* host compute: the owner's fp32 sum (L values) */
    echo_workers workers; /* host compute: echo_comm_set_workers (nthreads 0: none) */
    float *rot; /* host compute, staged codecs (echo_plan_staged): x (rotated), then the decoded sum (padded message) */
    float *os_y;   /* one-shot: this rank's input in fp32, then the sum (w->os_bytes / 2 values) */

    /* Pass state. */
    int in_pass;       /* begin_pass was called */
    int aborted;       /* a call of this pass failed after communicating */
    int last_site;     /* -1 at the start of a pass */
    int res_valid;     /* res holds the residual of the previous call */
    size_t pass_count; /* count of this pass's calls (feedback worlds) */
    echo_pass_mode mode; /* echo_begin_pass's */
    int replay;        /* echo_set_replay: calls are checked and counted, not enqueued */
    int armed;         /* deferred: this pass's flags were cleared (pass_arm) */
    int failed_alike;  /* the pass failed on a non-finite sum, reported by every rank alike */

    echo_stats stats;
    echo_site_stats *sites; /* n_sites */
};

/* ---- The parts of echo_end_pass (echo.c), for tests/gpu that drive them
 * one by one (deferred worlds: docs/echo.md §10, §11) ---- */
/* on = 1: the calls that follow are replayed from a graph: checked and
 * counted, nothing enqueued (echo_begin_pass's REPLAY). */
int echo_set_replay(echo_comm *c, int on, char *err, size_t errlen);
/* Run launch(arg), the replayed graph's launch, unless the world is aborted. */
int echo_launch_external(echo_comm *c, int (*launch)(void *arg, char *err, size_t errlen), void *arg, char *err,
                         size_t errlen);
/* The calls since echo_begin_pass did not run: begin again and repeat them. */
void echo_discard_pass(echo_comm *c);
/* Changes when the communicators are re-created (graphs of older ones are
 * gone by then: echo_world_clear_abort). */
uint64_t echo_comm_epoch(const echo_comm *c);
/* *agreed = 1 when every rank voted the same non-zero `mine` (0: nothing to
 * launch); else every rank runs the step eagerly. -1 on an abort. */
int echo_vote(echo_comm *c, int mine, int *agreed, char *err, size_t errlen);
/* 1 when this rank's pass failed on a non-finite sum that every rank
 * reported at the same point: the ranks are in step, no echo_abort needed. */
int echo_pass_failed_alike(const echo_comm *c);

/* Register a transport on a new world (local.c / nccl.c call it). */
int echo_world_alloc(int nranks, const echo_config *cfg, echo_world **out, char *err, size_t errlen);

/* comm/preset.c, for echo.c: the preset that names a (codec, feedback) path;
 * whether g is a valid group for codec ci; a call's wire geometry from its
 * codec's row (wire size, rotation, form). */
echo_preset echo_priv_preset_of(echo_codec_id codec, int feedback);
int echo_priv_group_valid(const echo_codec_info *ci, int g);
void echo_priv_plan_codec(echo_plan *p, echo_codec_id id);
void echo_world_free(echo_world *w);

/* ---- host codec loops (codec.c), shared by the host compute and the public
 * echo_codec_* wrappers. `codes` holds ceil(n/G)*G/2 bytes, `scales`
 * ceil(n/G) values. Return the number of poisoned groups and the first
 * element of the first one in *bad. ---- */
typedef enum echo_resid { ECHO_RESID_F32 = 0, ECHO_RESID_BF16 } echo_resid;
size_t echo_cpu_encode(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t n, int group,
                       uint8_t *codes, uint16_t *scales, size_t *bad);
/* out (fp32) = or += decode. */
void echo_cpu_decode(const uint8_t *codes, const uint16_t *scales, size_t n, int group, float *out, int accumulate);
/* out (dt) = decode rounded to dt. */
size_t echo_cpu_decode_store(const uint8_t *codes, const uint16_t *scales, size_t n, int group, void *out,
                             echo_dtype dt, size_t *bad);
/* out (fp32) = or += x (dt). */
void echo_cpu_load(const void *x, echo_dtype dt, size_t n, float *out, int accumulate);
/* out (dt) = in (fp32) rounded to dt; first non-finite element in *bad. */
void echo_cpu_store(const float *in, size_t n, void *out, echo_dtype dt, size_t *bad);

#endif
