/* Gated delta-net on the GPU: the causal depthwise conv + SiLU (one thread per channel walks the
 * tokens), and the delta rule with the state in registers: a block owns one value head and a tile of
 * state columns for the whole sequence (see deltanet_k). */
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define DN_COLS 32 /* state columns per block, one per lane */
#define DN_ROWS 16 /* key rows per warp, in registers */
#define DN_MAXW 32 /* warps per block: key dims up to 512 */

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

/* The delta rule with the state in registers: a block owns one value head and DN_COLS state columns
 * (one per lane), its warps split the key dimension DN_ROWS rows each, and partial dot products meet in
 * shared memory. The n tokens run in one launch without writing the state back in between. The state is
 * read before waiting on the previous kernel: only an earlier step of this layer wrote it. */
__global__ void __launch_bounds__(DN_COLS *DN_MAXW) deltanet_k(sl_deltanet_dims d, const float *qkv, const float *a,
                                                               const float *bb, const float *A_log,
                                                               const float *dt_bias, float *state, int n, float *out) {
    __shared__ float qk[2 * DN_ROWS * DN_MAXW], part[DN_MAXW][DN_COLS], red[2][DN_MAXW];
    int kd = d.k_dim, vd = d.v_dim, nk = d.n_k_heads, nv = d.n_v_heads;
    int h = blockIdx.x, lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int c = blockIdx.y * DN_COLS + lane, r0 = wp * DN_ROWS;
    bool col = c < vd;
    float *Sg = state + (long long)h * kd * vd;
    float S[DN_ROWS];
#pragma unroll
    for (int r = 0; r < DN_ROWS; r++) S[r] = col && r0 + r < kd ? Sg[(long long)(r0 + r) * vd + c] : 0.0f;
    cu_pdl_enter();
    int kh = d.tiled ? h % nk : h / (nv / nk); /* which key head this value head reads */
    int width = 2 * nk * kd + nv * vd;
    float A = -expf(A_log[h]), qscale = rsqrtf((float)kd);
    for (int t = 0; t < n; t++) {
        const float *row = qkv + (long long)t * width;
        float sq = 0, sk = 0;
        for (int i = threadIdx.x; i < kd; i += blockDim.x) {
            float qi = row[kh * kd + i], ki = row[(nk + kh) * kd + i];
            qk[i] = qi;
            qk[kd + i] = ki;
            sq += qi * qi;
            sk += ki * ki;
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        if (lane == 0) {
            red[0][wp] = sq;
            red[1][wp] = sk;
        }
        float v = col ? row[2 * nk * kd + h * vd + c] : 0.0f;
        float g = A * softplus(a[(long long)t * nv + h] + dt_bias[h]);
        float beta = cu_sigmoid(bb[(long long)t * nv + h]), decay = expf(g);
        __syncthreads();
        sq = sk = 0;
        for (int w = 0; w < nw; w++) {
            sq += red[0][w];
            sk += red[1][w];
        }
        float nq = rsqrtf(sq + 1e-6f) * qscale, nkk = rsqrtf(sk + 1e-6f);
        float kv = 0;
#pragma unroll
        for (int r = 0; r < DN_ROWS; r++) {
            S[r] *= decay;
            if (r0 + r < kd) kv += S[r] * qk[kd + r0 + r];
        }
        part[wp][lane] = kv;
        __syncthreads();
        kv = 0;
        for (int w = 0; w < nw; w++) kv += part[w][lane];
        float delta = (v - kv * nkk) * beta * nkk, o = 0;
#pragma unroll
        for (int r = 0; r < DN_ROWS; r++) {
            if (r0 + r < kd) {
                S[r] += qk[kd + r0 + r] * delta;
                o += S[r] * qk[r0 + r];
            }
        }
        __syncthreads(); /* every warp has read part (kv) */
        part[wp][lane] = o;
        __syncthreads();
        if (wp == 0 && col) {
            o = 0;
            for (int w = 0; w < nw; w++) o += part[w][lane];
            out[(long long)t * nv * vd + h * vd + c] = o * nq;
        }
        __syncthreads(); /* part, qk and red are rewritten by the next token */
    }
#pragma unroll
    for (int r = 0; r < DN_ROWS; r++)
        if (col && r0 + r < kd) Sg[(long long)(r0 + r) * vd + c] = S[r];
}

void cu_deltanet(sl_backend *b, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                 const float *A_log, const float *dt_bias, float *state, int n, float *out) {
    cu_impl *c = cu_of(b);
    int warps = (d->k_dim + DN_ROWS - 1) / DN_ROWS;
    if (warps > DN_MAXW) {
        cu_fail(c, "deltanet: key head dim %d is above the CUDA kernel's limit of %d", d->k_dim, DN_ROWS * DN_MAXW);
        return;
    }
    dim3 grid((unsigned)d->n_v_heads, CU_BLOCKS(d->v_dim, DN_COLS));
    cu_launch(c, deltanet_k, grid, 32 * warps, 0, *d, qkv, a, bb, A_log, dt_bias, state, n, out);
    cu_check_launch(c, "deltanet");
}
