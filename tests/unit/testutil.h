/* Shared helpers for the unit tests: fixture paths and file loading. */
#ifndef SLUICE_TESTUTIL_H
#define SLUICE_TESTUTIL_H

#include <stddef.h>

/* $SLUICE_FIXTURES/rel (falls back to tests/fixtures relative to the working directory). Heap string. */
char *tu_fixture(const char *rel);
/* Whole file, NUL-terminated; aborts the test on failure. */
char *tu_slurp(const char *path, size_t *len);
/* Path of the sluice binary ($SLUICE_BIN). */
const char *tu_sluice_bin(void);
/* Whether s[0, n) is complete, valid UTF-8 (the tests' own strict decoder, independent of src/text). */
int tu_valid_utf8(const char *s, size_t n);
/* A fresh temporary directory (heap string). */
char *tu_tmpdir(void);

#endif
