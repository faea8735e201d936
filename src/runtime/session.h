/* A session is the state of up to n_seqs sequences (conversations) on a model, and the scratch of one
 * batch: one forward pass runs tokens of many sequences at once (sl_session_decode).
 *
 * Memory: the session is a container of per-sequence state, laid out by each layer's kind
 * (models/kinds.h) and opaque to it. State that grows with the position (attention's keys and values) lives
 * in pools of pages per layer (SL_KV_PAGE positions a page), shared by all sequences. A sequence holds a
 * page table, grown on demand; pages are reference-counted, so sequences with a common prefix share its
 * whole pages (sl_session_seq_share) and a shared page is copied before it is written (copy on write).
 * State of fixed size (the delta-net's conv window and recurrent state) has one slot per sequence, plus
 * snapshots at earlier positions, since it cannot be rewound.
 *
 * A sequence that is not in use keeps its pages as a cache of its conversation: a later request with the
 * same prefix resumes there. When the pool runs out, the least recently used idle sequences give theirs
 * back (sl_session_seq_set_idle marks them; active ones are never evicted).
 *
 * The single-sequence calls (sl_session_forward and friends) work on sequence 0. */
#ifndef SLUICE_RUNTIME_SESSION_H
#define SLUICE_RUNTIME_SESSION_H

#include <stdint.h>

#include "models/model.h"

/* Positions per KV page. */
#define SL_KV_PAGE 32

/* Activation buffers for up to max_batch tokens (backend memory): the layer loop's, and each kind's
 * (allocated for the kinds the model uses). */
struct sl_scratch {
    float *x, *xn;  /* the residual stream and its normed copy */
    float *mix_out; /* a layer's mixer output */
    float *ffn_out; /* a layer's feed-forward output, added in by the next layer */
    sl_attn_scratch attn;
    sl_deltanet_scratch dn;
    sl_mlp_scratch mlp;
    sl_moe_scratch moe;
    float *logits;
};

/* The state of one layer: its kind's layout, the paged caches [n_pages * SL_KV_PAGE][lay.row] (rows of
 * row_bytes: lay.row values of the session's KV type, or float32) and the fixed buffers of every sequence
 * slot [n_seqs][lay.fixed[i]]. */
typedef struct sl_layer_state {
    sl_state_layout lay;
    size_t row_bytes;
    void *paged[SL_STATE_BUFS];
    float *fixed[SL_STATE_BUFS];
} sl_layer_state;

/* Fixed state (every layer's fixed buffers) saved at one position, in backend memory. Valid while
 * hist[0, pos) is unchanged: a rewind below pos drops it. */
typedef struct sl_snapshot {
    int pos;                 /* -1: slot unused */
    unsigned long long used; /* recency, for eviction */
    float **fixed;           /* [n_layers * SL_STATE_BUFS], NULL where a layer keeps none */
} sl_snapshot;

#define SL_MAX_SNAPSHOTS 4

typedef struct sl_seq {
    int pos;                 /* tokens fed */
    int32_t *hist;           /* the ids at positions [0, pos), for prefix reuse */
    int n_pages;             /* pages in its table (positions [0, n_pages * SL_KV_PAGE) have rows) */
    int idle;                /* not in use: its pages may be taken back */
    unsigned long long used; /* recency, for choosing which idle sequence to evict */
    sl_snapshot snaps[SL_MAX_SNAPSHOTS];
    unsigned long long snap_clock;
} sl_seq;

/* One contiguous run of a batch: tokens [start, start + len) of sequence seq. */
typedef struct sl_run {
    int start, len, seq;
} sl_run;

/* A recorded decode step (see the backend's step_begin) and the sequence slots it was recorded for. */
typedef struct sl_step_rec {
    void *rec;
    int n;
    int32_t *seqs; /* [n] */
    unsigned long long used;
} sl_step_rec;

#define SL_STEP_RECS 8

typedef struct sl_session_opts {
    int max_ctx;   /* per sequence; <= 0: the model's max_position_embeddings */
    int n_seqs;    /* sequence slots; <= 0: 1 */
    int kv_tokens; /* positions in the KV pool; <= 0: room for every slot's whole context */
    int max_batch; /* tokens per forward pass; <= 0: 512 */
    /* element type of the attention caches; SL_KV_AUTO: the model's (sl_model_kv_type). Latent attention's
     * cache stays float32 whatever it is. */
    sl_kv_type kv_type;
} sl_session_opts;

struct sl_session {
    sl_model *m;
    int max_ctx, max_batch, n_seqs;
    sl_kv_type kv_type; /* of the attention caches (resolved: never SL_KV_AUTO) */
    int recurrent;      /* has fixed per-sequence state (delta-net layers), which cannot be rewound */
    sl_seq *seqs;
    unsigned long long clock;
    sl_layer_state *state; /* per layer */
    int n_pages, max_pages;
    int32_t *pt;       /* [n_seqs * max_pages] page tables (host) */
    int32_t *pt_dev;   /* the same in backend memory */
    uint8_t *pt_dirty; /* per slot: its table changed since the last upload */
    int *page_ref;     /* sequences holding each page */
    int32_t *free_pages;
    int n_free;
    sl_scratch s;
    int logit_cap;    /* rows s.logits holds */
    int32_t *row_pos; /* [logit_cap] the position of each logits row's token, for error messages */
    /* host scratch of one forward pass, so a step allocates nothing: sequences of the batch [n_seqs], rows
     * wanting logits [max_batch], one sequence's column of slot ids [max_batch] */
    uint8_t *busy;
    int *want_idx;
    int32_t *seq_fill;
    /* the batch being run: its map (pos and seq in backend memory) and its runs */
    sl_batch_map bm;
    int32_t *bm_pos, *bm_seq; /* backend memory [max_batch] */
    int32_t *h_pos, *h_seq;   /* host [max_batch] */
    sl_run *runs;
    int n_runs;
    sl_step_rec recs[SL_STEP_RECS];
    /* an expert store's device steps (experts/store.h): the fixed state of the step's sequences saved
     * before it, [redo_seqs][every layer's fixed buffers], backend memory */
    float *redo;
    int redo_seqs;
    void **bufs; /* everything allocated from the backend, for freeing */
    int n_bufs, cap_bufs;
    int logit_row; /* sequence 0's calls: the row of s.logits holding the last fed token's logits, -1: none */
};

/* Fixed state buffer i of layer l for sequence slot q. */
static inline float *sl_session_fixed(const sl_session *s, int l, int i, int q) {
    return s->state[l].fixed[i] + (size_t)q * s->state[l].lay.fixed[i];
}

/* max_ctx <= 0: the model's max_position_embeddings. One sequence. */
int sl_session_create(sl_model *m, int max_ctx, sl_session **out, sl_err *e);
int sl_session_create_opts(sl_model *m, const sl_session_opts *o, sl_session **out, sl_err *e);
void sl_session_free(sl_session *s);

/* --- many sequences -------------------------------------------------------------------------------- */

/* A forward pass over tokens of several sequences: token i is ids[i] of sequence seq[i] at that
 * sequence's next position. The tokens of one sequence are consecutive and each sequence appears once.
 * want[i] != 0 asks for token i's logits (NULL: none); they land in rows 0.. of the session's logits, in
 * batch order, at most logit_cap rows, read with sl_session_row_logits / sl_session_row_argmax. n <=
 * max_batch. On failure the sequences of the batch are reset (their state took part of it). */
typedef struct sl_batch {
    int n;
    const int32_t *ids, *seq;
    const uint8_t *want;
} sl_batch;
int sl_session_decode(sl_session *s, const sl_batch *b, sl_err *e);
/* Row r of the latest decode's logits into host memory [vocab]. */
int sl_session_row_logits(sl_session *s, int r, float *logits, sl_err *e);
/* The ids of the largest logit of rows [0, n) (as the backend's argmax). */
int sl_session_rows_argmax(sl_session *s, int n, int32_t *ids, sl_err *e);

/* Back to position 0 with no pages and zero recurrent state. */
void sl_session_seq_reset(sl_session *s, int seq);
/* Marks a sequence idle (its pages may be taken back when memory runs out) or in use. */
void sl_session_seq_set_idle(sl_session *s, int seq, int idle);
/* Goes back to the furthest position <= pos that sequence seq can resume from and returns it (see
 * sl_session_restore). */
int sl_session_seq_restore(sl_session *s, int seq, int pos);
/* Saves the recurrent state of seq at its position (see sl_session_snapshot). */
int sl_session_seq_snapshot(sl_session *s, int seq, sl_err *e);
/* How many leading ids of p[0, n) sequence seq already holds: the prefix a request can reuse there. */
int sl_session_seq_common(const sl_session *s, int seq, const int32_t *p, int n);
/* Resets dst, then gives it src's first whole pages up to k positions (shared, not copied) and their
 * ids; returns the positions dst now holds (a multiple of SL_KV_PAGE, <= k). Attention-only models: the
 * recurrent state of a hybrid model cannot be shared, and 0 is returned for them. */
int sl_session_seq_share(sl_session *s, int dst, int src, int k);
/* Resets dst, then makes it a copy of src as it stands: all of src's pages, the last partial one included,
 * shared (either side copies a shared page before writing into it), its ids and, on hybrid models, its
 * recurrent state (copied). Returns the positions dst holds (src's). Several continuations of one prompt
 * (the server's n choices) read it once. */
int sl_session_seq_fork(sl_session *s, int dst, int src);
/* Pages free in the pool, and in all. */
void sl_session_pages(const sl_session *s, int *free_pages, int *total);

/* --- one sequence (sequence 0) --------------------------------------------------------------------- */

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

/* Tokens fed to sequence 0. */
int sl_session_pos(const sl_session *s);

/* A context length that fits: the model's own, halved until the KV cache of type kt (SL_KV_AUTO: the
 * model's) takes at most a quarter of the available memory (never below 2048 or above the model's). */
int sl_session_default_ctx(const sl_model *m, sl_kv_type kt);
/* Bytes of KV cache one position of one sequence takes with attention caches of type kt (SL_KV_AUTO: the
 * model's). */
size_t sl_session_kv_bytes_per_token(const sl_model *m, sl_kv_type kt);

/* Feeds n tokens from the current position. logits (host memory) receives [n][vocab] when all_logits,
 * else the last token's [vocab]; it may be NULL when no logits are wanted. */
int sl_session_forward(sl_session *s, const int32_t *ids, int n, float *logits, int all_logits, sl_err *e);
/* sl_session_forward for greedy decoding: *next receives the id of the last token's largest logit (NaN
 * counts as -inf, the lowest id among equals; -1 when no logit is above -inf). The logits stay on the
 * backend, which picks the id. */
int sl_session_forward_argmax(sl_session *s, const int32_t *ids, int n, int32_t *next, sl_err *e);
/* Copies the logits [vocab] of the last token the latest forward computed them for into host memory. */
int sl_session_last_logits(sl_session *s, float *logits, sl_err *e);
/* Feeds n tokens to sequence seq like sl_session_forward, but instead of logits writes the final-norm
 * hidden state (the input of the LM head, [hidden] floats a row) into out (host memory): every token's
 * row when all_rows, else the last token's only. For embedding models (last-token pooling). */
int sl_session_seq_hidden(sl_session *s, int seq, const int32_t *ids, int n, float *out, int all_rows, sl_err *e);
/* sl_session_seq_hidden on sequence 0. */
int sl_session_hidden(sl_session *s, const int32_t *ids, int n, float *out, int all_rows, sl_err *e);

#endif
