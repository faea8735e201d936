/* The fuzz entry points: one per parser, each taking arbitrary bytes. libFuzzer drives them (fuzz_main.c)
 * and the unit test test_fuzz_replay.c feeds them every saved input, so a crash found once stays fixed. An
 * entry point returns normally for any input; parse errors are expected results, not failures. */
#ifndef SLUICE_FUZZ_TARGETS_H
#define SLUICE_FUZZ_TARGETS_H

#include <stddef.h>
#include <stdint.h>

typedef struct sl_fuzz_target {
    const char *name;
    void (*run)(const uint8_t *data, size_t size);
} sl_fuzz_target;

/* NULL-terminated. */
extern const sl_fuzz_target sl_fuzz_targets[];
const sl_fuzz_target *sl_fuzz_find(const char *name);

#endif
