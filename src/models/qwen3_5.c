/* Qwen3.5-MoE (and its text-only variant) and Qwen3-Next: a hybrid of gated delta-net layers and gated
 * full-attention layers, each followed by a MoE with a sigmoid-gated shared expert. RMSNorms use the
 * (1 + w) convention, except the delta-net's gated output norm, which is plain w. Qwen3-Next differs only in
 * how the delta-net's input projections are stored (see load_fused_qkvz).
 *
 * MLX conversions store those (1 + w) weights with the 1 already added and conv1d as [C, K, 1] instead
 * of [C, 1, K]; the conv shape tells the two apart (the memory order of the kernel is the same). GGUF
 * files fold the 1 in too (the config says so). */
#include <stdio.h>
#include <stdlib.h>

#include "models/blocks.h"
#include "models/fused.h"
#include "models/registry.h"

/* Qwen3-Next fuses the delta-net's input projections per key head g: in_proj_qkvz rows are, for each g,
 * [q_g | k_g | v_g | z_g] (v_g and z_g: the group's value heads, value heads per key head x value dim), and
 * in_proj_ba rows [b_g | a_g] (one row per value head each). The rows are regathered into the separate
 * q|k|v, z, a and b projections of Qwen3.5, so the forward is the same. llama.cpp's converter splits q|k|v
 * and z itself (its older files keep them fused) but leaves b and a fused. */
static int load_fused_qkvz(sl_model *m, sl_loader *ld, int l, const char *module, sl_err *e) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    int nk = c->lin_n_k_heads, kd = c->lin_k_head_dim, gv = c->lin_n_v_heads / nk * c->lin_v_head_dim;
    int blk = 2 * kd + 2 * gv, conv_dim = sl_config_conv_dim(c);
    int *qkv = malloc(sizeof *qkv * (size_t)conv_dim), *z = malloc(sizeof *z * (size_t)(nk * gv));
    int rc = -1;
    if (!qkv || !z) {
        sl_fail(e, "out of memory");
        goto out;
    }
    for (int g = 0; g < nk; g++) {
        for (int j = 0; j < kd; j++) {
            qkv[g * kd + j] = g * blk + j;                /* queries */
            qkv[nk * kd + g * kd + j] = g * blk + kd + j; /* keys */
        }
        for (int j = 0; j < gv; j++) {
            qkv[2 * nk * kd + g * gv + j] = g * blk + 2 * kd + j; /* values */
            z[g * gv + j] = g * blk + 2 * kd + gv + j;
        }
    }
    rc = sl_ld_linear_rows(ld, module, nk * blk, c->hidden, conv_dim, qkv, &L->in_qkv, e) ||
                 sl_ld_linear_rows(ld, module, nk * blk, c->hidden, nk * gv, z, &L->in_z, e)
             ? -1
             : 0;
out:
    free(qkv);
    free(z);
    return rc;
}

static int load_fused_ba(sl_model *m, sl_loader *ld, int l, const char *module, sl_err *e) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    int nk = c->lin_n_k_heads, nv = c->lin_n_v_heads, r = nv / nk;
    int *a = malloc(sizeof *a * (size_t)nv), *b = malloc(sizeof *b * (size_t)nv);
    int rc = -1;
    if (!a || !b) {
        sl_fail(e, "out of memory");
        goto out;
    }
    for (int g = 0; g < nk; g++)
        for (int j = 0; j < r; j++) {
            b[g * r + j] = g * 2 * r + j;
            a[g * r + j] = g * 2 * r + r + j;
        }
    rc = sl_ld_linear_rows(ld, module, 2 * nv, c->hidden, nv, a, &L->in_a, e) ||
                 sl_ld_linear_rows(ld, module, 2 * nv, c->hidden, nv, b, &L->in_b, e)
             ? -1
             : 0;
out:
    free(a);
    free(b);
    return rc;
}

static int load_linear_attn(sl_model *m, sl_loader *ld, int l, sl_err *e) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    char nb[256], mod[256];
    int nv = c->lin_n_v_heads, vd = c->lin_v_head_dim;
    int conv_dim = sl_config_conv_dim(c), H = c->hidden;
    L->kind = SL_LAYER_LINEAR;
    const char *p = "model.layers.%d.linear_attn.%s";
    int rc = sl_ld_has(ld, NAME(nb, p, l, "in_proj_qkvz.weight"))
                 ? load_fused_qkvz(m, ld, l, NAME(mod, p, l, "in_proj_qkvz"), e)
                 : sl_ld_linear(ld, NAME(mod, p, l, "in_proj_qkv"), conv_dim, H, &L->in_qkv, e) ||
                       sl_ld_linear(ld, NAME(mod, p, l, "in_proj_z"), nv * vd, H, &L->in_z, e);
    if (rc) return -1;
    rc = sl_ld_has(ld, NAME(nb, p, l, "in_proj_ba.weight"))
             ? load_fused_ba(m, ld, l, NAME(mod, p, l, "in_proj_ba"), e)
             : sl_ld_linear(ld, NAME(mod, p, l, "in_proj_a"), nv, H, &L->in_a, e) ||
                   sl_ld_linear(ld, NAME(mod, p, l, "in_proj_b"), nv, H, &L->in_b, e);
    if (rc || sl_ld_linear(ld, NAME(nb, p, l, "out_proj"), H, nv * vd, &L->out_proj, e) ||
        sl_ld_vector(ld, NAME(nb, p, l, "conv1d.weight"), (int64_t)conv_dim * c->conv_kernel, 0.0f, &L->conv_w, e) ||
        sl_ld_vector(ld, NAME(nb, p, l, "A_log"), nv, 0.0f, &L->A_log, e) ||
        sl_ld_vector(ld, NAME(nb, p, l, "dt_bias"), nv, 0.0f, &L->dt_bias, e) ||
        sl_ld_vector(ld, NAME(nb, p, l, "norm.weight"), vd, 0.0f, &L->lin_norm, e))
        return -1;
    return 0;
}

/* 1 when the checkpoint is an MLX conversion with (1 + w) folded into the norm weights. */
static int norms_folded(sl_model *m, sl_loader *ld, sl_err *e) {
    char nb[256];
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (m->cfg.layer_kind[l] != SL_LAYER_LINEAR) continue;
        const sl_st_tensor *t = sl_ld_find(ld, NAME(nb, "model.layers.%d.linear_attn.conv1d.weight", l));
        if (!t) return sl_fail(e, "%s: missing tensor '%s'", m->path, nb);
        if (t->ndim == 3 && t->shape[1] == 1) return 0;                    /* HF: [C, 1, K] */
        if (t->ndim == 3 && t->shape[2] == 1 && t->shape[1] > 1) return 1; /* MLX: [C, K, 1] */
        return sl_fail(e, "%s: tensor '%s' should be [C, 1, K] or [C, K, 1]", m->path, t->name);
    }
    return 0;
}

static int q35_load(sl_model *m, sl_loader *ld, sl_err *e) {
    const sl_config *c = &m->cfg;
    if (c->n_experts <= 0 || c->lin_n_k_heads <= 0 || c->lin_n_v_heads % c->lin_n_k_heads || c->conv_kernel < 1 ||
        c->lin_k_head_dim <= 0 || c->lin_v_head_dim <= 0)
        return sl_fail(e,
                       "%s%s: incomplete %s config (num_experts, linear_num_key_heads, "
                       "linear_num_value_heads multiple of key heads, linear_*_head_dim, linear_conv_kernel_dim)",
                       m->path, m->cfg_suffix, c->model_type);
    int folded = c->norms_folded ? 1 : norms_folded(m, ld, e);
    if (folded < 0) return -1;
    float add = folded ? 0.0f : 1.0f;
    if (blk_load_outer(m, ld, add, e)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (blk_load_norms(m, ld, l, add, e)) return -1;
        int rc = c->layer_kind[l] == SL_LAYER_LINEAR ? load_linear_attn(m, ld, l, e)
                                                     : blk_load_attention(m, ld, l, 1, add, e);
        /* Qwen3-Next may keep dense MLPs on some layers (decoder_sparse_step, mlp_only_layers) */
        int sparse = !c->mlp_only[l] && c->decoder_sparse_step > 0 && (l + 1) % c->decoder_sparse_step == 0;
        if (rc || (sparse ? blk_load_moe(m, ld, l, 1, e) : blk_load_mlp(m, ld, l, e))) return -1;
    }
    return 0;
}

static void linear_attn(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    const sl_config *c = &m->cfg;
    const sl_backend_ops *op = m->be->ops;
    sl_backend *be = m->be;
    sl_layer *L = &m->layers[l];
    sl_scratch *x = &s->s;
    sl_deltanet_dims d = {c->lin_n_k_heads,  c->lin_n_v_heads, c->lin_k_head_dim,
                          c->lin_v_head_dim, c->conv_kernel,   c->lin_v_tiled};
    const sl_weight *w[4] = {&L->in_qkv, &L->in_z, &L->in_a, &L->in_b};
    size_t cd = (size_t)sl_config_conv_dim(c), nv = (size_t)d.n_v_heads, lv = nv * (size_t)d.v_dim;
    if (s->n_runs == 1) { /* one sequence: the conv rides on the input projections */
        int q = s->runs[0].seq;
        float *y[4] = {x->conv, x->z, x->a, x->b};
        sl_matmul_multi_conv(be, 4, w, xn, n, y, L->conv_w, d.conv_kernel, s->conv[l] + (size_t)q * s->conv_stride,
                             x->qkv);
        op->deltanet(be, &d, x->conv, x->a, x->b, L->A_log, L->dt_bias, s->ssm[l] + (size_t)q * s->ssm_stride, n,
                     x->lin);
    } else { /* each sequence's tokens through its own conv and recurrent state */
        float *y[4] = {x->qkv, x->z, x->a, x->b};
        sl_matmul_multi(be, 4, w, xn, n, y);
        for (int r = 0; r < s->n_runs; r++) {
            const sl_run *ru = &s->runs[r];
            size_t t = (size_t)ru->start;
            op->conv1d_silu(be, x->qkv + t * cd, ru->len, (int)cd, L->conv_w, d.conv_kernel,
                            s->conv[l] + (size_t)ru->seq * s->conv_stride, x->conv + t * cd);
            op->deltanet(be, &d, x->conv + t * cd, x->a + t * nv, x->b + t * nv, L->A_log, L->dt_bias,
                         s->ssm[l] + (size_t)ru->seq * s->ssm_stride, ru->len, x->lin + t * lv);
        }
    }
    sl_gated_rmsnorm_matmul(be, &L->out_proj, x->lin, x->z, L->lin_norm, d.v_dim, (float)c->rms_eps, n, out);
}

static int q35_layers(sl_model *m, sl_session *s, float *x, int n, sl_err *e) {
    (void)e;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        blk_layer_input(m, s, l, x, n);
        if (m->layers[l].kind == SL_LAYER_LINEAR)
            linear_attn(m, s, l, s->s.xn, n, s->s.ff_o);
        else
            blk_attention(m, s, l, s->s.xn, n, s->s.ff_o);
        blk_ffn(m, s, l, x, s->s.ff_o, n);
    }
    blk_layers_end(m, s, x, n);
    return 0;
}

const sl_family sl_family_qwen3_5 = {"qwen3_5_moe", q35_load, q35_layers};
