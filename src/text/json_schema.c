#include "text/json_schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- text buffer */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) {
    sb_add(b, s, strlen(s));
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_add(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_add(b, big, (size_t)n);
    free(big);
}

/* ---------------------------------------------------------------- GBNF pieces */

/* One code point as GBNF source: letters and digits as they are, the rest escaped. */
static void gbnf_cp(sbuf *b, uint32_t cp) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == ' ') {
        char c = (char)cp;
        sb_add(b, &c, 1);
    } else if (cp < 0x100) {
        sb_printf(b, "\\x%02X", cp);
    } else if (cp < 0x10000) {
        sb_printf(b, "\\u%04X", cp);
    } else {
        sb_printf(b, "\\U%08X", cp);
    }
}

static int utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    int k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!k || (size_t)k > n) return 0;
    uint32_t v = k == 1 ? c : k == 2 ? c & 0x1F : k == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return k;
}

char *sl_gbnf_literal(const char *s, size_t n) {
    sbuf b = {0};
    sb_puts(&b, "\"");
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (!k) { /* a stray byte stands for itself */
            cp = (unsigned char)s[i];
            k = 1;
        }
        if (cp >= 0x20 && cp < 0x7F && cp != '"' && cp != '\\') {
            char c = (char)cp;
            sb_add(&b, &c, 1);
        } else {
            gbnf_cp(&b, cp);
        }
        i += (size_t)k;
    }
    sb_puts(&b, "\"");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

static const char PRIMITIVES[] =
    "j-ws ::= \"\" | \" \" | \"\\n\" [ \\t]{0,20}\n"
    "j-char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "j-string ::= \"\\\"\" j-char* \"\\\"\" j-ws\n"
    "j-uint-part ::= \"0\" | [1-9] [0-9]{0,15}\n"
    "j-frac ::= \".\" [0-9]{1,16}\n"
    "j-exp ::= [eE] [-+]? [0-9]{1,2}\n"
    "j-number ::= \"-\"? j-uint-part j-frac? j-exp? j-ws\n"
    "j-unumber ::= j-uint-part j-frac? j-exp? j-ws\n"
    "j-integer ::= \"-\"? j-uint-part j-ws\n"
    "j-uinteger ::= j-uint-part j-ws\n"
    "j-ninteger ::= \"-\" [1-9] [0-9]{0,15} j-ws\n"
    "j-boolean ::= (\"true\" | \"false\") j-ws\n"
    "j-null ::= \"null\" j-ws\n"
    "j-value ::= j-object | j-array | j-string | j-number | j-boolean | j-null\n"
    "j-kv ::= j-string \":\" j-ws j-value\n"
    "j-object ::= \"{\" j-ws (j-kv (\",\" j-ws j-kv)*)? \"}\" j-ws\n"
    "j-array ::= \"[\" j-ws (j-value (\",\" j-ws j-value)*)? \"]\" j-ws\n"
    "j-d2 ::= [0-9] [0-9]\n"
    "j-date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])\n"
    "j-hm ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9]\n"
    "j-time ::= j-hm \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] j-hm)\n"
    "j-uuid ::= [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}\n";

/* ---------------------------------------------------------------- generator */

typedef struct jsref {
    char *ref;
    char rule[48];
} jsref;

struct sl_jsgen {
    sbuf text;
    int n_schemas, counter;
    /* per added schema */
    json_t *root;
    jsref *refs;
    int n_refs;
    int depth;
};

sl_jsgen *sl_jsgen_new(void) {
    sl_jsgen *b = calloc(1, sizeof *b);
    if (b) sb_puts(&b->text, PRIMITIVES);
    if (b && b->text.oom) {
        free(b->text.p);
        free(b);
        return NULL;
    }
    return b;
}

static void clear_refs(sl_jsgen *b) {
    for (int i = 0; i < b->n_refs; i++) free(b->refs[i].ref);
    free(b->refs);
    b->refs = NULL;
    b->n_refs = 0;
}

void sl_jsgen_free(sl_jsgen *b) {
    if (!b) return;
    clear_refs(b);
    free(b->text.p);
    free(b);
}

const char *sl_jsgen_text(const sl_jsgen *b) {
    return b->text.p;
}

int sl_jsgen_rule(sl_jsgen *b, const char *name, const char *body, sl_err *e) {
    sb_printf(&b->text, "%s ::= %s\n", name, body);
    return b->text.oom ? sl_fail(e, "out of memory") : 0;
}

static void new_name(sl_jsgen *b, char *out) {
    snprintf(out, 48, "s%d-%d", b->n_schemas, b->counter++);
}

static int emit(sl_jsgen *b, const char *name, sbuf *body, sl_err *e) {
    if (body->oom) return sl_fail(e, "out of memory");
    return sl_jsgen_rule(b, name, body->p ? body->p : "\"\"", e);
}

static int visit(sl_jsgen *b, json_t *s, const char *path, char *out, sl_err *e);

/* A JSON value written out exactly, then whitespace. */
static int literal_value(json_t *v, sbuf *body, sl_err *e) {
    char *j = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    char *l = j ? sl_gbnf_literal(j, strlen(j)) : NULL;
    free(j);
    if (!l) return sl_fail(e, "out of memory");
    sb_puts(body, l);
    sb_puts(body, " j-ws");
    free(l);
    return 0;
}

/* ---------------------------------------------------------------- regex subset -> GBNF */

typedef struct cset {
    uint32_t *r; /* [lo, hi] pairs */
    size_t n, cap;
} cset;

static int cs_add(cset *c, uint32_t lo, uint32_t hi) {
    if (c->n * 2 + 2 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        uint32_t *q = realloc(c->r, cap * sizeof *q);
        if (!q) return -1;
        c->r = q;
        c->cap = cap;
    }
    c->r[2 * c->n] = lo;
    c->r[2 * c->n + 1] = hi;
    c->n++;
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static void cs_norm(cset *c) {
    qsort(c->r, c->n, 2 * sizeof *c->r, cmp_range);
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (k && c->r[2 * i] <= c->r[2 * (k - 1) + 1] + 1) {
            if (c->r[2 * i + 1] > c->r[2 * (k - 1) + 1]) c->r[2 * (k - 1) + 1] = c->r[2 * i + 1];
        } else {
            c->r[2 * k] = c->r[2 * i];
            c->r[2 * k + 1] = c->r[2 * i + 1];
            k++;
        }
    }
    c->n = k;
}

/* The complement within [0, U+10FFFF]. */
static int cs_invert(cset *c) {
    cs_norm(c);
    cset o = {0};
    uint32_t next = 0;
    int rc = 0;
    for (size_t i = 0; i < c->n && !rc; i++) {
        if (c->r[2 * i] > next) rc = cs_add(&o, next, c->r[2 * i] - 1);
        next = c->r[2 * i + 1] + 1;
    }
    if (!rc && next <= 0x10FFFF) rc = cs_add(&o, next, 0x10FFFF);
    free(c->r);
    *c = o;
    return rc;
}

static int cs_has(const cset *c, uint32_t cp) {
    for (size_t i = 0; i < c->n; i++)
        if (cp >= c->r[2 * i] && cp <= c->r[2 * i + 1]) return 1;
    return 0;
}

/* Removes [lo, hi] from a normalised set. */
static int cs_remove(cset *c, uint32_t lo, uint32_t hi) {
    cset o = {0};
    int rc = 0;
    for (size_t i = 0; i < c->n && !rc; i++) {
        uint32_t a = c->r[2 * i], z = c->r[2 * i + 1];
        if (z < lo || a > hi) {
            rc = cs_add(&o, a, z);
            continue;
        }
        if (a < lo) rc = cs_add(&o, a, lo - 1);
        if (!rc && z > hi) rc = cs_add(&o, hi + 1, z);
    }
    free(c->r);
    *c = o;
    return rc;
}

typedef struct rx {
    const char *s, *p, *end;
    const char *path;
    sbuf *out;
    sl_err *e;
} rx;

static int rx_err(rx *x, const char *what) {
    return sl_fail(x->e, "%s: pattern at offset %d: %s", x->path, (int)(x->p - x->s), what);
}

/* A code point as it must appear inside a JSON string, as a GBNF literal. */
static void rx_literal(rx *x, uint32_t cp) {
    char buf[8];
    if (cp == '"' || cp == '\\') {
        snprintf(buf, sizeof buf, "\\%c", (char)cp);
    } else if (cp == '\n' || cp == '\t' || cp == '\r') {
        snprintf(buf, sizeof buf, "\\%c", cp == '\n' ? 'n' : cp == '\t' ? 't' : 'r');
    } else if (cp < 0x20) {
        snprintf(buf, sizeof buf, "\\u%04x", cp);
    } else {
        sb_puts(x->out, "[");
        gbnf_cp(x->out, cp);
        sb_puts(x->out, "]");
        return;
    }
    char *l = sl_gbnf_literal(buf, strlen(buf));
    if (!l) {
        x->out->oom = 1;
        return;
    }
    sb_puts(x->out, l);
    free(l);
}

/* A set of code points inside a JSON string: the plain ones as a class, `"` and `\` escaped; control
 * characters are left out (a subset of what the pattern matches is still a match). */
static int rx_emit_set(rx *x, cset *c) {
    cs_norm(c);
    int quote = cs_has(c, '"'), bslash = cs_has(c, '\\');
    if (cs_remove(c, 0, 0x1F) || cs_remove(c, '"', '"') || cs_remove(c, '\\', '\\'))
        return sl_fail(x->e, "out of memory");
    if (!c->n && !quote && !bslash) return rx_err(x, "a character class that matches no printable character");
    sb_puts(x->out, "(");
    const char *sep = "";
    if (c->n) {
        sb_puts(x->out, "[");
        for (size_t i = 0; i < c->n; i++) {
            gbnf_cp(x->out, c->r[2 * i]);
            if (c->r[2 * i + 1] != c->r[2 * i]) {
                sb_puts(x->out, "-");
                gbnf_cp(x->out, c->r[2 * i + 1]);
            }
        }
        sb_puts(x->out, "]");
        sep = " | ";
    }
    if (quote) {
        sb_printf(x->out, "%s\"\\\\\\\"\"", sep);
        sep = " | ";
    }
    if (bslash) sb_printf(x->out, "%s\"\\\\\\\\\"", sep);
    sb_puts(x->out, ")");
    return 0;
}

/* \d \w \s and their negations into c; 0 when `k` is not a class escape. */
static int rx_class_escape(char k, cset *c, int *ok) {
    *ok = 1;
    cset t = {0};
    int rc = 0;
    switch (k) {
    case 'd':
    case 'D': rc = cs_add(&t, '0', '9'); break;
    case 'w':
    case 'W': rc = cs_add(&t, '0', '9') || cs_add(&t, 'A', 'Z') || cs_add(&t, 'a', 'z') || cs_add(&t, '_', '_'); break;
    case 's':
    case 'S': rc = cs_add(&t, ' ', ' ') || cs_add(&t, '\t', '\r'); break;
    default: *ok = 0; return 0;
    }
    if (!rc && k >= 'A' && k <= 'Z') rc = cs_invert(&t);
    for (size_t i = 0; !rc && i < t.n; i++) rc = cs_add(c, t.r[2 * i], t.r[2 * i + 1]);
    free(t.r);
    return rc;
}

/* One (possibly escaped) character of a pattern. */
static int rx_char(rx *x, uint32_t *cp) {
    if (x->p >= x->end) return rx_err(x, "unexpected end");
    if (*x->p != '\\') {
        int k = utf8_next((const unsigned char *)x->p, (size_t)(x->end - x->p), cp);
        if (!k) return rx_err(x, "invalid UTF-8");
        x->p += k;
        return 0;
    }
    if (x->p + 1 >= x->end) return rx_err(x, "a trailing backslash");
    char k = x->p[1];
    x->p += 2;
    switch (k) {
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'x':
    case 'u': {
        int nd = k == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < nd; i++) {
            char h = x->p < x->end ? *x->p : 0;
            int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
            if (d < 0) return rx_err(x, "\\x and \\u need hexadecimal digits");
            v = v << 4 | (uint32_t)d;
            x->p++;
        }
        *cp = v;
        return 0;
    }
    default:
        if ((k >= 'a' && k <= 'z') || (k >= 'A' && k <= 'Z') || (k >= '0' && k <= '9')) {
            x->p -= 2;
            return rx_err(x, "this escape (word boundaries, backreferences, \\p classes ...) is not supported");
        }
        *cp = (unsigned char)k;
        return 0;
    }
}

static int rx_class(rx *x) {
    cset c = {0};
    int neg = 0, rc = 0, first = 1;
    x->p++;
    if (x->p < x->end && *x->p == '^') {
        neg = 1;
        x->p++;
    }
    for (;;) {
        if (x->p >= x->end) {
            rc = rx_err(x, "unterminated character class");
            break;
        }
        if (*x->p == ']' && !first) {
            x->p++;
            break;
        }
        first = 0;
        if (*x->p == '\\' && x->p + 1 < x->end) {
            int ok;
            if ((rc = rx_class_escape(x->p[1], &c, &ok))) break;
            if (ok) {
                x->p += 2;
                continue;
            }
        }
        uint32_t a, z;
        if ((rc = rx_char(x, &a))) break;
        z = a;
        if (x->p + 1 < x->end && *x->p == '-' && x->p[1] != ']') {
            x->p++;
            if ((rc = rx_char(x, &z))) break;
            if (z < a) {
                rc = rx_err(x, "a range with its end before its start");
                break;
            }
        }
        if (cs_add(&c, a, z)) {
            rc = sl_fail(x->e, "out of memory");
            break;
        }
    }
    if (!rc && neg && cs_invert(&c)) rc = sl_fail(x->e, "out of memory");
    if (!rc) rc = rx_emit_set(x, &c);
    free(c.r);
    return rc;
}

static int rx_alt(rx *x, int depth);

/* {m}, {m,}, {m,n} at x->p: 1 when it is one (copied to the output), 0 when `{` is a literal. */
static int rx_braces(rx *x, int apply) {
    const char *q = x->p + 1;
    long m = 0, n = -1;
    if (q >= x->end || *q < '0' || *q > '9') return 0;
    while (q < x->end && *q >= '0' && *q <= '9') m = m * 10 + (*q++ - '0');
    if (q < x->end && *q == ',') {
        q++;
        if (q < x->end && *q >= '0' && *q <= '9') {
            n = 0;
            while (q < x->end && *q >= '0' && *q <= '9') n = n * 10 + (*q++ - '0');
        }
    } else {
        n = m;
    }
    if (q >= x->end || *q != '}') return 0;
    if (!apply) return 1;
    if (m > 10000 || n > 10000) return rx_err(x, "a repetition count above 10000");
    if (n >= 0 && n < m) return rx_err(x, "{m,n} with n < m");
    if (n < 0)
        sb_printf(x->out, "{%ld,}", m);
    else
        sb_printf(x->out, "{%ld,%ld}", m, n);
    x->p = q + 1;
    return 1;
}

static int rx_seq(rx *x, int depth) {
    sb_puts(x->out, "(\"\"");
    while (x->p < x->end && *x->p != '|' && *x->p != ')') {
        char c = *x->p;
        sb_puts(x->out, " ");
        if (c == '^' && x->p == x->s) {
            x->p++;
            continue;
        }
        if (c == '$' && x->p + 1 == x->end) {
            x->p++;
            continue;
        }
        if (c == '^' || c == '$') return rx_err(x, "anchors are only supported at the start and end");
        if (c == '*' || c == '+' || c == '?' || (c == '{' && rx_braces(x, 0))) {
            return rx_err(x, "a repetition with nothing before it");
        } else if (c == '(') {
            x->p++;
            if (x->p < x->end && *x->p == '?') {
                if (x->p + 1 < x->end && x->p[1] == ':') {
                    x->p += 2;
                } else if (x->p + 2 < x->end && (x->p[1] == '<' || x->p[1] == 'P') && x->p[2] != '=' &&
                           x->p[2] != '!') {
                    while (x->p < x->end && *x->p != '>') x->p++; /* a named group is a plain group */
                    if (x->p >= x->end) return rx_err(x, "unterminated group name");
                    x->p++;
                } else {
                    return rx_err(x, "lookarounds and inline flags are not supported");
                }
            }
            if (rx_alt(x, depth + 1)) return -1;
            if (x->p >= x->end || *x->p != ')') return rx_err(x, "a group without its ')'");
            x->p++;
        } else if (c == '[') {
            if (rx_class(x)) return -1;
        } else if (c == '.') {
            x->p++;
            cset cs = {0};
            int rc = cs_add(&cs, '\n', '\n') || cs_invert(&cs) ? sl_fail(x->e, "out of memory") : rx_emit_set(x, &cs);
            free(cs.r);
            if (rc) return -1;
        } else if (c == '\\' && x->p + 1 < x->end) {
            cset cs = {0};
            int ok, rc = rx_class_escape(x->p[1], &cs, &ok);
            if (!rc && ok) {
                x->p += 2;
                rc = rx_emit_set(x, &cs);
            }
            free(cs.r);
            if (rc) return -1;
            if (!ok) {
                uint32_t cp;
                if (rx_char(x, &cp)) return -1;
                rx_literal(x, cp);
            }
        } else {
            uint32_t cp;
            if (rx_char(x, &cp)) return -1;
            rx_literal(x, cp);
        }
        /* a quantifier, lazy or not (the same strings either way) */
        if (x->p < x->end) {
            char q = *x->p;
            int r = 0;
            if (q == '*' || q == '+' || q == '?') {
                char s[2] = {q, 0};
                sb_puts(x->out, s);
                x->p++;
                r = 1;
            } else if (q == '{') {
                if ((r = rx_braces(x, 1)) < 0) return -1;
            }
            if (r && x->p < x->end && *x->p == '?') x->p++;
            if (r && x->p < x->end && (*x->p == '*' || *x->p == '+' || *x->p == '{'))
                return rx_err(x, "possessive or doubled quantifiers are not supported");
        }
    }
    sb_puts(x->out, ")");
    return 0;
}

static int rx_alt(rx *x, int depth) {
    if (depth > 64) return rx_err(x, "groups nested too deeply");
    sb_puts(x->out, "(");
    if (rx_seq(x, depth)) return -1;
    while (x->p < x->end && *x->p == '|') {
        x->p++;
        sb_puts(x->out, " | ");
        if (rx_seq(x, depth)) return -1;
    }
    sb_puts(x->out, ")");
    return 0;
}

static int regex_gbnf(const char *re, const char *path, sbuf *out, sl_err *e) {
    rx x = {.s = re, .p = re, .end = re + strlen(re), .path = path, .out = out, .e = e};
    if (rx_alt(&x, 0)) return -1;
    if (x.p < x.end) return rx_err(&x, "an unmatched ')'");
    return out->oom ? sl_fail(e, "out of memory") : 0;
}

/* ---------------------------------------------------------------- schema walk */

static int get_count(json_t *s, const char *key, const char *path, long long *out, sl_err *e) {
    json_t *v = json_object_get(s, key);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return sl_fail(e, "%s.%s must be a non-negative integer", path, key);
    *out = json_integer_value(v);
    return 1;
}

static int visit_string(sl_jsgen *b, json_t *s, const char *path, sbuf *body, sl_err *e) {
    const char *fmt = json_string_value(json_object_get(s, "format"));
    const char *pattern = json_string_value(json_object_get(s, "pattern"));
    if (json_object_get(s, "pattern") && !pattern) return sl_fail(e, "%s.pattern must be a string", path);
    long long lo = 0, hi = -1;
    int rl, rh;
    if ((rl = get_count(s, "minLength", path, &lo, e)) < 0 || (rh = get_count(s, "maxLength", path, &hi, e)) < 0)
        return -1;
    if (rh && hi < lo) return sl_fail(e, "%s: maxLength %lld is below minLength %lld", path, hi, lo);
    if (lo > 10000) return sl_fail(e, "%s.minLength %lld is above 10000, which cannot be enforced", path, lo);
    if (hi > 10000) hi = 10000; /* shorter strings still satisfy the schema */
    (void)b;
    if (pattern) {
        char where[600];
        snprintf(where, sizeof where, "%s.pattern", path);
        sb_puts(body, "\"\\\"\" ");
        if (regex_gbnf(pattern, where, body, e)) return -1;
        sb_puts(body, " \"\\\"\" j-ws");
        return 0;
    }
    const char *f = NULL;
    if (fmt && !strcmp(fmt, "date")) f = "j-date";
    if (fmt && !strcmp(fmt, "time")) f = "j-time";
    if (fmt && !strcmp(fmt, "date-time")) f = "j-date \"T\" j-time";
    if (fmt && !strcmp(fmt, "uuid")) f = "j-uuid";
    if (f) {
        sb_printf(body, "\"\\\"\" %s \"\\\"\" j-ws", f);
    } else if (rl || rh) {
        if (hi < 0)
            sb_printf(body, "\"\\\"\" j-char{%lld,} \"\\\"\" j-ws", lo);
        else
            sb_printf(body, "\"\\\"\" j-char{%lld,%lld} \"\\\"\" j-ws", lo, hi);
    } else {
        sb_puts(body, "j-string");
    }
    return 0;
}

static int bound(json_t *s, const char *key, const char *path, double *out, sl_err *e) {
    json_t *v = json_object_get(s, key);
    if (!v) return 0;
    if (!json_is_number(v)) return sl_fail(e, "%s.%s must be a number", path, key);
    *out = json_number_value(v);
    return 1;
}

static int visit_number(json_t *s, int integer, const char *path, sbuf *body, sl_err *e) {
    double mn = 0, mx = 0, xmn = 0, xmx = 0;
    int hmn, hmx, hxmn, hxmx;
    if ((hmn = bound(s, "minimum", path, &mn, e)) < 0 || (hmx = bound(s, "maximum", path, &mx, e)) < 0 ||
        (hxmn = bound(s, "exclusiveMinimum", path, &xmn, e)) < 0 ||
        (hxmx = bound(s, "exclusiveMaximum", path, &xmx, e)) < 0)
        return -1;
    if (integer) {
        /* integer bounds as the closed range [lo, hi] */
        long long lo = -(1LL << 53), hi = 1LL << 53;
        double big = 0x1p60;
        mn = fmax(fmin(mn, big), -big), mx = fmax(fmin(mx, big), -big);
        xmn = fmax(fmin(xmn, big), -big), xmx = fmax(fmin(xmx, big), -big);
        if (hmn && mn > lo) lo = (long long)ceil(mn);
        if (hxmn && xmn >= lo) lo = (long long)floor(xmn) + 1;
        if (hmx && mx < hi) hi = (long long)floor(mx);
        if (hxmx && xmx <= hi) hi = (long long)ceil(xmx) - 1;
        if (lo > hi) return sl_fail(e, "%s: no integer lies between its minimum and maximum", path);
        if (hi - lo < 256) { /* a short range: every value spelled out */
            sb_puts(body, "(");
            for (long long v = lo; v <= hi; v++) sb_printf(body, "%s\"%lld\"", v == lo ? "" : " | ", v);
            sb_puts(body, ") j-ws");
        } else {
            sb_puts(body, lo >= 0 ? "j-uinteger" : hi < 0 ? "j-ninteger" : "j-integer");
        }
        return 0;
    }
    int nonneg = (hmn && mn >= 0) || (hxmn && xmn >= 0);
    sb_puts(body, nonneg ? "j-unumber" : "j-number");
    return 0;
}

static int visit_array(sl_jsgen *b, json_t *s, const char *path, sbuf *body, sl_err *e) {
    if (json_object_get(s, "prefixItems")) return sl_fail(e, "%s.prefixItems (tuples) is not supported", path);
    json_t *items = json_object_get(s, "items");
    if (json_is_array(items)) return sl_fail(e, "%s.items as an array (tuples) is not supported", path);
    char item[48] = "j-value";
    char sub[600];
    snprintf(sub, sizeof sub, "%s.items", path);
    if (items && visit(b, items, sub, item, e)) return -1;
    long long lo = 0, hi = -1;
    int rh;
    if (get_count(s, "minItems", path, &lo, e) < 0 || (rh = get_count(s, "maxItems", path, &hi, e)) < 0) return -1;
    if (rh && hi < lo) return sl_fail(e, "%s: maxItems %lld is below minItems %lld", path, hi, lo);
    if (lo > 10000) return sl_fail(e, "%s.minItems %lld is above 10000, which cannot be enforced", path, lo);
    if (hi > 10000) hi = 10000;
    sb_puts(body, "\"[\" j-ws ");
    if (hi == 0) {
        /* nothing */
    } else if (lo == 0) {
        if (hi < 0)
            sb_printf(body, "(%s (\",\" j-ws %s)*)?", item, item);
        else
            sb_printf(body, "(%s (\",\" j-ws %s){0,%lld})?", item, item, hi - 1);
    } else if (hi < 0) {
        sb_printf(body, "%s (\",\" j-ws %s){%lld,}", item, item, lo - 1);
    } else {
        sb_printf(body, "%s (\",\" j-ws %s){%lld,%lld}", item, item, lo - 1, hi - 1);
    }
    sb_puts(body, " \"]\" j-ws");
    return 0;
}

typedef struct prop {
    char kv[48];
    int required, repeat;
} prop;

static int visit_object(sl_jsgen *b, json_t *s, const char *path, sbuf *body, sl_err *e) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
           *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return sl_fail(e, "%s.properties must be an object", path);
    if (req && !json_is_array(req)) return sl_fail(e, "%s.required must be an array of strings", path);
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return sl_fail(e, "%s.additionalProperties must be a boolean or a schema", path);
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r) if (!json_is_string(r)) return sl_fail(e, "%s.required[%zu] must be a string", path,
                                                                         i);
    if (!json_object_size(props) && (!addl || json_is_true(addl)) && !json_array_size(req)) {
        sb_puts(body, "j-object");
        return 0;
    }
    /* the properties in the schema's order, then required names it does not describe, then any others */
    size_t n = json_object_size(props) + json_array_size(req) + 1;
    prop *p = calloc(n, sizeof *p);
    if (!p) return sl_fail(e, "out of memory");
    int np = 0, rc = 0;
    const char *key;
    json_t *v;
    char sub[600];
    json_object_foreach(props, key, v) {
        int is_req = 0;
        json_array_foreach(req, i, r) is_req |= !strcmp(json_string_value(r), key);
        snprintf(sub, sizeof sub, "%s.properties.%s", path, key);
        char val[48];
        if ((rc = visit(b, v, sub, val, e))) goto done;
        sbuf kv = {0};
        json_t *k = json_string(key);
        if ((rc = literal_value(k, &kv, e))) {
            json_decref(k);
            free(kv.p);
            goto done;
        }
        json_decref(k);
        sb_printf(&kv, " \":\" j-ws %s", val);
        new_name(b, p[np].kv);
        rc = emit(b, p[np].kv, &kv, e);
        free(kv.p);
        if (rc) goto done;
        p[np++].required = is_req;
    }
    json_array_foreach(req, i, r) {
        if (json_object_get(props, json_string_value(r))) continue;
        sbuf kv = {0};
        if ((rc = literal_value(r, &kv, e))) {
            free(kv.p);
            goto done;
        }
        sb_puts(&kv, " \":\" j-ws j-value");
        new_name(b, p[np].kv);
        rc = emit(b, p[np].kv, &kv, e);
        free(kv.p);
        if (rc) goto done;
        p[np++].required = 1;
    }
    if (addl && !json_is_false(addl)) {
        char val[48] = "j-value";
        snprintf(sub, sizeof sub, "%s.additionalProperties", path);
        if (json_is_object(addl) && (rc = visit(b, addl, sub, val, e))) goto done;
        sbuf kv = {0};
        sb_printf(&kv, "j-string \":\" j-ws %s", val);
        new_name(b, p[np].kv);
        rc = emit(b, p[np].kv, &kv, e);
        free(kv.p);
        if (rc) goto done;
        p[np++].repeat = 1;
    }
    /* after_k: the entries from k on once one was written (each with its comma);
     * first_k: the entries from k on with none written yet */
    char after[48], first[48], next_after[48] = "\"\"", next_first[48] = "\"\"";
    for (int k = np - 1; k >= 0; k--) {
        sbuf a = {0}, f = {0};
        if (p[k].repeat) {
            sb_printf(&a, "(\",\" j-ws %s)*", p[k].kv);
            sb_printf(&f, "%s (\",\" j-ws %s)* | \"\"", p[k].kv, p[k].kv);
        } else if (p[k].required) {
            sb_printf(&a, "\",\" j-ws %s %s", p[k].kv, next_after);
            sb_printf(&f, "%s %s", p[k].kv, next_after);
        } else {
            sb_printf(&a, "(\",\" j-ws %s)? %s", p[k].kv, next_after);
            sb_printf(&f, "%s %s | %s", p[k].kv, next_after, next_first);
        }
        new_name(b, after);
        new_name(b, first);
        rc = emit(b, after, &a, e) || emit(b, first, &f, e) ? -1 : 0;
        free(a.p);
        free(f.p);
        if (rc) goto done;
        memcpy(next_after, after, sizeof after);
        memcpy(next_first, first, sizeof first);
    }
    sb_printf(body, "\"{\" j-ws %s \"}\" j-ws", next_first);
done:
    free(p);
    return rc;
}

static int visit_type(sl_jsgen *b, json_t *s, const char *type, const char *path, sbuf *body, sl_err *e) {
    if (!strcmp(type, "string")) return visit_string(b, s, path, body, e);
    if (!strcmp(type, "number")) return visit_number(s, 0, path, body, e);
    if (!strcmp(type, "integer")) return visit_number(s, 1, path, body, e);
    if (!strcmp(type, "boolean")) {
        sb_puts(body, "j-boolean");
        return 0;
    }
    if (!strcmp(type, "null")) {
        sb_puts(body, "j-null");
        return 0;
    }
    if (!strcmp(type, "object")) return visit_object(b, s, path, body, e);
    if (!strcmp(type, "array")) return visit_array(b, s, path, body, e);
    return sl_fail(e, "%s.type '%s' is not a JSON Schema type (string, number, integer, boolean, null, object, array)",
                   path, type);
}

/* "#/$defs/a" or "#/definitions/a" (JSON pointer escapes ~0 ~1), or "#" for the whole schema. */
static json_t *resolve_ref(json_t *root, const char *ref) {
    if (!strcmp(ref, "#")) return root;
    if (strncmp(ref, "#/", 2)) return NULL;
    json_t *cur = root;
    const char *p = ref + 2;
    while (cur && *p) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        char key[256];
        size_t k = 0;
        for (size_t i = 0; i < n && k + 1 < sizeof key; i++) {
            if (p[i] == '~' && i + 1 < n && (p[i + 1] == '0' || p[i + 1] == '1')) {
                key[k++] = p[i + 1] == '0' ? '~' : '/';
                i++;
            } else {
                key[k++] = p[i];
            }
        }
        key[k] = 0;
        cur = json_is_object(cur) ? json_object_get(cur, key) : NULL;
        p += n;
        if (*p == '/') p++;
    }
    return cur;
}

static int visit_ref(sl_jsgen *b, const char *ref, const char *path, char *out, sl_err *e) {
    for (int i = 0; i < b->n_refs; i++)
        if (!strcmp(b->refs[i].ref, ref)) {
            memcpy(out, b->refs[i].rule, 48);
            return 0;
        }
    json_t *target = resolve_ref(b->root, ref);
    if (!target)
        return sl_fail(e,
                       "%s.$ref '%s' does not resolve (only references into this schema, such as #/$defs/NAME, "
                       "are supported)",
                       path, ref);
    jsref *q = realloc(b->refs, (size_t)(b->n_refs + 1) * sizeof *q);
    if (!q) return sl_fail(e, "out of memory");
    b->refs = q;
    jsref *r = &b->refs[b->n_refs];
    if (!(r->ref = strdup(ref))) return sl_fail(e, "out of memory");
    new_name(b, r->rule);
    b->n_refs++;
    char name[48], target_rule[48];
    memcpy(name, r->rule, sizeof name);
    if (visit(b, target, ref, target_rule, e)) return -1;
    memcpy(out, name, sizeof name);
    return sl_jsgen_rule(b, name, target_rule, e);
}

static int visit_inner(sl_jsgen *b, json_t *s, const char *path, char *out, sl_err *e) {
    if (json_is_true(s) || (json_is_object(s) && !json_object_size(s))) {
        strcpy(out, "j-value");
        return 0;
    }
    if (json_is_false(s)) return sl_fail(e, "%s is false: no value can match it", path);
    if (!json_is_object(s)) return sl_fail(e, "%s must be a schema (an object or a boolean)", path);
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return sl_fail(e, "%s.$ref must be a string", path);
        return visit_ref(b, json_string_value(ref), path, out, e);
    }
    sbuf body = {0};
    char sub[600];
    int rc = 0;
    json_t *v, *type = json_object_get(s, "type");
    if ((v = json_object_get(s, "const"))) {
        rc = literal_value(v, &body, e);
    } else if ((v = json_object_get(s, "enum"))) {
        if (!json_is_array(v) || !json_array_size(v)) {
            rc = sl_fail(e, "%s.enum must be a non-empty array", path);
        } else {
            size_t i;
            json_t *x;
            sb_puts(&body, "(");
            json_array_foreach(v, i, x) {
                if (i) sb_puts(&body, " | ");
                if ((rc = literal_value(x, &body, e))) break;
            }
            sb_puts(&body, ")");
        }
    } else if ((v = json_object_get(s, "anyOf")) || (v = json_object_get(s, "oneOf"))) {
        const char *kw = json_object_get(s, "anyOf") ? "anyOf" : "oneOf";
        if (!json_is_array(v) || !json_array_size(v)) {
            rc = sl_fail(e, "%s.%s must be a non-empty array of schemas", path, kw);
        } else {
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) {
                char alt[48];
                snprintf(sub, sizeof sub, "%s.%s[%zu]", path, kw, i);
                if ((rc = visit(b, x, sub, alt, e))) break;
                sb_printf(&body, "%s%s", i ? " | " : "", alt);
            }
        }
    } else if ((v = json_object_get(s, "allOf"))) {
        if (!json_is_array(v) || json_array_size(v) != 1) {
            rc = sl_fail(e, "%s.allOf is supported with one schema only", path);
        } else {
            char one[48];
            snprintf(sub, sizeof sub, "%s.allOf[0]", path);
            if (!(rc = visit(b, json_array_get(v, 0), sub, one, e))) sb_puts(&body, one);
        }
    } else if (json_is_string(type)) {
        rc = visit_type(b, s, json_string_value(type), path, &body, e);
    } else if (json_is_array(type)) {
        size_t i;
        json_t *t;
        if (!json_array_size(type)) rc = sl_fail(e, "%s.type must not be an empty array", path);
        json_array_foreach(type, i, t) {
            if (rc) break;
            if (!json_is_string(t)) {
                rc = sl_fail(e, "%s.type[%zu] must be a string", path, i);
                break;
            }
            sbuf one = {0};
            char name[48];
            rc = visit_type(b, s, json_string_value(t), path, &one, e);
            if (!rc) {
                new_name(b, name);
                rc = emit(b, name, &one, e);
                sb_printf(&body, "%s%s", i ? " | " : "", name);
            }
            free(one.p);
        }
    } else if (type) {
        rc = sl_fail(e, "%s.type must be a string or an array of strings", path);
    } else if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
               json_object_get(s, "required")) {
        rc = visit_type(b, s, "object", path, &body, e);
    } else if (json_object_get(s, "items")) {
        rc = visit_type(b, s, "array", path, &body, e);
    } else if (json_object_get(s, "pattern") || json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
               json_object_get(s, "format")) {
        rc = visit_type(b, s, "string", path, &body, e);
    } else {
        sb_puts(&body, "j-value");
    }
    if (!rc) {
        new_name(b, out);
        rc = emit(b, out, &body, e);
    }
    free(body.p);
    return rc;
}

static int visit(sl_jsgen *b, json_t *s, const char *path, char *out, sl_err *e) {
    if (++b->depth > 128) {
        b->depth--;
        return sl_fail(e, "%s: the schema is nested too deeply", path);
    }
    int rc = visit_inner(b, s, path, out, e);
    b->depth--;
    return rc;
}

int sl_jsgen_add(sl_jsgen *b, json_t *schema, const char *where, char *rule, size_t size, sl_err *e) {
    char name[48] = "j-object";
    b->n_schemas++;
    b->counter = 0;
    b->root = schema;
    clear_refs(b);
    if (schema && visit(b, schema, where, name, e)) return -1;
    clear_refs(b);
    snprintf(rule, size, "%s", name);
    return b->text.oom ? sl_fail(e, "out of memory") : 0;
}

int sl_json_schema_grammar(json_t *schema, const char *where, sl_grammar **out, sl_err *e) {
    *out = NULL;
    sl_jsgen *b = sl_jsgen_new();
    if (!b) return sl_fail(e, "out of memory");
    char rule[48];
    int rc = sl_jsgen_add(b, schema, where, rule, sizeof rule, e);
    if (!rc) rc = sl_jsgen_rule(b, "root", rule, e);
    if (!rc) {
        const char *t = sl_jsgen_text(b);
        if (sl_grammar_parse(t, strlen(t), out, e)) rc = sl_wrap(e, "%s: the grammar made from it", where);
    }
    sl_jsgen_free(b);
    return rc;
}
