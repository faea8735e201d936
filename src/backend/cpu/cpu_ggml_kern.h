/* Fused dequantise-dot row kernels for the GGML types, written once against a small vector vocabulary
 * and compiled for each instruction set by cpu_ggml_simd.c (which defines the vocabulary and includes
 * this file once per set). Each kernel returns dot(dequantised row, x) over `cols` values; `xs` holds the
 * sums of x over each 16 values, so constant offsets and per-group minimums cost one scalar term per
 * group instead of a vector operation per value. Scales are applied once per group of products. */

/* Q8_0: d * int8 */
TGT static float K(q8_0)(const uint8_t *row, const float *x, const float *xs, int cols) {
    (void)xs;
    vf acc = VZERO;
    for (int i = 0; i < cols / 32; i++) {
        const uint8_t *b = row + (size_t)i * 34;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 32;
        vf s = VZERO;
        for (int h = 0; h < 32; h += VW) s = VFMA(VCVT(VI8(b + 2 + h)), VLOAD(xb + h), s);
        acc = VFMA(VSET1(h2f(b)), s, acc);
    }
    return VSUM(acc);
}

/* Q4_0: d * (nibble - 8); low nibbles are values 0-15, high nibbles 16-31 */
TGT static float K(q4_0)(const uint8_t *row, const float *x, const float *xs, int cols) {
    vf acc = VZERO;
    float off = 0;
    for (int i = 0; i < cols / 32; i++) {
        const uint8_t *b = row + (size_t)i * 18;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 32;
        float d = h2f(b);
        vf s = VZERO;
        for (int h = 0; h < 16; h += VW) {
            vi v = VU8(b + 2 + h);
            s = VFMA(VCVT(VAND(v, 15)), VLOAD(xb + h), s);
            s = VFMA(VCVT(VSRL(v, 4)), VLOAD(xb + 16 + h), s);
        }
        acc = VFMA(VSET1(d), s, acc);
        off += d * (xs[2 * i] + xs[2 * i + 1]);
    }
    return VSUM(acc) - 8.0f * off;
}

/* Q4_K / Q5_K scales and minimums (6 bits each, 12 bytes) */
static inline void K(k4_scales)(const uint8_t *q, int *sc, int *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
        sc[j + 4] = (q[j + 8] & 0x0F) | ((q[j] >> 6) << 4);
        mn[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
    }
}

/* Q4_K: each 64 values share 32 bytes, low nibbles the first 32, high the next; d*sc*q - dmin*m */
TGT static float K(q4_k)(const uint8_t *row, const float *x, const float *xs, int cols) {
    vf acc = VZERO;
    float off = 0;
    for (int i = 0; i < cols / 256; i++) {
        const uint8_t *b = row + (size_t)i * 144;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 128, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 256, *sb = xs + (size_t)i * 16;
        float d = h2f(b), dmin = h2f(b + 2);
        int sc[8], mn[8];
        K(k4_scales)(b + 4, sc, mn);
        for (int j = 0; j < 4; j++) {
            const uint8_t *q = b + 16 + 32 * j;
            const float *xj = xb + 64 * j;
            vf lo = VZERO, hi = VZERO;
            for (int h = 0; h < 32; h += VW) {
                vi v = VU8(q + h);
                lo = VFMA(VCVT(VAND(v, 15)), VLOAD(xj + h), lo);
                hi = VFMA(VCVT(VSRL(v, 4)), VLOAD(xj + 32 + h), hi);
            }
            acc = VFMA(VSET1(d * (float)sc[2 * j]), lo, acc);
            acc = VFMA(VSET1(d * (float)sc[2 * j + 1]), hi, acc);
            off += dmin * ((float)mn[2 * j] * (sb[4 * j] + sb[4 * j + 1]) +
                           (float)mn[2 * j + 1] * (sb[4 * j + 2] + sb[4 * j + 3]));
        }
    }
    return VSUM(acc) - off;
}

/* Q5_K: Q4_K plus a fifth bit per value from qh (bit 2j for the low half of pair j, 2j+1 the high) */
TGT static float K(q5_k)(const uint8_t *row, const float *x, const float *xs, int cols) {
    vf acc = VZERO;
    float off = 0;
    for (int i = 0; i < cols / 256; i++) {
        const uint8_t *b = row + (size_t)i * 176;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 128, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 256, *sb = xs + (size_t)i * 16;
        float d = h2f(b), dmin = h2f(b + 2);
        int sc[8], mn[8];
        K(k4_scales)(b + 4, sc, mn);
        const uint8_t *qh = b + 16;
        for (int j = 0; j < 4; j++) {
            const uint8_t *q = b + 48 + 32 * j;
            const float *xj = xb + 64 * j;
            vf lo = VZERO, hi = VZERO;
            for (int h = 0; h < 32; h += VW) {
                vi v = VU8(q + h), hb = VU8(qh + h);
                vi ql = VOR(VAND(v, 15), VSLL(VAND(VSRL(hb, 2 * j), 1), 4));
                vi qu = VOR(VSRL(v, 4), VSLL(VAND(VSRL(hb, 2 * j + 1), 1), 4));
                lo = VFMA(VCVT(ql), VLOAD(xj + h), lo);
                hi = VFMA(VCVT(qu), VLOAD(xj + 32 + h), hi);
            }
            acc = VFMA(VSET1(d * (float)sc[2 * j]), lo, acc);
            acc = VFMA(VSET1(d * (float)sc[2 * j + 1]), hi, acc);
            off += dmin * ((float)mn[2 * j] * (sb[4 * j] + sb[4 * j + 1]) +
                           (float)mn[2 * j + 1] * (sb[4 * j + 2] + sb[4 * j + 3]));
        }
    }
    return VSUM(acc) - off;
}

/* Q6_K: 4 low bits in ql, 2 high in qh, minus 32, times d * int8 scale per 16 values. The scale of
 * values [16k, 16k+16) is sc[k], which is also the index of their x sum. */
TGT static float K(q6_k)(const uint8_t *row, const float *x, const float *xs, int cols) {
    vf acc = VZERO;
    float off = 0;
    for (int i = 0; i < cols / 256; i++) {
        const uint8_t *b = row + (size_t)i * 210;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 192, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 256, *sb = xs + (size_t)i * 16;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = h2f(b + 208);
        float ds[16];
        for (int k = 0; k < 16; k++) {
            ds[k] = d * (float)sc[k];
            off += ds[k] * sb[k];
        }
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
            const float *xn = xb + 128 * n;
            for (int l = 0; l < 32; l += VW) {
                vi a = VU8(ql + l), c = VU8(ql + 32 + l), hh = VU8(qh + l);
                vi q1 = VOR(VAND(a, 15), VSLL(VAND(hh, 3), 4));
                vi q2 = VOR(VAND(c, 15), VSLL(VAND(VSRL(hh, 2), 3), 4));
                vi q3 = VOR(VSRL(a, 4), VSLL(VAND(VSRL(hh, 4), 3), 4));
                vi q4 = VOR(VSRL(c, 4), VSLL(VSRL(hh, 6), 4));
                int k = 8 * n + l / 16;
                acc = VFMA(VMUL(VSET1(ds[k]), VCVT(q1)), VLOAD(xn + l), acc);
                acc = VFMA(VMUL(VSET1(ds[k + 2]), VCVT(q2)), VLOAD(xn + 32 + l), acc);
                acc = VFMA(VMUL(VSET1(ds[k + 4]), VCVT(q3)), VLOAD(xn + 64 + l), acc);
                acc = VFMA(VMUL(VSET1(ds[k + 6]), VCVT(q4)), VLOAD(xn + 96 + l), acc);
            }
        }
    }
    return VSUM(acc) - 32.0f * off;
}

/* Q3_K: 2 low bits in qs, the third in hmask; value d * scale * (q3 - 4) with 6-bit signed scales.
 * As in Q6_K, the scale index of values [16k, 16k+16) is k. */
TGT static float K(q3_k)(const uint8_t *row, const float *x, const float *xs, int cols) {
    vf acc = VZERO;
    float off = 0;
    for (int i = 0; i < cols / 256; i++) {
        const uint8_t *b = row + (size_t)i * 110;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 64, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 256, *sb = xs + (size_t)i * 16;
        const uint8_t *s = b + 96;
        float d = h2f(b + 108);
        float ds[16];
        for (int k = 0; k < 16; k++) {
            int lo = k < 8 ? s[k] & 0x0F : s[k - 8] >> 4;
            int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
            ds[k] = d * (float)((lo | (hi << 4)) - 32);
            off += ds[k] * sb[k];
        }
        for (int n = 0; n < 2; n++) {
            const uint8_t *qs = b + 32 + 32 * n;
            for (int l = 0; l < 32; l += VW) {
                vi q = VU8(qs + l), hm = VU8(b + l);
                for (int j = 0; j < 4; j++) {
                    vi v = VOR(VAND(VSRL(q, 2 * j), 3), VSLL(VAND(VSRL(hm, 4 * n + j), 1), 2));
                    int k = 8 * n + 2 * j + l / 16;
                    acc = VFMA(VMUL(VSET1(ds[k]), VCVT(v)), VLOAD(xb + 128 * n + 32 * j + l), acc);
                }
            }
        }
    }
    return VSUM(acc) - 4.0f * off;
}

/* IQ4_XS: non-linear 4-bit values through the 16-entry table, 6-bit scales per 32 */
TGT static float K(iq4_xs)(const uint8_t *row, const float *x, const float *xs, int cols) {
    (void)xs;
    vf acc = VZERO;
    VLUT_DECL;
    for (int i = 0; i < cols / 256; i++) {
        const uint8_t *b = row + (size_t)i * 136;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 64, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 256;
        float d = h2f(b);
        unsigned sh = (unsigned)b[2] | (unsigned)b[3] << 8;
        for (int ib = 0; ib < 8; ib++) {
            int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F) | (int)(((sh >> (2 * ib)) & 3) << 4);
            const uint8_t *q = b + 8 + 16 * ib;
            const float *xj = xb + 32 * ib;
            vf s = VZERO;
            for (int h = 0; h < 16; h += VW) {
                vi v = VU8(q + h);
                s = VFMA(VLUT(VAND(v, 15)), VLOAD(xj + h), s);
                s = VFMA(VLUT(VSRL(v, 4)), VLOAD(xj + 16 + h), s);
            }
            acc = VFMA(VSET1(d * (float)(ls - 32)), s, acc);
        }
    }
    return VSUM(acc);
}

/* IQ4_NL: the IQ4_XS table with one float16 scale per 32 */
TGT static float K(iq4_nl)(const uint8_t *row, const float *x, const float *xs, int cols) {
    (void)xs;
    vf acc = VZERO;
    VLUT_DECL;
    for (int i = 0; i < cols / 32; i++) {
        const uint8_t *b = row + (size_t)i * 18;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 32;
        vf s = VZERO;
        for (int h = 0; h < 16; h += VW) {
            vi v = VU8(b + 2 + h);
            s = VFMA(VLUT(VAND(v, 15)), VLOAD(xb + h), s);
            s = VFMA(VLUT(VSRL(v, 4)), VLOAD(xb + 16 + h), s);
        }
        acc = VFMA(VSET1(h2f(b)), s, acc);
    }
    return VSUM(acc);
}

static cpu_ggml_dot_fn K(pick)(int t) {
    switch (t) {
    case SL_GGML_Q8_0: return K(q8_0);
    case SL_GGML_Q4_0: return K(q4_0);
    case SL_GGML_Q3_K: return K(q3_k);
    case SL_GGML_Q4_K: return K(q4_k);
    case SL_GGML_Q5_K: return K(q5_k);
    case SL_GGML_Q6_K: return K(q6_k);
    case SL_GGML_IQ4_XS: return K(iq4_xs);
    case SL_GGML_IQ4_NL: return K(iq4_nl);
    default: return NULL;
    }
}
