#!/usr/bin/env bash
# Constrained output through the server: response_format, Ollama format, the grammar field and forced tool
# calls, on random-weight models (their free text is noise, so only the grammar makes the output valid), and
# the 400s for bad grammars and schemas.
. "$(dirname "$0")/serve_lib.sh"

start chat "$FIX/chat_model"
ASK='"messages":[{"role":"user","content":"A pet, as JSON."}],"temperature":1,"top_k":0,"top_p":1,"max_tokens":3000'
SCHEMA='{"type":"object","properties":{"name":{"type":"string","maxLength":10},"legs":{"type":"integer","minimum":0,"maximum":8},"kind":{"enum":["cat","dog"]},"tags":{"type":"array","items":{"type":"boolean"},"maxItems":3}},"required":["name","legs","kind"],"additionalProperties":false}'
# jq check of an instance of SCHEMA
VALID='type == "object" and (.name | type == "string" and length <= 10) and (.legs | type == "number" and . == floor and . >= 0 and . <= 8)
       and (.kind == "cat" or .kind == "dog") and ((.tags // []) | type == "array" and length <= 3 and all(type == "boolean"))
       and (keys - ["name", "legs", "kind", "tags"] | length == 0)'

# OpenAI json_schema (strict and not): every sample parses and validates, and ends by itself
for i in $(seq 10); do
    strict=$([ $((i % 2)) = 0 ] && echo true || echo false)
    [ "$(post /v1/chat/completions "{$ASK,\"seed\":$i,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"pet\",\"strict\":$strict,\"schema\":$SCHEMA}}}")" = 200 ] ||
        fail "json_schema: $(cat "$T/body")"
    jq -e '.choices[0].finish_reason == "stop"' "$T/body" >/dev/null || fail "sample $i did not end: $(cat "$T/body")"
    jq -r '.choices[0].message.content' "$T/body" >"$T/content"
    jq -e "$VALID" "$T/content" >/dev/null || fail "sample $i is not an instance: $(cat "$T/content")"
done
echo "ok - openai json_schema"

# json_object: any JSON object; streamed, the deltas add up to one
[ "$(post /v1/chat/completions "{$ASK,\"seed\":3,\"response_format\":{\"type\":\"json_object\"}}")" = 200 ] ||
    fail "json_object: $(cat "$T/body")"
if jq -e '.choices[0].finish_reason == "stop"' "$T/body" >/dev/null; then
    jq -r '.choices[0].message.content' "$T/body" | jq -e 'type == "object"' >/dev/null || fail "json_object: $(cat "$T/body")"
fi
curl -sN "$URL/v1/chat/completions" -d "{$ASK,\"seed\":4,\"stream\":true,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":$SCHEMA}}}" |
    grep '^data: {' | sed 's/^data: //' | jq -j '.choices[0].delta.content // ""' >"$T/streamed"
jq -e "$VALID" "$T/streamed" >/dev/null || fail "streamed json_schema: $(cat "$T/streamed")"
echo "ok - openai json_object and streaming"

# the grammar field (GBNF), on chat and on legacy completions
[ "$(post /v1/chat/completions "{$ASK,\"grammar\":\"root ::= (\\\"yes\\\" | \\\"no\\\") \\\"!\\\"\"}")" = 200 ] &&
    jq -e '.choices[0].message.content == "yes!" or .choices[0].message.content == "no!"' "$T/body" >/dev/null ||
    fail "grammar: $(cat "$T/body")"
[ "$(post /v1/completions '{"prompt":"Count:","temperature":1,"max_tokens":50,"grammar":"root ::= [0-9]{3} \".\""}')" = 200 ] &&
    jq -e '.choices[0].text | test("^[0-9]{3}[.]$")' "$T/body" >/dev/null || fail "completions grammar: $(cat "$T/body")"
echo "ok - grammar field"

# Ollama: format as a schema and "json", options.grammar
[ "$(post /api/chat "{\"model\":\"m\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":\"Pet?\"}],\"format\":$SCHEMA,\"options\":{\"temperature\":1,\"top_k\":0,\"num_predict\":3000}}")" = 200 ] ||
    fail "ollama format: $(cat "$T/body")"
jq -r '.message.content' "$T/body" | jq -e "$VALID" >/dev/null || fail "ollama format: $(cat "$T/body")"
[ "$(post /api/generate '{"model":"m","stream":false,"prompt":"Hi","options":{"temperature":1,"grammar":"root ::= \"a\" [b-c]{2}"}}')" = 200 ] &&
    jq -e '.response | test("^a[bc]{2}$")' "$T/body" >/dev/null || fail "ollama options.grammar: $(cat "$T/body")"
echo "ok - ollama format and options.grammar"

# errors name the field and what is wrong
[ "$(post /v1/chat/completions "{$ASK,\"grammar\":\"root ::= \\\"a\\\" | missing\"}")" = 400 ] &&
    jq -e '.error.param == "grammar" and (.error.message | test("missing.*never defined"))' "$T/body" >/dev/null ||
    fail "bad grammar: $(cat "$T/body")"
[ "$(post /v1/chat/completions "{$ASK,\"grammar\":\"root ::= [abc\"}")" = 400 ] &&
    jq -e '.error.message | test("line 1: unterminated character class")' "$T/body" >/dev/null || fail "bad class: $(cat "$T/body")"
[ "$(post /v1/chat/completions "{$ASK,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"strnig\"}}}}}}")" = 400 ] &&
    jq -e '.error.param == "response_format.json_schema.schema" and (.error.message | test("properties.a.type .strnig."))' "$T/body" >/dev/null ||
    fail "bad schema: $(cat "$T/body")"
[ "$(post /v1/chat/completions "{$ASK,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}")" = 400 ] &&
    jq -e '.error.param == "response_format.json_schema.schema"' "$T/body" >/dev/null || fail "schema missing: $(cat "$T/body")"
[ "$(post /v1/chat/completions "{$ASK,\"grammar\":\"root ::= \\\"a\\\"\",\"response_format\":{\"type\":\"json_object\"}}")" = 400 ] ||
    fail "grammar with response_format: $(cat "$T/body")"
[ "$(post /api/chat '{"model":"m","messages":[{"role":"user","content":"x"}],"format":{"pattern":"(?=a)"}}')" = 400 ] &&
    jq -e '.error | test("format.pattern.*lookarounds")' "$T/body" >/dev/null || fail "ollama bad format: $(cat "$T/body")"
[ "$(post /api/generate '{"model":"m","prompt":"x","options":{"grammar":"root ::= root \"a\""}}')" = 400 ] &&
    jq -e '.error | test("left-recursive")' "$T/body" >/dev/null || fail "ollama bad grammar: $(cat "$T/body")"
[ "$(post /api/generate '{"model":"m","prompt":"x","raw":true,"format":"yaml"}')" = 400 ] &&
    jq -e '.error | test("format must be")' "$T/body" >/dev/null || fail "ollama format yaml: $(cat "$T/body")"
echo "ok - errors"

# a forced tool call: the scripted model would write {"city": "Paris"}, but the arguments must follow the
# tool's schema, here one integer field
start scripted "$FIX/scripted_model"
AFTER='"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]'
TOOLS='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"days":{"type":"integer","minimum":1,"maximum":7}},"required":["days"],"additionalProperties":false}}},{"type":"function","function":{"name":"noop","parameters":{"type":"object","properties":{},"additionalProperties":false}}}]'
for tc in '"required"' '{"type":"function","function":{"name":"get_weather"}}'; do
    [ "$(post /v1/chat/completions "{$AFTER,$TOOLS,\"max_tokens\":200,\"tool_choice\":$tc}")" = 200 ] ||
        fail "forced $tc: $(cat "$T/body")"
    jq -e '.choices[0].finish_reason == "tool_calls"' "$T/body" >/dev/null || fail "forced $tc: $(cat "$T/body")"
    name=$(jq -r '.choices[0].message.tool_calls[0].function.name' "$T/body")
    args=$(jq -r '.choices[0].message.tool_calls[0].function.arguments' "$T/body")
    case $name in
    get_weather) jq -e '(keys == ["days"]) and (.days | . >= 1 and . <= 7)' <<<"$args" >/dev/null ;;
    noop) [ "$(jq -c . <<<"$args")" = '{}' ] ;;
    *) false ;;
    esac || fail "forced $tc: arguments $args of $name do not follow the schema"
done
[ "$(post /v1/chat/completions "{$AFTER,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"\$ref\":\"#/nowhere\"}}}}}],\"tool_choice\":\"required\"}")" = 400 ] &&
    jq -e '.error.param == "tools[0].function.parameters" and (.error.message | test("does not resolve"))' "$T/body" >/dev/null ||
    fail "bad tool schema: $(cat "$T/body")"
echo "ok - forced tool calls follow the parameters schema"
# a prompt that opens a reasoning block: it is closed first, so the constrained text is the content
[ "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"enable_thinking":true,"max_tokens":20,"grammar":"root ::= \"o\" \"k\"+"}')" = 200 ] &&
    jq -e '(.choices[0].message.content | test("^ok+$")) and ((.choices[0].message.reasoning_content // "") == "")' "$T/body" >/dev/null ||
    fail "grammar after an opened <think>: $(cat "$T/body")"
echo "ok - a reasoning block the prompt opened is closed before the constrained text"
echo "grammar: all checks passed"
