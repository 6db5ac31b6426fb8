/*
 * libFuzzer target for the GGUF header parser: the input is one whole file
 * image. Accepted images are walked so ASan checks that every tensor and
 * every metadata value the reader hands out lies inside the input: each
 * tensor's first and last rows are dequantized, each key's value read
 * through the accessor for its type, and the first and last elements of
 * each array.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "weights/weights.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void touch(const char *s, size_t n) {
    if (n) sink += (uint8_t)s[0] + (uint8_t)s[n - 1];
}

static void walk_meta(const weights_set *ws) {
    for (size_t i = 0; i < weights_meta_count(ws); i++) {
        int type, et;
        const char *key = weights_meta_key(ws, i, &type);
        if (!key) __builtin_trap();
        int64_t v;
        double d;
        const char *s;
        size_t n;
        (void)weights_meta_int(ws, key, &v);
        (void)weights_meta_float(ws, key, &d);
        if (weights_meta_str(ws, key, &s, &n) == 0) touch(s, n);
        if (weights_meta_array(ws, key, &et, &n) == 0 && n > 0) {
            size_t idx[2] = {0, n - 1};
            for (int k = 0; k < 2; k++) {
                const char *es;
                size_t el;
                if (weights_meta_array_str(ws, key, idx[k], &es, &el) == 0) touch(es, el);
                (void)weights_meta_array_int(ws, key, idx[k], &v);
                (void)weights_meta_array_float(ws, key, idx[k], &d);
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    weights_set *ws = weights_new_empty();
    if (!ws) return 0;
    if (weights_parse_gguf_image(ws, "fuzz.gguf", data, size, err, sizeof err) == 0) {
        if (!weights_is_gguf(ws)) __builtin_trap();
        for (size_t i = 0; i < weights_count(ws); i++) {
            const weights_tensor *t = weights_at(ws, i);
            if (!t || weights_find(ws, t->name) != t) __builtin_trap();
            const uint8_t *p = t->data;
            if (p < data || p + t->nbytes > data + size) __builtin_trap();
            int64_t cols = t->shape[t->ndim - 1], rows = 1;
            for (int d = 0; d + 1 < t->ndim; d++) rows *= t->shape[d];
            if (cols > (1 << 20)) continue; /* a row buffer that large is not worth it here */
            float *row = malloc((size_t)cols * sizeof *row);
            if (!row) continue;
            int64_t probe[2] = {0, rows - 1};
            for (int k = 0; k < 2; k++)
                if (weights_read_rows_f32(t, probe[k], 1, row, err, sizeof err) == 0) {
                    uint32_t bits;
                    memcpy(&bits, &row[cols - 1], sizeof bits); /* no float->int cast: NaN is fine */
                    sink += bits;
                } else if (weights_dtype_is_quantized(t->dtype) || t->dtype <= WEIGHTS_BF16) __builtin_trap();
            free(row);
        }
        walk_meta(ws);
    }
    weights_close(ws);
    return 0;
}
