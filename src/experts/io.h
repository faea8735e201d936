/* The I/O engine of the expert store: reads of byte ranges of open files into memory, many in flight,
 * completing in the background while the caller computes. io_uring where the kernel allows it, else a
 * pool of threads doing pread. A read completes whole: short reads are continued until the range is
 * read, the file ends or an error occurs. */
#ifndef SLUICE_EXPERTS_IO_H
#define SLUICE_EXPERTS_IO_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef struct sl_io sl_io;

/* depth: the most reads in flight. engine: "uring", "pread" or NULL (io_uring when it works, else
 * pread; the SLUICE_IO_ENGINE environment variable names one too). */
int sl_io_open(int depth, const char *engine, sl_io **out, sl_err *e);
void sl_io_close(sl_io *io);
/* "io_uring" or "pread threads" */
const char *sl_io_engine(const sl_io *io);
/* Queues a read of len bytes at off of fd into dst, returned with tag on completion. -1 when depth reads
 * are queued or in flight already (wait for one first). */
int sl_io_read(sl_io *io, int fd, uint64_t off, size_t len, void *dst, uint64_t tag);
/* Starts every queued read. */
void sl_io_submit(sl_io *io);
/* Waits for one read to complete: its tag and result (bytes read, fewer only at the end of the file,
 * or -errno). Returns -1 when nothing is queued or in flight. */
int sl_io_wait(sl_io *io, uint64_t *tag, int64_t *res);
int sl_io_pending(const sl_io *io);
/* 1 when a read has completed, so sl_io_wait will not block. */
int sl_io_ready(sl_io *io);

#endif
