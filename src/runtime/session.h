/* A session is one conversation's state on a model: KV caches of the attention layers, conv and
 * recurrent state of the delta-net layers, the position, and the scratch activations of one batch. */
#ifndef SLUICE_RUNTIME_SESSION_H
#define SLUICE_RUNTIME_SESSION_H

#include <stdint.h>

#include "models/model.h"

/* Activation buffers for up to max_batch tokens (backend memory). */
typedef struct sl_scratch {
    float *x, *xn, *qraw, *q, *gate, *k, *v, *att; /* attention */
    float *qkv, *conv, *z, *a, *b, *lin;           /* delta-net */
    float *ff_g, *ff_u, *ff_o;                     /* dense / shared-expert MLP */
    float *router, *moe_w, *moe_out, *sh_gate;     /* MoE */
    int32_t *moe_ids;
    float *logits;
} sl_scratch;

/* Recurrent state (conv and delta-net state of every delta-net layer) saved at one position, in backend
 * memory. Valid while hist[0, pos) is unchanged: a rewind below pos drops it. */
typedef struct sl_snapshot {
    int pos;                 /* -1: slot unused */
    unsigned long long used; /* recency, for eviction */
    float **conv, **ssm;     /* per layer, NULL for attention layers */
} sl_snapshot;

#define SL_MAX_SNAPSHOTS 4

struct sl_session {
    sl_model *m;
    int max_ctx, max_batch;
    int pos;
    int32_t *hist;       /* the ids at positions [0, pos), for prefix reuse */
    int recurrent;       /* has delta-net layers, whose state cannot be rewound */
    float **kc, **vc;    /* per layer, NULL for delta-net layers */
    float **conv, **ssm; /* per layer, NULL for attention layers */
    sl_scratch s;
    sl_snapshot snaps[SL_MAX_SNAPSHOTS]; /* recurrent models only */
    unsigned long long snap_clock;
    void **bufs; /* everything allocated from the backend, for freeing */
    int n_bufs;
    void *step;    /* the backend's recording of a one-token step (see step_begin), NULL until the first */
    int logit_row; /* the row of s.logits holding the last fed token's logits, -1 when none was computed */
};

/* max_ctx <= 0: the model's max_position_embeddings. */
int sl_session_create(sl_model *m, int max_ctx, sl_session **out, sl_err *e);
void sl_session_free(sl_session *s);
/* Back to position 0 with empty caches and zero recurrent state. */
void sl_session_reset(sl_session *s);

/* Moves the position back to pos (< current) so later tokens overwrite the cache from there. Returns -1
 * when the model keeps recurrent state, which cannot be rewound: reset and feed again instead. */
int sl_session_rewind(sl_session *s, int pos);

/* Saves the recurrent state at the current position into a snapshot slot (the least recently used one
 * when all are taken), so a later request can resume from here. No-op without recurrent state. */
int sl_session_snapshot(sl_session *s, sl_err *e);

/* Goes back to the furthest position <= pos the session can resume from, and returns it: pos itself for
 * attention-only models, else the latest snapshot at or below pos (0 after a reset when none is). */
int sl_session_restore(sl_session *s, int pos);

/* A context length that fits: the model's own, halved until the KV cache takes at most a quarter of
 * the available memory (never below 2048 or above the model's). */
int sl_session_default_ctx(const sl_model *m);

/* Feeds n tokens from the current position. logits (host memory) receives [n][vocab] when all_logits,
 * else the last token's [vocab]; it may be NULL when no logits are wanted. */
int sl_session_forward(sl_session *s, const int32_t *ids, int n, float *logits, int all_logits, sl_err *e);
/* sl_session_forward for greedy decoding: *next receives the id of the last token's largest logit (NaN
 * counts as -inf, the lowest id among equals; -1 when no logit is above -inf). The logits stay on the
 * backend, which picks the id. */
int sl_session_forward_argmax(sl_session *s, const int32_t *ids, int n, int32_t *next, sl_err *e);
/* Feeds n tokens from the current position like sl_session_forward, but instead of logits writes the
 * final-norm hidden state (the input of the LM head, [hidden] floats a row) into out (host memory): every
 * token's row when all_rows, else the last token's only. For embedding models (last-token pooling). */
int sl_session_hidden(sl_session *s, const int32_t *ids, int n, float *out, int all_rows, sl_err *e);
/* Copies the logits [vocab] of the last token the latest forward computed them for into host memory. */
int sl_session_last_logits(sl_session *s, float *logits, sl_err *e);

#endif
