#include "runtime/session.h"

#include "runtime/finite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "experts/store.h"

#define MAX_BATCH 256
/* output rows computed at a time: keeps the logits scratch small for large vocabularies */
#define LOGIT_ROWS 16

static void *balloc(sl_session *s, size_t bytes) {
    void *p = s->m->be->ops->alloc(s->m->be, bytes);
    if (p) s->bufs[s->n_bufs++] = p;
    return p;
}

static int imax(int a, int b) {
    return a > b ? a : b;
}

int sl_session_create(sl_model *m, int max_ctx, sl_session **out, sl_err *e) {
    const sl_config *c = &m->cfg;
    size_t kv = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    if (max_ctx <= 0) max_ctx = c->max_pos;
    sl_session *s = calloc(1, sizeof *s);
    if (!s) return sl_fail(e, "out of memory");
    s->m = m;
    s->max_ctx = max_ctx;
    s->max_batch = MAX_BATCH;
    s->logit_row = -1;
    int L = c->n_layers;
    s->kc = calloc((size_t)L, sizeof *s->kc);
    s->vc = calloc((size_t)L, sizeof *s->vc);
    s->conv = calloc((size_t)L, sizeof *s->conv);
    s->ssm = calloc((size_t)L, sizeof *s->ssm);
    s->bufs = calloc((size_t)((4 + 2 * SL_MAX_SNAPSHOTS) * L + 32), sizeof *s->bufs);
    s->hist = calloc((size_t)max_ctx, sizeof *s->hist);
    if (!s->hist || !s->kc || !s->vc || !s->conv || !s->ssm || !s->bufs) goto oom;

    for (int i = 0; i < SL_MAX_SNAPSHOTS; i++) s->snaps[i].pos = -1;
    int conv_dim = sl_config_conv_dim(c);
    int lin_v = c->lin_n_v_heads * c->lin_v_head_dim;
    for (int l = 0; l < L; l++) {
        if (m->layers[l].kind == SL_LAYER_ATTENTION) {
            if (!(s->kc[l] = balloc(s, (size_t)max_ctx * kv * 4)) || !(s->vc[l] = balloc(s, (size_t)max_ctx * kv * 4)))
                goto oom;
        } else {
            s->recurrent = 1;
            size_t st = sl_config_ssm_floats(c);
            if (!(s->conv[l] = balloc(s, (size_t)(c->conv_kernel - 1) * (size_t)conv_dim * 4 + 4)) ||
                !(s->ssm[l] = balloc(s, st * 4)))
                goto oom;
        }
    }
    size_t B = (size_t)s->max_batch, H = (size_t)c->hidden;
    size_t qw = (size_t)c->n_heads * (size_t)c->head_dim;
    int ff = imax(imax(c->intermediate, c->shared_intermediate), c->moe_intermediate);
    int E = imax(c->n_experts, 1), K = imax(c->top_k, 1);
    sl_scratch *x = &s->s;
    if (!(x->x = balloc(s, B * H * 4)) || !(x->xn = balloc(s, B * H * 4)) || !(x->qraw = balloc(s, B * qw * 2 * 4)) ||
        !(x->q = balloc(s, B * qw * 4)) || !(x->gate = balloc(s, B * qw * 4)) || !(x->k = balloc(s, B * kv * 4)) ||
        !(x->v = balloc(s, B * kv * 4)) || !(x->att = balloc(s, B * (size_t)imax((int)qw, lin_v) * 4)) ||
        !(x->qkv = balloc(s, B * (size_t)imax(conv_dim, 1) * 4)) ||
        !(x->conv = balloc(s, B * (size_t)imax(conv_dim, 1) * 4)) ||
        !(x->z = balloc(s, B * (size_t)imax(lin_v, 1) * 4)) ||
        !(x->a = balloc(s, B * (size_t)imax(c->lin_n_v_heads, 1) * 4)) ||
        !(x->b = balloc(s, B * (size_t)imax(c->lin_n_v_heads, 1) * 4)) ||
        !(x->lin = balloc(s, B * (size_t)imax(lin_v, 1) * 4)) || !(x->ff_g = balloc(s, B * (size_t)ff * 4)) ||
        !(x->ff_u = balloc(s, B * (size_t)ff * 4)) || !(x->ff_o = balloc(s, B * H * 4)) ||
        !(x->router = balloc(s, B * (size_t)E * 4)) || !(x->moe_w = balloc(s, B * (size_t)K * 4)) ||
        !(x->moe_ids = balloc(s, B * (size_t)K * 4)) || !(x->moe_out = balloc(s, B * H * 4)) ||
        !(x->sh_gate = balloc(s, B * 4)) || !(x->logits = balloc(s, (size_t)LOGIT_ROWS * (size_t)c->vocab_size * 4)))
        goto oom;
    *out = s;
    return 0;
oom:
    sl_session_free(s);
    {
        char buf[32];
        return sl_fail(e, "out of memory creating a session with a %d-token context (KV cache %s per attention layer)",
                       max_ctx, sl_human_bytes((double)max_ctx * (double)kv * 8, buf, sizeof buf));
    }
}

void sl_session_free(sl_session *s) {
    if (!s) return;
    if (s->step) s->m->be->ops->step_free(s->m->be, s->step);
    for (int i = 0; i < s->n_bufs; i++) s->m->be->ops->free(s->m->be, s->bufs[i]);
    free(s->bufs);
    free(s->hist);
    free(s->kc);
    free(s->vc);
    free(s->conv);
    free(s->ssm);
    for (int i = 0; i < SL_MAX_SNAPSHOTS; i++) {
        free(s->snaps[i].conv);
        free(s->snaps[i].ssm);
    }
    free(s);
}

void sl_session_reset(sl_session *s) {
    const sl_config *c = &s->m->cfg;
    sl_backend *be = s->m->be;
    int conv_dim = sl_config_conv_dim(c);
    for (int l = 0; l < c->n_layers; l++) {
        if (s->conv[l]) be->ops->zero(be, s->conv[l], (size_t)(c->conv_kernel - 1) * (size_t)conv_dim * 4);
        if (s->ssm[l]) be->ops->zero(be, s->ssm[l], sl_config_ssm_floats(c) * 4);
    }
    s->pos = 0;
    for (int i = 0; i < SL_MAX_SNAPSHOTS; i++) s->snaps[i].pos = -1;
}

static size_t conv_floats(const sl_config *c) {
    return (size_t)(c->conv_kernel - 1) * (size_t)sl_config_conv_dim(c);
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

int sl_session_snapshot(sl_session *s, sl_err *e) {
    if (!s->recurrent) return 0;
    const sl_config *c = &s->m->cfg;
    sl_backend *be = s->m->be;
    int L = c->n_layers, slot = -1;
    for (int i = 0; i < SL_MAX_SNAPSHOTS && slot < 0; i++)
        if (s->snaps[i].pos == s->pos) slot = i; /* already saved here: refresh */
    for (int i = 0; i < SL_MAX_SNAPSHOTS && slot < 0; i++)
        if (s->snaps[i].pos < 0) slot = i;
    if (slot < 0) {
        slot = 0;
        for (int i = 1; i < SL_MAX_SNAPSHOTS; i++)
            if (s->snaps[i].used < s->snaps[slot].used) slot = i;
    }
    sl_snapshot *sn = &s->snaps[slot];
    if (!sn->conv) {
        sn->conv = calloc((size_t)L, sizeof *sn->conv);
        sn->ssm = calloc((size_t)L, sizeof *sn->ssm);
        if (!sn->conv || !sn->ssm) return sl_fail(e, "out of memory for a state snapshot");
        for (int l = 0; l < L; l++) {
            if (!s->conv[l]) continue;
            if (!(sn->conv[l] = balloc(s, conv_floats(c) * 4 + 4)) ||
                !(sn->ssm[l] = balloc(s, sl_config_ssm_floats(c) * 4)))
                return sl_fail(e, "out of backend memory for a state snapshot of layer %d", l);
        }
    }
    for (int l = 0; l < L; l++) {
        if (!s->conv[l]) continue;
        copy_state(be, sn->conv[l], s->conv[l], conv_floats(c));
        copy_state(be, sn->ssm[l], s->ssm[l], sl_config_ssm_floats(c));
    }
    sn->pos = s->pos;
    sn->used = ++s->snap_clock;
    return be->ops->check(be, e);
}

int sl_session_restore(sl_session *s, int pos) {
    if (pos < 0) pos = 0;
    if (pos >= s->pos) return s->pos;
    if (!s->recurrent) {
        s->pos = pos;
        return pos;
    }
    int best = -1;
    for (int i = 0; i < SL_MAX_SNAPSHOTS; i++)
        if (s->snaps[i].pos >= 0 && s->snaps[i].pos <= pos && (best < 0 || s->snaps[i].pos > s->snaps[best].pos))
            best = i;
    if (best < 0) {
        sl_session_reset(s);
        return 0;
    }
    const sl_config *c = &s->m->cfg;
    sl_backend *be = s->m->be;
    sl_snapshot *sn = &s->snaps[best];
    for (int l = 0; l < c->n_layers; l++) {
        if (!s->conv[l]) continue;
        copy_state(be, s->conv[l], sn->conv[l], conv_floats(c));
        copy_state(be, s->ssm[l], sn->ssm[l], sl_config_ssm_floats(c));
    }
    s->pos = sn->pos;
    sn->used = ++s->snap_clock;
    /* later tokens overwrite hist from here, so snapshots past this point no longer describe it */
    for (int i = 0; i < SL_MAX_SNAPSHOTS; i++)
        if (s->snaps[i].pos > s->pos) s->snaps[i].pos = -1;
    return s->pos;
}

/* sl_session_forward, or with next set sl_session_forward_argmax (logits NULL, all_logits 0). */
static int forward(sl_session *s, const int32_t *ids, int n, float *logits, int all_logits, int32_t *next, sl_err *e) {
    sl_model *m = s->m;
    sl_backend *be = m->be;
    const sl_config *c = &m->cfg;
    if (s->pos + n > s->max_ctx)
        return sl_fail(e, "context overflow: %d tokens in the session + %d new exceed the context of %d", s->pos, n,
                       s->max_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return sl_fail(e, "token id %d at position %d is outside the vocabulary [0, %d)", ids[i], i, c->vocab_size);
    size_t V = (size_t)c->vocab_size, H = (size_t)c->hidden;
    for (int off = 0; off < n; off += s->max_batch) {
        int nb = n - off < s->max_batch ? n - off : s->max_batch;
        /* one-token steps are recorded once and replayed where the backend can; a recorded step always
         * ends with the logits in s->s.logits */
        /* streamed experts change between steps, and the host acts on each layer's routing: no recording */
        int step =
            nb == 1 && be->ops->step_begin && !m->store ? be->ops->step_begin(be, &s->step, s->pos, ids[off]) : -1;
        if (step != 1) {
            be->ops->embed(be, &m->embed, ids + off, nb, s->s.x);
            if (m->family->layers(m, s, s->s.x, nb, e)) {
                if (step == 0) be->ops->step_end(be, &s->step); /* closes the recording */
                return -1;
            }
            if (m->store && sl_store_check(m->store, e)) {
                be->ops->check(be, &(sl_err){0});
                /* the caches and recurrent state took part of this chunk: start over next time */
                sl_session_reset(s);
                return -1;
            }
        }
        int last_chunk = off + nb == n, last_row = 0;
        if (step == 0 || (step < 0 && (logits || next) && (all_logits || last_chunk))) {
            int first = all_logits ? 0 : nb - 1;
            be->ops->rmsnorm(be, s->s.x + (size_t)first * H, m->final_norm, nb - first, (int)H, (float)c->rms_eps,
                             s->s.xn);
            for (int r = first; r < nb; r += LOGIT_ROWS) {
                int rows = nb - r < LOGIT_ROWS ? nb - r : LOGIT_ROWS;
                be->ops->matmul(be, &m->lm_head, s->s.xn + (size_t)(r - first) * H, rows, s->s.logits);
                float *dst = all_logits ? logits + (size_t)(off + r) * V : logits;
                if (step < 0 && logits) be->ops->download(be, dst, s->s.logits, (size_t)rows * V * 4);
                last_row = rows - 1;
            }
        }
        if (step == 0) be->ops->step_end(be, &s->step);
        if (step >= 0 && logits)
            be->ops->download(be, all_logits ? logits + (size_t)off * V : logits, s->s.logits, V * 4);
        s->logit_row = step >= 0 || ((logits || next) && (all_logits || last_chunk)) ? last_row : -1;
        if (next && last_chunk) *next = be->ops->argmax(be, s->s.logits + (size_t)last_row * V, (int)V);
        memcpy(s->hist + s->pos, ids + off, (size_t)nb * sizeof *ids);
        s->pos += nb;
        if (be->ops->check(be, e)) return -1;
        /* rows now on the host: all of this chunk's, or the last one */
        if (logits && all_logits && sl_check_logits(logits + (size_t)off * V, (size_t)nb, V, s->pos - nb, e)) return -1;
        if (logits && !all_logits && last_chunk && sl_check_logits(logits, 1, V, s->pos - 1, e)) return -1;
    }
    return 0;
}

int sl_session_forward(sl_session *s, const int32_t *ids, int n, float *logits, int all_logits, sl_err *e) {
    return forward(s, ids, n, logits, all_logits, NULL, e);
}

int sl_session_forward_argmax(sl_session *s, const int32_t *ids, int n, int32_t *next, sl_err *e) {
    *next = -1;
    return forward(s, ids, n, NULL, 0, next, e);
}

int sl_session_last_logits(sl_session *s, float *logits, sl_err *e) {
    if (s->logit_row < 0) return sl_fail(e, "the session has computed no logits since its last forward");
    size_t V = (size_t)s->m->cfg.vocab_size;
    s->m->be->ops->download(s->m->be, logits, s->s.logits + (size_t)s->logit_row * V, V * sizeof *logits);
    if (s->m->be->ops->check(s->m->be, e)) return -1;
    return sl_check_logits(logits, 1, V, s->pos - 1, e);
}

int sl_session_rewind(sl_session *s, int pos) {
    if (pos < 0 || pos > s->pos) return -1;
    if (pos == s->pos) return 0;
    if (s->recurrent) return -1;
    s->pos = pos;
    return 0;
}

int sl_session_default_ctx(const sl_model *m) {
    const sl_config *c = &m->cfg;
    int n_attn = 0;
    for (int l = 0; l < c->n_layers; l++) n_attn += m->layers[l].kind == SL_LAYER_ATTENTION;
    double per_tok = (double)n_attn * c->n_kv_heads * c->head_dim * 8.0;
    int ctx = c->max_pos;
    /* caches live in the backend's memory: a quarter of what is free there (host memory on the CPU) */
    double budget = (m->be->ops->mem_free ? (double)m->be->ops->mem_free(m->be) : sl_mem_available()) / 4;
    while (ctx > 2048 && per_tok * ctx > budget) ctx /= 2;
    return ctx < c->max_pos ? ctx : c->max_pos;
}
