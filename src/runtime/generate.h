/* The generation loop shared by `sluice run` and the server: reuse the cached prefix, prefill the rest
 * of the prompt, then sample, detokenise, apply stop strings and stream text until an end-of-generation
 * token, a stop string, the token limit or the context end. */
#ifndef SLUICE_RUNTIME_GENERATE_H
#define SLUICE_RUNTIME_GENERATE_H

#include "experts/store.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

typedef struct sl_gen_params {
    sl_sampler_params sampling;
    int max_tokens;           /* <= 0: until end of generation or of the context */
    const char *const *stops; /* stop strings, never emitted */
    int n_stops;
    int ignore_eos;
    /* When set, called once per generated token (before its text is emitted; not for the end-of-generation
     * token) with its log-probability and the top_logprobs most likely alternatives (sampler.h). The
     * logits then come to the host even for greedy decoding. */
    void (*on_token)(void *ud, const sl_logprobs *lp);
    void *token_ud;
    int top_logprobs;
    /* NULL: free text. Else every token must continue a sentence of the grammar, end-of-generation comes
     * only where it can end, and generation stops once it is complete ("stop"). */
    const sl_grammar *grammar;
    /* With a grammar: the vocabulary's trie (sl_gvocab, immutable) built once by the caller and shared by
     * every generation; NULL: built for this one. */
    const sl_gvocab *gvocab;
    /* Special tokens whose text is emitted anyway (NULL-terminated, may be NULL): a chat format's markup
     * that an output parser must see (see sl_tc_format_tokens). */
    const char *const *keep_special;
} sl_gen_params;

typedef struct sl_gen_stats {
    int prompt_tokens, cached_tokens, generated_tokens;
    double prefill_s, decode_s;
    const char *finish_reason; /* "stop", "length" or "cancelled" */
    int stop_index;            /* which of p->stops ended the generation, -1 for none */
    /* When the model streams its experts: the store's counters of each phase (the store's own counters
     * keep running, for /metrics). Decode is filled only when the generation got that far. */
    int has_store;
    sl_store_stats store_prefill, store_decode;
} sl_gen_stats;

/* Called once per generated token with the text that became safe to show (possibly none, len 0), so a
 * caller can cancel between any two tokens by returning non-zero. */
typedef int (*sl_gen_emit_fn)(void *ud, const char *text, size_t len);

/* The checkpoint's own sampling defaults from generation_config.json (temperature, top_k, top_p, min_p,
 * repetition_penalty; do_sample false means greedy), on top of whatever p already holds. */
void sl_gen_defaults_from_model(const char *model_dir, sl_sampler_params *p);

int sl_generate(sl_session *s, const sl_tokenizer *tok, const int32_t *prompt, int n_prompt, const sl_gen_params *p,
                sl_gen_emit_fn emit, void *ud, sl_gen_stats *st, sl_err *e);

/* The per-sequence half of generation, for a loop that runs many sequences in one batch (the server):
 * sampling, end-of-generation tokens, detokenisation, stop strings and the token limit of one request.
 * sl_generate is this driven for one sequence. */
typedef struct sl_gen sl_gen;

/* The prompt's ids go into the penalty history. NULL-free: fails saying why. */
int sl_gen_create(const sl_tokenizer *tok, int vocab, const sl_gen_params *p, const int32_t *prompt, int n_prompt,
                  sl_gen **out, sl_err *e);
void sl_gen_free(sl_gen *g);
/* 1 when the next token is the plain argmax of the logits, which the backend can pick (pass it as greedy
 * to sl_gen_step, logits NULL); 0 when sl_gen_step needs the logits on the host. */
int sl_gen_greedy(const sl_gen *g);
/* One generated token: picks it from logits (or takes greedy; a grammar may mask logits on the way), and unless it ends
 * the generation (an end-of-generation token, a stop string, the token limit, or ctx_left == 0 positions left for it),
 * emits the text it completes and sets *next to feed. Returns 1 when the generation is over
 * (st->finish_reason says why; call sl_gen_finish), 0 to go on, -1 on failure. */
int sl_gen_step(sl_gen *g, float *logits, int32_t greedy, int ctx_left, sl_gen_emit_fn emit, void *ud, int32_t *next,
                sl_gen_stats *st, sl_err *e);
/* Emits what the detokeniser and the stop strings still hold (nothing for a cancelled generation) and
 * fills st->stop_index. */
int sl_gen_finish(sl_gen *g, sl_gen_emit_fn emit, void *ud, sl_gen_stats *st, sl_err *e);

#endif
