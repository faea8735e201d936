#!/usr/bin/env bash
# sluice serve: the OpenAI Responses API on the wire (SSE events and their sequence, errors naming the field),
# /api/version for Codex, system messages within a conversation on a template that takes only a leading one,
# and the official SDKs (tests/api/responses.test.mjs) against the scripted fixture model.
. "$(dirname "$0")/serve_lib.sh"
# bad BODY PARAM PATTERN: /v1/responses answers 400 with error.param PARAM and a message matching PATTERN
bad() {
    [ "$(post /v1/responses "$1")" = 400 ] || fail "status $(cat "$T/body") for $1"
    jq -e --arg p "$2" --arg m "$3" '.error.type == "invalid_request_error" and .error.param == $p and
        (.error.message | test($m))' "$T/body" >/dev/null || fail "error for $1: $(cat "$T/body")"
}

start scripted "$FIX/scripted_model"

# SSE: every event is an `event:` line naming the type its data carries, sequence numbers count from 0, no [DONE]
curl -sN "$URL/v1/responses" -d '{"input":"Weather?","stream":true}' >"$T/sse"
grep -q '^data: \[DONE\]' "$T/sse" && fail "[DONE] in a Responses stream"
paste -d' ' <(grep '^event: ' "$T/sse" | cut -d' ' -f2) <(grep '^data: ' "$T/sse" | sed 's/^data: //' | jq -r .type) |
    awk '$1 != $2 { exit 1 }' || fail "event lines and data types differ"
grep '^data: ' "$T/sse" | sed 's/^data: //' | jq -s -e 'map(.sequence_number) == [range(length)]' >/dev/null ||
    fail "sequence numbers"
text=$(grep '^data: ' "$T/sse" | sed 's/^data: //' | jq -j 'select(.type == "response.output_text.delta") | .delta')
[ "$text" = "Sunny skies over Paris." ] || fail "streamed text '$text'"

# errors name the field
bad '{"input":5}' input 'input must be a string or a non-empty array'
bad '{"input":[]}' input 'non-empty array'
bad '{"input":"x","temperature":"hot"}' temperature 'must be a number, got a string'
bad '{"input":"x","max_output_tokens":"9"}' max_output_tokens 'must be an integer'
bad '{"input":"x","stream":"yes"}' stream 'must be a boolean'
bad '{"input":"x","store":1}' store 'must be a boolean'
bad '{"input":"x","metadata":[]}' metadata 'must be an object'
bad '{"input":"x","instructions":7}' instructions 'must be a string'
bad '{"input":"x","tools":{}}' tools 'must be an array'
bad '{"input":"x","reasoning":{"effort":3}}' reasoning.effort 'must be a string'
bad '{"input":"x","text":{"format":"json"}}' text.format 'must be an object'
bad '{"input":"x","text":{"format":{"type":"yaml"}}}' text.format.type 'text, json_object or json_schema'
bad '{"input":[{"role":"robot","content":"x"}]}' 'input[0].role' "got 'robot'"
bad '{"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}' 'input[0].content' 'input_image'
bad '{"input":[{"type":"function_call","name":"f"}]}' 'input[0]' 'call_id'
bad '{"input":[{"type":"function_call_output","output":"x"}]}' 'input[0]' 'call_id must be a string'
bad '{"input":[{"type":"telepathy"}]}' 'input[0]' "'telepathy' is not supported"
bad '{"input":"x","tools":[{"type":"function","function":{"name":"f"}}]}' 'tools[0]' 'flat'
bad '{"input":"x","tools":[{"type":"function","name":"f","parameters":"x"}]}' 'tools[0]' 'parameters must be an object'
bad '{"input":"x","tools":[{"type":"namespace","name":"ns"}]}' 'tools[0]' 'array of tools'
bad '{"input":"x","tool_choice":"always"}' tool_choice 'got "always"'
bad '{"input":"x","tool_choice":"required"}' tool_choice 'no function tools'
bad '{"input":"x","previous_response_id":"resp_1"}' previous_response_id 'stores no responses'
bad '{"input":"x","background":true}' background 'not supported'
bad '{"input":"x","max_output_tokens":100000}' max_output_tokens 'context holds 65536'
jq -e '.error.code == "context_length_exceeded"' "$T/body" >/dev/null || fail "overflow code: $(cat "$T/body")"

# accepted as given: store, include, user, metadata, parallel_tool_calls, hosted tools (skipped with a note)
[ "$(post /v1/responses '{"input":"x","store":true,"include":["reasoning.encrypted_content"],"user":"u",
    "metadata":{"a":"b"},"parallel_tool_calls":false,"tools":[{"type":"web_search"},{"type":"local_shell"}]}')" = 200 ] &&
    jq -e '.store == true and .metadata == {"a":"b"} and .parallel_tool_calls == false' "$T/body" >/dev/null ||
    fail "accepted fields: $(cat "$T/body")"
grep -q "tools\[0\] of type 'web_search' .*skipped" "$T/scripted.log" || fail "no log note for a hosted tool"
# a tool's output with an image (Codex's view_image) goes on as text with a note in the image's place
[ "$(post /v1/responses '{"input":[{"role":"user","content":"Look"},{"type":"function_call","call_id":"c1","name":"view_image","arguments":"{}"},
    {"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"here:"},{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}]}')" = 200 ] ||
    fail "image in a tool output: $(cat "$T/body")"

# namespaced tools (Codex's MCP tools): offered to the template as NAMESPACE.NAME
NS='"tools":[{"type":"namespace","name":"weather","description":"d","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]}]'
[ "$(post /v1/responses "{\"input\":\"Weather?\",$NS}")" = 200 ] || fail "namespace tools: $(cat "$T/body")"
[ "$(post /v1/responses "{\"input\":\"Weather?\",$NS,\"tool_choice\":\"required\"}")" = 200 ] || fail "namespace: $(cat "$T/body")"
jq -e '.output[0].type == "function_call"' "$T/body" >/dev/null || fail "namespace call: $(cat "$T/body")"

# Codex's --oss mode takes the Responses API from Ollama 0.13.4 on
v=$(curl -s "$URL/api/version" | jq -r .version)
[ "$(printf '%s\n0.13.4\n' "$v" | sort -V | head -1)" = 0.13.4 ] || fail "/api/version $v is older than 0.13.4"

# a template that takes only a leading system message: later ones are merged into it, in order
M=$T/lead; mkdir -p "$M"
cp "$FIX/chat_model/config.json" "$FIX/chat_model/model.safetensors" "$FIX/chat_model/tokenizer.json" "$M/"
jq '.chat_template = "{%- for m in messages %}{%- if m.role == \"system\" and not loop.first %}{{ raise_exception(\"System message must be at the beginning.\") }}{%- endif %}{{- \"<|im_start|>\" + m.role + \"\\n\" + m.content + \"<|im_end|>\\n\" }}{%- endfor %}{%- if add_generation_prompt %}{{- \"<|im_start|>assistant\\n\" }}{%- endif %}"' \
    "$FIX/chat_model/tokenizer_config.json" >"$M/tokenizer_config.json"
start lead "$M"
mid='"system":"S1","messages":[{"role":"user","content":"hi"},{"role":"system","content":"S2"},{"role":"user","content":"again"}]'
merged='"system":"S1\n\nS2","messages":[{"role":"user","content":"hi"},{"role":"user","content":"again"}]'
[ "$(post /v1/messages/count_tokens "{\"model\":\"m\",$mid}")" = 200 ] || fail "mid-conversation system: $(cat "$T/body")"
n_mid=$(jq .input_tokens "$T/body")
post /v1/messages/count_tokens "{\"model\":\"m\",$merged}" >/dev/null
[ "$n_mid" = "$(jq .input_tokens "$T/body")" ] || fail "system messages not merged: $n_mid against $(cat "$T/body")"
[ "$(post /v1/messages "{\"model\":\"m\",\"max_tokens\":2,$mid}")" = 200 ] || fail "generation: $(cat "$T/body")"
[ "$(post /v1/responses '{"instructions":"S1","input":[{"role":"user","content":"hi"},{"role":"developer","content":"S2"}],"max_output_tokens":2}')" = 200 ] ||
    fail "Responses developer message: $(cat "$T/body")"
# Anthropic overflow wording, and a prompt that alone exceeds the context
start small "$M" --ctx 64
[ "$(post /v1/messages '{"model":"m","max_tokens":60,"messages":[{"role":"user","content":"hi"}]}')" = 400 ] &&
    jq -e '.error.type == "invalid_request_error" and (.error.message | test("^input length and `max_tokens` exceed context limit: [0-9]+ \\+ 60 > 64, decrease input length or `max_tokens` and try again$"))' \
        "$T/body" >/dev/null || fail "Anthropic overflow: $(cat "$T/body")"
long=$(printf 'word %.0s' $(seq 100))
[ "$(post /v1/messages "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"$long\"}]}")" = 400 ] &&
    jq -e '.error.message | test("^prompt is too long: [0-9]+ tokens > 63 maximum$")' "$T/body" >/dev/null ||
    fail "Anthropic prompt too long: $(cat "$T/body")"

# the official SDKs
API=$T/api; mkdir -p "$API"
cp "$SRC/tests/api/package.json" "$SRC/tests/api/package-lock.json" "$SRC/tests/api/responses.test.mjs" "$API/"
(cd "$API" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || fail "npm ci (needs the npm registry)"
URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/scripted.log" | head -1)
(cd "$API" && node responses.test.mjs "$URL") || fail "SDK tests"
echo "responses: all checks passed"
