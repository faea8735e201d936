#!/usr/bin/env bash
# Checks the CUDA backend on a machine with an NVIDIA GPU and writes what it finds under $OUT
# (default ./gpu-out):
#   1. builds sluice for CUDA arch $CUDA_ARCH (default 90a), or takes a prebuilt bundle (see below)
#      when the build dependencies are missing there;
#   2. every fixture model on the CUDA backend against its fp32 reference: a table of prefill/decode
#      rel-L2, argmax agreement and pass/fail (targets: rel-L2 <= 3e-2, argmax equal at >= 95%);
#   3. the whole Criterion model suite with SLUICE_BACKEND=cuda (the GGUF fixtures, tests/fixtures/gguf/*,
#      included), the fused ops against host arithmetic, and the GGML quant suite, whose CUDA twins check
#      every block type's GEMV, prefill GEMM, embedding and MoE path on the GPU against the CPU reference;
#   4. decode/prefill timings with `sluice bench --synthetic` (BENCH="shape:quant ..."; quant q4k is a
#      GGUF Q4_K file; RUNS runs each, default 3), with recorded decode steps (CUDA graphs) on and off,
#      and with every step's logits copied to the host (as sampling at a temperature does);
#      With DEPTH_AB="shape:quant ...", decode from a DEPTH-token cache (default 16384) as shipped, without
#      the warm-up run, with a row a lane in the integer GEMV and with every decode slice, side by side;
#   5. with PROFILE="shape:quant ...", GPU time per kernel over a few decode steps (Nsight Compute, the
#      card's own clocks, caches not flushed).
#   6. with STALLS="shape:quant", where the warps of a few decode kernels wait (Nsight Compute's full set:
#      stall reasons per kernel and the instructions that collect them, see tools/ncu-stalls.py);
#      STALLS_SKIP and STALLS_COUNT pick the launches (default: 12 launches after the first 1000).
#   7. with LLAMA_CPP_SRC=DIR (a llama.cpp source tree), llama.cpp built from it for this GPU, the synthetic
#      qwen3.5-35b-a3b (12 of 40 layers) converted by its convert_hf_to_gguf.py and quantized to Q4_K_M by
#      its llama-quantize, then the side-by-side harnesses on that one file: experts off the GPU
#      (bench/vs-llamacpp-offload.sh), many sequences (bench/vs-llamacpp-batched.sh) and resident
#      prompts and decode (bench/vs-llamacpp.sh). SIDE_DIR (default /root/side) takes about 50 GB on the
#      way (the bf16 checkpoint and its GGUF), 7 GB at the end.
# TESTS=0 skips steps 2 and 3 (for a bundle that holds only sluice).
#
#   tools/gpu-check.sh                 build here and check
#   tools/gpu-check.sh --bundle DIR    build here (no GPU needed) and pack the binaries with the shared
#                                      libraries they need into DIR, for a GPU machine without them
#   tools/gpu-check.sh --prebuilt DIR  check with the binaries of such a bundle
set -uo pipefail
cd "$(dirname "$0")/.."
ARCH=${CUDA_ARCH:-90a}
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-gpu-out}

build() { # DIR [cmake options]
    local d=$1
    shift
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "$@" >"$d/cmake.log" 2>&1 &&
        cmake --build "$BUILD" -j"$(nproc)" >"$d/build.log" 2>&1
}

if [ "${1:-}" = "--bundle" ]; then
    dir=${2:?--bundle needs a directory}
    mkdir -p "$dir/lib"
    # the library as one shared object beside the binaries, so the bundle stays small
    build "$dir" -DSLUICE_SHARED=ON || { tail -30 "$dir/build.log"; exit 1; }
    cp "$BUILD/sluice" "$BUILD/test_models" "$BUILD/test_ggml_quants" "$BUILD/test_fused_ops" "$BUILD/test_streaming" \
        "$BUILD/test_batch" "$BUILD/test_mla_route" "$BUILD/test_fp8" "$BUILD/test_kv_cache" "$dir/"
    # everything but the C runtime and CUDA, which the GPU machine has
    ldd "$BUILD/sluice" "$BUILD/test_models" "$BUILD/test_ggml_quants" "$BUILD/test_fused_ops" "$BUILD/test_streaming" \
        "$BUILD/test_batch" | awk '/=> \//{print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt)\.so' |
        xargs -r cp -L -t "$dir/lib/"
    cp -L "$BUILD/libsluice_lib.so" "$dir/lib/"
    echo "bundle in $dir: $(ls "$dir" | tr '\n' ' ')"
    exit 0
fi

mkdir -p "$OUT"
BIN=$BUILD
if [ "${1:-}" = "--prebuilt" ]; then
    BIN=${2:?--prebuilt needs a directory}
    export LD_LIBRARY_PATH="$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    build "$OUT" || { tail -30 "$OUT/build.log"; exit 1; }
fi
export SLUICE_FIXTURES=${SLUICE_FIXTURES:-$PWD/tests/fixtures}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
"$BIN/sluice" --version | tee -a "$OUT/gpu.txt"

# 2 + 3: the model suite on CUDA; its log has one line per fixture with the figures
fixtures() { # LABEL [VAR=VALUE...]: runs the suite with those variables and prints the table
    local label=$1 log="$OUT/test_models_$1.log"
    shift
    env SLUICE_BACKEND=cuda "$@" "$BIN/test_models" --jobs 1 --verbose >"$log" 2>&1
    local rc=$?
    echo "-- $label $*"
    printf '%-22s %12s %12s %14s  %s\n' fixture prefill_relL2 decode_relL2 argmax_agree result
    grep -E ': prefill rel-L2 .* argmax [0-9]+/[0-9]+' "$log" | sed 's/.*\] //' |
        awk '{name=$1; sub(":", "", name); p=$4; d=$7; split($9, a, "/");
              pct = 100.0 * a[1] / a[2]; ok = (p + 0 <= 3e-2 && d + 0 <= 3e-2 && pct >= 95) ? "pass" : "FAIL";
              printf "%-22s %12s %12s %8d/%-4d %3.0f%%  %s\n", name, p, d, a[1], a[2], pct, ok}' | tr -d ','
    echo "Criterion model suite on cuda ($label): $([ $rc -eq 0 ] && echo passed || echo FAILED)"
    return $rc
}
suite=0
if [ "${TESTS:-1}" != 0 ]; then
fixtures cuda | tee "$OUT/fixtures.txt"
suite=${PIPESTATUS[0]}
ngguf=$(ls -d tests/fixtures/gguf/*/ | wc -l)
# the GGUF fixtures' rows: FAMILY-TYPE (folder names of tests/fixtures/gguf)
passed=$(grep -cE '^[a-z0-9_]+-[A-Z0-9_]+ .* pass$' "$OUT/fixtures.txt")
echo "GGUF fixtures on cuda: $passed of $ngguf pass" | tee -a "$OUT/fixtures.txt"
[ "$passed" -eq "$ngguf" ] || suite=1
# the CUDA twins of the GGML kernels (skipped, which counts as a failure here, when no GPU answers)
"$BIN/test_ggml_quants" --jobs 1 --verbose >"$OUT/test_ggml_quants.log" 2>&1
q=$?
if grep -q "CUDA GGML tests skipped" "$OUT/test_ggml_quants.log"; then q=1; fi
echo "GGML quant suite with its CUDA twins: $([ $q -eq 0 ] && echo passed || echo FAILED)" | tee -a "$OUT/fixtures.txt"
[ $q -eq 0 ] || suite=1
# the fused ops (one launch for several) on the GPU against plain host arithmetic
SLUICE_BACKEND=cuda "$BIN/test_fused_ops" --jobs 1 >"$OUT/test_fused_ops.log" 2>&1
fused=$?
echo "fused ops on cuda: $([ $fused -eq 0 ] && echo passed || echo FAILED)" | tee -a "$OUT/fixtures.txt"
[ $fused -eq 0 ] || suite=1
# every fixture inside batches of several sequences against itself alone, and streamed batches
SLUICE_BACKEND=cuda "$BIN/test_batch" --jobs 1 --verbose >"$OUT/test_batch.log" 2>&1
batch=$?
grep -E 'in a batch vs alone' "$OUT/test_batch.log" | sed 's/.*\] //' | tee -a "$OUT/fixtures.txt"
echo "fixtures inside batches on cuda: $([ $batch -eq 0 ] && echo passed || echo FAILED)" | tee -a "$OUT/fixtures.txt"
[ $batch -eq 0 ] || suite=1
# latent attention and grouped routing, block-FP8 weights, and 16-bit KV caches, on the GPU against host
# arithmetic; streamed experts against the resident model, experts of the host cache computed on the CPU
# among them (their log lines say how many and the costs the planner measured)
for t in test_mla_route test_fp8 test_kv_cache test_streaming; do
    [ -x "$BIN/$t" ] || continue
    SLUICE_BACKEND=cuda "$BIN/$t" --jobs 1 --verbose >"$OUT/$t.log" 2>&1
    r=$?
    grep -E 'cpu experts (auto|on|off):' "$OUT/$t.log" | sed 's/.*\] //' | tee -a "$OUT/fixtures.txt"
    echo "$t on cuda: $([ $r -eq 0 ] && echo passed || echo FAILED)" | tee -a "$OUT/fixtures.txt"
    [ $r -eq 0 ] || suite=1
done
# the same with every matmul in fp32 GEMV kernels, and with decode steps issued directly
[ -n "${DIAG:-}" ] && { fixtures fp32 SLUICE_CUDA_GEMV_MAX=100000; fixtures nographs SLUICE_CUDA_GRAPHS=0; } |
    tee -a "$OUT/fixtures.txt"
fi

# 4: timings on synthetic checkpoints (`sluice bench --synthetic`), decode steps recorded (CUDA graphs)
# and, for comparison, issued kernel by kernel, and with every step's logits copied to the host
for spec in ${BENCH:-llama3-8b:bf16 qwen3.5-35b-a3b:mlx4}; do
    shape=${spec%%:*} quant=${spec##*:}
    for mode in graphs nographs hostlogits; do
        graphs=1 extra=
        [ $mode = nographs ] && graphs=0
        [ $mode = hostlogits ] && extra=--host-logits
        echo "== $shape $quant, recorded decode steps $([ $graphs = 1 ] && echo on || echo off)${extra:+, logits to the host}"
        SLUICE_CUDA_GRAPHS=$graphs "$BIN/sluice" bench --synthetic "$shape" --quant "$quant" --dir "/tmp/sl-$shape-$quant" \
            --backend cuda -p 512 -n 128 -r "${RUNS:-3}" $extra
    done
done 2>&1 | tee "$OUT/bench.txt"

# 4b (DEPTH_AB="shape:quant ..."): decode from a cache of DEPTH tokens (default 16384), as shipped and with
# one thing changed each: no warm-up run, a row a lane in the integer GEMV, every decode slice used
for spec in ${DEPTH_AB:-}; do
    shape=${spec%%:*} quant=${spec##*:}
    for v in "-|" "-|--no-warmup" "SLUICE_CUDA_MMVQ=r1|" "SLUICE_CUDA_DEC_KEYS=0|"; do
        var=${v%%|*} flag=${v#*|}
        echo "== $shape $quant at depth ${DEPTH:-16384}: ${var/#-/as shipped} $flag"
        env ${var/#-/} "$BIN/sluice" bench --synthetic "$shape" --quant "$quant" --dir "/tmp/sl-$shape-$quant" \
            --backend cuda -p 1 -n 64 -r 2 -d "${DEPTH:-16384}" $flag | grep -E '^  decode  ' || true
    done
done 2>&1 | tee "$OUT/depth-ab.txt"

# 5 (PROFILE="shape:quant ..."): GPU time per kernel over a few decode steps, from Nsight Compute
for spec in ${PROFILE:-}; do
    command -v ncu >/dev/null || break
    shape=${spec%%:*} quant=${spec##*:}
    SLUICE_CUDA_GRAPHS=0 ncu --csv --clock-control none --cache-control none --metrics gpu__time_duration.sum \
        -c "${PROFILE_KERNELS:-3000}" "$BIN/sluice" bench --synthetic "$shape" --quant "$quant" \
        --dir "/tmp/sl-$shape-$quant" --backend cuda -p 1 -n 4 >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
    echo "== GPU time per kernel: $shape $quant, 1 prompt token + 4 decode steps"
    python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; k = head.index("Kernel Name"); v = head.index("Metric Value"); u = head.index("Metric Unit")
scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    name = r[k].split("(")[0]
    tot[name] += float(r[v].replace(",", "")) * scale.get(r[u], 1); cnt[name] += 1
all_ns = sum(tot.values())
print(f"{'kernel':60s} {'calls':>6s} {'total us':>10s} {'avg us':>8s} {'share':>6s}")
for n, t in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"{n[:60]:60s} {cnt[n]:6d} {t/1e3:10.1f} {t/1e3/cnt[n]:8.2f} {100*t/all_ns:5.1f}%")
PY
done 2>&1 | tee "$OUT/profile.txt"

# 6 (STALLS="shape:quant"): stall reasons of a window of decode launches
for spec in ${STALLS:-}; do
    command -v ncu >/dev/null || break
    shape=${spec%%:*} quant=${spec##*:}
    SLUICE_CUDA_GRAPHS=0 ncu --set full --clock-control none --cache-control none -s "${STALLS_SKIP:-1000}" \
        -c "${STALLS_COUNT:-12}" -f -o "$OUT/stalls" "$BIN/sluice" bench --synthetic "$shape" --quant "$quant" \
        --dir "/tmp/sl-$shape-$quant" --backend cuda -p 1 -n 5 >"$OUT/stalls.log" 2>&1
    ncu -i "$OUT/stalls.ncu-rep" --page source --print-source sass --csv >"$OUT/stalls-sass.csv" 2>>"$OUT/stalls.log"
    echo "== where decode kernels wait: $shape $quant"
    python3 tools/ncu-stalls.py "$OUT/stalls-sass.csv"
done 2>&1 | tee "$OUT/stalls.txt"
# 7 (LLAMA_CPP_SRC=DIR): the same file through llama.cpp and sluice, made by llama.cpp's own tools
if [ -n "${LLAMA_CPP_SRC:-}" ]; then
    lcb=$BUILD-llamacpp side=${SIDE_DIR:-/root/side}
    mkdir -p "$side"
    {
        cmake -G Ninja -S "$LLAMA_CPP_SRC" -B "$lcb" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF &&
            cmake --build "$lcb" -j"$(nproc)" --target llama-bench llama-quantize llama-batched-bench
    } >"$OUT/llamacpp-build.log" 2>&1 &
    lcpid=$!
    # the bf16 checkpoint (with the Qwen3 tokenizer) to llama.cpp's bf16 GGUF while llama.cpp builds
    "$BIN/sluice" bench --synthetic qwen3.5-35b-a3b --quant bf16 --layers 12 --dir "$side/syn" --backend cpu \
        -p 1 -n 0 >"$OUT/synthetic.log" 2>&1
    syn=$(dirname "$(find "$side/syn" -name config.json | head -1)")
    xz -dc tests/fixtures/tokenizers/qwen3/tokenizer.json.xz >"$syn/tokenizer.json"
    cp tests/fixtures/tokenizers/qwen3/tokenizer_config.json "$syn/"
    python3 "$LLAMA_CPP_SRC/convert_hf_to_gguf.py" "$syn" --outtype bf16 --outfile "$side/q35-bf16.gguf" --no-mtp \
        >"$OUT/convert.log" 2>&1 || tail -5 "$OUT/convert.log"
    rm -rf "$side/syn"
    wait $lcpid || tail -20 "$OUT/llamacpp-build.log"
    "$lcb/bin/llama-quantize" "$side/q35-bf16.gguf" "$side/q35-Q4_K_M.gguf" Q4_K_M "$(nproc)" >"$OUT/quantize.log" 2>&1 ||
        tail -5 "$OUT/quantize.log"
    rm -f "$side/q35-bf16.gguf"
    f=$side/q35-Q4_K_M.gguf
    {
        NCMOE=10 R=2 SLUICE_BIN=$BIN/sluice bench/vs-llamacpp-offload.sh "$lcb/bin" "$f"
        SLUICE_BIN=$BIN/sluice bench/vs-llamacpp-batched.sh "$lcb/bin" "$f" 1,4,16,64 128 64
        R=2 SLUICE_BIN=$BIN/sluice bench/vs-llamacpp.sh "$lcb/bin" "$f"
    } 2>&1 | tee "$OUT/side-by-side.md"
fi
exit $suite
