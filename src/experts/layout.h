/* Where the pieces of one routed expert lie (data, MLX scales and biases, and bias of gate, up and
 * down) and how they are read: the 4 KiB-aligned windows that cover adjacent pieces of a file, the
 * layout of the host image the windows land in, and that of a slot in backend memory. Shared by the
 * expert store and the expert pack. */
#ifndef SLUICE_EXPERTS_LAYOUT_H
#define SLUICE_EXPERTS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "formats/safetensors.h"

#define ALIGN 4096u /* O_DIRECT: file offsets, lengths and buffers */
#define DEV_ALIGN 256u
#define NP 12 /* pieces of an expert: gate, up, down x data, scales, biases, bias */
#define MAX_WIN NP

typedef struct piece {
    int file; /* index into the checkpoint's files; -1: copied from memory (mem) */
    uint64_t off;
    size_t len;
    const uint8_t *mem;
    size_t img, dev; /* offsets in the host image and in a backend slot */
} piece;

typedef struct window { /* one read: the 4 KiB-aligned span around adjacent pieces of one file */
    int file;
    uint64_t off, lo, hi; /* aligned start; the bytes the pieces need, [lo, hi) */
    size_t len, img;      /* aligned length; offset in the host image of an aligned (O_DIRECT) read */
    size_t at_lo;         /* offset in the host image where a buffered read of [lo, hi) lands */
} window;

typedef struct xinfo {
    piece p[NP];
    window w[MAX_WIN];
    int n_win;
    /* one_copy: a slot holds the image's bytes [copy_off, copy_off + copy_len) as they are (one window
     * whose pieces sit DEV_ALIGN-aligned in it, as a pack lays them out), so one copy fills it */
    int one_copy;
    size_t copy_off, copy_len;
    int piece_reads; /* buffered reads piece by piece, each into its place in the slot's layout */
} xinfo;

static inline size_t up(size_t v, size_t a) {
    return (v + a - 1) / a * a;
}

/* The pieces of ex (whose weights point into set's mapped files, or into memory the loader filled),
 * then its windows and layouts (sl_xinfo_plan). */
void sl_xinfo_describe(const sl_st_set *set, const sl_expert *ex, xinfo *xi, size_t *img_bytes, size_t *dev_bytes);
/* The windows and both layouts for the pieces as they are now (after they were moved, e.g. to a pack). */
void sl_xinfo_plan(xinfo *xi, size_t *img_bytes, size_t *dev_bytes);
/* For buffered reads (which need no aligned destination): lays the host image out as the slot, so a
 * slot is filled by one copy of the image (one_copy): each window's [lo, hi) where its pieces belong when
 * the pieces of every window sit at one offset modulo DEV_ALIGN, else a read per piece (piece_reads).
 * 1 when it did, with the slot's bytes in *dev_bytes; 0 (nothing changed) for an expert already one
 * copy. */
int sl_xinfo_slot_image(xinfo *xi, size_t *dev_bytes);

#endif
