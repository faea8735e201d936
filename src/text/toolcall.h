/* Incremental parser that splits model output into content, reasoning and tool calls, in the markup of
 * one model family (sl_tc_format, picked from the chat template by sl_tc_format_detect).
 *
 * Recognised markup, SL_TC_HERMES (Qwen and the default):
 *   <think> ... </think>          reasoning (with starts_in_reasoning, output begins inside it: the prompt
 *                                 already opened the block). <tool_call> inside reasoning stays reasoning.
 *   <tool_call> {"name": ..., "arguments": {...} | "<json string>"} </tool_call>    Hermes JSON form
 *   <tool_call> <function=NAME> <parameter=KEY> value </parameter> ... </function> </tool_call>
 *                                 Qwen3-Coder XML form
 * SL_TC_GLM (GLM-4.5/4.6): <think> as above; <tool_call>NAME <arg_key>K</arg_key> <arg_value>V</arg_value>
 *   ... </tool_call>, values typed like XML parameter values (below); a JSON body is read as Hermes.
 * SL_TC_DEEPSEEK (DeepSeek-V3/V3.1/R1): <think> as above; <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜>
 *   are dropped; each <｜tool▁call▁begin｜>BODY<｜tool▁call▁end｜> is a call, BODY either V3's
 *   "function<｜tool▁sep｜>NAME\n```json\n{args}\n```" or V3.1's "NAME<｜tool▁sep｜>{args}".
 * SL_TC_KIMI (Kimi-K2): <think> as above; <|tool_calls_section_begin|> and <|tool_calls_section_end|> are
 *   dropped; each <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{args}<|tool_call_end|>
 *   is a call.
 * SL_TC_HARMONY (gpt-oss): a sequence of messages "[<|start|>ROLE][ to=RECIPIENT]<|channel|>CHANNEL
 *   [ to=RECIPIENT][ <|constrain|>json]<|message|>BODY" ending in <|end|>, <|return|> or <|call|> (or where
 *   the next <|start|> or <|channel|> begins). Channel analysis is reasoning, final and a commentary with no
 *   recipient are content, a message to functions.NAME is a call of NAME with BODY as its JSON arguments.
 *   Output that does not begin with a header is content until a <|start|> or <|channel|> appears.
 *   starts_in_reasoning is ignored; none of the whitespace rules below apply.
 *
 * Streaming: text that may be the start of a tag ("<", "<tool", "</thi", "<|ch") is held until decided, so
 * text events never contain a partial tag that turns out to be markup; a trailing incomplete UTF-8 character
 * is held too. A tool call is reported once its closing tag arrives, as TOOL_START (name), one or more
 * TOOL_ARGS fragments (compact JSON that concatenates to the arguments object) and TOOL_END. The
 * concatenated result never depends on how the output was chunked.
 *
 * Whitespace, following how Qwen3-style models format output: newlines right after <think>, </think>
 * and a call's closing tag (and the dropped section tags) are dropped, and so are newlines right before
 * any recognised tag. So "<think>\nR\n</think>\n\nA" gives reasoning "R" and content "A", and content
 * between two tool calls is empty.
 *
 * XML parameter values lose one leading and one trailing newline, then become JSON: with a tools schema
 * (OpenAI-style array of {"type":"function","function":{"name","parameters"}}) a value whose declared
 * type includes "string" stays a string unless it parses as another declared type; without a declared
 * type, a value that parses as a JSON number, boolean, null, object or array is kept as such, and
 * anything else becomes a JSON string. JSON arguments must be an object, or a string holding one.
 *
 * Malformed tool calls (bad JSON, no name, unknown body) are not errors: the whole block, tags included,
 * comes out as content text so that no output is lost (only the newlines right before it, already
 * dropped as markup whitespace, and dropped section tags are missing), and sl_tc_parser_malformed()
 * counts them. At finish, an unterminated call is parsed if its body is complete enough (gpt-oss and
 * others end generation on the call's closing token, which then never reaches the parser), else emitted
 * as text; unterminated reasoning stays reasoning; a held partial tag comes out as text of the current
 * kind. */
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

typedef enum {
    SL_TC_HERMES, /* Qwen / Hermes: <tool_call> JSON or Qwen3-Coder XML */
    SL_TC_GLM,
    SL_TC_DEEPSEEK,
    SL_TC_KIMI,
    SL_TC_HARMONY, /* gpt-oss */
} sl_tc_format;

/* The format a model writes, from the markers its chat template renders; SL_TC_HERMES when none match. */
sl_tc_format sl_tc_format_detect(const char *chat_template);
/* The format's markup tokens (NULL-terminated). Tokenizers often mark them special; decoding must keep
 * them for the parser to see the markup. */
const char *const *sl_tc_format_tokens(sl_tc_format f);
const char *sl_tc_format_name(sl_tc_format f);

typedef void (*sl_tc_cb)(void *ud, const sl_tc_event *ev);

typedef struct sl_tc_parser sl_tc_parser;

/* tools may be NULL; the parser keeps its own reference. NULL on OOM. */
sl_tc_parser *sl_tc_parser_create(sl_tc_format fmt, int starts_in_reasoning, const json_t *tools);
void sl_tc_parser_free(sl_tc_parser *p);

/* Feeds a chunk and calls cb for each event it settles. -1 only when out of memory. */
int sl_tc_parser_feed(sl_tc_parser *p, const char *s, size_t n, sl_tc_cb cb, void *ud, sl_err *e);
/* End of output: emits everything still held (see the header comment). Call once. */
int sl_tc_parser_finish(sl_tc_parser *p, sl_tc_cb cb, void *ud, sl_err *e);

/* How many tool calls could not be parsed and went out as text. */
int sl_tc_parser_malformed(const sl_tc_parser *p);

/* Whole-output convenience: content and reasoning as heap strings (empty when absent) and tool_calls as
 * a new JSON array of {"name": ..., "arguments": "<compact JSON string>"}. */
int sl_tc_parse_all(sl_tc_format fmt, const char *s, size_t n, int starts_in_reasoning, const json_t *tools,
                    char **content, char **reasoning, json_t **tool_calls, sl_err *e);

#endif
