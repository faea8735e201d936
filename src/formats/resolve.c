#include "formats/resolve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/util.h"

static char *hub_root(void) {
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

int sl_resolve_model(const char *arg, char **dir, sl_err *e) {
    if (sl_is_dir(arg) || sl_file_exists(arg)) {
        *dir = strdup(arg);
        return *dir ? 0 : sl_fail(e, "out of memory");
    }
    size_t n = strlen(arg);
    if (n > 5 && !strcasecmp(arg + n - 5, ".gguf")) return sl_fail(e, "%s: no such GGUF file", arg);
    const char *slash = strchr(arg, '/');
    if (!slash || slash == arg || strchr(slash + 1, '/') || arg[0] == '.')
        return sl_fail(e,
                       "%s: not a directory (expected a model folder, or a Hub id like Qwen/Qwen3-0.6B in the "
                       "local Hugging Face cache)",
                       arg);
    char repo[512], rev[256] = "main";
    snprintf(repo, sizeof repo, "%s", arg);
    char *at = strchr(repo, '@');
    if (at) {
        snprintf(rev, sizeof rev, "%s", at + 1);
        *at = 0;
    }
    char *root = hub_root();
    char base[4096], path[4096];
    snprintf(base, sizeof base, "%s/models--%.*s--%s", root, (int)(strchr(repo, '/') - repo), repo,
             strchr(repo, '/') + 1);
    /* a branch or tag name maps to a commit through refs/; a commit hash names the snapshot itself */
    char commit[128] = "";
    snprintf(path, sizeof path, "%s/refs/%s", base, rev);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(commit, sizeof commit, f)) commit[0] = 0;
        fclose(f);
        commit[strcspn(commit, "\r\n")] = 0;
    } else {
        snprintf(commit, sizeof commit, "%s", rev);
    }
    snprintf(path, sizeof path, "%s/snapshots/%s", base, commit);
    free(root);
    if (!commit[0] || !sl_is_dir(path))
        return sl_fail(e, "%s: not found locally (looked for %s); download it first, e.g. with huggingface-cli", arg,
                       path);
    *dir = strdup(path);
    return *dir ? 0 : sl_fail(e, "out of memory");
}
