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
