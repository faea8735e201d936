#!/usr/bin/env bash
# Embeddings through sluice serve (/v1/embeddings, /api/embed, /api/embeddings) on the qwen3 fixture as a
# stand-in decoder embedding model, its tokenizer given Qwen3-Embedding's post-processor (<|endoftext|>
# appended). The reference is independent of the server's code path: the last row of `sluice logits` for
# the same ids is lm_head . h, with h the final-norm hidden state, so the embedding e = h / |h| must satisfy
# logits = s * (lm_head . e) for one s > 0 (lm_head read here from the safetensors file; 512 x 128, so the
# direction of h is pinned). Also: unit norm, Matryoshka dimensions, base64, batches, token-id inputs,
# truncation, errors naming the field.
set -euo pipefail
BIN=${SLUICE_BIN:?} FIX=${SLUICE_FIXTURES:?}
T=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

M=$T/model
mkdir -p "$M"
ln -s "$FIX/models/qwen3/config.json" "$FIX/models/qwen3/model.safetensors" "$FIX/tiny_tokenizer/tokenizer_config.json" "$M/"
python3 - "$FIX/tiny_tokenizer/tokenizer.json" "$M/tokenizer.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
seq = {"Sequence": {"id": "A", "type_id": 0}}
end = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
eot = next(a["id"] for a in t["added_tokens"] if a["content"] == "<|endoftext|>")
t["post_processor"] = {"type": "TemplateProcessing", "single": [seq, end],
                       "pair": [seq, end, {"Sequence": {"id": "B", "type_id": 1}}, end],
                       "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [eot], "tokens": ["<|endoftext|>"]}}}
json.dump(t, open(sys.argv[2], "w"))
EOF
EOT=$("$BIN" tokenize "$M" '<|endoftext|>')

"$BIN" serve "$M" --port 0 --ctx 64 >"$T/log" 2>&1 &
PID=$!
for _ in $(seq 100); do
    grep -q "ready:" "$T/log" && break
    sleep 0.1
done
grep -q "ready:" "$T/log" || { cat "$T/log"; fail "server did not start"; }
URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/log" | head -1)
post() { curl -s -o "$T/body" -w '%{http_code}' "$URL$1" -H 'Content-Type: application/json' -d "$2"; }

# ref NAME TEXT VECTOR_FILE: the vector against the logits of the text's ids (which end with <|endoftext|>)
ref() {
    "$BIN" tokenize "$M" --specials "$2" >"$T/ids.json"
    [ "$(jq -c '.[-1:]' "$T/ids.json")" = "[${EOT:1:-1}]" ] || fail "$1: no <|endoftext|> appended: $(cat "$T/ids.json")"
    "$BIN" logits "$M" --ids "$(jq -r 'join(",")' "$T/ids.json")" --out "$T/l.f32"
    python3 - "$M/model.safetensors" "$T/l.f32" "$3" <<'EOF' || fail "$1: not the model's last hidden state"
import json, math, struct, sys
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
hdr = json.loads(f.read(n))
t = hdr["lm_head.weight"]
assert t["dtype"] == "BF16"
f.seek(8 + n + t["data_offsets"][0])
raw = f.read(t["data_offsets"][1] - t["data_offsets"][0])
V, H = t["shape"]
W = [struct.unpack("<f", b"\0\0" + raw[2 * i:2 * i + 2])[0] for i in range(V * H)]
L = struct.unpack(f"<{V}f", open(sys.argv[2], "rb").read()[-4 * V:])
e = json.load(open(sys.argv[3]))
assert len(e) == H, len(e)
assert abs(math.sqrt(sum(x * x for x in e)) - 1) < 1e-5, "not unit length"
We = [sum(W[r * H + c] * e[c] for c in range(H)) for r in range(V)]
s = sum(a * b for a, b in zip(We, L)) / sum(a * a for a in We)
res = math.sqrt(sum((L[r] - s * We[r]) ** 2 for r in range(V)) / sum(x * x for x in L))
print(f"scale {s:.4f}, relative residual {res:.2e}")
sys.exit(0 if s > 0 and res < 1e-3 else 1)
EOF
}

# OpenAI: a batch of strings, each vector the model's pooled state
[ "$(post /v1/embeddings '{"model":"m","input":["The quick brown fox","hello"]}')" = 200 ] || fail "batch: $(cat "$T/body")"
jq -e '.object == "list" and (.data | length) == 2 and .data[1].index == 1 and .data[0].object == "embedding" and
    .usage.prompt_tokens == .usage.total_tokens and .usage.prompt_tokens > 5' "$T/body" >/dev/null || fail "shape: $(cat "$T/body")"
jq '.data[0].embedding' "$T/body" >"$T/e0"
jq '.data[1].embedding' "$T/body" >"$T/e1"
ref "fox" "The quick brown fox" "$T/e0"
ref "hello" "hello" "$T/e1"

# one input alone equals its row of the batch; token ids as given equal the text's ids
post /v1/embeddings '{"input":"hello"}' >/dev/null
jq '.data[0].embedding' "$T/body" >"$T/single"
"$BIN" tokenize "$M" --specials hello >"$T/hello_ids"
post /v1/embeddings "{\"input\":[$(cat "$T/hello_ids")]}" >/dev/null
jq '.data[0].embedding' "$T/body" >"$T/tok"
post /v1/embeddings "{\"input\":$(cat "$T/hello_ids")}" >/dev/null
jq '.data[0].embedding' "$T/body" >"$T/flat"
python3 - "$T/e1" "$T/single" "$T/tok" "$T/flat" <<'EOF' || fail "single, token-id or flat inputs differ from the batch"
import json, sys
v = [json.load(open(p)) for p in sys.argv[1:]]
sys.exit(0 if all(max(abs(a - b) for a, b in zip(v[0], w)) < 1e-5 for w in v[1:]) else 1)
EOF

# dimensions: the first N values, normalised again; base64: little-endian float32
post /v1/embeddings '{"input":"hello","dimensions":16,"encoding_format":"base64"}' >/dev/null
jq -r '.data[0].embedding' "$T/body" >"$T/b64"
post /v1/embeddings '{"input":"hello","dimensions":16}' >/dev/null
jq '.data[0].embedding' "$T/body" >"$T/d16"
python3 - "$T/e1" "$T/d16" "$T/b64" <<'EOF' || fail "dimensions or base64"
import base64, json, math, struct, sys
full = json.load(open(sys.argv[1]))
d16 = json.load(open(sys.argv[2]))
raw = base64.b64decode(open(sys.argv[3]).read().strip())
b = struct.unpack("<16f", raw)
n = math.sqrt(sum(x * x for x in full[:16]))
ok = len(d16) == 16 and all(abs(x / n - y) < 1e-5 for x, y in zip(full[:16], d16))
ok = ok and all(abs(x - y) < 1e-6 for x, y in zip(b, d16)) and len(raw) == 64
sys.exit(0 if ok else 1)
EOF

# Ollama /api/embed (batch) and the older /api/embeddings give the same vectors
[ "$(post /api/embed '{"model":"m","input":["The quick brown fox","hello"]}')" = 200 ] || fail "api/embed: $(cat "$T/body")"
jq '.embeddings[1]' "$T/body" >"$T/o1"
jq -e '(.embeddings | length) == 2 and .model == "model" and (.prompt_eval_count | type) == "number"' "$T/body" >/dev/null ||
    fail "api/embed shape: $(cat "$T/body")"
[ "$(post /api/embeddings '{"model":"m","prompt":"hello"}')" = 200 ] || fail "api/embeddings: $(cat "$T/body")"
jq '.embedding' "$T/body" >"$T/o2"
python3 - "$T/e1" "$T/o1" "$T/o2" <<'EOF' || fail "Ollama vectors differ"
import json, sys
v = [json.load(open(p)) for p in sys.argv[1:]]
sys.exit(0 if all(max(abs(a - b) for a, b in zip(v[0], w)) < 1e-5 and len(w) == len(v[0]) for w in v[1:]) else 1)
EOF
[ "$(post /api/embeddings '{"model":"m","prompt":""}')" = 200 ] && jq -e '.embedding == []' "$T/body" >/dev/null ||
    fail "empty prompt: $(cat "$T/body")"

# truncation: Ollama cuts to the context keeping the end token; off, or on OpenAI, a long input is a 400
LONG=$(printf 'ab %.0s' $(seq 150))
[ "$(post /api/embed "{\"model\":\"m\",\"input\":\"$LONG\"}")" = 200 ] &&
    jq -e '.prompt_eval_count == 64 and (.embeddings[0] | length) == 128' "$T/body" >/dev/null || fail "truncate: $(cat "$T/body")"
[ "$(post /api/embed "{\"model\":\"m\",\"input\":\"$LONG\",\"truncate\":false}")" = 400 ] &&
    grep -q "tokens but the context holds 64" "$T/body" || fail "truncate false: $(cat "$T/body")"
[ "$(post /v1/embeddings "{\"input\":[\"hi\",\"$LONG\"]}")" = 400 ] &&
    jq -e '.error.param == "input[1]"' "$T/body" >/dev/null || fail "OpenAI long input: $(cat "$T/body")"

# errors name the field
[ "$(post /v1/embeddings '{"model":"m"}')" = 400 ] && jq -e '.error.param == "input"' "$T/body" >/dev/null ||
    fail "no input: $(cat "$T/body")"
[ "$(post /v1/embeddings '{"input":"hi","encoding_format":"int8"}')" = 400 ] &&
    jq -e '.error.param == "encoding_format"' "$T/body" >/dev/null || fail "encoding_format: $(cat "$T/body")"
[ "$(post /v1/embeddings '{"input":"hi","dimensions":129}')" = 400 ] &&
    jq -e '.error.param == "dimensions"' "$T/body" >/dev/null || fail "dimensions: $(cat "$T/body")"
[ "$(post /v1/embeddings '{"input":[[1,2],[3,99999]]}')" = 400 ] && grep -q 'input\[1\]\[1\] must be a token id in \[0, 512)' "$T/body" ||
    fail "token id: $(cat "$T/body")"
[ "$(post /v1/embeddings '{"input":["hi",""]}')" = 400 ] && jq -e '.error.param == "input[1]"' "$T/body" >/dev/null ||
    fail "empty string: $(cat "$T/body")"
[ "$(post /api/embed '{"model":"m","input":[1,2]}')" = 400 ] || fail "Ollama token ids: $(cat "$T/body")"

# a chat after embeddings still answers (the session was reset under it)
[ "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}')" = 200 ] ||
    fail "chat after embeddings: $(cat "$T/body")"
echo "ok"
