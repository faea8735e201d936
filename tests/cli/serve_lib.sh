# Sourced by the server tests: the binary and fixtures, a scratch folder removed at exit with every server
# the test started, and helpers. Sets BIN, FIX, SRC (the source tree), T, and after start URL and PID.
set -euo pipefail
BIN=${SLUICE_BIN:?} FIX=${SLUICE_FIXTURES:?}
SRC=$(cd "$FIX/../.." && pwd)
T=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# start NAME MODEL [flags]: runs a server on a free port, sets URL and PID once it is ready
start() {
    local name=$1
    shift
    "$BIN" serve "$@" --port 0 >"$T/$name.log" 2>&1 &
    PID=$!
    PIDS+=("$PID")
    for _ in $(seq 100); do
        grep -q "ready:" "$T/$name.log" && break
        sleep 0.1
    done
    grep -q "ready:" "$T/$name.log" || { cat "$T/$name.log"; fail "$name did not start"; }
    URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/$name.log" | head -1)
}
# post PATH BODY: the status, with the body in $T/body
post() { curl -s -o "$T/body" -w '%{http_code}' "$URL$1" -H 'Content-Type: application/json' -d "$2"; }
