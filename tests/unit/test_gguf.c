/* The GGUF reader on well-formed and corrupt files, split sets, and tokenizers read from GGUF metadata.
 * A small GGUF writer here re-serialises the fixtures with changes (split, realigned, a key dropped, a
 * type changed) and writes tokenizer-only files from tokenizer.json vocabularies. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "runtime/session.h"
#include "testutil.h"
#include "text/tok_gguf.h"
#include "text/tokenizer.h"

/* ---- writer ---- */

typedef struct wb {
    uint8_t *b;
    size_t n, cap;
} wb;

static void put(wb *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 64;
        w->b = realloc(w->b, w->cap);
        cr_assert(w->b);
    }
    if (n) memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void put_u32(wb *w, uint32_t v) {
    put(w, &v, 4);
}
static void put_u64(wb *w, uint64_t v) {
    put(w, &v, 8);
}
static void put_str(wb *w, const char *s, size_t n) {
    put_u64(w, n);
    put(w, s, n);
}

typedef struct gw {
    wb kv, info, data;
    uint64_t n_kv, n_t;
    uint32_t align; /* layout alignment of tensor data */
} gw;

static void kv_head(gw *g, const char *key, uint32_t type) {
    put_str(&g->kv, key, strlen(key));
    put_u32(&g->kv, type);
    g->n_kv++;
}
static void kv_u32(gw *g, const char *key, uint32_t v) {
    kv_head(g, key, SL_GGUF_U32);
    put_u32(&g->kv, v);
}
static void kv_u16(gw *g, const char *key, uint16_t v) {
    kv_head(g, key, SL_GGUF_U16);
    put(&g->kv, &v, 2);
}
static void kv_str(gw *g, const char *key, const char *s) {
    kv_head(g, key, SL_GGUF_STRING);
    put_str(&g->kv, s, strlen(s));
}
static void kv_strs(gw *g, const char *key, int n, char **s) {
    kv_head(g, key, SL_GGUF_ARRAY);
    put_u32(&g->kv, SL_GGUF_STRING);
    put_u64(&g->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) put_str(&g->kv, s[i], strlen(s[i]));
}
static void kv_i32s(gw *g, const char *key, int n, const int32_t *v) {
    kv_head(g, key, SL_GGUF_ARRAY);
    put_u32(&g->kv, SL_GGUF_I32);
    put_u64(&g->kv, (uint64_t)n);
    put(&g->kv, v, 4 * (size_t)n);
}

static size_t scalar_bytes(sl_gguf_vtype t) {
    static const size_t s[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return s[t];
}

/* Copies one key of an opened file (flat values, as the fixtures have). */
static void kv_copy(gw *g, const sl_gguf_kv *kv) {
    kv_head(g, kv->key, kv->type);
    if (kv->type == SL_GGUF_STRING) {
        put_str(&g->kv, kv->strs[0].s, kv->strs[0].len);
    } else if (kv->type == SL_GGUF_ARRAY) {
        put_u32(&g->kv, kv->elem);
        put_u64(&g->kv, kv->n);
        if (kv->elem == SL_GGUF_STRING)
            for (uint64_t i = 0; i < kv->n; i++) put_str(&g->kv, kv->strs[i].s, kv->strs[i].len);
        else
            put(&g->kv, kv->raw, kv->n * scalar_bytes(kv->elem));
    } else {
        put(&g->kv, kv->raw, scalar_bytes(kv->type));
    }
}

static void tensor(gw *g, const sl_gguf_tensor *t, uint32_t type) {
    while (g->data.n % g->align) put(&g->data, "", 1);
    put_str(&g->info, t->name, strlen(t->name));
    put_u32(&g->info, (uint32_t)t->ndim);
    for (int i = 0; i < t->ndim; i++) put_u64(&g->info, (uint64_t)t->ne[i]);
    put_u32(&g->info, type);
    put_u64(&g->info, g->data.n);
    put(&g->data, t->data, t->nbytes);
    g->n_t++;
}

static void gw_write(gw *g, const char *path, uint32_t version) {
    wb f = {0};
    put(&f, "GGUF", 4);
    put_u32(&f, version);
    put_u64(&f, g->n_t);
    put_u64(&f, g->n_kv);
    put(&f, g->kv.b, g->kv.n);
    put(&f, g->info.b, g->info.n);
    while (f.n % g->align) put(&f, "", 1);
    put(&f, g->data.b, g->data.n);
    FILE *fp = fopen(path, "wb");
    cr_assert(fp, "%s", path);
    cr_assert_eq(fwrite(f.b, 1, f.n, fp), f.n);
    fclose(fp);
    free(f.b);
    free(g->kv.b);
    free(g->info.b);
    free(g->data.b);
    memset(g, 0, sizeof *g);
}

/* ---- helpers ---- */

static const char *FIXTURE = "gguf/llama-Q8_0/model.gguf";

static sl_gguf *open_fixture(void) {
    char *p = tu_fixture(FIXTURE);
    sl_gguf *g;
    sl_err e;
    cr_assert_eq(sl_gguf_open(p, &g, &e), 0, "%s", e.msg);
    free(p);
    return g;
}

typedef struct rewrite {
    const char *drop_key;   /* omitted */
    uint32_t alignment;     /* written as general.alignment when nonzero */
    int bad_type_tensor;    /* index of a tensor whose type becomes 99, or -1 */
    int split_count, split; /* this file is split `split` (0-based) of split_count, tensors dealt round-robin */
} rewrite;

static void write_variant(const sl_gguf *src, const char *path, const rewrite *r) {
    gw g = {.align = r->alignment && !(r->alignment & (r->alignment - 1)) ? r->alignment : 32};
    for (int i = 0; i < src->n_kv; i++)
        if (!r->drop_key || strcmp(src->kv[i].key, r->drop_key)) kv_copy(&g, &src->kv[i]);
    if (r->alignment) kv_u32(&g, "general.alignment", r->alignment);
    if (r->split_count) {
        kv_u16(&g, "split.no", (uint16_t)r->split);
        kv_u16(&g, "split.count", (uint16_t)r->split_count);
    }
    for (int i = 0; i < src->n_tensors; i++) {
        if (r->split_count && i % r->split_count != r->split) continue;
        tensor(&g, &src->tensors[i], i == r->bad_type_tensor ? 99u : (uint32_t)src->tensors[i].type);
    }
    gw_write(&g, path, 3);
}

static char *tmp_path(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

/* Opening (and, with `model`, loading) path fails with one line that names the file and contains `want`. */
static void expect_error(const char *path, int model, const char *want) {
    sl_err e = {{0}};
    int rc;
    if (model) {
        sl_model *m = NULL;
        rc = sl_model_load(path, NULL, &m, &e);
        if (!rc) sl_model_free(m);
    } else {
        sl_gguf *g = NULL;
        rc = sl_gguf_open(path, &g, &e);
        if (!rc) sl_gguf_close(g);
    }
    cr_assert_neq(rc, 0, "%s: expected an error containing '%s'", path, want);
    cr_expect(strstr(e.msg, want), "error '%s' does not contain '%s'", e.msg, want);
    cr_expect(strstr(e.msg, path) || strstr(e.msg, "model-"), "error '%s' does not name the file", e.msg);
    cr_expect(!strchr(e.msg, '\n'), "error '%s' is not one line", e.msg);
}

/* The fixture's bytes with a change: the first `keep` bytes (0: all), then `patch` at `at`. */
static void write_bytes(const char *path, size_t keep, size_t at, const void *patch, size_t n) {
    char *src = tu_fixture(FIXTURE);
    size_t len;
    char *b = tu_slurp(src, &len);
    if (patch) memcpy(b + at, patch, n);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fwrite(b, 1, keep ? keep : len, f);
    fclose(f);
    free(b);
    free(src);
}

static float *logits_of(const char *path, int *V) {
    sl_err e;
    sl_model *m;
    sl_session *s;
    cr_assert_eq(sl_model_load(path, NULL, &m, &e), 0, "%s", e.msg);
    int32_t ids[6] = {3, 77, 140, 255, 9, 200};
    *V = m->cfg.vocab_size;
    float *out = malloc(sizeof *out * 6 * (size_t)*V);
    cr_assert_eq(sl_session_create(m, 6, &s, &e), 0, "%s", e.msg);
    cr_assert_eq(sl_session_forward(s, ids, 6, out, 1, &e), 0, "%s", e.msg);
    sl_session_free(s);
    sl_model_free(m);
    return out;
}

/* ---- tests ---- */

Test(gguf_reader, metadata_and_tensors) {
    sl_gguf *g = open_fixture();
    sl_err e;
    sl_gguf_str a;
    int64_t v;
    cr_expect_eq(g->version, 3);
    cr_expect_eq(g->alignment, 32);
    cr_assert_eq(sl_gguf_get_str(g, "general.architecture", &a, &e), 0);
    cr_expect(a.len == 5 && !memcmp(a.s, "llama", 5));
    cr_assert_eq(sl_gguf_get_int(g, "llama.block_count", &v, &e), 0);
    cr_expect_eq(v, 1);
    cr_expect_eq(sl_gguf_get_int(g, "no.such.key", &v, &e), 1);
    cr_expect_eq(sl_gguf_get_int(g, "general.architecture", &v, &e), -1);
    cr_expect(strstr(e.msg, "'general.architecture' is string, expected an integer"), "%s", e.msg);
    const sl_gguf_kv *toks;
    cr_assert_eq(sl_gguf_get_array(g, "tokenizer.ggml.tokens", SL_GGUF_STRING, &toks, &e), 0);
    cr_expect_eq(toks->n, 320);
    const sl_gguf_tensor *t = sl_gguf_find_tensor(g, "token_embd.weight");
    cr_assert(t);
    cr_expect_eq(t->ndim, 2);
    cr_expect_eq(t->ne[0], 256);
    cr_expect_eq(t->ne[1], 320);
    cr_expect_eq(t->type, 8); /* Q8_0: 34-byte blocks of 32 */
    cr_expect_eq(t->nbytes, 320 * 8 * 34);
    cr_expect_eq(t->offset % 32, 0);
    sl_gguf_close(g);
}

Test(gguf_reader, split_and_realigned_set_loads_the_same_model) {
    sl_gguf *g = open_fixture();
    char *dir = tu_tmpdir();
    char *p1 = tmp_path(dir, "model-00001-of-00002.gguf"), *p2 = tmp_path(dir, "model-00002-of-00002.gguf");
    rewrite r1 = {NULL, 64, -1, 2, 0}, r2 = {NULL, 64, -1, 2, 1};
    write_variant(g, p1, &r1);
    write_variant(g, p2, &r2);
    sl_gguf_close(g);
    sl_gguf *s;
    sl_err e;
    cr_assert_eq(sl_gguf_open(p1, &s, &e), 0, "%s", e.msg);
    cr_expect_eq(s->n_files, 2);
    cr_expect_eq(s->n_tensors, 12);
    cr_expect_eq(s->alignment, 64);
    sl_gguf_close(s);
    char *orig = tu_fixture(FIXTURE);
    int V1, V2;
    float *a = logits_of(orig, &V1), *b = logits_of(p1, &V2);
    cr_assert_eq(V1, V2);
    cr_expect_arr_eq(a, b, sizeof *a * 6 * (size_t)V1, "split set gives other logits than the single file");
    expect_error(p2, 0, "this is split 2 of 2; open the first split");
    remove(p2);
    expect_error(p1, 0, "split 2 of 2 is missing");
    remove(p1);
    free(a), free(b), free(orig), free(p1), free(p2);
    rmdir(dir);
    free(dir);
}

Test(gguf_reader, corrupt_files) {
    char *dir = tu_tmpdir();
    char *p = tmp_path(dir, "bad.gguf");
    write_bytes(p, 100, 0, NULL, 0);
    expect_error(p, 0, "truncated file");
    write_bytes(p, 2000, 0, NULL, 0);
    expect_error(p, 0, "truncated file while reading tokenizer.ggml.tokens");
    write_bytes(p, 3, 0, NULL, 0);
    expect_error(p, 0, "bad magic");
    write_bytes(p, 0, 0, "GGUX", 4);
    expect_error(p, 0, "not a GGUF file (bad magic");
    uint32_t v = 9;
    write_bytes(p, 0, 4, &v, 4);
    expect_error(p, 0, "unsupported GGUF version 9 (expected 2 or 3)");
    v = 1;
    write_bytes(p, 0, 4, &v, 4);
    expect_error(p, 0, "GGUF version 1 is not supported");
    size_t len;
    char *src = tu_fixture(FIXTURE);
    free(tu_slurp(src, &len));
    free(src);
    write_bytes(p, len - 64, 0, NULL, 0);
    expect_error(p, 0, "extends past the end of the file");
    uint64_t huge = 1ull << 40;
    write_bytes(p, 0, 8, &huge, 8);
    expect_error(p, 0, "the header claims 25 metadata keys and 1099511627776 tensors");

    sl_gguf *g = open_fixture();
    rewrite bad_type = {NULL, 0, 2, 0, 0};
    write_variant(g, p, &bad_type);
    expect_error(p, 0, "has unknown GGML type 99");
    rewrite bad_align = {NULL, 48, -1, 0, 0};
    write_variant(g, p, &bad_align);
    expect_error(p, 0, "general.alignment is 48 (expected a power of two)");
    rewrite no_key = {"llama.embedding_length", 0, -1, 0, 0};
    write_variant(g, p, &no_key);
    expect_error(p, 1, "missing metadata key 'llama.embedding_length'");
    rewrite no_arch = {"general.architecture", 0, -1, 0, 0};
    write_variant(g, p, &no_arch);
    expect_error(p, 1, "missing metadata key 'general.architecture'");
    sl_gguf_close(g);
    remove(p);
    free(p);
    rmdir(dir);
    free(dir);
}

/* A tensor nobody uses, and a split count that the name contradicts. */
Test(gguf_reader, unexpected_tensor_and_split_count) {
    sl_gguf *g = open_fixture();
    char *dir = tu_tmpdir();
    char *p = tmp_path(dir, "extra.gguf");
    gw w = {.align = 32};
    for (int i = 0; i < g->n_kv; i++) kv_copy(&w, &g->kv[i]);
    for (int i = 0; i < g->n_tensors; i++) tensor(&w, &g->tensors[i], (uint32_t)g->tensors[i].type);
    sl_gguf_tensor extra = g->tensors[1];
    extra.name = "blk.0.mystery.weight";
    tensor(&w, &extra, (uint32_t)extra.type);
    gw_write(&w, p, 2); /* version 2 reads the same */
    expect_error(p, 1, "unexpected tensor 'blk.0.mystery.weight'");
    rewrite counted = {NULL, 0, -1, 3, 0};
    write_variant(g, p, &counted);
    expect_error(p, 0, "split.count is 3 but the file name says 1 file");
    sl_gguf_close(g);
    remove(p);
    free(p);
    rmdir(dir);
    free(dir);
}

/* The fixtures' own tokenizer: 256 byte tokens, ChatML specials, a template. */
Test(gguf_tokenizer, fixture_metadata) {
    char *p = tu_fixture(FIXTURE);
    sl_tokenizer *t;
    sl_err e;
    cr_assert_eq(sl_tokenizer_load(p, &t, &e), 0, "%s", e.msg);
    cr_expect_eq(sl_tokenizer_vocab_size(t), 320);
    const char *text = "<|im_start|>user\nhi é<|im_end|>";
    int32_t *ids;
    int n;
    cr_assert_eq(sl_tokenizer_encode(t, text, strlen(text), 1, &ids, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(n, 12, "10 byte tokens plus two specials: got %d ids", n);
    cr_expect(sl_tokenizer_is_special(t, ids[0]) && sl_tokenizer_is_special(t, ids[n - 1]));
    const int32_t *eos;
    cr_assert_eq(sl_tokenizer_eos_ids(t, &eos), 1);
    cr_expect_eq(eos[0], 258);
    cr_expect_eq(ids[n - 1], 258);
    char *back;
    size_t bl;
    cr_assert_eq(sl_tokenizer_decode(t, ids, n, 0, &back, &bl, &e), 0);
    cr_expect_str_eq(back, text);
    cr_assert(sl_tokenizer_chat_template(t));
    cr_expect(strstr(sl_tokenizer_chat_template(t), "<|im_start|>"));
    free(back);
    free(ids);
    sl_tokenizer_free(t);
    free(p);
}

/* A GGUF holding only the tokenizer metadata llama.cpp's converter writes for a tokenizer.json. */
static char *gguf_from_tokenizer_json(const char *name, const char *pre, const char *dir) {
    char *src = tu_fixture("tokenizers");
    char cmd[2048], json_path[1024];
    snprintf(json_path, sizeof json_path, "%s/%s.json", dir, name);
    snprintf(cmd, sizeof cmd, "xz -dc '%s/%s/tokenizer.json.xz' > '%s'", src, name, json_path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(src);
    json_error_t je;
    json_t *root = json_load_file(json_path, 0, &je);
    cr_assert(root, "%s", je.text);
    remove(json_path);
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    json_t *added = json_object_get(root, "added_tokens");
    int n = 0;
    const char *k;
    json_t *v;
    size_t i;
    json_object_foreach(vocab, k, v) if ((int)json_integer_value(v) >= n) n = (int)json_integer_value(v) + 1;
    json_array_foreach(added, i, v) {
        int id = (int)json_integer_value(json_object_get(v, "id"));
        if (id >= n) n = id + 1;
    }
    char **toks = calloc((size_t)n, sizeof *toks);
    int32_t *types = calloc((size_t)n, sizeof *types);
    json_object_foreach(vocab, k, v) {
        toks[json_integer_value(v)] = strdup(k);
        types[json_integer_value(v)] = 1;
    }
    json_array_foreach(added, i, v) {
        int id = (int)json_integer_value(json_object_get(v, "id"));
        free(toks[id]);
        toks[id] = strdup(json_string_value(json_object_get(v, "content")));
        types[id] = json_is_true(json_object_get(v, "special")) ? 3 : 4;
    }
    for (int id = 0; id < n; id++)
        if (!toks[id]) {
            char b[32];
            snprintf(b, sizeof b, "[PAD%d]", id);
            toks[id] = strdup(b);
            types[id] = 5;
        }
    int nm = (int)json_array_size(merges);
    char **ms = calloc((size_t)nm + 1, sizeof *ms);
    json_array_foreach(merges, i, v) {
        if (json_is_string(v)) {
            ms[i] = strdup(json_string_value(v));
        } else {
            const char *a = json_string_value(json_array_get(v, 0)), *b = json_string_value(json_array_get(v, 1));
            ms[i] = malloc(strlen(a) + strlen(b) + 2);
            sprintf(ms[i], "%s %s", a, b);
        }
    }
    gw g = {.align = 32};
    kv_str(&g, "general.architecture", "llama");
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", pre);
    kv_strs(&g, "tokenizer.ggml.tokens", n, toks);
    kv_i32s(&g, "tokenizer.ggml.token_type", n, types);
    kv_strs(&g, "tokenizer.ggml.merges", nm, ms);
    char *out = tmp_path(dir, name);
    gw_write(&g, out, 3);
    for (int id = 0; id < n; id++) free(toks[id]);
    for (int m = 0; m < nm; m++) free(ms[m]);
    free(toks), free(types), free(ms);
    json_decref(root);
    return out;
}

/* Same ids as the tokenizer.json the metadata came from, on every text of the tokenizer fixtures. */
static void check_tokenizer(const char *name, const char *pre) {
    char *dir = tu_tmpdir();
    char *path = gguf_from_tokenizer_json(name, pre, dir);
    sl_tokenizer *t;
    sl_err e;
    cr_assert_eq(sl_gguf_tokenizer_load(path, &t, &e), 0, "%s", e.msg);
    char *exp_path = tu_fixture("tokenizers/expected.json");
    json_error_t je;
    json_t *ex = json_load_file(exp_path, 0, &je);
    cr_assert(ex, "%s", je.text);
    json_t *texts = json_object_get(json_object_get(ex, name), "texts"), *it;
    size_t i;
    int checked = 0;
    json_array_foreach(texts, i, it) {
        const char *text = json_string_value(json_object_get(it, "text"));
        json_t *want = json_object_get(it, "ids");
        int32_t *ids;
        int n;
        cr_assert_eq(sl_tokenizer_encode(t, text, strlen(text), 0, &ids, &n, &e), 0, "%s", e.msg);
        int same = n == (int)json_array_size(want);
        for (int k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, (size_t)k));
        cr_expect(same, "%s: text %zu '%s' encodes differently from tokenizer.json", name, i, text);
        checked++;
        free(ids);
    }
    cr_expect_gt(checked, 5);
    json_decref(ex);
    free(exp_path);
    sl_tokenizer_free(t);
    remove(path);
    free(path);
    rmdir(dir);
    free(dir);
}

Test(gguf_tokenizer, qwen3_vocab_matches_tokenizer_json) {
    check_tokenizer("qwen3", "qwen2");
}

Test(gguf_tokenizer, llama3_vocab_matches_tokenizer_json) {
    check_tokenizer("llama3", "llama-bpe");
}

Test(gguf_tokenizer, errors) {
    char *dir = tu_tmpdir();
    char *p = tmp_path(dir, "tok.gguf");
    char *toks[] = {"a", "b", "ab"};
    int32_t types[] = {1, 1, 9};
    gw g = {.align = 32};
    kv_str(&g, "tokenizer.ggml.model", "bert");
    gw_write(&g, p, 3);
    sl_tokenizer *t;
    sl_err e;
    cr_expect_neq(sl_gguf_tokenizer_load(p, &t, &e), 0);
    cr_expect(strstr(e.msg, "tokenizer.ggml.model 'bert' is not supported (expected gpt2"), "%s", e.msg);
    g = (gw){.align = 32};
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "mystery");
    gw_write(&g, p, 3);
    cr_expect_neq(sl_gguf_tokenizer_load(p, &t, &e), 0);
    cr_expect(strstr(e.msg, "tokenizer.ggml.pre 'mystery' is not a known pre-tokenizer"), "%s", e.msg);
    cr_expect(strstr(e.msg, "deepseek-llm"), "the known names are listed: %s", e.msg);
    g = (gw){.align = 32};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", 3, toks);
    gw_write(&g, p, 3);
    cr_expect_neq(sl_gguf_tokenizer_load(p, &t, &e), 0);
    cr_expect(strstr(e.msg, "missing metadata key 'tokenizer.ggml.scores'"), "%s", e.msg);
    g = (gw){.align = 32};
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_strs(&g, "tokenizer.ggml.tokens", 3, toks);
    kv_i32s(&g, "tokenizer.ggml.token_type", 3, types);
    gw_write(&g, p, 3);
    cr_expect_neq(sl_gguf_tokenizer_load(p, &t, &e), 0);
    cr_expect(strstr(e.msg, "token 2 has type 9 (expected 1 to 6)"), "%s", e.msg);
    g = (gw){.align = 32};
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    gw_write(&g, p, 3);
    cr_expect_neq(sl_gguf_tokenizer_load(p, &t, &e), 0);
    cr_expect(strstr(e.msg, "missing metadata key 'tokenizer.ggml.tokens'"), "%s", e.msg);
    remove(p);
    free(p);
    rmdir(dir);
    free(dir);
}

/* rope_freqs divides each rotary frequency (Llama 3 style scaling): all ones changes nothing, other values
 * change the logits, zeros are refused. */
Test(gguf_reader, rope_freqs) {
    sl_gguf *g = open_fixture();
    char *dir = tu_tmpdir();
    char *p = tmp_path(dir, "rope.gguf");
    char *orig = tu_fixture(FIXTURE);
    int V;
    float *base = logits_of(orig, &V);
    float f[32];
    const float vals[] = {1.0f, 4.0f, 0.0f};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 32; i++) f[i] = i < 16 ? 1.0f : vals[k];
        gw w = {.align = 32};
        for (int i = 0; i < g->n_kv; i++) kv_copy(&w, &g->kv[i]);
        for (int i = 0; i < g->n_tensors; i++) tensor(&w, &g->tensors[i], (uint32_t)g->tensors[i].type);
        sl_gguf_tensor rf = {
            .name = "rope_freqs.weight", .ndim = 1, .ne = {32, 1, 1, 1}, .data = (uint8_t *)f, .nbytes = sizeof f};
        tensor(&w, &rf, 0);
        gw_write(&w, p, 3);
        if (k == 2) {
            expect_error(p, 1, "tensor 'rope_freqs.weight' element 16 is 0 (expected a positive divisor)");
            continue;
        }
        float *got = logits_of(p, &V);
        int same = !memcmp(got, base, sizeof *got * 6 * (size_t)V);
        cr_expect_eq(same, k == 0, "rope_freqs %g: logits %s", (double)vals[k], same ? "unchanged" : "changed");
        free(got);
    }
    sl_gguf_close(g);
    remove(p);
    free(p), free(base), free(orig);
    rmdir(dir);
    free(dir);
}

/* Qwen3.5's pattern differs from Qwen2's only by keeping combining marks inside words, which no merge of
 * the Qwen3 vocabulary crosses: on that vocabulary it must give tokenizer.json's ids too. */
Test(gguf_tokenizer, qwen35_pre_tokenizer_on_qwen3_vocab) {
    check_tokenizer("qwen3", "qwen35");
}

/* ---- the library's writer (synthetic benchmark checkpoints) ---- */

static void fill_pattern(void *ctx, const sl_gguf_wtensor *t, uint64_t off, uint8_t *buf, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)((off + i) * 7u + (uint64_t)t->kind);
}

Test(gguf_writer, round_trip_and_errors) {
    char dir[] = "/tmp/sluice-gguf-w-XXXXXX";
    cr_assert(mkdtemp(dir));
    char *path = tmp_path(dir, "w.gguf");
    const int32_t arr[3] = {11, -2, 7};
    sl_gguf_wkv kv[] = {
        {.key = "general.architecture", .type = SL_GGUF_STRING, .s = "llama"},
        {.key = "a.u32", .type = SL_GGUF_U32, .i = 4096},
        {.key = "a.u64", .type = SL_GGUF_U64, .i = 1ll << 40},
        {.key = "a.f32", .type = SL_GGUF_F32, .f = 0.25},
        {.key = "a.bool", .type = SL_GGUF_BOOL, .i = 1},
        {.key = "a.arr", .type = SL_GGUF_ARRAY, .arr = arr, .n = 3},
    };
    sl_gguf_wtensor t[3] = {
        {.name = "q4k", .type = 12, .ndim = 3, .ne = {512, 3, 2}, .kind = 1},
        {.name = "f32", .type = 0, .ndim = 1, .ne = {5}, .kind = 2},
        {.name = "q8", .type = 8, .ndim = 2, .ne = {64, 3}, .kind = 3},
    };
    sl_err e;
    cr_assert_eq(sl_gguf_write(path, kv, 6, t, 3, fill_pattern, NULL, NULL, &e), 0, "%s", e.msg);
    sl_gguf *g;
    cr_assert_eq(sl_gguf_open(path, &g, &e), 0, "%s", e.msg);
    int64_t v;
    double f;
    int b;
    const sl_gguf_kv *a;
    cr_expect_eq(sl_gguf_get_int(g, "a.u32", &v, &e), 0);
    cr_expect_eq(v, 4096);
    cr_expect_eq(sl_gguf_get_int(g, "a.u64", &v, &e), 0);
    cr_expect_eq(v, 1ll << 40);
    cr_expect_eq(sl_gguf_get_float(g, "a.f32", &f, &e), 0);
    cr_expect_eq(f, 0.25);
    cr_expect_eq(sl_gguf_get_bool(g, "a.bool", &b, &e), 0);
    cr_expect_eq(b, 1);
    cr_assert_eq(sl_gguf_get_array(g, "a.arr", SL_GGUF_I64, &a, &e), 0, "%s", e.msg);
    cr_expect(a->n == 3 && sl_gguf_array_int(a, 1) == -2 && sl_gguf_array_int(a, 2) == 7);
    cr_assert_eq(g->n_tensors, 3);
    const uint64_t sizes[3] = {2 * 3 * 2 * 144, 20, 3 * 2 * 34};
    for (int i = 0; i < 3; i++) {
        const sl_gguf_tensor *r = sl_gguf_find_tensor(g, t[i].name);
        cr_assert(r, "%s", t[i].name);
        cr_expect_eq(r->type, t[i].type);
        cr_expect_eq(r->ndim, t[i].ndim);
        cr_expect_eq(r->nbytes, sizes[i], "%s: %llu bytes", t[i].name, (unsigned long long)r->nbytes);
        cr_expect_eq(sl_gguf_wtensor_bytes(&t[i]), sizes[i]);
        for (uint64_t k = 0; k < r->nbytes; k++)
            cr_assert_eq(r->data[k], (uint8_t)(k * 7u + (uint64_t)t[i].kind), "%s byte %llu", t[i].name,
                         (unsigned long long)k);
    }
    sl_gguf_close(g);
    /* rows that are not whole blocks name the tensor; an unwritable path names the file */
    sl_gguf_wtensor bad = {.name = "blk.0.odd", .type = 12, .ndim = 2, .ne = {100, 2}};
    cr_assert_eq(sl_gguf_write(path, kv, 1, &bad, 1, fill_pattern, NULL, NULL, &e), -1);
    cr_expect(strstr(e.msg, "blk.0.odd") && strstr(e.msg, "Q4_K"), "%s", e.msg);
    char *nope = tmp_path(dir, "no/such/dir.gguf");
    cr_assert_eq(sl_gguf_write(nope, kv, 1, t, 1, fill_pattern, NULL, NULL, &e), -1);
    cr_expect(strstr(e.msg, nope), "%s", e.msg);
    unlink(path);
    rmdir(dir);
    free(nope);
    free(path);
}
