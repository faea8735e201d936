/* Layer kinds: the parts decoder layers are built from. A layer is a token mixer (attention, or a gated
 * delta-net) followed by a feed-forward (a dense MLP, or a mixture of experts), each behind an RMSNorm.
 * Each kind owns, in one module under models/kinds/:
 *   - its weights, in its own struct (sl_attn, sl_deltanet, sl_mlp, sl_moe), loaded by a blk_load_*
 *     function (models/blocks.h) that the families call;
 *   - the list of those weights (tensors), which placement, format checks, accounting, bench and show
 *     all walk through sl_layer_tensors instead of naming fields;
 *   - the layout of its per-sequence state (state): paged rows per position (attention's keys and
 *     values) and fixed buffers per sequence (the delta-net's conv window and recurrent state), which
 *     the session allocates, resets, copies and snapshots without knowing what they hold;
 *   - its scratch for a batch (scratch), allocated once per session for all the layers of the kind;
 *   - its forward over a batch (forward), reading the normed inputs and writing [n][hidden].
 *
 * Adding a kind:
 *   1. its weight struct here, a pointer to it in sl_layer (models/model.h), its descriptor's extern;
 *   2. its scratch struct here, as a member of sl_scratch (runtime/session.h);
 *   3. a module models/kinds/NAME.c with the loader (declared in models/blocks.h), which allocates the
 *      struct with sl_ld_part, attaches it to the layer and sets L->mixer or L->ffn to the descriptor,
 *      and the descriptor sl_kind_NAME with its four functions (state may be NULL: no state; a layer has
 *      at most one part with state);
 *   4. the family's loader calls the loader for the layers of that kind; the shared layer loop
 *      (blk_decoder_layers) then runs it through the descriptor;
 *   5. state and scratch need no change elsewhere: the session, its KV budget and the placement reserve
 *      read the layout, and the forward finds its state in s->state[l] (paged[i], sl_session_fixed);
 *   6. what the forward computes is issued as backend ops (backend/backend.h); a fused op specific to
 *      the kind goes into the backend table with a plain-op fallback in models/fused.c, so every backend
 *      runs it. */
#ifndef SLUICE_MODELS_KINDS_H
#define SLUICE_MODELS_KINDS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

typedef struct sl_model sl_model;
typedef struct sl_session sl_session;
typedef struct sl_scratch sl_scratch;

/* --- weights ---------------------------------------------------------------------------------------- */

/* Attention: q/k/v/o projections (grouped-query, full or sliding window), or multi-head latent
 * attention (DeepSeek-V3): wq (no q_lora_rank) or wq_a -> q_a_norm -> wq_b; wkv_a gives [latent |
 * k_rope]; kv_b_proj as float32 [n_heads * (nope + v)][kv_lora], absorbed into the attention op. */
typedef struct sl_attn {
    sl_weight wq, wk, wv, wo;
    float *q_norm, *k_norm; /* per-head RMSNorm (Qwen3, Qwen3.5), NULL otherwise */
    int q_gated;            /* q_proj yields [query | gate] per head (Qwen3.5) */
    int window;             /* sliding window of this layer (0: full attention) */
    float *sinks;           /* per-head attention sink logits (gpt-oss), NULL otherwise */
    int latent;             /* multi-head latent attention: the fields below, not wk / wv */
    sl_weight wq_a, wq_b, wkv_a;
    float *q_a_norm, *kv_a_norm, *wkv_b;
} sl_attn;

/* Gated delta-net (linear attention, Qwen3.5 / Qwen3-Next). */
typedef struct sl_deltanet {
    sl_weight in_qkv, in_z, in_a, in_b, out_proj;
    float *conv_w, *A_log, *dt_bias, *norm;
} sl_deltanet;

/* Dense SwiGLU MLP. */
typedef struct sl_mlp {
    sl_weight gate, up, down;
} sl_mlp;

/* Mixture of experts: router, routed experts, optional shared expert. */
typedef struct sl_moe {
    sl_weight router;
    float *router_bias;      /* e_score_correction_bias of sigmoid routing (NULL: none) */
    sl_expert_table experts; /* pointers into `expert_store` or into a cache's slots */
    sl_expert *expert_store; /* the experts as the checkpoint stores them */
    int has_shared;
    int shared_plain; /* the shared expert joins ungated (DeepSeek-V3, GLM-4.5), not through sh_router */
    sl_weight sh_gate, sh_up, sh_down, sh_router;
} sl_moe;

/* One tensor a part owns: a matrix (w), or a float32 vector the model holds (*v, len floats). */
typedef struct sl_tensor {
    sl_weight *w;
    float **v;
    size_t len;
    int expert; /* w is a routed expert's, as stored: placed resident or streamed, not with the rest */
} sl_tensor;

/* Called per tensor; a non-zero return stops the walk and is returned. */
typedef int (*sl_tensor_fn)(void *ctx, int l, const sl_tensor *t);

/* --- per-sequence state ----------------------------------------------------------------------------- */

#define SL_STATE_BUFS 2

/* What a part keeps per sequence: n_paged caches of `row` elements per position (in the session's pool
 * of pages), and n_fixed buffers of fixed[i] floats per sequence slot. The paged elements are of the
 * session's KV type when kv_typed (attention's keys and values), else float32. */
typedef struct sl_state_layout {
    int row, n_paged;
    int kv_typed;
    int n_fixed;
    size_t fixed[SL_STATE_BUFS];
} sl_state_layout;

/* Bytes of one paged row (one position) of layout lay in a session whose KV type is kt (resolved). */
static inline size_t sl_state_paged_row(const sl_state_layout *lay, sl_kv_type kt) {
    return lay->kv_typed ? sl_kv_bytes(kt, (size_t)lay->row) : (size_t)lay->row * sizeof(float);
}

/* --- scratch ---------------------------------------------------------------------------------------- */

/* Activation buffers of each kind for up to max_batch tokens (backend memory). */
typedef struct sl_attn_scratch {
    float *qraw, *q, *gate, *k, *v, *att;
} sl_attn_scratch;
typedef struct sl_deltanet_scratch {
    float *qkv, *conv, *z, *a, *b, *out;
} sl_deltanet_scratch;
typedef struct sl_mlp_scratch {
    float *g, *u;
} sl_mlp_scratch;
typedef struct sl_moe_scratch {
    float *router, *weights, *sh_gate, *g, *u, *tmp;
    int32_t *ids;
} sl_moe_scratch;

/* Backend allocations of a session: NULL when out of memory. */
typedef void *(*sl_alloc_fn)(void *ctx, size_t bytes);

/* --- descriptors ------------------------------------------------------------------------------------ */

typedef struct sl_kind {
    const char *name;
    /* fn for every tensor of layer l's part that the checkpoint has (optional ones that are absent are
     * skipped) */
    int (*tensors)(sl_model *m, int l, sl_tensor_fn fn, void *ctx);
    /* the per-sequence state of layer l's part; NULL: the kind keeps none */
    void (*state)(const sl_model *m, int l, sl_state_layout *out);
    /* this kind's buffers in x for batches of up to max_batch tokens, sized for all of m's layers */
    int (*scratch)(const sl_model *m, int max_batch, sl_scratch *x, sl_alloc_fn alloc, void *ctx);
    /* out[n][hidden] = the part of layer l on xn (the batch's normed inputs) */
    void (*forward)(sl_model *m, sl_session *s, int l, const float *xn, int n, float *out);
} sl_kind;

extern const sl_kind sl_kind_attn, sl_kind_deltanet, sl_kind_mlp, sl_kind_moe;

/* fn for every tensor of layer l: its norms, then its mixer's and its feed-forward's. */
int sl_layer_tensors(sl_model *m, int l, sl_tensor_fn fn, void *ctx);
/* fn for every tensor of every layer. */
int sl_model_tensors(sl_model *m, sl_tensor_fn fn, void *ctx);
/* The per-sequence state of layer l (zero when it keeps none). */
void sl_layer_layout(const sl_model *m, int l, sl_state_layout *out);
/* The distinct kinds m's layers use, in first-use order, into out[max]; returns how many. */
int sl_model_kinds(const sl_model *m, const sl_kind **out, int max);

#endif
