#!/usr/bin/env bash
# Prompt and decode speed side by side: llama.cpp's llama-bench and `sluice bench` on the same GGUF files,
# same GPU, same prompt/generation lengths, repetitions and cache depth, one table with the ratio and the
# physical bound beside each figure (sluice's measured peak multiply-add rate and read bandwidth).
#   bench/vs-llamacpp.sh LLAMA_CPP_BIN_DIR FILE.gguf [FILE.gguf ...]
# Environment: P (prompt sizes, default 512,4096), N (generated tokens, default 128), R (repetitions,
# default 3), D (cache depths, default 0, as llama-bench -d; e.g. 0,16384), PD (prompt sizes at depths
# above 0, default 512), SLUICE_BIN (default build/sluice).
# llama.cpp runs every layer on the GPU with flash attention (-ngl 99 -fa 1). llama-bench reports the mean of
# its repetitions, sluice the best; both skip a warm-up. pp rows: tokens of the prompt per second; tg rows:
# generated tokens per second from a cache of D tokens (sluice: D + 1, the one-token prompt).
set -euo pipefail
L=${1:?usage: vs-llamacpp.sh LLAMA_CPP_BIN_DIR FILE.gguf [FILE.gguf ...]}
shift
[ $# -gt 0 ] || { echo "usage: vs-llamacpp.sh LLAMA_CPP_BIN_DIR FILE.gguf [FILE.gguf ...]" >&2; exit 2; }
P0=${P:-512,4096} N=${N:-128} R=${R:-3} DS=${D:-0} PD=${PD:-512}
S=${SLUICE_BIN:-build/sluice}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for F in "$@"; do
    name=$(basename "$F")
    for D in ${DS//,/ }; do
        P=$P0
        [ "$D" -gt 0 ] && P=$PD
        rm -f "$T"/pp*.json "$T/tg.json"
        "$L/llama-bench" -m "$F" -ngl 99 -fa 1 -p "$P" -n "$N" -r "$R" -d "$D" -o jsonl >"$T/llama.jsonl" 2>"$T/llama.err" ||
            { echo "llama-bench failed on $F (d$D), its rows say so:" >&2; tail -20 "$T/llama.err" >&2; : >"$T/llama.jsonl"; }
        for p in ${P//,/ }; do
            "$S" bench "$F" --backend cuda -p "$p" -n 0 -r "$R" -d "$D" --json >"$T/pp$p.json" 2>"$T/s.err" ||
                { echo "sluice bench failed on $F (pp$p, d$D): $(tail -1 "$T/s.err")" >&2; rm -f "$T/pp$p.json"; }
        done
        if [ "$N" -gt 0 ]; then
            "$S" bench "$F" --backend cuda -p 1 -n "$N" -r "$R" -d "$D" --json >"$T/tg.json" 2>"$T/s.err" ||
                { echo "sluice bench failed on $F (tg$N, d$D): $(tail -1 "$T/s.err")" >&2; rm -f "$T/tg.json"; }
        fi
        python3 - "$T" "$name" "$P" "$N" "$D" <<'EOF' >>"$T/rows.md"
import json, sys, os
T, name, P, N, D = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
lc = [json.loads(l) for l in open(os.path.join(T, "llama.jsonl")) if l.strip()]
def llama(pp, tg):
    for r in lc:
        if r["n_prompt"] == pp and r["n_gen"] == tg:
            return r["avg_ts"]
    return float("nan")
dep = f" @ d{D}" if D else ""
def ratio(st, lt):
    return f"{st / lt:.2f}x" if lt == lt else "llama.cpp failed"
for p in P.split(","):
    if not os.path.exists(os.path.join(T, f"pp{p}.json")):
        print(f"| {name} | pp{p}{dep} | {llama(int(p), 0):,.0f} | failed | | |")
        continue
    s = json.load(open(os.path.join(T, f"pp{p}.json")))
    st = s["prefill_tok_s"]
    bound = st * s["peak_gflop_s"] / s["prefill_gflop_s"] if s.get("peak_gflop_s") else float("nan")
    lt = llama(int(p), 0)
    print(f"| {name} | pp{p}{dep} | {lt:,.0f} | {st:,.0f} | {ratio(st, lt)} | {bound:,.0f} tok/s (FLOPs ÷ peak) |")
if N > 0 and not os.path.exists(os.path.join(T, "tg.json")):
    print(f"| {name} | tg{N}{dep} | {llama(0, N):,.1f} | failed | | |")
elif N > 0:
    s = json.load(open(os.path.join(T, "tg.json")))
    st = s["decode_tok_s"]
    bound = s.get("decode_bound_tok_s", float("nan"))
    lt = llama(0, N)
    frac = f", sluice at {100 * st / bound:.0f} %" if bound == bound else ""
    print(f"| {name} | tg{N}{dep} | {lt:,.1f} | {st:,.1f} | {ratio(st, lt)} | {bound:,.0f} tok/s (bytes ÷ bandwidth{frac}) |")
EOF
    done
done
echo "| file | test | llama.cpp tok/s | sluice tok/s | sluice ÷ llama.cpp | bound |"
echo "|---|---|---:|---:|---:|---|"
cat "$T/rows.md"
