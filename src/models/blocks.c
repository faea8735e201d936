#include "models/blocks.h"

#include "experts/store.h"
#include "models/fused.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int blk_load_outer(sl_model *m, sl_loader *ld, float norm_add, sl_err *e) {
    const sl_config *c = &m->cfg;
    if (sl_ld_linear(ld, "model.embed_tokens", c->vocab_size, c->hidden, &m->embed, e)) return -1;
    if (m->embed.bias) return sl_fail(e, "%s: embedding has an unexpected bias", m->path);
    if (sl_ld_vector(ld, "model.norm.weight", c->hidden, norm_add, &m->final_norm, e)) return -1;
    if (c->tie_embeddings && !sl_ld_has(ld, "lm_head.weight")) {
        m->lm_head = m->embed;
        return 0;
    }
    return sl_ld_linear(ld, "lm_head", c->vocab_size, c->hidden, &m->lm_head, e);
}

int blk_load_norms(sl_model *m, sl_loader *ld, int l, float norm_add, sl_err *e) {
    char nb[256];
    sl_layer *L = &m->layers[l];
    int H = m->cfg.hidden;
    if (sl_ld_vector(ld, NAME(nb, "model.layers.%d.input_layernorm.weight", l), H, norm_add, &L->attn_norm, e))
        return -1;
    return sl_ld_vector(ld, NAME(nb, "model.layers.%d.post_attention_layernorm.weight", l), H, norm_add, &L->ffn_norm,
                        e);
}

int blk_load_attention(sl_model *m, sl_loader *ld, int l, int q_gated, float norm_add, sl_err *e) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    char nb[256];
    int qw = c->n_heads * c->head_dim, kw = c->n_kv_heads * c->head_dim;
    L->kind = SL_LAYER_ATTENTION;
    L->q_gated = q_gated;
    L->window = c->layer_window ? c->layer_window[l] : c->sliding_window;
    if (sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.q_proj", l), qw * (q_gated ? 2 : 1), c->hidden, &L->wq,
                     e) ||
        sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.k_proj", l), kw, c->hidden, &L->wk, e) ||
        sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.v_proj", l), kw, c->hidden, &L->wv, e) ||
        sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.o_proj", l), c->hidden, qw, &L->wo, e))
        return -1;
    if (sl_ld_has(ld, NAME(nb, "model.layers.%d.self_attn.q_norm.weight", l))) {
        if (sl_ld_vector(ld, nb, c->head_dim, norm_add, &L->q_norm, e) ||
            sl_ld_vector(ld, NAME(nb, "model.layers.%d.self_attn.k_norm.weight", l), c->head_dim, norm_add, &L->k_norm,
                         e))
            return -1;
    }
    if (sl_ld_has(ld, NAME(nb, "model.layers.%d.self_attn.sinks", l)) &&
        sl_ld_vector(ld, nb, c->n_heads, 0.0f, &L->sinks, e))
        return -1;
    return 0;
}

void blk_attention(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    const sl_config *c = &m->cfg;
    const sl_backend_ops *op = m->be->ops;
    sl_backend *be = m->be;
    sl_layer *L = &m->layers[l];
    sl_scratch *x = &s->s;
    int hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    float eps = (float)c->rms_eps;
    const sl_weight *w[3] = {&L->wq, &L->wk, &L->wv};
    float *y[3] = {L->q_gated ? x->qraw : x->q, x->k, x->v};
    sl_matmul_multi(be, 3, w, xn, n, y);
    /* gated q_proj rows are [query | gate] per head; the queries and gates are split out on the way */
    sl_qk_rope_store(be, x->q, x->k, x->v, &s->bm, nh, nkv, hd, L->q_norm, L->q_norm ? L->k_norm : NULL, eps,
                     m->rot_dim, m->inv_freq, m->attn_factor, s->kc[l], s->vc[l], L->q_gated ? x->qraw : NULL, x->gate);
    op->attention(be, x->q, s->kc[l], s->vc[l], &s->bm, nh, nkv, hd, L->window, 1.0f / sqrtf((float)hd), L->sinks,
                  x->att);
    if (L->q_gated)
        sl_sigmoid_matmul(be, &L->wo, x->att, x->gate, n, out);
    else
        op->matmul(be, &L->wo, x->att, n, out);
}

int blk_load_mlp(sl_model *m, sl_loader *ld, int l, sl_err *e) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    char nb[256];
    if (c->intermediate <= 0)
        return sl_fail(e, "%s%s: intermediate_size missing for dense layer %d", m->path, m->cfg_suffix, l);
    return sl_ld_linear(ld, NAME(nb, "model.layers.%d.mlp.gate_proj", l), c->intermediate, c->hidden, &L->w_gate, e) ||
                   sl_ld_linear(ld, NAME(nb, "model.layers.%d.mlp.up_proj", l), c->intermediate, c->hidden, &L->w_up,
                                e) ||
                   sl_ld_linear(ld, NAME(nb, "model.layers.%d.mlp.down_proj", l), c->hidden, c->intermediate,
                                &L->w_down, e)
               ? -1
               : 0;
}

void blk_mlp(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    sl_layer *L = &m->layers[l];
    const sl_weight *w[2] = {&L->w_gate, &L->w_up};
    float *y[2] = {s->s.ff_g, s->s.ff_u};
    sl_matmul_multi(m->be, 2, w, xn, n, y);
    sl_swiglu_matmul(m->be, &L->w_down, s->s.ff_g, s->s.ff_u, n, NULL, NULL, out);
}

int blk_load_moe(sl_model *m, sl_loader *ld, int l, int with_shared, sl_err *e) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    char nb[256], p[128];
    int E = c->n_experts, I = c->moe_intermediate, H = c->hidden;
    if (I <= 0) return sl_fail(e, "%s%s: moe_intermediate_size missing", m->path, m->cfg_suffix);
    snprintf(p, sizeof p, "model.layers.%d.mlp", l);
    L->is_moe = 1;
    if (sl_ld_linear(ld, NAME(nb, "%s.gate", p), E, H, &L->router, e)) return -1;
    if (sl_ld_has(ld, NAME(nb, "%s.gate.e_score_correction_bias", p)) &&
        sl_ld_vector(ld, nb, E, 0.0f, &L->router_bias, e))
        return -1;
    L->expert_store = calloc((size_t)E, sizeof *L->expert_store);
    L->experts.experts = calloc((size_t)E, sizeof *L->experts.experts);
    if (!L->expert_store || !L->experts.experts) return sl_fail(e, "out of memory");
    L->experts.n_experts = E;
    for (int x = 0; x < E; x++) {
        sl_expert *ex = &L->expert_store[x];
        int rc;
        if (sl_ld_has(ld, NAME(nb, "%s.experts.gate_up_proj", p))) { /* fused [E, 2I, H] + [E, H, I] */
            rc = sl_ld_stacked(ld, nb, 0, E, x, 0, 2 * I, I, H, &ex->gate, e) ||
                 sl_ld_stacked(ld, nb, 0, E, x, I, 2 * I, I, H, &ex->up, e) ||
                 sl_ld_stacked(ld, NAME(nb, "%s.experts.down_proj", p), 0, E, x, 0, H, H, I, &ex->down, e);
        } else if (sl_ld_has(ld, NAME(nb, "%s.switch_mlp.gate_proj.weight", p))) { /* stacked [E, out, in] */
            rc = sl_ld_stacked(ld, NAME(nb, "%s.switch_mlp.gate_proj", p), 1, E, x, 0, I, I, H, &ex->gate, e) ||
                 sl_ld_stacked(ld, NAME(nb, "%s.switch_mlp.up_proj", p), 1, E, x, 0, I, I, H, &ex->up, e) ||
                 sl_ld_stacked(ld, NAME(nb, "%s.switch_mlp.down_proj", p), 1, E, x, 0, H, H, I, &ex->down, e);
        } else { /* one matrix per expert */
            rc = sl_ld_linear(ld, NAME(nb, "%s.experts.%d.gate_proj", p, x), I, H, &ex->gate, e) ||
                 sl_ld_linear(ld, NAME(nb, "%s.experts.%d.up_proj", p, x), I, H, &ex->up, e) ||
                 sl_ld_linear(ld, NAME(nb, "%s.experts.%d.down_proj", p, x), H, I, &ex->down, e);
        }
        if (rc) return -1;
        L->experts.experts[x] = ex;
    }
    if (with_shared == BLK_SHARED_NONE) return 0;
    if (with_shared == BLK_SHARED_PLAIN) { /* shared_experts: n_shared experts' width, joined ungated */
        int SI = c->shared_intermediate;
        if (SI <= 0) return sl_fail(e, "%s%s: n_shared_experts missing", m->path, m->cfg_suffix);
        L->has_shared = L->shared_plain = 1;
        return sl_ld_linear(ld, NAME(nb, "%s.shared_experts.gate_proj", p), SI, H, &L->sh_gate, e) ||
                       sl_ld_linear(ld, NAME(nb, "%s.shared_experts.up_proj", p), SI, H, &L->sh_up, e) ||
                       sl_ld_linear(ld, NAME(nb, "%s.shared_experts.down_proj", p), H, SI, &L->sh_down, e)
                   ? -1
                   : 0;
    }
    int SI = c->shared_intermediate;
    if (SI <= 0) return sl_fail(e, "%s%s: shared_expert_intermediate_size missing", m->path, m->cfg_suffix);
    L->has_shared = 1;
    return sl_ld_linear(ld, NAME(nb, "%s.shared_expert.gate_proj", p), SI, H, &L->sh_gate, e) ||
                   sl_ld_linear(ld, NAME(nb, "%s.shared_expert.up_proj", p), SI, H, &L->sh_up, e) ||
                   sl_ld_linear(ld, NAME(nb, "%s.shared_expert.down_proj", p), H, SI, &L->sh_down, e) ||
                   sl_ld_linear(ld, NAME(nb, "%s.shared_expert_gate", p), 1, H, &L->sh_router, e)
               ? -1
               : 0;
}

/* Routed experts plus an ungated shared expert: out = moe(xn) + down(silu(gate xn) * up xn). */
static void moe_plain_shared(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    const sl_config *c = &m->cfg;
    sl_backend *be = m->be;
    sl_layer *L = &m->layers[l];
    sl_scratch *x = &s->s;
    const sl_weight *w[3] = {&L->router, &L->sh_gate, &L->sh_up};
    float *y[3] = {x->router, x->ff_g, x->ff_u};
    sl_matmul_multi(be, 3, w, xn, n, y);
    if (m->store) {
        sl_store_moe_args a = {
            .x = xn, .n = n, .logits = x->router, .ids = x->moe_ids, .weights = x->moe_w, .out = out};
        sl_store_moe(m->store, l, &a);
    } else {
        sl_route(be, c, L->router_bias, x->router, n, c->n_experts, x->moe_ids, x->moe_w);
        be->ops->moe(be, &L->experts, xn, n, c->hidden, x->moe_ids, x->moe_w, c->top_k, out);
    }
    sl_swiglu_matmul(be, &L->sh_down, x->ff_g, x->ff_u, n, NULL, NULL, x->ff_o);
    be->ops->add(be, out, x->ff_o, (size_t)n * (size_t)c->hidden);
}

void blk_moe(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    const sl_config *c = &m->cfg;
    const sl_backend_ops *op = m->be->ops;
    sl_backend *be = m->be;
    sl_layer *L = &m->layers[l];
    sl_scratch *x = &s->s;
    if (L->shared_plain) {
        moe_plain_shared(m, s, l, xn, n, out);
        return;
    }
    /* the router and the shared expert's gate and up projections all read xn */
    const sl_weight *w[4] = {&L->router, &L->sh_router, &L->sh_gate, &L->sh_up};
    float *y[4] = {x->router, x->sh_gate, x->ff_g, x->ff_u};
    sl_matmul_multi(be, L->has_shared ? 4 : 1, w, xn, n, y);
    if (m->store) {
        sl_store_moe_args a = {.x = xn,
                               .n = n,
                               .logits = x->router,
                               .ids = x->moe_ids,
                               .weights = x->moe_w,
                               .sh_down = L->has_shared ? &L->sh_down : NULL,
                               .g = x->ff_g,
                               .u = x->ff_u,
                               .gate = x->sh_gate,
                               .tmp = x->ff_o,
                               .out = out};
        sl_store_moe(m->store, l, &a);
        return;
    }
    if (!L->has_shared) {
        sl_route(be, c, L->router_bias, x->router, n, c->n_experts, x->moe_ids, x->moe_w);
        op->moe(be, &L->experts, xn, n, c->hidden, x->moe_ids, x->moe_w, c->top_k, out);
        return;
    }
    /* routing, the routed experts + sigmoid(shared gate) * shared expert */
    sl_moe_shared(be, &L->experts, x->router, c->n_experts, c->top_k, c->norm_topk_prob, x->moe_ids, x->moe_w, xn, n,
                  c->hidden, &L->sh_down, x->ff_g, x->ff_u, x->sh_gate, x->ff_o, out);
}

void blk_ffn(sl_model *m, sl_session *s, int l, float *x, const float *attn_out, int n) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    sl_add_rmsnorm(m->be, x, attn_out, L->ffn_norm, n, c->hidden, (float)c->rms_eps, s->s.xn);
    if (L->is_moe)
        blk_moe(m, s, l, s->s.xn, n, s->s.moe_out);
    else
        blk_mlp(m, s, l, s->s.xn, n, s->s.moe_out);
}

void blk_ffn_residual(sl_model *m, sl_session *s, int l, float *x, int n) {
    blk_ffn(m, s, l, x, NULL, n);
    m->be->ops->add(m->be, x, s->s.moe_out, (size_t)m->cfg.hidden * (size_t)n);
}

void blk_layer_input(sl_model *m, sl_session *s, int l, float *x, int n) {
    const sl_config *c = &m->cfg;
    sl_add_rmsnorm(m->be, x, l ? s->s.moe_out : NULL, m->layers[l].attn_norm, n, c->hidden, (float)c->rms_eps, s->s.xn);
}

void blk_layers_end(sl_model *m, sl_session *s, float *x, int n) {
    if (m->cfg.n_layers > 0) m->be->ops->add(m->be, x, s->s.moe_out, (size_t)m->cfg.hidden * (size_t)n);
}

int blk_decoder_layers(sl_model *m, sl_session *s, float *x, int n, sl_err *e) {
    (void)e;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        blk_layer_input(m, s, l, x, n);
        blk_attention(m, s, l, s->s.xn, n, s->s.ff_o);
        blk_ffn(m, s, l, x, s->s.ff_o, n);
    }
    blk_layers_end(m, s, x, n);
    return 0;
}
