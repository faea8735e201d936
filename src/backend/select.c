/* Backend choice for every command that loads a model: --backend / SLUICE_BACKEND / auto. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#ifdef SLUICE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

const char *sl_backends_compiled(void) {
#if defined(__x86_64__)
#define SL_CPU_DESC "cpu avx512/avx2"
#else
#define SL_CPU_DESC "cpu"
#endif
#ifdef SLUICE_HAVE_CUDA
    return SL_CPU_DESC ", cuda " SLUICE_CUDA_ARCHS;
#else
    return SL_CPU_DESC;
#endif
}

int sl_backend_open(const char *name, int threads, sl_backend **out, char *note, size_t note_len, sl_err *e) {
    if (note_len) note[0] = 0;
    const char *src = "--backend";
    if (!name || !*name) {
        name = getenv("SLUICE_BACKEND");
        src = "SLUICE_BACKEND";
        if (!name || !*name) name = "auto";
    }
    if (strcmp(name, "cpu") && strcmp(name, "cuda") && strcmp(name, "auto"))
        return sl_fail(e, "%s: unknown backend '%s' (expected cpu, cuda or auto)", src, name);
    if (!strcmp(name, "cpu")) return sl_cpu_backend_create(threads, out, e);
#ifdef SLUICE_HAVE_CUDA
    char why[512];
    if (sl_cuda_backend_create(0, out, why, sizeof why) == 0) {
        if (!strcmp(name, "auto")) snprintf(note, note_len, "backend cuda (%s)", why);
        return 0;
    }
    if (!strcmp(name, "cuda")) return sl_fail(e, "%s cuda: %s", src, why);
    if (sl_cpu_backend_create(threads, out, e)) return -1;
    snprintf(note, note_len, "backend cpu (%s)", why);
    return 0;
#else
    if (!strcmp(name, "cuda"))
        return sl_fail(e, "%s cuda: this sluice was built without CUDA (backends: %s)", src, sl_backends_compiled());
    return sl_cpu_backend_create(threads, out, e);
#endif
}

static const char *const kv_names[] = {"auto", "f32", "f16", "bf16", "q8_0"};

const char *sl_kv_type_name(sl_kv_type t) {
    return (unsigned)t < sizeof kv_names / sizeof kv_names[0] ? kv_names[t] : "?";
}

int sl_kv_type_parse(const char *s, sl_kv_type *out) {
    for (int t = SL_KV_F32; t <= SL_KV_Q8_0; t++)
        if (s && !strcmp(s, kv_names[t])) {
            *out = (sl_kv_type)t;
            return 0;
        }
    return -1;
}

/* GPUs keep f16 caches, as llama.cpp does: twice the contexts fit and attention reads half the bytes. The
 * CPU reference keeps f32, so its logits stay those of the float32 model. */
sl_kv_type sl_kv_type_resolve(const sl_backend *b, sl_kv_type t) {
    if (t != SL_KV_AUTO) return t;
    return b && !strcmp(b->ops->name, "cuda") ? SL_KV_F16 : SL_KV_F32;
}
