#include "server/job.h"

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
    return j;
}

void sv_job_release(sv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    free(j->ids);
    for (int i = 0; i < SV_MAX_STOPS; i++) free(j->stops[i]);
    json_decref(j->tools);
    free(j->force_tool);
    free(j->forced);
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

void sv_job_emit(sv_job *j, const char *s, size_t n) {
    sv_buf_append(&j->out, s, n);
    pthread_cond_broadcast(&j->cv);
}

void sv_job_sse(sv_job *j, const char *event, json_t *v) {
    if (event) sv_buf_printf(&j->out, "event: %s\n", event);
    sv_buf_puts(&j->out, "data: ");
    sv_buf_json(&j->out, v);
    sv_job_emit(j, "\n\n", 2);
}

void sv_job_ndjson(sv_job *j, json_t *v) {
    sv_buf_json(&j->out, v);
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
    snprintf(t->id, sizeof t->id, "%s%s_%d", j->tool_prefix ? j->tool_prefix : "call_",
             j->id + (strlen(j->id) > 12 ? strlen(j->id) - 12 : 0), j->n_tools);
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
    pthread_mutex_lock(&j->mu);
    json_array_append_new(j->logprobs, e);
    pthread_mutex_unlock(&j->mu);
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
