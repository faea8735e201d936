/* Streaming detokenizer: turns ids into text one at a time, only ever handing out complete UTF-8 characters.
 * An incomplete trailing sequence is held back until a later token completes it; invalid bytes become U+FFFD,
 * exactly as sl_tokenizer_decode does for the whole sequence. */
#ifndef SLUICE_TEXT_DETOK_H
#define SLUICE_TEXT_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "text/tokenizer.h"

typedef struct sl_detok {
    const sl_tokenizer *tok; /* borrowed */
    int skip_special;
    const int32_t *keep; /* special tokens decoded even so (borrowed, may be NULL) */
    int n_keep;
    uint8_t pend[4]; /* start of a character still missing bytes */
    int n_pend;
    int started; /* some text came out (a leading space the decoder strips is dropped only before that) */
    char *buf;   /* owned; what push/flush return points here */
    size_t cap;
} sl_detok;

void sl_detok_init(sl_detok *d, const sl_tokenizer *t, int skip_special);
void sl_detok_free(sl_detok *d);
/* Forgets held-back bytes (start of a new sequence). */
void sl_detok_reset(sl_detok *d);
/* Adds one id; out and len receive the bytes now safe to emit (valid until the next call, possibly empty). */
int sl_detok_push(sl_detok *d, int32_t id, const char **out, size_t *len, sl_err *e);
/* Ends the sequence: a still incomplete character comes out as U+FFFD. */
int sl_detok_flush(sl_detok *d, const char **out, size_t *len, sl_err *e);

#endif
