/*
 * Emulated WMMA (nvcuda::wmma, tests/emu): 16x16x16 fragments of bf16/half
 * inputs and fp32 accumulators, the shapes kernels/cuda/cuda_attention.cu
 * uses.
 *
 * load_matrix_sync, store_matrix_sync and mma_sync are warp collectives:
 * all 32 lanes must arrive at the same call with the same pointer, leading
 * dimension and layout (checked, as are WMMA's alignment rules: 32-byte
 * aligned pointers, ldm a multiple of 16 bytes). The element layout of a
 * fragment (which lane holds which (row, col) in x[]) is unspecified by
 * CUDA; here it is a fixed scrambled permutation per fragment kind, so code
 * may only rely on what CUDA guarantees: the layout of one fragment type is
 * the same for load, mma and store. mma_sync computes each element's sum of
 * exact products in double and rounds once to fp32 (tensor cores differ in
 * the last bits).
 */
#ifndef ECHO_EMU_MMA_H
#define ECHO_EMU_MMA_H

#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace emu {
/* map[kind][lane * 8 + i] = row * 16 + col; kind 0 matrix_a, 1 matrix_b,
 * 2 accumulator */
static inline const unsigned short *wmma_map(int kind) {
    struct Maps {
        unsigned short m[3][256];
        Maps() {
            for (int k = 0; k < 3; k++) {
                for (int i = 0; i < 256; i++)
                    m[k][i] = (unsigned short)i;
                uint64_t r = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1);
                for (int i = 255; i > 0; i--) {
                    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                    int j = (int)(r % (uint64_t)(i + 1));
                    unsigned short t = m[k][i];
                    m[k][i] = m[k][j];
                    m[k][j] = t;
                }
            }
        }
    };
    static const Maps maps;
    return maps.m[kind];
}
static inline float wmma_f(float v) {
    return v;
}
static inline float wmma_f(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
static inline float wmma_f(__half v) {
    return __half2float(v);
}
template <typename T> static inline T wmma_from(float v);
template <> inline float wmma_from<float>(float v) {
    return v;
}
template <> inline __nv_bfloat16 wmma_from<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
struct WmmaArgs {
    const void *p;
    unsigned ldm;
    int col_major;
};
static inline void wmma_check(const void *const *ins, unsigned mask, size_t es, const char *f, int l) {
    if (mask != 0xffffffffu) die(f, l, "wmma operation with mask 0x%08x: all 32 lanes must take part", mask);
    const WmmaArgs *a0 = (const WmmaArgs *)ins[0];
    for (int i = 1; i < 32; i++) {
        const WmmaArgs *a = (const WmmaArgs *)ins[i];
        if (a->p != a0->p || a->ldm != a0->ldm || a->col_major != a0->col_major)
            die(f, l, "wmma: lane %d passes (%p, ldm %u, layout %d), lane 0 (%p, ldm %u, layout %d)", i, a->p, a->ldm,
                a->col_major, a0->p, a0->ldm, a0->col_major);
    }
    if ((uintptr_t)a0->p % 32) die(f, l, "wmma: pointer %p is not 32-byte aligned", a0->p);
    if ((a0->ldm * es) % 16) die(f, l, "wmma: ldm %u is not a multiple of 16 bytes", a0->ldm);
}
} // namespace emu

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use> struct emu_kind;
template <> struct emu_kind<matrix_a> { static const int k = 0; };
template <> struct emu_kind<matrix_b> { static const int k = 1; };
template <> struct emu_kind<accumulator> { static const int k = 2; };
template <typename L> struct emu_col;
template <> struct emu_col<row_major> { static const int v = 0; };
template <> struct emu_col<col_major> { static const int v = 1; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> class fragment {
    static_assert(M == 16 && N == 16 && K == 16, "emulated wmma: 16x16x16 only");

  public:
    static constexpr int num_elements = 8;
    typedef T element_type;
    T x[num_elements];
};

template <typename Use, typename T, typename L>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float v) {
    for (int i = 0; i < 8; i++)
        f.x[i] = emu::wmma_from<T>(v);
}

/* every lane fills its own elements from memory once all arrived */
template <int Kind, typename Frag, typename T>
static void emu_load_fn(const void *const *ins, void *const *outs, unsigned mask, const char *f, int l) {
    emu::wmma_check(ins, mask, sizeof(T), f, l);
    const emu::WmmaArgs *a = (const emu::WmmaArgs *)ins[0];
    const T *p = (const T *)a->p;
    const unsigned short *map = emu::wmma_map(Kind);
    for (int lane = 0; lane < 32; lane++) {
        Frag *fr = (Frag *)outs[lane];
        for (int i = 0; i < 8; i++) {
            int rc = map[lane * 8 + i], r = rc / 16, c = rc % 16;
            fr->x[i] = a->col_major ? p[(size_t)c * a->ldm + r] : p[(size_t)r * a->ldm + c];
        }
    }
}

#define EMU_WMMA_SITE const char *emu_file = __builtin_FILE(), int emu_line = __builtin_LINE()

template <typename Use, typename T, typename L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &fr, const T *p, unsigned ldm, EMU_WMMA_SITE) {
    emu::WmmaArgs a = {p, ldm, emu_col<L>::v};
    emu::warp_op(emu::W_CUSTOM, emu_file, emu_line, 0xffffffffu, &a, &fr,
                 emu_load_fn<emu_kind<Use>::k, fragment<Use, 16, 16, 16, T, L>, T>);
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &fr, const float *p, unsigned ldm,
                                    layout_t lay, EMU_WMMA_SITE) {
    emu::WmmaArgs a = {p, ldm, lay == mem_col_major};
    emu::warp_op(emu::W_CUSTOM, emu_file, emu_line, 0xffffffffu, &a, &fr,
                 emu_load_fn<2, fragment<accumulator, 16, 16, 16, float>, float>);
}

struct emu_store_in {
    emu::WmmaArgs a;
    const fragment<accumulator, 16, 16, 16, float> *fr;
};
static void emu_store_fn(const void *const *ins, void *const *outs, unsigned mask, const char *f, int l) {
    (void)outs;
    const void *args[32];
    for (int i = 0; i < 32; i++)
        args[i] = ins[i] ? &((const emu_store_in *)ins[i])->a : nullptr;
    emu::wmma_check(args, mask, sizeof(float), f, l);
    const emu::WmmaArgs *a = &((const emu_store_in *)ins[0])->a;
    float *p = (float *)a->p;
    const unsigned short *map = emu::wmma_map(2);
    for (int lane = 0; lane < 32; lane++) {
        const fragment<accumulator, 16, 16, 16, float> *fr = ((const emu_store_in *)ins[lane])->fr;
        for (int i = 0; i < 8; i++) {
            int rc = map[lane * 8 + i], r = rc / 16, c = rc % 16;
            (a->col_major ? p[(size_t)c * a->ldm + r] : p[(size_t)r * a->ldm + c]) = fr->x[i];
        }
    }
}
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &fr, unsigned ldm,
                                     layout_t lay, EMU_WMMA_SITE) {
    emu_store_in in = {{p, ldm, lay == mem_col_major}, &fr};
    emu::warp_op(emu::W_CUSTOM, emu_file, emu_line, 0xffffffffu, &in, nullptr, emu_store_fn);
}

template <typename TA, typename LA, typename TB, typename LB> struct emu_mma_in {
    const fragment<matrix_a, 16, 16, 16, TA, LA> *a;
    const fragment<matrix_b, 16, 16, 16, TB, LB> *b;
    const fragment<accumulator, 16, 16, 16, float> *c;
};
template <typename TA, typename LA, typename TB, typename LB>
static void emu_mma_fn(const void *const *ins, void *const *outs, unsigned mask, const char *f, int l) {
    if (mask != 0xffffffffu) emu::die(f, l, "wmma::mma_sync with mask 0x%08x", mask);
    float A[256], B[256], C[256];
    const unsigned short *ma = emu::wmma_map(0), *mb = emu::wmma_map(1), *mc = emu::wmma_map(2);
    for (int lane = 0; lane < 32; lane++) {
        const emu_mma_in<TA, LA, TB, LB> *in = (const emu_mma_in<TA, LA, TB, LB> *)ins[lane];
        for (int i = 0; i < 8; i++) {
            A[ma[lane * 8 + i]] = emu::wmma_f(in->a->x[i]);
            B[mb[lane * 8 + i]] = emu::wmma_f(in->b->x[i]);
            C[mc[lane * 8 + i]] = in->c->x[i];
        }
    }
    for (int lane = 0; lane < 32; lane++) {
        fragment<accumulator, 16, 16, 16, float> *d = (fragment<accumulator, 16, 16, 16, float> *)outs[lane];
        for (int i = 0; i < 8; i++) {
            int rc = mc[lane * 8 + i], r = rc / 16, c = rc % 16;
            double s = C[rc];
            for (int k = 0; k < 16; k++)
                s += (double)A[r * 16 + k] * (double)B[k * 16 + c];
            d->x[i] = (float)s;
        }
    }
}
template <typename TA, typename LA, typename TB, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, TA, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, TB, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c, EMU_WMMA_SITE) {
    emu_mma_in<TA, LA, TB, LB> in = {&a, &b, &c};
    emu::warp_op(emu::W_CUSTOM, emu_file, emu_line, 0xffffffffu, &in, &d, emu_mma_fn<TA, LA, TB, LB>);
}

} // namespace wmma
} // namespace nvcuda

#endif
