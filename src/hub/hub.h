/* Downloads Hugging Face Hub repos into the shared Hub cache (see cache.h): the revision's file list
 * from the Hub API, the files a run needs (select.h), several at once, resumed from blobs/ETAG.incomplete
 * with Range requests, checked against the Hub's sha256 (LFS) or git sha1, after a free-space check. */
#ifndef SLUICE_HUB_HUB_H
#define SLUICE_HUB_HUB_H

#include "core/err.h"

typedef struct sl_hub_pull_opts {
    const char *repo;     /* ORG/NAME */
    const char *revision; /* branch, tag or commit; NULL: main */
    const char *select;   /* quant or exact .gguf path; NULL: the safetensors checkpoint */
    int parallel;         /* transfers at once; 0: 4 */
    int quiet;            /* no progress on stderr */
} sl_hub_pull_opts;

/* *path (may be NULL) receives the model path in the cache: the snapshot folder, or the first file of
 * the chosen GGUF set. The endpoint is $HF_ENDPOINT, else https://huggingface.co. */
int sl_hub_pull(const sl_hub_pull_opts *o, char **path, sl_err *e);

/* Splits "ORG/NAME[@REV][:SELECT]" into its parts (heap strings; rev and sel NULL when absent). */
int sl_hub_parse_ref(const char *arg, char **repo, char **rev, char **sel, sl_err *e);

/* A model argument that names a Hub repo: the path in the cache, after pulling it when it is not there
 * (unless $HF_HUB_OFFLINE is set), saying so on stderr. */
int sl_hub_resolve(const char *arg, char **path, sl_err *e);

#endif
