/* A 2-D weight matrix as the kernels see it: `rows` outputs x `cols` inputs, row-major (or transposed, see
 * below), in one of the stored formats. The bytes stay where the checkpoint put them (mmap) — nothing is dequantised at
 * load. */
#ifndef SLUICE_BACKEND_WEIGHT_H
#define SLUICE_BACKEND_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    SL_WF_NONE = 0,
    SL_WF_F32,
    SL_WF_F16,
    SL_WF_BF16,
    SL_WF_MLX,  /* affine: w = scale * q + bias per group of `group` inputs; q packed `bits` per value */
    SL_WF_GGML, /* a GGML block-quantised type (`gtype`); rows are whole blocks, see backend/ggml_types.h */
    SL_WF_FP8,  /* float8 e4m3fn, w = value * scale per tile of tile_rows x group (DeepSeek's block FP8) */
    /* OCP microscaling FP4 as OpenAI ships gpt-oss: data holds two E2M1 codes a byte (element 2j in the low
     * nibble of byte j), `scales` one E8M0 exponent byte per block of 32 inputs (value 2^(s-127)), rows
     * of cols/32 bytes. Unlike GGML's MXFP4 block (scale byte + 16 bytes, element j beside j + 16), the
     * codes and the scales are separate arrays, so the checkpoint's tensors are used in place. */
    SL_WF_MXFP4,
} sl_wfmt;

typedef struct sl_weight {
    sl_wfmt fmt;
    int rows, cols;
    const uint8_t *data;
    size_t row_bytes;
    /* MLX: per-row arrays of cols/group scales and biases, stored as sb_fmt (F32, F16 or BF16) */
    int bits, group;
    sl_wfmt sb_fmt;
    const uint8_t *scales, *biases; /* MXFP4: scales are the E8M0 bytes [rows][cols / 32] */
    /* FP8 only: scales are float32 [ceil(rows / tile_rows)][ceil(cols / group)] (weight_scale_inv) */
    int tile_rows;
    /* GGML only: the type id (sl_ggml_type); data is the first block of row 0 and row_bytes = blocks
     * per row x block bytes */
    int gtype;
    /* F32/F16/BF16 only: stored inputs-first, element (r, j) at data[j * rows + r] (a [cols, rows] matrix, as
     * gpt-oss stores its experts), so the kernels read the checkpoint's bytes as they are; the data still
     * spans rows * row_bytes bytes */
    int transposed;
    /* optional additive bias of the linear layer, float32 [rows] (owned by the model) */
    const float *bias;
    /* products kept near fp32 where a backend would round them to bf16: set on every weight of a
     * mixture-of-experts model where it is placed (models/model.c), since a small shift anywhere upstream of
     * a router changes which experts run */
    int exact;
} sl_weight;

/* Value of E2M1 code q (0..15) and of E8M0 exponent byte s (255 is NaN). */
float sl_e2m1(unsigned q);
float sl_e8m0(uint8_t s);
/* Row r of an MXFP4 weight as float32 into dst[w->cols]. */
void sl_mxfp4_row(const sl_weight *w, int r, float *dst);

/* Bytes of storage the weight occupies (data + scales + biases). */
size_t sl_weight_bytes(const sl_weight *w);
/* Bytes of the weight's scales array (MLX: per group, FP8: per tile, MXFP4: per block of 32); 0 for the other
 * formats. */
size_t sl_weight_scale_bytes(const sl_weight *w);
/* Scale of element (r, c) of an FP8 weight. */
static inline float sl_fp8_scale(const sl_weight *w, int r, int c) {
    int tc = (w->cols + w->group - 1) / w->group;
    return ((const float *)(const void *)w->scales)[(size_t)(r / w->tile_rows) * (size_t)tc + (size_t)(c / w->group)];
}
const char *sl_wfmt_name(const sl_weight *w, char *buf, size_t n);

#endif
