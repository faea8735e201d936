#include "experts/pack.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "models/model.h"

#define MAGIC "SLXPACK1"
#define PIECE_ALIGN DEV_ALIGN /* pieces land in a slot where they lie in the record: one copy */

/* On disk, in this order: the head, one pk_file per checkpoint file, one pk_cell per (layer, expert);
 * then the records from data_off on. */
typedef struct pk_head {
    char magic[8];
    uint32_t n_layers, n_experts, n_files, reserved;
    uint64_t data_off, total;
} pk_head;

typedef struct pk_file {
    uint64_t size;
    int64_t mtime_s, mtime_ns;
} pk_file;

typedef struct pk_piece {
    int32_t file; /* the checkpoint file it came from, -1: the loader's copy */
    uint32_t reserved;
    uint64_t off, len, at; /* where it came from, its length, its offset in the record */
} pk_piece;

typedef struct pk_cell {
    uint64_t rec, rec_len; /* the record's offset in the pack (0: no expert) and length */
    pk_piece p[NP];
} pk_cell;

char *sl_pack_path(const sl_st_set *set) {
    const char *first = set->n_files ? set->paths[0] : "";
    size_t L = strlen(first);
    char *out = NULL;
    if (L > 5 && !strcmp(first + L - 5, ".gguf")) {
        if ((out = malloc(L + 13))) snprintf(out, L + 13, "%s.sluice-pack", first);
        return out;
    }
    const char *slash = strrchr(first, '/');
    size_t d = slash ? (size_t)(slash - first) : 1;
    if ((out = malloc(d + 22))) snprintf(out, d + 22, "%.*s/experts.sluice-pack", (int)d, slash ? first : ".");
    return out;
}

static void file_stamp(const struct stat *sb, pk_file *f) {
    f->size = (uint64_t)sb->st_size;
    f->mtime_s = (int64_t)sb->st_mtim.tv_sec;
    f->mtime_ns = (int64_t)sb->st_mtim.tv_nsec;
}

/* The cells of m: pieces as the checkpoint has them, records laid out one after another. */
static int plan_cells(const sl_model *m, int E, pk_cell *cells, uint64_t data_off, uint64_t *total, int *n_experts,
                      size_t *max_rec) {
    uint64_t at = data_off;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const sl_moe *L = m->layers[l].moe;
        for (int x = 0; L && x < L->experts.n_experts; x++) {
            xinfo xi;
            size_t ib, db;
            sl_xinfo_describe(m->st, &L->expert_store[x], &xi, &ib, &db);
            pk_cell *c = &cells[(size_t)l * (size_t)E + (size_t)x];
            uint64_t r = 0;
            for (int i = 0; i < NP; i++) {
                if (!xi.p[i].len) continue;
                c->p[i] = (pk_piece){.file = xi.p[i].file, .off = xi.p[i].off, .len = xi.p[i].len, .at = r};
                r = up(r + xi.p[i].len, PIECE_ALIGN);
            }
            c->rec = at;
            c->rec_len = up(r, ALIGN);
            if (c->rec_len > *max_rec) *max_rec = c->rec_len;
            at += c->rec_len;
            ++*n_experts;
        }
    }
    *total = at;
    return 0;
}

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

int sl_pack_write(const sl_model *m, const char *path, sl_pack_progress_fn progress, void *ctx, int *n_experts,
                  uint64_t *bytes, sl_err *e) {
    const sl_st_set *set = m->st;
    int E = 0, n_layers = m->cfg.n_layers;
    for (int l = 0; l < n_layers; l++)
        if (m->layers[l].moe && m->layers[l].moe->experts.n_experts > E) E = m->layers[l].moe->experts.n_experts;
    if (!E) return sl_fail(e, "%s has no routed experts to pack", m->path);
    size_t n_cells = (size_t)n_layers * (size_t)E;
    size_t head_len = sizeof(pk_head) + (size_t)set->n_files * sizeof(pk_file) + n_cells * sizeof(pk_cell);
    uint8_t *head = calloc(1, head_len);
    if (!head) return sl_fail(e, "out of memory");
    pk_head *h = (pk_head *)head;
    pk_file *files = (pk_file *)(head + sizeof *h);
    pk_cell *cells = (pk_cell *)(files + set->n_files);
    memcpy(h->magic, MAGIC, 8);
    h->n_layers = (uint32_t)n_layers;
    h->n_experts = (uint32_t)E;
    h->n_files = (uint32_t)set->n_files;
    h->data_off = up(head_len, ALIGN);
    for (int i = 0; i < set->n_files; i++) {
        struct stat sb;
        if (stat(set->paths[i], &sb)) {
            free(head);
            return sl_fail(e, "%s: %s", set->paths[i], strerror(errno));
        }
        file_stamp(&sb, &files[i]);
    }
    size_t max_rec = 0;
    *n_experts = 0;
    plan_cells(m, E, cells, h->data_off, &h->total, n_experts, &max_rec);
    char *tmp = malloc(strlen(path) + 5);
    uint8_t *rec = aligned_alloc(ALIGN, max_rec ? max_rec : ALIGN);
    int fd = -1, rc = -1;
    if (!tmp || !rec) {
        sl_fail(e, "out of memory");
        goto done;
    }
    sprintf(tmp, "%s.tmp", path);
    if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
        sl_fail(e, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    uint8_t zero[ALIGN] = {0};
    if (write_all(fd, head, head_len) || write_all(fd, zero, h->data_off - head_len)) goto io_error;
    uint64_t done_bytes = h->data_off;
    for (size_t c = 0; c < n_cells; c++) {
        const pk_cell *cl = &cells[c];
        if (!cl->rec_len) continue;
        memset(rec, 0, cl->rec_len);
        const sl_moe *L = m->layers[c / (size_t)E].moe;
        xinfo xi;
        size_t ib, db;
        sl_xinfo_describe(set, &L->expert_store[c % (size_t)E], &xi, &ib, &db);
        for (int i = 0; i < NP; i++) {
            const piece *p = &xi.p[i];
            if (p->len) memcpy(rec + cl->p[i].at, p->file >= 0 ? set->maps[p->file] + p->off : p->mem, p->len);
        }
        if (write_all(fd, rec, cl->rec_len)) goto io_error;
        done_bytes += cl->rec_len;
        if (progress) progress(ctx, done_bytes, h->total);
    }
    if (fsync(fd)) goto io_error;
    if (close(fd)) {
        fd = -1;
        goto io_error;
    }
    fd = -1;
    if (rename(tmp, path)) {
        sl_fail(e, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        goto done;
    }
    *bytes = h->total;
    rc = 0;
    goto done;
io_error:
    sl_fail(e, "%s: writing the pack failed: %s", tmp, strerror(errno ? errno : EIO));
    if (fd >= 0) close(fd);
    fd = -1;
    unlink(tmp);
done:
    if (fd >= 0) close(fd);
    free(tmp);
    free(rec);
    free(head);
    return rc;
}

static int read_at(int fd, void *dst, size_t n, uint64_t off) {
    uint8_t *b = dst;
    while (n) {
        ssize_t r = pread(fd, b, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int sl_pack_apply(const char *path, const sl_st_set *set, int n_layers, int n_experts, xinfo *x, int pack_file,
                  sl_err *e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : sl_fail(e, "%s: cannot open: %s", path, strerror(errno));
    pk_head h;
    pk_cell *cells = NULL;
    pk_file *files = NULL;
    int rc = -1;
    struct stat pb;
    size_t n_cells = (size_t)n_layers * (size_t)n_experts;
    if (fstat(fd, &pb) || read_at(fd, &h, sizeof h, 0) || memcmp(h.magic, MAGIC, 8)) {
        sl_fail(e, "%s is not an expert pack of this version (rerun sluice pack)", path);
        goto done;
    }
    if (h.n_layers != (uint32_t)n_layers || h.n_experts != (uint32_t)n_experts || h.n_files != (uint32_t)set->n_files ||
        (uint64_t)pb.st_size < h.total) {
        sl_fail(e, "%s was written for another checkpoint, or is incomplete (rerun sluice pack)", path);
        goto done;
    }
    files = malloc((size_t)set->n_files * sizeof *files);
    cells = malloc(n_cells * sizeof *cells);
    if (!files || !cells) {
        sl_fail(e, "out of memory reading %s", path);
        goto done;
    }
    if (read_at(fd, files, (size_t)set->n_files * sizeof *files, sizeof h) ||
        read_at(fd, cells, n_cells * sizeof *cells, sizeof h + (size_t)set->n_files * sizeof *files)) {
        sl_fail(e, "%s: cannot read its table: %s", path, strerror(errno ? errno : EIO));
        goto done;
    }
    for (int i = 0; i < set->n_files; i++) {
        struct stat sb;
        pk_file now;
        if (stat(set->paths[i], &sb)) {
            sl_fail(e, "%s: %s", set->paths[i], strerror(errno));
            goto done;
        }
        file_stamp(&sb, &now);
        if (memcmp(&now, &files[i], sizeof now)) {
            sl_fail(e, "%s changed after %s was written (rerun sluice pack)", set->paths[i], path);
            goto done;
        }
    }
    for (size_t c = 0; c < n_cells; c++) /* every piece must be the one the pack copied */
        for (int i = 0; i < NP; i++) {
            const piece *p = &x[c].p[i];
            const pk_piece *q = &cells[c].p[i];
            if (p->len != q->len || (p->len && (p->file != q->file || (p->file >= 0 && p->off != q->off)))) {
                sl_fail(e, "%s does not match expert %zu of layer %zu (rerun sluice pack)", path, c % (size_t)n_experts,
                        c / (size_t)n_experts);
                goto done;
            }
        }
    for (size_t c = 0; c < n_cells; c++)
        for (int i = 0; i < NP; i++) {
            piece *p = &x[c].p[i];
            if (!p->len) continue;
            p->file = pack_file;
            p->off = cells[c].rec + cells[c].p[i].at;
            p->mem = NULL;
        }
    rc = 1;
done:
    close(fd);
    free(files);
    free(cells);
    return rc;
}
