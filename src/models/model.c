#include "models/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "experts/store.h"
#include "formats/gguf_model.h"
#include "formats/resolve.h"
#include "models/loader.h"
#include "models/registry.h"
#include "models/rope.h"

void sl_model_free(sl_model *m) {
    if (!m) return;
    sl_store_free(m->store);
    free(m->layers);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    sl_st_close(m->st);
    sl_backend_destroy(m->be);
    sl_config_free(&m->cfg);
    free(m->path);
    free(m);
}

static int add_expert_bytes(void *ctx, int l, const sl_tensor *t) {
    (void)l;
    if (t->expert) *(uint64_t *)ctx += sl_weight_bytes(t->w);
    return 0;
}

static void account(sl_model *m) {
    uint64_t ex = 0, total = 0;
    sl_model_tensors(m, add_expert_bytes, &ex);
    for (int i = 0; i < m->st->n_files; i++) total += m->st->map_sizes[i];
    m->bytes_experts = ex;
    m->bytes_other = total > ex ? total - ex : 0;
}

static int own(sl_model *m, void *p) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **np = realloc(m->owned, sizeof *np * (size_t)cap);
        if (!np) return -1;
        m->owned = np;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return 0;
}

typedef struct {
    sl_backend *be;
    const sl_weight *bad;
} unsupported_walk;

static int check_supported(void *ctx, int l, const sl_tensor *t) {
    unsupported_walk *u = ctx;
    (void)l;
    if (!t->w || u->be->ops->supports(u->be, t->w)) return 0;
    u->bad = t->w;
    return 1;
}

/* The first weight whose format the backend has no kernels for, or NULL. */
static const sl_weight *unsupported(sl_model *m) {
    sl_backend *b = m->be;
    if (!b->ops->supports(b, &m->embed) || !b->ops->supports(b, &m->lm_head)) return &m->lm_head;
    unsupported_walk u = {b, NULL};
    sl_model_tensors(m, check_supported, &u);
    return u.bad;
}

/* Weights a backend of its own memory cannot run: an automatic choice falls back to the CPU (saying
 * so), an explicit one is an error naming the format. */
static int check_formats(sl_model *m, const sl_model_opts *o, char *note, size_t note_len, sl_err *e) {
    const sl_weight *w = m->be->ops->supports ? unsupported(m) : NULL;
    if (!w) return 0;
    char f[64];
    sl_wfmt_name(w, f, sizeof f);
    if (!note[0]) return sl_fail(e, "%s: the %s backend has no kernels for %s weights", m->path, m->be->ops->name, f);
    sl_backend_destroy(m->be);
    m->be = NULL;
    if (sl_cpu_backend_create(o ? o->threads : 0, &m->be, e)) return -1;
    snprintf(note, note_len, "backend cpu (the CUDA backend has no kernels for %s weights)", f);
    return 0;
}

/* For backends with their own memory: every weight but the routed experts, every norm and table, is
 * copied there once (a tied output head shares the embedding's copy). The experts follow resident
 * (place_experts_resident) or stream (the expert store). */
static int any_moe(const sl_model *m);

typedef struct {
    sl_model *m;
    int moe;
    sl_err *e;
} place_walk;

static int place_tensor(void *ctx, int l, const sl_tensor *t) {
    place_walk *p = ctx;
    sl_backend *b = p->m->be;
    (void)l;
    if (t->v) return b->ops->place_vector(b, t->v, t->len, p->e);
    if (t->expert) return 0;
    /* a mixture of experts asks for products near fp32 (routers included): a bf16 rounding anywhere
     * upstream of a router can change which experts run (SLUICE_CUDA_PREFILL=bf16 rounds anyway) */
    t->w->exact |= p->moe;
    return b->ops->place_weight(b, t->w, p->e);
}

static int place_dense(sl_model *m, sl_err *e) {
    const sl_backend_ops *op = m->be->ops;
    sl_backend *b = m->be;
    const sl_config *c = &m->cfg;
    int tied = m->lm_head.data == m->embed.data;
    if (op->place_weight(b, &m->embed, e)) return -1;
    if (tied)
        m->lm_head = m->embed;
    else if (op->place_weight(b, &m->lm_head, e))
        return -1;
    if (op->place_vector(b, &m->final_norm, (size_t)c->hidden, e) ||
        op->place_vector(b, &m->inv_freq, (size_t)(m->rot_dim / 2 + 1), e))
        return -1;
    place_walk p = {m, any_moe(m), e};
    return sl_model_tensors(m, place_tensor, &p) ? -1 : 0;
}

/* Backend memory a session of ctx tokens takes (caches, recurrent state, scratch), plus room for the
 * backend's own scratch (GEMM workspaces, MoE buffers). A quarter of what is left after loading goes to
 * the KV cache when no context length is asked for, so four times the caches are set aside. */
static int64_t session_reserve(const sl_model *m, int ctx) {
    const sl_config *c = &m->cfg;
    if (ctx <= 0) ctx = c->max_pos < 4096 ? c->max_pos : 4096;
    int64_t kv = 0;
    sl_kv_type kt = sl_model_kv_type(m, SL_KV_AUTO);
    for (int l = 0; l < c->n_layers; l++) {
        sl_state_layout st;
        sl_layer_layout(m, l, &st);
        kv += (int64_t)ctx * st.n_paged * (int64_t)sl_state_paged_row(&st, kt);
        for (int i = 0; i < st.n_fixed; i++) kv += (int64_t)st.fixed[i] * 4;
    }
    int64_t scratch = (int64_t)256 * (c->hidden * 8 + sl_config_q_width(c) * 6 + c->vocab_size / 16) * 4;
    return 4 * kv + scratch + ((int64_t)512 << 20);
}

static int any_moe(const sl_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (m->layers[l].moe) return 1;
    return 0;
}

static int place_expert(void *ctx, int l, const sl_tensor *t) {
    place_walk *p = ctx;
    (void)l;
    return t->expert ? p->m->be->ops->place_weight(p->m->be, t->w, p->e) : 0;
}

static int place_experts_resident(sl_model *m, sl_err *e) {
    place_walk p = {m, 1, e};
    for (int l = 0; l < m->cfg.n_layers; l++) {
        sl_moe *M = m->layers[l].moe;
        if (M && (sl_layer_tensors(m, l, place_expert, &p) || m->be->ops->place_experts(m->be, &M->experts, e)))
            return -1;
    }
    return 0;
}

typedef struct preload_progress {
    double t0, shown;
    int tty;
} preload_progress;

/* A line on a terminal, redrawn at most ten times a second, while the host cache fills. */
static void preload_shown(void *ctx, uint64_t done, uint64_t total) {
    preload_progress *p = ctx;
    double now = sl_now();
    if (!p->tty || (now - p->shown < 0.1 && done < total)) return;
    p->shown = now;
    fprintf(stderr, "\r\033[Ksluice: reading experts into the host cache: %3.0f%% (%llu of %llu), %.0f s",
            100.0 * (double)done / (double)(total ? total : 1), (unsigned long long)done, (unsigned long long)total,
            now - p->t0);
}

/* Where the experts live. Backends of their own memory get every weight resident when it fits in the
 * memory left for it (--vram, else what is free) beside a session; otherwise the dense weights go
 * there and the experts stream through slots in the rest. The CPU computes on the mapped checkpoint,
 * unless --ram caps its expert cache. */
static int place_model(sl_model *m, const sl_model_opts *o, sl_err *e) {
    const sl_backend_ops *op = m->be->ops;
    int own = op->place_weight != NULL, moe = any_moe(m);
    int64_t vram = o ? o->vram : 0, ram = o ? o->ram : 0;
    int forced = o ? o->expert_slots : 0;
    sl_store_config sc = {.io = o ? o->io : 0,
                          .prefetch = !(o && o->no_prefetch),
                          .n_slots = forced,
                          .cpu_experts = o ? (sl_cpu_experts)o->cpu_experts : SL_CPU_EXPERTS_AUTO,
                          .device_steps = o ? (sl_device_steps)o->device_steps : SL_DEVICE_STEPS_AUTO,
                          .cpu_threads = o ? o->threads : 0};
    char b1[32], b2[32], b3[32];
    if (!own && forced && o->staged_ram > 0) {
        if (!moe) return 0;
        sc.staged = 1;
        sc.ram_bytes = o->staged_ram;
    } else if (!own) {
        if (!moe || (ram <= 0 && !forced)) return 0;
        sc.slot_bytes_budget = ram;
    } else {
        size_t free0 = op->mem_free ? op->mem_free(m->be) : 0;
        if (place_dense(m, e)) return -1;
        size_t free1 = op->mem_free ? op->mem_free(m->be) : 0;
        int64_t dense = free0 > free1 ? (int64_t)(free0 - free1) : 0, reserve = session_reserve(m, o ? o->ctx : 0);
        int64_t avail = vram > 0 ? vram - dense - reserve : (int64_t)free1 - reserve;
        if (vram > 0 && avail <= 0)
            return sl_fail(e, "%s: --vram %s is less than the %s the dense weights (%s) and a session need", m->path,
                           sl_human_bytes((double)vram, b1, sizeof b1),
                           sl_human_bytes((double)(dense + reserve), b2, sizeof b2),
                           sl_human_bytes((double)dense, b3, sizeof b3));
        if (!moe || (!forced && (int64_t)m->bytes_experts <= avail)) return place_experts_resident(m, e);
        if (avail < 0) avail = 0;
        sc.slot_bytes_budget = avail;
        sc.ram_bytes = ram > 0 ? ram : 0;
        /* unset: a host cache of half the free RAM (the store caps it at the experts' size), unless the
         * slots are forced (tests) or GPUDirect reads skip host memory */
        if (ram == 0 && !forced && sc.io != SL_IO_GDS) {
            sc.ram_bytes = (int64_t)(sl_mem_available() / 2);
            sc.ram_auto = 1;
            double want = sc.ram_bytes < (int64_t)m->bytes_experts ? (double)sc.ram_bytes : (double)m->bytes_experts;
            if (want >= 1e9) /* pinning takes a while */
                fprintf(stderr, "sluice: pinning up to %s of host memory for the expert cache (--ram sets it)\n",
                        sl_human_bytes(want, b1, sizeof b1));
        }
    }
    if (sl_store_create(m, &sc, &m->store, e)) return sl_wrap(e, "%s", m->path);
    preload_progress pp = {.t0 = sl_now(), .tty = isatty(STDERR_FILENO)};
    if (!(o && o->no_preload) && sl_store_preload(m->store, preload_shown, &pp, e)) return -1;
    sl_store_stats s;
    sl_store_stats_get(m->store, &s);
    if (s.preload_bytes)
        fprintf(stderr, "%ssluice: read every expert into the host cache: %s in %.1f s (%s/s)\n",
                pp.tty ? "\r\033[K" : "", sl_human_bytes((double)s.preload_bytes, b1, sizeof b1), s.preload_s,
                sl_human_bytes(s.preload_s > 0 ? (double)s.preload_bytes / s.preload_s : 0, b2, sizeof b2));
    char ram_s[48] = "off", cpu_s[160] = "";
    if (s.n_ram) snprintf(ram_s, sizeof ram_s, "%d experts (%s)", s.n_ram, sl_human_bytes(s.ram_bytes, b3, sizeof b3));
    if (s.cpu_t1_s > 0)
        snprintf(cpu_s, sizeof cpu_s,
                 "; experts in host memory computed on the CPU %s (an expert: copy %.2f ms, CPU %.2f ms + %.2f ms a "
                 "token more)",
                 sc.cpu_experts == SL_CPU_EXPERTS_ON ? "always" : "where faster", s.copy_s * 1e3, s.cpu_t1_s * 1e3,
                 s.cpu_tm_s * 1e3);
    fprintf(stderr, "sluice: streaming experts: %d slots of %s in %s memory (%s), host cache %s, %s I/O via %s%s%s\n",
            s.n_slots, sl_human_bytes((double)s.slot_bytes, b1, sizeof b1), own ? op->name : "host",
            sl_human_bytes((double)s.slot_bytes * s.n_slots, b2, sizeof b2), ram_s, sl_io_mode_name(s.io), s.engine,
            s.packed ? ", from the expert pack" : "", cpu_s);
    return 0;
}

/* GGUF files of Llama 3 style scaled RoPE carry the scaling as per-frequency divisors (rope_freqs). */
static int rope_freq_factors(sl_model *m, sl_loader *ld, sl_err *e) {
    float *f;
    if (sl_ld_vector(ld, "rope_freqs.weight", m->rot_dim / 2, 0.0f, &f, e)) return -1;
    for (int i = 0; i < m->rot_dim / 2; i++) {
        if (!(f[i] > 0))
            return sl_fail(e, "%s: tensor 'rope_freqs.weight' element %d is %g (expected a positive divisor)", m->path,
                           i, (double)f[i]);
        m->inv_freq[i] /= f[i];
    }
    m->n_params -= (uint64_t)(m->rot_dim / 2);
    return 0;
}

/* Config and tensor table of a GGUF file; its mappings move into m->st. */
static int open_gguf(sl_model *m, sl_err *e) {
    sl_gguf *g;
    if (sl_gguf_open(m->path, &g, e)) return -1;
    int rc = sl_gguf_config(g, &m->cfg, e) || sl_gguf_tensor_set(g, &m->cfg, &m->st, e) ? -1 : 0;
    sl_gguf_close(g);
    return rc;
}

int sl_model_load(const char *arg, const sl_model_opts *o, sl_model **out, sl_err *e) {
    char *path;
    if (sl_resolve_model(arg, &path, e)) return -1;
    int gguf = !sl_is_dir(path) && sl_gguf_is_path(path);
    if (!sl_is_dir(path) && !gguf) {
        sl_fail(e, "%s: not a model directory or .gguf file (expected a folder with config.json and *.safetensors)",
                path);
        free(path);
        return -1;
    }
    sl_model *m = calloc(1, sizeof *m);
    if (!m) {
        free(path);
        return sl_fail(e, "out of memory");
    }
    m->path = path;
    m->cfg_suffix = gguf ? " metadata" : "/config.json";
    m->kv_type = o ? o->kv_type : SL_KV_AUTO;
    sl_loader ld = {0};
    if (gguf) {
        if (open_gguf(m, e)) goto fail;
    } else if (sl_config_load(path, &m->cfg, e)) {
        goto fail;
    }
    m->family = sl_family_for(m->cfg.model_type);
    if (!m->family) {
        sl_fail(e, "%s%s: unknown model_type '%s' (supported: %s)", path, m->cfg_suffix, m->cfg.model_type,
                sl_supported_types());
        goto fail;
    }
    if (!gguf && sl_st_open_dir(path, &m->st, e)) goto fail;
    char note[600];
    if (sl_backend_open(o ? o->backend : NULL, o ? o->threads : 0, &m->be, note, sizeof note, e)) goto fail;
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (!m->layers) {
        sl_fail(e, "out of memory");
        goto fail;
    }
    if (sl_loader_init(&ld, m, e)) goto fail;
    m->rot_dim = (int)(m->cfg.head_dim * m->cfg.rope.partial_factor);
    m->rot_dim -= m->rot_dim % 2;
    float *inv = calloc((size_t)(m->rot_dim / 2 + 1), sizeof *inv);
    if (!inv || own(m, inv)) { /* owned, since placement may repoint inv_freq at a backend copy */
        free(inv);
        sl_fail(e, "out of memory");
        goto fail;
    }
    m->inv_freq = inv;
    sl_rope_inv_freq(&m->cfg.rope, m->rot_dim, m->inv_freq, &m->attn_factor);
    if (sl_ld_has(&ld, "rope_freqs.weight") && rope_freq_factors(m, &ld, e)) goto fail;
    if (m->family->load(m, &ld, e)) goto fail;
    if (sl_ld_check_all_used(&ld, e)) goto fail;
    sl_loader_free(&ld);
    account(m);
    if (check_formats(m, o, note, sizeof note, e)) goto fail;
    if (place_model(m, o, e)) goto fail;
    if (note[0]) fprintf(stderr, "sluice: %s\n", note);
    *out = m;
    return 0;
fail:
    sl_loader_free(&ld);
    sl_model_free(m);
    return -1;
}
