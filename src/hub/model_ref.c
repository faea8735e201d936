/* A Hub repo id as a MODEL argument: found in the cache, else pulled into it. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/util.h"
#include "hub/cache.h"
#include "hub/hub.h"
#include "hub/select.h"

typedef struct name_list {
    char **v;
    int n, cap;
} name_list;

/* Paths of the files under dir, relative to it (prefix is the part already walked). */
static int walk(const char *dir, const char *prefix, name_list *l) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *de;
    int rc = 0;
    while (!rc && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char *p = sl_path_join(dir, de->d_name), rel[4096];
        snprintf(rel, sizeof rel, "%s%s%s", prefix, *prefix ? "/" : "", de->d_name);
        if (!p)
            rc = -1;
        else if (sl_is_dir(p))
            rc = walk(p, rel, l);
        else {
            if (l->n == l->cap) {
                l->cap = l->cap ? 2 * l->cap : 32;
                char **v = realloc(l->v, (size_t)l->cap * sizeof *v);
                if (!v)
                    rc = -1;
                else
                    l->v = v;
            }
            if (!rc && !(l->v[l->n++] = strdup(rel))) rc = -1, l->n--;
        }
        free(p);
    }
    closedir(d);
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The model path inside a snapshot: the folder, or the GGUF file the selection (or the only quant) names. */
static int pick_local(const char *repo, const char *snap, const char *sel, char **path, sl_err *e) {
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", snap);
    if (!sel && sl_file_exists(cfg)) return (*path = strdup(snap)) ? 0 : sl_fail(e, "out of memory");
    name_list l = {0};
    int rc = walk(snap, "", &l), gguf = -1, any = 0;
    if (!rc && l.n) qsort(l.v, (size_t)l.n, sizeof *l.v, cmp_str);
    for (int i = 0; i < l.n; i++) any |= strlen(l.v[i]) > 5 && !strcasecmp(l.v[i] + strlen(l.v[i]) - 5, ".gguf");
    int *keep = calloc((size_t)l.n + 1, sizeof *keep);
    if (rc || !keep)
        rc = sl_fail(e, "%s: cannot list the snapshot", snap);
    else if (!sel && !any)
        rc = (*path = strdup(snap)) ? 0 : sl_fail(e, "out of memory");
    else if (!(rc = sl_hub_select(repo, (const char *const *)l.v, l.n, sel, keep, &gguf, e)))
        rc = gguf < 0 ? ((*path = strdup(snap)) ? 0 : sl_fail(e, "out of memory"))
                      : ((*path = sl_path_join(snap, l.v[gguf])) ? 0 : sl_fail(e, "out of memory"));
    for (int i = 0; i < l.n; i++) free(l.v[i]);
    free(l.v);
    free(keep);
    return rc;
}

static int offline(void) {
    const char *v = getenv("HF_HUB_OFFLINE");
    return v && *v && strcmp(v, "0") && strcasecmp(v, "false") && strcasecmp(v, "no");
}

int sl_hub_resolve(const char *arg, char **path, sl_err *e) {
    char *repo, *rev, *sel, dir[4096], commit[128], snap[8192];
    if (sl_hub_parse_ref(arg, &repo, &rev, &sel, e)) return -1;
    int rc = sl_hub_repo_dir(repo, dir, sizeof dir, e);
    if (!rc && !sl_hub_snapshot(dir, rev ? rev : "main", commit, sizeof commit)) {
        snprintf(snap, sizeof snap, "%s/snapshots/%s", dir, commit);
        sl_err le;
        if (!pick_local(arg, snap, sel, path, &le)) goto done;
        if (offline()) {
            rc = sl_fail(e, "%s", le.msg);
            goto done;
        }
    } else if (!rc && offline()) {
        rc = sl_fail(e,
                     "%s: not found locally (looked for %s/snapshots) and HF_HUB_OFFLINE is set, so it is not "
                     "pulled; run sluice pull %s",
                     arg, dir, arg);
        goto done;
    }
    if (!rc) {
        fprintf(stderr, "sluice: %s is not in the Hub cache; pulling it first\n", arg);
        sl_hub_pull_opts o = {.repo = repo, .revision = rev, .select = sel};
        rc = sl_hub_pull(&o, path, e);
        if (rc) sl_wrap(e, "%s: not found locally, and pulling it failed", arg);
    }
done:
    free(repo);
    free(rev);
    free(sel);
    return rc;
}
