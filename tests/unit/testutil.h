/* Shared helpers for the unit tests: fixture paths, fixture folders as test parameters, file loading. */
#ifndef SLUICE_TESTUTIL_H
#define SLUICE_TESTUTIL_H

#include <stddef.h>

/* $SLUICE_FIXTURES/rel (falls back to tests/fixtures relative to the working directory). Heap string. */
/* sqrt(sum (a - b)^2 / sum b^2) over n values, in double (the denominator 1 when b is all zero). */
double tu_rel_l2(const float *a, const float *b, size_t n);
/* The index of the largest of v[0, n) (the lowest among equals). */
int tu_argmax(const float *v, int n);
/* Whether the tests run on the CUDA backend (SLUICE_BACKEND=cuda). */
int tu_on_gpu(void);
char *tu_fixture(const char *rel);
/* Whole file, NUL-terminated; aborts the test on failure. */
char *tu_slurp(const char *path, size_t *len);
/* Path of the sluice binary ($SLUICE_BIN). */
const char *tu_sluice_bin(void);
/* Whether s[0, n) is complete, valid UTF-8 (the tests' own strict decoder, independent of src/text). */
int tu_valid_utf8(const char *s, size_t n);
/* A fresh temporary directory (heap string). */
char *tu_tmpdir(void);

/* A fixture folder's name as a Criterion test parameter (in cr_malloc'ed memory, which the test processes
 * can read). */
typedef struct tu_name {
    char s[96];
} tu_name;
struct criterion_test_params;
/* The folders of $SLUICE_FIXTURES/kind that hold the file `file`, sorted by name; with moe_only, those
 * whose `file` is a GGUF file with experts (<arch>.expert_count > 0). For Criterion's parameter generators:
 * the array is cr_calloc'ed (NULL when there are none), for tu_free_names, and nothing is asserted. */
tu_name *tu_fixture_names(const char *kind, const char *file, int moe_only, size_t *n);
/* Frees tu_fixture_names' array: the cleanup of a parameter array made from it. */
void tu_free_names(struct criterion_test_params *crp);
/* Inside a test: fails it unless the same scan finds every name of want and none of unwanted (both
 * NULL-terminated; unwanted may be NULL), so that a scan that misses the fixtures the repository ships
 * cannot pass by testing nothing. */
void tu_expect_fixtures(const char *kind, const char *file, int moe_only, const char *const *want,
                        const char *const *unwanted);

/* GGUF fixtures the repository ships (tests/fixtures/gguf), all and those with experts. */
#define TU_GGUF_SHIPPED_MOE                                                                                            \
    "qwen3_moe-Q4_K_M", "qwen3_moe-Q5_K_M", "qwen3_5_moe-Q4_K_M", "qwen3_5_moe-Q3_K_M", "qwen3_5_moe-IQ4_XS"
#define TU_GGUF_SHIPPED "llama-Q8_0", "llama-Q4_0", "llama-Q6_K", TU_GGUF_SHIPPED_MOE

#endif
