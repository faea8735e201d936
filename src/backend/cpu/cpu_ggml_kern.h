/* Fused dequantise-dot row kernels for the GGML types, written once against a small vector vocabulary
 * and compiled for each instruction set by cpu_ggml_simd.c (which defines the vocabulary and includes
 * this file once per set). Each kernel returns dot(dequantised row, x) over `cols` values; `xs` holds the
 * sums of x over each 16 values, so constant offsets and per-group minimums cost one scalar term per
 * group instead of a vector operation per value. Scales are applied once per group of products. */

/* Per-block scales are decoded eight at a time with 256-bit integer ops (both instruction sets have
 * AVX2), and the per-group offsets are accumulated as vectors, so little scalar work remains per block. */
TGT static inline __m256 K(u8x8)(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

TGT static inline __m256 K(i8x8)(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* sums of x over the 8 groups of 32 of a block, from its 16 sums over 16 */
TGT static inline __m256 K(xs32)(const float *xs16) {
    __m256 h = _mm256_hadd_ps(_mm256_loadu_ps(xs16), _mm256_loadu_ps(xs16 + 8));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(h), 0xD8));
}

/* Q4_K / Q5_K: 8 six-bit scales then 8 six-bit minimums as bytes (the 12 bytes seen as 3 words) */
static inline void K(k4_unpack)(const uint8_t *q, uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, q, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    uint32_t t = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = t;
    u[0] &= m1;
    memcpy(out, u, 16);
}

/* Q3_K: the 16 six-bit scales as bytes (still offset by 32) */
static inline void K(k3_unpack)(const uint8_t *q, uint8_t out[16]) {
    uint32_t a[4];
    memcpy(a, q, 12);
    const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
    uint32_t t = a[2];
    a[2] = ((a[0] >> 4) & k2) | (((t >> 4) & k1) << 4);
    a[3] = ((a[1] >> 4) & k2) | (((t >> 6) & k1) << 4);
    a[0] = (a[0] & k2) | (((t >> 0) & k1) << 4);
    a[1] = (a[1] & k2) | (((t >> 2) & k1) << 4);
    memcpy(out, a, 16);
}

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

/* Q4_K: each 64 values share 32 bytes, low nibbles the first 32, high the next; d*sc*q - dmin*m */
TGT static float K(q4_k)(const uint8_t *row, const float *x, const float *xs, int cols) {
    vf acc = VZERO, acc1 = VZERO; /* two chains hide the FMA latency */
    __m256 offv = _mm256_setzero_ps();
    for (int i = 0; i < cols / 256; i++) {
        const uint8_t *b = row + (size_t)i * 144;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 128, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 256, *sb = xs + (size_t)i * 16;
        uint8_t sm[16];
        K(k4_unpack)(b + 4, sm);
        float ds[8];
        _mm256_storeu_ps(ds, _mm256_mul_ps(_mm256_set1_ps(h2f(b)), K(u8x8)(sm)));
        offv = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(h2f(b + 2)), K(u8x8)(sm + 8)), K(xs32)(sb), offv);
        for (int j = 0; j < 4; j++) {
            const uint8_t *q = b + 16 + 32 * j;
            const float *xj = xb + 64 * j;
            vf lo = VZERO, hi = VZERO;
            for (int h = 0; h < 32; h += VW) {
                vi v = VU8(q + h);
                lo = VFMA(VCVT(VAND(v, 15)), VLOAD(xj + h), lo);
                hi = VFMA(VCVT(VSRL(v, 4)), VLOAD(xj + 32 + h), hi);
            }
            acc = VFMA(VSET1(ds[2 * j]), lo, acc);
            acc1 = VFMA(VSET1(ds[2 * j + 1]), hi, acc1);
        }
    }
    return VSUM(VADD(acc, acc1)) - hsum8(offv);
}

/* Q5_K: Q4_K plus a fifth bit per value from qh (bit 2j for the low half of pair j, 2j+1 the high) */
TGT static float K(q5_k)(const uint8_t *row, const float *x, const float *xs, int cols) {
    vf acc = VZERO, acc1 = VZERO; /* two chains hide the FMA latency */
    __m256 offv = _mm256_setzero_ps();
    for (int i = 0; i < cols / 256; i++) {
        const uint8_t *b = row + (size_t)i * 176;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 128, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 256, *sb = xs + (size_t)i * 16;
        uint8_t sm[16];
        K(k4_unpack)(b + 4, sm);
        float ds[8];
        _mm256_storeu_ps(ds, _mm256_mul_ps(_mm256_set1_ps(h2f(b)), K(u8x8)(sm)));
        offv = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(h2f(b + 2)), K(u8x8)(sm + 8)), K(xs32)(sb), offv);
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
            acc = VFMA(VSET1(ds[2 * j]), lo, acc);
            acc1 = VFMA(VSET1(ds[2 * j + 1]), hi, acc1);
        }
    }
    return VSUM(VADD(acc, acc1)) - hsum8(offv);
}

/* Q6_K: 4 low bits in ql, 2 high in qh, minus 32, times d * int8 scale per 16 values. The scale of
 * values [16k, 16k+16) is sc[k], which is also the index of their x sum. */
TGT static float K(q6_k)(const uint8_t *row, const float *x, const float *xs, int cols) {
    vf acc = VZERO, acc1 = VZERO, acc2 = VZERO, acc3 = VZERO; /* independent chains */
    __m256 offv = _mm256_setzero_ps();
    for (int i = 0; i < cols / 256; i++) {
        const uint8_t *b = row + (size_t)i * 210;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 192, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 256, *sb = xs + (size_t)i * 16;
        __m256 d8 = _mm256_set1_ps(h2f(b + 208));
        __m256 s0 = _mm256_mul_ps(d8, K(i8x8)(b + 192)), s1 = _mm256_mul_ps(d8, K(i8x8)(b + 200));
        float ds[16];
        _mm256_storeu_ps(ds, s0);
        _mm256_storeu_ps(ds + 8, s1);
        offv = _mm256_fmadd_ps(s0, _mm256_loadu_ps(sb), offv);
        offv = _mm256_fmadd_ps(s1, _mm256_loadu_ps(sb + 8), offv);
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
                acc1 = VFMA(VMUL(VSET1(ds[k + 2]), VCVT(q2)), VLOAD(xn + 32 + l), acc1);
                acc2 = VFMA(VMUL(VSET1(ds[k + 4]), VCVT(q3)), VLOAD(xn + 64 + l), acc2);
                acc3 = VFMA(VMUL(VSET1(ds[k + 6]), VCVT(q4)), VLOAD(xn + 96 + l), acc3);
            }
        }
    }
    return VSUM(VADD(VADD(acc, acc1), VADD(acc2, acc3))) - 32.0f * hsum8(offv);
}

/* Q3_K: 2 low bits in qs, the third in hmask; value d * scale * (q3 - 4) with 6-bit signed scales.
 * As in Q6_K, the scale index of values [16k, 16k+16) is k. */
TGT static float K(q3_k)(const uint8_t *row, const float *x, const float *xs, int cols) {
    vf acc[4] = {VZERO, VZERO, VZERO, VZERO}; /* independent chains */
    __m256 offv = _mm256_setzero_ps();
    for (int i = 0; i < cols / 256; i++) {
        const uint8_t *b = row + (size_t)i * 110;
        _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_AHEAD + 64, _MM_HINT_T0);
        const float *xb = x + (size_t)i * 256, *sb = xs + (size_t)i * 16;
        uint8_t sc[16];
        K(k3_unpack)(b + 96, sc);
        __m256 d8 = _mm256_set1_ps(h2f(b + 108)), c32 = _mm256_set1_ps(32.0f);
        __m256 s0 = _mm256_mul_ps(d8, _mm256_sub_ps(K(u8x8)(sc), c32));
        __m256 s1 = _mm256_mul_ps(d8, _mm256_sub_ps(K(u8x8)(sc + 8), c32));
        float ds[16];
        _mm256_storeu_ps(ds, s0);
        _mm256_storeu_ps(ds + 8, s1);
        offv = _mm256_fmadd_ps(s0, _mm256_loadu_ps(sb), offv);
        offv = _mm256_fmadd_ps(s1, _mm256_loadu_ps(sb + 8), offv);
        for (int n = 0; n < 2; n++) {
            const uint8_t *qs = b + 32 + 32 * n;
            for (int l = 0; l < 32; l += VW) {
                vi q = VU8(qs + l), hm = VU8(b + l);
                for (int j = 0; j < 4; j++) {
                    vi v = VOR(VAND(VSRL(q, 2 * j), 3), VSLL(VAND(VSRL(hm, 4 * n + j), 1), 2));
                    int k = 8 * n + 2 * j + l / 16;
                    acc[j] = VFMA(VMUL(VSET1(ds[k]), VCVT(v)), VLOAD(xb + 128 * n + 32 * j + l), acc[j]);
                }
            }
        }
    }
    return VSUM(VADD(VADD(acc[0], acc[1]), VADD(acc[2], acc[3]))) - 4.0f * hsum8(offv);
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
