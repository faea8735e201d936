/* Python str methods on UTF-8 strings: case mapping, strip, split, replace, find. */
#include <string.h>

#include <utf8proc.h>

#include "text/jinja_int.h"

static utf8proc_int32_t next_cp(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) {
        cp = (unsigned char)s[*i];
        k = 1;
    }
    *i += (size_t)k;
    return cp;
}

static void put_cp(jbuf *b, utf8proc_int32_t cp) {
    utf8proc_uint8_t u[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, u);
    jb_put(b, (const char *)u, (size_t)k);
}

static int is_cased_letter(utf8proc_int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
}

static int py_space(utf8proc_int32_t cp) {
    return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

static jv finish(jarena *a, jbuf *b) {
    jv r = jv_strdup(a, b->p ? b->p : "", b->n);
    jb_free(b);
    return r;
}

jv js_case(jarena *a, jv s, jcase mode) {
    jbuf b = {0};
    int prev_cased = 0, first = 1, word_start = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        utf8proc_int32_t cp = next_cp(s.u.s.p, s.u.s.n, &i), o = cp;
        switch (mode) {
        case CASE_UPPER:
            if (cp == 0xDF) { /* Python's full case mapping: sharp s becomes SS */
                jb_puts(&b, "SS");
                first = 0;
                continue;
            }
            o = utf8proc_toupper(cp);
            break;
        case CASE_LOWER: o = utf8proc_tolower(cp); break;
        case CASE_CAPITALIZE: o = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
        case CASE_TITLE: /* str.title(): upper after an uncased character */
            o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
            prev_cased = is_cased_letter(cp);
            break;
        case CASE_JTITLE: /* Jinja's title filter: words start after whitespace, -, (, {, [, < */
            if (py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<') {
                word_start = 1;
                o = cp;
            } else {
                o = word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
                word_start = 0;
            }
            break;
        }
        first = 0;
        put_cp(&b, o);
    }
    return finish(a, &b);
}

static int in_set(utf8proc_int32_t cp, const jv *chars) {
    if (!chars || chars->t != JV_STR) return py_space(cp);
    for (size_t i = 0; i < chars->u.s.n;)
        if (next_cp(chars->u.s.p, chars->u.s.n, &i) == cp) return 1;
    return 0;
}

jv js_strip(jarena *a, jv s, const jv *chars, int left, int right) {
    const char *p = s.u.s.p;
    size_t lo = 0, hi = s.u.s.n;
    if (left)
        while (lo < hi) {
            size_t i = lo;
            if (!in_set(next_cp(p, hi, &i), chars)) break;
            lo = i;
        }
    if (right)
        while (hi > lo) {
            size_t st = hi - 1;
            while (st > lo && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            size_t i = st;
            if (!in_set(next_cp(p, hi, &i), chars)) break;
            hi = st;
        }
    (void)a;
    return jv_str(p + lo, hi - lo);
}

static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (!nn) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

static const char *memrfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (!memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

jv js_replace(jarena *a, jv s, jv old, jv new_, long long count) {
    jbuf b = {0};
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    if (!old.u.s.n) { /* Python inserts the replacement between every character */
        size_t i = 0;
        long long done = 0;
        while (i <= s.u.s.n) {
            if (count < 0 || done < count) {
                jb_put(&b, new_.u.s.p, new_.u.s.n);
                done++;
            }
            if (i == s.u.s.n) break;
            size_t j = i;
            next_cp(p, s.u.s.n, &j);
            jb_put(&b, p + i, j - i);
            i = j;
        }
        return finish(a, &b);
    }
    long long done = 0;
    while (p < end) {
        const char *f = (count < 0 || done < count) ? memfind(p, (size_t)(end - p), old.u.s.p, old.u.s.n) : NULL;
        if (!f) break;
        jb_put(&b, p, (size_t)(f - p));
        jb_put(&b, new_.u.s.p, new_.u.s.n);
        p = f + old.u.s.n;
        done++;
    }
    jb_put(&b, p, (size_t)(end - p));
    return finish(a, &b);
}

int js_split(jctx *c, jv s, jv sep, long long maxsplit, int from_right, jv *out) {
    jv l = jv_list(c->a, 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.t == JV_STR && sep.u.s.n == 0) return jx_fail(c, "ValueError: empty separator");
    if (sep.t == JV_STR) {
        if (!from_right) {
            const char *q = p, *end = p + n;
            long long k = 0;
            for (;;) {
                const char *f =
                    (maxsplit < 0 || k < maxsplit) ? memfind(q, (size_t)(end - q), sep.u.s.p, sep.u.s.n) : NULL;
                if (!f) break;
                jl_push(c->a, l.u.l, jv_str(q, (size_t)(f - q)));
                q = f + sep.u.s.n;
                k++;
            }
            jl_push(c->a, l.u.l, jv_str(q, (size_t)(end - q)));
        } else {
            size_t hi = n;
            long long k = 0;
            jv parts = jv_list(c->a, 0);
            for (;;) {
                const char *f = (maxsplit < 0 || k < maxsplit) ? memrfind(p, hi, sep.u.s.p, sep.u.s.n) : NULL;
                if (!f) break;
                jl_push(c->a, parts.u.l, jv_str(f + sep.u.s.n, hi - (size_t)(f - p) - sep.u.s.n));
                hi = (size_t)(f - p);
                k++;
            }
            jl_push(c->a, l.u.l, jv_str(p, hi));
            for (size_t i = parts.u.l->n; i-- > 0;) jl_push(c->a, l.u.l, parts.u.l->v[i]);
        }
        *out = l;
        return 0;
    }
    /* whitespace split: runs of whitespace, no empty strings */
    size_t i = 0;
    long long k = 0;
    if (from_right) { /* rsplit() without a separator: split from the right */
        jv parts = jv_list(c->a, 0);
        size_t hi = n;
        for (;;) {
            while (hi > 0 && py_space((unsigned char)p[hi - 1])) hi--;
            if (!hi) break;
            size_t lo = hi;
            if (maxsplit >= 0 && k >= maxsplit) {
                lo = 0;
                jl_push(c->a, parts.u.l, jv_str(p, hi));
                break;
            }
            while (lo > 0 && !py_space((unsigned char)p[lo - 1])) lo--;
            jl_push(c->a, parts.u.l, jv_str(p + lo, hi - lo));
            hi = lo;
            k++;
        }
        for (size_t j = parts.u.l->n; j-- > 0;) jl_push(c->a, l.u.l, parts.u.l->v[j]);
        *out = l;
        return 0;
    }
    for (;;) {
        while (i < n) {
            size_t j = i;
            if (!py_space(next_cp(p, n, &j))) break;
            i = j;
        }
        if (i >= n) break;
        if (maxsplit >= 0 && k >= maxsplit) { /* the remainder keeps its trailing whitespace */
            jl_push(c->a, l.u.l, jv_str(p + i, n - i));
            break;
        }
        size_t st = i;
        while (i < n) {
            size_t j = i;
            if (py_space(next_cp(p, n, &j))) break;
            i = j;
        }
        jl_push(c->a, l.u.l, jv_str(p + st, i - st));
        k++;
    }
    *out = l;
    return 0;
}

jv js_splitlines(jarena *a, jv s, int keepends) {
    jv l = jv_list(a, 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, st = 0, i = 0;
    while (i < n) {
        size_t j = i;
        utf8proc_int32_t cp = next_cp(p, n, &j);
        int br = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
                 cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (!br) {
            i = j;
            continue;
        }
        if (cp == '\r' && j < n && p[j] == '\n') j++;
        jl_push(a, l.u.l, jv_str(p + st, (keepends ? j : i) - st));
        st = i = j;
    }
    if (st < n) jl_push(a, l.u.l, jv_str(p + st, n - st));
    return l;
}

long long js_find(jv s, jv sub, int from_right) {
    const char *f =
        from_right ? memrfind(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n) : memfind(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n);
    if (!f) return -1;
    return (long long)ju_len(s.u.s.p, (size_t)(f - s.u.s.p));
}

long long js_count(jv s, jv sub) {
    if (!sub.u.s.n) return (long long)ju_len(s.u.s.p, s.u.s.n) + 1;
    long long k = 0;
    const char *p = s.u.s.p, *end = p + s.u.s.n, *f;
    while ((f = memfind(p, (size_t)(end - p), sub.u.s.p, sub.u.s.n))) {
        k++;
        p = f + sub.u.s.n;
    }
    return k;
}

jv js_join(jctx *c, jv sep, jlist *items) {
    jbuf b = {0};
    for (size_t i = 0; i < items->n; i++) {
        if (i && sep.t == JV_STR) jb_put(&b, sep.u.s.p, sep.u.s.n);
        jv_str_to(&b, items->v[i]);
    }
    return finish(c->a, &b);
}

int js_startswith(jv s, jv prefix, int end) {
    if (prefix.t == JV_LIST) {
        for (size_t i = 0; i < prefix.u.l->n; i++)
            if (prefix.u.l->v[i].t == JV_STR && js_startswith(s, prefix.u.l->v[i], end)) return 1;
        return 0;
    }
    if (prefix.t != JV_STR || prefix.u.s.n > s.u.s.n) return 0;
    const char *p = end ? s.u.s.p + s.u.s.n - prefix.u.s.n : s.u.s.p;
    return !memcmp(p, prefix.u.s.p, prefix.u.s.n);
}
