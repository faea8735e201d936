/* sluice serve: the OpenAI, Anthropic and Ollama HTTP APIs on one port. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/stream_flags.h"
#include "core/util.h"
#include "server/engine.h"
#include "server/http.h"

/* sigwait only sees signals that are not ignored, and a parent may have left SIGINT ignored */
static void on_signal(int sig) {
    (void)sig;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: sluice serve MODEL [options]\n\n"
            "Serves MODEL over HTTP: OpenAI /v1/chat/completions, /v1/completions, /v1/models; Anthropic\n"
            "/v1/messages, /v1/messages/count_tokens; Ollama /api/chat, /api/generate, /api/tags, /api/show,\n"
            "/api/ps, /api/version; plus GET /health and GET /metrics (Prometheus). Up to --parallel requests\n"
            "are generated at once (continuous batching: each step runs the next token of every request and a\n"
            "chunk of a prompt being read); the others wait in a queue. Finished conversations stay cached\n"
            "until their memory is needed: a request continuing one, or sharing a prefix with any, reuses it.\n\n"
            "options:\n"
            "  --host ADDR        address to listen on (default 127.0.0.1)\n"
            "  --port N           port (default 8080; 0 picks a free one)\n"
            "  --api-key KEY      require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on every route but\n"
            "                     /health (default: $SLUICE_API_KEY, else no key)\n"
            "  --alias NAME       model name the APIs report (default: the MODEL argument)\n"
            "  --ctx N            context length (default: the model's, capped by free memory)\n"
            "  --threads N        CPU threads (default: all cores)\n"
            "  --backend B        cpu, cuda or auto (default: SLUICE_BACKEND, else auto)\n" CLI_STREAM_HELP CLI_KV_HELP
            "  --parallel N       requests generated at once (default: as many as fit in memory at the\n"
            "                     context length, at most 32)\n"
            "  --kv-size SIZE     memory of the KV cache pool shared by all sequences, e.g. 8G (default:\n"
            "                     half the free GPU memory, a quarter of the host's on the CPU)\n"
            "  --queue N          requests that may wait beyond --parallel; more get 503 (default 16)\n"
            "  --max-body SIZE    largest request body, e.g. 16M (default 16M)\n"
            "  --timing           log each request's prefill and decode times to stderr (with streamed\n"
            "                     experts, the expert store's figures of each phase) and the model's load time\n");
}

int cmd_serve(int argc, char **argv) {
    sv_engine_opts eo = {.queue = 16};
    sv_server_opts so = {.host = "127.0.0.1", .port = 8080, .api_key = getenv("SLUICE_API_KEY"), .max_body = 16 << 20};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define FLAG(name) (!strcmp(a, name) && v && (i++, 1))
        int sf = cli_stream_flag("sluice serve", a, v, &eo.mo);
        if (sf < 0) return 2;
        if (sf > 0) {
            i += sf - 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (FLAG("--host")) {
            so.host = v;
        } else if (FLAG("--port")) {
            char *end;
            long p = strtol(v, &end, 10);
            if (*end || p < 0 || p > 65535) {
                fprintf(stderr, "sluice serve: --port must be a number in [0, 65535], got '%s'\n", v);
                return 2;
            }
            so.port = (int)p;
        } else if (FLAG("--api-key")) {
            so.api_key = v;
        } else if (FLAG("--alias")) {
            eo.alias = v;
        } else if (FLAG("--ctx")) {
            eo.ctx = atoi(v);
        } else if (FLAG("--threads")) {
            eo.threads = atoi(v);
        } else if (FLAG("--backend")) {
            eo.backend = v;
        } else if (!strcmp(a, "--timing")) {
            eo.timing = 1;
        } else if (FLAG("--parallel")) {
            char *end;
            long p = strtol(v, &end, 10);
            if (*end || p < 1 || p > 256) {
                fprintf(stderr, "sluice serve: --parallel must be a number in [1, 256], got '%s'\n", v);
                return 2;
            }
            eo.parallel = (int)p;
        } else if (FLAG("--kv-size")) {
            uint64_t n;
            if (sl_parse_size(v, &n) || n == 0) {
                fprintf(stderr, "sluice serve: --kv-size must be a size such as 8G, got '%s'\n", v);
                return 2;
            }
            eo.kv_bytes = (int64_t)n;
        } else if (FLAG("--queue")) {
            eo.queue = atoi(v);
        } else if (FLAG("--max-body")) {
            uint64_t n;
            if (sl_parse_size(v, &n) || n == 0) {
                fprintf(stderr, "sluice serve: --max-body must be a size such as 16M, got '%s'\n", v);
                return 2;
            }
            so.max_body = (size_t)n;
        } else if (a[0] != '-' && !eo.model) {
            eo.model = a;
        } else {
            fprintf(stderr, "sluice serve: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
#undef FLAG
    }
    if (!eo.model) {
        usage(stderr);
        return 2;
    }
    /* signals are taken by sigwait below, so every thread started from here on blocks them */
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    sv_engine g;
    sv_server srv = {0};
    sl_err e = {{0}};
    int rc = 1;
    if (sv_engine_init(&g, eo.queue, &e)) {
        fprintf(stderr, "sluice serve: %s\n", e.msg);
        return 2;
    }
    if (sv_server_start(&srv, &g, &so, &e)) goto done;
    fprintf(stderr, "sluice serve: listening on http://%s%s%s:%d (loading %s)\n", strchr(so.host, ':') ? "[" : "",
            so.host, strchr(so.host, ':') ? "]" : "", srv.port, eo.model);
    if (sv_engine_load(&g, &eo, &e)) goto done;
    {
        char kv[32];
        int kv_free, kv_total;
        sl_session_pages(g.s, &kv_free, &kv_total);
        fprintf(stderr,
                "sluice serve: ready: model '%s', context %d tokens, %d requests at once, KV cache %s %s (%d "
                "positions), loaded in %.1f s%s\n",
                g.name, g.ctx, g.parallel,
                sl_human_bytes((double)kv_total * SL_KV_PAGE * (double)sl_session_kv_bytes_per_token(g.m, g.s->kv_type),
                               kv, sizeof kv),
                sl_kv_type_name(g.s->kv_type), kv_total * SL_KV_PAGE, g.load_s,
                so.api_key && *so.api_key ? ", API key required" : "");
    }
    if (eo.timing)
        fprintf(stderr, "sluice serve: timing: model load %.3f s of %.3f s to ready\n", g.model_load_s, g.load_s);
    int sig;
    sigwait(&sigs, &sig);
    fprintf(stderr, "sluice serve: %s, shutting down\n", sig == SIGINT ? "interrupted" : "terminated");
    rc = 0;
done:
    if (rc) fprintf(stderr, "sluice serve: %s\n", e.msg);
    sv_engine_shutdown(&g);
    sv_server_stop(&srv);
    sv_engine_free(&g);
    return rc;
}
