/* Qwen3-MoE: the Qwen3 block (per-head q/k RMSNorm) with a softmax top-k mixture of experts in place of
 * the MLP on sparse layers (decoder_sparse_step, mlp_only_layers). Mixtral is the same with the Llama block
 * (no q/k norms) and every layer sparse; its expert keys are normalised by the loader. */
#include "models/blocks.h"
#include "models/registry.h"

static int qwen3_moe_load(sl_model *m, sl_loader *ld, sl_err *e) {
    const sl_config *c = &m->cfg;
    if (c->n_experts <= 0) return sl_fail(e, "%s%s: num_experts missing for %s", m->path, m->cfg_suffix, c->model_type);
    if (blk_load_outer(m, ld, 0.0f, e)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        int sparse = !c->mlp_only[l] && c->decoder_sparse_step > 0 && (l + 1) % c->decoder_sparse_step == 0;
        if (blk_load_norms(m, ld, l, 0.0f, e) || blk_load_attention(m, ld, l, 0, 0.0f, e) ||
            (sparse ? blk_load_moe(m, ld, l, 0, e) : blk_load_mlp(m, ld, l, e)))
            return -1;
    }
    return 0;
}

const sl_family sl_family_qwen3_moe = {"qwen3_moe", qwen3_moe_load, blk_decoder_layers};
