/* Jinja parser: template source to a list of AST statements allocated in an arena. */
#ifndef SLUICE_TEXT_JINJA_PARSE_H
#define SLUICE_TEXT_JINJA_PARSE_H

#include "text/jinja_int.h"

int jparse(jarena *a, const char *src, size_t len, jnode ***body, size_t *n, sl_err *e);

#endif
