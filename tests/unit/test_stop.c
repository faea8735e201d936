#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/stop.h"
#include "testutil.h"
#include "text/utf8_cut.h"

typedef struct {
    char out[4096];
    size_t len;
    int stopped, which;
} run_result;

/* Feeds text in chunks of the given sizes (cycled; 0 = all at once), then flushes. */
static run_result run(const char *text, const char *const *stops, int n_stops, const size_t *sizes, int n_sizes) {
    run_result r = {.which = -1};
    sl_stop *s = sl_stop_create(stops, n_stops);
    cr_assert(s);
    size_t n = strlen(text), at = 0;
    sl_err e;
    for (int c = 0; at < n && !r.stopped; c++) {
        size_t step = sizes[c % n_sizes] ? sizes[c % n_sizes] : n;
        if (step > n - at) step = n - at;
        const char *o;
        size_t ol;
        int st = sl_stop_feed(s, text + at, step, &o, &ol, &e);
        cr_assert(st >= 0);
        cr_assert(tu_valid_utf8(o, ol), "emitted chunk splits a character");
        memcpy(r.out + r.len, o, ol);
        r.len += ol;
        r.stopped = st;
        at += step;
    }
    const char *o;
    size_t ol;
    int st = sl_stop_flush(s, &o, &ol);
    memcpy(r.out + r.len, o, ol);
    r.len += ol;
    r.stopped = st;
    r.which = sl_stop_which(s);
    r.out[r.len] = 0;
    sl_stop_free(s);
    return r;
}

/* Reference: the text before the earliest occurrence of any stop string. */
static size_t reference(const char *text, const char *const *stops, int n_stops, int *stopped) {
    size_t best = strlen(text);
    *stopped = 0;
    for (int i = 0; i < n_stops; i++) {
        if (!stops[i][0]) continue;
        const char *m = strstr(text, stops[i]);
        if (m && (size_t)(m - text) <= best) {
            if ((size_t)(m - text) < best || !*stopped) best = (size_t)(m - text);
            *stopped = 1;
        }
    }
    return best;
}

static uint64_t rng = 99;
static size_t rnd(size_t n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (size_t)(rng >> 33) % n;
}

/* Checks one byte at a time, all at once and many random chunkings against the reference. */
static void check_all(const char *text, const char *const *stops, int n_stops) {
    int stopped;
    size_t want = reference(text, stops, n_stops, &stopped);
    size_t one = 1, all = 0;
    run_result a = run(text, stops, n_stops, &one, 1);
    run_result b = run(text, stops, n_stops, &all, 1);
    cr_assert_eq(a.len, want, "bytewise on \"%s\": got \"%s\"", text, a.out);
    cr_assert_eq(memcmp(a.out, text, want), 0);
    cr_assert_eq(a.stopped, stopped);
    cr_assert_eq(b.len, want, "whole on \"%s\": got \"%s\"", text, b.out);
    cr_assert_eq(b.stopped, stopped);
    for (int rep = 0; rep < 200; rep++) {
        size_t sizes[16];
        for (int i = 0; i < 16; i++) sizes[i] = 1 + rnd(7);
        run_result c = run(text, stops, n_stops, sizes, 16);
        cr_assert_eq(c.len, want, "random chunks on \"%s\": got \"%s\"", text, c.out);
        cr_assert_eq(memcmp(c.out, text, want), 0);
        cr_assert_eq(c.stopped, stopped);
        cr_assert_eq(c.which, a.which);
    }
}

Test(stop, holds_back_prefixes) {
    const char *stops[] = {"world"};
    sl_stop *s = sl_stop_create(stops, 1);
    const char *o;
    size_t ol;
    sl_err e;
    cr_assert_eq(sl_stop_feed(s, "Hello wor", 9, &o, &ol, &e), 0);
    cr_assert_eq(ol, 6);
    cr_assert_eq(memcmp(o, "Hello ", 6), 0);
    cr_assert_eq(sl_stop_feed(s, "ld! more", 8, &o, &ol, &e), 1);
    cr_assert_eq(ol, 0);
    cr_assert(sl_stop_stopped(s));
    cr_assert_eq(sl_stop_which(s), 0);
    /* After the stop nothing more comes out. */
    cr_assert_eq(sl_stop_feed(s, "x", 1, &o, &ol, &e), 1);
    cr_assert_eq(ol, 0);
    cr_assert_eq(sl_stop_flush(s, &o, &ol), 1);
    cr_assert_eq(ol, 0);

    /* A prefix that does not continue is released. */
    sl_stop_reset(s);
    cr_assert_eq(sl_stop_feed(s, "wor", 3, &o, &ol, &e), 0);
    cr_assert_eq(ol, 0);
    cr_assert_eq(sl_stop_feed(s, "k", 1, &o, &ol, &e), 0);
    cr_assert_eq(ol, 4);
    cr_assert_eq(memcmp(o, "work", 4), 0);
    /* Flush releases a held prefix. */
    cr_assert_eq(sl_stop_feed(s, " wo", 3, &o, &ol, &e), 0);
    cr_assert_eq(ol, 1);
    cr_assert_eq(sl_stop_flush(s, &o, &ol), 0);
    cr_assert_eq(ol, 2);
    cr_assert_eq(memcmp(o, "wo", 2), 0);
    sl_stop_free(s);
}

Test(stop, single_stop_chunkings) {
    const char *stops[] = {"world"};
    check_all("Hello world, and more", stops, 1);
    check_all("Hello wor", stops, 1);
    check_all("worldwide", stops, 1);
    check_all("no stop here at all", stops, 1);
    check_all("wowowoworld", stops, 1);
    check_all("", stops, 1);
}

Test(stop, multiple_and_overlapping) {
    const char *stops[] = {"abcd", "bc", "</s>", "\n\nUser:"};
    check_all("xxabcdyy", stops, 4);
    check_all("xxabceyy", stops, 4);
    check_all("xxabc", stops, 4); /* at flush the complete "bc" wins */
    check_all("xxab", stops, 4);
    check_all("text </s> tail", stops, 4);
    check_all("answer\n\nUser: next", stops, 4);
    check_all("answer\n\nUse", stops, 4);
    check_all("<</</s", stops, 4);
    check_all("aabcabcd", stops, 4);
}

Test(stop, overlap_waits_for_earlier_stop) {
    const char *stops[] = {"abcd", "bc"};
    sl_stop *s = sl_stop_create(stops, 2);
    const char *o;
    size_t ol;
    sl_err e;
    cr_assert_eq(sl_stop_feed(s, "xabc", 4, &o, &ol, &e), 0); /* "bc" complete, but "abcd" might still be */
    cr_assert_eq(ol, 1);
    cr_assert_eq(sl_stop_feed(s, "d", 1, &o, &ol, &e), 1);
    cr_assert_eq(ol, 0);
    cr_assert_eq(sl_stop_which(s), 0);
    sl_stop_reset(s);
    cr_assert_eq(sl_stop_feed(s, "xabc", 4, &o, &ol, &e), 0);
    cr_assert_eq(sl_stop_feed(s, "e", 1, &o, &ol, &e), 1);
    cr_assert_eq(ol, 1);
    cr_assert_eq(memcmp(o, "a", 1), 0);
    cr_assert_eq(sl_stop_which(s), 1);
    sl_stop_free(s);
}

Test(stop, utf8_never_split) {
    const char *stops[] = {"😀", "日本", "xyz", "é!"};
    check_all("héllo wörld 日本語 end", stops, 4);
    check_all("héllo wörld 日語 😀 end", stops, 4);
    check_all("ééééé é? é!", stops, 4);
    check_all("no match: ñandú 中文 🎉🎉", stops, 4);
    const char *none[] = {""};
    check_all("ñandú 中文 🎉", none, 1); /* no stop strings: only UTF-8 holding */

    /* A lone incomplete character is held until its last byte arrives. */
    sl_stop *s = sl_stop_create(NULL, 0);
    const char *o;
    size_t ol;
    sl_err e;
    const char *emoji = "\xf0\x9f\x98\x80";
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(sl_stop_feed(s, emoji + i, 1, &o, &ol, &e), 0);
        cr_assert_eq(ol, 0);
    }
    cr_assert_eq(sl_stop_feed(s, emoji + 3, 1, &o, &ol, &e), 0);
    cr_assert_eq(ol, 4);
    /* At the end an incomplete character is flushed as is rather than lost. */
    cr_assert_eq(sl_stop_feed(s, "\xe6\x97", 2, &o, &ol, &e), 0);
    cr_assert_eq(ol, 0);
    cr_assert_eq(sl_stop_flush(s, &o, &ol), 0);
    cr_assert_eq(ol, 2);
    sl_stop_free(s);
}

Test(stop, utf8_cut) {
    cr_assert_eq(sl_utf8_cut("ab", 2), 2);
    cr_assert_eq(sl_utf8_cut("a\xc3\xa9", 3), 3);
    cr_assert_eq(sl_utf8_cut("a\xc3\xa9", 2), 1);
    cr_assert_eq(sl_utf8_cut("\xe6\x97\xa5", 2), 0);
    cr_assert_eq(sl_utf8_cut("\xf0\x9f\x98\x80", 3), 0);
    cr_assert_eq(sl_utf8_cut("\xf0\x9f\x98\x80", 4), 4);
    cr_assert_eq(sl_utf8_cut("a\x80\x80\x80\x80", 5), 5); /* stray continuation bytes are not held */
    cr_assert_eq(sl_utf8_cut("", 0), 0);
}

Test(stop, random_texts) {
    const char *stops[] = {"ab", "bab", "cc", "abcab"};
    const char alphabet[] = "abc";
    char text[40];
    for (int rep = 0; rep < 300; rep++) {
        size_t n = 1 + rnd(30);
        for (size_t i = 0; i < n; i++) text[i] = alphabet[rnd(3)];
        text[n] = 0;
        int stopped;
        size_t want = reference(text, stops, 4, &stopped);
        size_t one = 1;
        run_result a = run(text, stops, 4, &one, 1);
        cr_assert_eq(a.len, want, "on \"%s\": got \"%s\"", text, a.out);
        size_t sizes[8];
        for (int i = 0; i < 8; i++) sizes[i] = 1 + rnd(5);
        run_result b = run(text, stops, 4, sizes, 8);
        cr_assert_eq(b.len, want, "on \"%s\": got \"%s\"", text, b.out);
        cr_assert_eq(b.stopped, stopped);
    }
}
