/* GGML block quant types: each type's dequantisation against a per-element formula written here from
 * the block layout (independently of the library's block decoders), the codebooks' shape, the fused CPU
 * matmul against a double-precision dot of the dequantised rows for 1, 3, 12 and 40 tokens (ctest runs
 * this under each SLUICE_CPU_ISA), the MoE expert path, and the errors for bad shapes and types. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/ggml_grids.h"
#include "backend/ggml_types.h"
#include "core/half.h"

static unsigned rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static float frand(unsigned *s) {
    return (float)(rnd(s) & 0xffff) / 32768.0f - 1.0f;
}

static float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return sl_f16_to_f32(h);
}

static void put_f16(uint8_t *p, float v) {
    uint16_t h = sl_f32_to_f16(v);
    memcpy(p, &h, 2);
}

static unsigned u16(const uint8_t *p) {
    return (unsigned)p[0] | (unsigned)p[1] << 8;
}

static uint32_t u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Offsets of the float16 fields of each type's block (the rest of a block is any byte pattern). */
static int f16_fields(int t, int *off) {
    switch (t) {
    case SL_GGML_Q4_1:
    case SL_GGML_Q5_1:
    case SL_GGML_Q4_K:
    case SL_GGML_Q5_K: off[0] = 0, off[1] = 2; return 2;
    case SL_GGML_Q2_K: off[0] = 80, off[1] = 82; return 2;
    case SL_GGML_Q3_K: off[0] = 108; return 1;
    case SL_GGML_Q6_K: off[0] = 208; return 1;
    case SL_GGML_MXFP4: return 0;
    default: off[0] = 0; return 1;
    }
}

/* Random blocks with scales of a sensible size (and an E8M0 exponent near 1 for MXFP4). */
static void fill_blocks(int t, uint8_t *p, size_t nblocks, unsigned *s) {
    size_t bb = sl_ggml_block_bytes(t);
    for (size_t i = 0; i < nblocks * bb; i++) p[i] = (uint8_t)rnd(s);
    for (size_t b = 0; b < nblocks; b++) {
        uint8_t *blk = p + b * bb;
        int off[2];
        int n = f16_fields(t, off);
        for (int k = 0; k < n; k++) put_f16(blk + off[k], 0.002f + 0.01f * fabsf(frand(s)));
        if (t == SL_GGML_MXFP4) blk[0] = (uint8_t)(120 + rnd(s) % 10);
    }
}

static const int kv_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* E2M1: sign, 2 exponent bits, 1 mantissa bit; exponent 0 is subnormal (0 or 0.5). */
static double e2m1(unsigned v) {
    unsigned e = (v >> 1) & 3, m = v & 1;
    double mag = e == 0 ? 0.5 * m : (1.0 + 0.5 * m) * ldexp(1.0, (int)e - 1);
    return v & 8 ? -mag : mag;
}

/* 6-bit scales and mins of Q4_K/Q5_K, unpacked through 32-bit words (the layout seen as 3 words). */
static void k4_unpack(const uint8_t *s12, int *sc, int *mn) {
    uint32_t u[4] = {u32(s12), u32(s12 + 4), u32(s12 + 8), 0};
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    uint32_t t = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = t;
    u[0] &= m1;
    for (int j = 0; j < 8; j++) {
        sc[j] = (int)((u[j / 4] >> (8 * (j % 4))) & 0xff);
        mn[j] = (int)((u[2 + j / 4] >> (8 * (j % 4))) & 0xff);
    }
}

/* Q3_K scales: 4 low bits in bytes 0-7 (both nibbles), 2 high bits in bytes 8-11, as 32-bit words. */
static void k3_unpack(const uint8_t *s12, int *sc) {
    uint32_t a[4] = {u32(s12), u32(s12 + 4), u32(s12 + 8), 0};
    const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
    uint32_t t = a[2];
    a[2] = ((a[0] >> 4) & k2) | (((t >> 4) & k1) << 4);
    a[3] = ((a[1] >> 4) & k2) | (((t >> 6) & k1) << 4);
    a[0] = (a[0] & k2) | (((t >> 0) & k1) << 4);
    a[1] = (a[1] & k2) | (((t >> 2) & k1) << 4);
    for (int j = 0; j < 16; j++) sc[j] = (int)((a[j / 4] >> (8 * (j % 4))) & 0xff) - 32;
}

static int parity7(unsigned v) {
    int n = 0;
    for (int i = 0; i < 7; i++) n += (v >> i) & 1;
    return n & 1;
}

/* Sign of value j (0..7) of a group whose 7 stored sign bits are s7: the 8th keeps the count even. */
static double sign7(unsigned s7, int j) {
    unsigned bit = j < 7 ? (s7 >> j) & 1 : (unsigned)parity7(s7);
    return bit ? -1.0 : 1.0;
}

static unsigned gbyte64(const uint64_t *g, unsigned idx, int j) {
    return (unsigned)((g[idx] >> (8 * j)) & 0xff);
}

static unsigned gbyte32(const uint32_t *g, unsigned idx, int j) {
    return (unsigned)((g[idx] >> (8 * j)) & 0xff);
}

/* Value i of one block of type t, from the layout definitions. */
static double expect(int t, const uint8_t *b, int i) {
    switch (t) {
    case SL_GGML_Q4_0: return ((b[2 + i % 16] >> (4 * (i / 16)) & 15) - 8) * (double)h2f(b);
    case SL_GGML_Q4_1: return (b[4 + i % 16] >> (4 * (i / 16)) & 15) * (double)h2f(b) + h2f(b + 2);
    case SL_GGML_Q5_0: {
        unsigned q = (b[6 + i % 16] >> (4 * (i / 16)) & 15) | ((u32(b + 2) >> i) & 1) << 4;
        return ((int)q - 16) * (double)h2f(b);
    }
    case SL_GGML_Q5_1: {
        unsigned q = (b[8 + i % 16] >> (4 * (i / 16)) & 15) | ((u32(b + 4) >> i) & 1) << 4;
        return q * (double)h2f(b) + h2f(b + 2);
    }
    case SL_GGML_Q8_0: return (int8_t)b[2 + i] * (double)h2f(b);
    case SL_GGML_IQ4_NL: return kv_iq4nl[b[2 + i % 16] >> (4 * (i / 16)) & 15] * (double)h2f(b);
    case SL_GGML_MXFP4: return e2m1(b[1 + i % 16] >> (4 * (i / 16)) & 15) * ldexp(1.0, b[0] - 127);
    case SL_GGML_Q2_K: {
        int half = i / 128, j = i % 128 / 32, l = i % 32;
        unsigned sc = b[half * 8 + j * 2 + l / 16];
        unsigned q = (b[16 + half * 32 + l] >> (2 * j)) & 3;
        return h2f(b + 80) * (double)(sc & 15) * q - h2f(b + 82) * (double)(sc >> 4);
    }
    case SL_GGML_Q3_K: {
        int half = i / 128, j = i % 128 / 32, l = i % 32, sc[16];
        k3_unpack(b + 96, sc);
        int q = (b[32 + half * 32 + l] >> (2 * j)) & 3;
        int high = (b[l] >> (half * 4 + j)) & 1;
        return h2f(b + 108) * (double)sc[half * 8 + j * 2 + l / 16] * (q - (high ? 0 : 4));
    }
    case SL_GGML_Q4_K:
    case SL_GGML_Q5_K: {
        int sub = i / 32, sc[8], mn[8];
        k4_unpack(b + 4, sc, mn);
        const uint8_t *qs = b + (t == SL_GGML_Q4_K ? 16 : 48);
        unsigned q = (qs[32 * (i / 64) + i % 32] >> (4 * (sub % 2))) & 15;
        if (t == SL_GGML_Q5_K) q |= ((b[16 + i % 32] >> sub) & 1) << 4;
        return h2f(b) * (double)sc[sub] * q - h2f(b + 2) * (double)mn[sub];
    }
    case SL_GGML_Q6_K: {
        int half = i / 128, quarter = i % 128 / 32, l = i % 32;
        unsigned lo = (b[half * 64 + l + 32 * (quarter % 2)] >> (4 * (quarter / 2))) & 15;
        unsigned hi = (b[128 + half * 32 + l] >> (2 * quarter)) & 3;
        int sc = (int8_t)b[192 + half * 8 + quarter * 2 + l / 16];
        return h2f(b + 208) * sc * ((int)(lo | hi << 4) - 32);
    }
    case SL_GGML_IQ4_XS: {
        int ib = i / 32;
        int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (int)((u16(b + 2) >> (2 * ib)) & 3) << 4;
        int q = kv_iq4nl[(b[8 + 16 * ib + i % 16] >> (4 * (i % 32 / 16))) & 15];
        return h2f(b) * (ls - 32) * q;
    }
    default: break;
    }
    /* the IQ grid types: groups of 8 values, 4 groups per 32 */
    int ib = i / 32, l = i % 32 / 8, j = i % 8;
    double d = h2f(b);
    switch (t) {
    case SL_GGML_IQ2_XXS: {
        uint32_t aux = u32(b + 2 + 8 * ib + 4);
        double db = d * (0.5 + (aux >> 28)) * 0.25;
        return db * gbyte64(sl_iq2xxs_grid, b[2 + 8 * ib + l], j) * sign7((aux >> (7 * l)) & 127, j);
    }
    case SL_GGML_IQ2_XS: {
        unsigned q = u16(b + 2 + 2 * (4 * ib + l));
        unsigned s4 = (b[66 + ib] >> (4 * (l / 2))) & 15;
        return d * (0.5 + s4) * 0.25 * gbyte64(sl_iq2xs_grid, q & 511, j) * sign7(q >> 9, j);
    }
    case SL_GGML_IQ2_S: {
        unsigned idx = b[2 + 4 * ib + l] | ((b[66 + ib] >> (2 * l)) & 3) << 8;
        unsigned s4 = (b[74 + ib] >> (4 * (l / 2))) & 15;
        double sg = (b[34 + 4 * ib + l] >> j) & 1 ? -1.0 : 1.0;
        return d * (0.5 + s4) * 0.25 * gbyte64(sl_iq2s_grid, idx, j) * sg;
    }
    case SL_GGML_IQ3_XXS: {
        uint32_t aux = u32(b + 66 + 4 * ib);
        unsigned idx = b[2 + 8 * ib + 2 * l + j / 4];
        return d * (0.5 + (aux >> 28)) * 0.5 * gbyte32(sl_iq3xxs_grid, idx, j % 4) * sign7((aux >> (7 * l)) & 127, j);
    }
    case SL_GGML_IQ3_S: {
        int k = 2 * l + j / 4; /* which of the 8 grid indices of this 32 */
        unsigned idx = b[2 + 8 * ib + k] | ((b[66 + ib] >> k) & 1) << 8;
        unsigned s4 = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15;
        double sg = (b[74 + 4 * ib + l] >> j) & 1 ? -1.0 : 1.0;
        return d * (1 + 2 * s4) * gbyte32(sl_iq3s_grid, idx, j % 4) * sg;
    }
    case SL_GGML_IQ1_S: {
        unsigned qh = u16(b + 34 + 2 * ib);
        unsigned idx = b[2 + 4 * ib + l] | ((qh >> (3 * l)) & 7) << 8;
        double delta = qh & 0x8000 ? -0.125 : 0.125;
        return d * (2 * ((qh >> 12) & 7) + 1) * ((int8_t)gbyte64(sl_iq1s_grid, idx, j) + delta);
    }
    default: break;
    }
    cr_assert_fail("no reference formula for type %d", t);
    return 0;
}

static const int quant_types[] = {SL_GGML_Q4_0,    SL_GGML_Q4_1,   SL_GGML_Q5_0,   SL_GGML_Q5_1,    SL_GGML_Q8_0,
                                  SL_GGML_Q2_K,    SL_GGML_Q3_K,   SL_GGML_Q4_K,   SL_GGML_Q5_K,    SL_GGML_Q6_K,
                                  SL_GGML_IQ2_XXS, SL_GGML_IQ2_XS, SL_GGML_IQ2_S,  SL_GGML_IQ3_XXS, SL_GGML_IQ3_S,
                                  SL_GGML_IQ1_S,   SL_GGML_IQ4_NL, SL_GGML_IQ4_XS, SL_GGML_MXFP4};
#define N_QUANT ((int)(sizeof quant_types / sizeof quant_types[0]))

Test(ggml_quants, type_table) {
    /* ids, names and geometry as the GGUF format defines them */
    struct {
        int id;
        const char *name;
        int block;
        size_t bytes;
    } want[] = {{0, "F32", 1, 4},         {1, "F16", 1, 2},        {2, "Q4_0", 32, 18},      {3, "Q4_1", 32, 20},
                {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},     {8, "Q8_0", 32, 34},      {10, "Q2_K", 256, 84},
                {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},  {13, "Q5_K", 256, 176},   {14, "Q6_K", 256, 210},
                {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74}, {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
                {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110}, {22, "IQ2_S", 256, 82},   {23, "IQ4_XS", 256, 136},
                {30, "BF16", 1, 2},       {39, "MXFP4", 32, 17}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        cr_assert_str_eq(sl_ggml_type_name(want[k].id), want[k].name);
        cr_assert_eq(sl_ggml_block_size(want[k].id), want[k].block, "%s", want[k].name);
        cr_assert_eq(sl_ggml_block_bytes(want[k].id), want[k].bytes, "%s", want[k].name);
        cr_assert(sl_ggml_supported(want[k].id), "%s", want[k].name);
        cr_assert_eq(sl_ggml_row_bytes(want[k].id, 4096), 4096 / want[k].block * want[k].bytes);
    }
    cr_assert_null(sl_ggml_type_name(4)); /* removed Q4_2 */
    cr_assert_null(sl_ggml_type_name(-1));
    cr_assert_null(sl_ggml_type_name(1000));
    cr_assert_str_eq(sl_ggml_type_name(29), "IQ1_M");
    cr_assert_not(sl_ggml_supported(29));
    cr_assert_not(sl_ggml_supported(9));
    cr_assert_eq(sl_ggml_block_size(77), 0);
}

Test(ggml_quants, codebooks_hold_only_the_format_values) {
    /* IQ2 magnitudes are 8, 25 or 43; IQ3_XXS 4..62; IQ3_S odd 1..15; IQ1_S -1, 0, 1; entries distinct */
    const uint64_t *g2[] = {sl_iq2xxs_grid, sl_iq2xs_grid, sl_iq2s_grid, sl_iq1s_grid};
    const int n2[] = {256, 512, 1024, 2048};
    for (int k = 0; k < 4; k++)
        for (int e = 0; e < n2[k]; e++) {
            for (int j = 0; j < 8; j++) {
                unsigned v = gbyte64(g2[k], (unsigned)e, j);
                if (k < 3)
                    cr_assert(v == 8 || v == 25 || v == 43, "grid %d entry %d", k, e);
                else
                    cr_assert(v == 0xff || v == 0 || v == 1, "iq1s entry %d", e);
            }
            if (e) cr_assert_neq(g2[k][e], g2[k][e - 1]);
        }
    for (int e = 0; e < 256; e++)
        for (int j = 0; j < 4; j++) {
            unsigned v = gbyte32(sl_iq3xxs_grid, (unsigned)e, j);
            cr_assert(v == 4 || v == 12 || v == 20 || v == 28 || v == 36 || v == 44 || v == 52 || v == 62);
        }
    for (int e = 0; e < 512; e++)
        for (int j = 0; j < 4; j++) {
            unsigned v = gbyte32(sl_iq3s_grid, (unsigned)e, j);
            cr_assert(v % 2 == 1 && v <= 15);
        }
    /* the first and last entries anchor the ordering */
    cr_assert_eq(sl_iq2xxs_grid[0], 0x0808080808080808ull);
    cr_assert_eq(sl_iq2xxs_grid[255], 0x2b2b2b1908081908ull);
    cr_assert_eq(sl_iq1s_grid[0], 0xffffffffffffffffull);
    cr_assert_eq(sl_iq1s_grid[2047], 0x0101010101010101ull);
    cr_assert_eq(sl_iq3xxs_grid[0], 0x04040404u);
    cr_assert_eq(sl_iq3s_grid[0], 0x01010101u);
    cr_assert_eq(sl_iq3xxs_grid[255], 0x3e341c04u);
    cr_assert_eq(sl_iq3s_grid[511], 0x0f0f0101u);
}

Test(ggml_quants, dequant_matches_layout_formulas) {
    unsigned s = 12345;
    for (int k = 0; k < N_QUANT; k++) {
        int t = quant_types[k], bs = sl_ggml_block_size(t);
        int nb = 3, cols = nb * bs;
        uint8_t *p = malloc(sl_ggml_row_bytes(t, cols));
        float *y = malloc(sizeof *y * (size_t)cols);
        fill_blocks(t, p, (size_t)nb, &s);
        sl_ggml_dequant_row(t, p, y, cols);
        for (int i = 0; i < cols; i++) {
            double want = expect(t, p + (size_t)(i / bs) * sl_ggml_block_bytes(t), i % bs);
            cr_assert(fabs(y[i] - want) <= 1e-6 * fabs(want) + 1e-9, "%s value %d: %.9g, expected %.9g",
                      sl_ggml_type_name(t), i, (double)y[i], want);
        }
        free(p);
        free(y);
    }
}

Test(ggml_quants, plain_types_dequantise) {
    float v[4] = {1.5f, -2.25f, 3e-3f, 65504.0f};
    uint16_t h[4], bf[4];
    for (int i = 0; i < 4; i++) h[i] = sl_f32_to_f16(v[i]), bf[i] = sl_f32_to_bf16(v[i]);
    float y[4];
    sl_ggml_dequant_row(SL_GGML_F32, v, y, 4);
    cr_assert_arr_eq(y, v, sizeof v);
    sl_ggml_dequant_row(SL_GGML_F16, h, y, 4);
    for (int i = 0; i < 4; i++) cr_assert_eq(y[i], sl_f16_to_f32(h[i]));
    sl_ggml_dequant_row(SL_GGML_BF16, bf, y, 4);
    for (int i = 0; i < 4; i++) cr_assert_eq(y[i], sl_bf16_to_f32(bf[i]));
}

/* matmul of n tokens against a double-precision dot of the dequantised rows */
static void check_matmul(sl_backend *be, const sl_weight *w, int n, unsigned seed) {
    size_t cols = (size_t)w->cols, rows = (size_t)w->rows;
    float *x = malloc(sizeof *x * cols * (size_t)n), *y = malloc(sizeof *y * rows * (size_t)n);
    float *row = malloc(sizeof *row * cols);
    for (size_t i = 0; i < cols * (size_t)n; i++) x[i] = frand(&seed);
    be->ops->matmul(be, w, x, n, y);
    cr_assert_eq(be->ops->check(be, NULL), 0);
    for (size_t r = 0; r < rows; r++) {
        sl_ggml_dequant_row(w->gtype, w->data + r * w->row_bytes, row, w->cols);
        for (int t = 0; t < n; t++) {
            double ref = 0, mag = 0;
            for (size_t i = 0; i < cols; i++) {
                ref += (double)row[i] * x[(size_t)t * cols + i];
                mag += fabs((double)row[i] * x[(size_t)t * cols + i]);
            }
            if (w->bias) ref += w->bias[r];
            double got = y[(size_t)t * rows + r];
            cr_assert(fabs(got - ref) <= 2e-6 * (mag + 1), "%s n=%d token %d row %zu: %.8g vs %.8g",
                      sl_ggml_type_name(w->gtype), n, t, r, got, ref);
        }
    }
    free(x);
    free(y);
    free(row);
}

Test(ggml_quants, fused_matmul_every_type_and_batch) {
    sl_backend *be;
    sl_err e;
    cr_assert_eq(sl_cpu_backend_create(2, &be, &e), 0);
    unsigned s = 777;
    const int ns[] = {1, 3, 12, 40};
    for (int k = 0; k < N_QUANT; k++) {
        int t = quant_types[k], bs = sl_ggml_block_size(t);
        int rows = 37, cols = bs == 32 ? 32 * 9 : 256 * 3;
        size_t rb = sl_ggml_row_bytes(t, cols);
        uint8_t *p = malloc(rb * (size_t)rows);
        fill_blocks(t, p, (size_t)rows * (size_t)(cols / bs), &s);
        float bias[37];
        for (int i = 0; i < rows; i++) bias[i] = frand(&s);
        sl_weight w;
        cr_assert_eq(sl_ggml_weight(&w, "blk.0.ffn_up.weight", t, rows, cols, p, &e), 0, "%s", e.msg);
        cr_assert_eq(w.fmt, SL_WF_GGML);
        cr_assert_eq(w.row_bytes, rb);
        for (int m = 0; m < 4; m++) {
            w.bias = m % 2 ? bias : NULL;
            check_matmul(be, &w, ns[m], s + (unsigned)m);
        }
        /* embedding rows are the dequantised rows */
        int32_t ids[2] = {5, 36};
        float *out = malloc(sizeof *out * 2 * (size_t)cols), *ref = malloc(sizeof *ref * (size_t)cols);
        be->ops->embed(be, &w, ids, 2, out);
        for (int i = 0; i < 2; i++) {
            sl_ggml_dequant_row(t, p + (size_t)ids[i] * rb, ref, cols);
            cr_assert_arr_eq(out + (size_t)i * (size_t)cols, ref, sizeof *ref * (size_t)cols);
        }
        free(out);
        free(ref);
        free(p);
    }
    sl_backend_destroy(be);
}

Test(ggml_quants, weight_errors_name_tensor_and_expectation) {
    sl_weight w;
    sl_err e;
    uint8_t blk[256] = {0};
    cr_assert_eq(sl_ggml_weight(&w, "blk.3.attn_q.weight", SL_GGML_Q4_K, 4, 300, blk, &e), -1);
    cr_assert(strstr(e.msg, "blk.3.attn_q.weight") && strstr(e.msg, "Q4_K") && strstr(e.msg, "256") &&
                  strstr(e.msg, "300"),
              "%s", e.msg);
    cr_assert_eq(sl_ggml_weight(&w, "t", SL_GGML_Q8_0, 4, 48, blk, &e), -1);
    cr_assert(strstr(e.msg, "32") && strstr(e.msg, "48"), "%s", e.msg);
    cr_assert_eq(sl_ggml_weight(&w, "tok_embd", 4, 4, 32, blk, &e), -1);
    cr_assert(strstr(e.msg, "tok_embd") && strstr(e.msg, "unknown GGML type id 4"), "%s", e.msg);
    cr_assert_eq(sl_ggml_weight(&w, "out", SL_GGML_IQ1_M, 4, 256, blk, &e), -1);
    cr_assert(strstr(e.msg, "out") && strstr(e.msg, "IQ1_M is not supported"), "%s", e.msg);
    cr_assert_eq(sl_ggml_weight(&w, "z", SL_GGML_Q4_0, 0, 32, blk, &e), -1);
    cr_assert(strstr(e.msg, "z") && strstr(e.msg, "shape"), "%s", e.msg);
    /* plain types map to the plain formats */
    cr_assert_eq(sl_ggml_weight(&w, "n", SL_GGML_BF16, 2, 7, blk, &e), 0);
    cr_assert_eq(w.fmt, SL_WF_BF16);
    cr_assert_eq(w.row_bytes, 14u);
    cr_assert_eq(sl_ggml_weight(&w, "n", SL_GGML_Q6_K, 2, 512, blk, &e), 0);
    char buf[32];
    cr_assert_str_eq(sl_wfmt_name(&w, buf, sizeof buf), "Q6_K");
    cr_assert_eq(sl_weight_bytes(&w), 2u * 2u * 210u);
}

/* The MoE expert path with GGML experts of mixed types, against a double-precision SwiGLU of the
 * dequantised matrices, for a decode step (1 token) and a small batch (5 tokens, 2 experts each). */
Test(ggml_quants, moe_experts_of_mixed_types) {
    sl_backend *be;
    sl_err e;
    cr_assert_eq(sl_cpu_backend_create(2, &be, &e), 0);
    enum { H = 256, I = 512, E = 3, K = 2 };
    const int types[E][3] = {{SL_GGML_Q4_K, SL_GGML_Q4_K, SL_GGML_Q6_K},
                             {SL_GGML_IQ4_XS, SL_GGML_Q3_K, SL_GGML_Q8_0},
                             {SL_GGML_Q5_K, SL_GGML_IQ2_XS, SL_GGML_Q4_0}};
    unsigned s = 4242;
    sl_expert ex[E];
    const sl_expert *ptrs[E];
    uint8_t *bufs[E][3];
    for (int x = 0; x < E; x++) {
        sl_weight *m[3] = {&ex[x].gate, &ex[x].up, &ex[x].down};
        for (int k = 0; k < 3; k++) {
            int t = types[x][k], rows = k < 2 ? I : H, cols = k < 2 ? H : I;
            bufs[x][k] = malloc(sl_ggml_row_bytes(t, cols) * (size_t)rows);
            fill_blocks(t, bufs[x][k], (size_t)rows * (size_t)(cols / sl_ggml_block_size(t)), &s);
            cr_assert_eq(sl_ggml_weight(m[k], "expert", t, rows, cols, bufs[x][k], &e), 0, "%s", e.msg);
        }
        ptrs[x] = &ex[x];
    }
    sl_expert_table tab = {.n_experts = E, .experts = ptrs};
    const int ns[] = {1, 5, 24};
    for (int m = 0; m < 3; m++) {
        int n = ns[m];
        float *xin = malloc(sizeof *xin * (size_t)n * H), *out = malloc(sizeof *out * (size_t)n * H);
        int32_t ids[24 * K] = {0};
        float wts[24 * K] = {0};
        for (int i = 0; i < n * H; i++) xin[i] = frand(&s);
        for (int t = 0; t < n; t++) {
            ids[t * K] = t % E, ids[t * K + 1] = (t + 1) % E;
            wts[t * K] = 0.7f, wts[t * K + 1] = 0.3f;
        }
        be->ops->moe(be, &tab, xin, n, H, ids, wts, K, out);
        cr_assert_eq(be->ops->check(be, NULL), 0);
        float *row = malloc(sizeof *row * I);
        double *g = malloc(sizeof *g * I);
        for (int t = 0; t < n; t++) {
            double ref[H] = {0};
            for (int k = 0; k < K; k++) {
                const sl_expert *x = ptrs[ids[t * K + k]];
                for (int r = 0; r < I; r++) {
                    double gv = 0, uv = 0;
                    sl_ggml_dequant_row(x->gate.gtype, x->gate.data + (size_t)r * x->gate.row_bytes, row, H);
                    for (int i = 0; i < H; i++) gv += (double)row[i] * xin[t * H + i];
                    sl_ggml_dequant_row(x->up.gtype, x->up.data + (size_t)r * x->up.row_bytes, row, H);
                    for (int i = 0; i < H; i++) uv += (double)row[i] * xin[t * H + i];
                    g[r] = gv / (1.0 + exp(-gv)) * uv;
                }
                for (int r = 0; r < H; r++) {
                    double dv = 0;
                    sl_ggml_dequant_row(x->down.gtype, x->down.data + (size_t)r * x->down.row_bytes, row, I);
                    for (int i = 0; i < I; i++) dv += (double)row[i] * g[i];
                    ref[r] += wts[t * K + k] * dv;
                }
            }
            double num = 0, den = 0;
            for (int r = 0; r < H; r++) {
                num += (out[t * H + r] - ref[r]) * (out[t * H + r] - ref[r]);
                den += ref[r] * ref[r];
            }
            cr_assert(sqrt(num / den) < 1e-5, "n=%d token %d: rel-L2 %.3g", n, t, sqrt(num / den));
        }
        free(row);
        free(g);
        free(xin);
        free(out);
    }
    for (int x = 0; x < E; x++)
        for (int k = 0; k < 3; k++) free(bufs[x][k]);
    sl_backend_destroy(be);
}

#ifdef SLUICE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "testutil.h"

/* The CUDA twin of the kernels above, run when a GPU is present (tools/gpu-check.sh runs it there). */

/* The device, or NULL (said in the log, which tools/gpu-check.sh treats as a failure) on a machine
 * without one: a CUDA build must still pass its tests there. */
static sl_backend *cuda_or_skip(void) {
    sl_backend *be = NULL;
    char about[256];
    if (sl_cuda_backend_create(0, &be, about, sizeof about)) {
        fprintf(stderr, "no CUDA device (%s): CUDA GGML tests skipped\n", about);
        return NULL;
    }
    return be;
}

/* y [n][rows] (from the device) against a double-precision dot of hw's rows with x [n][cols] (host) */
static void expect_products(const sl_weight *hw, const float *x, const float *y, int n, double tol, int q16_input) {
    size_t cols = (size_t)hw->cols, rows = (size_t)hw->rows;
    float *row = malloc(sizeof *row * cols);
    for (size_t r = 0; r < rows; r++) {
        sl_ggml_dequant_row(hw->gtype, hw->data + r * hw->row_bytes, row, hw->cols);
        for (int t = 0; t < n; t++) {
            double ref = 0, mag = 0, qin = 0;
            const float *xt = x + (size_t)t * cols;
            for (size_t i = 0; i < cols; i++) {
                ref += (double)row[i] * xt[i];
                mag += fabs((double)row[i] * xt[i]);
            }
            /* the integer GEMV rounds the input to 16 bits per value, by at most half of its 32-value
             * block's max / 32767 */
            for (size_t b = 0; q16_input && b < cols; b += 32) {
                double amax = 0, wsum = 0;
                for (size_t i = b; i < b + 32; i++) {
                    amax = fmax(amax, fabs((double)xt[i]));
                    wsum += fabs((double)row[i]);
                }
                qin += wsum * amax / 65534.0;
            }
            if (hw->bias) ref += hw->bias[r];
            double got = y[(size_t)t * rows + r];
            cr_assert(fabs(got - ref) <= tol * (mag + 1) + 1.001 * qin, "CUDA %s n=%d token %d row %zu: %.8g vs %.8g",
                      sl_ggml_type_name(hw->gtype), n, t, r, got, ref);
        }
    }
    free(row);
}

/* matmul of n tokens on the device (w placed there, host rows in hw) against a double-precision dot */
static void check_cuda_matmul(sl_backend *be, const sl_weight *w, const sl_weight *hw, int n, unsigned seed, double tol,
                              int q16_input) {
    size_t cols = (size_t)w->cols, rows = (size_t)w->rows;
    float *x = malloc(sizeof *x * cols * (size_t)n), *y = malloc(sizeof *y * rows * (size_t)n);
    for (size_t i = 0; i < cols * (size_t)n; i++) x[i] = frand(&seed);
    float *dx = tu_dev_copy(be, x, sizeof *x * cols * (size_t)n),
          *dy = be->ops->alloc(be, sizeof *y * rows * (size_t)n);
    be->ops->matmul(be, w, dx, n, dy);
    be->ops->download(be, y, dy, sizeof *y * rows * (size_t)n);
    sl_err e;
    cr_assert_eq(be->ops->check(be, &e), 0, "%s", e.msg);
    expect_products(hw, x, y, n, tol, q16_input);
    be->ops->free(be, dx);
    be->ops->free(be, dy);
    free(x);
    free(y);
}

/* One token's norm writes the integer GEMV's input beside its output, and the matmul that reads the row next
 * takes it: the product must be that of the row as it is then, also when the row was written over by an
 * upload in between (the made input is then stale and must not be taken). */
static void check_norm_then_gemv(sl_backend *be, const sl_weight *w, const sl_weight *hw, int upload, unsigned seed) {
    size_t cols = (size_t)w->cols, rows = (size_t)w->rows;
    float *x = malloc(sizeof *x * cols), *nw = malloc(sizeof *nw * cols), *z = malloc(sizeof *z * cols);
    float *in = malloc(sizeof *in * cols), *y = malloc(sizeof *y * rows);
    for (size_t i = 0; i < cols; i++) {
        x[i] = frand(&seed);
        nw[i] = 0.5f + 0.5f * fabsf(frand(&seed));
        z[i] = 3.0f * frand(&seed);
    }
    float *dx = tu_dev_copy(be, x, sizeof *x * cols), *dnw = tu_dev_copy(be, nw, sizeof *nw * cols),
          *dn = be->ops->alloc(be, sizeof *in * cols), *dy = be->ops->alloc(be, sizeof *y * rows);
    be->ops->rmsnorm(be, dx, dnw, 1, (int)cols, 1e-6f, dn);
    if (upload) be->ops->upload(be, dn, z, sizeof *z * cols);
    be->ops->matmul(be, w, dn, 1, dy);
    be->ops->download(be, in, dn, sizeof *in * cols);
    be->ops->download(be, y, dy, sizeof *y * rows);
    sl_err e;
    cr_assert_eq(be->ops->check(be, &e), 0, "%s", e.msg);
    expect_products(hw, in, y, 1, 1e-5, 1);
    be->ops->free(be, dx);
    be->ops->free(be, dnw);
    be->ops->free(be, dn);
    be->ops->free(be, dy);
    free(x);
    free(nw);
    free(z);
    free(in);
    free(y);
}

/* every type, three times: with the tile-decoding tensor-core kernel (from 2 to 64 tokens, the default),
 * in one bf16 pass and (exact weights) in bf16 halves, and without it (SLUICE_CUDA_MMQ=0: the decode GEMV to 16 tokens
 * in one pass or two, then the bf16 tensor-core GEMM on the dequantised matrix); rows that do not fill a block of rows,
 * rows over several input chunks and column splits, and embedding rows; errors for a type without kernels */
static sl_backend *cuda_with_mmq(int on) {
    setenv("SLUICE_CUDA_MMQ", on ? "1" : "0", 1);
    sl_backend *be = cuda_or_skip();
    unsetenv("SLUICE_CUDA_MMQ");
    return be;
}

static void check_every_type(sl_backend *be, int mmq, int exact) {
    sl_err e;
    unsigned s = 991;
    const int ns[] = {1, 3, 8, 12, 20, 40, 64, 80};
    const int nn = (int)(sizeof ns / sizeof ns[0]);
    for (int k = 0; k < N_QUANT; k++) {
        int t = quant_types[k], bs = sl_ggml_block_size(t);
        int rows = 37, cols = bs == 32 ? 32 * 41 : 256 * 5;
        size_t rb = sl_ggml_row_bytes(t, cols);
        uint8_t *p = malloc(rb * (size_t)rows);
        fill_blocks(t, p, (size_t)rows * (size_t)(cols / bs), &s);
        float bias[37];
        for (int i = 0; i < rows; i++) bias[i] = frand(&s);
        sl_weight hw, w;
        cr_assert_eq(sl_ggml_weight(&hw, "blk.0.ffn_up.weight", t, rows, cols, p, &e), 0, "%s", e.msg);
        hw.bias = bias;
        w = hw;
        w.exact = exact; /* a mixture of experts' weight: tensor-core products in bf16 halves */
        cr_assert(be->ops->supports(be, &w), "CUDA lacks %s", sl_ggml_type_name(t));
        cr_assert_eq(be->ops->place_weight(be, &w, &e), 0, "%s", e.msg);
        /* the GEMV kernels in fp32 or (Q4_K, Q6_K, Q8_0) on a q16 input; the tensor-core kernels in one bf16
         * pass, each product within 2^-8 of its value, or in halves within about 2^-16 */
        int q16 = t == SL_GGML_Q4_K || t == SL_GGML_Q6_K || t == SL_GGML_Q8_0;
        for (int m = 0; m < nn; m++) {
            int gemv = mmq ? ns[m] < 2 : ns[m] <= 16;
            check_cuda_matmul(be, &w, &hw, ns[m], s + (unsigned)m, gemv ? 1e-5 : exact ? 3e-5 : 4e-3, gemv && q16);
        }
        int32_t ids[3] = {5, 36, 0};
        float *out = malloc(sizeof *out * 3 * (size_t)cols), *ref = malloc(sizeof *ref * (size_t)cols);
        float *dout = be->ops->alloc(be, sizeof *out * 3 * (size_t)cols);
        be->ops->embed(be, &w, ids, 3, dout);
        be->ops->download(be, out, dout, sizeof *out * 3 * (size_t)cols);
        cr_assert_eq(be->ops->check(be, &e), 0, "%s", e.msg);
        for (int i = 0; i < 3; i++) {
            sl_ggml_dequant_row(t, p + (size_t)ids[i] * rb, ref, cols);
            for (int j = 0; j < cols; j++)
                cr_assert(fabsf(out[(size_t)i * (size_t)cols + (size_t)j] - ref[j]) <= 1e-6f * fabsf(ref[j]) + 1e-30f,
                          "CUDA %s embedding row %d value %d: %.9g vs %.9g", sl_ggml_type_name(t), ids[i], j,
                          (double)out[(size_t)i * (size_t)cols + (size_t)j], (double)ref[j]);
        }
        be->ops->free(be, dout);
        free(out);
        free(ref);
        free(p);
    }
}

/* rows of 64 units or more: one token's integer GEMV gives each lane two adjacent rows (an odd count here, so
 * the last lane's second row lies past the end) */
static void check_wide_gemv(sl_backend *be) {
    sl_err e;
    unsigned s = 4242;
    const int types[] = {SL_GGML_Q4_K, SL_GGML_Q6_K, SL_GGML_Q8_0};
    /* 16 and 24 blocks: Q6_K rows of whole multiples of 16 bytes, staged through shared memory 8 blocks at a time */
    for (int k = 0; k < 9; k++) {
        int t = types[k % 3], rows = 37, cols = 256 * (k < 3 ? 9 : k < 6 ? 16 : 24);
        size_t rb = sl_ggml_row_bytes(t, cols);
        uint8_t *p = malloc(rb * (size_t)rows);
        fill_blocks(t, p, (size_t)rows * (size_t)(cols / sl_ggml_block_size(t)), &s);
        sl_weight hw, w;
        cr_assert_eq(sl_ggml_weight(&hw, "blk.0.ffn_down.weight", t, rows, cols, p, &e), 0, "%s", e.msg);
        w = hw;
        cr_assert_eq(be->ops->place_weight(be, &w, &e), 0, "%s", e.msg);
        for (int n = 1; n <= 2; n++) check_cuda_matmul(be, &w, &hw, n, s + (unsigned)n, 1e-5, 1);
        for (int up = 0; up <= 1; up++) check_norm_then_gemv(be, &w, &hw, up, s + 7u + (unsigned)up);
        free(p);
    }
}

Test(ggml_quants, cuda_matmul_and_embed_every_type) {
    sl_backend *be = cuda_with_mmq(0);
    if (!be) return;
    check_wide_gemv(be);
    check_every_type(be, 0, 0);
    sl_backend_destroy(be);
    be = cuda_with_mmq(1);
    check_every_type(be, 1, 0);
    check_every_type(be, 1, 1);
    sl_err e;
    /* a known type without kernels is refused by name */
    uint8_t blk[36] = {0};
    sl_weight q = {.fmt = SL_WF_GGML, .gtype = SL_GGML_Q8_1, .rows = 1, .cols = 32, .data = blk, .row_bytes = 36};
    cr_assert(!be->ops->supports(be, &q));
    cr_assert_eq(be->ops->place_weight(be, &q, &e), -1);
    cr_assert(strstr(e.msg, "Q8_1"), "%s", e.msg);
    sl_backend_destroy(be);
}

/* The device MoE path with GGML experts (gate and up of different types), against a double-precision
 * SwiGLU of the dequantised matrices, for 1, 5 and 24 tokens (from 8 the pairs are grouped by expert, the
 * Q4_K gate on integer tensor cores); experts of a layer in different types are refused. */
Test(ggml_quants, cuda_moe_experts) {
    sl_backend *be = cuda_or_skip();
    if (!be) return;
    sl_err e;
    enum { H = 512, I = 768, E = 4, K = 2 };
    const int types[3] = {SL_GGML_Q4_K, SL_GGML_IQ4_XS, SL_GGML_Q6_K};
    unsigned s = 5151;
    sl_expert hx[E], dx[E];
    const sl_expert *hp[E], *dp[E];
    uint8_t *bufs[E][3];
    for (int x = 0; x < E; x++) {
        sl_weight *m[3] = {&hx[x].gate, &hx[x].up, &hx[x].down};
        for (int k = 0; k < 3; k++) {
            int t = types[k], rows = k < 2 ? I : H, cols = k < 2 ? H : I;
            bufs[x][k] = malloc(sl_ggml_row_bytes(t, cols) * (size_t)rows);
            fill_blocks(t, bufs[x][k], (size_t)rows * (size_t)(cols / sl_ggml_block_size(t)), &s);
            cr_assert_eq(sl_ggml_weight(m[k], "expert", t, rows, cols, bufs[x][k], &e), 0, "%s", e.msg);
        }
        dx[x] = hx[x];
        cr_assert_eq(be->ops->place_weight(be, &dx[x].gate, &e), 0, "%s", e.msg);
        cr_assert_eq(be->ops->place_weight(be, &dx[x].up, &e), 0, "%s", e.msg);
        cr_assert_eq(be->ops->place_weight(be, &dx[x].down, &e), 0, "%s", e.msg);
        hp[x] = &hx[x];
        dp[x] = &dx[x];
    }
    sl_expert_table tab = {.n_experts = E, .experts = dp};
    cr_assert_eq(be->ops->place_experts(be, &tab, &e), 0, "%s", e.msg);
    const int ns[] = {1, 5, 24};
    for (int m = 0; m < 3; m++) {
        int n = ns[m];
        float *xin = malloc(sizeof *xin * (size_t)n * H), *out = malloc(sizeof *out * (size_t)n * H);
        int32_t ids[24 * K] = {0};
        float wts[24 * K] = {0};
        for (int i = 0; i < n * H; i++) xin[i] = frand(&s);
        for (int t = 0; t < n; t++) {
            ids[t * K] = t % E, ids[t * K + 1] = (t + 3) % E;
            wts[t * K] = 0.6f, wts[t * K + 1] = 0.4f;
        }
        float *dxin = tu_dev_copy(be, xin, sizeof *xin * (size_t)n * H), *dwts = tu_dev_copy(be, wts, sizeof wts);
        int32_t *dids = tu_dev_copy(be, ids, sizeof ids);
        float *dout = be->ops->alloc(be, sizeof *out * (size_t)n * H);
        be->ops->moe(be, &tab, dxin, n, H, dids, dwts, K, dout);
        be->ops->download(be, out, dout, sizeof *out * (size_t)n * H);
        cr_assert_eq(be->ops->check(be, &e), 0, "%s", e.msg);
        float *row = malloc(sizeof *row * I);
        double *g = malloc(sizeof *g * I);
        for (int t = 0; t < n; t++) {
            double ref[H] = {0};
            for (int k = 0; k < K; k++) {
                const sl_expert *x = hp[ids[t * K + k]];
                for (int r = 0; r < I; r++) {
                    double gv = 0, uv = 0;
                    sl_ggml_dequant_row(x->gate.gtype, x->gate.data + (size_t)r * x->gate.row_bytes, row, H);
                    for (int i = 0; i < H; i++) gv += (double)row[i] * xin[t * H + i];
                    sl_ggml_dequant_row(x->up.gtype, x->up.data + (size_t)r * x->up.row_bytes, row, H);
                    for (int i = 0; i < H; i++) uv += (double)row[i] * xin[t * H + i];
                    g[r] = gv / (1.0 + exp(-gv)) * uv;
                }
                for (int r = 0; r < H; r++) {
                    double dv = 0;
                    sl_ggml_dequant_row(x->down.gtype, x->down.data + (size_t)r * x->down.row_bytes, row, I);
                    for (int i = 0; i < I; i++) dv += (double)row[i] * g[i];
                    ref[r] += wts[t * K + k] * dv;
                }
            }
            double num = 0, den = 0;
            for (int r = 0; r < H; r++) {
                num += (out[t * H + r] - ref[r]) * (out[t * H + r] - ref[r]);
                den += ref[r] * ref[r];
            }
            cr_assert(sqrt(num / den) < 1e-4, "CUDA MoE n=%d token %d: rel-L2 %.3g", n, t, sqrt(num / den));
        }
        be->ops->free(be, dxin);
        be->ops->free(be, dwts);
        be->ops->free(be, dids);
        be->ops->free(be, dout);
        free(row);
        free(g);
        free(xin);
        free(out);
    }
    /* one expert's down matrix in another type */
    sl_expert odd[E];
    const sl_expert *op[E];
    for (int x = 0; x < E; x++) odd[x] = dx[x], op[x] = &odd[x];
    odd[2].down.gtype = SL_GGML_Q8_0;
    sl_expert_table bad = {.n_experts = E, .experts = op};
    cr_assert_eq(be->ops->place_experts(be, &bad, &e), -1);
    cr_assert(strstr(e.msg, "expert 2") && strstr(e.msg, "type"), "%s", e.msg);
    for (int x = 0; x < E; x++)
        for (int k = 0; k < 3; k++) free(bufs[x][k]);
    sl_backend_destroy(be);
}
#endif
