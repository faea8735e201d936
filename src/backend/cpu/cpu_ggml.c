/* One-token matmul for GGML block-quantised weights: each row is decoded one block at a time in
 * registers (or a block-sized stack buffer) and multiplied into the float32 input, so decode streams
 * the quantised bytes and never writes a dequantised row. */
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
    const float *x;
    float *y;
    cpu_ggml_dot_fn dot;
} gg_job;

static void gg_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    gg_job *j = ctx;
    const sl_weight *w = j->w;
    for (int64_t r = b; r < e; r++) {
        const uint8_t *row = w->data + (size_t)r * w->row_bytes;
        float v = j->dot ? j->dot(row, j->x, w->cols) : dot_generic(w, row, j->x);
        j->y[r] = w->bias ? v + w->bias[r] : v;
    }
}

void cpu_ggml_gemv(cpu_impl *c, const sl_weight *w, const float *x, float *y) {
    gg_job j = {w, x, y, cpu_ggml_pick(c, w->gtype)};
    sl_pool_for(c->pool, w->rows, 8, gg_task, &j);
}
