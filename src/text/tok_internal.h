/* Internals shared by the tokenizer's source files (tokenizer.c loads, tok_encode.c encodes, detok.c decodes). */
#ifndef SLUICE_TEXT_TOK_INTERNAL_H
#define SLUICE_TEXT_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

#define TOK_NONE UINT32_MAX

/* Per-id flags. */
enum { TOK_F_SPECIAL = 1, TOK_F_ADDED = 2, TOK_F_MODEL = 4 };

typedef struct tok_added {
    const char *content; /* in the tokenizer's string arena (at off) */
    uint32_t off, len;
    int32_t id;
    uint8_t special, lstrip, rstrip, normalized, single_word;
} tok_added;

enum { NORM_NFC = 1, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWER, NORM_PREPEND, NORM_REPLACE };

enum { PT_SPLIT = 1, PT_BYTELEVEL, PT_METASPACE };
enum { MS_NEVER = 0, MS_FIRST, MS_ALWAYS }; /* Metaspace prepend_scheme */
enum { SPLIT_REMOVED = 1, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };

typedef struct tok_pretok {
    int kind;
    pcre2_code *re; /* the Split pattern, or GPT-2's pattern for ByteLevel with use_regex */
    int jit;        /* re was JIT compiled */
    int behavior, invert;
    int add_prefix_space;
    int prepend, split; /* Metaspace: MS_*, and whether to split before each U+2581 */
} tok_pretok;

/* Open-addressing map from a vocab string to its id. Slots hold id+1 (0 = empty) and 32 bits of the hash. */
typedef struct tok_strmap {
    uint32_t *ids, *hashes;
    uint32_t mask;
} tok_strmap;

/* Open-addressing map from (left id, right id) to (rank, merged id). */
typedef struct tok_pairmap {
    uint64_t *keys; /* UINT64_MAX = empty */
    uint64_t *vals; /* rank << 32 | merged id */
    uint32_t mask;
} tok_pairmap;

struct sl_tokenizer {
    int n_vocab; /* highest id + 1 */
    char *strs;  /* arena of NUL-terminated vocab strings */
    size_t strs_len, strs_cap;
    uint32_t *piece_off; /* per id: offset into strs or TOK_NONE */
    uint32_t *piece_len;
    char *dec; /* arena of decoded bytes per id */
    uint32_t *dec_off, *dec_len;
    uint8_t *flags; /* TOK_F_* per id */

    tok_strmap vocab;
    tok_pairmap merges;
    int ignore_merges;
    int32_t unk_id;
    /* SentencePiece-style (no ByteLevel pre-tokenizer): BPE over characters, U+2581 for spaces, characters
     * missing from the vocab spelled as <0xNN> byte tokens (byte_fallback) or as unk_id (fused when fuse_unk). */
    int spm, byte_fallback, fuse_unk;
    int32_t fb_id[256]; /* id of <0xNN>, -1 if missing */
    int strip_lead;     /* the decoder drops one leading space of the text (Strip, Metaspace) */
    /* Unigram model: the best-scoring split (Viterbi) instead of merges; unknown characters score the lowest
     * score minus 10, as Hugging Face's Unigram does */
    int unigram, n_uni, uni_max_len;
    double *uni_score, uni_unk_score;

    int32_t byte_id[256];  /* id of the single-character token for each byte, -1 if missing */
    char byte_chr[256][3]; /* GPT-2 byte -> UTF-8 of its printable stand-in */
    uint8_t byte_chr_len[256];
    int16_t chr_byte[324]; /* stand-in code point -> byte, -1 if not a stand-in */

    tok_added *added; /* sorted by first byte, then longest first */
    int n_added;
    int added_start[257]; /* added[added_start[b] .. added_start[b+1]) start with byte b */
    int any_added_normalized, any_added_raw;

    int norm[8], n_norm;
    char *norm_arg[8][2]; /* Prepend: the prefix; Replace: the pattern and its replacement */
    tok_pretok pretok[8];
    int n_pretok;

    int32_t *prefix_ids, *suffix_ids; /* post-processor, single sequence */
    int n_prefix, n_suffix;

    char *bos, *eos, *chat_template;
    int32_t *eos_ids;
    int n_eos;
};

static inline uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

int tok_strmap_find(const sl_tokenizer *t, const char *s, size_t n);
void tok_pair_insert(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged);
/* Reads decoder, Metaspace and byte_fallback settings of a SentencePiece-style tokenizer.json (tok_spm.c). */
int tok_spm_parse_metaspace(tok_pretok *p, json_t *n, const char *path, sl_err *e);
void tok_spm_decoder(sl_tokenizer *t, json_t *dec);
/* Turns a Unigram model's [piece, score] list into a vocab object (in model, so the BPE loader reads it) and
 * keeps the scores. */
int tok_unigram_vocab(sl_tokenizer *t, json_t *model, const char *path, sl_err *e);
/* After the vocab is loaded: unk_id, the lowest score and the longest piece. */
int tok_unigram_finish(sl_tokenizer *t, json_t *model, const char *path, sl_err *e);
/* Merges for a SentencePiece vocabulary given by scores (llama.cpp's GGUF): every split of a token into two
 * vocab tokens merges into it, higher scores first, as SentencePiece's BPE does. */
int tok_spm_score_merges(sl_tokenizer *t, const float *scores, const int32_t *types, const char *where, sl_err *e);
static inline int64_t tok_pair_find(const tok_pairmap *m, int32_t a, int32_t b) {
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t i = (uint32_t)((k * 0x9E3779B97F4A7C15ULL) >> 32) & m->mask;
    for (;;) {
        if (m->keys[i] == k) return (int64_t)m->vals[i];
        if (m->keys[i] == UINT64_MAX) return -1;
        i = (i + 1) & m->mask;
    }
}

/* UTF-8 step at s[0..n): >0 length of a valid character; -k: k bytes form an invalid (maximal) subpart that
 * decodes to one U+FFFD; 0: s is a valid but truncated start of a character. */
int tok_utf8_step(const uint8_t *s, size_t n);

#endif
