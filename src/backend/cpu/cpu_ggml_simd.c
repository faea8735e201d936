/* Vector fused dequantise-dot kernels for the GGML types (AVX2 and AVX-512). */
#include "backend/cpu/cpu.h"
#include "backend/ggml_types.h"

cpu_ggml_dot_fn cpu_ggml_pick(const cpu_impl *c, int gtype) {
    (void)c, (void)gtype;
    return NULL;
}
