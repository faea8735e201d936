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
