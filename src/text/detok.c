/* Decoding ids to text, whole or streamed, with the same UTF-8 repair rules as Rust's from_utf8_lossy (which
 * Hugging Face's ByteLevel decoder uses): each maximal invalid subpart becomes one U+FFFD. */
#include "text/detok.h"

#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

int tok_utf8_step(const uint8_t *s, size_t n) {
    uint8_t b = s[0];
    if (b < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF)
        need = 2;
    else if (b == 0xE0)
        need = 3, lo = 0xA0;
    else if (b == 0xED)
        need = 3, hi = 0x9F;
    else if (b >= 0xE1 && b <= 0xEF)
        need = 3;
    else if (b == 0xF0)
        need = 4, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3)
        need = 4;
    else if (b == 0xF4)
        need = 4, hi = 0x8F;
    else
        return -1;
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF)) return -i;
    }
    return need;
}

/* Copies valid characters of s[0..n) to d (which has room for 3*n bytes), replacing invalid subparts. When
 * keep_tail, an incomplete character at the end is not written; its length goes to *tail. Returns bytes written. */
static size_t repair(const uint8_t *s, size_t n, char *d, int keep_tail, size_t *tail) {
    size_t k = 0, i = 0;
    *tail = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            d[k++] = (char)s[i++];
            continue;
        }
        int r = tok_utf8_step(s + i, n - i);
        if (r > 0) {
            memcpy(d + k, s + i, (size_t)r);
            k += (size_t)r;
            i += (size_t)r;
            continue;
        }
        if (r == 0 && keep_tail) {
            *tail = n - i;
            break;
        }
        memcpy(d + k, REPLACEMENT, 3);
        k += 3;
        i += r < 0 ? (size_t)-r : n - i;
    }
    return k;
}

int sl_tokenizer_decode(const sl_tokenizer *t, const int32_t *ids, int n, int skip_special, char **out, size_t *len,
                        sl_err *e) {
    *out = NULL;
    size_t raw = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return sl_fail(e, "decode: token id %d out of range [0, %d)", ids[i], t->n_vocab);
        if (!(skip_special && (t->flags[ids[i]] & TOK_F_SPECIAL))) raw += t->dec_len[ids[i]];
    }
    uint8_t *bytes = malloc(raw + 1);
    char *text = malloc(raw * 3 + 1);
    if (!bytes || !text) {
        free(bytes);
        free(text);
        return sl_fail(e, "decode: out of memory");
    }
    size_t k = 0, tail;
    for (int i = 0; i < n; i++) {
        if (skip_special && (t->flags[ids[i]] & TOK_F_SPECIAL)) continue;
        memcpy(bytes + k, t->dec + t->dec_off[ids[i]], t->dec_len[ids[i]]);
        k += t->dec_len[ids[i]];
    }
    size_t skip = t->strip_lead && k && bytes[0] == ' '; /* SentencePiece's space in front of the text */
    size_t m = repair(bytes + skip, k - skip, text, 0, &tail);
    free(bytes);
    text[m] = 0;
    *out = text;
    if (len) *len = m;
    return 0;
}

void sl_detok_init(sl_detok *d, const sl_tokenizer *t, int skip_special) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->skip_special = skip_special;
}

void sl_detok_free(sl_detok *d) {
    free(d->buf);
    d->buf = NULL;
    d->cap = 0;
}

void sl_detok_reset(sl_detok *d) {
    d->n_pend = 0;
    d->started = 0;
}

static int reserve(sl_detok *d, size_t n, sl_err *e) {
    if (n <= d->cap) return 0;
    size_t cap = d->cap ? d->cap : 256;
    while (cap < n) cap *= 2;
    char *p = realloc(d->buf, cap);
    if (!p) return sl_fail(e, "detok: out of memory");
    d->buf = p;
    d->cap = cap;
    return 0;
}

int sl_detok_push(sl_detok *d, int32_t id, const char **out, size_t *len, sl_err *e) {
    const sl_tokenizer *t = d->tok;
    *out = "";
    *len = 0;
    if (id < 0 || id >= t->n_vocab) return sl_fail(e, "detok: token id %d out of range [0, %d)", id, t->n_vocab);
    if (d->skip_special && (t->flags[id] & TOK_F_SPECIAL)) {
        int kept = 0;
        for (int i = 0; i < d->n_keep && !kept; i++) kept = d->keep[i] == id;
        if (!kept) return 0;
    }
    const char *src = t->dec + t->dec_off[id];
    size_t sl = t->dec_len[id];
    if (!d->started && sl) {
        d->started = 1;
        if (t->strip_lead && src[0] == ' ') src++, sl--;
    }
    size_t n = (size_t)d->n_pend + sl, tail;
    /* bytes are staged in the second half of buf, repaired text goes to the first */
    if (reserve(d, n * 4 + 4, e)) return -1;
    uint8_t *in = (uint8_t *)d->buf + n * 3 + 3;
    memcpy(in, d->pend, (size_t)d->n_pend);
    memcpy(in + d->n_pend, src, sl);
    size_t m = repair(in, n, d->buf, 1, &tail);
    memcpy(d->pend, in + n - tail, tail);
    d->n_pend = (int)tail;
    *out = d->buf;
    *len = m;
    return 0;
}

int sl_detok_flush(sl_detok *d, const char **out, size_t *len, sl_err *e) {
    *out = "";
    *len = 0;
    if (!d->n_pend) return 0;
    if (reserve(d, 3, e)) return -1;
    memcpy(d->buf, REPLACEMENT, 3);
    d->n_pend = 0;
    *out = d->buf;
    *len = 3;
    return 0;
}
