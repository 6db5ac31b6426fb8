/*
 * Loading: tokenizer.json into the flat tables of struct tok_tokenizer
 * (vocab, merges, added tokens, decode surfaces), tokenizer_config.json,
 * SentencePiece models, folder auto-detection, and tok_free.
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    free(t->id_off);
    free(t->id_len);
    free(t->id_flags);
    free(t->surf_off);
    free(t->surf_len);
    free(t->blob);
    free(t->vocab_slots);
    free(t->merges);
    for (size_t i = 0; i < t->n_added; i++) {
        if (t->added[i].m != t->added[i].s) free(t->added[i].m);
        free(t->added[i].s);
    }
    free(t->added);
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
    for (int i = 0; i < t->n_norm; i++) {
        pcre2_code_free(t->norm[i].re);
        free(t->norm[i].content);
    }
    free(t->post_pre);
    free(t->post_suf);
    if (t->spm) tok_spm_free(t->spm);
    if (t->cache) {
        for (int i = 0; i < CACHE_STRIPES; i++) {
            pthread_mutex_destroy(&t->cache[i].mu);
            free(t->cache[i].ents);
        }
        free(t->cache);
    }
    free(t);
}

static int blob_add(tok_tokenizer *t, const char *s, size_t n, uint32_t *off) {
    if (t->blob_len + n > t->blob_cap) {
        size_t cap = t->blob_cap ? t->blob_cap : 1 << 20;
        while (cap < t->blob_len + n) cap *= 2;
        char *p = realloc(t->blob, cap);
        if (!p) return TOK_ENOMEM;
        t->blob = p;
        t->blob_cap = cap;
    }
    if (t->blob_len + n > UINT32_MAX) return TOK_ENOMEM;
    memcpy(t->blob + t->blob_len, s, n);
    *off = (uint32_t)t->blob_len;
    t->blob_len += n;
    return TOK_OK;
}

static int ids_alloc(tok_tokenizer *t, size_t n_ids) {
    t->n_ids = n_ids;
    t->id_off = calloc(n_ids ? n_ids : 1, sizeof *t->id_off);
    t->id_len = malloc((n_ids ? n_ids : 1) * sizeof *t->id_len);
    t->id_flags = calloc(n_ids ? n_ids : 1, 1);
    if (!t->id_off || !t->id_len || !t->id_flags) return TOK_ENOMEM;
    for (size_t i = 0; i < n_ids; i++) t->id_len[i] = NO_TOKEN;
    return TOK_OK;
}

static int cache_init(tok_tokenizer *t) {
    t->cache = calloc(CACHE_STRIPES, sizeof *t->cache);
    if (!t->cache) return TOK_ENOMEM;
    for (int i = 0; i < CACHE_STRIPES; i++) {
        t->cache[i].ents = calloc(CACHE_WAYS, sizeof(cache_ent));
        if (!t->cache[i].ents) return TOK_ENOMEM;
        pthread_mutex_init(&t->cache[i].mu, NULL);
    }
    return TOK_OK;
}

/* Grow the malloc'ed *buf to at least need bytes. */
static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return TOK_OK;
    char *p = realloc(*buf, need);
    if (!p) return TOK_ENOMEM;
    *buf = p;
    *cap = need;
    return TOK_OK;
}

static int parse_merge(json_t *m, const char **a, size_t *alen, const char **b, size_t *blen) {
    if (json_is_array(m) && json_array_size(m) == 2) {
        json_t *x = json_array_get(m, 0), *y = json_array_get(m, 1);
        if (!json_is_string(x) || !json_is_string(y)) return -1;
        *a = json_string_value(x);
        *alen = json_string_length(x);
        *b = json_string_value(y);
        *blen = json_string_length(y);
        return 0;
    }
    if (json_is_string(m)) {
        /* Legacy "left right" form: the first space separates. */
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp || sp == s) return -1;
        *a = s;
        *alen = (size_t)(sp - s);
        *b = sp + 1;
        *blen = n - *alen - 1;
        return 0;
    }
    return -1;
}

/* The key decoding tables and a growable scratch the loading steps share. */
typedef struct {
    int16_t u2b[0x144];
    char *tmp;
    size_t cap;
} load_ctx;

static int load_oom(char *err, size_t errlen) {
    return tok_err(err, errlen, TOK_ENOMEM, "out of memory loading tokenizer");
}

/* The model object's type and the BPE options we support (or refuse). */
static int check_model(tok_tokenizer *t, json_t *model, char *err, size_t errlen) {
    const char *mtype = tok_jstr(model, "type");
    if (mtype && strcmp(mtype, "BPE") != 0)
        return tok_err(err, errlen, TOK_EFORMAT,
                       "unsupported model type '%s' (only BPE; use tokenizer.model for "
                       "SentencePiece)",
                       mtype);
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab))
        return tok_err(err, errlen, TOK_EFORMAT, "BPE model: missing \"vocab\" object");
    if (!json_is_array(merges))
        return tok_err(err, errlen, TOK_EFORMAT, "BPE model: missing \"merges\" array");
    if (!mtype && !json_is_array(merges))
        return tok_err(err, errlen, TOK_EFORMAT, "model: missing \"type\"");
    json_t *v = json_object_get(model, "dropout");
    if (v && !json_is_null(v) && json_number_value(v) > 0)
        return tok_err(err, errlen, TOK_EFORMAT, "BPE dropout is not supported");
    const char *cs = tok_jstr(model, "continuing_subword_prefix"), *ew = tok_jstr(model, "end_of_word_suffix");
    if ((cs && *cs) || (ew && *ew))
        return tok_err(err, errlen, TOK_EFORMAT,
                       "BPE continuing_subword_prefix/end_of_word_suffix are not supported");
    t->ignore_merges = tok_jbool(model, "ignore_merges", 0);

    t->byte_fallback = tok_jbool(model, "byte_fallback", 0);
    t->fuse_unk = tok_jbool(model, "fuse_unk", 0);
    return TOK_OK;
}

/* Normalizer, pre-tokenizer, decoder and post-processor. */
static int load_pipeline(tok_tokenizer *t, json_t *root, dec_info *di, char *err, size_t errlen) {
    int rc, mode = 0;
    if ((rc = tok_parse_normalizer(t, json_object_get(root, "normalizer"), err, errlen))) return rc;
    if ((rc = tok_parse_pretok(t, json_object_get(root, "pre_tokenizer"), &mode, err, errlen)))
        return rc;
    t->char_level = mode != 1;
    if ((rc = tok_parse_decoder(t, json_object_get(root, "decoder"), di, err, errlen))) return rc;
    return tok_parse_post(t, json_object_get(root, "post_processor"), err, errlen);
}

/* The id space: every vocab and added-token id checked, then allocated. */
static int size_ids(tok_tokenizer *t, json_t *vocab, json_t *added, char *err, size_t errlen) {
    size_t max_id = 0, nv = 0;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX - 1)
            return tok_err(err, errlen, TOK_EFORMAT, "vocab: bad id for token '%.40s'", key);
        if ((size_t)json_integer_value(v) > max_id) max_id = (size_t)json_integer_value(v);
        nv++;
    }
    if (added && !json_is_array(added) && !json_is_null(added))
        return tok_err(err, errlen, TOK_EFORMAT, "added_tokens is not an array");
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) > INT32_MAX - 1 || !tok_jstr(v, "content"))
            return tok_err(err, errlen, TOK_EFORMAT, "added_tokens[%zu]: needs id and content", i);
        if ((size_t)json_integer_value(id) > max_id) max_id = (size_t)json_integer_value(id);
    }
    if (nv == 0) return tok_err(err, errlen, TOK_EFORMAT, "BPE model: empty vocab");
    if ((size_t)max_id >= 16u * 1024 * 1024)
        return tok_err(err, errlen, TOK_EFORMAT, "vocab: id %zu too large", max_id);
    if (ids_alloc(t, max_id + 1)) return load_oom(err, errlen);
    /* The bytes -> id hash, sized for the vocab. */
    t->vocab_mask = pow2_at_least(nv * 2) - 1;
    t->vocab_slots = malloc((t->vocab_mask + 1) * sizeof *t->vocab_slots);
    if (!t->vocab_slots) return load_oom(err, errlen);
    memset(t->vocab_slots, 0xff, (t->vocab_mask + 1) * sizeof *t->vocab_slots);
    return TOK_OK;
}

/* Vocab: raw bytes per id and the bytes -> id hash; the byte and unk ids. */
static int load_vocab(tok_tokenizer *t, json_t *model, load_ctx *c, char *err, size_t errlen) {
    json_t *vocab = json_object_get(model, "vocab"), *v;
    const char *key;
    json_object_foreach(vocab, key, v) {
        size_t klen = strlen(key);
        if (tok_utf8_valid_prefix(key, klen) != klen)
            return tok_err(err, errlen, TOK_EFORMAT, "vocab: token is not valid UTF-8");
        if (grow(&c->tmp, &c->cap, klen)) return load_oom(err, errlen);
        size_t n = tok_key_decode(t, key, klen, c->u2b, c->tmp);
        int32_t id = (int32_t)json_integer_value(v);
        if (t->id_len[id] != NO_TOKEN) return tok_err(err, errlen, TOK_EFORMAT, "vocab: id %d used twice", (int)id);
        if (blob_add(t, c->tmp, n, &t->id_off[id])) return load_oom(err, errlen);
        t->id_len[id] = (uint32_t)n;
        size_t h = tok_hash_bytes(c->tmp, n) & t->vocab_mask;
        while (t->vocab_slots[h] >= 0) {
            int32_t o = t->vocab_slots[h];
            if (t->id_len[o] == n && !memcmp(t->blob + t->id_off[o], c->tmp, n)) break;
            h = (h + 1) & t->vocab_mask;
        }
        if (t->vocab_slots[h] < 0) t->vocab_slots[h] = id;
    }
    for (int b = 0; b < 256; b++) {
        char ch = (char)b;
        t->byte_id[b] = tok_vocab_find(t, &ch, 1);
    }
    t->unk_id = -1;
    const char *unk = tok_jstr(model, "unk_token");
    if (unk) {
        json_t *u = json_object_get(vocab, unk);
        if (json_is_integer(u)) t->unk_id = (int32_t)json_integer_value(u);
    }
    return TOK_OK;
}

/* Merges: pairs of vocab strings to (id, id) -> (rank, new id). */
static int load_merges(tok_tokenizer *t, json_t *merges, load_ctx *c, char *err, size_t errlen) {
    size_t nm = json_array_size(merges), i;
    t->merge_mask = pow2_at_least(nm * 2 + 2) - 1;
    t->merges = calloc(t->merge_mask + 1, sizeof *t->merges);
    if (!t->merges) return load_oom(err, errlen);
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t al, bl;
        if (parse_merge(m, &a, &al, &b, &bl))
            return tok_err(err, errlen, TOK_EFORMAT, "merges[%zu]: expected [\"a\",\"b\"] or \"a b\"", i);
        if (grow(&c->tmp, &c->cap, al + bl)) return load_oom(err, errlen);
        /* Strings -> ids through the vocab (HF does the same lookups). */
        size_t n1 = tok_key_decode(t, a, al, c->u2b, c->tmp);
        int32_t ia = tok_vocab_find(t, c->tmp, n1);
        size_t n2 = tok_key_decode(t, b, bl, c->u2b, c->tmp + n1);
        int32_t ib = tok_vocab_find(t, c->tmp + n1, n2);
        int32_t in = tok_vocab_find(t, c->tmp, n1 + n2);
        if (ia < 0 || ib < 0 || in < 0)
            return tok_err(err, errlen, TOK_EFORMAT, "merges[%zu]: token not in vocab", i);
        uint64_t k = ((uint64_t)(uint32_t)(ia + 1) << 32) | (uint32_t)ib;
        size_t h = tok_mix64(k) & t->merge_mask;
        while (t->merges[h].key && t->merges[h].key != k) h = (h + 1) & t->merge_mask;
        /* A duplicate pair keeps its last rank, as HF's HashMap collect. */
        t->merges[h].key = k;
        t->merges[h].rank = (uint32_t)i;
        t->merges[h].new_id = in;
    }
    return TOK_OK;
}

/* Added tokens: they override the model vocab for decode. */
static int load_added(tok_tokenizer *t, json_t *added, load_ctx *c, char *err, size_t errlen) {
    size_t na = json_array_size(added), i;
    if (na) {
        t->added = calloc(na, sizeof *t->added);
        if (!t->added) return load_oom(err, errlen);
    }
    json_t *v;
    json_array_foreach(added, i, v) {
        added_tok *a = &t->added[t->n_added];
        const char *content = tok_jstr(v, "content");
        size_t clen = json_string_length(json_object_get(v, "content"));
        if (clen == 0 || tok_utf8_valid_prefix(content, clen) != clen)
            return tok_err(err, errlen, TOK_EFORMAT, "added_tokens[%zu]: empty or invalid content", i);
        a->s = malloc(clen);
        if (!a->s) return load_oom(err, errlen);
        memcpy(a->s, content, clen);
        a->len = clen;
        a->m = a->s;
        a->mlen = clen;
        a->id = (int32_t)json_integer_value(json_object_get(v, "id"));
        a->special = tok_jbool(v, "special", 0);
        /* HF: normalized defaults to !special. */
        a->normalized = tok_jbool(v, "normalized", !a->special);
        a->lstrip = tok_jbool(v, "lstrip", 0);
        a->rstrip = tok_jbool(v, "rstrip", 0);
        a->single_word = tok_jbool(v, "single_word", 0);
        t->n_added++;
        if (grow(&c->tmp, &c->cap, clen)) return load_oom(err, errlen);
        size_t n = tok_key_decode(t, content, clen, c->u2b, c->tmp);
        if (blob_add(t, c->tmp, n, &t->id_off[a->id])) return load_oom(err, errlen);
        t->id_len[a->id] = (uint32_t)n;
        t->id_flags[a->id] = FLAG_ADDED | (a->special ? FLAG_SPECIAL : 0);
        if (a->normalized) t->has_normalized_added = 1;
    }
    if (tok_normalize_added(t)) return load_oom(err, errlen);
    /* HF then also decodes such a token as its normalized content. */
    for (i = 0; i < t->n_added; i++) {
        added_tok *a = &t->added[i];
        if (a->m == a->s) continue;
        if (grow(&c->tmp, &c->cap, a->mlen)) return load_oom(err, errlen);
        size_t n = tok_key_decode(t, a->m, a->mlen, c->u2b, c->tmp);
        if (blob_add(t, c->tmp, n, &t->id_off[a->id])) return load_oom(err, errlen);
        t->id_len[a->id] = (uint32_t)n;
    }
    for (i = 0; i < t->n_added; i++)
        if (t->added[i].mlen) t->added_first[(unsigned char)t->added[i].m[0]] |= t->added[i].normalized ? 2 : 1;
    return TOK_OK;
}

/* Character-level BPE: the <0xXX> fallback ids, and the decode surfaces
 * (they differ from the vocab strings: keep both). */
static int load_surfaces(tok_tokenizer *t, const dec_info *di) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->fallback_id[b] = tok_vocab_find(t, name, 6);
    }
    t->surf_off = malloc(t->n_ids * sizeof *t->surf_off);
    t->surf_len = malloc(t->n_ids * sizeof *t->surf_len);
    if (!t->surf_off || !t->surf_len) return TOK_ENOMEM;
    tok_buf sb = {0};
    for (size_t id = 0; id < t->n_ids; id++) {
        t->surf_len[id] = NO_TOKEN;
        if (t->id_len[id] == NO_TOKEN) continue;
        /* The blob may move in blob_add: copy the key out first. */
        if (tok_buf_reserve(&sb, 0) || tok_decoder_surface(di, t->blob + t->id_off[id], t->id_len[id], &sb) ||
            blob_add(t, sb.p, sb.len, &t->surf_off[id])) {
            free(sb.p);
            return TOK_ENOMEM;
        }
        t->surf_len[id] = (uint32_t)sb.len;
    }
    free(sb.p);
    return TOK_OK;
}

static int load_root(tok_tokenizer *t, json_t *root, char *err, size_t errlen) {
    if (!json_is_object(root))
        return tok_err(err, errlen, TOK_EFORMAT, "tokenizer.json: top level is not an object");
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return tok_err(err, errlen, TOK_EFORMAT, "tokenizer.json: missing \"model\" object");
    int rc;
    if ((rc = check_model(t, model, err, errlen))) return rc;
    /* Pipeline parts first: they are small and make most errors cheap. */
    dec_info di;
    if ((rc = load_pipeline(t, root, &di, err, errlen))) return rc;
    json_t *added = json_object_get(root, "added_tokens");
    if ((rc = size_ids(t, json_object_get(model, "vocab"), added, err, errlen))) return rc;

    load_ctx c = {.tmp = malloc(4096), .cap = 4096};
    uint32_t b2u[256];
    tok_byte_level_tables(b2u, c.u2b);
    if (!c.tmp) return load_oom(err, errlen);
    if (!(rc = load_vocab(t, model, &c, err, errlen)) &&
        !(rc = load_merges(t, json_object_get(model, "merges"), &c, err, errlen)) &&
        !(rc = load_added(t, added, &c, err, errlen)) && t->char_level && load_surfaces(t, &di))
        rc = load_oom(err, errlen);
    free(c.tmp);
    if (rc) return rc;
    t->eos_id = -1;
    if (cache_init(t)) return load_oom(err, errlen);
    return TOK_OK;
}

static int new_tok(tok_tokenizer **out, char *err, size_t errlen) {
    *out = calloc(1, sizeof **out);
    if (!*out) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    (*out)->eos_id = -1;
    (*out)->unk_id = -1;
    return TOK_OK;
}

int tok_load_json_root(json_t *root, tok_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    tok_tokenizer *t = NULL;
    int rc = new_tok(&t, err, errlen);
    if (rc == TOK_OK) {
        t->kind = KIND_BPE;
        rc = load_root(t, root, err, errlen);
    }
    if (rc) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return TOK_OK;
}

int tok_load_json_mem(const char *json, size_t len, tok_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    if (!root)
        return tok_err(err, errlen, TOK_EFORMAT, "tokenizer.json: bad JSON at line %d column %d: %s",
                       je.line, je.column, je.text);
    int rc = tok_load_json_root(root, out, err, errlen);
    json_decref(root);
    return rc;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && st.st_size >= 0) {
        buf = malloc((size_t)st.st_size + 1);
        if (buf && fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
            free(buf);
            buf = NULL;
        }
        if (buf) {
            buf[st.st_size] = 0;
            *len = (size_t)st.st_size;
        }
    }
    fclose(f);
    return buf;
}

/* tokenizer_config.json: only eos_token matters to us (string or
 * {"content": ...}). A broken config is an error, a missing one is not. */
static int apply_config(tok_tokenizer *t, const char *path, char *err, size_t errlen) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return tok_err(err, errlen, TOK_EFORMAT, "%s: bad JSON at line %d: %s", path, je.line, je.text);
    json_t *e = json_object_get(root, "eos_token");
    const char *name = json_is_string(e) ? json_string_value(e) : tok_jstr(e, "content");
    if (name) t->eos_id = tok_token_id(t, name);
    json_decref(root);
    return TOK_OK;
}

int tok_load_json_file(const char *path, const char *config_path, tok_tokenizer **out, char *err,
                       size_t errlen) {
    *out = NULL;
    size_t len = 0;
    char *buf = read_file(path, &len);
    if (!buf) return tok_err(err, errlen, TOK_EIO, "%s: %s", path, strerror(errno ? errno : EIO));
    char sub[256] = "";
    int rc = tok_load_json_mem(buf, len, out, sub, sizeof sub);
    free(buf);
    if (rc) return tok_err(err, errlen, rc, "%s: %s", path, sub);
    if (config_path && (rc = apply_config(*out, config_path, err, errlen))) {
        tok_free(*out);
        *out = NULL;
    }
    return rc;
}

int tok_load_sentencepiece(const char *path, tok_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    tok_tokenizer *t = NULL;
    int rc = new_tok(&t, err, errlen);
    if (rc) return rc;
    t->kind = KIND_SPM;
    if ((rc = tok_spm_load(path, &t->spm, err, errlen))) goto fail;
    /* Surface bytes per piece, for streaming decode: "▁" is a space, byte
     * pieces are their byte, control pieces are empty, unknown is " ⁇ ". */
    size_t n = tok_spm_vocab_size(t->spm);
    if ((rc = ids_alloc(t, n))) goto oom;
    for (size_t id = 0; id < n; id++) {
        char *piece = tok_spm_id_to_piece(t->spm, (int32_t)id);
        if (!piece) goto oom;
        int kind = tok_spm_piece_kind(t->spm, (int32_t)id);
        tok_buf b = {0};
        int brc = TOK_OK;
        if (kind == TOK_SPM_BYTE) {
            char c = (char)strtol(piece + 3, NULL, 16);
            brc = tok_buf_append(&b, &c, 1);
        } else if (kind == TOK_SPM_UNKNOWN) {
            brc = tok_buf_append(&b, " \xE2\x81\x87 ", 5);
        } else if (kind != TOK_SPM_CONTROL && kind != TOK_SPM_UNUSED) {
            for (const char *p = piece; *p && brc == TOK_OK;) {
                if (!strncmp(p, "\xE2\x96\x81", 3)) {
                    brc = tok_buf_append(&b, " ", 1);
                    p += 3;
                } else {
                    brc = tok_buf_append(&b, p++, 1);
                }
            }
        }
        free(piece);
        if (brc || blob_add(t, b.p ? b.p : "", b.len, &t->id_off[id])) {
            free(b.p);
            goto oom;
        }
        free(b.p);
        t->id_len[id] = (uint32_t)b.len;
        if (kind == TOK_SPM_CONTROL) t->id_flags[id] = FLAG_SPECIAL;
    }
    t->eos_id = tok_spm_eos_id(t->spm);
    *out = t;
    return TOK_OK;
oom:
    rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
fail:
    tok_free(t);
    return rc;
}

int tok_load_dir(const char *dir, tok_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    size_t dl = strlen(dir);
    char *json = malloc(dl + 32), *cfg = malloc(dl + 32), *spm = malloc(dl + 32);
    int rc;
    if (!json || !cfg || !spm) {
        rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        goto done;
    }
    sprintf(json, "%s/tokenizer.json", dir);
    sprintf(cfg, "%s/tokenizer_config.json", dir);
    sprintf(spm, "%s/tokenizer.model", dir);
    struct stat st;
    if (stat(json, &st) == 0) {
        rc = tok_load_json_file(json, stat(cfg, &st) == 0 ? cfg : NULL, out, err, errlen);
    } else if (stat(spm, &st) == 0) {
        rc = tok_load_sentencepiece(spm, out, err, errlen);
    } else {
        rc = tok_err(err, errlen, TOK_EIO, "%s: no tokenizer.json or tokenizer.model", dir);
    }
done:
    free(json);
    free(cfg);
    free(spm);
    return rc;
}
