/* The safetensors writer: single files and shards with an index round-trip through the reader, byte for
 * byte, and write failures are reported with the path. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "formats/safetensors.h"
#include "formats/st_write.h"
#include "testutil.h"

/* byte i of tensor t is a function of both, so misplaced data shows */
static void fill(void *ctx, const sl_st_wtensor *t, uint64_t off, uint8_t *buf, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(t->kind * 31 + (int)((off + i) * 7));
}

static int calls;
static void progress(void *ctx, uint64_t done, uint64_t total) {
    (void)ctx;
    cr_assert(done <= total);
    calls++;
}

static sl_st_wtensor mk(const char *name, sl_st_dtype dt, int64_t a, int64_t b, int kind) {
    sl_st_wtensor t = {0};
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = dt;
    t.ndim = b ? 2 : 1;
    t.shape[0] = a;
    t.shape[1] = b;
    t.kind = kind;
    return t;
}

static void check_set(const char *dir, const sl_st_wtensor *t, int n) {
    sl_st_set *s = NULL;
    sl_err e = {{0}};
    cr_assert_eq(sl_st_open_dir(dir, &s, &e), 0, "%s", e.msg);
    cr_assert_eq(s->n_tensors, n);
    for (int i = 0; i < n; i++) {
        const sl_st_tensor *x = sl_st_find(s, t[i].name);
        cr_assert(x, "%s missing", t[i].name);
        cr_assert_eq(x->dtype, t[i].dtype);
        cr_assert_eq(x->ndim, t[i].ndim);
        for (int d = 0; d < x->ndim; d++) cr_assert_eq(x->shape[d], t[i].shape[d]);
        cr_assert_eq(x->nbytes, sl_st_wtensor_bytes(&t[i]));
        for (uint64_t k = 0; k < x->nbytes; k++)
            cr_assert_eq(x->data[k], (uint8_t)(t[i].kind * 31 + (int)(k * 7)), "%s byte %lu", t[i].name,
                         (unsigned long)k);
    }
    sl_st_close(s);
}

Test(st_write, single_file) {
    char *dir = tu_tmpdir();
    sl_st_wtensor t[] = {mk("a.weight", SL_ST_BF16, 3, 5, 1), mk("b", SL_ST_F32, 7, 0, 2),
                         mk("c.scales", SL_ST_U32, 2, 3, 3)};
    sl_err e = {{0}};
    calls = 0;
    cr_assert_eq(sl_st_write(dir, t, 3, 0, fill, progress, NULL, &e), 0, "%s", e.msg);
    cr_assert(calls >= 3);
    char *p = sl_path_join(dir, "model.safetensors");
    cr_assert(sl_file_exists(p));
    free(p);
    check_set(dir, t, 3);
    free(dir);
}

Test(st_write, shards_and_index) {
    char *dir = tu_tmpdir();
    sl_st_wtensor t[] = {mk("x0", SL_ST_BF16, 64, 8, 1), mk("x1", SL_ST_BF16, 64, 8, 2), mk("x2", SL_ST_F32, 100, 0, 3),
                         mk("x3", SL_ST_U8, 9, 0, 4), mk("x4", SL_ST_BF16, 16, 16, 5)};
    sl_err e = {{0}};
    /* a shard closes once it holds 1000 bytes: x0 | x1 | x2 x3 x4 */
    cr_assert_eq(sl_st_write(dir, t, 5, 1000, fill, NULL, NULL, &e), 0, "%s", e.msg);
    char *idx = sl_path_join(dir, "model.safetensors.index.json");
    char *last = sl_path_join(dir, "model-00003-of-00003.safetensors");
    cr_assert(sl_file_exists(idx) && sl_file_exists(last));
    free(idx);
    free(last);
    check_set(dir, t, 5);
    free(dir);
}

Test(st_write, unwritable_folder_names_the_path) {
    sl_st_wtensor t[] = {mk("a", SL_ST_F32, 4, 0, 1)};
    sl_err e = {{0}};
    cr_assert_eq(sl_st_write("/nonexistent/dir", t, 1, 0, fill, NULL, NULL, &e), -1);
    cr_assert(strstr(e.msg, "/nonexistent/dir/model.safetensors"), "%s", e.msg);
}
