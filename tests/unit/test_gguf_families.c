/* The family fixtures written as GGUF the way llama.cpp's converter writes them (tensor names, metadata keys,
 * its row reorders and folds) load through the GGUF path and give the safetensors checkpoint's logits:
 * Mixtral as general.architecture llama with experts (per-expert matrices, as older files hold them), and
 * Qwen3-Next as qwen3next (one delta-net layer in the older fused ssm_in form, the rest split into attn_qkv
 * and attn_gate). All tensors are F32, so the weights are exactly the bf16 checkpoint's. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/half.h"
#include "formats/gguf_write.h"
#include "formats/safetensors.h"
#include "runtime/session.h"
#include "testutil.h"

enum { T_F32 = 0 };

typedef struct conv {
    const sl_st_set *st;
    sl_gguf_wtensor *t;
    float **data; /* per output tensor, its F32 values in GGUF order */
    int n, cap;
    sl_gguf_wkv kv[40];
    int n_kv;
} conv;

/* The source tensor as float32 (a fresh array); its element count in *n. */
static float *src(conv *c, const char *name, int64_t *n) {
    const sl_st_tensor *t = sl_st_find(c->st, name);
    cr_assert(t, "fixture tensor %s missing", name);
    cr_assert(t->dtype == SL_ST_BF16 || t->dtype == SL_ST_F32, "%s: unexpected dtype", name);
    *n = sl_st_numel(t);
    float *v = malloc(sizeof *v * (size_t)*n);
    cr_assert(v);
    for (int64_t i = 0; i < *n; i++) {
        if (t->dtype == SL_ST_F32) {
            memcpy(&v[i], t->data + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            v[i] = sl_bf16_to_f32(h);
        }
    }
    return v;
}

/* Adds a tensor of ggml shape ne (ne[0] innermost) with values v (taken). */
static void put(conv *c, const char *name, int ndim, int64_t ne0, int64_t ne1, int64_t ne2, float *v) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->t = realloc(c->t, sizeof *c->t * (size_t)c->cap);
        c->data = realloc(c->data, sizeof *c->data * (size_t)c->cap);
        cr_assert(c->t && c->data);
    }
    sl_gguf_wtensor *t = &c->t[c->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = T_F32;
    t->ndim = ndim;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->kind = c->n;
    c->data[c->n++] = v;
}

/* A tensor copied as it is: a matrix [rows, cols] becomes ne {cols, rows}; add is added (norm folds). */
static void copy(conv *c, const char *gname, const char *hf, float add) {
    const sl_st_tensor *t = sl_st_find(c->st, hf);
    cr_assert(t, "fixture tensor %s missing", hf);
    int64_t n;
    float *v = src(c, hf, &n);
    for (int64_t i = 0; i < n; i++) v[i] += add;
    if (t->ndim == 1)
        put(c, gname, 1, t->shape[0], 0, 0, v);
    else
        put(c, gname, 2, t->shape[1], t->shape[0], 0, v);
}

static void kv_int(conv *c, const char *key, int64_t v) {
    c->kv[c->n_kv++] = (sl_gguf_wkv){.key = key, .type = SL_GGUF_U32, .i = v};
}
static void kv_f(conv *c, const char *key, double v) {
    c->kv[c->n_kv++] = (sl_gguf_wkv){.key = key, .type = SL_GGUF_F32, .f = v};
}

static void fill(void *ctx, const sl_gguf_wtensor *t, uint64_t off, uint8_t *buf, size_t n) {
    conv *c = ctx;
    memcpy(buf, (const uint8_t *)c->data[t->kind] + off, n);
}

#define NB(...) (snprintf(nb, sizeof nb, __VA_ARGS__), nb)
#define HF(...) (snprintf(hb, sizeof hb, __VA_ARGS__), hb)

/* llama.cpp's q/k permutation for llama: GGUF row h*hd + 2i + j holds HF row h*hd + j*hd/2 + i. */
static void permuted(conv *c, const char *gname, const char *hf, int heads) {
    const sl_st_tensor *t = sl_st_find(c->st, hf);
    int64_t n, rows = t->shape[0], cols = t->shape[1], hd = rows / heads;
    float *v = src(c, hf, &n), *p = malloc(sizeof *p * (size_t)n);
    for (int64_t h = 0; h < heads; h++)
        for (int64_t j = 0; j < 2; j++)
            for (int64_t i = 0; i < hd / 2; i++)
                memcpy(p + (h * hd + 2 * i + j) * cols, v + (h * hd + j * hd / 2 + i) * cols, sizeof *p * (size_t)cols);
    free(v);
    put(c, gname, 2, cols, rows, 0, p);
}

static void mixtral(conv *c) {
    char nb[96], hb[128];
    c->kv[c->n_kv++] = (sl_gguf_wkv){.key = "general.architecture", .type = SL_GGUF_STRING, .s = "llama"};
    kv_int(c, "llama.block_count", 3);
    kv_int(c, "llama.embedding_length", 128);
    kv_int(c, "llama.attention.head_count", 4);
    kv_int(c, "llama.attention.head_count_kv", 2);
    kv_int(c, "llama.feed_forward_length", 256);
    kv_int(c, "llama.context_length", 4096);
    kv_int(c, "llama.expert_count", 8);
    kv_int(c, "llama.expert_used_count", 2);
    kv_f(c, "llama.rope.freq_base", 1e6);
    kv_f(c, "llama.attention.layer_norm_rms_epsilon", 1e-6);
    copy(c, "token_embd.weight", "model.embed_tokens.weight", 0);
    copy(c, "output_norm.weight", "model.norm.weight", 0);
    copy(c, "output.weight", "lm_head.weight", 0);
    for (int l = 0; l < 3; l++) {
        const char *p = "model.layers.%d.%s";
        copy(c, NB("blk.%d.attn_norm.weight", l), HF(p, l, "input_layernorm.weight"), 0);
        copy(c, NB("blk.%d.ffn_norm.weight", l), HF(p, l, "post_attention_layernorm.weight"), 0);
        permuted(c, NB("blk.%d.attn_q.weight", l), HF(p, l, "self_attn.q_proj.weight"), 4);
        permuted(c, NB("blk.%d.attn_k.weight", l), HF(p, l, "self_attn.k_proj.weight"), 2);
        copy(c, NB("blk.%d.attn_v.weight", l), HF(p, l, "self_attn.v_proj.weight"), 0);
        copy(c, NB("blk.%d.attn_output.weight", l), HF(p, l, "self_attn.o_proj.weight"), 0);
        copy(c, NB("blk.%d.ffn_gate_inp.weight", l), HF(p, l, "block_sparse_moe.gate.weight"), 0);
        for (int x = 0; x < 8; x++) {
            const char *q = "model.layers.%d.block_sparse_moe.experts.%d.%s.weight";
            copy(c, NB("blk.%d.ffn_gate.%d.weight", l, x), HF(q, l, x, "w1"), 0);
            copy(c, NB("blk.%d.ffn_down.%d.weight", l, x), HF(q, l, x, "w2"), 0);
            copy(c, NB("blk.%d.ffn_up.%d.weight", l, x), HF(q, l, x, "w3"), 0);
        }
    }
}

/* The experts' matrices of a layer stacked: ne {cols, rows, E}. */
static void stacked(conv *c, const char *gname, int l, const char *proj, int E) {
    char hb[128];
    int64_t n, rows = 0, cols = 0;
    float *all = NULL;
    for (int x = 0; x < E; x++) {
        const char *hf = HF("model.layers.%d.mlp.experts.%d.%s.weight", l, x, proj);
        const sl_st_tensor *t = sl_st_find(c->st, hf);
        cr_assert(t, "%s", hf);
        rows = t->shape[0], cols = t->shape[1];
        if (!all) all = malloc(sizeof *all * (size_t)(rows * cols * E));
        float *v = src(c, hf, &n);
        memcpy(all + x * rows * cols, v, sizeof *v * (size_t)n);
        free(v);
    }
    put(c, gname, 3, cols, rows, E, all);
}

/* llama.cpp's split of in_proj_qkvz: per key head [q | k | v | z] -> all q, all k, all v (attn_qkv) and all z
 * (attn_gate). */
static void split_qkvz(conv *c, int l, int nk, int kd, int gv) {
    char nb[96], hb[128];
    const char *hf = HF("model.layers.%d.linear_attn.in_proj_qkvz.weight", l);
    const sl_st_tensor *t = sl_st_find(c->st, hf);
    int64_t n, H = t->shape[1], blk = 2 * kd + 2 * gv;
    float *v = src(c, hf, &n), *qkv = malloc(sizeof *qkv * (size_t)(nk * (2 * kd + gv) * H)),
          *z = malloc(sizeof *z * (size_t)(nk * gv * H));
    size_t rb = sizeof *v * (size_t)H;
    for (int g = 0; g < nk; g++) {
        memcpy(qkv + (g * kd) * H, v + (g * blk) * H, rb * (size_t)kd);
        memcpy(qkv + (nk * kd + g * kd) * H, v + (g * blk + kd) * H, rb * (size_t)kd);
        memcpy(qkv + (2 * nk * kd + g * gv) * H, v + (g * blk + 2 * kd) * H, rb * (size_t)gv);
        memcpy(z + (g * gv) * H, v + (g * blk + 2 * kd + gv) * H, rb * (size_t)gv);
    }
    free(v);
    put(c, NB("blk.%d.attn_qkv.weight", l), 2, H, nk * (2 * kd + gv), 0, qkv);
    put(c, NB("blk.%d.attn_gate.weight", l), 2, H, nk * gv, 0, z);
}

static void qwen3_next(conv *c) {
    char nb[96], hb[128];
    c->kv[c->n_kv++] = (sl_gguf_wkv){.key = "general.architecture", .type = SL_GGUF_STRING, .s = "qwen3next"};
    kv_int(c, "qwen3next.block_count", 4);
    kv_int(c, "qwen3next.embedding_length", 128);
    kv_int(c, "qwen3next.attention.head_count", 4);
    kv_int(c, "qwen3next.attention.head_count_kv", 2);
    kv_int(c, "qwen3next.attention.key_length", 64);
    kv_int(c, "qwen3next.attention.value_length", 64);
    kv_int(c, "qwen3next.feed_forward_length", 256);
    kv_int(c, "qwen3next.context_length", 4096);
    kv_int(c, "qwen3next.expert_count", 16);
    kv_int(c, "qwen3next.expert_used_count", 4);
    kv_int(c, "qwen3next.expert_feed_forward_length", 64);
    kv_int(c, "qwen3next.expert_shared_feed_forward_length", 64);
    kv_f(c, "qwen3next.rope.freq_base", 1e7);
    kv_int(c, "qwen3next.rope.dimension_count", 16);
    kv_f(c, "qwen3next.attention.layer_norm_rms_epsilon", 1e-6);
    kv_int(c, "qwen3next.ssm.conv_kernel", 4);
    kv_int(c, "qwen3next.ssm.state_size", 32);
    kv_int(c, "qwen3next.ssm.group_count", 2);
    kv_int(c, "qwen3next.ssm.time_step_rank", 4);
    kv_int(c, "qwen3next.ssm.inner_size", 128);
    c->kv[c->n_kv++] = (sl_gguf_wkv){.key = "qwen3next.expert_weights_norm", .type = SL_GGUF_BOOL, .i = 1};
    /* the converter folds the 1 of every (1 + w) norm into the weight; the delta-net's gated norm is plain w */
    copy(c, "token_embd.weight", "model.embed_tokens.weight", 0);
    copy(c, "output_norm.weight", "model.norm.weight", 1);
    copy(c, "output.weight", "lm_head.weight", 0);
    for (int l = 0; l < 4; l++) {
        const char *p = "model.layers.%d.%s";
        copy(c, NB("blk.%d.attn_norm.weight", l), HF(p, l, "input_layernorm.weight"), 1);
        copy(c, NB("blk.%d.post_attention_norm.weight", l), HF(p, l, "post_attention_layernorm.weight"), 1);
        if (l == 3) {
            copy(c, NB("blk.%d.attn_q.weight", l), HF(p, l, "self_attn.q_proj.weight"), 0);
            copy(c, NB("blk.%d.attn_k.weight", l), HF(p, l, "self_attn.k_proj.weight"), 0);
            copy(c, NB("blk.%d.attn_v.weight", l), HF(p, l, "self_attn.v_proj.weight"), 0);
            copy(c, NB("blk.%d.attn_output.weight", l), HF(p, l, "self_attn.o_proj.weight"), 0);
            copy(c, NB("blk.%d.attn_q_norm.weight", l), HF(p, l, "self_attn.q_norm.weight"), 1);
            copy(c, NB("blk.%d.attn_k_norm.weight", l), HF(p, l, "self_attn.k_norm.weight"), 1);
        } else {
            if (l == 0) /* the older fused form */
                copy(c, NB("blk.%d.ssm_in.weight", l), HF(p, l, "linear_attn.in_proj_qkvz.weight"), 0);
            else
                split_qkvz(c, l, 2, 32, 2 * 32);
            copy(c, NB("blk.%d.ssm_ba.weight", l), HF(p, l, "linear_attn.in_proj_ba.weight"), 0);
            int64_t n;
            float *conv_w = src(c, HF(p, l, "linear_attn.conv1d.weight"), &n); /* [C, 1, K] squeezed */
            put(c, NB("blk.%d.ssm_conv1d.weight", l), 2, 4, n / 4, 0, conv_w);
            float *a = src(c, HF(p, l, "linear_attn.A_log"), &n);
            for (int64_t i = 0; i < n; i++) a[i] = -expf(a[i]);
            put(c, NB("blk.%d.ssm_a", l), 1, n, 0, 0, a);
            copy(c, NB("blk.%d.ssm_dt.bias", l), HF(p, l, "linear_attn.dt_bias"), 0);
            copy(c, NB("blk.%d.ssm_norm.weight", l), HF(p, l, "linear_attn.norm.weight"), 0);
            copy(c, NB("blk.%d.ssm_out.weight", l), HF(p, l, "linear_attn.out_proj.weight"), 0);
        }
        copy(c, NB("blk.%d.ffn_gate_inp.weight", l), HF(p, l, "mlp.gate.weight"), 0);
        stacked(c, NB("blk.%d.ffn_gate_exps.weight", l), l, "gate_proj", 16);
        stacked(c, NB("blk.%d.ffn_up_exps.weight", l), l, "up_proj", 16);
        stacked(c, NB("blk.%d.ffn_down_exps.weight", l), l, "down_proj", 16);
        copy(c, NB("blk.%d.ffn_gate_shexp.weight", l), HF(p, l, "mlp.shared_expert.gate_proj.weight"), 0);
        copy(c, NB("blk.%d.ffn_up_shexp.weight", l), HF(p, l, "mlp.shared_expert.up_proj.weight"), 0);
        copy(c, NB("blk.%d.ffn_down_shexp.weight", l), HF(p, l, "mlp.shared_expert.down_proj.weight"), 0);
        int64_t n;
        float *sg = src(c, HF(p, l, "mlp.shared_expert_gate.weight"), &n); /* [1, H], written 1-D */
        put(c, NB("blk.%d.ffn_gate_inp_shexp.weight", l), 1, n, 0, 0, sg);
    }
}

static float *logits_of(const char *path, const int32_t *ids, int n, int V) {
    sl_err e = {{0}};
    sl_model *m;
    sl_session *s;
    cr_assert_eq(sl_model_load(path, NULL, &m, &e), 0, "%s", e.msg);
    cr_assert_eq(m->cfg.vocab_size, V);
    cr_assert_eq(sl_session_create(m, n, &s, &e), 0, "%s", e.msg);
    float *out = malloc(sizeof *out * (size_t)n * (size_t)V);
    cr_assert_eq(sl_session_forward(s, ids, n, out, 1, &e), 0, "%s", e.msg);
    sl_session_free(s);
    sl_model_free(m);
    return out;
}

static void check(const char *name, void (*build)(conv *), const char *model_type) {
    char rel[128];
    snprintf(rel, sizeof rel, "families/%s", name);
    char *dir = tu_fixture(rel);
    snprintf(rel, sizeof rel, "families/%s/model.safetensors", name);
    char *st_path = tu_fixture(rel);
    sl_err e = {{0}};
    conv c = {0};
    sl_st_set *st = NULL; /* sl_st_open_file adds to a set it is given */
    cr_assert_eq(sl_st_open_file(st_path, &st, &e), 0, "%s", e.msg);
    c.st = st;
    build(&c);
    char *tmp = tu_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", tmp, name);
    cr_assert_eq(sl_gguf_write(path, c.kv, c.n_kv, c.t, c.n, fill, NULL, &c, &e), 0, "%s", e.msg);

    sl_model *m;
    cr_assert_eq(sl_model_load(path, NULL, &m, &e), 0, "%s", e.msg);
    cr_expect_str_eq(m->cfg.model_type, model_type);
    sl_model_free(m);
    int32_t ids[24];
    int n = 24, V = 512;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
    float *want = logits_of(dir, ids, n, V), *got = logits_of(path, ids, n, V);
    double num = 0, den = 0;
    int same = 0;
    for (int r = 0; r < n; r++) {
        int a = 0, b = 0;
        for (int i = 0; i < V; i++) {
            size_t k = (size_t)r * V + (size_t)i;
            num += ((double)got[k] - want[k]) * ((double)got[k] - want[k]);
            den += (double)want[k] * want[k];
            if (got[k] > got[(size_t)r * V + (size_t)a]) a = i;
            if (want[k] > want[(size_t)r * V + (size_t)b]) b = i;
        }
        same += a == b;
    }
    double rl = sqrt(num / den);
    cr_log_info("%s: GGUF vs safetensors rel-L2 %.2e, argmax %d/%d", name, rl, same, n);
    cr_expect_leq(rl, 1e-5, "%s: GGUF logits differ from the safetensors checkpoint's (rel-L2 %.3e)", name, rl);
    cr_expect_eq(same, n);

    unlink(path);
    rmdir(tmp);
    free(tmp);
    free(want);
    free(got);
    for (int i = 0; i < c.n; i++) free(c.data[i]);
    free(c.data);
    free(c.t);
    sl_st_close(st);
    free(st_path);
    free(dir);
}

Test(gguf_families, mixtral_as_llama_with_experts) {
    check("mixtral", mixtral, "mixtral");
}

Test(gguf_families, qwen3next) {
    check("qwen3_next", qwen3_next, "qwen3_next");
}
