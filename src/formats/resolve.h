/* Where a MODEL argument points: a directory as given, or a Hub repo id ("Qwen/Qwen3-0.6B", optionally
 * "@revision") found in the local Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or
 * ~/.cache/huggingface/hub). */
#ifndef SLUICE_FORMATS_RESOLVE_H
#define SLUICE_FORMATS_RESOLVE_H

#include "core/err.h"

/* *dir receives a heap path to a directory. */
int sl_resolve_model(const char *arg, char **dir, sl_err *e);

#endif
