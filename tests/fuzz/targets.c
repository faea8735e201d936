/* Fuzz entry points. File formats are written to a private scratch directory and opened by path, exactly
 * as the loaders open checkpoints; text parsers take the bytes directly. SLUICE_FUZZ_FIXTURES names the
 * fixture folder (a tokenizer and a small checkpoint some targets need besides the fuzzed bytes). */
#include "targets.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experts/pack.h"
#include "formats/config.h"
#include "formats/gguf.h"
#include "formats/gguf_model.h"
#include "formats/safetensors.h"
#include "server/http.h"
#include "text/detok.h"
#include "text/jinja.h"
#include "text/tok_gguf.h"
#include "text/tokenizer.h"
#include "text/toolcall.h"

#ifndef SLUICE_FUZZ_FIXTURES
#define SLUICE_FUZZ_FIXTURES "tests/fixtures"
#endif

/* $SLUICE_FIXTURES (as the tests get it), else the folder the build names. */
static const char *fixtures(void) {
    const char *f = getenv("SLUICE_FIXTURES");
    return f && *f ? f : SLUICE_FUZZ_FIXTURES;
}

/* A scratch directory per process, made on first use and reused (inputs overwrite the same files). */
static const char *scratch(void) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/sluice-fuzz-XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    return dir;
}

static char *scratch_path(const char *name) {
    static char path[4][256];
    static int k;
    char *p = path[k++ & 3];
    snprintf(p, sizeof path[0], "%s/%s", scratch(), name);
    return p;
}

static void write_file(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
}

/* ---- checkpoints ---- */

static void fuzz_safetensors(const uint8_t *data, size_t size) {
    const char *p = scratch_path("model.safetensors");
    write_file(p, data, size);
    sl_st_set *set = NULL;
    sl_err e = {0};
    if (!sl_st_open_file(p, &set, &e)) {
        for (int i = 0; i < set->n_tensors; i++) (void)sl_st_numel(&set->tensors[i]);
        (void)sl_st_find(set, "model.embed_tokens.weight");
    }
    sl_st_close(set);
}

/* model.safetensors.index.json over two shards that are the fixture checkpoint (linked once). */
static void fuzz_st_index(const uint8_t *data, size_t size) {
    static char dir[300];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/index", scratch());
        if (mkdir(dir, 0700)) abort();
        char src[512], dst[512];
        snprintf(src, sizeof src, "%s/models/qwen3/model.safetensors", fixtures());
        char *real = realpath(src, NULL);
        if (!real) abort();
        for (int i = 1; i <= 2; i++) {
            snprintf(dst, sizeof dst, "%s/model-0000%d-of-00002.safetensors", dir, i);
            if (symlink(real, dst)) abort();
        }
        free(real);
    }
    char p[400];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_file(p, data, size);
    sl_st_set *set = NULL;
    sl_err e = {0};
    if (!sl_st_open_dir(dir, &set, &e)) (void)sl_st_find(set, "model.norm.weight");
    sl_st_close(set);
}

/* The GGUF file, then everything a load reads from it: the config, the tokenizer, the tensor table. */
static void gguf_all(const char *path) {
    sl_gguf *g = NULL;
    sl_err e = {0};
    if (sl_gguf_open(path, &g, &e)) return;
    sl_config c;
    if (!sl_gguf_config(g, &c, &e)) {
        sl_st_set *set = NULL;
        if (!sl_gguf_tensor_set(g, &c, &set, &e)) sl_st_close(set);
        sl_config_free(&c);
    }
    sl_tokenizer *t = NULL;
    if (!sl_gguf_tokenizer(g, &t, &e)) {
        int32_t *ids = NULL;
        int n = 0;
        static const char text[] = "Hello, world! <|im_start|>user 123";
        if (!sl_tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &n, &e)) {
            char *out = NULL;
            size_t len;
            if (!sl_tokenizer_decode(t, ids, n, 0, &out, &len, &e)) free(out);
        }
        free(ids);
        sl_tokenizer_free(t);
    }
    sl_gguf_close(g);
}

static void fuzz_gguf(const uint8_t *data, size_t size) {
    const char *p = scratch_path("model.gguf");
    write_file(p, data, size);
    gguf_all(p);
}

/* A split set of two: the first two bytes say where the input divides into the two files. */
static void fuzz_gguf_split(const uint8_t *data, size_t size) {
    if (size < 2) return;
    size_t cut = ((size_t)data[0] | (size_t)data[1] << 8) % (size - 1);
    data += 2;
    size -= 2;
    write_file(scratch_path("m-00002-of-00002.gguf"), data + cut, size - cut);
    const char *p = scratch_path("m-00001-of-00002.gguf");
    write_file(p, data, cut);
    gguf_all(p);
}

static void fuzz_config(const uint8_t *data, size_t size) {
    json_t *root = json_loadb((const char *)data, size, 0, NULL);
    if (!root) return;
    sl_config c;
    sl_err e = {0};
    if (!sl_config_parse(root, "config.json", &c, &e)) {
        int bits, group;
        (void)sl_config_quant_for(&c, "model.layers.0.mlp.down_proj", &bits, &group);
        sl_config_free(&c);
    }
    json_decref(root);
}

/* An expert pack beside the fixture MoE checkpoint. Its file stamps (sizes, modification times) cannot be
 * guessed, so the harness writes the real ones over the input where the pack keeps them (src/experts/pack.c:
 * a 40-byte head, then {size, mtime_s, mtime_ns} per checkpoint file), and the checks past them are reached. */
static void fuzz_pack(const uint8_t *data, size_t size) {
    static sl_st_set *set;
    static sl_config c;
    static xinfo *x;
    static size_t nx;
    if (!set) {
        char dir[512];
        sl_err e = {0};
        snprintf(dir, sizeof dir, "%s/models/qwen3_moe", fixtures());
        if (sl_st_open_dir(dir, &set, &e) || sl_config_load(dir, &c, &e)) {
            fprintf(stderr, "fuzz_pack: %s\n", e.msg);
            abort();
        }
        nx = (size_t)c.n_layers * (size_t)c.n_experts;
        x = calloc(nx, sizeof *x);
    }
    memset(x, 0, nx * sizeof *x);
    const char *p = scratch_path("experts.sluice-pack");
    size_t stamps = 40 + 24 * (size_t)set->n_files;
    uint8_t *buf = malloc(size + 1);
    memcpy(buf, data, size);
    for (int i = 0; i < set->n_files && size >= stamps; i++) {
        struct stat sb;
        if (stat(set->paths[i], &sb)) abort();
        int64_t f[3] = {(int64_t)sb.st_size, (int64_t)sb.st_mtim.tv_sec, (int64_t)sb.st_mtim.tv_nsec};
        memcpy(buf + 40 + 24 * (size_t)i, f, sizeof f);
    }
    write_file(p, buf, size);
    free(buf);
    sl_err e = {0};
    (void)sl_pack_apply(p, set, c.n_layers, c.n_experts, x, set->n_files, &e);
}

/* ---- text ---- */

static void encode_decode(const sl_tokenizer *t, const char *text, size_t len) {
    int32_t *ids = NULL;
    int n = 0;
    sl_err e = {0};
    if (sl_tokenizer_encode(t, text, len, 1, &ids, &n, &e)) return;
    char *out = NULL;
    size_t olen;
    if (!sl_tokenizer_decode(t, ids, n, 0, &out, &olen, &e)) free(out);
    sl_detok d;
    sl_detok_init(&d, t, 1);
    const char *s;
    size_t sl;
    for (int i = 0; i < n; i++)
        if (sl_detok_push(&d, ids[i], &s, &sl, &e)) break;
    (void)sl_detok_flush(&d, &s, &sl, &e);
    sl_detok_free(&d);
    free(ids);
}

/* tokenizer.json itself, then a fixed text and the input's own first bytes through it. */
static void fuzz_tokenizer_json(const uint8_t *data, size_t size) {
    static char dir[300];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/tok", scratch());
        if (mkdir(dir, 0700)) abort();
    }
    char p[400];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    write_file(p, data, size);
    sl_tokenizer *t = NULL;
    sl_err e = {0};
    if (sl_tokenizer_load(dir, &t, &e)) return;
    static const char text[] = "Hello, world!\n\tcafé 123 <|im_end|>  x";
    encode_decode(t, text, sizeof text - 1);
    encode_decode(t, (const char *)data, size < 256 ? size : 256);
    int32_t ids[] = {0, 1, 2, 3, -1, 1 << 30};
    char *out = NULL;
    size_t len;
    if (!sl_tokenizer_decode(t, ids, 6, 0, &out, &len, &e)) free(out);
    sl_tokenizer_free(t);
}

/* Arbitrary text through the fixture tokenizer (loaded once). */
static void fuzz_encode(const uint8_t *data, size_t size) {
    static sl_tokenizer *t;
    if (!t) {
        sl_err e = {0};
        char dir[512];
        snprintf(dir, sizeof dir, "%s/tiny_tokenizer", fixtures());
        if (sl_tokenizer_load(dir, &t, &e)) {
            fprintf(stderr, "fuzz_encode: %s\n", e.msg);
            abort();
        }
    }
    encode_decode(t, (const char *)data, size);
    /* the bytes as ids too */
    int n = (int)(size / 4);
    int32_t *ids = malloc((size_t)n * 4 + 4);
    memcpy(ids, data, (size_t)n * 4);
    char *out = NULL;
    size_t len;
    sl_err e = {0};
    if (!sl_tokenizer_decode(t, ids, n, 1, &out, &len, &e)) free(out);
    free(ids);
}

static const char jinja_vars[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
    "\"What is the weather?\"}, {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"hm\", "
    "\"tool_calls\": [{\"type\": \"function\", \"id\": \"c1\", \"function\": {\"name\": \"get_weather\", "
    "\"arguments\": {\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": "
    "\"sunny\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"thanks\"}]}], \"tools\": "
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}], "
    "\"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\", \"eos_token\": "
    "\"</s>\"}";

static void fuzz_jinja(const uint8_t *data, size_t size) {
    static json_t *vars;
    if (!vars && !(vars = json_loads(jinja_vars, 0, NULL))) abort();
    sl_jinja *t = NULL;
    sl_err e = {0};
    if (sl_jinja_parse((const char *)data, size, &t, &e)) return;
    sl_jinja_set_max_bytes(t, (size_t)64 << 20); /* within the fuzzer's memory limit under the sanitizers */
    char *out = NULL;
    size_t len;
    if (!sl_jinja_render_at(t, vars, 1795262400, &out, &len, &e)) free(out);
    sl_jinja_free(t);
}

static void tc_event(void *ud, const sl_tc_event *ev) {
    size_t *n = ud;
    *n += ev->len;
}

/* Model output through the tool-call / reasoning parser, fed in chunks whose sizes the first byte picks,
 * then whole. The first byte: bit 0 starts in reasoning, bit 1 passes tools, bits 2-4 the chunk size - 1,
 * bits 5-7 the format (sl_tc_format, modulo the number of formats). */
static void fuzz_toolcall(const uint8_t *data, size_t size) {
    static json_t *tools;
    if (!tools &&
        !(tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
                             "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
                             "{\"type\": \"integer\"}}}}}]",
                             0, NULL)))
        abort();
    if (!size) return;
    unsigned mode = data[0];
    data++;
    size--;
    sl_tc_format fmt = (sl_tc_format)((mode >> 5) % (SL_TC_HARMONY + 1));
    sl_tc_parser *p = sl_tc_parser_create(fmt, mode & 1, (mode & 2) ? tools : NULL);
    if (!p) return;
    size_t seen = 0, step = ((mode >> 2) & 7) + 1;
    sl_err e = {0};
    for (size_t off = 0; off < size; off += step)
        if (sl_tc_parser_feed(p, (const char *)data + off, size - off < step ? size - off : step, tc_event, &seen, &e))
            break;
    (void)sl_tc_parser_finish(p, tc_event, &seen, &e);
    (void)sl_tc_parser_malformed(p);
    sl_tc_parser_free(p);
    char *content = NULL, *reasoning = NULL;
    json_t *calls = NULL;
    if (!sl_tc_parse_all(fmt, (const char *)data, size, mode & 1, tools, &content, &reasoning, &calls, &e)) {
        free(content);
        free(reasoning);
        json_decref(calls);
    }
}

/* ---- API requests: a server with the scripted fixture model loaded once, requests checked without a
 * socket (sv_http_check: routing, body limit, JSON, the API's parser, prompt rendering and tokenization) ---- */

static sv_server *api_server(void) {
    static sv_engine g;
    static sv_server srv;
    if (!srv.g) {
        sl_err e = {0};
        char model[512];
        snprintf(model, sizeof model, "%s/scripted_model", fixtures());
        sv_engine_opts eo = {.model = model, .backend = "cpu", .threads = 1, .queue = 4};
        if (sv_engine_init(&g, eo.queue, &e) || sv_engine_load(&g, &eo, &e)) {
            fprintf(stderr, "fuzz: cannot load %s: %s\n", model, e.msg);
            abort();
        }
        srv.g = &g;
        srv.o.max_body = 1 << 20;
    }
    return &srv;
}

/* The first byte picks the route among urls, the rest is the body. */
static void api_request(const char *const *urls, size_t n_urls, const uint8_t *data, size_t size) {
    if (!size) return;
    const char *url = urls[data[0] % n_urls];
    const char *method = url[0] == 'G' ? "GET" : "POST";
    (void)sv_http_check(api_server(), method, url + (url[0] == 'G' ? 4 : 5), (const char *)data + 1, size - 1);
}

static void fuzz_api_openai(const uint8_t *data, size_t size) {
    static const char *const urls[] = {"POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models",
                                       "POST /v1/unknown",          "POST /v1/responses",   "POST /v1/embeddings"};
    api_request(urls, 6, data, size);
}

static void fuzz_api_anthropic(const uint8_t *data, size_t size) {
    static const char *const urls[] = {"POST /v1/messages", "POST /v1/messages/count_tokens"};
    api_request(urls, 2, data, size);
}

static void fuzz_api_ollama(const uint8_t *data, size_t size) {
    static const char *const urls[] = {"POST /api/chat", "POST /api/generate", "POST /api/show",
                                       "GET /api/tags",  "POST /api/embed",    "POST /api/embeddings"};
    api_request(urls, 6, data, size);
}

const sl_fuzz_target sl_fuzz_targets[] = {
    {"safetensors", fuzz_safetensors},
    {"st_index", fuzz_st_index},
    {"gguf", fuzz_gguf},
    {"gguf_split", fuzz_gguf_split},
    {"config", fuzz_config},
    {"pack", fuzz_pack},
    {"tokenizer_json", fuzz_tokenizer_json},
    {"encode", fuzz_encode},
    {"jinja", fuzz_jinja},
    {"toolcall", fuzz_toolcall},
    {"api_openai", fuzz_api_openai},
    {"api_anthropic", fuzz_api_anthropic},
    {"api_ollama", fuzz_api_ollama},
    {NULL, NULL},
};

const sl_fuzz_target *sl_fuzz_find(const char *name) {
    for (const sl_fuzz_target *t = sl_fuzz_targets; t->name; t++)
        if (!strcmp(t->name, name)) return t;
    return NULL;
}
