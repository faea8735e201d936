#include "experts/io.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct io_req {
    int fd;
    void *fh; /* set: read through the reader */
    uint64_t off, tag;
    size_t len, done;
    uint8_t *dst;
    int64_t res; /* pread engine: the result once finished */
} io_req;

struct sl_io {
    int uring; /* 1: io_uring, 0: pread threads */
    int depth;
    io_req *req;
    int *free_ids, n_free;
    int n_busy;   /* reads queued or in flight */
    int n_queued; /* queued, not yet submitted (io_uring) or handed out (pread) */
    struct io_uring ring;
    /* pread threads: a queue of request ids to run and one of finished ones */
    pthread_t *threads;
    int n_threads, stop;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int *todo, todo_head, todo_n;
    int *fin, fin_head, fin_n;
    sl_io_reader reader;
};

static void *worker(void *arg) {
    sl_io *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->stop && !io->todo_n) pthread_cond_wait(&io->work, &io->mu);
        if (io->stop) break;
        int id = io->todo[io->todo_head];
        io->todo_head = (io->todo_head + 1) % io->depth;
        io->todo_n--;
        pthread_mutex_unlock(&io->mu);
        io_req *r = &io->req[id];
        int64_t res = 0;
        while (r->done < r->len) {
            int64_t got;
            if (r->fh) {
                got = io->reader.fn(io->reader.ctx, r->fh, r->dst + r->done, r->len - r->done, r->off + r->done);
            } else {
                got = pread(r->fd, r->dst + r->done, r->len - r->done, (off_t)(r->off + r->done));
                if (got < 0) got = -errno;
            }
            if (got == -EINTR) continue;
            if (got < 0) {
                res = got;
                break;
            }
            if (got == 0) break;
            r->done += (size_t)got;
        }
        r->res = res < 0 ? res : (int64_t)r->done;
        pthread_mutex_lock(&io->mu);
        io->fin[(io->fin_head + io->fin_n) % io->depth] = id;
        io->fin_n++;
        pthread_cond_signal(&io->done);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

static int start_threads(sl_io *io, sl_err *e) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    /* reads block in the kernel, so more threads than cores keep a device's queue full
     * (SLUICE_IO_THREADS sets the count, for measuring) */
    const char *env = getenv("SLUICE_IO_THREADS");
    io->n_threads = cores > 0 ? (int)(cores * 2 > 32 ? 32 : cores * 2) : 4;
    if (env && atoi(env) > 0) io->n_threads = atoi(env) > 256 ? 256 : atoi(env);
    if (io->n_threads > io->depth) io->n_threads = io->depth;
    io->threads = calloc((size_t)io->n_threads, sizeof *io->threads);
    io->todo = calloc((size_t)io->depth, sizeof *io->todo);
    io->fin = calloc((size_t)io->depth, sizeof *io->fin);
    if (!io->threads || !io->todo || !io->fin) return sl_fail(e, "out of memory");
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->work, NULL);
    pthread_cond_init(&io->done, NULL);
    for (int i = 0; i < io->n_threads; i++)
        if (pthread_create(&io->threads[i], NULL, worker, io)) {
            io->n_threads = i;
            return sl_fail(e, "cannot start the I/O threads: %s", strerror(errno));
        }
    return 0;
}

int sl_io_open(int depth, const char *engine, const sl_io_reader *reader, sl_io **out, sl_err *e) {
    if (reader) engine = "pread";
    if (!engine) engine = getenv("SLUICE_IO_ENGINE");
    if (engine && *engine && strcmp(engine, "uring") && strcmp(engine, "pread"))
        return sl_fail(e, "I/O engine '%s' is not one of uring, pread", engine);
    sl_io *io = calloc(1, sizeof *io);
    if (!io) return sl_fail(e, "out of memory");
    io->depth = depth < 1 ? 1 : depth;
    io->req = calloc((size_t)io->depth, sizeof *io->req);
    io->free_ids = calloc((size_t)io->depth, sizeof *io->free_ids);
    if (!io->req || !io->free_ids) {
        sl_io_close(io);
        return sl_fail(e, "out of memory");
    }
    if (reader) io->reader = *reader;
    for (int i = 0; i < io->depth; i++) io->free_ids[i] = io->depth - 1 - i;
    io->n_free = io->depth;
    if (!engine || !*engine || !strcmp(engine, "uring")) {
        int rc = io_uring_queue_init((unsigned)io->depth, &io->ring, 0);
        if (rc == 0) {
            io->uring = 1;
        } else if (engine && !strcmp(engine, "uring")) {
            sl_io_close(io);
            return sl_fail(e, "io_uring is not available here: %s", strerror(-rc));
        }
    }
    if (!io->uring && start_threads(io, e)) {
        sl_io_close(io);
        return -1;
    }
    *out = io;
    return 0;
}

void sl_io_close(sl_io *io) {
    if (!io) return;
    /* reads still in flight write into buffers the caller is about to free: finish them first */
    uint64_t tag;
    int64_t res;
    sl_io_submit(io);
    while (io->n_busy && sl_io_wait(io, &tag, &res) == 0) {
    }
    if (io->uring) io_uring_queue_exit(&io->ring);
    if (io->threads) {
        pthread_mutex_lock(&io->mu);
        io->stop = 1;
        pthread_cond_broadcast(&io->work);
        pthread_mutex_unlock(&io->mu);
        for (int i = 0; i < io->n_threads; i++) pthread_join(io->threads[i], NULL);
        pthread_mutex_destroy(&io->mu);
        pthread_cond_destroy(&io->work);
        pthread_cond_destroy(&io->done);
    }
    free(io->threads);
    free(io->todo);
    free(io->fin);
    free(io->req);
    free(io->free_ids);
    free(io);
}

const char *sl_io_engine(const sl_io *io) {
    return io->uring ? "io_uring" : io->reader.fn ? "reader threads" : "pread threads";
}

int sl_io_pending(const sl_io *io) {
    return io->n_busy;
}

int sl_io_ready(sl_io *io) {
    if (io->uring) {
        struct io_uring_cqe *cqe;
        return io_uring_peek_cqe(&io->ring, &cqe) == 0;
    }
    pthread_mutex_lock(&io->mu);
    int r = io->fin_n > 0;
    pthread_mutex_unlock(&io->mu);
    return r;
}

static void uring_queue(sl_io *io, int id) {
    io_req *r = &io->req[id];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    if (!sqe) { /* the ring is sized to depth, so this only follows continuations: make room */
        io_uring_submit(&io->ring);
        sqe = io_uring_get_sqe(&io->ring);
    }
    size_t left = r->len - r->done;
    /* one read transfers at most 2 GB */
    unsigned n = left > (1u << 30) ? 1u << 30 : (unsigned)left;
    io_uring_prep_read(sqe, r->fd, r->dst + r->done, n, r->off + r->done);
    io_uring_sqe_set_data64(sqe, (uint64_t)id);
}

static int queue(sl_io *io, int fd, void *fh, uint64_t off, size_t len, void *dst, uint64_t tag) {
    if (!io->n_free) return -1;
    int id = io->free_ids[--io->n_free];
    io_req *r = &io->req[id];
    *r = (io_req){.fd = fd, .fh = fh, .off = off, .tag = tag, .len = len, .dst = dst};
    io->n_busy++;
    io->n_queued++;
    if (io->uring) {
        uring_queue(io, id);
    } else {
        pthread_mutex_lock(&io->mu);
        io->todo[(io->todo_head + io->todo_n) % io->depth] = id;
        io->todo_n++;
        pthread_cond_signal(&io->work);
        pthread_mutex_unlock(&io->mu);
    }
    return 0;
}

int sl_io_read(sl_io *io, int fd, uint64_t off, size_t len, void *dst, uint64_t tag) {
    return queue(io, fd, NULL, off, len, dst, tag);
}

int sl_io_read_fh(sl_io *io, void *fh, uint64_t off, size_t len, void *dst, uint64_t tag) {
    return queue(io, -1, fh, off, len, dst, tag);
}

void sl_io_submit(sl_io *io) {
    if (io->uring && io->n_queued) io_uring_submit(&io->ring);
    io->n_queued = 0;
}

static int finish(sl_io *io, int id, int64_t res, uint64_t *tag, int64_t *out) {
    *tag = io->req[id].tag;
    *out = res;
    io->free_ids[io->n_free++] = id;
    io->n_busy--;
    return 0;
}

int sl_io_wait(sl_io *io, uint64_t *tag, int64_t *res) {
    if (!io->n_busy) return -1;
    sl_io_submit(io);
    if (!io->uring) {
        pthread_mutex_lock(&io->mu);
        while (!io->fin_n) pthread_cond_wait(&io->done, &io->mu);
        int id = io->fin[io->fin_head];
        io->fin_head = (io->fin_head + 1) % io->depth;
        io->fin_n--;
        pthread_mutex_unlock(&io->mu);
        return finish(io, id, io->req[id].res, tag, res);
    }
    for (;;) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&io->ring, &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0) return -1;
        int id = (int)io_uring_cqe_get_data64(cqe);
        int r = cqe->res;
        io_uring_cqe_seen(&io->ring, cqe);
        io_req *q = &io->req[id];
        if (r < 0 && r != -EINTR && r != -EAGAIN) return finish(io, id, r, tag, res);
        if (r > 0) q->done += (size_t)r;
        if (r != 0 && q->done < q->len) { /* interrupted or short: continue from where it stopped */
            uring_queue(io, id);
            io_uring_submit(&io->ring);
            continue;
        }
        return finish(io, id, (int64_t)q->done, tag, res); /* whole, or the file ended */
    }
}
