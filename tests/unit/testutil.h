/* Shared helpers for the unit tests: fixture paths, fixture folders as test parameters, file loading. */
#ifndef SLUICE_TESTUTIL_H
#define SLUICE_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

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

/* sqrt(sum (a - b)^2 / sum b^2) over n values, in double (the denominator 1 when b is all zero). */
double tu_rel_l2(const float *a, const float *b, size_t n);
/* The index of the largest of v[0, n) (the lowest among equals). */
int tu_argmax(const float *v, int n);
/* Whether the tests run on the CUDA backend (SLUICE_BACKEND=cuda). */
int tu_on_gpu(void);
/* A pseudo-random value in [-0.5, 0.5) from the state *st (a fixed LCG: same values on every machine). */
float tu_frand(unsigned *st);
/* bytes of host memory h copied into fresh backend memory (asserted). */
void *tu_dev_copy(sl_backend *be, const void *h, size_t bytes);

/* A batch map of n tokens of sequence 0 at positions pos0.., over np pages of P positions in reverse order
 * (so a row that ignores the page table lands elsewhere). The host arrays hpos, hseq [n] and hpages [np]
 * are the caller's and are filled here; the device copies belong to the map (tu_map_free). */
typedef struct tu_map {
    sl_backend *be;
    sl_batch_map bm;
    int32_t *dpos, *dseq, *dpages;
} tu_map;
void tu_map_make(tu_map *m, sl_backend *be, int n, int pos0, int32_t *hpos, int32_t *hseq, int32_t *hpages, int np,
                 int P);
void tu_map_free(tu_map *m);

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
