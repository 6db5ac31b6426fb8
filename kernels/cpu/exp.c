/*
 * cpu: exp and expf as glibc computes them, with vector paths of the same
 * bits: attention's softmax row (cpu_softmax) and the logits' sum of
 * exponentials (cpu_exp_sum, logits.c's log-sum-exp).
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

/* glibc's __exp_data (N = 128): 1/ln2·N, -ln2/N in two parts, the
 * quintic's C2..C5, the rounding shift, then per i the table's tail and
 * bits(2^(i/N)) - (i << 45). */
static const uint64_t exp_tab[256] = {
    0x0000000000000000, 0x3ff0000000000000, 0x3c9b3b4f1a88bf6e, 0x3feff63da9fb3335,
    0xbc7160139cd8dc5d, 0x3fefec9a3e778061, 0xbc905e7a108766d1, 0x3fefe315e86e7f85,
    0x3c8cd2523567f613, 0x3fefd9b0d3158574, 0xbc8bce8023f98efa, 0x3fefd06b29ddf6de,
    0x3c60f74e61e6c861, 0x3fefc74518759bc8, 0x3c90a3e45b33d399, 0x3fefbe3ecac6f383,
    0x3c979aa65d837b6d, 0x3fefb5586cf9890f, 0x3c8eb51a92fdeffc, 0x3fefac922b7247f7,
    0x3c3ebe3d702f9cd1, 0x3fefa3ec32d3d1a2, 0xbc6a033489906e0b, 0x3fef9b66affed31b,
    0xbc9556522a2fbd0e, 0x3fef9301d0125b51, 0xbc5080ef8c4eea55, 0x3fef8abdc06c31cc,
    0xbc91c923b9d5f416, 0x3fef829aaea92de0, 0x3c80d3e3e95c55af, 0x3fef7a98c8a58e51,
    0xbc801b15eaa59348, 0x3fef72b83c7d517b, 0xbc8f1ff055de323d, 0x3fef6af9388c8dea,
    0x3c8b898c3f1353bf, 0x3fef635beb6fcb75, 0xbc96d99c7611eb26, 0x3fef5be084045cd4,
    0x3c9aecf73e3a2f60, 0x3fef54873168b9aa, 0xbc8fe782cb86389d, 0x3fef4d5022fcd91d,
    0x3c8a6f4144a6c38d, 0x3fef463b88628cd6, 0x3c807a05b0e4047d, 0x3fef3f49917ddc96,
    0x3c968efde3a8a894, 0x3fef387a6e756238, 0x3c875e18f274487d, 0x3fef31ce4fb2a63f,
    0x3c80472b981fe7f2, 0x3fef2b4565e27cdd, 0xbc96b87b3f71085e, 0x3fef24dfe1f56381,
    0x3c82f7e16d09ab31, 0x3fef1e9df51fdee1, 0xbc3d219b1a6fbffa, 0x3fef187fd0dad990,
    0x3c8b3782720c0ab4, 0x3fef1285a6e4030b, 0x3c6e149289cecb8f, 0x3fef0cafa93e2f56,
    0x3c834d754db0abb6, 0x3fef06fe0a31b715, 0x3c864201e2ac744c, 0x3fef0170fc4cd831,
    0x3c8fdd395dd3f84a, 0x3feefc08b26416ff, 0xbc86a3803b8e5b04, 0x3feef6c55f929ff1,
    0xbc924aedcc4b5068, 0x3feef1a7373aa9cb, 0xbc9907f81b512d8e, 0x3feeecae6d05d866,
    0xbc71d1e83e9436d2, 0x3feee7db34e59ff7, 0xbc991919b3ce1b15, 0x3feee32dc313a8e5,
    0x3c859f48a72a4c6d, 0x3feedea64c123422, 0xbc9312607a28698a, 0x3feeda4504ac801c,
    0xbc58a78f4817895b, 0x3feed60a21f72e2a, 0xbc7c2c9b67499a1b, 0x3feed1f5d950a897,
    0x3c4363ed60c2ac11, 0x3feece086061892d, 0x3c9666093b0664ef, 0x3feeca41ed1d0057,
    0x3c6ecce1daa10379, 0x3feec6a2b5c13cd0, 0x3c93ff8e3f0f1230, 0x3feec32af0d7d3de,
    0x3c7690cebb7aafb0, 0x3feebfdad5362a27, 0x3c931dbdeb54e077, 0x3feebcb299fddd0d,
    0xbc8f94340071a38e, 0x3feeb9b2769d2ca7, 0xbc87deccdc93a349, 0x3feeb6daa2cf6642,
    0xbc78dec6bd0f385f, 0x3feeb42b569d4f82, 0xbc861246ec7b5cf6, 0x3feeb1a4ca5d920f,
    0x3c93350518fdd78e, 0x3feeaf4736b527da, 0x3c7b98b72f8a9b05, 0x3feead12d497c7fd,
    0x3c9063e1e21c5409, 0x3feeab07dd485429, 0x3c34c7855019c6ea, 0x3feea9268a5946b7,
    0x3c9432e62b64c035, 0x3feea76f15ad2148, 0xbc8ce44a6199769f, 0x3feea5e1b976dc09,
    0xbc8c33c53bef4da8, 0x3feea47eb03a5585, 0xbc845378892be9ae, 0x3feea34634ccc320,
    0xbc93cedd78565858, 0x3feea23882552225, 0x3c5710aa807e1964, 0x3feea155d44ca973,
    0xbc93b3efbf5e2228, 0x3feea09e667f3bcd, 0xbc6a12ad8734b982, 0x3feea012750bdabf,
    0xbc6367efb86da9ee, 0x3fee9fb23c651a2f, 0xbc80dc3d54e08851, 0x3fee9f7df9519484,
    0xbc781f647e5a3ecf, 0x3fee9f75e8ec5f74, 0xbc86ee4ac08b7db0, 0x3fee9f9a48a58174,
    0xbc8619321e55e68a, 0x3fee9feb564267c9, 0x3c909ccb5e09d4d3, 0x3feea0694fde5d3f,
    0xbc7b32dcb94da51d, 0x3feea11473eb0187, 0x3c94ecfd5467c06b, 0x3feea1ed0130c132,
    0x3c65ebe1abd66c55, 0x3feea2f336cf4e62, 0xbc88a1c52fb3cf42, 0x3feea427543e1a12,
    0xbc9369b6f13b3734, 0x3feea589994cce13, 0xbc805e843a19ff1e, 0x3feea71a4623c7ad,
    0xbc94d450d872576e, 0x3feea8d99b4492ed, 0x3c90ad675b0e8a00, 0x3feeaac7d98a6699,
    0x3c8db72fc1f0eab4, 0x3feeace5422aa0db, 0xbc65b6609cc5e7ff, 0x3feeaf3216b5448c,
    0x3c7bf68359f35f44, 0x3feeb1ae99157736, 0xbc93091fa71e3d83, 0x3feeb45b0b91ffc6,
    0xbc5da9b88b6c1e29, 0x3feeb737b0cdc5e5, 0xbc6c23f97c90b959, 0x3feeba44cbc8520f,
    0xbc92434322f4f9aa, 0x3feebd829fde4e50, 0xbc85ca6cd7668e4b, 0x3feec0f170ca07ba,
    0x3c71affc2b91ce27, 0x3feec49182a3f090, 0x3c6dd235e10a73bb, 0x3feec86319e32323,
    0xbc87c50422622263, 0x3feecc667b5de565, 0x3c8b1c86e3e231d5, 0x3feed09bec4a2d33,
    0xbc91bbd1d3bcbb15, 0x3feed503b23e255d, 0x3c90cc319cee31d2, 0x3feed99e1330b358,
    0x3c8469846e735ab3, 0x3feede6b5579fdbf, 0xbc82dfcd978e9db4, 0x3feee36bbfd3f37a,
    0x3c8c1a7792cb3387, 0x3feee89f995ad3ad, 0xbc907b8f4ad1d9fa, 0x3feeee07298db666,
    0xbc55c3d956dcaeba, 0x3feef3a2b84f15fb, 0xbc90a40e3da6f640, 0x3feef9728de5593a,
    0xbc68d6f438ad9334, 0x3feeff76f2fb5e47, 0xbc91eee26b588a35, 0x3fef05b030a1064a,
    0x3c74ffd70a5fddcd, 0x3fef0c1e904bc1d2, 0xbc91bdfbfa9298ac, 0x3fef12c25bd71e09,
    0x3c736eae30af0cb3, 0x3fef199bdd85529c, 0x3c8ee3325c9ffd94, 0x3fef20ab5fffd07a,
    0x3c84e08fd10959ac, 0x3fef27f12e57d14b, 0x3c63cdaf384e1a67, 0x3fef2f6d9406e7b5,
    0x3c676b2c6c921968, 0x3fef3720dcef9069, 0xbc808a1883ccb5d2, 0x3fef3f0b555dc3fa,
    0xbc8fad5d3ffffa6f, 0x3fef472d4a07897c, 0xbc900dae3875a949, 0x3fef4f87080d89f2,
    0x3c74a385a63d07a7, 0x3fef5818dcfba487, 0xbc82919e2040220f, 0x3fef60e316c98398,
    0x3c8e5a50d5c192ac, 0x3fef69e603db3285, 0x3c843a59ac016b4b, 0x3fef7321f301b460,
    0xbc82d52107b43e1f, 0x3fef7c97337b9b5f, 0xbc892ab93b470dc9, 0x3fef864614f5a129,
    0x3c74b604603a88d3, 0x3fef902ee78b3ff6, 0x3c83c5ec519d7271, 0x3fef9a51fbc74c83,
    0xbc8ff7128fd391f0, 0x3fefa4afa2a490da, 0xbc8dae98e223747d, 0x3fefaf482d8e67f1,
    0x3c8ec3bc41aa2008, 0x3fefba1bee615a27, 0x3c842b94c3a9eb32, 0x3fefc52b376bba97,
    0x3c8a64a931d185ee, 0x3fefd0765b6e4540, 0xbc8e37bae43be3ed, 0x3fefdbfdad9cbe14,
    0x3c77893b4d91cd9d, 0x3fefe7c1819e90d8, 0x3c5305c14160cc89, 0x3feff3c22b8f71f1,
};
#define EXP_INVLN2N 0x1.71547652b82fep+7
#define EXP_NEGLN2HIN -0x1.62e42fefa0000p-8
#define EXP_NEGLN2LON -0x1.cf79abc9e3b3ap-47
#define EXP_C2 0x1.ffffffffffdbdp-2
#define EXP_C3 0x1.555555555543cp-3
#define EXP_C4 0x1.55555cf172b91p-5
#define EXP_C5 0x1.1111167a4d017p-7
#define EXP_SHIFT 0x1.8p+52

/* glibc's exp (since 2.28) as its x86-64 FMA build runs it, for 2^-54 <=
 * |x| < 512 (exponent field 0x3c9 .. 0x407); elsewhere libm's exp. */
static int exp_special(double x) {
    uint64_t u;
    memcpy(&u, &x, 8);
    return ((u >> 52) & 0x7ff) - 0x3c9u > 0x3eu;
}

double cpu_exp(double x) {
    if (exp_special(x)) return exp(x);
    double kd = fma(x, EXP_INVLN2N, EXP_SHIFT);
    uint64_t ki, sbits;
    memcpy(&ki, &kd, 8);
    kd -= EXP_SHIFT;
    double r = fma(kd, EXP_NEGLN2HIN, x);
    r = fma(kd, EXP_NEGLN2LON, r);
    size_t idx = 2 * (ki % 128);
    double tail;
    memcpy(&tail, &exp_tab[idx], 8);
    sbits = exp_tab[idx + 1] + (ki << 45);
    double r2 = r * r, tmp = fma(fma(r, EXP_C3, EXP_C2), r2, r + tail);
    tmp = fma(r2 * r2, fma(r, EXP_C5, EXP_C4), tmp);
    double scale;
    memcpy(&scale, &sbits, 8);
    return fma(scale, tmp, scale);
}

static double exp_sum_c(const float *x, int n, float mx) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += cpu_exp((double)x[i] - (double)mx);
    return sum;
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

/* cpu_exp of four doubles, none of them special. */
A256 static inline __m256d exp4(__m256d x) {
    const __m256d shift = _mm256_set1_pd(EXP_SHIFT);
    __m256d kd = _mm256_fmadd_pd(x, _mm256_set1_pd(EXP_INVLN2N), shift);
    __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    __m256d r = _mm256_fmadd_pd(kd, _mm256_set1_pd(EXP_NEGLN2HIN), x);
    r = _mm256_fmadd_pd(kd, _mm256_set1_pd(EXP_NEGLN2LON), r);
    __m256i idx = _mm256_slli_epi64(_mm256_and_si256(ki, _mm256_set1_epi64x(127)), 1);
    __m256d tail = _mm256_castsi256_pd(_mm256_i64gather_epi64((const long long *)exp_tab, idx, 8));
    __m256i sb = _mm256_i64gather_epi64((const long long *)exp_tab + 1, idx, 8);
    __m256d scale = _mm256_castsi256_pd(_mm256_add_epi64(sb, _mm256_slli_epi64(ki, 45)));
    __m256d r2 = _mm256_mul_pd(r, r);
    __m256d tmp = _mm256_fmadd_pd(_mm256_fmadd_pd(r, _mm256_set1_pd(EXP_C3), _mm256_set1_pd(EXP_C2)), r2,
                                  _mm256_add_pd(r, tail));
    tmp = _mm256_fmadd_pd(_mm256_mul_pd(r2, r2), _mm256_fmadd_pd(r, _mm256_set1_pd(EXP_C5), _mm256_set1_pd(EXP_C4)),
                          tmp);
    return _mm256_fmadd_pd(scale, tmp, scale);
}

/* exp_sum_c four exponentials at a time, still added one by one in order. */
A256 static double exp_sum256(const float *x, int n, float mx) {
    const __m256d vm = _mm256_set1_pd((double)mx);
    const __m256i lo = _mm256_set1_epi64x(0x3c9), hi = _mm256_set1_epi64x(0x407), m11 = _mm256_set1_epi64x(0x7ff);
    double sum = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), vm), ev;
        __m256i at = _mm256_and_si256(_mm256_srli_epi64(_mm256_castpd_si256(d), 52), m11);
        __m256i out = _mm256_or_si256(_mm256_cmpgt_epi64(lo, at), _mm256_cmpgt_epi64(at, hi));
        if (_mm256_movemask_epi8(out)) {
            double e[4];
            _mm256_storeu_pd(e, d);
            for (int l = 0; l < 4; l++) e[l] = cpu_exp(e[l]);
            ev = _mm256_loadu_pd(e);
        } else {
            ev = exp4(d);
        }
        __m128d l2 = _mm256_castpd256_pd128(ev), h2 = _mm256_extractf128_pd(ev, 1);
        sum += _mm_cvtsd_f64(l2);
        sum += _mm_cvtsd_f64(_mm_unpackhi_pd(l2, l2));
        sum += _mm_cvtsd_f64(h2);
        sum += _mm_cvtsd_f64(_mm_unpackhi_pd(h2, h2));
    }
    for (; i < n; i++) sum += cpu_exp((double)x[i] - (double)mx);
    return sum;
}

double cpu_exp_sum(int isa, const float *x, int n, float mx) {
    return isa >= CPU_ISA_AVX2 ? exp_sum256(x, n, mx) : exp_sum_c(x, n, mx);
}

void cpu_softmax(int isa, float *s, int len, float scale) {
    if (isa >= CPU_ISA_AVX2)
        softmax256(s, len, scale);
    else
        softmax_c(s, len, scale);
}
