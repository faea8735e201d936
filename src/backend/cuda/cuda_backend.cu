/* The CUDA backend: device memory, resident weights, failure reporting, recorded decode steps (CUDA
 * graphs), and the op table. Every op is issued on one stream; ops never wait for the device, so a
 * step can be captured as a graph and replayed. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_int.cuh"

#define BLOCK_BYTES ((size_t)256 << 20) /* resident weights are carved from blocks of this size */
#define ALIGN 256

int cu_fail(cu_impl *c, const char *fmt, ...) {
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->failure.msg, sizeof c->failure.msg, fmt, ap);
        va_end(ap);
        c->failed = 1;
    }
    return -1;
}

int cu_check_launch(cu_impl *c, const char *what) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) return 0;
    cu_fail(c, "CUDA %s: %s", what, cudaGetErrorString(err));
    return 1;
}

int cu_grow_try(cu_impl *c, void **p, size_t *len, size_t bytes) {
    if (*len >= bytes) return 0;
    if (c->capturing) return -1;
    cudaStreamSynchronize(c->st); /* the old buffer may still be in use */
    cudaFree(*p);
    *len = 0;
    c->regrown++;
    if (cudaMalloc(p, bytes) != cudaSuccess) {
        *p = NULL;
        cudaGetLastError();
        return -1;
    }
    *len = bytes;
    return 0;
}

int cu_grow(cu_impl *c, void **p, size_t *len, size_t bytes, const char *what) {
    if (*len >= bytes) return 0;
    if (c->capturing)
        return cu_fail(c, "%s would need %zu bytes more device scratch inside a recorded step", what, bytes - *len);
    if (cu_grow_try(c, p, len, bytes)) return cu_fail(c, "out of GPU memory for %zu bytes of %s", bytes, what);
    return 0;
}

cu_w cu_w_of(const sl_weight *w) {
    cu_w d;
    memset(&d, 0, sizeof d);
    d.data = w->data;
    d.scales = w->scales;
    d.biases = w->biases;
    d.bias = w->bias;
    d.row_bytes = (long long)w->row_bytes;
    d.rows = w->rows;
    d.cols = w->cols;
    d.fmt = w->fmt;
    d.bits = w->bits;
    d.group = w->group;
    d.sbf = w->sb_fmt;
    d.gtype = w->gtype;
    d.trows = w->tile_rows;
    d.trans = w->transposed;
    int aligned = ((uintptr_t)w->data % 16) == 0 && !w->transposed; /* the fast paths read rows */
    switch (w->fmt) {
    case SL_WF_BF16:
    case SL_WF_F16: d.vec = aligned && w->cols % 8 == 0; break;
    case SL_WF_F32: d.vec = aligned && w->cols % 4 == 0; break;
    case SL_WF_MXFP4: d.vec = aligned && w->cols % 32 == 0; break;
    case SL_WF_MLX:
        d.vec = aligned && w->cols % 32 == 0 && w->group % 32 == 0 &&
                (w->bits == 2 || w->bits == 3 || w->bits == 4 || w->bits == 5 || w->bits == 6 || w->bits == 8);
        break;
    case SL_WF_FP8: d.vec = aligned && w->cols % 16 == 0 && w->group % 16 == 0; break;
    default: d.vec = 0;
    }
    return d;
}

static void *cu_alloc(sl_backend *b, size_t bytes) {
    cu_impl *c = cu_of(b);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        cu_fail(c, "out of GPU memory allocating %zu bytes", bytes);
        return NULL;
    }
    /* zeroed in the order of the backend's stream, and done before the memory is handed out: a plain cudaMemset
     * runs on the legacy stream, which does not wait for (nor is waited for by) the backend's non-blocking
     * stream, so under a busy GPU (other processes' work) it could land after the first upload and wipe it
     * (seen as zero or stale products with four test processes on one GPU) */
    cudaError_t err = cudaMemsetAsync(p, 0, bytes, c->st);
    if (err == cudaSuccess) err = cudaStreamSynchronize(c->st);
    if (err != cudaSuccess) {
        cu_fail(c, "clearing %zu bytes of GPU memory: %s", bytes, cudaGetErrorString(err));
        cudaFree(p);
        return NULL;
    }
    return p;
}

int cu_occupancy(cu_impl *c, const void *fn, int threads, size_t smem) {
    for (int i = 0; i < c->n_occ; i++)
        if (c->occ[i].fn == fn && c->occ[i].threads == threads && c->occ[i].smem == smem) return c->occ[i].per_sm;
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, smem) != cudaSuccess || per_sm < 1) {
        cudaGetLastError();
        per_sm = 1;
    }
    /* a full cache keeps answering, by asking again */
    if (c->n_occ < (int)(sizeof c->occ / sizeof c->occ[0])) c->occ[c->n_occ++] = {fn, threads, per_sm, smem};
    return per_sm;
}

static void cu_free(sl_backend *b, void *p) {
    cu_of(b)->launches++; /* memory a made q16 came from may come back under the same address */
    cudaStreamSynchronize(cu_of(b)->st);
    cudaFree(p);
}

static void cu_zero(sl_backend *b, void *p, size_t bytes) {
    cu_impl *c = cu_of(b);
    c->launches++; /* a write, as a launch is (see q16_fuse) */
    cudaMemsetAsync(p, 0, bytes, c->st);
    cu_check_launch(c, "memset");
}

static void cu_upload(sl_backend *b, void *dst, const void *src, size_t bytes) {
    cu_impl *c = cu_of(b);
    c->launches++; /* a write, as a launch is (see q16_fuse) */
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->st);
    cu_check_launch(c, "upload");
}

static void cu_download(sl_backend *b, void *dst, const void *src, size_t bytes) {
    cu_impl *c = cu_of(b);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->st);
    cudaError_t err = cudaStreamSynchronize(c->st);
    if (err != cudaSuccess) cu_fail(c, "CUDA error in the ops before a download: %s", cudaGetErrorString(err));
}

static int cu_check(sl_backend *b, sl_err *e) {
    cu_impl *c = cu_of(b);
    cu_check_launch(c, "launch");
    if (!c->failed) return 0;
    c->failed = 0;
    return sl_fail(e, "%s", c->failure.msg);
}

/* Device memory for resident weights: 256-byte aligned pieces of large blocks. */
static void *arena(cu_impl *c, size_t bytes, sl_err *e) {
    bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (!c->n_blocks || c->block_used + bytes > c->block_cap) {
        size_t cap = bytes > BLOCK_BYTES ? bytes : BLOCK_BYTES;
        if (c->n_blocks == c->cap_blocks) {
            int nc = c->cap_blocks ? 2 * c->cap_blocks : 16;
            uint8_t **nb = (uint8_t **)realloc(c->blocks, sizeof *nb * (size_t)nc);
            if (!nb) {
                sl_fail(e, "out of memory");
                return NULL;
            }
            c->blocks = nb;
            c->cap_blocks = nc;
        }
        void *p = NULL;
        if (cudaMalloc(&p, cap) != cudaSuccess) {
            cudaGetLastError();
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            sl_fail(e, "out of GPU memory placing the weights (%.2f GiB more needed, %.2f GiB free of %.2f GiB)",
                    (double)cap / (1 << 30), (double)fr / (1 << 30), (double)tot / (1 << 30));
            return NULL;
        }
        c->blocks[c->n_blocks++] = (uint8_t *)p;
        c->block_used = 0;
        c->block_cap = cap;
    }
    void *p = c->blocks[c->n_blocks - 1] + c->block_used;
    c->block_used += bytes;
    return p;
}

static const void *put(cu_impl *c, const void *src, size_t bytes, sl_err *e) {
    void *d = arena(c, bytes, e);
    if (!d) return NULL;
    cudaError_t err = cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
        sl_fail(e, "copying weights to the GPU: %s", cudaGetErrorString(err));
        return NULL;
    }
    return d;
}

static int cu_supports(sl_backend *b, const sl_weight *w) {
    (void)b;
    return w->fmt == SL_WF_F32 || w->fmt == SL_WF_F16 || w->fmt == SL_WF_BF16 || w->fmt == SL_WF_MLX ||
           w->fmt == SL_WF_FP8 || w->fmt == SL_WF_MXFP4 || (w->fmt == SL_WF_GGML && cu_ggml_supported(w->gtype));
}

static int cu_place_weight(sl_backend *b, sl_weight *w, sl_err *e) {
    cu_impl *c = cu_of(b);
    if (!cu_supports(b, w)) {
        char buf[64];
        return sl_fail(e, "the CUDA backend has no kernels for weights stored as %s (use --backend cpu)",
                       sl_wfmt_name(w, buf, sizeof buf));
    }
    size_t data = (size_t)w->rows * w->row_bytes;
    if (!(w->data = (const uint8_t *)put(c, w->data, data, e))) return -1;
    if (w->fmt == SL_WF_MLX) {
        size_t sb = sl_weight_scale_bytes(w);
        if (!(w->scales = (const uint8_t *)put(c, w->scales, sb, e)) ||
            !(w->biases = (const uint8_t *)put(c, w->biases, sb, e)))
            return -1;
    }
    if ((w->fmt == SL_WF_FP8 || w->fmt == SL_WF_MXFP4) &&
        !(w->scales = (const uint8_t *)put(c, w->scales, sl_weight_scale_bytes(w), e)))
        return -1;
    if (w->bias && !(w->bias = (const float *)put(c, w->bias, (size_t)w->rows * sizeof(float), e))) return -1;
    if (w->fmt == SL_WF_GGML && c->mmvq && !c->q16_fuse) { /* one-row norms and merges then make its input */
        cu_w cw = cu_w_of(w);
        if (cu_mmvq_takes(&cw)) c->q16_fuse = 1;
    }
    return 0;
}

static int cu_place_vector(sl_backend *b, float **v, size_t len, sl_err *e) {
    const void *d = put(cu_of(b), *v, len * sizeof(float), e);
    if (!d) return -1;
    *v = (float *)d;
    return 0;
}

/* Entry x of t as the device table holds it. */
static cu_expert table_entry(const sl_expert_table *t, int x) {
    cu_expert v;
    memset(&v, 0, sizeof v);
    const sl_expert *ex = t->experts[x];
    if (ex) {
        v.w[0] = cu_w_of(&ex->gate);
        v.w[1] = cu_w_of(&ex->up);
        v.w[2] = cu_w_of(&ex->down);
    }
    return v;
}

/* The device table of t: entry x holds expert x's weights, zeros where t has no expert (an expert store's
 * table, whose experts come and go). Repeated calls copy only the entries that changed, behind the ops
 * already queued, from one of two pinned mirrors in turn: an update waits only for the copy before the
 * previous one (the latest may still sit behind queued work, such as the copies of experts into slots). */
static int cu_place_experts(sl_backend *b, const sl_expert_table *t, sl_err *e) {
    cu_impl *c = cu_of(b);
    cu_table *tab = NULL;
    for (int i = 0; i < c->n_tables; i++)
        if (c->tables[i].key == t) tab = &c->tables[i];
    if (tab && tab->n != t->n_experts)
        return sl_fail(e, "an expert table changed its size from %d to %d", tab->n, t->n_experts);
    int fresh = !tab;
    /* a tracked table: only the entries its owner changed since the last call (comparing all 256 of a layer
     * twice per layer of a streamed step took a sizeable part of the host's time) */
    int x0 = 0, x1 = t->n_experts;
    if (!fresh && t->track) {
        x0 = t->lo < 0 ? 0 : t->lo;
        x1 = t->hi > t->n_experts ? t->n_experts : t->hi;
    }
    const sl_expert *e0 = NULL;
    for (int x = 0; x < t->n_experts && !e0; x++) e0 = t->experts[x];
    for (int x = x0; x < x1; x++) {
        const sl_expert *ex = t->experts[x];
        if (!ex) continue;
        if (ex->gate.rows != e0->gate.rows || ex->down.rows != e0->down.rows)
            return sl_fail(e, "expert %d has a different shape from the layer's other experts", x);
        /* GGML kernels are chosen per type from the first expert */
        if ((ex->gate.fmt == SL_WF_GGML || ex->up.fmt == SL_WF_GGML || ex->down.fmt == SL_WF_GGML) &&
            (ex->gate.fmt != e0->gate.fmt || ex->gate.gtype != e0->gate.gtype || ex->up.fmt != e0->up.fmt ||
             ex->up.gtype != e0->up.gtype || ex->down.fmt != e0->down.fmt || ex->down.gtype != e0->down.gtype))
            return sl_fail(e,
                           "expert %d is stored in other GGML types than the layer's other experts; the CUDA backend "
                           "needs one type per matrix across a layer's experts",
                           x);
    }
    if (!tab) {
        if (c->n_tables == c->cap_tables) {
            int nc = c->cap_tables ? 2 * c->cap_tables : 64;
            cu_table *nt = (cu_table *)realloc(c->tables, sizeof *nt * (size_t)nc);
            if (!nt) return sl_fail(e, "out of memory");
            c->tables = nt;
            c->cap_tables = nc;
        }
        tab = &c->tables[c->n_tables];
        memset(tab, 0, sizeof *tab);
        tab->key = t;
        tab->n = t->n_experts;
        size_t bytes = sizeof(cu_expert) * (size_t)t->n_experts;
        if (!(tab->d = (cu_expert *)arena(c, bytes, e))) return -1;
        int ok = 1;
        for (int i = 0; i < 2 && ok; i++)
            ok = cudaHostAlloc((void **)&tab->h[i], bytes, cudaHostAllocDefault) == cudaSuccess &&
                 cudaEventCreateWithFlags(&tab->copied[i], cudaEventDisableTiming) == cudaSuccess;
        if (!ok) {
            cudaGetLastError();
            for (int i = 0; i < 2; i++) {
                if (tab->h[i]) cudaFreeHost(tab->h[i]);
                if (tab->copied[i]) cudaEventDestroy(tab->copied[i]);
            }
            return sl_fail(e, "out of pinned host memory for an expert table");
        }
        memset(tab->h[0], 0, bytes);
        tab->plo = 0;
        tab->phi = t->n_experts;
        c->n_tables++;
    }
    /* the entries that changed since the latest table */
    int lo = fresh ? 0 : -1, hi = fresh ? t->n_experts : -1;
    for (int x = x0; x < x1 && !fresh; x++) {
        cu_expert v = table_entry(t, x);
        if (memcmp(&v, &tab->h[tab->cur][x], sizeof v)) {
            if (lo < 0) lo = x;
            hi = x + 1;
        }
    }
    if (lo >= 0) {
        /* the other mirror, once its last copy has run, takes the latest table and the changes */
        int nx = fresh ? 0 : tab->cur ^ 1;
        if (!fresh) {
            if (cudaEventSynchronize(tab->copied[nx]) != cudaSuccess) {
                cu_check_launch(c, "expert table");
                return sl_fail(e, "updating an expert table: %s", c->failure.msg);
            }
            memcpy(tab->h[nx] + tab->plo, tab->h[tab->cur] + tab->plo, sizeof(cu_expert) * (size_t)(tab->phi - tab->plo));
        }
        for (int x = lo; x < hi; x++) tab->h[nx][x] = table_entry(t, x);
        tab->cur = nx;
        tab->plo = lo;
        tab->phi = hi;
        cudaMemcpyAsync(tab->d + lo, tab->h[nx] + lo, sizeof(cu_expert) * (size_t)(hi - lo), cudaMemcpyHostToDevice,
                        c->st);
        cudaEventRecord(tab->copied[nx], c->st);
        if (cu_check_launch(c, "expert table")) {
            c->failed = 0;
            return sl_fail(e, "copying an expert table to the GPU: %s", c->failure.msg);
        }
    }
    if (!e0) return 0;
    /* a recorded step must never grow scratch: size the MoE buffers for one token's top-32 now */
    size_t need = (size_t)32 * ((size_t)e0->gate.rows * 2 + (size_t)e0->down.rows) * sizeof(float);
    if (cu_grow(c, (void **)&c->moe_buf, &c->moe_len, need, "MoE buffers")) {
        c->failed = 0;
        return sl_fail(e, "%s", c->failure.msg);
    }
    return 0;
}

static void *cu_host_alloc(sl_backend *b, size_t bytes) {
    (void)b;
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_host_free(sl_backend *b, void *p) {
    (void)b;
    if (p) cudaFreeHost(p);
}

static void cu_upload_async(sl_backend *b, void *dst, const void *src, size_t bytes) {
    cu_impl *c = cu_of(b);
    c->launches++; /* a write, as a launch is (see q16_fuse) */
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->st);
    cu_check_launch(c, "copying an expert to the GPU");
}

static int cu_sync(sl_backend *b, sl_err *e) {
    cu_impl *c = cu_of(b);
    cudaError_t err = cudaStreamSynchronize(c->st);
    if (err != cudaSuccess) cu_fail(c, "CUDA error: %s", cudaGetErrorString(err));
    return cu_check(b, e);
}

static size_t cu_mem_free(sl_backend *b) {
    (void)b;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return fr;
}

/* A recorded one-token step. */
struct cu_rec {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    unsigned long long regrown; /* c->regrown when recorded */
};

static void rec_free(cu_rec *r) {
    cudaGraphExecDestroy(r->exec);
    cudaGraphDestroy(r->graph);
    free(r);
}

static int cu_step_begin(sl_backend *b, void **rec, int n, const int32_t *ids) {
    cu_impl *c = cu_of(b);
    if (c->steps_off || c->failed || n < 1 || n > SL_STEP_MAX) return -1;
    /* the previous replay may still read the pinned step values */
    if (cudaStreamSynchronize(c->st) != cudaSuccess) {
        cu_check_launch(c, "step");
        return -1;
    }
    memcpy(c->h_step->tok, ids, (size_t)n * sizeof *ids);
    if (*rec && ((cu_rec *)*rec)->regrown != c->regrown) { /* its scratch moved since: record it again */
        rec_free((cu_rec *)*rec);
        *rec = NULL;
    }
    if (*rec) {
        cudaGraphLaunch(((cu_rec *)*rec)->exec, c->st);
        cu_check_launch(c, "replaying a decode step");
        return 1;
    }
    if (cu_attention_reserve(c, n)) return -1;
    if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        c->steps_off = 1;
        return -1;
    }
    cudaMemcpyAsync(c->d_step, c->h_step, sizeof(cu_step), cudaMemcpyHostToDevice, c->st);
    c->capturing = 1;
    return 0;
}

static void cu_step_end(sl_backend *b, void **rec) {
    cu_impl *c = cu_of(b);
    c->capturing = 0;
    cudaGraph_t g = NULL;
    cudaError_t err = cudaStreamEndCapture(c->st, &g);
    cu_rec *r = NULL;
    if (err == cudaSuccess && !c->failed && (r = (cu_rec *)calloc(1, sizeof *r))) {
        r->graph = g;
        r->regrown = c->regrown;
        err = cudaGraphInstantiateWithFlags(&r->exec, g, 0);
        if (err == cudaSuccess) err = cudaGraphLaunch(r->exec, c->st);
        if (err == cudaSuccess) {
            *rec = r;
            return;
        }
    }
    /* the step's ops did not run: report it, and issue later steps directly */
    cu_fail(c, "recording a decode step failed: %s", err != cudaSuccess ? cudaGetErrorString(err) : "out of memory");
    cudaGetLastError();
    if (r && r->exec) cudaGraphExecDestroy(r->exec);
    if (g) cudaGraphDestroy(g);
    free(r);
    c->steps_off = 1;
}

static void cu_step_free(sl_backend *b, void *rec) {
    cu_rec *r = (cu_rec *)rec;
    cudaStreamSynchronize(cu_of(b)->st);
    rec_free(r);
}

static const sl_backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .zero = cu_zero,
    .upload = cu_upload,
    .download = cu_download,
    .check = cu_check,
    .argmax = cu_argmax,
    .embed = cu_embed,
    .matmul = cu_matmul,
    .rmsnorm = cu_rmsnorm,
    .rope = cu_rope,
    .copy_rows = cu_copy_rows,
    .attention = cu_attention,
    .add = cu_add,
    .swiglu = cu_swiglu,
    .mul_sigmoid = cu_mul_sigmoid,
    .scale_rows_sigmoid = cu_scale_rows_sigmoid,
    .route = cu_route,
    .route_grouped = cu_route_grouped,
    .moe = cu_moe,
    .moe_pairs = cu_moe_pairs,
    .moe_combine = cu_moe_combine,
    .moe_guard = cu_moe_guard,
    .moe_handoff = cu_moe_handoff,
    .moe_await = cu_moe_await,
    .moe_pairs_put = cu_moe_pairs_put,
    .moe_pairs_get = NULL, /* the pair buffer is GPU memory */
    .conv1d_silu = cu_conv1d_silu,
    .deltanet = cu_deltanet,
    .conv1d_silu_seqs = cu_conv1d_silu_seqs,
    .deltanet_seqs = cu_deltanet_seqs,
    .gated_rmsnorm = cu_gated_rmsnorm,
    .kv_store = cu_kv_store,
    .mla_rope_store = cu_mla_rope_store,
    .mla_attention = cu_mla_attention,
    .add_rmsnorm = cu_add_rmsnorm,
    .matmul_multi = cu_matmul_multi,
    .matmul_multi_conv = cu_matmul_multi_conv,
    .swiglu_matmul = cu_swiglu_matmul,
    .moe_shared = cu_moe_shared,
    .moe_combine_shared = cu_moe_combine_shared,
    .sigmoid_matmul = cu_sigmoid_matmul,
    .gated_rmsnorm_matmul = cu_gated_rmsnorm_matmul,
    .qk_rope_store = cu_qk_rope_store,
    .place_weight = cu_place_weight,
    .supports = cu_supports,
    .place_vector = cu_place_vector,
    .place_experts = cu_place_experts,
    .mem_free = cu_mem_free,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .upload_async = cu_upload_async,
    .sync = cu_sync,
    .gds_open = cu_gds_open,
    .gds_file = cu_gds_file,
    .gds_file_close = cu_gds_file_close,
    .gds_read = cu_gds_read,
    .step_begin = cu_step_begin,
    .step_end = cu_step_end,
    .step_free = cu_step_free,
    .mem_bandwidth = cu_mem_bandwidth,
    .peak_flops = cu_peak_flops,
};

/* SLUICE_CUDA_UNFUSE=all or a comma list of fused op names: those ops are left out, so the models issue
 * the plain sequences instead (for measuring what each fusion gains). */
static void unfuse(sl_backend_ops *o, const char *list) {
    struct {
        const char *name;
        void **op;
    } f[] = {{"add_rmsnorm", (void **)&o->add_rmsnorm},
             {"matmul_multi", (void **)&o->matmul_multi},
             {"matmul_multi_conv", (void **)&o->matmul_multi_conv},
             {"swiglu_matmul", (void **)&o->swiglu_matmul},
             {"moe_shared", (void **)&o->moe_shared},
             {"moe_combine_shared", (void **)&o->moe_combine_shared},
             {"sigmoid_matmul", (void **)&o->sigmoid_matmul},
             {"gated_rmsnorm_matmul", (void **)&o->gated_rmsnorm_matmul},
             {"qk_rope_store", (void **)&o->qk_rope_store}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        const char *p = strstr(list, f[i].name);
        size_t len = strlen(f[i].name);
        if (!strcmp(list, "all") || (p && (p == list || p[-1] == ',') && (p[len] == ',' || !p[len]))) *f[i].op = NULL;
    }
}

static void cu_destroy(sl_backend *b) {
    cu_impl *c = cu_of(b);
    cudaStreamSynchronize(c->st);
    cu_gds_close(c);
    for (int i = 0; i < c->n_blocks; i++) cudaFree(c->blocks[i]);
    free(c->blocks);
    for (int i = 0; i < c->n_tables; i++)
        for (int j = 0; j < 2; j++) {
            cudaFreeHost(c->tables[i].h[j]);
            cudaEventDestroy(c->tables[i].copied[j]);
        }
    free(c->tables);
    cudaFree(c->wtmp);
    cudaFree(c->q16buf);
    cudaFree(c->dnbuf);
    cudaFree(c->xtmp);
    cudaFree(c->ids);
    cudaFree(c->att_part);
    cudaFree(c->att_tok);
    free(c->att_dec);
    cudaFree(c->moe_buf);
    cudaFree(c->put_pairs);
    cudaFree(c->put_rows);
    cudaFree(c->ho_rows);
    cudaFree(c->moe_grp);
    cudaFree(c->act);
    cudaFree(c->fa_part);
    cudaFree(c->d_step);
    cudaFreeHost(c->h_step);
    cudaFree(c->d_amax);
    cudaFreeHost(c->h_amax);
    if (c->blas) cublasDestroy(c->blas);
    if (c->st) cudaStreamDestroy(c->st);
    free(c);
    free(b);
}

__global__ void probe_k(int *p) {
    if (p) *p = 0;
}

int sl_cuda_backend_create(int device, sl_backend **out, char *about, size_t about_len) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n <= device) {
        snprintf(about, about_len, "no CUDA device: %s",
                 err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports none");
        cudaGetLastError();
        return -1;
    }
    cudaDeviceProp p;
    if ((err = cudaSetDevice(device)) != cudaSuccess || (err = cudaGetDeviceProperties(&p, device)) != cudaSuccess) {
        snprintf(about, about_len, "CUDA device %d: %s", device, cudaGetErrorString(err));
        return -1;
    }
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, probe_k) != cudaSuccess) {
        cudaGetLastError();
        snprintf(about, about_len, "%s is sm_%d%d, which this binary has no kernels for (built for %s)", p.name,
                 p.major, p.minor, SLUICE_CUDA_ARCHS);
        return -1;
    }
    sl_backend *b = (sl_backend *)calloc(1, sizeof *b);
    cu_impl *c = (cu_impl *)calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        snprintf(about, about_len, "out of memory");
        return -1;
    }
    c->ops = cuda_ops;
    const char *uf = getenv("SLUICE_CUDA_UNFUSE");
    if (uf) unfuse(&c->ops, uf);
    b->ops = &c->ops;
    b->impl = c;
    b->destroy = cu_destroy;
    c->dev = device;
    c->sms = p.multiProcessorCount;
    const char *g = getenv("SLUICE_CUDA_GRAPHS"); /* 0: issue every decode step's kernels (for comparison) */
    c->steps_off = g && !strcmp(g, "0");
    /* batches up to this size use the fp32 GEMV kernels, larger ones bf16 tensor cores */
    const char *gm = getenv("SLUICE_CUDA_GEMV_MAX");
    c->gemv_max = gm && atoi(gm) > 0 ? atoi(gm) : 0; /* 0: per weight format (cuda_matmul.cu) */
    /* batches of this many tokens or more run the grouped MoE kernels (SLUICE_CUDA_MOE_GROUP=0: never; unset, per
     * expert format: cuda_moe.cu) */
    const char *mg = getenv("SLUICE_CUDA_MOE_GROUP");
    c->moe_group_min = mg && *mg ? atoi(mg) : -1;
    const char *hr = getenv("SLUICE_CUDA_HALF_RPW");
    c->half_rpw4 = !(hr && !strcmp(hr, "2"));
    const char *pd = getenv("SLUICE_CUDA_PDL");
    c->pdl = p.major >= 9 && !(pd && !strcmp(pd, "0"));
    const char *rb = getenv("SLUICE_CUDA_RPW_BALANCE");
    c->rpw_balance = !(rb && !strcmp(rb, "0"));
    const char *fg = getenv("SLUICE_CUDA_F32_GEMM");
    c->f32_gemm = !(fg && !strcmp(fg, "0"));
    const char *dn = getenv("SLUICE_CUDA_DELTANET");
    c->dn_chunked = !(dn && !strcmp(dn, "recurrent"));
    c->smem_optin = p.sharedMemPerBlockOptin > 0 ? (int)p.sharedMemPerBlockOptin : 48 << 10;
    c->smem_sm = p.sharedMemPerMultiprocessor > 0 ? (int)p.sharedMemPerMultiprocessor : 64 << 10;
    const char *pf = getenv("SLUICE_CUDA_PREFILL");
    c->gemm_exact = pf && !strcmp(pf, "exact") ? 1 : pf && !strcmp(pf, "bf16") ? -1 : 0;
    const char *mq = getenv("SLUICE_CUDA_MMQ"), *mqm = getenv("SLUICE_CUDA_MMQ_MIN");
    c->mmq_min = mq && !strcmp(mq, "0") ? 0 : mqm && atoi(mqm) > 1 ? atoi(mqm) : 2;
    const char *dk = getenv("SLUICE_CUDA_DEC_KEYS");
    c->dec_keys = dk && atoi(dk) > 1 ? atoi(dk) : dk ? 1 : 32;
    const char *dp = getenv("SLUICE_CUDA_DEC_PF");
    c->dec_pf = dp && !strcmp(dp, "0") ? 0 : dp && !strcmp(dp, "1") ? 1 : 2;
    const char *mv = getenv("SLUICE_CUDA_MMVQ");
    /* to compare: 2 a row per warp, 3 a row per lane, 4 Q6_K two rows per lane read in place, 5 Q6_K read in
     * place, 6 and 7 Q6_K staged one and four rows a warp (two by default) */
    c->mmvq = !mv                     ? 1
              : !strcmp(mv, "0")      ? 0
              : !strcmp(mv, "rows1")  ? 2
              : !strcmp(mv, "r1")     ? 3
              : !strcmp(mv, "q6r2")   ? 4
              : !strcmp(mv, "q6win")  ? 5
              : !strcmp(mv, "q6sm1")  ? 6
              : !strcmp(mv, "q6sm4")  ? 7
                                      : 1;
    const char *ms = getenv("SLUICE_CUDA_MMQ_SPLIT");
    c->mmq_fill = ms && !strcmp(ms, "fill");
    const char *mj = getenv("SLUICE_CUDA_MMQ_JOIN");
    c->mmq_join = !(mj && !strcmp(mj, "0"));
    const char *mb = getenv("SLUICE_CUDA_MMQ_BLOCKS");
    c->mmq_three = !(mb && !strcmp(mb, "2"));
    const char *qf = getenv("SLUICE_CUDA_Q16_FUSE");
    c->q16_fuse = qf && !strcmp(qf, "0") ? -1 : 0; /* -1: never; 1 once a placed weight takes the integer GEMV */
    const char *im = getenv("SLUICE_CUDA_IMMA");
    c->imma = im && !strcmp(im, "0") ? 0 : im && !strcmp(im, "q4k") ? 2 : 1; /* 2: Q4_K only (to compare) */
    const char *fl = getenv("SLUICE_CUDA_FLASH");
    c->flash = !(fl && !strcmp(fl, "0"));
    const char *fs = getenv("SLUICE_CUDA_FLASH_SPLIT"), *fq = getenv("SLUICE_CUDA_FLASH_QSEP");
    c->fa_split = !(fs && !strcmp(fs, "0"));
    c->fa_qsep = fq && !strcmp(fq, "1");
    /* decode attention partials for up to 128 heads of up to 256 dims, so recorded steps never grow them */
    size_t part = (size_t)128 * 64 * 258 * sizeof(float);
    if (cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(c->blas, c->st) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc((void **)&c->d_step, sizeof(cu_step)) != cudaSuccess ||
        cudaMallocHost((void **)&c->h_step, sizeof(cu_step)) != cudaSuccess ||
        cudaMalloc((void **)&c->att_part, part) != cudaSuccess || cu_ggml_init()) {
        snprintf(about, about_len, "setting up %s: %s", p.name, cudaGetErrorString(cudaGetLastError()));
        cu_destroy(b);
        return -1;
    }
    c->att_part_len = part;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    snprintf(about, about_len, "%s, sm_%d%d, %.1f GiB free of %.1f GiB", p.name, p.major, p.minor,
             (double)fr / (1 << 30), (double)tot / (1 << 30));
    *out = b;
    return 0;
}
