#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "testutil.h"
#include "text/grammar.h"
#include "text/json_schema.h"

static sl_grammar *from_schema(const char *schema) {
    json_error_t je;
    json_t *s = json_loads(schema, JSON_DECODE_ANY, &je);
    cr_assert_not_null(s, "test schema: %s", je.text);
    sl_grammar *g = NULL;
    sl_err e = {{0}};
    if (sl_json_schema_grammar(s, "schema", &g, &e)) cr_assert_fail("%s\n%s", e.msg, schema);
    json_decref(s);
    return g;
}

static void refuse(const char *schema, const char *want) {
    json_t *s = json_loads(schema, JSON_DECODE_ANY, NULL);
    cr_assert_not_null(s);
    sl_grammar *g = NULL;
    sl_err e = {{0}};
    cr_assert_eq(sl_json_schema_grammar(s, "schema", &g, &e), -1, "should be refused: %s", schema);
    cr_assert(strstr(e.msg, want), "message '%s' should contain '%s'", e.msg, want);
    json_decref(s);
}

static int matches(const sl_grammar *g, const char *s) {
    sl_err e = {{0}};
    int r = sl_grammar_match(g, s, strlen(s), &e);
    cr_assert_geq(r, 0, "%s", e.msg);
    return r;
}

static void check(const char *schema, const char *const *good, const char *const *bad) {
    sl_grammar *g = from_schema(schema);
    for (; good && *good; good++) cr_assert(matches(g, *good), "'%s' should match %s", *good, schema);
    for (; bad && *bad; bad++) cr_assert(!matches(g, *bad), "'%s' should not match %s", *bad, schema);
    sl_grammar_free(g);
}

#define S(...) ((const char *[]){__VA_ARGS__, NULL})

Test(json_schema, primitives) {
    check("{\"type\": \"string\"}", S("\"\"", "\"abc\"", "\"a\\\"b\\\\c\\n\"", "\"\\u00e9\"", "\"é\" "),
          S("abc", "\"a", "\"a\"b\"", "\"\\q\"", "\"tab\there\""));
    check("{\"type\": \"integer\"}", S("0", "-12", "123456"), S("01", "1.5", "-", "1e5", "+1"));
    check("{\"type\": \"number\"}", S("0", "-1.25", "3e10", "2.5E-3"), S(".5", "1.", "01", "NaN"));
    check("{\"type\": \"boolean\"}", S("true", "false"), S("True", "1", "null"));
    check("{\"type\": \"null\"}", S("null"), S("nul", "\"null\""));
    check("true", S("1", "\"x\"", "[1, {\"a\": null}]", "{}"), S("", "[1,]", "{a: 1}"));
    check("{\"type\": [\"string\", \"null\"]}", S("\"x\"", "null"), S("1"));
}

Test(json_schema, whitespace_is_bounded) {
    check("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}}", S("[1,2]", "[ 1, 2 ]", "[\n  1,\n  2\n]"),
          S("[1,  2]", "[\n\n1]", "[                         1]"));
}

Test(json_schema, objects) {
    const char *sch = "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": "
                      "\"string\"}, \"c\": {\"type\": \"boolean\"}}, \"required\": [\"b\"], "
                      "\"additionalProperties\": false}";
    check(sch,
          S("{\"b\": \"x\"}", "{\"a\": 1, \"b\": \"x\"}", "{\"b\": \"x\", \"c\": true}",
            "{\"a\":1,\"b\":\"\",\"c\":false}"),
          S("{}", "{\"a\": 1}", "{\"b\": \"x\", \"d\": 1}", "{\"b\": 1}", "{\"b\": \"x\",}", "{, \"b\": \"x\"}",
            "{\"c\": true, \"b\": \"x\"}"));
    /* additional properties with a schema, after the described ones */
    check("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"additionalProperties\": "
          "{\"type\": \"string\"}}",
          S("{}", "{\"a\": 1}", "{\"a\": 1, \"x\": \"y\"}", "{\"x\": \"y\", \"z\": \"w\"}"),
          S("{\"x\": 1}", "{\"a\": true}"));
    /* a bare object is any object */
    check("{\"type\": \"object\"}", S("{}", "{\"k\": [1, {\"n\": null}]}"), S("[]", "{\"k\"}"));
    /* required names not among the properties take any value */
    check("{\"required\": [\"id\"]}", S("{\"id\": 3}", "{\"id\": \"x\"}"), S("{}"));
}

Test(json_schema, arrays) {
    check("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 1, \"maxItems\": 3}",
          S("[1]", "[1, 2, 3]"), S("[]", "[1, 2, 3, 4]", "[\"a\"]"));
    check("{\"type\": \"array\", \"maxItems\": 0}", S("[]"), S("[1]"));
    check("{\"type\": \"array\", \"minItems\": 2}", S("[1, \"a\"]", "[1, 2, 3, 4, 5]"), S("[1]"));
}

Test(json_schema, strings) {
    check("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}", S("\"ab\"", "\"abc\"", "\"a\\nb\""),
          S("\"a\"", "\"abcd\""));
    check("{\"enum\": [\"red\", \"green\", 3, null]}", S("\"red\"", "\"green\"", "3", "null"), S("\"blue\"", "red"));
    check("{\"const\": {\"a\": [1, \"x\"]}}", S("{\"a\":[1,\"x\"]}"), S("{\"a\": [1, \"x\"]}", "{}"));
    check("{\"type\": \"string\", \"format\": \"date\"}", S("\"2024-02-29\""), S("\"2024-13-01\"", "\"24-01-01\""));
    check("{\"type\": \"string\", \"format\": \"date-time\"}",
          S("\"2024-02-29T12:30:00Z\"", "\"2024-02-29T23:59:59.5+01:00\""), S("\"2024-02-29 12:30:00\""));
    check("{\"type\": \"string\", \"format\": \"uuid\"}", S("\"123e4567-e89b-12d3-a456-426614174000\""),
          S("\"123e4567\""));
}

Test(json_schema, patterns) {
    check("{\"type\": \"string\", \"pattern\": \"^[A-Z]{2}-\\\\d{3,4}$\"}", S("\"AB-123\"", "\"XY-9999\""),
          S("\"ab-123\"", "\"AB-12\"", "\"AB-12345\""));
    check("{\"pattern\": \"(cat|dog)s?\"}", S("\"cat\"", "\"dogs\""), S("\"cow\"", "\"cats!\""));
    /* a quote or backslash in the pattern is escaped in the JSON string */
    check("{\"pattern\": \"^a\\\"b\\\\\\\\c$\"}", S("\"a\\\"b\\\\c\""), S("\"a\"b\\c\""));
    check("{\"pattern\": \"^[^a-z]+$\"}", S("\"ABC\"", "\"1 2\"", "\"\\\"\""), S("\"abc\"", "\"\""));
    check("{\"pattern\": \"^x.y\\\\.z$\"}", S("\"x-y.z\""), S("\"x-yaz\""));
    refuse("{\"pattern\": \"(?=a)b\"}", "lookarounds");
    refuse("{\"pattern\": \"(a)\\\\1\"}", "not supported");
    refuse("{\"pattern\": \"a(b\"}", "')'");
    refuse("{\"pattern\": \"a{9,2}\"}", "n < m");
}

Test(json_schema, numbers_with_bounds) {
    check("{\"type\": \"integer\", \"minimum\": 0}", S("0", "17"), S("-1"));
    check("{\"type\": \"integer\", \"maximum\": -1}", S("-1", "-300"), S("0", "5"));
    check("{\"type\": \"integer\", \"minimum\": -2, \"maximum\": 12}", S("-2", "0", "9", "12"), S("-3", "13", "100"));
    check("{\"type\": \"integer\", \"exclusiveMinimum\": 0, \"exclusiveMaximum\": 3}", S("1", "2"), S("0", "3"));
    check("{\"type\": \"number\", \"minimum\": 0}", S("0.5", "10"), S("-0.5"));
}

Test(json_schema, combinators_and_refs) {
    check("{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\", \"maxLength\": 1}]}", S("1", "\"a\""),
          S("\"ab\"", "true"));
    check("{\"oneOf\": [{\"const\": 1}, {\"const\": 2}]}", S("1", "2"), S("3"));
    check("{\"allOf\": [{\"type\": \"boolean\"}]}", S("true"), S("1"));
    /* a recursive tree through $defs */
    const char *tree = "{\"$ref\": \"#/$defs/node\", \"$defs\": {\"node\": {\"type\": \"object\", \"properties\": "
                       "{\"v\": {\"type\": \"integer\"}, \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": "
                       "\"#/$defs/node\"}}}, \"required\": [\"v\"], \"additionalProperties\": false}}}";
    check(tree, S("{\"v\": 1}", "{\"v\": 1, \"kids\": [{\"v\": 2}, {\"v\": 3, \"kids\": []}]}"),
          S("{\"v\": 1, \"kids\": [{}]}"));
    check("{\"definitions\": {\"a\": {\"type\": \"null\"}}, \"properties\": {\"x\": {\"$ref\": "
          "\"#/definitions/a\"}}, \"required\": [\"x\"]}",
          S("{\"x\": null}"), S("{\"x\": 1}"));
}

Test(json_schema, bad_schemas) {
    refuse("{\"type\": \"strin\"}", "schema.type 'strin'");
    refuse("{\"type\": 3}", "schema.type must be");
    refuse("false", "no value can match");
    refuse("{\"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": \"x\"}}}", "schema.properties.a.minimum");
    refuse("{\"$ref\": \"#/$defs/missing\"}", "does not resolve");
    refuse("{\"$ref\": \"https://example.com/s.json\"}", "does not resolve");
    refuse("{\"enum\": []}", "schema.enum must be a non-empty array");
    refuse("{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 1}", "maxItems 1 is below minItems 3");
    refuse("{\"type\": \"string\", \"maxLength\": -1}", "schema.maxLength must be a non-negative integer");
    refuse("{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 4}", "no integer");
    refuse("{\"allOf\": [{}, {}]}", "allOf");
    refuse("{\"type\": \"array\", \"prefixItems\": [{}]}", "prefixItems");
    refuse("{\"properties\": {\"a\": 7}}", "schema.properties.a must be a schema");
}

Test(json_schema, json_object_when_no_schema) {
    sl_grammar *g = NULL;
    sl_err e = {{0}};
    cr_assert_eq(sl_json_schema_grammar(NULL, "response_format", &g, &e), 0, "%s", e.msg);
    cr_assert(matches(g, "{\"a\": [1, 2, {\"b\": \"c\"}]}"));
    cr_assert(!matches(g, "[1]"));
    cr_assert(!matches(g, "\"x\""));
    sl_grammar_free(g);
}

/* ------------------------------------------------------------ end to end on a random-weight model */

/* The test's own validator for the subset the schema below uses. */
static int validate(json_t *v, json_t *s, char *why, size_t n) {
    json_t *x;
    if ((x = json_object_get(s, "enum"))) {
        size_t i;
        json_t *c;
        json_array_foreach(x, i, c) if (json_equal(c, v)) return 1;
        snprintf(why, n, "not in enum");
        return 0;
    }
    json_t *type = json_object_get(s, "type");
    if (json_is_array(type)) {
        size_t i;
        json_t *t;
        json_array_foreach(type, i, t) {
            json_t *one = json_deep_copy(s);
            json_object_set(one, "type", t);
            int ok = validate(v, one, why, n);
            json_decref(one);
            if (ok) return 1;
        }
        return 0;
    }
    const char *t = json_string_value(type);
    if (!strcmp(t, "object")) {
        if (!json_is_object(v)) return snprintf(why, n, "not an object"), 0;
        json_t *props = json_object_get(s, "properties");
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(s, "required"), i, r) if (!json_object_get(v, json_string_value(r))) {
            snprintf(why, n, "missing required %s", json_string_value(r));
            return 0;
        }
        const char *k;
        json_t *val;
        json_object_foreach(v, k, val) {
            json_t *ps = json_object_get(props, k);
            if (!ps) return snprintf(why, n, "unexpected key %s", k), 0;
            if (!validate(val, ps, why, n)) return 0;
        }
        return 1;
    }
    if (!strcmp(t, "array")) {
        if (!json_is_array(v)) return snprintf(why, n, "not an array"), 0;
        size_t sz = json_array_size(v);
        if ((x = json_object_get(s, "minItems")) && sz < (size_t)json_integer_value(x))
            return snprintf(why, n, "too few items"), 0;
        if ((x = json_object_get(s, "maxItems")) && sz > (size_t)json_integer_value(x))
            return snprintf(why, n, "too many items"), 0;
        size_t i;
        json_t *it;
        json_array_foreach(v, i, it) if (!validate(it, json_object_get(s, "items"), why, n)) return 0;
        return 1;
    }
    if (!strcmp(t, "string")) {
        if (!json_is_string(v)) return snprintf(why, n, "not a string"), 0;
        /* length in code points */
        size_t cps = 0;
        for (const unsigned char *p = (const unsigned char *)json_string_value(v); *p; p++) cps += (*p & 0xC0) != 0x80;
        if ((x = json_object_get(s, "minLength")) && cps < (size_t)json_integer_value(x))
            return snprintf(why, n, "string too short"), 0;
        if ((x = json_object_get(s, "maxLength")) && cps > (size_t)json_integer_value(x))
            return snprintf(why, n, "string too long"), 0;
        if ((x = json_object_get(s, "pattern"))) { /* the one pattern used: ^[0-9]{5}$ */
            const char *p = json_string_value(v);
            if (strlen(p) != 5 || strspn(p, "0123456789") != 5) return snprintf(why, n, "pattern"), 0;
        }
        return 1;
    }
    if (!strcmp(t, "integer")) {
        if (!json_is_integer(v)) return snprintf(why, n, "not an integer"), 0;
        long long d = json_integer_value(v);
        if ((x = json_object_get(s, "minimum")) && d < json_integer_value(x))
            return snprintf(why, n, "below minimum"), 0;
        if ((x = json_object_get(s, "maximum")) && d > json_integer_value(x))
            return snprintf(why, n, "above maximum"), 0;
        return 1;
    }
    if (!strcmp(t, "number")) return json_is_number(v) ? 1 : (snprintf(why, n, "not a number"), 0);
    if (!strcmp(t, "boolean")) return json_is_boolean(v) ? 1 : (snprintf(why, n, "not a boolean"), 0);
    if (!strcmp(t, "null")) return json_is_null(v) ? 1 : (snprintf(why, n, "not null"), 0);
    snprintf(why, n, "unknown type %s", t);
    return 0;
}

static const char E2E_SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 12},"
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 150},"
    "\"kind\": {\"enum\": [\"cat\", \"dog\", \"robot\"]},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 8}, \"minItems\": 1, "
    "\"maxItems\": 3},"
    "\"address\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 10}, "
    "\"zip\": {\"type\": \"string\", \"pattern\": \"^[0-9]{5}$\"}}, \"required\": [\"city\"], "
    "\"additionalProperties\": false},"
    "\"active\": {\"type\": \"boolean\"},"
    "\"score\": {\"type\": [\"number\", \"null\"]}},"
    "\"required\": [\"name\", \"age\", \"kind\", \"tags\", \"address\"], \"additionalProperties\": false}";

typedef struct collect {
    char buf[16384];
    size_t n;
} collect;

static int on_text(void *ud, const char *text, size_t len) {
    collect *c = ud;
    cr_assert_lt(c->n + len, sizeof c->buf);
    memcpy(c->buf + c->n, text, len);
    c->n += len;
    c->buf[c->n] = 0;
    return 0;
}

/* 100 samples at temperature 1 from random weights: noise, so only the grammar makes them valid. */
Test(json_schema, random_model_samples_validate, .timeout = 600) {
    char *dir = tu_fixture("chat_model");
    sl_err e = {{0}};
    sl_tokenizer *tok;
    sl_model *m;
    sl_session *s;
    sl_model_opts mo = {.threads = 2, .backend = "cpu"};
    cr_assert_eq(sl_tokenizer_load(dir, &tok, &e), 0, "%s", e.msg);
    cr_assert_eq(sl_model_load(dir, &mo, &m, &e), 0, "%s", e.msg);
    cr_assert_eq(sl_session_create(m, 4096, &s, &e), 0, "%s", e.msg);
    json_t *schema = json_loads(E2E_SCHEMA, 0, NULL);
    cr_assert_not_null(schema);
    sl_grammar *g = NULL;
    cr_assert_eq(sl_json_schema_grammar(schema, "schema", &g, &e), 0, "%s", e.msg);
    const char *prompt = "<|im_start|>user\nDescribe a pet as JSON.<|im_end|>\n<|im_start|>assistant\n";
    int32_t *ids;
    int n_ids;
    cr_assert_eq(sl_tokenizer_encode(tok, prompt, strlen(prompt), 0, &ids, &n_ids, &e), 0);
    long long total_tokens = 0;
    for (int i = 0; i < 100; i++) {
        sl_gen_params p = {0};
        sl_sampler_params_default(&p.sampling);
        p.sampling.temperature = 1.0f;
        p.sampling.top_k = 0;
        p.sampling.top_p = 1.0f;
        p.sampling.min_p = 0.0f;
        p.sampling.seed = (uint64_t)i + 1;
        p.max_tokens = 3000; /* above the longest text the schema allows */
        p.grammar = g;
        sl_gen_stats st;
        collect c = {{0}, 0};
        cr_assert_eq(sl_generate(s, tok, ids, n_ids, &p, on_text, &c, &st, &e), 0, "sample %d: %s", i, e.msg);
        cr_assert_str_eq(st.finish_reason, "stop", "sample %d ended by %s: %s", i, st.finish_reason, c.buf);
        total_tokens += st.generated_tokens;
        json_error_t je;
        json_t *v = json_loads(c.buf, 0, &je);
        cr_assert_not_null(v, "sample %d does not parse (%s): %s", i, je.text, c.buf);
        char why[128] = "";
        cr_assert(validate(v, schema, why, sizeof why), "sample %d does not validate (%s): %s", i, why, c.buf);
        json_decref(v);
        if (i < 2) cr_log_info("sample %d: %s", i, c.buf);
    }
    cr_log_info("100 samples, %lld tokens", total_tokens);
    free(ids);
    sl_grammar_free(g);
    json_decref(schema);
    sl_session_free(s);
    sl_model_free(m);
    sl_tokenizer_free(tok);
    free(dir);
}
