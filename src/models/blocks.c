#include "models/blocks.h"

#include "models/fused.h"

#include <stdio.h>

int blk_load_outer(sl_model *m, sl_loader *ld, float norm_add, sl_err *e) {
    const sl_config *c = &m->cfg;
    if (sl_ld_linear(ld, "model.embed_tokens", c->vocab_size, c->hidden, &m->embed, e)) return -1;
    if (m->embed.bias) return sl_fail(e, "%s: embedding has an unexpected bias", m->path);
    if (sl_ld_vector(ld, "model.norm.weight", c->hidden, norm_add, &m->final_norm, e)) return -1;
    if (c->tie_embeddings && !sl_ld_has(ld, "lm_head.weight")) {
        m->lm_head = m->embed;
        return 0;
    }
    return sl_ld_linear(ld, "lm_head", c->vocab_size, c->hidden, &m->lm_head, e);
}

int blk_load_norms(sl_model *m, sl_loader *ld, int l, float norm_add, sl_err *e) {
    char nb[256];
    sl_layer *L = &m->layers[l];
    int H = m->cfg.hidden;
    if (sl_ld_vector(ld, NAME(nb, "model.layers.%d.input_layernorm.weight", l), H, norm_add, &L->attn_norm, e))
        return -1;
    return sl_ld_vector(ld, NAME(nb, "model.layers.%d.post_attention_layernorm.weight", l), H, norm_add, &L->ffn_norm,
                        e);
}

/* The layer loop keeps each residual add fused with the norm that follows it: layer l's input norm adds
 * layer l - 1's feed-forward output, its feed-forward norm adds its mixer's output, and the loop ends by
 * adding the last layer's feed-forward output. */
int blk_decoder_layers(sl_model *m, sl_session *s, float *x, int n, sl_err *e) {
    const sl_config *c = &m->cfg;
    float eps = (float)c->rms_eps;
    sl_scratch *t = &s->s;
    (void)e;
    for (int l = 0; l < c->n_layers; l++) {
        const sl_layer *L = &m->layers[l];
        sl_add_rmsnorm(m->be, x, l ? t->ffn_out : NULL, L->attn_norm, n, c->hidden, eps, t->xn);
        L->mixer->forward(m, s, l, t->xn, n, t->mix_out);
        sl_add_rmsnorm(m->be, x, t->mix_out, L->ffn_norm, n, c->hidden, eps, t->xn);
        L->ffn->forward(m, s, l, t->xn, n, t->ffn_out);
    }
    if (c->n_layers > 0) m->be->ops->add(m->be, x, t->ffn_out, (size_t)c->hidden * (size_t)n);
    return 0;
}
