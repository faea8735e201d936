/* The codebooks of the GGUF IQ quantisation formats (see ggml_grids.c). */
#ifndef SLUICE_BACKEND_GGML_GRIDS_H
#define SLUICE_BACKEND_GGML_GRIDS_H

#include <stdint.h>

extern const uint64_t sl_iq2xxs_grid[256];
extern const uint64_t sl_iq2xs_grid[512];
extern const uint64_t sl_iq2s_grid[1024];
extern const uint32_t sl_iq3xxs_grid[256];
extern const uint32_t sl_iq3s_grid[512];
extern const uint64_t sl_iq1s_grid[2048];

#endif
