/* GGML block-quantised tensor types, as GGUF files store them: the type ids (the numbers GGUF writes
 * in each tensor info), block geometry, and the reference dequantisation of a row. Each type packs
 * `block size` consecutive values of a row into `block bytes`; a row is a whole number of blocks. */
#ifndef SLUICE_BACKEND_GGML_TYPES_H
#define SLUICE_BACKEND_GGML_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "backend/weight.h"
#include "core/err.h"

typedef enum sl_ggml_type {
    SL_GGML_F32 = 0,
    SL_GGML_F16 = 1,
    SL_GGML_Q4_0 = 2,
    SL_GGML_Q4_1 = 3,
    SL_GGML_Q5_0 = 6,
    SL_GGML_Q5_1 = 7,
    SL_GGML_Q8_0 = 8,
    SL_GGML_Q8_1 = 9,
    SL_GGML_Q2_K = 10,
    SL_GGML_Q3_K = 11,
    SL_GGML_Q4_K = 12,
    SL_GGML_Q5_K = 13,
    SL_GGML_Q6_K = 14,
    SL_GGML_Q8_K = 15,
    SL_GGML_IQ2_XXS = 16,
    SL_GGML_IQ2_XS = 17,
    SL_GGML_IQ3_XXS = 18,
    SL_GGML_IQ1_S = 19,
    SL_GGML_IQ4_NL = 20,
    SL_GGML_IQ3_S = 21,
    SL_GGML_IQ2_S = 22,
    SL_GGML_IQ4_XS = 23,
    SL_GGML_I8 = 24,
    SL_GGML_I16 = 25,
    SL_GGML_I32 = 26,
    SL_GGML_I64 = 27,
    SL_GGML_F64 = 28,
    SL_GGML_IQ1_M = 29,
    SL_GGML_BF16 = 30,
    SL_GGML_TQ1_0 = 34,
    SL_GGML_TQ2_0 = 35,
    SL_GGML_MXFP4 = 39,
    SL_GGML_TYPE_END /* one past the largest id known */
} sl_ggml_type;

/* The name ggml gives type t ("Q4_K"), or NULL when t is not a known id. Known types that sluice cannot
 * compute with (Q8_1, IQ1_M, ...) have names too, so errors can say which type a file uses. */
const char *sl_ggml_type_name(int t);
/* Values per block and bytes per block (0 for unknown ids). */
int sl_ggml_block_size(int t);
size_t sl_ggml_block_bytes(int t);
/* Whether the CPU backend dequantises and multiplies type t. */
int sl_ggml_supported(int t);
/* Bytes of one row of `cols` values; cols must be a multiple of the block size. */
size_t sl_ggml_row_bytes(int t, int64_t cols);
/* Dequantises one row of `cols` values (a multiple of the block size) of supported type t into dst,
 * by the format's reference formulas. */
void sl_ggml_dequant_row(int t, const void *src, float *dst, int64_t cols);
/* Dequantises one block of a block-quantised supported type into dst[block size]. */
void sl_ggml_dequant_block(int t, const uint8_t *blk, float *dst);
/* Quantises `cols` values (a multiple of 32) into Q8_0 blocks at dst, as GGML's reference does: per 32, the
 * scale d = max |x| / 127 stored in fp16, and each value round(x / d) (halves away from zero). */
void sl_ggml_quant_q8_0_row(const float *src, void *dst, int64_t cols);

/* Fills *w for a [rows, cols] matrix of type t stored row-major at data: F32/F16/BF16 become the plain
 * formats, every other supported type SL_WF_GGML. Fails, naming `tensor`, when the type is unknown or
 * unsupported or cols is not a positive multiple of its block size. */
int sl_ggml_weight(sl_weight *w, const char *tensor, int t, int64_t rows, int64_t cols, const void *data, sl_err *e);

#endif
