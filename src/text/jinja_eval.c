/* Jinja evaluator: walks the AST with Python/Jinja2 semantics. Scopes chain upwards; every for-loop iteration
 * and macro call gets a fresh scope, so a plain {% set %} inside a loop does not leak out (namespace() does). */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "text/jinja_eval.h"

typedef struct evalctx {
    jctx c;
    jv hole; /* input of a {% filter %} block chain */
} evalctx;

int jx_fail(jctx *c, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return sl_fail(c->e, "template error at line %d: %s", c->line, msg);
}

static jscope *new_scope(jctx *c, jscope *parent) {
    jscope *s = ja_alloc(c->a, sizeof *s);
    s->parent = parent;
    return s;
}

static jv lookup(jctx *c, jscope *s, const char *name) {
    for (; s; s = s->parent) {
        jv v;
        if (jd_getc(&s->vars, name, &v)) return v;
    }
    jv g = jx_global(c->a, name);
    if (g.t != JV_UNDEF) return g;
    return jv_undef(name);
}

static void assign(jctx *c, jscope *s, const char *name, jv v) {
    jd_setc(c->a, &s->vars, name, v);
}

static int eval(evalctx *x, jscope *s, const jnode *n, jv *out);
static int exec(evalctx *x, jscope *s, jnode *const *body, size_t nb, jbuf *out);

int jx_undef_fail(jctx *c, jv v) {
    const char *h = v.u.s.p;
    if (h && h[0] == '\'') return jx_fail(c, "UndefinedError: %s", h);
    return jx_fail(c, "UndefinedError: '%s' is undefined", h ? h : "value");
}

/* Evaluates positional and keyword arguments of a call/filter node. */
static int eval_args(evalctx *x, jscope *s, const jnode *n, jv **args, jv **kwv) {
    *args = ja_alloc(x->c.a, (n->nv + 1) * sizeof(jv));
    *kwv = ja_alloc(x->c.a, (n->nw + 1) * sizeof(jv));
    for (size_t i = 0; i < n->nv; i++)
        if (eval(x, s, n->v[i], &(*args)[i])) return -1;
    for (size_t i = 0; i < n->nw; i++)
        if (eval(x, s, n->w[i], &(*kwv)[i])) return -1;
    return 0;
}

static int call_macro(evalctx *x, jfunc *fn, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, jv caller,
                      jv *out) {
    jctx *c = &x->c;
    const jnode *def = fn->def;
    if (c->depth > 200) return jx_fail(c, "RecursionError: maximum macro recursion depth exceeded");
    jscope *ms = new_scope(c, fn->closure);
    size_t np = def->nnames;
    jv varargs = jv_list(c->a, 0), kwargs = jv_dict(c->a);
    varargs.u.l->tuple = 1;
    if (nargs > np && def->k == N_MACRO && !(def->op & MACRO_VARARGS))
        return jx_fail(c, "TypeError: macro '%s' takes not more than %zu argument(s)", fn->name, np);
    for (size_t i = 0; i < nargs; i++) {
        if (i < np)
            assign(c, ms, def->names[i], args[i]);
        else
            jl_push(c->a, varargs.u.l, args[i]);
    }
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < np && strcmp(def->names[i], kwn[k])) i++;
        if (i < np) {
            if (i < nargs)
                return jx_fail(c, "TypeError: macro '%s' got multiple values for argument '%s'", fn->name, kwn[k]);
            assign(c, ms, def->names[i], kwv[k]);
        } else if (def->k == N_MACRO && !(def->op & MACRO_KWARGS))
            return jx_fail(c, "TypeError: macro '%s' takes no keyword argument '%s'", fn->name, kwn[k]);
        else
            jd_setc(c->a, kwargs.u.d, kwn[k], kwv[k]);
    }
    int line = c->line;
    for (size_t i = nargs; i < np; i++) {
        jv tmp;
        if (jd_getc(&ms->vars, def->names[i], &tmp)) continue;
        if (i < def->nw && def->w[i]) {
            if (eval(x, ms, def->w[i], &tmp)) return -1;
        } else
            tmp = jv_undef(def->names[i]);
        assign(c, ms, def->names[i], tmp);
    }
    assign(c, ms, "varargs", varargs);
    assign(c, ms, "kwargs", kwargs);
    if (caller.t != JV_UNDEF) assign(c, ms, "caller", caller);
    jbuf b = {0};
    c->depth++;
    int r = exec(x, ms, def->v, def->nv, &b);
    c->depth--;
    c->line = line;
    if (r < 0) {
        jb_free(&b);
        return -1;
    }
    *out = jv_strdup(c->a, b.p ? b.p : "", b.n);
    jb_free(&b);
    return 0;
}

static int call_value(evalctx *x, jv f, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, jv caller,
                      jv *out) {
    jctx *c = &x->c;
    if (f.t == JV_UNDEF) return jx_undef_fail(c, f);
    if (f.t != JV_FUNC) return jx_fail(c, "TypeError: '%s' object is not callable", jv_typename(f));
    if (f.u.fn->kind == FN_MACRO || f.u.fn->kind == FN_CALLER)
        return call_macro(x, f.u.fn, args, nargs, kwn, kwv, nkw, caller, out);
    return jx_call_builtin(c, f, args, nargs, kwn, kwv, nkw, out);
}

static int eval_call(evalctx *x, jscope *s, const jnode *n, jv caller, jv *out) {
    jv f, *args, *kwv;
    if (eval(x, s, n->a, &f) || eval_args(x, s, n, &args, &kwv)) return -1;
    x->c.line = n->line;
    return call_value(x, f, args, n->nv, n->names, kwv, n->nw, caller, out);
}

static int eval_slice(evalctx *x, jscope *s, const jnode *n, jv *out) {
    jctx *c = &x->c;
    jv obj, parts[3] = {jv_none(), jv_none(), jv_none()};
    if (eval(x, s, n->a, &obj)) return -1;
    const jnode *pn[3] = {n->b, n->c, n->d};
    for (int i = 0; i < 3; i++)
        if (pn[i] && eval(x, s, pn[i], &parts[i])) return -1;
    if (obj.t == JV_UNDEF) return jx_undef_fail(c, obj);
    long long len;
    if (obj.t == JV_STR)
        len = (long long)ju_len(obj.u.s.p, obj.u.s.n);
    else if (obj.t == JV_LIST && !obj.u.l->gen)
        len = (long long)obj.u.l->n;
    else
        len = -1;
    for (int i = 0; i < 3; i++)
        if (parts[i].t != JV_NONE && parts[i].t != JV_INT && parts[i].t != JV_BOOL) len = -1;
    if (len < 0) { /* Jinja2's getitem turns a failed subscript into an undefined value */
        *out = jv_undef("'object' is not subscriptable");
        return 0;
    }
    if (parts[2].t != JV_NONE && (parts[2].t == JV_INT ? parts[2].u.i : parts[2].u.b) == 0)
        return jx_fail(c, "ValueError: slice step cannot be zero");
    long long step = parts[2].t == JV_NONE ? 1 : parts[2].t == JV_INT ? parts[2].u.i : parts[2].u.b;
    long long lo, hi;
    /* Python's PySlice_AdjustIndices */
    if (parts[0].t == JV_NONE)
        lo = step < 0 ? len - 1 : 0;
    else {
        lo = parts[0].t == JV_INT ? parts[0].u.i : parts[0].u.b;
        if (lo < 0)
            lo = lo + len < 0 ? (step < 0 ? -1 : 0) : lo + len;
        else if (lo >= len)
            lo = step < 0 ? len - 1 : len;
    }
    if (parts[1].t == JV_NONE)
        hi = step < 0 ? -1 : len;
    else {
        hi = parts[1].t == JV_INT ? parts[1].u.i : parts[1].u.b;
        if (hi < 0)
            hi = hi + len < 0 ? (step < 0 ? -1 : 0) : hi + len;
        else if (hi >= len)
            hi = step < 0 ? len - 1 : len;
    }
    if (obj.t == JV_STR) {
        jbuf b = {0};
        for (long long i = lo; step > 0 ? i < hi : i > hi; i += step) {
            size_t o = ju_off(obj.u.s.p, obj.u.s.n, (size_t)i), e2 = ju_off(obj.u.s.p, obj.u.s.n, (size_t)i + 1);
            jb_put(&b, obj.u.s.p + o, e2 - o);
        }
        *out = jv_strdup(c->a, b.p ? b.p : "", b.n);
        jb_free(&b);
        return 0;
    }
    jv r = jv_list(c->a, 0);
    r.u.l->tuple = obj.u.l->tuple;
    for (long long i = lo; step > 0 ? i < hi : i > hi; i += step) jl_push(c->a, r.u.l, obj.u.l->v[i]);
    *out = r;
    return 0;
}

static int eval_node(evalctx *x, jscope *s, const jnode *n, jv *out) {
    jctx *c = &x->c;
    c->line = n->line;
    switch (n->k) {
    case E_LIT: *out = n->lit; return 0;
    case E_NAME: *out = lookup(c, s, n->name); return 0;
    case E_LIST:
    case E_TUPLE: {
        jv l = jv_list(c->a, n->nv);
        l.u.l->tuple = n->k == E_TUPLE;
        for (size_t i = 0; i < n->nv; i++) {
            jv v;
            if (eval(x, s, n->v[i], &v)) return -1;
            jl_push(c->a, l.u.l, v);
        }
        *out = l;
        return 0;
    }
    case E_DICT: {
        jv d = jv_dict(c->a);
        for (size_t i = 0; i < n->nv; i++) {
            jv k, v;
            if (eval(x, s, n->v[i], &k) || eval(x, s, n->w[i], &v)) return -1;
            jd_set(c->a, d.u.d, k, v);
        }
        *out = d;
        return 0;
    }
    case E_ATTR: {
        jv o;
        if (eval(x, s, n->a, &o)) return -1;
        c->line = n->line;
        if (o.t == JV_UNDEF) return jx_undef_fail(c, o);
        return jx_getattr(c, o, n->name, out);
    }
    case E_ITEM: {
        jv o, k;
        if (eval(x, s, n->a, &o) || eval(x, s, n->b, &k)) return -1;
        c->line = n->line;
        if (o.t == JV_UNDEF) return jx_undef_fail(c, o);
        return jx_getitem(c, o, k, out);
    }
    case E_SLICE: return eval_slice(x, s, n, out);
    case E_CALL: return eval_call(x, s, n, jv_undef(NULL), out);
    case E_FILTER: {
        jv in, *args, *kwv;
        if (n->a) {
            if (eval(x, s, n->a, &in)) return -1;
        } else
            in = x->hole;
        if (eval_args(x, s, n, &args, &kwv)) return -1;
        c->line = n->line;
        return jx_filter(c, n->name, in, args, n->nv, n->names, kwv, n->nw, out);
    }
    case E_TEST: {
        jv in, *args, *kwv;
        if (eval(x, s, n->a, &in) || eval_args(x, s, n, &args, &kwv)) return -1;
        c->line = n->line;
        int r;
        if (jx_test(c, n->name, in, args, n->nv, &r)) return -1;
        *out = jv_bool(n->op ? !r : r);
        return 0;
    }
    case E_NOT: {
        jv v;
        if (eval(x, s, n->a, &v)) return -1;
        *out = jv_bool(!jv_truthy(v));
        return 0;
    }
    case E_NEG:
    case E_POS: {
        jv v;
        if (eval(x, s, n->a, &v)) return -1;
        c->line = n->line;
        if (v.t == JV_BOOL) v = jv_int(v.u.b);
        if (v.t == JV_INT && n->k == E_NEG && v.u.i == LLONG_MIN)
            return jx_fail(c, "OverflowError: -(%lld) does not fit in a 64-bit integer", v.u.i);
        if (v.t == JV_INT)
            *out = jv_int(n->k == E_NEG ? -v.u.i : v.u.i);
        else if (v.t == JV_FLOAT)
            *out = jv_float(n->k == E_NEG ? -v.u.f : v.u.f);
        else if (v.t == JV_UNDEF)
            return jx_undef_fail(c, v);
        else
            return jx_fail(c, "TypeError: bad operand type for unary %c: '%s'", n->k == E_NEG ? '-' : '+',
                           jv_typename(v));
        return 0;
    }
    case E_BIN: {
        jv a, b;
        if (eval(x, s, n->a, &a) || eval(x, s, n->b, &b)) return -1;
        c->line = n->line;
        return jx_binop(c, n->op, a, b, out);
    }
    case E_AND:
    case E_OR: {
        jv a;
        if (eval(x, s, n->a, &a)) return -1;
        if (jv_truthy(a) == (n->k == E_OR)) {
            *out = a;
            return 0;
        }
        return eval(x, s, n->b, out);
    }
    case E_COND: {
        jv cond;
        if (eval(x, s, n->b, &cond)) return -1;
        if (jv_truthy(cond)) return eval(x, s, n->a, out);
        if (n->c) return eval(x, s, n->c, out);
        *out = jv_undef(NULL);
        return 0;
    }
    default: return jx_fail(c, "internal error: statement used as expression");
    }
}

static int bind_targets(jctx *c, jscope *s, const jnode *n, jv v) {
    if (n->nnames == 1) {
        assign(c, s, n->names[0], v);
        return 0;
    }
    jlist *l;
    if (jx_iter(c, v, &l)) return -1;
    if (l->n != n->nnames)
        return jx_fail(c, "ValueError: %s values to unpack (expected %zu, got %zu)",
                       l->n > n->nnames ? "too many" : "not enough", n->nnames, l->n);
    for (size_t i = 0; i < l->n; i++) assign(c, s, n->names[i], l->v[i]);
    return 0;
}

static int exec_for(evalctx *x, jscope *s, const jnode *n, jbuf *out) {
    jctx *c = &x->c;
    jv it;
    if (eval(x, s, n->a, &it)) return -1;
    c->line = n->line;
    jlist *items;
    if (it.t == JV_UNDEF)
        items = jv_list(c->a, 0).u.l;
    else if (jx_iter(c, it, &items))
        return -1;
    if (n->b) { /* {% for x in y if cond %}: filtered before loop.* is computed */
        jlist *kept = jv_list(c->a, items->n).u.l;
        for (size_t i = 0; i < items->n; i++) {
            jscope *fs = new_scope(c, s);
            jv cond;
            if (bind_targets(c, fs, n, items->v[i]) || eval(x, fs, n->b, &cond)) return -1;
            if (jv_truthy(cond)) jl_push(c->a, kept, items->v[i]);
        }
        items = kept;
    }
    size_t len = items->n;
    jfunc *changed = ja_alloc(c->a, sizeof *changed); /* loop.changed() remembers across iterations */
    changed->kind = FN_CHANGED;
    changed->name = "changed";
    changed->self = jv_list(c->a, 1);
    for (size_t i = 0; i < len; i++) {
        jscope *ls = new_scope(c, s);
        if (bind_targets(c, ls, n, items->v[i])) return -1;
        jv loop = jv_dict(c->a);
        jdict *d = loop.u.d;
        jd_setc(c->a, d, "index", jv_int((long long)i + 1));
        jd_setc(c->a, d, "index0", jv_int((long long)i));
        jd_setc(c->a, d, "revindex", jv_int((long long)(len - i)));
        jd_setc(c->a, d, "revindex0", jv_int((long long)(len - i - 1)));
        jd_setc(c->a, d, "first", jv_bool(i == 0));
        jd_setc(c->a, d, "last", jv_bool(i + 1 == len));
        jd_setc(c->a, d, "length", jv_int((long long)len));
        jd_setc(c->a, d, "depth", jv_int(1));
        jd_setc(c->a, d, "depth0", jv_int(0));
        jd_setc(c->a, d, "previtem", i > 0 ? items->v[i - 1] : jv_undef("'loop' has no previous item"));
        jd_setc(c->a, d, "nextitem", i + 1 < len ? items->v[i + 1] : jv_undef("'loop' has no next item"));
        jfunc *cy = ja_alloc(c->a, sizeof *cy);
        cy->kind = FN_CYCLE;
        cy->name = "cycle";
        cy->idx = (long long)i;
        jd_setc(c->a, d, "cycle", (jv){.t = JV_FUNC, .u.fn = cy});
        jd_setc(c->a, d, "changed", (jv){.t = JV_FUNC, .u.fn = changed});
        assign(c, ls, "loop", loop);
        int r = exec(x, ls, n->v, n->nv, out);
        if (r < 0) return -1;
        if (r == 1) break;
    }
    if (!len && n->nw) return exec(x, s, n->w, n->nw, out);
    return 0;
}

static int exec_one(evalctx *x, jscope *s, const jnode *n, jbuf *out) {
    jctx *c = &x->c;
    c->line = n->line;
    switch (n->k) {
    case N_TEXT: jb_put(out, n->lit.u.s.p, n->lit.u.s.n); return 0;
    case N_OUT: {
        jv v;
        if (eval(x, s, n->a, &v)) return -1;
        jv_str_to(out, v);
        return 0;
    }
    case N_IF: {
        jv v;
        if (eval(x, s, n->a, &v)) return -1;
        if (jv_truthy(v)) return exec(x, s, n->v, n->nv, out);
        return exec(x, s, n->w, n->nw, out);
    }
    case N_FOR: return exec_for(x, s, n, out);
    case N_SET: {
        jv v;
        if (eval(x, s, n->a, &v)) return -1;
        c->line = n->line;
        if (n->name2) {
            jv ns = lookup(c, s, n->name);
            if (ns.t != JV_DICT || !ns.u.d->ns)
                return jx_fail(c, "TemplateRuntimeError: cannot assign attribute on non-namespace object");
            jd_setc(c->a, ns.u.d, n->name2, v);
            return 0;
        }
        return bind_targets(c, s, n, v);
    }
    case N_SETBLOCK: {
        jbuf b = {0};
        int r = exec(x, new_scope(c, s), n->v, n->nv, &b);
        jv v = jv_strdup(c->a, b.p ? b.p : "", b.n);
        jb_free(&b);
        if (r < 0) return -1;
        if (n->b) {
            jv saved = x->hole;
            x->hole = v;
            r = eval(x, s, n->b, &v);
            x->hole = saved;
            if (r) return -1;
        }
        assign(c, s, n->name, v);
        return 0;
    }
    case N_MACRO: {
        jfunc *f = ja_alloc(c->a, sizeof *f);
        f->kind = FN_MACRO;
        f->name = n->name;
        f->def = n;
        f->closure = s;
        assign(c, s, n->name, (jv){.t = JV_FUNC, .u.fn = f});
        return 0;
    }
    case N_CALLBLOCK: {
        jfunc *f = ja_alloc(c->a, sizeof *f);
        f->kind = FN_CALLER;
        f->name = "caller";
        f->def = n;
        f->closure = s;
        jv r;
        if (eval_call(x, s, n->a, (jv){.t = JV_FUNC, .u.fn = f}, &r)) return -1;
        jv_str_to(out, r);
        return 0;
    }
    case N_FILTERBLOCK: {
        jbuf b = {0};
        int r = exec(x, new_scope(c, s), n->v, n->nv, &b);
        jv v = jv_strdup(c->a, b.p ? b.p : "", b.n);
        jb_free(&b);
        if (r < 0) return -1;
        jv saved = x->hole;
        x->hole = v;
        r = eval(x, s, n->a, &v);
        x->hole = saved;
        if (r) return -1;
        jv_str_to(out, v);
        return 0;
    }
    case N_WITH: {
        jscope *ws = new_scope(c, s);
        for (size_t i = 0; i < n->nnames; i++) { /* values see the enclosing scope only */
            jv v;
            if (eval(x, s, n->w[i], &v)) return -1;
            assign(c, ws, n->names[i], v);
        }
        return exec(x, ws, n->v, n->nv, out);
    }
    case N_BREAK: return 1;
    case N_CONTINUE: return 2;
    case N_DO: {
        jv v;
        return eval(x, s, n->a, &v);
    }
    default: return jx_fail(c, "internal error: expression used as statement");
    }
}

/* Every evaluation and statement body counts one level: expressions the parser builds without recursion
 * (long operator or filter chains) and recursive macros are bounded by this count, not by the C stack. */
static int deeper(jctx *c) {
    if (++c->nest <= JX_MAX_NEST) return 0;
    c->nest--;
    return jx_fail(c, "RecursionError: maximum recursion depth exceeded (the template nests more than %d levels)",
                   JX_MAX_NEST);
}

static int eval(evalctx *x, jscope *s, const jnode *n, jv *out) {
    if (deeper(&x->c)) return -1;
    int r = eval_node(x, s, n, out);
    x->c.nest--;
    return r;
}

static int exec(evalctx *x, jscope *s, jnode *const *body, size_t nb, jbuf *out) {
    if (deeper(&x->c)) return -1;
    if (x->c.a->total + out->n > x->c.a->limit) { /* every loop iteration passes here */
        x->c.nest--;
        return jx_fail(&x->c, "MemoryError: rendering the template takes more than %zu MB", x->c.a->limit >> 20);
    }
    int r = 0;
    for (size_t i = 0; i < nb && !r; i++) r = exec_one(x, s, body[i], out);
    x->c.nest--;
    return r;
}

int jeval_render(jarena *a, jnode *const *body, size_t nb, json_t *vars, time_t now, jbuf *out, sl_err *e) {
    evalctx x = {.c = {.a = a, .e = e, .line = 1, .now = now}, .hole = jv_undef(NULL)};
    jscope *root = new_scope(&x.c, NULL);
    if (vars) {
        const char *k;
        json_t *v;
        json_object_foreach(vars, k, v) assign(&x.c, root, k, jv_from_json(a, v));
    }
    int r = exec(&x, root, body, nb, out);
    return r < 0 ? -1 : 0;
}
