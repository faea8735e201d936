#!/usr/bin/env bash
# logprobs through sluice serve: every reported logprob is the model's log-softmax (checked against rows from
# `sluice logits` for the same prompt and generated ids), also when sampling at a temperature; top
# alternatives sorted, their probabilities summing to at most 1; streamed entries equal the whole reply's;
# OpenAI chat, legacy completions and Ollama shapes; errors naming the field.
set -euo pipefail
BIN=${SLUICE_BIN:?} FIX=${SLUICE_FIXTURES:?}
T=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
G=$FIX/gguf/llama-Q8_0/model.gguf

"$BIN" serve "$G" --port 0 >"$T/log" 2>&1 &
PID=$!
for _ in $(seq 100); do
    grep -q "ready:" "$T/log" && break
    sleep 0.1
done
grep -q "ready:" "$T/log" || { cat "$T/log"; fail "server did not start"; }
URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/log" | head -1)
post() { curl -s -o "$T/body" -w '%{http_code}' "$URL$1" -H 'Content-Type: application/json' -d "$2"; }

# check NAME ENTRIES_FILE: entries [{token, logprob, bytes, top_logprobs}] of a reply to the raw prompt "hi"
# against the model's log-softmax; the fixture's tokenizer spells each byte as one token (id = byte value)
# and its padding ids as "[PADn]"
cat >"$T/check.py" <<'EOF'
import json, math, re, struct, sys
d, mode = sys.argv[1], sys.argv[2]
ents = json.load(sys.stdin)
def tid(e):
    m = re.fullmatch(r"\[PAD(\d+)\]", e["token"])
    if m: return int(m.group(1))
    assert len(e["bytes"]) == 1, e
    return e["bytes"][0]
ids = [tid(e) for e in ents]
assert ids, "no tokens"
if mode == "gen":
    print(",".join(map(str, ids[:-1])))
    sys.exit(0)
prompt = json.load(open(d + "/prompt.json"))
raw = open(d + "/l.f32", "rb").read()
rows = len(prompt) + len(ids) - 1
V = len(raw) // 4 // rows
L = struct.unpack(f"<{rows * V}f", raw)
for k, e in enumerate(ents):
    r = L[(len(prompt) - 1 + k) * V:(len(prompt) + k) * V]
    mx = max(r)
    lse = mx + math.log(sum(math.exp(x - mx) for x in r))
    want = r[ids[k]] - lse
    assert abs(e["logprob"] - want) < 1e-4, (k, e["logprob"], want)
    top = e["top_logprobs"]
    lps = [t["logprob"] for t in top]
    assert lps == sorted(lps, reverse=True), lps
    assert sum(math.exp(x) for x in lps) <= 1 + 1e-6
    best = sorted(range(V), key=lambda i: (-r[i], i))[:len(top)]
    assert [tid(t) for t in top] == best, ([tid(t) for t in top], best)
    for t, i in zip(top, best):
        assert abs(t["logprob"] - (r[i] - lse)) < 1e-4
        assert t["bytes"] == list(t["token"].encode()) or t["token"] == "\ufffd"
print(f"{len(ents)} tokens ok")
EOF
check() {
    "$BIN" tokenize "$G" hi >"$T/prompt.json"
    python3 "$T/check.py" "$T" gen <"$2" >"$T/gen" || fail "$1: entries $(cat "$2")"
    local dec
    dec=$(cat "$T/gen")
    "$BIN" logits "$G" --ids "$(jq -r 'join(",")' "$T/prompt.json")" ${dec:+--decode-ids "$dec"} --out "$T/l.f32"
    python3 "$T/check.py" "$T" cmp <"$2" || fail "$1: $(cat "$2")"
}

# same A B: two entry lists with the same tokens and logprobs within 1e-5 (a request that reuses the cached
# prompt runs its last token alone, which may round differently)
same() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
def flat(x):
    return [(e["token"], e["logprob"]) for e in x] + [(t["token"], t["logprob"]) for e in x for t in e.get("top_logprobs", [])]
fa, fb = flat(a), flat(b)
sys.exit(0 if len(a) == len(b) and len(fa) == len(fb) and all(p[0] == q[0] and abs(p[1] - q[1]) < 1e-5 for p, q in zip(fa, fb)) else 1)
EOF
}

# Ollama generate (raw prompt) carries the shared entries: checked in full
[ "$(post /api/generate '{"model":"m","prompt":"hi","raw":true,"stream":false,"logprobs":true,"top_logprobs":4,"options":{"num_predict":5,"temperature":0}}')" = 200 ] ||
    fail "ollama generate: $(cat "$T/body")"
jq '.logprobs' "$T/body" >"$T/ents"
check "ollama generate" "$T/ents"
jq -e '.logprobs | length == 5 and all(.[]; (.top_logprobs | length) == 4)' "$T/body" >/dev/null ||
    fail "ollama count: $(cat "$T/body")"
[ "$(post /api/generate '{"model":"m","prompt":"hi","raw":true,"stream":false,"logprobs":true,"top_logprobs":4,"options":{"num_predict":5,"temperature":1.5,"seed":3}}')" = 200 ] ||
    fail "ollama sampled: $(cat "$T/body")"
jq '.logprobs' "$T/body" >"$T/ents"
check "ollama sampled" "$T/ents"
# streamed: the same entries, spread over the lines
curl -sN "$URL/api/generate" -d '{"model":"m","prompt":"hi","raw":true,"logprobs":true,"top_logprobs":4,"options":{"num_predict":5,"temperature":0}}' |
    jq -s '[.[].logprobs // empty | .[]]' >"$T/sents"
curl -s "$URL/api/generate" -d '{"model":"m","prompt":"hi","raw":true,"stream":false,"logprobs":true,"top_logprobs":4,"options":{"num_predict":5,"temperature":0}}' |
    jq '.logprobs' >"$T/ents"
same "$T/sents" "$T/ents" || fail "ollama streamed entries differ: $(cat "$T/sents")"

# legacy completions: the chosen tokens' logprobs as parallel arrays, equal to Ollama's for the same request
[ "$(post /v1/completions '{"prompt":"hi","max_tokens":5,"logprobs":5,"temperature":0}')" = 200 ] ||
    fail "completions: $(cat "$T/body")"
jq '.choices[0].logprobs | [.tokens, .token_logprobs] | transpose | map({token: .[0], logprob: .[1]})' "$T/body" >"$T/leg"
jq 'map({token, logprob})' "$T/ents" >"$T/ents2"
same "$T/leg" "$T/ents2" || fail "completions logprobs: $(cat "$T/body")"
jq -e '.choices[0].logprobs | (.tokens | length) == 5 and (.text_offset | length) == 5 and .text_offset[0] == 0 and
    all(.top_logprobs[]; length >= 1 and length <= 5)' "$T/body" >/dev/null || fail "completions arrays: $(cat "$T/body")"

# OpenAI chat: whole and streamed agree, entries under choices[0].logprobs.content
CHAT='"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"logprobs":true,"top_logprobs":3'
[ "$(post /v1/chat/completions "{$CHAT}")" = 200 ] || fail "chat: $(cat "$T/body")"
jq -e '.choices[0].logprobs.content | length == 4 and all(.[]; (.top_logprobs | length) == 3 and
    (.logprob | type) == "number" and (.bytes | type) == "array")' "$T/body" >/dev/null || fail "chat shape: $(cat "$T/body")"
jq -c '.choices[0].logprobs.content' "$T/body" >"$T/whole"
curl -sN "$URL/v1/chat/completions" -d "{$CHAT,\"stream\":true}" | grep '^data: {' | sed 's/^data: //' |
    jq -sc '[.[].choices[0].logprobs.content // empty | .[]]' >"$T/streamed"
same "$T/streamed" "$T/whole" || fail "chat streamed entries differ: $(cat "$T/streamed")"
# off by default
[ "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}')" = 200 ] &&
    jq -e '.choices[0].logprobs == null' "$T/body" >/dev/null || fail "logprobs without asking: $(cat "$T/body")"

# errors name the field
[ "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}')" = 400 ] &&
    jq -e '.error.param == "top_logprobs"' "$T/body" >/dev/null || fail "top_logprobs 21: $(cat "$T/body")"
[ "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"top_logprobs":2}')" = 400 ] &&
    grep -q "top_logprobs needs logprobs: true" "$T/body" || fail "top_logprobs alone: $(cat "$T/body")"
[ "$(post /v1/completions '{"prompt":"hi","logprobs":true}')" = 400 ] &&
    jq -e '.error.param == "logprobs"' "$T/body" >/dev/null || fail "completions logprobs true: $(cat "$T/body")"
[ "$(post /api/generate '{"model":"m","prompt":"hi","logprobs":"yes"}')" = 400 ] &&
    grep -q "logprobs" "$T/body" || fail "ollama logprobs string: $(cat "$T/body")"
echo "ok"
