/* Matrix products on the GPU. Decode (up to 16 tokens) runs fused dequantise-GEMV kernels: 128-bit
 * weight loads, the input in shared memory, fp32 accumulation, no dequantised copy. Larger batches go
 * through cuBLAS on tensor cores: the weight (dequantised to a bf16 scratch unless it is bf16 already)
 * times the input rounded to bf16, accumulated in fp32. */
#include <string.h>

#include "backend/cuda/cuda_int.cuh"

#define GV_WARPS 8

/* Kernel variants per storage format keep each one's registers (and so its occupancy) to its own need. */
enum {
    KIND_ELEM = 0,
    KIND_BF16 = 1,
    KIND_F16 = 2,
    KIND_F32 = 3,
    KIND_FP8 = 4,
    KIND_MXFP4 = 5,
    KIND_MLX = 10 /* + bits */
};

/* Rows per warp (RPW), whose loads are issued together: 2, or 4 for 4- and 8-bit MLX rows of one token
 * when the launch has enough rows to keep every SM busy with 4 (see launch_nt). */

#define GV_SMEM 40960          /* bytes of staged input per block */
#define GV_PREFETCH (24 << 20) /* bytes of weights a launch may prefetch into L2 before its inputs are ready */

/* Shared-memory index of input j: 4 floats of padding every 32 keep the lanes' 128-bit reads of
 * consecutive units on distinct banks. */
__device__ __forceinline__ int pad(int j) {
    return j + (j >> 5) * 4;
}

__device__ __forceinline__ float load_sb(int fmt, const uint8_t *p, long long i) {
    if (fmt == SL_WF_F32) return __ldg((const float *)p + i);
    unsigned short h = __ldg((const unsigned short *)p + i);
    if (fmt == SL_WF_BF16) return __uint_as_float((unsigned)h << 16);
    return __half2float(__ushort_as_half(h));
}

/* float8 e4m3fn to float (NaN for S.1111.111, no infinities), by the hardware conversion where there is one */
__device__ __forceinline__ float fp8_f32(unsigned v) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
    return __half2float(__half(h));
}

/* The scale of element (r, j) of an FP8 weight: one per tile of trows x group. */
__device__ __forceinline__ float fp8_scale(const cu_w &w, int r, int j) {
    int tc = (w.cols + w.group - 1) / w.group;
    return __ldg((const float *)w.scales + (long long)(r / w.trows) * tc + j / w.group);
}

/* E2M1 code q as a float, built from its bits: exponent e (bias 1) and mantissa m give (1 + m/2) 2^(e-1),
 * and e = 0 the subnormal m/2. */
__device__ __forceinline__ float e2m1f(unsigned q) {
    unsigned e = (q >> 1) & 3u, m = q & 1u;
    unsigned bits = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3F000000u : 0u);
    return __uint_as_float(bits | ((q & 8u) << 28));
}

/* E8M0 exponent byte s as 2^(s-127) (s = 0 is subnormal; 255, NaN, is left as the float it spells) */
__device__ __forceinline__ float e8m0f(unsigned s) {
    return __uint_as_float(s ? s << 23 : 0x00400000u);
}

/* Element (r, j) of any stored format (the slow general path). */
__device__ float w_elem(const cu_w &w, int r, int j) {
    if (w.trans) { /* float weights stored inputs-first */
        long long i = (long long)j * w.rows + r;
        if (w.fmt == SL_WF_F32) return __ldg((const float *)w.data + i);
        unsigned short h = __ldg((const unsigned short *)w.data + i);
        return w.fmt == SL_WF_BF16 ? __uint_as_float((unsigned)h << 16) : __half2float(__ushort_as_half(h));
    }
    const uint8_t *p = w.data + (long long)r * w.row_bytes;
    switch (w.fmt) {
    case SL_WF_F32: return __ldg((const float *)p + j);
    case SL_WF_BF16: return __uint_as_float((unsigned)__ldg((const unsigned short *)p + j) << 16);
    case SL_WF_F16: return __half2float(__ushort_as_half(__ldg((const unsigned short *)p + j)));
    case SL_WF_MLX: {
        long long bit = (long long)j * w.bits;
        unsigned v = (unsigned)__ldg(p + (bit >> 3)) >> (bit & 7);
        if ((bit & 7) + w.bits > 8) v |= (unsigned)__ldg(p + (bit >> 3) + 1) << (8 - (bit & 7));
        v &= (1u << w.bits) - 1u;
        long long g = (long long)r * (w.cols / w.group) + j / w.group;
        return load_sb(w.sbf, w.scales, g) * (float)v + load_sb(w.sbf, w.biases, g);
    }
    case SL_WF_FP8: return fp8_f32(__ldg(p + j)) * fp8_scale(w, r, j);
    case SL_WF_MXFP4: {
        unsigned b = __ldg(p + (j >> 1));
        return e2m1f(j & 1 ? b >> 4 : b & 15u) * e8m0f(__ldg(w.scales + (long long)r * (w.cols >> 5) + (j >> 5)));
    }
    default: return 0.0f;
    }
}

/* exact float of a small unsigned integer without the slow int-to-float conversion */
__device__ __forceinline__ float u2f(unsigned v) {
    return __uint_as_float(v | 0x4B000000u) - 8388608.0f;
}

template <int NT>
__device__ __forceinline__ void dot_units(const float *f, int V, const float *sx, int padw, int pu, int n, float *acc) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n) break;
        const float4 *xv = (const float4 *)(sx + t * padw + pu);
        float s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (4 * i >= V) break;
            float4 a = xv[i];
            s += f[4 * i] * a.x + f[4 * i + 1] * a.y + f[4 * i + 2] * a.z + f[4 * i + 3] * a.w;
        }
        acc[t] += s;
    }
}

/* bf16 / f16 rows: units of 8 values (one 128-bit load); 16 units a lane in flight, over 2 rows or, for short
 * rows (whose 2 rows would leave most of them empty), 4 */
template <int NT, bool BF, int RPW>
__device__ __forceinline__ void rows_half(const cu_w &w, int row0, int c0, int cl, const float *sx, int padw, int n,
                                          int lane, float (*acc)[NT]) {
    constexpr int UB = 16 / RPW; /* units per lane loaded before any is used */
    const int nu = cl / 8;
    for (int u0 = lane; u0 < nu; u0 += 32 * UB) {
        uint4 q[RPW][UB];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const uint8_t *p = w.data + (long long)min(row0 + rr, w.rows - 1) * w.row_bytes + (long long)c0 * 2;
#pragma unroll
            for (int b = 0; b < UB; b++) {
                int u = u0 + 32 * b;
                q[rr][b] = u < nu ? __ldg((const uint4 *)(p + (long long)u * 16)) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int b = 0; b < UB; b++) {
            int u = u0 + 32 * b;
            if (u >= nu) break;
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                unsigned wd[4] = {q[rr][b].x, q[rr][b].y, q[rr][b].z, q[rr][b].w};
                float f[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (BF) {
                        f[2 * i] = __uint_as_float(wd[i] << 16);
                        f[2 * i + 1] = __uint_as_float(wd[i] & 0xffff0000u);
                    } else {
                        __half2 h = *(__half2 *)&wd[i];
                        float2 v = __half22float2(h);
                        f[2 * i] = v.x;
                        f[2 * i + 1] = v.y;
                    }
                }
                dot_units<NT>(f, 8, sx, padw, pad(u * 8), n, acc[rr]);
            }
        }
    }
}

template <int NT>
__device__ __forceinline__ void rows_f32(const cu_w &w, int row0, int c0, int cl, const float *sx, int padw, int n,
                                         int lane, float (*acc)[NT]) {
    constexpr int RPW = 2, UB = 8;
    const int nu = cl / 4;
    for (int u0 = lane; u0 < nu; u0 += 32 * UB) {
        float4 q[RPW][UB];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const uint8_t *p = w.data + (long long)min(row0 + rr, w.rows - 1) * w.row_bytes + (long long)c0 * 4;
#pragma unroll
            for (int b = 0; b < UB; b++) {
                int u = u0 + 32 * b;
                q[rr][b] = u < nu ? __ldg((const float4 *)(p + (long long)u * 16)) : make_float4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int b = 0; b < UB; b++) {
            int u = u0 + 32 * b;
            if (u >= nu) break;
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                float f[4] = {q[rr][b].x, q[rr][b].y, q[rr][b].z, q[rr][b].w};
                dot_units<NT>(f, 4, sx, padw, pad(u * 4), n, acc[rr]);
            }
        }
    }
}

/* Block-FP8 rows: units of 16 values (one 128-bit load), all in one scale tile (chunks and tiles are
 * multiples of 16 columns); the unit's dot is scaled once. */
template <int NT>
__device__ __forceinline__ void rows_fp8(const cu_w &w, int row0, int c0, int cl, const float *sx, int padw, int n,
                                         int lane, float (*acc)[NT]) {
    constexpr int RPW = 2, UB = 4;
    const int nu = cl / 16;
    for (int u0 = lane; u0 < nu; u0 += 32 * UB) {
        uint4 q[RPW][UB];
        float sc[RPW][UB];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            int r = min(row0 + rr, w.rows - 1);
            const uint8_t *p = w.data + (long long)r * w.row_bytes + c0;
#pragma unroll
            for (int b = 0; b < UB; b++) {
                int u = u0 + 32 * b;
                q[rr][b] = u < nu ? __ldg((const uint4 *)(p + (long long)u * 16)) : make_uint4(0, 0, 0, 0);
                sc[rr][b] = u < nu ? fp8_scale(w, r, c0 + u * 16) : 0.0f;
            }
        }
#pragma unroll
        for (int b = 0; b < UB; b++) {
            int u = u0 + 32 * b;
            if (u >= nu) break;
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                unsigned wd[4] = {q[rr][b].x, q[rr][b].y, q[rr][b].z, q[rr][b].w};
                float f[16];
#pragma unroll
                for (int i = 0; i < 16; i++) f[i] = fp8_f32((wd[i / 4] >> (8 * (i % 4))) & 0xffu);
                float part[NT];
#pragma unroll
                for (int t = 0; t < NT; t++) part[t] = 0.0f;
                dot_units<NT>(f, 16, sx, padw, pad(u * 16), n, part);
#pragma unroll
                for (int t = 0; t < NT; t++) acc[rr][t] += sc[rr][b] * part[t];
            }
        }
    }
}

/* The BITS 32-bit words holding 32 packed values, in as few loads as their alignment allows. */
template <int BITS> __device__ __forceinline__ void load_words(const uint8_t *p, unsigned *wd) {
    if (BITS % 4 == 0) {
#pragma unroll
        for (int i = 0; i < BITS / 4; i++) {
            uint4 v = __ldg((const uint4 *)p + i);
            wd[4 * i] = v.x;
            wd[4 * i + 1] = v.y;
            wd[4 * i + 2] = v.z;
            wd[4 * i + 3] = v.w;
        }
    } else if (BITS % 2 == 0) {
#pragma unroll
        for (int i = 0; i < BITS / 2; i++) {
            uint2 v = __ldg((const uint2 *)p + i);
            wd[2 * i] = v.x;
            wd[2 * i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < BITS; i++) wd[i] = __ldg((const unsigned *)p + i);
    }
}

/* MLX affine rows: units of 32 values in BITS words; dot = scale * sum(q x) + bias * sum(x), with
 * sum(x) shared by the warp's rows. */
template <int NT, int BITS, int RPW>
__device__ __forceinline__ void rows_mlx(const cu_w &w, int row0, int c0, int cl, const float *sx, int padw, int n,
                                         int lane, float (*acc)[NT]) {
    const int ng = w.cols / w.group;
#pragma unroll 2
    for (int u = lane; u < cl / 32; u += 32) {
        unsigned wd[RPW][BITS];
        float sc[RPW], bi[RPW];
        int col = c0 + u * 32, g = col / w.group;
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            int r = min(row0 + rr, w.rows - 1);
            load_words<BITS>(w.data + (long long)r * w.row_bytes + (long long)col * BITS / 8, wd[rr]);
            sc[rr] = load_sb(w.sbf, w.scales, (long long)r * ng + g);
            bi[rr] = load_sb(w.sbf, w.biases, (long long)r * ng + g);
        }
        int pu = pad(u * 32);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xv = (const float4 *)(sx + t * padw + pu);
            float xf[32];
            float sum = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 a = xv[i];
                xf[4 * i] = a.x;
                xf[4 * i + 1] = a.y;
                xf[4 * i + 2] = a.z;
                xf[4 * i + 3] = a.w;
                sum += (a.x + a.y) + (a.z + a.w);
            }
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                float s = 0;
#pragma unroll
                for (int j = 0; j < 32; j++) {
                    const int bit = j * BITS, k = bit >> 5, sh = bit & 31;
                    unsigned v = wd[rr][k] >> sh;
                    if (sh + BITS > 32) v |= wd[rr][k + 1] << (32 - sh);
                    s += u2f(v & ((1u << BITS) - 1u)) * xf[j];
                }
                acc[rr][t] += sc[rr] * s + bi[rr] * sum;
            }
        }
    }
}

/* (a & m) | o in one instruction */
__device__ __forceinline__ unsigned and_or(unsigned a, unsigned m, unsigned o) {
    unsigned r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(m), "r"(o));
    return r;
}

/* s += sum over the values of one 32-bit word of (M + q_j) * x_j, where M is 128 for 4 bits and 256
 * for 8: each q_j is moved into the mantissa of M (bits 16-19 of 128.0f, bits 15-22 of 256.0f), so one
 * shift and one lop3 make its float, with no conversion or subtraction. The caller takes M * sum(x) off;
 * the products stay within a factor (M + 15) / 15 of the plain ones, well inside fp32. */
template <int BITS> __device__ __forceinline__ void dot_word(unsigned v, const float *x, float &s) {
    if (BITS == 4) {
        const unsigned e[8] = {v << 16, v << 12, v << 8, v << 4, v, v >> 4, v >> 8, v >> 12};
#pragma unroll
        for (int k = 0; k < 8; k++) s += __uint_as_float(and_or(e[k], 0x000F0000u, 0x43000000u)) * x[k];
    } else {
        const unsigned e[4] = {v << 15, v << 7, v >> 1, v >> 9};
#pragma unroll
        for (int k = 0; k < 4; k++) s += __uint_as_float(and_or(e[k], 0x007F8000u, 0x43800000u)) * x[k];
    }
}

/* MLX 4- and 8-bit rows with bf16 scales and biases and a power-of-two group (what MLX writes): the
 * row pointers are formed once, every unit a lane takes of its rows is loaded before any is used, and
 * rows of 16 units or fewer are split between the two half-warps so that no lane idles. In that case
 * lane partials of row 2k + (lane >> 4) go to acc[2k] or acc[2k + 1]; the caller's warp sum collects
 * them either way. */
template <int NT, int BITS, int RPW>
__device__ __forceinline__ void rows_mlx_fast(const cu_w &w, int row0, int c0, int cl, const float *sx, int padw, int n,
                                              int lane, float (*acc)[NT]) {
    constexpr int UB = BITS == 4 ? 8 / RPW : 4 / RPW; /* units per row per batch */
    constexpr float M = BITS == 4 ? 128.0f : 256.0f;
    const int nu = cl / 32;
    const bool half = nu <= 16;
    const int sub = half ? lane & 15 : lane, step = half ? 16 : 32, rh = half ? lane >> 4 : 0;
    const int nr = half ? RPW / 2 : RPW; /* rows this lane works on */
    const int gs = __ffs(w.group) - 1, ng = w.cols >> gs;
    const unsigned short *sp = (const unsigned short *)w.scales, *bp = (const unsigned short *)w.biases;
    const uint8_t *rp[RPW];
    int so[RPW]; /* the row's first scale */
#pragma unroll
    for (int k = 0; k < RPW; k++) {
        int r = min(row0 + (half ? 2 * k + rh : k), w.rows - 1);
        rp[k] = w.data + (long long)r * w.row_bytes + (long long)c0 * BITS / 8;
        so[k] = r * ng;
    }
    float part[RPW][NT];
#pragma unroll
    for (int k = 0; k < RPW; k++)
#pragma unroll
        for (int t = 0; t < NT; t++) part[k][t] = 0;
    for (int u0 = sub; u0 < nu; u0 += step * UB) {
        unsigned wd[RPW][UB][BITS];
        unsigned short sc[RPW][UB], bi[RPW][UB];
#pragma unroll
        for (int k = 0; k < RPW; k++) {
            if (k >= nr) break;
#pragma unroll
            for (int b = 0; b < UB; b++) {
                int u = min(u0 + step * b, nu - 1), g = (c0 + u * 32) >> gs;
                load_words<BITS>(rp[k] + (long long)u * BITS * 4, wd[k][b]);
                sc[k][b] = __ldg(sp + so[k] + g);
                bi[k][b] = __ldg(bp + so[k] + g);
            }
        }
#pragma unroll
        for (int b = 0; b < UB; b++) {
            int u = u0 + step * b;
            if (u >= nu) break;
            int pu = pad(u * 32);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const float4 *xv = (const float4 *)(sx + t * padw + pu);
                constexpr int PW = 32 / BITS; /* values per word */
                float sr[RPW], sum = 0;
#pragma unroll
                for (int k = 0; k < RPW; k++) sr[k] = 0;
#pragma unroll
                for (int i = 0; i < BITS; i++) {
                    float xw[PW];
#pragma unroll
                    for (int q = 0; q < PW / 4; q++) {
                        float4 a = xv[i * PW / 4 + q];
                        xw[4 * q] = a.x;
                        xw[4 * q + 1] = a.y;
                        xw[4 * q + 2] = a.z;
                        xw[4 * q + 3] = a.w;
                        sum += (a.x + a.y) + (a.z + a.w);
                    }
#pragma unroll
                    for (int k = 0; k < RPW; k++)
                        if (k < nr) dot_word<BITS>(wd[k][b][i], xw, sr[k]);
                }
#pragma unroll
                for (int k = 0; k < RPW; k++) {
                    if (k >= nr) break;
                    float scale = __uint_as_float((unsigned)sc[k][b] << 16);
                    float bias = __uint_as_float((unsigned)bi[k][b] << 16);
                    part[k][t] += scale * (sr[k] - M * sum) + bias * sum;
                }
            }
        }
    }
    if (half) {
#pragma unroll
        for (int k = 0; k < RPW / 2; k++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                acc[2 * k][t] += rh ? 0.0f : part[k][t];
                acc[2 * k + 1][t] += rh ? part[k][t] : 0.0f;
            }
    } else {
#pragma unroll
        for (int k = 0; k < RPW; k++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[k][t] += part[k][t];
    }
}

/* MXFP4 rows: units of 32 values, one 128-bit load of codes and one scale byte per row; codes of 2j and
 * 2j + 1 share a byte, the even one in the low nibble. */
template <int NT, int RPW>
__device__ __forceinline__ void rows_mxfp4(const cu_w &w, int row0, int c0, int cl, const float *sx, int padw, int n,
                                           int lane, float (*acc)[NT]) {
    const int nb = w.cols >> 5;
    for (int u = lane; u < cl / 32; u += 32) {
        unsigned wd[RPW][4];
        float sc[RPW];
        int col = c0 + u * 32;
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            int r = min(row0 + rr, w.rows - 1);
            uint4 q = __ldg((const uint4 *)(w.data + (long long)r * w.row_bytes + col / 2));
            wd[rr][0] = q.x;
            wd[rr][1] = q.y;
            wd[rr][2] = q.z;
            wd[rr][3] = q.w;
            sc[rr] = e8m0f(__ldg(w.scales + (long long)r * nb + (col >> 5)));
        }
        int pu = pad(u * 32);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xv = (const float4 *)(sx + t * padw + pu);
            float xf[32];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 a = xv[i];
                xf[4 * i] = a.x;
                xf[4 * i + 1] = a.y;
                xf[4 * i + 2] = a.z;
                xf[4 * i + 3] = a.w;
            }
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                float s = 0;
#pragma unroll
                for (int j = 0; j < 32; j++) s += e2m1f((wd[rr][j >> 3] >> ((j & 7) * 4)) & 15u) * xf[j];
                acc[rr][t] += sc[rr] * s;
            }
        }
    }
}

template <int NT, int RPW>
__device__ __forceinline__ void rows_elem(const cu_w &w, int row0, int c0, int cl, const float *sx, int padw, int n,
                                          int lane, float (*acc)[NT]) {
    for (int rr = 0; rr < RPW; rr++) {
        int r = min(row0 + rr, w.rows - 1);
        for (int j = lane; j < cl; j += 32) {
            float v = w_elem(w, r, c0 + j);
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < n) acc[rr][t] += v * sx[t * padw + pad(j)];
        }
    }
}

/* How the staged input combines x with a second operand xu. */
enum { XM_PLAIN = 0, XM_SWIGLU = 1 /* silu(x) * xu */, XM_SIGMOID = 2 /* x * sigmoid(xu) */ };

/* Copies columns [c0, c0 + cl) of the n input rows into shared memory (padded layout), combined with xu
 * as xmode says, by threads tid0.. of the block. */
__device__ __forceinline__ void stage(const float *x, const float *xu, int xmode, int cols, int c0, int cl, int n,
                                      float *sx, int padw, int tid0 = 0) {
    const int tid = (int)threadIdx.x - tid0, nth = (int)blockDim.x - tid0;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (long long)t * cols + c0;
        float *st = sx + t * padw;
        if (xmode != XM_PLAIN && ((cols | cl) & 3) == 0) { /* 128-bit loads of both operands */
            const float *ut = xu + (long long)t * cols + c0;
            for (int j = tid * 4; j < cl; j += nth * 4) {
                float4 a = *(const float4 *)(xt + j), b = *(const float4 *)(ut + j), o;
                if (xmode == XM_SWIGLU) {
                    o = make_float4(a.x * cu_sigmoid(a.x) * b.x, a.y * cu_sigmoid(a.y) * b.y,
                                    a.z * cu_sigmoid(a.z) * b.z, a.w * cu_sigmoid(a.w) * b.w);
                } else {
                    o = make_float4(a.x * cu_sigmoid(b.x), a.y * cu_sigmoid(b.y), a.z * cu_sigmoid(b.z),
                                    a.w * cu_sigmoid(b.w));
                }
                *(float4 *)(st + pad(j)) = o;
            }
        } else if (xmode == XM_SWIGLU) {
            const float *ut = xu + (long long)t * cols + c0;
            for (int j = tid; j < cl; j += nth) {
                float g = xt[j];
                st[pad(j)] = g * cu_sigmoid(g) * ut[j];
            }
        } else if (xmode == XM_SIGMOID) {
            const float *ut = xu + (long long)t * cols + c0;
            for (int j = tid; j < cl; j += nth) st[pad(j)] = xt[j] * cu_sigmoid(ut[j]);
        } else if ((cols & 3) == 0) { /* 128-bit loads; 4 consecutive inputs stay contiguous */
            for (int j = tid * 4; j < cl; j += nth * 4)
                if (j + 3 < cl)
                    *(float4 *)(st + pad(j)) = *(const float4 *)(xt + j);
                else
                    for (int q = j; q < cl; q++) st[pad(q)] = xt[q];
        } else {
            for (int j = tid; j < cl; j += nth) st[pad(j)] = xt[j];
        }
    }
}

/* The inputs of a group of routed pairs (grouped MoE launches): pair pr[t]'s row is pr[t] / x_div of x
 * (and xu), rows xs apart; plain, or silu(x) * xu. */
__device__ __forceinline__ void stage_pairs(const float *x, const float *xu, int xmode, long long xs, int x_div,
                                            const int *pr, int c0, int cl, int n, float *sx, int padw) {
    const int tid = (int)threadIdx.x, nth = (int)blockDim.x;
    for (int t = 0; t < n; t++) {
        long long row = (long long)(pr[t] / x_div) * xs + c0;
        const float *xt = x + row;
        float *st = sx + t * padw;
        if (xmode == XM_SWIGLU) {
            const float *ut = xu + row;
            if (((xs | cl) & 3) == 0) {
                for (int j = tid * 4; j < cl; j += nth * 4) {
                    float4 a = *(const float4 *)(xt + j), b = *(const float4 *)(ut + j);
                    *(float4 *)(st + pad(j)) = make_float4(a.x * cu_sigmoid(a.x) * b.x, a.y * cu_sigmoid(a.y) * b.y,
                                                           a.z * cu_sigmoid(a.z) * b.z, a.w * cu_sigmoid(a.w) * b.w);
                }
            } else {
                for (int j = tid; j < cl; j += nth) {
                    float g = xt[j];
                    st[pad(j)] = g * cu_sigmoid(g) * ut[j];
                }
            }
        } else if (((xs | cl) & 3) == 0) {
            for (int j = tid * 4; j < cl; j += nth * 4) *(float4 *)(st + pad(j)) = *(const float4 *)(xt + j);
        } else {
            for (int j = tid; j < cl; j += nth) st[pad(j)] = xt[j];
        }
    }
}

/* One token's plain input staged by warps 1.. while warp 0 routes. Not inlined: inlined, it made the 4-row
 * routing variants spill. */
__device__ __noinline__ void prestage(const float *x, int cols, float *sx) {
    stage(x, NULL, XM_PLAIN, cols, 0, cols, 1, sx, 0, 32);
}

/* The staged rows of the chunk as the delta-net's output norm leaves them: each group of gdim values
 * normed (times nw) and gated by silu(z), one warp per group. Chunks hold whole groups. */
__device__ __noinline__ void stage_norm_gate(const float *z, const float *nw, int gdim, float eps, int cols, int c0,
                                             int cl, int n, float *sx, int padw) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, per = cl / gdim;
    for (int g = warp; g < n * per; g += blockDim.x >> 5) {
        int t = g / per, j0 = (g % per) * gdim;
        float *st = sx + t * padw;
        const float *zt = z + (long long)t * cols + c0 + j0;
        if ((gdim & 3) == 0 && gdim <= 128 && (cols & 3) == 0) {
            /* four values per lane: the gate and weight loads go out before the reduction waits */
            int j = lane * 4;
            bool on = j < gdim;
            float4 v = on ? *(const float4 *)(st + pad(j0 + j)) : make_float4(0, 0, 0, 0);
            float4 zv = on ? *(const float4 *)(zt + j) : v, wv = on ? *(const float4 *)(nw + j) : v;
            float inv = rsqrtf(warp_sum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w) / (float)gdim + eps);
            if (on)
                *(float4 *)(st + pad(j0 + j)) = make_float4(
                    (wv.x * (v.x * inv)) * (zv.x * cu_sigmoid(zv.x)), (wv.y * (v.y * inv)) * (zv.y * cu_sigmoid(zv.y)),
                    (wv.z * (v.z * inv)) * (zv.z * cu_sigmoid(zv.z)), (wv.w * (v.w * inv)) * (zv.w * cu_sigmoid(zv.w)));
            continue;
        }
        float ss = 0;
        for (int j = lane; j < gdim; j += 32) {
            float v = st[pad(j0 + j)];
            ss += v * v;
        }
        float inv = rsqrtf(warp_sum(ss) / (float)gdim + eps);
        for (int j = lane; j < gdim; j += 32) {
            float zv = zt[j];
            st[pad(j0 + j)] = (nw[j] * (st[pad(j0 + j)] * inv)) * (zv * cu_sigmoid(zv));
        }
    }
}

__host__ __device__ __forceinline__ int kind_of(const cu_w &w) {
    if (!w.vec) return KIND_ELEM;
    switch (w.fmt) {
    case SL_WF_BF16: return KIND_BF16;
    case SL_WF_F16: return KIND_F16;
    case SL_WF_F32: return KIND_F32;
    case SL_WF_FP8: return KIND_FP8;
    case SL_WF_MXFP4: return KIND_MXFP4;
    case SL_WF_MLX: return KIND_MLX + w.bits;
    default: return KIND_ELEM;
    }
}

/* The weights of one launch, all reading the same input: weight i owns the grid's row groups
 * [g0[i], g0[i + 1]) and writes y[i]. Several small projections in one launch fill the GPU better and
 * cost one launch instead of several. */
struct gv_set {
    cu_w w[SL_MATMUL_MULTI];
    float *y[SL_MATMUL_MULTI];
    int g0[SL_MATMUL_MULTI + 1];
    int nw;
};

/* y[slot][t][rows] = W(slot) . x[slot / x_div][t] for t < n. Each warp owns RPW rows; the block
 * stages the input in chunks of `chunk` columns. With a table, grid row `slot` takes its weight from
 * the table entry ids[slot] (set.w[0] only sizes the grid) and grid z selects weight `which + z` and
 * output y + z * yz (gate and up in one launch). The input is x combined with xu as xmode says, formed
 * while staging, and with gz the gated RMSNorm of that over groups of gdim (weight gw, gate silu(gz)).
 * With ysc, token t's results are added to y scaled by sigmoid(ysc[t]) instead of stored; with cd as well,
 * y starts from the MoE combine sum over s < ck of cw[t][s] * cd[t * ck + s][row] instead of its contents.
 * With conv_w, weight 0's outputs go through the causal conv + SiLU (conv_row) on their way to y. With rl,
 * a table launch routes first: each block picks its slot's expert from token slot / x_div's logits rl (rne
 * per token, top-x_div), and one block per token writes the ids and weights to rids and rw. */
/* Channel r of a causal depthwise conv + SiLU over n tokens whose inputs u[t] are in registers: y[t][r]
 * from the taps wc[kernel] and the previous kernel-1 inputs in st[kernel-1][channels], which advances. */
template <int NT>
__device__ __forceinline__ void conv_row(const float (&u)[NT], int n, int r, int channels, const float *wc, int kernel,
                                         float *st, float *y) {
    int hist = kernel - 1;
    for (int t = 0; t < n; t++) {
        float s = 0;
        for (int k = 0; k < kernel; k++) {
            int src = t - hist + k;
            float v = 0;
#pragma unroll
            for (int q = 0; q < NT; q++)
                if (q == src) v = u[q];
            s += wc[k] * (src >= 0 ? v : st[(long long)(hist + src) * channels + r]);
        }
        y[(long long)t * channels + r] = s * cu_sigmoid(s);
    }
    for (int h = 0; h < hist; h++) { /* row h reads only rows > h of the old state */
        int src = n - hist + h;
        float v = 0;
#pragma unroll
        for (int q = 0; q < NT; q++)
            if (q == src) v = u[q];
        st[(long long)h * channels + r] = src >= 0 ? v : st[(long long)(hist + src) * channels + r];
    }
}

/* The rows of one weight by the fast path of kind K. */
template <int NT, int K, int RPW>
__device__ __forceinline__ void rows_kind(const cu_w &w, int row0, int c0, int cl, const float *sx, int padw, int n,
                                          int lane, float (*acc)[NT]) {
    if constexpr (K == KIND_BF16)
        rows_half<NT, true, RPW>(w, row0, c0, cl, sx, padw, n, lane, acc);
    else if constexpr (K == KIND_F16)
        rows_half<NT, false, RPW>(w, row0, c0, cl, sx, padw, n, lane, acc);
    else if constexpr (K == KIND_F32)
        rows_f32<NT>(w, row0, c0, cl, sx, padw, n, lane, acc);
    else if constexpr (K == KIND_FP8)
        rows_fp8<NT>(w, row0, c0, cl, sx, padw, n, lane, acc);
    else if constexpr (K == KIND_MXFP4)
        rows_mxfp4<NT, RPW>(w, row0, c0, cl, sx, padw, n, lane, acc);
    else if constexpr (K == KIND_MLX + 4 || K == KIND_MLX + 8) {
        if (w.sbf == SL_WF_BF16 && (w.group & (w.group - 1)) == 0)
            rows_mlx_fast<NT, K - KIND_MLX, RPW>(w, row0, c0, cl, sx, padw, n, lane, acc);
        else
            rows_mlx<NT, K - KIND_MLX, RPW>(w, row0, c0, cl, sx, padw, n, lane, acc);
    } else if constexpr (K > KIND_MLX)
        rows_mlx<NT, K - KIND_MLX, RPW>(w, row0, c0, cl, sx, padw, n, lane, acc);
    else
        rows_elem<NT, RPW>(w, row0, c0, cl, sx, padw, n, lane, acc);
}

/* K2 != K: a launch whose weights come in two kinds (MLX routers kept at 8 bits beside 4-bit projections). */
/* FX: the extras a variant has: 0 none, 1 the combined inputs (xu) and the gated or combining outputs (ysc,
 * cd), 2 those and the gated norm and the conv, 3 those of 1 and the routing, 4 the grouped MoE form: grid
 * row u is the group gunits[u] = (expert, start, count) of up to NT routed pairs of one expert, the pairs
 * gpairs[start ..]; rows past *gcount do nothing. Variants without an extra keep
 * their registers for the loads (the 4-row variants use all 128 that two blocks per SM leave them: one
 * more extra makes them spill). */
template <int NT, int K, int K2, int FX, int RPW>
__global__ void __launch_bounds__(GV_WARPS * 32, (NT == 1 && K == K2) || FX == 4 ? 2 : 1)
    gemv_k(const __grid_constant__ gv_set set, const cu_expert *table, const int32_t *ids, int which, int x_div,
           const float *x, const float *xu, int xmode, long long xs, int n, long long ys, long long yz, int chunk,
           const float *gz, const float *gw, int gdim, float geps, const float *ysc, const float *cd, const float *cw,
           int ck, const float *conv_w, int conv_k, float *conv_st, const float *rl, int rne, int rrenorm,
           int32_t *rids, float *rw, const int4 *gunits, const int *gpairs, const int *gcount) {
    constexpr int ROWS = GV_WARPS * RPW;
    extern __shared__ float4 smem4[];
    float *sx = (float *)smem4;
    int slot = blockIdx.y, total = set.g0[set.nw];
    if (!table && (int)blockIdx.x < total) {
        /* the weights do not depend on earlier kernels: start fetching this block's first rows into L2,
         * no more in all than half the L2 holds (lines evicted before use would be read twice) */
        int i = 0;
#pragma unroll
        for (int k = 1; k < SL_MATMUL_MULTI; k++)
            if (k < set.nw && (int)blockIdx.x >= set.g0[k]) i = k;
        const cu_w &w = set.w[i];
        int r0 = ((int)blockIdx.x - set.g0[i]) * ROWS, r1 = min(r0 + ROWS, w.rows);
        if (r0 < r1) {
            const uint8_t *p = w.data + (long long)r0 * w.row_bytes;
            long long bytes = min((long long)(r1 - r0) * w.row_bytes, (long long)GV_PREFETCH / gridDim.x);
            for (long long o = (long long)threadIdx.x * 128; o < bytes; o += (long long)blockDim.x * 128)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
        }
    }
    cu_pdl_enter();
    cu_w tw = set.w[0];
    const int *gp = NULL; /* FX 4: the group's pairs */
    if constexpr (FX == 4) {
        if (slot >= *gcount) return;
        int4 u = gunits[slot];
        tw = table[u.x].w[which + blockIdx.z];
        gp = gpairs + u.y;
        n = u.z;
    } else {
        x += (long long)(slot / x_div) * xs;
        if (FX && xu) xu += (long long)(slot / x_div) * xs;
    }
    int cols = tw.cols, padw = pad(chunk), single = cols <= chunk;
    /* a routing launch stages its input (every expert's weight has the same cols) while warp 0 routes */
    const bool prestaged = FX == 3 && rl && single && n == 1 && xmode == XM_PLAIN;
    if (FX == 3 && rl) {
        __shared__ int sel[32];
        int t = slot / x_div;
        if (threadIdx.x < 32) {
            bool out = blockIdx.x == 0 && blockIdx.z == 0 && slot % x_div == 0;
            cu_route_reg(rl + (long long)t * rne, rne, x_div, rrenorm, sel,
                         out ? rids + (long long)t * x_div : (int32_t *)NULL,
                         out ? rw + (long long)t * x_div : (float *)NULL);
        } else if (prestaged) {
            prestage(x, cols, sx);
        }
        __syncthreads();
        tw = table[sel[slot % x_div]].w[which + blockIdx.z];
    } else if (FX != 4 && table) {
        int id = ids[slot];
        if (id < 0) return; /* a pair another pass computes (see moe_pairs) */
        tw = table[id].w[which + blockIdx.z];
    }
    long long yoff = (FX == 4 ? 0 : (long long)slot * ys) + (long long)blockIdx.z * yz;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* grid-stride over groups of ROWS rows: the grid is sized to the GPU, so there is no ragged
     * last wave, and with one chunk the input is staged once per block */
    for (int rb = blockIdx.x; rb < total; rb += gridDim.x) {
        int i = 0;
#pragma unroll
        for (int k = 1; k < SL_MATMUL_MULTI; k++)
            if (k < set.nw && rb >= set.g0[k]) i = k;
        cu_w w = tw;
        float *y = set.y[0];
#pragma unroll
        for (int k = 1; k < SL_MATMUL_MULTI; k++)
            if (k == i) {
                if (!table) w = set.w[k];
                y = set.y[k];
            }
        y += yoff;
        int row0 = (rb - set.g0[i]) * ROWS + warp * RPW;
        float acc[RPW][NT];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[rr][t] = 0;
        for (int c0 = 0; c0 < cols; c0 += chunk) {
            int cl = min(chunk, cols - c0);
            if (!single || (rb == (int)blockIdx.x && !prestaged)) {
                __syncthreads();
                if constexpr (FX == 4)
                    stage_pairs(x, xu, xmode, xs, x_div, gp, c0, cl, n, sx, padw);
                else
                    stage(x, xu, FX ? xmode : XM_PLAIN, cols, c0, cl, n, sx, padw);
                __syncthreads();
                if (FX == 2 && gz) {
                    stage_norm_gate(gz, gw, gdim, geps, cols, c0, cl, n, sx, padw);
                    __syncthreads();
                }
            }
            if (row0 >= w.rows) continue;
            int kw = kind_of(w);
            if (kw == K)
                rows_kind<NT, K, RPW>(w, row0, c0, cl, sx, padw, n, lane, acc);
            else if (K2 != K && kw == K2)
                rows_kind<NT, K2, RPW>(w, row0, c0, cl, sx, padw, n, lane, acc);
            else /* an expert of another format than the one the launch was built for */
                rows_elem<NT, RPW>(w, row0, c0, cl, sx, padw, n, lane, acc);
        }
        /* every lane gets the sums of the warp's rows; lane rr finishes row row0 + rr, so the rows' epilogue
         * loads (bias, conv taps and state, routed outputs) are issued together */
        float mine[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) mine[t] = 0;
#pragma unroll
        for (int rr = 0; rr < RPW; rr++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = warp_sum(acc[rr][t]);
                if (lane == rr) mine[t] = v;
            }
        int r = row0 + lane;
        if (lane >= RPW || r >= w.rows) continue; /* warps reconverge at the next shuffle or barrier */
        float bv = w.bias ? w.bias[r] : 0.0f;
        if (FX == 2 && conv_w && i == 0) { /* the conv of this channel over the n tokens, then its state */
            float u[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) u[t] = mine[t] + bv;
            conv_row(u, n, r, w.rows, conv_w + (long long)r * conv_k, conv_k, conv_st, y);
        } else {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                float v = mine[t] + bv;
                float *o = y + (FX == 4 ? (long long)gp[t] * ys : (long long)t * w.rows) + r;
                if (FX)
                    cu_gemv_store(o, v, t, r, w.rows, ysc, cd, cw, ck);
                else
                    *o = v;
            }
        }
    }
}

static int chunk_for(int nt) {
    int c = (int)(GV_SMEM / (nt * 4 * 9 / 8)) / 256 * 256;
    return c < 256 ? 256 : c;
}

struct gv_call {
    gv_set set;
    const cu_expert *table;
    const int32_t *ids;
    int which, slots, nz, x_div;
    const float *x, *xu; /* xu: combined with x as xmode says */
    int xmode;
    const float *ysc;     /* per-token sigmoid scale of an accumulated result, or NULL */
    const float *cd, *cw; /* with ysc: the routed experts' outputs and weights the result starts from */
    int ck;
    const float *conv_w; /* weight 0's outputs through a causal conv + SiLU with taps conv_w, state conv_st */
    int conv_k;
    float *conv_st;
    const float *rl; /* routing inside the launch: logits [tokens][rne], ids and weights written to rids, rw */
    int rne, rrenorm;
    int32_t *rids;
    float *rw;
    long long x_stride, y_stride, yz;
    const float *gz, *gw; /* gz: the gate of a gated RMSNorm over groups of gdim applied to x, or NULL */
    int gdim;
    float geps;
    const int4 *gunits; /* grouped MoE launches (FX 4): the groups, their pairs and how many groups */
    const int *gpairs, *gcount;
};

template <int NT, int K, int K2, int FX, int RPW>
static void launch_k(cu_impl *c, const gv_call &g, const gv_set &set, int t0, int n) {
    int cols = set.w[0].cols;
    int chunk = chunk_for(NT);
    if (chunk > cols) chunk = (cols + 255) / 256 * 256;
    size_t smem = (size_t)NT * (size_t)(chunk + chunk / 32 * 4) * sizeof(float);
    int per_sm = cu_occupancy(c, (const void *)gemv_k<NT, K, K2, FX, RPW>, GV_WARPS * 32, smem);
    unsigned groups = (unsigned)set.g0[set.nw], fit = (unsigned)(c->sms * per_sm);
    /* one table launch covers many slots: the grid's y and z dimensions fill the GPU already */
    if (g.slots * g.nz > 1) fit = (fit + (unsigned)(g.slots * g.nz) - 1) / (unsigned)(g.slots * g.nz);
    dim3 grid(groups < fit ? groups : fit, (unsigned)g.slots, (unsigned)g.nz);
    long long xo = (long long)t0 * cols;
    cu_launch(c, gemv_k<NT, K, K2, FX, RPW>, grid, GV_WARPS * 32, smem, set, g.table, g.ids, g.which, g.x_div, g.x + xo,
              g.xu ? g.xu + xo : (const float *)NULL, g.xmode, g.x_stride, n, g.y_stride, g.yz, chunk,
              g.gz ? g.gz + xo : (const float *)NULL, g.gw, g.gdim, g.geps, g.ysc ? g.ysc + t0 : (const float *)NULL,
              g.cd ? g.cd + (long long)t0 * g.ck * set.w[0].rows : (const float *)NULL,
              g.cw ? g.cw + (long long)t0 * g.ck : (const float *)NULL, g.ck, g.conv_w, g.conv_k, g.conv_st, g.rl,
              g.rne, g.rrenorm, g.rids, g.rw, g.gunits, g.gpairs, g.gcount);
}

/* Variants with 4 rows a warp of 16-bit floats: of up to 4 tokens (their sums stay in registers), without the
 * gated norm, conv or routing; short_half says which weights take them. */
static constexpr bool half4(int nt, int fx) {
    return nt <= 4 && fx != 2 && fx != 3;
}

/* Rows a warp for w's rows: 4 for 16-bit rows of up to 1,024 values (a routed expert's down projection: with
 * 2, most of the 16 units a lane keeps in flight would be past the row's end), else 2 */
static int short_half(const cu_impl *c, const cu_w &w, int nt) {
    int k = kind_of(w);
    return c->half_rpw4 && nt <= 4 && (k == KIND_BF16 || k == KIND_F16) && w.cols <= 1024 ? 4 : 2;
}

/* One kind, with the extras FX (see gemv_k). */
template <int NT, int FX>
static void launch_kind(cu_impl *c, const gv_call &g, const gv_set &set, int t0, int n, int kind, int rpw) {
    if constexpr (NT == 1) {
        if (rpw == 4 && kind == KIND_MLX + 4) return launch_k<1, KIND_MLX + 4, KIND_MLX + 4, FX, 4>(c, g, set, t0, n);
        if (rpw == 4 && kind == KIND_MLX + 8) return launch_k<1, KIND_MLX + 8, KIND_MLX + 8, FX, 4>(c, g, set, t0, n);
    }
    switch (kind) {
    case KIND_BF16:
        if constexpr (half4(NT, FX))
            if (rpw == 4) return launch_k<NT, KIND_BF16, KIND_BF16, FX, 4>(c, g, set, t0, n);
        launch_k<NT, KIND_BF16, KIND_BF16, FX, 2>(c, g, set, t0, n);
        break;
    case KIND_F16:
        if constexpr (half4(NT, FX))
            if (rpw == 4) return launch_k<NT, KIND_F16, KIND_F16, FX, 4>(c, g, set, t0, n);
        launch_k<NT, KIND_F16, KIND_F16, FX, 2>(c, g, set, t0, n);
        break;
    case KIND_F32: launch_k<NT, KIND_F32, KIND_F32, FX, 2>(c, g, set, t0, n); break;
    case KIND_FP8: launch_k<NT, KIND_FP8, KIND_FP8, FX, 2>(c, g, set, t0, n); break;
    case KIND_MXFP4: launch_k<NT, KIND_MXFP4, KIND_MXFP4, FX, 2>(c, g, set, t0, n); break;
    case KIND_MLX + 2: launch_k<NT, KIND_MLX + 2, KIND_MLX + 2, FX, 2>(c, g, set, t0, n); break;
    case KIND_MLX + 3: launch_k<NT, KIND_MLX + 3, KIND_MLX + 3, FX, 2>(c, g, set, t0, n); break;
    case KIND_MLX + 4: launch_k<NT, KIND_MLX + 4, KIND_MLX + 4, FX, 2>(c, g, set, t0, n); break;
    case KIND_MLX + 5: launch_k<NT, KIND_MLX + 5, KIND_MLX + 5, FX, 2>(c, g, set, t0, n); break;
    case KIND_MLX + 6: launch_k<NT, KIND_MLX + 6, KIND_MLX + 6, FX, 2>(c, g, set, t0, n); break;
    case KIND_MLX + 8: launch_k<NT, KIND_MLX + 8, KIND_MLX + 8, FX, 2>(c, g, set, t0, n); break;
    default: launch_k<NT, KIND_ELEM, KIND_ELEM, FX, 2>(c, g, set, t0, n); break;
    }
}

/* The kinds a launch of two kinds can pair: 4-bit MLX projections with the 8-bit routers beside them. */
static int pairable(int k1, int k2) {
    return (k1 == KIND_MLX + 4 && k2 == KIND_MLX + 8) || (k1 == KIND_MLX + 8 && k2 == KIND_MLX + 4);
}

template <int NT> static void launch_nt(cu_impl *c, const gv_call &g, const gv_set &set0, int t0, int n) {
    gv_set set = set0;
    int k1 = kind_of(set.w[0]), k2 = k1;
    for (int i = 1; i < set.nw; i++)
        if (kind_of(set.w[i]) != k1) k2 = kind_of(set.w[i]);
    /* 4 rows per warp for expert launches (whose blocks each route first) and short rows (measured on
     * H100). Elsewhere the count that finishes first: the resident blocks (two per SM, one for a pair of
     * kinds) run their row groups in rounds, so a launch takes about rounds x rows per warp; 2 rows
     * unless 4 saves a tenth (the delta-net input projections, 386 groups of 4 rows on 264 blocks, take
     * 2 rounds of 4 rows where 3 rounds of 2 would do). A pair of kinds is 4 and 8 bits. */
    int quant = k1 == KIND_MLX + 4 || k1 == KIND_MLX + 8, rpw = 2;
    if (NT == 1 && quant) {
        long long g4 = 0, g2 = 0, fit = (long long)c->sms * (k2 != k1 ? 1 : 2);
        for (int i = 0; i < set.nw; i++) {
            g4 += CU_BLOCKS(set.w[i].rows, GV_WARPS * 4);
            g2 += CU_BLOCKS(set.w[i].rows, GV_WARPS * 2);
        }
        long long c4 = (g4 + fit - 1) / fit * 4, c2 = (g2 + fit - 1) / fit * 2;
        if (g.table || set.w[0].cols <= 512)
            rpw = 4;
        else if (c->rpw_balance)
            rpw = c2 * 10 < c4 * 9 ? 2 : 4;
        else if (g4 >= c->sms)
            rpw = 4;
    }
    if (!g.rl && !g.gz && !g.conv_w && k2 == k1) { /* 4 when every weight of the launch takes them */
        int all = 1;
        for (int i = 0; i < set.nw; i++) all &= short_half(c, set.w[i], NT) == 4;
        if (all) rpw = 4;
    }
    set.g0[0] = 0;
    for (int i = 0; i < set.nw; i++) set.g0[i + 1] = set.g0[i] + (int)CU_BLOCKS(set.w[i].rows, GV_WARPS * rpw);
    if (k2 != k1) {
        if (rpw == 4) {
            if constexpr (NT == 1) {
                if (k1 == KIND_MLX + 4)
                    launch_k<1, KIND_MLX + 4, KIND_MLX + 8, 0, 4>(c, g, set, t0, n);
                else
                    launch_k<1, KIND_MLX + 8, KIND_MLX + 4, 0, 4>(c, g, set, t0, n);
            }
        } else if (k1 == KIND_MLX + 4)
            launch_k<NT, KIND_MLX + 4, KIND_MLX + 8, 0, 2>(c, g, set, t0, n);
        else
            launch_k<NT, KIND_MLX + 8, KIND_MLX + 4, 0, 2>(c, g, set, t0, n);
        return;
    }
    if (g.rl) { /* a routing launch is one token's */
        if constexpr (NT == 1)
            launch_kind<1, 3>(c, g, set, t0, n, k1, rpw);
        else
            cu_fail(c, "a routing GEMV launch takes one token");
    } else if (g.gz || g.conv_w)
        launch_kind<NT, 2>(c, g, set, t0, n, k1, rpw);
    else if (g.xu || g.ysc || g.cd)
        launch_kind<NT, 1>(c, g, set, t0, n, k1, rpw);
    else
        launch_kind<NT, 0>(c, g, set, t0, n, k1, rpw);
}

/* GGML weights go through their own kernels (cuda_ggml.cu), one launch per weight; of the extras those
 * take only the SwiGLU input. The fused ops send GGML weights to their unfused forms (see has_kernel), so
 * another extra here is a fault of the caller. Returns 1 when g holds GGML weights (run or failed). */
static int gemv_ggml(cu_impl *c, const gv_call &g, int n) {
    int any = 0;
    for (int i = 0; i < g.set.nw; i++) any |= g.set.w[i].fmt == SL_WF_GGML;
    if (!any) return 0;
    int epi = g.ysc || g.cd; /* the integer GEMV's epilogue: one weight, one token (cu_mmvq_epilogue) */
    if (g.rl || g.gz || g.conv_w || (g.xu && g.xmode != XM_SWIGLU) ||
        (epi && !(g.set.nw == 1 && n == 1 && !g.table && c->mmvq && cu_mmvq_takes(&g.set.w[0])))) {
        cu_fail(c, "GGML weights have no fused GEMV kernel for this op");
        return 1;
    }
    cu_q16 xq = {NULL, NULL, NULL, NULL, NULL}; /* the input in q16, made once for the weights that take it */
    gg_call run[SL_MATMUL_MULTI];         /* consecutive weights of one type for one integer GEMV launch */
    int nrun = 0;
    for (int i = 0; i <= g.set.nw; i++) {
        if (i < g.set.nw && g.set.w[i].fmt != SL_WF_GGML) {
            cu_fail(c, "one GEMV launch holds GGML and other weights");
            return 1;
        }
        int mq = i < g.set.nw && c->mmvq && cu_mmvq_takes(&g.set.w[i]);
        if (nrun && (!mq || g.set.w[i].gtype != run[0].w->gtype || nrun == 4 || g.table)) {
            cu_mmvq(c, run, nrun, xq, n);
            nrun = 0;
        }
        if (i == g.set.nw) break;
        gg_call q = {&g.set.w[i],
                     g.table,
                     g.ids,
                     g.which,
                     g.slots,
                     g.nz,
                     g.x_div,
                     g.xu != NULL,
                     g.x,
                     g.x_stride,
                     g.xu ? (long long)(g.xu - g.x) : 0,
                     g.set.y[i],
                     g.y_stride,
                     g.yz,
                     g.ysc,
                     g.cd,
                     g.cw,
                     g.ck};
        if (mq) {
            if (!xq.h && cu_q16_quantize(c, q, n, &xq)) return 1;
            run[nrun++] = q;
        } else {
            cu_ggml_gemv(c, q, n);
        }
    }
    return 1;
}

/* Every weight of g.set must have the same kind and cols. */
static void gemv_run(cu_impl *c, gv_call &g, int n) {
    if (gemv_ggml(c, g, n)) return;
    gv_set &s = g.set;
    /* batches of up to 8 tokens per launch; each launch reads the weights once */
    for (int t0 = 0; t0 < n; t0 += 8) {
        int m = n - t0 < 8 ? n - t0 : 8;
        gv_set st = s;
        for (int i = 0; i < s.nw; i++) st.y[i] = s.y[i] + (long long)t0 * s.w[i].rows;
        if (m == 1)
            launch_nt<1>(c, g, st, t0, 1);
        else if (m == 2)
            launch_nt<2>(c, g, st, t0, 2);
        else if (m <= 4)
            launch_nt<4>(c, g, st, t0, m);
        else
            launch_nt<8>(c, g, st, t0, m);
    }
    cu_check_launch(c, "matrix-vector kernel");
}

static gv_call plain_call(const cu_w *w, float *y, const float *x, const float *xu, int xmode) {
    gv_call g;
    memset(&g, 0, sizeof g);
    g.set.w[0] = *w;
    g.set.y[0] = y;
    g.set.nw = 1;
    g.slots = g.nz = g.x_div = 1;
    g.x = x;
    g.xu = xu;
    g.xmode = xmode;
    return g;
}

void cu_gemv_launch(cu_impl *c, const cu_w *w, const cu_expert *table, const int32_t *ids, int which, int slots,
                    int x_div, const float *x, long long x_stride, int n, float *y, long long y_stride) {
    gv_call g = plain_call(w, y, x, NULL, XM_PLAIN);
    g.table = table;
    g.ids = ids;
    g.which = which;
    g.slots = slots;
    g.x_div = x_div;
    g.x_stride = x_stride;
    g.y_stride = y_stride;
    gemv_run(c, g, n);
}

int cu_moe_routes(int ne, int k) {
    /* the gate/up launch routes with the logits in one warp's registers */
    return ne <= 32 * CU_ROUTE_REG && k <= 32;
}

/* The two launches of routed experts over `rows` grid rows for `pairs` routed pairs: gate and up together
 * (grid z) into gu[pair] and gu[pairs * inter + pair], then down of silu(gate) * up into d[pair]. */
static void moe_calls(const cu_w *gate, const cu_w *down, const cu_expert *table, int rows, int pairs, int k,
                      const float *x, int hidden, float *gu, float *d, gv_call *g1, gv_call *g2) {
    int inter = gate->rows;
    long long yz = (long long)pairs * inter;
    *g1 = plain_call(gate, gu, x, NULL, XM_PLAIN);
    g1->table = table;
    g1->slots = rows;
    g1->nz = 2;
    g1->x_div = k;
    g1->x_stride = hidden;
    g1->y_stride = inter;
    g1->yz = yz;
    *g2 = plain_call(down, d, gu, gu + yz, XM_SWIGLU);
    g2->table = table;
    g2->which = 2;
    g2->slots = rows;
    g2->x_stride = inter;
    g2->y_stride = hidden;
}

void cu_moe_gemv(cu_impl *c, const cu_w *gate, const cu_w *up, const cu_w *down, const cu_expert *table, int32_t *ids,
                 int slots, int k, const float *x, int hidden, float *gu, float *d, const float *logits, int ne,
                 int renorm, float *weights) {
    int inter = gate->rows;
    long long yz = (long long)slots * inter;
    int ggml = gate->fmt == SL_WF_GGML || up->fmt == SL_WF_GGML || down->fmt == SL_WF_GGML;
    if (ggml && logits) {
        cu_fail(c, "moe: GGML experts take their ids from a separate routing kernel");
        return;
    }
    gv_call g1, g2;
    moe_calls(gate, down, table, slots, slots, k, x, hidden, gu, d, &g1, &g2);
    if (ggml && (gate->fmt != up->fmt || gate->gtype != up->gtype)) {
        /* GGML kernels are specialised per type, so gate and up of different types take one launch each */
        for (int z = 0; z < 2; z++)
            cu_gemv_launch(c, z ? up : gate, table, ids, z, slots, k, x, hidden, 1, gu + z * yz, inter);
    } else {
        /* gate and up of every routed slot in one launch, routing first when logits are given */
        g1.ids = ids;
        g1.rl = logits;
        g1.rne = ne;
        g1.rrenorm = renorm;
        g1.rids = ids;
        g1.rw = weights;
        gemv_run(c, g1, 1);
    }
    g2.ids = ids;
    gemv_run(c, g2, 1);
}

int cu_moe_group_size(int hidden) {
    /* the gate/up launch stages a group's inputs once per block when they fit its shared memory */
    return hidden <= chunk_for(8) ? 8 : 4;
}

template <int NT> static void grouped_run(cu_impl *c, const gv_call &g) {
    gv_set set = g.set;
    int rpw = short_half(c, set.w[0], NT);
    set.g0[0] = 0;
    set.g0[1] = (int)CU_BLOCKS(set.w[0].rows, GV_WARPS * rpw);
    launch_kind<NT, 4>(c, g, set, 0, NT, kind_of(set.w[0]), rpw);
}

void cu_moe_grouped(cu_impl *c, const cu_w *gate, const cu_w *down, const cu_expert *table, const int4 *units,
                    const int *pairs, const int *count, int max_units, int gsize, int slots, int k, const float *x,
                    int hidden, float *gu, float *d) {
    gv_call g1, g2; /* a grid row per group of pairs */
    moe_calls(gate, down, table, max_units, slots, k, x, hidden, gu, d, &g1, &g2);
    g1.gunits = units;
    g1.gpairs = pairs;
    g1.gcount = count;
    g2.gunits = units;
    g2.gpairs = pairs;
    g2.gcount = count;
    if (gsize == 8) {
        grouped_run<8>(c, g1);
        grouped_run<8>(c, g2);
    } else {
        grouped_run<4>(c, g1);
        grouped_run<4>(c, g2);
    }
    cu_check_launch(c, "grouped expert kernels");
}

void cu_grouped_launch(cu_impl *c, const cu_w *w, const cu_expert *table, int which, int nz, const int4 *units,
                       const int *pairs, const int *count, int max_units, int gsize, const float *x, int x_div,
                       long long x_stride, float *y, long long y_stride, long long yz) {
    gv_call g = plain_call(w, y, x, NULL, XM_PLAIN);
    g.table = table;
    g.which = which;
    g.slots = max_units;
    g.nz = nz;
    g.x_div = x_div;
    g.x_stride = x_stride;
    g.y_stride = y_stride;
    g.yz = yz;
    g.gunits = units;
    g.gpairs = pairs;
    g.gcount = count;
    if (gsize == 8)
        grouped_run<8>(c, g);
    else
        grouped_run<4>(c, g);
    cu_check_launch(c, "grouped expert kernels");
}

__global__ void dequant_split_k(cu_w w, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, total = (long long)w.rows * w.cols;
    if (i >= total) return;
    float v = w_elem(w, (int)(i / w.cols), (int)(i % w.cols));
    __nv_bfloat16 h = __float2bfloat16(v);
    hi[i] = h;
    if (lo) lo[i] = __float2bfloat16(v - __bfloat162float(h));
}

__global__ void split_bf16_k(const float *x, long long len, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    __nv_bfloat16 h = __float2bfloat16(x[i]);
    hi[i] = h;
    if (lo) lo[i] = __float2bfloat16(x[i] - __bfloat162float(h));
}

__global__ void add_bias_k(float *y, const float *bias, int rows, long long len) {
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) y[i] += bias[i % rows];
}

/* Formats the fused GEMV ops take; GGML weights go one matmul at a time through their own kernels. */
static int has_kernel(const sl_weight *w) {
    return w->fmt == SL_WF_F32 || w->fmt == SL_WF_F16 || w->fmt == SL_WF_BF16 || w->fmt == SL_WF_MLX ||
           w->fmt == SL_WF_FP8 || w->fmt == SL_WF_MXFP4;
}

/* Whether a tensor-core product of sw rounds its operands to bf16 in one pass: weights marked exact (those
 * of mixture-of-experts models, whose routing one pass moves) split them instead (see cu_matmul). */
static int gemm_exact(const cu_impl *c, const sl_weight *sw) {
    return c->gemm_exact > 0 || (c->gemm_exact == 0 && sw->exact);
}

/* GGML weights take the tile-decoding tensor-core kernel for small batches (in bf16 halves where exact). */
static int mmq_takes(const cu_impl *c, const sl_weight *sw) {
    return c->mmq_min > 0 && sw->fmt == SL_WF_GGML;
}

static int is_float(const sl_weight *w) {
    return w->fmt == SL_WF_F32 || w->fmt == SL_WF_F16 || w->fmt == SL_WF_BF16;
}

/* Small exact float weights: a MoE router, a shared expert's gate. */
static int small_exact(const cu_impl *c, const sl_weight *w) {
    return is_float(w) && gemm_exact(c, w) && (long long)w->rows * w->cols <= (1 << 20);
}

/* Those in fp32, as rows cuBLAS can read, past one GEMV launch of 8 tokens go through one fp32 cuBLAS product
 * (gemm_f32): fp32 products and sums as in the GEMV, where the GEMV took two launches of few blocks
 * (qwen3.5-35b-a3b's router and shared gate at 16 tokens: 17 blocks, 18 us each). */
static int small_f32(const cu_impl *c, const sl_weight *w) {
    return c->f32_gemm && w->fmt == SL_WF_F32 && !w->transposed && w->row_bytes % 16 == 0 &&
           (uintptr_t)w->data % 16 == 0 && small_exact(c, w);
}

/* The largest batch a weight's GEMV kernels take before the tensor-core GEMM does. Float weights go to the
 * GEMM from 3 tokens, which beats the GEMV kernels' time growing with every token (llama3-8b bf16 on H100,
 * sequences decoding at once: 4 at 515 against 297 tok/s, 16 at 1046 against 302 when it split in two
 * passes). GGML weights go to the tile-decoding tensor-core kernel from SLUICE_CUDA_MMQ_MIN tokens; other quantized
 * weights keep the GEMV kernels to 16 tokens, since their GEMM first dequantizes the whole matrix.
 * SLUICE_CUDA_GEMV_MAX sets one limit for all. */
static int gemv_max(const cu_impl *c, const sl_weight *w) {
    if (c->gemv_max > 0) return c->gemv_max;
    /* exact weights: the GEMV's one pass of up to 8 tokens beats three products per tile there */
    if (w->fmt == SL_WF_GGML && mmq_takes(c, w)) return gemm_exact(c, w) && c->mmq_min <= 8 ? 8 : c->mmq_min - 1;
    /* small exact float weights: two GEMV passes at 16 tokens cost less than splitting weight and input into
     * halves and two or three GEMMs, four launches a call (fp32 ones take gemm_f32 past 8 instead) */
    if (small_exact(c, w)) return small_f32(c, w) ? 8 : 16;
    return is_float(w) ? 2 : 16;
}

/* Whether cu_matmul has a kernel for sw's format at all (the others fail there by name). */
static int matmul_takes(const sl_weight *sw) {
    return has_kernel(sw) || (sw->fmt == SL_WF_GGML && cu_ggml_supported(sw->gtype));
}

/* x rounded to bf16 for the tensor cores (with exact, also the remainder x - hi in bf16) in the input scratch:
 * the one rounding every product of a matmul_multi call on that input shares */
static int gemm_input(cu_impl *c, const float *x, int n, int cols, int exact, const __nv_bfloat16 **hi,
                      const __nv_bfloat16 **lo);
/* y = x sw on tensor cores from the input as gemm_input rounded it (xlo: the exact mode's remainder) */
static void gemm_rounded(cu_impl *c, const sl_weight *sw, const __nv_bfloat16 *xhi, const __nv_bfloat16 *xlo, int n,
                         float *y);

static void matmul_one(cu_impl *c, const sl_weight *sw, const float *x, int n, float *y);
static int takes_f32(const cu_impl *c, const sl_weight *sw, int n);
static void gemm_f32(cu_impl *c, const sl_weight *sw, const float *x, int n, float *y);

/* Whether cu_matmul takes sw for n tokens through the small-batch tile kernels (cu_ggml_mmq). */
static int takes_mmq(const cu_impl *c, const sl_weight *sw, int n) {
    return matmul_takes(sw) && n > gemv_max(c, sw) && n <= CU_MMQ_MAX && mmq_takes(c, sw);
}

void cu_matmul(sl_backend *b, const sl_weight *sw, const float *x, int n, float *y) {
    cu_impl *c = cu_of(b);
    cu_q16_enter(c);
    matmul_one(c, sw, x, n, y);
    cu_q16_leave(c);
}

static void matmul_one(cu_impl *c, const sl_weight *sw, const float *x, int n, float *y) {
    if (!matmul_takes(sw)) {
        char buf[64];
        cu_fail(c, "matmul: weight format %s has no CUDA kernel", sl_wfmt_name(sw, buf, sizeof buf));
        return;
    }
    cu_w w = cu_w_of(sw);
    if (n <= gemv_max(c, sw)) {
        cu_gemv_launch(c, &w, NULL, NULL, 0, 1, 1, x, 0, n, y, 0);
        return;
    }
    /* Tensor cores take bf16: one pass rounds the input (and any weight not stored in bf16) to bf16, as
     * other engines do. Weights marked exact (those of mixture-of-experts models, whose routing a bf16
     * pass moves) split each operand into bf16 hi + lo halves and sum the products that matter in fp32
     * (hi.hi + hi.lo, + lo.hi for weights that are not bf16 already), close to fp32 accuracy at 2-3 GEMMs.
     * SLUICE_CUDA_PREFILL=exact splits every weight, =bf16 none. */
    if (takes_mmq(c, sw, n)) { /* bias included */
        cu_ggml_mmq(c, &w, x, n, gemm_exact(c, sw), y);
        return;
    }
    if (takes_f32(c, sw, n)) {
        gemm_f32(c, sw, x, n, y);
        return;
    }
    int exact = gemm_exact(c, sw);
    const __nv_bfloat16 *xhi, *xlo;
    if (gemm_input(c, x, n, w.cols, exact, &xhi, &xlo)) return;
    gemm_rounded(c, sw, xhi, xlo, n, y);
}

/* Whether a batch of n tokens on sw takes gemm_f32: the small exact fp32 weights past the GEMV's tokens. */
static int takes_f32(const cu_impl *c, const sl_weight *sw, int n) {
    return small_f32(c, sw) && n > gemv_max(c, sw);
}

/* The bias of sw added to a cuBLAS product's n rows y (which cuBLAS leaves without it). */
static void gemm_bias(cu_impl *c, const sl_weight *sw, int n, float *y) {
    if (!sw->bias) return;
    size_t len = (size_t)n * (size_t)sw->rows;
    cu_launch(c, add_bias_k, CU_BLOCKS(len, 256), 256, 0, y, sw->bias, sw->rows, (long long)len);
}

/* y[n][rows] = x[n][cols] . W^T (+ bias) in fp32 on cuBLAS (no tensor cores: CUBLAS_COMPUTE_32F). */
static void gemm_f32(cu_impl *c, const sl_weight *sw, const float *x, int n, float *y) {
    const float one = 1.0f, zero = 0.0f;
    int ld = (int)(sw->row_bytes / sizeof(float));
    cublasStatus_t st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, sw->rows, n, sw->cols, &one, sw->data,
                                     CUDA_R_32F, ld, x, CUDA_R_32F, sw->cols, &zero, y, CUDA_R_32F, sw->rows,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cu_fail(c, "cuBLAS fp32 GEMM of %d x %d by %d tokens failed (status %d)", sw->rows, sw->cols, n, (int)st);
        return;
    }
    gemm_bias(c, sw, n, y);
    cu_check_launch(c, "fp32 matmul");
}

/* Whether cu_matmul takes sw for n tokens through the cuBLAS product of gemm_rounded. */
static int takes_gemm(const cu_impl *c, const sl_weight *sw, int n) {
    return matmul_takes(sw) && n > gemv_max(c, sw) && !takes_mmq(c, sw, n) && !takes_f32(c, sw, n);
}

static int gemm_input(cu_impl *c, const float *x, int n, int cols, int exact, const __nv_bfloat16 **hi,
                      const __nv_bfloat16 **lo) {
    size_t xlen = (size_t)n * (size_t)cols;
    if (cu_grow(c, &c->xtmp, &c->xtmp_len, xlen * 2 * (exact ? 2 : 1), "matmul input")) return -1;
    __nv_bfloat16 *xhi = (__nv_bfloat16 *)c->xtmp, *xlo = exact ? xhi + xlen : NULL;
    cu_launch(c, split_bf16_k, CU_BLOCKS(xlen, 256), 256, 0, x, (long long)xlen, xhi, xlo);
    *hi = xhi;
    *lo = xlo;
    return 0;
}

static void gemm_rounded(cu_impl *c, const sl_weight *sw, const __nv_bfloat16 *xhi, const __nv_bfloat16 *xlo, int n,
                         float *y) {
    cu_w w = cu_w_of(sw);
    int exact = xlo != NULL;
    size_t wlen = (size_t)w.rows * (size_t)w.cols;
    const void *whi = w.data, *wlo = NULL;
    if (w.fmt != SL_WF_BF16 || w.trans) {
        if (cu_grow(c, &c->wtmp, &c->wtmp_len, wlen * 2 * (exact ? 2 : 1), "matmul weight")) return;
        whi = c->wtmp;
        wlo = exact ? (const void *)((__nv_bfloat16 *)c->wtmp + wlen) : NULL;
        if (w.fmt == SL_WF_GGML)
            cu_ggml_dequant_split(c, &w, (__nv_bfloat16 *)c->wtmp, (__nv_bfloat16 *)wlo);
        else
            cu_launch(c, dequant_split_k, CU_BLOCKS(wlen, 256), 256, 0, w, (__nv_bfloat16 *)c->wtmp,
                      (__nv_bfloat16 *)wlo);
    }
    const void *pa[3] = {whi, whi, wlo}, *pb[3] = {xhi, xlo, xhi};
    int passes = !exact ? 1 : wlo ? 3 : 2;
    for (int k = 0; k < passes; k++) {
        const float one = 1.0f, beta = k ? 1.0f : 0.0f;
        /* column-major view: y^T[rows][n] = W[cols][rows]^T . x^T[cols][n] */
        cublasStatus_t st =
            cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, w.rows, n, w.cols, &one, pa[k], CUDA_R_16BF, w.cols, pb[k],
                         CUDA_R_16BF, w.cols, &beta, y, CUDA_R_32F, w.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            cu_fail(c, "cuBLAS GEMM of %d x %d by %d tokens failed (status %d)", w.rows, w.cols, n, (int)st);
            return;
        }
    }
    gemm_bias(c, sw, n, y);
    cu_check_launch(c, "matmul");
}

static void matmul_multi(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y,
                         const float *conv_w, int conv_k, float *conv_st);

void cu_matmul_multi(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y) {
    cu_q16_enter(cu_of(b));
    matmul_multi(b, nw, w, x, n, y, NULL, 0, NULL);
    cu_q16_leave(cu_of(b));
}

static void multi_conv(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y,
                       const float *conv_w, int kernel, float *state);

void cu_matmul_multi_conv(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y,
                          const float *conv_w, int kernel, float *state) {
    cu_q16_enter(cu_of(b));
    multi_conv(b, nw, w, x, n, y, conv_w, kernel, state);
    cu_q16_leave(cu_of(b));
}

static void multi_conv(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y,
                       const float *conv_w, int kernel, float *state) {
    cu_impl *c = cu_of(b);
    if (nw < 1) return;
    if (!cu_gemv_takes(c, w[0], n) || kernel < 1) {
        /* tensor-core batches: weight 0's product in a scratch buffer, then the conv */
        size_t len = (size_t)n * (size_t)w[0]->rows;
        if (cu_grow(c, (void **)&c->act, &c->act_len, len * sizeof(float), "conv input")) return;
        float *yy[SL_MATMUL_MULTI];
        for (int i = 0; i < nw && i < SL_MATMUL_MULTI; i++) yy[i] = i ? y[i] : c->act;
        matmul_multi(b, nw, w, x, n, yy, NULL, 0, NULL);
        cu_conv1d_silu(b, c->act, n, w[0]->rows, conv_w, kernel, state, y[0]);
        return;
    }
    matmul_multi(b, nw, w, x, n, y, conv_w, kernel, state);
}

static void matmul_multi(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y,
                         const float *conv_w, int conv_k, float *conv_st) {
    cu_impl *c = cu_of(b);
    int done[SL_MATMUL_MULTI] = {0};
    for (int i = 0; i < nw && i < SL_MATMUL_MULTI; i++) {
        if (done[i]) continue;
        /* GGML weights of one width share the q16 input, and those of one type a launch (gemv_ggml) */
        if (w[i]->fmt == SL_WF_GGML && cu_ggml_supported(w[i]->gtype) && n <= gemv_max(c, w[i]) && !conv_w) {
            cu_w wi = cu_w_of(w[i]);
            gv_call g = plain_call(&wi, y[i], x, NULL, XM_PLAIN);
            for (int j = i + 1; j < nw && j < SL_MATMUL_MULTI; j++)
                if (!done[j] && w[j]->fmt == SL_WF_GGML && cu_ggml_supported(w[j]->gtype) && w[j]->cols == w[i]->cols) {
                    g.set.w[g.set.nw] = cu_w_of(w[j]);
                    g.set.y[g.set.nw++] = y[j];
                    done[j] = 1;
                }
            gemv_run(c, g, n);
            continue;
        }
        if (takes_f32(c, w[i], n)) {
            gemm_f32(c, w[i], x, n, y[i]);
            continue;
        }
        /* cuBLAS products: the weights of the same width and mode after i share one rounding of the input */
        if (takes_gemm(c, w[i], n)) {
            int exact = gemm_exact(c, w[i]);
            const __nv_bfloat16 *xhi, *xlo;
            if (gemm_input(c, x, n, w[i]->cols, exact, &xhi, &xlo)) return;
            for (int j = i; j < nw && j < SL_MATMUL_MULTI; j++)
                if (!done[j] && takes_gemm(c, w[j], n) && w[j]->cols == w[i]->cols && gemm_exact(c, w[j]) == exact) {
                    gemm_rounded(c, w[j], xhi, xlo, n, y[j]);
                    done[j] = 1;
                }
            continue;
        }
        /* small batches on GGML weights: the weights after i that take the same form of the input share one
         * conversion of it (cu_ggml_mmq_in) */
        if (takes_mmq(c, w[i], n)) {
            cu_w wi = cu_w_of(w[i]);
            cu_mmq_in in;
            if (cu_ggml_mmq_in(c, &wi, x, NULL, n, gemm_exact(c, w[i]), &in)) return;
            cu_w ws[SL_MATMUL_MULTI];
            float *ys[SL_MATMUL_MULTI];
            int m = 0;
            for (int j = i; j < nw && j < SL_MATMUL_MULTI; j++) {
                if (done[j] || !takes_mmq(c, w[j], n)) continue;
                cu_w wj = cu_w_of(w[j]);
                if (!cu_ggml_mmq_same(c, &wj, gemm_exact(c, w[j]), in)) continue;
                ws[m] = wj;
                ys[m++] = y[j];
                done[j] = 1;
            }
            cu_ggml_mmq_run(c, ws, m, in, ys);
            continue;
        }
        /* other tensor-core batches and formats without a GEMV kernel go one by one (the latter fail there) */
        if (n > gemv_max(c, w[i]) || !has_kernel(w[i])) {
            matmul_one(c, w[i], x, n, y[i]);
            continue;
        }
        /* one launch for the weights of i's kernel variant: a launch is compiled for one format */
        cu_w wi = cu_w_of(w[i]);
        gv_call g = plain_call(&wi, y[i], x, NULL, XM_PLAIN);
        for (int j = i + 1; j < nw && j < SL_MATMUL_MULTI; j++) {
            if (done[j] || !has_kernel(w[j]) || w[j]->cols != w[i]->cols) continue;
            cu_w wj = cu_w_of(w[j]);
            int kj = kind_of(wj), ki = kind_of(wi);
            /* one other kind may join when the pair has a two-kind kernel */
            int other = ki;
            for (int q = 1; q < g.set.nw; q++)
                if (kind_of(g.set.w[q]) != ki) other = kind_of(g.set.w[q]);
            /* (two-kind launches have no epilogue extras: not with the conv) */
            if (kj != ki && (conv_w || (other != ki ? kj != other : !pairable(ki, kj)))) continue;
            g.set.w[g.set.nw] = wj;
            g.set.y[g.set.nw++] = y[j];
            done[j] = 1;
        }
        if (i == 0) { /* weight 0 is first in the first launch */
            g.conv_w = conv_w;
            g.conv_k = conv_k;
            g.conv_st = conv_st;
        }
        gemv_run(c, g, n);
    }
}

void cu_swiglu_matmul(sl_backend *b, const sl_weight *sw, const float *gt, const float *u, int n, const float *gate,
                      float *y) {
    cu_impl *c = cu_of(b);
    /* Forming the SwiGLU while staging pays when the input is staged once per block; wider inputs are
     * restaged per row group and per chunk (an MLP's down projection: 1.4 ms/token slower on llama3-8b
     * than the separate SwiGLU), so those and tensor-core batches take it from a scratch buffer. */
    if (!gate && takes_mmq(c, sw, n)) { /* the tile kernels' input conversion forms the SwiGLU */
        cu_w w = cu_w_of(sw);
        cu_mmq_in in;
        if (cu_ggml_mmq_in(c, &w, gt, u, n, gemm_exact(c, sw), &in)) return;
        cu_ggml_mmq_run(c, &w, 1, in, &y);
        return;
    }
    if (!cu_mmvq_epilogue(c, sw, n) && (n > gemv_max(c, sw) || !has_kernel(sw) || sw->cols > chunk_for(8))) {
        size_t len = (size_t)n * (size_t)sw->cols, out = gate ? (size_t)n * (size_t)sw->rows : 0;
        if (cu_grow(c, (void **)&c->act, &c->act_len, (len + out) * sizeof(float), "SwiGLU input")) return;
        cu_swiglu(b, gt, u, len, c->act);
        cu_matmul(b, sw, c->act, n, gate ? c->act + len : y);
        if (gate) cu_add_gated(c, y, c->act + len, gate, n, sw->rows);
        return;
    }
    cu_w w = cu_w_of(sw);
    gv_call g = plain_call(&w, y, gt, u, XM_SWIGLU);
    g.ysc = gate;
    gemv_run(c, g, n);
}

void cu_shared_down(cu_impl *c, const sl_weight *sw, const float *gt, const float *u, int n, const float *gate,
                    const float *d, const float *weights, int k, float *y) {
    cu_w w = cu_w_of(sw);
    gv_call g = plain_call(&w, y, gt, u, XM_SWIGLU);
    g.ysc = gate;
    g.cd = d;
    g.cw = weights;
    g.ck = k;
    gemv_run(c, g, n);
}

int cu_gemv_takes(cu_impl *c, const sl_weight *w, int n) {
    return n <= gemv_max(c, w) && has_kernel(w);
}

void cu_sigmoid_matmul(sl_backend *b, const sl_weight *sw, const float *x, const float *gt, int n, float *y) {
    cu_impl *c = cu_of(b);
    if (n > gemv_max(c, sw) || !has_kernel(sw)) {
        size_t len = (size_t)n * (size_t)sw->cols;
        if (cu_grow(c, (void **)&c->act, &c->act_len, len * sizeof(float), "gated input")) return;
        cudaMemcpyAsync(c->act, x, len * sizeof(float), cudaMemcpyDeviceToDevice, c->st);
        cu_mul_sigmoid(b, c->act, gt, len);
        cu_matmul(b, sw, c->act, n, y);
        return;
    }
    cu_w w = cu_w_of(sw);
    gv_call g = plain_call(&w, y, x, gt, XM_SIGMOID);
    gemv_run(c, g, n);
}

/* 1 when every staged chunk holds whole groups of gdim columns, whichever batch variant runs */
static int groups_fit(int cols, int gdim) {
    if (gdim <= 0 || cols % gdim) return 0;
    for (int nt = 1; nt <= 8; nt *= 2) {
        int chunk = chunk_for(nt);
        if (chunk < cols && chunk % gdim) return 0;
    }
    return 1;
}

void cu_gated_rmsnorm_matmul(sl_backend *b, const sl_weight *sw, float *x, const float *z, const float *nw, int dim,
                             float eps, int n, float *y) {
    cu_impl *c = cu_of(b);
    if (n > gemv_max(c, sw) || !has_kernel(sw) || !groups_fit(sw->cols, dim)) {
        cu_gated_rmsnorm(b, x, z, nw, n * (sw->cols / dim), dim, eps);
        cu_matmul(b, sw, x, n, y);
        return;
    }
    cu_w w = cu_w_of(sw);
    gv_call g = plain_call(&w, y, x, NULL, XM_PLAIN);
    g.gz = z;
    g.gw = nw;
    g.gdim = dim;
    g.geps = eps;
    gemv_run(c, g, n);
}

__global__ void embed_k(cu_w w, const int32_t *ids, const int32_t *step_tok, int n, float *out) {
    cu_pdl_enter();
    int i = blockIdx.y;
    int id = step_tok ? step_tok[i] : ids[i];
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < w.cols; j += gridDim.x * blockDim.x)
        out[(long long)i * w.cols + j] = w_elem(w, id, j);
}

void cu_embed(sl_backend *b, const sl_weight *sw, const int32_t *ids, int n, float *out) {
    cu_impl *c = cu_of(b);
    cu_w w = cu_w_of(sw);
    const int32_t *step_tok = NULL;
    if (c->capturing) {
        step_tok = c->d_step->tok;
    } else {
        if (cu_grow(c, (void **)&c->ids, &c->ids_len, (size_t)n * sizeof *ids, "token ids")) return;
        cudaMemcpyAsync(c->ids, ids, (size_t)n * sizeof *ids, cudaMemcpyHostToDevice, c->st);
    }
    if (w.fmt == SL_WF_GGML) {
        cu_ggml_embed(c, &w, c->ids, step_tok, n, out);
        cu_check_launch(c, "embedding");
        return;
    }
    dim3 grid(CU_BLOCKS(w.cols, 256) < 64 ? CU_BLOCKS(w.cols, 256) : 64, (unsigned)n);
    cu_launch(c, embed_k, grid, 256, 0, w, c->ids, step_tok, n, out);
    cu_check_launch(c, "embedding");
}
