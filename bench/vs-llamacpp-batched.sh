#!/usr/bin/env bash
# Many sequences at once, side by side: llama.cpp's llama-batched-bench and `sluice bench --parallel` on the
# same GGUF file, same GPU, same prompt and generation lengths, one table with the ratio.
#   bench/vs-llamacpp-batched.sh LLAMA_CPP_BIN_DIR FILE.gguf [COUNTS=1,4,16,64] [PP=128] [TG=64]
# LLAMA_CPP_BIN_DIR holds a CUDA build of llama.cpp (llama-batched-bench); SLUICE_BIN (default build/sluice)
# is sluice. llama.cpp runs with every layer on the GPU and flash attention, each sequence its own prompt
# (not shared), as sluice does; decode rates are the aggregate tokens per second of all sequences.
set -euo pipefail
L=${1:?usage: vs-llamacpp-batched.sh LLAMA_CPP_BIN_DIR FILE.gguf [COUNTS] [PP] [TG]}
F=${2:?usage: vs-llamacpp-batched.sh LLAMA_CPP_BIN_DIR FILE.gguf [COUNTS] [PP] [TG]}
NPL=${3:-1,4,16,64} PP=${4:-128} TG=${5:-64}
S=${SLUICE_BIN:-build/sluice}
max=$(tr ',' '\n' <<<"$NPL" | sort -n | tail -1)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$L/llama-batched-bench" -m "$F" -ngl 99 -fa on -c $((max * (PP + TG) + 256)) -b 2048 -ub 512 \
    -npp "$PP" -ntg "$TG" -npl "$NPL" --output-format jsonl >"$T/llama.jsonl" 2>"$T/llama.err" ||
    { tail -20 "$T/llama.err"; exit 1; }
"$S" bench "$F" --backend cuda --parallel "$NPL" -p "$PP" -n "$TG" >"$T/sluice.txt" 2>"$T/sluice.err" ||
    { tail -20 "$T/sluice.err"; exit 1; }
echo "file: $F, prompt $PP tokens per sequence, $TG generated"
echo "| sequences | llama.cpp prompt tok/s | sluice prompt tok/s | llama.cpp decode tok/s | sluice decode tok/s | sluice ÷ llama.cpp (decode) |"
echo "|---:|---:|---:|---:|---:|---:|"
for n in ${NPL//,/ }; do
    read -r lpp ltg < <(grep "\"pl\": $n," "$T/llama.jsonl" | sed -E 's/.*"speed_pp": ([0-9.]+).*"speed_tg": ([0-9.]+).*/\1 \2/')
    read -r spp stg < <(awk -F'|' -v n="$n" '$2+0 == n && $2 ~ /[0-9]/ {gsub(/ /, ""); print $3, $4}' "$T/sluice.txt")
    awk -v n="$n" -v a="$lpp" -v b="$spp" -v c="$ltg" -v d="$stg" \
        'BEGIN { printf "| %d | %.1f | %.1f | %.1f | %.1f | %.2fx |\n", n, a, b, c, d, (c > 0 ? d / c : 0) }'
done
