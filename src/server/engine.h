/* The model a server runs and the worker that runs it: continuous batching. Up to `parallel` requests
 * generate at once, each in a sequence of one session (a request for n choices in n sequences, which
 * read its prompt once: see start_job); every step is one forward pass over the next token of each
 * decoding sequence and a chunk of a prompt being read, so a long prompt holds the others up for one
 * chunk at most. New requests join between steps; a request whose client goes frees its sequences at the
 * next step. Beyond `parallel`, requests wait in a bounded FIFO queue (503 when full).
 *
 * Finished conversations stay in their sequences (the session has more sequences than `parallel`) until
 * their pages are needed: a request continuing any of them, or sharing a prefix with a running one,
 * resumes from the cached state instead of reading its prompt again. */
#ifndef SLUICE_SERVER_ENGINE_H
#define SLUICE_SERVER_ENGINE_H

#include <pthread.h>
#include <stdint.h>

#include "experts/store.h"
#include "models/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "server/buf.h"
#include "server/job.h"
#include "text/jinja.h"
#include "text/tokenizer.h"
#include "text/toolcall.h"

typedef struct sv_engine_opts {
    const char *model;   /* directory or Hub repo id */
    const char *alias;   /* name the APIs report; default: the model argument */
    int ctx;             /* <= 0: sl_session_default_ctx */
    int threads;         /* <= 0: all cores */
    const char *backend; /* cpu, cuda or auto; NULL: SLUICE_BACKEND, else auto */
    sl_model_opts mo;    /* expert streaming: --vram, --ram, --io */
    int queue;           /* waiting requests before 503 */
    int parallel;        /* requests generated at once; <= 0: from memory (what fits at the context) */
    int64_t kv_bytes;    /* the KV cache pool; <= 0: from free memory */
    int timing;          /* log each generation's phase times (and expert store figures) to stderr */
} sv_engine_opts;

/* Counters for /metrics, guarded by the engine's lock. */
typedef struct sv_metrics {
    unsigned long long requests[4]; /* by API: openai, anthropic, ollama, other */
    unsigned long long errors;      /* 4xx and 5xx responses */
    unsigned long long rejected;    /* 503: queue full */
    unsigned long long generations, cancelled, failed;
    unsigned long long prompt_tokens, cached_tokens, generated_tokens, prefix_hits;
    double prefill_s, decode_s;
    double last_prefill_tps, last_decode_tps;
    unsigned long long steps, step_tokens, step_seqs; /* forward passes, and their tokens and sequences */
    int last_batch;                                   /* sequences in the latest step */
    int kv_free, kv_total;                            /* KV pages */
    int streaming;                                    /* the model streams its experts: xs holds the store's counters */
    sl_store_stats xs;                                /* as of the end of the last generation */
} sv_metrics;

typedef struct sv_engine {
    /* fixed once loaded; read by every connection thread */
    char *dir, *name;
    sl_model *m;
    sl_tokenizer *tok;
    sl_jinja *tmpl; /* NULL: the model has no chat template */
    char *tmpl_src;
    sl_tc_format tc_fmt;        /* the markup of reasoning and tool calls in the model's output */
    sl_sampler_params defaults; /* the checkpoint's sampling defaults */
    int ctx;
    int timing;          /* sv_engine_opts.timing */
    double load_s;       /* resolving the model to ready */
    double model_load_s; /* sl_model_load alone */
    long long loaded_at; /* unix seconds */

    sl_session *s;       /* the worker's */
    int parallel;        /* sequences generated at once */
    struct sv_run *runs; /* [parallel], the worker's */
    sl_gvocab *gv;       /* the worker's: the vocabulary's trie, built at the first grammar-constrained request */

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    int ready, stopping, busy; /* busy: requests generating */
    sv_job **q;
    int q_cap, q_head, q_len;
    uint64_t seed_state;
    sv_metrics met;
    pthread_t worker;
    int worker_started;
} sv_engine;

int sv_engine_init(sv_engine *g, int queue_cap, sl_err *e);
/* Loads tokenizer, model, chat template and session (the one place a server loads a model), then starts
 * the worker and marks the engine ready. */
int sv_engine_load(sv_engine *g, const sv_engine_opts *o, sl_err *e);
int sv_engine_ready(sv_engine *g);
/* Queues a job (the engine takes its own reference). -1 when the queue is full or the engine stopping. */
int sv_engine_submit(sv_engine *g, sv_job *j);
/* A fresh seed for requests that give none. */
uint64_t sv_engine_seed(sv_engine *g);
/* Stops the worker after the current job; queued jobs end as cancelled. */
void sv_engine_shutdown(sv_engine *g);
void sv_engine_free(sv_engine *g);
/* Prometheus text exposition of the counters. */
void sv_engine_metrics(sv_engine *g, sv_buf *out);

#endif
