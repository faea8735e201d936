/* Expert streaming: every MoE fixture run with its experts in a cache of a few slots (two per MoE layer,
 * or top-k when that is more), read from disk as the tokens route to them, must give the logits of the
 * resident model bit for bit — prefill (in passes, since a prompt needs more experts than fit) and
 * decode (with reads ahead), buffered and O_DIRECT, through io_uring and through the pread threads.
 * And a checkpoint whose expert file is cut short mid-run ends the request with an error naming the
 * file, then works again once the file is whole. An expert pack (sluice pack) is read one read per
 * expert to the same logits, and ignored once the checkpoint changes. With a host cache and experts
 * computed on the CPU from it (--cpu-experts on and auto), the logits stay within the backend's tolerance
 * of the resident model's (on the CPU backend, whose slots then fill from the host cache as a GPU's do:
 * bit for bit); with them off, bit for bit everywhere. Decode steps run on the device against the slot
 * tables (--device-steps on) give the same logits whether they stand or miss and run again from the saved
 * state (hybrid models' recurrent state included), and so do steps that read the host cache's experts where
 * they are (--device-steps host). Runs on the backend SLUICE_BACKEND names. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "experts/layout.h"
#include "experts/pack.h"
#include "experts/store.h"
#include "formats/st_write.h"
#include "runtime/session.h"
#include "testutil.h"

typedef struct run {
    float *logits; /* [n + nd][vocab] */
    size_t len;
} run;

static int32_t *ids_of(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n ? *n : 1));
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return ids;
}

/* Prefill as one batch (every position's logits), then each decode id through the cache. */
static int forward_all(sl_model *m, const int32_t *p, int n, const int32_t *d, int nd, run *r, sl_err *e) {
    sl_session *s;
    if (sl_session_create(m, n + nd, &s, e)) return -1;
    size_t V = (size_t)m->cfg.vocab_size;
    r->len = (size_t)(n + nd) * V;
    r->logits = malloc(r->len * sizeof(float));
    int rc = sl_session_forward(s, p, n, r->logits, 1, e);
    for (int i = 0; !rc && i < nd; i++) rc = sl_session_forward(s, d + i, 1, r->logits + (size_t)(n + i) * V, 0, e);
    sl_session_free(s);
    return rc;
}

static int moe_layers(const sl_model *m) {
    int c = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) c += m->layers[l].moe != NULL;
    return c;
}

/* Two expert slots per MoE layer, at least one token's top-k: a cache that must read nearly every step. */
static int tiny_slots(const sl_model *m) {
    int slots = 2 * moe_layers(m);
    return slots > m->cfg.top_k ? slots : m->cfg.top_k;
}

/* The model at path loaded with o (NULL: the defaults), its decode steps issued kernel by kernel: a recorded
 * step may split attention otherwise, so references and streamed runs compare alike. */
static sl_model *load_unrecorded(const char *path, const sl_model_opts *o) {
    sl_err e = {{0}};
    sl_model *m;
    setenv("SLUICE_CUDA_GRAPHS", "0", 1);
    cr_assert_eq(sl_model_load(path, o, &m, &e), 0, "%s: %s", path, e.msg);
    unsetenv("SLUICE_CUDA_GRAPHS");
    return m;
}

/* The fixture's logits resident, then streamed under each I/O mode and engine; all must be equal. */
static void check_streams(const char *rel) {
    char *path = tu_fixture(rel);
    char *dir = strdup(path);
    char *slash = strrchr(dir, '/');
    if (strstr(rel, ".gguf") && slash) *slash = 0;
    char *exp_path = sl_path_join(dir, "expected.json");
    json_error_t je;
    json_t *ex = json_load_file(exp_path, 0, &je);
    cr_assert(ex, "%s: %s", exp_path, je.text);
    int n, nd;
    int32_t *p = ids_of(json_object_get(ex, "prompt_ids"), &n), *d = ids_of(json_object_get(ex, "decode_ids"), &nd);
    sl_err e = {{0}};
    sl_model *m = load_unrecorded(path, NULL);
    cr_assert_null(m->store, "%s: resident by default", rel);
    run ref;
    cr_assert_eq(forward_all(m, p, n, d, nd, &ref, &e), 0, "%s", e.msg);
    int slots = tiny_slots(m);
    int gds = m->be->ops->gds_open != NULL; /* GPUDirect Storage too, where libcufile loads */
    sl_model_free(m);
    const char *modes[][2] = {
        {"buffered", "uring"}, {"direct", "uring"}, {"buffered", "pread"}, {"direct", "pread"}, {"gds", "pread"}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0] - !gds; i++) {
        setenv("SLUICE_IO_ENGINE", modes[i][1], 1);
        sl_io_mode io;
        sl_io_mode_parse(modes[i][0], &io);
        /* bit for bit: every expert through a slot (CPU experts are within the bf16 tolerance, see below) */
        sl_model_opts o = {.expert_slots = slots, .io = (int)io, .cpu_experts = SL_CPU_EXPERTS_OFF};
        if (io == SL_IO_GDS && sl_model_load(path, &o, &m, &e)) {
            /* GPUDirect reads need libcufile and a file system cuFile takes; SLUICE_TEST_GDS=1 (the GPU
             * machine, set up for it) makes their absence a failure */
            cr_assert(!getenv("SLUICE_TEST_GDS") && strstr(e.msg, "--io gds"), "%s (gds): %s", rel, e.msg);
            cr_log_info("%s: %s; GPUDirect reads not tested", rel, e.msg);
            continue;
        }
        if (io != SL_IO_GDS) cr_assert_eq(sl_model_load(path, &o, &m, &e), 0, "%s: %s", rel, e.msg);
        cr_assert_not_null(m->store);
        run got;
        cr_assert_eq(forward_all(m, p, n, d, nd, &got, &e), 0, "%s (%s, %s): %s", rel, modes[i][0], modes[i][1], e.msg);
        sl_store_stats st;
        sl_store_stats_get(m->store, &st);
        cr_assert_gt(st.misses, (uint64_t)slots, "%s: the experts were read as needed", rel);
        cr_assert_gt(st.bytes_read, 0);
        cr_assert_eq(got.len, ref.len);
        size_t V = (size_t)m->cfg.vocab_size;
        for (size_t r = 0; r < got.len / V; r++)
            cr_assert(!memcmp(got.logits + r * V, ref.logits + r * V, V * sizeof(float)),
                      "%s (%s, %s, %d slots): row %zu of the logits differs from the resident model's", rel,
                      modes[i][0], modes[i][1], slots, r);
        free(got.logits);
        sl_model_free(m);
    }
    unsetenv("SLUICE_IO_ENGINE");
    free(ref.logits);
    free(p);
    free(d);
    json_decref(ex);
    free(exp_path);
    free(dir);
    free(path);
}

#define STREAM_FIXTURE(name, rel)                                                                                      \
    Test(streaming, name) {                                                                                            \
        check_streams(rel);                                                                                            \
    }
STREAM_FIXTURE(qwen3_moe, "models/qwen3_moe")
STREAM_FIXTURE(qwen3_moe_mlx_mixed, "models/qwen3_moe_mlx_mixed")
STREAM_FIXTURE(qwen3_5_moe, "models/qwen3_5_moe")
STREAM_FIXTURE(qwen3_5_moe_mlx4, "models/qwen3_5_moe_mlx4")
STREAM_FIXTURE(qwen3_5_moe_long, "models/qwen3_5_moe_long")
STREAM_FIXTURE(mixtral, "families/mixtral")
STREAM_FIXTURE(qwen3_next, "families/qwen3_next")
STREAM_FIXTURE(deepseek_v3, "families/deepseek_v3")
STREAM_FIXTURE(deepseek_v3_fp8, "families/deepseek_v3_fp8")
STREAM_FIXTURE(glm4_moe, "families/glm4_moe")
STREAM_FIXTURE(gpt_oss, "families/gpt_oss")
STREAM_FIXTURE(gpt_oss_mxfp4, "families/gpt_oss_mxfp4")

/* every GGUF fixture with experts (tests/fixtures/gguf/NAME/model.gguf) */
ParameterizedTestParameters(streaming, gguf) {
    size_t n;
    tu_name *names = tu_fixture_names("gguf", "model.gguf", 1, &n);
    return cr_make_param_array(tu_name, names, n, tu_free_names);
}

ParameterizedTest(tu_name *f, streaming, gguf) {
    char rel[160];
    snprintf(rel, sizeof rel, "gguf/%s/model.gguf", f->s);
    cr_log_info("%s", rel);
    check_streams(rel);
}

Test(streaming, gguf_found) {
    tu_expect_fixtures("gguf", "model.gguf", 1, (const char *const[]){TU_GGUF_SHIPPED_MOE, NULL},
                       (const char *const[]){"llama-Q8_0", "llama-Q4_0", "llama-Q6_K", NULL});
}

/* ---- experts computed on the CPU from the host cache ---- */

/* Rows of got against ref: equal bits on the CPU backend, else within the bf16 tolerance with the same
 * argmax. */
static void expect_close(const run *got, const run *ref, size_t V, int cpu, const char *what) {
    cr_assert_eq(got->len, ref->len);
    for (size_t r = 0; r < got->len / V; r++) {
        const float *g = got->logits + r * V, *f = ref->logits + r * V;
        if (cpu) {
            cr_assert(!memcmp(g, f, V * sizeof(float)), "%s: row %zu differs from the resident model's", what, r);
        } else {
            double d = tu_rel_l2(g, f, V);
            cr_assert(d <= 3e-2, "%s: row %zu rel-L2 %g", what, r, d);
            cr_assert_eq(tu_argmax(g, (int)V), tu_argmax(f, (int)V), "%s: row %zu argmax", what, r);
        }
    }
}

/* The prompt and decode ids of the checks below. */
static const int32_t check_prompt[16] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3},
                     check_decode[8] = {2, 3, 8, 4, 6, 2, 6, 4};
#define CHECK_NP 16
#define CHECK_ND 8

/* The resident model's logits for check_prompt and check_decode, issued kernel by kernel; the model stays loaded for
 * the caller to read its shape, and to free. */
static sl_model *resident_ref(const char *path, run *ref) {
    sl_err e = {{0}};
    sl_model *m = load_unrecorded(path, NULL);
    cr_assert_eq(forward_all(m, check_prompt, CHECK_NP, check_decode, CHECK_ND, ref, &e), 0, "%s", e.msg);
    return m;
}

/* check_prompt and check_decode through m into *got; the store's counters of that run. */
static sl_store_stats counted_run(sl_model *m, run *got, const char *rel) {
    sl_err e = {{0}};
    sl_store_stats a, b;
    sl_store_stats_get(m->store, &a);
    cr_assert_eq(forward_all(m, check_prompt, CHECK_NP, check_decode, CHECK_ND, got, &e), 0, "%s: %s", rel, e.msg);
    sl_store_stats_get(m->store, &b);
    return sl_store_stats_since(&a, &b);
}

/* Device steps (--device-steps on): with slots for a part of the experts (1 / part), decode steps miss
 * and run again from the state saved before them; with a slot for every expert, a second pass over the same tokens
 * finds them all in slots and its steps stand. Issued kernel by kernel both give the resident logits bit for bit;
 * recorded and replayed (CUDA graphs), within the tolerance of expect_close. */
static void check_device_steps(const char *rel, int part) {
    char *path = tu_fixture(rel);
    sl_err e = {{0}};
    run ref;
    sl_model *m = resident_ref(path, &ref);
    int all = moe_layers(m) * m->cfg.n_experts, few = all / part > tiny_slots(m) ? all / part : tiny_slots(m),
        cpu = m->be->ops->place_weight == NULL, nd = CHECK_ND;
    size_t V = (size_t)m->cfg.vocab_size;
    sl_model_free(m);
    setenv("SLUICE_CUDA_GRAPHS", "0", 1);
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 2) unsetenv("SLUICE_CUDA_GRAPHS");
        sl_model_opts o = {
            .expert_slots = pass ? all : few, .cpu_experts = SL_CPU_EXPERTS_OFF, .device_steps = SL_DEVICE_STEPS_ON};
        cr_assert_eq(sl_model_load(path, &o, &m, &e), 0, "%s: %s", rel, e.msg);
        cr_assert_not_null(m->store);
        run got;
        if (pass) { /* the first run reads every expert these tokens use */
            counted_run(m, &got, rel);
            free(got.logits);
        }
        sl_store_stats s = counted_run(m, &got, rel);
        char what[200];
        snprintf(what, sizeof what, "%s, device steps, %d slots%s", rel, pass ? all : few,
                 pass == 2 ? ", recorded" : "");
        if (pass)
            cr_assert(s.steps_device == (uint64_t)nd && !s.steps_redone && !s.misses,
                      "%s: %llu of %d decode steps stood on the device, %llu redone, %llu experts read", what,
                      (unsigned long long)s.steps_device, nd, (unsigned long long)s.steps_redone,
                      (unsigned long long)s.misses);
        else
            cr_assert_gt(s.steps_redone, 0, "%s: no decode step missed an expert (%llu stood)", what,
                         (unsigned long long)s.steps_device);
        expect_close(&got, &ref, V, cpu || pass < 2, what);
        free(got.logits);
        sl_model_free(m);
    }
    free(ref.logits);
    free(path);
}

/* Device steps that read the host cache (--device-steps host): preloaded, the host cache has every
 * expert from the first step on; else it fills as they are used. With CPU experts (share), half of the
 * host cache experts in no slot are the CPU's, each MoE layer handed to the host and back inside the step.
 * Each gives the resident logits (bit for bit on the CPU). */
static void check_host_reads(const char *rel) {
    char *path = tu_fixture(rel);
    run ref;
    sl_model *m = resident_ref(path, &ref);
    size_t V = (size_t)m->cfg.vocab_size;
    int few = tiny_slots(m), nd = CHECK_ND, all = moe_layers(m) * m->cfg.n_experts;
    sl_model_free(m);
    int64_t ram = (int64_t)256 << 20;
    /* modes: 0 not preloaded, 1 preloaded, 2 the CPU's part, 3 the same chosen by auto (a host cache of
     * every expert, slots for at most a quarter of them), its part as measured */
    for (int mode = 0; mode < (few * 4 <= all ? 4 : 3); mode++) {
        int preload = mode > 0, share = mode >= 2;
        sl_model_opts o = {.expert_slots = few,
                           .ram = ram,
                           .staged_ram = ram,
                           .cpu_experts = share ? SL_CPU_EXPERTS_AUTO : SL_CPU_EXPERTS_OFF,
                           .device_steps = mode == 3 ? SL_DEVICE_STEPS_AUTO : SL_DEVICE_STEPS_HOST,
                           .no_preload = !preload};
        if (mode == 2) setenv("SLUICE_CPU_SHARE", "0.5", 1);
        m = load_unrecorded(path, &o);
        unsetenv("SLUICE_CPU_SHARE");
        cr_assert_not_null(m->store);
        sl_store_stats ld;
        sl_store_stats_get(m->store, &ld);
        cr_assert(preload ? ld.preload_bytes > 0 : ld.preload_bytes == 0, "%s: %llu bytes preloaded", rel,
                  (unsigned long long)ld.preload_bytes);
        run got;
        if (!preload) {
            counted_run(m, &got, rel); /* reads every expert these tokens use into the host cache */
            free(got.logits);
        }
        sl_store_stats st = counted_run(m, &got, rel);
        char what[200];
        snprintf(what, sizeof what, "%s, device steps reading the host cache, %d slots%s%s", rel, few,
                 preload ? ", preloaded" : "",
                 mode == 2   ? ", half of it the CPU's"
                 : mode == 3 ? ", chosen by auto"
                             : "");
        cr_assert(st.steps_device == (uint64_t)nd && !st.steps_redone,
                  "%s: %llu of %d decode steps stood on the device, %llu redone", what,
                  (unsigned long long)st.steps_device, nd, (unsigned long long)st.steps_redone);
        cr_assert_gt(st.hits_ram, 0, "%s: no expert was read from the host cache", what);
        cr_assert(!preload || (!st.misses && !st.bytes_read), "%s: %llu experts read from the file", what,
                  (unsigned long long)st.misses);
        cr_assert(mode == 2  ? st.cpu_experts > 0
                  : mode < 2 ? st.cpu_experts == 0
                             : 1,
                  "%s: %llu experts computed on the CPU", what, (unsigned long long)st.cpu_experts);
        expect_close(&got, &ref, V, !share || !m->be->ops->place_weight, what);
        free(got.logits);
        sl_model_free(m);
    }
    free(ref.logits);
    free(path);
}

Test(device_steps, host_reads_qwen3_5_moe) {
    check_host_reads("models/qwen3_5_moe");
}
Test(device_steps, host_reads_gguf_qwen3_5_moe) {
    check_host_reads("gguf/qwen3_5_moe-Q4_K_M/model.gguf");
}
Test(device_steps, host_reads_gpt_oss) {
    check_host_reads("families/gpt_oss");
}

Test(device_steps, qwen3_5_moe) {
    check_device_steps("models/qwen3_5_moe", 4);
}
Test(device_steps, qwen3_moe_mlx_mixed) {
    check_device_steps("models/qwen3_moe_mlx_mixed", 4);
}
Test(device_steps, deepseek_v3) {
    check_device_steps("families/deepseek_v3", 4);
}
Test(device_steps, gpt_oss) {
    check_device_steps("families/gpt_oss", 2);
}
Test(device_steps, qwen3_next) {
    check_device_steps("families/qwen3_next", 4);
}
Test(device_steps, gguf_qwen3_5_moe) {
    check_device_steps("gguf/qwen3_5_moe-Q4_K_M/model.gguf", 4);
}

/* The fixture with a few slots filled from a host cache that holds every expert (ram), or from staging
 * buffers alone, the page cache serving (ram 1), under --cpu-experts off, on and auto: on computes every
 * expert found in host memory on the CPU, off none, and auto what its planner picks; all give the
 * resident logits (see expect_close). */
static void check_cpu_experts(const char *rel, int64_t ram) {
    char *path = tu_fixture(rel);
    sl_err e = {{0}};
    run ref;
    sl_model *m = resident_ref(path, &ref);
    int slots = tiny_slots(m);
    int cpu = !m->be->ops->place_weight;
    size_t V = (size_t)m->cfg.vocab_size;
    sl_model_free(m);
    const char *names[] = {"auto", "on", "off", "off"};
    /* the last run reads with O_DIRECT: aligned windows, copied into the slots piece by piece */
    for (int run_i = 0; run_i < 4; run_i++) {
        int mode = run_i < 3 ? run_i : SL_CPU_EXPERTS_OFF, direct = run_i == 3;
        sl_model_opts o = {.expert_slots = slots,
                           .ram = ram,
                           .staged_ram = ram,
                           .cpu_experts = mode,
                           .io = direct ? SL_IO_DIRECT : SL_IO_BUFFERED};
        cr_assert_eq(sl_model_load(path, &o, &m, &e), 0, "%s: %s", rel, e.msg);
        cr_assert_not_null(m->store);
        run got;
        cr_assert_eq(forward_all(m, check_prompt, CHECK_NP, check_decode, CHECK_ND, &got, &e), 0,
                     "%s (cpu experts %s): %s", rel, names[run_i], e.msg);
        sl_store_stats st;
        sl_store_stats_get(m->store, &st);
        cr_assert_eq(st.n_ram > 0, ram > 1, "%s: a host cache only when asked for", rel);
        if (ram > 1 && mode != SL_CPU_EXPERTS_ON)
            cr_assert_gt(st.hits_ram, 0, "%s (%s): experts were found in the host cache", rel, names[run_i]);
        if (mode == SL_CPU_EXPERTS_ON) {
            cr_assert_gt(st.cpu_experts, 0, "%s: experts were computed on the CPU", rel);
            cr_assert_eq(st.cpu_experts, st.hits_ram + st.hits_mapped, "%s: every expert in host memory on the CPU",
                         rel);
            if (ram <= 1) cr_assert_gt(st.hits_mapped, 0, "%s: experts computed from the page cache", rel);
        }
        if (mode == SL_CPU_EXPERTS_OFF)
            cr_assert_eq(st.cpu_experts + st.hits_mapped, 0, "%s: none on the CPU when off", rel);
        /* every slot filled by a read (a read ahead may still be in flight at the end) */
        if (mode == SL_CPU_EXPERTS_OFF && ram <= 1 && !direct)
            cr_assert(st.copies >= st.misses && st.copies <= st.misses + st.prefetched,
                      "%s: buffered reads land as the slot lays the expert out, so one copy fills it (%llu copies for "
                      "%llu experts read, %llu of them ahead)",
                      rel, (unsigned long long)st.copies, (unsigned long long)(st.misses + st.prefetched),
                      (unsigned long long)st.prefetched);
        if (mode != SL_CPU_EXPERTS_OFF) {
            cr_assert_gt(st.copy_s, 0, "%s: the copy of an expert was measured", rel);
            cr_assert_gt(st.cpu_t1_s, 0, "%s: the CPU's time for an expert was measured", rel);
        }
        cr_log_info("%s, %s, cpu experts %s: %llu of %llu lookups on the CPU (copy %.3f ms, CPU %.3f ms + %.3f "
                    "ms/token)",
                    rel, ram > 1 ? "host cache" : "page cache", names[run_i], (unsigned long long)st.cpu_experts,
                    (unsigned long long)st.lookups, st.copy_s * 1e3, st.cpu_t1_s * 1e3, st.cpu_tm_s * 1e3);
        char what[200];
        snprintf(what, sizeof what, "%s (cpu experts %s, %d slots%s)", rel, names[run_i], slots,
                 direct ? ", O_DIRECT" : "");
        expect_close(&got, &ref, V, cpu || mode == SL_CPU_EXPERTS_OFF, what);
        free(got.logits);
        sl_model_free(m);
    }
    free(ref.logits);
    free(path);
}

/* auto leaves a prompt's experts to the backend (more than SL_CPU_AUTO_PAIRS routed pairs in a layer: they
 * serve many tokens each) and plans the CPU for decode steps alone; on computes the prompt's experts found
 * in host memory too. */
Test(cpu_experts, auto_leaves_prompts_to_the_backend) {
    char *path = tu_fixture("models/qwen3_moe");
    sl_err e = {{0}};
    enum { N_PROMPT = 80 };
    int32_t p[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) p[i] = (i * 7 + 3) % 97;
    for (int on = 0; on < 2; on++) {
        sl_model *m;
        sl_model_opts ro = {0};
        cr_assert_eq(sl_model_load(path, &ro, &m, &e), 0, "%s", e.msg);
        int slots = tiny_slots(m);
        cr_assert_gt(N_PROMPT * m->cfg.top_k, SL_CPU_AUTO_PAIRS);
        sl_model_free(m);
        sl_model_opts o = {.expert_slots = slots,
                           .ram = 256 << 20,
                           .staged_ram = 256 << 20,
                           .cpu_experts = on ? SL_CPU_EXPERTS_ON : SL_CPU_EXPERTS_AUTO,
                           .io = SL_IO_BUFFERED};
        cr_assert_eq(sl_model_load(path, &o, &m, &e), 0, "%s", e.msg);
        run got;
        /* twice, so that the second prompt finds its experts in the host cache */
        for (int r = 0; r < 2; r++) {
            cr_assert_eq(forward_all(m, p, N_PROMPT, NULL, 0, &got, &e), 0, "%s", e.msg);
            free(got.logits);
        }
        sl_store_stats st;
        sl_store_stats_get(m->store, &st);
        if (on) {
            cr_assert_gt(st.cpu_experts, 0, "on: the prompt's experts in host memory were computed on the CPU");
        } else {
            cr_assert_eq(st.cpu_experts, 0, "auto: %llu of the prompt's experts were computed on the CPU",
                         (unsigned long long)st.cpu_experts);
            /* the prompt's experts read into slots, their images kept: the second prompt's copies */
            cr_assert_gt(st.hits_ram, 0, "auto: the second prompt found experts in the host cache");
        }
        sl_model_free(m);
    }
    free(path);
}

#define CPU_EXPERTS_FIXTURE(name, rel)                                                                                 \
    Test(cpu_experts, name) {                                                                                          \
        check_cpu_experts(rel, 256 << 20);                                                                             \
    }                                                                                                                  \
    Test(cpu_experts, name##_page_cache) {                                                                             \
        check_cpu_experts(rel, 1);                                                                                     \
    }
CPU_EXPERTS_FIXTURE(qwen3_moe, "models/qwen3_moe")
CPU_EXPERTS_FIXTURE(qwen3_5_moe_mlx4, "models/qwen3_5_moe_mlx4")
CPU_EXPERTS_FIXTURE(deepseek_v3_fp8, "families/deepseek_v3_fp8")
CPU_EXPERTS_FIXTURE(gpt_oss_mxfp4, "families/gpt_oss_mxfp4")
CPU_EXPERTS_FIXTURE(glm4_moe, "families/glm4_moe")
CPU_EXPERTS_FIXTURE(qwen3_next, "families/qwen3_next")
CPU_EXPERTS_FIXTURE(gguf_q4_k, "gguf/qwen3_moe-Q4_K_M/model.gguf")
CPU_EXPERTS_FIXTURE(gguf_mixtral_q8, "gguf/mixtral-Q8_0/model.gguf")

/* ---- a checkpoint cut short ---- */

static void copy_bytes(void *ctx, const sl_st_wtensor *t, uint64_t off, uint8_t *buf, size_t n) {
    const sl_st_set *src = ctx;
    memcpy(buf, src->tensors[t->kind].data + off, n);
}

static int is_expert(const char *name) {
    return strstr(name, ".experts.") != NULL;
}

/* The fixture rewritten as shards: the dense tensors in the first, the experts in the rest, so the
 * expert files can be damaged while the dense weights stay readable. Returns the last shard's path. */
static char *shard_experts(const char *src_dir, const char *dst, sl_err *e) {
    sl_st_set *set = NULL;
    cr_assert_eq(sl_st_open_dir(src_dir, &set, e), 0, "%s", e->msg);
    sl_st_wtensor *t = calloc((size_t)set->n_tensors, sizeof *t);
    int k = 0;
    uint64_t dense = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < set->n_tensors; i++) {
            const sl_st_tensor *s = &set->tensors[i];
            if (is_expert(s->name) != pass) continue;
            snprintf(t[k].name, sizeof t[k].name, "%s", s->name);
            t[k].dtype = s->dtype;
            t[k].ndim = s->ndim;
            memcpy(t[k].shape, s->shape, sizeof s->shape);
            t[k].kind = i;
            if (!pass) dense += s->nbytes;
            k++;
        }
    cr_assert_eq(sl_st_write(dst, t, k, dense, copy_bytes, NULL, set, e), 0, "%s", e->msg);
    free(t);
    sl_st_close(set);
    /* config.json beside it */
    char *cs = sl_path_join(src_dir, "config.json"), *cd = sl_path_join(dst, "config.json");
    size_t len;
    char *cfg = tu_slurp(cs, &len);
    cr_assert_eq(sl_write_file(cd, cfg, len, e), 0, "%s", e->msg);
    free(cfg);
    free(cs);
    free(cd);
    sl_st_set *out = NULL;
    cr_assert_eq(sl_st_open_dir(dst, &out, e), 0, "%s", e->msg);
    cr_assert_gt(out->n_files, 1, "the experts went to a shard of their own");
    char *last = strdup(out->paths[out->n_files - 1]);
    for (int i = 0; i < out->n_tensors; i++)
        if (out->tensors[i].file == out->n_files - 1)
            cr_assert(is_expert(out->tensors[i].name), "%s: only experts in the last shard", out->tensors[i].name);
    sl_st_close(out);
    return last;
}

/* Cuts the expert shard of a loaded model in half: the next request fails naming the file, and once the
 * file is whole again the same model gives the resident logits. With cpu_experts, a host cache feeds the
 * slots and the CPU computes its hits while the reads of the others fail. 1 when io is not available
 * here. */
static int truncated_case(const char *dir, const char *shard, const char *whole, size_t len, sl_io_mode io,
                          int cpu_experts) {
    sl_err e = {{0}};
    sl_model *m;
    sl_model_opts o = {.expert_slots = 8, .io = (int)io, .cpu_experts = SL_CPU_EXPERTS_OFF};
    if (cpu_experts) {
        o.ram = o.staged_ram = 64 << 20;
        o.cpu_experts = SL_CPU_EXPERTS_ON;
        o.no_preload = 1; /* reads while requests run */
    }
    if (io == SL_IO_GDS && sl_model_load(dir, &o, &m, &e)) {
        cr_assert(!getenv("SLUICE_TEST_GDS") && strstr(e.msg, "--io gds"), "gds: %s", e.msg);
        return 1;
    }
    if (io != SL_IO_GDS) cr_assert_eq(sl_model_load(dir, &o, &m, &e), 0, "%s", e.msg);
    int32_t p1[] = {1, 2, 3, 4, 5, 6, 7, 8}, p2[] = {50, 60, 70, 80, 90, 100, 110, 120};
    run ref, got;
    cr_assert_eq(forward_all(m, p1, 8, NULL, 0, &ref, &e), 0, "%s", e.msg);
    free(ref.logits);
    cr_assert_eq(truncate(shard, (off_t)(len / 2)), 0);
    int rc = forward_all(m, p2, 8, NULL, 0, &got, &e);
    free(got.logits);
    cr_assert_neq(rc, 0, "reading experts past the end of a truncated file must fail (%s)", sl_io_mode_name(io));
    cr_assert(strstr(e.msg, shard) && strstr(e.msg, "truncated"), "the error names the file: %s", e.msg);
    cr_assert_eq(sl_write_file(shard, whole, len, &e), 0, "%s", e.msg);
    cr_assert_eq(forward_all(m, p2, 8, NULL, 0, &got, &e), 0, "after the file is restored: %s", e.msg);
    sl_model *r = load_unrecorded(dir, NULL);
    cr_assert_eq(forward_all(r, p2, 8, NULL, 0, &ref, &e), 0, "%s", e.msg);
    if (cpu_experts) {
        sl_store_stats st;
        sl_store_stats_get(m->store, &st);
        cr_assert_gt(st.cpu_experts, 0, "experts of the host cache were computed on the CPU");
    }
    expect_close(&got, &ref, (size_t)r->cfg.vocab_size, !cpu_experts || !r->be->ops->place_weight,
                 "logits after recovery");
    int gds = r->be->ops->gds_open != NULL;
    free(ref.logits);
    free(got.logits);
    sl_model_free(r);
    sl_model_free(m);
    return gds ? 0 : 2;
}

Test(streaming, truncated_expert_file) {
    char *src = tu_fixture("models/qwen3_5_moe");
    char *tmp = tu_tmpdir();
    sl_err e = {{0}};
    char *shard = shard_experts(src, tmp, &e);
    size_t len;
    char *whole = tu_slurp(shard, &len);
    /* buffered reads, then GPUDirect ones where the backend has them */
    if (truncated_case(tmp, shard, whole, len, SL_IO_AUTO, 0) == 0 &&
        truncated_case(tmp, shard, whole, len, SL_IO_GDS, 0) == 1)
        cr_log_info("GPUDirect reads not tested: cuFile is not available here");
    truncated_case(tmp, shard, whole, len, SL_IO_AUTO, 1);
    /* a host cache that holds every expert reads them at load: the load fails naming the file (its
     * table, checked first, already says the data is short) */
    cr_assert_eq(truncate(shard, (off_t)(len / 2)), 0);
    sl_model_opts o = {.expert_slots = 8, .ram = 64 << 20, .staged_ram = 64 << 20};
    sl_model *m = NULL;
    cr_assert_neq(sl_model_load(tmp, &o, &m, &e), 0, "preloading experts from a truncated file must fail");
    cr_assert(strstr(e.msg, shard), "the error names the file: %s", e.msg);
    cr_assert_eq(sl_write_file(shard, whole, len, &e), 0, "%s", e.msg);
    free(whole);
    free(shard);
    free(tmp);
    free(src);
}

/* Copies the files of a fixture (a directory, or a .gguf file) into dir; the model's path there. */
static char *copy_fixture(const char *rel, const char *dir) {
    char *src = tu_fixture(rel);
    const char *names[] = {"config.json", "model.safetensors"};
    char *out;
    size_t len;
    sl_err e = {{0}};
    if (strstr(rel, ".gguf")) {
        out = sl_path_join(dir, "model.gguf");
        char *data = tu_slurp(src, &len);
        cr_assert_eq(sl_write_file(out, data, len, &e), 0, "%s", e.msg);
        free(data);
    } else {
        out = strdup(dir);
        for (int i = 0; i < 2; i++) {
            char *a = sl_path_join(src, names[i]), *b = sl_path_join(dir, names[i]);
            char *data = tu_slurp(a, &len);
            cr_assert_eq(sl_write_file(b, data, len, &e), 0, "%s", e.msg);
            free(data);
            free(a);
            free(b);
        }
    }
    free(src);
    return out;
}

/* Packs a copy of the fixture; streamed through the pack it gives the resident logits with one read per
 * expert; after the checkpoint changes the pack is left aside; a pack cut short fails naming it. */
static void check_pack(const char *rel) {
    char *tmp = tu_tmpdir();
    char *path = copy_fixture(rel, tmp);
    sl_err e = {{0}};
    sl_model *m;
    sl_model_opts ro = {.backend = "cpu"};
    cr_assert_eq(sl_model_load(path, &ro, &m, &e), 0, "%s", e.msg);
    char *pk = sl_pack_path(m->st);
    int n = 0;
    uint64_t bytes = 0;
    cr_assert_eq(sl_pack_write(m, pk, NULL, NULL, &n, &bytes, &e), 0, "%s", e.msg);
    cr_assert_gt(n, 0);
    int slots = tiny_slots(m);
    sl_model_free(m);
    /* the reference and the streamed runs on the backend under test; the pack is written on the CPU */
    int32_t p[] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, d[] = {9, 7, 9};
    run ref, got;
    m = load_unrecorded(path, NULL);
    cr_assert_eq(forward_all(m, p, 12, d, 3, &ref, &e), 0, "%s", e.msg);
    sl_model_free(m);
    for (int stale = 0; stale < 2; stale++) {
        sl_model_opts o = {.expert_slots = slots, .cpu_experts = SL_CPU_EXPERTS_OFF};
        cr_assert_eq(sl_model_load(path, &o, &m, &e), 0, "%s", e.msg);
        cr_assert_eq(forward_all(m, p, 12, d, 3, &got, &e), 0, "%s: %s", rel, e.msg);
        sl_store_stats st;
        sl_store_stats_get(m->store, &st);
        cr_assert_eq(st.packed, !stale, "%s: the pack is %s", rel, stale ? "stale" : "current");
        if (!stale)
            cr_assert_eq(st.reads, st.misses + st.prefetched, "%s: one read per expert (%llu reads, %llu experts)", rel,
                         (unsigned long long)st.reads, (unsigned long long)(st.misses + st.prefetched));
        cr_assert(!memcmp(got.logits, ref.logits, ref.len * sizeof(float)), "%s: logits through the %s pack", rel,
                  stale ? "stale" : "current");
        free(got.logits);
        sl_model_free(m);
        /* a checkpoint file written again (same bytes, a new time) makes the pack stale */
        char *f = strstr(rel, ".gguf") ? strdup(path) : sl_path_join(path, "model.safetensors");
        size_t len;
        char *data = tu_slurp(f, &len);
        cr_assert_eq(sl_write_file(f, data, len, &e), 0, "%s", e.msg);
        free(data);
        free(f);
    }
    /* written again, then cut short while in use: the request fails naming the pack */
    cr_assert_eq(sl_model_load(path, &ro, &m, &e), 0, "%s", e.msg);
    cr_assert_eq(sl_pack_write(m, pk, NULL, NULL, &n, &bytes, &e), 0, "%s", e.msg);
    sl_model_free(m);
    sl_model_opts o = {.expert_slots = slots};
    cr_assert_eq(sl_model_load(path, &o, &m, &e), 0, "%s", e.msg);
    cr_assert_eq(truncate(pk, (off_t)(bytes / 2)), 0);
    int rc = forward_all(m, p, 12, d, 3, &got, &e);
    free(got.logits);
    cr_assert_neq(rc, 0, "%s: reading experts from a pack cut short must fail", rel);
    cr_assert(strstr(e.msg, pk) && strstr(e.msg, "truncated"), "%s: the error names the pack: %s", rel, e.msg);
    sl_model_free(m);
    free(ref.logits);
    free(pk);
    free(path);
    free(tmp);
}

Test(streaming, pack_safetensors) {
    check_pack("models/qwen3_5_moe_mlx4");
}

Test(streaming, pack_gpt_oss_mxfp4) {
    check_pack("families/gpt_oss_mxfp4");
}

Test(streaming, pack_gguf) {
    check_pack("gguf/qwen3_moe-Q4_K_M/model.gguf");
}

/* ---- the host image laid out as the slot, for buffered reads ---- */

/* An expert of pieces at the given file offsets and lengths (file -1: held in memory), planned. */
static void plan_pieces(xinfo *xi, const int *file, const uint64_t *off, const size_t *len, int n) {
    static const uint8_t mem[4096];
    memset(xi, 0, sizeof *xi);
    for (int i = 0; i < n; i++)
        xi->p[i] = (piece){.file = file[i], .off = off[i], .len = len[i], .mem = file[i] < 0 ? mem : NULL};
    size_t ib, db;
    sl_xinfo_plan(xi, &ib, &db);
}

/* Every piece DEV_ALIGN-aligned in the slot, at the same place in the image, inside copy_len, and apart. */
static void expect_slot_image(const xinfo *xi, int n) {
    cr_assert(xi->one_copy);
    cr_assert_eq(xi->copy_off, 0);
    for (int i = 0; i < n; i++) {
        const piece *p = &xi->p[i];
        cr_assert_eq(p->dev % DEV_ALIGN, 0, "piece %d at %zu", i, p->dev);
        cr_assert_eq(p->img, p->dev, "piece %d: image %zu, slot %zu", i, p->img, p->dev);
        cr_assert_leq(p->dev + p->len, xi->copy_len, "piece %d ends past the copy", i);
        for (int j = 0; j < i; j++)
            cr_assert(p->dev >= xi->p[j].dev + xi->p[j].len || xi->p[j].dev >= p->dev + p->len,
                      "pieces %d and %d overlap", j, i);
    }
}

Test(streaming, slot_image_layout) {
    xinfo xi;
    size_t db;
    /* one window, pieces 256-aligned apart (and 8 bytes into their pages): read whole, where they belong */
    const int f3[] = {0, 0, 0};
    const uint64_t o3[] = {8200, 8200 + 768, 8200 + 2560};
    const size_t l3[] = {700, 1500, 3000};
    plan_pieces(&xi, f3, o3, l3, 3);
    cr_assert_eq(xi.n_win, 1);
    cr_assert_eq(sl_xinfo_slot_image(&xi, &db), 1);
    cr_assert_eq(xi.piece_reads, 0);
    cr_assert_eq(db, xi.copy_len);
    expect_slot_image(&xi, 3);
    cr_assert_eq(xi.p[1].dev - xi.p[0].dev, 768, "the window's bytes keep their distances");
    cr_assert_eq(xi.w[0].at_lo, xi.p[0].dev);
    /* one window whose pieces are not 256 apart (a float scale array beside FP8 data), a second file, and
     * a piece held in memory: piece by piece */
    const int f4[] = {0, 0, 1, -1};
    const uint64_t o4[] = {4096, 4096 + 1000, 12, 0};
    const size_t l4[] = {1000, 40, 500, 64};
    plan_pieces(&xi, f4, o4, l4, 4);
    cr_assert_eq(sl_xinfo_slot_image(&xi, &db), 1);
    cr_assert_eq(xi.piece_reads, 1);
    expect_slot_image(&xi, 4);
    /* already one copy (as a pack lays experts out): left alone */
    cr_assert_eq(sl_xinfo_slot_image(&xi, &db), 0);
}

/* --io gds reads into GPU memory: a backend without it refuses, saying so. */
Test(streaming, gds_needs_gpu_memory) {
    char *path = tu_fixture("models/qwen3_moe");
    sl_err e = {{0}};
    sl_model *m = NULL;
    sl_model_opts o = {.backend = "cpu", .expert_slots = 8, .io = SL_IO_GDS};
    cr_assert_neq(sl_model_load(path, &o, &m, &e), 0);
    cr_assert(strstr(e.msg, "--io gds") && strstr(e.msg, "GPU memory") && strstr(e.msg, "cpu"), "%s", e.msg);
    free(path);
}

Test(streaming, budget_too_small) {
    char *path = tu_fixture("models/qwen3_moe");
    sl_err e = {{0}};
    sl_model *m = NULL;
    sl_model_opts o = {.expert_slots = 3}; /* top-4 routing */
    cr_assert_neq(sl_model_load(path, &o, &m, &e), 0);
    cr_assert(strstr(e.msg, "routes to 4 per layer"), "%s", e.msg);
    free(path);
}
