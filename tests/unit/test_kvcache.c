/*
 * The KV cache's storage types (kernels.h kern_kv_dtype, kernels/kv.h):
 * the reference's conversions and q8_0 blocks against hand-worked values,
 * the rotation against Sylvester's matrix, and the cpu ops against the
 * reference bit for bit on every isa (the store's bytes; attention equal
 * to the fp32 kernel on the values the reference reads back).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kv.h"

static const kern_kv_dtype dts[] = {KERN_KV_F32, KERN_KV_BF16, KERN_KV_F16, KERN_KV_Q8_0};
static const char *isas[] = {"scalar", "avx2", NULL}; /* NULL: the machine's best */

static unsigned rng_state = 12345;
static float frand(void) { /* [-1, 1) */
    rng_state = rng_state * 1103515245u + 12345u;
    return (float)((rng_state >> 8) & 0xffff) / 32768.0f - 1.0f;
}
static float *rand_vec(size_t n) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = frand();
    return v;
}
static float fbits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void backend(const char *isa, const kern_ops **o, kern_backend **b, int threads) {
    char err[256];
    if (isa) setenv("ECHO_CPU_ISA", isa, 1);
    ck_assert_msg(kern_backend_create("cpu", threads, 0, o, b, err, sizeof err) == 0, "%s", err);
    unsetenv("ECHO_CPU_ISA");
}

/* Round to nearest even at the halfway points, by hand. */
START_TEST(test_kv_conversions) {
    ck_assert_uint_eq(kern_f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(kern_f32_to_bf16(1.00390625f), 0x3f80);   /* 1 + 2^-8: halfway, to even (down) */
    ck_assert_uint_eq(kern_f32_to_bf16(1.01171875f), 0x3f82);   /* 1 + 3*2^-8: halfway, to even (up) */
    ck_assert_uint_eq(kern_f32_to_bf16(-1.0078125f), 0xbf81);   /* exact */
    ck_assert_uint_eq(kern_f32_to_bf16(fbits(0x3f808001)), 0x3f81); /* just above halfway */
    ck_assert_uint_eq(kern_f32_to_bf16(fbits(0x7f7fffff)), 0x7f80); /* FLT_MAX rounds to inf */
    ck_assert(isnan(kern_bf16_to_f32(kern_f32_to_bf16(NAN))));
    ck_assert_uint_eq(kern_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(kern_f32_to_f16(1.00048828125f), 0x3c00);  /* 1 + 2^-11: halfway, to even */
    ck_assert_uint_eq(kern_f32_to_f16(1.00146484375f), 0x3c02);  /* 1 + 3*2^-11: halfway, up to even */
    ck_assert_uint_eq(kern_f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(kern_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(kern_f32_to_f16(65520.0f), 0x7c00);        /* halfway to 65536: inf */
    ck_assert_uint_eq(kern_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* half the smallest subnormal: to even 0 */
    ck_assert_uint_eq(kern_f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* 1.5 units: to even 2 */
    ck_assert_uint_eq(kern_f32_to_f16(ldexpf(1.0f, -14)), 0x0400); /* smallest normal */
    for (uint32_t h = 0; h < 0x7c00; h += 7) /* the inline widening equals kernels/backend.c's */
        ck_assert(kern_kv_f16_to_f32((uint16_t)h) == kern_f16_to_f32((uint16_t)h));
}
END_TEST

/* One q8_0 block worked by hand: amax 127 gives d = 1, fp16 0x3c00;
 * -63.5 rounds away from zero to -64; the second block all zero. */
START_TEST(test_kv_q8_0_block) {
    float x[64] = {127.0f, -63.5f, 1.0f, 0.49f, 2.5f};
    uint8_t q[68];
    memset(q, 0xee, sizeof q);
    kern_kv_store_ref(KERN_KV_Q8_0, 0, x, 64, q);
    const int8_t want[5] = {127, -64, 1, 0, 3};
    for (int j = 0; j < 5; j++) ck_assert_int_eq((int8_t)q[j], want[j]);
    for (int j = 5; j < 64; j++) ck_assert_int_eq(q[j], 0);
    ck_assert_uint_eq(q[64] | q[65] << 8, 0x3c00);
    ck_assert_uint_eq(q[66] | q[67] << 8, 0x0000);
    float back[64];
    kern_kv_load_ref(KERN_KV_Q8_0, q, 64, back);
    ck_assert(back[0] == 127.0f && back[1] == -64.0f && back[4] == 3.0f && back[40] == 0.0f);
    /* a block of amax 1: d = 1/127 stored as fp16 0x2008 (0.0078773...) */
    float y[32] = {1.0f, -0.5f};
    uint8_t r[34];
    kern_kv_store_ref(KERN_KV_Q8_0, 0, y, 32, r);
    ck_assert_int_eq((int8_t)r[0], 127);
    ck_assert_int_eq((int8_t)r[1], -64); /* -0.5 * 127 = -63.5: away from zero */
    ck_assert_uint_eq(r[32] | r[33] << 8, 0x2008);
}
END_TEST

/* kern_kv_rotate is Sylvester's H/sqrt(hd) (computed here in double from
 * its definition), applying it twice gives the input back, and it keeps
 * dot products. */
START_TEST(test_kv_rotation) {
    for (int hd = 32; hd <= 256; hd *= 2) {
        float *x = rand_vec((size_t)hd), *y = malloc((size_t)hd * 4), *z = rand_vec((size_t)hd), *w = malloc((size_t)hd * 4);
        memcpy(y, x, (size_t)hd * 4);
        memcpy(w, z, (size_t)hd * 4);
        kern_kv_rotate(y, hd);
        kern_kv_rotate(w, hd);
        double dxz = 0, dyw = 0;
        for (int i = 0; i < hd; i++) {
            double s = 0;
            for (int j = 0; j < hd; j++) s += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x[j];
            s /= sqrt((double)hd);
            ck_assert_msg(fabs(s - y[i]) < 1e-5, "hd %d row %d: %g vs %g", hd, i, s, y[i]);
            dxz += (double)x[i] * z[i];
            dyw += (double)y[i] * w[i];
        }
        ck_assert_msg(fabs(dxz - dyw) < 1e-4, "hd %d: dot %g became %g", hd, dxz, dyw);
        kern_kv_rotate(y, hd);
        for (int i = 0; i < hd; i++) ck_assert_msg(fabsf(y[i] - x[i]) < 2e-6f, "hd %d: round trip %d", hd, i);
        free(x);
        free(y);
        free(z);
        free(w);
    }
    ck_assert(kern_kv_rotate_scale(64) == 0.125f);
}
END_TEST

/* kv_store writes the reference's bytes for every type on every isa, at
 * scattered slots, and leaves the other rows alone. */
START_TEST(test_kv_store_matches_ref) {
    enum { HKV = 3, HD = 64, ROWS = 40, N = 9 };
    const int32_t slots[N] = {7, 0, 39, 12, 13, 5, 22, 31, 1};
    float *k = rand_vec((size_t)N * HKV * HD), *v = rand_vec((size_t)N * HKV * HD);
    k[5] = 40.0f; /* an outlier channel */
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
        for (size_t x = 0; x < sizeof isas / sizeof *isas; x++) {
            const kern_ops *o;
            kern_backend *b;
            backend(isas[x], &o, &b, 2);
            size_t rb = kern_kv_row_bytes(dts[d], HKV, HD), hb = kern_kv_head_bytes(dts[d], HD);
            uint8_t *kc = o->alloc(b, ROWS * rb), *vc = o->alloc(b, ROWS * rb);
            memset(kc, 0x5a, ROWS * rb);
            memset(vc, 0xa5, ROWS * rb);
            ck_assert_int_eq(o->kv_store(b, kc, vc, k, v, slots, N, HKV, HD, dts[d]), 0);
            uint8_t want[4 * HD];
            for (int r = 0; r < ROWS; r++) {
                int i = -1;
                for (int j = 0; j < N; j++)
                    if (slots[j] == r) i = j;
                for (int h = 0; h < HKV; h++) {
                    const uint8_t *gk = kc + r * rb + h * hb, *gv = vc + r * rb + h * hb;
                    if (i < 0) {
                        for (size_t c = 0; c < hb; c++) ck_assert(gk[c] == 0x5a && gv[c] == 0xa5);
                        continue;
                    }
                    kern_kv_store_ref(dts[d], 1, k + ((size_t)i * HKV + h) * HD, HD, want);
                    ck_assert_msg(!memcmp(gk, want, hb), "%s isa %s: key row %d head %d", kern_kv_dtype_name(dts[d]),
                                  isas[x] ? isas[x] : "best", r, h);
                    kern_kv_store_ref(dts[d], 0, v + ((size_t)i * HKV + h) * HD, HD, want);
                    ck_assert_msg(!memcmp(gv, want, hb), "%s: value row %d head %d", kern_kv_dtype_name(dts[d]), r, h);
                }
            }
            o->free(b, kc);
            o->free(b, vc);
            kern_backend_destroy(o, b);
        }
    free(k);
    free(v);
}
END_TEST

/* Attention over a cache of each type has exactly the bits of the fp32
 * kernel over an fp32 cache holding the values kern_kv_load_ref reads back
 * (q8_0: and the queries rotated), for decode (1 and 3 queries, keys read
 * in place a block at a time) and a prompt (packed), on every isa; and it
 * stays close to fp32 attention on the unrounded keys and values. */
START_TEST(test_kv_attention_matches_f32) {
    static const int shapes[][3] = {{6, 2, 64}, {4, 1, 128}, {3, 3, 40}};
    enum { BS = 8, NB = 6 };
    const int pos0 = 2, nq = 27, len = pos0 + nq;
    const int32_t table[NB] = {4, 0, 5, 2, 1, 3};
    int32_t slots[64];
    for (int p = 0; p < len; p++) slots[p] = table[p / BS] * BS + p % BS;
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        const int hq = shapes[sh][0], hkv = shapes[sh][1], hd = shapes[sh][2], kvd = hkv * hd, qd = hq * hd;
        float *k = rand_vec((size_t)len * kvd), *v = rand_vec((size_t)len * kvd), *q = rand_vec((size_t)nq * qd);
        for (int p = 0; p < len; p++) k[(size_t)p * kvd + 3] *= 20.0f; /* an outlier channel */
        for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
            if (kern_kv_invalid(dts[d], hd)) continue;
            for (size_t x = 0; x < sizeof isas / sizeof *isas; x++) {
                const kern_ops *o;
                kern_backend *b;
                backend(isas[x], &o, &b, x == 1 ? 3 : 2);
                const kern_kv_dtype dt = dts[d];
                size_t rb = kern_kv_row_bytes(dt, hkv, hd), hb = kern_kv_head_bytes(dt, hd);
                uint8_t *kc = o->alloc(b, NB * BS * rb), *vc = o->alloc(b, NB * BS * rb);
                float *kf = o->alloc(b, (size_t)NB * BS * kvd * 4), *vf = o->alloc(b, (size_t)NB * BS * kvd * 4);
                float *kx = o->alloc(b, (size_t)NB * BS * kvd * 4), *vx = o->alloc(b, (size_t)NB * BS * kvd * 4);
                ck_assert_int_eq(o->kv_store(b, kc, vc, k, v, slots, len, hkv, hd, dt), 0);
                ck_assert_int_eq(o->kv_store(b, kx, vx, k, v, slots, len, hkv, hd, KERN_KV_F32), 0);
                for (int r = 0; r < NB * BS; r++)
                    for (int h = 0; h < hkv; h++) {
                        kern_kv_load_ref(dt, kc + r * rb + h * hb, hd, kf + (size_t)r * kvd + (size_t)h * hd);
                        kern_kv_load_ref(dt, vc + r * rb + h * hb, hd, vf + (size_t)r * kvd + (size_t)h * hd);
                    }
                float *qr = malloc((size_t)nq * qd * 4);
                memcpy(qr, q, (size_t)nq * qd * 4);
                if (dt == KERN_KV_Q8_0)
                    for (int i = 0; i < nq * hq; i++) kern_kv_rotate(qr + (size_t)i * hd, hd);
                float *got = malloc((size_t)nq * qd * 4), *want = malloc((size_t)nq * qd * 4),
                      *exact = malloc((size_t)nq * qd * 4);
                int32_t q_start[2] = {0, nq};
                kern_attn_batch all = {1, q_start, &pos0, table, NB, BS};
                ck_assert_int_eq(o->attention(b, got, q, kc, vc, &all, hq, hkv, hd, 0.125f, dt), 0);
                ck_assert_int_eq(o->attention(b, want, qr, kf, vf, &all, hq, hkv, hd, 0.125f, KERN_KV_F32), 0);
                ck_assert_int_eq(o->attention(b, exact, q, kx, vx, &all, hq, hkv, hd, 0.125f, KERN_KV_F32), 0);
                ck_assert_msg(!memcmp(got, want, (size_t)nq * qd * 4), "%s hd %d isa %s: prompt differs",
                              kern_kv_dtype_name(dt), hd, isas[x] ? isas[x] : "best");
                const float tol = dt == KERN_KV_F32 ? 0 : dt == KERN_KV_Q8_0 ? 0.03f : dt == KERN_KV_BF16 ? 0.01f : 0.002f;
                for (size_t i = 0; i < (size_t)nq * qd; i++)
                    ck_assert_msg(fabsf(got[i] - exact[i]) <= tol, "%s: %g vs fp32 %g", kern_kv_dtype_name(dt), got[i],
                                  exact[i]);
                for (int i = 0; i < nq; i += 5)
                    for (int m = 1; m <= 3 && i + m <= nq; m += 2) { /* decode: 1 or 3 queries from row i */
                        int32_t qs[2] = {0, m}, p0 = pos0 + i;
                        kern_attn_batch dd = {1, qs, &p0, table, NB, BS};
                        ck_assert_int_eq(o->attention(b, got, q + (size_t)i * qd, kc, vc, &dd, hq, hkv, hd, 0.125f, dt), 0);
                        ck_assert_int_eq(
                            o->attention(b, want, qr + (size_t)i * qd, kf, vf, &dd, hq, hkv, hd, 0.125f, KERN_KV_F32), 0);
                        ck_assert_msg(!memcmp(got, want, (size_t)m * qd * 4), "%s hd %d isa %s: %d queries at %d differ",
                                      kern_kv_dtype_name(dt), hd, isas[x] ? isas[x] : "best", m, i);
                    }
                free(qr);
                free(got);
                free(want);
                free(exact);
                o->free(b, kc);
                o->free(b, vc);
                o->free(b, kf);
                o->free(b, vf);
                o->free(b, kx);
                o->free(b, vx);
                kern_backend_destroy(o, b);
            }
        }
        free(k);
        free(v);
        free(q);
    }
}
END_TEST

/* An independent scalar decode attention on kern_kv_load_ref's values:
 * q·k with 16 fma lanes and hsum16's tree (then the hd % 16 tail), the
 * softmax of kernels.h (scale, max, glibc expf of s - max, the sum in
 * double in order, one fp32 reciprocal), and each output column an fma
 * chain over the positions in order. */
static float ref_dot(const float *a, const float *b, int n) {
    float acc[16] = {0}, x[8], y[4];
    int k = 0;
    for (; k + 16 <= n; k += 16)
        for (int l = 0; l < 16; l++) acc[l] = fmaf(a[k + l], b[k + l], acc[l]);
    for (int i = 0; i < 8; i++) x[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) y[i] = x[i] + x[i + 4];
    float s = (y[0] + y[2]) + (y[1] + y[3]);
    for (; k < n; k++) s = fmaf(a[k], b[k], s);
    return s;
}

static void ref_decode(float *out, const float *q, const float *kf, const float *vf, const int32_t *table, int bs,
                       int len, int hq, int hkv, int hd, float scale) {
    float *w = malloc((size_t)len * sizeof *w);
    for (int h = 0; h < hq; h++) {
        const int kvh = h / (hq / hkv);
        const float *qh = q + (size_t)h * hd;
        float mx = -INFINITY;
        for (int p = 0; p < len; p++) {
            size_t row = (size_t)table[p / bs] * bs + (size_t)(p % bs);
            w[p] = ref_dot(qh, kf + (row * hkv + kvh) * hd, hd) * scale;
            if (w[p] > mx) mx = w[p];
        }
        double sum = 0;
        for (int p = 0; p < len; p++) {
            w[p] = expf(w[p] - mx);
            sum += w[p];
        }
        float inv = (float)(1.0 / sum);
        for (int p = 0; p < len; p++) w[p] *= inv;
        for (int c = 0; c < hd; c++) {
            float o = 0;
            for (int p = 0; p < len; p++) {
                size_t row = (size_t)table[p / bs] * bs + (size_t)(p % bs);
                o = fmaf(w[p], vf[(row * hkv + kvh) * hd + c], o);
            }
            out[(size_t)h * hd + c] = o;
        }
    }
    free(w);
}

/* Decode over a longer context (several 16-position groups and a tail, a
 * scattered block table) of every type on every isa against the scalar
 * re-implementation above, bit for bit; q8_0 with its queries rotated. */
START_TEST(test_kv_decode_matches_scalar) {
    static const int shapes[][3] = {{9, 3, 64}, {4, 2, 128}, {2, 1, 40}};
    enum { BS = 16, NB = 12 };
    int32_t table[NB];
    for (int i = 0; i < NB; i++) table[i] = (i * 5 + 3) % NB;
    static const int lens[] = {1, 15, 16, 17, 150, NB * BS};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        const int hq = shapes[sh][0], hkv = shapes[sh][1], hd = shapes[sh][2], kvd = hkv * hd, qd = hq * hd;
        const int rows = NB * BS;
        float *k = rand_vec((size_t)rows * kvd), *v = rand_vec((size_t)rows * kvd), *q = rand_vec((size_t)qd);
        for (int r = 0; r < rows; r++) k[(size_t)r * kvd + 5] *= 12.0f;
        int32_t *slots = malloc((size_t)rows * sizeof *slots);
        for (int r = 0; r < rows; r++) slots[r] = r;
        for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
            const kern_kv_dtype dt = dts[d];
            if (kern_kv_invalid(dt, hd)) continue;
            size_t rb = kern_kv_row_bytes(dt, hkv, hd), hb = kern_kv_head_bytes(dt, hd);
            float *kf = malloc((size_t)rows * kvd * 4), *vf = malloc((size_t)rows * kvd * 4), *qr = malloc((size_t)qd * 4);
            float *want = malloc((size_t)qd * 4), *got = malloc((size_t)qd * 4);
            memcpy(qr, q, (size_t)qd * 4);
            if (dt == KERN_KV_Q8_0)
                for (int h = 0; h < hq; h++) kern_kv_rotate(qr + (size_t)h * hd, hd);
            for (size_t x = 0; x < sizeof isas / sizeof *isas; x++) {
                const kern_ops *o;
                kern_backend *b;
                backend(isas[x], &o, &b, 2);
                uint8_t *kc = o->alloc(b, (size_t)rows * rb), *vc = o->alloc(b, (size_t)rows * rb);
                ck_assert_int_eq(o->kv_store(b, kc, vc, k, v, slots, rows, hkv, hd, dt), 0);
                for (int r = 0; r < rows; r++)
                    for (int h = 0; h < hkv; h++) {
                        kern_kv_load_ref(dt, kc + r * rb + h * hb, hd, kf + (size_t)r * kvd + (size_t)h * hd);
                        kern_kv_load_ref(dt, vc + r * rb + h * hb, hd, vf + (size_t)r * kvd + (size_t)h * hd);
                    }
                for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
                    int32_t qs[2] = {0, 1}, p0 = lens[l] - 1;
                    kern_attn_batch one = {1, qs, &p0, table, NB, BS};
                    ck_assert_int_eq(o->attention(b, got, q, kc, vc, &one, hq, hkv, hd, 0.125f, dt), 0);
                    ref_decode(want, qr, kf, vf, table, BS, lens[l], hq, hkv, hd, 0.125f);
                    for (int i = 0; i < qd; i++)
                        ck_assert_msg(!memcmp(&got[i], &want[i], 4), "%s hd %d isa %s len %d: out[%d] %a vs scalar %a",
                                      kern_kv_dtype_name(dt), hd, isas[x] ? isas[x] : "best", lens[l], i, got[i],
                                      want[i]);
                }
                o->free(b, kc);
                o->free(b, vc);
                kern_backend_destroy(o, b);
            }
            free(kf);
            free(vf);
            free(qr);
            free(want);
            free(got);
        }
        free(slots);
        free(k);
        free(v);
        free(q);
    }
}
END_TEST

/* A type that cannot hold the heads, or no type at all, is an error. */
START_TEST(test_kv_errors) {
    const kern_ops *o;
    kern_backend *b;
    backend(NULL, &o, &b, 1);
    float *kv = o->alloc(b, 4096 * 4);
    int32_t slot = 0, qs[2] = {0, 1}, p0 = 0, tb[1] = {0};
    ck_assert_int_ne(o->kv_store(b, kv, kv, kv, kv, &slot, 1, 1, 40, KERN_KV_Q8_0), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(b), "power of two"));
    ck_assert_int_ne(o->kv_store(b, kv, kv, kv, kv, &slot, 1, 1, 64, KERN_KV_NATIVE), 0);
    kern_attn_batch ab = {1, qs, &p0, tb, 1, 4};
    ck_assert_int_ne(o->attention(b, kv, kv, kv, kv, &ab, 1, 1, 48, 1.0f, KERN_KV_Q8_0), 0);
    ck_assert_ptr_nonnull(strstr(kern_last_error(b), "q8_0"));
    ck_assert_str_eq(kern_kv_dtype_name(kern_kv_resolve(o, KERN_KV_NATIVE)), "fp32");
    o->free(b, kv);
    kern_backend_destroy(o, b);
}
END_TEST

int main(void) {
    Suite *s = suite_create("kvcache");
    TCase *tc = tcase_create("kv");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_kv_conversions);
    tcase_add_test(tc, test_kv_q8_0_block);
    tcase_add_test(tc, test_kv_rotation);
    tcase_add_test(tc, test_kv_store_matches_ref);
    tcase_add_test(tc, test_kv_attention_matches_f32);
    tcase_add_test(tc, test_kv_decode_matches_scalar);
    tcase_add_test(tc, test_kv_errors);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
