/* One generation request as it travels from the connection thread that parsed it to the engine's worker
 * and back: the prompt ids and sampling settings in, wire-formatted output bytes out.
 *
 * The worker turns generated text into events (content, reasoning, tool calls) and hands them to the
 * API's writer, which appends the bytes to `out`; the connection thread streams `out` as it grows, or
 * waits for `done` and sends it whole. Both sides hold a reference; the last release frees the job.
 *
 * A request for n choices (OpenAI `n`) is n jobs: the one the connection holds is choice 0 and owns the
 * others (`more`), which borrow its prompt, tools and grammar. To the worker each choice is a generation of
 * its own (a sequence, sampling with its own seed, stop strings, output parsing, progress); all of them
 * write into choice 0's `out` under choice 0's lock, and the request is done when the last one ends. */
#ifndef SLUICE_SERVER_JOB_H
#define SLUICE_SERVER_JOB_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "runtime/generate.h"
#include "server/buf.h"
#include "text/toolcall.h"

#define SV_MAX_STOPS 16
#define SV_MAX_CHOICES 16 /* n per request at most (and at most the server's --parallel) */

typedef struct sv_job sv_job;

/* How one API puts a generation on the wire. Called on the worker thread with the lock of the job's lead
 * held, with the choice the call is about (the lead itself when n is 1). */
typedef struct sv_writer {
    void (*begin)(sv_job *j);                        /* before the first event (stats: prompt and cached counts) */
    void (*event)(sv_job *j, const sl_tc_event *ev); /* content, reasoning or tool-call piece */
    void (*finish)(sv_job *j); /* this choice is over (the request too when lead->open is 0): final chunk, or body */
    void (*fail)(sv_job *j, const char *msg); /* generation failed after it was accepted; once per request */
} sv_writer;

/* A tool call as it is parsed, kept for the final response and for the streaming indices. */
typedef struct sv_tool {
    char id[40];
    char *name;
    sv_buf args;
} sv_tool;

struct sv_job {
    const sv_writer *w;
    /* request */
    int32_t *ids;
    int n_ids;
    sl_gen_params gen;
    char *stops[SV_MAX_STOPS];
    int stream, include_usage;
    int parse_output;        /* split reasoning / tool calls out of the text (chat endpoints) */
    int starts_in_reasoning; /* the prompt opened a <think> block */
    json_t *tools;           /* OpenAI-style tool list for the parser, may be NULL */
    char *force_tool;        /* tool_choice that forces a call: "" any tool, else the function name */
    char *forced;            /* the call's opening the prompt ends with; the parser sees it before the output */
    sl_grammar *grammar;     /* constrains the output (gen.grammar points here); NULL: free text */
    json_t *extra;           /* API-specific settings the writer reads (model name, ...) */
    char id[48];
    char route[64];          /* "POST /v1/chat/completions", for the --timing log */
    const char *tool_prefix; /* id prefix of parsed tool calls ("call_" when NULL) */
    long long created;       /* unix seconds */
    double t_received, t_started;

    /* progress, written by the worker */
    sl_gen_stats st;
    int began;
    int failed; /* lead: a choice failed, and with it the request */
    sv_buf content, reasoning;
    sv_tool *tool_calls;
    int n_tools, cap_tools;
    int block, block_kind; /* current streamed block (Anthropic index / kind) */

    /* logprobs, when the request asks for them (sv_job_want_logprobs): one entry per generated token in the
     * shape OpenAI chat and Ollama share ({token, logprob, bytes, top_logprobs}); [0, lp_sent) are written */
    const sl_tokenizer *lp_tok;
    json_t *logprobs;
    size_t lp_sent;

    /* work other than a generation (embeddings): when run is set the worker calls it instead of generating,
     * on its session, and run writes the whole response into out (and status); run_free frees run_data */
    void (*run)(sv_job *j, sl_session *s);
    void *run_data;
    void (*run_free)(void *data);
    int seq; /* the session's sequence run may use */

    /* choices (see the top): lead is choice 0, itself for choice 0 */
    sv_job *lead;
    int index;     /* this choice's */
    int n_choices; /* lead: choices asked for (1 unless n says more) */
    sv_job **more; /* lead: choices 1 .. n_choices - 1 */
    int open;      /* lead: choices not ended yet (under mu) */

    /* output, shared with the connection thread under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sv_buf out;
    int status; /* HTTP status of a whole (non-streamed) body */
    int done, cancelled, refs;
};

sv_job *sv_job_new(void);
/* Drops one reference; frees the job with the last. */
void sv_job_release(sv_job *j);
/* Creates choices 1 .. n - 1 of a request whose settings are complete (call last, before queueing it):
 * each copies choice 0's, with a seed derived from choice 0's (different per choice, and the same for the
 * same request). -1 when out of memory. */
int sv_job_add_choices(sv_job *j, int n);
/* Choice i of a request (0: the lead itself). */
sv_job *sv_job_choice(sv_job *lead, int i);
/* Appends bytes for the connection to the lead's out (its lock held by the caller on the worker side). */
void sv_job_emit(sv_job *j, const char *s, size_t n);
/* Appends one Server-Sent Event: optional `event:` line, then `data:` with the compact JSON of v (decref'd). */
void sv_job_sse(sv_job *j, const char *event, json_t *v);
/* Appends one NDJSON line (v decref'd). */
void sv_job_ndjson(sv_job *j, json_t *v);
/* Asks the generation for logprobs with top alternatives per token (0-20), collected into j->logprobs. */
int sv_job_want_logprobs(sv_job *j, const sl_tokenizer *tok, int top);
/* The entries not yet written (a new array, possibly empty), marking them written; NULL when logprobs are
 * off. Lock held. */
json_t *sv_job_logprobs_take(sv_job *j);
/* The JSON of one token's text: its bytes as UTF-8, invalid sequences as U+FFFD (bytes keep them exact). */
json_t *sv_token_text(const char *b, size_t n);

/* Records a parsed tool call start (name) and returns its slot; NULL on OOM. */
sv_tool *sv_job_tool_start(sv_job *j, const char *name, size_t len);

#endif
