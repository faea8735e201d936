/* Causal grouped-query attention over the KV cache, one (token, head) pair per task. */
#include <math.h>

#include "backend/cpu/cpu.h"

typedef struct {
    cpu_impl *c;
    const float *q, *kc, *vc;
    int n, pos0, n_heads, n_kv, hd, window;
    float scale;
    float *out;
} att_job;

static void att_task(void *ctx, int64_t b, int64_t e, int tid) {
    att_job *j = ctx;
    float *sc = j->c->scratch[tid];
    int group = j->n_heads / j->n_kv;
    size_t kv_stride = (size_t)j->n_kv * (size_t)j->hd;
    for (int64_t it = b; it < e; it++) {
        int i = (int)(it / j->n_heads), h = (int)(it % j->n_heads), kvh = h / group;
        int p = j->pos0 + i;
        int lo = j->window > 0 && p - j->window + 1 > 0 ? p - j->window + 1 : 0;
        const float *qv = j->q + (size_t)i * (size_t)j->n_heads * (size_t)j->hd + (size_t)h * (size_t)j->hd;
        float mx = -INFINITY;
        for (int t = lo; t <= p; t++) {
            float s = cpu_dot(qv, j->kc + (size_t)t * kv_stride + (size_t)kvh * (size_t)j->hd, j->hd) * j->scale;
            sc[t - lo] = s;
            if (s > mx) mx = s;
        }
        float sum = 0;
        for (int t = lo; t <= p; t++) {
            sc[t - lo] = expf(sc[t - lo] - mx);
            sum += sc[t - lo];
        }
        float inv = 1.0f / sum;
        float *o = j->out + (size_t)i * (size_t)j->n_heads * (size_t)j->hd + (size_t)h * (size_t)j->hd;
        for (int d = 0; d < j->hd; d++) o[d] = 0;
        for (int t = lo; t <= p; t++) {
            float w = sc[t - lo] * inv;
            const float *v = j->vc + (size_t)t * kv_stride + (size_t)kvh * (size_t)j->hd;
            for (int d = 0; d < j->hd; d++) o[d] += w * v[d];
        }
    }
}

void cpu_attention(sl_backend *b, const float *q, const float *kc, const float *vc, int n, int pos0, int n_heads,
                   int n_kv, int head_dim, int window, float scale, float *out) {
    cpu_impl *c = cpu_of(b);
    if (cpu_scratch_reserve(c, (size_t)(pos0 + n)) != 0) return;
    att_job j = {c, q, kc, vc, n, pos0, n_heads, n_kv, head_dim, window, scale, out};
    sl_pool_for(c->pool, (int64_t)n * n_heads, 1, att_task, &j);
}
