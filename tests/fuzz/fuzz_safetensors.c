/*
 * libFuzzer target for the safetensors header parser: the input is one
 * whole file image. Accepted images are walked so ASan checks that every
 * tensor the parser hands out lies inside the input and that lookups agree
 * with the table.
 */
#include <stddef.h>
#include <stdint.h>

#include "weights/weights.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    weights_set *ws = weights_new_empty();
    if (!ws) return 0;
    if (weights_parse_file_image(ws, "fuzz.safetensors", data, size, err, sizeof err) == 0) {
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < weights_count(ws); i++) {
            const weights_tensor *t = weights_at(ws, i);
            if (!t || weights_find(ws, t->name) != t) __builtin_trap();
            if (t->nbytes) {
                const uint8_t *p = t->data;
                sink ^= p[0];
                sink ^= p[t->nbytes - 1];
            }
            const weights_tensor *g;
            (void)weights_get(ws, t->name, t->ndim, t->shape, &g, err, sizeof err);
        }
        (void)sink;
    }
    weights_close(ws);
    return 0;
}
