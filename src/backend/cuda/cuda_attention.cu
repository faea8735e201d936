/* Causal GQA attention on the GPU, in fp32 with online softmax (no n x n score buffer), over paged KV
 * caches: every key row is found through its sequence's page table (see sl_batch_map).
 * Prefill (a run of several tokens of one sequence): runs of 16 tokens or more go to the tensor-core kernel
 * (cuda_flash.cu) where it has the head size; otherwise a block is 4 consecutive queries of one head; key/
 * value tiles are staged in shared memory and each lane scores one key of the tile. Decode (tokens alone
 * in their sequence): split-K over each token's cache, each block a slice of positions for the query heads
 * of one KV head of one token (every key and value row read once for the group, straight into registers),
 * then a pass that merges the slices. Positions and sequences are always read from device memory,
 * so recorded steps replay at any position. Every kernel is instantiated for each cache element type T
 * (float, __half, __nv_bfloat16, and cu_q8 for q8_0 blocks) and widens keys and values to fp32 as it reads
 * them. */
#include <math.h>

#include <type_traits>

#include "backend/cuda/cuda_int.cuh"

#define ATT_Q 4       /* queries (warps) per prefill block */
#define ATT_MAXD 8    /* head_dim / 32 held per lane: head_dim <= 256 */
#define DEC_SPLITS 64 /* most decode slices per token (the cache length is unknown when recording) */
#define DEC_WARPS 4   /* decode: warps per block (more where a group needs more head chunks), up to 8 */

template <typename T> struct att_args {
    const float *q;
    const T *kc, *vc;
    float *out;
    int n_heads, n_kv, hd, window;
    float scale;
    const float *sinks; /* per query head: a logit in the softmax's denominator with no value (NULL: none) */
    cu_bmap bm;
    int t0, n;      /* prefill: the run's first token and its length */
    const int *tok; /* decode: the tokens of the launch's z index (NULL: z itself) */
};

/* slices of a cache of len keys out of a launch of splits, at least keys keys a slice (1: every slice that
 * has a key): short caches take fewer, decided on the device, so that a recorded step, launched for the
 * most, spends nothing on the rest and its merge reads only those used (SLUICE_CUDA_DEC_KEYS, default 32) */
__host__ __device__ __forceinline__ int dec_used(int len, int splits, int keys) {
    return min(max((len + keys - 1) / keys, 1), splits);
}

/* Slices per decode token in a recorded step of n tokens: enough blocks to fill the GPU at any length. */
static int rec_splits(int n) {
    int s = DEC_SPLITS / (n > 0 ? n : 1);
    return s < 4 ? 4 : s;
}

template <typename T> __global__ void __launch_bounds__(ATT_Q * 32) att_prefill_k(att_args<T> a, int tk) {
    cu_pdl_enter();
    extern __shared__ float sm[];
    int ldk = a.hd + 1; /* padded rows: lanes reading one column each hit distinct banks */
    float *ks = sm, *vs = ks + tk * ldk, *qs = vs + tk * ldk;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y, kvh = h / (a.n_heads / a.n_kv);
    int pos0 = a.bm.pos[a.t0], sq = a.bm.seq[a.t0];
    int i0 = blockIdx.x * ATT_Q, i = i0 + warp; /* within the run */
    int qw = a.n_heads * a.hd, kw = a.n_kv * a.hd;
    int p = pos0 + i; /* this warp's query position */
    bool live = i < a.n;
    long long qi = (long long)(a.t0 + i) * qw + h * a.hd; /* its row in q and out */
    for (int d = lane; d < a.hd; d += 32) qs[warp * a.hd + d] = live ? a.q[qi + d] * a.scale : 0;
    int last = pos0 + min(i0 + ATT_Q, a.n) - 1; /* the block's last query position */
    int first = a.window > 0 ? max(0, pos0 + i0 - a.window + 1) : 0;
    int lo = a.window > 0 ? max(0, p - a.window + 1) : 0;
    float m = -INFINITY, l = 0, o[ATT_MAXD];
#pragma unroll
    for (int k = 0; k < ATT_MAXD; k++) o[k] = 0;
    for (int t0 = first; t0 <= last; t0 += tk) {
        __syncthreads();
        for (int e = threadIdx.x; e < tk * a.hd; e += blockDim.x) {
            int j = e / a.hd, d = e % a.hd, t = t0 + j;
            bool ok = t <= last;
            long long r = ok ? cu_bm_row(a.bm, sq, t) * kw + kvh * a.hd + d : 0;
            ks[j * ldk + d] = ok ? cu_kv_get(a.kc, r) : 0;
            vs[j * ldk + d] = ok ? cu_kv_get(a.vc, r) : 0;
        }
        __syncthreads();
        if (!live) continue;
        int t = t0 + lane;
        float s = -INFINITY;
        if (lane < tk && t <= p && t >= lo) {
            s = 0;
            const float *kr = ks + lane * ldk, *qr = qs + warp * a.hd;
            for (int d = 0; d < a.hd; d++) s += qr[d] * kr[d];
        }
        float mt = warp_max(s);
        if (mt == -INFINITY) continue;
        float mn = fmaxf(m, mt), corr = expf(m - mn);
        float pj = s == -INFINITY ? 0.0f : expf(s - mn);
        l = l * corr + warp_sum(pj);
#pragma unroll
        for (int k = 0; k < ATT_MAXD; k++) o[k] *= corr;
        for (int j = 0; j < tk; j++) {
            float pb = __shfl_sync(0xffffffffu, pj, j);
            if (pb == 0.0f) continue;
            const float *vr = vs + j * ldk;
#pragma unroll
            for (int k = 0; k < ATT_MAXD; k++) {
                int d = lane + 32 * k;
                if (d < a.hd) o[k] += pb * vr[d];
            }
        }
        m = mn;
    }
    if (!live) return;
    if (a.sinks) {
        float sk = a.sinks[h], mn = fmaxf(m, sk), corr = expf(m - mn);
        l = l * corr + expf(sk - mn);
#pragma unroll
        for (int k = 0; k < ATT_MAXD; k++) o[k] *= corr;
    }
    float inv = 1.0f / l;
#pragma unroll
    for (int k = 0; k < ATT_MAXD; k++) {
        int d = lane + 32 * k;
        if (d < a.hd) a.out[qi + d] = o[k] * inv;
    }
}

/* Decode: VPL values of a head row per lane (head_dim <= 32 * VPL), HG query heads per warp, U keys per step;
 * U * HG is 16 or 32, the scores a warp reduces in one pass. */
template <int VPL> struct dec_shape {
    static constexpr int HG = VPL <= 2 ? 8 : 4;
    static constexpr int U = VPL == 4 ? 8 : 4;
};

/* VPL cache elements of a row as read (16-bit caches stay packed until used: half the registers a key, so
 * the next keys can be in flight while the current ones are scored; q8_0: the codes and their block's scale). */
template <typename T, int VPL> struct alignas(16) dec_raw {
    T v[VPL];
};
template <int VPL> struct dec_raw<cu_q8, VPL> {
    unsigned q[(VPL + 3) / 4]; /* the codes, four a word */
    __half d;
};

/* VPL cache elements from element i of c on (i a multiple of VPL; head_dim a multiple of 8). */
template <int VPL, typename T> __device__ __forceinline__ void dec_ld(const T *c, long long i, dec_raw<T, VPL> &r) {
    const T *p = c + i;
    constexpr int B = VPL * (int)sizeof(T);
    if constexpr (B % 16 == 0) {
#pragma unroll
        for (int k = 0; k < B / 16; k++) reinterpret_cast<uint4 *>(r.v)[k] = reinterpret_cast<const uint4 *>(p)[k];
    } else if constexpr (B == 8) {
        *reinterpret_cast<uint2 *>(r.v) = *reinterpret_cast<const uint2 *>(p);
    } else if constexpr (B == 4) {
        *reinterpret_cast<unsigned *>(r.v) = *reinterpret_cast<const unsigned *>(p);
    } else {
        r.v[0] = p[0];
    }
}
/* q8_0: VPL codes within one block (32 % VPL == 0), two bytes into it, so read two bytes at a time */
template <int VPL> __device__ __forceinline__ void dec_ld(const cu_q8 *c, long long i, dec_raw<cu_q8, VPL> &r) {
    const unsigned char *b = cu_q8_block(c, i);
    r.d = *reinterpret_cast<const __half *>(b);
    if constexpr (VPL == 1) {
        r.q[0] = b[2 + (i & 31)];
    } else {
        const unsigned short *h = reinterpret_cast<const unsigned short *>(b + 2 + (i & 31));
#pragma unroll
        for (int k = 0; k < VPL / 2; k++)
            if (k % 2)
                r.q[k / 2] |= (unsigned)h[k] << 16;
            else
                r.q[k / 2] = h[k];
    }
}

template <int VPL, typename T> __device__ __forceinline__ void dec_zero(dec_raw<T, VPL> &r) {
#pragma unroll
    for (int e = 0; e < VPL; e++) r.v[e] = T(0.0f);
}
template <int VPL> __device__ __forceinline__ void dec_zero(dec_raw<cu_q8, VPL> &r) {
#pragma unroll
    for (int k = 0; k < (VPL + 3) / 4; k++) r.q[k] = 0;
    r.d = __float2half(0.0f);
}

/* value e of r, widened */
template <int VPL, typename T> __device__ __forceinline__ float dec_get(const dec_raw<T, VPL> &r, int e) {
    return cu_kv_ld(&r.v[e]);
}
template <int VPL> __device__ __forceinline__ float dec_get(const dec_raw<cu_q8, VPL> &r, int e) {
    return __half2float(r.d) * (float)(signed char)(r.q[e >> 2] >> (8 * (e & 3)));
}

/* Reduce-scatter of 2 * OFF values across the warp: at each offset a lane keeps the half of its values picked
 * by its bit OFF and adds the other lane's; at the end x[0] of lane i holds value (i mod 2 * OFF) summed over
 * the lanes that differ from i in the bits below 2 * OFF. */
template <int OFF> __device__ __forceinline__ void dec_scatter(float *x, int lane) {
    bool up = lane & OFF;
#pragma unroll
    for (int i = 0; i < OFF; i++) {
        float keep = up ? x[i + OFF] : x[i], give = up ? x[i] : x[i + OFF];
        x[i] = keep + __shfl_xor_sync(0xffffffffu, give, OFF);
    }
    if constexpr (OFF > 1) dec_scatter<OFF / 2>(x, lane);
}

/* One slice of one token's cache for the query heads of one KV head (a GQA group): partial max, sum and
 * weighted values per head. Nothing is staged: a warp reads whole key and value rows straight from the
 * cache (each lane VPL values of a row), U rows of keys and values in flight at once, with its HG query
 * heads held in registers. The U x HG partial scores are summed across the warp in one reduce-scatter
 * (V - 1 shuffles for V values, instead of 5 per value), which leaves lane i the score of key i / HG for head
 * i % HG, so the softmax runs one value per lane. Warps split the group's heads into chunks of HG and the
 * slice's keys (interleaved U at a time); the key-splitting warps merge in shared memory at the end. */
template <typename T, int VPL, int PF>
__device__ __forceinline__ void att_decode(const att_args<T> &a, int splits, int keys, int hc, float *part) {
    cu_pdl_enter();
    constexpr int HG = dec_shape<VPL>::HG, U = dec_shape<VPL>::U, V = HG * U;
    extern __shared__ float sm[];
    int hd = a.hd, group = a.n_heads / a.n_kv, nw = blockDim.x >> 5, kwarps = nw / hc;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hci = warp % hc, kwi = warp / hc;
    int kvh = blockIdx.y, sp = blockIdx.x, z = blockIdx.z, ti = a.tok ? a.tok[z] : z;
    int p = a.bm.pos[ti], sq = a.bm.seq[ti];
    int lo = a.window > 0 ? max(0, p - a.window + 1) : 0;
    int len = p - lo + 1, su = dec_used(len, splits, keys);
    if (sp >= su) return; /* the merge reads only the slices used */
    int per = (len + su - 1) / su, b0 = lo + sp * per, b1 = min(b0 + per, p + 1);
    int kw = a.n_kv * hd, h0 = hci * HG, d0 = lane * VPL;
    bool lane_on = d0 < hd;
    float qr[HG][VPL], o[HG][VPL];
#pragma unroll
    for (int h = 0; h < HG; h++) {
        bool on = lane_on && h0 + h < group;
        const float *qh = a.q + (long long)ti * a.n_heads * hd + (long long)(kvh * group + h0 + h) * hd + d0;
#pragma unroll
        for (int e = 0; e < VPL; e++) {
            qr[h][e] = on ? qh[e] * a.scale : 0.0f;
            o[h][e] = 0;
        }
    }
    /* running max and sum of head (lane % HG): the same in every lane of that head */
    float m = -INFINITY, l = 0;
    int mi = lane & (V - 1), mj = mi / HG, mh = mi % HG;
    /* U keys and values of the rows from c on (zero past b1). The U positions are consecutive and a page
     * holds at least U rows (see decode_launch_v): one page lookup (and one division) for all, a second only
     * where they run into the next page, and no division per key, which keeps the unrolled code small (a
     * kernel that runs once a layer fetches all of its code cold). */
    const int *pt = a.bm.pages + (long long)sq * a.bm.maxp;
    int hoff = kvh * hd + d0;
    auto fetch = [&](int c, dec_raw<T, VPL> *kr, dec_raw<T, VPL> *vr) {
        int psz = a.bm.psz, pg = c / psz, off = c - pg * psz;
        long long base = c < b1 ? (long long)pt[pg] * psz + off : 0;
        /* rows past the page's end: row of the next page's start, minus the keys this page had */
        long long next = (pg + 1) * psz < b1 ? (long long)pt[pg + 1] * psz - (psz - off) : base;
#pragma unroll
        for (int j = 0; j < U; j++) {
            bool in = lane_on && c + j < b1;
            long long row = (off + j < psz ? base : next) + j;
            if (in) {
                dec_ld<VPL>(a.kc, row * kw + hoff, kr[j]);
                dec_ld<VPL>(a.vc, row * kw + hoff, vr[j]);
            } else {
                dec_zero(kr[j]);
                dec_zero(vr[j]);
            }
        }
    };
    int step = kwarps * U;
    dec_raw<T, VPL> kr[U], vr[U];
    if (PF) fetch(b0 + kwi * U, kr, vr);
    for (int c0 = b0 + kwi * U; c0 < b1; c0 += step) {
        /* PF: the next rows are requested before these are scored (the loads of one step overlap the
         * arithmetic of the one before); else each step loads and then waits */
        dec_raw<T, VPL> kn[U], vn[U];
        if (PF == 1)
            fetch(c0 + step, kn, vn);
        else if (!PF)
            fetch(c0, kr, vr);
        float x[V];
#pragma unroll
        for (int j = 0; j < U; j++)
#pragma unroll
            for (int h = 0; h < HG; h++) {
                float acc = 0;
#pragma unroll
                for (int e = 0; e < VPL; e++) acc += qr[h][e] * dec_get(kr[j], e);
                x[j * HG + h] = acc;
            }
        if (PF == 2) fetch(c0 + step, kn, vn); /* the keys are scored: their registers are free */
        dec_scatter<V / 2>(x, lane);
        float s = x[0];
#pragma unroll
        for (int off = V; off < 32; off <<= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (c0 + mj >= b1 || h0 + mh >= group) s = -INFINITY;
        float cm = s;
#pragma unroll
        for (int off = HG; off < V; off <<= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, off));
        float mn = fmaxf(m, cm);
        float corr = mn == -INFINITY ? 1.0f : expf(m - mn), pj = s == -INFINITY ? 0.0f : expf(s - mn), ps = pj;
#pragma unroll
        for (int off = HG; off < V; off <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
        l = l * corr + ps;
        m = mn;
#pragma unroll
        for (int h = 0; h < HG; h++) {
            float ch = __shfl_sync(0xffffffffu, corr, h);
#pragma unroll
            for (int e = 0; e < VPL; e++) o[h][e] *= ch;
        }
#pragma unroll
        for (int j = 0; j < U; j++)
#pragma unroll
            for (int h = 0; h < HG; h++) {
                float w = __shfl_sync(0xffffffffu, pj, j * HG + h);
#pragma unroll
                for (int e = 0; e < VPL; e++) o[h][e] += w * dec_get(vr[j], e);
            }
        if (PF)
#pragma unroll
            for (int j = 0; j < U; j++) {
                kr[j] = kn[j];
                vr[j] = vn[j];
            }
    }
    /* the key-splitting warps of a head chunk merge: max, sum and values per head in shared memory */
    float *ms = sm, *ls = ms + nw * HG, *os = ls + nw * HG;
    if (lane < HG) {
        ms[warp * HG + lane] = m;
        ls[warp * HG + lane] = l;
    }
#pragma unroll
    for (int h = 0; h < HG; h++)
#pragma unroll
        for (int e = 0; e < VPL; e++)
            if (lane_on) os[((long long)warp * HG + h) * hd + d0 + e] = o[h][e];
    __syncthreads();
    /* one head of one chunk a warp, all warps taking part: lane k < kwarps weighs key-warp k's partial once
     * (not once per value), and the loops stay rolled (short caches run this once, its code fetched cold) */
#pragma unroll 1
    for (int it = warp; it < hc * HG; it += nw) {
        int c = it / HG, h = it % HG;
        if (c * HG + h >= group) continue;
        float mk = lane < kwarps ? ms[(c + lane * hc) * HG + h] : -INFINITY, M = mk;
#pragma unroll
        for (int off = 16; off; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
        float f = mk == -INFINITY ? 0.0f : expf(mk - M);
        float L = warp_sum(lane < kwarps ? ls[(c + lane * hc) * HG + h] * f : 0.0f);
        /* the weights replace the maxima, which only this warp reads */
        if (lane < kwarps) ms[(c + lane * hc) * HG + h] = f;
        __syncwarp();
        float *dst = part + (((long long)z * a.n_heads + kvh * group + c * HG + h) * splits + sp) * (hd + 2);
#pragma unroll 1
        for (int d = lane; d < hd; d += 32) {
            float v = 0;
#pragma unroll 1
            for (int k = 0; k < kwarps; k++)
                v += os[((long long)(c + k * hc) * HG + h) * hd + d] * ms[(c + k * hc) * HG + h];
            dst[d] = v;
        }
        if (lane == 0) {
            dst[hd] = M;
            dst[hd + 1] = L;
        }
    }
}

template <typename T, int VPL, int PF>
__global__ void att_decode_k(att_args<T> a, int splits, int keys, int hc, float *part) {
    att_decode<T, VPL, PF>(a, splits, keys, hc, part);
}
/* 16-bit and q8_0 caches with head_dim 128 at 128 registers, four blocks of four warps a SM: left to itself the
 * compiler takes one or two more, and three blocks a SM read a long cache the slower */
template <typename T, int PF>
__global__ void __launch_bounds__(256, 2) att_decode128_k(att_args<T> a, int splits, int keys, int hc, float *part) {
    att_decode<T, 4, PF>(a, splits, keys, hc, part);
}

/* The slices of one head of one token: a thread per slice finds the weights, then a thread per output
 * value sums the slices' values (independent loads, coalesced across the threads). With qo.h (hd a multiple of
 * 32) the output is also written in q16 for the integer GEMV of the output projection. */
__global__ void att_merge_k(const float *part, int splits, int keys, int hd, const int *tok, const int *pos,
                            int window, const float *sinks, float *out, cu_q16w qo) {
    cu_pdl_enter();
    __shared__ float ws[DEC_SPLITS], red[32];
    int h = blockIdx.x, z = blockIdx.y, ti = tok ? tok[z] : z, st = hd + 2;
    const float *ph = part + ((long long)z * gridDim.x + h) * splits * st;
    int p = pos[ti], lo = window > 0 ? max(0, p - window + 1) : 0, used = dec_used(p - lo + 1, splits, keys);
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < used; s += blockDim.x) mx = fmaxf(mx, ph[s * st + hd]);
    float M = block_max(mx, red);
    if (sinks) M = fmaxf(M, sinks[h]);
    float lsum = 0;
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        float ms = ph[s * st + hd], w = ms == -INFINITY ? 0.0f : expf(ms - M);
        ws[s] = w;
        lsum += ph[s * st + hd + 1] * w;
    }
    float L = block_sum(lsum, red) + (sinks ? expf(sinks[h] - M) : 0.0f); /* its barriers publish ws */
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0;
#pragma unroll 8
        for (int s = 0; s < used; s++) v += ph[s * st + d] * ws[s];
        long long i = ((long long)ti * gridDim.x + h) * hd + d;
        float o = v / L;
        out[i] = o;
        if (qo.h) cu_q16_put(qo, o, i >> 5, 0);
    }
}

int cu_attention_reserve(cu_impl *c, int n) {
    /* the largest heads and head size seen so far (128 x 256 before any call) */
    int heads = c->att_heads ? c->att_heads : 128, hd = c->att_hd ? c->att_hd : 256;
    size_t need = (size_t)n * (size_t)heads * (size_t)rec_splits(n) * (size_t)(hd + 2) * sizeof(float);
    return cu_grow(c, (void **)&c->att_part, &c->att_part_len, need, "attention partials");
}

/* The decode kernel for head_dim: warps split the group's heads in chunks of HG, the rest of DEC_WARPS
 * split the keys. */
template <typename T, int VPL>
static int decode_launch_v(cu_impl *c, const att_args<T> &a, int n_dec, int splits, int group) {
    constexpr int HG = dec_shape<VPL>::HG;
    int hc = (group + HG - 1) / HG, kwarps = hc >= DEC_WARPS ? 1 : DEC_WARPS / hc, nw = hc * kwarps;
    if (nw > 8) {
        cu_fail(c, "attention: %d query heads per KV head is above the decode kernel's limit of %d", group, 8 * HG);
        return -1;
    }
    if (a.bm.psz < dec_shape<VPL>::U) { /* att_decode's fetch crosses at most one page boundary */
        cu_fail(c, "attention: KV pages of %d rows are below the decode kernel's %d", a.bm.psz, dec_shape<VPL>::U);
        return -1;
    }
    size_t smem = (size_t)nw * HG * (2 + (size_t)a.hd) * sizeof(float);
    dim3 grid((unsigned)splits, (unsigned)a.n_kv, (unsigned)n_dec);
    auto go = [&](auto kern) { cu_launch(c, kern, grid, nw * 32, smem, a, splits, c->dec_keys, hc, c->att_part); };
    /* packed 16-bit rows of head_dim 128 leave room for the next ones under 128 registers (other sizes: more
     * registers, fewer blocks a SM, not measured to pay) */
    if constexpr (VPL == 4 && std::is_same<T, cu_q8>::value) {
        /* at 128 registers; the next keys in flight measured no faster (the widening, not the loads, limits) */
        go(att_decode128_k<T, 0>);
    } else if constexpr (VPL == 4 && sizeof(T) == 2) {
        if (c->dec_pf == 2)
            go(att_decode128_k<T, 2>);
        else if (c->dec_pf)
            go(att_decode128_k<T, 1>);
        else
            go(att_decode128_k<T, 0>);
    } else {
        go(att_decode_k<T, VPL, 0>);
    }
    return 0;
}

template <typename T>
static int decode_launch(cu_impl *c, const att_args<T> &a, int n_dec, int splits, int group, int head_dim) {
    if (head_dim <= 32) return decode_launch_v<T, 1>(c, a, n_dec, splits, group);
    if (head_dim <= 64) return decode_launch_v<T, 2>(c, a, n_dec, splits, group);
    if (head_dim <= 128) return decode_launch_v<T, 4>(c, a, n_dec, splits, group);
    return decode_launch_v<T, 8>(c, a, n_dec, splits, group);
}

template <typename T>
static void attention_t(cu_impl *c, const float *q, const T *kc, const T *vc, sl_kv_type kt, const sl_batch_map *bm,
                        int n_heads, int n_kv, int head_dim, int window, float scale, const float *sinks, float *out) {
    int n = bm->n;
    att_args<T> a = {q, kc, vc, out, n_heads, n_kv, head_dim, window, scale, sinks, cu_bmap_of(bm), 0, 0, NULL};
    /* tokens alone in their sequence take the decode kernel, runs of several the prefill kernel */
    int n_dec = 0, *dec = NULL;
    if (!c->capturing) { /* host list of the lone tokens, kept between calls */
        if (c->att_dec_cap < n) {
            int *nd = (int *)realloc(c->att_dec, (size_t)n * sizeof *nd);
            if (!nd) {
                cu_fail(c, "out of memory");
                return;
            }
            c->att_dec = nd;
            c->att_dec_cap = n;
        }
        dec = c->att_dec;
    }
    int longest = 1;
    for (int i = 0; i < n;) {
        int j = i + 1;
        if (!c->capturing)
            while (j < n && bm->h_seq[j] == bm->h_seq[i]) j++;
        if (j - i == 1) {
            if (dec) dec[n_dec] = i;
            n_dec++;
            if (!c->capturing) {
                int len = window > 0 && window < bm->h_pos[i] + 1 ? window : bm->h_pos[i] + 1;
                longest = len > longest ? len : longest;
            }
        } else {
            a.t0 = i;
            a.n = j - i;
            if (a.n >= 16 && c->flash &&
                cu_flash_prefill(c, q, kc, vc, kt, bm, i, a.n, n_heads, n_kv, head_dim, window, scale, sinks, out)) {
                i = j;
                continue;
            }
            int tk = head_dim <= 128 ? 32 : 16;
            size_t smem = ((size_t)2 * tk * (head_dim + 1) + (size_t)ATT_Q * head_dim) * sizeof(float);
            cu_launch(c, att_prefill_k<T>, dim3(CU_BLOCKS(j - i, ATT_Q), (unsigned)n_heads), ATT_Q * 32, smem, a, tk);
        }
        i = j;
    }
    if (n_dec) {
        /* a recorded step cannot know the cache lengths: a fixed number of slices; else short caches
         * take fewer */
        int splits = rec_splits(n_dec);
        if (!c->capturing) {
            splits = dec_used(longest, splits, c->dec_keys > 1 ? c->dec_keys : 128);
            /* a recording of this many tokens later finds its partials ready */
            if (cu_attention_reserve(c, n_dec)) return;
        }
        size_t need = (size_t)n_dec * n_heads * splits * (size_t)(head_dim + 2) * sizeof(float);
        if (cu_grow(c, (void **)&c->att_part, &c->att_part_len, need, "attention partials")) return;
        if (dec && n_dec < n) { /* some tokens are in runs: the decode launch takes a list */
            if (cu_grow(c, (void **)&c->att_tok, &c->att_tok_len, (size_t)n_dec * sizeof(int), "attention tokens"))
                return;
            /* from pageable memory: staged before the call returns, so the list may change after */
            cudaMemcpyAsync(c->att_tok, dec, (size_t)n_dec * sizeof(int), cudaMemcpyHostToDevice, c->st);
            a.tok = c->att_tok;
        }
        if (decode_launch<T>(c, a, n_dec, splits, n_heads / n_kv, head_dim)) return;
        /* one token's output in q16 too, for the output projection (see att_merge_k) */
        cu_q16w qo = {NULL, NULL, NULL, NULL};
        if (n == 1 && head_dim % 32 == 0) qo = cu_q16_want(c, n_heads * head_dim);
        cu_launch(c, att_merge_k, dim3((unsigned)n_heads, (unsigned)n_dec), 128, 0, c->att_part, splits, c->dec_keys,
                  head_dim, a.tok, a.bm.pos, window, sinks, out, qo);
        if (qo.h) cu_q16_made(c, out, n_heads * head_dim);
    }
}

void cu_attention(sl_backend *b, const float *q, const void *kc, const void *vc, sl_kv_type kt, const sl_batch_map *bm,
                  int n_heads, int n_kv, int head_dim, int window, float scale, const float *sinks, float *out) {
    cu_impl *c = cu_of(b);
    if (head_dim > ATT_MAXD * 32 || head_dim % 8) {
        cu_fail(c, "attention: head_dim %d is not a multiple of 8 up to %d, which the CUDA kernels take", head_dim,
                ATT_MAXD * 32);
        return;
    }
    if (n_heads > c->att_heads) c->att_heads = n_heads;
    if (head_dim > c->att_hd) c->att_hd = head_dim;
    cu_kv_dispatch(c, kt, [&](auto *t) {
        using T = typename std::remove_pointer<decltype(t)>::type;
        attention_t<T>(c, q, (const T *)kc, (const T *)vc, kt, bm, n_heads, n_kv, head_dim, window, scale, sinks, out);
    });
    cu_check_launch(c, "attention");
}
