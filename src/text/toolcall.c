#include "text/toolcall.h"

#include <stdlib.h>
#include <string.h>

#include "text/utf8_cut.h"

enum { ST_CONTENT, ST_REASONING, ST_TOOL };

typedef struct {
    char *s;
    size_t len, cap;
} sbuf;

static int sbuf_add(sbuf *b, const char *s, size_t n) {
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

struct sl_tc_parser {
    int state;
    int strip_nl; /* drop newlines until the next other character */
    sbuf pend;    /* input not yet settled */
    sbuf body;    /* inside <tool_call> */
    json_t *tools;
    int n_tools, malformed;
    sl_tc_cb cb;
    void *ud;
};

static const char TOOL_OPEN[] = "<tool_call>", TOOL_CLOSE[] = "</tool_call>";
static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

sl_tc_parser *sl_tc_parser_create(int starts_in_reasoning, const json_t *tools) {
    sl_tc_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->state = starts_in_reasoning ? ST_REASONING : ST_CONTENT;
    p->strip_nl = starts_in_reasoning; /* as right after <think> */
    if (tools) p->tools = json_incref((json_t *)tools);
    return p;
}

void sl_tc_parser_free(sl_tc_parser *p) {
    if (!p) return;
    free(p->pend.s);
    free(p->body.s);
    json_decref(p->tools);
    free(p);
}

int sl_tc_parser_malformed(const sl_tc_parser *p) {
    return p->malformed;
}

static void emit(sl_tc_parser *p, sl_tc_kind kind, int index, const char *s, size_t n) {
    if (n == 0 && (kind == SL_TC_TEXT || kind == SL_TC_REASONING)) return;
    sl_tc_event ev = {kind, index, s, n};
    p->cb(p->ud, &ev);
}

static void emit_text(sl_tc_parser *p, const char *s, size_t n) {
    emit(p, p->state == ST_REASONING ? SL_TC_REASONING : SL_TC_TEXT, -1, s, n);
}

/* ---- tool call bodies ---- */

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void trim(const char **s, size_t *n) {
    while (*n && is_space(**s)) (*s)++, (*n)--;
    while (*n && is_space((*s)[*n - 1])) (*n)--;
}

static int starts(const char *s, size_t n, const char *lit) {
    size_t l = strlen(lit);
    return n >= l && memcmp(s, lit, l) == 0;
}

/* Hermes: {"name": ..., "arguments": {...} or "<json>"}. Returns the name and compact arguments. */
static int parse_hermes(const char *s, size_t n, char **name, char **args) {
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
    if (!a) {
        *args = strdup("{}");
    } else if (json_is_string(a)) {
        /* Already a JSON string: re-encode compactly when it parses, else pass it on unchanged. */
        json_t *inner = json_loads(json_string_value(a), JSON_DECODE_ANY, &jerr);
        *args = inner ? json_dumps(inner, JSON_COMPACT | JSON_ENCODE_ANY) : strdup(json_string_value(a));
        json_decref(inner);
    } else {
        *args = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
    }
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

/* One XML parameter value as JSON (see the header for the rules). */
static json_t *xml_value(const json_t *type, const char *v, size_t n) {
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

/* Earliest of the literals in s[0, n), or n. */
static size_t find_first(const char *s, size_t n, const char *const *lits, int k) {
    size_t best = n;
    for (int i = 0; i < k; i++) {
        const char *m = memmem(s, n, lits[i], strlen(lits[i]));
        if (m && (size_t)(m - s) < best) best = (size_t)(m - s);
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
    trim(&nm, &nl);
    if (!nl || memchr(nm, '\n', nl) || memchr(nm, '<', nl)) return -1;
    char *fname = strndup(nm, nl);
    json_t *obj = json_object();
    if (!fname || !obj) goto fail;
    n -= (size_t)(gt + 1 - s), s = gt + 1;
    for (;;) {
        trim(&s, &n);
        if (n == 0 || starts(s, n, "</function>")) break;
        if (!starts(s, n, "<parameter=")) goto fail;
        s += strlen("<parameter="), n -= strlen("<parameter=");
        gt = memchr(s, '>', n);
        if (!gt) goto fail;
        const char *k = s;
        size_t kl = (size_t)(gt - s);
        trim(&k, &kl);
        if (!kl) goto fail;
        n -= (size_t)(gt + 1 - s), s = gt + 1;
        size_t vl = find_first(s, n, ends, 3);
        const char *v = s;
        size_t skip = starts(s + vl, n - vl, "</parameter>") ? strlen("</parameter>") : 0;
        s += vl + skip, n -= vl + skip;
        if (vl && v[0] == '\n') v++, vl--;
        if (vl && v[vl - 1] == '\n') vl--;
        char *key = strndup(k, kl);
        json_t *val = key ? xml_value(p->tools ? declared_type(p->tools, fname, key) : NULL, v, vl) : NULL;
        int bad = !val || json_object_set_new(obj, key, val) != 0;
        free(key);
        if (bad) goto fail;
    }
    *args = json_dumps(obj, JSON_COMPACT);
    *name = fname;
    json_decref(obj);
    if (!*args) {
        free(fname);
        return -1;
    }
    return 0;
fail:
    free(fname);
    json_decref(obj);
    return -1;
}

static int parse_body(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args) {
    trim(&s, &n);
    if (n && s[0] == '{') return parse_hermes(s, n, name, args);
    if (starts(s, n, "<function=")) return parse_xml(p, s, n, name, args);
    return -1;
}

/* Reports the tool call in body, or the block as text when it does not parse. closed: </tool_call> seen. */
static void close_tool(sl_tc_parser *p, int closed) {
    char *name = NULL, *args = NULL;
    const char *b = p->body.s ? p->body.s : "";
    size_t n = p->body.len;
    p->state = ST_CONTENT;
    if (!closed) /* output ended inside the closing tag: parse what came before it */
        for (size_t l = strlen(TOOL_CLOSE) - 1; l > 0; l--)
            if (n >= l && memcmp(b + n - l, TOOL_CLOSE, l) == 0) {
                n -= l;
                break;
            }
    if (parse_body(p, b, n, &name, &args) == 0) {
        int i = p->n_tools++;
        emit(p, SL_TC_TOOL_START, i, name, strlen(name));
        emit(p, SL_TC_TOOL_ARGS, i, args, strlen(args));
        emit(p, SL_TC_TOOL_END, i, "", 0);
        p->strip_nl = 1;
    } else {
        p->malformed++;
        emit(p, SL_TC_TEXT, -1, TOOL_OPEN, strlen(TOOL_OPEN));
        emit(p, SL_TC_TEXT, -1, p->body.s, p->body.len);
        if (closed) emit(p, SL_TC_TEXT, -1, TOOL_CLOSE, strlen(TOOL_CLOSE));
        p->strip_nl = 0;
    }
    free(name);
    free(args);
    p->body.len = 0;
}

/* ---- the scanner ---- */

enum { TAG_NONE, TAG_PARTIAL, TAG_FULL };

/* Whether s[0, n) (starting with '<') begins with one of the current state's tags. */
static int match_tag(const sl_tc_parser *p, const char *s, size_t n, const char **tag) {
    static const char *const content_tags[] = {THINK_OPEN, TOOL_OPEN};
    static const char *const reasoning_tags[] = {THINK_CLOSE};
    const char *const *tags = p->state == ST_REASONING ? reasoning_tags : content_tags;
    int k = p->state == ST_REASONING ? 1 : 2, r = TAG_NONE;
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
    const char *b = p->pend.s;
    size_t n = p->pend.len, pos = 0;
    while (pos < n) {
        if (p->state == ST_TOOL) {
            const char *m = memmem(b + pos, n - pos, TOOL_CLOSE, strlen(TOOL_CLOSE));
            size_t end = m ? (size_t)(m - b) : n;
            if (!m && !final) { /* hold a suffix that may be the start of </tool_call> */
                size_t hold = 0;
                for (size_t l = strlen(TOOL_CLOSE) - 1; l > 0 && !hold; l--)
                    if (n - pos >= l && memcmp(b + n - l, TOOL_CLOSE, l) == 0) hold = l;
                end = n - hold;
            }
            if (sbuf_add(&p->body, b + pos, end - pos) != 0) {
                *oom = 1;
                return pos;
            }
            pos = end;
            if (!m) break;
            pos += strlen(TOOL_CLOSE);
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
                if (tag == TOOL_OPEN) {
                    p->state = ST_TOOL;
                    p->body.len = 0;
                } else {
                    p->state = tag == THINK_OPEN ? ST_REASONING : ST_CONTENT;
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
    if (sbuf_add(&p->pend, s, n) != 0) return sl_fail(e, "tool-call parser: out of memory");
    p->cb = cb;
    p->ud = ud;
    int oom = 0;
    size_t used = scan(p, final, &oom);
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
    if (p->state == ST_TOOL) close_tool(p, 0);
    return 0;
}

/* ---- whole-output convenience ---- */

typedef struct {
    sbuf content, reasoning, args;
    json_t *calls;
    char *name;
    int oom;
} collect;

static void collect_cb(void *ud, const sl_tc_event *ev) {
    collect *c = ud;
    switch (ev->kind) {
    case SL_TC_TEXT: c->oom |= sbuf_add(&c->content, ev->text, ev->len) != 0; break;
    case SL_TC_REASONING: c->oom |= sbuf_add(&c->reasoning, ev->text, ev->len) != 0; break;
    case SL_TC_TOOL_START:
        free(c->name);
        c->name = strndup(ev->text, ev->len);
        c->args.len = 0;
        c->oom |= !c->name || sbuf_add(&c->args, "", 0) != 0;
        break;
    case SL_TC_TOOL_ARGS: c->oom |= sbuf_add(&c->args, ev->text, ev->len) != 0; break;
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

int sl_tc_parse_all(const char *s, size_t n, int starts_in_reasoning, const json_t *tools, char **content,
                    char **reasoning, json_t **tool_calls, sl_err *e) {
    collect c = {.calls = json_array()};
    sl_tc_parser *p = sl_tc_parser_create(starts_in_reasoning, tools);
    int rc = -1;
    if (!p || !c.calls) {
        sl_fail(e, "tool-call parser: out of memory");
        goto done;
    }
    if (sl_tc_parser_feed(p, s, n, collect_cb, &c, e) != 0 || sl_tc_parser_finish(p, collect_cb, &c, e) != 0) goto done;
    if (c.oom || sbuf_add(&c.content, "", 0) != 0 || sbuf_add(&c.reasoning, "", 0) != 0) {
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
