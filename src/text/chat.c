/* Chat template rendering with the variables transformers' apply_chat_template provides. */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "formats/gguf.h"
#include "text/chat.h"
#include "text/tokenizer.h"

int sl_chat_render(const sl_jinja *tmpl, const sl_chat_input *in, const char *bos_token, const char *eos_token,
                   char **out, size_t *len, sl_err *e) {
    json_t *vars = json_object();
    if (!vars) return sl_fail(e, "out of memory");
    json_object_set(vars, "messages", in->messages ? in->messages : json_array());
    json_object_set(vars, "tools", in->tools ? in->tools : json_null());
    json_object_set_new(vars, "documents", json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(in->add_generation_prompt));
    if (bos_token) json_object_set_new(vars, "bos_token", json_string(bos_token));
    if (eos_token) json_object_set_new(vars, "eos_token", json_string(eos_token));
    if (in->enable_thinking >= 0) json_object_set_new(vars, "enable_thinking", json_boolean(in->enable_thinking));
    if (in->extra) json_object_update(vars, in->extra);
    int r = sl_jinja_render_at(tmpl, vars, in->now ? in->now : time(NULL), out, len, e);
    json_decref(vars);
    return r;
}

/* A special token given as a string or as an AddedToken object {"content": ...}. */
static char *token_text(json_t *v) {
    if (json_is_string(v)) return strdup(json_string_value(v));
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return strdup(json_string_value(json_object_get(v, "content")));
    return NULL;
}

/* A GGUF file carries the template and special tokens in its tokenizer metadata. */
static int load_gguf(const char *path, char **tmpl, char **bos, char **eos, sl_err *e) {
    sl_tokenizer *t;
    if (sl_tokenizer_load(path, &t, e)) return -1;
    const char *ct = sl_tokenizer_chat_template(t);
    int rc = ct ? 0 : sl_fail(e, "%s: no chat template (metadata key 'tokenizer.chat_template' is missing)", path);
    if (!rc) {
        *tmpl = strdup(ct);
        *bos = sl_tokenizer_bos(t) ? strdup(sl_tokenizer_bos(t)) : NULL;
        *eos = sl_tokenizer_eos(t) ? strdup(sl_tokenizer_eos(t)) : NULL;
        if (!*tmpl) rc = sl_fail(e, "out of memory");
    }
    sl_tokenizer_free(t);
    return rc;
}

int sl_chat_load_model(const char *model_dir, char **tmpl, char **bos, char **eos, sl_err *e) {
    *tmpl = *bos = *eos = NULL;
    if (!sl_is_dir(model_dir) && sl_gguf_is_path(model_dir)) return load_gguf(model_dir, tmpl, bos, eos, e);
    char *cfg_path = sl_path_join(model_dir, "tokenizer_config.json");
    json_t *cfg = NULL;
    if (sl_file_exists(cfg_path)) {
        json_error_t je;
        cfg = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, &je); /* model_max_length can exceed int64 */
        if (!cfg) {
            sl_fail(e, "%s:%d: %s", cfg_path, je.line, je.text);
            free(cfg_path);
            return -1;
        }
    }
    free(cfg_path);
    if (cfg) {
        json_t *ct = json_object_get(cfg, "chat_template");
        if (json_is_string(ct))
            *tmpl = strdup(json_string_value(ct));
        else if (json_is_array(ct)) {
            size_t i;
            json_t *item;
            json_array_foreach(ct, i, item) {
                const char *name = json_string_value(json_object_get(item, "name"));
                const char *t = json_string_value(json_object_get(item, "template"));
                if (t && (!*tmpl || (name && !strcmp(name, "default")))) {
                    free(*tmpl);
                    *tmpl = strdup(t);
                    if (name && !strcmp(name, "default")) break;
                }
            }
        }
        *bos = token_text(json_object_get(cfg, "bos_token"));
        *eos = token_text(json_object_get(cfg, "eos_token"));
        json_decref(cfg);
    }
    if (!*tmpl) {
        char *p = sl_path_join(model_dir, "chat_template.jinja");
        size_t n;
        int r = sl_file_exists(p)
                    ? sl_read_file(p, tmpl, &n, e)
                    : sl_fail(e, "%s: no chat_template in tokenizer_config.json and no chat_template.jinja", model_dir);
        free(p);
        if (r) {
            free(*bos);
            free(*eos);
            *bos = *eos = NULL;
            return -1;
        }
    }
    return 0;
}
