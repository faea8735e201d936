/* The CPU matmul's batched paths (register-tiled for small n, packed panels for n >= 12) against its
 * one-token path, over shapes that leave partial tiles and column tails. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "core/half.h"

static float frand(unsigned *st) {
    *st = *st * 1103515245u + 12345u;
    return (float)((*st >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static void check_shape(sl_wfmt fmt, int rows, int cols, int n, int with_bias) {
    sl_backend *be;
    sl_err e = {{0}};
    cr_assert_eq(sl_cpu_backend_create(2, &be, &e), 0, "%s", e.msg);
    unsigned st = (unsigned)(rows * 131 + cols * 7 + n);
    size_t es = fmt == SL_WF_F32 ? 4 : 2;
    uint8_t *data = malloc((size_t)rows * (size_t)cols * es);
    float *bias = malloc(sizeof *bias * (size_t)rows);
    float *x = malloc(sizeof *x * (size_t)n * (size_t)cols);
    float *y = malloc(sizeof *y * (size_t)n * (size_t)rows), *y1 = malloc(sizeof *y1 * (size_t)rows);
    for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++) {
        float v = frand(&st);
        if (fmt == SL_WF_F32)
            ((float *)data)[i] = v;
        else
            ((uint16_t *)data)[i] = sl_f32_to_bf16(v);
    }
    for (int i = 0; i < rows; i++) bias[i] = frand(&st);
    for (size_t i = 0; i < (size_t)n * (size_t)cols; i++) x[i] = frand(&st);
    sl_weight w = {.fmt = fmt,
                   .rows = rows,
                   .cols = cols,
                   .data = data,
                   .row_bytes = (size_t)cols * es,
                   .bias = with_bias ? bias : NULL};
    be->ops->matmul(be, &w, x, n, y);
    for (int t = 0; t < n; t++) {
        be->ops->matmul(be, &w, x + (size_t)t * (size_t)cols, 1, y1);
        for (int r = 0; r < rows; r++)
            cr_assert(fabsf(y[(size_t)t * (size_t)rows + (size_t)r] - y1[r]) <= 1e-5f * (1.0f + fabsf(y1[r])),
                      "rows %d cols %d n %d: token %d row %d: %g vs %g", rows, cols, n, t, r,
                      y[(size_t)t * (size_t)rows + (size_t)r], y1[r]);
    }
    cr_assert_eq(be->ops->check(be, &e), 0, "%s", e.msg);
    free(data);
    free(bias);
    free(x);
    free(y);
    free(y1);
    sl_backend_destroy(be);
}

Test(cpu_matmul, batch_matches_single_token) {
    check_shape(SL_WF_F32, 7, 37, 5, 0);
    check_shape(SL_WF_F32, 64, 128, 9, 1);
    check_shape(SL_WF_BF16, 33, 16, 2, 1);
    check_shape(SL_WF_BF16, 100, 257, 13, 0);
    check_shape(SL_WF_BF16, 1, 5, 3, 1);
    /* 12+ tokens: the packed outer-product path, with partial 32-row panels and token tiles */
    check_shape(SL_WF_F32, 40, 37, 12, 1);
    check_shape(SL_WF_BF16, 70, 130, 30, 1);
    check_shape(SL_WF_BF16, 16, 64, 25, 0);
    check_shape(SL_WF_BF16, 3, 7, 14, 1);
}
