/* GGML block-quantised weights (GGUF files) on the GPU, in their stored bytes. Every type decodes in
 * units of 32 consecutive values (a whole 32-value block, or one eighth of a 256-value super-block),
 * by the formulas of the CPU reference (backend/ggml_types.c). Decode runs a fused dequantise-GEMV: per
 * row, a warp copies the bytes of its next 32 units into shared memory with aligned 128-bit loads
 * (blocks of most types are not 16-byte aligned), then each lane decodes one unit from there and dots
 * it with the input staged in shared memory, accumulating in fp32. Prefill dequantises the weight to
 * the bf16 scratch of the tensor-core path; embedding rows decode straight from the weight. */
#include "backend/cuda/cuda_int.cuh"

extern "C" {
#include "backend/ggml_grids.h"
#include "backend/ggml_types.h"
}

/* IQ codebooks, copied from the host tables once per device (cu_ggml_init) */
__device__ uint64_t g_iq2xxs[256];
__device__ uint64_t g_iq2xs[512];
__device__ uint64_t g_iq2s[1024];
__device__ uint32_t g_iq3xxs[256];
__device__ uint32_t g_iq3s[512];
__device__ uint64_t g_iq1s[2048];

int cu_ggml_init(void) {
    return cudaMemcpyToSymbol(g_iq2xxs, sl_iq2xxs_grid, sizeof g_iq2xxs) != cudaSuccess ||
                   cudaMemcpyToSymbol(g_iq2xs, sl_iq2xs_grid, sizeof g_iq2xs) != cudaSuccess ||
                   cudaMemcpyToSymbol(g_iq2s, sl_iq2s_grid, sizeof g_iq2s) != cudaSuccess ||
                   cudaMemcpyToSymbol(g_iq3xxs, sl_iq3xxs_grid, sizeof g_iq3xxs) != cudaSuccess ||
                   cudaMemcpyToSymbol(g_iq3s, sl_iq3s_grid, sizeof g_iq3s) != cudaSuccess ||
                   cudaMemcpyToSymbol(g_iq1s, sl_iq1s_grid, sizeof g_iq1s) != cudaSuccess
               ? -1
               : 0;
}

/* ---- byte fields (blocks have no alignment) ---- */

__device__ __forceinline__ unsigned u16at(const uint8_t *p) {
    return (unsigned)p[0] | ((unsigned)p[1] << 8);
}
__device__ __forceinline__ unsigned u32at(const uint8_t *p) {
    return u16at(p) | (u16at(p + 2) << 16);
}
__device__ __forceinline__ float f16at(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)u16at(p)));
}

/* exact float of a small integer (|v| < 2^22) by the 1.5 * 2^23 bias: full-rate integer add and float
 * subtract, where an int-to-float conversion runs at a quarter of the rate */
__device__ __forceinline__ float i2f(int v) {
    return __int_as_float(0x4B400000 + v) - 12582912.0f;
}

/* 16-entry signed byte tables held as four words: entry i is byte i of k0..k3 */
__device__ __forceinline__ int lut16(unsigned k0, unsigned k1, unsigned k2, unsigned k3, unsigned i) {
    unsigned lo = __byte_perm(k0, k1, i & 7), hi = __byte_perm(k2, k3, i & 7);
    return (int)(signed char)((i & 8) ? hi : lo);
}
/* IQ4_NL codebook {-127, -104, ..., 113} */
__device__ __forceinline__ int iq4nl(unsigned i) {
    return lut16(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u, i);
}
/* E2M1 values doubled {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ...} */
__device__ __forceinline__ int mxfp4v(unsigned i) {
    return lut16(0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu, i);
}
/* sign byte of a 7-bit index: bit 7 makes the count of negative signs even */
__device__ __forceinline__ unsigned iq_signs(unsigned i) {
    return i | ((__popc(i) & 1u) << 7);
}
/* 8 values: grid bytes g (as two words) times db, negated where `signs` has a bit */
__device__ __forceinline__ void grid8(float *y, float db, unsigned g0, unsigned g1, unsigned signs) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        unsigned g = ((j < 4 ? g0 : g1) >> (8 * (j & 3))) & 0xFFu;
        y[j] = db * i2f(g) * ((signs >> j) & 1u ? -1.0f : 1.0f);
    }
}

/* ---- one unit of 32 values: unit s (0 for 32-value blocks) of block b ---- */

template <int T> struct gq;

template <> struct gq<SL_GGML_Q4_0> {
    static constexpr int BS = 32, BB = 18;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, float *y) {
        float d = f16at(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            y[j] = i2f((b[2 + j] & 15) - 8) * d;
            y[j + 16] = i2f((b[2 + j] >> 4) - 8) * d;
        }
    }
};

template <> struct gq<SL_GGML_Q4_1> {
    static constexpr int BS = 32, BB = 20;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, float *y) {
        float d = f16at(b), m = f16at(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            y[j] = i2f(b[4 + j] & 15) * d + m;
            y[j + 16] = i2f(b[4 + j] >> 4) * d + m;
        }
    }
};

template <> struct gq<SL_GGML_Q5_0> {
    static constexpr int BS = 32, BB = 22;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, float *y) {
        float d = f16at(b);
        unsigned qh = u32at(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = i2f(((b[6 + j] & 15) | h0) - 16) * d;
            y[j + 16] = i2f(((b[6 + j] >> 4) | h1) - 16) * d;
        }
    }
};

template <> struct gq<SL_GGML_Q5_1> {
    static constexpr int BS = 32, BB = 24;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, float *y) {
        float d = f16at(b), m = f16at(b + 2);
        unsigned qh = u32at(b + 4);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = i2f((b[8 + j] & 15) | h0) * d + m;
            y[j + 16] = i2f((b[8 + j] >> 4) | h1) * d + m;
        }
    }
};

template <> struct gq<SL_GGML_Q8_0> {
    static constexpr int BS = 32, BB = 34;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, float *y) {
        float d = f16at(b);
#pragma unroll
        for (int j = 0; j < 32; j++) y[j] = i2f((signed char)b[2 + j]) * d;
    }
};

template <> struct gq<SL_GGML_IQ4_NL> {
    static constexpr int BS = 32, BB = 18;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, float *y) {
        float d = f16at(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            y[j] = d * i2f(iq4nl(b[2 + j] & 15u));
            y[j + 16] = d * i2f(iq4nl((unsigned)b[2 + j] >> 4));
        }
    }
};

template <> struct gq<SL_GGML_MXFP4> {
    static constexpr int BS = 32, BB = 17;
    static __device__ __forceinline__ void unit(const uint8_t *b, int, float *y) {
        float d = ldexpf(1.0f, (int)b[0] - 128); /* 2^(e-127), halved for the doubled table */
#pragma unroll
        for (int j = 0; j < 16; j++) {
            y[j] = i2f(mxfp4v(b[1 + j] & 15u)) * d;
            y[j + 16] = i2f(mxfp4v((unsigned)b[1 + j] >> 4)) * d;
        }
    }
};

template <> struct gq<SL_GGML_Q2_K> {
    static constexpr int BS = 256, BB = 84;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        float d = f16at(b + 80), dmin = f16at(b + 82);
        const uint8_t *q = b + 16 + 32 * (s >> 2);
        int shift = 2 * (s & 3), is = 2 * s;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            unsigned sc = b[is + h];
            float dl = d * i2f(sc & 15), ml = dmin * i2f(sc >> 4);
#pragma unroll
            for (int l = 0; l < 16; l++) y[16 * h + l] = dl * i2f((q[16 * h + l] >> shift) & 3) - ml;
        }
    }
};

template <> struct gq<SL_GGML_Q3_K> {
    static constexpr int BS = 256, BB = 110;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        float d = f16at(b + 108);
        const uint8_t *q = b + 32 + 32 * (s >> 2), *sc = b + 96;
        int shift = 2 * (s & 3);
        unsigned m = 1u << s; /* 4 shifts per half, one bit of the high mask each */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int j = 2 * s + h;
            int lo = j < 8 ? sc[j] & 15 : sc[j - 8] >> 4;
            int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
            float dl = d * i2f((lo | (hi << 4)) - 32);
#pragma unroll
            for (int l = 16 * h; l < 16 * h + 16; l++) y[l] = dl * i2f(((q[l] >> shift) & 3) - ((b[l] & m) ? 0 : 4));
        }
    }
};

/* scale and min j (0..7) of a Q4_K/Q5_K super-block, 6 bits each in 12 bytes */
__device__ __forceinline__ void k4_scale_min(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* sub-block s's scale and minimum codes from a Q4_K block's 12 scale bytes (three words): k4_scale_min on
 * byte s & 3 of each */
__device__ __forceinline__ void im_scale(unsigned s0, unsigned s1, unsigned s2, int s, int &sc, int &mn) {
    int j = 8 * (s & 3);
    int b0 = (s0 >> j) & 255, b1 = (s1 >> j) & 255, b2 = (s2 >> j) & 255;
    sc = s < 4 ? b0 & 63 : (b2 & 15) | ((b0 >> 6) << 4);
    mn = s < 4 ? b1 & 63 : (b2 >> 4) | ((b1 >> 6) << 4);
}

/* Sub-block s's scale dl = d sc and minimum ml = dmin mn of a Q4_K block */
__device__ __forceinline__ void q4k_scales(const uint8_t *b, int s, float &dl, float &ml) {
    unsigned dm = *(const unsigned *)b;
    const unsigned *sw = (const unsigned *)(b + 4);
    int sc, mn;
    im_scale(sw[0], sw[1], sw[2], s, sc, mn);
    dl = __half2float(__ushort_as_half((unsigned short)dm)) * i2f(sc);
    ml = __half2float(__ushort_as_half((unsigned short)(dm >> 16))) * i2f(mn);
}

/* Q4_K blocks are 144 bytes, so with 16-byte aligned rows every field is word aligned: the unit's
 * 32 bytes of nibbles come in two 128-bit reads, and each value is one byte permute into a float */
template <> struct gq<SL_GGML_Q4_K> {
    static constexpr int BS = 256, BB = 144;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        float dl, ml;
        q4k_scales(b, s, dl, ml);
        const uint4 *qv = (const uint4 *)(b + 16 + 32 * (s >> 1));
        uint4 a = qv[0], c = qv[1];
        unsigned wq[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        int sh = 4 * (s & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            unsigned m = (wq[i] >> sh) & 0x0F0F0F0Fu;
#pragma unroll
            for (int k = 0; k < 4; k++) /* 2^23 + nibble, minus 2^23 */
                y[4 * i + k] = dl * (__uint_as_float(__byte_perm(m, 0x4B000000u, 0x7440 + k)) - 8388608.0f) - ml;
        }
    }
};

/* Q4_K for the GEMV, in affine form: unit value j is a * f_j - b * 1 with f_j = 1 + q_j / 128 built by
 * one byte permute (0x3F8q0000), so the dot is a * sum(f x) - b * sum(x): a = 128 dl, b = 128 dl + ml.
 * Rounding stays near fp32 (f carries q exactly; the sums lose about 8 ulp to the shared 1). */
__device__ __forceinline__ void q4k_affine(const uint8_t *b, int s, float *f, float *a, float *c) {
    float dl, ml;
    q4k_scales(b, s, dl, ml);
    *a = 128.0f * dl;
    *c = 128.0f * dl + ml;
    const uint4 *qv = (const uint4 *)(b + 16 + 32 * (s >> 1));
    uint4 u = qv[0], v = qv[1];
    unsigned wq[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
    int sh = 4 * (s & 1);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        unsigned m = ((wq[i] >> sh) & 0x0F0F0F0Fu) | 0x80808080u;
#pragma unroll
        for (int k = 0; k < 4; k++) f[4 * i + k] = __uint_as_float(__byte_perm(m, 0x3F000000u, 0x7044 + (k << 8)));
    }
}

template <> struct gq<SL_GGML_Q5_K> {
    static constexpr int BS = 256, BB = 176;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        int sc, mn;
        k4_scale_min(s, b + 4, &sc, &mn);
        float dl = f16at(b) * i2f(sc), ml = f16at(b + 2) * i2f(mn);
        const uint8_t *qh = b + 16, *ql = b + 48 + 32 * (s >> 1);
        int sh = 4 * (s & 1);
#pragma unroll
        for (int l = 0; l < 32; l++) y[l] = dl * i2f(((ql[l] >> sh) & 15) + ((qh[l] >> s) & 1 ? 16 : 0)) - ml;
    }
};

template <> struct gq<SL_GGML_Q6_K> {
    static constexpr int BS = 256, BB = 210;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        int half = s >> 2, quad = s & 3;
        const uint8_t *ql = b + 64 * half + 32 * (quad & 1), *qh = b + 128 + 32 * half;
        const signed char *sc = (const signed char *)(b + 192 + 8 * half + 2 * quad);
        float d = f16at(b + 208);
        int lsh = 4 * (quad >> 1), hsh = 2 * quad;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = (((ql[l] >> lsh) & 15) | (((qh[l] >> hsh) & 3) << 4)) - 32;
            y[l] = d * i2f(sc[l / 16]) * i2f(q);
        }
    }
};

template <> struct gq<SL_GGML_IQ4_XS> {
    static constexpr int BS = 256, BB = 136;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        unsigned sh = u16at(b + 2);
        int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | (((sh >> (2 * s)) & 3) << 4);
        float dl = f16at(b) * i2f(ls - 32);
        const uint8_t *qs = b + 8 + 16 * s;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            y[j] = dl * i2f(iq4nl(qs[j] & 15u));
            y[j + 16] = dl * i2f(iq4nl((unsigned)qs[j] >> 4));
        }
    }
};

template <> struct gq<SL_GGML_IQ2_XXS> {
    static constexpr int BS = 256, BB = 66;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        const uint8_t *q = b + 2 + 8 * s;
        unsigned sgn = u32at(q + 4);
        float db = f16at(b) * (0.5f + i2f(sgn >> 28)) * 0.25f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            uint64_t g = g_iq2xxs[q[l]];
            grid8(y + 8 * l, db, (unsigned)g, (unsigned)(g >> 32), iq_signs((sgn >> (7 * l)) & 127));
        }
    }
};

template <> struct gq<SL_GGML_IQ2_XS> {
    static constexpr int BS = 256, BB = 74;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        float d = f16at(b);
        unsigned sc = b[66 + s];
        float db0 = d * (0.5f + i2f(sc & 15)) * 0.25f, db1 = d * (0.5f + i2f(sc >> 4)) * 0.25f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            unsigned q = u16at(b + 2 + 2 * (4 * s + l));
            uint64_t g = g_iq2xs[q & 511];
            grid8(y + 8 * l, l < 2 ? db0 : db1, (unsigned)g, (unsigned)(g >> 32), iq_signs(q >> 9));
        }
    }
};

template <> struct gq<SL_GGML_IQ2_S> {
    static constexpr int BS = 256, BB = 82;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        float d = f16at(b);
        const uint8_t *qs = b + 2 + 4 * s, *signs = b + 34 + 4 * s;
        unsigned qh = b[66 + s], sc = b[74 + s];
        float db0 = d * (0.5f + i2f(sc & 15)) * 0.25f, db1 = d * (0.5f + i2f(sc >> 4)) * 0.25f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            uint64_t g = g_iq2s[qs[l] | ((qh << (8 - 2 * l)) & 0x300)];
            grid8(y + 8 * l, l < 2 ? db0 : db1, (unsigned)g, (unsigned)(g >> 32), signs[l]);
        }
    }
};

template <> struct gq<SL_GGML_IQ3_XXS> {
    static constexpr int BS = 256, BB = 98;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        const uint8_t *qs = b + 2 + 8 * s;
        unsigned aux = u32at(b + 66 + 4 * s);
        float db = f16at(b) * (0.5f + i2f(aux >> 28)) * 0.5f;
#pragma unroll
        for (int l = 0; l < 4; l++)
            grid8(y + 8 * l, db, g_iq3xxs[qs[2 * l]], g_iq3xxs[qs[2 * l + 1]], iq_signs((aux >> (7 * l)) & 127));
    }
};

template <> struct gq<SL_GGML_IQ3_S> {
    static constexpr int BS = 256, BB = 110;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        const uint8_t *qs = b + 2 + 8 * s, *signs = b + 74 + 4 * s;
        unsigned qh = b[66 + s];
        float db = f16at(b) * i2f(1 + 2 * ((b[106 + s / 2] >> (4 * (s % 2))) & 15));
#pragma unroll
        for (int l = 0; l < 4; l++)
            grid8(y + 8 * l, db, g_iq3s[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)],
                  g_iq3s[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)], signs[l]);
    }
};

template <> struct gq<SL_GGML_IQ1_S> {
    static constexpr int BS = 256, BB = 50;
    static __device__ __forceinline__ void unit(const uint8_t *b, int s, float *y) {
        const uint8_t *qs = b + 2 + 4 * s;
        unsigned qh = u16at(b + 34 + 2 * s);
        float dl = f16at(b) * i2f(2 * ((qh >> 12) & 7) + 1);
        float delta = qh & 0x8000 ? -0.125f : 0.125f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            uint64_t g = g_iq1s[qs[l] | (((qh >> (3 * l)) & 7) << 8)];
#pragma unroll
            for (int j = 0; j < 8; j++) y[8 * l + j] = dl * (i2f((signed char)(g >> (8 * j))) + delta);
        }
    }
};

/* Calls F::template run<T>() for the gq type of id t; returns 0 when the type has no CUDA kernels. */
template <class F> static int with_type(int t, F &f) {
    switch (t) {
#define GQ_CASE(T)                                                                                                     \
    case T: f.template run<T>(); return 1;
        GQ_CASE(SL_GGML_Q4_0)
        GQ_CASE(SL_GGML_Q4_1)
        GQ_CASE(SL_GGML_Q5_0)
        GQ_CASE(SL_GGML_Q5_1)
        GQ_CASE(SL_GGML_Q8_0)
        GQ_CASE(SL_GGML_Q2_K)
        GQ_CASE(SL_GGML_Q3_K)
        GQ_CASE(SL_GGML_Q4_K)
        GQ_CASE(SL_GGML_Q5_K)
        GQ_CASE(SL_GGML_Q6_K)
        GQ_CASE(SL_GGML_IQ2_XXS)
        GQ_CASE(SL_GGML_IQ2_XS)
        GQ_CASE(SL_GGML_IQ2_S)
        GQ_CASE(SL_GGML_IQ3_XXS)
        GQ_CASE(SL_GGML_IQ3_S)
        GQ_CASE(SL_GGML_IQ1_S)
        GQ_CASE(SL_GGML_IQ4_NL)
        GQ_CASE(SL_GGML_IQ4_XS)
        GQ_CASE(SL_GGML_MXFP4)
#undef GQ_CASE
    default: return 0;
    }
}

struct probe_f {
    template <int T> void run() {}
};

int cu_ggml_supported(int t) {
    probe_f f;
    return with_type(t, f);
}

/* ---- decode: fused dequantise-GEMV ---- */

#define GG_WARPS 4
#define GG_RPW 2 /* rows per warp: their loads are issued together */
#define GG_ROWS (GG_WARPS * GG_RPW)
#define GG_XSMEM 36864 /* bytes of staged input per block */
#define GG_VALS 1024   /* values a warp decodes per row and step: 32 lanes x 32 */

/* bytes staged per row and step: the blocks of GG_VALS values plus the misalignment of their start */
template <int T> __host__ __device__ constexpr int gg_span() {
    return (GG_VALS / gq<T>::BS * gq<T>::BB + 15) / 16 * 16 + 16;
}

__device__ __forceinline__ int gpad(int j) {
    return j + (j >> 5) * 4; /* as the other GEMV kernels: 4 floats of padding every 32 */
}

/* y[slot][t][rows] = W(slot) . x[slot / x_div][t], as gemv_k in cuda_matmul.cu (same grid and
 * arguments): table entries give the weight per slot, grid z picks weight `which + z`, and with act the
 * input is the SwiGLU silu(x) * x[act_off + ...]. */
template <int NT, int T>
__global__ void __launch_bounds__(GG_WARPS * 32, NT == 1 ? 6 : 1) /* one token: at most 80 registers */
    ggml_gemv_k(cu_w w0, const cu_expert *table, const int32_t *ids, int which, int x_div, const float *x, long long xs,
                int n, float *y, long long ys, long long yz, int act, long long act_off, int chunk) {
    constexpr int BS = gq<T>::BS, BB = gq<T>::BB, SPAN = gg_span<T>();
    constexpr int NL = (SPAN / 16 + 31) / 32; /* 128-bit loads per lane and row for one step */
    extern __shared__ float4 smem4[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t *stage = (uint8_t *)smem4 + warp * GG_RPW * SPAN;
    float *sx = (float *)((uint8_t *)smem4 + GG_ROWS * SPAN);
    int slot = blockIdx.y;
    int row0 = blockIdx.x * GG_ROWS + warp * GG_RPW;
    /* the next step's weight bytes, in flight in registers while the current step is computed */
    uint4 pre[GG_RPW][NL];
    int off[GG_RPW], nld[GG_RPW];
    auto issue = [&](const cu_w &w, int col) {
        int nbytes = min(GG_VALS, w.cols - col) / BS * BB;
#pragma unroll
        for (int rr = 0; rr < GG_RPW; rr++) {
            int r = min(row0 + rr, w.rows - 1);
            const uint8_t *src = w.data + (long long)r * w.row_bytes + (long long)col / BS * BB;
            const uint4 *a = (const uint4 *)((uintptr_t)src & ~(uintptr_t)15);
            off[rr] = (int)(src - (const uint8_t *)a);
            nld[rr] = (off[rr] + nbytes + 15) >> 4;
#pragma unroll
            for (int i = 0; i < NL; i++)
                if (lane + 32 * i < nld[rr]) pre[rr][i] = __ldg(a + lane + 32 * i);
        }
    };
    cu_w w = w0;
    int live = row0 < w0.rows;       /* warps past the last row still join the block's barriers */
    if (!table && live) issue(w, 0); /* weights do not depend on the previous kernel */
    cu_pdl_enter();
    if (table) {
        if (ids[slot] < 0) return; /* a pair another pass computes (see moe_pairs) */
        w = table[ids[slot]].w[which + blockIdx.z];
        if ((int)blockIdx.x * GG_ROWS >= w.rows) return; /* experts of a table share their shape */
        live = row0 < w.rows;
        if (live) issue(w, 0);
    }
    x += (long long)(slot / x_div) * xs;
    y += (long long)slot * ys + (long long)blockIdx.z * yz;
    float acc[GG_RPW][NT];
#pragma unroll
    for (int rr = 0; rr < GG_RPW; rr++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[rr][t] = 0;
    int padw = gpad(chunk);
    /* chunk is a multiple of GG_VALS, so steps never straddle two staged chunks */
    for (int col = 0; col < w.cols; col += GG_VALS) {
        int c0 = col / chunk * chunk;
        if (col == c0) {
            int cl = min(chunk, w.cols - c0);
            __syncthreads();
            for (int t = 0; t < n; t++) {
                const float *xt = x + (long long)t * w.cols + c0;
                float *st = sx + t * padw;
                if (act) {
                    for (int j = threadIdx.x; j < cl; j += blockDim.x) {
                        float g = xt[j];
                        st[gpad(j)] = g * cu_sigmoid(g) * xt[act_off + j];
                    }
                } else { /* cols are whole blocks of 32: float4 loads stay inside a padded run */
                    for (int j = threadIdx.x * 4; j < cl; j += blockDim.x * 4)
                        *(float4 *)(st + gpad(j)) = *(const float4 *)(xt + j);
                }
            }
            __syncthreads();
        }
        if (!live) continue;
        int cur[GG_RPW];
#pragma unroll
        for (int rr = 0; rr < GG_RPW; rr++) {
            uint4 *dst = (uint4 *)(stage + rr * SPAN);
#pragma unroll
            for (int i = 0; i < NL; i++)
                if (lane + 32 * i < nld[rr]) dst[lane + 32 * i] = pre[rr][i];
            cur[rr] = off[rr];
        }
        __syncwarp();
        if (col + GG_VALS < w.cols) issue(w, col + GG_VALS);
        int v = lane * 32, nv = min(GG_VALS, w.cols - col);
        if (v < nv) {
            /* both rows decoded first, so each token's input is read from shared memory once */
            float wv[GG_RPW][32], ka[GG_RPW], kb[GG_RPW];
#pragma unroll
            for (int rr = 0; rr < GG_RPW; rr++) {
                const uint8_t *blk = stage + rr * SPAN + cur[rr] + v / BS * BB;
                if constexpr (T == SL_GGML_Q4_K)
                    q4k_affine(blk, (v % BS) >> 5, wv[rr], &ka[rr], &kb[rr]);
                else
                    gq<T>::unit(blk, (v % BS) >> 5, wv[rr]);
            }
            const float *xu = sx + gpad(col - c0 + v);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const float4 *xv = (const float4 *)(xu + t * padw);
                float s0[GG_RPW], s1[GG_RPW], xs0 = 0, xs1 = 0;
#pragma unroll
                for (int rr = 0; rr < GG_RPW; rr++) s0[rr] = s1[rr] = 0;
#pragma unroll
                for (int i = 0; i < 8; i += 2) {
                    float4 p = xv[i], q = xv[i + 1];
                    if constexpr (T == SL_GGML_Q4_K) {
                        xs0 += (p.x + p.y) + (p.z + p.w);
                        xs1 += (q.x + q.y) + (q.z + q.w);
                    }
#pragma unroll
                    for (int rr = 0; rr < GG_RPW; rr++) {
                        const float *wr = wv[rr] + 4 * i;
                        s0[rr] += wr[0] * p.x + wr[1] * p.y + wr[2] * p.z + wr[3] * p.w;
                        s1[rr] += wr[4] * q.x + wr[5] * q.y + wr[6] * q.z + wr[7] * q.w;
                    }
                }
#pragma unroll
                for (int rr = 0; rr < GG_RPW; rr++) {
                    if constexpr (T == SL_GGML_Q4_K)
                        acc[rr][t] += ka[rr] * (s0[rr] + s1[rr]) - kb[rr] * (xs0 + xs1);
                    else
                        acc[rr][t] += s0[rr] + s1[rr];
                }
            }
        }
        __syncwarp();
    }
    if (!live) return;
#pragma unroll
    for (int rr = 0; rr < GG_RPW; rr++) {
        int r = row0 + rr;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = warp_sum(acc[rr][t]);
            if (lane == 0 && t < n && r < w.rows) y[(long long)t * w.rows + r] = v + (w.bias ? w.bias[r] : 0.0f);
        }
    }
}

struct gemv_f {
    cu_impl *c;
    const gg_call *g;
    const float *x;
    int n;
    float *y;
    template <int NT, int T> void go() {
        constexpr int SPAN = gg_span<T>();
        int chunk = (int)(GG_XSMEM / (NT * 4 * 9 / 8)) / GG_VALS * GG_VALS;
        if (chunk < GG_VALS) chunk = GG_VALS;
        if (chunk > g->w->cols) chunk = (g->w->cols + GG_VALS - 1) / GG_VALS * GG_VALS;
        size_t smem = (size_t)GG_ROWS * SPAN + (size_t)NT * (size_t)(chunk + chunk / 32 * 4) * sizeof(float);
        dim3 grid(CU_BLOCKS(g->w->rows, GG_ROWS), (unsigned)g->slots, (unsigned)g->nz);
        cu_launch(c, ggml_gemv_k<NT, T>, grid, GG_WARPS * 32, smem, *g->w, g->table, g->ids, g->which, g->x_div, x,
                  g->x_stride, n, y, g->y_stride, g->yz, g->act, g->act_off, chunk);
    }
    template <int T> void run() {
        if (n == 1)
            go<1, T>();
        else if (n == 2)
            go<2, T>();
        else if (n <= 4)
            go<4, T>();
        else
            go<8, T>();
    }
};

void cu_ggml_gemv(cu_impl *c, const gg_call &g, int n) {
    for (int t0 = 0; t0 < n; t0 += 8) { /* up to 8 tokens per weight pass */
        gemv_f f = {c, &g, g.x + (long long)t0 * g.w->cols, n - t0 < 8 ? n - t0 : 8, g.y + (long long)t0 * g.w->rows};
        if (!with_type(g.w->gtype, f)) {
            cu_fail(c, "GGML type %s has no CUDA kernel", sl_ggml_type_name(g.w->gtype));
            return;
        }
    }
    cu_check_launch(c, "GGML matrix-vector kernel");
}

/* ---- prefill and embedding: decoded units ---- */

/* one thread per unit of 32 values: hi = bf16(v), lo = bf16(v - hi) */
template <int T> __global__ void ggml_dequant_k(cu_w w, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    constexpr int BS = gq<T>::BS, BB = gq<T>::BB;
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, upr = w.cols / 32;
    if (i >= (long long)w.rows * upr) return;
    long long r = i / upr, v = (i % upr) * 32;
    float wv[32];
    gq<T>::unit(w.data + r * w.row_bytes + v / BS * BB, (int)(v % BS) >> 5, wv);
    __align__(16) __nv_bfloat16 h[32], l[32];
#pragma unroll
    for (int j = 0; j < 32; j++) {
        h[j] = __float2bfloat16(wv[j]);
        l[j] = __float2bfloat16(wv[j] - __bfloat162float(h[j]));
    }
    uint4 *ph = (uint4 *)(hi + i * 32), *pl = (uint4 *)(lo + i * 32);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        ph[q] = ((const uint4 *)h)[q];
        if (lo) pl[q] = ((const uint4 *)l)[q];
    }
}

struct dequant_f {
    cu_impl *c;
    const cu_w *w;
    __nv_bfloat16 *hi, *lo;
    template <int T> void run() {
        long long units = (long long)w->rows * (w->cols / 32);
        cu_launch(c, ggml_dequant_k<T>, CU_BLOCKS(units, 128), 128, 0, *w, hi, lo);
    }
};

void cu_ggml_dequant_split(cu_impl *c, const cu_w *w, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    dequant_f f = {c, w, hi, lo};
    if (!with_type(w->gtype, f)) cu_fail(c, "GGML type %s has no CUDA kernel", sl_ggml_type_name(w->gtype));
}

template <int T> __global__ void ggml_embed_k(cu_w w, const int32_t *ids, const int32_t *step_tok, float *out) {
    constexpr int BS = gq<T>::BS, BB = gq<T>::BB;
    cu_pdl_enter();
    int i = blockIdx.y, v = (blockIdx.x * blockDim.x + threadIdx.x) * 32;
    if (v >= w.cols) return;
    long long id = step_tok ? step_tok[i] : ids[i];
    float wv[32];
    gq<T>::unit(w.data + id * w.row_bytes + v / BS * BB, (v % BS) >> 5, wv);
    float4 *o = (float4 *)(out + (long long)i * w.cols + v);
#pragma unroll
    for (int q = 0; q < 8; q++) o[q] = make_float4(wv[4 * q], wv[4 * q + 1], wv[4 * q + 2], wv[4 * q + 3]);
}

struct embed_f {
    cu_impl *c;
    const cu_w *w;
    const int32_t *ids, *step_tok;
    int n;
    float *out;
    template <int T> void run() {
        dim3 grid(CU_BLOCKS(w->cols / 32, 64), (unsigned)n);
        cu_launch(c, ggml_embed_k<T>, grid, 64, 0, *w, ids, step_tok, out);
    }
};

void cu_ggml_embed(cu_impl *c, const cu_w *w, const int32_t *ids, const int32_t *step_tok, int n, float *out) {
    embed_f f = {c, w, ids, step_tok, n, out};
    if (!with_type(w->gtype, f)) cu_fail(c, "GGML type %s has no CUDA kernel", sl_ggml_type_name(w->gtype));
}

/* ---- small batches (a few to 64 tokens): tensor-core products straight from the blocks ----
 *
 * Decoding many sequences multiplies each weight by a handful of tokens: the GEMV's time grows with every
 * token, and dequantising the whole matrix for a GEMM costs more than reading it. Here each warp owns 16
 * rows; per step of 256 columns it copies their blocks' bytes into shared memory (cp.async, one step
 * ahead, as the block stages the input's tile beside them), decodes them in registers straight into
 * tensor-core fragments (bf16, the rounding of the one-pass bf16 GEMM) and multiplies them by every token
 * (mma m16n8k16, fp32 accumulation): each weight byte is read once for all tokens.
 *
 * Fragments want values at columns 2t, 2t+1, 2t+8, 2t+9 of each 16-column slice, while a lane decodes
 * whole units of 32 consecutive values. A sum does not depend on the order of its columns, so the input
 * is permuted once per call instead (mq_logical): lane t's units t and t + 4 of a step fill its fragment
 * columns of slices 0-7 and 8-15, four values a slice. When the row tiles are too few to fill the GPU, the
 * columns are split between blocks and the splits' partial sums added in a fixed order, so results do not
 * depend on timing. */

#define MQ_WARPS 8
#define MQ_ROWS (MQ_WARPS * 16)
#define MQ_KC 256         /* columns per step: 8 units of 32 */
#define MQ_LD (MQ_KC + 8) /* input tile pitch in bf16: 528 bytes, an odd number of 16-byte chunks, so */
                          /* the eight rows ldmatrix reads at once fall in different banks */

/* the column within its step where physical column p (0..255) of a step is multiplied */
__host__ __device__ __forceinline__ int mq_logical(int p) {
    int u = p >> 5, v = p & 31, e = v & 3;
    return 16 * (8 * (u >> 2) + (v >> 2)) + 2 * (u & 3) + (e < 2 ? e : e + 6);
}

/* bytes of one row's blocks in a step, and the shared memory that holds them from a 16-byte boundary */
template <int T> __host__ __device__ constexpr int mq_rb() {
    return MQ_KC / gq<T>::BS * gq<T>::BB;
}
template <int T> __host__ __device__ constexpr int mq_span() {
    return (mq_rb<T>() + 30) / 16 * 16;
}
template <int T, int NT8> __host__ __device__ constexpr int mq_stage() { /* one of the two buffers */
    return MQ_ROWS * mq_span<T>() + NT8 * 8 * MQ_LD * 2;
}

__device__ __forceinline__ void mq_cp16(void *dst, const void *src, int bytes) {
    unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void mq_commit() {
    asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void mq_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
/* Double-buffered steps of MQ_KC columns: before step kc's arithmetic (buffer b), the next step's copies are
 * issued into the other buffer (issue(kc', b')) and step kc's awaited, then the block meets. */
template <class F> __device__ __forceinline__ void mq_next_step(F &issue, int kc, int k1, int b) {
    if (kc + MQ_KC < k1) {
        issue(kc + MQ_KC, b ^ 1);
        mq_wait<1>();
    } else {
        mq_wait<0>();
    }
    __syncthreads();
}
__device__ __forceinline__ void mq_ldsm2(uint32_t *r, const void *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
__device__ __forceinline__ uint32_t mq_pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&h;
}

/* the bf16 halves of a and b (hi) and of what they leave (lo): hi + lo carries 16 bits of each */
__device__ __forceinline__ void mq_split(float a, float b, uint32_t &hi, uint32_t &lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    hi = *(uint32_t *)&h;
    lo = mq_pack(a - __low2float(h), b - __high2float(h));
}

/* xp[t][c] = bf16(x[t][c']) with the columns of every step of 256 in mq_logical order, zero past cols;
 * with u, of silu(x) u (an expert's SwiGLU); with xpl, xpl gets what bf16 leaves of each value. One thread
 * per 4 columns. */
__global__ void ggml_mmq_input_k(const float *x, const float *u, int n, int cols, int colsp, __nv_bfloat16 *xp,
                                 __nv_bfloat16 *xpl) {
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n * (colsp / 4)) return;
    int t = (int)(i / (colsp / 4)), c = (int)(i % (colsp / 4)) * 4;
    float4 v = make_float4(0, 0, 0, 0);
    if (c < cols) {
        v = *(const float4 *)(x + (long long)t * cols + c);
        if (u) {
            float4 w = *(const float4 *)(u + (long long)t * cols + c);
            v = make_float4(v.x * cu_sigmoid(v.x) * w.x, v.y * cu_sigmoid(v.y) * w.y, v.z * cu_sigmoid(v.z) * w.z,
                            v.w * cu_sigmoid(v.w) * w.w);
        }
    }
    long long base = (long long)t * colsp + (c & ~(MQ_KC - 1));
    int l = mq_logical(c & (MQ_KC - 1));
    uint32_t h0, l0, h1, l1;
    mq_split(v.x, v.y, h0, l0);
    mq_split(v.z, v.w, h1, l1);
    *(uint32_t *)(xp + base + l) = h0;
    *(uint32_t *)(xp + base + l + 8) = h1;
    if (xpl) {
        *(uint32_t *)(xpl + base + l) = l0;
        *(uint32_t *)(xpl + base + l + 8) = l1;
    }
}

/* Plain launches: further weights of the first one's type and width (q, k and v), their row tiles after its
 * own: block row x belongs to the last weight k with tbeg[k] <= x (the first weight's from 0) */
struct mq_more {
    cu_w w[SL_MATMUL_MULTI - 1];
    float *y[SL_MATMUL_MULTI - 1], *part[SL_MATMUL_MULTI - 1];
    int tbeg[SL_MATMUL_MULTI - 1];
    int n;
};

/* What a launch multiplies. Plain: weight w by tokens 0..n-1 of xp into rows 0..n-1 of y (or, with column
 * splits, of the split's partial sums). Grouped (units set): block row y takes unit y of the routed pairs
 * grouped by expert (expert, first index into pairs, count <= NT8 * 8; units past *count do nothing); its
 * pairs p read row p / x_div of xp and write row p of y + z * yz, with weight which + z of the expert. */
struct mmq_args {
    cu_w w;
    const cu_expert *table;
    const int4 *units;
    const int *pairs, *count;
    int which, x_div;
    const __nv_bfloat16 *xp, *xpl; /* the input, and with EX what bf16 leaves of it */
    int colsp, n, kper;
    float *y, *part;
    long long yz;
    mq_more more;
};

/* The block's share of a launch (mmq_args or imma_args): grouped, unit blockIdx.y of the routed pairs
 * (its expert's weight which + blockIdx.z, its pairs' input rows p / x_div and output rows p, all columns);
 * plain, tokens 0..n-1 and column split blockIdx.y. Returns 0 for a unit past the count (the whole block
 * leaves). The caller synchronises before reading rin and rout. */
template <int NTOK, class A>
__device__ __forceinline__ int mq_block(const A &a, cu_w &w, int &n, int &k0, int &k1, int *rin, int *rout,
                                       int &row0, float *&y, float *&part) {
    w = a.w;
    n = a.n;
    y = a.y;
    part = a.part;
    row0 = blockIdx.x * MQ_ROWS;
    if (a.units) {
        int u = blockIdx.y;
        if (u >= *a.count) return 0;
        int4 un = a.units[u];
        w = a.table[un.x].w[a.which + blockIdx.z];
        n = un.z;
        for (int i = threadIdx.x; i < NTOK; i += blockDim.x) {
            int p = a.pairs[un.y + min(i, n - 1)];
            rin[i] = p / a.x_div;
            rout[i] = p;
        }
        k0 = 0;
        k1 = w.cols;
    } else {
        int t0 = 0;
        for (int k = 0; k < a.more.n; k++)
            if ((int)blockIdx.x >= a.more.tbeg[k]) {
                w = a.more.w[k];
                y = a.more.y[k];
                part = a.more.part[k];
                t0 = a.more.tbeg[k];
            }
        row0 = ((int)blockIdx.x - t0) * MQ_ROWS;
        for (int i = threadIdx.x; i < NTOK; i += blockDim.x) rin[i] = rout[i] = min(i, n - 1);
        k0 = blockIdx.y * a.kper;
        k1 = min(k0 + a.kper, w.cols);
    }
    return 1;
}

/* The warp's 16 rows' blocks of step kc (columns kc .. kc + MQ_KC, up to k1) into raw, SPAN bytes a row from
 * the 16-byte boundary below each row's first block (cp.async; the caller commits) */
template <int T>
__device__ __forceinline__ void mq_rows_async(uint8_t *raw, const cu_w &w, int wrow0, int kc, int k1, int lane) {
    constexpr int BS = gq<T>::BS, BB = gq<T>::BB, RB = mq_rb<T>(), SPAN = mq_span<T>(), NC = SPAN / 16;
    int rb = min(RB, (k1 - kc) / BS * BB);
    for (int i = lane; i < 16 * NC; i += 32) {
        int r = i / NC, ch = i % NC, row = min(wrow0 + r, w.rows - 1);
        const uint8_t *src = w.data + (long long)row * w.row_bytes + (long long)(kc / BS) * BB;
        const uint8_t *p = (const uint8_t *)((uintptr_t)src & ~(uintptr_t)15);
        if (16 * ch < (int)(src - p) + rb) mq_cp16(raw + r * SPAN + 16 * ch, p + 16 * ch, 16);
    }
}

/* acc[j]: rows g and g + 8 of the warp's 16 (from wrow0), tokens 2 t4 and the next of tile j, into the
 * launch's output rows rout (or the column split's partial sums); the bias where the sums are whole */
template <int NT8, class A>
__device__ __forceinline__ void mq_store(const A &a, const cu_w &w, int n, int wrow0, const int *rout,
                                         const float (*acc)[4], float *y, float *part) {
    int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    bool whole = a.units || gridDim.y == 1; /* no partial sums: the bias goes in here */
    float *out = a.units ? y + blockIdx.z * a.yz : gridDim.y == 1 ? y : part + (long long)blockIdx.y * n * w.rows;
#pragma unroll
    for (int j = 0; j < NT8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = wrow0 + g + (e >> 1) * 8, tok = j * 8 + 2 * t4 + (e & 1);
            if (r < w.rows && tok < n)
                out[(long long)rout[tok] * w.rows + r] = acc[j][e] + (whole && w.bias ? w.bias[r] : 0.0f);
        }
}

/* four bytes at a 2-byte aligned address in shared memory */
__device__ __forceinline__ uint32_t im_ld4(const uint8_t *p) {
    const unsigned short *h = (const unsigned short *)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

/* The tile kernel's decode of unit s of block b, four values (4 q .. 4 q + 3) at a time. Generic: the whole
 * unit by gq first (32 registers). Q4_K (one bf16 pass) and Q6_K decode each four when they are multiplied,
 * in affine form, value = a f - c with f = 1 + q / 128 made by one byte permute: a permute and an FMA a value
 * (the float of a code and its scaling took three to ten instructions, Q6_K reading each byte on its own), and
 * few registers, so that three blocks fit a SM (mq_blocks). Q6_K gives the same bits as gq's d sc q (a = 128
 * d sc and c = 160 d sc are exact, so the FMA rounds the exact value once); Q4_K's c = 128 dl + ml is rounded
 * once, within 2^-17 dl, far under the bf16 rounding that follows. A unit past the columns (live 0) is 0. */
template <int T, int EX> struct mq_dec {
    float v[32];
    __device__ __forceinline__ void prep(const uint8_t *b, int s, bool, bool live) {
        if (live) {
            gq<T>::unit(b, s, v);
        } else {
#pragma unroll
            for (int q = 0; q < 32; q++) v[q] = 0.0f;
        }
    }
    __device__ __forceinline__ void four(int q, float *o) const {
#pragma unroll
        for (int e = 0; e < 4; e++) o[e] = v[4 * q + e];
    }
};
template <> struct mq_dec<SL_GGML_Q4_K, 0> {
    float a, c;
    const uint8_t *qs;
    int sh;
    __device__ __forceinline__ void prep(const uint8_t *b, int s, bool, bool live) {
        float dl, ml;
        q4k_scales(b, s, dl, ml);
        a = live ? 128.0f * dl : 0.0f;
        c = live ? 128.0f * dl + ml : 0.0f;
        qs = b + 16 + 32 * (s >> 1);
        sh = 4 * (s & 1);
    }
    __device__ __forceinline__ void four(int q, float *o) const {
        unsigned m = ((*(const unsigned *)(qs + 4 * q) >> sh) & 0x0F0F0F0Fu) | 0x80808080u;
#pragma unroll
        for (int e = 0; e < 4; e++) o[e] = fmaf(a, __uint_as_float(__byte_perm(m, 0x3F000000u, 0x7044 + (e << 8))), -c);
    }
};
template <> struct mq_dec<SL_GGML_Q6_K, 0> { /* either mode: the values are exact before their one rounding */
    float a[2], c[2]; /* values 16 h .. 16 h + 15 share scale byte h */
    const uint8_t *ql, *qh;
    int lsh, hsh;
    bool al2;
    __device__ __forceinline__ void prep(const uint8_t *b, int s, bool al, bool live) {
        int half = s >> 2, quad = s & 3;
        ql = b + 64 * half + 32 * (quad & 1);
        qh = b + 128 + 32 * half;
        lsh = 4 * (quad >> 1);
        hsh = 2 * quad;
        al2 = al;
        float d = f16at(b + 208);
        const signed char *sc = (const signed char *)(b + 192 + 8 * half + 2 * quad);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float ds = live ? d * i2f(sc[h]) : 0.0f;
            a[h] = 128.0f * ds;
            c[h] = 160.0f * ds;
        }
    }
    __device__ __forceinline__ void four(int q, float *o) const {
        int h = q >> 2, k = q & 3; /* 2-byte aligned blocks: two 16-bit reads a word, else four bytes */
        uint32_t lo = al2 ? im_ld4(ql + 16 * h + 4 * k) : u32at(ql + 16 * h + 4 * k);
        uint32_t hi = al2 ? im_ld4(qh + 16 * h + 4 * k) : u32at(qh + 16 * h + 4 * k);
        uint32_t m = ((lo >> lsh) & 0x0F0F0F0Fu) | (((hi >> hsh) & 0x03030303u) << 4) | 0x80808080u;
#pragma unroll
        for (int e = 0; e < 4; e++)
            o[e] = fmaf(a[h], __uint_as_float(__byte_perm(m, 0x3F000000u, 0x7044 + (e << 8))), -c[h]);
    }
};
template <> struct mq_dec<SL_GGML_Q6_K, 1> : mq_dec<SL_GGML_Q6_K, 0> {};

/* blocks a SM of the tile kernel: three for Q4_K's one-pass tiles of up to 16 tokens (its lazy decoder's few
 * registers and 57 KB of shared memory allow it; Q6_K's wider rows take 77 KB), else two */
__host__ __device__ constexpr int mq_blocks(int t, int nt8, int ex) {
    return t == SL_GGML_Q4_K && !ex && nt8 <= 2 ? 3 : 2;
}

/* EX: operands in bf16 halves, hi.hi + hi.lo + lo.hi summed in fp32 (near-fp32 products, for the weights
 * marked exact, as the split GEMM); else one bf16 pass. FULL (plain launches): every token tile is multiplied,
 * those past n on whatever the shared memory holds, into output columns that are never stored (a product's
 * column depends on its input column alone); without the test per product that a group's few pairs need, a
 * 64-sequence llama3-8b Q4_K step ran 17 % faster (4,843 / 4,908 against 4,167 / 4,170 tok/s, H200). */
template <int T, int NT8, int EX, int FULL>
__global__ void __launch_bounds__(MQ_WARPS * 32, mq_blocks(T, NT8, EX)) ggml_mmq_k(mmq_args a) {
    constexpr int BS = gq<T>::BS, BB = gq<T>::BB, SPAN = mq_span<T>();
    constexpr int STAGE = mq_stage<T, NT8 *(EX ? 2 : 1)>(), XT = NT8 * 8 * MQ_LD; /* one input tile */
    extern __shared__ float4 smem4[];
    __shared__ int rin[NT8 * 8], rout[NT8 * 8];
    uint8_t *sm = (uint8_t *)smem4;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    cu_w w;
    int n, k0, k1;
    cu_pdl_enter();
    int row0;
    float *y, *part;
    if (!mq_block<NT8 * 8>(a, w, n, k0, k1, rin, rout, row0, y, part)) return;
    __syncthreads();
    int wrow0 = row0 + warp * 16;
    bool al2 = !(((uintptr_t)w.data | (uintptr_t)w.row_bytes) & 1);
    /* step kc into buffer b: the warp's 16 rows' bytes, and the block's input tile(s) */
    auto issue = [&](int kc, int b) {
        mq_rows_async<T>(sm + b * STAGE + warp * 16 * SPAN, w, wrow0, kc, k1, lane);
        __nv_bfloat16 *xs = (__nv_bfloat16 *)(sm + b * STAGE + MQ_ROWS * SPAN);
        for (int i = threadIdx.x; i < NT8 * 8 * (MQ_KC / 8) * (EX ? 2 : 1); i += MQ_WARPS * 32) {
            int half = i / (NT8 * 8 * (MQ_KC / 8)), j = i % (NT8 * 8 * (MQ_KC / 8));
            int tok = j / (MQ_KC / 8), ch = j % (MQ_KC / 8);
            if (tok >= n) continue; /* its products land in output columns that are not written */
            const __nv_bfloat16 *src = (half ? a.xpl : a.xp) + (long long)rin[tok] * a.colsp + kc + 8 * ch;
            mq_cp16(xs + half * XT + tok * MQ_LD + 8 * ch, src, 16);
        }
        mq_commit();
    };
    float acc[NT8][4];
#pragma unroll
    for (int j = 0; j < NT8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0;
    if (k0 < k1) issue(k0, 0);
    for (int kc = k0, b = 0; kc < k1; kc += MQ_KC, b ^= 1) {
        mq_next_step(issue, kc, k1, b);
        const uint8_t *raw = sm + b * STAGE + warp * 16 * SPAN;
        const __nv_bfloat16 *xs = (const __nv_bfloat16 *)(sm + b * STAGE + MQ_ROWS * SPAN);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            /* unit t4 + 4 i of the step, rows g and g + 8 of the warp's tile */
            int u = t4 + 4 * i, col = kc + 32 * u;
            mq_dec<T, EX> dec[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                /* a unit past the columns decodes (clamped) bytes of its row to zeros */
                int row = min(wrow0 + g + 8 * h, w.rows - 1);
                const uint8_t *src = w.data + (long long)row * w.row_bytes + (long long)(kc / BS) * BB;
                int off = (int)((uintptr_t)src & 15);
                dec[h].prep(raw + (g + 8 * h) * SPAN + off + (32 * u / BS) * BB, (32 * u % BS) >> 5, al2, col < k1);
            }
#pragma unroll
            for (int q = 0; q < 8; q++) {
                int ks = 8 * i + q;
                float vg[4], vh[4];
                dec[0].four(q, vg);
                dec[1].four(q, vh);
                uint32_t ah[4], al[4];
                if (EX) {
                    mq_split(vg[0], vg[1], ah[0], al[0]);
                    mq_split(vh[0], vh[1], ah[1], al[1]);
                    mq_split(vg[2], vg[3], ah[2], al[2]);
                    mq_split(vh[2], vh[3], ah[3], al[3]);
                } else {
                    ah[0] = mq_pack(vg[0], vg[1]);
                    ah[1] = mq_pack(vh[0], vh[1]);
                    ah[2] = mq_pack(vg[2], vg[3]);
                    ah[3] = mq_pack(vh[2], vh[3]);
                }
#pragma unroll
                for (int j = 0; j < NT8; j++) {
                    if (!FULL && j * 8 >= n) break; /* a group of few pairs: only its token tiles */
                    uint32_t bb[2];
                    const __nv_bfloat16 *xr = xs + (j * 8 + (lane & 7)) * MQ_LD + ks * 16 + ((lane >> 3) & 1) * 8;
                    mq_ldsm2(bb, xr);
                    cu_mma_bf16(acc[j], ah, bb);
                    if (EX) {
                        uint32_t bl[2];
                        mq_ldsm2(bl, xr + XT);
                        cu_mma_bf16(acc[j], ah, bl);
                        cu_mma_bf16(acc[j], al, bb);
                    }
                }
            }
        }
        __syncthreads(); /* buffer b is refilled by the next step's issue */
    }
    mq_store<NT8>(a, w, n, wrow0, rout, acc, y, part);
}

/* ---- Q4_K, Q6_K and Q8_0 on integer tensor cores ----
 *
 * The same tiles as ggml_mmq_k, with the input in q16 (value = d (256 h + l) per 32, see cuda_mmvq.cu)
 * instead of bf16: a lane's four consecutive nibbles of a sub-block are four bytes of an A fragment of
 * mma m16n8k32 as they lie (one mask), the input's high and low byte planes are two B fragments, and the
 * two integer products give each sub-block's exact sum of weight codes times the 16-bit input. Per
 * sub-block, row and token the scales apply in fp32: d sc xd (256 H + L) - dmin mn M, M = xd S the input's
 * scaled integer sum, which its quantizer makes (a token's scale and sum are two loads per sub-block that
 * serve both rows; reading the integer sums here was three, with bank conflicts between the tokens). Near
 * fp32 (the input within 2^-16 of its block's largest value), and no per-value float decode. */
#define IM_LDX 272 /* bytes per token row of an input plane in shared memory: 8 tokens' B loads miss no bank */
/* floats per token row of the input's scales in shared memory: d per 32 (8), m = d times the integer sum per
 * 16 (16), padding so that the four tokens 2 t4 + q of a load fall in different banks */
#define IM_XS 28

template <int T, int NT8> __host__ __device__ constexpr int im_stage() { /* one of the two buffers */
    return MQ_ROWS * mq_span<T>() + NT8 * 8 * (2 * IM_LDX + IM_XS * 4);
}

/* as mmq_args, with the input in q16 rows of cols values */
struct imma_args {
    cu_w w;
    const cu_expert *table;
    const int4 *units;
    const int *pairs, *count;
    int which, x_div;
    cu_q16 x;
    int cols, n, kper;
    float *y, *part;
    long long yz;
    mq_more more;
};

/* k = 16: two A registers, one B */
__device__ __forceinline__ void im_mma16(int *c, const uint32_t *a, uint32_t b, bool sgn) {
    if (sgn)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b));
}

/* k = 32: A unsigned (Q4_K, Q6_K codes) or, with AS, signed bytes (Q8_0); B signed (the input's high bytes)
 * or unsigned (its low bytes) */
#define IM_MMA32(AT, BT)                                                                                            \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." AT "." BT ".s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "  \
                 "{%0,%1,%2,%3};"                                                                                  \
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
template <bool AS = false>
__device__ __forceinline__ void im_mma(int *c, const uint32_t *a, const uint32_t *b, bool sgn) {
    if (AS && sgn)
        IM_MMA32("s8", "s8");
    else if (AS)
        IM_MMA32("s8", "u8");
    else if (sgn)
        IM_MMA32("u8", "s8");
    else
        IM_MMA32("u8", "u8");
}
#undef IM_MMA32

/* One step (a block of 256 per row) of Q4_K: rows g and g + 8 of the warp's tile in blk[0], blk[1] */
template <int NT8>
__device__ __forceinline__ void im_q4k_step(const uint8_t *const *blk, const uint8_t *xh, const uint8_t *xl,
                                            const float *xdm, int n, int g, int t4, float (*acc)[4]) {
        float d[2], dmin[2];
        unsigned sw[2][3];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const unsigned *hw = (const unsigned *)blk[h];
            unsigned dm = hw[0];
            d[h] = __half2float(__ushort_as_half((unsigned short)dm));
            dmin[h] = __half2float(__ushort_as_half((unsigned short)(dm >> 16)));
            sw[h][0] = hw[1];
            sw[h][1] = hw[2];
            sw[h][2] = hw[3];
        }
#pragma unroll
        for (int sb = 0; sb < 8; sb++) {
            int p = sb >> 1, sh = 4 * (sb & 1);
            uint32_t af[4];
#pragma unroll
            for (int q = 0; q < 4; q++) { /* rows g (q even) and g + 8, bytes 4 t4 and 16 + 4 t4 of the pair */
                uint32_t v = *(const uint32_t *)(blk[q & 1] + 16 + 32 * p + 16 * (q >> 1) + 4 * t4);
                af[q] = (v >> sh) & 0x0F0F0F0Fu;
            }
            float ds[2], dn[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int sc, mn;
                im_scale(sw[h][0], sw[h][1], sw[h][2], sb, sc, mn);
                ds[h] = d[h] * (float)sc;
                dn[h] = dmin[h] * (float)mn;
            }
#pragma unroll
            for (int j = 0; j < NT8; j++) {
                if (j * 8 >= n) break; /* a group of few pairs: only its token tiles */
                int tb = (j * 8 + g) * IM_LDX + 32 * sb + 4 * t4;
                uint32_t bh[2] = {*(const uint32_t *)(xh + tb), *(const uint32_t *)(xh + tb + 16)};
                uint32_t bl[2] = {*(const uint32_t *)(xl + tb), *(const uint32_t *)(xl + tb + 16)};
                int ch[4] = {0, 0, 0, 0}, cl[4] = {0, 0, 0, 0};
                im_mma(ch, af, bh, true);
                im_mma(cl, af, bl, false);
#pragma unroll
                for (int q = 0; q < 2; q++) { /* token 2 t4 + q: its scale and sum read once for both rows */
                    const float *xt = xdm + (j * 8 + 2 * t4 + q) * IM_XS;
                    float xv = xt[sb];
                    float2 m = *(const float2 *)(xt + 8 + 2 * sb);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        int e = 2 * h + q;
                        acc[j][e] += xv * ds[h] * (float)(ch[e] * 256 + cl[e]) - dn[h] * (m.x + m.y);
                    }
                }
            }
        }
}

/* One step of Q6_K: 6-bit codes (4 low bits in ql, 2 high in qh) of value d sc (q - 32), a scale per 16.
 * A lane's four codes of a sub-block half are four bytes of a k = 16 A fragment (two u16 loads, the block
 * being 2-byte aligned); per 16 the integer sum of codes times input, less 32 times the input's sum, takes
 * that half's scale. */
template <int NT8>
__device__ __forceinline__ void im_q6k_step(const uint8_t *const *blk, const uint8_t *xh, const uint8_t *xl,
                                            const float *xdm, int n, int g, int t4, float (*acc)[4]) {
    float d[2];
#pragma unroll
    for (int h = 0; h < 2; h++) d[h] = __half2float(__ushort_as_half(*(const unsigned short *)(blk[h] + 208)));
#pragma unroll
    for (int sb = 0; sb < 8; sb++) { /* values 32 sb .. 32 sb + 31: half nh = sb / 4, quarter m = sb % 4 */
        int nh = sb >> 2, m = sb & 3;
        uint32_t af[2][2]; /* [half of the sub-block][row g, g + 8] */
        float ds[2][2];    /* [row][half]: d sc */
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                int l = 16 * hf + 4 * t4;
                uint32_t lo = im_ld4(blk[h] + 64 * nh + 32 * (m & 1) + l), hi = im_ld4(blk[h] + 128 + 32 * nh + l);
                af[hf][h] = ((lo >> (4 * (m >> 1))) & 0x0F0F0F0Fu) | (((hi >> (2 * m)) & 0x03030303u) << 4);
                ds[h][hf] = d[h] * (float)(int8_t)blk[h][192 + 2 * sb + hf];
            }
        }
#pragma unroll
        for (int j = 0; j < NT8; j++) {
            if (j * 8 >= n) break;
            int tb = (j * 8 + g) * IM_LDX + 32 * sb + 4 * t4;
            int ch[2][4] = {}, cl[2][4] = {};
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                uint32_t ah[2] = {af[hf][0], af[hf][1]};
                im_mma16(ch[hf], ah, *(const uint32_t *)(xh + tb + 16 * hf), true);
                im_mma16(cl[hf], ah, *(const uint32_t *)(xl + tb + 16 * hf), false);
            }
#pragma unroll
            for (int q = 0; q < 2; q++) { /* codes less 32: 32 times the input's sums come off per 16 */
                const float *xt = xdm + (j * 8 + 2 * t4 + q) * IM_XS;
                float xv = xt[sb];
                float2 m = *(const float2 *)(xt + 8 + 2 * sb);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int e = 2 * h + q;
                    acc[j][e] += xv * (ds[h][0] * (float)(ch[0][e] * 256 + cl[0][e]) +
                                       ds[h][1] * (float)(ch[1][e] * 256 + cl[1][e])) -
                                 32.0f * (ds[h][0] * m.x + ds[h][1] * m.y);
                }
            }
        }
    }
}

/* One step of Q8_0: eight 34-byte blocks a row (d, 32 signed codes), a scale per 32; the codes are A
 * fragments as they lie (two u16 loads each, the blocks being 2-byte aligned) */
template <int NT8>
__device__ __forceinline__ void im_q80_step(const uint8_t *const *blk, const uint8_t *xh, const uint8_t *xl,
                                            const float *xdm, int n, int g, int t4, float (*acc)[4]) {
#pragma unroll
    for (int sb = 0; sb < 8; sb++) {
        uint32_t af[4];
        float dd[2];
#pragma unroll
        for (int q = 0; q < 4; q++) af[q] = im_ld4(blk[q & 1] + 34 * sb + 2 + 16 * (q >> 1) + 4 * t4);
#pragma unroll
        for (int h = 0; h < 2; h++) dd[h] = __half2float(__ushort_as_half(*(const unsigned short *)(blk[h] + 34 * sb)));
#pragma unroll
        for (int j = 0; j < NT8; j++) {
            if (j * 8 >= n) break;
            int tb = (j * 8 + g) * IM_LDX + 32 * sb + 4 * t4;
            uint32_t bh[2] = {*(const uint32_t *)(xh + tb), *(const uint32_t *)(xh + tb + 16)};
            uint32_t bl[2] = {*(const uint32_t *)(xl + tb), *(const uint32_t *)(xl + tb + 16)};
            int ch[4] = {0, 0, 0, 0}, cl[4] = {0, 0, 0, 0};
            im_mma<true>(ch, af, bh, true);
            im_mma<true>(cl, af, bl, false);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int tok = j * 8 + 2 * t4 + (e & 1);
                acc[j][e] += xdm[tok * IM_XS + sb] * dd[e >> 1] * (float)(ch[e] * 256 + cl[e]);
            }
        }
    }
}

template <int T, int NT8> __global__ void __launch_bounds__(MQ_WARPS * 32, 2) ggml_imma_k(imma_args a) {
    constexpr int SPAN = mq_span<T>(), NTOK = NT8 * 8;
    constexpr int STAGE = im_stage<T, NT8>(), XCH = 2 * 16 + 2 + 4; /* 16-byte pieces of a token's step */
    extern __shared__ float4 smem4[];
    __shared__ int rin[NTOK], rout[NTOK];
    uint8_t *sm = (uint8_t *)smem4;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    cu_w w;
    int n, k0, k1;
    cu_pdl_enter();
    int row0;
    float *y, *part;
    if (!mq_block<NTOK>(a, w, n, k0, k1, rin, rout, row0, y, part)) return;
    __syncthreads();
    int wrow0 = row0 + warp * 16;
    auto issue = [&](int kc, int b) {
        uint8_t *base = sm + b * STAGE;
        mq_rows_async<T>(base + warp * 16 * SPAN, w, wrow0, kc, k1, lane);
        uint8_t *xh = base + MQ_ROWS * SPAN, *xl = xh + NTOK * IM_LDX;
        float *xdm = (float *)(xl + NTOK * IM_LDX);
        for (int i = threadIdx.x; i < NTOK * XCH; i += MQ_WARPS * 32) {
            int tok = i / XCH, ch = i % XCH;
            if (tok >= n) continue; /* its products land in output columns that are not written */
            long long r = rin[tok];
            if (ch < 16)
                mq_cp16(xh + tok * IM_LDX + 16 * ch, a.x.h + r * a.cols + kc + 16 * ch, 16);
            else if (ch < 32)
                mq_cp16(xl + tok * IM_LDX + 16 * (ch - 16), a.x.l + r * a.cols + kc + 16 * (ch - 16), 16);
            else if (ch < 34)
                mq_cp16(xdm + tok * IM_XS + 4 * (ch - 32), a.x.d + r * (a.cols / 32) + kc / 32 + 4 * (ch - 32), 16);
            else
                mq_cp16(xdm + tok * IM_XS + 8 + 4 * (ch - 34), a.x.m + r * (a.cols / 16) + kc / 16 + 4 * (ch - 34),
                        16);
        }
        mq_commit();
    };
    float acc[NT8][4];
#pragma unroll
    for (int j = 0; j < NT8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0;
    /* the warp's rows g and g + 8, clamped as the copies are */
    const uint8_t *rowp[2];
#pragma unroll
    for (int h = 0; h < 2; h++) rowp[h] = w.data + (long long)min(wrow0 + g + 8 * h, w.rows - 1) * w.row_bytes;
    if (k0 < k1) issue(k0, 0);
    for (int kc = k0, b = 0; kc < k1; kc += MQ_KC, b ^= 1) {
        mq_next_step(issue, kc, k1, b);
        const uint8_t *base = sm + b * STAGE;
        /* where the step's blocks start in their first 16-byte piece (a Q6_K step of 210 bytes moves it) */
        const uint8_t *blk[2];
#pragma unroll
        for (int h = 0; h < 2; h++)
            blk[h] = base + (warp * 16 + g + 8 * h) * SPAN +
                     (int)((uintptr_t)(rowp[h] + (long long)(kc / gq<T>::BS) * gq<T>::BB) & 15);
        const uint8_t *xh = base + MQ_ROWS * SPAN, *xl = xh + NTOK * IM_LDX;
        const float *xdm = (const float *)(xl + NTOK * IM_LDX);
        if constexpr (T == SL_GGML_Q4_K)
            im_q4k_step<NT8>(blk, xh, xl, xdm, n, g, t4, acc);
        else if constexpr (T == SL_GGML_Q6_K)
            im_q6k_step<NT8>(blk, xh, xl, xdm, n, g, t4, acc);
        else
            im_q80_step<NT8>(blk, xh, xl, xdm, n, g, t4, acc);
        __syncthreads(); /* buffer b is refilled by the next step's issue */
    }
    mq_store<NT8>(a, w, n, wrow0, rout, acc, y, part);
}

/* whether the integer kernel takes GGML weight w: Q4_K (4-byte aligned for its word reads), or Q6_K and Q8_0
 * (2-byte aligned) unless SLUICE_CUDA_IMMA=q4k, whole blocks */
static int imma_takes(const cu_impl *c, const cu_w *w) {
    uintptr_t al = w->gtype == SL_GGML_Q4_K ? 4 : 2;
    return c->imma && (w->gtype == SL_GGML_Q4_K || (c->imma == 1 && (w->gtype == SL_GGML_Q6_K || w->gtype == SL_GGML_Q8_0))) &&
           w->cols % 256 == 0 && (uintptr_t)w->data % al == 0 && w->row_bytes % al == 0;
}

template <int T, int NT8> static void imma_type(cu_impl *c, const imma_args &a, dim3 grid) {
    size_t smem = 2 * (size_t)im_stage<T, NT8>();
    if ((int)smem > c->smem_optin) {
        cu_fail(c, "GGML integer tensor-core kernel: %zu bytes of shared memory, the GPU allows %d", smem,
                c->smem_optin);
        return;
    }
    if (smem > 48 * 1024 && cudaFuncSetAttribute(ggml_imma_k<T, NT8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem) != cudaSuccess) {
        cu_fail(c, "GGML integer tensor-core kernel: %zu bytes of shared memory refused", smem);
        return;
    }
    cu_launch(c, ggml_imma_k<T, NT8>, grid, MQ_WARPS * 32, smem, a);
}

template <int NT8> static void imma_go(cu_impl *c, const imma_args &a, dim3 grid) {
    if (a.w.gtype == SL_GGML_Q4_K)
        imma_type<SL_GGML_Q4_K, NT8>(c, a, grid);
    else if (a.w.gtype == SL_GGML_Q6_K)
        imma_type<SL_GGML_Q6_K, NT8>(c, a, grid);
    else
        imma_type<SL_GGML_Q8_0, NT8>(c, a, grid);
}

/* The partial sums of up to SL_MATMUL_MULTI launches that read one input, added in one launch */
struct mmq_sums {
    const float *part[SL_MATMUL_MULTI], *bias[SL_MATMUL_MULTI];
    float *y[SL_MATMUL_MULTI];
    long long len[SL_MATMUL_MULTI];
    int rows[SL_MATMUL_MULTI], splits[SL_MATMUL_MULTI];
    int n;
};

/* y[t][r] of each entry = its splits' partial sums in order (+ bias); the entries' elements one after another */
__global__ void ggml_mmq_sum_k(mmq_sums s) {
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int e = 0;
    while (e < s.n && i >= s.len[e]) i -= s.len[e++];
    if (e >= s.n) return;
    const float *part = s.part[e];
    float v = s.bias[e] ? s.bias[e][i % s.rows[e]] : 0.0f;
    for (int k = 0; k < s.splits[e]; k++) v += part[k * s.len[e] + i];
    s.y[e][i] = v;
}

struct mmq_f {
    cu_impl *c;
    mmq_args a;
    dim3 grid;
    int ex;
    template <int NT8, int EX, int T, int FULL> void go() {
        size_t smem = 2 * (size_t)mq_stage<T, NT8 *(EX ? 2 : 1)>();
        if ((int)smem > c->smem_optin) {
            cu_fail(c, "GGML tensor-core kernel: %zu bytes of shared memory for %s, the GPU allows %d", smem,
                    sl_ggml_type_name(T), c->smem_optin);
            return;
        }
        if (smem > 48 * 1024 &&
            cudaFuncSetAttribute(ggml_mmq_k<T, NT8, EX, FULL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
                cudaSuccess) {
            cu_fail(c, "GGML tensor-core kernel: %zu bytes of shared memory refused", smem);
            return;
        }
        cu_launch(c, ggml_mmq_k<T, NT8, EX, FULL>, grid, MQ_WARPS * 32, smem, a);
    }
    template <int T> void run() {
        if (a.units) { /* groups of up to CU_MMQ_GROUP pairs: only the tiles of their pairs */
            if (ex)
                go<CU_MMQ_GROUP / 8, 1, T, 0>();
            else
                go<CU_MMQ_GROUP / 8, 0, T, 0>();
        } else if (ex) {
            plain<1, T>();
        } else {
            plain<0, T>();
        }
    }
    template <int EX, int T> void plain() {
        if (a.n <= 8)
            go<1, EX, T, 1>();
        else if (a.n <= 16)
            go<2, EX, T, 1>();
        else if (a.n <= 32)
            go<4, EX, T, 1>();
        else
            go<8, EX, T, 1>();
    }
};

/* The permuted bf16 input (and its low halves with exact) of n rows of x in c->xtmp. */
static int mmq_input(cu_impl *c, const float *x, const float *u, int n, int cols, int exact, __nv_bfloat16 **xp,
                     __nv_bfloat16 **xpl) {
    int colsp = (cols + MQ_KC - 1) / MQ_KC * MQ_KC;
    size_t len = (size_t)n * (size_t)colsp;
    if (cu_grow(c, &c->xtmp, &c->xtmp_len, len * sizeof(__nv_bfloat16) * (exact ? 2 : 1), "matmul input")) return -1;
    *xp = (__nv_bfloat16 *)c->xtmp;
    *xpl = exact ? *xp + len : NULL;
    cu_launch(c, ggml_mmq_input_k, CU_BLOCKS((long long)n * colsp / 4, 256), 256, 0, x, u, n, cols, colsp, *xp, *xpl);
    return 0;
}

/* Q4_K on integer tensor cores where it wins: weights marked exact (it is nearer fp32 than the bf16 halves, at
 * two products a tile instead of three), and up to 8 tokens; beyond, the one-pass bf16 tiles apply the scales
 * once per weight where the integer kernel applies them per token and sub-block (llama3-8b Q4_K, 16 and 64
 * sequences: 1,917 and 2,401 tok/s against 2,229 and 3,889) */
static int mmq_integer(const cu_impl *c, const cu_w *w, int n, int exact) {
    return imma_takes(c, w) && (exact || n <= 8);
}

int cu_ggml_mmq_in(cu_impl *c, const cu_w *w, const float *x, const float *u, int n, int exact, cu_mmq_in *in) {
    if (n < 1 || n > CU_MMQ_MAX || w->cols % 32) return cu_fail(c, "GGML tensor-core kernel: %d tokens", n);
    *in = {mmq_integer(c, w, n, exact), exact, w->cols, n, {NULL, NULL, NULL, NULL, NULL}, NULL, NULL};
    return in->im ? cu_q16_rows(c, x, u, n, w->cols, &in->xq) : mmq_input(c, x, u, n, w->cols, exact, &in->xp, &in->xpl);
}

int cu_ggml_mmq_same(const cu_impl *c, const cu_w *w, int exact, const cu_mmq_in &in) {
    return w->cols == in.cols && exact == in.exact && mmq_integer(c, w, in.n, exact) == in.im;
}

int cu_ggml_mmq(cu_impl *c, const cu_w *w, const float *x, int n, int exact, float *y) {
    cu_mmq_in in;
    if (cu_ggml_mmq_in(c, w, x, NULL, n, exact, &in)) return -1;
    return cu_ggml_mmq_run(c, w, 1, in, &y);
}

/* columns a block of weight w takes (whole steps) */
static int mmq_kper(const cu_impl *c, const cu_w *w, int tiles, const cu_mmq_in &in) {
    int colsp = (w->cols + MQ_KC - 1) / MQ_KC * MQ_KC;
    /* Columns split in whole steps (at least two a block) so that the launch of `tiles` row tiles ends soonest:
     * a block's steps take about the same time at one or two blocks a SM (each waits on its own latencies), so
     * a launch takes its waves of blocks (mq_blocks a SM) times the steps of a block; the fewest splits of the
     * shortest. (Enough blocks for two a SM, the rule before, split llama3-8b's 112 gate tiles three ways: 1.3
     * waves of 6 steps where 2 splits take one wave of 8.) */
    int nt8 = in.n <= 8 ? 1 : in.n <= 16 ? 2 : 3; /* as plain() picks; 3 stands for more */
    int per_sm = in.im || !c->mmq_three ? 2 : mq_blocks(w->gtype, nt8, in.exact);
    if (per_sm == 3 && 3 * (2 * (size_t)mq_stage<SL_GGML_Q4_K, 2>() + 1024) > (size_t)c->smem_sm) per_sm = 2;
    int steps = colsp / MQ_KC, slots = per_sm * c->sms;
    int kps = steps; /* steps a block */
    if (c->mmq_fill) { /* SLUICE_CUDA_MMQ_SPLIT=fill, to compare: enough blocks for two a SM */
        int sp = (slots + tiles - 1) / tiles;
        sp = sp > steps / 2 ? steps / 2 : sp;
        sp = sp < 1 ? 1 : sp;
        kps = (steps + sp - 1) / sp;
    } else {
        long long best = -1;
        for (int s = 1; s <= (steps / 2 > 1 ? steps / 2 : 1); s++) {
            int kp = (steps + s - 1) / s, sp = (steps + kp - 1) / kp;
            long long t = ((long long)tiles * sp + slots - 1) / slots * kp;
            if (best < 0 || t < best) {
                best = t;
                kps = kp;
            }
        }
    }
    return kps * MQ_KC;
}

/* weights ws[0..m) (one type and width) in one launch by the converted input into ys, each one's column
 * splits' partial sums (if any) at parts */
static int mmq_launch(cu_impl *c, const cu_w *ws, int m, const cu_mmq_in &in, int kper, float *const *parts,
                      float *const *ys) {
    int n = in.n, exact = in.exact;
    const cu_w *w = &ws[0];
    int colsp = (w->cols + MQ_KC - 1) / MQ_KC * MQ_KC, splits = (w->cols + kper - 1) / kper;
    mq_more more = {};
    int tiles = (w->rows + MQ_ROWS - 1) / MQ_ROWS;
    for (int k = 1; k < m; k++) {
        more.w[more.n] = ws[k];
        more.y[more.n] = ys[k];
        more.part[more.n] = parts[k];
        more.tbeg[more.n++] = tiles;
        tiles += (ws[k].rows + MQ_ROWS - 1) / MQ_ROWS;
    }
    dim3 grid((unsigned)tiles, (unsigned)splits);
    if (in.im) {
        imma_args ia = {*w, NULL, NULL, NULL, NULL, 0, 1, in.xq, w->cols, n, kper, ys[0], parts[0], 0, more};
        if (n <= 8)
            imma_go<1>(c, ia, grid);
        else if (n <= 16)
            imma_go<2>(c, ia, grid);
        else if (n <= 32)
            imma_go<4>(c, ia, grid);
        else
            imma_go<8>(c, ia, grid);
    } else {
        mmq_args a = {*w, NULL, NULL, NULL, NULL, 0, 1, in.xp, in.xpl, colsp, n, kper, ys[0], parts[0], 0, more};
        mmq_f f = {c, a, grid, exact};
        if (!with_type(w->gtype, f)) return cu_fail(c, "GGML type %s has no CUDA kernel", sl_ggml_type_name(w->gtype));
    }
    return 0;
}

int cu_ggml_mmq_run(cu_impl *c, const cu_w *ws, int nw, const cu_mmq_in &in, float *const *ys) {
    if (nw < 1 || nw > SL_MATMUL_MULTI) return cu_fail(c, "GGML tensor-core kernel: %d weights", nw);
    /* launches: the weights of one type together (SLUICE_CUDA_MMQ_JOIN=0: one each), in order of their first */
    int set[SL_MATMUL_MULTI], kper[SL_MATMUL_MULTI], splits[SL_MATMUL_MULTI], tiles[SL_MATMUL_MULTI] = {0};
    int lead[SL_MATMUL_MULTI], nl = 0; /* set[i]: the first weight of i's launch */
    for (int i = 0; i < nw; i++) {
        if (!cu_ggml_mmq_same(c, &ws[i], in.exact, in))
            return cu_fail(c, "GGML tensor-core kernel: an input of another form");
        int k = 0;
        while (k < nl && !(c->mmq_join && ws[lead[k]].gtype == ws[i].gtype)) k++;
        if (k == nl) lead[nl++] = i;
        set[i] = lead[k];
        tiles[set[i]] += (ws[i].rows + MQ_ROWS - 1) / MQ_ROWS;
    }
    size_t total = 0; /* the partial sums of every weight with column splits, one after another */
    for (int i = 0; i < nw; i++) {
        if (set[i] == i) kper[i] = mmq_kper(c, &ws[i], tiles[i], in);
        kper[i] = kper[set[i]];
        splits[i] = (ws[i].cols + kper[i] - 1) / kper[i];
        if (splits[i] > 1) total += (size_t)splits[i] * (size_t)in.n * (size_t)ws[i].rows;
    }
    if (total && cu_grow(c, &c->wtmp, &c->wtmp_len, total * sizeof(float), "matmul partial sums")) return -1;
    mmq_sums sm = {};
    long long all = 0;
    float *part = (float *)c->wtmp, *parts[SL_MATMUL_MULTI];
    for (int i = 0; i < nw; i++) {
        long long len = (long long)in.n * ws[i].rows;
        parts[i] = splits[i] > 1 ? part : NULL;
        if (splits[i] == 1) continue;
        sm.part[sm.n] = part;
        sm.bias[sm.n] = ws[i].bias;
        sm.y[sm.n] = ys[i];
        sm.len[sm.n] = len;
        sm.rows[sm.n] = ws[i].rows;
        sm.splits[sm.n++] = splits[i];
        part += splits[i] * len;
        all += len;
    }
    for (int i = 0; i < nw; i++) {
        if (set[i] != i) continue;
        cu_w lw[SL_MATMUL_MULTI];
        float *ly[SL_MATMUL_MULTI], *lp[SL_MATMUL_MULTI];
        int m = 0;
        for (int j = i; j < nw; j++)
            if (set[j] == i) {
                lw[m] = ws[j];
                ly[m] = ys[j];
                lp[m++] = parts[j];
            }
        if (mmq_launch(c, lw, m, in, kper[i], lp, ly)) return -1;
    }
    if (sm.n) cu_launch(c, ggml_mmq_sum_k, CU_BLOCKS(all, 256), 256, 0, sm);
    return cu_check_launch(c, "GGML tensor-core kernel");
}

int cu_ggml_mmq_grouped(cu_impl *c, const cu_w *w0, const cu_expert *table, int which, int nz, const int4 *units,
                        const int *pairs, const int *count, int max_units, int x_div, const float *x, const float *u,
                        int n_x, int exact, float *y, long long yz) {
    if (w0->cols % 32) return cu_fail(c, "GGML tensor-core kernel: %d columns", w0->cols);
    int colsp = (w0->cols + MQ_KC - 1) / MQ_KC * MQ_KC;
    dim3 grid(CU_BLOCKS(w0->rows, MQ_ROWS), (unsigned)max_units, (unsigned)nz);
    if (imma_takes(c, w0)) { /* every expert of the table shares w0's type, shape and alignment */
        cu_q16 xq;
        if (cu_q16_rows(c, x, u, n_x, w0->cols, &xq)) return -1;
        imma_args ia = {*w0, table, units, pairs, count, which, x_div, xq, w0->cols, 0, w0->cols, y, NULL, yz, {}};
        imma_go<CU_MMQ_GROUP / 8>(c, ia, grid);
        return cu_check_launch(c, "GGML grouped integer tensor-core kernel");
    }
    __nv_bfloat16 *xp, *xpl;
    if (mmq_input(c, x, u, n_x, w0->cols, exact, &xp, &xpl)) return -1;
    mmq_args a = {*w0, table, units, pairs, count, which, x_div, xp, xpl, colsp, 0, w0->cols, y, NULL, yz, {}};
    mmq_f f = {c, a, grid, exact};
    if (!with_type(w0->gtype, f)) return cu_fail(c, "GGML type %s has no CUDA kernel", sl_ggml_type_name(w0->gtype));
    return cu_check_launch(c, "GGML grouped tensor-core kernel");
}
