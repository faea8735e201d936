/* libFuzzer driver for one target, named at compile time by SLUICE_FUZZ_TARGET. */
#include <stdlib.h>

#include "targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const sl_fuzz_target *t;
    if (!t && !(t = sl_fuzz_find(SLUICE_FUZZ_TARGET))) abort();
    t->run(data, size);
    return 0;
}
