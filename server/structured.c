/*
 * server/: structured outputs — the request fields that constrain a
 * generation to a grammar (OpenAI's response_format, vLLM's
 * structured_outputs and guided_*), their validation, and the grammar/
 * vocabulary built once from the model's tokenizer.
 *
 * One constraint per request: naming two (say response_format json_schema
 * and guided_regex) is a 400 that names both. A JSON schema is checked
 * against the keywords the grammar engine honours before it is compiled:
 * xgrammar ignores the others silently (uniqueItems, not, if/then/else...),
 * and a schema that is not enforced must not look as if it were.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

/* Keywords xgrammar 0.2.9 enforces (json_schema_converter.cc), and the
 * annotations it may ignore without changing what is valid. */
static const char *const SCHEMA_KEYWORDS[] = {
    "type", "properties", "required", "additionalProperties", "unevaluatedProperties", "items", "prefixItems",
    "unevaluatedItems", "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "definitions", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern", "minLength",
    "maxLength", "format", "propertyNames", "patternProperties", "minProperties", "maxProperties", NULL};
static const char *const SCHEMA_ANNOTATIONS[] = {
    "title",    "description", "default",   "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly",   "discriminator", "$defs", "definitions", NULL};
static const char *const SCHEMA_FORMATS[] = {
    "email",    "date", "time", "date-time",     "duration",     "ipv4",         "ipv6",
    "hostname", "uuid", "uri",  "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
    NULL};
/* Keywords that restrict only values of one type: vacuous for the others,
 * so xgrammar's type-specific parser may drop them, but never where the
 * schema names no type (xgrammar then generates any JSON). */
static const char *const SCHEMA_TYPED[] = {
    "required", "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "pattern", "minLength", "maxLength", "format", "propertyNames", "patternProperties", "minProperties",
    "maxProperties", NULL};
static const char *const SCHEMA_COUNTS[] = {"minItems",   "maxItems",      "minLength",
                                            "maxLength",  "minProperties", "maxProperties", NULL};

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

typedef struct bad_list {
    char text[400];
    int n;
} bad_list;

static void bad_add(bad_list *b, const char *what, const char *path) {
    size_t L = strlen(b->text);
    if (b->n++ >= 6 || L + 8 >= sizeof b->text) return;
    snprintf(b->text + L, sizeof b->text - L, "%s%s at %s", L ? "; " : "", what, path);
}

static int type_is(json_t *sch, const char *t) {
    json_t *ty = json_object_get(sch, "type");
    if (json_is_string(ty)) return !strcmp(json_string_value(ty), t);
    if (json_is_array(ty)) {
        size_t i;
        json_t *x;
        json_array_foreach(ty, i, x) if (json_is_string(x) && !strcmp(json_string_value(x), t)) return 1;
    }
    return 0;
}

/* Does JSON value v have JSON-schema type t? */
static int value_has_type(json_t *v, const char *t) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer")) {
        if (json_is_integer(v)) return 1;
        double d = json_is_real(v) ? json_real_value(v) : 0.5;
        return isfinite(d) && d == floor(d);
    }
    return 0;
}

/* v fits the schema's "type" (or it names none). */
static int value_fits_type(json_t *sch, json_t *v) {
    json_t *ty = json_object_get(sch, "type");
    if (json_is_string(ty)) return value_has_type(v, json_string_value(ty));
    if (json_is_array(ty)) {
        size_t i;
        json_t *x;
        json_array_foreach(ty, i, x) if (json_is_string(x) && value_has_type(v, json_string_value(x))) return 1;
        return 0;
    }
    return 1;
}

/*
 * The walk that runs before any compile. It follows local $refs (resolving
 * them as xgrammar does, from the document root) and charges every schema
 * node it reaches to the compile budget, so a chain or fan-out of $refs
 * costs what it will cost xgrammar; and it notes every keyword xgrammar
 * would take without enforcing it. xgrammar interprets a schema object by
 * ONE branch, the first of $ref, const, enum, anyOf, oneOf, allOf, type,
 * object keywords, array keywords, else "any JSON" (json_schema_converter.cc
 * SchemaParser::Parse): a restricting keyword beside the branch that wins
 * is dropped silently, so it is refused here.
 */
typedef struct walker {
    json_t *root;
    bad_list bad;    /* not enforced */
    char budget[200]; /* the first budget exceeded, with its location */
    int nodes, refs, props, enums;
    size_t lit, keys;
    json_t *stack[SRV_SCHEMA_MAX_DEPTH + 2]; /* $ref targets being walked: a cycle is recursion */
    int n_stack;
    char prefix[24]; /* "[i]" when several schemas share the walk */
} walker;

static void over(walker *w, const char *path, const char *fmt, long long lim) {
    if (w->budget[0]) return;
    char what[120];
    snprintf(what, sizeof what, fmt, lim);
    snprintf(w->budget, sizeof w->budget, "%s at %.60s", what, path);
}

/* "#/a/b~1c/0" from the root (JSON pointer, ~0 ~1 and %XX decoded). */
static json_t *resolve_ref(json_t *root, const char *ref) {
    if (strcmp(ref, "#") == 0) return root;
    if (strncmp(ref, "#/", 2) != 0) return NULL;
    json_t *cur = root;
    const char *p = ref + 2;
    char tok[256];
    for (;;) {
        size_t n = 0;
        while (*p && *p != '/') {
            char c = *p++;
            if (c == '~' && (*p == '0' || *p == '1')) {
                c = *p++ == '0' ? '~' : '/';
            } else if (c == '%' && p[0] && p[1]) {
                char hx[3] = {p[0], p[1], 0};
                char *end;
                long x = strtol(hx, &end, 16);
                if (*end == 0) {
                    c = (char)x;
                    p += 2;
                }
            }
            if (n + 1 >= sizeof tok) return NULL;
            tok[n++] = c;
        }
        tok[n] = 0;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            long i = strtol(tok, &end, 10);
            cur = n && *end == 0 && i >= 0 ? json_array_get(cur, (size_t)i) : NULL;
        } else {
            cur = NULL;
        }
        if (!cur) return NULL;
        if (!*p) return cur;
        p++;
    }
}

/* oneOf runs as anyOf in xgrammar unless its branches are disjoint; the
 * proof here is simple: each branch names one type, no two the same (and
 * not both integer and number), or each is a const. */
static int oneof_disjoint(json_t *arr) {
    size_t n = json_array_size(arr), i, j;
    if (n <= 1) return 1;
    for (i = 0; i < n; i++) {
        json_t *a = json_array_get(arr, i);
        if (!json_is_object(a)) return 0;
        json_t *ta = json_object_get(a, "type"), *ca = json_object_get(a, "const");
        if (!json_is_string(ta) && !ca) return 0;
        if (json_object_get(a, "$ref") || json_object_get(a, "anyOf") || json_object_get(a, "oneOf") ||
            json_object_get(a, "allOf") || json_object_get(a, "enum"))
            return 0;
        for (j = 0; j < i; j++) {
            json_t *b = json_array_get(arr, j);
            json_t *tb = json_object_get(b, "type"), *cb = json_object_get(b, "const");
            if (ca && cb) {
                if (json_equal(ca, cb)) return 0;
                continue;
            }
            if (!json_is_string(ta) || !json_is_string(tb)) return 0;
            const char *x = json_string_value(ta), *y = json_string_value(tb);
            if (!strcmp(x, y)) return 0;
            if ((!strcmp(x, "integer") || !strcmp(x, "number")) && (!strcmp(y, "integer") || !strcmp(y, "number")))
                return 0;
        }
    }
    return 1;
}

static void walk(walker *w, json_t *sch, const char *path, int depth);

static void walk_sub(walker *w, json_t *sch, const char *path, const char *k, const char *k2, int depth) {
    char sub[512];
    if (k2)
        snprintf(sub, sizeof sub, "%.300s/%s/%.60s", path, k, k2);
    else
        snprintf(sub, sizeof sub, "%.300s/%s", path, k);
    walk(w, sch, sub, depth + 1);
}

/* A pattern that names a control character: JSON text may hold one only
 * escaped, and xgrammar matches patterns against the raw characters (the
 * grammar layer masks raw control bytes out of JSON, so such a string
 * could never be completed). */
static int pattern_names_control(const char *p) {
    for (; *p; p++) {
        if ((unsigned char)*p < 0x20) return 1;
        if (*p != '\\' || !p[1]) continue;
        char c = *++p;
        if (strchr("tnrfv0c", c)) return 1;
        if (c == 'x' && p[1] && p[2] && (p[1] == '0' || p[1] == '1')) return 1;
        if (c == 'u' && !strncmp(p + 1, "00", 2) && (p[3] == '0' || p[3] == '1')) return 1;
    }
    return 0;
}

static void check_string(walker *w, json_t *sch, const char *path) {
    json_t *mn = json_object_get(sch, "minLength"), *mx = json_object_get(sch, "maxLength");
    json_t *pat = json_object_get(sch, "pattern"), *fmt = json_object_get(sch, "format");
    if ((mn || mx) && pat) bad_add(&w->bad, "'pattern' together with minLength/maxLength", path);
    if ((mn || mx) && fmt) bad_add(&w->bad, "'format' together with minLength/maxLength", path);
    if (pat && fmt) bad_add(&w->bad, "'pattern' together with 'format'", path);
    if (json_is_string(pat)) {
        w->lit += json_string_length(pat);
        if (pattern_names_control(json_string_value(pat)))
            bad_add(&w->bad, "'pattern' that names a control character (JSON escapes them)", path);
    }
}

static void check_object(walker *w, json_t *sch, const char *path) {
    json_t *props = json_object_get(sch, "properties"), *req = json_object_get(sch, "required");
    size_t i;
    json_t *x;
    char what[160];
    if (json_is_object(props)) {
        w->props += (int)json_object_size(props);
        const char *pk;
        json_t *pv;
        json_object_foreach(props, pk, pv) w->keys += strlen(pk);
    }
    if (json_is_array(req)) {
        json_array_foreach(req, i, x) {
            if (!json_is_string(x)) {
                bad_add(&w->bad, "'required' with a non-string entry", path);
                continue;
            }
            json_t *ps = json_is_object(props) ? json_object_get(props, json_string_value(x)) : NULL;
            if (!ps) {
                snprintf(what, sizeof what, "'required' key \"%.60s\" absent from 'properties'",
                         json_string_value(x));
                bad_add(&w->bad, what, path);
            } else if (json_is_false(ps)) {
                snprintf(what, sizeof what, "'required' key \"%.60s\" that 'properties' forbids", json_string_value(x));
                bad_add(&w->bad, what, path);
            }
        }
    } else if (req) {
        bad_add(&w->bad, "'required' that is not an array", path);
    }
}

/* Each keyword of sch known to the grammar engine and well-formed; the
 * enum and const text counted. */
static void check_keywords(walker *w, json_t *sch, const char *path, int depth) {
    char what[200];
    const char *k;
    json_t *v;
    json_object_foreach(sch, k, v) {
        if (!in_list(SCHEMA_KEYWORDS, k) && !in_list(SCHEMA_ANNOTATIONS, k)) {
            snprintf(what, sizeof what, "'%.60s'", k);
            bad_add(&w->bad, what, path);
            continue;
        }
        if (!strcmp(k, "$id") && depth > 0) bad_add(&w->bad, "'$id' below the root ($refs resolve from the root)", path);
        if (!strcmp(k, "format") && (!json_is_string(v) || !in_list(SCHEMA_FORMATS, json_string_value(v)))) {
            snprintf(what, sizeof what, "'format': \"%.40s\"", json_is_string(v) ? json_string_value(v) : "?");
            bad_add(&w->bad, what, path);
        }
        if (in_list(SCHEMA_COUNTS, k) && (!json_is_integer(v) || json_integer_value(v) < 0)) {
            snprintf(what, sizeof what, "'%s' that is not a non-negative integer", k);
            bad_add(&w->bad, what, path);
        }
        if ((!strcmp(k, "minimum") || !strcmp(k, "maximum") || !strcmp(k, "exclusiveMinimum") ||
             !strcmp(k, "exclusiveMaximum")) &&
            !json_is_number(v)) {
            snprintf(what, sizeof what, "'%s' that is not a number", k);
            bad_add(&w->bad, what, path);
        }
        if (!strcmp(k, "multipleOf")) {
            double m = json_is_number(v) ? json_number_value(v) : 0;
            if (!type_is(sch, "integer") || type_is(sch, "number"))
                bad_add(&w->bad, "'multipleOf' on a non-integer", path);
            else if (!json_is_integer(v) || m < 1 || m > 1024)
                bad_add(&w->bad, "'multipleOf' that is not an integer in 1..1024", path);
        }
        if (!strcmp(k, "allOf") && json_array_size(v) > 1) bad_add(&w->bad, "'allOf' with more than one schema", path);
        if (!strcmp(k, "oneOf") && json_is_array(v) && !oneof_disjoint(v))
            bad_add(&w->bad, "'oneOf' whose branches may overlap (xgrammar runs it as anyOf)", path);
        if (!strcmp(k, "enum")) {
            w->enums += (int)json_array_size(v);
            char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            w->lit += t ? strlen(t) : 0;
            free(t);
        }
        if (!strcmp(k, "const")) {
            char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            w->lit += t ? strlen(t) : 0;
            free(t);
        }
    }
}

static void walk(walker *w, json_t *sch, const char *path, int depth) {
    if (w->budget[0]) return;
    if (++w->nodes > SRV_SCHEMA_MAX_NODES)
        return over(w, path, "more than %lld schema nodes (counted after $ref resolution)", SRV_SCHEMA_MAX_NODES);
    if (depth > SRV_SCHEMA_MAX_DEPTH)
        return over(w, path, "nesting deeper than %lld (counted through $refs)", (long long)SRV_SCHEMA_MAX_DEPTH);
    if (json_is_boolean(sch)) return;
    if (!json_is_object(sch)) return bad_add(&w->bad, "a schema that is not an object or boolean", path);
    char what[200];
    const char *k;
    json_t *v;
    check_keywords(w, sch, path, depth);
    /* the branch xgrammar takes, and what it leaves unenforced beside it */
    static const char *const BRANCHES[] = {"$ref", "const", "enum", "anyOf", "oneOf", "allOf", NULL};
    const char *branch = NULL;
    for (int i = 0; BRANCHES[i] && !branch; i++)
        if (json_object_get(sch, BRANCHES[i])) branch = BRANCHES[i];
    json_t *ty = json_object_get(sch, "type");
    if (branch) {
        int is_value = !strcmp(branch, "const") || !strcmp(branch, "enum");
        json_object_foreach(sch, k, v) {
            if (!strcmp(k, branch) || in_list(SCHEMA_ANNOTATIONS, k)) continue;
            if (is_value && !strcmp(k, "type")) continue; /* checked against the values below */
            if (!in_list(SCHEMA_KEYWORDS, k)) continue;   /* already noted */
            snprintf(what, sizeof what, "'%.40s' beside '%s' (xgrammar would ignore it)", k, branch);
            bad_add(&w->bad, what, path);
        }
        if (!strcmp(branch, "const") && !value_fits_type(sch, json_object_get(sch, "const")))
            bad_add(&w->bad, "'const' that contradicts 'type'", path);
        if (!strcmp(branch, "enum")) {
            size_t i;
            json_t *x;
            json_t *en = json_object_get(sch, "enum");
            json_array_foreach(en, i, x) if (!value_fits_type(sch, x)) {
                bad_add(&w->bad, "'enum' value that contradicts 'type'", path);
                break;
            }
        }
    } else if (ty) {
        if (type_is(sch, "string")) check_string(w, sch, path);
        if (type_is(sch, "object")) check_object(w, sch, path);
        if (!json_is_string(ty) && !json_is_array(ty)) bad_add(&w->bad, "'type' that is not a string or array", path);
    } else if (json_object_get(sch, "properties") || json_object_get(sch, "additionalProperties") ||
               json_object_get(sch, "unevaluatedProperties")) {
        check_object(w, sch, path); /* generated as an object: other types' keywords are vacuous */
    } else if (json_object_get(sch, "items") || json_object_get(sch, "prefixItems") ||
               json_object_get(sch, "unevaluatedItems")) {
        /* generated as an array */
    } else {
        json_object_foreach(sch, k, v) if (in_list(SCHEMA_TYPED, k)) {
            snprintf(what, sizeof what, "'%.40s' without 'type' (xgrammar would generate any JSON)", k);
            bad_add(&w->bad, what, path);
        }
    }
    if (w->props > SRV_SCHEMA_MAX_PROPS)
        return over(w, path, "more than %lld properties in all (counted after $ref resolution)", SRV_SCHEMA_MAX_PROPS);
    if (w->enums > SRV_SCHEMA_MAX_ENUM)
        return over(w, path, "more than %lld enum values in all", SRV_SCHEMA_MAX_ENUM);
    if (w->lit > SRV_SCHEMA_MAX_LITERAL)
        return over(w, path, "more than %lld bytes of const, enum and pattern text", SRV_SCHEMA_MAX_LITERAL);
    if (w->keys > SRV_SCHEMA_MAX_KEYS)
        return over(w, path, "more than %lld bytes of property names", SRV_SCHEMA_MAX_KEYS);
    /* the sub-schemas; $defs only through the $refs that reach them */
    json_object_foreach(sch, k, v) {
        if (w->budget[0]) return;
        if (!strcmp(k, "properties") || !strcmp(k, "patternProperties")) {
            if (!json_is_object(v)) continue;
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) walk_sub(w, pv, path, k, pk, depth);
        } else if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf") || !strcmp(k, "allOf") || !strcmp(k, "prefixItems") ||
                   (!strcmp(k, "items") && json_is_array(v))) {
            size_t i;
            json_t *x;
            char ix[24];
            json_array_foreach(v, i, x) {
                snprintf(ix, sizeof ix, "%zu", i);
                walk_sub(w, x, path, k, ix, depth);
            }
        } else if (!strcmp(k, "items") || !strcmp(k, "additionalProperties") || !strcmp(k, "unevaluatedProperties") ||
                   !strcmp(k, "unevaluatedItems") || !strcmp(k, "propertyNames")) {
            walk_sub(w, v, path, k, NULL, depth);
        } else if (!strcmp(k, "$ref")) {
            if (!json_is_string(v)) {
                bad_add(&w->bad, "'$ref' that is not a string", path);
                continue;
            }
            const char *ref = json_string_value(v);
            if (ref[0] != '#') {
                snprintf(what, sizeof what, "remote '$ref' \"%.60s\" (only local \"#/...\" references)", ref);
                bad_add(&w->bad, what, path);
                continue;
            }
            json_t *t = resolve_ref(w->root, ref);
            if (!t) {
                snprintf(what, sizeof what, "'$ref' \"%.60s\" that names no schema in this document", ref);
                bad_add(&w->bad, what, path);
                continue;
            }
            if (++w->refs > SRV_SCHEMA_MAX_REFS)
                return over(w, path, "more than %lld $ref resolutions", SRV_SCHEMA_MAX_REFS);
            int cyc = 0;
            for (int i = 0; i < w->n_stack; i++) cyc |= w->stack[i] == t;
            if (cyc) continue; /* recursion: xgrammar makes it one rule */
            if (w->n_stack >= SRV_SCHEMA_MAX_DEPTH + 1)
                return over(w, path, "nesting deeper than %lld (counted through $refs)", (long long)SRV_SCHEMA_MAX_DEPTH);
            char sub[512];
            snprintf(sub, sizeof sub, "%s%.300s", w->prefix, ref);
            w->stack[w->n_stack++] = t;
            walk(w, t, sub, depth + 1);
            w->n_stack--;
        }
    }
}

int srv_schema_check(json_t *schema, const char *param, srv_verr *e) {
    return srv_schemas_check(&schema, 1, param, e);
}

int srv_schemas_check(json_t *const *schemas, size_t n, const char *param, srv_verr *e) {
    walker *w = calloc(1, sizeof *w);
    if (!w) return srv_fail(e, 500, param, "out of memory");
    for (size_t i = 0; i < n && !w->budget[0]; i++) {
        char at[32] = "#";
        if (n > 1) snprintf(w->prefix, sizeof w->prefix, "[%zu]", i);
        snprintf(at, sizeof at, "%s#", w->prefix);
        w->root = schemas[i];
        w->n_stack = 0;
        walk(w, schemas[i], at, 0);
    }
    int rc = 0;
    if (w->budget[0])
        rc = srv_fail(e, 400, param,
                      "JSON schema over the compile budget: %s (limits in docs/structured-outputs.md)", w->budget);
    else if (w->bad.n)
        rc = srv_fail(e, 400, param, "unsupported JSON schema feature%s: %s%s", w->bad.n > 1 ? "s" : "", w->bad.text,
                      w->bad.n > 6 ? "; ..." : "");
    free(w);
    return rc;
}

/* The grammar vocabulary from the model's tokenizer, built on first use
 * (about a second for a 150k vocabulary) and kept for the server's life. */
static gram_vocab *server_vocab(srv_server *s, srv_verr *e) {
    pthread_mutex_lock(&s->gram_mu);
    if (!s->gvocab && !s->gvocab_failed) {
        size_t n = tok_vocab_size(s->tok), V = (size_t)s->mc.vocab_size;
        if (n > V) n = V; /* ids the model cannot produce are left out */
        const char **p = calloc(n ? n : 1, sizeof *p);
        size_t *len = calloc(n ? n : 1, sizeof *len);
        int32_t stops[16];
        size_t n_stop = 0;
        for (int i = 0; i < s->mc.n_eos && n_stop < 16; i++)
            if (s->mc.eos_ids[i] >= 0 && (size_t)s->mc.eos_ids[i] < n) stops[n_stop++] = s->mc.eos_ids[i];
        char err[256] = "out of memory";
        if (p && len) {
            for (size_t i = 0; i < n; i++)
                if (tok_token_bytes(s->tok, (int32_t)i, &p[i], &len[i]) != 0) len[i] = 0;
            if (gram_vocab_new(p, len, n, V, stops, n_stop, &s->gvocab, err, sizeof err) != GRAM_OK) s->gvocab = NULL;
        }
        free(p);
        free(len);
        if (!s->gvocab) {
            s->gvocab_failed = 1;
            snprintf(s->gvocab_err, sizeof s->gvocab_err, "%s", err);
            srv_log(s, SRV_LOG_ERROR, "structured outputs unavailable: %s", err);
        }
    }
    gram_vocab *v = s->gvocab;
    pthread_mutex_unlock(&s->gram_mu);
    if (!v) srv_fail(e, 500, NULL, "structured outputs are unavailable: %s", s->gvocab_err);
    return v;
}

int srv_compile_constraint(srv_server *s, int client_fd, gram_kind kind, const char *src, size_t len,
                           const char *param, gram_grammar **out, srv_verr *e) {
    gram_vocab *v = server_vocab(s, e);
    if (!v) return -1;
    double sec = 0;
    if (srv_compile_wait(s, v, client_fd, kind, src, len, param, out, &sec, e)) return -1;
    pthread_mutex_lock(&s->met.mu);
    srv_hist_observe(&s->met.grammar_compile, sec);
    pthread_mutex_unlock(&s->met.mu);
    return 0;
}

/* One candidate source of a constraint, as found in the body. */
typedef struct found {
    const char *field; /* for messages: the field that named it */
    gram_kind kind;
    json_t *val;
} found;

static int schema_source(json_t *sch, const char *param, char **src, srv_verr *e) {
    json_t *own = NULL;
    if (json_is_string(sch)) { /* guided_json may be the schema's text */
        json_error_t je;
        own = sch = json_loads(json_string_value(sch), 0, &je);
        if (!sch) return srv_fail(e, 400, param, "'%s' is not valid JSON: %s", param, je.text);
    }
    int rc = -1;
    if (!json_is_object(sch)) {
        srv_fail(e, 400, param, "'%s' must be a JSON schema object", param);
    } else if (!srv_schema_check(sch, param, e)) {
        if (!(*src = json_dumps(sch, JSON_COMPACT)))
            srv_fail(e, 500, param, "out of memory");
        else
            rc = 0;
    }
    json_decref(own);
    return rc;
}

int srv_parse_constraint(srv_server *s, json_t *root, int client_fd, gram_grammar **out, srv_verr *e) {
    *out = NULL;
    found f[8];
    int nf = 0;
    json_t *v;
    if ((v = srv_field(root, "response_format"))) {
        static const char *const rf_known[] = {"type", "json_schema", NULL};
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        const char *ts = json_is_string(t) ? json_string_value(t) : "";
        if (!json_is_object(v) || (strcmp(ts, "text") && strcmp(ts, "json_object") && strcmp(ts, "json_schema")))
            return srv_fail(e, 400, "response_format",
                            "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
        srv_check_known(v, rf_known, "response_format.", e);
        if (!strcmp(ts, "json_object")) {
            f[nf++] = (found){"response_format", GRAM_JSON, NULL};
        } else if (!strcmp(ts, "json_schema")) {
            static const char *const js_known[] = {"name", "schema", "strict", "description", NULL};
            json_t *js = json_object_get(v, "json_schema");
            if (!json_is_object(js))
                return srv_fail(e, 400, "response_format",
                                "'response_format.json_schema' must be an object with a 'schema'");
            srv_check_known(js, js_known, "response_format.json_schema.", e);
            json_t *sch = json_object_get(js, "schema"); /* OpenAI allows none: any JSON object */
            f[nf++] =
                sch ? (found){"response_format", GRAM_JSON_SCHEMA, sch} : (found){"response_format", GRAM_JSON, NULL};
        }
    }
    json_t *so = srv_field(root, "structured_outputs");
    if (so) {
        static const char *const so_known[] = {"json",
                                               "regex",
                                               "choice",
                                               "grammar",
                                               "json_object",
                                               "disable_any_whitespace",
                                               "disable_additional_properties",
                                               "whitespace_pattern",
                                               NULL};
        if (!json_is_object(so))
            return srv_fail(e, 400, "structured_outputs", "'structured_outputs' must be an object");
        srv_check_known(so, so_known, "structured_outputs.", e);
        if ((v = srv_field(so, "json"))) f[nf++] = (found){"structured_outputs.json", GRAM_JSON_SCHEMA, v};
        if ((v = srv_field(so, "regex"))) f[nf++] = (found){"structured_outputs.regex", GRAM_REGEX, v};
        if ((v = srv_field(so, "choice"))) f[nf++] = (found){"structured_outputs.choice", GRAM_CHOICE, v};
        if ((v = srv_field(so, "grammar"))) f[nf++] = (found){"structured_outputs.grammar", GRAM_EBNF, v};
        if ((v = srv_field(so, "json_object")) && json_is_true(v))
            f[nf++] = (found){"structured_outputs.json_object", GRAM_JSON, NULL};
        if (nf == 0) /* else the request would run unconstrained while asking for structure */
            return srv_fail(e, 400, "structured_outputs",
                            "'structured_outputs' names no constraint: give one of json, regex, choice, grammar "
                            "or json_object: true");
    }
    if ((v = srv_field(root, "guided_json"))) f[nf++] = (found){"guided_json", GRAM_JSON_SCHEMA, v};
    if ((v = srv_field(root, "guided_regex"))) f[nf++] = (found){"guided_regex", GRAM_REGEX, v};
    if ((v = srv_field(root, "guided_choice"))) f[nf++] = (found){"guided_choice", GRAM_CHOICE, v};
    if ((v = srv_field(root, "guided_grammar"))) f[nf++] = (found){"guided_grammar", GRAM_EBNF, v};
    if (nf == 0) return 0;
    if (nf > 1) {
        char names[256] = "";
        for (int i = 0; i < nf; i++) {
            size_t L = strlen(names);
            snprintf(names + L, sizeof names - L, "%s'%s'", i ? (i == nf - 1 ? " and " : ", ") : "", f[i].field);
        }
        return srv_fail(e, 400, f[0].field, "one structured-output constraint per request: got %s", names);
    }
    found *c = &f[0];
    char *src = NULL;
    int rc = -1;
    switch (c->kind) {
    case GRAM_JSON: break;
    case GRAM_JSON_SCHEMA:
        if (schema_source(c->val, c->field, &src, e)) return -1;
        break;
    case GRAM_CHOICE: {
        if (!json_is_array(c->val) || json_array_size(c->val) == 0)
            return srv_fail(e, 400, c->field, "'%s' must be a non-empty array of strings", c->field);
        if (json_array_size(c->val) > SRV_CHOICE_MAX)
            return srv_fail(e, 400, c->field, "'%s' has %zu choices: over the compile budget of %lld", c->field,
                            json_array_size(c->val), SRV_CHOICE_MAX);
        size_t i, bytes = 0;
        json_t *x;
        json_array_foreach(c->val, i, x) {
            if (!json_is_string(x) || json_string_length(x) == 0)
                return srv_fail(e, 400, c->field, "'%s' must be a non-empty array of non-empty strings", c->field);
            bytes += json_string_length(x);
        }
        if (bytes > SRV_CHOICE_MAX_BYTES)
            return srv_fail(e, 400, c->field, "'%s' holds %zu bytes of choices: over the compile budget of %lld",
                            c->field, bytes, SRV_CHOICE_MAX_BYTES);
        if (!(src = json_dumps(c->val, JSON_COMPACT))) return srv_fail(e, 500, c->field, "out of memory");
        break;
    }
    default:
        if (!json_is_string(c->val) || json_string_length(c->val) == 0)
            return srv_fail(e, 400, c->field, "'%s' must be a non-empty string", c->field);
        if (json_string_length(c->val) > SRV_GRAMMAR_MAX_BYTES)
            return srv_fail(e, 400, c->field, "'%s' is %zu bytes: over the compile budget of %lld", c->field,
                            json_string_length(c->val), SRV_GRAMMAR_MAX_BYTES);
        if (!(src = strdup(json_string_value(c->val)))) return srv_fail(e, 500, c->field, "out of memory");
        break;
    }
    rc = srv_compile_constraint(s, client_fd, c->kind, src, src ? strlen(src) : 0, c->field, out, e);
    free(src);
    return rc;
}
