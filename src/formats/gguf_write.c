#include "formats/gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ggml_types.h"

#define ALIGNMENT 32
#define CHUNK ((size_t)16 << 20)

uint64_t sl_gguf_wtensor_bytes(const sl_gguf_wtensor *t) {
    uint64_t n = sl_ggml_row_bytes(t->type, t->ne[0]);
    for (int d = 1; d < t->ndim; d++) n *= (uint64_t)t->ne[d];
    return n;
}

static uint64_t padded(uint64_t n) {
    return (n + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
}

/* little-endian appends to a growing header buffer */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    int oom;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void put_u32(buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}

static void put_u64(buf *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static int put_kv(buf *b, const sl_gguf_wkv *kv, const char *path, sl_err *e) {
    put_str(b, kv->key);
    put_u32(b, (uint32_t)kv->type);
    switch (kv->type) {
    case SL_GGUF_U32:
    case SL_GGUF_I32: put_u32(b, (uint32_t)kv->i); break;
    case SL_GGUF_U64: put_u64(b, (uint64_t)kv->i); break;
    case SL_GGUF_F32: {
        float f = (float)kv->f;
        uint32_t u;
        memcpy(&u, &f, 4);
        put_u32(b, u);
        break;
    }
    case SL_GGUF_BOOL: {
        uint8_t v = kv->i != 0;
        put(b, &v, 1);
        break;
    }
    case SL_GGUF_STRING: put_str(b, kv->s); break;
    case SL_GGUF_ARRAY:
        put_u32(b, SL_GGUF_I32);
        put_u64(b, kv->n);
        for (uint64_t i = 0; i < kv->n; i++) put_u32(b, (uint32_t)kv->arr[i]);
        break;
    default:
        return sl_fail(e, "%s: metadata key '%s' has a value type (%s) the writer does not handle", path, kv->key,
                       sl_gguf_vtype_name(kv->type));
    }
    return 0;
}

static int write_all(FILE *f, const void *p, size_t n, const char *path, sl_err *e) {
    if (n && fwrite(p, 1, n, f) != n) return sl_fail(e, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

int sl_gguf_write(const char *path, const sl_gguf_wkv *kv, int n_kv, const sl_gguf_wtensor *t, int n_t,
                  sl_gguf_fill_fn fill, sl_gguf_progress_fn progress, void *ctx, sl_err *e) {
    buf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, (uint64_t)n_t);
    put_u64(&h, (uint64_t)n_kv);
    for (int i = 0; i < n_kv; i++)
        if (put_kv(&h, &kv[i], path, e)) {
            free(h.p);
            return -1;
        }
    uint64_t off = 0;
    for (int i = 0; i < n_t; i++) {
        const char *tn = sl_ggml_type_name(t[i].type);
        int bs = sl_ggml_block_size(t[i].type);
        if (!tn || t[i].ndim < 1 || t[i].ndim > SL_GGUF_MAX_DIMS || t[i].ne[0] <= 0 || t[i].ne[0] % bs) {
            free(h.p);
            return sl_fail(e, "%s: tensor '%s' (%s, %d dims, %lld values per row) is not writable as whole blocks",
                           path, t[i].name, tn ? tn : "unknown type", t[i].ndim, (long long)t[i].ne[0]);
        }
        put_str(&h, t[i].name);
        put_u32(&h, (uint32_t)t[i].ndim);
        for (int d = 0; d < t[i].ndim; d++) put_u64(&h, (uint64_t)t[i].ne[d]);
        put_u32(&h, (uint32_t)t[i].type);
        put_u64(&h, off);
        off += padded(sl_gguf_wtensor_bytes(&t[i]));
    }
    uint8_t zero[ALIGNMENT] = {0};
    put(&h, zero, (size_t)(padded(h.len) - h.len));
    uint8_t *chunk = malloc(CHUNK);
    if (h.oom || !chunk) {
        free(h.p);
        free(chunk);
        return sl_fail(e, "out of memory");
    }
    FILE *f = fopen(path, "wb");
    int rc = -1;
    if (!f) {
        sl_fail(e, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    if (write_all(f, h.p, h.len, path, e)) goto done;
    uint64_t done = 0;
    for (int i = 0; i < n_t; i++) {
        uint64_t n = sl_gguf_wtensor_bytes(&t[i]);
        for (uint64_t o = 0; o < n; o += CHUNK) {
            size_t k = n - o < CHUNK ? (size_t)(n - o) : CHUNK;
            fill(ctx, &t[i], o, chunk, k);
            if (write_all(f, chunk, k, path, e)) goto done;
            done += k;
            if (progress) progress(ctx, done, off);
        }
        if (write_all(f, zero, (size_t)(padded(n) - n), path, e)) goto done;
    }
    if (fclose(f)) {
        f = NULL;
        sl_fail(e, "%s: write failed: %s", path, strerror(errno));
        goto done;
    }
    f = NULL;
    rc = 0;
done:
    if (f) fclose(f);
    free(h.p);
    free(chunk);
    return rc;
}
