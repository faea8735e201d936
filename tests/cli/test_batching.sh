#!/usr/bin/env bash
# sluice serve with several requests at once (continuous batching): concurrent greedy requests give exactly
# what each gives alone, a request cancelled mid-batch leaves the others whole, conversations keep their
# cached prefixes beside each other (and a side request shares one), and a load run of 32 clients with
# random disconnects leaves the server healthy with a flat RSS. Claude Code's billing header does not defeat
# the prefix cache.
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
echo "5 passed, 0 failed"
