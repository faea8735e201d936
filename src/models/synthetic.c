#include "models/synthetic.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/half.h"
#include "core/util.h"
#include "formats/st_write.h"
#include "models/synthetic_gguf.h"

/* Bumped whenever the bytes written change, so stale checkpoints are regenerated. */
#define SYNTH_VERSION 1
#define SHARD_BYTES ((uint64_t)4 << 30)
#define GROUP 64
/* the random block: odd-sized (in 2-byte elements) so rows of common widths never line up with it */
#define BLOCK_BYTES (((size_t)16 << 20) + 4098)

/* Dimensions as published in each model's config.json. */
#define QWEN35_LINEAR .lin_k_heads = 16, .lin_k_dim = 128, .lin_v_dim = 128, .conv_kernel = 4, .full_attn_every = 4
#define HF_MLX_GGUF "bf16 mlx4 mlx8 q4k"
#define DEEPSEEK_V3_YARN                                                                                               \
    .yarn_factor = 40.0, .yarn_beta_fast = 32.0, .yarn_beta_slow = 1.0, .yarn_mscale = 1.0,                            \
    .yarn_mscale_all_dim = 1.0, .yarn_orig_max_pos = 4096
#define GPT_OSS_YARN .yarn_factor = 32.0, .yarn_beta_fast = 32.0, .yarn_beta_slow = 1.0, .yarn_orig_max_pos = 4096
static const sl_synth_shape shapes[] = {
    {.name = "llama3-8b",
     .arch = "llama",
     .about = "Llama 3 8B: 32 layers, hidden 4096, GQA 32/8, MLP 14336",
     .quants = HF_MLX_GGUF,
     .vocab = 128256,
     .hidden = 4096,
     .layers = 32,
     .heads = 32,
     .kv_heads = 8,
     .head_dim = 128,
     .intermediate = 14336,
     .rope_theta = 500000.0,
     .max_pos = 8192},
    {.name = "qwen3.5-35b-a3b",
     .arch = "qwen3_5_moe",
     .about = "Qwen3.5-35B-A3B: 40 layers (3 delta-net : 1 attention), hidden 2048, 256 experts top-8 of 512",
     .quants = HF_MLX_GGUF,
     .vocab = 248320,
     .hidden = 2048,
     .layers = 40,
     .heads = 16,
     .kv_heads = 2,
     .head_dim = 256,
     .experts = 256,
     .top_k = 8,
     .moe_inter = 512,
     .shared_inter = 512,
     .lin_v_heads = 32,
     QWEN35_LINEAR,
     .rope_theta = 10000000.0,
     .max_pos = 262144},
    {.name = "qwen3.5-122b-a10b",
     .arch = "qwen3_5_moe",
     .about = "Qwen3.5-122B-A10B: 48 layers (3 delta-net : 1 attention), hidden 3072, 256 experts top-8 of 1024",
     .quants = HF_MLX_GGUF,
     .vocab = 248320,
     .hidden = 3072,
     .layers = 48,
     .heads = 32,
     .kv_heads = 2,
     .head_dim = 256,
     .experts = 256,
     .top_k = 8,
     .moe_inter = 1024,
     .shared_inter = 1024,
     .lin_v_heads = 64,
     QWEN35_LINEAR,
     .rope_theta = 10000000.0,
     .max_pos = 262144},
    {.name = "qwen3.5-397b-a17b",
     .arch = "qwen3_5_moe",
     .about = "Qwen3.5-397B-A17B: 60 layers (3 delta-net : 1 attention), hidden 4096, 512 experts top-10 of 1024",
     .quants = HF_MLX_GGUF,
     .vocab = 248320,
     .hidden = 4096,
     .layers = 60,
     .heads = 32,
     .kv_heads = 2,
     .head_dim = 256,
     .experts = 512,
     .top_k = 10,
     .moe_inter = 1024,
     .shared_inter = 1024,
     .lin_v_heads = 64,
     QWEN35_LINEAR,
     .rope_theta = 10000000.0,
     .max_pos = 262144},
    {.name = "deepseek-v3",
     .arch = "deepseek_v3",
     .about = "DeepSeek-V3 671B (37B active): 61 layers (3 dense), hidden 7168, MLA 128 heads, 256 experts top-8 "
              "+ 1 shared",
     .quants = "fp8 bf16",
     .vocab = 129280,
     .hidden = 7168,
     .layers = 61,
     .heads = 128,
     .kv_heads = 128,
     .intermediate = 18432,
     .experts = 256,
     .top_k = 8,
     .moe_inter = 2048,
     .shared_inter = 2048,
     .q_lora = 1536,
     .kv_lora = 512,
     .qk_nope = 128,
     .qk_rope = 64,
     .v_head = 128,
     .first_dense = 3,
     .n_group = 8,
     .topk_group = 4,
     .routed_scale = 2.5,
     DEEPSEEK_V3_YARN,
     .rope_theta = 10000.0,
     .max_pos = 163840},
    {.name = "gpt-oss-120b",
     .arch = "gpt_oss",
     .about =
         "gpt-oss-120b 117B (5.1B active): 36 layers (sliding 128 : full), hidden 2880, GQA 64/8, 128 experts top-4",
     .quants = "mxfp4 bf16",
     .vocab = 201088,
     .hidden = 2880,
     .layers = 36,
     .heads = 64,
     .kv_heads = 8,
     .head_dim = 64,
     .intermediate = 2880,
     .experts = 128,
     .top_k = 4,
     .moe_inter = 2880,
     .sliding_window = 128,
     .swiglu_limit = 7.0,
     GPT_OSS_YARN,
     .rope_theta = 150000.0,
     .max_pos = 131072},
    {.name = "gpt-oss-20b",
     .arch = "gpt_oss",
     .about = "gpt-oss-20b 21B (3.6B active): 24 layers (sliding 128 : full), hidden 2880, GQA 64/8, 32 experts top-4",
     .quants = "mxfp4 bf16",
     .vocab = 201088,
     .hidden = 2880,
     .layers = 24,
     .heads = 64,
     .kv_heads = 8,
     .head_dim = 64,
     .intermediate = 2880,
     .experts = 32,
     .top_k = 4,
     .moe_inter = 2880,
     .sliding_window = 128,
     .swiglu_limit = 7.0,
     GPT_OSS_YARN,
     .rope_theta = 150000.0,
     .max_pos = 131072},
    /* small shapes for the tests */
    {.name = "tiny-llama",
     .arch = "llama",
     .about = "a 4-layer llama for tests",
     .quants = HF_MLX_GGUF,
     .vocab = 512,
     .hidden = 256,
     .layers = 4,
     .heads = 8,
     .kv_heads = 4,
     .head_dim = 32,
     .intermediate = 512,
     .rope_theta = 500000.0,
     .max_pos = 4096},
    {.name = "tiny-qwen3.5-moe",
     .arch = "qwen3_5_moe",
     .about = "a 4-layer Qwen3.5-MoE for tests: 16 experts top-4",
     .quants = HF_MLX_GGUF,
     .vocab = 512,
     .hidden = 256,
     .layers = 4,
     .heads = 4,
     .kv_heads = 2,
     .head_dim = 64,
     .experts = 16,
     .top_k = 4,
     .moe_inter = 128,
     .shared_inter = 128,
     .lin_k_heads = 2,
     .lin_v_heads = 4,
     .lin_k_dim = 64,
     .lin_v_dim = 64,
     .conv_kernel = 4,
     .full_attn_every = 4,
     .rope_theta = 10000000.0,
     .max_pos = 4096},
    {.name = "tiny-deepseek-v3",
     .arch = "deepseek_v3",
     .about = "a 4-layer DeepSeek-V3 for tests (1 dense): 16 experts top-4 in 4 groups",
     .quants = "fp8 bf16",
     .vocab = 512,
     .hidden = 256,
     .layers = 4,
     .heads = 4,
     .kv_heads = 4,
     .intermediate = 384,
     .experts = 16,
     .top_k = 4,
     .moe_inter = 128,
     .shared_inter = 128,
     .q_lora = 192, /* not whole 128-row FP8 tiles, as kv_a_proj_with_mqa's 576 rows are not */
     .kv_lora = 128,
     .qk_nope = 32,
     .qk_rope = 16,
     .v_head = 32,
     .first_dense = 1,
     .n_group = 4,
     .topk_group = 2,
     .routed_scale = 2.5,
     DEEPSEEK_V3_YARN,
     .rope_theta = 10000.0,
     .max_pos = 163840},
    {.name = "tiny-gpt-oss",
     .arch = "gpt_oss",
     .about = "a 4-layer gpt-oss for tests (sliding 16 : full): 16 experts top-4",
     .quants = "mxfp4 bf16",
     .vocab = 512,
     .hidden = 256,
     .layers = 4,
     .heads = 8,
     .kv_heads = 2,
     .head_dim = 32,
     .intermediate = 256,
     .experts = 16,
     .top_k = 4,
     .moe_inter = 256,
     .sliding_window = 16,
     .swiglu_limit = 7.0,
     GPT_OSS_YARN,
     .rope_theta = 150000.0,
     .max_pos = 131072},
    {.name = NULL},
};

const sl_synth_shape *sl_synth_shapes(void) {
    return shapes;
}

const sl_synth_shape *sl_synth_find(const char *name) {
    for (const sl_synth_shape *s = shapes; s->name; s++)
        if (!strcmp(s->name, name)) return s;
    return NULL;
}

static const char *quant_names[] = {"bf16", "mlx4", "mlx8", "q4k", "fp8", "mxfp4"};
#define N_QUANTS ((int)(sizeof quant_names / sizeof quant_names[0]))

int sl_synth_parse_quant(const char *s, sl_synth_quant *q) {
    for (int i = 0; i < N_QUANTS; i++)
        if (!strcmp(s, quant_names[i])) {
            *q = (sl_synth_quant)i;
            return 0;
        }
    return -1;
}

const char *sl_synth_quant_name(sl_synth_quant q) {
    return quant_names[q];
}

int sl_synth_takes(const sl_synth_shape *s, sl_synth_quant q) {
    size_t n = strlen(quant_names[q]);
    for (const char *p = s->quants; (p = strstr(p, quant_names[q])); p += n)
        if ((p == s->quants || p[-1] == ' ') && (p[n] == ' ' || !p[n])) return 1;
    return 0;
}

sl_synth_quant sl_synth_default_quant(const sl_synth_shape *s) {
    char first[16];
    sl_synth_quant q = SL_SYNTH_BF16;
    snprintf(first, sizeof first, "%.*s", (int)strcspn(s->quants, " "), s->quants);
    sl_synth_parse_quant(first, &q);
    return q;
}

/* ---- tensor list ---- */

enum {
    K_RAND_BF16,
    K_RAND_BYTES,
    K_SCALES,
    K_BIASES,
    K_CONST_BF16,
    K_ALOG,
    K_RAND_FP8,
    K_FP8_SCALE,
    K_E8M0,
    K_SMALL_F32
};

typedef struct {
    sl_st_wtensor *t;
    int n, cap;
    int bits; /* 0: bf16 checkpoint */
    sl_synth_quant q;
    int oom;
} tlist;

static sl_st_wtensor *add(tlist *L, const char *name, sl_st_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2,
                          int kind, float arg) {
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 1024;
        sl_st_wtensor *t = realloc(L->t, (size_t)cap * sizeof *t);
        if (!t) {
            L->oom = 1;
            return NULL;
        }
        L->t = t;
        L->cap = cap;
    }
    sl_st_wtensor *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->kind = kind;
    t->arg = arg;
    return t;
}

/* A linear layer `mod` of rows x cols (stacked over `experts` when > 0): bf16 weight, or MLX packed
 * weight + scales + biases at `bits` (the checkpoint's bits unless the module overrides them). */
static void add_linear(tlist *L, const char *mod, int64_t experts, int64_t rows, int64_t cols, int bits) {
    char n[192];
    int nd = experts > 0 ? 3 : 2;
    int64_t a = experts > 0 ? experts : rows, b = experts > 0 ? rows : cols, c = experts > 0 ? cols : 0;
    snprintf(n, sizeof n, "%s.weight", mod);
    if (!L->bits) {
        add(L, n, SL_ST_BF16, nd, a, b, c, K_RAND_BF16, 0);
        return;
    }
    int64_t words = cols * bits / 32, groups = cols / GROUP;
    if (experts > 0)
        add(L, n, SL_ST_U32, 3, experts, rows, words, K_RAND_BYTES, 0);
    else
        add(L, n, SL_ST_U32, 2, rows, words, 0, K_RAND_BYTES, 0);
    const char *sfx[2] = {"scales", "biases"};
    for (int i = 0; i < 2; i++) {
        snprintf(n, sizeof n, "%s.%s", mod, sfx[i]);
        if (experts > 0)
            add(L, n, SL_ST_BF16, 3, experts, rows, groups, i ? K_BIASES : K_SCALES, (float)bits);
        else
            add(L, n, SL_ST_BF16, 2, rows, groups, 0, i ? K_BIASES : K_SCALES, (float)bits);
    }
}

static void add_vec(tlist *L, const char *name, int64_t len, float value) {
    add(L, name, SL_ST_BF16, 1, len, 0, 0, K_CONST_BF16, value);
}

/* A linear layer as DeepSeek ships it: a float8 e4m3 weight with a float32 weight_scale_inv per 128x128
 * tile (partial tiles at the edges), or bf16. */
#define FP8_TILE 128
static void add_fp8_linear(tlist *L, const char *mod, int64_t rows, int64_t cols) {
    char n[192];
    snprintf(n, sizeof n, "%s.weight", mod);
    if (L->q != SL_SYNTH_FP8) {
        add(L, n, SL_ST_BF16, 2, rows, cols, 0, K_RAND_BF16, 0);
        return;
    }
    add(L, n, SL_ST_F8_E4M3, 2, rows, cols, 0, K_RAND_FP8, 0);
    snprintf(n, sizeof n, "%s.weight_scale_inv", mod);
    add(L, n, SL_ST_F32, 2, (rows + FP8_TILE - 1) / FP8_TILE, (cols + FP8_TILE - 1) / FP8_TILE, 0, K_FP8_SCALE, 0);
}

static int n_layers(const sl_synth_shape *s, int layers) {
    return layers > 0 && layers < s->layers ? layers : s->layers;
}

static int is_full_attn(const sl_synth_shape *s, int l) {
    return (l + 1) % s->full_attn_every == 0;
}

static void llama_tensors(const sl_synth_shape *s, int layers, tlist *L) {
    char n[192];
    int H = s->hidden, qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim, bits = L->bits;
    add_linear(L, "model.embed_tokens", 0, s->vocab, H, bits);
    for (int l = 0; l < layers; l++) {
#define P(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
        add_vec(L, P("input_layernorm.weight"), H, 1.0f);
        add_vec(L, P("post_attention_layernorm.weight"), H, 1.0f);
        add_linear(L, P("self_attn.q_proj"), 0, qd, H, bits);
        add_linear(L, P("self_attn.k_proj"), 0, kvd, H, bits);
        add_linear(L, P("self_attn.v_proj"), 0, kvd, H, bits);
        add_linear(L, P("self_attn.o_proj"), 0, H, qd, bits);
        add_linear(L, P("mlp.gate_proj"), 0, s->intermediate, H, bits);
        add_linear(L, P("mlp.up_proj"), 0, s->intermediate, H, bits);
        add_linear(L, P("mlp.down_proj"), 0, H, s->intermediate, bits);
#undef P
    }
    add_vec(L, "model.norm.weight", H, 1.0f);
    add_linear(L, "lm_head", 0, s->vocab, H, bits);
}

/* Qwen3.5-MoE in the layout its checkpoints use: the Hub's vision-language layout with fused experts for
 * bf16, the MLX conversion's (switch_mlp, [C, K, 1] conv, (1 + w) folded into the norms) for MLX. */
static void qwen35_tensors(const sl_synth_shape *s, int layers, tlist *L) {
    char n[192];
    int mlx = L->bits != 0, bits = L->bits, gate_bits = mlx ? 8 : 0;
    const char *pre = mlx ? "language_model.model." : "model.language_model.";
    float norm = mlx ? 1.0f : 0.0f; /* the checkpoint stores w of (1 + w) unless folded */
    int H = s->hidden, E = s->experts, I = s->moe_inter;
    int qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
    int kd = s->lin_k_heads * s->lin_k_dim, vd = s->lin_v_heads * s->lin_v_dim, conv = 2 * kd + vd;
#define P(fmt) (snprintf(n, sizeof n, "%slayers.%d." fmt, pre, l), n)
    snprintf(n, sizeof n, "%sembed_tokens", pre);
    add_linear(L, n, 0, s->vocab, H, bits);
    for (int l = 0; l < layers; l++) {
        add_vec(L, P("input_layernorm.weight"), H, norm);
        add_vec(L, P("post_attention_layernorm.weight"), H, norm);
        if (is_full_attn(s, l)) {
            add_linear(L, P("self_attn.q_proj"), 0, 2 * qd, H, bits); /* query and output gate per head */
            add_linear(L, P("self_attn.k_proj"), 0, kvd, H, bits);
            add_linear(L, P("self_attn.v_proj"), 0, kvd, H, bits);
            add_linear(L, P("self_attn.o_proj"), 0, H, qd, bits);
            add_vec(L, P("self_attn.q_norm.weight"), s->head_dim, norm);
            add_vec(L, P("self_attn.k_norm.weight"), s->head_dim, norm);
        } else {
            add(L, P("linear_attn.A_log"), SL_ST_F32, 1, s->lin_v_heads, 0, 0, K_ALOG, 0);
            if (mlx)
                add(L, P("linear_attn.conv1d.weight"), SL_ST_BF16, 3, conv, s->conv_kernel, 1, K_RAND_BF16, 0);
            else
                add(L, P("linear_attn.conv1d.weight"), SL_ST_BF16, 3, conv, 1, s->conv_kernel, K_RAND_BF16, 0);
            add_vec(L, P("linear_attn.dt_bias"), s->lin_v_heads, 1.0f);
            add_linear(L, P("linear_attn.in_proj_a"), 0, s->lin_v_heads, H, bits);
            add_linear(L, P("linear_attn.in_proj_b"), 0, s->lin_v_heads, H, bits);
            add_linear(L, P("linear_attn.in_proj_qkv"), 0, conv, H, bits);
            add_linear(L, P("linear_attn.in_proj_z"), 0, vd, H, bits);
            add_vec(L, P("linear_attn.norm.weight"), s->lin_v_dim, 1.0f);
            add_linear(L, P("linear_attn.out_proj"), 0, H, vd, bits);
        }
        add_linear(L, P("mlp.gate"), 0, E, H, gate_bits);
        if (mlx) {
            add_linear(L, P("mlp.switch_mlp.gate_proj"), E, I, H, bits);
            add_linear(L, P("mlp.switch_mlp.up_proj"), E, I, H, bits);
            add_linear(L, P("mlp.switch_mlp.down_proj"), E, H, I, bits);
        } else {
            add(L, P("mlp.experts.gate_up_proj"), SL_ST_BF16, 3, E, 2 * I, H, K_RAND_BF16, 0);
            add(L, P("mlp.experts.down_proj"), SL_ST_BF16, 3, E, H, I, K_RAND_BF16, 0);
        }
        add_linear(L, P("mlp.shared_expert.gate_proj"), 0, s->shared_inter, H, bits);
        add_linear(L, P("mlp.shared_expert.up_proj"), 0, s->shared_inter, H, bits);
        add_linear(L, P("mlp.shared_expert.down_proj"), 0, H, s->shared_inter, bits);
        add_linear(L, P("mlp.shared_expert_gate"), 0, 1, H, gate_bits);
    }
#undef P
    snprintf(n, sizeof n, "%snorm.weight", pre);
    add_vec(L, n, H, norm);
    add_linear(L, mlx ? "language_model.lm_head" : "lm_head", 0, s->vocab, H, bits);
}

/* DeepSeek-V3 as deepseek-ai ships it: every linear layer of the blocks in block FP8 (bf16 for --quant
 * bf16), experts one set of matrices each; embeddings, norms and routers bf16, the router's correction
 * bias float32. The multi-token-prediction layer (model.layers.61) is left out: a decoder never reads it. */
static void deepseek_tensors(const sl_synth_shape *s, int layers, tlist *L) {
    char n[192];
    int H = s->hidden, nh = s->heads;
    add(L, "model.embed_tokens.weight", SL_ST_BF16, 2, s->vocab, H, 0, K_RAND_BF16, 0);
    for (int l = 0; l < layers; l++) {
#define P(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
        add_vec(L, P("input_layernorm.weight"), H, 1.0f);
        add_vec(L, P("post_attention_layernorm.weight"), H, 1.0f);
        add_fp8_linear(L, P("self_attn.q_a_proj"), s->q_lora, H);
        add_vec(L, P("self_attn.q_a_layernorm.weight"), s->q_lora, 1.0f);
        add_fp8_linear(L, P("self_attn.q_b_proj"), nh * (s->qk_nope + s->qk_rope), s->q_lora);
        add_fp8_linear(L, P("self_attn.kv_a_proj_with_mqa"), s->kv_lora + s->qk_rope, H);
        add_vec(L, P("self_attn.kv_a_layernorm.weight"), s->kv_lora, 1.0f);
        add_fp8_linear(L, P("self_attn.kv_b_proj"), nh * (s->qk_nope + s->v_head), s->kv_lora);
        add_fp8_linear(L, P("self_attn.o_proj"), H, nh * s->v_head);
        if (l < s->first_dense) {
            add_fp8_linear(L, P("mlp.gate_proj"), s->intermediate, H);
            add_fp8_linear(L, P("mlp.up_proj"), s->intermediate, H);
            add_fp8_linear(L, P("mlp.down_proj"), H, s->intermediate);
            continue;
        }
        add(L, P("mlp.gate.weight"), SL_ST_BF16, 2, s->experts, H, 0, K_RAND_BF16, 0);
        add(L, P("mlp.gate.e_score_correction_bias"), SL_ST_F32, 1, s->experts, 0, 0, K_SMALL_F32, 0);
        char e[160];
        for (int x = 0; x < s->experts; x++) {
            snprintf(e, sizeof e, "model.layers.%d.mlp.experts.%d", l, x);
            snprintf(n, sizeof n, "%s.gate_proj", e);
            add_fp8_linear(L, n, s->moe_inter, H);
            snprintf(n, sizeof n, "%s.up_proj", e);
            add_fp8_linear(L, n, s->moe_inter, H);
            snprintf(n, sizeof n, "%s.down_proj", e);
            add_fp8_linear(L, n, H, s->moe_inter);
        }
        add_fp8_linear(L, P("mlp.shared_experts.gate_proj"), s->shared_inter, H);
        add_fp8_linear(L, P("mlp.shared_experts.up_proj"), s->shared_inter, H);
        add_fp8_linear(L, P("mlp.shared_experts.down_proj"), H, s->shared_inter);
#undef P
    }
    add_vec(L, "model.norm.weight", H, 1.0f);
    add(L, "lm_head.weight", SL_ST_BF16, 2, s->vocab, H, 0, K_RAND_BF16, 0);
}

static int is_sliding(const sl_synth_shape *s, int l) {
    return s->sliding_window > 0 && l % 2 == 0;
}

/* gpt-oss as OpenAI ships it: experts stacked per layer in MXFP4 (uint8 blocks [E, out, in / 32, 16] of
 * two e2m1 codes a byte and e8m0 scales [E, out, in / 32]), or for bf16 as transformers stores them
 * (inputs first: gate_up_proj [E, H, 2I], down_proj [E, I, H]); everything else bf16. */
static void gpt_oss_tensors(const sl_synth_shape *s, int layers, tlist *L) {
    char n[192];
    int H = s->hidden, E = s->experts, I = s->moe_inter;
    int qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim, mx = L->q == SL_SYNTH_MXFP4;
    add(L, "model.embed_tokens.weight", SL_ST_BF16, 2, s->vocab, H, 0, K_RAND_BF16, 0);
    for (int l = 0; l < layers; l++) {
#define P(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
        add_vec(L, P("input_layernorm.weight"), H, 1.0f);
        add_vec(L, P("post_attention_layernorm.weight"), H, 1.0f);
        const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        const int rows[4] = {qd, kvd, kvd, H}, cols[4] = {H, H, H, qd};
        for (int i = 0; i < 4; i++) {
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.weight", l, proj[i]);
            add(L, n, SL_ST_BF16, 2, rows[i], cols[i], 0, K_RAND_BF16, 0);
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.bias", l, proj[i]);
            add(L, n, SL_ST_BF16, 1, rows[i], 0, 0, K_RAND_BF16, 0);
        }
        add(L, P("self_attn.sinks"), SL_ST_BF16, 1, s->heads, 0, 0, K_RAND_BF16, 0);
        add(L, P("mlp.router.weight"), SL_ST_BF16, 2, E, H, 0, K_RAND_BF16, 0);
        add(L, P("mlp.router.bias"), SL_ST_BF16, 1, E, 0, 0, K_RAND_BF16, 0);
        const char *part[2] = {"gate_up_proj", "down_proj"};
        const int out[2] = {2 * I, H}, in[2] = {H, I};
        for (int i = 0; i < 2; i++) {
            sl_st_wtensor *t;
            if (mx) {
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s_blocks", l, part[i]);
                if ((t = add(L, n, SL_ST_U8, 4, E, out[i], in[i] / 32, K_RAND_BYTES, 0))) t->shape[3] = 16;
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s_scales", l, part[i]);
                add(L, n, SL_ST_U8, 3, E, out[i], in[i] / 32, K_E8M0, 0);
            } else {
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s", l, part[i]);
                add(L, n, SL_ST_BF16, 3, E, in[i], out[i], K_RAND_BF16, 0);
            }
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s_bias", l, part[i]);
            add(L, n, SL_ST_BF16, 2, E, out[i], 0, K_RAND_BF16, 0);
        }
#undef P
    }
    add_vec(L, "model.norm.weight", H, 1.0f);
    add(L, "lm_head.weight", SL_ST_BF16, 2, s->vocab, H, 0, K_RAND_BF16, 0);
}

static int build(const sl_synth_shape *s, sl_synth_quant q, int layers, tlist *L) {
    memset(L, 0, sizeof *L);
    L->bits = q == SL_SYNTH_MLX4 ? 4 : q == SL_SYNTH_MLX8 ? 8 : 0;
    L->q = q;
    if (!strcmp(s->arch, "llama"))
        llama_tensors(s, n_layers(s, layers), L);
    else if (!strcmp(s->arch, "deepseek_v3"))
        deepseek_tensors(s, n_layers(s, layers), L);
    else if (!strcmp(s->arch, "gpt_oss"))
        gpt_oss_tensors(s, n_layers(s, layers), L);
    else
        qwen35_tensors(s, n_layers(s, layers), L);
    return L->oom ? -1 : 0;
}

uint64_t sl_synth_bytes(const sl_synth_shape *s, sl_synth_quant q, int layers) {
    if (q == SL_SYNTH_Q4K) return sl_synth_gguf_bytes(s, n_layers(s, layers));
    tlist L;
    uint64_t total = 0;
    if (!build(s, q, layers, &L))
        for (int i = 0; i < L.n; i++) total += sl_st_wtensor_bytes(&L.t[i]);
    free(L.t);
    return total;
}

/* ---- config.json ---- */

static json_t *llama_config(const sl_synth_shape *s, int layers) {
    return json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:s,s:b,s:b,s:i,s:i,s:s}", "architectures",
                     "LlamaForCausalLM", "model_type", "llama", "vocab_size", s->vocab, "hidden_size", s->hidden,
                     "intermediate_size", s->intermediate, "num_hidden_layers", layers, "num_attention_heads", s->heads,
                     "num_key_value_heads", s->kv_heads, "head_dim", s->head_dim, "max_position_embeddings", s->max_pos,
                     "rope_theta", s->rope_theta, "rms_norm_eps", 1e-5, "hidden_act", "silu", "tie_word_embeddings", 0,
                     "attention_bias", 0, "bos_token_id", 1, "eos_token_id", 2, "torch_dtype", "bfloat16");
}

static json_t *qwen35_config(const sl_synth_shape *s, int layers) {
    json_t *types = json_array();
    for (int l = 0; l < layers; l++)
        json_array_append_new(types, json_string(is_full_attn(s, l) ? "full_attention" : "linear_attention"));
    json_t *tc = json_pack(
        "{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:s,s:{s:f,s:f,s:s},s:f,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:b,s:o,"
        "s:b}",
        "model_type", "qwen3_5_moe_text", "vocab_size", s->vocab, "hidden_size", s->hidden, "num_hidden_layers", layers,
        "num_attention_heads", s->heads, "num_key_value_heads", s->kv_heads, "head_dim", s->head_dim,
        "max_position_embeddings", s->max_pos, "rms_norm_eps", 1e-6, "hidden_act", "silu", "rope_parameters",
        "rope_theta", s->rope_theta, "partial_rotary_factor", 0.25, "rope_type", "default", "partial_rotary_factor",
        0.25, "linear_conv_kernel_dim", s->conv_kernel, "linear_key_head_dim", s->lin_k_dim, "linear_value_head_dim",
        s->lin_v_dim, "linear_num_key_heads", s->lin_k_heads, "linear_num_value_heads", s->lin_v_heads,
        "moe_intermediate_size", s->moe_inter, "shared_expert_intermediate_size", s->shared_inter,
        "num_experts_per_tok", s->top_k, "num_experts", s->experts, "norm_topk_prob", 1, "layer_types", types,
        "tie_word_embeddings", 0);
    return json_pack("{s:[s],s:s,s:b,s:o}", "architectures", "Qwen3_5MoeForConditionalGeneration", "model_type",
                     "qwen3_5_moe", "tie_word_embeddings", 0, "text_config", tc);
}

/* YaRN as the published configs write it (rope_scaling beside rope_theta) */
static json_t *yarn_json(const sl_synth_shape *s) {
    json_t *y = json_pack("{s:f,s:f,s:f,s:i}", "beta_fast", s->yarn_beta_fast, "beta_slow", s->yarn_beta_slow, "factor",
                          s->yarn_factor, "original_max_position_embeddings", s->yarn_orig_max_pos);
    if (y && s->yarn_mscale > 0) {
        json_object_set_new(y, "mscale", json_real(s->yarn_mscale));
        json_object_set_new(y, "mscale_all_dim", json_real(s->yarn_mscale_all_dim));
    }
    if (y) json_object_set_new(y, "type", json_string("yarn"));
    return y;
}

/* deepseek-ai/DeepSeek-V3's config.json, with num_nextn_predict_layers 0 since no such layer is written */
static json_t *deepseek_config(const sl_synth_shape *s, int layers, sl_synth_quant q) {
    json_t *c = json_pack(
        "{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:i,s:i,s:i,s:i,s:i,s:s,s:i,s:i,s:i,s:i,s:i,s:b,"
        "s:s,s:s,s:i,s:f,s:f,s:o,s:b,s:b,s:i,s:i,s:i,s:s}",
        "architectures", "DeepseekV3ForCausalLM", "model_type", "deepseek_v3", "vocab_size", s->vocab, "hidden_size",
        s->hidden, "intermediate_size", s->intermediate, "moe_intermediate_size", s->moe_inter, "num_hidden_layers",
        layers, "num_attention_heads", s->heads, "num_key_value_heads", s->kv_heads, "n_shared_experts",
        s->shared_inter / s->moe_inter, "n_routed_experts", s->experts, "routed_scaling_factor", s->routed_scale,
        "kv_lora_rank", s->kv_lora, "q_lora_rank", s->q_lora, "qk_rope_head_dim", s->qk_rope, "v_head_dim", s->v_head,
        "qk_nope_head_dim", s->qk_nope, "topk_method", "noaux_tc", "n_group", s->n_group, "topk_group", s->topk_group,
        "num_experts_per_tok", s->top_k, "moe_layer_freq", 1, "first_k_dense_replace", s->first_dense, "norm_topk_prob",
        1, "scoring_func", "sigmoid", "hidden_act", "silu", "max_position_embeddings", s->max_pos, "rms_norm_eps", 1e-6,
        "rope_theta", s->rope_theta, "rope_scaling", yarn_json(s), "attention_bias", 0, "tie_word_embeddings", 0,
        "num_nextn_predict_layers", 0, "bos_token_id", 0, "eos_token_id", 1, "torch_dtype", "bfloat16");
    if (c && q == SL_SYNTH_FP8)
        json_object_set_new(c, "quantization_config",
                            json_pack("{s:s,s:s,s:s,s:[i,i]}", "activation_scheme", "dynamic", "fmt", "e4m3",
                                      "quant_method", "fp8", "weight_block_size", FP8_TILE, FP8_TILE));
    return c;
}

/* openai/gpt-oss-*'s config.json */
static json_t *gpt_oss_config(const sl_synth_shape *s, int layers, sl_synth_quant q) {
    json_t *types = json_array();
    for (int l = 0; l < layers; l++)
        json_array_append_new(types, json_string(is_sliding(s, l) ? "sliding_attention" : "full_attention"));
    json_t *y = yarn_json(s);
    if (y) {
        json_object_del(y, "type");
        json_object_set_new(y, "rope_type", json_string("yarn"));
        json_object_set_new(y, "truncate", json_false());
    }
    json_t *c = json_pack(
        "{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:o,s:b,s:f,s:o,s:f,s:i,s:i,s:f,s:s,"
        "s:b,s:s}",
        "architectures", "GptOssForCausalLM", "model_type", "gpt_oss", "vocab_size", s->vocab, "hidden_size", s->hidden,
        "intermediate_size", s->moe_inter, "num_hidden_layers", layers, "num_attention_heads", s->heads,
        "num_key_value_heads", s->kv_heads, "head_dim", s->head_dim, "num_local_experts", s->experts,
        "num_experts_per_tok", s->top_k, "experts_per_token", s->top_k, "sliding_window", s->sliding_window,
        "layer_types", types, "attention_bias", 1, "rope_theta", s->rope_theta, "rope_scaling", y, "swiglu_limit",
        s->swiglu_limit, "max_position_embeddings", s->max_pos, "initial_context_length", s->yarn_orig_max_pos,
        "rms_norm_eps", 1e-5, "hidden_act", "silu", "tie_word_embeddings", 0, "torch_dtype", "bfloat16");
    if (c && q == SL_SYNTH_MXFP4)
        json_object_set_new(c, "quantization_config",
                            json_pack("{s:[s,s,s,s],s:s}", "modules_to_not_convert", "model.layers.*.self_attn",
                                      "model.layers.*.mlp.router", "model.embed_tokens", "lm_head", "quant_method",
                                      "mxfp4"));
    return c;
}

static json_t *config_json(const sl_synth_shape *s, sl_synth_quant q, int layers) {
    int L = n_layers(s, layers), bits = q == SL_SYNTH_MLX4 ? 4 : 8;
    if (!strcmp(s->arch, "deepseek_v3")) return deepseek_config(s, L, q);
    if (!strcmp(s->arch, "gpt_oss")) return gpt_oss_config(s, L, q);
    json_t *c = !strcmp(s->arch, "llama") ? llama_config(s, L) : qwen35_config(s, L);
    if (!c || q == SL_SYNTH_BF16) return c;
    json_t *qo = json_pack("{s:i,s:i}", "group_size", GROUP, "bits", bits);
    if (strcmp(s->arch, "llama")) {
        /* MLX keeps the routers at 8 bits */
        char n[128];
        for (int l = 0; l < L; l++) {
            snprintf(n, sizeof n, "language_model.model.layers.%d.mlp.gate", l);
            json_object_set_new(qo, n, json_pack("{s:i,s:i}", "group_size", GROUP, "bits", 8));
            snprintf(n, sizeof n, "language_model.model.layers.%d.mlp.shared_expert_gate", l);
            json_object_set_new(qo, n, json_pack("{s:i,s:i}", "group_size", GROUP, "bits", 8));
        }
    }
    json_object_set_new(c, "quantization", qo);
    return c;
}

/* ---- tensor bytes ---- */

typedef struct {
    uint8_t *rand_bf16, *rand_bytes, *rand_fp8; /* BLOCK_BYTES each */
    float *unit;                                /* BLOCK_BYTES / 2 factors in [0.75, 1.25) for scales */
    int quiet, tty;
    double t0, last;
} gen_ctx;

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int gen_init(gen_ctx *g) {
    g->rand_bf16 = malloc(BLOCK_BYTES);
    g->rand_bytes = malloc(BLOCK_BYTES);
    g->rand_fp8 = malloc(BLOCK_BYTES);
    g->unit = malloc(BLOCK_BYTES / 2 * sizeof *g->unit);
    if (!g->rand_bf16 || !g->rand_bytes || !g->rand_fp8 || !g->unit) return -1;
    uint64_t st = 0x5eed5eedull;
    for (size_t i = 0; i < BLOCK_BYTES; i += 8) {
        uint64_t a = sl_splitmix64(&st), b = sl_splitmix64(&st);
        for (size_t k = 0; k < 8 && i + k < BLOCK_BYTES; k++) {
            g->rand_bytes[i + k] = (uint8_t)(a >> (8 * k));
            g->rand_bf16[i + k] = (uint8_t)(b >> (8 * k));
        }
    }
    /* bf16 high bytes: keep the sign, exponent 118..121, so magnitudes are 2^-9..2^-6 like trained weights */
    for (size_t i = 1; i < BLOCK_BYTES; i += 2) {
        uint8_t b = g->rand_bf16[i];
        g->rand_bf16[i] = (uint8_t)((b & 0x80) | (0x3B + (b & 1)));
    }
    /* e4m3: keep the sign and mantissa, exponent field 11..14 (never 15, so never NaN): |q| in [16, 240], the
     * upper range of a tile scaled to its largest value; with scales near 2^-13 the weights are ~1e-2 */
    for (size_t i = 0; i < BLOCK_BYTES; i++) {
        uint8_t b = g->rand_bytes[i];
        g->rand_fp8[i] = (uint8_t)((b & 0x80) | ((11 + (b & 3)) << 3) | ((b >> 2) & 7));
    }
    for (size_t i = 0; i < BLOCK_BYTES / 2; i++)
        g->unit[i] = 0.75f + 0.5f * (float)(sl_splitmix64(&st) >> 40) / 16777216.0f;
    return 0;
}

static void gen_free(gen_ctx *g) {
    free(g->rand_bf16);
    free(g->rand_bytes);
    free(g->rand_fp8);
    free(g->unit);
}

/* copies n bytes of the block starting at position pos (wrapping) */
static void from_block(const uint8_t *blk, uint64_t pos, uint8_t *dst, size_t n) {
    while (n) {
        size_t at = (size_t)(pos % BLOCK_BYTES), k = BLOCK_BYTES - at < n ? BLOCK_BYTES - at : n;
        memcpy(dst, blk + at, k);
        dst += k;
        pos += k;
        n -= k;
    }
}

static void fill(void *ctx, const sl_st_wtensor *t, uint64_t off, uint8_t *buf, size_t n) {
    gen_ctx *g = ctx;
    /* a per-tensor start in the block (even, so bf16 elements stay whole) */
    uint64_t start = (name_hash(t->name) % BLOCK_BYTES) & ~(uint64_t)1;
    switch (t->kind) {
    case K_RAND_BF16: from_block(g->rand_bf16, start + off, buf, n); break;
    case K_RAND_BYTES: from_block(g->rand_bytes, start + off, buf, n); break; /* also MXFP4: any nibble is e2m1 */
    case K_RAND_FP8: from_block(g->rand_fp8, start + off, buf, n); break;
    case K_FP8_SCALE:
        /* weight_scale_inv: 2^-13 x [0.75, 1.25) */
        for (size_t i = 0; i < n; i += 4) {
            float v = ldexpf(g->unit[((off + i) / 4) % (BLOCK_BYTES / 2)], -13);
            memcpy(buf + i, &v, 4);
        }
        break;
    case K_E8M0: {
        /* 2^-9 or 2^-8: e2m1 codes (|v| <= 6, RMS ~2.9) then give weights ~1e-2 */
        uint8_t tmp[4096];
        for (size_t i = 0; i < n; i += sizeof tmp) {
            size_t k = n - i < sizeof tmp ? n - i : sizeof tmp;
            from_block(g->rand_bytes, start + off + i, tmp, k);
            for (size_t j = 0; j < k; j++) buf[i + j] = (uint8_t)(118 + (tmp[j] & 1));
        }
        break;
    }
    case K_SMALL_F32:
        /* centred on zero within +-0.005 */
        for (size_t i = 0; i < n; i += 4) {
            float v = 0.02f * (g->unit[((off + i) / 4 + start) % (BLOCK_BYTES / 2)] - 1.0f);
            memcpy(buf + i, &v, 4);
        }
        break;
    case K_SCALES:
    case K_BIASES: {
        /* w = scale * q + bias with q uniform in [0, 2^bits): scale ~ 0.02 / 2^bits gives |w| ~ 1e-2,
         * and bias = -scale * (2^bits - 1) / 2 centres w on zero. Scales and biases of one module index
         * the same factors, so they stay consistent. */
        int bits = (int)t->arg;
        float s0 = 0.02f / (float)(1 << bits), centre = -0.5f * (float)((1 << bits) - 1);
        for (size_t i = 0; i < n; i += 2) {
            uint64_t el = (off + i) / 2;
            float s = s0 * g->unit[el % (BLOCK_BYTES / 2)];
            uint16_t h = sl_f32_to_bf16(t->kind == K_SCALES ? s : s * centre);
            buf[i] = (uint8_t)h;
            buf[i + 1] = (uint8_t)(h >> 8);
        }
        break;
    }
    case K_CONST_BF16: {
        uint16_t h = sl_f32_to_bf16(t->arg);
        for (size_t i = 0; i < n; i += 2) {
            buf[i] = (uint8_t)h;
            buf[i + 1] = (uint8_t)(h >> 8);
        }
        break;
    }
    case K_ALOG:
        /* A = exp(A_log) spread over 1..16, as the models are initialised */
        for (size_t i = 0; i < n; i += 4) {
            float v = logf(1.0f + (float)(((off + i) / 4) % 16));
            memcpy(buf + i, &v, 4);
        }
        break;
    }
}

static void progress(void *ctx, uint64_t done, uint64_t total) {
    gen_ctx *g = ctx;
    double now = sl_now();
    if (g->quiet || (!g->tty && done != total) || (now - g->last < 0.25 && done != total)) return;
    g->last = now;
    char a[32], b[32];
    double rate = done / (now - g->t0 + 1e-9);
    fprintf(stderr, "%sgenerating: %s of %s (%.0f%%, %.1f GB/s)%s", g->tty ? "\r" : "",
            sl_human_bytes((double)done, a, sizeof a), sl_human_bytes((double)total, b, sizeof b),
            100.0 * (double)done / (double)total, rate / 1e9, g->tty && done != total ? "" : "\n");
    fflush(stderr);
}

/* ---- folders ---- */

static int mkdirs(const char *path, sl_err *e) {
    char *p = strdup(path);
    if (!p) return sl_fail(e, "out of memory");
    for (char *s = p + 1;; s++) {
        int end = !*s;
        if (*s == '/' || end) {
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) {
                int rc = sl_fail(e, "%s: cannot create folder: %s", p, strerror(errno));
                free(p);
                return rc;
            }
            if (end) break;
            *s = '/';
        }
    }
    free(p);
    return 0;
}

char *sl_synth_default_dir(const sl_synth_shape *s, sl_synth_quant q, int layers) {
    const char *base = getenv("SLUICE_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char root[4096], out[4400];
    if (base && *base)
        snprintf(root, sizeof root, "%s", base);
    else if (xdg && *xdg)
        snprintf(root, sizeof root, "%s/sluice", xdg);
    else
        snprintf(root, sizeof root, "%s/.cache/sluice", home && *home ? home : "/tmp");
    if (layers > 0 && layers < s->layers)
        snprintf(out, sizeof out, "%s/synthetic/%s-%s-%dL", root, s->name, quant_names[q], layers);
    else
        snprintf(out, sizeof out, "%s/synthetic/%s-%s", root, s->name, quant_names[q]);
    return strdup(out);
}

/* Removes the checkpoint files of an earlier, incomplete or different generation, so a leftover index
 * or shard is never mixed with the new ones. */
static int remove_old(const char *dir, sl_err *e) {
    DIR *d = opendir(dir);
    if (!d) return sl_fail(e, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) && !rc) {
        size_t n = strlen(de->d_name);
        if (strncmp(de->d_name, "model", 5) ||
            !(!strcmp(de->d_name, "model.gguf") || (n > 12 && (!strcmp(de->d_name + n - 12, ".safetensors") ||
                                                               !strcmp(de->d_name + n - 11, ".index.json")))))
            continue;
        char *p = sl_path_join(dir, de->d_name);
        if (!p || unlink(p)) rc = sl_fail(e, "%s: cannot remove %s: %s", dir, de->d_name, strerror(errno));
        free(p);
    }
    closedir(d);
    return rc;
}

char *sl_synth_model_path(const char *dir, sl_synth_quant q) {
    return q == SL_SYNTH_Q4K ? sl_path_join(dir, "model.gguf") : strdup(dir);
}

/* The marker written last: its content identifies a complete checkpoint. */
static void marker_text(const sl_synth_shape *s, sl_synth_quant q, int layers, char *buf, size_t n) {
    snprintf(buf, n, "sluice synthetic v%d %s %s %d layers\n", SYNTH_VERSION, s->name, quant_names[q],
             n_layers(s, layers));
}

int sl_synth_ensure(const sl_synth_shape *s, sl_synth_quant q, int layers, const char *dir, int quiet, int *generated,
                    sl_err *e) {
    char want[160];
    marker_text(s, q, layers, want, sizeof want);
    char *mpath = sl_path_join(dir, "synthetic.txt");
    if (!mpath) return sl_fail(e, "out of memory");
    char *have = NULL;
    size_t len = 0;
    sl_err ignore;
    *generated = 0;
    if (!sl_read_file(mpath, &have, &len, &ignore) && !strcmp(have, want)) {
        free(have);
        free(mpath);
        return 0;
    }
    free(have);
    int rc = -1;
    tlist L = {0};
    gen_ctx g = {.quiet = quiet, .tty = isatty(2)};
    json_t *cfg = NULL;
    char *cpath = sl_path_join(dir, "config.json"), *text = NULL;
    if (!cpath || (q != SL_SYNTH_Q4K && build(s, q, layers, &L)) || gen_init(&g)) {
        sl_fail(e, "out of memory");
        goto done;
    }
    if (mkdirs(dir, e) || remove_old(dir, e)) goto done;
    unlink(mpath);
    uint64_t need = sl_synth_bytes(s, q, layers);
    struct statvfs vfs;
    if (!statvfs(dir, &vfs) && (double)vfs.f_bavail * (double)vfs.f_frsize < (double)need) {
        char a[32], b[32];
        sl_fail(e, "%s: a synthetic %s %s checkpoint needs %s but only %s is free (--layers N writes fewer layers)",
                dir, s->name, quant_names[q], sl_human_bytes((double)need, a, sizeof a),
                sl_human_bytes((double)vfs.f_bavail * (double)vfs.f_frsize, b, sizeof b));
        goto done;
    }
    if (!quiet) {
        char a[32];
        fprintf(stderr, "writing a synthetic %s %s checkpoint (%d layers, %s) to %s\n", s->name, quant_names[q],
                n_layers(s, layers), sl_human_bytes((double)need, a, sizeof a), dir);
    }
    g.t0 = g.last = sl_now();
    if (q == SL_SYNTH_Q4K) {
        char *gpath = sl_synth_model_path(dir, q);
        int wrc =
            gpath ? sl_synth_gguf_write(s, n_layers(s, layers), gpath, progress, &g, e) : sl_fail(e, "out of memory");
        free(gpath);
        if (wrc) goto done;
        if (sl_write_file(mpath, want, strlen(want), e)) goto done;
        *generated = 1;
        rc = 0;
        goto done;
    }
    cfg = config_json(s, q, layers);
    text = cfg ? json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    if (!text) {
        sl_fail(e, "out of memory");
        goto done;
    }
    if (sl_write_file(cpath, text, strlen(text), e)) goto done;
    g.t0 = g.last = sl_now();
    if (sl_st_write(dir, L.t, L.n, SHARD_BYTES, fill, progress, &g, e)) goto done;
    if (sl_write_file(mpath, want, strlen(want), e)) goto done;
    *generated = 1;
    rc = 0;
done:
    json_decref(cfg);
    free(text);
    free(cpath);
    free(mpath);
    free(L.t);
    gen_free(&g);
    return rc;
}
