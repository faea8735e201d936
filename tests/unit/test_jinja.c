/* Focused tests of the Jinja language. Expected strings were produced by Python Jinja2 3.1 configured as
 * transformers configures it (sandboxed, trim_blocks, lstrip_blocks, loopcontrols, do, its tojson). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja.h"

typedef struct {
    const char *tmpl, *vars, *want; /* want NULL: Jinja2 raised */
} jcase;

/* 2026-11-21 12:00 UTC, for strftime_now */
static const time_t fixed_now = 1795262400;

static int render(const char *tmpl, const char *vars, char **out, sl_err *e) {
    sl_jinja *t;
    if (sl_jinja_parse(tmpl, strlen(tmpl), &t, e)) return -1;
    json_t *v = json_loads(vars, 0, NULL);
    cr_assert(v, "bad vars json: %s", vars);
    size_t len;
    int r = sl_jinja_render_at(t, v, fixed_now, out, &len, e);
    if (!r) cr_assert_eq(len, strlen(*out));
    json_decref(v);
    sl_jinja_free(t);
    return r;
}

static void run_cases(const jcase *cs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char *out = NULL;
        sl_err e = {0};
        int r = render(cs[i].tmpl, cs[i].vars, &out, &e);
        if (cs[i].want) {
            cr_expect_eq(r, 0, "%s: %s", cs[i].tmpl, e.msg);
            if (!r) cr_expect_str_eq(out, cs[i].want, "template: %s", cs[i].tmpl);
        } else
            cr_expect_neq(r, 0, "expected an error: %s", cs[i].tmpl);
        free(out);
    }
}

#define RUN(arr) run_cases(arr, sizeof arr / sizeof arr[0])

static const jcase whitespace_cases[] = {
    {"x\n  {% raw %}\nR\n{% endraw -%}\n", "{}", "x\n\nR\n"},
    {"\n{% raw -%}\nR \n {%- endraw -%}  \n{#- c -#} {%- raw %}\nR \n {%- endraw -%}", "{}", "\nR\nR"},
    {" \t{%+ raw %}\n\nR  {% endraw %} a", "{}", " \t\n\nR   a"},
    {"{% if true %}\n  {% raw -%}\n  R\n  {% endraw %}\n{% endif %}", "{}", "R\n"},
    {"a  {{- ' b ' -}}  c", "{}", "a b c"},
    {"  {% if true %}\n  x\n  {% endif %}\ny", "{}", "  x\ny"},
    {"x {% if true %} y {% endif %} z", "{}", "x  y  z"},
    {"{# c #}\n  {# d #}\nq", "{}", "q"},
    {"a\n{%- if 1 %}b{% endif -%}\n\nc", "{}", "abc"},
    {"{%+ if true %}  keep{% endif %}", "{}", "  keep"},
    {"{{ 1 }}\n{% for i in [1,2] %}\n  - {{ i }}\n{% endfor %}\n", "{}", "1\n  - 1\n  - 2\n"},
    {"a\r\nb\r\n{% if true %}\r\nc{% endif %}\n", "{}", "a\nb\nc"},
    {"{% raw %}{{ not parsed }}{% endraw %}\nafter", "{}", "{{ not parsed }}after"},
    {"{%- set x -%}\n  inner  \n{%- endset -%}\n[{{ x }}]", "{}", "[inner]"},
    {"  {{ 'a' }}  {% if true %}\n  x{% endif %}", "{}", "  a    x"},
    {"{% macro m() -%}\n  body\n{%- endmacro %}\n[{{ m() }}]", "{}", "[body]"},
};
static const jcase loops_cases[] = {
    {"{% for i in [1,1,2,2,1] %}{{ loop.changed(i) }}{% endfor %}", "{}", "TrueFalseTrueFalseTrue"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role[0] }}{% endfor %}",
     "{\"messages\": [{\"role\": \"system\"}, {\"role\": \"user\"}, {\"role\": \"assistant\"}]}", "1u2a"},
    {"{% for a, b in [[1,2],[3,4]] %}{{a}}{{b}};{% endfor %}", "{}", "12;34;"},
    {"{% for k, v in d.items() %}{{k}}={{v}},{% endfor %}", "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1,a=2,"},
    {"{% for x in [1,2,3,4] if x is even %}{{loop.index}}/{{loop.length}}:{{x}} {% endfor %}", "{}", "1/2:2 2/2:4 "},
    {"{% for x in [] %}a{% else %}empty{% endfor %}", "{}", "empty"},
    {"{% for x in 'abc' %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{% "
     "endfor %}",
     "{}", "032TrueFalse121FalseFalse210FalseTrue"},
    {"{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", "{}", "-2;1-3;2-;"},
    {"{% for x in [1,2,3] %}{{ loop.cycle('a','b') }}{% endfor %}", "{}", "aba"},
    {"{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{{x}}{% endfor %}", "{}", "012"},
    {"{% for x in range(5) %}{% if x is odd %}{% continue %}{% endif %}{{x}}{% endfor %}", "{}", "024"},
    {"{% for i in range(2) %}{% for j in range(2) %}{{ loop.index }}{{ i }}{% endfor %}{% endfor %}", "{}", "10201121"},
    {"{% for x in undefined_thing %}a{% else %}b{% endfor %}", "{}", "b"},
};
static const jcase scoping_cases[] = {
    {"{% with a = 1, b = 2 %}{{ a }}{{ b }}{% endwith %}[{{ a }}]", "{}", "12[]"},
    {"{% set x | upper %}abc{% endset %}{{ x }}", "{}", "ABC"},
    {"{% if false %}{{ 1 | nosuch }}{% endif %}unknown filters under an if fail only when reached", "{}",
     "unknown filters under an if fail only when reached"},
    {"{% set x = 0 %}{% for i in range(3) %}{% set x = x + 1 %}{{x}}{% endfor %}{{x}}", "{}", "1110"},
    {"{% set ns = namespace(c=0) %}{% for i in range(3) %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }}", "{}", "3"},
    {"{% for i in range(3) %}{% if i==1 %}{% set y = 5 %}{% endif %}{{y}}{% endfor %}", "{}", "5"},
    {"{% if true %}{% set z = 3 %}{% endif %}{{ z }}", "{}", "3"},
    {"{% macro m(a, b='d') %}[{{a}}|{{b}}|{{g}}]{% endmacro %}{% set g = 'G' %}{{ m(1) }}{{ m(1, b=2) }}{{ m(b=3, a=4) "
     "}}",
     "{}", "[1|d|G][1|2|G][4|3|G]"},
    {"{% macro outer() %}<{{ caller(5) }}>{% endmacro %}{% call(v) outer() %}i{{v}}{% endcall %}", "{}", "<i5>"},
    {"{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n-1) }}{% endif %}{% endmacro %}{{ r(3) }}", "{}", "321"},
    {"{% filter upper %}hello {{ 'x' }}{% endfilter %}", "{}", "HELLO X"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}", "{}", "12"},
    {"{% for x in [1,2] %}{% set outer = x %}{% endfor %}[{{ outer }}]", "{}", "[]"},
};
static const jcase values_cases[] = {
    {"{{ 1.0 // 0.1 }} {{ -7.5 % 2 }} {{ 1e3 is even }} {{ 2.5 is divisibleby 2 }} {{ 7 | round }} {{ 7.5 | round }} "
     "{{ (5)[1:] }}|",
     "{}", "9.0 0.5 True False 7 8.0 |"},
    {"{{ none }} {{ true }} {{ false }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }}",
     "{}", "None True False 1.0 0.30000000000000004 1e+16 1000000000000000.0 0.0001 1e-05"},
    {"{{ [1, 'a', none, true, 2.5, {'k': [1]}] }} {{ ('a',) }} {{ (1, 2) }}", "{}",
     "[1, 'a', None, True, 2.5, {'k': [1]}] ('a',) (1, 2)"},
    {"{{ \"it's\" ~ [\"it's\", 'q\"', 'nl\\n'] }}", "{}", "it's[\"it's\", 'q\"', 'nl\\n']"},
    {"{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }}", "{}", "3.5 3 -4 1 2 1024"},
    {"{{ 'a' ~ 1 ~ none ~ [1] }} {{ 'ab' * 3 }} {{ [1] + [2] }}", "{}", "a1None[1] ababab [1, 2]"},
    {"{{ '%s and %d and %r and %.2f' % ('x', 3, 'y', 2.5) }}", "{}", "x and 3 and 'y' and 2.50"},
    {"{{ 1 < 2 < 3 }} {{ (1 == 1) != (2 == 3) }} {{ 1 == 1.0 }} {{ 'a' in 'abc' }} {{ 'k' in {'k':1} }} {{ 'z' not in "
     "'abc' }}",
     "{}", "True True True True True True"},
    {"{{ 'yes' if x else 'no' }} [{{ 'a' if false }}] {{ true and 'x' }} {{ false or 'y' }}", "{\"x\": 1}",
     "yes [] x y"},
    {"{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'hello'[-2:] }} {{ [1,2,3,4][::2] }} {{ [1,2,3][-1] }} {{ "
     "'h\303\251llo'[::-1] }}",
     "{}", "el olleh lo [1, 3] 3 oll\303\251h"},
    {"{{ x[3:1:-1] }} {{ x[-100:100] }} [{{ x[9] }}]", "{\"x\": [1, 2, 3, 4, 5]}", "[4, 3] [1, 2, 3, 4, 5] []"},
    {"{{ '\346\227\245\346\234\254\350\252\236' | length }} {{ 'stra\303\237e' | upper }}", "{}", "3 STRASSE"},
};
static const jcase undefined_cases[] = {
    {"{{ m.content }} {{ m['content'] }} [{{ m.missing }}] {{ m.missing is defined }}", "{\"m\": {\"content\": \"c\"}}",
     "c c [] False"},
    {"[{{ nope }}] [{{ nope ~ 'x' }}] {{ nope | length }} {{ nope is undefined }} {{ nope | default('d') }}", "{}",
     "[] [x] 0 True d"},
    {"[{{ none.attr }}] {{ nope == nope }} {{ 1 in nope }}", "{}", "[] True False"},
};
static const jcase methods_cases[] = {
    {"{{ '{:>5}|{:<4}|{:^7}|{:*^6}|{:05d}|{:.2f}|{:+d}|{:x}|{:.1%}'.format('a', 'b', 'c', 'd', 42, 3.14159, 5, 255, "
     "0.25) }}",
     "{}", "    a|b   |   c   |**d***|00042|3.14|+5|ff|25.0%"},
    {"{{ ' a b  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'abcba'.rstrip('ab') }}", "{}", "a b|hi|abc"},
    {"{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }}", "{}",
     "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a,b', 'c']"},
    {"{{ 'Hello World'.upper() }} {{ 'hello world-foo'.title() }} {{ 'hELLO'.capitalize() }}", "{}",
     "HELLO WORLD Hello World-Foo Hello"},
    {"{{ 'aaa'.replace('a', 'b', 2) }} {{ 'abc'.find('c') }} {{ 'abcabc'.rfind('b') }} {{ 'abcabc'.count('bc') }}",
     "{}", "bba 2 4 2"},
    {"{{ '-'.join(['a', 'b']) }} {{ '{} and {}'.format(1, 'x') }} {{ 'a\\nb\\r\\nc'.splitlines() }}", "{}",
     "a-b 1 and x ['a', 'b', 'c']"},
    {"{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ d.get('a') }} {{ d.get('b') }} {{ d.get('b', "
     "'z') }}",
     "{\"d\": {\"a\": 1}}", "True True 1 None z"},
    {"{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}", "{\"d\": {\"a\": 1}}",
     "['a'] [1] [('a', 1)]"},
};
static const jcase filters_cases[] = {
    {"{{ x | tojson }}", "{\"x\": {\"a\": [1, 2.5, null, true, \"\\u00e9<\\\"\"]}}",
     "{\"a\": [1, 2.5, null, true, \"\303\251<\\\"\"]}"},
    {"{{ x | tojson(indent=2) }}", "{\"x\": {\"a\": [1, {\"b\": []}, {}], \"c\": \"d\"}}",
     "{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    },\n    {}\n  ],\n  \"c\": \"d\"\n}"},
    {"{{ [1,2] | map('string') | list | tojson }}", "{}", "[\"1\", \"2\"]"},
    {"{{ '  x  ' | trim }}|{{ 'ab' | upper }} {{ 'hello wORLD' | title }} {{ 'hELLO' | capitalize }}", "{}",
     "x|AB Hello World Hello"},
    {"{{ '' | default('d', true) }} {{ none | default('d') }} {{ [3,1,2] | first }} {{ [3,1,2] | last }}", "{}",
     "d None 3 2"},
    {"{{ [{'n':'a'},{'n':'b'}] | join('-', attribute='n') }} {{ 'abc' | list }}", "{}", "a-b ['a', 'b', 'c']"},
    {"{{ [{'a':1},{'a':2}] | map(attribute='a') | list }} {{ ['a','b'] | map('upper') | list }}", "{}",
     "[1, 2] ['A', 'B']"},
    {"{{ [1,2,3,4] | select('odd') | list }} {{ [1,2,3] | reject('equalto', 2) | list }}", "{}", "[1, 3] [1, 3]"},
    {"{{ l | selectattr('role', 'equalto', 'user') | list }} {{ l | rejectattr('role', 'eq', 'user') | "
     "map(attribute='c') | list }}",
     "{\"l\": [{\"role\": \"user\", \"c\": 1}, {\"role\": \"x\", \"c\": 0}]}", "[{'role': 'user', 'c': 1}] [0]"},
    {"{{ d | items | list }} {{ d | dictsort }} {{ d | dictsort(reverse=true) }}",
     "{\"d\": {\"b\": 2, \"A\": 3, \"a\": 1}}",
     "[('b', 2), ('A', 3), ('a', 1)] [('A', 3), ('a', 1), ('b', 2)] [('b', 2), ('A', 3), ('a', 1)]"},
    {"{{ ['b','A','a'] | sort }} {{ [3,1,2] | sort(reverse=true) }} {{ l | sort(attribute='k') }}",
     "{\"l\": [{\"k\": 2}, {\"k\": 1}]}", "['A', 'a', 'b'] [3, 2, 1] [{'k': 1}, {'k': 2}]"},
    {"{{ [1,2,1,3] | unique | list }} {{ 'aXbX' | replace('X', '-') }} {{ [1] | string }}", "{}", "[1, 2, 3] a-b- [1]"},
    {"{{ '42' | int }} {{ 'x' | int(7) }} {{ '3' | float }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }}",
     "{}", "42 7 3.0 3 2.57 2.0"},
    {"{{ '<a&b>' | e }} {{ '<x>' | safe }} {{ 'q: '|safe + '\"' }}", "{}", "&lt;a&amp;b&gt; <x> q: &#34;"},
    {"{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}", "{}",
     "a\n    b\n\n    c|  a\n  b|a\n  \n  b"},
    {"[{{ 'ab' | center(7) }}] {{ 'hello big world' | wordcount }} {{ [1,2,3] | sum }} {{ [1,5,2] | min }} {{ [1,5,2] "
     "| max }}",
     "{}", "[   ab  ] 3 6 1 5"},
    {"{{ [1,2,3,4,5] | batch(2) | list }} {{ '%s-%s' | format(1, 2) }} {{ 'abc' | reverse }} {{ [1,2] | reverse | list "
     "}}",
     "{}", "[[1, 2], [3, 4], [5]] 1-2 cba [2, 1]"},
};
static const jcase tests_cases[] = {
    {"{{ 3 is divisibleby 3 }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is mapping }}", "{}",
     "True True True True False"},
    {"{{ 'a' is iterable }} {{ 1 is iterable }} {{ [] is sequence }} {{ 1 is number }} {{ true is number }}", "{}",
     "True False True True True"},
    {"{{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ true is true }} {{ 1 is "
     "true }}",
     "{}", "True False True True True False"},
    {"{{ 3 is odd }} {{ 3 is even }} {{ 2 is eq 2 }} {{ 1 is lt 2 }} {{ 2 is ge 2 }} {{ 1 is in [1] }} {{ x is not "
     "defined }}",
     "{}", "True False True True True True True"},
};
static const jcase globals_cases[] = {
    {"{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }}", "{}",
     "[0, 1, 2] [1, 3, 5] [5, 3, 1]"},
    {"{{ dict(a=1, b=2) }} {% set ns = namespace(a=1) %}{{ ns.a }}", "{}", "{'a': 1, 'b': 2} 1"},
    {"{{ strftime_now('%Y-%m-%d %B %d') }}", "{}", "2026-11-21 November 21"},
};
static const jcase error_cases[] = {
    {"{{ ('x', 2) + [1] }}", "{}", NULL},
    {"{{ 5 | indent }}", "{}", NULL},
    {"{{ [1] in {'k': 1} }}", "{}", NULL},
    {"{{ [] > ('x',) }}", "{}", NULL},
    {"{% if false %}{% for x in [] %}{{ x | nosuch }}{% endfor %}{% endif %}ok", "{}", NULL},
    {"{% if true %}{{ 1 | nosuch }}{% endif %}ok", "{}", NULL},
    {"{% for x in none %}{% endfor %}", "{}", NULL}, /* TypeError: 'NoneType' object is not iterable */
    {"{{ 1 / 0 }}", "{}", NULL},                     /* ZeroDivisionError: division by zero */
    {"{{ 'a' + 1 }}", "{}", NULL},                   /* TypeError: can only concatenate str (not "int") to str */
    {"{{ nope.attr }}", "{}", NULL},                 /* UndefinedError: 'nope' is undefined */
    {"{{ m.missing.deeper }}", "{\"m\": {}}", NULL}, /* UndefinedError: 'dict object' has no attribute 'missing' */
    {"{{ l.append(1) }}", "{\"l\": []}",
     NULL}, /* SecurityError: access to attribute 'append' of 'list' object is unsafe */
    {"{{ [1,2] | map('string') | tojson }}", "{}",
     NULL},                              /* TypeError: Object of type generator is not JSON serializable */
    {"{{ none | length }}", "{}", NULL}, /* TypeError: object of type 'NoneType' has no len() */
    {"{% set d = {} %}{% set d.x = 1 %}", "{}",
     NULL}, /* TemplateRuntimeError: cannot assign attribute on non-namespace object */
    {"{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", "{}",
     NULL},                                   /* TypeError: macro 'm' takes not more than 1 argument(s) */
    {"{{ 'x' | nosuchfilter }}", "{}", NULL}, /* TemplateAssertionError: No filter named 'nosuchfilter'. */
    {"{% if x %}unclosed", "{}", NULL}, /* TemplateSyntaxError: Unexpected end of template. Jinja was looking for */
    {"{{ x + }}", "{}", NULL},          /* TemplateSyntaxError: unexpected 'end of print statement' */
    {"{% endfor %}", "{}", NULL},       /* TemplateSyntaxError: Encountered unknown tag 'endfor'. */
};

/* loops that would grow without bound stop at the render's memory bound with an error, not an abort */
static int render_bounded(const char *tmpl, const char *vars, sl_err *e) {
    sl_jinja *t;
    cr_assert_eq(sl_jinja_parse(tmpl, strlen(tmpl), &t, e), 0, "%s", e->msg);
    sl_jinja_set_max_bytes(t, (size_t)16 << 20);
    json_t *v = json_loads(vars, 0, NULL);
    char *out = NULL;
    int r = sl_jinja_render_at(t, v, fixed_now, &out, NULL, e);
    free(out);
    json_decref(v);
    sl_jinja_free(t);
    return r;
}

Test(jinja, render_memory_is_bounded) {
    sl_err e = {0};
    cr_assert_neq(
        render_bounded("{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}", "{}",
                       &e),
        0);
    cr_expect(strstr(e.msg, "MemoryError"), "%s", e.msg);
    cr_assert_neq(render_bounded("{% for c in s %}{% for d in s %}{% for f in s %}{{ s * 8 }}{% endfor %}{% endfor %}"
                                 "{% endfor %}",
                                 "{\"s\": \"abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz\"}", &e),
                  0);
    cr_expect(strstr(e.msg, "MemoryError"), "%s", e.msg);
    cr_assert_eq(render_bounded("{% for a in range(10) %}{{ a }}{% endfor %}", "{}", &e), 0, "%s", e.msg);
}

Test(jinja, whitespace_control) {
    RUN(whitespace_cases);
}
Test(jinja, loops) {
    RUN(loops_cases);
}
Test(jinja, scoping_and_macros) {
    RUN(scoping_cases);
}
Test(jinja, values_and_operators) {
    RUN(values_cases);
}
Test(jinja, undefined) {
    RUN(undefined_cases);
}
Test(jinja, methods) {
    RUN(methods_cases);
}
Test(jinja, filters) {
    RUN(filters_cases);
}
Test(jinja, tests) {
    RUN(tests_cases);
}
Test(jinja, globals) {
    RUN(globals_cases);
}
Test(jinja, errors) {
    RUN(error_cases);
}

Test(jinja, runtime_error_names_line) {
    char *out = NULL;
    sl_err e = {0};
    cr_assert_neq(render("a\nb\n{% if x %}\n{{ raise_exception('bad role') }}\n{% endif %}", "{\"x\": true}", &out, &e),
                  0);
    cr_expect(strstr(e.msg, "line 4"), "%s", e.msg);
    cr_expect(strstr(e.msg, "bad role"), "%s", e.msg);
    cr_assert_neq(render("ok\n\n{{ messages[0].content.x.y }}", "{\"messages\": [{}]}", &out, &e), 0);
    cr_expect(strstr(e.msg, "line 3"), "%s", e.msg);
    cr_expect(strstr(e.msg, "UndefinedError"), "%s", e.msg);
}

Test(jinja, syntax_error_names_line) {
    sl_jinja *t = NULL;
    sl_err e = {0};
    const char *src = "line one\n{% for m in messages %}\n{{ m + }}\n{% endfor %}";
    cr_assert_neq(sl_jinja_parse(src, strlen(src), &t, &e), 0);
    cr_expect(strstr(e.msg, "line 3"), "%s", e.msg);
    src = "{% if x %}\n\nnever closed";
    cr_assert_neq(sl_jinja_parse(src, strlen(src), &t, &e), 0);
    cr_expect(strstr(e.msg, "line 3"), "%s", e.msg);
}

Test(jinja, parse_once_render_many) {
    sl_jinja *t;
    sl_err e = {0};
    const char *src = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}";
    cr_assert_eq(sl_jinja_parse(src, strlen(src), &t, &e), 0, "%s", e.msg);
    for (int i = 0; i < 3; i++) {
        json_t *v = json_pack("{s:[{s:s,s:i}]}", "messages", "role", "user", "content", i);
        char *out;
        size_t len;
        cr_assert_eq(sl_jinja_render(t, v, &out, &len, &e), 0, "%s", e.msg);
        char want[32];
        snprintf(want, sizeof want, "user:%d;", i);
        cr_expect_str_eq(out, want);
        free(out);
        json_decref(v);
    }
    char *out;
    size_t len;
    cr_assert_eq(sl_jinja_render(t, NULL, &out, &len, &e), 0, "%s", e.msg); /* no variables at all */
    cr_expect_str_eq(out, "");
    free(out);
    sl_jinja_free(t);
}

Test(jinja, dict_order_is_insertion_order) {
    char *out = NULL;
    sl_err e = {0};
    cr_assert_eq(render("{{ d | tojson }}|{% for k in d %}{{ k }}{% endfor %}",
                        "{\"d\": {\"z\": 1, \"a\": 2, \"m\": 3}}", &out, &e),
                 0, "%s", e.msg);
    cr_expect_str_eq(out, "{\"z\": 1, \"a\": 2, \"m\": 3}|zam");
    free(out);
}
