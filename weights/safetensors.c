/*
 * safetensors parser: validated, zero-copy (open.c maps the files). See
 * weights/weights.h for the contract.
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
 *   - Data pointers are not required to be aligned: the format does not
 *     promise it (the reference writer pads the header to 8 bytes, but
 *     other writers need not).
 */
#include "weights/weights.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weights/internal.h"

/* ------------------------------------------------------------ header parse */

/* Pull an entry's fields out of its JSON object and check them against the
 * data area. `t` gets everything but name and file. */
static int parse_entry(const char *fname, const char *name, json_t *val, const uint8_t *data, size_t dlen,
                       weights_tensor *t, char *err, size_t errlen) {
    if (!json_is_object(val)) {
        weights_priv_err(err, errlen, fname, name, "header entry is not a JSON object");
        return -1;
    }
    json_t *jd = json_object_get(val, "dtype");
    json_t *js = json_object_get(val, "shape");
    json_t *jo = json_object_get(val, "data_offsets");
    if (!jd || !json_is_string(jd)) {
        weights_priv_err(err, errlen, fname, name, jd ? "\"dtype\" is not a string" : "missing \"dtype\"");
        return -1;
    }
    if (!js || !json_is_array(js)) {
        weights_priv_err(err, errlen, fname, name, js ? "\"shape\" is not an array" : "missing \"shape\"");
        return -1;
    }
    if (!jo || !json_is_array(jo)) {
        weights_priv_err(err, errlen, fname, name,
                         jo ? "\"data_offsets\" is not an array" : "missing \"data_offsets\"");
        return -1;
    }

    if (weights_priv_dtype_from_string(json_string_value(jd), &t->dtype) != 0) {
        char q[NAME_QUOTE_MAX + 8];
        weights_priv_err(err, errlen, fname, name, "unknown dtype \"%s\"",
                         weights_priv_quote_name(q, sizeof q, json_string_value(jd), json_string_length(jd)));
        return -1;
    }
    size_t esize = weights_dtype_size(t->dtype);

    size_t nd = json_array_size(js);
    if (nd > WEIGHTS_MAX_DIMS) {
        weights_priv_err(err, errlen, fname, name, "shape has %zu dims, at most %d supported", nd, WEIGHTS_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)nd;
    /* uint64 product with an overflow check: a wrapped product could
     * otherwise match the byte span by accident. */
    uint64_t nelem = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d)) {
            weights_priv_err(err, errlen, fname, name, "shape[%zu] is not an integer", i);
            return -1;
        }
        json_int_t v = json_integer_value(d);
        if (v < 0) {
            weights_priv_err(err, errlen, fname, name, "negative dimension %lld in shape[%zu]", (long long)v, i);
            return -1;
        }
        if (v != 0 && nelem > UINT64_MAX / (uint64_t)v) {
            weights_priv_err(err, errlen, fname, name, "shape product overflows");
            return -1;
        }
        nelem *= (uint64_t)v;
        t->shape[i] = v;
    }
    for (size_t i = nd; i < WEIGHTS_MAX_DIMS; i++) t->shape[i] = 0;
    if (nelem > UINT64_MAX / esize || nelem * esize > SIZE_MAX) {
        weights_priv_err(err, errlen, fname, name, "tensor size overflows (shape product x dtype size)");
        return -1;
    }
    uint64_t nbytes = nelem * esize;

    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (json_array_size(jo) != 2 || !json_is_integer(jb) || !json_is_integer(je) ||
        json_integer_value(jb) < 0 || json_integer_value(je) < 0) {
        weights_priv_err(err, errlen, fname, name, "\"data_offsets\" must be two non-negative integers");
        return -1;
    }
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (begin > end) {
        weights_priv_err(err, errlen, fname, name, "data_offsets begin %llu > end %llu", (unsigned long long)begin,
                         (unsigned long long)end);
        return -1;
    }
    if (end > dlen) {
        weights_priv_err(err, errlen, fname, name, "data_offsets [%llu, %llu) outside the data area (%zu bytes)",
                (unsigned long long)begin, (unsigned long long)end, dlen);
        return -1;
    }
    if (end - begin != nbytes) {
        char sh[WEIGHTS_MAX_DIMS * 22 + 4];
        weights_priv_fmt_shape(sh, sizeof sh, t->ndim, t->shape);
        weights_priv_err(err, errlen, fname, name,
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
        weights_priv_err(err, errlen, fname, "__metadata__", "must be a JSON object");
        return -1;
    }
    json_object_foreach(val, k, v) {
        if (!json_is_string(v)) {
            char q[NAME_QUOTE_MAX + 8];
            weights_priv_err(err, errlen, fname, "__metadata__", "value of \"%s\" is not a string",
                             weights_priv_quote_name(q, sizeof q, k, strlen(k)));
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

void weights_priv_json_err(const char *fname, const char *what, const char *text, size_t len, const json_error_t *je,
                           char *err, size_t errlen) {
    char q[NAME_QUOTE_MAX + 8], m[NAME_QUOTE_MAX + 8];
    const char *key;
    size_t klen;
    if (json_error_code(je) == json_error_duplicate_key && text &&
        dup_key_at(text, len, (size_t)je->position, &key, &klen) == 0) {
        weights_priv_quote_name(q, sizeof q, key, klen);
        weights_priv_err(err, errlen, fname, q, "duplicate key in %s (tensor names must be unique)", what);
        return;
    }
    weights_priv_err(err, errlen, fname, NULL, "malformed %s at line %d, column %d: %s", what, je->line, je->column,
                     weights_priv_quote_name(m, sizeof m, je->text, strlen(je->text)));
}

int weights_parse_file_image(weights_set *ws, const char *fname, const uint8_t *buf, size_t len, char *err,
                             size_t errlen) {
    int rc = -1;
    json_t *root = NULL;
    weights_tensor *tmp = NULL;
    size_t ntmp = 0;
    weights_span *spans = NULL;
    json_error_t je;

    if (!fname) fname = "(memory)";
    if (!ws || (!buf && len)) {
        weights_priv_err(err, errlen, fname, NULL, "invalid arguments");
        goto fail;
    }
    if (len < 8) {
        weights_priv_err(err, errlen, fname, NULL, "truncated file: %zu bytes, need at least 8 for the header length",
                         len);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i]; /* little-endian on any host */
    if (hlen > len - 8) {
        weights_priv_err(err, errlen, fname, NULL, "truncated file: header length %llu exceeds the %zu bytes after it",
                         (unsigned long long)hlen, len - 8);
        goto fail;
    }
    if (hlen > HEADER_MAX) {
        weights_priv_err(err, errlen, fname, NULL, "header length %llu exceeds the %llu-byte limit",
                         (unsigned long long)hlen, (unsigned long long)HEADER_MAX);
        goto fail;
    }
    const char *htext = (const char *)buf + 8;
    root = json_loadb(htext, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        weights_priv_json_err(fname, "header JSON", htext, (size_t)hlen, &je, err, errlen);
        goto fail;
    }
    if (!json_is_object(root)) {
        weights_priv_err(err, errlen, fname, NULL, "header JSON is not an object");
        goto fail;
    }

    const uint8_t *data = buf + 8 + hlen;
    size_t dlen = len - 8 - (size_t)hlen;
    size_t nkeys = json_object_size(root);
    tmp = calloc(nkeys ? nkeys : 1, sizeof *tmp);
    spans = calloc(nkeys ? nkeys : 1, sizeof *spans);
    if (!tmp || !spans) {
        weights_priv_err(err, errlen, fname, NULL, "out of memory");
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
            weights_priv_err(err, errlen, fname, key, "out of memory");
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
        spans[nspans++] = (weights_span){b, b + tmp[i].nbytes, i};
    }
    if (weights_priv_spans_disjoint(spans, nspans, tmp, fname, "data_offsets", "overlap", err, errlen) != 0) goto fail;

    if (weights_priv_commit(ws, fname, tmp, ntmp, NULL, NULL, err, errlen) != 0) goto fail;
    ntmp = 0; /* names now owned by the set */
    rc = 0;

fail:
    for (size_t i = 0; i < ntmp; i++) free((char *)tmp[i].name);
    free(tmp);
    free(spans);
    json_decref(root);
    return rc;
}
