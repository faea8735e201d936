/* One-token matmul (the fused decode kernels) against a double-precision dot of the dequantised rows,
 * for every weight format and bit width, with column counts that leave vector tails. ctest runs this
 * under each SLUICE_CPU_ISA so the AVX-512, AVX2 and generic paths are all checked. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "core/half.h"

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void check(sl_backend *be, const sl_weight *w, unsigned seed) {
    float *x = malloc(sizeof *x * (size_t)w->cols), *y = malloc(sizeof *y * (size_t)w->rows);
    float *row = malloc(sizeof *row * (size_t)w->cols);
    for (int i = 0; i < w->cols; i++) x[i] = frand(&seed);
    be->ops->matmul(be, w, x, 1, y);
    cr_assert_eq(be->ops->check(be, NULL), 0);
    for (int r = 0; r < w->rows; r++) {
        cpu_row_f32(w, r, row);
        double ref = 0, mag = 0;
        for (int i = 0; i < w->cols; i++) {
            ref += (double)row[i] * x[i];
            mag += fabs((double)row[i] * x[i]);
        }
        if (w->bias) ref += w->bias[r];
        cr_assert(fabs(y[r] - ref) <= 1e-5 * (mag + 1), "fmt %d bits %d cols %d row %d: %.7g vs %.7g", w->fmt, w->bits,
                  w->cols, r, (double)y[r], ref);
    }
    free(x);
    free(y);
    free(row);
}

Test(gemv, plain_formats_with_tails) {
    sl_backend *be;
    sl_err e;
    cr_assert_eq(sl_cpu_backend_create(2, &be, &e), 0);
    const sl_wfmt fmts[] = {SL_WF_F32, SL_WF_BF16, SL_WF_F16};
    const int colss[] = {32, 64, 200, 37, 7};
    for (int f = 0; f < 3; f++)
        for (int k = 0; k < 5; k++) {
            int rows = 45, cols = colss[k];
            size_t es = fmts[f] == SL_WF_F32 ? 4 : 2;
            uint8_t *d = malloc((size_t)rows * (size_t)cols * es);
            unsigned s = 99u + (unsigned)(f * 10 + k);
            for (int i = 0; i < rows * cols; i++) {
                float v = frand(&s);
                if (fmts[f] == SL_WF_F32)
                    ((float *)d)[i] = v;
                else if (fmts[f] == SL_WF_BF16)
                    ((uint16_t *)d)[i] = sl_f32_to_bf16(v);
                else
                    ((uint16_t *)d)[i] = sl_f32_to_f16(v);
            }
            float bias[45];
            for (int i = 0; i < rows; i++) bias[i] = frand(&s);
            sl_weight w = {.fmt = fmts[f],
                           .rows = rows,
                           .cols = cols,
                           .data = d,
                           .row_bytes = (size_t)cols * es,
                           .bias = k % 2 ? bias : NULL};
            check(be, &w, s);
            free(d);
        }
    sl_backend_destroy(be);
}

/* Block FP8 with every byte value (NaN codes aside), tiles cut short at the edges, and widths the vector
 * kernels take (multiples of 16) beside one they leave to the row path. */
Test(gemv, fp8_tiles) {
    sl_backend *be;
    sl_err e;
    cr_assert_eq(sl_cpu_backend_create(2, &be, &e), 0);
    const int colss[] = {256, 320, 200, 48}, groups[] = {128, 128, 128, 16};
    for (int k = 0; k < 4; k++) {
        int rows = 150, cols = colss[k], bc = groups[k], br = 128, tr = (rows + br - 1) / br, tc = (cols + bc - 1) / bc;
        uint8_t *d = malloc((size_t)rows * (size_t)cols);
        float *sc = malloc(sizeof *sc * (size_t)(tr * tc));
        unsigned s = 7u + (unsigned)k;
        for (int i = 0; i < rows * cols; i++) {
            uint8_t b = (uint8_t)(i * 37 + k);
            d[i] = (b & 0x7f) == 0x7f ? 0 : b;
        }
        for (int i = 0; i < tr * tc; i++) sc[i] = 1e-3f * (1.0f + frand(&s));
        sl_weight w = {.fmt = SL_WF_FP8,
                       .rows = rows,
                       .cols = cols,
                       .data = d,
                       .row_bytes = (size_t)cols,
                       .group = bc,
                       .tile_rows = br,
                       .sb_fmt = SL_WF_F32,
                       .scales = (const uint8_t *)sc};
        check(be, &w, s);
        free(d);
        free(sc);
    }
    sl_backend_destroy(be);
}

Test(gemv, mlx_every_bit_width_and_group) {
    sl_backend *be;
    sl_err e;
    cr_assert_eq(sl_cpu_backend_create(2, &be, &e), 0);
    const int bitss[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    for (int b = 0; b < 6; b++)
        for (int g = 0; g < 3; g++) {
            int rows = 19, cols = 256, bits = bitss[b], group = groups[g];
            size_t rb = (size_t)cols * (size_t)bits / 8, ng = (size_t)(cols / group);
            uint8_t *d = malloc((size_t)rows * rb);
            uint16_t *sc = malloc(sizeof *sc * (size_t)rows * ng), *bi = malloc(sizeof *bi * (size_t)rows * ng);
            unsigned s = 7u + (unsigned)(b * 3 + g);
            for (size_t i = 0; i < (size_t)rows * rb; i++) d[i] = (uint8_t)(frand(&s) * 127 + 128);
            for (size_t i = 0; i < (size_t)rows * ng; i++) {
                sc[i] = sl_f32_to_bf16(0.01f + 0.02f * frand(&s));
                bi[i] = sl_f32_to_bf16(0.1f * frand(&s));
            }
            sl_weight w = {.fmt = SL_WF_MLX,
                           .rows = rows,
                           .cols = cols,
                           .data = d,
                           .row_bytes = rb,
                           .bits = bits,
                           .group = group,
                           .sb_fmt = SL_WF_BF16,
                           .scales = (uint8_t *)sc,
                           .biases = (uint8_t *)bi};
            check(be, &w, s);
            free(d);
            free(sc);
            free(bi);
        }
    sl_backend_destroy(be);
}
