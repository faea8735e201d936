/* Turning checkpoint tensors into model weights: key layouts normalised (model.*,
 * model.language_model.*, language_model.model.*, Mixtral's block_sparse_moe.*), MLX packing decoded
 * from shapes and the config's quantization table, shapes checked, and every tensor accounted for so
 * stray ones are reported. */
#ifndef SLUICE_MODELS_LOADER_H
#define SLUICE_MODELS_LOADER_H

#include "models/model.h"

typedef struct sl_loader {
    sl_model *m;
    int n;
    char **norm_names; /* normalised name per tensor of m->st (NULL: ignored, e.g. vision tower) */
    int *order;        /* tensor indices sorted by normalised name */
    unsigned char *used;
} sl_loader;

int sl_loader_init(sl_loader *l, sl_model *m, sl_err *e);
void sl_loader_free(sl_loader *l);

/* The tensor with normalised name `name` (e.g. "model.layers.0.self_attn.q_proj.weight"), or NULL. */
const sl_st_tensor *sl_ld_find(sl_loader *l, const char *name);
int sl_ld_has(sl_loader *l, const char *name);

/* A linear layer `module` (without ".weight") of [rows, cols]: plain F32/F16/BF16, MLX-packed
 * (".weight" U32 + ".scales" + ".biases") or block FP8 (".weight" F8_E4M3 + ".weight_scale_inv"). An
 * optional ".bias" is read when present. */
int sl_ld_linear(sl_loader *l, const char *module, int rows, int cols, sl_weight *w, sl_err *e);
/* Rows rows[0..n) of the linear layer `module` of [rows_total, cols], in that order, as an owned copy: the
 * parts of a fused projection whose rows are stored interleaved (e.g. grouped per head). */
int sl_ld_linear_rows(sl_loader *l, const char *module, int rows_total, int cols, int n, const int *rows, sl_weight *w,
                      sl_err *e);
/* A linear layer's weight dequantised into a float32 [rows][cols] copy owned by the model, for layers
 * whose kernels read it as plain floats. */
int sl_ld_matrix_f32(sl_loader *l, const char *module, int rows, int cols, float **out, sl_err *e);
/* Row r of w as float32 into d[w->cols] (any format but MLX, and no bias); `what` names w in errors. */
int sl_ld_row_f32(const sl_weight *w, int r, float *d, const char *what, sl_err *e);
/* n floats owned by the model. */
float *sl_ld_alloc_f32(sl_loader *l, size_t n, sl_err *e);
/* n zeroed elements of size bytes owned by the model: a layer part, an expert table. */
void *sl_ld_part(sl_loader *l, size_t n, size_t size, sl_err *e);
/* Expert slice `index` of a stacked [E, rows, cols] tensor (MLX-packed or plain); with `row0` selecting
 * rows [row0, row0 + rows) of a fused gate/up stack. `module` names the stack (no ".weight"). */
int sl_ld_stacked(sl_loader *l, const char *module, int has_weight_suffix, int n_experts, int index, int row0,
                  int rows_total, int rows, int cols, sl_weight *w, sl_err *e);
/* The float32 bias of expert `index`: row `index` of the stacked biases `name` [E, rows], owned by the model. */
int sl_ld_stacked_bias(sl_loader *l, const char *name, int n_experts, int index, int rows, sl_weight *w, sl_err *e);
/* Expert `index` of a gpt-oss expert stack `module` (e.g. "model.layers.0.mlp.experts.gate_up_proj") as a
 * [rows, cols] weight with its bias (module + "_bias", [E, rows]). MXFP4 as OpenAI ships it
 * (module + "_blocks" U8 [E, rows, cols / 32, 16] and "_scales" U8 [E, rows, cols / 32]) is used in place;
 * so is a float stack `module` [E, cols, rows] (inputs first, the transpose of nn.Linear), as a transposed
 * weight (sl_weight.transposed). */
int sl_ld_expert_t(sl_loader *l, const char *module, int n_experts, int index, int rows, int cols, sl_weight *w,
                   sl_err *e);
/* A float32 copy of a small tensor of exactly `len` elements (norm weights, A_log, conv kernels, ...),
 * with `add` added to each element. Owned by the model. */
int sl_ld_vector(sl_loader *l, const char *name, int64_t len, float add, float **out, sl_err *e);
/* Fails naming the first tensor that no part of the model used. */
int sl_ld_check_all_used(sl_loader *l, sl_err *e);

#endif
