/* Emulated cuda_fp16.h (tests/emu): IEEE binary16 storage and the
 * conversions echo uses, exact (round to nearest even) like the hardware. */
#ifndef ECHO_EMU_CUDA_FP16_H
#define ECHO_EMU_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

struct __half_raw {
    unsigned short x;
};

struct __half {
    unsigned short __x;
    __half() = default;
    __half(__half_raw r) : __x(r.x) {}
    operator __half_raw() const { return __half_raw{__x}; }
};

static inline float __half2float(__half h) {
    uint32_t s = (uint32_t)(h.__x >> 15) << 31, e = (h.__x >> 10) & 0x1f, m = h.__x & 0x3ff, u;
    if (e == 0x1f) {
        u = s | 0x7f800000u | (m << 13);
    } else if (e) {
        u = s | ((e + 112) << 23) | (m << 13);
    } else if (m) { /* subnormal: normalise */
        int sh = 0;
        while (!(m & 0x400)) {
            m <<= 1;
            sh++;
        }
        u = s | ((uint32_t)(113 - sh) << 23) | ((m & 0x3ff) << 13);
    } else {
        u = s;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline __half __float2half_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    __half h;
    if (a > 0x7f800000u) {
        h.__x = (unsigned short)(s | 0x7fff);
    } else if (a >= 0x477ff000u) { /* rounds to >= 65520: inf */
        h.__x = (unsigned short)(s | 0x7c00);
    } else if (a < 0x38800000u) { /* below 2^-14: subnormal or zero */
        float af;
        memcpy(&af, &a, 4);
        float q = af * 16777216.0f; /* units of 2^-24; the multiply is exact */
        uint32_t n = (uint32_t)q;
        float frac = q - (float)n;
        if (frac > 0.5f || (frac == 0.5f && (n & 1))) n++;
        h.__x = (unsigned short)(s | n);
    } else {
        uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        h.__x = (unsigned short)(s | ((r - 0x38000000u) >> 13));
    }
    return h;
}

#endif
