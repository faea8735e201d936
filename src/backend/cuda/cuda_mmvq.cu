/* Decode GEMV for the common GGML types (Q4_K, Q6_K, Q8_0) in integer arithmetic: the input is first
 * quantized to 16 bits per value with one float scale per 32 values, held as a signed high byte and an
 * unsigned low byte, then each weight row is dotted with both four bytes at a time by dp4a (exact integer
 * sums), and scales apply per 32 values in fp32. The quantizer also keeps each 16 values' integer sum, which
 * the types with an offset (Q4_K's minimum, Q6_K's 32) multiply once instead of summing the input again. 16 bits, not
 * the 8 other engines use: an 8-bit input moved MoE routing in the fixtures (decode rel-L2 0.2 on qwen3_5_moe-Q4_K_M),
 * 16 bits keeps the input within 2^-16 of its block's largest value, as close as the fp32 kernels. A warp takes one
 * weight row, or two adjacent rows for one token (each input value then loaded once for both), or several short rows;
 * each lane takes whole units of a block (16 bytes of Q4_K nibbles, 64 Q6_K values or one Q8_0 block) straight
 * from global memory, so there is no shared-memory staging and every load is in flight at once. Four times fewer
 * instructions per weight than decoding to fp32, which is what held the fp32 kernels (cuda_ggml.cu) at a third of the
 * memory bandwidth. */
#include "backend/cuda/cuda_int.cuh"

extern "C" {
#include "backend/ggml_types.h"
}

#define MQ_WARPS 8 /* rows per block */

/* ---- the input in q16: per row r of the input, h[r][cols] int8, l[r][cols] uint8, d[r][cols / 32] and
 * s[r][cols / 16]; value = d (256 h + l), s the sums of (256 h + l) over each 16 ---- */

/* one warp per 32 values (cu_q16_put); with act the value is silu(x) * x[act_off] */
__global__ void q16_quant_k(const float *x, long long xs, int n, int cols, int act, long long act_off, int rows,
                            cu_q16w o, int fsum) {
    cu_pdl_enter();
    int lane = threadIdx.x & 31;
    long long u = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), upr = cols / 32;
    if (u >= (long long)rows * upr) return;
    int r = (int)(u / upr), c = (int)(u % upr) * 32 + lane;
    const float *xr = x + (long long)(r / n) * xs + (long long)(r % n) * cols; /* slot group, then token */
    float v = xr[c];
    if (act) v = v * cu_sigmoid(v) * xr[act_off + c];
    cu_q16_put(o, v, u, fsum);
}

/* ---- per-type dot of one unit with the q16 input ---- */

__device__ __forceinline__ int dp4(int a, int b, int c) {
    return __dp4a(a, b, c);
}
__device__ __forceinline__ int dp4u(int a, int b, int c) { /* both operands unsigned bytes */
    return (int)__dp4a((unsigned)a, (unsigned)b, (unsigned)c);
}
__device__ __forceinline__ int dp4us(int a, int b, int c) { /* a unsigned bytes, b signed bytes */
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ int dp4su(int a, int b, int c) { /* a signed bytes, b unsigned bytes */
    int d;
    asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
/* the q16 input at p (16 values): high and low byte planes */
struct x16 {
    int4 h, l;
};
__device__ __forceinline__ x16 ldx(const int8_t *h, const uint8_t *l) {
    return {*(const int4 *)h, *(const int4 *)l};
}
/* 16 weight bytes read once: not kept in L1, where they would push out the input that every row reads again */
__device__ __forceinline__ int4 ldw16(const void *p) {
    int4 r;
    asm("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}
/* dot of 16 unsigned weight bytes (< 128) with the input */
__device__ __forceinline__ int dot16u(int4 a, const x16 &x) {
    int dh = dp4(a.x, x.h.x, dp4(a.y, x.h.y, dp4(a.z, x.h.z, dp4(a.w, x.h.w, 0))));
    int dl = dp4u(a.x, x.l.x, dp4u(a.y, x.l.y, dp4u(a.z, x.l.z, dp4u(a.w, x.l.w, 0))));
    return dh * 256 + dl;
}
/* dot of 16 unsigned weight bytes with the input: bytes up to 255, where dot16u takes them below 128 (the
 * signed dp4a) */
__device__ __forceinline__ int dot16u16(int4 a, const x16 &x) {
    int dh = dp4us(a.x, x.h.x, dp4us(a.y, x.h.y, dp4us(a.z, x.h.z, dp4us(a.w, x.h.w, 0))));
    int dl = dp4u(a.x, x.l.x, dp4u(a.y, x.l.y, dp4u(a.z, x.l.z, dp4u(a.w, x.l.w, 0))));
    return dh * 256 + dl;
}
/* dot of 16 signed weight bytes with the input */
__device__ __forceinline__ int dot16s(int4 a, const x16 &x) {
    int dh = dp4(a.x, x.h.x, dp4(a.y, x.h.y, dp4(a.z, x.h.z, dp4(a.w, x.h.w, 0))));
    int dl = dp4su(a.x, x.l.x, dp4su(a.y, x.l.y, dp4su(a.z, x.l.z, dp4su(a.w, x.l.w, 0))));
    return dh * 256 + dl;
}
/* the same 16 bytes at a 2-byte aligned p from the one or two aligned 16-byte pieces they lie in: two wide
 * loads and funnel shifts instead of eight 16-bit loads (Q6_K and Q8_0 blocks are 210 and 34 bytes, so
 * their fields sit at every even offset); the second piece is read only when the bytes reach into it */
__device__ __forceinline__ int4 ld16_win(const uint8_t *p) {
    uintptr_t a = (uintptr_t)p;
    const int4 *b = (const int4 *)(a & ~(uintptr_t)15);
    int s = (int)(a & 15), q = s >> 2, r = 8 * (s & 3);
    int4 A = b[0], B = s ? b[1] : A;
    unsigned w[8] = {(unsigned)A.x, (unsigned)A.y, (unsigned)A.z, (unsigned)A.w,
                     (unsigned)B.x, (unsigned)B.y, (unsigned)B.z, (unsigned)B.w};
    unsigned v[5];
#pragma unroll
    for (int i = 0; i < 5; i++) v[i] = q == 0 ? w[i] : q == 1 ? w[i + 1] : q == 2 ? w[i + 2] : w[i + 3];
    return make_int4((int)__funnelshift_r(v[0], v[1], r), (int)__funnelshift_r(v[1], v[2], r),
                     (int)__funnelshift_r(v[2], v[3], r), (int)__funnelshift_r(v[3], v[4], r));
}
__device__ __forceinline__ int4 mask4(int4 a, int sh, unsigned m) {
    return make_int4((int)(((unsigned)a.x >> sh) & m), (int)(((unsigned)a.y >> sh) & m),
                     (int)(((unsigned)a.z >> sh) & m), (int)(((unsigned)a.w >> sh) & m));
}
__device__ __forceinline__ int4 or4(int4 a, int4 b) {
    return make_int4(a.x | b.x, a.y | b.y, a.z | b.z, a.w | b.w);
}
__device__ __forceinline__ int4 shl_mask4(int4 a, int sh, unsigned m) { /* (a << sh) & m, sh may be negative */
    auto f = [&](int v) { return (int)((sh >= 0 ? (unsigned)v << sh : (unsigned)v >> -sh) & m); };
    return make_int4(f(a.x), f(a.y), f(a.z), f(a.w));
}

template <int T> struct mq;

/* Q4_K: 144-byte blocks of 256 (d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles; rows are
 * 16-byte aligned, so every field is). Unit u of a block: 16 bytes of the 32 that hold sub-blocks 2p (low
 * nibbles) and 2p + 1 (high): p = u / 2, half h = u % 2. Value = d sc q - dmin mn. (Units of 32 bytes, the
 * head decoded once per 64 values, measured 20 % slower: twice the input loads per lane outstanding.) */
template <> struct mq<SL_GGML_Q4_K> {
    static constexpr int BS = 256, BB = 144, UPB = 8;
    struct unit_t {
        int4 q;
        unsigned dm, s0, s1, s2;
    };
    struct in_t { /* the input of unit u: both sub-blocks' 16 values, scales and sums */
        x16 a, b;
        float da, db;
        int sa, sb;
    };
    static __device__ __forceinline__ unit_t load(const uint8_t *b, int u) {
        unit_t r;
        int4 hd = ldw16(b); /* d, dmin and the 12 scale bytes in one load */
        r.dm = (unsigned)hd.x;
        r.s0 = (unsigned)hd.y;
        r.s1 = (unsigned)hd.z;
        r.s2 = (unsigned)hd.w;
        r.q = ldw16(b + 16 + 16 * u);
        return r;
    }
    static __device__ __forceinline__ in_t load_in(int u, const int8_t *xh, const uint8_t *xl, const float *xd,
                                                   const int *xs) {
        int p = u >> 1, h = u & 1, s0 = 2 * p, s1 = s0 + 1;
        return {ldx(xh + s0 * 32 + 16 * h, xl + s0 * 32 + 16 * h), ldx(xh + s1 * 32 + 16 * h, xl + s1 * 32 + 16 * h),
                xd[s0], xd[s1], xs[2 * s0 + h], xs[2 * s1 + h]};
    }
    /* Unit u's sub-blocks 2p and 2p + 1 (p = u / 2): their 6-bit scales and minimums are bytes 2p % 4 and
     * the next of one word each, built for all four of a half block at once (the scale bytes of sub-blocks
     * 4-7 take their high two bits from those of 0-3). The high nibbles are dotted in place (bytes up to
     * 240: 16 times their value, unsigned), and the scale codes multiply the integer sums (below 2^29)
     * before their one conversion each: half the int-to-float conversions (a quarter-rate instruction) and
     * a third fewer instructions per unit than decoding each scale apart. */
    static __device__ __forceinline__ float dot(const unit_t &w, int u, const in_t &x) {
        int p = u >> 1, k0 = 2 * (p & 1);
        unsigned scw = p < 2 ? w.s0 & 0x3F3F3F3Fu : (w.s2 & 0x0F0F0F0Fu) | ((w.s0 >> 2) & 0x30303030u);
        unsigned mnw = p < 2 ? w.s1 & 0x3F3F3F3Fu : ((w.s2 >> 4) & 0x0F0F0F0Fu) | ((w.s1 >> 2) & 0x30303030u);
        int sc0 = (int)__byte_perm(scw, 0, 0x4440 + k0), sc1 = (int)__byte_perm(scw, 0, 0x4441 + k0);
        int mn0 = (int)__byte_perm(mnw, 0, 0x4440 + k0), mn1 = (int)__byte_perm(mnw, 0, 0x4441 + k0);
        float d = __half2float(__ushort_as_half((unsigned short)w.dm)),
              dmin = __half2float(__ushort_as_half((unsigned short)(w.dm >> 16)));
        int4 lo = mask4(w.q, 0, 0x0F0F0F0Fu), hi = mask4(w.q, 0, 0xF0F0F0F0u);
        int ia = dot16u(lo, x.a), ib = dot16u16(hi, x.b) >> 4; /* 16 times the high nibbles' dot, exactly */
        float v = x.da * (float)(sc0 * ia) + x.db * (float)(sc1 * ib);
        float m = x.da * (float)(mn0 * x.sa) + x.db * (float)(mn1 * x.sb);
        return d * v - dmin * m;
    }
};

/* Q6_K: 210-byte blocks of 256 (ql[128], qh[64], int8 scales[16], d; 2-byte aligned). Unit u = half n
 * (128 values) x chunk c: positions l = 16c .. 16c + 15 of the four groups of 32 in that half. Value =
 * d sc (q - 32), q = 4 low bits from ql and 2 high bits from qh. */
template <> struct mq<SL_GGML_Q6_K> {
    static constexpr int BS = 256, BB = 210, UPB = 4;
    struct unit_t {
        int4 la, lb, hb;
        unsigned sc; /* the four int8 scales of the unit's groups */
        float d;
    };
    static __device__ __forceinline__ unit_t load(const uint8_t *b, int u) {
        int n = u >> 1, c = u & 1;
        unit_t r;
        r.la = ld16_win(b + 64 * n + 16 * c);
        r.lb = ld16_win(b + 64 * n + 32 + 16 * c);
        r.hb = ld16_win(b + 128 + 32 * n + 16 * c);
        int4 s = ld16_win(b + 192); /* the unit's scales: bytes 8 n + c, + 2, + 4, + 6 */
        r.sc = __byte_perm((unsigned)(n ? s.z : s.x), (unsigned)(n ? s.w : s.y), c ? 0x7531 : 0x6420);
        r.d = __half2float(__ushort_as_half(*(const unsigned short *)(b + 208)));
        return r;
    }
    struct in_t { /* the input of unit u: its four groups' 16 values, scales and sums */
        x16 x[4];
        float d[4];
        int s[4];
    };
    static __device__ __forceinline__ in_t load_in(int u, const int8_t *xh, const uint8_t *xl, const float *xd,
                                                   const int *xs) {
        int n = u >> 1, c = u & 1;
        in_t r;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            int blk = 4 * n + g; /* the input's 32-value block */
            r.x[g] = ldx(xh + 32 * blk + 16 * c, xl + 32 * blk + 16 * c);
            r.d[g] = xd[blk];
            r.s[g] = xs[2 * blk + c];
        }
        return r;
    }
    static __device__ __forceinline__ float dot(const unit_t &w, int, const in_t &x) {
        int4 q[4] = {or4(mask4(w.la, 0, 0x0F0F0F0Fu), shl_mask4(w.hb, 4, 0x30303030u)),
                     or4(mask4(w.lb, 0, 0x0F0F0F0Fu), shl_mask4(w.hb, 2, 0x30303030u)),
                     or4(mask4(w.la, 4, 0x0F0F0F0Fu), shl_mask4(w.hb, 0, 0x30303030u)),
                     or4(mask4(w.lb, 4, 0x0F0F0F0Fu), shl_mask4(w.hb, -2, 0x30303030u))};
        float acc = 0;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            int v = dot16u(q[g], x.x[g]) - 32 * x.s[g];
            acc += x.d[g] * (float)(int)(signed char)(w.sc >> (8 * g)) * (float)v;
        }
        return w.d * acc;
    }
};

/* Q8_0: 34-byte blocks of 32 (d, 32 int8; 2-byte aligned); a unit is a block. */
template <> struct mq<SL_GGML_Q8_0> {
    static constexpr int BS = 32, BB = 34, UPB = 1;
    struct unit_t {
        int4 a, b;
        float d;
    };
    static __device__ __forceinline__ unit_t load(const uint8_t *b, int) {
        unit_t r;
        r.d = __half2float(__ushort_as_half(*(const unsigned short *)b));
        r.a = ld16_win(b + 2);
        r.b = ld16_win(b + 18);
        return r;
    }
    struct in_t {
        x16 a, b;
        float d;
    };
    static __device__ __forceinline__ in_t load_in(int, const int8_t *xh, const uint8_t *xl, const float *xd,
                                                   const int *) {
        return {ldx(xh, xl), ldx(xh + 16, xl + 16), xd[0]};
    }
    static __device__ __forceinline__ float dot(const unit_t &w, int, const in_t &x) {
        return w.d * x.d * (float)(dot16s(w.a, x.a) + dot16s(w.b, x.b));
    }
};

/* Up to MQ_SET weights of one type and one input in one launch (a layer's q, k and v; gate and up), so
 * that small matrices share the GPU: blocks [b0[i], b0[i + 1]) take weight i. */
#define MQ_SET 4
struct mq_set {
    cu_w w[MQ_SET];
    float *y[MQ_SET];
    int b0[MQ_SET + 1];
    int nw;
};

/* Lanes per weight row: a warp takes 32 / G rows of fewer than 64 units, so that every lane holds two units
 * in flight (a 512-wide expert down projection has 16 Q4_K or 8 Q6_K units a row, a 2048-wide Q6_K output
 * head 32: one row per warp left half to three quarters of the lanes idle or one unit deep). pack 0 keeps a
 * row per warp. */
__host__ __device__ __forceinline__ int mq_lanes(int units, int pack) {
    int g = 32;
    while (pack && g > 1 && 2 * g > units) g >>= 1;
    return g;
}

/* y[slot][t][rows] = W(slot) . x[slot / x_div][t], with the grid and arguments of ggml_gemv_k: table
 * entries give the weight per slot (one weight in the set), grid z picks weight `which + z`. x holds the
 * q16 input rows in the order q16_quant_k writes them (slot group, then token), from row t0 on. A block
 * takes MQ_WARPS * 32 / G * R rows (mq_lanes; R rows a lane group). One-token launches of a row a lane run at
 * MB = 4 blocks per SM (64 registers; Q6_K 3, whose units spill at 64): measured against 3, 5 and 6, and
 * against four units a lane in flight; two rows a lane at 3 (80 registers; 2 measured no better), which
 * halves the input's loads per weight (synthetic qwen3.5-35b-a3b and llama3-8b Q4_K decode, H200). The
 * weights bypass L1 (read once, they would push out the input every row reads), and a lane's first units
 * are requested before the wait for the previous kernel, whose output is the input, never the weights.
 * The epilogue ep (gg_call's) serves a shared expert's down projection: the routed outputs' weighted sum
 * and its gate, in place of two more launches. */
struct mq_epi { /* gg_call's epilogue */
    const float *ysc, *cd, *cw;
    int ck;
};

template <int NT, int T, int MB, int R>
__global__ void __launch_bounds__(MQ_WARPS * 32, MB)
    mmvq_k(mq_set set, const cu_expert *table, const int32_t *ids, int which, int x_div, cu_q16 x, int t0, int n_x,
           int n, long long ys, long long yz, int pack, mq_epi ep) {
    constexpr int BS = mq<T>::BS, BB = mq<T>::BB, UPB = mq<T>::UPB;
    static_assert(R == 1 || NT == 1, "rows per lane beyond one are for one token");
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slot = blockIdx.y;
    /* the weight of this block, by selects (no indexing into the parameters) */
    cu_w w = set.w[0];
    float *y = set.y[0];
    int blk = blockIdx.x;
#pragma unroll
    for (int i = 1; i < MQ_SET; i++)
        if (i < set.nw && (int)blockIdx.x >= set.b0[i]) {
            w = set.w[i];
            y = set.y[i];
            blk = blockIdx.x - set.b0[i];
        }
    if (table) {
        cu_pdl_enter();
        if (ids[slot] < 0) return; /* a pair another pass computes */
        w = table[ids[slot]].w[which + blockIdx.z];
    }
    /* a lane group of G lanes takes R adjacent rows */
    int units = w.cols / BS * UPB, G = mq_lanes(units, pack), li = lane & (G - 1);
    int row0 = (blk * MQ_WARPS + warp) * (32 / G) * R, row = row0 + lane / G * R;
    if (row0 >= w.rows) return; /* the whole warp: its lanes meet in the shuffles below */
    int ok = row < w.rows;
    const uint8_t *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = w.data + (long long)min(ok ? row + r : row0, w.rows - 1) * w.row_bytes;
    /* the first units' weights are requested before waiting for the previous kernel (which the input
     * depends on, the weights never do), so their latency overlaps its end */
    typename mq<T>::unit_t a[R], b[R];
    auto fetch = [&](int u0) {
        int u1 = u0 + G;
#pragma unroll
        for (int r = 0; r < R; r++) {
            a[r] = mq<T>::load(wr[r] + (long long)(u0 / UPB) * BB, u0 % UPB);
            if (u1 < units) b[r] = mq<T>::load(wr[r] + (long long)(u1 / UPB) * BB, u1 % UPB);
        }
    };
    if (!table && ok && li < units) fetch(li);
    if (!table) cu_pdl_enter();
    /* this launch's first q16 row of the input: its values, scales (per 32) and sums (per 16) */
    long long xrow = (long long)(slot / x_div) * n_x + t0;
    const int8_t *xh = x.h + xrow * w.cols;
    const uint8_t *xl = x.l + xrow * w.cols;
    const float *xd = x.d + xrow * (w.cols / 32);
    const int *xs = x.s + xrow * (w.cols / 16);
    float acc[NT * R];
#pragma unroll
    for (int t = 0; t < NT * R; t++) acc[t] = 0;
    for (int u0 = li; ok && u0 < units; u0 += 2 * G) {
        int u1 = u0 + G;
        if (table || u0 != li) fetch(u0);
        int c0 = u0 / UPB * BS, c1 = u1 / UPB * BS;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            int o = t * w.cols;
            typename mq<T>::in_t xi =
                mq<T>::load_in(u0 % UPB, xh + o + c0, xl + o + c0, xd + (o + c0) / 32, xs + (o + c0) / 16);
#pragma unroll
            for (int r = 0; r < R; r++) acc[t * R + r] += mq<T>::dot(a[r], u0 % UPB, xi);
            if (u1 < units) {
                xi = mq<T>::load_in(u1 % UPB, xh + o + c1, xl + o + c1, xd + (o + c1) / 32, xs + (o + c1) / 16);
#pragma unroll
                for (int r = 0; r < R; r++) acc[t * R + r] += mq<T>::dot(b[r], u1 % UPB, xi);
            }
        }
    }
    y += (long long)slot * ys + (long long)blockIdx.z * yz;
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = acc[t * R + r];
            for (int o = G >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (li == 0 && ok && row + r < w.rows && t < n)
                cu_gemv_store(y + (long long)t * w.rows + row + r, v + (w.bias ? w.bias[row + r] : 0.0f), t, row + r,
                              w.rows, ep.ysc, ep.cd, ep.cw, ep.ck);
        }
}

/* ---- one token of a Q6_K matrix, its rows' bytes staged in shared memory ----
 * Q6_K blocks are 210 bytes, so a unit's fields (16 bytes of low bits, 16 of high bits, the scales) sit at
 * every even offset, and mmvq_k reads each through two 16-byte windows: per 64 weights eight scattered
 * 16-byte loads through L1, besides the input's. Nsight Compute on llama3-8b's Q6_K output head (128,256 x
 * 4,096, H200): L1 busy 91 %, DRAM 28 % (1.36 TB/s). Here a warp copies its row 8 blocks (1,680 bytes, 105
 * pieces of 16) at a time into shared memory with coalesced asynchronous copies, the next 8 in flight while
 * it works on these, and lanes take their units from there; the block stages the whole q16 input once for
 * all its rows (the grid is sized to the GPU and strides over groups of 8 R rows). Rows must be whole
 * multiples of 16 bytes (8 blocks), as every Q6_K row of 2,048 values or more is. Two rows a warp (R = 2)
 * share each input load; one and four measured slower (four fits one block an SM). The head then took 155 µs
 * instead of 319 (2.80 TB/s). */
#define Q6_CHUNK 1680                 /* 8 blocks */
#define Q6_BUF (Q6_CHUNK + 16)        /* a chunk and the word its last unaligned read may touch */
#define Q6_WARP_SMEM(R) (2 * (R)*Q6_BUF) /* two chunks a row */
/* The staged input, padded so that a warp's reads meet no bank twice: lanes (block b, half n, piece c) read the
 * 16 bytes at 256 b + 128 n + 32 g + 16 c of each plane, which without padding fall in the same four banks for
 * every b and n. 32 bytes after every 128 spread them; one word after every 16 sums and every 8 scales. */
__host__ __device__ __forceinline__ int q6_xp(int v) { /* plane offset of value v */
    return v + 32 * (v >> 7);
}
__host__ __device__ __forceinline__ int q6_in_smem(int cols) { /* planes, scales, sums */
    return 2 * q6_xp(cols) + 4 * (cols / 32 + cols / 256) + 4 * (cols / 16 + cols / 256);
}

/* 16 bytes at a 2-byte aligned address in shared memory, from aligned words */
__device__ __forceinline__ int4 lds16u(const uint8_t *p) {
    const unsigned *a = (const unsigned *)((uintptr_t)p & ~(uintptr_t)3);
    unsigned s = ((unsigned)(uintptr_t)p & 2u) * 8u, w0 = a[0], w1 = a[1], w2 = a[2], w3 = a[3], w4 = a[4];
    return make_int4((int)__funnelshift_r(w0, w1, s), (int)__funnelshift_r(w1, w2, s), (int)__funnelshift_r(w2, w3, s),
                     (int)__funnelshift_r(w3, w4, s));
}

template <int R>
__global__ void __launch_bounds__(MQ_WARPS * 32, 3)
    q6k_sm_k(mq_set set, int x_div, cu_q16 x, long long ys, mq_epi ep) {
    using Q = mq<SL_GGML_Q6_K>;
    extern __shared__ __align__(16) uint8_t q6_smem[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slot = blockIdx.y, cols = set.w[0].cols;
    /* the input's planes, scales and sums, then each warp's two chunks a row */
    int8_t *sh = (int8_t *)q6_smem;
    uint8_t *sl = q6_smem + q6_xp(cols);
    float *sd = (float *)(q6_smem + 2 * q6_xp(cols));
    int *ss = (int *)(q6_smem + 2 * q6_xp(cols) + 4 * (cols / 32 + cols / 256));
    uint8_t *ring = q6_smem + q6_in_smem(cols) + warp * Q6_WARP_SMEM(R);
    int total = set.b0[set.nw], nch = cols / 2048;
    bool first = true;
    for (int rg = blockIdx.x; rg < total; rg += gridDim.x) {
        cu_w w = set.w[0];
        float *y = set.y[0];
        int blk = rg;
#pragma unroll
        for (int i = 1; i < MQ_SET; i++)
            if (i < set.nw && rg >= set.b0[i]) {
                w = set.w[i];
                y = set.y[i];
                blk = rg - set.b0[i];
            }
        int row0 = (blk * MQ_WARPS + warp) * R;
        const uint8_t *wr[R];
#pragma unroll
        for (int r = 0; r < R; r++) wr[r] = w.data + (long long)min(row0 + r, w.rows - 1) * w.row_bytes;
        auto issue = [&](int k) { /* chunk k of the rows into buffer k % 2, as one group (empty past the end) */
            if (k < nch)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        int i = lane + 32 * j;
                        if (i < Q6_CHUNK / 16) {
                            unsigned d = (unsigned)__cvta_generic_to_shared(ring + (2 * r + (k & 1)) * Q6_BUF + 16 * i);
                            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d),
                                         "l"(wr[r] + (long long)k * Q6_CHUNK + 16 * i));
                        }
                    }
            asm volatile("cp.async.commit_group;");
        };
        issue(0);
        issue(1);
        if (first) { /* the weights are in flight; now the input, which the previous kernel makes */
            first = false;
            cu_pdl_enter();
            long long xrow = slot / x_div;
            const int4 *gh = (const int4 *)(x.h + xrow * cols), *gl = (const int4 *)(x.l + xrow * cols),
                       *gd = (const int4 *)(x.d + xrow * (cols / 32)), *gs = (const int4 *)(x.s + xrow * (cols / 16));
            for (int i = threadIdx.x; i < cols / 16; i += blockDim.x) {
                *(int4 *)(sh + q6_xp(16 * i)) = gh[i];
                *(int4 *)(sl + q6_xp(16 * i)) = gl[i];
            }
            for (int i = threadIdx.x; i < cols / 128; i += blockDim.x) { /* four scales and eight sums a thread */
                int4 dv = gd[i], s0 = gs[2 * i], s1 = gs[2 * i + 1];
                int q = 4 * i, r = 8 * i;
                float dd[4] = {__int_as_float(dv.x), __int_as_float(dv.y), __int_as_float(dv.z), __int_as_float(dv.w)};
                int sv[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
                for (int j = 0; j < 4; j++) sd[q + j + ((q + j) >> 3)] = dd[j];
#pragma unroll
                for (int j = 0; j < 8; j++) ss[r + j + ((r + j) >> 4)] = sv[j];
            }
            __syncthreads();
        }
        /* lane: block lane / 4 of a chunk, unit lane % 4 (half n, 16-value piece c) */
        int bl = lane >> 2, u = lane & 3, n = u >> 1, c = u & 1;
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0;
        for (int k = 0; k < nch; k++) {
            asm volatile("cp.async.wait_group 1;");
            __syncwarp();
            Q::in_t xi;
            int b = k * 8 + bl; /* the row's block */
#pragma unroll
            for (int g = 0; g < 4; g++) {
                int q = 8 * b + 4 * n + g; /* the input's 32-value block */
                int o = q6_xp(32 * q + 16 * c);
                xi.x[g] = {*(const int4 *)(sh + o), *(const int4 *)(sl + o)};
                xi.d[g] = sd[q + (q >> 3)];
                xi.s[g] = ss[2 * q + c + ((2 * q + c) >> 4)];
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint8_t *p = ring + (2 * r + (k & 1)) * Q6_BUF + 210 * bl;
                Q::unit_t wt;
                wt.la = lds16u(p + 64 * n + 16 * c);
                wt.lb = lds16u(p + 64 * n + 32 + 16 * c);
                wt.hb = lds16u(p + 128 + 32 * n + 16 * c);
                int4 sc = lds16u(p + 192);
                wt.sc = __byte_perm((unsigned)(n ? sc.z : sc.x), (unsigned)(n ? sc.w : sc.y), c ? 0x7531 : 0x6420);
                wt.d = __half2float(*(const __half *)(p + 208));
                acc[r] += Q::dot(wt, u, xi);
            }
            __syncwarp(); /* every lane is done with the buffer before it is filled again */
            issue(k + 2);
        }
        asm volatile("cp.async.wait_group 0;");
        y += (long long)slot * ys;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = warp_sum(acc[r]);
            if (lane == 0 && row0 + r < w.rows)
                cu_gemv_store(y + row0 + r, v + (w.bias ? w.bias[row0 + r] : 0.0f), 0, row0 + r, w.rows, ep.ysc, ep.cd,
                              ep.cw, ep.ck);
        }
    }
}

int cu_mmvq_takes(const cu_w *w) {
    uintptr_t a = (uintptr_t)w->data;
    switch (w->gtype) {
    case SL_GGML_Q4_K: return w->cols % 256 == 0 && a % 16 == 0; /* 128-bit loads of the nibbles */
    case SL_GGML_Q6_K: return w->cols % 256 == 0 && a % 2 == 0;
    case SL_GGML_Q8_0: return w->cols % 32 == 0 && a % 2 == 0;
    default: return 0;
    }
}

/* q16 rows of cols values in the backend's q16 buffer: where to write them and how the GEMV reads them */
static int q16_buf(cu_impl *c, int rows, int cols, int fsum, cu_q16w *w, cu_q16 *out) {
    size_t plane = ((size_t)rows * (size_t)cols + 255) / 256 * 256,
           db = ((size_t)rows * (size_t)(cols / 32) * sizeof(float) + 255) / 256 * 256,
           sb = (size_t)rows * (size_t)(cols / 16) * sizeof(int);
    /* at least 4 MB, so that recorded steps of other shapes rarely find it too small */
    size_t need = 2 * plane + db + sb < ((size_t)4 << 20) ? (size_t)4 << 20 : 2 * plane + db + sb;
    if (cu_grow(c, &c->q16buf, &c->q16len, need, "q16 input")) return -1;
    *w = {(int8_t *)c->q16buf, (uint8_t *)c->q16buf + plane, (float *)((uint8_t *)c->q16buf + 2 * plane),
          (int *)((uint8_t *)c->q16buf + 2 * plane + db)};
    *out = {w->h, w->l, w->d, fsum ? NULL : w->s, fsum ? (const float *)w->s : NULL};
    return 0;
}

/* rows of the input (row r at x + (r / n) xs + (r % n) cols) in q16 into the backend's q16 buffer */
static int q16_make(cu_impl *c, const float *x, long long xs, int n, int cols, int act, long long act_off, int rows,
                    int fsum, cu_q16 *out) {
    cu_q16w w;
    if (q16_buf(c, rows, cols, fsum, &w, out)) return -1;
    c->q16_live = NULL; /* the buffer no longer holds what a norm or merge made */
    long long units = (long long)rows * (cols / 32);
    cu_launch(c, q16_quant_k, CU_BLOCKS(units, 8), 256, 0, x, xs, n, cols, act, act_off, rows, w, fsum);
    return 0;
}

cu_q16w cu_q16_want(cu_impl *c, int cols) {
    cu_q16w w = {NULL, NULL, NULL, NULL};
    if (c->q16_fuse != 1 || cols % 32 || q16_buf(c, 1, cols, 0, &w, &c->q16_pre)) w.h = NULL;
    return w;
}

void cu_q16_made(cu_impl *c, const float *x, int cols) {
    c->q16_x = x;
    c->q16_cols = cols;
    c->q16_at = c->launches;
}

void cu_q16_enter(cu_impl *c) {
    c->q16_live = c->q16_x && c->q16_at == c->launches ? c->q16_x : NULL;
}

void cu_q16_leave(cu_impl *c) {
    c->q16_live = NULL;
}

int cu_q16_quantize(cu_impl *c, const gg_call &g, int n, cu_q16 *x) {
    int groups = (g.slots + g.x_div - 1) / g.x_div;
    if (c->q16_live && g.x == c->q16_live && groups * n == 1 && !g.act && g.w->cols == c->q16_cols) {
        *x = c->q16_pre; /* made by the kernel that wrote g.x */
        return 0;
    }
    return q16_make(c, g.x, g.x_stride, n, g.w->cols, g.act, g.act_off, groups * n, 0, x);
}

int cu_q16_rows(cu_impl *c, const float *x, const float *u, int rows, int cols, cu_q16 *out) {
    return q16_make(c, x, cols, 1, cols, u != NULL, u ? (long long)(u - x) : 0, rows, 1, out);
}

/* rows per lane: two for one token on rows of 64 units or more (each input value loaded once for both rows,
 * halving the input's loads per weight) */
template <int T> static int mq_rows(const cu_impl *c, const gg_call *gs, int n) {
    if (n != 1 || c->mmvq == 3 || mq_lanes(gs[0].w->cols / mq<T>::BS * mq<T>::UPB, c->mmvq != 2) != 32) return 1;
    return T == SL_GGML_Q6_K && c->mmvq != 4 ? 1 : 2;
}

/* blocks per SM: see mmvq_k */
static constexpr int mq_mb(int nt, int t, int r) {
    return nt > 1 ? 1 : r == 2 ? (t == SL_GGML_Q6_K ? 2 : 3) : t == SL_GGML_Q6_K ? 3 : 4;
}

template <int NT, int T, int R>
static void mmvq_go(cu_impl *c, const gg_call *gs, int nw, const cu_q16 &x, int t0, int n_x, int n) {
    mq_set set;
    memset(&set, 0, sizeof set);
    int blocks = 0, pack = c->mmvq != 2;
    int rpb = MQ_WARPS * 32 / mq_lanes(gs[0].w->cols / mq<T>::BS * mq<T>::UPB, pack) * R; /* rows per block */
    for (int i = 0; i < nw; i++) {
        set.w[i] = *gs[i].w;
        set.y[i] = gs[i].y + (long long)t0 * gs[i].w->rows;
        set.b0[i] = blocks;
        blocks += (int)CU_BLOCKS(gs[i].w->rows, rpb);
    }
    set.b0[nw] = blocks;
    set.nw = nw;
    const gg_call &g = gs[0];
    dim3 grid((unsigned)blocks, (unsigned)g.slots, (unsigned)g.nz);
    mq_epi ep = {g.ysc, g.cd, g.cw, g.ck};
    cu_launch(c, mmvq_k<NT, T, mq_mb(NT, T, R), R>, grid, MQ_WARPS * 32, 0, set, g.table, g.ids, g.which, g.x_div, x,
              t0, n_x, n, g.y_stride, g.yz, pack, ep);
}

/* one token of Q6_K weights through q6k_sm_k, where its rows are whole multiples of 16 bytes and its shared
 * memory fits: 0 where it does not take them */
template <int R> static int q6k_sm_go(cu_impl *c, const gg_call *gs, int nw, const cu_q16 &x) {
    int cols = gs[0].w->cols;
    for (int i = 0; i < nw; i++)
        if (cols % 2048 || gs[i].w->row_bytes % 16 || (uintptr_t)gs[i].w->data % 16) return 0;
    int smem = q6_in_smem(cols) + MQ_WARPS * Q6_WARP_SMEM(R);
    if (smem > c->smem_optin ||
        (smem > 48 * 1024 &&
         cudaFuncSetAttribute(q6k_sm_k<R>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess))
        return 0;
    int per_sm = cu_occupancy(c, (const void *)q6k_sm_k<R>, MQ_WARPS * 32, (size_t)smem);
    mq_set set;
    memset(&set, 0, sizeof set);
    int groups = 0;
    for (int i = 0; i < nw; i++) {
        set.w[i] = *gs[i].w;
        set.y[i] = gs[i].y;
        set.b0[i] = groups;
        groups += (int)CU_BLOCKS(gs[i].w->rows, MQ_WARPS * R);
    }
    set.b0[nw] = groups;
    set.nw = nw;
    const gg_call &g = gs[0];
    mq_epi ep = {g.ysc, g.cd, g.cw, g.ck};
    int blocks = groups < c->sms * per_sm ? groups : c->sms * per_sm;
    cu_launch(c, q6k_sm_k<R>, dim3((unsigned)blocks, (unsigned)g.slots), MQ_WARPS * 32, (size_t)smem, set, g.x_div, x,
              g.y_stride, ep);
    return 1;
}

template <int T> static void mmvq_type(cu_impl *c, const gg_call *gs, int nw, const cu_q16 &x, int n) {
    if (T == SL_GGML_Q6_K && n == 1 && !gs[0].table && gs[0].nz == 1 && (c->mmvq == 1 || c->mmvq >= 6) &&
        (c->mmvq == 6   ? q6k_sm_go<1>(c, gs, nw, x)
         : c->mmvq == 7 ? q6k_sm_go<4>(c, gs, nw, x)
                        : q6k_sm_go<2>(c, gs, nw, x)))
        return;
    if (mq_rows<T>(c, gs, n) == 2) {
        mmvq_go<1, T, 2>(c, gs, nw, x, 0, n, 1);
        return;
    }
    for (int t0 = 0; t0 < n; t0 += 8) {
        int m = n - t0 < 8 ? n - t0 : 8;
        if (m == 1)
            mmvq_go<1, T, 1>(c, gs, nw, x, t0, n, m);
        else if (m == 2)
            mmvq_go<2, T, 1>(c, gs, nw, x, t0, n, m);
        else if (m <= 4)
            mmvq_go<4, T, 1>(c, gs, nw, x, t0, n, m);
        else
            mmvq_go<8, T, 1>(c, gs, nw, x, t0, n, m);
    }
}

int cu_mmvq_epilogue(const cu_impl *c, const sl_weight *w, int n) {
    cu_w cw = cu_w_of(w);
    return c->mmvq && w->fmt == SL_WF_GGML && cu_mmvq_takes(&cw) && n == 1;
}

void cu_mmvq(cu_impl *c, const gg_call *gs, int nw, const cu_q16 &x, int n) {
    if ((gs[0].ysc || gs[0].cd) && (n != 1 || nw != 1)) {
        cu_fail(c, "integer GEMV: an epilogue takes one weight and one token");
        return;
    }
    if (nw < 1 || nw > MQ_SET || (nw > 1 && gs[0].table)) {
        cu_fail(c, "integer GEMV: %d weights in one launch (1 with a table, at most %d)", nw, MQ_SET);
        return;
    }
    for (int i = 1; i < nw; i++)
        if (gs[i].w->gtype != gs[0].w->gtype || gs[i].w->cols != gs[0].w->cols) {
            cu_fail(c, "integer GEMV: the weights of one launch differ in type or columns");
            return;
        }
    switch (gs[0].w->gtype) {
    case SL_GGML_Q4_K: mmvq_type<SL_GGML_Q4_K>(c, gs, nw, x, n); break;
    case SL_GGML_Q6_K: mmvq_type<SL_GGML_Q6_K>(c, gs, nw, x, n); break;
    case SL_GGML_Q8_0: mmvq_type<SL_GGML_Q8_0>(c, gs, nw, x, n); break;
    default: cu_fail(c, "GGML type %s has no integer GEMV kernel", sl_ggml_type_name(gs[0].w->gtype)); return;
    }
    cu_check_launch(c, "GGML integer GEMV");
}
