#include "models/synthetic_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ggml_types.h"
#include "core/half.h"
#include "core/util.h"
#include "formats/gguf_write.h"

/* random bytes reused with a per-tensor offset; odd-sized so rows never line up with it */
#define RAND_BYTES (((size_t)16 << 20) + 4097)

enum { G_QUANT, G_CONST, G_RAND, G_SSM_A };

typedef struct {
    sl_gguf_wtensor *t;
    int n, cap, oom;
} glist;

static void add(glist *L, const char *name, int type, int ndim, int64_t ne0, int64_t ne1, int64_t ne2, int kind,
                float arg) {
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 512;
        sl_gguf_wtensor *t = realloc(L->t, (size_t)cap * sizeof *t);
        if (!t) {
            L->oom = 1;
            return;
        }
        L->t = t;
        L->cap = cap;
    }
    sl_gguf_wtensor *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->ndim = ndim;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->kind = kind;
    t->arg = arg;
}

/* a rows x cols matrix (stacked over `experts` when > 0), ggml order: cols innermost; rows that are not
 * whole 256-value super-blocks fall back to Q5_0, as llama.cpp's quantizer does */
static void mat(glist *L, const char *name, int type, int64_t rows, int64_t cols, int64_t experts) {
    if (cols % sl_ggml_block_size(type)) type = SL_GGML_Q5_0;
    add(L, name, type, experts > 0 ? 3 : 2, cols, rows, experts, G_QUANT, 0);
}

static void vec(glist *L, const char *name, int64_t len, int kind, float arg) {
    add(L, name, SL_GGML_F32, 1, len, 0, 0, kind, arg);
}

static int is_full_attn(const sl_synth_shape *s, int l) {
    return (l + 1) % s->full_attn_every == 0;
}

static void tensors(const sl_synth_shape *s, int layers, glist *L) {
    const int Q = SL_GGML_Q4_K;
    char n[96];
    int H = s->hidden, qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
    int moe = !strcmp(s->arch, "qwen3_5_moe");
    mat(L, "token_embd.weight", Q, s->vocab, H, 0);
    for (int l = 0; l < layers; l++) {
#define P(fmt) (snprintf(n, sizeof n, "blk.%d." fmt, l), n)
        vec(L, P("attn_norm.weight"), H, G_CONST, 1.0f);
        if (moe)
            vec(L, P("post_attention_norm.weight"), H, G_CONST, 1.0f);
        else
            vec(L, P("ffn_norm.weight"), H, G_CONST, 1.0f);
        if (!moe) {
            mat(L, P("attn_q.weight"), Q, qd, H, 0);
            mat(L, P("attn_k.weight"), Q, kvd, H, 0);
            mat(L, P("attn_v.weight"), Q, kvd, H, 0);
            mat(L, P("attn_output.weight"), Q, H, qd, 0);
            mat(L, P("ffn_gate.weight"), Q, s->intermediate, H, 0);
            mat(L, P("ffn_up.weight"), Q, s->intermediate, H, 0);
            mat(L, P("ffn_down.weight"), Q, H, s->intermediate, 0);
            continue;
        }
        if (is_full_attn(s, l)) {
            mat(L, P("attn_q.weight"), Q, 2 * qd, H, 0); /* query and output gate per head */
            mat(L, P("attn_k.weight"), Q, kvd, H, 0);
            mat(L, P("attn_v.weight"), Q, kvd, H, 0);
            mat(L, P("attn_output.weight"), Q, H, qd, 0);
            vec(L, P("attn_q_norm.weight"), s->head_dim, G_CONST, 1.0f);
            vec(L, P("attn_k_norm.weight"), s->head_dim, G_CONST, 1.0f);
        } else {
            int kd = s->lin_k_heads * s->lin_k_dim, vd = s->lin_v_heads * s->lin_v_dim, conv = 2 * kd + vd;
            mat(L, P("attn_qkv.weight"), Q, conv, H, 0);
            mat(L, P("attn_gate.weight"), Q, vd, H, 0);
            mat(L, P("ssm_alpha.weight"), Q, s->lin_v_heads, H, 0);
            mat(L, P("ssm_beta.weight"), Q, s->lin_v_heads, H, 0);
            mat(L, P("ssm_out.weight"), Q, H, vd, 0);
            add(L, P("ssm_conv1d.weight"), SL_GGML_F32, 2, s->conv_kernel, conv, 0, G_RAND, 0);
            vec(L, P("ssm_a"), s->lin_v_heads, G_SSM_A, 0);
            vec(L, P("ssm_dt.bias"), s->lin_v_heads, G_CONST, 1.0f);
            vec(L, P("ssm_norm.weight"), s->lin_v_dim, G_CONST, 1.0f);
        }
        add(L, P("ffn_gate_inp.weight"), SL_GGML_F32, 2, H, s->experts, 0, G_RAND, 0);
        mat(L, P("ffn_gate_exps.weight"), Q, s->moe_inter, H, s->experts);
        mat(L, P("ffn_up_exps.weight"), Q, s->moe_inter, H, s->experts);
        mat(L, P("ffn_down_exps.weight"), Q, H, s->moe_inter, s->experts);
        mat(L, P("ffn_gate_shexp.weight"), Q, s->shared_inter, H, 0);
        mat(L, P("ffn_up_shexp.weight"), Q, s->shared_inter, H, 0);
        mat(L, P("ffn_down_shexp.weight"), Q, H, s->shared_inter, 0);
        vec(L, P("ffn_gate_inp_shexp.weight"), H, G_RAND, 0);
#undef P
    }
    vec(L, "output_norm.weight", H, G_CONST, 1.0f);
    mat(L, "output.weight", SL_GGML_Q6_K, s->vocab, H, 0);
}

uint64_t sl_synth_gguf_bytes(const sl_synth_shape *s, int layers) {
    glist L = {0};
    tensors(s, layers, &L);
    uint64_t total = 0;
    for (int i = 0; i < L.n && !L.oom; i++) total += sl_gguf_wtensor_bytes(&L.t[i]);
    free(L.t);
    return total;
}

/* ---- bytes ---- */

typedef struct {
    uint8_t *rand;
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *pctx;
} gctx;

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Block scales of the quant types, as (byte offset, f16 value) pairs. A step d * sc with the 6-bit sc
 * around 32 is ~0.02 / 2^bits, so |w| ~ 1e-2 as in trained weights and the MLX synthetic checkpoints;
 * Q4_K's dmin * min centres the values on zero on average. */
static int block_scales(int type, int *at, float *v) {
    switch (type) {
    case SL_GGML_Q4_K:
        at[0] = 0, v[0] = 4e-5f;
        at[1] = 2, v[1] = 3e-4f;
        return 2;
    case SL_GGML_Q6_K: at[0] = 208, v[0] = 5e-6f; return 1;
    case SL_GGML_Q5_0: at[0] = 0, v[0] = 6e-4f; return 1;
    default: return 0;
    }
}

static void fill(void *ctx, const sl_gguf_wtensor *t, uint64_t off, uint8_t *buf, size_t n) {
    gctx *g = ctx;
    uint64_t start = name_hash(t->name) % RAND_BYTES;
    if (t->kind == G_QUANT) {
        for (size_t k = 0; k < n;) {
            size_t at = (size_t)((start + off + k) % RAND_BYTES), m = RAND_BYTES - at < n - k ? RAND_BYTES - at : n - k;
            memcpy(buf + k, g->rand + at, m);
            k += m;
        }
        int fat[2];
        float fv[2];
        int nf = block_scales(t->type, fat, fv);
        uint64_t bb = sl_ggml_block_bytes(t->type);
        for (uint64_t b = off / bb; b * bb < off + n; b++)
            for (int i = 0; i < nf; i++) {
                uint16_t h = sl_f32_to_f16(fv[i]);
                for (int j = 0; j < 2; j++) {
                    uint64_t p = b * bb + (uint64_t)fat[i] + (uint64_t)j;
                    if (p >= off && p < off + n) buf[p - off] = (uint8_t)(h >> (8 * j));
                }
            }
        return;
    }
    /* F32 tensors: whole elements, as the writer's chunks are multiples of 4 bytes */
    for (size_t i = 0; i < n; i += 4) {
        uint64_t el = (off + i) / 4;
        float v = t->arg;
        if (t->kind == G_SSM_A) {
            v = -(float)(1 + el % 16); /* -exp(A_log), A spread over 1..16 as the models are initialised */
        } else if (t->kind == G_RAND) {
            /* sign and magnitude 2^-9..2^-6 from two random bytes */
            const uint8_t *r = g->rand + (start + 2 * el) % (RAND_BYTES - 1);
            uint32_t u = ((uint32_t)((r[1] & 0x80) | (0x3B + (r[1] & 1))) << 24) | ((uint32_t)r[0] << 16);
            memcpy(&v, &u, 4);
        }
        memcpy(buf + i, &v, 4);
    }
}

static void progress(void *ctx, uint64_t done, uint64_t total) {
    gctx *g = ctx;
    if (g->progress) g->progress(g->pctx, done, total);
}

int sl_synth_gguf_write(const sl_synth_shape *s, int layers, const char *path,
                        void (*prog)(void *ctx, uint64_t done, uint64_t total), void *pctx, sl_err *e) {
    int moe = !strcmp(s->arch, "qwen3_5_moe");
    const char *a = moe ? "qwen35moe" : "llama";
    char keys[24][80];
    sl_gguf_wkv kv[24];
    int nk = 0;
#define KV(suffix, ty, iv, fv)                                                                                         \
    do {                                                                                                               \
        snprintf(keys[nk], sizeof keys[nk], "%s.%s", a, suffix);                                                       \
        kv[nk] = (sl_gguf_wkv){.key = keys[nk], .type = ty, .i = iv, .f = fv};                                         \
        nk++;                                                                                                          \
    } while (0)
    kv[nk++] = (sl_gguf_wkv){.key = "general.architecture", .type = SL_GGUF_STRING, .s = a};
    kv[nk++] = (sl_gguf_wkv){.key = "general.name", .type = SL_GGUF_STRING, .s = s->name};
    KV("block_count", SL_GGUF_U32, layers, 0);
    KV("context_length", SL_GGUF_U32, s->max_pos, 0);
    KV("embedding_length", SL_GGUF_U32, s->hidden, 0);
    KV("attention.head_count", SL_GGUF_U32, s->heads, 0);
    KV("attention.head_count_kv", SL_GGUF_U32, s->kv_heads, 0);
    KV("attention.key_length", SL_GGUF_U32, s->head_dim, 0);
    KV("attention.value_length", SL_GGUF_U32, s->head_dim, 0);
    KV("rope.freq_base", SL_GGUF_F32, 0, s->rope_theta);
    KV("attention.layer_norm_rms_epsilon", SL_GGUF_F32, 0, moe ? 1e-6 : 1e-5);
    if (moe) {
        KV("rope.dimension_count", SL_GGUF_U32, s->head_dim / 4, 0); /* partial rotary factor 0.25 */
        KV("expert_count", SL_GGUF_U32, s->experts, 0);
        KV("expert_used_count", SL_GGUF_U32, s->top_k, 0);
        KV("expert_feed_forward_length", SL_GGUF_U32, s->moe_inter, 0);
        KV("expert_shared_feed_forward_length", SL_GGUF_U32, s->shared_inter, 0);
        KV("ssm.conv_kernel", SL_GGUF_U32, s->conv_kernel, 0);
        KV("ssm.state_size", SL_GGUF_U32, s->lin_k_dim, 0);
        KV("ssm.group_count", SL_GGUF_U32, s->lin_k_heads, 0);
        KV("ssm.time_step_rank", SL_GGUF_U32, s->lin_v_heads, 0);
        KV("ssm.inner_size", SL_GGUF_U32, s->lin_v_heads * s->lin_v_dim, 0);
        KV("full_attention_interval", SL_GGUF_U32, s->full_attn_every, 0);
    } else {
        KV("feed_forward_length", SL_GGUF_U32, s->intermediate, 0);
    }
#undef KV
    glist L = {0};
    tensors(s, layers, &L);
    gctx g = {malloc(RAND_BYTES), prog, pctx};
    int rc = -1;
    if (L.oom || !g.rand) {
        sl_fail(e, "out of memory");
        goto done;
    }
    uint64_t st = 0x6767756full;
    for (size_t i = 0; i < RAND_BYTES; i += 8) {
        uint64_t r = sl_splitmix64(&st);
        for (size_t k = 0; k < 8 && i + k < RAND_BYTES; k++) g.rand[i + k] = (uint8_t)(r >> (8 * k));
    }
    rc = sl_gguf_write(path, kv, nk, L.t, L.n, fill, progress, &g, e);
done:
    free(g.rand);
    free(L.t);
    return rc;
}
