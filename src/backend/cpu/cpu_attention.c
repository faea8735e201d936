/* Causal grouped-query attention over the KV cache. One task is one (token, KV head) pair: the query
 * heads sharing that KV head are scored together, so each cached key and value row is read once per
 * group instead of once per query head. f16 / bf16 / q8_0 caches are widened a head row at a time into
 * the task's scratch; f32 caches are read in place. */
#include <math.h>

#include "backend/cpu/cpu.h"
#include "backend/ggml_types.h"
#include "core/half.h"

typedef struct {
    cpu_impl *c;
    const float *q;
    const void *kc, *vc;
    sl_kv_type kt;
    const sl_batch_map *bm;
    int n_heads, n_kv, hd, window;
    float scale;
    const float *sinks; /* [n_heads] or NULL */
    float *out;
} att_job;

/* Rows of one KV head sit a whole cache row apart (often 4 KB or more), where hardware prefetchers stop:
 * fetch the row this many positions ahead. */
#define ROWS_AHEAD 4

/* the cache row of position t in a sequence whose page table is pt */
static inline size_t row_of(const int32_t *pt, int P, int t) {
    return (size_t)pt[t / P] * (size_t)P + (size_t)(t % P);
}

static inline void prefetch_row(const void *cache, size_t at, size_t bytes) {
    const char *r = (const char *)cache + at;
    for (size_t d = 0; d < bytes; d += 64) __builtin_prefetch(r + d);
}

/* hd values of the cache from byte `at` as float32: in place for f32, else widened into buf */
static inline const float *kv_row(const void *cache, sl_kv_type kt, size_t at, int hd, float *buf) {
    const char *p = (const char *)cache + at;
    if (kt == SL_KV_F16) {
        const uint16_t *h = (const uint16_t *)p;
        for (int d = 0; d < hd; d++) buf[d] = sl_f16_to_f32(h[d]);
        return buf;
    }
    if (kt == SL_KV_BF16) {
        const uint16_t *h = (const uint16_t *)p;
        for (int d = 0; d < hd; d++) buf[d] = sl_bf16_to_f32(h[d]);
        return buf;
    }
    if (kt == SL_KV_Q8_0) {
        sl_ggml_dequant_row(SL_GGML_Q8_0, p, buf, hd);
        return buf;
    }
    return (const float *)p;
}

__attribute__((target_clones("avx2", "default"))) static void att_task(void *ctx, int64_t b, int64_t e, int tid) {
    att_job *j = ctx;
    int G = j->n_heads / j->n_kv, hd = j->hd;
    size_t q_stride = (size_t)j->n_heads * (size_t)hd;
    /* bytes of a cache row (every KV head), of a head's slice, and where head kvh's starts */
    size_t row_b = sl_kv_bytes(j->kt, (size_t)j->n_kv * (size_t)hd), head_b = sl_kv_bytes(j->kt, (size_t)hd);
    for (int64_t it = b; it < e; it++) {
        int i = (int)(it / j->n_kv), kvh = (int)(it % j->n_kv);
        const sl_batch_map *bm = j->bm;
        int p = bm->pos[i];
        const int32_t *pt = bm->pages + (size_t)bm->seq[i] * (size_t)bm->max_pages; /* its sequence's pages */
        int P = bm->page_size;
        int lo = j->window > 0 && p - j->window + 1 > 0 ? p - j->window + 1 : 0;
        int len = p - lo + 1;
        float *sc = j->c->scratch[tid];                     /* [G][len] */
        float *wide = sc + (size_t)G * (size_t)j->bm->span; /* [hd]: a widened cache row */
        /* query heads kvh*G .. kvh*G + G-1 are contiguous in q and out */
        const float *q0 = j->q + (size_t)i * q_stride + (size_t)kvh * (size_t)G * (size_t)hd;
        float *o0 = j->out + (size_t)i * q_stride + (size_t)kvh * (size_t)G * (size_t)hd;
        size_t h0 = (size_t)kvh * head_b;
        for (int t = 0; t < len; t++) {
            const float *k = kv_row(j->kc, j->kt, row_of(pt, P, lo + t) * row_b + h0, hd, wide);
            if (t + ROWS_AHEAD < len) prefetch_row(j->kc, row_of(pt, P, lo + t + ROWS_AHEAD) * row_b + h0, head_b);
            for (int g = 0; g < G; g++)
                sc[(size_t)g * (size_t)len + (size_t)t] = cpu_dot_inline(q0 + (size_t)g * hd, k, hd) * j->scale;
        }
        for (int g = 0; g < G; g++) {
            float *s = sc + (size_t)g * (size_t)len, mx = -INFINITY, sum = 0;
            /* a sink is one more logit in the softmax, with no value behind it */
            float sink = j->sinks ? j->sinks[kvh * G + g] : -INFINITY;
            for (int t = 0; t < len; t++) mx = s[t] > mx ? s[t] : mx;
            mx = sink > mx ? sink : mx;
            if (j->sinks) sum = expf(sink - mx);
            for (int t = 0; t < len; t++) {
                s[t] = expf(s[t] - mx);
                sum += s[t];
            }
            float inv = 1.0f / sum;
            for (int t = 0; t < len; t++) s[t] *= inv;
        }
        for (size_t d = 0; d < (size_t)G * (size_t)hd; d++) o0[d] = 0;
        for (int t = 0; t < len; t++) {
            const float *v = kv_row(j->vc, j->kt, row_of(pt, P, lo + t) * row_b + h0, hd, wide);
            if (t + ROWS_AHEAD < len) prefetch_row(j->vc, row_of(pt, P, lo + t + ROWS_AHEAD) * row_b + h0, head_b);
            for (int g = 0; g < G; g++) {
                float w = sc[(size_t)g * (size_t)len + (size_t)t];
                float *o = o0 + (size_t)g * (size_t)hd;
                for (int d = 0; d < hd; d++) o[d] += w * v[d];
            }
        }
    }
}

void cpu_attention(sl_backend *b, const float *q, const void *kc, const void *vc, sl_kv_type kt, const sl_batch_map *bm,
                   int n_heads, int n_kv, int head_dim, int window, float scale, const float *sinks, float *out) {
    cpu_impl *c = cpu_of(b);
    if (cpu_scratch_reserve(c, (size_t)(n_heads / n_kv) * (size_t)bm->span + (size_t)head_dim) != 0) return;
    att_job j = {c, q, kc, vc, kt, bm, n_heads, n_kv, head_dim, window, scale, sinks, out};
    sl_pool_for(c->pool, (int64_t)bm->n * n_kv, 1, att_task, &j);
}
