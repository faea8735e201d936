/* Writes safetensors checkpoints: one model.safetensors, or shards model-0000i-of-0000N.safetensors plus
 * model.safetensors.index.json when the data exceeds the shard size. Tensor bytes are produced chunk by
 * chunk by a caller's fill function, so checkpoints larger than memory stream straight to disk. */
#ifndef SLUICE_FORMATS_ST_WRITE_H
#define SLUICE_FORMATS_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "formats/safetensors.h"

typedef struct sl_st_wtensor {
    char name[192];
    sl_st_dtype dtype;
    int ndim;
    int64_t shape[SL_ST_MAX_DIMS];
    int kind; /* caller's tag for the fill function */
    float arg;
} sl_st_wtensor;

uint64_t sl_st_wtensor_bytes(const sl_st_wtensor *t);

/* Writes bytes [off, off + n) of tensor t into buf. */
typedef void (*sl_st_fill_fn)(void *ctx, const sl_st_wtensor *t, uint64_t off, uint8_t *buf, size_t n);
/* Called after each chunk with the bytes written so far and the total. */
typedef void (*sl_st_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Writes the tensors, in order, into dir (which must exist); a shard closes once it holds at least
 * shard_bytes of data (0: a single file). */
int sl_st_write(const char *dir, const sl_st_wtensor *t, int n, uint64_t shard_bytes, sl_st_fill_fn fill,
                sl_st_progress_fn progress, void *ctx, sl_err *e);

#endif
