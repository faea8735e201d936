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
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/sluice-test-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    cr_assert(d, "mkdtemp failed");
    return strdup(d);
}

int tu_valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t l = u[i] < 0x80 ? 1 : (u[i] >> 5) == 6 ? 2 : (u[i] >> 4) == 14 ? 3 : (u[i] >> 3) == 30 ? 4 : 0;
        if (!l || i + l > n) return 0;
        for (size_t j = 1; j < l; j++)
            if ((u[i + j] & 0xc0) != 0x80) return 0;
        i += l;
    }
    return 1;
}
