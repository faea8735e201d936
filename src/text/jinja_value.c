/* The Jinja value type with Python semantics: str()/repr(), equality, ordering, json.dumps. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

struct ja_block {
    ja_block *next;
    max_align_t data[];
};

enum { JA_BLOCK = 32768, JA_BIG = 4096 };

void *ja_alloc(jarena *a, size_t n) {
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    a->total += n;
    if (n > JA_BIG) { /* big ones get their own block behind the current one */
        ja_block *b = calloc(1, sizeof *b + n);
        if (!b) abort(); /* no sensible way to continue a render without memory */
        if (a->head) {
            b->next = a->head->next;
            a->head->next = b;
        } else {
            b->next = NULL;
            a->head = b;
            a->used = a->cap = 0;
        }
        return b->data;
    }
    if (!a->head || a->used + n > a->cap) {
        ja_block *b = calloc(1, sizeof *b + JA_BLOCK);
        if (!b) abort();
        b->next = a->head;
        a->head = b;
        a->used = 0;
        a->cap = JA_BLOCK;
    }
    void *p = (char *)a->head->data + a->used;
    a->used += n;
    return p;
}

char *ja_strndup(jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    return p;
}

void ja_free(jarena *a) {
    for (ja_block *b = a->head; b;) {
        ja_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->used = a->cap = 0;
    a->total = 0;
}

void jb_put(jbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) abort();
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
void jb_puts(jbuf *b, const char *s) {
    jb_put(b, s, strlen(s));
}
void jb_putc(jbuf *b, char c) {
    jb_put(b, &c, 1);
}
void jb_printf(jbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        jb_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) abort();
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    jb_put(b, big, (size_t)n);
    free(big);
}
void jb_free(jbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

jv jv_undef(const char *hint) {
    return (jv){.t = JV_UNDEF, .u.s = {hint, 0}};
}
jv jv_none(void) {
    return (jv){.t = JV_NONE};
}
jv jv_bool(int b) {
    return (jv){.t = JV_BOOL, .u.b = !!b};
}
jv jv_int(long long i) {
    return (jv){.t = JV_INT, .u.i = i};
}
jv jv_float(double f) {
    return (jv){.t = JV_FLOAT, .u.f = f};
}
jv jv_str(const char *p, size_t n) {
    return (jv){.t = JV_STR, .u.s = {p, n}};
}
jv jv_cstr(const char *p) {
    return jv_str(p, strlen(p));
}
jv jv_strdup(jarena *a, const char *p, size_t n) {
    return jv_str(ja_strndup(a, p, n), n);
}

jv jv_list(jarena *a, size_t cap) {
    jlist *l = ja_alloc(a, sizeof *l);
    if (cap) {
        l->v = ja_alloc(a, cap * sizeof(jv));
        l->cap = cap;
    }
    return (jv){.t = JV_LIST, .u.l = l};
}

jv jv_dict(jarena *a) {
    return (jv){.t = JV_DICT, .u.d = ja_alloc(a, sizeof(jdict))};
}

void jl_push(jarena *a, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jv *nv = ja_alloc(a, cap * sizeof(jv));
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

static long jd_find(const jdict *d, jv k) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], k)) return (long)i;
    return -1;
}

void jd_set(jarena *a, jdict *d, jv k, jv v) {
    long i = jd_find(d, k);
    if (i >= 0) {
        d->v[i] = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv *nk = ja_alloc(a, cap * sizeof(jv)), *nv = ja_alloc(a, cap * sizeof(jv));
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jv));
            memcpy(nv, d->v, d->n * sizeof(jv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

void jd_setc(jarena *a, jdict *d, const char *k, jv v) {
    jd_set(a, d, jv_cstr(k), v);
}

int jd_get(const jdict *d, jv k, jv *out) {
    long i = jd_find(d, k);
    if (i < 0) return 0;
    *out = d->v[i];
    return 1;
}

int jd_getc(const jdict *d, const char *k, jv *out) {
    size_t n = strlen(k);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, k, n)) {
            *out = d->v[i];
            return 1;
        }
    return 0;
}

jv jv_from_json(jarena *a, json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv d = jv_dict(a);
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) jd_set(a, d.u.d, jv_cstr(k), jv_from_json(a, v));
        return d;
    }
    case JSON_ARRAY: {
        jv l = jv_list(a, json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) jl_push(a, l.u.l, jv_from_json(a, v));
        return l;
    }
    case JSON_STRING: return jv_str(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int(json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(1);
    case JSON_FALSE: return jv_bool(0);
    default: return jv_none();
    }
}

int jv_truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->gen || v.u.l->n != 0;
    case JV_DICT: return v.u.d->ns || v.u.d->n != 0;
    default: return 1;
    }
}

static int is_num(jv v) {
    return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
}
static double num(jv v) {
    return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.u.b;
}

/* Values nest as deep as a template makes them (a loop of set x = [x]; a list appended to itself), so the
 * walks over them stop at JV_MAX_DEPTH instead of exhausting the stack. */
#define JV_MAX_DEPTH 200

static int eq_at(jv a, jv b, int depth);

int jv_eq(jv a, jv b) {
    return eq_at(a, b, 0);
}

/* Past the depth bound two values count as different (Python would raise RecursionError). */
static int eq_at(jv a, jv b, int depth) {
    if (depth > JV_MAX_DEPTH) return 0;
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT)
            return (a.t == JV_INT ? a.u.i : a.u.b) == (b.t == JV_INT ? b.u.i : b.u.b);
        return num(a) == num(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if (a.u.l == b.u.l) return 1;
        if (a.u.l->gen || b.u.l->gen || a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!eq_at(a.u.l->v[i], b.u.l->v[i], depth + 1)) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d == b.u.d) return 1;
        if (a.u.d->ns || b.u.d->ns || a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv o;
            if (!jd_get(b.u.d, a.u.d->k[i], &o) || !eq_at(a.u.d->v[i], o, depth + 1)) return 0;
        }
        return 1;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

const char *jv_typename(jv v) {
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.u.l->gen ? "generator" : v.u.l->tuple ? "tuple" : "list";
    case JV_DICT: return v.u.d->ns ? "Namespace" : "dict";
    default: return "function";
    }
}

/* Python float repr: the shortest digits that round-trip, fixed notation for exponents in [-4, 16). */
void jv_float_repr(jbuf *b, double f) {
    if (isnan(f)) {
        jb_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        jb_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp = [-]d.ddde[+-]xx */
    char digits[32];
    int nd = 0, neg = tmp[0] == '-';
    const char *q = tmp + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int exp10 = atoi(q + 1);
    int decpt = exp10 + 1;
    if (neg) jb_putc(b, '-');
    if (decpt > 16 || decpt < -3) {
        jb_putc(b, digits[0]);
        if (nd > 1) {
            jb_putc(b, '.');
            jb_put(b, digits + 1, (size_t)nd - 1);
        }
        jb_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (decpt <= 0) {
        jb_puts(b, "0.");
        for (int i = 0; i < -decpt; i++) jb_putc(b, '0');
        jb_put(b, digits, (size_t)nd);
    } else {
        for (int i = 0; i < decpt; i++) jb_putc(b, i < nd ? digits[i] : '0');
        jb_putc(b, '.');
        if (nd > decpt)
            jb_put(b, digits + decpt, (size_t)(nd - decpt));
        else
            jb_putc(b, '0');
    }
}

static unsigned utf8_decode(const unsigned char *s, size_t n, size_t *adv) {
    unsigned c = s[0];
    size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (k > n) k = n;
    unsigned cp = k == 1 ? c : k == 2 ? c & 0x1F : k == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < k; i++) cp = (cp << 6) | (s[i] & 0x3F);
    *adv = k;
    return cp;
}

static void repr_str(jbuf *b, const char *s, size_t n) {
    int sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char quote = sq && !dq ? '"' : '\'';
    jb_putc(b, quote);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == (unsigned char)quote || c == '\\') {
            jb_putc(b, '\\');
            jb_putc(b, (char)c);
        } else if (c == '\n')
            jb_puts(b, "\\n");
        else if (c == '\r')
            jb_puts(b, "\\r");
        else if (c == '\t')
            jb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f)
            jb_printf(b, "\\x%02x", c);
        else if (c >= 0x80) {
            size_t k;
            unsigned cp = utf8_decode((const unsigned char *)s + i, n - i, &k);
            if (cp < 0xA0)
                jb_printf(b, "\\x%02x", cp);
            else
                jb_put(b, s + i, k);
            i += k;
            continue;
        } else
            jb_putc(b, (char)c);
        i++;
    }
    jb_putc(b, quote);
}

static void str_at(jbuf *b, jv v, int depth);

static void repr_at(jbuf *b, jv v, int depth) {
    if (v.t == JV_STR)
        repr_str(b, v.u.s.p, v.u.s.n);
    else
        str_at(b, v, depth);
}

/* Past the depth bound a container prints as Python prints one that contains itself. */
static void seq_to(jbuf *b, jv v, int depth) {
    jlist *l = v.u.l;
    if (l->gen) {
        jb_puts(b, "<generator object>");
        return;
    }
    if (depth > JV_MAX_DEPTH) {
        jb_puts(b, l->tuple ? "(...)" : "[...]");
        return;
    }
    jb_putc(b, l->tuple ? '(' : '[');
    for (size_t i = 0; i < l->n; i++) {
        if (i) jb_puts(b, ", ");
        repr_at(b, l->v[i], depth + 1);
    }
    if (l->tuple && l->n == 1) jb_putc(b, ',');
    jb_putc(b, l->tuple ? ')' : ']');
}

static void dict_to(jbuf *b, jv v, int depth) {
    jdict *d = v.u.d;
    if (depth > JV_MAX_DEPTH) {
        jb_puts(b, "{...}");
        return;
    }
    jb_puts(b, d->ns ? "<Namespace {" : "{");
    for (size_t i = 0; i < d->n; i++) {
        if (i) jb_puts(b, ", ");
        repr_at(b, d->k[i], depth + 1);
        jb_puts(b, ": ");
        repr_at(b, d->v[i], depth + 1);
    }
    jb_puts(b, d->ns ? "}>" : "}");
}

static void str_at(jbuf *b, jv v, int depth) {
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(b, "None"); return;
    case JV_BOOL: jb_puts(b, v.u.b ? "True" : "False"); return;
    case JV_INT: jb_printf(b, "%lld", v.u.i); return;
    case JV_FLOAT: jv_float_repr(b, v.u.f); return;
    case JV_STR: jb_put(b, v.u.s.p, v.u.s.n); return;
    case JV_LIST: seq_to(b, v, depth); return;
    case JV_DICT: dict_to(b, v, depth); return;
    default: jb_printf(b, "<function %s>", v.u.fn->name ? v.u.fn->name : "?"); return;
    }
}

void jv_str_to(jbuf *b, jv v) {
    str_at(b, v, 0);
}

void jv_repr_to(jbuf *b, jv v) {
    repr_at(b, v, 0);
}

jv jv_to_str(jarena *a, jv v) {
    if (v.t == JV_STR) return v;
    jbuf b = {0};
    jv_str_to(&b, v);
    jv r = jv_strdup(a, b.p ? b.p : "", b.n);
    jb_free(&b);
    return r;
}

jv jv_html_escape(jarena *a, jv v) {
    if (v.t == JV_STR && v.safe) return v;
    jv s = jv_to_str(a, v);
    jbuf b = {0};
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i];
        if (ch == '&')
            jb_puts(&b, "&amp;");
        else if (ch == '<')
            jb_puts(&b, "&lt;");
        else if (ch == '>')
            jb_puts(&b, "&gt;");
        else if (ch == '"')
            jb_puts(&b, "&#34;");
        else if (ch == '\'')
            jb_puts(&b, "&#39;");
        else
            jb_putc(&b, ch);
    }
    jv r = jv_strdup(a, b.p ? b.p : "", b.n);
    jb_free(&b);
    r.safe = 1;
    return r;
}

static void json_str(jbuf *b, const char *s, size_t n, int ensure_ascii) {
    jb_putc(b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': jb_puts(b, "\\\""); break;
        case '\\': jb_puts(b, "\\\\"); break;
        case '\n': jb_puts(b, "\\n"); break;
        case '\r': jb_puts(b, "\\r"); break;
        case '\t': jb_puts(b, "\\t"); break;
        case '\b': jb_puts(b, "\\b"); break;
        case '\f': jb_puts(b, "\\f"); break;
        default:
            if (c < 0x20)
                jb_printf(b, "\\u%04x", c);
            else if (c >= 0x80 && ensure_ascii) {
                size_t k;
                unsigned cp = utf8_decode((const unsigned char *)s + i, n - i, &k);
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    jb_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
                } else
                    jb_printf(b, "\\u%04x", cp);
                i += k;
                continue;
            } else
                jb_putc(b, (char)c);
        }
        i++;
    }
    jb_putc(b, '"');
}

static void json_nl(jbuf *b, int indent, const char *istr, int level) {
    jb_putc(b, '\n');
    for (int i = 0; i < level; i++) {
        if (istr)
            jb_puts(b, istr);
        else
            for (int k = 0; k < indent; k++) jb_putc(b, ' ');
    }
}

static int json_key(jbuf *b, jv k, int ensure_ascii, sl_err *e) {
    switch (k.t) {
    case JV_STR: json_str(b, k.u.s.p, k.u.s.n, ensure_ascii); return 0;
    case JV_INT:
    case JV_FLOAT:
    case JV_BOOL:
    case JV_NONE:
        jb_putc(b, '"');
        if (k.t == JV_BOOL)
            jb_puts(b, k.u.b ? "true" : "false");
        else if (k.t == JV_NONE)
            jb_puts(b, "null");
        else
            jv_str_to(b, k);
        jb_putc(b, '"');
        return 0;
    default: return sl_fail(e, "TypeError: keys must be str, int, float, bool or None, not %s", jv_typename(k));
    }
}

static int json_rec(jbuf *b, jv v, int indent, const char *istr, int sort_keys, int ensure_ascii, int level,
                    sl_err *e) {
    if (level > JV_MAX_DEPTH)
        return sl_fail(e, "RecursionError: maximum recursion depth exceeded while encoding a JSON object");
    int pretty = indent >= 0 || istr;
    switch (v.t) {
    case JV_NONE: jb_puts(b, "null"); return 0;
    case JV_BOOL: jb_puts(b, v.u.b ? "true" : "false"); return 0;
    case JV_INT: jb_printf(b, "%lld", v.u.i); return 0;
    case JV_FLOAT:
        if (isnan(v.u.f))
            jb_puts(b, "NaN");
        else if (isinf(v.u.f))
            jb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            jv_float_repr(b, v.u.f);
        return 0;
    case JV_STR: json_str(b, v.u.s.p, v.u.s.n, ensure_ascii); return 0;
    case JV_LIST: {
        jlist *l = v.u.l;
        if (l->gen) return sl_fail(e, "TypeError: Object of type generator is not JSON serializable");
        if (!l->n) {
            jb_puts(b, "[]");
            return 0;
        }
        jb_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) jb_puts(b, pretty ? "," : ", ");
            if (pretty) json_nl(b, indent, istr, level + 1);
            if (json_rec(b, l->v[i], indent, istr, sort_keys, ensure_ascii, level + 1, e)) return -1;
        }
        if (pretty) json_nl(b, indent, istr, level);
        jb_putc(b, ']');
        return 0;
    }
    case JV_DICT: {
        jdict *d = v.u.d;
        if (d->ns) return sl_fail(e, "TypeError: Object of type Namespace is not JSON serializable");
        if (!d->n) {
            jb_puts(b, "{}");
            return 0;
        }
        size_t *ord = malloc(d->n * sizeof *ord);
        if (!ord) abort();
        for (size_t i = 0; i < d->n; i++) ord[i] = i;
        if (sort_keys) /* insertion sort keeps it stable and dicts here are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0; j--) {
                    int r = 0;
                    if (jv_cmp(d->k[ord[j - 1]], d->k[ord[j]], &r, e)) {
                        free(ord);
                        return -1;
                    }
                    if (r <= 0) break;
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        jb_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) jb_puts(b, pretty ? "," : ", ");
            if (pretty) json_nl(b, indent, istr, level + 1);
            if (json_key(b, d->k[ord[i]], ensure_ascii, e) ||
                (jb_puts(b, ": "), json_rec(b, d->v[ord[i]], indent, istr, sort_keys, ensure_ascii, level + 1, e))) {
                free(ord);
                return -1;
            }
        }
        free(ord);
        if (pretty) json_nl(b, indent, istr, level);
        jb_putc(b, '}');
        return 0;
    }
    default: return sl_fail(e, "TypeError: Object of type %s is not JSON serializable", jv_typename(v));
    }
}

int jv_json(jbuf *b, jv v, int indent, const char *istr, int sort_keys, int ensure_ascii, sl_err *e) {
    return json_rec(b, v, indent, istr, sort_keys, ensure_ascii, 0, e);
}

static int cmp_at(jv a, jv b, int *r, int depth, sl_err *e);

int jv_cmp(jv a, jv b, int *r, sl_err *e) {
    return cmp_at(a, b, r, 0, e);
}

static int cmp_at(jv a, jv b, int *r, int depth, sl_err *e) {
    if (depth > JV_MAX_DEPTH) return sl_fail(e, "RecursionError: maximum recursion depth exceeded in comparison");
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            long long x = a.t == JV_INT ? a.u.i : a.u.b, y = b.t == JV_INT ? b.u.i : b.u.b;
            *r = (x > y) - (x < y);
        } else {
            double x = num(a), y = num(b);
            *r = (x > y) - (x < y);
        }
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        *r = c ? (c > 0 ? 1 : -1) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
        return 0;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && !a.u.l->gen && !b.u.l->gen && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (eq_at(a.u.l->v[i], b.u.l->v[i], depth + 1)) continue;
            return cmp_at(a.u.l->v[i], b.u.l->v[i], r, depth + 1, e);
        }
        *r = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return 0;
    }
    return sl_fail(e, "TypeError: '<' not supported between instances of '%s' and '%s'", jv_typename(a),
                   jv_typename(b));
}

size_t ju_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

size_t ju_off(const char *s, size_t n, size_t idx) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == idx) return i;
            c++;
        }
    return n;
}
