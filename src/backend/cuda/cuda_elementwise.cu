/* Norms, rotary embedding, row copies and the element-wise ops, one thread per element (norms: one
 * block per row). */
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

#define NORM_PER_THREAD 8 /* values a thread keeps in registers: one pass over global memory */

/* With ADD, x += d first (written back): the residual add fused with the norm after it. With qo.h (dim a multiple
 * of 32, each row held in registers) y is also written in q16 for the integer GEMV that reads it next. */
template <bool ADD>
__global__ void rmsnorm_k(float *x, const float *d, const float *w, int dim, float eps, float *y, cu_q16w qo) {
    cu_pdl_enter();
    __shared__ float sh[32];
    float *xr = x + (long long)blockIdx.x * dim;
    const float *dr = ADD ? d + (long long)blockIdx.x * dim : NULL;
    float *yr = y + (long long)blockIdx.x * dim;
    float v[NORM_PER_THREAD], wv[NORM_PER_THREAD], ss = 0;
    bool held = dim <= NORM_PER_THREAD * (int)blockDim.x;
    if (held) {
        /* every load before any store: x and d may alias as far as the compiler knows, and a store
         * between loads would make each load wait for the one before */
        float dv[NORM_PER_THREAD];
#pragma unroll
        for (int k = 0; k < NORM_PER_THREAD; k++) {
            int i = threadIdx.x + k * blockDim.x;
            v[k] = i < dim ? xr[i] : 0.0f;
            dv[k] = ADD && i < dim ? dr[i] : 0.0f;
            wv[k] = w && i < dim ? w[i] : 1.0f;
        }
#pragma unroll
        for (int k = 0; k < NORM_PER_THREAD; k++) {
            int i = threadIdx.x + k * blockDim.x;
            if (ADD && i < dim) xr[i] = v[k] += dv[k];
            ss += v[k] * v[k];
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            if (ADD) xr[i] += dr[i];
            ss += xr[i] * xr[i];
        }
    }
    float inv = rsqrtf(block_sum(ss, sh) / (float)dim + eps);
    if (held) {
        float o[NORM_PER_THREAD];
#pragma unroll
        for (int k = 0; k < NORM_PER_THREAD; k++) {
            int i = threadIdx.x + k * blockDim.x;
            o[k] = (v[k] * inv) * wv[k];
            if (i < dim) yr[i] = o[k];
        }
        if (qo.h) { /* a warp's 32 values are one q16 unit, all in the row or all past it */
            int w0 = threadIdx.x & ~31, nu = (dim - w0 + (int)blockDim.x - 1) / (int)blockDim.x;
            cu_q16_putn<NORM_PER_THREAD>(qo, o, ((long long)blockIdx.x * dim + w0) >> 5, blockDim.x >> 5, nu, 0);
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w ? (xr[i] * inv) * w[i] : xr[i] * inv;
    }
}

static int norm_threads(int dim) {
    return dim >= 1024 ? 512 : dim >= 256 ? 128 : 32;
}

/* a one-row norm's output in q16 too, where the row is held in registers (see rmsnorm_k) */
static cu_q16w norm_q16(cu_impl *c, int rows, int dim) {
    if (rows == 1 && dim <= NORM_PER_THREAD * norm_threads(dim)) return cu_q16_want(c, dim);
    return {NULL, NULL, NULL, NULL};
}

void cu_rmsnorm(sl_backend *b, const float *x, const float *w, int rows, int dim, float eps, float *y) {
    cu_impl *c = cu_of(b);
    if (rows <= 0) return;
    cu_q16w qo = norm_q16(c, rows, dim);
    /* x is only read: the kernel writes it back only with ADD */
    cu_launch(c, rmsnorm_k<false>, rows, norm_threads(dim), 0, (float *)x, (const float *)NULL, w, dim, eps, y, qo);
    if (qo.h) cu_q16_made(c, y, dim);
    cu_check_launch(c, "rmsnorm");
}

void cu_add_rmsnorm(sl_backend *b, float *x, const float *d, const float *w, int rows, int dim, float eps, float *y) {
    cu_impl *c = cu_of(b);
    if (rows <= 0) return;
    cu_q16w qo = norm_q16(c, rows, dim);
    cu_launch(c, rmsnorm_k<true>, rows, norm_threads(dim), 0, x, d, w, dim, eps, y, qo);
    if (qo.h) cu_q16_made(c, y, dim);
    cu_check_launch(c, "add + rmsnorm");
}

__global__ void gated_rmsnorm_k(float *x, const float *z, const float *w, int dim, float eps) {
    cu_pdl_enter();
    __shared__ float sh[32];
    float *xr = x + (long long)blockIdx.x * dim;
    const float *zr = z + (long long)blockIdx.x * dim;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(ss, sh) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = (w[i] * (xr[i] * inv)) * (zr[i] * cu_sigmoid(zr[i]));
}

void cu_gated_rmsnorm(sl_backend *b, float *x, const float *z, const float *w, int rows, int dim, float eps) {
    cu_impl *c = cu_of(b);
    if (rows <= 0) return;
    cu_launch(c, gated_rmsnorm_k, rows, norm_threads(dim), 0, x, z, w, dim, eps);
    cu_check_launch(c, "gated rmsnorm");
}

/* one thread per (token, head, frequency) pair */
__global__ void rope_k(float *x, int n, int stride, int n_heads, int head_dim, int half, const int *tpos,
                       const float *inv_freq, float attn_factor) {
    cu_pdl_enter();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)n * n_heads * half) return;
    int f = (int)(e % half), h = (int)(e / half % n_heads), i = (int)(e / half / n_heads);
    float pos = (float)tpos[i];
    float ang = pos * inv_freq[f], sn, cs;
    sincosf(ang, &sn, &cs);
    cs *= attn_factor;
    sn *= attn_factor;
    float *v = x + (long long)i * stride + (long long)h * head_dim;
    float a = v[f], c = v[f + half];
    v[f] = a * cs - c * sn;
    v[f + half] = c * cs + a * sn;
}

void cu_rope(sl_backend *b, float *x, int stride, int n_heads, int head_dim, int rot_dim, const sl_batch_map *bm,
             const float *inv_freq, float attn_factor) {
    cu_impl *c = cu_of(b);
    int half = rot_dim / 2, n = bm->n;
    long long total = (long long)n * n_heads * half;
    if (total <= 0) return;
    cu_launch(c, rope_k, CU_BLOCKS(total, 256), 256, 0, x, n, stride, n_heads, head_dim, half, bm->pos, inv_freq,
              attn_factor);
    cu_check_launch(c, "rope");
}

/* One block per (token, head), q heads then k heads: the head's values in shared memory, optional RMSNorm,
 * rotary embedding, written back; k heads also store themselves and their v head in the caches. With qg,
 * q heads read their query from qg's [query | gate] row and copy the gate to gate. */
template <typename T>
__global__ void qk_rope_store_k(float *q, float *k, const float *v, int nh, int nkv, int hd, const float *qn,
                                const float *kn, float eps, int half, cu_bmap bm, const float *inv_freq,
                                float attn_factor, T *kc, T *vc, const float *qg, float *gate) {
    cu_pdl_enter();
    extern __shared__ float hv[];
    __shared__ float sh[32];
    int i = blockIdx.y, h = blockIdx.x;
    bool isk = h >= nh;
    int hh = isk ? h - nh : h;
    long long width = (long long)(isk ? nkv : nh) * hd, off = (long long)i * width + (long long)hh * hd;
    float *xr = (isk ? k : q) + off;
    const float *nw = isk ? kn : qn;
    const float *src = xr;
    if (qg && !isk) {
        src = qg + 2 * off;
        for (int j = threadIdx.x; j < hd; j += blockDim.x) gate[off + j] = src[hd + j];
    }
    float ss = 0;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        float a = src[j];
        hv[j] = a;
        ss += a * a;
    }
    if (nw) {
        float inv = rsqrtf(block_sum(ss, sh) / (float)hd + eps);
        for (int j = threadIdx.x; j < hd; j += blockDim.x) hv[j] = (hv[j] * inv) * nw[j];
    }
    __syncthreads();
    int pos = bm.pos[i];
    for (int f = threadIdx.x; f < half; f += blockDim.x) {
        float sn, cs;
        sincosf((float)pos * inv_freq[f], &sn, &cs);
        cs *= attn_factor;
        sn *= attn_factor;
        float a = hv[f], c = hv[f + half];
        hv[f] = a * cs - c * sn;
        hv[f + half] = c * cs + a * sn;
    }
    __syncthreads();
    if (!isk) {
        for (int j = threadIdx.x; j < hd; j += blockDim.x) xr[j] = hv[j];
        return;
    }
    long long crow = cu_bm_row(bm, bm.seq[i], pos) * width + (long long)hh * hd; /* cache rows are [n_kv * hd] */
    const float *vr = v + off;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        xr[j] = hv[j];
        cu_kv_put(kc, crow + j, hv[j]); /* q8_0: a warp's 32 lanes, one block (head_dim a multiple of 32) */
        cu_kv_put(vc, crow + j, vr[j]);
    }
}

void cu_qk_rope_store(sl_backend *b, float *q, float *k, const float *v, const sl_batch_map *bm, int n_heads, int n_kv,
                      int head_dim, const float *q_norm, const float *k_norm, float eps, int rot_dim,
                      const float *inv_freq, float attn_factor, void *kc, void *vc, sl_kv_type kt, const float *qg,
                      float *gate) {
    cu_impl *c = cu_of(b);
    int n = bm->n;
    if (n <= 0 || n_heads + n_kv <= 0) return;
    int threads = head_dim >= 128 ? 128 : (head_dim + 31) / 32 * 32;
    dim3 grid((unsigned)(n_heads + n_kv), (unsigned)n);
    cu_kv_dispatch(c, kt, [&](auto *t) {
        using T = typename std::remove_pointer<decltype(t)>::type;
        cu_launch(c, qk_rope_store_k<T>, grid, threads, (size_t)head_dim * sizeof(float), q, k, v, n_heads, n_kv,
                  head_dim, q_norm, k_norm, eps, rot_dim / 2, cu_bmap_of(bm), inv_freq, attn_factor, (T *)kc, (T *)vc,
                  qg, gate);
    });
    cu_check_launch(c, "q/k norm, rope and KV store");
}

__global__ void copy_rows_k(float *dst, int dst_stride, const float *src, int src_stride, int n, int width) {
    cu_pdl_enter();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)n * width) return;
    int i = (int)(e / width), j = (int)(e % width);
    dst[(long long)i * dst_stride + j] = src[(long long)i * src_stride + j];
}

/* row i of x into the cache row of token i, rounded to the cache's element type */
template <typename T> __global__ void kv_store_k(T *cache, cu_bmap bm, const float *x, int n, int width) {
    cu_pdl_enter();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)n * width) return;
    int i = (int)(e / width), j = (int)(e % width);
    /* q8_0: width is whole blocks, so a warp's 32 elements are one block */
    cu_kv_put(cache, cu_bm_row(bm, bm.seq[i], bm.pos[i]) * width + j, x[(long long)i * width + j]);
}

void cu_copy_rows(sl_backend *b, float *dst, int dst_stride, const float *src, int src_stride, int n, int width) {
    cu_impl *c = cu_of(b);
    long long total = (long long)n * width;
    if (total <= 0) return;
    cu_launch(c, copy_rows_k, CU_BLOCKS(total, 256), 256, 0, dst, dst_stride, src, src_stride, n, width);
    cu_check_launch(c, "copy rows");
}

void cu_kv_store(sl_backend *b, void *cache, sl_kv_type kt, const sl_batch_map *bm, const float *x, int width) {
    cu_impl *c = cu_of(b);
    long long total = (long long)bm->n * width;
    if (total <= 0) return;
    cu_kv_dispatch(c, kt, [&](auto *t) {
        using T = typename std::remove_pointer<decltype(t)>::type;
        cu_launch(c, kv_store_k<T>, CU_BLOCKS(total, 256), 256, 0, (T *)cache, cu_bmap_of(bm), x, bm->n, width);
    });
    cu_check_launch(c, "KV cache store");
}

__global__ void add_k(float *y, const float *x, long long len) {
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) y[i] += x[i];
}

void cu_add(sl_backend *b, float *y, const float *x, size_t len) {
    cu_impl *c = cu_of(b);
    if (!len) return;
    cu_launch(c, add_k, CU_BLOCKS(len, 256), 256, 0, y, x, (long long)len);
    cu_check_launch(c, "add");
}

__global__ void swiglu_k(const float *g, const float *u, long long len, float *out) {
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) out[i] = g[i] * cu_sigmoid(g[i]) * u[i];
}

void cu_swiglu(sl_backend *b, const float *g, const float *u, size_t len, float *out) {
    cu_impl *c = cu_of(b);
    if (!len) return;
    cu_launch(c, swiglu_k, CU_BLOCKS(len, 256), 256, 0, g, u, (long long)len, out);
    cu_check_launch(c, "swiglu");
}

__global__ void mul_sigmoid_k(float *x, const float *g, long long len) {
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) x[i] *= cu_sigmoid(g[i]);
}

void cu_mul_sigmoid(sl_backend *b, float *x, const float *g, size_t len) {
    cu_impl *c = cu_of(b);
    if (!len) return;
    cu_launch(c, mul_sigmoid_k, CU_BLOCKS(len, 256), 256, 0, x, g, (long long)len);
    cu_check_launch(c, "sigmoid gate");
}

__global__ void scale_rows_sigmoid_k(float *x, const float *s, int dim, long long len) {
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) x[i] *= cu_sigmoid(s[i / dim]);
}

__global__ void add_gated_k(float *y, const float *x, const float *s, int dim, long long len) {
    cu_pdl_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) y[i] += x[i] * cu_sigmoid(s[i / dim]);
}

void cu_add_gated(cu_impl *c, float *y, const float *x, const float *s, int rows, int dim) {
    long long len = (long long)rows * dim;
    if (len <= 0) return;
    cu_launch(c, add_gated_k, CU_BLOCKS(len, 256), 256, 0, y, x, s, dim, len);
    cu_check_launch(c, "gated add");
}

void cu_scale_rows_sigmoid(sl_backend *b, float *x, const float *s, int rows, int dim) {
    cu_impl *c = cu_of(b);
    long long len = (long long)rows * dim;
    if (len <= 0) return;
    cu_launch(c, scale_rows_sigmoid_k, CU_BLOCKS(len, 256), 256, 0, x, s, dim, len);
    cu_check_launch(c, "row sigmoid gate");
}

/* Argmax as one 64-bit maximum: the value's order-preserving key above the complement of its index, so
 * equal values resolve to the lowest index. NaN and -inf get key 0, which no value is picked by. Grid row y
 * takes row y of x (n values each) into out[y]. */
__global__ void argmax_k(const float *x, int n, unsigned long long *out) {
    cu_pdl_enter();
    __shared__ unsigned long long sh[32];
    unsigned long long best = 0;
    x += (long long)blockIdx.y * n;
    out += blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        unsigned long long k = v > -INFINITY ? (unsigned long long)cu_okey(v) << 32 | (0xffffffffu - (unsigned)i) : 0;
        best = k > best ? k : best;
    }
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long k = __shfl_xor_sync(0xffffffffu, best, o);
        best = k > best ? k : best;
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sh[w] = best;
    __syncthreads();
    if (w == 0) {
        best = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0;
        for (int o = 16; o > 0; o >>= 1) {
            unsigned long long k = __shfl_xor_sync(0xffffffffu, best, o);
            best = k > best ? k : best;
        }
        if (lane == 0 && best) atomicMax(out, best);
    }
}

/* Every row in one launch and one copy back: a batch's sequences used to take a launch, a copy and a
 * wait each (64 sequences of llama3-8b: 4 % of the GPU's time a step, and the host's waits on top). */
void cu_argmax(sl_backend *b, const float *x, int rows, int n, int32_t *out) {
    cu_impl *c = cu_of(b);
    for (int r = 0; r < rows; r++) out[r] = -1;
    if (rows <= 0 || n <= 0) return;
    if (rows > c->amax_cap) { /* the keys on the device and their pinned copy: made at the first call, grown to the batch */
        int cap = rows < 64 ? 64 : rows;
        cudaFree(c->d_amax);
        cudaFreeHost(c->h_amax);
        c->d_amax = c->h_amax = NULL;
        c->amax_cap = 0;
        if (cudaMalloc((void **)&c->d_amax, (size_t)cap * sizeof *c->d_amax) != cudaSuccess ||
            cudaMallocHost((void **)&c->h_amax, (size_t)cap * sizeof *c->h_amax) != cudaSuccess) {
            cu_fail(c, "out of memory for the argmax of %d rows", rows);
            return;
        }
        c->amax_cap = cap;
    }
    unsigned blocks = CU_BLOCKS(n, 256 * 8), fit = (unsigned)c->sms * 4 / (unsigned)rows;
    if (fit < 1) fit = 1;
    cudaMemsetAsync(c->d_amax, 0, (size_t)rows * sizeof *c->d_amax, c->st);
    cu_launch(c, argmax_k, dim3(blocks < fit ? blocks : fit, (unsigned)rows), 256, 0, x, n, c->d_amax);
    cudaMemcpyAsync(c->h_amax, c->d_amax, (size_t)rows * sizeof *c->h_amax, cudaMemcpyDeviceToHost, c->st);
    cudaError_t err = cudaStreamSynchronize(c->st);
    if (err != cudaSuccess) {
        cu_fail(c, "CUDA error in the ops before an argmax: %s", cudaGetErrorString(err));
        return;
    }
    for (int r = 0; r < rows; r++) {
        unsigned long long k = c->h_amax[r];
        out[r] = k ? (int32_t)(0xffffffffu - (unsigned)(k & 0xffffffffu)) : -1;
    }
}
