#include "formats/config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

/* Far beyond any real checkpoint; keeps a corrupt value from turning into huge per-layer allocations. */
#define MAX_LAYERS 4096

/* Far beyond any real head count, head size or expert count; a corrupt value fails here, not in an allocation. */
#define MAX_HEADS (1 << 16)

/* A value already checked by read_int (per-module quantization overrides), or a default. */
static int get_int(json_t *o, const char *k, int dflt) {
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v)) return (int)json_integer_value(v);
    if (json_is_real(v)) return (int)json_real_value(v);
    return dflt;
}

static double get_num(json_t *o, const char *k, double dflt) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

/* The one reader of integer fields: absent or null gives dflt (as transformers' defaults do); a number must
 * be a whole number within [lo, hi] (an integral float such as 4096.0 is accepted), anything else is an
 * error naming the field and the value, never a silent truncation. */
static int read_int(json_t *o, const char *where, const char *prefix, const char *k, long long lo, long long hi,
                    int dflt, int *out, sl_err *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x >= lo && x <= hi) {
            *out = (int)x;
            return 0;
        }
        return sl_fail(e, "%s: field '%s%s' = %lld is out of range (expected an integer in [%lld, %lld])", where,
                       prefix, k, (long long)x, lo, hi);
    }
    if (json_is_real(v)) {
        double x = json_real_value(v);
        if (x == floor(x) && x >= (double)lo && x <= (double)hi) {
            *out = (int)x;
            return 0;
        }
        return sl_fail(e, "%s: field '%s%s' = %.17g is not an integer in [%lld, %lld]", where, prefix, k, x, lo, hi);
    }
    if (json_is_boolean(v) || json_is_string(v) || json_is_array(v) || json_is_object(v))
        return sl_fail(e, "%s: field '%s%s' is a %s, expected an integer in [%lld, %lld]", where, prefix, k,
                       json_is_boolean(v)  ? "boolean"
                       : json_is_string(v) ? "string"
                       : json_is_array(v)  ? "array"
                                           : "object",
                       lo, hi);
    *out = dflt;
    return 0;
}

static int need_int(json_t *o, const char *where, const char *k, long long hi, int *out, sl_err *e) {
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) <= hi) {
        *out = (int)json_integer_value(v);
        return 0;
    }
    if (json_is_integer(v))
        return sl_fail(e, "%s: field '%s' missing or not a positive integer (got %lld, expected [1, %lld])", where, k,
                       (long long)json_integer_value(v), hi);
    return sl_fail(e, "%s: field '%s' missing or not a positive integer", where, k);
}
static int parse_rope(json_t *tc, const char *where, sl_rope_cfg *r, int max_pos, sl_err *e) {
    /* transformers 5 writes rope_parameters; Hub checkpoints often write rope_theta + rope_scaling. */
    json_t *rp = json_object_get(tc, "rope_parameters");
    json_t *rs = json_object_get(tc, "rope_scaling");
    json_t *src = json_is_object(rp) ? rp : (json_is_object(rs) ? rs : NULL);
    r->theta = get_num(tc, "rope_theta", 10000.0);
    r->partial_factor = get_num(tc, "partial_rotary_factor", 1.0);
    r->type = SL_ROPE_DEFAULT;
    r->factor = 1.0;
    if (!src) return 0;
    r->theta = get_num(src, "rope_theta", r->theta);
    r->partial_factor = get_num(src, "partial_rotary_factor", r->partial_factor);
    json_t *t = json_object_get(src, "rope_type");
    if (!t) t = json_object_get(src, "type");
    const char *ty = json_is_string(t) ? json_string_value(t) : "default";
    r->factor = get_num(src, "factor", 1.0);
    if (read_int(src, where, "rope_scaling.", "original_max_position_embeddings", 0, INT_MAX, max_pos,
                 &r->original_max_pos, e))
        return -1;
    if (!strcmp(ty, "default")) {
        r->type = SL_ROPE_DEFAULT;
    } else if (!strcmp(ty, "linear")) {
        r->type = SL_ROPE_LINEAR;
    } else if (!strcmp(ty, "llama3")) {
        r->type = SL_ROPE_LLAMA3;
        r->low_freq_factor = get_num(src, "low_freq_factor", 1.0);
        r->high_freq_factor = get_num(src, "high_freq_factor", 4.0);
        if (r->original_max_pos <= 0)
            return sl_fail(e, "%s: rope type llama3 needs original_max_position_embeddings", where);
    } else if (!strcmp(ty, "yarn")) {
        r->type = SL_ROPE_YARN;
        r->beta_fast = get_num(src, "beta_fast", 32.0);
        r->beta_slow = get_num(src, "beta_slow", 1.0);
        r->attention_factor = get_num(src, "attention_factor", 0.0);
        r->mscale = get_num(src, "mscale", 0.0);
        r->mscale_all_dim = get_num(src, "mscale_all_dim", 0.0);
        json_t *tr = json_object_get(src, "truncate");
        r->truncate = json_is_boolean(tr) ? json_is_true(tr) : 1;
    } else {
        return sl_fail(e, "%s: unsupported rope type '%s' (expected default, linear, llama3 or yarn)", where, ty);
    }
    return 0;
}

static int parse_config(json_t *root, const char *where, sl_config *c, sl_err *e);

static int get_bool(json_t *o, const char *k, int dflt) {
    json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* The DeepSeek-V3 family's fields (GLM-4.5 shares its router): sigmoid routing, dense leading layers, the
 * ungated shared expert and multi-head latent attention. */
static int parse_deepseek(json_t *tc, const char *where, sl_config *c, sl_err *e) {
    const char *mt = c->model_type;
    int ds = !strcmp(mt, "deepseek_v3") || !strcmp(mt, "kimi_k2"), glm = !strcmp(mt, "glm4_moe");
    json_t *sf = json_object_get(tc, "scoring_func");
    c->route_sigmoid = json_is_string(sf) ? !strcmp(json_string_value(sf), "sigmoid") : ds || glm;
    c->routed_scale = get_num(tc, "routed_scaling_factor", 1.0);
    c->use_qk_norm = get_bool(tc, "use_qk_norm", 0);
    c->attention_bias = get_bool(tc, "attention_bias", 0);
    c->rope_interleave = get_bool(tc, "rope_interleave", ds);
    if (read_int(tc, where, "", "n_group", 0, MAX_HEADS, 1, &c->n_group, e) ||
        read_int(tc, where, "", "topk_group", 0, MAX_HEADS, 1, &c->topk_group, e) ||
        read_int(tc, where, "", "first_k_dense_replace", 0, MAX_LAYERS, 0, &c->first_dense, e) ||
        read_int(tc, where, "", "num_nextn_predict_layers", 0, MAX_LAYERS, 0, &c->n_nextn, e) ||
        read_int(tc, where, "", "n_shared_experts", 0, MAX_HEADS, 0, &c->n_shared, e) ||
        read_int(tc, where, "", "q_lora_rank", 0, INT_MAX, 0, &c->q_lora_rank, e) ||
        read_int(tc, where, "", "kv_lora_rank", 0, INT_MAX, 0, &c->kv_lora_rank, e) ||
        read_int(tc, where, "", "qk_nope_head_dim", 0, MAX_HEADS, 0, &c->qk_nope_dim, e) ||
        read_int(tc, where, "", "qk_rope_head_dim", 0, MAX_HEADS, 0, &c->qk_rope_dim, e) ||
        read_int(tc, where, "", "v_head_dim", 0, MAX_HEADS, 0, &c->v_head_dim, e))
        return -1;
    if (!c->shared_intermediate) c->shared_intermediate = c->n_shared * c->moe_intermediate;
    if (c->n_group < 1) c->n_group = 1;
    if (c->topk_group < 1 || c->topk_group > c->n_group) c->topk_group = c->n_group;
    if (c->n_experts && c->n_experts % c->n_group)
        return sl_fail(e, "%s: n_routed_experts %d is not a multiple of n_group %d", where, c->n_experts, c->n_group);
    if (c->kv_lora_rank > 0) {
        if (c->qk_rope_dim <= 0 || c->qk_rope_dim % 2 || c->qk_nope_dim <= 0 || c->v_head_dim <= 0)
            return sl_fail(e,
                           "%s: kv_lora_rank %d needs positive qk_nope_head_dim, v_head_dim and an even "
                           "qk_rope_head_dim (got %d, %d, %d)",
                           where, c->kv_lora_rank, c->qk_nope_dim, c->v_head_dim, c->qk_rope_dim);
        /* the rotary tables cover the decoupled rope part of each head */
        c->head_dim = c->qk_rope_dim;
        c->rope.partial_factor = 1.0;
    }
    return 0;
}

/* On failure nothing is left to free: the per-layer tables a failed parse allocated go with it. */
int sl_config_parse(json_t *root, const char *where, sl_config *c, sl_err *e) {
    memset(c, 0, sizeof *c);
    if (!parse_config(root, where, c, e)) return 0;
    sl_config_free(c);
    return -1;
}

static int parse_config(json_t *root, const char *where, sl_config *c, sl_err *e) {
    json_t *tc = json_object_get(root, "text_config");
    if (!json_is_object(tc)) tc = root;
    json_t *mt = json_object_get(tc, "model_type");
    if (!json_is_string(mt)) mt = json_object_get(root, "model_type");
    if (!json_is_string(mt)) return sl_fail(e, "%s: missing string field 'model_type'", where);
    snprintf(c->model_type, sizeof c->model_type, "%s", json_string_value(mt));
    if (need_int(tc, where, "vocab_size", INT_MAX, &c->vocab_size, e) ||
        need_int(tc, where, "hidden_size", INT_MAX, &c->hidden, e) ||
        need_int(tc, where, "num_hidden_layers", INT_MAX, &c->n_layers, e) ||
        need_int(tc, where, "num_attention_heads", MAX_HEADS, &c->n_heads, e) ||
        read_int(tc, where, "", "num_key_value_heads", 1, MAX_HEADS, c->n_heads, &c->n_kv_heads, e) ||
        read_int(tc, where, "", "head_dim", 1, MAX_HEADS, c->hidden / c->n_heads, &c->head_dim, e) ||
        read_int(tc, where, "", "intermediate_size", 0, INT_MAX, 0, &c->intermediate, e) ||
        read_int(tc, where, "", "max_position_embeddings", 0, INT_MAX, 4096, &c->max_pos, e) ||
        read_int(tc, where, "", "sliding_window", 0, INT_MAX, 0, &c->sliding_window, e))
        return -1;
    if (c->n_layers > MAX_LAYERS)
        return sl_fail(e, "%s: num_hidden_layers %d exceeds the supported %d", where, c->n_layers, MAX_LAYERS);
    if (c->head_dim <= 0)
        return sl_fail(e, "%s: head_dim %d is not a positive integer (defaults to hidden_size / num_attention_heads)",
                       where, c->head_dim);
    c->rms_eps = get_num(tc, "rms_norm_eps", 1e-6);
    /* The top level decides tying for nested configs (the text_config copy may disagree). */
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    if (!json_is_boolean(tie)) tie = json_object_get(tc, "tie_word_embeddings");
    c->tie_embeddings = json_is_boolean(tie) ? json_is_true(tie) : 0;
    json_t *usw = json_object_get(tc, "use_sliding_window");
    if (json_is_false(usw) && strcmp(c->model_type, "mistral")) c->sliding_window = 0;
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return sl_fail(e, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", where, c->n_heads,
                       c->n_kv_heads);
    if (parse_rope(tc, where, &c->rope, json_is_number(json_object_get(tc, "max_position_embeddings")) ? c->max_pos : 0,
                   e))
        return -1;

    int local_experts = 0;
    if (read_int(tc, where, "", "num_local_experts", 0, MAX_HEADS, 0, &local_experts, e) ||
        read_int(tc, where, "", "num_experts", 0, MAX_HEADS, local_experts, &c->n_experts, e) ||
        read_int(tc, where, "", "num_experts_per_tok", 0, MAX_HEADS, 0, &c->top_k, e) ||
        read_int(tc, where, "", "moe_intermediate_size", 0, INT_MAX, 0, &c->moe_intermediate, e) ||
        read_int(tc, where, "", "shared_expert_intermediate_size", 0, INT_MAX, 0, &c->shared_intermediate, e) ||
        read_int(tc, where, "", "decoder_sparse_step", 0, MAX_LAYERS, 1, &c->decoder_sparse_step, e))
        return -1;
    /* Mixtral's experts are intermediate_size wide; it has no moe_intermediate_size */
    if (!c->moe_intermediate && !strcmp(c->model_type, "mixtral")) c->moe_intermediate = c->intermediate;
    /* DeepSeek-V3 / GLM-4.5 name their routed experts n_routed_experts */
    if (!c->n_experts && read_int(tc, where, "", "n_routed_experts", 0, MAX_HEADS, 0, &c->n_experts, e)) return -1;
    if (parse_deepseek(tc, where, c, e)) return -1;
    json_t *ntp = json_object_get(tc, "norm_topk_prob");
    c->norm_topk_prob = json_is_boolean(ntp) ? json_is_true(ntp) : 1;
    if (c->n_experts && (c->top_k <= 0 || c->top_k > c->n_experts))
        return sl_fail(e, "%s: num_experts_per_tok %d must be in [1, %d]", where, c->top_k, c->n_experts);
    c->swiglu_limit = get_num(tc, "swiglu_limit", 0.0);
    c->mlp_only = calloc((size_t)c->n_layers, sizeof *c->mlp_only);
    c->layer_kind = calloc((size_t)c->n_layers, sizeof *c->layer_kind);
    c->layer_window = calloc((size_t)c->n_layers, sizeof *c->layer_window);
    if (!c->mlp_only || !c->layer_kind || !c->layer_window) return sl_fail(e, "out of memory");
    for (int l = 0; l < c->n_layers; l++) c->layer_window[l] = c->sliding_window;
    json_t *mo = json_object_get(tc, "mlp_only_layers");
    size_t i;
    json_t *v;
    json_array_foreach(mo, i, v) {
        if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < c->n_layers)
            c->mlp_only[json_integer_value(v)] = 1;
    }
    json_t *lt = json_object_get(tc, "layer_types");
    if (json_is_array(lt)) {
        if ((int)json_array_size(lt) != c->n_layers)
            return sl_fail(e, "%s: layer_types has %zu entries, expected num_hidden_layers = %d", where,
                           json_array_size(lt), c->n_layers);
        json_array_foreach(lt, i, v) {
            const char *s = json_string_value(v);
            if (s && !strcmp(s, "linear_attention"))
                c->layer_kind[i] = SL_LAYER_LINEAR;
            else if (s && (!strcmp(s, "full_attention") || !strcmp(s, "sliding_attention")))
                c->layer_kind[i] = SL_LAYER_ATTENTION;
            else
                return sl_fail(e,
                               "%s: layer_types[%zu] = '%s' is not linear_attention, full_attention or "
                               "sliding_attention",
                               where, i, s ? s : "?");
            if (s && strcmp(s, "sliding_attention")) c->layer_window[i] = 0; /* only sliding layers slide */
        }
    } else if (json_is_integer(json_object_get(tc, "full_attention_interval"))) {
        /* older hybrid configs: every interval-th layer is full attention, the rest delta-net */
        int every = 4;
        if (read_int(tc, where, "", "full_attention_interval", 1, MAX_LAYERS, 4, &every, e)) return -1;
        for (int l = 0; l < c->n_layers; l++)
            c->layer_kind[l] = (l + 1) % every == 0 ? SL_LAYER_ATTENTION : SL_LAYER_LINEAR;
    }
    if (read_int(tc, where, "", "linear_conv_kernel_dim", 0, 1 << 10, 0, &c->conv_kernel, e) ||
        read_int(tc, where, "", "linear_key_head_dim", 0, MAX_HEADS, 0, &c->lin_k_head_dim, e) ||
        read_int(tc, where, "", "linear_value_head_dim", 0, MAX_HEADS, 0, &c->lin_v_head_dim, e) ||
        read_int(tc, where, "", "linear_num_key_heads", 0, MAX_HEADS, 0, &c->lin_n_k_heads, e) ||
        read_int(tc, where, "", "linear_num_value_heads", 0, MAX_HEADS, 0, &c->lin_n_v_heads, e))
        return -1;

    json_t *q = json_object_get(root, "quantization");
    if (!json_is_object(q)) q = json_object_get(root, "quantization_config");
    json_t *qm = json_is_object(q) ? json_object_get(q, "quant_method") : NULL;
    if (json_is_string(qm) && !strcmp(json_string_value(qm), "fp8")) {
        json_t *bs = json_object_get(q, "weight_block_size");
        if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(json_array_get(bs, 0)) ||
            !json_is_integer(json_array_get(bs, 1)) || json_integer_value(json_array_get(bs, 0)) <= 0 ||
            json_integer_value(json_array_get(bs, 1)) <= 0 || json_integer_value(json_array_get(bs, 0)) > 1 << 20 ||
            json_integer_value(json_array_get(bs, 1)) > 1 << 20)
            return sl_fail(e, "%s: quantization_config.weight_block_size must be two positive integers for fp8", where);
        c->fp8_block_rows = (int)json_integer_value(json_array_get(bs, 0));
        c->fp8_block_cols = (int)json_integer_value(json_array_get(bs, 1));
        q = NULL; /* not an MLX table */
    }
    if (json_is_object(q) && json_is_integer(json_object_get(q, "bits"))) {
        if (read_int(q, where, "quantization.", "bits", 1, 32, 0, &c->quant_bits, e) ||
            read_int(q, where, "quantization.", "group_size", 1, 1 << 20, 64, &c->quant_group, e))
            return -1;
        /* per-module overrides are read later by sl_config_quant_for, which has no way to fail: check them now */
        const char *mod;
        json_t *o;
        json_object_foreach(q, mod, o) {
            if (!json_is_object(o)) continue;
            char prefix[300];
            int tmp;
            snprintf(prefix, sizeof prefix, "quantization.%.200s.", mod);
            /* only truncation is checked here: the loader names the tensor whose format the value cannot be */
            if (read_int(o, where, prefix, "bits", INT_MIN, INT_MAX, 0, &tmp, e) ||
                read_int(o, where, prefix, "group_size", INT_MIN, INT_MAX, 64, &tmp, e))
                return -1;
        }
        c->quant = json_incref(q);
    }
    return 0;
}

int sl_config_load(const char *dir, sl_config *c, sl_err *e) {
    char *path = sl_path_join(dir, "config.json");
    json_error_t je;
    errno = 0;
    json_t *root = json_load_file(path, 0, &je);
    int err = errno;
    if (!root) {
        int r = !sl_file_exists(path) ? sl_fail(e, "%s: not found (expected a model directory with config.json)", path)
                : json_error_code(&je) == json_error_cannot_open_file
                    ? sl_fail(e, "%s: cannot read: %s", path, strerror(err))
                    : sl_fail(e, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
        free(path);
        return r;
    }
    int rc = json_is_object(root) ? sl_config_parse(root, path, c, e) : sl_fail(e, "%s: not a JSON object", path);
    json_decref(root);
    free(path);
    return rc;
}

void sl_config_free(sl_config *c) {
    free(c->mlp_only);
    free(c->layer_kind);
    free(c->layer_window);
    json_decref(c->quant);
    memset(c, 0, sizeof *c);
}

int sl_config_quant_for(const sl_config *c, const char *raw_module, int *bits, int *group) {
    if (!c->quant) return -1;
    *bits = c->quant_bits;
    *group = c->quant_group;
    json_t *o = json_object_get(c->quant, raw_module);
    if (json_is_object(o)) {
        *bits = get_int(o, "bits", *bits);
        *group = get_int(o, "group_size", *group);
    }
    return 0;
}
