/*
 * server/: the HTTP answers. Each counts its status class in /metrics;
 * 401, 405 and 503 carry WWW-Authenticate, Allow and Retry-After.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

void srv_count_status(srv_server *s, int status) {
    int k = status / 100;
    if (k < 1 || k > 5) return;
    pthread_mutex_lock(&s->met.mu);
    s->met.http_requests[k]++;
    pthread_mutex_unlock(&s->met.mu);
}

enum MHD_Result srv_send_buf(srv_server *s, struct MHD_Connection *c, int status, char *buf, size_t len,
                             const char *ctype) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    srv_conn_arrived(s, c);
    if (status == 405) MHD_add_response_header(resp, "Allow", "GET, POST");
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (status == 503) MHD_add_response_header(resp, "Retry-After", "1");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    srv_count_status(s, status);
    return rc;
}

/* A NULL j is a builder that refused (json_pack: a NULL "o" value or an
 * invalid UTF-8 "s" one) or ran out of memory; json_dumps only fails for
 * memory. Either is logged and answered as the server's own failure, never
 * the client's. */
enum MHD_Result srv_send_json(srv_server *s, struct MHD_Connection *c, int status, json_t *j) {
    char *txt = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!txt) {
        static const char unbuilt[] = "{\"error\":{\"message\":\"internal error: the response could not be "
                                      "built\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}";
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"InternalServerError\","
                                  "\"param\":null,\"code\":500}}";
        srv_log(s, SRV_LOG_ERROR, "a %d answer %s; answering 500", status,
                j ? "could not be serialized (json_dumps: out of memory)"
                  : "could not be built (a JSON builder refused a value or ran out of memory)");
        txt = strdup(j ? oom : unbuilt);
        status = 500;
        if (!txt) return MHD_NO;
    }
    return srv_send_buf(s, c, status, txt, strlen(txt), "application/json");
}

static const char *err_type(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 413: return "RequestTooLargeError";
    case 414: return "URITooLongError";
    case 503: return "ServiceUnavailableError";
    default: return "InternalServerError";
    }
}

/* msg and param pass srv_quote, so no byte of them can make the builder
 * refuse: what is left to fail is memory. */
json_t *srv_error_json(int status, const char *msg, const char *param) {
    char m[1024], p[128];
    srv_quote(m, sizeof m, msg, strlen(msg));
    srv_quote(p, sizeof p, param ? param : "", param ? strlen(param) : 0);
    return json_pack("{s:{s:s,s:s,s:o,s:i}}", "error", "message", m, "type", err_type(status), "param",
                     *p ? json_string(p) : json_null(), "code", status);
}

enum MHD_Result srv_send_error(srv_server *s, struct MHD_Connection *c, int status, const char *msg,
                               const char *param) {
    return srv_send_json(s, c, status, srv_error_json(status, msg, param));
}

enum MHD_Result srv_send_verr(srv_server *s, struct MHD_Connection *c, const srv_verr *e) {
    return srv_send_error(s, c, e->status, e->msg, e->param);
}
