#include "server/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "formats/resolve.h"
#include "text/chat.h"

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
    uint64_t z = (g->seed_state += 0x9e3779b97f4a7c15ull);
    pthread_mutex_unlock(&g->mu);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
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

static int on_text(void *ud, const char *text, size_t len) {
    run_ctx *r = ud;
    sv_job *j = r->j;
    pthread_mutex_lock(&j->mu);
    if (!j->began) {
        j->began = 1;
        j->w->begin(j);
    }
    if (!j->cancelled) feed_forced(r);
    if (len && !j->cancelled) {
        if (r->parser) {
            sl_err e;
            if (sl_tc_parser_feed(r->parser, text, len, on_event, j, &e)) j->content.oom = 1;
        } else {
            sl_tc_event ev = {.kind = SL_TC_TEXT, .tool_index = -1, .text = text, .len = len};
            on_event(j, &ev);
        }
    }
    int stop = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return stop;
}

/* The --timing line of one finished generation: a single write, so lines never interleave. */
static void log_timing(const sv_engine *g, const sv_job *j) {
    const sl_gen_stats *st = &j->st;
    int fed = st->prompt_tokens - st->cached_tokens, n = st->generated_tokens;
    sv_buf b = {0};
    sv_buf_printf(&b,
                  "sluice serve: %s model '%s': prompt %d tokens (%d cached), prefill %.3f s %.1f tok/s | "
                  "decode %d tokens, %.3f s %.1f tok/s | %s",
                  j->route[0] ? j->route : "-", g->name, st->prompt_tokens, st->cached_tokens, st->prefill_s,
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

/* Work other than a generation (embeddings): the job's own run writes its whole response. */
static void run_other(sv_engine *g, sv_job *j) {
    j->run(j, g->s);
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void run_job(sv_engine *g, sv_job *j) {
    pthread_mutex_lock(&j->mu);
    int skip = j->cancelled;
    if (skip) j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (skip) {
        pthread_mutex_lock(&g->mu);
        g->met.cancelled++;
        pthread_mutex_unlock(&g->mu);
        return;
    }
    j->t_started = sl_now();
    if (j->run) {
        run_other(g, j);
        return;
    }
    run_ctx r = {.j = j};
    sl_err e = {{0}};
    int rc = 0;
    if (j->parse_output && !(r.parser = sl_tc_parser_create(j->starts_in_reasoning, j->tools)))
        rc = sl_fail(&e, "out of memory");
    if (!rc) rc = sl_generate(g->s, g->tok, j->ids, j->n_ids, &j->gen, on_text, &r, &j->st, &e);
    pthread_mutex_lock(&j->mu);
    if (!rc && !j->cancelled) feed_forced(&r);
    if (!rc && r.parser && !j->cancelled && sl_tc_parser_finish(r.parser, on_event, j, &e)) rc = -1;
    if (!rc && (j->content.oom || j->reasoning.oom)) rc = sl_fail(&e, "out of memory");
    if (!j->began && !j->cancelled) {
        j->began = 1;
        if (!rc) j->w->begin(j);
    }
    if (rc) {
        j->failed = 1;
        j->w->fail(j, e.msg);
    } else if (!j->cancelled) {
        j->w->finish(j);
    }
    int cancelled = j->cancelled;
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    sl_tc_parser_free(r.parser);
    if (g->timing && !rc) log_timing(g, j);

    pthread_mutex_lock(&g->mu);
    sv_metrics *mt = &g->met;
    mt->generations++;
    if (rc) mt->failed++;
    if (cancelled) mt->cancelled++;
    mt->prompt_tokens += (unsigned long long)j->st.prompt_tokens;
    mt->cached_tokens += (unsigned long long)j->st.cached_tokens;
    mt->generated_tokens += (unsigned long long)j->st.generated_tokens;
    if (j->st.cached_tokens > 0) mt->prefix_hits++;
    mt->prefill_s += j->st.prefill_s;
    mt->decode_s += j->st.decode_s;
    if (j->st.prefill_s > 0) mt->last_prefill_tps = (j->st.prompt_tokens - j->st.cached_tokens) / j->st.prefill_s;
    if (j->st.decode_s > 0) mt->last_decode_tps = j->st.generated_tokens / j->st.decode_s;
    if (g->m->store) { /* a copy, since the store is the worker's alone */
        mt->streaming = 1;
        sl_store_stats_get(g->m->store, &mt->xs);
    }
    pthread_mutex_unlock(&g->mu);
}

static void *worker(void *arg) {
    sv_engine *g = arg;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->stopping && g->q_len == 0) pthread_cond_wait(&g->cv, &g->mu);
        if (g->stopping) {
            pthread_mutex_unlock(&g->mu);
            return NULL;
        }
        sv_job *j = g->q[g->q_head];
        g->q_head = (g->q_head + 1) % g->q_cap;
        g->q_len--;
        g->busy = 1;
        g->current = j;
        pthread_mutex_unlock(&g->mu);
        run_job(g, j);
        pthread_mutex_lock(&g->mu);
        g->busy = 0;
        g->current = NULL; /* before the release: shutdown may look at it */
        pthread_mutex_unlock(&g->mu);
        sv_job_release(j);
    }
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
    }
    g->ctx = o->ctx > 0 ? o->ctx : sl_session_default_ctx(g->m);
    g->timing = o->timing;
    if (g->ctx > g->m->cfg.max_pos)
        return sl_fail(e, "--ctx %d exceeds the model's max_position_embeddings %d", g->ctx, g->m->cfg.max_pos);
    if (sl_session_create(g->m, g->ctx, &g->s, e)) return -1;
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
    if (g->current) {
        pthread_mutex_lock(&g->current->mu);
        g->current->cancelled = 1;
        pthread_mutex_unlock(&g->current->mu);
    }
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
    sl_model_free(g->m);
    sl_tokenizer_free(g->tok);
    sl_jinja_free(g->tmpl);
    free(g->tmpl_src);
    free(g->dir);
    free(g->name);
    free(g->q);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

void sv_engine_metrics(sv_engine *g, sv_buf *o) {
    pthread_mutex_lock(&g->mu);
    sv_metrics m = g->met;
    int q = g->q_len, busy = g->busy, ready = g->ready;
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
    METRIC("busy", "gauge", "1 while a generation runs.", "%d", busy);
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
        METRIC("expert_predicted_total", "counter", "Experts guessed for the next layer.", "%llu",
               (unsigned long long)x->predicted);
        METRIC("expert_predicted_used_total", "counter", "Guessed experts the next layer was routed to.", "%llu",
               (unsigned long long)x->predicted_used);
    }
#undef METRIC
}
