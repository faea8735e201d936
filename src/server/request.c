#include "server/request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "text/chat.h"
#include "text/json_schema.h"

static const char *type_name(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int sv_get_number(json_t *o, const char *key, const char *path, double lo, double hi, double *out, sv_error *er) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return sv_bad(er, 400, path, "%s must be a number, got %s", path, type_name(v));
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return sv_bad(er, 400, path, "%s must be in [%g, %g], got %g", path, lo, hi, d);
    *out = d;
    return 1;
}

int sv_get_int(json_t *o, const char *key, const char *path, long long lo, long long hi, long long *out, sv_error *er) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return sv_bad(er, 400, path, "%s must be an integer, got %s", path, type_name(v));
    long long d = json_integer_value(v);
    if (d < lo || d > hi) return sv_bad(er, 400, path, "%s must be in [%lld, %lld], got %lld", path, lo, hi, d);
    *out = d;
    return 1;
}

int sv_get_bool(json_t *o, const char *key, const char *path, int *out, sv_error *er) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return sv_bad(er, 400, path, "%s must be a boolean, got %s", path, type_name(v));
    *out = json_is_true(v);
    return 1;
}

int sv_get_string(json_t *o, const char *key, const char *path, const char **out, sv_error *er) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return sv_bad(er, 400, path, "%s must be a string, got %s", path, type_name(v));
    *out = json_string_value(v);
    return 1;
}

int sv_get_array(json_t *o, const char *key, const char *path, json_t **out, sv_error *er) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return sv_bad(er, 400, path, "%s must be an array, got %s", path, type_name(v));
    *out = v;
    return 1;
}

int sv_get_object(json_t *o, const char *key, const char *path, json_t **out, sv_error *er) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return sv_bad(er, 400, path, "%s must be an object, got %s", path, type_name(v));
    *out = v;
    return 1;
}

sv_job *sv_job_for(sv_engine *g, const char *id_prefix) {
    sv_job *j = sv_job_new();
    if (!j) return NULL;
    j->gen.sampling = g->defaults;
    j->gen.sampling.seed = sv_engine_seed(g);
    snprintf(j->id, sizeof j->id, "%s%016llx", id_prefix, (unsigned long long)sv_engine_seed(g));
    j->created = (long long)time(NULL);
    return j;
}

int sv_set_stops(sv_job *j, json_t *v, const char *path, sv_error *er) {
    if (!v || json_is_null(v)) return 0;
    json_t *one = json_is_string(v) ? v : NULL;
    if (!one && !json_is_array(v))
        return sv_bad(er, 400, path, "%s must be a string or an array of strings, got %s", path, type_name(v));
    size_t n = one ? 1 : json_array_size(v);
    if (n > SV_MAX_STOPS) return sv_bad(er, 400, path, "%s has %zu entries; at most %d", path, n, SV_MAX_STOPS);
    for (size_t i = 0; i < n; i++) {
        json_t *s = one ? one : json_array_get(v, i);
        if (!json_is_string(s)) return sv_bad(er, 400, path, "%s[%zu] must be a string, got %s", path, i, type_name(s));
        if (!(j->stops[j->gen.n_stops++] = strdup(json_string_value(s)))) return sv_bad(er, 500, "", "out of memory");
    }
    j->gen.stops = (const char *const *)j->stops;
    return 0;
}

json_t *sv_args_object(json_t *arguments) {
    if (json_is_string(arguments)) {
        json_t *o = json_loads(json_string_value(arguments), JSON_DECODE_ANY, NULL);
        if (json_is_object(o)) return o;
        json_decref(o);
    }
    return json_incref(arguments);
}

/* The prompt ends inside a reasoning block the template opened ("...<think>\n"). */
static int ends_in_think(const char *p, size_t n) {
    const char *open = NULL;
    for (const char *s = p; (s = strstr(s, "<think>")) != NULL; s++) open = s;
    if (!open || strstr(open, "</think>")) return 0;
    for (const char *s = open + 7; s < p + n; s++)
        if (*s != '\n' && *s != ' ') return 0;
    return 1;
}

static void set_grammar(sv_job *j, sl_grammar *g) {
    sl_grammar_free(j->grammar);
    j->grammar = g;
    j->gen.grammar = g;
}

int sv_set_grammar_gbnf(sv_job *j, const char *gbnf, const char *field, sv_error *er) {
    sl_grammar *g;
    sl_err e = {{0}};
    if (sl_grammar_parse(gbnf, strlen(gbnf), &g, &e)) return sv_bad(er, 400, field, "%s: %s", field, e.msg);
    set_grammar(j, g);
    return 0;
}

int sv_set_grammar_schema(sv_job *j, json_t *schema, const char *field, sv_error *er) {
    sl_grammar *g;
    sl_err e = {{0}};
    if (sl_json_schema_grammar(schema, field, &g, &e)) return sv_bad(er, 400, field, "%s", e.msg);
    set_grammar(j, g);
    return 0;
}

/* The arguments of a forced Hermes-style call, which the prompt opened up to `"name": "NAME", ` (a named
 * function) or up to <tool_call> (any function): they must follow the tool's parameters schema. With
 * args_only, the prompt opened a named call of another format up to its JSON arguments, which are all the
 * grammar holds (the call's closing markup is special tokens, which a grammar cannot name; generation
 * stops once the arguments are complete and the parser takes the call as ended there). */
static int forced_call_grammar(sv_job *j, json_t *tools, int args_only, sv_error *er) {
    sl_jsgen *b = sl_jsgen_new();
    sv_buf alts = {0};
    int rc = b ? 0 : sv_bad(er, 500, "", "out of memory");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (rc) break;
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || (*j->force_tool && strcmp(name, j->force_tool))) continue;
        json_t *params = json_object_get(fn, "parameters");
        char where[64], rule[48];
        snprintf(where, sizeof where, "tools[%zu].function.parameters", i);
        sl_err e = {{0}};
        if (sl_jsgen_add(b, json_is_object(params) ? params : NULL, where, rule, sizeof rule, &e)) {
            rc = sv_bad(er, 400, where, "%s", e.msg);
            break;
        }
        /* any function: the model writes the name too */
        if (!*j->force_tool) {
            json_t *q = json_string(name);
            char *qs = q ? json_dumps(q, JSON_ENCODE_ANY) : NULL;
            char *lit = qs ? sl_gbnf_literal(qs, strlen(qs)) : NULL;
            sv_buf_printf(&alts, "%s%s \", \" ", alts.len ? " | " : "", lit ? lit : "");
            json_decref(q);
            free(qs);
            if (!lit) alts.oom = 1;
            free(lit);
        }
        if (args_only)
            sv_buf_puts(&alts, rule);
        else
            sv_buf_printf(&alts, "\"\\\"arguments\\\": \" %s", rule);
    }
    if (!rc && !alts.len) rc = sv_bad(er, 400, "tool_choice", "tool_choice names a function the tools do not list");
    if (!rc) {
        sv_buf root = {0};
        /* the newlines around the JSON are optional: templates differ */
        if (args_only)
            sv_buf_puts(&root, alts.p);
        else
            sv_buf_printf(&root, "%s(%s) \"}\" \"\\n\"? \"</tool_call>\"",
                          *j->force_tool ? "" : "\"\\n\"? \"{\\\"name\\\": \" ", alts.p);
        sl_err e = {{0}};
        if (alts.oom || root.oom || sl_jsgen_rule(b, "root", root.p, &e)) {
            rc = sv_bad(er, 500, "", "out of memory");
        } else {
            sl_grammar *g;
            const char *text = sl_jsgen_text(b);
            if (sl_grammar_parse(text, strlen(text), &g, &e))
                rc = sv_bad(er, 400, "tools", "tools: the grammar of the forced call: %s", e.msg);
            else
                set_grammar(j, g);
        }
        sv_buf_free(&root);
    }
    sv_buf_free(&alts);
    sl_jsgen_free(b);
    return rc;
}

/* The opening of a named call in the formats of gpt-oss, DeepSeek and Kimi, up to its JSON arguments (any
 * function: up to the name, which the model then writes unconstrained). */
static void forced_opening_other(const sv_engine *g, const char *name, sv_buf *out) {
    const char *src = g->tmpl_src ? g->tmpl_src : "";
    if (g->tc_fmt == SL_TC_HARMONY) {
        sv_buf_puts(out, "<|channel|>commentary to=functions.");
        if (*name) sv_buf_printf(out, "%s <|constrain|>json<|message|>", name);
    } else if (g->tc_fmt == SL_TC_DEEPSEEK) {
        sv_buf_puts(out, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>");
        if (strstr(src, "```json")) { /* V3 / R1: TYPE<｜tool▁sep｜>NAME and a fenced block */
            sv_buf_puts(out, "function<｜tool▁sep｜>");
            if (*name) sv_buf_printf(out, "%s\n```json\n", name);
        } else if (*name) {
            sv_buf_printf(out, "%s<｜tool▁sep｜>", name);
        }
    } else {
        sv_buf_puts(out, "<|tool_calls_section_begin|><|tool_call_begin|>functions.");
        if (*name) sv_buf_printf(out, "%s:0<|tool_call_argument_begin|>", name);
    }
}

/* The opening of a tool call in the template's own syntax, which the prompt ends with when tool_choice
 * demands a call: Qwen3-Coder's XML form when the template writes <function=...>, else Hermes JSON, or
 * the model family's own (forced_opening_other). A constrained output closes an opened reasoning block the
 * same way (its grammar starts after it); gpt-oss's opens its final message. */
static int forced_opening(const sv_engine *g, sv_job *j, int in_reasoning, sv_buf *out, sv_error *er) {
    const char *src = g->tmpl_src ? g->tmpl_src : "";
    if (!j->force_tool) {
        if (in_reasoning) sv_buf_puts(out, "\n</think>\n\n");
        if (g->tc_fmt == SL_TC_HARMONY) sv_buf_puts(out, "<|channel|>final<|message|>");
        return 0;
    }
    if (g->tc_fmt == SL_TC_HARMONY || g->tc_fmt == SL_TC_DEEPSEEK || g->tc_fmt == SL_TC_KIMI) {
        if (in_reasoning) sv_buf_puts(out, "\n</think>\n\n");
        forced_opening_other(g, j->force_tool, out);
        return 0;
    }
    if (!strstr(src, "<tool_call>"))
        return sv_bad(er, 400, "tool_choice",
                      "tool_choice asks for a tool call, but this model's chat template has no <tool_call> syntax "
                      "to force; use \"auto\"");
    /* a reasoning block the template opened is closed first: the call comes without reasoning */
    if (in_reasoning) sv_buf_puts(out, "\n</think>\n\n");
    /* any tool: the tag alone, so the model picks the function; a named one: the call up to the name */
    sv_buf_puts(out, "<tool_call>");
    if (!*j->force_tool) return 0;
    if (strstr(src, "<function=")) {
        sv_buf_puts(out, "\n<function=");
        sv_buf_puts(out, j->force_tool);
        sv_buf_puts(out, ">\n");
    } else {
        json_t *name = json_string(j->force_tool);
        char *q = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
        json_decref(name);
        if (!q) return sv_bad(er, 500, "", "out of memory");
        sv_buf_puts(out, "\n{\"name\": ");
        sv_buf_puts(out, q);
        sv_buf_puts(out, ", ");
        free(q);
    }
    return 0;
}

int sv_tool_choice_name(json_t *tools, const char *name, const char *field, sv_error *er) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && !strcmp(n, name)) return 0;
    }
    return sv_bad(er, 400, field, "%s names '%s', which is not among the request's tools", field, name);
}

/* A copy of messages with every system message merged, in order, into one leading system message; NULL when
 * no system message follows another message (nothing to fold). */
static int is_system(json_t *m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    return role && !strcmp(role, "system");
}

static json_t *fold_system(json_t *messages) {
    size_t i, n_late = 0;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (i && is_system(m)) n_late++;
    }
    if (!n_late) return NULL;
    sv_buf sys = {0};
    json_t *out = json_array();
    json_array_foreach(messages, i, m) {
        if (!is_system(m)) {
            json_array_append(out, m);
            continue;
        }
        const char *c = json_string_value(json_object_get(m, "content"));
        if (!c || !*c) continue;
        if (sys.len) sv_buf_puts(&sys, "\n\n");
        sv_buf_puts(&sys, c);
    }
    json_array_insert_new(out, 0, json_pack("{s:s, s:s}", "role", "system", "content", sys.p ? sys.p : ""));
    sv_buf_free(&sys);
    return out;
}

int sv_prompt_chat(sv_engine *g, json_t *messages, json_t *tools, int enable_thinking, sv_job *j, sv_error *er) {
    return sv_prompt_chat_vars(g, messages, tools, enable_thinking, NULL, j, er);
}

int sv_prompt_chat_vars(sv_engine *g, json_t *messages, json_t *tools, int enable_thinking, json_t *vars, sv_job *j,
                        sv_error *er) {
    if (!g->tmpl)
        return sv_bad(er, 400, "messages",
                      "the model has no chat template (tokenizer_config.json chat_template or chat_template.jinja); "
                      "use the plain-text completion endpoint");
    sl_chat_input in = {.messages = messages,
                        .tools = tools,
                        .add_generation_prompt = 1,
                        .enable_thinking = enable_thinking,
                        .extra = vars};
    char *prompt = NULL;
    size_t len = 0;
    sl_err e = {{0}};
    if (sl_chat_render(g->tmpl, &in, sl_tokenizer_bos(g->tok), sl_tokenizer_eos(g->tok), &prompt, &len, &e)) {
        /* templates that take only a leading system message (they raise on a later one) get the system
         * messages merged into it, in order; templates that render them in place keep them there */
        json_t *folded = fold_system(messages);
        sl_err e2 = {{0}};
        in.messages = folded;
        int rc = folded ? sl_chat_render(g->tmpl, &in, sl_tokenizer_bos(g->tok), sl_tokenizer_eos(g->tok), &prompt,
                                         &len, &e2)
                        : -1;
        json_decref(folded);
        if (rc)
            return sv_bad(er, 400, "messages", "messages: the chat template cannot render this conversation: %s",
                          e.msg);
    }
    j->starts_in_reasoning = ends_in_think(prompt, len);
    int other = g->tc_fmt == SL_TC_HARMONY || g->tc_fmt == SL_TC_DEEPSEEK || g->tc_fmt == SL_TC_KIMI;
    /* these formats can constrain only a named call: "any tool" of a single tool is that tool */
    const char *only =
        json_string_value(json_object_get(json_object_get(json_array_get(tools, 0), "function"), "name"));
    if (other && j->force_tool && !*j->force_tool && json_array_size(tools) == 1 && only) {
        free(j->force_tool);
        if (!(j->force_tool = strdup(only))) {
            free(prompt);
            return sv_bad(er, 500, "", "out of memory");
        }
    }
    if (j->force_tool || (j->grammar && (j->starts_in_reasoning || g->tc_fmt == SL_TC_HARMONY))) {
        sv_buf open = {0};
        if (forced_opening(g, j, j->starts_in_reasoning, &open, er)) {
            sv_buf_free(&open);
            free(prompt);
            return -1;
        }
        char *full = malloc(len + open.len + 1);
        if (!full || open.oom || !(j->forced = strdup(open.p))) {
            free(full);
            sv_buf_free(&open);
            free(prompt);
            return sv_bad(er, 500, "", "out of memory");
        }
        memcpy(full, prompt, len);
        memcpy(full + len, open.p, open.len + 1);
        free(prompt);
        prompt = full;
        len += open.len;
        sv_buf_free(&open);
        /* a forced call in Hermes JSON, or a named one in another family's format: its arguments follow the
         * tool's schema */
        int hermes = !other && !strstr(g->tmpl_src, "<function=");
        if (j->force_tool && (hermes || (other && *j->force_tool)) && forced_call_grammar(j, tools, other, er)) {
            free(prompt);
            return -1;
        }
    }
    /* the template wrote any BOS itself, so no post-processor specials here */
    int rc = sl_tokenizer_encode(g->tok, prompt, len, 0, &j->ids, &j->n_ids, &e);
    free(prompt);
    if (rc) return sv_bad(er, 500, "", "tokenizing the prompt: %s", e.msg);
    return 0;
}

int sv_chat_prepare(sv_engine *g, sv_job *j, json_t *messages, json_t *tools, int enable_thinking, json_t *vars,
                    const char *limit_field, sv_error *er) {
    if (sv_prompt_chat_vars(g, messages, tools, enable_thinking, vars, j, er) ||
        sv_check_context(g, j, limit_field, er))
        return -1;
    json_object_set_new(j->extra, "chat", json_true());
    j->parse_output = 1;
    j->tools = tools;
    return 0;
}

int sv_template_vars(json_t *body, const char *effort, json_t **vars, int *think, sv_error *er) {
    /* variables the server derives from the request itself */
    static const char *const own[] = {"messages",  "tools",    "documents", "add_generation_prompt",
                                      "bos_token", "eos_token"};
    json_t *ctk = NULL;
    if (sv_get_object(body, "chat_template_kwargs", "chat_template_kwargs", &ctk, er) < 0) return -1;
    if (!*vars && (effort || (ctk && json_object_size(ctk))) && !(*vars = json_object()))
        return sv_bad(er, 500, "", "out of memory");
    if (effort) {
        *think = strcmp(effort, "none") != 0;
        json_object_set_new(*vars, "reasoning_effort", json_string(effort));
    }
    const char *k;
    json_t *v;
    json_object_foreach(ctk, k, v) {
        int skip = 0;
        for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) skip |= !strcmp(k, own[i]);
        if (skip) continue;
        if (!strcmp(k, "enable_thinking") && json_is_boolean(v)) *think = json_is_true(v);
        json_object_set(*vars, k, v);
    }
    return 0;
}

int sv_prompt_text(sv_engine *g, const char *text, size_t len, sv_job *j, sv_error *er) {
    sl_err e = {{0}};
    if (sl_tokenizer_encode(g->tok, text, len, 1, &j->ids, &j->n_ids, &e))
        return sv_bad(er, 500, "", "tokenizing the prompt: %s", e.msg);
    return 0;
}

int sv_check_context(sv_engine *g, const sv_job *j, const char *max_field, sv_error *er) {
    if (j->n_ids == 0) return sv_bad(er, 400, "", "the prompt is empty (0 tokens)");
    if (j->n_ids >= g->ctx) {
        sv_bad(er, 400, "",
               "the prompt has %d tokens but the context holds %d (at least one token must be left to "
               "generate); shorten the conversation or start the server with a larger --ctx",
               j->n_ids, g->ctx);
        snprintf(er->code, sizeof er->code, "context_length_exceeded");
        return -1;
    }
    if (j->gen.max_tokens > 0 && j->n_ids + j->gen.max_tokens > g->ctx) {
        sv_bad(er, 400, max_field,
               "the prompt has %d tokens and %s asks for %d more, but the context holds %d (at most %d can be "
               "generated)",
               j->n_ids, max_field, j->gen.max_tokens, g->ctx, g->ctx - j->n_ids);
        snprintf(er->code, sizeof er->code, "context_length_exceeded");
        return -1;
    }
    return 0;
}
