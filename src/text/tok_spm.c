/* SentencePiece-style tokenizers: the Metaspace pre-tokenizer and decoders of tokenizer.json, and merges
 * derived from the scores of a SentencePiece vocabulary (GGUF "llama" model). */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

static const char METASPACE[] = "\xE2\x96\x81"; /* U+2581, SentencePiece's stand-in for a space */

int tok_spm_parse_metaspace(tok_pretok *p, json_t *n, const char *path, sl_err *e) {
    const char *rep = json_string_value(json_object_get(n, "replacement"));
    if (rep && strcmp(rep, METASPACE))
        return sl_fail(e, "%s: Metaspace replacement \"%s\" (expected \"\xE2\x96\x81\", U+2581)", path, rep);
    p->kind = PT_METASPACE;
    const char *scheme = json_string_value(json_object_get(n, "prepend_scheme"));
    json_t *aps = json_object_get(n, "add_prefix_space"); /* the form before prepend_scheme */
    if (!scheme)
        p->prepend = aps && !json_is_true(aps) ? MS_NEVER : MS_ALWAYS;
    else if (!strcmp(scheme, "first"))
        p->prepend = MS_FIRST;
    else if (!strcmp(scheme, "always"))
        p->prepend = MS_ALWAYS;
    else if (!strcmp(scheme, "never"))
        p->prepend = MS_NEVER;
    else
        return sl_fail(e, "%s: Metaspace prepend_scheme \"%s\" (expected first, always or never)", path, scheme);
    json_t *split = json_object_get(n, "split");
    p->split = !split || json_is_true(split);
    return 0;
}

void tok_spm_decoder(sl_tokenizer *t, json_t *dec) {
    const char *type = json_string_value(json_object_get(dec, "type"));
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *it;
        json_array_foreach(json_object_get(dec, "decoders"), i, it) tok_spm_decoder(t, it);
    } else if (!strcmp(type, "Strip")) {
        const char *c = json_string_value(json_object_get(dec, "content"));
        if (c && !strcmp(c, " ") && json_integer_value(json_object_get(dec, "start")) > 0) t->strip_lead = 1;
    } else if (!strcmp(type, "Metaspace")) {
        tok_pretok p = {0};
        sl_err ignored;
        if (!tok_spm_parse_metaspace(&p, dec, "", &ignored) && p.prepend != MS_NEVER) t->strip_lead = 1;
    }
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

/* Dense rank of score s in the distinct scores sorted high to low, so equal scores merge leftmost first. */
static uint32_t score_rank(const float *sorted, size_t n, float s) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (sorted[mid] > s)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (uint32_t)lo;
}

int tok_spm_score_merges(sl_tokenizer *t, const float *scores, const int32_t *types, const char *where, sl_err *e) {
    if (!scores)
        return sl_fail(e, "%s: missing metadata key 'tokenizer.ggml.scores' (a SentencePiece vocabulary)", where);
    int n = t->n_vocab;
    float *sorted = malloc(sizeof *sorted * (size_t)(n ? n : 1));
    if (!sorted) return sl_fail(e, "out of memory");
    size_t ns = 0, pairs = 0;
    for (int id = 0; id < n; id++) {
        if (scores[id] != scores[id]) {
            free(sorted);
            return sl_fail(e, "%s: tokenizer.ggml.scores[%d] is NaN (expected a number)", where, id);
        }
        sorted[ns++] = scores[id];
        pairs += t->piece_len[id];
    }
    qsort(sorted, ns, sizeof *sorted, cmp_desc);
    size_t nd = 0;
    for (size_t i = 0; i < ns; i++)
        if (!nd || sorted[i] != sorted[nd - 1]) sorted[nd++] = sorted[i];
    free(t->merges.keys);
    free(t->merges.vals);
    uint32_t cap = 16;
    while (cap < pairs + pairs / 2) cap <<= 1;
    t->merges.mask = cap - 1;
    t->merges.keys = malloc((size_t)cap * sizeof(uint64_t));
    t->merges.vals = malloc((size_t)cap * sizeof(uint64_t));
    if (!t->merges.keys || !t->merges.vals) {
        free(sorted);
        return sl_fail(e, "out of memory");
    }
    memset(t->merges.keys, 0xff, (size_t)cap * sizeof(uint64_t));
    /* Only normal tokens are merge results: control, byte and unused tokens never form from text. */
    for (int id = 0; id < n; id++) {
        if ((types && types[id] != 1) || !(t->flags[id] & TOK_F_MODEL) || t->piece_off[id] == TOK_NONE) continue;
        const char *s = t->strs + t->piece_off[id];
        size_t len = t->piece_len[id];
        uint32_t rank = score_rank(sorted, nd, scores[id]);
        for (size_t k = 1; k < len; k++) {
            if (((uint8_t)s[k] & 0xC0) == 0x80) continue; /* splits fall between characters */
            int a = tok_strmap_find(t, s, k), b = tok_strmap_find(t, s + k, len - k);
            if (a >= 0 && b >= 0) tok_pair_insert(&t->merges, a, b, rank, id);
        }
    }
    free(sorted);
    return 0;
}

int tok_unigram_vocab(sl_tokenizer *t, json_t *model, const char *path, sl_err *e) {
    json_t *list = json_object_get(model, "vocab"), *it;
    if (!json_is_array(list))
        return sl_fail(e, "%s: Unigram model has no \"vocab\" list (expected [piece, score] pairs)", path);
    size_t n = json_array_size(list), i;
    if (n > INT32_MAX / 2) return sl_fail(e, "%s: Unigram vocab too large", path);
    json_t *obj = json_object();
    t->uni_score = malloc(sizeof *t->uni_score * (n ? n : 1));
    if (!obj || !t->uni_score) {
        json_decref(obj);
        return sl_fail(e, "out of memory");
    }
    json_array_foreach(list, i, it) {
        json_t *p = json_array_get(it, 0), *s = json_array_get(it, 1);
        if (json_array_size(it) != 2 || !json_is_string(p) || !json_is_number(s)) {
            json_decref(obj);
            return sl_fail(e, "%s: model vocab[%zu]: expected a [piece, score] pair", path, i);
        }
        if (!json_object_get(obj, json_string_value(p))) /* a repeated piece keeps its first id */
            json_object_set_new(obj, json_string_value(p), json_integer((json_int_t)i));
        t->uni_score[i] = json_number_value(s);
    }
    json_object_set_new(model, "vocab", obj);
    json_object_set_new(model, "merges", json_array());
    t->unigram = 1;
    t->n_uni = (int)n;
    return 0;
}

int tok_unigram_finish(sl_tokenizer *t, json_t *model, const char *path, sl_err *e) {
    json_t *unk = json_object_get(model, "unk_id");
    t->unk_id = -1;
    if (unk && !json_is_null(unk)) {
        if (!json_is_integer(unk) || json_integer_value(unk) < 0 || json_integer_value(unk) >= t->n_uni)
            return sl_fail(e, "%s: Unigram unk_id (expected an index into the %d-entry vocab, or null)", path,
                           t->n_uni);
        t->unk_id = (int32_t)json_integer_value(unk);
    }
    double lo = 0;
    for (int i = 0; i < t->n_uni; i++)
        if (i == 0 || t->uni_score[i] < lo) lo = t->uni_score[i];
    t->uni_unk_score = lo - 10.0;
    for (int id = 0; id < t->n_uni && id < t->n_vocab; id++)
        if ((t->flags[id] & TOK_F_MODEL) && (int)t->piece_len[id] > t->uni_max_len)
            t->uni_max_len = (int)t->piece_len[id];
    return 0;
}
