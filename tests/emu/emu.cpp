/*
 * tests/emu/emu.cpp — the CUDA emulator's core: kernel execution (threads as
 * coroutines, barriers, warp collectives) and the runtime API (memory,
 * streams, events, graphs, errors, device properties). Test infrastructure
 * only; see include/cuda_runtime.h for the model.
 *
 * Thread safety: host threads (the ranks of a tensor-parallel world) launch
 * kernels concurrently. Each host thread has its own scheduler (thread_local
 * EmuSched) and runs its launches itself; the runtime's shared tables
 * (allocations, function attributes) are behind one mutex.
 *
 * Scheduling: the threads of a block run one at a time on the launching host
 * thread, each on its own coroutine stack, and switch only at barriers,
 * warp collectives and exit. Every round picks a random order of warps
 * (seed ECHO_EMU_SEED, default 1) and may leave some warps out, so warps
 * drift apart and a missing __syncthreads shows up as a wrong result.
 * Blocks run one after another in a seeded random order.
 *
 * Environment: ECHO_EMU_DEVICES (device count, default 4), ECHO_EMU_SMS
 * (multiprocessors per device, default 132 like an H100 SXM; the tests use
 * fewer since comm/ sizes grids by SM count), ECHO_EMU_SEED.
 */
#include "cuda_runtime.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <map>
#include <mutex>
#include <vector>

#include "emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace emu {

/* ---------------------------------------------------------------- context switch */

#if defined(__x86_64__)
/* Save callee-saved registers and the FP control words on the current stack,
 * store the stack pointer in *save, continue on new_sp. Not intercepted by
 * the sanitizers (unlike swapcontext/longjmp), and no signal-mask syscall. */
extern "C" void emu_ctx_switch(void **save, void *new_sp);
asm(".text\n"
    ".globl emu_ctx_switch\n"
    ".type emu_ctx_switch,@function\n"
    "emu_ctx_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  subq $8, %rsp\n"
    "  stmxcsr (%rsp)\n"
    "  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n"
    "  fldcw 4(%rsp)\n"
    "  addq $8, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size emu_ctx_switch,.-emu_ctx_switch\n");
#endif

static const size_t STACK_BYTES = 256 * 1024;

struct Fiber {
    char *stack = nullptr;
#if defined(__x86_64__)
    void *sp = nullptr;
#else
    ucontext_t uc;
#endif
};

enum { T_RUN, T_WAIT, T_DONE };

struct Th {
    ThreadCtx c;
    int state;
    int bar_result;
    const char *wait_file; /* where a waiting thread waits */
    int wait_line;
};

struct Post {
    const char *file;
    int line;
    unsigned mask;
    int kind;
    CustomFn fn;
    const void *in;
    void *out;
};

struct WarpSt {
    Post post[32];
    unsigned posted; /* lanes waiting at a collective */
    unsigned done;   /* lanes that exited */
};

struct EmuSched {
    std::vector<Fiber> fibers;
#if defined(__x86_64__)
    void *sched_sp = nullptr;
#else
    ucontext_t sched_uc;
#endif
    const void *os_bottom = nullptr; /* ASan: the host thread's stack */
    size_t os_size = 0;
    bool in_kernel = false;
    const std::function<void()> *body = nullptr;
    std::vector<Th> th;
    std::vector<WarpSt> warps;
    int nthreads = 0, cur = -1, ndone = 0;
    const LaunchCfg *cfg = nullptr;
    unsigned char *dyn = nullptr;
    /* this block's static __shared__ variables, one per declaration site */
    struct SharedVar {
        const char *file, *name;
        int line;
        void *p;
    };
    std::vector<SharedVar> shared_vars;
    /* the block barrier in progress */
    int bar_arrived = 0, bar_op = -1, bar_acc_or = 0, bar_acc_and = 1, bar_acc_count = 0;
    const char *bar_file = nullptr;
    int bar_line = 0;
    uint64_t rng = 1;
    ~EmuSched() {
        for (auto &f : fibers) {
#if EMU_ASAN
            /* the parked fibers' frames stay poisoned in ASan's shadow; a
             * later mapping at these addresses (a model file) would read as
             * a stack overflow */
            __asan_unpoison_memory_region(f.stack, STACK_BYTES);
#endif
            munmap(f.stack, STACK_BYTES);
        }
    }
};

static thread_local EmuSched *tls_sched;
static thread_local EmuSched tls_sched_storage;

[[noreturn]] static void vdie(const char *file, int line, const char *fmt, va_list ap) {
    EmuSched *s = tls_sched;
    fprintf(stderr, "\nemu: ");
    vfprintf(stderr, fmt, ap);
    if (file) fprintf(stderr, " [at %s:%d]", file, line);
    if (s && s->in_kernel && s->cur >= 0) {
        const ThreadCtx &c = s->th[s->cur].c;
        fprintf(stderr, " [kernel %s launched at %s:%d, block (%u,%u,%u) thread (%u,%u,%u)]", s->cfg->name,
                s->cfg->file, s->cfg->line, c.bid.x, c.bid.y, c.bid.z, c.tid.x, c.tid.y, c.tid.z);
    }
    fprintf(stderr, "\n");
    fflush(stderr);
    abort();
}

void die(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vdie(file, line, fmt, ap);
    va_end(ap);
}

static EmuSched *sched() {
    if (!tls_sched) {
        tls_sched = &tls_sched_storage;
        const char *seed = getenv("ECHO_EMU_SEED");
        tls_sched->rng = seed && *seed ? strtoull(seed, nullptr, 0) | 1u : 1;
    }
    return tls_sched;
}

static void fiber_main();

static void switch_to_fiber(EmuSched *s, int i) {
    Fiber &f = s->fibers[i];
#if EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack, STACK_BYTES);
#endif
#if defined(__x86_64__)
    emu_ctx_switch(&s->sched_sp, f.sp);
#else
    swapcontext(&s->sched_uc, &f.uc);
#endif
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

static void switch_to_sched(EmuSched *s) {
    Fiber &f = s->fibers[s->cur];
#if EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, s->os_bottom, s->os_size);
#endif
#if defined(__x86_64__)
    emu_ctx_switch(&f.sp, s->sched_sp);
#else
    swapcontext(&f.uc, &s->sched_uc);
#endif
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

/* A fiber serves thread i of every block: run the body, report done, park. */
static void fiber_main() {
    EmuSched *s = tls_sched;
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &s->os_bottom, &s->os_size);
#endif
    for (;;) {
        (*s->body)();
        Th &t = s->th[s->cur];
        t.state = T_DONE;
        s->ndone++;
        s->warps[s->cur / 32].done |= 1u << (s->cur % 32);
        /* a thread that leaves while others wait for it deadlocks on a GPU */
        if (s->bar_arrived)
            die(nullptr, 0, "thread exited while %d threads of its block wait at __syncthreads (%s:%d)",
                s->bar_arrived, s->bar_file, s->bar_line);
        WarpSt &w = s->warps[s->cur / 32];
        int lane = s->cur % 32;
        for (int l = 0; l < 32; l++)
            if ((w.posted >> l & 1u) && (w.post[l].mask >> lane & 1u))
                die(nullptr, 0, "thread exited while lane %d of its warp waits for it at a warp collective (%s:%d)",
                    l, w.post[l].file, w.post[l].line);
        switch_to_sched(s);
    }
}

static void make_fiber(EmuSched *s) {
    Fiber f;
    void *p = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) die(nullptr, 0, "mmap of a coroutine stack failed: %s", strerror(errno));
    f.stack = (char *)p;
#if defined(__x86_64__)
    uintptr_t top = ((uintptr_t)f.stack + STACK_BYTES) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                           /* fiber_main's return address: never used */
    *--sp = (uint64_t)(void *)fiber_main; /* where emu_ctx_switch returns to */
    for (int r = 0; r < 6; r++)
        *--sp = 0; /* rbp rbx r12 r13 r14 r15 */
    *--sp = 0x037f00001f80ull; /* mxcsr default, x87 control word default */
    f.sp = sp;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = STACK_BYTES;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, (void (*)())fiber_main, 0);
#endif
    s->fibers.push_back(f);
}

static uint64_t rnd(EmuSched *s) {
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return s->rng;
}


/* ---------------------------------------------------------------- device builtins */

const ThreadCtx &ctx() {
    EmuSched *s = tls_sched;
    if (!s || !s->in_kernel) die(nullptr, 0, "threadIdx/blockIdx/blockDim/gridDim used outside a kernel");
    return s->th[s->cur].c;
}

int lane_id() {
    return sched()->cur % 32;
}

void launch_bounds(const char *file, int line, long max_threads) {
    const dim3 &b = ctx().bdim;
    long n = (long)b.x * b.y * b.z;
    if (n > max_threads)
        die(file, line,
            "%ld threads per block, more than the kernel's __launch_bounds__(%ld): a GPU refuses this launch "
            "(cudaErrorLaunchOutOfResources)",
            n, max_threads);
}

void *block_shared(const char *file, int line, const char *name, size_t bytes, size_t align) {
    EmuSched *s = tls_sched;
    if (!s || !s->in_kernel) die(file, line, "__shared__ %s used outside a kernel", name);
    for (auto &v : s->shared_vars)
        if (v.line == line && (v.name == name || !strcmp(v.name, name)) && (v.file == file || !strcmp(v.file, file)))
            return v.p;
    /* exactly the variable's bytes (ASan sees overruns), garbage as on a GPU */
    void *p = nullptr;
    if (posix_memalign(&p, align < 16 ? 16 : align, bytes ? bytes : 1))
        die(file, line, "out of memory for __shared__ %s", name);
    memset(p, 0xff, bytes);
    s->shared_vars.push_back({file, name, line, p});
    return p;
}

void *dyn_smem() {
    EmuSched *s = tls_sched;
    if (!s || !s->in_kernel) die(nullptr, 0, "extern __shared__ used outside a kernel");
    if (!s->dyn) die(nullptr, 0, "extern __shared__ array used by a launch with 0 bytes of dynamic shared memory");
    return s->dyn;
}

static void wait_here(EmuSched *s, const char *file, int line) {
    Th &t = s->th[s->cur];
    t.state = T_WAIT;
    t.wait_file = file;
    t.wait_line = line;
    switch_to_sched(s);
}

int syncthreads_op(const char *file, int line, int op, int pred) {
    EmuSched *s = tls_sched;
    if (!s || !s->in_kernel) die(file, line, "__syncthreads outside a kernel");
    if (s->ndone)
        die(file, line, "__syncthreads after %d threads of the block exited (every thread must arrive)", s->ndone);
    if (s->bar_arrived == 0) {
        s->bar_file = file;
        s->bar_line = line;
        s->bar_op = op;
        s->bar_acc_or = 0;
        s->bar_acc_and = 1;
        s->bar_acc_count = 0;
    } else if (s->bar_line != line || (s->bar_file != file && strcmp(s->bar_file, file) != 0) || s->bar_op != op) {
        die(file, line, "__syncthreads at different call sites: others wait at %s:%d", s->bar_file, s->bar_line);
    }
    s->bar_acc_or |= pred;
    s->bar_acc_and &= pred;
    s->bar_acc_count += pred;
    if (++s->bar_arrived < s->nthreads) {
        wait_here(s, file, line);
        return s->th[s->cur].bar_result;
    }
    int r = op == 0 ? s->bar_acc_count : op == 1 ? s->bar_acc_or : s->bar_acc_and;
    for (int i = 0; i < s->nthreads; i++) {
        s->th[i].bar_result = r;
        if (s->th[i].state == T_WAIT) s->th[i].state = T_RUN;
    }
    s->bar_arrived = 0;
    return r;
}

void syncthreads(const char *file, int line) {
    syncthreads_op(file, line, 0, 0);
}

static const char *kind_name(int k) {
    static const char *n[] = {"__syncwarp", "shuffle", "__ballot_sync", "__match_any_sync", "wmma"};
    return k >= 0 && k <= W_CUSTOM ? n[k] : "?";
}

static void complete(WarpSt &w, unsigned mask, int warp) {
    const Post &p0 = w.post[__builtin_ctz(mask)];
    switch (p0.kind) {
    case W_SYNC:
        break;
    case W_SHFL:
        for (int l = 0; l < 32; l++) {
            if (!(mask >> l & 1u)) continue;
            const ShflIn *in = (const ShflIn *)w.post[l].in;
            int width = in->width;
            if (width < 1 || width > 32 || (width & (width - 1)))
                die(w.post[l].file, w.post[l].line, "shuffle width %d is not a power of two <= 32", width);
            int base = l & ~(width - 1), src = l;
            switch (in->mode) {
            case 0: src = base + (in->arg & (width - 1)); break;
            /* xor may reach earlier segments, not later ones (CUDA's rule) */
            case 1: src = l ^ in->arg; if (src >= base + width) src = l; break;
            case 2: src = l + in->arg; if (src >= base + width) src = l; break;
            case 3: src = l - in->arg; if (src < base) src = l; break;
            }
            if (src < 0 || src > 31 || !(mask >> src & 1u))
                die(w.post[l].file, w.post[l].line,
                    "shuffle: lane %d of warp %d reads lane %d, outside the mask 0x%08x (undefined on a GPU)", l, warp,
                    src, mask);
            *(uint64_t *)w.post[l].out = ((const ShflIn *)w.post[src].in)->bits;
        }
        break;
    case W_BALLOT: {
        unsigned b = 0;
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1u) && *(const int *)w.post[l].in) b |= 1u << l;
        for (int l = 0; l < 32; l++)
            if (mask >> l & 1u) *(unsigned *)w.post[l].out = b;
        break;
    }
    case W_MATCH:
        for (int l = 0; l < 32; l++) {
            if (!(mask >> l & 1u)) continue;
            unsigned m = 0;
            uint64_t v = *(const uint64_t *)w.post[l].in;
            for (int j = 0; j < 32; j++)
                if ((mask >> j & 1u) && *(const uint64_t *)w.post[j].in == v) m |= 1u << j;
            *(unsigned *)w.post[l].out = m;
        }
        break;
    case W_CUSTOM: {
        const void *ins[32];
        void *outs[32];
        for (int l = 0; l < 32; l++) {
            ins[l] = (mask >> l & 1u) ? w.post[l].in : nullptr;
            outs[l] = (mask >> l & 1u) ? w.post[l].out : nullptr;
        }
        p0.fn(ins, outs, mask, p0.file, p0.line);
        break;
    }
    }
}

void warp_op(int kind, const char *file, int line, unsigned mask, const void *in, void *out, CustomFn fn) {
    EmuSched *s = tls_sched;
    if (!s || !s->in_kernel) die(file, line, "%s outside a kernel", kind_name(kind));
    int me = s->cur, lane = me % 32, warp = me / 32;
    WarpSt &w = s->warps[warp];
    if (!(mask >> lane & 1u))
        die(file, line, "%s with mask 0x%08x called by lane %d, which is not in the mask", kind_name(kind), mask, lane);
    int nlanes = s->nthreads - warp * 32 < 32 ? s->nthreads - warp * 32 : 32;
    if (nlanes < 32 && (mask >> nlanes))
        die(file, line, "%s with mask 0x%08x in a warp of %d threads", kind_name(kind), mask, nlanes);
    if (w.done & mask)
        die(file, line, "%s waits for lane %d, which has exited", kind_name(kind), __builtin_ctz(w.done & mask));
    /* lanes of the mask already waiting must wait at this very collective
     * (call sites compare by pointer first: one literal per site) */
    for (unsigned m = w.posted & mask; m; m &= m - 1) {
        const Post &o = w.post[__builtin_ctz(m)];
        if (o.mask != mask || o.kind != kind || o.line != line || o.fn != fn ||
            (o.file != file && strcmp(o.file, file) != 0))
            die(file, line,
                "warp collectives disagree: lane %d: %s mask 0x%08x here, lane %d waits at %s mask 0x%08x (%s:%d)",
                lane, kind_name(kind), mask, __builtin_ctz(m), kind_name(o.kind), o.mask, o.file, o.line);
    }
    w.post[lane] = Post{file, line, mask, kind, fn, in, out};
    w.posted |= 1u << lane;
    if ((w.posted & mask) != mask) {
        wait_here(s, file, line);
        return; /* the last lane completed it */
    }
    complete(w, mask, warp);
    w.posted &= ~mask;
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1u) && l != lane) s->th[warp * 32 + l].state = T_RUN;
}

/* ---------------------------------------------------------------- grid execution */

static void deadlock(EmuSched *s) {
    fprintf(stderr, "\nemu: deadlock in kernel %s launched at %s:%d: no thread can proceed\n", s->cfg->name,
            s->cfg->file, s->cfg->line);
    int shown = 0;
    for (int i = 0; i < s->nthreads && shown < 8; i++) {
        Th &t = s->th[i];
        if (t.state != T_WAIT) continue;
        fprintf(stderr, "  thread %d waits at %s:%d\n", i, t.wait_file, t.wait_line);
        shown++;
    }
    if (s->bar_arrived)
        fprintf(stderr, "  %d of %d threads are at __syncthreads %s:%d\n", s->bar_arrived, s->nthreads, s->bar_file,
                s->bar_line);
    abort();
}

static void run_block(EmuSched *s, const LaunchCfg &c, unsigned bx, unsigned by, unsigned bz) {
    int nt = s->nthreads, nw = (nt + 31) / 32;
    for (int i = 0; i < nt; i++) {
        Th &t = s->th[i];
        unsigned u = (unsigned)i;
        t.c.tid = uint3{u % c.block.x, (u / c.block.x) % c.block.y, u / (c.block.x * c.block.y)};
        t.c.bid = uint3{bx, by, bz};
        t.c.bdim = c.block;
        t.c.gdim = c.grid;
        t.state = T_RUN;
        t.bar_result = 0;
    }
    for (auto &w : s->warps)
        w.posted = w.done = 0;
    s->ndone = 0;
    s->bar_arrived = 0;
    if (c.smem) {
        /* exactly the launch's bytes, so ASan sees overruns; garbage (0xff:
         * NaN floats, -1 ints) as on a GPU, where it is whatever was there */
        void *p = nullptr;
        if (posix_memalign(&p, 128, c.smem)) die(nullptr, 0, "out of memory for dynamic shared memory");
        memset(p, 0xff, c.smem);
        s->dyn = (unsigned char *)p;
    }
    std::vector<int> order(nw);
    int alive = nt;
    while (alive > 0) {
        for (int i = 0; i < nw; i++)
            order[i] = i;
        for (int i = nw - 1; i > 0; i--) {
            int j = (int)(rnd(s) % (uint64_t)(i + 1));
            int tmp = order[i];
            order[i] = order[j];
            order[j] = tmp;
        }
        /* leave out some warps this round (not all of the runnable ones) */
        uint64_t starve = nw > 1 && rnd(s) % 4 != 0 ? rnd(s) : 0;
        bool any_unstarved = false;
        for (int i = 0; i < nt && !any_unstarved; i++)
            if (s->th[i].state == T_RUN && !(starve >> ((i / 32) % 64) & 1u)) any_unstarved = true;
        if (!any_unstarved) starve = 0;
        bool progress = false;
        for (int oi = 0; oi < nw; oi++) {
            int w = order[oi];
            if (starve >> (w % 64) & 1u) continue;
            int n = nt - w * 32 < 32 ? nt - w * 32 : 32;
            int start = (int)(rnd(s) % (uint64_t)n);
            for (int k = 0; k < n; k++) {
                int i = w * 32 + (start + k) % n;
                if (s->th[i].state != T_RUN) continue;
                s->cur = i;
                switch_to_fiber(s, i);
                progress = true;
                if (s->th[i].state == T_DONE) alive--;
            }
        }
        if (!progress) deadlock(s);
    }
    s->cur = -1;
    free(s->dyn);
    s->dyn = nullptr;
    for (auto &v : s->shared_vars)
        free(v.p);
    s->shared_vars.clear();
}

void run_grid(const LaunchCfg &c, const std::function<void()> &body) {
    EmuSched *s = sched();
    if (s->in_kernel) die(nullptr, 0, "kernel launch from inside a kernel (not emulated)");
    int nt = (int)(c.block.x * c.block.y * c.block.z);
    while ((int)s->fibers.size() < nt)
        make_fiber(s);
    s->th.assign((size_t)nt, Th{});
    s->warps.assign((size_t)(nt + 31) / 32, WarpSt{});
    s->nthreads = nt;
    s->body = &body;
    s->cfg = &c;
    s->in_kernel = true;
    /* Blocks in a seeded random order: CUDA promises none, so a kernel
     * whose block reads what another block of the same launch writes
     * (without a grid-wide scheme) gets a wrong result here sooner or
     * later instead of working by the accident of ascending order. */
    uint64_t nb = (uint64_t)c.grid.x * c.grid.y * c.grid.z;
    std::vector<uint64_t> order(nb);
    for (uint64_t i = 0; i < nb; i++)
        order[i] = i;
    for (uint64_t i = nb; i > 1; i--)
        std::swap(order[i - 1], order[rnd(s) % i]);
    for (uint64_t b : order)
        run_block(s, c, (unsigned)(b % c.grid.x), (unsigned)(b / c.grid.x % c.grid.y),
                  (unsigned)(b / ((uint64_t)c.grid.x * c.grid.y)));
    s->in_kernel = false;
    s->body = nullptr;
    s->cfg = nullptr;
}

void seed_scheduler(uint64_t seed) {
    sched()->rng = seed ? seed : 1;
}

bool in_kernel() {
    return tls_sched && tls_sched->in_kernel;
}

} // namespace emu
