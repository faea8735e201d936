#include "formats/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/ggml_types.h"

#define MAX_ARRAY_DEPTH 8
#define MAX_SPLITS 9999

/* A bounded read position in one file's mapping; every read checks the bound first. */
typedef struct cursor {
    const uint8_t *p, *end;
    const char *path;
} cursor;

static int need(cursor *c, uint64_t n, const char *what, sl_err *e) {
    if ((uint64_t)(c->end - c->p) < n) return sl_fail(e, "%s: truncated file while reading %s", c->path, what);
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what, sl_err *e) {
    if (need(c, 4, what, e)) return -1;
    memcpy(v, c->p, 4);
    c->p += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what, sl_err *e) {
    if (need(c, 8, what, e)) return -1;
    memcpy(v, c->p, 8);
    c->p += 8;
    return 0;
}

static int rd_str(cursor *c, sl_gguf_str *s, const char *what, sl_err *e) {
    uint64_t n;
    if (rd_u64(c, &n, what, e) || need(c, n, what, e)) return -1;
    s->s = (const char *)c->p;
    s->len = n;
    c->p += n;
    return 0;
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case SL_GGUF_U8:
    case SL_GGUF_I8:
    case SL_GGUF_BOOL: return 1;
    case SL_GGUF_U16:
    case SL_GGUF_I16: return 2;
    case SL_GGUF_U32:
    case SL_GGUF_I32:
    case SL_GGUF_F32: return 4;
    case SL_GGUF_U64:
    case SL_GGUF_I64:
    case SL_GGUF_F64: return 8;
    default: return 0;
    }
}

const char *sl_gguf_vtype_name(sl_gguf_vtype t) {
    static const char *const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* Skips one value of type t (validating it); depth bounds nested arrays. */
static int skip_value(cursor *c, uint32_t t, const char *key, int depth, sl_err *e) {
    size_t sz = scalar_size(t);
    if (sz) return need(c, sz, key, e) ? -1 : (c->p += sz, 0);
    if (t == SL_GGUF_STRING) {
        sl_gguf_str s;
        return rd_str(c, &s, key, e);
    }
    if (t != SL_GGUF_ARRAY)
        return sl_fail(e, "%s: metadata key '%s' has unknown value type %u (expected 0-12)", c->path, key, t);
    if (depth >= MAX_ARRAY_DEPTH)
        return sl_fail(e, "%s: metadata key '%s' nests arrays deeper than %d", c->path, key, MAX_ARRAY_DEPTH);
    uint32_t et;
    uint64_t n;
    if (rd_u32(c, &et, key, e) || rd_u64(c, &n, key, e)) return -1;
    size_t es = scalar_size(et);
    if (es) {
        if (n > (uint64_t)(c->end - c->p) / es) return sl_fail(e, "%s: truncated file while reading %s", c->path, key);
        c->p += n * es;
        return 0;
    }
    for (uint64_t i = 0; i < n; i++)
        if (skip_value(c, et, key, depth + 1, e)) return -1;
    return 0;
}

static int parse_kv(cursor *c, sl_gguf_kv *kv, sl_err *e) {
    sl_gguf_str k;
    uint32_t t;
    if (rd_str(c, &k, "a metadata key", e)) return -1;
    kv->key = strndup(k.s, k.len);
    if (!kv->key) return sl_fail(e, "out of memory");
    if (rd_u32(c, &t, kv->key, e)) return -1;
    kv->type = (sl_gguf_vtype)t;
    kv->n = 1;
    if (t == SL_GGUF_STRING) {
        kv->strs = malloc(sizeof *kv->strs);
        if (!kv->strs) return sl_fail(e, "out of memory");
        return rd_str(c, kv->strs, kv->key, e);
    }
    if (t != SL_GGUF_ARRAY) {
        kv->raw = c->p;
        return skip_value(c, t, kv->key, 0, e);
    }
    uint32_t et;
    if (rd_u32(c, &et, kv->key, e) || rd_u64(c, &kv->n, kv->key, e)) return -1;
    kv->elem = (sl_gguf_vtype)et;
    kv->raw = c->p;
    if (et == SL_GGUF_STRING) {
        /* each string takes at least its 8-byte length, which bounds the allocation */
        if (kv->n > (uint64_t)(c->end - c->p) / 8)
            return sl_fail(e, "%s: truncated file while reading %s", c->path, kv->key);
        kv->strs = malloc(sizeof *kv->strs * (size_t)(kv->n ? kv->n : 1));
        if (!kv->strs) return sl_fail(e, "out of memory");
        for (uint64_t i = 0; i < kv->n; i++)
            if (rd_str(c, &kv->strs[i], kv->key, e)) return -1;
        return 0;
    }
    c->p -= 12; /* re-read the array header through the generic validator */
    return skip_value(c, SL_GGUF_ARRAY, kv->key, 0, e);
}

static int parse_tensor_info(cursor *c, sl_gguf_tensor *t, sl_err *e) {
    sl_gguf_str name;
    uint32_t nd, type;
    if (rd_str(c, &name, "a tensor name", e)) return -1;
    t->name = strndup(name.s, name.len);
    if (!t->name) return sl_fail(e, "out of memory");
    if (rd_u32(c, &nd, t->name, e)) return -1;
    if (nd < 1 || nd > SL_GGUF_MAX_DIMS)
        return sl_fail(e, "%s: tensor '%s' has %u dimensions (expected 1 to %d)", c->path, t->name, nd,
                       SL_GGUF_MAX_DIMS);
    t->ndim = (int)nd;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d;
        if (rd_u64(c, &d, t->name, e)) return -1;
        if (d == 0 || d > (uint64_t)INT32_MAX)
            return sl_fail(e, "%s: tensor '%s' dimension %d is %llu (expected 1 to %d)", c->path, t->name, i,
                           (unsigned long long)d, INT32_MAX);
        t->ne[i] = (int64_t)d;
    }
    for (int i = t->ndim; i < SL_GGUF_MAX_DIMS; i++) t->ne[i] = 1;
    if (rd_u32(c, &type, t->name, e) || rd_u64(c, &t->offset, t->name, e)) return -1;
    t->type = (int)type;
    if (!sl_ggml_type_name(t->type))
        return sl_fail(e, "%s: tensor '%s' has unknown GGML type %u", c->path, t->name, type);
    int bs = sl_ggml_block_size(t->type);
    if (t->ne[0] % bs)
        return sl_fail(e, "%s: tensor '%s' (%s) has %lld columns, not a multiple of the block size %d", c->path,
                       t->name, sl_ggml_type_name(t->type), (long long)t->ne[0], bs);
    uint64_t rows = 1, rb = sl_ggml_row_bytes(t->type, t->ne[0]);
    for (int i = 1; i < t->ndim; i++) {
        if (rows > (UINT64_MAX >> 2) / (uint64_t)t->ne[i])
            return sl_fail(e, "%s: tensor '%s' is too large", c->path, t->name);
        rows *= (uint64_t)t->ne[i];
    }
    if (rows > (UINT64_MAX >> 2) / rb) return sl_fail(e, "%s: tensor '%s' is too large", c->path, t->name);
    t->nbytes = rows * rb;
    return 0;
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const sl_gguf_tensor *x = *(sl_gguf_tensor *const *)a, *y = *(sl_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(sl_gguf_tensor *const *)a)->name, (*(sl_gguf_tensor *const *)b)->name);
}

/* Parses one file of a set: header, metadata (kept only for the first file), tensor infos, data offsets. */
static int parse_file(sl_gguf *g, int fi, sl_err *e) {
    const char *path = g->paths[fi];
    cursor c = {g->maps[fi], g->maps[fi] + g->map_sizes[fi], path};
    if (g->map_sizes[fi] < 4 || memcmp(c.p, "GGUF", 4))
        return sl_fail(e, "%s: not a GGUF file (bad magic; expected the bytes 'GGUF')", path);
    c.p += 4;
    uint32_t ver;
    uint64_t nt, nkv;
    if (rd_u32(&c, &ver, "the header", e)) return -1;
    if (ver != 2 && ver != 3) {
        if (ver == 1) return sl_fail(e, "%s: GGUF version 1 is not supported (expected version 2 or 3)", path);
        return sl_fail(e, "%s: unsupported GGUF version %u (expected 2 or 3%s)", path, ver,
                       (ver >> 24) ? "; a big-endian file?" : "");
    }
    if (rd_u64(&c, &nt, "the header", e) || rd_u64(&c, &nkv, "the header", e)) return -1;
    size_t left = (size_t)(c.end - c.p);
    if (nkv > left / 13 || nt > left / 24)
        return sl_fail(e,
                       "%s: truncated file: the header claims %llu metadata keys and %llu tensors, more than the "
                       "remaining %zu bytes can hold",
                       path, (unsigned long long)nkv, (unsigned long long)nt, left);
    if (fi == 0) g->version = (int)ver;

    sl_gguf_kv *kvs = calloc((size_t)nkv + 1, sizeof *kvs);
    if (!kvs) return sl_fail(e, "out of memory");
    int rc = 0;
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < nkv && !rc; i++) {
        rc = parse_kv(&c, &kvs[i], e);
        if (!rc && !strcmp(kvs[i].key, "general.alignment")) {
            if (kvs[i].type != SL_GGUF_U32)
                rc = sl_fail(e, "%s: metadata key 'general.alignment' is %s, expected u32", path,
                             sl_gguf_vtype_name(kvs[i].type));
            else {
                uint32_t a;
                memcpy(&a, kvs[i].raw, 4);
                alignment = a;
                if (a == 0 || (a & (a - 1)))
                    rc = sl_fail(e, "%s: general.alignment is %u (expected a power of two)", path, a);
            }
        }
    }
    if (fi == 0) {
        g->kv = kvs;
        g->n_kv = (int)nkv;
        g->alignment = (uint32_t)alignment;
    } else {
        for (uint64_t i = 0; i < nkv; i++) free(kvs[i].key), free(kvs[i].strs);
        free(kvs);
    }
    if (rc) return -1;

    sl_gguf_tensor *nt_arr = realloc(g->tensors, sizeof *g->tensors * ((size_t)g->n_tensors + (size_t)nt + 1));
    if (!nt_arr) return sl_fail(e, "out of memory");
    g->tensors = nt_arr;
    sl_gguf_tensor *first = g->tensors + g->n_tensors;
    memset(first, 0, sizeof *first * ((size_t)nt + 1));
    for (uint64_t i = 0; i < nt; i++) {
        first[i].file = fi;
        g->n_tensors++; /* counted before parsing so a partly read name is freed */
        if (parse_tensor_info(&c, &first[i], e)) return -1;
    }
    uint64_t pos = (uint64_t)(c.p - g->maps[fi]);
    uint64_t data0 = (pos + alignment - 1) / alignment * alignment;
    uint64_t fsize = g->map_sizes[fi];
    if (data0 > fsize && nt) return sl_fail(e, "%s: truncated file: tensor data would start past its end", path);
    sl_gguf_tensor **by_off = malloc(sizeof *by_off * ((size_t)nt + 1));
    if (!by_off) return sl_fail(e, "out of memory");
    for (uint64_t i = 0; i < nt; i++) {
        sl_gguf_tensor *t = &first[i];
        by_off[i] = t;
        if (t->offset % alignment) {
            free(by_off);
            return sl_fail(e, "%s: tensor '%s' data offset %llu is not a multiple of the alignment %llu", path, t->name,
                           (unsigned long long)t->offset, (unsigned long long)alignment);
        }
        if (t->offset > fsize - data0 || t->nbytes > fsize - data0 - t->offset) {
            free(by_off);
            return sl_fail(e, "%s: tensor '%s' (%llu bytes at data offset %llu) extends past the end of the file", path,
                           t->name, (unsigned long long)t->nbytes, (unsigned long long)t->offset);
        }
        t->offset += data0;
        t->data = g->maps[fi] + t->offset;
    }
    qsort(by_off, (size_t)nt, sizeof *by_off, cmp_tensor_offset);
    for (uint64_t i = 1; i < nt; i++)
        if (by_off[i - 1]->offset + by_off[i - 1]->nbytes > by_off[i]->offset) {
            sl_fail(e, "%s: tensors '%s' and '%s' overlap", path, by_off[i - 1]->name, by_off[i]->name);
            free(by_off);
            return -1;
        }
    free(by_off);
    return 0;
}

static int map_file(sl_gguf *g, const char *path, sl_err *e) {
    int i = g->n_files;
    g->paths[i] = strdup(path);
    if (!g->paths[i]) return sl_fail(e, "out of memory");
    g->n_files++;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return sl_fail(e, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return sl_fail(e, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return sl_fail(e, "%s: empty file (expected a GGUF file)", path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return sl_fail(e, "%s: mmap failed: %s", path, strerror(errno));
    g->maps[i] = m;
    g->map_sizes[i] = (size_t)st.st_size;
    return 0;
}

int sl_gguf_is_path(const char *path) {
    size_t n = strlen(path);
    return n > 5 && !strcasecmp(path + n - 5, ".gguf");
}

/* Recognises "PREFIX-%05d-of-%05d.gguf": *index and *count, and the prefix length. 0 when it matches. */
static int split_name(const char *path, int *index, int *count, size_t *prefix) {
    size_t n = strlen(path);
    const char *tail = "-00000-of-00000.gguf";
    size_t tl = strlen(tail);
    if (n <= tl) return -1;
    const char *s = path + n - tl;
    for (size_t i = 0; i < tl; i++) {
        int digit = tail[i] == '0';
        if (digit ? (s[i] < '0' || s[i] > '9') : s[i] != tail[i]) return -1;
    }
    *index = atoi(s + 1);
    *count = atoi(s + 10);
    *prefix = n - tl;
    return 0;
}

int sl_gguf_open(const char *path, sl_gguf **out, sl_err *e) {
    *out = NULL;
    sl_gguf *g = calloc(1, sizeof *g);
    if (!g) return sl_fail(e, "out of memory");
    int idx = 1, count = 1;
    size_t prefix = 0;
    int is_split = split_name(path, &idx, &count, &prefix) == 0;
    if (is_split && (idx < 1 || count < 1 || idx > count || count > MAX_SPLITS)) {
        sl_fail(e, "%s: split number %d of %d is not valid", path, idx, count);
        goto fail;
    }
    if (is_split && idx != 1) {
        sl_fail(e, "%s: this is split %d of %d; open the first split (-00001-of-%05d.gguf)", path, idx, count, count);
        goto fail;
    }
    int nfiles = is_split ? count : 1;
    g->paths = calloc((size_t)nfiles, sizeof *g->paths);
    g->maps = calloc((size_t)nfiles, sizeof *g->maps);
    g->map_sizes = calloc((size_t)nfiles, sizeof *g->map_sizes);
    if (!g->paths || !g->maps || !g->map_sizes) {
        sl_fail(e, "out of memory");
        goto fail;
    }
    if (map_file(g, path, e) || parse_file(g, 0, e)) goto fail;
    int64_t declared = 1;
    if (sl_gguf_get_int(g, "split.count", &declared, e) < 0) goto fail;
    if (declared != nfiles) {
        sl_fail(e, "%s: split.count is %lld but the file name says %d file%s", path, (long long)declared, nfiles,
                nfiles == 1 ? "" : "s");
        goto fail;
    }
    for (int i = 2; i <= nfiles; i++) {
        char *p = malloc(prefix + 32);
        if (!p) {
            sl_fail(e, "out of memory");
            goto fail;
        }
        snprintf(p, prefix + 32, "%.*s-%05d-of-%05d.gguf", (int)prefix, path, i, nfiles);
        if (access(p, F_OK)) {
            sl_fail(e, "%s: split %d of %d is missing (expected %s)", path, i, nfiles, p);
            free(p);
            goto fail;
        }
        int rc = map_file(g, p, e);
        free(p);
        if (rc || parse_file(g, i - 1, e)) goto fail;
    }
    /* names must be unique across the whole set */
    const sl_gguf_tensor **by_name = malloc(sizeof *by_name * ((size_t)g->n_tensors + 1));
    if (!by_name) {
        sl_fail(e, "out of memory");
        goto fail;
    }
    for (int i = 0; i < g->n_tensors; i++) by_name[i] = &g->tensors[i];
    qsort(by_name, (size_t)g->n_tensors, sizeof *by_name, cmp_tensor_name);
    for (int i = 1; i < g->n_tensors; i++)
        if (!strcmp(by_name[i - 1]->name, by_name[i]->name)) {
            sl_fail(e, "%s: tensor '%s' appears twice", g->paths[by_name[i]->file], by_name[i]->name);
            free(by_name);
            goto fail;
        }
    free(by_name);
    *out = g;
    return 0;
fail:
    sl_gguf_close(g);
    return -1;
}

void sl_gguf_close(sl_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_kv; i++) free(g->kv[i].key), free(g->kv[i].strs);
    free(g->kv);
    for (int i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->tensors);
    for (int i = 0; i < g->n_files; i++) {
        if (g->maps && g->maps[i]) munmap(g->maps[i], g->map_sizes[i]);
        free(g->paths[i]);
    }
    free(g->paths);
    free(g->maps);
    free(g->map_sizes);
    free(g);
}

const sl_gguf_kv *sl_gguf_find(const sl_gguf *g, const char *key) {
    for (int i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const sl_gguf_tensor *sl_gguf_find_tensor(const sl_gguf *g, const char *name) {
    for (int i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static int is_int_type(sl_gguf_vtype t) {
    return t == SL_GGUF_U8 || t == SL_GGUF_I8 || t == SL_GGUF_U16 || t == SL_GGUF_I16 || t == SL_GGUF_U32 ||
           t == SL_GGUF_I32 || t == SL_GGUF_U64 || t == SL_GGUF_I64;
}

/* Reads a scalar of type t at p as int64 (u64 above INT64_MAX saturates; callers range-check). */
static int64_t int_at(sl_gguf_vtype t, const uint8_t *p) {
    switch (t) {
    case SL_GGUF_U8: return p[0];
    case SL_GGUF_I8: return (int8_t)p[0];
    case SL_GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case SL_GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case SL_GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case SL_GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case SL_GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
    }
    case SL_GGUF_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    default: return 0;
    }
}

static double float_at(sl_gguf_vtype t, const uint8_t *p) {
    if (t == SL_GGUF_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    if (t == SL_GGUF_F64) {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    return (double)int_at(t, p);
}

static int wrong_type(const sl_gguf *g, const sl_gguf_kv *kv, const char *expected, sl_err *e) {
    int arr = kv->type == SL_GGUF_ARRAY;
    return sl_fail(e, "%s: metadata key '%s' is %s%s, expected %s", g->paths[0], kv->key, arr ? "an array of " : "",
                   sl_gguf_vtype_name(arr ? kv->elem : kv->type), expected);
}

int sl_gguf_get_int(const sl_gguf *g, const char *key, int64_t *out, sl_err *e) {
    const sl_gguf_kv *kv = sl_gguf_find(g, key);
    if (!kv) return 1;
    if (!is_int_type(kv->type)) return wrong_type(g, kv, "an integer", e);
    *out = int_at(kv->type, kv->raw);
    return 0;
}

int sl_gguf_get_float(const sl_gguf *g, const char *key, double *out, sl_err *e) {
    const sl_gguf_kv *kv = sl_gguf_find(g, key);
    if (!kv) return 1;
    if (!is_int_type(kv->type) && kv->type != SL_GGUF_F32 && kv->type != SL_GGUF_F64)
        return wrong_type(g, kv, "a number", e);
    *out = float_at(kv->type, kv->raw);
    return 0;
}

int sl_gguf_get_bool(const sl_gguf *g, const char *key, int *out, sl_err *e) {
    const sl_gguf_kv *kv = sl_gguf_find(g, key);
    if (!kv) return 1;
    if (kv->type != SL_GGUF_BOOL) return wrong_type(g, kv, "a bool", e);
    *out = kv->raw[0] != 0;
    return 0;
}

int sl_gguf_get_str(const sl_gguf *g, const char *key, sl_gguf_str *out, sl_err *e) {
    const sl_gguf_kv *kv = sl_gguf_find(g, key);
    if (!kv) return 1;
    if (kv->type != SL_GGUF_STRING) return wrong_type(g, kv, "a string", e);
    *out = kv->strs[0];
    return 0;
}

int sl_gguf_get_array(const sl_gguf *g, const char *key, sl_gguf_vtype elem, const sl_gguf_kv **out, sl_err *e) {
    const sl_gguf_kv *kv = sl_gguf_find(g, key);
    if (!kv) return 1;
    int ok = kv->type == SL_GGUF_ARRAY &&
             (elem == SL_GGUF_I64   ? is_int_type(kv->elem)
              : elem == SL_GGUF_F64 ? (is_int_type(kv->elem) || kv->elem == SL_GGUF_F32 || kv->elem == SL_GGUF_F64)
                                    : kv->elem == elem);
    if (!ok) {
        char want[64];
        snprintf(want, sizeof want, "an array of %s",
                 elem == SL_GGUF_I64   ? "integers"
                 : elem == SL_GGUF_F64 ? "numbers"
                                       : sl_gguf_vtype_name(elem));
        return wrong_type(g, kv, want, e);
    }
    *out = kv;
    return 0;
}

int64_t sl_gguf_array_int(const sl_gguf_kv *kv, uint64_t i) {
    return int_at(kv->elem, kv->raw + i * scalar_size(kv->elem));
}

double sl_gguf_array_float(const sl_gguf_kv *kv, uint64_t i) {
    return float_at(kv->elem, kv->raw + i * scalar_size(kv->elem));
}
