#!/usr/bin/env bash
# End-to-end checks of the commands on GGUF files: show, tokenize, template, logits, run, and errors.
set -euo pipefail
BIN=${SLUICE_BIN:?}
FIX=${SLUICE_FIXTURES:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { # expect NAME GOT WANT
    [[ "$2" == "$3" ]] || fail "$1: got '$2', want '$3'"
}
G="$FIX/gguf/llama-Q8_0/model.gguf"
Q="$FIX/gguf/qwen3_5_moe-IQ4_XS/model.gguf"

out=$("$BIN" show "$Q")
grep -q "architecture          qwen3_5_moe" <<<"$out" || fail "show architecture: $out"
grep -q "1 delta-net, 1 full attention" <<<"$out" || fail "show layer kinds: $out"
grep -q "container             GGUF v3" <<<"$out" || fail "show container: $out"
grep -q "IQ4_XS x" <<<"$out" || fail "show tensor types: $out"
"$BIN" show "$G" --tensors | grep -qE "blk\.0\.attn_q\.weight +Q8_0 +\[256, 256\]" || fail "show --tensors"

# the fixtures' tokenizer: one token per byte, ChatML specials from the metadata
expect "tokenize specials" "$("$BIN" tokenize "$G" $'<|im_start|>hi<|im_end|>')" "[257,104,105,258]"
expect "tokenize stdin" "$(printf 'hi' | "$BIN" tokenize "$G")" "[104,105]"

echo '{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true}' >"$tmp/chat.json"
expect "template" "$("$BIN" template "$G" "$tmp/chat.json")" $'<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant'

"$BIN" logits "$Q" --ids 1,2,3 --decode-ids 4 --out "$tmp/l.f32"
expect "logits size" "$(stat -c %s "$tmp/l.f32")" "$((4 * 320 * 4))"

"$BIN" run "$G" "hi" -n 4 --temp 0 </dev/null >"$tmp/run.out" 2>"$tmp/run.err" || fail "run: $(cat "$tmp/run.err")"
grep -q "decode" "$tmp/run.err" || fail "run stats: $(cat "$tmp/run.err")"

# errors name the file and say what was expected
printf 'GGUF\x09\x00\x00\x00' >"$tmp/bad.gguf"
if "$BIN" show "$tmp/bad.gguf" 2>"$tmp/err"; then fail "bad version accepted"; fi
grep -q "bad.gguf: unsupported GGUF version 9 (expected 2 or 3)" "$tmp/err" || fail "bad version: $(cat "$tmp/err")"
if "$BIN" logits "$tmp/none.gguf" --ids 1 --out "$tmp/x" 2>"$tmp/err"; then fail "missing file accepted"; fi
grep -q "none.gguf: no such GGUF file" "$tmp/err" || fail "missing file: $(cat "$tmp/err")"
cp "$G" "$tmp/m-00001-of-00002.gguf"
if "$BIN" tokenize "$tmp/m-00001-of-00002.gguf" hi 2>"$tmp/err"; then fail "split count mismatch accepted"; fi
grep -q "split.count is 1 but the file name says 2 files" "$tmp/err" || fail "split: $(cat "$tmp/err")"
echo "ok"
