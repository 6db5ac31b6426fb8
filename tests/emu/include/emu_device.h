/*
 * Device side of the CUDA emulator (C++ only; included by cuda_runtime.h).
 *
 * Kernel sources are compiled as ordinary C++ after one mechanical rewrite
 * (tests/emu/translate.py): `k<<<cfg>>>(args)` becomes a call of
 * emu::Launcher, and `extern __shared__ T a[];` a pointer to the block's
 * dynamic shared memory. Everything else is plain macros and functions here:
 *   - every CUDA thread runs the kernel on its own coroutine; a thread runs
 *     until it reaches a barrier or a warp collective, so the order of
 *     threads between synchronisation points varies (seeded, see emu.cpp);
 *   - __syncthreads needs every thread of the block at the same call site;
 *     warp collectives need every lane of their mask with the same mask at
 *     the same call site; anything else aborts with the site;
 *   - static __shared__ variables are function statics, one copy per host
 *     thread (blocks run one after another, in a seeded random order, on
 *     the thread that runs the launch).
 */
#ifndef ECHO_EMU_DEVICE_H
#define ECHO_EMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#define __global__
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* Only for sources translate.py did not rewrite (the selftest's kernels):
 * one copy per host thread, so a block starts with the previous block's
 * values and ASan does not see overruns. In translated sources every static
 * __shared__ declaration becomes emu::block_shared storage instead. */
#define __shared__ static thread_local
#define __constant__ static

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

namespace emu {

struct ThreadCtx {
    uint3 tid, bid;
    dim3 bdim, gdim;
};

/* the running CUDA thread (aborts outside a kernel) */
const ThreadCtx &ctx();
int lane_id();
/* this block's dynamic shared memory (the launch's third parameter) */
void *dyn_smem();
[[noreturn]] void die(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A static __shared__ variable of the block (translate.py rewrites every
 * `__shared__ T name[...];` of a kernel source into a reference to this):
 * one allocation per block and declaration site, made with exactly the
 * variable's bytes (ASan sees overruns) and filled with 0xff garbage by the
 * first thread of the block that reaches the declaration, freed when the
 * block ends, so no block sees another block's values. */
void *block_shared(const char *file, int line, const char *name, size_t bytes, size_t align);

/* First statement of every kernel (tests/emu/translate.py puts it there
 * from the kernel's __launch_bounds__): a launch of more threads per block
 * than the bound is refused by a GPU ("too many resources requested for
 * launch": ptxas sized the kernel's registers for the bound), so it aborts
 * here with the kernel and the launch site. */
void launch_bounds(const char *file, int line, long max_threads);

void syncthreads(const char *file, int line);
/* op: 0 count, 1 or, 2 and */
int syncthreads_op(const char *file, int line, int op, int pred);

/* Warp collectives. Every lane in `mask` must call with the same mask, kind
 * and call site; the last lane to arrive completes the collective for all. */
enum { W_SYNC, W_SHFL, W_BALLOT, W_MATCH, W_CUSTOM };
struct ShflIn {
    uint64_t bits;
    int mode; /* 0 idx, 1 xor, 2 down, 3 up */
    int arg, width;
};
/* W_CUSTOM: fn(ins, outs) sees every lane's in/out pointer (NULL for lanes
 * outside the mask) once all arrived */
typedef void (*CustomFn)(const void *const *ins, void *const *outs, unsigned mask, const char *file, int line);
void warp_op(int kind, const char *file, int line, unsigned mask, const void *in, void *out, CustomFn fn = nullptr);

/* The bits of `from` as a To of the same size (std::bit_cast, C++20). */
template <typename To, typename From> static inline To bit_cast(From from) {
    static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
    To to;
    memcpy(&to, &from, sizeof to);
    return to;
}

template <typename T> static inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of a type over 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <typename T> static inline T from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}
template <typename T> static inline T shfl(const char *f, int l, unsigned mask, T v, int mode, int arg, int width) {
    ShflIn in = {to_bits(v), mode, arg, width};
    uint64_t out = 0;
    warp_op(W_SHFL, f, l, mask, &in, &out);
    return from_bits<T>(out);
}
template <typename T> static inline unsigned match_any(const char *f, int l, unsigned mask, T v) {
    uint64_t in = to_bits(v);
    unsigned out = 0;
    warp_op(W_MATCH, f, l, mask, &in, &out);
    return out;
}
static inline unsigned ballot(const char *f, int l, unsigned mask, int pred) {
    unsigned out = 0;
    warp_op(W_BALLOT, f, l, mask, &pred, &out);
    return out;
}

/* ---- launches ---- */
struct LaunchCfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    const void *func; /* NULL when the kernel is a template deduced at the call */
    const char *name, *file;
    int line;
};
void launch(const LaunchCfg &c, std::function<void()> body);
struct Launcher {
    LaunchCfg c;
    Launcher(const char *file, int line, const char *name, const void *func, dim3 g, dim3 b, size_t smem = 0,
             cudaStream_t s = 0)
        : c{g, b, smem, s, func, name, file, line} {}
};
template <typename K> struct Bound {
    LaunchCfg c;
    K k;
    /* arguments are copied at the launch, like CUDA's parameter buffer;
     * every thread calls the kernel with its own copies */
    template <typename... A> void operator()(A... a) {
        K kk = k;
        launch(c, [kk, a...]() { kk(a...); });
    }
};
template <typename K> Bound<K> operator->*(const Launcher &l, K k) {
    return Bound<K>{l.c, k};
}

} // namespace emu

#define threadIdx (emu::ctx().tid)
#define blockIdx (emu::ctx().bid)
#define blockDim (emu::ctx().bdim)
#define gridDim (emu::ctx().gdim)
static constexpr int warpSize = 32;

#define __syncthreads() emu::syncthreads(__FILE__, __LINE__)
#define __syncthreads_or(p) emu::syncthreads_op(__FILE__, __LINE__, 1, (p) != 0)
#define __syncthreads_and(p) emu::syncthreads_op(__FILE__, __LINE__, 2, (p) != 0)
#define __syncthreads_count(p) emu::syncthreads_op(__FILE__, __LINE__, 0, (p) != 0)
#define __syncwarp(...) emu::warp_op(emu::W_SYNC, __FILE__, __LINE__, emu_syncwarp_mask(__VA_ARGS__), nullptr, nullptr)
static inline unsigned emu_syncwarp_mask(unsigned m = 0xffffffffu) {
    return m;
}
#define __shfl_sync(m, v, src, ...) emu::shfl(__FILE__, __LINE__, (m), (v), 0, (src), emu_width(__VA_ARGS__))
#define __shfl_xor_sync(m, v, lm, ...) emu::shfl(__FILE__, __LINE__, (m), (v), 1, (lm), emu_width(__VA_ARGS__))
#define __shfl_down_sync(m, v, d, ...) emu::shfl(__FILE__, __LINE__, (m), (v), 2, (d), emu_width(__VA_ARGS__))
#define __shfl_up_sync(m, v, d, ...) emu::shfl(__FILE__, __LINE__, (m), (v), 3, (d), emu_width(__VA_ARGS__))
static inline int emu_width(int w = 32) {
    return w;
}
#define __ballot_sync(m, p) emu::ballot(__FILE__, __LINE__, (m), (p) != 0)
#define __any_sync(m, p) (emu::ballot(__FILE__, __LINE__, (m), (p) != 0) != 0)
#define __all_sync(m, p) (emu::ballot(__FILE__, __LINE__, (m), (p) != 0) == (unsigned)(m))
#define __match_any_sync(m, v) emu::match_any(__FILE__, __LINE__, (m), (v))

/* ---- atomics: device memory is shared by host threads, so real atomics ---- */
template <typename T> static inline T atomicAdd(T *p, T v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline float atomicAdd(float *p, float v) {
    float old;
    uint32_t o = __atomic_load_n((uint32_t *)p, __ATOMIC_SEQ_CST), n;
    do {
        old = emu::bit_cast<float>(o);
        n = emu::bit_cast<uint32_t>(old + v);
    } while (!__atomic_compare_exchange_n((uint32_t *)p, &o, n, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
template <typename T> static inline T atomicMin(T *p, T v) {
    T o = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < o && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return o;
}
template <typename T> static inline T atomicMax(T *p, T v) {
    T o = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v > o && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return o;
}
template <typename T> static inline T atomicCAS(T *p, T cmp, T v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
template <typename T> static inline T atomicExch(T *p, T v) {
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
static inline void __threadfence(void) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline void __threadfence_block(void) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* ---- integer and bit intrinsics ---- */
static inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
static inline int __popcll(unsigned long long x) {
    return __builtin_popcountll(x);
}
static inline int __ffs(int x) {
    return __builtin_ffs(x);
}
static inline int __ffsll(long long x) {
    return __builtin_ffsll(x);
}
static inline int __clz(int x) {
    return x ? __builtin_clz((unsigned)x) : 32;
}
static inline int __clzll(long long x) {
    return x ? __builtin_clzll((unsigned long long)x) : 64;
}
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
static inline float __uint_as_float(unsigned u) {
    return emu::bit_cast<float>(u);
}
static inline float __int_as_float(int u) {
    return emu::bit_cast<float>(u);
}
static inline unsigned __float_as_uint(float f) {
    return emu::bit_cast<unsigned>(f);
}
static inline int __float_as_int(float f) {
    return emu::bit_cast<int>(f);
}
static inline int min(int a, int b) {
    return a < b ? a : b;
}
static inline int max(int a, int b) {
    return a > b ? a : b;
}
static inline unsigned min(unsigned a, unsigned b) {
    return a < b ? a : b;
}
static inline unsigned max(unsigned a, unsigned b) {
    return a > b ? a : b;
}
static inline long long min(long long a, long long b) {
    return a < b ? a : b;
}
static inline long long max(long long a, long long b) {
    return a > b ? a : b;
}
static inline unsigned long long min(unsigned long long a, unsigned long long b) {
    return a < b ? a : b;
}
static inline unsigned long long max(unsigned long long a, unsigned long long b) {
    return a > b ? a : b;
}
static inline float min(float a, float b) {
    return fminf(a, b);
}
static inline float max(float a, float b) {
    return fmaxf(a, b);
}

/* ---- float intrinsics. The fast-math ones (__expf, __logf, rsqrtf, ...)
 * are approximations on hardware (a few ulp); here they are the libm
 * functions (glibc itself declares __expf, __logf, __sinf, ... as aliases of
 * expf, logf, sinf), so their results are not bit-exact with a GPU. ---- */
static inline float __fdividef(float a, float b) {
    return a / b;
}
static inline float __frcp_rn(float a) {
    return 1.0f / a;
}
static inline float __fsqrt_rn(float a) {
    return sqrtf(a);
}
static inline float rsqrtf(float x) {
    return 1.0f / sqrtf(x);
}
static inline float __fmaf_rn(float a, float b, float c) {
    return fmaf(a, b, c);
}
static inline float __fadd_rn(float a, float b) {
    return a + b;
}
static inline float __fmul_rn(float a, float b) {
    return a * b;
}
static inline float __saturatef(float x) {
    return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x;
}
template <typename T> static inline T __ldg(const T *p) {
    return *p;
}

/* ---- C++ conveniences of cuda_runtime.h ---- */
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t n) {
    return cudaMalloc((void **)p, n);
}
template <typename T> static inline cudaError_t cudaMallocHost(T **p, size_t n) {
    return cudaMallocHost((void **)p, n);
}

/* ---- kernel-keyed runtime calls ---- */
template <typename T> static inline cudaError_t cudaFuncSetAttribute(T *func, cudaFuncAttribute attr, int value) {
    return emu_func_set_attribute(reinterpret_cast<const void *>(func), attr, value);
}
template <typename T> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, T *func) {
    return emu_func_get_attributes(a, reinterpret_cast<const void *>(func));
}
template <typename T>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, T func, int threads, size_t smem) {
    return emu_occupancy(n, reinterpret_cast<const void *>(func), threads, smem);
}

#endif
