/* Writes GGUF v3 files: metadata (integers, floats, strings, bools, integer arrays) and tensors in any
 * GGML type, data aligned to 32 bytes. Tensor bytes come chunk by chunk from a caller's fill function, so
 * files larger than memory stream straight to disk. */
#ifndef SLUICE_FORMATS_GGUF_WRITE_H
#define SLUICE_FORMATS_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "formats/gguf.h"

typedef struct sl_gguf_wkv {
    const char *key;
    sl_gguf_vtype type; /* U32, I32, U64, F32, BOOL, STRING, or ARRAY (of I32) */
    int64_t i;          /* integers and bools */
    double f;
    const char *s;
    const int32_t *arr; /* ARRAY: n elements */
    uint64_t n;
} sl_gguf_wkv;

typedef struct sl_gguf_wtensor {
    char name[96];
    int type; /* GGML type id */
    int ndim;
    int64_t ne[SL_GGUF_MAX_DIMS]; /* ggml order: ne[0] is the contiguous dimension */
    int kind;                     /* caller's tag for the fill function */
    float arg;
} sl_gguf_wtensor;

/* Bytes of the tensor's data (ne[0] a multiple of the type's block size). */
uint64_t sl_gguf_wtensor_bytes(const sl_gguf_wtensor *t);

/* Writes bytes [off, off + n) of tensor t into buf. */
typedef void (*sl_gguf_fill_fn)(void *ctx, const sl_gguf_wtensor *t, uint64_t off, uint8_t *buf, size_t n);
/* Called after each chunk with the data bytes written so far and the total; may be NULL. */
typedef void (*sl_gguf_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Writes path. Fails naming the file on I/O errors and naming the tensor when its type is unknown or
 * its rows are not whole blocks. */
int sl_gguf_write(const char *path, const sl_gguf_wkv *kv, int n_kv, const sl_gguf_wtensor *t, int n_t,
                  sl_gguf_fill_fn fill, sl_gguf_progress_fn progress, void *ctx, sl_err *e);

#endif
