/* Jinja lexer: splits template source into text and tag tokens, applying whitespace control,
 * trim_blocks and lstrip_blocks the way Jinja2 does. */
#ifndef SLUICE_TEXT_JINJA_LEX_H
#define SLUICE_TEXT_JINJA_LEX_H

#include "text/jinja_int.h"

typedef enum { T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF } jtok_type;

typedef struct jtok {
    jtok_type t;
    int line;
    const char *p; /* text, name, operator or decoded string (arena) */
    size_t n;
    long long i;
    double f;
} jtok;

/* Tokens go into the arena; the array ends with T_EOF. */
int jlex(jarena *a, const char *src, size_t len, jtok **out, size_t *n, sl_err *e);

#endif
