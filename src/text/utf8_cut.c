#include "text/utf8_cut.h"

/* Length of the sequence a lead byte starts; 1 for ASCII and for bytes that cannot lead. */
static size_t seq_len(unsigned char c) {
    if (c >= 0xf0 && c <= 0xf7) return 4;
    if (c >= 0xe0) return c <= 0xef ? 3 : 1;
    if (c >= 0xc0) return 2;
    return 1;
}

size_t sl_utf8_cut(const char *s, size_t k) {
    const unsigned char *u = (const unsigned char *)s;
    size_t j = k, back = 0;
    while (j > 0 && back < 3 && (u[j - 1] & 0xc0) == 0x80) j--, back++;
    if (j == 0) return k;
    unsigned char lead = u[j - 1];
    if ((lead & 0xc0) == 0x80 || lead < 0x80) return k; /* ASCII or a run of stray continuation bytes */
    return (j - 1) + seq_len(lead) > k ? j - 1 : k;
}

/* Replaces every byte that does not begin a valid UTF-8 character (RFC 3629: no overlong forms, no surrogates,
 * nothing past U+10FFFF, no sequence cut short) with '?', in place. */
void sl_utf8_scrub(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        unsigned c = *p, min;
        int n;
        if (c < 0x80) {
            p++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            n = 1, min = 0x80, c &= 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 2, min = 0x800, c &= 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3, min = 0x10000, c &= 0x07;
        } else {
            *p++ = '?';
            continue;
        }
        int k = 1;
        for (; k <= n && (p[k] & 0xc0) == 0x80; k++) c = c << 6 | (p[k] & 0x3f); /* stops at the NUL */
        if (k <= n || c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) {
            *p++ = '?';
            continue;
        }
        p += n + 1;
    }
}
