#include "formats/gguf_model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ggml_types.h"

static const struct {
    const char *arch, *model_type;
} archs[] = {
    {"llama", "llama"},           {"qwen2", "qwen2"},           {"qwen3", "qwen3"},
    {"qwen3moe", "qwen3_moe"},    {"qwen35moe", "qwen3_5_moe"}, {"qwen3next", "qwen3_next"},
    {"deepseek2", "deepseek_v3"}, {"glm4moe", "glm4_moe"},      {"gpt-oss", "gpt_oss"},
};

/* ---- metadata -> config ---- */

typedef struct meta {
    const sl_gguf *g;
    char arch[64];
    json_t *cfg;
    sl_err *e;
} meta;

static const char *akey(const meta *m, const char *suffix, char *buf, size_t n) {
    snprintf(buf, n, "%s.%s", m->arch, suffix);
    return buf;
}

/* Copies <arch>.suffix to the config field when present; required keys fail when absent. Returns -1 on error. */
static int put_int(meta *m, const char *suffix, const char *field, int required) {
    char k[160];
    int64_t v;
    int r = sl_gguf_get_int(m->g, akey(m, suffix, k, sizeof k), &v, m->e);
    if (r < 0) return -1;
    if (r == 1)
        return required
                   ? sl_fail(m->e, "%s: missing metadata key '%s' (needed for a %s model)", m->g->paths[0], k, m->arch)
                   : 0;
    if (v <= 0 || v > INT32_MAX)
        return sl_fail(m->e, "%s: metadata key '%s' is %lld (expected a positive integer)", m->g->paths[0], k,
                       (long long)v);
    json_object_set_new(m->cfg, field, json_integer(v));
    return 0;
}

static int get_arch_int(meta *m, const char *suffix, int64_t *v) {
    char k[160];
    return sl_gguf_get_int(m->g, akey(m, suffix, k, sizeof k), v, m->e);
}

static int has_tensor(const sl_gguf *g, const char *fmt, int l) {
    char nb[160];
    snprintf(nb, sizeof nb, fmt, l);
    return sl_gguf_find_tensor(g, nb) != NULL;
}

static int rope_config(meta *m, int64_t head_dim) {
    char k[160];
    double theta = 10000.0;
    if (sl_gguf_get_float(m->g, akey(m, "rope.freq_base", k, sizeof k), &theta, m->e) < 0) return -1;
    json_t *rp = json_object();
    json_object_set_new(m->cfg, "rope_parameters", rp);
    json_object_set_new(rp, "rope_theta", json_real(theta));
    int64_t rd = head_dim;
    if (get_arch_int(m, "rope.dimension_count", &rd) < 0) return -1;
    if (rd <= 0 || rd > head_dim || rd % 2)
        return sl_fail(m->e, "%s: %s.rope.dimension_count is %lld (expected an even number up to the head size %lld)",
                       m->g->paths[0], m->arch, (long long)rd, (long long)head_dim);
    json_object_set_new(rp, "partial_rotary_factor", json_real((double)rd / (double)head_dim));
    sl_gguf_str st = {"none", 4};
    if (sl_gguf_get_str(m->g, akey(m, "rope.scaling.type", k, sizeof k), &st, m->e) < 0) return -1;
    double factor = 1.0;
    int64_t orig = 0;
    if (sl_gguf_get_float(m->g, akey(m, "rope.scaling.factor", k, sizeof k), &factor, m->e) < 0 ||
        get_arch_int(m, "rope.scaling.original_context_length", &orig) < 0)
        return -1;
    if (st.len == 4 && !memcmp(st.s, "none", 4)) {
        json_object_set_new(rp, "rope_type", json_string("default"));
    } else if (st.len == 6 && !memcmp(st.s, "linear", 6)) {
        json_object_set_new(rp, "rope_type", json_string("linear"));
        json_object_set_new(rp, "factor", json_real(factor));
    } else if (st.len == 4 && !memcmp(st.s, "yarn", 4)) {
        json_object_set_new(rp, "rope_type", json_string("yarn"));
        json_object_set_new(rp, "factor", json_real(factor));
        if (orig > 0) json_object_set_new(rp, "original_max_position_embeddings", json_integer(orig));
        double bf = 32, bs = 1;
        if (sl_gguf_get_float(m->g, akey(m, "rope.scaling.yarn_beta_fast", k, sizeof k), &bf, m->e) < 0 ||
            sl_gguf_get_float(m->g, akey(m, "rope.scaling.yarn_beta_slow", k, sizeof k), &bs, m->e) < 0)
            return -1;
        json_object_set_new(rp, "beta_fast", json_real(bf));
        json_object_set_new(rp, "beta_slow", json_real(bs));
        /* gpt-oss ramps its YaRN frequencies without rounding the bounds (llama.cpp leaves that implied) */
        if (!strcmp(m->arch, "gpt-oss")) json_object_set_new(rp, "truncate", json_false());
    } else {
        return sl_fail(m->e, "%s: %s.rope.scaling.type '%.*s' is not supported (expected none, linear or yarn)",
                       m->g->paths[0], m->arch, (int)st.len, st.s);
    }
    return 0;
}

/* The sigmoid router and dense leading layers of deepseek2 and glm4moe. */
static int sigmoid_moe_config(meta *m) {
    char k[160];
    int64_t gating = 0;
    double scale = 1.0;
    if (put_int(m, "expert_shared_count", "n_shared_experts", 0) ||
        put_int(m, "leading_dense_block_count", "first_k_dense_replace", 0) ||
        put_int(m, "expert_group_count", "n_group", 0) || put_int(m, "expert_group_used_count", "topk_group", 0) ||
        get_arch_int(m, "expert_gating_func", &gating) < 0 ||
        sl_gguf_get_float(m->g, akey(m, "expert_weights_scale", k, sizeof k), &scale, m->e) < 0)
        return -1;
    /* llama.cpp's gating functions: 1 softmax, 2 sigmoid (deepseek2 files from before the key are sigmoid) */
    if (gating != 0 && gating != 1 && gating != 2)
        return sl_fail(m->e, "%s: %s.expert_gating_func is %lld (expected 1 softmax or 2 sigmoid)", m->g->paths[0],
                       m->arch, (long long)gating);
    json_object_set_new(m->cfg, "scoring_func", json_string(gating == 1 ? "softmax" : "sigmoid"));
    json_object_set_new(m->cfg, "routed_scaling_factor", json_real(scale));
    /* multi-token-prediction blocks follow the decoder's (glm4moe): not part of it */
    int64_t nextn = 0, layers = json_integer_value(json_object_get(m->cfg, "num_hidden_layers"));
    if (get_arch_int(m, "nextn_predict_layers", &nextn) < 0) return -1;
    if (nextn < 0 || nextn >= layers)
        return sl_fail(m->e, "%s: %s.nextn_predict_layers is %lld of %lld blocks", m->g->paths[0], m->arch,
                       (long long)nextn, (long long)layers);
    json_object_set_new(m->cfg, "num_hidden_layers", json_integer(layers - nextn));
    return 0;
}

/* deepseek2's latent attention: llama.cpp writes it as one KV head of kv_lora_rank + rope (key_length)
 * and kv_lora_rank (value_length), with the per-head sizes in key_length_mla / value_length_mla (files
 * from before those keys give them in key_length / value_length). Rotary pairs are adjacent dims. */
static int deepseek2_config(meta *m, int64_t *rope_dim) {
    char k[160];
    int64_t heads = json_integer_value(json_object_get(m->cfg, "num_attention_heads"));
    int64_t q_lora = 0, kv_lora = 0, kl = 0, vl = 0, klm = 0, vlm = 0, rd = 0;
    if (get_arch_int(m, "attention.q_lora_rank", &q_lora) < 0 ||
        get_arch_int(m, "attention.kv_lora_rank", &kv_lora) < 0 || get_arch_int(m, "attention.key_length", &kl) < 0 ||
        get_arch_int(m, "attention.value_length", &vl) < 0 || get_arch_int(m, "attention.key_length_mla", &klm) < 0 ||
        get_arch_int(m, "attention.value_length_mla", &vlm) < 0 || get_arch_int(m, "rope.dimension_count", &rd) < 0)
        return -1;
    if (!klm) klm = kl, vlm = vl;
    if (kv_lora <= 0 || rd <= 0 || rd % 2 || klm <= rd || vlm <= 0)
        return sl_fail(m->e,
                       "%s: deepseek2 attention keys missing or inconsistent (kv_lora_rank %lld, rope.dimension_count "
                       "%lld, key_length_mla %lld, value_length_mla %lld)",
                       m->g->paths[0], (long long)kv_lora, (long long)rd, (long long)klm, (long long)vlm);
    json_object_set_new(m->cfg, "num_key_value_heads", json_integer(heads));
    if (q_lora > 0) json_object_set_new(m->cfg, "q_lora_rank", json_integer(q_lora));
    json_object_set_new(m->cfg, "kv_lora_rank", json_integer(kv_lora));
    json_object_set_new(m->cfg, "qk_rope_head_dim", json_integer(rd));
    json_object_set_new(m->cfg, "qk_nope_head_dim", json_integer(klm - rd));
    json_object_set_new(m->cfg, "v_head_dim", json_integer(vlm));
    json_object_set_new(m->cfg, "rope_interleave", json_true());
    json_object_set_new(m->cfg, "head_dim", json_integer(rd));
    *rope_dim = rd;
    /* yarn_log_multiplier = 0.1 * mscale_all_dim (DeepSeek's mscale equals it in the checkpoints) */
    double mul = 0;
    if (sl_gguf_get_float(m->g, akey(m, "rope.scaling.yarn_log_multiplier", k, sizeof k), &mul, m->e) < 0) return -1;
    return mul > 0 ? 1 : 0;
}

static int build_config(meta *m) {
    const sl_gguf *g = m->g;
    const char *path = g->paths[0];
    char k[160];
    const char *mt = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(archs[i].arch, m->arch)) mt = archs[i].model_type;
    if (!mt)
        return sl_fail(m->e,
                       "%s: general.architecture '%s' is not supported (expected llama, qwen2, qwen3, qwen3moe, "
                       "qwen35moe, qwen3next, deepseek2, glm4moe or gpt-oss)",
                       path, m->arch);
    /* llama.cpp writes Mixtral as llama with experts */
    int64_t experts = 0;
    if (!strcmp(m->arch, "llama") && get_arch_int(m, "expert_count", &experts) < 0) return -1;
    json_object_set_new(m->cfg, "model_type", json_string(experts > 0 ? "mixtral" : mt));
    if (put_int(m, "block_count", "num_hidden_layers", 1) || put_int(m, "embedding_length", "hidden_size", 1) ||
        put_int(m, "attention.head_count", "num_attention_heads", 1) ||
        put_int(m, "attention.head_count_kv", "num_key_value_heads", 0) ||
        put_int(m, "feed_forward_length", "intermediate_size", 0) ||
        put_int(m, "context_length", "max_position_embeddings", 0) ||
        put_int(m, "attention.sliding_window", "sliding_window", 0) || put_int(m, "expert_count", "num_experts", 0) ||
        put_int(m, "expert_used_count", "num_experts_per_tok", 0) ||
        put_int(m, "expert_feed_forward_length", "moe_intermediate_size", 0) ||
        put_int(m, "expert_shared_feed_forward_length", "shared_expert_intermediate_size", 0))
        return -1;
    int64_t hidden = json_integer_value(json_object_get(m->cfg, "hidden_size"));
    int64_t heads = json_integer_value(json_object_get(m->cfg, "num_attention_heads"));
    int64_t layers = json_integer_value(json_object_get(m->cfg, "num_hidden_layers"));
    int64_t hd = hidden / heads, vd = 0;
    int mla = !strcmp(m->arch, "deepseek2"), yarn_mul = 0;
    if (mla) {
        if ((yarn_mul = deepseek2_config(m, &hd)) < 0) return -1;
    } else {
        if (get_arch_int(m, "attention.key_length", &hd) < 0) return -1;
        vd = hd;
        if (get_arch_int(m, "attention.value_length", &vd) < 0) return -1;
        if (hd <= 0 || vd != hd)
            return sl_fail(m->e, "%s: %s.attention.key_length %lld and value_length %lld must be equal and positive",
                           path, m->arch, (long long)hd, (long long)vd);
        json_object_set_new(m->cfg, "head_dim", json_integer(hd));
    }
    double eps = 1e-6;
    if (sl_gguf_get_float(g, akey(m, "attention.layer_norm_rms_epsilon", k, sizeof k), &eps, m->e) < 0) return -1;
    json_object_set_new(m->cfg, "rms_norm_eps", json_real(eps));
    if (rope_config(m, hd)) return -1;
    if (yarn_mul) {
        double mul = 0;
        json_t *rp = json_object_get(m->cfg, "rope_parameters");
        if (sl_gguf_get_float(g, akey(m, "rope.scaling.yarn_log_multiplier", k, sizeof k), &mul, m->e) < 0) return -1;
        json_object_set_new(rp, "mscale_all_dim", json_real(mul / 0.1));
        json_object_set_new(rp, "mscale", json_real(mul / 0.1));
    }
    if ((mla || !strcmp(m->arch, "glm4moe")) && sigmoid_moe_config(m)) return -1;
    layers = json_integer_value(json_object_get(m->cfg, "num_hidden_layers"));
    int norm = 1;
    if (sl_gguf_get_bool(g, akey(m, "expert_weights_norm", k, sizeof k), &norm, m->e) < 0) return -1;
    json_object_set_new(m->cfg, "norm_topk_prob", json_boolean(norm));

    /* the vocabulary is the embedding's row count */
    const sl_gguf_tensor *emb = sl_gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->ndim != 2)
        return sl_fail(m->e, "%s: missing 2-D tensor 'token_embd.weight' (the token embedding)", path);
    json_object_set_new(m->cfg, "vocab_size", json_integer(emb->ne[1]));
    json_object_set_new(m->cfg, "tie_word_embeddings", json_boolean(!sl_gguf_find_tensor(g, "output.weight")));

    /* per-layer structure follows the tensors present: dense layers of a MoE, delta-net layers of a hybrid */
    json_t *mlp_only = json_array(), *kinds = json_array();
    json_object_set_new(m->cfg, "mlp_only_layers", mlp_only);
    int hybrid = !strcmp(m->arch, "qwen35moe") || !strcmp(m->arch, "qwen3next");
    for (int l = 0; l < layers && l < 4096; l++) {
        if (has_tensor(g, "blk.%d.ffn_gate.weight", l) || has_tensor(g, "blk.%d.ffn_up.weight", l))
            json_array_append_new(mlp_only, json_integer(l));
        json_array_append_new(kinds,
                              json_string(has_tensor(g, "blk.%d.ssm_a", l) ? "linear_attention" : "full_attention"));
    }
    if (!strcmp(m->arch, "gpt-oss")) { /* llama.cpp's pattern: even layers slide, odd ones see everything */
        json_decref(kinds);
        kinds = json_array();
        for (int l = 0; l < layers && l < 4096; l++)
            json_array_append_new(kinds, json_string(l % 2 ? "full_attention" : "sliding_attention"));
        json_object_set_new(m->cfg, "layer_types", kinds);
    } else if (hybrid) {
        json_object_set_new(m->cfg, "layer_types", kinds);
        int64_t conv = 0, state = 0, groups = 0, rank = 0, inner = 0;
        if (get_arch_int(m, "ssm.conv_kernel", &conv) < 0 || get_arch_int(m, "ssm.state_size", &state) < 0 ||
            get_arch_int(m, "ssm.group_count", &groups) < 0 || get_arch_int(m, "ssm.time_step_rank", &rank) < 0 ||
            get_arch_int(m, "ssm.inner_size", &inner) < 0)
            return -1;
        if (conv <= 0 || state <= 0 || groups <= 0 || rank <= 0 || inner <= 0 || inner % rank)
            return sl_fail(m->e,
                           "%s: %s.ssm.* keys missing or inconsistent (conv_kernel %lld, state_size %lld, group_count "
                           "%lld, time_step_rank %lld, inner_size %lld: expected positive, inner_size a multiple of "
                           "time_step_rank)",
                           path, m->arch, (long long)conv, (long long)state, (long long)groups, (long long)rank,
                           (long long)inner);
        json_object_set_new(m->cfg, "linear_conv_kernel_dim", json_integer(conv));
        json_object_set_new(m->cfg, "linear_key_head_dim", json_integer(state));
        json_object_set_new(m->cfg, "linear_num_key_heads", json_integer(groups));
        json_object_set_new(m->cfg, "linear_num_value_heads", json_integer(rank));
        json_object_set_new(m->cfg, "linear_value_head_dim", json_integer(inner / rank));
    } else {
        json_decref(kinds);
    }
    return 0;
}

int sl_gguf_config(const sl_gguf *g, sl_config *c, sl_err *e) {
    meta m = {g, "", json_object(), e};
    sl_gguf_str a;
    int r = sl_gguf_get_str(g, "general.architecture", &a, e);
    if (r == 1) r = sl_fail(e, "%s: missing metadata key 'general.architecture'", g->paths[0]);
    if (!r && a.len >= sizeof m.arch) r = sl_fail(e, "%s: general.architecture is too long", g->paths[0]);
    if (!r) {
        memcpy(m.arch, a.s, a.len);
        m.arch[a.len] = 0;
        r = build_config(&m);
    }
    if (!r) r = sl_config_parse(m.cfg, g->paths[0], c, e);
    json_decref(m.cfg);
    if (r) return -1;
    c->norms_folded = 1;
    c->lin_v_tiled = !strcmp(m.arch, "qwen35moe");
    snprintf(c->gguf_arch, sizeof c->gguf_arch, "%s", m.arch);
    return 0;
}

/* ---- tensors ---- */

/* Per-layer GGUF name -> Hugging Face name after "model.layers.N.". */
static const struct {
    const char *gguf, *hf;
} layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"ffn_gate_inp.bias", "mlp.gate.bias"},
    {"attn_sinks.weight", "self_attn.sinks"},
    {"attn_sinks", "self_attn.sinks"},
    {"ffn_gate_exps.bias", "mlp.switch_mlp.gate_proj.bias"},
    {"ffn_up_exps.bias", "mlp.switch_mlp.up_proj.bias"},
    {"ffn_down_exps.bias", "mlp.switch_mlp.down_proj.bias"},
    {"ffn_gate_exps.weight", "mlp.switch_mlp.gate_proj.weight"},
    {"ffn_up_exps.weight", "mlp.switch_mlp.up_proj.weight"},
    {"ffn_gate_up_exps.weight", "mlp.experts.gate_up_proj"},
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},
    {"attn_qkv.weight", "linear_attn.in_proj_qkv.weight"},
    {"ssm_in.weight", "linear_attn.in_proj_qkvz.weight"}, /* Qwen3-Next, fused per key head */
    {"ssm_ba.weight", "linear_attn.in_proj_ba.weight"},   /* Qwen3-Next, fused per key head */
    {"attn_gate.weight", "linear_attn.in_proj_z.weight"},
    {"ssm_alpha.weight", "linear_attn.in_proj_a.weight"},
    {"ssm_beta.weight", "linear_attn.in_proj_b.weight"},
    {"ssm_out.weight", "linear_attn.out_proj.weight"},
    {"ssm_conv1d.weight", "linear_attn.conv1d.weight"},
    {"ssm_a", "linear_attn.A_log"},
    {"ssm_dt.bias", "linear_attn.dt_bias"},
    {"ssm_norm.weight", "linear_attn.norm.weight"},
    {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
    {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
    {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
    {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
    {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attn_kv_b.weight", "self_attn.kv_b_proj.weight"},
    {"attn_k_b.weight", "self_attn.k_b_proj.weight"},
    {"attn_v_b.weight", "self_attn.v_b_proj.weight"},
};

/* deepseek2 and glm4moe: the shared expert is DeepSeek's ungated shared_experts */
static const struct {
    const char *gguf, *hf;
} plain_shared_names[] = {
    {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
};

static const struct {
    const char *gguf, *hf;
} global_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

/* The Hugging Face name of a GGUF tensor; unknown names are kept, so the loader reports them as unexpected.
 * Blocks past the decoder's layers (multi-token prediction) go under "mtp.", which the loader skips. */
static char *hf_name(const sl_gguf *g, const sl_config *c, const char *name) {
    for (size_t i = 0; i < sizeof global_names / sizeof global_names[0]; i++)
        if (!strcmp(name, global_names[i].gguf)) return strdup(global_names[i].hf);
    int l, used = 0;
    if (sscanf(name, "blk.%d.%n", &l, &used) == 1 && used > 0 && l >= 0) {
        const char *rest = name + used;
        char buf[256];
        if (l >= c->n_layers) {
            snprintf(buf, sizeof buf, "mtp.layers.%d.%s", l, rest);
            return strdup(buf);
        }
        if (c->route_sigmoid)
            for (size_t i = 0; i < sizeof plain_shared_names / sizeof plain_shared_names[0]; i++)
                if (!strcmp(rest, plain_shared_names[i].gguf)) {
                    snprintf(buf, sizeof buf, "model.layers.%d.%s", l, plain_shared_names[i].hf);
                    return strdup(buf);
                }
        if (!strcmp(rest, "ffn_down_exps.weight")) {
            /* down_proj pairs with the fused gate_up stack when the file has one */
            snprintf(buf, sizeof buf, "blk.%d.ffn_gate_up_exps.weight", l);
            snprintf(buf, sizeof buf, "model.layers.%d.%s", l,
                     sl_gguf_find_tensor(g, buf) ? "mlp.experts.down_proj" : "mlp.switch_mlp.down_proj.weight");
            return strdup(buf);
        }
        /* per-expert matrices of older Mixtral files: ffn_{gate,down,up}.E.weight */
        char proj[8];
        int x, n = 0;
        if (sscanf(rest, "ffn_%4[a-z].%d.weight%n", proj, &x, &n) == 2 && n > 0 && !rest[n] && x >= 0 &&
            (!strcmp(proj, "gate") || !strcmp(proj, "down") || !strcmp(proj, "up"))) {
            snprintf(buf, sizeof buf, "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, x, proj);
            return strdup(buf);
        }
        for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++)
            if (!strcmp(rest, layer_names[i].gguf)) {
                snprintf(buf, sizeof buf, "model.layers.%d.%s", l, layer_names[i].hf);
                return strdup(buf);
            }
    }
    return strdup(name);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* llama.cpp's converter permutes llama's q/k rows within each head from [half | half] to interleaved pairs;
 * HF row h*hd + j*hd/2 + i comes from GGUF row h*hd + 2i + j. */
static int unpermute_rows(sl_st_tensor *t, int n_heads, const char *path, sl_err *e) {
    int64_t rows = t->shape[0];
    if (n_heads <= 0 || rows % n_heads || (rows / n_heads) % 2)
        return sl_fail(e, "%s: tensor '%s' has %lld rows, not %d heads of an even size", path, t->name, (long long)rows,
                       n_heads);
    size_t rb = rows ? (size_t)(t->nbytes / (uint64_t)rows) : 0;
    uint8_t *c = malloc(t->nbytes ? t->nbytes : 1);
    if (!c) return sl_fail(e, "out of memory");
    int64_t hd = rows / n_heads;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t j = 0; j < 2; j++)
            for (int64_t i = 0; i < hd / 2; i++)
                memcpy(c + (size_t)(h * hd + j * hd / 2 + i) * rb, t->data + (size_t)(h * hd + 2 * i + j) * rb, rb);
    t->owned = c;
    t->data = c;
    return 0;
}

/* ssm_a holds -exp(A_log); the model wants A_log back. */
static int a_log_from_ssm_a(sl_st_tensor *t, const char *path, const char *gname, sl_err *e) {
    if (t->dtype != SL_ST_F32) return sl_fail(e, "%s: tensor '%s' must be F32", path, gname);
    size_t n = (size_t)(t->nbytes / 4);
    float *v = malloc(sizeof *v * (n ? n : 1));
    if (!v) return sl_fail(e, "out of memory");
    memcpy(v, t->data, n * 4);
    for (size_t i = 0; i < n; i++) {
        if (!(v[i] < 0)) {
            double bad = v[i];
            free(v);
            return sl_fail(e, "%s: tensor '%s' element %zu is %g (expected -exp(A_log) < 0)", path, gname, i, bad);
        }
        v[i] = logf(-v[i]);
    }
    t->owned = v;
    t->data = (const uint8_t *)v;
    return 0;
}

static int convert_tensor(const sl_gguf *g, const sl_gguf_tensor *gt, const sl_config *c, sl_st_tensor *t, sl_err *e) {
    const char *path = g->paths[gt->file];
    t->name = hf_name(g, c, gt->name);
    if (!t->name) return sl_fail(e, "out of memory");
    t->ndim = gt->ndim;
    for (int i = 0; i < gt->ndim; i++) t->shape[i] = gt->ne[gt->ndim - 1 - i];
    t->data = gt->data;
    t->nbytes = gt->nbytes;
    t->offset = gt->offset;
    t->file = gt->file;
    t->gtype = gt->type;
    switch (gt->type) {
    case SL_GGML_F32: t->dtype = SL_ST_F32; break;
    case SL_GGML_F16: t->dtype = SL_ST_F16; break;
    case SL_GGML_BF16: t->dtype = SL_ST_BF16; break;
    default: t->dtype = SL_ST_GGML; break;
    }
    /* squeezed shapes the Hugging Face layout keeps */
    if (ends_with(t->name, "linear_attn.conv1d.weight") && t->ndim == 2) {
        t->ndim = 3;
        t->shape[2] = t->shape[1];
        t->shape[1] = 1;
    }
    if (ends_with(t->name, "mlp.shared_expert_gate.weight") && t->ndim == 1) {
        t->ndim = 2;
        t->shape[1] = t->shape[0];
        t->shape[0] = 1;
    }
    if (ends_with(t->name, "linear_attn.A_log")) return a_log_from_ssm_a(t, path, gt->name, e);
    if (!strcmp(c->gguf_arch, "llama")) {
        if (ends_with(t->name, "self_attn.q_proj.weight") || ends_with(t->name, "self_attn.q_proj.bias"))
            return unpermute_rows(t, c->n_heads, path, e);
        if (ends_with(t->name, "self_attn.k_proj.weight") || ends_with(t->name, "self_attn.k_proj.bias"))
            return unpermute_rows(t, c->n_kv_heads, path, e);
    }
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const sl_st_tensor *)a)->name, ((const sl_st_tensor *)b)->name);
}

int sl_gguf_tensor_set(sl_gguf *g, const sl_config *c, sl_st_set **out, sl_err *e) {
    *out = NULL;
    sl_st_set *s = calloc(1, sizeof *s);
    if (!s) return sl_fail(e, "out of memory");
    s->tensors = calloc((size_t)g->n_tensors + 1, sizeof *s->tensors);
    if (!s->tensors) {
        free(s);
        return sl_fail(e, "out of memory");
    }
    /* the set owns the mappings from here on */
    s->n_files = g->n_files;
    s->paths = g->paths;
    s->maps = g->maps;
    s->map_sizes = g->map_sizes;
    for (int i = 0; i < g->n_tensors; i++) {
        s->n_tensors++;
        if (convert_tensor(g, &g->tensors[i], c, &s->tensors[i], e)) {
            g->n_files = 0, g->paths = NULL, g->maps = NULL, g->map_sizes = NULL;
            sl_st_close(s);
            return -1;
        }
    }
    g->n_files = 0, g->paths = NULL, g->maps = NULL, g->map_sizes = NULL;
    qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, cmp_name);
    *out = s;
    return 0;
}
