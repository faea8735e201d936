#!/usr/bin/env bash
# `sluice ppl`: output format, and the estimate against one computed here from `sluice logits` rows of
# the same chunks (llama-perplexity's chunking: chunks of --ctx tokens, the second half scored).
set -euo pipefail
BIN=${SLUICE_BIN:?}
FIX=${SLUICE_FIXTURES:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
G="$FIX/gguf/llama-Q8_0/model.gguf"
Q="$FIX/gguf/qwen3_5_moe-IQ4_XS/model.gguf"

python3 - "$tmp/text.txt" <<'EOF'
import random, sys
random.seed(7)
w = "the of and to in is that for it as was with be by on not he this are or from at which".split()
open(sys.argv[1], "w").write(" ".join(random.choice(w) for _ in range(260)) + "\n")
EOF

"$BIN" ppl --help | grep -q "usage: sluice ppl MODEL FILE" || fail "--help"

# a tokenizer that adds a BOS (<|endoftext|> here): every chunk then starts with it
BM=$tmp/bos
mkdir -p "$BM"
ln -s "$FIX/models/qwen3/config.json" "$FIX/models/qwen3/model.safetensors" "$BM/"
python3 - "$FIX/tiny_tokenizer/tokenizer.json" "$BM/tokenizer.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
eot = next(a["id"] for a in t["added_tokens"] if a["content"] == "<|endoftext|>")
bos = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
t["post_processor"] = {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                       "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [eot], "tokens": ["<|endoftext|>"]}}}
json.dump(t, open(sys.argv[2], "w"))
EOF

for M in "$G" "$Q" "$BM"; do
    for B in 64 24; do
        "$BIN" ppl "$M" "$tmp/text.txt" --ctx 64 --batch $B --chunks 3 >"$tmp/out" 2>"$tmp/err" ||
            fail "ppl: $(cat "$tmp/err")"
        grep -qE '^\[1\][0-9]+\.[0-9]{4},\[2\][0-9]+\.[0-9]{4},\[3\][0-9]+\.[0-9]{4},$' "$tmp/out" ||
            fail "running estimates: $(cat "$tmp/out")"
        grep -qE '^Final estimate: PPL = [0-9]+\.[0-9]{4} \+/- [0-9]+\.[0-9]{5}$' "$tmp/out" ||
            fail "final line: $(cat "$tmp/out")"
        grep -qE '^ +3 +93 +[0-9.]+ +[0-9.]+s$' "$tmp/err" || fail "table: $(cat "$tmp/err")"

        # the same chunks through `sluice logits`, scored here
        "$BIN" tokenize "$M" --specials <"$tmp/text.txt" >"$tmp/ids.json"
        "$BIN" tokenize "$M" <"$tmp/text.txt" >"$tmp/plain.json"
        grep -q "BOS $([ "$M" = "$BM" ] && echo replaces || echo "not added")" "$tmp/err" || fail "BOS: $(cat "$tmp/err")"
        for c in 0 1 2; do
            # with a BOS, the first token of every chunk is replaced by it
            ids=$(python3 -c "
import json, sys
t, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
c = t[$c * 64:$c * 64 + 64]
if len(t) > len(p): c[0] = t[0]
print(','.join(map(str, c)))" "$tmp/ids.json" "$tmp/plain.json")
            "$BIN" logits "$M" --ids "$ids" --out "$tmp/l$c.f32"
        done
        python3 - "$tmp" "$tmp/out" <<'EOF' || fail "estimate differs from the logits: $(cat "$tmp/out")"
import json, math, re, struct, sys
d = sys.argv[1]
toks = json.load(open(d + "/ids.json"))
n_ctx, first, nll, nll2, cnt, running = 64, 32, 0.0, 0.0, 0, []
for c in range(3):
    raw = open(f"{d}/l{c}.f32", "rb").read()
    V = len(raw) // 4 // n_ctx
    rows = struct.unpack(f"<{n_ctx * V}f", raw)
    chunk = toks[c * n_ctx:(c + 1) * n_ctx]
    for p in range(first, n_ctx - 1):
        row = rows[p * V:(p + 1) * V]
        mx = max(row)
        lp = row[chunk[p + 1]] - mx - math.log(sum(math.exp(x - mx) for x in row))
        nll -= lp
        nll2 += lp * lp
        cnt += 1
    running.append(math.exp(nll / cnt))
mean = nll / cnt
ppl = math.exp(mean)
se = math.sqrt((nll2 / cnt - mean * mean) / (cnt - 1)) * ppl
out = open(sys.argv[2]).read()
got = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", out)]
m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
ok = len(got) == 3 and all(abs(g - r) <= 1e-4 * r for g, r in zip(got, running))
ok = ok and abs(float(m.group(1)) - ppl) <= 1e-4 * ppl and abs(float(m.group(2)) - se) <= 1e-3 * se + 1e-5
print(f"want {running} PPL {ppl:.4f} +/- {se:.5f}")
sys.exit(0 if ok else 1)
EOF
    done
done

# errors say what was expected
if "$BIN" ppl "$G" "$tmp/text.txt" --ctx 4096 >/dev/null 2>"$tmp/err"; then fail "short text accepted"; fi
grep -q "text.txt: [0-9]* tokens, but a context of 4096 needs at least 8192 (two chunks)" "$tmp/err" ||
    fail "short text: $(cat "$tmp/err")"
if "$BIN" ppl "$G" "$tmp/text.txt" --ctx 1 2>"$tmp/err"; then fail "--ctx 1 accepted"; fi
grep -q -- "--ctx: expected an integer >= 2, got '1'" "$tmp/err" || fail "--ctx: $(cat "$tmp/err")"
if "$BIN" ppl "$G" "$tmp/none.txt" 2>"$tmp/err"; then fail "missing file accepted"; fi
grep -q "none.txt" "$tmp/err" || fail "missing file: $(cat "$tmp/err")"
if "$BIN" ppl "$G" 2>"$tmp/err"; then fail "missing FILE accepted"; fi
grep -q "MODEL and FILE are required" "$tmp/err" || fail "missing FILE: $(cat "$tmp/err")"
echo "ok"
