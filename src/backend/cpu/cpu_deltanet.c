/* Gated delta-net (linear attention) for the CPU: causal depthwise conv, then the recurrent delta rule
 *   S <- S * exp(g);  S <- S + k (beta (v - S^T k))^T;  o = S^T q
 * with L2-normalised q, k and q scaled by 1/sqrt(k_dim). The recurrence is exact, so prefill and decode
 * share it (token order within a head is sequential; heads run in parallel). */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

void cpu_conv1d_silu(sl_backend *b, const float *x, int n, int channels, const float *w, int kernel, float *state,
                     float *out) {
    (void)b;
    int hist = kernel - 1;
    for (int c = 0; c < channels; c++) {
        const float *wc = w + (size_t)c * (size_t)kernel;
        for (int t = 0; t < n; t++) {
            /* window: inputs at times t-hist .. t; negative times come from the state */
            float s = 0;
            for (int k = 0; k < kernel; k++) {
                int src = t - hist + k;
                float v = src >= 0 ? x[(size_t)src * (size_t)channels + (size_t)c]
                                   : state[(size_t)(hist + src) * (size_t)channels + (size_t)c];
                s += wc[k] * v;
            }
            out[(size_t)t * (size_t)channels + (size_t)c] = s / (1.0f + expf(-s));
        }
    }
    /* the new state is the last `hist` inputs of state ++ x */
    for (int h = 0; h < hist; h++) {
        int src = n - hist + h;
        for (int c = 0; c < channels; c++) {
            float v = src >= 0 ? x[(size_t)src * (size_t)channels + (size_t)c]
                               : state[(size_t)(hist + src) * (size_t)channels + (size_t)c];
            /* writing row h only reads rows > h of the old state, so in-place order is safe */
            state[(size_t)h * (size_t)channels + (size_t)c] = v;
        }
    }
}

typedef struct {
    cpu_impl *c;
    const sl_deltanet_dims *d;
    const float *qkv, *a, *bb, *A_log, *dt_bias;
    float *state;
    int n;
    float *out;
} dn_job;

static float softplusf(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

static void l2norm(const float *x, int n, float *y) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv;
}

static void dn_task(void *ctx, int64_t hb, int64_t he, int tid) {
    dn_job *j = ctx;
    const sl_deltanet_dims *d = j->d;
    int kd = d->k_dim, vd = d->v_dim, nk = d->n_k_heads, nv = d->n_v_heads;
    int width = 2 * nk * kd + nv * vd;
    float *q = j->c->scratch[tid], *k = q + kd, *kv = k + kd;
    float scale = 1.0f / sqrtf((float)kd);
    for (int64_t h = hb; h < he; h++) {
        int kh = d->tiled ? (int)h % nk : (int)h / (nv / nk); /* which key head this value head reads */
        float *S = j->state + (size_t)h * (size_t)kd * (size_t)vd;
        float A = -expf(j->A_log[h]);
        for (int t = 0; t < j->n; t++) {
            const float *row = j->qkv + (size_t)t * (size_t)width;
            l2norm(row + (size_t)kh * (size_t)kd, kd, q);
            l2norm(row + (size_t)(nk + kh) * (size_t)kd, kd, k);
            for (int i = 0; i < kd; i++) q[i] *= scale;
            const float *v = row + (size_t)2 * (size_t)nk * (size_t)kd + (size_t)h * (size_t)vd;
            float g = A * softplusf(j->a[(size_t)t * (size_t)nv + (size_t)h] + j->dt_bias[h]);
            float beta = 1.0f / (1.0f + expf(-j->bb[(size_t)t * (size_t)nv + (size_t)h]));
            float decay = expf(g);
            for (size_t i = 0; i < (size_t)kd * (size_t)vd; i++) S[i] *= decay;
            for (int c = 0; c < vd; c++) kv[c] = 0;
            for (int i = 0; i < kd; i++) {
                const float *Si = S + (size_t)i * (size_t)vd;
                for (int c = 0; c < vd; c++) kv[c] += Si[c] * k[i];
            }
            for (int c = 0; c < vd; c++) kv[c] = (v[c] - kv[c]) * beta; /* delta */
            float *o = j->out + (size_t)t * (size_t)nv * (size_t)vd + (size_t)h * (size_t)vd;
            for (int c = 0; c < vd; c++) o[c] = 0;
            for (int i = 0; i < kd; i++) {
                float *Si = S + (size_t)i * (size_t)vd;
                for (int c = 0; c < vd; c++) {
                    Si[c] += k[i] * kv[c];
                    o[c] += Si[c] * q[i];
                }
            }
        }
    }
}

void cpu_deltanet(sl_backend *b, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                  const float *A_log, const float *dt_bias, float *state, int n, float *out) {
    cpu_impl *c = cpu_of(b);
    if (cpu_scratch_reserve(c, (size_t)(2 * d->k_dim + d->v_dim)) != 0) return;
    dn_job j = {c, d, qkv, a, bb, A_log, dt_bias, state, n, out};
    sl_pool_for(c->pool, d->n_v_heads, 1, dn_task, &j);
}

void cpu_gated_rmsnorm(sl_backend *b, float *x, const float *z, const float *w, int rows, int dim, float eps) {
    (void)b;
    for (int r = 0; r < rows; r++) {
        float *xr = x + (size_t)r * (size_t)dim;
        const float *zr = z + (size_t)r * (size_t)dim;
        float ss = 0;
        for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) xr[i] = (w[i] * (xr[i] * inv)) * (zr[i] / (1.0f + expf(-zr[i])));
    }
}
