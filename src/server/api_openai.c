/* OpenAI API: /v1/chat/completions, /v1/completions and /v1/models, whole or as Server-Sent Events. With
 * n > 1 each choice is a job of the request (job.h): streamed chunks carry the choice's index and each
 * choice ends with its own finish chunk; a whole body lists every choice once the last one ends; usage
 * counts the prompt once and the completion tokens of all choices. */
#include <stdlib.h>
#include <string.h>

#include "server/request.h"

static const char *model_of(const sv_job *j) {
    return json_string_value(json_object_get(j->extra, "model"));
}

static int is_chat(const sv_job *j) {
    return json_is_true(json_object_get(j->extra, "chat"));
}

/* The request's usage (j: its lead). */
static json_t *usage(sv_job *j) {
    int gen = 0;
    for (int i = 0; i < j->n_choices; i++) gen += sv_job_choice(j, i)->st.generated_tokens;
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", j->st.prompt_tokens, "completion_tokens", gen,
                     "total_tokens", j->st.prompt_tokens + gen, "prompt_tokens_details", "cached_tokens",
                     j->st.cached_tokens);
}

static const char *finish_reason(const sv_job *j) {
    if (j->n_tools) return "tool_calls";
    return strcmp(j->st.finish_reason, "length") ? "stop" : "length";
}

/* Legacy completions' logprobs object from the shared entries: parallel arrays, top alternatives as
 * {text: logprob} maps, and text offsets counted in bytes from the start of the completion. */
static json_t *legacy_logprobs(sv_job *j, json_t *entries) {
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    json_int_t off = json_integer_value(json_object_get(j->extra, "lp_offset"));
    size_t i, k;
    json_t *e, *t;
    json_array_foreach(entries, i, e) {
        json_array_append(toks, json_object_get(e, "token"));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_t *m = json_object();
        json_array_foreach(json_object_get(e, "top_logprobs"), k, t) {
            const char *key = json_string_value(json_object_get(t, "token"));
            if (!json_object_get(m, key)) json_object_set(m, key, json_object_get(t, "logprob"));
        }
        json_array_append_new(tops, m);
        json_array_append_new(offs, json_integer(off));
        off += (json_int_t)json_array_size(json_object_get(e, "bytes"));
    }
    json_object_set_new(j->extra, "lp_offset", json_integer(off));
    json_decref(entries);
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset",
                     offs);
}

/* The logprobs of choice j for the tokens not yet written (none when they are off, or, while streaming,
 * when no token is pending). */
static void attach_logprobs(sv_job *j, json_t *choice) {
    json_t *pending = sv_job_logprobs_take(j);
    if (!pending) return;
    if (j->stream && !json_array_size(pending) && !json_is_string(json_object_get(choice, "finish_reason"))) {
        json_decref(pending);
        return;
    }
    json_object_set_new(choice, "logprobs",
                        is_chat(j) ? json_pack("{s:o, s:n}", "content", pending, "refusal")
                                   : legacy_logprobs(j, pending));
}

/* One streamed chunk with one choice of j (choice NULL: no choices, for the usage chunk). */
static void chunk(sv_job *j, json_t *choice, json_t *usage_v) {
    /* the role chunk goes out before the first token's text: its logprobs ride with that text */
    if (choice && !json_object_get(json_object_get(choice, "delta"), "role")) attach_logprobs(j, choice);
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[]}", "id", j->id, "object",
                          is_chat(j) ? "chat.completion.chunk" : "text_completion", "created", j->created, "model",
                          model_of(j), "system_fingerprint", "sluice", "choices");
    if (c && choice) json_array_append_new(json_object_get(c, "choices"), choice);
    if (c && usage_v) json_object_set_new(c, "usage", usage_v);
    sv_job_sse(j, NULL, c);
}

static json_t *delta_choice(const sv_job *j, json_t *delta, const char *finish) {
    return json_pack("{s:i, s:o, s:n, s:o}", "index", j->index, "delta", delta, "logprobs", "finish_reason",
                     finish ? json_string(finish) : json_null());
}

static json_t *text_choice(const sv_job *j, const char *text, size_t len, const char *finish) {
    return json_pack("{s:s%, s:i, s:n, s:o}", "text", text, len, "index", j->index, "logprobs", "finish_reason",
                     finish ? json_string(finish) : json_null());
}

static void w_begin(sv_job *j) {
    if (j->stream && is_chat(j))
        chunk(j, delta_choice(j, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL), NULL);
}

static void w_event(sv_job *j, const sl_tc_event *ev) {
    if (!j->stream) return;
    if (!is_chat(j)) {
        chunk(j, text_choice(j, ev->text, ev->len, NULL), NULL);
        return;
    }
    json_t *d = NULL;
    sv_tool *t = j->n_tools ? &j->tool_calls[j->n_tools - 1] : NULL;
    switch (ev->kind) {
    case SL_TC_TEXT: d = json_pack("{s:s%}", "content", ev->text, ev->len); break;
    case SL_TC_REASONING: d = json_pack("{s:s%}", "reasoning_content", ev->text, ev->len); break;
    case SL_TC_TOOL_START:
        if (t)
            d = json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", j->n_tools - 1, "id", t->id,
                          "type", "function", "function", "name", t->name, "arguments", "");
        break;
    case SL_TC_TOOL_ARGS:
        d = json_pack("{s:[{s:i, s:{s:s%}}]}", "tool_calls", "index", j->n_tools - 1, "function", "arguments", ev->text,
                      ev->len);
        break;
    case SL_TC_TOOL_END: return;
    }
    if (d) chunk(j, delta_choice(j, d, NULL), NULL);
}

static json_t *message(const sv_job *j) {
    json_t *m = json_pack("{s:s}", "role", "assistant");
    json_object_set_new(m, "content",
                        j->content.len || !j->n_tools ? json_string(j->content.p ? j->content.p : "") : json_null());
    if (j->reasoning.len) json_object_set_new(m, "reasoning_content", json_string(j->reasoning.p));
    if (j->n_tools) {
        json_t *a = json_array();
        for (int i = 0; i < j->n_tools; i++)
            json_array_append_new(a, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", j->tool_calls[i].id, "type",
                                               "function", "function", "name", j->tool_calls[i].name, "arguments",
                                               j->tool_calls[i].args.p ? j->tool_calls[i].args.p : "{}"));
        json_object_set_new(m, "tool_calls", a);
    }
    return m;
}

/* Choice j's finish chunk as it streams; once every choice has ended, the usage chunk and the end. A whole
 * body goes out when the last choice ends, with all of them. */
static void w_finish(sv_job *j) {
    sv_job *lead = j->lead;
    if (j->stream) {
        const char *fr = finish_reason(j);
        chunk(j, is_chat(j) ? delta_choice(j, json_object(), fr) : text_choice(j, "", 0, fr), NULL);
        if (lead->open) return;
        if (lead->include_usage) chunk(lead, NULL, usage(lead));
        sv_job_emit(lead, "data: [DONE]\n\n", 14);
        return;
    }
    if (lead->open) return;
    json_t *choices = json_array();
    for (int i = 0; i < lead->n_choices; i++) {
        sv_job *c = sv_job_choice(lead, i);
        const char *fr = finish_reason(c);
        json_t *choice = is_chat(c) ? json_pack("{s:i, s:o, s:n, s:s}", "index", i, "message", message(c), "logprobs",
                                                "finish_reason", fr)
                                    : text_choice(c, c->content.p ? c->content.p : "", c->content.len, fr);
        attach_logprobs(c, choice);
        json_array_append_new(choices, choice);
    }
    sv_buf_json(&lead->out,
                json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o}", "id", lead->id, "object",
                          is_chat(lead) ? "chat.completion" : "text_completion", "created", lead->created, "model",
                          model_of(lead), "system_fingerprint", "sluice", "choices", choices, "usage", usage(lead)));
    sv_job_emit(lead, "", 0);
}

static void w_fail(sv_job *j, const char *msg) {
    sv_job *lead = j->lead;
    json_t *err =
        json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", msg, "type", "server_error", "param", "code");
    if (lead->stream) {
        sv_job_sse(lead, NULL, err);
        sv_job_emit(lead, "data: [DONE]\n\n", 14);
    } else {
        lead->status = 500;
        sv_buf_json(&lead->out, err);
        sv_job_emit(lead, "", 0);
    }
}

static const sv_writer writer = {w_begin, w_event, w_finish, w_fail};

/* The output's grammar: response_format json_object / json_schema (strict or not, always enforced), or
 * llama-server's `grammar` (GBNF) and `json_schema` fields. */
static int constraint(json_t *b, sv_job *j, sv_error *er) {
    json_t *rf, *js;
    const char *gbnf;
    int rc, n_given = 0;
    if ((rc = sv_get_object(b, "response_format", "response_format", &rf, er)) < 0) return -1;
    const char *type = rc ? json_string_value(json_object_get(rf, "type")) : NULL;
    if (rc && !type) return sv_bad(er, 400, "response_format.type", "response_format.type must be a string");
    if (type && !strcmp(type, "json_object")) {
        n_given++;
        if (sv_set_grammar_schema(j, json_object_get(rf, "schema"), "response_format.schema", er)) return -1;
    } else if (type && !strcmp(type, "json_schema")) {
        json_t *schema = json_object_get(json_object_get(rf, "json_schema"), "schema");
        if (!json_is_object(schema) && !json_is_boolean(schema))
            return sv_bad(er, 400, "response_format.json_schema.schema",
                          "response_format.json_schema.schema must be a JSON schema (an object)");
        n_given++;
        if (sv_set_grammar_schema(j, schema, "response_format.json_schema.schema", er)) return -1;
    }
    if ((rc = sv_get_object(b, "json_schema", "json_schema", &js, er)) < 0) return -1;
    if (rc && (n_given++, sv_set_grammar_schema(j, js, "json_schema", er))) return -1;
    if ((rc = sv_get_string(b, "grammar", "grammar", &gbnf, er)) < 0) return -1;
    if (rc && *gbnf && (n_given++, sv_set_grammar_gbnf(j, gbnf, "grammar", er))) return -1;
    if (n_given > 1)
        return sv_bad(er, 400, "grammar",
                      "grammar, json_schema and a JSON response_format exclude each other; give one");
    return 0;
}

/* Settings both endpoints share; *n_choices gets n. */
static int parse_common(sv_engine *g, json_t *b, sv_job *j, int *n_choices, sv_error *er) {
    double d;
    long long n;
    int rc;
    sl_sampler_params *sp = &j->gen.sampling;
    if ((rc = sv_get_number(b, "temperature", "temperature", 0, 2, &d, er)) < 0) return -1;
    if (rc) sp->temperature = (float)d;
    if ((rc = sv_get_number(b, "top_p", "top_p", 0, 1, &d, er)) < 0) return -1;
    if (rc) sp->top_p = (float)d;
    if ((rc = sv_get_int(b, "top_k", "top_k", 0, 1 << 30, &n, er)) < 0) return -1;
    if (rc) sp->top_k = (int)n;
    if ((rc = sv_get_number(b, "min_p", "min_p", 0, 1, &d, er)) < 0) return -1;
    if (rc) sp->min_p = (float)d;
    if ((rc = sv_get_number(b, "presence_penalty", "presence_penalty", -2, 2, &d, er)) < 0) return -1;
    if (rc) sp->presence_penalty = (float)d;
    if ((rc = sv_get_number(b, "frequency_penalty", "frequency_penalty", -2, 2, &d, er)) < 0) return -1;
    if (rc) sp->frequency_penalty = (float)d;
    if ((rc = sv_get_int(b, "seed", "seed", -(1LL << 62), 1LL << 62, &n, er)) < 0) return -1;
    if (rc) sp->seed = (uint64_t)n;
    /* n choices take n of the --parallel sequences: a request must fit in them */
    int max_n = g->parallel < SV_MAX_CHOICES ? g->parallel : SV_MAX_CHOICES;
    if (max_n < 1) max_n = 1;
    json_t *nv = json_object_get(b, "n");
    if (nv && !json_is_null(nv) &&
        (!json_is_integer(nv) || json_integer_value(nv) < 1 || json_integer_value(nv) > max_n))
        return sv_bad(er, 400, "n",
                      "n must be an integer in [1, %d] (at most %d choices, and at most the server's --parallel %d)",
                      max_n, SV_MAX_CHOICES, g->parallel);
    *n_choices = nv && !json_is_null(nv) ? (int)json_integer_value(nv) : 1;
    const char *key = json_object_get(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((rc = sv_get_int(b, key, key, 1, 1 << 30, &n, er)) < 0) return -1;
    if (rc) j->gen.max_tokens = (int)n;
    if (sv_set_stops(j, json_object_get(b, "stop"), "stop", er)) return -1;
    if (sv_get_bool(b, "stream", "stream", &j->stream, er) < 0) return -1;
    /* as llama-server and vLLM take it: generate up to max_tokens whatever the model says (benchmarks) */
    if (sv_get_bool(b, "ignore_eos", "ignore_eos", &j->gen.ignore_eos, er) < 0) return -1;
    json_t *so;
    if ((rc = sv_get_object(b, "stream_options", "stream_options", &so, er)) < 0) return -1;
    if (rc && sv_get_bool(so, "include_usage", "stream_options.include_usage", &j->include_usage, er) < 0) return -1;
    j->extra = json_pack("{s:s}", "model", g->name);
    j->w = &writer;
    return constraint(b, j, er);
}

/* Chat: logprobs true/false and top_logprobs 0-20 (which needs logprobs). Legacy completions: logprobs
 * is the count of alternatives, 0-20 (0: the chosen token's alone). */
static int parse_logprobs(sv_engine *g, json_t *b, sv_job *j, int chat, sv_error *er) {
    long long n = 0;
    int on = 0, rc;
    if (chat) {
        if (sv_get_bool(b, "logprobs", "logprobs", &on, er) < 0) return -1;
        if ((rc = sv_get_int(b, "top_logprobs", "top_logprobs", 0, SL_MAX_TOP_LOGPROBS, &n, er)) < 0) return -1;
        if (rc && !on) return sv_bad(er, 400, "top_logprobs", "top_logprobs needs logprobs: true");
    } else if (!json_is_false(json_object_get(b, "logprobs"))) {
        if ((rc = sv_get_int(b, "logprobs", "logprobs", 0, SL_MAX_TOP_LOGPROBS, &n, er)) < 0) return -1;
        on = rc;
    }
    if (on && sv_job_want_logprobs(j, g->tok, (int)n)) return sv_bad(er, 500, "", "out of memory");
    return 0;
}

/* Message content: a string, null, or an array of text parts. */
static int content_text(json_t *c, const char *path, json_t **out, sv_error *er) {
    if (!c || json_is_null(c)) {
        *out = json_string("");
        return 0;
    }
    if (json_is_string(c)) {
        *out = json_incref(c);
        return 0;
    }
    if (!json_is_array(c)) return sv_bad(er, 400, path, "%s must be a string or an array of content parts", path);
    sv_buf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const char *text = json_string_value(json_object_get(part, "text"));
        if (!type || strcmp(type, "text") || !text) {
            sv_buf_free(&b);
            return sv_bad(er, 400, path, "%s[%zu]: only {\"type\": \"text\", \"text\": ...} parts are supported", path,
                          i);
        }
        sv_buf_puts(&b, text);
    }
    *out = json_string(b.p ? b.p : "");
    sv_buf_free(&b);
    return 0;
}

/* Validates messages and rewrites them the way chat templates expect (tool-call arguments as objects). */
static int chat_messages(json_t *in, json_t **out, sv_error *er) {
    if (!json_is_array(in) || !json_array_size(in))
        return sv_bad(er, 400, "messages", "messages must be a non-empty array of {role, content} objects");
    json_t *msgs = json_array();
    size_t i;
    json_t *m;
    char path[64];
    json_array_foreach(in, i, m) {
        snprintf(path, sizeof path, "messages[%zu]", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role) {
            json_decref(msgs);
            return sv_bad(er, 400, path, "%s must be an object with a string role", path);
        }
        if (!strcmp(role, "developer")) role = "system";
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool")) {
            json_decref(msgs);
            return sv_bad(er, 400, path, "%s.role must be system, developer, user, assistant or tool, got '%s'", path,
                          role);
        }
        json_t *content = NULL;
        snprintf(path, sizeof path, "messages[%zu].content", i);
        if (content_text(json_object_get(m, "content"), path, &content, er)) {
            json_decref(msgs);
            return -1;
        }
        json_t *o = json_pack("{s:s, s:o}", "role", role, "content", content);
        json_t *v;
        if ((v = json_object_get(m, "name")) && json_is_string(v)) json_object_set(o, "name", v);
        if ((v = json_object_get(m, "tool_call_id")) && json_is_string(v)) json_object_set(o, "tool_call_id", v);
        if ((v = json_object_get(m, "reasoning_content")) && json_is_string(v))
            json_object_set(o, "reasoning_content", v);
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
                    snprintf(path, sizeof path, "messages[%zu].tool_calls[%zu]", i, k);
                    return sv_bad(er, 400, path, "%s.function.name must be a string", path);
                }
                json_t *args = json_object_get(fn, "arguments");
                json_array_append_new(tc, json_pack("{s:s, s:s, s:{s:s, s:o}}", "id",
                                                    json_string_value(json_object_get(c, "id"))
                                                        ? json_string_value(json_object_get(c, "id"))
                                                        : "",
                                                    "type", "function", "function", "name", name, "arguments",
                                                    args ? sv_args_object(args) : json_object()));
            }
            json_object_set_new(o, "tool_calls", tc);
        }
        json_array_append_new(msgs, o);
    }
    *out = msgs;
    return 0;
}

static int chat_tools(json_t *b, json_t **tools, sv_job *j, sv_error *er) {
    json_t *t;
    int rc = sv_get_array(b, "tools", "tools", &t, er);
    if (rc < 0) return rc;
    json_t *choice = json_object_get(b, "tool_choice");
    if (rc == 0 || !json_array_size(t)) {
        if (json_is_object(choice) || (json_is_string(choice) && !strcmp(json_string_value(choice), "required")))
            return sv_bad(er, 400, "tool_choice", "tool_choice asks for a tool call but the request has no tools");
        return 0;
    }
    size_t i;
    json_t *x;
    json_array_foreach(t, i, x) {
        json_t *fn = json_object_get(x, "function");
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name"))) {
            char path[48];
            snprintf(path, sizeof path, "tools[%zu]", i);
            return sv_bad(er, 400, path, "%s must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}",
                          path);
        }
    }
    if (json_is_string(choice) && !strcmp(json_string_value(choice), "none")) return 0;
    if (choice && !json_is_null(choice) && !json_is_string(choice) && !json_is_object(choice))
        return sv_bad(er, 400, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or an object");
    if (json_is_string(choice) && strcmp(json_string_value(choice), "auto") &&
        strcmp(json_string_value(choice), "required"))
        return sv_bad(er, 400, "tool_choice",
                      "tool_choice must be \"none\", \"auto\", \"required\" or an object, got \"%s\"",
                      json_string_value(choice));
    const char *name = NULL;
    if (json_is_object(choice)) {
        name = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
        if (!name)
            return sv_bad(er, 400, "tool_choice.function.name",
                          "tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (sv_tool_choice_name(t, name, "tool_choice.function.name", er)) return -1;
    } else if (json_is_string(choice) && !strcmp(json_string_value(choice), "required")) {
        name = "";
    }
    if (name && !(j->force_tool = strdup(name))) return sv_bad(er, 500, "", "out of memory");
    if (json_array_size(t)) *tools = json_incref(t);
    return 0;
}

int sv_json_format_note(const char *type, json_t *schema, const char *path, json_t *msgs, sv_error *er) {
    if (!strcmp(type, "text")) return 0;
    sv_buf note = {0};
    if (!strcmp(type, "json_object")) {
        sv_buf_puts(&note, "Respond with a single JSON object and nothing else.");
    } else if (!strcmp(type, "json_schema")) {
        sv_buf_puts(&note, "Respond with a single JSON object and nothing else, following this JSON schema: ");
        sv_buf_json(&note, json_incref(schema));
    } else {
        return sv_bad(er, 400, path, "%s must be text, json_object or json_schema, got '%s'", path, type);
    }
    json_t *first = json_array_get(msgs, 0);
    if (!strcmp(json_string_value(json_object_get(first, "role")), "system")) {
        sv_buf s = {0};
        sv_buf_puts(&s, json_string_value(json_object_get(first, "content")));
        sv_buf_puts(&s, "\n\n");
        sv_buf_puts(&s, note.p);
        json_object_set_new(first, "content", json_string(s.p));
        sv_buf_free(&s);
    } else {
        json_array_insert_new(msgs, 0, json_pack("{s:s, s:s}", "role", "system", "content", note.p));
    }
    sv_buf_free(&note);
    return 0;
}

/* response_format json_object / json_schema: asked for in the system message as well, since models follow a
 * format better when told (the grammar, set in constraint(), enforces it). */
static int response_format(json_t *b, json_t *msgs, sv_error *er) {
    json_t *rf;
    int rc = sv_get_object(b, "response_format", "response_format", &rf, er);
    if (rc <= 0) return rc;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!type) return sv_bad(er, 400, "response_format.type", "response_format.type must be a string");
    return sv_json_format_note(type, json_object_get(json_object_get(rf, "json_schema"), "schema"),
                               "response_format.type", msgs, er);
}

enum MHD_Result sv_openai_chat(sv_req *r) {
    sv_engine *g = r->srv->g;
    sv_error er;
    json_t *msgs = NULL, *tools = NULL, *vars = NULL;
    int think = -1;
    sv_job *j = sv_job_for(g, "chatcmpl-");
    if (!j) return MHD_NO;
    int n = 1;
    if (parse_common(g, r->json, j, &n, &er) || parse_logprobs(g, r->json, j, 1, &er) ||
        chat_messages(json_object_get(r->json, "messages"), &msgs, &er) || chat_tools(r->json, &tools, j, &er) ||
        response_format(r->json, msgs, &er))
        goto bad;
    const char *effort = NULL;
    if (sv_get_string(r->json, "reasoning_effort", "reasoning_effort", &effort, &er) < 0 ||
        sv_template_vars(r->json, effort, &vars, &think, &er) ||
        sv_get_bool(r->json, "enable_thinking", "enable_thinking", &think, &er) < 0)
        goto bad;
    if (sv_chat_prepare(g, j, msgs, tools, think, vars, "max_tokens", &er)) goto bad;
    tools = NULL; /* the job's now */
    if (sv_job_add_choices(j, n)) {
        sv_bad(&er, 500, "", "out of memory");
        goto bad;
    }
    json_decref(msgs);
    json_decref(vars);
    return sv_reply_job(r, j, j->stream ? "text/event-stream" : "application/json");
bad:
    json_decref(msgs);
    json_decref(vars);
    json_decref(tools);
    sv_job_release(j);
    return sv_reply_error(r, &er);
}

enum MHD_Result sv_openai_completions(sv_req *r) {
    sv_engine *g = r->srv->g;
    sv_error er;
    sv_job *j = sv_job_for(g, "cmpl-");
    if (!j) return MHD_NO;
    j->gen.max_tokens = 16; /* the API's documented default */
    int n = 1;
    if (parse_common(g, r->json, j, &n, &er) || parse_logprobs(g, r->json, j, 0, &er)) goto bad;
    json_t *p = json_object_get(r->json, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1) p = json_array_get(p, 0);
    if (!json_is_string(p)) {
        sv_bad(&er, 400, "prompt", "prompt must be a string (or an array of one string)");
        goto bad;
    }
    int echo = 0;
    if (sv_get_bool(r->json, "echo", "echo", &echo, &er) < 0) goto bad;
    if (echo || json_object_get(r->json, "suffix")) {
        sv_bad(&er, 400, echo ? "echo" : "suffix", "%s is not supported", echo ? "echo" : "suffix");
        goto bad;
    }
    if (sv_prompt_text(g, json_string_value(p), json_string_length(p), j, &er) ||
        sv_check_context(g, j, "max_tokens", &er))
        goto bad;
    if (sv_job_add_choices(j, n)) {
        sv_bad(&er, 500, "", "out of memory");
        goto bad;
    }
    return sv_reply_job(r, j, j->stream ? "text/event-stream" : "application/json");
bad:
    sv_job_release(j);
    return sv_reply_error(r, &er);
}

enum MHD_Result sv_openai_models(sv_req *r) {
    sv_engine *g = r->srv->g;
    json_t *model = json_pack("{s:s, s:s, s:I, s:s}", "id", g->name, "object", "model", "created", g->loaded_at,
                              "owned_by", "sluice");
    if (!strncmp(r->url, "/v1/models/", 11)) {
        if (strcmp(r->url + 11, g->name)) {
            json_decref(model);
            sv_error er;
            sv_bad(&er, 404, "model", "model '%s' is not served here; this server runs '%s'", r->url + 11, g->name);
            return sv_reply_error(r, &er);
        }
        return sv_reply_json(r, 200, model);
    }
    return sv_reply_json(r, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model));
}
