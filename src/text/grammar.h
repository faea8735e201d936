/* Grammars that constrain decoding: GBNF (the notation llama.cpp's server accepts) compiled into rules,
 * a pushdown recogniser over UTF-8 bytes, and the set of vocabulary tokens that may come next.
 *
 * GBNF: `name ::= body` rules (the start rule is `root`), alternatives `|`, sequences, groups `( )`,
 * repetition `*` `+` `?` `{m}` `{m,}` `{m,n}`, literals "..." and character classes [a-z] [^...] with
 * escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH, `.` (any character), and # comments. A rule body
 * ends at the end of its line unless inside parentheses or after `|`.
 *
 * The recogniser keeps a set of stacks of grammar positions (one per way the input so far can be read);
 * left-recursive rules are refused when the grammar is compiled, and a grammar ambiguous enough to need
 * more than SL_GRAMMAR_MAX_STACKS stacks at once fails with an error instead of growing without bound.
 * Character classes match code points; a token may end inside a multi-byte character, which is then
 * checked against the classes it could still become. */
#ifndef SLUICE_TEXT_GRAMMAR_H
#define SLUICE_TEXT_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "text/tokenizer.h"

#define SL_GRAMMAR_MAX_STACKS 1024

typedef struct sl_grammar sl_grammar;

/* Compiles GBNF text (len bytes, need not be NUL-terminated). Errors name the line and what was expected. */
int sl_grammar_parse(const char *src, size_t len, sl_grammar **out, sl_err *e);
void sl_grammar_free(sl_grammar *g);

/* 1 when the whole of s[0, n) is a sentence of the grammar, 0 when not, -1 on error (too ambiguous). */
int sl_grammar_match(const sl_grammar *g, const char *s, size_t n, sl_err *e);

/* The tokens of a vocabulary as byte strings, in a trie, so that tokens sharing a prefix are checked
 * against a grammar once for that prefix. Immutable once built: one serves any number of constraints.
 * Special tokens and tokens that spell nothing are never allowed by a grammar; end-of-generation tokens
 * are allowed exactly where the grammar can end. n_vocab may exceed the tokenizer's (padded tables). */
typedef struct sl_gvocab sl_gvocab;
int sl_gvocab_create(const sl_tokenizer *tok, int n_vocab, sl_gvocab **out, sl_err *e);
void sl_gvocab_free(sl_gvocab *v);

/* The state of one sequence under a grammar: which tokens may follow, advanced token by token. */
typedef struct sl_gconstraint sl_gconstraint;

/* g and v must outlive the constraint. */
int sl_gconstraint_init(const sl_grammar *g, const sl_gvocab *v, sl_gconstraint **out, sl_err *e);
void sl_gconstraint_free(sl_gconstraint *c);
/* allowed[n_vocab]: 1 for each token that may come next, 0 for the rest. Returns the number allowed,
 * or -1 with e filled. */
int sl_gconstraint_mask(sl_gconstraint *c, uint8_t *allowed, sl_err *e);
/* Sets the logits of the tokens not allowed to -inf. Returns the number allowed, or -1. */
int sl_gconstraint_apply(sl_gconstraint *c, float *logits, sl_err *e);
/* Whether one token may come next (cheaper than a whole mask): 1 yes, 0 no, -1 error. */
int sl_gconstraint_allows(sl_gconstraint *c, int32_t id, sl_err *e);
/* Advances over a token; fails when the token is not allowed. An end-of-generation token is accepted only
 * where the grammar can end. */
int sl_gconstraint_accept(sl_gconstraint *c, int32_t id, sl_err *e);
/* 1 when the text so far is a complete sentence (an end-of-generation token would be allowed). */
int sl_gconstraint_can_end(const sl_gconstraint *c);
/* 1 when the text so far is complete and nothing can follow it: generation should stop here. */
int sl_gconstraint_done(const sl_gconstraint *c);

#endif
