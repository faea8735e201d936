/* The ops of DeepSeek-V3's layers against host arithmetic of their plain definitions, on the backend
 * SLUICE_BACKEND picks (the CPU without a GPU): sigmoid routing with the correction bias and the
 * group-limited choice, and latent attention (norm, rope, cache store, then attention with kv_b_proj
 * absorbed) against attention over keys and values expanded per head, for two sequences whose pages
 * interleave, over a prefill batch and then a decode batch. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "testutil.h"

static sl_backend *open_backend(void) {
    sl_backend *be;
    sl_err e = {{0}};
    char note[256];
    cr_assert_eq(sl_backend_open(NULL, 2, &be, note, sizeof note, &e), 0, "%s", e.msg);
    return be;
}

static void check_ok(sl_backend *be) {
    sl_err e = {{0}};
    cr_assert_eq(be->ops->check(be, &e), 0, "%s", e.msg);
}

/* ---- routing ---- */

/* The reference: experts sorted by masked biased score (groups ranked by their two best biased scores),
 * the first k taken; ties to the lower index. */
static void ref_route(const float *l, const float *bias, int ne, int k, int ng, int tg, int renorm, float scale,
                      int32_t *ids, float *w) {
    int per = ne / ng;
    double s[64], sc[64], gs[16];
    for (int x = 0; x < ne; x++) {
        s[x] = 1.0 / (1.0 + exp(-(double)l[x]));
        sc[x] = s[x] + (bias ? bias[x] : 0);
    }
    for (int g = 0; g < ng; g++) {
        double a = -INFINITY, b = -INFINITY;
        for (int x = g * per; x < (g + 1) * per; x++) {
            if (sc[x] > a) {
                b = a;
                a = sc[x];
            } else if (sc[x] > b) {
                b = sc[x];
            }
        }
        gs[g] = a + (per > 1 ? b : 0);
    }
    int keep[16] = {0};
    for (int r = 0; r < tg; r++) {
        int best = -1;
        for (int g = 0; g < ng; g++)
            if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
        keep[best] = 1;
    }
    for (int x = 0; x < ne; x++)
        if (!keep[x / per]) sc[x] = 0;
    int taken[64] = {0};
    double tot = 0;
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int x = 0; x < ne; x++)
            if (!taken[x] && (best < 0 || sc[x] > sc[best])) best = x;
        taken[best] = 1;
        ids[r] = best;
        tot += s[best];
    }
    for (int r = 0; r < k; r++) w[r] = (float)((renorm ? s[ids[r]] / (tot + 1e-20) : s[ids[r]]) * scale);
}

static void route_case(int n, int ne, int k, int ng, int tg, int renorm, int with_bias, unsigned st) {
    sl_backend *be = open_backend();
    float *hl = malloc(sizeof *hl * (size_t)(n * ne)), hb[64];
    for (int i = 0; i < n * ne; i++) hl[i] = 4 * tu_frand(&st);
    for (int x = 0; x < ne; x++) hb[x] = tu_frand(&st);
    float *l = tu_dev_copy(be, hl, sizeof *hl * (size_t)(n * ne)), *b = tu_dev_copy(be, hb, sizeof hb);
    int32_t *ids = be->ops->alloc(be, sizeof(int32_t) * (size_t)(n * k));
    float *w = be->ops->alloc(be, sizeof(float) * (size_t)(n * k));
    be->ops->route_grouped(be, l, with_bias ? b : NULL, n, ne, k, ng, tg, renorm, 2.5f, ids, w);
    int32_t gid[256];
    float gw[256];
    be->ops->download(be, gid, ids, sizeof(int32_t) * (size_t)(n * k));
    be->ops->download(be, gw, w, sizeof(float) * (size_t)(n * k));
    check_ok(be);
    for (int t = 0; t < n; t++) {
        int32_t rid[64];
        float rw[64];
        ref_route(hl + t * ne, with_bias ? hb : NULL, ne, k, ng, tg, renorm, 2.5f, rid, rw);
        for (int r = 0; r < k; r++) {
            cr_assert_eq(gid[t * k + r], rid[r], "token %d slot %d: expert %d, expected %d", t, r, gid[t * k + r],
                         rid[r]);
            cr_assert(fabsf(gw[t * k + r] - rw[r]) <= 1e-5f * (1 + fabsf(rw[r])), "token %d slot %d: weight %g vs %g",
                      t, r, (double)gw[t * k + r], (double)rw[r]);
        }
    }
    be->ops->free(be, l);
    be->ops->free(be, b);
    be->ops->free(be, ids);
    be->ops->free(be, w);
    free(hl);
    sl_backend_destroy(be);
}

Test(mla_route, route_grouped) {
    route_case(7, 16, 4, 4, 2, 1, 1, 1);  /* DeepSeek-V3's shape, small */
    route_case(5, 64, 8, 8, 4, 1, 1, 2);  /* 8 groups, top-4 groups, top-8 experts */
    route_case(3, 16, 4, 1, 1, 1, 1, 3);  /* GLM-4.5: one group */
    route_case(3, 16, 4, 4, 2, 0, 0, 4);  /* no bias, no renormalisation */
    route_case(2, 48, 6, 16, 3, 1, 1, 5); /* groups of 3 */
}

/* The bias steers the choice, the weights stay the unbiased sigmoid scores; the experts of groups left
 * out count as 0 even where their scores are higher. */
Test(mla_route, route_grouped_bias_and_groups) {
    sl_backend *be = open_backend();
    /* 4 groups of 2; the bias lifts expert 7 over 0 and 1; group 1 (experts 2, 3) loses to groups 0, 3 */
    float hl[8] = {2.0f, 1.5f, 1.9f, -3.0f, -1.0f, -1.0f, -2.0f, 0.5f}, hb[8] = {0, 0, 0, 0, 0, 0, 0, 2.0f};
    float *l = tu_dev_copy(be, hl, sizeof hl), *b = tu_dev_copy(be, hb, sizeof hb);
    int32_t *ids = be->ops->alloc(be, 3 * sizeof(int32_t));
    float *w = be->ops->alloc(be, 3 * sizeof(float));
    be->ops->route_grouped(be, l, b, 1, 8, 3, 4, 2, 0, 1.0f, ids, w);
    int32_t gid[3];
    float gw[3];
    be->ops->download(be, gid, ids, sizeof gid);
    be->ops->download(be, gw, w, sizeof gw);
    check_ok(be);
    cr_assert_eq(gid[0], 7);
    cr_assert_eq(gid[1], 0);
    cr_assert_eq(gid[2], 1, "expert 2 (%g) is in a group left out", (double)hl[2]);
    cr_assert_float_eq(gw[0], 1.0f / (1.0f + expf(-0.5f)), 1e-6f, "unbiased weight");
    be->ops->free(be, l);
    be->ops->free(be, b);
    be->ops->free(be, ids);
    be->ops->free(be, w);
    sl_backend_destroy(be);
}

/* ---- latent attention ---- */

typedef struct mla_case {
    sl_mla_dims d;
    int P, max_pages;
    float scale, attn_factor;
} mla_case;

static void rope_ref(float *v, int rope, int interleave, int pos, const float *inv_freq, float af) {
    for (int f = 0; f < rope / 2; f++) {
        double ang = (double)pos * inv_freq[f], cs = cos(ang) * af, sn = sin(ang) * af;
        int i0 = interleave ? 2 * f : f, i1 = interleave ? 2 * f + 1 : f + rope / 2;
        double a = v[i0], c = v[i1];
        v[i0] = (float)(a * cs - c * sn);
        v[i1] = (float)(c * cs + a * sn);
    }
}

/* One batch: tokens (seq[i], pos[i]) with q and kv rows; hist[s] keeps each sequence's normed, roped kv
 * rows by position for the reference. */
static void mla_batch(sl_backend *be, const mla_case *mc, int n, const int32_t *seq, const int32_t *pos,
                      int32_t *dpages, float *cache, const float *wkv, const float *dwkv, const float *norm,
                      const float *dnorm, const float *freq, const float *dfreq, float *hist[2], unsigned *st) {
    const sl_mla_dims *d = &mc->d;
    int H = d->n_heads, qh = d->nope + d->rope, L = d->kv_lora, R = d->rope, W = L + R, hw = d->nope + d->v;
    size_t ql = (size_t)n * H * qh, kl = (size_t)n * W, ol = (size_t)n * H * d->v;
    float *hq = malloc(ql * 4), *hkv = malloc(kl * 4);
    for (size_t i = 0; i < ql; i++) hq[i] = tu_frand(st);
    for (size_t i = 0; i < kl; i++) hkv[i] = 2 * tu_frand(st);
    float *q = tu_dev_copy(be, hq, ql * 4), *kv = tu_dev_copy(be, hkv, kl * 4), *out = be->ops->alloc(be, ol * 4);
    int32_t *dpos = tu_dev_copy(be, pos, (size_t)n * 4), *dseq = tu_dev_copy(be, seq, (size_t)n * 4);
    int span = 0;
    for (int i = 0; i < n; i++) span = pos[i] + 1 > span ? pos[i] + 1 : span;
    sl_batch_map bm = {.n = n,
                       .pos = dpos,
                       .seq = dseq,
                       .pages = dpages,
                       .page_size = mc->P,
                       .max_pages = mc->max_pages,
                       .h_pos = pos,
                       .h_seq = seq,
                       .span = span};
    be->ops->mla_rope_store(be, q, kv, &bm, d, dnorm, 1e-6f, dfreq, mc->attn_factor, cache);
    be->ops->mla_attention(be, q, cache, &bm, d, dwkv, mc->scale, out);
    float *got = malloc(ol * 4);
    be->ops->download(be, got, out, ol * 4);
    check_ok(be);
    /* the reference: every token's kv row normed and roped into its sequence's history first */
    for (int i = 0; i < n; i++) {
        float *r = hkv + (size_t)i * W;
        double ss = 0;
        for (int c = 0; c < L; c++) ss += (double)r[c] * r[c];
        double inv = 1.0 / sqrt(ss / L + 1e-6);
        for (int c = 0; c < L; c++) r[c] = (float)(r[c] * inv * norm[c]);
        rope_ref(r + L, R, d->interleave, pos[i], freq, mc->attn_factor);
        memcpy(hist[seq[i]] + (size_t)pos[i] * W, r, (size_t)W * 4);
    }
    double num = 0, den = 0;
    double *s = malloc((size_t)span * sizeof *s);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            float *qv = hq + ((size_t)i * H + h) * qh;
            rope_ref(qv + d->nope, R, d->interleave, pos[i], freq, mc->attn_factor);
            double mx = -INFINITY;
            for (int t = 0; t <= pos[i]; t++) { /* k = [W_k . latent | k_rope], expanded */
                const float *row = hist[seq[i]] + (size_t)t * W;
                double dot = 0;
                for (int j = 0; j < d->nope; j++) {
                    double kj = 0;
                    for (int c = 0; c < L; c++) kj += (double)wkv[((size_t)h * hw + j) * L + c] * row[c];
                    dot += qv[j] * kj;
                }
                for (int j = 0; j < R; j++) dot += (double)qv[d->nope + j] * row[L + j];
                s[t] = dot * mc->scale;
                mx = s[t] > mx ? s[t] : mx;
            }
            double tot = 0;
            for (int t = 0; t <= pos[i]; t++) tot += (s[t] = exp(s[t] - mx));
            for (int j = 0; j < d->v; j++) {
                double o = 0;
                for (int t = 0; t <= pos[i]; t++) {
                    const float *row = hist[seq[i]] + (size_t)t * W;
                    double vj = 0;
                    for (int c = 0; c < L; c++) vj += (double)wkv[((size_t)h * hw + d->nope + j) * L + c] * row[c];
                    o += s[t] / tot * vj;
                }
                double g = got[((size_t)i * H + h) * d->v + j];
                num += (g - o) * (g - o);
                den += o * o;
            }
        }
    double rel = sqrt(num / den);
    cr_assert_leq(rel, 2e-5, "latent attention (heads %d, kv_lora %d, rope %d, interleave %d): rel-L2 %.3e", H, L, R,
                  d->interleave, rel);
    be->ops->free(be, q);
    be->ops->free(be, kv);
    be->ops->free(be, out);
    be->ops->free(be, dpos);
    be->ops->free(be, dseq);
    free(hq);
    free(hkv);
    free(got);
    free(s);
}

static void mla_run(int H, int nope, int rope, int kv_lora, int v, int interleave) {
    sl_backend *be = open_backend();
    unsigned st = (unsigned)(H * 7 + nope + rope * 3 + kv_lora + v + interleave);
    mla_case mc = {{H, nope, rope, kv_lora, v, interleave}, 4, 4, 0.3f, 1.1f};
    int W = kv_lora + rope, hw = nope + v;
    /* sequence 0 on pages 5, 3, 1, sequence 1 on 0, 6, 2: interleaved, out of order */
    int32_t pages[8] = {5, 3, 1, 7, 0, 6, 2, 4};
    int32_t *dpages = tu_dev_copy(be, pages, sizeof pages);
    size_t clen = (size_t)8 * mc.P * W;
    float *cache = be->ops->alloc(be, clen * 4);
    size_t wl = (size_t)H * hw * kv_lora;
    float *wkv = malloc(wl * 4), norm[512], freq[64];
    for (size_t i = 0; i < wl; i++) wkv[i] = tu_frand(&st);
    for (int c = 0; c < kv_lora; c++) norm[c] = 1 + tu_frand(&st);
    for (int f = 0; f < rope / 2; f++) freq[f] = powf(10000.0f, -2.0f * f / rope);
    float *dwkv = tu_dev_copy(be, wkv, wl * 4), *dnorm = tu_dev_copy(be, norm, (size_t)kv_lora * 4),
          *dfreq = tu_dev_copy(be, freq, sizeof freq);
    float *hist[2] = {calloc((size_t)16 * W, 4), calloc((size_t)16 * W, 4)};
    /* a prefill of both sequences, then decode steps in mixed order */
    int32_t s1[10] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 1}, p1[10] = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3};
    mla_batch(be, &mc, 10, s1, p1, dpages, cache, wkv, dwkv, norm, dnorm, freq, dfreq, hist, &st);
    int32_t s2[2] = {1, 0}, p2[2] = {4, 6};
    mla_batch(be, &mc, 2, s2, p2, dpages, cache, wkv, dwkv, norm, dnorm, freq, dfreq, hist, &st);
    int32_t s3[2] = {0, 1}, p3[2] = {7, 5};
    mla_batch(be, &mc, 2, s3, p3, dpages, cache, wkv, dwkv, norm, dnorm, freq, dfreq, hist, &st);
    be->ops->free(be, dpages);
    be->ops->free(be, cache);
    be->ops->free(be, dwkv);
    be->ops->free(be, dnorm);
    be->ops->free(be, dfreq);
    free(wkv);
    free(hist[0]);
    free(hist[1]);
    sl_backend_destroy(be);
}

Test(mla_route, latent_attention) {
    mla_run(4, 32, 16, 64, 32, 1);  /* the fixture's shape */
    mla_run(2, 16, 8, 40, 24, 0);   /* rotate-half pairing, widths off the vector sizes */
    mla_run(3, 64, 32, 128, 64, 1); /* wider */
}
