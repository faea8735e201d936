#include "models/loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ggml_types.h"
#include "core/half.h"

static int starts(const char *s, const char *p) {
    return strncmp(s, p, strlen(p)) == 0;
}

/* Parts of multimodal and multi-token-prediction checkpoints that a text decoder does not use. */
static const char *const ignored_prefixes[] = {
    "model.visual.",
    "visual.",
    "vision_tower.",
    "model.vision_tower.",
    "mtp.",
    "model.mtp.",
    "multi_modal_projector.",
    "model.multi_modal_projector.",
    "language_model.model.visual.",
};

/* Mixtral's MoE keys, "model.layers.N.block_sparse_moe.{gate, experts.E.w1|w3|w2}", as the
 * "mlp.{gate, experts.E.gate_proj|up_proj|down_proj}" that the MoE loader reads (MLX's
 * block_sparse_moe.switch_mlp.* become mlp.switch_mlp.*). Consumes s; NULL when out of memory. */
static char *mixtral_moe_name(char *s) {
    static const char part[] = ".block_sparse_moe.";
    char *b = strstr(s, part);
    if (!b) return s;
    const char *rest = b + strlen(part);
    int x, w, used = 0;
    char mid[64];
    if (sscanf(rest, "experts.%d.w%d%n", &x, &w, &used) == 2 && used > 0 && x >= 0 && w >= 1 && w <= 3) {
        static const char *const proj[] = {"gate_proj", "down_proj", "up_proj"}; /* w1, w2, w3 */
        snprintf(mid, sizeof mid, "experts.%d.%s", x, proj[w - 1]);
        rest += used;
    } else {
        mid[0] = 0;
    }
    size_t n = (size_t)(b - s) + strlen(".mlp.") + strlen(mid) + strlen(rest) + 1;
    char *r = malloc(n);
    if (r) snprintf(r, n, "%.*s.mlp.%s%s", (int)(b - s), s, mid, rest);
    free(s);
    return r;
}

static char *normalise(const char *raw) {
    for (size_t i = 0; i < sizeof ignored_prefixes / sizeof ignored_prefixes[0]; i++)
        if (starts(raw, ignored_prefixes[i])) return NULL;
    static const struct {
        const char *from, *to;
    } maps[] = {
        {"model.language_model.", "model."},
        {"language_model.model.", "model."},
        {"language_model.lm_head.", "lm_head."},
    };
    for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++) {
        if (!starts(raw, maps[i].from)) continue;
        size_t a = strlen(maps[i].to), b = strlen(raw + strlen(maps[i].from));
        char *s = malloc(a + b + 1);
        if (!s) return NULL;
        memcpy(s, maps[i].to, a);
        memcpy(s + a, raw + strlen(maps[i].from), b + 1);
        return mixtral_moe_name(s);
    }
    char *s = strdup(raw);
    return s ? mixtral_moe_name(s) : NULL;
}

/* DeepSeek-V3 and GLM-4.5 checkpoints store their multi-token-prediction layers as model.layers.N with N
 * past num_hidden_layers; a decoder does not use them. */
static int mtp_layer(const sl_config *c, const char *name) {
    int l, used = 0;
    return c->n_nextn > 0 && sscanf(name, "model.layers.%d.%n", &l, &used) == 1 && used > 0 && l >= c->n_layers;
}

static int cmp_norm(const void *a, const void *b, void *ctx) {
    char **names = ctx;
    return strcmp(names[*(const int *)a], names[*(const int *)b]);
}

int sl_loader_init(sl_loader *l, sl_model *m, sl_err *e) {
    memset(l, 0, sizeof *l);
    l->m = m;
    int n = m->st->n_tensors;
    l->norm_names = calloc((size_t)n + 1, sizeof *l->norm_names);
    l->order = calloc((size_t)n + 1, sizeof *l->order);
    l->used = calloc((size_t)n + 1, 1);
    if (!l->norm_names || !l->order || !l->used) return sl_fail(e, "out of memory");
    for (int i = 0; i < n; i++) {
        l->norm_names[i] = normalise(m->st->tensors[i].name);
        if (l->norm_names[i] && mtp_layer(&m->cfg, l->norm_names[i])) {
            free(l->norm_names[i]);
            l->norm_names[i] = NULL;
        }
        if (l->norm_names[i]) l->order[l->n++] = i;
    }
    qsort_r(l->order, (size_t)l->n, sizeof *l->order, cmp_norm, l->norm_names);
    for (int i = 1; i < l->n; i++)
        if (!strcmp(l->norm_names[l->order[i]], l->norm_names[l->order[i - 1]]))
            return sl_fail(e, "%s: tensors '%s' and '%s' are the same weight under two key layouts", m->path,
                           m->st->tensors[l->order[i - 1]].name, m->st->tensors[l->order[i]].name);
    return 0;
}

void sl_loader_free(sl_loader *l) {
    if (l->norm_names && l->m)
        for (int i = 0; i < l->m->st->n_tensors; i++) free(l->norm_names[i]);
    free(l->norm_names);
    free(l->order);
    free(l->used);
    memset(l, 0, sizeof *l);
}

static int find_index(sl_loader *l, const char *name) {
    int lo = 0, hi = l->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(l->norm_names[l->order[mid]], name);
        if (c == 0) return l->order[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

const sl_st_tensor *sl_ld_find(sl_loader *l, const char *name) {
    int i = find_index(l, name);
    if (i < 0) return NULL;
    l->used[i] = 1;
    return &l->m->st->tensors[i];
}

int sl_ld_has(sl_loader *l, const char *name) {
    return find_index(l, name) >= 0;
}

static const char *file_of(sl_loader *l, const sl_st_tensor *t) {
    return l->m->st->paths[t->file];
}

static void shape_str(const sl_st_tensor *t, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* "Q4_K" for GGML block types, else the safetensors dtype name. */
static const char *dtype_name(const sl_st_tensor *t) {
    const char *n = t->dtype == SL_ST_GGML ? sl_ggml_type_name(t->gtype) : NULL;
    return n ? n : sl_st_dtype_name(t->dtype);
}

static int model_own(sl_model *m, void *p) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **np = realloc(m->owned, sizeof *np * (size_t)cap);
        if (!np) return -1;
        m->owned = np;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return 0;
}

static int to_wfmt(sl_st_dtype d, sl_wfmt *f) {
    switch (d) {
    case SL_ST_F32: *f = SL_WF_F32; return 0;
    case SL_ST_F16: *f = SL_WF_F16; return 0;
    case SL_ST_BF16: *f = SL_WF_BF16; return 0;
    default: return -1;
    }
}

static float elem_f32(const sl_st_tensor *t, int64_t i) {
    uint16_t h;
    float f;
    switch (t->dtype) {
    case SL_ST_F32: memcpy(&f, t->data + 4 * i, 4); return f;
    case SL_ST_BF16: memcpy(&h, t->data + 2 * i, 2); return sl_bf16_to_f32(h);
    case SL_ST_F16: memcpy(&h, t->data + 2 * i, 2); return sl_f16_to_f32(h);
    default: return 0;
    }
}

int sl_ld_vector(sl_loader *l, const char *name, int64_t len, float add, float **out, sl_err *e) {
    const sl_st_tensor *t = sl_ld_find(l, name);
    if (!t) return sl_fail(e, "%s: missing tensor '%s' (expected %lld float values)", l->m->path, name, (long long)len);
    int ggml = t->dtype == SL_ST_GGML && sl_ggml_supported(t->gtype);
    if (t->dtype != SL_ST_F32 && t->dtype != SL_ST_F16 && t->dtype != SL_ST_BF16 && !ggml)
        return sl_fail(e, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", file_of(l, t), t->name,
                       dtype_name(t));
    if (sl_st_numel(t) != len) {
        char s[96];
        shape_str(t, s, sizeof s);
        return sl_fail(e, "%s: tensor '%s' has shape %s, expected %lld elements", file_of(l, t), t->name, s,
                       (long long)len);
    }
    float *v = malloc(sizeof *v * (size_t)(len ? len : 1));
    if (!v || model_own(l->m, v)) {
        free(v);
        return sl_fail(e, "out of memory");
    }
    if (ggml) { /* a small quantised vector: dequantised row by row */
        int64_t cols = t->shape[t->ndim - 1];
        size_t rb = sl_ggml_row_bytes(t->gtype, cols);
        for (int64_t r = 0; r < len / cols; r++)
            sl_ggml_dequant_row(t->gtype, t->data + (size_t)r * rb, v + r * cols, cols);
        for (int64_t i = 0; i < len; i++) v[i] += add;
    } else {
        for (int64_t i = 0; i < len; i++) v[i] = elem_f32(t, i) + add;
    }
    l->m->n_params += (uint64_t)len;
    *out = v;
    return 0;
}

/* Weight bytes must be aligned for their element type; a rare unaligned checkpoint gets an owned copy. */
static const uint8_t *aligned_data(sl_loader *l, const uint8_t *p, size_t bytes, size_t align) {
    if (((uintptr_t)p % align) == 0) return p;
    uint8_t *c = aligned_alloc(16, (bytes + 15) & ~(size_t)15);
    if (!c || model_own(l->m, c)) {
        free(c);
        return NULL;
    }
    memcpy(c, p, bytes);
    return c;
}

static char *cat(char *buf, size_t n, const char *a, const char *b) {
    snprintf(buf, n, "%s%s", a, b);
    return buf;
}

/* A float8 e4m3 matrix (stack) t with its float32 `module.weight_scale_inv` of one scale per tile (the
 * tile shape from quantization_config.weight_block_size, 128 x 128 when absent). Slices of a stack must
 * start on a tile row. */
static int fill_fp8(sl_loader *l, const char *module, const sl_st_tensor *t, int stacked, int n_experts, int rows_total,
                    int64_t first_row, sl_weight *w, sl_err *e) {
    char nb[512], s[96];
    const sl_config *c = &l->m->cfg;
    int br = c->fp8_block_rows > 0 ? c->fp8_block_rows : 128, bc = c->fp8_block_cols > 0 ? c->fp8_block_cols : 128;
    int nd = stacked ? 3 : 2;
    const sl_st_tensor *sc = sl_ld_find(l, cat(nb, sizeof nb, module, ".weight_scale_inv"));
    if (!sc)
        return sl_fail(e, "%s: tensor '%s' is F8_E4M3 but '%s' is missing (expected float32 scales per %dx%d tile)",
                       file_of(l, t), t->name, nb, br, bc);
    int64_t tr = (rows_total + br - 1) / br, tc = (w->cols + bc - 1) / bc;
    shape_str(sc, s, sizeof s);
    if (sc->dtype != SL_ST_F32 || sc->ndim != nd || (stacked && sc->shape[0] != n_experts) || sc->shape[nd - 2] != tr ||
        sc->shape[nd - 1] != tc)
        return sl_fail(e, "%s: tensor '%s' is %s %s, expected F32 [%s%lld, %lld] (one scale per %dx%d tile of %s)",
                       file_of(l, sc), sc->name, sl_st_dtype_name(sc->dtype), s, stacked ? "E, " : "", (long long)tr,
                       (long long)tc, br, bc, t->name);
    int64_t in_stack = first_row % rows_total, mat = first_row / rows_total;
    if (in_stack % br)
        return sl_fail(e, "%s: tensor '%s': rows from %lld do not start on a %d-row FP8 tile", file_of(l, t), t->name,
                       (long long)in_stack, br);
    w->fmt = SL_WF_FP8;
    w->group = bc;
    w->tile_rows = br;
    w->sb_fmt = SL_WF_F32;
    w->row_bytes = (size_t)w->cols;
    w->data = t->data + (size_t)first_row * w->row_bytes;
    size_t tiles = (size_t)((w->rows + br - 1) / br) * (size_t)tc * 4;
    w->scales =
        aligned_data(l, sc->data + ((size_t)mat * (size_t)tr + (size_t)(in_stack / br)) * (size_t)tc * 4, tiles, 4);
    return w->scales ? 0 : sl_fail(e, "out of memory");
}

/* Describes an MLX-packed (or plain) matrix stack: t is [E?, rows_total, packed_cols]. Fills w for the
 * slice starting at element row `first_row` (counting across the stack) of `rows` rows. */
static int fill_weight(sl_loader *l, const char *module, const char *wname, const sl_st_tensor *t, int stacked,
                       int n_experts, int rows_total, int rows, int cols, int64_t first_row, sl_weight *w, sl_err *e) {
    char nb[512], s[96];
    int bits = 0, group = 0; /* of an MLX-packed tensor, once known */
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    int want_nd = stacked ? 3 : 2;
    shape_str(t, s, sizeof s);
    if (t->ndim != want_nd || (stacked && t->shape[0] != n_experts) || t->shape[want_nd - 2] != rows_total)
        goto bad_shape;
    if (t->dtype == SL_ST_U32) {
        const sl_st_tensor *sc = sl_ld_find(l, cat(nb, sizeof nb, module, ".scales"));
        const sl_st_tensor *bi = sl_ld_find(l, cat(nb, sizeof nb, module, ".biases"));
        if (!sc || !bi)
            return sl_fail(e, "%s: tensor '%s' is packed U32 but '%s.%s' is missing (expected MLX scales and biases)",
                           file_of(l, t), t->name, module, sc ? "biases" : "scales");
        /* the config's table is keyed by the checkpoint's own module name */
        char raw[512];
        snprintf(raw, sizeof raw, "%s", t->name);
        size_t L = strlen(raw);
        if (L > 7 && !strcmp(raw + L - 7, ".weight")) raw[L - 7] = 0;
        if (sl_config_quant_for(&l->m->cfg, raw, &bits, &group) != 0) {
            /* no quantization table: derive both from the shapes */
            if (sc->ndim != want_nd)
                return sl_fail(e, "%s: tensor '%s' has %d dimensions, expected %d", file_of(l, sc), sc->name, sc->ndim,
                               want_nd);
            int64_t ng = sc->shape[sc->ndim - 1];
            if (ng <= 0 || cols % ng) goto bad_q;
            group = (int)(cols / ng);
            bits = (int)(t->shape[want_nd - 1] * 32 / cols);
        }
        if (bits < 1 || bits > 8 || group <= 0 || cols % group || ((int64_t)cols * bits) % 32) goto bad_q;
        if (t->shape[want_nd - 1] != (int64_t)cols * bits / 32) goto bad_q;
        if (sc->ndim != want_nd || bi->ndim != want_nd || sc->shape[want_nd - 1] != cols / group ||
            sc->shape[want_nd - 2] != rows_total || bi->shape[want_nd - 1] != cols / group ||
            bi->shape[want_nd - 2] != rows_total || sl_st_numel(sc) != sl_st_numel(bi))
            return sl_fail(e, "%s: '%s.scales'/'.biases' do not match %d-bit groups of %d for %s %s", file_of(l, sc),
                           module, bits, group, t->name, s);
        if (sc->dtype != bi->dtype || to_wfmt(sc->dtype, &w->sb_fmt))
            return sl_fail(e, "%s: '%s.scales'/'.biases' must both be F32, F16 or BF16 (got %s, %s)", file_of(l, sc),
                           module, sl_st_dtype_name(sc->dtype), sl_st_dtype_name(bi->dtype));
        w->fmt = SL_WF_MLX;
        w->bits = bits;
        w->group = group;
        w->row_bytes = (size_t)cols * (size_t)bits / 8;
        size_t sbe = sl_st_dtype_size(sc->dtype), ng = (size_t)(cols / group);
        w->data = t->data + (size_t)first_row * w->row_bytes;
        w->scales = aligned_data(l, sc->data + (size_t)first_row * ng * sbe, (size_t)rows * ng * sbe, sbe);
        w->biases = aligned_data(l, bi->data + (size_t)first_row * ng * sbe, (size_t)rows * ng * sbe, sbe);
        if (!w->scales || !w->biases) return sl_fail(e, "out of memory");
        l->m->n_params += (uint64_t)rows * (uint64_t)cols;
        return 0;
    }
    if (t->dtype == SL_ST_GGML) { /* GGUF block-quantised rows, used in place */
        if (t->shape[want_nd - 1] != cols) goto bad_shape;
        size_t rb = sl_ggml_row_bytes(t->gtype, cols);
        if (sl_ggml_weight(w, t->name, t->gtype, rows, cols, t->data + (size_t)first_row * rb, e))
            return sl_wrap(e, "%s", file_of(l, t));
        l->m->n_params += (uint64_t)rows * (uint64_t)cols;
        return 0;
    }
    if (t->dtype == SL_ST_F8_E4M3) {
        if (t->shape[want_nd - 1] != cols) goto bad_shape;
        if (fill_fp8(l, module, t, stacked, n_experts, rows_total, first_row, w, e)) return -1;
        l->m->n_params += (uint64_t)rows * (uint64_t)cols;
        return 0;
    }
    if (to_wfmt(t->dtype, &w->fmt))
        return sl_fail(e, "%s: tensor '%s' has dtype %s, expected F32, F16, BF16, F8_E4M3 or MLX-packed U32",
                       file_of(l, t), wname, dtype_name(t));
    if (t->shape[want_nd - 1] != cols) goto bad_shape;
    size_t es = sl_st_dtype_size(t->dtype);
    w->row_bytes = (size_t)cols * es;
    w->data = aligned_data(l, t->data + (size_t)first_row * w->row_bytes, (size_t)rows * w->row_bytes, es);
    if (!w->data) return sl_fail(e, "out of memory");
    l->m->n_params += (uint64_t)rows * (uint64_t)cols;
    return 0;
bad_shape:
    if (stacked)
        return sl_fail(e, "%s: tensor '%s' has shape %s, expected [%d, %d, %d]", file_of(l, t), t->name, s, n_experts,
                       rows_total, cols);
    return sl_fail(e, "%s: tensor '%s' has shape %s, expected [%d, %d]", file_of(l, t), t->name, s, rows, cols);
bad_q:
    if (l->m->cfg.quant && bits > 0 && group > 0) /* bits and group from config.json */
        return sl_fail(e,
                       "%s: tensor '%s' has packed shape %s, which is not the %d-bit MLX quantization of %d inputs "
                       "in groups of %d that config.json gives (expected %lld words per row)",
                       file_of(l, t), t->name, s, bits, cols, group, (long long)cols * bits / 32);
    return sl_fail(e, "%s: tensor '%s' has packed shape %s, which is not a valid MLX quantization of %d inputs",
                   file_of(l, t), t->name, s, cols);
}

int sl_ld_linear(sl_loader *l, const char *module, int rows, int cols, sl_weight *w, sl_err *e) {
    char nb[512];
    const sl_st_tensor *t = sl_ld_find(l, cat(nb, sizeof nb, module, ".weight"));
    if (!t) return sl_fail(e, "%s: missing tensor '%s.weight' (expected [%d, %d])", l->m->path, module, rows, cols);
    if (fill_weight(l, module, nb, t, 0, 0, rows, rows, cols, 0, w, e)) return -1;
    if (sl_ld_has(l, cat(nb, sizeof nb, module, ".bias"))) {
        float *b;
        if (sl_ld_vector(l, nb, rows, 0.0f, &b, e)) return -1;
        w->bias = b;
    }
    return 0;
}

/* Bytes of one row's scales (or biases) of an MLX-packed weight. */
static size_t mlx_sb_row_bytes(const sl_weight *w) {
    return (size_t)(w->cols / w->group) * (w->sb_fmt == SL_WF_F32 ? 4 : 2);
}

/* An owned copy of rows[0..n) of the row-major array base (row_bytes per row); NULL when out of memory. */
static const uint8_t *gather(sl_loader *l, const uint8_t *base, size_t row_bytes, int n, const int *rows) {
    size_t bytes = (size_t)n * row_bytes;
    uint8_t *c = aligned_alloc(16, (bytes + 15) & ~(size_t)15);
    if (!c || model_own(l->m, c)) {
        free(c);
        return NULL;
    }
    for (int i = 0; i < n; i++) memcpy(c + (size_t)i * row_bytes, base + (size_t)rows[i] * row_bytes, row_bytes);
    return c;
}

int sl_ld_linear_rows(sl_loader *l, const char *module, int rows_total, int cols, int n, const int *rows, sl_weight *w,
                      sl_err *e) {
    sl_weight full;
    if (sl_ld_linear(l, module, rows_total, cols, &full, e)) return -1;
    *w = full;
    w->rows = n;
    for (int i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= rows_total)
            return sl_fail(e, "%s: row %d of '%s' requested, which has %d rows", l->m->path, rows[i], module,
                           rows_total);
    /* every row format keeps a row's bytes (and its MLX scales and biases) contiguous */
    w->data = gather(l, full.data, full.row_bytes, n, rows);
    if (full.fmt == SL_WF_MLX) {
        w->scales = gather(l, full.scales, mlx_sb_row_bytes(&full), n, rows);
        w->biases = gather(l, full.biases, mlx_sb_row_bytes(&full), n, rows);
    }
    if (full.bias) w->bias = (const float *)gather(l, (const uint8_t *)full.bias, sizeof(float), n, rows);
    if (!w->data || (full.fmt == SL_WF_MLX && (!w->scales || !w->biases)) || (full.bias && !w->bias))
        return sl_fail(e, "out of memory");
    /* the parameters are counted once over all the parts of the fused tensor */
    l->m->n_params -= (uint64_t)(rows_total - n) * (uint64_t)(cols + (full.bias ? 1 : 0));
    return 0;
}

int sl_ld_row_f32(const sl_weight *w, int r, float *d, const char *what, sl_err *e) {
    if (w->fmt == SL_WF_MLX)
        return sl_fail(e, "%s is MLX-packed, expected F32, F16, BF16, F8_E4M3 or a GGML type", what);
    if (w->bias) return sl_fail(e, "%s has a bias, which this layer does not use", what);
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    if (w->fmt == SL_WF_GGML) {
        sl_ggml_dequant_row(w->gtype, p, d, w->cols);
        return 0;
    }
    for (int j = 0; j < w->cols; j++) {
        uint16_t h;
        switch (w->fmt) {
        case SL_WF_F32: memcpy(&d[j], p + 4 * (size_t)j, 4); break;
        case SL_WF_BF16: memcpy(&h, p + 2 * (size_t)j, 2), d[j] = sl_bf16_to_f32(h); break;
        case SL_WF_F16: memcpy(&h, p + 2 * (size_t)j, 2), d[j] = sl_f16_to_f32(h); break;
        case SL_WF_FP8: d[j] = sl_fp8_e4m3_to_f32(p[j]) * sl_fp8_scale(w, r, j); break;
        default: d[j] = 0; break;
        }
    }
    return 0;
}

float *sl_ld_alloc_f32(sl_loader *l, size_t n, sl_err *e) {
    float *v = malloc(sizeof *v * (n ? n : 1));
    if (!v || model_own(l->m, v)) {
        free(v);
        sl_fail(e, "out of memory");
        return NULL;
    }
    return v;
}

void *sl_ld_part(sl_loader *l, size_t n, size_t size, sl_err *e) {
    void *p = calloc(n ? n : 1, size);
    if (!p || model_own(l->m, p)) {
        free(p);
        sl_fail(e, "out of memory");
        return NULL;
    }
    return p;
}

int sl_ld_matrix_f32(sl_loader *l, const char *module, int rows, int cols, float **out, sl_err *e) {
    sl_weight w;
    char what[300];
    snprintf(what, sizeof what, "%s: '%s'", l->m->path, module);
    if (sl_ld_linear(l, module, rows, cols, &w, e)) return -1;
    float *v = sl_ld_alloc_f32(l, (size_t)rows * (size_t)cols, e);
    if (!v) return -1;
    for (int r = 0; r < rows; r++)
        if (sl_ld_row_f32(&w, r, v + (size_t)r * (size_t)cols, what, e)) return -1;
    *out = v;
    return 0;
}

int sl_ld_stacked(sl_loader *l, const char *module, int has_weight_suffix, int n_experts, int index, int row0,
                  int rows_total, int rows, int cols, sl_weight *w, sl_err *e) {
    char nb[512];
    cat(nb, sizeof nb, module, has_weight_suffix ? ".weight" : "");
    const sl_st_tensor *t = sl_ld_find(l, nb);
    if (!t)
        return sl_fail(e, "%s: missing tensor '%s' (expected [%d, %d, %d])", l->m->path, nb, n_experts, rows_total,
                       cols);
    int64_t first = (int64_t)index * rows_total + row0;
    return fill_weight(l, module, nb, t, 1, n_experts, rows_total, rows, cols, first, w, e);
}

int sl_ld_stacked_bias(sl_loader *l, const char *name, int n_experts, int index, int rows, sl_weight *w, sl_err *e) {
    char s[96];
    const sl_st_tensor *t = sl_ld_find(l, name);
    if (!t) return sl_fail(e, "%s: missing tensor '%s' (expected [%d, %d])", l->m->path, name, n_experts, rows);
    if (t->dtype != SL_ST_F32 && t->dtype != SL_ST_F16 && t->dtype != SL_ST_BF16)
        return sl_fail(e, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", file_of(l, t), t->name,
                       dtype_name(t));
    shape_str(t, s, sizeof s);
    if (t->ndim != 2 || t->shape[0] != n_experts || t->shape[1] != rows)
        return sl_fail(e, "%s: tensor '%s' has shape %s, expected [%d, %d]", file_of(l, t), t->name, s, n_experts,
                       rows);
    float *b = malloc(sizeof *b * (size_t)rows);
    if (!b || model_own(l->m, b)) {
        free(b);
        return sl_fail(e, "out of memory");
    }
    for (int r = 0; r < rows; r++) b[r] = elem_f32(t, (int64_t)index * rows + r);
    l->m->n_params += (uint64_t)rows;
    w->bias = b;
    return 0;
}

int sl_ld_expert_t(sl_loader *l, const char *module, int n_experts, int index, int rows, int cols, sl_weight *w,
                   sl_err *e) {
    char nb[512], s[96];
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    const sl_st_tensor *bl = sl_ld_find(l, cat(nb, sizeof nb, module, "_blocks"));
    if (bl) {
        const sl_st_tensor *sc = sl_ld_find(l, cat(nb, sizeof nb, module, "_scales"));
        if (!sc)
            return sl_fail(e, "%s: tensor '%s' is MXFP4 but '%s_scales' is missing", file_of(l, bl), bl->name, module);
        shape_str(bl, s, sizeof s);
        if (cols % 32 || bl->dtype != SL_ST_U8 || bl->ndim != 4 || bl->shape[0] != n_experts || bl->shape[1] != rows ||
            bl->shape[2] != cols / 32 || bl->shape[3] != 16)
            return sl_fail(e, "%s: tensor '%s' is %s %s, expected U8 [%d, %d, %d, 16] (MXFP4 blocks)", file_of(l, bl),
                           bl->name, dtype_name(bl), s, n_experts, rows, cols / 32);
        shape_str(sc, s, sizeof s);
        if (sc->dtype != SL_ST_U8 || sc->ndim != 3 || sc->shape[0] != n_experts || sc->shape[1] != rows ||
            sc->shape[2] != cols / 32)
            return sl_fail(e, "%s: tensor '%s' is %s %s, expected U8 [%d, %d, %d] (MXFP4 scales)", file_of(l, sc),
                           sc->name, dtype_name(sc), s, n_experts, rows, cols / 32);
        w->fmt = SL_WF_MXFP4;
        w->group = 32;
        w->row_bytes = (size_t)cols / 2;
        w->data = bl->data + (size_t)index * (size_t)rows * w->row_bytes;
        w->scales = sc->data + (size_t)index * (size_t)rows * (size_t)(cols / 32);
    } else {
        const sl_st_tensor *t = sl_ld_find(l, module);
        if (!t)
            return sl_fail(e, "%s: missing tensor '%s' (expected [%d, %d, %d], or MXFP4 '%s_blocks')", l->m->path,
                           module, n_experts, cols, rows, module);
        shape_str(t, s, sizeof s);
        if (to_wfmt(t->dtype, &w->fmt))
            return sl_fail(e, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", file_of(l, t), t->name,
                           dtype_name(t));
        if (t->ndim != 3 || t->shape[0] != n_experts || t->shape[1] != cols || t->shape[2] != rows)
            return sl_fail(e, "%s: tensor '%s' has shape %s, expected [%d, %d, %d] (experts, inputs, outputs)",
                           file_of(l, t), t->name, s, n_experts, cols, rows);
        /* used in place: the kernels read it inputs-first (sl_weight.transposed) */
        size_t es = sl_st_dtype_size(t->dtype), n = (size_t)rows * (size_t)cols;
        w->transposed = 1;
        w->data = aligned_data(l, t->data + (size_t)index * n * es, n * es, es);
        if (!w->data) return sl_fail(e, "out of memory");
        w->row_bytes = (size_t)cols * es;
    }
    l->m->n_params += (uint64_t)rows * (uint64_t)cols;
    return sl_ld_stacked_bias(l, cat(nb, sizeof nb, module, "_bias"), n_experts, index, rows, w, e);
}

int sl_ld_check_all_used(sl_loader *l, sl_err *e) {
    for (int k = 0; k < l->n; k++) {
        int i = l->order[k];
        if (!l->used[i])
            return sl_fail(e, "%s: unexpected tensor '%s' (not part of a %s model)",
                           l->m->st->paths[l->m->st->tensors[i].file], l->m->st->tensors[i].name, l->m->cfg.model_type);
    }
    return 0;
}
