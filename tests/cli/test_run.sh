#!/usr/bin/env bash
# sluice run end to end on a fixture model with the tiny tokenizer: piped and argument prompts, greedy
# determinism, stop strings, --timing (resident and with streamed experts), interactive multi-turn with
# prefix reuse and /reset, bad model.
set -euo pipefail
BIN=${SLUICE_BIN:?} FIX=${SLUICE_FIXTURES:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
M=$T/model; mkdir -p "$M"
cp "$FIX/models/qwen3/config.json" "$FIX/models/qwen3/model.safetensors" "$FIX/tiny_tokenizer/"* "$M/"
fail() { echo "FAIL: $*" >&2; exit 1; }

# one-shot from stdin, greedy: same output twice, a stats line on stderr
echo "Hello, how are you?" | "$BIN" run "$M" --temp 0 -n 12 >"$T/a" 2>"$T/a.err" || fail "piped run exited $?"
echo "Hello, how are you?" | "$BIN" run "$M" --temp 0 -n 12 >"$T/b" 2>/dev/null
cmp -s "$T/a" "$T/b" || fail "greedy runs differ"
[ -s "$T/a" ] || fail "no output"
grep -q "decode 12 tokens" "$T/a.err" || { cat "$T/a.err"; fail "stats line missing"; }

# one-shot from the argument gives the same as from stdin
"$BIN" run "$M" "Hello, how are you?" --temp 0 -n 12 >"$T/c" 2>/dev/null
cmp -s "$T/a" "$T/c" || fail "argument prompt differs from piped prompt"

# --timing: a table after the reply (load, prefill, decode), the reply itself unchanged; none without it
echo "Hello, how are you?" | "$BIN" run "$M" --temp 0 -n 12 --timing >"$T/t" 2>"$T/t.err" || fail "--timing exited $?"
cmp -s "$T/a" "$T/t" || fail "--timing changed the reply"
grep -Eq '^  load +[0-9.]+ m?s$' "$T/t.err" || { cat "$T/t.err"; fail "--timing: no load row"; }
grep -Eq '^  prefill +[1-9][0-9]* tokens, 0 cached, [0-9.]+ m?s, [0-9.]+ tok/s$' "$T/t.err" ||
    { cat "$T/t.err"; fail "--timing: no prefill row"; }
grep -Eq '^  decode +12 tokens, [0-9.]+ m?s, [0-9.]+ tok/s, [0-9.]+ ms/token$' "$T/t.err" ||
    { cat "$T/t.err"; fail "--timing: no decode row"; }
grep -q 'read/token' "$T/t.err" && fail "--timing: expert store figures for a model that does not stream"
grep -Eq '^  (load|prefill|decode) ' "$T/a.err" && fail "timing rows without --timing"
"$BIN" run --help | grep -q -- "--timing" || fail "--timing not in --help"

# --timing with streamed experts (CPU backend, a cache too small for all experts): the store's figures of
# each phase under its row, each phase having read experts
X=$T/moe; mkdir -p "$X"
cp "$FIX/models/qwen3_5_moe/config.json" "$FIX/models/qwen3_5_moe/model.safetensors" "$FIX/tiny_tokenizer/"* "$X/"
"$BIN" run "$X" "Hello, how are you?" --backend cpu --ram 500K --temp 0 -n 8 --timing >/dev/null 2>"$T/x.err" ||
    { cat "$T/x.err"; fail "streamed --timing exited"; }
grep -q "streaming experts" "$T/x.err" || { cat "$T/x.err"; fail "--ram 500K did not stream the experts"; }
rows=$(grep -E '^  (load|prefill|decode|  experts) ' "$T/x.err" | awk '{print $1}' | tr '\n' ' ')
[ "$rows" = "load prefill experts decode experts " ] || { cat "$T/x.err"; fail "streamed --timing rows: $rows"; }
[ "$(grep -Ec '^    experts [0-9.]+% in slots, .*[1-9][0-9.]* [KMG]?B read/token' "$T/x.err")" -eq 2 ] ||
    { cat "$T/x.err"; fail "streamed --timing: no expert reads in a phase"; }

# sampling with a seed is reproducible
"$BIN" run "$M" "Tell me a story" --temp 1 --seed 7 -n 16 >"$T/s1" 2>/dev/null
"$BIN" run "$M" "Tell me a story" --temp 1 --seed 7 -n 16 >"$T/s2" 2>/dev/null
cmp -s "$T/s1" "$T/s2" || fail "same seed gave different output"

# a stop string cuts the output before it and is never printed
full=$(cat "$T/a")
word=$(printf '%s' "$full" | LC_ALL=C tr -c 'A-Za-z' ' ' | awk '{for (i = 1; i <= NF; i++) if (length($i) >= 3) { print $i; exit }}')
if [ -n "$word" ]; then
    echo "Hello, how are you?" | "$BIN" run "$M" --temp 0 -n 12 --stop "$word" >"$T/d" 2>"$T/d.err"
    expect="${full%%"$word"*}"
    [ "$(cat "$T/d")" == "$(printf '%s' "$expect")" ] || fail "stop string '$word': got '$(cat "$T/d")' expected '$expect'"
    grep -q "| stop\]" "$T/d.err" || fail "finish reason is not stop"
fi

# interactive: second turn reuses the cached prefix, /reset starts over; --timing shows load once
printf 'Hi there\nAnd then?\n/reset\nHello\n/exit\n' | timeout 60 script -qec "'$BIN' run '$M' --temp 0 -n 4 --timing" \
    /dev/null | tr -d '\r' >"$T/i" 2>&1 || true
[ "$(grep -ac '^\[prompt' "$T/i")" -eq 3 ] || { cat "$T/i"; fail "expected three turns"; }
grep -a '^\[prompt' "$T/i" | sed -n 2p | grep -qv '(0 cached)' || fail "second turn reused nothing"
grep -a '^\[prompt' "$T/i" | sed -n 3p | grep -q '(0 cached)' || fail "/reset kept the cache"
[ "$(grep -ac '^  load ' "$T/i")" -eq 1 ] && [ "$(grep -ac '^  decode  *4 tokens' "$T/i")" -eq 3 ] ||
    { cat "$T/i"; fail "interactive --timing: expected one load row and three decode rows"; }
grep -a '^  prefill ' "$T/i" | sed -n 2p | grep -qv ' 0 cached' || fail "interactive --timing: second turn shows no cache"

# errors: a missing model exits non-zero with one line
if "$BIN" run "$T/nope" "hi" >/dev/null 2>"$T/e"; then fail "missing model accepted"; fi
[ "$(wc -l <"$T/e")" -eq 1 ] || { cat "$T/e"; fail "error is not one line"; }
"$BIN" run --help | grep -q "usage: sluice run" || fail "--help"
echo "run: all checks passed"
