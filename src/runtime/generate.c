#include "runtime/generate.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "runtime/stop.h"
#include "text/detok.h"

void sl_gen_defaults_from_model(const char *model_dir, sl_sampler_params *p) {
    char *path = sl_path_join(model_dir, "generation_config.json");
    json_t *g = path ? json_load_file(path, 0, NULL) : NULL;
    free(path);
    if (!json_is_object(g)) {
        json_decref(g);
        return;
    }
    json_t *v;
    if (json_is_number(v = json_object_get(g, "temperature"))) p->temperature = (float)json_number_value(v);
    if (json_is_integer(v = json_object_get(g, "top_k"))) p->top_k = (int)json_integer_value(v);
    if (json_is_number(v = json_object_get(g, "top_p"))) p->top_p = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "min_p"))) p->min_p = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "repetition_penalty"))) p->repeat_penalty = (float)json_number_value(v);
    if (json_is_false(json_object_get(g, "do_sample"))) p->temperature = 0;
    json_decref(g);
}

static int is_eos(const sl_tokenizer *tok, int32_t id) {
    const int32_t *ids;
    int n = sl_tokenizer_eos_ids(tok, &ids);
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

/* The next token under a grammar: the sampler's pick when the grammar allows it, else a pick among the
 * allowed tokens only (logits of the others at -inf). Rejecting a draw and drawing again from the allowed
 * tokens gives each of them its probability renormalised over the allowed set, as a full mask would;
 * with top-k / top-p the truncation is applied to the masked logits only on the second draw. */
static int32_t pick_constrained(sl_sampler *smp, sl_gconstraint *gc, float *logits, sl_err *e) {
    int32_t id = sl_sampler_sample(smp, logits);
    int ok = id < 0 ? 0 : sl_gconstraint_allows(gc, id, e);
    if (ok < 0) return -2;
    if (ok) return id;
    int n = sl_gconstraint_apply(gc, logits, e);
    if (n < 0) return -2;
    if (n == 0) {
        sl_fail(e, "the grammar allows no token of this vocabulary here");
        return -2;
    }
    return sl_sampler_sample(smp, logits);
}

/* Positions [0, k) of the session can be kept: the longest common prefix, minus one token when the whole
 * prompt is cached (its last token must run again to give logits), or less when the recurrent state can
 * only resume from a snapshot. */
static int reuse_prefix(sl_session *s, const int32_t *prompt, int n) {
    int k = sl_session_seq_common(s, 0, prompt, n);
    if (k == n) k--;
    return sl_session_restore(s, k);
}

struct sl_gen {
    const sl_tokenizer *tok;
    sl_gvocab *gv; /* grammar-constrained generation: its own trie, when p->gvocab is not given */
    sl_gconstraint *gc;
    int vocab;
    const sl_gen_params *p;
    sl_sampler *smp;
    sl_stop *stop;
    sl_detok dt;
    int32_t keep[16]; /* ids of p->keep_special */
    int cancelled;
};

int sl_gen_create(const sl_tokenizer *tok, int vocab, const sl_gen_params *p, const int32_t *prompt, int n_prompt,
                  sl_gen **out, sl_err *e) {
    sl_gen *g = calloc(1, sizeof *g);
    if (!g) return sl_fail(e, "out of memory");
    g->tok = tok;
    g->vocab = vocab;
    g->p = p;
    g->smp = sl_sampler_create(&p->sampling, vocab);
    g->stop = sl_stop_create(p->stops, p->n_stops);
    sl_detok_init(&g->dt, tok, 1);
    for (const char *const *k = p->keep_special; k && *k && g->dt.n_keep < 16; k++) {
        int id = sl_tokenizer_token_id(tok, *k);
        if (id >= 0) g->keep[g->dt.n_keep++] = id;
    }
    g->dt.keep = g->keep;
    if (!g->smp || !g->stop) {
        sl_gen_free(g);
        return sl_fail(e, "out of memory");
    }
    if (p->grammar && ((!p->gvocab && sl_gvocab_create(tok, vocab, &g->gv, e)) ||
                       sl_gconstraint_init(p->grammar, p->gvocab ? p->gvocab : g->gv, &g->gc, e))) {
        sl_gen_free(g);
        return -1;
    }
    for (int i = 0; i < n_prompt; i++) sl_sampler_accept(g->smp, prompt[i]);
    *out = g;
    return 0;
}

void sl_gen_free(sl_gen *g) {
    if (!g) return;
    sl_gconstraint_free(g->gc);
    sl_gvocab_free(g->gv);
    sl_detok_free(&g->dt);
    sl_stop_free(g->stop);
    sl_sampler_free(g->smp);
    free(g);
}

int sl_gen_greedy(const sl_gen *g) {
    /* logprobs need the logits on the host */
    return sl_sampler_plain_greedy(g->smp) && !g->p->on_token && !g->gc;
}

int sl_gen_step(sl_gen *g, float *logits, int32_t greedy, int ctx_left, sl_gen_emit_fn emit, void *ud, int32_t *next,
                sl_gen_stats *st, sl_err *e) {
    const sl_gen_params *p = g->p;
    int32_t id = !logits ? greedy
                 : g->gc ? pick_constrained(g->smp, g->gc, logits, e)
                         : sl_sampler_sample(g->smp, logits);
    if (id == -2) return -1;
    if (id < 0) return sl_fail(e, "the model produced no finite logits (NaN or -inf everywhere)");
    if (!p->ignore_eos && is_eos(g->tok, id)) {
        st->finish_reason = "stop";
        return 1;
    }
    if (g->gc && sl_gconstraint_accept(g->gc, id, e)) return -1;
    st->generated_tokens++;
    if (p->on_token && logits) {
        sl_logprobs lp;
        sl_logprobs_compute(logits, g->vocab, id, p->top_logprobs, &lp);
        p->on_token(p->token_ud, &lp);
    }
    sl_sampler_accept(g->smp, id);
    /* embedding tables are often padded past the tokenizer's vocabulary: such ids spell nothing */
    const char *out = "";
    size_t len = 0, tl;
    if (sl_tokenizer_token_bytes(g->tok, id, &tl) && sl_detok_push(&g->dt, id, &out, &len, e)) return -1;
    int stopped = sl_stop_feed(g->stop, out, len, &out, &len, e);
    if (stopped < 0) return -1;
    if (emit(ud, out, len)) {
        st->finish_reason = "cancelled";
        g->cancelled = 1;
        return 1;
    }
    if (stopped || (g->gc && sl_gconstraint_done(g->gc))) {
        st->finish_reason = "stop";
        return 1;
    }
    st->finish_reason = "length";
    if ((p->max_tokens > 0 && st->generated_tokens >= p->max_tokens) || ctx_left <= 0) return 1;
    *next = id;
    return 0;
}

int sl_gen_finish(sl_gen *g, sl_gen_emit_fn emit, void *ud, sl_gen_stats *st, sl_err *e) {
    const char *out;
    size_t len;
    if (!g->cancelled) {
        if (sl_detok_flush(&g->dt, &out, &len, e)) return -1;
        if (!sl_stop_stopped(g->stop) && sl_stop_feed(g->stop, out, len, &out, &len, e) < 0) return -1;
        if (len) emit(ud, out, len);
        if (sl_stop_flush(g->stop, &out, &len)) st->finish_reason = "stop";
        if (len) emit(ud, out, len);
    }
    if (sl_stop_stopped(g->stop)) st->stop_index = sl_stop_which(g->stop);
    return 0;
}

int sl_generate(sl_session *s, const sl_tokenizer *tok, const int32_t *prompt, int n_prompt, const sl_gen_params *p,
                sl_gen_emit_fn emit, void *ud, sl_gen_stats *st, sl_err *e) {
    memset(st, 0, sizeof *st);
    st->prompt_tokens = n_prompt;
    st->stop_index = -1;
    if (n_prompt <= 0) return sl_fail(e, "the prompt is empty");
    if (n_prompt >= s->max_ctx)
        return sl_fail(e, "the prompt has %d tokens but the context holds %d", n_prompt, s->max_ctx);
    int V = s->m->cfg.vocab_size, rc = -1;
    float *logits = malloc((size_t)V * sizeof *logits);
    sl_gen *g = NULL;
    if (!logits) {
        sl_fail(e, "out of memory");
        goto done;
    }
    if (sl_gen_create(tok, V, p, prompt, n_prompt, &g, e)) goto done;
    int k = reuse_prefix(s, prompt, n_prompt);
    st->cached_tokens = k;
    const sl_expert_store *xs = s->m->store;
    sl_store_stats x0 = {0}, x1 = {0}, x2;
    if (xs) sl_store_stats_get(xs, &x0);
    double t0 = sl_now();
    /* Recurrent state is saved just before the last prompt token: a request that repeats this prompt, or
     * continues it differently, resumes from there. */
    if (s->recurrent && n_prompt - k > 1) {
        if (sl_session_forward(s, prompt + k, n_prompt - k - 1, NULL, 0, e) || sl_session_snapshot(s, e)) goto done;
        k = n_prompt - 1;
    }
    /* plain greedy decoding picks each token on the backend: no logits cross to the host */
    int greedy = sl_gen_greedy(g);
    int32_t next = -1;
    if (greedy ? sl_session_forward_argmax(s, prompt + k, n_prompt - k, &next, e)
               : sl_session_forward(s, prompt + k, n_prompt - k, logits, 0, e))
        goto done;
    st->prefill_s = sl_now() - t0;
    if (xs) {
        sl_store_stats_get(xs, &x1);
        st->store_prefill = sl_store_stats_since(&x0, &x1);
        st->has_store = 1;
    }
    t0 = sl_now();
    for (;;) {
        int32_t id = -1;
        int r = sl_gen_step(g, greedy ? NULL : logits, next, s->max_ctx - sl_session_pos(s), emit, ud, &id, st, e);
        if (r < 0) goto done;
        if (r > 0) break;
        if (greedy ? sl_session_forward_argmax(s, &id, 1, &next, e) : sl_session_forward(s, &id, 1, logits, 0, e))
            goto done;
    }
    if (sl_gen_finish(g, emit, ud, st, e)) goto done;
    st->decode_s = sl_now() - t0;
    if (xs) {
        sl_store_stats_get(xs, &x2);
        st->store_decode = sl_store_stats_since(&x1, &x2);
    }
    /* the next turn of this conversation usually starts with everything fed so far */
    if (s->recurrent && strcmp(st->finish_reason, "cancelled") != 0 && sl_session_snapshot(s, e)) goto done;
    rc = 0;
done:
    sl_gen_free(g);
    free(logits);
    return rc;
}
