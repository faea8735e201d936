/* The tokenizer of a GGUF file: tokenizer.ggml.* metadata (gpt2-style byte-level BPE: tokens, token types,
 * merges, special ids, add_bos/add_eos, the pre-tokenizer by name; or llama-style SentencePiece: tokens, scores,
 * token types, add_space_prefix) and tokenizer.chat_template. */
#ifndef SLUICE_TEXT_TOK_GGUF_H
#define SLUICE_TEXT_TOK_GGUF_H

#include "core/err.h"
#include "formats/gguf.h"
#include "text/tokenizer.h"

int sl_gguf_tokenizer(const sl_gguf *g, sl_tokenizer **out, sl_err *e);
/* Opens path and reads its tokenizer. */
int sl_gguf_tokenizer_load(const char *path, sl_tokenizer **out, sl_err *e);

#endif
