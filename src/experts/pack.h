/* The expert pack (sluice pack): every routed expert's pieces copied into one file beside the
 * checkpoint, each expert one contiguous 4 KiB-aligned range, so that the expert store reads an expert
 * in one read. The checkpoint is left as it is and stays what everything else loads. The pack records
 * the size and modification time of every checkpoint file and where each piece came from, and is used
 * only while all of that still matches. */
#ifndef SLUICE_EXPERTS_PACK_H
#define SLUICE_EXPERTS_PACK_H

#include <stdint.h>

#include "core/err.h"
#include "experts/layout.h"
#include "formats/safetensors.h"

typedef struct sl_model sl_model;

/* Where the pack of a checkpoint lives: DIR/experts.sluice-pack beside safetensors files, FILE.sluice-pack
 * beside a GGUF file. NULL when out of memory. */
char *sl_pack_path(const sl_st_set *set);

typedef void (*sl_pack_progress_fn)(void *ctx, uint64_t done, uint64_t total);
/* Writes the pack of m, whose experts are resident on the CPU backend (pointing into the checkpoint), to
 * path (through path.tmp, renamed once whole). Sets *n_experts and *bytes to what it packed. */
int sl_pack_write(const sl_model *m, const char *path, sl_pack_progress_fn progress, void *ctx, int *n_experts,
                  uint64_t *bytes, sl_err *e);
/* Points the pieces of every expert (x: [n_layers][n_experts], empty rows for dense layers) at the pack
 * at path, as file index pack_file, when it matches set and the pieces. 1: applied, 0: no pack there, -1:
 * a pack that does not match or cannot be read, said in e (the pieces are left as they were). */
int sl_pack_apply(const char *path, const sl_st_set *set, int n_layers, int n_experts, xinfo *x, int pack_file,
                  sl_err *e);

#endif
