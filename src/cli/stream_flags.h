/* The flags of every command that loads a model which say where its experts live, how they are read
 * and where they are computed (--vram, --ram, --io, --cpu-experts, --no-prefetch, --no-preload,
 * --device-steps), and how its sessions keep keys and values (--kv-type). */
#ifndef SLUICE_CLI_STREAM_FLAGS_H
#define SLUICE_CLI_STREAM_FLAGS_H

#include "models/model.h"

/* Parses flag (with its value val, NULL when none follows) into o. Returns how many arguments it took
 * (1 or 2), 0 when flag is not one of these, -1 after printing what is wrong (cmd names the command). */
int cli_stream_flag(const char *cmd, const char *flag, const char *val, sl_model_opts *o);

#define CLI_STREAM_HELP                                                                                                \
    "  --vram SIZE            GPU memory the model may use (weights, expert slots, sessions), e.g. 20G;\n"             \
    "                         experts beyond it stream from disk (default: the free memory)\n"                         \
    "  --ram SIZE             pinned host cache of experts on the GPU (default: half the free RAM, at\n"               \
    "                         most the experts' size; 0: none, the page cache serves); on the CPU\n"                   \
    "                         backend, the expert cache itself (streaming on; default: compute on the\n"               \
    "                         mapped checkpoint)\n"                                                                    \
    "  --cpu-experts MODE     experts in host memory (host or page cache) but in no GPU slot: auto (in\n"              \
    "                         decode steps, computed on the CPU where that beats copying them, from\n"                 \
    "                         measured copy and CPU speed; a prompt's are copied), on (always on the\n"                \
    "                         CPU, up to 256 routed pairs a layer) or off (copied)\n"                                  \
    "  --io MODE              how experts are read: buffered (page cache), direct (O_DIRECT) or gds\n"                 \
    "                         (GPUDirect Storage through libcufile); default: gds where the nvidia-fs\n"               \
    "                         driver is loaded and no --ram cache is asked for, else buffered while\n"                 \
    "                         free RAM can cache the experts, direct beyond that\n"                                    \
    "  --no-prefetch          no reading ahead of the next layer's predicted experts\n"                                \
    "  --no-preload           a --ram cache that holds every expert fills as experts are used, instead\n"              \
    "                         of reading them all at load\n"                                                           \
    "  --device-steps MODE    decode steps that run on the GPU against its expert slots, without the\n"                \
    "                         host reading each layer's routing, redone host-driven when an expert\n"                  \
    "                         is missing: on, off, host (experts of the host cache in no slot are\n"                   \
    "                         read by the GPU where they are, over PCIe, and with CPU experts a part\n"                \
    "                         of them computed by the CPU inside the step) or auto (default: host where\n"             \
    "                         the host cache holds every expert and the slots at most a quarter, else\n"               \
    "                         while recent steps found all their experts in slots)\n"

#define CLI_KV_HELP                                                                                                    \
    "  --kv-type T            element type of the attention KV cache: f32, f16 or bf16 (default: f16 on\n"             \
    "                         CUDA, f32 on the CPU), or q8_0, an approximation (8-bit values, a scale per\n"           \
    "                         32; head_dim a multiple of 32); latent attention\n"                                      \
    "                         (DeepSeek-V3) keeps f32\n"

#endif
