/* The GGML fused row kernels of cpu_ggml_kern.h, compiled for AVX-512 and for AVX2 (+FMA, F16C). */
#include "backend/cpu/cpu.h"
#include "backend/ggml_types.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* bytes ahead to prefetch: the file mapping has 4 KB pages, where hardware prefetchers stop */
#define PF_AHEAD 2048
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define K(name) CAT(name, SFX)
#define IQ4NL_VALUES -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113

static inline uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
#define h2f(p) _cvtsh_ss(ld16(p))

__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- AVX-512: 16 values per vector ---- */
#define SFX _512
#define TGT __attribute__((target("avx512f,avx2,fma,f16c")))
#define VW 16
typedef __m512 vf512;
typedef __m512i vi512;
#define vf vf512
#define vi vi512
#define VZERO _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSET1(v) _mm512_set1_ps(v)
#define VSUM(v) _mm512_reduce_add_ps(v)
#define VU8(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define VI8(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define VCVT(a) _mm512_cvtepi32_ps(a)
#define VAND(a, k) _mm512_and_si512(a, _mm512_set1_epi32(k))
#define VOR(a, b) _mm512_or_si512(a, b)
#define VSRL(a, n) _mm512_srl_epi32(a, _mm_cvtsi32_si128(n))
#define VSLL(a, n) _mm512_sll_epi32(a, _mm_cvtsi32_si128(n))
#define VLUT_DECL                                                                                                      \
    const float lut_v[16] = {IQ4NL_VALUES};                                                                            \
    const __m512 lut = _mm512_loadu_ps(lut_v)
#define VLUT(i) _mm512_permutexvar_ps(i, lut)
#include "backend/cpu/cpu_ggml_kern.h"
#undef SFX
#undef TGT
#undef VW
#undef vf
#undef vi
#undef VZERO
#undef VLOAD
#undef VFMA
#undef VMUL
#undef VADD
#undef VSET1
#undef VSUM
#undef VU8
#undef VI8
#undef VCVT
#undef VAND
#undef VOR
#undef VSRL
#undef VSLL
#undef VLUT_DECL
#undef VLUT

/* ---- AVX2: 8 values per vector ---- */
/* a 16-entry table from two 8-entry permutes, chosen by bit 3 of the index */
__attribute__((target("avx2,fma"))) static inline __m256 lut16(__m256i i, __m256 lo, __m256 hi) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, i), _mm256_permutevar8x32_ps(hi, i),
                            _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));
}

#define SFX _256
#define TGT __attribute__((target("avx2,fma,f16c")))
#define VW 8
#define vf __m256
#define vi __m256i
#define VZERO _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSET1(v) _mm256_set1_ps(v)
#define VSUM(v) hsum8(v)
#define VU8(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define VI8(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define VCVT(a) _mm256_cvtepi32_ps(a)
#define VAND(a, k) _mm256_and_si256(a, _mm256_set1_epi32(k))
#define VOR(a, b) _mm256_or_si256(a, b)
#define VSRL(a, n) _mm256_srl_epi32(a, _mm_cvtsi32_si128(n))
#define VSLL(a, n) _mm256_sll_epi32(a, _mm_cvtsi32_si128(n))
#define VLUT_DECL                                                                                                      \
    const float lut_v[16] = {IQ4NL_VALUES};                                                                            \
    const __m256 lut_lo = _mm256_loadu_ps(lut_v), lut_hi = _mm256_loadu_ps(lut_v + 8)
#define VLUT(i) lut16(i, lut_lo, lut_hi)
#include "backend/cpu/cpu_ggml_kern.h"

cpu_ggml_dot_fn cpu_ggml_pick(const cpu_impl *c, int gtype) {
    if (c->avx512) return pick_512(gtype);
    if (c->avx2) return pick_256(gtype);
    return NULL;
}

#else

cpu_ggml_dot_fn cpu_ggml_pick(const cpu_impl *c, int gtype) {
    (void)c, (void)gtype;
    return NULL;
}

#endif
