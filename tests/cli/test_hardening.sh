#!/usr/bin/env bash
# sluice serve against abusive clients: many half-open connections from one address must not lock out
# another, and an oversized body is refused with 413 before it is read (declared length) or as soon as it
# passes the limit (chunked). Sockets are driven from python3; timeouts below only guard against a hang.
set -euo pipefail
BIN=${SLUICE_BIN:?} FIX=${SLUICE_FIXTURES:?}
T=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" serve "$FIX/scripted_model" --port 0 --max-body 1K >"$T/log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
    grep -q "ready:" "$T/log" && break
    sleep 0.1
done
grep -q "ready:" "$T/log" || { cat "$T/log"; fail "server did not start"; }
PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/log" | head -1 | sed 's/.*://')

# 520 connections from 127.0.0.1 that never send a full request; while they are open, a client on another
# loopback address (127.0.0.2) still gets answers
python3 - "$PORT" <<'PY' || fail "a client was locked out by half-open connections from another address"
import socket, sys, http.client
port = int(sys.argv[1])
held = []
for i in range(520):
    s = socket.socket()
    s.settimeout(30)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        held.append(s)
    except OSError:
        s.close()
for k in range(3):
    c = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=("127.0.0.2", 0))
    c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    reply = b""
    while True:
        d = c.recv(4096)
        if not d:
            break
        reply += d
    c.close()
    if not reply.startswith(b"HTTP/1.1 200"):
        print("reply:", reply[:200], file=sys.stderr)
        sys.exit(1)
for s in held:
    s.close()
PY

# a declared body over --max-body is answered 413 at once, without the body being sent
python3 - "$PORT" <<'PY' || fail "413 for a declared Content-Length"
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: 17000000\r\n\r\n")
reply = c.recv(4096)
if not reply.startswith(b"HTTP/1.1 413") or b"--max-body" not in reply:
    print("reply:", reply[:300], file=sys.stderr)
    sys.exit(1)
PY

# a chunked body is refused as soon as it passes the limit, while the body is still open: with a 413 where
# libmicrohttpd can queue a reply mid-upload, else by closing the connection (before, it was read to the end)
python3 - "$PORT" <<'PY' || fail "a chunked body past the limit"
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
c.sendall(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Transfer-Encoding: chunked\r\n\r\n")
chunk = b"x" * 600
for _ in range(3):
    c.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
try:
    reply = c.recv(4096)  # no terminating chunk was sent
except ConnectionResetError:
    reply = b""
if reply and (not reply.startswith(b"HTTP/1.1 413") or b"--max-body" not in reply):
    print("reply:", reply[:300], file=sys.stderr)
    sys.exit(1)
PY

# requests still work, streamed and whole
curl -sf "http://127.0.0.1:$PORT/health" | grep -q ok || fail "/health after the abuse"
curl -sfN "http://127.0.0.1:$PORT/v1/chat/completions" \
    -d '{"model":"m","messages":[{"role":"user","content":"Weather?"}],"stream":true}' | tail -2 | grep -q 'data: \[DONE\]' ||
    fail "streaming after the abuse"
curl -sf "http://127.0.0.1:$PORT/v1/chat/completions" \
    -d '{"model":"m","messages":[{"role":"user","content":"Weather?"}]}' | jq -e '.choices[0].message' >/dev/null ||
    fail "a whole reply after the abuse"
# a URL that percent-decodes to bytes that are not UTF-8 is quoted in its 404 (it was a 500: the JSON library
# refused the message)
code=$(curl -s -o "$T/body" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/models/%ff%fe")
[ "$code" = 404 ] && jq -e '.error.message | contains("is not served here")' "$T/body" >/dev/null ||
    { cat "$T/body"; fail "a model name that is not UTF-8 answered $code"; }
echo "ok"

# corrupt weights (the final norm set to NaN) give one clear error, from the CLI and as a request error
cp -L "$FIX/chat_model/"* "$T/"
mkdir -p "$T/nan" && mv "$T"/*.json "$T/model.safetensors" "$T/nan/"
python3 - "$T/nan/model.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
s, e = json.loads(b[8:8 + n])["model.norm.weight"]["data_offsets"]
b[8 + n + s:8 + n + e] = b"\xff" * (e - s)
open(sys.argv[1], "wb").write(b)
PY
WANT="non-finite logits (NaN/Inf) at position"
"$BIN" run "$T/nan" "Hello" -n 4 --temp 1 2>"$T/err" >/dev/null && fail "run on NaN weights succeeded"
grep -q "$WANT" "$T/err" || { cat "$T/err"; fail "run: no non-finite error"; }
"$BIN" logits "$T/nan" --ids 1,2,3 --out "$T/x.f32" 2>"$T/err" && fail "logits on NaN weights succeeded"
grep -q "$WANT .*weights may be corrupt" "$T/err" || { cat "$T/err"; fail "logits: no non-finite error"; }
"$BIN" serve "$T/nan" --port 0 >"$T/nan.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
    grep -q "ready:" "$T/nan.log" && break
    sleep 0.1
done
NURL=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/nan.log" | head -1)
code=$(curl -s -o "$T/body" -w '%{http_code}' "$NURL/v1/chat/completions" \
    -d '{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1,"max_tokens":3}')
[ "$code" = 500 ] && jq -e --arg w "$WANT" '.error.message | contains($w)' "$T/body" >/dev/null ||
    { cat "$T/body"; fail "server: NaN logits answered $code"; }
curl -sN "$NURL/api/chat" -d '{"model":"m","messages":[{"role":"user","content":"hi"}],"options":{"temperature":1}}' |
    grep -q "$WANT" || fail "server: streamed NaN logits"
curl -sf "$NURL/health" | grep -q ok || fail "/health after a failed request"
echo "ok: corrupt weights"
