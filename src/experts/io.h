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

/* Reads plain pread cannot do (into GPU memory through GPUDirect Storage): fn reads len bytes at off
 * of the file known as fh into dst and returns the bytes read (fewer only at the end of the file) or
 * -errno. It runs on the engine's threads. */
typedef struct sl_io_reader {
    int64_t (*fn)(void *ctx, void *fh, void *dst, size_t len, uint64_t off);
    void *ctx;
} sl_io_reader;

/* depth: the most reads in flight. engine: "uring", "pread" or NULL (io_uring when it works, else
 * pread; the SLUICE_IO_ENGINE environment variable names one too). With a reader (else NULL) the
 * engine is the pool of threads, and sl_io_read_fh reads through it. */
int sl_io_open(int depth, const char *engine, const sl_io_reader *reader, sl_io **out, sl_err *e);
void sl_io_close(sl_io *io);
/* "io_uring", "pread threads" or "reader threads" */
const char *sl_io_engine(const sl_io *io);
/* Queues a read of len bytes at off of fd into dst, returned with tag on completion. -1 when depth reads
 * are queued or in flight already (wait for one first). */
int sl_io_read(sl_io *io, int fd, uint64_t off, size_t len, void *dst, uint64_t tag);
/* The same through the reader, for the file it knows as fh. */
int sl_io_read_fh(sl_io *io, void *fh, uint64_t off, size_t len, void *dst, uint64_t tag);
/* Starts every queued read. */
void sl_io_submit(sl_io *io);
/* Waits for one read to complete: its tag and result (bytes read, fewer only at the end of the file,
 * or -errno). Returns -1 when nothing is queued or in flight. */
int sl_io_wait(sl_io *io, uint64_t *tag, int64_t *res);
int sl_io_pending(const sl_io *io);
/* 1 when a read has completed, so sl_io_wait will not block. */
int sl_io_ready(sl_io *io);

#endif
