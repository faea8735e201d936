#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) with clang, ASan and UBSan in build-fuzz/, then runs each for
# SECONDS (default 60). Usage: tools/fuzz.sh [SECONDS] [FUZZER...]   (all fuzzers when none is named)
# Environment: FUZZ_JOBS / FUZZ_WORKERS are passed on as -jobs / -workers; FUZZ_BUILD names the build folder.
# Each fuzzer starts from its committed seeds (tests/fuzz/corpus/NAME) and grows a working corpus in
# build-fuzz/corpus/NAME. A crash is saved under tests/fuzz/regressions/NAME/ (test_fuzz_replay then replays
# it in the normal test build) and makes this script exit non-zero once all have run.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
shift || true
BUILD=${FUZZ_BUILD:-build-fuzz}
CC=${FUZZ_CC:-clang} cmake -S . -B "$BUILD" -DSLUICE_FUZZ=ON -DSLUICE_TESTS=OFF -DSLUICE_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
mapfile -t all < <(sed -n 's/^set(SLUICE_FUZZERS \(.*\))$/\1/p' tests/fuzz/CMakeLists.txt | tr ' ' '\n')
fuzzers=("$@")
[ ${#fuzzers[@]} -gt 0 ] || fuzzers=("${all[@]}")
cmake --build "$BUILD" -j"$(nproc)" --target "${fuzzers[@]/#/fuzz_}"
opts=(-max_total_time="$SECS" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1)
[ -z "${FUZZ_JOBS:-}" ] || opts+=(-jobs="$FUZZ_JOBS")
[ -z "${FUZZ_WORKERS:-}" ] || opts+=(-workers="$FUZZ_WORKERS")
failed=()
for f in "${fuzzers[@]}"; do
    corpus="$BUILD/corpus/$f" crashes="tests/fuzz/regressions/$f"
    mkdir -p "$corpus" "$crashes"
    dict=()
    [ ! -f "tests/fuzz/dict/$f.dict" ] || dict=(-dict="tests/fuzz/dict/$f.dict")
    echo "== fuzz_$f for ${SECS}s"
    if ! "$BUILD/fuzz_$f" "${opts[@]}" "${dict[@]}" -artifact_prefix="$crashes/" "$corpus" "tests/fuzz/corpus/$f" \
        >"$BUILD/fuzz_$f.log" 2>&1; then
        failed+=("$f")
        tail -40 "$BUILD/fuzz_$f.log"
    fi
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|cov: [0-9]+' "$BUILD/fuzz_$f.log" | tail -3 || true
    rmdir "$crashes" 2>/dev/null || true
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: crashes in ${failed[*]} (inputs saved under tests/fuzz/regressions/)"
    exit 1
fi
echo "fuzz: ${#fuzzers[@]} fuzzers ran ${SECS}s each without a crash"
