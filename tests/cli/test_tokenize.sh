#!/usr/bin/env bash
# End-to-end checks of `sluice tokenize`: argument and stdin forms, --pieces, --specials, errors.
set -euo pipefail
BIN=${SLUICE_BIN:?}
FIX=${SLUICE_FIXTURES:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { # expect NAME GOT WANT
    [[ "$2" == "$3" ]] || fail "$1: got '$2', want '$3'"
}

for m in qwen3 llama3; do
    mkdir -p "$tmp/$m"
    xz -dc "$FIX/tokenizers/$m/tokenizer.json.xz" >"$tmp/$m/tokenizer.json"
    cp "$FIX/tokenizers/$m/tokenizer_config.json" "$tmp/$m/"
done

expect "qwen3 argument" "$("$BIN" tokenize "$tmp/qwen3" 'Hello world')" "[9707,1879]"
expect "llama3 argument" "$("$BIN" tokenize "$tmp/llama3" 'Hello world')" "[9906,1917]"
expect "stdin" "$(printf 'Hello world' | "$BIN" tokenize "$tmp/qwen3")" "[9707,1879]"
# stdin is taken byte for byte: the trailing newline is a token
expect "stdin newline" "$(echo 'Hello world' | "$BIN" tokenize "$tmp/qwen3")" "[9707,1879,198]"
expect "empty stdin" "$("$BIN" tokenize "$tmp/qwen3" </dev/null)" "[]"
expect "special tokens" "$("$BIN" tokenize "$tmp/qwen3" $'<|im_start|>user\nhi<|im_end|>')" "[151644,872,198,6023,151645]"
expect "pieces" "$("$BIN" tokenize "$tmp/qwen3" --pieces $'Hello "world"\n你好')" \
    '[[9707,"Hello"],[330," \""],[14615,"world"],[698,"\"\n"],[108386,"你好"]]'
expect "specials (ByteLevel post-processor adds none)" "$("$BIN" tokenize "$tmp/llama3" --specials 'Hello world')" "[9906,1917]"
"$BIN" tokenize --help | grep -q "usage: sluice tokenize" || fail "--help"

# every expected text of the fixture, through stdin (the unit tests cover them too; this needs python3)
command -v python3 >/dev/null || echo "python3 not found: skipping the expected.json stdin pass"
command -v python3 >/dev/null && python3 - "$BIN" "$tmp" "$FIX/tokenizers/expected.json" <<'PY' || fail "expected.json texts"
import json, subprocess, sys
bin_, tmp, exp = sys.argv[1:]
for m, d in json.load(open(exp)).items():
    for t in d["texts"]:
        out = subprocess.run([bin_, "tokenize", f"{tmp}/{m}"], input=t["text"].encode(), capture_output=True, check=True)
        if json.loads(out.stdout) != t["ids"]:
            sys.exit(f"{m}: {t['text']!r}: got {out.stdout!r}")
PY

# errors: one line on stderr naming the file, exit 1
check_error() { # check_error NAME DIR PATTERN
    set +e
    "$BIN" tokenize "$2" 'x' >"$tmp/out" 2>"$tmp/err"
    rc=$?
    set -e
    [[ $rc == 1 ]] || fail "$1: exit $rc, want 1"
    [[ ! -s "$tmp/out" ]] || fail "$1: wrote to stdout"
    [[ $(wc -l <"$tmp/err") == 1 ]] || fail "$1: stderr is not one line: $(cat "$tmp/err")"
    grep -q -- "$3" "$tmp/err" || fail "$1: stderr '$(cat "$tmp/err")' lacks '$3'"
}
check_error "missing dir" "$tmp/nope" "$tmp/nope: not a directory"
mkdir "$tmp/empty"
check_error "no tokenizer.json" "$tmp/empty" "$tmp/empty/tokenizer.json: not found"
mkdir "$tmp/bad"
echo '{"model": {"vocab": ' >"$tmp/bad/tokenizer.json"
check_error "bad JSON" "$tmp/bad" "$tmp/bad/tokenizer.json: line"
echo '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}' >"$tmp/bad/tokenizer.json"
check_error "bad merges" "$tmp/bad" "tokenizer.json: merges\[0\]"
cp "$tmp/qwen3/tokenizer.json" "$tmp/bad/tokenizer.json"
echo '{"eos_token": ' >"$tmp/bad/tokenizer_config.json"
check_error "bad config" "$tmp/bad" "$tmp/bad/tokenizer_config.json: line"
set +e
"$BIN" tokenize >/dev/null 2>&1
[[ $? == 2 ]] || fail "no arguments should exit 2"
echo "ok"
