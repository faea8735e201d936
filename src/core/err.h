/* Error reporting: functions return 0 on success or -1 after filling an sl_err with one line that names
 * the file, tensor or field and what was expected. */
#ifndef SLUICE_CORE_ERR_H
#define SLUICE_CORE_ERR_H

#include <stddef.h>

typedef struct sl_err {
    char msg[1024];
} sl_err;

/* Formats the message into e (when e is non-NULL) and returns -1, so callers can `return sl_fail(...)`. */
int sl_fail(sl_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes an existing message with more context ("loading X: <old message>"). Returns -1. */
int sl_wrap(sl_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
