/* Maps config.json's model_type to the architecture family that loads and runs it. */
#ifndef SLUICE_MODELS_REGISTRY_H
#define SLUICE_MODELS_REGISTRY_H

#include "models/model.h"

extern const sl_family sl_family_llama;       /* llama, mistral, qwen2, qwen3 */
extern const sl_family sl_family_qwen3_moe;   /* qwen3_moe, mixtral */
extern const sl_family sl_family_qwen3_5;     /* qwen3_5_moe, qwen3_5_moe_text, qwen3_next */
extern const sl_family sl_family_deepseek_v3; /* deepseek_v3, kimi_k2 */
extern const sl_family sl_family_glm4_moe;    /* glm4_moe */
extern const sl_family sl_family_gpt_oss;     /* gpt_oss */

/* NULL when the type is unknown. */
const sl_family *sl_family_for(const char *model_type);
/* Comma-separated list of supported model types, for error messages. */
const char *sl_supported_types(void);

#endif
