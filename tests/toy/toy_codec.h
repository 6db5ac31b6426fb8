/*
 * tests/toy/toy_codec.h — a toy codec with a wire form of its own, added to
 * comm/ through its tables alone (issue 34): the build of tests/toy/
 * compiles comm/'s C files with
 *   -DECHO_EXTRA_FORMS_FILE='"tests/toy/toy_codec.h"'   (echo_codec.h: the form row)
 *   -DECHO_EXTRA_CODEC_IDS='ECHO_CODEC_TOY,'            (echo.h: the enum value)
 *   -DECHO_EXTRA_CODEC_ROWS=...                         (preset.c: the codec row)
 * and nothing else of comm/ changes. The form: int4 codes under an fp32
 * scale, scale = max|y| / 7; host memory only (scalar
 * loops: the SIMD tables send a form they do not know to scalar).
 */
#ifndef ECHO_TESTS_TOY_CODEC_H
#define ECHO_TESTS_TOY_CODEC_H

#define ECHO_FORM_TOY 9
#define ECHO_TOY_REC 6 /* the group's bf16 scale (every record starts with it: the poison mark), then the fp32 one */

ECHO_HD uint16_t toy_encode_group(const float *y, int G, uint8_t *codes, uint8_t *rec, float *r, int n) {
    uint32_t m = 0;
    for (int i = 0; i < G; i++)
        m = echo_abs_bits(y[i]) > m ? echo_abs_bits(y[i]) : m;
    uint16_t sb = m >= ECHO_LIMIT_BITS ? ECHO_SCALE_POISON : echo_scale_from_absbits(m); /* for the poison check */
    float amax = 0.0f;
    memcpy(&amax, &m, 4);
    float s = echo_scale_is_poison(sb) ? 0.0f : amax / 7.0f;
    rec[0] = (uint8_t)sb, rec[1] = (uint8_t)(sb >> 8);
    memcpy(rec + 2, &s, 4);
    for (int i = 0; i < G; i += 2) {
        float q0 = s > 0.0f ? echo_code(y[i], s) : 0.0f, q1 = s > 0.0f ? echo_code(y[i + 1], s) : 0.0f;
        codes[i / 2] = echo_pack2((int)q0, (int)q1);
        for (int t = 0; r && t < 2; t++)
            if (i + t < n) r[i + t] = echo_scale_is_poison(sb) ? 0.0f : echo_sub(y[i + t], echo_mul(t ? q1 : q0, s));
    }
    return sb;
}

ECHO_HD uint16_t toy_decode_group(const uint8_t *codes, const uint8_t *rec, int G, float *v) {
    float s;
    memcpy(&s, rec + 2, 4);
    for (int i = 0; i < G; i += 2) {
        v[i] = echo_mul((float)echo_nib_lo(codes[i / 2]), s);
        v[i + 1] = echo_mul((float)echo_nib_hi(codes[i / 2]), s);
    }
    return (uint16_t)(rec[0] | (rec[1] << 8));
}

/* its row of the form table (echo_codec.h: id, name, code bits, record
 * bytes, group functions, no vector loops: the scalar ones on the host) */
#define ECHO_EXTRA_FORMS(X)                                                                                            \
    X(ECHO_FORM_TOY, "toy", 4, ECHO_TOY_REC, toy_encode_group, toy_decode_group, ECHO_NO_FAST, ECHO_NO_FAST)

#endif
