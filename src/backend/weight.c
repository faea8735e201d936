#include "backend/weight.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/ggml_types.h"

static size_t elt(sl_wfmt f) {
    return f == SL_WF_F32 ? 4 : 2;
}

size_t sl_weight_scale_bytes(const sl_weight *w) {
    if (w->fmt == SL_WF_MLX) return (size_t)w->rows * (size_t)(w->cols / w->group) * elt(w->sb_fmt);
    if (w->fmt == SL_WF_FP8)
        return (size_t)((w->rows + w->tile_rows - 1) / w->tile_rows) * (size_t)((w->cols + w->group - 1) / w->group) *
               4;
    if (w->fmt == SL_WF_MXFP4) return (size_t)w->rows * (size_t)(w->cols / 32); /* one E8M0 byte a block */
    return 0;
}

size_t sl_weight_bytes(const sl_weight *w) {
    size_t b = w->row_bytes * (size_t)w->rows + sl_weight_scale_bytes(w);
    if (w->fmt == SL_WF_MLX) b += sl_weight_scale_bytes(w); /* the biases */
    return b;
}

float sl_e2m1(unsigned q) {
    /* sign, 2 exponent bits (bias 1), 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 */
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return q & 8 ? -mag[q & 7] : mag[q & 7];
}

float sl_e8m0(uint8_t s) {
    if (s == 255) return NAN;
    /* 2^(s-127) as the float with exponent field s; s = 0 (2^-127) is subnormal */
    uint32_t u = s ? (uint32_t)s << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void sl_mxfp4_row(const sl_weight *w, int r, float *dst) {
    const uint8_t *q = w->data + (size_t)r * w->row_bytes;
    const uint8_t *s = w->scales + (size_t)r * (size_t)(w->cols / 32);
    for (int b = 0; b < w->cols / 32; b++) {
        float d = sl_e8m0(s[b]);
        for (int j = 0; j < 16; j++) {
            uint8_t v = q[b * 16 + j];
            dst[b * 32 + 2 * j] = sl_e2m1(v & 15u) * d;
            dst[b * 32 + 2 * j + 1] = sl_e2m1(v >> 4) * d;
        }
    }
}

const char *sl_wfmt_name(const sl_weight *w, char *buf, size_t n) {
    switch (w->fmt) {
    case SL_WF_F32: snprintf(buf, n, "F32"); break;
    case SL_WF_F16: snprintf(buf, n, "F16"); break;
    case SL_WF_BF16: snprintf(buf, n, "BF16"); break;
    case SL_WF_MLX: snprintf(buf, n, "MLX%d/g%d", w->bits, w->group); break;
    case SL_WF_FP8: snprintf(buf, n, "FP8 e4m3/%dx%d", w->tile_rows, w->group); break;
    case SL_WF_MXFP4: snprintf(buf, n, "MXFP4"); break;
    case SL_WF_GGML: {
        const char *t = sl_ggml_type_name(w->gtype);
        if (t)
            snprintf(buf, n, "%s", t);
        else
            snprintf(buf, n, "GGML type %d", w->gtype);
        break;
    }
    default: snprintf(buf, n, "none"); break;
    }
    return buf;
}
