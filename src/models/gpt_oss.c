/* gpt-oss: attention with q/k/v/o biases and a learned sink logit per head, sliding-window and full layers
 * alternating (layer_types), YaRN rotary embeddings; every feed-forward is a mixture of experts whose
 * router has a bias and takes the softmax over its top-k logits, and whose experts (with biases) keep
 * gate and up interleaved in one projection under a clamped SwiGLU. Experts come in MXFP4 as OpenAI ships
 * them or as float stacks stored inputs-first (transposed weights); both are used where they lie, so they
 * stream from the file like any other experts. GGUF files (general.architecture gpt-oss) hold gate and up
 * apart, in GGML types (MXFP4 as llama.cpp writes them). */
#include "models/blocks.h"
#include "models/registry.h"

#define GPT_OSS_ALPHA 1.702f /* the sigmoid's slope in the experts' SwiGLU (fixed in the reference) */
#define GPT_OSS_LIMIT 7.0f   /* swiglu_limit when the config has none */

/* Expert x of layer l as llama.cpp's GGUF writes it: gate, up and down stacks [E, out, in] (separate gate
 * and up rows), each with its stacked biases [E, out]. */
static int load_gguf_expert(sl_loader *ld, int l, int E, int x, int I, int H, sl_expert *ex, sl_err *e) {
    static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
    sl_weight *w[3] = {&ex->gate, &ex->up, &ex->down};
    char mod[160], nb[192];
    for (int i = 0; i < 3; i++) {
        int rows = i < 2 ? I : H, cols = i < 2 ? H : I;
        snprintf(mod, sizeof mod, "model.layers.%d.mlp.switch_mlp.%s", l, part[i]);
        if (sl_ld_stacked(ld, mod, 1, E, x, 0, rows, rows, cols, w[i], e) ||
            sl_ld_stacked_bias(ld, NAME(nb, "%s.bias", mod), E, x, rows, w[i], e))
            return -1;
    }
    return 0;
}

static int load_experts(sl_model *m, sl_loader *ld, int l, int I, sl_err *e) {
    const sl_config *c = &m->cfg;
    char nb[256], gu[160], dn[160];
    int E = c->n_experts, H = c->hidden;
    int gguf = sl_ld_has(ld, NAME(nb, "model.layers.%d.mlp.switch_mlp.gate_proj.weight", l));
    sl_moe *M = blk_moe_part(m, ld, l, E, e);
    if (!M) return -1;
    if (sl_ld_linear(ld, NAME(nb, "model.layers.%d.mlp.%s", l, gguf ? "gate" : "router"), E, H, &M->router, e))
        return -1;
    if (!M->router.bias) return sl_fail(e, "%s: missing tensor '%s.bias' (the router's bias)", m->path, nb);
    M->experts.swiglu_alpha = GPT_OSS_ALPHA;
    M->experts.swiglu_limit = c->swiglu_limit > 0 ? (float)c->swiglu_limit : GPT_OSS_LIMIT;
    snprintf(gu, sizeof gu, "model.layers.%d.mlp.experts.gate_up_proj", l);
    snprintf(dn, sizeof dn, "model.layers.%d.mlp.experts.down_proj", l);
    for (int x = 0; x < E; x++) {
        sl_expert *ex = &M->expert_store[x];
        if (gguf) {
            if (load_gguf_expert(ld, l, E, x, I, H, ex, e)) return -1;
        } else if (sl_ld_expert_t(ld, gu, E, x, 2 * I, H, &ex->gate, e) || /* gate and up interleaved */
                   sl_ld_expert_t(ld, dn, E, x, H, I, &ex->down, e)) {
            return -1;
        }
        M->experts.experts[x] = ex;
    }
    return 0;
}

static int gpt_oss_load(sl_model *m, sl_loader *ld, sl_err *e) {
    sl_config *c = &m->cfg;
    if (c->n_experts <= 0 || c->top_k <= 0)
        return sl_fail(e, "%s%s: num_local_experts and num_experts_per_tok are needed for gpt_oss", m->path,
                       m->cfg_suffix);
    if (c->moe_intermediate <= 0) c->moe_intermediate = c->intermediate;
    if (c->moe_intermediate <= 0) return sl_fail(e, "%s%s: intermediate_size missing", m->path, m->cfg_suffix);
    /* the softmax over the top-k logits is the full softmax renormalised over the chosen experts */
    c->norm_topk_prob = 1;
    if (blk_load_outer(m, ld, 0.0f, e)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (blk_load_norms(m, ld, l, 0.0f, e) || blk_load_attention(m, ld, l, 0, 0.0f, e) ||
            load_experts(m, ld, l, c->moe_intermediate, e))
            return -1;
        if (!m->layers[l].attn->sinks)
            return sl_fail(e, "%s: missing tensor 'model.layers.%d.self_attn.sinks' (expected %d attention sinks)",
                           m->path, l, c->n_heads);
    }
    return 0;
}

const sl_family sl_family_gpt_oss = {"gpt_oss", gpt_oss_load, blk_decoder_layers};
