#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "testutil.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

static sl_grammar *compile(const char *src) {
    sl_grammar *g = NULL;
    sl_err e = {{0}};
    if (sl_grammar_parse(src, strlen(src), &g, &e)) cr_assert_fail("grammar should compile: %s\n%s", e.msg, src);
    return g;
}

/* The grammar must fail to compile with a message containing `want`. */
static void refuse(const char *src, const char *want) {
    sl_grammar *g = NULL;
    sl_err e = {{0}};
    cr_assert_eq(sl_grammar_parse(src, strlen(src), &g, &e), -1, "should not compile: %s", src);
    cr_assert_null(g);
    cr_assert(strstr(e.msg, want), "message '%s' should contain '%s'", e.msg, want);
}

static int matches(const sl_grammar *g, const char *s) {
    sl_err e = {{0}};
    int r = sl_grammar_match(g, s, strlen(s), &e);
    cr_assert_geq(r, 0, "%s", e.msg);
    return r;
}

static void yes(const char *src, const char *const *good, const char *const *bad) {
    sl_grammar *g = compile(src);
    for (; good && *good; good++) cr_assert(matches(g, *good), "'%s' should match\n%s", *good, src);
    for (; bad && *bad; bad++) cr_assert(!matches(g, *bad), "'%s' should not match\n%s", *bad, src);
    sl_grammar_free(g);
}

Test(grammar, literals_sequences_alternatives) {
    yes("root ::= \"ab\" \"c\" | \"x\"", (const char *[]){"abc", "x", NULL},
        (const char *[]){"", "ab", "abcx", "xx", "y", NULL});
    yes("root ::= greet \" \" who\ngreet ::= \"hi\" | \"hello\"\nwho ::= \"you\" | \"them\"",
        (const char *[]){"hi you", "hello them", NULL}, (const char *[]){"hi", "hello  you", "hey you", NULL});
    /* an empty alternative, a rule defined after its use, comments, alternatives on the next line */
    yes("# comment\nroot ::= a b # trailing\na ::= \"\" | \"a\"\nb ::= \"b\"\n    | \"c\"\n",
        (const char *[]){"b", "ab", "c", "ac", NULL}, (const char *[]){"a", "aab", NULL});
}

Test(grammar, repetition) {
    yes("root ::= \"a\"*", (const char *[]){"", "a", "aaaa", NULL}, (const char *[]){"b", "ab", NULL});
    yes("root ::= \"a\"+ \"b\"?", (const char *[]){"a", "aab", NULL}, (const char *[]){"", "b", "abb", NULL});
    yes("root ::= [0-9]{2,4}", (const char *[]){"12", "123", "1234", NULL}, (const char *[]){"1", "12345", "", NULL});
    yes("root ::= \"x\"{3}", (const char *[]){"xxx", NULL}, (const char *[]){"xx", "xxxx", NULL});
    yes("root ::= \"x\"{2,} \"y\"", (const char *[]){"xxy", "xxxxxxxy", NULL}, (const char *[]){"xy", "y", NULL});
    /* a repeated literal of several characters and a repeated group */
    yes("root ::= \"ab\"{2} (\"c\" | \"de\")*", (const char *[]){"abab", "ababcde", "ababdec", NULL},
        (const char *[]){"ab", "ababd", NULL});
    yes("root ::= (\"a\" | \"b\")* \"a\" \"b\"", (const char *[]){"ab", "abab", "bbab", NULL},
        (const char *[]){"a", "abba", NULL});
}

Test(grammar, classes_and_utf8) {
    yes("root ::= [a-cx] [^0-9] .", (const char *[]){"axy", "c-é", "x\xe2\x82\xac\xf0\x9f\x98\x80", NULL},
        (const char *[]){"d00", "a1b", "ax", NULL});
    /* escapes in literals and classes */
    yes("root ::= \"\\\"\\\\\\n\\t\" [\\x41-\\x43] \"\\u00e9\" [\\U0001F600]",
        (const char *[]){"\"\\\n\tB\xc3\xa9\xf0\x9f\x98\x80", NULL},
        (const char *[]){"\"\\\n\tD\xc3\xa9\xf0\x9f\x98\x80", NULL});
    /* a literal '-' at the end of a class, ']' escaped */
    yes("root ::= [a-][\\]]", (const char *[]){"a]", "-]", NULL}, (const char *[]){"b]", NULL});
    /* non-ASCII ranges are code point ranges */
    yes("root ::= [α-ω]+", (const char *[]){"αβγ", "ω", NULL}, (const char *[]){"a", "Ω", NULL});
    /* invalid UTF-8 never matches a class */
    yes("root ::= [^a]", (const char *[]){"b", NULL}, (const char *[]){"\xff", "\xc3", "\x80", NULL});
}

Test(grammar, recursion) {
    /* nested parentheses: right and middle recursion are fine */
    yes("root ::= \"(\" root \")\" | \"x\"", (const char *[]){"x", "(x)", "(((x)))", NULL},
        (const char *[]){"(x", "((x)", "()", NULL});
    yes("root ::= item (\",\" item)*\nitem ::= [0-9]+ | \"[\" root \"]\"",
        (const char *[]){"1", "1,2", "[1,[2,3]],4", NULL}, (const char *[]){"1,", "[1", ",1", NULL});
}

Test(grammar, bad_grammars) {
    refuse("", "no 'root' rule");
    refuse("a ::= \"x\"", "no 'root' rule");
    refuse("root ::= missing", "rule 'missing' is used but never defined");
    refuse("root ::= \"x\"\nroot ::= \"y\"", "defined twice");
    refuse("root \"x\"", "expected '::='");
    refuse("root ::= \"abc", "unterminated string literal");
    refuse("root ::= [abc", "unterminated character class");
    refuse("root ::= []", "empty character class");
    refuse("root ::= [z-a]", "end before its start");
    refuse("root ::= (\"a\"", "expected ')'");
    refuse("root ::= * \"a\"", "nothing before it to repeat");
    refuse("root ::= \"a\"{3,2}", "n < m");
    refuse("root ::= \"a\"{100000}", "above 10000");
    refuse("root ::= \"\\q\"", "unknown escape");
    refuse("root ::= \"\\x4\"", "hexadecimal");
    refuse("root ::= \"a\" ) \"b\"", "unexpected ')");
    refuse("root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive");
    refuse("root ::= a\na ::= b \"x\"\nb ::= \"\" | a", "left-recursive");
    refuse("root ::= (\"a\"?)*", "can match the empty string over and over");
    /* the message names the line */
    refuse("root ::= a\n\na ::= \"x\" ]", "line 3");
}

Test(grammar, ambiguity_is_bounded) {
    /* every split of a run of a's is a different parse: the stack set would explode without a bound */
    sl_grammar *g = compile("root ::= x*\nx ::= \"a\" | \"a\" \"a\" | \"a\" \"a\" \"a\" | y\ny ::= \"a\"+");
    char s[400];
    memset(s, 'a', sizeof s - 1);
    s[sizeof s - 1] = 0;
    sl_err e = {{0}};
    int r = sl_grammar_match(g, s, strlen(s), &e);
    /* either it copes within the bound, or it says why it cannot */
    if (r < 0)
        cr_assert(strstr(e.msg, "too ambiguous"), "%s", e.msg);
    else
        cr_assert_eq(r, 1);
    sl_grammar_free(g);
}

/* ------------------------------------------------------------ masks over a real vocabulary */

static sl_tokenizer *load_tok(const char *rel) {
    char *dir = tu_fixture(rel);
    sl_tokenizer *t;
    sl_err e;
    if (sl_tokenizer_load(dir, &t, &e)) cr_assert_fail("%s", e.msg);
    free(dir);
    return t;
}

/* The tokens the mask allows must be exactly those whose bytes, appended to `prefix`, keep it a prefix of a
 * sentence (checked by brute force: some completion from `completions` makes it a full match, or the
 * per-token check says so), and end-of-generation exactly when prefix is complete. */
static void check_mask(const sl_grammar *g, const sl_tokenizer *t, int V, const char *prefix) {
    sl_gvocab *v;
    sl_gconstraint *c;
    sl_err e = {{0}};
    cr_assert_eq(sl_gvocab_create(t, V, &v, &e), 0, "%s", e.msg);
    cr_assert_eq(sl_gconstraint_init(g, v, &c, &e), 0, "%s", e.msg);
    /* feed the prefix token by token */
    int32_t *ids;
    int n;
    cr_assert_eq(sl_tokenizer_encode(t, prefix, strlen(prefix), 0, &ids, &n, &e), 0);
    for (int i = 0; i < n; i++) cr_assert_eq(sl_gconstraint_accept(c, ids[i], &e), 0, "token %d: %s", i, e.msg);
    free(ids);
    uint8_t *m = malloc((size_t)V);
    int count = sl_gconstraint_mask(c, m, &e);
    cr_assert_geq(count, 0, "%s", e.msg);
    int seen = 0;
    for (int id = 0; id < V; id++) {
        int a = sl_gconstraint_allows(c, id, &e);
        cr_assert_geq(a, 0);
        cr_assert_eq(m[id], a, "token %d ('%s') mask %d vs walk %d after '%s'", id, sl_tokenizer_piece(t, id), m[id], a,
                     prefix);
        seen += m[id];
    }
    cr_assert_eq(seen, count);
    free(m);
    sl_gconstraint_free(c);
    sl_gvocab_free(v);
}

Test(grammar, mask_tiny_vocab) {
    sl_tokenizer *t = load_tok("tiny_tokenizer");
    int V = 512; /* the fixture models' padded vocabulary */
    sl_grammar *g = compile("root ::= \"the \" [a-z]+ (\", \" [a-z]+)* \".\"");
    check_mask(g, t, V, "");
    check_mask(g, t, V, "the ");
    check_mask(g, t, V, "the robot");
    check_mask(g, t, V, "the robot, sea");

    /* what is and is not allowed, by piece */
    sl_gvocab *v;
    sl_gconstraint *c;
    sl_err e = {{0}};
    cr_assert_eq(sl_gvocab_create(t, V, &v, &e), 0);
    cr_assert_eq(sl_gconstraint_init(g, v, &c, &e), 0);
    int id_t = sl_tokenizer_token_id(t, "t"), id_he = sl_tokenizer_token_id(t, "he"),
        id_a = sl_tokenizer_token_id(t, "a"), id_end = sl_tokenizer_token_id(t, "<|im_end|>"),
        id_start = sl_tokenizer_token_id(t, "<|im_start|>");
    cr_assert(id_t >= 0 && id_he >= 0 && id_a >= 0 && id_end >= 0 && id_start >= 0);
    cr_assert_eq(sl_gconstraint_allows(c, id_t, &e), 1);
    cr_assert_eq(sl_gconstraint_allows(c, id_a, &e), 0);
    cr_assert_eq(sl_gconstraint_allows(c, id_end, &e), 0, "end of generation before the grammar can end");
    cr_assert_eq(sl_gconstraint_allows(c, id_start, &e), 0, "special tokens are never text");
    cr_assert_eq(sl_gconstraint_allows(c, 500, &e), 0, "padding ids spell nothing");
    cr_assert_eq(sl_gconstraint_accept(c, id_a, &e), -1);
    cr_assert(strstr(e.msg, "not allowed"), "%s", e.msg);
    /* "the" "Ġrobot" "." then the end */
    const char *steps[] = {"t", "he", "Ġrobot", "."};
    for (int i = 0; i < 4; i++) {
        int id = sl_tokenizer_token_id(t, steps[i]);
        cr_assert_geq(id, 0, "%s", steps[i]);
        cr_assert_eq(sl_gconstraint_done(c), 0);
        cr_assert_eq(sl_gconstraint_accept(c, id, &e), 0, "%s: %s", steps[i], e.msg);
    }
    cr_assert_eq(sl_gconstraint_can_end(c), 1);
    cr_assert_eq(sl_gconstraint_done(c), 1);
    uint8_t m[512];
    cr_assert_eq(sl_gconstraint_mask(c, m, &e), 1, "only the end of generation is left");
    cr_assert_eq(m[id_end], 1);
    /* logits: disallowed ones at -inf */
    float logits[512];
    for (int i = 0; i < 512; i++) logits[i] = 1.0f;
    cr_assert_eq(sl_gconstraint_apply(c, logits, &e), 1);
    cr_assert_eq(logits[id_end], 1.0f);
    cr_assert(isinf(logits[id_t]) && logits[id_t] < 0);
    sl_gconstraint_free(c);
    sl_gvocab_free(v);
    sl_grammar_free(g);
    sl_tokenizer_free(t);
}

Test(grammar, mask_utf8_split_tokens) {
    /* byte tokens that stop inside a character are allowed when some completion fits the class */
    sl_tokenizer *t = load_tok("tiny_tokenizer");
    sl_grammar *g = compile("root ::= [é-ê] \"!\"");
    check_mask(g, t, 512, "");
    sl_gvocab *v;
    sl_gconstraint *c;
    sl_err e = {{0}};
    cr_assert_eq(sl_gvocab_create(t, 512, &v, &e), 0);
    cr_assert_eq(sl_gconstraint_init(g, v, &c, &e), 0);
    int32_t *ids;
    int n;
    cr_assert_eq(sl_tokenizer_encode(t, "é", strlen("é"), 0, &ids, &n, &e), 0);
    cr_assert_eq(n, 2, "é is two byte tokens in the tiny vocabulary");
    cr_assert_eq(sl_gconstraint_allows(c, ids[0], &e), 1, "0xC3 can begin é");
    cr_assert_eq(sl_gconstraint_accept(c, ids[0], &e), 0);
    cr_assert_eq(sl_gconstraint_can_end(c), 0);
    cr_assert_eq(sl_gconstraint_allows(c, ids[1], &e), 1);
    int32_t o_bytes[2];
    int32_t *o;
    int no;
    cr_assert_eq(sl_tokenizer_encode(t, "ó", strlen("ó"), 0, &o, &no, &e), 0);
    o_bytes[1] = o[1];
    cr_assert_eq(sl_gconstraint_allows(c, o_bytes[1], &e), 0, "0xC3 0xB3 is ó, outside the class");
    free(o);
    free(ids);
    sl_gconstraint_free(c);
    sl_gvocab_free(v);
    sl_grammar_free(g);
    sl_tokenizer_free(t);
}

/* A 150k-token vocabulary: the mask agrees with the per-token walk, in and out of JSON strings. */
Test(grammar, mask_real_vocab) {
    char *dir = tu_tmpdir(), cmd[4096];
    char *src = tu_fixture("tokenizers/qwen3");
    snprintf(cmd, sizeof cmd,
             "xz -dc '%s/tokenizer.json.xz' > '%s/tokenizer.json' && cp '%s/tokenizer_config.json' '%s/'", src, dir,
             src, dir);
    cr_assert_eq(system(cmd), 0);
    sl_tokenizer *t;
    sl_err e;
    cr_assert_eq(sl_tokenizer_load(dir, &t, &e), 0, "%s", e.msg);
    sl_grammar *g = compile("root ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws str ws \"}\"\n"
                            "str ::= \"\\\"\" ([^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\nt])* \"\\\"\"\n"
                            "ws ::= [ \\n]{0,3}");
    int V = sl_tokenizer_vocab_size(t);
    check_mask(g, t, V, "");
    check_mask(g, t, V, "{\"name\": \"caf");
    check_mask(g, t, V, "{\"name\": \"a\"");
    sl_grammar_free(g);
    sl_tokenizer_free(t);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    free(dir);
    free(src);
}

Test(grammar, overlong_and_invalid_utf8) {
    /* 0xC1 0xBB would be '{' in an overlong form; 0xE0 0x81 0xBB too; surrogates are not characters */
    yes("root ::= [^a]", (const char *[]){"\xc3\xa9", NULL},
        (const char *[]){"\xc1\xbb", "\xe0\x81\xbb", "\xed\xa0\x80", "\xf4\x90\x80\x80", NULL});
    sl_tokenizer *t = load_tok("tiny_tokenizer");
    sl_grammar *g = compile("root ::= \"{\" [a-z]* \"}\"");
    sl_gvocab *v;
    sl_gconstraint *c;
    sl_err e = {{0}};
    cr_assert_eq(sl_gvocab_create(t, 512, &v, &e), 0);
    cr_assert_eq(sl_gconstraint_init(g, v, &c, &e), 0);
    uint8_t m[512];
    cr_assert_eq(sl_gconstraint_mask(c, m, &e), 1, "only '{' (no lead byte of an overlong '{')");
    cr_assert_eq(m[sl_tokenizer_token_id(t, "{")], 1);
    sl_gconstraint_free(c);
    sl_grammar_free(g);
    /* a token ending in 0xED 0xA0 could only become a surrogate: not allowed, so generation cannot get stuck */
    g = compile("root ::= [^a]+");
    cr_assert_eq(sl_gconstraint_init(g, v, &c, &e), 0);
    int32_t ed = -1, a0 = -1;
    for (int id = 0; id < 448; id++) {
        size_t l;
        const char *b = sl_tokenizer_token_bytes(t, id, &l);
        if (b && l == 1 && (unsigned char)b[0] == 0xED) ed = id;
        if (b && l == 1 && (unsigned char)b[0] == 0xA0) a0 = id;
    }
    cr_assert(ed >= 0 && a0 >= 0);
    cr_assert_eq(sl_gconstraint_accept(c, ed, &e), 0, "%s", e.msg);
    cr_assert_eq(sl_gconstraint_allows(c, a0, &e), 0);
    sl_gconstraint_free(c);
    sl_gvocab_free(v);
    sl_grammar_free(g);
    sl_tokenizer_free(t);
}
