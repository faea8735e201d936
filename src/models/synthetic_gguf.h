/* The q4k synthetic checkpoints (see synthetic.h): one GGUF file in the layout llama.cpp writes, matrices
 * in GGML Q4_K except the output head in Q6_K (Q5_0 where rows are not whole super-blocks), norms, routers and the
 * delta-net's small vectors in F32. */
#ifndef SLUICE_MODELS_SYNTHETIC_GGUF_H
#define SLUICE_MODELS_SYNTHETIC_GGUF_H

#include <stdint.h>

#include "core/err.h"
#include "models/synthetic.h"

/* Bytes of tensor data in the file for `layers` layers (already clamped to the shape's count). */
uint64_t sl_synth_gguf_bytes(const sl_synth_shape *s, int layers);

/* Writes the file at path; progress (may be NULL) gets the data bytes written and the total. */
int sl_synth_gguf_write(const sl_synth_shape *s, int layers, const char *path,
                        void (*progress)(void *ctx, uint64_t done, uint64_t total), void *pctx, sl_err *e);

#endif
