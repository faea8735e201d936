/* The CPU matmul's batched paths (register-tiled for small n, packed panels for n >= 12) against its
 * one-token path, over shapes that leave partial tiles and column tails. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/half.h"
#include "testutil.h"

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
        float v = tu_frand(&st);
        if (fmt == SL_WF_F32)
            ((float *)data)[i] = v;
        else
            ((uint16_t *)data)[i] = sl_f32_to_bf16(v);
    }
    for (int i = 0; i < rows; i++) bias[i] = tu_frand(&st);
    for (size_t i = 0; i < (size_t)n * (size_t)cols; i++) x[i] = tu_frand(&st);
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

/* MXFP4 (OCP microscaling FP4, as gpt-oss ships its experts): every E2M1 code, E8M0 scales across the
 * exponent range, and the nibble order (element 2j in the low nibble of byte j). */
Test(mxfp4, decode) {
    static const float want[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (unsigned q = 0; q < 16; q++) {
        cr_assert_eq(sl_e2m1(q), want[q], "E2M1 code %u: %g, expected %g", q, (double)sl_e2m1(q), (double)want[q]);
        cr_assert_eq(signbit(sl_e2m1(q)) != 0, q >= 8, "E2M1 code %u: sign", q);
    }
    cr_assert_eq(sl_e8m0(127), 1.0f);
    cr_assert_eq(sl_e8m0(128), 2.0f);
    cr_assert_eq(sl_e8m0(126), 0.5f);
    cr_assert_eq(sl_e8m0(1), ldexpf(1.0f, -126));
    cr_assert_eq(sl_e8m0(0), ldexpf(1.0f, -127));
    cr_assert_eq(sl_e8m0(254), ldexpf(1.0f, 127));
    cr_assert(isnan(sl_e8m0(255)));
    /* one row of two blocks: byte j holds codes (j, 15 - j) in (low, high) nibbles */
    uint8_t codes[32], scales[2] = {127 + 3, 127 - 2};
    for (int j = 0; j < 32; j++) codes[j] = (uint8_t)((j % 16) | ((15 - j % 16) << 4));
    sl_weight w = {.fmt = SL_WF_MXFP4, .rows = 1, .cols = 64, .data = codes, .row_bytes = 32, .scales = scales};
    float row[64];
    sl_mxfp4_row(&w, 0, row);
    for (int i = 0; i < 64; i++) {
        int byte = i / 2, q = i % 2 ? 15 - byte % 16 : byte % 16;
        float s = i < 32 ? 8.0f : 0.25f;
        cr_assert_eq(row[i], want[q] * s, "element %d: %g, expected %g", i, (double)row[i], (double)(want[q] * s));
    }
}

/* The MXFP4 matmul (fused one-token kernel, batched row path) against the decoded weight in float32. */
Test(mxfp4, matmul) {
    sl_backend *be;
    sl_err e = {{0}};
    cr_assert_eq(sl_cpu_backend_create(2, &be, &e), 0, "%s", e.msg);
    enum { R = 19, C = 96, N = 5 };
    unsigned st = 7;
    uint8_t codes[R * C / 2], scales[R * C / 32];
    for (size_t i = 0; i < sizeof codes; i++) codes[i] = (uint8_t)(tu_frand(&st) * 65536.0f + 32768.0f);
    for (size_t i = 0; i < sizeof scales; i++) scales[i] = (uint8_t)(120 + i % 10);
    float bias[R], x[N * C], y[N * R], y1[R], wf[C];
    for (int i = 0; i < R; i++) bias[i] = tu_frand(&st);
    for (int i = 0; i < N * C; i++) x[i] = tu_frand(&st);
    sl_weight w = {.fmt = SL_WF_MXFP4,
                   .rows = R,
                   .cols = C,
                   .data = codes,
                   .row_bytes = C / 2,
                   .scales = scales,
                   .group = 32,
                   .bias = bias};
    be->ops->matmul(be, &w, x, N, y);
    for (int t = 0; t < N; t++) {
        be->ops->matmul(be, &w, x + t * C, 1, y1);
        for (int r = 0; r < R; r++) {
            sl_mxfp4_row(&w, r, wf);
            double ref = bias[r], mag = fabsf(bias[r]);
            for (int j = 0; j < C; j++) {
                ref += (double)wf[j] * x[t * C + j];
                mag += fabs((double)wf[j] * x[t * C + j]);
            }
            cr_assert(fabs(y[t * R + r] - ref) <= 1e-5 * mag, "token %d row %d: batch %g, expected %g", t, r,
                      (double)y[t * R + r], ref);
            cr_assert(fabs(y1[r] - ref) <= 1e-5 * mag, "token %d row %d: one token %g, expected %g", t, r,
                      (double)y1[r], ref);
        }
    }
    cr_assert_eq(be->ops->check(be, &e), 0, "%s", e.msg);
    sl_backend_destroy(be);
}

/* A transposed weight (stored inputs-first) gives the products of the same matrix stored row-major. */
static void check_transposed(sl_wfmt fmt, int rows, int cols, int n) {
    sl_backend *be;
    sl_err e = {{0}};
    cr_assert_eq(sl_cpu_backend_create(2, &be, &e), 0, "%s", e.msg);
    unsigned st = (unsigned)(rows * 17 + cols);
    size_t es = fmt == SL_WF_F32 ? 4 : 2, len = (size_t)rows * (size_t)cols;
    uint8_t *rm = malloc(len * es), *tr = malloc(len * es);
    float *bias = malloc(sizeof *bias * (size_t)rows), *x = malloc(sizeof *x * (size_t)n * (size_t)cols);
    float *y = malloc(sizeof *y * (size_t)n * (size_t)rows), *yt = malloc(sizeof *yt * (size_t)n * (size_t)rows);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            float v = tu_frand(&st);
            size_t a = (size_t)r * (size_t)cols + (size_t)j, b = (size_t)j * (size_t)rows + (size_t)r;
            if (fmt == SL_WF_F32) {
                ((float *)rm)[a] = ((float *)tr)[b] = v;
            } else {
                ((uint16_t *)rm)[a] = ((uint16_t *)tr)[b] = sl_f32_to_bf16(v);
            }
        }
    for (int i = 0; i < rows; i++) bias[i] = tu_frand(&st);
    for (size_t i = 0; i < (size_t)n * (size_t)cols; i++) x[i] = tu_frand(&st);
    sl_weight w = {.fmt = fmt, .rows = rows, .cols = cols, .data = rm, .row_bytes = (size_t)cols * es, .bias = bias};
    sl_weight wt = w;
    wt.data = tr;
    wt.transposed = 1;
    int ms[2] = {1, n}; /* the one-token and the batched paths */
    for (int q = 0; q < 2; q++) {
        int m = ms[q];
        be->ops->matmul(be, &w, x, m, y);
        be->ops->matmul(be, &wt, x, m, yt);
        for (size_t i = 0; i < (size_t)m * (size_t)rows; i++)
            cr_assert(fabsf(y[i] - yt[i]) <= 1e-5f * (1.0f + fabsf(y[i])), "rows %d cols %d n %d: output %zu: %g vs %g",
                      rows, cols, m, i, (double)yt[i], (double)y[i]);
    }
    float emb[2][300];
    int32_t id = rows - 1;
    cr_assert_leq(cols, 300);
    be->ops->embed(be, &w, &id, 1, emb[0]);
    be->ops->embed(be, &wt, &id, 1, emb[1]);
    cr_assert(!memcmp(emb[0], emb[1], sizeof(float) * (size_t)cols), "a transposed weight's row");
    cr_assert_eq(be->ops->check(be, &e), 0, "%s", e.msg);
    free(rm);
    free(tr);
    free(bias);
    free(x);
    free(y);
    free(yt);
    sl_backend_destroy(be);
}

Test(cpu_matmul, transposed) {
    check_transposed(SL_WF_F32, 7, 37, 5);
    check_transposed(SL_WF_BF16, 130, 96, 13);
    check_transposed(SL_WF_BF16, 64, 200, 1);
}
