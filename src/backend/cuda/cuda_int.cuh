/* Internals shared by the CUDA backend's kernel files. */
#ifndef SLUICE_BACKEND_CUDA_INT_CUH
#define SLUICE_BACKEND_CUDA_INT_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

extern "C" {
#include "backend/backend.h"
#include "core/err.h"
}

/* A weight as kernels take it (by value): the device copy of an sl_weight. */
struct cu_w {
    const uint8_t *data, *scales, *biases;
    const float *bias;
    long long row_bytes;
    int rows, cols, fmt, bits, group, sbf;
    int gtype; /* SL_WF_GGML: the sl_ggml_type */
    int trows; /* SL_WF_FP8: rows of a scale tile (group: its columns) */
    int vec;   /* 1: the vectorised path applies (see cu_w_of) */
    int trans; /* stored inputs-first (sl_weight.transposed): only w_elem reads it */
};

/* One routed expert on the device; a layer's experts form a table indexed by expert id. */
struct cu_expert {
    cu_w w[3]; /* gate, up, down */
};

/* The values a recorded step reads at replay time. */
/* The tokens of a recorded step, copied to the device at the start of each replay. */
struct cu_step {
    int32_t tok[SL_STEP_MAX];
};

/* The device side of a batch map (see sl_batch_map). */
struct cu_bmap {
    const int *pos, *seq, *pages;
    int psz, maxp;
};

static inline cu_bmap cu_bmap_of(const sl_batch_map *m) {
    cu_bmap d = {m->pos, m->seq, m->pages, m->page_size, m->max_pages};
    return d;
}

/* The cache row of position p of sequence slot s. */
__device__ __forceinline__ long long cu_bm_row(const cu_bmap &m, int s, int p) {
    return (long long)m.pages[(long long)s * m.maxp + p / m.psz] * m.psz + p % m.psz;
}

/* KV cache elements (float, __half or __nv_bfloat16): stores round to nearest even, loads widen. */
__device__ __forceinline__ float cu_kv_ld(const float *p) {
    return *p;
}
__device__ __forceinline__ float cu_kv_ld(const __half *p) {
    return __half2float(*p);
}
__device__ __forceinline__ float cu_kv_ld(const __nv_bfloat16 *p) {
    return __bfloat162float(*p);
}
__device__ __forceinline__ void cu_kv_st(float *p, float x) {
    *p = x;
}
__device__ __forceinline__ void cu_kv_st(__half *p, float x) {
    *p = __float2half_rn(x);
}
__device__ __forceinline__ void cu_kv_st(__nv_bfloat16 *p, float x) {
    *p = __float2bfloat16_rn(x);
}
/* four consecutive elements from p (aligned to four elements) */
__device__ __forceinline__ float4 cu_kv_ld4(const float *p) {
    return *reinterpret_cast<const float4 *>(p);
}
__device__ __forceinline__ float4 cu_kv_ld4(const __half *p) {
    uint2 u = *reinterpret_cast<const uint2 *>(p);
    float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x)),
           b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 cu_kv_ld4(const __nv_bfloat16 *p) {
    uint2 u = *reinterpret_cast<const uint2 *>(p);
    float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x)),
           b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

/* q8_0 caches (--kv-type q8_0): GGML's blocks of 32 values, an f16 scale d then 32 signed codes (34 bytes),
 * value = d * code. A cache row is whole blocks (head_dim a multiple of 32), so element i of a cache is code
 * i % 32 of block i / 32 wherever rows start. The type is only a tag for the kernels' templates: caches of it
 * are read and written through the element-indexed accessors below, never by pointer arithmetic. */
struct cu_q8 {
    unsigned char b;
};
__device__ __forceinline__ const unsigned char *cu_q8_block(const cu_q8 *c, long long i) {
    return reinterpret_cast<const unsigned char *>(c) + (i >> 5) * 34;
}

/* Element i of cache c, widened; four from i on (i a multiple of four). */
template <typename T> __device__ __forceinline__ float cu_kv_get(const T *c, long long i) {
    return cu_kv_ld(c + i);
}
__device__ __forceinline__ float cu_kv_get(const cu_q8 *c, long long i) {
    const unsigned char *b = cu_q8_block(c, i);
    return __half2float(*reinterpret_cast<const __half *>(b)) * (float)(signed char)b[2 + (i & 31)];
}
template <typename T> __device__ __forceinline__ float4 cu_kv_get4(const T *c, long long i) {
    return cu_kv_ld4(c + i);
}
__device__ __forceinline__ float4 cu_kv_get4(const cu_q8 *c, long long i) {
    const unsigned char *b = cu_q8_block(c, i);
    float d = __half2float(*reinterpret_cast<const __half *>(b));
    /* the codes start two bytes into the block: two 2-byte loads */
    const unsigned short *q = reinterpret_cast<const unsigned short *>(b + 2 + (i & 31));
    unsigned short lo = q[0], hi = q[1];
    return make_float4(d * (float)(signed char)(lo & 0xff), d * (float)(signed char)(lo >> 8),
                       d * (float)(signed char)(hi & 0xff), d * (float)(signed char)(hi >> 8));
}

/* x into element i of cache c. For q8_0 the 32 lanes of a warp store the 32 values of one block together
 * (lane l element i with i % 32 == l), rounded as GGML's reference quantizer rounds them (d = max |x| / 127,
 * codes round(x / d), d stored as f16). */
template <typename T> __device__ __forceinline__ void cu_kv_put(T *c, long long i, float x) {
    cu_kv_st(c + i, x);
}
__device__ __forceinline__ void cu_kv_put(cu_q8 *c, long long i, float x) {
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    unsigned char *b = const_cast<unsigned char *>(cu_q8_block(c, i));
    b[2 + (i & 31)] = (unsigned char)(signed char)roundf(x * id);
    if ((i & 31) == 0) *reinterpret_cast<__half *>(b) = __float2half_rn(d);
}

/* The input of the integer GEMV (cuda_mmvq.cu) in q16: value = d (256 h + l) per 32 values */
struct cu_q16 {
    const int8_t *h;
    const uint8_t *l;
    const float *d;
    const int *s;   /* per 16 values: the sum of their 16-bit integers (the GEMV's form) */
    const float *m; /* or (cu_q16_rows, for the tile kernels) d times that sum, s then NULL */
};
/* where a kernel writes q16 (cu_q16_put) */
struct cu_q16w {
    int8_t *h;
    uint8_t *l;
    float *d;
    int *s;
};

struct cu_table {
    const sl_expert_table *key;
    cu_expert *d;          /* device table */
    cu_expert *h[2];       /* two pinned mirrors, used in turn: h[cur] holds the latest table */
    cudaEvent_t copied[2]; /* after the latest copy from each mirror */
    int n, cur;
    int plo, phi; /* the entries the latest update changed: all the other mirror lacks */
};

struct cu_impl {
    sl_backend_ops ops; /* the op table, less the fused ops SLUICE_CUDA_UNFUSE names */
    int dev;
    cudaStream_t st;
    cublasHandle_t blas;
    int sms;
    int dec_keys; /* decode attention: fewest keys a slice (SLUICE_CUDA_DEC_KEYS; 0 or 1: every slice) */
    int dec_pf;   /* decode attention on 16-bit caches: the next keys requested once the current are scored (2), before
                   * (1), or each step loads then waits (0); SLUICE_CUDA_DEC_PF */
    int mmvq;     /* GGML decode GEMVs in integer arithmetic where they can (SLUICE_CUDA_MMVQ=0: never) */
    int imma; /* Q4_K, Q6_K, Q8_0 small batches and grouped experts on integer tensor cores (SLUICE_CUDA_IMMA=0:
               * never; 2 with =q4k: Q4_K only) */
    void *q16buf; /* their q16 input */
    size_t q16len;
    /* A norm or the attention merge of one row may write its output in q16 too, when the integer GEMV takes
     * a placed weight (q16_fuse; SLUICE_CUDA_Q16_FUSE=0: never); the q16 is of q16_x while no launch came
     * after it (launches counts them, and the op table's uploads, memsets and frees, which may change x too),
     * and the matmul that reads x next takes it instead of quantizing x. */
    int q16_fuse;
    unsigned long long launches, q16_at;
    const float *q16_x;
    int q16_cols;
    cu_q16 q16_pre;
    const float *q16_live; /* inside a matmul op: q16_x when nothing was launched between it and the op */
    int flash;      /* prompt runs take the tensor-core attention kernel (SLUICE_CUDA_FLASH=0: never) */
    int fa_split;   /* its keys split between blocks where the blocks are few (SLUICE_CUDA_FLASH_SPLIT=0: never) */
    int fa_qsep;    /* its queries staged apart from the key buffers (SLUICE_CUDA_FLASH_QSEP=1), two blocks a SM */
    float *fa_part; /* the split parts' outputs, maxima and sums */
    size_t fa_part_len;
    int gemm_exact; /* prefill GEMMs in split bf16 (near fp32): 1 all (SLUICE_CUDA_PREFILL=exact), -1 none
                     * (=bf16), 0 the weights marked exact */
    int mmq_min;    /* GGML weights not marked exact: batches from this many tokens (default 2) to CU_MMQ_MAX
                     * take the tensor-core kernel (SLUICE_CUDA_MMQ_MIN; SLUICE_CUDA_MMQ=0: never) */
    int gemv_max;   /* largest batch that runs through the GEMV kernels (SLUICE_CUDA_GEMV_MAX; 0: per format) */
    int mmq_fill;   /* the tensor-core kernels' column splits: enough blocks for two a SM (SLUICE_CUDA_MMQ_SPLIT=fill),
                     * else the fewest waves times steps (cu_ggml_mmq) */
    int mmq_join;   /* the weights of one type in a call that share the input in one launch (SLUICE_CUDA_MMQ_JOIN=0:
                     * one each) */
    int mmq_three;  /* splits counted with the three blocks a SM that Q4_K tiles of up to 16 tokens can have
                     * (SLUICE_CUDA_MMQ_BLOCKS=2: with two, as for the other tiles) */
    sl_err failure;
    int failed;
    /* resident weights: bump-allocated from large blocks, freed together */
    uint8_t **blocks;
    int n_blocks, cap_blocks;
    size_t block_used, block_cap;
    /* scratch that grows outside of recordings only */
    void *wtmp, *xtmp; /* bf16 weight and input for tensor-core GEMMs */
    size_t wtmp_len, xtmp_len;
    void *dnbuf; /* the chunked delta rule's per-chunk products, between its two kernels */
    size_t dnbuf_len;
    int32_t *ids;
    size_t ids_len;
    float *att_part; /* decode attention: per-split partial results */
    size_t att_part_len;
    int *att_tok; /* decode attention in a mixed batch: which tokens */
    size_t att_tok_len;
    int *att_dec; /* the same list on the host, att_dec_cap entries */
    int att_dec_cap;
    int att_heads, att_hd; /* the largest seen, for sizing the partials of recorded steps */
    float *moe_buf;        /* gate/up/down outputs per routed slot */
    size_t moe_len;
    int *moe_grp; /* grouped MoE: the group count, the groups and the pairs in expert order */
    size_t moe_grp_len;
    int moe_group_min;  /* batches of at least this many tokens run the grouped MoE kernels (0: never; -1: per
                         * expert format, see cuda_moe.cu) */
    const float *pairs; /* moe_pairs: where the latest call left its outputs (in moe_buf), for n*k pairs */
    int pairs_n;
    float *put_pairs; /* moe_pairs_put of a layer no moe_pairs call ran for: the pair outputs */
    size_t put_pairs_len;
    float *put_rows; /* moe_pairs_put: the rows and their pair indices as copied in */
    size_t put_rows_len;
    uint8_t *ho_rows; /* moe_await in a recording: the host's rows, pair indices and count as copied in */
    size_t ho_rows_len;
    float *act; /* swiglu_matmul of a tensor-core batch: the SwiGLU input */
    size_t act_len;
    cu_table *tables;
    int n_tables, cap_tables;
    /* recorded steps */
    cu_step *d_step, *h_step;
    unsigned long long *d_amax, *h_amax; /* argmax: the packed (key, index) per row on the device, pinned copy */
    int amax_cap;                        /* rows they hold */
    int capturing, steps_off;
    unsigned long long regrown; /* scratch buffers moved (cu_grow): recordings made before read freed memory */
    double bandwidth, flops; /* measured bounds, 0 until measured */
    int pdl;                 /* programmatic dependent launch (sm_90+, SLUICE_CUDA_PDL=0 turns it off) */
    int half_rpw4;      /* short 16-bit float rows 4 a warp (SLUICE_CUDA_HALF_RPW=2: 2, see short_half) */
    int rpw_balance;    /* rows per warp from the rounds a launch takes (SLUICE_CUDA_RPW_BALANCE=0: the old rule) */
    int f32_gemm;       /* small exact fp32 weights past 8 tokens on fp32 cuBLAS (SLUICE_CUDA_F32_GEMM=0: GEMV, split) */
    int dn_chunked;     /* prefill's delta rule in the chunked form (SLUICE_CUDA_DELTANET=recurrent: token by token) */
    int smem_optin;     /* the most shared memory a block may ask for */
    int smem_sm;        /* shared memory of a SM */
    /* resident blocks per SM of kernels launched with a grid sized to the GPU, by kernel and shared memory
     * (cu_occupancy): asked once each, not per launch */
    struct {
        const void *fn;
        int threads, per_sm;
        size_t smem;
    } occ[32];
    int n_occ;
    struct cu_gds *gds; /* GPUDirect Storage once asked for (cuda_gds.cu) */
};

static inline cu_impl *cu_of(sl_backend *b) {
    return (cu_impl *)b->impl;
}

/* Records the first failure (sticky until check()). Returns -1. */
int cu_fail(cu_impl *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Calls f with a null pointer of the element type of kt (cu_q8 for q8_0): one launch site for every cache
 * type. */
template <typename F> static inline void cu_kv_dispatch(cu_impl *c, sl_kv_type kt, F f) {
    if (kt == SL_KV_F16)
        f((__half *)nullptr);
    else if (kt == SL_KV_BF16)
        f((__nv_bfloat16 *)nullptr);
    else if (kt == SL_KV_F32)
        f((float *)nullptr);
    else if (kt == SL_KV_Q8_0)
        f((cu_q8 *)nullptr);
    else
        cu_fail(c, "KV cache of type %s: the CUDA backend keeps f32, f16, bf16 or q8_0", sl_kv_type_name(kt));
}
/* Records a failed CUDA call or launch; returns nonzero when there was one. */
int cu_check_launch(cu_impl *c, const char *what);
/* Grows a scratch buffer to `bytes`; fails (recorded) when that would happen inside a recording. */
int cu_grow(cu_impl *c, void **p, size_t *len, size_t bytes, const char *what);
/* The same for scratch a caller can do without: -1 (nothing recorded) where it cannot grow. */
int cu_grow_try(cu_impl *c, void **p, size_t *len, size_t bytes);
cu_w cu_w_of(const sl_weight *w);

/* d += a b on tensor cores: mma m16n8k16 on fragments of 16-bit values (TY: f16 or bf16; A row-major, B
 * column-major), fp32 accumulation */
#define CU_MMA_16816(NAME, TY)                                                                                         \
    __device__ __forceinline__ void NAME(float *d, const uint32_t *a, const uint32_t *b) {                             \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "          \
                     "{%8,%9}, {%0,%1,%2,%3};"                                                                         \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                  \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));                              \
    }
CU_MMA_16816(cu_mma_f16, "f16")
CU_MMA_16816(cu_mma_bf16, "bf16")

/* Programmatic dependent launch (Hopper): each kernel lets the next one be scheduled as soon as all of
 * its own blocks are running, and waits for the previous kernel's results before touching memory, so
 * launch latency and the next kernel's prologue (weight prefetch) overlap the current kernel. Every
 * kernel starts with cu_pdl_enter() (or waits itself before reading any input); on older GPUs both are
 * no-ops and launches serialise as usual. */
__device__ __forceinline__ void cu_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void cu_pdl_enter() {
    cu_pdl_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

template <typename... KArgs, typename... Args>
static inline void cu_launch(cu_impl *c, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    c->launches++;
    cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...);
}

#define CU_BLOCKS(n, t) ((unsigned)(((size_t)(n) + (t)-1) / (t)))

__device__ __forceinline__ float cu_sigmoid(float v) {
    return 1.0f / (1.0f + expf(-v));
}

/* Values v[k] (lane l's of the warp's 32 values of unit u0 + k us, k < nu, element 32 u + l of the q16 rows)
 * into o: d = max|v| / 32767 over the 32, q = round(v / d) as 256 h + l, and the integer sums of each 16
 * (with fsum, d times them as floats). The N units' reductions are interleaved, so that their shuffles
 * overlap. Every lane of the warp calls it, with the same nu. */
template <int N>
__device__ __forceinline__ void cu_q16_putn(const cu_q16w &o, const float *v, long long u0, long long us, int nu,
                                            int fsum) {
    int lane = threadIdx.x & 31;
    float m[N];
    int q[N], t[N];
#pragma unroll
    for (int k = 0; k < N; k++) m[k] = fabsf(v[k]);
#pragma unroll
    for (int j = 16; j > 0; j >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++) m[k] = fmaxf(m[k], __shfl_xor_sync(0xffffffffu, m[k], j));
#pragma unroll
    for (int k = 0; k < N; k++) {
        m[k] /= 32767.0f; /* the scale */
        t[k] = q[k] = m[k] > 0 ? __float2int_rn(v[k] / m[k]) : 0;
    }
#pragma unroll
    for (int j = 8; j > 0; j >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++) t[k] += __shfl_xor_sync(0xffffffffu, t[k], j);
#pragma unroll
    for (int k = 0; k < N; k++) {
        if (k >= nu) break;
        long long u = u0 + k * us, i = 32 * u + lane;
        o.h[i] = (int8_t)(q[k] >> 8); /* arithmetic shift: q = 256 h + l with l in [0, 255] */
        o.l[i] = (uint8_t)(q[k] & 255);
        if (lane == 0) o.d[u] = m[k];
        if ((lane & 15) == 0) {
            if (fsum)
                ((float *)o.s)[2 * u + (lane >> 4)] = m[k] * (float)t[k];
            else
                o.s[2 * u + (lane >> 4)] = t[k];
        }
    }
}
__device__ __forceinline__ void cu_q16_put(const cu_q16w &o, float v, long long u, int fsum) {
    cu_q16_putn<1>(o, &v, u, 0, 1, fsum);
}

/* A GEMV's output v of row r for token t, at o: with cd (ck routed outputs of rows values per token, weights
 * cw), their weighted sum plus sigmoid(ysc[t]) v (v alone without ysc), the order moe_combine_k adds them
 * in; with ysc alone o += sigmoid(ysc[t]) v; else o = v. */
__device__ __forceinline__ void cu_gemv_store(float *o, float v, int t, long long r, long long rows, const float *ysc,
                                              const float *cd, const float *cw, int ck) {
    if (cd) {
        float base = 0;
        for (int q = 0; q < ck; q++) base += cw[t * ck + q] * cd[((long long)t * ck + q) * rows + r];
        *o = base + (ysc ? cu_sigmoid(ysc[t]) : 1.0f) * v;
    } else if (ysc) {
        *o += cu_sigmoid(ysc[t]) * v;
    } else {
        *o = v;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum (MAX 0) or max (MAX 1) over a block of up to 1024 threads; every thread gets the result. `sh` holds
 * 32 floats. */
template <int MAX> __device__ __forceinline__ float block_reduce(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = lane < (int)((blockDim.x + 31) >> 5) ? sh[lane] : MAX ? -INFINITY : 0.0f;
    return MAX ? warp_max(t) : warp_sum(t);
}
__device__ __forceinline__ float block_sum(float v, float *sh) {
    return block_reduce<0>(v, sh);
}
__device__ __forceinline__ float block_max(float v, float *sh) {
    return block_reduce<1>(v, sh);
}

/* Routing of one token by one warp: softmax over the ne logits l, top-k by repeated max (ties to the lower
 * index, as the CPU does), optional renormalisation. rs is ne floats of shared scratch. The ids go to
 * sel (shared, k ints) when set, and ids and weights to global memory when set. */
__device__ __forceinline__ void cu_route_warp(const float *l, int ne, int k, int renorm, float *rs, int *sel,
                                              int32_t *ids, float *weights) {
    int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int x = lane; x < ne; x += 32) {
        rs[x] = l[x];
        mx = fmaxf(mx, l[x]);
    }
    mx = warp_max(mx);
    float sum = 0;
    for (int x = lane; x < ne; x += 32) sum += expf(l[x] - mx);
    sum = warp_sum(sum);
    __syncwarp();
    float tot = 0, mine = 0;
    for (int s = 0; s < k; s++) {
        float bv = -INFINITY;
        int bi = ne;
        for (int x = lane; x < ne; x += 32)
            if (rs[x] > bv || (rs[x] == bv && x < bi)) {
                bv = rs[x];
                bi = x;
            }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (bi >= ne) bi = 0; /* only when every logit is NaN */
        float w = expf(l[bi] - mx) / sum;
        if (lane == s) mine = w;
        if (lane == 0) {
            if (sel) sel[s] = bi;
            if (ids) ids[s] = bi;
            rs[bi] = __int_as_float(0x7fc00000); /* NaN fails every comparison: never taken twice */
        }
        tot += w;
        __syncwarp();
    }
    if (weights && lane < k) weights[lane] = renorm ? mine / tot : mine;
}

/* Order-preserving keys of floats (a > b exactly when key(a) > key(b)); 0 is below every float's key. */
__device__ __forceinline__ unsigned cu_okey(float f) {
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float cu_ofloat(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

#define CU_ROUTE_REG 16 /* logits per lane cu_route_reg holds: up to 512 experts */

/* cu_route_warp with the logits in registers (ne <= 32 * CU_ROUTE_REG, k <= 32) and each round's
 * maximum found by two warp reductions (the largest key, then the lowest index holding it), so a round
 * costs a few instructions instead of a shuffle tree and a reload. NaN logits are never picked. */
__device__ __forceinline__ void cu_route_reg(const float *l, int ne, int k, int renorm, int *sel, int32_t *ids,
                                             float *weights) {
    int lane = threadIdx.x & 31;
    unsigned key[CU_ROUTE_REG], lm = 0;
#pragma unroll
    for (int j = 0; j < CU_ROUTE_REG; j++) {
        int x = lane + 32 * j;
        float v = x < ne ? l[x] : NAN;
        key[j] = v == v ? cu_okey(v) : 0u;
        lm = max(lm, key[j]);
    }
    float mx = cu_ofloat(__reduce_max_sync(0xffffffffu, lm)), sum = 0;
#pragma unroll
    for (int j = 0; j < CU_ROUTE_REG; j++)
        if (key[j]) sum += expf(cu_ofloat(key[j]) - mx);
    sum = warp_sum(sum);
    float mine = 0;
    for (int s = 0; s < k; s++) {
        unsigned best = 0;
        int bj = 0;
#pragma unroll
        for (int j = 0; j < CU_ROUTE_REG; j++)
            if (key[j] > best) { /* strict: the lane's lowest index among equals */
                best = key[j];
                bj = j;
            }
        unsigned mk = __reduce_max_sync(0xffffffffu, best);
        unsigned me = (unsigned)(lane + 32 * bj);
        unsigned win = __reduce_min_sync(0xffffffffu, best == mk ? me : 0xffffffffu);
        if (win == me)
#pragma unroll
            for (int j = 0; j < CU_ROUTE_REG; j++)
                if (j == bj) key[j] = 0;
        int id = mk && win < (unsigned)ne ? (int)win : 0; /* 0 only when every logit is NaN */
        if (lane == s) mine = mk ? expf(cu_ofloat(mk) - mx) / sum : 0.0f;
        if (lane == 0) {
            if (sel) sel[s] = id;
            if (ids) ids[s] = id;
        }
    }
    float tot = warp_sum(lane < k ? mine : 0.0f);
    if (weights && lane < k) weights[lane] = renorm ? mine / tot : mine;
}

/* ops implemented per file */
double cu_mem_bandwidth(sl_backend *b);
double cu_peak_flops(sl_backend *b);
void cu_embed(sl_backend *b, const sl_weight *w, const int32_t *ids, int n, float *out);
void cu_matmul(sl_backend *b, const sl_weight *w, const float *x, int n, float *y);
void cu_rmsnorm(sl_backend *b, const float *x, const float *w, int rows, int dim, float eps, float *y);
void cu_rope(sl_backend *b, float *x, int stride, int n_heads, int head_dim, int rot_dim, const sl_batch_map *bm,
             const float *inv_freq, float attn_factor);
void cu_copy_rows(sl_backend *b, float *dst, int dst_stride, const float *src, int src_stride, int n, int width);
void cu_kv_store(sl_backend *b, void *cache, sl_kv_type kt, const sl_batch_map *bm, const float *x, int width);
void cu_attention(sl_backend *b, const float *q, const void *kc, const void *vc, sl_kv_type kt, const sl_batch_map *bm,
                  int n_heads, int n_kv, int head_dim, int window, float scale, const float *sinks, float *out);
/* Grows the decode attention partials to what a recorded step of n tokens will need. */
int cu_attention_reserve(cu_impl *c, int n);
void cu_add(sl_backend *b, float *y, const float *x, size_t len);
void cu_argmax(sl_backend *b, const float *x, int rows, int n, int32_t *out);
void cu_swiglu(sl_backend *b, const float *g, const float *u, size_t len, float *out);
void cu_mul_sigmoid(sl_backend *b, float *x, const float *g, size_t len);
void cu_scale_rows_sigmoid(sl_backend *b, float *x, const float *s, int rows, int dim);
void cu_route(sl_backend *b, const float *logits, int n, int n_experts, int k, int renorm, int32_t *ids,
              float *weights);
void cu_route_grouped(sl_backend *b, const float *logits, const float *bias, int n, int n_experts, int k, int n_group,
                      int topk_group, int renorm, float scale, int32_t *ids, float *weights);
void cu_mla_rope_store(sl_backend *b, float *q, float *kv, const sl_batch_map *bm, const sl_mla_dims *d,
                       const float *kv_norm, float eps, const float *inv_freq, float attn_factor, float *cache);
void cu_mla_attention(sl_backend *b, const float *q, const float *cache, const sl_batch_map *bm, const sl_mla_dims *d,
                      const float *wkv_b, float scale, float *out);
void cu_moe(sl_backend *b, const sl_expert_table *t, const float *x, int n, int hidden, const int32_t *ids,
            const float *weights, int k, float *out);
void cu_moe_pairs(sl_backend *b, const sl_expert_table *t, const float *x, int n, int hidden, const int32_t *ids,
                  int k);
void cu_moe_combine(sl_backend *b, const float *weights, int n, int k, int hidden, float *out);
void cu_moe_guard(sl_backend *b, const sl_expert_table *t, int32_t *ids, int nk, int32_t *rec, int32_t *miss,
                  const uint8_t *host, const float *share, int32_t *host_ids);
void cu_moe_handoff(sl_backend *b, const float *x, int n, int hidden, const int32_t *ids, int nk, sl_handoff *h);
void cu_moe_await(sl_backend *b, sl_handoff *h, const float *rows, const int32_t *idx, int n, int k, int hidden,
                  int32_t *miss, void (*serve)(void *ctx, sl_handoff *h), void *ctx);
void cu_moe_pairs_put(sl_backend *b, const float *rows, const int32_t *idx, int cnt, int n, int k, int hidden);
void cu_moe_combine_shared(sl_backend *b, const sl_expert_table *t, const float *weights, int n, int k, int hidden,
                           const sl_weight *sh_down, const float *g, const float *u, const float *gate, float *out);
void cu_conv1d_silu(sl_backend *b, const float *x, int n, int channels, const float *w, int kernel, float *state,
                    float *out);
void cu_deltanet(sl_backend *b, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                 const float *A_log, const float *dt_bias, float *state, int n, float *out);
void cu_conv1d_silu_seqs(sl_backend *b, const float *x, int channels, const float *w, int kernel, float *state,
                         size_t stride, const sl_batch_map *bm, float *out);
void cu_deltanet_seqs(sl_backend *b, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                      const float *A_log, const float *dt_bias, float *state, size_t stride, const sl_batch_map *bm,
                      float *out);
void cu_gated_rmsnorm(sl_backend *b, float *x, const float *z, const float *w, int rows, int dim, float eps);
void cu_add_rmsnorm(sl_backend *b, float *x, const float *d, const float *w, int rows, int dim, float eps, float *y);
void cu_matmul_multi(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y);
void cu_matmul_multi_conv(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y,
                          const float *conv_w, int kernel, float *state);
void cu_swiglu_matmul(sl_backend *b, const sl_weight *w, const float *g, const float *u, int n, const float *gate,
                      float *y);
void cu_sigmoid_matmul(sl_backend *b, const sl_weight *w, const float *x, const float *g, int n, float *y);
void cu_gated_rmsnorm_matmul(sl_backend *b, const sl_weight *w, float *x, const float *z, const float *nw, int dim,
                             float eps, int n, float *y);
/* y[i][:] += sigmoid(s[i]) * x[i][:] for rows of dim */
void cu_add_gated(cu_impl *c, float *y, const float *x, const float *s, int rows, int dim);
void cu_qk_rope_store(sl_backend *b, float *q, float *k, const float *v, const sl_batch_map *bm, int n_heads, int n_kv,
                      int head_dim, const float *q_norm, const float *k_norm, float eps, int rot_dim,
                      const float *inv_freq, float attn_factor, void *kc, void *vc, sl_kv_type kt, const float *qg,
                      float *gate);

/* One GGML GEMV launch (see ggml_gemv_k in cuda_ggml.cu): `slots` grid rows, `nz` weights per slot;
 * with act the input is silu(x) * x[act_off + ...]. */
struct gg_call {
    const cu_w *w;
    const cu_expert *table;
    const int32_t *ids;
    int which, slots, nz, x_div, act;
    const float *x;
    long long x_stride, act_off;
    float *y;
    long long y_stride, yz;
    /* the integer GEMV's epilogue, one token (see cu_mmvq_epilogue): with cd, y = sum of cw[q] cd[q] over
     * q < ck + sigmoid(*ysc) Wx; with ysc alone y += sigmoid(*ysc) Wx */
    const float *ysc, *cd, *cw;
    int ck;
};

/* matmul core, shared with the MoE: y[slot] = w(slot) x[slot / x_div], one weight per grid row `slot`
 * (the table entry ids[slot] when table is set). */
void cu_gemv_launch(cu_impl *c, const cu_w *w, const cu_expert *table, const int32_t *ids, int which, int slots,
                    int x_div, const float *x, long long x_stride, int n, float *y, long long y_stride);

/* 1 when a matmul of w by n tokens runs through the GEMV kernels */
int cu_gemv_takes(cu_impl *c, const sl_weight *w, int n);
/* y = sum over s < k of weights[t][s] * d[t * k + s] + sigmoid(gate[t]) * (silu(g) * u) . w^T: a shared
 * expert's down projection joining the routed experts' outputs (GEMV path only) */
void cu_shared_down(cu_impl *c, const sl_weight *w, const float *g, const float *u, int n, const float *gate,
                    const float *d, const float *weights, int k, float *y);
void cu_moe_shared(sl_backend *b, const sl_expert_table *t, const float *logits, int n_experts, int k, int renorm,
                   int32_t *ids, float *weights, const float *x, int n, int hidden, const sl_weight *sh_down,
                   const float *g, const float *u, const float *gate, float *out);

/* the expert GEMVs of a MoE layer: gu[2][slots][inter] = gate, up of x; d[slots][hidden] = down of
 * silu(gate) * up. With logits (ne per token), the gate/up launch routes first and writes ids and
 * weights; else ids are given (always so for GGML experts, whose kernels do not route). */
void cu_moe_gemv(cu_impl *c, const cu_w *gate, const cu_w *up, const cu_w *down, const cu_expert *table, int32_t *ids,
                 int slots, int k, const float *x, int hidden, float *gu, float *d, const float *logits, int ne,
                 int renorm, float *weights);
/* 1 when the gate/up launch can route top-k of ne experts itself */
int cu_moe_routes(int ne, int k);
/* The grouped form of cu_moe_gemv for prompts: each grid row is a group of up to gsize routed pairs of one
 * expert (units[u] = (expert, start, count), their pair indices in pairs[start ..], *count groups, at
 * most max_units), so an expert's rows are read once per group; outputs land where cu_moe_gemv puts them.
 * Not for GGML experts. cu_moe_group_size is the group size for a hidden size. */
int cu_moe_group_size(int hidden);
void cu_moe_grouped(cu_impl *c, const cu_w *gate, const cu_w *down, const cu_expert *table, const int4 *units,
                    const int *pairs, const int *count, int max_units, int gsize, int slots, int k, const float *x,
                    int hidden, float *gu, float *d);

/* One grouped launch of weight `which` (+ grid z < nz) of the table's experts: group u's pairs p read row
 * p / x_div of x (x_stride apart) and write row p of y (y_stride apart, + z * yz), plain inputs. */
void cu_grouped_launch(cu_impl *c, const cu_w *w, const cu_expert *table, int which, int nz, const int4 *units,
                       const int *pairs, const int *count, int max_units, int gsize, const float *x, int x_div,
                       long long x_stride, float *y, long long y_stride, long long yz);

/* GGML block-quantised weights (cuda_ggml.cu); every type decodes by the CPU reference formulas */
/* GPUDirect Storage (cuda_gds.cu), the backend's gds_* ops; cu_gds_close unloads it. */
int cu_gds_open(sl_backend *b, int *direct, sl_err *e);
void *cu_gds_file(sl_backend *b, int fd, sl_err *e);
void cu_gds_file_close(sl_backend *b, void *fh);
int64_t cu_gds_read(sl_backend *b, void *fh, void *dst, size_t len, uint64_t off);
void cu_gds_close(cu_impl *c);
int cu_ggml_init(void); /* copies the IQ codebooks to the current device; nonzero on failure */
int cu_ggml_supported(int gtype);
void cu_ggml_gemv(cu_impl *c, const gg_call &g, int n);
/* The integer GEMV (cuda_mmvq.cu): whether it takes w (a GGML weight), the input of g in q16 (value =
 * d (256 h + l) per 32; in the backend's scratch, valid until the next call), and g's product from it. */
/* (struct cu_q16: above, beside cu_impl) */
int cu_mmvq_takes(const cu_w *w);
/* Blocks of `threads` threads and smem bytes of dynamic shared memory of kernel fn resident per SM (at least
 * 1), remembered per backend. */
int cu_occupancy(cu_impl *c, const void *fn, int threads, size_t smem);
int cu_q16_quantize(cu_impl *c, const gg_call &g, int n, cu_q16 *x);
/* One row of cols values that a kernel about to be launched writes: where to write its q16 too, h NULL where it
 * is not worth making (see q16_fuse). After that launch, cu_q16_made(c, x, cols) records that the q16 is of x. */
cu_q16w cu_q16_want(cu_impl *c, int cols);
void cu_q16_made(cu_impl *c, const float *x, int cols);
/* At a matmul op's entry and exit: the op reads a made q16 only when nothing was launched since. */
void cu_q16_enter(cu_impl *c);
void cu_q16_leave(cu_impl *c);
/* rows of x [rows][cols] in q16 (with u, of silu(x) u) */
int cu_q16_rows(cu_impl *c, const float *x, const float *u, int rows, int cols, cu_q16 *out);
/* 1 when the integer GEMV takes w for one token with the epilogue of gg_call (a shared expert's down
 * projection joining the routed experts' outputs and its gate) */
int cu_mmvq_epilogue(const cu_impl *c, const sl_weight *w, int n);
/* nw weights of one GGML type and one input (the calls differ only in w and y; one when table is set) */
void cu_mmvq(cu_impl *c, const gg_call *gs, int nw, const cu_q16 &x, int n);
void cu_ggml_dequant_split(cu_impl *c, const cu_w *w, __nv_bfloat16 *hi, __nv_bfloat16 *lo);
/* y[n][rows] = W x (+ bias) for a GGML weight and up to CU_MMQ_MAX tokens of input x [n][cols] on tensor
 * cores, the weight decoded tile by tile (cuda_ggml.cu): exact, operands in bf16 halves (near fp32), else
 * one bf16 pass; Q4_K exact or of up to 8 tokens in integers on a q16 input (near fp32). Returns -1 on
 * failure (recorded). */
#define CU_MMQ_MAX 64
int cu_ggml_mmq(cu_impl *c, const cu_w *w, const float *x, int n, int exact, float *y);
/* cu_ggml_mmq in two parts, so that the weights of one input share its conversion: the input in the form the
 * kernel for w takes (bf16 tiles, or q16 for the integer kernel; in the backend's scratch, valid until the next
 * call that converts one), whether weight w takes that same form, and the product. */
struct cu_mmq_in {
    int im, exact, cols, n;
    cu_q16 xq;
    __nv_bfloat16 *xp, *xpl;
};
int cu_ggml_mmq_in(cu_impl *c, const cu_w *w, const float *x, const float *u, int n, int exact, cu_mmq_in *in);
int cu_ggml_mmq_same(const cu_impl *c, const cu_w *w, int exact, const cu_mmq_in &in);
/* weights ws[0..nw) (nw <= SL_MATMUL_MULTI) by one converted input into ys[i]; the column splits of all of them
 * summed in one launch */
int cu_ggml_mmq_run(cu_impl *c, const cu_w *ws, int nw, const cu_mmq_in &in, float *const *ys);
/* Routed pairs of a prompt grouped by expert (units of up to CU_MMQ_GROUP pairs, see moe_group_k) times the
 * table's GGML experts on tensor cores: weight which + z (z < nz) of unit u's expert by rows p / x_div of
 * x [n_x][w0->cols] (of silu(x) u with u) into rows p of y + z * yz. exact: operands in bf16 halves (near
 * fp32), else one bf16 pass; Q4_K always in integers on a q16 input (near fp32). w0 (one expert's weight)
 * gives the type and shape every expert shares. */
#define CU_MMQ_GROUP 32
int cu_ggml_mmq_grouped(cu_impl *c, const cu_w *w0, const cu_expert *table, int which, int nz, const int4 *units,
                        const int *pairs, const int *count, int max_units, int x_div, const float *x, const float *u,
                        int n_x, int exact, float *y, long long yz);
void cu_ggml_embed(cu_impl *c, const cu_w *w, const int32_t *ids, const int32_t *step_tok, int n, float *out);

/* Attention of the prompt run of tokens t0..t0+n-1 (one sequence, consecutive positions) on tensor cores
 * (cuda_flash.cu); 0 when the head size has no kernel, so the caller takes the fp32 one. */
int cu_flash_prefill(cu_impl *c, const float *q, const void *kc, const void *vc, sl_kv_type kt, const sl_batch_map *bm,
                     int t0, int n, int n_heads, int n_kv, int head_dim, int window, float scale, const float *sinks,
                     float *out);

#endif
