#include "experts/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "experts/io.h"
#include "experts/layout.h"
#include "experts/pack.h"
#include "models/fused.h"
#include "models/model.h"

#define IO_DEPTH 256
#define REF_MAX 3 /* GCLOCK: a slot survives up to this many sweeps of the hand without a hit */

enum { EMPTY = 0, LOADING, READY };

typedef struct slot {
    int layer, expert, state;
    unsigned ref;
    uint64_t pin;  /* the layer visit whose current pass needs it */
    int pending;   /* reads in flight */
    int host;      /* host entry the reads land in (backends of their own memory), -1: the slot itself */
    uint8_t *base; /* backend memory */
    uint64_t used; /* the latest pass (or queued copy) that reads base, for GPUDirect reads into it */
    sl_expert ex;  /* the expert's weights, pointing into base */
    int failed;
} slot;

typedef struct hentry { /* a pinned host image: the host cache's entry or a staging buffer */
    int layer, expert;  /* cached identity, -1: none */
    unsigned ref;
    int reading, copying; /* target of reads in flight; source of queued copies (until the next sync) */
    int pending;          /* reads of a preload in flight into it */
    uint64_t cpu_visit;   /* the layer visit whose CPU experts read it */
    uint8_t *img;
    sl_expert view; /* host reads: the cached expert's weights as they sit in img (laid out as a slot) */
    int has_view;
} hentry;

struct sl_expert_store {
    sl_model *m;
    sl_backend *be;
    sl_store_config cfg;
    int n_layers, n_experts, k_max;
    xinfo *x;               /* [layer][expert], NULL rows for dense layers */
    int *where, *ram_where; /* [layer * n_experts + expert]: slot / host entry, -1 none */
    size_t img_bytes, dev_bytes;
    int own_memory; /* backend has its own memory: slots are filled from host images */
    /* backend tier */
    slot *slots;
    int n_slots, hand, floor;
    uint8_t *arena;
    int *layer_slots; /* slots each layer holds */
    uint8_t *stale;   /* [layer]: its expert table changed since the backend last copied it */
    /* host tier / staging */
    hentry *host;
    uint8_t *host_arena; /* the images, one pinned block */
    int n_host, host_hand, ram_cache;
    /* files */
    int n_files;     /* the checkpoint's, and the pack last when there is one */
    char *pack_path; /* the expert pack the pieces point at, or NULL */
    int *fd_buf, *fd_direct;
    void **gfh; /* cuFile handles of the files (GPUDirect Storage) */
    int gds, gds_direct;
    uint64_t launches, synced; /* passes queued, and the latest one known to have run */
    sl_io *io;
    /* per layer visit */
    uint64_t visit;
    int32_t *hids, *pass_ids; /* host copies: routed ids, one pass's ids */
    int32_t *pass_host;       /* pinned ring of pass ids for queued uploads */
    int pass_ring, pass_next, max_nk;
    int32_t *pass_dev; /* backend copy of one pass's ids */
    uint64_t *mark;    /* [n_experts]: visit that listed the expert */
    int *list, *todo, *ready;
    /* prefetch */
    float *plogits, *pweights;
    int32_t *pids, *hpids;
    int pred_layer, n_pred;
    int32_t *pred;
    int idle_preds; /* guesses in a row that started no read (their experts all in slots or host memory) */
    int busy_n;
    double busy_t0;
    int first_moe, next_moe;
    uint64_t pass_stamp;
    uint64_t *pmark;  /* [n_experts]: the pass an expert belongs to */
    float *miss_rate; /* [layer]: how often a visit missed lately (decaying) */
    int *inflight;
    /* reuse: an expert routed to again within the time slots keep an expert is worth a slot more than a
     * CPU pass (auto) */
    uint32_t *last_use;  /* [layer][expert]: the step it was last routed to, 0 never */
    uint32_t *reuse_age; /* [n_experts]: this visit's experts, steps since their last use */
    uint32_t step;       /* steps through the first MoE layer */
    int step_miss;       /* this step's experts found in no slot, so far */
    double miss_step;    /* that per step, tracked */
    /* CPU experts (see sl_cpu_experts): a CPU backend of their own, the experts of one visit as views of
     * their host images, the pairs they compute and where those go */
    sl_backend *cpu;
    sl_expert *cx;
    const sl_expert **cxp; /* [n_experts]: the visit's CPU experts, NULL for the others */
    int *cpu_list, *xcnt;  /* the visit's CPU experts; pairs routed to each expert */
    int *cpu_src;          /* [n_experts]: where a CPU expert is read, host cache entry or -1: the mapping */
    int32_t *cpu_ids;      /* [max_nk]: the routed ids of the CPU's pairs, -1 for the others */
    int32_t *cpu_idx;      /* pinned: the pairs the CPU computed */
    float *cpu_rows;       /* pinned: their outputs [SL_CPU_PAIRS_MAX][hidden] */
    float *hx;             /* host copy of the layer's input */
    size_t hx_len;
    double cpu_adj; /* measured over predicted CPU time of passes of a few pairs (the ones auto plans) */
    /* device steps (see store.h) */
    int dev;           /* the current decode step runs on the device */
    int in_step;       /* a decode step is between sl_store_step_begin and _end */
    int dev_n;         /* its tokens */
    int32_t *rec_dev;  /* backend [1 + n_layers * SL_STEP_MAX * k_max]: the step's misses, then each layer's ids */
    int32_t *rec_host; /* the part of it a step fills, read back (pinned where the backend has host_alloc) */
    int *in_table;     /* [layer]: experts the layer's table holds (slots, and host cache images with host reads) */
    int host_reads;    /* device steps read host cache experts no slot holds where they are */
    int step_absent;   /* this step's experts so far that the tables lacked (a device step would miss them) */
    double clean;      /* how often decode steps lately found every expert in a slot (decaying) */
    int redo_next;     /* the next step runs a missed device step again (not counted in clean) */
    int redoing;
    int preload_failed; /* a read of sl_store_preload failed */
    /* the CPU's share of device steps (host reads with CPU experts): of the host cache experts in no slot,
     * those the CPU computes, each MoE layer handed to the host and back inside the step (moe_handoff) */
    int share_step;        /* this device step hands its layers over */
    int share_fixed;       /* the part is set (--cpu-experts on, SLUICE_CPU_SHARE), not tracked */
    float *share_host;     /* pinned: the part of the routed host cache experts the CPU takes */
    float *share_dev;      /* the backend's copy */
    float share_sent;      /* the part the backend's copy holds */
    uint8_t *own;          /* [layer * n_experts]: the CPU may compute it in device steps (pinned); NULL: no part */
    uint8_t *own_dev;      /* the backend's copy */
    int32_t *host_ids_dev; /* backend [SL_HANDOFF_PAIRS]: the pairs a layer hands over */
    sl_handoff *ho;        /* [n_layers], pinned */
    double *ho_cpu;        /* [n_layers]: the CPU's time on each layer this step */
    uint8_t *ho_buf;       /* pinned: the input and ids every layer's handoff shares */
    sl_store_stats st;
    sl_err failure;
    int failed;
};

const char *sl_io_mode_name(sl_io_mode m) {
    return m == SL_IO_DIRECT ? "direct" : m == SL_IO_BUFFERED ? "buffered" : m == SL_IO_GDS ? "gds" : "auto";
}

int sl_io_mode_parse(const char *s, sl_io_mode *out) {
    if (!strcmp(s, "buffered"))
        *out = SL_IO_BUFFERED;
    else if (!strcmp(s, "direct"))
        *out = SL_IO_DIRECT;
    else if (!strcmp(s, "gds"))
        *out = SL_IO_GDS;
    else if (!strcmp(s, "auto"))
        *out = SL_IO_AUTO;
    else
        return -1;
    return 0;
}

static int fail(sl_expert_store *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(sl_expert_store *st, const char *fmt, ...) {
    if (!st->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(st->failure.msg, sizeof st->failure.msg, fmt, ap);
        va_end(ap);
        st->failed = 1;
    }
    return -1;
}

static const sl_expert *template_of(const sl_model *m, int l, int e) {
    return &m->layers[l].moe->expert_store[e];
}

/* The expert's weights as they sit at base, laid out by offsets taken from the image or the slot. */
static void build_expert(const sl_expert *tpl, const xinfo *xi, uint8_t *base, int dev, sl_expert *out) {
    *out = *tpl;
    sl_weight *ws[3] = {&out->gate, &out->up, &out->down};
    for (int i = 0; i < 3; i++) {
        const piece *p = &xi->p[4 * i];
#define AT(j) (base + (dev ? p[j].dev : p[j].img))
        if (p[0].len) ws[i]->data = AT(0);
        if (p[1].len) ws[i]->scales = AT(1);
        if (p[2].len) ws[i]->biases = AT(2);
        if (p[3].len) ws[i]->bias = (const float *)AT(3);
#undef AT
    }
}

/* ---- tiers ---- */

static int *wh(sl_expert_store *st, int l, int e) {
    return &st->where[(size_t)l * (size_t)st->n_experts + (size_t)e];
}

/* the host cache entry of (l, e), -1 none */
static int *rwh(sl_expert_store *st, int l, int e) {
    return &st->ram_where[(size_t)l * (size_t)st->n_experts + (size_t)e];
}

/* Entry x of layer l's table changed: the backend's copy must take it (see sl_expert_table's track). */
static void changed(sl_expert_store *st, int l, int x) {
    sl_expert_table *t = &st->m->layers[l].moe->experts;
    if (x < t->lo) t->lo = x;
    if (x + 1 > t->hi) t->hi = x + 1;
    st->stale[l] = 1;
}

/* Hands layer l's table to the backend when it changed since the last time (backends that read it from
 * their own copy); then nothing is pending. */
static int place(sl_expert_store *st, int l, sl_err *e) {
    sl_backend *be = st->be;
    sl_expert_table *t = &st->m->layers[l].moe->experts;
    if (!st->stale[l] || (!be->ops->place_experts && !st->own_dev)) return 0;
    if (be->ops->place_experts && be->ops->place_experts(be, t, e)) return -1;
    if (st->own_dev) { /* which of its experts the CPU may compute */
        size_t row = (size_t)l * (size_t)st->n_experts;
        be->ops->upload_async(be, st->own_dev + row, st->own + row, (size_t)st->n_experts);
    }
    t->lo = t->n_experts;
    t->hi = 0;
    st->stale[l] = 0;
    return 0;
}

/* Entry x of layer l's table: the expert in its slot once read, else with host reads its host cache image,
 * else none. */
static void table_set(sl_expert_store *st, int l, int x) {
    sl_expert_table *t = &st->m->layers[l].moe->experts;
    const sl_expert *v = NULL;
    int si = *wh(st, l, x), r = *rwh(st, l, x), o = 0;
    uint8_t *own = st->own ? &st->own[(size_t)l * (size_t)st->n_experts + (size_t)x] : &(uint8_t){0};
    if (si >= 0 && st->slots[si].state == READY) {
        v = &st->slots[si].ex;
    } else if (st->host_reads && r >= 0 && st->host[r].has_view && !st->host[r].reading) {
        v = &st->host[r].view;
        o = st->own != NULL; /* the CPU may take it instead (see moe_guard) */
    }
    if (v == t->experts[x] && o == *own) return;
    st->in_table[l] += (v != NULL) - (t->experts[x] != NULL);
    t->experts[x] = v;
    *own = (uint8_t)o;
    changed(st, l, x);
}

static void evict_slot(sl_expert_store *st, slot *s) {
    if (s->state == EMPTY) return;
    int l = s->layer, x = s->expert;
    *wh(st, l, x) = -1;
    st->layer_slots[l]--;
    s->state = EMPTY;
    s->layer = s->expert = -1;
    table_set(st, l, x);
}

/* GCLOCK over the slots: a hit sets a slot's count, the hand takes one off per pass and takes a slot
 * at zero, so experts used often outlive ones used once. Slots the current pass needs, slots still
 * being read, and a layer's last `floor` slots (so one layer's burst cannot empty the others) are
 * skipped. -1 when every slot is taken. */
static int victim(sl_expert_store *st) {
    int n = st->n_slots;
    for (int tries = 0; tries < (REF_MAX + 2) * n; tries++) {
        int i = st->hand;
        st->hand = (st->hand + 1) % n;
        slot *s = &st->slots[i];
        if (s->state == EMPTY) return i;
        if (s->state == LOADING || s->pin == st->visit) continue;
        if (s->ref) {
            s->ref--;
            continue;
        }
        if (st->layer_slots[s->layer] <= st->floor && tries < (REF_MAX + 1) * n) continue;
        return i;
    }
    return -1;
}

static int host_victim(sl_expert_store *st) {
    int n = st->n_host;
    for (int tries = 0; tries < (REF_MAX + 2) * n; tries++) {
        int i = st->host_hand;
        st->host_hand = (st->host_hand + 1) % n;
        hentry *h = &st->host[i];
        if (h->reading || h->copying || (h->cpu_visit && h->cpu_visit == st->visit)) continue;
        if (h->layer < 0) return i;
        if (h->ref) {
            h->ref--;
            continue;
        }
        return i;
    }
    return -1;
}

/* The entry no longer caches its expert. Only ever outside a device step, whose kernels are the only ones
 * that read host cache images through the tables (host-driven passes take experts in slots). */
static void host_forget(sl_expert_store *st, hentry *h) {
    int l = h->layer, x = h->expert;
    if (l >= 0) *rwh(st, l, x) = -1;
    h->layer = h->expert = -1;
    h->has_view = 0;
    if (l >= 0) table_set(st, l, x);
}

/* Every queued copy has run (the backend was synchronised). */
static void copies_done(sl_expert_store *st) {
    for (int i = 0; i < st->n_host; i++) st->host[i].copying = 0;
    st->pass_next = 0;
    st->synced = st->launches;
}

static int backend_sync(sl_expert_store *st) {
    sl_err e;
    double t0 = sl_now();
    int rc = st->be->ops->sync ? st->be->ops->sync(st->be, &e) : 0;
    st->st.sync_s += sl_now() - t0;
    if (rc) return fail(st, "%s", e.msg);
    copies_done(st);
    return 0;
}

/* ---- reads ---- */

static void busy_begin(sl_expert_store *st) {
    if (!st->busy_n++) st->busy_t0 = sl_now();
}

static void busy_end(sl_expert_store *st) {
    if (!--st->busy_n) st->st.read_busy_s += sl_now() - st->busy_t0;
}

/* With host reads, the image of h (its expert's bytes all in) as the backend reads it: laid out as a slot
 * from copy_off on. */
static void host_view(sl_expert_store *st, hentry *h, const xinfo *xi) {
    h->has_view = st->host_reads && xi->one_copy;
    if (h->has_view) build_expert(template_of(st->m, h->layer, h->expert), xi, h->img + xi->copy_off, 1, &h->view);
}

/* A preloaded host entry's reads are all in: its expert joins the table where no slot holds it. */
static void host_loaded(sl_expert_store *st, int r) {
    hentry *h = &st->host[r];
    h->reading = 0;
    host_view(st, h, &st->x[(size_t)h->layer * (size_t)st->n_experts + (size_t)h->expert]);
    table_set(st, h->layer, h->expert);
}

/* The slot's bytes are all in: copy them into backend memory when they landed in a host image, and
 * hand the expert to its layer's table. */
static void loaded_run(sl_expert_store *st, int si) {
    slot *s = &st->slots[si];
    const xinfo *xi = &st->x[(size_t)s->layer * (size_t)st->n_experts + (size_t)s->expert];
    if (s->failed) {
        evict_slot(st, s);
        if (s->host >= 0) st->host[s->host].reading = 0;
        s->failed = 0;
        return;
    }
    if (s->host >= 0) {
        hentry *h = &st->host[s->host];
        if (xi->one_copy) {
            st->be->ops->upload_async(st->be, s->base, h->img + xi->copy_off, xi->copy_len);
            st->st.copies++;
        } else {
            for (int i = 0; i < NP; i++)
                if (xi->p[i].len) {
                    st->be->ops->upload_async(st->be, s->base + xi->p[i].dev, h->img + xi->p[i].img, xi->p[i].len);
                    st->st.copies++;
                }
        }
        st->st.bytes_copied += st->dev_bytes;
        h->reading = 0;
        h->copying = 1;
        if (st->ram_cache) { /* the image stays as the host cache's copy */
            h->layer = s->layer;
            h->expert = s->expert;
            h->ref = 0;
            st->ram_where[(size_t)s->layer * (size_t)st->n_experts + (size_t)s->expert] = s->host;
            host_view(st, h, xi);
        }
        s->host = -1;
    }
    build_expert(template_of(st->m, s->layer, s->expert), xi, s->base, st->own_memory, &s->ex);
    s->state = READY;
    table_set(st, s->layer, s->expert);
}

/* loaded_run, its time (copies and table entries issued) counted apart */
static void loaded(sl_expert_store *st, int si) {
    double t0 = sl_now();
    loaded_run(st, si);
    st->st.issue_s += sl_now() - t0;
}

static const char *path_of(sl_expert_store *st, int file) {
    return file < st->m->st->n_files ? st->m->st->paths[file] : st->pack_path;
}

/* Tags of reads: the owner (a slot, or with FILL_TAG a host entry being preloaded) << 8 | which read
 * (a window, or with bit 7 a piece). */
#define FILL_TAG ((uint64_t)1 << 62)

/* Takes one finished read. */
static int reap(sl_expert_store *st) {
    uint64_t tag;
    int64_t res;
    double t0 = sl_now(); /* any wait for a read, wherever the forward pass needs one, is a stall */
    if (sl_io_wait(st->io, &tag, &res)) return fail(st, "waiting for expert reads failed");
    st->st.stall_s += sl_now() - t0;
    busy_end(st);
    int fill = (tag & FILL_TAG) != 0, owner = (int)((tag & ~FILL_TAG) >> 8), wi = (int)(tag & 255);
    slot *s = fill ? NULL : &st->slots[owner];
    hentry *h = fill ? &st->host[owner] : NULL;
    int l = fill ? h->layer : s->layer, x = fill ? h->expert : s->expert, bad = 1;
    const xinfo *xi = &st->x[(size_t)l * (size_t)st->n_experts + (size_t)x];
    /* a window, or a piece (GPUDirect reads, buffered reads piece by piece: tags of pieces have the high bit) */
    int file;
    uint64_t lo, hi, start;
    if (wi & 128) {
        const piece *p = &xi->p[wi & 127];
        file = p->file;
        start = lo = p->off;
        hi = p->off + p->len;
    } else {
        const window *w = &xi->w[wi];
        file = w->file;
        lo = w->lo;
        hi = w->hi;
        start = st->cfg.io == SL_IO_DIRECT ? w->off : w->lo;
    }
    if (res < 0) {
        fail(st, "%s: reading expert %d of layer %d (bytes %llu to %llu) failed: %s", path_of(st, file), x, l,
             (unsigned long long)lo, (unsigned long long)hi, strerror((int)-res));
    } else if (start + (uint64_t)res < hi) {
        fail(st,
             "%s: the file ends at byte %llu, but expert %d of layer %d lies at bytes %llu to %llu (was the file "
             "truncated or replaced?)",
             path_of(st, file), (unsigned long long)(start + (uint64_t)res), x, l, (unsigned long long)lo,
             (unsigned long long)hi);
    } else {
        st->st.bytes_read += (uint64_t)res;
        bad = 0;
    }
    if (fill) {
        st->preload_failed |= bad;
        if (!--h->pending && !st->preload_failed) host_loaded(st, owner);
        return 0;
    }
    s->failed |= bad;
    if (!--s->pending) loaded(st, owner);
    return 0;
}

static int file_fd(sl_expert_store *st, int file, int direct) {
    int *fd = direct ? &st->fd_direct[file] : &st->fd_buf[file];
    if (*fd < 0) {
        *fd = open(path_of(st, file), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
        if (*fd < 0)
            return fail(st, "%s: cannot open for reading experts%s: %s", path_of(st, file),
                        direct ? " with O_DIRECT" : "", strerror(errno));
    }
    return *fd;
}

/* The file's cuFile handle, registered on first use. */
static void *file_gfh(sl_expert_store *st, int file) {
    if (!st->gfh[file]) {
        int fd = file_fd(st, file, 1);
        if (fd < 0) return NULL;
        sl_err e;
        if (!(st->gfh[file] = st->be->ops->gds_file(st->be, fd, &e))) fail(st, "%s: %s", path_of(st, file), e.msg);
    }
    return st->gfh[file];
}

/* Queues one read (tag: see FILL_TAG) for its owner (through cuFile when fh is set, else from fd), waiting
 * for room first. */
static int queue_read(sl_expert_store *st, int fd, void *fh, uint64_t off, size_t len, void *dst, uint64_t tag) {
    while (fh ? sl_io_read_fh(st->io, fh, off, len, dst, tag) : sl_io_read(st->io, fd, off, len, dst, tag))
        if (reap(st)) return -1; /* the queue is full */
    busy_begin(st);
    int owner = (int)((tag & ~FILL_TAG) >> 8);
    if (tag & FILL_TAG)
        st->host[owner].pending++;
    else
        st->slots[owner].pending++;
    st->st.reads++;
    return 0;
}

/* Queues the reads of expert xi into the image dst (tag0: their tag but the read's index, see FILL_TAG): a
 * read per piece or per window, pieces held in memory copied. *failed is set when a file cannot be opened. */
static int queue_expert(sl_expert_store *st, const xinfo *xi, uint8_t *dst, uint64_t tag0, int *failed) {
    for (int i = 0; i < NP; i++)
        if (xi->p[i].len && xi->p[i].file < 0) memcpy(dst + xi->p[i].img, xi->p[i].mem, xi->p[i].len);
    int direct = st->cfg.io == SL_IO_DIRECT;
    for (int i = 0; xi->piece_reads && i < NP; i++) { /* buffered, each piece into its place in the slot */
        const piece *p = &xi->p[i];
        if (!p->len || p->file < 0) continue;
        int fd = file_fd(st, p->file, 0);
        if (fd < 0) {
            *failed = 1;
            return 0;
        }
        if (queue_read(st, fd, NULL, p->off, p->len, dst + p->img, tag0 | 128u | (uint64_t)i)) return -1;
    }
    for (int wi = 0; !xi->piece_reads && wi < xi->n_win; wi++) {
        const window *w = &xi->w[wi];
        int fd = file_fd(st, w->file, direct);
        if (fd < 0) {
            *failed = 1;
            return 0;
        }
        uint64_t off = direct ? w->off : w->lo;
        size_t len = direct ? w->len : (size_t)(w->hi - w->lo);
        if (queue_read(st, fd, NULL, off, len, dst + (direct ? w->img : w->at_lo), tag0 | (uint64_t)wi)) return -1;
    }
    return 0;
}

/* Sends the queued reads of slot si off; a slot with none left (or none at all) is loaded now. */
static void reads_queued(sl_expert_store *st, int si) {
    sl_io_submit(st->io);
    if (!st->slots[si].pending) loaded(st, si);
}

/* GPUDirect reads of every piece straight into the slot; pieces held in memory are copied. The writes
 * are not ordered with the backend's queue, so a slot that queued work may still read waits for it. */
static int start_load_gds(sl_expert_store *st, int si, const xinfo *xi) {
    slot *s = &st->slots[si];
    for (int i = 0; i < NP; i++) {
        const piece *p = &xi->p[i];
        if (!p->len) continue;
        if (p->file < 0) {
            st->be->ops->upload_async(st->be, s->base + p->dev, p->mem, p->len);
            s->used = ++st->launches;
            continue;
        }
        void *fh = file_gfh(st, p->file);
        if (!fh) {
            s->failed = 1;
            break;
        }
        if (queue_read(st, -1, fh, p->off, p->len, s->base + p->dev, ((uint64_t)si << 8) | 128u | (uint64_t)i))
            return -1;
    }
    reads_queued(st, si);
    return 0;
}

/* Starts filling slot si with expert e of layer l: from the host cache, or by reads of its windows. */
static int start_load_run(sl_expert_store *st, int si, int l, int e, int ahead) {
    slot *s = &st->slots[si];
    if (st->gds && s->used > st->synced && backend_sync(st)) return -1;
    evict_slot(st, s);
    const xinfo *xi = &st->x[(size_t)l * (size_t)st->n_experts + (size_t)e];
    s->layer = l;
    s->expert = e;
    s->state = LOADING;
    s->ref = 0;
    s->pending = 0;
    s->host = -1;
    s->failed = 0;
    *wh(st, l, e) = si;
    st->layer_slots[l]++;
    uint8_t *dst = s->base;
    if (st->gds) {
        st->st.misses += !ahead;
        st->st.prefetched += ahead != 0;
        return start_load_gds(st, si, xi);
    }
    if (st->own_memory) {
        int r = st->ram_cache ? st->ram_where[(size_t)l * (size_t)st->n_experts + (size_t)e] : -1;
        if (r >= 0 && !st->host[r].reading) { /* host cache hit: one copy per piece */
            hentry *h = &st->host[r];
            if (h->ref < REF_MAX) h->ref++;
            s->host = r;
            h->reading = 1;
            st->st.hits_ram += !ahead;
            loaded(st, si);
            return 0;
        }
        int h = host_victim(st);
        while (h < 0) { /* every image is being read into or copied from: wait for reads, then copies */
            if (sl_io_pending(st->io)) {
                if (reap(st)) return -1;
            } else if (backend_sync(st)) {
                return -1;
            } else if ((h = host_victim(st)) < 0) {
                return fail(st, "no host buffer is free for reading an expert");
            }
            if (h < 0) h = host_victim(st);
        }
        host_forget(st, &st->host[h]);
        st->host[h].reading = 1;
        s->host = h;
        dst = st->host[h].img;
    }
    st->st.misses += !ahead;
    st->st.prefetched += ahead != 0;
    if (queue_expert(st, xi, dst, (uint64_t)si << 8, &s->failed)) return -1;
    reads_queued(st, si);
    return 0;
}

/* start_load_run, its own time (reads queued, buffers found) counted apart from the copies it issues
 * and the waits it makes */
static int start_load(sl_expert_store *st, int si, int l, int e, int ahead) {
    double t0 = sl_now(), i0 = st->st.issue_s, w0 = st->st.stall_s + st->st.sync_s;
    int rc = start_load_run(st, si, l, e, ahead);
    st->st.submit_s += sl_now() - t0 - (st->st.issue_s - i0) - (st->st.stall_s + st->st.sync_s - w0);
    return rc;
}

/* Waits until slot si is read (or failed). */
static int wait_slot(sl_expert_store *st, int si) {
    while (st->slots[si].state == LOADING && st->slots[si].pending)
        if (reap(st)) return -1;
    return 0;
}

/* ---- creation ---- */

static int64_t gds_reader(void *ctx, void *fh, void *dst, size_t len, uint64_t off) {
    sl_expert_store *st = ctx;
    return st->be->ops->gds_read(st->be, fh, dst, len, off);
}

/* Registers every file with cuFile; on failure drops them again and says why. */
static int gds_register_all(sl_expert_store *st, sl_err *e) {
    for (int i = 0; i < st->n_files; i++) {
        int fd = open(path_of(st, i), O_RDONLY | O_CLOEXEC | O_DIRECT);
        /* a file system without O_DIRECT (tmpfs): cuFile's compatibility mode reads it buffered */
        if (fd < 0 && errno == EINVAL && !st->gds_direct) fd = open(path_of(st, i), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            sl_fail(e, "%s: cannot open with O_DIRECT for GPUDirect reads: %s", path_of(st, i), strerror(errno));
        } else {
            st->fd_direct[i] = fd;
            sl_err ge;
            if ((st->gfh[i] = st->be->ops->gds_file(st->be, fd, &ge))) continue;
            sl_fail(e, "%s: %s", path_of(st, i), ge.msg);
        }
        for (int j = 0; j <= i; j++) {
            if (st->gfh[j]) st->be->ops->gds_file_close(st->be, st->gfh[j]);
            st->gfh[j] = NULL;
        }
        return -1;
    }
    return 0;
}

/* GPUDirect Storage when forced (failing with why it cannot be had), or in auto mode where the driver
 * moves bytes without host memory and no host cache was asked for (else silently off). */
static int choose_gds(sl_expert_store *st, const sl_store_config *cfg, sl_err *e) {
    const sl_backend_ops *op = st->be->ops;
    int forced = cfg->io == SL_IO_GDS;
    if (!forced && (cfg->io != SL_IO_AUTO || cfg->ram_bytes > 0)) return 0;
    if (!st->own_memory || !op->gds_open || !op->gds_file || !op->gds_read) {
        if (!forced) return 0;
        return sl_fail(e, "--io gds reads experts straight into GPU memory, which the %s backend does not have",
                       op->name);
    }
    if (forced && cfg->ram_bytes > 0)
        return sl_fail(e,
                       "--io gds reads experts straight into GPU memory, so there is no host cache for --ram to size");
    int direct = 0;
    sl_err ge;
    if (op->gds_open(st->be, &direct, &ge)) return forced ? sl_fail(e, "--io gds: %s", ge.msg) : 0;
    if (!forced && !direct) return 0; /* cuFile's compatibility mode is slower than our own reads */
    st->gds_direct = direct;
    if (gds_register_all(st, &ge)) return forced ? sl_fail(e, "--io gds: %s", ge.msg) : 0;
    st->gds = 1;
    return 0;
}

/* The CPU experts' time for m tokens of one expert, as the planner predicts it. */
static double cpu_cost(const sl_expert_store *st, int m) {
    return (st->st.cpu_t1_s + (double)(m - 1) * st->st.cpu_tm_s) * st->cpu_adj;
}

/* The host copy of n tokens of the layer's input (grown as needed). */
static float *host_input(sl_expert_store *st, size_t floats) {
    if (floats > st->hx_len) {
        float *p = realloc(st->hx, floats * sizeof *p);
        if (!p) return NULL;
        st->hx = p;
        st->hx_len = floats;
    }
    return st->hx;
}

/* The best of three runs of the CPU computing expert 0 of the first MoE layer (from the checkpoint's
 * mapping) for n tokens. */
static double time_cpu_expert(sl_expert_store *st, int n, const int32_t *ids, sl_err *e) {
    const sl_config *c = &st->m->cfg;
    sl_moe *L = st->m->layers[st->first_moe].moe;
    sl_expert_table t = L->experts;
    t.experts = st->cxp;
    st->cxp[0] = template_of(st->m, st->first_moe, 0);
    double best = -1;
    for (int r = 0; r < 3; r++) {
        double t0 = sl_now();
        st->cpu->ops->moe_pairs(st->cpu, &t, st->hx, n, c->hidden, ids, c->top_k);
        double dt = sl_now() - t0;
        if (best < 0 || dt < best) best = dt;
    }
    st->cxp[0] = NULL;
    return st->cpu->ops->check(st->cpu, e) ? -1 : best;
}

/* What one expert's copy from a host image into a slot takes (4 copies into the first slot, as a host
 * cache hit makes them), for the planner and for bench's predictions. */
static int measure_copy(sl_expert_store *st, sl_err *e) {
    sl_backend *be = st->be;
    size_t bytes = st->dev_bytes < st->img_bytes ? st->dev_bytes : st->img_bytes;
    int reps = 4;
    double t0 = sl_now();
    for (int i = 0; i < reps; i++) be->ops->upload_async(be, st->slots[0].base, st->host[0].img, bytes);
    if (be->ops->sync(be, e)) return sl_wrap(e, "measuring expert copies");
    st->st.copy_s = (sl_now() - t0) / reps;
    return 0;
}

/* CPU experts: their backend and buffers, and the planner's costs measured once: copying one expert into
 * a slot, and computing one on the CPU for one token and for eight. */
static int cpu_setup(sl_expert_store *st, sl_err *e) {
    sl_backend *be = st->be;
    const sl_config *c = &st->m->cfg;
    int H = c->hidden, k = c->top_k, E = st->n_experts;
    /* all cores but one by default: the reads' threads and the GPU's launches keep one */
    int threads = st->cfg.cpu_threads;
    if (threads <= 0 && !getenv("SLUICE_THREADS")) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc > 1 ? (int)nc - 1 : 1;
    }
    if (sl_cpu_backend_create(threads, &st->cpu, e)) return -1;
    st->cx = calloc((size_t)E, sizeof *st->cx);
    st->cxp = calloc((size_t)E, sizeof *st->cxp);
    st->cpu_list = malloc((size_t)E * sizeof *st->cpu_list);
    st->xcnt = calloc((size_t)E, sizeof *st->xcnt);
    st->cpu_src = calloc((size_t)E, sizeof *st->cpu_src);
    st->cpu_idx = be->ops->host_alloc(be, SL_CPU_PAIRS_MAX * sizeof *st->cpu_idx);
    st->cpu_rows = be->ops->host_alloc(be, (size_t)SL_CPU_PAIRS_MAX * (size_t)H * sizeof *st->cpu_rows);
    int32_t *ids = malloc((size_t)8 * (size_t)k * sizeof *ids);
    if (!st->cx || !st->cxp || !st->cpu_list || !st->xcnt || !st->cpu_src || !st->cpu_idx || !st->cpu_rows || !ids ||
        !host_input(st, (size_t)8 * (size_t)H)) {
        free(ids);
        return sl_fail(e, "out of memory for the CPU experts");
    }
    /* the CPU: one token, then eight, each routed to expert 0 once */
    for (int i = 0; i < 8 * H; i++) st->hx[i] = 0.01f * (float)(i % 13) - 0.06f;
    for (int i = 0; i < 8 * k; i++) ids[i] = i % k ? -1 : 0;
    st->cpu_adj = 1.0;
    double w = time_cpu_expert(st, 1, ids, e); /* the first run also brings the weights in */
    double t1 = w < 0 ? -1 : time_cpu_expert(st, 1, ids, e), t8 = t1 < 0 ? -1 : time_cpu_expert(st, 8, ids, e);
    free(ids);
    if (t8 < 0) return sl_wrap(e, "measuring the CPU experts");
    st->st.cpu_t1_s = t1;
    st->st.cpu_tm_s = t8 > t1 ? (t8 - t1) / 7 : 0;
    return 0;
}

/* The CPU's share of device steps: on, every host cache expert in no slot; auto, the part that balances
 * an expert's measured copy over PCIe (as the GPU's reads of it cost about the same) against its CPU
 * time; SLUICE_CPU_SHARE (0 to 1) sets the part. */
static int share_setup(sl_expert_store *st, sl_err *e) {
    sl_backend *be = st->be;
    size_t cells = (size_t)st->n_layers * (size_t)st->n_experts;
    size_t hb = (size_t)st->n_layers * sizeof(sl_handoff),
           xb = (size_t)SL_HANDOFF_PAIRS * (size_t)st->m->cfg.hidden * sizeof(float);
    st->own = be->ops->host_alloc(be, cells);
    st->own_dev = be->ops->alloc(be, cells);
    st->ho = be->ops->host_alloc(be, hb);
    st->ho_cpu = calloc((size_t)st->n_layers, sizeof *st->ho_cpu);
    st->ho_buf = be->ops->host_alloc(be, xb + SL_HANDOFF_PAIRS * sizeof(int32_t) + sizeof(float));
    st->host_ids_dev = be->ops->alloc(be, SL_HANDOFF_PAIRS * sizeof(int32_t));
    st->share_dev = be->ops->alloc(be, sizeof(float));
    if (!st->own || !st->own_dev || !st->ho || !st->ho_cpu || !st->ho_buf || !st->host_ids_dev || !st->share_dev)
        return sl_fail(e, "out of memory for the CPU's part of decode steps");
    memset(st->own, 0, cells); /* own_dev comes zeroed from alloc */
    memset(st->ho, 0, hb);
    for (int l = 0; l < st->n_layers; l++) {
        st->ho[l].x = (float *)(void *)st->ho_buf;
        st->ho[l].ids = (int32_t *)(void *)(st->ho_buf + xb);
    }
    /* the part the CPU takes: on, all; auto, tracked (see share_track) from where an expert's measured
     * copy (the GPU's reads of it over PCIe cost about as much) and its CPU time balance */
    st->share_host = (float *)(void *)(st->ho_buf + xb + SL_HANDOFF_PAIRS * sizeof(int32_t));
    const char *env = getenv("SLUICE_CPU_SHARE");
    st->share_fixed = (env && *env) || st->cfg.cpu_experts == SL_CPU_EXPERTS_ON;
    double f = env && *env                                ? atof(env)
               : st->cfg.cpu_experts == SL_CPU_EXPERTS_ON ? 1.0
                                                          : st->st.copy_s / (st->st.copy_s + st->st.cpu_t1_s + 1e-12);
    *st->share_host = (float)(f < 0 ? 0 : f > 1 ? 1 : f);
    st->share_sent = *st->share_host;
    be->ops->upload_async(be, st->share_dev, st->share_host, sizeof(float));
    return 0;
}

int sl_store_create(sl_model *m, const sl_store_config *cfg, sl_expert_store **out, sl_err *e) {
    sl_expert_store *st = calloc(1, sizeof *st);
    if (!st) return sl_fail(e, "out of memory");
    st->m = m;
    st->be = m->be;
    st->cfg = *cfg;
    st->own_memory = m->be->ops->place_weight != NULL || cfg->staged;
    if (st->own_memory && (!m->be->ops->host_alloc || !m->be->ops->upload_async || !m->be->ops->sync)) {
        sl_store_free(st);
        return sl_fail(e, "the %s backend cannot stream experts (it has no asynchronous copies)", m->be->ops->name);
    }
    st->n_layers = m->cfg.n_layers;
    int moe_layers = 0;
    for (int l = 0; l < st->n_layers; l++)
        if (m->layers[l].moe) {
            moe_layers++;
            if (m->layers[l].moe->experts.n_experts > st->n_experts)
                st->n_experts = m->layers[l].moe->experts.n_experts;
        }
    st->k_max = m->cfg.top_k;
    size_t cells = (size_t)st->n_layers * (size_t)st->n_experts;
    st->x = calloc(cells, sizeof *st->x);
    st->where = malloc(cells * sizeof *st->where);
    st->ram_where = malloc(cells * sizeof *st->ram_where);
    st->layer_slots = calloc((size_t)st->n_layers, sizeof *st->layer_slots);
    st->in_table = calloc((size_t)st->n_layers, sizeof *st->in_table);
    st->stale = malloc((size_t)st->n_layers);
    st->n_files = m->st->n_files;
    st->fd_buf = malloc((size_t)(st->n_files + 1) * sizeof(int)); /* one more for a pack */
    st->fd_direct = malloc((size_t)(st->n_files + 1) * sizeof(int));
    st->gfh = calloc((size_t)st->n_files + 1, sizeof *st->gfh);
    for (int i = 0; st->fd_buf && st->fd_direct && i <= st->n_files; i++) st->fd_buf[i] = st->fd_direct[i] = -1;
    st->mark = calloc((size_t)st->n_experts, sizeof *st->mark);
    st->pmark = calloc((size_t)st->n_experts, sizeof *st->pmark);
    st->miss_rate = malloc((size_t)st->n_layers * sizeof *st->miss_rate);
    st->last_use = calloc(cells, sizeof *st->last_use);
    st->reuse_age = calloc((size_t)st->n_experts, sizeof *st->reuse_age);
    st->inflight = malloc((size_t)st->n_experts * sizeof(int));
    st->list = malloc((size_t)st->n_experts * sizeof(int) * 3);
    st->pred = malloc((size_t)(st->k_max + 1) * sizeof *st->pred);
    if (!st->x || !st->where || !st->ram_where || !st->layer_slots || !st->stale || !st->fd_buf || !st->fd_direct ||
        !st->gfh || !st->mark || !st->list || !st->pred || !st->pmark || !st->inflight || !st->miss_rate ||
        !st->last_use || !st->reuse_age || !st->in_table) {
        sl_store_free(st);
        return sl_fail(e, "out of memory describing the experts");
    }
    st->todo = st->list + st->n_experts;
    st->ready = st->todo + st->n_experts;
    for (size_t i = 0; i < cells; i++) st->where[i] = st->ram_where[i] = -1;
    for (int l = 0; l < st->n_layers; l++) {
        st->miss_rate[l] = 1.0f;
        st->stale[l] = 1;
    }
    st->pred_layer = -1;
    st->clean = 1.0;         /* device steps are tried first: three that miss in a row turn them off a while */
    double expert_bytes = 0; /* read in all, windows included */
    for (int l = 0; l < st->n_layers; l++) {
        sl_moe *L = m->layers[l].moe;
        for (int x = 0; L && x < L->experts.n_experts; x++) {
            size_t ib, db;
            sl_xinfo_describe(m->st, template_of(m, l, x), &st->x[(size_t)l * (size_t)st->n_experts + (size_t)x], &ib,
                              &db);
            if (ib > st->img_bytes) st->img_bytes = ib;
            if (db > st->dev_bytes) st->dev_bytes = db;
            L->experts.experts[x] = NULL; /* present only while in a slot */
            L->experts.track = 1;
            L->experts.lo = L->experts.n_experts;
            L->experts.hi = 0;
        }
    }
    /* an expert pack beside the checkpoint: each expert one read */
    char *pk = sl_pack_path(m->st);
    sl_err pe;
    int packed = pk ? sl_pack_apply(pk, m->st, st->n_layers, st->n_experts, st->x, st->n_files, &pe) : 0;
    if (packed < 0) fprintf(stderr, "sluice: %s; reading the experts from the checkpoint itself\n", pe.msg);
    if (packed > 0) {
        st->pack_path = pk;
        pk = NULL;
        st->n_files++;
        st->img_bytes = st->dev_bytes = 0;
        for (size_t i = 0; i < cells; i++) {
            size_t ib, db;
            if (!st->x[i].n_win) continue;
            sl_xinfo_plan(&st->x[i], &ib, &db);
            if (ib > st->img_bytes) st->img_bytes = ib;
            if (db > st->dev_bytes) st->dev_bytes = db;
        }
    }
    free(pk);
    st->st.packed = packed > 0;
    for (size_t i = 0; i < cells; i++)
        for (int w = 0; w < st->x[i].n_win; w++) expert_bytes += (double)st->x[i].w[w].len;
    if (choose_gds(st, cfg, e)) {
        sl_store_free(st);
        return -1;
    }
    /* auto: buffered reads while the page cache can hold the experts; beyond that every miss is a disk
     * read that also evicts what the cache held, so O_DIRECT */
    if (st->gds)
        st->cfg.io = SL_IO_GDS;
    else if (st->cfg.io == SL_IO_AUTO)
        st->cfg.io = expert_bytes > 0.8 * sl_mem_available() ? SL_IO_DIRECT : SL_IO_BUFFERED;
    /* buffered reads land wherever they are sent: a host image laid out as the slot fills it in one copy */
    if (st->own_memory && !st->gds && st->cfg.io == SL_IO_BUFFERED)
        for (size_t i = 0; i < cells; i++) {
            size_t db;
            if (!st->x[i].n_win || !sl_xinfo_slot_image(&st->x[i], &db)) continue;
            if (db > st->dev_bytes) st->dev_bytes = db;
            if (up(db, ALIGN) > st->img_bytes) st->img_bytes = up(db, ALIGN);
        }
    size_t slot_bytes = st->own_memory ? up(st->dev_bytes, DEV_ALIGN) : st->img_bytes;
    int64_t n_slots = cfg->n_slots > 0 ? cfg->n_slots : slot_bytes ? cfg->slot_bytes_budget / (int64_t)slot_bytes : 0;
    int64_t total = (int64_t)moe_layers * st->n_experts;
    if (n_slots > total) n_slots = total;
    char b1[32], b2[32], b3[32];
    if (n_slots < st->k_max) {
        sl_fail(e,
                "the expert cache of %s holds %lld experts of %s, but a token routes to %d per layer (at least %s "
                "needed for experts)",
                sl_human_bytes((double)cfg->slot_bytes_budget, b1, sizeof b1), (long long)n_slots,
                sl_human_bytes((double)slot_bytes, b2, sizeof b2), st->k_max,
                sl_human_bytes((double)slot_bytes * st->k_max, b3, sizeof b3));
        sl_store_free(st);
        return -1;
    }
    st->n_slots = (int)n_slots;
    st->floor = moe_layers ? st->n_slots / (moe_layers * 4) : 0;
    if (st->floor > st->k_max) st->floor = st->k_max;
    st->slots = calloc((size_t)st->n_slots, sizeof *st->slots);
    if (!st->slots) {
        sl_store_free(st);
        return sl_fail(e, "out of memory");
    }
    size_t arena = slot_bytes * (size_t)st->n_slots;
    if (st->own_memory)
        st->arena = m->be->ops->alloc(m->be, arena);
    else
        st->arena = aligned_alloc(ALIGN, arena);
    if (!st->arena) {
        sl_err ce;
        if (st->own_memory) m->be->ops->check(m->be, &ce);
        sl_fail(e, "out of %s memory for %d expert slots (%s)", st->own_memory ? "backend" : "host", (int)n_slots,
                sl_human_bytes((double)arena, b1, sizeof b1));
        sl_store_free(st);
        return -1;
    }
    for (int i = 0; i < st->n_slots; i++) {
        st->slots[i] = (slot){.layer = -1, .expert = -1, .host = -1, .base = st->arena + slot_bytes * (size_t)i};
    }
    if (st->own_memory && !st->gds) { /* GPUDirect reads need no host images */
        /* the host cache, or without one enough staging images for the reads of a few layers */
        int64_t n_ram = cfg->ram_bytes > 0 ? cfg->ram_bytes / (int64_t)st->img_bytes : 0;
        if (n_ram > total) n_ram = total;
        /* staging: a few layers' misses and reads ahead in flight or being copied before a buffer must
         * wait for the backend's queue to drain */
        int stage = 8 * st->k_max > 64 ? 8 * st->k_max : 64;
        /* one pinned block; a default-sized cache halves until the system grants it */
        for (;;) {
            st->n_host = (int)(n_ram > stage ? n_ram : stage);
            st->host_arena = m->be->ops->host_alloc(m->be, st->img_bytes * (size_t)st->n_host);
            if (st->host_arena || !cfg->ram_auto || n_ram == 0) break;
            n_ram = n_ram / 2 > stage ? n_ram / 2 : 0;
        }
        st->ram_cache = n_ram > 0;
        st->host = calloc((size_t)st->n_host, sizeof *st->host);
        if (!st->host_arena || !st->host) {
            sl_fail(e, "out of %s for %d expert images of %s", st->host ? "pinned host memory" : "memory", st->n_host,
                    sl_human_bytes((double)st->img_bytes, b1, sizeof b1));
            sl_store_free(st);
            return -1;
        }
        for (int i = 0; i < st->n_host; i++) {
            st->host[i].layer = st->host[i].expert = -1;
            st->host[i].img = st->host_arena + st->img_bytes * (size_t)i;
        }
    }
    st->first_moe = st->next_moe = -1;
    for (int l = st->n_layers - 1; l >= 0; l--)
        if (m->layers[l].moe) st->first_moe = l;
    if (st->own_memory && st->host && st->n_slots > 0 && measure_copy(st, e)) {
        sl_store_free(st);
        return -1;
    }
    /* CPU experts read the host cache, or the page cache through the mapping where reads are buffered */
    if (st->own_memory && st->host && (st->ram_cache || st->cfg.io == SL_IO_BUFFERED) &&
        cfg->cpu_experts != SL_CPU_EXPERTS_OFF && m->be->ops->moe_pairs_put && cpu_setup(st, e)) {
        sl_store_free(st);
        return -1;
    }
    if (st->cfg.prefetch) {
        st->plogits = m->be->ops->alloc(m->be, (size_t)st->n_experts * sizeof(float));
        st->pweights = m->be->ops->alloc(m->be, (size_t)st->k_max * sizeof(float));
        st->pids = m->be->ops->alloc(m->be, (size_t)st->k_max * sizeof(int32_t));
        st->hpids = malloc((size_t)st->k_max * sizeof(int32_t));
        if (!st->plogits || !st->pweights || !st->pids || !st->hpids) {
            sl_store_free(st);
            return sl_fail(e, "out of memory for expert prediction");
        }
    }
    if (cfg->device_steps != SL_DEVICE_STEPS_OFF && m->be->ops->moe_guard) {
        size_t recs = 1 + (size_t)st->n_layers * SL_STEP_MAX * (size_t)st->k_max;
        st->rec_dev = m->be->ops->alloc(m->be, recs * sizeof(int32_t));
        st->rec_host = m->be->ops->host_alloc ? m->be->ops->host_alloc(m->be, recs * sizeof(int32_t))
                                              : malloc(recs * sizeof(int32_t));
        if (!st->rec_dev || !st->rec_host) {
            sl_store_free(st);
            return sl_fail(e, "out of memory for the routing of device steps");
        }
        /* pinned host memory is the backend's to read (the GPU's through unified addressing) */
        /* auto reads the host cache where it holds every expert, the slots at most a quarter of them and
         * the CPU computes a part: there steps against the slots alone would mostly miss (qwen3.5-35b-a3b
         * Q4_K_M, 2 GB of slots, H200: 258 tok/s so, 211 host-driven; the GPU reading them all over PCIe,
         * without the CPU's part, 159 against 173-180 copying them host-driven) */
        st->host_reads =
            st->ram_cache && (cfg->device_steps == SL_DEVICE_STEPS_HOST ||
                              (cfg->device_steps == SL_DEVICE_STEPS_AUTO && st->cpu && m->be->ops->moe_handoff &&
                               st->n_host >= total && (int64_t)st->n_slots * 4 <= total));
        if (st->host_reads && st->cpu && m->be->ops->moe_handoff && share_setup(st, e)) {
            sl_store_free(st);
            return -1;
        }
    }
    sl_io_reader reader = {gds_reader, st};
    /* A buffered read that the page cache holds is a copy that io_uring makes inside the submitting call,
     * one after another; threads make them side by side (32.5 against 6.1 GB/s measured on H100). Reads
     * from the disk (O_DIRECT) go through io_uring. SLUICE_IO_ENGINE still picks either. */
    const char *engine = getenv("SLUICE_IO_ENGINE");
    if (!engine || !*engine) engine = st->cfg.io == SL_IO_BUFFERED ? "pread" : NULL;
    if (sl_io_open(IO_DEPTH, engine, st->gds ? &reader : NULL, &st->io, e)) {
        sl_store_free(st);
        return -1;
    }
    st->st.n_slots = st->n_slots;
    st->st.n_ram = st->ram_cache ? st->n_host : 0;
    st->st.ram_bytes = st->ram_cache ? (double)st->img_bytes * st->n_host : 0;
    st->st.slot_bytes = slot_bytes;
    st->st.engine = !st->gds         ? sl_io_engine(st->io)
                    : st->gds_direct ? "cuFile (GPUDirect)"
                                     : "cuFile (compatibility mode)";
    st->st.io = st->cfg.io;
    *out = st;
    return 0;
}

void sl_store_free(sl_expert_store *st) {
    if (!st) return;
    sl_io_close(st->io); /* finishes reads still landing in the buffers below */
    sl_backend *be = st->be;
    if (st->cpu_idx) be->ops->host_free(be, st->cpu_idx);
    if (st->cpu_rows) be->ops->host_free(be, st->cpu_rows);
    sl_backend_destroy(st->cpu);
    free(st->cx);
    free(st->cxp);
    free(st->cpu_list);
    free(st->xcnt);
    free(st->cpu_src);
    free(st->cpu_ids);
    free(st->hx);
    if (st->host_arena) be->ops->host_free(be, st->host_arena);
    free(st->host);
    if (st->own_memory) {
        if (st->arena) be->ops->free(be, st->arena);
        if (st->pass_dev) be->ops->free(be, st->pass_dev);
        if (st->pass_host) be->ops->host_free(be, st->pass_host);
    } else {
        free(st->arena);
    }
    if (st->rec_dev) be->ops->free(be, st->rec_dev);
    if (st->own) be->ops->host_free(be, st->own);
    if (st->own_dev) be->ops->free(be, st->own_dev);
    if (st->ho) be->ops->host_free(be, st->ho);
    if (st->ho_buf) be->ops->host_free(be, st->ho_buf);
    free(st->ho_cpu);
    if (st->host_ids_dev) be->ops->free(be, st->host_ids_dev);
    if (st->share_dev) be->ops->free(be, st->share_dev);
    if (st->rec_host) {
        if (be->ops->host_free)
            be->ops->host_free(be, st->rec_host);
        else
            free(st->rec_host);
    }
    if (st->plogits) be->ops->free(be, st->plogits);
    if (st->pweights) be->ops->free(be, st->pweights);
    if (st->pids) be->ops->free(be, st->pids);
    for (int i = 0; st->fd_buf && i < st->n_files; i++) {
        if (st->gfh && st->gfh[i]) be->ops->gds_file_close(be, st->gfh[i]);
        if (st->fd_buf[i] >= 0) close(st->fd_buf[i]);
        if (st->fd_direct[i] >= 0) close(st->fd_direct[i]);
    }
    free(st->fd_buf);
    free(st->fd_direct);
    free(st->gfh);
    free(st->pack_path);
    free(st->x);
    free(st->where);
    free(st->ram_where);
    free(st->layer_slots);
    free(st->in_table);
    free(st->stale);
    free(st->slots);
    free(st->mark);
    free(st->pmark);
    free(st->miss_rate);
    free(st->last_use);
    free(st->reuse_age);
    free(st->inflight);
    free(st->list);
    free(st->pred);
    free(st->hpids);
    free(st->hids);
    free(st->pass_ids);
    free(st);
}

int sl_store_preload(sl_expert_store *st, sl_store_progress_fn progress, void *ctx, sl_err *e) {
    if (!st->ram_cache || st->gds) return 0;
    int total = 0, r = 0;
    for (int l = 0; l < st->n_layers; l++) total += st->m->layers[l].moe ? st->n_experts : 0;
    if (st->n_host < total) return 0;
    double t0 = sl_now();
    st->preload_failed = 0;
    for (int l = 0; l < st->n_layers && !st->preload_failed; l++) {
        if (!st->m->layers[l].moe) continue;
        for (int x = 0; x < st->n_experts && !st->preload_failed; x++, r++) {
            hentry *h = &st->host[r];
            h->layer = l;
            h->expert = x;
            h->ref = 0;
            h->reading = 1;
            *rwh(st, l, x) = r;
            int failed = 0;
            if (queue_expert(st, &st->x[(size_t)l * (size_t)st->n_experts + (size_t)x], h->img,
                             FILL_TAG | (uint64_t)r << 8, &failed))
                break;
            st->preload_failed |= failed;
            if (!failed && !h->pending) host_loaded(st, r); /* every piece was held in memory */
            sl_io_submit(st->io);
        }
        if (progress) progress(ctx, (uint64_t)r, (uint64_t)total);
    }
    while (sl_io_pending(st->io))
        if (reap(st)) break;
    if (st->failed) return sl_store_check(st, e);
    uint64_t bytes = st->st.bytes_read;
    sl_store_stats_reset(st);
    st->st.preload_bytes = bytes;
    st->st.preload_s = sl_now() - t0;
    return 0;
}

int sl_store_check(sl_expert_store *st, sl_err *e) {
    if (!st->failed) return 0;
    /* reads still in flight (ahead of need, or for the failed pass) land now, so that none of them reports
     * a failure of this request in the next one */
    while (sl_io_pending(st->io))
        if (reap(st)) break;
    st->failed = 0;
    return sl_fail(e, "%s", st->failure.msg);
}

void sl_store_stats_get(const sl_expert_store *st, sl_store_stats *out) {
    *out = st->st;
}

sl_store_stats sl_store_stats_since(const sl_store_stats *a, const sl_store_stats *b) {
    sl_store_stats d = *b;
#define SUB(f) d.f = b->f - a->f
    SUB(tokens);
    SUB(lookups);
    SUB(hits_slot);
    SUB(hits_ahead);
    SUB(hits_ram);
    SUB(misses);
    SUB(bytes_read);
    SUB(reads);
    SUB(bytes_copied);
    SUB(copies);
    SUB(read_busy_s);
    SUB(stall_s);
    SUB(route_wait_s);
    SUB(sync_s);
    SUB(host_s);
    SUB(issue_s);
    SUB(launch_s);
    SUB(submit_s);
    SUB(predicted);
    SUB(predicted_used);
    SUB(prefetched);
    SUB(cpu_experts);
    SUB(hits_mapped);
    SUB(cpu_pairs);
    SUB(cpu_s);
    SUB(steps_device);
    SUB(steps_redone);
    SUB(step_check_s);
#undef SUB
    return d;
}

void sl_store_stats_reset(sl_expert_store *st) {
    sl_store_stats keep = st->st;
    memset(&st->st, 0, sizeof st->st);
    st->st.n_slots = keep.n_slots;
    st->st.n_ram = keep.n_ram;
    st->st.ram_bytes = keep.ram_bytes;
    st->st.slot_bytes = keep.slot_bytes;
    st->st.engine = keep.engine;
    st->st.io = keep.io;
    st->st.packed = keep.packed;
    st->st.copy_s = keep.copy_s;
    st->st.cpu_t1_s = keep.cpu_t1_s;
    st->st.cpu_tm_s = keep.cpu_tm_s;
    st->st.preload_bytes = keep.preload_bytes;
    st->st.preload_s = keep.preload_s;
}

/* Per-visit buffers for n*k routed pairs. */
static int ensure(sl_expert_store *st, int nk) {
    if (nk <= st->max_nk) return 0;
    int32_t *h = realloc(st->hids, (size_t)nk * sizeof *h),
            *p = h ? realloc(st->pass_ids, (size_t)nk * sizeof *p) : NULL,
            *ci = p && st->cpu ? realloc(st->cpu_ids, (size_t)nk * sizeof *ci) : NULL;
    if (h) st->hids = h;
    if (p) st->pass_ids = p;
    if (ci) st->cpu_ids = ci;
    if (!h || !p || (st->cpu && !ci)) return fail(st, "out of memory");
    if (st->own_memory) {
        if (backend_sync(st)) return -1; /* the old buffers may still be read */
        sl_backend *be = st->be;
        if (st->pass_dev) be->ops->free(be, st->pass_dev);
        if (st->pass_host) be->ops->host_free(be, st->pass_host);
        st->pass_ring = 8;
        st->pass_dev = be->ops->alloc(be, (size_t)nk * sizeof(int32_t));
        st->pass_host = be->ops->host_alloc(be, (size_t)nk * (size_t)st->pass_ring * sizeof(int32_t));
        if (!st->pass_dev || !st->pass_host) {
            st->max_nk = 0;
            return fail(st, "out of memory for the expert passes of %d routed pairs", nk);
        }
    }
    st->max_nk = nk;
    return 0;
}

/* Computes the pairs whose experts are listed (all in slots, READY) into the backend's pair buffer. */
static int pass_run(sl_expert_store *st, int l, const sl_store_moe_args *a, int nk, const int *xs, int cnt) {
    sl_backend *be = st->be;
    sl_moe *L = st->m->layers[l].moe;
    st->pass_stamp++;
    for (int i = 0; i < cnt; i++) st->pmark[xs[i]] = st->pass_stamp;
    int included = 0;
    for (int i = 0; i < nk; i++) {
        int in = st->pmark[st->hids[i]] == st->pass_stamp;
        st->pass_ids[i] = in ? st->hids[i] : -1;
        included += in;
    }
    if (!included) return 0;
    sl_err e;
    if (place(st, l, &e)) return fail(st, "%s", e.msg);
    const int32_t *ids = a->ids; /* every pair in this pass: the routed ids as they are */
    if (included < nk) {
        if (st->own_memory) {
            if (st->pass_next == st->pass_ring && backend_sync(st)) return -1;
            int32_t *h = st->pass_host + (size_t)st->pass_next++ * (size_t)st->max_nk;
            memcpy(h, st->pass_ids, (size_t)nk * sizeof *h);
            be->ops->upload_async(be, st->pass_dev, h, (size_t)nk * sizeof *h);
            ids = st->pass_dev;
        } else {
            ids = st->pass_ids;
        }
    }
    be->ops->moe_pairs(be, &L->experts, a->x, a->n, st->m->cfg.hidden, ids, st->m->cfg.top_k);
    st->launches++;
    for (int i = 0; i < cnt; i++) { /* later copies queue behind */
        slot *s = &st->slots[*wh(st, l, xs[i])];
        s->pin = 0;
        s->used = st->launches;
    }
    return 0;
}

/* pass_run, its time (the backend's table updates and launches) counted apart */
static int pass(sl_expert_store *st, int l, const sl_store_moe_args *a, int nk, const int *xs, int cnt) {
    double t0 = sl_now(), sync0 = st->st.sync_s;
    int rc = pass_run(st, l, a, nk, xs, cnt);
    st->st.launch_s += sl_now() - t0 - (st->st.sync_s - sync0);
    return rc;
}

/* The layer's output from its pairs (and the shared expert, when it has one). */
static void combine(sl_expert_store *st, int l, const sl_store_moe_args *a) {
    sl_backend *be = st->be;
    int k = st->m->cfg.top_k, H = st->m->cfg.hidden;
    const sl_expert_table *t = &st->m->layers[l].moe->experts;
    if (a->sh_down)
        sl_moe_combine_shared(be, t, a->weights, a->n, k, H, a->sh_down, a->g, a->u, a->gate, a->tmp, a->out);
    else
        be->ops->moe_combine(be, a->weights, a->n, k, H, a->out);
}

/* A step of n tokens reaches the first MoE layer: the previous one's misses go into the tracked rate. */
static void step_start(sl_expert_store *st, int n) {
    st->st.tokens += (uint64_t)n;
    if (st->step) st->miss_step = st->step > 1 ? 0.9 * st->miss_step + 0.1 * st->step_miss : st->step_miss;
    st->step_miss = st->step_absent = 0;
    st->step++;
}

/* Reads that finished while nobody waited (experts read ahead but not yet needed). */
static void reap_finished(sl_expert_store *st) {
    while (sl_io_pending(st->io) && sl_io_ready(st->io))
        if (reap(st)) return;
}

static int next_moe_layer(const sl_expert_store *st, int l) {
    for (int j = l + 1; j < st->n_layers; j++)
        if (st->m->layers[j].moe) return j;
    return -1;
}

/* 1 when every page of w's bytes is in memory, so the CPU can read them without waiting for the disk
 * (the page cache, through the checkpoint's mapping). */
static int resident(const sl_weight *w) {
    const uint8_t *part[3] = {w->data, w->scales, w->biases};
    size_t len[3] = {(size_t)w->rows * w->row_bytes, sl_weight_scale_bytes(w), sl_weight_scale_bytes(w)};
    long pg = sysconf(_SC_PAGESIZE);
    unsigned char vec[1024];
    for (int i = 0; i < 3; i++) {
        if (!part[i] || !len[i] || (i == 2 && w->fmt != SL_WF_MLX)) continue;
        uintptr_t a = (uintptr_t)part[i] / (uintptr_t)pg * (uintptr_t)pg, end = (uintptr_t)part[i] + len[i];
        while (a < end) {
            size_t pages = (end - a + (size_t)pg - 1) / (size_t)pg;
            if (pages > sizeof vec) pages = sizeof vec;
            if (mincore((void *)a, pages * (size_t)pg, vec)) return 0;
            for (size_t j = 0; j < pages; j++)
                if (!(vec[j] & 1)) return 0;
            a += pages * (size_t)pg;
        }
    }
    return 1;
}

/* The expert's weights as the checkpoint's mapping holds them, all in the page cache. */
static int mapped_resident(const sl_expert *x) {
    return resident(&x->gate) && resident(&x->up) && resident(&x->down);
}

/* Which of the nt experts in todo (no slot holds them) the CPU computes this visit where they are: from
 * their host cache images, or (buffered reads) from the checkpoint's mapping where the page cache holds
 * them; moved from todo into cpu_list, cpu_src saying which. Fewest tokens first, each while it shortens
 * the longer of the two sides: reads and copies into slots (the backend's queue) against the CPU experts
 * beside them (auto), or all of them (on), up to SL_CPU_PAIRS_MAX pairs. Returns how many. */
static int plan_cpu(sl_expert_store *st, int l, int nk, int *nt) {
    int nc = 0, E = st->n_experts, mapped = st->cfg.io == SL_IO_BUFFERED;
    /* auto: a prompt or a large batch goes to the GPU whole (its experts serve many tokens each, and a
     * CPU pass over them measured slower than copying them, on every shape tried) */
    if (st->cfg.cpu_experts == SL_CPU_EXPERTS_AUTO && nk > SL_CPU_AUTO_PAIRS) return 0;
    double cs = st->st.copy_s, rs = cs; /* a read from the page cache: as measured so far, else as a copy */
    if (st->st.read_busy_s > 0.01 && st->st.bytes_read > 0)
        rs = (double)st->img_bytes * st->st.read_busy_s / (double)st->st.bytes_read;
    /* About how many steps an expert read now stays in its slot: the slots over the experts each step
     * brings in. Where slots keep experts that long (many slots for the misses), an expert that must be
     * read from the page cache anyway and was routed to again within that time is read into a slot
     * (auto), its next uses hits, instead of being computed from the page cache each time. Host cache
     * experts stay with the planner: their copies are the GPU's cost, which a CPU pass spares. */
    double horizon = (double)st->n_slots / (st->miss_step > 1 ? st->miss_step : 1);
    int keep_reused = st->cfg.cpu_experts == SL_CPU_EXPERTS_AUTO && horizon >= 16;
    double G = 0, C = 0;
    for (int i = 0; i < *nt; i++) {
        int x = st->todo[i], r = st->ram_where[(size_t)l * (size_t)E + (size_t)x];
        G += r >= 0 ? cs : rs + cs;
        if (keep_reused && r < 0 && (double)st->reuse_age[x] <= horizon) continue;
        if (r >= 0 && !st->host[r].reading) {
            st->cpu_src[x] = r;
            st->cpu_list[nc++] = x;
        } else if (r < 0 && mapped && mapped_resident(template_of(st->m, l, x))) {
            st->cpu_src[x] = -1;
            st->cpu_list[nc++] = x;
        }
    }
    if (!nc) return 0;
    for (int i = 0; i < nk; i++) st->xcnt[st->hids[i]] = 0;
    for (int i = 0; i < nk; i++) st->xcnt[st->hids[i]]++;
    for (int i = 1; i < nc; i++) /* by tokens, stable */
        for (int j = i; j > 0 && st->xcnt[st->cpu_list[j - 1]] > st->xcnt[st->cpu_list[j]]; j--) {
            int t = st->cpu_list[j];
            st->cpu_list[j] = st->cpu_list[j - 1];
            st->cpu_list[j - 1] = t;
        }
    int ns = 0, pairs = 0;
    for (; ns < nc; ns++) {
        int x = st->cpu_list[ns], m = st->xcnt[x];
        if (pairs + m > SL_CPU_PAIRS_MAX) break;
        if (st->cfg.cpu_experts == SL_CPU_EXPERTS_AUTO) {
            double tg = st->cpu_src[x] >= 0 ? cs : rs + cs, tc = cpu_cost(st, m);
            if ((G - tg > C + tc ? G - tg : C + tc) >= (G > C ? G : C)) break;
            G -= tg;
            C += tc;
        }
        pairs += m;
    }
    if (!ns) {
        /* a CPU found slow once (a cold start, a busy moment) is tried again: the estimate drifts back
         * towards the measured cost while the planner keeps it idle */
        if (st->cpu_adj > 1) st->cpu_adj = 1 + (st->cpu_adj - 1) * 0.95;
        return 0;
    }
    st->pass_stamp++;
    for (int i = 0; i < ns; i++) {
        int x = st->cpu_list[i];
        if (st->cpu_src[x] >= 0) {
            hentry *h = &st->host[st->cpu_src[x]];
            h->cpu_visit = st->visit;
            if (h->ref < REF_MAX) h->ref++;
            st->st.hits_ram++;
        } else {
            st->st.hits_mapped++;
        }
        st->pmark[x] = st->pass_stamp;
    }
    int kept = 0;
    for (int i = 0; i < *nt; i++)
        if (st->pmark[st->todo[i]] != st->pass_stamp) st->todo[kept++] = st->todo[i];
    *nt = kept;
    st->st.cpu_experts += (uint64_t)ns;
    st->st.cpu_pairs += (uint64_t)pairs;
    return ns;
}

/* The planned experts on the CPU, from their host images or the mapping and the host copy of the input,
 * into cpu_rows for the pairs listed in cpu_idx; *cnt gets how many. */
static int cpu_pass(sl_expert_store *st, int l, const sl_store_moe_args *a, int nk, int ns, int *cnt) {
    double t0 = sl_now(), predicted = 0;
    const sl_config *c = &st->m->cfg;
    size_t E = (size_t)st->n_experts;
    sl_expert_table t = st->m->layers[l].moe->experts;
    for (int i = 0; i < ns; i++) {
        int x = st->cpu_list[i], r = st->cpu_src[x];
        if (r >= 0)
            build_expert(template_of(st->m, l, x), &st->x[(size_t)l * E + (size_t)x], st->host[r].img, 0, &st->cx[x]);
        else
            st->cx[x] = *template_of(st->m, l, x);
        st->cxp[x] = &st->cx[x];
        predicted += cpu_cost(st, st->xcnt[x]);
    }
    int n = 0;
    for (int i = 0; i < nk; i++) {
        int in = st->hids[i] >= 0 && st->cxp[st->hids[i]] != NULL; /* -1: a pair the backend computes */
        st->cpu_ids[i] = in ? st->hids[i] : -1;
        if (in) st->cpu_idx[n++] = i;
    }
    t.experts = st->cxp;
    st->cpu->ops->moe_pairs(st->cpu, &t, st->hx, a->n, c->hidden, st->cpu_ids, c->top_k);
    st->cpu->ops->moe_pairs_get(st->cpu, st->cpu_rows, st->cpu_idx, n, c->hidden);
    for (int i = 0; i < ns; i++) {
        int x = st->cpu_list[i];
        st->cxp[x] = NULL;
        if (st->cpu_src[x] >= 0) st->host[st->cpu_src[x]].cpu_visit = 0;
    }
    sl_err e;
    if (st->cpu->ops->check(st->cpu, &e)) return fail(st, "layer %d: the experts computed on the CPU: %s", l, e.msg);
    double dt = sl_now() - t0;
    st->st.cpu_s += dt;
    if (predicted > 0 && nk <= SL_CPU_AUTO_PAIRS) { /* track the measured time of the passes auto plans */
        st->cpu_adj *= 0.9 + 0.1 * dt / predicted;
        st->cpu_adj = st->cpu_adj < 0.05 ? 0.05 : st->cpu_adj > 20 ? 20 : st->cpu_adj;
    }
    *cnt = n;
    return 0;
}

/* The CPU's part of layer l of a device step, once its input and routing are in: the pairs the guard
 * gave it, from their experts' host cache images, then the rows handed back (done). Never fails the
 * step's wait: on an error the store fails and hands back nothing. */
static void serve_layer(sl_expert_store *st, int l) {
    sl_handoff *h = &st->ho[l];
    if (h->done) return;
    double t0 = sl_now();
    int spins = 0;
    while (!__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE)) {
        if (++spins % 4096 == 0 && sl_now() - t0 > 30) { /* the step never reached this layer */
            fail(st, "layer %d of a decode step never reached the host (30 s)", l);
            h->cnt = 0;
            __atomic_store_n(&h->done, 1, __ATOMIC_RELEASE);
            return;
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    double t1 = sl_now();
    st->st.route_wait_s += t1 - t0;
    int n = st->dev_n, k = st->m->cfg.top_k, nk = n * k, H = st->m->cfg.hidden, ns = 0, cnt = 0, pairs = 0;
    size_t E = (size_t)st->n_experts;
    memcpy(st->hids, h->ids, (size_t)nk * sizeof(int32_t));
    memcpy(st->hx, h->x, (size_t)n * (size_t)H * sizeof(float));
    st->visit++;
    for (int i = 0; i < nk; i++) {
        int x = st->hids[i];
        if (x < 0) continue; /* the backend's */
        if (x >= (int)E || *rwh(st, l, x) < 0) {
            fail(st, "layer %d: the host was handed expert %d, which its cache lacks", l, x);
            break;
        }
        if (st->mark[x] != st->visit) {
            st->mark[x] = st->visit;
            st->cpu_list[ns++] = x;
            st->cpu_src[x] = *rwh(st, l, x);
            st->xcnt[x] = 0;
        }
        st->xcnt[x]++;
        pairs++;
    }
    if (ns && !st->failed) {
        sl_store_moe_args a = {.n = n};
        if (cpu_pass(st, l, &a, nk, ns, &cnt)) cnt = 0;
        st->st.cpu_experts += (uint64_t)ns;
        st->st.cpu_pairs += (uint64_t)pairs;
    }
    h->cnt = cnt;
    st->ho_cpu[l] = sl_now() - t1;
    __atomic_store_n(&h->done, 1, __ATOMIC_RELEASE);
}

static void serve(void *ctx, sl_handoff *h) {
    sl_expert_store *st = ctx;
    serve_layer(st, (int)(h - st->ho));
}

void sl_store_step_serve(sl_expert_store *st) {
    if (!st->dev || !st->share_step) return;
    sl_err e;
    if (st->be->ops->check && st->be->ops->check(st->be, &e)) { /* the step's ops never ran */
        fail(st, "%s", e.msg);
        sl_store_step_abort(st);
        return;
    }
    for (int l = 0; l < st->n_layers; l++)
        if (st->m->layers[l].moe) serve_layer(st, l);
}

void sl_store_moe(sl_expert_store *st, int l, const sl_store_moe_args *a) {
    sl_model *m = st->m;
    sl_backend *be = st->be;
    const sl_backend_ops *op = be->ops;
    const sl_config *c = &m->cfg;
    sl_moe *L = m->layers[l].moe;
    int n = a->n, k = c->top_k, E = L->experts.n_experts, H = c->hidden, nk = n * k;
    if (st->dev) { /* a device step: the backend's tables decide, its count of misses tells (see store.h) */
        int32_t *rec = st->rec_dev + 1 + (size_t)l * (size_t)nk;
        sl_route(be, c, L->router_bias, a->logits, n, E, a->ids, a->weights);
        int sh = st->share_step;
        op->moe_guard(be, &L->experts, a->ids, nk, rec, st->rec_dev, sh ? st->own_dev + (size_t)l * (size_t)E : NULL,
                      sh ? st->share_dev : NULL, sh ? st->host_ids_dev : NULL);
        if (sh) op->moe_handoff(be, a->x, n, H, st->host_ids_dev, nk, &st->ho[l]);
        op->moe_pairs(be, &L->experts, a->x, n, H, a->ids, k);
        if (sh) op->moe_await(be, &st->ho[l], st->cpu_rows, st->cpu_idx, n, k, H, st->rec_dev, serve, st);
        combine(st, l, a);
        return;
    }
    double t_in = sl_now(), stall0 = st->st.stall_s, cpu0 = st->st.cpu_s, sync0 = st->st.sync_s, t_route = 0;
    if (st->failed || ensure(st, nk)) goto failed;
    st->visit++;
    if (l == st->first_moe) step_start(st, n);
    sl_route(be, c, L->router_bias, a->logits, n, E, a->ids, a->weights);
    /* read ahead only for a next layer that missed lately: the guess costs a router matmul and a wait, so
     * after 32 guesses in a row that started no read (every expert they named in a slot, or computed where
     * it is in host memory) only every 16th visit guesses */
    int nl = next_moe_layer(st, l), predict = st->cfg.prefetch && n == 1 && nl >= 0 && st->miss_rate[nl] > 0.02f &&
                                              (st->idle_preds < 32 || st->visit % 16 == 0);
    if (predict) {
        op->matmul(be, &m->layers[nl].moe->router, a->x, 1, st->plogits);
        sl_route(be, c, m->layers[nl].moe->router_bias, st->plogits, 1, m->layers[nl].moe->experts.n_experts, st->pids,
                 st->pweights);
    }
    t_route = sl_now();
    op->download(be, st->hids, a->ids, (size_t)nk * sizeof(int32_t));
    if (predict) op->download(be, st->hpids, st->pids, (size_t)k * sizeof(int32_t));
    t_route = sl_now() - t_route;
    st->st.route_wait_s += t_route;
    copies_done(st); /* a download waits for everything queued before it */
    reap_finished(st);
    if (st->failed) goto failed;
    /* the experts the tokens need, each once */
    int nu = 0;
    for (int i = 0; i < nk; i++) {
        int x = st->hids[i];
        if (x < 0 || x >= E) {
            fail(st, "layer %d: routing picked expert %d of %d", l, x, E);
            goto failed;
        }
        if (st->mark[x] != st->visit) {
            st->mark[x] = st->visit;
            st->list[nu++] = x;
            st->step_absent += !L->experts.experts[x];
            uint32_t *lu = &st->last_use[(size_t)l * (size_t)st->n_experts + (size_t)x];
            st->reuse_age[x] = *lu ? st->step - *lu : UINT32_MAX;
            *lu = st->step;
        }
    }
    st->st.lookups += (uint64_t)nu;
    if (st->pred_layer == l) {
        st->st.predicted += (uint64_t)st->n_pred;
        for (int i = 0; i < st->n_pred; i++) st->st.predicted_used += st->mark[st->pred[i]] == st->visit;
    }
    st->pred_layer = -1;
    int nr = 0, nt = 0, nf = 0;
    for (int i = 0; i < nu; i++) {
        int x = st->list[i], si = *wh(st, l, x);
        if (si < 0) {
            st->todo[nt++] = x;
            continue;
        }
        slot *s = &st->slots[si];
        s->pin = st->visit;
        if (s->ref < REF_MAX) s->ref++;
        if (s->state == READY) {
            st->st.hits_slot++;
            st->ready[nr++] = x;
        } else {
            st->st.hits_ahead++;
            st->inflight[nf++] = si; /* read ahead, still arriving */
        }
    }
    st->miss_rate[l] = 0.9f * st->miss_rate[l] + (nt ? 0.1f : 0.0f);
    st->step_miss += nt;
    /* experts in host memory (the host cache, or the page cache) the CPU computes beside the backend, from
     * a host copy of the input taken while the backend's queue is empty */
    int ncpu = st->cpu && nt ? plan_cpu(st, l, nk, &nt) : 0, cpu_done = 0, cpu_cnt = 0;
    if (ncpu) {
        if (!host_input(st, (size_t)n * (size_t)H)) {
            fail(st, "out of memory for the CPU experts' input (%d tokens)", n);
            goto failed;
        }
        op->download(be, st->hx, a->x, (size_t)n * (size_t)H * sizeof(float));
    }
    for (int ti = 0; nr || nf || ti < nt;) {
        /* start every read there is room for, then compute what is in while they arrive */
        while (ti < nt) {
            int si = victim(st);
            if (si < 0) break;
            if (start_load(st, si, l, st->todo[ti], 0)) goto failed;
            st->slots[si].pin = st->visit;
            st->inflight[nf++] = si;
            ti++;
        }
        if (!nr && !nf) {
            /* every slot is still being read ahead for a guess that missed: let those reads finish */
            if (sl_io_pending(st->io)) {
                if (reap(st)) goto failed;
                continue;
            }
            fail(st, "layer %d: no expert slot is free for the %d experts still needed", l, nt - ti);
            goto failed;
        }
        /* experts already in (host cache copies queued ahead in the backend's order, reads ahead that
         * landed) join this pass: one launch of the expert kernels instead of two */
        for (int i = 0; i < nf;) {
            slot *s = &st->slots[st->inflight[i]];
            if (s->state == READY) {
                st->ready[nr++] = s->expert;
                st->inflight[i] = st->inflight[--nf];
            } else {
                i++;
            }
        }
        if (nr) {
            if (pass(st, l, a, nk, st->ready, nr)) goto failed;
            nr = 0;
        }
        if (ncpu && !cpu_done) { /* while the backend computes what is in slots and the reads arrive */
            if (cpu_pass(st, l, a, nk, ncpu, &cpu_cnt)) goto failed;
            cpu_done = 1;
        }
        for (int i = 0; i < nf; i++) {
            if (wait_slot(st, st->inflight[i])) goto failed;
            slot *s = &st->slots[st->inflight[i]];
            if (st->failed || s->state != READY) goto failed;
            st->ready[nr++] = s->expert;
        }
        nf = 0;
        if (nr) {
            if (pass(st, l, a, nk, st->ready, nr)) goto failed;
            nr = 0;
        }
    }
    if (ncpu && !cpu_done && cpu_pass(st, l, a, nk, ncpu, &cpu_cnt)) goto failed;
    if (ncpu) op->moe_pairs_put(be, st->cpu_rows, st->cpu_idx, cpu_cnt, n, k, H);
    combine(st, l, a);
    if (predict) { /* read the next layer's likely experts while this one computes */
        st->pred_layer = nl;
        st->n_pred = 0;
        int E2 = m->layers[nl].moe->experts.n_experts, started = 0;
        for (int j = 0; j < k; j++) {
            int x = st->hpids[j];
            if (x < 0 || x >= E2) continue;
            st->pred[st->n_pred++] = x;
            if (*wh(st, nl, x) >= 0) continue;
            /* one token's expert in host memory (the host cache; without one, the page cache where reads
             * are buffered): the CPU computes it where it is, if no slot has it */
            if (st->cpu && (st->ram_where[(size_t)nl * (size_t)st->n_experts + (size_t)x] >= 0 ||
                            (!st->ram_cache && st->cfg.io == SL_IO_BUFFERED && mapped_resident(template_of(m, nl, x)))))
                continue;
            int si = victim(st);
            if (si < 0) break;
            if (start_load(st, si, nl, x, 1)) goto failed;
            started++;
        }
        st->idle_preds = started ? 0 : st->idle_preds + 1;
    }
    st->st.host_s +=
        sl_now() - t_in - t_route - (st->st.stall_s - stall0) - (st->st.cpu_s - cpu0) - (st->st.sync_s - sync0);
    return;
failed:
    op->zero(be, a->out, (size_t)n * (size_t)H * sizeof(float));
}

/* ---- device steps ---- */

/* decode steps run on the device while this share of recent ones found every expert in a slot: a step
 * that misses costs a whole step more, one that holds saves the host's part of each MoE layer (measured
 * on qwen3.5-35b-a3b: 2.9 ms a step against 0.8 ms, an even trade at 78 %) */
#define CLEAN_MIN 0.8

/* A decode step found every expert it needed in the tables (all_in) or not. */
static void note_clean(sl_expert_store *st, int all_in) {
    st->clean = 0.9 * st->clean + (all_in ? 1.0 - 0.9 : 0.0);
}

int sl_store_step_wants(const sl_expert_store *st, int n) {
    if (!st->rec_dev || st->failed || n < 1 || n > SL_STEP_MAX) return 0;
    for (int l = 0; l < st->n_layers; l++) /* a layer's table without any expert has no kernels to run */
        if (st->m->layers[l].moe && !st->in_table[l]) return 0;
    return st->cfg.device_steps == SL_DEVICE_STEPS_ON || st->clean >= CLEAN_MIN;
}

int sl_store_step_begin(sl_expert_store *st, int dev, int n, sl_err *e) {
    st->in_step = 1;
    st->dev = 0;
    st->dev_n = n;
    st->redoing = st->redo_next;
    st->redo_next = 0;
    if (!dev) return 0;
    if (!st->rec_dev || n < 1 || n > SL_STEP_MAX) return sl_fail(e, "a device step of %d tokens", n);
    sl_backend *be = st->be;
    reap_finished(st); /* experts read ahead that landed join their tables now */
    if (st->failed) return sl_store_check(st, e);
    int nk = n * st->m->cfg.top_k;
    st->share_step = st->own && nk <= SL_HANDOFF_PAIRS;
    if (st->share_step) {
        if (ensure(st, nk) || !host_input(st, (size_t)n * (size_t)st->m->cfg.hidden)) {
            if (!st->failed) fail(st, "out of memory for the CPU's part of a decode step");
            return sl_store_check(st, e);
        }
        for (int l = 0; l < st->n_layers; l++) {
            st->ho[l].ready = st->ho[l].done = 0;
            st->ho[l].t_wait = 0;
        }
        if (*st->share_host != st->share_sent) {
            st->share_sent = *st->share_host;
            be->ops->upload_async(be, st->share_dev, st->share_host, sizeof(float));
        }
    }
    for (int l = 0; l < st->n_layers; l++)
        if (st->m->layers[l].moe && place(st, l, e)) return -1;
    be->ops->zero(be, st->rec_dev, sizeof(int32_t));
    st->launches++; /* every slot may be read until the step has run */
    st->dev = 1;
    return 0;
}

/* After a device step with the CPU's part: the GPU's time on its part of each layer (from the handoff to
 * the start of its wait) and the CPU's, each taken as proportional to its part, give the part at which
 * both would take as long; the part moves a fifth of the way there. Backends that keep no times (the
 * CPU, which runs both parts in turn) leave it. */
static void share_track(sl_expert_store *st) {
    double g = 0, cpu = 0, f = *st->share_host;
    for (int l = 0; l < st->n_layers; l++) {
        const sl_handoff *h = &st->ho[l];
        if (!st->m->layers[l].moe || !h->t_wait) continue;
        g += h->t_wait > h->t_ready ? (double)(h->t_wait - h->t_ready) * 1e-9 : 0;
        cpu += st->ho_cpu[l];
    }
    if (st->share_fixed || g <= 0 || cpu <= 0) return;
    double a = g / (1.0 - (f < 0.95 ? f : 0.95)), b = cpu / (f > 0.05 ? f : 0.05), want = a / (a + b);
    f = (float)(0.8 * f + 0.2 * want);
    *st->share_host = f < 0.05f ? 0.05f : f > 0.95f ? 0.95f : f;
}

/* A device step stood: what host-driven steps note per layer visit (slot hits, reuse, miss rates), from
 * its routing read back. */
static void dev_step_note(sl_expert_store *st) {
    int nk = st->dev_n * st->m->cfg.top_k;
    step_start(st, st->dev_n);
    for (int l = 0; l < st->n_layers; l++) {
        if (!st->m->layers[l].moe) continue;
        st->visit++;
        const int32_t *ids = st->rec_host + 1 + (size_t)l * (size_t)nk;
        for (int i = 0; i < nk; i++) {
            int x = ids[i];
            if (x < 0 || x >= st->n_experts || st->mark[x] == st->visit) continue;
            int si = *wh(st, l, x), r = *rwh(st, l, x);
            st->mark[x] = st->visit;
            if (si >= 0 && st->slots[si].state == READY) {
                slot *s = &st->slots[si];
                if (s->ref < REF_MAX) s->ref++;
                s->used = st->launches;
                st->st.hits_slot++;
            } else if (r >= 0) { /* read where it is in the host cache (host reads) */
                if (st->host[r].ref < REF_MAX) st->host[r].ref++;
                st->st.hits_ram++;
            } else {
                continue;
            }
            st->last_use[(size_t)l * (size_t)st->n_experts + (size_t)x] = st->step;
            st->st.lookups++;
        }
        st->miss_rate[l] *= 0.9f;
    }
}

int sl_store_step_end(sl_expert_store *st, sl_err *e) {
    if (!st->in_step) return 0;
    st->in_step = 0;
    if (!st->dev) { /* a host-driven step (not one redone, already counted): were its experts all in tables? */
        if (!st->redoing) note_clean(st, !st->step_absent);
        return 0;
    }
    st->dev = 0;
    sl_backend *be = st->be;
    size_t len = 1 + (size_t)st->n_layers * (size_t)st->dev_n * (size_t)st->m->cfg.top_k;
    double t0 = sl_now();
    be->ops->download(be, st->rec_host, st->rec_dev, len * sizeof(int32_t));
    st->st.step_check_s += sl_now() - t0;
    copies_done(st); /* the download waited for every op queued */
    if (be->ops->check && be->ops->check(be, e)) return -1;
    if (st->rec_host[0]) {
        st->st.steps_redone++;
        note_clean(st, 0);
        st->redo_next = 1;
        return 1;
    }
    st->st.steps_device++;
    if (st->share_step) share_track(st);
    note_clean(st, 1);
    dev_step_note(st);
    return 0;
}

void sl_store_step_abort(sl_expert_store *st) {
    /* a recording that still runs finds every layer handed back, with nothing */
    for (int l = 0; st->share_step && l < st->n_layers; l++)
        if (!st->ho[l].done) {
            st->ho[l].cnt = 0;
            __atomic_store_n(&st->ho[l].done, 1, __ATOMIC_RELEASE);
        }
    st->in_step = st->dev = st->redo_next = st->share_step = 0;
}

double sl_store_probe_read(sl_expert_store *st, uint64_t bytes, sl_err *e) {
    /* finish what is in flight: the probe takes the whole queue */
    while (sl_io_pending(st->io))
        if (reap(st)) return sl_fail(e, "%s", st->failure.msg), -1;
    int depth = 32; /* experts in flight; concurrent reads into the same scratch image are harmless */
    size_t each = st->gds ? st->dev_bytes : st->img_bytes;
    uint8_t *buf =
        st->gds ? st->be->ops->alloc(st->be, each * (size_t)depth) : aligned_alloc(ALIGN, each * (size_t)depth);
    if (!buf) return sl_fail(e, "out of memory for the read probe"), -1;
    int direct = st->cfg.io == SL_IO_DIRECT, failed = 0, next = 0;
    uint64_t done = 0, issued = 0, rng = 0x5eedull;
    size_t cells = (size_t)st->n_layers * (size_t)st->n_experts;
    double t0 = sl_now();
    for (;;) {
        while (!failed && issued < bytes && sl_io_pending(st->io) + MAX_WIN <= IO_DEPTH) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const xinfo *xi = &st->x[(rng >> 17) % cells];
            if (!xi->n_win) continue; /* a dense layer */
            uint8_t *dst = buf + each * (size_t)(next++ % depth);
            for (int i = 0; st->gds && i < NP && !failed; i++) { /* GPUDirect: piece by piece */
                const piece *p = &xi->p[i];
                if (!p->len || p->file < 0) continue;
                void *fh = file_gfh(st, p->file);
                if (!fh || sl_io_read_fh(st->io, fh, p->off, p->len, dst + p->dev, 0)) failed = 1;
                issued += p->len;
            }
            for (int wi = 0; !st->gds && wi < xi->n_win && !failed; wi++) {
                const window *w = &xi->w[wi];
                int fd = file_fd(st, w->file, direct);
                uint64_t off = direct ? w->off : w->lo;
                size_t len = direct ? w->len : (size_t)(w->hi - w->lo);
                if (fd < 0 || sl_io_read(st->io, fd, off, len, dst + w->img + (off - w->off), 0)) failed = 1;
                issued += len;
            }
            sl_io_submit(st->io);
        }
        if (!sl_io_pending(st->io)) break;
        uint64_t tag;
        int64_t res;
        if (sl_io_wait(st->io, &tag, &res) || res < 0)
            failed = 1;
        else
            done += (uint64_t)res;
    }
    double t = sl_now() - t0;
    if (st->gds)
        st->be->ops->free(st->be, buf);
    else
        free(buf);
    if (failed) return sl_fail(e, "%s", st->failed ? st->failure.msg : "a read of the probe failed"), -1;
    return t > 0 ? (double)done / t : -1;
}

const char *sl_store_stats_line(const sl_store_stats *s, char *buf, size_t n) {
    double look = s->lookups ? (double)s->lookups : 1, tok = s->tokens ? (double)s->tokens : 1;
    char b1[32];
    int k = snprintf(buf, n, "%.1f%% in slots", 100.0 * (double)s->hits_slot / look);
    if (s->hits_ahead)
        k += snprintf(buf + k, n - (size_t)k, ", %.1f%% read ahead", 100.0 * (double)s->hits_ahead / look);
    if (s->n_ram) k += snprintf(buf + k, n - (size_t)k, ", %.1f%% host cache", 100.0 * (double)s->hits_ram / look);
    if (s->hits_mapped)
        k += snprintf(buf + k, n - (size_t)k, ", %.1f%% page cache", 100.0 * (double)s->hits_mapped / look);
    if (s->cpu_experts)
        k += snprintf(buf + k, n - (size_t)k, " (%.1f%% computed on the CPU, %.2f ms/token)",
                      100.0 * (double)s->cpu_experts / look, s->cpu_s * 1e3 / tok);
    k +=
        snprintf(buf + k, n - (size_t)k, ", %s read/token", sl_human_bytes((double)s->bytes_read / tok, b1, sizeof b1));
    if (s->read_busy_s > 0)
        k += snprintf(buf + k, n - (size_t)k, " at %.2f GB/s", (double)s->bytes_read / s->read_busy_s / 1e9);
    k += snprintf(buf + k, n - (size_t)k, ", stall %.2f ms/token", s->stall_s * 1e3 / tok);
    if (s->host_s > 0)
        k += snprintf(buf + k, n - (size_t)k, ", routing wait %.2f + host %.2f ms/token", s->route_wait_s * 1e3 / tok,
                      s->host_s * 1e3 / tok);
    if (s->sync_s > 0)
        k += snprintf(buf + k, n - (size_t)k, ", waits for buffers %.2f ms/token", s->sync_s * 1e3 / tok);
    if (s->steps_device || s->steps_redone)
        k += snprintf(buf + k, n - (size_t)k, ", %llu steps on the device (%llu redone)",
                      (unsigned long long)s->steps_device, (unsigned long long)s->steps_redone);
    if (s->predicted)
        snprintf(buf + k, n - (size_t)k, ", prefetch %.0f%% right",
                 100.0 * (double)s->predicted_used / (double)s->predicted);
    return buf;
}
