/*
 * tests/emu/selftest.cpp — checks of the emulator itself (run first by make
 * test-emu): the CUDA semantics the kernels rely on, and that misuse aborts
 * or fails the way it does on a GPU. Death cases run in a forked child.
 * Kernels here use the emulator's launch form directly (what translate.py
 * writes for `k<<<g, b, smem, s>>>(args)`).
 */
#include <cublasLt.h>
#include <fcntl.h>
#include <math.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LAUNCH(k, ...) (emu::Launcher(__FILE__, __LINE__, #k, (const void *)&k, __VA_ARGS__)->*[](auto... a) { k(a...); })

static int g_fail, g_n;
static void check(int ok, const char *what) {
    g_n++;
    if (!ok) g_fail++;
    printf("selftest %-60s %s\n", what, ok ? "PASS" : "FAIL");
}

/* in selftest_translated.cu (translated): a kernel with __launch_bounds__(64);
 * kernels with static __shared__ variables */
void selftest_launch_bounded(int *out, unsigned threads);
void selftest_launch_shared(unsigned *out, unsigned blocks);
void selftest_launch_shared_overrun(int *out);

/* translate.py (run from the repository root, as make test-emu does) on a
 * small source: its exit status, its message in msg */
static int translate(const char *src, char *msg, size_t cap) {
    char in[] = "/tmp/emu-selftest-XXXXXX.cu";
    int fd = mkstemps(in, 3);
    if (fd < 0) return -1;
    if (write(fd, src, strlen(src)) != (ssize_t)strlen(src)) {
        close(fd);
        return -1;
    }
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "python3 tests/emu/translate.py %s %s.cpp 2>&1", in, in);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(msg, 1, cap - 1, p) : 0;
    msg[n] = 0;
    int st = p ? pclose(p) : -1;
    unlink(in);
    snprintf(cmd, sizeof cmd, "%s.cpp", in);
    unlink(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- kernels ---- */
__global__ void k_shfl(unsigned *out) {
    unsigned l = threadIdx.x;
    out[l] = __shfl_xor_sync(0xffffffffu, l * 10, 1);                  /* pairwise swap */
    out[32 + l] = __shfl_down_sync(0xffffffffu, l, 4);                 /* past the end: own */
    out[64 + l] = __shfl_sync(0xffffffffu, l, 3, 8);                   /* lane 3 of each 8 */
    out[96 + l] = __ballot_sync(0xffffffffu, l % 3 == 0);
    out[128 + l] = __match_any_sync(0xffffffffu, l / 8);
    unsigned m = 0xffu << (l & ~7u); /* groups of 8, each its own mask */
    out[160 + l] = __shfl_xor_sync(m, l, 2);
}
__global__ void k_block(int *out) {
    __shared__ int s[256];
    s[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    out[blockIdx.x * 256 + threadIdx.x] = s[255 - threadIdx.x] + __syncthreads_or(threadIdx.x == 77) * 1000 +
                                          __syncthreads_count(threadIdx.x < 10) * 100000;
}
__global__ void k_dyn(float *out) {
    float *d = (float *)emu::dyn_smem();
    d[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = d[(threadIdx.x + 1) % blockDim.x];
}
__global__ void k_diverge(void) {
    if (threadIdx.x < 32)
        __syncthreads();
    else
        __syncthreads();
}
__global__ void k_partial(unsigned *out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, threadIdx.x, 1);
}
__global__ void k_exit_early(void) {
    if (threadIdx.x == 5) return;
    __syncthreads();
}
__global__ void k_add(float *p, float v) {
    p[threadIdx.x] += v;
}
__global__ void k_wmma(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *c) {
    namespace w = nvcuda::wmma;
    w::fragment<w::matrix_a, 16, 16, 16, __nv_bfloat16, w::row_major> fa;
    w::fragment<w::matrix_b, 16, 16, 16, __nv_bfloat16, w::col_major> fb;
    w::fragment<w::accumulator, 16, 16, 16, float> fc;
    w::fill_fragment(fc, 1.0f);
    w::load_matrix_sync(fa, a, 16);
    w::load_matrix_sync(fb, b, 16);
    w::mma_sync(fc, fa, fb, fc);
    w::store_matrix_sync(c, fc, 16, w::mem_row_major);
}

/* ---- NCCL under stream capture: two ranks, one host thread each ---- */
#define NN 64
static float val(int rank, int round, int i) {
    return round == 0 ? (float)((rank + 1) * (i + 1)) : (float)((rank + 1) * 100 + i);
}
struct Rank {
    int r, p2p;
    ncclComm_t comm;
    float *send, *recv;
    pthread_barrier_t *bar;
    int ok_capture, ok_replay[2];
};
static void fill(float *dev, int rank, int round) {
    float h[NN];
    for (int i = 0; i < NN; i++)
        h[i] = rank < 0 ? -7.0f : val(rank, round, i);
    cudaMemcpy(dev, h, sizeof h, cudaMemcpyHostToDevice);
}
/* Capture [all-reduce | send+recv to the peer] then +0.5, replay twice with
 * new inputs in between: the second replay must communicate again. */
static void *rank_main(void *arg) {
    Rank *k = (Rank *)arg;
    cudaSetDevice(k->r);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    fill(k->send, k->r, 0);
    fill(k->recv, -1, 0);
    int ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    ok &= cudaMemsetAsync(k->recv, 0, NN * sizeof(float), s) == cudaSuccess;
    if (k->p2p) {
        ok &= ncclGroupStart() == ncclSuccess;
        ok &= ncclSend(k->send, NN, ncclFloat32, 1 - k->r, k->comm, s) == ncclSuccess;
        ok &= ncclRecv(k->recv, NN, ncclFloat32, 1 - k->r, k->comm, s) == ncclSuccess;
        ok &= ncclGroupEnd() == ncclSuccess;
    } else {
        ok &= ncclAllReduce(k->send, k->recv, NN, ncclFloat32, ncclSum, k->comm, s) == ncclSuccess;
    }
    LAUNCH(k_add, 1, NN, 0, s)(k->recv, 0.5f);
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    ok &= cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&x, g, 0) == cudaSuccess;
    pthread_barrier_wait(k->bar);
    for (int i = 0; i < NN; i++) /* nothing ran or met at capture time */
        ok &= k->recv[i] == -7.0f && k->send[i] == val(k->r, 0, i);
    k->ok_capture = ok;
    pthread_barrier_wait(k->bar);
    for (int round = 0; round < 2; round++) {
        if (round) fill(k->send, k->r, round);
        ok = x && cudaGraphLaunch(x, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
        for (int i = 0; i < NN; i++) {
            float want = k->p2p ? val(1 - k->r, round, i) : val(0, round, i) + val(1, round, i);
            ok &= k->recv[i] == want + 0.5f;
        }
        k->ok_replay[round] = ok;
    }
    ncclResult_t ae = ncclInternalError;
    k->ok_replay[1] &= ncclCommGetAsyncError(k->comm, &ae) == ncclSuccess && ae == ncclSuccess;
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    return NULL;
}
static int two_ranks(int p2p) {
    ncclComm_t c[2];
    int devs[2] = {0, 1};
    if (ncclCommInitAll(c, 2, devs) != ncclSuccess) return 0;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    Rank k[2];
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        k[r] = Rank{r, p2p, c[r], NULL, NULL, &bar, 0, {0, 0}};
        cudaMalloc(&k[r].send, NN * sizeof(float));
        cudaMalloc(&k[r].recv, NN * sizeof(float));
    }
    for (int r = 0; r < 2; r++)
        pthread_create(&t[r], NULL, rank_main, &k[r]);
    int ok = 1;
    for (int r = 0; r < 2; r++) {
        pthread_join(t[r], NULL);
        ok &= k[r].ok_capture * 1 + k[r].ok_replay[0] * 2 + k[r].ok_replay[1] * 4 == 7;
        cudaFree(k[r].send);
        cudaFree(k[r].recv);
        ncclCommDestroy(c[r]);
    }
    pthread_barrier_destroy(&bar);
    return ok;
}

/* Rank 0 waits in an all-reduce (eager, or replayed from a graph) that rank
 * 1 never posts; the main thread aborts both comms under it. */
struct Waiter {
    ncclComm_t comm;
    int graph;
    float *buf;
    ncclResult_t r;
    cudaError_t launch;
    char last[128];
};
static void *waiter_main(void *arg) {
    Waiter *w = (Waiter *)arg;
    cudaSetDevice(0);
    cudaStream_t s = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    if (w->graph) {
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    }
    /* the all-reduce is posted first: once rank 1's receive of the send has
     * met, rank 0 is inside the group waiting */
    ncclGroupStart();
    ncclAllReduce(w->buf, w->buf, NN, ncclFloat32, ncclSum, w->comm, s);
    ncclSend(w->buf + NN, 1, ncclFloat32, 1, w->comm, s);
    w->r = ncclGroupEnd();
    if (w->graph) {
        cudaStreamEndCapture(s, &g);
        cudaGraphInstantiate(&x, g, 0);
        w->launch = cudaGraphLaunch(x, s);
        cudaGraphExecDestroy(x); /* with the graph goes the clique (no comm is live) */
        cudaGraphDestroy(g);
        cudaStreamDestroy(s);
    }
    snprintf(w->last, sizeof w->last, "%s", ncclGetLastError(NULL));
    return NULL;
}
static int abort_while_waiting(int graph) {
    ncclComm_t c[2];
    int devs[2] = {0, 1};
    if (ncclCommInitAll(c, 2, devs) != ncclSuccess) return 0;
    Waiter w = {c[0], graph, NULL, ncclInternalError, cudaErrorUnknown, ""};
    float *rb;
    cudaMalloc(&w.buf, (NN + 1) * sizeof(float));
    cudaMalloc(&rb, sizeof(float));
    fill(w.buf, -1, 0);
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &w);
    int ok = ncclRecv(rb, 1, ncclFloat32, 0, c[1], NULL) == ncclSuccess;
    usleep(50 * 1000); /* most likely asleep on the clique by now; posted for sure */
    ok &= ncclCommAbort(c[0]) == ncclSuccess && ncclCommAbort(c[1]) == ncclSuccess;
    pthread_join(t, NULL);
    if (graph)
        ok &= w.r == ncclSuccess && w.launch == cudaSuccess;
    else
        ok &= w.r == ncclRemoteError;
    ok &= strstr(w.last, "aborted") != NULL && w.buf[0] == -7.0f;
    cudaFree(w.buf);
    cudaFree(rb);
    return ok;
}

/* The last end of a clique waits for the graphs that captured its
 * operations (NCCL >= 2.26): a graph and its executable each hold it. */
struct Ender {
    ncclComm_t comm;
    int done;
};
static void *ender_main(void *arg) {
    Ender *e = (Ender *)arg;
    ncclCommAbort(e->comm);
    __atomic_store_n(&e->done, 1, __ATOMIC_RELEASE);
    return NULL;
}
static int last_end_waits_for_graphs(void) {
    ncclComm_t cc[2];
    if (ncclCommInitAll(cc, 2, NULL) != ncclSuccess) return 0;
    cudaStream_t st;
    float *p;
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    cudaMalloc(&p, 4 * sizeof *p);
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    int ok = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    ok &= ncclAllReduce(p, p, 4, ncclFloat32, ncclSum, cc[0], st) == ncclSuccess; /* only rank 0's, never run */
    ok &= cudaStreamEndCapture(st, &g) == cudaSuccess && cudaGraphInstantiate(&x, g, 0) == cudaSuccess;
    ok &= ncclCommAbort(cc[0]) == ncclSuccess; /* not the last end: returns at once */
    Ender e = {cc[1], 0};
    pthread_t t;
    pthread_create(&t, NULL, ender_main, &e);
    usleep(100 * 1000);
    ok &= !__atomic_load_n(&e.done, __ATOMIC_ACQUIRE); /* waits for the graph */
    cudaGraphDestroy(g);
    usleep(50 * 1000);
    ok &= !__atomic_load_n(&e.done, __ATOMIC_ACQUIRE); /* the executable still holds it */
    cudaGraphExecDestroy(x);
    pthread_join(t, NULL); /* and returns once that is gone */
    ok &= e.done == 1;
    cudaFree(p);
    cudaStreamDestroy(st);
    return ok;
}

/* Two fresh comms and a graph that captured an all-reduce on both of them
 * (both = 1) or on rank 1's only. */
static void capture_pair(ncclComm_t cc[2], cudaStream_t *st, cudaGraph_t *gg, int both) {
    float *p;
    cudaMalloc(&p, 4 * sizeof *p);
    cudaStreamCreateWithFlags(st, cudaStreamNonBlocking);
    ncclCommInitAll(cc, 2, NULL);
    cudaStreamBeginCapture(*st, cudaStreamCaptureModeThreadLocal);
    ncclGroupStart();
    if (both) ncclAllReduce(p, p, 2, ncclFloat32, ncclSum, cc[0], *st);
    ncclAllReduce(p + 2, p + 2, 2, ncclFloat32, ncclSum, cc[1], *st);
    ncclGroupEnd();
    cudaStreamEndCapture(*st, gg);
}

static const char *g_phase = "";
static void on_alarm(int sig) {
    (void)sig;
    const char m[] = "selftest: timed out (a rank waits for ever) in: ";
    ssize_t n = write(2, m, sizeof m - 1);
    n += write(2, g_phase, strlen(g_phase));
    n += write(2, "\n", 1);
    (void)n;
    _exit(1);
}

/* run fn in a child; true when it died by a signal (the emulator aborts) */
template <typename F> static int dies(F fn) {
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        fn();
        cudaStreamSynchronize(0);
        _exit(0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsigned *u;
    cudaMalloc(&u, 192 * sizeof *u);
    LAUNCH(k_shfl, 1, 32)(u);
    cudaStreamSynchronize(0); /* stream 0's work is deferred too */
    int ok = 1;
    for (unsigned l = 0; l < 32; l++) {
        ok &= u[l] == (l ^ 1) * 10 && u[32 + l] == (l + 4 < 32 ? l + 4 : l) && u[64 + l] == (l & ~7u) + 3;
        ok &= u[96 + l] == 0x49249249u && u[128 + l] == 0xffu << (l & ~7u) && u[160 + l] == (l ^ 2);
    }
    check(ok, "shfl xor/down/idx(width 8), ballot, match_any, partial masks");

    int *bo;
    cudaMalloc(&bo, 2 * 256 * sizeof *bo);
    LAUNCH(k_block, 2, 256)(bo);
    cudaStreamSynchronize(0);
    ok = 1;
    for (int i = 0; i < 512; i++)
        ok &= bo[i] == 255 - i % 256 + 1000 + 10 * 100000;
    check(ok, "__shared__ + __syncthreads, _or, _count over 2 blocks");

    float *f;
    cudaMalloc(&f, 64 * sizeof *f);
    LAUNCH(k_dyn, 1, 64, 64 * sizeof(float), (cudaStream_t)0)(f);
    ok = cudaGetLastError() == cudaSuccess && cudaStreamSynchronize(0) == cudaSuccess;
    for (int i = 0; i < 64; i++)
        ok &= f[i] == (float)((i + 1) % 64);
    check(ok, "dynamic shared memory");

    LAUNCH(k_dyn, 1, 64, 64 * 1024, (cudaStream_t)0)(f);
    check(cudaGetLastError() == cudaErrorInvalidValue, "64 KB dynamic smem without opt-in -> cudaErrorInvalidValue");
    check(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess,
          "cudaFuncSetAttribute 64 KB");
    LAUNCH(k_dyn, 1, 64, 64 * 1024, (cudaStream_t)0)(f);
    check(cudaGetLastError() == cudaSuccess, "64 KB dynamic smem after opt-in");
    LAUNCH(k_dyn, 1, 1025)(f);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads -> cudaErrorInvalidConfiguration");

    check(dies([] { LAUNCH(k_diverge, 1, 64)(); }), "__syncthreads at two call sites aborts");
    check(dies([u] { LAUNCH(k_partial, 1, 32)(u); }), "full-mask shuffle by half a warp aborts");
    check(dies([] { LAUNCH(k_exit_early, 1, 64)(); }), "thread exiting before a barrier aborts");
    check(dies([f] { LAUNCH(k_add, 1, 65)(f, 1.0f); }), "out-of-bounds device write is an ASan report");

    /* __launch_bounds__: translate.py puts the check in every kernel */
    {
        int *b = NULL, hb[64] = {0};
        cudaMalloc((void **)&b, 128 * sizeof(int));
        selftest_launch_bounded(b, 64);
        cudaMemcpy(hb, b, sizeof hb, cudaMemcpyDeviceToHost);
        check(cudaGetLastError() == cudaSuccess && hb[0] == 1 && hb[63] == 64, "launch at its __launch_bounds__ runs");
        check(dies([b] { selftest_launch_bounded(b, 65); }), "launch beyond __launch_bounds__ aborts");
        cudaFree(b);
        char msg[512];
        int rc = translate("__global__ void k(int *p) { p[0] = 1; }\n", msg, sizeof msg);
        check(rc != 0 && strstr(msg, "kernel k has no __launch_bounds__"),
              "translate.py stops at a kernel without bounds");
        rc = translate("__global__ void k(int *p);\n__global__ void __launch_bounds__(32) k(int *p) { p[0] = 1; }\n",
                       msg, sizeof msg);
        check(rc == 0, "translate.py: a declaration needs no bounds, the definition has them");
    }

    /* static __shared__ (translated): per block, garbage at the start, overruns seen */
    {
        enum { NB = 8 };
        unsigned *d = NULL, h[3 * NB];
        cudaMalloc((void **)&d, sizeof h);
        selftest_launch_shared(d, NB);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        int garbage = 1, aligned = 1;
        for (int b = 0; b < NB; b++) {
            garbage &= h[3 * b] == 0xffffffffu && h[3 * b + 1] == 0xffffffffu;
            aligned &= h[3 * b + 2] == 0;
        }
        check(garbage, "static __shared__: every block starts with garbage, not another block's values");
        check(aligned, "static __shared__: __align__(16) honoured");
        int *o = NULL;
        cudaMalloc((void **)&o, 32 * sizeof(int));
        check(dies([o] { selftest_launch_shared_overrun(o); }), "static __shared__ overrun is an ASan report");
        cudaFree(o);
        cudaFree(d);
        char msg[512];
        int rc = translate("__global__ void __launch_bounds__(32) k(int *p) {\n"
                           "    __shared__ int a[4], *q;\n    p[0] = a[0];\n}\n",
                           msg, sizeof msg);
        check(rc != 0 && strstr(msg, "cannot read the __shared__ declarator"),
              "translate.py stops at a __shared__ declarator it cannot read");
    }

    /* graphs: recorded, replayed, a pinned source read at replay */
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *h;
    cudaMallocHost(&h, 64 * sizeof *h);
    for (int i = 0; i < 64; i++)
        h[i] = 1.0f;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    cudaMemcpyAsync(f, h, 64 * sizeof *f, cudaMemcpyHostToDevice, s);
    LAUNCH(k_add, 1, 64, 0, s)(f, 2.0f);
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    ok = f[0] != 3.0f; /* nothing ran during the capture */
    ok &= cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&x, g, 0) == cudaSuccess;
    for (int i = 0; i < 64; i++)
        h[i] = 5.0f;
    ok &= cudaGraphLaunch(x, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
    ok &= f[0] == 7.0f && f[63] == 7.0f;
    check(ok, "graph capture, replay reads pinned memory when it runs");
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    ok = cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported;
    ok &= cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && g == NULL;
    cudaGetLastError();
    check(ok, "sync while capturing fails and invalidates the capture");
    check(dies([f] {
              cudaStream_t c;
              float page[4] = {0, 0, 0, 0};
              cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking);
              cudaStreamBeginCapture(c, cudaStreamCaptureModeThreadLocal);
              cudaMemcpyAsync(f, page, sizeof page, cudaMemcpyHostToDevice, c);
          }),
          "a captured copy from pageable host memory stops the emulator (not modelled)");

    /* bf16: round to nearest even */
    ok = __bfloat16_as_ushort(__float2bfloat16_rn(1.00390625f)) == 0x3f80;             /* tie, even below */
    ok &= __bfloat16_as_ushort(__float2bfloat16_rn(1.01171875f)) == 0x3f82;            /* tie, even above */
    ok &= __bfloat16_as_ushort(__float2bfloat16_rn(1.0040f)) == 0x3f81;                /* above the tie */
    ok &= __bfloat16_as_ushort(__float2bfloat16_rn(NAN)) == 0x7fff;                    /* canonical NaN */
    ok &= __bfloat16_as_ushort(__float2bfloat16_rn(3.4e38f)) == 0x7f80;                /* rounds up to inf */
    check(ok, "bf16 round to nearest even");

    /* wmma: C = A·B + 1 against a host loop */
    __nv_bfloat16 *a, *b;
    float *c;
    cudaMalloc(&a, 256 * sizeof *a);
    cudaMalloc(&b, 256 * sizeof *b);
    cudaMalloc(&c, 256 * sizeof *c);
    for (int i = 0; i < 256; i++) {
        a[i] = __float2bfloat16_rn((float)(i % 7) - 3.0f);
        b[i] = __float2bfloat16_rn((float)(i % 5) * 0.5f);
    }
    LAUNCH(k_wmma, 1, 32)(a, b, c);
    ok = cudaStreamSynchronize(0) == cudaSuccess;
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 16; col++) {
            float want = 1.0f;
            for (int k = 0; k < 16; k++) /* b col_major: element (k, col) at col * 16 + k */
                want += __bfloat162float(a[r * 16 + k]) * __bfloat162float(b[col * 16 + k]);
            ok &= c[r * 16 + col] == want;
        }
    check(ok, "wmma 16x16x16 bf16 (row_major a, col_major b)");

    /* cuBLASLt TN, as cuda_matmul.cu: D(m, n) = op(A) B, A (k, m) ld k */
    const int m = 3, n = 2, k = 4;
    __nv_bfloat16 *A, *B, *D;
    cudaMalloc(&A, 12 * sizeof *A);
    cudaMalloc(&B, 8 * sizeof *B);
    cudaMalloc(&D, 6 * sizeof *D);
    for (int i = 0; i < 12; i++)
        A[i] = __float2bfloat16_rn((float)i);
    for (int i = 0; i < 8; i++)
        B[i] = __float2bfloat16_rn((float)(i + 1));
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    ok = cublasLtCreate(&lt) == 0 && cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0;
    ok &= cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == 0;
    ok &= cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == 0;
    ok &= cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k) == 0 &&
          cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k) == 0 &&
          cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m) == 0 && cublasLtMatmulPreferenceCreate(&pref) == 0;
    ok &= cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &res, &found) == 0 && found == 1;
    const float alpha = 1.0f, beta = 0.0f;
    ok &= cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res.algo, NULL, 0, 0) == 0;
    ok &= cudaStreamSynchronize(0) == cudaSuccess;
    for (int j = 0; ok && j < n; j++)
        for (int i = 0; i < m; i++) {
            float want = 0;
            for (int kk = 0; kk < k; kk++)
                want += (float)(kk + i * k) * (float)(kk + j * k + 1);
            ok &= __bfloat162float(D[i + j * m]) == __bfloat162float(__float2bfloat16_rn(want));
        }
    int epi = 1;
    ok &= cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ==
          CUBLAS_STATUS_NOT_SUPPORTED;
    check(ok, "cuBLASLt TN bf16 matmul; unsupported attribute rejected");

    /* A query after new work: "not ready" once, which CUDA also records as
     * the thread's last error (pollers must clear it). */
    {
        cudaStream_t q;
        cudaStreamCreateWithFlags(&q, cudaStreamNonBlocking);
        cudaGetLastError();
        LAUNCH(k_add, 1, 32, 0, q)(f, 0.0f);
        ok = cudaStreamQuery(q) == cudaErrorNotReady && cudaGetLastError() == cudaErrorNotReady;
        ok &= cudaStreamQuery(q) == cudaSuccess && cudaGetLastError() == cudaSuccess;
        check(ok, "cudaStreamQuery after new work: not ready once, also as the last error");
        cudaStreamDestroy(q);
    }

    /* Devices: a kernel launch on a stream of another device than the
     * current one fails, so does recording an event of one device on a
     * stream of another; a copy on it works. */
    {
        cudaStream_t q1;
        cudaEvent_t e0;
        cudaSetDevice(1);
        cudaStreamCreateWithFlags(&q1, cudaStreamNonBlocking);
        cudaSetDevice(0);
        cudaEventCreateWithFlags(&e0, cudaEventDisableTiming);
        cudaGetLastError();
        LAUNCH(k_add, 1, 32, 0, q1)(f, 0.0f);
        ok = cudaGetLastError() == cudaErrorInvalidResourceHandle;
        ok &= cudaEventRecord(e0, q1) == cudaErrorInvalidResourceHandle && cudaGetLastError() != cudaSuccess;
        ok &= cudaMemsetAsync(f, 0, 4, q1) == cudaSuccess;
        cudaSetDevice(1);
        LAUNCH(k_add, 1, 32, 0, q1)(f, 0.0f);
        ok &= cudaGetLastError() == cudaSuccess;
        cudaSetDevice(0);
        check(ok, "launch / event record on another device's stream fail, a copy works");
        cudaEventDestroy(e0);
        cudaStreamDestroy(q1);
    }

    /* Deferred streams: work waits in the stream until the host needs it,
     * so missing synchronisation shows as wrong data. */
    {
        cudaStream_t q, q2;
        cudaStreamCreateWithFlags(&q, cudaStreamNonBlocking);
        cudaStreamCreateWithFlags(&q2, cudaStreamNonBlocking);
        float *pin, page[4] = {1, 1, 1, 1}, *dv, *dv2;
        cudaMallocHost(&pin, 4 * sizeof *pin);
        cudaMalloc(&dv, 4 * sizeof *dv);
        cudaMalloc(&dv2, 4 * sizeof *dv2);
        for (int i = 0; i < 4; i++)
            pin[i] = 1.0f;
        /* pinned source: read when the copy runs; pageable: during the call */
        ok = cudaMemcpyAsync(dv, pin, 4 * sizeof *pin, cudaMemcpyHostToDevice, q) == cudaSuccess;
        ok &= cudaMemcpyAsync(dv2, page, sizeof page, cudaMemcpyHostToDevice, q) == cudaSuccess;
        pin[0] = page[0] = 9.0f;
        ok &= cudaStreamSynchronize(q) == cudaSuccess && dv[0] == 9.0f && dv2[0] == 1.0f;
        check(ok, "deferred: H2D from pinned memory reads it when it runs, from pageable during the call");

        /* device-to-pinned: garbage until synchronised; to pageable: done at return */
        LAUNCH(k_add, 1, 4, 0, q)(dv, 1.0f);
        ok = cudaMemcpyAsync(pin, dv, 4 * sizeof *pin, cudaMemcpyDeviceToHost, q) == cudaSuccess;
        uint32_t bits;
        memcpy(&bits, &pin[1], 4);
        ok &= bits == 0xa5a5a5a5u && dv[1] == 1.0f; /* nothing ran yet */
        ok &= cudaStreamSynchronize(q) == cudaSuccess && pin[0] == 10.0f && pin[1] == 2.0f;
        LAUNCH(k_add, 1, 4, 0, q)(dv, 1.0f);
        ok &= cudaMemcpyAsync(page, dv, sizeof page, cudaMemcpyDeviceToHost, q) == cudaSuccess && page[3] == 3.0f;
        check(ok, "deferred: D2H into pinned memory is garbage until synchronised, into pageable done at return");

        /* events: synchronising one runs its stream up to the record only */
        cudaEvent_t ev, ev2;
        cudaEventCreate(&ev);
        cudaEventCreate(&ev2);
        LAUNCH(k_add, 1, 4, 0, q)(dv, 1.0f);
        ok = cudaEventRecord(ev, q) == cudaSuccess;
        LAUNCH(k_add, 1, 4, 0, q)(dv, 1.0f);
        ok &= cudaEventRecord(ev2, q) == cudaSuccess;
        float ms = 0;
        ok &= cudaEventElapsedTime(&ms, ev, ev2) == cudaErrorNotReady;
        cudaGetLastError();
        ok &= cudaEventSynchronize(ev) == cudaSuccess && dv[0] == 12.0f;
        ok &= cudaStreamSynchronize(q) == cudaSuccess && dv[0] == 13.0f;
        ok &= cudaEventElapsedTime(&ms, ev, ev2) == cudaSuccess;
        check(ok, "deferred: cudaEventSynchronize runs the stream up to the record; elapsed time not ready before");

        /* across streams: q2 sees q's result only after waiting on its event */
        LAUNCH(k_add, 1, 4, 0, q)(dv, 1.0f); /* 14 */
        ok = cudaMemcpyAsync(dv2, dv, 4 * sizeof *dv, cudaMemcpyDeviceToDevice, q2) == cudaSuccess;
        ok &= cudaStreamSynchronize(q2) == cudaSuccess && dv2[0] == 13.0f; /* no wait: stale */
        ok &= cudaEventRecord(ev, q) == cudaSuccess && cudaStreamWaitEvent(q2, ev, 0) == cudaSuccess;
        LAUNCH(k_add, 1, 4, 0, q)(dv, 1.0f); /* 15, after the record */
        ok &= cudaMemcpyAsync(dv2, dv, 4 * sizeof *dv, cudaMemcpyDeviceToDevice, q2) == cudaSuccess;
        ok &= cudaStreamSynchronize(q2) == cudaSuccess && dv2[0] == 14.0f;
        ok &= cudaStreamSynchronize(q) == cudaSuccess && dv[0] == 15.0f;
        check(ok, "deferred: a stream sees another's work only after cudaStreamWaitEvent, up to the record");

        /* the legacy stream 0: a cudaMemset is queued there, and a
         * non-blocking stream does not wait for it; a synchronous D2H copy
         * does */
        ok = cudaStreamSynchronize(q) == cudaSuccess && dv[0] == 15.0f;
        ok &= cudaMemset(dv, 0, 4 * sizeof *dv) == cudaSuccess && dv[0] == 15.0f; /* queued */
        ok &= cudaMemcpyAsync(dv2, dv, 4 * sizeof *dv, cudaMemcpyDeviceToDevice, q) == cudaSuccess;
        ok &= cudaStreamSynchronize(q) == cudaSuccess && dv2[0] == 15.0f; /* raced ahead of the memset */
        float back[4] = {1, 1, 1, 1};
        ok &= cudaMemcpy(back, dv, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess && back[0] == 0.0f;
        check(ok, "deferred: cudaMemset is queued on stream 0, which non-blocking streams do not wait for");

        /* cudaFree synchronises: pending work on the memory runs first */
        LAUNCH(k_add, 1, 4, 0, q)(dv2, 1.0f);
        ok = cudaFree(dv2) == cudaSuccess; /* ASan would report the kernel after the free */
        cudaDeviceSynchronize();
        check(ok, "deferred: cudaFree runs the device's pending work first");
        cudaEventDestroy(ev);
        cudaEventDestroy(ev2);
        cudaFree(dv);
        cudaFreeHost(pin);
        cudaStreamDestroy(q);
        cudaStreamDestroy(q2);
    }

    /* NCCL: a group on a capturing stream is one graph node, run at each
     * replay; a hang fails the selftest instead of hanging CI. */
    signal(SIGALRM, on_alarm);
    alarm(120);
    g_phase = "captured ncclAllReduce";
    check(two_ranks(0), "nccl: captured all-reduce, nothing at capture, replays x2");
    g_phase = "captured ncclSend/ncclRecv";
    check(two_ranks(1), "nccl: captured send/recv group both ways, replays x2");

    g_phase = "capture: one thread, mixed streams";
    {
        ncclComm_t cc[2];
        ok = ncclCommInitAll(cc, 2, NULL) == ncclSuccess;
        cudaStream_t s1, s2;
        cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
        cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
        float *x0, *x1;
        cudaMalloc(&x0, 8 * sizeof *x0);
        cudaMalloc(&x1, 8 * sizeof *x1);
        float one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        cudaMemcpy(x0, one, sizeof one, cudaMemcpyHostToDevice);
        cudaMemcpy(x1, one, sizeof one, cudaMemcpyHostToDevice);
        cudaGraph_t g1 = NULL, g2 = NULL;
        cudaGraphExec_t x1e = NULL;
        ok &= cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
        ncclGroupStart();
        ncclAllReduce(x0, x0, 8, ncclFloat32, ncclSum, cc[0], s1);
        ncclAllReduce(x1, x1, 8, ncclFloat32, ncclSum, cc[1], s2);
        int mixed = ncclGroupEnd() == ncclInvalidUsage;
        ok &= cudaStreamBeginCapture(s2, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
        ncclGroupStart();
        ncclAllReduce(x0, x0, 8, ncclFloat32, ncclSum, cc[0], s1);
        ncclAllReduce(x1, x1, 8, ncclFloat32, ncclSum, cc[1], s2);
        mixed &= ncclGroupEnd() == ncclInvalidUsage;
        ok &= cudaStreamEndCapture(s2, &g2) == cudaSuccess;
        /* both ranks from one thread on one capturing stream: fine */
        ncclGroupStart();
        ncclAllReduce(x0, x0, 8, ncclFloat32, ncclSum, cc[0], s1);
        ncclAllReduce(x1, x1, 8, ncclFloat32, ncclSum, cc[1], s1);
        ok &= ncclGroupEnd() == ncclSuccess;
        ok &= cudaStreamEndCapture(s1, &g1) == cudaSuccess && cudaGraphInstantiate(&x1e, g1, 0) == cudaSuccess;
        mixed &= x0[0] == 1.0f && x1[7] == 1.0f; /* the refused groups ran nothing */
        check(ok && mixed, "nccl: group mixing capturing/other or two capturing streams -> ncclInvalidUsage");
        ok &= x0[0] == 1.0f && cudaGraphLaunch(x1e, s1) == cudaSuccess && cudaStreamSynchronize(s1) == cudaSuccess;
        ok &= x0[0] == 2.0f && x1[7] == 2.0f;
        ok &= cudaGraphLaunch(x1e, s1) == cudaSuccess && cudaStreamSynchronize(s1) == cudaSuccess;
        ok &= x0[3] == 4.0f && x1[0] == 4.0f;
        check(ok, "nccl: one thread drives both ranks in one captured group");

        /* one thread, each rank's graph on its own stream: syncing one
         * stream needs the other's replay, which a GPU would run */
        {
            cudaGraph_t ga = NULL, gb = NULL;
            cudaGraphExec_t xa = NULL, xb = NULL;
            float v0 = x0[0], v1 = x1[0];
            ok = cudaStreamBeginCapture(s2, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
            ok &= ncclAllReduce(x1, x1, 8, ncclFloat32, ncclSum, cc[1], s2) == ncclSuccess;
            ok &= cudaStreamEndCapture(s2, &gb) == cudaSuccess && cudaGraphInstantiate(&xb, gb, 0) == cudaSuccess;
            ok &= cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
            ok &= ncclAllReduce(x0, x0, 8, ncclFloat32, ncclSum, cc[0], s1) == ncclSuccess;
            ok &= cudaStreamEndCapture(s1, &ga) == cudaSuccess && cudaGraphInstantiate(&xa, ga, 0) == cudaSuccess;
            ok &= cudaGraphLaunch(xa, s1) == cudaSuccess && cudaGraphLaunch(xb, s2) == cudaSuccess;
            ok &= cudaStreamSynchronize(s1) == cudaSuccess && x0[5] == v0 + v1;
            ok &= cudaStreamSynchronize(s2) == cudaSuccess && x1[5] == v0 + v1;
            check(ok, "nccl: one thread, two ranks' graphs on two streams, one synchronised first");
            cudaGraphExecDestroy(xa);
            cudaGraphExecDestroy(xb);
            cudaGraphDestroy(ga);
            cudaGraphDestroy(gb);
        }

        ok = cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
        ok &= cudaStreamSynchronize(s1) == cudaErrorStreamCaptureUnsupported;
        ok &= ncclAllReduce(x0, x0, 8, ncclFloat32, ncclSum, cc[0], s1) == ncclUnhandledCudaError;
        cudaGraph_t gi = NULL;
        ok &= cudaStreamEndCapture(s1, &gi) == cudaErrorStreamCaptureInvalidated && gi == NULL;
        cudaGetLastError();
        check(ok, "nccl: op on an invalidated capture -> ncclUnhandledCudaError");

        /* ranks disagree at replay: the error can only go to the comms */
        cudaGraph_t g3 = NULL;
        cudaGraphExec_t x3 = NULL;
        ncclResult_t a0 = ncclInternalError, a1 = ncclInternalError;
        ok = cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
        ncclGroupStart();
        ncclAllReduce(x0, x0, 4, ncclFloat32, ncclSum, cc[0], s1);
        ncclAllReduce(x1, x1, 8, ncclFloat32, ncclSum, cc[1], s1);
        ok &= ncclGroupEnd() == ncclSuccess;
        ok &= cudaStreamEndCapture(s1, &g3) == cudaSuccess && cudaGraphInstantiate(&x3, g3, 0) == cudaSuccess;
        ok &= ncclCommGetAsyncError(cc[0], &a0) == ncclSuccess && a0 == ncclSuccess;
        ok &= cudaGraphLaunch(x3, s1) == cudaSuccess && cudaStreamSynchronize(s1) == cudaSuccess;
        ok &= ncclCommGetAsyncError(cc[0], &a0) == ncclSuccess && ncclCommGetAsyncError(cc[1], &a1) == ncclSuccess;
        ok &= a0 == ncclInvalidUsage && a1 == ncclInvalidUsage;
        check(ok, "nccl: replayed mismatch -> ncclCommGetAsyncError");

        cudaGraphExecDestroy(x3);
        cudaGraphDestroy(g3);
        cudaGraphExecDestroy(x1e);
        cudaGraphDestroy(g1);
        cudaGraphDestroy(g2);
        ncclCommDestroy(cc[0]);
        ncclCommDestroy(cc[1]);
        cudaFree(x0);
        cudaFree(x1);
        cudaStreamDestroy(s1);
        cudaStreamDestroy(s2);
    }

    g_phase = "abort while waiting";
    check(abort_while_waiting(0), "nccl: comms aborted under a waiting rank -> ncclRemoteError");
    check(abort_while_waiting(1), "nccl: same, rank waiting in a graph replay");
    g_phase = "last end waits for graphs";
    check(last_end_waits_for_graphs(), "nccl: the clique's last ncclCommAbort waits until its graphs are destroyed");
    alarm(0);
    check(dies([] {
              ncclComm_t cc[2];
              cudaStream_t st;
              cudaGraph_t gg;
              cudaGraphExec_t xx;
              capture_pair(cc, &st, &gg, 1);
              cudaGraphInstantiate(&xx, gg, 0);
              ncclCommDestroy(cc[0]); /* not the last: returns */
              cudaGraphLaunch(xx, st);
          }),
          "nccl: graph replayed after one of its comms was destroyed aborts");
    check(dies([] {
              setenv("ECHO_EMU_NCCL_GRAPH_WAIT_S", "1", 1);
              ncclComm_t cc[2];
              cudaStream_t st;
              cudaGraph_t gg;
              capture_pair(cc, &st, &gg, 0);
              ncclCommDestroy(cc[0]);
              ncclCommDestroy(cc[1]); /* the last, with the graph alive: real NCCL hangs here */
          }),
          "nccl: the last ncclCommDestroy with a graph alive waits, then the emulator aborts");

    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
    void *dev[] = {u, bo, f, a, b, c, A, B, D};
    for (void *p : dev)
        cudaFree(p);
    cudaFreeHost(h);
    cudaStreamDestroy(s);
    printf("selftest: %d of %d passed\n", g_n - g_fail, g_n);
    return g_fail ? 1 : 0;
}
