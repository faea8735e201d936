#include "hub/cache.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"

char *sl_hub_cache_root(void) {
    const char *v = getenv("HF_HUB_CACHE");
    if (v && *v) return strdup(v);
    char buf[4096];
    if ((v = getenv("HF_HOME")) && *v) {
        snprintf(buf, sizeof buf, "%s/hub", v);
        return strdup(buf);
    }
    const char *home = getenv("HOME");
    snprintf(buf, sizeof buf, "%s/.cache/huggingface/hub", home ? home : "");
    return strdup(buf);
}

int sl_hub_repo_dir(const char *repo, char *buf, size_t n, sl_err *e) {
    const char *slash = strchr(repo, '/');
    int ok = slash && slash != repo && slash[1] && !strchr(slash + 1, '/') && !strstr(repo, "..") &&
             !strstr(repo, "--") && repo[0] != '.' && strlen(repo) < 200;
    for (const char *p = repo; ok && *p; p++)
        ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
             *p == '_' || *p == '.' || *p == '/';
    if (!ok) return sl_fail(e, "%s: not a Hub repo id (expected ORG/NAME, e.g. Qwen/Qwen3-0.6B)", repo);
    char *root = sl_hub_cache_root();
    if (!root) return sl_fail(e, "out of memory");
    snprintf(buf, n, "%s/models--%.*s--%s", root, (int)(slash - repo), repo, slash + 1);
    free(root);
    return 0;
}

int sl_hub_snapshot(const char *repo_dir, const char *rev, char *commit, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/refs/%s", repo_dir, rev);
    FILE *f = fopen(path, "r");
    commit[0] = 0;
    if (f) {
        if (!fgets(commit, (int)n, f)) commit[0] = 0;
        fclose(f);
        commit[strcspn(commit, "\r\n")] = 0;
    } else {
        snprintf(commit, n, "%s", rev);
    }
    if (!commit[0] || strchr(commit, '/')) return -1;
    snprintf(path, sizeof path, "%s/snapshots/%s", repo_dir, commit);
    return sl_is_dir(path) ? 0 : -1;
}

int sl_hub_mkdirs(const char *path, sl_err *e) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return sl_fail(e, "%s: cannot create folder: %s", buf, strerror(errno));
        if (!(*p = c)) break;
    }
    return 0;
}

char *sl_hub_token(void) {
    const char *v = getenv("HF_TOKEN");
    if (v && *v) return strdup(v);
    char path[4096];
    const char *home = getenv("HOME");
    if ((v = getenv("HF_TOKEN_PATH")) && *v)
        snprintf(path, sizeof path, "%s", v);
    else if ((v = getenv("HF_HOME")) && *v)
        snprintf(path, sizeof path, "%s/token", v);
    else
        snprintf(path, sizeof path, "%s/.cache/huggingface/token", home ? home : "");
    char *t = NULL;
    size_t len;
    if (sl_read_file(path, &t, &len, NULL)) return NULL;
    while (len && (t[len - 1] == '\n' || t[len - 1] == '\r' || t[len - 1] == ' ')) t[--len] = 0;
    if (!len) {
        free(t);
        return NULL;
    }
    return t;
}

/* Files under dir (recursively), counting bytes through the links and noting the weight formats seen. */
static void scan_snapshot(const char *dir, int *files, int *st, int *gguf) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char *p = sl_path_join(dir, de->d_name);
        if (!p) break;
        if (sl_is_dir(p)) {
            scan_snapshot(p, files, st, gguf);
        } else {
            (*files)++;
            size_t n = strlen(de->d_name);
            if (n > 12 && !strcmp(de->d_name + n - 12, ".safetensors")) *st = 1;
            if (n > 5 && !strcasecmp(de->d_name + n - 5, ".gguf")) *gguf = 1;
        }
        free(p);
    }
    closedir(d);
}

static void fill_entry(const char *root, const char *name, sl_hub_entry *en) {
    memset(en, 0, sizeof *en);
    /* models--ORG--NAME: huggingface_hub joins the parts after "models" with '/' */
    const char *rest = name + strlen("models--"), *sep = strstr(rest, "--");
    if (sep)
        snprintf(en->repo, sizeof en->repo, "%.*s/%s", (int)(sep - rest), rest, sep + 2);
    else
        snprintf(en->repo, sizeof en->repo, "%s", rest);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/blobs", root, name);
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        struct stat s;
        char *p = sl_path_join(path, de->d_name);
        if (p && de->d_name[0] != '.' && !stat(p, &s) && S_ISREG(s.st_mode)) en->bytes += (uint64_t)s.st_size;
        free(p);
    }
    if (d) closedir(d);
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s/refs", root, name);
    if ((d = opendir(path))) {
        while ((de = readdir(d))) {
            char commit[128];
            if (de->d_name[0] == '.') continue;
            char dir[4096];
            snprintf(dir, sizeof dir, "%s/%s", root, name);
            sl_hub_snapshot(dir, de->d_name, commit, sizeof commit);
            len += (size_t)snprintf(en->refs + len, len < sizeof en->refs ? sizeof en->refs - len : 0, "%s%s=%.7s",
                                    len ? " " : "", de->d_name, commit);
        }
        closedir(d);
    }
    int st = 0, gg = 0;
    snprintf(path, sizeof path, "%s/%s/snapshots", root, name);
    if ((d = opendir(path))) {
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            int files = 0;
            char *p = sl_path_join(path, de->d_name);
            if (p) scan_snapshot(p, &files, &st, &gg);
            free(p);
            if (files > en->files) en->files = files;
            if (!len) { /* no refs: name the snapshots */
                size_t l = strlen(en->refs);
                snprintf(en->refs + l, sizeof en->refs - l, "%s%.7s", l ? " " : "", de->d_name);
            }
        }
        closedir(d);
    }
    snprintf(en->format, sizeof en->format, "%s",
             st && gg ? "safetensors+gguf"
             : st     ? "safetensors"
             : gg     ? "gguf"
                      : "other");
}

static int cmp_entry(const void *a, const void *b) {
    return strcasecmp(((const sl_hub_entry *)a)->repo, ((const sl_hub_entry *)b)->repo);
}

int sl_hub_list(const char *root, sl_hub_entry **out, int *n, sl_err *e) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d) return errno == ENOENT ? 0 : sl_fail(e, "%s: cannot read the Hub cache: %s", root, strerror(errno));
    struct dirent *de;
    int cap = 0;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "models--", 8)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            sl_hub_entry *p = realloc(*out, (size_t)cap * sizeof *p);
            if (!p) {
                closedir(d);
                free(*out);
                *out = NULL;
                return sl_fail(e, "out of memory");
            }
            *out = p;
        }
        fill_entry(root, de->d_name, &(*out)[(*n)++]);
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_entry);
    return 0;
}

static int rm_one(const char *path, const struct stat *s, int flag, struct FTW *ftw) {
    (void)s, (void)flag, (void)ftw;
    return remove(path) ? -1 : 0;
}

int sl_hub_remove(const char *repo_dir, sl_err *e) {
    char p[4096];
    int entry = 0;
    const char *subs[] = {"blobs", "snapshots", "refs"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", repo_dir, subs[i]);
        entry |= sl_is_dir(p);
    }
    struct stat s;
    if (lstat(repo_dir, &s) || !S_ISDIR(s.st_mode) || !entry)
        return sl_fail(e, "%s: not a Hub cache entry (no blobs/, snapshots/ or refs/ folder inside)", repo_dir);
    if (nftw(repo_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS))
        return sl_fail(e, "%s: cannot remove: %s", repo_dir, strerror(errno));
    return 0;
}
