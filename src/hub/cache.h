/* The Hugging Face Hub cache as huggingface_hub lays it out, shared with it:
 *   ROOT/models--ORG--NAME/blobs/ETAG                  file contents, named by sha256 (LFS) or git sha1
 *   ROOT/models--ORG--NAME/snapshots/COMMIT/PATH  ->   ../../blobs/ETAG (relative symlinks)
 *   ROOT/models--ORG--NAME/refs/REVISION               the commit a branch or tag pointed to
 * ROOT is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub. */
#ifndef SLUICE_HUB_CACHE_H
#define SLUICE_HUB_CACHE_H

#include <stdint.h>

#include "core/err.h"

/* Heap path of the cache root. */
char *sl_hub_cache_root(void);
/* Checks "ORG/NAME" (letters, digits, '-', '_', '.'; no "..") and fills buf with ROOT/models--ORG--NAME. */
int sl_hub_repo_dir(const char *repo, char *buf, size_t n, sl_err *e);
/* Reads refs/REV of a repo folder into commit (a commit hash passes through); 0 when the snapshot
 * exists. */
int sl_hub_snapshot(const char *repo_dir, const char *rev, char *commit, size_t n);
/* mkdir -p. */
int sl_hub_mkdirs(const char *path, sl_err *e);
/* The access token: $HF_TOKEN, else the file $HF_TOKEN_PATH, $HF_HOME/token or ~/.cache/huggingface/token.
 * Heap string, or NULL. */
char *sl_hub_token(void);

typedef struct sl_hub_entry {
    char repo[256];  /* ORG/NAME */
    char refs[256];  /* "main=abc1234 v1=..." or the snapshot commits when there are no refs */
    uint64_t bytes;  /* sum of the blobs */
    int files;       /* files in the largest snapshot */
    char format[32]; /* safetensors, gguf or "other" */
} sl_hub_entry;

/* The model repos in the cache, sorted by name; *out is a heap array. */
int sl_hub_list(const char *root, sl_hub_entry **out, int *n, sl_err *e);
/* Removes a repo's folder, after checking it is a cache entry (blobs/, snapshots/ or refs/ inside). */
int sl_hub_remove(const char *repo_dir, sl_err *e);

#endif
