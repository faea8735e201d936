/* sluice pack: writes the expert pack of a mixture-of-experts checkpoint, so that streaming reads each
 * expert in one read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "core/util.h"
#include "experts/pack.h"
#include "formats/resolve.h"
#include "models/model.h"

static void usage(FILE *f) {
    fprintf(f, "usage: sluice pack MODEL\n\n"
               "Copies every routed expert of MODEL into one file beside the checkpoint (DIR/experts.sluice-pack,\n"
               "or FILE.sluice-pack beside a .gguf file), each expert one contiguous 4 KiB-aligned range, so that\n"
               "streamed experts (--vram, --ram) take one read each instead of one per tensor. The checkpoint is\n"
               "left as it is. The pack is used while the checkpoint's files keep their sizes and modification\n"
               "times; after a change it is ignored, with a warning, until it is written again.\n");
}

typedef struct pk_progress {
    double t0, last;
    int tty;
} pk_progress;

static void progress(void *ctx, uint64_t done, uint64_t total) {
    pk_progress *p = ctx;
    double now = sl_now();
    if ((!p->tty && done != total) || (now - p->last < 0.25 && done != total)) return;
    p->last = now;
    char a[32], b[32];
    fprintf(stderr, "%spacking experts: %s of %s (%.0f%%, %.2f GB/s)%s", p->tty ? "\r" : "",
            sl_human_bytes((double)done, a, sizeof a), sl_human_bytes((double)total, b, sizeof b),
            100.0 * (double)done / (double)total, (double)done / (now - p->t0 + 1e-9) / 1e9,
            p->tty && done != total ? "" : "\n");
}

int cmd_pack(int argc, char **argv) {
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' || model) {
            fprintf(stderr, "sluice pack: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        model = argv[i];
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    sl_err e = {{0}};
    char *dir = NULL, *path = NULL;
    sl_model *m = NULL;
    int rc = 1, n = 0;
    uint64_t bytes = 0;
    /* on the CPU backend the experts stay in the mapped checkpoint, which is what the pack copies */
    sl_model_opts o = {.backend = "cpu", .threads = 1};
    if (sl_resolve_model(model, &dir, &e) || sl_model_load(dir, &o, &m, &e)) goto done;
    if (!(path = sl_pack_path(m->st))) {
        sl_fail(&e, "out of memory");
        goto done;
    }
    pk_progress pp = {.t0 = sl_now(), .tty = isatty(STDERR_FILENO)};
    if (sl_pack_write(m, path, progress, &pp, &n, &bytes, &e)) goto done;
    char b[32];
    printf("packed %d experts (%s) into %s in %.1f s\n", n, sl_human_bytes((double)bytes, b, sizeof b), path,
           sl_now() - pp.t0);
    rc = 0;
done:
    if (rc) fprintf(stderr, "sluice pack: %s\n", e.msg);
    sl_model_free(m);
    free(path);
    free(dir);
    return rc;
}
