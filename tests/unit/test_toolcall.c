#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "text/toolcall.h"

/* Everything the events of one parse say, normalised so that different chunkings compare equal. */
typedef struct {
    char content[4096], reasoning[4096];
    char names[8][64], args[8][1024];
    int n_calls;
    char kinds[64]; /* 'C' content, 'R' reasoning, 'T' tool call; adjacent text runs merged */
    int n_kinds;
    int open_call; /* between TOOL_START and TOOL_END */
    int malformed;
} record;

static void append(char *dst, size_t cap, const char *s, size_t n) {
    size_t l = strlen(dst);
    cr_assert(l + n < cap);
    memcpy(dst + l, s, n);
    dst[l + n] = 0;
}

static void kind(record *r, char k) {
    if (r->n_kinds && r->kinds[r->n_kinds - 1] == k && k != 'T') return;
    r->kinds[r->n_kinds++] = k;
}

static void on_event(void *ud, const sl_tc_event *ev) {
    record *r = ud;
    switch (ev->kind) {
    case SL_TC_TEXT:
    case SL_TC_REASONING:
        cr_assert_eq(ev->tool_index, -1);
        cr_assert(!r->open_call, "text inside a tool call");
        cr_assert(ev->len > 0, "empty text event");
        cr_assert(tu_valid_utf8(ev->text, ev->len), "event splits a character");
        append(ev->kind == SL_TC_TEXT ? r->content : r->reasoning, 4096, ev->text, ev->len);
        kind(r, ev->kind == SL_TC_TEXT ? 'C' : 'R');
        break;
    case SL_TC_TOOL_START:
        cr_assert_eq(ev->tool_index, r->n_calls);
        cr_assert(!r->open_call);
        r->open_call = 1;
        append(r->names[r->n_calls], 64, ev->text, ev->len);
        kind(r, 'T');
        break;
    case SL_TC_TOOL_ARGS:
        cr_assert(r->open_call);
        cr_assert_eq(ev->tool_index, r->n_calls);
        append(r->args[r->n_calls], 1024, ev->text, ev->len);
        break;
    case SL_TC_TOOL_END:
        cr_assert(r->open_call);
        cr_assert_eq(ev->tool_index, r->n_calls);
        r->open_call = 0;
        r->n_calls++;
        break;
    }
}

static uint64_t rng = 7;
static size_t rnd(size_t n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (size_t)(rng >> 33) % n;
}

/* Parses text fed in chunks of the given sizes (cycled; 0 = all at once). */
static record *parse_fmt(sl_tc_format fmt, const char *text, int in_reasoning, const json_t *tools, const size_t *sizes,
                         int n_sizes) {
    record *r = calloc(1, sizeof *r);
    sl_tc_parser *p = sl_tc_parser_create(fmt, in_reasoning, tools);
    cr_assert(p);
    size_t n = strlen(text), at = 0;
    sl_err e;
    for (int c = 0; at < n; c++) {
        size_t step = sizes[c % n_sizes] ? sizes[c % n_sizes] : n;
        if (step > n - at) step = n - at;
        cr_assert_eq(sl_tc_parser_feed(p, text + at, step, on_event, r, &e), 0);
        at += step;
    }
    cr_assert_eq(sl_tc_parser_finish(p, on_event, r, &e), 0);
    cr_assert(!r->open_call);
    r->malformed = sl_tc_parser_malformed(p);
    sl_tc_parser_free(p);
    return r;
}

static record *parse(const char *text, int in_reasoning, const json_t *tools, const size_t *sizes, int n_sizes) {
    return parse_fmt(SL_TC_HERMES, text, in_reasoning, tools, sizes, n_sizes);
}

static void same(const record *a, const record *b, const char *how, const char *text) {
    cr_assert_str_eq(a->content, b->content, "%s: content differs on \"%s\"", how, text);
    cr_assert_str_eq(a->reasoning, b->reasoning, "%s: reasoning differs on \"%s\"", how, text);
    cr_assert_eq(a->n_calls, b->n_calls, "%s: calls differ on \"%s\"", how, text);
    for (int i = 0; i < a->n_calls; i++) {
        cr_assert_str_eq(a->names[i], b->names[i]);
        cr_assert_str_eq(a->args[i], b->args[i]);
    }
    cr_assert_eq(a->n_kinds, b->n_kinds, "%s: event order differs on \"%s\"", how, text);
    cr_assert_eq(memcmp(a->kinds, b->kinds, (size_t)a->n_kinds), 0);
    cr_assert_eq(a->malformed, b->malformed);
}

/* Parses whole, one byte at a time and in random chunks; all must agree. Returns the whole parse. */
static record *check_fmt(sl_tc_format fmt, const char *text, int in_reasoning, const json_t *tools) {
    size_t all = 0, one = 1;
    record *whole = parse_fmt(fmt, text, in_reasoning, tools, &all, 1);
    record *bytes = parse_fmt(fmt, text, in_reasoning, tools, &one, 1);
    same(whole, bytes, "byte at a time", text);
    free(bytes);
    for (int rep = 0; rep < 100; rep++) {
        size_t sizes[16];
        for (int i = 0; i < 16; i++) sizes[i] = 1 + rnd(9);
        record *r = parse_fmt(fmt, text, in_reasoning, tools, sizes, 16);
        same(whole, r, "random chunks", text);
        free(r);
    }
    return whole;
}

static record *check(const char *text, int in_reasoning, const json_t *tools) {
    return check_fmt(SL_TC_HERMES, text, in_reasoning, tools);
}

Test(toolcall, plain_text_and_lone_angles) {
    record *r = check("Hello world", 0, NULL);
    cr_assert_str_eq(r->content, "Hello world");
    cr_assert_str_eq(r->kinds, "C");
    free(r);
    r = check("if a < b and c <tool or <thin> <tool_cal", 0, NULL);
    cr_assert_str_eq(r->content, "if a < b and c <tool or <thin> <tool_cal");
    cr_assert_eq(r->n_calls, 0);
    free(r);
    r = check("x <", 0, NULL);
    cr_assert_str_eq(r->content, "x <");
    free(r);
    r = check("line one\nline two\n\n<b>bold</b>\n", 0, NULL);
    cr_assert_str_eq(r->content, "line one\nline two\n\n<b>bold</b>\n");
    free(r);
    r = check("héllo 日本 😀 <thé>", 0, NULL);
    cr_assert_str_eq(r->content, "héllo 日本 😀 <thé>");
    free(r);
}

Test(toolcall, reasoning) {
    record *r = check("<think>\nLet me think.\nTwo lines.\n</think>\n\nThe answer is 4.", 0, NULL);
    cr_assert_str_eq(r->reasoning, "Let me think.\nTwo lines.");
    cr_assert_str_eq(r->content, "The answer is 4.");
    cr_assert_str_eq(r->kinds, "RC");
    free(r);
    /* The prompt opened <think>: output starts inside reasoning. */
    r = check("Reasoning here\n</think>\n\nAnswer", 1, NULL);
    cr_assert_str_eq(r->reasoning, "Reasoning here");
    cr_assert_str_eq(r->content, "Answer");
    free(r);
    /* Unterminated reasoning stays reasoning, and a held partial close tag comes out as reasoning. */
    r = check("<think>\nstill thinking </thi", 0, NULL);
    cr_assert_str_eq(r->reasoning, "still thinking </thi");
    cr_assert_str_eq(r->content, "");
    free(r);
    /* Tool markup inside reasoning is just reasoning. */
    r = check("<think>I could use <tool_call>{\"name\":\"f\"}</tool_call></think>ok", 0, NULL);
    cr_assert_str_eq(r->reasoning, "I could use <tool_call>{\"name\":\"f\"}</tool_call>");
    cr_assert_str_eq(r->content, "ok");
    cr_assert_eq(r->n_calls, 0);
    free(r);
    /* Empty reasoning block. */
    r = check("<think>\n\n</think>\n\nHi", 0, NULL);
    cr_assert_str_eq(r->reasoning, "");
    cr_assert_str_eq(r->content, "Hi");
    cr_assert_str_eq(r->kinds, "C");
    free(r);
}

Test(toolcall, hermes_single) {
    record *r =
        check("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 0, NULL);
    cr_assert_eq(r->n_calls, 1);
    cr_assert_str_eq(r->names[0], "get_weather");
    cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\"}");
    cr_assert_str_eq(r->content, "");
    cr_assert_str_eq(r->kinds, "T");
    cr_assert_eq(r->malformed, 0);
    free(r);
}

Test(toolcall, hermes_multiple_and_string_arguments) {
    const char *text = "Let me check both.\n\n"
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n"
                       "</tool_call>\n"
                       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"Europe/Paris\\\"}\"}\n"
                       "</tool_call>\n"
                       "<tool_call>\n{\"name\": \"ping\"}\n</tool_call>";
    record *r = check(text, 0, NULL);
    cr_assert_str_eq(r->content, "Let me check both.");
    cr_assert_eq(r->n_calls, 3);
    cr_assert_str_eq(r->names[0], "get_weather");
    cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\",\"days\":3}");
    cr_assert_str_eq(r->names[1], "get_time");
    cr_assert_str_eq(r->args[1], "{\"tz\":\"Europe/Paris\"}");
    cr_assert_str_eq(r->names[2], "ping");
    cr_assert_str_eq(r->args[2], "{}");
    cr_assert_str_eq(r->kinds, "CTTT");
    free(r);
    /* An arguments string that is not JSON passes through unchanged; "parameters" is accepted too. */
    r = check("<tool_call>{\"name\": \"f\", \"arguments\": \"raw text\"}</tool_call>"
              "<tool_call>{\"name\": \"g\", \"parameters\": {\"q\": [1, 2]}}</tool_call>",
              0, NULL);
    cr_assert_eq(r->n_calls, 2);
    cr_assert_str_eq(r->args[0], "raw text");
    cr_assert_str_eq(r->args[1], "{\"q\":[1,2]}");
    free(r);
}

Test(toolcall, xml_form) {
    const char *text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                       "<parameter=days>\n3\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n"
                       "<parameter=opts>\n{\"units\": \"metric\"}\n</parameter>\n"
                       "<parameter=note>\nline one\nline two\n</parameter>\n"
                       "<parameter=quoted>\n\"hi\"\n</parameter>\n"
                       "<parameter=flag>\ntrue\n</parameter>\n</function>\n</tool_call>";
    record *r = check(text, 0, NULL);
    cr_assert_eq(r->n_calls, 1);
    cr_assert_str_eq(r->names[0], "get_weather");
    cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\",\"days\":3,\"zip\":75001,\"opts\":{\"units\":\"metric\"},"
                                 "\"note\":\"line one\\nline two\",\"quoted\":\"\\\"hi\\\"\",\"flag\":true}");
    free(r);

    /* With a schema, declared strings stay strings; other declared types are parsed. */
    json_error_t jerr;
    json_t *tools =
        json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                   "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                   "\"zip\":{\"type\":\"string\"},\"flag\":{\"type\":[\"string\",\"boolean\"]},"
                   "\"opts\":{\"type\":\"object\"},\"note\":{\"type\":\"string\"}}}}}]",
                   0, &jerr);
    cr_assert(tools, "%s", jerr.text);
    r = check(text, 0, tools);
    cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\",\"days\":3,\"zip\":\"75001\",\"opts\":{\"units\":\"metric\"},"
                                 "\"note\":\"line one\\nline two\",\"quoted\":\"\\\"hi\\\"\",\"flag\":true}");
    free(r);
    /* A schema for another function changes nothing. */
    const char *other =
        "<tool_call>\n<function=lookup>\n<parameter=zip>\n75001\n</parameter>\n</function>\n</tool_call>";
    r = check(other, 0, tools);
    cr_assert_str_eq(r->args[0], "{\"zip\":75001}");
    free(r);
    json_decref(tools);

    /* Only one newline is stripped each side; a missing </parameter> ends at the next tag. */
    r = check("<tool_call>\n<function=f>\n<parameter=a>\n\n x \n\n</parameter>\n<parameter=b>\n2\n"
              "<parameter=c>\nz\n</function>\n</tool_call>",
              0, NULL);
    cr_assert_str_eq(r->names[0], "f");
    cr_assert_str_eq(r->args[0], "{\"a\":\"\\n x \\n\",\"b\":2,\"c\":\"z\"}");
    free(r);
    /* No parameters. */
    r = check("<tool_call>\n<function=now>\n</function>\n</tool_call>", 0, NULL);
    cr_assert_str_eq(r->names[0], "now");
    cr_assert_str_eq(r->args[0], "{}");
    free(r);
}

Test(toolcall, reasoning_then_content_then_tool) {
    const char *text = "<think>\nThe user wants weather. I should call the tool.\n</think>\n\n"
                       "Sure, checking now.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                       "</parameter>\n</function>\n</tool_call>";
    record *r = check(text, 0, NULL);
    cr_assert_str_eq(r->reasoning, "The user wants weather. I should call the tool.");
    cr_assert_str_eq(r->content, "Sure, checking now.");
    cr_assert_str_eq(r->names[0], "get_weather");
    cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\"}");
    cr_assert_str_eq(r->kinds, "RCT");
    free(r);
    /* Text after a tool call is content again. */
    r = check("<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n\nDone.", 0, NULL);
    cr_assert_str_eq(r->content, "Done.");
    cr_assert_str_eq(r->kinds, "TC");
    free(r);
}

Test(toolcall, malformed_kept_as_text) {
    const char *bad = "Before <tool_call>\n{\"name\": \"x\", bad json}\n</tool_call> after";
    record *r = check(bad, 0, NULL);
    cr_assert_eq(r->n_calls, 0);
    cr_assert_eq(r->malformed, 1);
    cr_assert_str_eq(r->content, bad);
    free(r);
    r = check("<tool_call>\n{\"arguments\": {}}\n</tool_call>", 0, NULL); /* no name */
    cr_assert_eq(r->n_calls, 0);
    cr_assert_str_eq(r->content, "<tool_call>\n{\"arguments\": {}}\n</tool_call>");
    free(r);
    r = check("<tool_call>\nnot a call\n</tool_call>", 0, NULL);
    cr_assert_eq(r->malformed, 1);
    cr_assert_str_eq(r->content, "<tool_call>\nnot a call\n</tool_call>");
    free(r);
}

Test(toolcall, unterminated_tool_call) {
    /* Complete JSON without the closing tag still counts. */
    record *r = check("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_", 0, NULL);
    cr_assert_eq(r->n_calls, 1);
    cr_assert_str_eq(r->args[0], "{\"x\":1}");
    free(r);
    r = check("<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n", 0, NULL);
    cr_assert_eq(r->n_calls, 1);
    cr_assert_str_eq(r->args[0], "{\"x\":1}");
    free(r);
    /* Cut off mid-JSON: the text is kept. */
    r = check("ok\n<tool_call>\n{\"name\": \"f\", \"argu", 0, NULL);
    cr_assert_eq(r->n_calls, 0);
    cr_assert_str_eq(r->content, "ok<tool_call>\n{\"name\": \"f\", \"argu");
    cr_assert_eq(r->malformed, 1);
    free(r);
}

Test(toolcall, parse_all) {
    char *content, *reasoning;
    json_t *calls;
    sl_err e;
    const char *text = "<think>\nhmm\n</think>\n\nCalling.\n<tool_call>\n{\"name\": \"get_weather\", "
                       "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    cr_assert_eq(sl_tc_parse_all(SL_TC_HERMES, text, strlen(text), 0, NULL, &content, &reasoning, &calls, &e), 0);
    cr_assert_str_eq(content, "Calling.");
    cr_assert_str_eq(reasoning, "hmm");
    cr_assert_eq(json_array_size(calls), 1);
    json_t *c = json_array_get(calls, 0);
    cr_assert_str_eq(json_string_value(json_object_get(c, "name")), "get_weather");
    cr_assert_str_eq(json_string_value(json_object_get(c, "arguments")), "{\"city\":\"Paris\"}");
    free(content);
    free(reasoning);
    json_decref(calls);

    cr_assert_eq(sl_tc_parse_all(SL_TC_HERMES, "", 0, 0, NULL, &content, &reasoning, &calls, &e), 0);
    cr_assert_str_eq(content, "");
    cr_assert_str_eq(reasoning, "");
    cr_assert_eq(json_array_size(calls), 0);
    free(content);
    free(reasoning);
    json_decref(calls);
}

Test(toolcall, holds_partial_tags) {
    /* Fed piece by piece, nothing that could still be a tag is emitted early. */
    record r = {0};
    sl_tc_parser *p = sl_tc_parser_create(SL_TC_HERMES, 0, NULL);
    sl_err e;
    cr_assert_eq(sl_tc_parser_feed(p, "Hi <tool", 8, on_event, &r, &e), 0);
    cr_assert_str_eq(r.content, "Hi ");
    cr_assert_eq(sl_tc_parser_feed(p, "_ca", 3, on_event, &r, &e), 0);
    cr_assert_str_eq(r.content, "Hi ");
    cr_assert_eq(sl_tc_parser_feed(p, "x", 1, on_event, &r, &e), 0);
    cr_assert_str_eq(r.content, "Hi <tool_cax");
    cr_assert_eq(sl_tc_parser_feed(p, "\n", 1, on_event, &r, &e), 0); /* a newline waits for what follows */
    cr_assert_str_eq(r.content, "Hi <tool_cax");
    cr_assert_eq(sl_tc_parser_feed(p, "y", 1, on_event, &r, &e), 0);
    cr_assert_str_eq(r.content, "Hi <tool_cax\ny");
    cr_assert_eq(sl_tc_parser_feed(p, "\xe6\x97", 2, on_event, &r, &e), 0); /* half a character waits */
    cr_assert_str_eq(r.content, "Hi <tool_cax\ny");
    cr_assert_eq(sl_tc_parser_feed(p, "\xa5", 1, on_event, &r, &e), 0);
    cr_assert_str_eq(r.content, "Hi <tool_cax\ny日");
    cr_assert_eq(sl_tc_parser_finish(p, on_event, &r, &e), 0);
    sl_tc_parser_free(p);
}

Test(toolcall, random_markup_chunk_invariance) {
    static const char *const pieces[] = {
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<",
        "\n",
        "\n\n",
        "a",
        "b c",
        "é",
        "日本",
        "{\"name\":\"f\",\"arguments\":{\"x\":1}}",
        "<function=g>",
        "<parameter=k>",
        "\nv\n",
        "</parameter>",
        "</function>",
        "<tool",
        "</thi",
        "{",
        "}",
        "<tool_call>\n{\"name\": \"h\"}\n</tool_call>",
    };
    const int n_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    char text[1024];
    for (int rep = 0; rep < 300; rep++) {
        text[0] = 0;
        int k = 1 + (int)rnd(14);
        for (int i = 0; i < k; i++) strcat(text, pieces[rnd((size_t)n_pieces)]);
        int in_reasoning = (int)rnd(2);
        size_t all = 0, one = 1;
        record *whole = parse(text, in_reasoning, NULL, &all, 1);
        record *bytes = parse(text, in_reasoning, NULL, &one, 1);
        same(whole, bytes, "byte at a time", text);
        free(bytes);
        for (int c = 0; c < 10; c++) {
            size_t sizes[8];
            for (int i = 0; i < 8; i++) sizes[i] = 1 + rnd(6);
            record *r = parse(text, in_reasoning, NULL, sizes, 8);
            same(whole, r, "random chunks", text);
            free(r);
        }
        free(whole);
    }
}

/* ---- the formats of other model families ---- */

static json_t *weather_tools(void) {
    json_error_t jerr;
    json_t *t = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
                           "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                           "\"zip\":{\"type\":\"string\"}}}}}]",
                           0, &jerr);
    cr_assert(t, "%s", jerr.text);
    return t;
}

Test(toolcall, detect_format_from_template) {
    static const struct {
        const char *file;
        sl_tc_format fmt;
    } cases[] = {
        {"openai-gpt-oss-120b.jinja", SL_TC_HARMONY},
        {"GLM-4.6.jinja", SL_TC_GLM},
        {"deepseek-ai-DeepSeek-V3.1.jinja", SL_TC_DEEPSEEK},
        {"llama-cpp-deepseek-r1.jinja", SL_TC_DEEPSEEK},
        {"moonshotai-Kimi-K2.jinja", SL_TC_KIMI},
        {"Kimi-K2-Instruct.jinja", SL_TC_KIMI},
        {"Qwen-Qwen3-0.6B.jinja", SL_TC_HERMES},
        {"Qwen3-Coder.jinja", SL_TC_HERMES},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", SL_TC_HERMES},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "chat_templates/templates/%s", cases[i].file);
        char *path = tu_fixture(rel);
        size_t n;
        char *src = tu_slurp(path, &n);
        cr_assert_eq(sl_tc_format_detect(src), cases[i].fmt, "%s: %s", cases[i].file,
                     sl_tc_format_name(sl_tc_format_detect(src)));
        free(src);
        free(path);
    }
    cr_assert_eq(sl_tc_format_detect(NULL), SL_TC_HERMES);
    cr_assert_str_eq(sl_tc_format_tokens(SL_TC_HARMONY)[0], "<|start|>");
}

Test(toolcall, glm) {
    const char *text = "\n<think>The user wants weather.</think>\nLet me check.\n"
                       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
                       "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>zip</arg_key>\n"
                       "<arg_value>75001</arg_value>\n</tool_call>\n"
                       "<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>{\"a\": [1, 2]}</arg_value>\n</tool_call>"
                       "<tool_call>now\n</tool_call>\nDone.";
    record *r = check_fmt(SL_TC_GLM, text, 0, NULL);
    cr_assert_str_eq(r->reasoning, "The user wants weather.");
    cr_assert_str_eq(r->content, "Let me check.Done.");
    cr_assert_eq(r->n_calls, 3);
    cr_assert_str_eq(r->names[0], "get_weather");
    cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\",\"days\":3,\"zip\":75001}");
    cr_assert_str_eq(r->names[1], "search");
    cr_assert_str_eq(r->args[1], "{\"q\":{\"a\":[1,2]}}");
    cr_assert_str_eq(r->names[2], "now");
    cr_assert_str_eq(r->args[2], "{}");
    cr_assert_str_eq(r->kinds, "RCTTTC");
    free(r);
    /* values typed by the schema: a declared string stays a string */
    json_t *tools = weather_tools();
    r = check_fmt(SL_TC_GLM, text, 0, tools);
    cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\",\"days\":3,\"zip\":\"75001\"}");
    free(r);
    json_decref(tools);
    /* thinking off: the prompt closed the block; a Hermes JSON body is read too */
    r = check_fmt(SL_TC_GLM, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>", 0, NULL);
    cr_assert_str_eq(r->names[0], "f");
    cr_assert_str_eq(r->args[0], "{\"x\":1}");
    free(r);
    /* malformed: no name, a key without a value, unterminated key */
    static const char *const bad[] = {
        "<tool_call>\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>",
        "<tool_call>f\n<arg_key>k</arg_key>\n</tool_call>",
        "<tool_call>f\n<arg_key>k\n</tool_call>",
        "<tool_call>two words\nmore\n</tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = check_fmt(SL_TC_GLM, bad[i], 0, NULL);
        cr_assert_eq(r->n_calls, 0, "%s", bad[i]);
        cr_assert_eq(r->malformed, 1);
        cr_assert_str_eq(r->content, bad[i]);
        free(r);
    }
    /* unterminated at the end of output: parsed when complete enough */
    r = check_fmt(SL_TC_GLM, "<tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_c", 0, NULL);
    cr_assert_str_eq(r->args[0], "{\"k\":\"v\"}");
    free(r);
}

Test(toolcall, deepseek) {
    /* V3.1: NAME<｜tool▁sep｜>{args}, two calls, content before */
    const char *v31 = "Checking both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                      "{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>"
                      "{\"query\": \"x\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    record *r = check_fmt(SL_TC_DEEPSEEK, v31, 0, NULL);
    cr_assert_str_eq(r->content, "Checking both.");
    cr_assert_eq(r->n_calls, 2);
    cr_assert_str_eq(r->names[0], "get_weather");
    cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\"}");
    cr_assert_str_eq(r->names[1], "search");
    cr_assert_str_eq(r->args[1], "{\"query\":\"x\"}");
    cr_assert_str_eq(r->kinds, "CTT");
    cr_assert_eq(r->malformed, 0);
    free(r);
    /* V3 / R1: the prompt opened <think>; function<｜tool▁sep｜>NAME and a fenced JSON block */
    const char *v3 = "The user wants weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
                     "<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>\n"
                     "<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜>"
                     "<｜tool▁calls▁end｜>\nAfter.";
    r = check_fmt(SL_TC_DEEPSEEK, v3, 1, NULL);
    cr_assert_str_eq(r->reasoning, "The user wants weather.");
    cr_assert_eq(r->n_calls, 2);
    cr_assert_str_eq(r->names[0], "get_weather");
    cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\",\"days\":2}");
    cr_assert_str_eq(r->names[1], "now");
    cr_assert_str_eq(r->args[1], "{}");
    cr_assert_str_eq(r->content, "After.");
    cr_assert_str_eq(r->kinds, "RTTC");
    free(r);
    /* reasoning with <think> written by the model, then plain content */
    r = check_fmt(SL_TC_DEEPSEEK, "<think>\nHmm.\n</think>\n\nFour.", 0, NULL);
    cr_assert_str_eq(r->reasoning, "Hmm.");
    cr_assert_str_eq(r->content, "Four.");
    free(r);
    /* malformed: bad JSON, no separator; the call's tags stay in the text */
    const char *bad = "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{bad<｜tool▁call▁end｜>";
    r = check_fmt(SL_TC_DEEPSEEK, bad, 0, NULL);
    cr_assert_eq(r->n_calls, 0);
    cr_assert_eq(r->malformed, 1);
    cr_assert_str_eq(r->content, bad);
    free(r);
    r = check_fmt(SL_TC_DEEPSEEK, "<｜tool▁call▁begin｜>get_weather {}<｜tool▁call▁end｜>", 0, NULL);
    cr_assert_eq(r->malformed, 1);
    cr_assert_str_eq(r->content, "<｜tool▁call▁begin｜>get_weather {}<｜tool▁call▁end｜>");
    free(r);
    /* generation ended on the closing token */
    r = check_fmt(SL_TC_DEEPSEEK, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}", 0, NULL);
    cr_assert_str_eq(r->names[0], "f");
    cr_assert_str_eq(r->args[0], "{\"a\":1}");
    free(r);
}

Test(toolcall, kimi) {
    const char *text = "I'll check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                       "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>"
                       "functions.search:1<|tool_call_argument_begin|>{\"query\":\"x\"}<|tool_call_end|>"
                       "<|tool_calls_section_end|>";
    record *r = check_fmt(SL_TC_KIMI, text, 0, NULL);
    cr_assert_str_eq(r->content, "I'll check.");
    cr_assert_eq(r->n_calls, 2);
    cr_assert_str_eq(r->names[0], "get_weather");
    cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\"}");
    cr_assert_str_eq(r->names[1], "search");
    cr_assert_str_eq(r->args[1], "{\"query\":\"x\"}");
    cr_assert_str_eq(r->kinds, "CTT");
    free(r);
    /* Kimi-K2-Thinking: reasoning, a call whose id lacks the prefix, content after */
    r = check_fmt(SL_TC_KIMI,
                  "<think>Plan.</think><|tool_calls_section_begin|><|tool_call_begin|>get_v2:3"
                  "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>Then text.",
                  0, NULL);
    cr_assert_str_eq(r->reasoning, "Plan.");
    cr_assert_str_eq(r->names[0], "get_v2");
    cr_assert_str_eq(r->args[0], "{}");
    cr_assert_str_eq(r->content, "Then text.");
    cr_assert_str_eq(r->kinds, "RTC");
    free(r);
    const char *bad = "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>[1]<|tool_call_end|>";
    r = check_fmt(SL_TC_KIMI, bad, 0, NULL);
    cr_assert_eq(r->malformed, 1);
    cr_assert_str_eq(r->content, bad);
    free(r);
}

Test(toolcall, harmony) {
    record *r = check_fmt(SL_TC_HARMONY,
                          "<|channel|>analysis<|message|>User greets. Respond.<|end|><|start|>assistant"
                          "<|channel|>final<|message|>Hello! How can I help?<|return|>",
                          0, NULL);
    cr_assert_str_eq(r->reasoning, "User greets. Respond.");
    cr_assert_str_eq(r->content, "Hello! How can I help?");
    cr_assert_str_eq(r->kinds, "RC");
    free(r);
    /* reasoning then a call; <|call|> ends generation, so it may never arrive */
    const char *call = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
                       "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
    for (int with_call = 0; with_call < 2; with_call++) {
        char text[512];
        snprintf(text, sizeof text, "%s%s", call, with_call ? "<|call|>" : "");
        r = check_fmt(SL_TC_HARMONY, text, 0, NULL);
        cr_assert_str_eq(r->reasoning, "Need the weather.");
        cr_assert_str_eq(r->content, "");
        cr_assert_eq(r->n_calls, 1);
        cr_assert_str_eq(r->names[0], "get_weather");
        cr_assert_str_eq(r->args[0], "{\"city\":\"Paris\"}");
        cr_assert_str_eq(r->kinds, "RT");
        free(r);
    }
    /* the recipient in the role part, right where the prompt's "<|start|>assistant" left off */
    r = check_fmt(SL_TC_HARMONY, " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}",
                  0, NULL);
    cr_assert_str_eq(r->names[0], "get_weather");
    cr_assert_str_eq(r->args[0], "{\"city\":\"Oslo\"}");
    free(r);
    /* a preamble, two calls, then a final answer */
    r = check_fmt(SL_TC_HARMONY,
                  "<|channel|>commentary<|message|>Checking both.<|end|>"
                  "<|start|>assistant to=functions.a<|channel|>commentary json<|message|>{}<|call|>"
                  "<|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{\"x\":[1]}"
                  "<|call|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
                  0, NULL);
    cr_assert_str_eq(r->content, "Checking both.Done.");
    cr_assert_eq(r->n_calls, 2);
    cr_assert_str_eq(r->names[0], "a");
    cr_assert_str_eq(r->names[1], "b");
    cr_assert_str_eq(r->args[1], "{\"x\":[1]}");
    cr_assert_str_eq(r->kinds, "CTTC");
    free(r);
    /* a message that runs into the next header without <|end|> */
    r = check_fmt(SL_TC_HARMONY, "<|channel|>analysis<|message|>think<|start|>assistant<|channel|>final<|message|>ok",
                  0, NULL);
    cr_assert_str_eq(r->reasoning, "think");
    cr_assert_str_eq(r->content, "ok");
    free(r);
    /* malformed call: the message comes out as text */
    const char *bad = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{bad<|call|>";
    r = check_fmt(SL_TC_HARMONY, bad, 0, NULL);
    cr_assert_eq(r->n_calls, 0);
    cr_assert_eq(r->malformed, 1);
    cr_assert_str_eq(r->content, bad);
    free(r);
    /* no markup at all, lone angles and other tags: all content */
    r = check_fmt(SL_TC_HARMONY, "Just text, a < b, <|x|> and <|chan", 0, NULL);
    cr_assert_str_eq(r->content, "Just text, a < b, <|x|> and <|chan");
    cr_assert_eq(r->n_calls, 0);
    free(r);
    /* a header that never reaches <|message|> */
    r = check_fmt(SL_TC_HARMONY, "Hi<|channel|>analys", 0, NULL);
    cr_assert_str_eq(r->content, "Hi<|channel|>analys");
    free(r);
    /* unterminated final message: a held partial tag comes out as content */
    r = check_fmt(SL_TC_HARMONY, "<|channel|>final<|message|>Done <|ret", 0, NULL);
    cr_assert_str_eq(r->content, "Done <|ret");
    free(r);
}

Test(toolcall, parse_all_formats) {
    char *content, *reasoning;
    json_t *calls;
    sl_err e;
    const char *text = "<|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>final<|message|>C<|end|>"
                       "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{\"a\": 1}<|call|>";
    cr_assert_eq(sl_tc_parse_all(SL_TC_HARMONY, text, strlen(text), 0, NULL, &content, &reasoning, &calls, &e), 0);
    cr_assert_str_eq(content, "C");
    cr_assert_str_eq(reasoning, "R");
    cr_assert_eq(json_array_size(calls), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(calls, 0), "name")), "f");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(calls, 0), "arguments")), "{\"a\":1}");
    free(content);
    free(reasoning);
    json_decref(calls);
}

/* Random concatenations of a format's markup and text parse the same however they are chunked. */
static void random_pieces(sl_tc_format fmt, const char *const *pieces, int n_pieces) {
    char text[2048];
    for (int rep = 0; rep < 200; rep++) {
        text[0] = 0;
        int k = 1 + (int)rnd(14);
        for (int i = 0; i < k; i++) strcat(text, pieces[rnd((size_t)n_pieces)]);
        int in_reasoning = (int)rnd(2);
        size_t all = 0, one = 1;
        record *whole = parse_fmt(fmt, text, in_reasoning, NULL, &all, 1);
        record *bytes = parse_fmt(fmt, text, in_reasoning, NULL, &one, 1);
        same(whole, bytes, "byte at a time", text);
        free(bytes);
        for (int c = 0; c < 8; c++) {
            size_t sizes[8];
            for (int i = 0; i < 8; i++) sizes[i] = 1 + rnd(7);
            record *r = parse_fmt(fmt, text, in_reasoning, NULL, sizes, 8);
            same(whole, r, "random chunks", text);
            free(r);
        }
        free(whole);
    }
}

Test(toolcall, random_chunks_glm) {
    static const char *const pieces[] = {
        "<think>",     "</think>",
        "<tool_call>", "</tool_call>",
        "<arg_key>",   "</arg_key>",
        "<arg_value>", "</arg_value>",
        "f\n",         "k",
        "v",           "\n",
        "<",           "<arg",
        "</tool",      "é",
        "日本",        "<tool_call>g\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"};
    random_pieces(SL_TC_GLM, pieces, (int)(sizeof pieces / sizeof pieces[0]));
}

Test(toolcall, random_chunks_deepseek) {
    static const char *const pieces[] = {"<think>",
                                         "</think>",
                                         "<｜tool▁calls▁begin｜>",
                                         "<｜tool▁calls▁end｜>",
                                         "<｜tool▁call▁begin｜>",
                                         "<｜tool▁call▁end｜>",
                                         "<｜tool▁sep｜>",
                                         "function",
                                         "f\n```json\n",
                                         "{\"a\": 1}",
                                         "\n```",
                                         "\n",
                                         "<",
                                         "<｜tool",
                                         "x ",
                                         "日本",
                                         "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜>"};
    random_pieces(SL_TC_DEEPSEEK, pieces, (int)(sizeof pieces / sizeof pieces[0]));
}

Test(toolcall, random_chunks_kimi) {
    static const char *const pieces[] = {"<think>",
                                         "</think>",
                                         "<|tool_calls_section_begin|>",
                                         "<|tool_calls_section_end|>",
                                         "<|tool_call_begin|>",
                                         "<|tool_call_argument_begin|>",
                                         "<|tool_call_end|>",
                                         "functions.f:0",
                                         "{\"a\": 1}",
                                         "\n",
                                         "<|",
                                         "<|tool_call",
                                         "x ",
                                         "é"};
    random_pieces(SL_TC_KIMI, pieces, (int)(sizeof pieces / sizeof pieces[0]));
}

Test(toolcall, random_chunks_harmony) {
    static const char *const pieces[] = {"<|start|>assistant",
                                         "<|channel|>",
                                         "analysis",
                                         "final",
                                         "commentary",
                                         " to=functions.f",
                                         " <|constrain|>json",
                                         "<|message|>",
                                         "<|end|>",
                                         "<|return|>",
                                         "<|call|>",
                                         "{\"a\": 1}",
                                         "text ",
                                         "<",
                                         "<|",
                                         "<|mess",
                                         "é",
                                         "日本",
                                         "\n"};
    random_pieces(SL_TC_HARMONY, pieces, (int)(sizeof pieces / sizeof pieces[0]));
}
