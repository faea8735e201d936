/* Chat rendering front end: builds the variables transformers passes to a chat template
 * (messages, tools, add_generation_prompt, special tokens, extra kwargs) and renders it. */
#ifndef SLUICE_TEXT_CHAT_H
#define SLUICE_TEXT_CHAT_H

#include <stddef.h>
#include <time.h>

#include <jansson.h>

#include "core/err.h"
#include "text/jinja.h"

typedef struct {
    json_t *messages;
    json_t *tools; /* NULL renders as None */
    int add_generation_prompt;
    int enable_thinking; /* -1 = not passed */
    json_t *extra;       /* more top-level vars (override the others), may be NULL */
    time_t now;          /* clock for strftime_now(); 0 = the current time */
} sl_chat_input;

/* bos_token / eos_token may be NULL (then the variable is not defined). *out is a heap string. */
int sl_chat_render(const sl_jinja *tmpl, const sl_chat_input *in, const char *bos_token, const char *eos_token,
                   char **out, size_t *len, sl_err *e);

/* Reads MODEL_DIR/tokenizer_config.json: chat_template (a string, or a list of {name, template} where "default"
 * wins) falling back to MODEL_DIR/chat_template.jinja, and bos/eos tokens (a string or {"content": ...}).
 * Outputs are heap strings; *bos / *eos are NULL when absent. */
int sl_chat_load_model(const char *model_dir, char **tmpl, char **bos, char **eos, sl_err *e);

#endif
