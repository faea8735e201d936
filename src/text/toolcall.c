#include "text/toolcall.h"

#include <stdlib.h>
#include <string.h>

#include "text/tc_int.h"
#include "text/utf8_cut.h"

enum { ST_CONTENT, ST_REASONING, ST_TOOL };

int tc_buf_add(tc_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) return -1;
        b->s = ns;
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
    return 0;
}

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

static int parse_body(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args);

static const tc_tags HERMES_TAGS = {"<tool_call>", "</tool_call>", {NULL, NULL}, parse_body};
static const tc_tags GLM_TAGS = {"<tool_call>", "</tool_call>", {NULL, NULL}, tc_body_glm};
static const tc_tags DEEPSEEK_TAGS = {"<｜tool▁call▁begin｜>",
                                      "<｜tool▁call▁end｜>",
                                      {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"},
                                      tc_body_deepseek};
static const tc_tags KIMI_TAGS = {"<|tool_call_begin|>",
                                  "<|tool_call_end|>",
                                  {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"},
                                  tc_body_kimi};

static const char *const HERMES_TOKENS[] = {"<think>", "</think>", "<tool_call>", "</tool_call>", NULL};
static const char *const GLM_TOKENS[] = {"<think>",      "</think>",     "<tool_call>",
                                         "</tool_call>", "<arg_key>",    "</arg_key>",
                                         "<arg_value>",  "</arg_value>", NULL};
static const char *const DEEPSEEK_TOKENS[] = {"<think>",
                                              "</think>",
                                              "<｜tool▁calls▁begin｜>",
                                              "<｜tool▁calls▁end｜>",
                                              "<｜tool▁call▁begin｜>",
                                              "<｜tool▁call▁end｜>",
                                              "<｜tool▁sep｜>",
                                              NULL};
static const char *const KIMI_TOKENS[] = {"<think>",
                                          "</think>",
                                          "<|tool_calls_section_begin|>",
                                          "<|tool_calls_section_end|>",
                                          "<|tool_call_begin|>",
                                          "<|tool_call_argument_begin|>",
                                          "<|tool_call_end|>",
                                          NULL};

sl_tc_format sl_tc_format_detect(const char *t) {
    if (!t) return SL_TC_HERMES;
    if (strstr(t, "<|channel|>") && strstr(t, "<|message|>")) return SL_TC_HARMONY;
    if (strstr(t, "tool▁call▁begin")) return SL_TC_DEEPSEEK;
    if (strstr(t, "<|tool_call_begin|>") || strstr(t, "<|tool_calls_section_begin|>")) return SL_TC_KIMI;
    if (strstr(t, "<arg_key>")) return SL_TC_GLM;
    return SL_TC_HERMES;
}

const char *const *sl_tc_format_tokens(sl_tc_format f) {
    switch (f) {
    case SL_TC_GLM: return GLM_TOKENS;
    case SL_TC_DEEPSEEK: return DEEPSEEK_TOKENS;
    case SL_TC_KIMI: return KIMI_TOKENS;
    case SL_TC_HARMONY: return tc_harmony_tokens;
    default: return HERMES_TOKENS;
    }
}

const char *sl_tc_format_name(sl_tc_format f) {
    static const char *const names[] = {"hermes", "glm", "deepseek", "kimi", "harmony"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "hermes";
}

sl_tc_parser *sl_tc_parser_create(sl_tc_format fmt, int starts_in_reasoning, const json_t *tools) {
    sl_tc_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->fmt = fmt;
    p->tags = fmt == SL_TC_GLM        ? &GLM_TAGS
              : fmt == SL_TC_DEEPSEEK ? &DEEPSEEK_TAGS
              : fmt == SL_TC_KIMI     ? &KIMI_TAGS
              : fmt == SL_TC_HARMONY  ? NULL
                                      : &HERMES_TAGS;
    if (p->tags) {
        p->state = starts_in_reasoning ? ST_REASONING : ST_CONTENT;
        p->strip_nl = starts_in_reasoning; /* as right after <think> */
    }
    if (tools) p->tools = json_incref((json_t *)tools);
    return p;
}

void sl_tc_parser_free(sl_tc_parser *p) {
    if (!p) return;
    free(p->pend.s);
    free(p->body.s);
    free(p->hdr.s);
    json_decref(p->tools);
    free(p);
}

int sl_tc_parser_malformed(const sl_tc_parser *p) {
    return p->malformed;
}

void tc_emit(sl_tc_parser *p, sl_tc_kind kind, int index, const char *s, size_t n) {
    if (n == 0 && (kind == SL_TC_TEXT || kind == SL_TC_REASONING)) return;
    sl_tc_event ev = {kind, index, s, n};
    p->cb(p->ud, &ev);
}

void tc_emit_call(sl_tc_parser *p, const char *name, const char *args) {
    int i = p->n_tools++;
    tc_emit(p, SL_TC_TOOL_START, i, name, strlen(name));
    tc_emit(p, SL_TC_TOOL_ARGS, i, args, strlen(args));
    tc_emit(p, SL_TC_TOOL_END, i, "", 0);
}

static void emit_text(sl_tc_parser *p, const char *s, size_t n) {
    tc_emit(p, p->state == ST_REASONING ? SL_TC_REASONING : SL_TC_TEXT, -1, s, n);
}

/* ---- tool call bodies ---- */

int tc_is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

void tc_trim(const char **s, size_t *n) {
    while (*n && tc_is_space(**s)) (*s)++, (*n)--;
    while (*n && tc_is_space((*s)[*n - 1])) (*n)--;
}

int tc_starts(const char *s, size_t n, const char *lit) {
    size_t l = strlen(lit);
    return n >= l && memcmp(s, lit, l) == 0;
}

size_t tc_find(const char *s, size_t n, const char *lit) {
    const char *m = memmem(s, n, lit, strlen(lit));
    return m ? (size_t)(m - s) : n;
}

size_t tc_partial_suffix(const char *s, size_t n, const char *lit) {
    for (size_t l = strlen(lit) - 1; l > 0; l--)
        if (n >= l && memcmp(s + n - l, lit, l) == 0) return l;
    return 0;
}

/* A JSON value given as a string is re-encoded compactly when it parses, else passed on unchanged. */
static char *args_of(const json_t *a) {
    if (!json_is_string(a)) return json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
    json_error_t jerr;
    json_t *inner = json_loads(json_string_value(a), JSON_DECODE_ANY, &jerr);
    char *r = inner ? json_dumps(inner, JSON_COMPACT | JSON_ENCODE_ANY) : strdup(json_string_value(a));
    json_decref(inner);
    return r;
}

int tc_json_args(const char *s, size_t n, char **args) {
    json_error_t jerr;
    tc_trim(&s, &n);
    json_t *a = json_loadb(s, n, JSON_DECODE_ANY, &jerr);
    if (json_is_string(a)) { /* an encoded object, as some templates show past calls */
        json_t *inner = json_loads(json_string_value(a), 0, &jerr);
        json_decref(a);
        a = inner;
    }
    *args = json_is_object(a) ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    return *args ? 0 : -1;
}

/* Hermes: {"name": ..., "arguments": {...} or "<json>"}. Returns the name and compact arguments. */
int tc_parse_hermes(const char *s, size_t n, char **name, char **args) {
    json_error_t jerr;
    json_t *o = json_loadb(s, n, 0, &jerr);
    if (!o) return -1;
    const char *nm = json_string_value(json_object_get(o, "name"));
    json_t *a = json_object_get(o, "arguments");
    if (!a) a = json_object_get(o, "parameters");
    if (!json_is_object(o) || !nm || !nm[0]) {
        json_decref(o);
        return -1;
    }
    *args = a ? args_of(a) : strdup("{}");
    *name = strdup(nm);
    json_decref(o);
    if (!*name || !*args) {
        free(*name);
        free(*args);
        return -1;
    }
    return 0;
}

/* The schema's "type" of parameter key of function fname, or NULL. */
static const json_t *declared_type(const json_t *tools, const char *fname, const char *key) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        if (!fn) fn = t;
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (!nm || strcmp(nm, fname) != 0) continue;
        const json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
        return json_object_get(json_object_get(props, key), "type");
    }
    return NULL;
}

static int type_names(const json_t *type, const char *name) {
    if (json_is_string(type)) return strcmp(json_string_value(type), name) == 0;
    size_t i;
    const json_t *t;
    json_array_foreach(type, i, t) if (json_is_string(t) && strcmp(json_string_value(t), name) == 0) return 1;
    return 0;
}

static int type_allows(const json_t *type, const json_t *v) {
    return (json_is_integer(v) && type_names(type, "integer")) || (json_is_number(v) && type_names(type, "number")) ||
           (json_is_boolean(v) && type_names(type, "boolean")) || (json_is_null(v) && type_names(type, "null")) ||
           (json_is_object(v) && type_names(type, "object")) || (json_is_array(v) && type_names(type, "array"));
}

json_t *tc_typed_value(const sl_tc_parser *p, const char *fname, const char *key, const char *v, size_t n) {
    const json_t *type = p->tools ? declared_type(p->tools, fname, key) : NULL;
    json_error_t jerr;
    json_t *parsed = json_loadb(v, n, JSON_DECODE_ANY, &jerr);
    if (json_is_string(parsed)) { /* a quoted value is text that happens to have quotes */
        json_decref(parsed);
        parsed = NULL;
    }
    if (parsed && (!type || type_allows(type, parsed) || !type_names(type, "string"))) return parsed;
    json_decref(parsed);
    return json_stringn(v, n);
}

int tc_set_param(const sl_tc_parser *p, json_t *obj, const char *fname, const char *k, size_t kn, const char *v,
                 size_t vn) {
    char *key = strndup(k, kn);
    json_t *val = key ? tc_typed_value(p, fname, key, v, vn) : NULL;
    int bad = !val || json_object_set_new(obj, key, val) != 0;
    free(key);
    return bad ? -1 : 0;
}

int tc_finish_call(json_t *obj, char *fname, char **name, char **args) {
    *args = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!*args) {
        free(fname);
        return -1;
    }
    *name = fname;
    return 0;
}

/* Earliest of the literals in s[0, n), or n. */
static size_t find_first(const char *s, size_t n, const char *const *lits, int k) {
    size_t best = n;
    for (int i = 0; i < k; i++) {
        size_t at = tc_find(s, n, lits[i]);
        if (at < best) best = at;
    }
    return best;
}

/* Qwen3-Coder: <function=NAME> (<parameter=KEY>value</parameter>)* </function>. A missing
 * </parameter> or </function> is tolerated: the value then ends at the next tag or the end. */
static int parse_xml(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args) {
    static const char *const ends[] = {"</parameter>", "<parameter=", "</function>"};
    s += strlen("<function="), n -= strlen("<function=");
    const char *gt = memchr(s, '>', n);
    if (!gt) return -1;
    const char *nm = s;
    size_t nl = (size_t)(gt - s);
    tc_trim(&nm, &nl);
    if (!nl || memchr(nm, '\n', nl) || memchr(nm, '<', nl)) return -1;
    char *fname = strndup(nm, nl);
    json_t *obj = json_object();
    if (!fname || !obj) goto fail;
    n -= (size_t)(gt + 1 - s), s = gt + 1;
    for (;;) {
        tc_trim(&s, &n);
        if (n == 0 || tc_starts(s, n, "</function>")) break;
        if (!tc_starts(s, n, "<parameter=")) goto fail;
        s += strlen("<parameter="), n -= strlen("<parameter=");
        gt = memchr(s, '>', n);
        if (!gt) goto fail;
        const char *k = s;
        size_t kl = (size_t)(gt - s);
        tc_trim(&k, &kl);
        if (!kl) goto fail;
        n -= (size_t)(gt + 1 - s), s = gt + 1;
        size_t vl = find_first(s, n, ends, 3);
        const char *v = s;
        size_t skip = tc_starts(s + vl, n - vl, "</parameter>") ? strlen("</parameter>") : 0;
        s += vl + skip, n -= vl + skip;
        if (vl && v[0] == '\n') v++, vl--;
        if (vl && v[vl - 1] == '\n') vl--;
        if (tc_set_param(p, obj, fname, k, kl, v, vl)) goto fail;
    }
    return tc_finish_call(obj, fname, name, args);
fail:
    free(fname);
    json_decref(obj);
    return -1;
}

static int parse_body(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args) {
    tc_trim(&s, &n);
    if (n && s[0] == '{') return tc_parse_hermes(s, n, name, args);
    if (tc_starts(s, n, "<function=")) return parse_xml(p, s, n, name, args);
    return -1;
}

/* Reports the tool call in body, or the block as text when it does not parse. closed: its closing tag seen. */
static void close_tool(sl_tc_parser *p, int closed) {
    char *name = NULL, *args = NULL;
    const char *b = p->body.s ? p->body.s : "", *open = p->tags->call_open, *close = p->tags->call_close;
    size_t n = p->body.len;
    p->state = ST_CONTENT;
    if (!closed) n -= tc_partial_suffix(b, n, close); /* output ended inside the closing tag */
    if (p->tags->body(p, b, n, &name, &args) == 0) {
        tc_emit_call(p, name, args);
        p->strip_nl = 1;
    } else {
        p->malformed++;
        tc_emit(p, SL_TC_TEXT, -1, open, strlen(open));
        tc_emit(p, SL_TC_TEXT, -1, p->body.s, p->body.len);
        if (closed) tc_emit(p, SL_TC_TEXT, -1, close, strlen(close));
        p->strip_nl = 0;
    }
    free(name);
    free(args);
    p->body.len = 0;
}

/* ---- the scanner of the <think> / tool-call tag formats ---- */

enum { TAG_NONE, TAG_PARTIAL, TAG_FULL };

/* Whether s[0, n) (starting with '<') begins with one of the current state's tags. */
static int match_tag(const sl_tc_parser *p, const char *s, size_t n, const char **tag) {
    const char *tags[4];
    int k = 0, r = TAG_NONE;
    if (p->state == ST_REASONING) {
        tags[k++] = THINK_CLOSE;
    } else {
        tags[k++] = THINK_OPEN;
        tags[k++] = p->tags->call_open;
        for (int i = 0; i < 2; i++)
            if (p->tags->drop[i]) tags[k++] = p->tags->drop[i];
    }
    for (int i = 0; i < k; i++) {
        size_t l = strlen(tags[i]);
        if (n >= l && memcmp(s, tags[i], l) == 0) {
            *tag = tags[i];
            return TAG_FULL;
        }
        if (n < l && memcmp(s, tags[i], n) == 0) r = TAG_PARTIAL;
    }
    return r;
}

/* Settles as much of pend as possible; returns the number of bytes consumed. final: no more input. */
static size_t scan(sl_tc_parser *p, int final, int *oom) {
    const char *b = p->pend.s, *close = p->tags->call_close;
    size_t n = p->pend.len, pos = 0, close_len = strlen(close);
    while (pos < n) {
        if (p->state == ST_TOOL) {
            size_t end = pos + tc_find(b + pos, n - pos, close);
            int found = end < n;
            if (!found && !final) end -= tc_partial_suffix(b + pos, n - pos, close); /* may be the close tag */
            if (tc_buf_add(&p->body, b + pos, end - pos) != 0) {
                *oom = 1;
                return pos;
            }
            pos = end;
            if (!found) break;
            pos += close_len;
            close_tool(p, 1);
            continue;
        }
        char c = b[pos];
        if (c == '\n' && p->strip_nl) {
            pos++;
            continue;
        }
        if (c == '\n') {
            size_t j = pos;
            const char *tag;
            while (j < n && b[j] == '\n') j++;
            int t = j < n && b[j] == '<' ? match_tag(p, b + j, n - j, &tag) : TAG_NONE;
            if (!final && (j == n || t == TAG_PARTIAL)) break; /* undecided: a tag may follow */
            if (t != TAG_FULL) emit_text(p, b + pos, j - pos); /* newlines before a tag are dropped */
            pos = j;
            continue;
        }
        if (c == '<') {
            const char *tag = NULL;
            int t = match_tag(p, b + pos, n - pos, &tag);
            if (t == TAG_PARTIAL && !final) break;
            if (t == TAG_FULL) {
                pos += strlen(tag);
                if (tag == p->tags->call_open) {
                    p->state = ST_TOOL;
                    p->body.len = 0;
                } else {
                    if (tag == THINK_OPEN) p->state = ST_REASONING;
                    if (tag == THINK_CLOSE) p->state = ST_CONTENT;
                    p->strip_nl = 1;
                }
                continue;
            }
            emit_text(p, "<", 1);
            p->strip_nl = 0;
            pos++;
            continue;
        }
        size_t j = pos;
        while (j < n && b[j] != '<' && b[j] != '\n') j++;
        if (j == n && !final) j = pos + sl_utf8_cut(b + pos, j - pos);
        if (j == pos) break;
        emit_text(p, b + pos, j - pos);
        p->strip_nl = 0;
        pos = j;
    }
    return pos;
}

static int run(sl_tc_parser *p, const char *s, size_t n, int final, sl_tc_cb cb, void *ud, sl_err *e) {
    if (tc_buf_add(&p->pend, s, n) != 0) return sl_fail(e, "tool-call parser: out of memory");
    p->cb = cb;
    p->ud = ud;
    int oom = 0;
    size_t used = p->tags ? scan(p, final, &oom) : tc_harmony_scan(p, final, &oom);
    memmove(p->pend.s, p->pend.s + used, p->pend.len - used);
    p->pend.len -= used;
    if (oom) return sl_fail(e, "tool-call parser: out of memory");
    return 0;
}

int sl_tc_parser_feed(sl_tc_parser *p, const char *s, size_t n, sl_tc_cb cb, void *ud, sl_err *e) {
    return run(p, s, n, 0, cb, ud, e);
}

int sl_tc_parser_finish(sl_tc_parser *p, sl_tc_cb cb, void *ud, sl_err *e) {
    if (run(p, "", 0, 1, cb, ud, e) != 0) return -1;
    if (!p->tags)
        tc_harmony_finish(p);
    else if (p->state == ST_TOOL)
        close_tool(p, 0);
    return 0;
}

/* ---- whole-output convenience ---- */

typedef struct {
    tc_buf content, reasoning, args;
    json_t *calls;
    char *name;
    int oom;
} collect;

static void collect_cb(void *ud, const sl_tc_event *ev) {
    collect *c = ud;
    switch (ev->kind) {
    case SL_TC_TEXT: c->oom |= tc_buf_add(&c->content, ev->text, ev->len) != 0; break;
    case SL_TC_REASONING: c->oom |= tc_buf_add(&c->reasoning, ev->text, ev->len) != 0; break;
    case SL_TC_TOOL_START:
        free(c->name);
        c->name = strndup(ev->text, ev->len);
        c->args.len = 0;
        c->oom |= !c->name || tc_buf_add(&c->args, "", 0) != 0;
        break;
    case SL_TC_TOOL_ARGS: c->oom |= tc_buf_add(&c->args, ev->text, ev->len) != 0; break;
    case SL_TC_TOOL_END:
        if (c->name && c->args.s) {
            json_t *o = json_pack("{s:s, s:s}", "name", c->name, "arguments", c->args.s);
            c->oom |= !o || json_array_append_new(c->calls, o) != 0;
        }
        free(c->name);
        c->name = NULL;
        break;
    }
}

int sl_tc_parse_all(sl_tc_format fmt, const char *s, size_t n, int starts_in_reasoning, const json_t *tools,
                    char **content, char **reasoning, json_t **tool_calls, sl_err *e) {
    collect c = {.calls = json_array()};
    sl_tc_parser *p = sl_tc_parser_create(fmt, starts_in_reasoning, tools);
    int rc = -1;
    if (!p || !c.calls) {
        sl_fail(e, "tool-call parser: out of memory");
        goto done;
    }
    if (sl_tc_parser_feed(p, s, n, collect_cb, &c, e) != 0 || sl_tc_parser_finish(p, collect_cb, &c, e) != 0) goto done;
    if (c.oom || tc_buf_add(&c.content, "", 0) != 0 || tc_buf_add(&c.reasoning, "", 0) != 0) {
        sl_fail(e, "tool-call parser: out of memory");
        goto done;
    }
    *content = c.content.s;
    *reasoning = c.reasoning.s;
    *tool_calls = c.calls;
    c.content.s = c.reasoning.s = NULL;
    c.calls = NULL;
    rc = 0;
done:
    sl_tc_parser_free(p);
    free(c.content.s);
    free(c.reasoning.s);
    free(c.args.s);
    free(c.name);
    json_decref(c.calls);
    return rc;
}
