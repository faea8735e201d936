/* sluice bench --parallel: aggregate prefill and decode rates of many sequences run at once. */
#ifndef SLUICE_CLI_BENCH_PARALLEL_H
#define SLUICE_CLI_BENCH_PARALLEL_H

#include "models/model.h"

typedef struct sl_bench_par {
    int n;                          /* sequences */
    double prefill_s, decode_s;     /* best of the runs */
    double prefill_tps, decode_tps; /* tokens of all sequences per second */
    double bytes_per_token;         /* streamed experts: bytes read per generated token */
} sl_bench_par;

/* For each of the count sequence counts ns[k]: the best of runs runs (prompt tokens per sequence, then gen
 * decode steps) into out[k]. With warmup, an untimed run of each count (its prompt, two decode steps) comes
 * first, so that one-time costs (kernels loaded on first use, scratch sized, steps recorded) stay out. */
int sl_bench_parallel(sl_model *m, const int *ns, int count, int prompt, int gen, int runs, int warmup,
                      sl_bench_par *out, sl_err *e);
/* A table of the results. */
void sl_bench_parallel_print(const sl_model *m, const sl_bench_par *r, int count, int prompt, int gen);

#endif
