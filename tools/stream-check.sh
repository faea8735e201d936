#!/usr/bin/env bash
# Checks expert streaming on a machine with an NVIDIA GPU and writes what it finds under $OUT
# (default ./stream-out). Takes the binaries of a bundle (tools/gpu-check.sh --bundle DIR):
#   tools/stream-check.sh DIR
#   1. the streaming suite on the CUDA backend: every MoE fixture with its experts in a few slots gives
#      the resident logits to the bit (buffered and O_DIRECT, io_uring and pread threads), and a
#      truncated expert file ends the request with an error;
#   2. decode of a synthetic qwen3.5-35b-a3b (mlx4): resident, --vram 8G with the page cache warm, and
#      --vram 8G --io direct from disk (RUNS runs each, default 2);
#   3. a qwen3.5-397b-a17b-shaped checkpoint of as many layers as the disk holds (BIG_LAYERS, default:
#      from the free space), --vram 20G, buffered and direct;
#   4. the 35B shape with GPUDirect Storage (--io gds; cuFile's compatibility mode where the nvidia-fs
#      module is not loaded), --vram 8G and 3G.
# STEPS="1 2 3" picks the steps (4 runs when named). SLUICE_TEST_GDS=1 makes step 1 fail when libcufile
# cannot be had, instead of leaving GPUDirect reads untested (cuFile also needs udev's record of the disk;
# in a container without udev write one first, e.g. /run/udev/data/b254:0 with E:ID_FS_USAGE=filesystem).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: tools/stream-check.sh BUNDLE_DIR}
OUT=${OUT:-stream-out}
DIR=${DIR:-/tmp/sl-stream}
mkdir -p "$OUT" "$DIR"
export LD_LIBRARY_PATH="$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SLUICE_FIXTURES=${SLUICE_FIXTURES:-$PWD/tests/fixtures}
RUNS=${RUNS:-2}
rc=0
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$BIN/sluice" --version
    df -h "$DIR" | tail -1
    grep -E 'MemTotal|MemAvailable' /proc/meminfo
    lsblk -d -o NAME,SIZE,ROTA,MODEL 2>/dev/null
} | tee "$OUT/machine.txt"

step() { [[ " ${STEPS:-1 2 3} " == *" $1 "* ]]; }

if step 1; then
    SLUICE_BACKEND=cuda "$BIN/test_streaming" --jobs 1 --verbose >"$OUT/test_streaming.log" 2>&1
    s=$?
    echo "streaming suite on cuda: $([ $s -eq 0 ] && echo passed || echo FAILED)" | tee "$OUT/suite.txt"
    grep -E "Synthesis|FAIL|fail" "$OUT/test_streaming.log" | tail -5 | tee -a "$OUT/suite.txt"
    [ $s -eq 0 ] || rc=1
fi

bench() { # LABEL ARGS...
    local label=$1
    shift
    echo "== $label: sluice bench $*"
    "$BIN/sluice" bench "$@" --backend cuda 2>&1
    echo "== $label: exit $?"
}

if step 2; then
    sh=qwen3.5-35b-a3b
    {
        bench "resident" --synthetic $sh --quant mlx4 --dir "$DIR/$sh" -p 32 -n 128 -r "$RUNS"
        bench "vram 8G, page cache warm" --synthetic $sh --quant mlx4 --dir "$DIR/$sh" -p 32 -n 128 -r "$RUNS" --vram 8G
        bench "vram 8G, O_DIRECT" --synthetic $sh --quant mlx4 --dir "$DIR/$sh" -p 32 -n 128 -r "$RUNS" --vram 8G --io direct
        bench "vram 8G, O_DIRECT, no prefetch" --synthetic $sh --quant mlx4 --dir "$DIR/$sh" -p 32 -n 128 -r "$RUNS" \
            --vram 8G --io direct --no-prefetch
        # a budget below the decode working set of the synthetic routing, so that decode reads
        bench "vram 3G, page cache warm" --synthetic $sh --quant mlx4 --dir "$DIR/$sh" -p 32 -n 128 -r "$RUNS" --vram 3G
        bench "vram 3G, O_DIRECT" --synthetic $sh --quant mlx4 --dir "$DIR/$sh" -p 32 -n 128 -r "$RUNS" --vram 3G --io direct
        bench "vram 3G, O_DIRECT, no prefetch" --synthetic $sh --quant mlx4 --dir "$DIR/$sh" -p 32 -n 128 -r "$RUNS" \
            --vram 3G --io direct --no-prefetch
    } | tee "$OUT/bench35.txt"
    [ "${KEEP:-0}" = 1 ] || rm -rf "$DIR/$sh"
fi

if step 3; then
    sh=qwen3.5-397b-a17b
    # 60 layers take about 209 GB at 4 bits: as many as fit in the free space, less 4 GB
    free_gb=$(df -BG --output=avail "$DIR" | tail -1 | tr -dc 0-9)
    layers=${BIG_LAYERS:-$(((free_gb - 8) * 60 / 215))}
    echo "free ${free_gb}G: $layers of 60 layers" | tee "$OUT/bench397.txt"
    {
        bench "397b $layers layers, vram 20G, buffered" --synthetic $sh --quant mlx4 --layers "$layers" \
            --dir "$DIR/$sh" -p 16 -n 64 -r "$RUNS" --vram 20G
        bench "397b $layers layers, vram 20G, O_DIRECT" --synthetic $sh --quant mlx4 --layers "$layers" \
            --dir "$DIR/$sh" -p 16 -n 64 -r "$RUNS" --vram 20G --io direct
        bench "397b $layers layers, vram 8G, O_DIRECT" --synthetic $sh --quant mlx4 --layers "$layers" \
            --dir "$DIR/$sh" -p 16 -n 64 -r "$RUNS" --vram 8G --io direct
    } | tee -a "$OUT/bench397.txt"
fi

if [[ " ${STEPS:-} " == *" 4 "* ]]; then
    sh=qwen3.5-35b-a3b
    {
        bench "vram 8G, gds" --synthetic $sh --quant mlx4 --dir "$DIR/$sh" -p 32 -n 128 -r "$RUNS" --vram 8G --io gds
        bench "vram 3G, gds" --synthetic $sh --quant mlx4 --dir "$DIR/$sh" -p 32 -n 128 -r "$RUNS" --vram 3G --io gds
        bench "vram 3G, O_DIRECT" --synthetic $sh --quant mlx4 --dir "$DIR/$sh" -p 32 -n 128 -r "$RUNS" --vram 3G --io direct
    } | tee "$OUT/gds.txt"
fi
exit $rc
