/* sluice logits: raw float32 logits for a prompt and for decode ids fed one at a time through the
 * cache — the layout of the reference files used to validate the engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/stream_flags.h"
#include "core/util.h"
#include "runtime/session.h"

static void usage(FILE *f) {
    fprintf(f, "usage: sluice logits MODEL --ids 1,2,3 [--decode-ids 4,5] --out FILE.f32 [--threads N]\n"
               "       [--backend cpu|cuda|auto] [--vram SIZE] [--ram SIZE] [--io MODE]\n\n"
               "Runs the prompt ids as one batch and writes one float32 row of logits per prompt position,\n"
               "then feeds each decode id alone through the cache and appends one row for each.\n\n"
               "options:\n" CLI_STREAM_HELP CLI_KV_HELP);
}

int cmd_logits(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL, *dec_s = NULL, *out = NULL, *backend = NULL;
    int threads = 0;
    sl_model_opts o = {0};
    for (int i = 1; i < argc; i++) {
        int sf = cli_stream_flag("sluice logits", argv[i], i + 1 < argc ? argv[i + 1] : NULL, &o);
        if (sf < 0) return 2;
        if (sf > 0) {
            i += sf - 1;
            continue;
        }
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--ids") && i + 1 < argc) {
            ids_s = argv[++i];
        } else if (!strcmp(argv[i], "--decode-ids") && i + 1 < argc) {
            dec_s = argv[++i];
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            backend = argv[++i];
        } else if (argv[i][0] != '-' && !model) {
            model = argv[i];
        } else {
            fprintf(stderr, "sluice logits: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model || !ids_s || !out) {
        usage(stderr);
        return 2;
    }
    sl_err e = {{0}};
    int32_t *ids = NULL, *dec = NULL;
    int n = 0, nd = 0, rc = 1;
    sl_model *m = NULL;
    sl_session *s = NULL;
    float *logits = NULL;
    if (sl_parse_ids(ids_s, &ids, &n, &e) || (dec_s && sl_parse_ids(dec_s, &dec, &nd, &e))) goto done;
    if (n == 0) {
        sl_fail(&e, "--ids: at least one prompt token is needed");
        goto done;
    }
    o.threads = threads;
    o.backend = backend;
    o.ctx = n + nd;
    if (sl_model_load(model, &o, &m, &e)) goto done;
    if (sl_session_create(m, n + nd, &s, &e)) goto done;
    size_t V = (size_t)m->cfg.vocab_size;
    logits = malloc((size_t)(n + nd) * V * sizeof *logits);
    if (!logits) {
        sl_fail(&e, "out of memory for %d rows of logits", n + nd);
        goto done;
    }
    if (sl_session_forward(s, ids, n, logits, 1, &e)) goto done;
    for (int i = 0; i < nd; i++)
        if (sl_session_forward(s, dec + i, 1, logits + (size_t)(n + i) * V, 0, &e)) goto done;
    if (sl_write_file(out, logits, (size_t)(n + nd) * V * sizeof *logits, &e)) goto done;
    rc = 0;
done:
    if (rc) fprintf(stderr, "sluice logits: %s\n", e.msg);
    free(logits);
    free(ids);
    free(dec);
    sl_session_free(s);
    sl_model_free(m);
    return rc;
}
