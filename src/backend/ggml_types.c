/* GGML type table and reference dequantisation. Each *_block function decodes one block exactly as the
 * format defines it (the same float operations, in the same order, as the formats' reference decoders),
 * so a model's logits match those computed on the dequantised weights to float precision. */
#include "backend/ggml_types.h"

#include <math.h>
#include <string.h>

#include "backend/ggml_grids.h"
#include "core/half.h"

typedef struct {
    const char *name;
    int block;    /* values per block */
    size_t bytes; /* bytes per block */
    int supported;
} type_info;

static const type_info types[SL_GGML_TYPE_END] = {
    [SL_GGML_F32] = {"F32", 1, 4, 1},
    [SL_GGML_F16] = {"F16", 1, 2, 1},
    [SL_GGML_Q4_0] = {"Q4_0", 32, 18, 1},
    [SL_GGML_Q4_1] = {"Q4_1", 32, 20, 1},
    [SL_GGML_Q5_0] = {"Q5_0", 32, 22, 1},
    [SL_GGML_Q5_1] = {"Q5_1", 32, 24, 1},
    [SL_GGML_Q8_0] = {"Q8_0", 32, 34, 1},
    [SL_GGML_Q8_1] = {"Q8_1", 32, 36, 0},
    [SL_GGML_Q2_K] = {"Q2_K", 256, 84, 1},
    [SL_GGML_Q3_K] = {"Q3_K", 256, 110, 1},
    [SL_GGML_Q4_K] = {"Q4_K", 256, 144, 1},
    [SL_GGML_Q5_K] = {"Q5_K", 256, 176, 1},
    [SL_GGML_Q6_K] = {"Q6_K", 256, 210, 1},
    [SL_GGML_Q8_K] = {"Q8_K", 256, 292, 0},
    [SL_GGML_IQ2_XXS] = {"IQ2_XXS", 256, 66, 1},
    [SL_GGML_IQ2_XS] = {"IQ2_XS", 256, 74, 1},
    [SL_GGML_IQ3_XXS] = {"IQ3_XXS", 256, 98, 1},
    [SL_GGML_IQ1_S] = {"IQ1_S", 256, 50, 1},
    [SL_GGML_IQ4_NL] = {"IQ4_NL", 32, 18, 1},
    [SL_GGML_IQ3_S] = {"IQ3_S", 256, 110, 1},
    [SL_GGML_IQ2_S] = {"IQ2_S", 256, 82, 1},
    [SL_GGML_IQ4_XS] = {"IQ4_XS", 256, 136, 1},
    [SL_GGML_I8] = {"I8", 1, 1, 0},
    [SL_GGML_I16] = {"I16", 1, 2, 0},
    [SL_GGML_I32] = {"I32", 1, 4, 0},
    [SL_GGML_I64] = {"I64", 1, 8, 0},
    [SL_GGML_F64] = {"F64", 1, 8, 0},
    [SL_GGML_IQ1_M] = {"IQ1_M", 256, 56, 0},
    [SL_GGML_BF16] = {"BF16", 1, 2, 1},
    [SL_GGML_TQ1_0] = {"TQ1_0", 256, 54, 0},
    [SL_GGML_TQ2_0] = {"TQ2_0", 256, 66, 0},
    [SL_GGML_MXFP4] = {"MXFP4", 32, 17, 1},
};

static const type_info *info(int t) {
    return t >= 0 && t < SL_GGML_TYPE_END && types[t].name ? &types[t] : NULL;
}

const char *sl_ggml_type_name(int t) {
    const type_info *i = info(t);
    return i ? i->name : NULL;
}

int sl_ggml_block_size(int t) {
    const type_info *i = info(t);
    return i ? i->block : 0;
}

size_t sl_ggml_block_bytes(int t) {
    const type_info *i = info(t);
    return i ? i->bytes : 0;
}

int sl_ggml_supported(int t) {
    const type_info *i = info(t);
    return i && i->supported;
}

size_t sl_ggml_row_bytes(int t, int64_t cols) {
    const type_info *i = info(t);
    return i ? (size_t)(cols / i->block) * i->bytes : 0;
}

/* ---- field access: blocks are packed bytes with no alignment guarantee ---- */

static inline float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return sl_f16_to_f32(h);
}

static inline uint16_t u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* E2M1 values doubled; the E8M0 block scale is halved to compensate */
static const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Sign byte for a 7-bit index: bit 7 makes the number of negative signs even. */
static inline uint8_t iq_signs(uint32_t i) {
    return (uint8_t)(i | ((uint32_t)__builtin_parity(i) << 7));
}

/* ---- 32-value blocks ---- */

static void q4_0_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0x0F) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void q4_1_block(const uint8_t *b, float *y) {
    float d = f16_at(b), m = f16_at(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0F) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

static void q5_0_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    uint32_t qh = u32_at(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)(((qs[j] & 0x0F) | h0) - 16) * d;
        y[j + 16] = (float)(((qs[j] >> 4) | h1) - 16) * d;
    }
}

static void q5_1_block(const uint8_t *b, float *y) {
    float d = f16_at(b), m = f16_at(b + 2);
    uint32_t qh = u32_at(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)((qs[j] & 0x0F) | h0) * d + m;
        y[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
    }
}

static void q8_0_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

static void iq4_nl_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)kvalues_iq4nl[qs[j] & 0x0F];
        y[j + 16] = d * (float)kvalues_iq4nl[qs[j] >> 4];
    }
}

static void mxfp4_block(const uint8_t *b, float *y) {
    float d = ldexpf(1.0f, (int)b[0] - 128); /* 2^(e-127), halved */
    const uint8_t *qs = b + 1;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)kvalues_mxfp4[qs[j] & 0x0F] * d;
        y[j + 16] = (float)kvalues_mxfp4[qs[j] >> 4] * d;
    }
}

/* ---- K-quants: 256-value super-blocks ---- */

static void q2_k_block(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *q = b + 16;
    float d = f16_at(b + 80), dmin = f16_at(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int h = 0; h < 2; h++) {
                uint8_t s = sc[is++];
                float dl = d * (float)(s & 0x0F), ml = dmin * (float)(s >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * h] >> shift) & 3) - ml;
            }
        }
        q += 32;
    }
}

/* The 16 six-bit scales of a Q3_K block, offset by -32. */
static void q3_k_scales(const uint8_t *s, int *out) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? s[j] & 0x0F : s[j - 8] >> 4;
        int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (lo | (hi << 4)) - 32;
    }
}

static void q3_k_block(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32;
    float d = f16_at(b + 108);
    int sc[16];
    q3_k_scales(b + 96, sc);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int h = 0; h < 2; h++) {
                float dl = d * (float)sc[is++];
                for (int l = 16 * h; l < 16 * h + 16; l++)
                    *y++ = dl * (float)(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            }
            m = (uint8_t)(m << 1);
        }
        q += 32;
    }
}

/* Scale and min j (0..7) of a Q4_K/Q5_K block: 6 bits each, packed in 12 bytes. */
static inline void k4_scale_min(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void q4_k_block(const uint8_t *b, float *y) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0; j < 8; j += 2) {
        int sc, mn;
        k4_scale_min(j, scales, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        k4_scale_min(j + 1, scales, &sc, &mn);
        float d2 = d * (float)sc, m2 = dmin * (float)mn;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0F) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        q += 32;
    }
}

static void q5_k_block(const uint8_t *b, float *y) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 8; j += 2) {
        int sc, mn;
        k4_scale_min(j, scales, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        k4_scale_min(j + 1, scales, &sc, &mn);
        float d2 = d * (float)sc, m2 = dmin * (float)mn;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0x0F) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32;
        u1 = (uint8_t)(u1 << 2);
        u2 = (uint8_t)(u2 << 2);
    }
}

static void q6_k_block(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16_at(b + 208);
    for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

static void iq4_xs_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    uint16_t sh = u16_at(b + 2);
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int ib = 0; ib < 8; ib++) {
        int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0x0F) | (((sh >> (2 * ib)) & 3) << 4);
        float dl = d * (float)(ls - 32);
        for (int j = 0; j < 16; j++) {
            y[j] = dl * (float)kvalues_iq4nl[qs[j] & 0x0F];
            y[j + 16] = dl * (float)kvalues_iq4nl[qs[j] >> 4];
        }
        y += 32;
        qs += 16;
    }
}

/* ---- IQ formats: grid codebooks with explicit signs ---- */

/* Eight grid bytes times db with the signs of `signs` (bit j set: value j is negative). */
static inline void grid8(float *y, float db, const uint8_t *g, uint8_t signs) {
    for (int j = 0; j < 8; j++) y[j] = db * (float)g[j] * (signs & (1u << j) ? -1.0f : 1.0f);
}

static void iq2_xxs_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const uint8_t *qs = b + 2;
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *aux8 = qs + 8 * ib;
        uint32_t sgn = u32_at(qs + 8 * ib + 4);
        float db = d * (0.5f + (float)(sgn >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            grid8(y, db, (const uint8_t *)&sl_iq2xxs_grid[aux8[l]], iq_signs((sgn >> (7 * l)) & 127));
            y += 8;
        }
    }
}

static void iq2_xs_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const uint8_t *qs = b + 2, *scales = b + 66;
    for (int ib = 0; ib < 8; ib++) {
        float db0 = d * (0.5f + (float)(scales[ib] & 0x0F)) * 0.25f;
        float db1 = d * (0.5f + (float)(scales[ib] >> 4)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            uint16_t q = u16_at(qs + 2 * (4 * ib + l));
            grid8(y, l < 2 ? db0 : db1, (const uint8_t *)&sl_iq2xs_grid[q & 511], iq_signs(q >> 9));
            y += 8;
        }
    }
}

static void iq2_s_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *scales = b + 74;
    for (int ib = 0; ib < 8; ib++) {
        float db0 = d * (0.5f + (float)(scales[ib] & 0x0F)) * 0.25f;
        float db1 = d * (0.5f + (float)(scales[ib] >> 4)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            int idx = qs[l] | ((qh[ib] << (8 - 2 * l)) & 0x300);
            grid8(y, l < 2 ? db0 : db1, (const uint8_t *)&sl_iq2s_grid[idx], signs[l]);
            y += 8;
        }
        qs += 4;
        signs += 4;
    }
}

static void iq3_xxs_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const uint8_t *qs = b + 2, *ss = b + 66;
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux = u32_at(ss + 4 * ib);
        float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        for (int l = 0; l < 4; l++) {
            uint8_t g[8];
            memcpy(g, &sl_iq3xxs_grid[qs[2 * l]], 4);
            memcpy(g + 4, &sl_iq3xxs_grid[qs[2 * l + 1]], 4);
            grid8(y, db, g, iq_signs((aux >> (7 * l)) & 127));
            y += 8;
        }
        qs += 8;
    }
}

static void iq3_s_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *scales = b + 106;
    for (int ib = 0; ib < 8; ib++) {
        float db = d * (float)(1 + 2 * ((scales[ib / 2] >> (4 * (ib % 2))) & 0x0F));
        for (int l = 0; l < 4; l++) {
            uint8_t g[8];
            memcpy(g, &sl_iq3s_grid[qs[2 * l] | ((qh[ib] << (8 - 2 * l)) & 256)], 4);
            memcpy(g + 4, &sl_iq3s_grid[qs[2 * l + 1] | ((qh[ib] << (7 - 2 * l)) & 256)], 4);
            grid8(y, db, g, signs[l]);
            y += 8;
        }
        qs += 8;
        signs += 4;
    }
}

static void iq1_s_block(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const uint8_t *qs = b + 2, *qhp = b + 34;
    for (int ib = 0; ib < 8; ib++) {
        uint16_t qh = u16_at(qhp + 2 * ib);
        float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
        float delta = qh & 0x8000 ? -0.125f : 0.125f;
        for (int l = 0; l < 4; l++) {
            const int8_t *g = (const int8_t *)&sl_iq1s_grid[qs[l] | (((qh >> (3 * l)) & 7) << 8)];
            for (int j = 0; j < 8; j++) y[j] = dl * ((float)g[j] + delta);
            y += 8;
        }
        qs += 4;
    }
}

typedef void (*block_fn)(const uint8_t *b, float *y);

static block_fn block_decoder(int t) {
    switch (t) {
    case SL_GGML_Q4_0: return q4_0_block;
    case SL_GGML_Q4_1: return q4_1_block;
    case SL_GGML_Q5_0: return q5_0_block;
    case SL_GGML_Q5_1: return q5_1_block;
    case SL_GGML_Q8_0: return q8_0_block;
    case SL_GGML_Q2_K: return q2_k_block;
    case SL_GGML_Q3_K: return q3_k_block;
    case SL_GGML_Q4_K: return q4_k_block;
    case SL_GGML_Q5_K: return q5_k_block;
    case SL_GGML_Q6_K: return q6_k_block;
    case SL_GGML_IQ2_XXS: return iq2_xxs_block;
    case SL_GGML_IQ2_XS: return iq2_xs_block;
    case SL_GGML_IQ2_S: return iq2_s_block;
    case SL_GGML_IQ3_XXS: return iq3_xxs_block;
    case SL_GGML_IQ3_S: return iq3_s_block;
    case SL_GGML_IQ1_S: return iq1_s_block;
    case SL_GGML_IQ4_NL: return iq4_nl_block;
    case SL_GGML_IQ4_XS: return iq4_xs_block;
    case SL_GGML_MXFP4: return mxfp4_block;
    default: return NULL;
    }
}

void sl_ggml_dequant_block(int t, const uint8_t *blk, float *dst) {
    block_fn f = block_decoder(t);
    if (f) f(blk, dst);
}

void sl_ggml_quant_q8_0_row(const float *src, void *dst, int64_t cols) {
    uint8_t *o = dst;
    for (int64_t b = 0; b < cols / 32; b++, src += 32, o += 34) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fabsf(src[i]) > amax ? fabsf(src[i]) : amax;
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        uint16_t h = sl_f32_to_f16(d);
        memcpy(o, &h, 2);
        for (int i = 0; i < 32; i++) o[2 + i] = (uint8_t)(int8_t)roundf(src[i] * id);
    }
}

void sl_ggml_dequant_row(int t, const void *src, float *dst, int64_t cols) {
    const uint8_t *p = src;
    switch (t) {
    case SL_GGML_F32: memcpy(dst, p, (size_t)cols * 4); return;
    case SL_GGML_F16:
        for (int64_t j = 0; j < cols; j++) dst[j] = f16_at(p + 2 * j);
        return;
    case SL_GGML_BF16:
        for (int64_t j = 0; j < cols; j++) dst[j] = sl_bf16_to_f32(u16_at(p + 2 * j));
        return;
    default: break;
    }
    block_fn f = block_decoder(t);
    if (!f) return;
    int bs = types[t].block;
    size_t bb = types[t].bytes;
    for (int64_t i = 0; i < cols / bs; i++) f(p + (size_t)i * bb, dst + i * bs);
}

int sl_ggml_weight(sl_weight *w, const char *tensor, int t, int64_t rows, int64_t cols, const void *data, sl_err *e) {
    const char *name = sl_ggml_type_name(t);
    if (!name) return sl_fail(e, "tensor %s: unknown GGML type id %d", tensor, t);
    if (!sl_ggml_supported(t))
        return sl_fail(e,
                       "tensor %s: GGML type %s is not supported (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                       "Q5_1, Q8_0, Q2_K..Q6_K, IQ1_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, "
                       "IQ4_XS, MXFP4)",
                       tensor, name);
    int bs = sl_ggml_block_size(t);
    if (rows <= 0 || cols <= 0 || rows > INT32_MAX || cols > INT32_MAX)
        return sl_fail(e, "tensor %s: shape [%lld, %lld] is not a valid matrix", tensor, (long long)rows,
                       (long long)cols);
    if (cols % bs != 0)
        return sl_fail(e, "tensor %s: %s rows hold whole blocks of %d values, but a row has %lld values", tensor, name,
                       bs, (long long)cols);
    memset(w, 0, sizeof *w);
    w->rows = (int)rows;
    w->cols = (int)cols;
    w->data = data;
    w->gtype = t;
    w->row_bytes = sl_ggml_row_bytes(t, cols);
    w->fmt = t == SL_GGML_F32 ? SL_WF_F32 : t == SL_GGML_F16 ? SL_WF_F16 : t == SL_GGML_BF16 ? SL_WF_BF16 : SL_WF_GGML;
    return 0;
}
