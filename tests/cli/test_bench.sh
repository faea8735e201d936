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

# --no-warmup: the same rows without the untimed first run; --help names it
out=$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/qwen3" -p 16 -n 4 --threads 2 --no-warmup)
grep -Eq "^  decode +4 tokens in .* tok/s" <<<"$out" || fail "--no-warmup: no decode row in:"$'\n'"$out"
grep -q -- "--no-warmup" <<<"$("$SLUICE_BIN" bench --help)" || fail "--help has no --no-warmup"

# --kv-type: the KV row names the type and bytes per token (f32 on the CPU unless asked); f16 halves them
out=$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/qwen3" -p 16 -n 4 --threads 2)
grep -Eq "^  kv cache +f32, [0-9.]+ [KMG]?i?B/token" <<<"$out" || fail "no 'kv cache f32' row in:"$'\n'"$out"
j32=$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/qwen3" -p 16 -n 4 --json)
j16=$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/qwen3" -p 16 -n 4 --kv-type f16 --json) || fail "--kv-type f16"
jq -e '.kv_type == "f32"' <<<"$j32" >/dev/null || fail "default kv_type on the CPU: $j32"
jq -e --argjson b "$(jq .kv_bytes_per_token <<<"$j32")" '.kv_type == "f16" and .decode_tok_s > 0
     and .kv_bytes_per_token * 2 == $b' <<<"$j16" >/dev/null || fail "--kv-type f16: $j16"
"$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/qwen3" -p 8 -n 2 --kv-type bf16 | grep -Eq "^  kv cache +bf16," ||
  fail "--kv-type bf16"
# q8_0 (an approximation, on the CPU): 34 bytes for 32 values where f32 takes 128
j8=$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/qwen3" -p 16 -n 4 --kv-type q8_0 --json) || fail "--kv-type q8_0"
jq -e --argjson b "$(jq .kv_bytes_per_token <<<"$j32")" '.kv_type == "q8_0" and .decode_tok_s > 0
     and .kv_bytes_per_token * 128 == $b * 34' <<<"$j8" >/dev/null || fail "--kv-type q8_0: $j8"
if err=$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/qwen3" --kv-type q8 2>&1); then fail "--kv-type q8 accepted"; fi
grep -q -- "--kv-type is f32, f16, bf16 or q8_0, got 'q8'" <<<"$err" || fail "--kv-type q8: $err"
grep -q -- "--kv-type" <<<"$("$SLUICE_BIN" bench --help)" || fail "--help has no --kv-type"

# MoE: a token reads top_k of n_experts experts, so less than the whole checkpoint
jq -e '.bytes_per_token < 0.6 * .weight_bytes' \
  <<<"$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/qwen3_moe" -p 4 -n 1 --json)" >/dev/null ||
  fail "qwen3_moe: bytes per token should count only the routed experts"

# read whole: grep -q stops at its match, and under pipefail the writer's SIGPIPE would fail the check
help=$("$SLUICE_BIN" bench --help)
grep -q "usage: sluice bench" <<<"$help" || fail "--help"
grep -q "qwen3.5-397b-a17b" <<<"$help" || fail "--help does not list the synthetic shapes"
# the real models' shapes with their published sizes, and each quant's checkpoint size as written
grep -Eq "^  deepseek-v3 +DeepSeek-V3 671B \(37B active\)" <<<"$help" || fail "--help: no deepseek-v3 shape"
grep -Eq "^  gpt-oss-120b +gpt-oss-120b 117B" <<<"$help" || fail "--help: no gpt-oss-120b shape"
grep -Eq "^  gpt-oss-20b +gpt-oss-20b 21B" <<<"$help" || fail "--help: no gpt-oss-20b shape"
# (the shipped checkpoints: 689 GB with DeepSeek-V3's multi-token-prediction layer, not written here; 65.3 GB)
grep -Eq "^ +fp8 67[0-9]\.[0-9]+ GB, bf16 1\.3[0-9] TB$" <<<"$help" || fail "--help: deepseek-v3 sizes"
grep -Eq "^ +mxfp4 65\.[0-9]+ GB, bf16 23[0-9]\.[0-9]+ GB$" <<<"$help" || fail "--help: gpt-oss-120b sizes"
grep -Eq "^ +mxfp4 13\.[0-9]+ GB, bf16 4[0-9]\.[0-9]+ GB$" <<<"$help" || fail "--help: gpt-oss-20b sizes"

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
# DeepSeek-V3 and gpt-oss as they ship (block FP8; MXFP4 experts) and in bf16, through the same writer as
# the full-size shapes: 2 of 4 layers are one dense and one MoE layer, one sliding (window 16 < 24 tokens)
# and one full layer. The quant a model ships in is the default.
finite() { # FILE.f32 ROWS VOCAB: every logit finite, not all alike
  python3 - "$@" <<'EOF'
import array, math, sys
a = array.array("f")
a.frombytes(open(sys.argv[1], "rb").read())
assert len(a) == int(sys.argv[2]) * int(sys.argv[3]), len(a)
assert all(math.isfinite(x) for x in a), "not finite"
assert max(a) - min(a) > 1e-3, "flat logits"
EOF
}
for shape in tiny-deepseek-v3 tiny-gpt-oss; do
  for q in default bf16; do
    want=$q
    [ $q = default ] && { [ $shape = tiny-gpt-oss ] && want=mxfp4 || want=fp8; }
    args=(--layers 2)
    [ $q = default ] || args+=(--quant $q)
    json=$("$SLUICE_BIN" bench --synthetic $shape "${args[@]}" -p 24 -n 4 --json) || fail "$shape $q: bench failed"
    jq -e --arg s "$shape $want" '.synthetic == $s and .decode_tok_s > 0 and .n_experts == 16
         and .routing_experts_used >= 8' <<<"$json" >/dev/null || fail "$shape $q: $json"
    dir="$SLUICE_CACHE/synthetic/$shape-$want-2L"
    onDisk=$(($(stat -c %s "$dir"/model*.safetensors | paste -sd+)))
    jq -e --argjson d "$onDisk" '.weight_bytes <= $d and .weight_bytes > 0.95 * $d' <<<"$json" >/dev/null ||
      fail "$shape $q: weight bytes vs $onDisk on disk: $json"
    show=$("$SLUICE_BIN" show "$dir")
    case $want in
    fp8) fmt="BF16, FP8 e4m3/128x128" ;;
    mxfp4) fmt="BF16, MXFP4" ;;
    *) fmt="BF16" ;;
    esac
    grep -Eq "^  weight formats +$fmt$" <<<"$show" || fail "$shape $q: weight formats are not $fmt:"$'\n'"$show"
    grep -Eq "^  layers +2$" <<<"$show" || fail "$shape $q: not 2 layers"
    if [ $shape = tiny-deepseek-v3 ]; then
      grep -Eq "^  routing +sigmoid scores, best 2 of 4 groups, weights x 2.5, leading layers dense" <<<"$show" ||
        fail "$shape $q: routing:"$'\n'"$show"
    else
      grep -Eq "^  sliding window +16$" <<<"$show" || fail "$shape $q: no sliding window"
      jq -e '.layer_types == ["sliding_attention", "full_attention"] and .swiglu_limit == 7' "$dir/config.json" \
        >/dev/null || fail "$shape $q: config"
    fi
    "$SLUICE_BIN" logits "$dir" --ids "$(seq -s, 7 5 120)" --decode-ids 3,9 --out "$SLUICE_CACHE/l.f32" ||
      fail "$shape $q: logits"
    finite "$SLUICE_CACHE/l.f32" 25 512 || fail "$shape $q: logits"
  done
done
jq -e '.quantization_config == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
       "weight_block_size": [128, 128]} and .rope_scaling.type == "yarn" and .rope_scaling.mscale_all_dim == 1' \
  "$SLUICE_CACHE/synthetic/tiny-deepseek-v3-fp8-2L/config.json" >/dev/null || fail "deepseek-v3 fp8 config"
jq -e '.quantization_config.quant_method == "mxfp4"' "$SLUICE_CACHE/synthetic/tiny-gpt-oss-mxfp4-2L/config.json" \
  >/dev/null || fail "gpt-oss mxfp4 config"
# one dense latent-attention layer: a token reads every weight but the embedding table's other rows, and
# kv_b_proj as float32 (4 bytes a weight where the file holds 1)
jq -e '.bytes_per_token >= .weight_bytes - 512 * 256 * 2' \
  <<<"$("$SLUICE_BIN" bench --synthetic tiny-deepseek-v3 --layers 1 -p 4 -n 1 --json)" >/dev/null ||
  fail "deepseek-v3: decode weight reads miss the latent attention's weights"
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
expect_usage_error "--quant for tiny-llama must be bf16, mlx4, mlx8 or q4k, got 'q4'" --synthetic tiny-llama --quant q4
expect_usage_error "--quant for deepseek-v3 must be fp8 or bf16, got 'mlx4'" --synthetic deepseek-v3 --quant mlx4
expect_usage_error "--quant for gpt-oss-120b must be mxfp4 or bf16, got 'fp8'" --synthetic gpt-oss-120b --quant fp8
expect_usage_error "--quant for tiny-llama must be bf16, mlx4, mlx8 or q4k, got 'mxfp4'" --synthetic tiny-llama --quant mxfp4
expect_usage_error "not both" "$SLUICE_FIXTURES/models/qwen3" --synthetic tiny-llama

set +e
err=$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/does_not_exist" 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "bad model: exit $rc, expected 1"
[ "$(wc -l <<<"$err")" -eq 1 ] || fail "bad model: expected one line, got: $err"
echo "ok"
