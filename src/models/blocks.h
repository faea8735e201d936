/* Building blocks shared by the architecture families: loading and running attention, dense MLPs and
 * mixture-of-experts layers, and the embedding / final norm / output head. Each family file composes
 * these into its own layer loop. */
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

/* q/k/v/o projections of layer l's self_attn, q/k norms when present (+norm_add), q gating. */
int blk_load_attention(sl_model *m, sl_loader *ld, int l, int q_gated, float norm_add, sl_err *e);
/* out[n][hidden] = attention(xn) for the tokens at the session's position; fills the layer's KV cache. */
void blk_attention(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out);

int blk_load_mlp(sl_model *m, sl_loader *ld, int l, sl_err *e);
void blk_mlp(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out);

/* The shared expert of a MoE layer: none, Qwen's shared_expert with its sigmoid gate, or DeepSeek's
 * shared_experts (n_shared_experts wide) joined ungated. */
enum { BLK_SHARED_NONE = 0, BLK_SHARED_GATED = 1, BLK_SHARED_PLAIN = 2 };

/* Router (with e_score_correction_bias when the checkpoint has one), experts in any stored layout
 * (per-expert, fused gate_up, stacked switch_mlp) and the shared expert of kind with_shared. */
int blk_load_moe(sl_model *m, sl_loader *ld, int l, int with_shared, sl_err *e);
void blk_moe(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out);

/* x += f(norm(x)) for the feed-forward half of a layer (dense or MoE). */
void blk_ffn_residual(sl_model *m, sl_session *s, int l, float *x, int n);

/* Layer loops keep each residual add fused with the norm that follows it:
 *   blk_layer_input: x += the previous layer's feed-forward output (none for layer 0); xn = attn_norm(x)
 *   blk_ffn:         x += attn_out; xn = ffn_norm(x); the session's moe_out = f(xn)
 *   blk_layers_end:  x += the last layer's feed-forward output */
void blk_layer_input(sl_model *m, sl_session *s, int l, float *x, int n);
void blk_ffn(sl_model *m, sl_session *s, int l, float *x, const float *attn_out, int n);
void blk_layers_end(sl_model *m, sl_session *s, float *x, int n);

/* The layer loop of attention-only decoders: pre-norm attention, then the feed-forward half. */
int blk_decoder_layers(sl_model *m, sl_session *s, float *x, int n, sl_err *e);

#endif
