/*
 * comm/codec/codec_cpu.h — private to comm/: the host codec's loops as a table
 * of implementations per ISA, so the fastest one this CPU can run is picked
 * at run time and the tests can run every one against the scalar reference;
 * and the wire forms' host descriptors (forms.c), built from echo_codec.h's
 * form table, which choose each form's loops per ISA.
 *
 * Every table computes the same bits as `echo_cpu_codec_scalar` (the
 * portable C loops of codec_scalar.c over comm/codec/echo_codec.h, which
 * the CUDA kernels match): the same IEEE operations in the same order, or
 * others proven to round the same (an FMA whose product is exact, a
 * reciprocal whose result is checked: comm/codec/codec_avx512.c), a rotated
 * NaN's payload aside (comm/codec/codec_avx2.c).
 * The int4 entry points have the signatures and contracts of
 * echo_cpu_encode, echo_cpu_decode and echo_cpu_decode_store
 * (comm/echo_internal.h), which call the selected table; the rotation
 * entries serve codec.c's staged codecs (hadamard, and the record forms).
 *
 * Files depend one way: codec.c -> forms.c -> codec_avx512.c ->
 * codec_avx2.c -> codec_scalar.c (a SIMD file calls the scalar loops for
 * what it leaves; nothing calls back up).
 */
#ifndef ECHO_COMM_CODEC_CPU_H
#define ECHO_COMM_CODEC_CPU_H

#include "comm/echo_internal.h"

/* The ISAs with a table: the index of a form's loops in echo_form_desc.fast. */
enum { ECHO_ISA_SCALAR, ECHO_ISA_AVX2, ECHO_ISA_AVX512, ECHO_ISA_COUNT };

typedef struct echo_cpu_codec {
    const char *name;
    int isa; /* ECHO_ISA_*: which loops of each wire form this table runs */
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
    /* out[0..n) += in (fp32; the accumulator the add's first operand). */
    void (*add)(const float *in, size_t n, float *out);
} echo_cpu_codec;

/* One ISA's loops of one record form (echo_codec.h's ECHO_FAST): enc codes
 * fp32 y[0..n), n whole groups, as echo_scalar_rec_encode does (*bad set to
 * ECHO_NO_INDEX by the caller); dec decodes ng whole groups into out (or
 * adds them to it). G is a power of two in [the row's min_group, 256]. */
typedef size_t (*echo_rec_enc_fn)(const float *y, float *res, int res_valid, size_t n, int G, uint8_t *codes,
                                  uint8_t *recs, size_t *bad);
typedef void (*echo_rec_dec_fn)(const uint8_t *codes, const uint8_t *recs, size_t ng, int G, float *out,
                                int accumulate);
typedef struct echo_form_fast {
    echo_rec_enc_fn enc; /* NULL: the scalar loops */
    echo_rec_dec_fn dec;
    int min_group;
} echo_form_fast;

/* The host's descriptor of a wire form: one per row of echo_codec.h's
 * ECHO_REC_FORMS (and a build's ECHO_EXTRA_FORMS), in forms.c. */
typedef struct echo_form_desc {
    int id; /* ECHO_FORM_* */
    const char *name;
    int code_bits;            /* a group's codes take G * code_bits / 8 bytes */
    int (*rec_bytes)(int G);  /* bytes of a group's record */
    uint16_t (*enc_group)(const float *y, int G, uint8_t *codes, uint8_t *rec, float *r, int n);
    uint16_t (*dec_group)(const uint8_t *codes, const uint8_t *rec, int G, float *v);
    echo_form_fast fast[ECHO_ISA_COUNT]; /* per ISA (ECHO_ISA_SCALAR's empty) */
} echo_form_desc;

/* The descriptor of `form`, NULL for one no row knows. */
const echo_form_desc *echo_form_get(int form);
/* The descriptors, in row order; *n their count. */
const echo_form_desc *echo_form_all(int *n);

/* The record forms on the host, table t's loops: fp32 y[0..n), whole groups
 * but for a partial last one (the scalar loops code it zero-padded): codes
 * and one record per group (echo_rec_encode_group); y + res coded when
 * res_valid, res = the fp32 residual when res != NULL. Returns the number
 * of poisoned groups, *bad the first element of the first (ECHO_NO_INDEX if
 * none). rec_decode: out[0..n) = (or +=) the decoded values; a partial last
 * group decodes its first n % group values. A form's vector loops run
 * where its row has them for t's ISA and G; the scalar loops otherwise. */
size_t echo_cpu_rec_encode(const echo_cpu_codec *t, int form, const float *y, float *res, int res_valid, size_t n,
                           int group, uint8_t *codes, uint8_t *recs, size_t *bad);
void echo_cpu_rec_decode(const echo_cpu_codec *t, int form, const uint8_t *codes, const uint8_t *recs, size_t n,
                         int group, float *out, int accumulate);
/* The scalar loops of the same (codec_scalar.c). */
size_t echo_scalar_rec_encode(int form, const float *y, float *res, int res_valid, size_t n, int group, uint8_t *codes,
                              uint8_t *recs, size_t *bad);
void echo_scalar_rec_decode(int form, const uint8_t *codes, const uint8_t *recs, size_t n, int group, float *out,
                            int accumulate);

/* The declarations of one ISA's loops of a form, stem_enc and stem_dec. */
#define ECHO_FORM_FAST_DECL(stem)                                                                                      \
    size_t stem##_enc(const float *y, float *res, int res_valid, size_t n, int G, uint8_t *codes, uint8_t *recs,     \
                      size_t *bad);                                                                                    \
    void stem##_dec(const uint8_t *codes, const uint8_t *recs, size_t ng, int G, float *out, int accumulate);

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
/* Its record forms' loops (echo_codec.h's rows name them). */
ECHO_FORM_FAST_DECL(echo_avx2_hsub)
ECHO_FORM_FAST_DECL(echo_avx2_out2)
ECHO_FORM_FAST_DECL(echo_avx2_hout2)
ECHO_FORM_FAST_DECL(echo_avx2_hnf3)
/* The entries the AVX2 and AVX-512 tables share. */
#define ECHO_CPU_CODEC_AVX2_SHARED                                                                                     \
    .decode = echo_avx2_decode, .decode_store = echo_avx2_decode_store, .rot_fwd = echo_avx2_rot_fwd,                  \
    .rot_inv = echo_avx2_rot_inv, .add = echo_avx2_add

#define ECHO_HAVE_CODEC_AVX512 1
/* AVX-512 (F, BW, VL, DQ) with FMA and BMI (codec_avx512.c): its own out2,
 * hout2 and hnf3 record loops and int4 encode, the AVX2 table's other entries;
 * only callable when the CPU has all of those and AVX2
 * (echo_cpu_codec_avx512_ok). */
extern const echo_cpu_codec echo_cpu_codec_avx512;
int echo_cpu_codec_avx512_ok(void);
ECHO_FORM_FAST_DECL(echo_avx512_out2)
ECHO_FORM_FAST_DECL(echo_avx512_hout2)
ECHO_FORM_FAST_DECL(echo_avx512_hnf3)
#endif

/* The table this CPU runs: the fastest it has, unless the environment
 * variable ECHO_CODEC_ISA (read on every call) caps it: "scalar" or "avx2"
 * (the best table not above that one; any other value, or none, caps
 * nothing). A pure function of the CPU and the environment (no state to
 * set or forget), so every rank of a process and every call agree; the cap
 * is for measuring the tables against each other in one binary. */
const echo_cpu_codec *echo_cpu_codec_best(void);

#endif
