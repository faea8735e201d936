/* BPE tokenizer loaded from a Hugging Face tokenizer.json: byte-level (GPT-2, Llama 3, Qwen 2/3 style) or
 * SentencePiece-style (Llama 2, Mistral: U+2581 for spaces, byte fallback).
 * A loaded tokenizer is immutable: every function takes it const and may be called from several threads. */
#ifndef SLUICE_TEXT_TOKENIZER_H
#define SLUICE_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef struct sl_tokenizer sl_tokenizer;

/* dir holds tokenizer.json, and optionally tokenizer_config.json, generation_config.json, chat_template.jinja;
 * or path is a .gguf file, read through tokenizer.ggml.* metadata (text/tok_gguf.h). */
int sl_tokenizer_load(const char *dir, sl_tokenizer **out, sl_err *e);
void sl_tokenizer_free(sl_tokenizer *t);

/* A BPE vocabulary given as arrays (as GGUF metadata holds it). Strings need not be
 * NUL-terminated. */
typedef struct sl_tokenizer_vocab {
    const char *where; /* names the source in errors */
    int n_tokens;
    const char *const *tokens;
    const size_t *token_lens;
    /* per token: 1 normal, 2 unknown, 3 control (special), 4 user-defined (matched in text, not special),
     * 5 unused, 6 byte; NULL: all normal */
    const int32_t *types;
    int n_merges;
    const char *const *merges; /* "left right" */
    const size_t *merge_lens;
    const char *const *pre_regex; /* Split patterns applied in turn before byte-level encoding; none: GPT-2's */
    int n_pre_regex;
    int nfc;                        /* NFC-normalise text first */
    int ignore_merges;              /* whole words found in the vocab skip merging */
    int32_t bos_id, eos_id, eot_id; /* -1: none */
    int add_bos, add_eos;
    const char *chat_template; /* NULL: none */
    /* SentencePiece (llama.cpp's "llama" model): merges come from scores (n_merges 0), spaces are U+2581,
     * byte tokens <0xNN> spell characters missing from the vocab */
    int spm;
    const float *scores;  /* per token */
    int add_space_prefix; /* a space before the text and after each special token; decoding drops it */
    int32_t unk_id;       /* -1: none */
} sl_tokenizer_vocab;

int sl_tokenizer_from_vocab(const sl_tokenizer_vocab *v, sl_tokenizer **out, sl_err *e);

/* Encodes len bytes of text (need not be NUL-terminated; invalid UTF-8 bytes are encoded as single bytes).
 * add_specials applies the post-processor (BOS/EOS). *ids is a heap array the caller frees. */
int sl_tokenizer_encode(const sl_tokenizer *t, const char *text, size_t len, int add_specials, int32_t **ids,
                        int *n_ids, sl_err *e);
/* Decodes ids to a NUL-terminated heap string (UTF-8; invalid byte sequences become U+FFFD), as Hugging Face's
 * decode does, except that clean_up_tokenization_spaces is never applied: the text stays exactly what the
 * tokens spell, so a streamed decode (detok.h) always agrees with it. skip_special drops tokens marked special. */
int sl_tokenizer_decode(const sl_tokenizer *t, const int32_t *ids, int n, int skip_special, char **out, size_t *len,
                        sl_err *e);

int sl_tokenizer_vocab_size(const sl_tokenizer *t);                  /* highest id + 1 */
const char *sl_tokenizer_piece(const sl_tokenizer *t, int32_t id);   /* raw vocab string, NULL if none */
int sl_tokenizer_token_id(const sl_tokenizer *t, const char *piece); /* -1 if absent */
int sl_tokenizer_is_special(const sl_tokenizer *t, int32_t id);
/* The bytes one token decodes to (not NUL-terminated); NULL for ids out of range. */
const char *sl_tokenizer_token_bytes(const sl_tokenizer *t, int32_t id, size_t *len);

/* bos_token / eos_token from tokenizer_config.json, NULL if none. */
const char *sl_tokenizer_bos(const sl_tokenizer *t);
const char *sl_tokenizer_eos(const sl_tokenizer *t);
/* End-of-generation ids: generation_config.json eos_token_id (int or list) plus the id of eos_token. */
int sl_tokenizer_eos_ids(const sl_tokenizer *t, const int32_t **ids);
/* chat_template from tokenizer_config.json (the "default" one when it is a list), else chat_template.jinja, else
 * NULL. */
const char *sl_tokenizer_chat_template(const sl_tokenizer *t);

#endif
