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
#include <ctype.h>
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
    char *s; /* content */
    size_t len;
    char *m; /* what is matched: the content, normalized when "normalized" */
    size_t mlen;
    int32_t id;
    int special, normalized, lstrip, rstrip, single_word;
} added_tok;

/* Pre-tokenizer steps run in order over the pieces of a segment. A regex
 * step splits (Split, Digits, Punctuation, Whitespace[Split], ByteLevel's
 * GPT-2 regex); the other two rewrite each piece before splitting it. */
enum { PRE_REGEX, PRE_PREFIX_SPACE, PRE_METASPACE };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
#define MAX_PRE 8
typedef struct {
    int type;
    pcre2_code *re; /* PRE_METASPACE: the replacement as a literal */
    int jit;
    int behavior, invert;
    char rep[8]; /* PRE_METASPACE replacement (one character) */
    size_t rep_len;
    int prepend, msplit;
} pre_step;

/* Normalizer steps, applied in order to each segment between added tokens. */
enum { NORM_UNICODE, NORM_LOWER, NORM_REPLACE, NORM_PREPEND, NORM_STRIP };
#define MAX_NORM 8
typedef struct {
    int type;
    int opt;        /* NORM_UNICODE: utf8proc options */
    pcre2_code *re; /* NORM_REPLACE */
    int jit;
    char *content; /* NORM_REPLACE / NORM_PREPEND */
    size_t clen;
    int left, right; /* NORM_STRIP */
} norm_step;

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
    norm_step norm[MAX_NORM];
    int n_norm;
    pre_step pre[MAX_PRE];
    int n_pre;
    int prefix_space;
    /* Vocab strings are the ByteLevel alphabet (BPE over bytes) or plain
     * text (BPE over characters, Metaspace family). */
    int char_level;
    int byte_fallback, fuse_unk;
    int32_t fallback_id[256]; /* "<0xXX>" tokens, -1 when absent */
    int strip_first; /* decode: drop the first token's leading spaces (1 all, 2 one) */
    uint32_t *surf_off, *surf_len; /* character-level: decode surface per id */
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

/* Vocab string -> the bytes BPE works on (identity for character-level). */
static size_t key_decode(const struct tok_tokenizer *t, const char *s, size_t len,
                         const int16_t u2b[0x144], char *out);

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

static size_t key_decode(const tok_tokenizer *t, const char *s, size_t len, const int16_t u2b[0x144],
                         char *out) {
    if (t->char_level) {
        memcpy(out, s, len);
        return len;
    }
    return byte_level_decode(s, len, u2b, out);
}

/* ---------- lifecycle ---------- */

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

/* ---------- tokenizer.json parsing ---------- */

static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int jbool(json_t *o, const char *key, int dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
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

static pcre2_code *compile_re(const char *pat, size_t patlen, int literal, int *jit, char *err,
                              size_t errlen, int *rc) {
    int ec;
    PCRE2_SIZE eo;
    /* PCRE2 refuses UCP together with LITERAL (and a literal needs none). */
    uint32_t flags = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, patlen, flags, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        *rc = tok_err(err, errlen, TOK_EFORMAT, "regex: %s at offset %zu", (const char *)msg, (size_t)eo);
        return NULL;
    }
    *jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    *rc = TOK_OK;
    return re;
}

/* A {"String": s} or {"Regex": r} pattern, compiled (\s as Oniguruma sees it). */
static pcre2_code *compile_pattern(json_t *pat, const char *what, int *jit, char *err, size_t errlen,
                                   int *rc) {
    const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
    if (!re && !lit) {
        *rc = tok_err(err, errlen, TOK_EFORMAT, "%s: pattern needs Regex or String", what);
        return NULL;
    }
    char sub[200];
    pcre2_code *c;
    if (lit) {
        c = compile_re(lit, json_string_length(json_object_get(pat, "String")), 1, jit, sub,
                       sizeof sub, rc);
    } else {
        size_t n;
        char *pc = translate_regex(re, &n);
        if (!pc) {
            *rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
            return NULL;
        }
        c = compile_re(pc, n, 0, jit, sub, sizeof sub, rc);
        free(pc);
    }
    if (!c && *rc == TOK_EFORMAT) tok_err(err, errlen, *rc, "%s %s", what, sub);
    else if (!c) tok_err(err, errlen, *rc, "%s", sub);
    return c;
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
    if (t->n_norm == MAX_NORM) return tok_err(err, errlen, TOK_EFORMAT, "too many normalizers");
    norm_step *ns = &t->norm[t->n_norm];
    memset(ns, 0, sizeof *ns);
    int rc = TOK_OK;
    if (!strcmp(type, "NFC")) ns->opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (!strcmp(type, "NFD")) ns->opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (!strcmp(type, "NFKC")) ns->opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(type, "NFKD")) ns->opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    if (ns->opt) {
        ns->type = NORM_UNICODE;
    } else if (!strcmp(type, "Lowercase")) {
        ns->type = NORM_LOWER;
    } else if (!strcmp(type, "Strip")) {
        ns->type = NORM_STRIP;
        ns->left = jbool(n, "strip_left", 1);
        ns->right = jbool(n, "strip_right", 1);
    } else if (!strcmp(type, "Prepend") || !strcmp(type, "Replace")) {
        int repl = type[0] == 'R';
        json_t *c = json_object_get(n, repl ? "content" : "prepend");
        if (!json_is_string(c))
            return tok_err(err, errlen, TOK_EFORMAT, "normalizer %s: missing \"%s\"", type,
                           repl ? "content" : "prepend");
        ns->type = repl ? NORM_REPLACE : NORM_PREPEND;
        ns->clen = json_string_length(c);
        if (tok_utf8_valid_prefix(json_string_value(c), ns->clen) != ns->clen)
            return tok_err(err, errlen, TOK_EFORMAT, "normalizer %s: invalid UTF-8", type);
        ns->content = malloc(ns->clen + 1);
        if (!ns->content) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        memcpy(ns->content, json_string_value(c), ns->clen + 1);
        if (repl) {
            ns->re = compile_pattern(json_object_get(n, "pattern"), "normalizer Replace", &ns->jit, err,
                                     errlen, &rc);
            if (!ns->re) {
                free(ns->content);
                return rc;
            }
        }
    } else {
        return tok_err(err, errlen, TOK_EFORMAT, "unsupported normalizer type '%s'", type);
    }
    t->n_norm++;
    return TOK_OK;
}

static pre_step *new_pre(tok_tokenizer *t, int type, char *err, size_t errlen) {
    if (t->n_pre == MAX_PRE) {
        tok_err(err, errlen, TOK_EFORMAT, "too many pre-tokenizers");
        return NULL;
    }
    pre_step *s = &t->pre[t->n_pre++];
    memset(s, 0, sizeof *s);
    s->type = type;
    return s;
}

static int add_regex_step(tok_tokenizer *t, const char *pat, int behavior, int invert, char *err,
                          size_t errlen) {
    size_t n;
    char *pc = translate_regex(pat, &n);
    if (!pc) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    int rc, jit;
    char sub[200];
    pcre2_code *re = compile_re(pc, n, 0, &jit, sub, sizeof sub, &rc);
    free(pc);
    if (!re) return tok_err(err, errlen, rc, "pre-tokenizer %s", sub);
    pre_step *s = new_pre(t, PRE_REGEX, err, errlen);
    if (!s) {
        pcre2_code_free(re);
        return TOK_EFORMAT;
    }
    s->re = re;
    s->jit = jit;
    s->behavior = behavior;
    s->invert = invert;
    return TOK_OK;
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust's char::is_numeric (Digits), is_ascii_punctuation || Unicode P*
 * (Punctuation), Oniguruma's \w = Letter|Mark|Number|Pc (Whitespace). */
static const char DIGIT_PATTERN[] = "\\p{N}";
static const char DIGITS_PATTERN[] = "\\p{N}+";
static const char PUNCT_PATTERN[] = "[\\p{P}\\x21-\\x2F\\x3A-\\x40\\x5B-\\x60\\x7B-\\x7E]";
static const char WHITESPACE_PATTERN[] = "[\\p{L}\\p{M}\\p{N}\\p{Pc}]+|[^\\p{L}\\p{M}\\p{N}\\p{Pc}\\s]+";
static const char WS_PATTERN[] = "\\s";

static int parse_behavior(const char *b, int *beh) {
    if (!strcmp(b, "Isolated")) *beh = SPLIT_ISOLATED;
    else if (!strcmp(b, "Removed")) *beh = SPLIT_REMOVED;
    else if (!strcmp(b, "MergedWithPrevious")) *beh = SPLIT_MERGED_PREV;
    else if (!strcmp(b, "MergedWithNext")) *beh = SPLIT_MERGED_NEXT;
    else if (!strcmp(b, "Contiguous")) *beh = SPLIT_CONTIGUOUS;
    else return -1;
    return 0;
}

/* *mode: 0 nothing yet, 1 ByteLevel seen, 2 Metaspace seen. Splitting
 * after ByteLevel would see the byte alphabet, which we do not model. */
static int parse_pretok(tok_tokenizer *t, json_t *p, int *mode, char *err, size_t errlen) {
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
            int rc = parse_pretok(t, v, mode, err, errlen);
            if (rc) return rc;
        }
        return TOK_OK;
    }
    if (*mode)
        return tok_err(err, errlen, TOK_EFORMAT, "pre_tokenizer %s after %s is not supported", type,
                       *mode == 1 ? "ByteLevel" : "Metaspace");
    if (!strcmp(type, "ByteLevel")) {
        *mode = 1;
        if (jbool(p, "add_prefix_space", 0)) {
            /* Before any split it is one space per segment (fast path);
             * after one, a step that prefixes every piece. */
            if (t->n_pre == 0) t->prefix_space = 1;
            else if (!new_pre(t, PRE_PREFIX_SPACE, err, errlen)) return TOK_EFORMAT;
        }
        if (jbool(p, "use_regex", 1)) return add_regex_step(t, GPT2_PATTERN, SPLIT_ISOLATED, 0, err, errlen);
        return TOK_OK;
    }
    if (!strcmp(type, "Split")) {
        const char *b = jstr(p, "behavior");
        int beh, rc, jit;
        if (!b) return tok_err(err, errlen, TOK_EFORMAT, "Split: missing behavior");
        if (parse_behavior(b, &beh)) return tok_err(err, errlen, TOK_EFORMAT, "Split: unknown behavior '%s'", b);
        pcre2_code *re = compile_pattern(json_object_get(p, "pattern"), "pre-tokenizer Split", &jit, err,
                                         errlen, &rc);
        if (!re) return rc;
        pre_step *s = new_pre(t, PRE_REGEX, err, errlen);
        if (!s) {
            pcre2_code_free(re);
            return TOK_EFORMAT;
        }
        s->re = re;
        s->jit = jit;
        s->behavior = beh;
        s->invert = jbool(p, "invert", 0);
        return TOK_OK;
    }
    if (!strcmp(type, "Digits"))
        return add_regex_step(t, jbool(p, "individual_digits", 0) ? DIGIT_PATTERN : DIGITS_PATTERN,
                              SPLIT_ISOLATED, 0, err, errlen);
    if (!strcmp(type, "Punctuation")) {
        const char *b = jstr(p, "behavior");
        int beh = SPLIT_ISOLATED;
        if (b && parse_behavior(b, &beh))
            return tok_err(err, errlen, TOK_EFORMAT, "Punctuation: unknown behavior '%s'", b);
        return add_regex_step(t, PUNCT_PATTERN, beh, 0, err, errlen);
    }
    if (!strcmp(type, "Whitespace")) return add_regex_step(t, WHITESPACE_PATTERN, SPLIT_REMOVED, 1, err, errlen);
    if (!strcmp(type, "WhitespaceSplit")) return add_regex_step(t, WS_PATTERN, SPLIT_REMOVED, 0, err, errlen);
    if (!strcmp(type, "Metaspace")) {
        json_t *r = json_object_get(p, "replacement");
        const char *rep = json_is_string(r) ? json_string_value(r) : "\xE2\x96\x81";
        size_t rl = strlen(rep), k = 0;
        if (rl == 0 || rl > 4 || tok_utf8_valid_prefix(rep, rl) != rl ||
            (utf8_next((const unsigned char *)rep, &k), k != rl))
            return tok_err(err, errlen, TOK_EFORMAT, "Metaspace: replacement must be one character");
        int prepend = PREPEND_ALWAYS;
        const char *ps = jstr(p, "prepend_scheme");
        if (ps) {
            if (!strcmp(ps, "always")) prepend = PREPEND_ALWAYS;
            else if (!strcmp(ps, "first")) prepend = PREPEND_FIRST;
            else if (!strcmp(ps, "never")) prepend = PREPEND_NEVER;
            else return tok_err(err, errlen, TOK_EFORMAT, "Metaspace: unknown prepend_scheme '%s'", ps);
        } else if (!jbool(p, "add_prefix_space", 1)) {
            prepend = PREPEND_NEVER;
        }
        int rc, jit;
        pcre2_code *re = compile_re(rep, rl, 1, &jit, err, errlen, &rc);
        if (!re) return rc;
        pre_step *s = new_pre(t, PRE_METASPACE, err, errlen);
        if (!s) {
            pcre2_code_free(re);
            return TOK_EFORMAT;
        }
        *mode = 2;
        s->re = re;
        s->jit = jit;
        s->behavior = SPLIT_MERGED_NEXT;
        memcpy(s->rep, rep, rl);
        s->rep_len = rl;
        s->prepend = prepend;
        s->msplit = jbool(p, "split", 1);
        return TOK_OK;
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

/* Decoders we model as a per-token surface string plus a rule for the
 * first token: ByteLevel for byte-level BPE; for character-level BPE,
 * Metaspace or a Sequence of Replace(c -> " "), ByteFallback, Fuse and
 * Strip(" ", 1, 0) (the Llama/Mistral tokenizer.json layout). */
typedef struct {
    char rep[8]; /* character decoded as a space ("" none) */
    size_t rep_len;
    int byte_fallback;
} dec_info;

static int parse_decoder_item(tok_tokenizer *t, json_t *d, dec_info *di, char *err, size_t errlen) {
    const char *type = jstr(d, "type");
    if (!type) return tok_err(err, errlen, TOK_EFORMAT, "decoder: missing \"type\"");
    if (!strcmp(type, "Metaspace")) {
        json_t *r = json_object_get(d, "replacement");
        const char *rep = json_is_string(r) ? json_string_value(r) : "\xE2\x96\x81";
        size_t rl = strlen(rep);
        if (rl == 0 || rl >= sizeof di->rep)
            return tok_err(err, errlen, TOK_EFORMAT, "decoder Metaspace: bad replacement");
        memcpy(di->rep, rep, rl + 1);
        di->rep_len = rl;
        const char *ps = jstr(d, "prepend_scheme");
        int never = ps ? !strcmp(ps, "never") : !jbool(d, "add_prefix_space", 1);
        /* HF drops every replacement of the first token; tokens only carry
         * them in front, so that is its leading spaces. */
        t->strip_first = never ? 0 : 1;
        return TOK_OK;
    }
    if (!strcmp(type, "Replace")) {
        const char *from = jstr(json_object_get(d, "pattern"), "String"), *to = jstr(d, "content");
        if (!from || !to || strcmp(to, " ") != 0 || !*from || strlen(from) >= sizeof di->rep)
            return tok_err(err, errlen, TOK_EFORMAT,
                           "decoder Replace: only a String pattern replaced by \" \" is supported");
        memcpy(di->rep, from, strlen(from) + 1);
        di->rep_len = strlen(from);
        return TOK_OK;
    }
    if (!strcmp(type, "ByteFallback")) {
        di->byte_fallback = 1;
        return TOK_OK;
    }
    if (!strcmp(type, "Fuse")) return TOK_OK;
    if (!strcmp(type, "Strip")) {
        json_t *st = json_object_get(d, "start"), *sp = json_object_get(d, "stop");
        const char *c = jstr(d, "content");
        if (!c || strcmp(c, " ") != 0 || json_integer_value(st) != 1 || json_integer_value(sp) != 0)
            return tok_err(err, errlen, TOK_EFORMAT,
                           "decoder Strip: only content \" \", start 1, stop 0 is supported");
        t->strip_first = 2;
        return TOK_OK;
    }
    return tok_err(err, errlen, TOK_EFORMAT, "unsupported decoder type '%s'", type);
}

static int parse_decoder(tok_tokenizer *t, json_t *dec, dec_info *di, char *err, size_t errlen) {
    memset(di, 0, sizeof *di);
    if (!t->char_level) {
        /* A missing decoder has always been read as ByteLevel here. */
        const char *dtype = dec && !json_is_null(dec) ? jstr(dec, "type") : "ByteLevel";
        if (!dtype || strcmp(dtype, "ByteLevel") != 0)
            return tok_err(err, errlen, TOK_EFORMAT, "unsupported decoder type '%s' with ByteLevel",
                           dtype ? dtype : "(missing)");
        return TOK_OK;
    }
    if (!dec || json_is_null(dec))
        return tok_err(err, errlen, TOK_EFORMAT,
                       "no decoder and no ByteLevel pre_tokenizer (tokens joined by spaces) is not "
                       "supported");
    const char *type = jstr(dec, "type");
    if (type && !strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(dec, "decoders");
        if (!json_is_array(arr)) return tok_err(err, errlen, TOK_EFORMAT, "decoder Sequence: missing array");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            int rc = parse_decoder_item(t, v, di, err, errlen);
            if (rc) return rc;
        }
        return TOK_OK;
    }
    if (type && !strcmp(type, "ByteLevel"))
        return tok_err(err, errlen, TOK_EFORMAT, "decoder ByteLevel needs the ByteLevel pre_tokenizer");
    return parse_decoder_item(t, dec, di, err, errlen);
}

/* Text as the decoder shows it: the replacement character as a space and
 * a "<0xXX>" byte-fallback token as its byte. */
static int surface_of(const dec_info *di, const char *s, size_t n, tok_buf *out) {
    out->len = 0;
    if (di->byte_fallback && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') {
        char hex[3] = {s[3], s[4], 0}, *end;
        long b = strtol(hex, &end, 16);
        if (*end == 0 && isxdigit((unsigned char)s[3]) && isxdigit((unsigned char)s[4])) {
            char c = (char)b;
            return tok_buf_append(out, &c, 1);
        }
    }
    for (size_t i = 0; i < n;) {
        if (di->rep_len && i + di->rep_len <= n && !memcmp(s + i, di->rep, di->rep_len)) {
            if (tok_buf_append(out, " ", 1)) return TOK_ENOMEM;
            i += di->rep_len;
        } else {
            if (tok_buf_append(out, s + i, 1)) return TOK_ENOMEM;
            i++;
        }
    }
    return tok_buf_append(out, "", 0);
}

static int normalize_added(tok_tokenizer *t);

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

    t->byte_fallback = jbool(model, "byte_fallback", 0);
    t->fuse_unk = jbool(model, "fuse_unk", 0);

    /* Pipeline parts first: they are small and make most errors cheap. */
    int mode = 0;
    if ((rc = parse_normalizer(t, json_object_get(root, "normalizer"), err, errlen))) return rc;
    if ((rc = parse_pretok(t, json_object_get(root, "pre_tokenizer"), &mode, err, errlen)))
        return rc;
    t->char_level = mode != 1;
    dec_info di;
    if ((rc = parse_decoder(t, json_object_get(root, "decoder"), &di, err, errlen))) return rc;
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
        size_t n = key_decode(t, key, klen, u2b, tmp);
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
        size_t n1 = key_decode(t, a, al, u2b, tmp);
        int32_t ia = vocab_find(t, tmp, n1);
        size_t n2 = key_decode(t, b, bl, u2b, tmp + n1);
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
        a->m = a->s;
        a->mlen = clen;
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
        size_t n = key_decode(t, content, clen, u2b, tmp);
        if (blob_add(t, tmp, n, &t->id_off[a->id])) goto oom;
        t->id_len[a->id] = (uint32_t)n;
        t->id_flags[a->id] = FLAG_ADDED | (a->special ? FLAG_SPECIAL : 0);
        if (a->normalized) t->has_normalized_added = 1;
    }
    if ((rc = normalize_added(t))) goto oom;
    /* HF then also decodes such a token as its normalized content. */
    for (i = 0; i < t->n_added; i++) {
        added_tok *a = &t->added[i];
        if (a->m == a->s) continue;
        if (a->mlen > tmpcap) {
            char *p = realloc(tmp, a->mlen);
            if (!p) goto oom;
            tmp = p;
            tmpcap = a->mlen;
        }
        size_t n = key_decode(t, a->m, a->mlen, u2b, tmp);
        if (blob_add(t, tmp, n, &t->id_off[a->id])) goto oom;
        t->id_len[a->id] = (uint32_t)n;
    }
    for (i = 0; i < t->n_added; i++)
        if (t->added[i].mlen) t->added_first[(unsigned char)t->added[i].m[0]] |= t->added[i].normalized ? 2 : 1;
    if (t->char_level) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->fallback_id[b] = vocab_find(t, name, 6);
        }
        /* Decode surfaces differ from the vocab strings: keep both. */
        t->surf_off = malloc(t->n_ids * sizeof *t->surf_off);
        t->surf_len = malloc(t->n_ids * sizeof *t->surf_len);
        if (!t->surf_off || !t->surf_len) goto oom;
        tok_buf sb = {0};
        for (size_t id = 0; id < t->n_ids; id++) {
            t->surf_len[id] = NO_TOKEN;
            if (t->id_len[id] == NO_TOKEN) continue;
            /* The blob may move in blob_add: copy the key out first. */
            if (tok_buf_reserve(&sb, 0) || surface_of(&di, t->blob + t->id_off[id], t->id_len[id], &sb) ||
                blob_add(t, sb.p, sb.len, &t->surf_off[id])) {
                free(sb.p);
                goto oom;
            }
            t->surf_len[id] = (uint32_t)sb.len;
        }
        free(sb.p);
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

/* ---------- BPE from plain arrays (a GGUF's tokenizer.ggml.*) ---------- */

/* llama.cpp pre-tokenizer names -> the tokenizer.json pipeline HF uses for
 * that family. The regexes are the ones in the published tokenizer.json. */
static const struct {
    const char *name, *pre;
} PRE_NAMES[] = {
    {"default", "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"},
    {"gpt-2", "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"},
    {"smollm", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},"
               "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}]}"},
    {"qwen2", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
              "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}"
              "\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\","
              "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}"},
    {"llama-bpe", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
                  "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s"
                  "\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":"
                  "\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                  "\"use_regex\":false}]}"},
};

/* Build the tokenizer.json object the arrays stand for and load that, so
 * both paths share one loader and one set of rules. */
static int vocab_to_json(const tok_bpe_vocab *v, json_t **out, char *err, size_t errlen) {
    const char *pre = v->pre ? v->pre : "default", *pre_json = NULL;
    for (size_t i = 0; i < sizeof PRE_NAMES / sizeof *PRE_NAMES; i++)
        if (!strcmp(pre, PRE_NAMES[i].name)) pre_json = PRE_NAMES[i].pre;
    if (!pre_json)
        return tok_err(err, errlen, TOK_EUNSUPPORTED,
                       "unsupported pre-tokenizer '%s' (supported: default, gpt-2, smollm, qwen2, llama-bpe)",
                       pre);
    if (!v->tokens || !v->token_lens || v->n_tokens == 0)
        return tok_err(err, errlen, TOK_EINVAL, "vocab: no tokens");
    if (v->n_merges && (!v->merges || !v->merge_lens)) return tok_err(err, errlen, TOK_EINVAL, "vocab: merges missing");
    if (v->n_tokens >= 16u * 1024 * 1024) return tok_err(err, errlen, TOK_EINVAL, "vocab: too many tokens");
    int32_t ids[4] = {v->bos_id, v->eos_id, v->unk_id, v->pad_id};
    for (int i = 0; i < 4; i++)
        if (ids[i] < -1 || ids[i] >= (int32_t)v->n_tokens)
            return tok_err(err, errlen, TOK_EINVAL, "vocab: special id %d out of range", (int)ids[i]);
    json_error_t je;
    json_t *root = json_object(), *model = json_object(), *vocab = json_object(), *merges = json_array(),
           *added = json_array(), *pt = json_loads(pre_json, 0, &je);
    int rc = TOK_OK;
    if (!root || !model || !vocab || !merges || !added || !pt) {
        json_decref(root);
        json_decref(model);
        json_decref(vocab);
        json_decref(merges);
        json_decref(added);
        json_decref(pt);
        return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    }
    json_object_set_new(root, "model", model);
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", merges);
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "pre_tokenizer", pt);
    if (v->unk_id >= 0)
        json_object_set_new(model, "unk_token",
                            json_stringn(v->tokens[v->unk_id], v->token_lens[v->unk_id]));
    for (size_t i = 0; i < v->n_tokens; i++) {
        const char *s = v->tokens[i];
        size_t n = v->token_lens[i];
        if (!s || n == 0 || tok_utf8_valid_prefix(s, n) != n) {
            rc = tok_err(err, errlen, TOK_EFORMAT, "token %zu is empty or not valid UTF-8", i);
            goto fail;
        }
        json_t *str = json_stringn(s, n);
        if (!str) goto oom;
        /* A repeated string keeps its first id, as a tokenizer.json can
         * name each string once. */
        if (!json_object_getn(vocab, s, n) && json_object_setn_new(vocab, s, n, json_integer((json_int_t)i))) {
            json_decref(str);
            goto oom;
        }
        int type = v->types ? v->types[i] : 1;
        if (type == 3 || type == 4) {
            json_t *a = json_object();
            if (!a || json_array_append_new(added, a)) goto oom;
            json_object_set_new(a, "id", json_integer((json_int_t)i));
            json_object_set_new(a, "content", str);
            json_object_set_new(a, "special", json_true());
            json_object_set_new(a, "normalized", json_false());
        } else {
            json_decref(str);
        }
    }
    for (size_t i = 0; i < v->n_merges; i++) {
        const char *s = v->merges[i];
        size_t n = v->merge_lens[i];
        if (!s || tok_utf8_valid_prefix(s, n) != n) {
            rc = tok_err(err, errlen, TOK_EFORMAT, "merges[%zu]: not valid UTF-8", i);
            goto fail;
        }
        if (json_array_append_new(merges, json_stringn(s, n))) goto oom;
    }
    *out = root;
    return TOK_OK;
oom:
    rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
fail:
    json_decref(root);
    return rc;
}

int tok_load_bpe_vocab(const tok_bpe_vocab *v, tok_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    if (!v) return tok_err(err, errlen, TOK_EINVAL, "vocab: NULL");
    json_t *root = NULL;
    int rc = vocab_to_json(v, &root, err, errlen);
    if (rc) return rc;
    tok_tokenizer *t = NULL;
    rc = new_tok(&t, err, errlen);
    if (rc == TOK_OK) {
        t->kind = KIND_BPE;
        rc = load_json_root(t, root, err, errlen);
    }
    json_decref(root);
    if (rc == TOK_OK) {
        t->eos_id = v->eos_id;
        if ((v->add_bos && v->bos_id >= 0 && push_id(&t->post_pre, &t->n_post_pre, v->bos_id)) ||
            (v->add_eos && v->eos_id >= 0 && push_id(&t->post_suf, &t->n_post_suf, v->eos_id)))
            rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    }
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
    size_t m = key_decode(t, token, n, u2b, tmp);
    int32_t id = vocab_find(t, tmp, m);
    free(tmp);
    return id;
}

int tok_first_by_token(const tok_tokenizer *t) { return t->surf_off && t->strip_first == 1; }

int tok_id_bytes(const tok_tokenizer *t, int32_t id, int skip_special, int first, const char **p,
                 size_t *n) {
    if (id < 0 || (size_t)id >= t->n_ids || t->id_len[id] == NO_TOKEN) return -1;
    if (skip_special && (t->id_flags[id] & FLAG_SPECIAL)) return -1;
    if (t->surf_off) {
        *p = t->blob + t->surf_off[id];
        *n = t->surf_len[id];
        if (first && t->strip_first)
            while (*n && **p == ' ') {
                (*p)++;
                (*n)--;
                if (t->strip_first == 2) break;
            }
        return 0;
    }
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
    pcre2_match_data *md[MAX_PRE], *nmd[MAX_NORM];
    tok_buf norm[2];
    tok_buf arena; /* generic pre-tokenizer path: text the pieces point into */
    struct span {
        size_t s, e;
        int origin; /* piece starts at offset 0 of the original text */
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
#define PUSH_SYM(x)                                                                                \
    do {                                                                                           \
        s[ns].id = (x);                                                                            \
        s[ns].prev = (int32_t)ns - 1;                                                              \
        s[ns].next = (int32_t)ns + 1;                                                              \
        s[ns].alive = 1;                                                                           \
        ns++;                                                                                      \
    } while (0)
    if (t->char_level) {
        /* One symbol per character, as HF's BPE::merge_word: an unknown
         * character becomes its "<0xXX>" tokens (byte_fallback, when all
         * exist), else unk (runs fused with fuse_unk), else nothing. */
        int pending_unk = 0;
        for (size_t i = 0; i < n;) {
            size_t j = i;
            utf8_next((const unsigned char *)w, &j);
            int32_t id = vocab_find(t, w + i, j - i);
            if (id >= 0) {
                if (pending_unk) PUSH_SYM(t->unk_id);
                pending_unk = 0;
                PUSH_SYM(id);
            } else {
                int fb = t->byte_fallback;
                for (size_t k = i; fb && k < j; k++) fb = t->fallback_id[(unsigned char)w[k]] >= 0;
                if (fb) {
                    for (size_t k = i; k < j; k++) PUSH_SYM(t->fallback_id[(unsigned char)w[k]]);
                } else if (t->unk_id >= 0) {
                    if (pending_unk && !t->fuse_unk) PUSH_SYM(t->unk_id);
                    pending_unk = 1;
                }
            }
            i = j;
        }
        if (pending_unk) PUSH_SYM(t->unk_id);
    } else {
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_id[(unsigned char)w[i]];
            if (id < 0) {
                /* Byte missing from the vocab: HF emits unk when it has one and
                 * fails otherwise; we drop the byte in the latter case. */
                if (t->unk_id < 0) continue;
                id = t->unk_id;
            }
            PUSH_SYM(id);
        }
    }
#undef PUSH_SYM
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
        if (k) memcpy(e->ids, out->ids + before, k * sizeof *ids); /* ids may be NULL */
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
    sc->spans[which][(*n)++] = (struct span){s, e, 0};
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
                      size_t e0, int origin, scratch *sc, int which, size_t *np, char *err,
                      size_t errlen) {
    size_t first_out = *np;
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
            tmp[nt] = (struct span){a + off, b + off, 0};
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
    for (size_t i = first_out; i < *np; i++) sc->spans[which][i].origin = origin && sc->spans[which][i].s == s0;
    return rc;
}

/* Append a rewritten copy of arena[s, e) for the Metaspace and prefix-space
 * steps; returns the new span's start. */
static int arena_rewrite(const pre_step *ps, scratch *sc, size_t s, size_t e, int origin, size_t *ns) {
    tok_buf *a = &sc->arena;
    /* The copy may move the arena: work on offsets. */
    if (tok_buf_reserve(a, (e - s) * 4 + 8)) return TOK_ENOMEM;
    *ns = a->len;
    const char *src = a->p + s;
    size_t n = e - s;
    if (ps->type == PRE_PREFIX_SPACE) {
        if (n == 0 || src[0] != ' ') a->p[a->len++] = ' ';
        memcpy(a->p + a->len, src, n);
        a->len += n;
        return TOK_OK;
    }
    int starts = n >= ps->rep_len && !memcmp(src, ps->rep, ps->rep_len);
    if (!starts && n > 0 && src[0] == ' ') starts = 1; /* it will be replaced */
    if (!starts && (ps->prepend == PREPEND_ALWAYS || (ps->prepend == PREPEND_FIRST && origin))) {
        memcpy(a->p + a->len, ps->rep, ps->rep_len);
        a->len += ps->rep_len;
    }
    for (size_t i = 0; i < n; i++) {
        if (src[i] == ' ') {
            memcpy(a->p + a->len, ps->rep, ps->rep_len);
            a->len += ps->rep_len;
        } else {
            a->p[a->len++] = src[i];
        }
    }
    return TOK_OK;
}

/* Pre-tokenize and BPE one normalized segment (no added tokens inside).
 * origin: the segment starts at offset 0 of the original text. */
static int encode_plain(const tok_tokenizer *t, const char *s, size_t n, int origin, idvec *out,
                        scratch *sc, char *err, size_t errlen) {
    if (n == 0) return TOK_OK;
    if (t->n_pre == 0) return bpe_cached(t, s, n, out, sc);
    int rc;
    size_t before = out->n;
    if (t->n_pre == 1 && t->pre[0].type == PRE_REGEX && t->pre[0].behavior == SPLIT_ISOLATED &&
        !t->pre[0].invert) {
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
    /* The pieces live in an arena so that rewriting steps can add text. */
    sc->arena.len = 0;
    if (tok_buf_append(&sc->arena, s, n)) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    size_t np = 0;
    if (spans_push(sc, 0, &np, 0, n)) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    sc->spans[0][0].origin = origin;
    int cur = 0;
    for (int k = 0; k < t->n_pre; k++) {
        const pre_step *ps = &t->pre[k];
        size_t nn = 0;
        for (size_t i = 0; i < np; i++) {
            struct span sp = sc->spans[cur][i];
            if (sp.e == sp.s) continue; /* HF drops empty pieces */
            if (ps->type != PRE_REGEX) {
                size_t ns;
                if (arena_rewrite(ps, sc, sp.s, sp.e, sp.origin, &ns))
                    return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
                sp.s = ns;
                sp.e = sc->arena.len;
                if (ps->type == PRE_PREFIX_SPACE || !ps->msplit) {
                    if (spans_push(sc, !cur, &nn, sp.s, sp.e))
                        return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
                    sc->spans[!cur][nn - 1].origin = sp.origin;
                    continue;
                }
            }
            if ((rc = split_step(ps, sc->md[k], sc->arena.p, sp.s, sp.e, sp.origin, sc, !cur, &nn, err,
                                 errlen)))
                return rc;
        }
        np = nn;
        cur = !cur;
    }
    /* The fast path may have emitted a prefix before bailing out. */
    out->n = before;
    for (size_t i = 0; i < np; i++) {
        struct span sp = sc->spans[cur][i];
        if (sp.e > sp.s && (rc = bpe_cached(t, sc->arena.p + sp.s, sp.e - sp.s, out, sc))) return rc;
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

static int is_ws(uint32_t cp);
static uint32_t last_cp(const char *s, size_t n, size_t *start);

/* Rust's char::to_lowercase per character (HF's Lowercase): the simple
 * mapping, except U+0130 which lowercases to "i" + U+0307. */
static int lowercase(const char *s, size_t n, tok_buf *out) {
    out->len = 0;
    if (tok_buf_reserve(out, n + 8)) return TOK_ENOMEM;
    for (size_t i = 0; i < n;) {
        uint32_t cp = utf8_next((const unsigned char *)s, &i);
        utf8proc_uint8_t enc[8];
        utf8proc_ssize_t k;
        if (cp == 0x130) {
            k = 3;
            memcpy(enc, "i\xCC\x87", 3);
        } else {
            k = utf8proc_encode_char(utf8proc_tolower((utf8proc_int32_t)cp), enc);
        }
        if (tok_buf_append(out, enc, (size_t)k)) return TOK_ENOMEM;
    }
    return TOK_OK;
}

static int replace_all(const norm_step *ns, pcre2_match_data *md, const char *s, size_t n,
                       tok_buf *out) {
    out->len = 0;
    if (tok_buf_reserve(out, n)) return TOK_ENOMEM;
    size_t pos = 0, copied = 0;
    pre_step fake = {.re = ns->re, .jit = ns->jit};
    while (pos <= n) {
        size_t ms, me;
        int r = regex_next(&fake, md, s, n, pos, &ms, &me);
        if (r < 0) return TOK_EINVAL;
        if (!r) break;
        if (me == ms) {
            /* An empty match replaces nothing; step one character. */
            if (me >= n) break;
            size_t k = me + 1;
            while (k < n && ((unsigned char)s[k] & 0xC0) == 0x80) k++;
            pos = k;
            continue;
        }
        if (tok_buf_append(out, s + copied, ms - copied) || tok_buf_append(out, ns->content, ns->clen))
            return TOK_ENOMEM;
        copied = pos = me;
    }
    return tok_buf_append(out, s + copied, n - copied);
}

/* Run the normalizer steps. *origin is cleared when Strip removes the
 * start of the text (HF then no longer sees offset 0 there). */
static int normalize(const tok_tokenizer *t, const char *s, size_t n, const char **outp,
                     size_t *outn, int *origin, scratch *sc, char *err, size_t errlen) {
    *outp = s;
    *outn = n;
    for (int i = 0; i < t->n_norm; i++) {
        const norm_step *ns = &t->norm[i];
        tok_buf *dst = &sc->norm[i & 1];
        int rc = TOK_OK;
        switch (ns->type) {
        case NORM_UNICODE:
            rc = normalize_one(ns->opt, *outp, *outn, dst, err, errlen);
            if (rc) return rc;
            break;
        case NORM_LOWER:
            rc = lowercase(*outp, *outn, dst);
            break;
        case NORM_REPLACE:
            if (!sc->nmd[i] && !(sc->nmd[i] = pcre2_match_data_create_from_pattern(ns->re, NULL)))
                rc = TOK_ENOMEM;
            else rc = replace_all(ns, sc->nmd[i], *outp, *outn, dst);
            if (rc == TOK_EINVAL) return tok_err(err, errlen, rc, "normalizer Replace: regex match failed");
            break;
        case NORM_PREPEND:
            dst->len = 0;
            if (*outn && (tok_buf_append(dst, ns->content, ns->clen) || tok_buf_append(dst, *outp, *outn)))
                rc = TOK_ENOMEM;
            break;
        case NORM_STRIP: {
            size_t a = 0, b = *outn;
            while (ns->left && a < b) {
                size_t j = a;
                if (!is_ws(utf8_next((const unsigned char *)*outp, &j))) break;
                a = j;
            }
            while (ns->right && b > a) {
                size_t ps;
                if (!is_ws(last_cp(*outp, b, &ps))) break;
                b = ps;
            }
            if (a > 0) *origin = 0;
            dst->len = 0;
            rc = tok_buf_append(dst, *outp + a, b - a);
            break;
        }
        }
        if (rc) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        *outp = dst->p ? dst->p : "";
        *outn = dst->len;
    }
    return TOK_OK;
}

/* HF matches "normalized" added tokens by their normalized content. */
static int normalize_added(tok_tokenizer *t) {
    scratch sc;
    memset(&sc, 0, sizeof sc);
    int rc = TOK_OK;
    for (size_t i = 0; i < t->n_added && rc == TOK_OK; i++) {
        added_tok *a = &t->added[i];
        if (!a->normalized || t->n_norm == 0) continue;
        const char *ns;
        size_t nn;
        int origin = 1;
        char err[8];
        if ((rc = normalize(t, a->s, a->len, &ns, &nn, &origin, &sc, err, sizeof err))) break;
        a->m = malloc(nn ? nn : 1);
        if (!a->m) {
            a->m = a->s;
            rc = TOK_ENOMEM;
            break;
        }
        memcpy(a->m, ns, nn);
        a->mlen = nn;
    }
    for (int k = 0; k < MAX_NORM; k++) pcre2_match_data_free(sc.nmd[k]);
    free(sc.norm[0].p);
    free(sc.norm[1].p);
    return rc;
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
            if (a->mlen && a->mlen <= n - i && !memcmp(s + i, a->m, a->mlen) &&
                (!best || a->mlen > best->mlen))
                best = a;
        }
        if (!best) continue;
        size_t st = i, en = i + best->mlen;
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

/* One piece between added tokens, normalized: ByteLevel's add_prefix_space
 * (when ByteLevel comes first) then the pre-tokenizers and BPE. */
static int encode_piece(const tok_tokenizer *t, const char *s, size_t n, int origin, idvec *out,
                        scratch *sc, char *err, size_t errlen) {
    if (t->prefix_space && n > 0 && s[0] != ' ') {
        /* Rare (GPT-2 style add_prefix_space): copy with the space. */
        char *p = malloc(n + 1);
        if (!p) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        p[0] = ' ';
        memcpy(p + 1, s, n);
        int rc = encode_plain(t, p, n + 1, origin, out, sc, err, errlen);
        free(p);
        return rc;
    }
    return encode_plain(t, s, n, origin, out, sc, err, errlen);
}

static int encode_segment(const tok_tokenizer *t, const char *s, size_t n, int origin, idvec *out,
                          scratch *sc, char *err, size_t errlen) {
    const char *ns;
    size_t nn;
    int rc = normalize(t, s, n, &ns, &nn, &origin, sc, err, errlen);
    if (rc) return rc;
    if (!t->has_normalized_added) return encode_piece(t, ns, nn, origin, out, sc, err, errlen);
    /* Tokens flagged "normalized" are matched in the normalized text. */
    char *copy = malloc(nn ? nn : 1);
    if (!copy) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    memcpy(copy, ns, nn);
    size_t pos = 0, ms, me;
    int32_t id;
    while (rc == TOK_OK && next_added(t, copy, nn, pos, pos, 2, &ms, &me, &id)) {
        if (ms > pos) rc = encode_piece(t, copy + pos, ms - pos, origin && pos == 0, out, sc, err, errlen);
        if (rc == TOK_OK && idvec_push(out, id)) rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        pos = me;
    }
    if (rc == TOK_OK && pos < nn) rc = encode_piece(t, copy + pos, nn - pos, origin && pos == 0, out, sc, err, errlen);
    free(copy);
    return rc;
}

static int encode_bpe(const tok_tokenizer *t, const char *text, size_t len, idvec *out, char *err,
                      size_t errlen) {
    scratch sc;
    memset(&sc, 0, sizeof sc);
    int rc = TOK_OK;
    for (int k = 0; k < t->n_pre; k++) {
        if (!t->pre[k].re) continue;
        sc.md[k] = pcre2_match_data_create_from_pattern(t->pre[k].re, NULL);
        if (!sc.md[k]) {
            rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
            goto done;
        }
    }
    size_t pos = 0, ms, me;
    int32_t id;
    while (next_added(t, text, len, pos, pos, 1, &ms, &me, &id)) {
        if (ms > pos && (rc = encode_segment(t, text + pos, ms - pos, pos == 0, out, &sc, err, errlen)))
            goto done;
        if (idvec_push(out, id)) goto oom;
        pos = me;
    }
    if (pos < len && (rc = encode_segment(t, text + pos, len - pos, pos == 0, out, &sc, err, errlen)))
        goto done;
    goto done;
oom:
    rc = tok_err(err, errlen, TOK_ENOMEM, "out of memory");
done:
    for (int k = 0; k < MAX_PRE; k++) pcre2_match_data_free(sc.md[k]);
    for (int k = 0; k < MAX_NORM; k++) pcre2_match_data_free(sc.nmd[k]);
    free(sc.arena.p);
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
    int by_token = tok_first_by_token(t), first = 1;
    for (size_t i = 0; i < n_ids && rc == TOK_OK; i++) {
        const char *p;
        size_t n;
        if (tok_id_bytes(t, ids[i], skip_special, by_token ? first : raw.len == 0, &p, &n) == 0) {
            rc = tok_buf_append(&raw, p, n);
            first = 0;
        }
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
