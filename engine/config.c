/*
 * engine/: eng_config's fields, listed once (ENG_CONFIG_FIELDS). From the
 * list come the bytes that carry a config from rank 0 to the processes of
 * rank > 0 under mpirun (eng_priv_cfg_bcast) and the prefix cache's config
 * key (eng_priv_config_key). A field of eng_config missing from the list
 * would run with its zero default on every rank but 0:
 * tests/mpi/test_engine_cfg.c sets every field and checks each rank sees it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/proc.h"
#include "engine/internal.h"

/* X(field, key): every field of eng_config (engine.h), in its order. key 1:
 * folded into the prefix cache's config key (what the cached KV depends on
 * besides the tokens). Strings are told apart by their type (const char *). */
#define ENG_CONFIG_FIELDS(X)                                                                                       \
    X(model_dir, 1)                                                                                                \
    X(device, 0)                                                                                                   \
    X(tp, 1)                                                                                                       \
    X(allreduce, 1)                                                                                                \
    X(allreduce_auto, 1)                                                                                           \
    X(echo_min_bytes, 1)                                                                                           \
    X(echo_group, 1)                                                                                               \
    X(threads, 0)                                                                                                  \
    X(kv_block_size, 1)                                                                                            \
    X(max_model_len, 0)                                                                                            \
    X(max_num_seqs, 0)                                                                                             \
    X(max_batch_tokens, 0)                                                                                         \
    X(kv_blocks, 0)                                                                                                \
    X(kv_dtype, 1)                                                                                                 \
    X(kv_cache_memory, 1)                                                                                          \
    X(kv_mem_available, 0)                                                                                         \
    X(gpu_memory_utilization, 0)                                                                                   \
    X(kv_gpu, 0)                                                                                                   \
    X(transport, 0)                                                                                                \
    X(cuda_graphs, 0)                                                                                              \
    X(fuse_weights, 0)                                                                                             \
    X(quantize, 1)                                                                                                 \
    X(act_quant, 1)                                                                                                \
    X(echo_codec, 1)                                                                                               \
    X(no_prefix_cache, 0)                                                                                          \
    X(pass_tokens, 0)                                                                                              \
    X(overlap, 0)                                                                                                  \
    X(overlap_min_rows, 0)                                                                                         \
    X(oneshot, 0)                                                                                                  \
    X(rope_scaling, 0)

typedef struct cfg_field {
    const char *name;
    size_t off, size;
    int str; /* a const char * (NULL or a string); else the field's bytes travel as they are */
    int key;
} cfg_field;

#define CFG_IS_STR(f) _Generic(((eng_config *)0)->f, const char *: 1, default: 0)
#define CFG_ROW(f, k) {#f, offsetof(eng_config, f), sizeof(((eng_config *)0)->f), CFG_IS_STR(f), k},
static const cfg_field cfg_fields[] = {ENG_CONFIG_FIELDS(CFG_ROW)};
#define CFG_NFIELDS (sizeof cfg_fields / sizeof *cfg_fields)

/* A string's length word when the pointer is NULL (NULL means "default",
 * "" may mean something else: both travel as they are). */
#define CFG_NULL_STR UINT32_MAX
/* The most bytes a config may take on the wire: paths and names, not data. */
#define CFG_MAX_BYTES (1u << 20)

static const char *cfg_str(const eng_config *c, const cfg_field *f) {
    const char *s;
    memcpy(&s, (const char *)c + f->off, sizeof s);
    return s;
}

/* The wire form: per field in list order, a number's bytes as they are
 * (every process runs the same binary), a string as a uint32 length
 * (CFG_NULL_STR for NULL) and its bytes with the NUL. */
static int cfg_encode(const eng_config *c, char **out, size_t *n, char *err, size_t errlen) {
    size_t len = 0;
    for (size_t i = 0; i < CFG_NFIELDS; i++) {
        const cfg_field *f = &cfg_fields[i];
        const char *s = f->str ? cfg_str(c, f) : NULL;
        len += f->str ? 4 + (s ? strlen(s) + 1 : 0) : f->size;
    }
    if (len > CFG_MAX_BYTES) {
        snprintf(err, errlen, "the engine's config takes %zu bytes to send to the other processes (at most %u): "
                              "a path or name is too long", len, CFG_MAX_BYTES);
        return -1;
    }
    char *b = malloc(len), *p = b;
    if (!b) {
        snprintf(err, errlen, "out of memory for the engine's config message");
        return -1;
    }
    for (size_t i = 0; i < CFG_NFIELDS; i++) {
        const cfg_field *f = &cfg_fields[i];
        if (!f->str) {
            memcpy(p, (const char *)c + f->off, f->size);
            p += f->size;
            continue;
        }
        const char *s = cfg_str(c, f);
        uint32_t l = s ? (uint32_t)strlen(s) : CFG_NULL_STR;
        memcpy(p, &l, 4);
        p += 4;
        if (s) {
            memcpy(p, s, (size_t)l + 1);
            p += l + 1;
        }
    }
    *out = b;
    *n = len;
    return 0;
}

/* Into c (every field), its strings pointing into buf. */
static int cfg_decode(const char *buf, size_t n, eng_config *c, char *err, size_t errlen) {
    const char *p = buf, *end = buf + n;
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < CFG_NFIELDS; i++) {
        const cfg_field *f = &cfg_fields[i];
        size_t need = f->str ? 4 : f->size;
        if ((size_t)(end - p) < need) goto bad;
        if (!f->str) {
            memcpy((char *)c + f->off, p, f->size);
            p += f->size;
            continue;
        }
        uint32_t l;
        memcpy(&l, p, 4);
        p += 4;
        const char *s = NULL;
        if (l != CFG_NULL_STR) {
            if ((size_t)(end - p) <= l || p[l] != 0) goto bad;
            s = p;
            p += (size_t)l + 1;
        }
        memcpy((char *)c + f->off, &s, sizeof s);
    }
    if (p == end) return 0;
bad:
    snprintf(err, errlen, "rank %d: the engine's config from rank 0 does not parse (%zu bytes): another build?",
             echo_proc_rank(), n);
    return -1;
}

int eng_priv_cfg_bcast(eng_config *c, char **keep, char *err, size_t errlen) {
    char *buf = NULL;
    uint64_t n = 0;
    if (echo_proc_rank() == 0) {
        size_t len = 0;
        int rc = cfg_encode(c, &buf, &len, err, errlen);
        n = rc ? 0 : len; /* 0: no engine this time, the others go on waiting */
        char berr[256];
        if (echo_proc_bcast(&n, sizeof n, rc ? berr : err, rc ? sizeof berr : errlen) || rc ||
            echo_proc_bcast(buf, len, err, errlen))
            rc = -1;
        free(buf);
        return rc;
    }
    if (echo_proc_bcast(&n, sizeof n, err, errlen)) return -1;
    if (!n) return 1;
    /* rank 0 waits in the next bcast, and then for this rank's engine: a
     * rank that cannot follow ends the job */
    if (n > CFG_MAX_BYTES || !(buf = malloc((size_t)n))) {
        snprintf(err, errlen, "rank %d: cannot take rank 0's engine config of %llu bytes", echo_proc_rank(),
                 (unsigned long long)n);
        echo_proc_abort(1, err);
        return -1;
    }
    if (echo_proc_bcast(buf, (size_t)n, err, errlen)) {
        free(buf);
        return -1;
    }
    if (cfg_decode(buf, (size_t)n, c, err, errlen)) {
        echo_proc_abort(1, err);
        free(buf);
        return -1;
    }
    *keep = buf;
    return 0;
}

uint64_t eng_priv_config_key(const eng_config *c) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < CFG_NFIELDS; i++) {
        const cfg_field *f = &cfg_fields[i];
        if (!f->key) continue;
        const unsigned char *p = (const unsigned char *)c + f->off;
        size_t n = f->size;
        if (f->str) {
            const char *s = cfg_str(c, f);
            p = (const unsigned char *)(s ? s : "");
            n = strlen((const char *)p);
        }
        for (size_t j = 0; j < n; j++) h = (h ^ p[j]) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull; /* a field's end: "ab","c" is not "a","bc" */
    }
    return h;
}
