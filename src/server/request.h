/* What the API modules share when they turn a request body into a job: typed field access with
 * validation errors that name the field, sampling defaults, stop strings, and the prompt (chat template
 * or raw text) tokenized and checked against the context. */
#ifndef SLUICE_SERVER_REQUEST_H
#define SLUICE_SERVER_REQUEST_H

#include <jansson.h>

#include "server/engine.h"
#include "server/http.h"

/* Each getter returns 1 when the field is present and valid, 0 when absent (or JSON null), -1 with er
 * filled when it has the wrong type or range. `path` names the field in messages ("options.top_k"). */
int sv_get_number(json_t *o, const char *key, const char *path, double lo, double hi, double *out, sv_error *er);
int sv_get_int(json_t *o, const char *key, const char *path, long long lo, long long hi, long long *out, sv_error *er);
int sv_get_bool(json_t *o, const char *key, const char *path, int *out, sv_error *er);
int sv_get_string(json_t *o, const char *key, const char *path, const char **out, sv_error *er);
int sv_get_array(json_t *o, const char *key, const char *path, json_t **out, sv_error *er);
int sv_get_object(json_t *o, const char *key, const char *path, json_t **out, sv_error *er);

/* A new job with the engine's sampling defaults, a fresh seed, an id with the given prefix and the time. */
sv_job *sv_job_for(sv_engine *g, const char *id_prefix);
/* Stop strings from a string or an array of strings. */
int sv_set_stops(sv_job *j, json_t *v, const char *path, sv_error *er);

/* Renders OpenAI-style messages (and tools, may be NULL) with the model's chat template into j->ids;
 * enable_thinking -1 leaves it to the template; extra may add template variables. Sets
 * starts_in_reasoning when the prompt ends inside an opened <think> block. */
/* A chat job: renders the conversation into j, checks it fits the context (limit_field names the
 * request's output-length field in errors) and marks the output for reasoning / tool-call parsing. On
 * success the job owns `tools`. */
int sv_chat_prepare(sv_engine *g, sv_job *j, json_t *messages, json_t *tools, int enable_thinking, json_t *vars,
                    const char *limit_field, sv_error *er);
/* Template variables from a request body: an OpenAI-style effort (reasoning_effort, or Responses'
 * reasoning.effort, given as effort: NULL when absent) becomes "reasoning_effort" and turns thinking on
 * ("none": off); every key of chat_template_kwargs becomes a variable (enable_thinking also sets *think),
 * except those the server sets itself. *vars is created on demand (the caller frees it). */
int sv_template_vars(json_t *body, const char *effort, json_t **vars, int *think, sv_error *er);
/* 0 when a function called `name` is among the OpenAI-style tools, else a 400 naming `field`. */
int sv_tool_choice_name(json_t *tools, const char *name, const char *field, sv_error *er);
/* Renders and tokenizes a chat. With j->force_tool set, the prompt ends with the opening of a tool call
 * (j->forced), so the model can only continue it. */
int sv_prompt_chat(sv_engine *g, json_t *messages, json_t *tools, int enable_thinking, sv_job *j, sv_error *er);
/* sv_prompt_chat with more template variables (vars, may be NULL: "reasoning_effort", ...). */
int sv_prompt_chat_vars(sv_engine *g, json_t *messages, json_t *tools, int enable_thinking, json_t *vars, sv_job *j,
                        sv_error *er);
/* Folds a JSON-output request into the system message (msgs[0], added when absent): type "json_object" or
 * "json_schema" with schema (may be NULL); "text" changes nothing. path names the field in errors. */
int sv_json_format_note(const char *type, json_t *schema, const char *path, json_t *msgs, sv_error *er);
/* Tokenizes text as is (no template). */
int sv_prompt_text(sv_engine *g, const char *text, size_t len, sv_job *j, sv_error *er);
/* 400 when the prompt, or the prompt plus the requested max_tokens (named max_field), does not fit. */
int sv_check_context(sv_engine *g, const sv_job *j, const char *max_field, sv_error *er);

/* Constrains the job's output: GBNF text, or an instance of a JSON schema (NULL: any JSON object). A
 * grammar that does not compile is a 400 naming `field`. A later call replaces an earlier grammar. */
int sv_set_grammar_gbnf(sv_job *j, const char *gbnf, const char *field, sv_error *er);
int sv_set_grammar_schema(sv_job *j, json_t *schema, const char *field, sv_error *er);

/* Tool-call arguments as the chat templates want them: an object parsed from the JSON string that the
 * APIs carry (kept as the string when it is not JSON). New reference. */
json_t *sv_args_object(json_t *arguments);

#endif
