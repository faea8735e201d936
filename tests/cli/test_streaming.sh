#!/usr/bin/env bash
# The streaming flags from the command line: `sluice logits` with the experts of a MoE fixture in a
# small host cache (--ram) writes the resident logits byte for byte, buffered and O_DIRECT (and with
# --cpu-experts off); bad values of --vram, --ram, --io and --cpu-experts are refused with one line
# naming the flag; decode steps on the device (--device-steps on) give the same logits; bench reports the
# store; `sluice pack` writes an expert pack that streaming then
# reads, to the same logits; bench/vs-llamacpp-offload.sh prints its table.
set -u
BIN=${SLUICE_BIN:?SLUICE_BIN not set}
FIX=${SLUICE_FIXTURES:?SLUICE_FIXTURES not set}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export SLUICE_BACKEND=cpu
fails=0
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}
M=$FIX/models/qwen3_5_moe
ids=1,20,300,400,50,60,70,80
"$BIN" logits "$M" --ids $ids --decode-ids 9,99,499 --out "$TMP/ref.f32" 2>"$TMP/ref.err" || fail "resident: $(cat "$TMP/ref.err")"
for io in buffered direct; do
    "$BIN" logits "$M" --ids $ids --decode-ids 9,99,499 --out "$TMP/$io.f32" --ram 500K --io $io 2>"$TMP/$io.err" ||
        fail "--ram 500K --io $io: $(cat "$TMP/$io.err")"
    grep -q "streaming experts: .* $io I/O" "$TMP/$io.err" || fail "--io $io: no line saying the experts stream"
    cmp -s "$TMP/ref.f32" "$TMP/$io.f32" || fail "--ram 500K --io $io: logits differ from the resident model's"
done
bad() { # NAME PATTERN ARGS...: exit 2 and one line matching PATTERN
    local name=$1 pat=$2
    shift 2
    "$BIN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    local rc=$?
    [ $rc -eq 2 ] || fail "$name: exit $rc, expected 2"
    [ "$(wc -l <"$TMP/$name.err")" -eq 1 ] || fail "$name: expected one line, got: $(cat "$TMP/$name.err")"
    grep -q -- "$pat" "$TMP/$name.err" || fail "$name: '$pat' not in: $(cat "$TMP/$name.err")"
}
bad io "--io is buffered, direct or gds, got 'fast'" logits "$M" --ids 1 --out "$TMP/x" --io fast
bad vram0 "--vram 0 leaves no GPU memory" bench "$M" --vram 0
bad ramsize "--ram needs a size" logits "$M" --ids 1 --out "$TMP/x" --ram lots
bad cpuexp "--cpu-experts is auto, on or off, got 'gpu'" logits "$M" --ids 1 --out "$TMP/x" --cpu-experts gpu
bad cpuexp_serve "--cpu-experts is auto, on or off, got 'sometimes'" serve "$M" --cpu-experts sometimes
"$BIN" logits "$M" --ids $ids --decode-ids 9,99,499 --out "$TMP/cpuoff.f32" --ram 500K --cpu-experts off 2>"$TMP/cpuoff.err" ||
    fail "--cpu-experts off: $(cat "$TMP/cpuoff.err")"
cmp -s "$TMP/ref.f32" "$TMP/cpuoff.f32" || fail "--cpu-experts off: logits differ from the resident model's"
for c in run serve bench logits ppl; do
    "$BIN" $c --help 2>&1 | grep -q -- "--cpu-experts MODE" || fail "$c --help does not list --cpu-experts"
    "$BIN" $c --help 2>&1 | grep -q -- "--device-steps MODE" || fail "$c --help does not list --device-steps"
done
# decode steps on the device against the slot tables: the same logits, whether they stand or run again
bad devsteps "--device-steps is auto, on, off or host, got 'maybe'" logits "$M" --ids 1 --out "$TMP/x" --device-steps maybe
for r in 1M 4M; do # every decode step misses and runs again; every expert has a slot
    "$BIN" logits "$M" --ids $ids --decode-ids 9,99,499 --out "$TMP/dev.f32" --ram $r --device-steps on 2>"$TMP/dev.err" ||
        fail "--ram $r --device-steps on: $(cat "$TMP/dev.err")"
    cmp -s "$TMP/ref.f32" "$TMP/dev.f32" || fail "--ram $r --device-steps on: logits differ from the resident model's"
done
"$BIN" bench "$M" -p 16 -n 8 --ram 4M --device-steps on >"$TMP/devb.out" 2>&1 || fail "bench --device-steps on: $(cat "$TMP/devb.out")"
grep -q "decode experts.* [1-9][0-9]* steps on the device (.* redone)" "$TMP/devb.out" ||
    fail "bench --device-steps on: no device steps in: $(grep 'decode experts' "$TMP/devb.out")"
"$BIN" logits "$M" --ids $ids --out "$TMP/small" --ram 100K 2>"$TMP/small.err" && fail "a cache below one token's experts must fail"
grep -q "routes to 4 per layer" "$TMP/small.err" || fail "too small a cache: $(cat "$TMP/small.err")"
"$BIN" logits "$M" --ids $ids --out "$TMP/gds" --backend cpu --ram 500K --io gds 2>"$TMP/gds.err" &&
    fail "--io gds on the CPU backend must fail"
grep -q -- "--io gds reads experts straight into GPU memory, which the cpu backend" "$TMP/gds.err" ||
    fail "--io gds on the CPU: $(cat "$TMP/gds.err")"
"$BIN" bench "$M" -p 16 -n 8 --ram 500K >"$TMP/bench.out" 2>&1 || fail "bench --ram: $(cat "$TMP/bench.out")"
for row in "streamed experts" "decode experts" "prefill predicted" "decode predicted" "expert tier read"; do
    grep -q "$row" "$TMP/bench.out" || fail "bench --ram: no '$row' row"
done
# a cache of a few experts reads more than an expert a token: the bound of those reads, in the table and the JSON
grep -q "expert tier read .* missed per token -> I/O bound [0-9.]* tok/s, decode at [0-9.]*% of it" "$TMP/bench.out" ||
    fail "bench --ram: no I/O bound in: $(grep 'expert tier read' "$TMP/bench.out")"
"$BIN" bench "$M" -p 16 -n 8 --ram 500K --json >"$TMP/bench.json" 2>"$TMP/bench.err" || fail "bench --ram --json"
python3 -c 'import json,sys; x=json.load(open(sys.argv[1]))["streaming"]; assert x["decode_tier_bytes_per_token"] >= x["slot_bytes"] and x["decode_io_bound_tok_s"] > 0' "$TMP/bench.json" ||
    fail "bench --ram --json: no decode I/O bound"
mkdir -p "$TMP/pk" && cp "$M/config.json" "$M/model.safetensors" "$TMP/pk/"
"$BIN" pack "$TMP/pk" >"$TMP/pack.out" 2>"$TMP/pack.err" || fail "pack: $(cat "$TMP/pack.err")"
grep -q "packed 64 experts .* into $TMP/pk/experts.sluice-pack" "$TMP/pack.out" || fail "pack: $(cat "$TMP/pack.out")"
"$BIN" logits "$TMP/pk" --ids $ids --decode-ids 9,99,499 --out "$TMP/pk.f32" --ram 500K 2>"$TMP/pk.err" ||
    fail "logits through the pack: $(cat "$TMP/pk.err")"
grep -q "from the expert pack" "$TMP/pk.err" || fail "the pack was not read: $(cat "$TMP/pk.err")"
cmp -s "$TMP/ref.f32" "$TMP/pk.f32" || fail "logits through the pack differ from the resident model's"
"$BIN" pack "$FIX/models/qwen3" >"$TMP/dense.out" 2>&1 && fail "pack of a dense model must fail"
grep -q "has no routed experts to pack" "$TMP/dense.out" || fail "pack of a dense model: $(cat "$TMP/dense.out")"
"$BIN" pack --help | grep -q "experts.sluice-pack" || fail "pack --help"
# the side-by-side harness for experts off the GPU, against a stand-in llama-bench that prints fixed rows
mkdir -p "$TMP/lcpp"
printf '%s\n' '#!/bin/sh' 'echo "{\"n_prompt\": 16, \"n_gen\": 0, \"avg_ts\": 1000.0}"' \
    'echo "{\"n_prompt\": 0, \"n_gen\": 4, \"avg_ts\": 50.0}"' >"$TMP/lcpp/llama-bench"
chmod +x "$TMP/lcpp/llama-bench"
HERE=$(cd "$(dirname "$0")/../.." && pwd)
P=16 N=4 R=1 NCMOE=2 SLUICE_BACKEND=cpu SLUICE_BIN="$BIN" SETUPS="--ram 500K|--ram 500K --no-prefetch" \
    bash "$HERE/bench/vs-llamacpp-offload.sh" "$TMP/lcpp" "$FIX/gguf/qwen3_moe-Q4_K_M/model.gguf" >"$TMP/off.md" 2>&1 ||
    fail "vs-llamacpp-offload.sh: $(cat "$TMP/off.md")"
for row in "| llama.cpp -ot exps=CPU | 1,000 | 50.0 | 1.00x | 1.00x |" "| llama.cpp --n-cpu-moe 2 |" \
    "| sluice --ram 500K |" "| sluice --ram 500K --no-prefetch |" "routing wait" "predicted"; do
    grep -qF -- "$row" "$TMP/off.md" || fail "vs-llamacpp-offload.sh: no '$row' in: $(cat "$TMP/off.md")"
done
[ $fails -eq 0 ] && echo "streaming CLI: all checks passed"
exit $((fails > 0))
