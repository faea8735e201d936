#!/usr/bin/env bash
# sluice pull / list / rm and pulling on first use, against a fake Hub on 127.0.0.1 (tests/hub/fake_hub.py):
# the Hub cache layout, resume with a Range request after a cut connection, a wrong sha256 refused, the
# free-space check, progress lines, 401 / 403 / 404 explained, GGUF quant selection, run on a repo id
# not yet pulled, list and rm.
set -euo pipefail
BIN=${SLUICE_BIN:?} FIX=${SLUICE_FIXTURES:?}
HUB="$(cd "$(dirname "$0")/../hub" && pwd)/fake_hub.py"
T=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
unset HF_TOKEN HF_HOME HF_HUB_OFFLINE
export HF_TOKEN_PATH=$T/no-token

# the served repos: the chat fixture with files a run does not need, and a GGUF repo with three quants
R=$T/repo; mkdir -p "$R/original"
cp -L "$FIX/chat_model/"* "$R/"
echo "weights in another format" >"$R/pytorch_model.bin"
echo "consolidated" >"$R/original/consolidated.safetensors"
echo "# readme" >"$R/README.md"
G=$T/gguf; mkdir -p "$G"
cp "$FIX/gguf/llama-Q8_0/model.gguf" "$G/tiny-Q8_0.gguf"
cp "$FIX/gguf/llama-Q4_0/model.gguf" "$G/tiny-Q4_0.gguf"
echo part1 >"$G/tiny-Q2_K-00001-of-00002.gguf"
echo part2 >"$G/tiny-Q2_K-00002-of-00002.gguf"
echo proj >"$G/mmproj-tiny-f16.gguf"

# start_hub [KNOBS...]: a fresh server and log; sets $EP
start_hub() {
    [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
    rm -f "$T/port" "$T/log"
    python3 "$HUB" --port-file "$T/port" --log "$T/log" "$@" test-org/chat="$R" test-org/tiny-GGUF="$G" \
        test-org/private="$R" test-org/gated="$R" --private test-org/private --gated test-org/gated &
    PID=$!
    for _ in $(seq 100); do [ -s "$T/port" ] && break; sleep 0.1; done
    [ -s "$T/port" ] || fail "fake hub did not start"
    export HF_ENDPOINT="http://127.0.0.1:$(cat "$T/port")"
}
COMMIT=$(python3 -c 'import hashlib; print(hashlib.sha1(b"test-org/chat").hexdigest())')

# --help of each command
for c in pull list rm; do "$BIN" $c --help | grep -q "usage: sluice $c" || fail "$c --help"; done

# a full pull: the layout huggingface_hub writes, only the files a run needs, progress lines on stderr
start_hub
export HF_HUB_CACHE=$T/c1
out=$("$BIN" pull test-org/chat 2>"$T/err") || { cat "$T/err"; fail "pull exited $?"; }
E=$HF_HUB_CACHE/models--test-org--chat
[ "$out" = "$E/snapshots/$COMMIT" ] || fail "pull printed '$out'"
[ "$(cat "$E/refs/main")" = "$COMMIT" ] || fail "refs/main is not the commit"
SHA=$(sha256sum "$R/model.safetensors" | cut -d' ' -f1)
[ "$(readlink "$E/snapshots/$COMMIT/model.safetensors")" = "../../blobs/$SHA" ] || fail "safetensors link"
GITSHA=$(git hash-object "$R/config.json" 2>/dev/null ||
    python3 -c 'import hashlib,sys; d=open(sys.argv[1],"rb").read(); print(hashlib.sha1(b"blob %d\0"%len(d)+d).hexdigest())' "$R/config.json")
[ "$(readlink "$E/snapshots/$COMMIT/config.json")" = "../../blobs/$GITSHA" ] || fail "config.json link"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
    cmp -s "$E/snapshots/$COMMIT/$f" "$R/$f" || fail "$f differs from the served file"
done
[ "$(ls "$E/snapshots/$COMMIT" | wc -l)" = 4 ] || fail "unexpected files: $(ls -R "$E/snapshots")"
[ "$(ls "$E/blobs" | wc -l)" = 4 ] || fail "unexpected blobs: $(ls "$E/blobs")"
grep -q "pulling test-org/chat (revision main, commit ${COMMIT:0:12}): 4 files" "$T/err" || { cat "$T/err"; fail "no start line"; }
grep -Eq "^pull test-org/chat: [0-9.]+ [KM]?B / 1.16 MB, [0-9.]+ [KMG]?B/s, ETA [0-9hms-]+, model.safetensors done$" "$T/err" ||
    { cat "$T/err"; fail "no progress line"; }
grep -q "auth=yes" "$T/log" && fail "a token was sent without one set"
# a second pull fetches nothing
"$BIN" pull test-org/chat >/dev/null 2>"$T/err" || fail "second pull"
[ "$(grep -c "^GET /cdn/" "$T/log")" = 4 ] || { cat "$T/log"; fail "the second pull downloaded again"; }
# on a terminal, one redrawn bar (where a pseudo-terminal can be had)
if script -qc true /dev/null >/dev/null 2>&1; then
    HF_HUB_CACHE=$T/c0 script -qc "'$BIN' pull test-org/chat" /dev/null >"$T/tty" 2>&1 || fail "pull on a terminal"
    grep -Eq $'\r\e\[K\[#+\] 100% 1.16 MB / 1.16 MB  [0-9.]+ [KMG]?B/s  ETA 0s  done' "$T/tty" ||
        { cat -A "$T/tty"; fail "no progress bar on a terminal"; }
fi
# the model runs from its repo id, as it does from the fixture folder
"$BIN" run test-org/chat "Hello" --temp 0 -n 6 >"$T/a" 2>"$T/a.err" || { cat "$T/a.err"; fail "run from the cache"; }
"$BIN" run "$FIX/chat_model" "Hello" --temp 0 -n 6 >"$T/b" 2>/dev/null
cmp -s "$T/a" "$T/b" || fail "the cached model answers differently"
grep -q "pulling" "$T/a.err" && fail "run pulled a repo that was in the cache"

# resume: the first download of the weights is cut after 300000 bytes, the second asks for the rest
start_hub --cut model.safetensors:300000
export HF_HUB_CACHE=$T/c2
E=$HF_HUB_CACHE/models--test-org--chat
"$BIN" pull test-org/chat >/dev/null 2>"$T/err" && fail "a cut download succeeded"
grep -q "model.safetensors: download cut off at 300.00 KB of 1.15 MB" "$T/err" || { cat "$T/err"; fail "cut message"; }
[ "$(stat -c %s "$E/blobs/$SHA.incomplete")" = 300000 ] || fail "no 300000-byte .incomplete file"
"$BIN" pull test-org/chat >/dev/null 2>"$T/err" || { cat "$T/err"; fail "resumed pull"; }
grep -q "(resuming)" "$T/err" || fail "resume not announced"
grep -q "^GET /cdn/test-org/chat/model.safetensors range=bytes=300000-" "$T/log" || { cat "$T/log"; fail "no Range request"; }
[ "$(grep -c "^GET /cdn/test-org/chat/config.json" "$T/log")" = 1 ] || fail "finished files fetched again"
cmp -s "$E/blobs/$SHA" "$R/model.safetensors" || fail "resumed file differs"
[ -e "$E/blobs/$SHA.incomplete" ] && fail ".incomplete left behind"

# a wrong sha256 in the listing: the blob is removed and the file named
start_hub --bad-sha model.safetensors
export HF_HUB_CACHE=$T/c3
E=$HF_HUB_CACHE/models--test-org--chat
"$BIN" pull test-org/chat >/dev/null 2>"$T/err" && fail "a wrong checksum was accepted"
grep -q "model.safetensors: sha256 mismatch (expected .*, got $SHA); the download was removed" "$T/err" ||
    { cat "$T/err"; fail "checksum message"; }
ls "$E/blobs" | grep -q "^$SHA" && fail "the bad blob was kept"
[ -e "$E/snapshots/$COMMIT/model.safetensors" ] && fail "a link to a bad blob"

# the same for a small file and its git sha1
start_hub --bad-sha config.json
"$BIN" pull test-org/chat >/dev/null 2>"$T/err" && fail "a wrong git sha1 was accepted"
grep -q "config.json: git sha1 mismatch (expected .*, got $GITSHA); the download was removed" "$T/err" ||
    { cat "$T/err"; fail "git sha1 message"; }
[ -e "$E/snapshots/$COMMIT/config.json" ] && fail "a link to a bad small file"

# a blob another process is downloading (holding huggingface_hub's lock file) is left to it
start_hub
export HF_HUB_CACHE=$T/c8
mkdir -p "$HF_HUB_CACHE/.locks/models--test-org--chat"
flock -o "$HF_HUB_CACHE/.locks/models--test-org--chat/$SHA.lock" "$BIN" pull test-org/chat >/dev/null 2>"$T/err" &&
    fail "a locked blob was downloaded"
grep -q "model.safetensors: another process is downloading this file" "$T/err" || { cat "$T/err"; fail "lock message"; }
"$BIN" pull test-org/chat >/dev/null 2>&1 || fail "pull after the lock was released"

# not enough disk: refused before any download, with both sizes
start_hub --huge
export HF_HUB_CACHE=$T/c4
"$BIN" pull test-org/chat >/dev/null 2>"$T/err" && fail "a pull larger than the disk started"
grep -Eq "not enough disk space in .*: the download needs 4000.00 TB more, [0-9.]+ [KMGT]?B are free" "$T/err" ||
    { cat "$T/err"; fail "disk message"; }
grep -q "^GET /cdn/" "$T/log" && fail "downloads started despite the disk check"

# the Hub's refusals in words
start_hub
export HF_HUB_CACHE=$T/c5
"$BIN" pull test-org/nothing 2>"$T/err" && fail "404 repo"
grep -q "test-org/nothing: not found on $HF_ENDPOINT (404)" "$T/err" || { cat "$T/err"; fail "404 message"; }
"$BIN" pull test-org/chat --revision v9 2>"$T/err" && fail "404 revision"
grep -q "no revision 'v9'" "$T/err" || { cat "$T/err"; fail "revision message"; }
"$BIN" pull test-org/private 2>"$T/err" && fail "401 repo"
grep -q "test-org/private: unauthorized (401): .*set HF_TOKEN" "$T/err" || { cat "$T/err"; fail "401 message"; }
"$BIN" pull test-org/gated 2>"$T/err" && fail "403 repo"
grep -q "test-org/gated: access refused (403): the repo is gated; accept its license at $HF_ENDPOINT/test-org/gated.*HF_TOKEN" \
    "$T/err" || { cat "$T/err"; fail "403 message"; }
HF_TOKEN=wrong "$BIN" pull test-org/private 2>"$T/err" && fail "401 with a wrong token"
grep -q "check that HF_TOKEN is valid" "$T/err" || { cat "$T/err"; fail "401 message with a token"; }
HF_TOKEN=secret "$BIN" pull test-org/gated >/dev/null 2>"$T/err" || { cat "$T/err"; fail "gated repo with a token"; }
grep -q "^GET /cdn/test-org/gated/model.safetensors range=- auth=yes" "$T/log" || fail "no token sent"
echo secret >"$T/token-file"
HF_TOKEN_PATH=$T/token-file "$BIN" pull test-org/private >/dev/null 2>"$T/err" || { cat "$T/err"; fail "token file"; }
[ -s "$HF_HUB_CACHE/models--test-org--private/refs/main" ] || fail "private repo not pulled"
"$BIN" pull 'bad repo' 2>"$T/err" && fail "bad repo id"
grep -q "not a Hub repo id" "$T/err" || fail "bad repo id message"

# GGUF: no quant lists those offered; a quant picks its file or split set; an exact path one file
export HF_HUB_CACHE=$T/c6
EG=$HF_HUB_CACHE/models--test-org--tiny-GGUF/snapshots
"$BIN" pull test-org/tiny-GGUF 2>"$T/err" && fail "GGUF repo without a quant"
grep -q "several quants; pick one, e.g. test-org/tiny-GGUF:Q2_K (quants offered: Q2_K, Q4_0, Q8_0)" "$T/err" ||
    { cat "$T/err"; fail "quant list"; }
"$BIN" pull test-org/tiny-GGUF:q2_k >/dev/null 2>"$T/err" || { cat "$T/err"; fail "split quant"; }
[ "$(ls "$EG"/*)" = "$(printf 'tiny-Q2_K-00001-of-00002.gguf\ntiny-Q2_K-00002-of-00002.gguf')" ] || fail "split set: $(ls "$EG"/*)"
"$BIN" pull test-org/tiny-GGUF:Q5_K 2>"$T/err" && fail "a missing quant"
grep -q "no GGUF file matches 'Q5_K'" "$T/err" || fail "missing quant message"
out=$("$BIN" pull test-org/tiny-GGUF:tiny-Q4_0.gguf 2>/dev/null) || fail "exact file"
[ "${out##*/}" = tiny-Q4_0.gguf ] || fail "exact file path: $out"
# a command given a quant not yet pulled pulls it, then uses that file
"$BIN" tokenize test-org/tiny-GGUF:Q8_0 hi >"$T/tok" 2>"$T/err" || { cat "$T/err"; fail "tokenize pulls"; }
[ "$(cat "$T/tok")" = "[104,105]" ] || fail "tokenize on the pulled GGUF: $(cat "$T/tok")"
grep -q "test-org/tiny-GGUF:Q8_0 is not in the Hub cache; pulling it first" "$T/err" || fail "no pull notice"

# run on a repo id not yet pulled: pulled, said so, then run
export HF_HUB_CACHE=$T/c7
"$BIN" run test-org/chat "Hello" --temp 0 -n 6 >"$T/c" 2>"$T/c.err" || { cat "$T/c.err"; fail "run pulling"; }
grep -q "sluice: test-org/chat is not in the Hub cache; pulling it first" "$T/c.err" || fail "run: no notice"
cmp -s "$T/b" "$T/c" || fail "run after a pull answers differently"
HF_HUB_OFFLINE=1 "$BIN" run test-org/other "Hello" 2>"$T/err" && fail "offline run of a missing repo"
grep -q "test-org/other: not found locally .*HF_HUB_OFFLINE is set" "$T/err" || { cat "$T/err"; fail "offline message"; }

# list: every repo with its revision, size, files and format
export HF_HUB_CACHE=$T/c5
cp -r "$T/c6/models--test-org--tiny-GGUF" "$HF_HUB_CACHE/"
"$BIN" list >"$T/list" || fail "list"
grep -Eq "^test-org/gated +main=[0-9a-f]{7} +1.16 MB +4  safetensors$" "$T/list" || { cat "$T/list"; fail "list row"; }
grep -Eq "^test-org/tiny-GGUF +main=[0-9a-f]{7} .* 4  gguf$" "$T/list" || { cat "$T/list"; fail "list gguf row"; }
[ "$(grep -c test-org "$T/list")" = 3 ] || fail "list rows"
HF_HUB_CACHE=$T/empty "$BIN" list 2>"$T/err" >/dev/null || fail "list of an empty cache"
grep -q "no models in" "$T/err" || fail "empty list message"

# rm: refused without a terminal or --yes, then done; only cache entries
"$BIN" rm test-org/gated </dev/null 2>"$T/err" && fail "rm without --yes"
grep -q "pass --yes" "$T/err" || fail "rm refusal message"
[ -d "$HF_HUB_CACHE/models--test-org--gated" ] || fail "rm removed without --yes"
"$BIN" rm test-org/gated --yes 2>/dev/null || fail "rm --yes"
[ -e "$HF_HUB_CACHE/models--test-org--gated" ] && fail "rm left the folder"
[ -d "$HF_HUB_CACHE/models--test-org--private" ] || fail "rm took another repo"
"$BIN" rm test-org/gated --yes 2>"$T/err" && fail "rm of a missing repo"
grep -q "not in the Hub cache" "$T/err" || fail "rm missing message"
mkdir -p "$HF_HUB_CACHE/models--test-org--notes" && echo keep >"$HF_HUB_CACHE/models--test-org--notes/x"
"$BIN" rm test-org/notes --yes 2>"$T/err" && fail "rm of a folder that is not a cache entry"
grep -q "not a Hub cache entry" "$T/err" || fail "rm non-entry message"
[ -f "$HF_HUB_CACHE/models--test-org--notes/x" ] || fail "rm touched a non-entry"
"$BIN" rm ../etc --yes 2>/dev/null && fail "rm of a path"
echo "pull: all passed"
