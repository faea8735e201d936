/* gpt-oss's harmony messages (see toolcall.h): a header up to <|message|> says what the body is; the body
 * runs to <|end|>, <|return|>, <|call|>, or to the <|start|> / <|channel|> of the next message. */
#include <stdlib.h>
#include <string.h>

#include "text/tc_int.h"
#include "text/utf8_cut.h"

enum { H_START, H_TEXT, H_HEADER, H_BODY };
enum { K_CONTENT, K_REASONING, K_TOOL };

static const char START[] = "<|start|>", CHANNEL[] = "<|channel|>", MESSAGE[] = "<|message|>", END[] = "<|end|>",
                  RETURN[] = "<|return|>", CALL[] = "<|call|>", LEAD_TO[] = " to=";

const char *const tc_harmony_tokens[] = {START, CHANNEL, MESSAGE, END, RETURN, CALL, "<|constrain|>", NULL};

/* Tags that end a body (and outside messages: the last two begin a header, the rest are dropped). */
static const char *const TAGS[] = {END, RETURN, CALL, START, CHANNEL};
enum { N_TAGS = 5 };

enum { TAG_NONE, TAG_PARTIAL, TAG_FULL };

static int match(const char *s, size_t n, const char **tag) {
    int r = TAG_NONE;
    for (int i = 0; i < N_TAGS; i++) {
        size_t l = strlen(TAGS[i]);
        if (n >= l && memcmp(s, TAGS[i], l) == 0) {
            *tag = TAGS[i];
            return TAG_FULL;
        }
        if (n < l && memcmp(s, TAGS[i], n) == 0) r = TAG_PARTIAL;
    }
    return r;
}

/* The value after "key" in the header: up to a space, a tag or the end. */
static const char *header_field(const char *h, size_t n, const char *key, size_t *len) {
    size_t at = tc_find(h, n, key);
    if (at == n) return NULL;
    const char *v = h + at + strlen(key);
    size_t l = 0;
    while (v + l < h + n && !tc_is_space(v[l]) && v[l] != '<') l++;
    *len = l;
    return v;
}

/* Decides what the body after the header in p->hdr is. */
static void classify(sl_tc_parser *p) {
    const char *h = p->hdr.s ? p->hdr.s : "";
    size_t n = p->hdr.len, rl = 0, cl = 0;
    const char *to = header_field(h, n, LEAD_TO, &rl), *ch = header_field(h, n, CHANNEL, &cl);
    if (to && rl && !(rl == 9 && !memcmp(to, "assistant", 9)))
        p->kind = K_TOOL;
    else
        p->kind = ch && cl == 8 && !memcmp(ch, "analysis", 8) ? K_REASONING : K_CONTENT;
    p->body.len = 0;
}

static void emit_body_text(sl_tc_parser *p, const char *s, size_t n) {
    tc_emit(p, p->state == H_BODY && p->kind == K_REASONING ? SL_TC_REASONING : SL_TC_TEXT, -1, s, n);
}

/* Ends a message. A call is reported, or written out as text when it does not parse; term is the tag
 * that ended it when that tag belongs to this message ("" otherwise). */
static void close_message(sl_tc_parser *p, const char *term) {
    p->state = H_TEXT;
    if (p->kind != K_TOOL) return;
    const char *h = p->hdr.s ? p->hdr.s : "";
    size_t rl = 0;
    const char *to = header_field(h, p->hdr.len, LEAD_TO, &rl);
    if (tc_starts(to, rl, "functions.")) to += 10, rl -= 10;
    char *name = rl ? strndup(to, rl) : NULL, *args = NULL;
    if (name && tc_json_args(p->body.s ? p->body.s : "", p->body.len, &args) == 0) {
        tc_emit_call(p, name, args);
    } else {
        p->malformed++;
        tc_emit(p, SL_TC_TEXT, -1, h, p->hdr.len);
        tc_emit(p, SL_TC_TEXT, -1, MESSAGE, strlen(MESSAGE));
        tc_emit(p, SL_TC_TEXT, -1, p->body.s, p->body.len);
        tc_emit(p, SL_TC_TEXT, -1, term, strlen(term));
    }
    free(name);
    free(args);
    p->body.len = 0;
}

static int begin_header(sl_tc_parser *p, const char *opening) {
    p->state = H_HEADER;
    p->hdr.len = 0;
    return tc_buf_add(&p->hdr, opening, strlen(opening));
}

size_t tc_harmony_scan(sl_tc_parser *p, int final, int *oom) {
    const char *b = p->pend.s;
    size_t n = p->pend.len, pos = 0;
    while (pos < n) {
        const char *s = b + pos;
        size_t left = n - pos;
        if (p->state == H_START) { /* the prompt ended "<|start|>assistant": a recipient may come first */
            size_t l = strlen(LEAD_TO);
            if (left < l && !memcmp(s, LEAD_TO, left) && !final) break;
            if (left >= l && !memcmp(s, LEAD_TO, l)) {
                if (begin_header(p, "")) goto oom;
            } else {
                p->state = H_TEXT;
            }
            continue;
        }
        if (p->state == H_HEADER) {
            size_t end = tc_find(s, left, MESSAGE);
            int found = end < left;
            if (!found && !final) end -= tc_partial_suffix(s, left, MESSAGE);
            if (tc_buf_add(&p->hdr, s, end)) goto oom;
            pos += end;
            if (!found) break;
            pos += strlen(MESSAGE);
            classify(p);
            p->state = H_BODY;
            continue;
        }
        /* H_TEXT or H_BODY: runs of text up to a '<' that may be a tag */
        const char *lt = memchr(s, '<', left);
        size_t run = lt ? (size_t)(lt - s) : left;
        if (p->state == H_BODY && p->kind == K_TOOL) {
            if (tc_buf_add(&p->body, s, run)) goto oom;
        } else {
            if (!lt && !final) run = sl_utf8_cut(s, run);
            emit_body_text(p, s, run);
        }
        pos += run;
        if (!lt) break;
        s = b + pos, left = n - pos;
        const char *tag = NULL;
        int t = match(s, left, &tag);
        if (t == TAG_PARTIAL && !final) break;
        if (t == TAG_NONE || t == TAG_PARTIAL) {
            if (p->state == H_BODY && p->kind == K_TOOL) {
                if (tc_buf_add(&p->body, "<", 1)) goto oom;
            } else {
                emit_body_text(p, "<", 1);
            }
            pos++;
            continue;
        }
        pos += strlen(tag);
        int opens = tag == START || tag == CHANNEL;
        if (p->state == H_BODY) close_message(p, opens ? "" : tag);
        if (opens && begin_header(p, tag)) goto oom;
    }
    return pos;
oom:
    *oom = 1;
    return pos;
}

void tc_harmony_finish(sl_tc_parser *p) {
    if (p->state == H_HEADER) /* never reached <|message|>: not markup after all */
        tc_emit(p, SL_TC_TEXT, -1, p->hdr.s, p->hdr.len);
    else if (p->state == H_BODY)
        close_message(p, ""); /* <|call|> usually ends generation, so a call ends here */
    p->state = H_TEXT;
}
