/*
 * cpu: NEOX rotate-half RoPE. The frequencies follow HF's fp32 recipe
 * (inv_freq = 1 / theta^(2i/d) in fp32, angle = fp32(pos) * inv_freq rounded
 * to fp32, then cos/sin) so that our rotation matches the reference to the
 * last ulp of the angle, not just mathematically.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

int cpu_rope(kern_backend *be, void *x, const int32_t *pos, int n, int heads, int head_dim, double theta) {
    if (head_dim % 2) return kern_fail(be, "rope: head_dim %d is odd", head_dim);
    int half = head_dim / 2;
    float *cs = malloc((size_t)head_dim * sizeof *cs);
    if (!cs) return kern_fail(be, "rope: out of memory");
    float *xs = x;
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < half; i++) {
            float inv_freq = 1.0f / powf((float)theta, (float)(2 * i) / (float)head_dim);
            float ang = (float)pos[t] * inv_freq;
            cs[i] = cosf(ang);
            cs[half + i] = sinf(ang);
        }
        for (int h = 0; h < heads; h++) {
            float *v = xs + ((size_t)t * heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half], c = cs[i], s = cs[half + i];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
    free(cs);
    return 0;
}
