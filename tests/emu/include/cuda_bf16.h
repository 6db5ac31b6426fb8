/* Emulated cuda_bf16.h (tests/emu): bfloat16 storage and conversions,
 * round to nearest even like the hardware's cvt.rn.bf16.f32 (NaN becomes the
 * canonical 0x7fff); arithmetic on bf16 rounds each result to bf16, as
 * CUDA's operators do. */
#ifndef ECHO_EMU_CUDA_BF16_H
#define ECHO_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

#include "cuda_fp16.h"
#include "cuda_runtime.h"

struct __nv_bfloat16_raw {
    unsigned short x;
};

static inline unsigned short emu_f32_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static inline float emu_bf16_bits_to_f32(unsigned short b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
    __nv_bfloat16(float f) : __x(emu_f32_to_bf16_bits(f)) {}
    operator float() const { return emu_bf16_bits_to_f32(__x); }
    operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};

struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline float __bfloat162float(__nv_bfloat16 h) {
    return emu_bf16_bits_to_f32(h.__x);
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    __nv_bfloat16 h;
    h.__x = emu_f32_to_bf16_bits(f);
    return h;
}
static inline __nv_bfloat16 __float2bfloat16(float f) {
    return __float2bfloat16_rn(f);
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    __nv_bfloat162 r;
    r.x = __float2bfloat16_rn(a);
    r.y = __float2bfloat16_rn(b);
    return r;
}
static inline __nv_bfloat162 __float22bfloat162_rn(float2 f) {
    return __floats2bfloat162_rn(f.x, f.y);
}
static inline float2 __bfloat1622float2(__nv_bfloat162 h) {
    return make_float2(__bfloat162float(h.x), __bfloat162float(h.y));
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) {
    return h.__x;
}
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    __nv_bfloat16 h;
    h.__x = u;
    return h;
}
#define EMU_BF16_OP(op)                                                                                                \
    static inline __nv_bfloat16 operator op(__nv_bfloat16 a, __nv_bfloat16 b) {                                        \
        return __float2bfloat16_rn(__bfloat162float(a) op __bfloat162float(b));                                       \
    }
EMU_BF16_OP(+)
EMU_BF16_OP(-)
EMU_BF16_OP(*)
EMU_BF16_OP(/)
#undef EMU_BF16_OP

#endif
