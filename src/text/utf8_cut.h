/* Cutting byte streams on UTF-8 character boundaries, so that streamed text deltas never carry half a
 * character. */
#ifndef SLUICE_TEXT_UTF8_CUT_H
#define SLUICE_TEXT_UTF8_CUT_H

#include <stddef.h>

/* The largest k' <= k such that s[0, k') does not end inside a multi-byte character (looks only at
 * s[0, k)). Invalid bytes count as whole characters, so at most 3 bytes are ever held back. */
size_t sl_utf8_cut(const char *s, size_t k);

/* Makes the NUL-terminated s valid UTF-8 in place, as jansson wants it (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF): every byte that does not begin a whole valid character becomes '?'. For
 * messages that quote untrusted bytes, or that snprintf may have cut inside a character. */
void sl_utf8_scrub(char *s);

#endif
