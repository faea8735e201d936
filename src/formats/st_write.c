#include "formats/st_write.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"

#define CHUNK ((size_t)32 << 20)

uint64_t sl_st_wtensor_bytes(const sl_st_wtensor *t) {
    uint64_t n = sl_st_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

static int write_all(int fd, const void *p, size_t n, const char *path, sl_err *e) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return sl_fail(e, "%s: write failed: %s", path, w < 0 ? strerror(errno) : "no progress");
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The JSON header of tensors [a, b), padded with spaces to a multiple of 8 bytes as the format asks. */
static char *shard_header(const sl_st_wtensor *t, int a, int b, size_t *len) {
    json_t *h = json_object();
    uint64_t off = 0;
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    for (int i = a; i < b; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        uint64_t sz = sl_st_wtensor_bytes(&t[i]);
        json_object_set_new(h, t[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", sl_st_dtype_name(t[i].dtype), "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + sz)));
        off += sz;
    }
    char *s = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!s) return NULL;
    size_t n = strlen(s), padded = (n + 7) & ~(size_t)7;
    char *out = realloc(s, padded + 1);
    if (!out) {
        free(s);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = 0;
    *len = padded;
    return out;
}

static int write_shard(const char *path, const sl_st_wtensor *t, int a, int b, sl_st_fill_fn fill,
                       sl_st_progress_fn progress, void *ctx, uint8_t *buf, uint64_t *done, uint64_t total, sl_err *e) {
    size_t hlen = 0;
    char *hdr = shard_header(t, a, b, &hlen);
    if (!hdr) return sl_fail(e, "out of memory building the header of %s", path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        free(hdr);
        return sl_fail(e, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int rc = write_all(fd, len8, 8, path, e) || write_all(fd, hdr, hlen, path, e) ? -1 : 0;
    free(hdr);
    for (int i = a; i < b && !rc; i++) {
        uint64_t sz = sl_st_wtensor_bytes(&t[i]);
        for (uint64_t off = 0; off < sz && !rc; off += CHUNK) {
            size_t n = sz - off < CHUNK ? (size_t)(sz - off) : CHUNK;
            fill(ctx, &t[i], off, buf, n);
            rc = write_all(fd, buf, n, path, e);
            *done += n;
            if (progress) progress(ctx, *done, total);
        }
    }
    if (close(fd) && !rc) rc = sl_fail(e, "%s: close failed: %s", path, strerror(errno));
    return rc;
}

int sl_st_write(const char *dir, const sl_st_wtensor *t, int n, uint64_t shard_bytes, sl_st_fill_fn fill,
                sl_st_progress_fn progress, void *ctx, sl_err *e) {
    /* shard boundaries first: the index needs the shard count in every file name */
    int *first = malloc((size_t)(n + 1) * sizeof *first);
    if (!first) return sl_fail(e, "out of memory");
    int n_shards = 0;
    uint64_t acc = 0, total = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || (shard_bytes && acc >= shard_bytes)) {
            first[n_shards++] = i;
            acc = 0;
        }
        acc += sl_st_wtensor_bytes(&t[i]);
        total += sl_st_wtensor_bytes(&t[i]);
    }
    first[n_shards] = n;
    uint8_t *buf = malloc(CHUNK);
    json_t *map = json_object();
    int rc = 0;
    uint64_t done = 0;
    if (!buf || !map) rc = sl_fail(e, "out of memory");
    for (int s = 0; s < n_shards && !rc; s++) {
        char name[64];
        if (n_shards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        char *path = sl_path_join(dir, name);
        if (!path) {
            rc = sl_fail(e, "out of memory");
            break;
        }
        rc = write_shard(path, t, first[s], first[s + 1], fill, progress, ctx, buf, &done, total, e);
        free(path);
        for (int i = first[s]; i < first[s + 1]; i++) json_object_set_new(map, t[i].name, json_string(name));
    }
    if (!rc && n_shards > 1) {
        json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
        map = NULL;
        char *s = idx ? json_dumps(idx, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
        json_decref(idx);
        char *path = sl_path_join(dir, "model.safetensors.index.json");
        if (!s || !path)
            rc = sl_fail(e, "out of memory");
        else
            rc = sl_write_file(path, s, strlen(s), e);
        free(s);
        free(path);
    }
    json_decref(map);
    free(buf);
    free(first);
    return rc;
}
