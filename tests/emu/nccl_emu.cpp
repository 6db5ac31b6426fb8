/*
 * tests/emu/nccl_emu.cpp — an in-process NCCL for the CPU emulator: the ranks
 * of a clique (ncclCommInitAll) are threads of this process and "device"
 * memory is host memory (tests/emu's CUDA runtime), so comm/transport/nccl.c runs in CI
 * without a GPU.
 *
 * What it models
 *   - ncclCommInitAll / Destroy / Abort / GetAsyncError, ncclGroupStart/End
 *     (nested; one thread may drive several comms in one group, as with real
 *     NCCL), ncclSend/ncclRecv, ncclAllGather, ncclAllReduce, the error
 *     strings of the real library (ncclGetErrorString).
 *   - Matching: the k-th collective of every rank of a clique meet; the m-th
 *     send from a to b meets the m-th receive at b from a. Operations run
 *     when their group ends (a call outside a group is a group of one); a
 *     thread's ncclGroupEnd returns once every operation it posted has met
 *     its peers and run — a rendezvous, as the data movement of real NCCL is.
 *     This is where a rank waits for its peers (real NCCL returns at once
 *     and the wait is on the stream); the work queued on the operations'
 *     streams before them runs first (the emulator's streams are deferred).
 *   - Arithmetic: ncclSum over ncclFloat32 (fp32, ranks added in rank order
 *     0..N-1), ncclFloat64, ncclInt32, and ncclBfloat16 (summed in fp32 in
 *     rank order, rounded to bf16 once, round-to-nearest-even). Every rank
 *     receives the same bits. REAL NCCL DIFFERS: it adds in ring/tree order
 *     and, for bf16, rounds to bf16 after each step of the ring, so its
 *     results depend on the algorithm and the rank count. Tests must not
 *     expect bit-identity of an exact-mode (ncclAllReduce) bf16 sum with a
 *     host reference — only of the codec paths, which move bytes.
 *   - Argument checks that real NCCL makes (null comm, peer out of range, a
 *     null buffer with count > 0, unknown datatype or op, duplicate devices
 *     in InitAll, GroupEnd without GroupStart): ncclInvalidArgument /
 *     ncclInvalidUsage, the failing call posts nothing, and inside a group
 *     the group's ncclGroupEnd returns the error and drops the group.
 *   - Faults real NCCL does NOT detect (it hangs or corrupts memory) are
 *     reported instead of emulated: ranks whose matched operations differ
 *     (kind, count, datatype, op), a send and a receive of different sizes,
 *     partially overlapping in/out buffers, use of a comm after Destroy or
 *     Abort (that one prints and aborts the process: it is a use after free
 *     in real NCCL). Each prints one "nccl_emu:" line on stderr and the
 *     matched operations fail with ncclInvalidUsage on every participant.
 *   - The end of a clique: the last ncclCommDestroy / ncclCommAbort of a
 *     clique waits until every CUDA graph that captured an operation on any
 *     of its comms is destroyed, as NCCL >= 2.26 does (src/init.cc,
 *     commDestroySync polls until the comms' localPersistentRefs reach 0;
 *     each captured launch plan holds one until its graph is destroyed).
 *     Real NCCL waits forever; after ECHO_EMU_NCCL_GRAPH_WAIT_S seconds
 *     (default 120) the emulator prints what it waits for and aborts the
 *     process instead. Earlier ends of the clique's comms return at once.
 *   - Abort: ncclCommAbort on any comm of a clique marks the clique aborted;
 *     peers waiting in (or later posting) an operation return
 *     ncclRemoteError, and ncclCommGetAsyncError on their comms reports
 *     ncclRemoteError. The same holds when a comm is destroyed while peers
 *     wait for it (real NCCL would hang there). Another thread may abort a
 *     comm while its own thread waits in an operation on it (what
 *     ncclCommAbort is for): that thread returns ncclRemoteError.
 *   - Stream capture: a group (or a lone call) whose operations are posted on
 *     a capturing stream runs nothing at ncclGroupEnd; it becomes one node of
 *     that stream's graph, and every cudaGraphLaunch of it posts the same
 *     operations afresh and meets the peers as above, since a captured NCCL
 *     kernel communicates again at each replay. A replay cannot return an
 *     error, so a failed one sets its comm's async error
 *     (ncclCommGetAsyncError). A group that mixes capturing and other
 *     streams, or two capturing streams, is refused (ncclInvalidUsage, as
 *     real NCCL refuses it); an invalidated capture gives
 *     ncclUnhandledCudaError. A cudaGraphLaunch after the comms were
 *     destroyed or aborted is caught like any use after Destroy/Abort; a
 *     replay launched before that but run by its (deferred) stream after it
 *     fails with ncclRemoteError, as a launched NCCL kernel gives up when it
 *     sees the abort flag.
 *
 * What it does not model
 *   - Asynchrony: operations complete before the call returns (after the
 *     work queued before them on their streams), so a rank that is waiting
 *     for a peer waits inside ncclGroupEnd / the collective call, or, for a
 *     captured one, where its stream's queue runs the graph launch
 *     (cudaStreamSynchronize/Query, ...).
 *   - Real NCCL's reduction order and intermediate rounding (see above),
 *     ncclAvg/Prod/Min/Max and datatypes other than those listed (they fail
 *     with ncclInvalidUsage and a "not modelled" line), and collectives other
 *     than these four (no Broadcast, Reduce, ReduceScatter).
 *   - Streams and devices: the stream argument is not checked against the
 *     comm's device; nothing is ordered against other streams. Whether a
 *     stream captures is read at ncclGroupEnd, not at each call.
 *   - Non-blocking communicators (ncclConfig_t), ncclCommSplit, unique ids
 *     and multi-process cliques, connection set-up, timeouts, NCCL_* env.
 *
 * State: each clique (one ncclCommInitAll) is one heap object guarded by its
 * own mutex. It is freed once no comm of it is live AND no thread is inside
 * an operation on it AND no captured graph node refers to it, whichever
 * comes last: a waiter may outlive its comm's abort by another thread, and a
 * graph must still find its dead comms to report a replay of them. The only
 * other state is per thread, as in real NCCL: the open group and the text of
 * the last error (ncclGetLastError).
 */
/* The C++ headers come first: the emulator's cuda_runtime.h (through nccl.h)
 * defines __noinline__, a name libstdc++'s <memory> uses as an attribute. */
#include <deque>
#include <memory>
#include <vector>

#include <nccl.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>

#include "emu_internal.h"

namespace {

enum OpKind { OP_SEND, OP_RECV, OP_ALLREDUCE, OP_ALLGATHER };
const char *const kind_name[] = {"ncclSend", "ncclRecv", "ncclAllReduce", "ncclAllGather"};

enum CommState { LIVE, DESTROYED, ABORTED };

struct Clique;

struct Op {
    OpKind kind;
    ncclComm_t comm;
    int peer; /* p2p only */
    const void *sbuf;
    void *rbuf;
    size_t count; /* elements (AllGather: per rank) */
    ncclDataType_t dt;
    ncclRedOp_t redop;
    cudaStream_t stream;
    bool done;
    ncclResult_t result;
};

} // namespace

struct ncclComm {
    Clique *cl;
    int rank;
    int dev;
    CommState state;
    ncclResult_t async_err;
};

namespace {

struct Clique {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    int live; /* comms not yet destroyed or aborted */
    /* Threads inside run_group plus graph nodes holding the clique's comms:
     * a comm may be aborted from another thread while its own thread waits
     * here, and a captured graph may be replayed after its comms ended
     * (check_live must still find them to report it). */
    int refs;
    int graphs; /* captured graph nodes alive (Pins): the clique's last end waits for 0 */
    bool aborted;
    std::vector<ncclComm> comms;
    std::vector<std::deque<Op *>> coll;               /* per rank, posted collectives in order */
    std::vector<std::vector<std::deque<Op *>>> sends; /* [src][dst] */
    std::vector<std::vector<std::deque<Op *>>> recvs; /* [dst][src] */
};

/* Per thread, like real NCCL's group state. */
thread_local int g_depth;
thread_local ncclResult_t g_group_err;
thread_local std::vector<Op *> *g_ops;
thread_local char g_last[512];

void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last, sizeof g_last, fmt, ap);
    va_end(ap);
    fprintf(stderr, "nccl_emu: %s\n", g_last);
}

size_t dt_size(ncclDataType_t dt) {
    switch (dt) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
    }
}

float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays a quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);                                           /* round to nearest even */
    return (uint16_t)(u >> 16);
}

bool overlap(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* A comm used after Destroy/Abort is a use after free in real NCCL. */
void check_live(ncclComm_t c, const char *call) {
    if (c->state != LIVE) {
        fprintf(stderr, "nccl_emu: %s on rank %d's comm after ncclComm%s (a use after free in real NCCL)\n", call,
                c->rank, c->state == DESTROYED ? "Destroy" : "Abort");
        abort();
    }
}

void free_clique(Clique *cl) {
    pthread_cond_destroy(&cl->cv);
    pthread_mutex_destroy(&cl->mu);
    delete cl;
}

void ref(Clique *cl) {
    pthread_mutex_lock(&cl->mu);
    cl->refs++;
    pthread_mutex_unlock(&cl->mu);
}

/* The clique goes when neither a comm nor a reference is left. */
void unref(Clique *cl) {
    pthread_mutex_lock(&cl->mu);
    bool last = --cl->refs == 0 && cl->live == 0;
    pthread_mutex_unlock(&cl->mu);
    if (last) free_clique(cl);
}

std::vector<Clique *> cliques_of(const std::vector<Op *> &ops) {
    std::vector<Clique *> v;
    for (const Op *o : ops) {
        bool seen = false;
        for (Clique *c : v)
            seen |= c == o->comm->cl;
        if (!seen) v.push_back(o->comm->cl);
    }
    return v;
}

void finish(Clique *cl, Op *o, ncclResult_t r) {
    (void)cl;
    o->result = r;
    o->done = true;
}

/* Run the front collective of every rank once all have posted one. */
void progress_coll(Clique *cl) {
    for (;;) {
        for (int r = 0; r < cl->n; r++)
            if (cl->coll[r].empty()) return;
        std::vector<Op *> ops((size_t)cl->n);
        for (int r = 0; r < cl->n; r++) {
            ops[(size_t)r] = cl->coll[r].front();
            cl->coll[r].pop_front();
        }
        const Op *a = ops[0];
        ncclResult_t res = ncclSuccess;
        for (int r = 1; r < cl->n && res == ncclSuccess; r++) {
            const Op *b = ops[(size_t)r];
            if (b->kind != a->kind || b->count != a->count || b->dt != a->dt ||
                (a->kind == OP_ALLREDUCE && b->redop != a->redop)) {
                note("ranks disagree on a collective: rank 0 posted %s(count %zu, datatype %d, op %d), rank %d "
                     "%s(count %zu, datatype %d, op %d); real NCCL would hang or corrupt memory",
                     kind_name[a->kind], a->count, (int)a->dt, (int)a->redop, r, kind_name[b->kind], b->count,
                     (int)b->dt, (int)b->redop);
                res = ncclInvalidUsage;
            }
        }
        size_t esz = dt_size(a->dt), n = a->count, N = (size_t)cl->n;
        if (res == ncclSuccess && a->kind == OP_ALLGATHER) {
            /* Snapshot the contributions first: in place, rank r's input is
             * a slice of its own output. */
            std::vector<unsigned char> tmp(N * n * esz);
            for (size_t r = 0; r < N; r++)
                if (n) memcpy(tmp.data() + r * n * esz, ops[r]->sbuf, n * esz);
            for (size_t r = 0; r < N; r++)
                if (n) memcpy(ops[r]->rbuf, tmp.data(), N * n * esz);
        } else if (res == ncclSuccess && a->kind == OP_ALLREDUCE) {
            bool modelled = a->redop == ncclSum && (a->dt == ncclFloat32 || a->dt == ncclBfloat16 ||
                                                    a->dt == ncclFloat64 || a->dt == ncclInt32);
            if (!modelled) {
                note("ncclAllReduce with datatype %d and op %d is not modelled by the emulator", (int)a->dt,
                     (int)a->redop);
                res = ncclInvalidUsage;
            } else {
                /* One result for every rank, ranks added in order 0..N-1;
                 * bf16 is summed in fp32 and rounded once (real NCCL's ring
                 * rounds after each step: see the header comment). */
                std::vector<unsigned char> out(n * esz);
                for (size_t i = 0; i < n; i++) {
                    if (a->dt == ncclFloat32 || a->dt == ncclBfloat16) {
                        float s = 0.0f;
                        for (size_t r = 0; r < N; r++) {
                            float v;
                            if (a->dt == ncclFloat32) {
                                memcpy(&v, (const char *)ops[r]->sbuf + i * 4, 4);
                            } else {
                                uint16_t h;
                                memcpy(&h, (const char *)ops[r]->sbuf + i * 2, 2);
                                v = bf16_to_f32(h);
                            }
                            s = r ? s + v : v;
                        }
                        if (a->dt == ncclFloat32) {
                            memcpy(out.data() + i * 4, &s, 4);
                        } else {
                            uint16_t h = f32_to_bf16(s);
                            memcpy(out.data() + i * 2, &h, 2);
                        }
                    } else if (a->dt == ncclFloat64) {
                        double s = 0, v;
                        for (size_t r = 0; r < N; r++) {
                            memcpy(&v, (const char *)ops[r]->sbuf + i * 8, 8);
                            s = r ? s + v : v;
                        }
                        memcpy(out.data() + i * 8, &s, 8);
                    } else {
                        uint32_t s = 0, v; /* wraps like the device's int32 add */
                        for (size_t r = 0; r < N; r++) {
                            memcpy(&v, (const char *)ops[r]->sbuf + i * 4, 4);
                            s += v;
                        }
                        memcpy(out.data() + i * 4, &s, 4);
                    }
                }
                for (size_t r = 0; r < N; r++)
                    if (n) memcpy(ops[r]->rbuf, out.data(), n * esz);
            }
        }
        for (size_t r = 0; r < N; r++)
            finish(cl, ops[r], res);
    }
}

/* Run matched sends and receives between src and dst. */
void progress_p2p(Clique *cl, int src, int dst) {
    std::deque<Op *> &sq = cl->sends[(size_t)src][(size_t)dst], &rq = cl->recvs[(size_t)dst][(size_t)src];
    while (!sq.empty() && !rq.empty()) {
        Op *s = sq.front(), *r = rq.front();
        sq.pop_front();
        rq.pop_front();
        ncclResult_t res = ncclSuccess;
        if (s->dt != r->dt || s->count != r->count) {
            note("rank %d's ncclSend(count %zu, datatype %d) to rank %d meets ncclRecv(count %zu, datatype %d); "
                 "real NCCL would hang or corrupt memory",
                 src, s->count, (int)s->dt, dst, r->count, (int)r->dt);
            res = ncclInvalidUsage;
        } else if (s->count) {
            memmove(r->rbuf, s->sbuf, s->count * dt_size(s->dt));
        }
        finish(cl, s, res);
        finish(cl, r, res);
    }
}

/* Ranks an unfinished operation waits for (its own included: another thread
 * may abort it). */
bool peers_gone(const Clique *cl, const Op *o) {
    if (o->kind == OP_SEND || o->kind == OP_RECV)
        return o->comm->state != LIVE || cl->comms[(size_t)o->peer].state != LIVE;
    for (int r = 0; r < cl->n; r++)
        if (cl->comms[(size_t)r].state != LIVE) return true;
    return false;
}

/* Post a group's operations, run what matches, wait for the rest. A replay
 * (of a captured group) cannot return its error to anyone: it goes to the
 * comm's async error, as a failed NCCL kernel's does. */
/* Wait on cl->cv (cl->mu held) at most ms milliseconds. */
int timed_wait(Clique *cl, long ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += ms * 1000000L;
    t.tv_sec += t.tv_nsec / 1000000000L;
    t.tv_nsec %= 1000000000L;
    return pthread_cond_timedwait(&cl->cv, &cl->mu, &t);
}

ncclResult_t run_group(std::vector<Op *> &ops, bool replay) {
    ncclResult_t rc = ncclSuccess;
    std::vector<Clique *> cls = cliques_of(ops);
    for (Clique *cl : cls)
        ref(cl);
    for (Op *o : ops) {
        Clique *cl = o->comm->cl;
        pthread_mutex_lock(&cl->mu);
        /* A replay runs when its stream does, which may be after the comm
         * ended: the launch was checked (at_launch in record()), and a
         * launched NCCL kernel sees the abort flag and gives up. */
        if (!replay) check_live(o->comm, kind_name[o->kind]);
        int me = o->comm->rank;
        if (cl->aborted || o->comm->state != LIVE) {
            finish(cl, o, ncclRemoteError);
        } else if (o->kind == OP_SEND) {
            cl->sends[(size_t)me][(size_t)o->peer].push_back(o);
            progress_p2p(cl, me, o->peer);
        } else if (o->kind == OP_RECV) {
            cl->recvs[(size_t)me][(size_t)o->peer].push_back(o);
            progress_p2p(cl, o->peer, me);
        } else {
            cl->coll[(size_t)me].push_back(o);
            progress_coll(cl);
        }
        pthread_cond_broadcast(&cl->cv);
        pthread_mutex_unlock(&cl->mu);
    }
    for (Op *o : ops) {
        Clique *cl = o->comm->cl;
        pthread_mutex_lock(&cl->mu);
        while (!o->done && !cl->aborted && !peers_gone(cl, o)) {
            /* A peer's part may sit in a stream queue that nobody runs
             * (one thread driving several ranks' streams, a rank busy
             * elsewhere); a GPU would run it, so after a while run it. */
            if (timed_wait(cl, 50) == ETIMEDOUT) {
                pthread_mutex_unlock(&cl->mu);
                emu::progress();
                pthread_mutex_lock(&cl->mu);
            }
        }
        if (!o->done) {
            /* Aborted, or a peer destroyed its comm: unpost, fail. */
            std::deque<Op *> *q = o->kind == OP_SEND   ? &cl->sends[(size_t)o->comm->rank][(size_t)o->peer]
                                  : o->kind == OP_RECV ? &cl->recvs[(size_t)o->comm->rank][(size_t)o->peer]
                                                       : &cl->coll[(size_t)o->comm->rank];
            for (auto it = q->begin(); it != q->end(); ++it)
                if (*it == o) {
                    q->erase(it);
                    break;
                }
            finish(cl, o, ncclRemoteError);
        }
        /* A comm aborted while its thread waited is not LIVE: leave it alone. */
        if (o->comm->state == LIVE) {
            if (o->result == ncclRemoteError)
                o->comm->async_err = ncclRemoteError;
            else if (replay && o->result != ncclSuccess && o->comm->async_err == ncclSuccess)
                o->comm->async_err = o->result;
        }
        if (o->result != ncclSuccess && rc == ncclSuccess) rc = o->result;
        pthread_mutex_unlock(&cl->mu);
    }
    if (rc == ncclRemoteError) snprintf(g_last, sizeof g_last, "a peer's communicator was aborted or destroyed");
    for (Op *o : ops)
        delete o;
    ops.clear();
    for (Clique *cl : cls)
        unref(cl);
    return rc;
}

void drop(std::vector<Op *> &ops) {
    for (Op *o : ops)
        delete o;
    ops.clear();
}

/* A captured group's hold on its cliques, shared by the copies of its graph
 * node (cudaGraphInstantiate copies them); released with the last one. */
struct Pin {
    std::vector<Clique *> cls;
    Pin() = default;
    Pin(const Pin &) = delete;
    Pin &operator=(const Pin &) = delete;
    ~Pin() {
        for (Clique *cl : cls) {
            pthread_mutex_lock(&cl->mu);
            cl->graphs--;
            pthread_cond_broadcast(&cl->cv); /* a last end may wait for this */
            pthread_mutex_unlock(&cl->mu);
            unref(cl);
        }
    }
};

/* Record the group as one node of s's capture: every replay posts the same
 * operations afresh and meets the peers' replays, as a captured NCCL kernel
 * communicates again at each launch. */
ncclResult_t record(std::vector<Op *> &ops, cudaStream_t s) {
    std::vector<Op> tmpl;
    auto pin = std::make_shared<Pin>();
    for (Op *o : ops) {
        Clique *cl = o->comm->cl;
        pthread_mutex_lock(&cl->mu);
        check_live(o->comm, kind_name[o->kind]);
        bool seen = false;
        for (Clique *c : pin->cls)
            seen |= c == cl;
        if (!seen) {
            cl->refs++;
            cl->graphs++;
            pin->cls.push_back(cl);
        }
        pthread_mutex_unlock(&cl->mu);
        tmpl.push_back(*o);
    }
    const char *first = kind_name[ops[0]->kind];
    drop(ops);
    auto at_launch = [tmpl]() {
        for (const Op &t : tmpl) {
            Clique *cl = t.comm->cl;
            char what[80];
            snprintf(what, sizeof what, "%s replayed by cudaGraphLaunch", kind_name[t.kind]);
            pthread_mutex_lock(&cl->mu);
            check_live(t.comm, what);
            pthread_mutex_unlock(&cl->mu);
        }
    };
    cudaError_t e = emu::enqueue_checked(
        s,
        [tmpl, pin]() {
            std::vector<Op *> fresh;
            for (const Op &t : tmpl)
                fresh.push_back(new Op(t));
            (void)run_group(fresh, true);
        },
        at_launch);
    if (e != cudaSuccess) {
        note("%s: recording into the capture failed: %s", first, cudaGetErrorName(e));
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

/* Run a group now, or record it when its stream captures (decided here, at
 * group end, where real NCCL enqueues its kernels). */
ncclResult_t submit(std::vector<Op *> &ops) {
    cudaStream_t cap = NULL;
    size_t ncap = 0;
    bool two = false;
    for (Op *o : ops) {
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        cudaError_t e = cudaStreamIsCapturing(o->stream, &st);
        if (e != cudaSuccess || st == cudaStreamCaptureStatusInvalidated) {
            note("%s: rank %d's stream: %s; real NCCL reports the CUDA error", kind_name[o->kind], o->comm->rank,
                 e != cudaSuccess ? cudaGetErrorName(e) : "its capture was invalidated");
            drop(ops);
            return ncclUnhandledCudaError;
        }
        if (st == cudaStreamCaptureStatusActive) {
            two |= ncap > 0 && o->stream != cap;
            cap = o->stream;
            ncap++;
        }
    }
    if (ncap == 0) {
        /* The operations run now (see "Asynchrony"): what their streams
         * computed before them must be done first. */
        for (Op *o : ops)
            emu::sync_stream(o->stream);
        return run_group(ops, false);
    }
    if (ncap != ops.size() || two) {
        note("ncclGroupEnd: a group mixes %s; real NCCL refuses it",
             two ? "two capturing streams" : "capturing and non-capturing streams");
        drop(ops);
        return ncclInvalidUsage;
    }
    return record(ops, cap);
}

ncclResult_t post(Op *o) {
    if (g_depth > 0) {
        g_ops->push_back(o);
        return ncclSuccess;
    }
    std::vector<Op *> one{o};
    return submit(one);
}

/* Argument checks of every operation; on failure nothing is posted and an
 * open group remembers the error for its ncclGroupEnd. */
ncclResult_t fail_arg(ncclResult_t r) {
    if (g_depth > 0 && g_group_err == ncclSuccess) g_group_err = r;
    return r;
}

ncclResult_t check_common(const char *call, ncclComm_t comm, ncclDataType_t dt) {
    if (!comm) {
        note("%s: comm is NULL", call);
        return fail_arg(ncclInvalidArgument);
    }
    pthread_mutex_lock(&comm->cl->mu);
    check_live(comm, call);
    pthread_mutex_unlock(&comm->cl->mu);
    if (dt_size(dt) == 0) {
        note("%s: invalid datatype %d", call, (int)dt);
        return fail_arg(ncclInvalidArgument);
    }
    return ncclSuccess;
}

/* A checked call's operation, to post. */
Op *make_op(OpKind kind, ncclComm_t comm, const void *sbuf, void *rbuf, size_t count, ncclDataType_t dt,
            cudaStream_t stream) {
    Op *o = new Op();
    o->kind = kind;
    o->comm = comm;
    o->sbuf = sbuf;
    o->rbuf = rbuf;
    o->count = count;
    o->dt = dt;
    o->stream = stream;
    return o;
}

ncclResult_t p2p(OpKind kind, const void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                 cudaStream_t stream) {
    const char *call = kind_name[kind];
    ncclResult_t r = check_common(call, comm, dt);
    if (r != ncclSuccess) return r;
    if (peer < 0 || peer >= comm->cl->n) {
        note("%s: peer %d is outside the communicator's [0, %d)", call, peer, comm->cl->n);
        return fail_arg(ncclInvalidArgument);
    }
    if (count && !buf) {
        note("%s: %s is NULL for %zu elements", call, kind == OP_SEND ? "sendbuff" : "recvbuff", count);
        return fail_arg(ncclInvalidArgument);
    }
    Op *o = make_op(kind, comm, kind == OP_SEND ? buf : NULL, kind == OP_SEND ? NULL : (void *)buf, count, dt, stream);
    o->peer = peer;
    return post(o);
}

} // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return g_last;
}

/* Test hook: after `after` more ncclCommInitAll calls succeed, the next
 * one fails (ncclSystemError); < 0 disarms. Also armed by
 * ECHO_EMU_FAIL_COMM_INIT=AFTER, read at the first call. */
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_init_left = -1, g_init_env_read;

void echo_emu_fail_comm_init(int after) {
    pthread_mutex_lock(&g_init_mu);
    g_init_left = after;
    g_init_env_read = 1;
    pthread_mutex_unlock(&g_init_mu);
}

static bool init_fails(void) {
    pthread_mutex_lock(&g_init_mu);
    if (!g_init_env_read) {
        const char *v = getenv("ECHO_EMU_FAIL_COMM_INIT");
        if (v && *v) g_init_left = atoi(v);
        g_init_env_read = 1;
    }
    bool fail = g_init_left == 0;
    if (g_init_left >= 0) g_init_left--;
    pthread_mutex_unlock(&g_init_mu);
    return fail;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    if (init_fails()) {
        note("ncclCommInitAll: made to fail by the test hook (echo_emu_fail_comm_init)");
        return ncclSystemError;
    }
    if (!comms) {
        note("ncclCommInitAll: comms is NULL");
        return ncclInvalidArgument;
    }
    if (ndev < 1) {
        note("ncclCommInitAll: invalid device count %d", ndev);
        return ncclInvalidArgument;
    }
    int ndevices = 0;
    if (cudaGetDeviceCount(&ndevices) != cudaSuccess) return ncclUnhandledCudaError;
    for (int r = 0; r < ndev; r++) {
        int d = devlist ? devlist[r] : r;
        if (d < 0 || d >= ndevices) {
            note("ncclCommInitAll: rank %d: CUDA device %d does not exist (%d devices)", r, d, ndevices);
            return ncclInvalidArgument;
        }
        for (int q = 0; q < r; q++)
            if ((devlist ? devlist[q] : q) == d) {
                note("ncclCommInitAll: duplicate GPU detected: rank %d and rank %d both on CUDA device %d", q, r, d);
                return ncclInvalidUsage;
            }
    }
    Clique *cl = new Clique();
    pthread_mutex_init(&cl->mu, NULL);
    pthread_cond_init(&cl->cv, NULL);
    cl->n = ndev;
    cl->live = ndev;
    cl->refs = 0;
    cl->graphs = 0;
    cl->aborted = false;
    cl->comms.resize((size_t)ndev);
    cl->coll.resize((size_t)ndev);
    cl->sends.assign((size_t)ndev, std::vector<std::deque<Op *>>((size_t)ndev));
    cl->recvs.assign((size_t)ndev, std::vector<std::deque<Op *>>((size_t)ndev));
    for (int r = 0; r < ndev; r++) {
        ncclComm &c = cl->comms[(size_t)r];
        c.cl = cl;
        c.rank = r;
        c.dev = devlist ? devlist[r] : r;
        c.state = LIVE;
        c.async_err = ncclSuccess;
        comms[r] = &c;
    }
    return ncclSuccess;
}

/* Destroy and Abort both end the comm. The clique's last end first waits
 * for the graphs that captured its operations (see the header comment);
 * then the clique goes unless a thread still waits in it (unref frees it
 * then). */
static ncclResult_t end_comm(ncclComm_t comm, CommState how) {
    if (!comm) return ncclInvalidArgument;
    Clique *cl = comm->cl;
    const char *call = how == DESTROYED ? "ncclCommDestroy" : "ncclCommAbort";
    pthread_mutex_lock(&cl->mu);
    check_live(comm, call);
    comm->state = how;
    if (how == ABORTED) cl->aborted = true;
    pthread_cond_broadcast(&cl->cv);
    if (--cl->live == 0 && cl->graphs > 0) {
        const char *env = getenv("ECHO_EMU_NCCL_GRAPH_WAIT_S");
        long limit = env && atol(env) > 0 ? atol(env) : 120;
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        cl->refs++; /* the clique must outlive this wait */
        for (now = t0; cl->graphs > 0 && now.tv_sec - t0.tv_sec < limit; clock_gettime(CLOCK_MONOTONIC, &now)) {
            /* launches still queued hold their graphs: a GPU runs them */
            pthread_mutex_unlock(&cl->mu);
            emu::progress();
            pthread_mutex_lock(&cl->mu);
            if (cl->graphs > 0) timed_wait(cl, 50);
        }
        if (cl->graphs > 0) {
            fprintf(stderr,
                    "nccl_emu: %s of rank %d's comm, the last of its clique, has waited %ld s for the CUDA graphs "
                    "holding %d captured operation group(s) of the clique to be destroyed; real NCCL (>= 2.26) "
                    "waits forever\n",
                    call, comm->rank, limit, cl->graphs);
            abort();
        }
        cl->refs--;
    }
    bool last = cl->live == 0 && cl->refs == 0;
    pthread_mutex_unlock(&cl->mu);
    if (last) free_clique(cl);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    return end_comm(comm, DESTROYED);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    return end_comm(comm, ABORTED);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!comm || !asyncError) return ncclInvalidArgument;
    Clique *cl = comm->cl;
    pthread_mutex_lock(&cl->mu);
    check_live(comm, "ncclCommGetAsyncError");
    /* A peer's abort reaches every comm of the clique, waiting or not. */
    if (cl->aborted) comm->async_err = ncclRemoteError;
    *asyncError = comm->async_err;
    pthread_mutex_unlock(&cl->mu);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count) return ncclInvalidArgument;
    *count = comm->cl->n;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    if (!comm || !device) return ncclInvalidArgument;
    *device = comm->dev;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    if (g_depth++ == 0) {
        g_group_err = ncclSuccess;
        g_ops = new std::vector<Op *>();
    }
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (g_depth <= 0) {
        note("ncclGroupEnd: not in a group (no matching ncclGroupStart)");
        return ncclInvalidUsage;
    }
    if (--g_depth > 0) return ncclSuccess;
    std::vector<Op *> *ops = g_ops;
    g_ops = NULL;
    ncclResult_t r = g_group_err;
    if (r != ncclSuccess) {
        /* An operation of the group was refused: like NCCL, nothing of it runs. */
        for (Op *o : *ops)
            delete o;
    } else {
        r = submit(*ops);
    }
    delete ops;
    return r;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return p2p(OP_SEND, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return p2p(OP_RECV, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = check_common("ncclAllGather", comm, datatype);
    if (r != ncclSuccess) return r;
    size_t esz = dt_size(datatype), in = sendcount * esz, out = in * (size_t)comm->cl->n;
    if (sendcount && (!sendbuff || !recvbuff)) {
        note("ncclAllGather: %s is NULL for %zu elements", sendbuff ? "recvbuff" : "sendbuff", sendcount);
        return fail_arg(ncclInvalidArgument);
    }
    /* In place means sendbuff == recvbuff + rank * sendcount; any other
     * overlap is undefined in NCCL. */
    if (overlap(sendbuff, in, recvbuff, out) &&
        (const char *)sendbuff != (const char *)recvbuff + (size_t)comm->rank * in) {
        note("ncclAllGather: rank %d: sendbuff overlaps recvbuff but is not recvbuff + rank * sendcount", comm->rank);
        return fail_arg(ncclInvalidUsage);
    }
    return post(make_op(OP_ALLGATHER, comm, sendbuff, recvbuff, sendcount, datatype, stream));
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = check_common("ncclAllReduce", comm, datatype);
    if (r != ncclSuccess) return r;
    if ((unsigned)op >= (unsigned)ncclNumOps) {
        note("ncclAllReduce: invalid reduction op %d", (int)op);
        return fail_arg(ncclInvalidArgument);
    }
    size_t bytes = count * dt_size(datatype);
    if (count && (!sendbuff || !recvbuff)) {
        note("ncclAllReduce: %s is NULL for %zu elements", sendbuff ? "recvbuff" : "sendbuff", count);
        return fail_arg(ncclInvalidArgument);
    }
    if (sendbuff != recvbuff && overlap(sendbuff, bytes, recvbuff, bytes)) {
        note("ncclAllReduce: rank %d: sendbuff and recvbuff overlap without being equal", comm->rank);
        return fail_arg(ncclInvalidUsage);
    }
    Op *o = make_op(OP_ALLREDUCE, comm, sendbuff, recvbuff, count, datatype, stream);
    o->redop = op;
    return post(o);
}

} // extern "C"
