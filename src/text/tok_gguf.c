#include "text/tok_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tokenizer.ggml.pre names and the pre-tokenizer each stands for: the Split regexes of the model's own
 * tokenizer.json, applied in turn (each splits the pieces the one before left; none: GPT-2's ByteLevel
 * pattern). The patterns are those llama.cpp's llama-vocab.cpp uses for the same names, with the originals
 * from tokenizer.json where llama.cpp rewrote them for a regex engine without Unicode classes. */
static const char *const QWEN2_RE[] = {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                       "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
/* Qwen3.5: Qwen2's pattern with combining marks (\p{M}) kept inside words */
static const char *const QWEN35_RE[] = {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
                                        "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
/* Llama 3, and GLM-4 (digits in threes) */
static const char *const LLAMA3_RE[] = {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
/* o200k (GPT-4o, Llama 4): case runs within words */
static const char *const GPT4O_RE[] = {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{"
                                       "Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                                       "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{"
                                       "Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                                       "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
/* Mistral's tekken: o200k's case runs without the contractions, single digits */
static const char *const TEKKEN_RE[] = {
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
/* Kimi K2: o200k with Han runs first and kept out of the letter classes (tiktoken's [A&&[^B]] written as a
 * lookahead, which PCRE2 lacks) */
static const char *const KIMI_K2_RE[] = {"[\\p{Han}]+|"
                                         "[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])*(?"
                                         ":(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])+"
                                         "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                                         "[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])+(?"
                                         ":(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])*"
                                         "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                                         "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
/* BLOOM, Poro: anything up to a space or punctuation */
static const char *const BLOOM_RE[] = {" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"};
static const char *const DEEPSEEK_LLM_RE[] = {
    "[\r\n]",
    "\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF"
    "\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5"
    "\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-"
    "\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D"
    "\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-"
    "\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113"
    "\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145-\u2149"
    "\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B"
    "\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-"
    "\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0"
    "-\U00010CF2\U000118A0-\U000118DF\U0001E900-\U0001E943]+",
    "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+",
    "\\s+$",
    "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+",
    "\\p{N}+",
};
static const char *const DEEPSEEK_V3_RE[] = {
    "\\p{N}{1,3}",
    "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
    /* one pattern, split over two lines (the parentheses say so to the compiler) */
    ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?["
     "\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
};
static const char *const DEEPSEEK_CODER_RE[] = {
    "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+", "\\p{N}",
};
static const char *const FALCON_RE[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
};
static const char *const STARCODER_RE[] = {
    "\\p{N}",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
};

#define RES(a) a, (int)(sizeof a / sizeof a[0])
static const struct {
    const char *name;
    const char *const *re;
    int n_re, nfc, ignore_merges;
} pres[] = {
    {"default", NULL, 0, 0, 0},
    {"gpt2", NULL, 0, 0, 0},
    {"gpt-2", NULL, 0, 0, 0},
    {"phi-2", NULL, 0, 0, 0},
    {"jais", NULL, 0, 0, 0},
    {"olmo", NULL, 0, 0, 0},
    {"mpt", NULL, 0, 1, 0}, /* GPT-NeoX's tokenizer: NFC first */
    {"qwen2", RES(QWEN2_RE), 1, 0},
    {"deepseek-r1-qwen", RES(QWEN2_RE), 1, 0},
    {"stablelm2", RES(QWEN2_RE), 0, 0},
    {"qwen35", RES(QWEN35_RE), 1, 0},
    {"llama-bpe", RES(LLAMA3_RE), 0, 1},
    {"llama3", RES(LLAMA3_RE), 0, 1},
    {"llama-v3", RES(LLAMA3_RE), 0, 1},
    {"falcon3", RES(LLAMA3_RE), 0, 1},
    {"smaug-bpe", RES(LLAMA3_RE), 0, 1},
    {"dbrx", RES(LLAMA3_RE), 0, 0},
    {"glm4", RES(LLAMA3_RE), 0, 0},
    {"chatglm-bpe", RES(LLAMA3_RE), 0, 0},
    {"deepseek-llm", RES(DEEPSEEK_LLM_RE), 0, 0},
    {"deepseek-coder", RES(DEEPSEEK_CODER_RE), 0, 0},
    {"deepseek-v3", RES(DEEPSEEK_V3_RE), 0, 0},
    {"falcon", RES(FALCON_RE), 0, 0},
    {"starcoder", RES(STARCODER_RE), 0, 0},
    {"refact", RES(STARCODER_RE), 0, 0},
    {"command-r", RES(STARCODER_RE), 0, 0},
    {"smollm", RES(STARCODER_RE), 0, 0},
    {"codeshell", RES(STARCODER_RE), 0, 0},
    {"gpt-4o", RES(GPT4O_RE), 0, 0},
    {"llama4", RES(GPT4O_RE), 0, 0},
    {"tekken", RES(TEKKEN_RE), 0, 1},
    {"kimi-k2", RES(KIMI_K2_RE), 0, 0},
    {"bloom", RES(BLOOM_RE), 0, 0},
    {"poro-chat", RES(BLOOM_RE), 0, 0},
};
#define N_PRES (sizeof pres / sizeof pres[0])

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

/* Looks up tokenizer.ggml.pre; fails naming the value and the names known. */
static int find_pre(const char *path, sl_gguf_str pre, sl_err *e) {
    for (size_t i = 0; i < N_PRES; i++)
        if (str_is(pre, pres[i].name)) return (int)i;
    char known[1024];
    size_t k = 0;
    for (size_t i = 0; i < N_PRES && k + 32 < sizeof known; i++)
        k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "", pres[i].name);
    sl_fail(e, "%s: tokenizer.ggml.pre '%.*s' is not a known pre-tokenizer (expected one of: %s)", path, (int)pre.len,
            pre.s, known);
    return -1;
}

int sl_gguf_tokenizer(const sl_gguf *g, sl_tokenizer **out, sl_err *e) {
    *out = NULL;
    const char *path = g->paths[0];
    sl_gguf_str model, pre = {"default", 7}, tmpl = {NULL, 0};
    int r = sl_gguf_get_str(g, "tokenizer.ggml.model", &model, e);
    if (r < 0) return -1;
    if (r == 1) return sl_fail(e, "%s: missing metadata key 'tokenizer.ggml.model' (the file has no tokenizer)", path);
    int spm = str_is(model, "llama");
    if (!spm && !str_is(model, "gpt2"))
        return sl_fail(e,
                       "%s: tokenizer.ggml.model '%.*s' is not supported (expected gpt2, a byte-level BPE, or llama, a "
                       "SentencePiece BPE)",
                       path, (int)model.len, model.s);
    if (sl_gguf_get_str(g, "tokenizer.ggml.pre", &pre, e) < 0) return -1;
    int pi = spm ? 0 : find_pre(path, pre, e); /* SentencePiece has no pre-tokenizer */
    if (pi < 0) return -1;
    const sl_gguf_kv *toks, *types = NULL, *merges = NULL, *scores = NULL;
    r = sl_gguf_get_array(g, "tokenizer.ggml.tokens", SL_GGUF_STRING, &toks, e);
    if (r < 0) return -1;
    if (r == 1) return sl_fail(e, "%s: missing metadata key 'tokenizer.ggml.tokens'", path);
    if (toks->n == 0 || toks->n > INT32_MAX / 2)
        return sl_fail(e, "%s: tokenizer.ggml.tokens has %llu entries (expected 1 to %d)", path,
                       (unsigned long long)toks->n, INT32_MAX / 2);
    if (sl_gguf_get_array(g, "tokenizer.ggml.token_type", SL_GGUF_I64, &types, e) < 0 ||
        (!spm && sl_gguf_get_array(g, "tokenizer.ggml.merges", SL_GGUF_STRING, &merges, e) < 0) ||
        (spm && sl_gguf_get_array(g, "tokenizer.ggml.scores", SL_GGUF_F32, &scores, e) < 0) ||
        sl_gguf_get_str(g, "tokenizer.chat_template", &tmpl, e) < 0)
        return -1;
    if (types && types->n != toks->n)
        return sl_fail(e, "%s: tokenizer.ggml.token_type has %llu entries, expected %llu (one per token)", path,
                       (unsigned long long)types->n, (unsigned long long)toks->n);
    if (spm && !scores)
        return sl_fail(e, "%s: missing metadata key 'tokenizer.ggml.scores' (expected one score per token)", path);
    if (scores && scores->n != toks->n)
        return sl_fail(e, "%s: tokenizer.ggml.scores has %llu entries, expected %llu (one per token)", path,
                       (unsigned long long)scores->n, (unsigned long long)toks->n);
    int n = (int)toks->n, nm = merges ? (int)merges->n : 0;
    if (merges && merges->n > INT32_MAX / 2) return sl_fail(e, "%s: tokenizer.ggml.merges is too long", path);
    const char **ts = malloc(sizeof *ts * (size_t)n), **ms = malloc(sizeof *ms * (size_t)(nm + 1));
    size_t *tl = malloc(sizeof *tl * (size_t)n), *ml = malloc(sizeof *ml * (size_t)(nm + 1));
    int32_t *ty = types ? malloc(sizeof *ty * (size_t)n) : NULL;
    float *sc = scores ? malloc(sizeof *sc * (size_t)n) : NULL;
    char *ct = tmpl.s ? strndup(tmpl.s, tmpl.len) : NULL;
    sl_tokenizer_vocab v = {.where = path,
                            .n_tokens = n,
                            .tokens = ts,
                            .token_lens = tl,
                            .types = ty,
                            .n_merges = nm,
                            .merges = ms,
                            .merge_lens = ml,
                            .pre_regex = pres[pi].re,
                            .n_pre_regex = pres[pi].n_re,
                            .nfc = pres[pi].nfc,
                            .ignore_merges = pres[pi].ignore_merges,
                            .bos_id = -1,
                            .eos_id = -1,
                            .eot_id = -1,
                            .chat_template = ct,
                            .spm = spm,
                            .scores = sc,
                            .add_space_prefix = spm,
                            .unk_id = -1};
    if (!ts || !ms || !tl || !ml || (types && !ty) || (scores && !sc) || (tmpl.s && !ct)) {
        r = sl_fail(e, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        ts[i] = toks->strs[i].s;
        tl[i] = (size_t)toks->strs[i].len;
        if (ty) ty[i] = (int32_t)sl_gguf_array_int(types, (uint64_t)i);
        if (sc) sc[i] = (float)sl_gguf_array_float(scores, (uint64_t)i);
    }
    for (int i = 0; i < nm; i++) {
        ms[i] = merges->strs[i].s;
        ml[i] = (size_t)merges->strs[i].len;
    }
    if (get_id(g, "tokenizer.ggml.bos_token_id", &v.bos_id, e) ||
        get_id(g, "tokenizer.ggml.eos_token_id", &v.eos_id, e) ||
        get_id(g, "tokenizer.ggml.eot_token_id", &v.eot_id, e) ||
        (spm && get_id(g, "tokenizer.ggml.unknown_token_id", &v.unk_id, e)) ||
        sl_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &v.add_bos, e) < 0 ||
        sl_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &v.add_eos, e) < 0 ||
        sl_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &v.add_space_prefix, e) < 0) {
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
    free(sc);
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
