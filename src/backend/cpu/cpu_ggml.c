/* Matmul of GGML block-quantised weights for one to a few tokens: each row is decoded one block at a
 * time in registers (or a block-sized stack buffer) and multiplied into the float32 inputs, so decode
 * streams the quantised bytes and never writes a dequantised row. Larger batches decode panels of rows
 * through cpu_row_f32 instead (cpu_matmul.c), where the decoding is shared by every token. */
#include "backend/cpu/cpu.h"
#include "backend/ggml_types.h"

/* Any supported type: one block decoded by the reference decoder into a stack buffer, then dotted. */
static float dot_generic(const sl_weight *w, const uint8_t *row, const float *x) {
    int bs = sl_ggml_block_size(w->gtype);
    size_t bb = sl_ggml_block_bytes(w->gtype);
    int nb = w->cols / bs;
    float buf[256];
    float s = 0;
    for (int i = 0; i < nb; i++) {
        sl_ggml_dequant_block(w->gtype, row + (size_t)i * bb, buf);
        s += cpu_dot_inline(buf, x + (size_t)i * (size_t)bs, bs);
    }
    return s;
}

typedef struct {
    const sl_weight *w;
    const float *x, *xs; /* n tokens of inputs; their sums over each 16 values */
    int n;
    float *y;
    cpu_ggml_dot_fn dot;
} gg_job;

static void gg_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    gg_job *j = ctx;
    const sl_weight *w = j->w;
    size_t cols = (size_t)w->cols, rows = (size_t)w->rows;
    for (int64_t r = b; r < e; r++) {
        const uint8_t *row = w->data + (size_t)r * w->row_bytes;
        for (int t = 0; t < j->n; t++) {
            const float *x = j->x + (size_t)t * cols;
            float v = j->dot ? j->dot(row, x, j->xs + (size_t)t * (cols / 16), w->cols) : dot_generic(w, row, x);
            j->y[(size_t)t * rows + (size_t)r] = w->bias ? v + w->bias[r] : v;
        }
    }
}

void cpu_sums16(const float *x, size_t groups, float *out) {
    for (size_t g = 0; g < groups; g++) {
        float s = 0;
        for (int i = 0; i < 16; i++) s += x[g * 16 + (size_t)i];
        out[g] = s;
    }
}

int cpu_ggml_matmul_fused(cpu_impl *c, const sl_weight *w, const float *x, int n, float *y) {
    cpu_ggml_dot_fn dot = cpu_ggml_pick(c, w->gtype);
    const float *xs = NULL;
    if (dot) {
        size_t groups = (size_t)w->cols / 16, need = groups * (size_t)n;
        if (need > c->xprep_len) {
            float *p = realloc(c->xprep, need * sizeof *p);
            if (!p) {
                if (!c->failed) sl_fail(&c->failure, "out of memory for %zu bytes of CPU scratch", need * 4);
                c->failed = 1;
                return -1;
            }
            c->xprep = p;
            c->xprep_len = need;
        }
        cpu_sums16(x, need, c->xprep);
        xs = c->xprep;
    }
    gg_job j = {w, x, xs, n, y, dot};
    sl_pool_for(c->pool, w->rows, 8, gg_task, &j);
    return 0;
}
