/* Ollama API: /api/chat and /api/generate (NDJSON streaming by default), /api/tags, /api/show, /api/ps and
 * /api/version. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "server/request.h"

static void rfc3339(char *buf, size_t n) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + k, n - k, ".%09ldZ", ts.tv_nsec);
}

static int is_chat(const sv_job *j) {
    return json_is_true(json_object_get(j->extra, "chat"));
}

/* {"model", "created_at"} plus the caller's fields. */
static json_t *head(const sv_job *j) {
    char at[48];
    rfc3339(at, sizeof at);
    return json_pack("{s:O, s:s}", "model", json_object_get(j->extra, "model"), "created_at", at);
}

static json_t *tool_calls(const sv_job *j, int from, int to) {
    json_t *a = json_array();
    for (int i = from; i < to; i++) {
        json_t *args = json_loads(j->tool_calls[i].args.p ? j->tool_calls[i].args.p : "{}", 0, NULL);
        json_array_append_new(a, json_pack("{s:{s:s, s:o}}", "function", "name", j->tool_calls[i].name, "arguments",
                                           args ? args : json_object()));
    }
    return a;
}

/* The logprobs of the tokens not yet written, when asked for (and, while streaming, when any is pending). */
static void attach_logprobs(sv_job *j, json_t *o) {
    json_t *pending = sv_job_logprobs_take(j);
    if (pending && (json_array_size(pending) || !j->stream))
        json_object_set_new(o, "logprobs", pending);
    else
        json_decref(pending);
}

static void w_begin(sv_job *j) {
    (void)j;
}

static void w_event(sv_job *j, const sl_tc_event *ev) {
    if (!j->stream || ev->kind == SL_TC_TOOL_START || ev->kind == SL_TC_TOOL_ARGS) return;
    json_t *o = head(j);
    const char *field = ev->kind == SL_TC_REASONING ? "thinking" : is_chat(j) ? "content" : "response";
    if (is_chat(j)) {
        json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
        if (ev->kind == SL_TC_TOOL_END)
            json_object_set_new(m, "tool_calls", tool_calls(j, j->n_tools - 1, j->n_tools));
        else
            json_object_set_new(m, field, json_stringn(ev->text, ev->len));
        json_object_set_new(o, "message", m);
    } else {
        if (ev->kind == SL_TC_TOOL_END) {
            json_decref(o);
            return;
        }
        json_object_set_new(o, "response", json_string(""));
        json_object_set_new(o, field, json_stringn(ev->text, ev->len));
    }
    json_object_set_new(o, "done", json_false());
    attach_logprobs(j, o);
    sv_job_ndjson(j, o);
}

static void w_finish(sv_job *j) {
    json_t *o = head(j);
    const char *c = j->stream ? "" : j->content.p ? j->content.p : "";
    if (is_chat(j)) {
        json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", c);
        if (!j->stream && j->reasoning.len) json_object_set_new(m, "thinking", json_string(j->reasoning.p));
        if (!j->stream && j->n_tools) json_object_set_new(m, "tool_calls", tool_calls(j, 0, j->n_tools));
        json_object_set_new(o, "message", m);
    } else {
        json_object_set_new(o, "response", json_string(c));
        if (!j->stream && j->reasoning.len) json_object_set_new(o, "thinking", json_string(j->reasoning.p));
    }
    double total = sl_now() - j->t_received;
    json_object_set_new(o, "done", json_true());
    json_object_set_new(o, "done_reason", json_string(strcmp(j->st.finish_reason, "length") ? "stop" : "length"));
    json_object_set_new(o, "total_duration", json_integer((json_int_t)(total * 1e9)));
    json_object_set_new(o, "load_duration", json_integer(0));
    json_object_set_new(o, "prompt_eval_count", json_integer(j->st.prompt_tokens - j->st.cached_tokens));
    json_object_set_new(o, "prompt_eval_duration", json_integer((json_int_t)(j->st.prefill_s * 1e9)));
    json_object_set_new(o, "eval_count", json_integer(j->st.generated_tokens));
    json_object_set_new(o, "eval_duration", json_integer((json_int_t)(j->st.decode_s * 1e9)));
    attach_logprobs(j, o);
    if (j->stream)
        sv_job_ndjson(j, o);
    else {
        sv_buf_json(&j->out, o);
        sv_job_emit(j, "", 0);
    }
}

static void w_fail(sv_job *j, const char *msg) {
    json_t *err = json_pack("{s:s}", "error", msg);
    if (j->stream) {
        sv_job_ndjson(j, err);
    } else {
        j->status = 500;
        sv_buf_json(&j->out, err);
        sv_job_emit(j, "", 0);
    }
}

static const sv_writer writer = {w_begin, w_event, w_finish, w_fail};

/* Top-level logprobs (bool) and top_logprobs (0-20, which needs logprobs), as in Ollama's API. */
static int parse_logprobs(sv_engine *g, json_t *b, sv_job *j, sv_error *er) {
    int on = 0, rc;
    long long n = 0;
    if (sv_get_bool(b, "logprobs", "logprobs", &on, er) < 0) return -1;
    if ((rc = sv_get_int(b, "top_logprobs", "top_logprobs", 0, SL_MAX_TOP_LOGPROBS, &n, er)) < 0) return -1;
    if (rc && n > 0 && !on) return sv_bad(er, 400, "top_logprobs", "top_logprobs needs logprobs: true");
    if (on && sv_job_want_logprobs(j, g->tok, (int)n)) return sv_bad(er, 500, "", "out of memory");
    return 0;
}

static int parse_options(sv_engine *g, json_t *b, sv_job *j, sv_error *er) {
    json_t *o;
    int rc = sv_get_object(b, "options", "options", &o, er);
    if (rc < 0) return -1;
    sl_sampler_params *sp = &j->gen.sampling;
    double d;
    long long n;
    if (rc) {
#define NUM(key, lo, hi, field)                                                                                        \
    if ((rc = sv_get_number(o, key, "options." key, lo, hi, &d, er)) < 0) return -1;                                   \
    if (rc) field = (float)d;
        NUM("temperature", 0, 100, sp->temperature)
        NUM("top_p", 0, 1, sp->top_p)
        NUM("min_p", 0, 1, sp->min_p)
        NUM("repeat_penalty", 0, 100, sp->repeat_penalty)
        NUM("presence_penalty", -100, 100, sp->presence_penalty)
        NUM("frequency_penalty", -100, 100, sp->frequency_penalty)
#undef NUM
        if ((rc = sv_get_int(o, "top_k", "options.top_k", 0, 1 << 30, &n, er)) < 0) return -1;
        if (rc) sp->top_k = (int)n;
        if ((rc = sv_get_int(o, "repeat_last_n", "options.repeat_last_n", -1, 1 << 30, &n, er)) < 0) return -1;
        if (rc) sp->repeat_last_n = (int)n;
        if ((rc = sv_get_int(o, "seed", "options.seed", -(1LL << 62), 1LL << 62, &n, er)) < 0) return -1;
        if (rc) sp->seed = (uint64_t)n;
        /* -1: no limit, -2: until the context is full, as in Ollama */
        if ((rc = sv_get_int(o, "num_predict", "options.num_predict", -2, 1 << 30, &n, er)) < 0) return -1;
        if (rc) j->gen.max_tokens = n > 0 ? (int)n : 0;
        if ((rc = sv_get_int(o, "num_ctx", "options.num_ctx", 1, 1 << 30, &n, er)) < 0) return -1;
        if (rc && n > g->ctx)
            return sv_bad(er, 400, "options.num_ctx",
                          "options.num_ctx %lld exceeds this server's context of %d (start it with a larger --ctx)", n,
                          g->ctx);
        if (sv_set_stops(j, json_object_get(o, "stop"), "options.stop", er)) return -1;
        const char *gbnf;
        if ((rc = sv_get_string(o, "grammar", "options.grammar", &gbnf, er)) < 0) return -1;
        if (rc && *gbnf && sv_set_grammar_gbnf(j, gbnf, "options.grammar", er)) return -1;
    }
    /* format "json" (any JSON object) or a JSON schema; it replaces options.grammar */
    json_t *f = json_object_get(b, "format");
    if (json_is_string(f) && !strcmp(json_string_value(f), "json")) {
        if (sv_set_grammar_schema(j, NULL, "format", er)) return -1;
    } else if (json_is_object(f)) {
        if (sv_set_grammar_schema(j, f, "format", er)) return -1;
    } else if (f && !json_is_null(f) && !(json_is_string(f) && !*json_string_value(f))) {
        return sv_bad(er, 400, "format", "format must be \"json\" or a JSON schema object");
    }
    const char *model;
    if (sv_get_string(b, "model", "model", &model, er) <= 0)
        return er->status ? -1 : sv_bad(er, 400, "model", "model: field required (a string)");
    j->stream = 1;
    if (sv_get_bool(b, "stream", "stream", &j->stream, er) < 0) return -1;
    j->extra = json_pack("{s:s}", "model", model);
    j->w = &writer;
    return 0;
}

/* format "json" or a JSON schema: asked for in the system message as well (parse_options sets the grammar
 * that enforces it). */
static int format_note(json_t *b, json_t *msgs, sv_error *er) {
    json_t *f = json_object_get(b, "format");
    if (!f || json_is_null(f) || (json_is_string(f) && !*json_string_value(f))) return 0;
    sv_buf note = {0};
    if (json_is_string(f) && !strcmp(json_string_value(f), "json")) {
        sv_buf_puts(&note, "Respond with a single JSON object and nothing else.");
    } else if (json_is_object(f)) {
        sv_buf_puts(&note, "Respond with a single JSON object and nothing else, following this JSON schema: ");
        sv_buf_json(&note, json_incref(f));
    } else {
        return sv_bad(er, 400, "format", "format must be \"json\" or a JSON schema object");
    }
    json_t *first = json_array_get(msgs, 0);
    if (first && !strcmp(json_string_value(json_object_get(first, "role")), "system")) {
        sv_buf s = {0};
        sv_buf_printf(&s, "%s\n\n%s", json_string_value(json_object_get(first, "content")), note.p);
        json_object_set_new(first, "content", json_string(s.p));
        sv_buf_free(&s);
    } else {
        json_array_insert_new(msgs, 0, json_pack("{s:s, s:s}", "role", "system", "content", note.p));
    }
    sv_buf_free(&note);
    return 0;
}

/* think: a boolean, or a level ("low", "medium", "high") that reaches the template as reasoning_effort */
static int think_flag(json_t *b, int *think, json_t **vars, sv_error *er) {
    *think = -1;
    json_t *v = json_object_get(b, "think");
    if (json_is_string(v)) {
        *think = 1;
        *vars = json_pack("{s:s}", "reasoning_effort", json_string_value(v));
        return *vars ? 0 : sv_bad(er, 500, "", "out of memory");
    }
    return sv_get_bool(b, "think", "think", think, er) < 0 ? -1 : 0;
}

static int chat_messages(json_t *in, json_t **out, sv_error *er) {
    if (!json_is_array(in) || !json_array_size(in))
        return sv_bad(er, 400, "messages", "messages must be a non-empty array of {role, content} objects");
    json_t *msgs = json_array(), *m;
    size_t i;
    json_array_foreach(in, i, m) {
        char path[64];
        snprintf(path, sizeof path, "messages[%zu]", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        if (!role || (content && !json_is_null(content) && !json_is_string(content))) {
            json_decref(msgs);
            return sv_bad(er, 400, path, "%s must have a string role and a string content", path);
        }
        if (json_array_size(json_object_get(m, "images"))) {
            json_decref(msgs);
            return sv_bad(er, 400, path, "%s.images: images are not supported by this model", path);
        }
        json_t *o =
            json_pack("{s:s, s:s}", "role", role, "content", json_is_string(content) ? json_string_value(content) : "");
        json_t *v;
        if (json_is_string(v = json_object_get(m, "thinking"))) json_object_set(o, "reasoning_content", v);
        if (json_is_string(v = json_object_get(m, "tool_name"))) json_object_set(o, "name", v);
        json_t *calls = json_object_get(m, "tool_calls");
        if (json_is_array(calls) && json_array_size(calls)) {
            json_t *tc = json_array(), *c;
            size_t k;
            json_array_foreach(calls, k, c) {
                json_t *fn = json_object_get(c, "function");
                const char *name = json_string_value(json_object_get(fn, "name"));
                if (!name) {
                    json_decref(tc);
                    json_decref(o);
                    json_decref(msgs);
                    return sv_bad(er, 400, path, "%s.tool_calls[%zu].function.name must be a string", path, k);
                }
                json_t *args = json_object_get(fn, "arguments");
                json_array_append_new(tc, json_pack("{s:s, s:{s:s, s:o}}", "type", "function", "function", "name", name,
                                                    "arguments", args ? sv_args_object(args) : json_object()));
            }
            json_object_set_new(o, "tool_calls", tc);
        }
        json_array_append_new(msgs, o);
    }
    *out = msgs;
    return 0;
}

enum MHD_Result sv_ollama_chat(sv_req *r) {
    sv_engine *g = r->srv->g;
    sv_error er = {0};
    json_t *msgs = NULL, *tools = NULL, *vars = NULL;
    int think;
    sv_job *j = sv_job_for(g, "ollama-");
    if (!j) return MHD_NO;
    if (parse_options(g, r->json, j, &er) || parse_logprobs(g, r->json, j, &er) ||
        think_flag(r->json, &think, &vars, &er) || chat_messages(json_object_get(r->json, "messages"), &msgs, &er) ||
        format_note(r->json, msgs, &er))
        goto bad;
    json_t *t;
    int rc = sv_get_array(r->json, "tools", "tools", &t, &er);
    if (rc < 0) goto bad;
    if (rc && json_array_size(t)) tools = json_incref(t);
    if (sv_chat_prepare(g, j, msgs, tools, think, vars, "options.num_predict", &er)) goto bad;
    json_decref(msgs);
    json_decref(vars);
    return sv_reply_job(r, j, j->stream ? "application/x-ndjson" : "application/json");
bad:
    json_decref(msgs);
    json_decref(vars);
    json_decref(tools);
    sv_job_release(j);
    return sv_reply_error(r, &er);
}

enum MHD_Result sv_ollama_generate(sv_req *r) {
    sv_engine *g = r->srv->g;
    sv_error er = {0};
    json_t *msgs = NULL, *vars = NULL;
    int think, raw = 0;
    const char *prompt = NULL, *system = NULL;
    sv_job *j = sv_job_for(g, "ollama-");
    if (!j) return MHD_NO;
    if (parse_options(g, r->json, j, &er) || parse_logprobs(g, r->json, j, &er) ||
        think_flag(r->json, &think, &vars, &er) || sv_get_string(r->json, "prompt", "prompt", &prompt, &er) < 0 ||
        sv_get_string(r->json, "system", "system", &system, &er) < 0 ||
        sv_get_bool(r->json, "raw", "raw", &raw, &er) < 0)
        goto bad;
    if (json_array_size(json_object_get(r->json, "images"))) {
        sv_bad(&er, 400, "images", "images are not supported by this model");
        goto bad;
    }
    if (!prompt || !*prompt) {
        /* an empty prompt only asks Ollama to load the model, which is always loaded here */
        json_t *o = json_pack("{s:O, s:s, s:s, s:b, s:s}", "model", json_object_get(j->extra, "model"), "created_at",
                              "", "response", "", "done", 1, "done_reason", "load");
        json_decref(vars);
        sv_job_release(j);
        return sv_reply_json(r, 200, o);
    }
    if (raw || !g->tmpl) {
        if (sv_prompt_text(g, prompt, strlen(prompt), j, &er)) goto bad;
    } else {
        msgs = json_array();
        if (system) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
        if (format_note(r->json, msgs, &er) || sv_prompt_chat_vars(g, msgs, NULL, think, vars, j, &er)) goto bad;
        j->parse_output = 1;
    }
    if (sv_check_context(g, j, "options.num_predict", &er)) goto bad;
    json_decref(msgs);
    json_decref(vars);
    return sv_reply_job(r, j, j->stream ? "application/x-ndjson" : "application/json");
bad:
    json_decref(msgs);
    json_decref(vars);
    sv_job_release(j);
    return sv_reply_error(r, &er);
}

static json_t *details(const sv_engine *g) {
    char params[32];
    sl_human_count((double)g->m->n_params, params, sizeof params);
    for (char *p = params; *p; p++)
        if (*p == ' ') memmove(p, p + 1, strlen(p));
    size_t n = strlen(g->dir);
    const char *format = n > 5 && !strcmp(g->dir + n - 5, ".gguf") ? "gguf" : "safetensors";
    return json_pack("{s:s, s:s, s:s, s:[s], s:s, s:s}", "parent_model", "", "format", format, "family",
                     g->m->cfg.model_type, "families", g->m->cfg.model_type, "parameter_size", params,
                     "quantization_level", "");
}

static json_t *model_entry(const sv_engine *g) {
    char at[48];
    time_t t = (time_t)g->loaded_at;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_pack("{s:s, s:s, s:s, s:I, s:s, s:o}", "name", g->name, "model", g->name, "modified_at", at, "size",
                     (json_int_t)(g->m->bytes_experts + g->m->bytes_other), "digest", "", "details", details(g));
}

enum MHD_Result sv_ollama_tags(sv_req *r) {
    return sv_reply_json(r, 200, json_pack("{s:[o]}", "models", model_entry(r->srv->g)));
}

enum MHD_Result sv_ollama_ps(sv_req *r) {
    json_t *e = model_entry(r->srv->g);
    json_object_set_new(e, "expires_at", json_string("2318-01-01T00:00:00Z"));
    json_object_set_new(e, "size_vram", json_integer(0));
    return sv_reply_json(r, 200, json_pack("{s:[o]}", "models", e));
}

enum MHD_Result sv_ollama_show(sv_req *r) {
    sv_engine *g = r->srv->g;
    const sl_config *c = &g->m->cfg;
    char key[96];
    json_t *info = json_pack("{s:s, s:I}", "general.architecture", c->model_type, "general.parameter_count",
                             (json_int_t)g->m->n_params);
#define INFO(name, v)                                                                                                  \
    snprintf(key, sizeof key, "%s." name, c->model_type);                                                              \
    json_object_set_new(info, key, json_integer(v));
    INFO("context_length", c->max_pos)
    INFO("embedding_length", c->hidden)
    INFO("block_count", c->n_layers)
    INFO("attention.head_count", c->n_heads)
    INFO("attention.head_count_kv", c->n_kv_heads)
    INFO("vocab_size", c->vocab_size)
#undef INFO
    json_t *caps = json_pack("[s]", "completion");
    if (g->tmpl_src && strstr(g->tmpl_src, "tools")) json_array_append_new(caps, json_string("tools"));
    if (g->tmpl_src && strstr(g->tmpl_src, "<think>")) json_array_append_new(caps, json_string("thinking"));
    char at[48];
    time_t t = (time_t)g->loaded_at;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return sv_reply_json(r, 200,
                         json_pack("{s:s, s:s, s:s, s:o, s:o, s:o, s:s}", "modelfile", "", "parameters", "", "template",
                                   g->tmpl_src ? g->tmpl_src : "", "details", details(g), "model_info", info,
                                   "capabilities", caps, "modified_at", at));
}

/* The Ollama API level the routes follow, not sluice's own version: clients gate features on it (Codex's
 * --oss mode takes the Responses API from 0.13.4 on). */
#define OLLAMA_API_VERSION "0.13.4"

enum MHD_Result sv_ollama_version(sv_req *r) {
    return sv_reply_json(r, 200, json_pack("{s:s}", "version", OLLAMA_API_VERSION));
}
