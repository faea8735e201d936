/* The expert store: runs mixture-of-experts models whose routed experts do not all fit in the
 * backend's memory. Every (layer, expert) is known by the byte ranges it occupies in the checkpoint's
 * files; a cache of expert slots in backend memory (GPU memory, or host memory on the CPU) holds the
 * experts in use, an optional cache of pinned host memory holds more, and misses are read from disk
 * (page cache, or O_DIRECT) by the I/O engine. Dense weights, routers and shared experts stay resident.
 *
 * Per MoE layer: route, read every missing expert the tokens need at once, compute the experts already
 * in slots while the reads arrive, then the rest, then combine in routing order, so the logits are those
 * of the resident model to the bit. On one-token steps the next layer's router, applied to this layer's
 * input, predicts which experts to read ahead.
 *
 * Device steps: a decode step whose experts are likely all in slots (recent steps found them there) runs
 * without the host in the loop. Each MoE layer routes, checks the routed experts against the backend's copy
 * of the slot tables (moe_guard: a missing one is counted, not computed) and computes them, so the step
 * issues the same kernels as a resident model's and can be recorded; the host reads the count and every
 * layer's routing once, after the step. A step that missed is redone from the state saved before it, as a
 * host-driven step that reads what it lacks. Either way the logits are the resident model's.
 *
 * With host reads (sl_device_steps), the tables also hold the host cache's images of experts in no slot,
 * read by the GPU where they are, and with CPU experts the CPU takes a part of those inside the step: the
 * guard splits each layer's host cache experts, the backend hands the layer's input and the CPU's pairs to
 * the host (moe_handoff), the host computes them while the GPU computes the rest (sl_store_step_serve),
 * and the backend takes the rows back before combining (moe_await). The part is tracked from both sides'
 * times so that they finish together. Where the host cache can hold every expert, sl_store_preload fills
 * it at load. */
#ifndef SLUICE_EXPERTS_STORE_H
#define SLUICE_EXPERTS_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/err.h"

/* How experts are read: auto (GPUDirect Storage where the driver moves the bytes without host memory,
 * else buffered), through the page cache, with O_DIRECT, or through cuFile (GPUDirect Storage, forced). */
typedef enum { SL_IO_AUTO = 0, SL_IO_BUFFERED, SL_IO_DIRECT, SL_IO_GDS } sl_io_mode;

typedef struct sl_model sl_model;
typedef struct sl_expert_store sl_expert_store;

/* Where an expert whose copy is in host memory runs when no slot holds it (the host cache, or with
 * buffered reads the page cache, read through the checkpoint's mapping): on the CPU, where it is, where the
 * planner expects that to finish before a read and copy into a slot would (auto); always, up to
 * SL_CPU_PAIRS_MAX routed pairs a layer (on); or never, copied into a slot first (off). */
typedef enum { SL_CPU_EXPERTS_AUTO = 0, SL_CPU_EXPERTS_ON, SL_CPU_EXPERTS_OFF } sl_cpu_experts;
#define SL_CPU_PAIRS_MAX 256
/* auto plans CPU experts only for layers of at most this many routed pairs (decode, small batches): those
 * the CPU backend runs in one pass, as its costs were measured */
#define SL_CPU_AUTO_PAIRS SL_CPU_MOE_ONE_PASS_PAIRS

/* Decode steps run on the device against the slot tables: where recent steps found every expert in a
 * slot (auto), on every step that can (on), or never (off); host: as auto, and the tables also hold the
 * host cache's experts that no slot holds, which the backend then reads where they are (the GPU over
 * PCIe) instead of the step missing them; with CPU experts, the CPU computes a part of those, each MoE
 * layer handed to the host and back inside the step, the part tracked so that both finish together.
 * auto does as host where the host cache holds every expert, the slots at most a quarter of them, and CPU
 * experts are on. */
typedef enum {
    SL_DEVICE_STEPS_AUTO = 0,
    SL_DEVICE_STEPS_ON,
    SL_DEVICE_STEPS_OFF,
    SL_DEVICE_STEPS_HOST
} sl_device_steps;

typedef struct sl_store_config {
    int64_t slot_bytes_budget; /* backend memory for expert slots */
    int64_t ram_bytes;         /* pinned host cache (backends of their own memory only); 0: none */
    int ram_auto;              /* ram_bytes is a default: take less where the system pins less */
    sl_io_mode io;             /* SL_IO_AUTO: buffered */
    int prefetch;              /* read the next layer's predicted experts ahead on one-token steps */
    int n_slots;               /* > 0: exactly this many slots, whatever the budget */
    sl_cpu_experts cpu_experts;
    int cpu_threads; /* threads of the CPU experts; <= 0: all cores */
    /* fill the slots from host images even on a backend that computes on host memory, as a backend of its
     * own memory does, so the host cache and the CPU experts run on the CPU backend too (tests) */
    int staged;
    sl_device_steps device_steps;
} sl_store_config;

typedef struct sl_store_stats {
    uint64_t tokens;         /* tokens that went through the MoE layers */
    uint64_t lookups;        /* (layer, expert) requests: unique experts per layer visit */
    uint64_t hits_slot;      /* found in backend memory (slots) */
    uint64_t hits_ahead;     /* found arriving in a slot, read ahead on the next layer's guess */
    uint64_t hits_ram;       /* found in the host cache */
    uint64_t hits_mapped;    /* found in the page cache (buffered reads) and computed there on the CPU */
    uint64_t misses;         /* read from disk */
    uint64_t bytes_read;     /* from disk, reads ahead included */
    uint64_t reads;          /* read requests */
    uint64_t bytes_copied;   /* host to backend memory */
    uint64_t copies;         /* copies into slots issued (one per expert where its image is laid out as a slot) */
    double read_busy_s;      /* wall time with reads in flight */
    double stall_s;          /* time the forward pass waited for reads (to land, or for room to start) */
    double route_wait_s;     /* time waiting for each layer's routing to reach the host */
    double sync_s;           /* time waiting for the backend's queue to drain so that a host buffer or
                              * slot being copied from or into is free again */
    double host_s;           /* the rest of the host's time in MoE layers: bookkeeping, launches, copies
                              * issued (the GPU idles through much of it) */
    double issue_s;          /* of host_s: copies into slots and their table entries issued */
    double launch_s;         /* of host_s: expert passes launched (table updates included) */
    double submit_s;         /* of host_s: reads queued (buffers and slots found for them) */
    uint64_t predicted;      /* experts predicted for the next layer */
    uint64_t predicted_used; /* of those, experts that layer was routed to */
    uint64_t prefetched;     /* reads started ahead of need */
    uint64_t cpu_experts;    /* of the host cache hits, experts computed on the CPU */
    uint64_t cpu_pairs;      /* routed pairs those computed */
    double cpu_s;            /* host time in CPU experts (the backend computes the rest meanwhile) */
    uint64_t steps_device;   /* decode steps run on the device that found every expert in a slot */
    uint64_t steps_redone;   /* decode steps run on the device that missed one and ran again */
    double step_check_s;     /* time reading back device steps' miss counts and routing */
    /* measured at creation: one expert copied into a slot from host memory (backends of their own memory),
     * and one computed on the CPU for one token and for each token more (0 when CPU experts are off) */
    double copy_s, cpu_t1_s, cpu_tm_s;
    uint64_t preload_bytes; /* read into the host cache at load (sl_store_preload) */
    double preload_s;       /* and the time that took */
    int n_slots, n_ram;     /* tier sizes in experts */
    double ram_bytes;       /* the host cache's pinned bytes */
    size_t slot_bytes;      /* bytes of one slot */
    const char *engine;     /* "io_uring", "pread threads" or "cuFile (GPUDirect)" / "cuFile (compatibility mode)" */
    sl_io_mode io;
    int packed; /* experts are read from an expert pack (sluice pack), one read each */
} sl_store_stats;

/* Describes every expert of m (whose weights still point into the checkpoint) and allocates the
 * tiers; fails naming the budget when it cannot hold one token's experts of a layer. */
int sl_store_create(sl_model *m, const sl_store_config *cfg, sl_expert_store **out, sl_err *e);
void sl_store_free(sl_expert_store *st);

/* Called with the experts read so far and all of them. */
typedef void (*sl_store_progress_fn)(void *ctx, uint64_t done, uint64_t total);
/* Where the host cache holds every expert, reads them all into it now (as a model that fits in memory
 * is loaded whole), so that decode finds each in host memory from its first step: no reads on the way,
 * and the CPU experts and the device steps' host reads have them all. Nothing otherwise. Fails naming
 * the file when a read does. */
int sl_store_preload(sl_expert_store *st, sl_store_progress_fn progress, void *ctx, sl_err *e);

/* The arguments of one MoE layer's routed half. */
typedef struct sl_store_moe_args {
    const float *x; /* [n][hidden] the layer's normed input */
    int n;
    const float *logits;      /* [n][n_experts] router output */
    int32_t *ids;             /* [n][k] backend scratch for the routed ids */
    float *weights;           /* [n][k] backend scratch for the routing weights */
    const sl_weight *sh_down; /* the shared expert (NULL: none), as sl_moe_combine_shared takes it */
    float *g;
    const float *u, *gate;
    float *tmp;
    float *out; /* [n][hidden] */
} sl_store_moe_args;

/* The routed experts of layer l (with the shared expert joined when sh_down is set). After a failure
 * (an I/O error) out is zeroed, and every later call does nothing until sl_store_check reports it. */
void sl_store_moe(sl_expert_store *st, int l, const sl_store_moe_args *a);
/* Device steps (see above), for a decode step of n tokens: sl_store_step_wants says whether the step may
 * run on the device; sl_store_step_begin(st, dev, n) starts a decode step, on the device when dev is set
 * (the caller then saves the state the step overwrites, and may record the step), else as usual;
 * sl_store_step_end, after the step's ops are issued, returns 1 when a device step missed an expert (its
 * outputs are wrong: the caller restores the state and runs the step again, begun with dev 0), 0 when it
 * stands, -1 on a backend failure (said in e). */
int sl_store_step_wants(const sl_expert_store *st, int n);
int sl_store_step_begin(sl_expert_store *st, int dev, int n, sl_err *e);
int sl_store_step_end(sl_expert_store *st, sl_err *e);
/* After a device step's ops are issued (or its recording launched), before sl_store_step_end: computes
 * the CPU's part of each MoE layer as the step hands it over (--device-steps host with CPU experts). */
void sl_store_step_serve(sl_expert_store *st);
/* Ends a decode step that failed before sl_store_step_end. */
void sl_store_step_abort(sl_expert_store *st);
/* -1 with the first failure since the last call, which it clears. */
int sl_store_check(sl_expert_store *st, sl_err *e);

/* Measures how fast the store's tier below the slots delivers experts: reads up to `bytes` of experts
 * spread over the model (fixed pseudo-random order) through the I/O engine at full depth, as the store
 * reads them (buffered or O_DIRECT), into scratch memory. Bytes/s, or -1 on failure. */
double sl_store_probe_read(sl_expert_store *st, uint64_t bytes, sl_err *e);
/* "91.2% slots, 0.0% host cache, 43.2 MB read/token at 5.10 GB/s, stall 8.3 ms/token, prefetch 61% right"
 * for the stats of a phase that ran `tokens` tokens. */
const char *sl_store_stats_line(const sl_store_stats *s, char *buf, size_t n);
void sl_store_stats_get(const sl_expert_store *st, sl_store_stats *out);
/* The counters of b since the earlier snapshot a; tier sizes, engine and I/O mode as of b. */
sl_store_stats sl_store_stats_since(const sl_store_stats *a, const sl_store_stats *b);
void sl_store_stats_reset(sl_expert_store *st);
const char *sl_io_mode_name(sl_io_mode m);
/* "buffered", "direct", "gds" (or "auto"); -1 for anything else. */
int sl_io_mode_parse(const char *s, sl_io_mode *out);

#endif
