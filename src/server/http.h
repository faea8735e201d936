/* The HTTP layer on libmicrohttpd: one thread per connection, request bodies gathered up to a size limit,
 * routing, API-key check, CORS, and the replies every route uses (JSON, errors in each API's own shape,
 * and generation jobs, streamed or whole). */
#ifndef SLUICE_SERVER_HTTP_H
#define SLUICE_SERVER_HTTP_H

#include <jansson.h>
#include <microhttpd.h>
#include <stddef.h>

#include "server/engine.h"

typedef enum { SV_API_OPENAI, SV_API_ANTHROPIC, SV_API_OLLAMA, SV_API_OTHER } sv_api;

/* A client error: HTTP status, the request field at fault ("" when none) and the message. */
typedef struct sv_error {
    int status;
    char param[96];
    char code[48]; /* OpenAI's error code ("context_length_exceeded"), "" for none */
    char msg[1024];
} sv_error;

/* Fills er and returns -1. */
int sv_bad(sv_error *er, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

typedef struct sv_server_opts {
    const char *host;
    int port;            /* 0: any free port */
    const char *api_key; /* NULL: no authentication */
    size_t max_body;
} sv_server_opts;

typedef struct sv_server {
    sv_engine *g;
    sv_server_opts o;
    struct MHD_Daemon *d;
    int port; /* the bound port */
} sv_server;

typedef struct sv_req {
    sv_server *srv;
    struct MHD_Connection *c;
    const char *method, *url;
    sv_api api;
    char *body;
    size_t body_len;
    int too_big;
    json_t *json; /* the body parsed, for POST routes */
    int status;   /* the reply's status, where there is no connection (sv_http_check) */
} sv_req;

int sv_server_start(sv_server *srv, sv_engine *g, const sv_server_opts *o, sl_err *e);
void sv_server_stop(sv_server *srv);

/* Routes and parses one request as a connection would (body limit, JSON, the API's request parser, the job
 * it builds) without a socket and without running anything: returns the HTTP status of the reply. For
 * tests and fuzzing; srv needs only g and o (no API key: the headers it would be sent in are absent). */
int sv_http_check(sv_server *srv, const char *method, const char *url, const char *body, size_t len);

enum MHD_Result sv_reply(sv_req *r, int status, const char *content_type, const char *body, size_t len);
/* v is decref'd. */
enum MHD_Result sv_reply_json(sv_req *r, int status, json_t *v);
enum MHD_Result sv_reply_error(sv_req *r, const sv_error *er);
/* Queues the job and answers with its output: streamed with content_type as it is generated, or whole
 * once done. 503 with Retry-After when the queue is full. Takes over the caller's reference. */
enum MHD_Result sv_reply_job(sv_req *r, sv_job *j, const char *content_type);

/* Route handlers, one module per API. */
enum MHD_Result sv_openai_chat(sv_req *r);
enum MHD_Result sv_openai_completions(sv_req *r);
enum MHD_Result sv_openai_models(sv_req *r);
enum MHD_Result sv_openai_responses(sv_req *r);
enum MHD_Result sv_anthropic_messages(sv_req *r);
enum MHD_Result sv_anthropic_count_tokens(sv_req *r);
enum MHD_Result sv_ollama_chat(sv_req *r);
enum MHD_Result sv_ollama_generate(sv_req *r);
enum MHD_Result sv_ollama_tags(sv_req *r);
enum MHD_Result sv_ollama_show(sv_req *r);
enum MHD_Result sv_ollama_ps(sv_req *r);
enum MHD_Result sv_ollama_version(sv_req *r);
enum MHD_Result sv_openai_embeddings(sv_req *r);
enum MHD_Result sv_ollama_embed(sv_req *r);
enum MHD_Result sv_ollama_embeddings(sv_req *r);

#endif
