/* sluice bench: prefill and decode speed of a model on synthetic token ids, with the weight bandwidth
 * that decode achieves — the figure a memory-bound decoder is judged by. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "cli/bench_parallel.h"
#include "cli/commands.h"
#include "cli/stream_flags.h"
#include "core/util.h"
#include "experts/store.h"
#include "models/synthetic.h"
#include "runtime/session.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: sluice bench MODEL [-p N] [-n M] [-d D] [-r R] [--threads T] [--backend B] [--json] [--host-logits]\n"
        "       sluice bench --synthetic SHAPE [--quant Q] [--layers L] [--dir DIR] [...]\n\n"
        "Loads MODEL, prefills N pseudo-random token ids (default 512) as one batch, then decodes M\n"
        "tokens one at a time (default 128), each the greedy argmax of the previous logits, picked on the\n"
        "backend as greedy decoding does (--host-logits copies every step's logits to the host and picks\n"
        "there, as sampling at a temperature does). The ids are the same on every run. With -r R the\n"
        "whole prefill+decode is repeated R times from an empty cache and the best (fastest) time of each\n"
        "phase is reported. With -d D the cache first holds D tokens (prefilled, not timed), so both\n"
        "phases are measured at that depth, as llama-bench -d does. An untimed run (the same depth and\n"
        "prompt, two decoded tokens) comes first, as llama-bench's warm-up does, so that one-time costs\n"
        "(kernel loading, library set-up, recording decode steps) stay out of -r 1; not with streamed\n"
        "experts, whose first run is part of what is measured (--no-warmup skips it).\n\n"
        "Decode bandwidth counts the weight bytes one token reads: every matrix once, one row of the\n"
        "embedding table (the whole table when it is tied to the output head), and top_k of n_experts\n"
        "routed experts per MoE layer. Prefill GFLOP/s counts 2 x active parameters x tokens, the output\n"
        "head once (only the last prompt token needs logits); attention scores are not counted.\n\n"
        "The roofline fraction divides the decode bandwidth by the memory read bandwidth the backend\n"
        "measures (the bound a memory-bound decoder can reach); prefill is compared with the backend's\n"
        "measured peak multiply-add rate. With streamed experts, the I/O bound divides the tier below's\n"
        "measured read rate by the bytes a decode token takes from it: its reads, and the experts computed\n"
        "on the CPU where the page cache held them (printed where that is an expert a token or more).\n\n"
        "--synthetic writes (once) a checkpoint with the shape of a real model in the layout its real\n"
        "checkpoints use, with finite pseudo-random weights, then benchmarks it like any model. It goes\n"
        "to DIR (default $SLUICE_CACHE, $XDG_CACHE_HOME/sluice or ~/.cache/sluice, + synthetic/) and is\n"
        "reused by later runs. Shapes, with the --quant values each takes (the first, as the model\n"
        "ships, is the default) and the checkpoint's size in each:\n");
    for (const sl_synth_shape *sh = sl_synth_shapes(); sh->name; sh++) {
        fprintf(f, "  %-19s %s\n  %-19s", sh->name, sh->about, "");
        for (const char *p = sh->quants; *p;) {
            char name[16], b[32];
            size_t k = strcspn(p, " ");
            sl_synth_quant q;
            snprintf(name, sizeof name, "%.*s", (int)k, p);
            if (!sl_synth_parse_quant(name, &q))
                fprintf(f, "%s %s %s", p == sh->quants ? "" : ",", name,
                        sl_human_bytes((double)sl_synth_bytes(sh, q, 0), b, sizeof b));
            p += k + (p[k] == ' ');
        }
        fprintf(f, "\n");
    }
    fprintf(f, "\n"
               "  -p N          prompt tokens (default 512)\n"
               "  -n M          decoded tokens (default 128; 0 skips decode)\n"
               "  -d D          cache depth: D tokens in the cache before the timed prompt (default 0)\n"
               "  -r R          runs, best reported (default 1)\n"
               "  --no-warmup   no untimed run first\n"
               "  --threads T   CPU threads (default: all cores)\n"
               "  --backend B   cpu, cuda or auto (default: SLUICE_BACKEND, else auto)\n" CLI_STREAM_HELP CLI_KV_HELP
               "  --json        one JSON object instead of the table\n"
               "  --host-logits decode with every step's logits copied to the host\n"
               "  --synthetic SHAPE  benchmark a synthetic checkpoint of this shape (see above)\n"
               "  --quant Q     synthetic weights, as the shape allows: bf16, mlx4 or mlx8 (MLX affine, group 64),\n"
               "                q4k (a GGUF file: GGML Q4_K, the output head Q6_K), fp8 (DeepSeek's float8 e4m3\n"
               "                with a float32 scale per 128x128 tile) or mxfp4 (gpt-oss's experts as OpenAI ships\n"
               "                them); default: the shape's first\n"
               "  --layers L    synthetic: only the first L layers (for disks smaller than the model)\n"
               "  --dir DIR     synthetic: where the checkpoint is written\n"
               "  --parallel N[,N...]  many sequences at once instead: for each N, N prompts of -p tokens, then\n"
               "                -n steps of one token of every sequence; aggregate and per-sequence rates (and\n"
               "                with streamed experts the bytes read per generated token), each count after an\n"
               "                untimed warm-up run of its own\n");
}

/* Bytes and parameters one decoded token touches (see usage()). */
typedef struct {
    double bytes, params;
    double head_params;  /* the output head's share of params: prefill runs it for the last token only */
    double expert_bytes; /* the routed experts' share of bytes */
    double moe_experts;  /* routed experts of every MoE layer, summed */
    int moe_layers;
} traffic;

static void tally(traffic *t, const sl_weight *w, double frac) {
    if (!w->data) return;
    t->bytes += frac * (double)sl_weight_bytes(w);
    t->params += frac * (double)w->rows * (double)w->cols;
}

/* Every dense weight once; a routed expert's with the chance a token routes to it, as stored (a streamed
 * table is mostly empty). */
typedef struct {
    const sl_model *m;
    traffic *t;
} tally_walk;

static int tally_tensor(void *ctx, int l, const sl_tensor *x) {
    tally_walk *w = ctx;
    if (x->w && x->expert) {
        double b = w->t->bytes;
        tally(w->t, x->w, (double)w->m->cfg.top_k / (double)w->m->layers[l].moe->experts.n_experts);
        w->t->expert_bytes += w->t->bytes - b;
    } else if (x->w)
        tally(w->t, x->w, 1.0);
    else if (x->v && *x->v) { /* float tensors every token reads whole: norms, and latent attention's kv_b_proj */
        w->t->bytes += 4.0 * (double)x->len;
        w->t->params += (double)x->len;
    }
    return 0;
}

static traffic per_token_traffic(sl_model *m) {
    traffic t = {0};
    tally(&t, &m->lm_head, 1.0);
    t.head_params = t.params;
    if (m->embed.data != m->lm_head.data) t.bytes += (double)m->embed.row_bytes;
    sl_model_tensors(m, tally_tensor, &(tally_walk){m, &t});
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (m->layers[l].moe) {
            t.moe_experts += m->layers[l].moe->experts.n_experts;
            t.moe_layers++;
        }
    return t;
}

static int parse_int(const char *s, int lo, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > 1 << 24) return -1;
    *out = (int)v;
    return 0;
}

static int32_t argmax(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

typedef struct {
    int prompt, gen, runs, threads;
    int depth;       /* tokens already in the cache before the timed prompt and decode (llama-bench -d) */
    int host_logits; /* decode steps copy their logits to the host and pick the argmax there */
    double gen_s, load_s, prefill_s, decode_s; /* best of the runs */
    double weight_bytes;
    traffic tok;
    double bandwidth, flops;                    /* the backend's measured bounds, 0 when unknown */
    int routed_tokens, experts_used, n_experts; /* routing spread in the last MoE layer, last prefill chunk */
    const char *synthetic;                      /* "shape quant" when the model is synthetic */
    sl_store_stats st_pre, st_dec, st_run;      /* streamed experts: per phase of the best decode run */
    double tier_bw;                             /* streamed experts: measured read rate of the tier below */
    sl_kv_type kv_type;                         /* the session's attention cache type */
    double kv_bytes;                            /* its KV cache bytes per position */
} bench_result;

/* The shares of all routed experts in slots (*ps) and in the host cache beyond them (*pr; the slots are
 * filled from it), by the tiers' sizes. */
static void tier_shares(const sl_store_stats *d, double all, double *ps, double *pr) {
    double s = d->n_slots / all, h = d->n_ram / all;
    s = s > 1 ? 1 : s;
    h = h > 1 ? 1 : h;
    *ps = s;
    *pr = h > s ? h - s : 0;
}

/* One expert's copy into a slot: as measured at load, else one read of it at the memory bandwidth. */
static double copy_time(const sl_store_stats *d, const bench_result *r) {
    return d->copy_s > 0 ? d->copy_s : (double)d->slot_bytes / r->bandwidth;
}

/* Decode tok/s with streamed experts as the tiers' sizes and measured speeds predict it, before the runs'
 * own counters are looked at: the dense bytes at the memory bandwidth, and each routed expert found in a
 * slot, the host cache or on disk as often as the tiers' shares of all experts say (routing taken as
 * uniform), each at its cost: read from backend memory; copied, or computed on the CPU where that was
 * measured faster; read from the tier below, then copied. 0 when a speed is unknown. */
static double predict_decode(const bench_result *r) {
    const sl_store_stats *d = &r->st_dec;
    if (r->bandwidth <= 0 || r->tier_bw <= 0 || r->tok.moe_experts <= 0) return 0;
    double ps, pr;
    tier_shares(d, r->tok.moe_experts, &ps, &pr);
    double pd = 1 - ps - pr, xb = (double)d->slot_bytes, compute = xb / r->bandwidth;
    double copy = copy_time(d, r), ram = copy + compute;
    if (d->cpu_t1_s > 0 && d->cpu_t1_s < ram) ram = d->cpu_t1_s;
    double per_expert = ps * compute + pr * ram + pd * (xb / r->tier_bw + copy + compute);
    double routed = xb > 0 ? r->tok.expert_bytes / xb : 0; /* experts a token runs, over all layers */
    double t = (r->tok.bytes - r->tok.expert_bytes) / r->bandwidth + routed * per_expert;
    return t > 0 ? 1.0 / t : 0;
}

/* Bytes a decode token takes from the tier below the host cache: its reads, and the experts computed on the CPU
 * where the page cache held them (each read out of it once, at about the rate the read probe measures). */
static double tier_bytes(const sl_store_stats *d) {
    if (!d->tokens) return 0;
    return ((double)d->bytes_read + (double)d->hits_mapped * (double)d->slot_bytes) / (double)d->tokens;
}

/* Decode tok/s were the tier's measured read rate all a token waited for; 0 under an expert a token, where
 * reads bound nothing. */
static double io_bound(const bench_result *r) {
    double b = tier_bytes(&r->st_dec);
    return r->tier_bw > 0 && b > 0 && b >= (double)r->st_dec.slot_bytes ? r->tier_bw / b : 0;
}

static double prefill_gflop(const bench_result *r) {
    return 2.0 * ((r->tok.params - r->tok.head_params) * r->prompt + r->tok.head_params) / 1e9;
}

/* Prompt tok/s with streamed experts as predicted the same way: the prompt's multiply-adds at the measured
 * peak, then every MoE layer's distinct experts for the prompt (E (1 - (1 - k/E)^P) with uniform routing)
 * that the slots do not hold, copied from the host cache or read and copied, none of it overlapped. 0 when
 * a speed is unknown. */
static double predict_prefill(const bench_result *r) {
    const sl_store_stats *d = &r->st_pre;
    double xb = (double)d->slot_bytes;
    if (r->flops <= 0 || r->bandwidth <= 0 || r->tier_bw <= 0 || r->tok.moe_layers <= 0 || xb <= 0) return 0;
    double L = r->tok.moe_layers, E = r->tok.moe_experts / L, k = r->tok.expert_bytes / xb / L;
    double used = E * (1 - pow(1 - k / E, r->prompt)), ps, pr;
    tier_shares(d, r->tok.moe_experts, &ps, &pr);
    double copy = copy_time(d, r);
    double loads = L * used * (pr * copy + (1 - ps - pr) * (xb / r->tier_bw + copy));
    double t = prefill_gflop(r) * 1e9 / r->flops + loads;
    return t > 0 ? r->prompt / t : 0;
}

static void print_table(const sl_model *m, const bench_result *r) {
    char b1[32], b2[32], b3[32];
    printf("%s\n", m->path);
    printf("  %-22s%s (%s family), %s parameters\n", "model", m->cfg.model_type, m->family->name,
           sl_human_count((double)m->n_params, b1, sizeof b1));
    printf("  %-22s%s, %d thread%s\n", "backend", m->be->ops->name, r->threads, r->threads == 1 ? "" : "s");
    if (r->synthetic) printf("  %-22s%s (generated in %.1f s)\n", "synthetic", r->synthetic, r->gen_s);
    printf("  %-22s%s\n", "weights", sl_human_bytes(r->weight_bytes, b1, sizeof b1));
    printf("  %-22s%.1f ms\n", "load", r->load_s * 1e3);
    if (r->bandwidth > 0) printf("  %-22s%.2f GB/s (measured read bandwidth)\n", "memory", r->bandwidth / 1e9);
    if (r->flops > 0) printf("  %-22s%.1f GFLOP/s (measured multiply-add peak)\n", "compute", r->flops / 1e9);
    printf("  %-22s%s, %s/token\n", "kv cache", sl_kv_type_name(r->kv_type),
           sl_human_bytes(r->kv_bytes, b1, sizeof b1));
    if (r->depth > 0) printf("  %-22s%d tokens in the cache before the prompt\n", "depth", r->depth);
    double pf = r->prompt / r->prefill_s;
    printf("  %-22s%d tokens in %.1f ms: %.1f tok/s, %.1f GFLOP/s", "prefill", r->prompt, r->prefill_s * 1e3, pf,
           prefill_gflop(r) / r->prefill_s);
    if (r->flops > 0) printf(", %.1f%% of peak", 100.0 * prefill_gflop(r) * 1e9 / r->prefill_s / r->flops);
    printf("\n");
    if (r->gen > 0) {
        double per = r->decode_s / r->gen;
        printf("  %-22s%d tokens in %.1f ms: %.2f ms/token, %.1f tok/s%s\n", "decode", r->gen, r->decode_s * 1e3,
               per * 1e3, 1.0 / per, r->host_logits ? " (logits copied to the host each step)" : "");
        printf("  %-22s%s/token (%s active parameters)\n", "decode weight reads",
               sl_human_bytes(r->tok.bytes, b2, sizeof b2), sl_human_count(r->tok.params, b3, sizeof b3));
        printf("  %-22s%.2f GB/s", "decode bandwidth", r->tok.bytes / per / 1e9);
        if (r->bandwidth > 0)
            printf(", %.1f%% of the roofline (bound %.1f tok/s)", 100.0 * r->tok.bytes / per / r->bandwidth,
                   r->bandwidth / r->tok.bytes);
        printf("\n");
    }
    if (r->n_experts > 0)
        printf("  %-22s%d of %d experts chosen by the last %d prompt tokens (last MoE layer)\n", "routing",
               r->experts_used, r->n_experts, r->routed_tokens);
    if (m->store) {
        const sl_store_stats *d = &r->st_dec;
        char line[256];
        printf("  %-22s%d slots of %s in %s memory, host cache %s, %s reads via %s%s\n", "streamed experts", d->n_slots,
               sl_human_bytes((double)d->slot_bytes, b1, sizeof b1),
               m->be->ops->place_weight ? m->be->ops->name : "host",
               d->n_ram ? sl_human_count(d->n_ram, b2, sizeof b2) : "off", sl_io_mode_name(d->io), d->engine,
               d->packed ? ", from the expert pack" : "");
        if (d->cpu_t1_s > 0)
            printf("  %-22san expert copied into a slot %.3f ms; on the CPU %.3f ms + %.3f ms a token more\n",
                   "CPU experts", d->copy_s * 1e3, d->cpu_t1_s * 1e3, d->cpu_tm_s * 1e3);
        printf("  %-22s%s\n", "prefill experts", sl_store_stats_line(&r->st_pre, line, sizeof line));
        double ppred = predict_prefill(r);
        if (ppred > 0)
            printf("  %-22s%.1f tok/s from the tiers' sizes and speeds and the compute peak, routing taken as uniform "
                   "(measured %.1f)\n",
                   "prefill predicted", ppred, r->prompt / r->prefill_s);
        if (r->gen > 0) {
            printf("  %-22s%s\n", "decode experts", sl_store_stats_line(d, line, sizeof line));
            double miss = d->tokens ? (double)d->bytes_read / (double)d->tokens : 0;
            double pred = predict_decode(r), bound = io_bound(r), mapped = tier_bytes(d) - miss;
            if (pred > 0)
                printf("  %-22s%.1f tok/s from the tiers' sizes and speeds, routing taken as uniform (measured "
                       "%.1f)\n",
                       "decode predicted", pred, r->gen / r->decode_s);
            printf("  %-22s%.2f GB/s measured; %s missed per token", "expert tier read", r->tier_bw / 1e9,
                   sl_human_bytes(miss, b3, sizeof b3));
            if (mapped > 0) printf(", %s computed from the page cache", sl_human_bytes(mapped, b3, sizeof b3));
            if (bound > 0)
                printf(" -> I/O bound %.1f tok/s, decode at %.1f%% of it", bound,
                       100.0 * (r->gen / r->decode_s) / bound);
            printf("\n");
        }
    }
    printf("  %-22s%d (best time of each phase shown)\n", "runs", r->runs);
}

static int print_json(const sl_model *m, const bench_result *r) {
    json_t *o = json_object();
    if (!o) return -1;
    double pf = r->prompt / r->prefill_s;
    json_object_set_new(o, "model", json_string(m->path));
    json_object_set_new(o, "model_type", json_string(m->cfg.model_type));
    json_object_set_new(o, "family", json_string(m->family->name));
    json_object_set_new(o, "params", json_integer((json_int_t)m->n_params));
    json_object_set_new(o, "backend", json_string(m->be->ops->name));
    json_object_set_new(o, "threads", json_integer(r->threads));
    json_object_set_new(o, "weight_bytes", json_integer((json_int_t)r->weight_bytes));
    json_object_set_new(o, "runs", json_integer(r->runs));
    json_object_set_new(o, "load_s", json_real(r->load_s));
    json_object_set_new(o, "kv_type", json_string(sl_kv_type_name(r->kv_type)));
    json_object_set_new(o, "kv_bytes_per_token", json_integer((json_int_t)r->kv_bytes));
    if (r->synthetic) {
        json_object_set_new(o, "synthetic", json_string(r->synthetic));
        json_object_set_new(o, "generate_s", json_real(r->gen_s));
    }
    if (r->bandwidth > 0) json_object_set_new(o, "mem_bandwidth_gb_s", json_real(r->bandwidth / 1e9));
    if (r->flops > 0) {
        json_object_set_new(o, "peak_gflop_s", json_real(r->flops / 1e9));
        json_object_set_new(o, "prefill_peak_fraction", json_real(prefill_gflop(r) * 1e9 / r->prefill_s / r->flops));
    }
    json_object_set_new(o, "prompt_tokens", json_integer(r->prompt));
    json_object_set_new(o, "depth", json_integer(r->depth));
    json_object_set_new(o, "prefill_s", json_real(r->prefill_s));
    json_object_set_new(o, "prefill_tok_s", json_real(pf));
    json_object_set_new(o, "prefill_gflop_s", json_real(prefill_gflop(r) / r->prefill_s));
    json_object_set_new(o, "decode_tokens", json_integer(r->gen));
    json_object_set_new(o, "decode_logits_to_host", json_boolean(r->host_logits));
    if (r->gen > 0) {
        double per = r->decode_s / r->gen;
        json_object_set_new(o, "decode_s", json_real(r->decode_s));
        json_object_set_new(o, "decode_tok_s", json_real(1.0 / per));
        json_object_set_new(o, "decode_ms_per_token", json_real(per * 1e3));
        json_object_set_new(o, "decode_gb_s", json_real(r->tok.bytes / per / 1e9));
        if (r->bandwidth > 0) {
            json_object_set_new(o, "decode_roofline_fraction", json_real(r->tok.bytes / per / r->bandwidth));
            json_object_set_new(o, "decode_bound_tok_s", json_real(r->bandwidth / r->tok.bytes));
        }
    }
    if (r->n_experts > 0) {
        json_object_set_new(o, "n_experts", json_integer(r->n_experts));
        json_object_set_new(o, "routing_experts_used", json_integer(r->experts_used));
        json_object_set_new(o, "routing_tokens", json_integer(r->routed_tokens));
    }
    if (m->store) {
        const sl_store_stats *ph[2] = {&r->st_pre, &r->st_dec};
        const char *names[2] = {"prefill", "decode"};
        json_t *x = json_object();
        json_object_set_new(x, "slots", json_integer(r->st_dec.n_slots));
        json_object_set_new(x, "slot_bytes", json_integer((json_int_t)r->st_dec.slot_bytes));
        json_object_set_new(x, "host_cache_experts", json_integer(r->st_dec.n_ram));
        json_object_set_new(x, "io", json_string(sl_io_mode_name(r->st_dec.io)));
        json_object_set_new(x, "engine", json_string(r->st_dec.engine));
        json_object_set_new(x, "packed", json_boolean(r->st_dec.packed));
        json_object_set_new(x, "tier_read_gb_s", json_real(r->tier_bw / 1e9));
        json_object_set_new(x, "expert_copy_s", json_real(r->st_dec.copy_s));
        double ppred = predict_prefill(r), dpred = r->gen > 0 ? predict_decode(r) : 0;
        if (ppred > 0) json_object_set_new(x, "prefill_predicted_tok_s", json_real(ppred));
        if (dpred > 0) json_object_set_new(x, "decode_predicted_tok_s", json_real(dpred));
        if (r->gen > 0) {
            json_object_set_new(x, "decode_tier_bytes_per_token", json_real(tier_bytes(&r->st_dec)));
            if (io_bound(r) > 0) json_object_set_new(x, "decode_io_bound_tok_s", json_real(io_bound(r)));
        }
        json_object_set_new(x, "cpu_expert_s", json_real(r->st_dec.cpu_t1_s));
        json_object_set_new(x, "cpu_expert_token_s", json_real(r->st_dec.cpu_tm_s));
        for (int i = 0; i < 2; i++) {
            const sl_store_stats *p = ph[i];
            json_t *y = json_object();
            json_object_set_new(y, "tokens", json_integer((json_int_t)p->tokens));
            json_object_set_new(y, "lookups", json_integer((json_int_t)p->lookups));
            json_object_set_new(y, "hits_slots", json_integer((json_int_t)p->hits_slot));
            json_object_set_new(y, "hits_read_ahead", json_integer((json_int_t)p->hits_ahead));
            json_object_set_new(y, "hits_host_cache", json_integer((json_int_t)p->hits_ram));
            json_object_set_new(y, "misses", json_integer((json_int_t)p->misses));
            json_object_set_new(y, "bytes_read", json_integer((json_int_t)p->bytes_read));
            json_object_set_new(y, "copies", json_integer((json_int_t)p->copies));
            json_object_set_new(y, "read_busy_s", json_real(p->read_busy_s));
            json_object_set_new(y, "stall_s", json_real(p->stall_s));
            json_object_set_new(y, "route_wait_s", json_real(p->route_wait_s));
            json_object_set_new(y, "host_s", json_real(p->host_s));
            json_object_set_new(y, "sync_s", json_real(p->sync_s));
            json_object_set_new(y, "host_issue_s", json_real(p->issue_s));
            json_object_set_new(y, "host_launch_s", json_real(p->launch_s));
            json_object_set_new(y, "host_submit_s", json_real(p->submit_s));
            json_object_set_new(y, "predicted", json_integer((json_int_t)p->predicted));
            json_object_set_new(y, "predicted_used", json_integer((json_int_t)p->predicted_used));
            json_object_set_new(y, "hits_page_cache", json_integer((json_int_t)p->hits_mapped));
            json_object_set_new(y, "cpu_experts", json_integer((json_int_t)p->cpu_experts));
            json_object_set_new(y, "cpu_pairs", json_integer((json_int_t)p->cpu_pairs));
            json_object_set_new(y, "cpu_s", json_real(p->cpu_s));
            json_object_set_new(y, "steps_device", json_integer((json_int_t)p->steps_device));
            json_object_set_new(y, "steps_redone", json_integer((json_int_t)p->steps_redone));
            json_object_set_new(y, "step_check_s", json_real(p->step_check_s));
            json_object_set_new(x, names[i], y);
        }
        json_object_set_new(o, "streaming", x);
    }
    json_object_set_new(o, "bytes_per_token", json_integer((json_int_t)(r->tok.bytes + 0.5)));
    json_object_set_new(o, "active_params_per_token", json_integer((json_int_t)(r->tok.params + 0.5)));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!s) return -1;
    printf("%s\n", s);
    free(s);
    return 0;
}

static int check_finite(const float *v, int n, const char *when, sl_err *e) {
    for (int i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return sl_fail(e, "logit %d is %s %s: the weights or a kernel produce non-finite values", i,
                           isnan(v[i]) ? "NaN" : "infinite", when);
    return 0;
}

/* How many distinct experts the last MoE layer chose for the last prefill chunk: a synthetic model
 * whose routing collapses onto a few experts would understate decode traffic. */
static int routing_spread(sl_session *s, bench_result *r, sl_err *e) {
    const sl_config *c = &s->m->cfg;
    int any = 0;
    for (int l = 0; l < c->n_layers; l++) any |= s->m->layers[l].moe != NULL;
    if (!any || c->n_experts <= 0) return 0;
    int nb = r->prompt % s->max_batch ? r->prompt % s->max_batch : s->max_batch;
    size_t n = (size_t)nb * (size_t)c->top_k;
    int32_t *ids = malloc(n * sizeof *ids);
    char *seen = calloc((size_t)c->n_experts, 1);
    if (!ids || !seen) {
        free(ids);
        free(seen);
        return sl_fail(e, "out of memory");
    }
    s->m->be->ops->download(s->m->be, ids, s->s.moe.ids, n * sizeof *ids);
    int used = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < c->n_experts && !seen[ids[i]]) {
            seen[ids[i]] = 1;
            used++;
        }
    free(ids);
    free(seen);
    r->routed_tokens = nb;
    r->experts_used = used;
    r->n_experts = c->n_experts;
    return 0;
}

/* One prefill + decode from an empty cache; times go to *pre and *dec. */
static int run_once(sl_session *s, const int32_t *prompt, bench_result *r, float *logits, double *pre, double *dec,
                    int first, sl_err *e) {
    int V = s->m->cfg.vocab_size;
    sl_session_reset(s);
    sl_expert_store *xs = s->m->store;
    if (r->depth > 0 && sl_session_forward(s, prompt + r->prompt, r->depth, logits, 0, e)) return -1;
    if (xs) sl_store_stats_reset(xs);
    double t0 = sl_now();
    if (sl_session_forward(s, prompt, r->prompt, logits, 0, e)) return -1;
    double t1 = sl_now();
    if (xs) {
        sl_store_stats_get(xs, &r->st_run);
        sl_store_stats_reset(xs);
    }
    if (first && (check_finite(logits, V, "after prefill", e) || routing_spread(s, r, e))) return -1;
    double t2 = sl_now();
    int32_t id = argmax(logits, V);
    for (int i = 0; i < r->gen; i++) {
        if (r->host_logits) {
            if (sl_session_forward(s, &id, 1, logits, 0, e)) return -1;
            id = argmax(logits, V);
        } else {
            int32_t in = id;
            if (sl_session_forward_argmax(s, &in, 1, &id, e)) return -1;
            if (id < 0) return sl_fail(e, "no logit above -inf at decode step %d", i + 1);
        }
    }
    *pre = t1 - t0;
    *dec = sl_now() - t2;
    if (xs && (first || *dec < r->decode_s)) { /* the phases of the best decode */
        r->st_pre = r->st_run;
        sl_store_stats_get(xs, &r->st_dec);
    }
    if (first && r->gen > 0 && !r->host_logits && sl_session_last_logits(s, logits, e)) return -1;
    if (first && r->gen > 0 && check_finite(logits, V, "after decode", e)) return -1;
    return 0;
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL;
    bench_result r = {.prompt = 512, .gen = 128, .runs = 1};
    int json = 0, threads = 0, layers = 0, warmup = 1;
    const char *synth = NULL, *quant = NULL, *dir = NULL, *backend = NULL;
    sl_model_opts o = {0};
    int par[16], n_par = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        int sf = cli_stream_flag("sluice bench", a, i + 1 < argc ? argv[i + 1] : NULL, &o);
        if (sf < 0) return 2;
        if (sf > 0) {
            i += sf - 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") && i + 1 < argc) {
            bad = parse_int(argv[++i], 1, &r.prompt);
        } else if (!strcmp(a, "-n") && i + 1 < argc) {
            bad = parse_int(argv[++i], 0, &r.gen);
        } else if (!strcmp(a, "-d") && i + 1 < argc) {
            bad = parse_int(argv[++i], 0, &r.depth);
        } else if (!strcmp(a, "-r") && i + 1 < argc) {
            bad = parse_int(argv[++i], 1, &r.runs);
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            bad = parse_int(argv[++i], 1, &threads);
        } else if (!strcmp(a, "--backend") && i + 1 < argc) {
            backend = argv[++i];
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--host-logits")) {
            r.host_logits = 1;
        } else if (!strcmp(a, "--no-warmup")) {
            warmup = 0;
        } else if (!strcmp(a, "--synthetic") && i + 1 < argc) {
            synth = argv[++i];
        } else if (!strcmp(a, "--quant") && i + 1 < argc) {
            quant = argv[++i];
        } else if (!strcmp(a, "--layers") && i + 1 < argc) {
            bad = parse_int(argv[++i], 1, &layers);
        } else if (!strcmp(a, "--parallel") && i + 1 < argc) {
            char *dup = strdup(argv[++i]), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t && !bad; t = strtok_r(NULL, ",", &save)) {
                if (n_par == 16)
                    bad = 1;
                else
                    bad = parse_int(t, 1, &par[n_par++]);
                if (!bad && par[n_par - 1] > 256) bad = 1;
            }
            free(dup);
            if (bad || !n_par) {
                fprintf(stderr, "sluice bench: --parallel takes up to 16 counts in [1, 256] such as 1,4,16, got '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--dir") && i + 1 < argc) {
            dir = argv[++i];
        } else if (a[0] != '-' && !model) {
            model = a;
        } else {
            fprintf(stderr, "sluice bench: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "sluice bench: %s needs a whole number, got '%s'\n", a, argv[i]);
            return 2;
        }
    }
    if (!model == !synth) {
        if (model) fprintf(stderr, "sluice bench: give either MODEL or --synthetic SHAPE, not both\n");
        usage(stderr);
        return 2;
    }
    sl_err e = {{0}};
    char synth_label[96], *synth_dir = NULL;
    if (synth) {
        const sl_synth_shape *sh = sl_synth_find(synth);
        sl_synth_quant q;
        if (!sh) {
            fprintf(stderr, "sluice bench: unknown shape '%s'; shapes:", synth);
            for (const sl_synth_shape *x = sl_synth_shapes(); x->name; x++) fprintf(stderr, " %s", x->name);
            fprintf(stderr, "\n");
            return 2;
        }
        if (!quant) {
            q = sl_synth_default_quant(sh);
        } else if (sl_synth_parse_quant(quant, &q) || !sl_synth_takes(sh, q)) {
            /* "a b c" -> "a, b or c" */
            char list[96];
            size_t n = 0;
            for (const char *p = sh->quants; *p && n + 8 < sizeof list; p++) {
                if (*p != ' ')
                    list[n++] = *p;
                else
                    n += (size_t)snprintf(list + n, sizeof list - n, "%s", strchr(p + 1, ' ') ? ", " : " or ");
            }
            list[n] = 0;
            fprintf(stderr, "sluice bench: --quant for %s must be %s, got '%s'\n", sh->name, list, quant);
            return 2;
        }
        synth_dir = dir ? strdup(dir) : sl_synth_default_dir(sh, q, layers);
        int generated = 0;
        double g0 = sl_now();
        if (!synth_dir) {
            fprintf(stderr, "sluice bench: out of memory\n");
            return 1;
        }
        if (sl_synth_ensure(sh, q, layers, synth_dir, json, &generated, &e)) {
            fprintf(stderr, "sluice bench: %s\n", e.msg);
            free(synth_dir);
            return 1;
        }
        r.gen_s = generated ? sl_now() - g0 : 0;
        snprintf(synth_label, sizeof synth_label, "%s %s%s", sh->name, sl_synth_quant_name(q),
                 generated ? "" : ", reused");
        r.synthetic = synth_label;
        char *path = sl_synth_model_path(synth_dir, q); /* the folder, or the GGUF file in it */
        free(synth_dir);
        synth_dir = path;
        if (!synth_dir) {
            fprintf(stderr, "sluice bench: out of memory\n");
            return 1;
        }
        model = synth_dir;
    }
    sl_model *m = NULL;
    sl_session *s = NULL;
    float *logits = NULL;
    int32_t *prompt = NULL;
    int rc = 1;
    o.threads = threads;
    o.backend = backend;
    o.ctx = r.depth + r.prompt + r.gen;
    double t0 = sl_now();
    if (sl_model_load(model, &o, &m, &e)) goto done;
    r.load_s = sl_now() - t0;
    if (sl_session_create(m, r.depth + r.prompt + r.gen, &s, &e)) goto done;
    int V = m->cfg.vocab_size;
    logits = malloc((size_t)V * sizeof *logits);
    prompt = malloc((size_t)(r.prompt + r.depth) * sizeof *prompt); /* the prompt, then the depth's tokens */
    if (!logits || !prompt) {
        sl_fail(&e, "out of memory");
        goto done;
    }
    uint64_t st = 0x5eed;
    for (int i = 0; i < r.prompt + r.depth; i++) prompt[i] = (int32_t)(sl_splitmix64(&st) % (uint64_t)V);
    r.threads = !strcmp(m->be->ops->name, "cpu") ? cpu_of(m->be)->n_threads : threads;
    r.weight_bytes = (double)(m->bytes_experts + m->bytes_other);
    r.tok = per_token_traffic(m);
    r.kv_type = s->kv_type;
    r.kv_bytes = (double)sl_session_kv_bytes_per_token(m, s->kv_type);
    if (m->be->ops->mem_bandwidth) r.bandwidth = m->be->ops->mem_bandwidth(m->be);
    if (m->be->ops->peak_flops) r.flops = m->be->ops->peak_flops(m->be);
    if (n_par) {
        sl_bench_par res[16];
        if (r.depth > 0) {
            sl_fail(&e, "-d is not taken with --parallel");
            goto done;
        }
        if (sl_bench_parallel(m, par, n_par, r.prompt, r.gen, r.runs, warmup && !m->store, res, &e)) goto done;
        if (r.synthetic) printf("%s\n", r.synthetic);
        sl_bench_parallel_print(m, res, n_par, r.prompt, r.gen);
        rc = 0;
        goto done;
    }
    if (warmup && !m->store) { /* untimed: its times and counts go to a copy */
        bench_result w = r;
        double pre = 0, dec = 0;
        w.gen = r.gen < 2 ? r.gen : 2;
        if (run_once(s, prompt, &w, logits, &pre, &dec, 1, &e)) goto done;
    }
    for (int k = 0; k < r.runs; k++) {
        double pre = 0, dec = 0;
        if (run_once(s, prompt, &r, logits, &pre, &dec, k == 0, &e)) goto done;
        if (k == 0 || pre < r.prefill_s) r.prefill_s = pre;
        if (k == 0 || dec < r.decode_s) r.decode_s = dec;
    }
    /* the rate the tier below the slots delivers, measured after the runs (a warm page cache stays warm) */
    if (m->store && (r.tier_bw = sl_store_probe_read(m->store, (uint64_t)2 << 30, &e)) < 0) goto done;
    if (json) {
        if (print_json(m, &r)) {
            sl_fail(&e, "out of memory");
            goto done;
        }
    } else {
        print_table(m, &r);
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "sluice bench: %s\n", e.msg);
    free(logits);
    free(prompt);
    free(synth_dir);
    sl_session_free(s);
    sl_model_free(m);
    return rc;
}
