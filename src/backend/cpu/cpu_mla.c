/* Multi-head latent attention on the CPU. The cache keeps one row per position: the normalised latent
 * and the roped shared key part. kv_b_proj is absorbed on both sides, so no per-head key or value is
 * ever expanded: a head's query moves into latent space, attends over the latent rows, and the
 * weighted latent moves back out through the head's value rows. One task is one (token, head) pair. */
#include <math.h>

#include "backend/cpu/cpu.h"

/* Rotary embedding of one rope-dim vector at position pos: pairs (i, i + half), or (2i, 2i + 1) when
 * interleaved, turned by pos * inv_freq[i]. */
static void rope_vec(float *v, int rope, int interleave, float pos, const float *inv_freq, float attn_factor) {
    int half = rope / 2;
    for (int f = 0; f < half; f++) {
        float ang = pos * inv_freq[f];
        float cs = cosf(ang) * attn_factor, sn = sinf(ang) * attn_factor;
        int i0 = interleave ? 2 * f : f, i1 = interleave ? 2 * f + 1 : f + half;
        float a = v[i0], c = v[i1];
        v[i0] = a * cs - c * sn;
        v[i1] = c * cs + a * sn;
    }
}

void cpu_mla_rope_store(sl_backend *b, float *q, float *kv, const sl_batch_map *bm, const sl_mla_dims *d,
                        const float *kv_norm, float eps, const float *inv_freq, float attn_factor, float *cache) {
    (void)b;
    int qh = d->nope + d->rope, width = d->kv_lora + d->rope;
    for (int i = 0; i < bm->n; i++) {
        float pos = (float)bm->pos[i];
        for (int h = 0; h < d->n_heads; h++)
            rope_vec(q + (size_t)i * (size_t)(d->n_heads * qh) + (size_t)(h * qh + d->nope), d->rope, d->interleave,
                     pos, inv_freq, attn_factor);
        float *r = kv + (size_t)i * (size_t)width, ss = 0;
        for (int c = 0; c < d->kv_lora; c++) ss += r[c] * r[c];
        float inv = 1.0f / sqrtf(ss / (float)d->kv_lora + eps);
        for (int c = 0; c < d->kv_lora; c++) r[c] = r[c] * inv * kv_norm[c];
        rope_vec(r + d->kv_lora, d->rope, d->interleave, pos, inv_freq, attn_factor);
        memmove(cache + sl_bm_row(bm, bm->pages, bm->seq[i], bm->pos[i]) * width, r, (size_t)width * sizeof(float));
    }
}

typedef struct {
    cpu_impl *c;
    const float *q, *cache, *wkv_b;
    const sl_batch_map *bm;
    sl_mla_dims d;
    float scale;
    float *out;
} mla_job;

__attribute__((target_clones("avx2", "default"))) static void mla_task(void *ctx, int64_t b, int64_t e, int tid) {
    mla_job *j = ctx;
    const sl_mla_dims *d = &j->d;
    int H = d->n_heads, L = d->kv_lora, R = d->rope, qh = d->nope + d->rope, width = L + R;
    const sl_batch_map *bm = j->bm;
    float *ql = j->c->scratch[tid], *ol = ql + L, *sc = ol + L; /* q in latent space, weighted latent, scores */
    for (int64_t it = b; it < e; it++) {
        int i = (int)(it / H), h = (int)(it % H);
        int p = bm->pos[i];
        const int32_t *pt = bm->pages + (size_t)bm->seq[i] * (size_t)bm->max_pages;
        const float *qn = j->q + (size_t)i * (size_t)(H * qh) + (size_t)(h * qh), *qr = qn + d->nope;
        const float *wk = j->wkv_b + (size_t)h * (size_t)(d->nope + d->v) * (size_t)L, *wv = wk + (size_t)d->nope * L;
        /* q_latent = W_k^T q_nope: key row j of the head scaled by q_nope[j], summed */
        for (int c = 0; c < L; c++) ql[c] = 0;
        for (int r = 0; r < d->nope; r++) {
            float a = qn[r];
            const float *w = wk + (size_t)r * (size_t)L;
            for (int c = 0; c < L; c++) ql[c] += a * w[c];
        }
        float mx = -INFINITY;
        for (int t = 0; t <= p; t++) {
            const float *row = j->cache + (size_t)(pt[t / bm->page_size] * bm->page_size + t % bm->page_size) * width;
            float s = (cpu_dot_inline(ql, row, L) + cpu_dot_inline(qr, row + L, R)) * j->scale;
            sc[t] = s;
            mx = s > mx ? s : mx;
        }
        float sum = 0;
        for (int t = 0; t <= p; t++) {
            sc[t] = expf(sc[t] - mx);
            sum += sc[t];
        }
        float inv = 1.0f / sum;
        for (int c = 0; c < L; c++) ol[c] = 0;
        for (int t = 0; t <= p; t++) {
            const float *row = j->cache + (size_t)(pt[t / bm->page_size] * bm->page_size + t % bm->page_size) * width;
            float w = sc[t] * inv;
            for (int c = 0; c < L; c++) ol[c] += w * row[c];
        }
        float *o = j->out + (size_t)i * (size_t)(H * d->v) + (size_t)(h * d->v);
        for (int v = 0; v < d->v; v++) o[v] = cpu_dot_inline(wv + (size_t)v * (size_t)L, ol, L);
    }
}

void cpu_mla_attention(sl_backend *b, const float *q, const float *cache, const sl_batch_map *bm, const sl_mla_dims *d,
                       const float *wkv_b, float scale, float *out) {
    cpu_impl *c = cpu_of(b);
    if (cpu_scratch_reserve(c, 2 * (size_t)d->kv_lora + (size_t)bm->span) != 0) return;
    mla_job j = {c, q, cache, wkv_b, bm, *d, scale, out};
    sl_pool_for(c->pool, (int64_t)bm->n * d->n_heads, 1, mla_task, &j);
}
