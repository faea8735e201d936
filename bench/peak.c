/* Physical bounds of the machine for docs/performance.md: memory read bandwidth (threads summing a
 * 1 GiB buffer) and fp32 FMA throughput (independent register accumulators, no memory traffic).
 *
 *   cc -O3 -march=native -pthread bench/peak.c -o /tmp/peak && /tmp/peak [THREADS]
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BUF_BYTES ((size_t)1 << 30)
#define PASSES 5
#define FMA_ITERS 200000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
    int mode; /* 0: read, 1: fma avx2, 2: fma avx512 */
    float out;
    pthread_barrier_t *bar;
} job;

static uint64_t sum_words(const uint64_t *p, size_t n) {
    uint64_t a[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) a[k] += p[i + k];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

/* 12 independent FMA chains hide the 4-cycle latency on two ports */
#define FMA_BODY(T, SET1, FMA, ADD, REDUCE)                                                                            \
    T acc[12];                                                                                                         \
    for (int k = 0; k < 12; k++) acc[k] = SET1(1.0f + 1e-3f * (float)k);                                               \
    T m = SET1(0.999999f), c = SET1(1e-7f);                                                                            \
    for (long i = 0; i < FMA_ITERS / 16; i++)                                                                          \
        for (int k = 0; k < 12; k++) acc[k] = FMA(acc[k], m, c);                                                       \
    T s = acc[0];                                                                                                      \
    for (int k = 1; k < 12; k++) s = ADD(s, acc[k]);                                                                   \
    return REDUCE(s);

static float red256(__m256 v) {
    float t[8];
    _mm256_storeu_ps(t, v);
    return t[0] + t[7];
}
static float red512(__m512 v) {
    return _mm512_reduce_add_ps(v);
}
static float fma256(void) {
    FMA_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, red256)
}
static float fma512(void) {
    FMA_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, red512)
}

static void *worker(void *arg) {
    job *j = arg;
    pthread_barrier_wait(j->bar);
    if (j->mode == 0)
        j->sum = sum_words(j->p, j->n);
    else
        j->out = j->mode == 1 ? fma256() : fma512();
    pthread_barrier_wait(j->bar);
    return NULL;
}

/* Runs `mode` on nt threads (the caller waits at the barriers); returns seconds. */
static double run(int nt, int mode, const uint64_t *buf, uint64_t *sum) {
    pthread_t th[256];
    job jobs[256];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nt + 1);
    size_t words = BUF_BYTES / 8, per = words / (size_t)nt;
    for (int t = 0; t < nt; t++) {
        jobs[t] = (job){buf + (size_t)t * per, per, 0, mode, 0, &bar};
        pthread_create(&th[t], NULL, worker, &jobs[t]);
    }
    pthread_barrier_wait(&bar);
    double t0 = now();
    pthread_barrier_wait(&bar);
    double dt = now() - t0;
    for (int t = 0; t < nt; t++) {
        pthread_join(th[t], NULL);
        *sum += jobs[t].sum + (uint64_t)jobs[t].out;
    }
    pthread_barrier_destroy(&bar);
    return dt;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1 || nt > 256) nt = 1;
    uint64_t *buf = aligned_alloc(64, BUF_BYTES);
    if (!buf) return 1;
    memset(buf, 1, BUF_BYTES);
    uint64_t sink = 0;
    for (int t = 1; t <= nt; t++) {
        double best = 1e9;
        for (int p = 0; p < PASSES; p++) {
            double dt = run(t, 0, buf, &sink);
            if (dt < best) best = dt;
        }
        printf("read bandwidth, %d thread%s: %.2f GB/s (1 GiB, best of %d)\n", t, t == 1 ? "" : "s",
               (double)BUF_BYTES / best / 1e9, PASSES);
    }
    for (int mode = 1; mode <= 2; mode++) {
        double best = 1e9;
        for (int p = 0; p < 3; p++) {
            double dt = run(nt, mode, buf, &sink);
            if (dt < best) best = dt;
        }
        int lanes = mode == 1 ? 8 : 16;
        double flop = 2.0 * lanes * 12.0 * (double)(FMA_ITERS / 16) * nt;
        printf("fp32 FMA peak, %s, %d threads: %.1f GFLOP/s (best of 3)\n", mode == 1 ? "AVX2" : "AVX-512", nt,
               flop / best / 1e9);
    }
    fprintf(stderr, "(checksum %llu)\n", (unsigned long long)sink);
    free(buf);
    return 0;
}
