/* Jinja lexer. Source newlines are normalised to \n and one trailing newline is dropped
 * (keep_trailing_newline=False), as Jinja2 does before lexing. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_lex.h"

typedef struct lexer {
    jarena *a;
    const char *s;
    size_t n, pos;
    int line;
    jtok *toks;
    size_t nt, cap;
    sl_err *e;
} lexer;

static void emit(lexer *L, jtok t) {
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *nt = realloc(L->toks, cap * sizeof *nt);
        if (!nt) abort();
        L->toks = nt;
        L->cap = cap;
    }
    L->toks[L->nt++] = t;
}

static void emit_text(lexer *L, const char *p, size_t n, int line) {
    if (n) emit(L, (jtok){.t = T_TEXT, .line = line, .p = p, .n = n});
}

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static int count_nl(const char *p, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += p[i] == '\n';
    return c;
}

/* Position of the next "{{", "{%" or "{#" at or after pos, or n. */
static size_t next_tag(const char *s, size_t n, size_t pos) {
    for (size_t i = pos; i + 1 < n; i++)
        if (s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) return i;
    return n;
}

/* Applies the whitespace rules to the text before a tag. */
static size_t strip_before(const char *text, size_t tn, char kind, char sign, int line_starting) {
    if (sign == '-') {
        while (tn && is_ws(text[tn - 1])) tn--;
        return tn;
    }
    if (sign == '+' || kind == '{') return tn;
    size_t l = tn;
    while (l && text[l - 1] != '\n') l--;
    if (l > 0 || line_starting) {
        for (size_t i = l; i < tn; i++)
            if (text[i] != ' ' && text[i] != '\t') return tn;
        return l;
    }
    return tn;
}

/* After a tag end: '-' strips all following whitespace, trim_blocks drops one newline after blocks/comments.
 * Returns whether what was consumed ends a line. */
static int after_end(lexer *L, int minus, int trim) {
    size_t start = L->pos;
    if (minus)
        while (L->pos < L->n && is_ws(L->s[L->pos])) L->pos++;
    else if (trim && L->pos < L->n && L->s[L->pos] == '\n')
        L->pos++;
    L->line += count_nl(L->s + start, L->pos - start);
    return L->pos > start && L->s[L->pos - 1] == '\n';
}

static int lex_string(lexer *L) {
    char q = L->s[L->pos];
    size_t i = L->pos + 1;
    jbuf b = {0};
    int line = L->line;
    while (i < L->n && L->s[i] != q) {
        char c = L->s[i];
        if (c == '\n') L->line++;
        if (c != '\\' || i + 1 >= L->n) {
            jb_putc(&b, c);
            i++;
            continue;
        }
        char d = L->s[i + 1];
        i += 2;
        switch (d) {
        case 'n': jb_putc(&b, '\n'); break;
        case 't': jb_putc(&b, '\t'); break;
        case 'r': jb_putc(&b, '\r'); break;
        case '0': jb_putc(&b, '\0'); break;
        case 'a': jb_putc(&b, '\a'); break;
        case 'b': jb_putc(&b, '\b'); break;
        case 'f': jb_putc(&b, '\f'); break;
        case 'v': jb_putc(&b, '\v'); break;
        case '\\': jb_putc(&b, '\\'); break;
        case '\'': jb_putc(&b, '\''); break;
        case '"': jb_putc(&b, '"'); break;
        case '\n': L->line++; break;
        case 'x':
        case 'u':
        case 'U': {
            int nd = d == 'x' ? 2 : d == 'u' ? 4 : 8;
            unsigned cp = 0;
            for (int k = 0; k < nd && i < L->n && isxdigit((unsigned char)L->s[i]); k++, i++)
                cp = cp * 16 + (unsigned)(isdigit((unsigned char)L->s[i])
                                              ? L->s[i] - '0'
                                              : (tolower((unsigned char)L->s[i]) - 'a' + 10));
            char u[4];
            int k = 0;
            if (cp < 0x80)
                u[k++] = (char)cp;
            else if (cp < 0x800) {
                u[k++] = (char)(0xC0 | (cp >> 6));
                u[k++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                u[k++] = (char)(0xE0 | (cp >> 12));
                u[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                u[k++] = (char)(0x80 | (cp & 0x3F));
            } else {
                u[k++] = (char)(0xF0 | (cp >> 18));
                u[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                u[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                u[k++] = (char)(0x80 | (cp & 0x3F));
            }
            jb_put(&b, u, (size_t)k);
            break;
        }
        default: /* unknown escapes stay as written, like Python */ jb_putc(&b, '\\'); jb_putc(&b, d);
        }
    }
    if (i >= L->n) {
        jb_free(&b);
        return sl_fail(L->e, "template syntax error at line %d: unterminated string", line);
    }
    emit(L, (jtok){.t = T_STR, .line = line, .p = ja_strndup(L->a, b.p ? b.p : "", b.n), .n = b.n});
    jb_free(&b);
    L->pos = i + 1;
    return 0;
}

static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                  ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}", NULL};

/* Tokens inside {{ }} or {% %} up to the closing delimiter. */
static int lex_tag(lexer *L, char close, int *minus) {
    int depth = 0, line0 = L->line;
    for (;;) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) {
            if (L->s[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= L->n)
            return sl_fail(L->e, "template syntax error at line %d: unexpected end of template, tag not closed", line0);
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        if (depth == 0) {
            if (left >= 3 && p[0] == '-' && p[1] == close && p[2] == '}') {
                L->pos += 3;
                *minus = 1;
                return 0;
            }
            if (left >= 3 && p[0] == '+' && p[1] == close && p[2] == '}') {
                L->pos += 3;
                *minus = 0;
                return 0;
            }
            if (left >= 2 && p[0] == close && p[1] == '}') {
                L->pos += 2;
                *minus = 0;
                return 0;
            }
        }
        unsigned char c = (unsigned char)*p;
        if (c == '\'' || c == '"') {
            if (lex_string(L)) return -1;
            continue;
        }
        if (isalpha(c) || c == '_') {
            size_t k = 1;
            while (k < left && (isalnum((unsigned char)p[k]) || p[k] == '_')) k++;
            emit(L, (jtok){.t = T_NAME, .line = L->line, .p = p, .n = k});
            L->pos += k;
            continue;
        }
        if (isdigit(c)) {
            size_t k = 0;
            int isf = 0;
            while (k < left && (isdigit((unsigned char)p[k]) || p[k] == '_')) k++;
            if (k + 1 < left && p[k] == '.' && isdigit((unsigned char)p[k + 1])) {
                isf = 1;
                k++;
                while (k < left && isdigit((unsigned char)p[k])) k++;
            }
            if (k < left && (p[k] == 'e' || p[k] == 'E')) {
                size_t j = k + 1;
                if (j < left && (p[j] == '+' || p[j] == '-')) j++;
                if (j < left && isdigit((unsigned char)p[j])) {
                    isf = 1;
                    k = j;
                    while (k < left && isdigit((unsigned char)p[k])) k++;
                }
            }
            char tmp[64];
            size_t m = 0;
            for (size_t j = 0; j < k && m + 1 < sizeof tmp; j++)
                if (p[j] != '_') tmp[m++] = p[j];
            tmp[m] = 0;
            jtok t = {.t = isf ? T_FLOAT : T_INT, .line = L->line, .p = p, .n = k};
            errno = 0;
            if (isf)
                t.f = strtod(tmp, NULL);
            else
                t.i = strtoll(tmp, NULL, 10);
            /* strtoll saturates; Python's ints would not, so a literal past 64 bits is an error, not a clamp */
            if (!isf && (errno == ERANGE || m + 1 >= sizeof tmp))
                return sl_fail(L->e, "template syntax error at line %d: integer literal %.*s does not fit in 64 bits",
                               L->line, (int)(k > 40 ? 40 : k), p);
            emit(L, t);
            L->pos += k;
            continue;
        }
        int matched = 0;
        for (int i = 0; ops[i]; i++) {
            size_t k = strlen(ops[i]);
            if (k <= left && !memcmp(p, ops[i], k)) {
                emit(L, (jtok){.t = T_OP, .line = L->line, .p = ops[i], .n = k});
                L->pos += k;
                if (strchr("([{", *p)) depth++;
                if (strchr(")]}", *p) && depth > 0) depth--;
                matched = 1;
                break;
            }
        }
        if (!matched) return sl_fail(L->e, "template syntax error at line %d: unexpected character '%c'", L->line, *p);
    }
}

/* {% raw %} ... {% endraw %}: the body is text. Returns 1 when the tag at pos was a raw block. */
static int try_raw(lexer *L, size_t tag, int *line_starting) {
    size_t i = tag + 2;
    if (i < L->n && (L->s[i] == '-' || L->s[i] == '+')) i++;
    while (i < L->n && is_ws(L->s[i])) i++;
    if (L->n - i < 3 || memcmp(L->s + i, "raw", 3)) return 0;
    i += 3;
    while (i < L->n && is_ws(L->s[i])) i++;
    int minus = 0;
    if (i < L->n && L->s[i] == '-') {
        minus = 1;
        i++;
    }
    if (L->n - i < 2 || memcmp(L->s + i, "%}", 2)) return 0;
    L->line += count_nl(L->s + tag, i + 2 - tag);
    L->pos = i + 2;
    int ls = after_end(L, minus, 0); /* Jinja2 applies no trim_blocks after {% raw %} */
    size_t body = L->pos;
    for (size_t j = body; j + 1 < L->n; j++) {
        if (L->s[j] != '{' || L->s[j + 1] != '%') continue;
        size_t k = j + 2;
        char sign = 0;
        if (k < L->n && (L->s[k] == '-' || L->s[k] == '+')) sign = L->s[k++];
        while (k < L->n && is_ws(L->s[k])) k++;
        if (L->n - k < 6 || memcmp(L->s + k, "endraw", 6)) continue;
        k += 6;
        while (k < L->n && is_ws(L->s[k])) k++;
        int m2 = 0;
        if (k < L->n && L->s[k] == '-') {
            m2 = 1;
            k++;
        }
        if (L->n - k < 2 || memcmp(L->s + k, "%}", 2)) continue;
        size_t tn = strip_before(L->s + body, j - body, '%', sign, ls);
        emit_text(L, L->s + body, tn, L->line);
        L->line += count_nl(L->s + body, k + 2 - body);
        L->pos = k + 2;
        *line_starting = after_end(L, m2, 1);
        return 1;
    }
    return -1;
}

int jlex(jarena *a, const char *src, size_t len, jtok **out, size_t *n, sl_err *e) {
    /* normalise newlines and drop one trailing newline */
    char *s = ja_alloc(a, len + 1);
    size_t m = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[m++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else
            s[m++] = src[i];
    }
    if (m && s[m - 1] == '\n') m--;
    s[m] = 0;
    lexer L = {.a = a, .s = s, .n = m, .line = 1, .e = e};
    int line_starting = 1;
    while (L.pos < L.n) {
        size_t tag = next_tag(L.s, L.n, L.pos);
        char kind = tag < L.n ? L.s[tag + 1] : 0;
        char sign = tag + 2 < L.n && (L.s[tag + 2] == '-' || L.s[tag + 2] == '+') ? L.s[tag + 2] : 0;
        size_t tn = tag - L.pos;
        if (tag < L.n) tn = strip_before(L.s + L.pos, tn, kind, sign, line_starting);
        emit_text(&L, L.s + L.pos, tn, L.line);
        L.line += count_nl(L.s + L.pos, tag - L.pos);
        if (tag >= L.n) break;
        if (kind == '#') {
            size_t i = tag + 2;
            while (i + 1 < L.n && !(L.s[i] == '#' && L.s[i + 1] == '}')) i++;
            if (i + 1 >= L.n) {
                free(L.toks);
                return sl_fail(e, "template syntax error at line %d: unterminated comment", L.line);
            }
            int minus = i > tag + 2 && L.s[i - 1] == '-';
            L.line += count_nl(L.s + tag, i + 2 - tag);
            L.pos = i + 2;
            line_starting = after_end(&L, minus, 1);
            continue;
        }
        if (kind == '%') {
            int r = try_raw(&L, tag, &line_starting);
            if (r < 0) {
                free(L.toks);
                return sl_fail(e, "template syntax error at line %d: raw block not closed", L.line);
            }
            if (r) continue;
        }
        emit(&L, (jtok){.t = kind == '{' ? T_VBEGIN : T_BBEGIN, .line = L.line});
        L.pos = tag + 2 + (sign ? 1 : 0);
        int minus = 0;
        if (lex_tag(&L, kind == '{' ? '}' : '%', &minus)) {
            free(L.toks);
            return -1;
        }
        emit(&L, (jtok){.t = kind == '{' ? T_VEND : T_BEND, .line = L.line});
        line_starting = after_end(&L, minus, kind == '%');
    }
    emit(&L, (jtok){.t = T_EOF, .line = L.line});
    *out = ja_alloc(a, L.nt * sizeof(jtok));
    memcpy(*out, L.toks, L.nt * sizeof(jtok));
    *n = L.nt;
    free(L.toks);
    return 0;
}
