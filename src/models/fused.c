#include "models/fused.h"

void sl_add_rmsnorm(sl_backend *b, float *x, const float *d, const float *w, int rows, int dim, float eps, float *y) {
    const sl_backend_ops *op = b->ops;
    if (d && op->add_rmsnorm) {
        op->add_rmsnorm(b, x, d, w, rows, dim, eps, y);
        return;
    }
    if (d) op->add(b, x, d, (size_t)rows * (size_t)dim);
    op->rmsnorm(b, x, w, rows, dim, eps, y);
}

void sl_matmul_multi(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y) {
    const sl_backend_ops *op = b->ops;
    if (!op->matmul_multi) {
        for (int i = 0; i < nw; i++) op->matmul(b, w[i], x, n, y[i]);
        return;
    }
    for (int i = 0; i < nw; i += SL_MATMUL_MULTI)
        op->matmul_multi(b, nw - i < SL_MATMUL_MULTI ? nw - i : SL_MATMUL_MULTI, w + i, x, n, y + i);
}

void sl_swiglu_matmul(sl_backend *b, const sl_weight *w, float *g, const float *u, int n, const float *gate, float *tmp,
                      float *y) {
    const sl_backend_ops *op = b->ops;
    if (op->swiglu_matmul) {
        op->swiglu_matmul(b, w, g, u, n, gate, y);
        return;
    }
    op->swiglu(b, g, u, (size_t)n * (size_t)w->cols, g);
    if (!gate) {
        op->matmul(b, w, g, n, y);
        return;
    }
    op->matmul(b, w, g, n, tmp);
    op->scale_rows_sigmoid(b, tmp, gate, n, w->rows);
    op->add(b, y, tmp, (size_t)n * (size_t)w->rows);
}

void sl_sigmoid_matmul(sl_backend *b, const sl_weight *w, float *x, const float *g, int n, float *y) {
    const sl_backend_ops *op = b->ops;
    if (op->sigmoid_matmul) {
        op->sigmoid_matmul(b, w, x, g, n, y);
        return;
    }
    op->mul_sigmoid(b, x, g, (size_t)n * (size_t)w->cols);
    op->matmul(b, w, x, n, y);
}

void sl_qk_rope_store(sl_backend *b, float *q, float *k, const float *v, const sl_batch_map *bm, int n_heads, int n_kv,
                      int head_dim, const float *q_norm, const float *k_norm, float eps, int rot_dim,
                      const float *inv_freq, float attn_factor, void *kc, void *vc, sl_kv_type kt, const float *qg,
                      float *gate) {
    const sl_backend_ops *op = b->ops;
    int n = bm->n;
    if (op->qk_rope_store) {
        op->qk_rope_store(b, q, k, v, bm, n_heads, n_kv, head_dim, q_norm, k_norm, eps, rot_dim, inv_freq, attn_factor,
                          kc, vc, kt, qg, gate);
        return;
    }
    if (qg) { /* as rows of head_dim, qg is [n * n_heads][2 * head_dim] */
        op->copy_rows(b, q, head_dim, qg, 2 * head_dim, n * n_heads, head_dim);
        op->copy_rows(b, gate, head_dim, qg + head_dim, 2 * head_dim, n * n_heads, head_dim);
    }
    int qw = n_heads * head_dim, kw = n_kv * head_dim;
    if (q_norm) op->rmsnorm(b, q, q_norm, n * n_heads, head_dim, eps, q);
    if (k_norm) op->rmsnorm(b, k, k_norm, n * n_kv, head_dim, eps, k);
    op->rope(b, q, qw, n_heads, head_dim, rot_dim, bm, inv_freq, attn_factor);
    op->rope(b, k, kw, n_kv, head_dim, rot_dim, bm, inv_freq, attn_factor);
    op->kv_store(b, kc, kt, bm, k, kw);
    op->kv_store(b, vc, kt, bm, v, kw);
}

void sl_gated_rmsnorm_matmul(sl_backend *b, const sl_weight *w, float *x, const float *z, const float *nw, int dim,
                             float eps, int n, float *y) {
    const sl_backend_ops *op = b->ops;
    if (op->gated_rmsnorm_matmul) {
        op->gated_rmsnorm_matmul(b, w, x, z, nw, dim, eps, n, y);
        return;
    }
    op->gated_rmsnorm(b, x, z, nw, n * (w->cols / dim), dim, eps);
    op->matmul(b, w, x, n, y);
}

void sl_moe_shared(sl_backend *b, const sl_expert_table *t, const float *logits, int n_experts, int k, int renorm,
                   int32_t *ids, float *weights, const float *x, int n, int hidden, const sl_weight *sh_down, float *g,
                   const float *u, const float *gate, float *tmp, float *out) {
    const sl_backend_ops *op = b->ops;
    if (op->moe_shared) {
        op->moe_shared(b, t, logits, n_experts, k, renorm, ids, weights, x, n, hidden, sh_down, g, u, gate, out);
        return;
    }
    op->route(b, logits, n, n_experts, k, renorm, ids, weights);
    op->moe(b, t, x, n, hidden, ids, weights, k, out);
    sl_swiglu_matmul(b, sh_down, g, u, n, gate, tmp, out);
}

void sl_moe_combine_shared(sl_backend *b, const sl_expert_table *t, const float *weights, int n, int k, int hidden,
                           const sl_weight *sh_down, float *g, const float *u, const float *gate, float *tmp,
                           float *out) {
    const sl_backend_ops *op = b->ops;
    if (op->moe_combine_shared) {
        op->moe_combine_shared(b, t, weights, n, k, hidden, sh_down, g, u, gate, out);
        return;
    }
    op->moe_combine(b, weights, n, k, hidden, out);
    sl_swiglu_matmul(b, sh_down, g, u, n, gate, tmp, out);
}

void sl_matmul_multi_conv(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y,
                          const float *conv_w, int kernel, float *state, float *tmp) {
    const sl_backend_ops *op = b->ops;
    if (op->matmul_multi_conv) {
        op->matmul_multi_conv(b, nw, w, x, n, y, conv_w, kernel, state);
        return;
    }
    float *yy[SL_MATMUL_MULTI];
    for (int i = 0; i < nw && i < SL_MATMUL_MULTI; i++) yy[i] = i ? y[i] : tmp;
    sl_matmul_multi(b, nw < SL_MATMUL_MULTI ? nw : SL_MATMUL_MULTI, w, x, n, yy);
    op->conv1d_silu(b, tmp, n, w[0]->rows, conv_w, kernel, state, y[0]);
}

void sl_route(sl_backend *b, const sl_config *c, const float *bias, const float *logits, int n, int n_experts,
              int32_t *ids, float *weights) {
    if (c->route_sigmoid)
        b->ops->route_grouped(b, logits, bias, n, n_experts, c->top_k, c->n_group, c->topk_group, c->norm_topk_prob,
                              (float)c->routed_scale, ids, weights);
    else
        b->ops->route(b, logits, n, n_experts, c->top_k, c->norm_topk_prob, ids, weights);
}
