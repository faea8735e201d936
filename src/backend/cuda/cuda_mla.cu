/* Multi-head latent attention on the GPU, the twin of cpu_mla.c. The cache keeps one row per position,
 * [normalised latent | roped shared key part]; kv_b_proj is absorbed on both sides of the attention, so
 * no per-head key or value is expanded. One block per (token, head): the query moves into latent space
 * in shared memory, each warp runs an online softmax over its share of the positions, the warps merge,
 * and the weighted latent goes back out through the head's value rows. Positions come from the batch map
 * in device memory, so recorded steps replay at any position. */
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define MLA_WARPS 4

/* Rotary pair f of a rope-dim vector: (f, f + half), or (2f, 2f + 1) when interleaved. */
__device__ __forceinline__ void mla_rope_pair(float *v, int f, int half, int interleave, float pos,
                                              const float *inv_freq, float attn_factor) {
    float sn, cs;
    sincosf(pos * inv_freq[f], &sn, &cs);
    cs *= attn_factor;
    sn *= attn_factor;
    int i0 = interleave ? 2 * f : f, i1 = interleave ? 2 * f + 1 : f + half;
    float a = v[i0], c = v[i1];
    v[i0] = a * cs - c * sn;
    v[i1] = c * cs + a * sn;
}

/* One block per token: RMSNorm of the latent, rotary embedding of the query heads' rope parts and of the
 * shared key part, then the row [latent | k_rope] into the cache. */
__global__ void mla_rope_store_k(float *q, float *kv, cu_bmap bm, sl_mla_dims d, const float *kv_norm, float eps,
                                 const float *inv_freq, float attn_factor, float *cache) {
    cu_pdl_enter();
    __shared__ float sh[32];
    int i = blockIdx.x, qh = d.nope + d.rope, width = d.kv_lora + d.rope, half = d.rope / 2;
    float *r = kv + (long long)i * width;
    float pos = (float)bm.pos[i];
    float ss = 0;
    for (int c = threadIdx.x; c < d.kv_lora; c += blockDim.x) ss += r[c] * r[c];
    float inv = rsqrtf(block_sum(ss, sh) / (float)d.kv_lora + eps);
    float *row = cache + cu_bm_row(bm, bm.seq[i], bm.pos[i]) * width;
    for (int c = threadIdx.x; c < d.kv_lora; c += blockDim.x) {
        float v = r[c] * inv * kv_norm[c];
        r[c] = v;
        row[c] = v;
    }
    /* pairs of the n_heads query heads, then of the key part */
    for (int e = threadIdx.x; e < (d.n_heads + 1) * half; e += blockDim.x) {
        int h = e / half, f = e % half;
        float *v = h < d.n_heads ? q + (long long)i * d.n_heads * qh + h * qh + d.nope : r + d.kv_lora;
        mla_rope_pair(v, f, half, d.interleave, pos, inv_freq, attn_factor);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < d.rope; c += blockDim.x) row[d.kv_lora + c] = r[d.kv_lora + c];
}

void cu_mla_rope_store(sl_backend *b, float *q, float *kv, const sl_batch_map *bm, const sl_mla_dims *d,
                       const float *kv_norm, float eps, const float *inv_freq, float attn_factor, float *cache) {
    cu_impl *c = cu_of(b);
    if (bm->n <= 0) return;
    cu_launch(c, mla_rope_store_k, bm->n, 256, 0, q, kv, cu_bmap_of(bm), *d, kv_norm, eps, inv_freq, attn_factor,
              cache);
    cu_check_launch(c, "latent attention norm, rope and cache store");
}

/* Shared memory: q_latent [kv_lora], q_rope [rope], per warp the running latent sum [MLA_WARPS][kv_lora]
 * and its max and sum [MLA_WARPS][2]. */
__global__ void __launch_bounds__(MLA_WARPS * 32)
    mla_attention_k(const float *q, const float *cache, cu_bmap bm, sl_mla_dims d, const float *wkv_b, float scale,
                    float *out) {
    cu_pdl_enter();
    extern __shared__ float sm[];
    int L = d.kv_lora, R = d.rope, qh = d.nope + d.rope, width = L + R;
    int i = blockIdx.y, h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *ql = sm, *qr = ql + L, *acc = qr + R, *ml = acc + MLA_WARPS * L;
    const float *qn = q + (long long)i * d.n_heads * qh + (long long)h * qh;
    const float *wk = wkv_b + (long long)h * (d.nope + d.v) * L, *wv = wk + (long long)d.nope * L;
    for (int c = threadIdx.x; c < L; c += blockDim.x) { /* W_k^T q_nope, coalesced over c */
        float s = 0;
        for (int j = 0; j < d.nope; j++) s += qn[j] * wk[(long long)j * L + c];
        ql[c] = s;
    }
    for (int c = threadIdx.x; c < R; c += blockDim.x) qr[c] = qn[d.nope + c];
    float *a = acc + warp * L;
    for (int c = lane; c < L; c += 32) a[c] = 0;
    __syncthreads();
    int p = bm.pos[i], sq = bm.seq[i];
    float m = -INFINITY, l = 0;
    for (int t = warp; t <= p; t += MLA_WARPS) {
        const float *row = cache + cu_bm_row(bm, sq, t) * width;
        float s = 0;
        for (int c = lane; c < L; c += 32) s += ql[c] * row[c];
        for (int c = lane; c < R; c += 32) s += qr[c] * row[L + c];
        s = warp_sum(s) * scale;
        float mn = fmaxf(m, s), corr = expf(m - mn), e = expf(s - mn);
        l = l * corr + e;
        for (int c = lane; c < L; c += 32) a[c] = a[c] * corr + e * row[c];
        m = mn;
    }
    if (lane == 0) {
        ml[2 * warp] = m;
        ml[2 * warp + 1] = l;
    }
    __syncthreads();
    float mx = -INFINITY, tot = 0;
    for (int w = 0; w < MLA_WARPS; w++) mx = fmaxf(mx, ml[2 * w]);
    for (int w = 0; w < MLA_WARPS; w++) tot += ml[2 * w] > -INFINITY ? expf(ml[2 * w] - mx) * ml[2 * w + 1] : 0.0f;
    for (int c = threadIdx.x; c < L; c += blockDim.x) { /* the weighted latent, into ql (no longer needed) */
        float s = 0;
        for (int w = 0; w < MLA_WARPS; w++)
            if (ml[2 * w] > -INFINITY) s += expf(ml[2 * w] - mx) * acc[w * L + c];
        ql[c] = s / tot;
    }
    __syncthreads();
    float *o = out + (long long)i * d.n_heads * d.v + (long long)h * d.v;
    for (int v = warp; v < d.v; v += MLA_WARPS) {
        const float *w = wv + (long long)v * L;
        float s = 0;
        for (int c = lane; c < L; c += 32) s += w[c] * ql[c];
        s = warp_sum(s);
        if (lane == 0) o[v] = s;
    }
}

void cu_mla_attention(sl_backend *b, const float *q, const float *cache, const sl_batch_map *bm, const sl_mla_dims *d,
                      const float *wkv_b, float scale, float *out) {
    cu_impl *c = cu_of(b);
    if (bm->n <= 0) return;
    size_t smem = ((size_t)d->kv_lora * (1 + MLA_WARPS) + (size_t)d->rope + 2 * MLA_WARPS) * sizeof(float);
    if (smem > 48 * 1024) {
        cu_fail(c, "latent attention: kv_lora_rank %d needs %zu bytes of shared memory (at most 48 KiB)", d->kv_lora,
                smem);
        return;
    }
    cu_launch(c, mla_attention_k, dim3((unsigned)d->n_heads, (unsigned)bm->n), MLA_WARPS * 32, smem, q, cache,
              cu_bmap_of(bm), *d, wkv_b, scale, out);
    cu_check_launch(c, "latent attention");
}
