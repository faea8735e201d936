/* Physical bounds of the CPU for `sluice bench`: how fast all threads can stream memory, and how many
 * fp32 multiply-adds they can issue. Each is measured once per backend and cached. */
#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu.h"
#include "core/util.h"

#define PROBE_BYTES ((size_t)512 << 20)
#define FMA_ITERS 4000000L

typedef struct {
    const uint64_t *p;
    size_t words;
    uint64_t sums[256];
} read_job;

static void read_part(void *ctx, int64_t a, int64_t b, int tid) {
    read_job *j = ctx;
    uint64_t acc[8] = {0};
    for (int64_t blk = a; blk < b; blk++) {
        const uint64_t *p = j->p + (size_t)blk * 8192;
        for (size_t i = 0; i < 8192; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += p[i + k];
    }
    j->sums[tid & 255] += acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
}

double cpu_mem_bandwidth(sl_backend *b) {
    cpu_impl *c = cpu_of(b);
    if (c->bandwidth > 0) return c->bandwidth;
    uint64_t *buf = malloc(PROBE_BYTES);
    if (!buf) return 0;
    memset(buf, 1, PROBE_BYTES);
    read_job j = {buf, PROBE_BYTES / 8, {0}};
    double best = 1e30;
    for (int pass = 0; pass < 4; pass++) {
        double t0 = sl_now();
        sl_pool_for(c->pool, (int64_t)(j.words / 8192), 16, read_part, &j);
        double dt = sl_now() - t0;
        if (dt < best) best = dt;
    }
    uint64_t sink = 0;
    for (int i = 0; i < 256; i++) sink += j.sums[i];
    free(buf);
    /* every word is 0x0101..01: the sum proves the reads happened */
    c->bandwidth = sink ? (double)PROBE_BYTES / best : 0;
    return c->bandwidth;
}

/* Independent accumulator chains hide the FMA latency; the result is kept so the loop is not removed. */
typedef struct {
    int isa; /* 2: avx512, 1: avx2, 0: scalar */
    float out[256];
} fma_job;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float fma512(void) {
    __m512 acc[12], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < 12; k++) acc[k] = _mm512_set1_ps(1.0f + 1e-3f * (float)k);
    for (long i = 0; i < FMA_ITERS; i++)
        for (int k = 0; k < 12; k++) acc[k] = _mm512_fmadd_ps(acc[k], m, c);
    for (int k = 1; k < 12; k++) acc[0] = _mm512_add_ps(acc[0], acc[k]);
    return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,fma"))) static float fma256(void) {
    __m256 acc[12], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int k = 0; k < 12; k++) acc[k] = _mm256_set1_ps(1.0f + 1e-3f * (float)k);
    for (long i = 0; i < FMA_ITERS; i++)
        for (int k = 0; k < 12; k++) acc[k] = _mm256_fmadd_ps(acc[k], m, c);
    for (int k = 1; k < 12; k++) acc[0] = _mm256_add_ps(acc[0], acc[k]);
    float t[8];
    _mm256_storeu_ps(t, acc[0]);
    return t[0] + t[7];
}
#endif

static float fma_scalar(void) {
    float acc[12];
    for (int k = 0; k < 12; k++) acc[k] = 1.0f + 1e-3f * (float)k;
    for (long i = 0; i < FMA_ITERS; i++)
        for (int k = 0; k < 12; k++) acc[k] = acc[k] * 0.999999f + 1e-7f;
    float s = 0;
    for (int k = 0; k < 12; k++) s += acc[k];
    return s;
}

static void fma_part(void *ctx, int64_t a, int64_t b, int tid) {
    fma_job *j = ctx;
    for (int64_t i = a; i < b; i++) {
#if defined(__x86_64__)
        j->out[tid & 255] += j->isa == 2 ? fma512() : j->isa == 1 ? fma256() : fma_scalar();
#else
        j->out[tid & 255] += fma_scalar();
#endif
    }
}

double cpu_peak_flops(sl_backend *b) {
    cpu_impl *c = cpu_of(b);
    if (c->flops > 0) return c->flops;
    fma_job j = {c->avx512 ? 2 : c->avx2 ? 1 : 0, {0}};
    int lanes = j.isa == 2 ? 16 : j.isa == 1 ? 8 : 1;
    double best = 1e30;
    for (int pass = 0; pass < 2; pass++) {
        double t0 = sl_now();
        sl_pool_for(c->pool, c->n_threads, 1, fma_part, &j);
        double dt = sl_now() - t0;
        if (dt < best) best = dt;
    }
    float sink = 0;
    for (int i = 0; i < 256; i++) sink += j.out[i];
    double flop = 2.0 * 12.0 * lanes * (double)FMA_ITERS * c->n_threads;
    c->flops = sink != 0 ? flop / best : 0;
    return c->flops;
}
