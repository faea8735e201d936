#include "experts/layout.h"

#include <stdlib.h>
#include <string.h>

static int file_of(const sl_st_set *set, const uint8_t *p, size_t len, uint64_t *off) {
    for (int i = 0; i < set->n_files; i++)
        if (set->maps[i] && p >= set->maps[i] && p + len <= set->maps[i] + set->map_sizes[i]) {
            *off = (uint64_t)(p - set->maps[i]);
            return i;
        }
    return -1;
}

static void set_piece(const sl_st_set *set, piece *p, const void *ptr, size_t len) {
    memset(p, 0, sizeof *p);
    p->file = -1;
    if (!ptr || !len) return;
    p->len = len;
    p->file = file_of(set, ptr, len, &p->off);
    if (p->file < 0) p->mem = ptr;
}

static int cmp_piece(const void *a, const void *b) {
    const piece *x = *(piece *const *)a, *y = *(piece *const *)b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

void sl_xinfo_describe(const sl_st_set *set, const sl_expert *ex, xinfo *xi, size_t *img_bytes, size_t *dev_bytes) {
    const sl_weight *ws[3] = {&ex->gate, &ex->up, &ex->down};
    memset(xi, 0, sizeof *xi);
    for (int i = 0; i < 3; i++) {
        const sl_weight *w = ws[i];
        piece *p = &xi->p[4 * i];
        set_piece(set, &p[0], w->data, (size_t)w->rows * w->row_bytes);
        if (w->fmt == SL_WF_MLX) {
            set_piece(set, &p[1], w->scales, sl_weight_scale_bytes(w));
            set_piece(set, &p[2], w->biases, sl_weight_scale_bytes(w));
        } else if (w->fmt == SL_WF_FP8 || w->fmt == SL_WF_MXFP4) {
            set_piece(set, &p[1], w->scales, sl_weight_scale_bytes(w));
            set_piece(set, &p[2], NULL, 0);
        } else {
            set_piece(set, &p[1], NULL, 0);
            set_piece(set, &p[2], NULL, 0);
        }
        set_piece(set, &p[3], w->bias, w->bias ? (size_t)w->rows * 4 : 0);
    }
    sl_xinfo_plan(xi, img_bytes, dev_bytes);
}

void sl_xinfo_plan(xinfo *xi, size_t *img_bytes, size_t *dev_bytes) {
    xi->n_win = 0;
    piece *sorted[NP];
    int n = 0;
    for (int i = 0; i < NP; i++)
        if (xi->p[i].len && xi->p[i].file >= 0) sorted[n++] = &xi->p[i];
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_piece);
    size_t img = 0;
    for (int i = 0; i < n; i++) {
        piece *p = sorted[i];
        uint64_t a0 = p->off / ALIGN * ALIGN, a1 = up(p->off + p->len, ALIGN);
        window *w = xi->n_win ? &xi->w[xi->n_win - 1] : NULL;
        if (w && w->file == p->file && a0 <= w->off + w->len) { /* adjacent: one read */
            if (a1 > w->off + w->len) {
                img += a1 - (w->off + w->len);
                w->len = a1 - w->off;
            }
            if (p->off + p->len > w->hi) w->hi = p->off + p->len;
        } else {
            w = &xi->w[xi->n_win++];
            *w = (window){.file = p->file, .off = a0, .lo = p->off, .hi = p->off + p->len, .len = a1 - a0, .img = img};
            img += w->len;
        }
        p->img = w->img + (p->off - w->off);
    }
    for (int i = 0; i < xi->n_win; i++) xi->w[i].at_lo = xi->w[i].img + (xi->w[i].lo - xi->w[i].off);
    for (int i = 0; i < NP; i++) /* copies held in memory go after the reads */
        if (xi->p[i].len && xi->p[i].file < 0) {
            xi->p[i].img = img;
            img = up(img + xi->p[i].len, 64);
        }
    size_t dev = 0;
    for (int i = 0; i < NP; i++)
        if (xi->p[i].len) {
            xi->p[i].dev = dev;
            dev = up(dev + xi->p[i].len, DEV_ALIGN);
        }
    xi->one_copy = xi->piece_reads = 0;
    int all = 0;
    for (int i = 0; i < NP; i++) all += xi->p[i].len != 0;
    if (xi->n_win == 1 && n == all) {
        const window *w = &xi->w[0];
        size_t base = (size_t)(w->lo - w->off) / DEV_ALIGN * DEV_ALIGN;
        int aligned = 1;
        for (int i = 0; i < NP; i++)
            if (xi->p[i].len && (xi->p[i].img - base) % DEV_ALIGN) aligned = 0;
        if (aligned) {
            for (int i = 0; i < NP; i++)
                if (xi->p[i].len) xi->p[i].dev = xi->p[i].img - base;
            xi->one_copy = 1;
            xi->copy_off = base;
            xi->copy_len = up((size_t)(w->hi - w->off) - base, DEV_ALIGN);
            dev = xi->copy_len;
        }
    }
    *img_bytes = up(img, ALIGN);
    *dev_bytes = dev;
}

/* The window of the file piece p. */
static const window *window_of(const xinfo *xi, const piece *p) {
    for (int i = 0; i < xi->n_win; i++)
        if (xi->w[i].file == p->file && p->off >= xi->w[i].lo && p->off + p->len <= xi->w[i].hi) return &xi->w[i];
    return NULL;
}

int sl_xinfo_slot_image(xinfo *xi, size_t *dev_bytes) {
    if (xi->one_copy || !xi->n_win) return 0;
    int whole = 1; /* the pieces of each window keep their distances in the slot: one residue a window */
    size_t at = 0;
    for (int i = 0; i < NP; i++) {
        const piece *p = &xi->p[i];
        const window *w = p->len && p->file >= 0 ? window_of(xi, p) : NULL;
        if (p->len && p->file >= 0 && (!w || (p->off - w->lo) % DEV_ALIGN)) whole = 0;
        if (p->len) at = p->dev + p->len;
    }
    if (!whole) { /* a read per piece, each where sl_xinfo_plan put it in the slot */
        for (int i = 0; i < NP; i++) xi->p[i].img = xi->p[i].dev;
        xi->piece_reads = xi->one_copy = 1;
        xi->copy_off = 0;
        xi->copy_len = *dev_bytes = up(at, DEV_ALIGN);
        return 1;
    }
    at = 0;
    for (int i = 0; i < xi->n_win; i++) { /* windows in file order, each on a DEV_ALIGN boundary */
        window *w = &xi->w[i];
        w->at_lo = up(at, DEV_ALIGN);
        at = w->at_lo + (size_t)(w->hi - w->lo);
    }
    for (int i = 0; i < NP; i++) {
        piece *p = &xi->p[i];
        if (!p->len) continue;
        if (p->file >= 0) {
            const window *w = window_of(xi, p);
            p->dev = p->img = w->at_lo + (size_t)(p->off - w->lo);
        } else { /* copies held in memory after the reads */
            p->dev = p->img = up(at, DEV_ALIGN);
            at = p->dev + p->len;
        }
    }
    xi->one_copy = 1;
    xi->copy_off = 0;
    xi->copy_len = up(at, DEV_ALIGN);
    *dev_bytes = xi->copy_len;
    return 1;
}
