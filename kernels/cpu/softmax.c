/*
 * cpu: attention's softmax row (cpu_softmax) and the expf it uses.
 *
 * cpu_expf is glibc's expf (since 2.28; ARM's optimized-routines
 * algorithm) operation for operation as x86-64 glibc's FMA build runs it:
 * x·N/ln2 rounded through a shift, a 32-entry table of 2^(i/32), and a
 * cubic in double, with the three multiply-adds fused. |x| >= 88 and NaN
 * go to libm's expf itself. So it returns libm's bits there (checked over
 * every float on the development VM), and the vector path computes
 * exactly the same double operations four lanes at a time, so every path
 * gives the same bits; libm is called per element only for the rare
 * lane out of range.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* glibc's __exp2f_data: tab[i] = bits(2^(i/32)) - (i << 47), then the
 * scaled constants (N = 32). */
static const uint64_t expf_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
#define EXPF_INVLN2N 0x1.71547652b82fep+5  /* 32 / ln 2 */
#define EXPF_SHIFT 0x1.8p+52
#define EXPF_C0 0x1.c6af84b912394p-20      /* poly_scaled */
#define EXPF_C1 0x1.ebfce50fac4f3p-13
#define EXPF_C2 0x1.62e42ff0c52d6p-6
#define EXPF_TOP 0x42b /* top12(88.0f): from here on (and NaN, inf) libm's own path */

static int expf_special(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return ((u >> 20) & 0x7ff) >= EXPF_TOP;
}

float cpu_expf(float x) {
    if (expf_special(x)) return expf(x);
    double xd = (double)x, kd = fma(EXPF_INVLN2N, xd, EXPF_SHIFT);
    uint64_t ki, t;
    memcpy(&ki, &kd, 8);
    kd -= EXPF_SHIFT;
    double r = fma(EXPF_INVLN2N, xd, -kd);
    t = expf_tab[ki % 32] + (ki << 47);
    double s;
    memcpy(&s, &t, 8);
    double z = fma(EXPF_C0, r, EXPF_C1), r2 = r * r, y = fma(EXPF_C2, r, 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}

/* The softmax row, portable: the reference every path equals. */
static void softmax_c(float *s, int len, float scale) {
    float mx = -INFINITY;
    for (int p = 0; p < len; p++) {
        s[p] *= scale;
        if (s[p] > mx) mx = s[p];
    }
    double sum = 0;
    for (int p = 0; p < len; p++) {
        s[p] = cpu_expf(s[p] - mx);
        sum += s[p];
    }
    float inv = (float)(1.0 / sum);
    for (int p = 0; p < len; p++) s[p] *= inv;
}

#define A256 __attribute__((target("avx2,fma")))

/* cpu_expf of four floats widened to double, none of them special. */
A256 static inline __m128 expf4(__m128 x) {
    const __m256d inv = _mm256_set1_pd(EXPF_INVLN2N), shift = _mm256_set1_pd(EXPF_SHIFT);
    __m256d xd = _mm256_cvtps_pd(x), kd = _mm256_fmadd_pd(inv, xd, shift);
    __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    __m256d r = _mm256_fmsub_pd(inv, xd, kd);
    __m256i t = _mm256_i64gather_epi64((const long long *)expf_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));
    __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(EXPF_C0), r, _mm256_set1_pd(EXPF_C1)), r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(EXPF_C2), r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

/* softmax_c's operations, eight lanes at a time where they are
 * elementwise; the max is exact in any order (a NaN is skipped as the
 * scalar compare skips it; which zero wins does not change x - max), and
 * the double sum still adds the values one by one in order. */
A256 static void softmax256(float *s, int len, float scale) {
    const __m256 sc = _mm256_set1_ps(scale);
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    int p = 0;
    for (; p + 8 <= len; p += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + p), sc);
        _mm256_storeu_ps(s + p, v);
        vmx = _mm256_max_ps(v, vmx); /* a NaN in v leaves vmx */
    }
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, vmx);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > mx) mx = lanes[l];
    for (; p < len; p++) {
        s[p] *= scale;
        if (s[p] > mx) mx = s[p];
    }
    const __m256 vm = _mm256_set1_ps(mx);
    const __m256i top = _mm256_set1_epi32(EXPF_TOP - 1), m11 = _mm256_set1_epi32(0x7ff);
    double sum = 0;
    for (p = 0; p + 8 <= len; p += 8) {
        __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + p), vm);
        __m256i at = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), m11);
        if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(at, top))) {
            float xs[8];
            _mm256_storeu_ps(xs, x);
            for (int l = 0; l < 8; l++) s[p + l] = cpu_expf(xs[l]);
        } else {
            _mm_storeu_ps(s + p, expf4(_mm256_castps256_ps128(x)));
            _mm_storeu_ps(s + p + 4, expf4(_mm256_extractf128_ps(x, 1)));
        }
        for (int l = 0; l < 8; l++) sum += s[p + l];
    }
    for (; p < len; p++) {
        s[p] = cpu_expf(s[p] - mx);
        sum += s[p];
    }
    const float inv = (float)(1.0 / sum);
    const __m256 vi = _mm256_set1_ps(inv);
    for (p = 0; p + 8 <= len; p += 8) _mm256_storeu_ps(s + p, _mm256_mul_ps(_mm256_loadu_ps(s + p), vi));
    for (; p < len; p++) s[p] *= inv;
}

void cpu_softmax(int isa, float *s, int len, float scale) {
    if (isa >= CPU_ISA_AVX2)
        softmax256(s, len, scale);
    else
        softmax_c(s, len, scale);
}
