/* Cutting byte streams on UTF-8 character boundaries, so that streamed text deltas never carry half a
 * character. */
#ifndef SLUICE_TEXT_UTF8_CUT_H
#define SLUICE_TEXT_UTF8_CUT_H

#include <stddef.h>

/* The largest k' <= k such that s[0, k') does not end inside a multi-byte character (looks only at
 * s[0, k)). Invalid bytes count as whole characters, so at most 3 bytes are ever held back. */
size_t sl_utf8_cut(const char *s, size_t k);

#endif
