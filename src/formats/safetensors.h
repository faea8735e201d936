/* The tensors of a checkpoint, and how safetensors files become one. GGUF files are presented through the
 * same table (formats/gguf_model.h) under the names a safetensors checkpoint would use. */
/* Safetensors checkpoints, single-file or sharded (model.safetensors.index.json): every header is
 * validated (offsets in range, size = shape x dtype, no overlap) before any tensor is used, and the
 * files are mmapped so weights are read in place. */
#ifndef SLUICE_FORMATS_SAFETENSORS_H
#define SLUICE_FORMATS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef enum {
    SL_ST_F32,
    SL_ST_F16,
    SL_ST_BF16,
    SL_ST_F64,
    SL_ST_U32,
    SL_ST_I32,
    SL_ST_U16,
    SL_ST_I16,
    SL_ST_U8,
    SL_ST_I8,
    SL_ST_I64,
    SL_ST_U64,
    SL_ST_BOOL,
    SL_ST_F8_E4M3,
    SL_ST_F8_E5M2,
    SL_ST_GGML, /* a GGML block-quantised type (GGUF files); the type id is in sl_st_tensor.gtype */
} sl_st_dtype;

#define SL_ST_MAX_DIMS 8

typedef struct sl_st_tensor {
    char *name;
    sl_st_dtype dtype;
    int ndim;
    int64_t shape[SL_ST_MAX_DIMS];
    const uint8_t *data; /* inside the file mapping */
    uint64_t nbytes;
    uint64_t offset; /* absolute byte offset in its file */
    int file;        /* index into sl_st_set.paths */
    int gtype;       /* GGML type id when dtype is SL_ST_GGML */
    void *owned;     /* heap copy that data points into (rows reordered at load), freed with the set */
} sl_st_tensor;

typedef struct sl_st_set {
    int n_files;
    char **paths;
    uint8_t **maps;
    size_t *map_sizes;
    int n_tensors;
    sl_st_tensor *tensors; /* sorted by name */
} sl_st_set;

const char *sl_st_dtype_name(sl_st_dtype d);
size_t sl_st_dtype_size(sl_st_dtype d);

/* Opens one .safetensors file and appends its tensors to set (a fresh set when *set is NULL). */
int sl_st_open_file(const char *path, sl_st_set **set, sl_err *e);
/* Opens a model directory: the files named by model.safetensors.index.json, else every *.safetensors. */
int sl_st_open_dir(const char *dir, sl_st_set **out, sl_err *e);
void sl_st_close(sl_st_set *s);
/* Binary search by exact name; NULL when absent. */
const sl_st_tensor *sl_st_find(const sl_st_set *s, const char *name);
int64_t sl_st_numel(const sl_st_tensor *t);

#endif
