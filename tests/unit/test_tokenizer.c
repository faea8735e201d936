#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "testutil.h"
#include "text/detok.h"
#include "text/tokenizer.h"

/* A temp dir holding the fixture tokenizer `name` (tokenizer.json decompressed, tokenizer_config.json). */
static char *fixture_dir(const char *name) {
    char *dir = tu_tmpdir(), rel[256], cmd[4096];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    char *src = tu_fixture(rel);
    snprintf(cmd, sizeof cmd,
             "xz -dc '%s/tokenizer.json.xz' > '%s/tokenizer.json' && cp '%s/tokenizer_config.json' '%s/'", src, dir,
             src, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(src);
    return dir;
}

/* Removes a directory made by tu_tmpdir (the fixture copies are ~10 MB each). */
static void remove_dir(char *dir) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    free(dir);
}

static sl_tokenizer *load_dir(const char *dir) {
    sl_tokenizer *t;
    sl_err e;
    if (sl_tokenizer_load(dir, &t, &e)) cr_assert_fail("%s", e.msg);
    return t;
}

static json_t *expected(const char *name) {
    char *path = tu_fixture("tokenizers/expected.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    cr_assert(root, "%s: %s", path, je.text);
    free(path);
    json_t *texts = json_incref(json_object_get(json_object_get(root, name), "texts"));
    json_decref(root);
    cr_assert(json_array_size(texts) > 0);
    return texts;
}

static void assert_ids(const int32_t *ids, int n, json_t *want, const char *what, const char *text) {
    cr_assert_eq((size_t)n, json_array_size(want), "%s of \"%s\": %d ids, want %zu", what, text, n,
                 json_array_size(want));
    for (int i = 0; i < n; i++)
        cr_assert_eq(ids[i], json_integer_value(json_array_get(want, (size_t)i)),
                     "%s of \"%s\": id %d is %d, want %lld", what, text, i, ids[i],
                     (long long)json_integer_value(json_array_get(want, (size_t)i)));
}

/* Every text of the fixture: ids, ids with specials, decoded text, and the streamed decode. */
static void check_all(const char *name) {
    char *dir = fixture_dir(name);
    sl_tokenizer *t = load_dir(dir);
    json_t *texts = expected(name);
    size_t i;
    json_t *c;
    sl_err e;
    json_array_foreach(texts, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t len = json_string_length(json_object_get(c, "text"));
        int32_t *ids;
        int n;
        cr_assert_eq(sl_tokenizer_encode(t, text, len, 0, &ids, &n, &e), 0, "%s", e.msg);
        assert_ids(ids, n, json_object_get(c, "ids"), "ids", text);
        free(ids);
        cr_assert_eq(sl_tokenizer_encode(t, text, len, 1, &ids, &n, &e), 0, "%s", e.msg);
        assert_ids(ids, n, json_object_get(c, "ids_with_specials"), "ids_with_specials", text);

        const char *want = json_string_value(json_object_get(c, "decoded"));
        char *out;
        size_t out_len;
        cr_assert_eq(sl_tokenizer_decode(t, ids, n, 0, &out, &out_len, &e), 0, "%s", e.msg);
        cr_assert_eq(out_len, strlen(want), "decoded length of \"%s\"", text);
        cr_assert_str_eq(out, want);
        free(out);

        sl_detok d;
        sl_detok_init(&d, t, 0);
        char *acc = calloc(out_len + 16, 1);
        size_t acc_len = 0;
        for (int k = 0; k <= n; k++) {
            const char *chunk;
            size_t cl;
            int rc = k < n ? sl_detok_push(&d, ids[k], &chunk, &cl, &e) : sl_detok_flush(&d, &chunk, &cl, &e);
            cr_assert_eq(rc, 0, "%s", e.msg);
            cr_assert(tu_valid_utf8(chunk, cl), "chunk %d of \"%s\" is not whole UTF-8", k, text);
            cr_assert_leq(acc_len + cl, out_len, "streamed too much for \"%s\"", text);
            memcpy(acc + acc_len, chunk, cl);
            acc_len += cl;
        }
        cr_assert_eq(acc_len, out_len);
        cr_assert_str_eq(acc, want);
        free(acc);
        sl_detok_free(&d);
        free(ids);
    }
    json_decref(texts);
    sl_tokenizer_free(t);
    remove_dir(dir);
}

Test(tokenizer, qwen3_expected) {
    check_all("qwen3");
}
Test(tokenizer, llama3_expected) {
    check_all("llama3");
}

Test(tokenizer, qwen3_metadata) {
    char *dir = fixture_dir("qwen3");
    sl_tokenizer *t = load_dir(dir);
    cr_assert_eq(sl_tokenizer_vocab_size(t), 151669);
    cr_assert_eq(sl_tokenizer_token_id(t, "<|im_end|>"), 151645);
    cr_assert_eq(sl_tokenizer_token_id(t, "Hello"), 9707);
    cr_assert_eq(sl_tokenizer_token_id(t, "no such piece at all"), -1);
    cr_assert_str_eq(sl_tokenizer_piece(t, 1879), "Ġworld");
    cr_assert_null(sl_tokenizer_piece(t, -1));
    cr_assert_null(sl_tokenizer_piece(t, 151669));
    cr_assert(sl_tokenizer_is_special(t, 151645));
    cr_assert(!sl_tokenizer_is_special(t, 151667)); /* <think> is added but not special */
    cr_assert(!sl_tokenizer_is_special(t, 9707));
    cr_assert_null(sl_tokenizer_bos(t));
    cr_assert_str_eq(sl_tokenizer_eos(t), "<|im_end|>");
    const int32_t *eos;
    cr_assert_eq(sl_tokenizer_eos_ids(t, &eos), 1);
    cr_assert_eq(eos[0], 151645);
    cr_assert(strstr(sl_tokenizer_chat_template(t), "<|im_start|>"));

    /* generation_config.json adds its ids, without duplicates */
    char *gen = sl_path_join(dir, "generation_config.json");
    const char *g = "{\"eos_token_id\": [151645, 151643]}";
    sl_err e;
    cr_assert_eq(sl_write_file(gen, g, strlen(g), &e), 0);
    sl_tokenizer_free(t);
    t = load_dir(dir);
    cr_assert_eq(sl_tokenizer_eos_ids(t, &eos), 2);
    cr_assert_eq(eos[0], 151645);
    cr_assert_eq(eos[1], 151643);

    /* skip_special drops <|im_end|> but keeps the non-special <think> */
    int32_t ids[] = {151667, 9707, 151645};
    char *out;
    size_t len;
    cr_assert_eq(sl_tokenizer_decode(t, ids, 3, 1, &out, &len, &e), 0);
    cr_assert_str_eq(out, "<think>Hello");
    free(out);
    int32_t bad[] = {9707, 999999};
    cr_assert_neq(sl_tokenizer_decode(t, bad, 2, 0, &out, &len, &e), 0);
    cr_assert(strstr(e.msg, "999999"));
    sl_tokenizer_free(t);
    free(gen);
    remove_dir(dir);
}

Test(tokenizer, llama3_metadata) {
    char *dir = fixture_dir("llama3");
    sl_tokenizer *t = load_dir(dir);
    cr_assert_eq(sl_tokenizer_vocab_size(t), 128256);
    cr_assert_str_eq(sl_tokenizer_bos(t), "<|begin_of_text|>");
    cr_assert_str_eq(sl_tokenizer_eos(t), "<|end_of_text|>");
    const int32_t *eos;
    cr_assert_eq(sl_tokenizer_eos_ids(t, &eos), 1);
    cr_assert_eq(eos[0], 128001);
    cr_assert(sl_tokenizer_is_special(t, 128000));
    cr_assert_not_null(sl_tokenizer_chat_template(t));
    sl_tokenizer_free(t);
    remove_dir(dir);
}

/* Bytes that are not UTF-8 still encode (as byte tokens) and decode back; decode repairs them to U+FFFD. */
Test(tokenizer, invalid_utf8_round_trip) {
    char *dir = fixture_dir("qwen3");
    sl_tokenizer *t = load_dir(dir);
    const char text[] = "ok \xff\xfe caf\xc3 \xe4\xbd\xa0\xe5 end\xf0\x9f";
    int32_t *ids;
    int n;
    sl_err e;
    cr_assert_eq(sl_tokenizer_encode(t, text, sizeof text - 1, 0, &ids, &n, &e), 0, "%s", e.msg);
    char raw[64];
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        size_t bl;
        const char *b = sl_tokenizer_token_bytes(t, ids[i], &bl);
        memcpy(raw + k, b, bl);
        k += bl;
    }
    cr_assert_eq(k, sizeof text - 1);
    cr_assert_eq(memcmp(raw, text, k), 0);
    char *out;
    size_t len;
    cr_assert_eq(sl_tokenizer_decode(t, ids, n, 0, &out, &len, &e), 0);
    cr_assert_str_eq(out, "ok \xef\xbf\xbd\xef\xbf\xbd caf\xef\xbf\xbd \xe4\xbd\xa0\xef\xbf\xbd end\xef\xbf\xbd");
    free(out);
    free(ids);
    sl_tokenizer_free(t);
    remove_dir(dir);
}

/* The streamed text never splits a character, even when tokens do. */
Test(tokenizer, detok_holds_partial_characters) {
    char *dir = fixture_dir("llama3");
    sl_tokenizer *t = load_dir(dir);
    const char *text = "👨‍👩‍👧‍👦 日本語";
    int32_t *ids;
    int n;
    sl_err e;
    cr_assert_eq(sl_tokenizer_encode(t, text, strlen(text), 0, &ids, &n, &e), 0);
    cr_assert_gt(n, 8);
    sl_detok d;
    sl_detok_init(&d, t, 0);
    int empty = 0;
    for (int i = 0; i < n; i++) {
        const char *c;
        size_t cl;
        cr_assert_eq(sl_detok_push(&d, ids[i], &c, &cl, &e), 0);
        cr_assert(tu_valid_utf8(c, cl));
        empty += cl == 0;
    }
    cr_assert_gt(empty, 0, "some token should have ended inside a character");
    /* a dangling lead byte comes out as U+FFFD at flush */
    const char *c;
    size_t cl;
    int32_t lead = 9468; /* "ðŁ": the first two bytes of a 4-byte emoji */
    cr_assert_eq(sl_detok_push(&d, lead, &c, &cl, &e), 0);
    cr_assert_eq(cl, 0);
    cr_assert_eq(sl_detok_flush(&d, &c, &cl, &e), 0);
    cr_assert_eq(cl, 3);
    cr_assert_eq(memcmp(c, "\xef\xbf\xbd", 3), 0);
    cr_assert_neq(sl_detok_push(&d, -5, &c, &cl, &e), 0);
    sl_detok_free(&d);
    free(ids);
    sl_tokenizer_free(t);
    remove_dir(dir);
}

static void write_json(const char *dir, const char *name, json_t *j) {
    char *p = sl_path_join(dir, name);
    cr_assert_eq(json_dump_file(j, p, JSON_COMPACT), 0);
    free(p);
}

static void write_text(const char *dir, const char *name, const char *s) {
    char *p = sl_path_join(dir, name);
    sl_err e;
    cr_assert_eq(sl_write_file(p, s, strlen(s), &e), 0);
    free(p);
}

static json_t *load_json_file(const char *dir, const char *name) {
    char *p = sl_path_join(dir, name);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    cr_assert(j, "%s", je.text);
    free(p);
    return j;
}

/* TemplateProcessing adds BOS/EOS; added-token lstrip/rstrip eat neighbouring spaces; list-form chat templates. */
Test(tokenizer, template_processing_and_added_flags) {
    char *dir = fixture_dir("llama3");
    json_t *j = load_json_file(dir, "tokenizer.json");
    json_t *post = json_pack(
        "{s:s, s:[{s:{s:s,s:i}},{s:{s:s,s:i}},{s:{s:s,s:i}}], s:{s:{s:s,s:[i],s:[s]},s:{s:s,s:[i],s:[s]}}}", "type",
        "TemplateProcessing", "single", "SpecialToken", "id", "<|begin_of_text|>", "type_id", 0, "Sequence", "id", "A",
        "type_id", 0, "SpecialToken", "id", "<|end_of_text|>", "type_id", 0, "special_tokens", "<|begin_of_text|>",
        "id", "<|begin_of_text|>", "ids", 128000, "tokens", "<|begin_of_text|>", "<|end_of_text|>", "id",
        "<|end_of_text|>", "ids", 128001, "tokens", "<|end_of_text|>");
    cr_assert(post);
    json_object_set_new(j, "post_processor", post);
    json_t *added = json_object_get(j, "added_tokens");
    json_object_set_new(json_array_get(added, 2), "lstrip", json_true()); /* <|reserved_special_token_0|> */
    json_object_set_new(json_array_get(added, 3), "rstrip", json_true()); /* <|reserved_special_token_1|> */
    write_json(dir, "tokenizer.json", j);
    json_decref(j);
    write_text(dir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", "
               "\"template\": \"D\"}],"
               " \"eos_token\": {\"content\": \"<|eot_id|>\"}}");
    sl_tokenizer *t = load_dir(dir);
    int32_t *ids;
    int n;
    sl_err e;
    cr_assert_eq(sl_tokenizer_encode(t, "Hello world", 11, 1, &ids, &n, &e), 0);
    cr_assert_eq(n, 4);
    cr_assert_eq(ids[0], 128000);
    cr_assert_eq(ids[1], 9906);
    cr_assert_eq(ids[2], 1917);
    cr_assert_eq(ids[3], 128001);
    free(ids);
    const char *s = "a  <|reserved_special_token_0|>  b <|reserved_special_token_1|>  c";
    cr_assert_eq(sl_tokenizer_encode(t, s, strlen(s), 0, &ids, &n, &e), 0);
    /* "a", tok0, "  b"... lstrip removed the spaces before tok0, rstrip the ones after tok1 */
    char *out;
    cr_assert_eq(sl_tokenizer_decode(t, ids, n, 0, &out, NULL, &e), 0);
    cr_assert_str_eq(out, "a<|reserved_special_token_0|>  b <|reserved_special_token_1|>c");
    free(out);
    free(ids);
    cr_assert_str_eq(sl_tokenizer_chat_template(t), "D");
    cr_assert_str_eq(sl_tokenizer_eos(t), "<|eot_id|>");
    sl_tokenizer_free(t);
    remove_dir(dir);
}

/* chat_template.jinja is used when tokenizer_config.json has no template. */
Test(tokenizer, chat_template_file) {
    char *dir = fixture_dir("qwen3");
    write_text(dir, "tokenizer_config.json", "{\"eos_token\": \"<|endoftext|>\"}");
    write_text(dir, "chat_template.jinja", "{{ messages }}");
    sl_tokenizer *t = load_dir(dir);
    cr_assert_str_eq(sl_tokenizer_chat_template(t), "{{ messages }}");
    const int32_t *eos;
    cr_assert_eq(sl_tokenizer_eos_ids(t, &eos), 1);
    cr_assert_eq(eos[0], 151643);
    sl_tokenizer_free(t);
    remove_dir(dir);
}

static void expect_load_error(const char *dir, const char *needle) {
    sl_tokenizer *t = (sl_tokenizer *)1;
    sl_err e;
    cr_assert_eq(sl_tokenizer_load(dir, &t, &e), -1);
    cr_assert_null(t);
    cr_assert(strstr(e.msg, needle), "error \"%s\" should mention \"%s\"", e.msg, needle);
}

Test(tokenizer, load_errors) {
    char *dir = tu_tmpdir();
    expect_load_error("/nonexistent/model", "not a directory");
    expect_load_error(dir, "tokenizer.json: not found");
    write_text(dir, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,");
    expect_load_error(dir, "tokenizer.json: line");
    write_text(dir, "tokenizer.json", "[1, 2]");
    expect_load_error(dir, "expected a JSON object");
    write_text(dir, "tokenizer.json", "{\"version\": \"1.0\"}");
    expect_load_error(dir, "no \"model\"");
    write_text(dir, "tokenizer.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
    expect_load_error(dir, "expected BPE");
    write_text(dir, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}");
    expect_load_error(dir, "integer ids");
    write_text(dir, "tokenizer.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}");
    expect_load_error(dir, "not in the vocab");
    write_text(
        dir, "tokenizer.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\", \"b\"]]},"
        " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}");
    expect_load_error(dir, "pattern");
    write_text(
        dir, "tokenizer.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\", \"b\"]]},"
        " \"pre_tokenizer\": {\"type\": \"Whitespace\"}}");
    expect_load_error(dir, "Whitespace");
    write_text(dir, "tokenizer.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]},"
               " \"normalizer\": {\"type\": \"NFC\"}}");
    expect_load_error(dir, "ByteLevel");
    remove_dir(dir);
}

/* A tiny tokenizer exercising ByteLevel's own regex, add_prefix_space, Lowercase and NFKC. */
Test(tokenizer, tiny_bytelevel) {
    char *dir = tu_tmpdir();
    write_text(
        dir, "tokenizer.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"Ġ\": 0, \"a\": 1, \"b\": 2, \"Ġa\": 3, \"Ġab\": 4, \"fi\": 5,"
        " \"f\": 6, \"i\": 7, \"Ġf\": 8, \"Ġfi\": 9},"
        "  \"merges\": [\"Ġ a\", \"Ġa b\", \"Ġ f\", \"Ġf i\", \"f i\"]},"
        " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}, {\"type\": \"Lowercase\"}]},"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true},"
        " \"decoder\": {\"type\": \"ByteLevel\"}}");
    sl_tokenizer *t = load_dir(dir);
    int32_t *ids;
    int n;
    sl_err e;
    const char *s = "AB ab \xef\xac\x81"; /* U+FB01 (fi ligature) becomes "fi" under NFKC */
    cr_assert_eq(sl_tokenizer_encode(t, s, strlen(s), 0, &ids, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(n, 3);
    cr_assert_eq(ids[0], 4);
    cr_assert_eq(ids[1], 4);
    cr_assert_eq(ids[2], 9);
    free(ids);
    cr_assert_eq(sl_tokenizer_encode(t, "", 0, 1, &ids, &n, &e), 0);
    cr_assert_eq(n, 0);
    free(ids);
    sl_tokenizer_free(t);
    remove_dir(dir);
}

/* Without a normalizer, decode(encode(x)) == x for any valid UTF-8, and streaming agrees with decode. */
Test(tokenizer, llama3_random_round_trip) {
    char *dir = fixture_dir("llama3");
    sl_tokenizer *t = load_dir(dir);
    static const int32_t pool[] = {' ',    ' ',    'e',    't',    'a',    '\n',   '\'',    '.',
                                   '1',    0xe9,   0x301,  0x4f60, 0x597d, 0x200d, 0x1f468, 0x1f600,
                                   0x3042, 0x0627, 0xac00, '\t',   '\r',   0xa0,   0x2028};
    uint32_t x = 7;
    for (int rep = 0; rep < 20; rep++) {
        char text[4096];
        size_t n = 0;
        while (n < sizeof text - 8) {
            x = x * 1664525u + 1013904223u;
            uint32_t cp = (uint32_t)pool[(x >> 8) % (sizeof pool / sizeof pool[0])];
            if ((x >> 20) % 5 == 0) cp = 'a' + (x >> 24) % 26;
            if (cp < 0x80)
                text[n++] = (char)cp;
            else if (cp < 0x800)
                text[n++] = (char)(0xC0 | cp >> 6), text[n++] = (char)(0x80 | (cp & 63));
            else if (cp < 0x10000)
                text[n++] = (char)(0xE0 | cp >> 12), text[n++] = (char)(0x80 | (cp >> 6 & 63)),
                text[n++] = (char)(0x80 | (cp & 63));
            else
                text[n++] = (char)(0xF0 | cp >> 18), text[n++] = (char)(0x80 | (cp >> 12 & 63)),
                text[n++] = (char)(0x80 | (cp >> 6 & 63)), text[n++] = (char)(0x80 | (cp & 63));
        }
        int32_t *ids;
        int k;
        sl_err e;
        cr_assert_eq(sl_tokenizer_encode(t, text, n, 0, &ids, &k, &e), 0, "%s", e.msg);
        char *out;
        size_t len;
        cr_assert_eq(sl_tokenizer_decode(t, ids, k, 0, &out, &len, &e), 0);
        cr_assert_eq(len, n);
        cr_assert_eq(memcmp(out, text, n), 0, "round trip %d differs", rep);
        sl_detok d;
        sl_detok_init(&d, t, 0);
        size_t at = 0;
        for (int i = 0; i <= k; i++) {
            const char *c;
            size_t cl;
            cr_assert_eq(i < k ? sl_detok_push(&d, ids[i], &c, &cl, &e) : sl_detok_flush(&d, &c, &cl, &e), 0);
            cr_assert(tu_valid_utf8(c, cl));
            cr_assert_leq(at + cl, n);
            cr_assert_eq(memcmp(c, text + at, cl), 0);
            at += cl;
        }
        cr_assert_eq(at, n);
        sl_detok_free(&d);
        free(out);
        free(ids);
    }
    sl_tokenizer_free(t);
    remove_dir(dir);
}

/* Split behaviors decide which side a delimiter joins; BPE merges across the joins show where pieces ended. */
static void check_split(const char *behavior, const char *text, const int32_t *want, int n_want) {
    char *dir = tu_tmpdir(), json[1024];
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"-\": 1, \"a-\": 2, \"-a\": 3, \"--\": 4},"
             " \"merges\": [\"a -\", \"- a\", \"- -\"]},"
             " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\":"
             " {\"String\": \"-\"}, \"behavior\": \"%s\", \"invert\": false}, {\"type\": \"ByteLevel\","
             " \"add_prefix_space\": false, \"use_regex\": false}]}}",
             behavior);
    write_text(dir, "tokenizer.json", json);
    sl_tokenizer *t = load_dir(dir);
    int32_t *ids;
    int n;
    sl_err e;
    cr_assert_eq(sl_tokenizer_encode(t, text, strlen(text), 0, &ids, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(n, n_want, "%s on %s: %d ids", behavior, text, n);
    for (int i = 0; i < n; i++) cr_assert_eq(ids[i], want[i], "%s on %s: id %d", behavior, text, i);
    free(ids);
    sl_tokenizer_free(t);
    remove_dir(dir);
}

Test(tokenizer, split_behaviors) {
    check_split("Isolated", "a-a", (int32_t[]){0, 1, 0}, 3);
    check_split("Removed", "a-a", (int32_t[]){0, 0}, 2);
    check_split("MergedWithPrevious", "a-a", (int32_t[]){2, 0}, 2);
    check_split("MergedWithNext", "a-a", (int32_t[]){0, 3}, 2);
    check_split("MergedWithPrevious", "a--a", (int32_t[]){2, 1, 0}, 3);
    check_split("MergedWithNext", "a--a", (int32_t[]){0, 1, 3}, 3);
    check_split("Contiguous", "a--a", (int32_t[]){0, 4, 0}, 3);
}
