/*
 * kernels/ — the op table every backend implements.
 *
 * The model (model/) is backend-neutral: it only calls the function pointers
 * in `kern_ops`. kernels/cpu/ implements them in plain C with a thread pool
 * (fp32 activations; the readable reference and the test oracle);
 * kernels/cuda/ mirrors the same names, signatures and step order
 * (bf16 activations, fp32 accumulation). Tests compare the two whenever a GPU
 * is present.
 *
 * Conventions shared by all ops
 *   - Activation buffers (`void *` below) live in the backend's memory and
 *     hold `ops->act_dtype` elements, row-major. Shapes are written beside
 *     each argument as (rows, cols).
 *   - Weights are `kern_weight` views: row-major (rows, cols) matrices as
 *     stored by Hugging Face (nn.Linear is (out_features, in_features)), or
 *     vectors with rows == 1. Weight dtype may be BF16, F16 or F32 on every
 *     backend; arithmetic is fp32.
 *   - Small integer arrays (token ids, positions) are HOST pointers; a device
 *     backend copies them itself.
 *   - `out` may alias `in` where an op says so ("in place OK").
 *   - Every op returns 0, or -1 after writing a message into the backend's
 *     last-error buffer (kern_last_error()). Ops never exit.
 */
#ifndef ECHO_KERNELS_H
#define ECHO_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* The block-quantized types are ggml's layouts (weights/quant.c reads the
 * same bytes): a row of `cols` elements is cols / kern_dtype_block() blocks
 * of kern_dtype_block_bytes() bytes. Only a backend with upload_quantized
 * (below) takes them; kern_dtype_size() is 0 for them. */
typedef enum kern_dtype {
    KERN_F32 = 0,
    KERN_F16,
    KERN_BF16,
    KERN_Q8_0, /* 32 x int8, fp16 scale d: x = d * q */
    KERN_Q4_0, /* 32 x 4 bit, fp16 d: x = d * (q - 8) */
    KERN_Q4_1, /* 32 x 4 bit, fp16 d and m: x = d * q + m */
    KERN_Q4_K, /* 256 per super-block, 8 sub-blocks with 6-bit scales/mins */
    KERN_Q6_K, /* 256 per super-block, 16 sub-blocks with int8 scales */
    /* Q8_0 values whose matmul quantizes the activations per 32-block to 8
     * bits and multiplies in integers (llama.cpp's Q8_0 numerics): faster,
     * not the bits of the dequantized weight. Made only by upload_quantized
     * (cpu); its memory layout is the backend's own. */
    KERN_Q8_0_A8,
    /* The GGUF blocks' values, multiplied against 8-bit activations in
     * integers (kernels/cpu/matmul_a8p.c; docs/bench-forward.md, "8-bit
     * activations", "Repacked layouts"): the plain type's values, not its
     * bits. Made only by upload_quantized (cpu) from blocks of the plain
     * type; the memory layout is the backend's own, 8 plain rows' bytes
     * per 8 rows. */
    KERN_Q4_0_A8,
    KERN_Q4_1_A8,
    KERN_Q4_K_A8,
    KERN_Q6_K_A8,
    /* Q5 blocks: only as their _A8 dtype (the cpu's integer kernels,
     * matmul_a8p.c); the exact path gets them widened to fp32 at load. */
    KERN_Q5_0,    /* 32 x 5 bit, fp16 d: x = d * (q - 16) */
    KERN_Q5_1,    /* 32 x 5 bit, fp16 d and m: x = d * q + m */
    KERN_Q5_K,    /* 256 per super-block, 8 sub-blocks with 6-bit scales/mins */
    KERN_Q5_0_A8,
    KERN_Q5_1_A8,
    KERN_Q5_K_A8,
} kern_dtype;

/* The plain block type an 8-bit-activation dtype holds (itself for the
 * others; KERN_Q8_0_A8 is Q8_0's values in its own layout). */
static inline kern_dtype kern_dtype_plain(kern_dtype dt) {
    switch (dt) {
    case KERN_Q8_0_A8: return KERN_Q8_0;
    case KERN_Q4_0_A8: return KERN_Q4_0;
    case KERN_Q4_1_A8: return KERN_Q4_1;
    case KERN_Q4_K_A8: return KERN_Q4_K;
    case KERN_Q6_K_A8: return KERN_Q6_K;
    case KERN_Q5_0_A8: return KERN_Q5_0;
    case KERN_Q5_1_A8: return KERN_Q5_1;
    case KERN_Q5_K_A8: return KERN_Q5_K;
    default: return dt;
    }
}

/* The 8-bit-activation dtype of a plain block type; the type itself when
 * it has none. */
static inline kern_dtype kern_dtype_a8(kern_dtype dt) {
    switch (dt) {
    case KERN_Q8_0: return KERN_Q8_0_A8;
    case KERN_Q4_0: return KERN_Q4_0_A8;
    case KERN_Q4_1: return KERN_Q4_1_A8;
    case KERN_Q4_K: return KERN_Q4_K_A8;
    case KERN_Q6_K: return KERN_Q6_K_A8;
    case KERN_Q5_0: return KERN_Q5_0_A8;
    case KERN_Q5_1: return KERN_Q5_1_A8;
    case KERN_Q5_K: return KERN_Q5_K_A8;
    default: return dt;
    }
}

/* A view of an uploaded weight's rows (data + kern_dtype_bytes(dt, r0 *
 * cols)) must start at a multiple of KERN_ROW_GROUP rows: a backend may
 * keep rows interleaved in groups (the cpu's KERN_Q8_0_A8). */
#define KERN_ROW_GROUP 16

/* Elements per block (1 for F32/F16/BF16) and bytes per block. */
static inline int kern_dtype_block(kern_dtype dt) {
    dt = kern_dtype_plain(dt);
    return dt == KERN_Q4_K || dt == KERN_Q6_K || dt == KERN_Q5_K ? 256 : dt >= KERN_Q8_0 ? 32 : 1;
}
static inline size_t kern_dtype_block_bytes(kern_dtype dt) {
    switch (kern_dtype_plain(dt)) {
    case KERN_F32: return 4;
    case KERN_F16:
    case KERN_BF16: return 2;
    case KERN_Q8_0: return 34;
    case KERN_Q4_0: return 18;
    case KERN_Q4_1: return 20;
    case KERN_Q4_K: return 144;
    case KERN_Q6_K: return 210;
    case KERN_Q5_0: return 22;
    case KERN_Q5_1: return 24;
    case KERN_Q5_K: return 176;
    default: return 0;
    }
}
/* Bytes of `n` elements (n a multiple of the block). */
static inline size_t kern_dtype_bytes(kern_dtype dt, int64_t n) {
    return (size_t)(n / kern_dtype_block(dt)) * kern_dtype_block_bytes(dt);
}

typedef struct kern_weight {
    const void *data; /* host (cpu) or device (cuda) memory */
    kern_dtype dtype;
    int64_t rows, cols;
    /* Elements between the starts of consecutive rows; 0 means `cols`
     * (dense). A column slice of a row-major matrix (the input split of a
     * row-parallel layer) is a view with ld = the full matrix's cols.
     * Quantized: cols, ld and the slice's first column are multiples of
     * the block. */
    int64_t ld;
} kern_weight;

/* What a KV cache stores (kern_ops.kv_store, attention; --kv-cache-dtype).
 * A cache is n_blocks * block_size ROWS of kern_kv_row_bytes(dt, hkv, hd)
 * bytes (kernels/kv.h); row r starts at byte r * row_bytes, and kv head h
 * of it at byte h * kern_kv_head_bytes(dt, hd). One kv head's hd values:
 *   F32   hd fp32 (4 bytes each): the activations as they are (cpu).
 *   BF16  hd bf16 (2 bytes, little-endian), round to nearest even
 *         (kern_f32_to_bf16); cuda's native cache, bits as today.
 *   F16   hd IEEE fp16 (2 bytes, little-endian), round to nearest even,
 *         subnormals kept, overflow to inf (kern_f32_to_f16).
 *   Q8_0  hd int8 quants q[0..hd), then hd/32 fp16 scales d[b]
 *         (little-endian) at byte hd + 2b: value j = d[j/32] * q[j]; a
 *         block's d and q as ggml's quantize_row_q8_0_ref rounds them
 *         (kern_kv_quantize_q8_0). 34 bytes per 32 values, like
 *         block_q8_0, with a head's quants contiguous (vector loads).
 *         KEYS ONLY are rotated first: kv_store multiplies each head's
 *         fp32 key (after RoPE: exactly the k it is given, widened to
 *         fp32) by the orthonormal Walsh-Hadamard matrix of size hd
 *         (kern_kv_rotate: fp32 butterflies of stride 1, 2, .., hd/2, then
 *         x 1/sqrt(hd)), then quantizes. attention rotates each query
 *         head the same way (kern_kv_rotate on the fp32 widening of q,
 *         inside the op, never written back) and dots it with the stored
 *         (rotated) keys: H orthonormal and symmetric, so the scores are
 *         q·k up to rounding, while the rotation spreads a key's outlier
 *         channels over the head and the 8-bit blocks lose less. Values
 *         are not rotated. Needs hd a power of two >= 32.
 * Every backend's kv_store writes exactly kern_kv_store_ref's bytes, and
 * its attention reads exactly kern_kv_load_ref's values: attention over a
 * cache of type dt is, by definition, the F32 attention with k_p, v_p =
 * kern_kv_load_ref of the stored rows (and q rotated for Q8_0). cpu
 * computes exactly that (bit for bit the F32 kernel on those values);
 * cuda to its usual rounding. KERN_KV_NATIVE (0) is the backend's
 * act_dtype (cpu F32, cuda BF16): a model/engine setting only; the ops
 * take a resolved type (kern_kv_resolve). A backend refuses a type it does
 * not implement with an error naming it (kern_last_error). */
typedef enum kern_kv_dtype {
    KERN_KV_NATIVE = 0,
    KERN_KV_F32,
    KERN_KV_BF16,
    KERN_KV_F16,
    KERN_KV_Q8_0,
} kern_kv_dtype;

/* The sequences of one batched attention call over a paged KV cache.
 * The cache is (n_blocks * block_size) rows (kern_kv_dtype); the key/value of
 * position p of sequence s is cache row
 *     block_table[s * max_blocks + p / block_size] * block_size + p % block_size.
 * Rows q_start[s] .. q_start[s+1]-1 of q/out belong to sequence s and sit at
 * positions pos0[s], pos0[s]+1, ...; each attends to positions 0..its own.
 * All arrays are host memory. */
typedef struct kern_attn_batch {
    int n_seqs;
    const int32_t *q_start;     /* (n_seqs + 1) */
    const int32_t *pos0;        /* (n_seqs) */
    const int32_t *block_table; /* (n_seqs, max_blocks) */
    int max_blocks;
    int block_size;
} kern_attn_batch;

/* RoPE's frequencies: theta and, for a scaled variant, its parameters
 * (Hugging Face's rope_parameters of the same names). A zeroed struct with
 * a theta is plain RoPE. */
typedef enum kern_rope_type {
    KERN_ROPE_DEFAULT = 0, /* inv_freq[i] = theta^(-2i/head_dim) */
    KERN_ROPE_LLAMA3,      /* Llama 3.1: long wavelengths slowed by `factor` */
    KERN_ROPE_YARN,        /* YaRN (Qwen3 past 32K): a ramp between interpolated and kept frequencies */
} kern_rope_type;

typedef struct kern_rope {
    double theta;
    kern_rope_type type;
    /* KERN_ROPE_LLAMA3 and KERN_ROPE_YARN: factor, original_max_position_embeddings */
    double factor, low_freq_factor, high_freq_factor, original_max_position_embeddings;
    /* KERN_ROPE_YARN only: the ramp's rotation bounds, whether its ends are
     * rounded outwards ("truncate", HF's default 1), and the factor cos and
     * sin are multiplied by (HF's attention_scaling; the config resolves
     * attention_factor / mscale / mscale_all_dim into it) */
    double beta_fast, beta_slow, attention_factor;
    int truncate;
} kern_rope;

/* NULL when the ops can use r, else why not. */
static inline const char *kern_rope_invalid(const kern_rope *r) {
    if (!(r->theta > 0)) return "theta must be positive";
    if (r->type == KERN_ROPE_DEFAULT) return NULL;
    if (r->type == KERN_ROPE_YARN) {
        if (!(r->factor >= 1) || !(r->original_max_position_embeddings >= 1) || !(r->beta_fast > 0) ||
            !(r->beta_slow > 0) || !(r->attention_factor > 0) || !(r->attention_factor < 1e6))
            return "yarn needs factor >= 1, an original context >= 1, positive beta_fast and beta_slow and a "
                   "positive attention factor";
        return NULL;
    }
    if (r->type != KERN_ROPE_LLAMA3) return "unknown rope type";
    if (!(r->factor >= 1) || !(r->low_freq_factor > 0) || !(r->high_freq_factor > r->low_freq_factor) ||
        !(r->original_max_position_embeddings >= 1))
        return "llama3 needs factor >= 1, 0 < low_freq_factor < high_freq_factor and an original context >= 1";
    return NULL;
}

/* inv_freq[i], i < head_dim/2: the angle of position p is (float)p * this.
 * Every backend takes its frequencies from here, so all agree to the bit.
 * It is HF's fp32 recipe operation by operation (modeling_rope_utils.py,
 * torch on CPU: `2*pi / x` is reciprocal(x) * (float)(2*pi), a double
 * scalar is rounded to fp32 first); llama3 keeps short wavelengths, divides
 * long ones by factor and blends in between (model/README.md). */
static inline float kern_rope_inv_freq(const kern_rope *r, int i, int head_dim) {
    float inv = 1.0f / powf((float)r->theta, (float)(2 * i) / (float)head_dim);
    if (r->type == KERN_ROPE_YARN) {
        /* _compute_yarn_parameters: the correction range [low, high] in
         * dimensions (double, as Python computes it), a linear ramp over it
         * in fp32, inv_freq / factor below it, inv_freq above it */
        const double two_pi = 6.283185307179586;
        double lb = 2 * log(r->theta), old = r->original_max_position_embeddings;
        double low = head_dim * log(old / (r->beta_fast * two_pi)) / lb;
        double high = head_dim * log(old / (r->beta_slow * two_pi)) / lb;
        if (r->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > head_dim - 1) high = head_dim - 1;
        if (low == high) high += 0.001;
        float pos_freq = powf((float)r->theta, (float)(2 * i) / (float)head_dim);
        float extra = 1.0f / pos_freq, inter = 1.0f / ((float)r->factor * pos_freq);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float keep = 1.0f - ramp; /* HF's inv_freq_extrapolation_factor */
        return inter * (1.0f - keep) + extra * keep;
    }
    if (r->type != KERN_ROPE_LLAMA3) return inv;
    float factor = (float)r->factor, low = (float)r->low_freq_factor;
    double old = r->original_max_position_embeddings;
    float wavelen = (1.0f / inv) * (float)6.283185307179586;
    if (wavelen > (float)(old / r->low_freq_factor)) return inv / factor;
    if (wavelen < (float)(old / r->high_freq_factor)) return inv;
    float smooth = ((1.0f / wavelen) * (float)old - low) / (float)(r->high_freq_factor - r->low_freq_factor);
    float a = (1.0f - smooth) * inv / factor, b = smooth * inv;
    return a + b;
}

/* What cos and sin are multiplied by before the rotation (HF's
 * attention_scaling, fp32): 1 except for YaRN. */
static inline float kern_rope_scale(const kern_rope *r) {
    return r->type == KERN_ROPE_YARN ? (float)r->attention_factor : 1.0f;
}

typedef struct kern_backend kern_backend; /* per-rank state: threads or stream + handles */

typedef struct kern_ops {
    const char *name; /* "cpu", "cuda" */
    kern_dtype act_dtype;

    /* ---- memory ---- */
    /* Zero-initialised activation/cache memory; NULL on failure. */
    void *(*alloc)(kern_backend *be, size_t bytes);
    void (*free)(kern_backend *be, void *p);
    /* Make a weight usable by the backend; free_weight releases it. cuda:
     * a device copy. cpu: a dense copy on 2 MiB pages for a weight of 2 MiB
     * and more (unless ECHO_CPU_HUGEPAGES=0), else aliases the host view
     * (the mmap). The host view may be dropped once dev->data differs. */
    int (*upload_weight)(kern_backend *be, const kern_weight *host, kern_weight *dev);
    void (*free_weight)(kern_backend *be, kern_weight *dev);
    /* Copy `n` activations to host fp32 (synchronises the backend). */
    int (*to_host_f32)(kern_backend *be, float *dst, const void *src, size_t n);
    /* Copy `n` activations within backend memory. */
    int (*copy)(kern_backend *be, void *dst, const void *src, size_t n);

    /* ---- compute ---- */
    /* out(n, table.cols) = table[ids[i], :]. ids must be < table.rows. */
    int (*embedding)(kern_backend *be, void *out, const kern_weight *table, const int32_t *ids, int n);
    /* Per row r < rows: out[r] = in[r] / sqrt(mean(in[r]^2) + eps) * w.
     * in, out: (rows, dim); w: (1, dim). In place OK. No "+1" on w (Qwen3). */
    int (*rmsnorm)(kern_backend *be, void *out, const void *in, const kern_weight *w, int rows, int dim,
                   float eps);
    /* out(n, w.rows) = in(n, w.cols) · wᵀ. Not in place. */
    int (*matmul)(kern_backend *be, void *out, const void *in, const kern_weight *w, int n);
    /* NEOX (rotate-half) RoPE in place on x(n, heads*head_dim) at positions
     * pos[n]: for i < head_dim/2, f = (float)pos * kern_rope_inv_freq(rope,
     * i, head_dim) (fp32, as HF computes it), (x[i], x[i+d/2]) ->
     * (x[i]cos f - x[i+d/2]sin f, x[i+d/2]cos f + x[i]sin f). */
    int (*rope)(kern_backend *be, void *x, const int32_t *pos, int n, int heads, int head_dim, const kern_rope *rope);
    /* Write rows i < n of k, v (n, hkv*hd activations) to cache rows
     * slots[i] of kc, vc (host array of slots), each kv head stored as
     * kern_kv_store_ref(dt, key, ...) writes it (kern_kv_dtype). Errors: a
     * negative slot, a type the backend does not implement or that cannot
     * hold hd (kern_kv_invalid), KERN_KV_NATIVE. */
    int (*kv_store)(kern_backend *be, void *kc, void *vc, const void *k, const void *v, const int32_t *slots, int n,
                    int hkv, int hd, kern_kv_dtype dt);
    /* Causal GQA attention of a batch of sequences against the paged cache
     * of type dt (see kern_attn_batch, kern_kv_dtype). q, out:
     * (q_start[n_seqs], hq*hd). Query head h reads KV head h / (hq/hkv).
     * out = softmax(q·kᵀ·scale)·v per head, k and v as kern_kv_load_ref
     * reads them (Q8_0: q rotated, see kern_kv_dtype). */
    int (*attention)(kern_backend *be, void *out, const void *q, const void *kc, const void *vc,
                     const kern_attn_batch *b, int hq, int hkv, int hd, float scale, kern_kv_dtype dt);
    /* out = silu(gate) * up elementwise, silu(x) = x / (1 + e^-x). In place OK. */
    int (*silu_mul)(kern_backend *be, void *out, const void *gate, const void *up, size_t count);
    /* x += y elementwise. */
    int (*add)(kern_backend *be, void *x, const void *y, size_t count);
    /* x(rows, dim) += b on every row, b a (1, dim) weight (a projection's
     * bias: Qwen2's q/k/v). Summed in fp32, rounded once to act_dtype. */
    int (*add_bias)(kern_backend *be, void *x, const kern_weight *b, int rows, int dim);

    /* ---- fused ops (the GPU path's launch count; each is defined as the
     * unfused sequence it replaces, and the cpu twin computes exactly that) ---- */
    /* The residual add that ends a block fused with the next norm:
     *     x += y;  out = rmsnorm(x) with w   (rows, dim) each.
     * out must not alias x or y. On bf16 backends the norm reads x as rounded
     * after the add, so the result equals add() then rmsnorm(). */
    int (*add_rmsnorm)(kern_backend *be, void *x, const void *y, void *out, const kern_weight *w, int rows, int dim,
                       float eps);
    /* Qwen3's per-head q/k norms fused with RoPE, in place: for each token
     * i < n, each of the hq heads (hd values) of q (n, hq*hd) is
     * RMS-normalised with qw (1, hd) and then rotated at pos[i] exactly as
     * rope() does; the same for the hkv heads of k (n, hkv*hd) with kw.
     * Equals rmsnorm(q) + rmsnorm(k) + rope(q) + rope(k); on bf16 backends
     * the normalised value stays fp32 into the rotation (one rounding fewer
     * than the unfused ops). pos is a HOST array. */
    int (*qk_norm_rope)(kern_backend *be, void *q, void *k, const kern_weight *qw, const kern_weight *kw,
                        const int32_t *pos, int n, int hq, int hkv, int hd, float eps, const kern_rope *rope);
    /* Reduce logits (rows, vocab) on the backend to what sampling needs:
     * per row r, the k (1..KERN_TOPK_MAX) largest values in descending order,
     * ties by ascending column, into ids[r*k + j] / vals[r*k + j] (fp32), and
     * lse[r] = log(sum_j exp(logits[r, j])) computed in fp32 (or wider) with
     * a max shift. A row holding any inf/nan gets lse[r] = NaN (the caller
     * fails the step); its ids/vals are then unspecified, but ids stay in
     * [0, vocab). ids, vals, lse are HOST arrays; synchronises.
     * k > vocab is an error, not clipped (the output stride is k): a caller
     * with a short vocabulary slice asks for min(k, vocab). rows == 0 does
     * nothing. Values are exact (the activations as stored: fp32 on cpu, the
     * bf16 values widened on cuda). lse: cpu sums in double and rounds once
     * to float; cuda sums expf(x - max) in fp32 (relative error ~1e-6). */
    int (*logits_topk)(kern_backend *be, const void *logits, int rows, int vocab, int k, int32_t *ids, float *vals,
                       float *lse);
    /* The backend's stream (a cudaStream_t) for comm/'s device transports to
     * enqueue on, so an all-reduce is ordered after the ops that produced
     * its input without a host sync; NULL on cpu. */
    void *(*stream)(kern_backend *be);
    /* A weight generated in backend memory, for benchmarks on model shapes
     * without files: dev becomes a dense (rows, cols) weight in the
     * backend's weight dtype (cpu F32, cuda BF16) holding
     *     offset + scale * u(seed, (row0 + r) * full_cols + col0 + c),
     * u in [-1, 1) a counter-based hash of its arguments (kern_random_u
     * below), so a rank's shard (row0, col0 within a (*, full_cols) matrix)
     * equals the same slice of the unsharded weight on any backend, up to
     * the dtype's rounding. Release with free_weight. */
    int (*random_weight)(kern_backend *be, kern_weight *dev, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                         int64_t full_cols, uint64_t seed, float offset, float scale);
    /* One weight from the rows of several, in order: parts[0..n_parts) are
     * weights this backend made (upload_weight / random_weight results),
     * all dense (ld 0 or == cols) with the same cols and dtype; out becomes
     * ONE backend-owned dense (sum of rows, cols) weight of that dtype
     * holding parts[0]'s rows, then parts[1]'s, ... (an exact copy). The
     * parts stay valid and the caller may free them afterwards; release out
     * with free_weight. For decode at one token: in(1, cols)·outᵀ is the
     * parts' outputs laid end to end, one matmul instead of n_parts.
     * cpu: a backend-allocated copy of the parts' bytes (dtype kept), so the
     * products are bit-identical to the parts' (its matmul computes each
     * output row on its own); cuda: a device-to-device copy (bf16), synced.
     * Errors: n_parts < 1, a missing part, mismatched cols or dtype, a
     * strided part. Not inside graph mode (it allocates). */
    int (*fuse_rows)(kern_backend *be, const kern_weight *const *parts, int n_parts, kern_weight *out);

    /* ---- graphs (optional: NULL on backends without them, e.g. cpu) ----
     * A repeated op sequence (a decode step of one batch shape) recorded
     * once and replayed with one launch. Between graph_begin and graph_end
     * the caller issues the SAME op sequence with the same device pointers,
     * shapes and scalar arguments every time for one key; only the contents
     * of the host integer arrays (ids, positions, slots, batch tables) and
     * of device memory may change. Ops that synchronise or return data to
     * the host (to_host_f32, logits_topk, alloc, free, upload) are not
     * allowed inside.
     *
     * graph_begin: returns 1 when no graph is wanted for `key` now (capture
     * of it failed too often): run eagerly, do not call graph_end. Returns 0
     * in graph mode: *replaying = 1 when a graph exists for key (the ops then
     * only validate and fill their staged arrays; nothing is launched), else
     * *replaying = 0 and the stream is being captured (nothing runs either).
     * -1 on error (not in graph mode).
     * graph_end: leaves graph mode; a capture is instantiated and kept under
     * its key (a small LRU cache), a replay's stagings are checked against
     * the capture's. Nothing is launched yet: the graph is READY. On -1
     * nothing was launched and the key's graph is dropped: run the step
     * eagerly.
     * graph_launch: uploads the staged arrays and launches the ready graph
     * (asynchronously, like an op). On -1 nothing was launched and the
     * key's graph is dropped. The split lets tensor-parallel ranks agree
     * that every one of them has a graph before any launches one: NCCL
     * requires a captured collective to be launched by all its ranks.
     * graph_abort: leaves graph mode without launching anything and
     * discards a half-made capture; after an op failed inside graph mode
     * (nothing ran, so the step can be redone eagerly). With a ready graph
     * (graph_end succeeded, no launch) it drops the key's graph, a fresh
     * capture counting as a failed one. No-op otherwise.
     * graph_drop_all: leaves graph mode (as graph_abort) and destroys every
     * graph, once the stream has drained; each key is captured anew when
     * next begun, its failure count reset. For tensor-parallel aborts: NCCL
     * frees communicators only once the graphs that captured their calls
     * are destroyed (comm/echo.h). */
    int (*graph_begin)(kern_backend *be, uint64_t key, int *replaying);
    int (*graph_end)(kern_backend *be);
    void (*graph_abort)(kern_backend *be);
    int (*graph_launch)(kern_backend *be);
    void (*graph_drop_all)(kern_backend *be);

    /* ---- quantized weights (optional: NULL on backends that only take
     * F32/F16/BF16 weights, e.g. cuda) ----
     * Make `host` usable as a weight of dtype `to`, a block-quantized type:
     * host->dtype == to keeps the blocks (aliased or copied as by
     * upload_weight); host F32/F16/BF16 (dense or strided) is quantized
     * into a backend-owned copy (cols a multiple of the block; only
     * KERN_Q8_0 is produced, as ggml's quantize_row_q8_0 rounds);
     * to == KERN_Q8_0_A8 takes Q8_0 blocks or F32/F16/BF16 rows (rounded
     * so) into the backend's packed copy (dense: a column view of it is
     * refused by matmul). Every op
     * taking a kern_weight then takes it (matmul, embedding). Release with
     * free_weight. Errors: a type the backend cannot produce or read,
     * cols not a multiple of the block. */
    int (*upload_quantized)(kern_backend *be, const kern_weight *host, kern_dtype to, kern_weight *dev);

    /* ---- KV cache memory (optional: NULL means alloc / free) ----
     * Zero-initialised memory for a KV cache whose pages cost nothing
     * until first written, so a process's memory follows the blocks in use
     * (cpu: an anonymous mapping on 4 KiB pages, never memset; huge pages
     * would make each layer's first block cost 2 MiB). Release with
     * free_kv (the same size). */
    void *(*alloc_kv)(kern_backend *be, size_t bytes);
    void (*free_kv)(kern_backend *be, void *p, size_t bytes);
} kern_ops;

#define KERN_TOPK_MAX 64

/* The backend table: every backend is one row (kernels/backend.c). Callers
 * choose by row, never by comparing names; the CLIs list its names. A
 * backend not built in keeps its row, whose create says so. */
typedef struct kern_backend_info {
    const char *name; /* what --device takes: "cpu", "cuda" */
    int host;         /* 1: buffers in host memory, ops on the host's threads */
    int (*create)(int nthreads, int device_index, kern_backend **be, char *err, size_t errlen);
    void (*destroy)(kern_backend *be);
    int (*device_count)(void); /* devices it can use now (0: none, or not built in) */
    /* A device's free and total memory in bytes (cuda: cudaMemGetInfo on
     * device_index); NULL on a host backend. 0, or -1 with err set. */
    int (*mem_info)(int device_index, size_t *free_bytes, size_t *total_bytes, char *err, size_t errlen);
} kern_backend_info;
/* Row i (at most KERN_MAX_BACKENDS rows), NULL past the last. */
#define KERN_MAX_BACKENDS 8
const kern_backend_info *kern_backend_at(int i);
/* The row named `name` ("auto": kern_auto_device's); NULL if none. */
const kern_backend_info *kern_backend_find(const char *name);

/* Create a backend by device name ("cpu" or "cuda"). `nthreads` <= 0 picks
 * the number of online CPUs (cpu backend; ignored by cuda). `device_index`
 * selects the GPU (cuda). Errors: unknown device, backend not compiled in,
 * no GPU present (the message suggests --device cpu). */
int kern_backend_create(const char *device, int nthreads, int device_index, const kern_ops **ops,
                        kern_backend **be, char *err, size_t errlen);
void kern_backend_destroy(const kern_ops *ops, kern_backend *be);
/* The first device backend with a device visible, else the host one
 * ("cuda" when this build has it and a GPU is visible, else "cpu"): what
 * --device auto means. */
const char *kern_auto_device(void);
/* Devices the first device backend can use (GPUs of cuda; 0 without one,
 * or in a build without it). */
int kern_gpu_count(void);
/* The backend's host threads for work outside the ops (the all-reduce's
 * host codec, while the model waits on it): kern_host_threads says how
 * many; kern_host_parallel runs fn(arg, t) for t < ntasks on them (the
 * caller included) and returns when all are done. A cuda backend, or a cpu
 * one with one thread, runs them on the caller. Not from inside an op. */
typedef void (*kern_task_fn)(void *arg, int task);
int kern_host_threads(const kern_backend *be);
void kern_host_parallel(kern_backend *be, int ntasks, kern_task_fn fn, void *arg);
/* The message of the last failed op on this backend. */
const char *kern_last_error(const kern_backend *be);

size_t kern_dtype_size(kern_dtype dt);
/* What KERN_KV_NATIVE means on these ops: F32 on an fp32 backend (cpu),
 * BF16 on a bf16 one (cuda). Any other dt is returned as it is. */
static inline kern_kv_dtype kern_kv_resolve(const kern_ops *ops, kern_kv_dtype dt) {
    if (dt != KERN_KV_NATIVE) return dt;
    return ops->act_dtype == KERN_BF16 ? KERN_KV_BF16 : KERN_KV_F32;
}
const char *kern_dtype_name(kern_dtype dt);

/* Scalar conversions shared by both backends' host code. */
static inline float kern_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}
float kern_f16_to_f32(uint16_t h);

/* The hash behind random_weight: a uniform value in [-1, 1) from (seed,
 * index), splitmix64's finaliser over their mix; the top 24 bits make the
 * fraction, so it is exact in fp32. Host and device code share it. */
#ifdef __CUDACC__
#define KERN_HD __host__ __device__
#else
#define KERN_HD
#endif
static inline KERN_HD float kern_random_u(uint64_t seed, uint64_t index) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(int32_t)((z >> 40) - (1u << 23)) * (1.0f / 8388608.0f);
}

#endif
