/* The CPU reference backend: the op table, memory, and the element-wise ops. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/ggml_types.h"
#include "core/half.h"

#if defined(__x86_64__)
#include <cpuid.h>
/* F16C from CPUID leaf 1 (ECX bit 29): clang before 16 does not know "f16c" in __builtin_cpu_supports. */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

int cpu_scratch_reserve(cpu_impl *c, size_t floats) {
    for (int t = 0; t < c->n_threads; t++) {
        if (c->scratch_len[t] >= floats) continue;
        float *p = realloc(c->scratch[t], floats * sizeof(float));
        if (!p) {
            if (!c->failed) sl_fail(&c->failure, "out of memory for %zu bytes of CPU scratch", floats * 4);
            c->failed = 1;
            return -1;
        }
        c->scratch[t] = p;
        c->scratch_len[t] = floats;
    }
    return 0;
}

static void *cpu_alloc(sl_backend *b, size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        cpu_impl *c = cpu_of(b);
        if (!c->failed) sl_fail(&c->failure, "out of memory allocating %zu bytes", bytes);
        c->failed = 1;
    }
    return p;
}

static void cpu_free(sl_backend *b, void *p) {
    (void)b;
    free(p);
}

static void cpu_zero(sl_backend *b, void *p, size_t bytes) {
    (void)b;
    memset(p, 0, bytes);
}

static void cpu_copy(sl_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    memmove(dst, src, bytes);
}

static int cpu_check(sl_backend *b, sl_err *e) {
    cpu_impl *c = cpu_of(b);
    if (!c->failed) return 0;
    c->failed = 0;
    return sl_fail(e, "%s", c->failure.msg);
}

static void cpu_rmsnorm(sl_backend *b, const float *x, const float *w, int rows, int dim, float eps, float *y) {
    (void)b;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)dim;
        float *yr = y + (size_t)r * (size_t)dim;
        float ss = 0;
        for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) yr[i] = w ? (xr[i] * inv) * w[i] : xr[i] * inv;
    }
}

static void cpu_rope(sl_backend *b, float *x, int stride, int n_heads, int head_dim, int rot_dim,
                     const sl_batch_map *bm, const float *inv_freq, float attn_factor) {
    (void)b;
    int half = rot_dim / 2;
    for (int i = 0; i < bm->n; i++) {
        float pos = (float)bm->pos[i];
        for (int f = 0; f < half; f++) {
            float ang = pos * inv_freq[f];
            float cs = cosf(ang) * attn_factor, sn = sinf(ang) * attn_factor;
            for (int h = 0; h < n_heads; h++) {
                float *v = x + (size_t)i * (size_t)stride + (size_t)h * (size_t)head_dim;
                float a = v[f], c = v[f + half];
                v[f] = a * cs - c * sn;
                v[f + half] = c * cs + a * sn;
            }
        }
    }
}

static void cpu_copy_rows(sl_backend *b, float *dst, int dst_stride, const float *src, int src_stride, int n,
                          int width) {
    (void)b;
    for (int i = 0; i < n; i++)
        memmove(dst + (size_t)i * (size_t)dst_stride, src + (size_t)i * (size_t)src_stride, (size_t)width * 4);
}

static void cpu_kv_store(sl_backend *b, void *cache, sl_kv_type kt, const sl_batch_map *bm, const float *x, int width) {
    (void)b;
    size_t rb = sl_kv_bytes(kt, (size_t)width);
    for (int i = 0; i < bm->n; i++) {
        char *dst = (char *)cache + (size_t)sl_bm_row(bm, bm->pages, bm->seq[i], bm->pos[i]) * rb;
        const float *src = x + (size_t)i * (size_t)width;
        if (kt == SL_KV_F16) {
            for (int j = 0; j < width; j++) ((uint16_t *)dst)[j] = sl_f32_to_f16(src[j]);
        } else if (kt == SL_KV_BF16) {
            for (int j = 0; j < width; j++) ((uint16_t *)dst)[j] = sl_f32_to_bf16(src[j]);
        } else if (kt == SL_KV_Q8_0) {
            sl_ggml_quant_q8_0_row(src, dst, width);
        } else {
            memmove(dst, src, (size_t)width * sizeof(float));
        }
    }
}

static void cpu_add(sl_backend *b, float *y, const float *x, size_t len) {
    (void)b;
    for (size_t i = 0; i < len; i++) y[i] += x[i];
}

static inline float sigmoidf(float v) {
    return 1.0f / (1.0f + expf(-v));
}

static void cpu_swiglu(sl_backend *b, const float *g, const float *u, size_t len, float *out) {
    (void)b;
    for (size_t i = 0; i < len; i++) out[i] = g[i] * sigmoidf(g[i]) * u[i];
}

static void cpu_mul_sigmoid(sl_backend *b, float *x, const float *g, size_t len) {
    (void)b;
    for (size_t i = 0; i < len; i++) x[i] *= sigmoidf(g[i]);
}

static void cpu_scale_rows_sigmoid(sl_backend *b, float *x, const float *s, int rows, int dim) {
    (void)b;
    for (int r = 0; r < rows; r++) {
        float k = sigmoidf(s[r]);
        for (int i = 0; i < dim; i++) x[(size_t)r * (size_t)dim + (size_t)i] *= k;
    }
}

static void cpu_argmax(sl_backend *b, const float *x, int rows, int n, int32_t *out) {
    (void)b;
    for (int r = 0; r < rows; r++) {
        const float *v = x + (size_t)r * (size_t)n;
        int32_t best = -1;
        float bv = -INFINITY;
        for (int i = 0; i < n; i++)
            if (v[i] > bv) { /* NaN fails the comparison */
                bv = v[i];
                best = i;
            }
        out[r] = best;
    }
}

/* The fused ops: the same arithmetic as the plain sequences they replace. */
static void cpu_add_rmsnorm(sl_backend *b, float *x, const float *d, const float *w, int rows, int dim, float eps,
                            float *y) {
    cpu_add(b, x, d, (size_t)rows * (size_t)dim);
    cpu_rmsnorm(b, x, w, rows, dim, eps, y);
}

static void cpu_matmul_multi(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n, float *const *y) {
    for (int i = 0; i < nw; i++) cpu_matmul(b, w[i], x, n, y[i]);
}

/* The fused ops' intermediate values: `floats` of c->act. */
static float *act_buf(cpu_impl *c, size_t floats) {
    if (c->act_len < floats) {
        float *p = realloc(c->act, floats * sizeof *p);
        if (!p) {
            if (!c->failed) sl_fail(&c->failure, "out of memory for %zu bytes of CPU scratch", floats * sizeof *p);
            c->failed = 1;
            return NULL;
        }
        c->act = p;
        c->act_len = floats;
    }
    return c->act;
}

static void cpu_matmul_multi_conv(sl_backend *b, int nw, const sl_weight *const *w, const float *x, int n,
                                  float *const *y, const float *conv_w, int kernel, float *state) {
    if (nw < 1) return;
    float *raw = act_buf(cpu_of(b), (size_t)n * (size_t)w[0]->rows);
    if (!raw) return;
    cpu_matmul(b, w[0], x, n, raw);
    for (int i = 1; i < nw; i++) cpu_matmul(b, w[i], x, n, y[i]);
    cpu_conv1d_silu(b, raw, n, w[0]->rows, conv_w, kernel, state, y[0]);
}

static void cpu_swiglu_matmul(sl_backend *b, const sl_weight *w, const float *g, const float *u, int n,
                              const float *gate, float *y) {
    size_t len = (size_t)n * (size_t)w->cols, out = (size_t)n * (size_t)w->rows;
    float *a = act_buf(cpu_of(b), len + (gate ? out : 0));
    if (!a) return;
    cpu_swiglu(b, g, u, len, a);
    if (!gate) {
        cpu_matmul(b, w, a, n, y);
        return;
    }
    float *p = a + len;
    cpu_matmul(b, w, a, n, p);
    cpu_scale_rows_sigmoid(b, p, gate, n, w->rows);
    cpu_add(b, y, p, out);
}

static void cpu_moe_shared(sl_backend *b, const sl_expert_table *t, const float *logits, int n_experts, int k,
                           int renorm, int32_t *ids, float *weights, const float *x, int n, int hidden,
                           const sl_weight *sh_down, const float *g, const float *u, const float *gate, float *out) {
    cpu_route(b, logits, n, n_experts, k, renorm, ids, weights);
    cpu_moe(b, t, x, n, hidden, ids, weights, k, out);
    cpu_swiglu_matmul(b, sh_down, g, u, n, gate, out);
}

static void cpu_moe_combine_shared(sl_backend *b, const sl_expert_table *t, const float *weights, int n, int k,
                                   int hidden, const sl_weight *sh_down, const float *g, const float *u,
                                   const float *gate, float *out) {
    (void)t;
    cpu_moe_combine(b, weights, n, k, hidden, out);
    cpu_swiglu_matmul(b, sh_down, g, u, n, gate, out);
}

static void cpu_sigmoid_matmul(sl_backend *b, const sl_weight *w, const float *x, const float *g, int n, float *y) {
    size_t len = (size_t)n * (size_t)w->cols;
    float *a = act_buf(cpu_of(b), len);
    if (!a) return;
    memcpy(a, x, len * sizeof *a);
    cpu_mul_sigmoid(b, a, g, len);
    cpu_matmul(b, w, a, n, y);
}

static void cpu_qk_rope_store(sl_backend *b, float *q, float *k, const float *v, const sl_batch_map *bm, int n_heads,
                              int n_kv, int head_dim, const float *q_norm, const float *k_norm, float eps, int rot_dim,
                              const float *inv_freq, float attn_factor, void *kc, void *vc, sl_kv_type kt,
                              const float *qg, float *gate) {
    int qw = n_heads * head_dim, kw = n_kv * head_dim, n = bm->n;
    if (qg) {
        cpu_copy_rows(b, q, head_dim, qg, 2 * head_dim, n * n_heads, head_dim);
        cpu_copy_rows(b, gate, head_dim, qg + head_dim, 2 * head_dim, n * n_heads, head_dim);
    }
    if (q_norm) cpu_rmsnorm(b, q, q_norm, n * n_heads, head_dim, eps, q);
    if (k_norm) cpu_rmsnorm(b, k, k_norm, n * n_kv, head_dim, eps, k);
    cpu_rope(b, q, qw, n_heads, head_dim, rot_dim, bm, inv_freq, attn_factor);
    cpu_rope(b, k, kw, n_kv, head_dim, rot_dim, bm, inv_freq, attn_factor);
    cpu_kv_store(b, kc, kt, bm, k, kw);
    cpu_kv_store(b, vc, kt, bm, v, kw);
}

static void cpu_gated_rmsnorm_matmul(sl_backend *b, const sl_weight *w, float *x, const float *z, const float *nw,
                                     int dim, float eps, int n, float *y) {
    cpu_gated_rmsnorm(b, x, z, nw, n * (w->cols / dim), dim, eps);
    cpu_matmul(b, w, x, n, y);
}

/* Host images and copies for an expert store that fills slots from a host tier (staged mode): the CPU's
 * copies run at once, so sync only reports failures, as check does. */
static void *cpu_host_alloc(sl_backend *b, size_t bytes) {
    (void)b;
    return aligned_alloc(4096, (bytes + 4095) / 4096 * 4096); /* O_DIRECT reads land in them */
}

static void cpu_host_free(sl_backend *b, void *p) {
    (void)b;
    free(p);
}

static void cpu_upload_async(sl_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    memcpy(dst, src, bytes);
}

static const sl_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .upload = cpu_copy,
    .download = cpu_copy,
    .argmax = cpu_argmax,
    .check = cpu_check,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .copy_rows = cpu_copy_rows,
    .attention = cpu_attention,
    .add = cpu_add,
    .swiglu = cpu_swiglu,
    .mul_sigmoid = cpu_mul_sigmoid,
    .scale_rows_sigmoid = cpu_scale_rows_sigmoid,
    .route = cpu_route,
    .route_grouped = cpu_route_grouped,
    .moe = cpu_moe,
    .moe_pairs = cpu_moe_pairs,
    .moe_combine = cpu_moe_combine,
    .moe_guard = cpu_moe_guard,
    .moe_handoff = cpu_moe_handoff,
    .moe_await = cpu_moe_await,
    .moe_pairs_put = cpu_moe_pairs_put,
    .moe_pairs_get = cpu_moe_pairs_get,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .upload_async = cpu_upload_async,
    .sync = cpu_check,
    .conv1d_silu = cpu_conv1d_silu,
    .deltanet = cpu_deltanet,
    .gated_rmsnorm = cpu_gated_rmsnorm,
    .kv_store = cpu_kv_store,
    .mla_rope_store = cpu_mla_rope_store,
    .mla_attention = cpu_mla_attention,
    .add_rmsnorm = cpu_add_rmsnorm,
    .matmul_multi = cpu_matmul_multi,
    .matmul_multi_conv = cpu_matmul_multi_conv,
    .swiglu_matmul = cpu_swiglu_matmul,
    .sigmoid_matmul = cpu_sigmoid_matmul,
    .moe_shared = cpu_moe_shared,
    .moe_combine_shared = cpu_moe_combine_shared,
    .qk_rope_store = cpu_qk_rope_store,
    .gated_rmsnorm_matmul = cpu_gated_rmsnorm_matmul,
    .mem_bandwidth = cpu_mem_bandwidth,
    .peak_flops = cpu_peak_flops,
};

static void cpu_destroy(sl_backend *b) {
    cpu_impl *c = cpu_of(b);
    for (int t = 0; t < c->n_threads; t++) free(c->scratch[t]);
    free(c->scratch);
    free(c->scratch_len);
    free(c->moe_buf);
    free(c->pairs);
    free(c->act);
    free(c->xprep);
    sl_pool_destroy(c->pool);
    free(c);
    free(b);
}

int sl_cpu_backend_create(int threads, sl_backend **out, sl_err *e) {
    sl_backend *b = calloc(1, sizeof *b);
    cpu_impl *c = calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return sl_fail(e, "out of memory");
    }
    c->pool = sl_pool_create(threads);
    if (!c->pool) {
        free(b);
        free(c);
        return sl_fail(e, "cannot start worker threads");
    }
    c->n_threads = sl_pool_size(c->pool);
    const char *isa = getenv("SLUICE_CPU_ISA");
#if defined(__x86_64__)
    c->avx512 = __builtin_cpu_supports("avx512f") && !(isa && (!strcmp(isa, "generic") || !strcmp(isa, "avx2")));
    c->avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c() &&
              !(isa && !strcmp(isa, "generic"));
#else
    (void)isa;
#endif
    c->scratch = calloc((size_t)c->n_threads, sizeof *c->scratch);
    c->scratch_len = calloc((size_t)c->n_threads, sizeof *c->scratch_len);
    b->ops = &cpu_ops;
    b->impl = c;
    b->destroy = cpu_destroy;
    if (!c->scratch || !c->scratch_len) {
        cpu_destroy(b);
        return sl_fail(e, "out of memory");
    }
    *out = b;
    return 0;
}

void sl_backend_destroy(sl_backend *b) {
    if (b) b->destroy(b);
}
