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

"$SLUICE_BIN" bench --help | grep -q "usage: sluice bench" || fail "--help"

set +e
err=$("$SLUICE_BIN" bench "$SLUICE_FIXTURES/models/does_not_exist" 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "bad model: exit $rc, expected 1"
[ "$(wc -l <<<"$err")" -eq 1 ] || fail "bad model: expected one line, got: $err"
echo "ok"
