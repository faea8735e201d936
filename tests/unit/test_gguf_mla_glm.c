/* The GGUF forms of DeepSeek-V3 (general.architecture deepseek2) and GLM-4.5 (glm4moe). The family
 * fixtures are rewritten as llama.cpp's converter lays them out: its tensor names, experts stacked
 * [E, out, in], DeepSeek's kv_b_proj split per head into k_b (transposed) and v_b, one KV head of
 * kv_lora_rank + rope in the attention keys with the per-head sizes in *_mla, the router in
 * expert_gating_func / expert_weights_scale / leading_dense_block_count, GLM's multi-token-prediction
 * block after the decoder's. Loaded from there, the model must give the checkpoint's logits. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/ggml_types.h"
#include "core/util.h"
#include "formats/gguf_write.h"
#include "formats/safetensors.h"
#include "runtime/session.h"
#include "testutil.h"

#define MAX_T 512

typedef struct conv {
    const sl_st_set *st;
    json_t *cfg;
    sl_gguf_wtensor t[MAX_T];
    uint8_t *data[MAX_T]; /* each tensor's bytes, built before writing */
    int n;
    sl_gguf_wkv kv[64];
    int n_kv;
} conv;

static int cfg_int(conv *c, const char *k) {
    return (int)json_integer_value(json_object_get(c->cfg, k));
}

static void kv_u32(conv *c, const char *key, int64_t v) {
    c->kv[c->n_kv++] = (sl_gguf_wkv){.key = strdup(key), .type = SL_GGUF_U32, .i = v};
}
static void kv_f32(conv *c, const char *key, double v) {
    c->kv[c->n_kv++] = (sl_gguf_wkv){.key = strdup(key), .type = SL_GGUF_F32, .f = v};
}
static void kv_bool(conv *c, const char *key, int v) {
    c->kv[c->n_kv++] = (sl_gguf_wkv){.key = strdup(key), .type = SL_GGUF_BOOL, .i = v};
}
static void kv_str(conv *c, const char *key, const char *v) {
    c->kv[c->n_kv++] = (sl_gguf_wkv){.key = strdup(key), .type = SL_GGUF_STRING, .s = strdup(v)};
}

/* A BF16 tensor of ggml shape ne[0..nd) whose bytes the caller fills. */
static uint8_t *add(conv *c, const char *name, int nd, int64_t n0, int64_t n1, int64_t n2) {
    cr_assert_lt(c->n, MAX_T);
    sl_gguf_wtensor *t = &c->t[c->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = SL_GGML_BF16;
    t->ndim = nd;
    t->ne[0] = n0;
    t->ne[1] = n1;
    t->ne[2] = n2;
    t->kind = c->n;
    c->data[c->n] = calloc(1, sl_gguf_wtensor_bytes(t));
    return c->data[c->n++];
}

static const sl_st_tensor *src(conv *c, const char *name) {
    const sl_st_tensor *t = sl_st_find(c->st, name);
    cr_assert(t, "fixture tensor %s", name);
    cr_assert_eq(t->dtype, SL_ST_BF16, "%s is BF16", name);
    return t;
}

/* A tensor copied as it is (HF [rows, cols] is ggml [cols, rows]). */
static void copy(conv *c, const char *hf, const char *gg) {
    const sl_st_tensor *t = src(c, hf);
    uint8_t *d = t->ndim == 1 ? add(c, gg, 1, t->shape[0], 1, 1) : add(c, gg, 2, t->shape[1], t->shape[0], 1);
    memcpy(d, t->data, t->nbytes);
}

static void layer_copy(conv *c, int l, const char *hf, const char *gg) {
    char a[160], b[96];
    snprintf(a, sizeof a, "model.layers.%d.%s", l, hf);
    snprintf(b, sizeof b, "blk.%d.%s", l, gg);
    copy(c, a, b);
}

/* The routed experts of layer l stacked [E, out, in], as the converter merges them. */
static void experts(conv *c, int l, int E) {
    const char *hf[3] = {"gate_proj", "up_proj", "down_proj"},
               *gg[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int w = 0; w < 3; w++) {
        char a[160], b[96];
        snprintf(a, sizeof a, "model.layers.%d.mlp.experts.0.%s.weight", l, hf[w]);
        const sl_st_tensor *t0 = src(c, a);
        snprintf(b, sizeof b, "blk.%d.%s.weight", l, gg[w]);
        uint8_t *d = add(c, b, 3, t0->shape[1], t0->shape[0], E);
        for (int x = 0; x < E; x++) {
            snprintf(a, sizeof a, "model.layers.%d.mlp.experts.%d.%s.weight", l, x, hf[w]);
            const sl_st_tensor *t = src(c, a);
            memcpy(d + (size_t)x * t->nbytes, t->data, t->nbytes);
        }
    }
}

/* kv_b_proj [H * (nope + v), kv] split per head: k_b [H][kv][nope] (transposed), v_b [H][v][kv]. */
static void kv_b_split(conv *c, int l) {
    int H = cfg_int(c, "num_attention_heads"), nope = cfg_int(c, "qk_nope_head_dim"), v = cfg_int(c, "v_head_dim");
    int kv = cfg_int(c, "kv_lora_rank"), hw = nope + v;
    char a[160], b[96];
    snprintf(a, sizeof a, "model.layers.%d.self_attn.kv_b_proj.weight", l);
    const uint16_t *w = (const uint16_t *)src(c, a)->data;
    snprintf(b, sizeof b, "blk.%d.attn_k_b.weight", l);
    uint16_t *k = (uint16_t *)add(c, b, 3, nope, kv, H);
    snprintf(b, sizeof b, "blk.%d.attn_v_b.weight", l);
    uint16_t *vb = (uint16_t *)add(c, b, 3, kv, v, H);
    for (int h = 0; h < H; h++) {
        for (int ci = 0; ci < kv; ci++)
            for (int j = 0; j < nope; j++) k[((size_t)h * kv + ci) * nope + j] = w[((size_t)h * hw + j) * kv + ci];
        for (int r = 0; r < v; r++)
            memcpy(vb + ((size_t)h * v + r) * kv, w + ((size_t)h * hw + nope + r) * kv, (size_t)kv * 2);
    }
}

static void fill(void *ctx, const sl_gguf_wtensor *t, uint64_t off, uint8_t *buf, size_t n) {
    conv *c = ctx;
    memcpy(buf, c->data[t->kind] + off, n);
}

/* Writes the fixture `name` as llama.cpp's converter would into dir/model.gguf; returns that path. */
static char *convert(const char *name, const char *dir) {
    conv *c = calloc(1, sizeof *c);
    char rel[128];
    snprintf(rel, sizeof rel, "families/%s", name);
    char *fx = tu_fixture(rel);
    sl_err e = {{0}};
    sl_st_set *st = NULL;
    cr_assert_eq(sl_st_open_dir(fx, &st, &e), 0, "%s", e.msg);
    c->st = st;
    char *cp = sl_path_join(fx, "config.json");
    json_error_t je;
    c->cfg = json_load_file(cp, 0, &je);
    cr_assert(c->cfg, "%s", je.text);
    int ds = !strcmp(name, "deepseek_v3"), L = cfg_int(c, "num_hidden_layers"), E = cfg_int(c, "n_routed_experts");
    int dense = cfg_int(c, "first_k_dense_replace"), H = cfg_int(c, "num_attention_heads");
    const char *arch = ds ? "deepseek2" : "glm4moe";
    json_t *rp = json_object_get(c->cfg, "rope_parameters");
    char k[128];
#define AK(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    kv_str(c, "general.architecture", arch);
    kv_u32(c, AK("block_count"), L + (ds ? 0 : 1));
    kv_u32(c, AK("context_length"), cfg_int(c, "max_position_embeddings"));
    kv_u32(c, AK("embedding_length"), cfg_int(c, "hidden_size"));
    kv_u32(c, AK("feed_forward_length"), cfg_int(c, "intermediate_size"));
    kv_u32(c, AK("attention.head_count"), H);
    kv_f32(c, AK("attention.layer_norm_rms_epsilon"), json_number_value(json_object_get(c->cfg, "rms_norm_eps")));
    kv_f32(c, AK("rope.freq_base"), json_number_value(json_object_get(rp, "rope_theta")));
    kv_u32(c, AK("expert_count"), E);
    kv_u32(c, AK("expert_used_count"), cfg_int(c, "num_experts_per_tok"));
    kv_u32(c, AK("expert_feed_forward_length"), cfg_int(c, "moe_intermediate_size"));
    kv_u32(c, AK("expert_shared_count"), cfg_int(c, "n_shared_experts"));
    kv_u32(c, AK("leading_dense_block_count"), dense);
    kv_f32(c, AK("expert_weights_scale"), json_number_value(json_object_get(c->cfg, "routed_scaling_factor")));
    kv_bool(c, AK("expert_weights_norm"), 1);
    kv_u32(c, AK("expert_gating_func"), 2);
    kv_u32(c, AK("expert_group_count"), cfg_int(c, "n_group"));
    kv_u32(c, AK("expert_group_used_count"), cfg_int(c, "topk_group"));
    if (ds) {
        int rope = cfg_int(c, "qk_rope_head_dim"), kvr = cfg_int(c, "kv_lora_rank");
        kv_u32(c, AK("attention.head_count_kv"), 1);
        kv_u32(c, AK("attention.q_lora_rank"), cfg_int(c, "q_lora_rank"));
        kv_u32(c, AK("attention.kv_lora_rank"), kvr);
        kv_u32(c, AK("attention.key_length"), kvr + rope);
        kv_u32(c, AK("attention.value_length"), kvr);
        kv_u32(c, AK("attention.key_length_mla"), cfg_int(c, "qk_nope_head_dim") + rope);
        kv_u32(c, AK("attention.value_length_mla"), cfg_int(c, "v_head_dim"));
        kv_u32(c, AK("rope.dimension_count"), rope);
        kv_str(c, AK("rope.scaling.type"), "yarn");
        kv_f32(c, AK("rope.scaling.factor"), json_number_value(json_object_get(rp, "factor")));
        kv_u32(c, AK("rope.scaling.original_context_length"),
               json_integer_value(json_object_get(rp, "original_max_position_embeddings")));
        kv_f32(c, AK("rope.scaling.yarn_beta_fast"), json_number_value(json_object_get(rp, "beta_fast")));
        kv_f32(c, AK("rope.scaling.yarn_beta_slow"), json_number_value(json_object_get(rp, "beta_slow")));
        kv_f32(c, AK("rope.scaling.yarn_log_multiplier"),
               0.1 * json_number_value(json_object_get(rp, "mscale_all_dim")));
    } else {
        int hd = cfg_int(c, "head_dim");
        kv_u32(c, AK("attention.head_count_kv"), cfg_int(c, "num_key_value_heads"));
        kv_u32(c, AK("attention.key_length"), hd);
        kv_u32(c, AK("attention.value_length"), hd);
        kv_u32(c, AK("rope.dimension_count"), hd / 2);
        kv_u32(c, AK("nextn_predict_layers"), 1);
    }
#undef AK
    copy(c, "model.embed_tokens.weight", "token_embd.weight");
    copy(c, "model.norm.weight", "output_norm.weight");
    copy(c, "lm_head.weight", "output.weight");
    for (int l = 0; l < L; l++) {
        layer_copy(c, l, "input_layernorm.weight", "attn_norm.weight");
        layer_copy(c, l, "post_attention_layernorm.weight", "ffn_norm.weight");
        layer_copy(c, l, "self_attn.o_proj.weight", "attn_output.weight");
        if (ds) {
            layer_copy(c, l, "self_attn.q_a_proj.weight", "attn_q_a.weight");
            layer_copy(c, l, "self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight");
            layer_copy(c, l, "self_attn.q_b_proj.weight", "attn_q_b.weight");
            layer_copy(c, l, "self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight");
            layer_copy(c, l, "self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight");
            kv_b_split(c, l);
        } else {
            const char *p[3] = {"q", "k", "v"};
            for (int i = 0; i < 3; i++) {
                char a[64], b[64];
                snprintf(a, sizeof a, "self_attn.%s_proj.weight", p[i]);
                snprintf(b, sizeof b, "attn_%s.weight", p[i]);
                layer_copy(c, l, a, b);
                snprintf(a, sizeof a, "self_attn.%s_proj.bias", p[i]);
                snprintf(b, sizeof b, "attn_%s.bias", p[i]);
                layer_copy(c, l, a, b);
            }
        }
        if (l < dense) {
            layer_copy(c, l, "mlp.gate_proj.weight", "ffn_gate.weight");
            layer_copy(c, l, "mlp.up_proj.weight", "ffn_up.weight");
            layer_copy(c, l, "mlp.down_proj.weight", "ffn_down.weight");
            continue;
        }
        layer_copy(c, l, "mlp.gate.weight", "ffn_gate_inp.weight");
        layer_copy(c, l, "mlp.gate.e_score_correction_bias", "exp_probs_b.bias");
        layer_copy(c, l, "mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight");
        layer_copy(c, l, "mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight");
        layer_copy(c, l, "mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight");
        experts(c, l, E);
    }
    if (!ds) { /* the multi-token-prediction block the converter appends: not part of the decoder */
        char b[96];
        snprintf(b, sizeof b, "blk.%d.nextn.eh_proj.weight", L);
        add(c, b, 2, 2 * cfg_int(c, "hidden_size"), cfg_int(c, "hidden_size"), 1);
    }
    char *out = sl_path_join(dir, "model.gguf");
    cr_assert_eq(sl_gguf_write(out, c->kv, c->n_kv, c->t, c->n, fill, NULL, c, &e), 0, "%s", e.msg);
    for (int i = 0; i < c->n; i++) free(c->data[i]);
    for (int i = 0; i < c->n_kv; i++) {
        free((void *)c->kv[i].key);
        free((void *)c->kv[i].s);
    }
    json_decref(c->cfg);
    sl_st_close(st);
    free(cp);
    free(fx);
    free(c);
    return out;
}

/* Prompt then decode ids of the fixture, every position's logits. */
static float *logits_of(const char *path, const int32_t *ids, int np, int nd, int *V) {
    sl_err e = {{0}};
    sl_model *m;
    sl_session *s;
    cr_assert_eq(sl_model_load(path, NULL, &m, &e), 0, "%s: %s", path, e.msg);
    *V = m->cfg.vocab_size;
    cr_assert_eq(sl_session_create(m, np + nd, &s, &e), 0, "%s", e.msg);
    float *out = malloc(sizeof *out * (size_t)(np + nd) * (size_t)*V);
    cr_assert_eq(sl_session_forward(s, ids, np, out, 1, &e), 0, "%s", e.msg);
    for (int i = 0; i < nd; i++)
        cr_assert_eq(sl_session_forward(s, ids + np + i, 1, out + (size_t)(np + i) * (size_t)*V, 0, &e), 0, "%s",
                     e.msg);
    sl_session_free(s);
    sl_model_free(m);
    return out;
}

static void check(const char *name) {
    char *tmp = tu_tmpdir();
    char *gguf = convert(name, tmp);
    char rel[128];
    snprintf(rel, sizeof rel, "families/%s/expected.json", name);
    char *ej = tu_fixture(rel);
    json_error_t je;
    json_t *ex = json_load_file(ej, 0, &je);
    cr_assert(ex, "%s", je.text);
    json_t *pa = json_object_get(ex, "prompt_ids"), *da = json_object_get(ex, "decode_ids");
    int np = (int)json_array_size(pa), nd = (int)json_array_size(da), V, V2;
    int32_t *ids = malloc(sizeof *ids * (size_t)(np + nd));
    for (int i = 0; i < np; i++) ids[i] = (int32_t)json_integer_value(json_array_get(pa, (size_t)i));
    for (int i = 0; i < nd; i++) ids[np + i] = (int32_t)json_integer_value(json_array_get(da, (size_t)i));
    snprintf(rel, sizeof rel, "families/%s", name);
    char *dir = tu_fixture(rel);
    float *ref = logits_of(dir, ids, np, nd, &V), *got = logits_of(gguf, ids, np, nd, &V2);
    cr_assert_eq(V, V2);
    double r = tu_rel_l2(got, ref, (size_t)(np + nd) * (size_t)V);
    cr_log_info("%s as GGUF: rel-L2 %.2e against the checkpoint", name, r);
    cr_expect_leq(r, 1e-5, "%s: GGUF logits differ from the checkpoint's (rel-L2 %.3e)", name, r);
    free(ref);
    free(got);
    free(ids);
    free(dir);
    json_decref(ex);
    free(ej);
    remove(gguf);
    free(gguf);
    rmdir(tmp);
    free(tmp);
}

Test(gguf_mla_glm, deepseek2) {
    check("deepseek_v3");
}

Test(gguf_mla_glm, glm4moe) {
    check("glm4_moe");
}
