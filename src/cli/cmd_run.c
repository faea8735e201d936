/* sluice run: chat with a model in the terminal (line editing, multi-turn, /reset, /exit), or answer
 * one prompt given as an argument or piped on stdin. */
#include <editline/readline.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/chat_view.h"
#include "cli/commands.h"
#include "cli/stream_flags.h"
#include "core/util.h"
#include "experts/store.h"
#include "formats/resolve.h"
#include "runtime/generate.h"
#include "text/chat.h"
#include "text/jinja.h"

#define MAX_STOPS 16

typedef struct run_opts {
    const char *model, *prompt, *system, *backend;
    int ctx, threads, raw, think, verbose, timing;
    sl_model_opts mo; /* --vram, --ram, --io */
    sl_gen_params gen;
    const char *stops[MAX_STOPS];
} run_opts;

typedef struct run_ctx {
    run_opts *o;
    sl_model *m;
    sl_session *s;
    sl_tokenizer *tok;
    sl_jinja *tmpl;
    sl_tc_format fmt; /* the template's markup of reasoning and tool calls */
    json_t *messages;
    char *reply; /* text of the assistant turn being generated */
    size_t reply_len, reply_cap;
    chat_view view;
    int interactive;
    double load_s;  /* sl_model_load's wall time, for --timing */
    int load_shown; /* the load row goes in the first table only */
} run_ctx;

/* Ctrl-C during a reply stops that reply, not the chat. A signal handler can only reach static storage,
 * so this flag is the one piece of state outside run_ctx. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: sluice run MODEL [PROMPT] [options]\n\n"
        "Chats with MODEL. With PROMPT, or with a prompt piped on stdin, answers once and exits;\n"
        "otherwise reads lines interactively (/reset starts over, /exit or Ctrl-D quits, Ctrl-C stops a\n"
        "reply). On a terminal, reasoning is shown dimmed and tool calls on lines of their own.\n\n"
        "options:\n"
        "  --system TEXT          system message\n"
        "  --raw                  no chat template: continue PROMPT as plain text\n"
        "  --think, --no-think    pass enable_thinking to the chat template\n"
        "  -n, --max-tokens N     stop after N generated tokens (default: until end of turn)\n"
        "  --ctx N                context length (default: the model's, capped by free memory)\n"
        "  --threads N            CPU threads (default: all cores)\n"
        "  --backend B            cpu, cuda or auto (default: SLUICE_BACKEND, else auto)\n" CLI_STREAM_HELP CLI_KV_HELP
        "  --temp T               temperature, 0 = greedy (default: generation_config.json, else 0.8)\n"
        "  --top-k K, --top-p P, --min-p P\n"
        "  --repeat-penalty R, --repeat-last-n N, --presence-penalty P, --frequency-penalty F\n"
        "  --seed S               random seed (same seed and input give the same output)\n"
        "  --stop TEXT            stop string, repeatable; never printed\n"
        "  --verbose              print the rendered prompt to stderr\n"
        "  --timing               after each reply, print load, prefill and decode times to stderr\n"
        "                         (with streamed experts, the expert store's figures of each phase)\n");
}

static int emit(void *ud, const char *text, size_t len) {
    run_ctx *c = ud;
    sl_err e;
    if (interrupted) return 1;
    if (!len) return 0;
    if (chat_view_feed(&c->view, text, len, &e)) return 1;
    if (c->reply_len + len + 1 > c->reply_cap) {
        size_t cap = (c->reply_len + len + 1) * 2;
        char *p = realloc(c->reply, cap);
        if (!p) return 1;
        c->reply = p;
        c->reply_cap = cap;
    }
    memcpy(c->reply + c->reply_len, text, len);
    c->reply_len += len;
    c->reply[c->reply_len] = 0;
    return 0;
}

/* A duration as bench shows it below a second (ms), in seconds above. */
static const char *secs(double s, char *buf, size_t n) {
    snprintf(buf, n, s < 1 ? "%.1f ms" : "%.2f s", s < 1 ? s * 1e3 : s);
    return buf;
}

/* The --timing table: a phase per row, the expert store's figures of that phase under it. */
static void print_timing(run_ctx *c, const sl_gen_stats *st) {
    char line[256], t[32];
    if (!c->load_shown) {
        fprintf(stderr, "  %-10s%s\n", "load", secs(c->load_s, t, sizeof t));
        c->load_shown = 1;
    }
    int fed = st->prompt_tokens - st->cached_tokens, n = st->generated_tokens;
    fprintf(stderr, "  %-10s%d tokens, %d cached, %s, %.1f tok/s\n", "prefill", fed, st->cached_tokens,
            secs(st->prefill_s, t, sizeof t), st->prefill_s > 0 ? fed / st->prefill_s : 0.0);
    if (st->has_store)
        fprintf(stderr, "  %-10s%s\n", "  experts", sl_store_stats_line(&st->store_prefill, line, sizeof line));
    fprintf(stderr, "  %-10s%d tokens, %s, %.1f tok/s, %.2f ms/token\n", "decode", n, secs(st->decode_s, t, sizeof t),
            st->decode_s > 0 ? n / st->decode_s : 0.0, n > 0 ? st->decode_s * 1e3 / n : 0.0);
    if (st->has_store)
        fprintf(stderr, "  %-10s%s\n", "  experts", sl_store_stats_line(&st->store_decode, line, sizeof line));
}

static json_t *message(const char *role, const char *content) {
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* Renders the conversation (or takes the raw text), tokenises it and generates one reply. */
static int turn(run_ctx *c, const char *user, sl_err *e) {
    char *prompt = NULL;
    size_t plen = 0;
    int32_t *ids = NULL;
    int n = 0, rc = -1;
    if (c->tmpl) {
        json_array_append_new(c->messages, message("user", user));
        sl_chat_input in = {.messages = c->messages, .add_generation_prompt = 1, .enable_thinking = c->o->think};
        if (sl_chat_render(c->tmpl, &in, sl_tokenizer_bos(c->tok), sl_tokenizer_eos(c->tok), &prompt, &plen, e))
            goto done;
    } else {
        prompt = strdup(user);
        plen = strlen(user);
    }
    if (c->o->verbose) fprintf(stderr, "--- prompt ---\n%s\n--------------\n", prompt);
    if (sl_tokenizer_encode(c->tok, prompt, plen, c->tmpl == NULL, &ids, &n, e)) goto done;
    c->reply_len = 0;
    if (c->reply) c->reply[0] = 0;
    /* templates that open the reasoning block in the prompt make the reply start inside it */
    int in_think = plen >= 7 && (strstr(prompt + plen - (plen < 9 ? plen : 9), "<think>") != NULL);
    /* On a terminal the view parses the reply, so it needs the format's markup even where that is made of
     * special tokens (Hermes markup is ordinary text) */
    int styled = isatty(STDOUT_FILENO);
    c->o->gen.keep_special = styled && c->fmt != SL_TC_HERMES ? sl_tc_format_tokens(c->fmt) : NULL;
    if (chat_view_begin(&c->view, stdout, styled, c->fmt, in_think, e)) goto done;
    struct sigaction sa = {.sa_handler = on_sigint}, old;
    interrupted = 0;
    if (c->interactive) sigaction(SIGINT, &sa, &old);
    sl_gen_stats st;
    int grc = sl_generate(c->s, c->tok, ids, n, &c->o->gen, emit, c, &st, e);
    if (c->interactive) sigaction(SIGINT, &old, NULL);
    if (chat_view_end(&c->view, grc ? NULL : e) && !grc) goto done;
    if (grc) goto done;
    printf(interrupted ? "\n[interrupted]\n" : "\n");
    if (c->tmpl && c->o->gen.keep_special) {
        /* such templates take the content alone (gpt-oss's refuses its own markup in a message) */
        char *content = NULL, *reasoning = NULL;
        json_t *calls = NULL;
        if (sl_tc_parse_all(c->fmt, c->reply ? c->reply : "", c->reply_len, in_think, NULL, &content, &reasoning,
                            &calls, e))
            goto done;
        json_array_append_new(c->messages, message("assistant", content));
        free(content);
        free(reasoning);
        json_decref(calls);
    } else if (c->tmpl) {
        json_array_append_new(c->messages, message("assistant", c->reply ? c->reply : ""));
    }
    fprintf(stderr, "[prompt %d tokens (%d cached), %.1f tok/s | decode %d tokens, %.1f tok/s | %s]\n",
            st.prompt_tokens, st.cached_tokens,
            st.prefill_s > 0 ? (st.prompt_tokens - st.cached_tokens) / st.prefill_s : 0.0, st.generated_tokens,
            st.decode_s > 0 ? st.generated_tokens / st.decode_s : 0.0, st.finish_reason);
    if (c->o->timing) print_timing(c, &st);
    rc = 0;
done:
    free(prompt);
    free(ids);
    return rc;
}

static void reset(run_ctx *c) {
    json_array_clear(c->messages);
    if (c->o->system) json_array_append_new(c->messages, message("system", c->o->system));
    sl_session_reset(c->s);
}

/* Flags override the sampling defaults already in o (the checkpoint's, see cmd_run). */
static int parse_args(int argc, char **argv, run_opts *o) {
    o->think = -1;
    o->gen.n_stops = 0;
    int positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define FLAG(name) (!strcmp(a, name) && v && (i++, 1))
        int sf = cli_stream_flag("sluice run", a, v, &o->mo);
        if (sf < 0) return -1;
        if (sf > 0) {
            i += sf - 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--raw"))
            o->raw = 1;
        else if (!strcmp(a, "--think"))
            o->think = 1;
        else if (!strcmp(a, "--no-think"))
            o->think = 0;
        else if (!strcmp(a, "--verbose"))
            o->verbose = 1;
        else if (!strcmp(a, "--timing"))
            o->timing = 1;
        else if (FLAG("--system"))
            o->system = v;
        else if (FLAG("-n") || FLAG("--max-tokens"))
            o->gen.max_tokens = atoi(v);
        else if (FLAG("--ctx"))
            o->ctx = atoi(v);
        else if (FLAG("--threads"))
            o->threads = atoi(v);
        else if (FLAG("--backend"))
            o->backend = v;
        else if (FLAG("--temp"))
            o->gen.sampling.temperature = strtof(v, NULL);
        else if (FLAG("--top-k"))
            o->gen.sampling.top_k = atoi(v);
        else if (FLAG("--top-p"))
            o->gen.sampling.top_p = strtof(v, NULL);
        else if (FLAG("--min-p"))
            o->gen.sampling.min_p = strtof(v, NULL);
        else if (FLAG("--repeat-penalty"))
            o->gen.sampling.repeat_penalty = strtof(v, NULL);
        else if (FLAG("--repeat-last-n"))
            o->gen.sampling.repeat_last_n = atoi(v);
        else if (FLAG("--presence-penalty"))
            o->gen.sampling.presence_penalty = strtof(v, NULL);
        else if (FLAG("--frequency-penalty"))
            o->gen.sampling.frequency_penalty = strtof(v, NULL);
        else if (FLAG("--seed"))
            o->gen.sampling.seed = strtoull(v, NULL, 10);
        else if (FLAG("--stop")) {
            if (o->gen.n_stops == MAX_STOPS) {
                fprintf(stderr, "sluice run: at most %d --stop strings\n", MAX_STOPS);
                return -1;
            }
            o->stops[o->gen.n_stops++] = v;
        } else if (a[0] != '-' && positional == 0) {
            o->model = a;
            positional++;
        } else if (a[0] != '-' && positional == 1) {
            o->prompt = a;
            positional++;
        } else {
            fprintf(stderr, "sluice run: unexpected argument '%s'\n", a);
            return -1;
        }
#undef FLAG
    }
    o->gen.stops = o->stops;
    if (!o->model) return -1;
    return 0;
}

int cmd_run(int argc, char **argv) {
    run_opts o = {0};
    sl_sampler_params_default(&o.gen.sampling);
    if (parse_args(argc, argv, &o)) {
        usage(stderr);
        return 2;
    }
    run_ctx c = {.o = &o};
    sl_err e = {{0}};
    int rc = 1;
    char *piped = NULL, *dir = NULL;
    if (sl_resolve_model(o.model, &dir, &e)) goto done;
    /* sampling: llama.cpp's defaults, then the checkpoint's generation_config.json, then the flags */
    sl_sampler_params_default(&o.gen.sampling);
    sl_gen_defaults_from_model(dir, &o.gen.sampling);
    parse_args(argc, argv, &o);
    sl_model_opts mo = o.mo;
    mo.threads = o.threads;
    mo.backend = o.backend;
    mo.ctx = o.ctx;
    if (sl_tokenizer_load(dir, &c.tok, &e)) goto done;
    double t0 = sl_now();
    if (sl_model_load(dir, &mo, &c.m, &e)) goto done;
    c.load_s = sl_now() - t0;
    if (sl_session_create(c.m, o.ctx > 0 ? o.ctx : sl_session_default_ctx(c.m, SL_KV_AUTO), &c.s, &e)) goto done;
    const char *tsrc = sl_tokenizer_chat_template(c.tok);
    if (!o.raw && tsrc && sl_jinja_parse(tsrc, strlen(tsrc), &c.tmpl, &e)) {
        sl_wrap(&e, "%s: chat template", o.model);
        goto done;
    }
    c.fmt = sl_tc_format_detect(tsrc);
    if (!o.raw && !tsrc) fprintf(stderr, "sluice run: %s has no chat template; continuing plain text\n", o.model);
    c.messages = json_array();
    reset(&c);
    if (!o.prompt && !isatty(STDIN_FILENO)) {
        if (sl_read_stream(stdin, "stdin", &piped, NULL, &e)) goto done;
        /* `echo ... | sluice run` ends the prompt with a newline that is not part of the question */
        size_t L = strlen(piped);
        while (L && (piped[L - 1] == '\n' || piped[L - 1] == '\r')) piped[--L] = 0;
        o.prompt = piped;
    }
    if (o.prompt) {
        rc = turn(&c, o.prompt, &e) ? 1 : 0;
        goto done;
    }
    c.interactive = 1;
    for (char *line; (line = readline(">>> ")) != NULL; free(line)) {
        if (!*line) continue;
        add_history(line);
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit") || !strcmp(line, "/bye")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/reset") || !strcmp(line, "/clear")) {
            reset(&c);
            fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        if (turn(&c, line, &e)) fprintf(stderr, "sluice run: %s\n", e.msg);
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "sluice run: %s\n", e.msg);
    free(dir);
    free(piped);
    free(c.reply);
    json_decref(c.messages);
    sl_jinja_free(c.tmpl);
    sl_session_free(c.s);
    sl_model_free(c.m);
    sl_tokenizer_free(c.tok);
    return rc;
}
