/* How `sluice run` shows a reply on a terminal: reasoning dimmed, tool calls on a line of their own,
 * content as is. Without a terminal the raw text passes through unchanged. */
#ifndef SLUICE_CLI_CHAT_VIEW_H
#define SLUICE_CLI_CHAT_VIEW_H

#include <stdio.h>

#include "core/err.h"
#include "text/toolcall.h"

typedef struct chat_view {
    FILE *out;
    int styled; /* 0: raw passthrough */
    sl_tc_parser *tc;
    int dim;       /* inside dimmed reasoning */
    int tool_args; /* inside a tool call's arguments */
} chat_view;

/* styled: parse (markup of format fmt) and style (a terminal); starts_in_reasoning: the prompt already opened
 * <think>. */
int chat_view_begin(chat_view *v, FILE *out, int styled, sl_tc_format fmt, int starts_in_reasoning, sl_err *e);
int chat_view_feed(chat_view *v, const char *text, size_t len, sl_err *e);
/* Flushes what the parser held and resets the style. */
int chat_view_end(chat_view *v, sl_err *e);

#endif
