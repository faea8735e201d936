/* One thread pool per process context, sized to the cores. The calling thread takes part in the work. */
#ifndef SLUICE_CORE_POOL_H
#define SLUICE_CORE_POOL_H

#include <stdint.h>

typedef struct sl_pool sl_pool;

/* fn processes items [begin, end); tid is in [0, sl_pool_size()). */
typedef void (*sl_pool_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* n_threads <= 0: the number of online cores (or SLUICE_THREADS when set). NULL on failure. */
sl_pool *sl_pool_create(int n_threads);
void sl_pool_destroy(sl_pool *p);
int sl_pool_size(const sl_pool *p);

/* Splits [0, n) into chunks of at least `grain` items and runs them on all threads; returns when done. */
void sl_pool_for(sl_pool *p, int64_t n, int64_t grain, sl_pool_fn fn, void *ctx);

#endif
