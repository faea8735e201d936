/* Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2), the attention kind's latent form: low-rank
 * queries, one compressed latent and a shared rotary key part per token in the cache, kv_b_proj absorbed
 * into the attention op. */
#include <math.h>

#include "models/blocks.h"
#include "models/fused.h"

static sl_mla_dims dims_of(const sl_config *c) {
    sl_mla_dims d = {c->n_heads, c->qk_nope_dim, c->qk_rope_dim, c->kv_lora_rank, c->v_head_dim, c->rope_interleave};
    return d;
}

/* llama.cpp's converter splits kv_b_proj per head into k_b [n_heads][kv_lora][nope] (transposed) and v_b
 * [n_heads][v][kv_lora]; they are joined back into kv_b_proj's [n_heads * (nope + v)][kv_lora]. */
static int load_kv_b_split(sl_model *m, sl_loader *ld, int l, sl_attn *A, sl_err *e) {
    const sl_config *c = &m->cfg;
    char nk[256], nv[256], what[400];
    int nh = c->n_heads, nope = c->qk_nope_dim, v = c->v_head_dim, kv = c->kv_lora_rank, hw = nope + v;
    float *w = sl_ld_alloc_f32(ld, (size_t)nh * (size_t)hw * (size_t)kv, e),
          *row = sl_ld_alloc_f32(ld, (size_t)(kv > nope ? kv : nope), e);
    if (!w || !row) return -1;
    NAME(nk, "model.layers.%d.self_attn.k_b_proj", l);
    NAME(nv, "model.layers.%d.self_attn.v_b_proj", l);
    for (int h = 0; h < nh; h++) {
        sl_weight kb, vb;
        if (sl_ld_stacked(ld, nk, 1, nh, h, 0, kv, kv, nope, &kb, e) ||
            sl_ld_stacked(ld, nv, 1, nh, h, 0, v, v, kv, &vb, e))
            return -1;
        snprintf(what, sizeof what, "%s: '%s'", m->path, nk);
        for (int c0 = 0; c0 < kv; c0++) { /* row c0 of k_b is column c0 of the head's key rows */
            if (sl_ld_row_f32(&kb, c0, row, what, e)) return -1;
            for (int j = 0; j < nope; j++) w[((size_t)h * (size_t)hw + (size_t)j) * (size_t)kv + (size_t)c0] = row[j];
        }
        snprintf(what, sizeof what, "%s: '%s'", m->path, nv);
        for (int r = 0; r < v; r++)
            if (sl_ld_row_f32(&vb, r, w + ((size_t)h * (size_t)hw + (size_t)(nope + r)) * (size_t)kv, what, e))
                return -1;
    }
    A->wkv_b = w;
    return 0;
}

int blk_load_mla(sl_model *m, sl_loader *ld, int l, sl_err *e) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    char nb[256];
    int H = c->hidden, nh = c->n_heads, qh = c->qk_nope_dim + c->qk_rope_dim;
    sl_attn *A = L->attn = sl_ld_part(ld, 1, sizeof *A, e);
    if (!A) return -1;
    L->mixer = &sl_kind_attn;
    A->latent = 1;
    if (c->q_lora_rank > 0) {
        if (sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.q_a_proj", l), c->q_lora_rank, H, &A->wq_a, e) ||
            sl_ld_vector(ld, NAME(nb, "model.layers.%d.self_attn.q_a_layernorm.weight", l), c->q_lora_rank, 0.0f,
                         &A->q_a_norm, e) ||
            sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.q_b_proj", l), nh * qh, c->q_lora_rank, &A->wq_b, e))
            return -1;
    } else if (sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.q_proj", l), nh * qh, H, &A->wq, e)) {
        return -1;
    }
    if (sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.kv_a_proj_with_mqa", l), c->kv_lora_rank + c->qk_rope_dim,
                     H, &A->wkv_a, e) ||
        sl_ld_vector(ld, NAME(nb, "model.layers.%d.self_attn.kv_a_layernorm.weight", l), c->kv_lora_rank, 0.0f,
                     &A->kv_a_norm, e) ||
        sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.o_proj", l), H, nh * c->v_head_dim, &A->wo, e))
        return -1;
    if (sl_ld_has(ld, NAME(nb, "model.layers.%d.self_attn.k_b_proj.weight", l))) return load_kv_b_split(m, ld, l, A, e);
    return sl_ld_matrix_f32(ld, NAME(nb, "model.layers.%d.self_attn.kv_b_proj", l),
                            nh * (c->qk_nope_dim + c->v_head_dim), c->kv_lora_rank, &A->wkv_b, e);
}

/* The softmax scale: 1 / sqrt(query head width), times mscale^2 under YaRN with mscale_all_dim, as
 * DeepSeek trained it (the rotary tables carry only the mscale / mscale_all_dim ratio). */
static float mla_scale(const sl_config *c) {
    float scale = 1.0f / sqrtf((float)(c->qk_nope_dim + c->qk_rope_dim));
    const sl_rope_cfg *r = &c->rope;
    if (r->type == SL_ROPE_YARN && r->mscale_all_dim > 0 && r->factor > 1) {
        float ms = (float)(0.1 * r->mscale_all_dim * log(r->factor) + 1.0);
        scale *= ms * ms;
    }
    return scale;
}

void blk_mla_forward(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    const sl_config *c = &m->cfg;
    const sl_backend_ops *op = m->be->ops;
    sl_backend *be = m->be;
    const sl_attn *A = m->layers[l].attn;
    sl_attn_scratch *x = &s->s.attn;
    float *cache = s->state[l].paged[0];
    sl_mla_dims d = dims_of(c);
    float eps = (float)c->rms_eps;
    if (c->q_lora_rank > 0) { /* q_a and kv_a both read xn */
        const sl_weight *w[2] = {&A->wq_a, &A->wkv_a};
        float *y[2] = {x->qraw, x->k};
        sl_matmul_multi(be, 2, w, xn, n, y);
        op->rmsnorm(be, x->qraw, A->q_a_norm, n, c->q_lora_rank, eps, x->qraw);
        op->matmul(be, &A->wq_b, x->qraw, n, x->q);
    } else {
        const sl_weight *w[2] = {&A->wq, &A->wkv_a};
        float *y[2] = {x->q, x->k};
        sl_matmul_multi(be, 2, w, xn, n, y);
    }
    op->mla_rope_store(be, x->q, x->k, &s->bm, &d, A->kv_a_norm, eps, m->inv_freq, m->attn_factor, cache);
    op->mla_attention(be, x->q, cache, &s->bm, &d, A->wkv_b, mla_scale(c), x->att);
    op->matmul(be, &A->wo, x->att, n, out);
}
