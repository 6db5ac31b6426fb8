/*
 * Private to tokenizer/: shared between its C sources and the SentencePiece
 * C++ wrapper. Not part of the public interface (see tokenizer.h).
 */
#ifndef ECHO_TOKENIZER_INTERNAL_H
#define ECHO_TOKENIZER_INTERNAL_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tok_tokenizer;
struct json_t;

/* ---- buf.c ---- */

/* Format an error message into err and return code. */
int tok_err(char *err, size_t errlen, int code, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Growable byte buffer; tok_buf_append NUL-terminates it. */
typedef struct {
    char *p;
    size_t len, cap;
} tok_buf;
int tok_buf_reserve(tok_buf *b, size_t extra);
int tok_buf_append(tok_buf *b, const void *data, size_t n);

/* ---- utf8.c ---- */

/* Strict UTF-8 validation (Rust's str rules: no overlongs, surrogates or
 * values above U+10FFFF). Returns len when valid, else the offset of the
 * first invalid byte. */
size_t tok_utf8_valid_prefix(const char *s, size_t len);

/* Append the lossy conversion of src to out, Rust from_utf8_lossy rules.
 * When final is 0, a trailing incomplete (but so far valid) sequence is not
 * converted; its length is returned in *held (it is the tail of src).
 * Returns TOK_OK or TOK_ENOMEM. */
int tok_utf8_lossy(const char *src, size_t len, int final, tok_buf *out, size_t *held);

/* The code point at s[*i] of valid UTF-8; advances *i past it. */
static inline uint32_t tok_utf8_next(const unsigned char *s, size_t *i) {
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

/* The last code point of valid UTF-8 s[0, n), n > 0; *start receives its
 * offset. */
uint32_t tok_utf8_last(const char *s, size_t n, size_t *start);

/* Rust's char::is_whitespace (the White_Space property). */
int tok_is_ws(uint32_t cp);

/* ---- sentencepiece.cc: C API over the C++ library ---- */
typedef struct tok_spm tok_spm;
enum { TOK_SPM_NORMAL = 0, TOK_SPM_CONTROL, TOK_SPM_UNKNOWN, TOK_SPM_BYTE, TOK_SPM_USER, TOK_SPM_UNUSED };
int tok_spm_load(const char *path, tok_spm **out, char *err, size_t errlen);
void tok_spm_free(tok_spm *m);
int tok_spm_encode(const tok_spm *m, const char *text, size_t len, int32_t **ids, size_t *n,
                   char *err, size_t errlen);
int tok_spm_decode(const tok_spm *m, const int32_t *ids, size_t n, char **out, size_t *out_len,
                   char *err, size_t errlen);
size_t tok_spm_vocab_size(const tok_spm *m);
int32_t tok_spm_piece_to_id(const tok_spm *m, const char *piece); /* -1 if absent */
/* Malloc'ed copy of the piece text (NULL when id is out of range). */
char *tok_spm_id_to_piece(const tok_spm *m, int32_t id);
int tok_spm_piece_kind(const tok_spm *m, int32_t id);
int32_t tok_spm_bos_id(const tok_spm *m);
int32_t tok_spm_eos_id(const tok_spm *m);
int tok_spm_add_dummy_prefix(const tok_spm *m);

/* ---- the loaded tokenizer ---- */

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

/* Everything is resolved at load time into flat tables so that encode only
 * does hash lookups: token strings are stored as raw bytes (the ByteLevel
 * alphabet undone), merges as a (left id, right id) -> (rank, new id) hash. */
struct tok_tokenizer {
    int kind;
    /* id -> token bytes (the vocab key; the decode surface too unless
     * surf_off is set); len NO_TOKEN when the id is unused */
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

/* FNV-style hash of the vocab keys and pre-token cache words. */
static inline uint64_t tok_hash_bytes(const char *s, size_t n) {
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

static inline uint64_t tok_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Id of raw bytes s[0, n) in the model vocab, or -1. */
static inline int32_t tok_vocab_find(const struct tok_tokenizer *t, const char *s, size_t n) {
    size_t i = tok_hash_bytes(s, n) & t->vocab_mask;
    for (;;) {
        int32_t id = t->vocab_slots[i];
        if (id < 0) return -1;
        if (t->id_len[id] == n && memcmp(t->blob + t->id_off[id], s, n) == 0) return id;
        i = (i + 1) & t->vocab_mask;
    }
}

/* The merge of ids (a, b), or NULL. */
static inline const merge_slot *tok_merge_find(const struct tok_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)b;
    size_t i = tok_mix64(key) & t->merge_mask;
    for (;;) {
        const merge_slot *m = &t->merges[i];
        if (m->key == key) return m;
        if (m->key == 0) return NULL;
        i = (i + 1) & t->merge_mask;
    }
}

/* ---- tokenizer.c ---- */

/* GPT-2's bytes_to_unicode and its inverse for code points < 0x144. */
void tok_byte_level_tables(uint32_t b2u[256], int16_t u2b[0x144]);
/* Vocab string -> the bytes BPE works on (identity for character-level);
 * out holds at least len bytes. */
size_t tok_key_decode(const struct tok_tokenizer *t, const char *s, size_t len, const int16_t u2b[0x144],
                      char *out);

/* ---- load.c, load_pipeline.c: tokenizer.json ---- */

/* A BPE tokenizer from a parsed tokenizer.json (root is not kept). */
int tok_load_json_root(struct json_t *root, struct tok_tokenizer **out, char *err, size_t errlen);
/* o[key] when it is a string / boolean, else NULL / dflt. buf.c. */
const char *tok_jstr(struct json_t *o, const char *key);
int tok_jbool(struct json_t *o, const char *key, int dflt);

/* Decoders we model as a per-token surface string plus a rule for the
 * first token: ByteLevel for byte-level BPE; for character-level BPE,
 * Metaspace or a Sequence of Replace(c -> " "), ByteFallback, Fuse and
 * Strip(" ", 1, 0) (the Llama/Mistral tokenizer.json layout). */
typedef struct {
    char rep[8]; /* character decoded as a space ("" none) */
    size_t rep_len;
    int byte_fallback;
} dec_info;

int tok_parse_normalizer(struct tok_tokenizer *t, struct json_t *n, char *err, size_t errlen);
/* *mode: 0 nothing yet, 1 ByteLevel seen, 2 Metaspace seen. */
int tok_parse_pretok(struct tok_tokenizer *t, struct json_t *p, int *mode, char *err, size_t errlen);
int tok_parse_post(struct tok_tokenizer *t, struct json_t *p, char *err, size_t errlen);
int tok_parse_decoder(struct tok_tokenizer *t, struct json_t *dec, dec_info *di, char *err,
                      size_t errlen);
/* Token text as the decoder shows it, into out (NUL-terminated). */
int tok_decoder_surface(const dec_info *di, const char *s, size_t n, tok_buf *out);
/* Append id to a malloc'ed array. */
int tok_push_id(int32_t **ids, size_t *n, int32_t id);

/* ---- encode: encode.c, normalize.c, pretok.c, bpe.c ---- */

typedef struct {
    int32_t *ids;
    size_t n, cap;
} idvec;
/* Append id (buf.c). */
int tok_idvec_push(idvec *v, int32_t id);

/* Per-call scratch (encode is re-entrant: nothing here is shared). */
typedef struct {
    struct bpe_sym *syms;
    struct bpe_hent *heap;
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

/* Run the normalizer steps on s; *outp points into sc or at s. *origin is
 * cleared when Strip removes the start of the text. */
int tok_normalize(const struct tok_tokenizer *t, const char *s, size_t n, const char **outp,
                  size_t *outn, int *origin, scratch *sc, char *err, size_t errlen);
/* Set each "normalized" added token's match text to its normalized form. */
int tok_normalize_added(struct tok_tokenizer *t);
/* Next match of ps->re in s[off, len): 1 found, 0 none, -1 match error. */
int tok_regex_next(const pre_step *ps, pcre2_match_data *md, const char *s, size_t len, size_t off,
                   size_t *ms, size_t *me);
/* Pre-tokenize and BPE one normalized segment (no added tokens inside).
 * origin: the segment starts at offset 0 of the original text. */
int tok_encode_plain(const struct tok_tokenizer *t, const char *s, size_t n, int origin, idvec *out,
                     scratch *sc, char *err, size_t errlen);
/* BPE of one pre-token, appended to out. */
int tok_bpe_cached(const struct tok_tokenizer *t, const char *w, size_t n, idvec *out, scratch *sc);

#ifdef __cplusplus
}
#endif

#endif
