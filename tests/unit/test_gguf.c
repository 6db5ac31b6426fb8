/*
 * weights/ GGUF reader and dequantization.
 *
 * Expected values come from the `gguf` Python package (llama.cpp's own
 * tooling): tests/fixtures/make_gguf_fixtures.py wrote the fixtures in
 * tests/fixtures/gguf/ with GGUFWriter and the expected fp32 values with
 * gguf.quants.dequantize. Dequantization must match them bit for bit (the
 * C code does ggml's float32 operations in ggml's order; see
 * weights/quant.c). Corrupt files are made in memory from the good
 * fixtures, each field found by a small walker below, and parsed with
 * weights_parse_gguf_image(): every one must fail with a message naming the
 * file and what is wrong, never crash.
 *
 * The SmolLM2 test uses the real model at $ECHO_GGUF_MODEL (default
 * build/models/SmolLM2-135M-Instruct.Q4_1.gguf) and is skipped, saying so,
 * when the file is absent.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tests/unit/testutil.h"
#include "weights/weights.h"

#define FIX TU_FIXTURES "/gguf/"
#define MODEL_DEFAULT "build/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define MODEL_SIZE 98362432 /* the file the committed smollm2-*.f32 rows came from */

static uint8_t *load(const char *path, size_t *len) {
    char *b = tu_read_file(path, len);
    ck_assert_msg(b != NULL, "cannot read %s", path);
    return (uint8_t *)b;
}

static float *load_f32(const char *path, size_t *n) {
    size_t len;
    uint8_t *b = load(path, &len);
    ck_assert_uint_eq(len % 4, 0);
    *n = len / 4;
    float *f = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(f);
    memcpy(f, b, len); /* fixtures are little-endian, as is every host we build on */
    free(b);
    return f;
}

/* Bit-for-bit equality (so -0.0 vs 0.0 or a different NaN would fail). */
static void assert_bits_eq(const float *got, const float *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        ck_assert_msg(a == b, "%s: element %zu: got %.9g (0x%08x), want %.9g (0x%08x)", what, i, got[i], a,
                      want[i], b);
    }
}

/* ----------------------------------------------------------- every type */

static const struct {
    const char *file;
    weights_dtype dt;
    int64_t block;
    size_t block_bytes;
} TYPES[] = {
    {"f32", WEIGHTS_F32, 1, 4},       {"f16", WEIGHTS_F16, 1, 2},       {"bf16", WEIGHTS_BF16, 1, 2},
    {"q8_0", WEIGHTS_Q8_0, 32, 34},   {"q4_0", WEIGHTS_Q4_0, 32, 18},   {"q4_1", WEIGHTS_Q4_1, 32, 20},
    {"q5_0", WEIGHTS_Q5_0, 32, 22},   {"q5_1", WEIGHTS_Q5_1, 32, 24},   {"q4_k", WEIGHTS_Q4_K, 256, 144},
    {"q5_k", WEIGHTS_Q5_K, 256, 176}, {"q6_k", WEIGHTS_Q6_K, 256, 210},
};
#define NTYPES (sizeof TYPES / sizeof TYPES[0])

/* Tensor `tname` (rows x cols) of type file `k` against its expected values:
 * all rows, a middle range, weights_dequantize() on the raw bytes. */
static void check_tensor(const weights_set *ws, size_t k, const char *tname, int64_t rows) {
    char path[256], err[512], what[64];
    int64_t cols = 2 * (TYPES[k].block > 32 ? TYPES[k].block : 32);
    snprintf(what, sizeof what, "%s.%s", TYPES[k].file, tname);
    const weights_tensor *t = weights_find(ws, tname);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->dtype, TYPES[k].dt);
    ck_assert_int_eq(t->ndim, 2);
    ck_assert_int_eq(t->shape[0], rows);
    ck_assert_int_eq(t->shape[1], cols);
    ck_assert_uint_eq(t->nbytes, (size_t)(rows * cols / TYPES[k].block) * TYPES[k].block_bytes);
    int64_t shape[2] = {rows, cols};
    const weights_tensor *g;
    ck_assert_msg(weights_get(ws, tname, 2, shape, &g, err, sizeof err) == 0, "%s", err);
    ck_assert_ptr_eq(g, t);

    snprintf(path, sizeof path, FIX "%s.%s.f32", TYPES[k].file, tname);
    size_t n;
    float *want = load_f32(path, &n);
    ck_assert_uint_eq(n, (size_t)(rows * cols));
    float *got = malloc(n * sizeof *got);
    ck_assert_ptr_nonnull(got);

    ck_assert_msg(weights_read_rows_f32(t, 0, rows, got, err, sizeof err) == 0, "%s", err);
    assert_bits_eq(got, want, n, what);

    memset(got, 0xff, n * sizeof *got);
    ck_assert_msg(weights_read_rows_f32(t, 1, rows - 2, got, err, sizeof err) == 0, "%s", err);
    assert_bits_eq(got, want + cols, (size_t)((rows - 2) * cols), what);
    uint32_t tail;
    memcpy(&tail, &got[(rows - 2) * cols], 4);
    ck_assert_uint_eq(tail, 0xffffffffu); /* wrote exactly nr rows */

    memset(got, 0, n * sizeof *got);
    ck_assert_msg(weights_dequantize(t->dtype, t->data, n, got, err, sizeof err) == 0, "%s", err);
    assert_bits_eq(got, want, n, what);

    /* bounds */
    ck_assert_int_eq(weights_read_rows_f32(t, rows - 1, 2, got, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "outside the tensor's"));
    ck_assert_int_eq(weights_read_rows_f32(t, -1, 1, got, err, sizeof err), -1);
    ck_assert_int_eq(weights_read_rows_f32(t, 0, -1, got, err, sizeof err), -1);
    ck_assert_int_eq(weights_read_rows_f32(t, rows, 0, got, err, sizeof err), 0);
    free(got);
    free(want);
}

START_TEST(test_every_type) {
    char path[256], err[512];
    for (size_t k = 0; k < NTYPES; k++) {
        snprintf(path, sizeof path, FIX "%s.gguf", TYPES[k].file);
        weights_set *ws;
        ck_assert_msg(weights_open(path, &ws, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(weights_is_gguf(ws), 1);
        ck_assert_uint_eq(weights_count(ws), 2);
        ck_assert_str_eq(weights_at(ws, 0)->name, "w"); /* file order */
        ck_assert_str_eq(weights_at(ws, 0)->file, path);
        check_tensor(ws, k, "w", 5);
        check_tensor(ws, k, "r", 3);
        ck_assert_uint_eq(weights_total_bytes(ws), weights_find(ws, "w")->nbytes + weights_find(ws, "r")->nbytes);
        /* GGUFWriter's default alignment */
        ck_assert_uint_eq((uintptr_t)weights_find(ws, "r")->data % 32, 0);
        weights_close(ws);
    }
}
END_TEST

START_TEST(test_dtype_helpers) {
    for (size_t k = 0; k < NTYPES; k++) {
        ck_assert_int_eq(weights_dtype_block(TYPES[k].dt), TYPES[k].block);
        ck_assert_uint_eq(weights_dtype_block_bytes(TYPES[k].dt), TYPES[k].block_bytes);
        ck_assert_int_eq(weights_dtype_is_quantized(TYPES[k].dt), TYPES[k].block > 1);
        if (TYPES[k].block > 1) ck_assert_uint_eq(weights_dtype_size(TYPES[k].dt), 0);
    }
    ck_assert_str_eq(weights_dtype_name(WEIGHTS_Q4_1), "Q4_1");
    ck_assert_str_eq(weights_dtype_name(WEIGHTS_Q6_K), "Q6_K");
    ck_assert_str_eq(weights_dtype_name(WEIGHTS_Q8_0), "Q8_0");
    ck_assert_int_eq(weights_dtype_block((weights_dtype)99), 0);
    ck_assert_int_eq(weights_dtype_is_quantized(WEIGHTS_U64), 0);
    ck_assert_int_eq(weights_dtype_block(WEIGHTS_I8), 1);

    char err[256];
    uint8_t blk[34] = {0};
    float out[32];
    ck_assert_int_eq(weights_dequantize(WEIGHTS_Q8_0, blk, 31, out, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "not a multiple of 32"));
    ck_assert_int_eq(weights_dequantize(WEIGHTS_I8, blk, 4, out, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "I8"));
    ck_assert_int_eq(weights_dequantize(WEIGHTS_Q8_0, blk, 32, out, err, sizeof err), 0);
    ck_assert(out[0] == 0.0f && out[31] == 0.0f);
    /* fp16 specials through Q8_0's scale: d = -0 (0x8000), 1 * -0 = -0; d = 2^-24
     * (0x0001, the smallest subnormal) times 127. */
    blk[1] = 0x80;
    blk[2] = 1;
    ck_assert_int_eq(weights_dequantize(WEIGHTS_Q8_0, blk, 32, out, err, sizeof err), 0);
    ck_assert(out[0] == 0.0f && signbit(out[0]));
    blk[0] = 1;
    blk[1] = 0;
    blk[2] = 127;
    ck_assert_int_eq(weights_dequantize(WEIGHTS_Q8_0, blk, 32, out, err, sizeof err), 0);
    ck_assert(out[0] == 127.0f * 5.9604644775390625e-8f);
}
END_TEST

/* Several threads reading rows of one tensor (and metadata) at once get the
 * same values as one thread: the readers keep no shared state. */
typedef struct reader_arg {
    const weights_set *ws;
    const float *want;
    int bad;
} reader_arg;

static void *reader(void *p) {
    reader_arg *a = p;
    const weights_tensor *t = weights_find(a->ws, "w");
    float got[512];
    char err[256];
    for (int it = 0; it < 200; it++)
        for (int64_t r = 0; r < 5; r++) {
            int64_t row = (r + it) % 5;
            if (weights_read_rows_f32(t, row, 1, got, err, sizeof err) != 0 ||
                memcmp(got, a->want + row * 512, sizeof got) != 0)
                a->bad = 1;
            const char *s;
            size_t n;
            if (weights_meta_str(a->ws, "general.architecture", &s, &n) != 0 || n != 4 || memcmp(s, "test", 4))
                a->bad = 1;
        }
    return NULL;
}

START_TEST(test_concurrent_reads) {
    char err[512];
    weights_set *ws;
    ck_assert_msg(weights_open(FIX "q6_k.gguf", &ws, err, sizeof err) == 0, "%s", err);
    size_t n;
    float *want = load_f32(FIX "q6_k.w.f32", &n);
    ck_assert_uint_eq(n, 5 * 512);
    pthread_t th[4];
    reader_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (reader_arg){ws, want, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, reader, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
        ck_assert_int_eq(a[i].bad, 0);
    }
    free(want);
    weights_close(ws);
}
END_TEST

/* -------------------------------------------------------------- metadata */

/* The rule make_gguf_fixtures.py's arr_str() uses. */
static void arr_str(size_t i, char *buf, size_t len) {
    if (i % 7 == 0)
        buf[0] = 0;
    else if (i == 5) {
        memset(buf, 'x', 300);
        buf[300] = 0;
    } else
        snprintf(buf, len, "tok%zu\xc3\xa9", i);
}

static int str_is(const char *s, size_t n, const char *want) { return n == strlen(want) && !memcmp(s, want, n); }

START_TEST(test_metadata) {
    char err[512];
    weights_set *ws;
    ck_assert_msg(weights_open(FIX "meta.gguf", &ws, err, sizeof err) == 0, "%s", err);
    int64_t i;
    double d;
    const char *s;
    size_t n;
    int et;

    ck_assert_int_eq(weights_meta_int(ws, "test.u8", &i), 0);
    ck_assert_int_eq(i, 200);
    ck_assert_int_eq(weights_meta_int(ws, "test.i8", &i), 0);
    ck_assert_int_eq(i, -100);
    ck_assert_int_eq(weights_meta_int(ws, "test.u16", &i), 0);
    ck_assert_int_eq(i, 60000);
    ck_assert_int_eq(weights_meta_int(ws, "test.i16", &i), 0);
    ck_assert_int_eq(i, -30000);
    ck_assert_int_eq(weights_meta_int(ws, "test.u32", &i), 0);
    ck_assert_int_eq(i, 4000000000LL);
    ck_assert_int_eq(weights_meta_int(ws, "test.i32", &i), 0);
    ck_assert_int_eq(i, -2000000000LL);
    i = 42;
    ck_assert_int_eq(weights_meta_int(ws, "test.u64", &i), -1); /* 2^63 + 5 does not fit */
    ck_assert_int_eq(i, 42);
    ck_assert_int_eq(weights_meta_float(ws, "test.u64", &d), 0);
    ck_assert(d == 9223372036854775808.0);
    ck_assert_int_eq(weights_meta_int(ws, "test.u64_small", &i), 0);
    ck_assert_int_eq(i, 1LL << 40);
    ck_assert_int_eq(weights_meta_int(ws, "test.i64", &i), 0);
    ck_assert_int_eq(i, -(1LL << 50));
    ck_assert_int_eq(weights_meta_int(ws, "test.bool_t", &i), 0);
    ck_assert_int_eq(i, 1);
    ck_assert_int_eq(weights_meta_int(ws, "test.bool_f", &i), 0);
    ck_assert_int_eq(i, 0);
    ck_assert_int_eq(weights_meta_int(ws, "general.alignment", &i), 0);
    ck_assert_int_eq(i, 64);

    ck_assert_int_eq(weights_meta_float(ws, "test.f32", &d), 0);
    ck_assert(d == 1.5);
    ck_assert_int_eq(weights_meta_float(ws, "test.f64", &d), 0);
    ck_assert(d == 3.141592653589793);
    ck_assert_int_eq(weights_meta_float(ws, "test.i16", &d), 0); /* integers convert */
    ck_assert(d == -30000.0);
    ck_assert_int_eq(weights_meta_int(ws, "test.f32", &i), -1); /* floats do not */
    ck_assert_int_eq(weights_meta_float(ws, "test.bool_t", &d), -1);

    ck_assert_int_eq(weights_meta_str(ws, "test.str", &s, &n), 0);
    ck_assert(str_is(s, n, "h\xc3\xa9llo\nworld"));
    ck_assert_int_eq(weights_meta_str(ws, "test.empty_str", &s, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(weights_meta_str(ws, "general.architecture", &s, &n), 0);
    ck_assert(str_is(s, n, "test"));
    ck_assert_int_eq(weights_meta_str(ws, "test.u8", &s, &n), -1);
    ck_assert_int_eq(weights_meta_int(ws, "test.str", &i), -1);
    ck_assert_int_eq(weights_meta_int(ws, "no.such.key", &i), -1);
    ck_assert_int_eq(weights_meta_int(ws, NULL, &i), -1);

    /* the string array, every element */
    ck_assert_int_eq(weights_meta_array(ws, "test.arr_str", &et, &n), 0);
    ck_assert_int_eq(et, WEIGHTS_META_STR);
    ck_assert_uint_eq(n, 1000);
    for (size_t k = 0; k < 1000; k++) {
        char want[320];
        arr_str(k, want, sizeof want);
        ck_assert_int_eq(weights_meta_array_str(ws, "test.arr_str", k, &s, &n), 0);
        ck_assert_msg(str_is(s, n, want), "arr_str[%zu]", k);
    }
    ck_assert_int_eq(weights_meta_array_str(ws, "test.arr_str", 1000, &s, &n), -1);
    ck_assert_int_eq(weights_meta_array_int(ws, "test.arr_str", 0, &i), -1);
    ck_assert_int_eq(weights_meta_array(ws, "test.str", &et, &n), -1);

    static const int64_t i32s[] = {-3, 0, 7, 2147483647, -2147483648LL};
    ck_assert_int_eq(weights_meta_array(ws, "test.arr_i32", &et, &n), 0);
    ck_assert_int_eq(et, WEIGHTS_META_I32);
    ck_assert_uint_eq(n, 5);
    for (size_t k = 0; k < 5; k++) {
        ck_assert_int_eq(weights_meta_array_int(ws, "test.arr_i32", k, &i), 0);
        ck_assert_int_eq(i, i32s[k]);
    }
    ck_assert_int_eq(weights_meta_array_int(ws, "test.arr_i32", 5, &i), -1);
    ck_assert_int_eq(weights_meta_array_str(ws, "test.arr_i32", 0, &s, &n), -1);
    ck_assert_int_eq(weights_meta_array_float(ws, "test.arr_i32", 2, &d), 0);
    ck_assert(d == 7.0);

    ck_assert_int_eq(weights_meta_array(ws, "test.arr_u8", &et, &n), 0);
    ck_assert_int_eq(et, WEIGHTS_META_U8);
    ck_assert_int_eq(weights_meta_array_int(ws, "test.arr_u8", 2, &i), 0);
    ck_assert_int_eq(i, 255);
    ck_assert_int_eq(weights_meta_array_int(ws, "test.arr_i16", 0, &i), 0);
    ck_assert_int_eq(i, -32768);
    ck_assert_int_eq(weights_meta_array_int(ws, "test.arr_u64", 0, &i), 0);
    ck_assert_int_eq(i, 1);
    ck_assert_int_eq(weights_meta_array_int(ws, "test.arr_u64", 1, &i), -1); /* 2^64 - 1 */
    ck_assert_int_eq(weights_meta_array(ws, "test.arr_f32", &et, &n), 0);
    ck_assert_int_eq(et, WEIGHTS_META_F32);
    ck_assert_int_eq(weights_meta_array_float(ws, "test.arr_f32", 2, &d), 0);
    ck_assert(d == (double)1e-3f);
    ck_assert_int_eq(weights_meta_array_int(ws, "test.arr_f32", 0, &i), -1);
    ck_assert_int_eq(weights_meta_array_float(ws, "test.arr_f64", 1, &d), 0);
    ck_assert(d == -1e300);
    ck_assert_int_eq(weights_meta_array(ws, "test.arr_bool", &et, &n), 0);
    ck_assert_int_eq(et, WEIGHTS_META_BOOL);
    ck_assert_int_eq(weights_meta_array_int(ws, "test.arr_bool", 1, &i), 0);
    ck_assert_int_eq(i, 0);
    ck_assert_int_eq(weights_meta_array_int(ws, "test.arr_bool", 2, &i), 0);
    ck_assert_int_eq(i, 1);

    /* listing, in file order */
    ck_assert_uint_eq(weights_meta_count(ws), 25);
    int ty;
    ck_assert_str_eq(weights_meta_key(ws, 0, &ty), "general.architecture");
    ck_assert_int_eq(ty, WEIGHTS_META_STR);
    ck_assert_str_eq(weights_meta_key(ws, 1, &ty), "general.alignment");
    ck_assert_int_eq(ty, WEIGHTS_META_U32);
    ck_assert_str_eq(weights_meta_key(ws, 24, &ty), "test.arr_bool");
    ck_assert_int_eq(ty, WEIGHTS_META_ARRAY);
    ck_assert_ptr_null(weights_meta_key(ws, 25, &ty));

    /* tensors: shapes are ne[] reversed; alignment 64 */
    const weights_tensor *t3 = weights_find(ws, "t3"), *v = weights_find(ws, "v"), *q = weights_find(ws, "q3d");
    ck_assert(t3 && v && q);
    ck_assert_int_eq(t3->dtype, WEIGHTS_F16);
    ck_assert_int_eq(t3->ndim, 3);
    ck_assert(t3->shape[0] == 2 && t3->shape[1] == 3 && t3->shape[2] == 32);
    ck_assert_int_eq(v->ndim, 1);
    ck_assert_int_eq(v->shape[0], 5);
    ck_assert_int_eq(q->dtype, WEIGHTS_Q8_0);
    ck_assert(q->ndim == 3 && q->shape[0] == 2 && q->shape[1] == 3 && q->shape[2] == 64);
    ck_assert_uint_eq(q->nbytes, 6 * 2 * 34);
    ck_assert_uint_eq((uintptr_t)q->data % 64, 0);
    ck_assert_uint_eq((uintptr_t)v->data % 64, 0);
    float got[6 * 64];
    size_t nw;
    float *want = load_f32(FIX "meta.q3d.f32", &nw);
    ck_assert_uint_eq(nw, 6 * 64);
    ck_assert_msg(weights_read_rows_f32(q, 2, 3, got, err, sizeof err) == 0, "%s", err);
    assert_bits_eq(got, want + 2 * 64, 3 * 64, "q3d rows 2..4");
    free(want);
    want = load_f32(FIX "meta.t3.f32", &nw);
    ck_assert_msg(weights_read_rows_f32(t3, 0, 6, got, err, sizeof err) == 0, "%s", err);
    assert_bits_eq(got, want, nw, "t3");
    free(want);
    want = load_f32(FIX "meta.v.f32", &nw);
    ck_assert_msg(weights_read_rows_f32(v, 0, 1, got, err, sizeof err) == 0, "%s", err); /* 1-D: one row */
    assert_bits_eq(got, want, 5, "v");
    ck_assert_int_eq(weights_read_rows_f32(v, 1, 1, got, err, sizeof err), -1);
    free(want);
    weights_close(ws);

    /* a set that is not GGUF has no metadata */
    weights_set *e = weights_new_empty();
    ck_assert_int_eq(weights_is_gguf(e), 0);
    ck_assert_int_eq(weights_meta_int(e, "test.u8", &i), -1);
    ck_assert_uint_eq(weights_meta_count(e), 0);
    ck_assert_ptr_null(weights_meta_key(e, 0, NULL));
    weights_close(e);
    ck_assert_int_eq(weights_is_gguf(NULL), 0);
}
END_TEST

/* ------------------------------------------------------- corrupt images */

/* Where each field of a valid file is: enough to patch any of them. */
typedef struct wkv {
    char key[64];
    size_t key_at, type_at, val_at; /* val_at: arrays: their element type */
} wkv;
typedef struct wti {
    char name[64];
    size_t name_at, ndims_at, ne_at, type_at, off_at;
} wti;
typedef struct walk {
    size_t nkv, nt;
    wkv kv[32];
    wti t[8];
} walk;

static uint64_t g64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint32_t g32(const uint8_t *p) { return (uint32_t)g64((const uint8_t[8]){p[0], p[1], p[2], p[3]}); }
static void p64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void p32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static size_t skip_val(const uint8_t *b, size_t at, uint32_t type) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) return at + 8 + g64(b + at);
    if (type == 9) {
        uint32_t et = g32(b + at);
        uint64_t n = g64(b + at + 4);
        at += 12;
        for (uint64_t i = 0; i < n; i++) at = skip_val(b, at, et);
        return at;
    }
    return at + sz[type];
}

static void do_walk(const uint8_t *b, walk *w) {
    size_t at = 24;
    w->nkv = g64(b + 16);
    w->nt = g64(b + 8);
    ck_assert(w->nkv <= 32 && w->nt <= 8);
    for (size_t i = 0; i < w->nkv; i++) {
        wkv *k = &w->kv[i];
        uint64_t l = g64(b + at);
        k->key_at = at;
        snprintf(k->key, sizeof k->key, "%.*s", (int)l, (const char *)b + at + 8);
        at += 8 + l;
        k->type_at = at;
        k->val_at = at + 4;
        at = skip_val(b, at + 4, g32(b + at));
    }
    for (size_t i = 0; i < w->nt; i++) {
        wti *t = &w->t[i];
        uint64_t l = g64(b + at);
        t->name_at = at;
        snprintf(t->name, sizeof t->name, "%.*s", (int)l, (const char *)b + at + 8);
        at += 8 + l;
        t->ndims_at = at;
        t->ne_at = at + 4;
        at += 4 + 8 * g32(b + at);
        t->type_at = at;
        t->off_at = at + 4;
        at += 12;
    }
}

static const wkv *kv_named(const walk *w, const char *key) {
    for (size_t i = 0; i < w->nkv; i++)
        if (!strcmp(w->kv[i].key, key)) return &w->kv[i];
    ck_abort_msg("fixture has no key %s", key);
    return NULL;
}

static const wti *t_named(const walk *w, const char *name) {
    for (size_t i = 0; i < w->nt; i++)
        if (!strcmp(w->t[i].name, name)) return &w->t[i];
    ck_abort_msg("fixture has no tensor %s", name);
    return NULL;
}

/* Parse an exact-size heap copy (so ASan sees any read past the end). */
static int parse_copy(const uint8_t *img, size_t len, char *err, size_t errlen) {
    uint8_t *b = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(b);
    memcpy(b, img, len);
    weights_set *ws = weights_new_empty();
    ck_assert_ptr_nonnull(ws);
    int rc = weights_parse_gguf_image(ws, "mem.gguf", b, len, err, errlen);
    if (rc == 0) { /* every tensor inside the image */
        for (size_t i = 0; i < weights_count(ws); i++) {
            const weights_tensor *t = weights_at(ws, i);
            ck_assert((const uint8_t *)t->data >= b && (const uint8_t *)t->data + t->nbytes <= b + len);
        }
    } else {
        ck_assert_uint_eq(weights_count(ws), 0);
        ck_assert_int_eq(weights_is_gguf(ws), 0);
    }
    weights_close(ws);
    free(b);
    return rc;
}

static void expect_fail(const uint8_t *img, size_t len, const char *want) {
    char err[512] = "";
    ck_assert_msg(parse_copy(img, len, err, sizeof err) == -1, "accepted a file that should fail with \"%s\"",
                  want);
    ck_assert_msg(strncmp(err, "mem.gguf: ", 10) == 0, "message without the file name: %s", err);
    ck_assert_msg(strstr(err, want) != NULL, "message \"%s\" lacks \"%s\"", err, want);
}

/* A patched copy of the fixture. */
typedef struct img {
    uint8_t *b;
    size_t len;
    walk w;
} img;

static img fixture(const char *name) {
    img m;
    char path[256];
    snprintf(path, sizeof path, FIX "%s", name);
    m.b = load(path, &m.len);
    do_walk(m.b, &m.w);
    char err[512];
    ck_assert_msg(parse_copy(m.b, m.len, err, sizeof err) == 0, "%s", err);
    return m;
}

static uint8_t *dup_img(const img *m) {
    uint8_t *b = malloc(m->len);
    ck_assert_ptr_nonnull(b);
    memcpy(b, m->b, m->len);
    return b;
}

START_TEST(test_corrupt_header) {
    img m = fixture("meta.gguf");
    uint8_t *b = dup_img(&m);
#define RESET() memcpy(b, m.b, m.len)
    b[0] = 'X';
    expect_fail(b, m.len, "bad magic");
    RESET();
    p32(b + 4, 1);
    expect_fail(b, m.len, "unsupported GGUF version 1");
    p32(b + 4, 4);
    expect_fail(b, m.len, "unsupported GGUF version 4");
    p32(b + 4, 0x03000000);
    expect_fail(b, m.len, "big-endian");
    RESET();
    p64(b + 8, UINT64_MAX / 2);
    expect_fail(b, m.len, "tensor count");
    RESET();
    p64(b + 16, 1ULL << 60);
    expect_fail(b, m.len, "key/value count");
    RESET();
    p64(b + 16, m.w.nkv + 1); /* the first tensor info read as a key/value */
    expect_fail(b, m.len, "mem.gguf");
    RESET();
    p64(b + 8, m.w.nt + 1);
    expect_fail(b, m.len, "mem.gguf");
    RESET();
    expect_fail(b, 23, "truncated file: 23 bytes");
    free(b);
    free(m.b);
}
END_TEST

START_TEST(test_corrupt_metadata) {
    img m = fixture("meta.gguf");
    uint8_t *b = dup_img(&m);
    const walk *w = &m.w;

    p64(b + w->kv[3].key_at, 1ULL << 62);
    expect_fail(b, m.len, "key/value #3: truncated file or key length past the end");
    RESET();
    p64(b + kv_named(w, "test.str")->val_at, m.len);
    expect_fail(b, m.len, "test.str: string length runs past the end");
    RESET();
    /* arr_str: element type, count, then element 0's length */
    p64(b + kv_named(w, "test.arr_str")->val_at + 12, 1ULL << 40);
    expect_fail(b, m.len, "test.arr_str: string 0 of the array runs past the end");
    RESET();
    p64(b + kv_named(w, "test.arr_i32")->val_at + 4, 1ULL << 61);
    expect_fail(b, m.len, "test.arr_i32: array of 2305843009213693952 elements runs past");
    RESET();
    p32(b + kv_named(w, "test.u8")->type_at, 13);
    expect_fail(b, m.len, "test.u8: unknown value type 13");
    RESET();
    p32(b + kv_named(w, "test.arr_u8")->val_at, 77);
    expect_fail(b, m.len, "test.arr_u8: unknown array element type 77");
    RESET();
    p32(b + kv_named(w, "test.arr_u8")->val_at, 9);
    expect_fail(b, m.len, "test.arr_u8: arrays of arrays are not supported");
    RESET();
    b[kv_named(w, "test.bool_t")->val_at] = 2;
    expect_fail(b, m.len, "test.bool_t: bool value 2 is not 0 or 1");
    RESET();
    b[kv_named(w, "test.arr_bool")->val_at + 12 + 1] = 7;
    expect_fail(b, m.len, "test.arr_bool: bool value 7");
    RESET();
    memcpy(b + kv_named(w, "test.u16")->key_at + 8, "test.i16", 8); /* same length */
    expect_fail(b, m.len, "test.i16: duplicate key");
    RESET();
    b[kv_named(w, "test.u16")->key_at + 8 + 2] = 0;
    expect_fail(b, m.len, "key contains a NUL byte");
    RESET();
    p32(b + kv_named(w, "general.alignment")->val_at, 48);
    expect_fail(b, m.len, "general.alignment: 48 is not a power of two");
    p32(b + kv_named(w, "general.alignment")->val_at, 0);
    expect_fail(b, m.len, "general.alignment: 0 is not a power of two");
    RESET();
    p32(b + kv_named(w, "general.alignment")->type_at, 5); /* INT32, same size */
    expect_fail(b, m.len, "general.alignment: must be a uint32");
    free(b);
    free(m.b);
}
END_TEST

START_TEST(test_corrupt_tensors) {
    img m = fixture("meta.gguf");
    uint8_t *b = dup_img(&m);
    const walk *w = &m.w;
    const wti *t3 = t_named(w, "t3"), *q = t_named(w, "q3d"), *v = t_named(w, "v");

    p32(b + t3->type_at, 99);
    expect_fail(b, m.len, "t3: unknown tensor type 99");
    p32(b + t3->type_at, 10);
    expect_fail(b, m.len, "t3: unsupported tensor type 10 (Q2_K)");
    p32(b + t3->type_at, 20);
    expect_fail(b, m.len, "unsupported tensor type 20 (IQ4_NL)");
    RESET();
    p64(b + q->off_at, 1ULL << 46);
    expect_fail(b, m.len, "q3d: data [70368744177664, 70368744177664 + 408) outside the data section");
    RESET();
    p64(b + q->off_at, UINT64_MAX - 63); /* aligned, and offset + size wraps */
    expect_fail(b, m.len, "q3d: data");
    RESET();
    p64(b + q->off_at, g64(m.b + q->off_at) + 32);
    expect_fail(b, m.len, "not a multiple of the alignment 64");
    RESET();
    p64(b + q->off_at, g64(m.b + v->off_at));
    expect_fail(b, m.len, "overlaps tensor");
    RESET();
    p64(b + t3->ne_at, 1ULL << 40);
    p64(b + t3->ne_at + 8, 1ULL << 40);
    expect_fail(b, m.len, "t3: element count overflows");
    RESET();
    p64(b + t3->ne_at + 8, 0);
    expect_fail(b, m.len, "t3: dimension ne[1] = 0 is not in 1..INT64_MAX");
    p64(b + t3->ne_at + 8, 1ULL << 63);
    expect_fail(b, m.len, "is not in 1..INT64_MAX");
    RESET();
    p32(b + t3->ndims_at, 5);
    expect_fail(b, m.len, "t3: n_dims 5 outside 1..4");
    p32(b + t3->ndims_at, 0);
    expect_fail(b, m.len, "t3: n_dims 0");
    RESET();
    p64(b + q->ne_at, 48);
    expect_fail(b, m.len, "q3d: row length ne[0] = 48 is not a multiple of the Q8_0 block (32)");
    RESET();
    p64(b + t3->name_at, 1ULL << 50);
    expect_fail(b, m.len, "tensor #0: truncated file or name length past the end");
    RESET();
    b[t3->name_at + 8 + 1] = 0;
    expect_fail(b, m.len, "tensor name contains a NUL byte");
    free(b);
    free(m.b);

    /* Duplicate names: q8_0.gguf holds "w" and "r". */
    m = fixture("q8_0.gguf");
    b = dup_img(&m);
    b[t_named(&m.w, "r")->name_at + 8] = 'w';
    expect_fail(b, m.len, "w: duplicate tensor name");
    free(b);
    free(m.b);
}
END_TEST

/* Cut the file at every offset: an error (never a crash) until the last
 * tensor's data is complete; the trailing padding after it is optional. */
START_TEST(test_truncated_everywhere) {
    static const char *files[] = {"meta.gguf", "q4_k.gguf"};
    for (size_t f = 0; f < 2; f++) {
        img m = fixture(files[f]);
        char err[512];
        weights_set *ws = weights_new_empty();
        ck_assert_int_eq(weights_parse_gguf_image(ws, "x", m.b, m.len, err, sizeof err), 0);
        size_t end = 0;
        for (size_t i = 0; i < weights_count(ws); i++) {
            const weights_tensor *t = weights_at(ws, i);
            size_t e = (size_t)((const uint8_t *)t->data - m.b) + t->nbytes;
            if (e > end) end = e;
        }
        weights_close(ws);
        for (size_t cut = 0; cut < m.len; cut++) {
            int rc = parse_copy(m.b, cut, err, sizeof err);
            if (cut < end)
                ck_assert_msg(rc == -1 && strncmp(err, "mem.gguf: ", 10) == 0, "%s cut at %zu: rc %d (%s)",
                              files[f], cut, rc, err);
            else
                ck_assert_msg(rc == 0, "%s cut at %zu (after the data): %s", files[f], cut, err);
        }
        free(m.b);
    }
}
END_TEST

START_TEST(test_open_paths) {
    char err[512];
    weights_set *ws = weights_new_empty(), *ws2;
    size_t len;
    uint8_t *b = load(FIX "q8_0.gguf", &len);
    ck_assert_int_eq(weights_parse_gguf_image(ws, "a.gguf", b, len, err, sizeof err), 0);
    /* a GGUF file is a whole checkpoint */
    ck_assert_int_eq(weights_parse_gguf_image(ws, "b.gguf", b, len, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "b.gguf: a GGUF file must be the only file"));
    ck_assert_uint_eq(weights_count(ws), 2);
    weights_close(ws);

    /* a truncated file on disk: the message names its path */
    char *dir = tu_mkdtemp();
    char path[1024];
    snprintf(path, sizeof path, "%s/cut.gguf", dir);
    ck_assert_int_eq(tu_write_file(path, b, 100), 0);
    ck_assert_int_eq(weights_open(path, &ws2, err, sizeof err), -1);
    ck_assert_ptr_null(ws2);
    ck_assert_msg(strncmp(err, path, strlen(path)) == 0, "%s", err);
    /* no magic, no GGUF: a safetensors error */
    ck_assert_int_eq(tu_write_file(path, "GGUX", 4), 0);
    ck_assert_int_eq(weights_open(path, &ws2, err, sizeof err), -1);
    ck_assert_ptr_null(strstr(err, "GGUF"));
    tu_rmtree(dir);
    free(dir);
    free(b);
}
END_TEST

/* ------------------------------------------------------------ the model */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

START_TEST(test_smollm2) {
    const char *path = getenv("ECHO_GGUF_MODEL");
    if (!path || !*path) path = MODEL_DEFAULT;
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "test_smollm2: SKIPPED: %s not found (set ECHO_GGUF_MODEL or run scripts/fetch-model.sh)\n",
                path);
        return;
    }
    char err[512];
    weights_set *ws;
    ck_assert_msg(weights_open(path, &ws, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(weights_count(ws), 272);
    int64_t i;
    double d;
    const char *s;
    size_t n;
    int et;
    ck_assert_int_eq(weights_meta_int(ws, "llama.block_count", &i), 0);
    ck_assert_int_eq(i, 30);
    ck_assert_int_eq(weights_meta_int(ws, "llama.attention.head_count_kv", &i), 0);
    ck_assert_int_eq(i, 3);
    ck_assert_int_eq(weights_meta_float(ws, "llama.rope.freq_base", &d), 0);
    ck_assert(d == 100000.0);
    ck_assert_int_eq(weights_meta_str(ws, "general.architecture", &s, &n), 0);
    ck_assert(str_is(s, n, "llama"));
    ck_assert_int_eq(weights_meta_str(ws, "tokenizer.chat_template", &s, &n), 0);
    ck_assert_uint_eq(n, 368);
    ck_assert(n > 14 && !memcmp(s, "{% for message", 14));
    ck_assert_int_eq(weights_meta_array(ws, "tokenizer.ggml.tokens", &et, &n), 0);
    ck_assert_int_eq(et, WEIGHTS_META_STR);
    ck_assert_uint_eq(n, 49152);
    ck_assert_int_eq(weights_meta_array_str(ws, "tokenizer.ggml.tokens", 0, &s, &n), 0);
    ck_assert(str_is(s, n, "<|endoftext|>"));
    ck_assert_int_eq(weights_meta_array_str(ws, "tokenizer.ggml.tokens", 2, &s, &n), 0);
    ck_assert(str_is(s, n, "<|im_end|>"));
    ck_assert_int_eq(weights_meta_array_str(ws, "tokenizer.ggml.tokens", 1000, &s, &n), 0);
    ck_assert(str_is(s, n, "()"));
    ck_assert_int_eq(weights_meta_array_str(ws, "tokenizer.ggml.tokens", 49151, &s, &n), 0);
    ck_assert(str_is(s, n, "ectable"));
    ck_assert_int_eq(weights_meta_array(ws, "tokenizer.ggml.merges", &et, &n), 0);
    ck_assert_uint_eq(n, 48900);
    ck_assert_int_eq(weights_meta_array_str(ws, "tokenizer.ggml.merges", 0, &s, &n), 0);
    ck_assert(str_is(s, n, "\xc4\xa0 t"));
    ck_assert_int_eq(weights_meta_array_int(ws, "tokenizer.ggml.token_type", 0, &i), 0);
    ck_assert_int_eq(i, 3);
    ck_assert_int_eq(weights_meta_array_int(ws, "tokenizer.ggml.token_type", 49151, &i), 0);
    ck_assert_int_eq(i, 1);

    const weights_tensor *emb = weights_find(ws, "token_embd.weight"), *k = weights_find(ws, "blk.0.attn_k.weight");
    ck_assert(emb && k);
    ck_assert(emb->dtype == WEIGHTS_Q8_0 && emb->ndim == 2 && emb->shape[0] == 49152 && emb->shape[1] == 576);
    ck_assert(k->dtype == WEIGHTS_Q4_1 && k->ndim == 2 && k->shape[0] == 192 && k->shape[1] == 576);

    static const struct {
        const char *name;
        int64_t r0, nr;
    } rows[] = {
        {"blk.0.attn_q.weight", 0, 4},    {"blk.0.attn_q.weight", 286, 3}, {"blk.0.attn_q.weight", 574, 2},
        {"blk.29.ffn_down.weight", 100, 2}, {"token_embd.weight", 0, 2},   {"token_embd.weight", 49151, 1},
        {"output_norm.weight", 0, 1},
    };
    if (st.st_size != MODEL_SIZE)
        ck_abort_msg("%s is %lld bytes, the reference rows are for a %d-byte file: regenerate them with "
                     "make_gguf_fixtures.py --model",
                     path, (long long)st.st_size, MODEL_SIZE);
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        char ref[256];
        snprintf(ref, sizeof ref, FIX "smollm2-%s-%lld-%lld.f32", rows[r].name, (long long)rows[r].r0,
                 (long long)rows[r].nr);
        const weights_tensor *t = weights_find(ws, rows[r].name);
        ck_assert_ptr_nonnull(t);
        float *want = load_f32(ref, &n);
        ck_assert_uint_eq(n, (size_t)(rows[r].nr * t->shape[t->ndim - 1]));
        float *got = malloc(n * sizeof *got);
        ck_assert_msg(weights_read_rows_f32(t, rows[r].r0, rows[r].nr, got, err, sizeof err) == 0, "%s", err);
        assert_bits_eq(got, want, n, ref);
        free(got);
        free(want);
    }

    /* Every tensor, in chunks of rows: all finite; timed for the report. */
    size_t chunk = 1 << 20;
    float *buf = malloc(chunk * sizeof *buf);
    ck_assert_ptr_nonnull(buf);
    double dt = 0;
    uint64_t total = 0, bad = 0;
    int rc = 0;
    for (size_t ti = 0; ti < weights_count(ws); ti++) {
        const weights_tensor *t = weights_at(ws, ti);
        int64_t cols = t->shape[t->ndim - 1], nrows = 1;
        for (int dd = 0; dd + 1 < t->ndim; dd++) nrows *= t->shape[dd];
        int64_t step = (int64_t)chunk / cols;
        for (int64_t r0 = 0; r0 < nrows; r0 += step) {
            int64_t nr = nrows - r0 < step ? nrows - r0 : step;
            double t0 = now_s();
            rc |= weights_read_rows_f32(t, r0, nr, buf, err, sizeof err);
            dt += now_s() - t0;
            /* no ck_assert per element: Check writes a mark per call */
            for (int64_t e = 0; e < nr * cols; e++) bad += !(buf[e] - buf[e] == 0.0f);
            total += (uint64_t)(nr * cols);
        }
    }
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_msg(bad == 0, "%llu values are not finite", (unsigned long long)bad);
    fprintf(stderr, "test_smollm2: dequantized all %zu tensors, %llu values, in %.3f s (%.0f M values/s)\n",
            weights_count(ws), (unsigned long long)total, dt, (double)total / dt / 1e6);
    free(buf);
    weights_close(ws);
}
END_TEST

static Suite *gguf_suite(void) {
    Suite *s = suite_create("gguf");
    TCase *ok = tcase_create("valid");
    tcase_add_test(ok, test_every_type);
    tcase_add_test(ok, test_dtype_helpers);
    tcase_add_test(ok, test_metadata);
    tcase_add_test(ok, test_open_paths);
    tcase_add_test(ok, test_concurrent_reads);
    suite_add_tcase(s, ok);
    TCase *bad = tcase_create("corrupt");
    tcase_set_timeout(bad, 120);
    tcase_add_test(bad, test_corrupt_header);
    tcase_add_test(bad, test_corrupt_metadata);
    tcase_add_test(bad, test_corrupt_tensors);
    tcase_add_test(bad, test_truncated_everywhere);
    suite_add_tcase(s, bad);
    TCase *model = tcase_create("smollm2");
    tcase_set_timeout(model, 300);
    tcase_add_test(model, test_smollm2);
    suite_add_tcase(s, model);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(gguf_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
