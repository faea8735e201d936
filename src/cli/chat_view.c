#include "cli/chat_view.h"

#define DIM "\033[2m"
#define CYAN "\033[36m"
#define RESET "\033[0m"

static void plain(chat_view *v) {
    if (v->dim) fputs(RESET "\n\n", v->out);
    v->dim = 0;
}

static void on_event(void *ud, const sl_tc_event *ev) {
    chat_view *v = ud;
    switch (ev->kind) {
    case SL_TC_REASONING:
        if (!v->dim) fputs(DIM, v->out);
        v->dim = 1;
        fwrite(ev->text, 1, ev->len, v->out);
        break;
    case SL_TC_TEXT:
        plain(v);
        fwrite(ev->text, 1, ev->len, v->out);
        break;
    case SL_TC_TOOL_START:
        plain(v);
        fprintf(v->out, CYAN "[tool call] %.*s(", (int)ev->len, ev->text);
        v->tool_args = 1;
        break;
    case SL_TC_TOOL_ARGS: fwrite(ev->text, 1, ev->len, v->out); break;
    case SL_TC_TOOL_END:
        fputs(")" RESET "\n", v->out);
        v->tool_args = 0;
        break;
    }
    fflush(v->out);
}

int chat_view_begin(chat_view *v, FILE *out, int styled, sl_tc_format fmt, int starts_in_reasoning, sl_err *e) {
    *v = (chat_view){.out = out, .styled = styled};
    if (!styled) return 0;
    v->tc = sl_tc_parser_create(fmt, starts_in_reasoning, NULL);
    return v->tc ? 0 : sl_fail(e, "out of memory");
}

int chat_view_feed(chat_view *v, const char *text, size_t len, sl_err *e) {
    if (!v->styled) {
        fwrite(text, 1, len, v->out);
        fflush(v->out);
        return 0;
    }
    return sl_tc_parser_feed(v->tc, text, len, on_event, v, e);
}

int chat_view_end(chat_view *v, sl_err *e) {
    int rc = 0;
    if (v->styled) {
        rc = sl_tc_parser_finish(v->tc, on_event, v, e);
        if (v->dim || v->tool_args) fputs(RESET, v->out);
        sl_tc_parser_free(v->tc);
    }
    fflush(v->out);
    *v = (chat_view){0};
    return rc;
}
