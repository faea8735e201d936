/* sluice bench: prefill and decode speed of a model on synthetic token ids, with the weight bandwidth
 * that decode achieves — the figure a memory-bound decoder is judged by. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "cli/commands.h"
#include "core/util.h"
#include "runtime/session.h"

static void usage(FILE *f) {
    fprintf(f, "usage: sluice bench MODEL [-p N] [-n M] [-r R] [--threads T] [--backend B] [--json]\n\n"
               "Loads MODEL, prefills N pseudo-random token ids (default 512) as one batch, then decodes M\n"
               "tokens one at a time (default 128), each the greedy argmax of the previous logits. The ids are\n"
               "the same on every run. With -r R the whole prefill+decode is repeated R times from an empty\n"
               "cache and the best (fastest) time of each phase is reported.\n\n"
               "Decode bandwidth counts the weight bytes one token reads: every matrix once, one row of the\n"
               "embedding table (the whole table when it is tied to the output head), and top_k of n_experts\n"
               "routed experts per MoE layer. Prefill GFLOP/s counts 2 x active parameters x tokens, the output\n"
               "head once (only the last prompt token needs logits); attention scores are not counted.\n\n"
               "  -p N          prompt tokens (default 512)\n"
               "  -n M          decoded tokens (default 128; 0 skips decode)\n"
               "  -r R          runs, best reported (default 1)\n"
               "  --threads T   CPU threads (default: all cores)\n"
               "  --backend B   cpu, cuda or auto (default: SLUICE_BACKEND, else auto)\n"
               "  --json        one JSON object instead of the table\n");
}

/* Bytes and parameters one decoded token touches (see usage()). */
typedef struct {
    double bytes, params;
    double head_params; /* the output head's share of params: prefill runs it for the last token only */
} traffic;

static void tally(traffic *t, const sl_weight *w, double frac) {
    if (!w->data) return;
    t->bytes += frac * (double)sl_weight_bytes(w);
    t->params += frac * (double)w->rows * (double)w->cols;
}

static traffic per_token_traffic(const sl_model *m) {
    traffic t = {0, 0, 0};
    const sl_config *c = &m->cfg;
    tally(&t, &m->lm_head, 1.0);
    t.head_params = t.params;
    if (m->embed.data != m->lm_head.data) t.bytes += (double)m->embed.row_bytes;
    for (int l = 0; l < c->n_layers; l++) {
        const sl_layer *L = &m->layers[l];
        const sl_weight *ws[] = {&L->wq,     &L->wk,      &L->wv,       &L->wo,      &L->in_qkv,   &L->in_z,
                                 &L->in_a,   &L->in_b,    &L->out_proj, &L->w_gate,  &L->w_up,     &L->w_down,
                                 &L->router, &L->sh_gate, &L->sh_up,    &L->sh_down, &L->sh_router};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) tally(&t, ws[i], 1.0);
        if (!L->is_moe || L->experts.n_experts == 0) continue;
        double frac = (double)c->top_k / (double)L->experts.n_experts;
        for (int x = 0; x < L->experts.n_experts; x++) {
            const sl_expert *ex = L->experts.experts[x];
            tally(&t, &ex->gate, frac);
            tally(&t, &ex->up, frac);
            tally(&t, &ex->down, frac);
        }
    }
    return t;
}

static int parse_int(const char *s, int lo, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > 1 << 24) return -1;
    *out = (int)v;
    return 0;
}

/* splitmix64: fixed-seed ids so every run and every machine feeds the same prompt */
static uint64_t next_rand(uint64_t *st) {
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t argmax(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

typedef struct {
    int prompt, gen, runs, threads;
    double load_s, prefill_s, decode_s; /* best of the runs */
    double weight_bytes;
    traffic tok;
} bench_result;

static double prefill_gflop(const bench_result *r) {
    return 2.0 * ((r->tok.params - r->tok.head_params) * r->prompt + r->tok.head_params) / 1e9;
}

static void print_table(const sl_model *m, const bench_result *r) {
    char b1[32], b2[32], b3[32];
    printf("%s\n", m->path);
    printf("  %-22s%s (%s family), %s parameters\n", "model", m->cfg.model_type, m->family->name,
           sl_human_count((double)m->n_params, b1, sizeof b1));
    printf("  %-22s%s, %d thread%s\n", "backend", m->be->ops->name, r->threads, r->threads == 1 ? "" : "s");
    printf("  %-22s%s\n", "weights", sl_human_bytes(r->weight_bytes, b1, sizeof b1));
    printf("  %-22s%.1f ms\n", "load", r->load_s * 1e3);
    double pf = r->prompt / r->prefill_s;
    printf("  %-22s%d tokens in %.1f ms: %.1f tok/s, %.1f GFLOP/s\n", "prefill", r->prompt, r->prefill_s * 1e3, pf,
           prefill_gflop(r) / r->prefill_s);
    if (r->gen > 0) {
        double per = r->decode_s / r->gen;
        printf("  %-22s%d tokens in %.1f ms: %.2f ms/token, %.1f tok/s\n", "decode", r->gen, r->decode_s * 1e3,
               per * 1e3, 1.0 / per);
        printf("  %-22s%s/token (%s active parameters)\n", "decode weight reads",
               sl_human_bytes(r->tok.bytes, b2, sizeof b2), sl_human_count(r->tok.params, b3, sizeof b3));
        printf("  %-22s%.2f GB/s\n", "decode bandwidth", r->tok.bytes / per / 1e9);
    }
    printf("  %-22s%d (best time of each phase shown)\n", "runs", r->runs);
}

static int print_json(const sl_model *m, const bench_result *r) {
    json_t *o = json_object();
    if (!o) return -1;
    double pf = r->prompt / r->prefill_s;
    json_object_set_new(o, "model", json_string(m->path));
    json_object_set_new(o, "model_type", json_string(m->cfg.model_type));
    json_object_set_new(o, "family", json_string(m->family->name));
    json_object_set_new(o, "params", json_integer((json_int_t)m->n_params));
    json_object_set_new(o, "backend", json_string(m->be->ops->name));
    json_object_set_new(o, "threads", json_integer(r->threads));
    json_object_set_new(o, "weight_bytes", json_integer((json_int_t)r->weight_bytes));
    json_object_set_new(o, "runs", json_integer(r->runs));
    json_object_set_new(o, "load_s", json_real(r->load_s));
    json_object_set_new(o, "prompt_tokens", json_integer(r->prompt));
    json_object_set_new(o, "prefill_s", json_real(r->prefill_s));
    json_object_set_new(o, "prefill_tok_s", json_real(pf));
    json_object_set_new(o, "prefill_gflop_s", json_real(prefill_gflop(r) / r->prefill_s));
    json_object_set_new(o, "decode_tokens", json_integer(r->gen));
    if (r->gen > 0) {
        double per = r->decode_s / r->gen;
        json_object_set_new(o, "decode_s", json_real(r->decode_s));
        json_object_set_new(o, "decode_tok_s", json_real(1.0 / per));
        json_object_set_new(o, "decode_ms_per_token", json_real(per * 1e3));
        json_object_set_new(o, "decode_gb_s", json_real(r->tok.bytes / per / 1e9));
    }
    json_object_set_new(o, "bytes_per_token", json_integer((json_int_t)(r->tok.bytes + 0.5)));
    json_object_set_new(o, "active_params_per_token", json_integer((json_int_t)(r->tok.params + 0.5)));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!s) return -1;
    printf("%s\n", s);
    free(s);
    return 0;
}

/* One prefill + decode from an empty cache; times go to *pre and *dec. */
static int run_once(sl_session *s, const int32_t *prompt, const bench_result *r, float *logits, double *pre,
                    double *dec, sl_err *e) {
    int V = s->m->cfg.vocab_size;
    sl_session_reset(s);
    double t0 = sl_now();
    if (sl_session_forward(s, prompt, r->prompt, logits, 0, e)) return -1;
    double t1 = sl_now();
    for (int i = 0; i < r->gen; i++) {
        int32_t id = argmax(logits, V);
        if (sl_session_forward(s, &id, 1, logits, 0, e)) return -1;
    }
    *pre = t1 - t0;
    *dec = sl_now() - t1;
    return 0;
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL;
    bench_result r = {.prompt = 512, .gen = 128, .runs = 1};
    int json = 0, threads = 0;
    const char *backend = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") && i + 1 < argc) {
            bad = parse_int(argv[++i], 1, &r.prompt);
        } else if (!strcmp(a, "-n") && i + 1 < argc) {
            bad = parse_int(argv[++i], 0, &r.gen);
        } else if (!strcmp(a, "-r") && i + 1 < argc) {
            bad = parse_int(argv[++i], 1, &r.runs);
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            bad = parse_int(argv[++i], 1, &threads);
        } else if (!strcmp(a, "--backend") && i + 1 < argc) {
            backend = argv[++i];
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (a[0] != '-' && !model) {
            model = a;
        } else {
            fprintf(stderr, "sluice bench: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "sluice bench: %s needs a whole number, got '%s'\n", a, argv[i]);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    sl_err e = {{0}};
    sl_model *m = NULL;
    sl_session *s = NULL;
    float *logits = NULL;
    int32_t *prompt = NULL;
    int rc = 1;
    sl_model_opts o = {.threads = threads, .backend = backend};
    double t0 = sl_now();
    if (sl_model_load(model, &o, &m, &e)) goto done;
    r.load_s = sl_now() - t0;
    if (sl_session_create(m, r.prompt + r.gen, &s, &e)) goto done;
    int V = m->cfg.vocab_size;
    logits = malloc((size_t)V * sizeof *logits);
    prompt = malloc((size_t)r.prompt * sizeof *prompt);
    if (!logits || !prompt) {
        sl_fail(&e, "out of memory");
        goto done;
    }
    uint64_t st = 0x5eed;
    for (int i = 0; i < r.prompt; i++) prompt[i] = (int32_t)(next_rand(&st) % (uint64_t)V);
    r.threads = !strcmp(m->be->ops->name, "cpu") ? cpu_of(m->be)->n_threads : threads;
    r.weight_bytes = (double)(m->bytes_experts + m->bytes_other);
    r.tok = per_token_traffic(m);
    for (int k = 0; k < r.runs; k++) {
        double pre, dec;
        if (run_once(s, prompt, &r, logits, &pre, &dec, &e)) goto done;
        if (k == 0 || pre < r.prefill_s) r.prefill_s = pre;
        if (k == 0 || dec < r.decode_s) r.decode_s = dec;
    }
    if (json) {
        if (print_json(m, &r)) {
            sl_fail(&e, "out of memory");
            goto done;
        }
    } else {
        print_table(m, &r);
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "sluice bench: %s\n", e.msg);
    free(logits);
    free(prompt);
    sl_session_free(s);
    sl_model_free(m);
    return rc;
}
