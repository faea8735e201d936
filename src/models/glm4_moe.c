/* GLM-4.5 / 4.6 (glm4_moe): grouped-query attention with q/k/v biases, optional per-head q/k norms and
 * partial rotary embedding (the first half of each head, rotate-half pairing); the first
 * first_k_dense_replace layers keep a dense MLP, the rest route experts as DeepSeek-V3 does (sigmoid
 * scores, correction bias, routed_scaling_factor) beside an ungated shared expert. */
#include "models/blocks.h"
#include "models/registry.h"

static int glm4_moe_load(sl_model *m, sl_loader *ld, sl_err *e) {
    const sl_config *c = &m->cfg;
    if (c->n_experts <= 0)
        return sl_fail(e, "%s%s: n_routed_experts missing for %s", m->path, m->cfg_suffix, c->model_type);
    if (blk_load_outer(m, ld, 0.0f, e)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        int dense = l < c->first_dense;
        if (blk_load_norms(m, ld, l, 0.0f, e) || blk_load_attention(m, ld, l, 0, 0.0f, e) ||
            (dense ? blk_load_mlp(m, ld, l, e)
                   : blk_load_moe(m, ld, l, c->n_shared ? BLK_SHARED_PLAIN : BLK_SHARED_NONE, e)))
            return -1;
        /* the config's switches must match the tensors, which the shared loaders take as they find them */
        const sl_attn *A = m->layers[l].attn;
        if (c->use_qk_norm && !A->q_norm)
            return sl_fail(e, "%s: use_qk_norm is set but layer %d has no self_attn.q_norm.weight", m->path, l);
        if (c->attention_bias && (!A->wq.bias || !A->wk.bias || !A->wv.bias))
            return sl_fail(e, "%s: attention_bias is set but layer %d's q/k/v projections have no biases", m->path, l);
    }
    return 0;
}

const sl_family sl_family_glm4_moe = {"glm4_moe", glm4_moe_load, blk_decoder_layers};
