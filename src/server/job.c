#include "server/job.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sv_job *sv_job_new(void) {
    sv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->status = 200;
    j->block = -1;
    j->lead = j;
    j->n_choices = 1;
    return j;
}

static void job_free(sv_job *j) {
    for (int i = 0; i + 1 < j->n_choices && j->more; i++)
        if (j->more[i]) job_free(j->more[i]);
    free(j->more);
    if (j->lead == j) { /* the other choices borrow these */
        free(j->ids);
        json_decref(j->tools);
        free(j->forced);
    }
    for (int i = 0; i < SV_MAX_STOPS; i++) free(j->stops[i]);
    free(j->force_tool);
    sl_grammar_free(j->grammar);
    json_decref(j->extra);
    json_decref(j->logprobs);
    if (j->run_free) j->run_free(j->run_data);
    sv_buf_free(&j->content);
    sv_buf_free(&j->reasoning);
    for (int i = 0; i < j->n_tools; i++) {
        free(j->tool_calls[i].name);
        sv_buf_free(&j->tool_calls[i].args);
    }
    free(j->tool_calls);
    sv_buf_free(&j->out);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void sv_job_release(sv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) job_free(j);
}

/* Choice i's seed: choice 0 keeps the request's (so its first choice is what n = 1 gives), the others a
 * splitmix64 mix of it and their index. */
static uint64_t choice_seed(uint64_t seed, int i) {
    if (!i) return seed;
    uint64_t st = seed + (uint64_t)(i - 1) * 0x9e3779b97f4a7c15ull; /* the mix of seed + i steps */
    return sl_splitmix64(&st);
}

int sv_job_add_choices(sv_job *j, int n) {
    if (n <= 1) return 0;
    if (n > SV_MAX_CHOICES) return -1;
    if (!(j->more = calloc((size_t)n - 1, sizeof *j->more))) return -1;
    j->n_choices = n;
    for (int i = 1; i < n; i++) {
        sv_job *c = sv_job_new();
        if (!c) return -1;
        j->more[i - 1] = c;
        c->lead = j;
        c->index = i;
        c->w = j->w;
        /* borrowed: the lead outlives its choices (gen.stops and gen.grammar point into it too) */
        c->ids = j->ids;
        c->n_ids = j->n_ids;
        c->tools = j->tools;
        c->forced = j->forced;
        c->gen = j->gen;
        c->gen.sampling.seed = choice_seed(j->gen.sampling.seed, i);
        c->stream = j->stream;
        c->include_usage = j->include_usage;
        c->parse_output = j->parse_output;
        c->starts_in_reasoning = j->starts_in_reasoning;
        c->tool_prefix = j->tool_prefix;
        c->created = j->created;
        memcpy(c->id, j->id, sizeof c->id);
        /* the writer keeps per-choice state there (legacy logprobs' text offset) */
        if (j->extra && !(c->extra = json_copy(j->extra))) return -1;
        if (j->logprobs && sv_job_want_logprobs(c, j->lp_tok, j->gen.top_logprobs)) return -1;
    }
    return 0;
}

sv_job *sv_job_choice(sv_job *lead, int i) {
    return i ? lead->more[i - 1] : lead;
}

void sv_job_emit(sv_job *j, const char *s, size_t n) {
    sv_buf_append(&j->lead->out, s, n);
    pthread_cond_broadcast(&j->lead->cv);
}

void sv_job_sse(sv_job *j, const char *event, json_t *v) {
    sv_buf *o = &j->lead->out;
    if (event) sv_buf_printf(o, "event: %s\n", event);
    sv_buf_puts(o, "data: ");
    sv_buf_json(o, v);
    sv_job_emit(j, "\n\n", 2);
}

void sv_job_ndjson(sv_job *j, json_t *v) {
    sv_buf_json(&j->lead->out, v);
    sv_job_emit(j, "\n", 1);
}

sv_tool *sv_job_tool_start(sv_job *j, const char *name, size_t len) {
    if (j->n_tools == j->cap_tools) {
        int cap = j->cap_tools ? j->cap_tools * 2 : 4;
        sv_tool *t = realloc(j->tool_calls, (size_t)cap * sizeof *t);
        if (!t) return NULL;
        j->tool_calls = t;
        j->cap_tools = cap;
    }
    sv_tool *t = &j->tool_calls[j->n_tools];
    memset(t, 0, sizeof *t);
    if (!(t->name = strndup(name, len))) return NULL;
    const char *pre = j->tool_prefix ? j->tool_prefix : "call_",
               *tail = j->id + (strlen(j->id) > 12 ? strlen(j->id) - 12 : 0);
    if (j->index) /* unique across a request's choices */
        snprintf(t->id, sizeof t->id, "%s%s_%d_%d", pre, tail, j->index, j->n_tools);
    else
        snprintf(t->id, sizeof t->id, "%s%s_%d", pre, tail, j->n_tools);
    j->n_tools++;
    return t;
}

json_t *sv_token_text(const char *b, size_t n) {
    sv_buf o = {0};
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)b[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = k && i + k <= n;
        for (size_t x = 1; ok && x < k; x++) ok = ((unsigned char)b[i + x] & 0xC0) == 0x80;
        if (ok) {
            sv_buf_append(&o, b + i, k);
            i += k;
        } else {
            sv_buf_puts(&o, "\xEF\xBF\xBD");
            i++;
        }
    }
    json_t *v = json_stringn(o.p ? o.p : "", o.len);
    sv_buf_free(&o);
    return v ? v : json_string("\xEF\xBF\xBD"); /* overlong or surrogate forms jansson refuses */
}

/* JSON has no -inf: OpenAI writes -9999 for a token the model rules out. */
static json_t *lp_value(float lp) {
    return json_real(lp > -9999.0f ? (double)lp : -9999.0);
}

static json_t *lp_token(const sl_tokenizer *t, int32_t id, float lp) {
    size_t n = 0;
    const char *b = sl_tokenizer_token_bytes(t, id, &n);
    if (!b) n = 0;
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)b[i]));
    return json_pack("{s:o, s:o, s:o}", "token", sv_token_text(b ? b : "", n), "logprob", lp_value(lp), "bytes", bytes);
}

static void on_token(void *ud, const sl_logprobs *lp) {
    sv_job *j = ud;
    json_t *e = lp_token(j->lp_tok, lp->id, lp->logprob), *top = json_array();
    for (int k = 0; k < lp->n_top; k++)
        json_array_append_new(top, lp_token(j->lp_tok, lp->top_ids[k], lp->top_logprobs[k]));
    json_object_set_new(e, "top_logprobs", top);
    pthread_mutex_lock(&j->lead->mu);
    json_array_append_new(j->logprobs, e);
    pthread_mutex_unlock(&j->lead->mu);
}

int sv_job_want_logprobs(sv_job *j, const sl_tokenizer *tok, int top) {
    if (!j->logprobs && !(j->logprobs = json_array())) return -1;
    j->lp_tok = tok;
    j->gen.on_token = on_token;
    j->gen.token_ud = j;
    j->gen.top_logprobs = top;
    return 0;
}

json_t *sv_job_logprobs_take(sv_job *j) {
    if (!j->logprobs) return NULL;
    json_t *a = json_array();
    for (size_t i = j->lp_sent; i < json_array_size(j->logprobs); i++)
        json_array_append(a, json_array_get(j->logprobs, i));
    j->lp_sent = json_array_size(j->logprobs);
    return a;
}
