/* Dequantise-and-dot kernels: weights are decoded one row at a time into a per-thread buffer and dotted
 * with every token of the batch, so no dequantised copy of a matrix ever exists. */
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu.h"
#include "backend/ggml_types.h"
#include "core/half.h"

#define ROW_BLOCK 4

__attribute__((target_clones("avx2", "default"))) float cpu_dot(const float *a, const float *b, int n) {
    return cpu_dot_inline(a, b, n);
}

/* Value j of a little-endian bit stream of `bits`-wide values (bits <= 8). */
static inline unsigned get_bits(const uint8_t *p, size_t j, int bits) {
    size_t pos = j * (size_t)bits;
    unsigned sh = (unsigned)(pos & 7);
    unsigned v = p[pos >> 3] >> sh;
    if (sh + (unsigned)bits > 8) v |= (unsigned)p[(pos >> 3) + 1] << (8 - sh);
    return v & ((1u << bits) - 1u);
}

static void mlx_row(const sl_weight *w, int r, float *dst) {
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    int groups = w->cols / w->group;
    size_t sb0 = (size_t)r * (size_t)groups;
    for (int g = 0; g < groups; g++) {
        float s = load_sb(w->sb_fmt, w->scales, sb0 + (size_t)g);
        float b = load_sb(w->sb_fmt, w->biases, sb0 + (size_t)g);
        float *o = dst + (size_t)g * (size_t)w->group;
        size_t j0 = (size_t)g * (size_t)w->group;
        if (w->bits == 4) {
            const uint8_t *q = p + j0 / 2;
            for (int j = 0; j < w->group; j += 2) {
                o[j] = s * (float)(q[j / 2] & 15) + b;
                o[j + 1] = s * (float)(q[j / 2] >> 4) + b;
            }
        } else if (w->bits == 8) {
            const uint8_t *q = p + j0;
            for (int j = 0; j < w->group; j++) o[j] = s * (float)q[j] + b;
        } else {
            for (int j = 0; j < w->group; j++) o[j] = s * (float)get_bits(p, j0 + (size_t)j, w->bits) + b;
        }
    }
}

/* Stored row j of a transposed float weight, elements [r0, r0 + n) (outputs r0..), as float32. */
static void trow(const sl_weight *w, int j, int r0, int n, float *dst) {
    size_t at = (size_t)j * (size_t)w->rows + (size_t)r0;
    if (w->fmt == SL_WF_F32) {
        memcpy(dst, (const float *)w->data + at, (size_t)n * 4);
        return;
    }
    const uint16_t *h = (const uint16_t *)w->data + at;
    if (w->fmt == SL_WF_BF16)
        for (int k = 0; k < n; k++) dst[k] = sl_bf16_to_f32(h[k]);
    else
        for (int k = 0; k < n; k++) dst[k] = sl_f16_to_f32(h[k]);
}

void cpu_row_f32(const sl_weight *w, int r, float *dst) {
    if (w->transposed) { /* a column of the stored matrix */
        for (int j = 0; j < w->cols; j++) trow(w, j, r, 1, dst + j);
        return;
    }
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    switch (w->fmt) {
    case SL_WF_F32: memcpy(dst, p, (size_t)w->cols * 4); break;
    case SL_WF_BF16: {
        const uint16_t *h = (const uint16_t *)p;
        for (int j = 0; j < w->cols; j++) dst[j] = sl_bf16_to_f32(h[j]);
        break;
    }
    case SL_WF_F16: {
        const uint16_t *h = (const uint16_t *)p;
        for (int j = 0; j < w->cols; j++) dst[j] = sl_f16_to_f32(h[j]);
        break;
    }
    case SL_WF_MLX: mlx_row(w, r, dst); break;
    case SL_WF_GGML: sl_ggml_dequant_row(w->gtype, p, dst, w->cols); break;
    case SL_WF_FP8: {
        for (int c0 = 0; c0 < w->cols; c0 += w->group) {
            float s = sl_fp8_scale(w, r, c0);
            int c1 = c0 + w->group < w->cols ? c0 + w->group : w->cols;
            for (int j = c0; j < c1; j++) dst[j] = sl_fp8_e4m3_to_f32(p[j]) * s;
        }
        break;
    }
    case SL_WF_MXFP4: sl_mxfp4_row(w, r, dst); break;
    default: memset(dst, 0, (size_t)w->cols * 4); break;
    }
}

/* Batched (prefill) path: a tile of 4 weight rows x 4 tokens keeps 16 accumulators in registers, so
 * each loaded vector feeds 4 FMAs instead of one; PF_ROWS decoded rows stay in cache while every token
 * of the batch passes over them. */
#define PF_ROWS 16
#define TILE 4

/* out[t][r] = dot(w[r], x[t]) for a 4x4 tile. Missing rows/tokens are passed as duplicates. */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static void tile_avx512(const float *const *w, const float *const *x, int cols,
                                                           float out[TILE][TILE]) {
    __m512 acc[TILE][TILE];
    for (int r = 0; r < TILE; r++)
        for (int t = 0; t < TILE; t++) acc[r][t] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= cols; i += 16) {
        __m512 a[TILE];
        for (int r = 0; r < TILE; r++) a[r] = _mm512_loadu_ps(w[r] + i);
        for (int t = 0; t < TILE; t++) {
            __m512 xv = _mm512_loadu_ps(x[t] + i);
            for (int r = 0; r < TILE; r++) acc[r][t] = _mm512_fmadd_ps(a[r], xv, acc[r][t]);
        }
    }
    if (i < cols) {
        __mmask16 m = (__mmask16)((1u << (cols - i)) - 1u);
        __m512 a[TILE];
        for (int r = 0; r < TILE; r++) a[r] = _mm512_maskz_loadu_ps(m, w[r] + i);
        for (int t = 0; t < TILE; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x[t] + i);
            for (int r = 0; r < TILE; r++) acc[r][t] = _mm512_fmadd_ps(a[r], xv, acc[r][t]);
        }
    }
    for (int r = 0; r < TILE; r++)
        for (int t = 0; t < TILE; t++) out[t][r] = _mm512_reduce_add_ps(acc[r][t]);
}
#endif

static void tile_generic(const float *const *w, const float *const *x, int cols, float out[TILE][TILE]) {
    for (int t = 0; t < TILE; t++)
        for (int r = 0; r < TILE; r++) out[t][r] = cpu_dot(w[r], x[t], cols);
}

typedef void (*tile_fn)(const float *const *w, const float *const *x, int cols, float out[TILE][TILE]);

typedef struct {
    cpu_impl *c;
    const sl_weight *w;
    const float *x;
    int n;
    float *y;
    tile_fn tile; /* batched paths only */
} mm_batch_job;

static void mm_batch_task(void *ctx, int64_t b, int64_t e, int tid) {
    mm_batch_job *j = ctx;
    const sl_weight *w = j->w;
    float *tmp = j->c->scratch[tid];
    size_t cols = (size_t)w->cols, rows = (size_t)w->rows;
    for (int64_t r0 = b; r0 < e; r0 += PF_ROWS) {
        int nr = (int)(e - r0 < PF_ROWS ? e - r0 : PF_ROWS);
        for (int k = 0; k < nr; k++) cpu_row_f32(w, (int)r0 + k, tmp + (size_t)k * cols);
        for (int t0 = 0; t0 < j->n; t0 += TILE) {
            int nt = j->n - t0 < TILE ? j->n - t0 : TILE;
            const float *xp[TILE];
            for (int t = 0; t < TILE; t++) xp[t] = j->x + (size_t)(t0 + (t < nt ? t : 0)) * cols;
            for (int k0 = 0; k0 < nr; k0 += TILE) {
                int nk = nr - k0 < TILE ? nr - k0 : TILE;
                const float *wp[TILE];
                for (int k = 0; k < TILE; k++) wp[k] = tmp + (size_t)(k0 + (k < nk ? k : 0)) * cols;
                float out[TILE][TILE];
                j->tile(wp, xp, w->cols, out);
                for (int t = 0; t < nt; t++) {
                    float *yt = j->y + (size_t)(t0 + t) * rows + (size_t)(r0 + k0);
                    for (int k = 0; k < nk; k++) yt[k] = w->bias ? out[t][k] + w->bias[r0 + k0 + k] : out[t][k];
                }
            }
        }
    }
}

static void mm_task(void *ctx, int64_t b, int64_t e, int tid) {
    mm_batch_job *j = ctx;
    const sl_weight *w = j->w;
    float *tmp = j->c->scratch[tid];
    size_t cols = (size_t)w->cols;
    for (int64_t r0 = b; r0 < e; r0 += ROW_BLOCK) {
        int nr = (int)(e - r0 < ROW_BLOCK ? e - r0 : ROW_BLOCK);
        for (int k = 0; k < nr; k++) cpu_row_f32(w, (int)r0 + k, tmp + (size_t)k * cols);
        for (int t = 0; t < j->n; t++) {
            const float *xt = j->x + (size_t)t * cols;
            float *yt = j->y + (size_t)t * (size_t)w->rows;
            for (int k = 0; k < nr; k++) {
                float v = cpu_dot(tmp + (size_t)k * cols, xt, w->cols);
                yt[r0 + k] = w->bias ? v + w->bias[r0 + k] : v;
            }
        }
    }
}

#if defined(__x86_64__)
/* Large batches: 32 decoded rows are transposed into a panel [cols][32], and a micro-kernel
 * accumulates 12 tokens x 32 rows as outer products (one broadcast of x per 2 FMAs, no horizontal
 * sums), writing finished output rows directly. */
#define PK_ROWS 32
#define PK_TOKENS 12

__attribute__((target("avx512f"))) static void pk_kernel(const float *panel, const float *const *x, int cols,
                                                         __m512 acc[PK_TOKENS][2]) {
    for (int t = 0; t < PK_TOKENS; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int k = 0; k < cols; k++) {
        __m512 p0 = _mm512_loadu_ps(panel + (size_t)k * PK_ROWS);
        __m512 p1 = _mm512_loadu_ps(panel + (size_t)k * PK_ROWS + 16);
#pragma GCC unroll 12
        for (int t = 0; t < PK_TOKENS; t++) {
            __m512 xb = _mm512_set1_ps(x[t][k]);
            acc[t][0] = _mm512_fmadd_ps(p0, xb, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(p1, xb, acc[t][1]);
        }
    }
}

__attribute__((target("avx512f"))) static void mm_packed_task(void *ctx, int64_t b, int64_t e, int tid) {
    mm_batch_job *j = ctx;
    const sl_weight *w = j->w;
    size_t cols = (size_t)w->cols, rows = (size_t)w->rows;
    float *tmp = j->c->scratch[tid], *panel = tmp + cols * PK_ROWS;
    for (int64_t r0 = b; r0 < e; r0 += PK_ROWS) {
        int nr = (int)(e - r0 < PK_ROWS ? e - r0 : PK_ROWS);
        for (int k = 0; k < nr; k++) cpu_row_f32(w, (int)r0 + k, tmp + (size_t)k * cols);
        for (size_t c = 0; c < cols; c++)
            for (int k = 0; k < PK_ROWS; k++)
                panel[c * PK_ROWS + (size_t)k] = k < nr ? tmp[(size_t)k * cols + c] : 0.0f;
        float bias[PK_ROWS] = {0};
        for (int k = 0; k < nr && w->bias; k++) bias[k] = w->bias[r0 + k];
        __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xffffu : (1u << nr) - 1u);
        __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xffffu : nr <= 16 ? 0u : (1u << (nr - 16)) - 1u);
        __m512 b0 = _mm512_loadu_ps(bias), b1 = _mm512_loadu_ps(bias + 16);
        for (int t0 = 0; t0 < j->n; t0 += PK_TOKENS) {
            int nt = j->n - t0 < PK_TOKENS ? j->n - t0 : PK_TOKENS;
            const float *xp[PK_TOKENS];
            for (int t = 0; t < PK_TOKENS; t++) xp[t] = j->x + (size_t)(t0 + (t < nt ? t : 0)) * cols;
            __m512 acc[PK_TOKENS][2];
            pk_kernel(panel, xp, w->cols, acc);
            for (int t = 0; t < nt; t++) {
                float *yt = j->y + (size_t)(t0 + t) * rows + (size_t)r0;
                _mm512_mask_storeu_ps(yt, m0, _mm512_add_ps(acc[t][0], b0));
                _mm512_mask_storeu_ps(yt + 16, m1, _mm512_add_ps(acc[t][1], b1));
            }
        }
    }
}
#endif

/* Transposed weights (inputs-first): a task takes TR_ROWS outputs and walks the stored rows once, each
 * segment widened to float and added into every token's accumulators, so the stored matrix is read in
 * order and each output sums its inputs in order whatever the batch. */
#define TR_ROWS 64

__attribute__((target_clones("avx2", "default"))) static void axpy_rows(float *acc, const float *x, int n, int cols,
                                                                        int j, const float *seg, int nr) {
    for (int t = 0; t < n; t++) {
        float xv = x[(size_t)t * (size_t)cols + (size_t)j], *a = acc + (size_t)t * TR_ROWS;
        for (int k = 0; k < nr; k++) a[k] += xv * seg[k];
    }
}

static void mm_trans_task(void *ctx, int64_t b, int64_t e, int tid) {
    mm_batch_job *j = ctx;
    const sl_weight *w = j->w;
    float *seg = j->c->scratch[tid], *acc = seg + TR_ROWS;
    for (int64_t r0 = b; r0 < e; r0 += TR_ROWS) {
        int nr = (int)(e - r0 < TR_ROWS ? e - r0 : TR_ROWS);
        memset(acc, 0, sizeof *acc * TR_ROWS * (size_t)j->n);
        for (int k = 0; k < w->cols; k++) {
            trow(w, k, (int)r0, nr, seg);
            axpy_rows(acc, j->x, j->n, w->cols, k, seg, nr);
        }
        for (int t = 0; t < j->n; t++)
            for (int k = 0; k < nr; k++)
                j->y[(size_t)t * (size_t)w->rows + (size_t)r0 + (size_t)k] =
                    acc[(size_t)t * TR_ROWS + (size_t)k] + (w->bias ? w->bias[r0 + k] : 0.0f);
    }
}

/* Below this many tokens, GGML weights are multiplied by the fused kernels (each row read once per
 * token from cache); from it on, decoded panels are shared by the tokens. */
#define GGML_FUSED_MAX 4

void cpu_matmul(sl_backend *b, const sl_weight *w, const float *x, int n, float *y) {
    cpu_impl *c = cpu_of(b);
    if (w->transposed) {
        if (cpu_scratch_reserve(c, (size_t)TR_ROWS * ((size_t)n + 1)) != 0) return;
        mm_batch_job j = {c, w, x, n, y, NULL};
        sl_pool_for(c->pool, w->rows, TR_ROWS, mm_trans_task, &j);
        return;
    }
    if (w->fmt == SL_WF_GGML && n < GGML_FUSED_MAX) {
        cpu_ggml_matmul_fused(c, w, x, n, y);
        return;
    }
#if defined(__x86_64__)
    if (n >= PK_TOKENS && c->avx512) {
        if (cpu_scratch_reserve(c, (size_t)w->cols * PK_ROWS * 2) != 0) return;
        mm_batch_job j = {c, w, x, n, y, NULL};
        sl_pool_for(c->pool, w->rows, PK_ROWS, mm_packed_task, &j);
        return;
    }
#endif
    if (n > 1) {
        if (cpu_scratch_reserve(c, (size_t)w->cols * PF_ROWS) != 0) return;
        mm_batch_job j = {c, w, x, n, y, tile_generic};
#if defined(__x86_64__)
        if (c->avx512) j.tile = tile_avx512;
#endif
        sl_pool_for(c->pool, w->rows, PF_ROWS * 2, mm_batch_task, &j);
        return;
    }
    if (cpu_gemv(c, w, x, y) == 0) return;
    if (cpu_scratch_reserve(c, (size_t)w->cols * ROW_BLOCK) != 0) return;
    mm_batch_job j = {c, w, x, n, y, NULL};
    sl_pool_for(c->pool, w->rows, ROW_BLOCK * 4, mm_task, &j);
}

void cpu_embed(sl_backend *b, const sl_weight *w, const int32_t *ids, int n, float *out) {
    (void)b;
    for (int i = 0; i < n; i++) cpu_row_f32(w, ids[i], out + (size_t)i * (size_t)w->cols);
}
