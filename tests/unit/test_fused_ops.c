/* The fused backend ops (add + RMSNorm, several matmuls sharing an input, matmuls with gated inputs or
 * outputs, q/k norm + rope + KV store, MoE pair outputs put in from the host) against plain host arithmetic, on the
 * backend SLUICE_BACKEND picks (the CPU without a GPU), and the models' fallbacks to the unfused ops for backends that
 * leave them out. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/half.h"
#include "models/fused.h"
#include "testutil.h"

static sl_backend *open_backend(void) {
    sl_backend *be;
    sl_err e = {{0}};
    char note[256];
    /* fused and unfused forms compared at fp32 accuracy: tensor-core batches in split bf16 */
    setenv("SLUICE_CUDA_PREFILL", "exact", 1);
    cr_assert_eq(sl_backend_open(NULL, 2, &be, note, sizeof note, &e), 0, "%s", e.msg);
    return be;
}

/* n random floats on the backend (and their host copy in *host) */
static float *dev_rand(sl_backend *be, size_t n, unsigned *st, float **host) {
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = tu_frand(st);
    float *d = be->ops->alloc(be, n * sizeof *d);
    cr_assert_not_null(d);
    be->ops->upload(be, d, h, n * sizeof *d);
    *host = h;
    return d;
}

static float *download(sl_backend *be, const float *d, size_t n) {
    float *h = malloc(n * sizeof *h);
    be->ops->download(be, h, d, n * sizeof *h);
    return h;
}

/* A random rows x cols weight in fmt (F32 or BF16), placed on the backend; *host gets its values. */
typedef struct {
    sl_weight w;
    void *data;
    float *vals, *bias;
    uint16_t *scales, *biases; /* MLX */
} tweight;

static void make_weight(sl_backend *be, tweight *t, sl_wfmt fmt, int rows, int cols, int with_bias, unsigned *st) {
    size_t es = fmt == SL_WF_F32 ? 4 : 2, len = (size_t)rows * (size_t)cols;
    memset(t, 0, sizeof *t);
    t->data = malloc(len * es);
    t->vals = malloc(len * sizeof *t->vals);
    for (size_t i = 0; i < len; i++) {
        float v = tu_frand(st);
        if (fmt == SL_WF_F32) {
            ((float *)t->data)[i] = v;
        } else {
            uint16_t h = sl_f32_to_bf16(v);
            ((uint16_t *)t->data)[i] = h;
            v = sl_bf16_to_f32(h);
        }
        t->vals[i] = v;
    }
    if (with_bias) {
        t->bias = malloc((size_t)rows * sizeof *t->bias);
        for (int i = 0; i < rows; i++) t->bias[i] = tu_frand(st);
    }
    t->w = (sl_weight){
        .fmt = fmt, .rows = rows, .cols = cols, .data = t->data, .row_bytes = (size_t)cols * es, .bias = t->bias};
    sl_err e = {{0}};
    if (be->ops->place_weight) cr_assert_eq(be->ops->place_weight(be, &t->w, &e), 0, "%s", e.msg);
}

/* A random MLX affine weight of `bits` (groups of 64, bf16 scales and biases), placed on the backend. */
static void make_mlx(sl_backend *be, tweight *t, int bits, int rows, int cols, unsigned *st) {
    size_t rb = (size_t)cols * (size_t)bits / 8, ng = (size_t)(cols / 64);
    memset(t, 0, sizeof *t);
    uint8_t *d = malloc((size_t)rows * rb);
    t->data = d;
    t->scales = malloc((size_t)rows * ng * sizeof *t->scales);
    t->biases = malloc((size_t)rows * ng * sizeof *t->biases);
    t->vals = malloc((size_t)rows * (size_t)cols * sizeof *t->vals);
    for (size_t i = 0; i < (size_t)rows * rb; i++) d[i] = (uint8_t)(tu_frand(st) * 255 + 128);
    for (size_t i = 0; i < (size_t)rows * ng; i++) {
        t->scales[i] = sl_f32_to_bf16(0.01f + 0.02f * tu_frand(st));
        t->biases[i] = sl_f32_to_bf16(0.1f * tu_frand(st));
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) { /* value j is bits [j * bits, (j + 1) * bits) of the row */
            unsigned q = 0;
            for (int k = 0; k < bits; k++) {
                size_t bit = (size_t)j * (size_t)bits + (size_t)k;
                q |= (unsigned)((d[(size_t)r * rb + bit / 8] >> (bit % 8)) & 1u) << k;
            }
            size_t g = (size_t)r * ng + (size_t)j / 64;
            t->vals[(size_t)r * (size_t)cols + (size_t)j] =
                sl_bf16_to_f32(t->scales[g]) * (float)q + sl_bf16_to_f32(t->biases[g]);
        }
    t->w = (sl_weight){.fmt = SL_WF_MLX,
                       .rows = rows,
                       .cols = cols,
                       .data = d,
                       .row_bytes = rb,
                       .bits = bits,
                       .group = 64,
                       .sb_fmt = SL_WF_BF16,
                       .scales = (const uint8_t *)t->scales,
                       .biases = (const uint8_t *)t->biases};
    sl_err e = {{0}};
    if (be->ops->place_weight) cr_assert_eq(be->ops->place_weight(be, &t->w, &e), 0, "%s", e.msg);
}

static void free_weight(tweight *t) {
    free(t->scales);
    free(t->biases);
    free(t->data);
    free(t->vals);
    free(t->bias);
}

/* y[n][rows] = x[n][cols] . vals^T + bias in double */
static void ref_matmul(const tweight *t, const float *x, int n, float *y) {
    for (int i = 0; i < n; i++)
        for (int r = 0; r < t->w.rows; r++) {
            double s = t->bias ? t->bias[r] : 0.0;
            for (int j = 0; j < t->w.cols; j++)
                s += (double)t->vals[(size_t)r * (size_t)t->w.cols + (size_t)j] *
                     x[(size_t)i * (size_t)t->w.cols + (size_t)j];
            y[(size_t)i * (size_t)t->w.rows + (size_t)r] = (float)s;
        }
}

static void expect_close(const float *got, const float *want, size_t n, float tol, const char *what) {
    for (size_t i = 0; i < n; i++)
        cr_assert(fabsf(got[i] - want[i]) <= tol * (1.0f + fabsf(want[i])), "%s: element %zu is %g, expected %g", what,
                  i, got[i], want[i]);
}

static void check_ok(sl_backend *be) {
    sl_err e = {{0}};
    cr_assert_eq(be->ops->check(be, &e), 0, "%s", e.msg);
}

/* The backend with its fused ops taken out: what the helpers in models/fused.h fall back from. */
typedef struct {
    sl_backend_ops ops;
    sl_backend b;
} unfused;

static sl_backend *unfused_of(sl_backend *be, unfused *u) {
    u->ops = *be->ops;
    u->ops.add_rmsnorm = NULL;
    u->ops.matmul_multi = NULL;
    u->ops.swiglu_matmul = NULL;
    u->ops.sigmoid_matmul = NULL;
    u->ops.moe_shared = NULL;
    u->ops.matmul_multi_conv = NULL;
    u->ops.qk_rope_store = NULL;
    u->ops.gated_rmsnorm_matmul = NULL;
    u->b = *be;
    u->b.ops = &u->ops;
    return &u->b;
}

static void add_rmsnorm_case(int rows, int dim, int with_w, int fused) {
    sl_backend *be = open_backend();
    unfused u;
    sl_backend *run = fused ? be : unfused_of(be, &u);
    unsigned st = (unsigned)(rows * 31 + dim);
    size_t len = (size_t)rows * (size_t)dim;
    float *hx, *hd, *hw;
    float *x = dev_rand(be, len, &st, &hx), *d = dev_rand(be, len, &st, &hd), *w = dev_rand(be, (size_t)dim, &st, &hw);
    float *y = be->ops->alloc(be, len * sizeof *y);
    if (fused) cr_assert_not_null(be->ops->add_rmsnorm, "the backend has no add_rmsnorm");
    sl_add_rmsnorm(run, x, d, with_w ? w : NULL, rows, dim, 1e-6f, y);
    float *gx = download(be, x, len), *gy = download(be, y, len);
    check_ok(be);
    float *wx = malloc(len * sizeof *wx), *wy = malloc(len * sizeof *wy);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) {
            size_t k = (size_t)r * (size_t)dim + (size_t)i;
            wx[k] = hx[k] + hd[k];
            ss += (double)wx[k] * wx[k];
        }
        double inv = 1.0 / sqrt(ss / dim + 1e-6);
        for (int i = 0; i < dim; i++) {
            size_t k = (size_t)r * (size_t)dim + (size_t)i;
            wy[k] = (float)(wx[k] * inv * (with_w ? hw[i] : 1.0f));
        }
    }
    expect_close(gx, wx, len, 1e-6f, "add_rmsnorm residual");
    expect_close(gy, wy, len, 1e-5f, "add_rmsnorm output");
    be->ops->free(be, x);
    be->ops->free(be, d);
    be->ops->free(be, w);
    be->ops->free(be, y);
    free(hx);
    free(hd);
    free(hw);
    free(gx);
    free(gy);
    free(wx);
    free(wy);
    sl_backend_destroy(be);
}

Test(fused_ops, add_rmsnorm) {
    add_rmsnorm_case(3, 64, 1, 1);
    add_rmsnorm_case(2, 2048, 1, 1);
    add_rmsnorm_case(2, 5000, 0, 1); /* wider than a GPU block holds in registers */
    add_rmsnorm_case(3, 96, 1, 0);
}

/* nw weights of mixed formats and heights sharing one input, n tokens, through sl_matmul_multi; with
 * mlx, 4-bit and 8-bit MLX weights (a router beside 4-bit projections) instead; with exact, two small fp32
 * weights marked exact (a MoE router and a shared expert's gate with a bias), also each through matmul alone,
 * within fp32 rounding whichever kernel the backend takes for n */
static void matmul_multi_case(int nw, int cols, int n, int mlx, int fused, int exact) {
    static const int heights_mixed[] = {7, 33, 100, 1, 64, 17}, heights_exact[] = {256, 1};
    const int *heights = exact ? heights_exact : heights_mixed;
    float tol = exact ? 1e-4f : 1e-3f;
    sl_backend *be = open_backend();
    unfused u;
    sl_backend *run = fused ? be : unfused_of(be, &u);
    unsigned st = (unsigned)(nw * 1000 + cols * 10 + n);
    tweight t[6];
    const sl_weight *w[6];
    float *y[6];
    for (int i = 0; i < nw; i++) {
        if (mlx)
            make_mlx(be, &t[i], i % 3 == 1 ? 8 : 4, heights[i], cols, &st);
        else if (exact)
            make_weight(be, &t[i], SL_WF_F32, heights[i], cols, i == 1, &st);
        else
            make_weight(be, &t[i], i % 3 == 1 ? SL_WF_F32 : SL_WF_BF16, heights[i], cols, i == 2, &st);
        t[i].w.exact = exact;
        w[i] = &t[i].w;
        y[i] = be->ops->alloc(be, (size_t)n * (size_t)heights[i] * sizeof(float));
    }
    float *hx, *x = dev_rand(be, (size_t)n * (size_t)cols, &st, &hx);
    if (fused) cr_assert_not_null(be->ops->matmul_multi, "the backend has no matmul_multi");
    sl_matmul_multi(run, nw, w, x, n, y);
    for (int i = 0; i < nw; i++) {
        size_t len = (size_t)n * (size_t)heights[i];
        float *got = download(be, y[i], len), *want = malloc(len * sizeof *want);
        ref_matmul(&t[i], hx, n, want);
        check_ok(be);
        expect_close(got, want, len, tol, "matmul_multi");
        if (exact) {
            be->ops->matmul(be, w[i], x, n, y[i]);
            free(got);
            got = download(be, y[i], len);
            check_ok(be);
            expect_close(got, want, len, tol, "matmul of an exact weight");
        }
        free(got);
        free(want);
        be->ops->free(be, y[i]);
        free_weight(&t[i]);
    }
    be->ops->free(be, x);
    free(hx);
    sl_backend_destroy(be);
}

Test(fused_ops, matmul_multi) {
    matmul_multi_case(3, 256, 1, 0, 1, 0);
    matmul_multi_case(4, 96, 3, 0, 1, 0);
    matmul_multi_case(2, 512, 24, 0, 1, 0); /* a prefill batch */
    matmul_multi_case(6, 64, 1, 0, 1, 0);   /* more weights than one call takes */
    matmul_multi_case(4, 256, 1, 1, 1, 0);
    matmul_multi_case(6, 128, 2, 1, 1, 0);
    matmul_multi_case(3, 64, 2, 0, 0, 0);
}

Test(fused_ops, exact_f32) {
    matmul_multi_case(2, 2048, 1, 0, 1, 1);
    matmul_multi_case(2, 2048, 8, 0, 1, 1);
    matmul_multi_case(2, 2048, 16, 0, 1, 1); /* past one GEMV launch: the fp32 product on CUDA */
    matmul_multi_case(2, 2048, 40, 0, 1, 1);
}

/* y = (silu(g) * u) . w^T, or with gated, y0 + sigmoid(s) * that */
static void swiglu_matmul_case(int rows, int cols, int n, int gated, int fused) {
    sl_backend *be = open_backend();
    unfused u;
    sl_backend *run = fused ? be : unfused_of(be, &u);
    unsigned st = (unsigned)(rows * 17 + cols + n + gated);
    tweight t;
    make_weight(be, &t, SL_WF_BF16, rows, cols, 0, &st);
    size_t len = (size_t)n * (size_t)cols, out = (size_t)n * (size_t)rows;
    float *hg, *hu, *hy, *hs;
    float *g = dev_rand(be, len, &st, &hg), *up = dev_rand(be, len, &st, &hu), *y = dev_rand(be, out, &st, &hy);
    float *s = dev_rand(be, (size_t)n, &st, &hs), *tmp = be->ops->alloc(be, out * sizeof *tmp);
    if (fused) cr_assert_not_null(be->ops->swiglu_matmul, "the backend has no swiglu_matmul");
    sl_swiglu_matmul(run, &t.w, g, up, n, gated ? s : NULL, tmp, y);
    float *got = download(be, y, out);
    check_ok(be);
    float *act = malloc(len * sizeof *act), *want = malloc(out * sizeof *want);
    for (size_t i = 0; i < len; i++) act[i] = hg[i] / (1.0f + expf(-hg[i])) * hu[i];
    ref_matmul(&t, act, n, want);
    if (gated)
        for (size_t i = 0; i < out; i++) want[i] = hy[i] + want[i] / (1.0f + expf(-hs[i / (size_t)rows]));
    expect_close(got, want, out, 1e-3f, gated ? "swiglu_matmul (gated add)" : "swiglu_matmul");
    float *dv[] = {g, up, y, s, tmp};
    for (int i = 0; i < 5; i++) be->ops->free(be, dv[i]);
    float *hp[] = {hg, hu, hy, hs, got, act, want};
    for (int i = 0; i < 7; i++) free(hp[i]);
    free_weight(&t);
    sl_backend_destroy(be);
}

Test(fused_ops, swiglu_matmul) {
    swiglu_matmul_case(40, 128, 1, 0, 1);
    swiglu_matmul_case(17, 512, 5, 0, 1);
    swiglu_matmul_case(64, 256, 20, 0, 1); /* a prefill batch */
    swiglu_matmul_case(48, 256, 1, 1, 1);
    swiglu_matmul_case(33, 128, 3, 1, 1);
    swiglu_matmul_case(24, 64, 20, 1, 1);
    swiglu_matmul_case(9, 64, 2, 0, 0);
    swiglu_matmul_case(9, 64, 2, 1, 0);
    /* inputs as wide as a dense model's down projection: one token stages them whole (SwiGLU formed on the
     * way), wider ones and two tokens go in chunks */
    swiglu_matmul_case(40, 14336, 1, 0, 1);
    swiglu_matmul_case(40, 14336, 1, 1, 1);
    swiglu_matmul_case(40, 14336, 1, 0, 0);
    swiglu_matmul_case(24, 20480, 1, 0, 1);
    swiglu_matmul_case(16, 14336, 2, 0, 1);
}

static void sigmoid_matmul_case(int rows, int cols, int n, int fused) {
    sl_backend *be = open_backend();
    unfused u;
    sl_backend *run = fused ? be : unfused_of(be, &u);
    unsigned st = (unsigned)(rows * 3 + cols + n);
    tweight t;
    make_weight(be, &t, SL_WF_F32, rows, cols, 1, &st);
    size_t len = (size_t)n * (size_t)cols, out = (size_t)n * (size_t)rows;
    float *hx, *hg, *x = dev_rand(be, len, &st, &hx), *g = dev_rand(be, len, &st, &hg);
    float *y = be->ops->alloc(be, out * sizeof *y);
    if (fused) cr_assert_not_null(be->ops->sigmoid_matmul, "the backend has no sigmoid_matmul");
    sl_sigmoid_matmul(run, &t.w, x, g, n, y);
    float *got = download(be, y, out), *want = malloc(out * sizeof *want);
    check_ok(be);
    for (size_t i = 0; i < len; i++) hx[i] /= 1.0f + expf(-hg[i]);
    ref_matmul(&t, hx, n, want);
    expect_close(got, want, out, 1e-3f, "sigmoid_matmul");
    be->ops->free(be, x);
    be->ops->free(be, g);
    be->ops->free(be, y);
    float *hp[] = {hx, hg, got, want};
    for (int i = 0; i < 4; i++) free(hp[i]);
    free_weight(&t);
    sl_backend_destroy(be);
}

Test(fused_ops, sigmoid_matmul) {
    sigmoid_matmul_case(50, 256, 1, 1);
    sigmoid_matmul_case(7, 96, 4, 1);
    sigmoid_matmul_case(20, 128, 18, 1); /* a prefill batch */
    sigmoid_matmul_case(5, 32, 2, 0);
}

/* host reference of one head: optional norm, then rotary embedding over the first rot_dim dims */
static void ref_head(float *v, int hd, const float *norm, float eps, int rot_dim, int pos, const float *inv_freq,
                     float af) {
    if (norm) {
        double ss = 0;
        for (int j = 0; j < hd; j++) ss += (double)v[j] * v[j];
        double inv = 1.0 / sqrt(ss / hd + eps);
        for (int j = 0; j < hd; j++) v[j] = (float)(v[j] * inv * norm[j]);
    }
    int half = rot_dim / 2;
    for (int f = 0; f < half; f++) {
        double ang = (double)pos * inv_freq[f], cs = cos(ang) * af, sn = sin(ang) * af;
        float a = v[f], c = v[f + half];
        v[f] = (float)(a * cs - c * sn);
        v[f + half] = (float)(c * cs + a * sn);
    }
}

/* x rounded to a cache element of type kt and back, as kv_store must (round to nearest even) */
static float kv_round(float x, sl_kv_type kt) {
    if (kt == SL_KV_F16) return sl_f16_to_f32(sl_f32_to_f16(x));
    if (kt == SL_KV_BF16) return sl_bf16_to_f32(sl_f32_to_bf16(x));
    return x;
}

/* n cache elements of type kt downloaded and widened to float32 */
static float *download_kv(sl_backend *be, const void *d, sl_kv_type kt, size_t n) {
    size_t es = sl_kv_bytes(kt, 1);
    unsigned char *raw = malloc(n * es);
    be->ops->download(be, raw, d, n * es);
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        uint16_t u;
        if (es == 4) {
            memcpy(&h[i], raw + i * 4, 4);
            continue;
        }
        memcpy(&u, raw + i * 2, 2);
        h[i] = kt == SL_KV_F16 ? sl_f16_to_f32(u) : sl_bf16_to_f32(u);
    }
    free(raw);
    return h;
}

/* gated: q comes from a [query | gate] per head projection, whose gates are copied out as well. The caches
 * hold elements of type kt. */
static void qk_rope_store_case(int n, int nh, int nkv, int hd, int rot_dim, int with_norm, int pos0, int fused,
                               int gated, sl_kv_type kt) {
    sl_backend *be = open_backend();
    unfused u;
    sl_backend *run = fused ? be : unfused_of(be, &u);
    unsigned st = (unsigned)(n * 97 + nh * 13 + hd + pos0);
    size_t qlen = (size_t)n * (size_t)nh * (size_t)hd, klen = (size_t)n * (size_t)nkv * (size_t)hd;
    /* pages of 4 positions (tu_map_make lays them out in reverse order) */
    int P = 4, np = (pos0 + n + 2 + P - 1) / P;
    size_t clen = (size_t)np * (size_t)P * (size_t)nkv * (size_t)hd;
    int32_t *hpages = malloc((size_t)np * sizeof *hpages), *hpos = malloc((size_t)n * sizeof *hpos),
            *hseq = calloc((size_t)n, sizeof *hseq);
    tu_map map;
    tu_map_make(&map, be, n, pos0, hpos, hseq, hpages, np, P);
    float *hq, *hk, *hv, *hqn, *hkn, *hf;
    float *q = dev_rand(be, qlen, &st, &hq), *k = dev_rand(be, klen, &st, &hk), *v = dev_rand(be, klen, &st, &hv);
    float *qn = dev_rand(be, (size_t)hd, &st, &hqn), *kn = dev_rand(be, (size_t)hd, &st, &hkn);
    float *freq = dev_rand(be, (size_t)rot_dim / 2, &st, &hf);
    void *kc = be->ops->alloc(be, sl_kv_bytes(kt, clen)), *vc = be->ops->alloc(be, sl_kv_bytes(kt, clen));
    float *hqg = NULL, *qg = gated ? dev_rand(be, 2 * qlen, &st, &hqg) : NULL;
    float *gate = gated ? be->ops->alloc(be, qlen * sizeof *gate) : NULL;
    if (gated) /* the queries the op must take from qg, the first half of each head's row */
        for (size_t r = 0; r < (size_t)n * (size_t)nh; r++)
            memcpy(hq + r * (size_t)hd, hqg + 2 * r * (size_t)hd, (size_t)hd * sizeof *hq);
    if (fused) cr_assert_not_null(be->ops->qk_rope_store, "the backend has no qk_rope_store");
    sl_qk_rope_store(run, q, k, v, &map.bm, nh, nkv, hd, with_norm ? qn : NULL, with_norm ? kn : NULL, 1e-6f, rot_dim,
                     freq, 0.9f, kc, vc, kt, qg, gate);
    float *gq = download(be, q, qlen), *gk = download(be, k, klen), *gkc = download_kv(be, kc, kt, clen),
          *gvc = download_kv(be, vc, kt, clen);
    check_ok(be);
    if (gated) {
        float *gg = download(be, gate, qlen), *wg = malloc(qlen * sizeof *wg);
        for (size_t r = 0; r < (size_t)n * (size_t)nh; r++)
            memcpy(wg + r * (size_t)hd, hqg + (2 * r + 1) * (size_t)hd, (size_t)hd * sizeof *wg);
        expect_close(gg, wg, qlen, 0.0f, "qk_rope_store gate");
        free(gg);
        free(wg);
        be->ops->free(be, qg);
        be->ops->free(be, gate);
        free(hqg);
    }
    float *wkc = calloc(clen, sizeof *wkc), *wvc = calloc(clen, sizeof *wvc);
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < nh; h++)
            ref_head(hq + ((size_t)i * (size_t)nh + (size_t)h) * (size_t)hd, hd, with_norm ? hqn : NULL, 1e-6f, rot_dim,
                     pos0 + i, hf, 0.9f);
        for (int h = 0; h < nkv; h++)
            ref_head(hk + ((size_t)i * (size_t)nkv + (size_t)h) * (size_t)hd, hd, with_norm ? hkn : NULL, 1e-6f,
                     rot_dim, pos0 + i, hf, 0.9f);
    }
    size_t kw = (size_t)nkv * (size_t)hd;
    for (int i = 0; i < n; i++) {
        size_t row = (size_t)sl_bm_row(&map.bm, hpages, 0, pos0 + i);
        for (size_t j = 0; j < kw; j++) {
            wkc[row * kw + j] = kv_round(hk[(size_t)i * kw + j], kt);
            wvc[row * kw + j] = kv_round(hv[(size_t)i * kw + j], kt);
        }
    }
    /* k differs from the host's by rounding, which may move its cache element by one unit */
    float ktol = kt == SL_KV_F16 ? 1e-3f : kt == SL_KV_BF16 ? 8e-3f : 1e-4f;
    expect_close(gq, hq, qlen, 1e-4f, "qk_rope_store q");
    expect_close(gk, hk, klen, 1e-4f, "qk_rope_store k");
    expect_close(gkc, wkc, clen, ktol, "qk_rope_store k cache");
    expect_close(gvc, wvc, clen, 0.0f, "qk_rope_store v cache");
    tu_map_free(&map);
    void *dv[] = {q, k, v, qn, kn, freq, kc, vc};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) be->ops->free(be, dv[i]);
    void *hp[] = {hq, hk, hv, hqn, hkn, hf, gq, gk, gkc, gvc, wkc, wvc, hpages, hpos, hseq};
    for (int i = 0; i < 15; i++) free(hp[i]);
    sl_backend_destroy(be);
}

Test(fused_ops, qk_rope_store) {
    for (sl_kv_type kt = SL_KV_F32; kt <= SL_KV_BF16; kt++) {
        qk_rope_store_case(1, 4, 2, 64, 64, 0, 5, 1, 0, kt);
        qk_rope_store_case(3, 8, 2, 128, 64, 1, 0, 1, 0, kt); /* partial rotary, q/k norms */
        qk_rope_store_case(2, 2, 1, 256, 256, 1, 7, 1, 0, kt);
        qk_rope_store_case(2, 4, 4, 32, 32, 1, 3, 0, 0, kt);
        qk_rope_store_case(2, 4, 2, 256, 64, 1, 4, 1, 1, kt); /* gated q (Qwen3.5) */
        qk_rope_store_case(2, 4, 2, 256, 64, 1, 4, 0, 1, kt);
    }
}

static void gated_rmsnorm_matmul_case(int rows, int groups, int dim, int n, int fused) {
    sl_backend *be = open_backend();
    unfused u;
    sl_backend *run = fused ? be : unfused_of(be, &u);
    unsigned st = (unsigned)(rows * 5 + groups * 11 + dim + n);
    int cols = groups * dim;
    tweight t;
    make_weight(be, &t, SL_WF_BF16, rows, cols, 0, &st);
    size_t len = (size_t)n * (size_t)cols;
    float *hx, *hz, *hw;
    float *x = dev_rand(be, len, &st, &hx), *z = dev_rand(be, len, &st, &hz), *w = dev_rand(be, (size_t)dim, &st, &hw);
    float *y = be->ops->alloc(be, (size_t)n * (size_t)rows * sizeof *y);
    if (fused) cr_assert_not_null(be->ops->gated_rmsnorm_matmul, "the backend has no gated_rmsnorm_matmul");
    sl_gated_rmsnorm_matmul(run, &t.w, x, z, w, dim, 1e-6f, n, y);
    float *got = download(be, y, (size_t)n * (size_t)rows);
    check_ok(be);
    float *want = malloc((size_t)n * (size_t)rows * sizeof *want);
    for (size_t g = 0; g < (size_t)n * (size_t)groups; g++) {
        float *v = hx + g * (size_t)dim;
        const float *zv = hz + g * (size_t)dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)v[j] * v[j];
        double inv = 1.0 / sqrt(ss / dim + 1e-6);
        for (int j = 0; j < dim; j++) v[j] = (float)(hw[j] * v[j] * inv * zv[j] / (1.0 + exp(-zv[j])));
    }
    ref_matmul(&t, hx, n, want);
    expect_close(got, want, (size_t)n * (size_t)rows, 1e-3f, "gated_rmsnorm_matmul");
    be->ops->free(be, x);
    be->ops->free(be, z);
    be->ops->free(be, w);
    be->ops->free(be, y);
    free_weight(&t);
    free(hx);
    free(hz);
    free(hw);
    free(got);
    free(want);
    sl_backend_destroy(be);
}

Test(fused_ops, gated_rmsnorm_matmul) {
    gated_rmsnorm_matmul_case(48, 8, 128, 1, 1);
    gated_rmsnorm_matmul_case(20, 3, 64, 6, 1);
    gated_rmsnorm_matmul_case(8, 100, 96, 1, 1); /* groups that straddle a GPU staging chunk */
    gated_rmsnorm_matmul_case(30, 4, 64, 20, 1); /* a prefill batch */
    gated_rmsnorm_matmul_case(16, 2, 32, 2, 0);
}

/* host routing of one token: softmax, top-k (ties to the lower index), optional renormalisation */
static void ref_route(const float *l, int E, int k, int renorm, int32_t *ids, float *w) {
    float mx = l[0], sum = 0, tot = 0;
    for (int x = 1; x < E; x++) mx = fmaxf(mx, l[x]);
    for (int x = 0; x < E; x++) sum += expf(l[x] - mx);
    int taken[64] = {0};
    for (int s = 0; s < k; s++) {
        int bi = -1;
        for (int x = 0; x < E; x++)
            if (!taken[x] && (bi < 0 || l[x] > l[bi])) bi = x;
        taken[bi] = 1;
        ids[s] = bi;
        w[s] = expf(l[bi] - mx) / sum;
        tot += w[s];
    }
    if (renorm)
        for (int s = 0; s < k; s++) w[s] /= tot;
}

/* One expert matrix: bf16 (bits 0) or MLX affine of `bits`. */
static void make_expert_weight(sl_backend *be, tweight *t, int bits, int rows, int cols, unsigned *st) {
    if (bits)
        make_mlx(be, t, bits, rows, cols, st);
    else
        make_weight(be, t, SL_WF_BF16, rows, cols, 0, st);
}

/* E experts of hidden -> inter -> hidden routed top-k from logits, plus a shared expert's down projection;
 * the matrices bf16 (bits 0) or MLX of `bits` */
static void moe_shared_case(int E, int k, int renorm, int hidden, int inter, int n, int fused, int bits) {
    sl_backend *be = open_backend();
    unfused u;
    sl_backend *run = fused ? be : unfused_of(be, &u);
    unsigned st = (unsigned)(E * 7 + k * 3 + hidden + inter + n);
    tweight tw[3 * 40], shd;
    sl_expert ex[40];
    const sl_expert *exp[40];
    for (int e = 0; e < E; e++) {
        make_expert_weight(be, &tw[3 * e], bits, inter, hidden, &st);
        make_expert_weight(be, &tw[3 * e + 1], bits, inter, hidden, &st);
        make_expert_weight(be, &tw[3 * e + 2], bits, hidden, inter, &st);
        ex[e] = (sl_expert){tw[3 * e].w, tw[3 * e + 1].w, tw[3 * e + 2].w};
        exp[e] = &ex[e];
    }
    sl_expert_table tab = {.n_experts = E, .experts = exp};
    sl_err e = {{0}};
    if (be->ops->place_experts) cr_assert_eq(be->ops->place_experts(be, &tab, &e), 0, "%s", e.msg);
    make_expert_weight(be, &shd, bits, hidden, inter, &st);
    size_t xl = (size_t)n * (size_t)hidden, gl = (size_t)n * (size_t)inter;
    float *hx, *hg, *hu, *hs, *hw = NULL;
    float *x = dev_rand(be, xl, &st, &hx), *g = dev_rand(be, gl, &st, &hg), *up = dev_rand(be, gl, &st, &hu);
    float *hl, *gate = dev_rand(be, (size_t)n, &st, &hs), *logits = dev_rand(be, (size_t)n * (size_t)E, &st, &hl);
    float *w = be->ops->alloc(be, (size_t)n * (size_t)k * sizeof *w);
    int32_t hid[64], gid[64];
    hw = malloc((size_t)n * (size_t)k * sizeof *hw);
    for (int t = 0; t < n; t++)
        ref_route(hl + (size_t)t * (size_t)E, E, k, renorm, hid + t * k, hw + (size_t)t * (size_t)k);
    int32_t *ids = be->ops->alloc(be, sizeof hid);
    float *tmp = be->ops->alloc(be, xl * sizeof *tmp), *out = be->ops->alloc(be, xl * sizeof *out);
    if (fused) cr_assert_not_null(be->ops->moe_shared, "the backend has no moe_shared");
    sl_moe_shared(run, &tab, logits, E, k, renorm, ids, w, x, n, hidden, &shd.w, g, up, gate, tmp, out);
    float *got = download(be, out, xl), *gw = download(be, w, (size_t)n * (size_t)k);
    be->ops->download(be, gid, ids, (size_t)n * (size_t)k * sizeof *gid);
    check_ok(be);
    for (int i = 0; i < n * k; i++)
        cr_assert_eq(gid[i], hid[i], "moe_shared: route %d is expert %d, expected %d", i, gid[i], hid[i]);
    expect_close(gw, hw, (size_t)n * (size_t)k, 1e-5f, "moe_shared routing weights");
    float *want = calloc(xl, sizeof *want), *a = malloc(gl * sizeof *a), *gg = malloc((size_t)inter * sizeof *gg),
          *uu = malloc((size_t)inter * sizeof *uu), *dd = malloc((size_t)hidden * sizeof *dd);
    for (int t = 0; t < n; t++) {
        for (int s = 0; s < k; s++) {
            int id = hid[t * k + s];
            ref_matmul(&tw[3 * id], hx + (size_t)t * (size_t)hidden, 1, gg);
            ref_matmul(&tw[3 * id + 1], hx + (size_t)t * (size_t)hidden, 1, uu);
            for (int j = 0; j < inter; j++) gg[j] = gg[j] / (1.0f + expf(-gg[j])) * uu[j];
            ref_matmul(&tw[3 * id + 2], gg, 1, dd);
            for (int j = 0; j < hidden; j++) want[(size_t)t * (size_t)hidden + (size_t)j] += hw[t * k + s] * dd[j];
        }
    }
    for (size_t i = 0; i < gl; i++) a[i] = hg[i] / (1.0f + expf(-hg[i])) * hu[i];
    float *sh = malloc(xl * sizeof *sh);
    ref_matmul(&shd, a, n, sh);
    for (size_t i = 0; i < xl; i++) want[i] += sh[i] / (1.0f + expf(-hs[i / (size_t)hidden]));
    expect_close(got, want, xl, 1e-3f, "moe_shared");
    float *dv[] = {x, g, up, gate, w, tmp, out, logits};
    for (int i = 0; i < 8; i++) be->ops->free(be, dv[i]);
    be->ops->free(be, ids);
    float *hp[] = {hx, hg, hu, hs, hw, got, want, a, gg, uu, dd, sh, hl, gw};
    for (int i = 0; i < 14; i++) free(hp[i]);
    for (int i = 0; i < 3 * E; i++) free_weight(&tw[i]);
    free_weight(&shd);
    sl_backend_destroy(be);
}

Test(fused_ops, moe_shared) {
    moe_shared_case(4, 2, 1, 64, 32, 1, 1, 0);
    moe_shared_case(8, 3, 0, 128, 64, 3, 1, 0);
    moe_shared_case(40, 8, 1, 64, 32, 2, 1, 0); /* more experts than a warp has lanes */
    moe_shared_case(6, 2, 1, 64, 32, 20, 1, 0); /* a batch under the grouped kernels' start for float experts */
    moe_shared_case(6, 1, 1, 64, 32, 40, 1, 0); /* a prefill batch: the grouped kernels */
    moe_shared_case(4, 2, 0, 32, 32, 2, 0, 0);
    /* MLX experts: the CUDA backend runs every down projection and the combine in one launch */
    moe_shared_case(8, 3, 1, 128, 64, 1, 1, 4);
    moe_shared_case(40, 8, 1, 256, 128, 2, 1, 4);
    moe_shared_case(6, 2, 0, 64, 192, 3, 1, 8);
    moe_shared_case(8, 3, 1, 128, 64, 1, 0, 4);
}

/* Pair outputs computed elsewhere (an expert store's CPU experts): moe_pairs on the pairs whose expert is
 * in `on_backend` (a bit per expert), the others' rows computed on the host and put in with moe_pairs_put,
 * then moe_combine, against host arithmetic for all of them. on_backend 0: no moe_pairs call at all. */
static void moe_pairs_put_case(int E, int k, int hidden, int inter, int n, unsigned on_backend) {
    sl_backend *be = open_backend();
    cr_assert_not_null(be->ops->moe_pairs_put, "the backend has no moe_pairs_put");
    unsigned st = (unsigned)(E * 5 + k + hidden + n + (int)on_backend);
    tweight tw[3 * 16];
    sl_expert ex[16];
    const sl_expert *exp[16];
    for (int e = 0; e < E; e++) {
        make_expert_weight(be, &tw[3 * e], 0, inter, hidden, &st);
        make_expert_weight(be, &tw[3 * e + 1], 0, inter, hidden, &st);
        make_expert_weight(be, &tw[3 * e + 2], 0, hidden, inter, &st);
        ex[e] = (sl_expert){tw[3 * e].w, tw[3 * e + 1].w, tw[3 * e + 2].w};
        exp[e] = &ex[e];
    }
    sl_expert_table tab = {.n_experts = E, .experts = exp};
    sl_err e = {{0}};
    if (be->ops->place_experts) cr_assert_eq(be->ops->place_experts(be, &tab, &e), 0, "%s", e.msg);
    int nk = n * k;
    size_t xl = (size_t)n * (size_t)hidden;
    float *hx, *hw;
    float *x = dev_rand(be, xl, &st, &hx), *w = dev_rand(be, (size_t)nk, &st, &hw);
    int32_t hid[64], bid[64], pidx[64];
    for (int t = 0; t < n; t++) /* k distinct experts a token */
        for (int s = 0; s < k; s++) hid[t * k + s] = (t * 3 + s * 5) % E;
    float *rows = be->ops->host_alloc ? be->ops->host_alloc(be, (size_t)nk * (size_t)hidden * sizeof(float))
                                      : malloc((size_t)nk * (size_t)hidden * sizeof(float));
    int32_t *hidx = be->ops->host_alloc ? be->ops->host_alloc(be, sizeof pidx) : malloc(sizeof pidx);
    float *want = calloc(xl, sizeof *want), *gg = malloc((size_t)inter * sizeof *gg),
          *uu = malloc((size_t)inter * sizeof *uu), *dd = malloc((size_t)hidden * sizeof *dd);
    int cnt = 0;
    for (int i = 0; i < nk; i++) {
        int id = hid[i], t = i / k, mine = (on_backend >> id) & 1;
        bid[i] = mine ? id : -1;
        ref_matmul(&tw[3 * id], hx + (size_t)t * (size_t)hidden, 1, gg);
        ref_matmul(&tw[3 * id + 1], hx + (size_t)t * (size_t)hidden, 1, uu);
        for (int j = 0; j < inter; j++) gg[j] = gg[j] / (1.0f + expf(-gg[j])) * uu[j];
        ref_matmul(&tw[3 * id + 2], gg, 1, dd);
        for (int j = 0; j < hidden; j++) want[(size_t)t * (size_t)hidden + (size_t)j] += hw[i] * dd[j];
        if (!mine) {
            memcpy(rows + (size_t)cnt * (size_t)hidden, dd, (size_t)hidden * sizeof *dd);
            hidx[cnt++] = i;
        }
    }
    int32_t *ids = be->ops->alloc(be, sizeof bid);
    be->ops->upload(be, ids, bid, (size_t)nk * sizeof *bid);
    float *out = be->ops->alloc(be, xl * sizeof *out);
    if (on_backend) be->ops->moe_pairs(be, &tab, x, n, hidden, ids, k);
    be->ops->moe_pairs_put(be, rows, hidx, cnt, n, k, hidden);
    be->ops->moe_combine(be, w, n, k, hidden, out);
    float *got = download(be, out, xl);
    check_ok(be);
    expect_close(got, want, xl, 1e-3f, "moe_pairs + moe_pairs_put + moe_combine");
    be->ops->free(be, x);
    be->ops->free(be, w);
    be->ops->free(be, out);
    be->ops->free(be, ids);
    if (be->ops->host_free) {
        be->ops->host_free(be, rows);
        be->ops->host_free(be, hidx);
    } else {
        free(rows);
        free(hidx);
    }
    float *hp[] = {hx, hw, got, want, gg, uu, dd};
    for (int i = 0; i < 7; i++) free(hp[i]);
    for (int i = 0; i < 3 * E; i++) free_weight(&tw[i]);
    sl_backend_destroy(be);
}

Test(fused_ops, moe_pairs_put) {
    moe_pairs_put_case(4, 2, 64, 32, 1, 0x5);   /* decode: one token, half its experts put */
    moe_pairs_put_case(8, 3, 128, 64, 3, 0x0f); /* a few tokens */
    moe_pairs_put_case(6, 2, 64, 96, 12, 0x2a); /* a batch of the GEMV per pair (float experts) */
    moe_pairs_put_case(6, 1, 64, 96, 40, 0x2a); /* a prompt: the grouped kernels, where the GPU groups */
    moe_pairs_put_case(4, 2, 64, 32, 2, 0);     /* every pair put, no moe_pairs call */
}

/* The guard of device steps with the host's part: experts 0-3 in the table, 2-6 in host memory. Of the
 * host-capable experts routed (2, 5, 3, 6, 4, each counted once in routing order), the first
 * round(0.5 * 5) = 2 are the host's, and those the table lacks (5, 6, 4) too; 3 stays with the table, 0 is
 * the table's alone, 7 is a miss; a repeated expert (2) goes where its first pair went. */
Test(fused_ops, moe_guard_host_part) {
    sl_backend *be = open_backend();
    enum { E = 8, NK = 8 };
    unsigned st = 7;
    tweight tw[3 * 4];
    sl_expert ex[4];
    const sl_expert *exp[E] = {0};
    for (int e = 0; e < 4; e++) {
        for (int j = 0; j < 3; j++) make_expert_weight(be, &tw[3 * e + j], 0, 32, 64, &st);
        ex[e] = (sl_expert){tw[3 * e].w, tw[3 * e + 1].w, tw[3 * e + 2].w};
        exp[e] = &ex[e];
    }
    sl_expert_table tab = {.n_experts = E, .experts = exp};
    sl_err e = {{0}};
    if (be->ops->place_experts) cr_assert_eq(be->ops->place_experts(be, &tab, &e), 0, "%s", e.msg);
    const int32_t routed[NK] = {2, 5, 0, 7, 3, 2, 6, 4};
    const uint8_t host[E] = {0, 0, 1, 1, 1, 1, 1, 0};
    const float share = 0.5f;
    const int32_t want_ids[NK] = {-1, -1, 0, -1, 3, -1, -1, -1}, want_host[NK] = {2, 5, -1, -1, -1, 2, 6, 4};
    int32_t *ids = be->ops->alloc(be, sizeof routed), *rec = be->ops->alloc(be, sizeof routed),
            *hids = be->ops->alloc(be, sizeof routed), *miss = be->ops->alloc(be, sizeof(int32_t));
    uint8_t *dh = be->ops->alloc(be, sizeof host);
    float *ds = be->ops->alloc(be, sizeof share);
    be->ops->upload(be, ids, routed, sizeof routed);
    be->ops->upload(be, dh, host, sizeof host);
    be->ops->upload(be, ds, &share, sizeof share);
    be->ops->zero(be, miss, sizeof(int32_t));
    be->ops->moe_guard(be, &tab, ids, NK, rec, miss, dh, ds, hids);
    int32_t got_ids[NK], got_rec[NK], got_host[NK], got_miss;
    be->ops->download(be, got_ids, ids, sizeof got_ids);
    be->ops->download(be, got_rec, rec, sizeof got_rec);
    be->ops->download(be, got_host, hids, sizeof got_host);
    be->ops->download(be, &got_miss, miss, sizeof got_miss);
    check_ok(be);
    for (int i = 0; i < NK; i++) {
        cr_expect_eq(got_rec[i], routed[i], "pair %d: recorded %d, routed %d", i, got_rec[i], routed[i]);
        cr_expect_eq(got_ids[i], want_ids[i], "pair %d: the table's id %d, expected %d", i, got_ids[i], want_ids[i]);
        cr_expect_eq(got_host[i], want_host[i], "pair %d: the host's id %d, expected %d", i, got_host[i], want_host[i]);
    }
    cr_expect_eq(got_miss, 1, "%d misses counted, expected 1 (expert 7)", got_miss);
    void *bufs[] = {ids, rec, hids, miss, dh, ds};
    for (int i = 0; i < 6; i++) be->ops->free(be, bufs[i]);
    for (int i = 0; i < 12; i++) free_weight(&tw[i]);
    sl_backend_destroy(be);
}

/* the backend's argmax: NaN as -inf, the lowest index among equals, -1 when nothing is above -inf */
static void argmax_case(sl_backend *be, const float *v, int n, int32_t want) {
    float *d = be->ops->alloc(be, (size_t)n * sizeof *d);
    be->ops->upload(be, d, v, (size_t)n * sizeof *d);
    int32_t got = -2;
    be->ops->argmax(be, d, 1, n, &got);
    check_ok(be);
    cr_expect_eq(got, want, "argmax of %d values: %d, expected %d", n, got, want);
    be->ops->free(be, d);
}

/* many rows in one call (a batch's sequences), more than the backend's first buffer holds: each row's own
 * largest, ties, NaN and all -inf rows among them */
static void argmax_rows_case(sl_backend *be, int rows, int n) {
    float *v = malloc((size_t)rows * (size_t)n * sizeof *v);
    int32_t *want = malloc((size_t)rows * sizeof *want), *got = malloc((size_t)rows * sizeof *got);
    unsigned st = (unsigned)(rows * 31 + n);
    for (int r = 0; r < rows; r++) {
        float *row = v + (size_t)r * (size_t)n;
        for (int i = 0; i < n; i++) row[i] = tu_frand(&st);
        int at = (int)((unsigned)(r * 7919) % (unsigned)n);
        row[at] = 2.0f + (float)r;
        want[r] = at;
        if (r % 5 == 1) { /* an equal value later in the row: the lower index stays */
            row[n - 1] = row[at];
            want[r] = at < n - 1 ? at : n - 1;
        }
        if (r % 7 == 3) row[(at + 1) % n] = NAN;
        if (r % 11 == 4) {
            for (int i = 0; i < n; i++) row[i] = i % 2 ? -INFINITY : NAN;
            want[r] = -1;
        }
    }
    float *d = be->ops->alloc(be, (size_t)rows * (size_t)n * sizeof *d);
    be->ops->upload(be, d, v, (size_t)rows * (size_t)n * sizeof *d);
    be->ops->argmax(be, d, rows, n, got);
    check_ok(be);
    for (int r = 0; r < rows; r++)
        cr_expect_eq(got[r], want[r], "argmax of row %d of %d: %d, expected %d", r, rows, got[r], want[r]);
    be->ops->free(be, d);
    free(v);
    free(want);
    free(got);
}

Test(fused_ops, argmax) {
    sl_backend *be = open_backend();
    cr_assert_not_null(be->ops->argmax, "the backend has no argmax");
    int n = 300000;
    float *v = malloc((size_t)n * sizeof *v);
    unsigned st = 7;
    for (int i = 0; i < n; i++) v[i] = tu_frand(&st);
    v[123457] = 3.0f;
    argmax_case(be, v, n, 123457);
    v[200001] = 3.0f; /* equal values: the lower index */
    v[5] = NAN;
    argmax_case(be, v, n, 123457);
    v[299999] = INFINITY;
    argmax_case(be, v, n, 299999);
    for (int i = 0; i < n; i++) v[i] = i % 3 ? -INFINITY : NAN;
    argmax_case(be, v, n, -1);
    v[n - 1] = -1e30f;
    argmax_case(be, v, n, n - 1);
    float one[1] = {-2.0f};
    argmax_case(be, one, 1, 0);
    argmax_rows_case(be, 3, 1000);
    argmax_rows_case(be, 70, 4099);
    argmax_rows_case(be, 130, 257);
    free(v);
    sl_backend_destroy(be);
}

/* two weights sharing x, the first through a causal conv of `kernel` taps + SiLU with its state */
static void matmul_multi_conv_case(int ch, int cols, int kernel, int n, int fused) {
    sl_backend *be = open_backend();
    unfused u;
    sl_backend *run = fused ? be : unfused_of(be, &u);
    unsigned st = (unsigned)(ch * 3 + cols + kernel * 11 + n);
    tweight t[2];
    make_weight(be, &t[0], SL_WF_BF16, ch, cols, 0, &st);
    make_weight(be, &t[1], SL_WF_F32, 24, cols, 1, &st);
    int hist = kernel - 1;
    size_t sl = (size_t)hist * (size_t)ch, ol = (size_t)n * (size_t)ch;
    float *hx, *hw, *hs;
    float *x = dev_rand(be, (size_t)n * (size_t)cols, &st, &hx),
          *cw = dev_rand(be, (size_t)ch * (size_t)kernel, &st, &hw);
    float *state = dev_rand(be, sl ? sl : 1, &st, &hs);
    float *y0 = be->ops->alloc(be, ol * sizeof *y0), *y1 = be->ops->alloc(be, (size_t)n * 24 * sizeof *y1);
    float *tmp = be->ops->alloc(be, ol * sizeof *tmp);
    const sl_weight *w[2] = {&t[0].w, &t[1].w};
    float *y[2] = {y0, y1};
    if (fused) cr_assert_not_null(be->ops->matmul_multi_conv, "the backend has no matmul_multi_conv");
    sl_matmul_multi_conv(run, 2, w, x, n, y, cw, kernel, state, tmp);
    float *g0 = download(be, y0, ol), *g1 = download(be, y1, (size_t)n * 24), *gs = download(be, state, sl ? sl : 1);
    check_ok(be);
    float *raw = malloc(ol * sizeof *raw), *w0 = malloc(ol * sizeof *w0), *w1 = malloc((size_t)n * 24 * sizeof *w1);
    float *ws = calloc(sl ? sl : 1, sizeof *ws);
    ref_matmul(&t[0], hx, n, raw);
    ref_matmul(&t[1], hx, n, w1);
    for (int c = 0; c < ch; c++) {
        for (int i = 0; i < n; i++) {
            float s = 0;
            for (int k = 0; k < kernel; k++) {
                int src = i - hist + k;
                s += hw[(size_t)c * (size_t)kernel + (size_t)k] *
                     (src >= 0 ? raw[(size_t)src * (size_t)ch + (size_t)c]
                               : hs[(size_t)(hist + src) * (size_t)ch + (size_t)c]);
            }
            w0[(size_t)i * (size_t)ch + (size_t)c] = s / (1.0f + expf(-s));
        }
        for (int h = 0; h < hist; h++) {
            int src = n - hist + h;
            ws[(size_t)h * (size_t)ch + (size_t)c] = src >= 0 ? raw[(size_t)src * (size_t)ch + (size_t)c]
                                                              : hs[(size_t)(hist + src) * (size_t)ch + (size_t)c];
        }
    }
    expect_close(g0, w0, ol, 1e-3f, "matmul_multi_conv conv output");
    expect_close(g1, w1, (size_t)n * 24, 1e-3f, "matmul_multi_conv second output");
    expect_close(gs, ws, sl, 1e-3f, "matmul_multi_conv state");
    float *dv[] = {x, cw, state, y0, y1, tmp};
    for (int i = 0; i < 6; i++) be->ops->free(be, dv[i]);
    float *hp[] = {hx, hw, hs, g0, g1, gs, raw, w0, w1, ws};
    for (int i = 0; i < 10; i++) free(hp[i]);
    free_weight(&t[0]);
    free_weight(&t[1]);
    sl_backend_destroy(be);
}

Test(fused_ops, matmul_multi_conv) {
    matmul_multi_conv_case(96, 128, 4, 1, 1);
    matmul_multi_conv_case(40, 64, 4, 2, 1);  /* fewer tokens than the conv's history */
    matmul_multi_conv_case(64, 64, 4, 12, 1); /* two GPU launches, the state carried between them */
    matmul_multi_conv_case(32, 96, 3, 20, 1); /* a prefill batch */
    matmul_multi_conv_case(16, 32, 1, 3, 1);  /* no history */
    matmul_multi_conv_case(24, 64, 4, 3, 0);
    matmul_multi_conv_case(48, 64, 4, 40, 0); /* a prompt's conv over slices of the tokens */
    matmul_multi_conv_case(40, 32, 4, 17, 0);
}

/* host delta rule, token by token: S <- S exp(g); S <- S + k (beta (v - S^T k))^T; o = S^T q (q, k
 * L2-normalised, q scaled by 1/sqrt(kd)) */
static void ref_deltanet(const sl_deltanet_dims *d, const float *qkv, const float *a, const float *bb,
                         const float *A_log, const float *dt_bias, float *S0, int n, float *out) {
    int kd = d->k_dim, vd = d->v_dim, nk = d->n_k_heads, nv = d->n_v_heads, width = 2 * nk * kd + nv * vd;
    float q[256], k[256], kv[256];
    for (int h = 0; h < nv; h++) {
        int kh = d->tiled ? h % nk : h / (nv / nk);
        float *S = S0 + (size_t)h * (size_t)kd * (size_t)vd;
        for (int t = 0; t < n; t++) {
            const float *row = qkv + (size_t)t * (size_t)width, *v = row + 2 * nk * kd + h * vd;
            float sq = 0, sk = 0;
            for (int i = 0; i < kd; i++) {
                sq += row[kh * kd + i] * row[kh * kd + i];
                sk += row[(nk + kh) * kd + i] * row[(nk + kh) * kd + i];
            }
            for (int i = 0; i < kd; i++) {
                q[i] = row[kh * kd + i] / sqrtf(sq + 1e-6f) / sqrtf((float)kd);
                k[i] = row[(nk + kh) * kd + i] / sqrtf(sk + 1e-6f);
            }
            float x = a[t * nv + h] + dt_bias[h], sp = x > 20.0f ? x : log1pf(expf(x));
            float decay = expf(-expf(A_log[h]) * sp), beta = 1.0f / (1.0f + expf(-bb[t * nv + h]));
            for (int c = 0; c < vd; c++) {
                kv[c] = 0;
                for (int i = 0; i < kd; i++) kv[c] += (S[i * vd + c] *= decay) * k[i];
                kv[c] = beta * (v[c] - kv[c]);
            }
            for (int c = 0; c < vd; c++) {
                float o = 0;
                for (int i = 0; i < kd; i++) o += (S[i * vd + c] += k[i] * kv[c]) * q[i];
                out[(size_t)t * (size_t)(nv * vd) + (size_t)(h * vd + c)] = o;
            }
        }
    }
}

/* the backend's delta rule (on the GPU: the recurrence for one token, the chunked form for more) against
 * the host recurrence, over two calls so that the second starts from the state the first left */
static void deltanet_case(int nk, int nv, int kd, int vd, int tiled, int n1, int n2) {
    sl_backend *be = open_backend();
    sl_deltanet_dims d = {nk, nv, kd, vd, 4, tiled};
    unsigned st = (unsigned)(nk * 5 + nv * 7 + kd + vd * 3 + n1 * 11 + n2 + tiled);
    int width = 2 * nk * kd + nv * vd, n = n1 + n2;
    size_t sl = (size_t)nv * (size_t)kd * (size_t)vd, ol = (size_t)n * (size_t)(nv * vd);
    float *hq, *ha, *hb, *hA, *hdt, *hs;
    float *qkv = dev_rand(be, (size_t)n * (size_t)width, &st, &hq), *a = dev_rand(be, (size_t)(n * nv), &st, &ha);
    float *bb = dev_rand(be, (size_t)(n * nv), &st, &hb), *A_log = dev_rand(be, (size_t)nv, &st, &hA);
    float *dt = dev_rand(be, (size_t)nv, &st, &hdt), *state = dev_rand(be, sl, &st, &hs);
    for (int i = 0; i < n * width; i++) hq[i] *= 4.0f; /* a scale that makes the decays and betas vary */
    for (int i = 0; i < n * nv; i++) ha[i] *= 6.0f;
    for (int i = 0; i < n * nv; i++) hb[i] *= 6.0f;
    be->ops->upload(be, qkv, hq, (size_t)n * (size_t)width * sizeof *hq);
    be->ops->upload(be, a, ha, (size_t)(n * nv) * sizeof *ha);
    be->ops->upload(be, bb, hb, (size_t)(n * nv) * sizeof *hb);
    float *out = be->ops->alloc(be, ol * sizeof *out);
    be->ops->deltanet(be, &d, qkv, a, bb, A_log, dt, state, n1, out);
    /* kernels of a layer's delta rule read the state before waiting on the kernel just before them, which a
     * model never makes another delta-rule step of the same layer: wait here as a model's other ops would */
    free(download(be, out, 1));
    if (n2)
        be->ops->deltanet(be, &d, qkv + (size_t)n1 * (size_t)width, a + n1 * nv, bb + n1 * nv, A_log, dt, state, n2,
                          out + (size_t)n1 * (size_t)(nv * vd));
    float *got = download(be, out, ol), *gs = download(be, state, sl);
    check_ok(be);
    float *want = malloc(ol * sizeof *want);
    ref_deltanet(&d, hq, ha, hb, hA, hdt, hs, n, want);
    expect_close(got, want, ol, 1e-3f, "deltanet outputs");
    expect_close(gs, hs, sl, 1e-3f, "deltanet state");
    float *dv[] = {qkv, a, bb, A_log, dt, state, out};
    for (int i = 0; i < 7; i++) be->ops->free(be, dv[i]);
    float *hp[] = {hq, ha, hb, hA, hdt, hs, got, gs, want};
    for (int i = 0; i < 9; i++) free(hp[i]);
    sl_backend_destroy(be);
}

Test(fused_ops, deltanet) {
    deltanet_case(2, 4, 64, 48, 0, 1, 1);     /* decode steps */
    deltanet_case(2, 4, 64, 48, 1, 5, 1);     /* a short prompt, then a step */
    deltanet_case(1, 2, 128, 128, 0, 70, 33); /* chunks, a partial last one, and a second prompt */
    deltanet_case(2, 2, 32, 40, 1, 32, 31);
    deltanet_case(2, 4, 40, 24, 0, 100, 65); /* key rows past the last full warp, several chunks */
}
