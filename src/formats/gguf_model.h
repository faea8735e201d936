/* A GGUF file as a model checkpoint: its metadata read into the same sl_config a config.json gives, and
 * its tensors presented under the Hugging Face names the architecture files load (token_embd.weight ->
 * model.embed_tokens.weight, blk.N.ffn_gate_exps.weight -> model.layers.N.mlp.switch_mlp.gate_proj.weight,
 * ...), with shapes in row-major order. What the converter stores differently is undone here: llama's
 * Q/K rows permuted for interleaved RoPE (reordered back into an owned copy), ssm_a = -exp(A_log)
 * (converted back), squeezed conv and gate shapes. Quantised data is never dequantised. */
#ifndef SLUICE_FORMATS_GGUF_MODEL_H
#define SLUICE_FORMATS_GGUF_MODEL_H

#include "formats/config.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

/* The hyperparameters of general.architecture (llama, qwen2, qwen3, qwen3moe, qwen35moe, qwen3next;
 * llama with experts is Mixtral). */
int sl_gguf_config(const sl_gguf *g, sl_config *c, sl_err *e);
/* The tensor table. Takes over g's file mappings: only sl_gguf_close may be called on g afterwards. */
int sl_gguf_tensor_set(sl_gguf *g, const sl_config *c, sl_st_set **out, sl_err *e);

#endif
