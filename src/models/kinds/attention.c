/* The attention kind: grouped-query attention (full or sliding window, optional per-head q/k norms,
 * gated queries, sinks) and, through models/kinds/mla.c, multi-head latent attention. Its state is the
 * paged cache: keys and values per position, or latent attention's one row of [latent | k_rope]. */
#include <math.h>

#include "models/blocks.h"
#include "models/fused.h"

int blk_load_attention(sl_model *m, sl_loader *ld, int l, int q_gated, float norm_add, sl_err *e) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    char nb[256];
    int qw = c->n_heads * c->head_dim, kw = c->n_kv_heads * c->head_dim;
    sl_attn *A = L->attn = sl_ld_part(ld, 1, sizeof *A, e);
    if (!A) return -1;
    L->mixer = &sl_kind_attn;
    A->q_gated = q_gated;
    A->window = c->layer_window ? c->layer_window[l] : c->sliding_window;
    if (sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.q_proj", l), qw * (q_gated ? 2 : 1), c->hidden, &A->wq,
                     e) ||
        sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.k_proj", l), kw, c->hidden, &A->wk, e) ||
        sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.v_proj", l), kw, c->hidden, &A->wv, e) ||
        sl_ld_linear(ld, NAME(nb, "model.layers.%d.self_attn.o_proj", l), c->hidden, qw, &A->wo, e))
        return -1;
    if (sl_ld_has(ld, NAME(nb, "model.layers.%d.self_attn.q_norm.weight", l))) {
        if (sl_ld_vector(ld, nb, c->head_dim, norm_add, &A->q_norm, e) ||
            sl_ld_vector(ld, NAME(nb, "model.layers.%d.self_attn.k_norm.weight", l), c->head_dim, norm_add, &A->k_norm,
                         e))
            return -1;
    }
    if (sl_ld_has(ld, NAME(nb, "model.layers.%d.self_attn.sinks", l)) &&
        sl_ld_vector(ld, nb, c->n_heads, 0.0f, &A->sinks, e))
        return -1;
    return 0;
}

static void attn_forward(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    const sl_config *c = &m->cfg;
    const sl_backend_ops *op = m->be->ops;
    sl_backend *be = m->be;
    const sl_attn *A = m->layers[l].attn;
    if (A->latent) {
        blk_mla_forward(m, s, l, xn, n, out);
        return;
    }
    sl_attn_scratch *x = &s->s.attn;
    void *kc = s->state[l].paged[0], *vc = s->state[l].paged[1];
    int hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    float eps = (float)c->rms_eps;
    const sl_weight *w[3] = {&A->wq, &A->wk, &A->wv};
    float *y[3] = {A->q_gated ? x->qraw : x->q, x->k, x->v};
    sl_matmul_multi(be, 3, w, xn, n, y);
    /* gated q_proj rows are [query | gate] per head; the queries and gates are split out on the way */
    sl_qk_rope_store(be, x->q, x->k, x->v, &s->bm, nh, nkv, hd, A->q_norm, A->q_norm ? A->k_norm : NULL, eps,
                     m->rot_dim, m->inv_freq, m->attn_factor, kc, vc, s->kv_type, A->q_gated ? x->qraw : NULL, x->gate);
    op->attention(be, x->q, kc, vc, s->kv_type, &s->bm, nh, nkv, hd, A->window, 1.0f / sqrtf((float)hd), A->sinks,
                  x->att);
    if (A->q_gated)
        sl_sigmoid_matmul(be, &A->wo, x->att, x->gate, n, out);
    else
        op->matmul(be, &A->wo, x->att, n, out);
}

static int attn_tensors(sl_model *m, int l, sl_tensor_fn fn, void *ctx) {
    const sl_config *c = &m->cfg;
    sl_attn *A = m->layers[l].attn;
    sl_weight *ws[] = {&A->wq, &A->wk, &A->wv, &A->wo, &A->wq_a, &A->wq_b, &A->wkv_a};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        int rc = ws[i]->data ? fn(ctx, l, &(sl_tensor){.w = ws[i]}) : 0;
        if (rc) return rc;
    }
    sl_tensor vs[] = {
        {.v = &A->q_norm, .len = (size_t)c->head_dim},
        {.v = &A->k_norm, .len = (size_t)c->head_dim},
        {.v = &A->sinks, .len = (size_t)c->n_heads},
        {.v = &A->q_a_norm, .len = (size_t)c->q_lora_rank},
        {.v = &A->kv_a_norm, .len = (size_t)c->kv_lora_rank},
        {.v = &A->wkv_b,
         .len = (size_t)c->n_heads * (size_t)(c->qk_nope_dim + c->v_head_dim) * (size_t)c->kv_lora_rank},
    };
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        int rc = *vs[i].v ? fn(ctx, l, &vs[i]) : 0;
        if (rc) return rc;
    }
    return 0;
}

/* Keys and values of every position, of the session's KV type; latent attention keeps one float32 row of
 * [latent | k_rope] instead (its kernels read the latent as float32, so --kv-type leaves it as it is). */
static void attn_state(const sl_model *m, int l, sl_state_layout *out) {
    const sl_config *c = &m->cfg;
    int latent = m->layers[l].attn->latent;
    *out = (sl_state_layout){.row = latent ? c->kv_lora_rank + c->qk_rope_dim : c->n_kv_heads * c->head_dim,
                             .n_paged = latent ? 1 : 2,
                             .kv_typed = !latent};
}

static int imax(int a, int b) {
    return a > b ? a : b;
}

static int attn_scratch(const sl_model *m, int max_batch, sl_scratch *s, sl_alloc_fn alloc, void *ctx) {
    const sl_config *c = &m->cfg;
    size_t B = (size_t)max_batch, qw = (size_t)sl_config_q_width(c), kv = (size_t)sl_config_kv_width(c);
    /* latent attention: q_a (the query's low-rank input) goes through qraw, the heads' values through att */
    size_t qraw = (size_t)imax((int)qw * 2, c->q_lora_rank), aw = (size_t)imax((int)qw, c->n_heads * c->v_head_dim);
    sl_attn_scratch *x = &s->attn;
    return !(x->qraw = alloc(ctx, B * qraw * 4)) || !(x->q = alloc(ctx, B * qw * 4)) ||
                   !(x->gate = alloc(ctx, B * qw * 4)) || !(x->k = alloc(ctx, B * kv * 4)) ||
                   !(x->v = alloc(ctx, B * kv * 4)) || !(x->att = alloc(ctx, B * aw * 4))
               ? -1
               : 0;
}

const sl_kind sl_kind_attn = {"attention", attn_tensors, attn_state, attn_scratch, attn_forward};
