/* GGUF files (v2 and v3), single or split (NAME-00001-of-0000N.gguf): header, metadata of every value
 * type (nested arrays included), tensor infos and data, all validated before use and read from an mmap.
 * Metadata comes from the first split; tensors from all of them. */
#ifndef SLUICE_FORMATS_GGUF_H
#define SLUICE_FORMATS_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef enum {
    SL_GGUF_U8 = 0,
    SL_GGUF_I8 = 1,
    SL_GGUF_U16 = 2,
    SL_GGUF_I16 = 3,
    SL_GGUF_U32 = 4,
    SL_GGUF_I32 = 5,
    SL_GGUF_F32 = 6,
    SL_GGUF_BOOL = 7,
    SL_GGUF_STRING = 8,
    SL_GGUF_ARRAY = 9,
    SL_GGUF_U64 = 10,
    SL_GGUF_I64 = 11,
    SL_GGUF_F64 = 12,
} sl_gguf_vtype;

/* A string inside the mapping: not NUL-terminated. */
typedef struct sl_gguf_str {
    const char *s;
    uint64_t len;
} sl_gguf_str;

typedef struct sl_gguf_kv {
    char *key;
    sl_gguf_vtype type;
    /* arrays: element type and count; scalars: n = 1 */
    sl_gguf_vtype elem;
    uint64_t n;
    /* scalars and arrays of fixed-size elements: the value bytes in the mapping (little-endian, unaligned) */
    const uint8_t *raw;
    /* strings (n = 1) and arrays of strings: one entry per string; NULL for other types */
    sl_gguf_str *strs;
} sl_gguf_kv;

#define SL_GGUF_MAX_DIMS 4

typedef struct sl_gguf_tensor {
    char *name;
    int ndim;
    int64_t ne[SL_GGUF_MAX_DIMS]; /* ggml order: ne[0] is the contiguous (innermost) dimension */
    int type;                     /* GGML type id */
    const uint8_t *data;          /* inside the mapping of its file */
    uint64_t nbytes;
    uint64_t offset; /* absolute byte offset in its file */
    int file;
} sl_gguf_tensor;

typedef struct sl_gguf {
    int version;
    uint32_t alignment;
    int n_files;
    char **paths;
    uint8_t **maps;
    size_t *map_sizes;
    int n_kv;
    sl_gguf_kv *kv;
    int n_tensors;
    sl_gguf_tensor *tensors; /* in file order, split after split */
} sl_gguf;

/* 1 when the path names a GGUF file (by its ".gguf" suffix). */
int sl_gguf_is_path(const char *path);
/* Opens path; when it is the first split of a set, the other splits are opened too. */
int sl_gguf_open(const char *path, sl_gguf **out, sl_err *e);
void sl_gguf_close(sl_gguf *g);

const char *sl_gguf_vtype_name(sl_gguf_vtype t);
const sl_gguf_kv *sl_gguf_find(const sl_gguf *g, const char *key);
const sl_gguf_tensor *sl_gguf_find_tensor(const sl_gguf *g, const char *name);

/* Typed getters. They return 1 when the key is absent (out untouched), 0 on success, and -1 with an error
 * naming the file and key when the value has another type. Integers accept any integer type in range. */
int sl_gguf_get_int(const sl_gguf *g, const char *key, int64_t *out, sl_err *e);
int sl_gguf_get_float(const sl_gguf *g, const char *key, double *out, sl_err *e); /* any number */
int sl_gguf_get_bool(const sl_gguf *g, const char *key, int *out, sl_err *e);
int sl_gguf_get_str(const sl_gguf *g, const char *key, sl_gguf_str *out, sl_err *e);
/* An array whose elements have type `elem` (any integer type when elem is SL_GGUF_I64). */
int sl_gguf_get_array(const sl_gguf *g, const char *key, sl_gguf_vtype elem, const sl_gguf_kv **out, sl_err *e);
/* Element i of an integer array as int64. */
int64_t sl_gguf_array_int(const sl_gguf_kv *kv, uint64_t i);
double sl_gguf_array_float(const sl_gguf_kv *kv, uint64_t i);

#endif
