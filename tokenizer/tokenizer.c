/*
 * Hugging Face tokenizer.json (byte-level BPE) loading, encode and decode,
 * plus the dispatch to the SentencePiece wrapper.
 *
 * Everything is resolved at load time into flat tables so that encode only
 * does hash lookups: token strings are stored as raw bytes (the ByteLevel
 * alphabet undone), merges as a (left id, right id) -> (rank, new id) hash.
 */
#include "tokenizer/tokenizer.h"

#include "tokenizer/internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#define NO_TOKEN UINT32_MAX

enum { KIND_BPE = 1, KIND_SPM = 2 };
enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { FLAG_SPECIAL = 1, FLAG_ADDED = 2 };

typedef struct {
    char *s;
    size_t len;
    int32_t id;
    int special, normalized, lstrip, rstrip, single_word;
} added_tok;

typedef struct {
    pcre2_code *re;
    int jit;
    int behavior, invert;
} pre_step;

typedef struct {
    uint64_t key; /* (left+1) << 32 | right; 0 = empty slot */
    uint32_t rank;
    int32_t new_id;
} merge_slot;

/* Thread-safe pre-token cache: lock striping keeps concurrent encoders from
 * serialising on one mutex. Entries are short words only. */
#define CACHE_STRIPES 64
#define CACHE_WAYS 1024 /* entries per stripe (direct-mapped) */
#define CACHE_MAX_WORD 24
#define CACHE_MAX_IDS 12
typedef struct {
    uint64_t hash;
    uint8_t wlen, nids;
    char word[CACHE_MAX_WORD];
    int32_t ids[CACHE_MAX_IDS];
} cache_ent;
typedef struct {
    pthread_mutex_t mu;
    cache_ent *ents;
} cache_stripe;

struct tok_tokenizer {
    int kind;
    /* id -> surface bytes (decode); len NO_TOKEN when the id is unused */
    size_t n_ids;
    uint32_t *id_off, *id_len;
    uint8_t *id_flags;
    char *blob;
    size_t blob_len, blob_cap;
    /* model vocab: raw bytes -> id (open addressing, -1 empty) */
    int32_t *vocab_slots;
    size_t vocab_mask;
    int32_t byte_id[256]; /* single-byte tokens, -1 when absent */
    int32_t unk_id;
    merge_slot *merges;
    size_t merge_mask;
    int ignore_merges;
    added_tok *added;
    size_t n_added;
    int has_normalized_added;
    uint8_t added_first[256]; /* bit0: raw-matched token starts with byte, bit1: normalized */
    int norm[4]; /* utf8proc option sets, applied in order */
    int n_norm;
    pre_step pre[4];
    int n_pre;
    int prefix_space;
    int32_t *post_pre, *post_suf; /* ids added around the text by add_special */
    size_t n_post_pre, n_post_suf;
    int32_t eos_id;
    tok_spm *spm;
    cache_stripe *cache;
};

/* ---------- byte-level alphabet ---------- */

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others
 * to U+0100.. in byte order. Inverse table for code points < 0x144. */
static void byte_level_tables(uint32_t b2u[256], int16_t u2b[0x144]) {
    int n = 0;
    for (int i = 0; i < 0x144; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        b2u[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        u2b[b2u[b]] = (int16_t)b;
    }
}

/* Decode a UTF-8 code point (input already validated). */
static uint32_t utf8_next(const unsigned char *s, size_t *i) {
    unsigned c = s[*i];
    if (c < 0x80) {
        (*i)++;
        return c;
    }
    int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    uint32_t cp = c & (0x3F >> n);
    for (int k = 1; k <= n; k++) cp = (cp << 6) | (s[*i + k] & 0x3F);
    *i += (size_t)n + 1;
    return cp;
}

/* Token text -> bytes under the ByteLevel decoder's rule: if every char is
 * in the alphabet, the mapped bytes, otherwise the text's own UTF-8. */
static size_t byte_level_decode(const char *s, size_t len, const int16_t u2b[0x144],
                                char *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, n = 0;
    while (i < len) {
        uint32_t cp = utf8_next(u, &i);
        if (cp >= 0x144 || u2b[cp] < 0) {
            memcpy(out, s, len);
            return len;
        }
        out[n++] = (char)u2b[cp];
    }
    return n;
}

/* ---------- hashing ---------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ (n * 0x9E3779B97F4A7C15ull);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static int32_t vocab_find(const tok_tokenizer *t, const char *s, size_t n) {
    size_t i = hash_bytes(s, n) & t->vocab_mask;
    for (;;) {
        int32_t id = t->vocab_slots[i];
        if (id < 0) return -1;
        if (t->id_len[id] == n && memcmp(t->blob + t->id_off[id], s, n) == 0) return id;
        i = (i + 1) & t->vocab_mask;
    }
}

static const merge_slot *merge_find(const tok_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)b;
    size_t i = mix64(key) & t->merge_mask;
    for (;;) {
        const merge_slot *m = &t->merges[i];
        if (m->key == key) return m;
        if (m->key == 0) return NULL;
        i = (i + 1) & t->merge_mask;
    }
}

/* ---------- lifecycle ---------- */

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    free(t->id_off);
    free(t->id_len);
    free(t->id_flags);
    free(t->blob);
    free(t->vocab_slots);
    free(t->merges);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].s);
    free(t->added);
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
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

/* ---------- tokenizer.json parsing ---------- */

static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int jbool(json_t *o, const char *key, int dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int parse_normalizer(tok_tokenizer *t, json_t *n, char *err, size_t errlen) {
    if (!n || json_is_null(n)) return TOK_OK;
    const char *type = jstr(n, "type");
    if (!type) return tok_err(err, errlen, TOK_EFORMAT, "normalizer: missing \"type\"");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers");
        if (!json_is_array(arr))
            return tok_err(err, errlen, TOK_EFORMAT, "normalizer Sequence: missing array");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            int rc = parse_normalizer(t, v, err, errlen);
            if (rc) return rc;
        }
        return TOK_OK;
    }
    int opt;
    if (!strcmp(type, "NFC")) opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (!strcmp(type, "NFD")) opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (!strcmp(type, "NFKC")) opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(type, "NFKD")) opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else return tok_err(err, errlen, TOK_EFORMAT, "unsupported normalizer type '%s'", type);
    if (t->n_norm == 4) return tok_err(err, errlen, TOK_EFORMAT, "too many normalizers");
    t->norm[t->n_norm++] = opt;
    return TOK_OK;
}

static int add_regex_step(tok_tokenizer *t, const char *pat, size_t patlen, int literal,
                          int behavior, int invert, char *err, size_t errlen) {
    if (t->n_pre == 4) return tok_err(err, errlen, TOK_EFORMAT, "too many pre-tokenizers");
    int ec;
    PCRE2_SIZE eo;
    uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, patlen, flags, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return tok_err(err, errlen, TOK_EFORMAT, "pre-tokenizer regex: %s at offset %zu",
                       (const char *)msg, (size_t)eo);
    }
    pre_step *s = &t->pre[t->n_pre++];
    s->re = re;
    s->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    s->behavior = behavior;
    s->invert = invert;
    return TOK_OK;
}

/* Oniguruma (what HF uses) and PCRE2 disagree on \s: PCRE2 adds U+180E,
 * which Unicode no longer counts as White_Space. Spell \s out as the
 * White_Space property set so both engines see the same class. */
static char *translate_regex(const char *pat, size_t *outlen) {
    static const char ws[] = "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
                             "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
    size_t n = strlen(pat);
    char *out = malloc(n * (sizeof ws + 2) + 1);
    if (!out) return NULL;
    size_t o = 0;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            if (pat[i + 1] == 's') {
                if (!in_class) out[o++] = '[';
                memcpy(out + o, ws, sizeof ws - 1);
                o += sizeof ws - 1;
                if (!in_class) out[o++] = ']';
            } else {
                out[o++] = c;
                out[o++] = pat[i + 1];
            }
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            out[o++] = c;
            /* A ']' right after '[' or '[^' is a literal. */
            if (i + 1 < n && pat[i + 1] == '^') out[o++] = pat[++i];
            if (i + 1 < n && pat[i + 1] == ']') out[o++] = pat[++i];
            continue;
        }
        if (c == ']' && in_class) in_class = 0;
        out[o++] = c;
    }
    out[o] = 0;
    *outlen = o;
    return out;
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_pretok(tok_tokenizer *t, json_t *p, int *byte_level, char *err, size_t errlen) {
    if (!p || json_is_null(p)) return TOK_OK;
    const char *type = jstr(p, "type");
    if (!type) return tok_err(err, errlen, TOK_EFORMAT, "pre_tokenizer: missing \"type\"");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr))
            return tok_err(err, errlen, TOK_EFORMAT, "pre_tokenizer Sequence: missing array");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            int rc = parse_pretok(t, v, byte_level, err, errlen);
            if (rc) return rc;
        }
        return TOK_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (*byte_level) return tok_err(err, errlen, TOK_EFORMAT, "ByteLevel given twice");
        *byte_level = 1;
        if (jbool(p, "add_prefix_space", 0)) {
            /* Only meaningful before any split: then it is one space per
             * segment, which is what we implement. */
            if (t->n_pre)
                return tok_err(err, errlen, TOK_EFORMAT,
                               "ByteLevel add_prefix_space after a split is not supported");
            t->prefix_space = 1;
        }
        if (jbool(p, "use_regex", 1)) {
            size_t n;
            char *pat = translate_regex(GPT2_PATTERN, &n);
            if (!pat) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
            int rc = add_regex_step(t, pat, n, 0, SPLIT_ISOLATED, 0, err, errlen);
            free(pat);
            return rc;
        }
        return TOK_OK;
    }
    if (!strcmp(type, "Split")) {
        if (*byte_level)
            return tok_err(err, errlen, TOK_EFORMAT, "Split after ByteLevel is not supported");
        json_t *pat = json_object_get(p, "pattern");
        const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        if (!re && !lit)
            return tok_err(err, errlen, TOK_EFORMAT, "Split: pattern needs Regex or String");
        const char *b = jstr(p, "behavior");
        int beh;
        if (!b) return tok_err(err, errlen, TOK_EFORMAT, "Split: missing behavior");
        if (!strcmp(b, "Isolated")) beh = SPLIT_ISOLATED;
        else if (!strcmp(b, "Removed")) beh = SPLIT_REMOVED;
        else if (!strcmp(b, "MergedWithPrevious")) beh = SPLIT_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext")) beh = SPLIT_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous")) beh = SPLIT_CONTIGUOUS;
        else return tok_err(err, errlen, TOK_EFORMAT, "Split: unknown behavior '%s'", b);
        int inv = jbool(p, "invert", 0);
        if (lit) return add_regex_step(t, lit, strlen(lit), 1, beh, inv, err, errlen);
        size_t n;
        char *pc = translate_regex(re, &n);
        if (!pc) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        int rc = add_regex_step(t, pc, n, 0, beh, inv, err, errlen);
        free(pc);
        return rc;
    }
    return tok_err(err, errlen, TOK_EFORMAT, "unsupported pre_tokenizer type '%s'", type);
}

static int token_ref_ids(tok_tokenizer *t, json_t *specials, const char *name, int32_t **ids,
                         size_t *n, char *err, size_t errlen) {
    json_t *tok = json_object_get(specials, name);
    json_t *arr = json_object_get(tok, "ids");
    if (!json_is_array(arr))
        return tok_err(err, errlen, TOK_EFORMAT, "post_processor: unknown special token '%s'", name);
    size_t k;
    json_t *v;
    json_array_foreach(arr, k, v) {
        int32_t *p = realloc(*ids, (*n + 1) * sizeof **ids);
        if (!p) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        *ids = p;
        (*ids)[(*n)++] = (int32_t)json_integer_value(v);
    }
    (void)t;
    return TOK_OK;
}

static int push_id(int32_t **ids, size_t *n, int32_t id) {
    int32_t *p = realloc(*ids, (*n + 1) * sizeof **ids);
    if (!p) return TOK_ENOMEM;
    *ids = p;
    p[(*n)++] = id;
    return TOK_OK;
}

static int parse_post(tok_tokenizer *t, json_t *p, char *err, size_t errlen) {
    if (!p || json_is_null(p)) return TOK_OK;
    const char *type = jstr(p, "type");
    if (!type) return tok_err(err, errlen, TOK_EFORMAT, "post_processor: missing \"type\"");
    if (!strcmp(type, "ByteLevel")) return TOK_OK; /* offsets only */
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *v;
        json_t *arr = json_object_get(p, "processors");
        if (!json_is_array(arr))
            return tok_err(err, errlen, TOK_EFORMAT, "post_processor Sequence: missing array");
        json_array_foreach(arr, i, v) {
            int rc = parse_post(t, v, err, errlen);
            if (rc) return rc;
        }
        return TOK_OK;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
        if (!json_is_array(single))
            return tok_err(err, errlen, TOK_EFORMAT, "TemplateProcessing: missing single");
        int seen_seq = 0;
        size_t i;
        json_t *item;
        json_array_foreach(single, i, item) {
            json_t *sp = json_object_get(item, "SpecialToken");
            if (json_object_get(item, "Sequence")) {
                seen_seq = 1;
            } else if (sp) {
                const char *name = jstr(sp, "id");
                if (!name) return tok_err(err, errlen, TOK_EFORMAT, "TemplateProcessing: bad item");
                int rc = seen_seq ? token_ref_ids(t, specials, name, &t->post_suf, &t->n_post_suf, err, errlen)
                                  : token_ref_ids(t, specials, name, &t->post_pre, &t->n_post_pre, err, errlen);
                if (rc) return rc;
            } else {
                return tok_err(err, errlen, TOK_EFORMAT, "TemplateProcessing: bad item");
            }
        }
        return TOK_OK;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_object_get(p, "cls"), *sep = json_object_get(p, "sep");
        if (!json_is_array(cls) || !json_is_array(sep))
            return tok_err(err, errlen, TOK_EFORMAT, "%s: missing cls/sep", type);
        if (push_id(&t->post_pre, &t->n_post_pre, (int32_t)json_integer_value(json_array_get(cls, 1))) ||
            push_id(&t->post_suf, &t->n_post_suf, (int32_t)json_integer_value(json_array_get(sep, 1))))
            return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        return TOK_OK;
    }
    return tok_err(err, errlen, TOK_EFORMAT, "unsupported post_processor type '%s'", type);
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

static int load_json_root(tok_tokenizer *t, json_t *root, char *err, size_t errlen) {
    uint32_t b2u[256];
    int16_t u2b[0x144];
    byte_level_tables(b2u, u2b);
    char *tmp = NULL;
    int rc = TOK_OK;

    if (!json_is_object(root))
        return tok_err(err, errlen, TOK_EFORMAT, "tokenizer.json: top level is not an object");
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return tok_err(err, errlen, TOK_EFORMAT, "tokenizer.json: missing \"model\" object");
    const char *mtype = jstr(model, "type");
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
    const char *cs = jstr(model, "continuing_subword_prefix"), *ew = jstr(model, "end_of_word_suffix");
    if ((cs && *cs) || (ew && *ew))
        return tok_err(err, errlen, TOK_EFORMAT,
                       "BPE continuing_subword_prefix/end_of_word_suffix are not supported");
    t->ignore_merges = jbool(model, "ignore_merges", 0);

    /* Pipeline parts first: they are small and make most errors cheap. */
    int byte_level = 0;
    if ((rc = parse_normalizer(t, json_object_get(root, "normalizer"), err, errlen))) return rc;
    if ((rc = parse_pretok(t, json_object_get(root, "pre_tokenizer"), &byte_level, err, errlen)))
        return rc;
    if (!byte_level)
        return tok_err(err, errlen, TOK_EFORMAT,
                       "only byte-level BPE is supported (pre_tokenizer has no ByteLevel)");
    json_t *dec = json_object_get(root, "decoder");
    const char *dtype = dec && !json_is_null(dec) ? jstr(dec, "type") : "ByteLevel";
    if (!dtype || strcmp(dtype, "ByteLevel") != 0)
        return tok_err(err, errlen, TOK_EFORMAT, "unsupported decoder type '%s'",
                       dtype ? dtype : "(missing)");
    if ((rc = parse_post(t, json_object_get(root, "post_processor"), err, errlen))) return rc;

    /* Size the id space. */
    size_t max_id = 0, nv = 0;
    const char *key;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX - 1)
            return tok_err(err, errlen, TOK_EFORMAT, "vocab: bad id for token '%.40s'", key);
        if ((size_t)json_integer_value(v) > max_id) max_id = (size_t)json_integer_value(v);
        nv++;
    }
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added))
        return tok_err(err, errlen, TOK_EFORMAT, "added_tokens is not an array");
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) > INT32_MAX - 1 || !jstr(v, "content"))
            return tok_err(err, errlen, TOK_EFORMAT, "added_tokens[%zu]: needs id and content", i);
        if ((size_t)json_integer_value(id) > max_id) max_id = (size_t)json_integer_value(id);
    }
    if (nv == 0) return tok_err(err, errlen, TOK_EFORMAT, "BPE model: empty vocab");
    if ((size_t)max_id >= 16u * 1024 * 1024)
        return tok_err(err, errlen, TOK_EFORMAT, "vocab: id %zu too large", max_id);
    if ((rc = ids_alloc(t, max_id + 1))) goto oom;

    /* Vocab: raw bytes per id and the bytes -> id hash. */
    t->vocab_mask = pow2_at_least(nv * 2) - 1;
    t->vocab_slots = malloc((t->vocab_mask + 1) * sizeof *t->vocab_slots);
    tmp = malloc(4096);
    if (!t->vocab_slots || !tmp) goto oom;
    memset(t->vocab_slots, 0xff, (t->vocab_mask + 1) * sizeof *t->vocab_slots);
    size_t tmpcap = 4096;
    json_object_foreach(vocab, key, v) {
        size_t klen = strlen(key);
        if (tok_utf8_valid_prefix(key, klen) != klen) {
            rc = tok_err(err, errlen, TOK_EFORMAT, "vocab: token is not valid UTF-8");
            goto done;
        }
        if (klen > tmpcap) {
            char *p = realloc(tmp, klen);
            if (!p) goto oom;
            tmp = p;
            tmpcap = klen;
        }
        size_t n = byte_level_decode(key, klen, u2b, tmp);
        int32_t id = (int32_t)json_integer_value(v);
        if (t->id_len[id] != NO_TOKEN) {
            rc = tok_err(err, errlen, TOK_EFORMAT, "vocab: id %d used twice", (int)id);
            goto done;
        }
        if (blob_add(t, tmp, n, &t->id_off[id])) goto oom;
        t->id_len[id] = (uint32_t)n;
        size_t h = hash_bytes(tmp, n) & t->vocab_mask;
        while (t->vocab_slots[h] >= 0) {
            int32_t o = t->vocab_slots[h];
            if (t->id_len[o] == n && !memcmp(t->blob + t->id_off[o], tmp, n)) break;
            h = (h + 1) & t->vocab_mask;
        }
        if (t->vocab_slots[h] < 0) t->vocab_slots[h] = id;
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = vocab_find(t, &c, 1);
    }
    t->unk_id = -1;
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        json_t *u = json_object_get(vocab, unk);
        if (json_is_integer(u)) t->unk_id = (int32_t)json_integer_value(u);
    }

    /* Merges. */
    size_t nm = json_array_size(merges);
    t->merge_mask = pow2_at_least(nm * 2 + 2) - 1;
    t->merges = calloc(t->merge_mask + 1, sizeof *t->merges);
    if (!t->merges) goto oom;
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t al, bl;
        if (parse_merge(m, &a, &al, &b, &bl)) {
            rc = tok_err(err, errlen, TOK_EFORMAT, "merges[%zu]: expected [\"a\",\"b\"] or \"a b\"", i);
            goto done;
        }
        if (al + bl > tmpcap) {
            char *p = realloc(tmp, al + bl);
            if (!p) goto oom;
            tmp = p;
            tmpcap = al + bl;
        }
        /* Strings -> ids through the vocab (HF does the same lookups). */
        size_t n1 = byte_level_decode(a, al, u2b, tmp);
        int32_t ia = vocab_find(t, tmp, n1);
        size_t n2 = byte_level_decode(b, bl, u2b, tmp + n1);
        int32_t ib = vocab_find(t, tmp + n1, n2);
        int32_t in = vocab_find(t, tmp, n1 + n2);
        if (ia < 0 || ib < 0 || in < 0) {
            rc = tok_err(err, errlen, TOK_EFORMAT, "merges[%zu]: token not in vocab", i);
            goto done;
        }
        uint64_t k = ((uint64_t)(uint32_t)(ia + 1) << 32) | (uint32_t)ib;
        size_t h = mix64(k) & t->merge_mask;
        while (t->merges[h].key && t->merges[h].key != k) h = (h + 1) & t->merge_mask;
        /* A duplicate pair keeps its last rank, as HF's HashMap collect. */
        t->merges[h].key = k;
        t->merges[h].rank = (uint32_t)i;
        t->merges[h].new_id = in;
    }

    /* Added tokens: they override the model vocab for decode. */
    size_t na = json_array_size(added);
    if (na) {
        t->added = calloc(na, sizeof *t->added);
        if (!t->added) goto oom;
    }
    json_array_foreach(added, i, v) {
        added_tok *a = &t->added[t->n_added];
        const char *content = jstr(v, "content");
        size_t clen = json_string_length(json_object_get(v, "content"));
        if (clen == 0 || tok_utf8_valid_prefix(content, clen) != clen) {
            rc = tok_err(err, errlen, TOK_EFORMAT, "added_tokens[%zu]: empty or invalid content", i);
            goto done;
        }
        a->s = malloc(clen);
        if (!a->s) goto oom;
        memcpy(a->s, content, clen);
        a->len = clen;
        a->id = (int32_t)json_integer_value(json_object_get(v, "id"));
        a->special = jbool(v, "special", 0);
        /* HF: normalized defaults to !special. */
        a->normalized = jbool(v, "normalized", !a->special);
        a->lstrip = jbool(v, "lstrip", 0);
        a->rstrip = jbool(v, "rstrip", 0);
        a->single_word = jbool(v, "single_word", 0);
        t->n_added++;
        if (clen > tmpcap) {
            char *p = realloc(tmp, clen);
            if (!p) goto oom;
            tmp = p;
            tmpcap = clen;
        }
        size_t n = byte_level_decode(content, clen, u2b, tmp);
        if (blob_add(t, tmp, n, &t->id_off[a->id])) goto oom;
        t->id_len[a->id] = (uint32_t)n;
        t->id_flags[a->id] = FLAG_ADDED | (a->special ? FLAG_SPECIAL : 0);
        t->added_first[(unsigned char)content[0]] |= a->normalized ? 2 : 1;
        if (a->normalized) t->has_normalized_added = 1;
    }
    t->eos_id = -1;
    if ((rc = cache_init(t))) goto oom;
    rc = TOK_OK;
    goto done;
oom:
    rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory loading tokenizer");
done:
    free(tmp);
    return rc;
}

static int new_tok(tok_tokenizer **out, char *err, size_t errlen) {
    *out = calloc(1, sizeof **out);
    if (!*out) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    (*out)->eos_id = -1;
    (*out)->unk_id = -1;
    return TOK_OK;
}

int tok_load_json_mem(const char *json, size_t len, tok_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    if (!root)
        return tok_err(err, errlen, TOK_EFORMAT, "tokenizer.json: bad JSON at line %d column %d: %s",
                       je.line, je.column, je.text);
    tok_tokenizer *t = NULL;
    int rc = new_tok(&t, err, errlen);
    if (rc == TOK_OK) {
        t->kind = KIND_BPE;
        rc = load_json_root(t, root, err, errlen);
    }
    json_decref(root);
    if (rc) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return TOK_OK;
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
    const char *name = json_is_string(e) ? json_string_value(e) : jstr(e, "content");
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

/* ---------- queries ---------- */

const char *tok_kind(const tok_tokenizer *t) { return t->kind == KIND_SPM ? "sentencepiece" : "bpe"; }
size_t tok_vocab_size(const tok_tokenizer *t) { return t->n_ids; }
int32_t tok_eos_id(const tok_tokenizer *t) { return t->eos_id; }

int tok_is_special(const tok_tokenizer *t, int32_t id) {
    return id >= 0 && (size_t)id < t->n_ids && (t->id_flags[id] & FLAG_SPECIAL);
}

int32_t tok_token_id(const tok_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    if (t->kind == KIND_SPM) return tok_spm_piece_to_id(t->spm, token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].s, token, n)) return t->added[i].id;
    if (tok_utf8_valid_prefix(token, n) != n) return -1;
    uint32_t b2u[256];
    int16_t u2b[0x144];
    byte_level_tables(b2u, u2b);
    char *tmp = malloc(n + 1);
    if (!tmp) return -1;
    size_t m = byte_level_decode(token, n, u2b, tmp);
    int32_t id = vocab_find(t, tmp, m);
    free(tmp);
    return id;
}

int tok_id_bytes(const tok_tokenizer *t, int32_t id, int skip_special, int first, const char **p,
                 size_t *n) {
    if (id < 0 || (size_t)id >= t->n_ids || t->id_len[id] == NO_TOKEN) return -1;
    if (skip_special && (t->id_flags[id] & FLAG_SPECIAL)) return -1;
    *p = t->blob + t->id_off[id];
    *n = t->id_len[id];
    /* SentencePiece drops the dummy-prefix space of the first piece. */
    if (t->kind == KIND_SPM && first && *n && **p == ' ' && tok_spm_add_dummy_prefix(t->spm)) {
        (*p)++;
        (*n)--;
    }
    return 0;
}

/* ---------- encode ---------- */

typedef struct {
    int32_t *ids;
    size_t n, cap;
} idvec;

static int idvec_push(idvec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 256;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return TOK_ENOMEM;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return TOK_OK;
}

typedef struct {
    int32_t id;
    int32_t prev, next;
    int alive;
} sym;

typedef struct {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
} hent;

/* Per-call scratch (encode is re-entrant: nothing here is shared). */
typedef struct {
    sym *syms;
    hent *heap;
    size_t cap, hcap;
    pcre2_match_data *md[4];
    tok_buf norm[2];
    struct span {
        size_t s, e;
    } *spans[2];
    size_t span_cap[2];
} scratch;

static int heap_less(const hent *a, const hent *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(scratch *sc, size_t *hn, hent e) {
    if (*hn == sc->hcap) {
        size_t cap = sc->hcap ? sc->hcap * 2 : 64;
        hent *p = realloc(sc->heap, cap * sizeof *p);
        if (!p) return TOK_ENOMEM;
        sc->heap = p;
        sc->hcap = cap;
    }
    size_t i = (*hn)++;
    while (i > 0) {
        size_t par = (i - 1) / 2;
        if (!heap_less(&e, &sc->heap[par])) break;
        sc->heap[i] = sc->heap[par];
        i = par;
    }
    sc->heap[i] = e;
    return TOK_OK;
}

static hent heap_pop(scratch *sc, size_t *hn) {
    hent top = sc->heap[0], last = sc->heap[--(*hn)];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&sc->heap[c + 1], &sc->heap[c])) c++;
        if (!heap_less(&sc->heap[c], &last)) break;
        sc->heap[i] = sc->heap[c];
        i = c;
    }
    if (n) sc->heap[i] = last;
    return top;
}

/* BPE of one pre-token, replicating HF's Word::merge_all exactly (same
 * queue order and the same staleness test, which compares only new ids). */
static int bpe_word(const tok_tokenizer *t, const char *w, size_t n, idvec *out, scratch *sc) {
    if (n == 1 && t->byte_id[(unsigned char)w[0]] >= 0)
        return idvec_push(out, t->byte_id[(unsigned char)w[0]]);
    if (t->ignore_merges) {
        int32_t id = vocab_find(t, w, n);
        if (id >= 0) return idvec_push(out, id);
    }
    if (n > sc->cap) {
        sym *p = realloc(sc->syms, n * sizeof *p);
        if (!p) return TOK_ENOMEM;
        sc->syms = p;
        sc->cap = n;
    }
    sym *s = sc->syms;
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(unsigned char)w[i]];
        if (id < 0) {
            /* Byte missing from the vocab: HF emits unk when it has one and
             * fails otherwise; we drop the byte in the latter case. */
            if (t->unk_id < 0) continue;
            id = t->unk_id;
        }
        s[ns].id = id;
        s[ns].prev = (int32_t)ns - 1;
        s[ns].next = (int32_t)ns + 1;
        s[ns].alive = 1;
        ns++;
    }
    if (ns == 0) return TOK_OK;
    s[ns - 1].next = -1;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const merge_slot *m = merge_find(t, s[i].id, s[i + 1].id);
        if (m && heap_push(sc, &hn, (hent){m->rank, (int32_t)i, m->new_id})) return TOK_ENOMEM;
    }
    while (hn) {
        hent top = heap_pop(sc, &hn);
        sym *cur = &s[top.pos];
        if (!cur->alive || cur->next < 0) continue;
        sym *right = &s[cur->next];
        const merge_slot *m = merge_find(t, cur->id, right->id);
        if (!m || m->new_id != top.new_id) continue;
        cur->id = top.new_id;
        right->alive = 0;
        cur->next = right->next;
        if (right->next >= 0) s[right->next].prev = top.pos;
        if (cur->prev >= 0) {
            m = merge_find(t, s[cur->prev].id, cur->id);
            if (m && heap_push(sc, &hn, (hent){m->rank, cur->prev, m->new_id})) return TOK_ENOMEM;
        }
        if (cur->next >= 0) {
            m = merge_find(t, cur->id, s[cur->next].id);
            if (m && heap_push(sc, &hn, (hent){m->rank, top.pos, m->new_id})) return TOK_ENOMEM;
        }
    }
    for (int32_t i = 0; i >= 0; i = s[i].next)
        if (idvec_push(out, s[i].id)) return TOK_ENOMEM;
    return TOK_OK;
}

/* BPE through the cache. Short words only: long ones are rare and would
 * evict the frequent ones. */
static int bpe_cached(const tok_tokenizer *t, const char *w, size_t n, idvec *out, scratch *sc) {
    if (n <= 1 || n > CACHE_MAX_WORD) return bpe_word(t, w, n, out, sc);
    uint64_t h = hash_bytes(w, n);
    cache_stripe *st = &t->cache[h % CACHE_STRIPES];
    cache_ent *e = &st->ents[(h / CACHE_STRIPES) % CACHE_WAYS];
    int32_t ids[CACHE_MAX_IDS];
    int hit = 0;
    size_t k = 0;
    pthread_mutex_lock(&st->mu);
    if (e->hash == h && e->wlen == n && !memcmp(e->word, w, n)) {
        hit = 1;
        k = e->nids;
        memcpy(ids, e->ids, k * sizeof *ids);
    }
    pthread_mutex_unlock(&st->mu);
    if (hit) {
        for (size_t i = 0; i < k; i++)
            if (idvec_push(out, ids[i])) return TOK_ENOMEM;
        return TOK_OK;
    }
    size_t before = out->n;
    int rc = bpe_word(t, w, n, out, sc);
    k = out->n - before;
    if (rc == TOK_OK && k <= CACHE_MAX_IDS) {
        pthread_mutex_lock(&st->mu);
        e->hash = h;
        e->wlen = (uint8_t)n;
        e->nids = (uint8_t)k;
        memcpy(e->word, w, n);
        memcpy(e->ids, out->ids + before, k * sizeof *ids);
        pthread_mutex_unlock(&st->mu);
    }
    return rc;
}

static int spans_push(scratch *sc, int which, size_t *n, size_t s, size_t e) {
    if (*n == sc->span_cap[which]) {
        size_t cap = sc->span_cap[which] ? sc->span_cap[which] * 2 : 64;
        struct span *p = realloc(sc->spans[which], cap * sizeof *p);
        if (!p) return TOK_ENOMEM;
        sc->spans[which] = p;
        sc->span_cap[which] = cap;
    }
    sc->spans[which][(*n)++] = (struct span){s, e};
    return TOK_OK;
}

static int regex_next(const pre_step *ps, pcre2_match_data *md, const char *s, size_t len,
                      size_t off, size_t *ms, size_t *me) {
    int r = ps->jit ? pcre2_jit_match(ps->re, (PCRE2_SPTR)s, len, off, 0, md, NULL)
                    : pcre2_match(ps->re, (PCRE2_SPTR)s, len, off, PCRE2_NO_UTF_CHECK, md, NULL);
    if (r < 0) return r == PCRE2_ERROR_NOMATCH ? 0 : -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* One Split step over [s, e) of buf, appending the resulting pieces. */
static int split_step(const pre_step *ps, pcre2_match_data *md, const char *buf, size_t s0,
                      size_t e0, scratch *sc, int which, size_t *np, char *err, size_t errlen) {
    /* Matches/gaps as HF's find_matches produces them, then the behavior. */
    int prev_match = 0;
    size_t off = s0;
    const char *sub = buf + s0;
    size_t sublen = e0 - s0;
    int rc = TOK_OK;
    /* Emit one (offsets, is_match) split through the behavior fold. For
     * MergedWithNext we fold backwards, so collect first. */
    struct span *tmp = NULL;
    int *tmpm = NULL;
    size_t nt = 0, tcap = 0;
    size_t pos = 0, prev = 0;
    while (pos <= sublen) {
        size_t ms, me;
        int r = pos < sublen ? regex_next(ps, md, sub, sublen, pos, &ms, &me) : 0;
        if (r < 0) {
            rc = tok_err(err, errlen, TOK_EINVAL, "pre-tokenizer regex match failed");
            goto done;
        }
        size_t gs = prev, ge = r ? ms : sublen;
        for (int pass = 0; pass < 2; pass++) {
            size_t a = pass ? ms : gs, b = pass ? me : ge;
            if (pass && !r) break;
            if (!pass && a == b) continue;
            if (nt == tcap) {
                tcap = tcap ? tcap * 2 : 64;
                struct span *p1 = realloc(tmp, tcap * sizeof *tmp);
                if (!p1) goto oom;
                tmp = p1;
                int *p2 = realloc(tmpm, tcap * sizeof *tmpm);
                if (!p2) goto oom;
                tmpm = p2;
            }
            tmp[nt] = (struct span){a + off, b + off};
            tmpm[nt] = pass ^ ps->invert;
            nt++;
        }
        if (!r) break;
        prev = me;
        if (me == ms) {
            /* Empty match: step one character, as Oniguruma's iterator does. */
            if (me >= sublen) break;
            size_t k = me + 1;
            while (k < sublen && ((unsigned char)sub[k] & 0xC0) == 0x80) k++;
            pos = k;
        } else {
            pos = me;
        }
    }
    /* Fold. */
    if (ps->behavior == SPLIT_MERGED_NEXT) {
        /* Walk backwards: a match is glued to the following piece. */
        size_t out_start = *np;
        prev_match = 0;
        for (size_t i = nt; i-- > 0;) {
            if (tmpm[i] && !prev_match && *np > out_start) {
                sc->spans[which][*np - 1].s = tmp[i].s;
            } else if (spans_push(sc, which, np, tmp[i].s, tmp[i].e)) {
                goto oom;
            }
            prev_match = tmpm[i];
        }
        /* Reverse what we appended. */
        for (size_t i = out_start, j = *np - 1; i < j; i++, j--) {
            struct span x = sc->spans[which][i];
            sc->spans[which][i] = sc->spans[which][j];
            sc->spans[which][j] = x;
        }
        goto done;
    }
    size_t out_start = *np;
    prev_match = 0;
    for (size_t i = 0; i < nt; i++) {
        int m = tmpm[i];
        int glue = 0;
        if (ps->behavior == SPLIT_REMOVED) {
            if (m) continue;
        } else if (ps->behavior == SPLIT_MERGED_PREV) {
            glue = m && !prev_match;
        } else if (ps->behavior == SPLIT_CONTIGUOUS) {
            glue = m == prev_match;
        }
        if (glue && *np > out_start) sc->spans[which][*np - 1].e = tmp[i].e;
        else if (spans_push(sc, which, np, tmp[i].s, tmp[i].e)) goto oom;
        prev_match = m;
    }
    goto done;
oom:
    rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
done:
    free(tmp);
    free(tmpm);
    return rc;
}

/* Pre-tokenize and BPE one normalized segment (no added tokens inside). */
static int encode_plain(const tok_tokenizer *t, const char *s, size_t n, idvec *out, scratch *sc,
                        char *err, size_t errlen) {
    if (n == 0) return TOK_OK;
    if (t->n_pre == 0) return bpe_cached(t, s, n, out, sc);
    int rc;
    size_t before = out->n;
    if (t->n_pre == 1 && t->pre[0].behavior == SPLIT_ISOLATED && !t->pre[0].invert) {
        /* Fast path (Qwen, GPT-2, Llama-3): BPE each match and gap directly. */
        const pre_step *ps = &t->pre[0];
        size_t pos = 0;
        while (pos < n) {
            size_t ms, me;
            int r = regex_next(ps, sc->md[0], s, n, pos, &ms, &me);
            if (r < 0) return tok_err(err, errlen, TOK_EINVAL, "pre-tokenizer regex match failed");
            if (!r) ms = me = n;
            if (ms > pos && (rc = bpe_cached(t, s + pos, ms - pos, out, sc))) return rc;
            if (me > ms && (rc = bpe_cached(t, s + ms, me - ms, out, sc))) return rc;
            if (!r) break;
            /* An empty match makes HF's iterator step one char and start a
             * gap there; rare, so the generic path below does it. */
            if (me == ms) goto generic;
            pos = me;
        }
        return TOK_OK;
    }
generic:;
    size_t np = 0;
    if (spans_push(sc, 0, &np, 0, n)) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    int cur = 0;
    for (int k = 0; k < t->n_pre; k++) {
        size_t nn = 0;
        for (size_t i = 0; i < np; i++) {
            struct span sp = sc->spans[cur][i];
            if ((rc = split_step(&t->pre[k], sc->md[k], s, sp.s, sp.e, sc, !cur, &nn, err, errlen)))
                return rc;
        }
        np = nn;
        cur = !cur;
    }
    /* The fast path may have emitted a prefix before bailing out. */
    out->n = before;
    for (size_t i = 0; i < np; i++) {
        struct span sp = sc->spans[cur][i];
        if (sp.e > sp.s && (rc = bpe_cached(t, s + sp.s, sp.e - sp.s, out, sc))) return rc;
    }
    return TOK_OK;
}

/* Code points NFC leaves alone in any context: starters (ccc 0) that are
 * not the second half of a canonical composition and are their own NFC.
 * Covers Latin-1/Latin Extended, Cyrillic, general punctuation, kana, CJK
 * and Hangul syllables (a following jamo is not inert, so LV+T still goes
 * through utf8proc). Only used for NFC. */
static int nfc_inert(uint32_t cp) {
    return cp < 0x300 || (cp >= 0x400 && cp <= 0x482) || (cp >= 0x48A && cp <= 0x4FF) ||
           (cp >= 0x2010 && cp <= 0x205F) || (cp >= 0x3000 && cp <= 0x3029) ||
           (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA) ||
           (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3);
}

/* Normalize s into out. ASCII characters are starters that never compose
 * with what precedes them, so the text can be cut before any of them and
 * each piece normalized alone: utf8proc only sees the non-ASCII runs (with
 * the ASCII character before each, which a combining mark may join). */
static int normalize_one(int opt, const char *s, size_t n, tok_buf *out, char *err, size_t errlen) {
    const unsigned char *u = (const unsigned char *)s;
    int inert_ok = (opt & UTF8PROC_COMPOSE) && !(opt & UTF8PROC_COMPAT);
    out->len = 0;
    if (tok_buf_reserve(out, n)) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    size_t i = 0, copied = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        /* Non-ASCII run [rs, re), unit starts one ASCII char earlier. */
        size_t rs = i, us = i > 0 ? i - 1 : 0, re = i;
        int inert = inert_ok;
        while (re < n && u[re] >= 0x80) {
            uint32_t cp = utf8_next(u, &re);
            if (inert && !nfc_inert(cp)) inert = 0;
        }
        (void)rs;
        i = re;
        if (inert) continue;
        if (tok_buf_append(out, s + copied, us - copied))
            return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        utf8proc_uint8_t *res = NULL;
        utf8proc_ssize_t r =
            utf8proc_map((const utf8proc_uint8_t *)s + us, (utf8proc_ssize_t)(re - us), &res, opt);
        if (r < 0) return tok_err(err, errlen, TOK_EINVAL, "normalization failed: %s", utf8proc_errmsg(r));
        int rc = tok_buf_append(out, res, (size_t)r);
        free(res);
        if (rc) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        copied = re;
    }
    if (tok_buf_append(out, s + copied, n - copied)) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    return TOK_OK;
}

static int normalize(const tok_tokenizer *t, const char *s, size_t n, const char **outp,
                     size_t *outn, scratch *sc, char *err, size_t errlen) {
    *outp = s;
    *outn = n;
    for (int i = 0; i < t->n_norm; i++) {
        tok_buf *dst = &sc->norm[i & 1];
        int rc = normalize_one(t->norm[i], *outp, *outn, dst, err, errlen);
        if (rc) return rc;
        *outp = dst->p;
        *outn = dst->len;
    }
    return TOK_OK;
}

static int is_word_char(uint32_t cp) {
    /* Rust's char::is_alphanumeric or '_' (HF's \w for single_word). */
    if (cp == '_') return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

static int is_ws(uint32_t cp) {
    /* Rust char::is_whitespace: the White_Space property. */
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static uint32_t last_cp(const char *s, size_t n, size_t *start) {
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    size_t j = i;
    *start = i;
    return utf8_next((const unsigned char *)s, &j);
}

/* Find the next added token match in s[from, n) (leftmost, then longest),
 * of the given kind (1 raw, 2 normalized). Applies single_word and the
 * lstrip/rstrip extension. Returns 1 when found. */
static int next_added(const tok_tokenizer *t, const char *s, size_t n, size_t from, size_t floor_,
                      int kind, size_t *ms, size_t *me, int32_t *id) {
    for (size_t i = from; i < n; i++) {
        if (!(t->added_first[(unsigned char)s[i]] & kind)) continue;
        const added_tok *best = NULL;
        for (size_t k = 0; k < t->n_added; k++) {
            const added_tok *a = &t->added[k];
            if ((a->normalized ? 2 : 1) != kind) continue;
            if (a->len <= n - i && !memcmp(s + i, a->s, a->len) && (!best || a->len > best->len))
                best = a;
        }
        if (!best) continue;
        size_t st = i, en = i + best->len;
        if (best->single_word) {
            size_t dummy;
            int lw = st > 0 && is_word_char(last_cp(s, st, &dummy));
            size_t j = en;
            int rw = en < n && is_word_char(utf8_next((const unsigned char *)s, &j));
            /* HF skips this match and continues after it. */
            if (lw || rw) {
                i = en - 1;
                continue;
            }
        }
        if (best->lstrip) {
            while (st > floor_) {
                size_t ps;
                uint32_t cp = last_cp(s, st, &ps);
                if (!is_ws(cp)) break;
                st = ps;
            }
        }
        if (best->rstrip) {
            while (en < n) {
                size_t j = en;
                uint32_t cp = utf8_next((const unsigned char *)s, &j);
                if (!is_ws(cp)) break;
                en = j;
            }
        }
        *ms = st;
        *me = en;
        *id = best->id;
        return 1;
    }
    return 0;
}

static int encode_segment(const tok_tokenizer *t, const char *s, size_t n, idvec *out,
                          scratch *sc, char *err, size_t errlen) {
    const char *ns;
    size_t nn;
    int rc = normalize(t, s, n, &ns, &nn, sc, err, errlen);
    if (rc) return rc;
    if (t->prefix_space && nn > 0 && ns[0] != ' ') {
        /* Rare (GPT-2 style add_prefix_space): copy with the space. */
        char *p = malloc(nn + 1);
        if (!p) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        p[0] = ' ';
        memcpy(p + 1, ns, nn);
        rc = encode_plain(t, p, nn + 1, out, sc, err, errlen);
        free(p);
        return rc;
    }
    if (!t->has_normalized_added) return encode_plain(t, ns, nn, out, sc, err, errlen);
    /* Tokens flagged "normalized" are matched in the normalized text. */
    char *copy = malloc(nn ? nn : 1);
    if (!copy) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    memcpy(copy, ns, nn);
    size_t pos = 0, ms, me;
    int32_t id;
    while (rc == TOK_OK && next_added(t, copy, nn, pos, pos, 2, &ms, &me, &id)) {
        if (ms > pos) rc = encode_plain(t, copy + pos, ms - pos, out, sc, err, errlen);
        if (rc == TOK_OK && idvec_push(out, id)) rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        pos = me;
    }
    if (rc == TOK_OK && pos < nn) rc = encode_plain(t, copy + pos, nn - pos, out, sc, err, errlen);
    free(copy);
    return rc;
}

static int encode_bpe(const tok_tokenizer *t, const char *text, size_t len, idvec *out, char *err,
                      size_t errlen) {
    scratch sc;
    memset(&sc, 0, sizeof sc);
    int rc = TOK_OK;
    for (int k = 0; k < t->n_pre; k++) {
        sc.md[k] = pcre2_match_data_create_from_pattern(t->pre[k].re, NULL);
        if (!sc.md[k]) {
            rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
            goto done;
        }
    }
    size_t pos = 0, ms, me;
    int32_t id;
    while (next_added(t, text, len, pos, pos, 1, &ms, &me, &id)) {
        if (ms > pos && (rc = encode_segment(t, text + pos, ms - pos, out, &sc, err, errlen)))
            goto done;
        if (idvec_push(out, id)) goto oom;
        pos = me;
    }
    if (pos < len && (rc = encode_segment(t, text + pos, len - pos, out, &sc, err, errlen))) goto done;
    goto done;
oom:
    rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
done:
    for (int k = 0; k < 4; k++) pcre2_match_data_free(sc.md[k]);
    free(sc.syms);
    free(sc.heap);
    free(sc.norm[0].p);
    free(sc.norm[1].p);
    free(sc.spans[0]);
    free(sc.spans[1]);
    return rc;
}

int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
               size_t *n_ids, char *err, size_t errlen) {
    *ids = NULL;
    *n_ids = 0;
    size_t bad = tok_utf8_valid_prefix(text, len);
    if (bad != len) return tok_err(err, errlen, TOK_EINVAL, "input is not valid UTF-8 (byte offset %zu)", bad);
    if (t->kind == KIND_SPM) {
        int32_t *p = NULL;
        size_t n = 0;
        int rc = tok_spm_encode(t->spm, text, len, &p, &n, err, errlen);
        if (rc) return rc;
        int32_t bos = tok_spm_bos_id(t->spm);
        if (add_special && bos >= 0) {
            int32_t *q = realloc(p, (n + 1) * sizeof *q);
            if (!q) {
                free(p);
                return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
            }
            memmove(q + 1, q, n * sizeof *q);
            q[0] = bos;
            p = q;
            n++;
        }
        *ids = p;
        *n_ids = n;
        return TOK_OK;
    }
    idvec v = {0};
    int rc = TOK_OK;
    if (add_special)
        for (size_t i = 0; i < t->n_post_pre && rc == TOK_OK; i++) rc = idvec_push(&v, t->post_pre[i]);
    if (rc == TOK_OK) rc = encode_bpe(t, text, len, &v, err, errlen);
    else rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    if (add_special)
        for (size_t i = 0; i < t->n_post_suf && rc == TOK_OK; i++)
            if (idvec_push(&v, t->post_suf[i])) rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    if (rc == TOK_OK && !v.ids && idvec_push(&v, 0) == TOK_OK) v.n = 0;
    if (rc || !v.ids) {
        free(v.ids);
        return rc ? rc : tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    }
    *ids = v.ids;
    *n_ids = v.n;
    return TOK_OK;
}

int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n_ids, int skip_special, char **out,
               size_t *out_len, char *err, size_t errlen) {
    *out = NULL;
    *out_len = 0;
    if (t->kind == KIND_SPM) return tok_spm_decode(t->spm, ids, n_ids, out, out_len, err, errlen);
    tok_buf raw = {0}, res = {0};
    int rc = TOK_OK;
    for (size_t i = 0; i < n_ids && rc == TOK_OK; i++) {
        const char *p;
        size_t n;
        if (tok_id_bytes(t, ids[i], skip_special, raw.len == 0, &p, &n) == 0) rc = tok_buf_append(&raw, p, n);
    }
    if (rc == TOK_OK) rc = tok_utf8_lossy(raw.p ? raw.p : "", raw.len, 1, &res, NULL);
    if (rc == TOK_OK) rc = tok_buf_append(&res, "", 0);
    free(raw.p);
    if (rc) {
        free(res.p);
        return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    }
    *out = res.p;
    *out_len = res.len;
    return TOK_OK;
}
