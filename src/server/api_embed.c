/* Embeddings: OpenAI POST /v1/embeddings, Ollama POST /api/embed and the older POST /api/embeddings.
 *
 * A decoder embedding model (Qwen3-Embedding) embeds a text as the final-norm hidden state of its last
 * token, L2-normalised. Texts are tokenized with the tokenizer's own special tokens, which is how such a
 * model asks for the end-of-text token it pools on: Qwen3-Embedding's tokenizer.json post-processor
 * appends <|endoftext|> (a GGUF says so with tokenizer.ggml.add_eos_token). Token-id inputs are used as
 * given. `dimensions` keeps the first N values (Matryoshka) and normalises again.
 *
 * Inputs are tokenized and checked on the connection thread; the worker runs each from an empty session
 * (sl_session_hidden) and writes the whole response. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "server/request.h"

#define MAX_INPUTS 2048

typedef enum { EMB_OPENAI, EMB_OLLAMA, EMB_OLLAMA_LEGACY } emb_api;

typedef struct emb_data {
    emb_api api;
    int n;         /* inputs */
    int32_t **ids; /* per input */
    int *len;
    int dims;   /* values kept per vector */
    int base64; /* OpenAI encoding_format */
    long long tokens;
    char *model;
} emb_data;

static void emb_free(void *p) {
    emb_data *d = p;
    if (!d) return;
    for (int i = 0; i < d->n; i++) free(d->ids[i]);
    free(d->ids);
    free(d->len);
    free(d->model);
    free(d);
}

static void b64(const unsigned char *p, size_t n, sv_buf *o) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {t[v >> 18 & 63], t[v >> 12 & 63], i + 1 < n ? t[v >> 6 & 63] : '=', i + 2 < n ? t[v & 63] : '='};
        sv_buf_append(o, q, 4);
    }
}

/* Keeps the first dims values and scales them to unit length (a zero vector stays zero). */
static void normalise(float *v, int dims) {
    double ss = 0;
    for (int i = 0; i < dims; i++) ss += (double)v[i] * v[i];
    if (ss > 0)
        for (int i = 0; i < dims; i++) v[i] = (float)(v[i] / sqrt(ss));
}

static json_t *vector_json(const float *v, int dims, int base64) {
    if (base64) {
        sv_buf o = {0};
        b64((const unsigned char *)v, (size_t)dims * sizeof *v, &o); /* little-endian float32, as OpenAI's */
        json_t *s = json_stringn(o.p ? o.p : "", o.len);
        sv_buf_free(&o);
        return s;
    }
    json_t *a = json_array();
    for (int i = 0; i < dims; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

static void fail_body(sv_job *j, const emb_data *d, int status, const char *msg) {
    j->status = status;
    sv_buf_json(&j->out, d->api == EMB_OPENAI ? json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", msg, "type",
                                                          "server_error", "param", "code")
                                              : json_pack("{s:s}", "error", msg));
}

/* On the worker: every input from an empty session, the last token's hidden state, then the response. */
static void emb_run(sv_job *j, sl_session *s) {
    emb_data *d = j->run_data;
    int H = s->m->cfg.hidden;
    float *h = malloc((size_t)H * sizeof *h);
    json_t *vecs = json_array();
    sl_err e = {{0}};
    double t0 = sl_now();
    if (!h || !vecs) {
        fail_body(j, d, 500, "out of memory");
        goto done;
    }
    for (int i = 0; i < d->n; i++) {
        pthread_mutex_lock(&j->mu);
        int cancelled = j->cancelled;
        pthread_mutex_unlock(&j->mu);
        if (cancelled) goto done;
        sl_session_seq_reset(s, j->seq);
        if (sl_session_seq_hidden(s, j->seq, d->ids[i], d->len[i], h, 0, &e)) {
            char msg[sizeof e.msg + 32];
            snprintf(msg, sizeof msg, "input %d: %s", i, e.msg);
            fail_body(j, d, 500, msg);
            goto done;
        }
        normalise(h, d->dims);
        json_array_append_new(vecs, vector_json(h, d->dims, d->base64));
    }
    json_t *body;
    if (d->api == EMB_OPENAI) {
        json_t *data = json_array();
        for (int i = 0; i < d->n; i++)
            json_array_append_new(data, json_pack("{s:s, s:i, s:O}", "object", "embedding", "index", i, "embedding",
                                                  json_array_get(vecs, (size_t)i)));
        body = json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model", d->model, "usage",
                         "prompt_tokens", (json_int_t)d->tokens, "total_tokens", (json_int_t)d->tokens);
    } else if (d->api == EMB_OLLAMA) {
        body = json_pack("{s:s, s:O, s:I, s:i, s:I}", "model", d->model, "embeddings", vecs, "total_duration",
                         (json_int_t)((sl_now() - j->t_received) * 1e9), "load_duration", 0, "prompt_eval_count",
                         (json_int_t)d->tokens);
    } else {
        json_t *v = json_array_get(vecs, 0);
        body = json_pack("{s:o}", "embedding", v ? json_incref(v) : json_array());
    }
    sv_buf_json(&j->out, body);
    j->st.prompt_tokens = (int)d->tokens;
    j->st.prefill_s = sl_now() - t0;
done:
    json_decref(vecs);
    free(h);
}

/* The ids of one text: the tokenizer's special tokens added; over the context either an error or, when
 * truncate, the first ctx tokens with the last one still the appended end token the model pools on. */
static int tokenize(sv_engine *g, const char *text, size_t len, const char *path, int truncate, int32_t **ids, int *n,
                    sv_error *er) {
    sl_err e;
    if (!len) return sv_bad(er, 400, path, "%s is empty", path);
    if (sl_tokenizer_encode(g->tok, text, len, 1, ids, n, &e)) return sv_bad(er, 400, path, "%s: %s", path, e.msg);
    if (*n <= g->ctx) return 0;
    if (!truncate)
        return sv_bad(er, 400, path, "%s has %d tokens but the context holds %d (truncate is off)", path, *n, g->ctx);
    int32_t *plain = NULL;
    int np = 0;
    if (sl_tokenizer_encode(g->tok, text, len, 0, &plain, &np, &e)) return sv_bad(er, 400, path, "%s: %s", path, e.msg);
    int appended = np > 0 && (*ids)[*n - 1] != plain[np - 1];
    free(plain);
    if (appended) (*ids)[g->ctx - 1] = (*ids)[*n - 1];
    *n = g->ctx;
    return 0;
}

static int token_array(sv_engine *g, json_t *a, const char *path, int32_t **ids, int *n, sv_error *er) {
    size_t k = json_array_size(a), i;
    json_t *v;
    if (!k) return sv_bad(er, 400, path, "%s is empty", path);
    if (k > (size_t)g->ctx) return sv_bad(er, 400, path, "%s has %zu tokens but the context holds %d", path, k, g->ctx);
    if (!(*ids = malloc(k * sizeof **ids))) return sv_bad(er, 500, "", "out of memory");
    json_array_foreach(a, i, v) {
        json_int_t t = json_integer_value(v);
        if (!json_is_integer(v) || t < 0 || t >= g->m->cfg.vocab_size)
            return sv_bad(er, 400, path, "%s[%zu] must be a token id in [0, %d)", path, i, g->m->cfg.vocab_size);
        (*ids)[i] = (int32_t)t;
    }
    *n = (int)k;
    return 0;
}

static int add_input(emb_data *d, int32_t *ids, int n) {
    d->ids[d->n] = ids;
    d->len[d->n++] = n;
    d->tokens += n;
    return 0;
}

/* input: a string, an array of strings, an array of token ids, or an array of those arrays (OpenAI);
 * Ollama takes a string or an array of strings. */
static int parse_inputs(sv_engine *g, json_t *in, const char *field, int tokens_ok, int truncate, emb_data *d,
                        sv_error *er) {
    size_t n = json_is_array(in) ? json_array_size(in) : 1;
    int flat_ids = json_is_array(in) && n && json_is_integer(json_array_get(in, 0));
    if (flat_ids) n = 1;
    if (n > MAX_INPUTS) return sv_bad(er, 400, field, "%s has %zu inputs; at most %d are taken", field, n, MAX_INPUTS);
    if (!(d->ids = calloc(n ? n : 1, sizeof *d->ids)) || !(d->len = calloc(n ? n : 1, sizeof *d->len)))
        return sv_bad(er, 500, "", "out of memory");
    const char *want = tokens_ok ? "a string, an array of strings, an array of token ids or an array of those"
                                 : "a string or an array of strings";
    char path[64];
    int32_t *ids = NULL;
    int len = 0;
    if (json_is_string(in)) {
        if (tokenize(g, json_string_value(in), json_string_length(in), field, truncate, &ids, &len, er)) goto bad;
        return add_input(d, ids, len);
    }
    if (!json_is_array(in) || !json_array_size(in)) return sv_bad(er, 400, field, "%s must be %s", field, want);
    if (flat_ids) {
        if (!tokens_ok) return sv_bad(er, 400, field, "%s must be %s", field, want);
        if (token_array(g, in, field, &ids, &len, er)) goto bad;
        return add_input(d, ids, len);
    }
    size_t i;
    json_t *v;
    json_array_foreach(in, i, v) {
        snprintf(path, sizeof path, "%s[%zu]", field, i);
        if (json_is_string(v)) {
            if (tokenize(g, json_string_value(v), json_string_length(v), path, truncate, &ids, &len, er)) goto bad;
        } else if (tokens_ok && json_is_array(v)) {
            if (token_array(g, v, path, &ids, &len, er)) goto bad;
        } else {
            return sv_bad(er, 400, path, "%s must be %s; %s is not", field, want, path);
        }
        add_input(d, ids, len);
        ids = NULL;
    }
    return 0;
bad:
    free(ids);
    return -1;
}

static int parse_dims(sv_engine *g, json_t *b, emb_data *d, sv_error *er) {
    long long n;
    d->dims = g->m->cfg.hidden;
    int rc = sv_get_int(b, "dimensions", "dimensions", 1, g->m->cfg.hidden, &n, er);
    if (rc < 0) return -1;
    if (rc) d->dims = (int)n;
    return 0;
}

static emb_data *new_data(sv_engine *g, emb_api api) {
    emb_data *d = calloc(1, sizeof *d);
    if (d && !(d->model = strdup(g->name))) {
        free(d);
        return NULL;
    }
    if (d) d->api = api;
    return d;
}

static enum MHD_Result submit(sv_req *r, emb_data *d) {
    sv_job *j = sv_job_new();
    if (!j) {
        emb_free(d);
        return MHD_NO;
    }
    j->run = emb_run;
    j->run_data = d;
    j->run_free = emb_free;
    return sv_reply_job(r, j, "application/json");
}

enum MHD_Result sv_openai_embeddings(sv_req *r) {
    sv_engine *g = r->srv->g;
    sv_error er;
    emb_data *d = new_data(g, EMB_OPENAI);
    if (!d) return MHD_NO;
    const char *fmt = "float";
    json_t *in = json_object_get(r->json, "input");
    if (!in || json_is_null(in)) {
        sv_bad(&er, 400, "input", "input is required: a string, an array of strings or token ids");
        goto bad;
    }
    if (sv_get_string(r->json, "encoding_format", "encoding_format", &fmt, &er) < 0 || parse_dims(g, r->json, d, &er))
        goto bad;
    if (strcmp(fmt, "float") && strcmp(fmt, "base64")) {
        sv_bad(&er, 400, "encoding_format", "encoding_format must be float or base64, got '%s'", fmt);
        goto bad;
    }
    d->base64 = !strcmp(fmt, "base64");
    if (parse_inputs(g, in, "input", 1, 0, d, &er)) goto bad;
    return submit(r, d);
bad:
    emb_free(d);
    return sv_reply_error(r, &er);
}

enum MHD_Result sv_ollama_embed(sv_req *r) {
    sv_engine *g = r->srv->g;
    sv_error er;
    emb_data *d = new_data(g, EMB_OLLAMA);
    if (!d) return MHD_NO;
    int truncate = 1;
    json_t *in = json_object_get(r->json, "input");
    if (sv_get_bool(r->json, "truncate", "truncate", &truncate, &er) < 0 || parse_dims(g, r->json, d, &er)) goto bad;
    /* no input only asks Ollama to load the model */
    if ((!in || json_is_null(in)) ? 0 : parse_inputs(g, in, "input", 0, truncate, d, &er)) goto bad;
    return submit(r, d);
bad:
    emb_free(d);
    return sv_reply_error(r, &er);
}

enum MHD_Result sv_ollama_embeddings(sv_req *r) {
    sv_engine *g = r->srv->g;
    sv_error er;
    emb_data *d = new_data(g, EMB_OLLAMA_LEGACY);
    if (!d) return MHD_NO;
    const char *prompt = "";
    if (sv_get_string(r->json, "prompt", "prompt", &prompt, &er) < 0) goto bad;
    d->dims = g->m->cfg.hidden;
    /* an empty prompt gets an empty embedding, as in Ollama */
    if (*prompt && parse_inputs(g, json_object_get(r->json, "prompt"), "prompt", 0, 1, d, &er)) goto bad;
    return submit(r, d);
bad:
    emb_free(d);
    return sv_reply_error(r, &er);
}
