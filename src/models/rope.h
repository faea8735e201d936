/* Rotary-embedding frequency tables, computed in float32 the way transformers computes them, including
 * the llama3, linear and yarn scaling schemes. */
#ifndef SLUICE_MODELS_ROPE_H
#define SLUICE_MODELS_ROPE_H

#include "formats/config.h"

/* inv_freq[rot_dim / 2]; *attn_factor scales cos/sin (1 except yarn). */
void sl_rope_inv_freq(const sl_rope_cfg *r, int rot_dim, float *inv_freq, float *attn_factor);

#endif
