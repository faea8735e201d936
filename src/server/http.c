#include "server/http.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/util.h"
#include "text/utf8_cut.h"

/* Connection limits against clients that hold connections open (slowloris): all clients together, one
 * address, and the seconds a connection may sit idle (headers or body not arriving, keep-alive with no next
 * request). While a request is generating the timeout is off: the reply itself may take minutes. One address
 * may hold a quarter of all: a proxy or an agent in front of the server sends everything from one address, and
 * with dozens of requests running plus clients that left (their connections close at the next step) 64 was
 * too few. */
#define SV_MAX_CONNECTIONS 1024u
#define SV_MAX_PER_ADDRESS 256u
#define SV_IDLE_TIMEOUT_S 15u

int sv_bad(sv_error *er, int status, const char *param, const char *fmt, ...) {
    er->status = status;
    snprintf(er->param, sizeof er->param, "%s", param ? param : "");
    er->code[0] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(er->msg, sizeof er->msg, fmt, ap);
    va_end(ap);
    /* messages quote what the client sent, and a URL is percent-decoded to arbitrary bytes ("/v1/models/%ff");
     * jansson refuses strings that are not UTF-8, and the error reply would become a 500 */
    sl_utf8_scrub(er->param);
    sl_utf8_scrub(er->msg);
    return -1;
}

static void count_error(sv_req *r, int status) {
    if (status < 400) return;
    pthread_mutex_lock(&r->srv->g->mu);
    r->srv->g->met.errors++;
    pthread_mutex_unlock(&r->srv->g->mu);
}

static void add_cors(struct MHD_Response *resp) {
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
}

enum MHD_Result sv_reply(sv_req *r, int status, const char *content_type, const char *body, size_t len) {
    if (!r->c) { /* a request checked without a connection (sv_http_check): only the status is kept */
        r->status = status;
        return MHD_YES;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    if (content_type) MHD_add_response_header(resp, "Content-Type", content_type);
    add_cors(resp);
    if (status == 503) MHD_add_response_header(resp, "Retry-After", "1");
    count_error(r, status);
    enum MHD_Result rc = MHD_queue_response(r->c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

enum MHD_Result sv_reply_json(sv_req *r, int status, json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!s) return sv_reply(r, 500, "application/json", "{\"error\":\"out of memory\"}", 25);
    enum MHD_Result rc = sv_reply(r, status, "application/json", s, strlen(s));
    free(s);
    return rc;
}

static const char *openai_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static const char *anthropic_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

enum MHD_Result sv_reply_error(sv_req *r, const sv_error *er) {
    json_t *v;
    switch (r->api) {
    case SV_API_ANTHROPIC:
        v = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", anthropic_type(er->status), "message",
                      er->msg);
        break;
    case SV_API_OLLAMA: v = json_pack("{s:s}", "error", er->msg); break;
    default:
        v = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", er->msg, "type", openai_type(er->status), "param",
                      er->param[0] ? json_string(er->param) : json_null(), "code",
                      er->code[0] ? json_string(er->code) : json_null());
    }
    return sv_reply_json(r, er->status, v);
}

/* A client that closed its end of the connection (checked while its request waits or streams). */
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static void wait_a_while(sv_job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

typedef struct stream_ctx {
    sv_job *j;
    int fd;
} stream_ctx;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *sc = cls;
    sv_job *j = sc->j;
    pthread_mutex_lock(&j->mu);
    while (!j->out.len && !j->done && !j->cancelled) {
        wait_a_while(j);
        if (!j->out.len && !j->done && client_gone(sc->fd)) j->cancelled = 1;
    }
    if (j->out.len) {
        size_t n = j->out.len < max ? j->out.len : max;
        memcpy(buf, j->out.p, n);
        sv_buf_consume(&j->out, n);
        pthread_mutex_unlock(&j->mu);
        return (ssize_t)n;
    }
    int cancelled = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return cancelled ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
}

/* The response is gone (sent, or the connection closed): a generation still running is cancelled. */
static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    pthread_mutex_lock(&sc->j->mu);
    if (!sc->j->done) sc->j->cancelled = 1;
    pthread_mutex_unlock(&sc->j->mu);
    sv_job_release(sc->j);
    free(sc);
}

enum MHD_Result sv_reply_job(sv_req *r, sv_job *j, const char *content_type) {
    sv_engine *g = r->srv->g;
    if (!r->c) { /* checked only: the job was built, nothing runs */
        sv_job_release(j);
        r->status = 200;
        return MHD_YES;
    }
    j->t_received = sl_now();
    snprintf(j->route, sizeof j->route, "%s %s", r->method, r->url);
    if (sv_engine_submit(g, j)) {
        sv_job_release(j);
        sv_error er;
        sv_bad(&er, 503, "", "the server is busy: %d requests are already waiting; retry later", g->q_cap);
        return sv_reply_error(r, &er);
    }
    int fd = conn_fd(r->c);
    /* generation may outlast any idle timeout; a client that leaves is seen by client_gone instead */
    MHD_set_connection_option(r->c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (j->stream) {
        stream_ctx *sc = malloc(sizeof *sc);
        struct MHD_Response *resp =
            sc ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, sc, stream_free) : NULL;
        if (!resp) {
            free(sc);
            pthread_mutex_lock(&j->mu);
            j->cancelled = 1;
            pthread_mutex_unlock(&j->mu);
            sv_job_release(j);
            return MHD_NO;
        }
        sc->j = j;
        sc->fd = fd;
        MHD_add_response_header(resp, "Content-Type", content_type);
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        add_cors(resp);
        enum MHD_Result rc = MHD_queue_response(r->c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return rc;
    }
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        wait_a_while(j);
        if (!j->done && !j->cancelled && client_gone(fd)) j->cancelled = 1;
    }
    int gone = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    enum MHD_Result rc = MHD_NO;
    if (!gone) rc = sv_reply(r, j->status, content_type, j->out.p ? j->out.p : "", j->out.len);
    sv_job_release(j);
    return rc;
}

/* ---- routing ---- */

static enum MHD_Result health(sv_req *r) {
    int ok = sv_engine_ready(r->srv->g);
    return sv_reply_json(r, ok ? 200 : 503, json_pack("{s:s}", "status", ok ? "ok" : "loading"));
}

static enum MHD_Result metrics(sv_req *r) {
    sv_buf b = {0};
    sv_engine_metrics(r->srv->g, &b);
    enum MHD_Result rc = b.oom ? sv_reply(r, 500, "text/plain", "out of memory\n", 14)
                               : sv_reply(r, 200, "text/plain; version=0.0.4", b.p ? b.p : "", b.len);
    sv_buf_free(&b);
    return rc;
}

/* Ollama clients probe the root for this exact line. */
static enum MHD_Result root(sv_req *r) {
    return sv_reply(r, 200, "text/plain; charset=utf-8", "Ollama is running", 17);
}

typedef struct route {
    const char *method, *path;
    sv_api api;
    int needs_model, prefix;
    enum MHD_Result (*fn)(sv_req *r);
} route;

static const route routes[] = {
    {"GET", "/health", SV_API_OTHER, 0, 0, health},
    {"GET", "/metrics", SV_API_OTHER, 0, 0, metrics},
    {"GET", "/", SV_API_OLLAMA, 0, 0, root},
    {"HEAD", "/", SV_API_OLLAMA, 0, 0, root},
    {"POST", "/v1/chat/completions", SV_API_OPENAI, 1, 0, sv_openai_chat},
    {"POST", "/v1/completions", SV_API_OPENAI, 1, 0, sv_openai_completions},
    {"GET", "/v1/models", SV_API_OPENAI, 1, 0, sv_openai_models},
    {"GET", "/v1/models/", SV_API_OPENAI, 1, 1, sv_openai_models},
    {"POST", "/v1/responses", SV_API_OPENAI, 1, 0, sv_openai_responses},
    {"POST", "/v1/messages", SV_API_ANTHROPIC, 1, 0, sv_anthropic_messages},
    {"POST", "/v1/messages/count_tokens", SV_API_ANTHROPIC, 1, 0, sv_anthropic_count_tokens},
    {"POST", "/api/chat", SV_API_OLLAMA, 1, 0, sv_ollama_chat},
    {"POST", "/api/generate", SV_API_OLLAMA, 1, 0, sv_ollama_generate},
    {"GET", "/api/tags", SV_API_OLLAMA, 1, 0, sv_ollama_tags},
    {"POST", "/api/show", SV_API_OLLAMA, 1, 0, sv_ollama_show},
    {"GET", "/api/ps", SV_API_OLLAMA, 1, 0, sv_ollama_ps},
    {"GET", "/api/version", SV_API_OLLAMA, 0, 0, sv_ollama_version},
    {"POST", "/v1/embeddings", SV_API_OPENAI, 1, 0, sv_openai_embeddings},
    {"POST", "/api/embed", SV_API_OLLAMA, 1, 0, sv_ollama_embed},
    {"POST", "/api/embeddings", SV_API_OLLAMA, 1, 0, sv_ollama_embeddings},
};
#define N_ROUTES (int)(sizeof routes / sizeof routes[0])

static int path_matches(const route *rt, const char *url) {
    if (rt->prefix) return !strncmp(url, rt->path, strlen(rt->path)) && url[strlen(rt->path)];
    return !strcmp(url, rt->path);
}

static sv_api api_of(const char *url) {
    if (!strncmp(url, "/api/", 5)) return SV_API_OLLAMA;
    if (!strncmp(url, "/v1/messages", 12)) return SV_API_ANTHROPIC;
    if (!strncmp(url, "/v1/", 4)) return SV_API_OPENAI;
    return SV_API_OTHER;
}

static int key_ok(sv_req *r) {
    const char *want = r->srv->o.api_key;
    if (!want || !*want) return 1;
    if (!r->c) return 0;
    const char *got = MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, "x-api-key");
    const char *auth = MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, "Authorization");
    if (!got && auth && !strncasecmp(auth, "Bearer ", 7)) got = auth + 7;
    if (!got) return 0;
    /* compares every byte whatever the first difference, so timing says nothing about the key */
    size_t n = strlen(want), m = strlen(got);
    unsigned diff = (unsigned)(n != m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < m ? got[i] : 0);
    return diff == 0;
}

static enum MHD_Result preflight(sv_req *r) {
    if (!r->c) return sv_reply(r, 204, NULL, "", 0);
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    const char *hdrs = MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    add_cors(resp);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            hdrs ? hdrs : "Authorization, Content-Type, x-api-key, anthropic-version");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "86400");
    enum MHD_Result rc = MHD_queue_response(r->c, 204, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result dispatch(sv_req *r) {
    sv_error er;
    r->api = api_of(r->url);
    if (!strcmp(r->method, "OPTIONS")) return preflight(r);
    const route *rt = NULL;
    int path_known = 0;
    for (int i = 0; i < N_ROUTES && !rt; i++) {
        if (!path_matches(&routes[i], r->url)) continue;
        path_known = 1;
        if (!strcmp(routes[i].method, r->method)) rt = &routes[i];
    }
    if (rt) r->api = rt->api;
    pthread_mutex_lock(&r->srv->g->mu);
    r->srv->g->met.requests[r->api]++;
    pthread_mutex_unlock(&r->srv->g->mu);
    if (!rt) {
        if (path_known) {
            sv_bad(&er, 405, "", "%s is not allowed on %s", r->method, r->url);
        } else {
            sv_bad(&er, 404, "", "no route %s %s", r->method, r->url);
        }
        return sv_reply_error(r, &er);
    }
    if (rt->fn != health && !key_ok(r)) {
        sv_bad(&er, 401, "", "missing or wrong API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
        return sv_reply_error(r, &er);
    }
    if (rt->needs_model && !sv_engine_ready(r->srv->g)) {
        sv_bad(&er, 503, "", "the model is still loading");
        return sv_reply_error(r, &er);
    }
    if (!strcmp(r->method, "POST")) {
        if (r->too_big) {
            sv_bad(&er, 413, "", "the request body exceeds the limit of %zu bytes (--max-body)", r->srv->o.max_body);
            return sv_reply_error(r, &er);
        }
        json_error_t je;
        r->json = json_loadb(r->body ? r->body : "", r->body_len, JSON_REJECT_DUPLICATES, &je);
        if (!r->json) {
            sv_bad(&er, 400, "", "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                   je.column);
            return sv_reply_error(r, &er);
        }
        if (!json_is_object(r->json)) {
            sv_bad(&er, 400, "", "the request body must be a JSON object");
            return sv_reply_error(r, &er);
        }
    }
    return rt->fn(r);
}

/* Whether a Content-Length header value exceeds max (a malformed one is left to the body reader). */
static int body_too_big(const char *cl, size_t max) {
    errno = 0;
    char *end;
    unsigned long long n = strtoull(cl, &end, 10);
    if (end == cl || *end || cl[0] == '-') return 0;
    return errno == ERANGE || n > max;
}

static enum MHD_Result reply_too_big(sv_req *r) {
    sv_error er;
    r->too_big = 1;
    r->api = api_of(r->url);
    sv_bad(&er, 413, "", "the request body exceeds the limit of %zu bytes (--max-body)", r->srv->o.max_body);
    return sv_reply_error(r, &er);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    sv_server *srv = cls;
    sv_req *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        r->srv = srv;
        r->c = c;
        r->url = url;
        r->method = method;
        *con_cls = r;
        /* a declared length past the limit is refused before a byte of the body is read */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && body_too_big(cl, srv->o.max_body)) return reply_too_big(r);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!r->too_big && r->body_len + *upload_size > srv->o.max_body) {
            /* a chunked body (no length) is refused as soon as it passes the limit: with a 413 where
               libmicrohttpd lets a reply be queued mid-upload, else (0.9.75) by closing the connection */
            free(r->body);
            r->body = NULL;
            r->body_len = 0;
            r->too_big = 1;
            *upload_size = 0;
            return reply_too_big(r);
        }
        if (!r->too_big) {
            char *p = realloc(r->body, r->body_len + *upload_size + 1);
            if (!p) return MHD_NO;
            memcpy(p + r->body_len, upload, *upload_size);
            r->body = p;
            r->body_len += *upload_size;
            r->body[r->body_len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return dispatch(r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    /* a kept-alive connection waits for its next request under the idle timeout again */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, SV_IDLE_TIMEOUT_S);
    sv_req *r = *con_cls;
    if (!r) return;
    free(r->body);
    json_decref(r->json);
    free(r);
    *con_cls = NULL;
}

int sv_http_check(sv_server *srv, const char *method, const char *url, const char *body, size_t len) {
    sv_req r = {.srv = srv, .method = method, .url = url};
    if (len > srv->o.max_body)
        r.too_big = 1;
    else if (len) {
        if (!(r.body = malloc(len + 1))) return 500;
        memcpy(r.body, body, len);
        r.body[len] = 0;
        r.body_len = len;
    }
    enum MHD_Result rc = dispatch(&r);
    free(r.body);
    json_decref(r.json);
    return rc == MHD_YES ? r.status : 500;
}

int sv_server_start(sv_server *srv, sv_engine *g, const sv_server_opts *o, sl_err *e) {
    memset(srv, 0, sizeof *srv);
    srv->g = g;
    srv->o = *o;
    if (o->port < 0 || o->port > 65535) return sl_fail(e, "--port must be in [0, 65535], got %d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    int grc = getaddrinfo(o->host, NULL, &hints, &ai);
    if (grc) return sl_fail(e, "--host %s: %s", o->host, gai_strerror(grc));
    struct sockaddr_storage sa;
    memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
    int v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (v6)
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)o->port);
    else
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)o->port);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (v6) flags |= MHD_USE_IPv6;
    errno = 0;
    srv->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR, &sa,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_CONNECTION_TIMEOUT,
                              SV_IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT, SV_MAX_CONNECTIONS,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, SV_MAX_PER_ADDRESS, MHD_OPTION_END);
    if (!srv->d)
        return sl_fail(e, "cannot listen on %s port %d%s%s", o->host, o->port, errno ? ": " : "",
                       errno ? strerror(errno) : "");
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di && di->port ? di->port : o->port;
    return 0;
}

void sv_server_stop(sv_server *srv) {
    if (srv->d) MHD_stop_daemon(srv->d);
    srv->d = NULL;
}
