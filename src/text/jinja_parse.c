/* Jinja parser: tokens to an AST, following the precedence of Jinja2's parser. */
#include <stdlib.h>
#include <string.h>

#include "text/jinja_lex.h"
#include "text/jinja_parse.h"

typedef struct parser {
    jarena *a;
    jtok *t;
    size_t i, n;
    sl_err *e;
    int soft;  /* inside an if: unknown filters/tests fail only when reached, as in Jinja2 */
    int depth; /* nesting of expressions and blocks, bounded so that hostile input cannot exhaust the stack */
} parser;

/* Deep enough for any real template (they nest a few levels), shallow enough for a small thread stack. */
#define JP_MAX_DEPTH 200

typedef struct nvec {
    jnode **v;
    size_t n, cap;
} nvec;

static void nv_push(nvec *v, jnode *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        jnode **p = realloc(v->v, cap * sizeof *p);
        if (!p) abort();
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

/* Moves the vector into the arena. */
static jnode **nv_done(parser *P, nvec *v, size_t *n) {
    *n = v->n;
    jnode **r = NULL;
    if (v->n) {
        r = ja_alloc(P->a, v->n * sizeof *r);
        memcpy(r, v->v, v->n * sizeof *r);
    }
    free(v->v);
    *v = (nvec){0};
    return r;
}

static jtok *cur(parser *P) {
    return &P->t[P->i];
}
static jtok *peek(parser *P, size_t k) {
    return &P->t[P->i + k < P->n ? P->i + k : P->n - 1];
}

static int is_op(jtok *t, const char *op) {
    return t->t == T_OP && strlen(op) == t->n && !memcmp(t->p, op, t->n);
}
static int is_name(jtok *t, const char *nm) {
    return t->t == T_NAME && strlen(nm) == t->n && !memcmp(t->p, nm, t->n);
}

static const char *tokdesc(jtok *t, char *buf, size_t n) {
    switch (t->t) {
    case T_EOF: return "end of template";
    case T_BEND: return "end of statement block";
    case T_VEND: return "end of print statement";
    case T_TEXT: return "template data";
    default: snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p ? t->p : ""); return buf;
    }
}

static int unexpected(parser *P) {
    char buf[64];
    return sl_fail(P->e, "template syntax error at line %d: unexpected %s", cur(P)->line,
                   tokdesc(cur(P), buf, sizeof buf));
}

static int expect_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) {
        char buf[64];
        return sl_fail(P->e, "template syntax error at line %d: expected '%s', got %s", cur(P)->line, op,
                       tokdesc(cur(P), buf, sizeof buf));
    }
    P->i++;
    return 0;
}

static const char *take_name(parser *P) {
    jtok *t = cur(P);
    if (t->t != T_NAME) return NULL;
    P->i++;
    return ja_strndup(P->a, t->p, t->n);
}

static jnode *mk(parser *P, jn_kind k, int line) {
    jnode *n = ja_alloc(P->a, sizeof *n);
    n->k = k;
    n->line = line;
    return n;
}

static int deeper(parser *P) {
    if (++P->depth <= JP_MAX_DEPTH) return 0;
    sl_fail(P->e, "template syntax error at line %d: expressions or blocks nested more than %d levels deep",
            cur(P)->line, JP_MAX_DEPTH);
    return -1;
}

static jnode *p_expr(parser *P);
static jnode *p_not(parser *P);
static jnode *p_unary(parser *P, int with_filter);
static jnode *p_or(parser *P);

/* Arguments of a call or filter: positional, then name=value pairs. */
static int p_args(parser *P, jnode *n) {
    nvec pos = {0}, kwv = {0};
    const char **kwn = NULL;
    size_t nk = 0;
    if (expect_op(P, "(")) return -1;
    while (!is_op(cur(P), ")")) {
        if (pos.n + nk && expect_op(P, ",")) goto fail;
        if (is_op(cur(P), ")")) break;
        if (cur(P)->t == T_NAME && is_op(peek(P, 1), "=")) {
            const char *nm = take_name(P);
            P->i++;
            jnode *v = p_expr(P);
            if (!v) goto fail;
            const char **nn = realloc(kwn, (nk + 1) * sizeof *nn);
            if (!nn) abort();
            kwn = nn;
            kwn[nk++] = nm;
            nv_push(&kwv, v);
        } else {
            jnode *v = p_expr(P);
            if (!v) goto fail;
            nv_push(&pos, v);
        }
    }
    P->i++;
    n->v = nv_done(P, &pos, &n->nv);
    n->w = nv_done(P, &kwv, &n->nw);
    if (nk) {
        n->names = ja_alloc(P->a, nk * sizeof *n->names);
        memcpy(n->names, kwn, nk * sizeof *kwn);
    }
    n->nnames = nk;
    free(kwn);
    return 0;
fail:
    free(pos.v);
    free(kwv.v);
    free(kwn);
    return -1;
}

/* Comma-separated expressions; a tuple unless there is exactly one and no trailing comma. */
static jnode *p_tuple(parser *P, int simple) {
    int line = cur(P)->line;
    nvec items = {0};
    int comma = 0;
    for (;;) {
        if (items.n) {
            if (!is_op(cur(P), ",")) break;
            P->i++;
            comma = 1;
            jtok *t = cur(P);
            if (t->t == T_VEND || t->t == T_BEND || is_op(t, ")") || is_name(t, "in") || is_op(t, "=")) break;
        }
        jnode *x = simple ? p_unary(P, 0) : p_expr(P);
        if (!x) {
            free(items.v);
            return NULL;
        }
        nv_push(&items, x);
    }
    if (items.n == 1 && !comma) {
        jnode *x = items.v[0];
        free(items.v);
        return x;
    }
    jnode *n = mk(P, E_TUPLE, line);
    n->v = nv_done(P, &items, &n->nv);
    return n;
}

static jnode *p_primary(parser *P) {
    jtok *t = cur(P);
    jnode *n;
    switch (t->t) {
    case T_NAME:
        P->i++;
        n = mk(P, E_LIT, t->line);
        if (is_name(t, "true") || is_name(t, "True"))
            n->lit = jv_bool(1);
        else if (is_name(t, "false") || is_name(t, "False"))
            n->lit = jv_bool(0);
        else if (is_name(t, "none") || is_name(t, "None"))
            n->lit = jv_none();
        else {
            n->k = E_NAME;
            n->name = ja_strndup(P->a, t->p, t->n);
        }
        return n;
    case T_STR: {
        jbuf b = {0};
        int line = t->line;
        while (cur(P)->t == T_STR) {
            jb_put(&b, cur(P)->p, cur(P)->n);
            P->i++;
        }
        n = mk(P, E_LIT, line);
        n->lit = jv_strdup(P->a, b.p ? b.p : "", b.n);
        jb_free(&b);
        return n;
    }
    case T_INT:
    case T_FLOAT:
        P->i++;
        n = mk(P, E_LIT, t->line);
        n->lit = t->t == T_INT ? jv_int(t->i) : jv_float(t->f);
        return n;
    case T_OP:
        if (is_op(t, "(")) {
            P->i++;
            if (is_op(cur(P), ")")) {
                P->i++;
                n = mk(P, E_TUPLE, t->line);
                return n;
            }
            n = p_tuple(P, 0);
            if (!n || expect_op(P, ")")) return NULL;
            return n;
        }
        if (is_op(t, "[")) {
            P->i++;
            nvec items = {0};
            while (!is_op(cur(P), "]")) {
                if (items.n && expect_op(P, ",")) goto lfail;
                if (is_op(cur(P), "]")) break;
                jnode *x = p_expr(P);
                if (!x) goto lfail;
                nv_push(&items, x);
            }
            P->i++;
            n = mk(P, E_LIST, t->line);
            n->v = nv_done(P, &items, &n->nv);
            return n;
        lfail:
            free(items.v);
            return NULL;
        }
        if (is_op(t, "{")) {
            P->i++;
            nvec ks = {0}, vs = {0};
            while (!is_op(cur(P), "}")) {
                if (ks.n && expect_op(P, ",")) goto dfail;
                if (is_op(cur(P), "}")) break;
                jnode *k = p_expr(P);
                if (!k || expect_op(P, ":")) goto dfail;
                jnode *v = p_expr(P);
                if (!v) goto dfail;
                nv_push(&ks, k);
                nv_push(&vs, v);
            }
            P->i++;
            n = mk(P, E_DICT, t->line);
            n->v = nv_done(P, &ks, &n->nv);
            n->w = nv_done(P, &vs, &n->nw);
            return n;
        dfail:
            free(ks.v);
            free(vs.v);
            return NULL;
        }
        /* fallthrough */
    default: unexpected(P); return NULL;
    }
}

static jnode *p_subscript(parser *P, jnode *obj) {
    jtok *t = cur(P);
    if (is_op(t, ".")) {
        P->i++;
        jtok *a = cur(P);
        jnode *n;
        if (a->t == T_INT) { /* foo.0 is foo[0] */
            P->i++;
            n = mk(P, E_ITEM, t->line);
            n->a = obj;
            n->b = mk(P, E_LIT, t->line);
            n->b->lit = jv_int(a->i);
            return n;
        }
        const char *nm = take_name(P);
        if (!nm) {
            unexpected(P);
            return NULL;
        }
        n = mk(P, E_ATTR, t->line);
        n->a = obj;
        n->name = nm;
        return n;
    }
    /* [ index ] or [ start:stop:step ] */
    P->i++;
    jnode *parts[3] = {NULL, NULL, NULL};
    int colons = 0;
    for (;;) {
        if (is_op(cur(P), "]")) break;
        if (is_op(cur(P), ":")) {
            if (++colons > 2) {
                unexpected(P);
                return NULL;
            }
            P->i++;
            continue;
        }
        if (parts[colons]) {
            unexpected(P);
            return NULL;
        }
        parts[colons] = colons ? p_expr(P) : p_tuple(P, 0);
        if (!parts[colons]) return NULL;
    }
    P->i++;
    jnode *n;
    if (colons) {
        n = mk(P, E_SLICE, t->line);
        n->b = parts[0];
        n->c = parts[1];
        n->d = parts[2];
    } else {
        if (!parts[0]) {
            unexpected(P);
            return NULL;
        }
        n = mk(P, E_ITEM, t->line);
        n->b = parts[0];
    }
    n->a = obj;
    return n;
}

static jnode *p_postfix(parser *P, jnode *n) {
    for (;;) {
        jtok *t = cur(P);
        if (is_op(t, ".") || is_op(t, "["))
            n = p_subscript(P, n);
        else if (is_op(t, "(")) {
            jnode *c = mk(P, E_CALL, t->line);
            c->a = n;
            if (p_args(P, c)) return NULL;
            n = c;
        } else
            return n;
        if (!n) return NULL;
    }
}

static jnode *p_filter_expr(parser *P, jnode *n) {
    for (;;) {
        jtok *t = cur(P);
        if (is_op(t, "|")) {
            P->i++;
            jnode *f = mk(P, E_FILTER, t->line);
            jbuf nm = {0};
            for (;;) { /* dotted filter names are allowed */
                jtok *x = cur(P);
                if (x->t != T_NAME) {
                    jb_free(&nm);
                    unexpected(P);
                    return NULL;
                }
                jb_put(&nm, x->p, x->n);
                P->i++;
                if (!is_op(cur(P), ".")) break;
                jb_putc(&nm, '.');
                P->i++;
            }
            f->name = ja_strndup(P->a, nm.p, nm.n);
            jb_free(&nm);
            if (!P->soft && !jx_has_filter(f->name)) {
                sl_fail(P->e, "template syntax error at line %d: no filter named '%s'", t->line, f->name);
                return NULL;
            }
            f->a = n;
            if (is_op(cur(P), "(") && p_args(P, f)) return NULL;
            n = f;
        } else if (is_name(t, "is")) {
            P->i++;
            jnode *x = mk(P, E_TEST, t->line);
            if (is_name(cur(P), "not")) {
                x->op = 1;
                P->i++;
            }
            jtok *nm = cur(P);
            if (nm->t != T_NAME) {
                unexpected(P);
                return NULL;
            }
            /* none/true/false are test names even though they are also literals */
            x->name = ja_strndup(P->a, nm->p, nm->n);
            P->i++;
            if (!P->soft && !jx_has_test(x->name)) {
                sl_fail(P->e, "template syntax error at line %d: no test named '%s'", t->line, x->name);
                return NULL;
            }
            x->a = n;
            jtok *c = cur(P);
            if (is_op(c, "(")) {
                if (p_args(P, x)) return NULL;
            } else if ((c->t == T_NAME || c->t == T_STR || c->t == T_INT || c->t == T_FLOAT || is_op(c, "[") ||
                        is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and") && !is_name(c, "if") &&
                       !is_name(c, "in") && !is_name(c, "is") && !is_name(c, "not")) {
                jnode *arg = p_unary(P, 0);
                if (!arg) return NULL;
                x->v = ja_alloc(P->a, sizeof *x->v);
                x->v[0] = arg;
                x->nv = 1;
            }
            n = x;
        } else if (is_op(t, "(")) {
            jnode *c = mk(P, E_CALL, t->line);
            c->a = n;
            if (p_args(P, c)) return NULL;
            n = c;
        } else
            return n;
    }
}

static jnode *p_unary_(parser *P, int with_filter) {
    jtok *t = cur(P);
    jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        P->i++;
        n = mk(P, is_op(t, "-") ? E_NEG : E_POS, t->line);
        n->a = p_unary(P, 0);
        if (!n->a) return NULL;
    } else {
        n = p_primary(P);
        if (!n) return NULL;
    }
    n = p_postfix(P, n);
    if (n && with_filter) n = p_filter_expr(P, n);
    return n;
}

static jnode *p_unary(parser *P, int with_filter) {
    jnode *r = deeper(P) ? NULL : p_unary_(P, with_filter);
    P->depth--;
    return r;
}

static jnode *bin(parser *P, int op, jnode *a, jnode *b, int line) {
    jnode *n = mk(P, E_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *p_pow(parser *P) {
    jnode *a = p_unary(P, 1);
    while (a && is_op(cur(P), "**")) {
        int line = cur(P)->line;
        P->i++;
        jnode *b = p_unary(P, 1);
        if (!b) return NULL;
        a = bin(P, OP_POW, a, b, line);
    }
    return a;
}

static jnode *p_math2(parser *P) {
    jnode *a = p_pow(P);
    for (;;) {
        if (!a) return NULL;
        jtok *t = cur(P);
        int op = is_op(t, "*")    ? OP_MUL
                 : is_op(t, "/")  ? OP_DIV
                 : is_op(t, "//") ? OP_FDIV
                 : is_op(t, "%")  ? OP_MOD
                                  : -1;
        if (op < 0) return a;
        P->i++;
        jnode *b = p_pow(P);
        if (!b) return NULL;
        a = bin(P, op, a, b, t->line);
    }
}

static jnode *p_concat(parser *P) {
    jnode *a = p_math2(P);
    while (a && is_op(cur(P), "~")) {
        int line = cur(P)->line;
        P->i++;
        jnode *b = p_math2(P);
        if (!b) return NULL;
        a = bin(P, OP_CAT, a, b, line);
    }
    return a;
}

static jnode *p_math1(parser *P) {
    jnode *a = p_concat(P);
    for (;;) {
        if (!a) return NULL;
        jtok *t = cur(P);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
        if (op < 0) return a;
        P->i++;
        jnode *b = p_concat(P);
        if (!b) return NULL;
        a = bin(P, op, a, b, t->line);
    }
}

static jnode *p_compare(parser *P) {
    jnode *a = p_math1(P);
    jnode *last = NULL; /* right operand of the previous comparison in this chain */
    for (;;) {
        if (!a) return NULL;
        jtok *t = cur(P);
        int op = -1;
        if (is_op(t, "=="))
            op = OP_EQ;
        else if (is_op(t, "!="))
            op = OP_NE;
        else if (is_op(t, "<"))
            op = OP_LT;
        else if (is_op(t, ">"))
            op = OP_GT;
        else if (is_op(t, "<="))
            op = OP_LE;
        else if (is_op(t, ">="))
            op = OP_GE;
        else if (is_name(t, "in"))
            op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = OP_NOTIN;
            P->i++;
        }
        if (op < 0) return a;
        P->i++;
        jnode *b = p_math1(P);
        if (!b) return NULL;
        /* a < b < c means (a < b) and (b < c) */
        if (last) {
            jnode *and = mk(P, E_AND, t->line);
            and->a = a;
            and->b = bin(P, op, last, b, t->line);
            a = and;
        } else
            a = bin(P, op, a, b, t->line);
        last = b;
    }
}

static jnode *p_not_(parser *P) {
    jtok *t = cur(P);
    if (is_name(t, "not")) {
        P->i++;
        jnode *n = mk(P, E_NOT, t->line);
        n->a = p_not(P);
        return n->a ? n : NULL;
    }
    return p_compare(P);
}

static jnode *p_not(parser *P) {
    jnode *r = deeper(P) ? NULL : p_not_(P);
    P->depth--;
    return r;
}

static jnode *p_and(parser *P) {
    jnode *a = p_not(P);
    while (a && is_name(cur(P), "and")) {
        jnode *n = mk(P, E_AND, cur(P)->line);
        P->i++;
        n->a = a;
        n->b = p_not(P);
        if (!n->b) return NULL;
        a = n;
    }
    return a;
}

static jnode *p_or(parser *P) {
    jnode *a = p_and(P);
    while (a && is_name(cur(P), "or")) {
        jnode *n = mk(P, E_OR, cur(P)->line);
        P->i++;
        n->a = a;
        n->b = p_and(P);
        if (!n->b) return NULL;
        a = n;
    }
    return a;
}

static jnode *p_expr_(parser *P) {
    jnode *a = p_or(P);
    while (a && is_name(cur(P), "if")) {
        jnode *n = mk(P, E_COND, cur(P)->line);
        P->i++;
        n->a = a;
        n->b = p_or(P);
        if (!n->b) return NULL;
        if (is_name(cur(P), "else")) {
            P->i++;
            n->c = p_expr(P);
            if (!n->c) return NULL;
        }
        a = n;
    }
    return a;
}

static jnode *p_expr(parser *P) {
    jnode *r = deeper(P) ? NULL : p_expr_(P);
    P->depth--;
    return r;
}

/* ---- statements ---- */

static int p_body_any(parser *P, const char *const *ends, nvec *out, const char **found);

/* Bodies that Jinja2 compiles into a new frame (loops, macros, blocks) check filter names strictly again;
 * only the direct body and condition of an if are lenient. */
static int p_body(parser *P, const char *const *ends, nvec *out, const char **found) {
    int soft = P->soft;
    P->soft = 0;
    int r = p_body_any(P, ends, out, found);
    P->soft = soft;
    return r;
}

static int p_body_soft(parser *P, const char *const *ends, nvec *out, const char **found) {
    int soft = P->soft;
    P->soft = 1;
    int r = p_body_any(P, ends, out, found);
    P->soft = soft;
    return r;
}

static int end_block(parser *P) {
    if (cur(P)->t != T_BEND) return unexpected(P);
    P->i++;
    return 0;
}

/* Target names of for / set: a, b, c */
static int p_targets(parser *P, jnode *n) {
    const char *buf[16];
    size_t k = 0;
    int paren = is_op(cur(P), "(");
    if (paren) P->i++;
    for (;;) {
        const char *nm = take_name(P);
        if (!nm) return unexpected(P);
        if (k == 16) return sl_fail(P->e, "template syntax error at line %d: too many targets", cur(P)->line);
        buf[k++] = nm;
        if (!is_op(cur(P), ",")) break;
        P->i++;
    }
    if (paren && expect_op(P, ")")) return -1;
    n->names = ja_alloc(P->a, k * sizeof *n->names);
    memcpy(n->names, buf, k * sizeof *buf);
    n->nnames = k;
    return 0;
}

static jnode **body_done(parser *P, nvec *v, size_t *n) {
    return nv_done(P, v, n);
}

static jnode *s_if(parser *P, int line) {
    jnode *n = mk(P, N_IF, line);
    int soft = P->soft;
    P->soft = 1;
    n->a = p_tuple(P, 0);
    P->soft = soft;
    if (!n->a || end_block(P)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    nvec body = {0};
    const char *found;
    if (p_body_soft(P, ends, &body, &found)) {
        free(body.v);
        return NULL;
    }
    n->v = body_done(P, &body, &n->nv);
    if (!strcmp(found, "elif")) {
        jnode *e = s_if(P, cur(P)->line);
        if (!e) return NULL;
        n->w = ja_alloc(P->a, sizeof *n->w);
        n->w[0] = e;
        n->nw = 1;
    } else if (!strcmp(found, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        if (end_block(P)) return NULL;
        if (p_body_soft(P, ends2, &body, &found)) {
            free(body.v);
            return NULL;
        }
        n->w = body_done(P, &body, &n->nw);
        if (end_block(P)) return NULL;
    } else if (end_block(P))
        return NULL;
    return n;
}

/* {% with a = 1, b = x %}...{% endwith %}: a scope of its own */
static jnode *s_with(parser *P, int line) {
    jnode *n = mk(P, N_WITH, line);
    nvec vals = {0};
    const char *buf[32];
    size_t k = 0;
    while (cur(P)->t != T_BEND) {
        if (k && expect_op(P, ",")) goto fail;
        const char *nm = take_name(P);
        if (!nm || k == 32 || expect_op(P, "=")) {
            if (!nm || k == 32) unexpected(P);
            goto fail;
        }
        jnode *v = p_expr(P);
        if (!v) goto fail;
        buf[k++] = nm;
        nv_push(&vals, v);
    }
    P->i++;
    n->names = ja_alloc(P->a, (k ? k : 1) * sizeof *n->names);
    memcpy(n->names, buf, k * sizeof *buf);
    n->nnames = k;
    n->w = nv_done(P, &vals, &n->nw);
    static const char *const ends[] = {"endwith", NULL};
    nvec body = {0};
    const char *found;
    if (p_body(P, ends, &body, &found)) {
        free(body.v);
        return NULL;
    }
    n->v = body_done(P, &body, &n->nv);
    if (end_block(P)) return NULL;
    return n;
fail:
    free(vals.v);
    return NULL;
}

static jnode *s_for(parser *P, int line) {
    jnode *n = mk(P, N_FOR, line);
    if (p_targets(P, n)) return NULL;
    if (!is_name(cur(P), "in")) {
        unexpected(P);
        return NULL;
    }
    P->i++;
    /* the iterable: an expression without a bare conditional, so that "if" filters the loop */
    n->a = p_or(P);
    if (!n->a) return NULL;
    if (is_name(cur(P), "if")) {
        P->i++;
        int soft = P->soft;
        P->soft = 0;
        n->b = p_expr(P);
        P->soft = soft;
        if (!n->b) return NULL;
    }
    if (is_name(cur(P), "recursive")) {
        sl_fail(P->e, "template syntax error at line %d: recursive loops are not supported", cur(P)->line);
        return NULL;
    }
    if (end_block(P)) return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    nvec body = {0};
    const char *found;
    if (p_body(P, ends, &body, &found)) {
        free(body.v);
        return NULL;
    }
    n->v = body_done(P, &body, &n->nv);
    if (end_block(P)) return NULL;
    if (!strcmp(found, "else")) {
        static const char *const ends2[] = {"endfor", NULL};
        if (p_body(P, ends2, &body, &found)) {
            free(body.v);
            return NULL;
        }
        n->w = body_done(P, &body, &n->nw);
        if (end_block(P)) return NULL;
    }
    return n;
}

static jnode *s_set(parser *P, int line) {
    jnode *n = mk(P, N_SET, line);
    if (cur(P)->t == T_NAME && is_op(peek(P, 1), ".")) {
        n->name = take_name(P);
        P->i++;
        n->name2 = take_name(P);
        if (!n->name2) {
            unexpected(P);
            return NULL;
        }
    } else if (p_targets(P, n))
        return NULL;
    if (is_op(cur(P), "=")) {
        P->i++;
        n->a = p_tuple(P, 0);
        if (!n->a || end_block(P)) return NULL;
        return n;
    }
    /* block set: {% set x %}...{% endset %}, optionally filtered */
    if (n->name2 || n->nnames != 1) {
        unexpected(P);
        return NULL;
    }
    n->k = N_SETBLOCK;
    n->name = n->names[0];
    if (is_op(cur(P), "|")) {
        n->b = p_filter_expr(P, NULL);
        if (!n->b) return NULL;
    }
    if (end_block(P)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    nvec body = {0};
    const char *found;
    if (p_body(P, ends, &body, &found)) {
        free(body.v);
        return NULL;
    }
    n->v = body_done(P, &body, &n->nv);
    if (end_block(P)) return NULL;
    return n;
}

/* (a, b=1, c) parameter lists of macros and call blocks */
static int p_params(parser *P, jnode *n) {
    nvec defs = {0};
    const char *buf[32];
    size_t k = 0;
    if (expect_op(P, "(")) return -1;
    while (!is_op(cur(P), ")")) {
        if (k && expect_op(P, ",")) goto fail;
        const char *nm = take_name(P);
        if (!nm || k == 32) {
            unexpected(P);
            goto fail;
        }
        buf[k++] = nm;
        jnode *d = NULL;
        if (is_op(cur(P), "=")) {
            P->i++;
            d = p_expr(P);
            if (!d) goto fail;
        }
        nv_push(&defs, d);
    }
    P->i++;
    n->names = ja_alloc(P->a, (k ? k : 1) * sizeof *n->names);
    memcpy(n->names, buf, k * sizeof *buf);
    n->nnames = k;
    n->w = nv_done(P, &defs, &n->nw);
    return 0;
fail:
    free(defs.v);
    return -1;
}

/* Whether any expression under n reads the variable name. Chains of binary operators, filters and
 * attributes nest deeper than the parser's recursion, so the walk is bounded too: past the bound the answer
 * is yes, which only lets a macro accept extra arguments (evaluating such a body fails on its depth anyway). */
static int mentions_at(const jnode *n, const char *name, int depth) {
    if (!n) return 0;
    if (depth > 4 * JP_MAX_DEPTH) return 1;
    if (n->k == E_NAME && !strcmp(n->name, name)) return 1;
    if (mentions_at(n->a, name, depth + 1) || mentions_at(n->b, name, depth + 1) ||
        mentions_at(n->c, name, depth + 1) || mentions_at(n->d, name, depth + 1))
        return 1;
    for (size_t i = 0; i < n->nv; i++)
        if (mentions_at(n->v[i], name, depth + 1)) return 1;
    for (size_t i = 0; i < n->nw; i++)
        if (mentions_at(n->w[i], name, depth + 1)) return 1;
    return 0;
}

static int mentions(const jnode *n, const char *name) {
    return mentions_at(n, name, 0);
}

static jnode *s_macro(parser *P, int line) {
    jnode *n = mk(P, N_MACRO, line);
    n->name = take_name(P);
    if (!n->name) {
        unexpected(P);
        return NULL;
    }
    if (p_params(P, n) || end_block(P)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    nvec body = {0};
    const char *found;
    if (p_body(P, ends, &body, &found)) {
        free(body.v);
        return NULL;
    }
    n->v = body_done(P, &body, &n->nv);
    for (size_t i = 0; i < n->nv; i++) {
        if (mentions(n->v[i], "varargs")) n->op |= MACRO_VARARGS;
        if (mentions(n->v[i], "kwargs")) n->op |= MACRO_KWARGS;
    }
    if (cur(P)->t == T_NAME) P->i++; /* {% endmacro name %} */
    if (end_block(P)) return NULL;
    return n;
}

static jnode *s_call(parser *P, int line) {
    jnode *n = mk(P, N_CALLBLOCK, line);
    if (is_op(cur(P), "(")) {
        if (p_params(P, n)) return NULL;
    }
    n->a = p_expr(P);
    if (!n->a) return NULL;
    if (n->a->k != E_CALL) {
        sl_fail(P->e, "template syntax error at line %d: expected a call in call block", line);
        return NULL;
    }
    if (end_block(P)) return NULL;
    static const char *const ends[] = {"endcall", NULL};
    nvec body = {0};
    const char *found;
    if (p_body(P, ends, &body, &found)) {
        free(body.v);
        return NULL;
    }
    n->v = body_done(P, &body, &n->nv);
    if (end_block(P)) return NULL;
    return n;
}

static jnode *s_filter(parser *P, int line) {
    jnode *n = mk(P, N_FILTERBLOCK, line);
    /* the chain is parsed as "| f | g" applied to a placeholder (NULL input) */
    P->i--;
    P->t[P->i] = (jtok){.t = T_OP, .line = line, .p = "|", .n = 1};
    n->a = p_filter_expr(P, NULL);
    if (!n->a || end_block(P)) return NULL;
    static const char *const ends[] = {"endfilter", NULL};
    nvec body = {0};
    const char *found;
    if (p_body(P, ends, &body, &found)) {
        free(body.v);
        return NULL;
    }
    n->v = body_done(P, &body, &n->nv);
    if (end_block(P)) return NULL;
    return n;
}

static jnode *s_generation(parser *P, int line) {
    /* {% generation %} only marks assistant spans for masks; it renders its body */
    if (end_block(P)) return NULL;
    jnode *n = mk(P, N_IF, line);
    n->a = mk(P, E_LIT, line);
    n->a->lit = jv_bool(1);
    static const char *const ends[] = {"endgeneration", NULL};
    nvec body = {0};
    const char *found;
    if (p_body_any(P, ends, &body, &found)) {
        free(body.v);
        return NULL;
    }
    n->v = body_done(P, &body, &n->nv);
    if (end_block(P)) return NULL;
    return n;
}

static jnode *p_statement_(parser *P) {
    jtok *kw = cur(P);
    int line = kw->line;
    if (kw->t != T_NAME) {
        unexpected(P);
        return NULL;
    }
    P->i++;
    if (is_name(kw, "if")) return s_if(P, line);
    if (is_name(kw, "for")) return s_for(P, line);
    if (is_name(kw, "set")) return s_set(P, line);
    if (is_name(kw, "macro")) return s_macro(P, line);
    if (is_name(kw, "call")) return s_call(P, line);
    if (is_name(kw, "filter")) return s_filter(P, line);
    if (is_name(kw, "generation")) return s_generation(P, line);
    if (is_name(kw, "with")) return s_with(P, line);
    if (is_name(kw, "break") || is_name(kw, "continue")) {
        jnode *n = mk(P, is_name(kw, "break") ? N_BREAK : N_CONTINUE, line);
        return end_block(P) ? NULL : n;
    }
    if (is_name(kw, "do")) {
        jnode *n = mk(P, N_DO, line);
        n->a = p_tuple(P, 0);
        return !n->a || end_block(P) ? NULL : n;
    }
    sl_fail(P->e, "template syntax error at line %d: unknown tag '%.*s'", line, (int)kw->n, kw->p);
    return NULL;
}

static jnode *p_statement(parser *P) {
    jnode *r = deeper(P) ? NULL : p_statement_(P);
    P->depth--;
    return r;
}

/* Parses nodes until a block whose keyword is in ends (consumed; *found names it) or, with ends NULL, EOF. */
static int p_body_any(parser *P, const char *const *ends, nvec *out, const char **found) {
    for (;;) {
        jtok *t = cur(P);
        switch (t->t) {
        case T_EOF:
            if (!ends) return 0;
            return sl_fail(P->e, "template syntax error at line %d: unexpected end of template, expected '%s'", t->line,
                           ends[0] ? ends[0] : "end");
        case T_TEXT: {
            jnode *n = mk(P, N_TEXT, t->line);
            n->lit = jv_str(t->p, t->n);
            nv_push(out, n);
            P->i++;
            break;
        }
        case T_VBEGIN: {
            P->i++;
            jnode *n = mk(P, N_OUT, t->line);
            n->a = p_tuple(P, 0);
            if (!n->a) return -1;
            if (cur(P)->t != T_VEND) return unexpected(P);
            P->i++;
            nv_push(out, n);
            break;
        }
        case T_BBEGIN: {
            jtok *kw = peek(P, 1);
            if (ends && kw->t == T_NAME)
                for (int i = 0; ends[i]; i++)
                    if (is_name(kw, ends[i])) {
                        *found = ends[i];
                        P->i += 2;
                        return 0;
                    }
            P->i++;
            jnode *n = p_statement(P);
            if (!n) return -1;
            nv_push(out, n);
            break;
        }
        default: return unexpected(P);
        }
    }
}

int jparse(jarena *a, const char *src, size_t len, jnode ***body, size_t *n, sl_err *e) {
    jtok *toks;
    size_t nt;
    if (jlex(a, src, len, &toks, &nt, e)) return -1;
    parser P = {.a = a, .t = toks, .n = nt, .e = e};
    nvec out = {0};
    const char *found = NULL;
    if (p_body(&P, NULL, &out, &found)) {
        free(out.v);
        return -1;
    }
    *body = nv_done(&P, &out, n);
    return 0;
}
