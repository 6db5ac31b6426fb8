/*
 * comm/codec_cpu.h — private to comm/: the host codec's loops as a table
 * of implementations, so the fastest one this CPU can run is picked at run
 * time and the tests can run every one against the scalar reference.
 *
 * Every table computes the same bits as `echo_cpu_codec_scalar` (the
 * portable C loops of codec.c over comm/echo_codec.h, which the CUDA kernels
 * match): same IEEE operations in the same order, no FMA, no reciprocal.
 * The entry points have the signatures and contracts of echo_cpu_encode,
 * echo_cpu_decode and echo_cpu_decode_store (comm/echo_internal.h), which
 * call the selected table.
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
} echo_cpu_codec;

/* The reference: portable C, vectorized by the compiler for the baseline ISA. */
extern const echo_cpu_codec echo_cpu_codec_scalar;

#if defined(__x86_64__) || defined(__i386__)
#define ECHO_HAVE_CODEC_AVX2 1
/* AVX2 intrinsics (codec_avx2.c); only callable when the CPU has AVX2. Full
 * groups are vectorized; a partial last group goes to the scalar table. */
extern const echo_cpu_codec echo_cpu_codec_avx2;
#endif

/* The table this CPU runs: a pure function of the CPU's features (no state
 * to set or forget), so every rank of a world and every call agree. */
const echo_cpu_codec *echo_cpu_codec_best(void);

#endif
