#include "formats/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"

/* A header larger than this is not a real checkpoint (the format's own reference caps it at 100 MB). */
#define MAX_HEADER (100u << 20)

static const struct {
    const char *name;
    sl_st_dtype dt;
    size_t size;
} dtypes[] = {
    {"F32", SL_ST_F32, 4},   {"F16", SL_ST_F16, 2},         {"BF16", SL_ST_BF16, 2},       {"F64", SL_ST_F64, 8},
    {"U32", SL_ST_U32, 4},   {"I32", SL_ST_I32, 4},         {"U16", SL_ST_U16, 2},         {"I16", SL_ST_I16, 2},
    {"U8", SL_ST_U8, 1},     {"I8", SL_ST_I8, 1},           {"I64", SL_ST_I64, 8},         {"U64", SL_ST_U64, 8},
    {"BOOL", SL_ST_BOOL, 1}, {"F8_E4M3", SL_ST_F8_E4M3, 1}, {"F8_E5M2", SL_ST_F8_E5M2, 1}, {"GGML", SL_ST_GGML, 0},
};

const char *sl_st_dtype_name(sl_st_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dt == d) return dtypes[i].name;
    return "?";
}

size_t sl_st_dtype_size(sl_st_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dt == d) return dtypes[i].size;
    return 0;
}

int64_t sl_st_numel(const sl_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const sl_st_tensor *)a)->name, ((const sl_st_tensor *)b)->name);
}

static int cmp_offset(const void *a, const void *b) {
    const sl_st_tensor *x = *(const sl_st_tensor *const *)a, *y = *(const sl_st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int parse_entry(const char *path, const char *name, json_t *v, uint64_t data_size, uint64_t data_start,
                       sl_st_tensor *t, sl_err *e) {
    if (!json_is_object(v)) return sl_fail(e, "%s: tensor '%s': header entry is not an object", path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd)) return sl_fail(e, "%s: tensor '%s': missing string field 'dtype'", path, name);
    size_t i, n = sizeof dtypes / sizeof dtypes[0];
    for (i = 0; i < n; i++)
        if (dtypes[i].size && !strcmp(dtypes[i].name, json_string_value(jd))) break; /* GGML: GGUF only */
    if (i == n)
        return sl_fail(e, "%s: tensor '%s': unknown dtype '%s' (expected one of F32, F16, BF16, U32, ...)", path, name,
                       json_string_value(jd));
    t->dtype = dtypes[i].dt;
    if (!json_is_array(js) || json_array_size(js) > SL_ST_MAX_DIMS)
        return sl_fail(e, "%s: tensor '%s': 'shape' must be an array of at most %d integers", path, name,
                       SL_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(js, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > (1LL << 40))
            return sl_fail(e, "%s: tensor '%s': shape[%d] is not a valid dimension", path, name, d);
        t->shape[d] = json_integer_value(x);
        if (t->shape[d] && numel > UINT64_MAX / (uint64_t)t->shape[d])
            return sl_fail(e, "%s: tensor '%s': shape overflows", path, name);
        numel *= (uint64_t)t->shape[d];
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return sl_fail(e, "%s: tensor '%s': 'data_offsets' must be [begin, end]", path, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), en = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || en < b || (uint64_t)en > data_size)
        return sl_fail(e, "%s: tensor '%s': data_offsets [%lld, %lld] outside the %llu-byte data section", path, name,
                       (long long)b, (long long)en, (unsigned long long)data_size);
    if (numel > UINT64_MAX / dtypes[i].size)
        return sl_fail(e, "%s: tensor '%s': shape x %s overflows", path, name, dtypes[i].name);
    uint64_t want = numel * dtypes[i].size;
    if ((uint64_t)(en - b) != want)
        return sl_fail(e, "%s: tensor '%s': holds %lld bytes but shape x %s needs %llu", path, name,
                       (long long)(en - b), dtypes[i].name, (unsigned long long)want);
    t->nbytes = want;
    t->offset = data_start + (uint64_t)b;
    t->name = strdup(name);
    return t->name ? 0 : sl_fail(e, "out of memory");
}

int sl_st_open_file(const char *path, sl_st_set **setp, sl_err *e) {
    sl_st_set *s = *setp;
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return sl_fail(e, "out of memory");
        *setp = s;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sl_fail(e, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return sl_fail(e, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return sl_fail(e, "%s: not a regular file (expected a safetensors checkpoint)", path);
    }
    uint64_t fsize = (uint64_t)st.st_size;
    if (fsize < 8) {
        close(fd);
        return sl_fail(e, "%s: file is %llu bytes, too short for a safetensors header", path,
                       (unsigned long long)fsize);
    }
    uint8_t *map = mmap(NULL, fsize, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return sl_fail(e, "%s: mmap failed: %s", path, strerror(errno));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | map[i];
    if (hlen > MAX_HEADER || hlen > fsize - 8) {
        munmap(map, fsize);
        return sl_fail(e, "%s: header length %llu exceeds the file size %llu (truncated or not safetensors)", path,
                       (unsigned long long)hlen, (unsigned long long)fsize);
    }
    json_error_t je;
    json_t *root = json_loadb((const char *)map + 8, hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        munmap(map, fsize);
        return root ? sl_fail(e, "%s: header is JSON but not an object", path)
                    : sl_fail(e, "%s: header is not valid JSON: %s", path, je.text);
    }
    /* Register the file first so sl_st_close releases the mapping on any later error. */
    int fi = s->n_files;
    char **np = realloc(s->paths, sizeof *np * (size_t)(fi + 1));
    if (np) s->paths = np;
    uint8_t **nm = realloc(s->maps, sizeof *nm * (size_t)(fi + 1));
    if (nm) s->maps = nm;
    size_t *ns = realloc(s->map_sizes, sizeof *ns * (size_t)(fi + 1));
    if (ns) s->map_sizes = ns;
    if (!np || !nm || !ns) {
        json_decref(root);
        munmap(map, fsize);
        return sl_fail(e, "out of memory");
    }
    s->paths[fi] = strdup(path);
    s->maps[fi] = map;
    s->map_sizes[fi] = fsize;
    s->n_files++;

    uint64_t data_start = 8 + hlen, data_size = fsize - data_start;
    size_t count = json_object_size(root);
    sl_st_tensor *nt = realloc(s->tensors, sizeof *nt * ((size_t)s->n_tensors + count));
    if (!nt) {
        json_decref(root);
        return sl_fail(e, "out of memory");
    }
    s->tensors = nt;
    int first = s->n_tensors;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        sl_st_tensor *t = &s->tensors[s->n_tensors];
        memset(t, 0, sizeof *t);
        if (parse_entry(path, key, val, data_size, data_start, t, e) != 0) {
            json_decref(root);
            return -1;
        }
        t->file = fi;
        t->data = map + t->offset;
        s->n_tensors++;
    }
    json_decref(root);

    /* No two tensors of this file may share bytes. Compare each with the furthest end so far, so an
     * empty tensor sorted in between cannot hide an overlap. */
    int nf = s->n_tensors - first;
    sl_st_tensor **byoff = malloc(sizeof *byoff * (size_t)(nf ? nf : 1));
    if (!byoff) return sl_fail(e, "out of memory");
    for (int i = 0; i < nf; i++) byoff[i] = &s->tensors[first + i];
    qsort(byoff, (size_t)nf, sizeof *byoff, cmp_offset);
    const sl_st_tensor *far = nf ? byoff[0] : NULL; /* the tensor reaching furthest so far */
    for (int i = 1; i < nf; i++) {
        if (byoff[i]->nbytes && far->offset + far->nbytes > byoff[i]->offset) {
            int r =
                sl_fail(e, "%s: tensors '%s' and '%s' overlap in the data section", path, far->name, byoff[i]->name);
            free(byoff);
            return r;
        }
        if (byoff[i]->offset + byoff[i]->nbytes > far->offset + far->nbytes) far = byoff[i];
    }
    free(byoff);
    qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, cmp_name);
    for (int i = 1; i < s->n_tensors; i++)
        if (!strcmp(s->tensors[i - 1].name, s->tensors[i].name))
            return sl_fail(e, "%s: tensor '%s' appears twice (also in %s)", path, s->tensors[i].name,
                           s->paths[s->tensors[i].file == fi ? s->tensors[i - 1].file : s->tensors[i].file]);
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* File names listed by an index's weight_map, de-duplicated. */
static int index_files(const char *dir, const char *index_path, char ***out, int *n, sl_err *e) {
    json_error_t je;
    json_t *root = json_load_file(index_path, 0, &je);
    if (!root) return sl_fail(e, "%s: invalid JSON at line %d: %s", index_path, je.line, je.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return sl_fail(e, "%s: missing object 'weight_map'", index_path);
    }
    char **files = calloc(json_object_size(wm) + 1, sizeof *files);
    if (!files) {
        json_decref(root);
        return sl_fail(e, "out of memory");
    }
    int k = 0;
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v) || strchr(json_string_value(v), '/')) {
            /* key belongs to root: format the message before releasing it */
            sl_fail(e, "%s: weight_map['%s'] must be a file name in %s", index_path, key, dir);
            for (int i = 0; i < k; i++) free(files[i]);
            free(files);
            json_decref(root);
            return -1;
        }
        int seen = 0;
        for (int i = 0; i < k && !seen; i++) seen = !strcmp(files[i], json_string_value(v));
        if (!seen) files[k++] = strdup(json_string_value(v));
    }
    json_decref(root);
    qsort(files, (size_t)k, sizeof *files, cmp_str);
    *out = files;
    *n = k;
    return 0;
}

int sl_st_open_dir(const char *dir, sl_st_set **out, sl_err *e) {
    char **files = NULL;
    int n = 0;
    char *index = sl_path_join(dir, "model.safetensors.index.json");
    if (sl_file_exists(index)) {
        if (index_files(dir, index, &files, &n, e) != 0) {
            free(index);
            return -1;
        }
    } else {
        DIR *d = opendir(dir);
        if (!d) {
            free(index);
            return sl_fail(e, "%s: cannot open directory: %s", dir, strerror(errno));
        }
        struct dirent *de;
        int cap = 0;
        while ((de = readdir(d))) {
            size_t L = strlen(de->d_name);
            if (L < 12 || strcmp(de->d_name + L - 12, ".safetensors")) continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                files = realloc(files, sizeof *files * (size_t)cap);
            }
            files[n++] = strdup(de->d_name);
        }
        closedir(d);
        if (n) qsort(files, (size_t)n, sizeof *files, cmp_str);
    }
    free(index);
    if (n == 0) {
        free(files);
        return sl_fail(e, "%s: no *.safetensors files (expected model.safetensors or shards)", dir);
    }
    sl_st_set *s = NULL;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        char *p = sl_path_join(dir, files[i]);
        rc = sl_st_open_file(p, &s, e);
        free(p);
    }
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    if (rc != 0) {
        sl_st_close(s);
        return -1;
    }
    *out = s;
    return 0;
}

void sl_st_close(sl_st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) {
        munmap(s->maps[i], s->map_sizes[i]);
        free(s->paths[i]);
    }
    for (int i = 0; i < s->n_tensors; i++) free(s->tensors[i].name), free(s->tensors[i].owned);
    free(s->paths);
    free(s->maps);
    free(s->map_sizes);
    free(s->tensors);
    free(s);
}

const sl_st_tensor *sl_st_find(const sl_st_set *s, const char *name) {
    int lo = 0, hi = s->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(s->tensors[mid].name, name);
        if (c == 0) return &s->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}
