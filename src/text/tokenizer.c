/* Loading tokenizer.json (+ tokenizer_config.json, generation_config.json) into an immutable sl_tokenizer. */
#include "text/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "formats/gguf.h"
#include "text/tok_gguf.h"

/* GPT-2's pre-tokenizer pattern, used by ByteLevel when use_regex is true. */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static uint32_t pow2_at_least(size_t n) {
    uint32_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

/* ---- string arena and maps ---- */

static int arena_add(sl_tokenizer *t, const char *s, size_t n, uint32_t *off) {
    if (t->strs_len + n + 1 > t->strs_cap) {
        size_t cap = t->strs_cap ? t->strs_cap : 1 << 20;
        while (cap < t->strs_len + n + 1) cap *= 2;
        if (cap > UINT32_MAX) return -1;
        char *p = realloc(t->strs, cap);
        if (!p) return -1;
        t->strs = p;
        t->strs_cap = cap;
    }
    memcpy(t->strs + t->strs_len, s, n);
    t->strs[t->strs_len + n] = 0;
    *off = (uint32_t)t->strs_len;
    t->strs_len += n + 1;
    return 0;
}

int tok_strmap_find(const sl_tokenizer *t, const char *s, size_t n) {
    const tok_strmap *m = &t->vocab;
    uint64_t h = tok_hash(s, n);
    uint32_t h32 = (uint32_t)h, i = (uint32_t)(h >> 32) & m->mask;
    for (;;) {
        uint32_t v = m->ids[i];
        if (!v) return -1;
        if (m->hashes[i] == h32) {
            int32_t id = (int32_t)(v - 1);
            if (t->piece_len[id] == n && !memcmp(t->strs + t->piece_off[id], s, n)) return id;
        }
        i = (i + 1) & m->mask;
    }
}

/* Inserts id under its piece string unless the string is already present (the model's entry wins). */
static void strmap_insert(sl_tokenizer *t, int32_t id) {
    tok_strmap *m = &t->vocab;
    const char *s = t->strs + t->piece_off[id];
    size_t n = t->piece_len[id];
    uint64_t h = tok_hash(s, n);
    uint32_t h32 = (uint32_t)h, i = (uint32_t)(h >> 32) & m->mask;
    for (;;) {
        uint32_t v = m->ids[i];
        if (!v) break;
        if (m->hashes[i] == h32) {
            int32_t o = (int32_t)(v - 1);
            if (t->piece_len[o] == n && !memcmp(t->strs + t->piece_off[o], s, n)) return;
        }
        i = (i + 1) & m->mask;
    }
    m->ids[i] = (uint32_t)id + 1;
    m->hashes[i] = h32;
}

void tok_pair_insert(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t i = (uint32_t)((k * 0x9E3779B97F4A7C15ULL) >> 32) & m->mask;
    while (m->keys[i] != UINT64_MAX) {
        if (m->keys[i] == k) return; /* a repeated merge keeps its first (lowest) rank */
        i = (i + 1) & m->mask;
    }
    m->keys[i] = k;
    m->vals[i] = (uint64_t)rank << 32 | (uint32_t)merged;
}

/* ---- GPT-2 byte <-> printable character table ---- */

static void build_byte_table(sl_tokenizer *t) {
    int n = 0;
    for (int i = 0; i < 324; i++) t->chr_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + n++;
        t->chr_byte[cp] = (int16_t)b;
        if (cp < 0x80) {
            t->byte_chr[b][0] = (char)cp;
            t->byte_chr_len[b] = 1;
        } else {
            t->byte_chr[b][0] = (char)(0xC0 | (cp >> 6));
            t->byte_chr[b][1] = (char)(0x80 | (cp & 0x3F));
            t->byte_chr_len[b] = 2;
        }
    }
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The bytes of a SentencePiece-style token: <0xNN> is the byte NN (with byte_fallback), U+2581 a space. */
static size_t spm_decoded(const sl_tokenizer *t, const char *s, size_t n, char *d) {
    if (t->byte_fallback && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hex_digit(s[3]) >= 0 &&
        hex_digit(s[4]) >= 0) {
        d[0] = (char)(hex_digit(s[3]) << 4 | hex_digit(s[4]));
        return 1;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && !memcmp(s + i, "\xE2\x96\x81", 3)) {
            d[k++] = ' ';
            i += 2;
        } else {
            d[k++] = s[i];
        }
    }
    return k;
}

/* Bytes a token stands for: each character mapped back through the byte table, or the raw string when some
 * character is not a byte stand-in (added tokens such as "<|im_end|>" or ones holding spaces). */
static int build_decoded(sl_tokenizer *t) {
    size_t total = 0;
    for (int id = 0; id < t->n_vocab; id++)
        if (t->piece_off[id] != TOK_NONE) total += t->piece_len[id];
    t->dec = malloc(total + 1);
    size_t nv = (size_t)(unsigned)t->n_vocab + 1;
    t->dec_off = calloc(nv, sizeof *t->dec_off);
    t->dec_len = calloc(nv, sizeof *t->dec_len);
    if (!t->dec || !t->dec_off || !t->dec_len) return -1;
    size_t at = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        t->dec_off[id] = (uint32_t)at;
        if (t->piece_off[id] == TOK_NONE) continue;
        const uint8_t *s = (const uint8_t *)t->strs + t->piece_off[id];
        size_t n = t->piece_len[id], k = at;
        if (t->spm) {
            at += spm_decoded(t, (const char *)s, n, t->dec + at);
            t->dec_len[id] = (uint32_t)(at - t->dec_off[id]);
            continue;
        }
        int ok = 1;
        for (size_t i = 0; i < n && ok;) {
            uint32_t cp;
            if (s[i] < 0x80) {
                cp = s[i++];
            } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < n) {
                cp = (uint32_t)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F);
                i += 2;
            } else {
                ok = 0;
                break;
            }
            if (cp >= 324 || t->chr_byte[cp] < 0)
                ok = 0;
            else
                t->dec[k++] = (char)t->chr_byte[cp];
        }
        if (!ok) {
            memcpy(t->dec + at, s, n);
            k = at + n;
        }
        t->dec_len[id] = (uint32_t)(k - at);
        at = k;
    }
    return 0;
}

/* ---- pieces of tokenizer.json ---- */

static int compile_re(tok_pretok *p, const char *pat, size_t len, uint32_t extra, const char *path, sl_err *e) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | extra | (extra & PCRE2_LITERAL ? 0 : PCRE2_UCP); /* LITERAL refuses UCP */
    p->re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &ec, &eo, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return sl_fail(e, "%s: pre_tokenizer pattern at offset %zu: %s (expected a PCRE-compatible regex)", path,
                       (size_t)eo, (const char *)msg);
    }
    p->jit = pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

static int parse_normalizer(sl_tokenizer *t, json_t *n, const char *path, sl_err *e) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return sl_fail(e, "%s: normalizer has no \"type\" (expected an object with a type)", path);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        size_t i;
        json_t *it;
        if (!json_is_array(list)) return sl_fail(e, "%s: Sequence normalizer without a \"normalizers\" list", path);
        json_array_foreach(list, i, it) if (parse_normalizer(t, it, path, e)) return -1;
        return 0;
    }
    int kind = !strcmp(type, "NFC")         ? NORM_NFC
               : !strcmp(type, "NFD")       ? NORM_NFD
               : !strcmp(type, "NFKC")      ? NORM_NFKC
               : !strcmp(type, "NFKD")      ? NORM_NFKD
               : !strcmp(type, "Lowercase") ? NORM_LOWER
               : !strcmp(type, "Prepend")   ? NORM_PREPEND
               : !strcmp(type, "Replace")   ? NORM_REPLACE
                                            : 0;
    if (!kind)
        return sl_fail(e,
                       "%s: unsupported normalizer type \"%s\" (expected NFC, NFD, NFKC, NFKD, Lowercase, Prepend, "
                       "Replace, Sequence)",
                       path, type);
    if (t->n_norm == (int)(sizeof t->norm / sizeof t->norm[0])) return sl_fail(e, "%s: too many normalizers", path);
    const char *a = NULL, *b = NULL;
    if (kind == NORM_PREPEND) {
        a = json_string_value(json_object_get(n, "prepend"));
        if (!a) return sl_fail(e, "%s: Prepend normalizer without a \"prepend\" string", path);
    } else if (kind == NORM_REPLACE) {
        a = json_string_value(json_object_get(json_object_get(n, "pattern"), "String"));
        b = json_string_value(json_object_get(n, "content"));
        if (!a || !*a || !b)
            return sl_fail(e,
                           "%s: Replace normalizer (expected a non-empty {\"String\": ...} pattern and a \"content\" "
                           "string; regex patterns are not supported)",
                           path);
    }
    if ((a && !(t->norm_arg[t->n_norm][0] = strdup(a))) || (b && !(t->norm_arg[t->n_norm][1] = strdup(b))))
        return sl_fail(e, "out of memory");
    t->norm[t->n_norm++] = kind;
    return 0;
}

static int parse_pretok(sl_tokenizer *t, json_t *n, const char *path, sl_err *e) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return sl_fail(e, "%s: pre_tokenizer has no \"type\"", path);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "pretokenizers");
        size_t i;
        json_t *it;
        if (!json_is_array(list))
            return sl_fail(e, "%s: Sequence pre_tokenizer without a \"pretokenizers\" list", path);
        json_array_foreach(list, i, it) if (parse_pretok(t, it, path, e)) return -1;
        return 0;
    }
    if (t->n_pretok == (int)(sizeof t->pretok / sizeof t->pretok[0]))
        return sl_fail(e, "%s: too many pre_tokenizers", path);
    tok_pretok *p = &t->pretok[t->n_pretok];
    memset(p, 0, sizeof *p);
    if (!strcmp(type, "ByteLevel")) {
        p->kind = PT_BYTELEVEL;
        p->add_prefix_space = json_is_true(json_object_get(n, "add_prefix_space"));
        json_t *ur = json_object_get(n, "use_regex");
        if ((!ur || json_is_true(ur)) && compile_re(p, GPT2_PATTERN, PCRE2_ZERO_TERMINATED, 0, path, e)) return -1;
        p->behavior = SPLIT_ISOLATED;
    } else if (!strcmp(type, "Split")) {
        p->kind = PT_SPLIT;
        json_t *pat = json_object_get(n, "pattern");
        json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        if (json_is_string(rx)) {
            if (compile_re(p, json_string_value(rx), json_string_length(rx), 0, path, e)) return -1;
        } else if (json_is_string(lit)) {
            if (compile_re(p, json_string_value(lit), json_string_length(lit), PCRE2_LITERAL, path, e)) return -1;
        } else {
            return sl_fail(e, "%s: Split pre_tokenizer pattern (expected {\"Regex\": ...} or {\"String\": ...})", path);
        }
        const char *b = json_string_value(json_object_get(n, "behavior"));
        p->behavior = !b                                 ? SPLIT_ISOLATED
                      : !strcmp(b, "Removed")            ? SPLIT_REMOVED
                      : !strcmp(b, "Isolated")           ? SPLIT_ISOLATED
                      : !strcmp(b, "MergedWithPrevious") ? SPLIT_MERGED_PREV
                      : !strcmp(b, "MergedWithNext")     ? SPLIT_MERGED_NEXT
                      : !strcmp(b, "Contiguous")         ? SPLIT_CONTIGUOUS
                                                         : 0;
        if (!p->behavior) {
            t->n_pretok++; /* so the compiled pattern is freed */
            return sl_fail(e, "%s: unsupported Split behavior \"%s\"", path, b);
        }
        p->invert = json_is_true(json_object_get(n, "invert"));
    } else if (!strcmp(type, "Metaspace")) {
        if (tok_spm_parse_metaspace(p, n, path, e)) return -1;
    } else {
        return sl_fail(e, "%s: unsupported pre_tokenizer type \"%s\" (expected Split, ByteLevel, Metaspace, Sequence)",
                       path, type);
    }
    t->n_pretok++;
    return 0;
}

static int push_id(int32_t **v, int *n, int32_t id) {
    int32_t *p = realloc(*v, (size_t)(*n + 1) * sizeof *p);
    if (!p) return -1;
    p[(*n)++] = id;
    *v = p;
    return 0;
}

/* Collects the ids a post-processor puts around a single sequence. */
static int parse_post(sl_tokenizer *t, json_t *n, const char *path, sl_err *e) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return sl_fail(e, "%s: post_processor has no \"type\"", path);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "processors");
        size_t i;
        json_t *it;
        json_array_foreach(list, i, it) if (parse_post(t, it, path, e)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; /* only adjusts offsets */
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(n, "single"), *specials = json_object_get(n, "special_tokens");
        if (!json_is_array(single)) return sl_fail(e, "%s: TemplateProcessing without a \"single\" template", path);
        int after = 0;
        size_t i, j;
        json_t *it, *idv;
        json_array_foreach(single, i, it) {
            if (json_object_get(it, "Sequence")) {
                after = 1;
                continue;
            }
            const char *name = json_string_value(json_object_get(json_object_get(it, "SpecialToken"), "id"));
            json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
            if (!name || !json_is_array(ids))
                return sl_fail(e, "%s: TemplateProcessing item %zu names no known special token", path, i);
            json_array_foreach(ids, j, idv) {
                int r = after ? push_id(&t->suffix_ids, &t->n_suffix, (int32_t)json_integer_value(idv))
                              : push_id(&t->prefix_ids, &t->n_prefix, (int32_t)json_integer_value(idv));
                if (r) return sl_fail(e, "out of memory");
            }
        }
        return 0;
    }
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        json_t *cls = json_array_get(json_object_get(n, "cls"), 1), *sep = json_array_get(json_object_get(n, "sep"), 1);
        if (!json_is_integer(cls) || !json_is_integer(sep)) return sl_fail(e, "%s: %s without cls/sep ids", path, type);
        if (push_id(&t->prefix_ids, &t->n_prefix, (int32_t)json_integer_value(cls)) ||
            push_id(&t->suffix_ids, &t->n_suffix, (int32_t)json_integer_value(sep)))
            return sl_fail(e, "out of memory");
        return 0;
    }
    return sl_fail(e, "%s: unsupported post_processor type \"%s\"", path, type);
}

static int cmp_added(const void *a, const void *b) {
    const tok_added *x = a, *y = b;
    uint8_t cx = (uint8_t)x->content[0], cy = (uint8_t)y->content[0];
    if (cx != cy) return cx < cy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int parse_added(sl_tokenizer *t, json_t *list, const char *path, sl_err *e) {
    size_t i;
    json_t *it;
    t->added = calloc(json_array_size(list) + 1, sizeof *t->added);
    if (!t->added) return sl_fail(e, "out of memory");
    json_array_foreach(list, i, it) {
        json_t *c = json_object_get(it, "content"), *id = json_object_get(it, "id");
        if (!json_is_string(c) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= t->n_vocab)
            return sl_fail(e, "%s: added_tokens[%zu]: expected \"content\" string and \"id\" integer", path, i);
        int32_t tid = (int32_t)json_integer_value(id);
        if (t->piece_off[tid] == TOK_NONE) {
            if (arena_add(t, json_string_value(c), json_string_length(c), &t->piece_off[tid]))
                return sl_fail(e, "out of memory");
            t->piece_len[tid] = (uint32_t)json_string_length(c);
        }
        t->flags[tid] |= TOK_F_ADDED;
        if (json_is_true(json_object_get(it, "special"))) t->flags[tid] |= TOK_F_SPECIAL;
        if (!json_string_length(c)) continue; /* an empty token can never match */
        tok_added *a = &t->added[t->n_added++];
        if (arena_add(t, json_string_value(c), json_string_length(c), &a->off)) return sl_fail(e, "out of memory");
        a->id = tid;
        a->len = (uint32_t)json_string_length(c);
        a->special = json_is_true(json_object_get(it, "special"));
        a->lstrip = json_is_true(json_object_get(it, "lstrip"));
        a->rstrip = json_is_true(json_object_get(it, "rstrip"));
        a->normalized = json_is_true(json_object_get(it, "normalized"));
        a->single_word = json_is_true(json_object_get(it, "single_word"));
        if (a->normalized)
            t->any_added_normalized = 1;
        else
            t->any_added_raw = 1;
    }
    return 0;
}

/* Maximum id used by the vocab and added tokens, or -1 on a malformed entry. */
static int64_t max_id(json_t *vocab, json_t *added) {
    int64_t m = -1;
    const char *k;
    json_t *v, *it;
    size_t i;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX - 1) return -2;
        if (json_integer_value(v) > m) m = json_integer_value(v);
    }
    json_array_foreach(added, i, it) {
        json_int_t id = json_integer_value(json_object_get(it, "id"));
        if (id > m && id < INT32_MAX) m = id;
    }
    return m;
}

static int parse_merges(sl_tokenizer *t, json_t *merges, const char *path, sl_err *e) {
    size_t n = json_array_size(merges), i;
    t->merges.mask = pow2_at_least(n + n / 2) - 1; /* load factor at most 2/3 */
    t->merges.keys = malloc(((size_t)t->merges.mask + 1) * sizeof(uint64_t));
    t->merges.vals = malloc(((size_t)t->merges.mask + 1) * sizeof(uint64_t));
    if (!t->merges.keys || !t->merges.vals) return sl_fail(e, "out of memory");
    memset(t->merges.keys, 0xff, ((size_t)t->merges.mask + 1) * sizeof(uint64_t));
    char buf[1024];
    json_t *it;
    json_array_foreach(merges, i, it) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(it)) {
            const char *s = json_string_value(it), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return sl_fail(e, "%s: merges[%zu] \"%s\": expected \"left right\"", path, i, s);
            a = s, la = (size_t)(sp - s), b = sp + 1, lb = strlen(sp + 1);
        } else if (json_is_array(it) && json_array_size(it) == 2 && json_is_string(json_array_get(it, 0)) &&
                   json_is_string(json_array_get(it, 1))) {
            a = json_string_value(json_array_get(it, 0)), la = json_string_length(json_array_get(it, 0));
            b = json_string_value(json_array_get(it, 1)), lb = json_string_length(json_array_get(it, 1));
        } else {
            return sl_fail(e, "%s: merges[%zu]: expected a \"left right\" string or a [left, right] pair", path, i);
        }
        if (la + lb > sizeof buf) return sl_fail(e, "%s: merges[%zu]: token too long", path, i);
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int ia = tok_strmap_find(t, a, la), ib = tok_strmap_find(t, b, lb), im = tok_strmap_find(t, buf, la + lb);
        if (ia < 0 || ib < 0 || im < 0)
            return sl_fail(e, "%s: merges[%zu] \"%.*s\" + \"%.*s\": token not in the vocab", path, i, (int)la, a,
                           (int)lb, b);
        tok_pair_insert(&t->merges, ia, ib, (uint32_t)i, im);
    }
    return 0;
}

/* A token given as "text" or {"content": "text"}; NULL when absent. */
static char *token_string(json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

static void add_eos(sl_tokenizer *t, json_int_t id) {
    if (id < 0 || id >= t->n_vocab) return;
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id) return;
    push_id(&t->eos_ids, &t->n_eos, (int32_t)id);
}

static int load_configs(sl_tokenizer *t, const char *dir, sl_err *e) {
    json_error_t je;
    char *path = sl_path_join(dir, "tokenizer_config.json");
    if (!path) return sl_fail(e, "out of memory");
    if (sl_file_exists(path)) {
        /* model_max_length can exceed 64 bits (1e30 in Llama 3's), so numbers are read as doubles */
        json_t *c = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
        if (!c || !json_is_object(c)) {
            sl_fail(e, "%s: line %d: %s (expected a JSON object)", path, je.line, c ? "not an object" : je.text);
            json_decref(c);
            free(path);
            return -1;
        }
        t->bos = token_string(json_object_get(c, "bos_token"));
        t->eos = token_string(json_object_get(c, "eos_token"));
        json_t *ct = json_object_get(c, "chat_template");
        if (json_is_string(ct)) {
            t->chat_template = strdup(json_string_value(ct));
        } else if (json_is_array(ct)) {
            size_t i;
            json_t *it;
            json_array_foreach(ct, i, it) {
                const char *name = json_string_value(json_object_get(it, "name"));
                json_t *tpl = json_object_get(it, "template");
                if (name && !strcmp(name, "default") && json_is_string(tpl))
                    t->chat_template = strdup(json_string_value(tpl));
            }
        }
        json_decref(c);
    }
    free(path);
    if (!t->chat_template) {
        path = sl_path_join(dir, "chat_template.jinja");
        if (path && sl_file_exists(path) && sl_read_file(path, &t->chat_template, NULL, e)) {
            free(path);
            return -1;
        }
        free(path);
    }
    path = sl_path_join(dir, "generation_config.json");
    if (path && sl_file_exists(path)) {
        json_t *g = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
        if (!g) {
            sl_fail(e, "%s: line %d: %s (expected a JSON object)", path, je.line, je.text);
            free(path);
            return -1;
        }
        json_t *v = json_object_get(g, "eos_token_id");
        if (json_is_number(v)) add_eos(t, (json_int_t)json_number_value(v));
        size_t i;
        json_t *it;
        if (json_is_array(v))
            json_array_foreach(v, i, it) if (json_is_number(it)) add_eos(t, (json_int_t)json_number_value(it));
        json_decref(g);
    }
    free(path);
    if (t->eos) add_eos(t, sl_tokenizer_token_id(t, t->eos));
    return 0;
}

static int load_json(sl_tokenizer *t, json_t *root, const char *path, sl_err *e) {
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return sl_fail(e, "%s: no \"model\" object (expected a tokenizer.json)", path);
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && !strcmp(type, "Unigram")) {
        if (tok_unigram_vocab(t, model, path, e)) return -1;
    } else if (type && strcmp(type, "BPE")) {
        return sl_fail(e, "%s: model type \"%s\" (expected BPE or Unigram)", path, type);
    }
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges))
        return sl_fail(e, "%s: model has no \"vocab\" object or \"merges\" list (expected a BPE model)", path);
    const char *cp = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *ew = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((cp && *cp) || (ew && *ew))
        return sl_fail(e, "%s: continuing_subword_prefix/end_of_word_suffix are not supported", path);
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));

    json_t *added = json_object_get(root, "added_tokens");
    int64_t m = max_id(vocab, added);
    if (m < -1) return sl_fail(e, "%s: vocab entries must map strings to non-negative integer ids", path);
    t->n_vocab = (int)(m + 1);
    size_t nv = (size_t)t->n_vocab + 1;
    t->piece_off = malloc(nv * sizeof *t->piece_off);
    t->piece_len = calloc(nv, sizeof *t->piece_len);
    t->flags = calloc(nv, 1);
    if (!t->piece_off || !t->piece_len || !t->flags) return sl_fail(e, "out of memory");
    memset(t->piece_off, 0xff, nv * sizeof *t->piece_off);

    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (arena_add(t, k, strlen(k), &t->piece_off[id])) return sl_fail(e, "out of memory");
        t->piece_len[id] = (uint32_t)strlen(k);
        t->flags[id] |= TOK_F_MODEL;
    }
    if (added && !json_is_array(added)) return sl_fail(e, "%s: \"added_tokens\" is not a list", path);
    if (parse_added(t, added, path, e)) return -1;
    for (int i = 0; i < t->n_added; i++) t->added[i].content = t->strs + t->added[i].off; /* arena is final now */
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
    for (int b = 0, i = 0; b <= 256; b++) {
        while (i < t->n_added && (uint8_t)t->added[i].content[0] < b) i++;
        t->added_start[b] = i;
    }

    t->vocab.mask = pow2_at_least((size_t)t->n_vocab * 3 / 2) - 1;
    t->vocab.ids = calloc((size_t)t->vocab.mask + 1, sizeof(uint32_t));
    t->vocab.hashes = calloc((size_t)t->vocab.mask + 1, sizeof(uint32_t));
    if (!t->vocab.ids || !t->vocab.hashes) return sl_fail(e, "out of memory");
    for (int id = 0; id < t->n_vocab; id++)
        if ((t->flags[id] & TOK_F_MODEL)) strmap_insert(t, id);
    for (int id = 0; id < t->n_vocab; id++)
        if (t->piece_off[id] != TOK_NONE && !(t->flags[id] & TOK_F_MODEL)) strmap_insert(t, id);

    build_byte_table(t);
    for (int b = 0; b < 256; b++) t->byte_id[b] = tok_strmap_find(t, t->byte_chr[b], t->byte_chr_len[b]);
    t->unk_id = -1;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk) t->unk_id = tok_strmap_find(t, unk, strlen(unk));
    if (t->unigram && tok_unigram_finish(t, model, path, e)) return -1;

    if (parse_merges(t, merges, path, e)) return -1;
    if (parse_normalizer(t, json_object_get(root, "normalizer"), path, e)) return -1;
    if (parse_pretok(t, json_object_get(root, "pre_tokenizer"), path, e)) return -1;
    if (parse_post(t, json_object_get(root, "post_processor"), path, e)) return -1;
    /* ByteLevel decides: a byte-level vocabulary never falls back to bytes, and Prepend/Replace are then plain
     * normalizers. Without it, byte_fallback, Metaspace or those normalizers mark a SentencePiece-style one. */
    int bytelevel = 0, metaspace = 0, spm = t->byte_fallback || t->unigram;
    for (int i = 0; i < t->n_pretok; i++) {
        bytelevel |= t->pretok[i].kind == PT_BYTELEVEL;
        metaspace |= t->pretok[i].kind == PT_METASPACE;
    }
    for (int i = 0; i < t->n_norm; i++) spm |= t->norm[i] == NORM_PREPEND || t->norm[i] == NORM_REPLACE;
    if (bytelevel && metaspace)
        return sl_fail(e, "%s: both a ByteLevel and a Metaspace pre_tokenizer (expected one of them)", path);
    if (bytelevel && t->unigram)
        return sl_fail(e, "%s: a Unigram model with a ByteLevel pre_tokenizer (expected Metaspace or none)", path);
    spm = !bytelevel && (spm || metaspace);
    if (!bytelevel && !spm)
        return sl_fail(e,
                       "%s: no ByteLevel pre_tokenizer (expected a byte-level BPE with a ByteLevel pre_tokenizer, or "
                       "a SentencePiece-style BPE with byte_fallback, a Metaspace pre_tokenizer or Prepend/Replace "
                       "normalizers)",
                       path);
    if (spm) {
        t->spm = 1;
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->fb_id[b] = tok_strmap_find(t, name, 6);
        }
        tok_spm_decoder(t, json_object_get(root, "decoder"));
    }
    if (build_decoded(t)) return sl_fail(e, "out of memory");
    return 0;
}

/* The tokenizer.json a vocabulary given as arrays amounts to, so both go through the same loader. */
static json_t *vocab_json(const sl_tokenizer_vocab *v) {
    json_t *root = json_object(), *model = json_object(), *vocab = json_object(), *merges = json_array();
    json_t *added = json_array();
    json_object_set_new(root, "model", model);
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", merges);
    json_object_set_new(model, "ignore_merges", json_boolean(v->ignore_merges));
    json_object_set_new(root, "added_tokens", added);
    for (int i = 0; i < v->n_tokens; i++) {
        int type = v->types ? v->types[i] : 1;
        if (type == 3 || type == 4) {
            json_t *a = json_object();
            json_object_set_new(a, "id", json_integer(i));
            json_object_set_new(a, "content", json_stringn_nocheck(v->tokens[i], v->token_lens[i]));
            json_object_set_new(a, "special", json_boolean(type == 3));
            json_array_append_new(added, a);
        } else {
            json_object_setn_new_nocheck(vocab, v->tokens[i], v->token_lens[i], json_integer(i));
        }
    }
    for (int i = 0; i < v->n_merges; i++)
        json_array_append_new(merges, json_stringn_nocheck(v->merges[i], v->merge_lens[i]));
    if (v->spm) {
        /* SentencePiece as llama.cpp runs it: a space before the text and after each special token (the
         * normalizer sees the text between added tokens piece by piece), spaces as U+2581, unknown characters
         * as <0xNN> byte tokens */
        json_object_set_new(model, "byte_fallback", json_true());
        if (v->unk_id >= 0)
            json_object_set_new(model, "unk_token",
                                json_stringn_nocheck(v->tokens[v->unk_id], v->token_lens[v->unk_id]));
        json_t *norms = json_array();
        if (v->add_space_prefix)
            json_array_append_new(norms, json_pack("{s:s, s:s}", "type", "Prepend", "prepend", "\xE2\x96\x81"));
        json_array_append_new(norms, json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", " ",
                                               "content", "\xE2\x96\x81"));
        json_object_set_new(root, "normalizer", json_pack("{s:s, s:o}", "type", "Sequence", "normalizers", norms));
        if (v->add_space_prefix)
            json_object_set_new(
                root, "decoder",
                json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content", " ", "start", 1, "stop", 0));
    } else {
        if (v->nfc) json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
        json_t *bl =
            json_pack("{s:s, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", !v->n_pre_regex);
        json_t *seq = json_array();
        for (int i = 0; i < v->n_pre_regex; i++)
            json_array_append_new(seq, json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex",
                                                 v->pre_regex[i], "behavior", "Isolated", "invert", 0));
        json_array_append_new(seq, bl);
        json_object_set_new(root, "pre_tokenizer", json_pack("{s:s, s:o}", "type", "Sequence", "pretokenizers", seq));
    }
    /* BOS/EOS around each sequence, as a TemplateProcessing post-processor would put them */
    json_t *single = json_array(), *specials = json_object();
    if (v->add_bos && v->bos_id >= 0) {
        json_array_append_new(single, json_pack("{s:{s:s}}", "SpecialToken", "id", "bos"));
        json_object_set_new(specials, "bos", json_pack("{s:[i]}", "ids", v->bos_id));
    }
    json_array_append_new(single, json_pack("{s:{s:s}}", "Sequence", "id", "A"));
    if (v->add_eos && v->eos_id >= 0) {
        json_array_append_new(single, json_pack("{s:{s:s}}", "SpecialToken", "id", "eos"));
        json_object_set_new(specials, "eos", json_pack("{s:[i]}", "ids", v->eos_id));
    }
    json_object_set_new(
        root, "post_processor",
        json_pack("{s:s, s:o, s:o}", "type", "TemplateProcessing", "single", single, "special_tokens", specials));
    return root;
}

int sl_tokenizer_from_vocab(const sl_tokenizer_vocab *v, sl_tokenizer **out, sl_err *e) {
    *out = NULL;
    for (int i = 0; i < v->n_tokens; i++)
        if (v->types && (v->types[i] < 1 || v->types[i] > 6))
            return sl_fail(e, "%s: token %d has type %d (expected 1 to 6)", v->where, i, (int)v->types[i]);
    int32_t ids[4] = {v->bos_id, v->eos_id, v->eot_id, v->unk_id};
    for (int i = 0; i < 4; i++)
        if (ids[i] < -1 || ids[i] >= v->n_tokens)
            return sl_fail(e, "%s: special token id %d is outside the vocabulary of %d", v->where, (int)ids[i],
                           v->n_tokens);
    json_t *root = vocab_json(v);
    if (!root) return sl_fail(e, "out of memory");
    sl_tokenizer *t = calloc(1, sizeof *t);
    int rc = t ? load_json(t, root, v->where, e) : sl_fail(e, "out of memory");
    json_decref(root);
    if (!rc && v->spm) rc = tok_spm_score_merges(t, v->scores, v->types, v->where, e);
    if (!rc) {
        if (v->bos_id >= 0) t->bos = strdup(sl_tokenizer_piece(t, v->bos_id) ? sl_tokenizer_piece(t, v->bos_id) : "");
        if (v->eos_id >= 0) t->eos = strdup(sl_tokenizer_piece(t, v->eos_id) ? sl_tokenizer_piece(t, v->eos_id) : "");
        if (v->eos_id >= 0) add_eos(t, v->eos_id);
        if (v->eot_id >= 0) add_eos(t, v->eot_id);
        if (v->chat_template && !(t->chat_template = strdup(v->chat_template))) rc = sl_fail(e, "out of memory");
    }
    if (rc) {
        sl_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

int sl_tokenizer_load(const char *dir, sl_tokenizer **out, sl_err *e) {
    *out = NULL;
    if (!sl_is_dir(dir) && sl_gguf_is_path(dir)) return sl_gguf_tokenizer_load(dir, out, e);
    if (!sl_is_dir(dir)) return sl_fail(e, "%s: not a directory (expected a model or tokenizer directory)", dir);
    char *path = sl_path_join(dir, "tokenizer.json");
    if (!path) return sl_fail(e, "out of memory");
    if (!sl_file_exists(path)) {
        sl_fail(e, "%s: not found (expected a Hugging Face tokenizer.json)", path);
        free(path);
        return -1;
    }
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root || !json_is_object(root)) {
        sl_fail(e, "%s: line %d: %s (expected a JSON object)", path, je.line, root ? "not an object" : je.text);
        json_decref(root);
        free(path);
        return -1;
    }
    sl_tokenizer *t = calloc(1, sizeof *t);
    int rc = t ? load_json(t, root, path, e) : sl_fail(e, "out of memory");
    json_decref(root);
    free(path);
    if (!rc) rc = load_configs(t, dir, e);
    if (rc) {
        sl_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void sl_tokenizer_free(sl_tokenizer *t) {
    if (!t) return;
    free(t->strs);
    free(t->piece_off);
    free(t->piece_len);
    free(t->dec);
    free(t->dec_off);
    free(t->dec_len);
    free(t->flags);
    free(t->vocab.ids);
    free(t->vocab.hashes);
    free(t->merges.keys);
    free(t->merges.vals);
    free(t->added);
    for (int i = 0; i < t->n_pretok; i++) pcre2_code_free(t->pretok[i].re);
    for (int i = 0; i < 8; i++) free(t->norm_arg[i][0]), free(t->norm_arg[i][1]);
    free(t->prefix_ids);
    free(t->suffix_ids);
    free(t->bos);
    free(t->eos);
    free(t->chat_template);
    free(t->eos_ids);
    free(t->uni_score);
    free(t);
}

/* ---- accessors ---- */

int sl_tokenizer_vocab_size(const sl_tokenizer *t) {
    return t->n_vocab;
}

const char *sl_tokenizer_piece(const sl_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab || t->piece_off[id] == TOK_NONE) return NULL;
    return t->strs + t->piece_off[id];
}

int sl_tokenizer_token_id(const sl_tokenizer *t, const char *piece) {
    return piece ? tok_strmap_find(t, piece, strlen(piece)) : -1;
}

int sl_tokenizer_is_special(const sl_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOK_F_SPECIAL);
}

const char *sl_tokenizer_token_bytes(const sl_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    *len = t->dec_len[id];
    return t->dec + t->dec_off[id];
}

const char *sl_tokenizer_bos(const sl_tokenizer *t) {
    return t->bos;
}
const char *sl_tokenizer_eos(const sl_tokenizer *t) {
    return t->eos;
}

int sl_tokenizer_eos_ids(const sl_tokenizer *t, const int32_t **ids) {
    *ids = t->eos_ids;
    return t->n_eos;
}

const char *sl_tokenizer_chat_template(const sl_tokenizer *t) {
    return t->chat_template;
}
