/*
 * cuda: NEOX rotate-half RoPE, in place.
 *
 * Contract (twin of kernels/cpu/rope.c): x (n, heads*head_dim) bf16 is
 * rotated in place at the HOST positions pos[n] (copied to the device by the
 * op). For i < head_dim/2:
 *   inv_freq[i] = kern_rope_inv_freq(rope, i, head_dim)   (kernels.h)
 *   f = (float)pos * inv_freq[i]                     (fp32, as HF computes it)
 *   (x[i], x[i+d/2]) -> (x[i] cos f - x[i+d/2] sin f, x[i+d/2] cos f + x[i] sin f)
 * with cos f and sin f first multiplied by kern_rope_scale(rope) (YaRN).
 * inv_freq is computed on the host by the function the cpu twin calls (so
 * it is bit-identical) and cached on the device per (rope, head_dim);
 * the angle product and the rotation run in fp32 on the device with the
 * precise sincosf (no fast math), and the result is rounded to bf16.
 * Grid: one block per (token, group of heads); cos/sin are computed once per
 * (token, i) and applied to every head of the group.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cuda/cuda.h"

#define ROPE_HEADS_PER_BLOCK 4
#define ROPE_MAX_HEAD_DIM 2048
/* one thread per rotated pair: up to ROPE_MAX_HEAD_DIM / 2 per block */
#define ROPE_MAX_THREADS (ROPE_MAX_HEAD_DIM / 2)

__global__ void __launch_bounds__(ROPE_MAX_THREADS)
    cuda_rope_kernel(bf16 *x, const int32_t *pos, const float *inv_freq, int heads, int head_dim, float scale) {
    int t = blockIdx.x, i = threadIdx.x, half = head_dim / 2;
    if (i >= half) return;
    float ang = (float)pos[t] * inv_freq[i];
    float s, c;
    sincosf(ang, &s, &c);
    s *= scale; /* kern_rope_scale: YaRN's attention factor, else 1 */
    c *= scale;
    int h0 = blockIdx.y * ROPE_HEADS_PER_BLOCK;
    int h1 = h0 + ROPE_HEADS_PER_BLOCK < heads ? h0 + ROPE_HEADS_PER_BLOCK : heads;
    for (int h = h0; h < h1; h++) {
        bf16 *v = x + ((size_t)t * heads + h) * head_dim;
        float a = __bfloat162float(v[i]), b = __bfloat162float(v[i + half]);
        v[i] = __float2bfloat16_rn(a * c - b * s);
        v[i + half] = __float2bfloat16_rn(b * c + a * s);
    }
}

static int rope_same(const kern_rope *a, const kern_rope *b) {
    return a->theta == b->theta && a->type == b->type && a->factor == b->factor &&
           a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
           a->original_max_position_embeddings == b->original_max_position_embeddings &&
           a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow && a->truncate == b->truncate &&
           a->attention_factor == b->attention_factor; /* a graph holds the scale as a launch argument */
}

/* The device inv_freq table for (rope, head_dim), rebuilt when either
 * changes; shared with qk_norm_rope (cuda_fused.cu) through cuda.h. */
int cuda_rope_table(kern_backend *be, const char *op, const kern_rope *rope, int head_dim, const float **table) {
    const char *why = kern_rope_invalid(rope);
    if (why) return kern_fail(be, "%s: %s", op, why);
    cuda_impl *impl = cuda_get(be);
    if (!impl->rope_inv_freq || !rope_same(&impl->rope_key, rope) || impl->rope_hd != head_dim) {
        int half = head_dim / 2;
        float *h = (float *)malloc((size_t)half * sizeof *h);
        if (!h) return kern_fail(be, "%s: out of memory", op);
        for (int i = 0; i < half; i++)
            h[i] = kern_rope_inv_freq(rope, i, head_dim);
        int rc = 0;
        /* earlier rope launches may still read the old table */
        CUDA_TRY_GOTO(be, cudaStreamSynchronize(impl->stream), rc, done);
        impl->graph_epoch++; /* graphs captured with the old table must not replay */
        if (impl->rope_inv_freq) CUDA_TRY_GOTO(be, cudaFree(impl->rope_inv_freq), rc, done);
        impl->rope_inv_freq = NULL;
        impl->rope_hd = 0;
        CUDA_TRY_GOTO(be, cudaMalloc(&impl->rope_inv_freq, (size_t)half * sizeof(float)), rc, done);
        CUDA_TRY_GOTO(
            be,
            cudaMemcpyAsync(impl->rope_inv_freq, h, (size_t)half * sizeof(float), cudaMemcpyHostToDevice, impl->stream),
            rc, done);
        CUDA_TRY_GOTO(be, cudaStreamSynchronize(impl->stream), rc, done);
        impl->rope_key = *rope;
        impl->rope_hd = head_dim;
    done:
        free(h);
        if (rc) return rc;
    }
    *table = impl->rope_inv_freq;
    return 0;
}

int cuda_rope(kern_backend *be, void *x, const int32_t *pos, int n, int heads, int head_dim, const kern_rope *rope) {
    if (head_dim % 2) return kern_fail(be, "rope: head_dim %d is odd", head_dim);
    if (head_dim <= 0 || head_dim > ROPE_MAX_HEAD_DIM)
        return kern_fail(be, "rope: head_dim %d out of range [2, %d]", head_dim, ROPE_MAX_HEAD_DIM);
    if (n < 0 || heads < 0) return kern_fail(be, "rope: bad shape n=%d heads=%d", n, heads);
    if (n == 0 || heads == 0) return 0;
    if (cuda_enter(be)) return -1;
    const float *table = NULL;
    const int32_t *dpos = NULL;
    if (cuda_rope_table(be, "rope", rope, head_dim, &table) || cuda_stage_i32(be, pos, n, &dpos)) return -1;
    if (cuda_replaying(be)) return 0;
    dim3 grid((unsigned)n, (unsigned)((heads + ROPE_HEADS_PER_BLOCK - 1) / ROPE_HEADS_PER_BLOCK));
    int threads = ((head_dim / 2 + 31) / 32) * 32;
    cuda_rope_kernel<<<grid, threads, 0, cuda_get(be)->stream>>>((bf16 *)x, dpos, table, heads, head_dim,
                                                                  kern_rope_scale(rope));
    CUDA_LAUNCH_TRY(be, "cuda_rope_kernel");
    return 0;
}
