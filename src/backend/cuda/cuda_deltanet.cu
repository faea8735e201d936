/* Gated delta-net on the GPU: the causal depthwise conv + SiLU (one thread per channel walks the
 * tokens), and the delta rule with the state in shared memory: a block owns one value head and a tile
 * of DN_COLS state columns for the whole sequence, each thread one column, so the n tokens of a prefill
 * run in one launch without writing the state back in between. */
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define DN_COLS 64

__global__ void conv1d_silu_k(const float *x, int n, int channels, const float *w, int kernel, float *state,
                              float *out) {
    cu_pdl_enter();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    int hist = kernel - 1;
    const float *wc = w + (long long)c * kernel;
    for (int t = 0; t < n; t++) {
        float s = 0;
        for (int k = 0; k < kernel; k++) {
            int src = t - hist + k;
            float v = src >= 0 ? x[(long long)src * channels + c] : state[(long long)(hist + src) * channels + c];
            s += wc[k] * v;
        }
        out[(long long)t * channels + c] = s * cu_sigmoid(s);
    }
    for (int h = 0; h < hist; h++) { /* row h reads only rows > h of the old state */
        int src = n - hist + h;
        state[(long long)h * channels + c] =
            src >= 0 ? x[(long long)src * channels + c] : state[(long long)(hist + src) * channels + c];
    }
}

void cu_conv1d_silu(sl_backend *b, const float *x, int n, int channels, const float *w, int kernel, float *state,
                    float *out) {
    cu_impl *c = cu_of(b);
    if (channels <= 0) return;
    cu_launch(c, conv1d_silu_k, CU_BLOCKS(channels, 128), 128, 0, x, n, channels, w, kernel, state, out);
    cu_check_launch(c, "conv1d");
}

__device__ __forceinline__ float softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

__global__ void __launch_bounds__(DN_COLS) deltanet_k(sl_deltanet_dims d, const float *qkv, const float *a,
                                                      const float *bb, const float *A_log, const float *dt_bias,
                                                      float *state, int n, float *out) {
    cu_pdl_enter();
    extern __shared__ float sm[];
    int kd = d.k_dim, vd = d.v_dim, nk = d.n_k_heads, nv = d.n_v_heads;
    float *S = sm, *q = S + kd * DN_COLS, *k = q + kd;
    __shared__ float red[32];
    int h = blockIdx.x, c = blockIdx.y * DN_COLS + threadIdx.x, tid = threadIdx.x;
    bool col = c < vd;
    int kh = d.tiled ? h % nk : h / (nv / nk); /* which key head this value head reads */
    int width = 2 * nk * kd + nv * vd;
    float *Sg = state + (long long)h * kd * vd;
    for (int i = 0; i < kd; i++) S[i * DN_COLS + tid] = col ? Sg[(long long)i * vd + c] : 0;
    float A = -expf(A_log[h]), qscale = rsqrtf((float)kd);
    for (int t = 0; t < n; t++) {
        const float *row = qkv + (long long)t * width;
        float sq = 0, sk = 0;
        for (int i = tid; i < kd; i += DN_COLS) {
            float qi = row[kh * kd + i], ki = row[(nk + kh) * kd + i];
            q[i] = qi;
            k[i] = ki;
            sq += qi * qi;
            sk += ki * ki;
        }
        float nq = rsqrtf(block_sum(sq, red) + 1e-6f);
        float nkk = rsqrtf(block_sum(sk, red) + 1e-6f);
        __syncthreads();
        float g = A * softplus(a[(long long)t * nv + h] + dt_bias[h]);
        float beta = cu_sigmoid(bb[(long long)t * nv + h]), decay = expf(g);
        if (col) {
            float kv = 0;
            for (int i = 0; i < kd; i++) {
                float s = S[i * DN_COLS + tid] * decay;
                S[i * DN_COLS + tid] = s;
                kv += s * (k[i] * nkk);
            }
            float v = row[2 * nk * kd + h * vd + c];
            float delta = (v - kv) * beta, o = 0;
            for (int i = 0; i < kd; i++) {
                float s = S[i * DN_COLS + tid] + (k[i] * nkk) * delta;
                S[i * DN_COLS + tid] = s;
                o += s * (q[i] * nq * qscale);
            }
            out[(long long)t * nv * vd + h * vd + c] = o;
        }
        __syncthreads(); /* q and k are rewritten by the next token */
    }
    if (col)
        for (int i = 0; i < kd; i++) Sg[(long long)i * vd + c] = S[i * DN_COLS + tid];
}

void cu_deltanet(sl_backend *b, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                 const float *A_log, const float *dt_bias, float *state, int n, float *out) {
    cu_impl *c = cu_of(b);
    size_t smem = ((size_t)d->k_dim * DN_COLS + 2 * (size_t)d->k_dim) * sizeof(float);
    if (smem > 48 * 1024) {
        cu_fail(c, "deltanet: key head dim %d is above the CUDA kernel's limit of %d", d->k_dim,
                (int)(48 * 1024 / sizeof(float) / (DN_COLS + 2)));
        return;
    }
    dim3 grid((unsigned)d->n_v_heads, CU_BLOCKS(d->v_dim, DN_COLS));
    cu_launch(c, deltanet_k, grid, DN_COLS, smem, *d, qkv, a, bb, A_log, dt_bias, state, n, out);
    cu_check_launch(c, "deltanet");
}
