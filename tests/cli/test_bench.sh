#!/usr/bin/env bash
# sluice bench: the table has its rows, --json is one valid object with the same numbers, and a bad
# model path is one line on stderr with exit status 1.
set -euo pipefail
: "${SLUICE_BIN:?}" "${SLUICE_FIXTURES:?}"
fail() { echo "FAIL: $*" >&2; exit 1; }

for m in qwen3 qwen3_moe; do
  model="$SLUICE_FIXTURES/models/$m"
  out=$("$SLUICE_BIN" bench "$model" -p 16 -n 8 --threads 2)
  for row in model backend weights load prefill decode "decode weight reads" "decode bandwidth" runs; do
    grep -Eq "^  $row  " <<<"$out" || fail "$m: no '$row' row in:"$'\n'"$out"
  done
  grep -q "cpu, 2 threads" <<<"$out" || fail "$m: backend row does not say 'cpu, 2 threads'"
  grep -Eq "^  prefill +16 tokens in .* tok/s" <<<"$out" || fail "$m: prefill row malformed"
  grep -Eq "^  decode +8 tokens in .* ms/token, .* tok/s" <<<"$out" || fail "$m: decode row malformed"
  grep -Eq "^  decode bandwidth +[0-9.]+ GB/s" <<<"$out" || fail "$m: bandwidth row malformed"

  json=$("$SLUICE_BIN" bench "$model" -p 16 -n 8 -r 2 --json)
  jq -e '.prompt_tokens == 16 and .decode_tokens == 8 and .runs == 2 and .prefill_tok_s > 0
         and .decode_tok_s > 0 and .decode_gb_s > 0 and .bytes_per_token > 0
         and .bytes_per_token <= .weight_bytes' <<<"$json" >/dev/null || fail "$m: --json: $json"
done

# MoE: a token reads top_k of n_experts experts, so less than the whole checkpoint
jq -e '.bytes_per_token < 0.6 * .weight_bytes' \
  <<<"$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/qwen3_moe" -p 4 -n 1 --json)" >/dev/null ||
  fail "qwen3_moe: bytes per token should count only the routed experts"

# read whole: grep -q stops at its match, and under pipefail the writer's SIGPIPE would fail the check
help=$("$SLUICE_BIN" bench --help)
grep -q "usage: sluice bench" <<<"$help" || fail "--help"
grep -q "qwen3.5-397b-a17b" <<<"$help" || fail "--help does not list the synthetic shapes"

# synthetic checkpoints: written once into SLUICE_CACHE, loaded by the ordinary loader, finite, with routing
# spread over the experts; a second run reuses the files
export SLUICE_CACHE
SLUICE_CACHE=$(mktemp -d)
trap 'rm -rf "$SLUICE_CACHE"' EXIT
for shape in tiny-llama tiny-qwen3.5-moe; do
  for q in bf16 mlx4 mlx8; do
    json=$("$SLUICE_BIN" bench --synthetic $shape --quant $q -p 24 -n 4 --json) || fail "$shape $q: bench failed"
    jq -e --arg s "$shape $q" '.synthetic == $s and .generate_s > 0 and .decode_tok_s > 0
         and .mem_bandwidth_gb_s > 0 and .decode_roofline_fraction > 0 and .prefill_peak_fraction > 0' \
      <<<"$json" >/dev/null || fail "$shape $q: $json"
    dir="$SLUICE_CACHE/synthetic/$shape-$q"
    [ -f "$dir/config.json" ] && [ -f "$dir/synthetic.txt" ] || fail "$shape $q: no checkpoint in $dir"
    # the model's weight bytes are what was written (the safetensors headers aside)
    onDisk=$(($(stat -c %s "$dir"/model*.safetensors | paste -sd+)))
    jq -e --argjson d "$onDisk" '.weight_bytes <= $d and .weight_bytes > 0.99 * $d' <<<"$json" >/dev/null ||
      fail "$shape $q: weight bytes vs $onDisk on disk: $json"
    if [ $shape = tiny-qwen3.5-moe ]; then
      # 24 tokens x top-4 of 16 experts: collapsed routing would use 4
      jq -e '.n_experts == 16 and .routing_experts_used >= 8' <<<"$json" >/dev/null || fail "$shape $q routing: $json"
    fi
  done
done
# q4k: one GGUF file (Q4_K, the output head Q6_K) through the GGUF loader
for shape in tiny-llama tiny-qwen3.5-moe; do
  json=$("$SLUICE_BIN" bench --synthetic $shape --quant q4k -p 24 -n 4 --json) || fail "$shape q4k: bench failed"
  jq -e --arg s "$shape q4k" '.synthetic == $s and .decode_tok_s > 0 and .decode_roofline_fraction > 0' \
    <<<"$json" >/dev/null || fail "$shape q4k: $json"
  f="$SLUICE_CACHE/synthetic/$shape-q4k/model.gguf"
  [ -f "$f" ] || fail "$shape q4k: no $f"
  tensors=$("$SLUICE_BIN" show "$f" --tensors)
  grep -Eq "output.weight +Q6_K" <<<"$tensors" || fail "$shape q4k: output head is not Q6_K"
  grep -Eq "blk.0.attn_norm.weight +F32" <<<"$tensors" || fail "$shape q4k: norms are not F32"
  jq -e --argjson d "$(stat -c %s "$f")" '.weight_bytes <= $d and .weight_bytes > 0.98 * $d' <<<"$json" >/dev/null ||
    fail "$shape q4k: weight bytes vs the file: $json"
done
jq -e '.routing_experts_used >= 8' <<<"$json" >/dev/null || fail "tiny-qwen3.5-moe q4k routing: $json"
again=$("$SLUICE_BIN" bench --synthetic tiny-llama --quant mlx4 -p 8 -n 2)
grep -q "tiny-llama mlx4, reused" <<<"$again" || fail "second run did not reuse the checkpoint: $again"
# --layers writes a shallower model into its own folder
json=$("$SLUICE_BIN" bench --synthetic tiny-qwen3.5-moe --layers 2 -p 8 -n 2 --json)
[ -d "$SLUICE_CACHE/synthetic/tiny-qwen3.5-moe-bf16-2L" ] || fail "--layers 2: no -2L folder"
jq -e '.model_type == "qwen3_5_moe_text"' <<<"$json" >/dev/null || fail "--layers 2: $json"
# an interrupted generation (no marker) is redone, not trusted
rm "$SLUICE_CACHE/synthetic/tiny-llama-bf16/synthetic.txt"
"$SLUICE_BIN" bench --synthetic tiny-llama -p 8 -n 2 | grep -q "generated in" || fail "incomplete checkpoint reused"

expect_usage_error() {
  local want=$1; shift
  set +e
  err=$("$SLUICE_BIN" bench "$@" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "bench $*: exit $rc, expected 2"
  grep -q -- "$want" <<<"$err" || fail "bench $*: expected '$want' in: $err"
}
expect_usage_error "unknown shape 'nope'" --synthetic nope
expect_usage_error "qwen3.5-35b-a3b" --synthetic nope
expect_usage_error "--quant must be bf16, mlx4, mlx8 or q4k" --synthetic tiny-llama --quant q4
expect_usage_error "not both" "$SLUICE_FIXTURES/models/qwen3" --synthetic tiny-llama

set +e
err=$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/does_not_exist" 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "bad model: exit $rc, expected 1"
[ "$(wc -l <<<"$err")" -eq 1 ] || fail "bad model: expected one line, got: $err"
echo "ok"
