#include "text/tok_gguf.h"

#include <stdlib.h>
#include <string.h>

/* tokenizer.ggml.pre names and the pre-tokenizer each stands for (the Split regex of the model's own
 * tokenizer.json; NULL: GPT-2's ByteLevel pattern). */
static const char QWEN2_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen3.5: Qwen2's pattern with combining marks (\p{M}) kept inside words */
static const char QWEN35_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
                                "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char LLAMA3_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const struct {
    const char *name, *re;
    int nfc, ignore_merges;
} pres[] = {
    {"default", NULL, 0, 0},     {"gpt2", NULL, 0, 0},
    {"qwen2", QWEN2_RE, 1, 0},   {"deepseek-r1-qwen", QWEN2_RE, 1, 0},
    {"qwen35", QWEN35_RE, 1, 0}, {"llama-bpe", LLAMA3_RE, 0, 1},
    {"llama3", LLAMA3_RE, 0, 1}, {"smaug-bpe", LLAMA3_RE, 0, 1},
};

static int str_is(sl_gguf_str s, const char *lit) {
    return s.len == strlen(lit) && !memcmp(s.s, lit, s.len);
}

static int get_id(const sl_gguf *g, const char *key, int32_t *id, sl_err *e) {
    int64_t v;
    int r = sl_gguf_get_int(g, key, &v, e);
    if (r < 0) return -1;
    *id = r == 1 || v < 0 || v > INT32_MAX ? -1 : (int32_t)v;
    return 0;
}

int sl_gguf_tokenizer(const sl_gguf *g, sl_tokenizer **out, sl_err *e) {
    *out = NULL;
    const char *path = g->paths[0];
    sl_gguf_str model, pre = {"default", 7}, tmpl = {NULL, 0};
    int r = sl_gguf_get_str(g, "tokenizer.ggml.model", &model, e);
    if (r < 0) return -1;
    if (r == 1) return sl_fail(e, "%s: missing metadata key 'tokenizer.ggml.model' (the file has no tokenizer)", path);
    if (!str_is(model, "gpt2"))
        return sl_fail(e, "%s: tokenizer.ggml.model '%.*s' is not supported (expected gpt2, a byte-level BPE)", path,
                       (int)model.len, model.s);
    if (sl_gguf_get_str(g, "tokenizer.ggml.pre", &pre, e) < 0) return -1;
    int pi = -1;
    for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++)
        if (str_is(pre, pres[i].name)) pi = (int)i;
    if (pi < 0)
        return sl_fail(e,
                       "%s: tokenizer.ggml.pre '%.*s' is not a known pre-tokenizer (expected default, gpt2, qwen2, "
                       "qwen35, deepseek-r1-qwen, llama-bpe, llama3 or smaug-bpe)",
                       path, (int)pre.len, pre.s);
    const sl_gguf_kv *toks, *types = NULL, *merges = NULL;
    r = sl_gguf_get_array(g, "tokenizer.ggml.tokens", SL_GGUF_STRING, &toks, e);
    if (r < 0) return -1;
    if (r == 1) return sl_fail(e, "%s: missing metadata key 'tokenizer.ggml.tokens'", path);
    if (toks->n == 0 || toks->n > INT32_MAX / 2)
        return sl_fail(e, "%s: tokenizer.ggml.tokens has %llu entries (expected 1 to %d)", path,
                       (unsigned long long)toks->n, INT32_MAX / 2);
    if (sl_gguf_get_array(g, "tokenizer.ggml.token_type", SL_GGUF_I64, &types, e) < 0 ||
        sl_gguf_get_array(g, "tokenizer.ggml.merges", SL_GGUF_STRING, &merges, e) < 0 ||
        sl_gguf_get_str(g, "tokenizer.chat_template", &tmpl, e) < 0)
        return -1;
    if (types && types->n != toks->n)
        return sl_fail(e, "%s: tokenizer.ggml.token_type has %llu entries, expected %llu (one per token)", path,
                       (unsigned long long)types->n, (unsigned long long)toks->n);
    int n = (int)toks->n, nm = merges ? (int)merges->n : 0;
    if (merges && merges->n > INT32_MAX / 2) return sl_fail(e, "%s: tokenizer.ggml.merges is too long", path);
    const char **ts = malloc(sizeof *ts * (size_t)n), **ms = malloc(sizeof *ms * (size_t)(nm + 1));
    size_t *tl = malloc(sizeof *tl * (size_t)n), *ml = malloc(sizeof *ml * (size_t)(nm + 1));
    int32_t *ty = types ? malloc(sizeof *ty * (size_t)n) : NULL;
    char *ct = tmpl.s ? strndup(tmpl.s, tmpl.len) : NULL;
    sl_tokenizer_vocab v = {path, n,  ts, tl, ty, nm, ms, ml, pres[pi].re, pres[pi].nfc, pres[pi].ignore_merges,
                            -1,   -1, -1, 0,  0,  ct};
    if (!ts || !ms || !tl || !ml || (types && !ty) || (tmpl.s && !ct)) {
        r = sl_fail(e, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        ts[i] = toks->strs[i].s;
        tl[i] = (size_t)toks->strs[i].len;
        if (ty) ty[i] = (int32_t)sl_gguf_array_int(types, (uint64_t)i);
    }
    for (int i = 0; i < nm; i++) {
        ms[i] = merges->strs[i].s;
        ml[i] = (size_t)merges->strs[i].len;
    }
    if (get_id(g, "tokenizer.ggml.bos_token_id", &v.bos_id, e) ||
        get_id(g, "tokenizer.ggml.eos_token_id", &v.eos_id, e) ||
        get_id(g, "tokenizer.ggml.eot_token_id", &v.eot_id, e) ||
        sl_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &v.add_bos, e) < 0 ||
        sl_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &v.add_eos, e) < 0) {
        r = -1;
        goto done;
    }
    r = sl_tokenizer_from_vocab(&v, out, e);
done:
    free(ts);
    free(tl);
    free(ms);
    free(ml);
    free(ty);
    free(ct);
    return r ? -1 : 0;
}

int sl_gguf_tokenizer_load(const char *path, sl_tokenizer **out, sl_err *e) {
    sl_gguf *g;
    if (sl_gguf_open(path, &g, e)) return -1;
    int rc = sl_gguf_tokenizer(g, out, e);
    sl_gguf_close(g);
    return rc;
}
