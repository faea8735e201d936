/* Streaming stop-string matcher. Generated text goes in chunk by chunk; what comes out is the text that
 * is safe to show now. A suffix that could still grow into a stop string is held back, and so is a
 * trailing incomplete UTF-8 character. When a stop string completes, the text before it comes out and
 * the matcher reports "stopped"; the stop string and anything after it are never emitted.
 *
 * The result does not depend on how the text is chunked: it is the text up to the earliest position at
 * which any stop string occurs. So with stops "abcd" and "bc", "abc" waits for the next byte ("abcd"
 * would stop earlier than "bc"); at flush, the complete "bc" wins. */
#ifndef SLUICE_RUNTIME_STOP_H
#define SLUICE_RUNTIME_STOP_H

#include <stddef.h>

#include "core/err.h"

typedef struct sl_stop sl_stop;

/* Copies the n stop strings; empty and NULL ones are ignored (none at all: text passes through).
 * NULL on OOM. */
sl_stop *sl_stop_create(const char *const *stops, int n);
void sl_stop_free(sl_stop *s);
/* Forgets held text and the stopped state, for a new request. */
void sl_stop_reset(sl_stop *s);

/* Feeds n bytes. *out / *out_len receive the text to emit now (possibly empty); the pointer stays valid
 * until the next call on s. Returns 1 once stopped (later feeds emit nothing), 0 to go on, -1 when out
 * of memory. */
int sl_stop_feed(sl_stop *s, const char *chunk, size_t n, const char **out, size_t *out_len, sl_err *e);

/* End of generation: emits everything still held, unless a complete stop string settles first.
 * Returns 1 if stopped, else 0. */
int sl_stop_flush(sl_stop *s, const char **out, size_t *out_len);

int sl_stop_stopped(const sl_stop *s);
/* Index (in the create() list) of a stop string that starts at the stop position, -1 when none has.
 * When one stop string is a prefix of another, which of the two is reported can depend on chunking;
 * the emitted text never does. */
int sl_stop_which(const sl_stop *s);

#endif
