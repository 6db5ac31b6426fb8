/*
 * The weights set: the tensor table (an open-addressing hash, linear
 * probing, FNV-1a, of indices into the tensor array, rebuilt when half
 * full), the mappings it owns, messages, dtypes, and weights_get. The
 * parsers (safetensors.c, gguf.c) append to it through weights_priv_commit;
 * open.c opens files and picks the parser. See weights/weights.h.
 */
#include "weights/weights.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "weights/internal.h"

/* ---------------------------------------------------------------- messages */

/* Copy an untrusted name into `out` for quoting in a message: control bytes
 * become '?', long names are cut (on a UTF-8 boundary) and end in "...", so
 * a hostile header cannot inject newlines or flood the caller's buffer. */
const char *weights_priv_quote_name(char *out, size_t outlen, const char *s, size_t slen) {
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
                       weights_priv_quote_name(qn, sizeof qn, tensor, strlen(tensor)));
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

int weights_dtype_is_quantized(weights_dtype dt) { return dt >= WEIGHTS_Q8_0 && dt <= WEIGHTS_Q6_K; }

int weights_priv_dtype_from_string(const char *s, weights_dtype *dt) {
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

static int span_cmp(const void *a, const void *b) {
    const weights_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

int weights_priv_spans_disjoint(weights_span *spans, size_t n, const weights_tensor *t, const char *fname,
                                const char *what, const char *verb, char *err, size_t errlen) {
    qsort(spans, n, sizeof *spans, span_cmp);
    for (size_t i = 1; i < n; i++) {
        if (spans[i].begin >= spans[i - 1].end) continue;
        char q[NAME_QUOTE_MAX + 8];
        const char *other = t[spans[i - 1].idx].name;
        weights_priv_err(err, errlen, fname, t[spans[i].idx].name, "%s [%llu, %llu) %s tensor \"%s\" [%llu, %llu)",
                         what, (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end, verb,
                         weights_priv_quote_name(q, sizeof q, other, strlen(other)),
                         (unsigned long long)spans[i - 1].begin, (unsigned long long)spans[i - 1].end);
        return -1;
    }
    return 0;
}

const weights_tensor *weights_priv_table_find(const weights_set *ws, const char *name) {
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
int weights_priv_grow(void **arr, size_t *cap, size_t n, size_t elem) {
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
    if (ws->gguf_free) ws->gguf_free(ws->gguf);
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
    return (ws && name) ? weights_priv_table_find(ws, name) : NULL;
}

size_t weights_total_bytes(const weights_set *ws) { return ws ? ws->total_bytes : 0; }

const weights_gguf *weights_priv_gguf(const weights_set *ws) { return ws ? ws->gguf : NULL; }

void weights_priv_fmt_shape(char *buf, size_t len, int ndim, const int64_t *shape) {
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

int weights_priv_commit(weights_set *ws, const char *fname, weights_tensor *tmp, size_t n, weights_gguf *gguf,
                        void (*gguf_free)(weights_gguf *), char *err, size_t errlen) {
    /* Names within this file are unique (the parser checked); check
     * against the shards already in the set. */
    for (size_t i = 0; i < n; i++) {
        const weights_tensor *prev = weights_priv_table_find(ws, tmp[i].name);
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
        weights_priv_grow((void **)&ws->files, &ws->files_cap, ws->nfiles, sizeof *ws->files) != 0) {
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
    if (gguf) ws->gguf = gguf, ws->gguf_free = gguf_free;
    return 0;
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
    const weights_tensor *t = weights_priv_table_find(ws, name);
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
        weights_priv_fmt_shape(want, sizeof want, ndim, shape);
        weights_priv_fmt_shape(have, sizeof have, t->ndim, t->shape);
        set_err(err, errlen, t->file, name, "shape mismatch: expected %s, found %s", want, have);
        return -1;
    }
    if (out) *out = t;
    return 0;
}
