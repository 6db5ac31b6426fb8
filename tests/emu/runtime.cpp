/*
 * tests/emu/runtime.cpp — the emulated CUDA runtime API: devices, memory,
 * streams (deferred), events, stream capture and graphs, launch checks,
 * errors. See include/cuda_runtime.h for the model.
 *
 * Streams are deferred, so that a missing synchronisation shows: work
 * enqueued on a created stream waits in the stream's queue until the host
 * needs it done (cudaStreamSynchronize/Query, cudaEventSynchronize/Query up
 * to the event's record, cudaDeviceSynchronize, the implicit device syncs of
 * cudaFree/cudaFreeHost, a stream that waits on an event, NCCL operations
 * posted on the stream), and then runs on the thread that needs it. So a
 * host that rewrites pinned memory before an asynchronous copy from it has
 * run sends the new bytes, a host that reads pinned memory an asynchronous
 * copy will write before synchronising reads garbage (the destination is
 * filled with 0xa5 bytes when the copy is enqueued), and a stream that reads
 * another stream's results without waiting on an event reads stale data.
 * Pageable host memory behaves as in CUDA: a host-to-device copy from it
 * reads the source during the call (CUDA stages it), a device-to-host copy
 * into it waits for the stream and completes during the call. The legacy
 * default stream (0) of each device is deferred the same way, with CUDA's
 * implicit synchronisation: its work waits for the device's blocking
 * streams and they wait for it, non-blocking streams (echo's) do not; so a
 * cudaMemset of device memory, asynchronous in CUDA, may not have run when
 * a non-blocking stream's kernel reads the memory. Synchronous cudaMemcpy
 * returns once the copy is done, except device to device (as in CUDA).
 *
 * Stream capture follows CUDA's rules as far as echo relies on them: work
 * enqueued on a capturing stream (kernels, memcpy, memset, event records,
 * cuBLASLt matmuls) is recorded with its arguments by value and runs at
 * cudaGraphLaunch, so a copy from pinned host memory reads that memory at
 * replay; a capture in global or thread-local mode is invalidated by a
 * potentially unsafe call from the capturing thread (synchronisation,
 * allocation, synchronous copies), which then fails with
 * cudaErrorStreamCaptureUnsupported, and cudaStreamEndCapture reports
 * cudaErrorStreamCaptureInvalidated.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <thread>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "emu_internal.h"

/* A captured operation: `run` at each replay; `at_launch` (may be empty)
 * during every cudaGraphLaunch call, for checks that belong to the launch
 * rather than to the deferred execution (NCCL: a launch on a dead comm). */
struct EmuNode {
    std::function<void()> run, at_launch;
};
struct CUgraph_st {
    std::vector<EmuNode> nodes;
};
struct CUgraphExec_st {
    /* shared with launches still queued on a stream: destroying the
     * executable while a launch is pending is allowed, as in CUDA */
    std::shared_ptr<const std::vector<EmuNode>> nodes;
};
struct CUstream_st {
    int device;
    unsigned flags;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    CUgraph_st *graph = nullptr;
    int fresh = 0; /* work enqueued since the last cudaStreamQuery: the next one says "not ready" once */
    /* The deferred work, under `mu`: the queue, how many operations were
     * enqueued and run, and whether a thread is running the queue now
     * (`running`; others wait on `idle`). Any thread that needs the work
     * done runs it. */
    std::mutex mu;
    std::condition_variable idle;
    std::deque<std::function<void()>> q;
    uint64_t enq = 0;  /* operations enqueued so far */
    uint64_t done = 0; /* operations run so far (a prefix of the queue) */
    bool running = false;
    std::thread::id runner;
    int pins = 0;    /* threads about to run the queue (under g_emu_mu): destroy waits for 0 */
    uint64_t id = 0; /* unique, so that an event's stale pointer is not taken for a new stream */
    bool legacy = false; /* a device's legacy default stream (stream 0) */
    CUstream_st(int d, unsigned f) : device(d), flags(f) {}
};
struct CUevent_st {
    unsigned flags;
    int recorded; /* 0 never, 1 recorded (maybe not run yet) */
    struct timespec t;
    int device; /* current at creation */
    /* the last record: its stream and position (run once stream->done >= seq);
     * stream NULL once it ran */
    CUstream_st *stream;
    uint64_t stream_id;
    uint64_t seq;
    std::atomic<bool> ran; /* the last record ran (set by the stream's runner) */
};

namespace emu {

/* Shared tables (all host threads): live allocations, pinned host
 * allocations, function attributes. */
static std::mutex g_emu_mu;
static std::map<uintptr_t, size_t> g_emu_dev_allocs, g_emu_host_allocs;
static std::map<std::pair<const void *, int>, int> g_emu_func_smem;

/* Per host thread, like CUDA: the current device, the last error, and the
 * captures this thread began (for the thread-local capture rules). */
static thread_local int tls_device;
static thread_local cudaError_t tls_last_error = cudaSuccess;
static thread_local std::vector<CUstream_st *> tls_captures;

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}
static int device_count() {
    int n = env_int("ECHO_EMU_DEVICES", 4);
    return n < 0 ? 0 : n;
}
static int sm_count() {
    int n = env_int("ECHO_EMU_SMS", 132);
    return n < 1 ? 1 : n;
}

static const size_t SMEM_DEFAULT = 48 * 1024;   /* without opt-in */
static const size_t SMEM_OPTIN = 227 * 1024;    /* sharedMemPerBlockOptin on sm_90 */
static const size_t SMEM_PER_SM = 228 * 1024;

static cudaError_t fail(cudaError_t e) {
    tls_last_error = e;
    return e;
}

/* A potentially unsafe call while this thread captures (not relaxed):
 * invalidate the captures and fail, as CUDA does. */
static cudaError_t capture_guard() {
    bool any = false;
    for (CUstream_st *s : tls_captures)
        if (s->mode != cudaStreamCaptureModeRelaxed) {
            s->capture = cudaStreamCaptureStatusInvalidated;
            any = true;
        }
    return any ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

/* Every live created stream (under g_emu_mu), for device-wide syncs. */
static std::set<CUstream_st *> g_emu_streams;
static std::condition_variable g_emu_unpinned; /* a stream's pins dropped */

/* Run s's queue until `upto` operations have run (or it is empty), on this
 * thread; `wait`: if another thread runs it now, wait for that one (else
 * return at once). An operation runs outside `mu`, so other threads may
 * enqueue meanwhile. */
static void run_queue(CUstream_st *s, uint64_t upto, bool wait) {
    std::unique_lock<std::mutex> lk(s->mu);
    if (s->running && !wait) return;
    if (s->running && s->runner == std::this_thread::get_id()) {
        fprintf(stderr, "emu: an operation of a stream waits for that stream's own later work\n");
        abort();
    }
    s->idle.wait(lk, [s] { return !s->running; });
    s->running = true;
    s->runner = std::this_thread::get_id();
    while (s->done < upto && !s->q.empty()) {
        std::function<void()> op = std::move(s->q.front());
        s->q.pop_front();
        lk.unlock();
        op();
        lk.lock();
        s->done++;
    }
    s->running = false;
    s->idle.notify_all();
}

static uint64_t g_emu_stream_ids; /* under g_emu_mu */

/* Run stream `id` (at s) until `upto` operations have run, if it is still
 * alive: a destroyed stream ran all its work (cudaStreamDestroy). */
static void run_until_live(CUstream_st *s, uint64_t id, uint64_t upto) {
    {
        std::lock_guard<std::mutex> lk(g_emu_mu);
        if (!g_emu_streams.count(s) || s->id != id) return;
        s->pins++;
    }
    run_queue(s, upto, true);
    std::lock_guard<std::mutex> lk(g_emu_mu);
    s->pins--;
    g_emu_unpinned.notify_all();
}

/* Run everything enqueued on s so far (`wait`: see run_queue). */
static void run_all(CUstream_st *s, bool wait = true) {
    uint64_t upto;
    {
        std::lock_guard<std::mutex> lk(s->mu);
        upto = s->enq;
    }
    run_queue(s, upto, wait);
}

/* Run the queues of the live streams of `device` (all devices if < 0; the
 * legacy streams included); `wait`: also queues another thread is running
 * (wait for it), else skip those. The streams are pinned meanwhile:
 * cudaStreamDestroy on another thread waits for their pins to go. */
static void run_streams(int device, bool wait) {
    std::vector<CUstream_st *> v;
    {
        std::lock_guard<std::mutex> lk(g_emu_mu);
        for (CUstream_st *s : g_emu_streams)
            if (device < 0 || s->device == device) {
                s->pins++;
                v.push_back(s);
            }
    }
    for (CUstream_st *s : v) {
        run_all(s, wait);
        std::lock_guard<std::mutex> lk(g_emu_mu);
        s->pins--;
        g_emu_unpinned.notify_all();
    }
}

static void run_device(int device) {
    run_streams(device, true);
}

/* The legacy default stream of `device`: created at first use, never
 * destroyed. Its work is deferred like any stream's, and CUDA's implicit
 * synchronisation applies to it: it waits for the device's blocking
 * streams, they wait for it; cudaStreamNonBlocking streams (echo's) do not,
 * so work on stream 0 (cudaMemset, a D2D cudaMemcpy, a launch without a
 * stream) may still be pending when such a stream's work runs. */
static CUstream_st *legacy_stream(int device) {
    static CUstream_st *legacy[64];
    std::lock_guard<std::mutex> lk(g_emu_mu);
    if (device < 0 || device >= 64) abort();
    if (!legacy[device]) {
        CUstream_st *s = new CUstream_st(device, cudaStreamDefault);
        s->legacy = true;
        s->id = ++g_emu_stream_ids;
        g_emu_streams.insert(s);
        legacy[device] = s;
    }
    return legacy[device];
}

/* Queue position to wait for: each blocking stream of the device other
 * than s (s legacy), or the legacy stream (s blocking, not legacy). */
struct WaitPoint {
    CUstream_st *s;
    uint64_t id, upto;
};
static std::vector<WaitPoint> implicit_waits(CUstream_st *s) {
    std::vector<WaitPoint> w;
    if (s->flags & cudaStreamNonBlocking) return w; /* a legacy stream not made yet has no work */
    std::lock_guard<std::mutex> lk(g_emu_mu);
    for (CUstream_st *o : g_emu_streams) {
        if (o == s || o->device != s->device || (o->flags & cudaStreamNonBlocking)) continue;
        if (!s->legacy && !o->legacy) continue; /* two blocking streams do not wait for each other */
        std::lock_guard<std::mutex> ok(o->mu);
        if (o->done < o->enq) w.push_back(WaitPoint{o, o->id, o->enq});
    }
    return w;
}

/* What a GPU does by itself: run every stream's pending work that no
 * thread is running now. For the emulator's own waits that real hardware
 * would end by making progress (NCCL's rendezvous, the last end of a
 * clique waiting for graph launches still queued). */
void progress(void) {
    run_streams(-1, false);
}

void sync_stream(cudaStream_t s) {
    run_all(s ? s : legacy_stream(tls_device));
}

static cudaError_t enqueue_node(cudaStream_t s, std::function<void()> op, std::function<void()> at_launch) {
    if (s) {
        if (s->capture == cudaStreamCaptureStatusInvalidated) return fail(cudaErrorStreamCaptureInvalidated);
        if (s->capture == cudaStreamCaptureStatusActive) {
            s->graph->nodes.push_back(EmuNode{std::move(op), std::move(at_launch)});
            return cudaSuccess;
        }
    } else if (!tls_captures.empty()) {
        /* the legacy default stream synchronises with capturing streams */
        for (CUstream_st *c : tls_captures)
            c->capture = cudaStreamCaptureStatusInvalidated;
        return fail(cudaErrorStreamCaptureImplicit);
    } else {
        s = legacy_stream(tls_device);
    }
    std::vector<WaitPoint> waits = implicit_waits(s);
    std::lock_guard<std::mutex> lk(s->mu);
    if (!waits.empty()) {
        s->q.push_back([waits]() {
            for (const WaitPoint &w : waits)
                run_until_live(w.s, w.id, w.upto);
        });
        s->enq++;
    }
    s->q.push_back(std::move(op));
    s->enq++;
    s->fresh = 1;
    return cudaSuccess;
}

cudaError_t enqueue(cudaStream_t s, std::function<void()> op) {
    return enqueue_node(s, std::move(op), nullptr);
}

cudaError_t enqueue_checked(cudaStream_t s, std::function<void()> op, std::function<void()> at_launch) {
    return enqueue_node(s, std::move(op), std::move(at_launch));
}

/* Does [p, p+n) lie inside one allocation of `allocs` (start -> size)? */
static bool in_allocation(const std::map<uintptr_t, size_t> &allocs, const void *p, size_t n) {
    std::lock_guard<std::mutex> lk(g_emu_mu);
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return false;
    --it;
    return a >= it->first && a + n <= it->first + it->second;
}

bool is_device_range(const void *p, size_t n) {
    return in_allocation(g_emu_dev_allocs, p, n);
}

/* Does [p, p+n) lie inside one live pinned host allocation? */
static bool is_pinned_range(const void *p, size_t n) {
    return in_allocation(g_emu_host_allocs, p, n);
}

/* The device an allocation was made on (under g_emu_mu), for cudaFree's
 * implicit synchronisation. */
static std::map<uintptr_t, int> g_emu_dev_alloc_device;

void launch(const LaunchCfg &c, std::function<void()> body) {
    const dim3 &g = c.grid, &b = c.block;
    unsigned long long nt = (unsigned long long)b.x * b.y * b.z;
    if (nt == 0 || nt > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 || g.x == 0 || g.y == 0 || g.z == 0 ||
        g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
        fail(cudaErrorInvalidConfiguration);
        return;
    }
    if (c.smem > SMEM_DEFAULT) {
        int allowed = (int)SMEM_DEFAULT;
        {
            std::lock_guard<std::mutex> lk(g_emu_mu);
            auto it = g_emu_func_smem.find({c.func, tls_device});
            if (c.func && it != g_emu_func_smem.end()) allowed = it->second;
        }
        if (c.smem > (size_t)allowed) {
            fail(cudaErrorInvalidValue); /* what CUDA reports for too much dynamic shared memory */
            return;
        }
    }
    if (c.stream && c.stream->device != tls_device) {
        /* CUDA: a kernel launch fails on a stream of another device than
         * the current one (copies and event waits do not) */
        fail(cudaErrorInvalidResourceHandle);
        return;
    }
    LaunchCfg cfg = c;
    cudaError_t e = enqueue(c.stream, [cfg, body]() { run_grid(cfg, body); });
    if (e != cudaSuccess) fail(e);
}

} // namespace emu

using namespace emu;

extern "C" {

cudaError_t cudaGetDeviceCount(int *n) {
    *n = device_count();
    if (*n == 0) return fail(cudaErrorNoDevice);
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    tls_device = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
    *d = tls_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "echo emulated H100 (%d SMs)", sm_count());
    p->totalGlobalMem = (size_t)80 << 30;
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = sm_count();
    p->maxThreadsPerMultiProcessor = 2048;
    p->sharedMemPerMultiprocessor = SMEM_PER_SM;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->l2CacheSize = 50 << 20;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)SMEM_DEFAULT; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMultiProcessorCount: *v = sm_count(); break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = 2048; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = (int)SMEM_PER_SM; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)SMEM_OPTIN; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    if (cudaError_t e = capture_guard()) return e;
    run_device(tls_device);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = tls_last_error;
    tls_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    return tls_last_error;
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define N(x)                                                                                                           \
    case x: return #x;
        N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation) N(cudaErrorInitializationError)
        N(cudaErrorInvalidConfiguration) N(cudaErrorInvalidPitchValue) N(cudaErrorInvalidDeviceFunction)
        N(cudaErrorNoDevice) N(cudaErrorInvalidDevice) N(cudaErrorInvalidResourceHandle) N(cudaErrorIllegalState) N(cudaErrorNotReady)
        N(cudaErrorIllegalAddress) N(cudaErrorLaunchOutOfResources) N(cudaErrorLaunchFailure)
        N(cudaErrorStreamCaptureUnsupported)
        N(cudaErrorStreamCaptureInvalidated) N(cudaErrorStreamCaptureMerge) N(cudaErrorStreamCaptureUnmatched)
        N(cudaErrorStreamCaptureUnjoined) N(cudaErrorStreamCaptureIsolation) N(cudaErrorStreamCaptureImplicit)
        N(cudaErrorCapturedEvent) N(cudaErrorStreamCaptureWrongThread) N(cudaErrorUnknown)
#undef N
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return "emulated CUDA error";
    }
}

cudaError_t cudaMalloc(void **p, size_t n) {
    *p = nullptr;
    if (cudaError_t e = capture_guard()) return e;
    void *q = nullptr;
    if (posix_memalign(&q, 256, n ? n : 1)) return fail(cudaErrorMemoryAllocation);
    memset(q, 0xa5, n); /* garbage, like fresh device memory */
    std::lock_guard<std::mutex> lk(g_emu_mu);
    g_emu_dev_allocs[(uintptr_t)q] = n ? n : 1;
    g_emu_dev_alloc_device[(uintptr_t)q] = tls_device;
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    if (cudaError_t e = capture_guard()) return e;
    int dev;
    {
        std::lock_guard<std::mutex> lk(g_emu_mu);
        auto it = g_emu_dev_alloc_device.find((uintptr_t)p);
        if (it == g_emu_dev_alloc_device.end()) return fail(cudaErrorInvalidValue);
        dev = it->second;
    }
    /* cudaFree synchronises: pending work on the allocation's device runs
     * first (it may still use the memory) */
    run_device(dev);
    {
        std::lock_guard<std::mutex> lk(g_emu_mu);
        if (!g_emu_dev_allocs.erase((uintptr_t)p)) return fail(cudaErrorInvalidValue);
        g_emu_dev_alloc_device.erase((uintptr_t)p);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n) {
    *p = nullptr;
    if (cudaError_t e = capture_guard()) return e;
    void *q = malloc(n ? n : 1);
    if (!q) return fail(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lk(g_emu_mu);
    g_emu_host_allocs[(uintptr_t)q] = n ? n : 1;
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    return cudaMallocHost(p, n);
}

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    if (cudaError_t e = capture_guard()) return e;
    run_device(tls_device); /* an implicit synchronisation, as in CUDA */
    {
        std::lock_guard<std::mutex> lk(g_emu_mu);
        if (!g_emu_host_allocs.erase((uintptr_t)p)) return fail(cudaErrorInvalidValue);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    size_t used = 0;
    {
        std::lock_guard<std::mutex> lk(g_emu_mu);
        for (auto &a : g_emu_dev_allocs)
            used += a.second;
    }
    *total_bytes = (size_t)80 << 30;
    *free_bytes = *total_bytes > used ? *total_bytes - used : 0;
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    if (n && !is_device_range(p, n)) return fail(cudaErrorInvalidValue);
    return enqueue(s, [p, v, n]() { memset(p, v, n); });
}

/* Asynchronous with respect to the host for device memory, as in CUDA: it
 * is queued on the legacy stream, which cudaStreamNonBlocking streams do
 * not wait for. */
cudaError_t cudaMemset(void *p, int v, size_t n) {
    if (cudaError_t e = capture_guard()) return e;
    return cudaMemsetAsync(p, v, n, nullptr);
}

/* The direction must match where the pointers live (cudaMemcpyDefault
 * accepts anything): a swapped kind is a bug CUDA would report or crash on. */
static cudaError_t check_kind(void *d, const void *s, size_t n, cudaMemcpyKind k) {
    if (n == 0 || k == cudaMemcpyDefault || k == cudaMemcpyHostToHost) return cudaSuccess;
    bool sd = is_device_range(s, n), dd = is_device_range(d, n);
    bool ok = k == cudaMemcpyHostToDevice ? (!sd && dd) : k == cudaMemcpyDeviceToHost ? (sd && !dd) : (sd && dd);
    return ok ? cudaSuccess : fail(cudaErrorInvalidValue);
}

/* Where a copy's host side lives decides when it happens (see the file
 * comment): 'p' pinned or device (deferred on the stream), 'h' pageable. */
static char host_side(const void *p, size_t n) {
    return is_device_range(p, n) || is_pinned_range(p, n) ? 'p' : 'h';
}

/* A copy of `rows` rows of `width` bytes, enqueued on st with CUDA's
 * timing for pageable memory: a pageable source is read now (CUDA stages
 * it before returning), a pageable destination is written before the call
 * returns (CUDA waits for the stream); a pinned destination is filled with
 * garbage now, as far as the host can tell until the stream runs the copy.
 * (That filling is early for a program whose same stream still has to read
 * the destination as the source of an earlier pending copy; echo's pinned
 * buffers are either copy sources or copy destinations, never both.)
 * `synchronous` (cudaMemcpy, cudaMemcpy2D): also return only once the copy
 * is done, unless it is device to device (CUDA's "API synchronization
 * behavior"). */
static cudaError_t copy_rows(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t rows,
                             cudaStream_t st, bool synchronous) {
    size_t dspan = dpitch * (rows - 1) + width, sspan = spitch * (rows - 1) + width;
    auto copy = [=](const char *src, size_t src_pitch) {
        for (size_t r = 0; r < rows; r++)
            memmove((char *)d + r * dpitch, src + r * src_pitch, width);
    };
    bool capturing = st ? st->capture != cudaStreamCaptureStatusNone : !tls_captures.empty();
    if (st && capturing && (host_side(d, dspan) == 'h' || host_side(s, sspan) == 'h')) {
        /* what CUDA does with pageable memory in a captured copy (refuse
         * it, or read it at capture time) is not modelled: stop here */
        fprintf(stderr, "emu: a copy to or from pageable host memory captured into a graph (not modelled; use "
                        "cudaMallocHost memory)\n");
        abort();
    }
    if (capturing) /* recorded, or refused by enqueue */
        return enqueue(st, [=]() { copy((const char *)s, spitch); });
    if (host_side(d, dspan) == 'h') {
        sync_stream(st);
        copy((const char *)s, spitch);
        return cudaSuccess;
    }
    cudaError_t e;
    if (host_side(s, sspan) == 'h') {
        auto staged = std::make_shared<std::vector<char>>(width * rows);
        for (size_t r = 0; r < rows; r++)
            memcpy(staged->data() + r * width, (const char *)s + r * spitch, width);
        e = enqueue(st, [=]() { copy(staged->data(), width); });
    } else {
        if (!is_device_range(d, dspan))
            for (size_t r = 0; r < rows; r++)
                memset((char *)d + r * dpitch, 0xa5, width);
        e = enqueue(st, [=]() { copy((const char *)s, spitch); });
    }
    if (e == cudaSuccess && synchronous && !(is_device_range(d, dspan) && is_device_range(s, sspan))) sync_stream(st);
    return e;
}

static cudaError_t copy_1d(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st, bool synchronous) {
    if (cudaError_t e = check_kind(d, s, n, k)) return e;
    if (n == 0) return cudaSuccess;
    return copy_rows(d, n, s, n, n, 1, st, synchronous);
}

static cudaError_t copy_2d(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                           cudaMemcpyKind k, cudaStream_t st, bool synchronous) {
    if (width > dpitch || width > spitch) return fail(cudaErrorInvalidPitchValue);
    if (height == 0 || width == 0) return cudaSuccess;
    if (cudaError_t e = check_kind(d, s, dpitch * (height - 1) + width, k)) {
        /* check_kind looks at the whole span; the source may be the shorter one */
        (void)e;
        tls_last_error = cudaSuccess;
        if (check_kind(d, s, 1, k)) return fail(cudaErrorInvalidValue);
    }
    return copy_rows(d, dpitch, s, spitch, width, height, st, synchronous);
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st) {
    return copy_1d(d, s, n, k, st, false);
}

/* The synchronous copies run on the legacy stream (see copy_rows). */
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k) {
    if (cudaError_t e = capture_guard()) return e;
    return copy_1d(d, s, n, k, nullptr, true);
}

cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind k, cudaStream_t st) {
    return copy_2d(d, dpitch, s, spitch, width, height, k, st, false);
}

cudaError_t cudaMemcpy2D(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind k) {
    if (cudaError_t e = capture_guard()) return e;
    return copy_2d(d, dpitch, s, spitch, width, height, k, nullptr, true);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    *s = new CUstream_st(tls_device, flags);
    std::lock_guard<std::mutex> lk(g_emu_mu);
    (*s)->id = ++g_emu_stream_ids;
    g_emu_streams.insert(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return fail(cudaErrorInvalidResourceHandle);
    for (size_t i = 0; i < tls_captures.size(); i++)
        if (tls_captures[i] == s) tls_captures.erase(tls_captures.begin() + (long)i);
    /* CUDA lets the stream's pending work finish after the call */
    run_all(s);
    {
        std::unique_lock<std::mutex> lk(g_emu_mu);
        g_emu_streams.erase(s);
        g_emu_unpinned.wait(lk, [s] { return s->pins == 0; });
    }
    delete s->graph;
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (s && s->capture != cudaStreamCaptureStatusNone) {
        s->capture = cudaStreamCaptureStatusInvalidated;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (cudaError_t e = capture_guard()) return e;
    sync_stream(s);
    return cudaSuccess;
}

/* A query runs the queue (a poller must see progress), but the first one
 * after new work answers cudaErrorNotReady, as a busy stream does, which
 * CUDA also records as the thread's last error (a poller must clear it, or
 * the next launch check reports it). */
cudaError_t cudaStreamQuery(cudaStream_t s) {
    cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess || !s) return e;
    {
        std::lock_guard<std::mutex> lk(s->mu);
        if (!s->fresh) return cudaSuccess;
        s->fresh = 0;
    }
    return fail(cudaErrorNotReady);
}

/* Work enqueued on s after this call waits for the event's last record
 * (as of this call): when s's queue gets there, the recording stream runs
 * up to the record. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)flags;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    CUstream_st *src = e->stream;
    uint64_t id = e->stream_id, seq = e->seq;
    if (!src || src == s) return cudaSuccess; /* nothing pending, or in order anyway */
    return enqueue(s, [src, id, seq]() { run_until_live(src, id, seq); });
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    if (!s) return fail(cudaErrorStreamCaptureUnsupported); /* the legacy stream cannot capture */
    if (s->capture != cudaStreamCaptureStatusNone) return fail(cudaErrorIllegalState);
    s->capture = cudaStreamCaptureStatusActive;
    s->mode = mode;
    s->graph = new CUgraph_st;
    tls_captures.push_back(s);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    *g = nullptr;
    if (!s || s->capture == cudaStreamCaptureStatusNone) return fail(cudaErrorIllegalState);
    bool mine = false;
    for (size_t i = 0; i < tls_captures.size(); i++)
        if (tls_captures[i] == s) {
            tls_captures.erase(tls_captures.begin() + (long)i);
            mine = true;
            break;
        }
    if (!mine && s->mode != cudaStreamCaptureModeRelaxed) return fail(cudaErrorStreamCaptureWrongThread);
    cudaStreamCaptureStatus st = s->capture;
    s->capture = cudaStreamCaptureStatusNone;
    if (st == cudaStreamCaptureStatusInvalidated) {
        delete s->graph;
        s->graph = nullptr;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *g = s->graph;
    s->graph = nullptr;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
    *status = s ? s->capture : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

/* Failures armed by the test hooks below (under g_emu_mu): the device
 * whose calls count down, and how many pass before one fails. */
struct Armed {
    int dev = -1, left = 0;
};
static Armed g_fail_launch, g_fail_inst;

/* Programs that cannot call the hooks (echo-serve) arm them from the
 * environment: ECHO_EMU_FAIL_GRAPH_LAUNCH / ECHO_EMU_FAIL_GRAPH_INSTANTIATE
 * = DEVICE:AFTER, read at the first graph launch or instantiation. */
static void arm_from_env(Armed &a, const char *name) {
    const char *v = getenv(name);
    int dev, after;
    if (v && sscanf(v, "%d:%d", &dev, &after) == 2) a = Armed{dev, after};
}

/* Whether this call on `dev` is the one an armed hook makes fail. */
static bool fires(Armed &a, int dev) {
    static std::once_flag env_once;
    std::call_once(env_once, [] {
        std::lock_guard<std::mutex> lk(g_emu_mu);
        arm_from_env(g_fail_launch, "ECHO_EMU_FAIL_GRAPH_LAUNCH");
        arm_from_env(g_fail_inst, "ECHO_EMU_FAIL_GRAPH_INSTANTIATE");
    });
    std::lock_guard<std::mutex> lk(g_emu_mu);
    if (dev != a.dev || a.left-- > 0) return false;
    a.dev = -1;
    return true;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags) {
    (void)flags;
    if (!g) return fail(cudaErrorInvalidValue);
    if (fires(g_fail_inst, tls_device)) return fail(cudaErrorLaunchOutOfResources);
    *exec = new CUgraphExec_st{std::make_shared<const std::vector<EmuNode>>(g->nodes)};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec) return fail(cudaErrorInvalidResourceHandle);
    if (fires(g_fail_launch, s ? s->device : tls_device)) return fail(cudaErrorLaunchFailure);
    std::shared_ptr<const std::vector<EmuNode>> nodes = exec->nodes;
    for (const EmuNode &n : *nodes)
        if (n.at_launch) n.at_launch();
    return enqueue(s, [nodes]() {
        for (const EmuNode &n : *nodes)
            n.run();
    });
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

/* Run the event's stream up to its last record. */
static void run_to_event(cudaEvent_t e) {
    if (e->stream) run_until_live(e->stream, e->stream_id, e->seq);
    e->stream = nullptr;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = new CUevent_st{flags, 0, {0, 0}, tls_device, nullptr, 0, 0, false};
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    run_to_event(e); /* a pending record still writes the event: let it run first */
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    /* CUDA: recording fails when the event and the stream belong to
     * different devices */
    if (e->device != (s ? s->device : tls_device)) return fail(cudaErrorInvalidResourceHandle);
    bool capturing = s && s->capture != cudaStreamCaptureStatusNone;
    if (!capturing) e->ran = false;
    cudaError_t r = enqueue(s, [e]() {
        e->ran = true;
        clock_gettime(CLOCK_MONOTONIC, &e->t);
    });
    if (r != cudaSuccess || capturing) return r;
    e->recorded = 1;
    CUstream_st *q = s ? s : legacy_stream(tls_device);
    std::lock_guard<std::mutex> lk(q->mu);
    if (q->done < q->enq) { /* still pending: remember where */
        e->stream = q;
        e->stream_id = q->id;
        e->seq = q->enq;
    } else {
        e->stream = nullptr;
    }
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t r = capture_guard()) return r;
    run_to_event(e);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t r = capture_guard()) return r;
    run_to_event(e);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a || !b) return fail(cudaErrorInvalidResourceHandle);
    if ((a->flags | b->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
    if (!a->ran || !b->ran) return fail(cudaErrorNotReady); /* not synchronised yet */
    *ms = (float)((double)(b->t.tv_sec - a->t.tv_sec) * 1e3 + (double)(b->t.tv_nsec - a->t.tv_nsec) * 1e-6);
    return cudaSuccess;
}

cudaError_t emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value) {
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t)value > SMEM_OPTIN)
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_emu_mu);
    g_emu_func_smem[{func, tls_device}] = value;
    return cudaSuccess;
}

cudaError_t emu_func_get_attributes(struct cudaFuncAttributes *a, const void *func) {
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    memset(a, 0, sizeof *a);
    a->maxThreadsPerBlock = 1024;
    a->numRegs = 32;
    a->ptxVersion = 90;
    a->binaryVersion = 90;
    std::lock_guard<std::mutex> lk(g_emu_mu);
    auto it = g_emu_func_smem.find({func, tls_device});
    a->maxDynamicSharedSizeBytes = it != g_emu_func_smem.end() ? it->second : (int)SMEM_DEFAULT;
    return cudaSuccess;
}

/* Test hooks, for a failure on one rank only: after `after` more graph
 * launches on a stream of `device` (instantiations by a thread whose
 * current device is `device`) pass, the next one fails with
 * cudaErrorLaunchFailure (cudaErrorLaunchOutOfResources) and does nothing;
 * device < 0 disarms. Tests that must also build against real CUDA declare
 * them weak and skip when they are absent. */
void echo_emu_fail_graph_launch(int device, int after) {
    std::lock_guard<std::mutex> lk(g_emu_mu);
    g_fail_launch = Armed{device, after};
}
void echo_emu_fail_graph_instantiate(int device, int after) {
    std::lock_guard<std::mutex> lk(g_emu_mu);
    g_fail_inst = Armed{device, after};
}

cudaError_t emu_occupancy(int *blocks, const void *func, int threads, size_t dyn_smem) {
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    if (threads <= 0 || threads > 1024) return fail(cudaErrorInvalidValue);
    int warps = (threads + 31) / 32;
    int n = 64 / warps; /* 64 resident warps per SM */
    if (n > 32) n = 32;
    if (dyn_smem) {
        int by_smem = (int)(SMEM_PER_SM / (dyn_smem + 1024));
        if (by_smem < n) n = by_smem;
    }
    *blocks = n;
    return cudaSuccess;
}

} /* extern "C" */
