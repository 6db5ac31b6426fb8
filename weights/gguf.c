/*
 * GGUF reader: validated, zero-copy, tensors into the set's table and the
 * key/values kept for weights_meta_*(). See weights/weights.h for the
 * contract and docs/gguf.md for the format and what is checked.
 *
 * File layout (little-endian; versions 2 and 3 share it):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { string key, u32 value_type, value },
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset },
 *   padding to general.alignment (default 32), data section.
 * A string is u64 length + bytes (no NUL); an array value is
 * u32 element_type, u64 count, elements. Tensor offsets are relative to the
 * data section and multiples of the alignment.
 *
 * Design notes
 *   - weights_parse_gguf_image() is what weights_open() runs and what the
 *     fuzz target drives. It reads through a bounds-checked cursor, so no
 *     length or count from the file is trusted before it is compared with
 *     the bytes that remain; counts are bounded by the smallest encoding of
 *     an item before anything is allocated for them.
 *   - Nothing reaches the set until the whole header has been validated
 *     (weights_priv_commit() is all or nothing).
 *   - String arrays (the tokenizer's ~50k tokens) get an offset index at
 *     open, so element access is O(1); other arrays are fixed-size.
 *   - Keys are looked up by binary search over an index sorted by key,
 *     built at open, which also finds duplicate keys.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weights/internal.h"
#include "weights/weights.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4 /* ggml's GGML_MAX_DIMS */
#define QUOTE_MAX 128   /* bytes of a key or name quoted in a message */

/* GGUF value types, as numbered in the file. */
enum {
    GT_U8 = 0, GT_I8 = 1, GT_U16 = 2, GT_I16 = 3, GT_U32 = 4, GT_I32 = 5, GT_F32 = 6,
    GT_BOOL = 7, GT_STR = 8, GT_ARRAY = 9, GT_U64 = 10, GT_I64 = 11, GT_F64 = 12, GT_COUNT
};

/* File value type -> weights_meta_type; size of one element (0 = variable). */
static const struct {
    int meta;
    unsigned size;
} VTYPES[GT_COUNT] = {
    [GT_U8] = {WEIGHTS_META_U8, 1},     [GT_I8] = {WEIGHTS_META_I8, 1},   [GT_U16] = {WEIGHTS_META_U16, 2},
    [GT_I16] = {WEIGHTS_META_I16, 2},   [GT_U32] = {WEIGHTS_META_U32, 4}, [GT_I32] = {WEIGHTS_META_I32, 4},
    [GT_F32] = {WEIGHTS_META_F32, 4},   [GT_BOOL] = {WEIGHTS_META_BOOL, 1}, [GT_STR] = {WEIGHTS_META_STR, 0},
    [GT_ARRAY] = {WEIGHTS_META_ARRAY, 0}, [GT_U64] = {WEIGHTS_META_U64, 8}, [GT_I64] = {WEIGHTS_META_I64, 8},
    [GT_F64] = {WEIGHTS_META_F64, 8},
};

/* ggml tensor types: the ones we read, and names of the others so an
 * error can say what the file holds. */
static const struct {
    uint32_t id;
    const char *name;
    int supported;
    weights_dtype dt;
} GTYPES[] = {
    {0, "F32", 1, WEIGHTS_F32},      {1, "F16", 1, WEIGHTS_F16},      {2, "Q4_0", 1, WEIGHTS_Q4_0},
    {3, "Q4_1", 1, WEIGHTS_Q4_1},    {6, "Q5_0", 1, WEIGHTS_Q5_0},    {7, "Q5_1", 1, WEIGHTS_Q5_1},
    {8, "Q8_0", 1, WEIGHTS_Q8_0},    {9, "Q8_1", 0, 0},               {10, "Q2_K", 0, 0},
    {11, "Q3_K", 0, 0},              {12, "Q4_K", 1, WEIGHTS_Q4_K},   {13, "Q5_K", 1, WEIGHTS_Q5_K},
    {14, "Q6_K", 1, WEIGHTS_Q6_K},   {15, "Q8_K", 0, 0},              {16, "IQ2_XXS", 0, 0},
    {17, "IQ2_XS", 0, 0},            {18, "IQ3_XXS", 0, 0},           {19, "IQ1_S", 0, 0},
    {20, "IQ4_NL", 0, 0},            {21, "IQ3_S", 0, 0},             {22, "IQ2_S", 0, 0},
    {23, "IQ4_XS", 0, 0},            {24, "I8", 1, WEIGHTS_I8},       {25, "I16", 1, WEIGHTS_I16},
    {26, "I32", 1, WEIGHTS_I32},     {27, "I64", 1, WEIGHTS_I64},     {28, "F64", 1, WEIGHTS_F64},
    {29, "IQ1_M", 0, 0},             {30, "BF16", 1, WEIGHTS_BF16},   {34, "TQ1_0", 0, 0},
    {35, "TQ2_0", 0, 0},             {39, "MXFP4", 0, 0},
};
#define NGTYPES (sizeof GTYPES / sizeof GTYPES[0])

typedef struct gguf_kv {
    char *key;          /* NUL-terminated copy (keys with a NUL byte are rejected) */
    int type;           /* weights_meta_type */
    int elem_type;      /* arrays: weights_meta_type of the elements */
    const uint8_t *val; /* scalar: its bytes; string: its bytes; array: first element */
    uint64_t n;         /* string: length; array: count */
    uint64_t *soff;     /* string arrays: offset from val of element i's length field */
} gguf_kv;

struct weights_gguf {
    gguf_kv *kv; /* file order */
    size_t nkv;
    size_t *by_key; /* indices into kv sorted by key */
};

void weights_gguf_free(weights_gguf *g) {
    if (!g) return;
    for (size_t i = 0; i < g->nkv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].soff);
    }
    free(g->kv);
    free(g->by_key);
    free(g);
}

/* ------------------------------------------------------------------ cursor */

typedef struct cursor {
    const uint8_t *buf;
    size_t len, pos;
} cursor;

static size_t left(const cursor *c) { return c->len - c->pos; }

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int rd(cursor *c, int n, uint64_t *v) {
    if (left(c) < (size_t)n) return -1;
    *v = le(c->buf + c->pos, n);
    c->pos += (size_t)n;
    return 0;
}

/* A string: u64 length, then that many bytes (in bounds). */
static int rd_str(cursor *c, const uint8_t **s, uint64_t *n) {
    uint64_t l;
    if (rd(c, 8, &l) != 0 || l > left(c)) return -1;
    *s = c->buf + c->pos;
    *n = l;
    c->pos += (size_t)l;
    return 0;
}

/* A NUL-terminated, shortened copy of an untrusted name for messages. */
static const char *qname(char *out, size_t outlen, const uint8_t *s, uint64_t n) {
    size_t k = n < outlen - 4 ? (size_t)n : outlen - 4;
    for (size_t i = 0; i < k; i++) out[i] = s[i] ? (char)s[i] : '?';
    if (k < n) memcpy(out + k, "...", 4);
    else out[k] = 0;
    return out;
}

/* ------------------------------------------------------------- metadata */

static int kv_key_cmp(const void *a, const void *b, void *kv) {
    const gguf_kv *t = kv;
    return strcmp(t[*(const size_t *)a].key, t[*(const size_t *)b].key);
}

/* qsort_r is glibc's; the build defines _GNU_SOURCE. */
static void sort_by_key(gguf_kv *kv, size_t *idx, size_t n) { qsort_r(idx, n, sizeof *idx, kv_key_cmp, kv); }

/* Parse one value of file type `t` (not an array) at the cursor: bounds,
 * and bools must be 0 or 1. */
static int parse_scalar(cursor *c, uint32_t t, const char *fname, const char *key, char *err, size_t errlen) {
    if (t == GT_STR) {
        const uint8_t *s;
        uint64_t n;
        if (rd_str(c, &s, &n) == 0) return 0;
        weights_priv_err(err, errlen, fname, key, "string length runs past the end of the file");
        return -1;
    }
    unsigned sz = VTYPES[t].size;
    if (left(c) < sz) {
        weights_priv_err(err, errlen, fname, key, "truncated file: value runs past the end");
        return -1;
    }
    if (t == GT_BOOL && c->buf[c->pos] > 1) {
        weights_priv_err(err, errlen, fname, key, "bool value %u is not 0 or 1", c->buf[c->pos]);
        return -1;
    }
    c->pos += sz;
    return 0;
}

/* One key/value at the cursor into `kv`. */
static int parse_kv(cursor *c, size_t i, gguf_kv *kv, const char *fname, char *err, size_t errlen) {
    char idx[48], q[QUOTE_MAX];
    const uint8_t *ks;
    uint64_t kl, t;
    snprintf(idx, sizeof idx, "key/value #%zu", i);
    if (rd_str(c, &ks, &kl) != 0) {
        weights_priv_err(err, errlen, fname, idx, "truncated file or key length past the end of the file");
        return -1;
    }
    if (memchr(ks, 0, (size_t)kl)) {
        weights_priv_err(err, errlen, fname, qname(q, sizeof q, ks, kl), "key contains a NUL byte");
        return -1;
    }
    kv->key = malloc((size_t)kl + 1);
    if (!kv->key) {
        weights_priv_err(err, errlen, fname, idx, "out of memory");
        return -1;
    }
    memcpy(kv->key, ks, (size_t)kl);
    kv->key[kl] = 0;
    const char *key = kv->key;

    if (rd(c, 4, &t) != 0) {
        weights_priv_err(err, errlen, fname, key, "truncated file: value type runs past the end");
        return -1;
    }
    if (t >= GT_COUNT) {
        weights_priv_err(err, errlen, fname, key, "unknown value type %llu", (unsigned long long)t);
        return -1;
    }
    kv->type = VTYPES[t].meta;
    if (t != GT_ARRAY) {
        size_t at = c->pos;
        if (parse_scalar(c, (uint32_t)t, fname, key, err, errlen) != 0) return -1;
        if (t == GT_STR) {
            kv->n = le(c->buf + at, 8);
            kv->val = c->buf + at + 8;
        } else {
            kv->val = c->buf + at;
        }
        return 0;
    }

    uint64_t et, n;
    if (rd(c, 4, &et) != 0 || rd(c, 8, &n) != 0) {
        weights_priv_err(err, errlen, fname, key, "truncated file: array header runs past the end");
        return -1;
    }
    if (et >= GT_COUNT) {
        weights_priv_err(err, errlen, fname, key, "unknown array element type %llu", (unsigned long long)et);
        return -1;
    }
    if (et == GT_ARRAY) {
        /* ggml refuses them too; no known writer produces them. */
        weights_priv_err(err, errlen, fname, key, "arrays of arrays are not supported");
        return -1;
    }
    kv->elem_type = VTYPES[et].meta;
    kv->n = n;
    kv->val = c->buf + c->pos;
    /* A string takes at least its 8-byte length: bounds the index below. */
    unsigned min = et == GT_STR ? 8 : VTYPES[et].size;
    if (n > left(c) / min) {
        weights_priv_err(err, errlen, fname, key, "array of %llu elements runs past the end of the file",
                         (unsigned long long)n);
        return -1;
    }
    if (et == GT_STR) {
        kv->soff = malloc((size_t)(n ? n : 1) * sizeof *kv->soff);
        if (!kv->soff) {
            weights_priv_err(err, errlen, fname, key, "out of memory");
            return -1;
        }
        for (uint64_t j = 0; j < n; j++) {
            const uint8_t *s;
            uint64_t sl;
            kv->soff[j] = (uint64_t)(c->buf + c->pos - kv->val);
            if (rd_str(c, &s, &sl) != 0) {
                weights_priv_err(err, errlen, fname, key, "string %llu of the array runs past the end of the file",
                                 (unsigned long long)j);
                return -1;
            }
        }
    } else if (et == GT_BOOL) {
        for (uint64_t j = 0; j < n; j++)
            if (parse_scalar(c, GT_BOOL, fname, key, err, errlen) != 0) return -1;
    } else {
        c->pos += (size_t)(n * min);
    }
    return 0;
}

/* ---------------------------------------------------------------- tensors */

static int name_cmp(const void *a, const void *b, void *t) {
    const weights_tensor *w = t;
    return strcmp(w[*(const size_t *)a].name, w[*(const size_t *)b].name);
}

/* One tensor info at the cursor: name, dims (reversed into shape), dtype,
 * byte size; the data offset into *off (checked later, once the data
 * section's start is known). */
static int parse_tensor(cursor *c, size_t i, weights_tensor *t, uint64_t *off, const char *fname, char *err,
                        size_t errlen) {
    char idx[48], q[QUOTE_MAX];
    const uint8_t *ns;
    uint64_t nl, nd, v;
    snprintf(idx, sizeof idx, "tensor #%zu", i);
    if (rd_str(c, &ns, &nl) != 0) {
        weights_priv_err(err, errlen, fname, idx, "truncated file or name length past the end of the file");
        return -1;
    }
    if (memchr(ns, 0, (size_t)nl)) {
        weights_priv_err(err, errlen, fname, qname(q, sizeof q, ns, nl), "tensor name contains a NUL byte");
        return -1;
    }
    char *name = malloc((size_t)nl + 1);
    if (!name) {
        weights_priv_err(err, errlen, fname, idx, "out of memory");
        return -1;
    }
    memcpy(name, ns, (size_t)nl);
    name[nl] = 0;
    t->name = name;

    if (rd(c, 4, &nd) != 0) {
        weights_priv_err(err, errlen, fname, name, "truncated file: n_dims runs past the end");
        return -1;
    }
    if (nd < 1 || nd > GGUF_MAX_DIMS) {
        weights_priv_err(err, errlen, fname, name, "n_dims %llu outside 1..%d", (unsigned long long)nd,
                         GGUF_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)nd;
    uint64_t ne[GGUF_MAX_DIMS], nelem = 1;
    for (uint64_t d = 0; d < nd; d++) {
        if (rd(c, 8, &ne[d]) != 0) {
            weights_priv_err(err, errlen, fname, name, "truncated file: dims run past the end");
            return -1;
        }
        if (ne[d] == 0 || ne[d] > (uint64_t)INT64_MAX) {
            weights_priv_err(err, errlen, fname, name, "dimension ne[%llu] = %llu is not in 1..INT64_MAX",
                             (unsigned long long)d, (unsigned long long)ne[d]);
            return -1;
        }
        if (nelem > (uint64_t)INT64_MAX / ne[d]) {
            weights_priv_err(err, errlen, fname, name, "element count overflows (product of dims)");
            return -1;
        }
        nelem *= ne[d];
    }
    for (int d = 0; d < WEIGHTS_MAX_DIMS; d++) t->shape[d] = d < t->ndim ? (int64_t)ne[t->ndim - 1 - d] : 0;

    if (rd(c, 4, &v) != 0) {
        weights_priv_err(err, errlen, fname, name, "truncated file: tensor type runs past the end");
        return -1;
    }
    size_t k = 0;
    while (k < NGTYPES && GTYPES[k].id != v) k++;
    if (k == NGTYPES) {
        weights_priv_err(err, errlen, fname, name, "unknown tensor type %llu", (unsigned long long)v);
        return -1;
    }
    if (!GTYPES[k].supported) {
        weights_priv_err(err, errlen, fname, name, "unsupported tensor type %llu (%s)", (unsigned long long)v,
                         GTYPES[k].name);
        return -1;
    }
    t->dtype = GTYPES[k].dt;
    uint64_t blk = (uint64_t)weights_dtype_block(t->dtype), bb = weights_dtype_block_bytes(t->dtype);
    if (ne[0] % blk) {
        weights_priv_err(err, errlen, fname, name, "row length ne[0] = %llu is not a multiple of the %s block (%llu)",
                         (unsigned long long)ne[0], GTYPES[k].name, (unsigned long long)blk);
        return -1;
    }
    if (nelem / blk > SIZE_MAX / bb) {
        weights_priv_err(err, errlen, fname, name, "tensor size overflows");
        return -1;
    }
    t->nbytes = (size_t)(nelem / blk * bb);

    if (rd(c, 8, off) != 0) {
        weights_priv_err(err, errlen, fname, name, "truncated file: data offset runs past the end");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ parse */

static const gguf_kv *find_kv(const weights_gguf *g, const char *key) {
    size_t lo = 0, hi = g->nkv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = strcmp(g->kv[g->by_key[mid]].key, key);
        if (r == 0) return &g->kv[g->by_key[mid]];
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* The fixed header: magic, version and the two counts, each checked
 * against what the file can hold. */
static int parse_header(cursor *c, const uint8_t *buf, size_t len, const char *fname, uint64_t *n_tensors,
                        uint64_t *n_kv, char *err, size_t errlen) {
    uint64_t magic, version;
    if (len < 24) {
        weights_priv_err(err, errlen, fname, NULL, "truncated file: %zu bytes, a GGUF header needs 24", len);
        return -1;
    }
    rd(c, 4, &magic);
    rd(c, 4, &version);
    rd(c, 8, n_tensors);
    rd(c, 8, n_kv);
    if (memcmp(buf, "GGUF", 4) != 0) {
        weights_priv_err(err, errlen, fname, NULL, "bad magic (not a GGUF file)");
        return -1;
    }
    if (version != 2 && version != 3) {
        if ((version & 0xffff) == 0 && (version == 0x02000000 || version == 0x03000000))
            weights_priv_err(err, errlen, fname, NULL, "big-endian GGUF files are not supported");
        else
            weights_priv_err(err, errlen, fname, NULL, "unsupported GGUF version %llu (2 and 3 are read)",
                             (unsigned long long)version);
        return -1;
    }
    /* The smallest key/value is 13 bytes (8 key length, 4 type, 1 value),
     * the smallest tensor info 32 (8 name length, 4 n_dims, 8 ne, 4 type,
     * 8 offset): counts beyond what the file can hold are lies. */
    if (*n_kv > left(c) / 13) {
        weights_priv_err(err, errlen, fname, NULL, "key/value count %llu exceeds what the %zu-byte file can hold",
                         (unsigned long long)*n_kv, len);
        return -1;
    }
    if (*n_tensors > left(c) / 32) {
        weights_priv_err(err, errlen, fname, NULL, "tensor count %llu exceeds what the %zu-byte file can hold",
                         (unsigned long long)*n_tensors, len);
        return -1;
    }
    return 0;
}

/* general.alignment (default 32): a power of two in a u32. */
static int read_alignment(const weights_gguf *g, const char *fname, uint64_t *align, char *err, size_t errlen) {
    *align = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *ak = find_kv(g, "general.alignment");
    if (ak) {
        /* ggml writes and requires a u32; a u32 also keeps the padding
         * arithmetic of the data section far from overflow. */
        if (ak->type != WEIGHTS_META_U32) {
            weights_priv_err(err, errlen, fname, "general.alignment", "must be a uint32");
            return -1;
        }
        *align = le(ak->val, 4);
        if (*align == 0 || (*align & (*align - 1))) {
            weights_priv_err(err, errlen, fname, "general.alignment", "%llu is not a power of two",
                             (unsigned long long)*align);
            return -1;
        }
    }
    return 0;
}

int weights_parse_gguf_image(weights_set *ws, const char *fname, const uint8_t *buf, size_t len, char *err,
                             size_t errlen) {
    int rc = -1;
    weights_gguf *g = NULL;
    weights_tensor *tmp = NULL;
    uint64_t *offs = NULL;
    size_t ntmp = 0, *order = NULL;
    weights_span *spans = NULL;
    cursor c = {buf, len, 0};
    uint64_t n_tensors, n_kv;

    if (!fname) fname = "(memory)";
    if (!ws || (!buf && len)) {
        weights_priv_err(err, errlen, fname, NULL, "invalid arguments");
        return -1;
    }
    if (weights_count(ws) != 0 || weights_priv_gguf(ws)) {
        weights_priv_err(err, errlen, fname, NULL, "a GGUF file must be the only file of a weights set");
        return -1;
    }
    if (parse_header(&c, buf, len, fname, &n_tensors, &n_kv, err, errlen) != 0) return -1;

    g = calloc(1, sizeof *g);
    if (!g || !(g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv)) ||
        !(g->by_key = malloc((n_kv ? (size_t)n_kv : 1) * sizeof *g->by_key))) {
        weights_priv_err(err, errlen, fname, NULL, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n_kv; i++) {
        g->nkv = i + 1; /* so a failure frees what this key allocated */
        if (parse_kv(&c, i, &g->kv[i], fname, err, errlen) != 0) goto fail;
        g->by_key[i] = i;
    }
    sort_by_key(g->kv, g->by_key, g->nkv);
    for (size_t i = 1; i < g->nkv; i++)
        if (strcmp(g->kv[g->by_key[i - 1]].key, g->kv[g->by_key[i]].key) == 0) {
            weights_priv_err(err, errlen, fname, g->kv[g->by_key[i]].key, "duplicate key");
            goto fail;
        }

    uint64_t align;
    if (read_alignment(g, fname, &align, err, errlen) != 0) goto fail;

    if (n_tensors > left(&c) / 32) {
        weights_priv_err(err, errlen, fname, NULL, "tensor count %llu exceeds what the rest of the file can hold",
                         (unsigned long long)n_tensors);
        goto fail;
    }
    size_t nt = (size_t)n_tensors;
    tmp = calloc(nt ? nt : 1, sizeof *tmp);
    offs = calloc(nt ? nt : 1, sizeof *offs);
    order = calloc(nt ? nt : 1, sizeof *order);
    spans = calloc(nt ? nt : 1, sizeof *spans);
    if (!tmp || !offs || !order || !spans) {
        weights_priv_err(err, errlen, fname, NULL, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < nt; i++) {
        ntmp = i + 1; /* the name is freed on failure */
        if (parse_tensor(&c, i, &tmp[i], &offs[i], fname, err, errlen) != 0) goto fail;
    }

    /* Data section: after the header, padded to the alignment. A file
     * without tensors may end right after its header. */
    uint64_t data_start = ((uint64_t)c.pos + align - 1) / align * align;
    if (nt && data_start > len) {
        weights_priv_err(err, errlen, fname, NULL,
                         "truncated file: data section would start at %llu, past the end (%zu bytes)",
                         (unsigned long long)data_start, len);
        goto fail;
    }
    uint64_t dlen = nt ? len - data_start : 0;
    for (size_t i = 0; i < nt; i++) {
        weights_tensor *t = &tmp[i];
        if (offs[i] % align) {
            weights_priv_err(err, errlen, fname, t->name, "data offset %llu is not a multiple of the alignment %llu",
                             (unsigned long long)offs[i], (unsigned long long)align);
            goto fail;
        }
        if (offs[i] > dlen || t->nbytes > dlen - offs[i]) {
            weights_priv_err(err, errlen, fname, t->name,
                             "data [%llu, %llu + %zu) outside the data section (%llu bytes)",
                             (unsigned long long)offs[i], (unsigned long long)offs[i], t->nbytes,
                             (unsigned long long)dlen);
            goto fail;
        }
        t->data = buf + data_start + offs[i];
        spans[i] = (weights_span){offs[i], offs[i] + t->nbytes, i};
        order[i] = i;
    }
    /* Every tensor has nbytes > 0 (dims >= 1), so sorted spans must not interleave. */
    if (weights_priv_spans_disjoint(spans, nt, tmp, fname, "data", "overlaps", err, errlen) != 0) goto fail;
    qsort_r(order, nt, sizeof *order, name_cmp, tmp);
    for (size_t i = 1; i < nt; i++)
        if (strcmp(tmp[order[i - 1]].name, tmp[order[i]].name) == 0) {
            weights_priv_err(err, errlen, fname, tmp[order[i]].name, "duplicate tensor name");
            goto fail;
        }

    if (weights_priv_commit(ws, fname, tmp, nt, g, weights_gguf_free, err, errlen) != 0) goto fail;
    g = NULL;  /* owned by the set */
    ntmp = 0; /* names too */
    rc = 0;

fail:
    for (size_t i = 0; i < ntmp; i++) free((char *)tmp[i].name);
    free(tmp);
    free(offs);
    free(order);
    free(spans);
    weights_gguf_free(g);
    return rc;
}

/* --------------------------------------------------------------- metadata */

static const gguf_kv *lookup(const weights_set *ws, const char *key) {
    const weights_gguf *g = weights_priv_gguf(ws);
    return (g && key) ? find_kv(g, key) : NULL;
}

/* Integer (or bool) of meta type `t` at `p`; -1 when `t` is not one, or a
 * u64 does not fit. */
static int get_int(int t, const uint8_t *p, int64_t *out) {
    uint64_t v;
    switch (t) {
    case WEIGHTS_META_U8: case WEIGHTS_META_BOOL: *out = p[0]; return 0;
    case WEIGHTS_META_I8: *out = (int8_t)p[0]; return 0;
    case WEIGHTS_META_U16: *out = (int64_t)le(p, 2); return 0;
    case WEIGHTS_META_I16: *out = (int16_t)(uint16_t)le(p, 2); return 0;
    case WEIGHTS_META_U32: *out = (int64_t)le(p, 4); return 0;
    case WEIGHTS_META_I32: *out = (int32_t)(uint32_t)le(p, 4); return 0;
    case WEIGHTS_META_I64: *out = (int64_t)le(p, 8); return 0;
    case WEIGHTS_META_U64:
        v = le(p, 8);
        if (v > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)v;
        return 0;
    default: return -1;
    }
}

static int get_float(int t, const uint8_t *p, double *out) {
    if (t == WEIGHTS_META_F32) {
        uint32_t u = (uint32_t)le(p, 4);
        float f;
        memcpy(&f, &u, sizeof f);
        *out = f;
        return 0;
    }
    if (t == WEIGHTS_META_F64) {
        uint64_t u = le(p, 8);
        memcpy(out, &u, sizeof *out);
        return 0;
    }
    if (t == WEIGHTS_META_U64) { /* beyond INT64_MAX still converts */
        *out = (double)le(p, 8);
        return 0;
    }
    int64_t v;
    if (t == WEIGHTS_META_BOOL || get_int(t, p, &v) != 0) return -1;
    *out = (double)v;
    return 0;
}

/* Byte size of one element of a fixed-size meta type. */
static unsigned meta_size(int t) {
    for (int i = 0; i < GT_COUNT; i++)
        if (VTYPES[i].meta == t) return VTYPES[i].size;
    return 0;
}

int weights_is_gguf(const weights_set *ws) { return weights_priv_gguf(ws) != NULL; }

int weights_meta_int(const weights_set *ws, const char *key, int64_t *out) {
    const gguf_kv *kv = lookup(ws, key);
    int64_t v;
    if (!kv || !out || get_int(kv->type, kv->val, &v) != 0) return -1;
    *out = v;
    return 0;
}

int weights_meta_float(const weights_set *ws, const char *key, double *out) {
    const gguf_kv *kv = lookup(ws, key);
    double v;
    if (!kv || !out || get_float(kv->type, kv->val, &v) != 0) return -1;
    *out = v;
    return 0;
}

int weights_meta_str(const weights_set *ws, const char *key, const char **s, size_t *len) {
    const gguf_kv *kv = lookup(ws, key);
    if (!kv || !s || !len || kv->type != WEIGHTS_META_STR) return -1;
    *s = (const char *)kv->val;
    *len = (size_t)kv->n;
    return 0;
}

int weights_meta_array(const weights_set *ws, const char *key, int *elem_type, size_t *count) {
    const gguf_kv *kv = lookup(ws, key);
    if (!kv || kv->type != WEIGHTS_META_ARRAY) return -1;
    if (elem_type) *elem_type = kv->elem_type;
    if (count) *count = (size_t)kv->n;
    return 0;
}

int weights_meta_array_str(const weights_set *ws, const char *key, size_t i, const char **s, size_t *len) {
    const gguf_kv *kv = lookup(ws, key);
    if (!kv || !s || !len || kv->type != WEIGHTS_META_ARRAY || kv->elem_type != WEIGHTS_META_STR || i >= kv->n)
        return -1;
    const uint8_t *p = kv->val + kv->soff[i];
    *len = (size_t)le(p, 8);
    *s = (const char *)p + 8;
    return 0;
}

int weights_meta_array_int(const weights_set *ws, const char *key, size_t i, int64_t *out) {
    const gguf_kv *kv = lookup(ws, key);
    int64_t v;
    if (!kv || !out || kv->type != WEIGHTS_META_ARRAY || kv->elem_type == WEIGHTS_META_STR || i >= kv->n ||
        get_int(kv->elem_type, kv->val + i * meta_size(kv->elem_type), &v) != 0)
        return -1;
    *out = v;
    return 0;
}

int weights_meta_array_float(const weights_set *ws, const char *key, size_t i, double *out) {
    const gguf_kv *kv = lookup(ws, key);
    double v;
    if (!kv || !out || kv->type != WEIGHTS_META_ARRAY || kv->elem_type == WEIGHTS_META_STR || i >= kv->n ||
        get_float(kv->elem_type, kv->val + i * meta_size(kv->elem_type), &v) != 0)
        return -1;
    *out = v;
    return 0;
}

size_t weights_meta_count(const weights_set *ws) {
    const weights_gguf *g = weights_priv_gguf(ws);
    return g ? g->nkv : 0;
}

const char *weights_meta_key(const weights_set *ws, size_t i, int *type) {
    const weights_gguf *g = weights_priv_gguf(ws);
    if (!g || i >= g->nkv) return NULL;
    if (type) *type = g->kv[i].type;
    return g->kv[i].key;
}
