#include "hub/select.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcasecmp(s + n - m, suf);
}

static const char *base_name(const char *s) {
    const char *b = strrchr(s, '/');
    return b ? b + 1 : s;
}

/* Length of the "-00001-of-00003" part before ".gguf", or 0. */
static size_t split_suffix(const char *name) {
    size_t n = strlen(name);
    if (n < 5 + 15) return 0;
    const char *p = name + n - 5 - 15;
    if (p[0] != '-' || strncmp(p + 6, "-of-", 4)) return 0;
    for (int i = 1; i < 15; i++)
        if (i < 6 || i >= 10 ? !isdigit((unsigned char)p[i]) : 0) return 0;
    return 15;
}

/* The set a GGUF file belongs to: its path without the split suffix, for comparing two files. */
static int same_set(const char *a, const char *b) {
    size_t la = strlen(a) - 5 - split_suffix(a), lb = strlen(b) - 5 - split_suffix(b);
    return la == lb && !strncmp(a, b, la);
}

/* First file of a set: unsplit, or part 00001. */
static int is_first(const char *name) {
    size_t s = split_suffix(name);
    return !s || !strncmp(name + strlen(name) - 5 - s, "-00001-", 7);
}

/* A quant as users name it: the last '-' or '.' separated part of the file stem ("Q4_K_M"). */
static void quant_label(const char *name, char *out, size_t n) {
    const char *b = base_name(name);
    size_t len = strlen(b) - 5 - split_suffix(b);
    size_t start = 0;
    for (size_t i = 0; i < len; i++)
        if (b[i] == '-' || b[i] == '.') start = i + 1;
    if (start >= len) start = 0;
    snprintf(out, n, "%.*s", (int)(len - start), b + start);
}

/* Projector and imatrix files of vision / quantisation tooling are not models. */
static int is_model_gguf(const char *name) {
    return ends_with(name, ".gguf") && !strcasestr(base_name(name), "mmproj") && !strcasestr(name, "imatrix");
}

/* The match of sel in name's base name stands alone (not part of a longer quant such as Q4_K in Q4_K_M). */
static int whole_match(const char *name, const char *sel) {
    const char *b = base_name(name), *p = b;
    size_t m = strlen(sel);
    while ((p = strcasestr(p, sel))) {
        char before = p > b ? p[-1] : '-', after = p[m];
        if (!isalnum((unsigned char)before) && before != '_' && !isalnum((unsigned char)after) && after != '_')
            return 1;
        p++;
    }
    return 0;
}

static void list_quants(const char *const *names, int n, char *out, size_t cap) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < n && len + 1 < cap; i++) {
        if (!is_model_gguf(names[i]) || !is_first(names[i])) continue;
        char q[128];
        quant_label(names[i], q, sizeof q);
        len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? ", " : "", q);
    }
}

static const char *const wanted[] = {"config.json",
                                     "generation_config.json",
                                     "tokenizer.json",
                                     "tokenizer_config.json",
                                     "special_tokens_map.json",
                                     "chat_template.jinja",
                                     "chat_template.json",
                                     NULL};

static int pick_set(const char *repo, const char *const *names, int n, int first, int *keep, int *gguf) {
    (void)repo;
    for (int i = 0; i < n; i++) keep[i] = same_set(names[i], names[first]) && ends_with(names[i], ".gguf");
    if (gguf) *gguf = first;
    return 0;
}

int sl_hub_select(const char *repo, const char *const *names, int n, const char *sel, int *keep, int *gguf, sl_err *e) {
    char quants[1024];
    for (int i = 0; i < n; i++) keep[i] = 0;
    if (gguf) *gguf = -1;
    if (sel && *sel) {
        if (ends_with(sel, ".gguf")) {
            for (int i = 0; i < n; i++)
                if (!strcmp(names[i], sel)) {
                    int first = i;
                    /* a named part of a split set brings the whole set */
                    for (int j = 0; j < n; j++)
                        if (ends_with(names[j], ".gguf") && same_set(names[j], sel) && is_first(names[j])) first = j;
                    return pick_set(repo, names, n, first, keep, gguf);
                }
            return sl_fail(e, "%s: no file %s in the repo", repo, sel);
        }
        int found = -1, found_whole = -1, sets = 0, sets_whole = 0;
        for (int i = 0; i < n; i++) {
            if (!is_model_gguf(names[i]) || !is_first(names[i]) || !strcasestr(base_name(names[i]), sel)) continue;
            sets++, found = i;
            if (whole_match(names[i], sel)) sets_whole++, found_whole = i;
        }
        list_quants(names, n, quants, sizeof quants);
        if (sets == 1 || sets_whole == 1)
            return pick_set(repo, names, n, sets_whole == 1 ? found_whole : found, keep, gguf);
        if (!sets)
            return sl_fail(e, "%s: no GGUF file matches '%s' (quants offered: %s)", repo, sel,
                           quants[0] ? quants : "none, the repo has no .gguf files");
        return sl_fail(e, "%s: '%s' matches several GGUF files; name one exactly (quants offered: %s)", repo, sel,
                       quants);
    }
    int st = 0, sets = 0, first = -1;
    for (int i = 0; i < n; i++) {
        if (!strchr(names[i], '/') && ends_with(names[i], ".safetensors")) st = 1;
        if (is_model_gguf(names[i]) && is_first(names[i])) sets++, first = i;
    }
    if (st) {
        for (int i = 0; i < n; i++) {
            if (strchr(names[i], '/')) continue; /* original/, onnx/ and other exports */
            keep[i] = ends_with(names[i], ".safetensors") || ends_with(names[i], ".safetensors.index.json");
            for (int k = 0; wanted[k] && !keep[i]; k++) keep[i] = !strcmp(names[i], wanted[k]);
        }
        return 0;
    }
    if (sets == 1) return pick_set(repo, names, n, first, keep, gguf);
    if (sets > 1) {
        list_quants(names, n, quants, sizeof quants);
        return sl_fail(e, "%s: a GGUF repo with several quants; pick one, e.g. %s:%s (quants offered: %s)", repo, repo,
                       strchr(quants, ',') ? strndupa(quants, (size_t)(strchr(quants, ',') - quants)) : quants, quants);
    }
    return sl_fail(e, "%s: no safetensors or GGUF weights in the repo (%d files)", repo, n);
}
