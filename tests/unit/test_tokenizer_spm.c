/* SentencePiece-style tokenizer.json features on a hand-made vocabulary whose ids are worked out by hand:
 * Metaspace with split, byte fallback, unknown characters (fused), ignore_merges, and the errors. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "text/detok.h"
#include "text/tokenizer.h"

#define MS "\xE2\x96\x81"

static void write_json(const char *dir, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

/* vocab: <unk> <s> </s> ▁ a b ab ▁ab <0xC3> <0xA9> c ▁abc; merges a+b, then ▁+ab */
static char *tiny_json(const char *pre, const char *extra_model) {
    static char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"added_tokens\": ["
             "{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
             "{\"id\": 1, \"content\": \"<s>\", \"special\": true},"
             "{\"id\": 2, \"content\": \"</s>\", \"special\": true}],"
             " \"normalizer\": null, \"pre_tokenizer\": %s,"
             " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "
             "\"" MS "\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
             " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
             " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true%s,"
             " \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"" MS "\": 3, \"a\": 4, \"b\": 5, \"ab\": 6,"
             " \"" MS "ab\": 7, \"<0xC3>\": 8, \"<0xA9>\": 9, \"c\": 10, \"" MS "abc\": 11},"
             " \"merges\": [\"a b\", \"" MS " ab\"]}}",
             pre, extra_model);
    return buf;
}

static sl_tokenizer *load(const char *json) {
    char *dir = tu_tmpdir();
    write_json(dir, json);
    sl_tokenizer *t;
    sl_err e;
    cr_assert_eq(sl_tokenizer_load(dir, &t, &e), 0, "%s", e.msg);
    free(dir);
    return t;
}

static void expect_ids(const sl_tokenizer *t, const char *text, const int32_t *want, int nw) {
    int32_t *ids;
    int n;
    sl_err e;
    cr_assert_eq(sl_tokenizer_encode(t, text, strlen(text), 0, &ids, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(n, nw, "\"%s\": %d ids, want %d", text, n, nw);
    for (int i = 0; i < n; i++) cr_expect_eq(ids[i], want[i], "\"%s\": id %d is %d, want %d", text, i, ids[i], want[i]);
    free(ids);
}

static void expect_decode(const sl_tokenizer *t, const int32_t *ids, int n, const char *want) {
    char *s;
    size_t len;
    sl_err e;
    cr_assert_eq(sl_tokenizer_decode(t, ids, n, 1, &s, &len, &e), 0, "%s", e.msg);
    cr_expect_str_eq(s, want);
    sl_detok d;
    sl_detok_init(&d, t, 1);
    char acc[256];
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        const char *o;
        size_t ol;
        cr_assert_eq(sl_detok_push(&d, ids[i], &o, &ol, &e), 0);
        memcpy(acc + k, o, ol);
        k += ol;
    }
    acc[k] = 0;
    cr_expect_str_eq(acc, want, "streamed");
    sl_detok_free(&d);
    free(s);
}

Test(tokenizer_spm, metaspace_byte_fallback_unknown) {
    sl_tokenizer *t = load(tiny_json(
        "{\"type\": \"Metaspace\", \"replacement\": \"" MS "\", \"prepend_scheme\": \"always\", \"split\": true}", ""));
    /* ▁ab | ▁ab c (▁abc is in the vocab but no merge makes it) | ▁ é as bytes C3 A9 | ▁ ç: A7 has no byte token,
     * so the character is unknown, and a run of unknowns is one <unk> */
    int32_t want[] = {7, 7, 10, 3, 8, 9, 3, 0};
    expect_ids(t, "ab abc \xC3\xA9 \xC3\xA7\xC3\xA7", want, 8);
    expect_decode(t, want, 6, "ab abc \xC3\xA9");
    /* text that starts with a space gets no second ▁ */
    int32_t want2[] = {7};
    expect_ids(t, " ab", want2, 1);
    /* with split every ▁ starts a pre-token: ▁a | ▁ | ▁b, and none of them merges */
    int32_t want3[] = {3, 4, 3, 3, 5};
    expect_ids(t, "a  b", want3, 5);
    sl_tokenizer_free(t);
}

Test(tokenizer_spm, prepend_first_and_ignore_merges) {
    sl_tokenizer *t = load(tiny_json("{\"type\": \"Metaspace\", \"replacement\": \"" MS
                                     "\", \"prepend_scheme\": \"first\", \"split\": false}",
                                     ", \"ignore_merges\": true"));
    /* whole pre-token in the vocab: taken as it is (ignore_merges), merges would give ▁ab c */
    int32_t want[] = {11};
    expect_ids(t, "abc", want, 1);
    /* prepend only at the start of the input: after a special token the text goes on without ▁ */
    int32_t want2[] = {11, 2, 6};
    expect_ids(t, "abc</s>ab", want2, 3);
    expect_decode(t, want2, 3, "abcab");
    sl_tokenizer_free(t);
}

static void expect_error(const char *json, const char *what) {
    char *dir = tu_tmpdir();
    write_json(dir, json);
    sl_tokenizer *t;
    sl_err e;
    cr_expect_neq(sl_tokenizer_load(dir, &t, &e), 0, "%s should fail", what);
    cr_expect(strstr(e.msg, what), "\"%s\" not in: %s", what, e.msg);
    cr_expect(strstr(e.msg, "tokenizer.json"), "the file is named: %s", e.msg);
    free(dir);
}

Test(tokenizer_spm, errors) {
    expect_error(
        tiny_json("{\"type\": \"Metaspace\", \"replacement\": \"" MS "\", \"prepend_scheme\": \"sometimes\"}", ""),
        "prepend_scheme \"sometimes\"");
    expect_error(tiny_json("{\"type\": \"Metaspace\", \"replacement\": \"_\"}", ""), "Metaspace replacement \"_\"");
    expect_error(tiny_json("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Metaspace\"}, {\"type\": "
                           "\"ByteLevel\"}]}",
                           ""),
                 "both a ByteLevel and a Metaspace pre_tokenizer");
    char json[4096];
    snprintf(json, sizeof json, "%s", tiny_json("null", ""));
    char *n = strstr(json, "\"normalizer\": null");
    cr_assert(n);
    char fixed[4096];
    snprintf(fixed, sizeof fixed,
             "%.*s\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, "
             "\"content\": \"" MS "\"}%s",
             (int)(n - json), json, n + strlen("\"normalizer\": null"));
    expect_error(fixed, "Replace normalizer");
}

/* Unigram pieces and scores: <unk> 0, ▁ -2, a -3, b -3, ab -4, ▁ab -5, c -3, abc -10, <0xC3> 0, <0xA9> 0
 * (unknown characters score -10 - 10 = -20) */
static const char UNIGRAM[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}],"
    " \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"" MS "\", \"prepend_scheme\": \"always\"},"
    " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"" MS "\", \"prepend_scheme\": \"always\"},"
    " \"model\": {\"type\": \"Unigram\", \"unk_id\": %s, \"byte_fallback\": true, \"vocab\": [[\"<unk>\", 0.0],"
    " [\"" MS "\", -2.0], [\"a\", -3.0], [\"b\", -3.0], [\"ab\", -4.0], [\"" MS "ab\", -5.0], [\"c\", -3.0],"
    " [\"abc\", -10.0], [\"<0xC3>\", 0.0], [\"<0xA9>\", 0.0]%s]}}";

Test(tokenizer_spm, unigram) {
    char json[2048];
    snprintf(json, sizeof json, UNIGRAM, "0", "");
    sl_tokenizer *t = load(json);
    /* ▁ab (-5) beats ▁ + ab (-6); ▁ab c (-8) beats ▁ + abc (-12); é has no piece: its bytes; çç has no piece
     * and no byte token for A7: one unknown */
    int32_t want[] = {5, 5, 6, 1, 8, 9, 1, 0};
    expect_ids(t, "ab abc \xC3\xA9 \xC3\xA7\xC3\xA7", want, 8);
    expect_decode(t, want, 8, "ab abc \xC3\xA9 ");
    sl_tokenizer_free(t);
    snprintf(json, sizeof json, UNIGRAM, "10", "");
    expect_error(json, "Unigram unk_id");
    snprintf(json, sizeof json, UNIGRAM, "0", ", [\"d\"]");
    expect_error(json, "model vocab[10]: expected a [piece, score] pair");
    /* without unk_id, a character no piece covers is an error naming it */
    snprintf(json, sizeof json, UNIGRAM, "null", "");
    t = load(json);
    int32_t *ids;
    int n;
    sl_err e;
    cr_expect_neq(sl_tokenizer_encode(t, "a\xC3\xA7", 3, 0, &ids, &n, &e), 0);
    cr_expect(strstr(e.msg, "\"\xC3\xA7\" is not in the Unigram vocabulary"), "%s", e.msg);
    sl_tokenizer_free(t);
}
