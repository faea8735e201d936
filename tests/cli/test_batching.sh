#!/usr/bin/env bash
# sluice serve with several requests at once (continuous batching): concurrent greedy requests give exactly
# what each gives alone, a request cancelled mid-batch leaves the others whole, conversations keep their
# cached prefixes beside each other (and a side request shares one), and a load run of 32 clients with
# random disconnects leaves the server healthy with a flat RSS. Claude Code's billing header does not defeat
# the prefix cache. Requests for n choices read the prompt once, sample each choice on its own (reproducibly
# with a seed), stream them by index, and free all their sequences when the client leaves.
. "$(dirname "$0")/serve_lib.sh"

metric() { curl -s "$URL/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

# --- concurrent requests equal the same requests alone (greedy, random-weight model) ---
start chat "$FIX/chat_model" --parallel 4 --queue 32
grep -q "4 requests at once" "$T/chat.log" || fail "ready line: $(grep ready: "$T/chat.log")"
N=7 # more than --parallel: some wait in the queue and join between steps
body() { printf '{"prompt":"Request %d asks about %s","max_tokens":%d,"temperature":0}' "$1" "$(printf 'x%.0s' $(seq "$1"))" $((12 + 5 * $1)); }
for i in $(seq 0 $((N - 1))); do
    curl -sf "$URL/v1/completions" -d "$(body "$i")" | jq -r '.choices[0].text' >"$T/alone$i"
done
steps0=$(metric sluice_batch_steps_total) seqs0=$(metric sluice_batch_sequences_total)
CURLS=()
for i in $(seq 0 $((N - 1))); do
    curl -sf "$URL/v1/completions" -d "$(body "$i")" | jq -r '.choices[0].text' >"$T/batch$i" &
    CURLS+=($!)
done
wait "${CURLS[@]}"
for i in $(seq 0 $((N - 1))); do
    cmp -s "$T/alone$i" "$T/batch$i" || fail "request $i: '$(cat "$T/batch$i")' in a batch, '$(cat "$T/alone$i")' alone"
done
steps=$(($(metric sluice_batch_steps_total) - steps0)) seqs=$(($(metric sluice_batch_sequences_total) - seqs0))
awk -v s="$steps" -v q="$seqs" 'BEGIN { exit !(q / s > 1.5) }' ||
    fail "requests did not share steps: $seqs sequences in $steps steps"
echo "ok - $N concurrent requests equal themselves alone ($seqs sequences in $steps steps)"

# --- prefix caching across conversations: A and B alternate, a side request shares A's system prompt ---
SYS_A=$(printf 'You are assistant A. %.0s' $(seq 30))
SYS_B=$(printf 'You are assistant B, different. %.0s' $(seq 30))
chat() { # SYSTEM USER [ASSISTANT USER2]
    local m
    m=$(jq -nc --arg s "$1" --arg u "$2" '[{role:"system",content:$s},{role:"user",content:$u}]')
    [ $# -gt 2 ] && m=$(jq -c --arg a "$3" --arg u "$4" '. + [{role:"assistant",content:$a},{role:"user",content:$u}]' <<<"$m")
    curl -sf "$URL/v1/chat/completions" -d "{\"messages\":$m,\"max_tokens\":8,\"temperature\":0}" >"$T/c"
    jq -r '"\(.usage.prompt_tokens) \(.usage.prompt_tokens_details.cached_tokens)"' "$T/c"
}
read -r pa _ < <(chat "$SYS_A" "first question")
reply_a=$(jq -r '.choices[0].message.content' "$T/c")
chat "$SYS_B" "other question" >/dev/null
read -r ps cs < <(chat "$SYS_A" "a side question")
[ "$cs" -ge 32 ] || fail "the side request shared no page of A's system prompt (cached $cs of $ps)"
read -r p2 c2 < <(chat "$SYS_A" "first question" "$reply_a" "second question")
[ "$c2" -ge $((pa - 40)) ] || fail "A's second turn reused $c2 of A's first $pa tokens after B and the side request"
read -r _ cb < <(chat "$SYS_B" "other question" "x" "again")
[ "$cb" -ge 32 ] || fail "B's second turn reused only $cb tokens"
[ "$(metric sluice_prefix_cache_hits_total)" -ge 3 ] || fail "prefix hits: $(metric sluice_prefix_cache_hits_total)"
echo "ok - conversations keep their prefixes side by side (side request $cs/$ps cached, A's turn 2 $c2/$p2)"

# --- Claude Code's billing header (a nonce that changes every request) does not defeat the prefix cache ---
billing() { # NONCE
    jq -nc --arg sys "$SYS_A" --arg h "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=$1;" \
        '{model:"m",max_tokens:4,temperature:0,system:[{type:"text",text:$h},{type:"text",text:$sys}],
          messages:[{role:"user",content:"hello there"}]}' >"$T/req"
    curl -sf "$URL/v1/messages" -d @"$T/req" | jq -r '"\(.usage.input_tokens) \(.usage.cache_read_input_tokens)"'
}
billing fa690 >/dev/null
read -r in cr < <(billing 0b1c2)
[ "$cr" -ge 300 ] && [ "$in" -le 64 ] || fail "billing header: $cr tokens read from the cache, $in new"
echo "ok - a changing billing header leaves the prefix cached ($cr cached, $in new)"

# --- n choices: the prompt is read once, each choice then samples on its own ---
M=6
P=$(printf 'Several choices of one prompt, read only once. %.0s' $(seq 3))
nreq() { printf '{"prompt":"%s","max_tokens":%d,"ignore_eos":true%s}' "$P" "$M" "$1"; }
tok0=$(metric sluice_batch_tokens_total) pt0=$(metric sluice_prompt_tokens_total) gen0=$(metric sluice_generated_tokens_total)
curl -sf "$URL/v1/completions" -d "$(nreq ',"temperature":0,"n":3')" >"$T/n3"
fed=$(($(metric sluice_batch_tokens_total) - tok0))
curl -sf "$URL/v1/completions" -d "$(nreq ',"temperature":0')" >"$T/n1"
one=$(jq -r '.choices[0].text' "$T/n1")
jq -e --arg one "$one" --argjson m "$M" '[.choices[].index] == [0, 1, 2] and ([.choices[].text] | unique) == [$one] and
    ([.choices[].finish_reason] | unique) == ["length"] and .usage.completion_tokens == 3 * $m and
    .usage.total_tokens == .usage.prompt_tokens + 3 * $m' "$T/n3" >/dev/null ||
    fail "greedy n=3: $(jq -c '{choices: [.choices[] | {index, text}], usage}' "$T/n3"), alone '$one'"
[ "$(jq .usage.prompt_tokens "$T/n3")" = "$(jq .usage.prompt_tokens "$T/n1")" ] || fail "n=3 counts the prompt again"
read -r np nc < <(jq -r '"\(.usage.prompt_tokens) \(.usage.prompt_tokens_details.cached_tokens)"' "$T/n3")
# the prompt's uncached tokens go through the model once; then each choice feeds its tokens but the last
[ "$fed" = $((np - nc + 3 * (M - 1))) ] ||
    fail "n=3 fed $fed tokens; the prompt once ($np, $nc cached) and 3 x $((M - 1)) generated would be $((np - nc + 3 * (M - 1)))"
[ "$nc" -lt 32 ] || fail "the n=3 prompt was cached ($nc tokens): the count above shows nothing"
[ $(($(metric sluice_prompt_tokens_total) - pt0)) = $((2 * np)) ] || fail "/metrics counts the prompt of n=3 more than once"
[ $(($(metric sluice_generated_tokens_total) - gen0)) = $((4 * M)) ] || fail "/metrics generated tokens of n=3"
# seeded sampling: each choice its own draw, the same for the same request; choice 0 is what n=1 gives
SEEDED='"messages":[{"role":"user","content":"Pick a word"}],"max_tokens":8,"ignore_eos":true,"temperature":1,"seed":11'
curl -sf "$URL/v1/chat/completions" -d "{$SEEDED,\"n\":2}" | jq -c '[.choices[].message.content]' >"$T/s1"
curl -sf "$URL/v1/chat/completions" -d "{$SEEDED,\"n\":2}" | jq -c '[.choices[].message.content]' >"$T/s2"
cmp -s "$T/s1" "$T/s2" || fail "seeded n=2 differs between requests: $(cat "$T/s1") then $(cat "$T/s2")"
jq -e '.[0] != .[1]' "$T/s1" >/dev/null || fail "seeded n=2 drew the same choice twice: $(cat "$T/s1")"
c0=$(curl -sf "$URL/v1/chat/completions" -d "{$SEEDED}" | jq -c '.choices[0].message.content')
[ "$c0" = "$(jq -c '.[0]' "$T/s1")" ] || fail "seeded n=1 gave $c0, choice 0 of n=2 $(jq -c '.[0]' "$T/s1")"
# streamed: every chunk names its choice, each choice ends with its own finish chunk, then usage and [DONE]
curl -sfN "$URL/v1/chat/completions" -d "{$SEEDED,\"n\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$T/sn"
[ "$(grep -v '^$' "$T/sn" | tail -1)" = "data: [DONE]" ] || fail "n=2 stream does not end with [DONE]"
grep '^data: {' "$T/sn" | sed 's/^data: //' >"$T/snj"
jq -se '[.[].choices[].index] | unique == [0, 1]' "$T/snj" >/dev/null || fail "n=2 stream: indexes"
jq -se '[.[].choices[] | select(.finish_reason) | [.index, .finish_reason]] == [[0, "length"], [1, "length"]] or
    [.[].choices[] | select(.finish_reason) | [.index, .finish_reason]] == [[1, "length"], [0, "length"]]' "$T/snj" \
    >/dev/null || fail "n=2 stream: finish chunks $(jq -c '.choices[] | select(.finish_reason)' "$T/snj")"
jq -se '.[-1].choices == [] and .[-1].usage.completion_tokens == 16' "$T/snj" >/dev/null ||
    fail "n=2 stream usage: $(tail -1 "$T/snj")"
for i in 0 1; do
    got=$(jq -sc --argjson i "$i" '[.[].choices[] | select(.index == $i) | .delta.content // ""] | add' "$T/snj")
    [ "$got" = "$(jq -c ".[$i]" "$T/s1")" ] || fail "streamed choice $i '$got', whole $(jq -c ".[$i]" "$T/s1")"
done
# n is capped by --parallel (4 here): beyond, a 400 naming the field and the limit
for bad in 5 0 '"2"' 2.5; do
    [ "$(post /v1/chat/completions "{$SEEDED,\"n\":$bad}")" = 400 ] &&
        jq -e '.error.param == "n" and (.error.message | test("\\[1, 4\\]"))' "$T/body" >/dev/null ||
        fail "n=$bad: $(cat "$T/body")"
done
[ "$(post /v1/completions "$(nreq ',"n":5')")" = 400 ] || fail "/v1/completions n=5"
echo "ok - n choices: greedy ones equal n=1, the prompt read once ($fed tokens fed), seeded ones reproducible, streamed by index"

# --- a request cancelled mid-batch: the others finish whole ---
start loop "$FIX/scripted_model" --parallel 3
CURLS=()
for i in 1 2; do
    curl -sN "$URL/v1/completions" -d '{"prompt":"<|loop|>","max_tokens":300,"stream":true}' >"$T/s$i" &
    CURLS+=($!)
done
curl -sN --max-time 0.3 "$URL/v1/completions" -d '{"prompt":"<|loop|>","max_tokens":60000,"stream":true}' \
    >/dev/null 2>&1 || true
wait "${CURLS[@]}"
for i in 1 2; do
    text=$(grep '^data: {' "$T/s$i" | sed 's/^data: //' | jq -j '.choices[0].text')
    [ "$text" = "$(printf ' la%.0s' $(seq 300))" ] || fail "stream $i beside a cancelled request: ${#text} characters"
done
for _ in $(seq 50); do [ "$(metric sluice_generations_cancelled_total)" -ge 1 ] && break; sleep 0.1; done
[ "$(metric sluice_generations_cancelled_total)" -ge 1 ] || fail "the dropped request was not cancelled"
[ "$(metric sluice_requests_running)" = 0 ] || fail "requests still running: $(metric sluice_requests_running)"
echo "ok - a cancelled request leaves the batch; the others are whole"

# --- n choices cancelled together: every sequence they held is free for the next request ---
curl -sN --max-time 0.4 "$URL/v1/completions" -d '{"prompt":"<|loop|>","max_tokens":60000,"stream":true,"n":3}' \
    >"$T/n3cut" 2>/dev/null || true
grep -q '"index":2' "$T/n3cut" || fail "the n=3 stream sent nothing of choice 2"
for _ in $(seq 50); do [ "$(metric sluice_requests_running)" = 0 ] && break; sleep 0.1; done
[ "$(metric sluice_requests_running)" = 0 ] || fail "n=3 still running after its client left"
[ "$(metric sluice_generations_cancelled_total)" -ge 2 ] || fail "the n=3 request was not counted cancelled"
# n=3 needs all three sequences of --parallel 3; tool calls, stop strings and finish reasons are per choice
ASK='"messages":[{"role":"user","content":"Weather?"}]'
TOOLS='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]'
curl -sf --max-time 20 "$URL/v1/chat/completions" -d "{$ASK,$TOOLS,\"n\":3}" >"$T/tc3" || fail "n=3 after the cancel"
jq -e '[.choices[] | .finish_reason] == ["tool_calls", "tool_calls", "tool_calls"] and
    ([.choices[].message.tool_calls[0].id] | unique | length) == 3 and
    ([.choices[].message.tool_calls[0].function.arguments | fromjson] | unique) == [{"city": "Paris"}]' "$T/tc3" \
    >/dev/null || fail "n=3 tool calls: $(cat "$T/tc3")"
curl -sf "$URL/v1/chat/completions" -d "{$ASK,\"n\":2,\"stop\":[\"Paris\"]}" |
    jq -e '[.choices[] | [.message.content, .finish_reason]] == [["Sunny skies over ", "stop"], ["Sunny skies over ", "stop"]]' \
    >/dev/null || fail "n=2 with a stop string"
echo "ok - n=3 cancelled frees its sequences; tool calls and stop strings per choice"

# --- load: 32 clients, about a fifth dropped mid-flight; nothing malformed, RSS flat ---
start load "$FIX/scripted_model" --parallel 8 --queue 64
rss() { awk '/VmRSS/ {print $2}' "/proc/$PID/status"; }
(cd "$SRC" && node bench/serve_load.mjs "$URL" 100 32 --scripted >/dev/null) || fail "warm-up load run"
before=$(rss)
(cd "$SRC" && node bench/serve_load.mjs "$URL" 400 32 --scripted) >"$T/load" || { cat "$T/load"; fail "load run"; }
after=$(rss)
kill -0 "$PID" || fail "the server died under load"
[ "$(curl -s "$URL/health")" = '{"status":"ok"}' ] || fail "unhealthy after the load run"
jq -e '.bad == 0 and .ok > 0' "$T/load" >/dev/null || fail "load run: $(cat "$T/load")"
[ "$after" -le $((before + before / 5 + 8192)) ] || fail "RSS grew from $before kB to $after kB"
echo "ok - 400 requests from 32 clients: $(jq -c '{ok, aborted, busy, bad}' "$T/load"), RSS $before -> $after kB"
echo "7 passed, 0 failed"
