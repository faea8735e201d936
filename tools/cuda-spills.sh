#!/usr/bin/env bash
# Lists the CUDA kernels whose registers spill to local memory, with their register counts, for one
# architecture (default 90a). The GEMV variants that run two blocks per SM have 128 registers per thread;
# code added to them can push one over and make it spill, which slows every launch of that variant.
# Needs nvcc only (no GPU). Takes a few minutes per file.
#
#   tools/cuda-spills.sh [FILE.cu ...]     default: every file under src/backend/cuda
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${CUDA_ARCH:-90a}
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(src/backend/cuda/*.cu)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "${files[@]}"; do
    nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_"$ARCH" -Isrc -Xptxas -v -c "$f" -o "$tmp/out.o" 2>"$tmp/ptxas.txt"
    # ptxas prints, per entry function: its name, then its stack/spill line, then its register count
    awk -v file="$f" '
        /Compiling entry function/ { match($0, /'\''[^'\'']*'\''/); name = substr($0, RSTART + 1, RLENGTH - 2); spill = "" }
        /spill stores/ { spill = $0; sub(/^[^0-9]*/, "", spill) }
        /Used [0-9]+ registers/ {
            match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
            if (spill !~ /, 0 bytes spill stores/) print file, regs, name, "|", spill
        }' "$tmp/ptxas.txt" | c++filt | sed -E 's/\(.*\) \|/ |/'
done
