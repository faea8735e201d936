/* sluice pull / list / rm: Hub repos in the local Hugging Face cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "core/util.h"
#include "hub/cache.h"
#include "hub/hub.h"

static void pull_usage(FILE *f) {
    fprintf(f, "usage: sluice pull REPO[:QUANT|:FILE.gguf] [--revision REV] [--parallel N] [--quiet]\n\n"
               "Downloads a Hugging Face Hub model repo into the Hub cache shared with huggingface_hub\n"
               "($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub):\n"
               "  safetensors repo   config.json, generation_config.json, *.safetensors (+ index), tokenizer.json,\n"
               "                     tokenizer_config.json, special_tokens_map.json, chat_template.jinja/json\n"
               "  GGUF repo          REPO:Q4_K_M takes the quant whose file name contains Q4_K_M (any case, a\n"
               "                     split -00001-of-0000N set whole); REPO:path/file.gguf one file\n"
               "Files already there are kept; an interrupted download resumes where it stopped. LFS files are\n"
               "checked against their sha256, others against their git sha1. Several files download at once.\n\n"
               "  --revision REV   branch, tag or commit (default main; also REPO@REV)\n"
               "  --parallel N     transfers at once (default 4)\n"
               "  --quiet          no progress on stderr\n\n"
               "Environment: HF_ENDPOINT (default https://huggingface.co); HF_TOKEN, else the token file\n"
               "($HF_TOKEN_PATH, $HF_HOME/token or ~/.cache/huggingface/token), for private and gated repos.\n"
               "run, serve, bench and the other commands pull a repo id missing from the cache themselves,\n"
               "unless HF_HUB_OFFLINE=1.\n");
}

int cmd_pull(int argc, char **argv) {
    const char *ref = NULL, *revision = NULL;
    int parallel = 0, quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            pull_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--revision") && i + 1 < argc)
            revision = argv[++i];
        else if (!strcmp(argv[i], "--parallel") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 64) {
                fprintf(stderr, "sluice pull: --parallel expects 1 to 64, got '%s'\n", argv[i]);
                return 2;
            }
            parallel = (int)v;
        } else if (!strcmp(argv[i], "--quiet") || !strcmp(argv[i], "-q"))
            quiet = 1;
        else if (argv[i][0] == '-' || ref) {
            fprintf(stderr, "sluice pull: unexpected argument '%s'\n", argv[i]);
            pull_usage(stderr);
            return 2;
        } else
            ref = argv[i];
    }
    if (!ref) {
        pull_usage(stderr);
        return 2;
    }
    sl_err e = {{0}};
    char *repo, *rev, *sel, *path = NULL;
    if (sl_hub_parse_ref(ref, &repo, &rev, &sel, &e)) {
        fprintf(stderr, "sluice pull: %s\n", e.msg);
        return 1;
    }
    if (revision && rev && strcmp(revision, rev)) {
        fprintf(stderr, "sluice pull: two revisions given ('%s' and --revision %s)\n", rev, revision);
        free(repo), free(rev), free(sel);
        return 2;
    }
    sl_hub_pull_opts o = {
        .repo = repo, .revision = revision ? revision : rev, .select = sel, .parallel = parallel, .quiet = quiet};
    int rc = sl_hub_pull(&o, &path, &e);
    if (rc)
        fprintf(stderr, "sluice pull: %s\n", e.msg);
    else
        printf("%s\n", path);
    free(path);
    free(repo), free(rev), free(sel);
    return rc ? 1 : 0;
}

static void list_usage(FILE *f) {
    fprintf(f, "usage: sluice list\n\n"
               "The model repos in the Hugging Face Hub cache ($HF_HUB_CACHE, else $HF_HOME/hub, else\n"
               "~/.cache/huggingface/hub), whichever tool fetched them: repo id, revisions (ref=commit), bytes\n"
               "of its blobs, files in its snapshot and weight format.\n");
}

int cmd_list(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            list_usage(stdout);
            return 0;
        }
        fprintf(stderr, "sluice list: unexpected argument '%s'\n", argv[i]);
        list_usage(stderr);
        return 2;
    }
    sl_err e = {{0}};
    char *root = sl_hub_cache_root();
    sl_hub_entry *v = NULL;
    int n = 0;
    if (!root || sl_hub_list(root, &v, &n, &e)) {
        fprintf(stderr, "sluice list: %s\n", root ? e.msg : "out of memory");
        free(root);
        return 1;
    }
    if (!n)
        fprintf(stderr, "no models in %s\n", root);
    else
        printf("%-40s %-20s %10s %6s  %s\n", "REPO", "REVISION", "SIZE", "FILES", "FORMAT");
    for (int i = 0; i < n; i++) {
        char b[32];
        printf("%-40s %-20s %10s %6d  %s\n", v[i].repo, v[i].refs[0] ? v[i].refs : "-",
               sl_human_bytes((double)v[i].bytes, b, sizeof b), v[i].files, v[i].format);
    }
    free(v);
    free(root);
    return 0;
}

static void rm_usage(FILE *f) {
    fprintf(f, "usage: sluice rm REPO [--yes]\n\n"
               "Removes a repo's folder (models--ORG--NAME: every revision and blob) from the Hugging Face Hub\n"
               "cache, after checking that it is a cache entry. Asks first on a terminal; without one, --yes\n"
               "is required.\n");
}

int cmd_rm(int argc, char **argv) {
    const char *repo = NULL;
    int yes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            rm_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--yes") || !strcmp(argv[i], "-y"))
            yes = 1;
        else if (argv[i][0] == '-' || repo) {
            fprintf(stderr, "sluice rm: unexpected argument '%s'\n", argv[i]);
            rm_usage(stderr);
            return 2;
        } else
            repo = argv[i];
    }
    if (!repo) {
        rm_usage(stderr);
        return 2;
    }
    sl_err e = {{0}};
    char dir[4096];
    if (sl_hub_repo_dir(repo, dir, sizeof dir, &e)) {
        fprintf(stderr, "sluice rm: %s\n", e.msg);
        return 1;
    }
    if (!sl_is_dir(dir)) {
        fprintf(stderr, "sluice rm: %s is not in the Hub cache (no %s)\n", repo, dir);
        return 1;
    }
    if (!yes) {
        if (!isatty(0) || !isatty(2)) {
            fprintf(stderr, "sluice rm: not removing %s without a terminal to confirm on; pass --yes\n", dir);
            return 1;
        }
        fprintf(stderr, "remove %s (%s)? [y/N] ", repo, dir);
        char line[16];
        if (!fgets(line, sizeof line, stdin) || (line[0] != 'y' && line[0] != 'Y')) {
            fprintf(stderr, "not removed\n");
            return 1;
        }
    }
    if (sl_hub_remove(dir, &e)) {
        fprintf(stderr, "sluice rm: %s\n", e.msg);
        return 1;
    }
    fprintf(stderr, "removed %s\n", dir);
    return 0;
}
