/* One-token matmul (decode). Each weight row is read once, widened to float in registers and multiplied
 * into the input with FMA, so decode streams the weights instead of first copying them out as floats.
 * MLX rows are computed as sum over groups of scale * (q . x) + bias * sum(x); the input is rearranged
 * once per call so that the low and high nibbles of 4-bit bytes meet their inputs in vector order. Block
 * FP8 rows are sums over tiles of scale * (q . x). */
#include "backend/cpu/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* bytes ahead to prefetch: the file mapping has 4 KB pages, where hardware prefetchers stop */
#define PF_AHEAD 2048

typedef cpu_row_dot_fn row_dot_fn;

/* Called only for a remainder: a call from vector code into this plain function on every row costs an
 * AVX-to-SSE transition each time. */
static float tail_dot(const sl_weight *w, int r, const float *x, int from) {
    float row[16];
    float s = 0;
    /* the last cols % 32 elements: decode them through the reference path, 16 at a time */
    for (int i = from; i < w->cols; i++) {
        if ((i - from) % 16 == 0) {
            int n = w->cols - i < 16 ? w->cols - i : 16;
            const uint8_t *p = w->data + (size_t)r * w->row_bytes;
            for (int k = 0; k < n; k++) {
                size_t at = (size_t)(i + k);
                row[k] = w->fmt == SL_WF_F32    ? ((const float *)p)[at]
                         : w->fmt == SL_WF_BF16 ? sl_bf16_to_f32(((const uint16_t *)p)[at])
                                                : sl_f16_to_f32(((const uint16_t *)p)[at]);
            }
        }
        s += row[(i - from) % 16] * x[i];
    }
    return s;
}

/* ---- AVX-512 ---- */

__attribute__((target("avx512f"))) static float dot512_f32(const sl_weight *w, int r, const float *x, const float *xp,
                                                           const float *xs) {
    (void)xp, (void)xs;
    const float *p = (const float *)(w->data + (size_t)r * w->row_bytes);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= w->cols; i += 32) {
        _mm_prefetch((const char *)(p + i) + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i) + PF_AHEAD + 64, _MM_HINT_T0);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(p + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(p + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) + (i < w->cols ? tail_dot(w, r, x, i) : 0.0f);
}

__attribute__((target("avx512f"))) static inline __m512 bf16x16(const uint16_t *p) {
    __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}

__attribute__((target("avx512f"))) static float dot512_bf16(const sl_weight *w, int r, const float *x, const float *xp,
                                                            const float *xs) {
    (void)xp, (void)xs;
    const uint16_t *p = (const uint16_t *)(w->data + (size_t)r * w->row_bytes);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 64 <= w->cols; i += 64) {
        _mm_prefetch((const char *)(p + i) + PF_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i) + PF_AHEAD + 64, _MM_HINT_T0);
        a0 = _mm512_fmadd_ps(bf16x16(p + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(bf16x16(p + i + 16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(bf16x16(p + i + 32), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(bf16x16(p + i + 48), _mm512_loadu_ps(x + i + 48), a3);
    }
    for (; i + 16 <= w->cols; i += 16) a0 = _mm512_fmadd_ps(bf16x16(p + i), _mm512_loadu_ps(x + i), a0);
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) +
           (i < w->cols ? tail_dot(w, r, x, i) : 0.0f);
}

__attribute__((target("avx512f"))) static float dot512_f16(const sl_weight *w, int r, const float *x, const float *xp,
                                                           const float *xs) {
    (void)xp, (void)xs;
    const uint16_t *p = (const uint16_t *)(w->data + (size_t)r * w->row_bytes);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= w->cols; i += 32) {
        _mm_prefetch((const char *)(p + i) + PF_AHEAD, _MM_HINT_T0);
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + i))), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + i + 16))),
                             _mm512_loadu_ps(x + i + 16), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) + (i < w->cols ? tail_dot(w, r, x, i) : 0.0f);
}

/* 4-bit: 16 bytes hold 32 values; low nibbles are the even inputs (xp[0..15]), high the odd (xp[16..31]) */
__attribute__((target("avx512f"))) static float dot512_q4(const sl_weight *w, int r, const float *x, const float *xp,
                                                          const float *xs) {
    (void)x;
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    int groups = w->cols / w->group, blocks = w->group / 32;
    size_t sb = (size_t)r * (size_t)groups;
    const __m512i m15 = _mm512_set1_epi32(15);
    __m512 tot = _mm512_setzero_ps();
    float bsum = 0;
    for (int g = 0; g < groups; g++) {
        __m512 acc = _mm512_setzero_ps();
        _mm_prefetch((const char *)p + (size_t)g * (size_t)blocks * 16 + PF_AHEAD, _MM_HINT_T0);
        for (int k = 0; k < blocks; k++) {
            int blk = g * blocks + k;
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + (size_t)blk * 16)));
            __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, m15));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
            acc = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xp + (size_t)blk * 32), acc);
            acc = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xp + (size_t)blk * 32 + 16), acc);
        }
        tot = _mm512_fmadd_ps(_mm512_set1_ps(load_sb(w->sb_fmt, w->scales, sb + (size_t)g)), acc, tot);
        bsum += load_sb(w->sb_fmt, w->biases, sb + (size_t)g) * xs[g];
    }
    return _mm512_reduce_add_ps(tot) + bsum;
}

__attribute__((target("avx512f"))) static float dot512_q8(const sl_weight *w, int r, const float *x, const float *xp,
                                                          const float *xs) {
    (void)xp;
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    int groups = w->cols / w->group, chunks = w->group / 16;
    size_t sb = (size_t)r * (size_t)groups;
    __m512 tot = _mm512_setzero_ps();
    float bsum = 0;
    for (int g = 0; g < groups; g++) {
        __m512 acc = _mm512_setzero_ps();
        _mm_prefetch((const char *)p + (size_t)g * (size_t)w->group + PF_AHEAD, _MM_HINT_T0);
        for (int k = 0; k < chunks; k++) {
            size_t at = (size_t)g * (size_t)w->group + (size_t)k * 16;
            __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + at))));
            acc = _mm512_fmadd_ps(q, _mm512_loadu_ps(x + at), acc);
        }
        tot = _mm512_fmadd_ps(_mm512_set1_ps(load_sb(w->sb_fmt, w->scales, sb + (size_t)g)), acc, tot);
        bsum += load_sb(w->sb_fmt, w->biases, sb + (size_t)g) * xs[g];
    }
    return _mm512_reduce_add_ps(tot) + bsum;
}

/* Block FP8 (e4m3fn): each byte's float built from its bits, exactly: normal values as exponent + 120 over
 * the 3 mantissa bits, subnormals as mantissa * 2^-9, S.1111.111 as NaN; the sum over each tile is scaled
 * once. */
__attribute__((target("avx512f"))) static inline __m512 fp8x16_512(__m128i b) {
    __m512i v = _mm512_cvtepu8_epi32(b), em = _mm512_and_si512(v, _mm512_set1_epi32(0x7f));
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
    __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(em, 20), _mm512_set1_epi32(120 << 23));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(em), _mm512_set1_ps(0x1p-9f));
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmplt_epi32_mask(em, _mm512_set1_epi32(8)), _mm512_castps_si512(sub));
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(em, _mm512_set1_epi32(0x7f)),
                                 _mm512_set1_epi32(0x7fc00000));
    return _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
}

/* cols and the tile width multiples of 16 */
__attribute__((target("avx512f"))) static float dot512_fp8(const sl_weight *w, int r, const float *x, const float *xp,
                                                           const float *xs) {
    (void)xp, (void)xs;
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    int tc = (w->cols + w->group - 1) / w->group;
    const float *sc = (const float *)(const void *)w->scales + (size_t)(r / w->tile_rows) * (size_t)tc;
    __m512 tot = _mm512_setzero_ps();
    for (int g = 0; g < tc; g++) {
        int c0 = g * w->group, c1 = c0 + w->group < w->cols ? c0 + w->group : w->cols;
        __m512 acc = _mm512_setzero_ps();
        _mm_prefetch((const char *)p + c0 + PF_AHEAD, _MM_HINT_T0);
        for (int i = c0; i < c1; i += 16)
            acc = _mm512_fmadd_ps(fp8x16_512(_mm_loadu_si128((const __m128i *)(p + i))), _mm512_loadu_ps(x + i), acc);
        tot = _mm512_fmadd_ps(_mm512_set1_ps(sc[g]), acc, tot);
    }
    return _mm512_reduce_add_ps(tot);
}

/* ---- AVX2 + FMA + F16C ---- */

__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static float dot256_f32(const sl_weight *w, int r, const float *x, const float *xp,
                                                            const float *xs) {
    (void)xp, (void)xs;
    const float *p = (const float *)(w->data + (size_t)r * w->row_bytes);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= w->cols; i += 16) {
        _mm_prefetch((const char *)(p + i) + PF_AHEAD, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(p + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(p + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    return hsum256(_mm256_add_ps(a0, a1)) + (i < w->cols ? tail_dot(w, r, x, i) : 0.0f);
}

__attribute__((target("avx2,fma"))) static inline __m256 bf16x8(const uint16_t *p) {
    __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}

__attribute__((target("avx2,fma"))) static float dot256_bf16(const sl_weight *w, int r, const float *x, const float *xp,
                                                             const float *xs) {
    (void)xp, (void)xs;
    const uint16_t *p = (const uint16_t *)(w->data + (size_t)r * w->row_bytes);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= w->cols; i += 16) {
        if (i % 32 == 0) _mm_prefetch((const char *)(p + i) + PF_AHEAD, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(bf16x8(p + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(bf16x8(p + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    return hsum256(_mm256_add_ps(a0, a1)) + (i < w->cols ? tail_dot(w, r, x, i) : 0.0f);
}

__attribute__((target("avx2,fma,f16c"))) static float dot256_f16(const sl_weight *w, int r, const float *x,
                                                                 const float *xp, const float *xs) {
    (void)xp, (void)xs;
    const uint16_t *p = (const uint16_t *)(w->data + (size_t)r * w->row_bytes);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= w->cols; i += 16) {
        if (i % 32 == 0) _mm_prefetch((const char *)(p + i) + PF_AHEAD, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + i))), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + i + 8))), _mm256_loadu_ps(x + i + 8),
                             a1);
    }
    return hsum256(_mm256_add_ps(a0, a1)) + (i < w->cols ? tail_dot(w, r, x, i) : 0.0f);
}

__attribute__((target("avx2,fma"))) static float dot256_q4(const sl_weight *w, int r, const float *x, const float *xp,
                                                           const float *xs) {
    (void)x;
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    int groups = w->cols / w->group, blocks = w->group / 32;
    size_t sb = (size_t)r * (size_t)groups;
    const __m256i m15 = _mm256_set1_epi32(15);
    __m256 tot = _mm256_setzero_ps();
    float bsum = 0;
    for (int g = 0; g < groups; g++) {
        __m256 acc = _mm256_setzero_ps();
        _mm_prefetch((const char *)p + (size_t)g * (size_t)blocks * 16 + PF_AHEAD, _MM_HINT_T0);
        for (int k = 0; k < blocks; k++) {
            int blk = g * blocks + k;
            const uint8_t *q = p + (size_t)blk * 16;
            const float *xb = xp + (size_t)blk * 32;
            for (int half = 0; half < 2; half++) { /* bytes 0-7 then 8-15 */
                __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + half * 8)));
                acc =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, m15)), _mm256_loadu_ps(xb + half * 8), acc);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), _mm256_loadu_ps(xb + 16 + half * 8),
                                      acc);
            }
        }
        tot = _mm256_fmadd_ps(_mm256_set1_ps(load_sb(w->sb_fmt, w->scales, sb + (size_t)g)), acc, tot);
        bsum += load_sb(w->sb_fmt, w->biases, sb + (size_t)g) * xs[g];
    }
    return hsum256(tot) + bsum;
}

__attribute__((target("avx2,fma"))) static float dot256_q8(const sl_weight *w, int r, const float *x, const float *xp,
                                                           const float *xs) {
    (void)xp;
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    int groups = w->cols / w->group, chunks = w->group / 8;
    size_t sb = (size_t)r * (size_t)groups;
    __m256 tot = _mm256_setzero_ps();
    float bsum = 0;
    for (int g = 0; g < groups; g++) {
        __m256 acc = _mm256_setzero_ps();
        _mm_prefetch((const char *)p + (size_t)g * (size_t)w->group + PF_AHEAD, _MM_HINT_T0);
        for (int k = 0; k < chunks; k++) {
            size_t at = (size_t)g * (size_t)w->group + (size_t)k * 8;
            __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + at))));
            acc = _mm256_fmadd_ps(q, _mm256_loadu_ps(x + at), acc);
        }
        tot = _mm256_fmadd_ps(_mm256_set1_ps(load_sb(w->sb_fmt, w->scales, sb + (size_t)g)), acc, tot);
        bsum += load_sb(w->sb_fmt, w->biases, sb + (size_t)g) * xs[g];
    }
    return hsum256(tot) + bsum;
}

__attribute__((target("avx2,fma"))) static inline __m256 fp8x8_256(__m128i b) {
    __m256i v = _mm256_cvtepu8_epi32(b), em = _mm256_and_si256(v, _mm256_set1_epi32(0x7f));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
    __m256i bits = _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23));
    __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(0x1p-9f));
    bits = _mm256_blendv_epi8(bits, _mm256_castps_si256(sub), _mm256_cmpgt_epi32(_mm256_set1_epi32(8), em));
    bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7f)));
    return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

__attribute__((target("avx2,fma"))) static float dot256_fp8(const sl_weight *w, int r, const float *x, const float *xp,
                                                            const float *xs) {
    (void)xp, (void)xs;
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    int tc = (w->cols + w->group - 1) / w->group;
    const float *sc = (const float *)(const void *)w->scales + (size_t)(r / w->tile_rows) * (size_t)tc;
    __m256 tot = _mm256_setzero_ps();
    for (int g = 0; g < tc; g++) {
        int c0 = g * w->group, c1 = c0 + w->group < w->cols ? c0 + w->group : w->cols;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        _mm_prefetch((const char *)p + c0 + PF_AHEAD, _MM_HINT_T0);
        for (int i = c0; i < c1; i += 16) {
            __m128i b = _mm_loadu_si128((const __m128i *)(p + i));
            a0 = _mm256_fmadd_ps(fp8x8_256(b), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(fp8x8_256(_mm_srli_si128(b, 8)), _mm256_loadu_ps(x + i + 8), a1);
        }
        tot = _mm256_fmadd_ps(_mm256_set1_ps(sc[g]), _mm256_add_ps(a0, a1), tot);
    }
    return hsum256(tot);
}

/* MXFP4 rows against the input permuted as for 4-bit MLX (a byte's low nibble meets perm[i], its high
 * nibble perm[16 + i]): each code's magnitude is looked up by a lane permute and its sign set by xor,
 * and the block's sum is scaled by its power of two. */
__attribute__((target("avx2,fma"))) static float dot256_mxfp4(const sl_weight *w, int r, const float *x,
                                                              const float *xp, const float *xs) {
    (void)x, (void)xs;
    const uint8_t *p = w->data + (size_t)r * w->row_bytes, *sc = w->scales + (size_t)r * (size_t)(w->cols / 32);
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i m7 = _mm256_set1_epi32(7), m8 = _mm256_set1_epi32(8);
    const __m128i m15 = _mm_set1_epi8(15);
    __m256 tot = _mm256_setzero_ps();
    for (int b = 0; b < w->cols / 32; b++) {
        _mm_prefetch((const char *)p + (size_t)b * 16 + PF_AHEAD, _MM_HINT_T0);
        __m128i q = _mm_loadu_si128((const __m128i *)(p + (size_t)b * 16));
        __m128i lo = _mm_and_si128(q, m15), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m15);
        __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        const float *xb = xp + (size_t)b * 32;
        __m256 acc = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            __m256i code = _mm256_cvtepu8_epi32(parts[k]);
            __m256 v = _mm256_permutevar8x32_ps(mag, _mm256_and_si256(code, m7));
            v = _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(code, m8), 28)));
            acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(xb + 8 * k), acc);
        }
        /* E8M0: the byte is the float's exponent field (0: the subnormal 2^-127) */
        int e = sc[b] ? (int)sc[b] << 23 : 0x00400000;
        tot = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_set1_epi32(e)), acc, tot);
    }
    return hsum256(tot);
}

static row_dot_fn pick(const cpu_impl *c, const sl_weight *w) {
    int q = w->fmt == SL_WF_MLX && w->group % 32 == 0 ? w->bits : 0;
    int fp8 = w->fmt == SL_WF_FP8 && w->cols % 16 == 0 && w->group % 16 == 0;
    if (fp8) return c->avx512 ? dot512_fp8 : c->avx2 ? dot256_fp8 : NULL;
    /* MXFP4 takes the AVX2 kernel on AVX-512 machines too (a 16-byte block fills 256-bit lanes) */
    if ((c->avx512 || c->avx2) && w->fmt == SL_WF_MXFP4 && w->cols % 32 == 0) return dot256_mxfp4;
    if (c->avx512) {
        if (w->fmt == SL_WF_F32) return dot512_f32;
        if (w->fmt == SL_WF_BF16) return dot512_bf16;
        if (w->fmt == SL_WF_F16) return dot512_f16;
        if (q == 4) return dot512_q4;
        if (q == 8) return dot512_q8;
    } else if (c->avx2) {
        if (w->fmt == SL_WF_F32) return dot256_f32;
        if (w->fmt == SL_WF_BF16) return dot256_bf16;
        if (w->fmt == SL_WF_F16) return dot256_f16;
        if (q == 4) return dot256_q4;
        if (q == 8) return dot256_q8;
    }
    return NULL;
}

/* Floats of prep the input arrangement of w's kernel takes: MLX the 4-bit permutation and the group sums,
 * MXFP4 the permutation, GGML the sums over 16. */
size_t cpu_mv_prep_floats(const sl_weight *w) {
    if (w->fmt == SL_WF_MLX) return (size_t)w->cols + (size_t)(w->cols / w->group);
    if (w->fmt == SL_WF_MXFP4) return (size_t)w->cols;
    if (w->fmt == SL_WF_GGML) return (size_t)w->cols / 16;
    return 0;
}

int cpu_mv_prep(const cpu_impl *c, const sl_weight *w, const float *x, float *prep, float *y, cpu_mv *mv) {
    *mv = (cpu_mv){.w = w, .x = x, .y = y};
    if (w->transposed) return -1;
    if (w->fmt == SL_WF_GGML) {
        if (!(mv->gdot = cpu_ggml_pick(c, w->gtype))) return -1;
        cpu_sums16(x, (size_t)w->cols / 16, prep);
        mv->xs = prep;
        return 0;
    }
    if (!(mv->dot = pick(c, w))) return -1;
    if (w->fmt == SL_WF_MLX) {
        size_t groups = (size_t)(w->cols / w->group);
        float *perm = prep, *sums = prep + w->cols;
        for (size_t g = 0; g < groups; g++) {
            float s = 0;
            for (int i = 0; i < w->group; i++) s += x[g * (size_t)w->group + (size_t)i];
            sums[g] = s;
        }
        if (w->bits == 4)
            for (int b = 0; b < w->cols / 32; b++)
                for (int i = 0; i < 16; i++) {
                    perm[b * 32 + i] = x[b * 32 + 2 * i];
                    perm[b * 32 + 16 + i] = x[b * 32 + 2 * i + 1];
                }
        mv->xp = perm;
        mv->xs = sums;
    } else if (w->fmt == SL_WF_MXFP4) { /* the 4-bit permutation, without group sums */
        for (int b = 0; b < w->cols / 32; b++)
            for (int i = 0; i < 16; i++) {
                prep[b * 32 + i] = x[b * 32 + 2 * i];
                prep[b * 32 + 16 + i] = x[b * 32 + 2 * i + 1];
            }
        mv->xp = prep;
    }
    return 0;
}

void cpu_mv_rows(const cpu_mv *mv, int64_t r0, int64_t r1) {
    const sl_weight *w = mv->w;
    for (int64_t r = r0; r < r1; r++) {
        float v = mv->gdot ? mv->gdot(w->data + (size_t)r * w->row_bytes, mv->x, mv->xs, w->cols)
                           : mv->dot(w, (int)r, mv->x, mv->xp, mv->xs);
        mv->y[r] = w->bias ? v + w->bias[r] : v;
    }
}

static void gv_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    cpu_mv_rows(ctx, b, e);
}

int cpu_gemv(cpu_impl *c, const sl_weight *w, const float *x, float *y) {
    if (w->fmt == SL_WF_GGML) return -1; /* GGML weights take cpu_ggml_matmul_fused */
    size_t need = cpu_mv_prep_floats(w);
    if (need > c->xprep_len) {
        float *p = realloc(c->xprep, need * sizeof *p);
        if (!p) return -1;
        c->xprep = p;
        c->xprep_len = need;
    }
    cpu_mv mv;
    if (cpu_mv_prep(c, w, x, c->xprep, y, &mv)) return -1;
    sl_pool_for(c->pool, w->rows, 8, gv_task, &mv);
    return 0;
}

#else

int cpu_gemv(cpu_impl *c, const sl_weight *w, const float *x, float *y) {
    (void)c, (void)w, (void)x, (void)y;
    return -1;
}

size_t cpu_mv_prep_floats(const sl_weight *w) {
    (void)w;
    return 0;
}

int cpu_mv_prep(const cpu_impl *c, const sl_weight *w, const float *x, float *prep, float *y, cpu_mv *mv) {
    (void)c, (void)w, (void)x, (void)prep, (void)y, (void)mv;
    return -1;
}

void cpu_mv_rows(const cpu_mv *mv, int64_t r0, int64_t r1) {
    (void)mv, (void)r0, (void)r1;
}

#endif
