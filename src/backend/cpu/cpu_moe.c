/* Mixture-of-experts on the CPU: softmax top-k routing, then each expert runs once over the tokens
 * routed to it (a batched matmul per expert) into one output row per routed pair, and the pairs are
 * combined with the routing weights in routing order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"

void cpu_route(sl_backend *b, const float *logits, int n, int n_experts, int k, int renorm, int32_t *ids,
               float *weights) {
    (void)b;
    for (int t = 0; t < n; t++) {
        const float *l = logits + (size_t)t * (size_t)n_experts;
        float mx = -INFINITY, sum = 0;
        for (int x = 0; x < n_experts; x++) mx = l[x] > mx ? l[x] : mx;
        for (int x = 0; x < n_experts; x++) sum += expf(l[x] - mx);
        int32_t *id = ids + (size_t)t * (size_t)k;
        float *w = weights + (size_t)t * (size_t)k;
        /* selection by repeated max keeps ties in index order, as torch.topk does on CPU */
        for (int s = 0; s < k; s++) {
            int best = -1;
            for (int x = 0; x < n_experts; x++) {
                int taken = 0;
                for (int r = 0; r < s && !taken; r++) taken = id[r] == x;
                if (!taken && (best < 0 || l[x] > l[best])) best = x;
            }
            id[s] = best;
            w[s] = expf(l[best] - mx) / sum;
        }
        if (renorm) {
            float tot = 0;
            for (int s = 0; s < k; s++) tot += w[s];
            for (int s = 0; s < k; s++) w[s] /= tot;
        }
    }
}

/* The index of the largest of v[0, n) not yet in taken[0, nt) (the lowest among equals), as torch.topk
 * picks them. */
static int best_untaken(const float *v, int n, const int32_t *taken, int nt) {
    int best = -1;
    for (int x = 0; x < n; x++) {
        int t = 0;
        for (int r = 0; r < nt && !t; r++) t = taken[r] == x;
        if (!t && (best < 0 || v[x] > v[best])) best = x;
    }
    return best;
}

void cpu_route_grouped(sl_backend *b, const float *logits, const float *bias, int n, int n_experts, int k, int n_group,
                       int topk_group, int renorm, float scale, int32_t *ids, float *weights) {
    cpu_impl *c = cpu_of(b);
    /* per token: sigmoid scores, biased scores, group scores, chosen groups */
    if (cpu_scratch_reserve(c, (size_t)n_experts * 2 + (size_t)n_group * 2) != 0) return;
    float *s = c->scratch[0], *sc = s + n_experts, *gs = sc + n_experts;
    int32_t *gsel = (int32_t *)(gs + n_group);
    int per = n_experts / n_group;
    for (int t = 0; t < n; t++) {
        const float *l = logits + (size_t)t * (size_t)n_experts;
        for (int x = 0; x < n_experts; x++) {
            s[x] = 1.0f / (1.0f + expf(-l[x]));
            sc[x] = bias ? s[x] + bias[x] : s[x];
        }
        for (int g = 0; g < n_group; g++) { /* the sum of the group's two best biased scores */
            int32_t top[2];
            int m = per < 2 ? per : 2;
            float sum = 0;
            for (int r = 0; r < m; r++) {
                top[r] = best_untaken(sc + g * per, per, top, r);
                sum += sc[g * per + top[r]];
            }
            gs[g] = sum;
        }
        for (int r = 0; r < topk_group; r++) gsel[r] = best_untaken(gs, n_group, gsel, r);
        for (int g = 0; g < n_group; g++) {
            int keep = 0;
            for (int r = 0; r < topk_group && !keep; r++) keep = gsel[r] == g;
            if (!keep)
                for (int x = g * per; x < (g + 1) * per; x++) sc[x] = 0.0f; /* masked_fill(0), as transformers */
        }
        int32_t *id = ids + (size_t)t * (size_t)k;
        float *w = weights + (size_t)t * (size_t)k, tot = 0;
        for (int r = 0; r < k; r++) {
            id[r] = best_untaken(sc, n_experts, id, r);
            w[r] = s[id[r]];
            tot += w[r];
        }
        for (int r = 0; r < k; r++) w[r] = (renorm ? w[r] / (tot + 1e-20f) : w[r]) * scale;
    }
}

/* The pair buffer P[n * k][hidden], kept across calls (passes of an expert store fill it in parts). */
static float *pair_buf(cpu_impl *c, size_t floats) {
    if (floats > c->pairs_len) {
        float *p = realloc(c->pairs, floats * sizeof *p);
        if (!p) {
            if (!c->failed) sl_fail(&c->failure, "out of memory for the MoE pair outputs (%zu floats)", floats);
            c->failed = 1;
            return NULL;
        }
        c->pairs = p;
        c->pairs_len = floats;
    }
    return c->pairs;
}

/* One pool dispatch over the rows of many one-token matmuls (mv[0, n), rows prefixed in first[]). */
typedef struct {
    const cpu_mv *mv;
    const int64_t *first; /* [n + 1]: the first row of each, in one count over all */
    int n;
} mv_set;

static void mv_set_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const mv_set *s = ctx;
    int lo = 0, hi = s->n - 1; /* the matmul holding row b */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->first[mid] <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    for (int j = lo; j < s->n && b < e; j++) {
        int64_t end = s->first[j + 1] < e ? s->first[j + 1] : e;
        cpu_mv_rows(&s->mv[j], b - s->first[j], end - s->first[j]);
        b = end;
    }
}

static void mv_set_run(cpu_impl *c, const cpu_mv *mv, int64_t *first, int n) {
    first[0] = 0;
    for (int j = 0; j < n; j++) first[j + 1] = first[j] + mv[j].w->rows;
    mv_set s = {mv, first, n};
    sl_pool_for(c->pool, first[n], 8, mv_set_task, &s);
}

/* Decode, where every routed expert has one token: the gate and up rows of every pair in one pool
 * dispatch, then every down row in another, through the one-token row kernels, instead of three
 * dispatches per expert (which cost as much as a small expert's rows). The kernels and inputs are those of
 * the expert-by-expert path, so are the bits. 1 when some weight has no row kernel (nothing done), -1 on
 * failure (recorded), else 0. */
static int moe_pairs_decode(cpu_impl *c, const sl_expert_table *t, const float *x, int hidden, const int32_t *ids,
                            size_t nk, int k, float *P) {
    size_t np = 0, inter = 0, prep = 0;
    for (size_t i = 0; i < nk; i++) {
        if (ids[i] < 0) continue;
        const sl_expert *ex = t->experts[ids[i]];
        if (!ex) return 1; /* the other path says which */
        const sl_weight *ws[3] = {&ex->gate, &ex->up, &ex->down};
        for (int j = 0; j < 3; j++) {
            if (!ws[j]->data) continue;
            if (ws[j]->transposed) return 1;
            size_t f = cpu_mv_prep_floats(ws[j]);
            prep = f > prep ? f : prep;
        }
        if ((size_t)ex->gate.rows > inter) inter = (size_t)ex->gate.rows;
        np++;
    }
    /* per pair: the gate (and up) outputs, the down input; per matmul: its prep and its place in the rows */
    size_t need = (np * 2 * inter + np * inter + 2 * np * prep) * sizeof(float) + 2 * np * sizeof(cpu_mv) +
                  (2 * np + 1) * sizeof(int64_t) + 64;
    if (need > c->moe_len) {
        void *p = realloc(c->moe_buf, need);
        if (!p) {
            if (!c->failed) sl_fail(&c->failure, "out of memory in the MoE layer (%zu pairs)", np);
            c->failed = 1;
            return -1;
        }
        c->moe_buf = p;
        c->moe_len = need;
    }
    cpu_mv *mv = c->moe_buf;
    int64_t *first = (int64_t *)(mv + 2 * np);
    float *g = (float *)(first + 2 * np + 1), *u = g + np * inter, *a = u + np * inter, *pp = a + np * inter;
    int nm = 0;
    size_t r = 0;
    for (size_t i = 0; i < nk; i++) {
        if (ids[i] < 0) continue;
        const sl_expert *ex = t->experts[ids[i]];
        const float *xi = x + i / (size_t)k * (size_t)hidden;
        if (cpu_mv_prep(c, &ex->gate, xi, pp + (size_t)nm * prep, g + r * inter, &mv[nm])) return 1;
        nm++;
        if (ex->up.data) {
            if (cpu_mv_prep(c, &ex->up, xi, pp + (size_t)nm * prep, u + r * inter, &mv[nm])) return 1;
            nm++;
        }
        r++;
    }
    mv_set_run(c, mv, first, nm);
    nm = 0;
    r = 0;
    for (size_t i = 0; i < nk; i++) {
        if (ids[i] < 0) continue;
        const sl_expert *ex = t->experts[ids[i]];
        float *gr = g + r * inter, *ur = u + r * inter, *ar = a + r * inter;
        if (!ex->up.data) { /* gate and up rows interleaved in one weight */
            size_t I = (size_t)ex->gate.rows / 2;
            for (size_t j = 0; j < I; j++) ar[j] = sl_expert_act(t, gr[j * 2], gr[j * 2 + 1]);
        } else {
            for (size_t j = 0; j < (size_t)ex->gate.rows; j++) ar[j] = sl_expert_act(t, gr[j], ur[j]);
        }
        if (cpu_mv_prep(c, &ex->down, ar, pp + (size_t)nm * prep, P + i * (size_t)hidden, &mv[nm])) return 1;
        nm++;
        r++;
    }
    mv_set_run(c, mv, first, nm);
    return 0;
}

void cpu_moe_pairs(sl_backend *b, const sl_expert_table *t, const float *x, int n, int hidden, const int32_t *ids,
                   int k) {
    cpu_impl *c = cpu_of(b);
    int inter = 0;
    for (int e = 0; e < t->n_experts; e++)
        if (t->experts[e] && t->experts[e]->gate.rows > inter) inter = t->experts[e]->gate.rows;
    size_t nk = (size_t)n * (size_t)k;
    float *P = pair_buf(c, nk * (size_t)hidden);
    if (!P) return;
    /* one token per expert (decode): every expert in two dispatches */
    int one = nk <= SL_CPU_MOE_ONE_PASS_PAIRS;
    for (size_t i = 0; i < nk && one; i++)
        for (size_t j = i + 1; j < nk && one; j++) one = ids[i] < 0 || ids[i] != ids[j];
    if (one) {
        int rc = moe_pairs_decode(c, t, x, hidden, ids, nk, k, P);
        if (rc <= 0) return;
    }
    /* one block, carved into: pair list, expert ends, gathered inputs, gate, up, down outputs */
    size_t E = (size_t)t->n_experts;
    size_t need =
        (nk + E + 1) * sizeof(size_t) + 4 * ((size_t)n * (size_t)hidden * 2 + (size_t)n * (size_t)inter * 2) + 64;
    if (need > c->moe_len) {
        void *p = realloc(c->moe_buf, need);
        if (!p) {
            if (!c->failed) sl_fail(&c->failure, "out of memory in the MoE layer (%d tokens)", n);
            c->failed = 1;
            return;
        }
        c->moe_buf = p;
        c->moe_len = need;
    }
    /* the pairs grouped by expert, each expert's in token order (a counting sort: end[e] is where expert
     * e's pairs end, end[e - 1] where they start) */
    size_t *pair = c->moe_buf, *end = pair + nk;
    memset(end, 0, E * sizeof *end);
    for (size_t i = 0; i < nk; i++)
        if (ids[i] >= 0 && (size_t)ids[i] < E) end[ids[i]]++;
    for (size_t e = 1; e < E; e++) end[e] += end[e - 1];
    for (size_t e = E; e-- > 0;) end[e] = e ? end[e - 1] : 0; /* starts, filled into ends below */
    for (size_t i = 0; i < nk; i++)
        if (ids[i] >= 0 && (size_t)ids[i] < E) pair[end[ids[i]]++] = i;
    float *xs = (float *)(end + E + 1);
    float *g = xs + (size_t)n * (size_t)hidden;
    float *u = g + (size_t)n * (size_t)inter;
    float *d = u + (size_t)n * (size_t)inter;
    /* each expert runs once over its tokens in token order, so a pair's result does not depend on which
     * other experts share the call */
    for (size_t e = 0; e < E; e++) {
        size_t first = e ? end[e - 1] : 0;
        int m = (int)(end[e] - first);
        if (!m) continue;
        const size_t *pr = pair + first;
        const sl_expert *ex = t->experts[e];
        if (!ex) {
            if (!c->failed) sl_fail(&c->failure, "expert %d was routed to but is not loaded", (int)e);
            c->failed = 1;
            return;
        }
        for (int r = 0; r < m; r++)
            memcpy(xs + (size_t)r * (size_t)hidden, x + pr[r] / (size_t)k * (size_t)hidden, (size_t)hidden * 4);
        cpu_matmul(b, &ex->gate, xs, m, g);
        const float *act = g;
        if (!ex->up.data) { /* gate and up rows interleaved in one weight: the activations go to u */
            size_t I = (size_t)ex->gate.rows / 2;
            for (size_t r = 0; r < (size_t)m; r++)
                for (size_t i = 0; i < I; i++)
                    u[r * I + i] = sl_expert_act(t, g[(r * I + i) * 2], g[(r * I + i) * 2 + 1]);
            act = u;
        } else {
            cpu_matmul(b, &ex->up, xs, m, u);
            size_t gi = (size_t)m * (size_t)ex->gate.rows;
            for (size_t i = 0; i < gi; i++) g[i] = sl_expert_act(t, g[i], u[i]);
        }
        cpu_matmul(b, &ex->down, act, m, d);
        for (int r = 0; r < m; r++)
            memcpy(P + pr[r] * (size_t)hidden, d + (size_t)r * (size_t)hidden, (size_t)hidden * 4);
    }
}

void cpu_moe_pairs_put(sl_backend *b, const float *rows, const int32_t *idx, int cnt, int n, int k, int hidden) {
    cpu_impl *c = cpu_of(b);
    size_t nk = (size_t)n * (size_t)k;
    float *P = pair_buf(c, nk * (size_t)hidden);
    for (int r = 0; P && r < cnt; r++) {
        if (idx[r] < 0 || (size_t)idx[r] >= nk) {
            if (!c->failed) sl_fail(&c->failure, "moe_pairs_put: pair %d of %zu", idx[r], nk);
            c->failed = 1;
            return;
        }
        memcpy(P + (size_t)idx[r] * (size_t)hidden, rows + (size_t)r * (size_t)hidden, (size_t)hidden * 4);
    }
}

void cpu_moe_pairs_get(sl_backend *b, float *rows, const int32_t *idx, int cnt, int hidden) {
    cpu_impl *c = cpu_of(b);
    for (int r = 0; r < cnt; r++) {
        if (idx[r] < 0 || ((size_t)idx[r] + 1) * (size_t)hidden > c->pairs_len) {
            if (!c->failed) sl_fail(&c->failure, "moe_pairs_get: pair %d is not in the pair buffer", idx[r]);
            c->failed = 1;
            return;
        }
        memcpy(rows + (size_t)r * (size_t)hidden, c->pairs + (size_t)idx[r] * (size_t)hidden, (size_t)hidden * 4);
    }
}

/* How many host-capable experts (host[x]) the first `upto` routed ids name, each counted once. */
static int host_rank(const int32_t *rec, int upto, const uint8_t *host, int E) {
    int r = 0;
    for (int j = 0; j < upto; j++) {
        int y = rec[j], first = 1;
        for (int u = 0; u < j && first; u++) first = rec[u] != y;
        r += first && y >= 0 && y < E && host[y];
    }
    return r;
}

void cpu_moe_guard(sl_backend *b, const sl_expert_table *t, int32_t *ids, int nk, int32_t *rec, int32_t *miss,
                   const uint8_t *host, const float *share, int32_t *host_ids) {
    (void)b;
    int E = t->n_experts;
    for (int i = 0; i < nk; i++) rec[i] = ids[i];
    int take = host ? (int)lrintf(*share * (float)host_rank(rec, nk, host, E)) : 0;
    for (int i = 0; i < nk; i++) {
        int x = rec[i];
        if (host) host_ids[i] = -1;
        if (x >= 0 && x < E && host && host[x]) {
            int f = 0; /* x's first occurrence decides for all its pairs */
            while (rec[f] != x) f++;
            if (host_rank(rec, f, host, E) < take || !t->experts[x]) {
                host_ids[i] = x;
                ids[i] = -1;
            }
        } else if (x < 0 || x >= E || !t->experts[x]) {
            ids[i] = -1;
            ++*miss;
        }
    }
}

/* Ops run as they are issued here: the host's part is computed right away. */
void cpu_moe_handoff(sl_backend *b, const float *x, int n, int hidden, const int32_t *ids, int nk, sl_handoff *h) {
    (void)b;
    memcpy(h->x, x, (size_t)n * (size_t)hidden * sizeof(float));
    memcpy(h->ids, ids, (size_t)nk * sizeof(int32_t));
    h->ready = 1;
}

void cpu_moe_await(sl_backend *b, sl_handoff *h, const float *rows, const int32_t *idx, int n, int k, int hidden,
                   int32_t *miss, void (*serve)(void *ctx, sl_handoff *h), void *ctx) {
    (void)miss;
    if (!h->done) serve(ctx, h);
    cpu_moe_pairs_put(b, rows, idx, h->cnt, n, k, hidden);
}

void cpu_moe_combine(sl_backend *b, const float *weights, int n, int k, int hidden, float *out) {
    cpu_impl *c = cpu_of(b);
    if (c->pairs_len < (size_t)n * (size_t)k * (size_t)hidden) {
        if (!c->failed) sl_fail(&c->failure, "moe_combine without the pair outputs of %d tokens", n);
        c->failed = 1;
        return;
    }
    /* in routing order, as the GPU sums them */
    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * (size_t)hidden;
        for (int i = 0; i < hidden; i++) {
            float s = 0;
            for (int x = 0; x < k; x++)
                s += weights[(size_t)t * (size_t)k + (size_t)x] *
                     c->pairs[((size_t)t * (size_t)k + (size_t)x) * (size_t)hidden + (size_t)i];
            o[i] = s;
        }
    }
}

void cpu_moe(sl_backend *b, const sl_expert_table *t, const float *x, int n, int hidden, const int32_t *ids,
             const float *weights, int k, float *out) {
    cpu_moe_pairs(b, t, x, n, hidden, ids, k);
    if (!cpu_of(b)->failed) cpu_moe_combine(b, weights, n, k, hidden, out);
}
