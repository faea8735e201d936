#include "models/registry.h"

#include <string.h>

static const struct {
    const char *type;
    const sl_family *fam;
} table[] = {
    {"llama", &sl_family_llama},
    {"mistral", &sl_family_llama},
    {"mixtral", &sl_family_qwen3_moe}, /* Qwen3-MoE's layers without the q/k norms */
    {"qwen2", &sl_family_llama},
    {"qwen3", &sl_family_llama},
    {"qwen3_moe", &sl_family_qwen3_moe},
    {"qwen3_5_moe", &sl_family_qwen3_5},
    {"qwen3_5_moe_text", &sl_family_qwen3_5},
    {"qwen3_next", &sl_family_qwen3_5}, /* delta-net input projections fused per key head */
    {"deepseek_v3", &sl_family_deepseek_v3},
    {"kimi_k2", &sl_family_deepseek_v3},
    {"glm4_moe", &sl_family_glm4_moe},
    {"gpt_oss", &sl_family_gpt_oss},
};

const sl_family *sl_family_for(const char *model_type) {
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(table[i].type, model_type)) return table[i].fam;
    return NULL;
}

const char *sl_supported_types(void) {
    return "llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, qwen3_5_moe, qwen3_5_moe_text, qwen3_next, deepseek_v3, "
           "kimi_k2, glm4_moe, gpt_oss";
}
