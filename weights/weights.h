/*
 * weights/ — read-only access to Hugging Face safetensors checkpoints.
 *
 * Contract
 *   - A checkpoint is a single `*.safetensors` file, or a model folder holding
 *     either `model.safetensors` or a sharded set described by
 *     `model.safetensors.index.json` (its "weight_map": tensor name -> shard).
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
 *     BF16, F16 and F32 can be fetched with weights_get(); any other dtype is
 *     an error that names the tensor and its dtype.
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
} weights_dtype;

typedef struct weights_tensor {
    const char *name;               /* owned by the set */
    weights_dtype dtype;
    int ndim;                       /* 0..WEIGHTS_MAX_DIMS */
    int64_t shape[WEIGHTS_MAX_DIMS];
    const void *data;               /* into the mmap; row-major */
    size_t nbytes;
    const char *file;               /* shard path the tensor lives in */
} weights_tensor;

typedef struct weights_set weights_set;

/* Open `path`: a .safetensors file or a model folder (see above). */
int weights_open(const char *path, weights_set **out, char *err, size_t errlen);
void weights_close(weights_set *ws);

/* Number of tensors over all shards, and access by index (stable order). */
size_t weights_count(const weights_set *ws);
const weights_tensor *weights_at(const weights_set *ws, size_t i);

/* Lookup by name; NULL when absent. */
const weights_tensor *weights_find(const weights_set *ws, const char *name);

/* Fetch a tensor the model requires, checking it exists, has dtype
 * BF16/F16/F32, and has exactly the `ndim` dims in `shape`.
 * Errors name the tensor and what was expected vs found. */
int weights_get(const weights_set *ws, const char *name, int ndim, const int64_t *shape,
                const weights_tensor **out, char *err, size_t errlen);

/* Size in bytes of one element; 0 for an invalid value. */
size_t weights_dtype_size(weights_dtype dt);
const char *weights_dtype_name(weights_dtype dt);

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
/* An empty set to feed weights_parse_file_image(); free with weights_close(). */
weights_set *weights_new_empty(void);

#endif
