/* sluice show: what a model is — architecture, sizes, dtypes, parameter count, expert bytes. */
#include <stdio.h>
#include <string.h>

#include "backend/ggml_types.h"
#include "cli/commands.h"
#include "core/util.h"
#include "formats/gguf.h"
#include "models/model.h"

static void usage(FILE *f) {
    fprintf(f, "usage: sluice show MODEL [--tensors]\n\nPrints the architecture, dimensions, weight formats, parameter "
               "count and\nhow many bytes are routed experts versus everything else. For a .gguf file also the\n"
               "tensor count per type; --tensors lists every tensor with its type, shape and size.\n");
}

/* GGUF container facts: version, tensor types with counts and bytes, optionally every tensor. */
static int gguf_lines(const char *path, int list, sl_err *e) {
    sl_gguf *g;
    if (sl_gguf_open(path, &g, e)) return -1;
    printf("  %-22sGGUF v%d, %d metadata keys, %d tensors\n", "container", g->version, g->n_kv, g->n_tensors);
    printf("  %-22s", "tensor types");
    int first = 1;
    for (int t = 0; t < SL_GGML_TYPE_END; t++) {
        int n = 0;
        uint64_t bytes = 0;
        for (int i = 0; i < g->n_tensors; i++)
            if (g->tensors[i].type == t) n++, bytes += g->tensors[i].nbytes;
        if (!n) continue;
        char b[32];
        printf("%s%s x%d (%s)", first ? "" : ", ", sl_ggml_type_name(t), n, sl_human_bytes((double)bytes, b, sizeof b));
        first = 0;
    }
    printf("\n");
    for (int i = 0; list && i < g->n_tensors; i++) {
        const sl_gguf_tensor *t = &g->tensors[i];
        char shape[96], b[32];
        int k = snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < t->ndim; d++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", d ? ", " : "", (long long)t->ne[d]);
        snprintf(shape + k, sizeof shape - (size_t)k, "]");
        printf("    %-36s %-8s %-20s %s\n", t->name, sl_ggml_type_name(t->type), shape,
               sl_human_bytes((double)t->nbytes, b, sizeof b));
    }
    sl_gguf_close(g);
    return 0;
}

/* Distinct formats of the weight matrices, in first-seen order. */
typedef struct {
    char seen[8][32];
    int n;
} formats_walk;

static void note_format(formats_walk *f, const sl_weight *w) {
    char b[32];
    sl_wfmt_name(w, b, sizeof b);
    for (int k = 0; k < f->n; k++)
        if (!strcmp(f->seen[k], b)) return;
    if (f->n < 8) snprintf(f->seen[f->n++], sizeof f->seen[0], "%s", b);
}

static int format_of(void *ctx, int l, const sl_tensor *t) {
    (void)l;
    if (t->w) note_format(ctx, t->w);
    return 0;
}

static void formats_line(sl_model *m) {
    formats_walk f = {.n = 0};
    note_format(&f, &m->embed);
    note_format(&f, &m->lm_head);
    sl_model_tensors(m, format_of, &f);
    printf("  %-22s", "weight formats");
    for (int i = 0; i < f.n; i++) printf("%s%s", i ? ", " : "", f.seen[i]);
    printf("\n");
}

int cmd_show(int argc, char **argv) {
    int list = argc == 3 && !strcmp(argv[2], "--tensors");
    if ((argc != 2 && !list) || argv[1][0] == '-') {
        int help = argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
        usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    sl_err e = {{0}};
    sl_model *m;
    sl_model_opts o = {.threads = 1, .backend = "cpu"}; /* reads the checkpoint only */
    if (sl_model_load(argv[1], &o, &m, &e)) {
        fprintf(stderr, "sluice show: %s\n", e.msg);
        return 1;
    }
    const sl_config *c = &m->cfg;
    char b1[32], b2[32], b3[32];
    int n_lin = 0;
    for (int l = 0; l < c->n_layers; l++) n_lin += c->layer_kind[l] == SL_LAYER_LINEAR;
    printf("%s\n", m->path);
    printf("  %-22s%s (%s family)\n", "architecture", c->model_type, m->family->name);
    printf("  %-22s%s\n", "parameters", sl_human_count((double)m->n_params, b1, sizeof b1));
    printf("  %-22s%d\n", "layers", c->n_layers);
    if (n_lin) printf("  %-22s%d delta-net, %d full attention\n", "layer kinds", n_lin, c->n_layers - n_lin);
    printf("  %-22s%d\n", "hidden size", c->hidden);
    if (c->kv_lora_rank > 0)
        printf("  %-22s%d, latent attention: q rank %d, kv rank %d, head dims %d + %d rope / %d value\n",
               "attention heads", c->n_heads, c->q_lora_rank, c->kv_lora_rank, c->qk_nope_dim, c->qk_rope_dim,
               c->v_head_dim);
    else
        printf("  %-22s%d query, %d key/value, head dim %d\n", "attention heads", c->n_heads, c->n_kv_heads,
               c->head_dim);
    if (c->sliding_window) printf("  %-22s%d\n", "sliding window", c->sliding_window);
    printf("  %-22s%d\n", "vocabulary", c->vocab_size);
    printf("  %-22s%d\n", "context length", c->max_pos);
    printf("  %-22stheta %g, %d of %d dims rotated%s\n", "rope", c->rope.theta, m->rot_dim, c->head_dim,
           c->rope.type == SL_ROPE_LLAMA3   ? ", llama3 scaling"
           : c->rope.type == SL_ROPE_LINEAR ? ", linear scaling"
           : c->rope.type == SL_ROPE_YARN   ? ", yarn scaling"
                                            : "");
    if (c->n_experts)
        printf("  %-22s%d, %d active per token, intermediate %d%s\n", "experts", c->n_experts, c->top_k,
               c->moe_intermediate, c->shared_intermediate ? " + shared expert" : "");
    if (c->n_experts && c->route_sigmoid)
        printf("  %-22ssigmoid scores, best %d of %d groups, weights x %g%s\n", "routing", c->topk_group, c->n_group,
               c->routed_scale, c->first_dense ? ", leading layers dense" : "");
    else
        printf("  %-22s%d\n", "intermediate size", c->intermediate);
    printf("  %-22s%s\n", "embeddings", c->tie_embeddings ? "tied to the output head" : "separate output head");
    formats_line(m);
    printf("  %-22s%s in %d file%s\n", "size on disk",
           sl_human_bytes((double)(m->bytes_experts + m->bytes_other), b1, sizeof b1), m->st->n_files,
           m->st->n_files == 1 ? "" : "s");
    if (c->n_experts)
        printf("  %-22s%s experts, %s everything else\n", "bytes",
               sl_human_bytes((double)m->bytes_experts, b2, sizeof b2),
               sl_human_bytes((double)m->bytes_other, b3, sizeof b3));
    int is_gguf = !m->cfg.gguf_arch[0] ? 0 : 1;
    sl_model_free(m);
    if (is_gguf && gguf_lines(argv[1], list, &e)) {
        fprintf(stderr, "sluice show: %s\n", e.msg);
        return 1;
    }
    if (list && !is_gguf) {
        fprintf(stderr, "sluice show: --tensors lists the tensors of .gguf files only\n");
        return 2;
    }
    return 0;
}
