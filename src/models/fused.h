/* The fused ops of the backend table as the models issue them: each calls the backend's fused op when it
 * has one, else the plain ops it stands for, so every backend runs every model. */
#ifndef SLUICE_MODELS_FUSED_H
#define SLUICE_MODELS_FUSED_H

#include "backend/backend.h"
#include "formats/config.h"

/* The routing the config asks for: softmax top-k (route), or sigmoid scores with the correction bias
 * and group-limited choice (route_grouped). */
void sl_route(sl_backend *b, const sl_config *c, const float *bias, const float *logits, int n, int n_experts,
              int32_t *ids, float *weights);

/* x += d (d NULL: nothing to add), then y = rmsnorm(x) * w. */
void sl_add_rmsnorm(sl_backend *b, float *x, const float *d, const float *w, int rows, int dim, float eps, float *y);
/* y[i] = x . w[i]^T for nw weights of the same cols; more than SL_MATMUL_MULTI run in several calls. */
void sl_matmul_multi(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y);
/* sl_matmul_multi whose first output is conv1d_silu(x . w[0]^T) (taps conv_w, state advanced); tmp
 * [n][w[0].rows] is scratch for the unfused path. nw <= SL_MATMUL_MULTI. */
void sl_matmul_multi_conv(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y,
                          const float *conv_w, int kernel, float *state, float *tmp);
/* p = (silu(g) * u) . w^T; y = p, or with gate y[i][:] += sigmoid(gate[i]) * p[i][:]. g may be overwritten
 * (the unfused path forms the SwiGLU in it) and, with gate, the unfused path puts p in tmp[n][w.rows]. */
void sl_swiglu_matmul(sl_backend *b, const sl_weight *w, float *g, const float *u, int n, const float *gate, float *tmp,
                      float *y);
/* route(logits) into ids, weights; out = moe(t, x, ids, weights) + sigmoid(gate[i]) * (silu(g) * u) .
 * sh_down^T. g may be overwritten and tmp[n][hidden] is scratch for the unfused path. */
void sl_moe_shared(sl_backend *b, const sl_expert_table *t, const float *logits, int n_experts, int k, int renorm,
                   int32_t *ids, float *weights, const float *x, int n, int hidden, const sl_weight *sh_down, float *g,
                   const float *u, const float *gate, float *tmp, float *out);
/* moe_combine of the pairs computed for experts t (see moe_pairs), joined by the shared expert as
 * sl_moe_shared joins it. g may be overwritten and tmp[n][hidden] is scratch for the unfused path. */
void sl_moe_combine_shared(sl_backend *b, const sl_expert_table *t, const float *weights, int n, int k, int hidden,
                           const sl_weight *sh_down, float *g, const float *u, const float *gate, float *tmp,
                           float *out);
/* y = (x * sigmoid(g)) . w^T; x may be overwritten (the unfused path gates it in place). */
void sl_sigmoid_matmul(sl_backend *b, const sl_weight *w, float *x, const float *g, int n, float *y);
/* y = gated_rmsnorm(x, z, nw over groups of dim) . w^T; x may be overwritten. */
void sl_gated_rmsnorm_matmul(sl_backend *b, const sl_weight *w, float *x, const float *z, const float *nw, int dim,
                             float eps, int n, float *y);
/* q, k of the batch bm: per-head norm (q_norm / k_norm NULL: none) and rotary embedding in place; k and v
 * into the caches (elements of type kt) at each token's row. With qg (rows of [query | gate] per head) q is taken from
 * qg and the gates go to gate. */
void sl_qk_rope_store(sl_backend *b, float *q, float *k, const float *v, const sl_batch_map *bm, int n_heads, int n_kv,
                      int head_dim, const float *q_norm, const float *k_norm, float eps, int rot_dim,
                      const float *inv_freq, float attn_factor, void *kc, void *vc, sl_kv_type kt, const float *qg,
                      float *gate);

#endif
