/* Growable byte buffer for building responses. A failed allocation sets `oom` and later appends do
 * nothing, so writers check once at the end instead of after every append. */
#ifndef SLUICE_SERVER_BUF_H
#define SLUICE_SERVER_BUF_H

#include <stddef.h>

#include <jansson.h>

typedef struct sv_buf {
    char *p; /* NUL-terminated when non-NULL */
    size_t len, cap;
    int oom;
} sv_buf;

void sv_buf_append(sv_buf *b, const char *s, size_t n);
void sv_buf_puts(sv_buf *b, const char *s);
void sv_buf_printf(sv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends compact JSON (no newline); decrefs v, which may be NULL (then counts as out of memory). */
void sv_buf_json(sv_buf *b, json_t *v);
/* Drops the first n bytes. */
void sv_buf_consume(sv_buf *b, size_t n);
void sv_buf_free(sv_buf *b);

#endif
