/*
 * server/: the route table, and the request gates that read it. A route is
 * one row of ROUTES (method, path, auth, what it needs loaded, handler);
 * nothing else lists routes. Lookup, 404/405, the API-key check, the
 * readiness gates and dispatch all read the row (docs/architecture.md,
 * "How to add a route").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/internal.h"

enum { GET, POST };                                /* GET also answers HEAD */
enum { KEY, OPEN };                                /* OPEN: served without the API key */
enum { NEEDS_NOTHING, NEEDS_MODEL, NEEDS_ENGINE }; /* see srv_route_dispatch */

struct srv_route {
    int method;
    const char *path; /* exact, or ending in "{id}": any non-empty rest, '/' included */
    int auth;
    int needs;
    srv_handler handle;
    int (*check)(srv_server *s, srv_request *rq, srv_verr *e); /* (optional) the body stage, for srv_fuzz_parse */
};

static enum MHD_Result handle_health(srv_server *s, struct MHD_Connection *c, srv_request *rq);
static enum MHD_Result handle_version(srv_server *s, struct MHD_Connection *c, srv_request *rq);
static enum MHD_Result handle_models(srv_server *s, struct MHD_Connection *c, srv_request *rq);
static enum MHD_Result handle_model_one(srv_server *s, struct MHD_Connection *c, srv_request *rq);
static enum MHD_Result handle_metrics(srv_server *s, struct MHD_Connection *c, srv_request *rq);

/* clang-format off */
static const struct srv_route ROUTES[] = {
    /* method path                   auth  needs          handler                 body stage */
    {POST, "/v1/completions",        KEY,  NEEDS_ENGINE,  srv_handle_completions, srv_check_completions},
    {POST, "/v1/chat/completions",   KEY,  NEEDS_ENGINE,  srv_handle_chat,        srv_check_chat},
    {POST, "/v1/responses",          KEY,  NEEDS_ENGINE,  srv_handle_responses,   srv_check_responses},
    {GET,  "/v1/models",             KEY,  NEEDS_NOTHING, handle_models,          NULL},
    {GET,  "/v1/models/{id}",        KEY,  NEEDS_NOTHING, handle_model_one,       NULL},
    {GET,  "/version",               KEY,  NEEDS_NOTHING, handle_version,         NULL},
    {GET,  "/health",                OPEN, NEEDS_NOTHING, handle_health,          NULL},
    {GET,  "/metrics",               OPEN, NEEDS_NOTHING, handle_metrics,         NULL},
    {POST, "/tokenize",              KEY,  NEEDS_MODEL,   srv_handle_tokenize,    srv_check_tokenize},
    {POST, "/detokenize",            KEY,  NEEDS_MODEL,   srv_handle_detokenize,  srv_check_detokenize},
};
/* clang-format on */

/* The row whose path matches url (len bytes, NULs and all); *arg_at: where
 * its "{id}" starts in url (0 when the path has none). */
static const struct srv_route *route_find(const char *url, size_t len, size_t *arg_at) {
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES; i++) {
        const char *path = ROUTES[i].path, *brace = strchr(path, '{');
        size_t n = brace ? (size_t)(brace - path) : strlen(path);
        if (brace ? len > n && memcmp(url, path, n) == 0 : len == n && memcmp(url, path, n) == 0) {
            *arg_at = brace ? n : 0;
            return &ROUTES[i];
        }
    }
    return NULL;
}

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* MHD passes the raw request target here before it decodes it in place
 * (to a C string, where %00 would end the path early). The path is decoded
 * once, here, with its length: %XX becomes the byte, anything else (a lone
 * '%' included, as MHD does) stays as sent. The return value is the
 * request's con_cls; completed() frees it. */
void *srv_uri_log(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)cls;
    (void)c;
    srv_request *rq = calloc(1, sizeof *rq);
    if (!rq) return NULL;
    rq->uri_len = strlen(uri);
    if (rq->uri_len > SRV_MAX_URI) return rq; /* path NULL: 414 at srv_route_begin */
    size_t n = strcspn(uri, "?");             /* the query is not part of the path, as MHD splits it */
    if (!(rq->path = malloc(n + 1))) return rq;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int hi = uri[i] == '%' && i + 2 < n ? hexval(uri[i + 1]) : -1, lo = hi >= 0 ? hexval(uri[i + 2]) : -1;
        if (lo >= 0) {
            rq->path[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            rq->path[o++] = uri[i];
        }
    }
    rq->path[o] = 0;
    rq->path_len = o;
    return rq;
}

/* "Authorization: Bearer <key>", compared in constant time. */
static int authorized(srv_server *s, struct MHD_Connection *c) {
    if (!s->opt.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7, *want = s->opt.api_key;
    size_t lk = strlen(k), lw = strlen(want);
    unsigned diff = (unsigned)(lk ^ lw);
    for (size_t i = 0; i < lk && i < lw; i++)
        diff |= (unsigned char)(k[i] ^ want[i]);
    return diff == 0;
}

/* Answered before the body is read, so a refused body is never read. */
enum MHD_Result srv_route_begin(srv_server *s, struct MHD_Connection *c, srv_request *rq, const char *url,
                                const char *method) {
    (void)url; /* MHD's decoding of it; rq->path is ours */
    if (!rq->path) {
        char msg[160];
        if (rq->uri_len <= SRV_MAX_URI) return srv_send_error(s, c, 500, "out of memory", NULL);
        snprintf(msg, sizeof msg, "the request target is %zu bytes long; at most %d are accepted", rq->uri_len,
                 SRV_MAX_URI);
        return srv_send_error(s, c, 414, msg, NULL);
    }
    const struct srv_route *r = rq->route = route_find(rq->path, rq->path_len, &rq->arg_at);
    if (r && r->needs == NEEDS_ENGINE) { /* srv_http_stop waits for these to flush */
        rq->counted = 1;
        atomic_fetch_add(&s->http_active, 1);
    }
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), is_post = !strcmp(method, "POST");
    if (!r) return srv_send_error(s, c, 404, "Not Found", NULL);
    if (r->method == POST ? !is_post : !is_get) return srv_send_error(s, c, 405, "Method Not Allowed", NULL);
    if (r->auth == KEY && !authorized(s, c))
        return srv_send_error(s, c, 401, "Unauthorized: missing or invalid API key", NULL);
    if (is_post) {
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long v = strtoull(cl, &end, 10);
            if (end != cl && v > s->opt.max_body_bytes)
                return srv_send_error(s, c, 413, "request body too large", NULL);
        }
    }
    return MHD_YES;
}

/* NEEDS_NOTHING routes answer at once (/health says 503 itself while
 * loading); the others wait for the model (503 until srv_load is done), and
 * NEEDS_ENGINE ones also for an engine that can still run steps. */
enum MHD_Result srv_route_dispatch(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    const struct srv_route *r = rq->route;
    rq->arg = rq->arg_at ? rq->path + rq->arg_at : "";
    rq->arg_len = rq->arg_at ? rq->path_len - rq->arg_at : 0;
    if (r && r->needs == NEEDS_NOTHING) return r->handle(s, c, rq);
    if (!atomic_load(&s->ready))
        return srv_send_error(s, c, 503,
                              atomic_load(&s->accepting) ? "the model is loading; retry when /health is 200"
                                                         : "server is shutting down",
                              NULL);
    if (r && r->needs == NEEDS_ENGINE && !srv_usable(s)) {
        char msg[640];
        snprintf(msg, sizeof msg, "the engine can run no more steps (%s); the server must be restarted",
                 s->unusable_why);
        return srv_send_error(s, c, 503, msg, NULL);
    }
    if (!r) return srv_send_error(s, c, 404, "Not Found", NULL); /* already answered at srv_route_begin */
    return r->handle(s, c, rq);
}

/* The request-body path of the POST routes as their handlers run it (parse,
 * validate, tokenize, build the response object), minus the engine and the
 * network: the row's body stage. */
int srv_fuzz_parse(srv_server *s, const char *path, const char *body, size_t len, char *err, size_t errlen) {
    const struct srv_route *r = NULL;
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES && !r; i++)
        if (ROUTES[i].check && strcmp(ROUTES[i].path, path) == 0) r = &ROUTES[i];
    if (!r) return -1;
    char *copy = malloc(len + 1); /* the handlers own (and may rewrite) their body */
    if (!copy) return -1;
    if (len) memcpy(copy, body, len);
    srv_request rq = {.route = r, .arg = "", .body = copy, .len = len};
    srv_verr e = {0};
    int rc = r->check(s, &rq, &e);
    if (err && errlen) snprintf(err, errlen, "%s", rc ? e.msg : "");
    free(copy);
    return rc ? e.status : 200;
}

/* ---- the routes that need no model ---- */

static enum MHD_Result handle_health(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    (void)rq;
    if (!srv_usable(s)) {
        char *why = NULL;
        int n = asprintf(&why, "engine unusable: %s\n", s->unusable_why);
        return srv_send_buf(s, c, 503, n < 0 ? NULL : why, n < 0 ? 0 : (size_t)n, "text/plain");
    }
    int ok = atomic_load(&s->ready) && atomic_load(&s->accepting);
    return srv_send_buf(s, c, ok ? 200 : 503, strdup(""), 0, "text/plain");
}

static enum MHD_Result handle_version(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    (void)rq;
    return srv_send_json(s, c, 200, json_pack("{s:s}", "version", SRV_VERSION));
}

static json_t *model_json(srv_server *s) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:s,s:n}", "id", s->name, "object", "model", "created",
                          (json_int_t)time(NULL), "owned_by", "echo", "root", s->model_dir, "parent");
    if (m && s->max_model_len) json_object_set_new(m, "max_model_len", json_integer(s->max_model_len));
    return m;
}

static enum MHD_Result handle_models(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    (void)rq;
    return srv_send_json(s, c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(s)));
}

/* GET /v1/models/{id} (the id may hold '/', as "Qwen/Qwen3-8B"). An id
 * that is not UTF-8 text, or holds a NUL, names no model: 404 like any other
 * unknown id, the bad bytes shown as \xNN. */
static enum MHD_Result handle_model_one(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    if (rq->arg_len != strlen(s->name) || memcmp(rq->arg, s->name, rq->arg_len) != 0) {
        char msg[300], q[SRV_QUOTE];
        snprintf(msg, sizeof msg, "The model `%s` does not exist%s.", srv_quote(q, sizeof q, rq->arg, rq->arg_len),
                 srv_utf8_text(rq->arg, rq->arg_len) ? "" : " (the id is not UTF-8 text)");
        return srv_send_error(s, c, 404, msg, "model");
    }
    return srv_send_json(s, c, 200, model_json(s));
}

static enum MHD_Result handle_metrics(srv_server *s, struct MHD_Connection *c, srv_request *rq) {
    (void)rq;
    size_t len;
    char *txt = srv_metrics_render(&s->met, s->name, &len);
    if (!txt) return srv_send_error(s, c, 500, "out of memory", NULL);
    return srv_send_buf(s, c, 200, txt, len, "text/plain; version=0.0.4; charset=utf-8");
}
