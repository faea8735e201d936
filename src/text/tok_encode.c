/* Encoding: added tokens, normalizer, pre-tokenizer (PCRE2), byte-level BPE merges, post-processor.
 * All mutable state lives in an enc_ctx for the duration of one call, so a tokenizer can be shared. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tok_internal.h"

#define CACHE_SLOTS (1u << 14)
#define CACHE_MAX_KEY 64 /* longer pre-tokens are rare and not worth keeping */

typedef struct cache_slot {
    uint64_t h;
    uint32_t key_off, ids_off;
    uint16_t key_len, n_ids; /* key_len 0 = empty */
} cache_slot;

typedef struct bpe_sym {
    int32_t id;
    int32_t prev, next;
} bpe_sym;

typedef struct bpe_item {
    uint32_t rank, pos;
    int32_t left, right, merged;
} bpe_item;

typedef struct enc_ctx {
    const sl_tokenizer *t;
    sl_err *e;
    int32_t *ids;
    size_t n, cap;
    char *work; /* text being pre-tokenized; pieces are offsets into it */
    size_t work_len, work_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    size_t jstack_size;
    bpe_sym *syms;
    bpe_item *heap;
    char *mapped;
    size_t scratch_cap; /* capacity of syms, heap (items) and mapped (2 bytes per item) */
    cache_slot *slots;
    uint32_t n_cached;
    uint8_t *ckeys;
    size_t ckeys_len;
    int32_t *cids;
    size_t cids_len, cids_cap;
    int at_origin; /* the text reaching the pre-tokenizer starts the input (Metaspace prepend_scheme "first") */
    struct uni_node {
        double score;
        int32_t start, id; /* start -1: no path ends here yet */
    } * uni;
    size_t uni_cap;
} enc_ctx;

static int oom(enc_ctx *c) {
    return sl_fail(c->e, "tokenizer: out of memory");
}

static int push(enc_ctx *c, int32_t id) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        int32_t *p = realloc(c->ids, cap * sizeof *p);
        if (!p) return oom(c);
        c->ids = p;
        c->cap = cap;
    }
    c->ids[c->n++] = id;
    return 0;
}

/* ---- per-call cache of pre-token -> ids ---- */

static const cache_slot *cache_find(const enc_ctx *c, const uint8_t *s, size_t n, uint64_t h) {
    if (!c->slots) return NULL;
    for (uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_slot *sl = &c->slots[i];
        if (!sl->key_len) return NULL;
        if (sl->h == h && sl->key_len == n && !memcmp(c->ckeys + sl->key_off, s, n)) return sl;
    }
}

static void cache_put(enc_ctx *c, const uint8_t *s, size_t n, uint64_t h, const int32_t *ids, size_t k) {
    if (k > UINT16_MAX) return;
    if (!c->slots) {
        c->slots = calloc(CACHE_SLOTS, sizeof *c->slots);
        c->ckeys = malloc((size_t)CACHE_SLOTS * CACHE_MAX_KEY);
        if (!c->slots || !c->ckeys) return; /* the cache is optional */
    }
    if (c->n_cached >= CACHE_SLOTS / 2) { /* full: start over rather than evict one by one */
        memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
        c->n_cached = 0;
        c->ckeys_len = c->cids_len = 0;
    }
    if (c->cids_len + k > c->cids_cap) {
        size_t cap = c->cids_cap ? c->cids_cap : 1 << 14;
        while (cap < c->cids_len + k) cap *= 2;
        int32_t *p = realloc(c->cids, cap * sizeof *p);
        if (!p) return;
        c->cids = p;
        c->cids_cap = cap;
    }
    uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);
    while (c->slots[i].key_len) i = (i + 1) & (CACHE_SLOTS - 1);
    cache_slot *sl = &c->slots[i];
    sl->h = h;
    sl->key_off = (uint32_t)c->ckeys_len;
    sl->key_len = (uint16_t)n;
    sl->ids_off = (uint32_t)c->cids_len;
    sl->n_ids = (uint16_t)k;
    memcpy(c->ckeys + c->ckeys_len, s, n);
    c->ckeys_len += n;
    if (k) memcpy(c->cids + c->cids_len, ids, k * sizeof *ids); /* a word may map to no ids: cids may be NULL */
    c->cids_len += k;
    c->n_cached++;
}

/* ---- BPE ---- */

static int heap_less(const bpe_item *a, const bpe_item *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(bpe_item *h, size_t *n, bpe_item it) {
    size_t i = (*n)++;
    while (i && heap_less(&it, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = it;
}

static bpe_item heap_pop(bpe_item *h, size_t *n) {
    bpe_item top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const bpe_item *best = &last;
        if (l < *n && heap_less(&h[l], best)) m = l, best = &h[l];
        if (l + 1 < *n && heap_less(&h[l + 1], best)) m = l + 1;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = last;
    return top;
}

static void try_pair(const sl_tokenizer *t, const bpe_sym *s, int32_t pos, bpe_item *h, size_t *nh) {
    int32_t nx = s[pos].next;
    if (nx < 0 || s[pos].id < 0 || s[nx].id < 0) return;
    int64_t v = tok_pair_find(&t->merges, s[pos].id, s[nx].id);
    if (v < 0) return;
    bpe_item it = {(uint32_t)((uint64_t)v >> 32), (uint32_t)pos, s[pos].id, s[nx].id, (int32_t)(uint32_t)v};
    heap_push(h, nh, it);
}

static int reserve_scratch(enc_ctx *c, size_t n) {
    if (n <= c->scratch_cap) return 0;
    size_t cap = c->scratch_cap ? c->scratch_cap : 64;
    while (cap < n) cap *= 2;
    bpe_sym *s = realloc(c->syms, cap * sizeof *s);
    if (s) c->syms = s;
    bpe_item *h = realloc(c->heap, cap * sizeof *h);
    if (h) c->heap = h;
    char *m = realloc(c->mapped, cap * 2);
    if (m) c->mapped = m;
    if (!s || !h || !m) return oom(c);
    c->scratch_cap = cap;
    return 0;
}

static int bpe_merge(enc_ctx *c, size_t n);

/* Merges the bytes of one pre-token by rank (lowest rank first, leftmost on ties) and appends the ids. */
static int bpe_word(enc_ctx *c, const uint8_t *b, size_t n) {
    const sl_tokenizer *t = c->t;
    if (reserve_scratch(c, n)) return -1;
    if (t->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(c->mapped + m, t->byte_chr[b[i]], t->byte_chr_len[b[i]]);
            m += t->byte_chr_len[b[i]];
        }
        int id = tok_strmap_find(t, c->mapped, m);
        if (id >= 0 && (t->flags[id] & TOK_F_MODEL)) return push(c, id);
    }
    for (size_t i = 0; i < n; i++) c->syms[i].id = t->byte_id[b[i]] >= 0 ? t->byte_id[b[i]] : t->unk_id;
    return bpe_merge(c, n);
}

/* Merges syms[0..n) (ids filled in) by rank, lowest first and leftmost on ties, and appends the ids. */
static int bpe_merge(enc_ctx *c, size_t n) {
    const sl_tokenizer *t = c->t;
    bpe_sym *s = c->syms;
    bpe_item *h = c->heap;
    size_t nh = 0;
    if (!n) return 0;
    for (size_t i = 0; i < n; i++) {
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) try_pair(t, s, (int32_t)i, h, &nh);
    while (nh) {
        bpe_item it = heap_pop(h, &nh);
        int32_t p = (int32_t)it.pos, nx = s[p].next;
        if (s[p].id != it.left || nx < 0 || s[nx].id != it.right) continue; /* stale */
        s[p].id = it.merged;
        s[p].next = s[nx].next;
        if (s[nx].next >= 0) s[s[nx].next].prev = p;
        s[nx].id = -2;
        if (s[p].prev >= 0) try_pair(t, s, s[p].prev, h, &nh);
        try_pair(t, s, p, h, &nh);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next)
        if (s[i].id >= 0 && push(c, s[i].id)) return -1;
    return 0;
}

/* A SentencePiece-style pre-token: characters are the starting symbols; one missing from the vocab becomes
 * its <0xNN> byte tokens (byte_fallback) or the unknown token (once for a run of them with fuse_unk). */
static int spm_word(enc_ctx *c, const uint8_t *b, size_t n) {
    const sl_tokenizer *t = c->t;
    if (reserve_scratch(c, n)) return -1;
    if (t->ignore_merges) {
        int id = tok_strmap_find(t, (const char *)b, n);
        if (id >= 0 && (t->flags[id] & TOK_F_MODEL)) return push(c, id);
    }
    size_t ns = 0;
    int prev_unk = 0;
    for (size_t i = 0; i < n;) {
        int r = tok_utf8_step(b + i, n - i);
        size_t k = r > 0 ? (size_t)r : r < 0 ? (size_t)-r : n - i;
        int id = r > 0 ? tok_strmap_find(t, (const char *)b + i, k) : -1;
        if (id >= 0 && !(t->flags[id] & TOK_F_MODEL)) id = -1;
        int bytes = id < 0 && t->byte_fallback;
        for (size_t j = 0; bytes && j < k; j++) bytes = t->fb_id[b[i + j]] >= 0;
        if (id >= 0) {
            c->syms[ns++].id = id;
        } else if (bytes) {
            for (size_t j = 0; j < k; j++) c->syms[ns++].id = t->fb_id[b[i + j]];
        } else if (t->unk_id >= 0 && !(t->fuse_unk && prev_unk)) {
            c->syms[ns++].id = t->unk_id;
        }
        prev_unk = id < 0 && !bytes;
        i += k;
    }
    return bpe_merge(c, ns);
}

/* Appends the byte tokens of s[0..n) when byte_fallback has them all, else the unknown token. */
static int unknown_run(enc_ctx *c, const uint8_t *s, size_t n) {
    const sl_tokenizer *t = c->t;
    int id = tok_strmap_find(t, (const char *)s, n); /* the run may itself be a piece (the unknown token's text) */
    if (id >= 0 && (t->flags[id] & TOK_F_MODEL)) return push(c, id);
    int bytes = t->byte_fallback;
    for (size_t j = 0; bytes && j < n; j++) bytes = t->fb_id[s[j]] >= 0;
    if (!bytes) return push(c, t->unk_id);
    for (size_t j = 0; j < n; j++)
        if (push(c, t->fb_id[s[j]])) return -1;
    return 0;
}

/* Unigram: the split whose pieces' scores sum highest (ties: the first found, scanning starts then lengths
 * in order); a character no piece starts with is unknown, and a run of unknowns is one unknown piece. */
static int unigram_word(enc_ctx *c, const uint8_t *b, size_t n) {
    const sl_tokenizer *t = c->t;
    if (n + 1 > c->uni_cap) {
        struct uni_node *u = realloc(c->uni, (n + 1) * sizeof *u);
        if (!u) return oom(c);
        c->uni = u;
        c->uni_cap = n + 1;
    }
    if (reserve_scratch(c, n)) return -1;
    struct uni_node *u = c->uni;
    for (size_t i = 0; i <= n; i++) u[i] = (struct uni_node){0, -1, -1};
    u[0].start = 0;
    for (size_t i = 0; i < n;) {
        int r = tok_utf8_step(b + i, n - i);
        size_t mb = r > 0 ? (size_t)r : 1, lim = n - i < (size_t)t->uni_max_len ? n - i : (size_t)t->uni_max_len;
        int single = 0;
        for (size_t len = 1; len <= lim; len++) {
            if (i + len < n && (b[i + len] & 0xC0) == 0x80) continue; /* pieces end on character boundaries */
            int id = tok_strmap_find(t, (const char *)b + i, len);
            if (id < 0 || id >= t->n_uni || !(t->flags[id] & TOK_F_MODEL)) continue;
            double cand = u[i].score + t->uni_score[id];
            if (u[i + len].start < 0 || cand > u[i + len].score) u[i + len] = (struct uni_node){cand, (int32_t)i, id};
            single |= len == mb;
        }
        if (!single) {
            if (t->unk_id < 0)
                return sl_fail(c->e, "tokenizer: \"%.*s\" is not in the Unigram vocabulary, which has no unk_id",
                               (int)mb, (const char *)b + i);
            double cand = u[i].score + t->uni_unk_score;
            if (u[i + mb].start < 0 || cand > u[i + mb].score)
                u[i + mb] = (struct uni_node){cand, (int32_t)i, t->unk_id};
        }
        i += mb;
    }
    /* back from the end: syms[k] holds a piece (id, start, end), last piece first */
    size_t k = 0;
    for (size_t end = n; end > 0; end = (size_t)u[end].start) {
        int unk = u[end].id == t->unk_id;
        if (unk && k && c->syms[k - 1].id == t->unk_id) { /* fuse with the unknown run after it */
            c->syms[k - 1].prev = u[end].start;
            continue;
        }
        c->syms[k++] = (bpe_sym){u[end].id, u[end].start, (int32_t)end};
    }
    while (k--) {
        const bpe_sym *p = &c->syms[k];
        int rc = p->id == t->unk_id ? unknown_run(c, b + p->prev, (size_t)(p->next - p->prev)) : push(c, p->id);
        if (rc) return -1;
    }
    return 0;
}

static int word(enc_ctx *c, const uint8_t *s, size_t n) {
    return c->t->unigram ? unigram_word(c, s, n) : c->t->spm ? spm_word(c, s, n) : bpe_word(c, s, n);
}

static int bpe_piece(enc_ctx *c, const uint8_t *s, size_t n) {
    if (!n) return 0;
    if (n == 1 && !c->t->spm) {
        int32_t id = c->t->byte_id[s[0]] >= 0 ? c->t->byte_id[s[0]] : c->t->unk_id;
        return id >= 0 ? push(c, id) : 0;
    }
    if (n > CACHE_MAX_KEY) return word(c, s, n);
    uint64_t h = tok_hash(s, n);
    const cache_slot *sl = cache_find(c, s, n, h);
    if (sl) {
        for (uint32_t i = 0; i < sl->n_ids; i++)
            if (push(c, c->cids[sl->ids_off + i])) return -1;
        return 0;
    }
    size_t start = c->n;
    if (word(c, s, n)) return -1;
    /* no ids yet at all (the word mapped to none) leaves c->ids NULL, where NULL + 0 is undefined */
    cache_put(c, s, n, h, c->n > start ? c->ids + start : NULL, c->n - start);
    return 0;
}

/* ---- pre-tokenizer ---- */

/* Appends n bytes of s (or reserves them when s is NULL) to the work buffer; *off is where they start. */
static int work_append(enc_ctx *c, const char *s, size_t n, size_t *off) {
    *off = c->work_len;
    if (c->work_len + n > c->work_cap) {
        size_t cap = c->work_cap ? c->work_cap : 4096;
        while (cap < c->work_len + n) cap *= 2;
        char *p = realloc(c->work, cap);
        if (!p) return oom(c);
        /* PCRE2's JIT may look at bytes past the subject (SIMD scans): keep them defined */
        memset(p + c->work_cap, 0, cap - c->work_cap);
        c->work = p;
        c->work_cap = cap;
    }
    if (s) memcpy(c->work + c->work_len, s, n);
    *off = c->work_len;
    c->work_len += n;
    return 0;
}

/* Finds the next match of p's pattern in work[off, off+len) at or after at. Returns 1, 0 (none) or -1. */
static int re_next(enc_ctx *c, const tok_pretok *p, size_t off, size_t len, size_t at, size_t *ms, size_t *me) {
    /* Text reaches here only after UTF-8 validation, so PCRE2's own check is skipped (the JIT never does it). */
    PCRE2_SPTR subj = (PCRE2_SPTR)c->work + off;
    int rc;
    for (;;) {
        rc = p->jit ? pcre2_jit_match(p->re, subj, len, at, 0, c->md, c->mctx)
                    : pcre2_match(p->re, subj, len, at, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || c->jstack_size >= (256u << 20)) break;
        /* Long runs can outgrow the default 32 KiB JIT stack: retry with a larger one. */
        size_t size = c->jstack_size ? c->jstack_size * 8 : 1u << 20;
        pcre2_jit_stack *js = pcre2_jit_stack_create(32 * 1024, size, NULL);
        if (!js) return oom(c);
        if (!c->mctx && !(c->mctx = pcre2_match_context_create(NULL))) {
            pcre2_jit_stack_free(js);
            return oom(c);
        }
        pcre2_jit_stack_free(c->jstack);
        c->jstack = js;
        c->jstack_size = size;
        pcre2_jit_stack_assign(c->mctx, NULL, js);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return sl_fail(c->e, "tokenizer: pre-tokenizer regex failed: %s", (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

static int run_pretok(enc_ctx *c, int step, size_t off, size_t len);

typedef struct pending {
    size_t s, e;
    int have, kind; /* kind: 0 plain text, 1 match, 2 already merged */
} pending;

static int flush_pending(enc_ctx *c, int step, pending *pd) {
    if (!pd->have) return 0;
    pd->have = 0;
    return run_pretok(c, step + 1, pd->s, pd->e - pd->s);
}

/* Feeds one span (a match of the pattern or the text between matches) through the split behavior. */
static int split_feed(enc_ctx *c, int step, pending *pd, size_t s, size_t e, int is_match) {
    const tok_pretok *p = &c->t->pretok[step];
    switch (p->behavior) {
    case SPLIT_REMOVED: return is_match ? 0 : run_pretok(c, step + 1, s, e - s);
    case SPLIT_ISOLATED: return run_pretok(c, step + 1, s, e - s);
    case SPLIT_MERGED_PREV:
        if (is_match && pd->have && pd->kind == 0) {
            pd->e = e, pd->kind = 2;
            return 0;
        }
        break;
    case SPLIT_MERGED_NEXT:
        if (!is_match && pd->have && pd->kind == 1) {
            pd->e = e, pd->kind = 2;
            return 0;
        }
        break;
    case SPLIT_CONTIGUOUS:
        if (is_match && pd->have && pd->kind == 1) {
            pd->e = e;
            return 0;
        }
        break;
    }
    if (flush_pending(c, step, pd)) return -1;
    *pd = (pending){s, e, 1, is_match};
    return 0;
}

static int split_step(enc_ctx *c, int step, size_t off, size_t len) {
    const tok_pretok *p = &c->t->pretok[step];
    pending pd = {0};
    size_t at = 0, prev = 0;
    for (;;) {
        size_t ms = len, me = len;
        int found = 0;
        if (at < len && (found = re_next(c, p, off, len, at, &ms, &me)) < 0) return -1;
        if (!found) ms = me = len;
        if (found && me == ms) { /* empty match: step over one character */
            at = ms + 1;
            while (at < len && ((uint8_t)c->work[off + at] & 0xC0) == 0x80) at++;
            continue;
        }
        if (ms > prev && split_feed(c, step, &pd, off + prev, off + ms, p->invert)) return -1;
        if (!found) break;
        if (split_feed(c, step, &pd, off + ms, off + me, !p->invert)) return -1;
        prev = at = me;
    }
    return flush_pending(c, step, &pd);
}

static int is_metaspace(const char *s) {
    return !memcmp(s, "\xE2\x96\x81", 3);
}

/* Metaspace: spaces become U+2581, one goes in front (always, or only at the start of the input), and with
 * split each U+2581 starts a new pre-token. */
static int metaspace_step(enc_ctx *c, int step, size_t off, size_t len) {
    const tok_pretok *p = &c->t->pretok[step];
    size_t spaces = 0, o = 0;
    for (size_t i = 0; i < len; i++) spaces += c->work[off + i] == ' ';
    int pre = (p->prepend == MS_ALWAYS || (p->prepend == MS_FIRST && c->at_origin)) && c->work[off] != ' ' &&
              !(len >= 3 && is_metaspace(c->work + off));
    c->at_origin = 0;
    size_t n = len + 2 * spaces + (pre ? 3 : 0);
    if (work_append(c, NULL, n, &o)) return -1;
    char *d = c->work + o; /* the append may have moved work: the source is read only now */
    if (pre) memcpy(d, "\xE2\x96\x81", 3), d += 3;
    for (size_t i = 0; i < len; i++) {
        char ch = c->work[off + i];
        if (ch == ' ')
            memcpy(d, "\xE2\x96\x81", 3), d += 3;
        else
            *d++ = ch;
    }
    if (!p->split) return run_pretok(c, step + 1, o, n);
    size_t start = 0;
    for (size_t i = 3; i + 3 <= n; i++) {
        if (!is_metaspace(c->work + o + i)) continue;
        if (run_pretok(c, step + 1, o + start, i - start)) return -1;
        start = i;
        i += 2;
    }
    return run_pretok(c, step + 1, o + start, n - start);
}

static int run_pretok(enc_ctx *c, int step, size_t off, size_t len) {
    if (!len) return 0;
    if (step == c->t->n_pretok) return bpe_piece(c, (const uint8_t *)c->work + off, len);
    const tok_pretok *p = &c->t->pretok[step];
    if (p->kind == PT_BYTELEVEL && p->add_prefix_space && c->work[off] != ' ') {
        size_t o = 0;
        if (work_append(c, " ", 1, &o) || work_append(c, NULL, len, &o)) return -1;
        memcpy(c->work + o, c->work + off, len); /* copied only now: the appends may have moved work */
        off = o - 1, len++;
    }
    if (p->kind == PT_METASPACE) return metaspace_step(c, step, off, len);
    if (!p->re) return run_pretok(c, step + 1, off, len);
    return split_step(c, step, off, len);
}

static int pretok_segment(enc_ctx *c, const char *s, size_t n) {
    size_t off = 0;
    c->work_len = 0;
    if (!n) return 0;
    if (work_append(c, s, n, &off)) return -1;
    int rc = run_pretok(c, 0, off, n);
    c->at_origin = 0;
    return rc;
}

/* ---- added tokens ---- */

static int is_word_cp(int32_t cp) {
    utf8proc_category_t k = utf8proc_category(cp);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_NO) || k == UTF8PROC_CATEGORY_PC;
}

static int word_before(const uint8_t *s, size_t pos) {
    if (!pos) return 0;
    size_t k = pos - 1;
    while (k && (s[k] & 0xC0) == 0x80) k--;
    utf8proc_int32_t cp;
    return utf8proc_iterate(s + k, (utf8proc_ssize_t)(pos - k), &cp) > 0 && is_word_cp(cp);
}

static int word_after(const uint8_t *s, size_t pos, size_t n) {
    utf8proc_int32_t cp;
    return pos < n && utf8proc_iterate(s + pos, (utf8proc_ssize_t)(n - pos), &cp) > 0 && is_word_cp(cp);
}

static int is_space(uint8_t ch) {
    return ch == ' ' || (ch >= '\t' && ch <= '\r');
}

static int normalize_run(enc_ctx *c, const char *s, size_t n);

/* Splits s on added tokens whose `normalized` flag equals pass; the text between them goes on to the
 * normalizer (pass 0) or the pre-tokenizer (pass 1). Leftmost match wins, then the longest. */
static int split_added(enc_ctx *c, const char *text, size_t n, int pass) {
    const sl_tokenizer *t = c->t;
    const uint8_t *s = (const uint8_t *)text;
    size_t seg = 0;
    for (size_t pos = 0; pos < n; pos++) {
        const tok_added *hit = NULL;
        for (int i = t->added_start[s[pos]]; i < t->added_start[s[pos] + 1]; i++) {
            const tok_added *a = &t->added[i];
            if (a->normalized != pass || a->len > n - pos || memcmp(a->content, s + pos, a->len)) continue;
            if (a->single_word && (word_before(s, pos) || word_after(s, pos + a->len, n))) continue;
            hit = a;
            break;
        }
        if (!hit) continue;
        size_t ms = pos, me = pos + hit->len;
        if (hit->lstrip)
            while (ms > seg && is_space(s[ms - 1])) ms--;
        if (hit->rstrip)
            while (me < n && is_space(s[me])) me++;
        int rc = pass ? pretok_segment(c, text + seg, ms - seg) : normalize_run(c, text + seg, ms - seg);
        if (rc || push(c, hit->id)) return -1;
        c->at_origin = 0;
        seg = me;
        pos = me - 1;
    }
    return pass ? pretok_segment(c, text + seg, n - seg) : normalize_run(c, text + seg, n - seg);
}

/* ---- normalizer ---- */

static int lowercase(const uint8_t *s, size_t n, uint8_t **out, size_t *len) {
    uint8_t *d = malloc(n * 4 + 4);
    if (!d) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t r = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (r <= 0) { /* not reached: runs are validated first */
            d[k++] = s[i++];
            continue;
        }
        k += (size_t)utf8proc_encode_char(utf8proc_tolower(cp), d + k);
        i += (size_t)r;
    }
    *out = d;
    *len = k;
    return 0;
}

/* Prepend (args[0] before non-empty text) or Replace (every args[0] by args[1]) into a new buffer. */
static int replace(const uint8_t *s, size_t n, int kind, char *const args[2], uint8_t **out, size_t *len) {
    size_t la = strlen(args[0]), lb = kind == NORM_REPLACE ? strlen(args[1]) : 0, k = 0, hits = 0;
    if (kind == NORM_REPLACE)
        for (size_t i = 0; i + la <= n; i++)
            if (!memcmp(s + i, args[0], la)) hits++, i += la - 1;
    uint8_t *d = malloc(n + la + hits * lb + 1);
    if (!d) return -1;
    if (kind == NORM_PREPEND) {
        if (n) memcpy(d, args[0], la), k = la;
        memcpy(d + k, s, n);
        k += n;
    } else {
        for (size_t i = 0; i < n;) {
            if (i + la <= n && !memcmp(s + i, args[0], la)) {
                memcpy(d + k, args[1], lb);
                k += lb, i += la;
            } else {
                d[k++] = s[i++];
            }
        }
    }
    *out = d;
    *len = k;
    return 0;
}

/* Normalizes a valid UTF-8 run (ascii: it has no byte >= 0x80) and passes it on. */
static int normalize_valid(enc_ctx *c, const char *s, size_t n, int ascii) {
    const sl_tokenizer *t = c->t;
    int need = 0;
    for (int i = 0; i < t->n_norm; i++) need |= t->norm[i] >= NORM_LOWER || !ascii;
    if (!need) /* every Unicode normal form leaves ASCII alone */
        return t->any_added_normalized ? split_added(c, s, n, 1) : pretok_segment(c, s, n);
    uint8_t *cur = NULL;
    size_t cur_len = n;
    for (int i = 0; i < t->n_norm; i++) {
        const uint8_t *src = cur ? cur : (const uint8_t *)s;
        uint8_t *dst = NULL;
        size_t dlen = 0;
        if (t->norm[i] == NORM_LOWER) {
            if (lowercase(src, cur_len, &dst, &dlen)) dst = NULL;
        } else if (t->norm[i] == NORM_PREPEND || t->norm[i] == NORM_REPLACE) {
            if (replace(src, cur_len, t->norm[i], t->norm_arg[i], &dst, &dlen)) dst = NULL;
        } else {
            static const utf8proc_option_t opts[] = {
                [NORM_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
                [NORM_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
                [NORM_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                [NORM_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
            };
            utf8proc_ssize_t r = utf8proc_map(src, (utf8proc_ssize_t)cur_len, &dst, opts[t->norm[i]]);
            if (r < 0) {
                free(cur);
                return sl_fail(c->e, "tokenizer: normalizer: %s", utf8proc_errmsg(r));
            }
            dlen = (size_t)r;
        }
        free(cur);
        if (!dst) return oom(c);
        cur = dst;
        cur_len = dlen;
    }
    int rc = t->any_added_normalized ? split_added(c, (const char *)cur, cur_len, 1)
                                     : pretok_segment(c, (const char *)cur, cur_len);
    free(cur);
    return rc;
}

/* Splits text into valid UTF-8 runs (normalized and pre-tokenized) and invalid bytes (encoded as bytes). */
static int normalize_run(enc_ctx *c, const char *text, size_t n) {
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0;
    while (i < n) {
        size_t start = i;
        int all_ascii = 1;
        for (;;) {
            while (i < n && s[i] < 0x80) i++;
            if (i == n) break;
            int r = tok_utf8_step(s + i, n - i);
            if (r <= 0) break;
            all_ascii = 0;
            i += (size_t)r;
        }
        if (i > start && normalize_valid(c, text + start, i - start, all_ascii)) return -1;
        if (i < n) {
            int r = tok_utf8_step(s + i, n - i);
            size_t k = r < 0 ? (size_t)-r : n - i;
            if ((c->t->spm ? spm_word(c, s + i, k) : bpe_piece(c, s + i, k))) return -1;
            c->at_origin = 0;
            i += k;
        }
    }
    return 0;
}

int sl_tokenizer_encode(const sl_tokenizer *t, const char *text, size_t len, int add_specials, int32_t **ids,
                        int *n_ids, sl_err *e) {
    enc_ctx c = {.t = t, .e = e, .at_origin = 1};
    int rc = 0;
    *ids = NULL;
    *n_ids = 0;
    if (!(c.md = pcre2_match_data_create(16, NULL))) return sl_fail(e, "tokenizer: out of memory");
    for (int i = 0; add_specials && i < t->n_prefix && !rc; i++) rc = push(&c, t->prefix_ids[i]);
    if (!rc) rc = t->any_added_raw ? split_added(&c, text, len, 0) : normalize_run(&c, text, len);
    for (int i = 0; add_specials && i < t->n_suffix && !rc; i++) rc = push(&c, t->suffix_ids[i]);
    if (!rc && c.n > INT32_MAX) rc = sl_fail(e, "tokenizer: text too long");
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mctx);
    pcre2_jit_stack_free(c.jstack);
    free(c.work);
    free(c.syms);
    free(c.heap);
    free(c.mapped);
    free(c.slots);
    free(c.ckeys);
    free(c.cids);
    free(c.uni);
    if (rc) {
        free(c.ids);
        return -1;
    }
    if (!c.ids) c.ids = malloc(sizeof *c.ids); /* a valid pointer even for no ids */
    *ids = c.ids;
    *n_ids = (int)c.n;
    return 0;
}
