/* Mixture of experts on the GPU with the routing kept on the device: softmax top-k writes expert ids
 * and weights to device memory, and the expert matmuls look their weights up in a device-side table of
 * the layer's experts (indexed by those ids), so no step waits for the host. For a few tokens each routed
 * (token, slot) pair is one grid row of the GEMV kernel: gate and up, SwiGLU, down, then the weighted
 * combine. Prompts group the pairs by expert first (on the device), and a grid row takes a group of up
 * to 8 of one expert's pairs, reading its weights once for all of them; GGML experts take groups of up to
 * CU_MMQ_GROUP pairs on tensor cores instead (cuda_ggml.cu). */
#include <math.h>

#include "backend/cuda/cuda_int.cuh"

/* one warp per token; with few enough experts the register form, the one the routing expert launch uses,
 * so routing alone (an expert store) picks the same weights to the bit */
__global__ void route_k(const float *logits, int n, int ne, int k, int renorm, int32_t *ids, float *weights) {
    cu_pdl_enter();
    extern __shared__ float rs[];
    int t = blockIdx.x;
    if (ne <= 32 * CU_ROUTE_REG)
        cu_route_reg(logits + (long long)t * ne, ne, k, renorm, NULL, ids + (long long)t * k,
                     weights + (long long)t * k);
    else
        cu_route_warp(logits + (long long)t * ne, ne, k, renorm, rs, NULL, ids + (long long)t * k,
                      weights + (long long)t * k);
}

void cu_route(sl_backend *b, const float *logits, int n, int n_experts, int k, int renorm, int32_t *ids,
              float *weights) {
    cu_impl *c = cu_of(b);
    if (n <= 0) return;
    if (k > 32 || n_experts > 8192) {
        cu_fail(c, "routing: top-%d of %d experts is beyond the CUDA kernel (at most top-32 of 8192)", k, n_experts);
        return;
    }
    cu_launch(c, route_k, n, 32, (size_t)n_experts * sizeof(float), logits, n, n_experts, k, renorm, ids, weights);
    cu_check_launch(c, "routing");
}

/* The lane's best of v[x] for x = lane, lane + 32, ... < n, then the warp's: the largest value, the lowest
 * index among equals (as torch.topk and the CPU pick). */
__device__ __forceinline__ int warp_argmax(const float *v, int n, int lane) {
    float bv = -INFINITY;
    int bi = n;
    for (int x = lane; x < n; x += 32)
        if (v[x] > bv) {
            bv = v[x];
            bi = x;
        }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    return bi;
}

/* Sigmoid routing, one warp per token (see route_grouped in backend.h). Shared memory: sigmoid scores
 * [ne], biased scores [ne], group scores [ng]. A chosen group or expert is marked -inf, so the next
 * repeated max skips it; the masked experts count as 0, as transformers' masked_fill leaves them. */
__global__ void route_grouped_k(const float *logits, const float *bias, int ne, int k, int ng, int tg, int renorm,
                                float scale, int32_t *ids, float *weights) {
    cu_pdl_enter();
    extern __shared__ float rg[];
    float *s = rg, *sc = s + ne, *gs = sc + ne;
    int t = blockIdx.x, lane = threadIdx.x, per = ne / ng;
    const float *l = logits + (long long)t * ne;
    for (int x = lane; x < ne; x += 32) {
        s[x] = cu_sigmoid(l[x]);
        sc[x] = bias ? s[x] + bias[x] : s[x];
    }
    __syncwarp();
    for (int g = lane; g < ng; g += 32) { /* the sum of the group's two best biased scores */
        const float *v = sc + g * per;
        int b1 = 0;
        for (int x = 1; x < per; x++)
            if (v[x] > v[b1]) b1 = x;
        int b2 = -1;
        for (int x = 0; x < per; x++)
            if (x != b1 && (b2 < 0 || v[x] > v[b2])) b2 = x;
        gs[g] = v[b1] + (b2 >= 0 ? v[b2] : 0.0f);
    }
    __syncwarp();
    for (int r = 0; r < tg; r++) { /* chosen groups end as -inf, the others keep their finite scores */
        int g = warp_argmax(gs, ng, lane);
        __syncwarp();
        if (lane == 0) gs[g] = -INFINITY;
        __syncwarp();
    }
    for (int x = lane; x < ne; x += 32)
        if (gs[x / per] != -INFINITY) sc[x] = 0.0f;
    __syncwarp();
    int32_t *id = ids + (long long)t * k;
    float *w = weights + (long long)t * k, tot = 0;
    for (int r = 0; r < k; r++) {
        int x = warp_argmax(sc, ne, lane);
        __syncwarp();
        if (lane == 0) {
            id[r] = x;
            sc[x] = -INFINITY;
        }
        tot += s[x];
        __syncwarp();
    }
    for (int r = lane; r < k; r += 32) {
        float v = s[id[r]];
        w[r] = (renorm ? v / (tot + 1e-20f) : v) * scale;
    }
}

void cu_route_grouped(sl_backend *b, const float *logits, const float *bias, int n, int n_experts, int k, int n_group,
                      int topk_group, int renorm, float scale, int32_t *ids, float *weights) {
    cu_impl *c = cu_of(b);
    if (n <= 0) return;
    if (n_experts > 4096 || n_group < 1 || n_experts % n_group || k > n_experts) {
        cu_fail(c, "routing: top-%d of %d experts in %d groups is beyond the CUDA kernel (at most 4096 experts)", k,
                n_experts, n_group);
        return;
    }
    cu_launch(c, route_grouped_k, n, 32, (size_t)(2 * n_experts + n_group) * sizeof(float), logits, bias, n_experts, k,
              n_group, topk_group, renorm, scale, ids, weights);
    cu_check_launch(c, "grouped routing");
}

/* out[t][j] = sum over slots s of weights[t][s] * d[t * k + s][j] */
__global__ void moe_combine_k(const float *d, const float *weights, int k, int hidden, float *out) {
    cu_pdl_enter();
    int t = blockIdx.y;
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= hidden) return;
    float s = 0;
    for (int x = 0; x < k; x++) s += weights[(long long)t * k + x] * d[((long long)t * k + x) * hidden + j];
    out[(long long)t * hidden + j] = s;
}

static const cu_table *find_table(cu_impl *c, const sl_expert_table *t) {
    for (int i = 0; i < c->n_tables; i++)
        if (c->tables[i].key == t) return &c->tables[i];
    return NULL;
}

/* The routed pairs grouped by expert, in pair order within each expert, so that a group's results do
 * not depend on timing: the counts (atomics), where each expert's pairs and groups start (one warp's scan),
 * then per warp its experts' groups of up to gsize and their pairs (one pass over the ids). ids < 0 (pairs
 * another pass computes) are left out. One block. */
__global__ void moe_group_k(const int32_t *ids, int nk, int ne, int gsize, int *count, int4 *units, int *pairs) {
    cu_pdl_enter();
    extern __shared__ int gs[];
    int *cnt = gs, *pbase = gs + ne, *ubase = gs + 2 * ne;
    for (int e = threadIdx.x; e < ne; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < nk; i += blockDim.x) {
        int e = ids[i];
        if (e >= 0 && e < ne) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* where each expert's pairs and units start: a scan by one warp */
        int lane = threadIdx.x, per = (ne + 31) / 32, e0 = min(lane * per, ne), e1 = min(e0 + per, ne);
        int p = 0, u = 0;
        for (int e = e0; e < e1; e++) {
            p += cnt[e];
            u += (cnt[e] + gsize - 1) / gsize;
        }
        int sp = p, su = u;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int a = __shfl_up_sync(0xffffffffu, sp, o), b = __shfl_up_sync(0xffffffffu, su, o);
            if (lane >= o) {
                sp += a;
                su += b;
            }
        }
        if (lane == 31) *count = su;
        sp -= p;
        su -= u;
        for (int e = e0; e < e1; e++) {
            pbase[e] = sp;
            ubase[e] = su;
            sp += cnt[e];
            su += (cnt[e] + gsize - 1) / gsize;
        }
    }
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    unsigned below = (1u << lane) - 1u;
    for (int e = warp; e < ne; e += nw) /* a warp owns experts warp, warp + nw, ... */
        for (int j = lane; j * gsize < cnt[e]; j += 32)
            units[ubase[e] + j] = make_int4(e, pbase[e] + j * gsize, min(gsize, cnt[e] - j * gsize), 0);
    __syncwarp();
    /* one pass over the ids per warp (not one per expert): lanes of the same owned expert take consecutive
     * places, and that expert's next place moves past them */
    for (int i0 = 0; i0 < nk; i0 += 32) {
        int i = i0 + lane, e = i < nk ? ids[i] : -1;
        bool mine = e >= 0 && e < ne && e % nw == warp;
        unsigned m = __match_any_sync(0xffffffffu, mine ? e : -1);
        int base = mine ? pbase[e] : 0;
        if (mine) pairs[base + __popc(m & below)] = i;
        __syncwarp();
        if (mine && !(m & below)) pbase[e] = base + __popc(m);
        __syncwarp();
    }
}

/* The routed pairs of a prompt grouped by expert (moe_group_k) into the MoE group buffers. */
struct moe_groups {
    int *count, *pairs;
    int4 *units;
    int max_units, gsize;
};

static int group_pairs(cu_impl *c, int E, const int32_t *ids, int slots, int gsize, moe_groups *gr) {
    gr->gsize = gsize;
    gr->max_units = slots / gr->gsize + (E < slots ? E : slots) + 1;
    size_t gbytes = ((size_t)4 + (size_t)gr->max_units * 4 + (size_t)slots) * sizeof(int);
    if (cu_grow(c, (void **)&c->moe_grp, &c->moe_grp_len, gbytes, "MoE groups")) return -1;
    gr->count = c->moe_grp;
    gr->pairs = c->moe_grp + 4 + (size_t)gr->max_units * 4;
    gr->units = (int4 *)(c->moe_grp + 4);
    cu_launch(c, moe_group_k, 1, 1024, (size_t)E * 3 * sizeof(int), ids, slots, E, gr->gsize, gr->count, gr->units,
              gr->pairs);
    return 0;
}

/* Whether grouped GGML expert products split their operands into bf16 halves: the experts are what the
 * next layer's router reads, so as for the dense weights of a MoE model (see place_tensor), unless
 * SLUICE_CUDA_PREFILL=bf16 asks for one pass */
static int experts_exact(const cu_impl *c) {
    return c->gemm_exact >= 0;
}

/* 1 when a batch of n tokens takes the grouped expert kernels: GGML experts from 8 tokens, float experts from
 * 33, below which a GEMV launch a routed pair reads them faster (16 and 32 sequences of qwen3.5-35b-a3b bf16:
 * 2,892 and 4,248 tok/s against 2,450 and 3,184 grouped); SLUICE_CUDA_MOE_GROUP=N sets both (0: never) */
static int grouped(const cu_impl *c, int n, int E, int ggml) {
    int min = c->moe_group_min >= 0 ? c->moe_group_min : ggml ? 8 : 33;
    return min > 0 && n >= min && n >= 2 && E <= 4096;
}

/* a[s][i] = the expert activation (sl_expert_act) of pair s's gate and up values: interleaved in
 * g[s][2 * inter] (gate 2i, up 2i + 1) when u is NULL, else g[s][inter] and u[s][inter] */
__global__ void expert_act_k(const float *g, const float *u, int inter, float alpha, float limit, float *a) {
    cu_pdl_enter();
    long long s = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= inter) return;
    float gv, uv;
    if (u) {
        gv = g[s * inter + i];
        uv = u[s * inter + i];
    } else {
        gv = g[(s * inter + i) * 2];
        uv = g[(s * inter + i) * 2 + 1];
    }
    if (limit > 0) {
        gv = fminf(gv, limit);
        uv = fminf(fmaxf(uv, -limit), limit);
        a[s * inter + i] = gv * cu_sigmoid(alpha * gv) * (uv + 1.0f);
    } else {
        a[s * inter + i] = gv * cu_sigmoid(gv) * uv;
    }
}

/* 1 when t's experts take the plain GEMV and grouped kernels (separate gate and up, silu(g) * u) */
static int plain_swiglu(const sl_expert_table *t, const sl_expert *e0) {
    return e0->up.data && t->swiglu_limit <= 0;
}

/* Experts whose gate and up are one interleaved weight or whose activation is the clamped SwiGLU
 * (gpt-oss): gate (and up), the activation and down as three steps, biases added by the GEMV epilogue; a
 * grid row per routed pair, or for prompts per group of one expert's pairs (its rows read once a group). */
static const float *experts_act(cu_impl *c, const cu_table *tab, const sl_expert_table *t, const sl_expert *e0,
                                const float *x, int n, int hidden, int32_t *ids, int k, const float *logits, int ne,
                                int renorm, float *weights) {
    int fused = !e0->up.data, inter = fused ? e0->gate.rows / 2 : e0->gate.rows, slots = n * k;
    size_t need = (size_t)slots * ((size_t)inter * 3 + (size_t)hidden) * sizeof(float);
    if (cu_grow(c, (void **)&c->moe_buf, &c->moe_len, need, "MoE buffers")) return NULL;
    /* g [slots][gate rows], u [slots][inter] after it (separate up), a [slots][inter], d [slots][hidden] */
    float *g = c->moe_buf, *u = fused ? NULL : g + (size_t)slots * inter, *a = g + (size_t)2 * slots * inter;
    float *d = a + (size_t)slots * inter;
    if (logits) cu_launch(c, route_k, n, 32, (size_t)ne * sizeof(float), logits, n, ne, k, renorm, ids, weights);
    cu_w gs = cu_w_of(&e0->gate), us = cu_w_of(&e0->up), ds = cu_w_of(&e0->down);
    int ggml = gs.fmt == SL_WF_GGML || us.fmt == SL_WF_GGML || ds.fmt == SL_WF_GGML;
    moe_groups gr = {};
    int grp = !ggml && grouped(c, n, t->n_experts, 0), mmq = ggml && grouped(c, n, t->n_experts, 1) && c->mmq_min > 0;
    int ex = experts_exact(c);
    if (mmq) { /* GGML experts of a prompt: grouped tensor-core products (see experts) */
        if (group_pairs(c, t->n_experts, ids, slots, CU_MMQ_GROUP, &gr)) return NULL;
        if (fused || gs.gtype == us.gtype) {
            cu_ggml_mmq_grouped(c, &gs, tab->d, 0, fused ? 1 : 2, gr.units, gr.pairs, gr.count, gr.max_units, k, x,
                                NULL, n, ex, g, (long long)slots * inter);
        } else {
            cu_ggml_mmq_grouped(c, &gs, tab->d, 0, 1, gr.units, gr.pairs, gr.count, gr.max_units, k, x, NULL, n, ex, g,
                                0);
            cu_ggml_mmq_grouped(c, &us, tab->d, 1, 1, gr.units, gr.pairs, gr.count, gr.max_units, k, x, NULL, n, ex, u,
                                0);
        }
    } else if (grp) {
        if (group_pairs(c, t->n_experts, ids, slots, cu_moe_group_size(hidden), &gr)) return NULL;
        /* gate and up (grid z) land where the GEMV form puts them */
        cu_grouped_launch(c, &gs, tab->d, 0, fused ? 1 : 2, gr.units, gr.pairs, gr.count, gr.max_units, gr.gsize, x, k,
                          hidden, g, e0->gate.rows, (long long)slots * inter);
    } else {
        cu_gemv_launch(c, &gs, tab->d, ids, 0, slots, k, x, hidden, 1, g, e0->gate.rows);
        if (!fused) cu_gemv_launch(c, &us, tab->d, ids, 1, slots, k, x, hidden, 1, u, inter);
    }
    cu_launch(c, expert_act_k, dim3(CU_BLOCKS(inter, 256), (unsigned)slots), 256, 0, (const float *)g, (const float *)u,
              inter, t->swiglu_alpha, t->swiglu_limit, a);
    if (mmq)
        cu_ggml_mmq_grouped(c, &ds, tab->d, 2, 1, gr.units, gr.pairs, gr.count, gr.max_units, 1, a, NULL, slots, ex, d,
                            0);
    else if (grp)
        cu_grouped_launch(c, &ds, tab->d, 2, 1, gr.units, gr.pairs, gr.count, gr.max_units, gr.gsize, a, 1, inter, d,
                          hidden, 0);
    else
        cu_gemv_launch(c, &ds, tab->d, ids, 2, slots, 1, a, inter, 1, d, hidden);
    return d;
}

/* The routed experts of n tokens: returns their outputs d[n * k][hidden] (in the MoE buffers), or NULL
 * when there is nothing to do or it failed (recorded). */
static const float *experts(cu_impl *c, const sl_expert_table *t, const float *x, int n, int hidden, int32_t *ids,
                            int k, const float *logits, int ne, int renorm, float *weights) {
    const cu_table *tab = find_table(c, t);
    if (!tab) {
        cu_fail(c, "moe: this layer's experts were not placed on the GPU");
        return NULL;
    }
    const sl_expert *e0 = NULL;
    for (int i = 0; i < t->n_experts && !e0; i++) e0 = t->experts[i];
    if (!e0 || n <= 0) return NULL;
    if (!plain_swiglu(t, e0)) return experts_act(c, tab, t, e0, x, n, hidden, ids, k, logits, ne, renorm, weights);
    int inter = e0->gate.rows, slots = n * k;
    size_t need = (size_t)slots * ((size_t)inter * 2 + (size_t)hidden) * sizeof(float);
    if (cu_grow(c, (void **)&c->moe_buf, &c->moe_len, need, "MoE buffers")) return NULL;
    float *g = c->moe_buf, *d = g + (size_t)2 * slots * inter;
    /* shapes and formats are per expert (read from the table); e0 only sizes the grids */
    cu_w gs = cu_w_of(&e0->gate), us = cu_w_of(&e0->up), ds = cu_w_of(&e0->down);
    int ggml = gs.fmt == SL_WF_GGML || us.fmt == SL_WF_GGML || ds.fmt == SL_WF_GGML;
    if (ggml && grouped(c, n, t->n_experts, 1) && c->mmq_min > 0) {
        /* a prompt of GGML experts: pairs grouped by expert, each group's tokens multiplied on tensor cores
         * with the blocks decoded once per group: gate and up, then down from their SwiGLU */
        if (logits) cu_launch(c, route_k, n, 32, (size_t)ne * sizeof(float), logits, n, ne, k, renorm, ids, weights);
        moe_groups gr;
        if (group_pairs(c, t->n_experts, ids, slots, CU_MMQ_GROUP, &gr)) return NULL;
        int ex = experts_exact(c);
        long long yz = (long long)slots * inter;
        if (gs.gtype == us.gtype) {
            cu_ggml_mmq_grouped(c, &gs, tab->d, 0, 2, gr.units, gr.pairs, gr.count, gr.max_units, k, x, NULL, n, ex, g,
                                yz);
        } else { /* a launch is compiled for one type */
            cu_ggml_mmq_grouped(c, &gs, tab->d, 0, 1, gr.units, gr.pairs, gr.count, gr.max_units, k, x, NULL, n, ex, g,
                                0);
            cu_ggml_mmq_grouped(c, &us, tab->d, 1, 1, gr.units, gr.pairs, gr.count, gr.max_units, k, x, NULL, n, ex,
                                g + yz, 0);
        }
        cu_ggml_mmq_grouped(c, &ds, tab->d, 2, 1, gr.units, gr.pairs, gr.count, gr.max_units, 1, g, g + yz, slots, ex,
                            d, 0);
        return d;
    }
    if (!ggml && grouped(c, n, t->n_experts, 0)) {
        /* a prompt: group the pairs by expert, so each expert's weights are read once per group of tokens */
        if (logits) cu_launch(c, route_k, n, 32, (size_t)ne * sizeof(float), logits, n, ne, k, renorm, ids, weights);
        moe_groups gr;
        if (group_pairs(c, t->n_experts, ids, slots, cu_moe_group_size(hidden), &gr)) return NULL;
        cu_moe_grouped(c, &gs, &ds, tab->d, gr.units, gr.pairs, gr.count, gr.max_units, gr.gsize, slots, k, x, hidden,
                       g, d);
        return d;
    }
    cu_moe_gemv(c, &gs, &us, &ds, tab->d, ids, slots, k, x, hidden, g, d, logits, ne, renorm, weights);
    return d;
}

void cu_moe(sl_backend *b, const sl_expert_table *t, const float *x, int n, int hidden, const int32_t *ids,
            const float *weights, int k, float *out) {
    cu_impl *c = cu_of(b);
    /* the expert GEMVs only read ids */
    const float *d = experts(c, t, x, n, hidden, (int32_t *)ids, k, NULL, 0, 0, NULL);
    if (!d) return;
    cu_launch(c, moe_combine_k, dim3(CU_BLOCKS(hidden, 256), (unsigned)n), 256, 0, d, weights, k, hidden, out);
    cu_check_launch(c, "moe");
}

void cu_moe_pairs(sl_backend *b, const sl_expert_table *t, const float *x, int n, int hidden, const int32_t *ids,
                  int k) {
    cu_impl *c = cu_of(b);
    c->pairs = experts(c, t, x, n, hidden, (int32_t *)ids, k, NULL, 0, 0, NULL);
    c->pairs_n = n * k;
    cu_check_launch(c, "moe");
}

/* The pair outputs of the layer's moe_pairs (and moe_pairs_put) calls, when they cover n tokens of k
 * slots. A combine takes them: the next layer starts without any. */
static const float *pairs_of(cu_impl *c, int n, int k) {
    const float *p = c->pairs;
    if (!p || c->pairs_n != n * k) {
        cu_fail(c, "moe_combine without the pair outputs of %d tokens", n);
        return NULL;
    }
    c->pairs = NULL;
    return p;
}

/* dst[idx[r]] = src[r], rows of `hidden` */
__global__ void pairs_scatter_k(const float *src, const int32_t *idx, int hidden, float *dst) {
    cu_pdl_enter();
    int r = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < hidden) dst[(long long)idx[r] * hidden + j] = src[(long long)r * hidden + j];
}

/* The pair buffer rows computed elsewhere go into: the layer's moe_pairs outputs, still inside the buffers
 * (a failed layer may have left older ones), else one of their own for the rows alone. */
static float *put_target(cu_impl *c, int n, int k, int hidden) {
    size_t nk = (size_t)n * (size_t)k;
    const float *mb = c->moe_buf;
    int in_moe = c->pairs >= mb && c->pairs + nk * (size_t)hidden <= mb + c->moe_len / sizeof(float);
    if (!c->pairs || c->pairs_n != n * k || !(in_moe || c->pairs == c->put_pairs)) {
        if (cu_grow(c, (void **)&c->put_pairs, &c->put_pairs_len, nk * (size_t)hidden * sizeof(float),
                    "MoE pair outputs"))
            return NULL;
        c->pairs = c->put_pairs;
        c->pairs_n = n * k;
    }
    return (float *)c->pairs;
}

void cu_moe_pairs_put(sl_backend *b, const float *rows, const int32_t *idx, int cnt, int n, int k, int hidden) {
    cu_impl *c = cu_of(b);
    size_t rb = (size_t)cnt * (size_t)hidden * sizeof(float);
    if (cnt <= 0) return;
    float *P = put_target(c, n, k, hidden);
    if (!P) return;
    if (cu_grow(c, (void **)&c->put_rows, &c->put_rows_len, rb + (size_t)cnt * sizeof(int32_t), "MoE pair rows"))
        return;
    int32_t *didx = (int32_t *)(void *)((char *)c->put_rows + rb);
    cudaMemcpyAsync(c->put_rows, rows, rb, cudaMemcpyHostToDevice, c->st);
    cudaMemcpyAsync(didx, idx, (size_t)cnt * sizeof(int32_t), cudaMemcpyHostToDevice, c->st);
    cu_launch(c, pairs_scatter_k, dim3(CU_BLOCKS(hidden, 256), (unsigned)cnt), 256, 0, (const float *)c->put_rows,
              (const int32_t *)didx, hidden, P);
    cu_check_launch(c, "moe_pairs_put");
}

/* one thread per routed pair: an expert with no weights in the table (not in a slot) is a miss */
__global__ void moe_guard_k(const cu_expert *table, int n_experts, int32_t *ids, int nk, int32_t *rec, int32_t *miss) {
    cu_pdl_enter();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nk) return;
    int x = ids[i];
    rec[i] = x;
    if (x < 0 || x >= n_experts || !(table[x].w[0].data || table[x].w[1].data || table[x].w[2].data)) {
        ids[i] = -1;
        atomicAdd(miss, 1);
    }
}

/* The same with the host's share (see moe_guard): one block, a thread per pair (nk <= SL_HANDOFF_PAIRS). The
 * first occurrence of each expert decides for its pairs; of the host-capable experts, each counted once in
 * routing order, the first round(share * m) are the host's. */
__global__ void moe_guard_host_k(const cu_expert *table, int n_experts, int32_t *ids, int nk, int32_t *rec,
                                 int32_t *miss, const uint8_t *host, const float *share, int32_t *host_ids) {
    cu_pdl_enter();
    __shared__ int32_t r[SL_HANDOFF_PAIRS];
    __shared__ uint8_t cap[SL_HANDOFF_PAIRS];
    int i = threadIdx.x, x = i < nk ? ids[i] : -1, f = i;
    if (i < nk) r[i] = rec[i] = x;
    __syncthreads();
    for (int j = 0; j < i && f == i; j++)
        if (r[j] == x) f = j;
    int ok = x >= 0 && x < n_experts, hc = ok && host[x];
    if (i < nk) cap[i] = f == i && hc;
    __syncthreads();
    if (i >= nk) return;
    int m = 0, rank = 0;
    for (int j = 0; j < nk; j++) {
        m += cap[j];
        rank += j < f ? cap[j] : 0;
    }
    int take = __float2int_rn(*share * (float)m),
        in_t = ok && (table[x].w[0].data || table[x].w[1].data || table[x].w[2].data);
    host_ids[i] = -1;
    if (hc) {
        if (rank < take || !in_t) {
            host_ids[i] = x;
            ids[i] = -1;
        }
    } else if (!in_t) {
        ids[i] = -1;
        atomicAdd(miss, 1);
    }
}

void cu_moe_guard(sl_backend *b, const sl_expert_table *t, int32_t *ids, int nk, int32_t *rec, int32_t *miss,
                  const uint8_t *host, const float *share, int32_t *host_ids) {
    cu_impl *c = cu_of(b);
    const cu_table *tab = find_table(c, t);
    if (!tab) {
        cu_fail(c, "moe_guard: this layer's experts were not placed on the GPU");
        return;
    }
    if (host && nk > SL_HANDOFF_PAIRS) {
        cu_fail(c, "moe_guard: %d routed pairs for the host (at most %d)", nk, SL_HANDOFF_PAIRS);
        return;
    }
    if (host && nk > 0)
        cu_launch(c, moe_guard_host_k, 1, SL_HANDOFF_PAIRS, 0, (const cu_expert *)tab->d, tab->n, ids, nk, rec, miss,
                  host, share, host_ids);
    else if (nk > 0)
        cu_launch(c, moe_guard_k, CU_BLOCKS(nk, 256), 256, 0, (const cu_expert *)tab->d, tab->n, ids, nk, rec, miss);
    cu_check_launch(c, "moe_guard");
}

__device__ __forceinline__ unsigned long long cu_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* The layer's input and routing into host memory, then the flag the host waits on (after every write) */
__global__ void handoff_k(const float *x, int nx, const int32_t *ids, int nk, float *hx, int32_t *hids, sl_handoff *h) {
    cu_pdl_enter();
    for (int i = threadIdx.x; i < nx; i += blockDim.x) hx[i] = x[i];
    for (int i = threadIdx.x; i < nk; i += blockDim.x) hids[i] = ids[i];
    __syncthreads();
    if (threadIdx.x == 0) { /* one fence, cumulative over the block's writes the barrier ordered before it */
        __threadfence_system();
        ((volatile sl_handoff *)h)->t_ready = cu_globaltimer();
        ((volatile sl_handoff *)h)->ready = 1;
    }
}

/* moe_await's device copy of the host's part: SL_HANDOFF_PAIRS rows, their pair indices, the count. Sized
 * outside recordings (a shape's first step is issued op by op), so that a recording never grows it. */
static uint8_t *handoff_rows(cu_impl *c, int hidden) {
    size_t bytes = (size_t)SL_HANDOFF_PAIRS * ((size_t)hidden + 1) * sizeof(float) + 16;
    return cu_grow(c, (void **)&c->ho_rows, &c->ho_rows_len, bytes, "the host's MoE pair rows") ? NULL : c->ho_rows;
}

void cu_moe_handoff(sl_backend *b, const float *x, int n, int hidden, const int32_t *ids, int nk, sl_handoff *h) {
    cu_impl *c = cu_of(b);
    if (!handoff_rows(c, hidden)) return;
    cu_launch(c, handoff_k, 1, 256, 0, x, n * hidden, ids, nk, h->x, h->ids, h);
    cu_check_launch(c, "moe_handoff");
}

/* One thread polls the host's flag over PCIe; after 20 s the step counts as missed (see moe_await). */
__global__ void await_k(sl_handoff *h, int32_t *miss) {
    cu_pdl_enter();
    unsigned long long t0 = cu_globaltimer();
    ((volatile sl_handoff *)h)->t_wait = t0;
    while (!((volatile const sl_handoff *)h)->done) {
        __nanosleep(200);
        if (cu_globaltimer() - t0 > 20000000000ull) {
            atomicAdd(miss, SL_HANDOFF_LOST);
            return;
        }
    }
    __threadfence_system();
}

/* dst[idx[r]] = src[r] for r < *cnt, rows of `hidden` */
__global__ void pairs_scatter_cnt_k(const float *src, const int32_t *idx, const int32_t *cnt, int hidden, int nk,
                                    float *dst) {
    cu_pdl_enter();
    int r = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x, p;
    if (r >= *cnt || j >= hidden || (p = idx[r]) < 0 || p >= nk) return;
    dst[(long long)p * hidden + j] = src[(long long)r * hidden + j];
}

void cu_moe_await(sl_backend *b, sl_handoff *h, const float *rows, const int32_t *idx, int n, int k, int hidden,
                  int32_t *miss, void (*serve)(void *ctx, sl_handoff *h), void *ctx) {
    cu_impl *c = cu_of(b);
    if (!c->capturing) { /* issued op by op: the host serves now, with the queue drained */
        if (cudaStreamSynchronize(c->st) != cudaSuccess) {
            cu_check_launch(c, "moe_await");
            return;
        }
        if (!h->done) serve(ctx, h);
        cu_moe_pairs_put(b, rows, idx, h->cnt, n, k, hidden);
        return;
    }
    /* the host's part is copied in whole (its count too) by the copy engine: threads reading host memory
     * pair by pair took some 450 us a layer (H200) */
    int nk = n * k;
    float *P = put_target(c, n, k, hidden);
    uint8_t *d = handoff_rows(c, hidden);
    if (!P || !d) return;
    size_t rb = (size_t)SL_HANDOFF_PAIRS * (size_t)hidden * sizeof(float), ib = SL_HANDOFF_PAIRS * sizeof(int32_t);
    cu_launch(c, await_k, 1, 1, 0, h, miss);
    cudaMemcpyAsync(d, rows, (size_t)nk * (size_t)hidden * sizeof(float), cudaMemcpyHostToDevice, c->st);
    cudaMemcpyAsync(d + rb, idx, (size_t)nk * sizeof(int32_t), cudaMemcpyHostToDevice, c->st);
    cudaMemcpyAsync(d + rb + ib, (const void *)&h->cnt, sizeof(int32_t), cudaMemcpyHostToDevice, c->st);
    cu_launch(c, pairs_scatter_cnt_k, dim3(CU_BLOCKS(hidden, 256), (unsigned)nk), 256, 0, (const float *)d,
              (const int32_t *)(d + rb), (const int32_t *)(d + rb + ib), hidden, nk, P);
    cu_check_launch(c, "moe_await");
}

void cu_moe_combine(sl_backend *b, const float *weights, int n, int k, int hidden, float *out) {
    cu_impl *c = cu_of(b);
    const float *d = pairs_of(c, n, k);
    if (!d) return;
    cu_launch(c, moe_combine_k, dim3(CU_BLOCKS(hidden, 256), (unsigned)n), 256, 0, d, weights, k, hidden, out);
    cu_check_launch(c, "moe");
}

/* GGML experts (one type per matrix across the layer, see cu_place_experts) have no routing kernel of
 * their own, so moe_shared takes the separate routing and combine for them, as for shapes the fused
 * shared-expert down projection does not take. */
static int shared_fused(cu_impl *c, const sl_expert_table *t, int n, int hidden, const sl_weight *sh_down, int k) {
    const sl_expert *e0 = NULL;
    for (int i = 0; i < t->n_experts && !e0; i++) e0 = t->experts[i];
    int ggml = e0 && (e0->gate.fmt == SL_WF_GGML || e0->up.fmt == SL_WF_GGML || e0->down.fmt == SL_WF_GGML);
    return !ggml && e0 && plain_swiglu(t, e0) && cu_gemv_takes(c, sh_down, n) && sh_down->rows == hidden &&
           cu_moe_routes(t->n_experts, k);
}

void cu_moe_combine_shared(sl_backend *b, const sl_expert_table *t, const float *weights, int n, int k, int hidden,
                           const sl_weight *sh_down, const float *g, const float *u, const float *gate, float *out) {
    cu_impl *c = cu_of(b);
    if (!shared_fused(c, t, n, hidden, sh_down, k)) {
        cu_moe_combine(b, weights, n, k, hidden, out);
        cu_swiglu_matmul(b, sh_down, g, u, n, gate, out);
        return;
    }
    const float *d = pairs_of(c, n, k);
    if (d) cu_shared_down(c, sh_down, g, u, n, gate, d, weights, k, out);
    cu_check_launch(c, "moe");
}

void cu_moe_shared(sl_backend *b, const sl_expert_table *t, const float *logits, int n_experts, int k, int renorm,
                   int32_t *ids, float *weights, const float *x, int n, int hidden, const sl_weight *sh_down,
                   const float *g, const float *u, const float *gate, float *out) {
    cu_impl *c = cu_of(b);
    int same = n_experts == t->n_experts, fused = same && shared_fused(c, t, n, hidden, sh_down, k);
    /* a GGML shared expert of one token: the routed outputs' combine and its gate in its down projection's
     * epilogue, the SwiGLU in its input's quantization; the routing, as for GGML experts, a kernel of its own */
    int epi = same && !fused && sh_down->rows == hidden && cu_mmvq_epilogue(c, sh_down, n);
    if (!fused && !epi) {
        cu_route(b, logits, n, n_experts, k, renorm, ids, weights);
        cu_moe(b, t, x, n, hidden, ids, weights, k, out);
        cu_swiglu_matmul(b, sh_down, g, u, n, gate, out);
        return;
    }
    if (epi) cu_route(b, logits, n, n_experts, k, renorm, ids, weights);
    /* fused: routing happens in the experts' gate/up launch; either way the combine of their outputs is in
     * the shared expert's down projection */
    const float *d = experts(c, t, x, n, hidden, ids, k, epi ? NULL : logits, epi ? 0 : n_experts, renorm, weights);
    if (d) cu_shared_down(c, sh_down, g, u, n, gate, d, weights, k, out);
    cu_check_launch(c, "moe");
}
