/* The CUDA backend: every op of backend.h on one NVIDIA GPU, weights resident in its memory. */
#ifndef SLUICE_BACKEND_CUDA_BACKEND_H
#define SLUICE_BACKEND_CUDA_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

/* Opens device `device`. On success `about` describes it (name, arch, free memory); on failure it says
 * why (no driver, no device, no kernels for its arch) and -1 is returned. */
int sl_cuda_backend_create(int device, sl_backend **out, char *about, size_t about_len);

#ifdef __cplusplus
}
#endif

#endif
