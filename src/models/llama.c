/* The Llama family: llama, mistral (optional sliding window), qwen2 (q/k/v biases, usually tied
 * embeddings) and qwen3 (per-head q/k RMSNorm). Differences are detected from the config and from which
 * tensors the checkpoint holds. */
#include "models/blocks.h"
#include "models/registry.h"

static int llama_load(sl_model *m, sl_loader *ld, sl_err *e) {
    if (blk_load_outer(m, ld, 0.0f, e)) return -1;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (blk_load_norms(m, ld, l, 0.0f, e) || blk_load_attention(m, ld, l, 0, 0.0f, e) || blk_load_mlp(m, ld, l, e))
            return -1;
    }
    return 0;
}

/* Shared with the MoE variant: pre-norm attention, then the feed-forward half (dense or MoE). */
static int llama_layers(sl_model *m, sl_session *s, float *x, int n, sl_err *e) {
    (void)e;
    const sl_config *c = &m->cfg;
    const sl_backend_ops *op = m->be->ops;
    for (int l = 0; l < c->n_layers; l++) {
        op->rmsnorm(m->be, x, m->layers[l].attn_norm, n, c->hidden, (float)c->rms_eps, s->s.xn);
        blk_attention(m, s, l, s->s.xn, n, s->s.ff_o);
        op->add(m->be, x, s->s.ff_o, (size_t)n * (size_t)c->hidden);
        blk_ffn_residual(m, s, l, x, n);
    }
    return 0;
}

const sl_family sl_family_llama = {"llama", llama_load, llama_layers};

/* Qwen3-MoE: the Qwen3 block with a softmax top-k MoE in place of the MLP on sparse layers. */
static int qwen3_moe_load(sl_model *m, sl_loader *ld, sl_err *e) {
    const sl_config *c = &m->cfg;
    if (c->n_experts <= 0) return sl_fail(e, "%s/config.json: num_experts missing for %s", m->path, c->model_type);
    if (blk_load_outer(m, ld, 0.0f, e)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        int sparse = !c->mlp_only[l] && c->decoder_sparse_step > 0 && (l + 1) % c->decoder_sparse_step == 0;
        if (blk_load_norms(m, ld, l, 0.0f, e) || blk_load_attention(m, ld, l, 0, 0.0f, e) ||
            (sparse ? blk_load_moe(m, ld, l, 0, e) : blk_load_mlp(m, ld, l, e)))
            return -1;
    }
    return 0;
}

const sl_family sl_family_qwen3_moe = {"qwen3_moe", qwen3_moe_load, llama_layers};
