/* config.json of a Hugging Face (or MLX) checkpoint, reduced to the hyperparameters the engine uses.
 * Vision-language checkpoints nest the text model under "text_config"; that object is read instead. */
#ifndef SLUICE_FORMATS_CONFIG_H
#define SLUICE_FORMATS_CONFIG_H

#include <jansson.h>

#include "core/err.h"

typedef enum { SL_ROPE_DEFAULT, SL_ROPE_LINEAR, SL_ROPE_LLAMA3, SL_ROPE_YARN } sl_rope_type;

typedef struct sl_rope_cfg {
    sl_rope_type type;
    double theta;
    double partial_factor;                                                 /* fraction of head_dim rotated */
    double factor;                                                         /* scaling factor (linear, llama3, yarn) */
    double low_freq_factor, high_freq_factor;                              /* llama3 */
    int original_max_pos;                                                  /* llama3, yarn */
    double beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim; /* yarn */
    int truncate;                                                          /* yarn */
} sl_rope_cfg;

typedef enum { SL_LAYER_ATTENTION, SL_LAYER_LINEAR } sl_layer_kind;

typedef struct sl_config {
    char model_type[64];
    char gguf_arch[32]; /* general.architecture of a GGUF file; empty for config.json */
    int vocab_size, hidden, n_layers, n_heads, n_kv_heads, head_dim, intermediate, max_pos;
    double rms_eps;
    int tie_embeddings;
    int sliding_window; /* 0: full attention */
    int *layer_window;  /* per layer: its window, sliding_window or 0 where layer_types says full_attention */
    sl_rope_cfg rope;
    /* mixture of experts */
    int n_experts, top_k, moe_intermediate, shared_intermediate, norm_topk_prob, decoder_sparse_step;
    int *mlp_only;       /* per layer: 1 when the layer keeps a dense MLP */
    double swiglu_limit; /* gpt-oss experts' clamp (0: none) */
    /* sigmoid routing (DeepSeek-V3, GLM-4.5): scores are sigmoids, a correction bias steers the choice,
     * experts are picked within the topk_group best of n_group groups, weights scaled by routed_scale */
    int route_sigmoid, n_group, topk_group;
    double routed_scale;
    int first_dense;    /* first_k_dense_replace: leading layers with a dense MLP */
    int n_nextn;        /* num_nextn_predict_layers: multi-token-prediction layers stored after the decoder's */
    int n_shared;       /* n_shared_experts: an ungated shared expert of n_shared * moe_intermediate */
    int use_qk_norm;    /* per-head q/k RMSNorm (GLM-4.5 use_qk_norm) */
    int attention_bias; /* q/k/v projections carry biases */
    /* multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0: not MLA */
    int q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    int rope_interleave; /* rotary pairs are adjacent dims (2i, 2i+1), not i and i + rot/2 */
    /* FP8 checkpoints (quant_method fp8): tile shape of weight_scale_inv; 0 when not FP8 */
    int fp8_block_rows, fp8_block_cols;
    /* hybrid linear attention (gated delta-net) */
    sl_layer_kind *layer_kind;
    int conv_kernel, lin_k_head_dim, lin_v_head_dim, lin_n_k_heads, lin_n_v_heads;
    int lin_v_tiled;  /* value head h reads key head h mod key heads (GGUF order), not h / (value/key heads) */
    int norms_folded; /* (1 + w) RMSNorm weights are stored with the 1 added (GGUF); MLX is told by its conv shape */
    /* MLX quantization: the whole "quantization" object (NULL when the checkpoint is not quantized) */
    json_t *quant;
    int quant_bits, quant_group;
} sl_config;

/* Width of a delta-net layer's q|k|v projection and conv: 2 * key heads * key dim + value heads * value dim. */
static inline int sl_config_conv_dim(const sl_config *c) {
    return 2 * c->lin_n_k_heads * c->lin_k_head_dim + c->lin_n_v_heads * c->lin_v_head_dim;
}
/* Floats of one delta-net layer's recurrent state: value heads x key dim x value dim. */
static inline size_t sl_config_ssm_floats(const sl_config *c) {
    return (size_t)c->lin_n_v_heads * (size_t)c->lin_k_head_dim * (size_t)c->lin_v_head_dim;
}

/* Floats of one position's row in an attention layer's cache, and how many caches (keys and values, or
 * latent attention's one) a layer keeps. */
static inline int sl_config_kv_width(const sl_config *c) {
    return c->kv_lora_rank > 0 ? c->kv_lora_rank + c->qk_rope_dim : c->n_kv_heads * c->head_dim;
}
static inline int sl_config_kv_caches(const sl_config *c) {
    return c->kv_lora_rank > 0 ? 1 : 2;
}
/* Width of an attention layer's queries [n_heads x head width]. */
static inline int sl_config_q_width(const sl_config *c) {
    return c->kv_lora_rank > 0 ? c->n_heads * (c->qk_nope_dim + c->qk_rope_dim) : c->n_heads * c->head_dim;
}

/* Parses dir/config.json. */
int sl_config_load(const char *dir, sl_config *c, sl_err *e);
/* Parses an already-loaded config object; `where` names it in errors. */
int sl_config_parse(json_t *root, const char *where, sl_config *c, sl_err *e);
void sl_config_free(sl_config *c);

/* MLX bits and group size for the module `raw_module` (tensor name without ".weight"): the per-module
 * override when present, else the default. Returns -1 when the checkpoint has no quantization. */
int sl_config_quant_for(const sl_config *c, const char *raw_module, int *bits, int *group);

#endif
