/* Layer kinds (models/kinds.h) over every model fixture: each layer has a mixer and a feed-forward; the
 * tensor walk visits each tensor once and covers every parameter the loader read (so placement, which
 * walks it, misses none); the walk stops where the callback says; each layer's state layout is its
 * kind's (keys and values per position, latent attention's one row, the delta-net's fixed conv and
 * recurrent state) and sessions size their KV bytes from it. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "runtime/session.h"
#include "testutil.h"

static const char *const fixtures[] = {
    "models/llama",           "models/llama31",
    "models/mistral",         "models/mistral_swa",
    "models/qwen2",           "models/qwen3",
    "models/qwen3_5_moe",     "models/qwen3_5_moe_mlx4",
    "models/qwen3_moe",       "models/qwen3_moe_mlx_mixed",
    "families/deepseek_v3",   "families/deepseek_v3_fp8",
    "families/glm4_moe",      "families/gpt_oss",
    "families/gpt_oss_mxfp4", "families/mixtral",
    "families/qwen3_next",
};

static sl_model *load(const char *rel) {
    char *path = tu_fixture(rel);
    sl_err e = {{0}};
    sl_model *m = NULL;
    sl_model_opts o = {.threads = 1, .backend = "cpu"};
    cr_assert_eq(sl_model_load(path, &o, &m, &e), 0, "%s: %s", rel, e.msg);
    free(path);
    return m;
}

typedef struct {
    const void **seen;
    int n, cap;
    uint64_t params;
    int experts;
    int stop_at; /* > 0: return 7 at this visit */
} walk;

static int visit(void *ctx, int l, const sl_tensor *t) {
    walk *w = ctx;
    const void *p = t->w ? (const void *)t->w : (const void *)t->v;
    cr_assert(l >= 0);
    cr_assert((t->w == NULL) != (t->v == NULL), "a tensor is a matrix or a vector");
    if (t->w) {
        cr_assert_not_null(t->w->data, "absent weights are skipped");
        w->params += (uint64_t)t->w->rows * ((uint64_t)t->w->cols + (t->w->bias != NULL));
        w->experts += t->expert;
    } else {
        cr_assert_not_null(*t->v, "absent vectors are skipped");
        cr_assert_gt(t->len, 0);
        w->params += t->len;
    }
    for (int i = 0; i < w->n; i++) cr_assert_neq(w->seen[i], p, "tensor %d visited twice", i);
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 256;
        w->seen = realloc(w->seen, sizeof *w->seen * (size_t)w->cap);
    }
    w->seen[w->n++] = p;
    return w->stop_at && w->n == w->stop_at ? 7 : 0;
}

Test(kinds, tensor_walk_covers_every_parameter) {
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        sl_model *m = load(fixtures[f]);
        const sl_config *c = &m->cfg;
        walk w = {0};
        cr_assert_eq(sl_model_tensors(m, visit, &w), 0);
        int want_experts = 0;
        for (int l = 0; l < c->n_layers; l++) {
            const sl_layer *L = &m->layers[l];
            cr_assert((L->attn != NULL) + (L->dn != NULL) == 1, "%s layer %d: one mixer", fixtures[f], l);
            cr_assert((L->mlp != NULL) + (L->moe != NULL) == 1, "%s layer %d: one feed-forward", fixtures[f], l);
            cr_assert_eq(L->mixer, L->attn ? &sl_kind_attn : &sl_kind_deltanet);
            cr_assert_eq(L->ffn, L->mlp ? &sl_kind_mlp : &sl_kind_moe);
            for (int x = 0; L->moe && x < L->moe->experts.n_experts; x++)
                want_experts += 2 + (L->moe->expert_store[x].up.data != NULL);
        }
        cr_assert_eq(w.experts, want_experts, "%s: every routed expert's weights", fixtures[f]);
        /* the model's own tensors beside the layers' */
        uint64_t outer = (uint64_t)m->embed.rows * (uint64_t)m->embed.cols + (uint64_t)c->hidden;
        if (m->lm_head.data != m->embed.data) outer += (uint64_t)m->lm_head.rows * (uint64_t)m->lm_head.cols;
        cr_assert_eq(w.params + outer, m->n_params, "%s: the walk covers %llu of %llu parameters", fixtures[f],
                     (unsigned long long)(w.params + outer), (unsigned long long)m->n_params);
        free(w.seen);
        sl_model_free(m);
    }
}

Test(kinds, tensor_walk_stops_where_told) {
    sl_model *m = load("models/qwen3_5_moe");
    walk w = {.stop_at = 5};
    cr_assert_eq(sl_model_tensors(m, visit, &w), 7);
    cr_assert_eq(w.n, 5);
    free(w.seen);
    sl_model_free(m);
}

Test(kinds, state_layout_per_kind) {
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        sl_model *m = load(fixtures[f]);
        const sl_config *c = &m->cfg;
        size_t kv = 0, kv16 = 0;
        int fixed = 0;
        for (int l = 0; l < c->n_layers; l++) {
            const sl_layer *L = &m->layers[l];
            sl_state_layout st;
            sl_layer_layout(m, l, &st);
            if (L->dn) {
                cr_assert_eq(st.n_paged, 0);
                cr_assert_eq(st.n_fixed, 2);
                cr_assert_eq(st.fixed[0], (size_t)(c->conv_kernel - 1) * (size_t)sl_config_conv_dim(c));
                cr_assert_eq(st.fixed[1], sl_config_ssm_floats(c));
            } else if (L->attn->latent) {
                cr_assert_eq(st.n_paged, 1);
                cr_assert_eq(st.row, c->kv_lora_rank + c->qk_rope_dim);
                cr_assert_eq(st.n_fixed, 0);
            } else {
                cr_assert_eq(st.n_paged, 2);
                cr_assert_eq(st.row, c->n_kv_heads * c->head_dim);
                cr_assert_eq(st.n_fixed, 0);
            }
            kv += (size_t)st.row * (size_t)st.n_paged * 4;
            /* f16 halves the attention caches; latent attention's stays float32 */
            kv16 += (size_t)st.row * (size_t)st.n_paged * (L->attn && !L->attn->latent ? 2 : 4);
            fixed += st.n_fixed;
        }
        cr_assert_eq(sl_session_kv_bytes_per_token(m, SL_KV_F32), kv);
        cr_assert_eq(sl_session_kv_bytes_per_token(m, SL_KV_F16), kv16);
        cr_assert_eq(sl_session_kv_bytes_per_token(m, SL_KV_BF16), kv16);
        sl_session *s;
        sl_err e = {{0}};
        cr_assert_eq(sl_session_create(m, 64, &s, &e), 0, "%s", e.msg);
        cr_assert_eq(s->recurrent, fixed > 0, "%s: recurrent exactly when some layer keeps fixed state", fixtures[f]);
        for (int l = 0; l < c->n_layers; l++)
            for (int i = 0; i < SL_STATE_BUFS; i++) {
                cr_assert_eq(s->state[l].paged[i] != NULL, i < s->state[l].lay.n_paged);
                cr_assert_eq(s->state[l].fixed[i] != NULL, i < s->state[l].lay.n_fixed);
            }
        sl_session_free(s);
        sl_model_free(m);
    }
}
