/* Qwen3.5-MoE (and its text-only variant) and Qwen3-Next: a hybrid of gated delta-net layers and gated
 * full-attention layers, each followed by a MoE with a sigmoid-gated shared expert. RMSNorms use the
 * (1 + w) convention, except the delta-net's gated output norm, which is plain w. Qwen3-Next differs only in
 * how the delta-net's input projections are stored (see models/kinds/deltanet.c).
 *
 * MLX conversions store those (1 + w) weights with the 1 already added and conv1d as [C, K, 1] instead
 * of [C, 1, K]; the conv shape tells the two apart (the memory order of the kernel is the same). GGUF
 * files fold the 1 in too (the config says so). */

#include "models/blocks.h"
#include "models/registry.h"

/* 1 when the checkpoint is an MLX conversion with (1 + w) folded into the norm weights. */
static int norms_folded(sl_model *m, sl_loader *ld, sl_err *e) {
    char nb[256];
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (m->cfg.layer_kind[l] != SL_LAYER_LINEAR) continue;
        const sl_st_tensor *t = sl_ld_find(ld, NAME(nb, "model.layers.%d.linear_attn.conv1d.weight", l));
        if (!t) return sl_fail(e, "%s: missing tensor '%s'", m->path, nb);
        if (t->ndim == 3 && t->shape[1] == 1) return 0;                    /* HF: [C, 1, K] */
        if (t->ndim == 3 && t->shape[2] == 1 && t->shape[1] > 1) return 1; /* MLX: [C, K, 1] */
        return sl_fail(e, "%s: tensor '%s' should be [C, 1, K] or [C, K, 1]", m->path, t->name);
    }
    return 0;
}

static int q35_load(sl_model *m, sl_loader *ld, sl_err *e) {
    const sl_config *c = &m->cfg;
    if (c->n_experts <= 0 || c->lin_n_k_heads <= 0 || c->lin_n_v_heads % c->lin_n_k_heads || c->conv_kernel < 1 ||
        c->lin_k_head_dim <= 0 || c->lin_v_head_dim <= 0)
        return sl_fail(e,
                       "%s%s: incomplete %s config (num_experts, linear_num_key_heads, "
                       "linear_num_value_heads multiple of key heads, linear_*_head_dim, linear_conv_kernel_dim)",
                       m->path, m->cfg_suffix, c->model_type);
    int folded = c->norms_folded ? 1 : norms_folded(m, ld, e);
    if (folded < 0) return -1;
    float add = folded ? 0.0f : 1.0f;
    if (blk_load_outer(m, ld, add, e)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (blk_load_norms(m, ld, l, add, e)) return -1;
        int rc = c->layer_kind[l] == SL_LAYER_LINEAR ? blk_load_deltanet(m, ld, l, e)
                                                     : blk_load_attention(m, ld, l, 1, add, e);
        /* Qwen3-Next may keep dense MLPs on some layers (decoder_sparse_step, mlp_only_layers) */
        int sparse = !c->mlp_only[l] && c->decoder_sparse_step > 0 && (l + 1) % c->decoder_sparse_step == 0;
        if (rc || (sparse ? blk_load_moe(m, ld, l, 1, e) : blk_load_mlp(m, ld, l, e))) return -1;
    }
    return 0;
}

const sl_family sl_family_qwen3_5 = {"qwen3_5_moe", q35_load, blk_decoder_layers};
