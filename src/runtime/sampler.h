/* Token sampler: penalties, top-k, temperature softmax, top-p, min-p, then a seeded draw.
 *
 * The chain runs in this order: penalties -> top-k -> softmax(logit / temperature) -> top-p -> min-p ->
 * draw. Temperature is applied before top-p and min-p, so both act on the tempered distribution.
 *
 * Non-finite logits: NaN counts as -inf. Tokens at -inf are never picked. When some logits are +inf the
 * draw is uniform among those tokens (greedy takes the lowest id). When no token is finite or +inf,
 * sampling returns -1; callers must treat that as "no token" and end the request. */
#ifndef SLUICE_RUNTIME_SAMPLER_H
#define SLUICE_RUNTIME_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temperature;       /* <= 0: greedy (argmax after penalties) */
    int top_k;               /* <= 0: off */
    float top_p;             /* >= 1: off; keeps the fewest most likely tokens whose mass reaches top_p */
    float min_p;             /* <= 0: off; drops tokens with p < min_p * p_max */
    float repeat_penalty;    /* 1 (or <= 0): off; logit > 0 ? logit / r : logit * r (llama.cpp) */
    int repeat_last_n;       /* window of recent tokens that all three penalties look at; -1: whole history, 0: none */
    float presence_penalty;  /* logit -= presence when the token occurs in the window (OpenAI) */
    float frequency_penalty; /* logit -= frequency * occurrences in the window (OpenAI) */
    uint64_t seed;           /* same seed + same inputs -> same tokens */
} sl_sampler_params;

/* llama.cpp defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1 (off),
 * repeat_last_n 64, presence and frequency 0, seed 0. Set temperature to 0 for greedy decoding. */
void sl_sampler_params_default(sl_sampler_params *p);

typedef struct sl_sampler sl_sampler;

/* Copies p. Allocates all scratch here (about 20 bytes per vocabulary entry). NULL on bad arguments or OOM. */
sl_sampler *sl_sampler_create(const sl_sampler_params *p, int vocab_size);
void sl_sampler_free(sl_sampler *s);

/* Starts a new request: clears the penalty history and reseeds the generator. */
void sl_sampler_reset(sl_sampler *s, uint64_t seed);

/* Adds a token to the penalty history (prompt tokens too, if the caller wants them penalised).
 * Ids outside the vocabulary are ignored. Allocates nothing. */
void sl_sampler_accept(sl_sampler *s, int32_t token);

/* Applies the repetition, presence and frequency penalties in place to a caller-owned array of
 * vocab_size logits (the first step of sl_sampler_sample, exposed for logprobs and tests). */
void sl_sampler_apply_penalties(const sl_sampler *s, float *logits);

/* 1 when sampling is the plain argmax of the logits (temperature <= 0, no penalty in effect), which a
 * backend can pick without the logits leaving it (sl_session_forward_argmax). */
int sl_sampler_plain_greedy(const sl_sampler *s);

/* Picks the next token from vocab_size logits. Leaves logits unchanged and allocates nothing.
 * Returns -1 when no token is eligible (see the header comment). Does not call accept. */
int32_t sl_sampler_sample(sl_sampler *s, const float *logits);

/* Log-probabilities reported with a generated token (OpenAI / Ollama logprobs). They are those of the
 * model's own distribution: log-softmax of the raw logits, before penalties, temperature, top-k/p and
 * min-p, as OpenAI reports them (the same whatever the temperature). */
#define SL_MAX_TOP_LOGPROBS 20
typedef struct sl_logprobs {
    int32_t id;    /* the chosen token */
    float logprob; /* its log-probability */
    int n_top;     /* alternatives below, most likely first (ties: lower id first) */
    int32_t top_ids[SL_MAX_TOP_LOGPROBS];
    float top_logprobs[SL_MAX_TOP_LOGPROBS];
} sl_logprobs;

/* Fills out for token `chosen` and the top_n (clamped to [0, SL_MAX_TOP_LOGPROBS]) most likely tokens of
 * vocab_size logits; the softmax sums in double. NaN counts as -inf; a token at -inf gets -inf. */
void sl_logprobs_compute(const float *logits, int vocab_size, int32_t chosen, int top_n, sl_logprobs *out);

#endif
