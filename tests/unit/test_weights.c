/*
 * weights/ safetensors reader: valid single-file and sharded checkpoints,
 * weights_get() checks, and one test per corruption the reader must reject
 * with a message (never a crash). Files are written from C into a fresh
 * temporary folder per test.
 */
#include <check.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/testutil.h"
#include "weights/weights.h"

static char *g_dir;

static void setup(void) {
    g_dir = tu_mkdtemp();
    ck_assert_ptr_nonnull(g_dir);
}

static void teardown(void) {
    tu_rmtree(g_dir);
    free(g_dir);
    g_dir = NULL;
}

/* Path of `name` inside the test folder (rotating buffers: a few may be live). */
static const char *pth(const char *name) {
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", g_dir, name);
    return b;
}

/* A safetensors file with an explicit header-length field (may lie) and
 * `hl` header bytes (may hold NULs). */
static void write_st_raw(const char *name, uint64_t hlen, const char *hdr, size_t hl, const void *data,
                         size_t dlen) {
    size_t n = 8 + hl + dlen;
    unsigned char *b = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, hdr, hl);
    if (dlen) memcpy(b + 8 + hl, data, dlen);
    ck_assert_int_eq(tu_write_file(pth(name), b, n), 0);
    free(b);
}

static void write_st_len(const char *name, uint64_t hlen, const char *hdr, const void *data, size_t dlen) {
    write_st_raw(name, hlen, hdr, strlen(hdr), data, dlen);
}

static void write_st(const char *name, const char *hdr, const void *data, size_t dlen) {
    write_st_len(name, strlen(hdr), hdr, data, dlen);
}

static void write_text(const char *name, const char *text) {
    ck_assert_int_eq(tu_write_file(pth(name), text, strlen(text)), 0);
}

/* Zero-filled data area of n bytes for headers that only need room. */
static const unsigned char ZEROS[4096];

/* weights_open(path) must fail, leave *out NULL, and mention every
 * NULL-terminated keyword. */
static void expect_fail(const char *path, ...) {
    char err[1024] = "";
    weights_set *ws = (weights_set *)&g_dir; /* poison: must be reset to NULL */
    int rc = weights_open(path, &ws, err, sizeof err);
    ck_assert_int_eq(rc, -1);
    ck_assert_ptr_null(ws);
    ck_assert_msg(strchr(err, '\n') == NULL, "newline in message: %s", err);
    va_list ap;
    va_start(ap, path);
    for (const char *k; (k = va_arg(ap, const char *)) != NULL;)
        ck_assert_msg(strstr(err, k) != NULL, "expected \"%s\" in error: %s", k, err);
    va_end(ap);
}

/* One-tensor file whose entry is `entry` (the JSON object text). */
static void expect_bad_entry(const char *entry, size_t dlen, const char *k1, const char *k2) {
    char hdr[1024];
    snprintf(hdr, sizeof hdr, "{\"bad.tensor.name\": %s}", entry);
    write_st("bad.safetensors", hdr, ZEROS, dlen);
    expect_fail(pth("bad.safetensors"), "bad.safetensors", "bad.tensor.name", k1, k2, (const char *)NULL);
}

static weights_set *open_ok(const char *path) {
    char err[1024] = "";
    weights_set *ws = NULL;
    int rc = weights_open(path, &ws, err, sizeof err);
    ck_assert_msg(rc == 0, "weights_open(%s) failed: %s", path, err);
    ck_assert_ptr_nonnull(ws);
    return ws;
}

/* ------------------------------------------------------------ valid files */

#define LONG_NAME "model.layers.0.self_attn.q_proj.weight"

/* BF16 [2,3] @0..12, F16 [4] @12..20, F32 [2,2] @20..36, I8 [3] @36..39,
 * F32 scalar @39..43, F32 [0,5] empty @43..43. */
static const char *VALID_HDR =
    "{\"__metadata__\": {\"format\": \"pt\"},"
    " \"" LONG_NAME "\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 12]},"
    " \"h\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [12, 20]},"
    " \"f\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [20, 36]},"
    " \"q\": {\"dtype\": \"I8\", \"shape\": [3], \"data_offsets\": [36, 39]},"
    " \"s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [39, 43]},"
    " \"e\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [43, 43]}}";
#define VALID_DLEN 43

static void valid_data(unsigned char *d) {
    for (int i = 0; i < VALID_DLEN; i++) d[i] = (unsigned char)(i * 7 + 1);
}

static void check_valid_set(const weights_set *ws, const char *file) {
    unsigned char d[VALID_DLEN];
    valid_data(d);
    ck_assert_uint_eq(weights_count(ws), 6);
    ck_assert_uint_eq(weights_total_bytes(ws), VALID_DLEN);

    const weights_tensor *t = weights_find(ws, LONG_NAME);
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(t->name, LONG_NAME);
    ck_assert_int_eq(t->dtype, WEIGHTS_BF16);
    ck_assert_int_eq(t->ndim, 2);
    ck_assert_int_eq(t->shape[0], 2);
    ck_assert_int_eq(t->shape[1], 3);
    ck_assert_uint_eq(t->nbytes, 12);
    ck_assert_int_eq(memcmp(t->data, d, 12), 0);
    ck_assert_str_eq(t->file, file);

    t = weights_find(ws, "h");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->dtype, WEIGHTS_F16);
    ck_assert_int_eq(t->ndim, 1);
    ck_assert_int_eq(t->shape[0], 4);
    ck_assert_int_eq(memcmp(t->data, d + 12, 8), 0);

    t = weights_find(ws, "f");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->dtype, WEIGHTS_F32);
    ck_assert_uint_eq(t->nbytes, 16);
    ck_assert_int_eq(memcmp(t->data, d + 20, 16), 0);

    t = weights_find(ws, "s");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->ndim, 0);
    ck_assert_uint_eq(t->nbytes, 4);
    ck_assert_int_eq(memcmp(t->data, d + 39, 4), 0);

    t = weights_find(ws, "e");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->ndim, 2);
    ck_assert_int_eq(t->shape[0], 0);
    ck_assert_int_eq(t->shape[1], 5);
    ck_assert_uint_eq(t->nbytes, 0);

    ck_assert_ptr_null(weights_find(ws, "__metadata__"));
    ck_assert_ptr_null(weights_find(ws, "nope"));

    /* weights_at: header order, every tensor reachable and consistent with find. */
    static const char *order[] = {LONG_NAME, "h", "f", "q", "s", "e"};
    for (size_t i = 0; i < 6; i++) {
        const weights_tensor *a = weights_at(ws, i);
        ck_assert_ptr_nonnull(a);
        ck_assert_str_eq(a->name, order[i]);
        ck_assert_ptr_eq(weights_find(ws, a->name), a);
    }
    ck_assert_ptr_null(weights_at(ws, 6));
}

START_TEST(test_single_file_valid) {
    unsigned char d[VALID_DLEN];
    valid_data(d);
    write_st("one.safetensors", VALID_HDR, d, sizeof d);
    weights_set *ws = open_ok(pth("one.safetensors"));
    check_valid_set(ws, pth("one.safetensors"));
    weights_close(ws);
}
END_TEST

START_TEST(test_folder_single_file) {
    unsigned char d[VALID_DLEN];
    valid_data(d);
    write_st("model.safetensors", VALID_HDR, d, sizeof d);
    weights_set *ws = open_ok(g_dir);
    check_valid_set(ws, pth("model.safetensors"));
    weights_close(ws);
}
END_TEST

START_TEST(test_header_padding_and_unicode) {
    /* The reference writer pads the header with spaces to a multiple of 8. */
    const char *hdr = "{\"w\\u00e9\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}      ";
    write_st("pad.safetensors", hdr, "\1\2\3\4", 4);
    weights_set *ws = open_ok(pth("pad.safetensors"));
    ck_assert_uint_eq(weights_count(ws), 1);
    const weights_tensor *t = weights_find(ws, "w\xc3\xa9");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(memcmp(t->data, "\1\2\3\4", 4), 0);
    weights_close(ws);
}
END_TEST

START_TEST(test_empty_header_and_gaps) {
    /* No tensors at all, and a tensor after an unused gap: both legal. */
    write_st("empty.safetensors", "{}", NULL, 0);
    weights_set *ws = open_ok(pth("empty.safetensors"));
    ck_assert_uint_eq(weights_count(ws), 0);
    ck_assert_ptr_null(weights_at(ws, 0));
    weights_close(ws);

    write_st("gap.safetensors", "{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [6, 8]}}", ZEROS,
             8);
    ws = open_ok(pth("gap.safetensors"));
    ck_assert_uint_eq(weights_count(ws), 1);
    weights_close(ws);
}
END_TEST

/* Two shards: a.safetensors {x: F32 [2], y: BF16 [3]}, b.safetensors {z: F16 [2,2]}. */
static void write_sharded(int with_extra) {
    const float x[2] = {1.5f, -2.0f};
    unsigned char a[14];
    memcpy(a, x, 8);
    for (int i = 0; i < 6; i++) a[8 + i] = (unsigned char)(0xA0 + i);
    write_st("a.safetensors",
             "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
             " \"y\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [8, 14]}}",
             a, sizeof a);
    unsigned char b[10];
    for (int i = 0; i < 10; i++) b[i] = (unsigned char)(0x10 + i);
    write_st("b.safetensors",
             with_extra ? "{\"z\": {\"dtype\": \"F16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]},"
                          " \"extra\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [8, 10]}}"
                        : "{\"z\": {\"dtype\": \"F16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}",
             b, sizeof b);
    write_text("model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 22}, \"weight_map\": {\"z\": \"b.safetensors\","
               " \"x\": \"a.safetensors\", \"y\": \"a.safetensors\"}}");
}

START_TEST(test_sharded_valid) {
    write_sharded(0);
    /* A model.safetensors next to the index must be ignored: the index wins. */
    write_text("model.safetensors", "garbage");
    weights_set *ws = open_ok(g_dir);
    ck_assert_uint_eq(weights_count(ws), 3);
    ck_assert_uint_eq(weights_total_bytes(ws), 22);
    /* Shards load in sorted name order, tensors in header order. */
    ck_assert_str_eq(weights_at(ws, 0)->name, "x");
    ck_assert_str_eq(weights_at(ws, 1)->name, "y");
    ck_assert_str_eq(weights_at(ws, 2)->name, "z");

    const weights_tensor *t = NULL;
    char err[256];
    const int64_t s2[1] = {2};
    ck_assert_int_eq(weights_get(ws, "x", 1, s2, &t, err, sizeof err), 0);
    ck_assert_str_eq(t->file, pth("a.safetensors"));
    float x[2];
    memcpy(x, t->data, 8);
    ck_assert_float_eq(x[0], 1.5f);
    ck_assert_float_eq(x[1], -2.0f);

    t = weights_find(ws, "z");
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(t->file, pth("b.safetensors"));
    ck_assert_int_eq(t->dtype, WEIGHTS_F16);
    ck_assert_int_eq(((const unsigned char *)t->data)[7], 0x17);

    t = weights_find(ws, "y");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(((const unsigned char *)t->data)[0], 0xA0);
    weights_close(ws);

    /* The index file itself is accepted as the path. */
    ws = open_ok(pth("model.safetensors.index.json"));
    ck_assert_uint_eq(weights_count(ws), 3);
    weights_close(ws);
}
END_TEST

START_TEST(test_sharded_extra_tensor_accepted) {
    /* A tensor a shard holds but the index does not list is kept. */
    write_sharded(1);
    weights_set *ws = open_ok(g_dir);
    ck_assert_uint_eq(weights_count(ws), 4);
    ck_assert_ptr_nonnull(weights_find(ws, "extra"));
    weights_close(ws);
}
END_TEST

START_TEST(test_many_tensors_lookup) {
    /* Enough tensors to make the hash table grow several times. */
    enum { N = 500 };
    size_t cap = N * 128 + 16, o = 0;
    char *hdr = malloc(cap);
    ck_assert_ptr_nonnull(hdr);
    o += (size_t)snprintf(hdr + o, cap - o, "{");
    for (int i = 0; i < N; i++)
        o += (size_t)snprintf(hdr + o, cap - o,
                              "%s\"model.layers.%d.mlp.weight\": {\"dtype\": \"BF16\", \"shape\": [1],"
                              " \"data_offsets\": [%d, %d]}",
                              i ? ", " : "", i, 2 * i, 2 * i + 2);
    snprintf(hdr + o, cap - o, "}");
    unsigned char *d = malloc(2 * N);
    ck_assert_ptr_nonnull(d);
    for (int i = 0; i < 2 * N; i++) d[i] = (unsigned char)(i / 2);
    write_st("many.safetensors", hdr, d, 2 * N);
    weights_set *ws = open_ok(pth("many.safetensors"));
    ck_assert_uint_eq(weights_count(ws), N);
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.mlp.weight", i);
        const weights_tensor *t = weights_find(ws, name);
        ck_assert_ptr_nonnull(t);
        ck_assert_ptr_eq(t, weights_at(ws, (size_t)i));
        ck_assert_int_eq(((const unsigned char *)t->data)[0], (unsigned char)i);
    }
    ck_assert_ptr_null(weights_find(ws, "model.layers.500.mlp.weight"));
    weights_close(ws);
    free(d);
    free(hdr);
}
END_TEST


/* Rss (kB) of the mapping holding p, from /proc/self/smaps; -1 if none. */
static long mapping_rss_kb(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0;
    long rss = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (in && sscanf(line, "Rss: %ld kB", &rss) == 1) break;
    }
    fclose(f);
    return rss;
}

START_TEST(test_drop_pages) {
    /* 1 MiB of F32 values i: after the drop the pages leave the mapping's
     * RSS, and every value reads back the same (faulted in from the file);
     * memory the set did not map is left alone. */
    enum { N = 1 << 18 };
    float *d = malloc(N * sizeof *d);
    ck_assert_ptr_nonnull(d);
    for (int i = 0; i < N; i++) d[i] = (float)i;
    char hdr[128];
    snprintf(hdr, sizeof hdr, "{\"w\": {\"dtype\": \"F32\", \"shape\": [%d], \"data_offsets\": [0, %d]}}", N,
             (int)(N * sizeof *d));
    write_st("big.safetensors", hdr, d, N * sizeof *d);
    weights_set *ws = open_ok(pth("big.safetensors"));
    const weights_tensor *t = weights_find(ws, "w");
    ck_assert_ptr_nonnull(t);
    const float *w = t->data;
    double sum = 0;
    for (int i = 0; i < N; i++) sum += w[i];
    long before = mapping_rss_kb(w);
    ck_assert_int_ge(before, 1000); /* all of it was read */
    weights_drop_pages(ws, w, N * sizeof *w);
    long after = mapping_rss_kb(w);
    ck_assert_msg(after >= 0 && after <= 8, "rss %ld kB -> %ld kB", before, after);
    for (int i = 0; i < N; i++) ck_assert_float_eq(w[i], (float)i);
    ck_assert(sum > 0);
    weights_drop_pages(ws, d, N * sizeof *d); /* not the set's: untouched */
    weights_drop_pages(NULL, w, 16);
    for (int i = 0; i < N; i++) ck_assert_float_eq(d[i], (float)i);
    weights_close(ws);
    free(d);
}
END_TEST

/* ------------------------------------------------------------- weights_get */

START_TEST(test_get_ok_and_errors) {
    unsigned char d[VALID_DLEN];
    valid_data(d);
    write_st("one.safetensors", VALID_HDR, d, sizeof d);
    weights_set *ws = open_ok(pth("one.safetensors"));
    const weights_tensor *t = NULL;
    char err[512];

    const int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s4[1] = {4}, s05[2] = {0, 5};
    ck_assert_int_eq(weights_get(ws, LONG_NAME, 2, s23, &t, err, sizeof err), 0);
    ck_assert_ptr_eq(t, weights_find(ws, LONG_NAME));
    ck_assert_int_eq(weights_get(ws, "h", 1, s4, &t, err, sizeof err), 0);
    ck_assert_int_eq(weights_get(ws, "s", 0, NULL, &t, err, sizeof err), 0);
    ck_assert_int_eq(weights_get(ws, "e", 2, s05, &t, err, sizeof err), 0);

    /* Shape mismatch: both shapes in the message. */
    t = (const weights_tensor *)ws;
    ck_assert_int_eq(weights_get(ws, LONG_NAME, 2, s32, &t, err, sizeof err), -1);
    ck_assert_ptr_null(t);
    ck_assert_ptr_nonnull(strstr(err, LONG_NAME));
    ck_assert_ptr_nonnull(strstr(err, "shape mismatch"));
    ck_assert_ptr_nonnull(strstr(err, "expected [3, 2]"));
    ck_assert_ptr_nonnull(strstr(err, "found [2, 3]"));
    ck_assert_ptr_nonnull(strstr(err, "one.safetensors"));

    /* Rank mismatch. */
    ck_assert_int_eq(weights_get(ws, "h", 2, s23, &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "expected [2, 3], found [4]"));

    /* Unsupported dtype. */
    const int64_t s3[1] = {3};
    ck_assert_int_eq(weights_get(ws, "q", 1, s3, &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, ": q: "));
    ck_assert_ptr_nonnull(strstr(err, "I8"));
    ck_assert_ptr_nonnull(strstr(err, "not supported"));

    /* Missing. */
    ck_assert_int_eq(weights_get(ws, "lm_head.weight", 1, s3, &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "lm_head.weight"));
    ck_assert_ptr_nonnull(strstr(err, "missing"));

    /* Bad arguments are errors, not crashes; a NULL or tiny buffer is fine. */
    ck_assert_int_eq(weights_get(ws, "h", 1, NULL, &t, err, sizeof err), -1);
    ck_assert_int_eq(weights_get(ws, "h", WEIGHTS_MAX_DIMS + 1, s4, &t, err, sizeof err), -1);
    ck_assert_int_eq(weights_get(ws, "h", -1, s4, &t, err, sizeof err), -1);
    ck_assert_int_eq(weights_get(ws, "nope", 1, s4, &t, NULL, 0), -1);
    char tiny[6];
    ck_assert_int_eq(weights_get(ws, "nope", 1, s4, &t, tiny, sizeof tiny), -1);
    ck_assert_uint_lt(strlen(tiny), sizeof tiny);
    weights_close(ws);
}
END_TEST

START_TEST(test_dtype_helpers) {
    ck_assert_uint_eq(weights_dtype_size(WEIGHTS_F32), 4);
    ck_assert_uint_eq(weights_dtype_size(WEIGHTS_F16), 2);
    ck_assert_uint_eq(weights_dtype_size(WEIGHTS_BF16), 2);
    ck_assert_uint_eq(weights_dtype_size(WEIGHTS_F64), 8);
    ck_assert_uint_eq(weights_dtype_size(WEIGHTS_I8), 1);
    ck_assert_uint_eq(weights_dtype_size(WEIGHTS_F8_E4M3), 1);
    ck_assert_uint_eq(weights_dtype_size(WEIGHTS_U64), 8);
    ck_assert_uint_eq(weights_dtype_size((weights_dtype)99), 0);
    ck_assert_str_eq(weights_dtype_name(WEIGHTS_BF16), "BF16");
    ck_assert_str_eq(weights_dtype_name(WEIGHTS_F8_E5M2), "F8_E5M2");
    ck_assert_ptr_nonnull(weights_dtype_name((weights_dtype)99));
    /* NULL-tolerant accessors. */
    ck_assert_uint_eq(weights_count(NULL), 0);
    ck_assert_ptr_null(weights_at(NULL, 0));
    ck_assert_ptr_null(weights_find(NULL, "x"));
    ck_assert_uint_eq(weights_total_bytes(NULL), 0);
    weights_close(NULL);
}
END_TEST

START_TEST(test_parse_image_in_memory) {
    /* The fuzz entry point: two images into one set, then a clash. */
    static const char h1[] = "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}";
    unsigned char img[8 + sizeof h1 - 1 + 4];
    for (int i = 0; i < 8; i++) img[i] = (unsigned char)((sizeof h1 - 1) >> (8 * i));
    memcpy(img + 8, h1, sizeof h1 - 1);
    memcpy(img + 8 + sizeof h1 - 1, "\1\2\3\4", 4);
    char err[512];
    weights_set *ws = weights_new_empty();
    ck_assert_ptr_nonnull(ws);
    ck_assert_int_eq(weights_parse_file_image(ws, "mem1", img, sizeof img, err, sizeof err), 0);
    ck_assert_uint_eq(weights_count(ws), 1);
    ck_assert_str_eq(weights_find(ws, "a")->file, "mem1");
    /* Same tensor again from another "shard": rejected, set unchanged. */
    ck_assert_int_eq(weights_parse_file_image(ws, "mem2", img, sizeof img, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "mem2: a: duplicate"));
    ck_assert_ptr_nonnull(strstr(err, "mem1"));
    ck_assert_uint_eq(weights_count(ws), 1);
    /* A failing image leaves no partial tensors behind. */
    ck_assert_int_eq(weights_parse_file_image(ws, "mem3", img, 9, err, sizeof err), -1);
    ck_assert_uint_eq(weights_count(ws), 1);
    ck_assert_int_eq(weights_parse_file_image(ws, "mem4", NULL, 0, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "truncated"));
    weights_close(ws);
}
END_TEST

/* ------------------------------------------------------- opening failures */

START_TEST(test_folder_without_checkpoint) {
    write_text("config.json", "{}");
    expect_fail(g_dir, g_dir, "neither", "model.safetensors.index.json", "model.safetensors", (const char *)NULL);
}
END_TEST

START_TEST(test_path_does_not_exist) {
    expect_fail(pth("nothing.safetensors"), "nothing.safetensors", "No such file", (const char *)NULL);
    char err[64];
    weights_set *ws = NULL;
    ck_assert_int_eq(weights_open(NULL, &ws, err, sizeof err), -1);
    ck_assert_int_eq(weights_open(g_dir, NULL, err, sizeof err), -1);
}
END_TEST

/* ---------------------------------------------- corrupt files, one per case */

START_TEST(test_truncated_short) {
    ck_assert_int_eq(tu_write_file(pth("short.safetensors"), "\x02\0\0\0\0", 5), 0);
    expect_fail(pth("short.safetensors"), "short.safetensors", "truncated", (const char *)NULL);
}
END_TEST

START_TEST(test_truncated_empty_file) {
    ck_assert_int_eq(tu_write_file(pth("zero.safetensors"), "", 0), 0);
    expect_fail(pth("zero.safetensors"), "zero.safetensors", "truncated", (const char *)NULL);
}
END_TEST

START_TEST(test_header_length_beyond_file) {
    write_st_len("long.safetensors", 1000, "{}", NULL, 0);
    expect_fail(pth("long.safetensors"), "long.safetensors", "truncated", "header length 1000", (const char *)NULL);
    write_st_len("huge.safetensors", UINT64_MAX, "{}", NULL, 0);
    expect_fail(pth("huge.safetensors"), "huge.safetensors", "header length", (const char *)NULL);
}
END_TEST

START_TEST(test_malformed_json) {
    write_st("bad.safetensors", "{\"a\": {\"dtype\": \"F32\", ", NULL, 0);
    expect_fail(pth("bad.safetensors"), "bad.safetensors", "malformed header JSON", (const char *)NULL);
    /* Trailing garbage after the object is malformed too. */
    write_st("bad2.safetensors", "{} x", NULL, 0);
    expect_fail(pth("bad2.safetensors"), "bad2.safetensors", "JSON", (const char *)NULL);
    /* A NUL inside the header. */
    write_st_raw("bad3.safetensors", 4, "{}\0}", 4, NULL, 0);
    expect_fail(pth("bad3.safetensors"), "bad3.safetensors", "JSON", (const char *)NULL);
}
END_TEST

START_TEST(test_header_not_object) {
    write_st("arr.safetensors", "[1, 2]", NULL, 0);
    expect_fail(pth("arr.safetensors"), "arr.safetensors", "not an object", (const char *)NULL);
}
END_TEST

START_TEST(test_entry_not_object) { expect_bad_entry("[1, 2]", 0, "not a JSON object", NULL); }
END_TEST

START_TEST(test_missing_dtype) {
    expect_bad_entry("{\"shape\": [1], \"data_offsets\": [0, 4]}", 4, "missing", "dtype");
}
END_TEST

START_TEST(test_dtype_wrong_type) {
    expect_bad_entry("{\"dtype\": 7, \"shape\": [1], \"data_offsets\": [0, 4]}", 4, "dtype", "not a string");
}
END_TEST

START_TEST(test_missing_shape) {
    expect_bad_entry("{\"dtype\": \"F32\", \"data_offsets\": [0, 4]}", 4, "missing", "shape");
}
END_TEST

START_TEST(test_shape_wrong_type) {
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": \"1\", \"data_offsets\": [0, 4]}", 4, "shape",
                     "not an array");
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": [1.0], \"data_offsets\": [0, 4]}", 4, "shape[0]",
                     "not an integer");
}
END_TEST

START_TEST(test_missing_offsets) {
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": [1]}", 4, "missing", "data_offsets");
}
END_TEST

START_TEST(test_offsets_wrong_type) {
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": {\"a\": 0}}", 4, "data_offsets",
                     "not an array");
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}", 8, "data_offsets",
                     "two non-negative integers");
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, \"4\"]}", 4, "data_offsets",
                     "two non-negative integers");
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}", 4, "data_offsets",
                     "non-negative");
}
END_TEST

START_TEST(test_negative_dim) {
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 0]}", 0, "negative dimension",
                     "-1");
}
END_TEST

START_TEST(test_shape_overflow) {
    /* 2^32 * 2^32 wraps to 0 in 64 bits: would "match" an empty span. */
    expect_bad_entry("{\"dtype\": \"U8\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}", 0,
                     "overflow", NULL);
    /* Element count fits but bytes do not. */
    expect_bad_entry("{\"dtype\": \"F64\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 0]}", 0,
                     "overflow", NULL);
}
END_TEST

START_TEST(test_too_many_dims) {
    expect_bad_entry("{\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}", 1, "9 dims",
                     NULL);
}
END_TEST

START_TEST(test_unknown_dtype) {
    expect_bad_entry("{\"dtype\": \"F12\", \"shape\": [1], \"data_offsets\": [0, 4]}", 4, "unknown dtype", "F12");
}
END_TEST

START_TEST(test_offsets_outside_data) {
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}", 4, "data_offsets",
                     "outside the data area");
    /* Offsets beyond any file size must not wrap. */
    expect_bad_entry("{\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [9223372036854775806, "
                     "9223372036854775807]}",
                     4, "outside", NULL);
}
END_TEST

START_TEST(test_begin_after_end) {
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}", 8, "data_offsets",
                     "begin 8 > end 4");
}
END_TEST

START_TEST(test_overlap) {
    write_st("ov.safetensors",
             "{\"first.weight\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
             " \"second.weight\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
             ZEROS, 12);
    expect_fail(pth("ov.safetensors"), "ov.safetensors", "second.weight", "first.weight", "overlap",
                (const char *)NULL);
    /* Listed in reverse order: sorting by begin still finds it. */
    write_st("ov2.safetensors",
             "{\"b\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [8, 12]},"
             " \"a\": {\"dtype\": \"U8\", \"shape\": [10], \"data_offsets\": [0, 10]}}",
             ZEROS, 12);
    expect_fail(pth("ov2.safetensors"), "ov2.safetensors", ": b: ", "overlap", (const char *)NULL);
    /* Two tensors on the very same bytes. */
    write_st("ov3.safetensors",
             "{\"p\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
             " \"q\": {\"dtype\": \"I8\", \"shape\": [4], \"data_offsets\": [0, 4]}}",
             ZEROS, 4);
    expect_fail(pth("ov3.safetensors"), "ov3.safetensors", "overlap", (const char *)NULL);
}
END_TEST

START_TEST(test_empty_tensor_inside_other_is_not_overlap) {
    write_st("em.safetensors",
             "{\"a\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
             " \"e\": {\"dtype\": \"F32\", \"shape\": [3, 0], \"data_offsets\": [4, 4]}}",
             ZEROS, 8);
    weights_set *ws = open_ok(pth("em.safetensors"));
    ck_assert_uint_eq(weights_count(ws), 2);
    weights_close(ws);
}
END_TEST

START_TEST(test_size_mismatch) {
    expect_bad_entry("{\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}", 16, "size mismatch",
                     "16 bytes");
    expect_bad_entry("{\"dtype\": \"BF16\", \"shape\": [0], \"data_offsets\": [0, 2]}", 2, "size mismatch", NULL);
}
END_TEST

START_TEST(test_duplicate_in_file) {
    write_st("dup.safetensors",
             "{\"" LONG_NAME "\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
             " \"" LONG_NAME "\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
             ZEROS, 2);
    expect_fail(pth("dup.safetensors"), "dup.safetensors", LONG_NAME, "duplicate", (const char *)NULL);
    /* A key with escaped quotes is still quoted back. */
    write_st("dup2.safetensors",
             "{\"we\\\"ird\\\\\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
             " \"we\\\"ird\\\\\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
             ZEROS, 2);
    expect_fail(pth("dup2.safetensors"), "dup2.safetensors", "we\\\"ird\\\\", "duplicate", (const char *)NULL);
}
END_TEST

START_TEST(test_duplicate_across_shards) {
    write_st("a.safetensors", "{\"shared.w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}",
             ZEROS, 1);
    write_st("b.safetensors", "{\"shared.w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}",
             ZEROS, 1);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"shared.w\": \"a.safetensors\", \"other\": \"b.safetensors\"}}");
    expect_fail(g_dir, "b.safetensors", "shared.w", "duplicate", "a.safetensors", (const char *)NULL);
}
END_TEST

START_TEST(test_missing_shard) {
    write_st("a.safetensors", "{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", ZEROS, 1);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"gone-00002.safetensors\"}}");
    expect_fail(g_dir, "gone-00002.safetensors", "missing shard", (const char *)NULL);
}
END_TEST

START_TEST(test_index_tensor_absent_from_shard) {
    write_st("a.safetensors", "{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", ZEROS, 1);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"a.safetensors\", \"model.norm.weight\": \"a.safetensors\"}}");
    expect_fail(g_dir, "a.safetensors", "model.norm.weight", "missing from its shard", (const char *)NULL);
}
END_TEST

START_TEST(test_index_tensor_in_wrong_shard) {
    write_st("a.safetensors", "{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", ZEROS, 1);
    write_st("b.safetensors", "{\"y\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", ZEROS, 1);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"b.safetensors\", \"y\": \"b.safetensors\"}}");
    /* a.safetensors is not named by the index, so x is not loaded at all. */
    expect_fail(g_dir, "b.safetensors", ": x: ", "missing", (const char *)NULL);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"b.safetensors\", \"y\": \"a.safetensors\"}}");
    expect_fail(g_dir, ": x: ", "missing", "found in", (const char *)NULL);
}
END_TEST

START_TEST(test_bad_shard_inside_index) {
    /* A corrupt shard is reported with its own path. */
    write_st("a.safetensors", "{\"x\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 1]}}", ZEROS, 1);
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"x\": \"a.safetensors\"}}");
    expect_fail(g_dir, "a.safetensors: x: ", "size mismatch", (const char *)NULL);
}
END_TEST

START_TEST(test_bad_index) {
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"x\": ");
    expect_fail(g_dir, "model.safetensors.index.json", "malformed index JSON", (const char *)NULL);
    write_text("model.safetensors.index.json", "{\"metadata\": {}}");
    expect_fail(g_dir, "model.safetensors.index.json", "weight_map", (const char *)NULL);
    write_text("model.safetensors.index.json", "[]");
    expect_fail(g_dir, "model.safetensors.index.json", "weight_map", (const char *)NULL);
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"x\": 3}}");
    expect_fail(g_dir, "model.safetensors.index.json", ": x: ", "shard file name", (const char *)NULL);
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"x\": \"../../etc/passwd\"}}");
    expect_fail(g_dir, "model.safetensors.index.json", ": x: ", "inside the folder", (const char *)NULL);
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"x\": \"/etc/passwd\"}}");
    expect_fail(g_dir, ": x: ", "inside the folder", (const char *)NULL);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"model.embed_tokens.weight\": \"a.safetensors\","
               " \"model.embed_tokens.weight\": \"b.safetensors\"}}");
    expect_fail(g_dir, "model.safetensors.index.json", "model.embed_tokens.weight", "duplicate",
                (const char *)NULL);
}
END_TEST

START_TEST(test_metadata_checks) {
    write_st("m.safetensors", "{\"__metadata__\": [\"pt\"]}", NULL, 0);
    expect_fail(pth("m.safetensors"), "m.safetensors", "__metadata__", "object", (const char *)NULL);
    write_st("m2.safetensors", "{\"__metadata__\": {\"format\": 1}}", NULL, 0);
    expect_fail(pth("m2.safetensors"), "m2.safetensors", "__metadata__", "format", "not a string",
                (const char *)NULL);
}
END_TEST

START_TEST(test_hostile_name_sanitized) {
    /* Control characters from the file never reach the message raw. */
    expect_bad_entry("{\"dtype\": \"F\\n\\u001b[31m\", \"shape\": [1], \"data_offsets\": [0, 4]}", 4,
                     "unknown dtype", "F??[31m");
    write_st("n.safetensors", "{\"line\\nbreak\": {\"dtype\": \"X\", \"shape\": [], \"data_offsets\": [0, 0]}}",
             NULL, 0);
    expect_fail(pth("n.safetensors"), "line?break", (const char *)NULL);
}
END_TEST

START_TEST(test_tiny_error_buffer) {
    write_st("bad.safetensors", "[]", NULL, 0);
    weights_set *ws = NULL;
    char tiny[4] = "xxx";
    ck_assert_int_eq(weights_open(pth("bad.safetensors"), &ws, tiny, sizeof tiny), -1);
    ck_assert_uint_lt(strlen(tiny), sizeof tiny);
    ck_assert_int_eq(weights_open(pth("bad.safetensors"), &ws, NULL, 0), -1);
    ck_assert_ptr_null(ws);
}
END_TEST

static Suite *weights_suite(void) {
    Suite *s = suite_create("weights");

    TCase *ok = tcase_create("valid");
    tcase_add_checked_fixture(ok, setup, teardown);
    tcase_add_test(ok, test_single_file_valid);
    tcase_add_test(ok, test_folder_single_file);
    tcase_add_test(ok, test_header_padding_and_unicode);
    tcase_add_test(ok, test_empty_header_and_gaps);
    tcase_add_test(ok, test_sharded_valid);
    tcase_add_test(ok, test_sharded_extra_tensor_accepted);
    tcase_add_test(ok, test_many_tensors_lookup);
    tcase_add_test(ok, test_drop_pages);
    tcase_add_test(ok, test_empty_tensor_inside_other_is_not_overlap);
    tcase_add_test(ok, test_get_ok_and_errors);
    tcase_add_test(ok, test_dtype_helpers);
    tcase_add_test(ok, test_parse_image_in_memory);
    suite_add_tcase(s, ok);

    TCase *bad = tcase_create("corrupt");
    tcase_add_checked_fixture(bad, setup, teardown);
    tcase_add_test(bad, test_folder_without_checkpoint);
    tcase_add_test(bad, test_path_does_not_exist);
    tcase_add_test(bad, test_truncated_short);
    tcase_add_test(bad, test_truncated_empty_file);
    tcase_add_test(bad, test_header_length_beyond_file);
    tcase_add_test(bad, test_malformed_json);
    tcase_add_test(bad, test_header_not_object);
    tcase_add_test(bad, test_entry_not_object);
    tcase_add_test(bad, test_missing_dtype);
    tcase_add_test(bad, test_dtype_wrong_type);
    tcase_add_test(bad, test_missing_shape);
    tcase_add_test(bad, test_shape_wrong_type);
    tcase_add_test(bad, test_missing_offsets);
    tcase_add_test(bad, test_offsets_wrong_type);
    tcase_add_test(bad, test_negative_dim);
    tcase_add_test(bad, test_shape_overflow);
    tcase_add_test(bad, test_too_many_dims);
    tcase_add_test(bad, test_unknown_dtype);
    tcase_add_test(bad, test_offsets_outside_data);
    tcase_add_test(bad, test_begin_after_end);
    tcase_add_test(bad, test_overlap);
    tcase_add_test(bad, test_size_mismatch);
    tcase_add_test(bad, test_duplicate_in_file);
    tcase_add_test(bad, test_duplicate_across_shards);
    tcase_add_test(bad, test_missing_shard);
    tcase_add_test(bad, test_index_tensor_absent_from_shard);
    tcase_add_test(bad, test_index_tensor_in_wrong_shard);
    tcase_add_test(bad, test_bad_shard_inside_index);
    tcase_add_test(bad, test_bad_index);
    tcase_add_test(bad, test_metadata_checks);
    tcase_add_test(bad, test_hostile_name_sanitized);
    tcase_add_test(bad, test_tiny_error_buffer);
    suite_add_tcase(s, bad);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(weights_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
