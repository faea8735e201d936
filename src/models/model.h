/* A loaded model: hyperparameters, weights (views into the mapped checkpoint), and the forward pass of
 * its architecture family. */
#ifndef SLUICE_MODELS_MODEL_H
#define SLUICE_MODELS_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "formats/config.h"
#include "formats/safetensors.h"
#include "models/kinds.h"

/* A decoder layer: a token mixer and a feed-forward, each behind its norm; the parts are of the kinds
 * of models/kinds.h, and mixer / ffn are their descriptors. */
typedef struct sl_layer {
    float *attn_norm, *ffn_norm; /* effective multipliers: conventions like (1 + w) are resolved at load */
    sl_attn *attn;               /* the mixer: attention, or */
    sl_deltanet *dn;             /* a gated delta-net */
    sl_mlp *mlp;                 /* the feed-forward: a dense MLP, or */
    sl_moe *moe;                 /* a mixture of experts */
    const sl_kind *mixer, *ffn;
} sl_layer;

typedef struct sl_session sl_session;
typedef struct sl_model sl_model;
typedef struct sl_loader sl_loader;

/* What an architecture family provides. */
typedef struct sl_family {
    const char *name;
    int (*load)(sl_model *m, sl_loader *ld, sl_err *e);
    /* runs n tokens through the layers from the session's position; hidden [n][hidden] in, out in place */
    int (*layers)(sl_model *m, sl_session *s, float *hidden, int n, sl_err *e);
} sl_family;

struct sl_model {
    char *path;
    const char *cfg_suffix; /* appended to path where errors name the config: "/config.json" or " metadata" */
    sl_config cfg;
    const sl_family *family;
    sl_st_set *st;
    sl_backend *be;
    sl_weight embed, lm_head;
    float *final_norm;
    sl_layer *layers;
    /* rotary tables */
    int rot_dim;
    float *inv_freq;
    float attn_factor;
    /* heap allocations owned by the model (float copies of small tensors) */
    void **owned;
    int n_owned, cap_owned;
    struct sl_expert_store *store; /* streamed experts (NULL: all resident) */
    sl_kv_type kv_type;            /* the KV type of its sessions that ask for none (SL_KV_AUTO: the backend's) */
    /* accounting for `show` */
    uint64_t n_params, bytes_experts, bytes_other;
};

typedef struct sl_model_opts {
    int threads;         /* <= 0: all cores */
    const char *backend; /* "cpu", "cuda", "auto"; NULL: SLUICE_BACKEND, else auto (see sl_backend_open) */
    /* Expert streaming (0 where unset). vram: backend memory the model may use in all (weights, expert
     * slots, sessions), so a large card can act like a small one; unset: what is free. ram: the host
     * cache of experts (on the CPU backend, the expert cache itself, which turns streaming on); -1
     * means none. io: SL_IO_BUFFERED / SL_IO_DIRECT (experts/store.h). ctx: the context length sessions
     * will use, for the memory they need. no_prefetch: no reads ahead of the router. kv_type: the element
     * type of its sessions' attention caches (SL_KV_AUTO: the backend's default). */
    int64_t vram, ram;
    int io;
    int ctx;
    int no_prefetch;
    int no_preload; /* a host cache that holds every expert fills as they are used, not at load */
    sl_kv_type kv_type;
    int expert_slots; /* > 0: stream with exactly this many expert slots (tests, reproducing small cards) */
    int cpu_experts;  /* sl_cpu_experts (experts/store.h): experts of the host cache computed on the CPU */
    int device_steps; /* sl_device_steps (experts/store.h): decode steps run against the slot tables on the device */
    /* > 0 with expert_slots on the CPU backend: its slots are filled from a host cache of this many bytes,
     * as on a backend of its own memory, so the host cache and CPU experts run there (tests) */
    int64_t staged_ram;
} sl_model_opts;

int sl_model_load(const char *path, const sl_model_opts *o, sl_model **out, sl_err *e);
/* The KV type a session of m asking for t gets: t, else the model's, else the backend's default. */
static inline sl_kv_type sl_model_kv_type(const sl_model *m, sl_kv_type t) {
    return sl_kv_type_resolve(m->be, t != SL_KV_AUTO ? t : m->kv_type);
}
void sl_model_free(sl_model *m);

#endif
