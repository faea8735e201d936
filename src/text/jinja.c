/* Public entry points of the template engine: parse once, render many times. */
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"
#include "text/jinja_eval.h"
#include "text/jinja_parse.h"

struct sl_jinja {
    jarena arena;     /* owns the AST and its strings */
    size_t max_bytes; /* a render's memory bound, 0: JX_MAX_BYTES */
    jnode **body;
    size_t n;
};

int sl_jinja_parse(const char *src, size_t len, sl_jinja **out, sl_err *e) {
    sl_jinja *t = calloc(1, sizeof *t);
    if (!t) return sl_fail(e, "out of memory");
    if (jparse(&t->arena, src, len, &t->body, &t->n, e)) {
        sl_jinja_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void sl_jinja_free(sl_jinja *t) {
    if (!t) return;
    ja_free(&t->arena);
    free(t);
}

int sl_jinja_render_at(const sl_jinja *t, json_t *vars, time_t now, char **out, size_t *len, sl_err *e) {
    jarena a = {.limit = t->max_bytes ? t->max_bytes : JX_MAX_BYTES};
    jbuf b = {0};
    int r = jeval_render(&a, t->body, t->n, vars, now, &b, e);
    ja_free(&a);
    if (r) {
        jb_free(&b);
        return -1;
    }
    if (!b.p) jb_put(&b, "", 0);
    *out = b.p;
    if (len) *len = b.n;
    return 0;
}

void sl_jinja_set_max_bytes(sl_jinja *t, size_t bytes) {
    t->max_bytes = bytes;
}

int sl_jinja_render(const sl_jinja *t, json_t *vars, char **out, size_t *len, sl_err *e) {
    return sl_jinja_render_at(t, vars, time(NULL), out, len, e);
}
