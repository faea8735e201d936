#include "models/loader.h"

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
        return s;
    }
    return strdup(raw);
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
    if (to_wfmt(t->dtype, &w->fmt))
        return sl_fail(e, "%s: tensor '%s' has dtype %s, expected F32, F16, BF16 or MLX-packed U32", file_of(l, t),
                       wname, dtype_name(t));
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
