#include "backend/weight.h"

#include <stdio.h>

#include "backend/ggml_types.h"

static size_t elt(sl_wfmt f) {
    return f == SL_WF_F32 ? 4 : 2;
}

size_t sl_weight_scale_bytes(const sl_weight *w) {
    if (w->fmt == SL_WF_MLX) return (size_t)w->rows * (size_t)(w->cols / w->group) * elt(w->sb_fmt);
    if (w->fmt == SL_WF_FP8)
        return (size_t)((w->rows + w->tile_rows - 1) / w->tile_rows) * (size_t)((w->cols + w->group - 1) / w->group) *
               4;
    return 0;
}

size_t sl_weight_bytes(const sl_weight *w) {
    size_t b = w->row_bytes * (size_t)w->rows + sl_weight_scale_bytes(w);
    if (w->fmt == SL_WF_MLX) b += sl_weight_scale_bytes(w); /* the biases */
    return b;
}

const char *sl_wfmt_name(const sl_weight *w, char *buf, size_t n) {
    switch (w->fmt) {
    case SL_WF_F32: snprintf(buf, n, "F32"); break;
    case SL_WF_F16: snprintf(buf, n, "F16"); break;
    case SL_WF_BF16: snprintf(buf, n, "BF16"); break;
    case SL_WF_MLX: snprintf(buf, n, "MLX%d/g%d", w->bits, w->group); break;
    case SL_WF_FP8: snprintf(buf, n, "FP8 e4m3/%dx%d", w->tile_rows, w->group); break;
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
