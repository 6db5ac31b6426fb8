/*
 * comm/codec/forms.c — the wire forms' host descriptors (codec_cpu.h's
 * echo_form_desc), one per row of comm/codec/echo_codec.h's form table, and
 * the host's record-form entry points, which run a form's loops for the
 * table's ISA where its row names them and the scalar loops otherwise. No
 * other host file tells forms apart.
 */
#include "comm/codec/codec_cpu.h"
#include "comm/codec/echo_codec.h"

/* A row's record bytes as a function of G. */
#define ECHO_X(id, name, bits, rb, enc, dec, avx2, avx512)                                                             \
    static int rec_bytes_##id(int G) {                                                                                 \
        (void)G;                                                                                                       \
        return rb;                                                                                                     \
    }
ECHO_ALL_FORMS(ECHO_X)
#undef ECHO_X

/* The per-ISA slots: a form's loops where this build has the ISA. */
#define ECHO_NO_FAST {NULL, NULL, 0}
#ifdef ECHO_HAVE_CODEC_AVX2
#define ECHO_FAST(stem, min_group) {stem##_enc, stem##_dec, min_group}
#else
#define ECHO_FAST(stem, min_group) ECHO_NO_FAST
#endif

static const echo_form_desc forms[] = {
#define ECHO_X(fid, nm, bits, rb, enc, dec, avx2, avx512)                                                              \
    {.id = fid,                                                                                                         \
     .name = nm,                                                                                                       \
     .code_bits = bits,                                                                                                \
     .rec_bytes = rec_bytes_##fid,                                                                                      \
     .enc_group = enc,                                                                                                 \
     .dec_group = dec,                                                                                                 \
     .fast = {ECHO_NO_FAST, avx2, avx512}},
    ECHO_ALL_FORMS(ECHO_X)
#undef ECHO_X
};

const echo_form_desc *echo_form_all(int *n) {
    *n = (int)(sizeof forms / sizeof *forms);
    return forms;
}

const echo_form_desc *echo_form_get(int form) {
    for (size_t k = 0; k < sizeof forms / sizeof *forms; k++)
        if (forms[k].id == form) return &forms[k];
    return NULL;
}

/* Table t's loops of `form` at group G, or NULL for the scalar ones. */
static const echo_form_fast *fast_of(const echo_cpu_codec *t, int form, int G) {
    const echo_form_desc *d = echo_form_get(form);
    if (!d || t->isa <= ECHO_ISA_SCALAR || t->isa >= ECHO_ISA_COUNT) return NULL;
    const echo_form_fast *f = &d->fast[t->isa];
    if (!f->enc || !f->dec || G < f->min_group || G > ECHO_MAX_GROUP || (G & (G - 1))) return NULL;
    return f;
}

size_t echo_cpu_rec_encode(const echo_cpu_codec *t, int form, const float *y, float *res, int res_valid, size_t n,
                           int group, uint8_t *codes, uint8_t *recs, size_t *bad) {
    const echo_form_fast *f = fast_of(t, form, group);
    if (!f || n % (size_t)group) return echo_scalar_rec_encode(form, y, res, res_valid, n, group, codes, recs, bad);
    *bad = ECHO_NO_INDEX;
    return f->enc(y, res, res_valid, n, group, codes, recs, bad);
}

void echo_cpu_rec_decode(const echo_cpu_codec *t, int form, const uint8_t *codes, const uint8_t *recs, size_t n,
                         int group, float *out, int accumulate) {
    const echo_form_fast *f = fast_of(t, form, group);
    size_t ng = f ? n / (size_t)group : 0, off = ng * (size_t)group;
    if (ng) f->dec(codes, recs, ng, group, out, accumulate);
    if (off < n)
        echo_scalar_rec_decode(form, codes + echo_form_code_bytes(form, off),
                               recs + ng * (size_t)echo_rec_bytes(form, group), n - off, group, out + off, accumulate);
}
