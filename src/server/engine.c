#include "server/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "formats/resolve.h"
#include "text/chat.h"
#include "text/utf8_cut.h"

int sv_engine_init(sv_engine *g, int queue_cap, sl_err *e) {
    memset(g, 0, sizeof *g);
    if (queue_cap < 1) return sl_fail(e, "--queue must be at least 1, got %d", queue_cap);
    if (!(g->q = calloc((size_t)queue_cap, sizeof *g->q))) return sl_fail(e, "out of memory");
    g->q_cap = queue_cap;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->seed_state = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)g << 16);
    return 0;
}

uint64_t sv_engine_seed(sv_engine *g) {
    pthread_mutex_lock(&g->mu);
    uint64_t seed = sl_splitmix64(&g->seed_state);
    pthread_mutex_unlock(&g->mu);
    return seed;
}

typedef struct run_ctx {
    sv_job *j;
    sl_tc_parser *parser;
    int forced_fed; /* the prompt's forced tool-call opening went through the parser */
} run_ctx;

static void on_event(void *ud, const sl_tc_event *ev);

/* The parser must see the tool-call opening the prompt ended with, as if the model had written it. */
static void feed_forced(run_ctx *r) {
    sv_job *j = r->j;
    if (r->forced_fed || !r->parser || !j->forced) return;
    r->forced_fed = 1;
    sl_err e;
    if (sl_tc_parser_feed(r->parser, j->forced, strlen(j->forced), on_event, j, &e)) j->content.oom = 1;
}

/* Keeps what every writer needs for the final response, then hands the event on. */
static void on_event(void *ud, const sl_tc_event *ev) {
    sv_job *j = ud;
    switch (ev->kind) {
    case SL_TC_TEXT: sv_buf_append(&j->content, ev->text, ev->len); break;
    case SL_TC_REASONING: sv_buf_append(&j->reasoning, ev->text, ev->len); break;
    case SL_TC_TOOL_START:
        if (!sv_job_tool_start(j, ev->text, ev->len)) j->content.oom = 1;
        break;
    case SL_TC_TOOL_ARGS:
        if (j->n_tools) sv_buf_append(&j->tool_calls[j->n_tools - 1].args, ev->text, ev->len);
        break;
    case SL_TC_TOOL_END: break;
    }
    if (!j->began) {
        j->began = 1;
        j->w->begin(j);
    }
    j->w->event(j, ev);
}

/* A request whose client left, or one of whose choices failed: its choices stop and write nothing more.
 * Lead's lock held. */
static int gone(const sv_job *lead) {
    return lead->cancelled || lead->failed;
}

static int on_text(void *ud, const char *text, size_t len) {
    run_ctx *r = ud;
    sv_job *j = r->j, *lead = j->lead;
    pthread_mutex_lock(&lead->mu);
    int stop = gone(lead);
    if (!j->began && !stop) {
        j->began = 1;
        j->w->begin(j);
    }
    if (!stop) feed_forced(r);
    if (len && !stop) {
        if (r->parser) {
            sl_err e;
            if (sl_tc_parser_feed(r->parser, text, len, on_event, j, &e)) j->content.oom = 1;
        } else {
            sl_tc_event ev = {.kind = SL_TC_TEXT, .tool_index = -1, .text = text, .len = len};
            on_event(j, &ev);
        }
    }
    pthread_mutex_unlock(&lead->mu);
    return stop;
}

/* The --timing line of one finished generation: a single write, so lines never interleave. */
static void log_timing(const sv_engine *g, const sv_job *j) {
    const sl_gen_stats *st = &j->st;
    int fed = st->prompt_tokens - st->cached_tokens, n = st->generated_tokens;
    const char *route = j->lead->route[0] ? j->lead->route : "-";
    sv_buf b = {0};
    sv_buf_printf(&b, "sluice serve: %s", route);
    if (j->lead->n_choices > 1) sv_buf_printf(&b, " choice %d", j->index);
    sv_buf_printf(&b,
                  " model '%s': prompt %d tokens (%d cached), prefill %.3f s %.1f tok/s | "
                  "decode %d tokens, %.3f s %.1f tok/s | %s",
                  g->name, st->prompt_tokens, st->cached_tokens, st->prefill_s,
                  st->prefill_s > 0 ? fed / st->prefill_s : 0.0, n, st->decode_s,
                  st->decode_s > 0 ? n / st->decode_s : 0.0, st->finish_reason ? st->finish_reason : "-");
    if (st->has_store) {
        char line[256];
        sv_buf_printf(&b, " | prefill experts: %s", sl_store_stats_line(&st->store_prefill, line, sizeof line));
        sv_buf_printf(&b, " | decode experts: %s", sl_store_stats_line(&st->store_decode, line, sizeof line));
    }
    sv_buf_puts(&b, "\n");
    if (!b.oom) fputs(b.p, stderr);
    sv_buf_free(&b);
}

/* Work other than a generation (embeddings) runs between steps on an idle sequence of its own; the
 * job's run writes its whole response. */
static void run_other(sv_engine *g, sv_job *j) {
    pthread_mutex_lock(&j->mu);
    int skip = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    if (!skip) {
        sl_session *s = g->s;
        int q = -1;
        for (int i = 0; i < s->n_seqs; i++)
            if (s->seqs[i].idle && (q < 0 || s->seqs[i].used < s->seqs[q].used)) q = i;
        j->t_started = sl_now();
        sl_session_seq_set_idle(s, q, 0);
        j->seq = q;
        j->run(j, s);
        sl_session_seq_reset(s, q); /* nothing worth keeping: the inputs ran from an empty state */
        sl_session_seq_set_idle(s, q, 1);
    }
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&g->mu);
    if (skip) g->met.cancelled++;
    pthread_mutex_unlock(&g->mu);
    sv_job_release(j);
}

/* One choice of a request generating in a sequence of the session. */
typedef struct sv_run {
    sv_job *j; /* NULL: the slot is free */
    int seq;   /* -1: none yet */
    int wait;  /* a further choice: forks choice 0's sequence once the prompt is in */
    run_ctx r;
    sl_gen *gen;
    int fed;      /* prompt tokens in the sequence */
    int target;   /* feed the prompt up to here, then (recurrent models) snapshot, then the rest */
    int decoding; /* the prompt is in; next is the token to feed */
    int32_t next;
    int want_row;  /* this step: the logits row of its last token, -1 for none */
    double t0, t1; /* admitted, prompt read */
    sl_store_stats x0, x1;
} sv_run;

/* Hands a choice's end to its writer and counts it; the last choice to end ends the request (done,
 * counted, released). rc: the generation failed with msg, which fails the request: the writer says so once
 * and the other choices end at the next step, writing nothing. */
static void end_job(sv_engine *g, sv_run *u, int rc, const char *msg) {
    sv_job *j = u->j, *lead = j->lead;
    sl_err e = {{0}};
    if (msg) snprintf(e.msg, sizeof e.msg, "%s", msg);
    if (!rc && u->gen && sl_gen_finish(u->gen, on_text, &u->r, &j->st, &e)) rc = -1;
    /* the writers report the phase times */
    if (u->decoding) j->st.decode_s = sl_now() - u->t1;
    if (g->m->store && u->decoding) {
        sl_store_stats x2;
        sl_store_stats_get(g->m->store, &x2);
        j->st.store_decode = sl_store_stats_since(&u->x1, &x2);
    }
    pthread_mutex_lock(&lead->mu);
    int quiet = gone(lead);
    if (!rc && !quiet) feed_forced(&u->r);
    if (!rc && u->r.parser && !quiet && sl_tc_parser_finish(u->r.parser, on_event, j, &e)) rc = -1;
    if (!rc && (j->content.oom || j->reasoning.oom)) rc = sl_fail(&e, "out of memory");
    if (!j->began && !quiet) {
        j->began = 1;
        if (!rc) j->w->begin(j);
    }
    lead->open--;
    if (rc && !lead->failed) {
        lead->failed = 1;
        sl_utf8_scrub(e.msg); /* the writers put it in a JSON string */
        j->w->fail(j, e.msg);
    } else if (!rc && !quiet) {
        j->w->finish(j);
    }
    int cancelled = lead->cancelled, failed = lead->failed, last = lead->open == 0;
    if (cancelled) j->st.finish_reason = "cancelled";
    if (last) {
        lead->done = 1;
        pthread_cond_broadcast(&lead->cv);
    }
    pthread_mutex_unlock(&lead->mu);
    sl_tc_parser_free(u->r.parser);
    sl_gen_free(u->gen);
    if (g->timing && !rc) log_timing(g, j);
    if (u->seq >= 0) {
        /* the conversation stays cached in its sequence: the next turn usually starts with all of it */
        if (!rc && !cancelled && u->decoding && g->s->recurrent) sl_session_seq_snapshot(g->s, u->seq, &e);
        sl_session_seq_set_idle(g->s, u->seq, 1);
    }

    /* the prompt once per request, the generated tokens and their time per choice */
    pthread_mutex_lock(&g->mu);
    sv_metrics *mt = &g->met;
    mt->generated_tokens += (unsigned long long)j->st.generated_tokens;
    mt->decode_s += j->st.decode_s;
    if (j->st.decode_s > 0) mt->last_decode_tps = j->st.generated_tokens / j->st.decode_s;
    if (last) {
        const sl_gen_stats *st = &lead->st;
        mt->generations++;
        if (failed) mt->failed++;
        if (cancelled) mt->cancelled++;
        mt->prompt_tokens += (unsigned long long)st->prompt_tokens;
        mt->cached_tokens += (unsigned long long)st->cached_tokens;
        if (st->cached_tokens > 0) mt->prefix_hits++;
        mt->prefill_s += st->prefill_s;
        if (st->prefill_s > 0) mt->last_prefill_tps = (st->prompt_tokens - st->cached_tokens) / st->prefill_s;
        g->busy--;
    }
    pthread_mutex_unlock(&g->mu);
    if (last) sv_job_release(lead);
    memset(u, 0, sizeof *u);
}

/* The idle sequence a request may overwrite: an empty one first, else the least recently used. */
static int pick_idle(const sl_session *s) {
    int lru = -1;
    for (int q = 0; q < s->n_seqs; q++) {
        const sl_seq *sq = &s->seqs[q];
        if (!sq->idle) continue;
        if (lru < 0 || (sq->pos == 0) > (s->seqs[lru].pos == 0) ||
            ((sq->pos == 0) == (s->seqs[lru].pos == 0) && sq->used < s->seqs[lru].used))
            lru = q;
    }
    return lru;
}

/* Picks the sequence for a new request and resumes it as far as it can. An idle sequence whose whole
 * content the prompt continues (the next turn of its conversation) is taken over, as is, for hybrid
 * models (whose state cannot be shared), the idle one with the longest common prefix of at least half its
 * content. Otherwise the request gets an empty or the least recently used idle sequence, and an
 * attention-only model shares the whole pages of the longest common prefix of any sequence, running ones
 * included, so a side request or another conversation never destroys a cached one. Returns the positions
 * kept. */
static int place(sv_engine *g, sv_run *u, const int32_t *p, int n) {
    sl_session *s = g->s;
    int take = -1, take_k = -1;
    for (int q = 0; q < s->n_seqs; q++) {
        const sl_seq *sq = &s->seqs[q];
        if (!sq->idle) continue;
        int k = sl_session_seq_common(s, q, p, n);
        int ok = sq->pos > 0 && (k == sq->pos || (s->recurrent && 2 * k >= sq->pos));
        if (ok && k > take_k) {
            take = q;
            take_k = k;
        }
    }
    int q = take >= 0 ? take : pick_idle(s);
    sl_session_seq_set_idle(s, q, 0);
    u->seq = q;
    /* the last prompt token always runs again: its logits give the first generated token */
    int k = 0;
    if (take >= 0) {
        k = sl_session_seq_restore(s, q, take_k < n ? take_k : n - 1);
    } else {
        sl_session_seq_reset(s, q);
    }
    if (!s->recurrent) {
        int src = -1, src_k = k;
        for (int o = 0; o < s->n_seqs; o++) {
            if (o == q) continue;
            int c = sl_session_seq_common(s, o, p, n);
            if (c >= n) c = n - 1;
            if (c / SL_KV_PAGE * SL_KV_PAGE > src_k) {
                src = o;
                src_k = c / SL_KV_PAGE * SL_KV_PAGE;
            }
        }
        if (src >= 0) {
            k = sl_session_seq_share(s, q, src, src_k);
            if (s->seqs[src].idle) sl_session_seq_set_idle(s, src, 1); /* still wanted: recently used */
        }
    }
    return k;
}

/* Starts a request, a free run slot per choice (the worker admits it only when it has them). Choice 0 is
 * placed as any request (resuming or sharing a cached prefix) and reads the prompt. The others get empty
 * sequences of their own and wait: once the prompt is in, each forks choice 0's sequence (its pages shared,
 * a hybrid model's recurrent state copied) and samples its first token from the same logits, so the prompt
 * is read once whatever n is. */
static void start_job(sv_engine *g, sv_job *j) {
    sv_run *runs[SV_MAX_CHOICES];
    int n = 0;
    for (int i = 0; i < g->parallel && n < j->n_choices; i++)
        if (!g->runs[i].j) runs[n++] = &g->runs[i];
    pthread_mutex_lock(&g->mu);
    g->busy++;
    pthread_mutex_unlock(&g->mu);
    j->open = n;
    sl_err e = {{0}};
    int rc = 0;
    if (n < j->n_choices)
        rc = sl_fail(&e, "%d choices but %d free sequences", j->n_choices, n); /* the worker waits for room */
    else if (j->n_ids <= 0)
        rc = sl_fail(&e, "the prompt is empty");
    else if (j->n_ids >= g->s->max_ctx)
        rc = sl_fail(&e, "the prompt has %d tokens but the context holds %d", j->n_ids, g->s->max_ctx);
    double t0 = sl_now();
    for (int c = 0; c < n; c++) {
        sv_run *u = runs[c];
        sv_job *cj = sv_job_choice(j, c);
        memset(u, 0, sizeof *u);
        u->j = cj;
        u->r.j = cj;
        u->seq = -1;
        u->want_row = -1;
        u->t0 = t0;
        cj->t_started = t0;
        memset(&cj->st, 0, sizeof cj->st);
        cj->st.prompt_tokens = j->n_ids;
        cj->st.stop_index = -1;
        if (cj->parse_output) cj->gen.keep_special = sl_tc_format_tokens(g->tc_fmt);
        if (!rc && cj->parse_output &&
            !(u->r.parser = sl_tc_parser_create(g->tc_fmt, cj->starts_in_reasoning, cj->tools)))
            rc = sl_fail(&e, "out of memory");
        /* one trie of the vocabulary for every constrained request: building it takes a while */
        if (!rc && cj->gen.grammar && !g->gv) rc = sl_gvocab_create(g->tok, g->m->cfg.vocab_size, &g->gv, &e);
        cj->gen.gvocab = g->gv;
        if (!rc) rc = sl_gen_create(g->tok, g->m->cfg.vocab_size, &cj->gen, j->ids, j->n_ids, &u->gen, &e);
    }
    if (rc) {
        for (int c = 0; c < n; c++) end_job(g, runs[c], -1, e.msg);
        return;
    }
    sv_run *u = runs[0];
    u->fed = place(g, u, j->ids, j->n_ids);
    j->st.cached_tokens = u->fed;
    /* Recurrent state is saved just before the last prompt token: a request that repeats this prompt, or
     * continues it differently, resumes from there. */
    u->target = g->s->recurrent && j->n_ids - u->fed > 1 ? j->n_ids - 1 : j->n_ids;
    if (g->m->store) sl_store_stats_get(g->m->store, &u->x0);
    for (int c = 1; c < n; c++) {
        sv_run *w = runs[c];
        w->seq = pick_idle(g->s);
        sl_session_seq_set_idle(g->s, w->seq, 0);
        sl_session_seq_reset(g->s, w->seq); /* holds no pages while it waits */
        w->wait = 1;
    }
}

/* Choice 0's prompt is in (its run u has just turned to decoding): the request's other choices fork its
 * sequence and take their first token from the same logits row. */
static void fork_choices(sv_engine *g, sv_run *u) {
    for (int k = 0; k < g->parallel; k++) {
        sv_run *w = &g->runs[k];
        if (!w->j || !w->wait || w->j->lead != u->j) continue;
        sl_session_seq_fork(g->s, w->seq, u->seq);
        w->wait = 0;
        w->decoding = 1;
        w->fed = u->fed;
        w->target = u->target;
        w->want_row = u->want_row;
        w->t0 = u->t0;
        w->t1 = u->t1;
        w->x0 = u->x0;
        w->x1 = u->x1;
        const sl_gen_stats *a = &u->j->st;
        sl_gen_stats *b = &w->j->st;
        b->cached_tokens = a->cached_tokens;
        b->prefill_s = a->prefill_s;
        b->has_store = a->has_store;
        b->store_prefill = a->store_prefill;
    }
}

/* Queued jobs whose clients left are dropped at once, so they hold no place in the queue. */
static void purge_queue(sv_engine *g) {
    int kept = 0;
    for (int i = 0; i < g->q_len; i++) {
        sv_job *j = g->q[(g->q_head + i) % g->q_cap];
        pthread_mutex_lock(&j->mu);
        int gone = j->cancelled;
        if (gone) {
            j->done = 1;
            pthread_cond_broadcast(&j->cv);
        }
        pthread_mutex_unlock(&j->mu);
        if (gone) {
            g->met.cancelled++;
            sv_job_release(j);
        } else {
            g->q[(g->q_head + kept++) % g->q_cap] = j;
        }
    }
    g->q_len = kept;
}

/* Tokens of the step under construction. */
typedef struct step_buf {
    int32_t *ids, *seq;
    uint8_t *want;
    int32_t *greedy; /* [logit_cap] the argmax of each logits row */
    int n, rows;
} step_buf;

static void step_add(step_buf *b, const int32_t *ids, int len, int seq, int want_last) {
    for (int i = 0; i < len; i++) {
        b->ids[b->n] = ids[i];
        b->seq[b->n] = seq;
        b->want[b->n] = (uint8_t)(want_last && i == len - 1);
        b->n++;
    }
    if (want_last) b->rows++;
}

/* One forward pass: the next token of every decoding request, then prompt chunks while room is left.
 * Returns 0 when there was nothing to run. */
static int step(sv_engine *g, step_buf *b, float *logits) {
    sl_session *s = g->s;
    b->n = b->rows = 0;
    for (int i = 0; i < g->parallel; i++) {
        sv_run *u = &g->runs[i];
        u->want_row = -1;
        if (!u->j || !u->decoding) continue;
        u->want_row = b->rows;
        step_add(b, &u->next, 1, u->seq, 1);
    }
    for (int i = 0; i < g->parallel && b->n < s->max_batch; i++) {
        sv_run *u = &g->runs[i];
        if (!u->j || u->decoding || u->wait) continue;
        int len = u->target - u->fed;
        if (len > s->max_batch - b->n) len = s->max_batch - b->n;
        int last = u->fed + len == u->j->n_ids;
        if (last) u->want_row = b->rows;
        step_add(b, u->j->ids + u->fed, len, u->seq, last);
        u->fed += len;
    }
    if (!b->n) return 0;
    sl_err e = {{0}};
    sl_batch bt = {.n = b->n, .ids = b->ids, .seq = b->seq, .want = b->want};
    int rc = sl_session_decode(s, &bt, &e);
    pthread_mutex_lock(&g->mu);
    g->met.steps++;
    g->met.step_tokens += (unsigned long long)b->n;
    g->met.step_seqs += (unsigned long long)s->n_runs; /* a run per sequence of the batch */
    g->met.last_batch = s->n_runs;
    sl_session_pages(s, &g->met.kv_free, &g->met.kv_total);
    pthread_mutex_unlock(&g->mu);
    /* the prompts read in full, and the state snapshots of hybrid models on the way */
    for (int i = 0; i < g->parallel && !rc; i++) {
        sv_run *u = &g->runs[i];
        if (!u->j || u->wait) continue;
        if (!u->decoding && u->fed == u->target && u->target < u->j->n_ids) { /* recurrent: snapshot, then go on */
            if (sl_session_seq_snapshot(s, u->seq, &e)) {
                end_job(g, u, -1, e.msg);
                continue;
            }
            u->target = u->j->n_ids;
        }
        if (u->want_row < 0 || u->decoding) continue;
        /* the prompt is in: this row gives the first token */
        u->decoding = 1;
        u->t1 = sl_now();
        u->j->st.prefill_s = u->t1 - u->t0;
        if (g->m->store) {
            sl_store_stats_get(g->m->store, &u->x1);
            u->j->st.store_prefill = sl_store_stats_since(&u->x0, &u->x1);
            u->j->st.has_store = 1;
        }
        if (u->j->n_choices > 1) fork_choices(g, u);
    }
    int any_greedy = 0;
    for (int i = 0; i < g->parallel; i++)
        if (g->runs[i].j && g->runs[i].want_row >= 0 && sl_gen_greedy(g->runs[i].gen)) any_greedy = 1;
    if (!rc && any_greedy && b->rows) rc = sl_session_rows_argmax(s, b->rows, b->greedy, &e);
    for (int i = 0; i < g->parallel; i++) {
        sv_run *u = &g->runs[i];
        if (!u->j) continue;
        if (rc) { /* every sequence of the batch was reset: their requests fail (their other choices next) */
            int mine = u->want_row >= 0;
            for (int t = 0; t < b->n; t++) mine |= b->seq[t] == u->seq;
            if (mine) end_job(g, u, -1, e.msg);
            continue;
        }
        if (u->want_row < 0) continue;
        int gr = sl_gen_greedy(u->gen);
        sl_err se = {{0}};
        int r = 0;
        if (!gr && sl_session_row_logits(s, u->want_row, logits, &se)) r = -1;
        if (!r) {
            int ctx_left = s->max_ctx - s->seqs[u->seq].pos;
            r = sl_gen_step(u->gen, gr ? NULL : logits, gr ? b->greedy[u->want_row] : -1, ctx_left, on_text, &u->r,
                            &u->next, &u->j->st, &se);
        }
        if (r) end_job(g, u, r < 0 ? -1 : 0, r < 0 ? se.msg : NULL);
    }
    return 1;
}

static void *worker(void *arg) {
    sv_engine *g = arg;
    sl_session *s = g->s;
    step_buf b = {0};
    b.ids = malloc((size_t)s->max_batch * sizeof *b.ids);
    b.seq = malloc((size_t)s->max_batch * sizeof *b.seq);
    b.want = malloc((size_t)s->max_batch);
    b.greedy = malloc((size_t)s->logit_cap * sizeof *b.greedy);
    float *logits = malloc((size_t)g->m->cfg.vocab_size * sizeof *logits);
    if (!b.ids || !b.seq || !b.want || !b.greedy || !logits) {
        fprintf(stderr, "sluice serve: out of memory starting the worker\n");
        abort();
    }
    for (;;) {
        pthread_mutex_lock(&g->mu);
        purge_queue(g);
        int active = 0;
        for (int i = 0; i < g->parallel; i++) active += g->runs[i].j != NULL;
        while (!g->stopping && g->q_len == 0 && active == 0) {
            pthread_cond_wait(&g->cv, &g->mu);
            purge_queue(g);
        }
        if (g->stopping) {
            pthread_mutex_unlock(&g->mu);
            break;
        }
        /* new requests join between steps, in order, each once it has a run slot per choice (the APIs
         * keep n within --parallel) */
        sv_job *joining[64];
        int nj = 0;
        for (int room = g->parallel - active; g->q_len && nj < 64 && g->q[g->q_head]->n_choices <= room;) {
            room -= g->q[g->q_head]->n_choices;
            joining[nj++] = g->q[g->q_head];
            g->q_head = (g->q_head + 1) % g->q_cap;
            g->q_len--;
        }
        pthread_mutex_unlock(&g->mu);
        for (int k = 0; k < nj; k++) {
            if (joining[k]->run) {
                run_other(g, joining[k]);
                continue;
            }
            start_job(g, joining[k]);
        }
        /* requests whose clients left, or one of whose choices failed, end now, freeing their sequences */
        for (int i = 0; i < g->parallel; i++) {
            sv_job *j = g->runs[i].j;
            if (!j) continue;
            pthread_mutex_lock(&j->lead->mu);
            int end = gone(j->lead);
            pthread_mutex_unlock(&j->lead->mu);
            if (end) end_job(g, &g->runs[i], 0, NULL);
        }
        step(g, &b, logits);
    }
    /* shutting down: requests still running end as cancelled */
    for (int i = 0; i < g->parallel; i++) {
        if (!g->runs[i].j) continue;
        sv_job *lead = g->runs[i].j->lead;
        pthread_mutex_lock(&lead->mu);
        lead->cancelled = 1;
        pthread_mutex_unlock(&lead->mu);
        end_job(g, &g->runs[i], 0, NULL);
    }
    free(b.ids);
    free(b.seq);
    free(b.want);
    free(b.greedy);
    free(logits);
    return NULL;
}

/* The session: `parallel` running sequences plus as many kept for finished conversations, and a KV pool
 * of --kv-size, else of about half the free memory (a quarter of the host's on the CPU), never more than
 * every sequence's whole context. --parallel defaults to the sequences whose whole context fits. */
static int open_session(sv_engine *g, const sv_engine_opts *o, sl_err *e) {
    sl_model *m = g->m;
    double per_tok = (double)sl_session_kv_bytes_per_token(m, SL_KV_AUTO);
    if (per_tok <= 0) per_tok = 1; /* no attention layers: the pool is never used */
    double avail = m->be->ops->mem_free ? (double)m->be->ops->mem_free(m->be) * 0.5 : sl_mem_available() / 4.0;
    double pool = o->kv_bytes > 0 ? (double)o->kv_bytes : avail;
    double tokens = pool / per_tok;
    int par = o->parallel;
    if (par <= 0) {
        double fit = tokens / g->ctx;
        par = fit < 1 ? 1 : fit > 32 ? 32 : (int)fit;
    }
    int n_seqs = par + (par > 2 ? par : 2);
    if (tokens > (double)n_seqs * g->ctx) tokens = (double)n_seqs * g->ctx;
    if (tokens < g->ctx) tokens = g->ctx;
    sl_session_opts so = {.max_ctx = g->ctx, .n_seqs = n_seqs, .kv_tokens = (int)tokens};
    if (sl_session_create_opts(m, &so, &g->s, e)) return -1;
    g->parallel = par;
    if (!(g->runs = calloc((size_t)par, sizeof *g->runs))) return sl_fail(e, "out of memory");
    sl_session_pages(g->s, &g->met.kv_free, &g->met.kv_total);
    return 0;
}

static char *model_name(const char *arg) {
    size_t n = strlen(arg);
    while (n > 1 && arg[n - 1] == '/') n--;
    /* a GGUF file by its name without .gguf, or by its folder when the file is just "model.gguf" */
    if (n > 5 && !strcmp(arg + n - 5, ".gguf")) {
        const char *base = arg + n;
        while (base > arg && base[-1] != '/') base--;
        if (strcmp(base, "model.gguf") || base == arg) return strndup(base, (size_t)(arg + n - 5 - base));
        const char *dir = base - 1;
        while (dir > arg && dir[-1] != '/') dir--;
        return strndup(dir, (size_t)(base - 1 - dir));
    }
    /* a directory is named by its last component; a Hub id keeps its owner/name form */
    if (sl_is_dir(arg)) {
        const char *s = arg + n;
        while (s > arg && s[-1] != '/') s--;
        return strndup(s, (size_t)(arg + n - s));
    }
    return strndup(arg, n);
}

int sv_engine_load(sv_engine *g, const sv_engine_opts *o, sl_err *e) {
    double t0 = sl_now();
    if (sl_resolve_model(o->model, &g->dir, e)) return -1;
    if (!(g->name = o->alias ? strdup(o->alias) : model_name(o->model))) return sl_fail(e, "out of memory");
    sl_sampler_params_default(&g->defaults);
    sl_gen_defaults_from_model(g->dir, &g->defaults);
    sl_model_opts mo = o->mo;
    mo.threads = o->threads;
    mo.backend = o->backend;
    mo.ctx = o->ctx;
    if (sl_tokenizer_load(g->dir, &g->tok, e)) return -1;
    double t1 = sl_now();
    if (sl_model_load(g->dir, &mo, &g->m, e)) return -1;
    g->model_load_s = sl_now() - t1;
    const char *src = sl_tokenizer_chat_template(g->tok);
    if (src) {
        if (!(g->tmpl_src = strdup(src))) return sl_fail(e, "out of memory");
        if (sl_jinja_parse(src, strlen(src), &g->tmpl, e)) return sl_wrap(e, "%s: chat template", o->model);
        g->tc_fmt = sl_tc_format_detect(src);
    }
    g->ctx = o->ctx > 0 ? o->ctx : sl_session_default_ctx(g->m, SL_KV_AUTO);
    g->timing = o->timing;
    if (g->ctx > g->m->cfg.max_pos)
        return sl_fail(e, "--ctx %d exceeds the model's max_position_embeddings %d", g->ctx, g->m->cfg.max_pos);
    if (open_session(g, o, e)) return -1;
    if (pthread_create(&g->worker, NULL, worker, g)) return sl_fail(e, "cannot start the worker thread");
    g->worker_started = 1;
    g->load_s = sl_now() - t0;
    g->loaded_at = (long long)time(NULL);
    pthread_mutex_lock(&g->mu);
    g->ready = 1;
    pthread_mutex_unlock(&g->mu);
    return 0;
}

int sv_engine_ready(sv_engine *g) {
    pthread_mutex_lock(&g->mu);
    int r = g->ready && !g->stopping;
    pthread_mutex_unlock(&g->mu);
    return r;
}

int sv_engine_submit(sv_engine *g, sv_job *j) {
    pthread_mutex_lock(&g->mu);
    if (g->q_len == g->q_cap) purge_queue(g); /* waiting clients that left hold no place */
    if (g->stopping || !g->ready || g->q_len == g->q_cap) {
        g->met.rejected++;
        pthread_mutex_unlock(&g->mu);
        return -1;
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    g->q[(g->q_head + g->q_len) % g->q_cap] = j;
    g->q_len++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return 0;
}

void sv_engine_shutdown(sv_engine *g) {
    pthread_mutex_lock(&g->mu);
    g->stopping = 1;
    pthread_cond_broadcast(&g->cv);
    /* waiting jobs end as cancelled, so their connections close */
    while (g->q_len) {
        sv_job *j = g->q[g->q_head];
        g->q_head = (g->q_head + 1) % g->q_cap;
        g->q_len--;
        pthread_mutex_lock(&j->mu);
        j->cancelled = j->done = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        sv_job_release(j);
    }
    pthread_mutex_unlock(&g->mu);
    if (g->worker_started) pthread_join(g->worker, NULL);
    g->worker_started = 0;
}

void sv_engine_free(sv_engine *g) {
    sv_engine_shutdown(g);
    sl_session_free(g->s);
    sl_gvocab_free(g->gv);
    sl_model_free(g->m);
    sl_tokenizer_free(g->tok);
    sl_jinja_free(g->tmpl);
    free(g->tmpl_src);
    free(g->dir);
    free(g->name);
    free(g->q);
    free(g->runs);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

void sv_engine_metrics(sv_engine *g, sv_buf *o) {
    pthread_mutex_lock(&g->mu);
    sv_metrics m = g->met;
    int q = g->q_len, busy = g->busy, ready = g->ready, par = g->parallel;
    pthread_mutex_unlock(&g->mu);
    static const char *apis[] = {"openai", "anthropic", "ollama", "other"};
    sv_buf_puts(o,
                "# HELP sluice_requests_total HTTP requests received, by API.\n# TYPE sluice_requests_total counter\n");
    for (int i = 0; i < 4; i++) sv_buf_printf(o, "sluice_requests_total{api=\"%s\"} %llu\n", apis[i], m.requests[i]);
#define METRIC(name, type, help, fmt, v)                                                                               \
    sv_buf_printf(o, "# HELP sluice_" name " " help "\n# TYPE sluice_" name " " type "\nsluice_" name " " fmt "\n", v)
    METRIC("request_errors_total", "counter", "Responses with a 4xx or 5xx status.", "%llu", m.errors);
    METRIC("requests_rejected_total", "counter", "Requests refused with 503 because the queue was full.", "%llu",
           m.rejected);
    METRIC("generations_total", "counter", "Generations run (cancelled and failed included).", "%llu", m.generations);
    METRIC("generations_cancelled_total", "counter", "Generations cancelled by a client disconnect.", "%llu",
           m.cancelled);
    METRIC("generations_failed_total", "counter", "Generations that ended with an error.", "%llu", m.failed);
    METRIC("prompt_tokens_total", "counter", "Prompt tokens of all generations.", "%llu", m.prompt_tokens);
    METRIC("prompt_tokens_cached_total", "counter", "Prompt tokens reused from the cached conversation.", "%llu",
           m.cached_tokens);
    METRIC("prefix_cache_hits_total", "counter", "Generations that reused a cached prefix.", "%llu", m.prefix_hits);
    METRIC("generated_tokens_total", "counter", "Tokens generated.", "%llu", m.generated_tokens);
    METRIC("prefill_seconds_total", "counter", "Time spent in prompt processing.", "%.6f", m.prefill_s);
    METRIC("decode_seconds_total", "counter", "Time spent generating tokens.", "%.6f", m.decode_s);
    METRIC("prefill_tokens_per_second", "gauge", "Prompt tokens per second of the last generation.", "%.3f",
           m.last_prefill_tps);
    METRIC("decode_tokens_per_second", "gauge", "Generated tokens per second of the last generation.", "%.3f",
           m.last_decode_tps);
    METRIC("queue_depth", "gauge", "Requests waiting for the engine.", "%d", q);
    METRIC("busy", "gauge", "1 while a generation runs.", "%d", busy > 0);
    METRIC("requests_running", "gauge", "Requests generating now.", "%d", busy);
    METRIC("requests_waiting", "gauge", "Requests waiting in the queue.", "%d", q);
    METRIC("parallel", "gauge", "Requests generated at once at most (--parallel).", "%d", par);
    METRIC("batch_steps_total", "counter", "Forward passes of the batch engine.", "%llu", m.steps);
    METRIC("batch_tokens_total", "counter", "Tokens of all forward passes.", "%llu", m.step_tokens);
    METRIC("batch_sequences_total", "counter", "Sequences of all forward passes (summed per pass).", "%llu",
           m.step_seqs);
    METRIC("batch_sequences", "gauge", "Sequences in the latest forward pass.", "%d", m.last_batch);
    METRIC("kv_pages_total", "gauge", "Pages of the KV cache pool.", "%d", m.kv_total);
    METRIC("kv_pages_free", "gauge", "Pages of the KV cache pool held by no sequence.", "%d", m.kv_free);
    METRIC("kv_page_tokens", "gauge", "Positions per KV page.", "%d", SL_KV_PAGE);
    METRIC("ready", "gauge", "1 once the model is loaded.", "%d", ready);
    if (m.streaming) {
        const sl_store_stats *x = &m.xs;
        METRIC("expert_lookups_total", "counter", "Experts the routed tokens needed (once per layer pass).", "%llu",
               (unsigned long long)x->lookups);
        sv_buf_puts(o, "# HELP sluice_expert_hits_total Experts found without a read, by tier.\n"
                       "# TYPE sluice_expert_hits_total counter\n");
        sv_buf_printf(o, "sluice_expert_hits_total{tier=\"slots\"} %llu\n", (unsigned long long)x->hits_slot);
        sv_buf_printf(o, "sluice_expert_hits_total{tier=\"read_ahead\"} %llu\n", (unsigned long long)x->hits_ahead);
        sv_buf_printf(o, "sluice_expert_hits_total{tier=\"host\"} %llu\n", (unsigned long long)x->hits_ram);
        METRIC("expert_misses_total", "counter", "Experts read from disk when needed.", "%llu",
               (unsigned long long)x->misses);
        METRIC("expert_tokens_total", "counter", "Tokens through the streamed MoE layers.", "%llu",
               (unsigned long long)x->tokens);
        METRIC("expert_read_bytes_total", "counter", "Bytes of experts read from disk (reads ahead included).", "%llu",
               (unsigned long long)x->bytes_read);
        METRIC("expert_read_seconds_total", "counter", "Wall time with expert reads in flight.", "%.6f",
               x->read_busy_s);
        METRIC("expert_stall_seconds_total", "counter", "Time the forward pass waited for expert reads.", "%.6f",
               x->stall_s);
        METRIC("expert_routing_wait_seconds_total", "counter", "Time waiting for each MoE layer's routing.", "%.6f",
               x->route_wait_s);
        METRIC("expert_host_seconds_total", "counter", "Host time in MoE layers besides the waits.", "%.6f", x->host_s);
        METRIC("expert_buffer_wait_seconds_total", "counter",
               "Time waiting for the GPU's queue to free a host buffer or slot for an expert.", "%.6f", x->sync_s);
        METRIC("expert_predicted_total", "counter", "Experts guessed for the next layer.", "%llu",
               (unsigned long long)x->predicted);
        METRIC("expert_predicted_used_total", "counter", "Guessed experts the next layer was routed to.", "%llu",
               (unsigned long long)x->predicted_used);
        METRIC("expert_cpu_total", "counter", "Experts of the host cache computed on the CPU.", "%llu",
               (unsigned long long)x->cpu_experts);
        METRIC("expert_cpu_seconds_total", "counter", "Host time in experts computed on the CPU.", "%.6f", x->cpu_s);
        METRIC("expert_device_steps_total", "counter",
               "Decode steps run on the GPU against the slot tables that found every expert in a slot.", "%llu",
               (unsigned long long)x->steps_device);
        METRIC("expert_device_steps_redone_total", "counter",
               "Decode steps run on the GPU that missed an expert and ran again host-driven.", "%llu",
               (unsigned long long)x->steps_redone);
    }
#undef METRIC
}
