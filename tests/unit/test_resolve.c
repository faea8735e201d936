#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/resolve.h"
#include "testutil.h"

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

Test(resolve, directory_as_given) {
    char *d = tu_tmpdir(), *out;
    sl_err e;
    cr_assert_eq(sl_resolve_model(d, &out, &e), 0, "%s", e.msg);
    cr_assert_str_eq(out, d);
    free(out);
    free(d);
}

Test(resolve, hub_cache_by_ref_and_commit) {
    char *root = tu_tmpdir(), p[1024];
    snprintf(p, sizeof p, "%s/models--Org--Name-1B", root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/models--Org--Name-1B/refs", root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/models--Org--Name-1B/snapshots", root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/models--Org--Name-1B/snapshots/abc123", root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/models--Org--Name-1B/refs/main", root);
    put(p, "abc123\n");
    setenv("HF_HUB_CACHE", root, 1);
    setenv("HF_HUB_OFFLINE", "1", 1); /* a missing repo is reported, not pulled */
    char *out;
    sl_err e;
    cr_assert_eq(sl_resolve_model("Org/Name-1B", &out, &e), 0, "%s", e.msg);
    cr_assert(strstr(out, "/snapshots/abc123"));
    free(out);
    cr_assert_eq(sl_resolve_model("Org/Name-1B@abc123", &out, &e), 0, "%s", e.msg);
    free(out);
    cr_assert_neq(sl_resolve_model("Org/Other", &out, &e), 0);
    cr_assert(strstr(e.msg, "Org/Other") && strstr(e.msg, "not found locally"), "%s", e.msg);
    cr_assert_neq(sl_resolve_model("./missing", &out, &e), 0);
    cr_assert(strstr(e.msg, "./missing"));
    free(root);
}
