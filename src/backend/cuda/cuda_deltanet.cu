/* Gated delta-net on the GPU: the causal depthwise conv + SiLU (a thread per channel walks a slice of the
 * tokens), and the delta rule: token by token with the state in registers for decode (deltanet_k), and in
 * chunks for prefill (deltanet_prep_k for what each chunk's own tokens give, all chunks at once, then
 * deltanet_state_k carrying the state across them). */
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define DN_COLS 32 /* state columns per block, one per lane */
#define DN_ROWS 16 /* key rows per warp, in registers */
#define DN_MAXW 32 /* warps per block: key dims up to 512 */

#define CONV_TOK 16 /* tokens per thread of a prompt's conv */

/* The causal conv + SiLU, a thread per channel. Without seq, grid row y takes tokens [tok y, tok (y + 1))
 * of the n, so a prompt's tokens run in parallel: tok >= kernel - 1 keeps every read of the old state in
 * row 0, which advances the state after its own reads (x and out do not overlap). With seq set, a decode
 * batch: grid row y is token y, alone in sequence seq[y] (state + seq[y] * sstride, n = 1), and each row
 * advances its own sequence's state. */
__global__ void conv1d_silu_k(const float *x, int n, int channels, const float *w, int kernel, float *state, float *out,
                              const int *seq, long long sstride, int tok) {
    cu_pdl_enter();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    int t0 = 0, t1 = n;
    if (seq) {
        x += (long long)blockIdx.y * channels;
        out += (long long)blockIdx.y * channels;
        state += seq[blockIdx.y] * sstride;
    } else {
        t0 = blockIdx.y * tok;
        t1 = min(n, t0 + tok);
    }
    int hist = kernel - 1;
    const float *wc = w + (long long)c * kernel;
    for (int t = t0; t < t1; t++) {
        float s = 0;
        for (int k = 0; k < kernel; k++) {
            int src = t - hist + k;
            float v = src >= 0 ? x[(long long)src * channels + c] : state[(long long)(hist + src) * channels + c];
            s += wc[k] * v;
        }
        out[(long long)t * channels + c] = s * cu_sigmoid(s);
    }
    if (t0) return;
    for (int h = 0; h < hist; h++) { /* row h reads only rows > h of the old state */
        int src = n - hist + h;
        state[(long long)h * channels + c] =
            src >= 0 ? x[(long long)src * channels + c] : state[(long long)(hist + src) * channels + c];
    }
}

void cu_conv1d_silu(sl_backend *b, const float *x, int n, int channels, const float *w, int kernel, float *state,
                    float *out) {
    cu_impl *c = cu_of(b);
    if (channels <= 0 || n <= 0) return;
    int tok = kernel - 1 <= CONV_TOK ? CONV_TOK : n; /* a longer history: one row walks all the tokens */
    cu_launch(c, conv1d_silu_k, dim3(CU_BLOCKS(channels, 128), CU_BLOCKS(n, tok)), 128, 0, x, n, channels, w, kernel,
              state, out, (const int *)NULL, 0LL, tok);
    cu_check_launch(c, "conv1d");
}

void cu_conv1d_silu_seqs(sl_backend *b, const float *x, int channels, const float *w, int kernel, float *state,
                         size_t stride, const sl_batch_map *bm, float *out) {
    cu_impl *c = cu_of(b);
    if (channels <= 0 || bm->n <= 0) return;
    cu_launch(c, conv1d_silu_k, dim3(CU_BLOCKS(channels, 128), (unsigned)bm->n), 128, 0, x, 1, channels, w, kernel,
              state, out, (const int *)bm->seq, (long long)stride, 1);
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

#define DN_CHUNK 32      /* tokens per chunk of the chunked form: a warp's lanes span one */
#define DN_CHUNK_MAXW 16 /* warps of the state kernel: key dims up to 256 */
#define DN_SCOLS 16      /* state columns per block of the state kernel */

/* The delta rule in its chunked form, for prefill. With G_t the cumulative log decay inside a chunk and S0
 * the state before it, the state after token t is exp(G_t) S0 + sum_{i<=t} exp(G_t - G_i) k_i u_i^T, where
 * the pseudo-values solve the unit lower-triangular system (I + A) u = beta v - beta exp(G) K S0 with
 * A[t][i] = beta_t exp(G_t - G_i) (k_t . k_i), i < t. So u = U0 - W S0, U0 = (I + A)^-1 beta v and
 * W = (I + A)^-1 beta exp(G) K, which only the chunk's own tokens make; then
 *   o_t = exp(G_t) S0^T q_t + sum_{i<=t} exp(G_t - G_i) (q_t . k_i) u_i,
 *   S = exp(G_L) S0 + sum_i exp(G_L - G_i) k_i u_i^T.
 * deltanet_prep_k makes every chunk's part of every value head at once (normalised q and k, the masked Gram
 * matrices, the triangular solves); deltanet_state_k walks the chunks in order, three products per chunk
 * with the state in registers. Before, one kernel did all of it per chunk, the solve on one warp while the
 * state waited: 785 us per layer of 512 tokens (Qwen3.5-35B-A3B shape). q and k are normalised as in
 * deltanet_k. */
struct dn_chunks {
    float *q;   /* [nv][n][kd]: normalised q times 1/sqrt(kd) */
    float *w;   /* [nv][n][kd]: W */
    float *k;   /* [nv][n][kd]: normalised k_i times exp(G_L - G_i) */
    float *u;   /* [nv][n][vd]: U0 */
    float *aqk; /* [nv][chunks][C][C]: exp(G_t - G_i) (q_t . k_i) for i <= t, else 0 */
    float *eg;  /* [nv][n]: exp(G_t) */
};

static size_t dn_chunk_floats(const sl_deltanet_dims *d, int n) {
    size_t nv = (size_t)d->n_v_heads, N = (size_t)n, ch = (N + DN_CHUNK - 1) / DN_CHUNK;
    return nv * (3 * N * (size_t)d->k_dim + N * (size_t)d->v_dim + ch * DN_CHUNK * DN_CHUNK + N);
}

/* shared floats of the two kernels */
static size_t dn_prep_floats(int kd) {
    return 2 * (size_t)DN_CHUNK * (size_t)(kd + 1) + (size_t)DN_CHUNK * (DN_CHUNK + 1) + 2 * DN_CHUNK;
}
static size_t dn_state_floats(int nw) { /* key rows padded to the warps' DN_ROWS each */
    const size_t C = DN_CHUNK, KS = (size_t)nw * DN_ROWS;
    return 3 * C * KS /* q, w, k */ + (size_t)nw * C * DN_SCOLS /* partial sums */ + 2 * C * DN_SCOLS /* u, q S0 */ +
           C * C + C;
}

/* grid (value head, chunk), 256 threads */
__global__ void __launch_bounds__(256) deltanet_prep_k(sl_deltanet_dims d, const float *qkv, const float *a,
                                                       const float *bb, const float *A_log, const float *dt_bias,
                                                       int n, dn_chunks o) {
    constexpr int C = DN_CHUNK, C1 = DN_CHUNK + 1;
    extern __shared__ float4 smem4[];
    int kd = d.k_dim, vd = d.v_dim, nk = d.n_k_heads, nv = d.n_v_heads, K1 = kd + 1;
    int h = blockIdx.x, t0 = blockIdx.y * C, L = min(C, n - t0);
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *qs = (float *)smem4, *ks = qs + C * K1, *akk = ks + C * K1, *G = akk + C * C1, *beta = G + C;
    cu_pdl_enter();
    int kh = d.tiled ? h % nk : h / (nv / nk);
    int width = 2 * nk * kd + nv * vd;
    for (int e = threadIdx.x; e < C * kd; e += blockDim.x) {
        int t = e / kd, i = e - t * kd;
        float q = 0, k = 0;
        if (t < L) {
            const float *row = qkv + (long long)(t0 + t) * width;
            q = row[kh * kd + i];
            k = row[(nk + kh) * kd + i];
        }
        qs[t * K1 + i] = q;
        ks[t * K1 + i] = k;
    }
    if (wp == 0) { /* the decays' running sum inside the chunk by one warp's scan */
        float g = 0, be = 0;
        if (lane < L) {
            g = -expf(A_log[h]) * softplus(a[(long long)(t0 + lane) * nv + h] + dt_bias[h]);
            be = cu_sigmoid(bb[(long long)(t0 + lane) * nv + h]);
        }
#pragma unroll
        for (int s = 1; s < 32; s <<= 1) {
            float y = __shfl_up_sync(0xffffffffu, g, s);
            if (lane >= s) g += y;
        }
        G[lane] = g;
        beta[lane] = be;
    }
    __syncthreads();
    float qscale = rsqrtf((float)kd);
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
    __syncthreads();
    /* the masked Gram matrices: a warp's lanes are the columns i of one row t */
    float *aqk = o.aqk + ((long long)h * gridDim.y + blockIdx.y) * C * C;
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        int t = e / C, i = e % C;
        bool in = t < L && i <= t;
        float kk = 0, qk = 0;
        if (in)
            for (int j = 0; j < kd; j++) {
                float ki = ks[i * K1 + j];
                kk += ks[t * K1 + j] * ki;
                qk += qs[t * K1 + j] * ki;
            }
        float f = in ? expf(G[t] - G[i]) : 0.0f;
        akk[t * C1 + i] = i < t ? beta[t] * f * kk : 0.0f;
        aqk[e] = f * qk;
    }
    __syncthreads();
    /* (I + A) x = rhs by forward substitution, a thread per column of [beta v | beta exp(G) k] */
    for (int j = threadIdx.x; j < vd + kd; j += blockDim.x) {
        bool isv = j < vd;
        float x[C];
#pragma unroll
        for (int t = 0; t < C; t++) {
            float r0 = 0, r1 = 0; /* two partial sums: half the chain of dependent adds */
            if (t < L)
                r0 = isv ? beta[t] * qkv[(long long)(t0 + t) * width + 2 * nk * kd + h * vd + j]
                         : beta[t] * expf(G[t]) * ks[t * K1 + j - vd];
#pragma unroll
            for (int i = 0; i + 1 < t; i += 2) {
                r0 -= akk[t * C1 + i] * x[i];
                r1 -= akk[t * C1 + i + 1] * x[i + 1];
            }
            if (t & 1) r0 -= akk[t * C1 + t - 1] * x[t - 1];
            x[t] = r0 + r1;
        }
        for (int t = 0; t < L; t++) {
            long long r = (long long)h * n + t0 + t;
            if (isv)
                o.u[r * vd + j] = x[t];
            else
                o.w[r * kd + j - vd] = x[t];
        }
    }
    float gl = G[L - 1];
    for (int e = threadIdx.x; e < L * kd; e += blockDim.x) {
        int t = e / kd, i = e - t * kd;
        long long r = ((long long)h * n + t0 + t) * kd + i;
        o.q[r] = qs[t * K1 + i];
        o.k[r] = ks[t * K1 + i] * expf(gl - G[t]);
    }
    if (threadIdx.x < L) o.eg[(long long)h * n + t0 + threadIdx.x] = expf(G[threadIdx.x]);
}

/* grid (value head, DN_SCOLS state columns), a warp per DN_ROWS key rows: lanes l and l + 16 hold column l
 * of the warp's first and second eight rows (twice the blocks of a 32-column tile, for a GPU of more SMs
 * than value heads x column tiles); the state tile is read before the wait (only an earlier step of this
 * layer wrote it) */
__global__ void __launch_bounds__(32 * DN_CHUNK_MAXW, 1)
    deltanet_state_k(sl_deltanet_dims d, dn_chunks o, float *state, int n, float *out) {
    constexpr int C = DN_CHUNK, SC = DN_SCOLS, HR = DN_ROWS / 2;
    extern __shared__ float4 smem4[];
    int kd = d.k_dim, vd = d.v_dim, nv = d.n_v_heads;
    int h = blockIdx.x, lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5, KS = nw * DN_ROWS;
    float *qs = (float *)smem4, *ws = qs + C * KS, *ks = ws + C * KS, *part = ks + C * KS;
    float *U = part + nw * C * SC, *QS = U + C * SC, *A = QS + C * SC, *eg = A + C * C;
    int cl = lane & 15, c = blockIdx.y * SC + cl, r0 = wp * DN_ROWS + HR * (lane >> 4);
    float *Sg = state + (long long)h * kd * vd;
    float S[HR];
#pragma unroll
    for (int r = 0; r < HR; r++) S[r] = c < vd && r0 + r < kd ? Sg[(long long)(r0 + r) * vd + c] : 0.0f;
    cu_pdl_enter();
    int chunks = (n + C - 1) / C;
    for (int ch = 0; ch < chunks; ch++) {
        int c0 = ch * C, L = min(C, n - c0);
        long long base = (long long)h * n + c0;
        for (int e = threadIdx.x; e < C * KS; e += blockDim.x) { /* rows past L and columns past kd as zeros */
            int t = e / KS, i = e - t * KS;
            bool in = t < L && i < kd;
            long long r = (base + t) * kd + i;
            qs[e] = in ? o.q[r] : 0.0f;
            ws[e] = in ? o.w[r] : 0.0f;
            ks[e] = in ? o.k[r] : 0.0f;
        }
        for (int e = threadIdx.x; e < L * SC; e += blockDim.x) {
            int col = blockIdx.y * SC + (e & (SC - 1));
            U[e] = col < vd ? o.u[(base + e / SC) * vd + col] : 0.0f;
        }
        const float *ag = o.aqk + ((long long)h * chunks + ch) * C * C;
        for (int e = threadIdx.x; e < C * C; e += blockDim.x) A[e] = ag[e];
        if (threadIdx.x < C) eg[threadIdx.x] = threadIdx.x < L ? o.eg[base + threadIdx.x] : 0.0f;
        __syncthreads();
        /* u = U0 - W S0, then q S0: each warp's rows (its two halves met by a shuffle), summed across warps in
         * shared memory */
        for (int pass = 0; pass < 2; pass++) {
            const float *src = pass ? qs : ws;
            for (int t = 0; t < L; t++) {
                const float4 *v = (const float4 *)(src + t * KS + r0);
                float4 f0 = v[0], f1 = v[1];
                float p = S[0] * f0.x + S[1] * f0.y + S[2] * f0.z + S[3] * f0.w + S[4] * f1.x + S[5] * f1.y +
                          S[6] * f1.z + S[7] * f1.w;
                p += __shfl_xor_sync(0xffffffffu, p, 16);
                if (lane < SC) part[(wp * C + t) * SC + lane] = p;
            }
            __syncthreads();
            for (int e = threadIdx.x; e < L * SC; e += blockDim.x) {
                float p = 0;
                for (int w = 0; w < nw; w++) p += part[w * C * SC + e];
                if (pass)
                    QS[e] = p;
                else
                    U[e] -= p;
            }
            __syncthreads();
        }
        for (int e = threadIdx.x; e < L * SC; e += blockDim.x) {
            int t = e / SC, j = e & (SC - 1), col = blockIdx.y * SC + j;
            float y = eg[t] * QS[e];
            for (int i = 0; i <= t; i++) y += A[t * C + i] * U[i * SC + j];
            if (col < vd) out[(long long)(c0 + t) * nv * vd + h * vd + col] = y;
        }
        float last = eg[L - 1];
#pragma unroll
        for (int r = 0; r < HR; r++) S[r] *= last;
        for (int i = 0; i < L; i++) { /* the rows' sums are independent: one load of u per token */
            float w = U[i * SC + cl];
            const float4 *v = (const float4 *)(ks + i * KS + r0);
            float4 f0 = v[0], f1 = v[1];
            S[0] += f0.x * w;
            S[1] += f0.y * w;
            S[2] += f0.z * w;
            S[3] += f0.w * w;
            S[4] += f1.x * w;
            S[5] += f1.y * w;
            S[6] += f1.z * w;
            S[7] += f1.w * w;
        }
        __syncthreads(); /* the next chunk rewrites the shared buffers */
    }
#pragma unroll
    for (int r = 0; r < HR; r++)
        if (c < vd && r0 + r < kd) Sg[(long long)(r0 + r) * vd + c] = S[r];
}

/* the chunked form where its buffers fit; 0 when it does not take this layer */
static int dn_chunked(cu_impl *c, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                      const float *A_log, const float *dt_bias, float *state, int n, float *out, int warps) {
    size_t sp = dn_prep_floats(d->k_dim) * sizeof(float), ss = dn_state_floats(warps) * sizeof(float);
    if (warps > DN_CHUNK_MAXW || sp > (size_t)c->smem_optin || ss > (size_t)c->smem_optin ||
        cudaFuncSetAttribute(deltanet_prep_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sp) != cudaSuccess ||
        cudaFuncSetAttribute(deltanet_state_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ss) != cudaSuccess)
        return 0;
    if (cu_grow(c, &c->dnbuf, &c->dnbuf_len, dn_chunk_floats(d, n) * sizeof(float), "delta-rule chunks")) return -1;
    size_t hn = (size_t)d->n_v_heads * (size_t)n, chunks = ((size_t)n + DN_CHUNK - 1) / DN_CHUNK;
    dn_chunks o;
    o.q = (float *)c->dnbuf;
    o.w = o.q + hn * (size_t)d->k_dim;
    o.k = o.w + hn * (size_t)d->k_dim;
    o.u = o.k + hn * (size_t)d->k_dim;
    o.aqk = o.u + hn * (size_t)d->v_dim;
    o.eg = o.aqk + (size_t)d->n_v_heads * chunks * DN_CHUNK * DN_CHUNK;
    cu_launch(c, deltanet_prep_k, dim3((unsigned)d->n_v_heads, (unsigned)chunks), 256, sp, *d, qkv, a, bb, A_log,
              dt_bias, n, o);
    cu_launch(c, deltanet_state_k, dim3((unsigned)d->n_v_heads, CU_BLOCKS(d->v_dim, DN_SCOLS)), 32 * warps, ss, *d, o,
              state, n, out);
    return 1;
}

void cu_deltanet(sl_backend *b, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                 const float *A_log, const float *dt_bias, float *state, int n, float *out) {
    cu_impl *c = cu_of(b);
    int warps = (d->k_dim + DN_ROWS - 1) / DN_ROWS;
    if (warps > DN_MAXW) {
        cu_fail(c, "deltanet: key head dim %d is above the CUDA kernel's limit of %d", d->k_dim, DN_ROWS * DN_MAXW);
        return;
    }
    /* decode steps take the recurrence; a prompt takes the chunked form where its buffers fit */
    int done = n > 1 && c->dn_chunked ? dn_chunked(c, d, qkv, a, bb, A_log, dt_bias, state, n, out, warps) : 0;
    if (done < 0) return;
    if (!done)
        cu_launch(c, deltanet_k, dim3((unsigned)d->n_v_heads, CU_BLOCKS(d->v_dim, DN_COLS)), 32 * warps, 0, *d, qkv,
                  a, bb, A_log, dt_bias, state, n, out, (const int *)NULL, 0LL);
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
