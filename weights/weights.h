/*
 * weights/ — read-only access to Hugging Face safetensors checkpoints and
 * GGUF files (llama.cpp's format; see docs/gguf.md).
 *
 * Contract
 *   - A checkpoint is a single `*.safetensors` file, or a model folder holding
 *     either `model.safetensors` or a sharded set described by
 *     `model.safetensors.index.json` (its "weight_map": tensor name -> shard),
 *     or a single GGUF file (recognised by its magic "GGUF", versions 2 and
 *     3, little-endian; a folder is always safetensors).
 *   - Files are mmap'ed read-only; tensor data is never copied. A tensor's
 *     `data` pointer stays valid until weights_close(). Pages are touched only
 *     when read, so a tensor-parallel rank that reads only its slices only
 *     faults in those.
 *   - Every file is untrusted. weights_open() validates the whole header of
 *     every shard before returning: 8-byte header length within the file,
 *     header is a JSON object, every entry has a known dtype, an integer shape
 *     and data_offsets [begin, end) inside the data area with
 *     end - begin == prod(shape) * sizeof(dtype), no two tensors overlap,
 *     no duplicate names (within a file or across shards), every shard named
 *     by the index exists and holds every tensor the index assigns to it.
 *     Failures return -1 with a message "<file>: <tensor>: <reason>" in the
 *     caller's buffer; nothing is ever printed, nothing exits.
 *   - Known dtypes are parsed (so sizes can be validated), but only
 *     BF16, F16, F32 and the block-quantized GGUF types (Q8_0 ... Q6_K) can
 *     be fetched with weights_get(); any other dtype is an error that names
 *     the tensor and its dtype.
 *   - GGUF: the whole header is validated before weights_open() returns
 *     (counts and string lengths bounded by the file, metadata value types
 *     known, no nested arrays, no duplicate keys or tensor names, dims > 0
 *     without overflow, tensor types known, general.alignment a power of
 *     two, every tensor's data aligned, inside the file and not overlapping
 *     another). Tensors keep their GGUF names ("blk.0.attn_q.weight") and
 *     get `shape` in row-major order: GGUF's ne[] reversed, so ne[0] (the
 *     contiguous dimension) is shape[ndim-1]. Metadata is read with
 *     weights_meta_*(); a safetensors set has none.
 *   - Thread safety: after weights_open() returns, all functions taking a
 *     const weights_set * may be called concurrently.
 */
#ifndef ECHO_WEIGHTS_H
#define ECHO_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#define WEIGHTS_MAX_DIMS 8

typedef enum weights_dtype {
    WEIGHTS_F32 = 0,
    WEIGHTS_F16,
    WEIGHTS_BF16,
    /* Parsed for validation only; weights_get() rejects them. */
    WEIGHTS_F64,
    WEIGHTS_I64,
    WEIGHTS_I32,
    WEIGHTS_I16,
    WEIGHTS_I8,
    WEIGHTS_U8,
    WEIGHTS_BOOL,
    WEIGHTS_F8_E4M3,
    WEIGHTS_F8_E5M2,
    WEIGHTS_U16,
    WEIGHTS_U32,
    WEIGHTS_U64,
    /* GGUF block-quantized types (ggml's layouts, little-endian): a row of
     * shape[ndim-1] elements is a whole number of blocks of
     * weights_dtype_block() elements, weights_dtype_block_bytes() bytes each.
     * weights_dtype_size() is 0 for them: there is no per-element size. */
    WEIGHTS_Q8_0,
    WEIGHTS_Q4_0,
    WEIGHTS_Q4_1,
    WEIGHTS_Q5_0,
    WEIGHTS_Q5_1,
    WEIGHTS_Q4_K,
    WEIGHTS_Q5_K,
    WEIGHTS_Q6_K,
} weights_dtype;

typedef struct weights_tensor {
    const char *name;               /* owned by the set */
    weights_dtype dtype;
    int ndim;                       /* 0..WEIGHTS_MAX_DIMS */
    int64_t shape[WEIGHTS_MAX_DIMS];
    const void *data;               /* into the mmap; row-major (quantized: rows of blocks) */
    size_t nbytes;
    const char *file;               /* shard path the tensor lives in */
} weights_tensor;

typedef struct weights_set weights_set;

/* Open `path`: a .safetensors file or a model folder (see above). */
int weights_open(const char *path, weights_set **out, char *err, size_t errlen);
void weights_close(weights_set *ws);

/* A hint that bytes [p, p + n) of tensor data were copied elsewhere and
 * will not be read through this set soon: the whole pages inside leave
 * the process (RSS); a later read faults them back in from the file, so
 * every pointer stays valid. No-op for memory the set did not map. */
void weights_drop_pages(const weights_set *ws, const void *p, size_t n);

/* Number of tensors over all shards, and access by index (stable order). */
size_t weights_count(const weights_set *ws);
const weights_tensor *weights_at(const weights_set *ws, size_t i);

/* Lookup by name; NULL when absent. */
const weights_tensor *weights_find(const weights_set *ws, const char *name);

/* Fetch a tensor the model requires, checking it exists, has dtype
 * BF16/F16/F32 or a quantized one (weights_dtype_is_quantized()), and has
 * exactly the `ndim` dims in `shape`. Callers that read `data` directly
 * must check the dtype (or use weights_read_rows_f32(), which takes all of
 * them). Errors name the tensor and what was expected vs found. */
int weights_get(const weights_set *ws, const char *name, int ndim, const int64_t *shape,
                const weights_tensor **out, char *err, size_t errlen);

/* Size in bytes of one element; 0 for an invalid value or a quantized type. */
size_t weights_dtype_size(weights_dtype dt);
/* "F32", "BF16", "Q4_1", ...; "INVALID" for an invalid value. */
const char *weights_dtype_name(weights_dtype dt);
/* 1 for the block-quantized types (WEIGHTS_Q8_0 ... WEIGHTS_Q6_K). */
int weights_dtype_is_quantized(weights_dtype dt);
/* Elements per block: 32 for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, 256 for the K-quants,
 * 1 for plain types; 0 for an invalid value. */
int64_t weights_dtype_block(weights_dtype dt);
/* Bytes per block (the element size for plain types); 0 for an invalid value. */
size_t weights_dtype_block_bytes(weights_dtype dt);

/*
 * Dequantize rows [r0, r0 + nr) of `t` into `out` (nr x row_len fp32,
 * row_len = shape[ndim-1]; a 1-D tensor is one row, a 0-D one one element).
 * Takes F32, F16, BF16 and every quantized dtype. Reads only those rows'
 * bytes, so a tensor-parallel rank touches only its slice of the mmap.
 * Results equal ggml's dequantization (and the gguf Python package's) bit
 * for bit. Bounds-checked; thread-safe (no shared state).
 */
int weights_read_rows_f32(const weights_tensor *t, int64_t r0, int64_t nr, float *out, char *err,
                          size_t errlen);
/* Dequantize `n` elements (a multiple of weights_dtype_block(dt)) of type
 * `dt` stored at `src` into `dst`. For tests and tools. */
int weights_dequantize(weights_dtype dt, const void *src, size_t n, float *dst, char *err, size_t errlen);

/*
 * GGUF metadata (key/values of the file header). All return 0 on success
 * and -1 when the set is not GGUF, the key is absent, or the value has
 * another type; nothing is written to the outputs then. Lookups are
 * O(log n_keys); array element accessors are O(1).
 */
typedef enum weights_meta_type {
    WEIGHTS_META_U8 = 0,
    WEIGHTS_META_I8,
    WEIGHTS_META_U16,
    WEIGHTS_META_I16,
    WEIGHTS_META_U32,
    WEIGHTS_META_I32,
    WEIGHTS_META_U64,
    WEIGHTS_META_I64,
    WEIGHTS_META_F32,
    WEIGHTS_META_F64,
    WEIGHTS_META_BOOL,
    WEIGHTS_META_STR,
    WEIGHTS_META_ARRAY, /* only as a key's type: arrays of arrays are rejected at open */
} weights_meta_type;

/* 1 when the set was opened from a GGUF file. */
int weights_is_gguf(const weights_set *ws);
/* Any integer type or bool (0/1); a U64 above INT64_MAX is -1. */
int weights_meta_int(const weights_set *ws, const char *key, int64_t *out);
/* F32 or F64, and any integer type (converted). */
int weights_meta_float(const weights_set *ws, const char *key, double *out);
/* A string value: `*s` points into the mmap and is NOT NUL-terminated;
 * `*len` bytes (UTF-8 by the format's word, not checked). */
int weights_meta_str(const weights_set *ws, const char *key, const char **s, size_t *len);
/* An array value: its element type (a weights_meta_type, never ARRAY) and count. */
int weights_meta_array(const weights_set *ws, const char *key, int *elem_type, size_t *count);
/* Element i of an array of strings (not NUL-terminated, as above). */
int weights_meta_array_str(const weights_set *ws, const char *key, size_t i, const char **s, size_t *len);
/* Element i of an array of integers or bools (U64 above INT64_MAX is -1). */
int weights_meta_array_int(const weights_set *ws, const char *key, size_t i, int64_t *out);
/* Element i of an array of floats or integers. */
int weights_meta_array_float(const weights_set *ws, const char *key, size_t i, double *out);
/* Listing in file order: the number of keys and key i (NUL-terminated,
 * owned by the set) with its weights_meta_type in `*type` (may be NULL);
 * NULL when i is out of range. */
size_t weights_meta_count(const weights_set *ws);
const char *weights_meta_key(const weights_set *ws, size_t i, int *type);

/* Total bytes of tensor data over all shards (for start-up reports). */
size_t weights_total_bytes(const weights_set *ws);

/*
 * Parse and validate one safetensors file image already in memory
 * (`buf`, `len` = whole file). Used by weights_open() for each shard and by
 * the libFuzzer harness. On success fills a private table inside `ws`
 * (tensors point into `buf`). `fname` is used in messages only.
 * Exposed so the fuzz target needs no filesystem.
 */
int weights_parse_file_image(weights_set *ws, const char *fname, const uint8_t *buf, size_t len,
                             char *err, size_t errlen);
/* The same for a GGUF file image (`buf` must outlive the set); the set must
 * be empty (a GGUF file is a whole checkpoint). For the fuzz target and tests. */
int weights_parse_gguf_image(weights_set *ws, const char *fname, const uint8_t *buf, size_t len, char *err,
                             size_t errlen);
/* An empty set to feed weights_parse_file_image(); free with weights_close(). */
weights_set *weights_new_empty(void);

#endif
