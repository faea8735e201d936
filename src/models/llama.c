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

const sl_family sl_family_llama = {"llama", llama_load, blk_decoder_layers};
