#include "runtime/stop.h"

#include <stdlib.h>
#include <string.h>

#include "text/utf8_cut.h"

struct sl_stop {
    char **stops;
    size_t *lens;
    int *index; /* position of each kept stop string in the caller's list */
    int n;
    size_t max_len;
    /* buf[0, given) went out with the previous call; buf[given, len) is held. */
    char *buf;
    size_t len, cap, given;
    int stopped, which;
};

sl_stop *sl_stop_create(const char *const *stops, int n) {
    sl_stop *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->which = -1;
    if (n > 0) {
        s->stops = calloc((size_t)n, sizeof *s->stops);
        s->lens = calloc((size_t)n, sizeof *s->lens);
        s->index = calloc((size_t)n, sizeof *s->index);
        if (!s->stops || !s->lens || !s->index) goto fail;
    }
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        if (!(s->stops[s->n] = strdup(stops[i]))) goto fail;
        s->lens[s->n] = strlen(stops[i]);
        s->index[s->n] = i;
        if (s->lens[s->n] > s->max_len) s->max_len = s->lens[s->n];
        s->n++;
    }
    return s;
fail:
    sl_stop_free(s);
    return NULL;
}

void sl_stop_free(sl_stop *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->stops[i]);
    free(s->stops);
    free(s->lens);
    free(s->index);
    free(s->buf);
    free(s);
}

void sl_stop_reset(sl_stop *s) {
    s->len = s->given = 0;
    s->stopped = 0;
    s->which = -1;
}

int sl_stop_stopped(const sl_stop *s) {
    return s->stopped;
}
int sl_stop_which(const sl_stop *s) {
    return s->which;
}

/* Earliest start of a complete stop string in buf[0, len), or len when none; *which gets its index. */
static size_t earliest_match(const sl_stop *s, int *which) {
    size_t best = s->len;
    for (int i = 0; i < s->n && s->len; i++) {
        size_t lim = best < s->len ? best + s->lens[i] : s->len; /* only matches starting before best */
        if (lim > s->len) lim = s->len;
        const char *m = memmem(s->buf, lim, s->stops[i], s->lens[i]);
        if (m && (size_t)(m - s->buf) < best) {
            best = (size_t)(m - s->buf);
            *which = i;
        }
    }
    return best;
}

/* Earliest start of a suffix of buf that is a proper prefix of some stop string, or len. */
static size_t earliest_partial(const sl_stop *s) {
    size_t from = s->len > s->max_len ? s->len - s->max_len : 0;
    for (size_t h = from; h < s->len; h++) {
        size_t rest = s->len - h;
        for (int i = 0; i < s->n; i++)
            if (rest < s->lens[i] && memcmp(s->buf + h, s->stops[i], rest) == 0) return h;
    }
    return s->len;
}

/* Decides what to emit from the held text; final: no more text will come. */
static int settle(sl_stop *s, int final, const char **out, size_t *out_len) {
    int which = -1;
    size_t m = earliest_match(s, &which);
    size_t h = final ? s->len : earliest_partial(s);
    size_t k;
    if (which >= 0 && m <= h) {
        s->stopped = 1;
        s->which = s->index[which];
        k = m;
    } else {
        /* No match yet, or an earlier-starting stop string may still complete: wait for it. */
        k = h;
        if (!final) k = sl_utf8_cut(s->buf, k);
    }
    *out = s->buf ? s->buf : "";
    *out_len = k;
    s->given = k;
    if (s->stopped) s->len = k;
    return s->stopped;
}

/* Drops the text handed out by the previous call. */
static void drop_given(sl_stop *s) {
    if (s->given == 0) return;
    memmove(s->buf, s->buf + s->given, s->len - s->given);
    s->len -= s->given;
    s->given = 0;
}

int sl_stop_feed(sl_stop *s, const char *chunk, size_t n, const char **out, size_t *out_len, sl_err *e) {
    drop_given(s);
    *out = s->buf ? s->buf : "";
    *out_len = 0;
    if (s->stopped) return 1;
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < s->len + n) cap *= 2;
        char *nb = realloc(s->buf, cap);
        if (!nb) return sl_fail(e, "stop matcher: out of memory holding %zu bytes", s->len + n);
        s->buf = nb;
        s->cap = cap;
    }
    if (n) memcpy(s->buf + s->len, chunk, n);
    s->len += n;
    return settle(s, 0, out, out_len);
}

int sl_stop_flush(sl_stop *s, const char **out, size_t *out_len) {
    drop_given(s);
    *out = s->buf ? s->buf : "";
    *out_len = 0;
    if (s->stopped) return 1;
    return settle(s, 1, out, out_len);
}
