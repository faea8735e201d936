/* OpenAI Responses API: POST /v1/responses, whole or as the response.* event stream. Input items become a
 * chat conversation for the template; the generation's reasoning, text and tool calls become output items.
 * Nothing is stored: previous_response_id and item references are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/request.h"

enum { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

/* ---- writer state, kept in j->extra beside the request's echo ---- */

static long long xget(const sv_job *j, const char *k) {
    return json_integer_value(json_object_get(j->extra, k));
}

static void xset(sv_job *j, const char *k, long long v) {
    json_object_set_new(j->extra, k, json_integer(v));
}

/* An item id: prefix + the response id's hex + the output index. */
static json_t *item_id(const sv_job *j, const char *prefix, long long index) {
    char id[96];
    snprintf(id, sizeof id, "%s%s_%lld", prefix, j->id + 5, index);
    return json_string(id);
}

static json_t *usage(const sv_job *j) {
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:I}, s:i}", "input_tokens", j->st.prompt_tokens, "input_tokens_details",
                     "cached_tokens", j->st.cached_tokens, "output_tokens", j->st.generated_tokens,
                     "output_tokens_details", "reasoning_tokens", xget(j, "reasoning_tokens"), "total_tokens",
                     j->st.prompt_tokens + j->st.generated_tokens);
}

static int incomplete(const sv_job *j) {
    return j->st.finish_reason && !strcmp(j->st.finish_reason, "length") && !j->n_tools;
}

/* The Response object: the request's settings echoed, status, output and usage (NULL for none yet). */
static json_t *response(const sv_job *j, const char *status, json_t *output, json_t *use) {
    json_t *req = json_object_get(j->extra, "echo");
    json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:b, s:n, s:n}", "id", j->id, "object", "response", "created_at",
                          j->created, "status", status, "background", 0, "error", "incomplete_details");
    json_object_update(r, req);
    json_object_set_new(r, "output", output ? output : json_array());
    json_object_set_new(r, "usage", use ? use : json_null());
    if (!strcmp(status, "incomplete"))
        json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    return r;
}

/* One event: `event: TYPE` and data with type and sequence_number first. */
static void event(sv_job *j, const char *type, json_t *fields) {
    long long seq = xget(j, "seq");
    xset(j, "seq", seq + 1);
    json_t *ev = json_pack("{s:s, s:I}", "type", type, "sequence_number", seq);
    json_object_update(ev, fields);
    json_decref(fields);
    sv_job_sse(j, type, ev);
}

static const char *text_from(const sv_job *j, sv_buf *b, const char *key, size_t *len) {
    size_t from = (size_t)xget(j, key);
    *len = b->len > from ? b->len - from : 0;
    return b->p && *len ? b->p + from : "";
}

static json_t *reasoning_item(const sv_job *j, const char *status, int index) {
    size_t n;
    const char *t = text_from(j, (sv_buf *)&j->reasoning, "item_from", &n);
    int summary = json_is_true(json_object_get(j->extra, "summary"));
    json_t *it =
        json_pack("{s:o, s:s, s:[], s:[{s:s, s:s%}], s:n, s:s}", "id", item_id(j, "rs_", index), "type", "reasoning",
                  "summary", "content", "type", "reasoning_text", "text", t, n, "encrypted_content", "status", status);
    if (summary)
        json_array_append_new(json_object_get(it, "summary"),
                              json_pack("{s:s, s:s%}", "type", "summary_text", "text", t, n));
    return it;
}

static json_t *text_part(const char *t, size_t n) {
    return json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", t, n, "annotations", "logprobs");
}

static json_t *message_item(const sv_job *j, const char *status, int index, int with_text) {
    size_t n;
    const char *t = text_from(j, (sv_buf *)&j->content, "item_from", &n);
    json_t *it = json_pack("{s:o, s:s, s:s, s:s, s:[]}", "id", item_id(j, "msg_", index), "type", "message", "status",
                           status, "role", "assistant", "content");
    if (with_text) json_array_append_new(json_object_get(it, "content"), text_part(t, n));
    return it;
}

static json_t *call_item(const sv_job *j, const sv_tool *t, const char *status, int index) {
    const char *call_id = t->id;
    json_t *it = json_pack("{s:o, s:s, s:s, s:s, s:s, s:s}", "id", item_id(j, "fc_", index), "type", "function_call",
                           "status", status, "call_id", call_id, "name", t->name, "arguments",
                           t->args.p && !json_object_get(j->extra, "open") ? t->args.p : "");
    /* a tool declared inside a namespace is called by its own name, with the namespace beside it */
    json_t *ns = json_object_get(json_object_get(j->extra, "namespaced"), t->name);
    if (json_is_array(ns)) {
        json_object_set(it, "namespace", json_array_get(ns, 0));
        json_object_set(it, "name", json_array_get(ns, 1));
    }
    return it;
}

static json_t *call_item_done(const sv_job *j, const sv_tool *t, int index) {
    json_t *it = call_item(j, t, "completed", index);
    json_object_set_new(it, "arguments", json_string(t->args.p ? t->args.p : "{}"));
    return it;
}

/* Ends the open output item: its closing events when streaming, and the item appended to the output. */
static void close_item(sv_job *j) {
    int kind = (int)xget(j, "kind"), index = (int)xget(j, "index");
    if (kind == ITEM_NONE) return;
    const char *status = incomplete(j) ? "incomplete" : "completed";
    json_t *done = NULL;
    json_t *id = NULL;
    if (kind == ITEM_REASONING) {
        done = reasoning_item(j, "completed", index);
        id = json_object_get(done, "id");
        if (j->stream) {
            json_t *text = json_object_get(json_array_get(json_object_get(done, "content"), 0), "text");
            if (json_is_true(json_object_get(j->extra, "summary"))) {
                event(j, "response.reasoning_summary_text.done",
                      json_pack("{s:O, s:i, s:i, s:O}", "item_id", id, "output_index", index, "summary_index", 0,
                                "text", text));
                event(j, "response.reasoning_summary_part.done",
                      json_pack("{s:O, s:i, s:i, s:{s:s, s:O}}", "item_id", id, "output_index", index, "summary_index",
                                0, "part", "type", "summary_text", "text", text));
            } else {
                event(j, "response.reasoning_text.done",
                      json_pack("{s:O, s:i, s:i, s:O}", "item_id", id, "output_index", index, "content_index", 0,
                                "text", text));
            }
        }
    } else if (kind == ITEM_MESSAGE) {
        done = message_item(j, status, index, 1);
        id = json_object_get(done, "id");
        if (j->stream) {
            json_t *part = json_array_get(json_object_get(done, "content"), 0);
            event(j, "response.output_text.done",
                  json_pack("{s:O, s:i, s:i, s:O, s:[]}", "item_id", id, "output_index", index, "content_index", 0,
                            "text", json_object_get(part, "text"), "logprobs"));
            event(j, "response.content_part.done",
                  json_pack("{s:O, s:i, s:i, s:O}", "item_id", id, "output_index", index, "content_index", 0, "part",
                            part));
        }
    } else {
        json_object_del(j->extra, "open");
        const sv_tool *t = &j->tool_calls[xget(j, "tool")];
        done = call_item_done(j, t, index);
        id = json_object_get(done, "id");
        if (j->stream)
            event(j, "response.function_call_arguments.done",
                  json_pack("{s:O, s:i, s:O, s:O}", "item_id", id, "output_index", index, "name",
                            json_object_get(done, "name"), "arguments", json_object_get(done, "arguments")));
    }
    if (j->stream) event(j, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", index, "item", done));
    json_array_append_new(json_object_get(j->extra, "output"), done);
    xset(j, "kind", ITEM_NONE);
    xset(j, "index", index + 1);
}

/* Opens an output item of a new kind at the next index; `pending` bytes of its text are already in the
 * job's buffer (the engine appends before it hands the event on). */
static void open_item(sv_job *j, int kind, size_t pending) {
    close_item(j);
    int index = (int)xget(j, "index");
    xset(j, "kind", kind);
    json_t *added = NULL;
    if (kind == ITEM_REASONING) {
        xset(j, "item_from", (long long)(j->reasoning.len - pending));
        added = reasoning_item(j, "in_progress", index);
        json_array_clear(json_object_get(added, "content"));
        json_array_clear(json_object_get(added, "summary"));
    } else if (kind == ITEM_MESSAGE) {
        xset(j, "item_from", (long long)(j->content.len - pending));
        xset(j, "messages", xget(j, "messages") + 1);
        added = message_item(j, "in_progress", index, 0);
    } else {
        xset(j, "tool", j->n_tools - 1);
        json_object_set_new(j->extra, "open", json_true());
        added = call_item(j, &j->tool_calls[j->n_tools - 1], "in_progress", index);
    }
    if (!j->stream) {
        json_decref(added);
        return;
    }
    json_t *id = json_incref(json_object_get(added, "id"));
    event(j, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", index, "item", added));
    if (kind == ITEM_MESSAGE)
        event(j, "response.content_part.added",
              json_pack("{s:O, s:i, s:i, s:o}", "item_id", id, "output_index", index, "content_index", 0, "part",
                        text_part("", 0)));
    else if (kind == ITEM_REASONING && json_is_true(json_object_get(j->extra, "summary")))
        event(j, "response.reasoning_summary_part.added",
              json_pack("{s:O, s:i, s:i, s:{s:s, s:s}}", "item_id", id, "output_index", index, "summary_index", 0,
                        "part", "type", "summary_text", "text", ""));
    json_decref(id);
}

static void w_begin(sv_job *j) {
    if (!j->stream) return;
    event(j, "response.created", json_pack("{s:o}", "response", response(j, "in_progress", NULL, NULL)));
    event(j, "response.in_progress", json_pack("{s:o}", "response", response(j, "in_progress", NULL, NULL)));
}

static void w_event(sv_job *j, const sl_tc_event *ev) {
    int kind = (int)xget(j, "kind"), index;
    switch (ev->kind) {
    case SL_TC_REASONING:
        xset(j, "reasoning_tokens", xget(j, "reasoning_tokens") + 1);
        if (kind != ITEM_REASONING) open_item(j, ITEM_REASONING, ev->len);
        break;
    case SL_TC_TEXT:
        if (kind != ITEM_MESSAGE) open_item(j, ITEM_MESSAGE, ev->len);
        break;
    case SL_TC_TOOL_START: open_item(j, ITEM_CALL, 0); return;
    case SL_TC_TOOL_ARGS: break;
    case SL_TC_TOOL_END: close_item(j); return;
    }
    if (!j->stream) return;
    index = (int)xget(j, "index");
    const char *prefix = ev->kind == SL_TC_TEXT ? "msg_" : ev->kind == SL_TC_REASONING ? "rs_" : "fc_";
    json_t *f = json_pack("{s:o, s:i, s:s%}", "item_id", item_id(j, prefix, index), "output_index", index, "delta",
                          ev->text, ev->len);
    if (ev->kind == SL_TC_TEXT) {
        json_object_set_new(f, "content_index", json_integer(0));
        json_object_set_new(f, "logprobs", json_array());
        event(j, "response.output_text.delta", f);
    } else if (ev->kind == SL_TC_REASONING) {
        int summary = json_is_true(json_object_get(j->extra, "summary"));
        json_object_set_new(f, summary ? "summary_index" : "content_index", json_integer(0));
        event(j, summary ? "response.reasoning_summary_text.delta" : "response.reasoning_text.delta", f);
    } else {
        event(j, "response.function_call_arguments.delta", f);
    }
}

static void w_finish(sv_job *j) {
    /* a reply with neither text nor a call still has its (empty) message */
    if (!j->n_tools && !xget(j, "messages")) open_item(j, ITEM_MESSAGE, 0);
    close_item(j);
    const char *status = incomplete(j) ? "incomplete" : "completed";
    json_t *r = response(j, status, json_incref(json_object_get(j->extra, "output")), usage(j));
    if (j->stream) {
        event(j, !strcmp(status, "completed") ? "response.completed" : "response.incomplete",
              json_pack("{s:o}", "response", r));
        return;
    }
    sv_buf_json(&j->out, r);
    sv_job_emit(j, "", 0);
}

static void w_fail(sv_job *j, const char *msg) {
    if (j->stream) {
        json_t *r = response(j, "failed", json_incref(json_object_get(j->extra, "output")), NULL);
        json_object_set_new(r, "error", json_pack("{s:s, s:s}", "code", "server_error", "message", msg));
        event(j, "response.failed", json_pack("{s:o}", "response", r));
        return;
    }
    j->status = 500;
    sv_buf_json(&j->out, json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type", "server_error", "param",
                                   "code", "server_error"));
    sv_job_emit(j, "", 0);
}

static const sv_writer writer = {w_begin, w_event, w_finish, w_fail};

/* ---- the request ---- */

/* Text of message content: a string or an array of text parts (input_text, output_text, text, refusal). A
 * tool's output (lenient) may also hold images or files, which a text model cannot take: each becomes a short
 * note, so the turn goes on. */
static int content_text(json_t *c, const char *path, int lenient, sv_buf *out, sv_error *er) {
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        sv_buf_puts(out, json_string_value(c));
        return 0;
    }
    if (!json_is_array(c)) return sv_bad(er, 400, path, "%s must be a string or an array of content parts", path);
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        const char *text = json_string_value(json_object_get(p, "text"));
        if (type && !strcmp(type, "refusal")) text = json_string_value(json_object_get(p, "refusal"));
        if (lenient && type && (!strcmp(type, "input_image") || !strcmp(type, "input_file"))) {
            sv_buf_puts(out, !strcmp(type, "input_image") ? "[an image, which this model cannot see]"
                                                          : "[a file, which this model cannot read]");
            continue;
        }
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
                      strcmp(type, "refusal") && strcmp(type, "summary_text") && strcmp(type, "reasoning_text")))
            return sv_bad(er, 400, path, "%s[%zu]: content parts of type '%s' are not supported (text parts only)",
                          path, i, type ? type : "(none)");
        if (!text) return sv_bad(er, 400, path, "%s[%zu].text must be a string", path, i);
        sv_buf_puts(out, text);
    }
    return 0;
}

/* The assistant message that function calls join: the last message when it is the assistant's and no tool
 * output followed it, else a new one. */
static json_t *assistant_for_call(json_t *msgs) {
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (last && role && !strcmp(role, "assistant")) return last;
    json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
    json_array_append_new(msgs, m);
    return m;
}

/* input (a string or an array of items) after instructions, as chat messages. */
static int input_messages(json_t *b, json_t *msgs, sv_error *er) {
    json_t *in = json_object_get(b, "input");
    if (json_is_string(in)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", in));
        return 0;
    }
    if (!json_is_array(in) || !json_array_size(in))
        return sv_bad(er, 400, "input", "input must be a string or a non-empty array of input items");
    sv_buf reasoning = {0};
    size_t i;
    json_t *it;
    char path[64];
    int rc = 0;
    json_array_foreach(in, i, it) {
        snprintf(path, sizeof path, "input[%zu]", i);
        if (!json_is_object(it)) {
            rc = sv_bad(er, 400, path, "%s must be an object (an input item)", path);
            break;
        }
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!type && json_object_get(it, "role")) type = "message";
        if (!type) {
            rc = sv_bad(er, 400, path, "%s.type must be a string", path);
            break;
        }
        if (!strcmp(type, "message")) {
            const char *role = json_string_value(json_object_get(it, "role"));
            if (role && !strcmp(role, "developer")) role = "system";
            if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))) {
                strcat(path, ".role");
                rc = sv_bad(er, 400, path, "%s must be user, assistant, system or developer, got '%s'", path,
                            role ? role : "(none)");
                break;
            }
            sv_buf t = {0};
            char cpath[80];
            snprintf(cpath, sizeof cpath, "%s.content", path);
            if ((rc = content_text(json_object_get(it, "content"), cpath, 0, &t, er))) {
                sv_buf_free(&t);
                break;
            }
            json_t *m = json_pack("{s:s, s:s}", "role", role, "content", t.p ? t.p : "");
            sv_buf_free(&t);
            if (!strcmp(role, "assistant") && reasoning.len) {
                json_object_set_new(m, "reasoning_content", json_string(reasoning.p));
                sv_buf_free(&reasoning);
            }
            json_array_append_new(msgs, m);
        } else if (!strcmp(type, "function_call") || !strcmp(type, "custom_tool_call")) {
            int custom = !strcmp(type, "custom_tool_call");
            const char *name = json_string_value(json_object_get(it, "name"));
            const char *call_id = json_string_value(json_object_get(it, "call_id"));
            const char *ns = json_string_value(json_object_get(it, "namespace"));
            json_t *args = json_object_get(it, custom ? "input" : "arguments");
            if (!name || !call_id || !json_is_string(args)) {
                rc = sv_bad(er, 400, path, "%s: %s needs string call_id, name and %s", path, type,
                            custom ? "input" : "arguments");
                break;
            }
            char full[256];
            snprintf(full, sizeof full, "%s%s%s", ns ? ns : "", ns ? "." : "", name);
            json_t *m = assistant_for_call(msgs);
            json_t *calls = json_object_get(m, "tool_calls");
            if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
            json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", call_id, "type", "function",
                                                   "function", "name", full, "arguments",
                                                   custom ? json_pack("{s:O}", "input", args) : sv_args_object(args)));
            if (reasoning.len && !json_object_get(m, "reasoning_content")) {
                json_object_set_new(m, "reasoning_content", json_string(reasoning.p));
                sv_buf_free(&reasoning);
            }
        } else if (!strcmp(type, "function_call_output") || !strcmp(type, "custom_tool_call_output")) {
            const char *call_id = json_string_value(json_object_get(it, "call_id"));
            if (!call_id) {
                rc = sv_bad(er, 400, path, "%s.call_id must be a string", path);
                break;
            }
            sv_buf t = {0};
            char cpath[80];
            snprintf(cpath, sizeof cpath, "%s.output", path);
            if ((rc = content_text(json_object_get(it, "output"), cpath, 1, &t, er))) {
                sv_buf_free(&t);
                break;
            }
            json_array_append_new(
                msgs, json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", call_id, "content", t.p ? t.p : ""));
            sv_buf_free(&t);
        } else if (!strcmp(type, "reasoning")) {
            /* the raw reasoning when the client kept it, else its summary; it goes with the next assistant turn
             * (templates drop it from earlier turns as they choose); encrypted content cannot be read here */
            sv_buf t = {0};
            json_t *c = json_object_get(it, "content");
            if (!json_is_array(c) || !json_array_size(c)) c = json_object_get(it, "summary");
            char cpath[80];
            snprintf(cpath, sizeof cpath, "%s.content", path);
            if (json_is_array(c) && (rc = content_text(c, cpath, 0, &t, er))) {
                sv_buf_free(&t);
                break;
            }
            sv_buf_free(&reasoning);
            reasoning = t;
        } else if (!strcmp(type, "item_reference")) {
            rc = sv_bad(er, 400, path,
                        "%s: item_reference needs stored items, and this server stores none; send the "
                        "items themselves",
                        path);
            break;
        } else {
            rc = sv_bad(er, 400, path,
                        "%s.type '%s' is not supported (message, function_call, function_call_output, reasoning)", path,
                        type);
            break;
        }
    }
    sv_buf_free(&reasoning);
    return rc;
}

/* One flat function tool ({type, name, description, parameters, strict}) in the chat templates' shape. */
static json_t *chat_tool(json_t *t, const char *name) {
    json_t *fn = json_pack("{s:s}", "name", name);
    json_t *v;
    if (json_is_string(v = json_object_get(t, "description"))) json_object_set(fn, "description", v);
    if (json_is_object(v = json_object_get(t, "parameters")))
        json_object_set(fn, "parameters", v);
    else
        json_object_set_new(fn, "parameters", json_pack("{s:s, s:{}}", "type", "object", "properties"));
    return json_pack("{s:s, s:o}", "type", "function", "function", fn);
}

static int function_tool(json_t *t, const char *path, const char *ns, json_t *out, json_t *namespaced, sv_error *er) {
    const char *name = json_string_value(json_object_get(t, "name"));
    if (json_object_get(t, "function") && !name)
        return sv_bad(er, 400, path,
                      "%s: Responses API tools are flat ({\"type\": \"function\", \"name\": ..., \"parameters\": "
                      "...}), not nested under \"function\" as in chat completions",
                      path);
    if (!name || !*name) return sv_bad(er, 400, path, "%s.name must be a non-empty string", path);
    json_t *p = json_object_get(t, "parameters");
    if (p && !json_is_null(p) && !json_is_object(p))
        return sv_bad(er, 400, path, "%s.parameters must be an object (a JSON schema)", path);
    char full[256];
    snprintf(full, sizeof full, "%s%s%s", ns ? ns : "", ns ? "." : "", name);
    json_array_append_new(out, chat_tool(t, full));
    if (ns) json_object_set_new(namespaced, full, json_pack("[s, s]", ns, name));
    return 0;
}

/* tools: function tools and namespaces of them; hosted tools (web_search, file_search, ...) are not run here
 * and are left out with a note in the log. */
static int parse_tools(json_t *b, json_t **tools, json_t *namespaced, sv_error *er) {
    json_t *t;
    int rc = sv_get_array(b, "tools", "tools", &t, er);
    if (rc <= 0) return rc;
    json_t *out = json_array();
    size_t i;
    json_t *x;
    char path[64];
    json_array_foreach(t, i, x) {
        snprintf(path, sizeof path, "tools[%zu]", i);
        const char *type = json_string_value(json_object_get(x, "type"));
        if (!json_is_object(x) || !type) {
            json_decref(out);
            return sv_bad(er, 400, path, "%s must be an object with a string type", path);
        }
        if (!strcmp(type, "function")) {
            if (function_tool(x, path, NULL, out, namespaced, er)) goto fail;
        } else if (!strcmp(type, "namespace")) {
            const char *ns = json_string_value(json_object_get(x, "name"));
            json_t *inner = json_object_get(x, "tools");
            if (!ns || !*ns || !json_is_array(inner)) {
                sv_bad(er, 400, path, "%s: a namespace needs a string name and an array of tools", path);
                goto fail;
            }
            size_t k;
            json_t *y;
            json_array_foreach(inner, k, y) {
                char ipath[96];
                snprintf(ipath, sizeof ipath, "%s.tools[%zu]", path, k);
                const char *itype = json_string_value(json_object_get(y, "type"));
                if (itype && strcmp(itype, "function")) {
                    fprintf(stderr, "sluice serve: POST /v1/responses: %s of type '%s' is not supported; skipped\n",
                            ipath, itype);
                    continue;
                }
                if (function_tool(y, ipath, ns, out, namespaced, er)) goto fail;
            }
        } else {
            fprintf(stderr,
                    "sluice serve: POST /v1/responses: %s of type '%s' (a hosted or custom tool) is not available "
                    "here; skipped\n",
                    path, type);
        }
    }
    if (json_array_size(out))
        *tools = out;
    else
        json_decref(out);
    return 0;
fail:
    json_decref(out);
    return -1;
}

/* tool_choice: "auto", "none", "required" or {"type": "function", "name": ...}. */
static int tool_choice(json_t *b, json_t **tools, sv_job *j, sv_error *er) {
    json_t *c = json_object_get(b, "tool_choice");
    if (!c || json_is_null(c)) return 0;
    const char *name = NULL;
    if (json_is_string(c)) {
        const char *s = json_string_value(c);
        if (!strcmp(s, "none")) {
            json_decref(*tools);
            *tools = NULL;
            return 0;
        }
        if (!strcmp(s, "auto")) return 0;
        if (strcmp(s, "required"))
            return sv_bad(er, 400, "tool_choice",
                          "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": "
                          "...}, got \"%s\"",
                          s);
        name = "";
    } else if (json_is_object(c)) {
        const char *type = json_string_value(json_object_get(c, "type"));
        if (type && !strcmp(type, "allowed_tools")) return 0; /* every tool stays offered */
        if (!type || strcmp(type, "function"))
            return sv_bad(er, 400, "tool_choice.type",
                          "tool_choice.type must be \"function\" (hosted tools are not "
                          "available here), got %s%s%s",
                          type ? "'" : "", type ? type : "none", type ? "'" : "");
        name = json_string_value(json_object_get(c, "name"));
        if (!name) return sv_bad(er, 400, "tool_choice.name", "tool_choice.name must be a string");
    } else {
        return sv_bad(er, 400, "tool_choice", "tool_choice must be a string or an object");
    }
    if (!*tools)
        return sv_bad(er, 400, "tool_choice", "tool_choice asks for a tool call but the request has no function tools");
    if (*name && sv_tool_choice_name(*tools, name, "tool_choice.name", er)) return -1;
    if (!(j->force_tool = strdup(name))) return sv_bad(er, 500, "", "out of memory");
    return 0;
}

/* The settings a Response echoes, as the request gave them (defaults where it did not). */
static json_t *echo(sv_engine *g, json_t *b, const char *model, const sv_job *j) {
    json_t *e = json_pack("{s:s, s:b, s:n, s:s}", "model", model ? model : g->name, "parallel_tool_calls", 1,
                          "previous_response_id", "truncation", "disabled");
    const char *keys[] = {"instructions", "max_output_tokens",
                          "metadata",     "parallel_tool_calls",
                          "reasoning",    "store",
                          "text",         "tool_choice",
                          "tools",        "user",
                          "truncation"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(b, keys[i]);
        json_object_set(e, keys[i], v ? v : json_null());
    }
    if (json_is_null(json_object_get(e, "metadata"))) json_object_set_new(e, "metadata", json_object());
    if (json_is_null(json_object_get(e, "tools"))) json_object_set_new(e, "tools", json_array());
    if (json_is_null(json_object_get(e, "tool_choice"))) json_object_set_new(e, "tool_choice", json_string("auto"));
    if (json_is_null(json_object_get(e, "parallel_tool_calls")))
        json_object_set_new(e, "parallel_tool_calls", json_true());
    if (json_is_null(json_object_get(e, "truncation"))) json_object_set_new(e, "truncation", json_string("disabled"));
    if (json_is_null(json_object_get(e, "store"))) json_object_set_new(e, "store", json_true());
    if (json_is_null(json_object_get(e, "text")))
        json_object_set_new(e, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    if (json_is_null(json_object_get(e, "reasoning")))
        json_object_set_new(e, "reasoning", json_pack("{s:n, s:n}", "effort", "summary"));
    /* the sampler keeps floats: echoed at their 6 significant digits, not the float's binary expansion */
    char num[32];
    snprintf(num, sizeof num, "%.6g", j->gen.sampling.temperature);
    json_object_set_new(e, "temperature", json_real(strtod(num, NULL)));
    snprintf(num, sizeof num, "%.6g", j->gen.sampling.top_p);
    json_object_set_new(e, "top_p", json_real(strtod(num, NULL)));
    return e;
}

static int parse(sv_engine *g, json_t *b, sv_job *j, json_t **msgs_out, json_t **tools_out, json_t **vars_out,
                 int *think, sv_error *er) {
    double d;
    long long n;
    int rc, flag;
    const char *s;
    json_t *o;
    sl_sampler_params *sp = &j->gen.sampling;
    const char *model = NULL;
    if (sv_get_string(b, "model", "model", &model, er) < 0) return -1;
    if ((rc = sv_get_number(b, "temperature", "temperature", 0, 2, &d, er)) < 0) return -1;
    if (rc) sp->temperature = (float)d;
    if ((rc = sv_get_number(b, "top_p", "top_p", 0, 1, &d, er)) < 0) return -1;
    if (rc) sp->top_p = (float)d;
    if ((rc = sv_get_int(b, "top_k", "top_k", 0, 1 << 30, &n, er)) < 0) return -1;
    if (rc) sp->top_k = (int)n;
    if ((rc = sv_get_int(b, "seed", "seed", -(1LL << 62), 1LL << 62, &n, er)) < 0) return -1;
    if (rc) sp->seed = (uint64_t)n;
    if ((rc = sv_get_int(b, "max_output_tokens", "max_output_tokens", 1, 1 << 30, &n, er)) < 0) return -1;
    if (rc) j->gen.max_tokens = (int)n;
    if (sv_get_bool(b, "stream", "stream", &j->stream, er) < 0) return -1;
    if (sv_get_bool(b, "store", "store", &flag, er) < 0) return -1;
    if (sv_get_bool(b, "parallel_tool_calls", "parallel_tool_calls", &flag, er) < 0) return -1;
    if ((rc = sv_get_bool(b, "background", "background", &flag, er)) < 0) return -1;
    if (rc && flag) return sv_bad(er, 400, "background", "background responses are not supported (nothing is stored)");
    if (sv_get_object(b, "metadata", "metadata", &o, er) < 0) return -1;
    if (sv_get_string(b, "user", "user", &s, er) < 0) return -1;
    if (sv_get_array(b, "include", "include", &o, er) < 0) return -1;
    if ((rc = sv_get_string(b, "previous_response_id", "previous_response_id", &s, er)) < 0) return -1;
    if (rc)
        return sv_bad(er, 400, "previous_response_id",
                      "previous_response_id '%s' cannot be continued: this server stores no responses; send the whole "
                      "conversation in input (with store: false)",
                      s);
    if (json_object_get(b, "conversation") && !json_is_null(json_object_get(b, "conversation")))
        return sv_bad(er, 400, "conversation", "conversation is not supported: this server stores no conversations");

    json_t *msgs = json_array();
    *msgs_out = msgs;
    if ((rc = sv_get_string(b, "instructions", "instructions", &s, er)) < 0) return -1;
    if (rc && *s) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", s));
    if (input_messages(b, msgs, er)) return -1;
    if (!json_array_size(msgs)) return sv_bad(er, 400, "input", "input has no messages");

    j->extra =
        json_pack("{s:i, s:i, s:i, s:[], s:{}}", "seq", 0, "index", 0, "kind", ITEM_NONE, "output", "namespaced");
    if (parse_tools(b, tools_out, json_object_get(j->extra, "namespaced"), er) || tool_choice(b, tools_out, j, er))
        return -1;

    json_t *reasoning;
    if ((rc = sv_get_object(b, "reasoning", "reasoning", &reasoning, er)) < 0) return -1;
    if (rc) {
        const char *effort = NULL, *summary = NULL;
        if (sv_get_string(reasoning, "effort", "reasoning.effort", &effort, er) < 0 ||
            sv_get_string(reasoning, "summary", "reasoning.summary", &summary, er) < 0)
            return -1;
        /* "none" turns thinking off; any other effort turns it on and reaches templates that take it */
        if (sv_template_vars(b, effort, vars_out, think, er)) return -1;
        if (summary && strcmp(summary, "none")) json_object_set_new(j->extra, "summary", json_true());
    } else if (sv_template_vars(b, NULL, vars_out, think, er)) {
        return -1;
    }

    json_t *text;
    if ((rc = sv_get_object(b, "text", "text", &text, er)) < 0) return -1;
    json_t *fmt;
    if (rc && (rc = sv_get_object(text, "format", "text.format", &fmt, er)) < 0) return -1;
    if (rc > 0) {
        const char *type;
        if (sv_get_string(fmt, "type", "text.format.type", &type, er) <= 0)
            return er->status ? -1 : sv_bad(er, 400, "text.format.type", "text.format.type must be a string");
        json_t *schema = json_object_get(fmt, "schema");
        if (!strcmp(type, "json_schema") && !json_is_object(schema))
            return sv_bad(er, 400, "text.format.schema", "text.format.schema must be an object (a JSON schema)");
        if (sv_json_format_note(type, schema, "text.format.type", msgs, er)) return -1;
        /* enforced as chat's response_format is: a grammar from the schema (any JSON object for json_object) */
        if (!strcmp(type, "json_schema") && sv_set_grammar_schema(j, schema, "text.format.schema", er)) return -1;
        if (!strcmp(type, "json_object") && sv_set_grammar_schema(j, NULL, "text.format", er)) return -1;
    }
    json_object_set_new(j->extra, "echo", echo(g, b, model, j));
    return 0;
}

enum MHD_Result sv_openai_responses(sv_req *r) {
    sv_engine *g = r->srv->g;
    sv_error er;
    json_t *msgs = NULL, *tools = NULL, *vars = NULL;
    int think = -1;
    sv_job *j = sv_job_for(g, "resp_");
    if (!j) return MHD_NO;
    j->tool_prefix = "call_";
    if (parse(g, r->json, j, &msgs, &tools, &vars, &think, &er) ||
        sv_prompt_chat_vars(g, msgs, tools, think, vars, j, &er) || sv_check_context(g, j, "max_output_tokens", &er))
        goto bad;
    json_decref(msgs);
    json_decref(vars);
    j->tools = tools;
    j->parse_output = 1;
    j->w = &writer;
    return sv_reply_job(r, j, j->stream ? "text/event-stream" : "application/json");
bad:
    json_decref(msgs);
    json_decref(tools);
    json_decref(vars);
    sv_job_release(j);
    return sv_reply_error(r, &er);
}
