/* Where a MODEL argument points: a directory or file as given, or a Hub repo id ("Qwen/Qwen3-0.6B",
 * optionally "@revision" and ":QUANT" or ":FILE.gguf") in the local Hugging Face cache ($HF_HUB_CACHE,
 * $HF_HOME/hub or ~/.cache/huggingface/hub), pulled into it first when missing (see hub/hub.h). */
#ifndef SLUICE_FORMATS_RESOLVE_H
#define SLUICE_FORMATS_RESOLVE_H

#include "core/err.h"

/* *dir receives a heap path to a directory. */
int sl_resolve_model(const char *arg, char **dir, sl_err *e);

#endif
