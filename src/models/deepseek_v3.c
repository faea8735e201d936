/* DeepSeek-V3 (and Kimi-K2, which shares its model_type): multi-head latent attention in every layer;
 * the first first_k_dense_replace layers keep a dense MLP, the rest route sigmoid-scored experts
 * (correction bias, group-limited choice, routed_scaling_factor) beside an ungated shared expert. */
#include "models/blocks.h"
#include "models/registry.h"

static int deepseek_v3_load(sl_model *m, sl_loader *ld, sl_err *e) {
    const sl_config *c = &m->cfg;
    if (c->kv_lora_rank <= 0)
        return sl_fail(e, "%s%s: kv_lora_rank missing for %s", m->path, m->cfg_suffix, c->model_type);
    if (c->n_experts <= 0)
        return sl_fail(e, "%s%s: n_routed_experts missing for %s", m->path, m->cfg_suffix, c->model_type);
    if (blk_load_outer(m, ld, 0.0f, e)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        int dense = l < c->first_dense;
        if (blk_load_norms(m, ld, l, 0.0f, e) || blk_load_mla(m, ld, l, e) ||
            (dense ? blk_load_mlp(m, ld, l, e)
                   : blk_load_moe(m, ld, l, c->n_shared ? BLK_SHARED_PLAIN : BLK_SHARED_NONE, e)))
            return -1;
    }
    return 0;
}

const sl_family sl_family_deepseek_v3 = {"deepseek_v3", deepseek_v3_load, blk_decoder_layers};
