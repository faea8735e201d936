/* Gated delta-net on the GPU: the causal depthwise conv + SiLU (one thread per channel walks the
 * tokens), and the delta rule with the state in registers: a block owns one value head and a tile of
 * state columns for the whole sequence, token by token for decode (deltanet_k) and a chunk of tokens at a
 * time for prefill (deltanet_chunk_k). */
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define DN_COLS 32 /* state columns per block, one per lane */
#define DN_ROWS 16 /* key rows per warp, in registers */
#define DN_MAXW 32 /* warps per block: key dims up to 512 */

/* With seq set, a decode batch: grid row y is token y, alone in sequence seq[y] (state + seq[y] * sstride). */
__global__ void conv1d_silu_k(const float *x, int n, int channels, const float *w, int kernel, float *state, float *out,
                              const int *seq, long long sstride) {
    cu_pdl_enter();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    if (seq) {
        x += (long long)blockIdx.y * channels;
        out += (long long)blockIdx.y * channels;
        state += seq[blockIdx.y] * sstride;
    }
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
    cu_launch(c, conv1d_silu_k, CU_BLOCKS(channels, 128), 128, 0, x, n, channels, w, kernel, state, out,
              (const int *)NULL, 0LL);
    cu_check_launch(c, "conv1d");
}

void cu_conv1d_silu_seqs(sl_backend *b, const float *x, int channels, const float *w, int kernel, float *state,
                         size_t stride, const sl_batch_map *bm, float *out) {
    cu_impl *c = cu_of(b);
    if (channels <= 0 || bm->n <= 0) return;
    cu_launch(c, conv1d_silu_k, dim3(CU_BLOCKS(channels, 128), (unsigned)bm->n), 128, 0, x, 1, channels, w, kernel,
              state, out, (const int *)bm->seq, (long long)stride);
    cu_check_launch(c, "conv1d");
}

__device__ __forceinline__ float softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* A lane's column c of the state rows [r0, r0 + DN_ROWS) of one head, S[kd][vd], to and from registers. */
__device__ __forceinline__ void tile_load(const float *Sg, int kd, int vd, int r0, int c, float (&S)[DN_ROWS]) {
#pragma unroll
    for (int r = 0; r < DN_ROWS; r++) S[r] = c < vd && r0 + r < kd ? Sg[(long long)(r0 + r) * vd + c] : 0.0f;
}

__device__ __forceinline__ void tile_store(float *Sg, int kd, int vd, int r0, int c, const float (&S)[DN_ROWS]) {
#pragma unroll
    for (int r = 0; r < DN_ROWS; r++)
        if (c < vd && r0 + r < kd) Sg[(long long)(r0 + r) * vd + c] = S[r];
}

/* The delta rule with the state in registers: a block owns one value head and DN_COLS state columns
 * (one per lane), its warps split the key dimension DN_ROWS rows each, and partial dot products meet in
 * shared memory. The n tokens run in one launch without writing the state back in between. The state is
 * read before waiting on the previous kernel: only an earlier step of this layer wrote it. With seq set, a
 * decode batch: grid z is token z, alone in sequence seq[z] (its state at state + seq[z] * sstride; the
 * sequence list is read after the wait). */
__global__ void __launch_bounds__(DN_COLS *DN_MAXW)
    deltanet_k(sl_deltanet_dims d, const float *qkv, const float *a, const float *bb, const float *A_log,
               const float *dt_bias, float *state, int n, float *out, const int *seq, long long sstride) {
    __shared__ float qk[2 * DN_ROWS * DN_MAXW], part[DN_MAXW][DN_COLS], red[2][DN_MAXW];
    int kd = d.k_dim, vd = d.v_dim, nk = d.n_k_heads, nv = d.n_v_heads;
    int h = blockIdx.x, lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int c = blockIdx.y * DN_COLS + lane, r0 = wp * DN_ROWS;
    bool col = c < vd;
    int width = 2 * nk * kd + nv * vd;
    if (seq) {
        cu_pdl_enter();
        long long z = blockIdx.z;
        qkv += z * width;
        a += z * nv;
        bb += z * nv;
        out += z * nv * vd;
        state += seq[z] * sstride;
    }
    float *Sg = state + (long long)h * kd * vd;
    float S[DN_ROWS];
    tile_load(Sg, kd, vd, r0, c, S);
    if (!seq) cu_pdl_enter();
    int kh = d.tiled ? h % nk : h / (nv / nk); /* which key head this value head reads */
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
    tile_store(Sg, kd, vd, r0, c, S);
}

#define DN_CHUNK 32      /* tokens per chunk of the chunked form */
#define DN_CHUNK_MAXW 16 /* its warps per block: key dims up to 256 (its shared buffers grow with them) */

/* Shared memory of deltanet_chunk_k, in floats, for key dim kd and nw warps. */
static size_t chunk_floats(int kd, int nw) {
    const size_t C = DN_CHUNK;
    return 2 * C * (size_t)(kd + 1) /* q, k */ + (size_t)nw * C * DN_COLS /* partial products */ +
           2 * C * (C + 1) /* the two masked Gram matrices */ + 4 * C * DN_COLS /* K S0, Q S0, U, V */ + 3 * C;
}

/* The delta rule in its chunked form, for prefill: the same state tile per block as deltanet_k, but
 * DN_CHUNK tokens at a time. With G_t the cumulative log decay inside the chunk and S0 the state before it,
 * the state after token t is exp(G_t) S0 + sum_{i<=t} exp(G_t - G_i) k_i u_i^T, where the pseudo-values
 * solve the unit lower-triangular system
 *   u_t = beta_t (v_t - exp(G_t) S0^T k_t) - sum_{i<t} beta_t exp(G_t - G_i) (k_t . k_i) u_i,
 * so o_t = exp(G_t) S0^T q_t + sum_{i<=t} exp(G_t - G_i) (q_t . k_i) u_i and the chunk ends with
 * S = exp(G_L) S0 + sum_i exp(G_L - G_i) k_i u_i^T. The products with S0 and the Gram matrices are
 * parallel over the chunk's tokens; only the triangular solve (one lane per state column) is sequential,
 * where deltanet_k waits on a block barrier several times per token. q and k are normalised as there. */
__global__ void __launch_bounds__(DN_COLS *DN_CHUNK_MAXW, 1)
    deltanet_chunk_k(sl_deltanet_dims d, const float *qkv, const float *a, const float *bb, const float *A_log,
                     const float *dt_bias, float *state, int n, float *out) {
    constexpr int C = DN_CHUNK, C1 = DN_CHUNK + 1;
    extern __shared__ float4 smem4[];
    int kd = d.k_dim, vd = d.v_dim, nk = d.n_k_heads, nv = d.n_v_heads, K1 = kd + 1;
    int h = blockIdx.x, lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *qs = (float *)smem4, *ks = qs + C * K1, *part = ks + C * K1, *Akk = part + nw * C * DN_COLS;
    float *Aqk = Akk + C * C1, *kS = Aqk + C * C1, *qS = kS + C * DN_COLS, *U = qS + C * DN_COLS;
    float *V = U + C * DN_COLS, *G = V + C * DN_COLS, *beta = G + C, *dec = beta + C;
    int c = blockIdx.y * DN_COLS + lane, r0 = wp * DN_ROWS;
    bool col = c < vd;
    float *Sg = state + (long long)h * kd * vd;
    float S[DN_ROWS];
    tile_load(Sg, kd, vd, r0, c, S);
    cu_pdl_enter();
    int kh = d.tiled ? h % nk : h / (nv / nk);
    int width = 2 * nk * kd + nv * vd;
    float A = -expf(A_log[h]), qscale = rsqrtf((float)kd);
    for (int t0 = 0; t0 < n; t0 += C) {
        int L = min(C, n - t0);
        /* q and k of the chunk, then each row normalised by one warp */
        for (int e = threadIdx.x; e < L * kd; e += blockDim.x) {
            int t = e / kd, i = e - t * kd;
            const float *row = qkv + (long long)(t0 + t) * width;
            qs[t * K1 + i] = row[kh * kd + i];
            ks[t * K1 + i] = row[(nk + kh) * kd + i];
        }
        for (int t = wp; t < L; t += nw) /* this block's value columns, for the triangular solve */
            V[t * DN_COLS + lane] = col ? qkv[(long long)(t0 + t) * width + 2 * nk * kd + h * vd + c] : 0.0f;
        if (threadIdx.x < L) {
            int t = t0 + threadIdx.x;
            G[threadIdx.x] = A * softplus(a[(long long)t * nv + h] + dt_bias[h]);
            beta[threadIdx.x] = cu_sigmoid(bb[(long long)t * nv + h]);
        }
        __syncthreads();
        for (int t = wp; t < L; t += nw) {
            float sq = 0, sk = 0;
            for (int i = lane; i < kd; i += 32) {
                sq += qs[t * K1 + i] * qs[t * K1 + i];
                sk += ks[t * K1 + i] * ks[t * K1 + i];
            }
            float nq = rsqrtf(warp_sum(sq) + 1e-6f) * qscale, nkk = rsqrtf(warp_sum(sk) + 1e-6f);
            for (int i = lane; i < kd; i += 32) {
                qs[t * K1 + i] *= nq;
                ks[t * K1 + i] *= nkk;
            }
        }
        if (threadIdx.x == 0) /* cumulative log decay: G[t] = g_0 + ... + g_t */
            for (int t = 1; t < L; t++) G[t] += G[t - 1];
        __syncthreads();
        /* the masked Gram matrices, lane i of a row t, four rows of a warp at once (independent sums); then
         * S0^T k_t, S0^T q_t partial over each warp's rows */
        for (int tb = wp; tb < C; tb += 4 * nw) {
            float kk[4] = {0, 0, 0, 0}, qk[4] = {0, 0, 0, 0};
            if (lane < L)
#pragma unroll 2
                for (int j = 0; j < kd; j++) {
                    float ki = ks[lane * K1 + j];
#pragma unroll
                    for (int m = 0; m < 4; m++) {
                        int t = min(tb + m * nw, C - 1);
                        kk[m] += ks[t * K1 + j] * ki;
                        qk[m] += qs[t * K1 + j] * ki;
                    }
                }
#pragma unroll
            for (int m = 0; m < 4; m++) {
                int t = tb + m * nw;
                if (t >= C) break;
                float f = t < L && lane <= t ? expf(G[t] - G[lane]) : 0.0f;
                Akk[t * C1 + lane] = lane < t && t < L ? beta[t] * f * kk[m] : 0.0f;
                Aqk[t * C1 + lane] = f * qk[m];
            }
        }
        for (int pass = 0; pass < 2; pass++) {
            const float *src = pass ? qs : ks;
            float *dst = pass ? qS : kS;
            for (int t = 0; t < L; t++) {
                float p = 0;
#pragma unroll
                for (int r = 0; r < DN_ROWS; r++)
                    if (r0 + r < kd) p += S[r] * src[t * K1 + r0 + r];
                part[(wp * C + t) * DN_COLS + lane] = p;
            }
            __syncthreads();
            for (int t = wp; t < L; t += nw) {
                float p = 0;
                for (int w = 0; w < nw; w++) p += part[(w * C + t) * DN_COLS + lane];
                dst[t * DN_COLS + lane] = p;
            }
            __syncthreads();
        }
        /* the triangular solve for the pseudo-values, one lane per state column */
        if (wp == 0) {
            for (int t = 0; t < L; t++) {
                /* four partial sums: the loads of a step go out together instead of one per dependent add */
                float u0 = beta[t] * (V[t * DN_COLS + lane] - expf(G[t]) * kS[t * DN_COLS + lane]), u1 = 0, u2 = 0,
                      u3 = 0;
                int i = 0;
                for (; i + 4 <= t; i += 4) {
                    u0 -= Akk[t * C1 + i] * U[i * DN_COLS + lane];
                    u1 -= Akk[t * C1 + i + 1] * U[(i + 1) * DN_COLS + lane];
                    u2 -= Akk[t * C1 + i + 2] * U[(i + 2) * DN_COLS + lane];
                    u3 -= Akk[t * C1 + i + 3] * U[(i + 3) * DN_COLS + lane];
                }
                for (; i < t; i++) u0 -= Akk[t * C1 + i] * U[i * DN_COLS + lane];
                U[t * DN_COLS + lane] = (u0 + u1) + (u2 + u3);
            }
        }
        if (threadIdx.x < L) dec[threadIdx.x] = expf(G[L - 1] - G[threadIdx.x]);
        __syncthreads();
        for (int t = wp; t < L; t += nw) {
            float o = expf(G[t]) * qS[t * DN_COLS + lane];
            for (int i = 0; i <= t; i++) o += Aqk[t * C1 + i] * U[i * DN_COLS + lane];
            if (col) out[(long long)(t0 + t) * nv * vd + h * vd + c] = o;
        }
        float last = expf(G[L - 1]);
#pragma unroll
        for (int r = 0; r < DN_ROWS; r++) S[r] *= last;
        for (int i = 0; i < L; i++) { /* the rows' sums are independent: one load of u per token */
            float w = dec[i] * U[i * DN_COLS + lane];
#pragma unroll
            for (int r = 0; r < DN_ROWS; r++)
                if (r0 + r < kd) S[r] += ks[i * K1 + r0 + r] * w;
        }
        __syncthreads(); /* the next chunk rewrites the shared buffers */
    }
    tile_store(Sg, kd, vd, r0, c, S);
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
    /* decode steps take the recurrence; a prompt takes the chunked form where its buffers fit */
    size_t smem = chunk_floats(d->k_dim, warps) * sizeof(float);
    if (n > 1 && c->dn_chunked && warps <= DN_CHUNK_MAXW && smem <= (size_t)c->smem_optin &&
        cudaFuncSetAttribute(deltanet_chunk_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess)
        cu_launch(c, deltanet_chunk_k, grid, 32 * warps, smem, *d, qkv, a, bb, A_log, dt_bias, state, n, out);
    else
        cu_launch(c, deltanet_k, grid, 32 * warps, 0, *d, qkv, a, bb, A_log, dt_bias, state, n, out, (const int *)NULL,
                  0LL);
    cu_check_launch(c, "deltanet");
}

void cu_deltanet_seqs(sl_backend *b, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                      const float *A_log, const float *dt_bias, float *state, size_t stride, const sl_batch_map *bm,
                      float *out) {
    cu_impl *c = cu_of(b);
    int warps = (d->k_dim + DN_ROWS - 1) / DN_ROWS;
    if (warps > DN_MAXW) {
        cu_fail(c, "deltanet: key head dim %d is above the CUDA kernel's limit of %d", d->k_dim, DN_ROWS * DN_MAXW);
        return;
    }
    if (bm->n <= 0) return;
    dim3 grid((unsigned)d->n_v_heads, CU_BLOCKS(d->v_dim, DN_COLS), (unsigned)bm->n);
    cu_launch(c, deltanet_k, grid, 32 * warps, 0, *d, qkv, a, bb, A_log, dt_bias, state, 1, out, (const int *)bm->seq,
              (long long)stride);
    cu_check_launch(c, "deltanet");
}
