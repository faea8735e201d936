#!/usr/bin/env bash
# Experts off the GPU, side by side: llama.cpp with its experts in RAM computed by the CPU (`-ot exps=CPU`,
# and `--n-cpu-moe N` for each N in NCMOE) against `sluice bench` streaming the same GGUF file under each
# setup in SETUPS, one table with the ratio to llama.cpp's `-ot exps=CPU`, and for sluice the bounds and
# counters that say where its time goes (I/O bound, routing wait, share of experts computed on the CPU,
# decode and prompt rates as predicted from the tiers and the measured speeds).
#   bench/vs-llamacpp-offload.sh LLAMA_CPP_BIN_DIR FILE.gguf
# Environment: P (prompt tokens, default 512), N (generated tokens, default 128), R (repetitions, default
# 3), NCMOE (llama.cpp --n-cpu-moe values, comma separated, default none), SETUPS (sluice flag sets
# separated by '|', default: --vram 2G with a host cache of 8G and with none (the page cache), under CPU
# experts auto and off, and with a host cache under on),
# SLUICE_BIN (default build/sluice), SLUICE_BACKEND (default cuda).
set -euo pipefail
usage="usage: vs-llamacpp-offload.sh LLAMA_CPP_BIN_DIR FILE.gguf"
L=${1:?$usage}
F=${2:?$usage}
P=${P:-512} N=${N:-128} R=${R:-3} NCMOE=${NCMOE:-}
SETUPS=${SETUPS:---vram 2G --ram 8G|--vram 2G --ram 8G --cpu-experts off|--vram 2G --ram 8G --cpu-experts on|--vram 2G --ram 0|--vram 2G --ram 0 --cpu-experts off}
S=${SLUICE_BIN:-build/sluice}
BK=${SLUICE_BACKEND:-cuda}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
name=$(basename "$F")
# llama.cpp: every layer on the GPU but the experts (all of them, or those of the first N layers)
lrun() { # LABEL ARGS...
    local label=$1
    shift
    if "$L/llama-bench" -m "$F" -ngl 99 -fa 1 -p "$P" -n "$N" -r "$R" "$@" -o jsonl >"$T/l.jsonl" 2>"$T/l.err"; then
        python3 - "$T/l.jsonl" "$label" "$P" "$N" >>"$T/llama.tsv" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
pp = next((r["avg_ts"] for r in rows if r["n_prompt"] == int(sys.argv[3]) and r["n_gen"] == 0), float("nan"))
tg = next((r["avg_ts"] for r in rows if r["n_prompt"] == 0 and r["n_gen"] == int(sys.argv[4])), float("nan"))
print(f"{sys.argv[2]}\t{pp}\t{tg}")
EOF
    else
        echo "llama-bench failed ($label):" >&2
        tail -5 "$T/l.err" >&2
        printf '%s\tnan\tnan\n' "$label" >>"$T/llama.tsv"
    fi
}
: >"$T/llama.tsv"
lrun "llama.cpp -ot exps=CPU" -ot "exps=CPU"
for n in ${NCMOE//,/ }; do lrun "llama.cpp --n-cpu-moe $n" -ncmoe "$n"; done
# sluice: each setup, prompt and decode in one run
i=0
IFS='|' read -r -a sets <<<"$SETUPS"
for set in "${sets[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086 # a setup is a list of flags
    "$S" bench "$F" --backend "$BK" -p "$P" -n "$N" -r "$R" $set --json >"$T/s$i.json" 2>"$T/s$i.err" ||
        { echo "sluice bench failed ($set): $(tail -1 "$T/s$i.err")" >&2; rm -f "$T/s$i.json"; }
    echo "$set" >"$T/s$i.set"
done
python3 - "$T" "$name" "$P" "$N" "$i" <<'EOF'
import json, math, os, sys
T, name, P, N, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
llama = [l.rstrip("\n").split("\t") for l in open(os.path.join(T, "llama.tsv"))]
base_pp, base_tg = float(llama[0][1]), float(llama[0][2])
def ratio(a, b):
    return f"{a / b:.2f}x" if b == b and b > 0 and a == a else ""
print(f"{name}: prompt {P} tokens, {N} generated; ratios against {llama[0][0]}")
print()
print(f"| setup | pp{P} tok/s | tg{N} tok/s | pp ratio | tg ratio | where sluice's decode time goes |")
print("|---|---:|---:|---:|---:|---|")
for label, pp, tg in llama:
    pp, tg = float(pp), float(tg)
    print(f"| {label} | {pp:,.0f} | {tg:,.1f} | {ratio(pp, base_pp)} | {ratio(tg, base_tg)} | |")
for k in range(1, n + 1):
    setup = open(os.path.join(T, f"s{k}.set")).read().strip()
    path = os.path.join(T, f"s{k}.json")
    if not os.path.exists(path):
        print(f"| sluice {setup} | failed | failed | | | |")
        continue
    s = json.load(open(path))
    pp, tg = s["prefill_tok_s"], s.get("decode_tok_s", float("nan"))
    notes = []
    x = s.get("streaming")
    if x:
        d = x["decode"]
        tok = d["tokens"] or 1
        look = d["lookups"] or 1
        bound = x.get("decode_io_bound_tok_s")  # reads and page-cache experts at the tier's rate; none under an expert a token
        if bound:
            notes.append(f"I/O bound {bound:,.1f} tok/s ({100 * tg / bound:.0f} % of it)")
        notes.append(f"routing wait {1e3 * d['route_wait_s'] / tok:.2f} ms/token")
        notes.append(f"host {1e3 * d['host_s'] / tok:.2f} ms/token")
        if d.get("sync_s"):
            notes.append(f"waits for buffers {1e3 * d['sync_s'] / tok:.2f} ms/token")
        notes.append(f"slots {100 * d['hits_slots'] / look:.0f} %")
        if d.get("cpu_experts"):
            notes.append(f"on the CPU {100 * d['cpu_experts'] / look:.0f} % ({1e3 * d['cpu_s'] / tok:.2f} ms/token)")
        if x.get("decode_predicted_tok_s"):
            notes.append(f"predicted {x['decode_predicted_tok_s']:,.1f} tok/s")
        if x.get("prefill_predicted_tok_s"):
            notes.append(f"prompt predicted {x['prefill_predicted_tok_s']:,.0f} tok/s")
    else:
        notes.append("resident")
    print(f"| sluice {setup} | {pp:,.0f} | {tg:,.1f} | {ratio(pp, base_pp)} | {ratio(tg, base_tg)} | {'; '.join(notes)} |")
EOF
