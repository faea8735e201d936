/* Synthetic checkpoints with the shapes of real models, for benchmarks: config.json and safetensors
 * written in the layout the real checkpoints use (Hugging Face bf16, MLX affine 4/8-bit, DeepSeek's block
 * FP8 or OpenAI's MXFP4 experts), or a GGUF
 * file (q4k: GGML Q4_K, the output head Q6_K), loaded through the ordinary loader. The values are meaningless but
 * finite, scaled like trained weights so activations stay in range, and the routers differ per expert so routing
 * spreads over the experts. Bytes come from a fixed pseudo-random block reused with a different offset per tensor, so a
 * 20 GB checkpoint is written at disk speed. */
#ifndef SLUICE_MODELS_SYNTHETIC_H
#define SLUICE_MODELS_SYNTHETIC_H

#include <stdint.h>

#include "core/err.h"

typedef struct sl_synth_shape {
    const char *name, *arch; /* arch: "llama", "qwen3_5_moe", "deepseek_v3" or "gpt_oss" */
    const char *about;
    const char *quants; /* the --quant values it takes, space-separated; the first (as it ships) is the default */
    int vocab, hidden, layers, heads, kv_heads, head_dim, intermediate;
    int experts, top_k, moe_inter, shared_inter;
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv_kernel, full_attn_every;
    /* DeepSeek-V3: latent attention, dense leading layers, group-limited sigmoid routing */
    int q_lora, kv_lora, qk_nope, qk_rope, v_head, first_dense, n_group, topk_group;
    double routed_scale;
    /* gpt-oss: sliding window on even layers, clamped SwiGLU */
    int sliding_window;
    double swiglu_limit;
    /* YaRN when yarn_factor > 0 */
    double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    int yarn_orig_max_pos;
    double rope_theta;
    int max_pos;
} sl_synth_shape;

typedef enum { SL_SYNTH_BF16, SL_SYNTH_MLX4, SL_SYNTH_MLX8, SL_SYNTH_Q4K, SL_SYNTH_FP8, SL_SYNTH_MXFP4 } sl_synth_quant;

const sl_synth_shape *sl_synth_find(const char *name);
/* The table of shapes, NULL-name terminated. */
const sl_synth_shape *sl_synth_shapes(void);
int sl_synth_parse_quant(const char *s, sl_synth_quant *q);
const char *sl_synth_quant_name(sl_synth_quant q);
/* Whether shape s can be written in quant q (one of s->quants), and the quant it ships in. */
int sl_synth_takes(const sl_synth_shape *s, sl_synth_quant q);
sl_synth_quant sl_synth_default_quant(const sl_synth_shape *s);

/* Bytes the checkpoint takes on disk with `layers` layers (<= 0: the shape's own count). */
uint64_t sl_synth_bytes(const sl_synth_shape *s, sl_synth_quant q, int layers);

/* The default folder for a synthetic checkpoint: $SLUICE_CACHE, else $XDG_CACHE_HOME/sluice, else
 * ~/.cache/sluice, then synthetic/SHAPE-QUANT[-NL]. Heap string. */
char *sl_synth_default_dir(const sl_synth_shape *s, sl_synth_quant q, int layers);

/* What to load for the checkpoint in dir: dir itself, or dir/model.gguf for GGUF quants. Heap string. */
char *sl_synth_model_path(const char *dir, sl_synth_quant q);

/* Writes the checkpoint into dir unless a complete one of the same shape is already there. *generated
 * says which; progress goes to stderr unless quiet. */
int sl_synth_ensure(const sl_synth_shape *s, sl_synth_quant q, int layers, const char *dir, int quiet, int *generated,
                    sl_err *e);

#endif
