/* What every layer kind shares: walking a layer's parts. */
#include "models/model.h"

int sl_layer_tensors(sl_model *m, int l, sl_tensor_fn fn, void *ctx) {
    sl_layer *L = &m->layers[l];
    size_t H = (size_t)m->cfg.hidden;
    int rc = L->attn_norm ? fn(ctx, l, &(sl_tensor){.v = &L->attn_norm, .len = H}) : 0;
    if (!rc && L->ffn_norm) rc = fn(ctx, l, &(sl_tensor){.v = &L->ffn_norm, .len = H});
    if (!rc && L->mixer) rc = L->mixer->tensors(m, l, fn, ctx);
    if (!rc && L->ffn) rc = L->ffn->tensors(m, l, fn, ctx);
    return rc;
}

int sl_model_tensors(sl_model *m, sl_tensor_fn fn, void *ctx) {
    int rc = 0;
    for (int l = 0; !rc && l < m->cfg.n_layers; l++) rc = sl_layer_tensors(m, l, fn, ctx);
    return rc;
}

void sl_layer_layout(const sl_model *m, int l, sl_state_layout *out) {
    const sl_layer *L = &m->layers[l];
    *out = (sl_state_layout){0};
    if (L->mixer && L->mixer->state)
        L->mixer->state(m, l, out);
    else if (L->ffn && L->ffn->state)
        L->ffn->state(m, l, out);
}

int sl_model_kinds(const sl_model *m, const sl_kind **out, int max) {
    int n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const sl_kind *k[2] = {m->layers[l].mixer, m->layers[l].ffn};
        for (int i = 0; i < 2; i++) {
            int seen = !k[i];
            for (int j = 0; j < n && !seen; j++) seen = out[j] == k[i];
            if (!seen && n < max) out[n++] = k[i];
        }
    }
    return n;
}
