/* Which files of a Hub repo a run needs: the safetensors checkpoint with its config and tokenizer, or one
 * quant (one file, or one split set) of a GGUF repo. Pure functions over a list of repo paths. */
#ifndef SLUICE_HUB_SELECT_H
#define SLUICE_HUB_SELECT_H

#include "core/err.h"

/* Marks keep[i] for the files of names[0..n) to fetch. sel is NULL, a quant name matched without case in
 * the file name ("Q4_K_M"), or an exact path ending in .gguf. *gguf (may be NULL) receives the index of
 * the first file of the chosen GGUF set, or -1 for a safetensors checkpoint. Fails naming repo, listing
 * the quants offered when a GGUF repo needs a choice. */
int sl_hub_select(const char *repo, const char *const *names, int n, const char *sel, int *keep, int *gguf, sl_err *e);

#endif
