/* Attribute and item access, global functions and methods of str/dict/list, with the restrictions of
 * Jinja2's ImmutableSandboxedEnvironment (no mutating methods). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

static const char *const str_methods[] = {
    "startswith", "endswith", "split",      "rsplit",     "strip",        "lstrip",       "rstrip",  "upper",
    "lower",      "title",    "capitalize", "replace",    "find",         "rfind",        "index",   "rindex",
    "count",      "join",     "format",     "splitlines", "isdigit",      "isalpha",      "isalnum", "isspace",
    "islower",    "isupper",  "isnumeric",  "isdecimal",  "removeprefix", "removesuffix", "center",  "ljust",
    "rjust",      "zfill",    "partition",  "rpartition", "swapcase",     "casefold",     NULL};
static const char *const dict_methods[] = {"items",   "keys",   "values",     "get",   "copy", "pop",
                                           "popitem", "update", "setdefault", "clear", NULL};
static const char *const list_methods[] = {"index", "count",  "copy",    "append", "extend", "insert",
                                           "pop",   "remove", "reverse", "sort",   "clear",  NULL};
/* what ImmutableSandboxedEnvironment refuses */
static const char *const unsafe_methods[] = {"pop",    "popitem", "update", "setdefault", "clear", "append",
                                             "extend", "insert",  "remove", "reverse",    "sort",  NULL};

static int in_list(const char *const *l, const char *s) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], s)) return 1;
    return 0;
}

static jv method(jctx *c, jv self, const char *name) {
    jfunc *f = ja_alloc(c->a, sizeof *f);
    f->kind = FN_METHOD;
    f->name = ja_strndup(c->a, name, strlen(name));
    f->self = self;
    return (jv){.t = JV_FUNC, .u.fn = f};
}

static jv missing_attr(jctx *c, jv obj, const char *name) {
    jbuf b = {0};
    jb_printf(&b, "'%s object' has no attribute '%s'", obj.t == JV_DICT ? "dict" : jv_typename(obj), name);
    jv r = jv_undef(ja_strndup(c->a, b.p, b.n));
    jb_free(&b);
    return r;
}

int jx_getattr(jctx *c, jv obj, const char *name, jv *out) {
    switch (obj.t) {
    case JV_DICT:
        if (!obj.u.d->ns && in_list(dict_methods, name)) {
            *out = method(c, obj, name);
            return 0;
        }
        if (jd_getc(obj.u.d, name, out)) return 0;
        break;
    case JV_STR:
        if (in_list(str_methods, name)) {
            *out = method(c, obj, name);
            return 0;
        }
        break;
    case JV_LIST:
        if (!obj.u.l->gen && in_list(list_methods, name)) {
            *out = method(c, obj, name);
            return 0;
        }
        break;
    default: break;
    }
    *out = missing_attr(c, obj, name);
    return 0;
}

int jx_getattr_only(jctx *c, jv obj, const char *name, jv *out) {
    if (obj.t == JV_DICT && !obj.u.d->ns && !in_list(dict_methods, name)) {
        *out = missing_attr(c, obj, name);
        return 0;
    }
    return jx_getattr(c, obj, name, out);
}

int jx_getitem(jctx *c, jv obj, jv key, jv *out) {
    if (obj.t == JV_DICT) {
        if (jd_get(obj.u.d, key, out)) return 0;
        if (key.t == JV_STR) {
            char *nm = ja_strndup(c->a, key.u.s.p, key.u.s.n);
            if (!obj.u.d->ns && in_list(dict_methods, nm)) return jx_getattr(c, obj, nm, out);
            *out = missing_attr(c, obj, nm);
            return 0;
        }
        *out = jv_undef("'dict object' has no such key");
        return 0;
    }
    if ((obj.t == JV_LIST && !obj.u.l->gen) || obj.t == JV_STR) {
        if (key.t == JV_INT || key.t == JV_BOOL) {
            long long i = key.t == JV_INT ? key.u.i : key.u.b;
            long long n = obj.t == JV_STR ? (long long)ju_len(obj.u.s.p, obj.u.s.n) : (long long)obj.u.l->n;
            if (i < 0) i += n;
            if (i < 0 || i >= n) {
                *out = jv_undef(obj.t == JV_STR ? "'str object' has no such index" : "'list object' has no such index");
                return 0;
            }
            if (obj.t == JV_LIST)
                *out = obj.u.l->v[i];
            else {
                size_t o = ju_off(obj.u.s.p, obj.u.s.n, (size_t)i), e = ju_off(obj.u.s.p, obj.u.s.n, (size_t)i + 1);
                *out = jv_str(obj.u.s.p + o, e - o);
            }
            return 0;
        }
        if (key.t == JV_STR) {
            char *nm = ja_strndup(c->a, key.u.s.p, key.u.s.n);
            return jx_getattr(c, obj, nm, out);
        }
    }
    *out = jv_undef("'object' has no such item");
    return 0;
}

jv jx_global(jarena *a, const char *name) {
    static const char *const globals[] = {"range", "dict", "namespace", "raise_exception", "strftime_now", NULL};
    for (int i = 0; globals[i]; i++)
        if (!strcmp(globals[i], name)) {
            jfunc *f = ja_alloc(a, sizeof *f);
            f->kind = FN_GLOBAL;
            f->name = globals[i];
            return (jv){.t = JV_FUNC, .u.fn = f};
        }
    return jv_undef(NULL);
}

static int kwarg(const char **kwn, jv *kwv, size_t nkw, const char *name, jv *out) {
    for (size_t i = 0; i < nkw; i++)
        if (!strcmp(kwn[i], name)) {
            *out = kwv[i];
            return 1;
        }
    return 0;
}

/* Positional argument i, else keyword name, else the default. */
static jv arg(jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, size_t i, const char *name, jv dflt) {
    jv v;
    if (i < nargs) return args[i];
    if (name && kwarg(kwn, kwv, nkw, name, &v)) return v;
    return dflt;
}

static int call_global(jctx *c, const char *name, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw,
                       jv *out) {
    if (!strcmp(name, "range")) {
        long long start = 0, stop, step = 1;
        for (size_t i = 0; i < nargs; i++)
            if (!jv_is_int(args[i]))
                return jx_fail(c, "TypeError: range() needs integers, not %s", jv_typename(args[i]));
        if (nargs == 1)
            stop = jv_ival(args[0]);
        else if (nargs == 2 || nargs == 3) {
            start = jv_ival(args[0]);
            stop = jv_ival(args[1]);
            if (nargs == 3) step = jv_ival(args[2]);
        } else
            return jx_fail(c, "TypeError: range expected 1 to 3 arguments, got %zu", nargs);
        if (!step) return jx_fail(c, "ValueError: range() arg 3 must not be zero");
        /* The span and the step as unsigned magnitudes: stop - start overflows a long long for the widest
           ranges, and -step does for LLONG_MIN. */
        unsigned long long span = 0, mag = step > 0 ? (unsigned long long)step : 0ULL - (unsigned long long)step;
        if (step > 0 && stop > start) span = (unsigned long long)stop - (unsigned long long)start;
        if (step < 0 && start > stop) span = (unsigned long long)start - (unsigned long long)stop;
        unsigned long long n = span / mag + (span % mag != 0);
        if (n > 100000) /* the sandbox's MAX_RANGE */
            return jx_fail(c,
                           "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jv l = jv_list(c->a, (size_t)n);
        /* by count, in unsigned steps: start + k * step stays in range, while i += step past stop would not */
        for (unsigned long long k = 0; k < n; k++)
            jl_push(c->a, l.u.l, jv_int((long long)((unsigned long long)start + k * (unsigned long long)step)));
        *out = l;
        return 0;
    }
    if (!strcmp(name, "dict") || !strcmp(name, "namespace")) {
        jv d = jv_dict(c->a);
        d.u.d->ns = name[0] == 'n';
        for (size_t i = 0; i < nargs; i++) {
            if (args[i].t == JV_DICT)
                for (size_t k = 0; k < args[i].u.d->n; k++) jd_set(c->a, d.u.d, args[i].u.d->k[k], args[i].u.d->v[k]);
            else if (args[i].t == JV_LIST)
                for (size_t k = 0; k < args[i].u.l->n; k++) {
                    jv pr = args[i].u.l->v[k];
                    if (pr.t != JV_LIST || pr.u.l->n != 2)
                        return jx_fail(c, "ValueError: dictionary update sequence element has wrong length");
                    jd_set(c->a, d.u.d, pr.u.l->v[0], pr.u.l->v[1]);
                }
            else
                return jx_fail(c, "TypeError: '%s' object is not iterable", jv_typename(args[i]));
        }
        for (size_t i = 0; i < nkw; i++) jd_setc(c->a, d.u.d, kwn[i], kwv[i]);
        *out = d;
        return 0;
    }
    if (!strcmp(name, "raise_exception")) {
        jbuf b = {0};
        if (nargs) jv_str_to(&b, args[0]);
        int r = jx_fail(c, "TemplateError: %s", b.p ? b.p : "");
        jb_free(&b);
        return r;
    }
    if (!strcmp(name, "strftime_now")) {
        if (nargs < 1 || args[0].t != JV_STR) return jx_fail(c, "TypeError: strftime_now() needs a format string");
        struct tm tm;
        time_t now = c->now;
        localtime_r(&now, &tm);
        char fmt[256], buf[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)args[0].u.s.n, args[0].u.s.p);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        *out = jv_strdup(c->a, buf, n);
        return 0;
    }
    return jx_fail(c, "TypeError: '%s' is not callable", name);
}

static int need_str(jctx *c, jv v, const char *what) {
    if (v.t != JV_STR) return jx_fail(c, "TypeError: %s argument must be str, not %s", what, jv_typename(v));
    return 0;
}

/* Python's format-spec mini-language: [[fill]align][sign][0][width][.precision][type]. */
static int format_spec(jctx *c, jbuf *b, jv v, const char *spec) {
    char fill = ' ', align = 0, sign = 0, type = 0;
    const char *s = spec;
    if (s[0] && strchr("<>^=", s[1]) && s[1]) {
        fill = s[0];
        align = s[1];
        s += 2;
    } else if (*s && strchr("<>^=", *s))
        align = *s++;
    if (*s == '+' || *s == '-' || *s == ' ') sign = *s++;
    if (*s == '0') {
        if (!align) {
            fill = '0';
            align = '=';
        }
        s++;
    }
    int width = 0, prec = -1;
    while (*s >= '0' && *s <= '9' && width <= JX_MAX_WIDTH) width = width * 10 + (*s++ - '0');
    if (*s == '.') {
        prec = 0;
        s++;
        while (*s >= '0' && *s <= '9' && prec <= JX_MAX_WIDTH) prec = prec * 10 + (*s++ - '0');
    }
    if (width > JX_MAX_WIDTH || prec > JX_MAX_WIDTH)
        return jx_fail(c, "ValueError: format width or precision in '%s' exceeds the template limit of %d", spec,
                       JX_MAX_WIDTH);
    if (*s) type = *s++;
    if (*s) return jx_fail(c, "ValueError: Invalid format specifier '%s'", spec);
    jbuf t = {0};
    int numeric = v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    if (type && strchr("dfFeEgGxXob%", type)) {
        if (!numeric) {
            jb_free(&t);
            return jx_fail(c, "ValueError: Unknown format code '%c' for object of type '%s'", type, jv_typename(v));
        }
        double f = v.t == JV_FLOAT ? v.u.f : (double)(v.t == JV_INT ? v.u.i : v.u.b);
        char fmt[16];
        if (type == 'd' || type == 'x' || type == 'X' || type == 'o') {
            snprintf(fmt, sizeof fmt, "%%%s%s",
                     sign == '+'   ? "+"
                     : sign == ' ' ? " "
                                   : "",
                     type == 'd'   ? "lld"
                     : type == 'x' ? "llx"
                     : type == 'X' ? "llX"
                                   : "llo");
            jb_printf(&t, fmt, jv_ival(jv_float(f)));
        } else {
            snprintf(fmt, sizeof fmt, "%%%s.%d%c",
                     sign == '+'   ? "+"
                     : sign == ' ' ? " "
                                   : "",
                     prec < 0 ? 6 : prec, type == '%' ? 'f' : type);
            jb_printf(&t, fmt, type == '%' ? f * 100 : f);
            if (type == '%') jb_putc(&t, '%');
        }
    } else {
        jv_str_to(&t, v);
        if (prec >= 0 && v.t == JV_STR) t.n = ju_off(t.p, t.n, (size_t)prec);
    }
    if (!align) align = numeric ? '>' : '<';
    long long len = t.p ? (long long)ju_len(t.p, t.n) : 0, padn = width > len ? width - len : 0;
    long long left = align == '>' || align == '=' ? padn : align == '^' ? padn / 2 : 0;
    for (long long i = 0; i < left; i++) jb_putc(b, fill);
    if (t.p) jb_put(b, t.p, t.n);
    for (long long i = 0; i < padn - left; i++) jb_putc(b, fill);
    jb_free(&t);
    return 0;
}

static int str_format(jctx *c, jv self, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, jv *out) {
    jbuf b = {0};
    const char *p = self.u.s.p, *end = p + self.u.s.n;
    size_t auto_i = 0;
    while (p < end) {
        if (*p == '{' && p + 1 < end && p[1] == '{') {
            jb_putc(&b, '{');
            p += 2;
            continue;
        }
        if (*p == '}' && p + 1 < end && p[1] == '}') {
            jb_putc(&b, '}');
            p += 2;
            continue;
        }
        if (*p != '{') {
            jb_putc(&b, *p++);
            continue;
        }
        const char *q = memchr(p, '}', (size_t)(end - p));
        if (!q) {
            jb_free(&b);
            return jx_fail(c, "ValueError: Single '{' encountered in format string");
        }
        char field[128];
        snprintf(field, sizeof field, "%.*s", (int)(q - p - 1), p + 1);
        char *colon = strchr(field, ':'), *spec = NULL;
        if (colon) {
            *colon = 0;
            spec = colon + 1;
        }
        jv v;
        if (!field[0])
            v = auto_i < nargs ? args[auto_i++] : jv_undef(NULL);
        else if (field[0] >= '0' && field[0] <= '9') {
            size_t i = (size_t)atoi(field);
            v = i < nargs ? args[i] : jv_undef(NULL);
        } else if (!kwarg(kwn, kwv, nkw, field, &v))
            v = jv_undef(NULL);
        if (v.t == JV_UNDEF) {
            jb_free(&b);
            return jx_fail(c, "IndexError: Replacement index out of range for positional args tuple");
        }
        if (spec && *spec) {
            if (format_spec(c, &b, v, spec)) {
                jb_free(&b);
                return -1;
            }
        } else
            jv_str_to(&b, v);
        p = q + 1;
    }
    *out = jv_strdup(c->a, b.p ? b.p : "", b.n);
    jb_free(&b);
    return 0;
}

static int str_pred(jv s, int (*pred)(int)) {
    if (!s.u.s.n) return 0;
    for (size_t i = 0; i < s.u.s.n; i++)
        if (!pred((unsigned char)s.u.s.p[i])) return 0;
    return 1;
}
static int c_lower(int ch) {
    return ch >= 'a' && ch <= 'z';
}
static int c_upper(int ch) {
    return ch >= 'A' && ch <= 'Z';
}
static int c_digit(int ch) {
    return ch >= '0' && ch <= '9';
}
static int c_alpha(int ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch >= 0x80;
}
static int c_alnum(int ch) {
    return c_digit(ch) || c_alpha(ch);
}
static int c_space(int ch) {
    return ch == ' ' || (ch >= 9 && ch <= 13);
}

/* str.islower()/isupper(): at least one cased character and none of the other case (ASCII). */
static int cased_all(jv s, int lower) {
    int cased = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i];
        if (c_lower(ch) || c_upper(ch)) {
            cased = 1;
            if (lower ? c_upper(ch) : c_lower(ch)) return 0;
        }
    }
    return cased;
}

static jv pad(jctx *c, jv s, long long width, jv fill, int mode /* 0 center, 1 ljust, 2 rjust */) {
    long long len = (long long)ju_len(s.u.s.p, s.u.s.n);
    if (width <= len) return s;
    long long total = width - len, left = mode == 0 ? total / 2 + (total & width & 1) : mode == 1 ? 0 : total;
    jbuf b = {0};
    const char *f = fill.t == JV_STR && fill.u.s.n ? fill.u.s.p : " ";
    size_t fn = fill.t == JV_STR && fill.u.s.n ? fill.u.s.n : 1;
    for (long long i = 0; i < left; i++) jb_put(&b, f, fn);
    jb_put(&b, s.u.s.p, s.u.s.n);
    for (long long i = 0; i < total - left; i++) jb_put(&b, f, fn);
    jv r = jv_strdup(c->a, b.p, b.n);
    jb_free(&b);
    return r;
}

static int call_str_method(jctx *c, jv self, const char *m, jv *args, size_t nargs, const char **kwn, jv *kwv,
                           size_t nkw, jv *out) {
    jv a0 = arg(args, nargs, kwn, kwv, nkw, 0, NULL, jv_none());
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        if (a0.t != JV_STR && a0.t != JV_LIST)
            return jx_fail(c, "TypeError: %s first arg must be str or a tuple of str, not %s", m, jv_typename(a0));
        *out = jv_bool(js_startswith(self, a0, m[0] == 'e'));
        return 0;
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        jv sep = arg(args, nargs, kwn, kwv, nkw, 0, "sep", jv_none());
        jv ms = arg(args, nargs, kwn, kwv, nkw, 1, "maxsplit", jv_int(-1));
        if (sep.t != JV_NONE && need_str(c, sep, m)) return -1;
        return js_split(c, self, sep, jv_ival(ms), m[0] == 'r', out);
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        if (a0.t != JV_NONE && need_str(c, a0, m)) return -1;
        *out = js_strip(c->a, self, &a0, m[0] != 'r', m[0] != 'l');
        return 0;
    }
    if (!strcmp(m, "upper"))
        *out = js_case(c->a, self, CASE_UPPER);
    else if (!strcmp(m, "lower") || !strcmp(m, "casefold"))
        *out = js_case(c->a, self, CASE_LOWER);
    else if (!strcmp(m, "title"))
        *out = js_case(c->a, self, CASE_TITLE);
    else if (!strcmp(m, "capitalize"))
        *out = js_case(c->a, self, CASE_CAPITALIZE);
    else if (!strcmp(m, "replace")) {
        jv b = arg(args, nargs, kwn, kwv, nkw, 1, NULL, jv_none());
        jv cnt = arg(args, nargs, kwn, kwv, nkw, 2, "count", jv_int(-1));
        if (need_str(c, a0, "replace") || need_str(c, b, "replace")) return -1;
        *out = js_replace(c->a, self, a0, b, jv_ival(cnt));
    } else if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex")) {
        if (need_str(c, a0, m)) return -1;
        long long r = js_find(self, a0, m[0] == 'r');
        if (r < 0 && strstr(m, "index")) return jx_fail(c, "ValueError: substring not found");
        *out = jv_int(r);
    } else if (!strcmp(m, "count")) {
        if (need_str(c, a0, m)) return -1;
        *out = jv_int(js_count(self, a0));
    } else if (!strcmp(m, "join")) {
        jlist *l;
        if (jx_iter(c, a0, &l)) return -1;
        for (size_t i = 0; i < l->n; i++)
            if (l->v[i].t != JV_STR)
                return jx_fail(c, "TypeError: sequence item %zu: expected str instance, %s found", i,
                               jv_typename(l->v[i]));
        *out = js_join(c, self, l);
    } else if (!strcmp(m, "format"))
        return str_format(c, self, args, nargs, kwn, kwv, nkw, out);
    else if (!strcmp(m, "splitlines"))
        *out = js_splitlines(c->a, self, jv_truthy(arg(args, nargs, kwn, kwv, nkw, 0, "keepends", jv_bool(0))));
    else if (!strcmp(m, "isdigit") || !strcmp(m, "isnumeric") || !strcmp(m, "isdecimal"))
        *out = jv_bool(str_pred(self, c_digit));
    else if (!strcmp(m, "isalpha"))
        *out = jv_bool(str_pred(self, c_alpha));
    else if (!strcmp(m, "isalnum"))
        *out = jv_bool(str_pred(self, c_alnum));
    else if (!strcmp(m, "isspace"))
        *out = jv_bool(str_pred(self, c_space));
    else if (!strcmp(m, "islower") || !strcmp(m, "isupper"))
        *out = jv_bool(cased_all(self, m[2] == 'l'));
    else if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        if (need_str(c, a0, m)) return -1;
        int suf = m[6] == 's';
        if (js_startswith(self, a0, suf))
            *out =
                suf ? jv_str(self.u.s.p, self.u.s.n - a0.u.s.n) : jv_str(self.u.s.p + a0.u.s.n, self.u.s.n - a0.u.s.n);
        else
            *out = self;
    } else if (!strcmp(m, "center") || !strcmp(m, "ljust") || !strcmp(m, "rjust")) {
        if (!jv_is_int(a0)) return jx_fail(c, "TypeError: %s() needs an integer width", m);
        *out = pad(c, self, jv_ival(a0), arg(args, nargs, kwn, kwv, nkw, 1, NULL, jv_cstr(" ")),
                   m[0] == 'c'   ? 0
                   : m[0] == 'l' ? 1
                                 : 2);
    } else if (!strcmp(m, "zfill")) {
        if (!jv_is_int(a0)) return jx_fail(c, "TypeError: zfill() needs an integer width");
        *out = pad(c, self, jv_ival(a0), jv_cstr("0"), 2);
    } else if (!strcmp(m, "partition") || !strcmp(m, "rpartition")) {
        if (need_str(c, a0, m)) return -1;
        long long i = js_find(self, a0, m[0] == 'r');
        jv t = jv_list(c->a, 3);
        t.u.l->tuple = 1;
        if (i < 0) {
            jl_push(c->a, t.u.l, m[0] == 'r' ? jv_cstr("") : self);
            jl_push(c->a, t.u.l, jv_cstr(""));
            jl_push(c->a, t.u.l, m[0] == 'r' ? self : jv_cstr(""));
        } else {
            size_t o = ju_off(self.u.s.p, self.u.s.n, (size_t)i);
            jl_push(c->a, t.u.l, jv_str(self.u.s.p, o));
            jl_push(c->a, t.u.l, a0);
            jl_push(c->a, t.u.l, jv_str(self.u.s.p + o + a0.u.s.n, self.u.s.n - o - a0.u.s.n));
        }
        *out = t;
    } else if (!strcmp(m, "swapcase")) {
        jbuf b = {0};
        for (size_t i = 0; i < self.u.s.n; i++) {
            char ch = self.u.s.p[i];
            jb_putc(&b, c_lower(ch) ? (char)(ch - 32) : c_upper(ch) ? (char)(ch + 32) : ch);
        }
        *out = jv_strdup(c->a, b.p ? b.p : "", b.n);
        jb_free(&b);
    } else
        return jx_fail(c, "AttributeError: 'str' object has no attribute '%s'", m);
    return 0;
}

static int call_method(jctx *c, jfunc *f, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, jv *out) {
    jv self = f->self;
    const char *m = f->name;
    if (self.t == JV_STR) return call_str_method(c, self, m, args, nargs, kwn, kwv, nkw, out);
    if (in_list(unsafe_methods, m))
        return jx_fail(c, "SecurityError: access to attribute '%s' of '%s' object is unsafe.", m, jv_typename(self));
    if (self.t == JV_DICT) {
        jdict *d = self.u.d;
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            jv l = jv_list(c->a, d->n);
            for (size_t i = 0; i < d->n; i++) {
                if (m[0] == 'k')
                    jl_push(c->a, l.u.l, d->k[i]);
                else if (m[0] == 'v')
                    jl_push(c->a, l.u.l, d->v[i]);
                else {
                    jv t = jv_list(c->a, 2);
                    t.u.l->tuple = 1;
                    jl_push(c->a, t.u.l, d->k[i]);
                    jl_push(c->a, t.u.l, d->v[i]);
                    jl_push(c->a, l.u.l, t);
                }
            }
            *out = l;
            return 0;
        }
        if (!strcmp(m, "get")) {
            if (nargs < 1) return jx_fail(c, "TypeError: get expected at least 1 argument, got 0");
            if (!jd_get(d, args[0], out)) *out = nargs > 1 ? args[1] : jv_none();
            return 0;
        }
        if (!strcmp(m, "copy")) {
            jv r = jv_dict(c->a);
            for (size_t i = 0; i < d->n; i++) jd_set(c->a, r.u.d, d->k[i], d->v[i]);
            *out = r;
            return 0;
        }
    }
    if (self.t == JV_LIST) {
        jlist *l = self.u.l;
        if (!strcmp(m, "index") || !strcmp(m, "count")) {
            if (nargs < 1) return jx_fail(c, "TypeError: %s expected 1 argument", m);
            long long k = 0, first = -1;
            for (size_t i = 0; i < l->n; i++)
                if (jv_eq(l->v[i], args[0])) {
                    if (first < 0) first = (long long)i;
                    k++;
                }
            if (m[0] == 'i' && first < 0) return jx_fail(c, "ValueError: value is not in list");
            *out = jv_int(m[0] == 'i' ? first : k);
            return 0;
        }
        if (!strcmp(m, "copy")) {
            jv r = jv_list(c->a, l->n);
            for (size_t i = 0; i < l->n; i++) jl_push(c->a, r.u.l, l->v[i]);
            *out = r;
            return 0;
        }
    }
    return jx_fail(c, "AttributeError: '%s' object has no attribute '%s'", jv_typename(self), m);
}

int jx_call_builtin(jctx *c, jv fn, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, jv *out) {
    jfunc *f = fn.u.fn;
    switch (f->kind) {
    case FN_GLOBAL: return call_global(c, f->name, args, nargs, kwn, kwv, nkw, out);
    case FN_METHOD: return call_method(c, f, args, nargs, kwn, kwv, nkw, out);
    case FN_CHANGED: {
        jv now = jv_list(c->a, nargs);
        for (size_t i = 0; i < nargs; i++) jl_push(c->a, now.u.l, args[i]);
        jlist *last = f->self.u.l;
        if (last->n && jv_eq(last->v[0], now)) {
            *out = jv_bool(0);
            return 0;
        }
        last->n = 0;
        jl_push(c->a, last, now);
        *out = jv_bool(1);
        return 0;
    }
    case FN_CYCLE:
        if (!nargs) return jx_fail(c, "TypeError: no items for cycling given");
        *out = args[f->idx % (long long)nargs];
        return 0;
    default: return jx_fail(c, "TypeError: object is not callable");
    }
}
