/* Decode GEMV speed of the CPU backend per weight format: a 4096 x 4096 matrix times one token, over
 * enough copies of the matrix (384 MB in all) that every call streams its weights from memory, not
 * from cache. Prints GB/s of weight bytes per format; compare with bench/peak.c's read bandwidth.
 * Then one token's mixture-of-experts layer in Q4_K (8 of 128 experts of hidden 2048, width 512, as
 * Qwen3.5-35B-A3B's), each call routed to 8 experts not used in the calls before it.
 *
 *   cmake --build build --target bench_gemv && ./build/bench_gemv [THREADS] [ROUNDS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/ggml_types.h"
#include "core/half.h"

#define DIM 4096
#define FOOTPRINT ((size_t)384 << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static unsigned rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

typedef struct {
    const char *name;
    sl_weight w; /* shape and format; data and scales set per copy */
    size_t data_bytes, sb_bytes;
} fmt_case;

/* Random bytes, with every float16 / bf16 scale field set to a small positive value. */
static void fill(const fmt_case *f, uint8_t *data, uint8_t *sb, unsigned *s) {
    for (size_t i = 0; i < f->data_bytes; i++) data[i] = (uint8_t)rnd(s);
    uint16_t h = sl_f32_to_f16(0.01f);
    if (f->w.fmt == SL_WF_BF16)
        for (size_t i = 0; i < f->data_bytes / 2; i++) ((uint16_t *)data)[i] = sl_f32_to_bf16(0.01f);
    if (f->w.fmt == SL_WF_MLX)
        for (size_t i = 0; i < f->sb_bytes / 2; i++) ((uint16_t *)sb)[i] = sl_f32_to_bf16(0.01f);
    if (f->w.fmt == SL_WF_GGML) {
        size_t bb = sl_ggml_block_bytes(f->w.gtype), nb = f->data_bytes / bb;
        for (size_t b = 0; b < nb; b++) {
            memcpy(data + b * bb, &h, 2); /* d of Q8_0; d of Q4_K */
            if (f->w.gtype == SL_GGML_Q4_K) memcpy(data + b * bb + 2, &h, 2);
        }
    }
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 5;
    sl_backend *be;
    sl_err e;
    if (sl_cpu_backend_create(threads, &be, &e) != 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    fmt_case cases[] = {
        {"BF16", {.fmt = SL_WF_BF16, .row_bytes = DIM * 2}, (size_t)DIM * DIM * 2, 0},
        {"MLX4/g64",
         {.fmt = SL_WF_MLX, .row_bytes = DIM / 2, .bits = 4, .group = 64, .sb_fmt = SL_WF_BF16},
         (size_t)DIM * DIM / 2,
         (size_t)DIM * (DIM / 64) * 2},
        {"Q8_0", {.fmt = SL_WF_GGML, .gtype = SL_GGML_Q8_0}, 0, 0},
        {"Q4_K", {.fmt = SL_WF_GGML, .gtype = SL_GGML_Q4_K}, 0, 0},
        {"Q6_K", {.fmt = SL_WF_GGML, .gtype = SL_GGML_Q6_K}, 0, 0},
    };
    float *x = malloc(sizeof *x * DIM), *y = malloc(sizeof *y * DIM);
    unsigned s = 1;
    for (int i = 0; i < DIM; i++) x[i] = (float)(rnd(&s) & 0xffff) / 32768.0f - 1.0f;
    printf("%-10s %10s %10s %10s\n", "format", "MB/matrix", "ms/call", "GB/s");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        fmt_case *f = &cases[k];
        f->w.rows = f->w.cols = DIM;
        if (f->w.fmt == SL_WF_GGML) {
            f->w.row_bytes = sl_ggml_row_bytes(f->w.gtype, DIM);
            f->data_bytes = f->w.row_bytes * DIM;
        }
        size_t one = f->data_bytes + 2 * f->sb_bytes, copies = FOOTPRINT / one + 1;
        uint8_t *mem = malloc(copies * one);
        if (!mem) return 1;
        sl_weight *ws = malloc(sizeof *ws * copies);
        for (size_t c = 0; c < copies; c++) {
            uint8_t *base = mem + c * one;
            fill(f, base, base + f->data_bytes, &s);
            if (f->sb_bytes) memcpy(base + f->data_bytes + f->sb_bytes, base + f->data_bytes, f->sb_bytes);
            ws[c] = f->w;
            ws[c].data = base;
            ws[c].scales = base + f->data_bytes;
            ws[c].biases = base + f->data_bytes + f->sb_bytes;
        }
        double best = 1e30;
        for (int r = 0; r < rounds; r++) {
            double t0 = now();
            for (size_t c = 0; c < copies; c++) be->ops->matmul(be, &ws[c], x, 1, y);
            double dt = (now() - t0) / (double)copies;
            best = dt < best ? dt : best;
        }
        printf("%-10s %10.1f %10.3f %10.1f\n", f->name, (double)sl_weight_bytes(&f->w) / 1e6, best * 1e3,
               (double)sl_weight_bytes(&f->w) / best / 1e9);
        free(ws);
        free(mem);
    }
    free(x);
    free(y);
    /* a MoE layer's routed experts for one token */
    enum { E = 128, K = 8, H = 2048, I = 512 };
    size_t rb_h = sl_ggml_row_bytes(SL_GGML_Q4_K, H), rb_i = sl_ggml_row_bytes(SL_GGML_Q4_K, I);
    size_t mat_gu = rb_h * I, mat_d = rb_i * H, per = 2 * mat_gu + mat_d;
    uint8_t *mem = malloc(per * E);
    sl_expert *ex = malloc(sizeof *ex * E);
    const sl_expert **tab = malloc(sizeof *tab * E);
    if (!mem || !ex || !tab) return 1;
    fmt_case fq = {"Q4_K", {.fmt = SL_WF_GGML, .gtype = SL_GGML_Q4_K}, per * E, 0};
    fill(&fq, mem, NULL, &s);
    for (int i = 0; i < E; i++) {
        sl_weight w = {.fmt = SL_WF_GGML, .gtype = SL_GGML_Q4_K, .rows = I, .cols = H, .row_bytes = rb_h};
        ex[i].gate = ex[i].up = ex[i].down = w;
        ex[i].gate.data = mem + per * (size_t)i;
        ex[i].up.data = ex[i].gate.data + mat_gu;
        ex[i].down = (sl_weight){.fmt = SL_WF_GGML, .gtype = SL_GGML_Q4_K, .rows = H, .cols = I, .row_bytes = rb_i};
        ex[i].down.data = ex[i].up.data + mat_gu;
        tab[i] = &ex[i];
    }
    sl_expert_table t = {.n_experts = E, .experts = tab};
    float *xm = malloc(sizeof *xm * H), *out = malloc(sizeof *out * H), wts[K];
    int32_t ids[K];
    for (int i = 0; i < H; i++) xm[i] = (float)(rnd(&s) & 0xffff) / 32768.0f - 1.0f;
    for (int j = 0; j < K; j++) wts[j] = 1.0f / K;
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        int calls = E / K * 4;
        double t0 = now();
        for (int c = 0; c < calls; c++) {
            for (int j = 0; j < K; j++) ids[j] = (c * K + j) % E;
            be->ops->moe(be, &t, xm, 1, H, ids, wts, K, out);
        }
        double dt = (now() - t0) / calls;
        best = dt < best ? dt : best;
    }
    printf("\n%-22s %10s %10s %10s\n", "MoE layer, one token", "MB/call", "ms/call", "GB/s");
    printf("%-22s %10.1f %10.3f %10.1f\n", "Q4_K, 8 of 128", (double)per * K / 1e6, best * 1e3,
           (double)per * K / best / 1e9);
    free(mem);
    free(ex);
    free(tab);
    free(xm);
    free(out);
    sl_backend_destroy(be);
    return 0;
}
