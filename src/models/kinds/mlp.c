/* The dense feed-forward kind: down(silu(gate x) * up x). No state. */
#include "models/blocks.h"
#include "models/fused.h"

int blk_load_mlp(sl_model *m, sl_loader *ld, int l, sl_err *e) {
    const sl_config *c = &m->cfg;
    sl_layer *L = &m->layers[l];
    char nb[256];
    if (c->intermediate <= 0)
        return sl_fail(e, "%s%s: intermediate_size missing for dense layer %d", m->path, m->cfg_suffix, l);
    sl_mlp *F = L->mlp = sl_ld_part(ld, 1, sizeof *F, e);
    if (!F) return -1;
    L->ffn = &sl_kind_mlp;
    return sl_ld_linear(ld, NAME(nb, "model.layers.%d.mlp.gate_proj", l), c->intermediate, c->hidden, &F->gate, e) ||
                   sl_ld_linear(ld, NAME(nb, "model.layers.%d.mlp.up_proj", l), c->intermediate, c->hidden, &F->up,
                                e) ||
                   sl_ld_linear(ld, NAME(nb, "model.layers.%d.mlp.down_proj", l), c->hidden, c->intermediate, &F->down,
                                e)
               ? -1
               : 0;
}

static void mlp_forward(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out) {
    const sl_mlp *F = m->layers[l].mlp;
    sl_mlp_scratch *x = &s->s.mlp;
    const sl_weight *w[2] = {&F->gate, &F->up};
    float *y[2] = {x->g, x->u};
    sl_matmul_multi(m->be, 2, w, xn, n, y);
    sl_swiglu_matmul(m->be, &F->down, x->g, x->u, n, NULL, NULL, out);
}

static int mlp_tensors(sl_model *m, int l, sl_tensor_fn fn, void *ctx) {
    sl_mlp *F = m->layers[l].mlp;
    sl_weight *ws[] = {&F->gate, &F->up, &F->down};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        int rc = ws[i]->data ? fn(ctx, l, &(sl_tensor){.w = ws[i]}) : 0;
        if (rc) return rc;
    }
    return 0;
}

static int mlp_scratch(const sl_model *m, int max_batch, sl_scratch *s, sl_alloc_fn alloc, void *ctx) {
    size_t bytes = (size_t)max_batch * (size_t)m->cfg.intermediate * 4;
    return !(s->mlp.g = alloc(ctx, bytes)) || !(s->mlp.u = alloc(ctx, bytes)) ? -1 : 0;
}

const sl_kind sl_kind_mlp = {"mlp", mlp_tensors, NULL, mlp_scratch, mlp_forward};
