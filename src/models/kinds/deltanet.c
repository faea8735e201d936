/* The gated delta-net kind (linear attention of Qwen3.5 and Qwen3-Next): input projections, a causal
 * conv over the q|k|v channels, the gated delta rule, and a gated RMSNorm before the output projection.
 * Its state is fixed per sequence: the conv's last kernel - 1 inputs and the recurrent state. */
#include <stdlib.h>

#include "models/blocks.h"
#include "models/fused.h"

/* Qwen3-Next fuses the delta-net's input projections per key head g: in_proj_qkvz rows are, for each g,
 * [q_g | k_g | v_g | z_g] (v_g and z_g: the group's value heads, value heads per key head x value dim), and
 * in_proj_ba rows [b_g | a_g] (one row per value head each). The rows are regathered into the separate
 * q|k|v, z, a and b projections of Qwen3.5, so the forward is the same. llama.cpp's converter splits q|k|v
 * and z itself (its older files keep them fused) but leaves b and a fused. */
static int load_fused_qkvz(sl_model *m, sl_loader *ld, sl_deltanet *D, const char *module, sl_err *e) {
    const sl_config *c = &m->cfg;
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
    rc = sl_ld_linear_rows(ld, module, nk * blk, c->hidden, conv_dim, qkv, &D->in_qkv, e) ||
                 sl_ld_linear_rows(ld, module, nk * blk, c->hidden, nk * gv, z, &D->in_z, e)
             ? -1
             : 0;
out:
    free(qkv);
    free(z);
    return rc;
}

static int load_fused_ba(sl_model *m, sl_loader *ld, sl_deltanet *D, const char *module, sl_err *e) {
    const sl_config *c = &m->cfg;
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
    rc = sl_ld_linear_rows(ld, module, 2 * nv, c->hidden, nv, a, &D->in_a, e) ||
                 sl_ld_linear_rows(ld, module, 2 * nv, c->hidden, nv, b, &D->in_b, e)
             ? -1
             : 0;
out:
    free(a);
    free(b);
    return rc;
}

int blk_load_deltanet(sl_model *m, sl_loader *ld, int l, sl_err *e) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    char nb[256], mod[256];
    int nv = c->lin_n_v_heads, vd = c->lin_v_head_dim;
    int conv_dim = sl_config_conv_dim(c), H = c->hidden;
    sl_deltanet *D = L->dn = sl_ld_part(ld, 1, sizeof *D, e);
    if (!D) return -1;
    L->mixer = &sl_kind_deltanet;
    const char *p = "model.layers.%d.linear_attn.%s";
    int rc = sl_ld_has(ld, NAME(nb, p, l, "in_proj_qkvz.weight"))
                 ? load_fused_qkvz(m, ld, D, NAME(mod, p, l, "in_proj_qkvz"), e)
                 : sl_ld_linear(ld, NAME(mod, p, l, "in_proj_qkv"), conv_dim, H, &D->in_qkv, e) ||
                       sl_ld_linear(ld, NAME(mod, p, l, "in_proj_z"), nv * vd, H, &D->in_z, e);
    if (rc) return -1;
    rc = sl_ld_has(ld, NAME(nb, p, l, "in_proj_ba.weight"))
             ? load_fused_ba(m, ld, D, NAME(mod, p, l, "in_proj_ba"), e)
             : sl_ld_linear(ld, NAME(mod, p, l, "in_proj_a"), nv, H, &D->in_a, e) ||
                   sl_ld_linear(ld, NAME(mod, p, l, "in_proj_b"), nv, H, &D->in_b, e);
    if (rc || sl_ld_linear(ld, NAME(nb, p, l, "out_proj"), H, nv * vd, &D->out_proj, e) ||
        sl_ld_vector(ld, NAME(nb, p, l, "conv1d.weight"), (int64_t)conv_dim * c->conv_kernel, 0.0f, &D->conv_w, e) ||
        sl_ld_vector(ld, NAME(nb, p, l, "A_log"), nv, 0.0f, &D->A_log, e) ||
        sl_ld_vector(ld, NAME(nb, p, l, "dt_bias"), nv, 0.0f, &D->dt_bias, e) ||
        sl_ld_vector(ld, NAME(nb, p, l, "norm.weight"), vd, 0.0f, &D->norm, e))
        return -1;
    return 0;
}

static void deltanet_forward(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    const sl_config *c = &m->cfg;
    const sl_backend_ops *op = m->be->ops;
    sl_backend *be = m->be;
    const sl_deltanet *D = m->layers[l].dn;
    sl_deltanet_scratch *x = &s->s.dn;
    sl_deltanet_dims d = {c->lin_n_k_heads,  c->lin_n_v_heads, c->lin_k_head_dim,
                          c->lin_v_head_dim, c->conv_kernel,   c->lin_v_tiled};
    const sl_weight *w[4] = {&D->in_qkv, &D->in_z, &D->in_a, &D->in_b};
    size_t cd = (size_t)sl_config_conv_dim(c), nv = (size_t)d.n_v_heads, lv = nv * (size_t)d.v_dim;
    if (s->n_runs == 1) { /* one sequence: the conv rides on the input projections */
        int q = s->runs[0].seq;
        float *y[4] = {x->conv, x->z, x->a, x->b};
        sl_matmul_multi_conv(be, 4, w, xn, n, y, D->conv_w, d.conv_kernel, sl_session_fixed(s, l, 0, q), x->qkv);
        op->deltanet(be, &d, x->conv, x->a, x->b, D->A_log, D->dt_bias, sl_session_fixed(s, l, 1, q), n, x->out);
    } else if (s->n_runs == n && op->deltanet_seqs && op->conv1d_silu_seqs) {
        /* a decode batch, every sequence one token: each kernel once for all of them */
        float *y[4] = {x->qkv, x->z, x->a, x->b};
        sl_matmul_multi(be, 4, w, xn, n, y);
        op->conv1d_silu_seqs(be, x->qkv, (int)cd, D->conv_w, d.conv_kernel, s->state[l].fixed[0],
                             s->state[l].lay.fixed[0], &s->bm, x->conv);
        op->deltanet_seqs(be, &d, x->conv, x->a, x->b, D->A_log, D->dt_bias, s->state[l].fixed[1],
                          s->state[l].lay.fixed[1], &s->bm, x->out);
    } else { /* each sequence's tokens through its own conv and recurrent state */
        float *y[4] = {x->qkv, x->z, x->a, x->b};
        sl_matmul_multi(be, 4, w, xn, n, y);
        for (int r = 0; r < s->n_runs; r++) {
            const sl_run *ru = &s->runs[r];
            size_t t = (size_t)ru->start;
            op->conv1d_silu(be, x->qkv + t * cd, ru->len, (int)cd, D->conv_w, d.conv_kernel,
                            sl_session_fixed(s, l, 0, ru->seq), x->conv + t * cd);
            op->deltanet(be, &d, x->conv + t * cd, x->a + t * nv, x->b + t * nv, D->A_log, D->dt_bias,
                         sl_session_fixed(s, l, 1, ru->seq), ru->len, x->out + t * lv);
        }
    }
    sl_gated_rmsnorm_matmul(be, &D->out_proj, x->out, x->z, D->norm, d.v_dim, (float)c->rms_eps, n, out);
}

static int deltanet_tensors(sl_model *m, int l, sl_tensor_fn fn, void *ctx) {
    const sl_config *c = &m->cfg;
    sl_deltanet *D = m->layers[l].dn;
    size_t nv = (size_t)c->lin_n_v_heads;
    sl_weight *ws[] = {&D->in_qkv, &D->in_z, &D->in_a, &D->in_b, &D->out_proj};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        int rc = ws[i]->data ? fn(ctx, l, &(sl_tensor){.w = ws[i]}) : 0;
        if (rc) return rc;
    }
    sl_tensor vs[] = {
        {.v = &D->conv_w, .len = (size_t)sl_config_conv_dim(c) * (size_t)c->conv_kernel},
        {.v = &D->A_log, .len = nv},
        {.v = &D->dt_bias, .len = nv},
        {.v = &D->norm, .len = (size_t)c->lin_v_head_dim},
    };
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        int rc = *vs[i].v ? fn(ctx, l, &vs[i]) : 0;
        if (rc) return rc;
    }
    return 0;
}

/* The conv window (kernel - 1 inputs of conv_dim) and the recurrent state of every sequence. */
static void deltanet_state(const sl_model *m, int l, sl_state_layout *out) {
    const sl_config *c = &m->cfg;
    (void)l;
    size_t taps = (size_t)(c->conv_kernel - 1 > 0 ? c->conv_kernel - 1 : 0);
    *out = (sl_state_layout){.n_fixed = 2, .fixed = {taps * (size_t)sl_config_conv_dim(c), sl_config_ssm_floats(c)}};
}

static int deltanet_scratch(const sl_model *m, int max_batch, sl_scratch *s, sl_alloc_fn alloc, void *ctx) {
    const sl_config *c = &m->cfg;
    size_t B = (size_t)max_batch, cd = (size_t)sl_config_conv_dim(c), nv = (size_t)c->lin_n_v_heads;
    size_t lv = nv * (size_t)c->lin_v_head_dim;
    sl_deltanet_scratch *x = &s->dn;
    return !(x->qkv = alloc(ctx, B * cd * 4)) || !(x->conv = alloc(ctx, B * cd * 4)) ||
                   !(x->z = alloc(ctx, B * lv * 4)) || !(x->a = alloc(ctx, B * nv * 4)) ||
                   !(x->b = alloc(ctx, B * nv * 4)) || !(x->out = alloc(ctx, B * lv * 4))
               ? -1
               : 0;
}

const sl_kind sl_kind_deltanet = {"delta-net", deltanet_tensors, deltanet_state, deltanet_scratch, deltanet_forward};
