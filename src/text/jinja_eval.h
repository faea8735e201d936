/* Jinja evaluator: renders a parsed statement list against the template's variables. */
#ifndef SLUICE_TEXT_JINJA_EVAL_H
#define SLUICE_TEXT_JINJA_EVAL_H

#include "text/jinja_int.h"

int jeval_render(jarena *a, jnode *const *body, size_t nb, json_t *vars, time_t now, jbuf *out, sl_err *e);

#endif
