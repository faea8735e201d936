#include "testutil.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

char *tu_fixture(const char *rel) {
    const char *root = getenv("SLUICE_FIXTURES");
    if (!root) root = "tests/fixtures";
    char *p = sl_path_join(root, rel);
    cr_assert(p);
    return p;
}

char *tu_slurp(const char *path, size_t *len) {
    char *buf;
    sl_err e;
    if (sl_read_file(path, &buf, len, &e) != 0) cr_assert_fail("%s", e.msg);
    return buf;
}

const char *tu_sluice_bin(void) {
    const char *b = getenv("SLUICE_BIN");
    return b ? b : "./sluice";
}

char *tu_tmpdir(void) {
    char tmpl[] = "/tmp/sluice-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    cr_assert(d, "mkdtemp failed");
    return strdup(d);
}
