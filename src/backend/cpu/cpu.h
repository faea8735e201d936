/* Internals shared by the CPU backend's kernel files. */
#ifndef SLUICE_BACKEND_CPU_H
#define SLUICE_BACKEND_CPU_H

#include <stddef.h>

#include "backend/backend.h"
#include "core/half.h"
#include "core/pool.h"

#include <stdlib.h>
#include <string.h>

typedef struct cpu_impl {
    sl_pool *pool;
    int n_threads;
    float **scratch;     /* one buffer per thread */
    size_t *scratch_len; /* in floats */
    int avx512, avx2;    /* instruction sets in use (SLUICE_CPU_ISA=generic|avx2 narrows them) */
    float *xprep;        /* one-token matmul: the input rearranged for packed kernels, and group sums */
    size_t xprep_len;
    void *moe_buf; /* MoE gather/intermediate buffers, grown to the largest batch seen */
    size_t moe_len;
    float *pairs;     /* MoE output per routed (token, slot) pair [n * k][hidden] */
    size_t pairs_len; /* in floats */
    float *act;       /* swiglu_matmul: the SwiGLU input of the down projection */
    size_t act_len;
    double bandwidth, flops; /* measured bounds, 0 until measured */
    sl_err failure;          /* first op failure since the last check() */
    int failed;
} cpu_impl;

static inline cpu_impl *cpu_of(sl_backend *b) {
    return (cpu_impl *)b->impl;
}

/* Grows every thread's scratch to at least `floats`; returns -1 (and records the failure) when out of
 * memory. */
int cpu_scratch_reserve(cpu_impl *c, size_t floats);

/* Element i of an MLX scales/biases array stored as f (F32, F16 or BF16). */
static inline float load_sb(sl_wfmt f, const uint8_t *p, size_t i) {
    if (f == SL_WF_F32) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return f == SL_WF_BF16 ? sl_bf16_to_f32(h) : sl_f16_to_f32(h);
}

/* Row r of w as float32 into dst[w->cols]. */
void cpu_row_f32(const sl_weight *w, int r, float *dst);
/* Dot product with 16 partial sums, written so the compiler vectorises it inside whichever target the
 * caller is compiled for. */
static inline float cpu_dot_inline(const float *a, const float *b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += a[i + k] * b[i + k];
    float s = 0;
    for (int k = 0; k < 16; k++) s += acc[k];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
/* The same, dispatched at run time to the best vector width. */
float cpu_dot(const float *a, const float *b, int n);

/* One-token matmul through fused dequantise-dot kernels; returns -1 when w's format has no fused kernel
 * on this machine (the caller then uses the row-decoding path). */
int cpu_gemv(cpu_impl *c, const sl_weight *w, const float *x, float *y);

/* GGML block-quantised weights (SL_WF_GGML): a fused dequantise-dot of one row with x over `cols`
 * values (xs: the sums of x over each 16 values), specialised per type and instruction set; NULL when
 * the type has no vector kernel here (the caller then decodes block by block through the reference
 * decoder). */
typedef float (*cpu_ggml_dot_fn)(const uint8_t *row, const float *x, const float *xs, int cols);
cpu_ggml_dot_fn cpu_ggml_pick(const cpu_impl *c, int gtype);
/* Matmul of a GGML weight with n tokens by fused row kernels (used for decode and small batches);
 * returns -1 (and records the failure) when out of memory. */
int cpu_ggml_matmul_fused(cpu_impl *c, const sl_weight *w, const float *x, int n, float *y);
/* out[g] = the sum of x[16g .. 16g + 15] for g < groups (the GGML row kernels' input sums). */
void cpu_sums16(const float *x, size_t groups, float *out);

/* One token's matmul y = w . x by the fused row kernels, in parts, so that many of them share one pool
 * dispatch: cpu_mv_prep arranges x for w's kernel into prep (cpu_mv_prep_floats(w) floats) and returns -1
 * when w has no fused row kernel here; cpu_mv_rows then computes rows [r0, r1) on the calling thread. The
 * kernels and input arrangement of cpu_gemv and cpu_ggml_matmul_fused, so the same bits. */
typedef float (*cpu_row_dot_fn)(const sl_weight *w, int r, const float *x, const float *xp, const float *xsum);
typedef struct cpu_mv {
    const sl_weight *w;
    const float *x, *xp, *xs;
    float *y;
    cpu_row_dot_fn dot;   /* float, MLX, FP8 and MXFP4 rows */
    cpu_ggml_dot_fn gdot; /* GGML rows */
} cpu_mv;
size_t cpu_mv_prep_floats(const sl_weight *w);
int cpu_mv_prep(const cpu_impl *c, const sl_weight *w, const float *x, float *prep, float *y, cpu_mv *mv);
void cpu_mv_rows(const cpu_mv *mv, int64_t r0, int64_t r1);

void cpu_embed(sl_backend *b, const sl_weight *w, const int32_t *ids, int n, float *out);
void cpu_matmul(sl_backend *b, const sl_weight *w, const float *x, int n, float *y);
void cpu_attention(sl_backend *b, const float *q, const void *kc, const void *vc, sl_kv_type kt, const sl_batch_map *bm,
                   int n_heads, int n_kv, int head_dim, int window, float scale, const float *sinks, float *out);
void cpu_route(sl_backend *b, const float *logits, int n, int n_experts, int k, int renorm, int32_t *ids,
               float *weights);
void cpu_route_grouped(sl_backend *b, const float *logits, const float *bias, int n, int n_experts, int k, int n_group,
                       int topk_group, int renorm, float scale, int32_t *ids, float *weights);
void cpu_mla_rope_store(sl_backend *b, float *q, float *kv, const sl_batch_map *bm, const sl_mla_dims *d,
                        const float *kv_norm, float eps, const float *inv_freq, float attn_factor, float *cache);
void cpu_mla_attention(sl_backend *b, const float *q, const float *cache, const sl_batch_map *bm, const sl_mla_dims *d,
                       const float *wkv_b, float scale, float *out);
void cpu_moe(sl_backend *b, const sl_expert_table *t, const float *x, int n, int hidden, const int32_t *ids,
             const float *weights, int k, float *out);
void cpu_moe_pairs(sl_backend *b, const sl_expert_table *t, const float *x, int n, int hidden, const int32_t *ids,
                   int k);
void cpu_moe_combine(sl_backend *b, const float *weights, int n, int k, int hidden, float *out);
void cpu_moe_guard(sl_backend *b, const sl_expert_table *t, int32_t *ids, int nk, int32_t *rec, int32_t *miss,
                   const uint8_t *host, const float *share, int32_t *host_ids);
void cpu_moe_handoff(sl_backend *b, const float *x, int n, int hidden, const int32_t *ids, int nk, sl_handoff *h);
void cpu_moe_await(sl_backend *b, sl_handoff *h, const float *rows, const int32_t *idx, int n, int k, int hidden,
                   int32_t *miss, void (*serve)(void *ctx, sl_handoff *h), void *ctx);
void cpu_moe_pairs_put(sl_backend *b, const float *rows, const int32_t *idx, int cnt, int n, int k, int hidden);
void cpu_moe_pairs_get(sl_backend *b, float *rows, const int32_t *idx, int cnt, int hidden);
void cpu_conv1d_silu(sl_backend *b, const float *x, int n, int channels, const float *w, int kernel, float *state,
                     float *out);
void cpu_deltanet(sl_backend *b, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                  const float *A_log, const float *dt_bias, float *state, int n, float *out);
/* Read bandwidth of RAM on all threads (bytes/s) and fp32 FMA peak (FLOP/s), measured once. */
double cpu_mem_bandwidth(sl_backend *b);
double cpu_peak_flops(sl_backend *b);
void cpu_gated_rmsnorm(sl_backend *b, float *x, const float *z, const float *w, int rows, int dim, float eps);

#endif
