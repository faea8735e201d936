/* Incremental parser that splits model output into content, reasoning and tool calls.
 *
 * Recognised markup:
 *   <think> ... </think>          reasoning (with starts_in_reasoning, output begins inside it: the prompt
 *                                 already opened the block). <tool_call> inside reasoning stays reasoning.
 *   <tool_call> {"name": ..., "arguments": {...} | "<json string>"} </tool_call>    Hermes JSON form
 *   <tool_call> <function=NAME> <parameter=KEY> value </parameter> ... </function> </tool_call>
 *                                 Qwen3-Coder XML form
 *
 * Streaming: text that may be the start of a tag ("<", "<tool", "</thi") is held until decided, so text
 * events never contain a partial tag that turns out to be markup; a trailing incomplete UTF-8 character
 * is held too. A tool call is reported once its </tool_call> arrives, as TOOL_START (name), one or more
 * TOOL_ARGS fragments (compact JSON that concatenates to the arguments object) and TOOL_END. The
 * concatenated result never depends on how the output was chunked.
 *
 * Whitespace, following how Qwen3-style models format output: newlines right after <think>, </think>
 * and </tool_call> are dropped, and so are newlines right before any recognised tag. So "<think>\nR\n
 * </think>\n\nA" gives reasoning "R" and content "A", and content between two tool calls is empty.
 *
 * XML parameter values lose one leading and one trailing newline, then become JSON: with a tools schema
 * (OpenAI-style array of {"type":"function","function":{"name","parameters"}}) a value whose declared
 * type includes "string" stays a string unless it parses as another declared type; without a declared
 * type, a value that parses as a JSON number, boolean, null, object or array is kept as such, and
 * anything else becomes a JSON string.
 *
 * Malformed tool calls (bad JSON, no name, unknown body) are not errors: the whole block, tags included,
 * comes out as content text so that no output is lost (only the newlines right before it, already
 * dropped as markup whitespace, are missing), and sl_tc_parser_malformed() counts them. At
 * finish, an unterminated <tool_call> is parsed if its body is complete enough, else emitted as text;
 * unterminated reasoning stays reasoning; a held partial tag comes out as text of the current kind. */
#ifndef SLUICE_TEXT_TOOLCALL_H
#define SLUICE_TEXT_TOOLCALL_H

#include <jansson.h>
#include <stddef.h>

#include "core/err.h"

typedef enum {
    SL_TC_TEXT,       /* content */
    SL_TC_REASONING,  /* reasoning content */
    SL_TC_TOOL_START, /* text: the function name */
    SL_TC_TOOL_ARGS,  /* text: a fragment of the arguments JSON */
    SL_TC_TOOL_END,   /* text: empty */
} sl_tc_kind;

typedef struct {
    sl_tc_kind kind;
    int tool_index;   /* 0, 1, ... per parsed tool call; -1 for text and reasoning */
    const char *text; /* valid only during the callback; not NUL-terminated */
    size_t len;
} sl_tc_event;

typedef void (*sl_tc_cb)(void *ud, const sl_tc_event *ev);

typedef struct sl_tc_parser sl_tc_parser;

/* tools may be NULL; the parser keeps its own reference. NULL on OOM. */
sl_tc_parser *sl_tc_parser_create(int starts_in_reasoning, const json_t *tools);
void sl_tc_parser_free(sl_tc_parser *p);

/* Feeds a chunk and calls cb for each event it settles. -1 only when out of memory. */
int sl_tc_parser_feed(sl_tc_parser *p, const char *s, size_t n, sl_tc_cb cb, void *ud, sl_err *e);
/* End of output: emits everything still held (see the header comment). Call once. */
int sl_tc_parser_finish(sl_tc_parser *p, sl_tc_cb cb, void *ud, sl_err *e);

/* How many <tool_call> blocks could not be parsed and went out as text. */
int sl_tc_parser_malformed(const sl_tc_parser *p);

/* Whole-output convenience: content and reasoning as heap strings (empty when absent) and tool_calls as
 * a new JSON array of {"name": ..., "arguments": "<compact JSON string>"}. */
int sl_tc_parse_all(const char *s, size_t n, int starts_in_reasoning, const json_t *tools, char **content,
                    char **reasoning, json_t **tool_calls, sl_err *e);

#endif
