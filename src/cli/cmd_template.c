/* sluice template: renders a model's chat template on a conversation file, printing the prompt exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/util.h"
#include "formats/resolve.h"
#include "text/chat.h"

static void usage(FILE *f) {
    fprintf(f, "usage: sluice template MODEL CHAT.json\n"
               "       sluice template [MODEL] CHAT.json --template FILE.jinja\n\n"
               "Renders MODEL's chat template (tokenizer_config.json chat_template, or chat_template.jinja) on the\n"
               "conversation in CHAT.json and prints the prompt exactly, with nothing appended.\n\n"
               "CHAT.json: {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true,\n"
               "            \"enable_thinking\": false, ...}; the last three are optional and any other key\n"
               "            (bos_token, date_string...) becomes a template variable.\n\n"
               "options:\n"
               "  --template FILE.jinja  render this template instead (MODEL may then be omitted)\n"
               "  -h, --help             show this help\n");
}

static int fail(const char *msg) {
    fprintf(stderr, "sluice template: %s\n", msg);
    return 1;
}

int cmd_template(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL}, *tmpl_file = NULL;
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--template")) {
            if (++i >= argc) {
                usage(stderr);
                return 2;
            }
            tmpl_file = argv[i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "sluice template: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (npos < 2)
            pos[npos++] = argv[i];
        else {
            usage(stderr);
            return 2;
        }
    }
    if (npos == 0 || (npos == 1 && !tmpl_file)) {
        usage(stderr);
        return 2;
    }
    const char *model = npos == 2 ? pos[0] : NULL, *chat_path = pos[npos - 1];
    sl_err e = {0};
    char *src = NULL, *bos = NULL, *eos = NULL, *out = NULL;
    size_t src_len = 0, out_len = 0;
    json_t *chat = NULL, *extra = NULL;
    sl_jinja *t = NULL;
    int rc = 1;
    char *dir = NULL;
    if (model && (sl_resolve_model(model, &dir, &e) || sl_chat_load_model(dir, &src, &bos, &eos, &e))) goto done;
    if (tmpl_file) {
        free(src);
        src = NULL;
        if (sl_read_file(tmpl_file, &src, &src_len, &e)) goto done;
    } else
        src_len = strlen(src);
    json_error_t je;
    chat = json_load_file(chat_path, 0, &je);
    if (!chat || !json_is_object(chat)) {
        if (chat)
            snprintf(e.msg, sizeof e.msg, "%s: expected a JSON object", chat_path);
        else
            snprintf(e.msg, sizeof e.msg, "%s:%d: %s", chat_path, je.line, je.text);
        goto done;
    }
    if (sl_jinja_parse(src, src_len, &t, &e)) goto done;
    json_t *et = json_object_get(chat, "enable_thinking");
    json_t *tools = json_object_get(chat, "tools");
    sl_chat_input in = {.messages = json_object_get(chat, "messages"),
                        .tools = json_is_null(tools) ? NULL : tools,
                        .add_generation_prompt = json_is_true(json_object_get(chat, "add_generation_prompt")),
                        .enable_thinking = et && !json_is_null(et) ? json_is_true(et) : -1};
    extra = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(chat, k, v) {
        if (strcmp(k, "messages") && strcmp(k, "tools") && strcmp(k, "add_generation_prompt") &&
            strcmp(k, "enable_thinking"))
            json_object_set(extra, k, v);
    }
    in.extra = extra;
    if (sl_chat_render(t, &in, bos, eos, &out, &out_len, &e)) goto done;
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout)) {
        snprintf(e.msg, sizeof e.msg, "writing the prompt failed");
        goto done;
    }
    rc = 0;
done:
    free(dir);
    if (rc) fail(e.msg);
    free(out);
    sl_jinja_free(t);
    json_decref(chat);
    json_decref(extra);
    free(src);
    free(bos);
    free(eos);
    return rc;
}
