/* Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): low-rank queries, one compressed latent and a
 * shared rotary key part per token in the cache, kv_b_proj absorbed into the attention op. */
#ifndef SLUICE_MODELS_MLA_H
#define SLUICE_MODELS_MLA_H

#include "models/blocks.h"

/* q_a/q_b (or q_proj), kv_a_proj_with_mqa, kv_b_proj, o_proj and the two low-rank norms of layer l. */
int mla_load(sl_model *m, sl_loader *ld, int l, sl_err *e);
/* out[n][hidden] = latent attention of xn for the tokens of the session's batch; fills the layer's cache. */
void mla_attention(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out);

#endif
