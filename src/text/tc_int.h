/* Internals shared by the tool-call parser's formats (toolcall.c: dispatch, the tag scanner of the
 * <think>/<tool_call>-style formats and the Hermes/XML bodies; tc_formats.c: GLM, DeepSeek and Kimi
 * bodies; tc_harmony.c: the gpt-oss message scanner). */
#ifndef SLUICE_TEXT_TC_INT_H
#define SLUICE_TEXT_TC_INT_H

#include <stddef.h>

#include "text/toolcall.h"

typedef struct {
    char *s;
    size_t len, cap;
} tc_buf;

int tc_buf_add(tc_buf *b, const char *s, size_t n);

/* Parses one call's body into its name and compact JSON arguments (heap strings); -1 when malformed. */
typedef int (*tc_body_fn)(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args);

/* The tags of a <think>/<tool_call>-style format. */
typedef struct {
    const char *call_open, *call_close;
    const char *drop[2]; /* wrappers around a run of calls, dropped in content (NULL: none) */
    tc_body_fn body;
} tc_tags;

struct sl_tc_parser {
    sl_tc_format fmt;
    const tc_tags *tags; /* NULL for harmony */
    int state;
    int strip_nl; /* drop newlines until the next other character */
    tc_buf pend;  /* input not yet settled */
    tc_buf body;  /* inside a tool call */
    tc_buf hdr;   /* harmony: the current message's header, as written */
    int kind;     /* harmony: what the current message's body is */
    json_t *tools;
    int n_tools, malformed;
    sl_tc_cb cb;
    void *ud;
};

void tc_emit(sl_tc_parser *p, sl_tc_kind kind, int index, const char *s, size_t n);
/* Reports a parsed call: TOOL_START, TOOL_ARGS, TOOL_END. */
void tc_emit_call(sl_tc_parser *p, const char *name, const char *args);

int tc_is_space(char c);
void tc_trim(const char **s, size_t *n);
int tc_starts(const char *s, size_t n, const char *lit);
/* Offset of lit in s[0, n), or n. */
size_t tc_find(const char *s, size_t n, const char *lit);
/* The longest proper prefix of lit that ends s[0, n) (a tag that may still be arriving). */
size_t tc_partial_suffix(const char *s, size_t n, const char *lit);

/* Arguments given as JSON: an object, or a JSON string holding one, as compact JSON. -1 otherwise. */
int tc_json_args(const char *s, size_t n, char **args);
/* An XML-style parameter value of function fname as JSON, typed by the tools schema (see toolcall.h). */
json_t *tc_typed_value(const sl_tc_parser *p, const char *fname, const char *key, const char *v, size_t n);
/* obj[k] = the value v[0, vn) of parameter k[0, kn) of function fname, typed as tc_typed_value; -1 on failure. */
int tc_set_param(const sl_tc_parser *p, json_t *obj, const char *fname, const char *k, size_t kn, const char *v,
                 size_t vn);
/* The end of an XML-style call: *args = obj as compact JSON and *name = fname (taken); obj is released. -1 (and
 * fname freed) when it cannot be written. */
int tc_finish_call(json_t *obj, char *fname, char **name, char **args);
int tc_parse_hermes(const char *s, size_t n, char **name, char **args);

int tc_body_glm(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args);
int tc_body_deepseek(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args);
int tc_body_kimi(const sl_tc_parser *p, const char *s, size_t n, char **name, char **args);

/* Harmony: settles what it can of p->pend, returning the bytes consumed (see scan in toolcall.c). */
size_t tc_harmony_scan(sl_tc_parser *p, int final, int *oom);
void tc_harmony_finish(sl_tc_parser *p);
extern const char *const tc_harmony_tokens[];

#endif
