#include "models/model.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "formats/gguf_model.h"
#include "formats/resolve.h"
#include "models/loader.h"
#include "models/registry.h"
#include "models/rope.h"

void sl_model_free(sl_model *m) {
    if (!m) return;
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers; l++) {
            free(m->layers[l].expert_store);
            free(m->layers[l].experts.experts);
        }
    free(m->layers);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->inv_freq);
    sl_st_close(m->st);
    sl_backend_destroy(m->be);
    sl_config_free(&m->cfg);
    free(m->path);
    free(m);
}

static void account(sl_model *m) {
    uint64_t ex = 0, total = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const sl_layer *L = &m->layers[l];
        for (int e = 0; L->is_moe && e < L->experts.n_experts; e++) {
            const sl_expert *x = L->experts.experts[e];
            ex += sl_weight_bytes(&x->gate) + sl_weight_bytes(&x->up) + sl_weight_bytes(&x->down);
        }
    }
    for (int i = 0; i < m->st->n_files; i++) total += m->st->map_sizes[i];
    m->bytes_experts = ex;
    m->bytes_other = total > ex ? total - ex : 0;
}

/* GGUF files of Llama 3 style scaled RoPE carry the scaling as per-frequency divisors (rope_freqs). */
static int rope_freq_factors(sl_model *m, sl_loader *ld, sl_err *e) {
    float *f;
    if (sl_ld_vector(ld, "rope_freqs.weight", m->rot_dim / 2, 0.0f, &f, e)) return -1;
    for (int i = 0; i < m->rot_dim / 2; i++) {
        if (!(f[i] > 0))
            return sl_fail(e, "%s: tensor 'rope_freqs.weight' element %d is %g (expected a positive divisor)", m->path,
                           i, (double)f[i]);
        m->inv_freq[i] /= f[i];
    }
    m->n_params -= (uint64_t)(m->rot_dim / 2);
    return 0;
}

/* Config and tensor table of a GGUF file; its mappings move into m->st. */
static int open_gguf(sl_model *m, sl_err *e) {
    sl_gguf *g;
    if (sl_gguf_open(m->path, &g, e)) return -1;
    int rc = sl_gguf_config(g, &m->cfg, e) || sl_gguf_tensor_set(g, &m->cfg, &m->st, e) ? -1 : 0;
    sl_gguf_close(g);
    return rc;
}

int sl_model_load(const char *arg, const sl_model_opts *o, sl_model **out, sl_err *e) {
    char *path;
    if (sl_resolve_model(arg, &path, e)) return -1;
    int gguf = !sl_is_dir(path) && sl_gguf_is_path(path);
    if (!sl_is_dir(path) && !gguf) {
        sl_fail(e, "%s: not a model directory or .gguf file (expected a folder with config.json and *.safetensors)",
                path);
        free(path);
        return -1;
    }
    sl_model *m = calloc(1, sizeof *m);
    if (!m) {
        free(path);
        return sl_fail(e, "out of memory");
    }
    m->path = path;
    m->cfg_suffix = gguf ? " metadata" : "/config.json";
    sl_loader ld = {0};
    if (gguf) {
        if (open_gguf(m, e)) goto fail;
    } else if (sl_config_load(path, &m->cfg, e)) {
        goto fail;
    }
    m->family = sl_family_for(m->cfg.model_type);
    if (!m->family) {
        sl_fail(e, "%s%s: unknown model_type '%s' (supported: %s)", path, m->cfg_suffix, m->cfg.model_type,
                sl_supported_types());
        goto fail;
    }
    if (!gguf && sl_st_open_dir(path, &m->st, e)) goto fail;
    if (sl_cpu_backend_create(o ? o->threads : 0, &m->be, e)) goto fail;
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (!m->layers) {
        sl_fail(e, "out of memory");
        goto fail;
    }
    if (sl_loader_init(&ld, m, e)) goto fail;
    m->rot_dim = (int)(m->cfg.head_dim * m->cfg.rope.partial_factor);
    m->rot_dim -= m->rot_dim % 2;
    m->inv_freq = calloc((size_t)(m->rot_dim / 2 + 1), sizeof *m->inv_freq);
    if (!m->inv_freq) {
        sl_fail(e, "out of memory");
        goto fail;
    }
    sl_rope_inv_freq(&m->cfg.rope, m->rot_dim, m->inv_freq, &m->attn_factor);
    if (sl_ld_has(&ld, "rope_freqs.weight") && rope_freq_factors(m, &ld, e)) goto fail;
    if (m->family->load(m, &ld, e)) goto fail;
    if (sl_ld_check_all_used(&ld, e)) goto fail;
    sl_loader_free(&ld);
    account(m);
    *out = m;
    return 0;
fail:
    sl_loader_free(&ld);
    sl_model_free(m);
    return -1;
}
