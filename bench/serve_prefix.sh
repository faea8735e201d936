#!/usr/bin/env bash
# Prefix reuse in sluice serve: a three-turn conversation over /v1/chat/completions, then the last turn sent
# again (a regeneration) and with a different last message (a branch). Prints prompt and cached tokens per
# request: each later turn should prefill only its new tokens, on dense and on hybrid (delta-net) models.
# usage: bench/serve_prefix.sh MODEL_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SLUICE_BIN:-build/sluice}
LOG=$(mktemp)
"$BIN" serve "$1" --port 0 >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 100); do grep -q "ready:" "$LOG" && break; sleep 0.1; done
URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$LOG" | head -1)
msgs='[]'
ask() { # ask LABEL MESSAGES: prints the counts, sets REPLY
    local r
    r=$(curl -s "$URL/v1/chat/completions" -d "{\"messages\":$2,\"max_tokens\":24,\"temperature\":0}")
    echo "$r" | jq -r --arg l "$1" '"\($l): prompt \(.usage.prompt_tokens), cached \(.usage.prompt_tokens_details.cached_tokens), prefilled \(.usage.prompt_tokens - .usage.prompt_tokens_details.cached_tokens)"'
    REPLY=$(echo "$r" | jq -c '.choices[0].message.content')
}
for turn in 1 2 3; do
    msgs=$(echo "$msgs" | jq -c --arg t "Question number $turn: tell me about rivers and lakes." '. + [{role: "user", content: $t}]')
    ask "turn $turn" "$msgs"
    last=$msgs
    msgs=$(echo "$msgs" | jq -c --argjson r "$REPLY" '. + [{role: "assistant", content: $r}]')
done
ask "turn 3 again" "$last"
ask "turn 3, other question" "$(echo "$last" | jq -c '.[-1].content = "Something else entirely."')"
