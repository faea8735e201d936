/* The KV cache of each element type on the backend SLUICE_BACKEND picks (the CPU without a GPU): kv_store
 * rounds to nearest even (bit for bit what the host's conversions give; q8_0 as GGML's reference quantizer),
 * and attention reads back what was stored, widened: a lone position returns its value row exactly (CPU),
 * and a prompt run and a decode token match host attention over the rounded keys and values. q8_0 caches
 * are the CPU backend's only. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/ggml_types.h"
#include "core/half.h"
#include "testutil.h"

static float widen(const unsigned char *raw, sl_kv_type kt, size_t i) {
    uint16_t u;
    float f;
    if (kt == SL_KV_Q8_0) { /* whole rows of whole blocks: value i is in block i / 32 */
        const unsigned char *b = raw + i / 32 * 34;
        memcpy(&u, b, 2);
        return sl_f16_to_f32(u) * (float)(int8_t)b[2 + i % 32];
    }
    if (kt == SL_KV_F32) {
        memcpy(&f, raw + i * 4, 4);
        return f;
    }
    memcpy(&u, raw + i * 2, 2);
    return kt == SL_KV_F16 ? sl_f16_to_f32(u) : sl_bf16_to_f32(u);
}

/* row[0..n) as the cache of type kt keeps it, widened */
static void round_row(const float *row, size_t n, sl_kv_type kt, float *out) {
    if (kt == SL_KV_Q8_0) {
        unsigned char *q = malloc(n / 32 * 34);
        sl_ggml_quant_q8_0_row(row, q, (int64_t)n);
        sl_ggml_dequant_row(SL_GGML_Q8_0, q, out, (int64_t)n);
        free(q);
        return;
    }
    for (size_t j = 0; j < n; j++)
        out[j] = kt == SL_KV_F16    ? sl_f16_to_f32(sl_f32_to_f16(row[j]))
                 : kt == SL_KV_BF16 ? sl_bf16_to_f32(sl_f32_to_bf16(row[j]))
                                    : row[j];
}

/* Host attention of query q (one head of hd) at position p over widened cache rows kc/vc (row r of head kvh
 * at (r * n_kv + kvh) * hd); sink: one more score with no value (NAN: none). */
static void ref_attention(const float *q, const float *kc, const float *vc, const int32_t *pages, int P, int p,
                          int n_kv, int kvh, int hd, float scale, float sink, float *out) {
    double *s = malloc((size_t)(p + 1) * sizeof *s), mx = isnan(sink) ? -INFINITY : sink, sum = 0;
    for (int t = 0; t <= p; t++) {
        size_t r = (size_t)pages[t / P] * (size_t)P + (size_t)(t % P);
        const float *k = kc + (r * (size_t)n_kv + (size_t)kvh) * (size_t)hd;
        double d = 0;
        for (int j = 0; j < hd; j++) d += (double)q[j] * k[j];
        s[t] = d * scale;
        mx = s[t] > mx ? s[t] : mx;
    }
    for (int t = 0; t <= p; t++) sum += (s[t] = exp(s[t] - mx));
    if (!isnan(sink)) sum += exp(sink - mx);
    for (int j = 0; j < hd; j++) {
        double o = 0;
        for (int t = 0; t <= p; t++) {
            size_t r = (size_t)pages[t / P] * (size_t)P + (size_t)(t % P);
            o += s[t] / sum * vc[(r * (size_t)n_kv + (size_t)kvh) * (size_t)hd + (size_t)j];
        }
        out[j] = (float)o;
    }
    free(s);
}

/* n prompt tokens stored and attended as one run, then one decode token at position n; nh query heads
 * over nkv KV heads, with a sink score per head when sinks */
static void round_trip_sinks(sl_kv_type kt, int hd, int n, int nh, int nkv, int sinks) {
    sl_backend *be;
    sl_err e = {{0}};
    char note[256];
    cr_assert_eq(sl_backend_open(NULL, 2, &be, note, sizeof note, &e), 0, "%s", e.msg);
    const int P = 8, np = (n + 1 + P - 1) / P + 1;
    size_t kw = (size_t)nkv * (size_t)hd, qw = (size_t)nh * (size_t)hd;
    size_t clen = (size_t)np * (size_t)P * kw, cb = sl_kv_bytes(kt, clen);
    unsigned st = (unsigned)(hd * 7 + n + kt);
    float *hk = malloc((size_t)(n + 1) * kw * 4), *hv = malloc((size_t)(n + 1) * kw * 4),
          *hq = malloc((size_t)(n + 1) * qw * 4);
    for (size_t i = 0; i < (size_t)(n + 1) * kw; i++) hk[i] = 4.0f * tu_frand(&st), hv[i] = 4.0f * tu_frand(&st);
    for (size_t i = 0; i < (size_t)(n + 1) * qw; i++) hq[i] = 4.0f * tu_frand(&st);
    float *k = be->ops->alloc(be, (size_t)(n + 1) * kw * 4), *v = be->ops->alloc(be, (size_t)(n + 1) * kw * 4),
          *q = be->ops->alloc(be, (size_t)(n + 1) * qw * 4), *out = be->ops->alloc(be, (size_t)(n + 1) * qw * 4);
    void *kc = be->ops->alloc(be, cb), *vc = be->ops->alloc(be, cb);
    be->ops->upload(be, k, hk, (size_t)(n + 1) * kw * 4);
    be->ops->upload(be, v, hv, (size_t)(n + 1) * kw * 4);
    be->ops->upload(be, q, hq, (size_t)(n + 1) * qw * 4);
    int32_t *hpos = malloc((size_t)(n + 1) * sizeof *hpos), *hseq = malloc((size_t)(n + 1) * sizeof *hseq),
            *hpages = malloc((size_t)np * sizeof *hpages);
    float scale = 1.0f / sqrtf((float)hd), hs[64];
    float *ds = NULL;
    cr_assert(nh <= 64, "at most 64 query heads: %d", nh);
    for (int h = 0; h < nh; h++) hs[h] = sinks ? 16.0f + 4.0f * tu_frand(&st) : NAN; /* near the largest scores */
    if (sinks) {
        ds = be->ops->alloc(be, (size_t)nh * 4);
        be->ops->upload(be, ds, hs, (size_t)nh * 4);
    }

    /* the prompt run: stored, then attended */
    tu_map m;
    tu_map_make(&m, be, n, 0, hpos, hseq, hpages, np, P);
    be->ops->kv_store(be, kc, kt, &m.bm, k, (int)kw);
    be->ops->kv_store(be, vc, kt, &m.bm, v, (int)kw);
    be->ops->attention(be, q, kc, vc, kt, &m.bm, nh, nkv, hd, 0, scale, ds, out);
    float *got = malloc((size_t)(n + 1) * qw * 4);
    be->ops->download(be, got, out, (size_t)n * qw * 4);
    tu_map_free(&m);
    /* the decode token at position n, alone in its sequence */
    tu_map_make(&m, be, 1, n, hpos, hseq, hpages, np, P);
    be->ops->kv_store(be, kc, kt, &m.bm, k + (size_t)n * kw, (int)kw);
    be->ops->kv_store(be, vc, kt, &m.bm, v + (size_t)n * kw, (int)kw);
    be->ops->attention(be, q + (size_t)n * qw, kc, vc, kt, &m.bm, nh, nkv, hd, 0, scale, ds, out + (size_t)n * qw);
    be->ops->download(be, got + (size_t)n * qw, out + (size_t)n * qw, qw * 4);
    tu_map_free(&m);
    unsigned char *rk = malloc(cb), *rv = malloc(cb);
    be->ops->download(be, rk, kc, cb);
    be->ops->download(be, rv, vc, cb);
    cr_assert_eq(be->ops->check(be, &e), 0, "%s", e.msg);

    /* every stored element is the input rounded to nearest even (q8_0: as the reference quantizer) */
    float *wk = calloc(clen, 4), *wv = calloc(clen, 4), *ek = malloc(kw * 4), *ev = malloc(kw * 4);
    for (int t = 0; t <= n; t++) {
        size_t r = (size_t)hpages[t / P] * (size_t)P + (size_t)(t % P);
        round_row(hk + (size_t)t * kw, kw, kt, ek);
        round_row(hv + (size_t)t * kw, kw, kt, ev);
        for (size_t j = 0; j < kw; j++) {
            float gk = widen(rk, kt, r * kw + j), gv = widen(rv, kt, r * kw + j);
            cr_assert_eq(gk, ek[j], "%s: k at position %d element %zu", sl_kv_type_name(kt), t, j);
            cr_assert_eq(gv, ev[j], "%s: v at position %d element %zu", sl_kv_type_name(kt), t, j);
            wk[r * kw + j] = gk;
            wv[r * kw + j] = gv;
        }
    }
    /* position 0 sees only itself: its output is its value row as stored, exactly (on the CPU; the GPU's
     * tensor-core kernel rounds values to fp16 on the way) */
    for (int h = 0; h < nh && !tu_on_gpu() && !sinks; h++)
        for (int j = 0; j < hd; j++) {
            size_t r0 = (size_t)hpages[0] * (size_t)P;
            cr_assert_eq(got[(size_t)h * (size_t)hd + (size_t)j], wv[r0 * kw + (size_t)(h / (nh / nkv)) * hd + j],
                         "%s: position 0 head %d element %d", sl_kv_type_name(kt), h, j);
        }
    /* every query against host attention over the stored (rounded) keys and values; GPU prompt runs
     * compute in fp16 on tensor cores */
    float tol = tu_on_gpu() ? 5e-3f : 1e-5f, want[256];
    for (int t = 0; t <= n; t++)
        for (int h = 0; h < nh; h++) {
            if (n > 64 && t < n - 8 && t % 37) continue; /* long runs: a sample of the prompt, all of decode */
            ref_attention(hq + (size_t)t * qw + (size_t)h * hd, wk, wv, hpages, P, t, nkv, h / (nh / nkv), hd, scale,
                          hs[h], want);
            for (int j = 0; j < hd; j++) {
                float g = got[(size_t)t * qw + (size_t)h * hd + (size_t)j];
                cr_expect(fabsf(g - want[j]) <= tol * (1 + fabsf(want[j])),
                          "%s: position %d head %d element %d: %g, want %g", sl_kv_type_name(kt), t, h, j, g, want[j]);
            }
        }
    void *dv[] = {k, v, q, out, kc, vc, ds};
    for (int i = 0; i < 7; i++)
        if (dv[i]) be->ops->free(be, dv[i]);
    void *hp[] = {hk, hv, hq, got, rk, rv, wk, wv, ek, ev, hpos, hseq, hpages};
    for (int i = 0; i < 13; i++) free(hp[i]);
    sl_backend_destroy(be);
}

static void round_trip_heads(sl_kv_type kt, int hd, int n, int nh, int nkv) {
    round_trip_sinks(kt, hd, n, nh, nkv, 0);
}

static void round_trip(sl_kv_type kt, int hd, int n) {
    round_trip_heads(kt, hd, n, 4, 2);
}

Test(kv_cache, round_trip) {
    for (sl_kv_type kt = SL_KV_F32; kt <= SL_KV_Q8_0; kt++) {
        round_trip(kt, 64, 20);  /* a prompt run of 16 or more: the tensor-core kernel on CUDA */
        round_trip(kt, 128, 5);  /* a short run: the fp32 prompt kernel */
        round_trip(kt, 256, 17); /* the largest head the kernels take */
        round_trip(kt, 32, 3);
    }
}

/* Decode over longer caches, where the GPU splits each token's cache in slices and a group's query heads
 * in chunks (groups of 1 to 16 heads, some not a power of two) */
Test(kv_cache, long_decode) {
    for (sl_kv_type kt = SL_KV_F32; kt <= SL_KV_Q8_0; kt++) {
        round_trip_heads(kt, 128, 700, 32, 8);
        round_trip_heads(kt, 128, 300, 16, 2);
        round_trip_heads(kt, 64, 400, 12, 2);
        round_trip_heads(kt, 256, 260, 16, 1);
        round_trip_heads(kt, 32, 150, 3, 3);
        round_trip_heads(kt, 64, 90, 20, 2);
    }
}

/* Prompts of a thousand keys or more over few heads, whose blocks the GPU splits the keys between (the parts
 * merged after), with and without sinks */
Test(kv_cache, long_prompt) {
    for (sl_kv_type kt = SL_KV_F32; kt <= SL_KV_Q8_0; kt++) {
        round_trip_sinks(kt, 128, 1100, 4, 2, 0);
        round_trip_sinks(kt, 64, 1500, 4, 1, 1);
        round_trip_sinks(kt, 256, 1030, 2, 1, 1); /* heads of 256 (Qwen3.5's attention): queries staged apart */
    }
}

Test(kv_cache, names) {
    sl_kv_type t;
    cr_assert_eq(sl_kv_type_parse("f16", &t), 0);
    cr_assert_eq(t, SL_KV_F16);
    cr_assert_eq(sl_kv_type_parse("bf16", &t), 0);
    cr_assert_eq(t, SL_KV_BF16);
    cr_assert_eq(sl_kv_type_parse("f32", &t), 0);
    cr_assert_eq(t, SL_KV_F32);
    cr_assert_eq(sl_kv_type_parse("fp16", &t), -1);
    cr_assert_eq(sl_kv_type_parse("auto", &t), -1);
    cr_assert_eq(sl_kv_type_parse("q8_0", &t), 0);
    cr_assert_eq(t, SL_KV_Q8_0);
    cr_assert_eq(sl_kv_type_parse("q8", &t), -1);
    cr_assert_str_eq(sl_kv_type_name(SL_KV_BF16), "bf16");
    cr_assert_str_eq(sl_kv_type_name(SL_KV_Q8_0), "q8_0");
    cr_assert_eq(sl_kv_bytes(SL_KV_F16, 64), 128);
    cr_assert_eq(sl_kv_bytes(SL_KV_F32, 64), 256);
    cr_assert_eq(sl_kv_bytes(SL_KV_Q8_0, 64), 68);
    /* the CPU reference keeps float32 unless told otherwise */
    sl_backend *be;
    sl_err e = {{0}};
    cr_assert_eq(sl_cpu_backend_create(1, &be, &e), 0, "%s", e.msg);
    cr_assert_eq(sl_kv_type_resolve(be, SL_KV_AUTO), SL_KV_F32);
    cr_assert_eq(sl_kv_type_resolve(be, SL_KV_BF16), SL_KV_BF16);
    sl_backend_destroy(be);
}
