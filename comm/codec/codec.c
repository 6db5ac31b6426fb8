/*
 * comm/codec/codec.c — the Echo group codec on host memory (the public API
 * of codec.h), and the host compute table (phase 1, phase 2, finish) the
 * schedule in echo.c runs for ranks whose buffers are in host memory.
 *
 * Contract: the arithmetic is comm/codec/echo_codec.h's, so the cuda twin
 * (echo_cuda.cu) produces the same bits. The loops are the ISA tables'
 * (codec_cpu.h: codec_scalar.c, codec_avx2.c, codec_avx512.c), picked per
 * call by echo_cpu_codec_best; the record forms go through their
 * descriptors (forms.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/codec/codec.h"
#include "comm/codec/codec_cpu.h"
#include "comm/codec/echo_codec.h"
#include "comm/echo_internal.h"

#define ECHO_INLINE static inline __attribute__((always_inline))


/* __builtin_cpu_supports reads what libgcc's constructor found in cpuid,
 * getenv scans the environment: cheap enough to ask per call (a call codes
 * a whole message), and nothing here can be set or go stale. */
const echo_cpu_codec *echo_cpu_codec_best(void) {
    const char *cap = getenv("ECHO_CODEC_ISA");
    if (cap && !strcmp(cap, "scalar")) return &echo_cpu_codec_scalar;
#ifdef ECHO_HAVE_CODEC_AVX2
    if (!(cap && !strcmp(cap, "avx2")) && echo_cpu_codec_avx512_ok()) return &echo_cpu_codec_avx512;
    if (__builtin_cpu_supports("avx2")) return &echo_cpu_codec_avx2;
#endif
    return &echo_cpu_codec_scalar;
}

const char *echo_codec_host_isa(void) {
    return echo_cpu_codec_best()->name;
}

size_t echo_cpu_encode(const void *x, echo_dtype xdt, float *res, int res_valid, echo_resid rmode, size_t n, int group,
                       uint8_t *codes, uint16_t *scales, size_t *bad) {
    return echo_cpu_codec_best()->encode(x, xdt, res, res_valid, rmode, n, group, codes, scales, bad);
}

void echo_cpu_decode(const uint8_t *codes, const uint16_t *scales, size_t n, int group, float *out, int accumulate) {
    echo_cpu_codec_best()->decode(codes, scales, n, group, out, accumulate);
}

size_t echo_cpu_decode_store(const uint8_t *codes, const uint16_t *scales, size_t n, int group, void *out,
                             echo_dtype dt, size_t *bad) {
    return echo_cpu_codec_best()->decode_store(codes, scales, n, group, out, dt, bad);
}


#define ECHO_BLOCK 256 /* echo_cpu_store's blocks, as codec_scalar.c's echo_cpu_load */

/* Returns the largest |.| bits of the block (inf/nan are the largest). */
ECHO_INLINE uint32_t store_block(const float *restrict in, size_t n, void *out, echo_dtype dt) {
    uint32_t mx = 0;
    if (dt == ECHO_F32) {
        float *restrict o = out;
        for (size_t i = 0; i < n; i++) {
            uint32_t a = echo_abs_bits(in[i]);
            mx = a > mx ? a : mx;
            o[i] = in[i];
        }
    } else {
        uint16_t *restrict o = out;
        for (size_t i = 0; i < n; i++) {
            uint32_t a = echo_abs_bits(in[i]);
            mx = a > mx ? a : mx;
            o[i] = echo_f32_to_bf16(in[i]);
        }
    }
    return mx;
}

void echo_cpu_store(const float *in, size_t n, void *out, echo_dtype dt, size_t *bad) {
    size_t esz = echo_dtype_size(dt);
    *bad = ECHO_NO_INDEX;
    for (size_t b = 0; b < n; b += ECHO_BLOCK) {
        size_t m = n - b;
        uint32_t mx = m >= ECHO_BLOCK ? store_block(in + b, ECHO_BLOCK, (char *)out + b * esz, dt)
                                      : store_block(in + b, m, (char *)out + b * esz, dt);
        if (mx >= ECHO_INF_BITS && *bad == ECHO_NO_INDEX) {
            size_t k = 0;
            while (echo_abs_bits(in[b + k]) < ECHO_INF_BITS)
                k++;
            *bad = b + k;
        }
    }
}

/* ---- public codec API ---- */

static int group_ok(int group) {
    return group >= ECHO_MIN_GROUP && group <= ECHO_MAX_GROUP && !(group & (group - 1));
}

size_t echo_codec_wire_bytes(size_t count, int group) {
    if (!group_ok(group)) return 0;
    size_t ng = (count + (size_t)group - 1) / (size_t)group;
    return ng * (size_t)group / 2 + 2 * ng;
}

int echo_codec_encode(const float *x, float *res, size_t count, int group, void *wire, char *err, size_t errlen) {
    if (!group_ok(group)) {
        snprintf(err, errlen, "codec: group size %d is not a power of two in [%d, %d]", group, ECHO_MIN_GROUP,
                 ECHO_MAX_GROUP);
        return -1;
    }
    size_t ng = (count + (size_t)group - 1) / (size_t)group, bad;
    uint8_t *codes = wire;
    uint16_t *scales = (uint16_t *)(codes + ng * (size_t)group / 2);
    if (echo_cpu_encode(x, ECHO_F32, res, res != NULL, ECHO_RESID_F32, count, group, codes, scales, &bad)) {
        float v = x[bad] + (res ? res[bad] : 0.0f);
        snprintf(err, errlen, "codec: value %g at element %zu is not finite or exceeds the codec's range (|x| < 2^127)",
                 (double)v, bad);
        return -1;
    }
    return 0;
}

void echo_codec_decode(const void *wire, size_t count, int group, float *out, int accumulate) {
    if (!group_ok(group)) return;
    size_t ng = (count + (size_t)group - 1) / (size_t)group;
    const uint8_t *codes = wire;
    echo_cpu_decode(codes, (const uint16_t *)(codes + ng * (size_t)group / 2), count, group, out, accumulate);
}

float echo_codec_group_scale(const void *wire, size_t count, int group, size_t g) {
    if (!group_ok(group)) return NAN;
    size_t ng = (count + (size_t)group - 1) / (size_t)group;
    if (g >= ng) return NAN;
    const uint16_t *scales = (const uint16_t *)((const uint8_t *)wire + ng * (size_t)group / 2);
    return echo_bf16_to_f32(scales[g]);
}

static void rot_fwd(const void *x, echo_dtype dt, size_t n, size_t np, int group, float *out);
static size_t enc_msg(const echo_plan *p, const void *y, echo_dtype ydt, float *res, int res_valid, echo_resid rmode,
                      size_t n, uint8_t *codes, uint8_t *scales, size_t *bad);
static void dec_msg(const echo_plan *p, const uint8_t *codes, const uint8_t *scales, size_t n, float *out,
                    int accumulate, size_t *bad);
static void rot_inv(float *in, size_t n, int group, void *out, echo_dtype dt, int accumulate);
static void stage_fwd(const echo_plan *p, const void *x, echo_dtype dt, size_t n, size_t np, float *out);
static void stage_inv(const echo_plan *p, float *in, size_t n, void *out, echo_dtype dt, int accumulate);

/* Rotating codecs go through a stack chunk of ECHO_ROT_CHUNK values (whole
 * groups): no allocation per call. */
#define ECHO_ROT_CHUNK 4096

int echo_codec_encode_as(echo_codec_id id, const float *x, float *res, size_t count, int group, void *wire, char *err,
                         size_t errlen) {
    const echo_codec_info *ci = echo_codec_get(id);
    size_t gb = echo_codec_group_bytes(id, group);
    if (!ci || !gb || ci->lossless) {
        snprintf(err, errlen, "codec: unknown codec %d (or not a 4-bit one) or group %d", (int)id, group);
        return -1;
    }
    if (!ci->rotate && ci->form == ECHO_FORM_INT4) return echo_codec_encode(x, res, count, group, wire, err, errlen);
    echo_plan p;
    echo_plan_init(&p, count, 1, group, ECHO_F32);
    p.rotate = ci->rotate < 0 ? group : ci->rotate;
    p.form = ci->form;
    size_t ng = (count + (size_t)group - 1) / (size_t)group, np = ng * (size_t)group;
    uint8_t *codes = wire, *scales = codes + echo_form_code_bytes(ci->form, np);
    size_t rb = gb - echo_form_code_bytes(ci->form, (size_t)group);
    float u[ECHO_ROT_CHUNK];
    size_t off = 0, b;
    if (!p.rotate) { /* out2, hout2: whole groups straight from x, only the ragged end staged */
        off = count / (size_t)group * (size_t)group;
        if (enc_msg(&p, x, ECHO_F32, res, res != NULL, ECHO_RESID_F32, off, codes, scales, &b)) {
            snprintf(err, errlen, "codec: value %g at element %zu is not finite or exceeds the codec's range", (double)x[b],
                     b);
            return -1;
        }
    }
    for (; off < np; off += ECHO_ROT_CHUNK) {
        size_t m = np - off < ECHO_ROT_CHUNK ? np - off : ECHO_ROT_CHUNK;
        size_t in = count - off < m ? count - off : m;
        stage_fwd(&p, x + off, ECHO_F32, in, m, u);
        if (enc_msg(&p, u, ECHO_F32, res ? res + off : NULL, res != NULL, ECHO_RESID_F32, m,
                    codes + echo_form_code_bytes(p.form, off),
                    scales + off / (size_t)group * rb, &b)) {
            snprintf(err, errlen,
                     "codec: rotated value %g at element %zu is not finite or exceeds the codec's range (|x| < "
                     "2^127 / G)",
                     (double)u[b], off + b);
            return -1;
        }
    }
    return 0;
}

int echo_codec_decode_as(echo_codec_id id, const void *wire, size_t count, int group, float *out, int accumulate,
                         char *err, size_t errlen) {
    const echo_codec_info *ci = echo_codec_get(id);
    size_t gb = echo_codec_group_bytes(id, group);
    if (!ci || !gb || ci->lossless) {
        snprintf(err, errlen, "codec: unknown codec %d (or not a 4-bit one) or group %d", (int)id, group);
        return -1;
    }
    if (!ci->rotate && ci->form == ECHO_FORM_INT4) {
        echo_codec_decode(wire, count, group, out, accumulate);
        return 0;
    }
    echo_plan p;
    echo_plan_init(&p, count, 1, group, ECHO_F32);
    p.rotate = ci->rotate < 0 ? group : ci->rotate;
    p.form = ci->form;
    size_t ng = (count + (size_t)group - 1) / (size_t)group, np = ng * (size_t)group;
    const uint8_t *codes = wire, *scales = codes + echo_form_code_bytes(ci->form, np);
    size_t rb = gb - echo_form_code_bytes(ci->form, (size_t)group);
    if (!p.rotate) { /* out2, hout2: no staging (a ragged last group decodes its first values) */
        dec_msg(&p, codes, scales, count, out, accumulate, NULL);
        return 0;
    }
    float u[ECHO_ROT_CHUNK];
    for (size_t off = 0; off < np; off += ECHO_ROT_CHUNK) {
        size_t m = np - off < ECHO_ROT_CHUNK ? np - off : ECHO_ROT_CHUNK;
        dec_msg(&p, codes + echo_form_code_bytes(p.form, off), scales + off / (size_t)group * rb, m, u, 0, NULL);
        stage_inv(&p, u, count - off < m ? count - off : m, out + off, ECHO_F32, accumulate);
    }
    return 0;
}

/* ---- host compute table ---- */

/* The scales of a shard's wire message follow its code bytes (L/2; 3L/8 for hnf3). */
static uint16_t *plan_scales(const echo_plan *p, const uint8_t *wire) {
    return (uint16_t *)(wire + echo_form_code_bytes(p->form, p->shard));
}


static void rot_fwd(const void *x, echo_dtype dt, size_t n, size_t np, int group, float *out) {
    echo_cpu_codec_best()->rot_fwd(x, dt, n, np, group, out);
}

static void rot_inv(float *in, size_t n, int group, void *out, echo_dtype dt, int accumulate) {
    echo_cpu_codec_best()->rot_inv(in, n, group, out, dt, accumulate);
}

/* The staged copy of a message (echo_plan_staged): rotated when the codec
 * rotates, else the values widened to fp32; zero-padded to np. */
static void stage_fwd(const echo_plan *p, const void *x, echo_dtype dt, size_t n, size_t np, float *out) {
    if (p->rotate) {
        rot_fwd(x, dt, n, np, p->rotate, out);
        return;
    }
    echo_cpu_load(x, dt, n, out, 0);
    for (size_t i = n; i < np; i++)
        out[i] = 0.0f;
}

/* out[0..n) (dt; or fp32 +=) from a staged copy (rotated back in place first). */
static void stage_inv(const echo_plan *p, float *in, size_t n, void *out, echo_dtype dt, int accumulate) {
    if (p->rotate) {
        rot_inv(in, n, p->rotate, out, dt, accumulate);
        return;
    }
    if (accumulate) {
        echo_cpu_codec_best()->add(in, n, out);
        return;
    }
    size_t bad;
    echo_cpu_store(in, n, out, dt, &bad);
}

static int host_unrotate(echo_comm *c, float *res, size_t n, int group, void *stream, char *err, size_t errlen) {
    (void)c, (void)stream, (void)err, (void)errlen;
    rot_inv(res, n / (size_t)group * (size_t)group, group, NULL, ECHO_F32, 0);
    return 0;
}

/* A message of n values (n a multiple of G for the hsub6 form): codes, then
 * the scales (int4: one bf16 per group; hsub6: one record per group). */
static size_t enc_msg(const echo_plan *p, const void *y, echo_dtype ydt, float *res, int res_valid, echo_resid rmode,
                      size_t n, uint8_t *codes, uint8_t *scales, size_t *bad) {
    if (p->form == ECHO_FORM_INT4)
        return echo_cpu_encode(y, ydt, res, res_valid, rmode, n, p->group, codes, (uint16_t *)scales, bad);
    /* record forms: fp32 staged values, whole groups, residuals fp32 */
    return echo_cpu_rec_encode(echo_cpu_codec_best(), p->form, y, res, res_valid, n, p->group, codes, scales, bad);
}

/* out (fp32) = or += decode of n values; returns the first element of a
 * poisoned group in *bad (ECHO_NO_INDEX if none) when bad != NULL. */
static void dec_msg(const echo_plan *p, const uint8_t *codes, const uint8_t *scales, size_t n, float *out,
                    int accumulate, size_t *bad) {
    int G = p->group;
    if (bad) {
        *bad = ECHO_NO_INDEX;
        size_t rb = (size_t)echo_rec_bytes(p->form, G);
        for (size_t g = 0; g < (n + (size_t)G - 1) / (size_t)G; g++) {
            uint16_t sb = (uint16_t)(scales[g * rb] | (scales[g * rb + 1] << 8));
            if (echo_scale_is_poison(sb)) {
                *bad = g * (size_t)G;
                break;
            }
        }
    }
    if (p->form == ECHO_FORM_INT4)
        echo_cpu_decode(codes, (const uint16_t *)scales, n, G, out, accumulate);
    else
        echo_cpu_rec_decode(echo_cpu_codec_best(), p->form, codes, scales, n, G, out, accumulate);
}

/* ---- the phases' work, cut into spans of whole groups for the rank's
 * workers (echo_comm_set_workers). A span codes, sums or decodes its own
 * values only, so any split gives the same bits; the first bad element is
 * the first span's, spans being in message order. ---- */

#define HOST_SPAN_MIN 16384 /* values: smaller spans cost more to hand out than to code */
#define HOST_SPANS (2 * ECHO_MAX_RANKS) /* a job has at most one segment per shard */

typedef struct host_span {
    int s;          /* shard */
    size_t off;     /* first value, within the shard */
    size_t len;     /* values (whole groups but for a message's last) */
    size_t bad;     /* first bad element of the whole buffer, or ECHO_NO_INDEX */
} host_span;

typedef struct host_job {
    echo_comm *c;
    const echo_plan *p;
    void (*fn)(struct host_job *j, host_span *sp);
    host_span sp[HOST_SPANS];
    int n;
    /* the phase's arguments */
    const void *x;
    float *res;
    int res_valid;
    uint8_t *const *send;
    const uint8_t *const *msgs;
    uint8_t *out;
    void *buf;
} host_job;

/* Spans of n values of shard s: one without workers, else up to twice the
 * workers' threads, none under HOST_SPAN_MIN values, and never more than
 * the shard's share of HOST_SPANS (so every value gets a span). */
static void job_add(host_job *j, int s, size_t n) {
    size_t G = (size_t)j->p->group, k = 1;
    if (j->c->workers.nthreads > 1) {
        k = n / HOST_SPAN_MIN;
        size_t most = 2 * (size_t)j->c->workers.nthreads, share = HOST_SPANS / (size_t)j->p->nranks;
        most = most < share ? most : share;
        k = k < 1 ? 1 : k > most ? most : k;
    }
    size_t chunk = ((n + k - 1) / k + G - 1) / G * G;
    for (size_t o = 0; o < n; o += chunk)
        j->sp[j->n++] = (host_span){s, o, n - o < chunk ? n - o : chunk, ECHO_NO_INDEX};
}

static void job_task(void *arg, int t) {
    host_job *j = arg;
    j->fn(j, &j->sp[t]);
}

/* Run every span; the first bad element in message order. */
static size_t job_run(host_job *j) {
    if (j->n > 1 && j->c->workers.nthreads > 1)
        j->c->workers.run(j->c->workers.ctx, j->n, job_task, j);
    else
        for (int t = 0; t < j->n; t++)
            j->fn(j, &j->sp[t]);
    for (int t = 0; t < j->n; t++)
        if (j->sp[t].bad != ECHO_NO_INDEX) return j->sp[t].bad;
    return ECHO_NO_INDEX;
}

/* A span's codes and scales (or records) within a wire message. */
static uint8_t *span_codes(const echo_plan *p, const host_span *sp, const uint8_t *msg) {
    return (uint8_t *)msg + echo_form_code_bytes(p->form, sp->off);
}
static uint8_t *span_scales(const echo_plan *p, const host_span *sp, const uint8_t *msg) {
    return (uint8_t *)plan_scales(p, msg) + sp->off / (size_t)p->group * (size_t)echo_rec_bytes(p->form, p->group);
}

/* Phase 1 of one span: staged, its values rotated (or widened) into c->rot
 * (the own shard too: phase 2 sums it from there), then coded for shard s
 * unless it is the own one. */
static void phase1_span(host_job *j, host_span *sp) {
    const echo_plan *p = j->p;
    echo_comm *c = j->c;
    size_t at = (size_t)sp->s * p->shard + sp->off, esz = echo_dtype_size(p->dt), b;
    const void *x = (const char *)j->x + at * esz;
    echo_dtype xdt = p->dt;
    size_t in = p->count > at ? p->count - at : 0;
    /* a peer's whole fp32 groups of out2 / hout2 are coded from x itself:
     * the staged copy would be the same values */
    int direct = sp->s != c->rank && !p->rotate && p->dt == ECHO_F32 && in >= sp->len;
    if (echo_plan_staged(p) && !direct) {
        stage_fwd(p, x, p->dt, in < sp->len ? in : sp->len, sp->len, c->rot + at);
        x = c->rot + at;
        xdt = ECHO_F32;
    }
    if (sp->s == c->rank) return;
    if (enc_msg(p, x, xdt, j->res ? j->res + at : NULL, j->res_valid, ECHO_RESID_F32, sp->len,
                span_codes(p, sp, j->send[sp->s]), span_scales(p, sp, j->send[sp->s]), &b))
        sp->bad = at + b;
}

static int host_phase1(echo_comm *c, const echo_plan *p, const void *x, float *res, int res_valid, uint8_t *const *send,
                       size_t *bad, void *stream, char *err, size_t errlen) {
    (void)stream, (void)err, (void)errlen;
    host_job j = {.c = c, .p = p, .fn = phase1_span, .x = x, .res = res, .res_valid = res_valid, .send = send};
    for (int s = 0; s < p->nranks; s++) {
        size_t n = echo_plan_len(p, s);
        if (n && (s != c->rank || echo_plan_staged(p))) job_add(&j, s, echo_plan_staged(p) ? echo_plan_pad(p, n) : n);
    }
    *bad = job_run(&j);
    return 0;
}

/* Phase 2 of one span of the own shard: the sum over j = 0..N-1 in that
 * order (the cuda twin uses the same), own values raw, then coded. */
static void phase2_span(host_job *j, host_span *sp) {
    const echo_plan *p = j->p;
    echo_comm *c = j->c;
    size_t at = (size_t)c->rank * p->shard + sp->off, b;
    float *sum = c->scratch + sp->off;
    echo_dtype xdt = p->dt;
    const void *x = (const char *)j->x + at * echo_dtype_size(xdt);
    echo_resid rmode = p->dt == ECHO_BF16 ? ECHO_RESID_BF16 : ECHO_RESID_F32;
    if (echo_plan_staged(p)) {
        /* staged, whole groups; the output is rounded after the inverse
         * rotation, so g does not account for that rounding */
        x = c->rot + at;
        xdt = ECHO_F32;
        rmode = ECHO_RESID_F32;
    }
    for (int r = 0; r < p->nranks; r++) {
        if (r == c->rank)
            echo_cpu_load(x, xdt, sp->len, sum, r > 0);
        else
            dec_msg(p, span_codes(p, sp, j->msgs[r]), span_scales(p, sp, j->msgs[r]), sp->len, sum, r > 0, NULL);
    }
    /* a poisoned group travels in-band and is reported by finish */
    enc_msg(p, sum, ECHO_F32, j->res ? j->res + sp->off : NULL, j->res_valid, rmode, sp->len, span_codes(p, sp, j->out),
            span_scales(p, sp, j->out), &b);
}

static int host_phase2(echo_comm *c, const echo_plan *p, const void *x, const uint8_t *const *recv, float *g,
                       int g_valid, uint8_t *out, void *stream, char *err, size_t errlen) {
    (void)stream, (void)err, (void)errlen;
    size_t n = echo_plan_len(p, c->rank);
    if (n == 0) return 0;
    host_job j = {.c = c, .p = p, .fn = phase2_span, .x = x, .res = g, .res_valid = g_valid, .msgs = recv, .out = out};
    job_add(&j, c->rank, echo_plan_staged(p) ? echo_plan_pad(p, n) : n);
    job_run(&j);
    return 0;
}

/* Finish of one span: decoded (staged: into c->rot, then rotated back) and
 * rounded to the buffer's dtype. */
static void finish_span(host_job *j, host_span *sp) {
    const echo_plan *p = j->p;
    size_t at = (size_t)sp->s * p->shard + sp->off, esz = echo_dtype_size(p->dt), b;
    const uint8_t *msg = j->msgs[sp->s];
    void *out = (char *)j->buf + at * esz;
    size_t in = p->count - at; /* >= 1: a span starts inside the message */
    if (echo_plan_staged(p) && !p->rotate && p->dt == ECHO_F32) {
        /* out2 / hout2 into an fp32 buffer: no staged copy (a ragged last
         * group decodes its first values) */
        dec_msg(p, span_codes(p, sp, msg), span_scales(p, sp, msg), in < sp->len ? in : sp->len, out, 0, &b);
    } else if (echo_plan_staged(p)) {
        dec_msg(p, span_codes(p, sp, msg), span_scales(p, sp, msg), sp->len, j->c->rot + at, 0, &b);
        stage_inv(p, j->c->rot + at, in < sp->len ? in : sp->len, out, p->dt, 0);
    } else if (!echo_cpu_decode_store(span_codes(p, sp, msg), (const uint16_t *)span_scales(p, sp, msg), sp->len, p->group,
                                      out, p->dt, &b))
        b = ECHO_NO_INDEX;
    if (b != ECHO_NO_INDEX) sp->bad = at + b;
}

static int host_finish(echo_comm *c, const echo_plan *p, const uint8_t *const *gathered, void *buf, size_t *bad,
                       void *stream, char *err, size_t errlen) {
    (void)stream, (void)err, (void)errlen;
    host_job j = {.c = c, .p = p, .fn = finish_span, .msgs = gathered, .buf = buf};
    for (int s = 0; s < p->nranks; s++) {
        size_t n = echo_plan_len(p, s);
        if (n) job_add(&j, s, echo_plan_staged(p) ? echo_plan_pad(p, n) : n);
    }
    *bad = job_run(&j);
    return 0;
}

static int host_alloc(echo_comm *c, size_t bytes, void **out, char *err, size_t errlen) {
    (void)c;
    *out = calloc(1, bytes ? bytes : 1);
    if (!*out) {
        snprintf(err, errlen, "out of memory (%zu bytes)", bytes);
        return -1;
    }
    return 0;
}

static void host_free(echo_comm *c, void *p) {
    (void)c;
    free(p);
}

/* The owner's fp32 sum of one shard, when this world runs the two-shot
 * schedule. */
static int host_comm_init(echo_comm *c, char *err, size_t errlen) {
    const echo_world *w = c->w;
    if (!w->max_plan.wire || w->nranks == 1) return 0;
    c->scratch = malloc(w->max_plan.shard * sizeof(float) + 1);
    if (!c->scratch) {
        snprintf(err, errlen, "echo: out of memory for the %zu-value reduction scratch", w->max_plan.shard);
        return -1;
    }
    const echo_codec_info *ci = echo_codec_get(w->cfg.codec);
    if (ci->rotate || ci->form != ECHO_FORM_INT4) {
        size_t m = w->max_plan.shard * (size_t)w->nranks;
        c->rot = malloc(m * sizeof(float) + 1);
        if (!c->rot) {
            free(c->scratch);
            c->scratch = NULL;
            snprintf(err, errlen, "echo: out of memory for the %zu-value rotation scratch", m);
            return -1;
        }
    }
    return 0;
}

static void host_comm_fini(echo_comm *c) {
    free(c->scratch);
    free(c->rot);
    c->scratch = NULL;
    c->rot = NULL;
}

const echo_compute_ops echo_host_compute = {
    .name = "host",
    .phase1 = host_phase1,
    .phase2 = host_phase2,
    .finish = host_finish,
    .alloc = host_alloc,
    .free = host_free,
    .comm_init = host_comm_init,
    .comm_fini = host_comm_fini,
    .unrotate = host_unrotate,
};
