#include "runtime/session.h"

#include "runtime/finite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "experts/store.h"

#define MAX_BATCH 512
/* output rows computed at a time when they go straight to the host: keeps the logits scratch small for
 * large vocabularies */
#define LOGIT_ROWS 16

static void *balloc(sl_session *s, size_t bytes) {
    if (s->n_bufs == s->cap_bufs) {
        int cap = s->cap_bufs ? 2 * s->cap_bufs : 64;
        void **nb = realloc(s->bufs, (size_t)cap * sizeof *nb);
        if (!nb) return NULL;
        s->bufs = nb;
        s->cap_bufs = cap;
    }
    void *p = s->m->be->ops->alloc(s->m->be, bytes);
    if (p) s->bufs[s->n_bufs++] = p;
    return p;
}

static int imax(int a, int b) {
    return a > b ? a : b;
}

size_t sl_session_kv_bytes_per_token(const sl_model *m, sl_kv_type kt) {
    size_t bytes = 0;
    kt = sl_model_kv_type(m, kt);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        sl_state_layout st;
        sl_layer_layout(m, l, &st);
        bytes += (size_t)st.n_paged * sl_state_paged_row(&st, kt);
    }
    return bytes;
}

static void *scratch_alloc(void *ctx, size_t bytes) {
    return balloc(ctx, bytes);
}

/* The layer loop's buffers, then each kind's. */
static int alloc_scratch(sl_session *s) {
    const sl_model *m = s->m;
    const sl_config *c = &m->cfg;
    size_t B = (size_t)s->max_batch, H = (size_t)c->hidden;
    sl_scratch *x = &s->s;
    if (!(x->x = balloc(s, B * H * 4)) || !(x->xn = balloc(s, B * H * 4)) || !(x->mix_out = balloc(s, B * H * 4)) ||
        !(x->ffn_out = balloc(s, B * H * 4)) ||
        !(x->logits = balloc(s, (size_t)s->logit_cap * (size_t)c->vocab_size * 4)))
        return -1;
    const sl_kind *kinds[8];
    int nk = sl_model_kinds(m, kinds, 8);
    for (int i = 0; i < nk; i++)
        if (kinds[i]->scratch(m, s->max_batch, x, scratch_alloc, s)) return -1;
    return 0;
}

int sl_session_create_opts(sl_model *m, const sl_session_opts *o, sl_session **out, sl_err *e) {
    const sl_config *c = &m->cfg;
    int max_ctx = o->max_ctx > 0 ? o->max_ctx : c->max_pos;
    int n_seqs = o->n_seqs > 0 ? o->n_seqs : 1;
    sl_kv_type kt = sl_model_kv_type(m, o->kv_type);
    int q8_block = sl_ggml_block_size(SL_GGML_Q8_0);
    for (int l = 0; kt == SL_KV_Q8_0 && l < c->n_layers; l++) { /* each KV head's row starts on a block */
        sl_state_layout st;
        sl_layer_layout(m, l, &st);
        if (st.kv_typed && c->head_dim % q8_block)
            return sl_fail(e, "--kv-type q8_0 needs head_dim a multiple of %d (this model's: %d)", q8_block,
                           c->head_dim);
    }
    sl_session *s = calloc(1, sizeof *s);
    if (!s) return sl_fail(e, "out of memory");
    s->m = m;
    s->max_ctx = max_ctx;
    s->n_seqs = n_seqs;
    s->kv_type = kt;
    s->max_batch = o->max_batch > 0 ? (o->max_batch < MAX_BATCH ? o->max_batch : MAX_BATCH) : MAX_BATCH;
    s->logit_row = -1;
    s->logit_cap = imax(LOGIT_ROWS, imax(n_seqs, s->max_batch < 64 ? s->max_batch : 64));
    s->max_pages = (max_ctx + SL_KV_PAGE - 1) / SL_KV_PAGE;
    int64_t pages = o->kv_tokens > 0 ? ((int64_t)o->kv_tokens + SL_KV_PAGE - 1) / SL_KV_PAGE
                                     : (int64_t)n_seqs * s->max_pages; /* every sequence's whole context */
    if (pages < s->max_pages) pages = s->max_pages; /* one sequence can always reach its whole context */
    if (pages > INT32_MAX / SL_KV_PAGE) pages = INT32_MAX / SL_KV_PAGE;
    s->n_pages = (int)pages;
    int L = c->n_layers;
    s->state = calloc((size_t)L, sizeof *s->state);
    s->seqs = calloc((size_t)n_seqs, sizeof *s->seqs);
    s->pt = calloc((size_t)n_seqs * (size_t)s->max_pages, sizeof *s->pt);
    s->pt_dirty = calloc((size_t)n_seqs, 1);
    s->page_ref = calloc((size_t)s->n_pages, sizeof *s->page_ref);
    s->free_pages = malloc((size_t)s->n_pages * sizeof *s->free_pages);
    s->h_pos = calloc((size_t)s->max_batch, sizeof *s->h_pos);
    s->h_seq = calloc((size_t)s->max_batch, sizeof *s->h_seq);
    s->runs = calloc((size_t)s->max_batch, sizeof *s->runs);
    s->row_pos = calloc((size_t)s->logit_cap, sizeof *s->row_pos);
    s->busy = calloc((size_t)n_seqs, 1);
    s->want_idx = calloc((size_t)s->max_batch, sizeof *s->want_idx);
    s->seq_fill = calloc((size_t)s->max_batch, sizeof *s->seq_fill);
    if (!s->state || !s->seqs || !s->pt || !s->pt_dirty || !s->page_ref || !s->free_pages || !s->h_pos || !s->h_seq ||
        !s->runs || !s->row_pos || !s->busy || !s->want_idx || !s->seq_fill)
        goto oom;
    for (int i = 0; i < s->n_pages; i++) s->free_pages[i] = s->n_pages - 1 - i; /* page 0 is taken first */
    s->n_free = s->n_pages;
    for (int q = 0; q < n_seqs; q++) {
        sl_seq *sq = &s->seqs[q];
        if (!(sq->hist = calloc((size_t)max_ctx, sizeof *sq->hist))) goto oom;
        for (int i = 0; i < SL_MAX_SNAPSHOTS; i++) sq->snaps[i].pos = -1;
        sq->idle = 1;
    }
    /* each layer's state as its kind lays it out: pools of pages, fixed buffers per sequence slot (4 bytes
     * more, so an empty one is still an allocation) */
    for (int l = 0; l < L; l++) {
        sl_layer_state *ls = &s->state[l];
        sl_layer_layout(m, l, &ls->lay);
        ls->row_bytes = sl_state_paged_row(&ls->lay, s->kv_type);
        size_t pool = (size_t)s->n_pages * SL_KV_PAGE * ls->row_bytes;
        for (int i = 0; i < ls->lay.n_paged; i++)
            if (!(ls->paged[i] = balloc(s, pool))) goto oom;
        for (int i = 0; i < ls->lay.n_fixed; i++)
            if (!(ls->fixed[i] = balloc(s, ls->lay.fixed[i] * (size_t)n_seqs * 4 + 4))) goto oom;
        if (ls->lay.n_fixed) s->recurrent = 1;
    }
    if (!(s->pt_dev = balloc(s, (size_t)n_seqs * (size_t)s->max_pages * sizeof *s->pt_dev)) ||
        !(s->bm_pos = balloc(s, (size_t)s->max_batch * sizeof *s->bm_pos)) ||
        !(s->bm_seq = balloc(s, (size_t)s->max_batch * sizeof *s->bm_seq)) || alloc_scratch(s))
        goto oom;
    s->bm.pos = s->bm_pos;
    s->bm.seq = s->bm_seq;
    s->bm.pages = s->pt_dev;
    s->bm.page_size = SL_KV_PAGE;
    s->bm.max_pages = s->max_pages;
    s->bm.h_pos = s->h_pos;
    s->bm.h_seq = s->h_seq;
    s->seqs[0].idle = n_seqs == 1 ? 0 : 1;
    *out = s;
    return 0;
oom:
    sl_session_free(s);
    {
        char buf[32];
        return sl_fail(e,
                       "out of memory creating a session of %d sequence(s) with a %d-token context (KV cache %s "
                       "of %s for %lld positions)",
                       n_seqs, max_ctx,
                       sl_human_bytes((double)pages * SL_KV_PAGE * (double)sl_session_kv_bytes_per_token(m, o->kv_type),
                                      buf, sizeof buf),
                       sl_kv_type_name(sl_model_kv_type(m, o->kv_type)), (long long)pages * SL_KV_PAGE);
    }
}

int sl_session_create(sl_model *m, int max_ctx, sl_session **out, sl_err *e) {
    sl_session_opts o = {.max_ctx = max_ctx, .n_seqs = 1};
    return sl_session_create_opts(m, &o, out, e);
}

/* Frees every recorded decode step (their slot lists stay, for reuse). */
static void drop_recordings(sl_session *s) {
    for (int i = 0; i < SL_STEP_RECS; i++) {
        if (s->recs[i].rec) s->m->be->ops->step_free(s->m->be, s->recs[i].rec);
        s->recs[i].rec = NULL;
        s->recs[i].n = 0;
    }
}

void sl_session_free(sl_session *s) {
    if (!s) return;
    drop_recordings(s);
    for (int i = 0; i < SL_STEP_RECS; i++) free(s->recs[i].seqs);
    for (int i = 0; i < s->n_bufs; i++) s->m->be->ops->free(s->m->be, s->bufs[i]);
    if (s->redo) s->m->be->ops->free(s->m->be, s->redo);
    free(s->bufs);
    if (s->seqs) {
        for (int q = 0; q < s->n_seqs; q++) {
            free(s->seqs[q].hist);
            for (int i = 0; i < SL_MAX_SNAPSHOTS; i++) free(s->seqs[q].snaps[i].fixed);
        }
    }
    free(s->seqs);
    free(s->state);
    free(s->pt);
    free(s->pt_dirty);
    free(s->page_ref);
    free(s->free_pages);
    free(s->h_pos);
    free(s->h_seq);
    free(s->runs);
    free(s->row_pos);
    free(s->busy);
    free(s->want_idx);
    free(s->seq_fill);
    free(s);
}

/* --- pages ------------------------------------------------------------------------------------------ */

static int32_t *table(sl_session *s, int q) {
    return s->pt + (size_t)q * (size_t)s->max_pages;
}

static void page_put(sl_session *s, int32_t pg) {
    if (--s->page_ref[pg] == 0) s->free_pages[s->n_free++] = pg;
}

/* Drops sequence q's pages from index `from` on, the last first, so that the free stack hands them out
 * again in the order they were held (a sequence refilled after a reset lies in memory as it did). */
static void release_pages(sl_session *s, int q, int from) {
    sl_seq *sq = &s->seqs[q];
    int32_t *t = table(s, q);
    for (int i = sq->n_pages - 1; i >= from; i--) page_put(s, t[i]);
    if (from < sq->n_pages) {
        sq->n_pages = from;
        s->pt_dirty[q] = 1;
    }
}

void sl_session_pages(const sl_session *s, int *free_pages, int *total) {
    *free_pages = s->n_free;
    *total = s->n_pages;
}

/* A free page, taking one back from the least recently used idle sequence (not one of busy[]) when none
 * is free. -1 when every page is held by sequences in use. */
static int32_t page_get(sl_session *s, const uint8_t *busy) {
    while (s->n_free == 0) {
        int best = -1;
        for (int q = 0; q < s->n_seqs; q++) {
            sl_seq *sq = &s->seqs[q];
            if (!sq->idle || busy[q] || sq->n_pages == 0) continue;
            if (best < 0 || sq->used < s->seqs[best].used) best = q;
        }
        if (best < 0) return -1;
        sl_session_seq_reset(s, best);
    }
    int32_t pg = s->free_pages[--s->n_free];
    s->page_ref[pg] = 1;
    return pg;
}

_Static_assert(SL_KV_PAGE % 2 == 0, "pages of 16-bit elements are copied as float32 words");

/* Copies page src into page dst in every layer's pools, as float32 words whatever the element type (a
 * page of 16-bit elements has an even count: SL_KV_PAGE is; a page of q8_0 rows SL_KV_PAGE times a whole
 * number of 34-byte blocks). */
static void page_copy(sl_session *s, int32_t dst, int32_t src) {
    sl_backend *be = s->m->be;
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
        const sl_layer_state *ls = &s->state[l];
        size_t bytes = (size_t)SL_KV_PAGE * ls->row_bytes, w = bytes / sizeof(float);
        for (int i = 0; i < ls->lay.n_paged; i++) {
            char *pool = ls->paged[i];
            be->ops->copy_rows(be, (float *)(pool + (size_t)dst * bytes), (int)w,
                               (const float *)(pool + (size_t)src * bytes), (int)w, 1, (int)w);
        }
    }
}

/* Makes positions [pos, end) of sequence q writable: its own pages, allocated as needed, and a page it
 * shares copied first. */
static int reserve(sl_session *s, int q, int pos, int end, const uint8_t *busy, sl_err *e) {
    sl_seq *sq = &s->seqs[q];
    int32_t *t = table(s, q);
    int first = pos / SL_KV_PAGE, last = (end - 1) / SL_KV_PAGE;
    for (int i = first; i <= last && i < sq->n_pages; i++) {
        if (s->page_ref[t[i]] == 1) continue;
        int32_t pg = page_get(s, busy);
        if (pg < 0) goto full;
        page_copy(s, pg, t[i]);
        page_put(s, t[i]);
        t[i] = pg;
        s->pt_dirty[q] = 1;
    }
    while (sq->n_pages <= last) {
        int32_t pg = page_get(s, busy);
        if (pg < 0) goto full;
        t[sq->n_pages++] = pg;
        s->pt_dirty[q] = 1;
    }
    return 0;
full:
    return sl_fail(e,
                   "the KV cache is full: %d pages of %d positions are all held by sequences in use (raise the "
                   "KV cache size or run fewer sequences at once)",
                   s->n_pages, SL_KV_PAGE);
}

/* --- sequences -------------------------------------------------------------------------------------- */

void sl_session_seq_reset(sl_session *s, int q) {
    const sl_config *c = &s->m->cfg;
    sl_backend *be = s->m->be;
    sl_seq *sq = &s->seqs[q];
    for (int l = 0; l < c->n_layers; l++) {
        const sl_state_layout *lay = &s->state[l].lay;
        for (int i = 0; i < lay->n_fixed; i++)
            if (lay->fixed[i]) be->ops->zero(be, sl_session_fixed(s, l, i, q), lay->fixed[i] * 4);
    }
    release_pages(s, q, 0);
    sq->pos = 0;
    for (int i = 0; i < SL_MAX_SNAPSHOTS; i++) sq->snaps[i].pos = -1;
}

void sl_session_seq_set_idle(sl_session *s, int q, int idle) {
    s->seqs[q].idle = idle;
    s->seqs[q].used = ++s->clock;
}

/* Copies one state buffer with the backend's own row copy, so snapshots stay in backend memory. */
static void copy_state(sl_backend *be, float *dst, const float *src, size_t n) {
    while (n) {
        int w = n > (1u << 30) ? 1 << 30 : (int)n;
        be->ops->copy_rows(be, dst, w, src, w, 1, w);
        dst += w;
        src += w;
        n -= (size_t)w;
    }
}

int sl_session_seq_snapshot(sl_session *s, int q, sl_err *e) {
    if (!s->recurrent) return 0;
    const sl_config *c = &s->m->cfg;
    sl_backend *be = s->m->be;
    sl_seq *sq = &s->seqs[q];
    int L = c->n_layers, slot = -1;
    for (int i = 0; i < SL_MAX_SNAPSHOTS && slot < 0; i++)
        if (sq->snaps[i].pos == sq->pos) slot = i; /* already saved here: refresh */
    for (int i = 0; i < SL_MAX_SNAPSHOTS && slot < 0; i++)
        if (sq->snaps[i].pos < 0) slot = i;
    if (slot < 0) {
        slot = 0;
        for (int i = 1; i < SL_MAX_SNAPSHOTS; i++)
            if (sq->snaps[i].used < sq->snaps[slot].used) slot = i;
    }
    sl_snapshot *sn = &sq->snaps[slot];
    if (!sn->fixed) {
        if (!(sn->fixed = calloc((size_t)L * SL_STATE_BUFS, sizeof *sn->fixed)))
            return sl_fail(e, "out of memory for a state snapshot");
        for (int l = 0; l < L; l++)
            for (int i = 0; i < s->state[l].lay.n_fixed; i++)
                if (!(sn->fixed[l * SL_STATE_BUFS + i] = balloc(s, s->state[l].lay.fixed[i] * 4 + 4)))
                    return sl_fail(e, "out of backend memory for a state snapshot of layer %d", l);
    }
    for (int l = 0; l < L; l++)
        for (int i = 0; i < s->state[l].lay.n_fixed; i++)
            copy_state(be, sn->fixed[l * SL_STATE_BUFS + i], sl_session_fixed(s, l, i, q), s->state[l].lay.fixed[i]);
    sn->pos = sq->pos;
    sn->used = ++sq->snap_clock;
    return be->ops->check(be, e);
}

/* Moves sequence q back to position pos, dropping the pages past it. */
static void seq_truncate(sl_session *s, int q, int pos) {
    s->seqs[q].pos = pos;
    release_pages(s, q, (pos + SL_KV_PAGE - 1) / SL_KV_PAGE);
}

int sl_session_seq_restore(sl_session *s, int q, int pos) {
    sl_seq *sq = &s->seqs[q];
    if (pos < 0) pos = 0;
    if (pos >= sq->pos) return sq->pos;
    if (!s->recurrent) {
        seq_truncate(s, q, pos);
        return pos;
    }
    int best = -1;
    for (int i = 0; i < SL_MAX_SNAPSHOTS; i++)
        if (sq->snaps[i].pos >= 0 && sq->snaps[i].pos <= pos && (best < 0 || sq->snaps[i].pos > sq->snaps[best].pos))
            best = i;
    if (best < 0) {
        sl_session_seq_reset(s, q);
        return 0;
    }
    const sl_config *c = &s->m->cfg;
    sl_backend *be = s->m->be;
    sl_snapshot *sn = &sq->snaps[best];
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < s->state[l].lay.n_fixed; i++)
            copy_state(be, sl_session_fixed(s, l, i, q), sn->fixed[l * SL_STATE_BUFS + i], s->state[l].lay.fixed[i]);
    seq_truncate(s, q, sn->pos);
    sn->used = ++sq->snap_clock;
    /* later tokens overwrite hist from here, so snapshots past this point no longer describe it */
    for (int i = 0; i < SL_MAX_SNAPSHOTS; i++)
        if (sq->snaps[i].pos > sq->pos) sq->snaps[i].pos = -1;
    return sq->pos;
}

int sl_session_seq_common(const sl_session *s, int q, const int32_t *p, int n) {
    const sl_seq *sq = &s->seqs[q];
    int k = 0;
    while (k < sq->pos && k < n && sq->hist[k] == p[k]) k++;
    return k;
}

int sl_session_seq_share(sl_session *s, int dst, int src, int k) {
    if (dst == src) return 0;
    sl_session_seq_reset(s, dst);
    if (s->recurrent) return 0;
    sl_seq *a = &s->seqs[dst], *b = &s->seqs[src];
    if (k > b->pos) k = b->pos;
    int np = k / SL_KV_PAGE;
    int32_t *td = table(s, dst), *ts = table(s, src);
    for (int i = 0; i < np; i++) {
        td[i] = ts[i];
        s->page_ref[ts[i]]++;
    }
    a->n_pages = np;
    a->pos = np * SL_KV_PAGE;
    memcpy(a->hist, b->hist, (size_t)a->pos * sizeof *a->hist);
    s->pt_dirty[dst] = 1;
    return a->pos;
}

int sl_session_seq_fork(sl_session *s, int dst, int src) {
    if (dst == src) return s->seqs[src].pos;
    sl_session_seq_reset(s, dst);
    sl_seq *a = &s->seqs[dst], *b = &s->seqs[src];
    int32_t *td = table(s, dst), *ts = table(s, src);
    /* every page, the last partial one too: whichever side writes into a shared page copies it first */
    for (int i = 0; i < b->n_pages; i++) {
        td[i] = ts[i];
        s->page_ref[ts[i]]++;
    }
    a->n_pages = b->n_pages;
    a->pos = b->pos;
    memcpy(a->hist, b->hist, (size_t)a->pos * sizeof *a->hist);
    s->pt_dirty[dst] = 1;
    /* fixed per-sequence state (the delta-net's conv window and recurrent state) is copied whole */
    const sl_config *c = &s->m->cfg;
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < SL_STATE_BUFS; i++)
            if (s->state[l].lay.fixed[i])
                copy_state(s->m->be, sl_session_fixed(s, l, i, dst), sl_session_fixed(s, l, i, src),
                           s->state[l].lay.fixed[i]);
    return a->pos;
}

/* --- the forward pass ------------------------------------------------------------------------------- */

/* Checks a batch, makes room for it in the KV pool and fills the batch map and runs. */
static int prepare(sl_session *s, const sl_batch *b, sl_err *e) {
    const sl_config *c = &s->m->cfg;
    sl_backend *be = s->m->be;
    if (b->n < 1 || b->n > s->max_batch) return sl_fail(e, "a batch holds 1 to %d tokens, got %d", s->max_batch, b->n);
    uint8_t *busy = s->busy;
    memset(busy, 0, (size_t)s->n_seqs);
    int rc = -1;
    s->n_runs = 0;
    for (int i = 0; i < b->n; i++) {
        int q = b->seq[i];
        if (q < 0 || q >= s->n_seqs) {
            sl_fail(e, "batch token %d names sequence %d, outside [0, %d)", i, q, s->n_seqs);
            goto done;
        }
        if (b->ids[i] < 0 || b->ids[i] >= c->vocab_size) {
            sl_fail(e, "token id %d at position %d is outside the vocabulary [0, %d)", b->ids[i], i, c->vocab_size);
            goto done;
        }
        if (i == 0 || b->seq[i - 1] != q) {
            if (busy[q]) {
                sl_fail(e, "batch token %d: the tokens of sequence %d are not consecutive", i, q);
                goto done;
            }
            busy[q] = 1;
            s->runs[s->n_runs++] = (sl_run){.start = i, .len = 0, .seq = q};
        }
        s->runs[s->n_runs - 1].len++;
    }
    int span = 0;
    for (int r = 0; r < s->n_runs; r++) {
        sl_run *ru = &s->runs[r];
        sl_seq *sq = &s->seqs[ru->seq];
        if (sq->pos + ru->len > s->max_ctx) {
            sl_fail(e, "context overflow: %d tokens in the session + %d new exceed the context of %d", sq->pos, ru->len,
                    s->max_ctx);
            goto done;
        }
        if (reserve(s, ru->seq, sq->pos, sq->pos + ru->len, busy, e)) goto done;
        for (int j = 0; j < ru->len; j++) {
            s->h_pos[ru->start + j] = sq->pos + j;
            s->h_seq[ru->start + j] = ru->seq;
        }
        span = imax(span, sq->pos + ru->len);
        sq->used = ++s->clock;
    }
    for (int q = 0; q < s->n_seqs; q++) {
        if (!s->pt_dirty[q]) continue;
        size_t off = (size_t)q * (size_t)s->max_pages;
        be->ops->upload(be, s->pt_dev + off, s->pt + off, (size_t)s->seqs[q].n_pages * sizeof *s->pt);
        s->pt_dirty[q] = 0;
    }
    be->ops->upload(be, s->bm_pos, s->h_pos, (size_t)b->n * sizeof *s->h_pos);
    be->ops->upload(be, s->bm_seq, s->h_seq, (size_t)b->n * sizeof *s->h_seq);
    s->bm.n = b->n;
    s->bm.span = span;
    rc = 0;
done:
    return rc;
}

/* ---- device steps of an expert store: the state a step overwrites, saved before it ---- */

/* A device step's saved state at most (beyond, the step runs host-driven) */
#define REDO_MAX_BYTES ((size_t)1 << 30)

static size_t fixed_floats(const sl_session *s) {
    size_t f = 0;
    for (int l = 0; l < s->m->cfg.n_layers; l++)
        for (int i = 0; i < s->state[l].lay.n_fixed; i++) f += s->state[l].lay.fixed[i];
    return f;
}

/* Room to save the fixed state of n sequences (attention caches need none: a step run again rewrites the
 * same rows). -1 when it would take too much memory. */
static int redo_reserve(sl_session *s, int n) {
    if (!s->recurrent || n <= s->redo_seqs) return 0;
    sl_backend *be = s->m->be;
    size_t bytes = (size_t)n * fixed_floats(s) * sizeof(float);
    if (bytes > REDO_MAX_BYTES || (be->ops->mem_free && be->ops->mem_free(be) < bytes + ((size_t)256 << 20))) return -1;
    float *r = be->ops->alloc(be, bytes);
    if (!r) return -1;
    if (s->redo) {
        drop_recordings(s); /* they save into the old buffer */
        be->ops->free(be, s->redo);
    }
    s->redo = r;
    s->redo_seqs = n;
    return 0;
}

/* Saves (back 0) or restores (back 1) the fixed state of the batch's sequences. */
static void redo_copy(sl_session *s, int back) {
    sl_backend *be = s->m->be;
    float *r = s->redo;
    for (int j = 0; j < s->n_runs; j++)
        for (int l = 0; l < s->m->cfg.n_layers; l++)
            for (int i = 0; i < s->state[l].lay.n_fixed; i++) {
                size_t f = s->state[l].lay.fixed[i];
                float *st = sl_session_fixed(s, l, i, s->runs[j].seq);
                copy_state(be, back ? st : r, back ? r : st, f);
                r += f;
            }
}

/* The recording for a decode batch of these sequences: the same slots in the same order (hybrid models
 * bake each sequence's recurrent state into the recording), or just the same count (attention-only
 * models read everything per token from the batch map). Returns the entry to use, or with *fresh set a
 * new entry for a shape not seen before (recycling the least recently used one): such a batch runs once
 * unrecorded, so the backend sizes its scratch for it before a recording would need it. */
static sl_step_rec *step_slot(sl_session *s, const sl_batch *b, int *fresh) {
    sl_step_rec *lru = NULL;
    for (int i = 0; i < SL_STEP_RECS; i++) {
        sl_step_rec *r = &s->recs[i];
        if (r->n == b->n && (!s->recurrent || !memcmp(r->seqs, b->seq, (size_t)b->n * sizeof *b->seq))) {
            r->used = ++s->clock;
            *fresh = 0;
            return r;
        }
        /* an unused entry first, else the least recently used */
        if (!lru || (lru->n && (!r->n || r->used < lru->used))) lru = r;
    }
    if (lru->rec) s->m->be->ops->step_free(s->m->be, lru->rec);
    lru->rec = NULL;
    lru->n = 0;
    int32_t *ns = realloc(lru->seqs, (size_t)b->n * sizeof *ns);
    if (!ns) return NULL;
    lru->seqs = ns;
    memcpy(ns, b->seq, (size_t)b->n * sizeof *ns);
    lru->n = b->n;
    lru->used = ++s->clock;
    *fresh = 1;
    return lru;
}

/* The batch's layers and, for the rows in want (host, n_want of them, ascending), the logits: into
 * s.logits rows 0.. when host is NULL (n_want <= logit_cap), else chunk by chunk into host [n_want][V].
 * With hidden set, the final-norm hidden states of those rows go there [n_want][hidden] instead. */
static int run(sl_session *s, const sl_batch *b, const int *want, int n_want, float *host, float *hidden, sl_err *e) {
    sl_model *m = s->m;
    sl_backend *be = m->be;
    const sl_config *c = &m->cfg;
    sl_expert_store *st = m->store;
    size_t V = (size_t)c->vocab_size, H = (size_t)c->hidden;
    if (prepare(s, b, e)) return -1; /* nothing ran */
    int decode = s->n_runs == b->n && !hidden;
    /* streamed experts: a decode step runs on the device where its experts are likely all in slots, else
     * the host acts on each layer's routing */
    int dev = st && decode && sl_store_step_wants(st, b->n) && !redo_reserve(s, b->n);
    if (st && decode && sl_store_step_begin(st, dev, b->n, e)) goto fail;
    int step;
    for (;;) {
        /* decode batches are recorded once and replayed where the backend can (not host-driven steps) */
        sl_step_rec *sr = NULL;
        step = -1;
        if (decode && n_want == b->n && b->n <= SL_STEP_MAX && n_want <= s->logit_cap && be->ops->step_begin &&
            (!st || dev)) {
            int fresh = 0;
            if ((sr = step_slot(s, b, &fresh)) && !fresh) step = be->ops->step_begin(be, &sr->rec, b->n, b->ids);
        }
        if (step != 1) {
            if (dev && s->recurrent) redo_copy(s, 0);
            be->ops->embed(be, &m->embed, b->ids, b->n, s->s.x);
            if (m->family->layers(m, s, s->s.x, b->n, e)) {
                if (step == 0) be->ops->step_end(be, &sr->rec); /* closes the recording */
                goto fail;
            }
            if (st && sl_store_check(st, e)) {
                be->ops->check(be, &(sl_err){0});
                goto fail;
            }
            for (int i = 0; i < n_want && i < s->logit_cap; i++) s->row_pos[i] = s->h_pos[want[i]];
            /* final norm of the wanted rows, packed, then the output head */
            for (int i = 0; i < n_want;) {
                int j = i + 1;
                while (j < n_want && want[j] == want[j - 1] + 1) j++;
                be->ops->rmsnorm(be, s->s.x + (size_t)want[i] * H, m->final_norm, j - i, (int)H, (float)c->rms_eps,
                                 s->s.xn + (size_t)i * H);
                i = j;
            }
            if (hidden) {
                be->ops->download(be, hidden, s->s.xn, (size_t)n_want * H * 4);
            } else if (!host || step == 0) {
                for (int r = 0; r < n_want; r += LOGIT_ROWS) {
                    int rows = n_want - r < LOGIT_ROWS ? n_want - r : LOGIT_ROWS;
                    be->ops->matmul(be, &m->lm_head, s->s.xn + (size_t)r * H, rows, s->s.logits + (size_t)r * V);
                }
            } else {
                for (int r = 0; r < n_want; r += LOGIT_ROWS) {
                    int rows = n_want - r < LOGIT_ROWS ? n_want - r : LOGIT_ROWS;
                    be->ops->matmul(be, &m->lm_head, s->s.xn + (size_t)r * H, rows, s->s.logits);
                    be->ops->download(be, host + (size_t)r * V, s->s.logits, (size_t)rows * V * 4);
                }
            }
        }
        if (step == 0) be->ops->step_end(be, &sr->rec);
        if (step >= 0) /* a replayed step issued no ops of its own: the rows are the batch's, in order */
            for (int i = 0; i < n_want && i < s->logit_cap; i++) s->row_pos[i] = s->h_pos[want[i]];
        if (st && dev) sl_store_step_serve(st);
        int again = st && decode ? sl_store_step_end(st, e) : 0;
        if (again < 0) goto fail;
        if (!again) break;
        /* the device step missed an expert: from the saved state again, host-driven, reading what it lacks */
        if (s->recurrent) redo_copy(s, 1);
        dev = 0;
        if (sl_store_step_begin(st, 0, b->n, e)) goto fail;
    }
    if (step >= 0 && host) be->ops->download(be, host, s->s.logits, (size_t)n_want * V * 4);
    if (be->ops->check(be, e)) goto fail;
    /* rows now on the host are checked: corrupt weights would otherwise go on silently as garbage text */
    for (int i = 0; host && i < n_want; i++)
        if (sl_check_logits(host + (size_t)i * V, 1, V, s->h_pos[want[i]], e)) goto fail;
    for (int r = 0; r < s->n_runs; r++) {
        sl_seq *sq = &s->seqs[s->runs[r].seq];
        memcpy(sq->hist + sq->pos, b->ids + s->runs[r].start, (size_t)s->runs[r].len * sizeof *b->ids);
        sq->pos += s->runs[r].len;
    }
    return 0;
fail:
    if (st && decode) sl_store_step_abort(st);
    /* the caches and recurrent state of these sequences took part of this batch: they start over */
    for (int r = 0; r < s->n_runs; r++) sl_session_seq_reset(s, s->runs[r].seq);
    return -1;
}

int sl_session_decode(sl_session *s, const sl_batch *b, sl_err *e) {
    int *want = s->want_idx, n_want = 0;
    if (b->n < 1 || b->n > s->max_batch) return sl_fail(e, "a batch holds 1 to %d tokens, got %d", s->max_batch, b->n);
    for (int i = 0; i < b->n && b->want; i++)
        if (b->want[i]) want[n_want++] = i;
    if (n_want > s->logit_cap)
        return sl_fail(e, "a batch asks for %d rows of logits; the session holds %d", n_want, s->logit_cap);
    return run(s, b, want, n_want, NULL, NULL, e);
}

/* The sequence column of a batch of one sequence's tokens. */
static const int32_t *one_seq(sl_session *s, int q) {
    for (int i = 0; i < s->max_batch; i++) s->seq_fill[i] = q;
    return s->seq_fill;
}

int sl_session_row_logits(sl_session *s, int r, float *logits, sl_err *e) {
    if (r < 0 || r >= s->logit_cap) return sl_fail(e, "logits row %d is outside [0, %d)", r, s->logit_cap);
    size_t V = (size_t)s->m->cfg.vocab_size;
    s->m->be->ops->download(s->m->be, logits, s->s.logits + (size_t)r * V, V * sizeof *logits);
    if (s->m->be->ops->check(s->m->be, e)) return -1;
    return sl_check_logits(logits, 1, V, s->row_pos[r], e);
}

int sl_session_rows_argmax(sl_session *s, int n, int32_t *ids, sl_err *e) {
    if (n > s->logit_cap) return sl_fail(e, "logits rows %d exceed the %d the session holds", n, s->logit_cap);
    s->m->be->ops->argmax(s->m->be, s->s.logits, n, s->m->cfg.vocab_size, ids);
    return s->m->be->ops->check(s->m->be, e);
}

/* sl_session_forward, or with next set sl_session_forward_argmax (logits NULL, all_logits 0), on
 * sequence 0 in chunks of max_batch. */
static int forward(sl_session *s, const int32_t *ids, int n, float *logits, int all_logits, int32_t *next, sl_err *e) {
    sl_seq *sq = &s->seqs[0];
    size_t V = (size_t)s->m->cfg.vocab_size;
    if (sq->pos + n > s->max_ctx)
        return sl_fail(e, "context overflow: %d tokens in the session + %d new exceed the context of %d", sq->pos, n,
                       s->max_ctx);
    const int32_t *seq = one_seq(s, 0);
    int *want = s->want_idx, rc = 0;
    for (int off = 0; !rc && off < n; off += s->max_batch) {
        int nb = n - off < s->max_batch ? n - off : s->max_batch;
        int last_chunk = off + nb == n, n_want = 0;
        if ((logits || next) && (all_logits || last_chunk)) {
            for (int i = all_logits ? 0 : nb - 1; i < nb; i++) want[n_want++] = i;
        }
        sl_batch b = {.n = nb, .ids = ids + off, .seq = seq};
        float *dst = logits ? (all_logits ? logits + (size_t)off * V : logits) : NULL;
        /* a single row stays on the backend too, for argmax and sl_session_last_logits */
        rc = run(s, &b, want, n_want, n_want == 1 ? NULL : dst, NULL, e);
        if (!rc && n_want == 1 && dst) rc = sl_session_row_logits(s, 0, dst, e);
        /* the last row computed stays in s.logits (the last chunk's, when they went to the host) */
        s->logit_row = n_want == 0 ? -1 : n_want == 1 ? 0 : (n_want - 1) % LOGIT_ROWS;
        if (!rc && next && last_chunk) s->m->be->ops->argmax(s->m->be, s->s.logits, 1, (int)V, next);
    }
    if (!rc) rc = s->m->be->ops->check(s->m->be, e);
    return rc;
}

int sl_session_forward(sl_session *s, const int32_t *ids, int n, float *logits, int all_logits, sl_err *e) {
    return forward(s, ids, n, logits, all_logits, NULL, e);
}

int sl_session_forward_argmax(sl_session *s, const int32_t *ids, int n, int32_t *next, sl_err *e) {
    *next = -1;
    return forward(s, ids, n, NULL, 0, next, e);
}

int sl_session_seq_hidden(sl_session *s, int q, const int32_t *ids, int n, float *out, int all_rows, sl_err *e) {
    if (n <= 0) return sl_fail(e, "no tokens to embed");
    if (q < 0 || q >= s->n_seqs) return sl_fail(e, "sequence %d is outside [0, %d)", q, s->n_seqs);
    sl_seq *sq = &s->seqs[q];
    size_t H = (size_t)s->m->cfg.hidden;
    if (sq->pos + n > s->max_ctx)
        return sl_fail(e, "context overflow: %d tokens in the session + %d new exceed the context of %d", sq->pos, n,
                       s->max_ctx);
    const int32_t *seq = one_seq(s, q);
    int *want = s->want_idx, rc = 0;
    if (q == 0) s->logit_row = -1; /* s.logits no longer holds sequence 0's last row */
    for (int off = 0; !rc && off < n; off += s->max_batch) {
        int nb = n - off < s->max_batch ? n - off : s->max_batch, n_want = 0;
        int last_chunk = off + nb == n;
        if (all_rows || last_chunk)
            for (int i = all_rows ? 0 : nb - 1; i < nb; i++) want[n_want++] = i;
        sl_batch b = {.n = nb, .ids = ids + off, .seq = seq};
        rc = run(s, &b, want, n_want, NULL, n_want ? (all_rows ? out + (size_t)off * H : out) : NULL, e);
    }
    return rc;
}

int sl_session_hidden(sl_session *s, const int32_t *ids, int n, float *out, int all_rows, sl_err *e) {
    return sl_session_seq_hidden(s, 0, ids, n, out, all_rows, e);
}

int sl_session_last_logits(sl_session *s, float *logits, sl_err *e) {
    if (s->logit_row < 0) return sl_fail(e, "the session has computed no logits since its last forward");
    return sl_session_row_logits(s, s->logit_row, logits, e);
}

void sl_session_reset(sl_session *s) {
    sl_session_seq_reset(s, 0);
}

int sl_session_snapshot(sl_session *s, sl_err *e) {
    return sl_session_seq_snapshot(s, 0, e);
}

int sl_session_restore(sl_session *s, int pos) {
    return sl_session_seq_restore(s, 0, pos);
}

int sl_session_rewind(sl_session *s, int pos) {
    sl_seq *sq = &s->seqs[0];
    if (pos < 0 || pos > sq->pos) return -1;
    if (pos == sq->pos) return 0;
    if (s->recurrent) return -1;
    seq_truncate(s, 0, pos);
    return 0;
}

int sl_session_pos(const sl_session *s) {
    return s->seqs[0].pos;
}

int sl_session_default_ctx(const sl_model *m, sl_kv_type kt) {
    const sl_config *c = &m->cfg;
    double per_tok = (double)sl_session_kv_bytes_per_token(m, kt);
    int ctx = c->max_pos;
    /* caches live in the backend's memory: a quarter of what is free there (host memory on the CPU) */
    double budget = (m->be->ops->mem_free ? (double)m->be->ops->mem_free(m->be) : sl_mem_available()) / 4;
    while (ctx > 2048 && per_tok * ctx > budget) ctx /= 2;
    return ctx < c->max_pos ? ctx : c->max_pos;
}
