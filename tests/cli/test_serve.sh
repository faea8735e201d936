#!/usr/bin/env bash
# sluice serve end to end: the wire formats with curl (SSE, Anthropic events, NDJSON), errors naming the field,
# auth, CORS, body limit, queue overflow, client disconnects, prefix reuse on a dense and a hybrid model, n
# choices on the hybrid (forked recurrent state), and the official OpenAI / Anthropic / Ollama JavaScript SDKs
# (tests/api) against the scripted fixture model.
. "$(dirname "$0")/serve_lib.sh"

# log_has NAME PATTERN: the server's log gets a line matching PATTERN (grep -E) within 5 s
log_has() {
    for _ in $(seq 50); do
        grep -Eq -- "$2" "$T/$1.log" && return 0
        sleep 0.1
    done
    return 1
}

S=$FIX/scripted_model
start scripted "$S" --queue 1
U=$URL
ASK='"messages":[{"role":"user","content":"Weather?"}]'
TOOLS='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]'

# health, metrics, root, CORS preflight
[ "$(curl -s "$U/health")" = '{"status":"ok"}' ] || fail "/health"
[ "$(curl -s "$U/")" = "Ollama is running" ] || fail "GET /"
curl -s -D "$T/h" -o /dev/null -X OPTIONS "$U/v1/chat/completions" -H 'Origin: http://x' \
    -H 'Access-Control-Request-Headers: authorization,content-type'
grep -qi '^HTTP/1.1 204' "$T/h" && grep -qi '^access-control-allow-origin: \*' "$T/h" &&
    grep -qi '^access-control-allow-headers: authorization,content-type' "$T/h" || { cat "$T/h"; fail "CORS preflight"; }

# OpenAI SSE: every event is one data line, chunks carry the text token by token, then [DONE]
curl -sN "$U/v1/chat/completions" -d "{\"model\":\"m\",$ASK,\"stream\":true}" >"$T/sse"
grep -v '^$' "$T/sse" | grep -qv '^data: ' && fail "SSE line without data:"
[ "$(grep -v '^$' "$T/sse" | tail -1)" = "data: [DONE]" ] || fail "SSE does not end with [DONE]"
text=$(grep '^data: {' "$T/sse" | sed 's/^data: //' | jq -j '.choices[0].delta.content // ""')
[ "$text" = "Sunny skies over Paris." ] || fail "streamed text '$text'"
[ "$(grep '^data: {' "$T/sse" | sed 's/^data: //' | jq -r '.choices[0].finish_reason // empty')" = stop ] || fail "finish"
# tool call deltas: index/id/name first, then argument fragments
curl -sN "$U/v1/chat/completions" -d "{\"model\":\"m\",$ASK,$TOOLS,\"stream\":true}" | grep '^data: {' |
    sed 's/^data: //' >"$T/tc"
jq -se 'map(.choices[0].delta.tool_calls[0]? // empty | select(.id)) | length == 1 and .[0].index == 0 and
    .[0].type == "function" and .[0].function.name == "get_weather"' "$T/tc" >/dev/null || fail "tool start delta"
args=$(jq -j '.choices[0].delta.tool_calls[0].function.arguments // ""' "$T/tc")
[ "$(echo "$args" | jq -c .)" = '{"city":"Paris"}' ] || fail "tool arguments '$args'"
jq -se 'map(.choices[0].finish_reason // empty) == ["tool_calls"]' "$T/tc" >/dev/null || fail "finish tool_calls"

# Anthropic event sequence
curl -sN "$U/v1/messages" -d "{\"model\":\"m\",\"max_tokens\":32,$ASK,\"stream\":true,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":64}}" \
    | grep '^event: ' | cut -d' ' -f2 | uniq | tr '\n' ' ' >"$T/ev"
[ "$(cat "$T/ev")" = "message_start ping content_block_start content_block_delta content_block_stop content_block_start content_block_delta content_block_stop message_delta message_stop " ] \
    || fail "anthropic events: $(cat "$T/ev")"

# Ollama NDJSON: one JSON object per line, the last one done with durations in nanoseconds
curl -sN "$U/api/chat" -d "{\"model\":\"m\",$ASK}" >"$T/nd"
jq -e . "$T/nd" >/dev/null || fail "NDJSON line is not JSON"
[ "$(jq -j '.message.content' "$T/nd")" = "Sunny skies over Paris." ] || fail "ollama text"
tail -1 "$T/nd" | jq -e '.done == true and .done_reason == "stop" and .eval_count == 4 and (.total_duration | type) == "number"' \
    >/dev/null || fail "ollama final object: $(tail -1 "$T/nd")"

# request validation: status 400 and a body naming the field
[ "$(post /v1/chat/completions '{"messages": [')" = 400 ] && grep -q 'not valid JSON' "$T/body" || fail "bad JSON"
[ "$(post /v1/chat/completions "{$ASK,\"temperature\":\"hot\"}")" = 400 ] &&
    [ "$(jq -r .error.param "$T/body")" = temperature ] || fail "temperature type: $(cat "$T/body")"
[ "$(post /v1/chat/completions '{"messages":[{"role":"robot","content":"x"}]}')" = 400 ] &&
    grep -q 'messages\[0\].role' "$T/body" || fail "bad role"
[ "$(post /v1/chat/completions "{$ASK,\"max_tokens\":100000}")" = 400 ] &&
    grep -q 'context holds 65536' "$T/body" || fail "context overflow: $(cat "$T/body")"
[ "$(post /v1/messages "{\"model\":\"m\",$ASK}")" = 400 ] && jq -e '.type == "error" and (.error.message | test("max_tokens"))' \
    "$T/body" >/dev/null || fail "anthropic missing max_tokens"
[ "$(post /api/chat "{\"model\":\"m\",$ASK,\"options\":{\"top_k\":\"x\"}}")" = 400 ] &&
    grep -q 'options.top_k' "$T/body" || fail "ollama option type"
[ "$(post /v1/nope '{}')" = 404 ] || fail "unknown route"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$U/v1/chat/completions")" = 405 ] || fail "GET on a POST route"
curl -s "$U/metrics" | grep -q '^sluice_requests_total{api="openai"} [1-9]' || fail "metrics"

# prefix reuse, dense model: the second turn prefills only its new tokens
conv1='[{"role":"user","content":"Weather?"}]'
post /v1/chat/completions "{\"messages\":$conv1}" >/dev/null
fed=$(jq '.usage.prompt_tokens + .usage.completion_tokens' "$T/body")
conv2='[{"role":"user","content":"Weather?"},{"role":"assistant","content":"Sunny skies over Paris."},{"role":"user","content":"Thanks"}]'
post /v1/chat/completions "{\"messages\":$conv2}" >/dev/null
p=$(jq .usage.prompt_tokens "$T/body") c=$(jq .usage.prompt_tokens_details.cached_tokens "$T/body")
[ "$c" = "$fed" ] && [ "$p" -gt "$c" ] || fail "dense prefix reuse: prompt $p cached $c, expected $fed"

# authentication and the body limit
start auth "$S" --api-key sekrit --max-body 2K
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] || fail "/health needs no key"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/models")" = 401 ] || fail "missing key accepted"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/models" -H 'Authorization: Bearer wrong')" = 401 ] || fail "wrong key"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/models" -H 'Authorization: Bearer sekrit')" = 200 ] || fail "bearer"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/api/tags" -H 'x-api-key: sekrit')" = 200 ] || fail "x-api-key"
# every route but /health wants the key, before it reads the body
for r in "POST /v1/chat/completions" "POST /v1/completions" "GET /v1/models" "GET /v1/models/x" "POST /v1/responses" \
    "POST /v1/messages" "POST /v1/messages/count_tokens" "POST /v1/embeddings" "POST /api/chat" "POST /api/generate" \
    "GET /api/tags" "POST /api/show" "GET /api/ps" "GET /api/version" "POST /api/embed" "POST /api/embeddings"; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -X "${r% *}" "$URL${r#* }" -d '{}')
    [ "$code" = 401 ] || fail "$r without a key: $code, expected 401"
done
big=$(head -c 4000 /dev/zero | tr '\0' a)
[ "$(curl -s -o "$T/body" -w '%{http_code}' "$URL/v1/completions" -H 'x-api-key: sekrit' -d "{\"prompt\":\"$big\"}")" = 413 ] \
    || fail "body limit"
grep -q -- '--max-body' "$T/body" || fail "413 message"

# prefix reuse on the hybrid (delta-net) model: snapshots of the recurrent state
H=$T/hybrid; mkdir -p "$H"
cp "$FIX/models/qwen3_5_moe/config.json" "$FIX/models/qwen3_5_moe/model.safetensors" "$FIX/tiny_tokenizer/"* "$H/"
start hybrid "$H" --timing
U=$URL
cmp() { jq -r '"\(.usage.prompt_tokens) \(.usage.prompt_tokens_details.cached_tokens)"' "$T/body"; }
post /v1/chat/completions "{\"messages\":$conv1,\"max_tokens\":6,\"temperature\":0}" >/dev/null
read -r p1 c1 <<<"$(cmp)"
[ "$c1" = 0 ] || fail "first request cached $c1"
# --timing: one line per finished request with its phases; no expert figures when nothing streams
n1=$(jq .usage.completion_tokens "$T/body")
log_has hybrid "^sluice serve: POST /v1/chat/completions model 'hybrid': prompt $p1 tokens \\(0 cached\\), prefill [0-9.]+ s [0-9.]+ tok/s \\| decode $n1 tokens, [0-9.]+ s [0-9.]+ tok/s \\| (length|stop)$" ||
    { cat "$T/hybrid.log"; fail "--timing: no request line"; }
grep -q '^sluice serve: timing: model load [0-9.]* s' "$T/hybrid.log" || fail "--timing: no load time"
first=$(jq -r '.choices[0].message.content' "$T/body")
# the same prompt again: resumes from the snapshot taken before its last token
post /v1/chat/completions "{\"messages\":$conv1,\"max_tokens\":6,\"temperature\":0}" >/dev/null
read -r p2 c2 <<<"$(cmp)"
[ "$c2" = $((p1 - 1)) ] || fail "hybrid repeat: prompt $p2 cached $c2"
[ "$(jq -r '.choices[0].message.content' "$T/body")" = "$first" ] || fail "greedy reply changed after a snapshot restore"
# a different last message: resumes from the snapshot, not from zero
post /v1/chat/completions '{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":"x"},{"role":"user","content":"y"}],"max_tokens":2}' >/dev/null
read -r p3 c3 <<<"$(cmp)"
[ "$c3" -gt 0 ] || fail "hybrid branch: prompt $p3 cached $c3"

# n choices on the hybrid model: each fork copies the recurrent state, so greedy choices are the n=1 reply and
# the prompt goes through the model once
post /v1/chat/completions "{\"messages\":$conv1,\"max_tokens\":6,\"temperature\":0,\"n\":3}" >/dev/null
jq -e --arg f "$first" '[.choices[].message.content] == [$f, $f, $f]' "$T/body" >/dev/null ||
    fail "hybrid greedy n=3: $(jq -c '[.choices[].message.content]' "$T/body"), n=1 '$first'"
fed0=$(curl -s "$U/metrics" | awk '$1 == "sluice_batch_tokens_total" {print $2}')
post /v1/completions '{"prompt":"A fresh prompt for two choices","max_tokens":4,"ignore_eos":true,"n":2}' >/dev/null
fed=$(($(curl -s "$U/metrics" | awk '$1 == "sluice_batch_tokens_total" {print $2}') - fed0))
read -r pn cn <<<"$(cmp)"
[ "$fed" = $((pn - cn + 2 * 3)) ] || fail "hybrid n=2 fed $fed tokens for a prompt of $pn ($cn cached)"
log_has hybrid "^sluice serve: POST /v1/completions choice 1 model 'hybrid': prompt $pn tokens" ||
    fail "--timing: no line for choice 1"

# --timing with streamed experts (CPU, a cache too small for all experts): every API's requests get the
# store's figures of prefill and decode
start streamed "$H" --backend cpu --ram 500K --timing --alias streamed
grep -q "streaming experts" "$T/streamed.log" || fail "--ram 500K did not stream the experts"
XS='prefill experts: [0-9.]+% in slots, .* read/token.* \| decode experts: [0-9.]+% in slots, .* read/token'
post /v1/completions '{"prompt":"Hi","max_tokens":3,"temperature":0}' >/dev/null
log_has streamed "POST /v1/completions model 'streamed': .*decode [0-9]+ tokens.* \| $XS" ||
    { cat "$T/streamed.log"; fail "--timing: OpenAI line with expert figures"; }
curl -sN "$URL/v1/messages" -d "{\"model\":\"m\",\"max_tokens\":2,$ASK,\"stream\":true}" >/dev/null
log_has streamed "POST /v1/messages model 'streamed': .*decode [0-9]+ tokens.* \| $XS" ||
    { cat "$T/streamed.log"; fail "--timing: Anthropic line with expert figures"; }
post /api/generate '{"model":"m","prompt":"Hi","stream":false,"options":{"num_predict":2}}' >/dev/null
log_has streamed "POST /api/generate model 'streamed': .*decode [0-9]+ tokens.* \| $XS" ||
    { cat "$T/streamed.log"; fail "--timing: Ollama line with expert figures"; }
grep -q 'prefill experts' "$T/hybrid.log" && fail "--timing: expert figures for a model that does not stream"
"$BIN" serve --help | grep -q -- "--timing" || fail "--timing not in serve --help"

# a client that disconnects mid-stream cancels its generation (the scripted model's loop never ends by itself)
U=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/scripted.log" | head -1)
curl -sN -m 0.5 "$U/v1/completions" -d '{"prompt":"<|loop|>","max_tokens":60000,"stream":true}' >"$T/cut" || true
grep -q '" la"' "$T/cut" || fail "the looping stream sent nothing"
for _ in $(seq 50); do
    curl -s "$U/metrics" | grep -q '^sluice_generations_cancelled_total [1-9]' && break
    sleep 0.1
done
curl -s "$U/metrics" | grep -q '^sluice_generations_cancelled_total [1-9]' || fail "disconnect did not cancel"
# queue of one: with one running and one waiting, more requests get 503 with Retry-After
CURLS=()
for i in 1 2 3 4 5; do
    curl -s -D "$T/q$i.h" -o /dev/null "$U/v1/completions" -d '{"prompt":"<|loop|>","max_tokens":20000}' &
    CURLS+=($!)
done
wait "${CURLS[@]}"
grep -l '^HTTP/1.1 503' "$T"/q*.h | head -1 | xargs grep -qi '^Retry-After: 1' || fail "no 503 with Retry-After"
grep -l '^HTTP/1.1 200' "$T"/q*.h | grep -q . || fail "no request served"
curl -s "$U/health" | grep -q ok || fail "server died"

# a short load run: concurrent clients on every route, some dropped mid-flight, all completed replies well formed
(cd "$SRC" && node bench/serve_load.mjs "$(grep -o 'http://127.0.0.1:[0-9]*' "$T/hybrid.log" | head -1)" 40 8) \
    || fail "load run"
curl -s "$U/health" | grep -q ok || fail "server died under load"
grep -Eq 'prefill [0-9.]+ s|timing:' "$T/scripted.log" && fail "request timings logged without --timing"

# logprobs: "off" in either spelling is accepted (tests/cli/test_logprobs.sh checks them when on)
URL=$U
[ "$(post /v1/chat/completions "{$ASK,\"logprobs\":false,\"max_tokens\":2}")" = 200 ] || fail "logprobs false"
[ "$(post /v1/completions '{"prompt":"Hi","logprobs":false,"max_tokens":2}')" = 200 ] || fail "logprobs false"

# tool_choice: after a tool result the scripted model answers in text, unless the choice forces a call, which
# the prompt then opens in the template's own syntax
URL=$U
AFTER='"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]'
[ "$(post /v1/chat/completions "{$AFTER,$TOOLS,\"tool_choice\":\"auto\"}")" = 200 ] &&
    jq -e '.choices[0].message.content == "Sunny skies over Paris."' "$T/body" >/dev/null || fail "auto after a tool result"
for tc in '"required"' '{"type":"function","function":{"name":"get_weather"}}'; do
    [ "$(post /v1/chat/completions "{$AFTER,$TOOLS,\"tool_choice\":$tc}")" = 200 ] &&
        jq -e '.choices[0].finish_reason == "tool_calls" and .choices[0].message.tool_calls[0].function.name == "get_weather"
               and (.choices[0].message.tool_calls[0].function.arguments | fromjson) == {"city": "Paris"}' "$T/body" \
        >/dev/null || fail "tool_choice $tc did not force a call: $(cat "$T/body")"
done
[ "$(post /v1/chat/completions "{$AFTER,$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}")" = 400 ] &&
    jq -e '.error.param == "tool_choice.function.name"' "$T/body" >/dev/null || fail "unknown forced tool: $(cat "$T/body")"
[ "$(post /v1/chat/completions "{$AFTER,\"tool_choice\":\"required\"}")" = 400 ] || fail "required without tools"
[ "$(post /v1/messages "{\"model\":\"m\",\"max_tokens\":30,\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"get_weather\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"sunny\"}]}],\"tools\":[{\"name\":\"get_weather\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"any\"}}")" = 200 ] &&
    jq -e '.stop_reason == "tool_use" and .content[0].type == "tool_use" and .content[0].input == {"city": "Paris"}' \
        "$T/body" >/dev/null || fail "Anthropic tool_choice any: $(cat "$T/body")"

# a GGUF file serves under its name (the folder's for model.gguf), with its chat template from the metadata
start gguf "$FIX/gguf/qwen3_moe-Q4_K_M/model.gguf"
curl -s "$URL/api/tags" | jq -e '.models[0].name == "qwen3_moe-Q4_K_M" and .models[0].details.format == "gguf"' \
    >/dev/null || fail "GGUF /api/tags: $(curl -s "$URL/api/tags")"
[ "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"ignore_eos":true}')" = 200 ] &&
    jq -e '.usage.completion_tokens == 3 and .usage.prompt_tokens > 3' "$T/body" >/dev/null ||
    fail "GGUF chat: $(cat "$T/body")"

# the official SDKs
API=$T/api; mkdir -p "$API"
cp "$SRC/tests/api/package.json" "$SRC/tests/api/package-lock.json" "$SRC/tests/api/sdk.test.mjs" "$API/"
(cd "$API" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || fail "npm ci (needs the npm registry)"
URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/scripted.log" | head -1)
(cd "$API" && node sdk.test.mjs "$URL") || fail "SDK tests"
echo "serve: all checks passed"
