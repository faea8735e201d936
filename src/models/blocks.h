/* Building blocks shared by the architecture families: the embedding / final norm / output head, the
 * layer norms, the loaders of each layer kind (models/kinds.h, implemented under models/kinds/) and the
 * layer loop that runs them. Each family file loads its layers from these. */
#ifndef SLUICE_MODELS_BLOCKS_H
#define SLUICE_MODELS_BLOCKS_H

#include <stdio.h>

#include "models/loader.h"
#include "runtime/session.h"

/* Formats a tensor name into a char array and yields it: NAME(nb, "model.layers.%d.%s", l, part). */
#define NAME(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)

/* Embedding, final norm (+norm_add) and output head (tied to the embedding when the config says so). */
int blk_load_outer(sl_model *m, sl_loader *ld, float norm_add, sl_err *e);
/* Input and post-attention norms of layer l (+norm_add). */
int blk_load_norms(sl_model *m, sl_loader *ld, int l, float norm_add, sl_err *e);

/* --- mixers ----------------------------------------------------------------------------------------- */

/* Attention: q/k/v/o projections of layer l's self_attn, q/k norms when present (+norm_add), q gating,
 * sinks, the layer's window. */
int blk_load_attention(sl_model *m, sl_loader *ld, int l, int q_gated, float norm_add, sl_err *e);
/* Latent attention: q_a/q_b (or q_proj), kv_a_proj_with_mqa, kv_b_proj, o_proj and the two low-rank
 * norms of layer l. */
int blk_load_mla(sl_model *m, sl_loader *ld, int l, sl_err *e);
/* The attention kind's forward for a latent layer. */
void blk_mla_forward(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out);
/* Gated delta-net: linear_attn's projections (separate, or fused per key head as Qwen3-Next stores
 * them), conv kernel, A_log, dt_bias and output norm of layer l. */
int blk_load_deltanet(sl_model *m, sl_loader *ld, int l, sl_err *e);

/* --- feed-forwards ---------------------------------------------------------------------------------- */

int blk_load_mlp(sl_model *m, sl_loader *ld, int l, sl_err *e);

/* The shared expert of a MoE layer: none, Qwen's shared_expert with its sigmoid gate, or DeepSeek's
 * shared_experts (n_shared_experts wide) joined ungated. */
enum { BLK_SHARED_NONE = 0, BLK_SHARED_GATED = 1, BLK_SHARED_PLAIN = 2 };

/* Router (with e_score_correction_bias when the checkpoint has one), experts in any stored layout
 * (per-expert, fused gate_up, stacked switch_mlp) and the shared expert of kind with_shared. */
int blk_load_moe(sl_model *m, sl_loader *ld, int l, int with_shared, sl_err *e);
/* An empty MoE part of n_experts for layer l, attached to it, for families that load experts their own
 * way; NULL on failure. */
sl_moe *blk_moe_part(sl_model *m, sl_loader *ld, int l, int n_experts, sl_err *e);

/* The layer loop: per layer, pre-norm mixer, then pre-norm feed-forward, each through its kind. */
int blk_decoder_layers(sl_model *m, sl_session *s, float *x, int n, sl_err *e);

#endif
