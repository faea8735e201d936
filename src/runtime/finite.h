/* A cheap check of the logits a forward pass returned to the host: corrupt weights (NaN, Inf) otherwise flow
 * silently into sampling and come out as garbage text. */
#ifndef SLUICE_RUNTIME_FINITE_H
#define SLUICE_RUNTIME_FINITE_H

#include <stddef.h>

#include "core/err.h"

/* Fails, naming the position, when any of n_rows rows of vocab logits (row i at position first_pos + i) holds
 * a NaN or an infinity. */
int sl_check_logits(const float *rows, size_t n_rows, size_t vocab, int first_pos, sl_err *e);

#endif
