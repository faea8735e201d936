#!/usr/bin/env bash
# The binary on bad models and bad arguments: non-zero exit with a single line on stderr that names
# the file or argument at fault; --help exits 0.
set -u
BIN=${SLUICE_BIN:?SLUICE_BIN not set}
FIX=${SLUICE_FIXTURES:?SLUICE_FIXTURES not set}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}

# run NAME EXPECTED_RC ARGS...: runs the binary, keeps stdout/stderr in $TMP/NAME.{out,err}, checks the code
run() {
    local name=$1 want=$2
    shift 2
    # an explicit backend: no line announcing an automatic choice
    SLUICE_BACKEND=${BACKEND:-cpu} "$BIN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    local rc=$?
    if [ "$want" = nonzero ]; then
        [ "$rc" -ne 0 ] || fail "$name: exit 0, expected non-zero"
    elif [ "$rc" -ne "$want" ]; then
        fail "$name: exit $rc, expected $want"
    fi
    # sanitizer reports would also land on stderr; any of them is a failure
    if grep -q "Sanitizer" "$TMP/$name.err"; then fail "$name: sanitizer report"; fi
}

# one_line NAME NEEDLE...: stderr is exactly one line and contains every needle
one_line() {
    local name=$1
    shift
    local n
    n=$(wc -l <"$TMP/$name.err")
    [ "$n" -eq 1 ] || fail "$name: $n lines on stderr, expected 1: $(cat "$TMP/$name.err")"
    for needle in "$@"; do
        grep -qF -- "$needle" "$TMP/$name.err" || fail "$name: stderr lacks '$needle': $(cat "$TMP/$name.err")"
    done
}

# A model whose safetensors file is 3 bytes long.
BAD=$TMP/bad
mkdir "$BAD"
cp "$FIX/models/llama/config.json" "$BAD/"
printf 'abc' >"$BAD/model.safetensors"

run show_bad 1 show "$BAD"
one_line show_bad "sluice show: " "$BAD/model.safetensors" "too short"
[ -s "$TMP/show_bad.out" ] && fail "show_bad: wrote to stdout"

run logits_bad 1 logits "$BAD" --ids 1,2 --out "$TMP/x.f32"
one_line logits_bad "sluice logits: " "$BAD/model.safetensors"
[ -e "$TMP/x.f32" ] && fail "logits_bad: wrote the output file"

# A truncated copy of a valid checkpoint: the data section is cut short.
TRUNC=$TMP/trunc
mkdir "$TRUNC"
cp "$FIX/models/llama/config.json" "$TRUNC/"
size=$(stat -c %s "$FIX/models/llama/model.safetensors")
head -c $((size - 1000)) "$FIX/models/llama/model.safetensors" >"$TRUNC/model.safetensors"
run show_trunc 1 show "$TRUNC"
one_line show_trunc "$TRUNC/model.safetensors" "data_offsets"

# A broken config.json.
BADCFG=$TMP/badcfg
mkdir "$BADCFG"
cp "$FIX/models/llama/model.safetensors" "$BADCFG/"
printf '{"model_type": "llama",' >"$BADCFG/config.json"
run show_badcfg 1 show "$BADCFG"
one_line show_badcfg "$BADCFG/config.json" "invalid JSON"

# A directory that does not exist.
run show_missing nonzero show "$TMP/does-not-exist"
one_line show_missing "$TMP/does-not-exist"

# Bad arguments to logits.
GOOD=$FIX/models/llama
run logits_bad_ids nonzero logits "$GOOD" --ids 1,x --out "$TMP/y.f32"
one_line logits_bad_ids "1,x"
run logits_oov nonzero logits "$GOOD" --ids 1,512 --out "$TMP/y.f32"
one_line logits_oov "token id 512"
run logits_no_ids nonzero logits "$GOOD" --out "$TMP/y.f32"
run show_no_args nonzero show
run unknown_cmd nonzero frobnicate
grep -qF "frobnicate" "$TMP/unknown_cmd.err" || fail "unknown_cmd: stderr does not name the command"

# Help exits 0 and goes to stdout.
run help 0 --help
grep -q "usage" "$TMP/help.out" || fail "help: no usage on stdout"
run show_help 0 show --help
grep -q "usage: sluice show" "$TMP/show_help.out" || fail "show_help: no usage on stdout"
run logits_help 0 logits --help
grep -q "usage: sluice logits" "$TMP/logits_help.out" || fail "logits_help: no usage on stdout"

# Backend choice: unknown names are refused naming where they came from.
run backend_flag 1 logits "$GOOD" --ids 1 --out "$TMP/x.f32" --backend tpu
one_line backend_flag "--backend" "tpu" "cpu, cuda or auto"
BACKEND=tpu run backend_env 1 logits "$GOOD" --ids 1 --out "$TMP/x.f32"
one_line backend_env "SLUICE_BACKEND" "tpu"
"$BIN" --version | grep -Eq '^sluice [0-9.]+ \(cpu' || fail "--version does not list the cpu backend"

# The good model still works, as a control for the cases above.
run show_good 0 show "$GOOD"
[ -s "$TMP/show_good.err" ] && fail "show_good: wrote to stderr: $(cat "$TMP/show_good.err")"

if [ "$fails" -ne 0 ]; then
    echo "$fails check(s) failed" >&2
    exit 1
fi
echo "all error checks passed"
