/* Hostile input: every case here once crashed, hung or computed garbage. Each must now end in a clear error
 * (or the right answer) without exhausting the stack, the heap or the CPU. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/config.h"
#include "server/http.h"
#include "text/jinja.h"
#include "text/tokenizer.h"
#include "text/utf8_cut.h"

/* Renders tmpl with no variables; returns the output (caller frees) or NULL with e set. */
static char *render(const char *tmpl, sl_err *e) {
    sl_jinja *t;
    if (sl_jinja_parse(tmpl, strlen(tmpl), &t, e)) return NULL;
    char *out = NULL;
    size_t len;
    int r = sl_jinja_render(t, NULL, &out, &len, e);
    sl_jinja_free(t);
    return r ? NULL : out;
}

static void expect_error(const char *tmpl, const char *want) {
    sl_err e = {0};
    char *out = render(tmpl, &e);
    cr_expect_null(out, "expected an error from %.80s, got '%.80s'", tmpl, out ? out : "");
    free(out);
    cr_expect(strstr(e.msg, want), "%.80s: '%s' should mention '%s'", tmpl, e.msg, want);
}

static void expect_output(const char *tmpl, const char *want) {
    sl_err e = {0};
    char *out = render(tmpl, &e);
    cr_expect(out, "%.80s: %s", tmpl, e.msg);
    if (out) cr_expect_str_eq(out, want, "%.80s", tmpl);
    free(out);
}

/* prefix repeated n times, then middle, then suffix n times */
static char *nest(const char *prefix, const char *middle, const char *suffix, size_t n) {
    size_t lp = strlen(prefix), lm = strlen(middle), ls = strlen(suffix);
    char *s = malloc(n * (lp + ls) + lm + 1), *p = s;
    for (size_t i = 0; i < n; i++, p += lp) memcpy(p, prefix, lp);
    memcpy(p, middle, lm);
    p += lm;
    for (size_t i = 0; i < n; i++, p += ls) memcpy(p, suffix, ls);
    *p = 0;
    return s;
}

Test(hardening, jinja_range_length_does_not_overflow) {
    expect_error("{{ range(-9223372036854775807 - 1, 9223372036854775807, 1)|length }}", "Range too big");
    expect_error("{{ range(9223372036854775807, -9223372036854775807 - 1, -1)|length }}", "Range too big");
    expect_output("{{ range(0, 9223372036854775807, 4611686018427387904)|list }}", "[0, 4611686018427387904]");
    expect_output("{{ range(9223372036854775807, 0, -4611686018427387904)|list }}",
                  "[9223372036854775807, 4611686018427387903]");
    expect_output("{{ range(5, -5, -9223372036854775807 - 1)|list }}", "[5]");
    expect_output("{{ range(3)|list }}{{ range(10, 0, -3)|list }}", "[0, 1, 2][10, 7, 4, 1]");
}

Test(hardening, jinja_integer_division_overflow) {
    expect_error("{{ (-9223372036854775807 - 1) // -1 }}", "OverflowError");
    expect_output("{{ (-9223372036854775807 - 1) % -1 }}", "0");
    expect_output("{{ 7 // -1 }} {{ -7 % -1 }} {{ -7 // 2 }} {{ -7 % 2 }}", "-7 0 -4 1");
}

Test(hardening, jinja_checked_arithmetic) {
    expect_error("{{ 9223372036854775807 + 1 }}", "OverflowError");
    expect_error("{{ -9223372036854775807 - 2 }}", "OverflowError");
    expect_error("{{ 4294967296 * 4294967296 }}", "OverflowError");
    expect_error("{{ -(-9223372036854775807 - 1) }}", "OverflowError");
    expect_error("{{ 9223372036854775808 }}", "does not fit in 64 bits");
    expect_error("{{ 99999999999999999999999999999999999999999999999999999999999999999999999 }}", "64 bits");
    expect_output("{{ 9223372036854775807 }} {{ 3 * -4 }} {{ 1 + 2 - 5 }}", "9223372036854775807 -12 -2");
}

Test(hardening, jinja_power_is_fast_and_checked, .timeout = 60) {
    expect_error("{{ 2 ** 100000000000 }}", "OverflowError");
    expect_error("{{ 3 ** 40 }}", "OverflowError");
    expect_output("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 1 ** 9223372036854775807 }} {{ (-1) ** 9223372036854775807 }}",
                  "4611686018427387904 -9223372036854775808 1 -1");
    expect_output("{{ 0 ** 0 }} {{ 7 ** 1 }} {{ 3 ** 3 }} {{ 2 ** -1 }}", "1 7 27 0.5");
}

Test(hardening, jinja_repetition_is_bounded, .timeout = 60) {
    expect_error("{{ 'a' * 9223372036854775807 }}", "MemoryError");
    expect_error("{{ [1, 2, 3] * 4611686018427387904 }}", "MemoryError");
    expect_error("{{ 4611686018427387904 * [1, 2, 3] }}", "MemoryError");
    expect_output("{{ 'ab' * 3 }}{{ [1] * 2 }}{{ 'x' * -1 }}{{ [1] * 0 }}", "ababab[1, 1][]");
}

Test(hardening, jinja_widths_are_bounded, .timeout = 60) {
    expect_error("{{ 'x'|center(9223372036854775807) }}", "ValueError");
    expect_error("{{ 'x'|indent(9223372036854775807, true) }}", "ValueError");
    expect_error("{{ '{:99999999999999999999}'.format(1) }}", "ValueError");
    expect_output("{{ [1, 2, 3]|batch(9223372036854775807)|list }}", "[[1, 2, 3]]");
    expect_output("{{ 'x'|center(5) }}|{{ '{:>4}'.format(7) }}", "  x  |   7");
}

Test(hardening, jinja_deep_parentheses_are_an_error) {
    char *t = nest("(", "1", ")", 20000);
    char *src = malloc(strlen(t) + 8);
    sprintf(src, "{{ %s }}", t);
    expect_error(src, "nested more than");
    free(src);
    free(t);
    t = nest("(", "1", ")", 50);
    src = malloc(strlen(t) + 8);
    sprintf(src, "{{ %s }}", t);
    expect_output(src, "1");
    free(src);
    free(t);
}

Test(hardening, jinja_deep_blocks_are_an_error) {
    char *t = nest("{% if true %}", "x", "{% endif %}", 20000);
    expect_error(t, "nested more than");
    free(t);
    t = nest("{% if true %}", "x", "{% endif %}", 40);
    expect_output(t, "x");
    free(t);
}

Test(hardening, jinja_unary_chains_are_an_error) {
    for (int k = 0; k < 2; k++) {
        char *t = nest(k ? "-" : "+", "1", "", 100000);
        char *src = malloc(strlen(t) + 8);
        sprintf(src, "{{ %s }}", t);
        expect_error(src, "nested more than");
        free(src);
        free(t);
    }
    char *t = nest("not ", "1", "", 100000);
    char *src = malloc(strlen(t) + 8);
    sprintf(src, "{{ %s }}", t);
    expect_error(src, "nested more than");
    free(src);
    free(t);
    expect_output("{{ - - 1 }} {{ -+-1 }} {{ not not 1 }}", "1 1 True");
}

/* Chains the parser builds in a loop still nest in the tree; evaluation bounds them. */
Test(hardening, jinja_long_operator_chains_are_an_error) {
    char *t = nest("", "{{ 1", " + 1", 100000);
    char *src = malloc(strlen(t) + 8);
    sprintf(src, "%s }}", t);
    expect_error(src, "RecursionError");
    free(src);
    free(t);
    t = nest("", "{{ 'a'", "|lower", 100000);
    src = malloc(strlen(t) + 8);
    sprintf(src, "%s }}", t);
    expect_error(src, "RecursionError");
    free(src);
    free(t);
    t = nest("", "{{ 1", " + 1", 100);
    src = malloc(strlen(t) + 8);
    sprintf(src, "%s }}", t);
    expect_output(src, "101");
    free(src);
    free(t);
}

Test(hardening, jinja_macro_recursion_still_bounded) {
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError");
    expect_output("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ n }}{% endif %}{% endmacro %}{{ f(150)|length }}", "342");
}

/* Values nested by a loop, or a list holding itself, are walked with a bound too: printing, comparing and
 * JSON-encoding them once overflowed the stack. */
Test(hardening, jinja_deeply_nested_values) {
    const char *deep = "{% set ns = namespace(x=[], y=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
                       "{% set ns.y = [ns.y] %}{% endfor %}";
    char src[512];
    snprintf(src, sizeof src, "%s{{ ns.x|length }} {{ '[...]' in ns.x|string }}", deep);
    expect_output(src, "1 True");
    snprintf(src, sizeof src, "%s{{ ns.x|tojson }}", deep);
    expect_error(src, "RecursionError");
    /* past the bound two values compare as different, where Python would raise RecursionError */
    snprintf(src, sizeof src, "%s{{ ns.x == ns.y }} {{ ns.x == ns.x }}", deep);
    expect_output(src, "False True");
    snprintf(src, sizeof src, "%s{{ ns.x < ns.y }}", deep);
    expect_error(src, "RecursionError");
    expect_output("{{ [[1, [2]], {'a': [3]}] }} {{ [[1]] == [[1]] }} {{ [[1]] < [[2]] }}",
                  "[[1, [2]], {'a': [3]}] True True");
}

/* ---- config.json integers ---- */

/* Parses a llama config with one field set to the JSON text value; returns 0 or -1 with e set. */
static int config_with(const char *field, const char *value, sl_config *c, sl_err *e) {
    char text[512];
    snprintf(text, sizeof text,
             "{\"model_type\": \"mistral\", \"vocab_size\": 256, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
             "\"num_attention_heads\": 4, \"%s\": %s}",
             field, value);
    json_t *root = json_loads(text, 0, NULL);
    cr_assert(root, "%s", text);
    int r = sl_config_parse(root, "config.json", c, e);
    json_decref(root);
    return r;
}

static void config_rejects(const char *field, const char *value) {
    sl_config c;
    sl_err e = {0};
    cr_expect_neq(config_with(field, value, &c, &e), 0, "%s = %s was accepted", field, value);
    cr_expect(strstr(e.msg, field), "'%s' should name %s", e.msg, field);
    cr_expect(strstr(e.msg, "config.json"), "'%s' should name the file", e.msg);
    sl_config_free(&c);
}

Test(hardening, config_integers_out_of_range_are_errors) {
    config_rejects("sliding_window", "4294967300");
    config_rejects("sliding_window", "-4294967295");
    config_rejects("sliding_window", "1e19");
    config_rejects("sliding_window", "-1");
    config_rejects("sliding_window", "4096.5");
    config_rejects("sliding_window", "\"4096\"");
    config_rejects("max_position_embeddings", "1e300");
    config_rejects("intermediate_size", "2147483648");
    config_rejects("num_key_value_heads", "4294967298");
    config_rejects("head_dim", "-9223372036854775808");
    config_rejects("num_experts", "1e19");
    config_rejects("num_experts_per_tok", "-1");
    config_rejects("decoder_sparse_step", "4294967297");
    config_rejects("linear_conv_kernel_dim", "4294967300");
    config_rejects("full_attention_interval", "0");
    config_rejects("hidden_size", "4294967360");
    config_rejects("vocab_size", "1e19");
    config_rejects("rope_scaling",
                   "{\"rope_type\": \"llama3\", \"factor\": 8, \"original_max_position_embeddings\": 1e19}");
    config_rejects("quantization", "{\"bits\": 4, \"group_size\": 4294967360}");
    config_rejects("quantization", "{\"bits\": 4294967300, \"group_size\": 64}");
    config_rejects("quantization", "{\"bits\": 4, \"group_size\": 64, \"lm_head\": {\"bits\": 1e19}}");
    config_rejects("quantization", "{\"bits\": 4, \"group_size\": 64, \"lm_head\": {\"group_size\": 4294967360}}");
}

Test(hardening, config_integers_in_range_are_read) {
    sl_config c;
    sl_err e = {0};
    cr_assert_eq(config_with("sliding_window", "4096", &c, &e), 0, "%s", e.msg);
    cr_expect_eq(c.sliding_window, 4096);
    sl_config_free(&c);
    cr_assert_eq(config_with("sliding_window", "null", &c, &e), 0, "%s", e.msg);
    cr_expect_eq(c.sliding_window, 0);
    sl_config_free(&c);
    cr_assert_eq(config_with("max_position_embeddings", "32768.0", &c, &e), 0, "%s", e.msg);
    cr_expect_eq(c.max_pos, 32768);
    sl_config_free(&c);
    cr_assert_eq(config_with("num_key_value_heads", "2", &c, &e), 0, "%s", e.msg);
    cr_expect_eq(c.n_kv_heads, 2);
    cr_expect_eq(c.head_dim, 16);
    sl_config_free(&c);
}

/* ---- tokenizer ---- */

/* A vocabulary with only the byte-level characters for 'a' and 'b', no unknown token and no merges: any other
 * word maps to no ids at all (which once did pointer arithmetic on NULL; SLUICE_SANITIZE builds caught it). */
Test(hardening, bpe_word_with_no_ids) {
    const char *toks[] = {"a", "b"};
    size_t lens[] = {1, 1};
    sl_tokenizer_vocab v = {
        .where = "test", .n_tokens = 2, .tokens = toks, .token_lens = lens, .bos_id = -1, .eos_id = -1, .eot_id = -1};
    sl_tokenizer *t = NULL;
    sl_err e = {0};
    cr_assert_eq(sl_tokenizer_from_vocab(&v, &t, &e), 0, "%s", e.msg);
    const char *texts[] = {"xyz", "xyz xyz", "xy ab xy", "ab"};
    const int want[] = {0, 0, 1, 1};
    for (int round = 0; round < 2; round++) /* the second round reads the word cache */
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
            int32_t *ids = NULL;
            int n = -1;
            cr_assert_eq(sl_tokenizer_encode(t, texts[i], strlen(texts[i]), 0, &ids, &n, &e), 0, "%s", e.msg);
            cr_expect_eq(n >= 1, want[i], "'%s' gave %d ids", texts[i], n);
            free(ids);
        }
    sl_tokenizer_free(t);
}

/* ---- requests checked without a socket (the boundary the API fuzzers drive) ---- */

Test(hardening, requests_checked_without_a_connection) {
    const char *fix = getenv("SLUICE_FIXTURES");
    cr_assert(fix, "SLUICE_FIXTURES is not set");
    char model[1024];
    snprintf(model, sizeof model, "%s/scripted_model", fix);
    sv_engine g;
    sl_err e = {0};
    sv_engine_opts eo = {.model = model, .backend = "cpu", .threads = 1, .queue = 2};
    cr_assert_eq(sv_engine_init(&g, eo.queue, &e), 0, "%s", e.msg);
    cr_assert_eq(sv_engine_load(&g, &eo, &e), 0, "%s", e.msg);
    sv_server srv = {.g = &g, .o = {.max_body = 200}};
    const char *chat = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}]}";
    cr_expect_eq(sv_http_check(&srv, "POST", "/v1/chat/completions", chat, strlen(chat)), 200);
    cr_expect_eq(sv_http_check(&srv, "POST", "/api/chat", chat, strlen(chat)), 200);
    cr_expect_eq(sv_http_check(&srv, "POST", "/v1/chat/completions", "{", 1), 400);
    cr_expect_eq(sv_http_check(&srv, "POST", "/v1/chat/completions", "{\"messages\": 5}", 15), 400);
    char big[300];
    memset(big, ' ', sizeof big);
    cr_expect_eq(sv_http_check(&srv, "POST", "/v1/messages", big, sizeof big), 413);
    cr_expect_eq(sv_http_check(&srv, "GET", "/v1/chat/completions", "", 0), 405);
    cr_expect_eq(sv_http_check(&srv, "GET", "/nowhere", "", 0), 404);
    cr_expect_eq(sv_http_check(&srv, "GET", "/health", "", 0), 200);
    /* a percent-decoded URL that is not UTF-8, quoted in the 404: it was a 500 (jansson refused the message) */
    cr_expect_eq(sv_http_check(&srv, "GET", "/v1/models/\xff\xfe", "", 0), 404);
    char name[1200] = "/v1/models/"; /* a 404 message cut at 1024 bytes inside a character */
    for (size_t i = strlen(name); i + 2 < sizeof name; i += 2) memcpy(name + i, "\xc3\xa9", 3);
    cr_expect_eq(sv_http_check(&srv, "GET", name, "", 0), 404);
    sv_engine_shutdown(&g);
    sv_engine_free(&g);
}

/* ---- error messages that quote bytes which are not UTF-8 ---- */

Test(hardening, utf8_scrub) {
    struct {
        const char *in, *want;
    } cases[] = {
        {"plain", "plain"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"\xff\xfe", "??"},
        {"\xc0\xaf", "??"},           /* overlong '/' */
        {"\xe0\x80\xaf", "???"},      /* overlong, three bytes */
        {"\xed\xa0\x80", "???"},      /* a surrogate */
        {"\xf4\x90\x80\x80", "????"}, /* past U+10FFFF */
        {"ab\xe2\x82", "ab??"},       /* cut short at the end */
        {"\xe2\x82x", "??x"},         /* cut short by ASCII */
        {"\x80x\xbf", "?x?"},         /* stray continuation bytes */
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", cases[i].in);
        sl_utf8_scrub(buf);
        cr_expect_str_eq(buf, cases[i].want, "case %zu", i);
    }
    sv_error er;
    char long_name[2000];
    for (size_t i = 0; i + 2 < sizeof long_name; i += 2) memcpy(long_name + i, "\xc3\xa9", 3);
    sv_bad(&er, 404, "model\xff", "model '%s' is not served here", long_name); /* cut inside a character */
    json_t *v = json_pack("{s:s, s:s}", "message", er.msg, "param", er.param);
    cr_expect(v, "sv_bad left a message that is not UTF-8");
    json_decref(v);
}
