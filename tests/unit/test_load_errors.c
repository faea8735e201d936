/* Every bad path of model loading: corrupted copies of the fixture checkpoints (safetensors headers,
 * config.json, MLX packing, sharded indexes) must fail with one line naming the file, tensor or field
 * and what was expected — never crash or leak. Also the session's input checks. */
#include <criterion/criterion.h>
#include <ftw.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "runtime/session.h"
#include "testutil.h"

/* ---- a safetensors file held in memory: header JSON + data section ---- */

typedef struct st_file {
    json_t *hdr;
    uint8_t *data;
    size_t len;
} st_file;

/* model: a folder under models/, or a path under the fixtures ("families/gpt_oss") */
static char *fixture_file(const char *model, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, strchr(model, '/') ? "%s/%s" : "models/%s/%s", model, name);
    return tu_fixture(rel);
}

static st_file st_read(const char *model) {
    char *p = fixture_file(model, "model.safetensors");
    size_t len;
    uint8_t *buf = (uint8_t *)tu_slurp(p, &len);
    cr_assert_geq(len, 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    cr_assert_leq(hlen, len - 8);
    json_error_t je;
    st_file f;
    f.hdr = json_loadb((const char *)buf + 8, hlen, 0, &je);
    cr_assert(f.hdr, "%s: %s", p, je.text);
    f.len = len - 8 - hlen;
    f.data = malloc(f.len ? f.len : 1);
    memcpy(f.data, buf + 8 + hlen, f.len);
    free(buf);
    free(p);
    return f;
}

static void st_free(st_file *f) {
    json_decref(f->hdr);
    free(f->data);
}

static void write_raw(const char *dir, const char *name, const void *data, size_t len) {
    char *p = sl_path_join(dir, name);
    sl_err e;
    cr_assert_eq(sl_write_file(p, data, len, &e), 0, "%s", e.msg);
    free(p);
}

static void write_text(const char *dir, const char *name, const char *s) {
    write_raw(dir, name, s, strlen(s));
}

/* Writes header + the first data_len bytes of the data section to dir/name. */
static void st_write_n(const char *dir, const char *name, const st_file *f, size_t data_len) {
    char *h = json_dumps(f->hdr, JSON_COMPACT);
    cr_assert(h);
    size_t hl = strlen(h), total = 8 + hl + data_len;
    uint8_t *buf = malloc(total);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, h, hl);
    memcpy(buf + 8 + hl, f->data, data_len);
    write_raw(dir, name, buf, total);
    free(buf);
    free(h);
}

static void st_write(const char *dir, const st_file *f) {
    st_write_n(dir, "model.safetensors", f, f->len);
}

static json_t *entry(const st_file *f, const char *name) {
    json_t *v = json_object_get(f->hdr, name);
    cr_assert(v, "fixture has no tensor %s", name);
    return v;
}

static json_int_t begin_of(const st_file *f, const char *name) {
    return json_integer_value(json_array_get(json_object_get(entry(f, name), "data_offsets"), 0));
}

static void set_offsets(st_file *f, const char *name, json_int_t b, json_int_t en) {
    json_object_set_new(entry(f, name), "data_offsets", json_pack("[II]", b, en));
}

static void set_dtype(st_file *f, const char *name, const char *dtype) {
    json_object_set_new(entry(f, name), "dtype", json_string(dtype));
}

static void set_shape(st_file *f, const char *name, json_t *shape) {
    json_object_set_new(entry(f, name), "shape", shape);
}

/* Appends a tensor of raw bytes at the end of the data section. */
static void add_tensor(st_file *f, const char *name, const char *dtype, json_t *shape, size_t nbytes) {
    f->data = realloc(f->data, f->len + nbytes + 1);
    memset(f->data + f->len, 0, nbytes);
    json_object_set_new(f->hdr, name,
                        json_pack("{s:s, s:o, s:[II]}", "dtype", dtype, "shape", shape, "data_offsets",
                                  (json_int_t)f->len, (json_int_t)(f->len + nbytes)));
    f->len += nbytes;
}

/* ---- model directories ---- */

static char *g_dirs[16];
static int g_ndirs;

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void cleanup(void) {
    for (int i = 0; i < g_ndirs; i++) {
        nftw(g_dirs[i], rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        free(g_dirs[i]);
    }
    g_ndirs = 0;
}

TestSuite(load_errors, .fini = cleanup);

static char *new_dir(void) {
    cr_assert_lt(g_ndirs, 16);
    char *d = tu_tmpdir();
    g_dirs[g_ndirs++] = d;
    return d;
}

static void copy_config(const char *model, const char *dir) {
    char *p = fixture_file(model, "config.json");
    size_t len;
    char *s = tu_slurp(p, &len);
    write_raw(dir, "config.json", s, len);
    free(s);
    free(p);
}

/* A fresh directory with the fixture's config.json and f as model.safetensors. */
static char *model_dir(const char *model, const st_file *f) {
    char *d = new_dir();
    copy_config(model, d);
    st_write(d, f);
    return d;
}

static json_t *config_of(const char *model) {
    char *p = fixture_file(model, "config.json");
    json_error_t je;
    json_t *c = json_load_file(p, 0, &je);
    cr_assert(c, "%s: %s", p, je.text);
    free(p);
    return c;
}

/* A directory with the fixture's weights and the config c (consumed). */
static char *config_dir(const char *model, json_t *c) {
    char *d = new_dir();
    char *p = sl_path_join(d, "config.json");
    cr_assert_eq(json_dump_file(c, p, JSON_INDENT(2)), 0);
    free(p);
    json_decref(c);
    st_file f = st_read(model);
    st_write(d, &f);
    st_free(&f);
    return d;
}

/* Loads dir, expecting failure with a single-line message; returns the message. */
static const char *load_fail(const char *dir) {
    static sl_err e;
    memset(&e, 0, sizeof e);
    sl_model *m = NULL;
    sl_model_opts o = {.threads = 1};
    int rc = sl_model_load(dir, &o, &m, &e);
    if (rc == 0) sl_model_free(m);
    cr_assert_eq(rc, -1, "loading %s succeeded", dir);
    cr_assert_neq(e.msg[0], 0, "empty error message");
    cr_assert_null(strchr(e.msg, '\n'), "message spans lines: %s", e.msg);
    cr_log_info("%s", e.msg);
    return e.msg;
}

#define HAS(msg, needle) cr_assert(strstr((msg), (needle)), "expected '%s' in: %s", (needle), (msg))

static char *st_path(const char *dir) {
    return sl_path_join(dir, "model.safetensors");
}

/* Expects the message to name dir/model.safetensors. */
static void has_st_path(const char *msg, const char *dir) {
    char *p = st_path(dir);
    HAS(msg, p);
    free(p);
}

#define Q0 "model.layers.0.self_attn.q_proj.weight"
#define K0 "model.layers.0.self_attn.k_proj.weight"

/* ---- 1. the file and its header ---- */

Test(load_errors, file_shorter_than_8_bytes) {
    char *d = new_dir();
    copy_config("llama", d);
    write_raw(d, "model.safetensors", "\x10\0\0", 3);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "3 bytes");
    HAS(m, "too short");
}

Test(load_errors, empty_file) {
    char *d = new_dir();
    copy_config("llama", d);
    write_raw(d, "model.safetensors", "", 0);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "0 bytes");
}

Test(load_errors, header_length_larger_than_file) {
    char *d = new_dir();
    copy_config("llama", d);
    uint8_t buf[8 + 16] = {0xff, 0x00, 0x00, 0x00, 0, 0, 0, 0};
    memcpy(buf + 8, "{}              ", 16);
    write_raw(d, "model.safetensors", buf, sizeof buf);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "header length 255 exceeds the file size 24");
}

Test(load_errors, header_length_huge) {
    char *d = new_dir();
    copy_config("llama", d);
    uint8_t buf[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    write_raw(d, "model.safetensors", buf, sizeof buf);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "header length");
}

Test(load_errors, header_not_json) {
    char *d = new_dir();
    copy_config("llama", d);
    const char hdr[] = "not json at all!";
    uint8_t buf[8 + sizeof hdr - 1] = {sizeof hdr - 1};
    memcpy(buf + 8, hdr, sizeof hdr - 1);
    write_raw(d, "model.safetensors", buf, sizeof buf);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "header is not valid JSON");
}

Test(load_errors, header_json_not_object) {
    char *d = new_dir();
    copy_config("llama", d);
    const char hdr[] = "[1, 2, 3]";
    uint8_t buf[8 + sizeof hdr - 1] = {sizeof hdr - 1};
    memcpy(buf + 8, hdr, sizeof hdr - 1);
    write_raw(d, "model.safetensors", buf, sizeof buf);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "header is JSON but not an object");
}

Test(load_errors, header_duplicate_key) {
    /* the same tensor named twice in one header: a JSON reader would silently keep one */
    st_file f = st_read("llama");
    json_t *n = json_object_get(f.hdr, "model.norm.weight");
    char *h = json_dumps(f.hdr, JSON_COMPACT), *ent = json_dumps(n, JSON_COMPACT);
    size_t hl = strlen(h);
    char *h2 = malloc(hl + strlen(ent) + 64);
    memcpy(h2, h, hl - 1); /* drop the closing brace */
    sprintf(h2 + hl - 1, ",\"model.norm.weight\":%s}", ent);
    json_decref(f.hdr);
    f.hdr = NULL;
    size_t l2 = strlen(h2), total = 8 + l2 + f.len;
    uint8_t *buf = malloc(total);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)l2 >> (8 * i));
    memcpy(buf + 8, h2, l2);
    memcpy(buf + 8 + l2, f.data, f.len);
    char *d = new_dir();
    copy_config("llama", d);
    write_raw(d, "model.safetensors", buf, total);
    free(buf);
    free(h);
    free(h2);
    free(ent);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "duplicate");
    HAS(m, "model.norm.weight");
}

Test(load_errors, header_entry_not_object) {
    st_file f = st_read("llama");
    json_object_set_new(f.hdr, Q0, json_string("oops"));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, Q0);
    HAS(m, "not an object");
}

/* ---- 2. tensor entries ---- */

Test(load_errors, unknown_dtype) {
    st_file f = st_read("llama");
    set_dtype(&f, Q0, "F33");
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, Q0);
    HAS(m, "unknown dtype 'F33'");
}

Test(load_errors, missing_dtype) {
    st_file f = st_read("llama");
    json_object_del(entry(&f, Q0), "dtype");
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, Q0);
    HAS(m, "'dtype'");
}

Test(load_errors, negative_dim) {
    st_file f = st_read("llama");
    set_shape(&f, Q0, json_pack("[ii]", -128, 128));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, Q0);
    HAS(m, "shape[0] is not a valid dimension");
}

Test(load_errors, non_integer_dim) {
    st_file f = st_read("llama");
    set_shape(&f, Q0, json_pack("[if]", 128, 127.5));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, Q0);
    HAS(m, "shape[1] is not a valid dimension");
}

Test(load_errors, string_dim) {
    st_file f = st_read("llama");
    set_shape(&f, Q0, json_pack("[si]", "128", 128));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, Q0);
    HAS(m, "shape[0] is not a valid dimension");
}

Test(load_errors, shape_not_array) {
    st_file f = st_read("llama");
    set_shape(&f, Q0, json_integer(128));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, Q0);
    HAS(m, "'shape' must be an array");
}

Test(load_errors, too_many_dims) {
    st_file f = st_read("llama");
    set_shape(&f, Q0, json_pack("[iiiiiiiii]", 1, 1, 1, 1, 1, 1, 1, 128, 128));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, Q0);
    HAS(m, "at most 8");
}

Test(load_errors, data_offsets_out_of_range) {
    st_file f = st_read("llama");
    json_int_t b = begin_of(&f, Q0);
    set_offsets(&f, Q0, b + (json_int_t)f.len, b + (json_int_t)f.len + 32768);
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, Q0);
    HAS(m, "outside the");
}

Test(load_errors, data_offsets_negative) {
    st_file f = st_read("llama");
    set_offsets(&f, Q0, -32768, 0);
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, Q0);
    HAS(m, "data_offsets [-32768, 0]");
}

Test(load_errors, data_offsets_reversed) {
    st_file f = st_read("llama");
    json_int_t b = begin_of(&f, Q0);
    set_offsets(&f, Q0, b + 32768, b);
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, Q0);
    HAS(m, "data_offsets");
}

Test(load_errors, data_offsets_malformed) {
    st_file f = st_read("llama");
    json_object_set_new(entry(&f, Q0), "data_offsets", json_pack("[i]", 0));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, Q0);
    HAS(m, "'data_offsets' must be [begin, end]");
}

Test(load_errors, lying_header_size) {
    /* q_proj claims [128, 64] BF16 = 16384 bytes but its offsets span 32768 */
    st_file f = st_read("llama");
    set_shape(&f, Q0, json_pack("[ii]", 128, 64));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, Q0);
    HAS(m, "holds 32768 bytes but shape x BF16 needs 16384");
}

Test(load_errors, lying_header_size_overflow) {
    /* 2^31 x 2^31 F64 elements is 2^65 bytes, which wraps to 0 in 64 bits */
    st_file f = st_read("llama");
    json_int_t b = begin_of(&f, Q0);
    set_dtype(&f, Q0, "F64");
    set_shape(&f, Q0, json_pack("[II]", (json_int_t)1 << 31, (json_int_t)1 << 31));
    set_offsets(&f, Q0, b, b);
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, Q0);
    HAS(m, "shape x F64 overflows");
}

Test(load_errors, overlapping_tensors) {
    st_file f = st_read("llama");
    json_int_t b = begin_of(&f, Q0);
    set_offsets(&f, K0, b + 100, b + 100 + 16384);
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, Q0);
    HAS(m, K0);
    HAS(m, "overlap");
}

Test(load_errors, overlap_hidden_behind_empty_tensor) {
    /* lm_head [0, 131072); an empty tensor at 100 sorts between it and k_proj moved to 1000 */
    st_file f = st_read("llama");
    cr_assert_eq(begin_of(&f, "lm_head.weight"), 0);
    json_object_set_new(f.hdr, "model.layers.0.empty.weight",
                        json_pack("{s:s, s:[i], s:[ii]}", "dtype", "BF16", "shape", 0, "data_offsets", 100, 100));
    set_offsets(&f, K0, 1000, 1000 + 16384);
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "lm_head.weight");
    HAS(m, K0);
    HAS(m, "overlap");
}

Test(load_errors, duplicate_tensor_across_shards) {
    st_file f = st_read("llama");
    char *d = model_dir("llama", &f);
    /* a second shard holding one tensor the first already has */
    st_file g = {json_object(), malloc(256), 256};
    memset(g.data, 0, 256);
    json_object_set_new(g.hdr, "model.norm.weight",
                        json_pack("{s:s, s:[i], s:[ii]}", "dtype", "BF16", "shape", 128, "data_offsets", 0, 256));
    st_write_n(d, "model-extra.safetensors", &g, g.len);
    st_free(&f);
    st_free(&g);
    const char *m = load_fail(d);
    HAS(m, "model.norm.weight");
    HAS(m, "appears twice");
    HAS(m, "model-extra.safetensors");
}

Test(load_errors, truncated_data_section) {
    st_file f = st_read("llama");
    char *d = new_dir();
    copy_config("llama", d);
    st_write_n(d, "model.safetensors", &f, f.len - 1000);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "model.layers.2.self_attn.v_proj.weight"); /* the last tensor of the file */
    HAS(m, "outside the");
}

Test(load_errors, truncated_inside_header) {
    st_file f = st_read("llama");
    char *d = new_dir();
    copy_config("llama", d);
    char *h = json_dumps(f.hdr, JSON_COMPACT);
    size_t hl = strlen(h);
    uint8_t *buf = malloc(8 + hl);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, h, hl);
    write_raw(d, "model.safetensors", buf, 8 + hl / 2);
    free(buf);
    free(h);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "exceeds the file size");
}

/* ---- 3. tensors against the architecture ---- */

Test(load_errors, missing_tensor) {
    st_file f = st_read("llama");
    json_object_del(f.hdr, "model.layers.1.mlp.down_proj.weight");
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, d);
    HAS(m, "missing tensor 'model.layers.1.mlp.down_proj.weight'");
    HAS(m, "[128, 256]");
}

Test(load_errors, missing_norm_vector) {
    st_file f = st_read("llama");
    json_object_del(f.hdr, "model.norm.weight");
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, "missing tensor 'model.norm.weight'");
    HAS(m, "128");
}

Test(load_errors, extra_tensor) {
    st_file f = st_read("llama");
    add_tensor(&f, "model.layers.0.foo.weight", "BF16", json_pack("[i]", 4), 8);
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "unexpected tensor 'model.layers.0.foo.weight'");
    HAS(m, "llama");
}

Test(load_errors, wrong_shape) {
    st_file f = st_read("llama");
    json_int_t b = begin_of(&f, Q0);
    set_shape(&f, Q0, json_pack("[ii]", 128, 64));
    set_offsets(&f, Q0, b, b + 128 * 64 * 2);
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, Q0);
    HAS(m, "has shape [128, 64], expected [128, 128]");
}

Test(load_errors, wrong_rank) {
    st_file f = st_read("llama");
    set_shape(&f, Q0, json_pack("[iii]", 128, 2, 64));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, Q0);
    HAS(m, "has shape [128, 2, 64], expected [128, 128]");
}

Test(load_errors, wrong_vector_length) {
    st_file f = st_read("llama");
    json_int_t b = begin_of(&f, "model.norm.weight");
    set_shape(&f, "model.norm.weight", json_pack("[i]", 64));
    set_offsets(&f, "model.norm.weight", b, b + 128);
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, "model.norm.weight");
    HAS(m, "shape [64], expected 128 elements");
}

Test(load_errors, wrong_dtype_i32_weight) {
    /* same bytes: [128, 64] I32 instead of [128, 128] BF16 */
    st_file f = st_read("llama");
    set_dtype(&f, Q0, "I32");
    set_shape(&f, Q0, json_pack("[ii]", 128, 64));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, Q0);
    HAS(m, "dtype I32, expected F32, F16, BF16, F8_E4M3 or MLX-packed U32");
}

Test(load_errors, wrong_dtype_norm) {
    st_file f = st_read("llama");
    set_dtype(&f, "model.norm.weight", "I16");
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, "model.norm.weight");
    HAS(m, "dtype I16, expected F32, F16 or BF16");
}

Test(load_errors, u32_weight_without_quantization) {
    /* a plain checkpoint whose q_proj is U32 with no scales: not MLX, not a float */
    st_file f = st_read("llama");
    set_dtype(&f, Q0, "U32");
    set_shape(&f, Q0, json_pack("[ii]", 128, 64));
    char *d = model_dir("llama", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, Q0);
    HAS(m, "model.layers.0.self_attn.q_proj.scales");
    HAS(m, "missing");
}

/* ---- 4. config.json ---- */

/* ---- gpt-oss experts ---- */

#define OSS "families/gpt_oss"
#define OSS4 "families/gpt_oss_mxfp4"
#define GU0 "model.layers.0.mlp.experts.gate_up_proj"

Test(load_errors, gpt_oss_stack_inputs_last) {
    st_file f = st_read(OSS);
    set_shape(&f, GU0, json_pack("[iii]", 8, 256, 128)); /* the nn.Linear orientation: same bytes */
    char *d = model_dir(OSS, &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, GU0);
    HAS(m, "has shape [8, 256, 128], expected [8, 128, 256] (experts, inputs, outputs)");
}

Test(load_errors, gpt_oss_missing_sinks) {
    st_file f = st_read(OSS);
    json_object_del(f.hdr, "model.layers.2.self_attn.sinks");
    char *d = model_dir(OSS, &f);
    st_free(&f);
    HAS(load_fail(d), "missing tensor 'model.layers.2.self_attn.sinks' (expected 8 attention sinks)");
}

Test(load_errors, gpt_oss_missing_expert_bias) {
    st_file f = st_read(OSS4);
    json_object_del(f.hdr, "model.layers.1.mlp.experts.down_proj_bias");
    char *d = model_dir(OSS4, &f);
    st_free(&f);
    HAS(load_fail(d), "missing tensor 'model.layers.1.mlp.experts.down_proj_bias' (expected [8, 128])");
}

Test(load_errors, mxfp4_scales_missing) {
    st_file f = st_read(OSS4);
    json_object_del(f.hdr, GU0 "_scales");
    char *d = model_dir(OSS4, &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, GU0 "_blocks' is MXFP4 but '" GU0 "_scales' is missing");
}

Test(load_errors, mxfp4_scales_wrong_shape) {
    st_file f = st_read(OSS4);
    set_shape(&f, GU0 "_scales", json_pack("[iii]", 8, 512, 2)); /* same bytes, other blocks */
    char *d = model_dir(OSS4, &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, "tensor '" GU0 "_scales' is U8 [8, 512, 2], expected U8 [8, 256, 4] (MXFP4 scales)");
}

Test(load_errors, mxfp4_blocks_wrong_dtype) {
    st_file f = st_read(OSS4);
    json_int_t b = begin_of(&f, GU0 "_blocks");
    set_dtype(&f, GU0 "_blocks", "BF16");
    set_shape(&f, GU0 "_blocks", json_pack("[iiii]", 8, 256, 4, 8));
    set_offsets(&f, GU0 "_blocks", b, b + 8 * 256 * 4 * 8 * 2);
    char *d = model_dir(OSS4, &f);
    st_free(&f);
    HAS(load_fail(d), "is BF16 [8, 256, 4, 8], expected U8 [8, 256, 4, 16] (MXFP4 blocks)");
}

Test(load_errors, config_missing) {
    char *d = new_dir();
    st_file f = st_read("llama");
    st_write(d, &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "not found");
}

Test(load_errors, config_invalid_json) {
    char *d = new_dir();
    write_text(d, "config.json", "{\n  \"model_type\": \"llama\",\n  oops\n}\n");
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "invalid JSON at line 3");
}

Test(load_errors, config_not_object) {
    char *d = new_dir();
    write_text(d, "config.json", "[\"llama\"]");
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "not a JSON object");
}

Test(load_errors, config_unknown_model_type) {
    json_t *c = config_of("llama");
    json_object_set_new(c, "model_type", json_string("gpt9"));
    char *d = config_dir("llama", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "unknown model_type 'gpt9'");
    HAS(m, "llama");
    HAS(m, "qwen3_moe");
    HAS(m, "qwen3_5_moe");
}

Test(load_errors, config_missing_model_type) {
    json_t *c = config_of("llama");
    json_object_del(c, "model_type");
    char *d = config_dir("llama", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "'model_type'");
}

Test(load_errors, config_missing_hidden_size) {
    json_t *c = config_of("llama");
    json_object_del(c, "hidden_size");
    char *d = config_dir("llama", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "'hidden_size' missing or not a positive integer");
}

Test(load_errors, config_missing_hidden_size_nested) {
    json_t *c = config_of("qwen3_5_moe");
    json_object_del(json_object_get(c, "text_config"), "hidden_size");
    char *d = config_dir("qwen3_5_moe", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "'hidden_size'");
}

Test(load_errors, config_heads_not_multiple_of_kv_heads) {
    json_t *c = config_of("llama");
    json_object_set_new(c, "num_key_value_heads", json_integer(3));
    char *d = config_dir("llama", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "num_attention_heads 4 is not a multiple of num_key_value_heads 3");
}

Test(load_errors, config_zero_kv_heads) {
    json_t *c = config_of("llama");
    json_object_set_new(c, "num_key_value_heads", json_integer(0));
    char *d = config_dir("llama", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "num_key_value_heads");
}

Test(load_errors, config_unsupported_rope_type) {
    json_t *c = config_of("llama");
    json_object_set_new(json_object_get(c, "rope_parameters"), "rope_type", json_string("dynamic"));
    char *d = config_dir("llama", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "unsupported rope type 'dynamic'");
    HAS(m, "yarn");
}

Test(load_errors, config_llama3_rope_without_original_max) {
    json_t *c = config_of("llama");
    json_t *rp = json_object_get(c, "rope_parameters");
    json_object_set_new(rp, "rope_type", json_string("llama3"));
    json_object_set_new(rp, "factor", json_real(8.0));
    json_object_del(c, "max_position_embeddings");
    char *d = config_dir("llama", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "original_max_position_embeddings");
}

Test(load_errors, config_dims_disagree_with_weights) {
    json_t *c = config_of("llama");
    json_object_set_new(c, "intermediate_size", json_integer(300));
    char *d = config_dir("llama", c);
    const char *m = load_fail(d);
    HAS(m, "model.layers.0.mlp.gate_proj.weight");
    HAS(m, "expected [300, 128]");
}

Test(load_errors, moe_expert_missing) {
    /* fails halfway through layer 1's expert table */
    st_file f = st_read("qwen3_moe");
    json_object_del(f.hdr, "model.layers.1.mlp.experts.7.down_proj.weight");
    char *d = model_dir("qwen3_moe", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, "missing tensor 'model.layers.1.mlp.experts.7.down_proj.weight' (expected [128, 64])");
}

Test(load_errors, moe_num_experts_missing) {
    json_t *c = config_of("qwen3_moe");
    json_object_del(c, "num_experts");
    json_object_del(c, "num_local_experts");
    char *d = config_dir("qwen3_moe", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "num_experts");
}

Test(load_errors, moe_top_k_too_large) {
    json_t *c = config_of("qwen3_moe");
    json_object_set_new(c, "num_experts_per_tok", json_integer(99));
    char *d = config_dir("qwen3_moe", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "num_experts_per_tok 99 must be in [1, 16]");
}

Test(load_errors, fused_experts_wrong_shape) {
    st_file f = st_read("qwen3_5_moe");
    const char *n = "model.language_model.layers.2.mlp.experts.gate_up_proj";
    json_int_t b = begin_of(&f, n);
    set_shape(&f, n, json_pack("[iii]", 16, 64, 128));
    set_offsets(&f, n, b, b + 16 * 64 * 128 * 2);
    char *d = model_dir("qwen3_5_moe", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, n);
    HAS(m, "has shape [16, 64, 128], expected [16, 128, 128]");
}

Test(load_errors, hybrid_conv_kernel_wrong_layout) {
    st_file f = st_read("qwen3_5_moe");
    set_shape(&f, "model.language_model.layers.0.linear_attn.conv1d.weight", json_pack("[iii]", 256, 2, 2));
    char *d = model_dir("qwen3_5_moe", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, "model.language_model.layers.0.linear_attn.conv1d.weight");
    HAS(m, "[C, 1, K] or [C, K, 1]");
}

Test(load_errors, hybrid_config_incomplete) {
    json_t *c = config_of("qwen3_5_moe");
    json_object_del(json_object_get(c, "text_config"), "linear_num_key_heads");
    char *d = config_dir("qwen3_5_moe", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "linear_num_key_heads");
}

Test(load_errors, hybrid_layer_types_wrong_length) {
    json_t *c = config_of("qwen3_5_moe");
    json_array_remove(json_object_get(json_object_get(c, "text_config"), "layer_types"), 0);
    char *d = config_dir("qwen3_5_moe", c);
    const char *m = load_fail(d);
    HAS(m, "config.json");
    HAS(m, "layer_types has 3 entries, expected num_hidden_layers = 4");
}

/* ---- 5. MLX packing ---- */

#define MQ0 "model.layers.0.self_attn.q_proj"

Test(load_errors, mlx_scales_missing) {
    st_file f = st_read("qwen3_moe_mlx_mixed");
    json_object_del(f.hdr, MQ0 ".scales");
    char *d = model_dir("qwen3_moe_mlx_mixed", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, MQ0 ".weight");
    HAS(m, "'" MQ0 ".scales' is missing");
}

Test(load_errors, mlx_biases_missing) {
    st_file f = st_read("qwen3_moe_mlx_mixed");
    json_object_del(f.hdr, MQ0 ".biases");
    char *d = model_dir("qwen3_moe_mlx_mixed", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, "'" MQ0 ".biases' is missing");
}

Test(load_errors, mlx_scales_wrong_group_count) {
    /* 128 inputs in 6-bit groups of 32: 4 groups, not 2 */
    st_file f = st_read("qwen3_moe_mlx_mixed");
    json_int_t b = begin_of(&f, MQ0 ".scales");
    set_shape(&f, MQ0 ".scales", json_pack("[ii]", 128, 2));
    set_offsets(&f, MQ0 ".scales", b, b + 128 * 2 * 2);
    char *d = model_dir("qwen3_moe_mlx_mixed", &f);
    st_free(&f);
    const char *m = load_fail(d);
    has_st_path(m, d);
    HAS(m, MQ0 ".scales");
    HAS(m, "6-bit groups of 32");
}

Test(load_errors, mlx_scales_wrong_dtype) {
    st_file f = st_read("qwen3_moe_mlx_mixed");
    set_dtype(&f, MQ0 ".scales", "I16");
    char *d = model_dir("qwen3_moe_mlx_mixed", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, MQ0 ".scales");
    HAS(m, "F32, F16 or BF16");
}

Test(load_errors, mlx_bits_inconsistent_with_packed_width) {
    /* the table says 4-bit but q_proj is packed 6-bit: 128 * 6 / 32 = 24 words per row */
    json_t *c = config_of("qwen3_moe_mlx_mixed");
    json_object_set_new(json_object_get(json_object_get(c, "quantization"), MQ0), "bits", json_integer(4));
    char *d = config_dir("qwen3_moe_mlx_mixed", c);
    const char *m = load_fail(d);
    HAS(m, MQ0 ".weight");
    HAS(m, "[128, 24]");
    HAS(m, "4-bit");
}

Test(load_errors, mlx_default_bits_inconsistent) {
    /* the default 4 bits of the fused-expert checkpoint changed to 3: 128 * 3 / 32 = 12 words, not 16 */
    json_t *c = config_of("qwen3_5_moe_mlx4");
    json_object_set_new(json_object_get(c, "quantization"), "bits", json_integer(3));
    char *d = config_dir("qwen3_5_moe_mlx4", c);
    const char *m = load_fail(d);
    HAS(m, "language_model.");
    HAS(m, "3-bit");
}

Test(load_errors, mlx_bad_bits_value) {
    json_t *c = config_of("qwen3_moe_mlx_mixed");
    json_object_set_new(json_object_get(json_object_get(c, "quantization"), MQ0), "bits", json_integer(0));
    char *d = config_dir("qwen3_moe_mlx_mixed", c);
    const char *m = load_fail(d);
    HAS(m, MQ0 ".weight");
}

Test(load_errors, mlx_scalar_scales_without_table) {
    /* no quantization table: bits and groups come from the shapes, and a 0-d scales tensor has none */
    json_t *c = config_of("qwen3_moe_mlx_mixed");
    json_object_del(c, "quantization");
    json_object_del(c, "quantization_config");
    char *d = new_dir();
    char *p = sl_path_join(d, "config.json");
    cr_assert_eq(json_dump_file(c, p, 0), 0);
    free(p);
    json_decref(c);
    st_file f = st_read("qwen3_moe_mlx_mixed");
    json_int_t b = begin_of(&f, MQ0 ".scales");
    set_shape(&f, MQ0 ".scales", json_array());
    set_offsets(&f, MQ0 ".scales", b, b + 2);
    st_write(d, &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, MQ0 ".scales' has 0 dimensions, expected 2");
}

Test(load_errors, mlx_stacked_experts_wrong_count) {
    st_file f = st_read("qwen3_moe_mlx_mixed");
    const char *n = "model.layers.0.mlp.switch_mlp.gate_proj.weight";
    json_int_t b = begin_of(&f, n);
    set_shape(&f, n, json_pack("[iii]", 8, 64, 12));
    set_offsets(&f, n, b, b + 8 * 64 * 12 * 4);
    char *d = model_dir("qwen3_moe_mlx_mixed", &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, n);
    HAS(m, "expected [16, 64, 128]");
}

/* ---- 6. directories, indexes and files ---- */

Test(load_errors, index_names_missing_shard) {
    char *d = new_dir();
    copy_config("llama", d);
    write_text(d, "model.safetensors.index.json",
               "{\"metadata\": {}, \"weight_map\": {\"lm_head.weight\": \"model-00001-of-00002.safetensors\"}}");
    const char *m = load_fail(d);
    HAS(m, "model-00001-of-00002.safetensors");
    HAS(m, "cannot open");
}

Test(load_errors, index_invalid_json) {
    char *d = new_dir();
    copy_config("llama", d);
    st_file f = st_read("llama");
    st_write(d, &f);
    st_free(&f);
    write_text(d, "model.safetensors.index.json", "{\"weight_map\": {");
    const char *m = load_fail(d);
    HAS(m, "model.safetensors.index.json");
    HAS(m, "invalid JSON");
}

Test(load_errors, index_without_weight_map) {
    char *d = new_dir();
    copy_config("llama", d);
    write_text(d, "model.safetensors.index.json", "{\"metadata\": {}}");
    const char *m = load_fail(d);
    HAS(m, "model.safetensors.index.json");
    HAS(m, "'weight_map'");
}

Test(load_errors, index_with_path_outside_dir) {
    char *d = new_dir();
    copy_config("llama", d);
    write_text(d, "model.safetensors.index.json", "{\"weight_map\": {\"lm_head.weight\": \"../x.safetensors\"}}");
    const char *m = load_fail(d);
    HAS(m, "model.safetensors.index.json");
    HAS(m, "lm_head.weight");
}

Test(load_errors, index_with_empty_weight_map) {
    char *d = new_dir();
    copy_config("llama", d);
    write_text(d, "model.safetensors.index.json", "{\"weight_map\": {}}");
    const char *m = load_fail(d);
    HAS(m, d);
    HAS(m, "safetensors");
}

Test(load_errors, sharded_with_tensor_missing) {
    /* a valid two-shard split of llama minus one tensor: the shards load, the model does not */
    st_file f = st_read("llama");
    char *d = new_dir();
    copy_config("llama", d);
    st_file a = {json_object(), f.data, f.len}, b = {json_object(), f.data, f.len};
    json_t *idx = json_object(), *wm = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(f.hdr, k, v) {
        if (!strcmp(k, "__metadata__") || !strcmp(k, "model.layers.2.mlp.up_proj.weight")) continue;
        int second = strstr(k, "layers.2.") != NULL;
        json_object_set(second ? b.hdr : a.hdr, k, v);
        json_object_set_new(wm, k, json_string(second ? "model-2.safetensors" : "model-1.safetensors"));
    }
    json_object_set_new(idx, "weight_map", wm);
    st_write_n(d, "model-1.safetensors", &a, a.len);
    st_write_n(d, "model-2.safetensors", &b, b.len);
    char *p = sl_path_join(d, "model.safetensors.index.json");
    cr_assert_eq(json_dump_file(idx, p, 0), 0);
    free(p);
    json_decref(idx);
    json_decref(a.hdr);
    json_decref(b.hdr);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, "missing tensor 'model.layers.2.mlp.up_proj.weight'");
}

Test(load_errors, no_safetensors_in_dir) {
    char *d = new_dir();
    copy_config("llama", d);
    const char *m = load_fail(d);
    HAS(m, d);
    HAS(m, "no *.safetensors files");
}

Test(load_errors, path_is_a_file) {
    char *p = fixture_file("llama", "config.json");
    const char *m = load_fail(p);
    HAS(m, p);
    HAS(m, "not a model directory");
    free(p);
}

Test(load_errors, path_does_not_exist) {
    char *d = new_dir();
    char *p = sl_path_join(d, "nope");
    const char *m = load_fail(p);
    HAS(m, p);
    HAS(m, "not a directory");
    free(p);
}

Test(load_errors, safetensors_name_is_a_directory) {
    char *d = new_dir();
    copy_config("llama", d);
    char *p = st_path(d);
    cr_assert_eq(mkdir(p, 0755), 0);
    const char *m = load_fail(d);
    HAS(m, p);
    HAS(m, "not a regular file");
    free(p);
}

Test(load_errors, unreadable_safetensors) {
    if (geteuid() == 0) cr_skip_test("running as root: file permissions do not block reads");
    st_file f = st_read("llama");
    char *d = model_dir("llama", &f);
    st_free(&f);
    char *p = st_path(d);
    cr_assert_eq(chmod(p, 0), 0);
    const char *m = load_fail(d);
    HAS(m, p);
    HAS(m, "cannot open");
    free(p);
}

Test(load_errors, unreadable_config) {
    if (geteuid() == 0) cr_skip_test("running as root: file permissions do not block reads");
    st_file f = st_read("llama");
    char *d = model_dir("llama", &f);
    st_free(&f);
    char *p = sl_path_join(d, "config.json");
    cr_assert_eq(chmod(p, 0), 0);
    const char *m = load_fail(d);
    HAS(m, p);
    HAS(m, "cannot read");
    free(p);
}

/* ---- 7. session inputs ---- */

static sl_model *load_ok(const char *model) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", model);
    char *dir = tu_fixture(rel);
    sl_err e = {{0}};
    sl_model *m = NULL;
    sl_model_opts o = {.threads = 1};
    cr_assert_eq(sl_model_load(dir, &o, &m, &e), 0, "%s", e.msg);
    free(dir);
    return m;
}

Test(load_errors, token_id_outside_vocabulary) {
    sl_model *m = load_ok("llama");
    sl_session *s = NULL;
    sl_err e = {{0}};
    cr_assert_eq(sl_session_create(m, 16, &s, &e), 0, "%s", e.msg);
    int32_t ids[] = {1, 512};
    cr_assert_eq(sl_session_forward(s, ids, 2, NULL, 0, &e), -1);
    HAS(e.msg, "token id 512 at position 1");
    HAS(e.msg, "[0, 512)");
    cr_assert_eq(sl_session_pos(s), 0);
    int32_t neg[] = {-3};
    cr_assert_eq(sl_session_forward(s, neg, 1, NULL, 0, &e), -1);
    HAS(e.msg, "token id -3");
    cr_assert_eq(sl_session_pos(s), 0);
    sl_session_free(s);
    sl_model_free(m);
}

Test(load_errors, context_overflow) {
    sl_model *m = load_ok("llama");
    sl_session *s = NULL;
    sl_err e = {{0}};
    cr_assert_eq(sl_session_create(m, 4, &s, &e), 0, "%s", e.msg);
    int32_t ids[] = {1, 2, 3, 4, 5};
    cr_assert_eq(sl_session_forward(s, ids, 5, NULL, 0, &e), -1);
    HAS(e.msg, "context overflow");
    HAS(e.msg, "context of 4");
    cr_assert_eq(sl_session_pos(s), 0);
    float *logits = malloc(sizeof *logits * 512);
    cr_assert_eq(sl_session_forward(s, ids, 3, logits, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(sl_session_forward(s, ids + 3, 2, logits, 0, &e), -1);
    HAS(e.msg, "3 tokens in the session + 2 new exceed the context of 4");
    cr_assert_eq(sl_session_pos(s), 3);
    cr_assert_eq(sl_session_forward(s, ids + 3, 1, logits, 0, &e), 0, "%s", e.msg);
    free(logits);
    sl_session_free(s);
    sl_model_free(m);
}

/* ---- config values that are present but unusable ---- */

static const char *load_with_field(const char *field, json_t *value) {
    json_t *c = config_of("llama");
    json_object_set_new(c, field, value);
    return load_fail(config_dir("llama", c));
}

Test(load_errors, config_head_dim_negative) {
    const char *m = load_with_field("head_dim", json_integer(-4));
    HAS(m, "config.json");
    HAS(m, "head_dim");
}

Test(load_errors, config_head_dim_zero) {
    const char *m = load_with_field("head_dim", json_integer(0));
    HAS(m, "config.json");
    HAS(m, "head_dim");
}

Test(load_errors, config_intermediate_negative) {
    const char *m = load_with_field("intermediate_size", json_integer(-256));
    HAS(m, "config.json");
    HAS(m, "intermediate_size");
}

Test(load_errors, config_layers_huge) {
    const char *m = load_with_field("num_hidden_layers", json_integer(2000000000));
    HAS(m, "config.json");
    HAS(m, "num_hidden_layers 2000000000 exceeds");
}

Test(load_errors, config_hidden_size_beyond_int) {
    const char *m = load_with_field("hidden_size", json_integer((json_int_t)1 << 32 | 128));
    HAS(m, "config.json");
    HAS(m, "'hidden_size' missing or not a positive integer");
}

Test(load_errors, config_vocab_not_integer) {
    const char *m = load_with_field("vocab_size", json_string("512"));
    HAS(m, "config.json");
    HAS(m, "'vocab_size' missing or not a positive integer");
}

/* ---- DeepSeek-V3: block FP8 scales, multi-token-prediction layers ---- */

#define DS_FP8 "families/deepseek_v3_fp8"
#define DS "families/deepseek_v3"

Test(load_errors, fp8_scale_missing) {
    st_file f = st_read(DS_FP8);
    const char *w = "model.layers.0.self_attn.q_a_proj.weight_scale_inv";
    cr_assert(json_object_get(f.hdr, w));
    json_object_del(f.hdr, w);
    char *d = model_dir(DS_FP8, &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, "model.layers.0.self_attn.q_a_proj.weight' is F8_E4M3 but");
    HAS(m, "weight_scale_inv' is missing");
}

Test(load_errors, fp8_scale_shape) {
    st_file f = st_read(DS_FP8);
    set_shape(&f, "model.layers.0.self_attn.q_a_proj.weight_scale_inv", json_pack("[i]", 2));
    char *d = model_dir(DS_FP8, &f);
    st_free(&f);
    const char *m = load_fail(d);
    HAS(m, "q_a_proj.weight_scale_inv' is F32 [2], expected F32 [1, 2] (one scale per 128x128 tile");
}

Test(load_errors, nextn_layers_ignored_only_when_configured) {
    st_file f = st_read(DS);
    add_tensor(&f, "model.layers.3.eh_proj.weight", "BF16", json_pack("[ii]", 4, 4), 32);
    char *d = model_dir(DS, &f);
    sl_err e;
    sl_model *m;
    sl_model_opts o = {.threads = 1};
    cr_assert_eq(sl_model_load(d, &o, &m, &e), 0, "num_nextn_predict_layers 1: %s", e.msg);
    sl_model_free(m);
    json_t *c = config_of(DS);
    json_object_set_new(c, "num_nextn_predict_layers", json_integer(0));
    char *d2 = new_dir();
    char *p = sl_path_join(d2, "config.json");
    cr_assert_eq(json_dump_file(c, p, JSON_INDENT(2)), 0);
    free(p);
    json_decref(c);
    st_write(d2, &f);
    st_free(&f);
    HAS(load_fail(d2), "unexpected tensor 'model.layers.3.eh_proj.weight'");
}
