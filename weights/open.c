/*
 * weights_open: a safetensors file, a folder (single or sharded through
 * model.safetensors.index.json) or a GGUF file, mmap'ed read-only, each
 * file handed to its parser (safetensors.c, gguf.c).
 *
 * Sharded checkpoints: shards are loaded in sorted file-name order (so
 * weights_at() order does not depend on JSON key order of the index).
 * A tensor present in a shard but not named by the index is accepted and
 * can be looked up: the data is valid and the index is only a routing
 * table; what is rejected is the index promising a tensor the shard
 * does not hold, or assigning it to a different shard.
 */
#include "weights/weights.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "weights/internal.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

static const char *errno_str(int e, char *buf, size_t len) {
    /* GNU strerror_r (the build defines _GNU_SOURCE): thread-safe, unlike strerror. */
    return strerror_r(e, buf, len);
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
        weights_priv_err(err, errlen, path, NULL, "%s: %s", what, errno_str(errno, eb, sizeof eb));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        weights_priv_err(err, errlen, path, NULL, "%s: %s", what, errno_str(errno, eb, sizeof eb));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        weights_priv_err(err, errlen, path, NULL, "%s: not a regular file", what);
        close(fd);
        return -1;
    }
    size_t len = (size_t)st.st_size;
    const uint8_t *buf = empty; /* mmap refuses length 0; parse reports "truncated" */
    if (len > 0) {
        if (weights_priv_grow((void **)&ws->maps, &ws->maps_cap, ws->nmaps, sizeof *ws->maps) != 0) {
            weights_priv_err(err, errlen, path, NULL, "out of memory");
            close(fd);
            return -1;
        }
        void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            weights_priv_err(err, errlen, path, NULL, "mmap failed: %s", errno_str(errno, eb, sizeof eb));
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
        weights_priv_err(err, errlen, index, NULL, "cannot open: %s", errno_str(errno, eb, sizeof eb));
        goto fail;
    }
    size_t cap = 0;
    for (;;) {
        if (tlen == cap) {
            if (cap >= HEADER_MAX) {
                weights_priv_err(err, errlen, index, NULL, "index file larger than %llu bytes",
                                 (unsigned long long)HEADER_MAX);
                fclose(f);
                goto fail;
            }
            cap = cap ? cap * 2 : 65536;
            char *nt = realloc(text, cap);
            if (!nt) {
                weights_priv_err(err, errlen, index, NULL, "out of memory");
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
        weights_priv_err(err, errlen, index, NULL, "read error");
        goto fail;
    }

    root = json_loadb(text, tlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        weights_priv_json_err(index, "index JSON", text, tlen, &je, err, errlen);
        goto fail;
    }
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        weights_priv_err(err, errlen, index, NULL, "index has no \"weight_map\" object");
        goto fail;
    }

    /* The distinct shard names, sorted: they fix the load order. */
    size_t nmap = json_object_size(wm);
    shards = calloc(nmap ? nmap : 1, sizeof *shards);
    if (!shards) {
        weights_priv_err(err, errlen, index, NULL, "out of memory");
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val) || !shard_name_ok(json_string_value(val))) {
            weights_priv_err(err, errlen, index, key, "weight_map value must be a shard file name inside the folder");
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
        weights_priv_err(err, errlen, index, NULL, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < nshards; i++) {
        paths[i] = join_path(dir, shards[i]);
        if (!paths[i]) {
            weights_priv_err(err, errlen, index, NULL, "out of memory");
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
        const weights_tensor *t = weights_priv_table_find(ws, key);
        if (!t) {
            weights_priv_err(err, errlen, path, key, "listed in the index but missing from its shard");
            goto fail;
        }
        if (strcmp(t->file, path) != 0) {
            weights_priv_err(err, errlen, path, key, "listed in the index for this shard but missing from it (found in %s)",
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
        weights_priv_err(err, errlen, path, NULL, "invalid arguments");
        goto fail;
    }
    if (stat(path, &st) != 0) {
        weights_priv_err(err, errlen, path, NULL, "cannot open: %s", errno_str(errno, eb, sizeof eb));
        goto fail;
    }
    ws = weights_new_empty();
    if (!ws || !(ws->source = strdup(path))) {
        weights_priv_err(err, errlen, path, NULL, "out of memory");
        goto fail;
    }

    if (S_ISDIR(st.st_mode)) {
        index = join_path(path, INDEX_NAME);
        single = join_path(path, SINGLE_NAME);
        if (!index || !single) {
            weights_priv_err(err, errlen, path, NULL, "out of memory");
            goto fail;
        }
        struct stat s2;
        if (stat(index, &s2) == 0) {
            if (load_index(ws, index, path, err, errlen) != 0) goto fail;
        } else if (stat(single, &s2) == 0) {
            if (load_file(ws, single, "cannot open", 0, err, errlen) != 0) goto fail;
        } else {
            weights_priv_err(err, errlen, path, NULL, "neither " INDEX_NAME " nor " SINGLE_NAME " found in the folder");
            goto fail;
        }
    } else if (ends_with(path, ".safetensors.index.json")) {
        /* Convenience: the index itself names a sharded checkpoint. */
        dir = strdup(path);
        if (!dir) {
            weights_priv_err(err, errlen, path, NULL, "out of memory");
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
