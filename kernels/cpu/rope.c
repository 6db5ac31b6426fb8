/*
 * cpu: NEOX rotate-half RoPE. The frequencies are kern_rope_inv_freq()
 * (HF's fp32 recipe), the angle fp32(pos) * inv_freq rounded to fp32, then
 * cos/sin, so that our rotation matches the reference to the last ulp of
 * the angle, not just mathematically. YaRN's attention factor scales
 * cos and sin (fp32) as HF's rotary embedding does.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

int cpu_rope(kern_backend *be, void *x, const int32_t *pos, int n, int heads, int head_dim, const kern_rope *rope) {
    if (head_dim % 2) return kern_fail(be, "rope: head_dim %d is odd", head_dim);
    const char *why = kern_rope_invalid(rope);
    if (why) return kern_fail(be, "rope: %s", why);
    int half = head_dim / 2;
    /* inv_freq (half), then one token's cos (half) and sin (half) */
    float *inv_freq = malloc((size_t)(half + head_dim) * sizeof *inv_freq);
    if (!inv_freq) return kern_fail(be, "rope: out of memory");
    float *cs = inv_freq + half;
    for (int i = 0; i < half; i++)
        inv_freq[i] = kern_rope_inv_freq(rope, i, head_dim);
    float *xs = x, scale = kern_rope_scale(rope);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < half; i++) {
            float ang = (float)pos[t] * inv_freq[i];
            cs[i] = cosf(ang) * scale;
            cs[half + i] = sinf(ang) * scale;
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
    free(inv_freq);
    return 0;
}
