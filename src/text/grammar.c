#include "text/grammar.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- compiled form */

enum { GE_END, GE_ALT, GE_REF, GE_CHAR };

typedef struct gelem {
    uint32_t type : 2, v : 30; /* GE_REF: rule id; GE_CHAR: class id */
} gelem;

typedef struct gclass {
    uint32_t off, n; /* ranges[off .. off+n) as [lo, hi] pairs */
    int neg;
    uint64_t ascii[2]; /* membership of code points 0..127, precomputed */
} gclass;

typedef struct grule {
    char *name;
    int defined, generated, line;
    uint32_t start; /* first element in the flat array */
    gelem *body;    /* while parsing */
    size_t n, cap;
} grule;

struct sl_grammar {
    gelem *el;
    size_t n_el;
    grule *rules;
    int n_rules, cap_rules;
    uint32_t *ranges;
    size_t n_ranges, cap_ranges;
    gclass *classes;
    size_t n_classes, cap_classes;
    int root;
};

#define MAX_REPEAT 10000
#define MAX_ELEMS (1u << 24)

static int grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * size);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int class_has(const sl_grammar *g, const gclass *c, uint32_t cp) {
    if (cp < 128) return (int)((c->ascii[cp >> 6] >> (cp & 63)) & 1);
    int in = 0;
    for (uint32_t i = 0; i < c->n && !in; i++)
        in = cp >= g->ranges[2 * (c->off + i)] && cp <= g->ranges[2 * (c->off + i) + 1];
    return in != c->neg;
}

/* Whether any code point in [lo, hi] is in the class. */
static int class_meets(const sl_grammar *g, const gclass *c, uint32_t lo, uint32_t hi) {
    if (!c->neg) {
        for (uint32_t i = 0; i < c->n; i++)
            if (g->ranges[2 * (c->off + i)] <= hi && g->ranges[2 * (c->off + i) + 1] >= lo) return 1;
        return 0;
    }
    /* negated: some point of [lo, hi] escapes every range; walk the candidates lo and each range's hi+1 */
    uint32_t cand = lo;
    for (int moved = 1; moved && cand <= hi;) {
        moved = 0;
        for (uint32_t i = 0; i < c->n; i++) {
            uint32_t a = g->ranges[2 * (c->off + i)], b = g->ranges[2 * (c->off + i) + 1];
            if (cand >= a && cand <= b) {
                if (b >= hi) return 0;
                cand = b + 1;
                moved = 1;
            }
        }
    }
    return cand <= hi;
}

void sl_grammar_free(sl_grammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n_rules; i++) {
        free(g->rules[i].name);
        free(g->rules[i].body);
    }
    free(g->rules);
    free(g->el);
    free(g->ranges);
    free(g->classes);
    free(g);
}

/* ---------------------------------------------------------------- parser */

typedef struct gparser {
    sl_grammar *g;
    const char *s, *end, *p;
    int line;
    sl_err *e;
} gparser;

static int perr(gparser *P, const char *fmt, const char *a) {
    char what[256];
    snprintf(what, sizeof what, fmt, a ? a : "");
    return sl_fail(P->e, "grammar line %d: %s", P->line, what);
}

static int new_rule(gparser *P, const char *name, size_t n, int generated) {
    sl_grammar *g = P->g;
    size_t cap = (size_t)g->cap_rules;
    if (grow((void **)&g->rules, &cap, (size_t)g->n_rules + 1, sizeof *g->rules)) return sl_fail(P->e, "out of memory");
    g->cap_rules = (int)cap;
    grule *r = &g->rules[g->n_rules];
    memset(r, 0, sizeof *r);
    if (!(r->name = strndup(name, n))) return sl_fail(P->e, "out of memory");
    r->generated = generated;
    r->line = P->line;
    return g->n_rules++;
}

static int rule_id(gparser *P, const char *name, size_t n) {
    for (int i = 0; i < P->g->n_rules; i++)
        if (!P->g->rules[i].generated && strlen(P->g->rules[i].name) == n && !memcmp(P->g->rules[i].name, name, n))
            return i;
    return new_rule(P, name, n, 0);
}

/* A rule made for a group or a repetition, named after the rule it appears in (for messages). */
static int sub_rule(gparser *P, int parent) {
    char name[160];
    snprintf(name, sizeof name, "%s-%d", P->g->rules[parent].name, P->g->n_rules);
    int r = new_rule(P, name, strlen(name), 1);
    if (r >= 0) P->g->rules[r].defined = 1;
    return r;
}

static int push(gparser *P, int rule, int type, uint32_t v) {
    grule *r = &P->g->rules[rule];
    if (r->n >= MAX_ELEMS) return perr(P, "the grammar is too large", NULL);
    if (grow((void **)&r->body, &r->cap, r->n + 1, sizeof *r->body)) return sl_fail(P->e, "out of memory");
    r->body[r->n++] = (gelem){.type = (uint32_t)type, .v = v};
    return 0;
}

/* A class from n [lo, hi] pairs. */
static int add_class(gparser *P, const uint32_t *rg, size_t n, int neg, uint32_t *id) {
    sl_grammar *g = P->g;
    if (grow((void **)&g->ranges, &g->cap_ranges, 2 * (g->n_ranges + n), sizeof *g->ranges) ||
        grow((void **)&g->classes, &g->cap_classes, g->n_classes + 1, sizeof *g->classes))
        return sl_fail(P->e, "out of memory");
    gclass c = {.off = (uint32_t)g->n_ranges, .n = (uint32_t)n, .neg = neg};
    if (n) memcpy(g->ranges + 2 * g->n_ranges, rg, 2 * n * sizeof *rg);
    g->n_ranges += n;
    for (uint32_t cp = 0; cp < 128; cp++) {
        int in = 0;
        for (size_t i = 0; i < n && !in; i++) in = cp >= rg[2 * i] && cp <= rg[2 * i + 1];
        if (in != neg) c.ascii[cp >> 6] |= 1ull << (cp & 63);
    }
    *id = (uint32_t)g->n_classes;
    g->classes[g->n_classes++] = c;
    return 0;
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments; newlines too when nl. */
static void skip_space(gparser *P, int nl) {
    while (P->p < P->end) {
        char c = *P->p;
        if (c == ' ' || c == '\t' || c == '\r') {
            P->p++;
        } else if (c == '#') {
            while (P->p < P->end && *P->p != '\n') P->p++;
        } else if (c == '\n' && nl) {
            P->line++;
            P->p++;
        } else {
            break;
        }
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes one UTF-8 code point; 0 bytes when invalid. */
static int utf8_decode(const unsigned char *s, const unsigned char *end, uint32_t *cp) {
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || s + n > end) return 0;
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return n;
}

/* One character of a literal or class, with escapes. */
static int parse_char(gparser *P, uint32_t *cp) {
    if (P->p >= P->end) return perr(P, "unexpected end of the grammar", NULL);
    if (*P->p == '\n') return perr(P, "unexpected end of line inside a literal or class", NULL);
    if (*P->p != '\\') {
        int n = utf8_decode((const unsigned char *)P->p, (const unsigned char *)P->end, cp);
        if (!n) return perr(P, "invalid UTF-8", NULL);
        P->p += n;
        return 0;
    }
    if (P->p + 1 >= P->end) return perr(P, "unexpected end after '\\'", NULL);
    char c = P->p[1];
    P->p += 2;
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = P->p < P->end ? hexval(*P->p) : -1;
            if (h < 0) {
                char esc[4] = {'\\', c, 0};
                return perr(P, "escape %s needs hexadecimal digits", esc);
            }
            v = v << 4 | (uint32_t)h;
            P->p++;
        }
        if (v > 0x10FFFF) return perr(P, "escape beyond U+10FFFF", NULL);
        *cp = v;
        return 0;
    }
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '^':
    case '/': *cp = (uint32_t)c; return 0;
    default: {
        char esc[3] = {'\\', c, 0};
        return perr(P, "unknown escape %s", esc);
    }
    }
}

static int parse_alternates(gparser *P, int rule, int nested);

/* Moves the atom at body[at..] of rule into its own rule, leaving one reference in its place. */
static int wrap_atom(gparser *P, int rule, size_t at) {
    grule *r = &P->g->rules[rule];
    if (r->n - at == 1) return 0;
    int w = sub_rule(P, rule);
    if (w < 0) return -1;
    r = &P->g->rules[rule];
    for (size_t i = at; i < r->n; i++)
        if (push(P, w, r->body[i].type, r->body[i].v)) return -1;
    r = &P->g->rules[rule];
    r->n = at;
    return push(P, rule, GE_REF, (uint32_t)w);
}

/* rule ::= x rule | (empty), returns its id */
static int star_rule(gparser *P, int parent, gelem x) {
    int s = sub_rule(P, parent);
    if (s < 0 || push(P, s, x.type, x.v) || push(P, s, GE_REF, (uint32_t)s) || push(P, s, GE_ALT, 0)) return -1;
    return s;
}

static int parse_count(gparser *P, long *v) {
    if (P->p >= P->end || *P->p < '0' || *P->p > '9') return perr(P, "expected a number in {m,n}", NULL);
    long n = 0;
    while (P->p < P->end && *P->p >= '0' && *P->p <= '9') {
        n = n * 10 + (*P->p++ - '0');
        if (n > MAX_REPEAT)
            return perr(P,
                        "repetition count above "
                        "10000",
                        NULL);
    }
    *v = n;
    return 0;
}

/* Applies the repetition operator at P->p to the atom at body[at..]. */
static int repeat(gparser *P, int rule, size_t at) {
    char op = *P->p++;
    long lo = 0, hi = -1; /* hi -1: unbounded */
    if (op == '*') {
        lo = 0;
    } else if (op == '+') {
        lo = 1;
    } else if (op == '?') {
        hi = 1;
    } else {
        skip_space(P, 0);
        if (parse_count(P, &lo)) return -1;
        skip_space(P, 0);
        if (P->p < P->end && *P->p == ',') {
            P->p++;
            skip_space(P, 0);
            if (P->p < P->end && *P->p != '}' && parse_count(P, &hi)) return -1;
            skip_space(P, 0);
        } else {
            hi = lo;
        }
        if (P->p >= P->end || *P->p != '}') return perr(P, "expected '}' after {m,n}", NULL);
        P->p++;
        if (hi >= 0 && hi < lo) return perr(P, "{m,n} with n < m", NULL);
    }
    if (wrap_atom(P, rule, at)) return -1;
    grule *r = &P->g->rules[rule];
    gelem x = r->body[at];
    r->n = at;
    for (long i = 0; i < lo; i++)
        if (push(P, rule, x.type, x.v)) return -1;
    if (hi < 0) {
        int s = star_rule(P, rule, x);
        return s < 0 ? -1 : push(P, rule, GE_REF, (uint32_t)s);
    }
    /* up to hi - lo more: opt_k ::= x opt_{k-1} | (empty) */
    int prev = -1;
    for (long k = 0; k < hi - lo; k++) {
        int o = sub_rule(P, rule);
        if (o < 0 || push(P, o, x.type, x.v)) return -1;
        if (prev >= 0 && push(P, o, GE_REF, (uint32_t)prev)) return -1;
        if (push(P, o, GE_ALT, 0)) return -1;
        prev = o;
    }
    return prev >= 0 ? push(P, rule, GE_REF, (uint32_t)prev) : 0;
}

static int parse_class(gparser *P, uint32_t *id) {
    int neg = 0;
    if (P->p < P->end && *P->p == '^') {
        neg = 1;
        P->p++;
    }
    uint32_t *rg = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    while (!rc) {
        if (P->p >= P->end) {
            rc = perr(P, "unterminated character class (expected ']')", NULL);
            break;
        }
        if (*P->p == ']') {
            P->p++;
            break;
        }
        uint32_t a, b;
        if ((rc = parse_char(P, &a))) break;
        b = a;
        if (P->p + 1 < P->end && *P->p == '-' && P->p[1] != ']') {
            P->p++;
            if ((rc = parse_char(P, &b))) break;
            if (b < a) {
                rc = perr(P, "character range with its end before its start", NULL);
                break;
            }
        }
        if (grow((void **)&rg, &cap, 2 * (n + 1), sizeof *rg)) {
            rc = sl_fail(P->e, "out of memory");
            break;
        }
        rg[2 * n] = a;
        rg[2 * n + 1] = b;
        n++;
    }
    if (!rc && !n && !neg) rc = perr(P, "empty character class []", NULL);
    if (!rc) rc = add_class(P, rg, n, neg, id);
    free(rg);
    return rc;
}

static int parse_sequence(gparser *P, int rule, int nested) {
    size_t last = (size_t)-1; /* start of the last atom in the body, for repetition */
    for (;;) {
        if (P->p >= P->end) return 0;
        char c = *P->p;
        size_t at = P->g->rules[rule].n;
        if (c == '"') {
            P->p++;
            while (P->p < P->end && *P->p != '"') {
                uint32_t cp, id;
                if (parse_char(P, &cp)) return -1;
                uint32_t rg[2] = {cp, cp};
                if (add_class(P, rg, 1, 0, &id) || push(P, rule, GE_CHAR, id)) return -1;
            }
            if (P->p >= P->end) return perr(P, "unterminated string literal (expected '\"')", NULL);
            P->p++;
            last = at;
        } else if (c == '[') {
            P->p++;
            uint32_t id;
            if (parse_class(P, &id) || push(P, rule, GE_CHAR, id)) return -1;
            last = at;
        } else if (c == '.') {
            P->p++;
            uint32_t id;
            if (add_class(P, NULL, 0, 1, &id) || push(P, rule, GE_CHAR, id)) return -1;
            last = at;
        } else if (is_name_char(c)) {
            const char *n0 = P->p;
            while (P->p < P->end && is_name_char(*P->p)) P->p++;
            int r = rule_id(P, n0, (size_t)(P->p - n0));
            if (r < 0 || push(P, rule, GE_REF, (uint32_t)r)) return -1;
            last = at;
        } else if (c == '(') {
            P->p++;
            skip_space(P, 1);
            int s = sub_rule(P, rule);
            if (s < 0 || parse_alternates(P, s, 1)) return -1;
            if (P->p >= P->end || *P->p != ')') return perr(P, "expected ')' to close a group", NULL);
            P->p++;
            if (push(P, rule, GE_REF, (uint32_t)s)) return -1;
            last = at;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == (size_t)-1) {
                char op[2] = {c, 0};
                return perr(P, "'%s' has nothing before it to repeat", op);
            }
            if (repeat(P, rule, last)) return -1;
            last = (size_t)-1;
        } else {
            return 0;
        }
        skip_space(P, nested);
    }
}

static int parse_alternates(gparser *P, int rule, int nested) {
    if (parse_sequence(P, rule, nested)) return -1;
    for (;;) {
        /* `|` may also start the next line of a top-level rule */
        const char *save = P->p;
        int line = P->line;
        skip_space(P, 1);
        if (P->p >= P->end || *P->p != '|') {
            P->p = save;
            P->line = line;
            return 0;
        }
        P->p++;
        if (push(P, rule, GE_ALT, 0)) return -1;
        skip_space(P, 1);
        if (parse_sequence(P, rule, nested)) return -1;
    }
}

/* Nullable rules, then a walk over the leftmost references: a cycle there would loop the recogniser. */
static int check_left_recursion(sl_grammar *g, sl_err *e) {
    size_t n = (size_t)(unsigned)g->n_rules;
    int rc = 0;
    char *nullable = calloc(n, 1), *color = calloc(n, 1);
    int *stack = malloc(n * 2 * sizeof *stack);
    if (!nullable || !color || !stack) {
        rc = sl_fail(e, "out of memory");
        goto done;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; (size_t)r < n; r++) {
            if (nullable[r]) continue;
            int all = 1;
            for (uint32_t i = g->rules[r].start;; i++) {
                gelem x = g->el[i];
                if (x.type == GE_END || x.type == GE_ALT) {
                    if (all) {
                        nullable[r] = 1;
                        changed = 1;
                        break;
                    }
                    if (x.type == GE_END) break;
                    all = 1;
                } else if (x.type == GE_CHAR || !nullable[x.v]) {
                    all = 0;
                }
            }
        }
    }
    /* iterative DFS: stack of (rule, element index) */
    for (int r0 = 0; (size_t)r0 < n && !rc; r0++) {
        if (color[r0]) continue;
        int sp = 0;
        stack[sp++] = r0;
        stack[sp++] = (int)g->rules[r0].start;
        color[r0] = 1;
        while (sp && !rc) {
            int r = stack[sp - 2];
            uint32_t i = (uint32_t)stack[sp - 1];
            gelem x = g->el[i];
            if (x.type == GE_END) {
                color[r] = 2;
                sp -= 2;
                continue;
            }
            /* next position to visit in r: skip to the next alternative unless x is a nullable ref */
            uint32_t nx = i + 1;
            if (x.type == GE_CHAR || (x.type == GE_REF && !nullable[x.v]))
                while (g->el[nx].type != GE_END && g->el[nx].type != GE_ALT) nx++;
            stack[sp - 1] = (int)nx;
            if (x.type != GE_REF) continue;
            if (color[x.v] == 1) {
                const grule *q = &g->rules[x.v];
                rc = q->generated ? sl_fail(e,
                                            "grammar line %d: a repetition or group in rule '%.100s' can match the "
                                            "empty string over and over, or recurses before matching anything",
                                            q->line, q->name)
                                  : sl_fail(e,
                                            "grammar line %d: rule '%.100s' is left-recursive (it can reach itself "
                                            "before matching any character); rewrite it with repetition",
                                            q->line, q->name);
            } else if (!color[x.v]) {
                color[x.v] = 1;
                stack[sp++] = (int)x.v;
                stack[sp++] = (int)g->rules[x.v].start;
            }
        }
    }
done:
    free(nullable);
    free(color);
    free(stack);
    return rc;
}

int sl_grammar_parse(const char *src, size_t len, sl_grammar **out, sl_err *e) {
    *out = NULL;
    sl_grammar *g = calloc(1, sizeof *g);
    if (!g) return sl_fail(e, "out of memory");
    gparser P = {.g = g, .s = src, .end = src + len, .p = src, .line = 1, .e = e};
    int rc = 0;
    for (;;) {
        skip_space(&P, 1);
        if (P.p >= P.end) break;
        const char *n0 = P.p;
        while (P.p < P.end && is_name_char(*P.p)) P.p++;
        if (P.p == n0) {
            char got[2] = {*P.p, 0};
            rc = perr(&P, "expected a rule name, got '%s'", got);
            break;
        }
        int r = rule_id(&P, n0, (size_t)(P.p - n0));
        if (r < 0) {
            rc = -1;
            break;
        }
        if (g->rules[r].defined) {
            rc = perr(&P, "rule '%s' is defined twice", g->rules[r].name);
            break;
        }
        g->rules[r].defined = 1;
        g->rules[r].line = P.line;
        skip_space(&P, 0);
        if (P.end - P.p < 3 || memcmp(P.p, "::=", 3)) {
            rc = perr(&P, "expected '::=' after rule name '%s'", g->rules[r].name);
            break;
        }
        P.p += 3;
        skip_space(&P, 1);
        if ((rc = parse_alternates(&P, r, 0))) break;
        skip_space(&P, 0);
        if (P.p < P.end && *P.p != '\n') {
            char got[8] = {0};
            memcpy(got, P.p, P.end - P.p < 4 ? (size_t)(P.end - P.p) : 4);
            for (char *q = got; *q; q++)
                if (*q == '\n') *q = 0;
            rc = perr(&P, "unexpected '%s' in a rule body", got);
            break;
        }
    }
    if (!rc) {
        g->root = -1;
        for (int i = 0; i < g->n_rules && !rc; i++) {
            if (!g->rules[i].defined)
                rc = sl_fail(e, "grammar: rule '%.200s' is used but never defined", g->rules[i].name);
            if (!g->rules[i].generated && !strcmp(g->rules[i].name, "root")) g->root = i;
        }
        if (!rc && g->root < 0) rc = sl_fail(e, "grammar: no 'root' rule (the rule generation starts from)");
    }
    /* flatten: each rule's alternatives, then GE_END */
    size_t total = 0;
    for (int i = 0; !rc && i < g->n_rules; i++) total += g->rules[i].n + 1;
    if (!rc && !(g->el = malloc((total ? total : 1) * sizeof *g->el))) rc = sl_fail(e, "out of memory");
    for (int i = 0; !rc && i < g->n_rules; i++) {
        grule *r = &g->rules[i];
        r->start = (uint32_t)g->n_el;
        memcpy(g->el + g->n_el, r->body, r->n * sizeof *r->body);
        g->n_el += r->n;
        g->el[g->n_el++] = (gelem){.type = GE_END};
        free(r->body);
        r->body = NULL;
        r->n = r->cap = 0;
    }
    if (!rc) rc = check_left_recursion(g, e);
    if (rc) {
        sl_grammar_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

/* ---------------------------------------------------------------- recogniser */

/* An immutable stack of grammar positions; the top is the element to match next. Stacks share tails. */
typedef struct gnode {
    uint32_t pos, hash;
    const struct gnode *next;
} gnode;

/* Bump allocator with marks: the mask walk releases everything a subtree allocated. */
#define ARENA_BLOCK (1u << 20)
typedef struct arena {
    char **blocks;
    int n_blocks, cur;
    size_t used;
} arena;
typedef struct amark {
    int cur;
    size_t used;
} amark;

static void *aalloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n > ARENA_BLOCK) return NULL;
    if (a->n_blocks == 0 || a->used + n > ARENA_BLOCK) {
        if (a->n_blocks && a->cur + 1 < a->n_blocks) {
            a->cur++;
        } else {
            char **b = realloc(a->blocks, (size_t)(a->n_blocks + 1) * sizeof *b);
            if (!b) return NULL;
            a->blocks = b;
            if (!(b[a->n_blocks] = malloc(ARENA_BLOCK))) return NULL;
            a->cur = a->n_blocks++;
        }
        a->used = 0;
    }
    void *p = a->blocks[a->cur] + a->used;
    a->used += n;
    return p;
}

static amark amark_get(const arena *a) {
    return (amark){a->cur, a->used};
}

static void arelease(arena *a, amark m) {
    a->cur = m.cur;
    a->used = m.used;
}

static void afree(arena *a) {
    for (int i = 0; i < a->n_blocks; i++) free(a->blocks[i]);
    free(a->blocks);
    memset(a, 0, sizeof *a);
}

/* A set of stacks and a pending partial UTF-8 character. */
typedef struct gstate {
    const gnode **v;
    int n;
    uint8_t accept; /* an empty stack: the input so far is a complete sentence */
    uint8_t need;   /* continuation bytes still to come */
    uint8_t len;    /* length of the pending character in bytes */
    uint32_t pcp;   /* the bits of the pending character so far */
} gstate;

typedef struct gmatch {
    const sl_grammar *g;
    arena ar;
    const gnode **scratch; /* the set under construction */
    int n, accept, work;
    int failed;
    sl_err *e;
} gmatch;

static uint32_t mix(uint32_t pos, uint32_t h) {
    uint64_t z = ((uint64_t)pos << 32 | h) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(z >> 29) ^ (uint32_t)z;
}

static const gnode *mknode(gmatch *m, uint32_t pos, const gnode *next) {
    gnode *n = aalloc(&m->ar, sizeof *n);
    if (!n) return NULL;
    n->pos = pos;
    n->next = next;
    n->hash = mix(pos, next ? next->hash : 0x51u);
    return n;
}

static int same_stack(const gnode *a, const gnode *b) {
    for (; a != b; a = a->next, b = b->next)
        if (!a || !b || a->hash != b->hash || a->pos != b->pos) return 0;
    return 1;
}

#define MAX_WORK (1 << 18)

static int too_ambiguous(gmatch *m) {
    if (!m->failed)
        sl_fail(m->e,
                "the grammar is too ambiguous: more than %d ways to read the text at once (simplify overlapping "
                "alternatives or repetitions)",
                SL_GRAMMAR_MAX_STACKS);
    m->failed = 1;
    return -1;
}

/* Adds every stack that `s` expands to (top at a character class, or empty) to the scratch set. */
static int expand(gmatch *m, const gnode *s) {
    if (++m->work > MAX_WORK) return too_ambiguous(m);
    if (!s) {
        m->accept = 1;
        return 0;
    }
    const sl_grammar *g = m->g;
    gelem x = g->el[s->pos];
    if (x.type == GE_END || x.type == GE_ALT) return expand(m, s->next);
    if (x.type == GE_CHAR) {
        for (int i = 0; i < m->n; i++)
            if (same_stack(m->scratch[i], s)) return 0;
        if (m->n >= SL_GRAMMAR_MAX_STACKS) return too_ambiguous(m);
        m->scratch[m->n++] = s;
        return 0;
    }
    /* a reference: continue after it once the rule is done; a reference last in its alternative
     * returns straight to the caller, so right recursion does not deepen the stack */
    gelem after = g->el[s->pos + 1];
    const gnode *cont = s->next;
    if (after.type != GE_END && after.type != GE_ALT && !(cont = mknode(m, s->pos + 1, s->next))) goto oom;
    uint32_t i = g->rules[x.v].start;
    for (;;) {
        gelem y = g->el[i];
        if (y.type == GE_END || y.type == GE_ALT) {
            if (expand(m, cont)) return -1;
        } else {
            const gnode *t = mknode(m, i, cont);
            if (!t) goto oom;
            if (expand(m, t)) return -1;
        }
        while (g->el[i].type != GE_END && g->el[i].type != GE_ALT) i++;
        if (g->el[i].type == GE_END) break;
        i++;
    }
    return 0;
oom:
    m->failed = 1;
    return sl_fail(m->e, "out of memory");
}

/* The scratch set becomes a state in the arena. */
static int seal(gmatch *m, gstate *out) {
    memset(out, 0, sizeof *out);
    out->accept = (uint8_t)m->accept;
    out->n = m->n;
    if (m->n) {
        const gnode **v = aalloc(&m->ar, (size_t)m->n * sizeof *v);
        if (!v) {
            m->failed = 1;
            return sl_fail(m->e, "out of memory");
        }
        memcpy(v, m->scratch, (size_t)m->n * sizeof *v);
        out->v = v;
    }
    return 0;
}

static void begin_set(gmatch *m) {
    m->n = 0;
    m->accept = 0;
    m->work = 0;
}

static int advance_cp(gmatch *m, const gstate *st, uint32_t cp, gstate *out) {
    const sl_grammar *g = m->g;
    begin_set(m);
    for (int i = 0; i < st->n; i++) {
        const gnode *s = st->v[i];
        if (!class_has(g, &g->classes[g->el[s->pos].v], cp)) continue;
        gelem after = g->el[s->pos + 1];
        const gnode *t = s->next;
        if (after.type != GE_END && after.type != GE_ALT && !(t = mknode(m, s->pos + 1, s->next))) {
            m->failed = 1;
            return sl_fail(m->e, "out of memory");
        }
        if (expand(m, t)) return -1;
    }
    return seal(m, out);
}

/* Advances st over one byte into out (empty when the byte cannot come next). */
static int advance_byte(gmatch *m, const gstate *st, uint8_t b, gstate *out) {
    memset(out, 0, sizeof *out);
    /* the smallest and largest code point of each UTF-8 length: shorter (overlong) forms, surrogates and
     * points past U+10FFFF are not characters */
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}, max_cp[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    uint32_t pcp;
    int need, len;
    if (st->need) {
        if ((b & 0xC0) != 0x80) return 0;
        pcp = st->pcp << 6 | (b & 0x3Fu);
        need = st->need - 1;
        len = st->len;
        if (!need) {
            if (pcp < min_cp[len] || pcp > max_cp[len] || (pcp >= 0xD800 && pcp <= 0xDFFF)) return 0;
            return advance_cp(m, st, pcp, out);
        }
    } else if (b < 0x80) {
        return advance_cp(m, st, b, out);
    } else if ((b & 0xE0) == 0xC0) {
        pcp = b & 0x1Fu;
        need = 1;
        len = 2;
    } else if ((b & 0xF0) == 0xE0) {
        pcp = b & 0x0Fu;
        need = 2;
        len = 3;
    } else if ((b & 0xF8) == 0xF0) {
        pcp = b & 0x07u;
        need = 3;
        len = 4;
    } else {
        return 0;
    }
    /* mid-character: keep the stacks whose class some completion of it could still match */
    uint32_t lo = pcp << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
    if (lo < min_cp[len]) lo = min_cp[len];
    if (hi > max_cp[len]) hi = max_cp[len];
    if (lo > hi) return 0;
    /* the parts of [lo, hi] outside the surrogates */
    uint32_t alo = lo, ahi = hi < 0xD800 ? hi : 0xD7FF, blo = lo > 0xE000 ? lo : 0xE000, bhi = hi;
    const sl_grammar *g = m->g;
    for (int i = 0; i < st->n; i++) {
        const gclass *c = &g->classes[g->el[st->v[i]->pos].v];
        if ((alo <= ahi && class_meets(g, c, alo, ahi)) || (blo <= bhi && class_meets(g, c, blo, bhi))) {
            *out = *st;
            out->accept = 0;
            out->need = (uint8_t)need;
            out->len = (uint8_t)len;
            out->pcp = pcp;
            return 0;
        }
    }
    return 0;
}

static int live(const gstate *s) {
    return s->n > 0 || (s->accept && !s->need);
}

static int gmatch_init(gmatch *m, const sl_grammar *g, sl_err *e, gstate *start) {
    memset(m, 0, sizeof *m);
    m->g = g;
    m->e = e;
    if (!(m->scratch = malloc(SL_GRAMMAR_MAX_STACKS * sizeof *m->scratch))) return sl_fail(e, "out of memory");
    begin_set(m);
    /* the root's alternatives, as if referenced from an empty stack */
    uint32_t i = g->rules[g->root].start;
    for (;;) {
        gelem y = g->el[i];
        if (y.type == GE_END || y.type == GE_ALT) {
            if (expand(m, NULL)) return -1;
        } else {
            const gnode *t = mknode(m, i, NULL);
            if (!t || expand(m, t)) return t ? -1 : sl_fail(e, "out of memory");
        }
        while (g->el[i].type != GE_END && g->el[i].type != GE_ALT) i++;
        if (g->el[i].type == GE_END) break;
        i++;
    }
    return seal(m, start);
}

static void gmatch_free(gmatch *m) {
    afree(&m->ar);
    free(m->scratch);
}

int sl_grammar_match(const sl_grammar *g, const char *s, size_t n, sl_err *e) {
    gmatch m;
    gstate st, nx;
    int rc = gmatch_init(&m, g, e, &st);
    for (size_t i = 0; !rc && i < n; i++) {
        if (advance_byte(&m, &st, (uint8_t)s[i], &nx)) {
            rc = -1;
            break;
        }
        st = nx;
        if (!live(&st)) break;
    }
    if (!rc) rc = st.accept && !st.need && live(&st);
    gmatch_free(&m);
    return rc;
}

/* ---------------------------------------------------------------- vocabulary trie */

typedef struct tnode {
    uint32_t child;   /* first child (children are contiguous) */
    uint32_t n_child; /* number of children */
    uint32_t tok;     /* first id in ids[] of the tokens that end here */
    uint32_t n_tok;
    uint8_t byte;
} tnode;

struct sl_gvocab {
    int n_vocab;
    tnode *nodes;
    size_t n_nodes, cap_nodes;
    int32_t *ids; /* token ids in byte order */
    int n_ids;
    uint8_t *eos; /* n_vocab: end-of-generation */
    const sl_tokenizer *tok;
    uint8_t *usable; /* n_vocab: in the trie */
};

typedef struct tok_ref {
    const uint8_t *b;
    size_t n;
    int32_t id;
} tok_ref;

static int cmp_tok(const void *pa, const void *pb) {
    const tok_ref *a = pa, *b = pb;
    size_t n = a->n < b->n ? a->n : b->n;
    int c = memcmp(a->b, b->b, n);
    if (c) return c;
    return a->n < b->n ? -1 : a->n > b->n ? 1 : (a->id > b->id) - (a->id < b->id);
}

/* Fills node `at` (tokens t[lo, hi) share their first d bytes) and builds its subtree. */
static int build_trie(sl_gvocab *v, const tok_ref *t, int lo, int hi, size_t d, size_t at) {
    int i = lo;
    while (i < hi && t[i].n == d) i++;
    v->nodes[at].tok = (uint32_t)lo;
    v->nodes[at].n_tok = (uint32_t)(i - lo);
    int nc = 0;
    for (int k = i; k < hi;) {
        uint8_t b = t[k].b[d];
        while (k < hi && t[k].b[d] == b) k++;
        nc++;
    }
    if (grow((void **)&v->nodes, &v->cap_nodes, v->n_nodes + (size_t)nc, sizeof *v->nodes)) return -1;
    size_t first = v->n_nodes;
    v->n_nodes += (size_t)nc;
    v->nodes[at].child = (uint32_t)first;
    v->nodes[at].n_child = (uint32_t)nc;
    for (int k = i, c = 0; k < hi; c++) {
        uint8_t b = t[k].b[d];
        int k0 = k;
        while (k < hi && t[k].b[d] == b) k++;
        memset(&v->nodes[first + c], 0, sizeof(tnode));
        v->nodes[first + c].byte = b;
        if (build_trie(v, t, k0, k, d + 1, first + (size_t)c)) return -1;
    }
    return 0;
}

void sl_gvocab_free(sl_gvocab *v) {
    if (!v) return;
    free(v->nodes);
    free(v->ids);
    free(v->eos);
    free(v->usable);
    free(v);
}

int sl_gvocab_create(const sl_tokenizer *tok, int n_vocab, sl_gvocab **out, sl_err *e) {
    *out = NULL;
    if (n_vocab <= 0) return sl_fail(e, "grammar: the vocabulary is empty");
    sl_gvocab *v = calloc(1, sizeof *v);
    tok_ref *t = malloc((size_t)n_vocab * sizeof *t);
    if (!v || !t || !(v->eos = calloc((size_t)n_vocab, 1)) || !(v->usable = calloc((size_t)n_vocab, 1))) goto oom;
    v->n_vocab = n_vocab;
    v->tok = tok;
    const int32_t *eos;
    int n_eos = sl_tokenizer_eos_ids(tok, &eos);
    for (int i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && eos[i] < n_vocab) v->eos[eos[i]] = 1;
    int n = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        size_t len = 0;
        const char *b = sl_tokenizer_token_bytes(tok, id, &len);
        if (!b || !len || v->eos[id] || sl_tokenizer_is_special(tok, id)) continue;
        t[n++] = (tok_ref){(const uint8_t *)b, len, id};
        v->usable[id] = 1;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_tok);
    if (!(v->ids = malloc((size_t)(n ? n : 1) * sizeof *v->ids))) goto oom;
    for (int i = 0; i < n; i++) v->ids[i] = t[i].id;
    v->n_ids = n;
    if (grow((void **)&v->nodes, &v->cap_nodes, 1, sizeof *v->nodes)) goto oom;
    memset(v->nodes, 0, sizeof *v->nodes);
    v->n_nodes = 1;
    if (build_trie(v, t, 0, n, 0, 0)) goto oom;
    free(t);
    *out = v;
    return 0;
oom:
    free(t);
    sl_gvocab_free(v);
    return sl_fail(e, "out of memory");
}

/* ---------------------------------------------------------------- constraint */

struct sl_gconstraint {
    const sl_grammar *g;
    const sl_gvocab *v;
    gmatch m;
    gstate st; /* the current state, below the arena mark `base` */
    amark base;
    sl_err err;
};

void sl_gconstraint_free(sl_gconstraint *c) {
    if (!c) return;
    gmatch_free(&c->m);
    free(c);
}

int sl_gconstraint_init(const sl_grammar *g, const sl_gvocab *v, sl_gconstraint **out, sl_err *e) {
    *out = NULL;
    sl_gconstraint *c = calloc(1, sizeof *c);
    if (!c) return sl_fail(e, "out of memory");
    c->g = g;
    c->v = v;
    if (gmatch_init(&c->m, g, e, &c->st)) {
        sl_gconstraint_free(c);
        return -1;
    }
    c->base = amark_get(&c->m.ar);
    *out = c;
    return 0;
}

int sl_gconstraint_can_end(const sl_gconstraint *c) {
    return c->st.accept && !c->st.need;
}

int sl_gconstraint_done(const sl_gconstraint *c) {
    return sl_gconstraint_can_end(c) && c->st.n == 0;
}

static int walk(sl_gconstraint *c, const tnode *node, const gstate *st, uint8_t *allowed, int *count) {
    const sl_gvocab *v = c->v;
    for (uint32_t k = 0; k < node->n_child; k++) {
        const tnode *ch = &v->nodes[node->child + k];
        amark mk = amark_get(&c->m.ar);
        gstate nx;
        if (advance_byte(&c->m, st, ch->byte, &nx)) return -1;
        if (live(&nx)) {
            for (uint32_t t = 0; t < ch->n_tok; t++) allowed[v->ids[ch->tok + t]] = 1;
            *count += (int)ch->n_tok;
            if (ch->n_child && nx.n && walk(c, ch, &nx, allowed, count)) return -1;
        }
        arelease(&c->m.ar, mk);
    }
    return 0;
}

int sl_gconstraint_mask(sl_gconstraint *c, uint8_t *allowed, sl_err *e) {
    c->m.e = e;
    memset(allowed, 0, (size_t)c->v->n_vocab);
    int count = 0;
    if (c->st.n && walk(c, &c->v->nodes[0], &c->st, allowed, &count)) {
        arelease(&c->m.ar, c->base);
        return -1;
    }
    arelease(&c->m.ar, c->base);
    if (sl_gconstraint_can_end(c))
        for (int i = 0; i < c->v->n_vocab; i++)
            if (c->v->eos[i]) {
                allowed[i] = 1;
                count++;
            }
    return count;
}

int sl_gconstraint_apply(sl_gconstraint *c, float *logits, sl_err *e) {
    uint8_t *allowed = malloc((size_t)c->v->n_vocab);
    if (!allowed) return sl_fail(e, "out of memory");
    int n = sl_gconstraint_mask(c, allowed, e);
    if (n >= 0)
        for (int i = 0; i < c->v->n_vocab; i++)
            if (!allowed[i]) logits[i] = -INFINITY;
    free(allowed);
    return n;
}

/* Walks a token's bytes from the current state; leaves the result above the arena mark. */
static int step_token(sl_gconstraint *c, int32_t id, gstate *out, sl_err *e) {
    c->m.e = e;
    memset(out, 0, sizeof *out);
    if (id < 0 || id >= c->v->n_vocab || !c->v->usable[id]) return 0;
    size_t len = 0;
    const uint8_t *b = (const uint8_t *)sl_tokenizer_token_bytes(c->v->tok, id, &len);
    gstate st = c->st;
    for (size_t i = 0; i < len && live(&st); i++) {
        if (advance_byte(&c->m, &st, b[i], out)) return -1;
        st = *out;
    }
    *out = st;
    return 0;
}

int sl_gconstraint_allows(sl_gconstraint *c, int32_t id, sl_err *e) {
    if (id >= 0 && id < c->v->n_vocab && c->v->eos[id]) return sl_gconstraint_can_end(c);
    gstate st;
    int rc = step_token(c, id, &st, e);
    arelease(&c->m.ar, c->base);
    return rc < 0 ? -1 : live(&st);
}

int sl_gconstraint_accept(sl_gconstraint *c, int32_t id, sl_err *e) {
    if (id >= 0 && id < c->v->n_vocab && c->v->eos[id]) {
        if (!sl_gconstraint_can_end(c))
            return sl_fail(e, "grammar: token %d ends the text before the grammar allows", id);
        c->st.n = 0; /* nothing follows an end */
        return 0;
    }
    gstate st;
    if (step_token(c, id, &st, e)) {
        arelease(&c->m.ar, c->base);
        return -1;
    }
    if (!live(&st)) {
        arelease(&c->m.ar, c->base);
        return sl_fail(e, "grammar: token %d is not allowed here", id);
    }
    /* the new state stays: its nodes are below the new mark (the old ones become garbage until the end) */
    c->st = st;
    c->base = amark_get(&c->m.ar);
    return 0;
}
