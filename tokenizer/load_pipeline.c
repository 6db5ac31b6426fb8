/*
 * The pipeline sections of a tokenizer.json (normalizer, pre_tokenizer,
 * post_processor, decoder) turned into the steps encode and decode run;
 * anything not modelled is refused with a message naming it.
 */
#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

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
    const char *re = tok_jstr(pat, "Regex"), *lit = tok_jstr(pat, "String");
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

/* One pipeline stage that is not a Sequence, its "type" already read. */
typedef int (*stage_fn)(tok_tokenizer *t, json_t *s, const char *type, void *ctx, char *err, size_t errlen);

/* A pipeline section as tokenizer.json writes it: null (nothing), one
 * {"type": ...} stage, or a "Sequence" whose array `key` lists stages.
 * Calls one() on each stage in order and stops at the first error. A flat
 * section (the decoder) takes no Sequence inside a Sequence: its items go
 * to one() as they are, null and "Sequence" included, and one() refuses. */
static int walk_stages(tok_tokenizer *t, json_t *s, const char *what, const char *key, int flat, stage_fn one,
                       void *ctx, char *err, size_t errlen) {
    if (!s || json_is_null(s)) return TOK_OK;
    const char *type = tok_jstr(s, "type");
    if (!type) return tok_err(err, errlen, TOK_EFORMAT, "%s: missing \"type\"", what);
    if (strcmp(type, "Sequence") != 0) return one(t, s, type, ctx, err, errlen);
    json_t *arr = json_object_get(s, key);
    if (!json_is_array(arr)) return tok_err(err, errlen, TOK_EFORMAT, "%s Sequence: missing array", what);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        const char *vt = flat ? tok_jstr(v, "type") : NULL;
        if (flat && !vt) return tok_err(err, errlen, TOK_EFORMAT, "%s: missing \"type\"", what);
        int rc = flat ? one(t, v, vt, ctx, err, errlen) : walk_stages(t, v, what, key, 0, one, ctx, err, errlen);
        if (rc) return rc;
    }
    return TOK_OK;
}

static int normalizer_one(tok_tokenizer *t, json_t *n, const char *type, void *ctx, char *err, size_t errlen) {
    (void)ctx;
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
        ns->left = tok_jbool(n, "strip_left", 1);
        ns->right = tok_jbool(n, "strip_right", 1);
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

int tok_parse_normalizer(tok_tokenizer *t, json_t *n, char *err, size_t errlen) {
    return walk_stages(t, n, "normalizer", "normalizers", 0, normalizer_one, NULL, err, errlen);
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

/* A step that splits on re, which it owns from here on (freed on failure). */
static pre_step *new_re_step(tok_tokenizer *t, int type, pcre2_code *re, int jit, int behavior, char *err,
                             size_t errlen) {
    pre_step *s = new_pre(t, type, err, errlen);
    if (!s) {
        pcre2_code_free(re);
        return NULL;
    }
    s->re = re;
    s->jit = jit;
    s->behavior = behavior;
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
    pre_step *s = new_re_step(t, PRE_REGEX, re, jit, behavior, err, errlen);
    if (!s) return TOK_EFORMAT;
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

/* ctx: int *mode, 0 nothing yet, 1 ByteLevel seen, 2 Metaspace seen.
 * Splitting after ByteLevel would see the byte alphabet, which we do not
 * model. */
static int pretok_one(tok_tokenizer *t, json_t *p, const char *type, void *ctx, char *err, size_t errlen) {
    int *mode = ctx;
    if (*mode)
        return tok_err(err, errlen, TOK_EFORMAT, "pre_tokenizer %s after %s is not supported", type,
                       *mode == 1 ? "ByteLevel" : "Metaspace");
    if (!strcmp(type, "ByteLevel")) {
        *mode = 1;
        if (tok_jbool(p, "add_prefix_space", 0)) {
            /* Before any split it is one space per segment (fast path);
             * after one, a step that prefixes every piece. */
            if (t->n_pre == 0) t->prefix_space = 1;
            else if (!new_pre(t, PRE_PREFIX_SPACE, err, errlen)) return TOK_EFORMAT;
        }
        if (tok_jbool(p, "use_regex", 1)) return add_regex_step(t, GPT2_PATTERN, SPLIT_ISOLATED, 0, err, errlen);
        return TOK_OK;
    }
    if (!strcmp(type, "Split")) {
        const char *b = tok_jstr(p, "behavior");
        int beh, rc, jit;
        if (!b) return tok_err(err, errlen, TOK_EFORMAT, "Split: missing behavior");
        if (parse_behavior(b, &beh)) return tok_err(err, errlen, TOK_EFORMAT, "Split: unknown behavior '%s'", b);
        pcre2_code *re = compile_pattern(json_object_get(p, "pattern"), "pre-tokenizer Split", &jit, err,
                                         errlen, &rc);
        if (!re) return rc;
        pre_step *s = new_re_step(t, PRE_REGEX, re, jit, beh, err, errlen);
        if (!s) return TOK_EFORMAT;
        s->invert = tok_jbool(p, "invert", 0);
        return TOK_OK;
    }
    if (!strcmp(type, "Digits"))
        return add_regex_step(t, tok_jbool(p, "individual_digits", 0) ? DIGIT_PATTERN : DIGITS_PATTERN,
                              SPLIT_ISOLATED, 0, err, errlen);
    if (!strcmp(type, "Punctuation")) {
        const char *b = tok_jstr(p, "behavior");
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
            (tok_utf8_next((const unsigned char *)rep, &k), k != rl))
            return tok_err(err, errlen, TOK_EFORMAT, "Metaspace: replacement must be one character");
        int prepend = PREPEND_ALWAYS;
        const char *ps = tok_jstr(p, "prepend_scheme");
        if (ps) {
            if (!strcmp(ps, "always")) prepend = PREPEND_ALWAYS;
            else if (!strcmp(ps, "first")) prepend = PREPEND_FIRST;
            else if (!strcmp(ps, "never")) prepend = PREPEND_NEVER;
            else return tok_err(err, errlen, TOK_EFORMAT, "Metaspace: unknown prepend_scheme '%s'", ps);
        } else if (!tok_jbool(p, "add_prefix_space", 1)) {
            prepend = PREPEND_NEVER;
        }
        int rc, jit;
        pcre2_code *re = compile_re(rep, rl, 1, &jit, err, errlen, &rc);
        if (!re) return rc;
        pre_step *s = new_re_step(t, PRE_METASPACE, re, jit, SPLIT_MERGED_NEXT, err, errlen);
        if (!s) return TOK_EFORMAT;
        *mode = 2;
        memcpy(s->rep, rep, rl);
        s->rep_len = rl;
        s->prepend = prepend;
        s->msplit = tok_jbool(p, "split", 1);
        return TOK_OK;
    }
    return tok_err(err, errlen, TOK_EFORMAT, "unsupported pre_tokenizer type '%s'", type);
}

int tok_parse_pretok(tok_tokenizer *t, json_t *p, int *mode, char *err, size_t errlen) {
    return walk_stages(t, p, "pre_tokenizer", "pretokenizers", 0, pretok_one, mode, err, errlen);
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

int tok_push_id(int32_t **ids, size_t *n, int32_t id) {
    int32_t *p = realloc(*ids, (*n + 1) * sizeof **ids);
    if (!p) return TOK_ENOMEM;
    *ids = p;
    p[(*n)++] = id;
    return TOK_OK;
}

static int post_one(tok_tokenizer *t, json_t *p, const char *type, void *ctx, char *err, size_t errlen) {
    (void)ctx;
    if (!strcmp(type, "ByteLevel")) return TOK_OK; /* offsets only */
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
                const char *name = tok_jstr(sp, "id");
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
        if (tok_push_id(&t->post_pre, &t->n_post_pre, (int32_t)json_integer_value(json_array_get(cls, 1))) ||
            tok_push_id(&t->post_suf, &t->n_post_suf, (int32_t)json_integer_value(json_array_get(sep, 1))))
            return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        return TOK_OK;
    }
    return tok_err(err, errlen, TOK_EFORMAT, "unsupported post_processor type '%s'", type);
}

int tok_parse_post(tok_tokenizer *t, json_t *p, char *err, size_t errlen) {
    return walk_stages(t, p, "post_processor", "processors", 0, post_one, NULL, err, errlen);
}

static int decoder_one(tok_tokenizer *t, json_t *d, const char *type, void *ctx, char *err, size_t errlen) {
    dec_info *di = ctx;
    if (!strcmp(type, "Metaspace")) {
        json_t *r = json_object_get(d, "replacement");
        const char *rep = json_is_string(r) ? json_string_value(r) : "\xE2\x96\x81";
        size_t rl = strlen(rep);
        if (rl == 0 || rl >= sizeof di->rep)
            return tok_err(err, errlen, TOK_EFORMAT, "decoder Metaspace: bad replacement");
        memcpy(di->rep, rep, rl + 1);
        di->rep_len = rl;
        const char *ps = tok_jstr(d, "prepend_scheme");
        int never = ps ? !strcmp(ps, "never") : !tok_jbool(d, "add_prefix_space", 1);
        /* HF drops every replacement of the first token; tokens only carry
         * them in front, so that is its leading spaces. */
        t->strip_first = never ? 0 : 1;
        return TOK_OK;
    }
    if (!strcmp(type, "Replace")) {
        const char *from = tok_jstr(json_object_get(d, "pattern"), "String"), *to = tok_jstr(d, "content");
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
        const char *c = tok_jstr(d, "content");
        if (!c || strcmp(c, " ") != 0 || json_integer_value(st) != 1 || json_integer_value(sp) != 0)
            return tok_err(err, errlen, TOK_EFORMAT,
                           "decoder Strip: only content \" \", start 1, stop 0 is supported");
        t->strip_first = 2;
        return TOK_OK;
    }
    return tok_err(err, errlen, TOK_EFORMAT, "unsupported decoder type '%s'", type);
}

int tok_parse_decoder(tok_tokenizer *t, json_t *dec, dec_info *di, char *err, size_t errlen) {
    memset(di, 0, sizeof *di);
    if (!t->char_level) {
        /* A missing decoder has always been read as ByteLevel here. */
        const char *dtype = dec && !json_is_null(dec) ? tok_jstr(dec, "type") : "ByteLevel";
        if (!dtype || strcmp(dtype, "ByteLevel") != 0)
            return tok_err(err, errlen, TOK_EFORMAT, "unsupported decoder type '%s' with ByteLevel",
                           dtype ? dtype : "(missing)");
        return TOK_OK;
    }
    if (!dec || json_is_null(dec))
        return tok_err(err, errlen, TOK_EFORMAT,
                       "no decoder and no ByteLevel pre_tokenizer (tokens joined by spaces) is not "
                       "supported");
    const char *type = tok_jstr(dec, "type");
    if (type && !strcmp(type, "ByteLevel"))
        return tok_err(err, errlen, TOK_EFORMAT, "decoder ByteLevel needs the ByteLevel pre_tokenizer");
    return walk_stages(t, dec, "decoder", "decoders", 1, decoder_one, di, err, errlen);
}

/* Text as the decoder shows it: the replacement character as a space and
 * a "<0xXX>" byte-fallback token as its byte. */
int tok_decoder_surface(const dec_info *di, const char *s, size_t n, tok_buf *out) {
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
