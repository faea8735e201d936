/* The mixture-of-experts kind: a router, routed experts (resident, or streamed through the expert store)
 * and an optional shared expert, gated by its own sigmoid (Qwen) or joined plain (DeepSeek-V3, GLM-4.5).
 * No state. */
#include "models/blocks.h"

#include "experts/store.h"
#include "models/fused.h"

sl_moe *blk_moe_part(sl_model *m, sl_loader *ld, int l, int n_experts, sl_err *e) {
    sl_layer *L = &m->layers[l];
    sl_moe *M = sl_ld_part(ld, 1, sizeof *M, e);
    if (!M || !(M->expert_store = sl_ld_part(ld, (size_t)n_experts, sizeof *M->expert_store, e)) ||
        !(M->experts.experts = sl_ld_part(ld, (size_t)n_experts, sizeof *M->experts.experts, e)))
        return NULL;
    M->experts.n_experts = n_experts;
    L->moe = M;
    L->ffn = &sl_kind_moe;
    return M;
}

int blk_load_moe(sl_model *m, sl_loader *ld, int l, int with_shared, sl_err *e) {
    const sl_config *c = &m->cfg;
    char nb[256], p[128];
    int E = c->n_experts, I = c->moe_intermediate, H = c->hidden;
    if (I <= 0) return sl_fail(e, "%s%s: moe_intermediate_size missing", m->path, m->cfg_suffix);
    snprintf(p, sizeof p, "model.layers.%d.mlp", l);
    sl_moe *M = blk_moe_part(m, ld, l, E, e);
    if (!M) return -1;
    if (sl_ld_linear(ld, NAME(nb, "%s.gate", p), E, H, &M->router, e)) return -1;
    if (sl_ld_has(ld, NAME(nb, "%s.gate.e_score_correction_bias", p)) &&
        sl_ld_vector(ld, nb, E, 0.0f, &M->router_bias, e))
        return -1;
    for (int x = 0; x < E; x++) {
        sl_expert *ex = &M->expert_store[x];
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
        M->experts.experts[x] = ex;
    }
    if (with_shared == BLK_SHARED_NONE) return 0;
    if (with_shared == BLK_SHARED_PLAIN) { /* shared_experts: n_shared experts' width, joined ungated */
        int SI = c->shared_intermediate;
        if (SI <= 0) return sl_fail(e, "%s%s: n_shared_experts missing", m->path, m->cfg_suffix);
        M->has_shared = M->shared_plain = 1;
        return sl_ld_linear(ld, NAME(nb, "%s.shared_experts.gate_proj", p), SI, H, &M->sh_gate, e) ||
                       sl_ld_linear(ld, NAME(nb, "%s.shared_experts.up_proj", p), SI, H, &M->sh_up, e) ||
                       sl_ld_linear(ld, NAME(nb, "%s.shared_experts.down_proj", p), H, SI, &M->sh_down, e)
                   ? -1
                   : 0;
    }
    int SI = c->shared_intermediate;
    if (SI <= 0) return sl_fail(e, "%s%s: shared_expert_intermediate_size missing", m->path, m->cfg_suffix);
    M->has_shared = 1;
    return sl_ld_linear(ld, NAME(nb, "%s.shared_expert.gate_proj", p), SI, H, &M->sh_gate, e) ||
                   sl_ld_linear(ld, NAME(nb, "%s.shared_expert.up_proj", p), SI, H, &M->sh_up, e) ||
                   sl_ld_linear(ld, NAME(nb, "%s.shared_expert.down_proj", p), H, SI, &M->sh_down, e) ||
                   sl_ld_linear(ld, NAME(nb, "%s.shared_expert_gate", p), 1, H, &M->sh_router, e)
               ? -1
               : 0;
}

/* Routed experts plus an ungated shared expert: out = moe(xn) + down(silu(gate xn) * up xn). */
static void moe_plain_shared(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    const sl_config *c = &m->cfg;
    sl_backend *be = m->be;
    const sl_moe *M = m->layers[l].moe;
    sl_moe_scratch *x = &s->s.moe;
    const sl_weight *w[3] = {&M->router, &M->sh_gate, &M->sh_up};
    float *y[3] = {x->router, x->g, x->u};
    sl_matmul_multi(be, 3, w, xn, n, y);
    if (m->store) {
        sl_store_moe_args a = {.x = xn, .n = n, .logits = x->router, .ids = x->ids, .weights = x->weights, .out = out};
        sl_store_moe(m->store, l, &a);
    } else {
        sl_route(be, c, M->router_bias, x->router, n, c->n_experts, x->ids, x->weights);
        be->ops->moe(be, &M->experts, xn, n, c->hidden, x->ids, x->weights, c->top_k, out);
    }
    sl_swiglu_matmul(be, &M->sh_down, x->g, x->u, n, NULL, NULL, x->tmp);
    be->ops->add(be, out, x->tmp, (size_t)n * (size_t)c->hidden);
}

static void moe_forward(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    const sl_config *c = &m->cfg;
    const sl_backend_ops *op = m->be->ops;
    sl_backend *be = m->be;
    const sl_moe *M = m->layers[l].moe;
    sl_moe_scratch *x = &s->s.moe;
    if (M->shared_plain) {
        moe_plain_shared(m, s, l, xn, n, out);
        return;
    }
    /* the router and the shared expert's gate and up projections all read xn */
    const sl_weight *w[4] = {&M->router, &M->sh_router, &M->sh_gate, &M->sh_up};
    float *y[4] = {x->router, x->sh_gate, x->g, x->u};
    sl_matmul_multi(be, M->has_shared ? 4 : 1, w, xn, n, y);
    if (m->store) {
        sl_store_moe_args a = {.x = xn,
                               .n = n,
                               .logits = x->router,
                               .ids = x->ids,
                               .weights = x->weights,
                               .sh_down = M->has_shared ? &M->sh_down : NULL,
                               .g = x->g,
                               .u = x->u,
                               .gate = x->sh_gate,
                               .tmp = x->tmp,
                               .out = out};
        sl_store_moe(m->store, l, &a);
        return;
    }
    if (!M->has_shared) {
        sl_route(be, c, M->router_bias, x->router, n, c->n_experts, x->ids, x->weights);
        op->moe(be, &M->experts, xn, n, c->hidden, x->ids, x->weights, c->top_k, out);
        return;
    }
    /* routing, the routed experts + sigmoid(shared gate) * shared expert */
    sl_moe_shared(be, &M->experts, x->router, c->n_experts, c->top_k, c->norm_topk_prob, x->ids, x->weights, xn, n,
                  c->hidden, &M->sh_down, x->g, x->u, x->sh_gate, x->tmp, out);
}

/* The router, the shared expert, then every routed expert as the checkpoint stores it (the table may
 * point into the expert store's slots instead). */
static int moe_tensors(sl_model *m, int l, sl_tensor_fn fn, void *ctx) {
    sl_moe *M = m->layers[l].moe;
    sl_weight *ws[] = {&M->router, &M->sh_gate, &M->sh_up, &M->sh_down, &M->sh_router};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        int rc = ws[i]->data ? fn(ctx, l, &(sl_tensor){.w = ws[i]}) : 0;
        if (rc) return rc;
    }
    int rc = M->router_bias ? fn(ctx, l, &(sl_tensor){.v = &M->router_bias, .len = (size_t)m->cfg.n_experts}) : 0;
    for (int x = 0; !rc && x < M->experts.n_experts; x++) {
        sl_expert *ex = &M->expert_store[x];
        sl_weight *xw[] = {&ex->gate, &ex->up, &ex->down};
        for (size_t i = 0; !rc && i < sizeof xw / sizeof xw[0]; i++)
            rc = xw[i]->data ? fn(ctx, l, &(sl_tensor){.w = xw[i], .expert = 1}) : 0;
    }
    return rc;
}

static int moe_scratch(const sl_model *m, int max_batch, sl_scratch *s, sl_alloc_fn alloc, void *ctx) {
    const sl_config *c = &m->cfg;
    size_t B = (size_t)max_batch, E = (size_t)(c->n_experts > 1 ? c->n_experts : 1);
    size_t K = (size_t)(c->top_k > 1 ? c->top_k : 1),
           SI = (size_t)(c->shared_intermediate > 1 ? c->shared_intermediate : 1);
    sl_moe_scratch *x = &s->moe;
    return !(x->router = alloc(ctx, B * E * 4)) || !(x->weights = alloc(ctx, B * K * 4)) ||
                   !(x->ids = alloc(ctx, B * K * 4)) || !(x->sh_gate = alloc(ctx, B * 4)) ||
                   !(x->g = alloc(ctx, B * SI * 4)) || !(x->u = alloc(ctx, B * SI * 4)) ||
                   !(x->tmp = alloc(ctx, B * (size_t)c->hidden * 4))
               ? -1
               : 0;
}

const sl_kind sl_kind_moe = {"mixture of experts", moe_tensors, NULL, moe_scratch, moe_forward};
