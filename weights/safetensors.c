/*
 * safetensors reader: mmap'ed, validated, zero-copy. See weights/weights.h
 * for the contract.
 *
 * File layout: 8-byte little-endian header length N, N bytes of JSON header,
 * then the data area. Each header entry is
 *   "name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}
 * with offsets relative to the start of the data area; the optional
 * "__metadata__" entry is a string -> string map and carries no tensor.
 *
 * Design notes
 *   - Every shard goes through weights_parse_file_image(), the same function
 *     the fuzz target drives, so what the fuzzer covers is what production
 *     runs.
 *   - weights_parse_file_image() is all-or-nothing: a file's tensors are
 *     parsed into a scratch table and only appended to the set once the whole
 *     file (and cross-shard name uniqueness) has been validated.
 *   - Lookup is an open-addressing hash table (linear probing, FNV-1a) of
 *     indices into the tensor array, rebuilt when it gets half full.
 *   - Sharded checkpoints: shards are loaded in sorted file-name order (so
 *     weights_at() order does not depend on JSON key order of the index).
 *     A tensor present in a shard but not named by the index is accepted and
 *     can be looked up: the data is valid and the index is only a routing
 *     table; what is rejected is the index promising a tensor the shard
 *     does not hold, or assigning it to a different shard.
 *   - Data pointers are not required to be aligned: the format does not
 *     promise it (the reference writer pads the header to 8 bytes, but
 *     other writers need not).
 */
#include "weights/weights.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "weights/internal.h"

/* The reference implementation refuses headers above 100 MB; a real header
 * (tens of thousands of tensors) is a few MB. The cap keeps a hostile length
 * from making jansson allocate without bound. */
#define HEADER_MAX ((uint64_t)100 * 1000 * 1000)

/* Longest tensor name quoted in a message before it is cut with "...". */
#define NAME_QUOTE_MAX 200

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

typedef struct mapping {
    void *addr;
    size_t len;
} mapping;

struct weights_set {
    char *source; /* path given to weights_open(); NULL for weights_new_empty() */

    weights_tensor *tensors; /* names and file strings owned by the set */
    size_t n, cap;

    size_t *slots; /* hash table: tensor index + 1, 0 = empty */
    size_t nslots; /* power of two, > 2 * n */

    char **files; /* one owned copy of each shard path (tensor.file) */
    size_t nfiles, files_cap;

    mapping *maps;
    size_t nmaps, maps_cap;

    size_t total_bytes;

    weights_gguf *gguf; /* GGUF metadata (gguf.c); NULL for safetensors */
};

/* ---------------------------------------------------------------- messages */

/* Copy an untrusted name into `out` for quoting in a message: control bytes
 * become '?', long names are cut (on a UTF-8 boundary) and end in "...", so
 * a hostile header cannot inject newlines or flood the caller's buffer. */
static const char *quote_name(char *out, size_t outlen, const char *s, size_t slen) {
    size_t o = 0, i;
    if (outlen < 8) return "?";
    for (i = 0; i < slen && o + 4 < outlen && o < NAME_QUOTE_MAX; i++) {
        unsigned char c = (unsigned char)s[i];
        out[o++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (i < slen) {
        while (o > 0 && ((unsigned char)out[o - 1] & 0xC0) == 0x80) o--; /* continuation bytes */
        if (o > 0 && ((unsigned char)out[o - 1] & 0xC0) == 0xC0) o--;     /* dangling lead byte */
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = 0;
    return out;
}

/* "<file>: <tensor>: <reason>" into the caller's buffer; tensor may be NULL. */
__attribute__((format(printf, 5, 0))) static void vset_err(char *err, size_t errlen, const char *file,
                                                            const char *tensor, const char *fmt, va_list ap) {
    if (!err || errlen == 0) return;
    char qn[NAME_QUOTE_MAX + 8];
    int off;
    if (tensor)
        off = snprintf(err, errlen, "%s: %s: ", file ? file : "(weights)",
                       quote_name(qn, sizeof qn, tensor, strlen(tensor)));
    else
        off = snprintf(err, errlen, "%s: ", file ? file : "(weights)");
    if (off < 0 || (size_t)off >= errlen) return;
    vsnprintf(err + off, errlen - (size_t)off, fmt, ap);
}

__attribute__((format(printf, 5, 6))) static void set_err(char *err, size_t errlen, const char *file,
                                                           const char *tensor, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset_err(err, errlen, file, tensor, fmt, ap);
    va_end(ap);
}

void weights_priv_err(char *err, size_t errlen, const char *file, const char *what, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset_err(err, errlen, file, what, fmt, ap);
    va_end(ap);
}

static const char *errno_str(int e, char *buf, size_t len) {
    /* GNU strerror_r (the build defines _GNU_SOURCE): thread-safe, unlike strerror. */
    return strerror_r(e, buf, len);
}

/* ------------------------------------------------------------------ dtypes */

static const struct {
    const char *name;
    weights_dtype dt;
    size_t size;
} DTYPES[] = {
    {"F32", WEIGHTS_F32, 4},         {"F16", WEIGHTS_F16, 2},         {"BF16", WEIGHTS_BF16, 2},
    {"F64", WEIGHTS_F64, 8},         {"I64", WEIGHTS_I64, 8},         {"I32", WEIGHTS_I32, 4},
    {"I16", WEIGHTS_I16, 2},         {"I8", WEIGHTS_I8, 1},           {"U8", WEIGHTS_U8, 1},
    {"BOOL", WEIGHTS_BOOL, 1},       {"F8_E4M3", WEIGHTS_F8_E4M3, 1}, {"F8_E5M2", WEIGHTS_F8_E5M2, 1},
    {"U16", WEIGHTS_U16, 2},         {"U32", WEIGHTS_U32, 4},         {"U64", WEIGHTS_U64, 8},
    /* GGUF only (size 0: no per-element size; never a safetensors dtype). */
    {"Q8_0", WEIGHTS_Q8_0, 0},       {"Q4_0", WEIGHTS_Q4_0, 0},       {"Q4_1", WEIGHTS_Q4_1, 0},
    {"Q5_0", WEIGHTS_Q5_0, 0},       {"Q5_1", WEIGHTS_Q5_1, 0},       {"Q4_K", WEIGHTS_Q4_K, 0},
    {"Q5_K", WEIGHTS_Q5_K, 0},       {"Q6_K", WEIGHTS_Q6_K, 0},
};
#define NDTYPES (sizeof DTYPES / sizeof DTYPES[0])

size_t weights_dtype_size(weights_dtype dt) {
    for (size_t i = 0; i < NDTYPES; i++)
        if (DTYPES[i].dt == dt) return DTYPES[i].size;
    return 0;
}

const char *weights_dtype_name(weights_dtype dt) {
    for (size_t i = 0; i < NDTYPES; i++)
        if (DTYPES[i].dt == dt) return DTYPES[i].name;
    return "INVALID";
}

static int dtype_from_string(const char *s, weights_dtype *dt) {
    for (size_t i = 0; i < NDTYPES; i++)
        if (DTYPES[i].size && strcmp(DTYPES[i].name, s) == 0) {
            *dt = DTYPES[i].dt;
            return 0;
        }
    return -1;
}

static int dtype_fetchable(weights_dtype dt) {
    return dt == WEIGHTS_F32 || dt == WEIGHTS_F16 || dt == WEIGHTS_BF16 || weights_dtype_is_quantized(dt);
}

/* -------------------------------------------------------------- hash table */

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static const weights_tensor *table_find(const weights_set *ws, const char *name) {
    if (!ws->nslots) return NULL;
    size_t mask = ws->nslots - 1;
    for (size_t i = (size_t)hash_name(name) & mask;; i = (i + 1) & mask) {
        size_t s = ws->slots[i];
        if (s == 0) return NULL;
        if (strcmp(ws->tensors[s - 1].name, name) == 0) return &ws->tensors[s - 1];
    }
}

/* Caller guarantees a free slot (table kept under half full). */
static void table_insert(weights_set *ws, size_t idx) {
    size_t mask = ws->nslots - 1;
    size_t i = (size_t)hash_name(ws->tensors[idx].name) & mask;
    while (ws->slots[i]) i = (i + 1) & mask;
    ws->slots[i] = idx + 1;
}

/* Make room for `more` tensors in both the array and the hash table so
 * that committing a validated file cannot fail half-way. */
static int reserve_tensors(weights_set *ws, size_t more) {
    size_t need = ws->n + more;
    if (need < ws->n) return -1;
    if (need > ws->cap) {
        size_t cap = ws->cap ? ws->cap : 16;
        while (cap < need) {
            if (cap > SIZE_MAX / 2 / sizeof(weights_tensor)) return -1;
            cap *= 2;
        }
        weights_tensor *t = realloc(ws->tensors, cap * sizeof *t);
        if (!t) return -1;
        ws->tensors = t;
        ws->cap = cap;
    }
    if (need > SIZE_MAX / 4) return -1;
    if (need * 2 >= ws->nslots) {
        size_t ns = ws->nslots ? ws->nslots : 64;
        while (need * 2 >= ns) ns *= 2;
        size_t *slots = calloc(ns, sizeof *slots);
        if (!slots) return -1;
        free(ws->slots);
        ws->slots = slots;
        ws->nslots = ns;
        for (size_t i = 0; i < ws->n; i++) table_insert(ws, i);
    }
    return 0;
}

/* Grow an array of `elem`-sized items to hold one more. */
static int grow(void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 8;
    if (nc > SIZE_MAX / elem) return -1;
    void *p = realloc(*arr, nc * elem);
    if (!p) return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

/* ----------------------------------------------------------- set lifetime */

weights_set *weights_new_empty(void) { return calloc(1, sizeof(weights_set)); }

void weights_drop_pages(const weights_set *ws, const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p, page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (!ws || !p || page == 0 || (page & (page - 1))) return;
    for (size_t i = 0; i < ws->nmaps; i++) {
        uintptr_t m0 = (uintptr_t)ws->maps[i].addr, m1 = m0 + ws->maps[i].len;
        if (a < m0 || a >= m1) continue;
        uintptr_t e = a + n > m1 ? m1 : a + n;
        uintptr_t lo = (a + page - 1) & ~(page - 1), hi = e & ~(page - 1);
        /* Read-only private file pages: MADV_DONTNEED only unmaps them. */
        if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
        return;
    }
}

void weights_close(weights_set *ws) {
    if (!ws) return;
    for (size_t i = 0; i < ws->n; i++) free((char *)ws->tensors[i].name);
    for (size_t i = 0; i < ws->nfiles; i++) free(ws->files[i]);
    for (size_t i = 0; i < ws->nmaps; i++) munmap(ws->maps[i].addr, ws->maps[i].len);
    weights_gguf_free(ws->gguf);
    free(ws->tensors);
    free(ws->slots);
    free(ws->files);
    free(ws->maps);
    free(ws->source);
    free(ws);
}

size_t weights_count(const weights_set *ws) { return ws ? ws->n : 0; }

const weights_tensor *weights_at(const weights_set *ws, size_t i) {
    return (ws && i < ws->n) ? &ws->tensors[i] : NULL;
}

const weights_tensor *weights_find(const weights_set *ws, const char *name) {
    return (ws && name) ? table_find(ws, name) : NULL;
}

size_t weights_total_bytes(const weights_set *ws) { return ws ? ws->total_bytes : 0; }

const weights_gguf *weights_priv_gguf(const weights_set *ws) { return ws ? ws->gguf : NULL; }

/* ------------------------------------------------------------ header parse */

static void fmt_shape(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t o = 0;
    int n = snprintf(buf, len, "[");
    if (n < 0) return;
    o = (size_t)n;
    for (int i = 0; i < ndim && o < len; i++) {
        n = snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (n < 0) return;
        o += (size_t)n;
    }
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* Pull an entry's fields out of its JSON object and check them against the
 * data area. `t` gets everything but name and file. */
static int parse_entry(const char *fname, const char *name, json_t *val, const uint8_t *data, size_t dlen,
                       weights_tensor *t, char *err, size_t errlen) {
    if (!json_is_object(val)) {
        set_err(err, errlen, fname, name, "header entry is not a JSON object");
        return -1;
    }
    json_t *jd = json_object_get(val, "dtype");
    json_t *js = json_object_get(val, "shape");
    json_t *jo = json_object_get(val, "data_offsets");
    if (!jd || !json_is_string(jd)) {
        set_err(err, errlen, fname, name, jd ? "\"dtype\" is not a string" : "missing \"dtype\"");
        return -1;
    }
    if (!js || !json_is_array(js)) {
        set_err(err, errlen, fname, name, js ? "\"shape\" is not an array" : "missing \"shape\"");
        return -1;
    }
    if (!jo || !json_is_array(jo)) {
        set_err(err, errlen, fname, name,
                jo ? "\"data_offsets\" is not an array" : "missing \"data_offsets\"");
        return -1;
    }

    if (dtype_from_string(json_string_value(jd), &t->dtype) != 0) {
        char q[NAME_QUOTE_MAX + 8];
        set_err(err, errlen, fname, name, "unknown dtype \"%s\"",
                quote_name(q, sizeof q, json_string_value(jd), json_string_length(jd)));
        return -1;
    }
    size_t esize = weights_dtype_size(t->dtype);

    size_t nd = json_array_size(js);
    if (nd > WEIGHTS_MAX_DIMS) {
        set_err(err, errlen, fname, name, "shape has %zu dims, at most %d supported", nd, WEIGHTS_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)nd;
    /* uint64 product with an overflow check: a wrapped product could
     * otherwise match the byte span by accident. */
    uint64_t nelem = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d)) {
            set_err(err, errlen, fname, name, "shape[%zu] is not an integer", i);
            return -1;
        }
        json_int_t v = json_integer_value(d);
        if (v < 0) {
            set_err(err, errlen, fname, name, "negative dimension %lld in shape[%zu]", (long long)v, i);
            return -1;
        }
        if (v != 0 && nelem > UINT64_MAX / (uint64_t)v) {
            set_err(err, errlen, fname, name, "shape product overflows");
            return -1;
        }
        nelem *= (uint64_t)v;
        t->shape[i] = v;
    }
    for (size_t i = nd; i < WEIGHTS_MAX_DIMS; i++) t->shape[i] = 0;
    if (nelem > UINT64_MAX / esize || nelem * esize > SIZE_MAX) {
        set_err(err, errlen, fname, name, "tensor size overflows (shape product x dtype size)");
        return -1;
    }
    uint64_t nbytes = nelem * esize;

    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (json_array_size(jo) != 2 || !json_is_integer(jb) || !json_is_integer(je) ||
        json_integer_value(jb) < 0 || json_integer_value(je) < 0) {
        set_err(err, errlen, fname, name, "\"data_offsets\" must be two non-negative integers");
        return -1;
    }
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (begin > end) {
        set_err(err, errlen, fname, name, "data_offsets begin %llu > end %llu", (unsigned long long)begin,
                (unsigned long long)end);
        return -1;
    }
    if (end > dlen) {
        set_err(err, errlen, fname, name, "data_offsets [%llu, %llu) outside the data area (%zu bytes)",
                (unsigned long long)begin, (unsigned long long)end, dlen);
        return -1;
    }
    if (end - begin != nbytes) {
        char sh[WEIGHTS_MAX_DIMS * 22 + 4];
        fmt_shape(sh, sizeof sh, t->ndim, t->shape);
        set_err(err, errlen, fname, name,
                "size mismatch: shape %s x %s = %llu bytes but data_offsets span %llu bytes", sh,
                weights_dtype_name(t->dtype), (unsigned long long)nbytes, (unsigned long long)(end - begin));
        return -1;
    }
    t->data = data + begin;
    t->nbytes = (size_t)nbytes;
    return 0;
}

/* "__metadata__" carries no tensor; the format defines it as string -> string. */
static int check_metadata(const char *fname, json_t *val, char *err, size_t errlen) {
    const char *k;
    json_t *v;
    if (!json_is_object(val)) {
        set_err(err, errlen, fname, "__metadata__", "must be a JSON object");
        return -1;
    }
    json_object_foreach(val, k, v) {
        if (!json_is_string(v)) {
            char q[NAME_QUOTE_MAX + 8];
            set_err(err, errlen, fname, "__metadata__", "value of \"%s\" is not a string",
                    quote_name(q, sizeof q, k, strlen(k)));
            return -1;
        }
    }
    return 0;
}

/* jansson reports a duplicate key without naming it when the key is longer
 * than 20 bytes (every real tensor name). Its error position is just past
 * the key's closing quote, so recover the raw key text from the header. */
static int dup_key_at(const char *text, size_t len, size_t pos, const char **key, size_t *klen) {
    if (pos < 2 || pos > len || text[pos - 1] != '"') return -1;
    size_t close = pos - 1;
    for (size_t i = close; i-- > 0;) {
        if (text[i] != '"') continue;
        size_t bs = 0;
        while (bs < i && text[i - 1 - bs] == '\\') bs++;
        if (bs % 2 == 0) { /* an unescaped quote: the key's opening one */
            *key = text + i + 1;
            *klen = close - i - 1;
            return 0;
        }
    }
    return -1;
}

static void json_err(const char *fname, const char *what, const char *text, size_t len, const json_error_t *je,
                     char *err, size_t errlen) {
    char q[NAME_QUOTE_MAX + 8], m[NAME_QUOTE_MAX + 8];
    const char *key;
    size_t klen;
    if (json_error_code(je) == json_error_duplicate_key && text &&
        dup_key_at(text, len, (size_t)je->position, &key, &klen) == 0) {
        quote_name(q, sizeof q, key, klen);
        set_err(err, errlen, fname, q, "duplicate key in %s (tensor names must be unique)", what);
        return;
    }
    set_err(err, errlen, fname, NULL, "malformed %s at line %d, column %d: %s", what, je->line, je->column,
            quote_name(m, sizeof m, je->text, strlen(je->text)));
}

typedef struct span {
    uint64_t begin, end;
    size_t idx;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

int weights_parse_file_image(weights_set *ws, const char *fname, const uint8_t *buf, size_t len, char *err,
                             size_t errlen) {
    int rc = -1;
    json_t *root = NULL;
    weights_tensor *tmp = NULL;
    size_t ntmp = 0;
    span *spans = NULL;
    json_error_t je;

    if (!fname) fname = "(memory)";
    if (!ws || (!buf && len)) {
        set_err(err, errlen, fname, NULL, "invalid arguments");
        goto fail;
    }
    if (len < 8) {
        set_err(err, errlen, fname, NULL, "truncated file: %zu bytes, need at least 8 for the header length",
                len);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i]; /* little-endian on any host */
    if (hlen > len - 8) {
        set_err(err, errlen, fname, NULL, "truncated file: header length %llu exceeds the %zu bytes after it",
                (unsigned long long)hlen, len - 8);
        goto fail;
    }
    if (hlen > HEADER_MAX) {
        set_err(err, errlen, fname, NULL, "header length %llu exceeds the %llu-byte limit",
                (unsigned long long)hlen, (unsigned long long)HEADER_MAX);
        goto fail;
    }
    const char *htext = (const char *)buf + 8;
    root = json_loadb(htext, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        json_err(fname, "header JSON", htext, (size_t)hlen, &je, err, errlen);
        goto fail;
    }
    if (!json_is_object(root)) {
        set_err(err, errlen, fname, NULL, "header JSON is not an object");
        goto fail;
    }

    const uint8_t *data = buf + 8 + hlen;
    size_t dlen = len - 8 - (size_t)hlen;
    size_t nkeys = json_object_size(root);
    tmp = calloc(nkeys ? nkeys : 1, sizeof *tmp);
    spans = calloc(nkeys ? nkeys : 1, sizeof *spans);
    if (!tmp || !spans) {
        set_err(err, errlen, fname, NULL, "out of memory");
        goto fail;
    }

    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (check_metadata(fname, val, err, errlen) != 0) goto fail;
            continue;
        }
        weights_tensor *t = &tmp[ntmp];
        if (parse_entry(fname, key, val, data, dlen, t, err, errlen) != 0) goto fail;
        t->name = strdup(key);
        if (!t->name) {
            set_err(err, errlen, fname, key, "out of memory");
            goto fail;
        }
        ntmp++;
    }

    /* Overlap: sort by begin; each non-empty tensor must start at or after
     * the end of the one before. Empty tensors occupy no bytes, so they
     * cannot overlap anything and are left out. */
    size_t nspans = 0;
    for (size_t i = 0; i < ntmp; i++) {
        if (tmp[i].nbytes == 0) continue;
        uint64_t b = (uint64_t)((const uint8_t *)tmp[i].data - data);
        spans[nspans++] = (span){b, b + tmp[i].nbytes, i};
    }
    qsort(spans, nspans, sizeof *spans, span_cmp);
    for (size_t i = 1; i < nspans; i++) {
        if (spans[i].begin < spans[i - 1].end) {
            char q[NAME_QUOTE_MAX + 8];
            const char *other = tmp[spans[i - 1].idx].name;
            set_err(err, errlen, fname, tmp[spans[i].idx].name,
                    "data_offsets [%llu, %llu) overlap tensor \"%s\" [%llu, %llu)",
                    (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end,
                    quote_name(q, sizeof q, other, strlen(other)), (unsigned long long)spans[i - 1].begin,
                    (unsigned long long)spans[i - 1].end);
            goto fail;
        }
    }

    if (weights_priv_commit(ws, fname, tmp, ntmp, NULL, err, errlen) != 0) goto fail;
    ntmp = 0; /* names now owned by the set */
    rc = 0;

fail:
    for (size_t i = 0; i < ntmp; i++) free((char *)tmp[i].name);
    free(tmp);
    free(spans);
    json_decref(root);
    return rc;
}

int weights_priv_commit(weights_set *ws, const char *fname, weights_tensor *tmp, size_t n, weights_gguf *gguf,
                        char *err, size_t errlen) {
    /* Names within this file are unique (the parser checked); check
     * against the shards already in the set. */
    for (size_t i = 0; i < n; i++) {
        const weights_tensor *prev = table_find(ws, tmp[i].name);
        if (prev) {
            set_err(err, errlen, fname, tmp[i].name, "duplicate tensor name (also in %s)", prev->file);
            return -1;
        }
    }

    /* Reserve everything first so nothing below can fail. */
    size_t total = ws->total_bytes;
    for (size_t i = 0; i < n; i++) {
        if (total > SIZE_MAX - tmp[i].nbytes) {
            set_err(err, errlen, fname, tmp[i].name, "total tensor size overflows");
            return -1;
        }
        total += tmp[i].nbytes;
    }
    char *fcopy = strdup(fname);
    if (!fcopy || reserve_tensors(ws, n) != 0 ||
        grow((void **)&ws->files, &ws->files_cap, ws->nfiles, sizeof *ws->files) != 0) {
        free(fcopy);
        set_err(err, errlen, fname, NULL, "out of memory");
        return -1;
    }
    ws->files[ws->nfiles++] = fcopy;
    for (size_t i = 0; i < n; i++) {
        tmp[i].file = fcopy;
        ws->tensors[ws->n] = tmp[i];
        table_insert(ws, ws->n);
        ws->n++;
    }
    ws->total_bytes = total;
    if (gguf) ws->gguf = gguf;
    return 0;
}

/* ---------------------------------------------------------------- opening */

/* mmap `path` read-only, record the mapping in `ws` (weights_close unmaps
 * it), and validate it as one shard. `what` prefixes an open failure. With
 * `gguf_ok` (a file named directly, not a shard) a file starting with the
 * GGUF magic is read as GGUF. */
static int load_file(weights_set *ws, const char *path, const char *what, int gguf_ok, char *err,
                     size_t errlen) {
    static const uint8_t empty[1] = {0};
    char eb[128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, errlen, path, NULL, "%s: %s", what, errno_str(errno, eb, sizeof eb));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        set_err(err, errlen, path, NULL, "%s: %s", what, errno_str(errno, eb, sizeof eb));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, errlen, path, NULL, "%s: not a regular file", what);
        close(fd);
        return -1;
    }
    size_t len = (size_t)st.st_size;
    const uint8_t *buf = empty; /* mmap refuses length 0; parse reports "truncated" */
    if (len > 0) {
        if (grow((void **)&ws->maps, &ws->maps_cap, ws->nmaps, sizeof *ws->maps) != 0) {
            set_err(err, errlen, path, NULL, "out of memory");
            close(fd);
            return -1;
        }
        void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            set_err(err, errlen, path, NULL, "mmap failed: %s", errno_str(errno, eb, sizeof eb));
            close(fd);
            return -1;
        }
        ws->maps[ws->nmaps++] = (mapping){p, len};
        buf = p;
    }
    close(fd); /* the mapping keeps the file alive */
    if (gguf_ok && len >= 4 && memcmp(buf, "GGUF", 4) == 0)
        return weights_parse_gguf_image(ws, path, buf, len, err, errlen);
    return weights_parse_file_image(ws, path, buf, len, err, errlen);
}

static char *join_path(const char *dir, const char *name) {
    size_t dl = strlen(dir), nl = strlen(name);
    char *p = malloc(dl + nl + 2);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    size_t o = dl;
    if (dl == 0 || dir[dl - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, nl + 1);
    return p;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Shard names come from an untrusted index: keep them inside the folder. */
static int shard_name_ok(const char *s) {
    if (!*s || s[0] == '/') return 0;
    for (const char *p = s; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') return 0;
        p += n + (e ? 1 : 0);
    }
    return 1;
}

static int str_ptr_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sharded checkpoint: `index` is the index file, `dir` the folder the shard
 * names are relative to. */
static int load_index(weights_set *ws, const char *index, const char *dir, char *err, size_t errlen) {
    int rc = -1;
    json_error_t je;
    json_t *root = NULL;
    const char **shards = NULL;
    char **paths = NULL;
    size_t nshards = 0;

    /* Read it ourselves rather than json_load_file() so a duplicate-key
     * error can quote the key from the text. */
    char eb[128];
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = fopen(index, "rb");
    if (!f) {
        set_err(err, errlen, index, NULL, "cannot open: %s", errno_str(errno, eb, sizeof eb));
        goto fail;
    }
    size_t cap = 0;
    for (;;) {
        if (tlen == cap) {
            if (cap >= HEADER_MAX) {
                set_err(err, errlen, index, NULL, "index file larger than %llu bytes",
                        (unsigned long long)HEADER_MAX);
                fclose(f);
                goto fail;
            }
            cap = cap ? cap * 2 : 65536;
            char *nt = realloc(text, cap);
            if (!nt) {
                set_err(err, errlen, index, NULL, "out of memory");
                fclose(f);
                goto fail;
            }
            text = nt;
        }
        size_t r = fread(text + tlen, 1, cap - tlen, f);
        tlen += r;
        if (r == 0) break;
    }
    int rerr = ferror(f);
    fclose(f);
    if (rerr) {
        set_err(err, errlen, index, NULL, "read error");
        goto fail;
    }

    root = json_loadb(text, tlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        json_err(index, "index JSON", text, tlen, &je, err, errlen);
        goto fail;
    }
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        set_err(err, errlen, index, NULL, "index has no \"weight_map\" object");
        goto fail;
    }

    /* The distinct shard names, sorted: they fix the load order. */
    size_t nmap = json_object_size(wm);
    shards = calloc(nmap ? nmap : 1, sizeof *shards);
    if (!shards) {
        set_err(err, errlen, index, NULL, "out of memory");
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val) || !shard_name_ok(json_string_value(val))) {
            set_err(err, errlen, index, key, "weight_map value must be a shard file name inside the folder");
            goto fail;
        }
        shards[nshards++] = json_string_value(val);
    }
    qsort(shards, nshards, sizeof *shards, str_ptr_cmp);
    size_t u = 0;
    for (size_t i = 0; i < nshards; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0) shards[u++] = shards[i];
    nshards = u;

    paths = calloc(nshards ? nshards : 1, sizeof *paths);
    if (!paths) {
        set_err(err, errlen, index, NULL, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < nshards; i++) {
        paths[i] = join_path(dir, shards[i]);
        if (!paths[i]) {
            set_err(err, errlen, index, NULL, "out of memory");
            goto fail;
        }
        if (load_file(ws, paths[i], "missing shard file (named by " INDEX_NAME ")", 0, err, errlen) != 0)
            goto fail;
    }

    /* Every tensor the index promises must be in the shard it names. */
    json_object_foreach(wm, key, val) {
        const char *want = json_string_value(val);
        const char **s = bsearch(&want, shards, nshards, sizeof *shards, str_ptr_cmp);
        const char *path = s ? paths[s - shards] : want; /* s is always found */
        const weights_tensor *t = table_find(ws, key);
        if (!t) {
            set_err(err, errlen, path, key, "listed in the index but missing from its shard");
            goto fail;
        }
        if (strcmp(t->file, path) != 0) {
            set_err(err, errlen, path, key, "listed in the index for this shard but missing from it (found in %s)",
                    t->file);
            goto fail;
        }
    }
    rc = 0;

fail:
    if (paths)
        for (size_t i = 0; i < nshards; i++) free(paths[i]);
    free(paths);
    free(shards);
    json_decref(root);
    free(text);
    return rc;
}

int weights_open(const char *path, weights_set **out, char *err, size_t errlen) {
    int rc = -1;
    weights_set *ws = NULL;
    char *index = NULL, *single = NULL, *dir = NULL;
    char eb[128];
    struct stat st;

    if (out) *out = NULL;
    if (!path || !out) {
        set_err(err, errlen, path, NULL, "invalid arguments");
        goto fail;
    }
    if (stat(path, &st) != 0) {
        set_err(err, errlen, path, NULL, "cannot open: %s", errno_str(errno, eb, sizeof eb));
        goto fail;
    }
    ws = weights_new_empty();
    if (!ws || !(ws->source = strdup(path))) {
        set_err(err, errlen, path, NULL, "out of memory");
        goto fail;
    }

    if (S_ISDIR(st.st_mode)) {
        index = join_path(path, INDEX_NAME);
        single = join_path(path, SINGLE_NAME);
        if (!index || !single) {
            set_err(err, errlen, path, NULL, "out of memory");
            goto fail;
        }
        struct stat s2;
        if (stat(index, &s2) == 0) {
            if (load_index(ws, index, path, err, errlen) != 0) goto fail;
        } else if (stat(single, &s2) == 0) {
            if (load_file(ws, single, "cannot open", 0, err, errlen) != 0) goto fail;
        } else {
            set_err(err, errlen, path, NULL, "neither " INDEX_NAME " nor " SINGLE_NAME " found in the folder");
            goto fail;
        }
    } else if (ends_with(path, ".safetensors.index.json")) {
        /* Convenience: the index itself names a sharded checkpoint. */
        dir = strdup(path);
        if (!dir) {
            set_err(err, errlen, path, NULL, "out of memory");
            goto fail;
        }
        char *slash = strrchr(dir, '/');
        if (slash)
            slash[slash == dir ? 1 : 0] = 0;
        else
            strcpy(dir, ".");
        if (load_index(ws, path, dir, err, errlen) != 0) goto fail;
    } else {
        if (load_file(ws, path, "cannot open", 1, err, errlen) != 0) goto fail;
    }

    *out = ws;
    ws = NULL;
    rc = 0;

fail:
    weights_close(ws);
    free(index);
    free(single);
    free(dir);
    return rc;
}

/* ------------------------------------------------------------------- fetch */

int weights_get(const weights_set *ws, const char *name, int ndim, const int64_t *shape,
                const weights_tensor **out, char *err, size_t errlen) {
    const char *src = (ws && ws->source) ? ws->source : "(weights)";
    if (out) *out = NULL;
    if (!ws || !name || ndim < 0 || ndim > WEIGHTS_MAX_DIMS || (ndim > 0 && !shape)) {
        set_err(err, errlen, src, name, "invalid arguments to weights_get");
        return -1;
    }
    const weights_tensor *t = table_find(ws, name);
    if (!t) {
        set_err(err, errlen, src, name, "missing tensor: not found in the checkpoint");
        return -1;
    }
    if (!dtype_fetchable(t->dtype)) {
        set_err(err, errlen, t->file, name, "dtype %s is not supported (expected BF16, F16 or F32)",
                weights_dtype_name(t->dtype));
        return -1;
    }
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char want[WEIGHTS_MAX_DIMS * 22 + 4], have[WEIGHTS_MAX_DIMS * 22 + 4];
        fmt_shape(want, sizeof want, ndim, shape);
        fmt_shape(have, sizeof have, t->ndim, t->shape);
        set_err(err, errlen, t->file, name, "shape mismatch: expected %s, found %s", want, have);
        return -1;
    }
    if (out) *out = t;
    return 0;
}
