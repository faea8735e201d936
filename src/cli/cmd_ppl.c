/* sluice ppl: perplexity of a model over a text file, chunked and scored as llama.cpp's llama-perplexity
 * does, so the two figures can be compared directly.
 *
 * The text is tokenized whole (with BOS when the tokenizer adds one) and cut into chunks of --ctx tokens
 * (the tail that does not fill a chunk is dropped). Each chunk runs from an empty session, its first token
 * replaced by BOS where the tokenizer adds one, in batches of --batch tokens. Only the second half is
 * scored: the predictions at positions ctx/2 .. ctx-2 of their next tokens, so every scored token has at
 * least ctx/2 tokens of context. PPL = exp(mean NLL); the error is the standard error of the mean NLL
 * carried through exp (ppl * sqrt((E[nll^2] - E[nll]^2) / (count - 1))). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/stream_flags.h"
#include "core/util.h"
#include "formats/resolve.h"
#include "runtime/session.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: sluice ppl MODEL FILE [--ctx N] [--batch N] [--chunks N] [--threads N]\n"
               "       [--backend cpu|cuda|auto] [--vram SIZE] [--ram SIZE] [--io MODE]\n\n"
               "Perplexity of MODEL over the text in FILE, computed as llama.cpp's llama-perplexity does: the\n"
               "text is tokenized whole and cut into chunks of N tokens, each run from a fresh state (its first\n"
               "token replaced by BOS when the tokenizer adds one), and the second half of each chunk scored.\n"
               "stdout gets the running estimate per chunk ([1]12.3456,[2]...) and the final line\n"
               "'Final estimate: PPL = X +/- Y'; stderr a table per chunk and a progress bar.\n\n"
               "options:\n"
               "  --ctx N                tokens per chunk (default 512, at least 2); FILE needs 2*N tokens\n"
               "  --batch N              tokens per forward call (default 2048, at most --ctx)\n"
               "  --chunks N             score only the first N chunks (default: all)\n"
               "  --threads N            CPU threads (default: all cores)\n"
               "  --backend B            cpu, cuda or auto (default $SLUICE_BACKEND, else auto)\n" CLI_STREAM_HELP
                   CLI_KV_HELP);
}

static int parse_int(const char *flag, const char *v, int min, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < min || x > 1 << 30) {
        fprintf(stderr, "sluice ppl: %s: expected an integer >= %d, got '%s'\n", flag, min, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* log p(target) under softmax(logits), accumulated in double. */
static double log_softmax_at(const float *logits, int V, int target) {
    float mx = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    return (double)logits[target] - mx - log(sum);
}

/* The BOS id when encoding with specials puts one in front of the text, else -1. */
static int32_t added_bos(const sl_tokenizer *t, sl_err *e) {
    int32_t *with = NULL, *without = NULL;
    int nw = 0, nwo = 0;
    int32_t bos = -1;
    if (!sl_tokenizer_encode(t, "a", 1, 1, &with, &nw, e) && !sl_tokenizer_encode(t, "a", 1, 0, &without, &nwo, e) &&
        nwo > 0 && nw > nwo && with[0] != without[0])
        bos = with[0];
    free(with);
    free(without);
    return bos;
}

static void progress(int done, int total, double elapsed) {
    const int W = 30;
    int fill = total ? done * W / total : W;
    fprintf(stderr, "\r[");
    for (int i = 0; i < W; i++) fputc(i < fill ? '#' : '.', stderr);
    double eta = done ? elapsed / done * (total - done) : 0;
    fprintf(stderr, "] %d/%d chunks, %.1f s, eta %.1f s ", done, total, elapsed, eta);
    fflush(stderr);
}

typedef struct ppl_opts {
    const char *model, *file, *backend;
    int ctx, batch, chunks, threads;
    sl_model_opts mo;
} ppl_opts;

static int parse_args(int argc, char **argv, ppl_opts *o) {
    for (int i = 1; i < argc; i++) {
        int sf = cli_stream_flag("sluice ppl", argv[i], i + 1 < argc ? argv[i + 1] : NULL, &o->mo);
        if (sf < 0) return 2;
        if (sf > 0) {
            i += sf - 1;
            continue;
        }
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--ctx") && v) {
            if (parse_int(a, argv[++i], 2, &o->ctx)) return 2;
        } else if (!strcmp(a, "--batch") && v) {
            if (parse_int(a, argv[++i], 1, &o->batch)) return 2;
        } else if (!strcmp(a, "--chunks") && v) {
            if (parse_int(a, argv[++i], 1, &o->chunks)) return 2;
        } else if (!strcmp(a, "--threads") && v) {
            if (parse_int(a, argv[++i], 0, &o->threads)) return 2;
        } else if (!strcmp(a, "--backend") && v) {
            o->backend = argv[++i];
        } else if (a[0] != '-' && !o->model) {
            o->model = a;
        } else if (a[0] != '-' && !o->file) {
            o->file = a;
        } else {
            fprintf(stderr, "sluice ppl: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!o->model || !o->file) {
        fprintf(stderr, "sluice ppl: MODEL and FILE are required\n");
        usage(stderr);
        return 2;
    }
    return 0;
}

int cmd_ppl(int argc, char **argv) {
    ppl_opts o = {.ctx = 512, .batch = 2048, .chunks = -1};
    int pa = parse_args(argc, argv, &o);
    if (pa) return pa == 1 ? 0 : pa;
    if (o.batch > o.ctx) o.batch = o.ctx;

    sl_err e = {{0}};
    int rc = 1, n_tok = 0;
    char *dir = NULL, *text = NULL;
    size_t text_len = 0;
    int32_t *toks = NULL, *chunk = NULL;
    float *logits = NULL;
    sl_tokenizer *tok = NULL;
    sl_model *m = NULL;
    sl_session *s = NULL;

    if (sl_read_file(o.file, &text, &text_len, &e)) goto done;
    if (sl_resolve_model(o.model, &dir, &e)) goto done;
    if (sl_tokenizer_load(dir, &tok, &e)) goto done;
    if (sl_tokenizer_encode(tok, text, text_len, 1, &toks, &n_tok, &e)) goto done;
    int32_t bos = added_bos(tok, &e);
    if (n_tok < 2 * o.ctx) {
        sl_fail(&e,
                "%s: %d tokens, but a context of %d needs at least %d (two chunks); lower --ctx or use a longer text",
                o.file, n_tok, o.ctx, 2 * o.ctx);
        goto done;
    }
    int n_chunk = n_tok / o.ctx;
    if (o.chunks > 0 && o.chunks < n_chunk) n_chunk = o.chunks;
    const int first = o.ctx / 2;

    o.mo.threads = o.threads;
    o.mo.backend = o.backend;
    o.mo.ctx = o.ctx;
    if (sl_model_load(dir, &o.mo, &m, &e)) goto done;
    if (sl_session_create(m, o.ctx, &s, &e)) goto done;
    const int V = m->cfg.vocab_size;
    if (sl_tokenizer_vocab_size(tok) > V) {
        sl_fail(&e, "%s: the tokenizer has %d tokens but the model's vocabulary only %d", o.model,
                sl_tokenizer_vocab_size(tok), V);
        goto done;
    }
    chunk = malloc((size_t)o.ctx * sizeof *chunk);
    logits = malloc((size_t)o.batch * V * sizeof *logits);
    if (!chunk || !logits) {
        sl_fail(&e, "out of memory for %d rows of %d logits", o.batch, V);
        goto done;
    }

    fprintf(stderr, "sluice ppl: %d tokens, %d chunks of %d (%d scored each), batch %d, BOS %s\n", n_tok, n_chunk,
            o.ctx, o.ctx - first - 1, o.batch, bos >= 0 ? "replaces each chunk's first token" : "not added");
    fprintf(stderr, "%6s %10s %12s %10s\n", "chunk", "tokens", "ppl", "elapsed");
    const int tty = isatty(STDERR_FILENO);
    double nll = 0, nll2 = 0, t0 = sl_now();
    long count = 0;
    if (tty) progress(0, n_chunk, 0);
    for (int c = 0; c < n_chunk; c++) {
        const int32_t *src = toks + (size_t)c * o.ctx;
        memcpy(chunk, src, (size_t)o.ctx * sizeof *chunk);
        if (bos >= 0) chunk[0] = bos;
        sl_session_reset(s);
        for (int b0 = 0; b0 < o.ctx; b0 += o.batch) {
            int nb = o.ctx - b0 < o.batch ? o.ctx - b0 : o.batch;
            int want = b0 + nb > first; /* rows before `first` are never scored */
            if (sl_session_forward(s, chunk + b0, nb, want ? logits : NULL, 1, &e)) goto done;
            if (!want) continue;
            /* the prediction at position p is scored against the next original token, p in [first, ctx-1) */
            for (int p = b0 > first ? b0 : first; p < b0 + nb && p < o.ctx - 1; p++) {
                double lp = log_softmax_at(logits + (size_t)(p - b0) * V, V, src[p + 1]);
                nll -= lp;
                nll2 += lp * lp;
                count++;
            }
        }
        double ppl = exp(nll / count), el = sl_now() - t0;
        printf("[%d]%.4f,", c + 1, ppl);
        fflush(stdout);
        if (tty) fprintf(stderr, "\r\033[K");
        fprintf(stderr, "%6d %10ld %12.4f %9.2fs\n", c + 1, count, ppl, el);
        if (tty) progress(c + 1, n_chunk, el);
    }
    if (tty) fprintf(stderr, "\r\033[K");
    printf("\n");
    double mean = nll / count, var = nll2 / count - mean * mean, ppl = exp(mean);
    if (!(var > 0) || count < 2) {
        /* llama.cpp reports this case as an error too: all scored tokens had the same log-probability */
        printf("Final estimate: PPL = %.4f +/- nan\n", ppl);
        fprintf(stderr, "sluice ppl: the scored log-probabilities have no spread; no error estimate\n");
    } else {
        printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, sqrt(var / (count - 1)) * ppl);
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "sluice ppl: %s\n", e.msg);
    free(logits);
    free(chunk);
    free(toks);
    free(text);
    free(dir);
    sl_session_free(s);
    sl_model_free(m);
    sl_tokenizer_free(tok);
    return rc;
}
