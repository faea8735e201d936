/* Jinja2 filters and tests. Results that Jinja2 produces lazily (map, select, unique, items...) are marked as
 * generators so that json serialisation and len() fail on them just as they do in Python. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

typedef struct fargs {
    jv *v;
    size_t n;
    const char **kn;
    jv *kv;
    size_t nk;
} fargs;

/* Positional i, else keyword name, else dflt. */
static jv A(const fargs *a, size_t i, const char *name, jv dflt) {
    if (i < a->n) return a->v[i];
    for (size_t k = 0; k < a->nk; k++)
        if (name && !strcmp(a->kn[k], name)) return a->kv[k];
    return dflt;
}

static jv str_of(jctx *c, jv v) {
    return jv_to_str(c->a, v);
}

static jv gen_of(jv l) {
    l.u.l->gen = 1;
    return l;
}

/* attribute="a.b.0" lookup as Jinja's make_attrgetter does */
static int attr_get(jctx *c, jv item, jv attr, jv *out) {
    if (attr.t != JV_STR) return jx_getitem(c, item, attr, out);
    const char *p = attr.u.s.p, *end = p + attr.u.s.n;
    jv cur = item;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        jv key = jv_str(p, (size_t)(dot - p));
        int digits = dot > p;
        for (const char *q = p; q < dot; q++) digits &= *q >= '0' && *q <= '9';
        if (digits) key = jv_int(strtoll(p, NULL, 10));
        if (cur.t == JV_UNDEF) {
            *out = cur;
            return 0;
        }
        if (jx_getitem(c, cur, key, &cur)) return -1;
        p = dot + 1;
    }
    *out = cur;
    return 0;
}

/* ---- sorting ---- */
typedef struct sortctx {
    jctx *c;
    int err;
} sortctx;

static int cmp_keys(sortctx *s, jv a, jv b) {
    int r = 0;
    if (!s->err && jv_cmp(a, b, &r, s->c->e)) s->err = 1;
    return r;
}

/* stable merge sort of items by keys */
static void msort(sortctx *s, jv *keys, jv *items, jv *tk, jv *ti, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    msort(s, keys, items, tk, ti, h);
    msort(s, keys + h, items + h, tk, ti, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        if (cmp_keys(s, keys[j], keys[i]) < 0) {
            tk[k] = keys[j];
            ti[k++] = items[j++];
        } else {
            tk[k] = keys[i];
            ti[k++] = items[i++];
        }
    }
    while (i < h) {
        tk[k] = keys[i];
        ti[k++] = items[i++];
    }
    while (j < n) {
        tk[k] = keys[j];
        ti[k++] = items[j++];
    }
    memcpy(keys, tk, n * sizeof(jv));
    memcpy(items, ti, n * sizeof(jv));
}

static jv fold(jctx *c, jv v, int case_sensitive) {
    if (!case_sensitive && v.t == JV_STR) return js_case(c->a, v, CASE_LOWER);
    return v;
}

static int sort_list(jctx *c, jlist *l, jv *keys, int reverse, jlist **out) {
    size_t n = l->n;
    jv *items = ja_alloc(c->a, (n + 1) * sizeof(jv)), *tk = ja_alloc(c->a, (n + 1) * sizeof(jv)),
       *ti = ja_alloc(c->a, (n + 1) * sizeof(jv));
    memcpy(items, l->v, n * sizeof(jv));
    if (reverse) /* Python's reverse=True keeps stability by reversing, sorting, reversing */
        for (size_t i = 0; i < n / 2; i++) {
            jv t = items[i];
            items[i] = items[n - 1 - i];
            items[n - 1 - i] = t;
            t = keys[i];
            keys[i] = keys[n - 1 - i];
            keys[n - 1 - i] = t;
        }
    sortctx s = {c, 0};
    msort(&s, keys, items, tk, ti, n);
    if (s.err) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", c->e->msg);
        return jx_fail(c, "%s", msg);
    }
    if (reverse)
        for (size_t i = 0; i < n / 2; i++) {
            jv t = items[i];
            items[i] = items[n - 1 - i];
            items[n - 1 - i] = t;
        }
    jv r = jv_list(c->a, 0);
    r.u.l->v = items;
    r.u.l->n = n;
    r.u.l->cap = n + 1;
    *out = r.u.l;
    return 0;
}

/* ---- filters ---- */
typedef int (*filter_fn)(jctx *c, jv in, const fargs *a, jv *out);

static int f_tojson(jctx *c, jv in, const fargs *a, jv *out) {
    jv ind = A(a, 0, "indent", jv_none());
    jv sk = A(a, 1, "sort_keys", jv_bool(0));
    jv ea = A(a, 99, "ensure_ascii", jv_bool(0));
    jbuf b = {0};
    const char *istr = NULL;
    if (ind.t == JV_STR) istr = ja_strndup(c->a, ind.u.s.p, ind.u.s.n);
    int indent = jv_is_int(ind) ? (int)jv_ival(ind) : -1;
    if (jv_json(&b, in, indent < 0 && !istr ? -1 : indent, istr, jv_truthy(sk), jv_truthy(ea), c->e)) {
        jb_free(&b);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", c->e->msg);
        return jx_fail(c, "%s", msg);
    }
    *out = jv_strdup(c->a, b.p ? b.p : "", b.n);
    jb_free(&b);
    return 0;
}

static int f_length(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    switch (in.t) {
    case JV_STR: *out = jv_int((long long)ju_len(in.u.s.p, in.u.s.n)); return 0;
    case JV_LIST:
        if (in.u.l->gen) break;
        *out = jv_int((long long)in.u.l->n);
        return 0;
    case JV_DICT: *out = jv_int((long long)in.u.d->n); return 0;
    case JV_UNDEF: *out = jv_int(0); return 0;
    default: break;
    }
    return jx_fail(c, "TypeError: object of type '%s' has no len()", jv_typename(in));
}

static int f_trim(jctx *c, jv in, const fargs *a, jv *out) {
    jv ch = A(a, 0, "chars", jv_none());
    *out = js_strip(c->a, str_of(c, in), &ch, 1, 1);
    return 0;
}

static int f_upper(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    *out = js_case(c->a, str_of(c, in), CASE_UPPER);
    return 0;
}
static int f_lower(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    *out = js_case(c->a, str_of(c, in), CASE_LOWER);
    return 0;
}
static int f_title(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    *out = js_case(c->a, str_of(c, in), CASE_JTITLE);
    return 0;
}
static int f_capitalize(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    *out = js_case(c->a, str_of(c, in), CASE_CAPITALIZE);
    return 0;
}

static int f_default(jctx *c, jv in, const fargs *a, jv *out) {
    (void)c;
    jv d = A(a, 0, "default_value", jv_cstr(""));
    int boolean = jv_truthy(A(a, 1, "boolean", jv_bool(0)));
    *out = in.t == JV_UNDEF || (boolean && !jv_truthy(in)) ? d : in;
    return 0;
}

static int f_first(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    jlist *l;
    if (jx_iter(c, in, &l)) return -1;
    *out = l->n ? l->v[0] : jv_undef("'No first item, sequence was empty.'");
    return 0;
}

static int f_last(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    jlist *l;
    if (jx_iter(c, in, &l)) return -1;
    *out = l->n ? l->v[l->n - 1] : jv_undef("'No last item, sequence was empty.'");
    return 0;
}

static int f_join(jctx *c, jv in, const fargs *a, jv *out) {
    jv sep = str_of(c, A(a, 0, "d", jv_cstr("")));
    jv attr = A(a, 1, "attribute", jv_none());
    jlist *l;
    if (jx_iter(c, in, &l)) return -1;
    if (attr.t != JV_NONE) {
        jv m = jv_list(c->a, l->n);
        for (size_t i = 0; i < l->n; i++) {
            jv v;
            if (attr_get(c, l->v[i], attr, &v)) return -1;
            jl_push(c->a, m.u.l, v);
        }
        l = m.u.l;
    }
    *out = js_join(c, sep, l);
    return 0;
}

static int f_list(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    jlist *l;
    if (jx_iter(c, in, &l)) return -1;
    jv r = jv_list(c->a, l->n);
    for (size_t i = 0; i < l->n; i++) jl_push(c->a, r.u.l, l->v[i]);
    *out = r;
    return 0;
}

static int f_map(jctx *c, jv in, const fargs *a, jv *out) {
    jlist *l;
    if (!jv_truthy(in)) { /* Jinja's map yields nothing for a falsy value, None included */
        *out = gen_of(jv_list(c->a, 0));
        return 0;
    }
    if (jx_iter(c, in, &l)) return -1;
    jv r = jv_list(c->a, l->n);
    jv attr = A(a, 99, "attribute", jv_undef(NULL));
    if (attr.t != JV_UNDEF) {
        jv dflt = A(a, 99, "default", jv_undef(NULL));
        for (size_t i = 0; i < l->n; i++) {
            jv v;
            if (attr_get(c, l->v[i], attr, &v)) return -1;
            if (v.t == JV_UNDEF && dflt.t != JV_UNDEF) v = dflt;
            jl_push(c->a, r.u.l, v);
        }
    } else {
        if (!a->n || a->v[0].t != JV_STR) return jx_fail(c, "FilterArgumentError: map requires a filter argument");
        char *fname = ja_strndup(c->a, a->v[0].u.s.p, a->v[0].u.s.n);
        for (size_t i = 0; i < l->n; i++) {
            jv v;
            if (jx_filter(c, fname, l->v[i], a->v + 1, a->n - 1, a->kn, a->kv, a->nk, &v)) return -1;
            jl_push(c->a, r.u.l, v);
        }
    }
    *out = gen_of(r);
    return 0;
}

/* select/reject/selectattr/rejectattr */
static int select_common(jctx *c, jv in, const fargs *a, int use_attr, int want, jv *out) {
    jlist *l;
    if (!jv_truthy(in)) {
        *out = gen_of(jv_list(c->a, 0));
        return 0;
    }
    if (jx_iter(c, in, &l)) return -1;
    size_t off = use_attr ? 1 : 0;
    jv attr = use_attr ? A(a, 0, NULL, jv_none()) : jv_none();
    jv r = jv_list(c->a, l->n);
    char *tname = NULL;
    if (a->n > off) {
        if (a->v[off].t != JV_STR) return jx_fail(c, "TypeError: test name must be a string");
        tname = ja_strndup(c->a, a->v[off].u.s.p, a->v[off].u.s.n);
    }
    for (size_t i = 0; i < l->n; i++) {
        jv v = l->v[i];
        if (use_attr && attr_get(c, v, attr, &v)) return -1;
        int ok;
        if (tname) {
            if (jx_test(c, tname, v, a->v + off + 1, a->n - off - 1, &ok)) return -1;
        } else
            ok = jv_truthy(v);
        if (ok == want) jl_push(c->a, r.u.l, l->v[i]);
    }
    *out = gen_of(r);
    return 0;
}
static int f_select(jctx *c, jv in, const fargs *a, jv *out) {
    return select_common(c, in, a, 0, 1, out);
}
static int f_reject(jctx *c, jv in, const fargs *a, jv *out) {
    return select_common(c, in, a, 0, 0, out);
}
static int f_selectattr(jctx *c, jv in, const fargs *a, jv *out) {
    return select_common(c, in, a, 1, 1, out);
}
static int f_rejectattr(jctx *c, jv in, const fargs *a, jv *out) {
    return select_common(c, in, a, 1, 0, out);
}

static jv pairs(jctx *c, jdict *d) {
    jv l = jv_list(c->a, d->n);
    for (size_t i = 0; i < d->n; i++) {
        jv t = jv_list(c->a, 2);
        t.u.l->tuple = 1;
        jl_push(c->a, t.u.l, d->k[i]);
        jl_push(c->a, t.u.l, d->v[i]);
        jl_push(c->a, l.u.l, t);
    }
    return l;
}

static int f_items(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    if (in.t == JV_UNDEF) {
        *out = gen_of(jv_list(c->a, 0));
        return 0;
    }
    if (in.t != JV_DICT) return jx_fail(c, "TypeError: Can only get item pairs from a mapping.");
    *out = gen_of(pairs(c, in.u.d));
    return 0;
}

static int f_dictsort(jctx *c, jv in, const fargs *a, jv *out) {
    int cs = jv_truthy(A(a, 0, "case_sensitive", jv_bool(0)));
    jv by = A(a, 1, "by", jv_cstr("key"));
    int rev = jv_truthy(A(a, 2, "reverse", jv_bool(0)));
    if (in.t != JV_DICT) return jx_fail(c, "TypeError: dictsort needs a mapping");
    int pos = by.t == JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5);
    jlist *l = pairs(c, in.u.d).u.l;
    jv *keys = ja_alloc(c->a, (l->n + 1) * sizeof(jv));
    for (size_t i = 0; i < l->n; i++) keys[i] = fold(c, l->v[i].u.l->v[pos], cs);
    jlist *sorted;
    if (sort_list(c, l, keys, rev, &sorted)) return -1;
    *out = (jv){.t = JV_LIST, .u.l = sorted};
    return 0;
}

static int f_sort(jctx *c, jv in, const fargs *a, jv *out) {
    int rev = jv_truthy(A(a, 0, "reverse", jv_bool(0)));
    int cs = jv_truthy(A(a, 1, "case_sensitive", jv_bool(0)));
    jv attr = A(a, 2, "attribute", jv_none());
    jlist *l;
    if (jx_iter(c, in, &l)) return -1;
    jv *keys = ja_alloc(c->a, (l->n + 1) * sizeof(jv));
    for (size_t i = 0; i < l->n; i++) {
        jv k = l->v[i];
        if (attr.t != JV_NONE && attr_get(c, k, attr, &k)) return -1;
        keys[i] = fold(c, k, cs);
    }
    jlist *sorted;
    if (sort_list(c, l, keys, rev, &sorted)) return -1;
    *out = (jv){.t = JV_LIST, .u.l = sorted};
    return 0;
}

static int f_unique(jctx *c, jv in, const fargs *a, jv *out) {
    int cs = jv_truthy(A(a, 0, "case_sensitive", jv_bool(0)));
    jv attr = A(a, 1, "attribute", jv_none());
    jlist *l;
    if (jx_iter(c, in, &l)) return -1;
    jv r = jv_list(c->a, l->n), seen = jv_list(c->a, l->n);
    for (size_t i = 0; i < l->n; i++) {
        jv k = l->v[i];
        if (attr.t != JV_NONE && attr_get(c, k, attr, &k)) return -1;
        k = fold(c, k, cs);
        int dup = 0;
        for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = jv_eq(seen.u.l->v[j], k);
        if (dup) continue;
        jl_push(c->a, seen.u.l, k);
        jl_push(c->a, r.u.l, l->v[i]);
    }
    *out = gen_of(r);
    return 0;
}

static int f_replace(jctx *c, jv in, const fargs *a, jv *out) {
    jv old = str_of(c, A(a, 0, "old", jv_cstr(""))), nw = str_of(c, A(a, 1, "new", jv_cstr("")));
    jv cnt = A(a, 2, "count", jv_none());
    *out = js_replace(c->a, str_of(c, in), old, nw, cnt.t == JV_NONE ? -1 : jv_ival(cnt));
    return 0;
}

static int f_string(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    *out = str_of(c, in);
    return 0;
}

static int parse_num(jv s, int want_int, jv *out) {
    char buf[128];
    size_t k = 0;
    for (size_t i = 0; i < s.u.s.n && k + 1 < sizeof buf; i++)
        if (s.u.s.p[i] != '_') buf[k++] = s.u.s.p[i];
    buf[k] = 0;
    char *end;
    const char *p = buf;
    if (strpbrk(buf, "xXpP")) return -1; /* Python's int()/float() take no hex */
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    if (!*p) return -1;
    if (want_int) {
        long long v = strtoll(p, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        if (!*end && end != p) {
            *out = jv_int(v);
            return 0;
        }
    }
    double d = strtod(p, &end);
    while (*end == ' ' || *end == '\t' || *end == '\n') end++;
    if (*end || end == p) return -1;
    if (want_int && !isfinite(d)) return -1;
    *out = want_int ? jv_int((long long)d) : jv_float(d);
    return 0;
}

static int f_int(jctx *c, jv in, const fargs *a, jv *out) {
    if (in.t == JV_UNDEF) return jx_undef_fail(c, in);
    jv d = A(a, 0, "default", jv_int(0));
    if (in.t == JV_INT)
        *out = in;
    else if (in.t == JV_BOOL)
        *out = jv_int(in.u.b);
    else if (in.t == JV_FLOAT)
        *out = isfinite(in.u.f) ? jv_int((long long)in.u.f) : d;
    else if (in.t != JV_STR || parse_num(in, 1, out))
        *out = d;
    return 0;
}

static int f_float(jctx *c, jv in, const fargs *a, jv *out) {
    if (in.t == JV_UNDEF) return jx_undef_fail(c, in);
    jv d = A(a, 0, "default", jv_float(0.0));
    if (in.t == JV_FLOAT)
        *out = in;
    else if (jv_is_int(in))
        *out = jv_float((double)jv_ival(in));
    else if (in.t != JV_STR || parse_num(in, 0, out))
        *out = d;
    return 0;
}

static int f_abs(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    if (jv_is_int(in))
        *out = jv_int(llabs(jv_ival(in)));
    else if (in.t == JV_FLOAT)
        *out = jv_float(fabs(in.u.f));
    else
        return jx_fail(c, "TypeError: bad operand type for abs(): '%s'", jv_typename(in));
    return 0;
}

static int f_round(jctx *c, jv in, const fargs *a, jv *out) {
    long long prec = jv_ival(A(a, 0, "precision", jv_int(0)));
    jv method = A(a, 1, "method", jv_cstr("common"));
    if (in.t != JV_FLOAT && !jv_is_int(in)) return jx_fail(c, "TypeError: round needs a number");
    double v = in.t == JV_FLOAT ? in.u.f : (double)jv_ival(in), m = pow(10.0, (double)prec), r;
    jv meth = str_of(c, method);
    if (jv_is_int(in) && meth.u.s.n == 6 && !memcmp(meth.u.s.p, "common", 6) && prec >= 0) {
        *out = jv_int(jv_ival(in)); /* round(int, n) stays an int */
        return 0;
    }
    if (meth.u.s.n == 4 && !memcmp(meth.u.s.p, "ceil", 4))
        r = ceil(v * m) / m;
    else if (meth.u.s.n == 5 && !memcmp(meth.u.s.p, "floor", 5))
        r = floor(v * m) / m;
    else if (meth.u.s.n == 6 && !memcmp(meth.u.s.p, "common", 6))
        r = nearbyint(v * m) / m; /* half to even */
    else
        return jx_fail(c, "FilterArgumentError: method must be common, ceil or floor");
    *out = jv_float(r);
    return 0;
}

static int f_safe(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    *out = str_of(c, in);
    out->safe = 1;
    return 0;
}

static int f_escape(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    *out = jv_html_escape(c->a, in);
    return 0;
}

static int f_indent(jctx *c, jv in, const fargs *a, jv *out) {
    jv w = A(a, 0, "width", jv_int(4));
    int first = jv_truthy(A(a, 1, "first", jv_bool(0)));
    int blank = jv_truthy(A(a, 2, "blank", jv_bool(0)));
    if (w.t != JV_STR && jv_ival(w) > JX_MAX_WIDTH)
        return jx_fail(c, "ValueError: indent width %lld exceeds the template limit of %d", jv_ival(w), JX_MAX_WIDTH);
    /* the input is checked before the indent buffer exists, so failing leaks nothing */
    if (in.t == JV_UNDEF) return jx_undef_fail(c, in);
    if (in.t != JV_STR)
        return jx_fail(c, "TypeError: unsupported operand type(s) for +=: '%s' and 'str'", jv_typename(in));
    jbuf ind = {0};
    if (w.t == JV_STR)
        jb_put(&ind, w.u.s.p, w.u.s.n);
    else
        for (long long i = 0; i < jv_ival(w); i++) jb_putc(&ind, ' ');
    jv s = in;
    /* Jinja appends a newline before splitlines(), so a trailing newline is dropped */
    jbuf tmp = {0};
    jb_put(&tmp, s.u.s.p, s.u.s.n);
    jb_putc(&tmp, '\n');
    jv lines = js_splitlines(c->a, jv_str(tmp.p, tmp.n), 0);
    jbuf b = {0};
    if (first) jb_put(&b, ind.p ? ind.p : "", ind.n);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        jv ln = lines.u.l->v[i];
        if (i) {
            jb_putc(&b, '\n');
            if (blank || ln.u.s.n) jb_put(&b, ind.p ? ind.p : "", ind.n);
        }
        jb_put(&b, ln.u.s.p, ln.u.s.n);
    }
    *out = jv_strdup(c->a, b.p ? b.p : "", b.n);
    jb_free(&b);
    jb_free(&tmp);
    jb_free(&ind);
    return 0;
}

static int f_center(jctx *c, jv in, const fargs *a, jv *out) {
    long long width = jv_ival(A(a, 0, "width", jv_int(80)));
    jv s = str_of(c, in);
    long long len = (long long)ju_len(s.u.s.p, s.u.s.n);
    if (width <= len) {
        *out = s;
        return 0;
    }
    if (width > JX_MAX_WIDTH)
        return jx_fail(c, "ValueError: center width %lld exceeds the template limit of %d", width, JX_MAX_WIDTH);
    long long total = width - len, left = total / 2 + (total & width & 1);
    jbuf b = {0};
    for (long long i = 0; i < left; i++) jb_putc(&b, ' ');
    jb_put(&b, s.u.s.p, s.u.s.n);
    for (long long i = 0; i < total - left; i++) jb_putc(&b, ' ');
    *out = jv_strdup(c->a, b.p, b.n);
    jb_free(&b);
    return 0;
}

static int f_wordcount(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    jv s = str_of(c, in);
    long long n = 0;
    int inword = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char ch = (unsigned char)s.u.s.p[i];
        int w = ch >= 0x80 || ch == '_' || (ch >= '0' && ch <= '9') || ((ch | 32) >= 'a' && (ch | 32) <= 'z');
        if (w && !inword) n++;
        inword = w;
    }
    *out = jv_int(n);
    return 0;
}

static int f_sum(jctx *c, jv in, const fargs *a, jv *out) {
    jv attr = A(a, 0, "attribute", jv_none());
    jv acc = A(a, 1, "start", jv_int(0));
    jlist *l;
    if (jx_iter(c, in, &l)) return -1;
    for (size_t i = 0; i < l->n; i++) {
        jv v = l->v[i];
        if (attr.t != JV_NONE && attr_get(c, v, attr, &v)) return -1;
        if (jx_binop(c, OP_ADD, acc, v, &acc)) return -1;
    }
    *out = acc;
    return 0;
}

static int minmax(jctx *c, jv in, const fargs *a, int want_max, jv *out) {
    int cs = jv_truthy(A(a, 0, "case_sensitive", jv_bool(0)));
    jv attr = A(a, 1, "attribute", jv_none());
    jlist *l;
    if (jx_iter(c, in, &l)) return -1;
    if (!l->n) {
        *out = jv_undef("'No aggregated item, sequence was empty.'");
        return 0;
    }
    jv best = l->v[0], bk = best;
    if (attr.t != JV_NONE && attr_get(c, bk, attr, &bk)) return -1;
    bk = fold(c, bk, cs);
    for (size_t i = 1; i < l->n; i++) {
        jv k = l->v[i];
        if (attr.t != JV_NONE && attr_get(c, k, attr, &k)) return -1;
        k = fold(c, k, cs);
        int r;
        if (jv_cmp(k, bk, &r, c->e)) return -1;
        if (want_max ? r > 0 : r < 0) {
            best = l->v[i];
            bk = k;
        }
    }
    *out = best;
    return 0;
}
static int f_min(jctx *c, jv in, const fargs *a, jv *out) {
    return minmax(c, in, a, 0, out);
}
static int f_max(jctx *c, jv in, const fargs *a, jv *out) {
    return minmax(c, in, a, 1, out);
}

static int f_batch(jctx *c, jv in, const fargs *a, jv *out) {
    long long n = jv_ival(A(a, 0, "linecount", jv_int(1)));
    jv fill = A(a, 1, "fill_with", jv_none());
    int has_fill = a->n > 1;
    for (size_t k = 0; k < a->nk; k++) has_fill |= !strcmp(a->kn[k], "fill_with");
    if (n <= 0) return jx_fail(c, "ValueError: batch size must be positive");
    jlist *l;
    if (jx_iter(c, in, &l)) return -1;
    jv r = jv_list(c->a, 0), cur = jv_none();
    for (size_t i = 0; i < l->n; i++) {
        if (cur.t == JV_NONE) cur = jv_list(c->a, (size_t)(n < (long long)l->n ? n : (long long)l->n));
        jl_push(c->a, cur.u.l, l->v[i]);
        if ((long long)cur.u.l->n == n) {
            jl_push(c->a, r.u.l, cur);
            cur = jv_none();
        }
    }
    if (cur.t != JV_NONE) {
        if (has_fill && n > JX_MAX_WIDTH)
            return jx_fail(c, "ValueError: batch size %lld exceeds the template limit of %d", n, JX_MAX_WIDTH);
        while (has_fill && (long long)cur.u.l->n < n) jl_push(c->a, cur.u.l, fill);
        jl_push(c->a, r.u.l, cur);
    }
    *out = gen_of(r);
    return 0;
}

static int f_format(jctx *c, jv in, const fargs *a, jv *out) {
    jv t = jv_list(c->a, a->n);
    t.u.l->tuple = 1;
    for (size_t i = 0; i < a->n; i++) jl_push(c->a, t.u.l, a->v[i]);
    return jx_percent_format(c, str_of(c, in), t, out);
}

static int f_reverse(jctx *c, jv in, const fargs *a, jv *out) {
    (void)a;
    if (in.t == JV_STR) {
        jlist *l;
        if (jx_iter(c, in, &l)) return -1;
        jbuf b = {0};
        for (size_t i = l->n; i-- > 0;) jb_put(&b, l->v[i].u.s.p, l->v[i].u.s.n);
        *out = jv_strdup(c->a, b.p ? b.p : "", b.n);
        jb_free(&b);
        return 0;
    }
    jlist *l;
    if (jx_iter(c, in, &l)) return -1;
    jv r = jv_list(c->a, l->n);
    for (size_t i = l->n; i-- > 0;) jl_push(c->a, r.u.l, l->v[i]);
    *out = gen_of(r);
    return 0;
}

static int f_attr(jctx *c, jv in, const fargs *a, jv *out) {
    jv nm = A(a, 0, "name", jv_none());
    if (nm.t != JV_STR) return jx_fail(c, "TypeError: attribute name must be a string");
    if (in.t == JV_UNDEF) return jx_fail(c, "UndefinedError: value is undefined");
    return jx_getattr_only(c, in, ja_strndup(c->a, nm.u.s.p, nm.u.s.n), out);
}

static int f_truncate(jctx *c, jv in, const fargs *a, jv *out) {
    jv s = str_of(c, in);
    long long length = jv_ival(A(a, 0, "length", jv_int(255)));
    int killwords = jv_truthy(A(a, 1, "killwords", jv_bool(0)));
    jv end = str_of(c, A(a, 2, "end", jv_cstr("...")));
    long long leeway = jv_ival(A(a, 3, "leeway", jv_int(5)));
    long long len = (long long)ju_len(s.u.s.p, s.u.s.n), el = (long long)ju_len(end.u.s.p, end.u.s.n);
    if (len <= length + leeway) {
        *out = s;
        return 0;
    }
    size_t cut = ju_off(s.u.s.p, s.u.s.n, (size_t)(length - el > 0 ? length - el : 0));
    if (!killwords) {
        size_t k = cut;
        while (k > 0 && s.u.s.p[k - 1] != ' ') k--;
        if (k > 0) cut = k - 1;
    }
    jbuf b = {0};
    jb_put(&b, s.u.s.p, cut);
    jb_put(&b, end.u.s.p, end.u.s.n);
    *out = jv_strdup(c->a, b.p, b.n);
    jb_free(&b);
    return 0;
}

static const struct {
    const char *name;
    filter_fn fn;
} filters[] = {
    {"tojson", f_tojson},
    {"length", f_length},
    {"count", f_length},
    {"trim", f_trim},
    {"upper", f_upper},
    {"lower", f_lower},
    {"title", f_title},
    {"capitalize", f_capitalize},
    {"default", f_default},
    {"d", f_default},
    {"first", f_first},
    {"last", f_last},
    {"join", f_join},
    {"list", f_list},
    {"map", f_map},
    {"select", f_select},
    {"reject", f_reject},
    {"selectattr", f_selectattr},
    {"rejectattr", f_rejectattr},
    {"items", f_items},
    {"dictsort", f_dictsort},
    {"sort", f_sort},
    {"unique", f_unique},
    {"replace", f_replace},
    {"string", f_string},
    {"int", f_int},
    {"float", f_float},
    {"abs", f_abs},
    {"round", f_round},
    {"safe", f_safe},
    {"escape", f_escape},
    {"e", f_escape},
    {"forceescape", f_escape},
    {"indent", f_indent},
    {"center", f_center},
    {"wordcount", f_wordcount},
    {"sum", f_sum},
    {"min", f_min},
    {"max", f_max},
    {"batch", f_batch},
    {"format", f_format},
    {"reverse", f_reverse},
    {"attr", f_attr},
    {"truncate", f_truncate},
};

int jx_has_filter(const char *name) {
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (!strcmp(filters[i].name, name)) return 1;
    return 0;
}

int jx_filter(jctx *c, const char *name, jv in, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw,
              jv *out) {
    fargs a = {args, nargs, kwn, kwv, nkw};
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (!strcmp(filters[i].name, name)) {
            return filters[i].fn(c, in, &a, out);
        }
    return jx_fail(c, "TemplateRuntimeError: No filter named '%s' found.", name);
}

/* ---- tests ---- */
static int cmp_test(jctx *c, jv a, jv b, int *r) {
    if (a.t == JV_UNDEF || b.t == JV_UNDEF) return jx_fail(c, "UndefinedError: value is undefined");
    if (jv_cmp(a, b, r, c->e)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", c->e->msg);
        return jx_fail(c, "%s", msg);
    }
    return 0;
}

int jx_test(jctx *c, const char *t, jv v, jv *args, size_t nargs, int *res) {
    jv a0 = nargs ? args[0] : jv_undef(NULL);
    if (!strcmp(t, "defined"))
        *res = v.t != JV_UNDEF;
    else if (!strcmp(t, "undefined"))
        *res = v.t == JV_UNDEF;
    else if (!strcmp(t, "none"))
        *res = v.t == JV_NONE;
    else if (!strcmp(t, "boolean"))
        *res = v.t == JV_BOOL;
    else if (!strcmp(t, "true"))
        *res = v.t == JV_BOOL && v.u.b;
    else if (!strcmp(t, "false"))
        *res = v.t == JV_BOOL && !v.u.b;
    else if (!strcmp(t, "integer"))
        *res = v.t == JV_INT;
    else if (!strcmp(t, "float"))
        *res = v.t == JV_FLOAT;
    else if (!strcmp(t, "number"))
        *res = v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    else if (!strcmp(t, "string"))
        *res = v.t == JV_STR;
    else if (!strcmp(t, "mapping"))
        *res = v.t == JV_DICT && !v.u.d->ns;
    else if (!strcmp(t, "iterable"))
        *res = v.t == JV_STR || v.t == JV_LIST || (v.t == JV_DICT && !v.u.d->ns) || v.t == JV_UNDEF;
    else if (!strcmp(t, "sequence"))
        *res = v.t == JV_STR || (v.t == JV_LIST && !v.u.l->gen) || (v.t == JV_DICT && !v.u.d->ns) || v.t == JV_UNDEF;
    else if (!strcmp(t, "callable"))
        *res = v.t == JV_FUNC;
    else if (!strcmp(t, "sameas")) {
        if (v.t == JV_LIST || v.t == JV_DICT)
            *res = a0.t == v.t && (v.t == JV_LIST ? a0.u.l == v.u.l : a0.u.d == v.u.d);
        else
            *res = v.t == a0.t && jv_eq(v, a0);
    } else if (!strcmp(t, "escaped"))
        *res = 0;
    else if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        /* value % 2 == 1, value % 2 == 0, value % num == 0 with Python's modulo */
        jv m;
        if (jx_binop(c, OP_MOD, v, t[0] == 'd' ? a0 : jv_int(2), &m)) return -1;
        *res = jv_eq(m, jv_int(t[0] == 'o' ? 1 : 0));
    } else if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "=="))
        *res = jv_eq(v, a0);
    else if (!strcmp(t, "ne") || !strcmp(t, "!="))
        *res = !jv_eq(v, a0);
    else if (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<") || !strcmp(t, "le") || !strcmp(t, "<=") ||
             !strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">") || !strcmp(t, "ge") || !strcmp(t, ">=")) {
        int r;
        if (cmp_test(c, v, a0, &r)) return -1;
        if (t[0] == 'l' || t[0] == '<')
            *res = (t[1] == 'e' || t[1] == '=') ? r <= 0 : r < 0;
        else
            *res = (t[1] == 'e' || t[1] == '=') ? r >= 0 : r > 0;
    } else if (!strcmp(t, "in")) {
        jv r;
        if (jx_binop(c, OP_IN, v, a0, &r)) return -1;
        *res = r.u.b;
    } else if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        jv s = jv_to_str(c->a, v);
        *res = jv_eq(s, js_case(c->a, s, t[0] == 'l' ? CASE_LOWER : CASE_UPPER));
    } else if (!strcmp(t, "filter")) {
        *res = a0.t == JV_STR && jx_has_filter(ja_strndup(c->a, a0.u.s.p, a0.u.s.n));
        if (v.t == JV_STR) *res = jx_has_filter(ja_strndup(c->a, v.u.s.p, v.u.s.n));
    } else if (!strcmp(t, "test"))
        *res = v.t == JV_STR && jx_has_test(ja_strndup(c->a, v.u.s.p, v.u.s.n));
    else
        return jx_fail(c, "TemplateRuntimeError: No test named '%s' found.", t);
    return 0;
}

int jx_has_test(const char *t) {
    static const char *const tests[] = {
        "defined", "undefined", "none",        "boolean",  "true",     "false",    "integer",     "float",
        "number",  "string",    "mapping",     "iterable", "sequence", "callable", "sameas",      "escaped",
        "odd",     "even",      "divisibleby", "eq",       "equalto",  "==",       "ne",          "!=",
        "lt",      "lessthan",  "<",           "le",       "<=",       "gt",       "greaterthan", ">",
        "ge",      ">=",        "in",          "lower",    "upper",    "filter",   "test",        NULL};
    for (int i = 0; tests[i]; i++)
        if (!strcmp(tests[i], t)) return 1;
    return 0;
}
