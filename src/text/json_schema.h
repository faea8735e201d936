/* JSON Schema to GBNF (text/grammar.h), so that generation can only produce instances of the schema.
 *
 * Supported: type (and arrays of types), object (properties in the schema's order, required, and
 * additionalProperties false / true / a schema; when it is absent and properties are given, no other key
 * is generated, which still satisfies the schema; the names of additional keys are not kept apart from
 * the described ones), array (items, minItems, maxItems), string (minLength,
 * maxLength, pattern, format date / time / date-time / uuid; other formats are plain strings), number and
 * integer (a minimum >= 0 drops the sign, a maximum < 0 forces it; other bounds are not enforced),
 * boolean, null, enum, const, anyOf, oneOf (as anyOf), allOf of one schema, $ref to #/$defs/... or
 * #/definitions/... (recursion allowed). A pattern is matched whole (as if anchored), with a regex subset:
 * literals, escapes, classes, \d \w \s, `.`, groups, `|`, and * + ? {m,n}; lookarounds and backreferences
 * are refused. Whitespace between tokens is limited (at most one newline and 20 blanks), so a model cannot
 * loop on spaces. Errors name the schema path and what is wrong. */
#ifndef SLUICE_TEXT_JSON_SCHEMA_H
#define SLUICE_TEXT_JSON_SCHEMA_H

#include <jansson.h>

#include "core/err.h"
#include "text/grammar.h"

/* Builds GBNF text out of one or more schemas and rules of the caller's own. */
typedef struct sl_jsgen sl_jsgen;

sl_jsgen *sl_jsgen_new(void);
void sl_jsgen_free(sl_jsgen *b);
/* Adds the rules for schema and writes the name of its rule into rule[size]. `where` names the schema in
 * errors ("response_format.json_schema.schema"). schema NULL: any JSON object. */
int sl_jsgen_add(sl_jsgen *b, json_t *schema, const char *where, char *rule, size_t size, sl_err *e);
/* Adds "name ::= body" verbatim. */
int sl_jsgen_rule(sl_jsgen *b, const char *name, const char *body, sl_err *e);
/* The GBNF so far (owned by b). */
const char *sl_jsgen_text(const sl_jsgen *b);
/* s as a GBNF string literal ("..." with escapes), heap string. */
char *sl_gbnf_literal(const char *s, size_t n);

/* root ::= an instance of schema (NULL: any JSON object). */
int sl_json_schema_grammar(json_t *schema, const char *where, sl_grammar **out, sl_err *e);

#endif
