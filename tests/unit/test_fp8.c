/* Block FP8 weights (DeepSeek's float8 e4m3fn with a float32 scale per tile): the decoding of every byte
 * (zero and negative zero, subnormals, the smallest normal, 448 the largest, NaN for S.1111.111), and CPU
 * matmuls of one and of several tokens over a matrix whose edges cut tiles short, against double-precision
 * sums of value * scale. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "core/half.h"

/* The e4m3fn value of byte b from its definition (NaN for the two NaN codes). */
static double e4m3_ref(unsigned b) {
    int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
    if (exp == 15 && man == 7) return NAN;
    double v = exp ? ldexp(1.0 + man / 8.0, exp - 7) : ldexp(man / 8.0, -6);
    return sign ? -v : v;
}

Test(fp8, e4m3_edges) {
    cr_assert_eq(sl_fp8_e4m3_to_f32(0x00), 0.0f);
    cr_assert(signbit(sl_fp8_e4m3_to_f32(0x80)) && sl_fp8_e4m3_to_f32(0x80) == 0.0f, "0x80 is -0");
    cr_assert_eq(sl_fp8_e4m3_to_f32(0x01), 0x1p-9f, "smallest subnormal");
    cr_assert_eq(sl_fp8_e4m3_to_f32(0x07), 7 * 0x1p-9f, "largest subnormal");
    cr_assert_eq(sl_fp8_e4m3_to_f32(0x08), 0x1p-6f, "smallest normal");
    cr_assert_eq(sl_fp8_e4m3_to_f32(0x38), 1.0f);
    cr_assert_eq(sl_fp8_e4m3_to_f32(0x3c), 1.5f);
    cr_assert_eq(sl_fp8_e4m3_to_f32(0x7e), 448.0f, "largest finite");
    cr_assert_eq(sl_fp8_e4m3_to_f32(0xfe), -448.0f);
    cr_assert(isnan(sl_fp8_e4m3_to_f32(0x7f)) && isnan(sl_fp8_e4m3_to_f32(0xff)), "S.1111.111 is NaN");
    cr_assert(!isinf(sl_fp8_e4m3_to_f32(0x78)), "no infinities: 0x78 is 256");
    for (unsigned b = 0; b < 256; b++) {
        double r = e4m3_ref(b);
        float f = sl_fp8_e4m3_to_f32((uint8_t)b);
        if (isnan(r))
            cr_assert(isnan(f), "byte 0x%02x: NaN expected", b);
        else
            cr_assert_eq((double)f, r, "byte 0x%02x: %.9g, expected %.9g", b, (double)f, r);
    }
}

static unsigned next(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

Test(fp8, cpu_matmul_tiles) {
    enum { ROWS = 150, COLS = 200, BR = 128, BC = 128 };
    int tr = (ROWS + BR - 1) / BR, tc = (COLS + BC - 1) / BC;
    uint8_t *q = malloc((size_t)ROWS * COLS);
    float *sc = malloc(sizeof *sc * (size_t)(tr * tc));
    unsigned s = 7;
    for (int i = 0; i < ROWS * COLS; i++) {
        uint8_t b = (uint8_t)next(&s);
        q[i] = (b & 0x7f) == 0x7f ? 0x3c : b; /* no NaN in a weight */
    }
    for (int i = 0; i < tr * tc; i++) sc[i] = 1e-3f * (float)(1 + i);
    sl_weight w = {.fmt = SL_WF_FP8,
                   .rows = ROWS,
                   .cols = COLS,
                   .data = q,
                   .row_bytes = COLS,
                   .group = BC,
                   .tile_rows = BR,
                   .sb_fmt = SL_WF_F32,
                   .scales = (const uint8_t *)sc};
    sl_backend *be;
    sl_err e;
    cr_assert_eq(sl_cpu_backend_create(2, &be, &e), 0, "%s", e.msg);
    enum { N = 5 };
    float *x = malloc(sizeof *x * N * COLS), *y = malloc(sizeof *y * N * ROWS);
    for (int i = 0; i < N * COLS; i++) x[i] = (float)((int)(next(&s) % 2001) - 1000) / 1000.0f;
    for (int n = 1; n <= N; n += N - 1) {
        be->ops->matmul(be, &w, x, n, y);
        cr_assert_eq(be->ops->check(be, &e), 0);
        for (int t = 0; t < n; t++)
            for (int r = 0; r < ROWS; r++) {
                double ref = 0, mag = 0;
                for (int c = 0; c < COLS; c++) {
                    double v = e4m3_ref(q[r * COLS + c]) * sc[(r / BR) * tc + c / BC] * x[t * COLS + c];
                    ref += v;
                    mag += fabs(v);
                }
                cr_assert(fabs(y[t * ROWS + r] - ref) <= 1e-5 * (mag + 1e-3), "n %d token %d row %d: %.7g vs %.7g", n,
                          t, r, (double)y[t * ROWS + r], ref);
            }
    }
    char buf[64];
    cr_assert_str_eq(sl_wfmt_name(&w, buf, sizeof buf), "FP8 e4m3/128x128");
    cr_assert_eq(sl_weight_bytes(&w), (size_t)ROWS * COLS + (size_t)(tr * tc) * 4);
    sl_backend_destroy(be);
    free(x);
    free(y);
    free(q);
    free(sc);
}
