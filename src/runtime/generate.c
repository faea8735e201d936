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
    int k = 0;
    while (k < s->pos && k < n && s->hist[k] == prompt[k]) k++;
    if (k == n) k--;
    return sl_session_restore(s, k);
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
    sl_sampler *smp = sl_sampler_create(&p->sampling, V);
    sl_stop *stop = sl_stop_create(p->stops, p->n_stops);
    sl_detok dt;
    sl_detok_init(&dt, tok, 1);
    sl_gvocab *gv = NULL;
    sl_gconstraint *gc = NULL;
    if (!logits || !smp || !stop) {
        sl_fail(e, "out of memory");
        goto done;
    }
    if (p->grammar && (sl_gvocab_create(tok, V, &gv, e) || sl_gconstraint_init(p->grammar, gv, &gc, e))) goto done;
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
    int greedy = sl_sampler_plain_greedy(smp) && !gc;
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
    for (int i = 0; i < n_prompt; i++) sl_sampler_accept(smp, prompt[i]);
    t0 = sl_now();
    st->finish_reason = "length";
    const char *out;
    size_t len;
    for (;;) {
        int32_t id = greedy ? next : gc ? pick_constrained(smp, gc, logits, e) : sl_sampler_sample(smp, logits);
        if (id == -2) goto done;
        if (id < 0) {
            sl_fail(e, "the model produced no finite logits (NaN or -inf everywhere)");
            goto done;
        }
        if (!p->ignore_eos && is_eos(tok, id)) {
            st->finish_reason = "stop";
            break;
        }
        if (gc && sl_gconstraint_accept(gc, id, e)) goto done;
        st->generated_tokens++;
        sl_sampler_accept(smp, id);
        /* embedding tables are often padded past the tokenizer's vocabulary: such ids spell nothing */
        size_t tl;
        if (!sl_tokenizer_token_bytes(tok, id, &tl)) {
            out = "";
            len = 0;
        } else if (sl_detok_push(&dt, id, &out, &len, e)) {
            goto done;
        }
        int stopped = sl_stop_feed(stop, out, len, &out, &len, e);
        if (stopped < 0) goto done;
        if (emit(ud, out, len)) {
            st->finish_reason = "cancelled";
            break;
        }
        if (stopped || (gc && sl_gconstraint_done(gc))) {
            st->finish_reason = "stop";
            break;
        }
        if ((p->max_tokens > 0 && st->generated_tokens >= p->max_tokens) || s->pos >= s->max_ctx) break;
        if (greedy ? sl_session_forward_argmax(s, &id, 1, &next, e) : sl_session_forward(s, &id, 1, logits, 0, e))
            goto done;
    }
    if (strcmp(st->finish_reason, "cancelled") != 0) {
        if (sl_detok_flush(&dt, &out, &len, e)) goto done;
        if (!sl_stop_stopped(stop) && sl_stop_feed(stop, out, len, &out, &len, e) < 0) goto done;
        if (len) emit(ud, out, len);
        if (sl_stop_flush(stop, &out, &len)) st->finish_reason = "stop";
        if (len) emit(ud, out, len);
    }
    st->decode_s = sl_now() - t0;
    if (xs) {
        sl_store_stats_get(xs, &x2);
        st->store_decode = sl_store_stats_since(&x1, &x2);
    }
    if (sl_stop_stopped(stop)) st->stop_index = sl_stop_which(stop);
    /* the next turn of this conversation usually starts with everything fed so far */
    if (s->recurrent && strcmp(st->finish_reason, "cancelled") != 0 && sl_session_snapshot(s, e)) goto done;
    rc = 0;
done:
    sl_gconstraint_free(gc);
    sl_gvocab_free(gv);
    sl_detok_free(&dt);
    sl_stop_free(stop);
    sl_sampler_free(smp);
    free(logits);
    return rc;
}
