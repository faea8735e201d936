/* The op interface every backend implements. Models are written against these ops only, so the same
 * forward pass runs on the CPU reference and on a GPU twin. Activation pointers come from the backend's
 * own alloc() (host memory on the CPU, device memory on a GPU); models never dereference them.
 *
 * Layout conventions: activations are float32 row-major [n tokens][width]. A batch holds tokens of one or
 * more sequences (sl_batch_map says where each belongs). KV caches are pools of pages: page_size rows of
 * [n_kv * head_dim] elements of the cache's sl_kv_type each, per layer (latent attention: one float32
 * cache of [kv_lora + rope] rows); a sequence's page table lists its pages in position order. */
#ifndef SLUICE_BACKEND_BACKEND_H
#define SLUICE_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/ggml_types.h"
#include "backend/weight.h"
#include "core/err.h"

/* One routed expert: SwiGLU MLP down(act(gate x, up x)). With no up weight (up.data NULL) gate holds
 * both projections with their rows interleaved, as gpt-oss stores them: gate row 2i is gate output i,
 * row 2i + 1 up output i ([2 * inter, hidden]). Each weight may carry its bias. */
typedef struct sl_expert {
    sl_weight gate, up, down;
} sl_expert;

/* Per-layer table of expert pointers. Resident models point into the checkpoint; an expert store hands
 * in its own slots by rewriting entries, so layers never own their experts. The activation is the
 * layer's: silu(g) * u when swiglu_limit is 0, else gpt-oss's clamped form g = min(g, limit),
 * u = clamp(u, -limit, limit), g * sigmoid(swiglu_alpha * g) * (u + 1). */
typedef struct sl_expert_table {
    int n_experts;
    const sl_expert **experts;
    float swiglu_alpha, swiglu_limit;
    /* With track set, the owner (an expert store) notes the entries it changed since the last place_experts
     * in [lo, hi) and clears the range after it, so the backend looks at those alone. */
    int track, lo, hi;
} sl_expert_table;

/* The expert activation of gate value g and up value u under table t. */
static inline float sl_expert_act(const sl_expert_table *t, float g, float u) {
    if (t->swiglu_limit <= 0) return g / (1.0f + __builtin_expf(-g)) * u;
    float L = t->swiglu_limit;
    g = g < L ? g : L;
    u = u < -L ? -L : u > L ? L : u;
    return g / (1.0f + __builtin_expf(-t->swiglu_alpha * g)) * (u + 1.0f);
}

/* Dimensions of a gated delta-net (linear attention) layer. Value head h reads key head
 * h / (n_v_heads / n_k_heads) (grouped, Hugging Face order), or h % n_k_heads when `tiled` (GGUF order). */
typedef struct sl_deltanet_dims {
    int n_k_heads, n_v_heads, k_dim, v_dim, conv_kernel;
    int tiled;
} sl_deltanet_dims;

/* Dimensions of a multi-head latent attention layer (DeepSeek-V2/V3). A head's query is [nope | rope];
 * its key is [kv_b_k . latent | k_rope] and its value kv_b_v . latent, where the latent (kv_lora values)
 * and k_rope (rope values, shared by all heads) are what the cache keeps: rows of kv_lora + rope floats.
 * interleave: rotary pairs are adjacent dims (2i, 2i + 1) instead of i and i + rope / 2. */
typedef struct sl_mla_dims {
    int n_heads, nope, rope, kv_lora, v;
    int interleave;
} sl_mla_dims;

typedef struct sl_backend sl_backend;

/* Element type of the attention KV caches: stores round to nearest even, attention widens to float32.
 * SL_KV_AUTO is for options only (sessions, model loads): the backend's default, f16 on CUDA (half the
 * bytes to keep and to read), f32 on the CPU reference. Ops always get one of the others. SL_KV_Q8_0 is an
 * approximation, asked for by name only: blocks of 32 values as GGML's Q8_0 (an fp16 scale, the largest
 * magnitude over 127, and 32 signed bytes), 34 bytes where f16 takes 64; a row's heads start on a block
 * (head_dim a multiple of 32). */
typedef enum sl_kv_type { SL_KV_AUTO, SL_KV_F32, SL_KV_F16, SL_KV_BF16, SL_KV_Q8_0 } sl_kv_type;

/* Bytes of n cache values (n a multiple of 32 for q8_0). */
static inline size_t sl_kv_bytes(sl_kv_type t, size_t n) {
    if (t == SL_KV_Q8_0) return sl_ggml_row_bytes(SL_GGML_Q8_0, (int64_t)n);
    return n * (t == SL_KV_F16 || t == SL_KV_BF16 ? 2 : 4);
}
/* "f32", "f16", "bf16", "q8_0" ("auto" for SL_KV_AUTO). */
const char *sl_kv_type_name(sl_kv_type t);
/* One of "f32", "f16", "bf16", "q8_0" into *out; -1 for anything else. */
int sl_kv_type_parse(const char *s, sl_kv_type *out);
/* t itself, or for SL_KV_AUTO the default of backend b. */
sl_kv_type sl_kv_type_resolve(const sl_backend *b, sl_kv_type t);

/* Where the tokens of a batch belong. The tokens of one sequence are consecutive in the batch and at
 * consecutive positions. pos, seq and pages are in backend memory and the kernels read them there, so a
 * recorded step replays for any positions, and for any page tables of the sequences it was recorded
 * with. Token i's key and value live in cache row pages[seq[i] * max_pages + pos[i] / page_size] *
 * page_size + pos[i] % page_size. The host copies give launch shapes. */
typedef struct sl_batch_map {
    int n;
    const int32_t *pos, *seq; /* [n]: position in its sequence, sequence slot */
    const int32_t *pages;     /* [slots * max_pages] page tables */
    int page_size, max_pages;
    const int32_t *h_pos, *h_seq; /* host copies of pos and seq */
    int span;                     /* the largest position + 1 */
} sl_batch_map;

/* Cache row of position p of slot s under map m (host-side page tables, as the CPU backend keeps them). */
static inline int64_t sl_bm_row(const sl_batch_map *m, const int32_t *pages, int s, int p) {
    return (int64_t)pages[(int64_t)s * m->max_pages + p / m->page_size] * m->page_size + p % m->page_size;
}

/* A MoE layer of a device step handed to the host (moe_handoff, moe_await): host memory from host_alloc,
 * written by the backend (x, ids, then ready) and by the host (the rows it computed, cnt, then done). */
typedef struct sl_handoff {
    volatile uint32_t ready, done;
    volatile int32_t cnt;
    volatile uint64_t t_ready, t_wait; /* backend clock, ns (see moe_guard) */
    float *x;                          /* [SL_HANDOFF_PAIRS][hidden] floats room (n <= SL_HANDOFF_PAIRS tokens) */
    int32_t *ids;                      /* [SL_HANDOFF_PAIRS] */
} sl_handoff;
#define SL_HANDOFF_PAIRS 64
#define SL_HANDOFF_LOST (1 << 20)

/* Most tokens of a recorded step. */
#define SL_STEP_MAX 256

/* Most weights one matmul_multi call takes. */
#define SL_MATMUL_MULTI 4

typedef struct sl_backend_ops {
    const char *name;
    /* zero-filled buffer for activations, caches and state; NULL when out of memory */
    void *(*alloc)(sl_backend *b, size_t bytes);
    void (*free)(sl_backend *b, void *p);
    void (*zero)(sl_backend *b, void *p, size_t bytes);
    /* host <-> backend copies of activations */
    void (*upload)(sl_backend *b, void *dst, const void *src, size_t bytes);
    void (*download)(sl_backend *b, void *dst, const void *src, size_t bytes);
    /* Ops report failures (out of memory, device errors) through a sticky flag, as GPU streams do:
     * returns -1 with the first failure's message since the last call, and clears it. */
    int (*check)(sl_backend *b, sl_err *e);
    /* For each of `rows` rows of n values at x (row r at x + r n), the index of the largest (NaN counts as
     * -inf; the lowest index among equals), or -1 when none is above -inf, into out[r] on the host: greedy
     * decoding without copying the logits to the host, every sequence of a batch in one pass. Waits for the
     * ops before it, as download does (a failure goes to check, and out then holds -1). Every backend has it. */
    void (*argmax)(sl_backend *b, const float *x, int rows, int n, int32_t *out);

    /* out[i] = row ids[i] of w (dequantised) */
    void (*embed)(sl_backend *b, const sl_weight *w, const int32_t *ids, int n, float *out);
    /* y[n][w.rows] = x[n][w.cols] . w^T (+ w.bias) */
    void (*matmul)(sl_backend *b, const sl_weight *w, const float *x, int n, float *y);
    /* y = x / rms(x) * w over rows of `dim` (w NULL: no weight); x may equal y */
    void (*rmsnorm)(sl_backend *b, const float *x, const float *w, int rows, int dim, float eps, float *y);
    /* rotary embedding, neox (rotate-half) pairing over the first rot_dim dims of each head, in place:
     * x[bm->n][stride], heads at x + h*head_dim; token i sits at position bm->pos[i] */
    void (*rope)(sl_backend *b, float *x, int stride, int n_heads, int head_dim, int rot_dim, const sl_batch_map *bm,
                 const float *inv_freq, float attn_factor);
    /* dst[i][0:width] = src[i][0:width] with row strides */
    void (*copy_rows)(sl_backend *b, float *dst, int dst_stride, const float *src, int src_stride, int n, int width);
    /* causal GQA attention of the batch's queries, each over positions [0, pos] of its own sequence's
     * cache pages; the new keys/values must already be in the caches. window > 0 limits each query to the
     * last `window` positions (itself included). sinks (NULL: none) holds a learned logit per query head
     * that joins the softmax's denominator and attends to no value (gpt-oss). The caches hold elements of
     * type kt, widened to float32 as they are read. out[n][n_heads * head_dim]. */
    void (*attention)(sl_backend *b, const float *q, const void *kc, const void *vc, sl_kv_type kt,
                      const sl_batch_map *bm, int n_heads, int n_kv, int head_dim, int window, float scale,
                      const float *sinks, float *out);
    void (*add)(sl_backend *b, float *y, const float *x, size_t len);                      /* y += x */
    void (*swiglu)(sl_backend *b, const float *g, const float *u, size_t len, float *out); /* silu(g)*u */
    void (*mul_sigmoid)(sl_backend *b, float *x, const float *g, size_t len);              /* x *= sigmoid(g) */
    /* x[i][:] *= sigmoid(s[i]) for rows of dim */
    void (*scale_rows_sigmoid)(sl_backend *b, float *x, const float *s, int rows, int dim);
    /* softmax over logits[n][n_experts], top-k, optional renormalisation -> ids[n][k], weights[n][k] */
    void (*route)(sl_backend *b, const float *logits, int n, int n_experts, int k, int renorm, int32_t *ids,
                  float *weights);
    /* Sigmoid routing (DeepSeek-V3, GLM-4.5) of logits[n][n_experts]: s = sigmoid(logits); the choice
     * goes by s + bias (bias [n_experts], NULL: none) among the experts of the topk_group groups (of
     * n_group equal groups) whose two best biased scores sum highest, the other experts counting as 0;
     * weights are the chosen experts' s, divided by their sum when renorm, times scale. */
    void (*route_grouped)(sl_backend *b, const float *logits, const float *bias, int n, int n_experts, int k,
                          int n_group, int topk_group, int renorm, float scale, int32_t *ids, float *weights);
    /* out[n][hidden] = sum over k of weights * expert(x) (overwrites out) */
    void (*moe)(sl_backend *b, const sl_expert_table *t, const float *x, int n, int hidden, const int32_t *ids,
                const float *weights, int k, float *out);
    /* The same MoE in two steps, for an expert store whose slots may hold only part of a layer's experts
     * at a time. moe_pairs computes P[i] = expert ids[i] of t applied to x[i / k] for every routed pair
     * i < n*k with ids[i] >= 0 into the backend's pair buffer, leaving the other rows as earlier calls
     * left them; moe_combine then writes out[t] = sum over slots s of weights[t][s] * P[t*k + s], summed in
     * slot order. A pair's result does not depend on which other pairs share the call, so experts loaded
     * in several passes give the bits of one moe() call. */
    void (*moe_pairs)(sl_backend *b, const sl_expert_table *t, const float *x, int n, int hidden, const int32_t *ids,
                      int k);
    void (*moe_combine)(sl_backend *b, const float *weights, int n, int k, int hidden, float *out);
    /* For an expert store's steps that run without the host (no routing read back per layer): copies the
     * nk routed ids to rec, then sets to -1 each id whose expert t lacks (as the backend's copy of t,
     * place_experts', holds it; an id outside [0, t->n_experts) too) and adds the number of those to *miss.
     * ids, rec and miss are backend memory. moe_pairs then skips those pairs.
     * With host (backend memory [t->n_experts], else NULL), the experts whose host[x] is set (their bytes
     * in host memory) may be computed by the host instead: of those routed (each counted once), the first
     * round(*share * m) of the m in routing order are, and the rest stay with t's entry; an expert t lacks
     * with host[x] set is always the host's. The host's pairs get -1 in ids, not counted, and their ids in
     * host_ids (the others -1). share and host_ids are backend memory. Such a device step hands the layer
     * to the host and takes its pairs back: moe_handoff, after the ops before it, copies x [n][hidden] and
     * host_ids to h's x and ids (host memory from host_alloc) and then sets h->ready; moe_await waits until
     * the host set h->done, then puts P[idx[r]] = rows[r] for r < h->cnt (host memory the host wrote before
     * h->done) into the pair buffer as moe_pairs_put does. A backend that runs ops as they are issued, or
     * the GPU's outside a recording, first waits for its queue and calls serve(ctx, h) itself; in a
     * recording the wait is recorded, and the caller serves h once the recording runs. A wait that lasts
     * beyond reason adds SL_HANDOFF_LOST to *miss and stops waiting. Backends with a clock of their own
     * write the times of h's handoff and of the start of the wait (its own part done) to h->t_ready, t_wait. */
    void (*moe_guard)(sl_backend *b, const sl_expert_table *t, int32_t *ids, int nk, int32_t *rec, int32_t *miss,
                      const uint8_t *host, const float *share, int32_t *host_ids);
    void (*moe_handoff)(sl_backend *b, const float *x, int n, int hidden, const int32_t *ids, int nk, sl_handoff *h);
    void (*moe_await)(sl_backend *b, sl_handoff *h, const float *rows, const int32_t *idx, int n, int k, int hidden,
                      int32_t *miss, void (*serve)(void *ctx, sl_handoff *h), void *ctx);
    /* Pair outputs computed elsewhere (an expert store's CPU experts): P[idx[r]] = rows[r] for r < cnt in the
     * pair buffer of n*k pairs that moe_combine reads next. rows and idx are host memory, from host_alloc on
     * backends that have it, left unchanged until sync returns. Issued after the layer's moe_pairs calls, so
     * every pair is written once, by one or the other. */
    void (*moe_pairs_put)(sl_backend *b, const float *rows, const int32_t *idx, int cnt, int n, int k, int hidden);
    /* The reverse, for a backend computing experts for another: rows[r] = P[idx[r]] into host memory after
     * moe_pairs (NULL where the pair buffer is not host memory). */
    void (*moe_pairs_get)(sl_backend *b, float *rows, const int32_t *idx, int cnt, int hidden);
    /* depthwise causal conv over time + SiLU: x[n][channels] -> out; state holds the previous
     * conv_kernel-1 inputs [conv_kernel-1][channels] and is advanced. w is [channels][conv_kernel]. */
    void (*conv1d_silu)(sl_backend *b, const float *x, int n, int channels, const float *w, int kernel, float *state,
                        float *out);
    /* gated delta rule over n tokens for one layer. qkv[n][2*nk*kd + nv*vd] (post-conv), a/b [n][nv],
     * state [nv][kd][vd] advanced in place; out[n][nv*vd]. */
    void (*deltanet)(sl_backend *b, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                     const float *A_log, const float *dt_bias, float *state, int n, float *out);
    /* conv1d_silu and deltanet over a decode batch: the n tokens of bm, each alone in its sequence, token
     * i's state at state + bm->seq[i] * stride floats (one launch for all sequences). Optional: without
     * them the models call conv1d_silu and deltanet once per sequence. */
    void (*conv1d_silu_seqs)(sl_backend *b, const float *x, int channels, const float *w, int kernel, float *state,
                             size_t stride, const sl_batch_map *bm, float *out);
    void (*deltanet_seqs)(sl_backend *b, const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                          const float *A_log, const float *dt_bias, float *state, size_t stride, const sl_batch_map *bm,
                          float *out);
    /* y = rmsnorm(x) * w * silu(z) over rows of dim (in place on x) */
    void (*gated_rmsnorm)(sl_backend *b, float *x, const float *z, const float *w, int rows, int dim, float eps);
    /* the cache row of token i (see sl_batch_map) = x[i][0:width] rounded to the cache's type kt: the
     * KV-cache write of a batch */
    void (*kv_store)(sl_backend *b, void *cache, sl_kv_type kt, const sl_batch_map *bm, const float *x, int width);
    /* The inputs of a latent attention layer: q [n][n_heads * (nope + rope)] gets the rotary embedding on
     * each head's rope part; kv [n][kv_lora + rope] gets RMSNorm by kv_norm on its latent and the rotary
     * embedding on its rope part, in place; then each kv row goes to the token's row of cache. */
    void (*mla_rope_store)(sl_backend *b, float *q, float *kv, const sl_batch_map *bm, const sl_mla_dims *d,
                           const float *kv_norm, float eps, const float *inv_freq, float attn_factor, float *cache);
    /* Causal latent attention of the batch's queries over [0, pos] of their sequences' caches, with
     * kv_b_proj absorbed: each head's query nope part goes through its key rows of wkv_b (float32
     * [n_heads * (nope + v)][kv_lora]) into latent space, scores are q_latent . latent + q_rope . k_rope
     * times scale, and the weighted latent comes back through the head's value rows. out[n][n_heads * v]. */
    void (*mla_attention)(sl_backend *b, const float *q, const float *cache, const sl_batch_map *bm,
                          const sl_mla_dims *d, const float *wkv_b, float scale, float *out);

    /* Optional ops: NULL where the backend has no use for them. */

    /* Fused sequences: one pass (one GPU launch) instead of several ops. Models issue them through
     * models/fused.h, which falls back to the plain ops where a backend leaves them NULL. */
    /* x += d, then y = rmsnorm(x) * w over rows of dim (w NULL: no weight): a residual add and the
     * norm that follows it */
    void (*add_rmsnorm)(sl_backend *b, float *x, const float *d, const float *w, int rows, int dim, float eps,
                        float *y);
    /* y[i][n][w[i].rows] = x[n][cols] . w[i]^T (+ bias) for nw <= SL_MATMUL_MULTI weights of the same
     * cols sharing one input (q/k/v, gate/up, the delta-net's input projections) */
    void (*matmul_multi)(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y);
    /* matmul_multi whose first output goes through the delta-net's causal conv: y[0] =
     * conv1d_silu(x . w[0]^T) with taps conv_w [w[0].rows][kernel] and state advanced as conv1d_silu does */
    void (*matmul_multi_conv)(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y,
                              const float *conv_w, int kernel, float *state);
    /* p[n][w.rows] = (silu(g) * u)[n][w.cols] . w^T, the SwiGLU and the down projection of an MLP; then
     * y = p, or with gate (a sigmoid-gated shared expert joining the routed experts' sum)
     * y[i][:] += sigmoid(gate[i]) * p[i][:] */
    void (*swiglu_matmul)(sl_backend *b, const sl_weight *w, const float *g, const float *u, int n, const float *gate,
                          float *y);
    /* A MoE layer with a sigmoid-gated shared expert whose gate and up projections g, u [n][sh_down.cols]
     * are done: route() of logits [n][n_experts] (top-k, writing ids and weights), then
     * out = moe(t, x, ids, weights) + sigmoid(gate[i]) * (silu(g) * u) . sh_down^T */
    void (*moe_shared)(sl_backend *b, const sl_expert_table *t, const float *logits, int n_experts, int k, int renorm,
                       int32_t *ids, float *weights, const float *x, int n, int hidden, const sl_weight *sh_down,
                       const float *g, const float *u, const float *gate, float *out);
    /* moe_combine joined by a sigmoid-gated shared expert, with the sums moe_shared forms for the same
     * experts t: out = moe_combine(...) + sigmoid(gate[i]) * (silu(g) * u) . sh_down^T */
    void (*moe_combine_shared)(sl_backend *b, const sl_expert_table *t, const float *weights, int n, int k, int hidden,
                               const sl_weight *sh_down, const float *g, const float *u, const float *gate, float *out);
    /* y[n][w.rows] = (x * sigmoid(g))[n][w.cols] . w^T: a sigmoid-gated attention output and its projection */
    void (*sigmoid_matmul)(sl_backend *b, const sl_weight *w, const float *x, const float *g, int n, float *y);
    /* y[n][w.rows] = g[n][w.cols] . w^T with g = gated_rmsnorm(x, z, nw) over groups of dim (the delta-net's
     * output norm and projection); x may be overwritten */
    void (*gated_rmsnorm_matmul)(sl_backend *b, const sl_weight *w, float *x, const float *z, const float *nw, int dim,
                                 float eps, int n, float *y);
    /* The attention inputs of a batch: q [n][n_heads * head_dim] and k [n][n_kv * head_dim] get the
     * per-head RMSNorm by q_norm / k_norm (NULL: none), then the rotary embedding (as rope), in place; then
     * k and v are stored in the caches of type kt (as kv_store). With qg
     * (a gated q projection: rows of [query | gate] per head, [n][n_heads * 2 * head_dim]) the queries are
     * taken from qg into q first and the gates copied to gate [n][n_heads * head_dim]. */
    void (*qk_rope_store)(sl_backend *b, float *q, float *k, const float *v, const sl_batch_map *bm, int n_heads,
                          int n_kv, int head_dim, const float *q_norm, const float *k_norm, float eps, int rot_dim,
                          const float *inv_freq, float attn_factor, void *kc, void *vc, sl_kv_type kt, const float *qg,
                          float *gate);

    /* Resident weights for backends with their own memory: copy a weight (data, scales, biases and bias)
     * or a float vector into memory the backend owns and repoint it there. The CPU computes on the
     * mapped checkpoint instead and leaves these NULL. */
    int (*place_weight)(sl_backend *b, sl_weight *w, sl_err *e);
    /* 1 when the backend has kernels for w's storage format */
    int (*supports)(sl_backend *b, const sl_weight *w);
    int (*place_vector)(sl_backend *b, float **v, size_t len, sl_err *e);
    /* (Re)builds the backend's copy of an expert table whose experts are placed; moe() on t reads that
     * copy, so after rewriting t's entries (an expert store handing in other slots) call it again. */
    int (*place_experts)(sl_backend *b, const sl_expert_table *t, sl_err *e);
    /* Bytes of backend memory still free, for sizing caches. */
    size_t (*mem_free)(sl_backend *b);
    /* Expert slots in backend memory filled from host images (an expert store): pinned host memory
     * (NULL when out of memory), a copy into backend memory queued behind the ops before it (src from
     * host_alloc, left unchanged until sync returns), and a wait for every queued op and copy. Backends
     * that compute on host memory leave them NULL. */
    void *(*host_alloc)(sl_backend *b, size_t bytes);
    void (*host_free)(sl_backend *b, void *p);
    void (*upload_async)(sl_backend *b, void *dst, const void *src, size_t bytes);
    int (*sync)(sl_backend *b, sl_err *e);
    /* Reads from files straight into backend memory (GPUDirect Storage) for an expert store; NULL when
     * the backend has none. gds_open starts it (once; -1 saying why it is unavailable) and sets *direct
     * to 1 when transfers bypass host memory, 0 when the library stages them through host buffers itself.
     * gds_file registers a file opened with O_DIRECT (NULL, said in e, on failure); gds_read runs on any
     * thread: len bytes at off into dst (backend memory), returning the bytes read (fewer only at the
     * end of the file) or -errno. It is not ordered with the queued ops: sync before overwriting memory
     * that queued ops read. */
    int (*gds_open)(sl_backend *b, int *direct, sl_err *e);
    void *(*gds_file)(sl_backend *b, int fd, sl_err *e);
    void (*gds_file_close)(sl_backend *b, void *fh);
    int64_t (*gds_read)(sl_backend *b, void *fh, void *dst, size_t len, uint64_t off);
    /* Recorded decode steps of n <= SL_STEP_MAX tokens. step_begin(b, &rec, n, ids) returns 1 when *rec
     * holds a recording and was replayed for tokens ids (the caller issues no ops), 0 when it started
     * recording the ops that follow until step_end(b, &rec), which runs them and keeps the recording in
     * *rec, and -1 when the caller should just issue the ops. In a recorded step embed's tokens are read
     * at replay time, and positions always come from the batch map's backend memory, so one recording
     * serves every position (its caller re-records when other state, such as which recurrent state each
     * token uses, changes). step_free releases a recording. */
    int (*step_begin)(sl_backend *b, void **rec, int n, const int32_t *ids);
    void (*step_end)(sl_backend *b, void **rec);
    void (*step_free)(sl_backend *b, void *rec);

    /* Physical bounds for benchmarks, measured on first call (optional: NULL when a backend has none):
     * sustained read bandwidth of the memory weights live in, in bytes/s, and the peak multiply-add rate
     * of the datatype prefill matmuls use, in FLOP/s. 0 when the measurement fails. */
    double (*mem_bandwidth)(sl_backend *b);
    double (*peak_flops)(sl_backend *b);
} sl_backend_ops;

struct sl_backend {
    const sl_backend_ops *ops;
    void *impl;
    void (*destroy)(sl_backend *b);
};

/* The CPU reference backend; threads <= 0 uses all cores. Its moe_pairs runs a call of at most
 * SL_CPU_MOE_ONE_PASS_PAIRS routed pairs, each expert with one token, in two pool dispatches for all of
 * them (decode) instead of three per expert. */
int sl_cpu_backend_create(int threads, sl_backend **out, sl_err *e);
#define SL_CPU_MOE_ONE_PASS_PAIRS 64
void sl_backend_destroy(sl_backend *b);

/* The one place that picks a backend for a model. `name` is "cpu", "cuda" or "auto" (NULL: the
 * SLUICE_BACKEND environment variable, else auto). auto takes CUDA when it is compiled in and a device
 * answers, else the CPU. `note` receives a line saying what was chosen and why (empty when the choice
 * was explicit or there was nothing to choose from). */
int sl_backend_open(const char *name, int threads, sl_backend **out, char *note, size_t note_len, sl_err *e);
/* "cpu avx512/avx2, cuda sm_80 sm_90": the backends compiled into this binary. */
const char *sl_backends_compiled(void);

#endif
