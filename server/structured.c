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
    "maxLength", "format", "propertyNames", "patternProperties", "minProperties", "maxProperties",
    /* annotations */
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly",
    "discriminator", NULL};
static const char *const SCHEMA_FORMATS[] = {
    "email",    "date", "time", "date-time",     "duration",     "ipv4",         "ipv6",
    "hostname", "uuid", "uri",  "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
    NULL};

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

/* Walk a schema, noting what xgrammar would not enforce. path is a JSON
 * pointer-like location for the message. */
static void schema_walk(json_t *sch, const char *path, int depth, bad_list *b) {
    if (json_is_boolean(sch)) return;
    if (!json_is_object(sch)) {
        bad_add(b, "a schema that is not an object or boolean", path);
        return;
    }
    if (depth > 32) {
        bad_add(b, "nesting deeper than 32", path);
        return;
    }
    char sub[512];
    const char *k;
    json_t *v;
    json_object_foreach(sch, k, v) {
        if (!in_list(SCHEMA_KEYWORDS, k)) {
            snprintf(sub, sizeof sub, "'%.60s'", k);
            bad_add(b, sub, path);
            continue;
        }
        if (!strcmp(k, "format") && json_is_string(v) && !in_list(SCHEMA_FORMATS, json_string_value(v))) {
            snprintf(sub, sizeof sub, "'format': \"%.40s\"", json_string_value(v));
            bad_add(b, sub, path);
        }
        if (!strcmp(k, "multipleOf") && !type_is(sch, "integer")) bad_add(b, "'multipleOf' on a non-integer", path);
        if (!strcmp(k, "allOf") && json_array_size(v) > 1) bad_add(b, "'allOf' with more than one schema", path);
        /* the sub-schemas */
        if (!strcmp(k, "properties") || !strcmp(k, "patternProperties") || !strcmp(k, "$defs") ||
            !strcmp(k, "definitions")) {
            if (!json_is_object(v)) continue;
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) {
                snprintf(sub, sizeof sub, "%.300s/%s/%.60s", path, k, pk);
                schema_walk(pv, sub, depth + 1, b);
            }
        } else if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf") || !strcmp(k, "allOf") || !strcmp(k, "prefixItems") ||
                   (!strcmp(k, "items") && json_is_array(v))) {
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) {
                snprintf(sub, sizeof sub, "%.300s/%s/%zu", path, k, i);
                schema_walk(x, sub, depth + 1, b);
            }
        } else if (!strcmp(k, "items") || !strcmp(k, "additionalProperties") || !strcmp(k, "unevaluatedProperties") ||
                   !strcmp(k, "unevaluatedItems") || !strcmp(k, "propertyNames")) {
            snprintf(sub, sizeof sub, "%.300s/%s", path, k);
            schema_walk(v, sub, depth + 1, b);
        }
    }
    json_t *mn = json_object_get(sch, "minLength"), *mx = json_object_get(sch, "maxLength");
    if ((mn || mx) && json_object_get(sch, "pattern")) bad_add(b, "'pattern' together with minLength/maxLength", path);
    if ((mn || mx) && json_is_string(json_object_get(sch, "format")))
        bad_add(b, "'format' together with minLength/maxLength", path);
}

int srv_schema_check(json_t *schema, const char *param, srv_verr *e) {
    bad_list b = {{0}, 0};
    schema_walk(schema, "#", 0, &b);
    if (!b.n) return 0;
    return srv_fail(e, 400, param, "unsupported JSON schema feature%s: %s%s", b.n > 1 ? "s" : "", b.text,
                    b.n > 6 ? "; ..." : "");
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

int srv_compile_constraint(srv_server *s, gram_kind kind, const char *src, size_t len, const char *param,
                           gram_grammar **out, srv_verr *e) {
    gram_vocab *v = server_vocab(s, e);
    if (!v) return -1;
    char err[400];
    double sec = 0;
    int rc = gram_compile(v, kind, src, len, out, &sec, err, sizeof err);
    if (rc == GRAM_EINVAL) return srv_fail(e, 400, param, "%s", err);
    if (rc) return srv_fail(e, 500, param, "%s", err);
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

int srv_parse_constraint(srv_server *s, json_t *root, gram_grammar **out, srv_verr *e) {
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
        if (!json_is_array(c->val) || json_array_size(c->val) == 0 || json_array_size(c->val) > 4096)
            return srv_fail(e, 400, c->field, "'%s' must be a non-empty array of strings", c->field);
        size_t i;
        json_t *x;
        json_array_foreach(c->val, i, x) if (!json_is_string(x) || json_string_length(x) == 0) return srv_fail(
            e, 400, c->field, "'%s' must be a non-empty array of non-empty strings", c->field);
        if (!(src = json_dumps(c->val, JSON_COMPACT))) return srv_fail(e, 500, c->field, "out of memory");
        break;
    }
    default:
        if (!json_is_string(c->val) || json_string_length(c->val) == 0)
            return srv_fail(e, 400, c->field, "'%s' must be a non-empty string", c->field);
        if (json_string_length(c->val) > 1 << 20) return srv_fail(e, 400, c->field, "'%s' is too long", c->field);
        if (!(src = strdup(json_string_value(c->val)))) return srv_fail(e, 500, c->field, "out of memory");
        break;
    }
    rc = srv_compile_constraint(s, c->kind, src, src ? strlen(src) : 0, c->field, out, e);
    free(src);
    return rc;
}
