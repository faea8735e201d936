/* Small helpers shared by every module: files, sizes, clocks, id lists. */
#ifndef SLUICE_CORE_UTIL_H
#define SLUICE_CORE_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/err.h"

/* Reads a stream to its end into a NUL-terminated heap buffer; `name` labels errors. */
int sl_read_stream(FILE *f, const char *name, char **out, size_t *len, sl_err *e);
/* Reads a whole file into a NUL-terminated heap buffer. */
int sl_read_file(const char *path, char **out, size_t *len, sl_err *e);
/* Writes len bytes to path (created or truncated). */
int sl_write_file(const char *path, const void *data, size_t len, sl_err *e);
int sl_file_exists(const char *path);
int sl_is_dir(const char *path);
/* "dir/name" into a fresh heap string. */
char *sl_path_join(const char *dir, const char *name);

/* Formats a byte count as "1.23 GB" / "512 KB" (decimal units). Returns buf. */
const char *sl_human_bytes(double bytes, char *buf, size_t n);
/* Formats a count as "1.23 B" / "45.6 M" / "789". Returns buf. */
const char *sl_human_count(double n, char *buf, size_t len);
/* Parses "20G", "512M", "1.5GB", "4096" into bytes. */
int sl_parse_size(const char *s, uint64_t *out);

/* splitmix64: advances *state by the golden-ratio step and returns that state mixed, the same stream on
 * every machine (seeding, synthetic weights, fixed prompts). */
uint64_t sl_splitmix64(uint64_t *state);

/* Parses "1,2,3" into a heap array of int32. */
int sl_parse_ids(const char *s, int32_t **ids, int *n, sl_err *e);

double sl_now(void); /* monotonic seconds */

/* Host memory available for new allocations and the page cache (MemAvailable), in bytes; 8 GB when
 * it cannot be read. */
double sl_mem_available(void);

#endif
