/* Operators and iteration with Python semantics: arithmetic, comparison, membership, concatenation and
 * printf-style str % args. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "text/jinja_int.h"

int jx_iter(jctx *c, jv v, jlist **out) {
    switch (v.t) {
    case JV_LIST: *out = v.u.l; return 0;
    case JV_DICT: {
        if (v.u.d->ns) break;
        jv l = jv_list(c->a, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) jl_push(c->a, l.u.l, v.u.d->k[i]);
        *out = l.u.l;
        return 0;
    }
    case JV_STR: {
        jv l = jv_list(c->a, v.u.s.n);
        size_t n = ju_len(v.u.s.p, v.u.s.n);
        for (size_t i = 0, o = 0; i < n; i++) {
            size_t e = ju_off(v.u.s.p, v.u.s.n, i + 1);
            jl_push(c->a, l.u.l, jv_str(v.u.s.p + o, e - o));
            o = e;
        }
        *out = l.u.l;
        return 0;
    }
    case JV_UNDEF: *out = jv_list(c->a, 0).u.l; return 0;
    default: break;
    }
    return jx_fail(c, "TypeError: '%s' object is not iterable", jv_typename(v));
}

static int is_num(jv v) {
    return jv_is_int(v) || v.t == JV_FLOAT;
}
static double fval(jv v) {
    return v.t == JV_FLOAT ? v.u.f : (double)jv_ival(v);
}

static const char *opname(int op) {
    static const char *const names[] = {"+",  "-",  "*", "/", "//", "%",  "**", "~",
                                        "==", "!=", "<", ">", "<=", ">=", "in", "not in"};
    return names[op];
}

/* Python's str/list * n. Python would build any size that memory allows; a template has no use for more
 * than 16 MiB of text or 1 Mi items, and a hostile one must not make us try. */
static int repeat(jctx *c, jv s, long long k, jv *out) {
    size_t unit = s.t == JV_STR ? s.u.s.n : s.u.l->n, max = s.t == JV_STR ? 16u << 20 : 1u << 20;
    if (k > 0 && unit && (unsigned long long)k > max / unit)
        return jx_fail(c, "MemoryError: repeating a %s of length %zu %lld times exceeds the template limit of %zu %s",
                       jv_typename(s), unit, k, max, s.t == JV_STR ? "bytes" : "items");
    if (k < 0 || !unit) k = 0;
    if (s.t == JV_STR) {
        jbuf b = {0};
        for (long long i = 0; i < k; i++) jb_put(&b, s.u.s.p, s.u.s.n);
        *out = jv_strdup(c->a, b.p ? b.p : "", b.n);
        jb_free(&b);
        return 0;
    }
    jv r = jv_list(c->a, (size_t)k * unit);
    r.u.l->tuple = s.u.l->tuple;
    for (long long i = 0; i < k; i++)
        for (size_t j = 0; j < s.u.l->n; j++) jl_push(c->a, r.u.l, s.u.l->v[j]);
    *out = r;
    return 0;
}

/* Python ints do not overflow; ours are 64-bit, so a result that does not fit is an error, not a wrap. */
static int int_overflow(jctx *c, const char *op, long long x, long long y) {
    return jx_fail(c, "OverflowError: %lld %s %lld does not fit in a 64-bit integer", x, op, y);
}

/* x ** y for y >= 0 by squaring: log2(y) steps, each checked. */
static int int_pow(jctx *c, long long x, long long y, long long *out) {
    long long r = 1, b = x, e = y;
    for (;;) {
        if ((e & 1) && __builtin_mul_overflow(r, b, &r)) return int_overflow(c, "**", x, y);
        e >>= 1;
        if (!e) break;
        if (__builtin_mul_overflow(b, b, &b)) return int_overflow(c, "**", x, y);
    }
    *out = r;
    return 0;
}

static int contains(jctx *c, jv item, jv box, int *r) {
    switch (box.t) {
    case JV_UNDEF: *r = 0; return 0;
    case JV_STR:
        if (item.t != JV_STR)
            return jx_fail(c, "TypeError: 'in <string>' requires string as left operand, not %s", jv_typename(item));
        *r = js_find(box, item, 0) >= 0;
        return 0;
    case JV_LIST:
        *r = 0;
        for (size_t i = 0; i < box.u.l->n; i++)
            if (jv_eq(box.u.l->v[i], item)) *r = 1;
        return 0;
    case JV_DICT: {
        jv tmp;
        if ((item.t == JV_LIST && !item.u.l->tuple) || item.t == JV_DICT)
            return jx_fail(c, "TypeError: unhashable type: '%s'", jv_typename(item));
        *r = jd_get(box.u.d, item, &tmp);
        return 0;
    }
    default: return jx_fail(c, "TypeError: argument of type '%s' is not iterable", jv_typename(box));
    }
}

int jx_binop(jctx *c, int op, jv a, jv b, jv *out) {
    switch (op) {
    case OP_CAT: {
        jbuf buf = {0};
        jv_str_to(&buf, a);
        jv_str_to(&buf, b);
        *out = jv_strdup(c->a, buf.p ? buf.p : "", buf.n);
        jb_free(&buf);
        return 0;
    }
    case OP_EQ: *out = jv_bool(jv_eq(a, b)); return 0;
    case OP_NE: *out = jv_bool(!jv_eq(a, b)); return 0;
    case OP_IN:
    case OP_NOTIN: {
        int r = 0;
        if (contains(c, a, b, &r)) return -1;
        *out = jv_bool(op == OP_IN ? r : !r);
        return 0;
    }
    default: break;
    }
    if (a.t == JV_UNDEF) return jx_undef_fail(c, a);
    if (b.t == JV_UNDEF) return jx_undef_fail(c, b);
    if (op >= OP_LT && op <= OP_GE) {
        int r;
        if (jv_cmp(a, b, &r, c->e)) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", c->e->msg);
            return jx_fail(c, "%s", msg);
        }
        *out = jv_bool(op == OP_LT ? r < 0 : op == OP_GT ? r > 0 : op == OP_LE ? r <= 0 : r >= 0);
        return 0;
    }
    if (is_num(a) && is_num(b)) {
        int ints = jv_is_int(a) && jv_is_int(b);
        long long x = ints ? jv_ival(a) : 0, y = ints ? jv_ival(b) : 0;
        double fx = fval(a), fy = fval(b);
        switch (op) {
        case OP_ADD:
        case OP_SUB:
        case OP_MUL: {
            if (!ints) {
                *out = jv_float(op == OP_ADD ? fx + fy : op == OP_SUB ? fx - fy : fx * fy);
                return 0;
            }
            long long r = 0;
            int ovf = op == OP_ADD   ? __builtin_add_overflow(x, y, &r)
                      : op == OP_SUB ? __builtin_sub_overflow(x, y, &r)
                                     : __builtin_mul_overflow(x, y, &r);
            if (ovf) return int_overflow(c, opname(op), x, y);
            *out = jv_int(r);
            return 0;
        }
        case OP_DIV:
            if (fy == 0) return jx_fail(c, "ZeroDivisionError: division by zero");
            *out = jv_float(fx / fy);
            return 0;
        case OP_FDIV:
        case OP_MOD:
            if (ints) {
                if (!y) return jx_fail(c, "ZeroDivisionError: integer division or modulo by zero");
                /* LLONG_MIN // -1 is the one quotient that does not fit (and traps in C); the remainder is 0 */
                if (y == -1) {
                    if (op == OP_FDIV && x == LLONG_MIN) return int_overflow(c, "//", x, y);
                    *out = jv_int(op == OP_FDIV ? -x : 0);
                    return 0;
                }
                long long q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = jv_int(op == OP_FDIV ? q : m);
            } else {
                if (fy == 0) return jx_fail(c, "ZeroDivisionError: float modulo");
                /* CPython's float divmod */
                double m = fmod(fx, fy), div = (fx - m) / fy;
                if (m && ((m < 0) != (fy < 0))) {
                    m += fy;
                    div -= 1.0;
                }
                double fl = floor(div);
                if (div - fl > 0.5) fl += 1.0;
                *out = jv_float(op == OP_FDIV ? fl : m);
            }
            return 0;
        case OP_POW:
            if (ints && y >= 0) {
                long long r = 0;
                if (int_pow(c, x, y, &r)) return -1;
                *out = jv_int(r);
            } else
                *out = jv_float(pow(fx, fy));
            return 0;
        }
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        int safe = a.safe || b.safe;
        if (safe) { /* Markup + str escapes the plain side */
            a = jv_html_escape(c->a, a);
            b = jv_html_escape(c->a, b);
        }
        char *p = ja_alloc(c->a, a.u.s.n + b.u.s.n + 1);
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        *out = jv_str(p, a.u.s.n + b.u.s.n);
        out->safe = (unsigned char)safe;
        return 0;
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST && !a.u.l->gen && !b.u.l->gen &&
        a.u.l->tuple == b.u.l->tuple) {
        jv r = jv_list(c->a, a.u.l->n + b.u.l->n);
        r.u.l->tuple = a.u.l->tuple;
        for (size_t i = 0; i < a.u.l->n; i++) jl_push(c->a, r.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) jl_push(c->a, r.u.l, b.u.l->v[i]);
        *out = r;
        return 0;
    }
    if (op == OP_MUL && (a.t == JV_STR || (a.t == JV_LIST && !a.u.l->gen)) && jv_is_int(b))
        return repeat(c, a, jv_ival(b), out);
    if (op == OP_MUL && (b.t == JV_STR || (b.t == JV_LIST && !b.u.l->gen)) && jv_is_int(a))
        return repeat(c, b, jv_ival(a), out);
    if (op == OP_MOD && a.t == JV_STR) return jx_percent_format(c, a, b, out);
    if (op == OP_ADD && a.t == JV_STR)
        return jx_fail(c, "TypeError: can only concatenate str (not \"%s\") to str", jv_typename(b));
    if (op == OP_ADD && a.t == JV_LIST && !a.u.l->gen)
        return jx_fail(c, "TypeError: can only concatenate %s (not \"%s\") to %s", jv_typename(a), jv_typename(b),
                       jv_typename(a));
    return jx_fail(c, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", opname(op), jv_typename(a),
                   jv_typename(b));
}

/* printf-style formatting of str % args */
int jx_percent_format(jctx *c, jv fmt, jv args, jv *out) {
    jv *av = &args;
    size_t an = 1, ai = 0;
    if (args.t == JV_LIST && args.u.l->tuple) {
        av = args.u.l->v;
        an = args.u.l->n;
    }
    jbuf b = {0};
    const char *p = fmt.u.s.p, *end = p + fmt.u.s.n;
    while (p < end) {
        if (*p != '%') {
            jb_putc(&b, *p++);
            continue;
        }
        p++;
        if (p < end && *p == '%') {
            jb_putc(&b, '%');
            p++;
            continue;
        }
        char spec[32];
        size_t k = 0;
        spec[k++] = '%';
        while (p < end && strchr("-+ 0#", *p) && k < 8) spec[k++] = *p++;
        while (p < end && ((*p >= '0' && *p <= '9') || *p == '.') && k < 20) spec[k++] = *p++;
        if (p >= end) {
            jb_free(&b);
            return jx_fail(c, "ValueError: incomplete format");
        }
        char conv = *p++;
        if (ai >= an) {
            jb_free(&b);
            return jx_fail(c, "TypeError: not enough arguments for format string");
        }
        jv v = av[ai++];
        switch (conv) {
        case 's':
        case 'r': {
            jbuf t = {0};
            if (conv == 's')
                jv_str_to(&t, v);
            else
                jv_repr_to(&t, v);
            spec[k++] = 's';
            spec[k] = 0;
            jb_printf(&b, spec, t.p ? t.p : "");
            jb_free(&t);
            break;
        }
        case 'd':
        case 'i':
        case 'x':
        case 'X':
        case 'o':
            if (!is_num(v)) {
                jb_free(&b);
                return jx_fail(c, "TypeError: %%%c format: a number is required, not %s", conv, jv_typename(v));
            }
            spec[k++] = 'l';
            spec[k++] = 'l';
            spec[k++] = conv == 'i' ? 'd' : conv;
            spec[k] = 0;
            jb_printf(&b, spec, jv_ival(v));
            break;
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G':
            if (!is_num(v)) {
                jb_free(&b);
                return jx_fail(c, "TypeError: must be real number, not %s", jv_typename(v));
            }
            spec[k++] = conv;
            spec[k] = 0;
            jb_printf(&b, spec, fval(v));
            break;
        case 'c':
            if (v.t == JV_STR)
                jb_put(&b, v.u.s.p, v.u.s.n);
            else
                jb_putc(&b, (char)jv_ival(v));
            break;
        default: jb_free(&b); return jx_fail(c, "ValueError: unsupported format character '%c'", conv);
        }
    }
    /* Python skips this check when the argument is a mapping-like object (lists and dicts included) */
    int mapping = (args.t == JV_LIST && !args.u.l->tuple) || args.t == JV_DICT || args.t == JV_UNDEF;
    if (ai < an && !mapping) {
        jb_free(&b);
        return jx_fail(c, "TypeError: not all arguments converted during string formatting");
    }
    *out = jv_strdup(c->a, b.p ? b.p : "", b.n);
    jb_free(&b);
    return 0;
}
