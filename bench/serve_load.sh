#!/usr/bin/env bash
# Load test of sluice serve on loopback: starts the server on MODEL, records its RSS, runs bench/serve_load.mjs
# (REQUESTS requests from CLIENTS concurrent clients, about a fifth dropped mid-flight), records the RSS again
# and checks that the server is still healthy; then stops it and checks its log for sanitizer reports (leaks too).
# usage: bench/serve_load.sh [MODEL] [REQUESTS] [CLIENTS]    (default: the scripted fixture, 500, 8)
# ROUNDS=R splits the REQUESTS into R rounds and prints the RSS after each (one summary line per round).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SLUICE_BIN:-build/sluice}
MODEL=${1:-tests/fixtures/scripted_model} N=${2:-500} C=${3:-8}
FLAGS=()
[ "$(basename "$MODEL")" = scripted_model ] && FLAGS+=(--scripted)
LOG=$(mktemp)
"$BIN" serve "$MODEL" --port 0 --queue 64 >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 100); do grep -q "ready:" "$LOG" && break; sleep 0.1; done
URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$LOG" | head -1)
rss() { awk '/VmRSS/ {print $2}' "/proc/$PID/status" 2>/dev/null || echo dead; }
# one warm-up round so the first allocations are not counted as growth
node bench/serve_load.mjs "$URL" 50 "$C" "${FLAGS[@]}" >/dev/null
before=$(rss)
R=${ROUNDS:-1} bad=0
for r in $(seq "$R"); do
    node bench/serve_load.mjs "$URL" $((N / R)) "$C" "${FLAGS[@]}" || bad=1
    [ "$R" = 1 ] || echo "round $r: RSS $(rss) kB"
done
after=$(rss)
kill -0 $PID || { cat "$LOG"; echo "server died"; exit 1; }
[ "$(curl -s "$URL/health")" = '{"status":"ok"}' ] || { echo "server unhealthy"; exit 1; }
echo "RSS before ${before} kB, after ${after} kB"
curl -s "$URL/metrics" | grep -E '^sluice_(generations|generations_cancelled|requests_rejected|generated_tokens)_total'
# stop the server and read its log: a sanitizer build (-DSLUICE_SANITIZE=ON) reports there, leaks at exit
kill -TERM $PID
wait $PID || { echo "server exited with status $?"; bad=1; }
if grep -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$LOG"; then echo "sanitizer report"; bad=1; fi
exit $bad
