/* Internals shared by the Jinja modules: arena, string buffer, value type, AST and render context. */
#ifndef SLUICE_TEXT_JINJA_INT_H
#define SLUICE_TEXT_JINJA_INT_H

#include <stddef.h>
#include <time.h>

#include <jansson.h>

#include "core/err.h"

/* ---- arena: everything a parse or a render allocates lives until the arena is dropped ---- */
typedef struct ja_block ja_block;
typedef struct jarena {
    ja_block *head;
    size_t used, cap; /* bump position within head */
    size_t total;     /* bytes handed out, for the render's memory bound */
    size_t limit;     /* a render's bound on total plus its output (JX_MAX_BYTES unless set) */
} jarena;
void *ja_alloc(jarena *a, size_t n); /* zeroed; aborts when memory runs out */
char *ja_strndup(jarena *a, const char *s, size_t n);
void ja_free(jarena *a);

/* ---- growable byte buffer (malloc'd) ---- */
typedef struct jbuf {
    char *p;
    size_t n, cap;
} jbuf;
void jb_put(jbuf *b, const char *s, size_t n);
void jb_puts(jbuf *b, const char *s);
void jb_putc(jbuf *b, char c);
void jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void jb_free(jbuf *b);

/* ---- values ---- */
typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC } jv_type;

typedef struct jv jv;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;

struct jv {
    jv_type t;
    unsigned char safe; /* JV_STR: a markupsafe Markup (|safe, |escape): '+' escapes the plain operand */
    union {
        int b;
        long long i;
        double f;
        struct {
            const char *p; /* JV_STR: bytes; JV_UNDEF: a hint for error messages (may be NULL) */
            size_t n;
        } s;
        jlist *l;
        jdict *d;
        jfunc *fn;
    } u;
};

struct jlist {
    jv *v;
    size_t n, cap;
    int tuple; /* prints as (a, b) */
    int gen;   /* a lazy result (map, select...): no len(), not JSON serializable */
};

struct jdict {
    jv *k, *v;
    size_t n, cap;
    int ns; /* a namespace(): attributes may be assigned */
};

typedef enum { FN_GLOBAL, FN_METHOD, FN_MACRO, FN_CALLER, FN_CYCLE, FN_CHANGED } jfn_kind;
struct jnode;
struct jscope;
struct jfunc {
    jfn_kind kind;
    const char *name;
    jv self;                 /* FN_METHOD: the receiver; FN_CHANGED: a one-item list of the last value */
    const struct jnode *def; /* FN_MACRO / FN_CALLER: the definition */
    struct jscope *closure;
    long long idx; /* FN_CYCLE: loop.index0 */
    jv caller;     /* FN_MACRO called from {% call %}: the caller */
};

jv jv_undef(const char *hint);
jv jv_none(void);
jv jv_bool(int b);
jv jv_int(long long i);
jv jv_float(double f);
jv jv_str(const char *p, size_t n); /* references p */
jv jv_cstr(const char *p);
jv jv_strdup(jarena *a, const char *p, size_t n);
jv jv_list(jarena *a, size_t cap);
jv jv_dict(jarena *a);
void jl_push(jarena *a, jlist *l, jv v);
void jd_set(jarena *a, jdict *d, jv k, jv v);
void jd_setc(jarena *a, jdict *d, const char *k, jv v);
int jd_get(const jdict *d, jv k, jv *out); /* 1 when found */
int jd_getc(const jdict *d, const char *k, jv *out);

/* bool counts as an int, as in Python */
static inline int jv_is_int(jv v) {
    return v.t == JV_INT || v.t == JV_BOOL;
}
/* Floats truncate toward zero; NaN and values past the 64-bit range (undefined in a C cast) clamp. */
static inline long long jv_ival(jv v) {
    if (v.t == JV_INT) return v.u.i;
    if (v.t == JV_BOOL) return v.u.b;
    if (!(v.u.f == v.u.f)) return 0;
    if (v.u.f >= 9223372036854775807.0) return 9223372036854775807LL;
    if (v.u.f <= -9223372036854775807.0) return -9223372036854775807LL - 1;
    return (long long)v.u.f;
}

jv jv_from_json(jarena *a, json_t *j);
int jv_truthy(jv v);
int jv_eq(jv a, jv b);
const char *jv_typename(jv v);
/* Python str() / repr() appended to b; returns -1 only for values that have no text form. */
void jv_str_to(jbuf *b, jv v);
void jv_repr_to(jbuf *b, jv v);
jv jv_to_str(jarena *a, jv v);      /* str(v) as a value */
jv jv_html_escape(jarena *a, jv s); /* markupsafe.escape(): a safe string */
void jv_float_repr(jbuf *b, double f);
/* json.dumps(v, ensure_ascii, indent, separators=None, sort_keys); indent < 0 = None, istr overrides. */
int jv_json(jbuf *b, jv v, int indent, const char *istr, int sort_keys, int ensure_ascii, sl_err *e);
/* Python ordering: -1/0/1 in *r; fails for unorderable types. */
int jv_cmp(jv a, jv b, int *r, sl_err *e);
/* Number of code points; the byte offset of code point i. */
size_t ju_len(const char *s, size_t n);
size_t ju_off(const char *s, size_t n, size_t i);

/* ---- tokens and AST ---- */
typedef enum {
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_MACRO,
    N_CALLBLOCK,
    N_FILTERBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_DO,
    N_WITH,
    E_LIT,
    E_NAME,
    E_LIST,
    E_TUPLE,
    E_DICT,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NOT,
    E_NEG,
    E_POS,
    E_BIN,
    E_AND,
    E_OR,
    E_COND
} jn_kind;

typedef enum {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FDIV,
    OP_MOD,
    OP_POW,
    OP_CAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_IN,
    OP_NOTIN
} jop;

typedef struct jnode {
    jn_kind k;
    int line;
    int op;                   /* E_BIN operator; E_TEST negation; N_MACRO: MACRO_* flags */
    jv lit;                   /* E_LIT; N_TEXT */
    const char *name, *name2; /* names; N_SET on ns.attr uses both */
    struct jnode *a, *b, *c, *d;
    struct jnode **v, **w; /* items/args/body, else-body/kw values/dict values/defaults */
    size_t nv, nw;
    const char **names; /* kw names / targets / params */
    size_t nnames;
} jnode;

/* N_MACRO flags: the body mentions varargs / kwargs, so extra arguments are accepted */
#define MACRO_VARARGS 1
#define MACRO_KWARGS 2

/* ---- render context ---- */
typedef struct jscope {
    struct jscope *parent;
    jdict vars;
} jscope;

typedef struct jctx {
    jarena *a;
    sl_err *e;
    int line;
    time_t now;
    int depth; /* macro recursion guard */
    int nest;  /* evaluation depth, bounded by JX_MAX_NEST */
} jctx;

/* Evaluation depth: room for the macro recursion limit (200) times a few levels each. */
#define JX_MAX_NEST 3000
/* Memory a render may hold (its values and its output): nested loops over strings or ranges grow without
 * bound where Python would run until memory ran out. Chat templates over long conversations stay far below. */
#define JX_MAX_BYTES ((size_t)1 << 30)
/* Widths, indents and precisions a template may ask for (Python's would build any size memory allows). */
#define JX_MAX_WIDTH (1 << 20)

int jx_fail(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int jx_undef_fail(jctx *c, jv v); /* UndefinedError for using an undefined value */

/* builtins (jinja_builtins.c: access, globals, methods; jinja_ops.c: operators; jinja_filters.c) */
int jx_filter(jctx *c, const char *name, jv in, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, jv *out);
int jx_has_filter(const char *name);
int jx_test(jctx *c, const char *name, jv in, jv *args, size_t nargs, int *res);
int jx_has_test(const char *name);
int jx_call_builtin(jctx *c, jv fn, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, jv *out);
int jx_getattr(jctx *c, jv obj, const char *name, jv *out);
int jx_getitem(jctx *c, jv obj, jv key, jv *out);
int jx_getattr_only(jctx *c, jv obj, const char *name, jv *out); /* attributes (methods) only, never dict keys */
int jx_iter(jctx *c, jv v, jlist **out);                         /* materialises anything iterable */
int jx_binop(jctx *c, int op, jv a, jv b, jv *out);
jv jx_global(jarena *a, const char *name); /* range, dict, namespace...; JV_UNDEF when none */
int jx_percent_format(jctx *c, jv fmt, jv args, jv *out);
/* string helpers shared by methods and filters (jinja_str.c) */
typedef enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_JTITLE } jcase;
jv js_case(jarena *a, jv s, jcase mode);
jv js_strip(jarena *a, jv s, const jv *chars, int left, int right); /* chars NULL or None: whitespace */
jv js_replace(jarena *a, jv s, jv old, jv new_, long long count);
int js_split(jctx *c, jv s, jv sep, long long maxsplit, int from_right, jv *out);
jv js_splitlines(jarena *a, jv s, int keepends);
long long js_find(jv s, jv sub, int from_right); /* code point index or -1 */
long long js_count(jv s, jv sub);
jv js_join(jctx *c, jv sep, jlist *items);
int js_startswith(jv s, jv prefix, int end);

#endif
