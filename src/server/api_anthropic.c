/* Anthropic Messages API: /v1/messages (whole, or as the message_start / content_block_* / message_delta /
 * message_stop event stream) and /v1/messages/count_tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/request.h"

enum { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING, BLOCK_TOOL };

static json_t *usage(const sv_job *j) {
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", j->st.prompt_tokens - j->st.cached_tokens, "output_tokens",
                     j->st.generated_tokens, "cache_read_input_tokens", j->st.cached_tokens,
                     "cache_creation_input_tokens", 0);
}

static const char *stop_reason(const sv_job *j) {
    if (j->n_tools) return "tool_use";
    if (!strcmp(j->st.finish_reason, "length")) return "max_tokens";
    return j->st.stop_index >= 0 ? "stop_sequence" : "end_turn";
}

static json_t *stop_sequence(const sv_job *j) {
    if (j->n_tools || j->st.stop_index < 0 || j->st.stop_index >= j->gen.n_stops) return json_null();
    return json_string(j->stops[j->st.stop_index]);
}

static const char *model_of(const sv_job *j) {
    return json_string_value(json_object_get(j->extra, "model"));
}

static void close_block(sv_job *j) {
    if (j->block_kind == BLOCK_NONE) return;
    sv_job_sse(j, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", j->block));
    j->block_kind = BLOCK_NONE;
}

static void open_block(sv_job *j, int kind, json_t *block) {
    close_block(j);
    j->block++;
    j->block_kind = kind;
    sv_job_sse(j, "content_block_start",
               json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", j->block, "content_block", block));
}

static void delta(sv_job *j, json_t *d) {
    sv_job_sse(j, "content_block_delta",
               json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", j->block, "delta", d));
}

static void w_begin(sv_job *j) {
    if (!j->stream) return;
    json_t *msg =
        json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}", "id", j->id, "type", "message", "role", "assistant",
                  "model", model_of(j), "content", "stop_reason", "stop_sequence", "usage", usage(j));
    sv_job_sse(j, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", msg));
    sv_job_sse(j, "ping", json_pack("{s:s}", "type", "ping"));
}

static void w_event(sv_job *j, const sl_tc_event *ev) {
    if (!j->stream) return;
    switch (ev->kind) {
    case SL_TC_TEXT:
        if (j->block_kind != BLOCK_TEXT) open_block(j, BLOCK_TEXT, json_pack("{s:s, s:s}", "type", "text", "text", ""));
        delta(j, json_pack("{s:s, s:s%}", "type", "text_delta", "text", ev->text, ev->len));
        break;
    case SL_TC_REASONING:
        if (j->block_kind != BLOCK_THINKING)
            open_block(j, BLOCK_THINKING,
                       json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", ""));
        delta(j, json_pack("{s:s, s:s%}", "type", "thinking_delta", "thinking", ev->text, ev->len));
        break;
    case SL_TC_TOOL_START: {
        sv_tool *t = &j->tool_calls[j->n_tools - 1];
        open_block(j, BLOCK_TOOL,
                   json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", t->id, "name", t->name, "input"));
        break;
    }
    case SL_TC_TOOL_ARGS:
        delta(j, json_pack("{s:s, s:s%}", "type", "input_json_delta", "partial_json", ev->text, ev->len));
        break;
    case SL_TC_TOOL_END: close_block(j); break;
    }
}

static void w_finish(sv_job *j) {
    if (j->stream) {
        close_block(j);
        sv_job_sse(j, "message_delta",
                   json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta", "stop_reason",
                             stop_reason(j), "stop_sequence", stop_sequence(j), "usage", usage(j)));
        sv_job_sse(j, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        return;
    }
    json_t *content = json_array();
    if (j->reasoning.len)
        json_array_append_new(
            content, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", j->reasoning.p, "signature", ""));
    if (j->content.len || (!j->n_tools && !j->reasoning.len))
        json_array_append_new(content,
                              json_pack("{s:s, s:s}", "type", "text", "text", j->content.p ? j->content.p : ""));
    for (int i = 0; i < j->n_tools; i++) {
        sv_tool *t = &j->tool_calls[i];
        json_t *input = json_loads(t->args.p ? t->args.p : "{}", 0, NULL);
        json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", t->id, "name",
                                                 t->name, "input", input ? input : json_object()));
    }
    sv_buf_json(&j->out, json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", j->id, "type", "message", "role",
                                   "assistant", "model", model_of(j), "content", content, "stop_reason", stop_reason(j),
                                   "stop_sequence", stop_sequence(j), "usage", usage(j)));
    sv_job_emit(j, "", 0);
}

static void w_fail(sv_job *j, const char *msg) {
    json_t *err = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", "api_error", "message", msg);
    if (j->stream) {
        sv_job_sse(j, "error", err);
    } else {
        j->status = 500;
        sv_buf_json(&j->out, err);
        sv_job_emit(j, "", 0);
    }
}

static const sv_writer writer = {w_begin, w_event, w_finish, w_fail};

/* Text of a string or of an array of text blocks (tool_result content, system). */
static int block_text(json_t *c, const char *path, sv_buf *out, sv_error *er) {
    if (json_is_string(c)) {
        sv_buf_puts(out, json_string_value(c));
        return 0;
    }
    if (!json_is_array(c)) return sv_bad(er, 400, path, "%s must be a string or an array of text blocks", path);
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        const char *text = json_string_value(json_object_get(b, "text"));
        if (!text)
            return sv_bad(er, 400, path, "%s[%zu] must be a text block {\"type\": \"text\", \"text\": ...}", path, i);
        if (i) sv_buf_puts(out, "\n");
        sv_buf_puts(out, text);
    }
    return 0;
}

/* Claude Code opens its system prompt with a line "x-anthropic-billing-header: ...; cch=NONCE;" whose nonce
 * changes with every request: left in, no request would share a cached prefix with the one before. The
 * line means nothing to the model, so it is dropped (its own block, or its line of a longer text). */
#define BILLING_PREFIX "x-anthropic-billing-header:"

static void drop_billing_lines(sv_buf *b) {
    if (!b->p) return;
    char *r = b->p, *w = b->p;
    while (*r) {
        char *nl = strchr(r, '\n');
        size_t len = nl ? (size_t)(nl - r) + 1 : strlen(r);
        if (strncmp(r, BILLING_PREFIX, sizeof BILLING_PREFIX - 1) != 0) {
            memmove(w, r, len);
            w += len;
        }
        r += len;
    }
    *w = 0;
    b->len = (size_t)(w - b->p);
}

static int convert_message(json_t *m, size_t i, json_t *msgs, sv_error *er) {
    char path[96];
    snprintf(path, sizeof path, "messages[%zu]", i);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
        return sv_bad(er, 400, path, "%s.role must be \"user\", \"assistant\" or \"system\"", path);
    json_t *c = json_object_get(m, "content");
    if (!strcmp(role, "system")) {
        /* a system message within the conversation: kept in place where the template renders one there,
         * else merged into the leading system prompt (sv_prompt_chat) */
        sv_buf s = {0};
        snprintf(path, sizeof path, "messages[%zu].content", i);
        int rc = block_text(c, path, &s, er);
        if (!rc) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", s.p ? s.p : ""));
        sv_buf_free(&s);
        return rc;
    }
    if (json_is_string(c)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", c));
        return 0;
    }
    snprintf(path, sizeof path, "messages[%zu].content", i);
    if (!json_is_array(c)) return sv_bad(er, 400, path, "%s must be a string or an array of content blocks", path);
    int assistant = !strcmp(role, "assistant");
    sv_buf text = {0}, thinking = {0};
    json_t *calls = json_array();
    size_t k;
    json_t *b;
    int rc = 0;
    json_array_foreach(c, k, b) {
        snprintf(path, sizeof path, "messages[%zu].content[%zu]", i, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type) {
            rc = sv_bad(er, 400, path, "%s.type must be a string", path);
        } else if (!strcmp(type, "text")) {
            const char *t = json_string_value(json_object_get(b, "text"));
            if (!t)
                rc = sv_bad(er, 400, path, "%s.text must be a string", path);
            else
                sv_buf_puts(&text, t);
        } else if (!strcmp(type, "thinking") && assistant) {
            const char *t = json_string_value(json_object_get(b, "thinking"));
            if (t) sv_buf_puts(&thinking, t);
        } else if (!strcmp(type, "redacted_thinking") && assistant) {
            continue;
        } else if (!strcmp(type, "tool_use") && assistant) {
            const char *id = json_string_value(json_object_get(b, "id"));
            const char *name = json_string_value(json_object_get(b, "name"));
            json_t *input = json_object_get(b, "input");
            if (!id || !name || !json_is_object(input))
                rc = sv_bad(er, 400, path, "%s: tool_use needs a string id, a string name and an object input", path);
            else
                json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:O}}", "id", id, "type", "function",
                                                       "function", "name", name, "arguments", input));
        } else if (!strcmp(type, "tool_result") && !assistant) {
            const char *id = json_string_value(json_object_get(b, "tool_use_id"));
            json_t *rc_content = json_object_get(b, "content");
            sv_buf r = {0};
            char cpath[112];
            snprintf(cpath, sizeof cpath, "%s.content", path);
            if (!id)
                rc = sv_bad(er, 400, path, "%s.tool_use_id must be a string", path);
            else if (rc_content && block_text(rc_content, cpath, &r, er))
                rc = -1;
            else
                json_array_append_new(
                    msgs, json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", id, "content", r.p ? r.p : ""));
            sv_buf_free(&r);
        } else {
            rc = sv_bad(er, 400, path, "%s: content blocks of type '%s' are not supported in %s messages", path, type,
                        role);
        }
        if (rc) break;
    }
    if (!rc && (text.len || json_array_size(calls) || thinking.len || !json_array_size(c))) {
        json_t *o = json_pack("{s:s, s:s}", "role", role, "content", text.p ? text.p : "");
        if (thinking.len) json_object_set_new(o, "reasoning_content", json_string(thinking.p));
        if (json_array_size(calls)) json_object_set(o, "tool_calls", calls);
        json_array_append_new(msgs, o);
    }
    json_decref(calls);
    sv_buf_free(&text);
    sv_buf_free(&thinking);
    return rc;
}

/* Fills the job's prompt and settings from a Messages request; count_only skips what only generation needs. */
static int parse(sv_engine *g, json_t *b, sv_job *j, int count_only, sv_error *er) {
    const char *model;
    if (sv_get_string(b, "model", "model", &model, er) <= 0)
        return er->status ? -1 : sv_bad(er, 400, "model", "model: field required (a string)");
    long long n;
    double d;
    int rc;
    if (!count_only) {
        if ((rc = sv_get_int(b, "max_tokens", "max_tokens", 1, 1 << 30, &n, er)) <= 0)
            return rc < 0 ? -1 : sv_bad(er, 400, "max_tokens", "max_tokens: field required (an integer >= 1)");
        j->gen.max_tokens = (int)n;
        sl_sampler_params *sp = &j->gen.sampling;
        if ((rc = sv_get_number(b, "temperature", "temperature", 0, 1, &d, er)) < 0) return -1;
        if (rc) sp->temperature = (float)d;
        if ((rc = sv_get_number(b, "top_p", "top_p", 0, 1, &d, er)) < 0) return -1;
        if (rc) sp->top_p = (float)d;
        if ((rc = sv_get_int(b, "top_k", "top_k", 0, 1 << 30, &n, er)) < 0) return -1;
        if (rc) sp->top_k = (int)n;
        json_t *ss;
        if ((rc = sv_get_array(b, "stop_sequences", "stop_sequences", &ss, er)) < 0) return -1;
        if (rc && sv_set_stops(j, ss, "stop_sequences", er)) return -1;
        if (sv_get_bool(b, "stream", "stream", &j->stream, er) < 0) return -1;
    }
    json_t *in;
    if (sv_get_array(b, "messages", "messages", &in, er) <= 0)
        return er->status ? -1 : sv_bad(er, 400, "messages", "messages: field required (an array)");
    if (!json_array_size(in)) return sv_bad(er, 400, "messages", "messages must not be empty");
    json_t *msgs = json_array(), *tools = NULL;
    json_t *sys = json_object_get(b, "system");
    if (sys && !json_is_null(sys)) {
        sv_buf s = {0};
        if (block_text(sys, "system", &s, er)) {
            sv_buf_free(&s);
            goto fail;
        }
        drop_billing_lines(&s);
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", s.p ? s.p : ""));
        sv_buf_free(&s);
    }
    size_t i;
    json_t *m;
    json_array_foreach(in, i, m) if (convert_message(m, i, msgs, er)) goto fail;
    json_t *t;
    if ((rc = sv_get_array(b, "tools", "tools", &t, er)) < 0) goto fail;
    json_t *choice = json_object_get(b, "tool_choice");
    const char *ctype = json_string_value(json_object_get(choice, "type"));
    if (rc && json_array_size(t) && !(ctype && !strcmp(ctype, "none"))) {
        tools = json_array();
        json_t *x;
        json_array_foreach(t, i, x) {
            const char *name = json_string_value(json_object_get(x, "name"));
            json_t *schema = json_object_get(x, "input_schema");
            if (!name || !json_is_object(schema)) {
                char path[48];
                snprintf(path, sizeof path, "tools[%zu]", i);
                sv_bad(er, 400, path,
                       "%s needs a string name and an object input_schema (server tools are not "
                       "supported)",
                       path);
                goto fail;
            }
            json_t *fn = json_pack("{s:s, s:O}", "name", name, "parameters", schema);
            json_t *desc = json_object_get(x, "description");
            if (json_is_string(desc)) json_object_set(fn, "description", desc);
            json_array_append_new(tools, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
    }
    if (tools && ctype && (!strcmp(ctype, "any") || !strcmp(ctype, "tool"))) {
        const char *name = "";
        if (!strcmp(ctype, "tool")) {
            name = json_string_value(json_object_get(choice, "name"));
            if (!name) {
                sv_bad(er, 400, "tool_choice.name", "tool_choice of type \"tool\" needs a name");
                goto fail;
            }
            if (sv_tool_choice_name(tools, name, "tool_choice.name", er)) goto fail;
        }
        if (!(j->force_tool = strdup(name))) {
            sv_bad(er, 500, "", "out of memory");
            goto fail;
        }
    } else if (ctype && strcmp(ctype, "auto") && strcmp(ctype, "none") && strcmp(ctype, "any") &&
               strcmp(ctype, "tool")) {
        sv_bad(er, 400, "tool_choice.type", "tool_choice.type must be auto, any, tool or none, got \"%s\"", ctype);
        goto fail;
    }
    int think = -1;
    json_t *th = json_object_get(b, "thinking");
    const char *ttype = json_string_value(json_object_get(th, "type"));
    if (ttype) think = !strcmp(ttype, "enabled");
    if (sv_prompt_chat(g, msgs, tools, think, j, er)) goto fail;
    json_decref(msgs);
    j->tools = tools;
    j->parse_output = 1;
    j->tool_prefix = "toolu_";
    j->extra = json_pack("{s:s}", "model", model);
    j->w = &writer;
    return 0;
fail:
    json_decref(msgs);
    json_decref(tools);
    return -1;
}

/* The context checks in Anthropic's own words, which clients (Claude Code) parse to shrink max_tokens or
 * compact the conversation. */
static int check_context(sv_engine *g, const sv_job *j, sv_error *er) {
    if (j->n_ids >= g->ctx)
        return sv_bad(er, 400, "messages", "prompt is too long: %d tokens > %d maximum", j->n_ids, g->ctx - 1);
    if (j->n_ids + j->gen.max_tokens > g->ctx)
        return sv_bad(er, 400, "max_tokens",
                      "input length and `max_tokens` exceed context limit: %d + %d > %d, decrease input length or "
                      "`max_tokens` and try again",
                      j->n_ids, j->gen.max_tokens, g->ctx);
    return sv_check_context(g, j, "max_tokens", er);
}

enum MHD_Result sv_anthropic_messages(sv_req *r) {
    sv_error er = {0};
    sv_job *j = sv_job_for(r->srv->g, "msg_");
    if (!j) return MHD_NO;
    if (parse(r->srv->g, r->json, j, 0, &er) || check_context(r->srv->g, j, &er)) {
        sv_job_release(j);
        return sv_reply_error(r, &er);
    }
    return sv_reply_job(r, j, j->stream ? "text/event-stream" : "application/json");
}

enum MHD_Result sv_anthropic_count_tokens(sv_req *r) {
    sv_error er = {0};
    sv_job *j = sv_job_for(r->srv->g, "msg_");
    if (!j) return MHD_NO;
    enum MHD_Result rc = parse(r->srv->g, r->json, j, 1, &er)
                             ? sv_reply_error(r, &er)
                             : sv_reply_json(r, 200, json_pack("{s:i}", "input_tokens", j->n_ids));
    sv_job_release(j);
    return rc;
}
