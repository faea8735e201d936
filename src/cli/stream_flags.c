#include "cli/stream_flags.h"

#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "experts/store.h"

static int size_arg(const char *cmd, const char *flag, const char *val, int64_t *out) {
    uint64_t b;
    if (!val || sl_parse_size(val, &b) || b > (uint64_t)INT64_MAX) {
        fprintf(stderr, "%s: %s needs a size such as 20G, 512M or 0, got '%s'\n", cmd, flag, val ? val : "");
        return -1;
    }
    *out = (int64_t)b;
    return 2;
}

/* val as the index of one of the NULL-terminated modes, or "FLAG is a, b or c" */
static int mode_arg(const char *cmd, const char *flag, const char *val, const char *const *modes, int *out) {
    int n = 0;
    while (modes[n]) n++;
    for (int i = 0; val && i < n; i++)
        if (!strcmp(val, modes[i])) {
            *out = i;
            return 2;
        }
    fprintf(stderr, "%s: %s is ", cmd, flag);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", modes[i], i + 2 < n ? ", " : i + 1 < n ? " or " : "");
    fprintf(stderr, ", got '%s'\n", val ? val : "");
    return -1;
}

int cli_stream_flag(const char *cmd, const char *flag, const char *val, sl_model_opts *o) {
    if (!strcmp(flag, "--vram")) {
        int rc = size_arg(cmd, flag, val, &o->vram);
        if (rc > 0 && o->vram == 0) {
            fprintf(stderr, "%s: --vram 0 leaves no GPU memory for the model (use --backend cpu)\n", cmd);
            return -1;
        }
        return rc;
    }
    if (!strcmp(flag, "--ram")) {
        int rc = size_arg(cmd, flag, val, &o->ram);
        if (rc > 0 && o->ram == 0) o->ram = -1; /* none, as against unset */
        return rc;
    }
    if (!strcmp(flag, "--io")) {
        sl_io_mode m;
        if (!val || sl_io_mode_parse(val, &m)) {
            fprintf(stderr, "%s: --io is buffered, direct or gds, got '%s'\n", cmd, val ? val : "");
            return -1;
        }
        o->io = (int)m;
        return 2;
    }
    if (!strcmp(flag, "--kv-type")) {
        if (!val || sl_kv_type_parse(val, &o->kv_type)) {
            fprintf(stderr, "%s: --kv-type is f32, f16, bf16 or q8_0, got '%s'\n", cmd, val ? val : "");
            return -1;
        }
        return 2;
    }
    if (!strcmp(flag, "--cpu-experts")) {
        static const char *const modes[] = {"auto", "on", "off", NULL}; /* in sl_cpu_experts order */
        return mode_arg(cmd, flag, val, modes, &o->cpu_experts);
    }
    if (!strcmp(flag, "--device-steps")) {
        static const char *const modes[] = {"auto", "on", "off", "host", NULL}; /* in sl_device_steps order */
        return mode_arg(cmd, flag, val, modes, &o->device_steps);
    }
    if (!strcmp(flag, "--no-preload")) {
        o->no_preload = 1;
        return 1;
    }
    if (!strcmp(flag, "--no-prefetch")) {
        o->no_prefetch = 1;
        return 1;
    }
    return 0;
}
