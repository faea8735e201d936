/* Causal GQA attention on the GPU, in fp32 with online softmax (no n x n score buffer), over paged KV
 * caches: every key row is found through its sequence's page table (see sl_batch_map).
 * Prefill (a run of several tokens of one sequence): runs of 16 tokens or more go to the tensor-core kernel
 * (cuda_flash.cu) where it has the head size; otherwise a block is 4 consecutive queries of one head; key/
 * value tiles are staged in shared memory and each lane scores one key of the tile. Decode (tokens alone
 * in their sequence): split-K over each token's cache, each block a slice of positions for one head of one
 * token, then a pass that merges the slices. Positions and sequences are always read from device memory,
 * so recorded steps replay at any position. Every kernel is instantiated for each cache element type T
 * (float, __half, __nv_bfloat16) and widens keys and values to fp32 as it reads them. */
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define ATT_Q 4        /* queries (warps) per prefill block */
#define ATT_MAXD 8     /* head_dim / 32 held per lane: head_dim <= 256 */
#define DEC_SPLITS 64  /* most decode slices per token (the cache length is unknown when recording) */
#define DEC_WARPS 4

template <typename T> struct att_args {
    const float *q;
    const T *kc, *vc;
    float *out;
    int n_heads, n_kv, hd, window;
    float scale;
    const float *sinks; /* per query head: a logit in the softmax's denominator with no value (NULL: none) */
    cu_bmap bm;
    int t0, n;         /* prefill: the run's first token and its length */
    const int *tok;    /* decode: the tokens of the launch's z index (NULL: z itself) */
};

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
            ks[j * ldk + d] = ok ? cu_kv_ld(a.kc + r) : 0;
            vs[j * ldk + d] = ok ? cu_kv_ld(a.vc + r) : 0;
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

/* One slice of one token's cache for one query head: partial max, sum and weighted values. */
template <typename T>
__global__ void __launch_bounds__(DEC_WARPS * 32) att_decode_k(att_args<T> a, int splits, float *part) {
    cu_pdl_enter();
    __shared__ float red[DEC_WARPS][ATT_MAXD * 32 + 2];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y, sp = blockIdx.x, kvh = h / (a.n_heads / a.n_kv);
    int z = blockIdx.z, ti = a.tok ? a.tok[z] : z;
    int p = a.bm.pos[ti], sq = a.bm.seq[ti];
    int lo = a.window > 0 ? max(0, p - a.window + 1) : 0;
    int len = p - lo + 1, per = (len + splits - 1) / splits;
    int b0 = lo + sp * per, b1 = min(b0 + per, p + 1);
    int kw = a.n_kv * a.hd;
    float q[ATT_MAXD], o[ATT_MAXD];
#pragma unroll
    for (int k = 0; k < ATT_MAXD; k++) {
        int d = lane + 32 * k;
        q[k] = d < a.hd ? a.q[(long long)ti * a.n_heads * a.hd + h * a.hd + d] * a.scale : 0;
        o[k] = 0;
    }
    float m = -INFINITY, l = 0;
    for (int t = b0 + warp; t < b1; t += DEC_WARPS) {
        long long row = cu_bm_row(a.bm, sq, t) * kw + kvh * a.hd;
        const T *kr = a.kc + row;
        float s = 0;
#pragma unroll
        for (int k = 0; k < ATT_MAXD; k++) {
            int d = lane + 32 * k;
            if (d < a.hd) s += q[k] * cu_kv_ld(kr + d);
        }
        s = warp_sum(s);
        float mn = fmaxf(m, s), corr = expf(m - mn), pj = expf(s - mn);
        l = l * corr + pj;
        const T *vr = a.vc + row;
#pragma unroll
        for (int k = 0; k < ATT_MAXD; k++) {
            int d = lane + 32 * k;
            o[k] = o[k] * corr + (d < a.hd ? pj * cu_kv_ld(vr + d) : 0);
        }
        m = mn;
    }
    /* merge the warps */
#pragma unroll
    for (int k = 0; k < ATT_MAXD; k++) red[warp][lane + 32 * k] = o[k];
    if (lane == 0) {
        red[warp][ATT_MAXD * 32] = m;
        red[warp][ATT_MAXD * 32 + 1] = l;
    }
    __syncthreads();
    if (warp) return;
    float M = -INFINITY;
    for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, red[w][ATT_MAXD * 32]);
    float L = 0;
    float *dst = part + (((long long)z * a.n_heads + h) * splits + sp) * (a.hd + 2);
    for (int w = 0; w < DEC_WARPS; w++) {
        float mw = red[w][ATT_MAXD * 32];
        L += mw == -INFINITY ? 0 : red[w][ATT_MAXD * 32 + 1] * expf(mw - M);
    }
    for (int d = lane; d < a.hd; d += 32) {
        float v = 0;
        for (int w = 0; w < DEC_WARPS; w++) {
            float mw = red[w][ATT_MAXD * 32];
            if (mw != -INFINITY) v += red[w][d] * expf(mw - M);
        }
        dst[d] = v;
    }
    if (lane == 0) {
        dst[a.hd] = M;
        dst[a.hd + 1] = L;
    }
}

__global__ void att_merge_k(const float *part, int splits, int hd, const int *tok, const float *sinks, float *out) {
    cu_pdl_enter();
    int h = blockIdx.x, z = blockIdx.y, ti = tok ? tok[z] : z;
    const float *ph = part + ((long long)z * gridDim.x + h) * splits * (hd + 2);
    float M = sinks ? sinks[h] : -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, ph[s * (hd + 2) + hd]);
    float L = sinks ? expf(sinks[h] - M) : 0.0f;
    for (int s = 0; s < splits; s++) {
        float ms = ph[s * (hd + 2) + hd];
        if (ms != -INFINITY) L += ph[s * (hd + 2) + hd + 1] * expf(ms - M);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0;
        for (int s = 0; s < splits; s++) {
            float ms = ph[s * (hd + 2) + hd];
            if (ms != -INFINITY) v += ph[s * (hd + 2) + d] * expf(ms - M);
        }
        out[((long long)ti * gridDim.x + h) * hd + d] = v / L;
    }
}

int cu_attention_reserve(cu_impl *c, int n) {
    /* the largest heads and head size seen so far (128 x 256 before any call) */
    int heads = c->att_heads ? c->att_heads : 128, hd = c->att_hd ? c->att_hd : 256;
    size_t need = (size_t)n * (size_t)heads * (size_t)rec_splits(n) * (size_t)(hd + 2) * sizeof(float);
    return cu_grow(c, (void **)&c->att_part, &c->att_part_len, need, "attention partials");
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
            int s = (longest + 127) / 128;
            splits = s < 1 ? 1 : s > splits ? splits : s;
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
        cu_launch(c, att_decode_k<T>, dim3((unsigned)splits, (unsigned)n_heads, (unsigned)n_dec), DEC_WARPS * 32, 0,
                  a, splits, c->att_part);
        cu_launch(c, att_merge_k, dim3((unsigned)n_heads, (unsigned)n_dec), 128, 0, c->att_part, splits, head_dim,
                  a.tok, sinks, out);
    }
}

void cu_attention(sl_backend *b, const float *q, const void *kc, const void *vc, sl_kv_type kt, const sl_batch_map *bm,
                  int n_heads, int n_kv, int head_dim, int window, float scale, const float *sinks, float *out) {
    cu_impl *c = cu_of(b);
    if (head_dim > ATT_MAXD * 32) {
        cu_fail(c, "attention: head_dim %d is above the CUDA kernels' limit of %d", head_dim, ATT_MAXD * 32);
        return;
    }
    if (n_heads > c->att_heads) c->att_heads = n_heads;
    if (head_dim > c->att_hd) c->att_hd = head_dim;
    cu_kv_dispatch(kt, [&](auto *t) {
        using T = typename std::remove_pointer<decltype(t)>::type;
        attention_t<T>(c, q, (const T *)kc, (const T *)vc, kt, bm, n_heads, n_kv, head_dim, window, scale, sinks, out);
    });
    cu_check_launch(c, "attention");
}
