/*
 * comm/codec/codec_cpu.h — private to comm/: the host codec's loops as a table
 * of implementations, so the fastest one this CPU can run is picked at run
 * time and the tests can run every one against the scalar reference.
 *
 * Every table computes the same bits as `echo_cpu_codec_scalar` (the
 * portable C loops of codec.c over comm/codec/echo_codec.h, which the CUDA kernels
 * match): the same IEEE operations in the same order, or others proven to
 * round the same (an FMA whose product is exact, a reciprocal whose result
 * is checked: comm/codec/codec_avx512.c), a rotated NaN's payload aside
 * (comm/codec/codec_avx2.c).
 * The int4 entry points have the signatures and contracts of
 * echo_cpu_encode, echo_cpu_decode and echo_cpu_decode_store
 * (comm/echo_internal.h), which call the selected table; the rotation and
 * record-form entries serve codec.c's staged codecs (hadamard, hsub6, out2,
 * hout2).
 */
#ifndef ECHO_COMM_CODEC_CPU_H
#define ECHO_COMM_CODEC_CPU_H

#include "comm/echo_internal.h"

typedef struct echo_cpu_codec {
    const char *name;
    size_t (*encode)(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t n, int group,
                     uint8_t *codes, uint16_t *scales, size_t *bad);
    void (*decode)(const uint8_t *codes, const uint16_t *scales, size_t n, int group, float *out, int accumulate);
    size_t (*decode_store)(const uint8_t *codes, const uint16_t *scales, size_t n, int group, void *out, echo_dtype dt,
                           size_t *bad);
    /* The rotation of the rotating codecs (comm/codec/echo_codec.h, echo_had_fwd
     * over blocks of `group`): out[0..np) = H D of x[0..n) zero-padded to np
     * (a multiple of group, >= n). rot_inv: in[0..pad(n)) rotated back in
     * place; when out != NULL also out[0..n) = in rounded to dt, or
     * (accumulate, fp32 only) out += in. */
    void (*rot_fwd)(const void *x, echo_dtype dt, size_t n, size_t np, int group, float *out);
    void (*rot_inv)(float *in, size_t n, int group, void *out, echo_dtype dt, int accumulate);
    /* The record forms (ECHO_FORM_HSUB, _OUT2, _HOUT2) over whole groups of
     * fp32 y[0..n), n a multiple of group: codes and one record per group
     * (echo_rec_encode_group); y + res coded when res_valid, res = the fp32
     * residual when res != NULL. Returns the number of poisoned groups, *bad
     * the first element of the first (ECHO_NO_INDEX if none). rec_decode:
     * out[0..n) = (or +=) the decoded values; a partial last group decodes
     * its first n % group values. */
    size_t (*rec_encode)(int form, const float *y, float *res, int res_valid, size_t n, int group, uint8_t *codes,
                         uint8_t *recs, size_t *bad);
    void (*rec_decode)(int form, const uint8_t *codes, const uint8_t *recs, size_t n, int group, float *out,
                       int accumulate);
    /* out[0..n) += in (fp32; the accumulator the add's first operand). */
    void (*add)(const float *in, size_t n, float *out);
} echo_cpu_codec;

/* CALL(G) with every legal group size G as a constant (the vector tables'
 * loops are specialised per G), FALLBACK for any other. */
#define ECHO_CPU_FOR_EACH_G(group, CALL, FALLBACK)                                                                     \
    switch (group) {                                                                                                   \
    case 16: CALL(16); break;                                                                                          \
    case 32: CALL(32); break;                                                                                          \
    case 64: CALL(64); break;                                                                                          \
    case 128: CALL(128); break;                                                                                        \
    case 256: CALL(256); break;                                                                                        \
    default: FALLBACK; break;                                                                                          \
    }

/* The reference: portable C, vectorized by the compiler for the baseline ISA. */
extern const echo_cpu_codec echo_cpu_codec_scalar;
/* The scalar rec_decode of what a vector table left: the groups from ng on
 * of out[0..n), a partial last one included. */
void echo_cpu_rec_decode_rest(int form, const uint8_t *codes, const uint8_t *recs, size_t ng, size_t n, int group,
                              float *out, int accumulate);

#if defined(__x86_64__) || defined(__i386__)
#define ECHO_HAVE_CODEC_AVX2 1
/* AVX2 intrinsics (codec_avx2.c); only callable when the CPU has AVX2. Full
 * groups are vectorized; a partial last group goes to the scalar table. */
extern const echo_cpu_codec echo_cpu_codec_avx2;
/* Its entries, for tables that reuse them. */
size_t echo_avx2_encode(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t n,
                        int group, uint8_t *codes, uint16_t *scales, size_t *bad);
void echo_avx2_decode(const uint8_t *codes, const uint16_t *scales, size_t n, int group, float *out, int accumulate);
size_t echo_avx2_decode_store(const uint8_t *codes, const uint16_t *scales, size_t n, int group, void *out,
                              echo_dtype dt, size_t *bad);
void echo_avx2_rot_fwd(const void *x, echo_dtype dt, size_t n, size_t np, int group, float *out);
void echo_avx2_rot_inv(float *in, size_t n, int group, void *out, echo_dtype dt, int accumulate);
void echo_avx2_add(const float *in, size_t n, float *out);
/* The entries the AVX2 and AVX-512 tables share. */
#define ECHO_CPU_CODEC_AVX2_SHARED                                                                                     \
    .decode = echo_avx2_decode, .decode_store = echo_avx2_decode_store, .rot_fwd = echo_avx2_rot_fwd,                  \
    .rot_inv = echo_avx2_rot_inv, .add = echo_avx2_add

#define ECHO_HAVE_CODEC_AVX512 1
/* AVX-512 (F, BW, VL, DQ) with FMA and BMI (codec_avx512.c): its own out2
 * and hout2 record loops and int4 encode, the AVX2 table's other entries;
 * only callable when the CPU has all of those and AVX2
 * (echo_cpu_codec_avx512_ok). */
extern const echo_cpu_codec echo_cpu_codec_avx512;
int echo_cpu_codec_avx512_ok(void);
#endif

/* The table this CPU runs: the fastest it has, unless the environment
 * variable ECHO_CODEC_ISA (read on every call) caps it: "scalar" or "avx2"
 * (the best table not above that one; any other value, or none, caps
 * nothing). A pure function of the CPU and the environment (no state to
 * set or forget), so every rank of a process and every call agree; the cap
 * is for measuring the tables against each other in one binary. */
const echo_cpu_codec *echo_cpu_codec_best(void);

#endif
