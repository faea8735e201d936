#include "runtime/finite.h"

#include <string.h>

/* An IEEE float is NaN or infinite exactly when its exponent bits are all ones; testing the bits keeps the
 * loop branch-free and vectorisable, and immune to -ffast-math's assumption that NaNs do not occur. */
static int row_finite(const float *x, size_t n) {
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

int sl_check_logits(const float *rows, size_t n_rows, size_t vocab, int first_pos, sl_err *e) {
    for (size_t r = 0; r < n_rows; r++)
        if (!row_finite(rows + r * vocab, vocab))
            return sl_fail(e,
                           "the model produced non-finite logits (NaN/Inf) at position %d: the weights may be "
                           "corrupt",
                           first_pos + (int)r);
    return 0;
}
