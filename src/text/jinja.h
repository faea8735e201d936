/* A Jinja2-subset template engine that renders chat templates the way Python Jinja2 does for transformers:
 * sandboxed (immutable lists/dicts), trim_blocks and lstrip_blocks on, loop controls and {% do %},
 * raise_exception(), strftime_now() and transformers' tojson. Not supported: include/import/extends/block,
 * recursive loops, autoescaping. */
#ifndef SLUICE_TEXT_JINJA_H
#define SLUICE_TEXT_JINJA_H

#include <stddef.h>
#include <time.h>

#include <jansson.h>

#include "core/err.h"

typedef struct sl_jinja sl_jinja; /* a parsed template */

/* Syntax errors name the line. */
int sl_jinja_parse(const char *src, size_t len, sl_jinja **out, sl_err *e);
void sl_jinja_free(sl_jinja *t);
/* vars: object of globals. raise_exception() and runtime errors give -1 with the message and line.
 * *out is a NUL-terminated heap string owned by the caller. */
int sl_jinja_render(const sl_jinja *t, json_t *vars, char **out, size_t *len, sl_err *e);
/* As sl_jinja_render, with strftime_now() reading the clock value `now` (local time) instead. */
int sl_jinja_render_at(const sl_jinja *t, json_t *vars, time_t now, char **out, size_t *len, sl_err *e);
/* The memory one render may hold, its values and output together (default 1 GiB): past it the render fails
 * with a MemoryError instead of growing until the process runs out. */
void sl_jinja_set_max_bytes(sl_jinja *t, size_t bytes);

#endif
