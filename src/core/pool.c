#include "core/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* How long an idle worker polls for the next job before sleeping. Decode issues hundreds of small jobs
 * per token (one per matrix, per expert); waking sleeping threads through the kernel for each costs more
 * than the work. */
#define SPIN_ROUNDS 20000

struct sl_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_ullong generation; /* bumped once per job */
    atomic_int pending;       /* workers still busy with the current job */
    atomic_int sleepers;      /* workers blocked on `wake` */
    atomic_int quit;
    /* current job */
    sl_pool_fn fn;
    void *ctx;
    int64_t total, chunk;
    atomic_llong next;
};

typedef struct {
    sl_pool *p;
    int tid;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_chunks(sl_pool *p, int tid) {
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->total) break;
        int64_t e = b + p->chunk < p->total ? b + p->chunk : p->total;
        p->fn(p->ctx, b, e, tid);
    }
}

static void *worker(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    sl_pool *p = wa.p;
    unsigned long long seen = 0;
    for (;;) {
        unsigned long long g = atomic_load(&p->generation);
        for (int i = 0; g == seen && i < SPIN_ROUNDS && !atomic_load(&p->quit); i++) {
            cpu_relax();
            g = atomic_load(&p->generation);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (!atomic_load(&p->quit) && (g = atomic_load(&p->generation)) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) break;
        seen = g;
        run_chunks(p, wa.tid);
        atomic_fetch_sub(&p->pending, 1);
    }
    return NULL;
}

sl_pool *sl_pool_create(int n_threads) {
    if (n_threads <= 0) {
        const char *env = getenv("SLUICE_THREADS");
        n_threads = env ? atoi(env) : 0;
        if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (n_threads <= 0) n_threads = 1;
    }
    sl_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            p->n = i;
            break;
        }
        wa->p = p;
        wa->tid = i;
        if (pthread_create(&p->threads[i], NULL, worker, wa) != 0) {
            free(wa);
            p->n = i;
            break;
        }
    }
    return p;
}

void sl_pool_destroy(sl_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p);
}

int sl_pool_size(const sl_pool *p) {
    return p ? p->n : 1;
}

void sl_pool_for(sl_pool *p, int64_t n, int64_t grain, sl_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int nt = p ? p->n : 1;
    /* A few chunks per thread balances uneven rows without much scheduling overhead. */
    int64_t chunk = (n + (int64_t)nt * 4 - 1) / ((int64_t)nt * 4);
    if (chunk < grain) chunk = grain;
    if (!p || nt == 1 || chunk >= n) {
        fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->n - 1);
    /* publishing the generation releases the job fields above to the workers */
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, 0);
    /* the others finish their last chunk at most; yield if one of them was descheduled */
    for (int i = 0; atomic_load(&p->pending) > 0; i++) {
        if (i < SPIN_ROUNDS)
            cpu_relax();
        else
            sched_yield();
    }
}
